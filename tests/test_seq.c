/* test_seq.c - sequences, lattices and DAGs: every validation error, text
 * splitting, lexicon matching against brute force, and tiny hand-checked
 * lattice and DAG cases computed here from docs/models.md in double
 * precision. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_util.h"
#include "internal.h"

static char dir[256];
static cn_model *M;

static void load(const char *family, const char *data, int H) {
  M = tu_model(family, H, H, data, dir, sizeof(dir));
}

static void unload(void) {
  cn_model_free(M);
  tu_rmdir(dir);
}

/* Parses a JSON instance; returns the error code (0 ok) and fills err. */
static int parse(const char *js, cn_err *err, cn_instance **out) {
  json_error_t je;
  json_t *j = json_loads(js, 0, &je);
  cr_assert_not_null(j, "test JSON: %s", je.text);
  cn_limits lim;
  cn_limits_default(&lim);
  lim.max_seq_len = 50;
  lim.max_spans = 6;
  lim.max_token_len = 12;
  lim.max_children = 3;
  cn_instance *in = NULL;
  int rc = cn_instance_parse(M, j, &lim, 3, &in, err);
  json_decref(j);
  if (out) *out = in;
  else cn_instance_free(in);
  return rc;
}

static void expect_err(const char *js, int code, int node, const char *sub) {
  cn_err err;
  int rc = parse(js, &err, NULL);
  cr_expect_eq(rc, code, "%s: got %s (%s)", js, cn_err_code(rc), err.msg);
  cr_expect_eq(err.instance, 3, "%s: instance index", js);
  if (node >= -1) cr_expect_eq(err.node, node, "%s: node %d", js, err.node);
  if (sub) cr_expect(strstr(err.msg, sub) != NULL, "%s: '%s'", js, err.msg);
}

Test(seq, sequence_errors, .fini = unload) {
  load("bilstm-tagger", "sequences.jsonl", 8);
  expect_err("{\"tokens\": []}", CN_E_BAD_INSTANCE, -2, "empty");
  expect_err("{\"text\": \" \\t\\u3000 \"}", CN_E_BAD_INSTANCE, -2, "empty");
  expect_err("{\"tokens\": \"a b\"}", CN_E_BAD_INSTANCE, -2, "array");
  expect_err("{\"tokens\": [\"a\", 3]}", CN_E_BAD_INSTANCE, 1, NULL);
  expect_err("{\"tokens\": [\"a\", \"\"]}", CN_E_BAD_INSTANCE, 1, NULL);
  expect_err("{\"tree\": \"(A a)\"}", CN_E_BAD_INSTANCE, -2, "\"tokens\"");
  /* two forms at once: which one would be computed is a guess */
  expect_err("{\"tokens\": [\"a\"], \"text\": \"b\"}", CN_E_BAD_INSTANCE, -2,
             "both \"tokens\" and \"text\"");
  expect_err("{\"tokens\": [\"a\"], \"nodes\": []}", CN_E_BAD_INSTANCE, -2,
             "instance has \"nodes\"");
  /* every input limit names its key as the operator sets it, and its
   * value ("\"tokens\" has 6 items" named neither) */
  expect_err("{\"tokens\": [\"abcdefghijklmnop\"]}", CN_E_TOO_LARGE, 0,
             "\"tokens\"[0] is 16 bytes, over the limit of 12 (max-token-len)");
  expect_err("{\"text\": \"a abcdefghijklm\"}", CN_E_TOO_LARGE, 1,
             "token 1 of \"text\" is 13 bytes, over the limit of 12 "
             "(max-token-len)");
  char big[600] = "{\"text\": \"";
  for (int i = 0; i < 51; i++) strcat(big, "a ");
  strcat(big, "\"}");
  expect_err(big, CN_E_TOO_LARGE, -2,
             "\"text\" has more tokens than the limit of 50 (max-seq-len)");
  char many[600] = "{\"tokens\": [\"a\"";
  for (int i = 0; i < 50; i++) strcat(many, ", \"a\"");
  strcat(many, "]}");
  expect_err(many, CN_E_TOO_LARGE, -2,
             "\"tokens\" has 51 items, over the limit of 50 (max-seq-len)");
  expect_err("[1]", CN_E_BAD_INSTANCE, -2, "object");
}

Test(seq, text_splits_on_unicode_whitespace, .fini = unload) {
  load("bilstm-tagger", "sequences.jsonl", 8);
  cn_err err;
  cn_instance *a, *b;
  cr_assert_eq(parse("{\"text\": \"\\u00a0the\\u2003cat\\nsat\\u3000 \"}", &err,
                     &a), 0, "%s", err.msg);
  cr_assert_eq(parse("{\"tokens\": [\"the\", \"cat\", \"sat\"]}", &err, &b), 0);
  cr_assert_eq(a->n, 3);
  for (int i = 0; i < 3; i++) cr_expect_eq(a->ids[i], b->ids[i]);
  cn_instance_free(a);
  cn_instance_free(b);
}

Test(seq, lattice_errors, .fini = unload) {
  load("latticelstm", "lattices.jsonl", 8);
  expect_err("{\"chars\": []}", CN_E_BAD_LATTICE, -2, "empty");
  expect_err("{\"chars\": [\"a\"], \"text\": \"a\"}", CN_E_BAD_INSTANCE, -2,
             "both \"chars\" and \"text\"");
  expect_err("{\"text\": \"cat\", \"tree\": \"(A a)\"}", CN_E_BAD_INSTANCE, -2,
             "instance has \"tree\"");
  expect_err("{\"text\": \"\"}", CN_E_BAD_LATTICE, -2, "empty");
  expect_err("{\"text\": \"cat\", \"words\": [{\"start\": 1, \"end\": 4}]}",
             CN_E_BAD_LATTICE, 0, "outside");
  expect_err("{\"text\": \"cat\", \"words\": [{\"start\": -1, \"end\": 2}]}",
             CN_E_BAD_LATTICE, 0, "outside");
  expect_err("{\"text\": \"cat\", \"words\": [{\"start\": 0, \"end\": 2}, "
             "{\"start\": 1, \"end\": 2}]}", CN_E_BAD_LATTICE, 1, "shorter");
  expect_err("{\"text\": \"cat\", \"words\": [{\"start\": 2, \"end\": 1}]}",
             CN_E_BAD_LATTICE, 0, NULL);
  expect_err("{\"text\": \"cats\", \"words\": [{\"start\": 0, \"end\": 2}, "
             "{\"start\": 1, \"end\": 3}, {\"start\": 0, \"end\": 2}]}",
             CN_E_BAD_LATTICE, -2, "twice");
  expect_err("{\"text\": \"cat\", \"words\": {}}", CN_E_BAD_LATTICE, -2, NULL);
  expect_err("{\"text\": \"cat\", \"words\": [{\"start\": 0}]}",
             CN_E_BAD_LATTICE, 0, NULL);
  expect_err("{\"text\": \"cat\", \"words\": [{\"start\": 0, \"end\": 2, "
             "\"token\": 5}]}", CN_E_BAD_LATTICE, 0, "token");
  expect_err("{\"text\": \"abcdefgh\", \"words\": [{\"start\": 0, \"end\": 2},"
             "{\"start\": 0, \"end\": 3},{\"start\": 0, \"end\": 4},"
             "{\"start\": 0, \"end\": 5},{\"start\": 0, \"end\": 6},"
             "{\"start\": 0, \"end\": 7},{\"start\": 0, \"end\": 8}]}",
             CN_E_TOO_LARGE, -2,
             "\"words\" has 7 spans, over the limit of 6 (max-spans)");
  char chars[600] = "{\"chars\": [\"a\"";
  for (int i = 0; i < 50; i++) strcat(chars, ", \"a\"");
  strcat(chars, "]}");
  expect_err(chars, CN_E_TOO_LARGE, -2,
             "\"chars\" has 51 items, over the limit of 50 (max-seq-len)");
  expect_err("{\"chars\": [\"c\", \"\"]}", CN_E_BAD_LATTICE, 1, NULL);
  /* text is code points: "né" is two characters */
  cn_err err;
  cn_instance *in;
  cr_assert_eq(parse("{\"text\": \"n\\u00e9\", \"words\": []}", &err, &in), 0);
  cr_expect_eq(in->n, 2);
  cr_expect_eq(in->n_spans, 0);
  cn_instance_free(in);
}

Test(seq, dag_errors, .fini = unload) {
  load("latticegru", "dags.jsonl", 8);
  expect_err("{\"nodes\": []}", CN_E_BAD_LATTICE, -2, "empty");
  expect_err("{\"nodes\": 3}", CN_E_BAD_INSTANCE, -2, NULL);
  expect_err("{\"nodes\": [{\"token\": \"a\", \"prev\": [0]}]}",
             CN_E_BAD_LATTICE, 0, "earlier");
  expect_err("{\"nodes\": [{\"token\": \"a\", \"prev\": []}, {\"token\": \"b\","
             " \"prev\": [1]}]}", CN_E_BAD_LATTICE, 1, "earlier");
  expect_err("{\"nodes\": [{\"token\": \"a\", \"prev\": []}, {\"token\": \"b\","
             " \"prev\": []}]}", CN_E_BAD_LATTICE, 0, "sink");
  expect_err("{\"nodes\": [{\"token\": \"a\", \"prev\": []}, {\"token\": \"b\","
             " \"prev\": [0, 0]}]}", CN_E_BAD_LATTICE, 1, "twice");
  expect_err("{\"nodes\": [{\"prev\": []}]}", CN_E_BAD_LATTICE, 0, "token");
  expect_err("{\"nodes\": [{\"token\": \"a\", \"prev\": [\"0\"]}]}",
             CN_E_BAD_LATTICE, 0, NULL);
  expect_err("{\"nodes\": [{\"token\": \"abcdefghijklm\", \"prev\": []}]}",
             CN_E_TOO_LARGE, -2, "over the limit of 12 (max-token-len)");
  char big[2000] = "{\"nodes\": [{\"token\": \"a\", \"prev\": []}";
  for (int i = 1; i <= 50; i++)
    snprintf(big + strlen(big), sizeof(big) - strlen(big),
             ", {\"token\": \"a\", \"prev\": [%d]}", i - 1);
  strcat(big, "]}");
  expect_err(big, CN_E_TOO_LARGE, -2,
             "the DAG has 51 nodes, over the limit of 50 (max-seq-len)");
  /* 7 edges: node k (k = 1..4) from every node before it would be 10 */
  expect_err("{\"nodes\": [{\"token\": \"a\", \"prev\": []}, "
             "{\"token\": \"a\", \"prev\": [0]}, "
             "{\"token\": \"a\", \"prev\": [0, 1]}, "
             "{\"token\": \"a\", \"prev\": [0, 1, 2]}, "
             "{\"token\": \"a\", \"prev\": [3]}]}",
             CN_E_TOO_LARGE, -2,
             "7 predecessor edges, over the limit of 6 (max-spans)");
}

Test(seq, childsum_children_limit, .fini = unload) {
  load("childsum-treelstm", "trees-nary.jsonl", 8);
  expect_err("{\"tree\": \"(A a b c d)\"}", CN_E_TOO_LARGE, 0,
             "node 0 has 4 children, over the limit of 3 (max-children)");
  cn_err err;
  cr_expect_eq(parse("{\"tree\": \"(A a b c)\"}", &err, NULL), 0, "%s",
               err.msg);
}

static int32_t got[600][2], ng;

static int collect(void *ctx, int32_t b, int32_t e) {
  got[ng][0] = b, got[ng][1] = e, ng++;
  return 0;
}

/* Brute force: every [b, e), e - b >= 2, checked against the word list. */
Test(seq, lexicon_matches_brute_force) {
  const char *words[] = {"ab", "abc", "b", "bca", "cab", "aaaa", "ca", "bb"};
  cn_lexicon *lx;
  cr_assert_eq(cn_lexicon_from_list(words, 8, &lx), 0);
  srand(7);
  for (int trial = 0; trial < 500; trial++) {
    int n = 1 + rand() % 24;
    char s[32];
    const char *cs[32];
    int32_t ls[32];
    for (int i = 0; i < n; i++) {
      s[i] = "abcAB"[rand() % 5];
      cs[i] = &s[i];
      ls[i] = 1;
    }
    for (int lower = 0; lower < 2; lower++) {
      ng = 0;
      cn_lexicon_match(lx, cs, ls, n, lower, collect, NULL);
      int k = 0;
      for (int b = 0; b < n; b++)
        for (int e = b + 2; e <= n; e++) {
          char w[32];
          for (int i = b; i < e; i++)
            w[i - b] = lower && s[i] <= 'Z' ? (char)(s[i] + 32) : s[i];
          w[e - b] = 0;
          bool in = false;
          for (int q = 0; q < 8; q++) in |= strcmp(words[q], w) == 0;
          if (!in) continue;
          cr_assert_lt(k, ng, "trial %d: missing span [%d,%d)", trial, b, e);
          cr_expect(got[k][0] == b && got[k][1] == e,
                    "trial %d: span %d is [%d,%d), expected [%d,%d)", trial,
                    k, got[k][0], got[k][1], b, e);
          k++;
        }
      cr_expect_eq(k, ng, "trial %d: %d extra spans", trial, ng - k);
    }
  }
  cn_lexicon_free(lx);
}

/* Random word lists (repeats, shared prefixes, any order: siblings move
 * to the front as words are inserted) against brute force on random
 * inputs, each span checked both ways: found iff a word. */
Test(seq, lexicon_random_lists_match_brute_force) {
  srand(11);
  for (int list = 0; list < 40; list++) {
    char store[48][8];
    const char *words[48];
    int nw = 1 + rand() % 48;
    for (int i = 0; i < nw; i++) {
      int len = 1 + rand() % 6;
      for (int k = 0; k < len; k++) store[i][k] = "abcd"[rand() % 4];
      store[i][len] = 0;
      words[i] = store[i];
    }
    cn_lexicon *lx;
    cr_assert_eq(cn_lexicon_from_list(words, nw, &lx), 0);
    for (int trial = 0; trial < 50; trial++) {
      int n = 1 + rand() % 20;
      char s[24];
      const char *cs[24];
      int32_t ls[24];
      for (int i = 0; i < n; i++) {
        s[i] = "abcd"[rand() % 4];
        cs[i] = &s[i];
        ls[i] = 1;
      }
      ng = 0;
      cn_lexicon_match(lx, cs, ls, n, false, collect, NULL);
      int k = 0;
      for (int b = 0; b < n; b++)
        for (int e = b + 2; e <= n; e++) {
          bool in = false;
          for (int q = 0; q < nw && !in; q++)
            in = (int)strlen(words[q]) == e - b &&
                 memcmp(words[q], s + b, (size_t)(e - b)) == 0;
          if (!in) continue;
          cr_assert_lt(k, ng, "list %d: missing span [%d,%d)", list, b, e);
          cr_assert(got[k][0] == b && got[k][1] == e,
                    "list %d: span %d is [%d,%d), expected [%d,%d)", list,
                    k, got[k][0], got[k][1], b, e);
          k++;
        }
      cr_assert_eq(k, ng, "list %d: %d extra spans", list, ng - k);
    }
    cn_lexicon_free(lx);
  }
}

/* A lexicon file (CRLF and LF lines, empty lines, trailing '\r's, no
 * final newline) finds exactly the spans of its word list. */
Test(seq, lexicon_file_lines_as_the_list) {
  char path[] = "/tmp/canopy-lexicon-XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  static const char text[] = "ab\r\n\r\nabc\n\nb\r\r\nbca\n\n\ncab";
  cr_assert_eq(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
  close(fd);
  const char *words[] = {"ab", "abc", "b", "bca", "cab"};
  cn_lexicon *file, *list;
  cn_err err;
  cr_assert_eq(cn_lexicon_load(path, &file, &err), 0, "%s", err.msg);
  unlink(path);
  cr_assert_eq(cn_lexicon_from_list(words, 5, &list), 0);
  srand(5);
  for (int trial = 0; trial < 300; trial++) {
    int n = 1 + rand() % 16;
    char s[16];
    const char *cs[16];
    int32_t ls[16];
    for (int i = 0; i < n; i++) {
      s[i] = "abc\r"[rand() % 4];
      cs[i] = &s[i];
      ls[i] = 1;
    }
    int32_t want[600][2];
    ng = 0;
    cn_lexicon_match(list, cs, ls, n, false, collect, NULL);
    int nw = ng;
    memcpy(want, got, sizeof(int32_t) * 2 * (size_t)nw);
    ng = 0;
    cn_lexicon_match(file, cs, ls, n, false, collect, NULL);
    cr_assert_eq(ng, nw, "trial %d: %d spans from the file, %d from the "
                 "list", trial, ng, nw);
    cr_assert(memcmp(want, got, sizeof(int32_t) * 2 * (size_t)nw) == 0,
              "trial %d: other spans", trial);
  }
  cn_lexicon_free(file);
  cn_lexicon_free(list);
}

/* ---- tiny hand-checked cases ---- */
static double sg(double x) { return 1.0 / (1.0 + exp(-x)); }

static const float *T(const char *name) {
  const cn_tensor *t = cn_safetensors_find(&M->st, name);
  cr_assert_not_null(t, "%s", name);
  return t->data;
}

/* y = W[rows, :cols](ld) · x + b */
static void lin(const char *w, const char *b, int rows, int cols,
                const double *x, double *y) {
  const float *W = T(w), *B = T(b);
  for (int i = 0; i < rows; i++) {
    double s = B[i];
    for (int j = 0; j < cols; j++) s += (double)W[(size_t)i * cols + j] * x[j];
    y[i] = s;
  }
}

static json_t *run_one(const char *js) {
  json_t *in = json_pack("[o]", json_loads(js, 0, NULL));
  json_t *out = tu_run(M, in, CN_POLICY_AGENDA, 4, CN_OUT_HIDDEN, NULL, NULL);
  json_t *o = json_incref(json_array_get(out, 0));
  json_decref(in);
  json_decref(out);
  cr_assert_null(json_object_get(o, "error"));
  return o;
}

static void near(const json_t *a, const double *x, int n, const char *what) {
  cr_assert_eq((int)json_array_size(a), n, "%s", what);
  for (int i = 0; i < n; i++)
    cr_expect(fabs(json_number_value(json_array_get(a, i)) - x[i]) < 1e-5,
              "%s[%d]: %.8g vs %.8g", what, i,
              json_number_value(json_array_get(a, i)), x[i]);
}

/* "abc" with the one word [0, 2) "ab": char 1 merges the word. */
Test(seq, tiny_lattice_one_word, .fini = unload) {
  enum { H = 4 };
  load("latticelstm", "lattices.jsonl", H);
  const int D = H;
  const float *E = T("embed"), *WE = T("word_embed");
  const char *ch[3] = {"a", "b", "c"};
  double h[3][H], c[3][H], x[3][H];
  for (int j = 0; j < 3; j++) {
    int id = cn_vocab_lookup(M->vocab, ch[j], 1, false);
    for (int k = 0; k < D; k++) x[j][k] = E[(size_t)id * D + k];
  }
  int wid = cn_vocab_lookup(M->word_vocab, "ab", 2, false);
  double cw[H], l[H];
  for (int j = 0; j < 3; j++) {
    double in[2 * H], g[4 * H];
    for (int k = 0; k < D; k++) in[k] = x[j][k];
    for (int k = 0; k < H; k++) in[D + k] = j ? h[j - 1][k] : 0;
    lin("char.W", "char.b", 4 * H, D + H, in, g);
    if (j == 1) { /* the word ending here: cell and link gate */
      double xw[2 * H], gw[3 * H], xl[2 * H];
      for (int k = 0; k < D; k++) xw[k] = WE[(size_t)wid * D + k];
      for (int k = 0; k < H; k++) xw[D + k] = h[0][k];
      lin("word.W", "word.b", 3 * H, D + H, xw, gw);
      for (int k = 0; k < H; k++)
        cw[k] = sg(gw[H + k]) * c[0][k] + sg(gw[k]) * tanh(gw[2 * H + k]);
      for (int k = 0; k < D; k++) xl[k] = x[1][k];
      for (int k = 0; k < H; k++) xl[D + k] = cw[k];
      lin("link.W", "link.b", H, D + H, xl, l);
      for (int k = 0; k < H; k++) l[k] = sg(l[k]);
      for (int k = 0; k < H; k++) {
        double ai = exp(sg(g[k])), al = exp(l[k]);
        c[j][k] = (ai * tanh(g[3 * H + k]) + al * cw[k]) / (ai + al);
      }
    } else {
      for (int k = 0; k < H; k++)
        c[j][k] = sg(g[k]) * tanh(g[3 * H + k]) +
                  (j ? sg(g[H + k]) * c[j - 1][k] : 0);
    }
    for (int k = 0; k < H; k++) h[j][k] = sg(g[2 * H + k]) * tanh(c[j][k]);
  }
  json_t *o = run_one("{\"chars\": [\"a\", \"b\", \"c\"], \"words\": "
                      "[{\"start\": 0, \"end\": 2}]}");
  json_t *hs = json_object_get(o, "h");
  for (int j = 0; j < 3; j++) near(json_array_get(hs, j), h[j], H, "h");
  json_decref(o);
}

/* Two nodes: a -> b; the sink's logits from its GRU state. */
Test(seq, tiny_dag_two_nodes, .fini = unload) {
  enum { H = 4 };
  load("latticegru", "dags.jsonl", H);
  const float *E = T("embed");
  double h[2][H];
  const char *tok[2] = {"the", "of"};
  for (int j = 0; j < 2; j++) {
    double x[H], gi[3 * H], gh[3 * H], hp[H];
    int id = cn_vocab_lookup(M->vocab, tok[j], strlen(tok[j]), false);
    for (int k = 0; k < H; k++) x[k] = E[(size_t)id * H + k];
    for (int k = 0; k < H; k++) hp[k] = j ? h[0][k] : 0;
    lin("gru.W_ih", "gru.b_ih", 3 * H, H, x, gi);
    lin("gru.W_hh", "gru.b_hh", 3 * H, H, hp, gh);
    for (int k = 0; k < H; k++) {
      double r = sg(gi[k] + gh[k]), z = sg(gi[H + k] + gh[H + k]);
      double n = tanh(gi[2 * H + k] + r * gh[2 * H + k]);
      h[j][k] = (1 - z) * n + z * hp[k];
    }
  }
  double z[5];
  lin("out.W", "out.b", 5, H, h[1], z);
  json_t *o = run_one("{\"nodes\": [{\"token\": \"the\", \"prev\": []}, "
                      "{\"token\": \"of\", \"prev\": [0]}]}");
  near(json_object_get(o, "h"), h[1], H, "h");
  near(json_object_get(o, "logits"), z, 5, "logits");
  json_decref(o);
}

/* ---- lstm-nmt: data-dependent decoding ---- */

/* Overwrites tensor `name` of the model in `mdir` with `vals` (numel
 * floats), then reloads M. */
static void patch(const char *mdir, const char *name, const float *vals) {
  char path[600];
  snprintf(path, sizeof(path), "%s/weights.safetensors", mdir);
  const cn_tensor *t = cn_safetensors_find(&M->st, name);
  cr_assert_not_null(t);
  long off = (long)((const char *)t->data - (const char *)M->st.bytes);
  FILE *f = fopen(path, "r+b");
  cr_assert_not_null(f);
  cr_assert_eq(fseek(f, off, SEEK_SET), 0);
  cr_assert_eq(fwrite(vals, sizeof(float), (size_t)t->numel, f),
               (size_t)t->numel);
  fclose(f);
  cn_model_free(M);
  cn_err err;
  cr_assert_eq(cn_model_load(mdir, &M, &err), 0, "%s", err.msg);
}

/* proj.W = 0 and proj.b = e_k·10: every step emits token k. */
static void force_token(const char *mdir, int k) {
  const cn_tensor *w = cn_safetensors_find(&M->st, "proj.W");
  float *z = calloc((size_t)w->numel, sizeof(float));
  patch(mdir, "proj.W", z);
  const cn_tensor *b = cn_safetensors_find(&M->st, "proj.b");
  float *bb = calloc((size_t)b->numel, sizeof(float));
  bb[k] = 10.0f;
  patch(mdir, "proj.b", bb);
  free(z);
  free(bb);
}

static json_t *decode(const char *const *src, const int *caps, int n,
                      cn_policy_kind pol, long long *batches,
                      long long *bound) {
  cn_backend_ctx *bk;
  cn_err err;
  cr_assert_eq(cn_backend_open("cpu", 0, &bk, &err), 0);
  cn_run *r = cn_run_new(M, bk);
  cn_instance *in[8];
  for (int i = 0; i < n; i++) {
    json_t *j = json_pack("{s:s}", "text", src[i]);
    cr_assert_eq(cn_instance_parse(M, j, NULL, i, &in[i], &err), 0);
    json_decref(j);
    cr_assert_eq(cn_run_add(r, in[i], CN_OUT_HIDDEN, caps[i]), i);
  }
  cr_assert_eq(cn_run_exec(r, pol, &err), 0, "%s", err.msg);
  cn_run_stats st;
  cn_run_get_stats(r, &st);
  *batches = st.batches;
  *bound = st.lower_bound;
  json_t *out = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(out, cn_run_output(r, i));
  cn_run_free(r);
  for (int i = 0; i < n; i++) cn_instance_free(in[i]);
  cn_backend_close(bk);
  return out;
}

Test(seq, nmt_stops_at_eos_on_step_one, .fini = unload) {
  load("lstm-nmt", "sequences.jsonl", 8);
  char mdir[300];
  snprintf(mdir, sizeof(mdir), "%s/m", dir);
  force_token(mdir, 2); /* </s> */
  const char *src[1] = {"the cat sat"};
  int caps[1] = {0};
  long long nb, lb;
  json_t *o = decode(src, caps, 1, CN_POLICY_AGENDA, &nb, &lb);
  json_t *ids = json_object_get(json_array_get(o, 0), "output_ids");
  cr_expect_eq(json_array_size(ids), 0, "</s> is not part of the output");
  cr_expect_eq(lb, 3 + 2 * 1, "n + 2T with T = 1");
  cr_expect_eq(nb, lb);
  json_decref(o);
}

/* One instance stops at step 1 (cap 1), the other runs to its cap (6)
 * emitting token 5 every step; they share the run without padding, and
 * each output equals the instance decoded alone. */
Test(seq, nmt_different_lengths_share_a_run, .fini = unload) {
  load("lstm-nmt", "sequences.jsonl", 8);
  char mdir[300];
  snprintf(mdir, sizeof(mdir), "%s/m", dir);
  force_token(mdir, 5);
  const char *src[2] = {"the cat sat on the mat", "a dog"};
  int caps[2] = {1, 6};
  long long nb, lb;
  for (int p = CN_POLICY_NONE; p < CN_POLICY__COUNT; p++) {
    json_t *both = decode(src, caps, 2, (cn_policy_kind)p, &nb, &lb);
    cr_expect_eq(json_array_size(json_object_get(json_array_get(both, 0),
                                                 "output_ids")), 1);
    cr_expect_eq(json_array_size(json_object_get(json_array_get(both, 1),
                                                 "output_ids")), 6);
    cr_expect_eq(json_integer_value(json_array_get(json_object_get(
                     json_array_get(both, 1), "output_ids"), 5)), 5);
    /* bound: depth_enc 6 (the first instance) + depth_dec 6 + depth_proj 6
     * (the second) */
    cr_expect_eq(lb, 18, "policy %d bound %lld", p, lb);
    cr_expect_geq(nb, lb, "policy %d", p);
    for (int i = 0; i < 2; i++) {
      long long b1, l1;
      json_t *one = decode(&src[i], &caps[i], 1, CN_POLICY_NONE, &b1, &l1);
      cr_expect_leq(tu_json_maxdiff(json_array_get(one, 0),
                                    json_array_get(both, i)), 1e-5);
      json_decref(one);
    }
    json_decref(both);
  }
}
