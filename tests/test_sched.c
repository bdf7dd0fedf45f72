/* test_sched.c - the batching policies and the lower bound against brute
 * force on small graphs, and the bound on hand-made graphs whose value is
 * known (MODELS.md "Batching granularity"). */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "engine_util.h"
#include "internal.h"

static const cn_family fake3 = {.name = "fake", .n_types = 3,
                                .type_names = {"a", "b", "c"}};
static cn_model fake_model = {.fam = &fake3};

static cn_run *graph(void) {
  cn_run *r = cn_run_new(&fake_model, NULL);
  cr_assert_not_null(r);
  return r;
}

static int32_t add(cn_run *r, int type, int n, ...) {
  int32_t in[8];
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) in[i] = va_arg(ap, int32_t);
  va_end(ap);
  return cn__run_add_vertex(r, type, 0, 0, 0, in, n);
}

/* Every vertex exactly once, one type per batch, inputs before use. */
static void check_valid(const cn_run *r) {
  char *done = calloc((size_t)r->nv, 1);
  int32_t seen = 0;
  for (int32_t b = 0; b < r->n_batches; b++) {
    const cn_run_batch *bt = &r->batches[b];
    cr_assert_gt(bt->n, 0);
    for (int32_t i = 0; i < bt->n; i++) {
      int32_t v = r->order[bt->start + i];
      cr_assert_eq(r->vtype[v], bt->type);
      int k;
      const int32_t *in = cn__run_inputs(r, v, &k);
      for (int j = 0; j < k; j++)
        cr_assert(done[in[j]], "vertex %d runs before its input %d", v, in[j]);
    }
    for (int32_t i = 0; i < bt->n; i++) {
      int32_t v = r->order[bt->start + i];
      cr_assert(!done[v]);
      done[v] = 1;
      seen++;
    }
  }
  cr_assert_eq(seen, r->nv);
  free(done);
}


Test(sched, bound_binary_tree_all_outputs) {
  /* A complete binary tree of 4 leaves (type a), 3 internal (b), one
   * output (c) per node: bound = 1 + internal height 2 + 1. */
  cn_run *r = graph();
  int32_t l[4], in[3];
  for (int i = 0; i < 4; i++) l[i] = add(r, 0, 0);
  in[0] = add(r, 1, 2, l[0], l[1]);
  in[1] = add(r, 1, 2, l[2], l[3]);
  in[2] = add(r, 1, 2, in[0], in[1]);
  for (int i = 0; i < 4; i++) add(r, 2, 1, l[i]);
  for (int i = 0; i < 3; i++) add(r, 2, 1, in[i]);
  cr_expect_eq(cn__sched_lower_bound(r), 4);
  cr_expect_eq(tu_brute_force_min(r), 4);
  cn_run_free(r);
}

Test(sched, bound_nmt_chain) {
  /* lstm-nmt shape: n encoder steps (a), then T x (dec b -> proj c):
   * bound n + 2T. */
  cn_run *r = graph();
  int32_t prev = add(r, 0, 0);
  for (int i = 1; i < 3; i++) prev = add(r, 0, 1, prev);
  for (int t = 0; t < 4; t++) {
    int32_t d = add(r, 1, 1, prev);
    prev = add(r, 2, 1, d);
  }
  cr_expect_eq(cn__sched_lower_bound(r), 3 + 2 * 4);
  cn_run_free(r);
}

Test(sched, bound_counts_types_across_other_types) {
  /* a -> b -> a -> b: depth_a = 2 and depth_b = 2 along one path. */
  cn_run *r = graph();
  int32_t v = add(r, 0, 0);
  v = add(r, 1, 1, v);
  v = add(r, 0, 1, v);
  add(r, 1, 1, v);
  cr_expect_eq(cn__sched_lower_bound(r), 4);
  cn_run_free(r);
}

/* Random DAGs of up to 14 vertices and 3 types: every policy yields a
 * valid schedule; bound <= optimum <= each policy; none runs one vertex a
 * batch. */
Test(sched, random_dags_against_brute_force, .timeout = 60) {
  srand(12345);
  for (int trial = 0; trial < 300; trial++) {
    int n = 2 + rand() % 13;
    int opt = -1;
    for (int p = 0; p < CN_POLICY__COUNT; p++) {
      srand(1000 + trial);
      cn_run *r = graph();
      for (int v = 0; v < n; v++) {
        int32_t in[3];
        int k = v == 0 ? 0 : rand() % (v < 3 ? v + 1 : 4);
        for (int j = 0; j < k; j++) {
          int32_t u;
          bool dup;
          do {
            u = rand() % v;
            dup = false;
            for (int q = 0; q < j; q++) dup |= in[q] == u;
          } while (dup && k <= v);
          in[j] = u;
        }
        cn__run_add_vertex(r, rand() % 3, 0, 0, 0, in, k);
      }
      if (opt < 0) opt = tu_brute_force_min(r);
      cn_err err;
      cn_err_clear(&err);
      cr_assert_eq(cn__sched_plan(r, (cn_policy_kind)p, &err), 0);
      check_valid(r);
      cr_expect_leq(r->lower_bound, opt, "trial %d: bound %lld > optimum %d",
                    trial, (long long)r->lower_bound, opt);
      cr_expect_geq(r->n_batches, opt, "trial %d policy %s: %d < optimum %d",
                    trial, cn_policy_name((cn_policy_kind)p), r->n_batches,
                    opt);
      if (p == CN_POLICY_NONE) cr_expect_eq(r->n_batches, n);
      cn_run_free(r);
    }
  }
}
