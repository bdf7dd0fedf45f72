/* test_engine.c - every batched path against the unbatched reference:
 * for each tree family, every policy and several run sizes give the
 * outputs of policy `none` (one vertex at a time) to 1e-5, on real parse
 * trees; batch counts never go below the lower bound. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "engine_util.h"
#include "internal.h"

ParameterizedTestParameters(engine, batched_equals_none) {
  return cr_make_param_array(tu_family, tu_families, tu_n_families);
}

ParameterizedTest(tu_family *c, engine, batched_equals_none, .timeout = 120) {
  char dir[256];
  int H = strcmp(c->family, "mvrnn") == 0 ? 16 : 24;
  cn_model *m = tu_model(c->family, H, H, c->data, dir, sizeof(dir));
  json_t *in = tu_data_lines(c->data, 96);
  unsigned flags = CN_OUT_ALL | CN_OUT_HIDDEN;
  long long nb, lb;
  json_t *ref = tu_run(m, in, CN_POLICY_NONE, 1, flags, &nb, &lb);
  cr_assert_eq(json_array_size(ref), json_array_size(in));
  /* none launches one batch per vertex: never below the bound. */
  cr_assert_geq(nb, lb);
  const int sizes[] = {1, 7, 64, 200};
  for (int p = CN_POLICY_NONE; p < CN_POLICY__COUNT; p++) {
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
      json_t *got = tu_run(m, in, (cn_policy_kind)p, sizes[s], flags, &nb, &lb);
      double d = tu_json_maxdiff(ref, got);
      cr_expect_leq(d, 1e-5, "%s policy %s batch %d: max diff %g", c->family,
                    cn_policy_name((cn_policy_kind)p), sizes[s], d);
      cr_expect_geq(nb, lb, "%s: %lld batches under the bound %lld",
                    c->family, nb, lb);
      json_decref(got);
    }
  }
  /* outputs=root, no hidden: the same object less "nodes" and "h". */
  json_t *root = tu_run(m, in, CN_POLICY_AGENDA, 64, 0, NULL, NULL);
  for (size_t i = 0; i < json_array_size(in); i++) {
    json_t *want = json_deep_copy(json_array_get(ref, i));
    json_object_del(want, "nodes");
    json_object_del(want, "h");
    double d = tu_json_maxdiff(want, json_array_get(root, i));
    cr_expect_leq(d, 1e-5, "%s instance %zu: root-only differs by %g",
                  c->family, i, d);
    json_decref(want);
  }
  json_decref(root);
  json_decref(ref);
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* The agenda policy batches a binary tree run with outputs=root in
 * exactly the bound: leaves, one batch per internal level, outputs. */
Test(engine, agenda_meets_bound_on_roots) {
  char dir[256];
  cn_model *m = tu_model("treelstm", 8, 8, "trees-binary.jsonl", dir,
                         sizeof(dir));
  json_t *in = tu_data_lines("trees-binary.jsonl", 64);
  long long nb, lb;
  json_t *out = tu_run(m, in, CN_POLICY_AGENDA, 64, 0, &nb, &lb);
  cr_expect_eq(nb, lb, "agenda %lld batches, bound %lld", nb, lb);
  json_decref(out);
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* A bad instance among good ones is reported in place and changes nothing
 * for the others. */
Test(engine, bad_instance_isolated) {
  char dir[256];
  cn_model *m = tu_model("treelstm", 8, 8, "trees-binary.jsonl", dir,
                         sizeof(dir));
  json_t *good = tu_data_lines("trees-binary.jsonl", 4);
  json_t *mixed = json_deep_copy(good);
  json_array_insert_new(mixed, 2, json_pack("{s:s}", "tree", "(S (A a"));
  json_array_insert_new(mixed, 0,
                        json_pack("{s:s}", "tree", "(S (A a) (B b) (C c))"));
  json_t *a = tu_run(m, good, CN_POLICY_AGENDA, 64, 0, NULL, NULL);
  json_t *b = tu_run(m, mixed, CN_POLICY_AGENDA, 64, 0, NULL, NULL);
  cr_assert_eq(json_array_size(b), 6);
  json_t *e0 = json_object_get(json_array_get(b, 0), "error");
  cr_assert_not_null(e0);
  cr_expect_str_eq(json_string_value(json_object_get(e0, "code")),
                   "too_many_children");
  cr_expect_eq(json_integer_value(json_object_get(e0, "node")), 0);
  json_t *e3 = json_object_get(json_array_get(b, 3), "error");
  cr_assert_not_null(e3);
  cr_expect_str_eq(json_string_value(json_object_get(e3, "code")), "bad_tree");
  cr_expect_eq(json_integer_value(json_object_get(e3, "instance")), 3);
  const size_t map[] = {1, 2, 4, 5};
  for (size_t i = 0; i < 4; i++)
    cr_expect_leq(tu_json_maxdiff(json_array_get(a, i),
                                  json_array_get(b, map[i])),
                  1e-6);
  json_decref(a);
  json_decref(b);
  json_decref(good);
  json_decref(mixed);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* The cpu backend keeps freed blocks for the next run (cpu.c cpu_alloc):
 * a freed block comes back for a request it fits, live blocks never
 * overlap, every block is 64-byte aligned and writable to its end, and a
 * block too big for the cache is simply freed. */
Test(engine, cpu_blocks_reused_never_shared) {
  cn_backend_ctx *bk = tu_cpu();
  size_t sizes[] = {4 << 20, 1000, 4 << 20, 64, 3 << 20, (size_t)300 << 20};
  enum { N = sizeof(sizes) / sizeof(sizes[0]) };
  char *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = bk->vt->alloc(bk, sizes[i]);
    cr_assert_not_null(p[i]);
    cr_expect_eq((uintptr_t)p[i] % 64, 0);
    memset(p[i], i + 1, sizes[i]);
  }
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      if (i != j)
        cr_expect(p[i] + sizes[i] <= p[j] || p[j] + sizes[j] <= p[i],
                  "blocks %d and %d overlap", i, j);
  for (int i = 0; i < N; i++)
    cr_expect(p[i][0] == i + 1 && p[i][sizes[i] - 1] == i + 1,
              "block %d was written by another", i);
  char *a = p[0];
  bk->vt->free(bk, p[0]);
  char *b = bk->vt->alloc(bk, 3 << 20); /* fits the freed 4 MB block */
  cr_expect_eq(b, a, "a freed block that fits is handed out again");
  char *c = bk->vt->alloc(bk, 5 << 20); /* fits none: a new one */
  cr_expect(c + (5 << 20) <= b || b + (4 << 20) <= c);
  memset(c, 7, 5 << 20);
  bk->vt->free(bk, b);
  bk->vt->free(bk, c);
  for (int i = 1; i < N; i++) bk->vt->free(bk, p[i]); /* 300 MB: not kept */
  cn_backend_close(bk);
}

/* Runs insts[s, e) on r (fresh or reset), the outputs as one JSON text
 * and the run's stats. */
static char *run_span(cn_run *r, const cn_model *m, const json_t *insts,
                      size_t s, size_t e, cn_run_stats *st) {
  cn_err err;
  cn_instance **in = calloc(e - s, sizeof(*in));
  json_t *outs = json_array();
  int *slot = calloc(e - s, sizeof(int));
  for (size_t i = s; i < e; i++) {
    cn_err_clear(&err);
    cr_assert_eq(cn_instance_parse(m, json_array_get(insts, i), NULL, (int)i,
                                   &in[i - s], &err), 0, "%s", err.msg);
    slot[i - s] = cn_run_add(r, in[i - s], CN_OUT_ALL | CN_OUT_HIDDEN, 0);
    cr_assert_geq(slot[i - s], 0);
  }
  cn_err_clear(&err);
  cr_assert_eq(cn_run_exec(r, CN_POLICY_AGENDA, &err), 0, "%s", err.msg);
  cn_run_get_stats(r, st);
  for (size_t i = s; i < e; i++)
    json_array_append_new(outs, cn_run_output(r, slot[i - s]));
  char *text = json_dumps(outs, JSON_COMPACT | JSON_REAL_PRECISION(9));
  json_decref(outs);
  for (size_t i = 0; i < e - s; i++) cn_instance_free(in[i]);
  free(in);
  free(slot);
  return text;
}

/* A run reset (cn_run_reset) and reused, across every family's model and
 * across run sizes, large before small so that a kept array holds an
 * earlier run's entries past the new run's end, answers byte for byte as
 * a fresh run does, with the same statistics: the same arena, batches and
 * state peak (nothing of the earlier run counted in). */
Test(engine, reset_run_equals_fresh, .timeout = 240) {
  cn_backend_ctx *bk = NULL;
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_backend_open("cpu", 0, &bk, &err), 0, "%s", err.msg);
  cn_run *kept = NULL;
  const size_t spans[][2] = {{0, 64}, {3, 10}, {10, 11}, {0, 64}};
  for (size_t f = 0; f < tu_n_families; f++) {
    const tu_family *c = &tu_families[f];
    char dir[256];
    cn_model *m = tu_model(c->family, 16, 16, c->data, dir, sizeof(dir));
    json_t *in = tu_data_lines(c->data, 64);
    const void *vtype = NULL, *edges = NULL, *order = NULL;
    for (size_t k = 0; k < sizeof(spans) / sizeof(spans[0]); k++) {
      size_t s = spans[k][0], e = spans[k][1];
      if (e > json_array_size(in)) e = json_array_size(in);
      if (s >= e) continue;
      cn_run *fresh = cn_run_new(m, bk);
      cn_run_stats a, b;
      char *want = run_span(fresh, m, in, s, e, &a);
      cn_run_free(fresh);
      if (kept == NULL) kept = cn_run_new(m, bk);
      else cr_assert_eq(cn_run_reset(kept, m, bk), 0);
      char *got = run_span(kept, m, in, s, e, &b);
      /* the same instances again: the graph and plan arrays the first
       * time grew are the ones used (nothing reallocated) */
      if (k == 0) {
        vtype = kept->vtype;
        edges = kept->in_edges;
        order = kept->order;
      } else if (k == 3) {
        cr_expect(kept->vtype == vtype && kept->in_edges == edges,
                  "%s: a reset run grew its graph arrays again", c->family);
        cr_expect(kept->fam->dynamic || kept->order == order,
                  "%s: a reset run made a new plan array", c->family);
      }
      cr_expect_str_eq(got, want, "%s instances [%zu, %zu): a reset run "
                       "answers otherwise", c->family, s, e);
      cr_expect_eq(a.arena_bytes, b.arena_bytes, "%s: arena %zu vs %zu",
                   c->family, a.arena_bytes, b.arena_bytes);
      cr_expect_eq(a.state_bytes, b.state_bytes, "%s", c->family);
      cr_expect_eq(a.batches, b.batches, "%s", c->family);
      cr_expect_eq(a.vertices, b.vertices, "%s", c->family);
      free(want);
      free(got);
    }
    /* the next family's model resets a run this one's last ran */
    json_decref(in);
    cr_assert_eq(cn_run_reset(kept, m, bk), 0);
    cn_model_free(m);
    tu_rmdir(dir);
  }
  cn_run_free(kept);
  cn_backend_close(bk);
}
