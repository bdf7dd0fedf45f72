/* test_model.c - vocabularies, model loading and cn_model_init.
 *
 * Every registered family must survive init -> load; every way a model
 * directory can be wrong must be refused whole, with a message naming the
 * file and the key or tensor to fix. */
#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends.h"
#include "families/families.h"
#include "internal.h"

static char dir[64];

static int rm_one(const char *p, const struct stat *sb, int flag,
                  struct FTW *ftw) {
  return remove(p);
}

static void setup(void) {
  strcpy(dir, "/tmp/cn_model_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

TestSuite(vocab, .init = setup, .fini = teardown);
TestSuite(model, .init = setup, .fini = teardown);

static const char *in_dir(const char *name) {
  static char p[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof(p[k]), "%s/%s", dir, name);
  return p[k];
}

static void put(const char *name, const char *text) {
  FILE *f = fopen(in_dir(name), "wb");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static const char *data_file(const char *name) {
  static char p[512];
  const char *d = getenv("CANOPY_DATA");
  cr_assert_not_null(d, "set CANOPY_DATA to shared/data (meson test does)");
  snprintf(p, sizeof(p), "%s/%s", d, name);
  return p;
}

/* ---- vocab --------------------------------------------------------------*/
Test(vocab, load_lookup_lowercase_unk) {
  put("v.txt", "<unk>\nthe\nThe\nfilm\r\nthe\n");
  cn_vocab *v;
  cn_err e;
  cr_assert_eq(cn_vocab_load(in_dir("v.txt"), &v, &e), 0, "%s", e.msg);
  cr_assert_eq(cn_vocab_size(v), 5);
  cr_assert_eq(cn_vocab_lookup(v, "the", 3, false), 1);
  cr_assert_eq(cn_vocab_lookup(v, "The", 3, false), 2);
  cr_assert_eq(cn_vocab_lookup(v, "THE", 3, true), 1);
  cr_assert_eq(cn_vocab_lookup(v, "The", 3, true), 1);
  cr_assert_eq(cn_vocab_lookup(v, "film", 4, false), 3, "\\r not stripped");
  cr_assert_eq(cn_vocab_lookup(v, "FiLm", 4, true), 3);
  cr_assert_eq(cn_vocab_lookup(v, "films", 4, false), 3, "length ignored");
  cr_assert_eq(cn_vocab_lookup(v, "films", 5, false), 0);
  cr_assert_eq(cn_vocab_lookup(v, "", 0, false), 0);
  cr_assert_eq(cn_vocab_lookup(v, "<unk>", 5, false), 0);
  cr_assert_str_eq(cn_vocab_token(v, 3), "film");
  cr_assert_str_eq(cn_vocab_token(v, 4), "the"); /* duplicate keeps its id */
  cr_assert_null(cn_vocab_token(v, 5));
  cr_assert_null(cn_vocab_token(v, -1));
  cn_vocab_free(v);
}

Test(vocab, no_final_newline_and_many_tokens) {
  FILE *f = fopen(in_dir("big.txt"), "wb");
  fputs("<unk>", f);
  for (int i = 1; i < 5000; i++) fprintf(f, "\ntok%d", i);
  fclose(f);
  cn_vocab *v;
  cn_err e;
  cr_assert_eq(cn_vocab_load(in_dir("big.txt"), &v, &e), 0, "%s", e.msg);
  cr_assert_eq(cn_vocab_size(v), 5000);
  char b[16];
  for (int i = 1; i < 5000; i++) {
    int n = snprintf(b, sizeof(b), "TOK%d", i);
    cr_assert_eq(cn_vocab_lookup(v, b, (size_t)n, true), i);
    cr_assert_eq(cn_vocab_lookup(v, b, (size_t)n, false), 0);
  }
  cn_vocab_free(v);
}

Test(vocab, empty_line_is_an_error_naming_it) {
  put("v.txt", "<unk>\na\n\nb\n");
  cn_vocab *v = (cn_vocab *)1;
  cn_err e;
  cr_assert_eq(cn_vocab_load(in_dir("v.txt"), &v, &e), CN_E_BAD_MODEL);
  cr_assert_null(v);
  cr_assert_not_null(strstr(e.msg, "line 3"), "%s", e.msg);
  cr_assert_not_null(strstr(e.msg, "v.txt"), "%s", e.msg);
  put("v.txt", "<unk>\na\n\r\n");
  cr_assert_eq(cn_vocab_load(in_dir("v.txt"), &v, &e), CN_E_BAD_MODEL);
  cr_assert_not_null(strstr(e.msg, "line 3"), "%s", e.msg);
  put("v.txt", "");
  cr_assert_eq(cn_vocab_load(in_dir("v.txt"), &v, &e), CN_E_BAD_MODEL);
  cr_assert_eq(cn_vocab_load(in_dir("none.txt"), &v, &e), CN_E_IO);
  cr_assert_not_null(strstr(e.msg, "none.txt"), "%s", e.msg);
}

Test(vocab, write_then_load_and_from_list) {
  const char *toks[] = {"<unk>", "b", "a", "Ça"};
  cn_err e;
  cr_assert_eq(cn_vocab_write(in_dir("w.txt"), toks, 4, &e), 0, "%s", e.msg);
  cr_assert_str_eq(slurp(in_dir("w.txt")), "<unk>\nb\na\nÇa\n");
  cn_vocab *v, *l;
  cr_assert_eq(cn_vocab_load(in_dir("w.txt"), &v, &e), 0);
  cr_assert_eq(cn_vocab_from_list(toks, 4, &l), 0);
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(cn_vocab_lookup(v, toks[i], strlen(toks[i]), false), i);
    cr_assert_eq(cn_vocab_lookup(l, toks[i], strlen(toks[i]), false), i);
  }
  cn_vocab_free(v);
  cn_vocab_free(l);
  const char *bad[] = {"<unk>", "a\nb"};
  cr_assert_neq(cn_vocab_write(in_dir("x.txt"), bad, 2, &e), 0);
  cr_assert_eq(access(in_dir("x.txt"), F_OK), -1);
}

Test(vocab, rank_by_count_then_bytes) {
  char *bag[] = {strdup("b"), strdup("a"), strdup("c"), strdup("b"),
                 strdup("<unk>"), strdup("a"), strdup(""), strdup("d"),
                 strdup("b")};
  const char *sp[] = {"<unk>"};
  const char **out;
  int n;
  cr_assert_eq(cn__vocab_rank(bag, 9, sp, 1, 4, &out, &n), 0);
  cr_assert_eq(n, 4);
  cr_assert_str_eq(out[0], "<unk>");
  cr_assert_str_eq(out[1], "b"); /* 3 */
  cr_assert_str_eq(out[2], "a"); /* 2 */
  cr_assert_str_eq(out[3], "c"); /* 1, before d */
  free(out);
  for (int i = 0; i < 9; i++) free(bag[i]);
}

/* ---- model: helpers -----------------------------------------------------*/
static void init_model(const char *family, const char *vocab_from, int h) {
  cn_model_init_opts o = {.family = family, .dir = dir, .hidden = h,
                          .embed = 0, .seed = 7, .vocab_from = vocab_from};
  cn_err e;
  cn_err_clear(&e);
  int rc = cn_model_init(&o, &e);
  cr_assert_eq(rc, 0, "init %s: %s", family, e.msg);
}

/* Load must fail with code, leaving *out NULL, and mention both strings. */
static void expect_load_fail(int code, const char *s1, const char *s2) {
  cn_model *m = (cn_model *)1;
  cn_err e;
  cn_err_clear(&e);
  int rc = cn_model_load(dir, &m, &e);
  cr_assert_eq(rc, code, "rc %d (%s), msg: %s", rc, cn_err_code(rc), e.msg);
  cr_assert_eq(e.code, code);
  cr_assert_null(m);
  if (s1) cr_assert_not_null(strstr(e.msg, s1), "no '%s' in: %s", s1, e.msg);
  if (s2) cr_assert_not_null(strstr(e.msg, s2), "no '%s' in: %s", s2, e.msg);
}

static json_t *read_json(void) {
  json_error_t je;
  json_t *j = json_load_file(in_dir("model.json"), 0, &je);
  cr_assert_not_null(j, "%s", je.text);
  return j;
}

static void write_json(json_t *j) {
  cr_assert_eq(json_dump_file(j, in_dir("model.json"), JSON_INDENT(2)), 0);
  json_decref(j);
}

/* Rewrites weights.safetensors without tensor drop, with tensor reshape
 * given shape [r, c] and with a tensor add of shape [r, c] (each if not
 * NULL). */
static void rewrite_weights(const char *drop, const char *reshape,
                            const char *add, int64_t r, int64_t c) {
  cn_safetensors st;
  cn_err e;
  const char *p = in_dir("weights.safetensors");
  cr_assert_eq(cn_safetensors_open(p, &st, &e), 0, "%s", e.msg);
  cn_tensor_out t[CN_MAX_TENSORS + 1];
  float *big = calloc((size_t)(r * c + 1), sizeof(float));
  int n = 0;
  for (int i = 0; i < st.n; i++) {
    const cn_tensor *s = &st.tensors[i];
    if (drop && strcmp(s->name, drop) == 0) continue;
    t[n] = (cn_tensor_out){s->name, s->ndim, {0}, s->data};
    memcpy(t[n].shape, s->shape, sizeof(s->shape));
    if (reshape && strcmp(s->name, reshape) == 0)
      t[n] = (cn_tensor_out){s->name, 2, {r, c}, big};
    n++;
  }
  if (add) t[n++] = (cn_tensor_out){add, 2, {r, c}, big};
  cr_assert_eq(cn_safetensors_write(p, t, n, &e), 0, "%s", e.msg);
  cn_safetensors_close(&st);
  free(big);
}

static const char *data_for(const cn_family *f) {
  switch (f->input) {
  case CN_INPUT_TREE:
    return data_file(strcmp(f->name, "childsum-treelstm") == 0
                         ? "trees-nary.jsonl" : "trees-binary.jsonl");
  case CN_INPUT_SEQUENCE: return data_file("sequences.jsonl");
  case CN_INPUT_LATTICE: return data_file("lattices.jsonl");
  case CN_INPUT_DAG: return data_file("dags.jsonl");
  }
  return NULL;
}

/* ---- model: init -> load for every family ------------------------------*/
static void check_loaded(const cn_family *f, const cn_model *m, int h) {
  cr_assert_str_eq(cn_model_family(m), f->name);
  cr_assert_eq(cn_model_input(m), f->input);
  cr_assert_eq(cn_model_n_types(m), f->n_types);
  cr_assert_str_eq(cn_model_type_name(m, 0), f->type_names[0]);
  cr_assert_null(cn_model_type_name(m, f->n_types));
  cr_assert_eq(m->dims.H, h);
  cr_assert_gt(m->dims.V, 1);
  cr_assert_eq(m->dims.V, cn_vocab_size(m->vocab));
  cr_assert_str_eq(cn_vocab_token(m->vocab, 0), "<unk>");
  cn_tensor_spec spec[CN_MAX_TENSORS];
  cr_assert_eq(m->n_tensors, f->tensors(&m->dims, spec));
  for (int i = 0; i < m->n_tensors; i++) {
    cr_assert_str_eq(m->w[i]->name, spec[i].name);
    cr_assert_eq(m->w[i]->ndim, spec[i].ndim);
    for (int k = 0; k < spec[i].ndim; k++)
      cr_assert_eq(m->w[i]->shape[k], spec[i].shape[k], "%s dim %d",
                   spec[i].name, k);
    for (int64_t k = 0; k < m->w[i]->numel; k++)
      cr_assert(m->w[i]->data[k] > -1.5f && m->w[i]->data[k] < 1.5f,
                "%s[%lld] = %g", spec[i].name, (long long)k, m->w[i]->data[k]);
  }
  json_t *d = cn_model_describe(m);
  cr_assert_str_eq(json_string_value(json_object_get(d, "family")), f->name);
  cr_assert_str_eq(json_string_value(json_object_get(d, "input")),
                   cn_input_kind_name(f->input));
  cr_assert_eq(json_integer_value(json_object_get(d, "vocab_size")), m->dims.V);
  cr_assert_eq(json_array_size(json_object_get(d, "vertex_types")),
               (size_t)f->n_types);
  if (f->has_classes) {
    cr_assert_eq(json_integer_value(json_object_get(d, "classes")), 5);
    json_t *l = json_object_get(d, "labels");
    cr_assert_eq(json_array_size(l), 5);
    cr_assert_str_eq(json_string_value(json_array_get(l, 4)), "very positive");
  }
  json_decref(d);
}

Test(model, init_load_every_family_from_data) {
  cr_assert_gt(cn__family_count(), 0);
  for (int i = 0; i < cn__family_count(); i++) {
    const cn_family *f = cn__family_at(i);
    teardown();
    setup();
    init_model(f->name, data_for(f), 16);
    cn_model *m = NULL;
    cn_err e;
    cr_assert_eq(cn_model_load(dir, &m, &e), 0, "%s: %s", f->name, e.msg);
    check_loaded(f, m, 16);
    /* characters (a-z) for lattices, words otherwise */
    cr_assert_gt(m->dims.V, f->input == CN_INPUT_LATTICE ? 20 : 50,
                 "%s: vocab from data has %lld tokens", f->name,
                 (long long)m->dims.V);
    if (f->input == CN_INPUT_LATTICE)
      cr_assert_gt(m->dims.Vw, 50, "%s: word vocab", f->name);
    if (strcmp(f->name, "mvrnn") == 0) {
      cr_assert_eq(m->dims.K, 256);
      cr_assert_eq(m->dims.D, 16);
    }
    if (strcmp(f->name, "treelstm-2type") == 0) {
      cr_assert_eq(m->n_type_b_labels, 2);
      cr_assert_str_eq(m->type_b_labels[1], "PP");
    }
    cn_model_free(m);
  }
}

Test(model, init_builtin_vocab_and_defaults) {
  for (int i = 0; i < cn__family_count(); i++) {
    const cn_family *f = cn__family_at(i);
    teardown();
    setup();
    init_model(f->name, NULL, 0);
    cn_model *m = NULL;
    cn_err e;
    cr_assert_eq(cn_model_load(dir, &m, &e), 0, "%s: %s", f->name, e.msg);
    check_loaded(f, m, 64);
    cr_assert_eq(m->dims.D, 64);
    cr_assert_eq(m->n_labels, f->has_classes ? 5 : 0);
    cr_assert_eq(m->lowercase, false);
    /* lattice models read characters, the others words */
    if (f->input == CN_INPUT_LATTICE)
      cr_assert_gt(cn_vocab_lookup(m->vocab, "t", 1, false), 0);
    else
      cr_assert_gt(cn_vocab_lookup(m->vocab, "the", 3, false), 0);
    cn_model_free(m);
  }
}

Test(model, init_is_deterministic_and_seeded) {
  cn_model_init_opts o = {.family = "treelstm", .dir = dir, .hidden = 8,
                          .embed = 4, .classes = 2, .seed = 3};
  cn_err e;
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
  cn_model *a, *b;
  cr_assert_eq(cn_model_load(dir, &a, &e), 0, "%s", e.msg);
  cr_assert_eq(a->dims.C, 2);
  cr_assert_str_eq(a->labels[1], "positive");
  o.seed = 4;
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
  cr_assert_eq(cn_model_load(dir, &b, &e), 0, "%s", e.msg);
  cr_assert_neq(memcmp(a->w[1]->data, b->w[1]->data, 4 * sizeof(float)), 0);
  cn_model_free(b);
  o.seed = 3;
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
  cr_assert_eq(cn_model_load(dir, &b, &e), 0, "%s", e.msg);
  for (int i = 0; i < a->n_tensors; i++)
    cr_assert_arr_eq(a->w[i]->data, b->w[i]->data,
                     (size_t)a->w[i]->numel * sizeof(float));
  /* Ranges of the init kinds: leaf.W is U(±1/√D), leaf.b U(±1/√H). */
  const cn_tensor *lw = cn_safetensors_find(&a->st, "leaf.W");
  const cn_tensor *lb = cn_safetensors_find(&a->st, "leaf.b");
  float mw = 0, mb = 0;
  for (int64_t k = 0; k < lw->numel; k++)
    mw = fmaxf(mw, fabsf(lw->data[k]));
  for (int64_t k = 0; k < lb->numel; k++)
    mb = fmaxf(mb, fabsf(lb->data[k]));
  cr_assert(mw <= 0.5f && mw > 0.2f, "leaf.W max %g", mw);
  cr_assert(mb <= 0.3536f && mb > 0.1f, "leaf.b max %g", mb);
  cn_model_free(a);
  cn_model_free(b);
}

Test(model, init_vocab_ranked_and_capped) {
  put("d.jsonl", "{\"tree\": \"(S (A b) (B a))\"}\n\n"
                 "{\"tree\": {\"children\": [{\"word\": \"b\"}, "
                 "{\"word\": \"c\"}]}}\n{\"tree\": \"(X (Y b) z)\"}\n");
  cn_model_init_opts o = {.family = "treelstm", .dir = in_dir("m"),
                          .vocab_from = in_dir("d.jsonl"), .hidden = 4};
  cn_err e;
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
  cr_assert_str_eq(slurp(in_dir("m/vocab.txt")), "<unk>\nb\na\nc\nz\n");
  o.max_vocab = 3;
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
  cr_assert_str_eq(slurp(in_dir("m/vocab.txt")), "<unk>\nb\na\n");
  put("d.jsonl", "{\"tree\": \"(S (A b) (B a))\"}\n{\"tree\": \"(S (A b\"}\n");
  cr_assert_neq(cn_model_init(&o, &e), 0);
  cr_assert_not_null(strstr(e.msg, "d.jsonl: line 2"), "%s", e.msg);
  o.vocab_from = in_dir("nothing.jsonl");
  cr_assert_eq(cn_model_init(&o, &e), CN_E_IO);
  cr_assert_not_null(strstr(e.msg, "nothing.jsonl"), "%s", e.msg);
}

Test(model, init_refuses_unknown_family_and_bad_sizes) {
  cn_model_init_opts o = {.family = "transformer", .dir = dir};
  cn_err e;
  cr_assert_neq(cn_model_init(&o, &e), 0);
  cr_assert_not_null(strstr(e.msg, "transformer"), "%s", e.msg);
  cr_assert_not_null(strstr(e.msg, "treelstm"), "%s", e.msg);
  cr_assert_eq(access(in_dir("model.json"), F_OK), -1);
  o = (cn_model_init_opts){.family = "mvrnn", .dir = dir, .hidden = 8,
                           .embed = 4};
  cr_assert_neq(cn_model_init(&o, &e), 0);
  cr_assert_not_null(strstr(e.msg, "embed"), "%s", e.msg);
  o = (cn_model_init_opts){.family = "treegru", .dir = dir, .hidden = -3};
  cr_assert_neq(cn_model_init(&o, &e), 0);
  cr_assert_not_null(strstr(e.msg, "hidden"), "%s", e.msg);
}

/* ---- model: load errors -------------------------------------------------*/
Test(model, missing_key_names_it) {
  init_model("treelstm", NULL, 8);
  json_t *j = read_json();
  json_object_del(j, "hidden");
  write_json(j);
  expect_load_fail(CN_E_BAD_MODEL, "'hidden'", "model.json");
  j = read_json();
  json_object_set_new(j, "hidden", json_integer(8));
  json_object_set_new(j, "classes", json_string("five"));
  write_json(j);
  expect_load_fail(CN_E_BAD_MODEL, "'classes'", "model.json");
  j = read_json();
  json_object_set_new(j, "classes", json_integer(5));
  json_object_del(j, "vocab");
  write_json(j);
  expect_load_fail(CN_E_BAD_MODEL, "'vocab'", "model.json");
}

Test(model, unknown_family_lists_known) {
  init_model("treegru", NULL, 8);
  json_t *j = read_json();
  json_object_set_new(j, "family", json_string("rnng"));
  write_json(j);
  expect_load_fail(CN_E_BAD_MODEL, "'rnng'", "treelstm, treelstm-2type");
}

Test(model, missing_tensor_names_it) {
  init_model("treelstm", NULL, 8);
  rewrite_weights("leaf.W", NULL, NULL, 0, 0);
  expect_load_fail(CN_E_BAD_MODEL, "tensor 'leaf.W' is missing",
                   "weights.safetensors");
}

Test(model, wrong_shape_names_tensor_and_sizes) {
  init_model("treelstm", NULL, 8); /* H = 8, D = 64 */
  rewrite_weights(NULL, "leaf.W", NULL, 24, 32);
  expect_load_fail(CN_E_BAD_MODEL,
                   "tensor 'leaf.W' has shape [24, 32], expected [24, 64]",
                   "3H=24, D=64");
}

Test(model, extra_tensors_are_fine) {
  init_model("childsum-treelstm", NULL, 8);
  rewrite_weights(NULL, NULL, "unused.extra", 2, 2);
  cn_model *m;
  cn_err e;
  cr_assert_eq(cn_model_load(dir, &m, &e), 0, "%s", e.msg);
  cr_assert_eq(m->st.n, m->n_tensors + 1);
  cn_model_free(m);
}

Test(model, truncated_weights) {
  init_model("treegru", NULL, 8);
  const char *p = in_dir("weights.safetensors");
  FILE *f = fopen(p, "rb");
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fclose(f);
  cr_assert_eq(truncate(p, len - 8), 0);
  expect_load_fail(CN_E_BAD_MODEL, "weights.safetensors", "'out.b'");
  unlink(p);
  expect_load_fail(CN_E_IO, "weights.safetensors", NULL);
}

Test(model, labels_count_must_match_classes) {
  init_model("treelstm", NULL, 8);
  json_t *j = read_json();
  json_object_set_new(j, "labels", json_pack("[sss]", "a", "b", "c"));
  write_json(j);
  expect_load_fail(CN_E_BAD_MODEL, "'labels' has 3 names", "'classes' is 5");
}

Test(model, mvrnn_needs_embed_equal_hidden) {
  init_model("mvrnn", NULL, 8);
  json_t *j = read_json();
  json_object_set_new(j, "embed", json_integer(4));
  write_json(j);
  expect_load_fail(CN_E_BAD_MODEL, "mvrnn", "'embed' == 'hidden'");
}

Test(model, vocab_and_json_file_errors) {
  expect_load_fail(CN_E_IO, "model.json", NULL);
  init_model("treelstm", NULL, 8);
  unlink(in_dir("vocab.txt"));
  expect_load_fail(CN_E_IO, "vocab.txt", NULL);
  put("vocab.txt", "<unk>\n\nfilm\n");
  expect_load_fail(CN_E_BAD_MODEL, "vocab.txt", "line 2");
  put("model.json", "{\"family\": \"treelstm\",\n  \"hidden\": }");
  expect_load_fail(CN_E_BAD_MODEL, "model.json", "line 2");
  put("model.json", "{\"family\": \"treelstm\", \"hidden\": 8, \"embed\": 64,"
                    " \"classes\": 5, \"vocab\": \"vocab.txt\","
                    " \"lowercase\": \"yes\"}");
  expect_load_fail(CN_E_BAD_MODEL, "'lowercase'", NULL);
}

Test(model, vocab_size_change_is_caught_by_embed_shape) {
  init_model("treelstm", NULL, 8);
  put("vocab.txt", "<unk>\nthe\n");
  expect_load_fail(CN_E_BAD_MODEL, "'embed'", "V=2");
}

Test(model, optional_keys) {
  init_model("treelstm", NULL, 8);
  json_t *j = read_json();
  json_object_set_new(j, "lowercase", json_true());
  json_object_set_new(j, "lexicon", json_string("lexicon.txt"));
  json_object_set_new(j, "max_decode_len", json_integer(7));
  write_json(j);
  cn_model *m;
  cn_err e0;
  /* A lexicon that model.json names must exist: the error names it. */
  cr_assert_eq(cn_model_load(dir, &m, &e0), CN_E_IO);
  cr_assert(strstr(e0.msg, "lexicon.txt") != NULL, "%s", e0.msg);
  put("lexicon.txt", "the\nfilm\n");
  cn_err e;
  cr_assert_eq(cn_model_load(dir, &m, &e), 0, "%s", e.msg);
  cr_assert(m->lowercase);
  cr_assert_eq(m->max_decode_len, 7);
  cr_assert_str_eq(m->lexicon_path, in_dir("lexicon.txt"));
  cr_assert_not_null(m->lexicon);
  cr_assert_null(m->word_vocab);
  cr_assert_eq(m->dims.Vw, 0);
  json_t *d = cn_model_describe(m);
  cr_assert(json_is_true(json_object_get(d, "lowercase")));
  json_decref(d);
  cn_model_free(m);
}

/* Rewrites weights.safetensors with element `at` of tensor `name` set to
 * v (every other tensor unchanged). */
static void poison(const char *name, int64_t at, float v) {
  cn_safetensors st;
  cn_err e;
  const char *p = in_dir("weights.safetensors");
  cr_assert_eq(cn_safetensors_open(p, &st, &e), 0, "%s", e.msg);
  cn_tensor_out t[CN_MAX_TENSORS];
  float *copy = NULL;
  for (int i = 0; i < st.n; i++) {
    const cn_tensor *s = &st.tensors[i];
    t[i] = (cn_tensor_out){s->name, s->ndim, {0}, s->data};
    memcpy(t[i].shape, s->shape, sizeof(s->shape));
    if (strcmp(s->name, name) == 0) {
      cr_assert(at < s->numel);
      copy = malloc((size_t)s->numel * sizeof(float));
      memcpy(copy, s->data, (size_t)s->numel * sizeof(float));
      copy[at] = v;
      t[i].data = copy;
    }
  }
  cr_assert_not_null(copy, "no tensor %s", name);
  cr_assert_eq(cn_safetensors_write(p, t, st.n, &e), 0, "%s", e.msg);
  cn_safetensors_close(&st);
  free(copy);
}

/* NaN or Inf weights used to load and give plausible answers. */
Test(model, nan_and_inf_weights_are_refused_naming_the_tensor) {
  init_model("treelstm", NULL, 8);
  poison("internal.U", 17, NAN);
  expect_load_fail(CN_E_BAD_MODEL, "tensor 'internal.U' holds NaN at "
                   "element 17", "weights.safetensors");
  init_model("bilstm-tagger", NULL, 8);
  poison("out.b", 0, -INFINITY);
  expect_load_fail(CN_E_BAD_MODEL, "tensor 'out.b' holds Inf at element 0",
                   NULL);
  /* a tensor the family does not use may hold anything */
  init_model("treelstm", NULL, 8);
  rewrite_weights(NULL, NULL, "unused.extra", 2, 2);
  poison("unused.extra", 3, NAN);
  cn_model *m;
  cn_err e;
  cr_assert_eq(cn_model_load(dir, &m, &e), 0, "%s", e.msg);
  cn_model_free(m);
}

/* A loaded model owns its weights: what happens to the file afterwards
 * (overwritten, truncated: with a shared mapping, SIGBUS) changes nothing.
 * Its SHA-256 is that of the file as loaded. */
Test(model, loaded_weights_are_immune_to_the_file) {
  init_model("treelstm", NULL, 8);
  cn_model *m;
  cn_err e;
  cr_assert_eq(cn_model_load(dir, &m, &e), 0, "%s", e.msg);
  const cn_tensor *t = cn_safetensors_find(&m->st, "leaf.W");
  float before[8];
  memcpy(before, t->data, sizeof(before));
  char sha[65];
  snprintf(sha, sizeof(sha), "%s", cn_model_weights_sha256(m));
  cr_assert_eq(strlen(sha), 64);
  char cmd[512], want[80] = {0};
  snprintf(cmd, sizeof(cmd), "sha256sum %s", in_dir("weights.safetensors"));
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  cr_assert_eq(fscanf(p, "%64s", want), 1);
  pclose(p);
  cr_expect_str_eq(sha, want);
  poison("leaf.W", 0, 42.0f);          /* other weights over the file */
  cr_assert_eq(truncate(in_dir("weights.safetensors"), 16), 0);
  cr_expect_eq(memcmp(before, t->data, sizeof(before)), 0);
  json_t *d = cn_model_describe(m);
  cr_expect_str_eq(json_string_value(json_object_get(d, "weights_sha256")),
                   want);
  json_decref(d);
  cn_model_free(m);
}

/* `model init --lexicon` reads the lexicon as the loader does: a FIFO
 * blocked the init for ever and /dev/zero grew a line for ever; both are
 * refused naming the file. A regular lexicon with CRLF lines still gives
 * its words (two characters or more) to the vocabulary. */
Test(model, init_lexicon_must_be_a_regular_file) {
  char lex[128], fifo[128], mdir[128];
  snprintf(lex, sizeof(lex), "%s/lex.txt", dir);
  snprintf(fifo, sizeof(fifo), "%s/lex.fifo", dir);
  FILE *f = fopen(lex, "w");
  cr_assert_not_null(f);
  fputs("zyxwv\r\nq\nuvwxyz", f); /* no newline at the end */
  fclose(f);
  cr_assert_eq(mkfifo(fifo, 0644), 0);
  const char *bad[] = {fifo, "/dev/zero"};
  for (int i = 0; i < 2; i++) {
    snprintf(mdir, sizeof(mdir), "%s/bad%d", dir, i);
    cn_model_init_opts o = {.family = "latticelstm", .dir = mdir,
                            .hidden = 8, .seed = 7, .lexicon = bad[i],
                            .vocab_from = data_file("lattices.jsonl")};
    cn_err e;
    cn_err_clear(&e);
    cr_expect_neq(cn_model_init(&o, &e), 0, "%s", bad[i]);
    cr_expect(strstr(e.msg, bad[i]) != NULL &&
                  strstr(e.msg, "not a regular file") != NULL,
              "%s: %s", bad[i], e.msg);
  }
  snprintf(mdir, sizeof(mdir), "%s/good", dir);
  cn_model_init_opts o = {.family = "latticelstm", .dir = mdir, .hidden = 8,
                          .seed = 7, .lexicon = lex,
                          .vocab_from = data_file("lattices.jsonl")};
  cn_err e;
  cn_err_clear(&e);
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
  cn_model *m = NULL;
  cr_assert_eq(cn_model_load(mdir, &m, &e), 0, "%s", e.msg);
  cr_expect_gt(cn_vocab_lookup(m->word_vocab, "zyxwv", 5, false), 0);
  cr_expect_gt(cn_vocab_lookup(m->word_vocab, "uvwxyz", 6, false), 0);
  cn_model_free(m);
}

/* ---- the daemon's warm-up instance (cn_model_warmup_instance) ----------*/
/* For every family, the synthetic instance parses under the default
 * limits, runs, gives finite outputs and adds a vertex of every one of
 * the family's types (treelstm-2type's internal_b, latticelstm's words
 * and links, lstm-nmt's decoder and projection): a worker that ran it has
 * touched every code path a real input of the model's kind touches. */
Test(model, warmup_instance_touches_every_vertex_type) {
  cn_backend_ctx *bk = NULL;
  cn_err e;
  cn_err_clear(&e);
  cr_assert_eq(cn_backend_open("cpu", 0, &bk, &e), 0, "%s", e.msg);
  cn_limits lim;
  cn_limits_default(&lim);
  for (int i = 0; i < cn__family_count(); i++) {
    const cn_family *f = cn__family_at(i);
    teardown();
    setup();
    init_model(f->name, data_for(f), 16);
    cn_model *m = NULL;
    cr_assert_eq(cn_model_load(dir, &m, &e), 0, "%s: %s", f->name, e.msg);
    json_t *j = cn_model_warmup_instance(m);
    cr_assert_not_null(j, "%s", f->name);
    cn_instance *in = NULL;
    cr_assert_eq(cn_instance_parse(m, j, &lim, 0, &in, &e), 0, "%s: %s",
                 f->name, e.msg);
    /* words from the model's vocabulary, not <unk>: real embedding rows */
    int known = 0;
    for (int k = 0; k < in->n; k++) known += in->ids[k] > 0;
    cr_assert_gt(known, 0, "%s: every token is <unk>", f->name);
    cn_run *r = cn_run_new(m, bk);
    unsigned flags = f->input == CN_INPUT_TREE ? CN_OUT_ALL : 0;
    cr_assert_eq(cn_run_add(r, in, flags, 8), 0, "%s", f->name);
    cr_assert_eq(cn_run_exec(r, CN_POLICY_AGENDA, &e), 0, "%s: %s", f->name,
                 e.msg);
    for (int t = 0; t < f->n_types; t++)
      cr_expect_gt(r->n_of_type[t], 0, "%s: no %s vertex", f->name,
                   f->type_names[t]);
    json_t *out = cn_run_output(r, 0);
    cr_expect_eq(cn_output_check(out, &e), 0, "%s: %s", f->name, e.msg);
    json_decref(out);
    cn_run_free(r);
    cn_instance_free(in);
    json_decref(j);
    cn_model_free(m);
  }
  cn_backend_close(bk);
}

/* ---- model: the files a model names stay inside its directory -----------
 * Issue #39: "tgt_vocab": "../../outside/secret.txt" served a secret's
 * lines as decoded tokens. Absolute paths, '..' past the directory and
 * symlinks that lead out are refused naming the key; a symlink or '..'
 * that stays inside is fine. */
static void init_in(const char *sub, const char *vocab_from, uint64_t seed) {
  cn_model_init_opts o = {.family = "treelstm", .dir = in_dir(sub),
                          .hidden = 8, .embed = 4, .seed = seed,
                          .vocab_from = vocab_from};
  cn_err e;
  cn_err_clear(&e);
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
}

static void set_key(const char *sub, const char *k, const char *v) {
  char p[300];
  snprintf(p, sizeof(p), "%s/%s/model.json", dir, sub);
  json_error_t je;
  json_t *j = json_load_file(p, 0, &je);
  cr_assert_not_null(j, "%s", je.text);
  json_object_set_new(j, k, json_string(v));
  cr_assert_eq(json_dump_file(j, p, JSON_INDENT(2)), 0);
  json_decref(j);
}

static int load_sub(const char *sub, cn_model **m, cn_err *e) {
  cn_err_clear(e);
  *m = NULL;
  return cn_model_load(in_dir(sub), m, e);
}

Test(model, paths_in_model_json_stay_inside_the_directory) {
  init_in("m", NULL, 7);
  cr_assert_eq(mkdir(in_dir("m/sub"), 0755), 0);
  /* a secret beside the model directory, shaped as a vocabulary */
  char secret[300];
  snprintf(secret, sizeof(secret), "%s/secret.txt", dir);
  cr_assert_eq(rename(in_dir("m/vocab.txt"), secret), 0);
  cn_model *m;
  cn_err e;
  static const struct {
    const char *value, *why;
  } bad[] = {{"../secret.txt", "climbs out"},
             {"sub/../../secret.txt", "climbs out"},
             {"/etc/hostname", "absolute path"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    set_key("m", "vocab", bad[i].value);
    cr_expect_eq(load_sub("m", &m, &e), CN_E_BAD_MODEL, "%s: %s",
                 bad[i].value, e.msg);
    cr_expect(strstr(e.msg, "key 'vocab'") != NULL, "%s", e.msg);
    cr_expect(strstr(e.msg, bad[i].why) != NULL, "%s", e.msg);
    cn_model_free(m);
  }
  /* a symlink inside that leads out (relative or absolute) */
  const char *links[] = {"../secret.txt", secret};
  for (int i = 0; i < 2; i++) {
    unlink(in_dir("m/v.txt"));
    cr_assert_eq(symlink(links[i], in_dir("m/v.txt")), 0);
    set_key("m", "vocab", "v.txt");
    cr_expect_eq(load_sub("m", &m, &e), CN_E_BAD_MODEL, "%s: %s", links[i],
                 e.msg);
    cr_expect(strstr(e.msg, "key 'vocab'") != NULL, "%s", e.msg);
    cr_expect(strstr(e.msg, "leads outside") != NULL, "%s", e.msg);
    cn_model_free(m);
  }
  /* inside: a plain relative path with '..' that stays in, and a symlink
   * to a file inside */
  char inside[300];
  snprintf(inside, sizeof(inside), "%s/m/sub/real.txt", dir);
  cr_assert_eq(rename(secret, inside), 0);
  set_key("m", "vocab", "sub/../sub/real.txt");
  cr_expect_eq(load_sub("m", &m, &e), 0, "%s", e.msg);
  cn_model_free(m);
  unlink(in_dir("m/v.txt"));
  cr_assert_eq(symlink("sub/real.txt", in_dir("m/v.txt")), 0);
  set_key("m", "vocab", "v.txt");
  cr_expect_eq(load_sub("m", &m, &e), 0, "%s", e.msg);
  cn_model_free(m);
  /* the weights too: a symlink out of the directory is refused */
  char wout[300];
  snprintf(wout, sizeof(wout), "%s/w.safetensors", dir);
  cr_assert_eq(rename(in_dir("m/weights.safetensors"), wout), 0);
  cr_assert_eq(symlink(wout, in_dir("m/weights.safetensors")), 0);
  cr_expect_eq(load_sub("m", &m, &e), CN_E_BAD_MODEL, "%s", e.msg);
  cr_expect(strstr(e.msg, "leads outside") != NULL, "%s", e.msg);
  cn_model_free(m);
}

/* ---- model: a load is of one directory, whole ----------------------------
 * Issue #39: model.json, the vocabulary and the weights were opened by path
 * one after the other, so a symlink flip during a load served B's version
 * with A's vocabulary. The directory is opened once now: whatever the
 * flips, each load is all A or all B. */
static atomic_int flipping;

static void *flipper(void *arg) {
  (void)arg;
  char tmp[300], link[300];
  snprintf(tmp, sizeof(tmp), "%s/cur.tmp", dir);
  snprintf(link, sizeof(link), "%s/cur", dir);
  for (int k = 0; atomic_load(&flipping); k++) {
    unlink(tmp);
    if (symlink(k % 2 ? "b" : "a", tmp) != 0 || rename(tmp, link) != 0)
      break;
  }
  return NULL;
}

Test(model, a_load_racing_a_symlink_flip_is_one_version_whole) {
  /* a: the data's vocabulary; b: the builtin one (another size) */
  init_in("a", data_file("trees-binary.jsonl"), 1);
  init_in("b", NULL, 2);
  set_key("a", "version", "A");
  set_key("b", "version", "B");
  cn_model *m;
  cn_err e;
  cr_assert_eq(load_sub("a", &m, &e), 0, "%s", e.msg);
  int va = cn_vocab_size(m->vocab);
  cn_model_free(m);
  cr_assert_eq(load_sub("b", &m, &e), 0, "%s", e.msg);
  int vb = cn_vocab_size(m->vocab);
  cn_model_free(m);
  cr_assert_neq(va, vb);
  cr_assert_eq(symlink("a", in_dir("cur")), 0);
  atomic_store(&flipping, 1);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, flipper, NULL), 0);
  int loads[2] = {0, 0};
  for (int i = 0; i < 400; i++) {
    int rc = load_sub("cur", &m, &e);
    cr_expect_eq(rc, 0, "load %d: a torn load: %s", i, e.msg);
    if (rc != 0) continue;
    const char *v = cn_model_named_version(m);
    bool is_a = strcmp(v, "A") == 0;
    loads[is_a ? 0 : 1]++;
    cr_expect_eq(cn_vocab_size(m->vocab), is_a ? va : vb,
                 "load %d: version %s with the other's vocabulary", i, v);
    cn_model_free(m);
  }
  atomic_store(&flipping, 0);
  pthread_join(t, NULL);
  cr_log_info("loads of a: %d, of b: %d", loads[0], loads[1]);
}
