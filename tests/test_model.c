/* test_model.c - model loading and cn_model_init (vocabularies:
 * test_vocab.c; the files a model reads: test_model_files.c).
 *
 * Every registered family must survive init -> load; every way a model
 * directory can be wrong must be refused whole, with a message naming the
 * file and the key or tensor to fix. */
#include <criterion/criterion.h>
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
#include "engine_util.h"
#include "model_test_util.h"

TestSuite(model, .init = tmp_dir_setup, .fini = tmp_dir_teardown);

/* ---- model: helpers -----------------------------------------------------*/
static void init_model(const char *family, const char *vocab_from, int h) {
  cn_model_init_opts o = {.family = family, .dir = tmp_dir, .hidden = h,
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
  int rc = cn_model_load(tmp_dir, &m, &e);
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
  tu_rewrite_weights(in_dir("weights.safetensors"), drop, reshape, add, r, c);
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

/* Family f's model at H = 16 with its vocabulary from f's data, made in a
 * fresh tmp_dir and loaded: what the every-family tests start from. */
static cn_model *fresh_from_data(const cn_family *f) {
  tmp_dir_teardown();
  tmp_dir_setup();
  init_model(f->name, data_for(f), 16);
  cn_model *m = NULL;
  cn_err e;
  cr_assert_eq(cn_model_load(tmp_dir, &m, &e), 0, "%s: %s", f->name, e.msg);
  return m;
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
    cn_model *m = fresh_from_data(f);
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
    tmp_dir_teardown();
    tmp_dir_setup();
    init_model(f->name, NULL, 0);
    cn_model *m = NULL;
    cn_err e;
    cr_assert_eq(cn_model_load(tmp_dir, &m, &e), 0, "%s: %s", f->name, e.msg);
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
  cn_model_init_opts o = {.family = "treelstm", .dir = tmp_dir, .hidden = 8,
                          .embed = 4, .classes = 2, .seed = 3};
  cn_err e;
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
  cn_model *a, *b;
  cr_assert_eq(cn_model_load(tmp_dir, &a, &e), 0, "%s", e.msg);
  cr_assert_eq(a->dims.C, 2);
  cr_assert_str_eq(a->labels[1], "positive");
  o.seed = 4;
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
  cr_assert_eq(cn_model_load(tmp_dir, &b, &e), 0, "%s", e.msg);
  cr_assert_neq(memcmp(a->w[1]->data, b->w[1]->data, 4 * sizeof(float)), 0);
  cn_model_free(b);
  o.seed = 3;
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
  cr_assert_eq(cn_model_load(tmp_dir, &b, &e), 0, "%s", e.msg);
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
  cn_model_init_opts o = {.family = "transformer", .dir = tmp_dir};
  cn_err e;
  cr_assert_neq(cn_model_init(&o, &e), 0);
  cr_assert_not_null(strstr(e.msg, "transformer"), "%s", e.msg);
  cr_assert_not_null(strstr(e.msg, "treelstm"), "%s", e.msg);
  cr_assert_eq(access(in_dir("model.json"), F_OK), -1);
  o = (cn_model_init_opts){.family = "mvrnn", .dir = tmp_dir, .hidden = 8,
                           .embed = 4};
  cr_assert_neq(cn_model_init(&o, &e), 0);
  cr_assert_not_null(strstr(e.msg, "embed"), "%s", e.msg);
  o = (cn_model_init_opts){.family = "treegru", .dir = tmp_dir, .hidden = -3};
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

/* A misspelt key would load without what it meant to set: refused, with
 * the nearest key (one edit; two for keys of six letters or more), or the
 * list of keys when none is near. What `canopy model init` writes (seed
 * included) loads: every other test here loads it. */
Test(model, unknown_key_is_refused_with_did_you_mean) {
  init_model("treelstm", NULL, 8);
  json_t *j = read_json();
  json_t *labels = json_incref(json_object_get(j, "labels"));
  json_object_del(j, "labels");
  json_object_set_new(j, "lables", labels);
  write_json(j);
  expect_load_fail(CN_E_BAD_MODEL, "unknown key 'lables'; did you mean "
                   "'labels'?", "model.json");
  j = read_json();
  json_object_del(j, "lables");
  json_object_set_new(j, "lowercse", json_true());
  write_json(j);
  expect_load_fail(CN_E_BAD_MODEL, "did you mean 'lowercase'?", NULL);
  j = read_json();
  json_object_del(j, "lowercse");
  json_object_set_new(j, "colour", json_string("green"));
  write_json(j);
  expect_load_fail(CN_E_BAD_MODEL, "unknown key 'colour'; the keys are "
                   "family, hidden", "max_decode_len, version, cells, seed");
  j = read_json();
  json_object_del(j, "colour");
  json_object_set_new(j, "version", json_string("v7"));
  write_json(j);
  cn_model *m;
  cn_err e;
  cr_assert_eq(cn_model_load(tmp_dir, &m, &e), 0, "%s", e.msg);
  cr_assert_str_eq(cn_model_named_version(m), "v7");
  cn_model_free(m);
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
  cr_assert_eq(cn_model_load(tmp_dir, &m, &e), 0, "%s", e.msg);
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
  cr_assert_eq(cn_model_load(tmp_dir, &m, &e0), CN_E_IO);
  cr_assert(strstr(e0.msg, "lexicon.txt") != NULL, "%s", e0.msg);
  put("lexicon.txt", "the\nfilm\n");
  cn_err e;
  cr_assert_eq(cn_model_load(tmp_dir, &m, &e), 0, "%s", e.msg);
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
  cr_assert_eq(cn_model_load(tmp_dir, &m, &e), 0, "%s", e.msg);
  cn_model_free(m);
}

/* A loaded model owns its weights: what happens to the file afterwards
 * (overwritten, truncated: with a shared mapping, SIGBUS) changes nothing.
 * Its SHA-256 is that of the file as loaded. */
Test(model, loaded_weights_are_immune_to_the_file) {
  init_model("treelstm", NULL, 8);
  cn_model *m;
  cn_err e;
  cr_assert_eq(cn_model_load(tmp_dir, &m, &e), 0, "%s", e.msg);
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
  snprintf(lex, sizeof(lex), "%s/lex.txt", tmp_dir);
  snprintf(fifo, sizeof(fifo), "%s/lex.fifo", tmp_dir);
  FILE *f = fopen(lex, "w");
  cr_assert_not_null(f);
  fputs("zyxwv\r\nq\nuvwxyz", f); /* no newline at the end */
  fclose(f);
  cr_assert_eq(mkfifo(fifo, 0644), 0);
  const char *bad[] = {fifo, "/dev/zero"};
  for (int i = 0; i < 2; i++) {
    snprintf(mdir, sizeof(mdir), "%s/bad%d", tmp_dir, i);
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
  snprintf(mdir, sizeof(mdir), "%s/good", tmp_dir);
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
  cn_backend_ctx *bk = tu_cpu();
  cn_err e;
  cn_err_clear(&e);
  cn_limits lim;
  cn_limits_default(&lim);
  for (int i = 0; i < cn__family_count(); i++) {
    const cn_family *f = cn__family_at(i);
    cn_model *m = fresh_from_data(f);
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
