/* test_dag_memory.c - the memory order (core/sched/dag_memory.c)
 * against brute force on small random graphs: every schedule
 * of a graph of up to 9 vertices, by dynamic programming over done-sets,
 * gives the lowest peak reachable in each number of batches. The search
 * must never beat that optimum (it would mean the model or the search is
 * wrong), must keep the schedule valid, must not add batches without a
 * budget, and must reach the optimum or the budget often enough; the
 * fractions it reaches are printed. On larger graphs, the peaks it
 * reports must be those cn__dag_mem_peak computes on its own. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched_api.h"

#define NV_MAX 9
#define INF ((int64_t)1 << 60)

typedef struct rgraph {
  int T;
  int32_t nv;
  uint8_t vtype[NV_MAX];
  int32_t in_start[NV_MAX + 1], in_edges[NV_MAX * NV_MAX];
  int64_t bytes[4];
  uint8_t keep[NV_MAX];
} rgraph;

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)(rng % n);
}

/* A few instances (chains, trees, lattice-like DAGs): vertex v's inputs
 * come from earlier vertices of its own instance. */
static void random_graph(rgraph *g) {
  memset(g, 0, sizeof(*g));
  g->T = 2 + (int)rnd(2);
  g->nv = 4 + (int32_t)rnd(NV_MAX - 3);
  for (int t = 0; t < g->T; t++) g->bytes[t] = 1 + rnd(4);
  int32_t inst[NV_MAX], n_inst = 1 + (int32_t)rnd(3), ne = 0;
  for (int32_t v = 0; v < g->nv; v++) {
    inst[v] = (int32_t)rnd((uint32_t)n_inst);
    g->vtype[v] = (uint8_t)rnd((uint32_t)g->T);
    g->in_start[v] = ne;
    for (int32_t u = 0; u < v; u++)
      if (inst[u] == inst[v] && rnd(3) == 0) g->in_edges[ne++] = u;
  }
  g->in_start[g->nv] = ne;
  for (int32_t v = 0; v < g->nv; v++) {
    bool read = false;
    for (int32_t e = 0; e < ne; e++) read |= g->in_edges[e] == v;
    g->keep[v] = !read && rnd(2) == 0; /* some outputs kept */
  }
}

static cn_dag dag_of(const rgraph *g) {
  cn_dag d = {g->T, g->nv, g->vtype, g->in_start, g->in_edges};
  return d;
}

/* Live bytes once the vertices of S are done: a row is live while a
 * consumer is not done, or forever when kept. */
static int64_t live_of(const rgraph *g, uint32_t S) {
  int64_t live = 0;
  for (int32_t v = 0; v < g->nv; v++) {
    if (!(S >> v & 1)) continue;
    bool alive = g->keep[v];
    for (int32_t w = 0; w < g->nv && !alive; w++)
      for (int32_t e = g->in_start[w]; e < g->in_start[w + 1]; e++)
        if (g->in_edges[e] == v && !(S >> w & 1)) alive = true;
    if (alive) live += g->bytes[g->vtype[v]];
  }
  return live;
}

static uint32_t ready_of(const rgraph *g, uint32_t S) {
  uint32_t r = 0;
  for (int32_t v = 0; v < g->nv; v++) {
    if (S >> v & 1) continue;
    bool ok = true;
    for (int32_t e = g->in_start[v]; e < g->in_start[v + 1]; e++)
      ok &= (S >> g->in_edges[e] & 1) != 0;
    if (ok) r |= 1u << v;
  }
  return r;
}

/* opt[k]: the lowest peak of any schedule of exactly k batches (INF:
 * none), k = 1 .. nv: each batch a non-empty set of ready vertices of one
 * type, its rows taken while everything before it is still held. */
static void brute_force(const rgraph *g, int64_t *opt) {
  const uint32_t full = (1u << g->nv) - 1, ns = 1u << g->nv;
  int64_t *cur = malloc(ns * sizeof(int64_t)),
          *next = malloc(ns * sizeof(int64_t)),
          *live = malloc(ns * sizeof(int64_t));
  for (uint32_t S = 0; S < ns; S++) cur[S] = INF, live[S] = live_of(g, S);
  cur[0] = 0;
  for (int k = 1; k <= g->nv; k++) {
    for (uint32_t S = 0; S < ns; S++) next[S] = INF;
    for (uint32_t S = 0; S < ns; S++) {
      if (cur[S] >= INF) continue;
      uint32_t R = ready_of(g, S);
      for (int t = 0; t < g->T; t++) {
        uint32_t Rt = 0;
        for (int32_t v = 0; v < g->nv; v++)
          if ((R >> v & 1) && g->vtype[v] == t) Rt |= 1u << v;
        for (uint32_t B = Rt; B != 0; B = (B - 1) & Rt) { /* subsets */
          int64_t add = 0;
          for (int32_t v = 0; v < g->nv; v++)
            if (B >> v & 1) add += g->bytes[t];
          int64_t p = live[S] + add > cur[S] ? live[S] + add : cur[S];
          if (p < next[S | B]) next[S | B] = p;
        }
      }
    }
    opt[k] = next[full];
    int64_t *tmp = cur;
    cur = next;
    next = tmp;
  }
  free(cur);
  free(next);
  free(live);
}

/* The peak of a schedule by the brute force's own accounting, after
 * checking it is one: every vertex once, one type a batch, inputs in
 * earlier batches. */
static int64_t checked_peak(const rgraph *g, const int32_t *order,
                            const cn_run_batch *b, int32_t nb) {
  uint32_t S = 0;
  int64_t peak = 0;
  for (int32_t k = 0; k < nb; k++) {
    cr_assert_gt(b[k].n, 0);
    uint32_t R = ready_of(g, S), B = 0;
    int64_t add = 0;
    for (int32_t i = 0; i < b[k].n; i++) {
      int32_t v = order[b[k].start + i];
      cr_assert_eq(g->vtype[v], b[k].type);
      cr_assert(R >> v & 1, "vertex %d run before its inputs", v);
      B |= 1u << v;
      add += g->bytes[b[k].type];
    }
    if (live_of(g, S) + add > peak) peak = live_of(g, S) + add;
    S |= B;
  }
  cr_assert_eq(S, (1u << g->nv) - 1, "a vertex was not run");
  return peak;
}

static int64_t best_within(const int64_t *opt, int k) {
  int64_t m = INF;
  for (int j = 1; j <= k; j++)
    if (opt[j] < m) m = opt[j];
  return m;
}

Test(dag_memory, against_brute_force, .timeout = 120) {
  int trials = 0, at_opt = 0, fits = 0, budget_trials = 0,
      fewest_batches = 0;
  double extra = 0;
  for (int trial = 0; trial < 1500; trial++) {
    rgraph g;
    random_graph(&g);
    cn_dag d = dag_of(&g);
    cn_dag_mem mem = {g.bytes, g.keep};
    int64_t opt[NV_MAX + 1];
    brute_force(&g, opt);
    int32_t order[NV_MAX + 1], order0[NV_MAX + 1], nb = 0, nb0;
    cn_run_batch batches[NV_MAX + 1], batches0[NV_MAX + 1];
    cr_assert_eq(cn__sched_dag(&d, CN_POLICY_AGENDA, NULL, 1, order, batches,
                               &nb), 0);
    nb0 = nb;
    memcpy(order0, order, sizeof(order));
    memcpy(batches0, batches, sizeof(batches));
    int64_t base = checked_peak(&g, order, batches, nb);
    cr_assert_eq(cn__dag_mem_peak(&d, &mem, order, batches, nb), base,
                 "trial %d: the model's peak of the policy's schedule", trial);
    /* no budget: the lowest peak at no more batches */
    cn_dag_mem_result res;
    cr_assert_eq(cn__dag_mem_order(&d, &mem, 0, order, batches, &nb, &res), 0);
    int64_t got = checked_peak(&g, order, batches, nb);
    cr_assert_eq(got, res.peak, "trial %d", trial);
    cr_assert_leq(nb, nb0, "trial %d: batches added without a budget", trial);
    cr_assert_leq(got, base, "trial %d: the order raised the peak", trial);
    int64_t o = best_within(opt, nb0);
    cr_assert_geq(got, o, "trial %d: below the optimum %lld", trial,
                  (long long)o);
    trials++;
    at_opt += got == o;
    /* a budget between the lowest possible peak and the policy's */
    int64_t lo = best_within(opt, g.nv);
    if (lo >= base) continue;
    int64_t budget = lo + (int64_t)rnd((uint32_t)(base - lo));
    memcpy(order, order0, sizeof(order));
    memcpy(batches, batches0, sizeof(batches));
    nb = nb0;
    cr_assert_eq(
        cn__dag_mem_order(&d, &mem, budget, order, batches, &nb, &res), 0);
    got = checked_peak(&g, order, batches, nb);
    cr_assert_eq(got, res.peak, "trial %d", trial);
    budget_trials++;
    if (!res.fits) continue;
    cr_assert_leq(got, budget, "trial %d: fits but over the budget", trial);
    int kmin = 1;
    while (opt[kmin] > budget) kmin++;
    cr_assert_geq(nb, kmin, "trial %d: fewer batches than possible", trial);
    fits++;
    fewest_batches += nb == kmin;
    extra += (double)nb / kmin;
  }
  cr_log_info("no budget: the optimum peak in %d of %d graphs; budget: fits "
              "%d of %d, the fewest batches in %d, %.3f x the fewest on "
              "average", at_opt, trials, fits, budget_trials, fewest_batches,
              fits ? extra / fits : 0);
  fprintf(stderr, "no budget: optimum in %d of %d; budget: fits %d of %d, "
          "fewest batches in %d, %.3fx on average\n", at_opt, trials, fits,
          budget_trials, fewest_batches, fits ? extra / fits : 0);
  /* Floors a little under what the search reaches today (the seed is
   * fixed: 919 of 1,500 at the optimum, 841 of 1,334 budgets met, 2026-11-27).
   * The search only moves vertices between batches of the policy's type
   * sequence and inserts batches into it; the optimum is free of it. */
  cr_expect_geq(at_opt, trials * 55 / 100);
  cr_expect_geq(fits, budget_trials * 55 / 100);
}

/* Larger random DAGs (up to a few thousand vertices, many instances,
 * with and without kept rows and budgets), where brute force is out of
 * reach: the peaks the order reports, before and after, are those
 * cn__dag_mem_peak computes on its own for the given and the returned
 * schedule; the schedule is valid (every vertex once, one type a batch,
 * inputs in earlier batches) and, without a budget, has no more batches
 * and no higher peak than the policy's. */
Test(dag_memory, large_graphs_against_the_model, .timeout = 120) {
  for (int trial = 0; trial < 300; trial++) {
    const int T = 1 + (int)rnd(4);
    const int32_t nv = 1 + (int32_t)rnd(trial % 10 == 0 ? 5000 : 400);
    uint8_t *vtype = malloc((size_t)nv), *keep = malloc((size_t)nv);
    int32_t *in_start = malloc(((size_t)nv + 1) * sizeof(int32_t));
    int32_t *in_edges = malloc((size_t)nv * 3 * sizeof(int32_t) + 1);
    int32_t ne = 0, inst = 0;
    for (int32_t v = 0; v < nv; v++) {
      if (rnd(30) == 0) inst = v; /* a new instance starts at v */
      in_start[v] = ne;
      int32_t k = v > inst ? (int32_t)rnd(4) : 0;
      for (int32_t i = 0; i < k; i++) /* lattice-like: near inputs */
        in_edges[ne++] = v - 1 - (int32_t)rnd((uint32_t)(v - inst < 6
                                                          ? v - inst : 6));
      vtype[v] = (uint8_t)(k == 0 ? 0 : rnd((uint32_t)T));
      keep[v] = rnd(5) == 0;
    }
    in_start[nv] = ne;
    int64_t bytes[4];
    for (int t = 0; t < T; t++) bytes[t] = 64 * (1 + rnd(6));
    cn_dag d = {T, nv, vtype, in_start, in_edges};
    cn_dag_mem mem = {bytes, trial % 3 == 0 ? NULL : keep};
    int32_t *order = malloc((size_t)nv * sizeof(int32_t));
    cn_run_batch *batches = malloc((size_t)nv * sizeof(cn_run_batch));
    int32_t *batch_of = malloc((size_t)nv * sizeof(int32_t));
    int32_t nb = 0;
    cr_assert_eq(cn__sched_dag(&d, trial % 2 ? CN_POLICY_AGENDA
                                             : CN_POLICY_SUFFICIENT,
                               NULL, 1, order, batches, &nb), 0);
    const int32_t nb0 = nb;
    int64_t base = cn__dag_mem_peak(&d, &mem, order, batches, nb);
    int64_t budget = trial % 4 == 3 ? base * (40 + rnd(50)) / 100 : 0;
    cn_dag_mem_result res;
    cr_assert_eq(
        cn__dag_mem_order(&d, &mem, budget, order, batches, &nb, &res), 0);
    cr_assert_eq(res.peak_before, base, "trial %d: the policy's peak", trial);
    cr_assert_eq(cn__dag_mem_peak(&d, &mem, order, batches, nb), res.peak,
                 "trial %d: the reported peak", trial);
    for (int32_t v = 0; v < nv; v++) batch_of[v] = -1;
    for (int32_t b = 0; b < nb; b++) {
      cr_assert_gt(batches[b].n, 0, "trial %d: an empty batch", trial);
      for (int32_t i = 0; i < batches[b].n; i++) {
        int32_t v = order[batches[b].start + i];
        cr_assert_eq(batch_of[v], -1, "trial %d: vertex %d twice", trial, v);
        cr_assert_eq(vtype[v], batches[b].type);
        for (int32_t e = in_start[v]; e < in_start[v + 1]; e++) {
          int32_t u = in_edges[e];
          cr_assert(batch_of[u] >= 0 && batch_of[u] < b,
                    "trial %d: vertex %d before its input %d", trial, v, u);
        }
        batch_of[v] = b;
      }
    }
    for (int32_t v = 0; v < nv; v++)
      cr_assert_geq(batch_of[v], 0, "trial %d: vertex %d not run", trial, v);
    if (budget == 0) {
      cr_assert_leq(nb, nb0, "trial %d: batches added", trial);
      cr_assert_leq(res.peak, base, "trial %d: the peak rose", trial);
    }
    free(vtype);
    free(keep);
    free(in_start);
    free(in_edges);
    free(order);
    free(batches);
    free(batch_of);
  }
}
