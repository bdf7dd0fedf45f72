/* dag_optimum.c - the fewest batches a typed DAG can run in, by search.
 *
 * The problem of ED-Batch §2.1: find the shortest sequence of types such
 * that batching, at each step, every ready vertex of the step's type runs
 * the whole graph. (Taking every ready vertex of the chosen type is no loss:
 * a larger done-set never makes a later step run less, so any schedule can
 * be made maximal without growing.) Minimising it is NP-hard in general (it
 * contains the shortest common supersequence of the DAG's paths), so this is
 * an exact search with a budget, for measuring policies, not for serving:
 *
 *   IDA* (Korf 1985) over done-sets, with
 *   - h(s) = Σ_t max over ready v of tail_t(v): the bound of docs/models.md on
 *     what is left (tail_t(v) = most type-t vertices on a path from v to a
 *     sink; every undone vertex has a ready ancestor, so the ready vertices
 *     carry the maximum). Admissible, as the bound is.
 *   - a transposition table keyed by a 128-bit Zobrist hash of the done-set,
 *     holding a proven lower bound on the batches left from that state; a
 *     state whose subtree fails under threshold L at depth g gets L - g + 1.
 *   - forced moves: when every vertex of type t left is ready, some optimal
 *     schedule runs t next (moving that batch first only enlarges every
 *     later done-set), so t is the only child.
 *   - types that feed nothing (outputs) are children only when no type
 *     that feeds something is ready (cn__dag_feeding_types): on the
 *     held-out lattices, 6M states prove 1,052 instead of 1,049; the
 *     treelstm-2type optimum takes 5,657 states instead of 28,428.
 *
 * When the budget runs out the search reports what it proved: the optimum
 * is at least the last threshold it exhausted (never below the bound). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched_api.h"

typedef struct tt_entry {
  uint64_t k1, k2;
  int32_t lb; /* 0: empty */
} tt_entry;

typedef struct opt_search {
  const cn_dag *g;
  int T;
  int32_t nv;
  int32_t *out_start, *out_edges; /* CSR of consumers */
  uint32_t feeds;                 /* cn__dag_feeding_types */
  int32_t *tail;                  /* nv × T */
  int32_t *pending;               /* inputs not yet done */
  int32_t *ready[CN_MAX_TYPES];   /* ready vertices of each type (stacks) */
  int32_t len[CN_MAX_TYPES];
  int32_t left[CN_MAX_TYPES];     /* undone vertices of each type */
  int32_t *trail;                 /* committed batches, innermost last */
  int32_t trail_n;
  uint64_t *z1, *z2, k1, k2;
  tt_entry *tt;
  uint64_t tt_mask;
  long long nodes, budget;
  int32_t next_threshold;
  uint8_t *path; /* the types of the solution found */
  int32_t path_cap;
} opt_search;

/* best[t] = max(best[t], tail_t(v)) over the n vertices of vs, skipping
 * those of type skip (-1: none). */
static void max_tails(const opt_search *s, const int32_t *vs, int32_t n,
                      int skip, int32_t *best) {
  int T = s->T;
  for (int32_t i = 0; i < n; i++) {
    if (s->g->vtype[vs[i]] == skip) continue;
    const int32_t *tl = s->tail + (size_t)vs[i] * T;
    for (int t = 0; t < T; t++)
      if (tl[t] > best[t]) best[t] = tl[t];
  }
}

static int32_t sum_of(const int32_t *best, int T) {
  int32_t h = 0;
  for (int t = 0; t < T; t++) h += best[t];
  return h;
}

static int32_t heuristic(const opt_search *s) {
  int32_t best[CN_MAX_TYPES] = {0};
  for (int a = 0; a < s->T; a++) max_tails(s, s->ready[a], s->len[a], -1, best);
  return sum_of(best, s->T);
}

/* Runs every ready type-t vertex; returns the batch's size. The batch goes
 * on the trail with its size after it, so undo() can pop it. */
static int32_t commit(opt_search *s, int t) {
  int32_t n = s->len[t], at = s->trail_n;
  memcpy(s->trail + at, s->ready[t], (size_t)n * sizeof(int32_t));
  s->len[t] = 0;
  s->left[t] -= n;
  for (int32_t i = 0; i < n; i++) {
    int32_t v = s->trail[at + i];
    s->k1 ^= s->z1[v];
    s->k2 ^= s->z2[v];
    for (int32_t e = s->out_start[v]; e < s->out_start[v + 1]; e++) {
      int32_t u = s->out_edges[e];
      if (--s->pending[u] == 0) {
        int tu = s->g->vtype[u];
        s->ready[tu][s->len[tu]++] = u;
      }
    }
  }
  s->trail[at + n] = n;
  s->trail_n = at + n + 1;
  return n;
}

static void undo(opt_search *s, int t) {
  int32_t n = s->trail[s->trail_n - 1], at = s->trail_n - 1 - n;
  for (int32_t i = n - 1; i >= 0; i--) {
    int32_t v = s->trail[at + i];
    s->k1 ^= s->z1[v];
    s->k2 ^= s->z2[v];
    for (int32_t e = s->out_start[v + 1] - 1; e >= s->out_start[v]; e--) {
      int32_t u = s->out_edges[e];
      if (s->pending[u]++ == 0) s->len[s->g->vtype[u]]--;
    }
  }
  memcpy(s->ready[t], s->trail + at, (size_t)n * sizeof(int32_t));
  s->len[t] = n;
  s->left[t] += n;
  s->trail_n = at;
}

static tt_entry *tt_slot(opt_search *s) {
  uint64_t i = s->k1 & s->tt_mask;
  for (int probe = 0; probe < 8; probe++) {
    tt_entry *e = &s->tt[(i + (uint64_t)probe) & s->tt_mask];
    if (e->lb == 0 || (e->k1 == s->k1 && e->k2 == s->k2)) return e;
  }
  return &s->tt[i]; /* full neighbourhood: replace */
}

static int32_t tt_lookup(opt_search *s) {
  tt_entry *e = tt_slot(s);
  return e->lb != 0 && e->k1 == s->k1 && e->k2 == s->k2 ? e->lb : 0;
}

static void tt_store(opt_search *s, int32_t lb) {
  tt_entry *e = tt_slot(s);
  if (e->k1 == s->k1 && e->k2 == s->k2 && e->lb >= lb) return;
  e->k1 = s->k1;
  e->k2 = s->k2;
  e->lb = lb;
}

enum { FOUND = 1, NOT_FOUND = 0, OUT_OF_BUDGET = -1 };

/* Depth-first under threshold L at depth g; placed: vertices done. */
static int dfs(opt_search *s, int32_t g, int32_t L, int32_t placed) {
  if (placed == s->nv) return FOUND;
  if (++s->nodes > s->budget) return OUT_OF_BUDGET;
  int32_t h = heuristic(s), known = tt_lookup(s);
  if (known > h) h = known;
  if (g + h > L) {
    if (g + h < s->next_threshold) s->next_threshold = g + h;
    return NOT_FOUND;
  }
  int T = s->T, forced = -1, nc = 0;
  int cand[CN_MAX_TYPES];
  int64_t key[CN_MAX_TYPES];
  uint32_t live = 0; /* ready types */
  for (int t = 0; t < T; t++) {
    if (s->len[t] > 0) live |= 1u << t;
    if (forced < 0 && s->len[t] > 0 && s->len[t] == s->left[t]) forced = t;
  }
  uint32_t allowed = cn__dag_branch_types(live, forced, s->feeds);
  for (int t = 0; t < T; t++) {
    if (!(allowed >> t & 1)) continue;
    commit(s, t);
    int32_t ht = heuristic(s), kt = tt_lookup(s);
    undo(s, t);
    /* Most promising child first: least f, then the larger batch. */
    key[nc] = (int64_t)(ht > kt ? ht : kt) * (1 << 30) - s->len[t];
    cand[nc++] = t;
  }
  for (int i = 1; i < nc; i++) /* insertion sort, nc ≤ CN_MAX_TYPES */
    for (int j = i; j > 0 && key[j] < key[j - 1]; j--) {
      int64_t k = key[j];
      key[j] = key[j - 1];
      key[j - 1] = k;
      int c = cand[j];
      cand[j] = cand[j - 1];
      cand[j - 1] = c;
    }
  for (int i = 0; i < nc; i++) {
    int t = cand[i];
    int32_t n = commit(s, t);
    int rc = dfs(s, g + 1, L, placed + n);
    undo(s, t);
    if (rc == FOUND) {
      if (g < s->path_cap) s->path[g] = (uint8_t)t;
      return FOUND;
    }
    if (rc == OUT_OF_BUDGET) return rc;
  }
  tt_store(s, L - g + 1);
  return NOT_FOUND;
}

static void opt_free(opt_search *s) {
  free(s->out_start);
  free(s->out_edges);
  free(s->tail);
  free(s->pending);
  free(s->trail);
  free(s->z1);
  free(s->z2);
  free(s->tt);
  free(s->path);
  for (int t = 0; t < s->T; t++) free(s->ready[t]);
}

/* The search state of g with nothing done; tt_cap 0: no table. */
static int opt_init(opt_search *s, const cn_dag *g, size_t tt_cap) {
  int T = g->n_types;
  int32_t nv = g->nv;
  memset(s, 0, sizeof(*s));
  s->g = g;
  s->T = T;
  s->nv = nv;
  int rc = cn__dag_consumers(g, &s->out_start, &s->out_edges);
  s->tail = cn__xcalloc((size_t)nv * (size_t)T, sizeof(int32_t));
  s->pending = cn__xcalloc((size_t)nv + 1, sizeof(int32_t));
  s->trail = cn__xcalloc(2 * (size_t)nv + 1, sizeof(int32_t));
  s->z1 = cn__xcalloc((size_t)nv + 1, sizeof(uint64_t));
  s->z2 = cn__xcalloc((size_t)nv + 1, sizeof(uint64_t));
  s->tt = tt_cap ? cn__xcalloc(tt_cap, sizeof(tt_entry)) : NULL;
  s->path_cap = nv;
  s->path = cn__xcalloc((size_t)nv + 1, 1);
  bool ok = rc == 0 && s->tail && s->pending &&
            s->trail && s->z1 && s->z2 && (s->tt || !tt_cap) && s->path;
  for (int t = 0; ok && t < T; t++) {
    s->ready[t] = cn__xcalloc((size_t)nv + 1, sizeof(int32_t));
    ok = s->ready[t] != NULL;
  }
  if (!ok) {
    opt_free(s);
    return CN_E_NOMEM;
  }
  s->tt_mask = tt_cap ? tt_cap - 1 : 0;
  /* Pending counts, initial ready set, Zobrist keys. */
  uint64_t seed = 0x63616e6f7079ull;
  for (int32_t v = 0; v < nv; v++) {
    int t = g->vtype[v];
    s->pending[v] = g->in_start[v + 1] - g->in_start[v];
    s->left[t]++;
    if (s->pending[v] == 0) s->ready[t][s->len[t]++] = v;
    s->z1[v] = cn__splitmix64(&seed);
    s->z2[v] = cn__splitmix64(&seed);
  }
  cn__dag_fill_tails(g, s->out_start, s->out_edges, s->tail);
  s->feeds = cn__dag_feeding_types(g);
  return 0;
}

int cn__dag_optimum(const cn_dag *g, long long budget, cn_dag_optimum *res) {
  memset(res, 0, sizeof(*res));
  res->lower = cn__dag_lower_bound(g);
  if (res->lower < 0) return CN_E_NOMEM;
  if (g->nv == 0) {
    res->exact = 1;
    return 0;
  }
  opt_search s;
  int rc = opt_init(&s, g, (size_t)1 << 20);
  if (rc != 0) return rc;
  s.budget = budget;
  int32_t L = heuristic(&s);
  for (;;) {
    s.next_threshold = INT32_MAX;
    int r = dfs(&s, 0, L, 0);
    if (r == FOUND) {
      res->lower = res->upper = L;
      res->exact = 1;
      res->schedule = s.path;
      s.path = NULL;
      break;
    }
    if (r == OUT_OF_BUDGET || s.next_threshold == INT32_MAX) {
      /* Every threshold below L was exhausted. */
      if (L > res->lower) res->lower = L;
      if (r != OUT_OF_BUDGET) rc = CN_E_INTERNAL; /* a DAG always finishes */
      break;
    }
    L = s.next_threshold;
  }
  res->nodes = s.nodes;
  opt_free(&s);
  return rc;
}
