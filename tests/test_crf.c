/* test_crf.c - the linear-chain CRF of bilstm-tagger (docs/models.md "crf").
 *
 * The Viterbi decoder against brute force over all C^n tag paths (exact
 * dyadic scores, where ties are common and the tie rule decides, and
 * continuous ones); many instances decoded together against each alone;
 * the engine's runs of many sentences against runs of one; and the
 * model.json / weights errors. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_util.h"
#include "families/families.h"
#include "internal.h"

static uint64_t rng = 12345;

static int uniform_int(int lo, int hi) { /* [lo, hi] */
  return lo + (int)(cn__splitmix64(&rng) % (uint64_t)(hi - lo + 1));
}

/* Exact: multiples of 1/4 in [-2, 2], so every sum is exact in float and
 * double and equal scores are real ties. Else U(-2, 2). */
static float draw(bool exact) {
  if (exact) return (float)uniform_int(-8, 8) / 4.0f;
  return -2.0f + 4.0f * (float)(cn__splitmix64(&rng) >> 40) / 16777216.0f;
}

typedef struct problem {
  int C;
  float trans[25], start[5], end[5];
} problem;

static double score_of(const problem *p, const float *e, int n,
                       const int *y) {
  double s = (double)p->start[y[0]] + (double)p->end[y[n - 1]];
  for (int t = 0; t < n; t++) {
    s += (double)e[t * p->C + y[t]];
    if (t > 0) s += (double)p->trans[y[t - 1] * p->C + y[t]];
  }
  return s;
}

/* Every path y (an n-digit base-C counter); the best score wins, and among
 * equal scores the path the tie rule picks: the lowest last tag, then the
 * lowest tag before it, and so on (reading the path from the end).
 * *n_best gets how many paths share the best score. */
static double brute_force(const problem *p, const float *e, int n,
                          int *best, int *n_best) {
  int y[6] = {0};
  double bs = -INFINITY;
  *n_best = 0;
  for (;;) {
    double s = score_of(p, e, n, y);
    bool better = s > bs;
    if (s == bs) {
      (*n_best)++;
      for (int t = n - 1; t >= 0; t--)
        if (y[t] != best[t]) {
          better = y[t] < best[t];
          break;
        }
    }
    if (s > bs) *n_best = 1;
    if (better) {
      bs = s;
      memcpy(best, y, sizeof(int) * (size_t)n);
    }
    int t = 0;
    while (t < n && ++y[t] == p->C) y[t++] = 0;
    if (t == n) break;
  }
  return bs;
}

enum { PER_ROUND = 40, MAXN = 6 };

/* One round: a random problem with C tags and PER_ROUND sentences of 1..6
 * tokens (one of 0 tokens), decoded in one call. */
static void decode_round(problem *p, bool exact, int32_t *len,
                         float *e, const float **rows, int32_t *tags,
                         float *scores) {
  p->C = uniform_int(2, 5);
  for (int i = 0; i < p->C * p->C; i++) p->trans[i] = draw(exact);
  for (int i = 0; i < p->C; i++) p->start[i] = draw(exact);
  for (int i = 0; i < p->C; i++) p->end[i] = draw(exact);
  int64_t k = 0;
  for (int i = 0; i < PER_ROUND; i++) {
    len[i] = i == PER_ROUND / 2 ? 0 : uniform_int(1, MAXN);
    for (int t = 0; t < len[i]; t++, k++) {
      rows[k] = e + k * p->C;
      for (int j = 0; j < p->C; j++) e[k * p->C + j] = draw(exact);
    }
  }
  cr_assert_eq(cn__crf_viterbi(p->C, p->trans, p->start, p->end, PER_ROUND,
                               len, rows, tags, scores), 0);
}

static void against_brute_force(bool exact) {
  static float e[PER_ROUND * MAXN * 5];
  static const float *rows[PER_ROUND * MAXN];
  static int32_t tags[PER_ROUND * MAXN];
  int32_t len[PER_ROUND];
  float scores[PER_ROUND];
  int cases = 0, ties = 0, near = 0;
  for (int round = 0; round < 60; round++) {
    problem p;
    decode_round(&p, exact, len, e, rows, tags, scores);
    int64_t first = 0;
    for (int i = 0; i < PER_ROUND; first += len[i], i++) {
      if (len[i] == 0) {
        cr_expect_eq(scores[i], 0.0f);
        continue;
      }
      int best[MAXN], n_best, y[MAXN];
      const float *ei = e + first * p.C;
      double bs = brute_force(&p, ei, len[i], best, &n_best);
      bool same = true;
      for (int t = 0; t < len[i]; t++) {
        y[t] = tags[first + t];
        cr_assert(y[t] >= 0 && y[t] < p.C);
        same = same && y[t] == best[t];
      }
      cases++;
      ties += n_best > 1;
      /* Its score is its path's, re-summed (double, then float). */
      cr_expect_eq(scores[i], (float)score_of(&p, ei, len[i], y),
                   "round %d instance %d", round, i);
      cr_expect(fabs((double)scores[i] - bs) <= 1e-4,
                "round %d instance %d: score %g, brute force %g", round, i,
                (double)scores[i], bs);
      if (!same && !exact && bs - score_of(&p, ei, len[i], y) < 1e-5) {
        near++; /* float32 DP vs double on a near tie: either may win */
        continue;
      }
      cr_expect(same, "round %d instance %d (C=%d, n=%d, %s): path differs "
                "from brute force (first tags %d %d, want %d %d; %d optimal)",
                round, i, p.C, len[i], exact ? "exact" : "continuous", y[0],
                len[i] > 1 ? y[1] : -1, best[0], len[i] > 1 ? best[1] : -1,
                n_best);
    }
  }
  cr_assert_gt(cases, 2000);
  /* Exact scores make many optimal paths share the best score, so the tie
   * rule is what the comparison checks there. */
  if (exact) cr_expect_gt(ties, 100, "only %d ties", ties);
  cr_expect_leq(near, cases / 100, "%d near ties", near);
}

Test(crf, viterbi_matches_brute_force_exact_ties) { against_brute_force(true); }

Test(crf, viterbi_matches_brute_force_continuous) {
  against_brute_force(false);
}

/* Decoding many sentences together (live rows shrinking as the shorter
 * ones end) gives each exactly what decoding it alone gives. */
Test(crf, batched_equals_one_at_a_time) {
  static float e[PER_ROUND * MAXN * 5];
  static const float *rows[PER_ROUND * MAXN];
  static int32_t tags[PER_ROUND * MAXN], one[MAXN];
  int32_t len[PER_ROUND];
  float scores[PER_ROUND], s1;
  for (int round = 0; round < 20; round++) {
    problem p;
    decode_round(&p, round % 2 == 0, len, e, rows, tags, scores);
    int64_t first = 0;
    for (int i = 0; i < PER_ROUND; first += len[i], i++) {
      cr_assert_eq(cn__crf_viterbi(p.C, p.trans, p.start, p.end, 1, &len[i],
                                   rows + first, one, &s1), 0);
      cr_expect_eq(memcmp(&s1, &scores[i], sizeof(float)), 0);
      for (int t = 0; t < len[i]; t++) cr_expect_eq(one[t], tags[first + t]);
    }
  }
}

/* ---- through the engine -------------------------------------------------*/
static char dir[256];

static cn_model *crf_model(const char *family, bool crf, int H) {
  snprintf(dir, sizeof(dir), "/tmp/canopy-crf-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  char data[512], mdir[300];
  snprintf(data, sizeof(data), "%s/sequences.jsonl", getenv("CANOPY_DATA"));
  snprintf(mdir, sizeof(mdir), "%s/m", dir);
  cn_model_init_opts o = {.family = family, .dir = mdir, .hidden = H,
                          .embed = H, .classes = 5,
                          .vocab_from = strcmp(family, "bilstm-tagger") == 0
                                            ? data : NULL,
                          .seed = 7, .crf = crf};
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_model_init(&o, &err), 0, "init: %s", err.msg);
  cn_model *m = NULL;
  cr_assert_eq(cn_model_load(mdir, &m, &err), 0, "load: %s", err.msg);
  return m;
}

static void cleanup(void) { tu_rmdir(dir); }

/* An output's logits, back to floats (JSON carries them exactly). */
static int json_rows(const json_t *o, int C, float *e, const float **rows) {
  json_t *lg = json_object_get(o, "logits");
  int n = (int)json_array_size(lg);
  for (int t = 0; t < n; t++) {
    rows[t] = e + t * C;
    for (int j = 0; j < C; j++)
      e[t * C + j] = (float)json_number_value(
          json_array_get(json_array_get(lg, (size_t)t), (size_t)j));
  }
  return n;
}

Test(crf, engine_runs_of_many_equal_runs_of_one, .fini = cleanup) {
  cn_model *m = crf_model("bilstm-tagger", true, 24);
  json_t *in = tu_data_lines("sequences.jsonl", 200);
  json_t *one = tu_run(m, in, CN_POLICY_NONE, 1, 0, NULL, NULL);
  json_t *many = tu_run(m, in, CN_POLICY_AGENDA, 64, 0, NULL, NULL);
  cr_assert_eq(json_array_size(many), json_array_size(in));
  int C = (int)m->dims.C, moved = 0;
  const float *tr = cn_safetensors_find(&m->st, "crf.trans")->data;
  const float *st = cn_safetensors_find(&m->st, "crf.start")->data;
  const float *en = cn_safetensors_find(&m->st, "crf.end")->data;
  static float e[4096 * 5];
  static const float *rows[4096];
  static int32_t tags[4096];
  for (size_t i = 0; i < json_array_size(in); i++) {
    json_t *a = json_array_get(one, i), *b = json_array_get(many, i);
    cr_assert(json_is_real(json_object_get(b, "path_score")), "instance %zu",
              i);
    /* The tags exactly; the numbers to the engine's batched-vs-alone
     * tolerance (emissions come from differently shaped GEMMs). */
    cr_expect(json_equal(json_object_get(a, "tags"), json_object_get(b, "tags")),
              "instance %zu: tags differ between --batch 1 and 64", i);
    cr_expect_leq(tu_json_maxdiff(a, b), 1e-5, "instance %zu", i);
    /* Given the run's own emissions, decoding this sentence alone gives
     * bit for bit what the run's joint decode reported. */
    int32_t n = json_rows(b, C, e, rows);
    cr_assert_leq(n, 4096);
    float s;
    cr_assert_eq(cn__crf_viterbi(C, tr, st, en, 1, &n, rows, tags, &s), 0);
    cr_expect_eq((float)json_real_value(json_object_get(b, "path_score")), s,
                 "instance %zu", i);
    json_t *bt = json_object_get(b, "tags");
    json_t *names = json_object_get(b, "tag_names");
    for (int t = 0; t < n; t++) {
      int y = (int)json_integer_value(json_array_get(bt, (size_t)t));
      cr_expect_eq(y, tags[t], "instance %zu token %d", i, t);
      cr_expect_str_eq(json_string_value(json_array_get(names, (size_t)t)),
                       m->labels[y]);
      moved += y != cn__argmax(rows[t], C);
    }
  }
  /* The transitions matter on this model: some tags are not the argmax. */
  cr_expect_gt(moved, 0);
  json_decref(one);
  json_decref(many);
  json_decref(in);
  cn_model_free(m);
}

/* Without "crf" nothing changes: per-token argmax, no path_score. */
Test(crf, without_crf_tags_are_argmax, .fini = cleanup) {
  cn_model *m = crf_model("bilstm-tagger", false, 8);
  json_t *in = tu_data_lines("sequences.jsonl", 20);
  json_t *out = tu_run(m, in, CN_POLICY_AGENDA, 64, 0, NULL, NULL);
  static float e[4096 * 5];
  static const float *rows[4096];
  for (size_t i = 0; i < json_array_size(in); i++) {
    json_t *o = json_array_get(out, i);
    cr_expect_null(json_object_get(o, "path_score"));
    int n = json_rows(o, 5, e, rows);
    for (int t = 0; t < n; t++)
      cr_expect_eq(json_integer_value(json_array_get(json_object_get(o, "tags"),
                                                     (size_t)t)),
                   cn__argmax(rows[t], 5));
  }
  json_decref(out);
  json_decref(in);
  cn_model_free(m);
}

/* ---- model.json, weights and init ---------------------------------------*/
static void expect_load_fail(const char *s1, const char *s2) {
  char mdir[300];
  snprintf(mdir, sizeof(mdir), "%s/m", dir);
  cn_model *m = (cn_model *)1;
  cn_err e;
  cn_err_clear(&e);
  int rc = cn_model_load(mdir, &m, &e);
  cr_assert_eq(rc, CN_E_BAD_MODEL, "rc %d: %s", rc, e.msg);
  cr_assert_null(m);
  cr_assert_not_null(strstr(e.msg, s1), "no '%s' in: %s", s1, e.msg);
  cr_assert_not_null(strstr(e.msg, s2), "no '%s' in: %s", s2, e.msg);
}

static void set_key(const char *k, json_t *v) {
  char p[320];
  snprintf(p, sizeof(p), "%s/m/model.json", dir);
  json_error_t je;
  json_t *j = json_load_file(p, 0, &je);
  cr_assert_not_null(j, "%s", je.text);
  json_object_set_new(j, k, v);
  cr_assert_eq(json_dump_file(j, p, JSON_INDENT(2)), 0);
  json_decref(j);
}

/* Rewrites the weights without tensor drop, or with reshape given [r, c]. */
static void rewrite(const char *drop, const char *reshape, int64_t r,
                    int64_t c) {
  char p[320];
  snprintf(p, sizeof(p), "%s/m/weights.safetensors", dir);
  tu_rewrite_weights(p, drop, reshape, NULL, r, c);
}

Test(crf, key_on_a_tree_family_is_a_load_error, .fini = cleanup) {
  cn_model_free(crf_model("treelstm", false, 8));
  set_key("crf", json_true());
  expect_load_fail("'crf'", "model.json");
  set_key("crf", json_false());
  expect_load_fail("'crf'", "model.json");
}

Test(crf, key_must_be_boolean, .fini = cleanup) {
  cn_model_free(crf_model("bilstm-tagger", true, 8));
  set_key("crf", json_string("yes"));
  expect_load_fail("'crf'", "model.json");
  set_key("crf", json_integer(1));
  expect_load_fail("'crf'", "model.json");
}

Test(crf, missing_trans_is_a_load_error, .fini = cleanup) {
  cn_model_free(crf_model("bilstm-tagger", true, 8));
  rewrite("crf.trans", NULL, 0, 0);
  expect_load_fail("tensor 'crf.trans' is missing", "weights.safetensors");
}

Test(crf, misshapen_trans_is_a_load_error, .fini = cleanup) {
  cn_model_free(crf_model("bilstm-tagger", true, 8)); /* C = 5 */
  rewrite(NULL, "crf.trans", 5, 6);
  expect_load_fail("tensor 'crf.trans' has shape [5, 6], expected [5, 5]",
                   "C=5");
}

/* A crf model with the key turned off is a plain tagger (extra tensors
 * are fine), and one with "crf": true but a plain model's weights lacks
 * the CRF tensors. */
Test(crf, key_decides_which_tensors_bind, .fini = cleanup) {
  cn_model *m = crf_model("bilstm-tagger", true, 8);
  cr_assert(m->dims.crf);
  cr_assert_eq(m->n_tensors, 14);
  json_t *d = cn_model_describe(m);
  cr_expect(json_is_true(json_object_get(d, "crf")));
  json_decref(d);
  cn_model_free(m);
  set_key("crf", json_false());
  char mdir[300];
  snprintf(mdir, sizeof(mdir), "%s/m", dir);
  cn_err e;
  cr_assert_eq(cn_model_load(mdir, &m, &e), 0, "%s", e.msg);
  cr_expect_not(m->dims.crf);
  cr_expect_eq(m->n_tensors, 11);
  cn_model_free(m);
  tu_rmdir(dir);
  cn_model_free(crf_model("bilstm-tagger", false, 8));
  set_key("crf", json_true());
  expect_load_fail("tensor 'crf.start' is missing", "weights.safetensors");
}

Test(crf, init_is_seeded_and_bilstm_only, .fini = cleanup) {
  cn_model *a = crf_model("bilstm-tagger", true, 8);
  char keep[256];
  strcpy(keep, dir);
  cn_model *b = crf_model("bilstm-tagger", true, 8);
  for (int i = 0; i < a->n_tensors; i++)
    cr_expect_arr_eq(a->w[i]->data, b->w[i]->data,
                     (size_t)a->w[i]->numel * sizeof(float), "%s",
                     a->w[i]->name);
  const cn_tensor *t = cn_safetensors_find(&a->st, "crf.trans");
  float mx = 0;
  for (int64_t k = 0; k < t->numel; k++) mx = fmaxf(mx, fabsf(t->data[k]));
  cr_expect(mx > 0.03f && mx <= 0.1f, "crf.trans max %g", mx);
  cn_model_free(a);
  cn_model_free(b);
  tu_rmdir(keep);
  char mdir[300];
  snprintf(mdir, sizeof(mdir), "%s/x", dir);
  cn_model_init_opts o = {.family = "treegru", .dir = mdir, .crf = 1};
  cn_err e;
  cr_assert_eq(cn_model_init(&o, &e), CN_E_BAD_CONFIG);
  cr_expect_not_null(strstr(e.msg, "--crf"), "%s", e.msg);
}
