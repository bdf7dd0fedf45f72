/* test_instance_line.c - instance lines read without a DOM
 * (core/model/instance_line.c) against the path through jansson
 * (json_loadb with JSON_REJECT_DUPLICATES, then cn_instance_parse), which
 * `canopy run` falls back to and which writes every error.
 *
 * On every line of data/, for a model of every input kind, under the
 * default limits and under tight ones, and on malformed variants of
 * lines (cut, a byte replaced, deleted or doubled at every position):
 * where the line reader reads a line, jansson's path reads it too and
 * makes the same instance, array for array; where jansson's path refuses
 * a line, the line reader never reads it (so the error, and its byte
 * offset, is jansson's path's). On data/'s own lines under the default
 * limits the line reader reads every line: the fast path is the one
 * taken. The tape (input/jline.c) is checked against jansson's values
 * on the same lines. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_util.h"
#include "internal.h"

static char dir[256];

/* A fresh model of family at H = 4; a lattice model gets data/'s
 * lexicon when lexicon is set. */
static cn_model *model(const char *family, const char *data, bool lexicon) {
  char path[512], lex[512];
  cn_model_init_opts o = {
      .family = family, .hidden = 4, .embed = 4, .classes = 3,
      .vocab_from = tu_data_path(data, path, sizeof(path)), .seed = 7,
      .lexicon = lexicon ? tu_data_path("lexicon.txt", lex, sizeof(lex))
                         : NULL};
  return tu_model_opts(o, dir, sizeof(dir));
}

/* The lines of a data file, raw (without their newlines). */
static char **raw_lines(const char *name, int *n) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", getenv("CANOPY_DATA"), name);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "cannot open %s", path);
  char **ls = NULL, *buf = NULL;
  size_t cap = 0;
  ssize_t len;
  *n = 0;
  while ((len = getline(&buf, &cap, f)) >= 0) {
    if (len > 0 && buf[len - 1] == '\n') buf[--len] = '\0';
    ls = realloc(ls, (size_t)(*n + 1) * sizeof(char *));
    ls[(*n)++] = strdup(buf);
  }
  free(buf);
  fclose(f);
  return ls;
}

#define EQ_ARR(a, b, n, what)                                           \
  cr_assert((n) == 0 || memcmp((a), (b), (size_t)(n) * sizeof(*(a))) == 0, \
            "%s differs on: %.120s", what, line)

static void same_instance(const cn_instance *x, const cn_instance *y,
                          const char *line) {
  cr_assert_eq(x->kind, y->kind);
  cr_assert_eq(x->n, y->n, "n %d vs %d on: %.120s", x->n, y->n, line);
  EQ_ARR(x->ids, y->ids, x->n, "ids");
  if (x->kind == CN_INPUT_TREE) {
    const cn_tree *a = &x->tree, *b = &y->tree;
    cr_assert_eq(a->n_nodes, b->n_nodes);
    cr_assert_eq(a->height, b->height);
    EQ_ARR(x->node_type, y->node_type, x->n, "node_type");
    EQ_ARR(a->children, b->children, a->n_nodes - 1, "children");
    /* what a run reads of a tree: the children by child_start; the
     * reader's tree keeps no nodes (the jansson path's are checked
     * against its own parse in test_tree_parse.c) */
    EQ_ARR(x->child_start, y->child_start, x->n + 1, "child_start");
    cr_assert_null(a->nodes, "a line reader's tree keeps no nodes");
    cr_assert_null(a->pool);
  }
  cr_assert_eq(x->n_spans, y->n_spans, "spans on: %.120s", line);
  EQ_ARR(x->span_start, y->span_start, x->n_spans, "span_start");
  EQ_ARR(x->span_end, y->span_end, x->n_spans, "span_end");
  EQ_ARR(x->span_word, y->span_word, x->n_spans, "span_word");
  cr_assert_eq(x->prev_start == NULL, y->prev_start == NULL);
  if (x->prev_start != NULL) {
    EQ_ARR(x->prev_start, y->prev_start, x->n + 1, "prev_start");
    EQ_ARR(x->prev, y->prev, x->prev_start[x->n], "prev");
  }
  cr_assert_eq(cn_instance_vertices(x, 1), cn_instance_vertices(y, 1));
  cr_assert_eq(cn_instance_unknown_labels(x), cn_instance_unknown_labels(y),
               "unknown labels on: %.120s", line);
}

static long long n_fast, n_slow_only;

/* One line both ways (the file comment); returns whether the line reader
 * read it. */
static bool check_line(const cn_model *m, cn_line_reader *rd,
                       const char *line, size_t len, const cn_limits *lim) {
  cn_instance *fast = NULL, *slow = NULL;
  int rf = cn_instance_parse_line(m, rd, line, len, lim, &fast);
  cr_assert(rf == 0 || rf == 1, "line reader: %d", rf);
  json_t *j = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
  int rs = -1;
  if (j != NULL) {
    cn_err err;
    rs = cn_instance_parse(m, j, lim, 0, &slow, &err);
    json_decref(j);
  }
  if (rf == 0) {
    cr_assert_eq(rs, 0, "read a line jansson's path refuses (%d): %.*s", rs,
                 (int)(len < 160 ? len : 160), line);
    same_instance(fast, slow, line);
    n_fast++;
  } else if (rs == 0) {
    if (getenv("SHOW_SLOW_ONLY") && n_slow_only < 5)
      fprintf(stderr, "slow only: %.*s\n", (int)len, line);
    n_slow_only++;
  }
  cn_instance_free(fast); /* a no-op: the arena holds it */
  cn_instance_free(slow);
  return rf == 0;
}

/* Malformed variants of a line at every byte: cut there; the byte
 * replaced by each of a few that matter to JSON or to the forms; deleted;
 * doubled. */
static void check_variants(const cn_model *m, cn_line_reader *rd,
                           const char *line, const cn_limits *lim) {
  static const char repl[] = {'"', '\\', '}', ']', ',', '0', '9', 'x',
                              ' ', '(', ')', '-', '\x01', '\x80', '\xc3', '{'};
  size_t len = strlen(line);
  char *b = malloc(len + 2);
  for (size_t p = 0; p < len; p++) {
    cn_line_reader_reset(rd);
    check_line(m, rd, line, p, lim);
    for (size_t r = 0; r < sizeof(repl); r++) {
      if (line[p] == repl[r]) continue;
      memcpy(b, line, len);
      b[p] = repl[r];
      check_line(m, rd, b, len, lim);
    }
    memcpy(b, line, p);
    memcpy(b + p, line + p + 1, len - p - 1);
    check_line(m, rd, b, len - 1, lim);
    memcpy(b, line, p + 1);
    memcpy(b + p + 1, line + p, len - p);
    check_line(m, rd, b, len + 1, lim);
  }
  free(b);
}

static void tight(cn_limits *l) {
  cn_limits_default(l);
  l->max_nodes = 40, l->max_depth = 9, l->max_token_len = 6;
  l->max_children = 2, l->max_seq_len = 20, l->max_spans = 30;
}

/* Every line of data, default and tight limits (all_valid: the model
 * takes every line, and the line reader must read each); then the
 * variants of every stride-th line under the default limits. */
static void check_family(const char *family, const char *data, bool lexicon,
                         int stride, bool all_valid) {
  cn_model *m = model(family, data, lexicon);
  cn_line_reader *rd = cn_line_reader_new();
  cr_assert_not_null(rd);
  int n;
  char **ls = raw_lines(data, &n);
  cr_assert_gt(n, 0);
  cn_limits dflt, small;
  cn_limits_default(&dflt);
  tight(&small);
  n_fast = n_slow_only = 0;
  for (int i = 0; i < n; i++) {
    if (i % 64 == 0) cn_line_reader_reset(rd);
    bool read = check_line(m, rd, ls[i], strlen(ls[i]), &dflt);
    cr_assert(read || !all_valid, "%s line %d not read by the line reader",
              data, i + 1);
    check_line(m, rd, ls[i], strlen(ls[i]), &small);
  }
  for (int i = 0; i < n; i += stride) check_variants(m, rd, ls[i], &dflt);
  cr_log_info("%s: %lld read by the line reader, %lld by jansson's path only",
              family, n_fast, n_slow_only);
  for (int i = 0; i < n; i++) free(ls[i]);
  free(ls);
  cn_line_reader_free(rd);
  cn_model_free(m);
  tu_rmdir(dir);
}

Test(instance_line, trees) { check_family("treelstm", "trees-binary.jsonl", false, 80, true); }
Test(instance_line, trees_2type) {
  check_family("treelstm-2type", "trees-binary.jsonl", false, 200, true);
}
Test(instance_line, trees_nary) {
  check_family("childsum-treelstm", "trees-nary.jsonl", false, 200, true);
}
Test(instance_line, binary_arity_on_nary_trees) {
  check_family("treelstm", "trees-nary.jsonl", false, 400, false);
}
Test(instance_line, sequences) {
  check_family("bilstm-tagger", "sequences.jsonl", false, 80, true);
}
Test(instance_line, lattices) {
  check_family("latticelstm", "lattices.jsonl", true, 200, true);
}
Test(instance_line, lattices_no_lexicon) {
  check_family("latticelstm", "lattices.jsonl", false, 400, true);
}
Test(instance_line, dags) { check_family("latticegru", "dags.jsonl", false, 400, true); }

/* Hand-made lines at the edges of the subset the tape reads: each either
 * read with the same instance or left to jansson's path, never read where
 * that path refuses. */
Test(instance_line, edges) {
  static const char *const tree_lines[] = {
      "{\"tree\":\"(S (N \\\"a\\\") (V b))\"}",
      "{\"tree\":\"(S (N a\\/b) (V b))\"}",
      "{\"tree\":\"(S (N \\u0061) (V b))\"}",
      "{\"tree\":\"(S (N a) (V b))\",\"tree\":\"(S (N a) (V b))\"}",
      "{\"tree\":\"(S (N a) (V b))\",\"id\":3}",
      "{\"tree\":\"(S (N a) (V b))\",\"tokens\":[\"a\"]}",
      "{\"tree\":{\"word\":\"a\"}}",
      "  {\"tree\" : \"(S (N a) (V b))\" }  ",
      "{\"tree\":\"(S (N a) (V b))\"} x",
      "{\"tree\":\"(S (N \xc3\xa9) (V b))\"}",
      "{\"tree\":\"(S (N \xed\xa0\x80) (V b))\"}",
      "{\"tree\":\"(S (N \xc0\xaf) (V b))\"}",
      "{\"tree\":\"(S (N a)\tb)\"}",
      "{\"tree\":\"(S (N a) (V b)\"}",
      "{\"tree\":\"\"}",
      "{\"tree\":null}",
      "[{\"tree\":\"(S (N a) (V b))\"}]",
      "{\"tree\":\"(S (N a) (V b))\",}",
      "{}",
  };
  cn_model *m = model("treelstm", "trees-binary.jsonl", false);
  cn_line_reader *rd = cn_line_reader_new();
  cn_limits dflt;
  cn_limits_default(&dflt);
  int read = 0;
  for (size_t i = 0; i < sizeof(tree_lines) / sizeof(tree_lines[0]); i++)
    read += check_line(m, rd, tree_lines[i], strlen(tree_lines[i]), &dflt);
  cr_expect_eq(read, 4, "read %d of the tree lines", read);
  cn_line_reader_free(rd);
  cn_model_free(m);
  tu_rmdir(dir);

  static const char *const dag_lines[] = {
      "{\"nodes\":[{\"token\":\"a\",\"prev\":[]},{\"token\":\"b\",\"prev\":[0]}]}",
      "{\"nodes\":[{\"token\":\"a\"},{\"token\":\"b\",\"prev\":[0]}]}",
      "{\"nodes\":[{\"token\":\"a\",\"prev\":[]},{\"token\":\"b\",\"prev\":[0,0]}]}",
      "{\"nodes\":[{\"token\":\"a\",\"prev\":[]},{\"token\":\"b\",\"prev\":[1]}]}",
      "{\"nodes\":[{\"token\":\"a\",\"prev\":[]},{\"token\":\"b\",\"prev\":[00]}]}",
      "{\"nodes\":[{\"token\":\"a\",\"prev\":[]},{\"token\":\"b\",\"prev\":[-0]}]}",
      "{\"nodes\":[{\"token\":\"a\",\"prev\":[]},{\"token\":\"b\",\"prev\":[0.0]}]}",
      "{\"nodes\":[{\"token\":\"a\",\"prev\":[]},{\"token\":\"b\",\"prev\":[99999999999999999999]}]}",
      "{\"nodes\":[{\"token\":\"a\",\"prev\":[]},{\"token\":\"b\",\"prev\":[]}]}",
      "{\"nodes\":[]}",
  };
  m = model("latticegru", "dags.jsonl", false);
  rd = cn_line_reader_new();
  read = 0;
  for (size_t i = 0; i < sizeof(dag_lines) / sizeof(dag_lines[0]); i++)
    read += check_line(m, rd, dag_lines[i], strlen(dag_lines[i]), &dflt);
  cr_expect_eq(read, 2, "read %d of the DAG lines", read);
  cn_line_reader_free(rd);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* "text" lines, made from data/'s tokens (joined by spaces, some by
 * U+3000 or a tab) and characters (with and without their words): read
 * as jansson's path reads them, and their variants never read where that
 * path refuses them. */
Test(instance_line, text_forms) {
  static const struct {
    const char *family, *data;
    bool lexicon;
  } fams[] = {{"bilstm-tagger", "sequences.jsonl", false},
              {"latticelstm", "lattices.jsonl", true}};
  cn_limits dflt, small;
  cn_limits_default(&dflt);
  tight(&small);
  for (size_t f = 0; f < 2; f++) {
    cn_model *m = model(fams[f].family, fams[f].data, fams[f].lexicon);
    cn_line_reader *rd = cn_line_reader_new();
    int n, read = 0;
    char **ls = raw_lines(fams[f].data, &n);
    for (int i = 0; i < n; i++) {
      json_t *j = json_loads(ls[i], 0, NULL);
      json_t *items = json_object_get(j, f == 0 ? "tokens" : "chars");
      size_t cap = 16;
      for (size_t k = 0; k < json_array_size(items); k++)
        cap += json_string_length(json_array_get(items, k)) + 4;
      char *text = malloc(cap);
      size_t at = 0;
      for (size_t k = 0; k < json_array_size(items); k++) {
        if (k > 0 && f == 0) {
          const char *sep = k % 7 == 0 ? "\xe3\x80\x80" : k % 5 == 0 ? "\t" : " ";
          memcpy(text + at, sep, strlen(sep));
          at += strlen(sep);
        }
        const char *w = json_string_value(json_array_get(items, k));
        memcpy(text + at, w, strlen(w));
        at += strlen(w);
      }
      text[at] = '\0';
      json_t *o = json_pack("{s:s}", "text", text);
      if (f == 1 && i % 2 == 0)
        json_object_set(o, "words", json_object_get(j, "words"));
      char *line = json_dumps(o, JSON_COMPACT);
      if (i % 64 == 0) cn_line_reader_reset(rd);
      read += check_line(m, rd, line, strlen(line), &dflt);
      check_line(m, rd, line, strlen(line), &small);
      if (i % 100 == 0) check_variants(m, rd, line, &dflt);
      free(line);
      json_decref(o);
      free(text);
      json_decref(j);
    }
    cr_expect_eq(read, n, "%s: %d of %d text lines read", fams[f].family,
                 read, n);
    for (int i = 0; i < n; i++) free(ls[i]);
    free(ls);
    cn_line_reader_free(rd);
    cn_model_free(m);
    tu_rmdir(dir);
  }
}

/* The internal nodes' labels a bracketed tree holds that are not NP or
 * PP (treelstm-2type's type_b_labels as `model init` writes them),
 * counted on the text itself: a '(' whose label is followed by another
 * '(' opens an internal node. The reference for unknown_labels. */
static int labels_not_np_pp(const char *t) {
  int n = 0;
  for (const char *p = t; *p != '\0'; p++) {
    if (*p != '(') continue;
    const char *l = p + 1, *e = l;
    while (*e != '\0' && *e != ' ' && *e != '(' && *e != ')') e++;
    const char *q = e;
    while (*q == ' ') q++;
    if (*q != '(' || e == l) continue; /* a leaf, or no label */
    size_t len = (size_t)(e - l);
    if (!(len == 2 && (memcmp(l, "NP", 2) == 0 || memcmp(l, "PP", 2) == 0)))
      n++;
  }
  return n;
}

/* stats.unknown_labels' count: on treelstm-2type, every internal label
 * but NP and PP, read both ways, on every line of data/ and on labels
 * that differ from a listed one by case; on a JSON tree (typed by
 * "type") and on a model that reads no labels, none. */
Test(instance_line, unknown_labels) {
  cn_model *m = model("treelstm-2type", "trees-binary.jsonl", false);
  cr_assert_eq(cn_model_reads_labels(m), 1);
  cn_line_reader *rd = cn_line_reader_new();
  cn_limits lim;
  cn_limits_default(&lim);
  int n, some = 0;
  char **ls = raw_lines("trees-binary.jsonl", &n);
  for (int i = 0; i < n; i++) {
    json_t *j = json_loads(ls[i], 0, NULL);
    cr_assert_not_null(j);
    int want = labels_not_np_pp(json_string_value(json_object_get(j, "tree")));
    json_decref(j);
    cn_instance *in = NULL;
    if (i % 64 == 0) cn_line_reader_reset(rd);
    cr_assert_eq(cn_instance_parse_line(m, rd, ls[i], strlen(ls[i]), &lim,
                                        &in), 0);
    cr_expect_eq(cn_instance_unknown_labels(in), want, "line %d", i + 1);
    check_line(m, rd, ls[i], strlen(ls[i]), &lim); /* jansson's the same */
    some += want > 0;
    free(ls[i]);
  }
  free(ls);
  cr_expect(some > 0);
  static const struct {
    const char *line;
    int want;
  } cases[] = {
      {"{\"tree\": \"(NP (np (W a) (W b)) (PP (W c) (Pp (W d) (W e))))\"}", 2},
      {"{\"tree\": \"(PP (NP (W a) (W b)) (W c))\"}", 0},
      {"{\"tree\": \"(W a)\"}", 0},
      {"{\"tree\": {\"children\": [{\"word\": \"a\"}, {\"word\": \"b\"}],"
       " \"type\": \"b\"}}", 0},
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    json_t *j = json_loads(cases[k].line, 0, NULL);
    cr_assert_not_null(j, "%s", cases[k].line);
    cn_instance *in = NULL;
    cn_err err;
    cr_assert_eq(cn_instance_parse(m, j, &lim, 0, &in, &err), 0, "%s: %s",
                 cases[k].line, err.msg);
    cr_expect_eq(cn_instance_unknown_labels(in), cases[k].want, "%s",
                 cases[k].line);
    cn_instance_free(in);
    json_decref(j);
  }
  cn_line_reader_free(rd);
  cn_model_free(m);
  tu_rmdir(dir);
  /* treelstm reads no label: none is unknown */
  m = model("treelstm", "trees-binary.jsonl", false);
  cr_assert_eq(cn_model_reads_labels(m), 0);
  json_t *j = json_loads(cases[0].line, 0, NULL);
  cn_instance *in = NULL;
  cn_err err;
  cr_assert_eq(cn_instance_parse(m, j, &lim, 0, &in, &err), 0);
  cr_expect_eq(cn_instance_unknown_labels(in), 0);
  cn_instance_free(in);
  json_decref(j);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* The tape's strings against jansson's: objects of random strings -
 * plain ASCII of every length around the 8- and 16-byte steps of the
 * scan, escapes, \u escapes, raw control bytes, valid and broken UTF-8
 * at every position. A line the tape reads, jansson reads as the same
 * strings; a line jansson refuses, the tape never reads. */
Test(instance_line, jline_strings_against_jansson) {
  static const char *const pieces[] = {
      "a", "Z", "0", " ", "\\\"", "\\\\", "\\/", "\\n", "\\t", "\\u0041",
      "\\x", "\x01", "\x1f", "\x7f", "\xc3\xa9", "\xe4\xb8\x80",
      "\xf0\x9f\x98\x80", "\xc3", "\xed\xa0\x80", "\xc0\xaf", "\xff", "\""};
  unsigned seed = 99;
  cn_jline jl;
  memset(&jl, 0, sizeof(jl));
  char line[4096];
  int read = 0;
  for (int it = 0; it < 20000; it++) {
    size_t k = 0;
    k += (size_t)snprintf(line + k, sizeof(line) - k, "{\"s\": [");
    int n_str = 1 + rand_r(&seed) % 3;
    for (int q = 0; q < n_str; q++) {
      line[k++] = q ? ',' : ' ';
      line[k++] = '"';
      int plain = rand_r(&seed) % 40;
      for (int c = 0; c < plain; c++) line[k++] = "abcdefgh"[c % 8];
      int odd = rand_r(&seed) % 4 == 0 ? rand_r(&seed) % 3 : 0;
      for (int c = 0; c < odd; c++) {
        const char *p = pieces[rand_r(&seed) % 22];
        size_t l = strlen(p);
        if (p[0] == '\x01' || p[0] == '\x1f') l = 1;
        memcpy(line + k, p, l);
        k += l;
        int more = rand_r(&seed) % 20;
        for (int d = 0; d < more; d++) line[k++] = 'x';
      }
      line[k++] = '"';
    }
    k += (size_t)snprintf(line + k, sizeof(line) - k, "]}");
    int rc = cn__jline_read(&jl, line, k);
    json_t *j = json_loadb(line, k, JSON_REJECT_DUPLICATES, NULL);
    cr_assert(rc == 0 || rc == 1);
    if (rc != 0) {
      json_decref(j);
      continue;
    }
    read++;
    cr_assert_not_null(j, "the tape read what jansson refuses: %.*s", (int)k,
                       line);
    const json_t *a = json_object_get(j, "s");
    cr_assert_eq(jl.v[2].kind, CN_JV_ARR);
    cr_assert_eq((size_t)jl.v[2].n, json_array_size(a));
    for (int32_t q = 0, at = 3; q < jl.v[2].n; q++, at = jl.v[at].next) {
      const json_t *x = json_array_get(a, (size_t)q);
      cr_assert_eq(jl.v[at].kind, CN_JV_STR);
      cr_assert_eq((size_t)jl.v[at].n, json_string_length(x), "%.*s",
                   (int)k, line);
      cr_assert(memcmp(jl.v[at].s, json_string_value(x), json_string_length(x))
                    == 0, "%.*s", (int)k, line);
    }
    json_decref(j);
  }
  cr_assert_gt(read, 10000, "most lines are read (%d)", read);
  cn__jline_free(&jl);
}
