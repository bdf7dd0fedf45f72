/* test_sched.c - the batching policies and the lower bound against brute
 * force on small graphs, and the bound on hand-made graphs whose value is
 * known (docs/models.md "Batching granularity"). */
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

/* Batching every ready vertex of each listed type in turn runs all of r. */
static void check_schedule_runs(const cn_run *r, const uint8_t *types, int n) {
  char *done = calloc((size_t)r->nv + 1, 1);
  char *now = calloc((size_t)r->nv + 1, 1);
  int32_t left = r->nv;
  for (int s = 0; s < n; s++) {
    int32_t ran = 0;
    for (int32_t v = 0; v < r->nv; v++) {
      int k;
      const int32_t *in = cn__run_inputs(r, v, &k);
      bool ready = !done[v] && r->vtype[v] == types[s];
      for (int j = 0; ready && j < k; j++) ready = done[in[j]];
      now[v] = ready;
      ran += ready;
    }
    cr_expect_gt(ran, 0, "step %d of the schedule runs nothing", s);
    for (int32_t v = 0; v < r->nv; v++) done[v] |= now[v];
    left -= ran;
  }
  cr_expect_eq(left, 0, "the schedule leaves %d vertices", left);
  free(done);
  free(now);
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

/* ---- the bound against longest paths, one type at a time -------------
 * cn__dag_lower_bound keeps its counters in lanes of a word while they
 * are small and in int32 otherwise; the reference is Σ_t of the longest
 * path counted in type-t vertices, one plain DP per type. The DAGs
 * straddle the lanes' limits: types 1-8 (16-bit lanes up to 4 types,
 * 8-bit beyond), chains that reach 127, 128, 32,767 and 32,768 vertices
 * of a type, and random inputs among the last few vertices. */
static int64_t bound_by_type(int T, int32_t nv, const uint8_t *vt,
                             const int32_t *is, const int32_t *ie) {
  int64_t *d = malloc(((size_t)nv + 1) * sizeof(int64_t)), lb = 0;
  for (int t = 0; t < T; t++) {
    int64_t best = 0;
    for (int32_t v = 0; v < nv; v++) {
      int64_t m = 0;
      for (int32_t i = is[v]; i < is[v + 1]; i++)
        if (d[ie[i]] > m) m = d[ie[i]];
      d[v] = m + (vt[v] == t);
      if (d[v] > best) best = d[v];
    }
    lb += best;
  }
  free(d);
  return lb;
}

/* A DAG of nv vertices: vertex v's type is pick(v), and it reads up to
 * `fan` of the `reach` vertices before it (none with fan 0: a chain reads
 * v - 1). */
static void check_bound_dag(int T, int32_t nv, int fan, int reach,
                            int chain_type) {
  uint8_t *vt = malloc((size_t)nv);
  int32_t *is = malloc(((size_t)nv + 1) * sizeof(int32_t));
  int32_t *ie = malloc(((size_t)nv * 4 + 1) * sizeof(int32_t));
  int32_t ne = 0;
  is[0] = 0;
  for (int32_t v = 0; v < nv; v++) {
    vt[v] = (uint8_t)(chain_type >= 0 ? (v % 3 ? chain_type : rand() % T)
                                      : rand() % T);
    if (fan == 0 && v > 0) ie[ne++] = v - 1;
    int k = fan > 0 && v > 0 ? rand() % (fan + 1) : 0;
    for (int j = 0; j < k; j++) {
      int32_t lo = v > reach ? v - reach : 0;
      ie[ne++] = lo + rand() % (v - lo);
    }
    is[v + 1] = ne;
  }
  cn_dag g = {T, nv, vt, is, ie};
  int64_t want = bound_by_type(T, nv, vt, is, ie);
  cr_expect_eq(cn__dag_lower_bound(&g), want,
               "%d types, %d vertices, fan %d: bound %lld, longest paths "
               "%lld", T, nv, fan, (long long)cn__dag_lower_bound(&g),
               (long long)want);
  free(vt);
  free(is);
  free(ie);
}

Test(sched, bound_against_longest_paths_per_type, .timeout = 60) {
  srand(4242);
  for (int T = 1; T <= CN_MAX_TYPES; T++) {
    for (int trial = 0; trial < 40; trial++)
      check_bound_dag(T, 1 + rand() % 400, 1 + rand() % 3, 1 + rand() % 8,
                      -1);
    /* one type every third vertex at least: 127 / 128 of it and more */
    int32_t lim8[] = {190, 191, 192, 193, 400};
    for (int i = 0; i < 5; i++) check_bound_dag(T, lim8[i], 0, 1, T - 1);
  }
  /* 16-bit lanes (up to 4 types): one type's count crosses 32,767 */
  for (int T = 1; T <= 4; T++) {
    check_bound_dag(T, 32767 * 3 / 2 - 2, 0, 1, 0);
    check_bound_dag(T, 32768 * 3 / 2 + 2, 0, 1, 0);
    check_bound_dag(T, 60000, 2, 3, 0);
  }
}

/* A random DAG of n vertices, up to 3 inputs each, and 3 types. */
/* n random vertices appended to r, inputs among the n only. */
static void random_part(cn_run *r, int n) {
  int32_t base = r->nv;
  for (int v = 0; v < n; v++) {
    int32_t in[3];
    int k = v == 0 ? 0 : rand() % (v < 3 ? v + 1 : 4);
    for (int j = 0; j < k; j++) {
      int32_t u;
      bool dup;
      do {
        u = rand() % v;
        dup = false;
        for (int q = 0; q < j; q++) dup |= in[q] == base + u;
      } while (dup && k <= v);
      in[j] = base + u;
    }
    cn__run_add_vertex(r, rand() % 3, 0, 0, 0, in, k);
  }
}

static cn_run *random_graph(int n, unsigned seed) {
  srand(seed);
  cn_run *r = graph();
  random_part(r, n);
  return r;
}

/* A run of `parts` disjoint random instances, n vertices in all. */
static cn_run *random_run(int parts, int n, unsigned seed) {
  srand(seed);
  cn_run *r = graph();
  for (int i = 0; i < parts; i++)
    random_part(r, n / parts + (i < n % parts));
  return r;
}

/* Random DAGs of up to 14 vertices and 3 types: every policy yields a
 * valid schedule; bound <= optimum <= each policy; none runs one vertex a
 * batch; plan never launches more than lookahead2. */
Test(sched, random_dags_against_brute_force, .timeout = 60) {
  srand(12345);
  for (int trial = 0; trial < 300; trial++) {
    int n = 2 + rand() % 13;
    int opt = -1, la2 = -1;
    for (int p = 0; p < CN_POLICY__COUNT; p++) {
      cn_run *r = random_graph(n, 1000u + (unsigned)trial);
      if (opt < 0) {
        opt = tu_brute_force_min(r);
        /* The IDA* search (dag_optimum.c) finds the same optimum, and its
         * schedule runs the graph in that many maximal batches. */
        cn_dag g = cn__run_dag(r);
        cn_dag_optimum o;
        cr_assert_eq(cn__dag_optimum(&g, 1000000, &o), 0);
        cr_expect(o.exact, "trial %d: search ran out of budget", trial);
        cr_expect_eq(o.lower, opt, "trial %d: search %lld, brute force %d",
                     trial, (long long)o.lower, opt);
        cr_expect_eq(o.upper, opt);
        check_schedule_runs(r, o.schedule, (int)o.upper);
        free(o.schedule);
      }
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
      if (p == CN_POLICY_LOOKAHEAD2) la2 = r->n_batches;
      if (p == CN_POLICY_PLAN)
        cr_expect_leq(r->n_batches, la2, "trial %d: plan %d > lookahead2 %d",
                      trial, r->n_batches, la2);
      cn_run_free(r);
    }
  }
}

/* The bound Σ_t depth_t of the vertices of r not in done (edges among
 * them only), from scratch. */
static int64_t bound_left(const cn_run *r, const char *done) {
  int32_t *map = malloc((size_t)r->nv * 4), *is = malloc(((size_t)r->nv + 1) * 4);
  int32_t *ie = malloc(((size_t)r->ne + 1) * 4), n = 0, ne = 0;
  uint8_t *vt = malloc((size_t)r->nv + 1);
  is[0] = 0;
  for (int32_t v = 0; v < r->nv; v++) {
    map[v] = -1;
    if (done[v]) continue;
    map[v] = n;
    vt[n] = r->vtype[v];
    for (int32_t i = r->in_start[v]; i < r->in_start[v + 1]; i++)
      if (!done[r->in_edges[i]]) ie[ne++] = map[r->in_edges[i]];
    is[++n] = ne;
  }
  cn_dag g = {3, n, vt, is, ie};
  int64_t b = cn__dag_lower_bound(&g);
  free(map);
  free(is);
  free(ie);
  free(vt);
  return b;
}

/* Commits every ready type-t vertex of done in place (one batch). */
static void commit_type(const cn_run *r, char *done, int t) {
  char *now = calloc((size_t)r->nv + 1, 1);
  for (int32_t v = 0; v < r->nv; v++) {
    bool ready = !done[v] && r->vtype[v] == t;
    for (int32_t i = r->in_start[v]; ready && i < r->in_start[v + 1]; i++)
      ready = done[r->in_edges[i]];
    now[v] = ready;
  }
  for (int32_t v = 0; v < r->nv; v++) done[v] |= now[v];
  free(now);
}

static bool any_ready(const cn_run *r, const char *done, int t) {
  for (int32_t v = 0; v < r->nv; v++) {
    bool ready = !done[v] && r->vtype[v] == t;
    for (int32_t i = r->in_start[v]; ready && i < r->in_start[v + 1]; i++)
      ready = done[r->in_edges[i]];
    if (ready) return true;
  }
  return false;
}

/* Commits a random ready type of f, marking its batch in done. */
static void commit_random(cn_frontier *f, char *done, int32_t *out) {
  int ts[CN_MAX_TYPES], k = 0;
  for (int t = 0; t < f->n_types; t++)
    if (f->n_ready[t] > 0) ts[k++] = t;
  cr_assert_gt(k, 0);
  int32_t m = cn__frontier_commit(f, ts[rand() % k], out);
  for (int32_t i = 0; i < m; i++) done[out[i]] = 1;
}

/* The look-ahead (frontier.c) against its definition: along random
 * schedules of random DAGs, the bound it keeps equals the bound of what is
 * left recomputed from scratch, and drop[t] equals that bound minus the
 * bound left after committing every ready type-t vertex. */
Test(sched, lookahead_drops_against_recomputed_bound, .timeout = 60) {
  for (int trial = 0; trial < 400; trial++) {
    int n = 2 + trial % 40;
    cn_run *r = random_graph(n, 777u + (unsigned)trial);
    cn_dag g = cn__run_dag(r);
    cn_frontier f;
    cr_assert_eq(cn__frontier_init(&f, 3, false), 0);
    cr_assert_eq(cn__frontier_add_dag(&f, &g), 0);
    cr_assert_eq(cn__frontier_tails(&f), 0);
    char *done = calloc((size_t)n, 1), *after = malloc((size_t)n);
    int32_t *out = malloc((size_t)n * 4);
    while (f.n_done < n) {
      int64_t drop[CN_MAX_TYPES];
      int64_t now = cn__frontier_drops(&f, drop);
      cr_expect_eq(now, bound_left(r, done), "trial %d", trial);
      for (int t = 0; t < 3; t++) {
        if (f.n_ready[t] == 0) {
          cr_expect_eq(drop[t], 0);
          continue;
        }
        memcpy(after, done, (size_t)n);
        commit_type(r, after, t);
        cr_expect_eq(drop[t], now - bound_left(r, after),
                     "trial %d type %d: drop %lld", trial, t,
                     (long long)drop[t]);
      }
      commit_random(&f, done, out);
    }
    free(done);
    free(after);
    free(out);
    cn__frontier_free(&f);
    cn_run_free(r);
  }
}

/* The plan policy on r: a valid schedule, between the optimum and
 * lookahead2's. Returns lookahead2's batches minus plan's. */
static int plan_against_lookahead2(unsigned seed, int parts, int n, int opt) {
  int nb[2];
  for (int k = 0; k < 2; k++) {
    cn_run *r = random_run(parts, n, seed);
    cn_err err;
    cn_err_clear(&err);
    cr_assert_eq(cn__sched_plan(r, k ? CN_POLICY_PLAN : CN_POLICY_LOOKAHEAD2,
                                &err), 0);
    check_valid(r);
    nb[k] = r->n_batches;
    cn_run_free(r);
  }
  cr_expect_geq(nb[1], opt, "seed %u: plan %d < optimum %d", seed, nb[1], opt);
  cr_expect_leq(nb[1], nb[0], "seed %u: plan %d > lookahead2 %d", seed, nb[1],
                nb[0]);
  return nb[0] - nb[1];
}

/* The beam search (dag_beam.c): its schedule runs the graph in the
 * batches it reports, never fewer than the optimum; a wide beam finds the
 * optimum on nearly every small graph. Runs of several disjoint instances
 * exercise the per-instance automata: a state is a vector of them. */
static void beam_against_the_optimum(int parts, unsigned seed0) {
  int wide_optimal = 0, trials = 200;
  for (int trial = 0; trial < trials; trial++) {
    int n = parts == 1 ? 2 + trial % 13 : parts + trial % (15 - parts);
    cn_run *r = random_run(parts, n, seed0 + (unsigned)trial);
    cn_dag g = cn__run_dag(r);
    int opt = tu_brute_force_min(r);
    for (int w = 1; w <= 64; w *= 8) {
      int64_t b;
      uint8_t *sched;
      cr_assert_eq(cn__dag_beam(&g, w, &b, &sched), 0);
      cr_expect_geq(b, opt, "trial %d width %d", trial, w);
      check_schedule_runs(r, sched, (int)b);
      if (w == 64) wide_optimal += b == opt;
      free(sched);
    }
    cn_run_free(r);
    plan_against_lookahead2(seed0 + (unsigned)trial, parts, n, opt);
  }
  cr_expect_geq(wide_optimal, trials * 9 / 10, "width 64 optimal on %d of %d",
                wide_optimal, trials);
}

Test(sched, beam_search_against_the_optimum, .timeout = 60) {
  beam_against_the_optimum(1, 4242u);
}

Test(sched, beam_search_over_several_instances, .timeout = 60) {
  for (int parts = 2; parts <= 4; parts++)
    beam_against_the_optimum(parts, 7000u + 1000u * (unsigned)parts);
}

/* On runs too large for lookahead2 to be optimal (4-8 instances of up to
 * 40 vertices), plan replays the beam's schedule where it is shorter: it
 * must win on some runs, and never go below the exact search's proven
 * lower end. */
Test(sched, plan_beats_lookahead2_on_larger_runs, .timeout = 60) {
  int won = 0, trials = 100;
  for (int trial = 0; trial < trials; trial++) {
    int parts = 4 + trial % 5, n = parts * (20 + trial % 21);
    cn_run *r = random_run(parts, n, 90000u + (unsigned)trial);
    cn_dag g = cn__run_dag(r);
    cn_dag_optimum o;
    cr_assert_eq(cn__dag_optimum(&g, 20000, &o), 0);
    free(o.schedule);
    cn_run_free(r);
    won += plan_against_lookahead2(90000u + (unsigned)trial, parts, n,
                                   (int)o.lower) > 0;
  }
  cr_expect_gt(won, trials / 10, "plan beat lookahead2 on %d of %d runs", won,
               trials);
}

/* ---- the lookahead2 policy (frontier.c) against its definition -------- */
/* Instances by flood fill over edges both ways (quadratic, small graphs). */
static int instances(const cn_run *r, int32_t *label) {
  int n = 0;
  for (int32_t v = 0; v < r->nv; v++) label[v] = -1;
  for (int32_t s = 0; s < r->nv; s++) {
    if (label[s] >= 0) continue;
    label[s] = n;
    for (bool grew = true; grew;) {
      grew = false;
      for (int32_t v = 0; v < r->nv; v++)
        for (int32_t i = r->in_start[v]; i < r->in_start[v + 1]; i++) {
          int32_t u = r->in_edges[i];
          if ((label[u] == n) != (label[v] == n)) {
            label[u] = label[v] = n;
            grew = true;
          }
        }
    }
    n++;
  }
  return n;
}

/* lookahead2's score of a state, from scratch: the bound of what is left
 * in the run, and the sum of the cubes of each instance's own bound. */
static void la2_score_of(const cn_run *r, const char *done,
                         const int32_t *label, int n_inst, int64_t *bound,
                         double *soft) {
  char *mask = malloc((size_t)r->nv + 1);
  *bound = bound_left(r, done);
  *soft = 0;
  for (int c = 0; c < n_inst; c++) {
    for (int32_t v = 0; v < r->nv; v++) mask[v] = done[v] || label[v] != c;
    int64_t b = bound_left(r, mask);
    *soft += (double)b * (double)b * (double)b;
  }
  free(mask);
}

static bool score_less(int64_t w1, double s1, int64_t w2, double s2) {
  return w1 < w2 || (w1 == w2 && s1 < s2 - 0.5);
}

/* Type t "feeds" when some type-t vertex of r has a consumer. */
static bool feeds(const cn_run *r, int t) {
  for (int32_t v = 0; v < r->nv; v++)
    for (int32_t i = r->in_start[v]; i < r->in_start[v + 1]; i++)
      if (r->vtype[r->in_edges[i]] == t) return true;
  return false;
}

/* Random runs whose types 0 and 1 form random instances, each vertex with
 * one type-2 consumer of its own that feeds nothing (outputs=all). */
static cn_run *random_run_with_outputs(int parts, int n, unsigned seed) {
  srand(seed);
  cn_run *r = graph();
  for (int i = 0; i < parts; i++) {
    int32_t base = r->nv, m = n / parts + (i < n % parts);
    for (int32_t v = 0; v < m; v++) {
      int32_t in[2];
      int k = v == 0 ? 0 : rand() % (v < 2 ? v + 1 : 3);
      for (int j = 0; j < k; j++) {
        in[j] = base + 2 * (rand() % v); /* the non-output vertices */
        if (j == 1 && in[1] == in[0]) k = 1;
      }
      int32_t u = cn__run_add_vertex(r, rand() % 2, 0, 0, 0, in, k);
      cn__run_add_vertex(r, 2, 0, 0, 0, &u, 1);
    }
  }
  return r;
}

/* Along random schedules of random runs of 1-5 instances: the frontier's
 * instances are the weakly connected components, and the type lookahead2
 * picks has the least (score two batches on, score one batch on), each
 * recomputed from scratch for every first and second type. With outputs,
 * the graph is declared complete: a type that feeds nothing is neither a
 * first nor a second batch while a type that feeds something is ready. */
static void lookahead2_trials(bool outputs) {
  for (int trial = 0; trial < 240; trial++) {
    int parts = 1 + trial % 5, n = parts + trial % 30;
    cn_run *r = outputs
                    ? random_run_with_outputs(parts, n / 2 + parts, 32000u + (unsigned)trial)
                    : random_run(parts, n, 31000u + (unsigned)trial);
    n = r->nv;
    cn_dag g = cn__run_dag(r);
    cn_frontier f;
    cr_assert_eq(cn__frontier_init(&f, 3, false), 0);
    cr_assert_eq(cn__frontier_add_dag(&f, &g), 0);
    f.complete = outputs;
    cr_assert_eq(cn__frontier_tails(&f), 0);
    bool fd[3];
    for (int t = 0; t < 3; t++) {
      fd[t] = feeds(r, t);
      cr_expect_eq((f.feeds >> t & 1) != 0, fd[t], "trial %d type %d", trial,
                   t);
    }
    int32_t *label = malloc((size_t)n * 4), *out = malloc((size_t)n * 4);
    int n_inst = instances(r, label);
    cr_expect_eq(f.n_comp, n_inst, "trial %d", trial);
    for (int32_t u = 0; u < n; u++)
      for (int32_t v = 0; v < n; v++)
        cr_expect_eq(f.comp[u] == f.comp[v], label[u] == label[v],
                     "trial %d: vertices %d and %d", trial, u, v);
    char *done = calloc((size_t)n, 1), *a1 = malloc((size_t)n),
         *a2 = malloc((size_t)n);
    while (f.n_done < n) {
      int64_t bw2 = 0, bw1 = 0, got_w2 = -1, got_w1 = -1;
      double bs2 = 0, bs1 = 0, got_s2 = 0, got_s1 = 0;
      bool first = true, others = false;
      for (int t = 0; t < 3; t++)
        others |= outputs && fd[t] && any_ready(r, done, t);
      int pick = cn__frontier_next(&f, CN_POLICY_LOOKAHEAD2, NULL);
      if (others)
        cr_expect(fd[pick], "trial %d: picked %d, which feeds nothing",
                  trial, pick);
      for (int t1 = 0; t1 < 3; t1++) {
        if (f.n_ready[t1] == 0 || (others && !fd[t1])) continue;
        memcpy(a1, done, (size_t)n);
        commit_type(r, a1, t1);
        int64_t w1, w2 = -1;
        double s1, s2 = 0;
        la2_score_of(r, a1, label, n_inst, &w1, &s1);
        bool others2 = false;
        for (int t2 = 0; t2 < 3; t2++)
          others2 |= outputs && fd[t2] && any_ready(r, a1, t2);
        for (int t2 = 0; t2 < 3; t2++) {
          if (!any_ready(r, a1, t2) || (others2 && !fd[t2])) continue;
          memcpy(a2, a1, (size_t)n);
          commit_type(r, a2, t2);
          int64_t w;
          double s;
          la2_score_of(r, a2, label, n_inst, &w, &s);
          if (w2 < 0 || score_less(w, s, w2, s2)) w2 = w, s2 = s;
        }
        if (w2 < 0) w2 = w1, s2 = s1; /* nothing after t1 */
        if (t1 == pick) got_w2 = w2, got_s2 = s2, got_w1 = w1, got_s1 = s1;
        if (first || score_less(w2, s2, bw2, bs2) ||
            (!score_less(bw2, bs2, w2, s2) && score_less(w1, s1, bw1, bs1))) {
          bw2 = w2, bs2 = s2, bw1 = w1, bs1 = s1;
          first = false;
        }
      }
      cr_assert_geq(pick, 0);
      cr_expect(got_w2 == bw2 && got_s2 == bs2 && got_w1 == bw1 &&
                    got_s1 == bs1,
                "trial %d: picked %d scoring (%lld, %.0f | %lld, %.0f), best "
                "(%lld, %.0f | %lld, %.0f)",
                trial, pick, (long long)got_w2, got_s2, (long long)got_w1,
                got_s1, (long long)bw2, bs2, (long long)bw1, bs1);
      commit_random(&f, done, out);
    }
    free(done);
    free(a1);
    free(a2);
    free(out);
    free(label);
    cn__frontier_free(&f);
    cn_run_free(r);
  }
}

Test(sched, lookahead2_against_recomputed_scores, .timeout = 120) {
  lookahead2_trials(false);
}

Test(sched, lookahead2_leaves_outputs_for_last, .timeout = 120) {
  lookahead2_trials(true);
}

/* In a complete graph, lookahead2's own schedule runs each type that feeds
 * nothing in one batch, and launches no more batches than without that
 * rule on these runs' totals. */
Test(sched, lookahead2_one_output_batch, .timeout = 60) {
  int64_t with = 0, without = 0;
  for (int trial = 0; trial < 100; trial++) {
    cn_run *r = random_run_with_outputs(1 + trial % 6, 8 + trial % 40,
                                        33000u + (unsigned)trial);
    cn_dag g = cn__run_dag(r);
    for (int complete = 0; complete < 2; complete++) {
      cn_frontier f;
      cr_assert_eq(cn__frontier_init(&f, 3, false), 0);
      cr_assert_eq(cn__frontier_add_dag(&f, &g), 0);
      f.complete = complete;
      cr_assert_eq(cn__frontier_tails(&f), 0);
      int32_t *out = malloc((size_t)r->nv * 4);
      int out_batches = 0, batches = 0, t;
      while ((t = cn__frontier_next(&f, CN_POLICY_LOOKAHEAD2, NULL)) >= 0) {
        cr_assert_gt(cn__frontier_commit(&f, t, out), 0);
        out_batches += t == 2;
        batches++;
      }
      if (complete) cr_expect_eq(out_batches, 1, "trial %d", trial);
      *(complete ? &with : &without) += batches;
      free(out);
      cn__frontier_free(&f);
    }
    cn_run_free(r);
  }
  cr_expect_leq(with, without);
}

/* cn_run_set_plan_width reaches the search: the plan policy launches
 * min(lookahead2, the beam at the run's width) batches, at widths 1 and
 * 64, and the width makes a difference on some of these runs. */
Test(sched, plan_width_is_the_runs, .timeout = 60) {
  int differ = 0;
  for (int trial = 0; trial < 40; trial++) {
    int parts = 4 + trial % 5, n = parts * (20 + trial % 21);
    int got[2];
    for (int k = 0; k < 2; k++) {
      int w = k ? 64 : 1;
      cn_run *r = random_run(parts, n, 91000u + (unsigned)trial);
      cn_dag g = cn__run_dag(r);
      int64_t beam;
      cr_assert_eq(cn__dag_beam(&g, w, &beam, NULL), 0);
      cn_err err;
      cn_err_clear(&err);
      cr_assert_eq(cn__sched_plan(r, CN_POLICY_LOOKAHEAD2, &err), 0);
      int la2 = r->n_batches;
      free(r->order);
      free(r->batches);
      r->order = NULL;
      r->batches = NULL;
      cn_run_set_plan_width(r, w);
      cr_assert_eq(cn__sched_plan(r, CN_POLICY_PLAN, &err), 0);
      check_valid(r);
      cr_expect_eq(r->n_batches, beam < la2 ? beam : la2,
                   "trial %d width %d: plan %d, beam %lld, lookahead2 %d",
                   trial, w, r->n_batches, (long long)beam, la2);
      got[k] = r->n_batches;
      cn_run_free(r);
    }
    differ += got[0] != got[1];
  }
  cr_expect_gt(differ, 0);
}

/* ---- the default policy's schedules on data/, pinned -------------------
 * The scheduler's bookkeeping may get faster, never different: the default
 * policy with the memory order (docs/memory.md) must give data/'s runs
 * exactly the schedules they had when this test was written, batch for
 * batch, vertex for vertex and row for row. Pinned per family: the total
 * batches and a hash (FNV-1a) of every run's order, batches and state
 * offsets, over runs of 64 and one run of all 400 lines, with and without
 * every output. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static void schedule_hash(const char *family, const char *data,
                          long long *batches, uint64_t *hash) {
  char dir[256];
  cn_model *m = tu_model(family, 8, 8, data, dir, sizeof(dir));
  json_t *lines = tu_data_lines(data, 400);
  cn_backend_ctx *bk = NULL;
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_backend_open("cpu", 0, &bk, &err), 0);
  *batches = 0;
  *hash = 0xcbf29ce484222325ull;
  size_t n = json_array_size(lines);
  for (unsigned flags = 0; flags <= CN_OUT_ALL; flags += CN_OUT_ALL)
    for (int per = 64; per <= 400; per += 336)
      for (size_t i0 = 0; i0 < n; i0 += (size_t)per) {
        cn_run *r = cn_run_new(m, bk);
        cn_instance *ins[400];
        size_t k = 0;
        for (size_t i = i0; i < n && i < i0 + (size_t)per; i++, k++) {
          cr_assert_eq(cn_instance_parse(m, json_array_get(lines, i), NULL,
                                         (int)i, &ins[k], &err), 0, "%s", err.msg);
          cr_assert_geq(cn_run_add(r, ins[k], flags, 0), 0);
        }
        cr_assert_eq(cn_run_exec(r, CN_POLICY_SUFFICIENT, &err), 0, "%s",
                     err.msg);
        *batches += r->n_batches;
        *hash = fnv(*hash, &r->n_batches, sizeof(r->n_batches));
        *hash = fnv(*hash, r->order, (size_t)r->nv * sizeof(int32_t));
        for (int32_t b = 0; b < r->n_batches; b++) {
          int32_t tsn[3] = {r->batches[b].type, r->batches[b].start,
                            r->batches[b].n};
          *hash = fnv(*hash, tsn, sizeof(tsn));
        }
        *hash = fnv(*hash, r->state_off, (size_t)r->nv * sizeof(int64_t));
        *hash = fnv(*hash, &r->arena_floats, sizeof(r->arena_floats));
        cn_run_free(r);
        for (size_t q = 0; q < k; q++) cn_instance_free(ins[q]);
      }
  cn_backend_close(bk);
  json_decref(lines);
  cn_model_free(m);
  tu_rmdir(dir);
}

Test(sched, default_schedules_on_data_pinned) {
  static const struct {
    const char *family, *data;
    long long batches;
    uint64_t hash;
  } want[] = {
      {"treelstm", "trees-binary.jsonl", 404, 0x7eb8450e37bafde1ull},
      {"treelstm-2type", "trees-binary.jsonl", 583, 0xdd1153a0d76619e1ull},
      {"childsum-treelstm", "trees-nary.jsonl", 264, 0xbe9d147d0ccc1eaaull},
      {"bilstm-tagger", "sequences.jsonl", 1296, 0x8a537b9bc0a855bdull},
      {"latticelstm", "lattices.jsonl", 5478, 0x3add5954cc060fa5ull},
      {"latticegru", "dags.jsonl", 1902, 0x6a4a56cde27a2dd9ull},
  };
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    long long nb;
    uint64_t h;
    schedule_hash(want[i].family, want[i].data, &nb, &h);
    cr_log_info("{\"%s\", \"%s\", %lld, 0x%016llxull},", want[i].family,
                want[i].data, nb, (unsigned long long)h);
    cr_expect_eq(nb, want[i].batches, "%s: %lld batches, pinned %lld",
                 want[i].family, nb, want[i].batches);
    cr_expect_eq(h, want[i].hash, "%s: the schedules changed",
                 want[i].family);
  }
}

/* ---- a static DAG added at once = added vertex by vertex ---------------
 * cn__frontier_add_dag fills an empty frontier in passes over arrays;
 * the reference is cn__frontier_add called for each vertex in turn (the
 * path of a growing graph). Both are driven by the sufficient and agenda
 * policies on random runs: every step must see the same ready and sub
 * counts, pick the same type and commit the same vertices in the same
 * order. */
static void frontier_one_by_one(cn_frontier *f, const cn_dag *g) {
  for (int32_t v = 0; v < g->nv; v++) {
    int32_t b = g->in_start[v];
    cr_assert_eq(cn__frontier_add(f, g->vtype[v], g->in_edges + b,
                                  g->in_start[v + 1] - b),
                 v);
  }
}

/* Drives a (g added at once) and b (vertex by vertex) side by side. */
static void compare_added(const cn_dag *g, int n_types, bool track,
                          unsigned seed) {
  /* after the second batch, both grow by the same vertices, reading
   * committed vertices and others (a graph that grows while it runs) */
  const int grow = 24;
  cn_policy_kind pol = track ? CN_POLICY_SUFFICIENT : CN_POLICY_AGENDA;
  cn_frontier a, b;
  cr_assert_eq(cn__frontier_init(&a, n_types, track), 0);
  cr_assert_eq(cn__frontier_init(&b, n_types, track), 0);
  cr_assert_eq(cn__frontier_add_dag(&a, g), 0);
  frontier_one_by_one(&b, g);
  int32_t *oa = malloc(((size_t)g->nv + grow) * sizeof(int32_t) + 4);
  int32_t *ob = malloc(((size_t)g->nv + grow) * sizeof(int32_t) + 4);
  for (int step = 0;; step++) {
    if (step == 2 && a.n_done < a.nv)
      for (int k = 0; k < grow; k++) {
        int32_t in[3], nin = rand() % 4;
        for (int j = 0; j < nin; j++) in[j] = rand() % a.nv;
        int type = rand() % n_types;
        cr_assert_eq(cn__frontier_add(&a, type, in, nin), a.nv - 1);
        cr_assert_eq(cn__frontier_add(&b, type, in, nin), b.nv - 1);
      }
    for (int t = 0; t < n_types; t++) {
      cr_assert_eq(a.n_ready[t], b.n_ready[t], "seed %u step %d", seed, step);
      cr_assert_eq(a.n_sub[t], b.n_sub[t], "seed %u step %d", seed, step);
      cr_assert_eq(a.depth_sum[t], b.depth_sum[t]);
    }
    int ta = cn__frontier_next(&a, pol, NULL);
    cr_assert_eq(ta, cn__frontier_next(&b, pol, NULL));
    if (ta < 0) break;
    int32_t na = cn__frontier_commit(&a, ta, oa);
    cr_assert_eq(na, cn__frontier_commit(&b, ta, ob));
    cr_assert_gt(na, 0);
    cr_assert_arr_eq(oa, ob, (size_t)na * sizeof(int32_t), "seed %u step %d",
                     seed, step);
  }
  cr_assert_eq(a.n_done, a.nv);
  cr_assert_eq(b.n_done, b.nv);
  free(oa);
  free(ob);
  cn__frontier_free(&a);
  cn__frontier_free(&b);
}

Test(sched, frontier_added_at_once_as_one_by_one) {
  for (unsigned seed = 1; seed <= 40; seed++) {
    cn_run *r = random_run(1 + (int)seed % 7, 20 + (int)(seed * 37) % 300,
                           seed);
    cn_dag g = cn__run_dag(r);
    for (int track = 0; track <= 1; track++)
      compare_added(&g, 3, track, seed);
    cn_run_free(r);
  }
}

/* A frontier that reads its DAG in place (borrow) schedules as one that
 * copies it, and refuses vertices added after it (they would be written
 * into the caller's arrays). */
Test(sched, frontier_borrowing_its_dag) {
  for (unsigned seed = 1; seed <= 10; seed++) {
    cn_run *r = random_run(1 + (int)seed % 5, 40 + (int)seed * 23, seed);
    cn_dag g = cn__run_dag(r);
    cn_frontier a, b;
    cr_assert_eq(cn__frontier_init(&a, 3, true), 0);
    cr_assert_eq(cn__frontier_init(&b, 3, true), 0);
    a.borrow = true;
    cr_assert_eq(cn__frontier_add_dag(&a, &g), 0);
    cr_assert_eq(cn__frontier_add_dag(&b, &g), 0);
    cr_assert(a.borrowed);
    cr_assert_eq((const void *)a.in_edges, (const void *)g.in_edges);
    int32_t *oa = malloc((size_t)g.nv * sizeof(int32_t) + 4);
    int32_t *ob = malloc((size_t)g.nv * sizeof(int32_t) + 4);
    int t;
    while ((t = cn__frontier_next(&a, CN_POLICY_SUFFICIENT, NULL)) >= 0) {
      cr_assert_eq(t, cn__frontier_next(&b, CN_POLICY_SUFFICIENT, NULL));
      int32_t n = cn__frontier_commit(&a, t, oa);
      cr_assert_eq(n, cn__frontier_commit(&b, t, ob));
      cr_assert_arr_eq(oa, ob, (size_t)n * sizeof(int32_t));
    }
    int32_t in = 0;
    cr_expect_eq(cn__frontier_add(&a, 0, &in, 1), CN_E_INTERNAL);
    cr_expect_eq(cn__frontier_add_dag(&a, &g), CN_E_INTERNAL);
    free(oa);
    free(ob);
    cn__frontier_free(&a);
    cn__frontier_free(&b);
    cn_run_free(r);
  }
}

/* The same where some vertices read 256 inputs or more (their sub counts
 * do not fit the byte a type add_dag_fresh sums them in): sources of
 * random types, chains over them, and wide vertices reading 250-400 of
 * the vertices before them. */
Test(sched, frontier_added_at_once_with_wide_vertices) {
  for (unsigned seed = 1; seed <= 12; seed++) {
    srand(seed);
    int T = 2 + (int)seed % 4;
    int32_t nv = 900, ne = 0;
    uint8_t *vt = malloc((size_t)nv);
    int32_t *is = malloc(((size_t)nv + 1) * sizeof(int32_t));
    int32_t *ie = malloc((size_t)nv * 400 * sizeof(int32_t));
    is[0] = 0;
    for (int32_t v = 0; v < nv; v++) {
      vt[v] = (uint8_t)(rand() % T);
      int k = v < 300 ? rand() % 2 : rand() % 9 == 0 ? 250 + rand() % 151
                                                    : 1 + rand() % 3;
      if (k > v) k = v;
      int32_t lo = v - k - rand() % (v - k + 1);
      for (int j = 0; j < k; j++) ie[ne++] = lo + j; /* distinct inputs */
      is[v + 1] = ne;
    }
    cn_dag g = {T, nv, vt, is, ie};
    for (int track = 0; track <= 1; track++) compare_added(&g, T, track, seed);
    free(vt);
    free(is);
    free(ie);
  }
}
