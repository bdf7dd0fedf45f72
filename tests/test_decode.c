/* test_decode.c - decode sessions (core/run/run_decode.c): lstm-nmt
 * instances from the data join a session at different steps and leave it
 * when they finish; each output equals, bit for bit, the instance decoded
 * alone and decoded in one whole run. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine_util.h"
#include "internal.h"

static char dir[256];
static cn_model *M;
static json_t *DATA;

/* Writes `vals` over tensor `name` of the model in dir/m. */
static void patch(const char *name, const float *vals, int64_t numel) {
  const cn_tensor *t = cn_safetensors_find(&M->st, name);
  cr_assert_not_null(t);
  cr_assert_eq(t->numel, numel);
  char path[600];
  snprintf(path, sizeof(path), "%s/m/weights.safetensors", dir);
  long off = (long)((const char *)t->data - (const char *)M->st.bytes);
  FILE *f = fopen(path, "r+b");
  cr_assert_not_null(f);
  cr_assert_eq(fseek(f, off, SEEK_SET), 0);
  cr_assert_eq(fwrite(vals, sizeof(float), (size_t)numel, f),
               (size_t)numel);
  fclose(f);
}

static void scale_tensor(const char *name, float k) {
  const cn_tensor *w = cn_safetensors_find(&M->st, name);
  cr_assert_not_null(w);
  float *v = malloc((size_t)w->numel * sizeof(float));
  memcpy(v, w->data, (size_t)w->numel * sizeof(float));
  for (int64_t i = 0; i < w->numel; i++) v[i] *= k;
  patch(name, v, w->numel);
  free(v);
}

/* A random model's decoder settles on one token at once; with proj.W,
 * tgt_embed and dec.W_hh scaled up its output follows its state, and with
 * proj.b[</s>] raised instances stop after 4 to 50 steps (H 32). */
static void setup(int H, int n) {
  M = tu_model("lstm-nmt", H, H, "sequences.jsonl", dir, sizeof(dir));
  DATA = tu_data_lines("sequences.jsonl", n);
  scale_tensor("proj.W", 8.0f);
  scale_tensor("tgt_embed", 4.0f);
  scale_tensor("dec.W_hh", 4.0f);
  const cn_tensor *b = cn_safetensors_find(&M->st, "proj.b");
  cr_assert_not_null(b);
  float *v = malloc((size_t)b->numel * sizeof(float));
  memcpy(v, b->data, (size_t)b->numel * sizeof(float));
  v[2] += 1.0f; /* </s> */
  patch("proj.b", v, b->numel);
  free(v);
  cn_model_free(M);
  cn_err err;
  char mdir[300];
  snprintf(mdir, sizeof(mdir), "%s/m", dir);
  cr_assert_eq(cn_model_load(mdir, &M, &err), 0, "%s", err.msg);
}

static void teardown(void) {
  json_decref(DATA);
  cn_model_free(M);
  tu_rmdir(dir);
}

static int cap_of(int i) { return i % 5 == 3 ? 4 + i % 7 : 0; }

static cn_instance *parse(int i) {
  cn_instance *in = NULL;
  cn_err err;
  cr_assert_eq(cn_instance_parse(M, json_array_get(DATA, (size_t)i), NULL, i,
                                 &in, &err),
               0, "%s", err.msg);
  return in;
}

/* Instances [0, n) decoded in runs of `batch`, with their caps. */
static json_t *whole_runs(int n, int batch) {
  cn_backend_ctx *bk;
  cn_err err;
  cr_assert_eq(cn_backend_open("cpu", 0, &bk, &err), 0);
  json_t *outs = json_array();
  for (int s = 0; s < n; s += batch) {
    int e = s + batch < n ? s + batch : n;
    cn_run *r = cn_run_new(M, bk);
    cn_instance *in[512];
    for (int i = s; i < e; i++) {
      in[i - s] = parse(i);
      cr_assert_eq(cn_run_add(r, in[i - s], CN_OUT_HIDDEN, cap_of(i)), i - s);
    }
    cn_err_clear(&err);
    cr_assert_eq(cn_run_exec(r, CN_POLICY_AGENDA, &err), 0, "%s", err.msg);
    for (int i = s; i < e; i++)
      json_array_append_new(outs, cn_run_output(r, i - s));
    cn_run_free(r);
    for (int i = s; i < e; i++) cn_instance_free(in[i - s]);
  }
  cn_backend_close(bk);
  return outs;
}

typedef struct session_result {
  json_t *outs;       /* per instance, in input order */
  int joined_in_flight; /* added while others were decoding */
  int left_early;     /* done while others were still decoding */
  long long steps;
  cn_run_stats st;
} session_result;

/* Instance i joins when the session has run join_at(i) steps (instances
 * join in input order); finished instances are output as they finish. */
static session_result session(int n, int per_step, int every,
                              cn_policy_kind pol) {
  session_result res = {json_array(), 0, 0, 0, {0}};
  for (int i = 0; i < n; i++) json_array_append_new(res.outs, json_null());
  cn_backend_ctx *bk;
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_backend_open("cpu", 0, &bk, &err), 0);
  cn_decode *d = cn_decode_new(M, bk, pol, NULL);
  cr_assert_not_null(d);
  cn_instance **in = calloc((size_t)n, sizeof(*in));
  int *of_slot = calloc((size_t)n, sizeof(int));
  int next = 0, got = 0;
  long long step = 0;
  while (got < n) {
    /* every `every` steps, per_step more instances join */
    if (next < n && (step % every == 0 || cn_decode_active(d) == 0)) {
      for (int k = 0; k < per_step && next < n; k++, next++) {
        in[next] = parse(next);
        if (step > 0 && cn_decode_active(d) > 0) res.joined_in_flight++;
        int slot = cn_decode_add(d, in[next], CN_OUT_HIDDEN, cap_of(next));
        cr_assert_eq(slot, next, "slots are numbered in order");
        of_slot[slot] = next;
      }
    }
    int rc = cn_decode_step(d, &err);
    cr_assert_geq(rc, 0, "%s", err.msg);
    step++;
    int done[64], k;
    while ((k = cn_decode_take_done(d, done, 64)) > 0) {
      for (int i = 0; i < k; i++) {
        if (cn_decode_active(d) > 0) res.left_early++;
        json_t *o = cn_decode_output(d, done[i]);
        cr_assert_not_null(o);
        cr_assert_null(cn_decode_output(d, done[i]), "output once");
        json_array_set_new(res.outs, (size_t)of_slot[done[i]], o);
        cn_instance_free(in[of_slot[done[i]]]);
        in[of_slot[done[i]]] = NULL;
        got++;
      }
    }
    cr_assert(rc == 1 || cn_decode_active(d) == 0 || next < n);
  }
  cr_assert_eq(cn_decode_step(d, &err), 0, "nothing left to run");
  res.steps = cn_decode_batches(d);
  cn_decode_get_stats(d, &res.st);
  cn_decode_free(d);
  free(in);
  free(of_slot);
  cn_backend_close(bk);
  return res;
}

static void expect_equal(const json_t *a, const json_t *b, const char *what) {
  size_t n = json_array_size(a);
  cr_assert_eq(json_array_size(b), n);
  for (size_t i = 0; i < n; i++) {
    json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
    cr_expect(json_equal(x, y), "%s: instance %zu differs (max diff %g)",
              what, i, tu_json_maxdiff(x, y));
  }
}

static int lengths_vary(const json_t *outs, int *stopped_early) {
  int lo = 1 << 30, hi = 0;
  *stopped_early = 0;
  for (size_t i = 0; i < json_array_size(outs); i++) {
    int n = (int)json_array_size(
        json_object_get(json_array_get(outs, i), "output_ids"));
    if (n < lo) lo = n;
    if (n > hi) hi = n;
    if (cap_of((int)i) == 0 && n < 50) (*stopped_early)++;
  }
  return hi - lo;
}

/* 60 sentences joining three at a time every fifth step: equal to each
 * decoded alone and to one whole run of 60, for every frontier policy. */
Test(decode, joins_and_leaves_equal_alone_and_whole_run, .fini = teardown) {
  setup(32, 60);
  json_t *alone = whole_runs(60, 1);
  json_t *whole = whole_runs(60, 60);
  expect_equal(whole, alone, "whole run vs alone");
  int early;
  cr_assert_geq(lengths_vary(alone, &early), 10, "output lengths vary");
  cr_assert_geq(early, 5, "some instances emit </s> before the cap");
  cn_policy_kind pols[] = {CN_POLICY_AGENDA, CN_POLICY_SUFFICIENT,
                           CN_POLICY_LOOKAHEAD, CN_POLICY_LOOKAHEAD2,
                           CN_POLICY_FSM, CN_POLICY_NONE};
  for (size_t p = 0; p < sizeof(pols) / sizeof(pols[0]); p++) {
    session_result s = session(60, 3, 5, pols[p]);
    expect_equal(s.outs, alone, cn_policy_name(pols[p]));
    expect_equal(s.outs, whole, cn_policy_name(pols[p]));
    cr_expect_geq(s.joined_in_flight, 40, "%s: joined %d in flight",
                  cn_policy_name(pols[p]), s.joined_in_flight);
    cr_expect_geq(s.left_early, 30, "%s: %d left before the others",
                  cn_policy_name(pols[p]), s.left_early);
    json_decref(s.outs);
  }
  json_decref(alone);
  json_decref(whole);
}

/* One instance at a time, and all at once before the first step: the
 * extremes of joining are a run of one and a whole run. */
Test(decode, one_at_a_time_and_all_at_once, .fini = teardown) {
  setup(16, 40);
  json_t *alone = whole_runs(40, 1);
  session_result one = session(40, 1, 1 << 30, CN_POLICY_AGENDA);
  expect_equal(one.outs, alone, "one at a time");
  cr_expect_eq(one.joined_in_flight, 0);
  session_result all = session(40, 40, 1 << 30, CN_POLICY_AGENDA);
  expect_equal(all.outs, alone, "all at once");
  cr_expect_eq(all.joined_in_flight, 0);
  cr_expect_lt(all.steps, one.steps, "batching: fewer steps than alone");
  json_decref(one.outs);
  json_decref(all.outs);
  json_decref(alone);
}

/* All 400 sentences through one session, one joining every sixth step: the
 * state arena is compacted as instances leave (it ends far smaller than
 * every state the session computed) and outputs still equal whole runs. */
Test(decode, long_session_compacts_and_stays_equal, .fini = teardown) {
  setup(32, 400);
  json_t *whole = whole_runs(400, 64);
  session_result s = session(400, 1, 6, CN_POLICY_AGENDA);
  expect_equal(s.outs, whole, "long session");
  size_t all_states = (size_t)s.st.vertices * 2 * 32 * sizeof(float) / 2;
  cr_expect_lt(s.st.arena_bytes, all_states / 4,
               "arena %zu bytes for %lld vertices", s.st.arena_bytes,
               s.st.vertices);
  cr_expect_eq(s.st.instances, 400);
  json_decref(s.outs);
  json_decref(whole);
}

/* A model whose family does not decode is not a session's: the server
 * sends those through whole runs. */
Test(decode, which_models_decode) {
  char d2[256];
  cn_model *t = tu_model("treelstm", 8, 8, "trees-binary.jsonl", d2,
                         sizeof(d2));
  cr_expect_eq(cn_model_decodes(t), 0);
  cn_model_free(t);
  tu_rmdir(d2);
  cn_model *n = tu_model("lstm-nmt", 8, 8, "sequences.jsonl", d2, sizeof(d2));
  cr_expect_neq(cn_model_decodes(n), 0);
  cn_model_free(n);
  tu_rmdir(d2);
}
