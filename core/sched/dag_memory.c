/* dag_memory.c - a batch order by memory: the lowest peak of live state
 * bytes at the batch count a policy reached, or the fewest extra batches
 * that bring the peak under a budget (docs/memory.md).
 *
 * Serenity (Ahn et al., MLSys 2020) orders single nodes: a dynamic program
 * over zero-indegree sets (§3.1), pruned by an adaptive soft budget
 * (§3.2). A run here has tens of thousands of vertices executed in a few
 * dozen batches, so the state space of §3.1 is out of reach; what carries
 * over is its cost model and its budget:
 *
 *   - the memory model is §3.1's: a vertex's row is allocated when its
 *     batch runs and deallocated once the batch of its last consumer has
 *     run (its out-degree counted down to zero), unless it is read after
 *     the run (`keep`). A batch's rows are taken while its inputs are
 *     still held, so the step's footprint is the live bytes before it
 *     plus its own rows: exactly what core/run/run_arena.c allocates;
 *   - the search is over *skeletons*: a sequence of vertex types, one per
 *     batch. The policy's schedule gives the first (the batch count to
 *     keep); a vertex may run in any batch of its type after its inputs'
 *     batches and before its consumers'. Given a skeleton, every vertex
 *     gets its latest such batch (its deadline, computed from the sinks
 *     back); the skeleton is then walked forwards and each batch runs the
 *     vertices whose deadline it is, plus those ready ones that free more
 *     than they take (a parent whose children die with it), while the
 *     step stays under the soft budget (§3.2's role: it prunes choices
 *     that would raise the peak). Everything else waits: a leaf is
 *     computed just before the batch that reads it, a short sentence is
 *     started late so that it ends with the longest one;
 *   - under a budget, batches are inserted into the skeleton greedily:
 *     at each step every vertex type at a sample of positions (all of
 *     them for short skeletons), keeping the insertion that lowers the
 *     peak most (ties: the smaller sum of live bytes over the batches).
 *     A leaf batch inserted halfway lets the shallow trees' leaves wait
 *     for it, and so on;
 *   - when insertions cannot bring the peak under the budget before the
 *     batch count doubles, the instances (weakly connected components)
 *     are split into G groups run one after another, each on a copy of
 *     the skeleton, G = 2, 4, ... up to one instance at a time; and if
 *     one instance alone does not fit, the run does not.
 *
 * Nothing here depends on the numbers computed: rows are independent
 * computations and each batched product computes a row the same way
 * wherever it sits (the batch-invariance tests), so any valid schedule
 * gives the same outputs byte for byte (tests/test_arena.c checks it).
 * tests/test_dag_memory.c checks the model against brute force on small
 * graphs: the fewest batches under a budget and the lowest peak at a
 * batch count over every schedule.
 */
#include <stdlib.h>
#include <string.h>

#include "sched/sched_api.h"

/* What the walks read and write of one vertex, side by side: a batch
 * takes one vertex of each instance, so each vertex the early walk
 * (eval_early) touches costs a cache line per array; with these in one
 * place it costs one line for all four. deadlines() sets them. */
typedef struct mvert {
  int32_t pend;  /* inputs not yet taken */
  int32_t rem;   /* readers not yet taken */
  int32_t pos;   /* its position, -1 until taken: the early walk's plan */
  int32_t dl;    /* its deadline: the ALAP plan */
} mvert;

/* How many places ahead in a list of vertices the early walk asks for a
 * vertex's line (the list is known before it is walked; one vertex of
 * each instance is a miss each). */
#define PF_AHEAD 8

/* vflag[v]: v's type in the low bits, and these. */
#define VF_TYPE 0x0f
#define VF_KEPT 0x10 /* read after the run (keep) */
#define VF_CAND 0x20 /* could ever run early (gain > 0) */
#define VF_FREES (VF_TYPE | VF_KEPT)
_Static_assert(CN_MAX_TYPES <= VF_TYPE + 1, "a type fits VF_TYPE");

typedef struct mplan {
  const cn_dag *g;
  const cn_dag_mem *m;
  int T;
  int32_t nv;
  int32_t *out_start, *out_edges; /* consumers, one per input edge */
  int32_t *comp, n_comp;          /* instances (computed for G > 1) */
  int32_t *group;                 /* [v]: its group (G > 1), else NULL */
  int32_t K0;                     /* one group's skeleton length */
  /* pos[] and dl[]: scratch of nv (bo[], the insertions' positions) */
  int32_t *dl, *pos, *rdy, *take, *prev;
  /* [v]: the last walk's state. The ALAP schedule is vx[v].dl (its
   * deadline), the early walk's vx[v].pos; at_dl: best_on kept ALAP's. */
  mvert *vx;
  bool at_dl;
  uint8_t *vflag;                 /* [v]: type, VF_KEPT, VF_CAND */
  /* fbt[vflag & VF_FREES]: the bytes a row frees when its last reader is
   * taken: its type's, 0 when kept */
  int64_t fbt[VF_FREES + 1];
  int32_t rbase[CN_MAX_TYPES + 1]; /* where type t's ready list starts */
  const uint8_t *skel;            /* the skeleton being walked */
  int32_t *kcnt;                  /* [position]: rows due (deadlines) */
  int32_t *kn;                    /* [position]: rows the early walk took */
  /* The vertices due at each position, in the order they became ready:
   * due[dhead[p] .. dtail[p]) (eval_early) */
  int32_t *dhead, *dtail, *due;
  int64_t *kfreed;                /* [position]: bytes ALAP frees after it */
  /* bo[v]: v's batch in the policy's schedule (nb0 batches), read by
   * the first deadlines(), which adds the bytes freed after each batch
   * into pdies[] (a row dies after its last reader's batch, its own when
   * none, or at nb0 when kept); NULL after it */
  const int32_t *bo;
  int32_t nb0;
  int64_t *pdies;
  bool pdone; /* pdies[] complete (no vertex without a deadline) */
  int32_t *srcs;                  /* sources (no inputs), by group */
  int32_t n_srcs;                 /* how many (listed by plan_setup) */
  int32_t *src_start;             /* [G + 1] */
  long long evals;
} mplan;

static int64_t vbytes(const mplan *P, int32_t v) {
  return P->m->bytes[P->g->vtype[v]];
}

/* The bytes v's row frees when its last reader is taken (0: kept), from
 * its flag byte. */
static inline int64_t freed_bytes(const mplan *P, int32_t v) {
  return P->fbt[P->vflag[v] & VF_FREES];
}

/* Groups of consecutive components, G of them of equal vertex counts;
 * the sources listed by group. */
static int set_groups(mplan *P, int32_t G) {
  free(P->group);
  P->group = NULL;
  free(P->src_start);
  P->src_start = calloc((size_t)G + 2, sizeof(int32_t));
  if (P->src_start == NULL) return CN_E_NOMEM;
  if (G == 1) { /* one group: plan_setup listed the sources */
    P->src_start[1] = P->n_srcs;
    return 0;
  }
  if (G > 1) {
    P->group = malloc((size_t)P->nv * sizeof(int32_t) + 1);
    if (P->group == NULL) return CN_E_NOMEM;
    int32_t *cg = malloc((size_t)P->n_comp * sizeof(int32_t) + 1);
    int64_t *csize = calloc((size_t)P->n_comp + 1, sizeof(int64_t));
    if (P->group == NULL || cg == NULL || csize == NULL) {
      free(cg);
      free(csize);
      return CN_E_NOMEM;
    }
    for (int32_t v = 0; v < P->nv; v++) csize[P->comp[v]]++;
    int64_t acc = 0;
    for (int32_t c = 0; c < P->n_comp; c++) {
      int64_t k = acc * G / P->nv; /* the group where c starts */
      cg[c] = (int32_t)(k < G ? k : G - 1);
      acc += csize[c];
    }
    for (int32_t v = 0; v < P->nv; v++) P->group[v] = cg[P->comp[v]];
    free(cg);
    free(csize);
  }
  for (int32_t v = 0; v < P->nv; v++)
    if (P->g->in_start[v] == P->g->in_start[v + 1])
      P->src_start[(P->group ? P->group[v] : 0) + 1]++;
  for (int32_t k = 0; k < G; k++) P->src_start[k + 1] += P->src_start[k];
  int32_t *fill = malloc((size_t)(G + 1) * sizeof(int32_t));
  if (fill == NULL) return CN_E_NOMEM;
  memcpy(fill, P->src_start, (size_t)(G + 1) * sizeof(int32_t));
  for (int32_t v = 0; v < P->nv; v++)
    if (P->g->in_start[v] == P->g->in_start[v + 1])
      P->srcs[fill[P->group ? P->group[v] : 0]++] = v;
  free(fill);
  return 0;
}

/* ---- one skeleton ------------------------------------------------------ */

typedef struct outcome {
  int64_t peak, area; /* the most live bytes at a batch; their sum */
  int32_t batches;    /* non-empty batches */
  int32_t at;         /* the position of the (first) peak */
  bool ok;            /* every vertex found a batch */
} outcome;

/* The deadlines of skeleton skel[0 .. K) (the file's comment): vx[v].dl,
 * the latest batch of v's type before its consumers' deadlines (and
 * within its group's copy when grouped, G > 1). False when some vertex
 * has none. One pass from the sinks back, O(V + E + K·T), which also does
 * what both walks need of every vertex: kcnt[p], the vertices due at p;
 * kfreed[p], the bytes freed after p when every vertex runs at its
 * deadline (a row dies after its last reader's batch, after its own when
 * it has none, never when kept); and the early walk's counts (vx[v]). */
__attribute__((always_inline)) static inline bool
deadlines_(mplan *P, const uint8_t *skel, int32_t K, const bool grouped,
           const bool policy) {
  const int32_t *bo = P->bo, nb0 = P->nb0;
  int64_t *pdies = P->pdies;
  const int64_t *pbytes = P->m->bytes;
  const int32_t *os = P->out_start, *oe = P->out_edges;
  const int32_t *is = P->g->in_start, *grp = P->group;
  const uint8_t *vflag = P->vflag;
  const int64_t *fbt = P->fbt;
  const int32_t K0 = P->K0;
  mvert *vx = P->vx;
  int32_t *cnt = P->kcnt;
  int64_t *freed = P->kfreed;
  /* prev[t][p]: the last type-t position before p, -1 none */
  const int32_t *prev[CN_MAX_TYPES];
  for (int t = 0; t < P->T; t++) {
    int32_t last = -1, *pv = P->prev + (size_t)t * (K + 1);
    for (int32_t p = 0; p <= K; p++) {
      pv[p] = last;
      if (p < K && skel[p] == t) last = p;
    }
    prev[t] = pv;
  }
  memset(cnt, 0, ((size_t)K + 1) * sizeof(int32_t));
  memset(freed, 0, (size_t)K * sizeof(int64_t));
  int32_t e_end = os[P->nv];
  for (int32_t v = P->nv - 1; v >= 0; v--) {
    const int32_t e0 = os[v];
    int32_t lim = grouped ? (grp[v] + 1) * K0 : K;
    int32_t death = -1; /* the last reader's deadline */
    int32_t pd = policy ? bo[v] : 0; /* its death in the policy's plan */
    for (int32_t e = e0; e < e_end; e++) {
      const int32_t c = oe[e], dc = vx[c].dl;
      if (dc < lim) lim = dc;
      if (dc > death) death = dc;
      if (policy && bo[c] > pd) pd = bo[c];
    }
    const uint8_t f = vflag[v];
    if (policy) pdies[f & VF_KEPT ? nb0 : pd] += pbytes[f & VF_TYPE];
    int32_t d = prev[f & VF_TYPE][lim];
    if (d < 0 || (grouped && d < grp[v] * K0)) return false;
    vx[v] = (mvert){is[v + 1] - is[v], e_end - e0, -1, d};
    cnt[d]++;
    freed[death >= 0 ? death : d] += fbt[f & VF_FREES];
    e_end = e0;
  }
  return true;
}

static bool deadlines(mplan *P, const uint8_t *skel, int32_t K) {
  if (P->bo != NULL) { /* the first: one group, the policy's skeleton */
    P->pdone = deadlines_(P, skel, K, false, true);
    P->bo = NULL;
    return P->pdone;
  }
  return P->group ? deadlines_(P, skel, K, true, false)
                  : deadlines_(P, skel, K, false, false);
}

/* The walk with every vertex at its deadline (as late as possible), given
 * valid deadlines: each batch holds exactly the vertices due there (their
 * inputs, due earlier, have run), so no ready list is needed; deadlines()
 * counted what each batch takes and frees. O(K); the same outcome as
 * walking the batches, its schedule vx[v].dl. */
static outcome eval_alap(mplan *P, int32_t K) {
  outcome o = {0, 0, 0, 0, true};
  P->evals++;
  const int32_t *cnt = P->kcnt;
  const int64_t *freed = P->kfreed;
  int64_t live = 0;
  for (int32_t p = 0; p < K; p++) {
    if (cnt[p] == 0) continue;
    o.batches++;
    int64_t step = live + (int64_t)cnt[p] * P->m->bytes[P->skel[p]];
    if (step > o.peak) o.peak = step, o.at = p;
    live = step - freed[p];
    o.area += live;
  }
  return o;
}

/* The early walk's working set (eval_early): the plan's arrays in a
 * local, so that the compiler keeps them and the counters in registers
 * instead of reloading them from the plan after every store. */
typedef struct walk {
  mvert *vx;
  const int32_t *is, *ie; /* the inputs */
  const uint8_t *vflag;
  const int64_t *bytes, *fbt;
  int32_t *due, *dtail, *rdy, *take;
  int32_t nt;                                /* take[0 .. nt): the batch */
  int32_t rb[CN_MAX_TYPES], rn[CN_MAX_TYPES]; /* type t's ready list */
} walk;

/* The bytes u's row frees when its last reader is taken (0: kept). */
__attribute__((always_inline)) static inline int64_t
walk_freed(const walk *w, int32_t u) {
  return w->fbt[w->vflag[u] & VF_FREES];
}

/* v joins the batch being formed (position p): its inputs have one
 * reader fewer left; returns the bytes of those it was the last reader
 * of. */
__attribute__((always_inline)) static inline int64_t take(walk *w, int32_t v,
                                                          int32_t p) {
  int64_t freed = 0;
  w->take[w->nt++] = v;
  w->vx[v].pos = p;
  for (int32_t e = w->is[v]; e < w->is[v + 1]; e++) {
    int32_t u = w->ie[e];
    if (--w->vx[u].rem == 0) freed += walk_freed(w, u);
  }
  return freed;
}

/* v became ready: due at its deadline, and a candidate to run earlier
 * when its inputs could ever free more than it takes (VF_CAND). */
__attribute__((always_inline)) static inline void push_ready(walk *w,
                                                             int32_t v) {
  w->due[w->dtail[w->vx[v].dl]++] = v;
  uint8_t f = w->vflag[v];
  if (f & VF_CAND) {
    int t = f & VF_TYPE;
    w->rdy[w->rb[t] + w->rn[t]++] = v;
  }
}

/* The walk forwards with early runs: each batch runs the vertices due
 * there, then those ready ones of its type that free more than they take
 * while the step stays under cap (the file's comment), in the order they
 * became ready. Right after deadlines(); writes vx[v].pos. The due
 * vertices come from buckets by deadline; the candidates for an early
 * run from a list per type that holds only vertices whose inputs could
 * ever free more than they take (cand) and is scanned only when the cap
 * leaves room for one more row: the same choices as scanning every ready
 * vertex at every batch. A step over stop ends the walk (not ok): a plan
 * that peaks there loses to the one that set it. */
static outcome eval_early(mplan *P, int32_t K, int64_t cap, int64_t stop) {
  const cn_dag *g = P->g;
  const uint8_t *skel = P->skel;
  outcome o = {0, 0, 0, 0, false};
  walk w = {.vx = P->vx, /* set by deadlines() */
            .is = g->in_start,
            .ie = g->in_edges,
            .vflag = P->vflag,
            .bytes = P->m->bytes,
            .fbt = P->fbt,
            .due = P->due,
            .dtail = P->dtail,
            .rdy = P->rdy,
            .take = P->take};
  mvert *vx = w.vx;
  const int32_t *is = w.is, *ie = w.ie, *os = P->out_start,
                *oe = P->out_edges, *dhead = P->dhead, *take_ = w.take;
  const int32_t *due = w.due;
  int32_t *kn = P->kn;
  for (int t = 0; t < P->T; t++) w.rb[t] = P->rbase[t], w.rn[t] = 0;
  P->evals++;
  /* each position's bucket: room for the vertices whose deadline it is */
  P->dhead[0] = 0;
  for (int32_t p = 0; p < K; p++) {
    P->dhead[p + 1] = P->dhead[p] + P->kcnt[p];
    w.dtail[p] = P->dhead[p];
  }
  int64_t live = 0;
  int32_t done = 0;
  for (int32_t p = 0; p < K; p++) {
    if (p % P->K0 == 0) { /* a group's sources become ready */
      int32_t k = p / P->K0;
      for (int32_t i = P->src_start[k]; i < P->src_start[k + 1]; i++)
        push_ready(&w, P->srcs[i]);
    }
    const int t = skel[p];
    const int64_t wt = w.bytes[t];
    int64_t freed = 0;
    w.nt = 0;
    for (int32_t j = dhead[p], je = w.dtail[p]; j < je; j++) {
      int32_t v = due[j]; /* due now */
      __builtin_prefetch(&vx[due[j + PF_AHEAD]], 1);
      if (vx[v].pos < 0) freed += take(&w, v, p);
    }
    int32_t *q = w.rdy + w.rb[t], n = w.rn[t];
    /* the batch may grow while live + (nt + 1)·wt <= cap: to room rows */
    const int64_t room = live > cap ? -1 : wt > 0 ? (cap - live) / wt
                                                  : INT64_MAX;
    if (n > 0 && w.nt + 1 <= room) {
      int32_t kept_n = 0, i = 0;
      for (; i < n; i++) {
        int32_t v = q[i];
        __builtin_prefetch(&vx[q[i + PF_AHEAD]]);
        if (vx[v].pos >= 0) continue; /* ran at or before its deadline */
        if (w.nt + 1 > room) break; /* no room */
        int64_t gain = -wt;
        for (int32_t e = is[v]; e < is[v + 1]; e++) {
          int32_t u = ie[e];
          if (vx[u].rem == 1) gain += walk_freed(&w, u);
        }
        if (gain > 0)
          freed += take(&w, v, p);
        else
          q[kept_n++] = v;
      }
      memmove(q + kept_n, q + i, (size_t)(n - i) * sizeof(int32_t));
      w.rn[t] = kept_n + (n - i);
    }
    const int32_t nt = w.nt;
    kn[p] = nt;
    if (nt == 0) continue;
    o.batches++;
    int64_t step = live + (int64_t)nt * wt;
    if (step > o.peak) o.peak = step, o.at = p;
    if (step > stop) return o; /* o.ok: false */
    live = step - freed;
    for (int32_t i = 0; i < nt; i++) {
      int32_t v = take_[i];
      /* the consumers' place of a vertex ahead (PF_AHEAD): the batch is
       * known; prefetches change nothing */
      __builtin_prefetch(&os[take_[i + PF_AHEAD]]);
      if (vx[v].rem == 0) live -= walk_freed(&w, v); /* nobody reads it */
      for (int32_t e = os[v]; e < os[v + 1]; e++) {
        int32_t c = oe[e];
        if (--vx[c].pend == 0) push_ready(&w, c);
      }
    }
    o.area += live;
    done += nt;
  }
  o.ok = done == P->nv;
  return o;
}

/* Walks skeleton skel[0 .. K): deadlines from the sinks back, then the
 * batches forwards (the file's comment). early: run a ready vertex before
 * its deadline when it frees more than it takes and the step stays under
 * cap. Group k (G > 1) owns skel[k·K0 .. (k + 1)·K0). Writes vx[]. */
static outcome eval(mplan *P, const uint8_t *skel, int32_t K, bool early,
                    int64_t cap) {
  outcome none = {0, 0, 0, 0, false};
  P->skel = skel;
  if (!deadlines(P, skel, K)) {
    P->evals++;
    return none;
  }
  return early ? eval_early(P, K, cap, INT64_MAX) : eval_alap(P, K);
}

/* Where best_on's plan runs v: its deadline (ALAP) or the early walk's
 * batch. */
static inline int32_t vpos(const mplan *P, int32_t v) {
  return P->at_dl ? P->vx[v].dl : P->vx[v].pos;
}

/* The schedule of best_on's plan (positions < K) into order/batches,
 * empty positions dropped; returns the batch count. The rows at each
 * position are its walk's: kcnt (ALAP: those due there) or kn. */
static int32_t write_schedule(const mplan *P, const uint8_t *skel, int32_t K,
                              int32_t *order, cn_run_batch *batches) {
  const int32_t *n = P->at_dl ? P->kcnt : P->kn;
  int32_t *at = malloc(((size_t)K + 1) * sizeof(int32_t));
  if (at == NULL) return -1;
  int32_t nb = 0, off = 0;
  for (int32_t p = 0; p < K; p++) {
    at[p] = off;
    if (n[p] > 0) batches[nb++] = (cn_run_batch){skel[p], off, n[p]};
    off += n[p];
  }
  const mvert *vx = P->vx;
  if (P->at_dl)
    for (int32_t v = 0; v < P->nv; v++) order[at[vx[v].dl]++] = v;
  else
    for (int32_t v = 0; v < P->nv; v++) order[at[vx[v].pos]++] = v;
  free(at);
  return nb;
}

static bool better(outcome a, outcome b) { /* a better than b */
  if (!a.ok) return false;
  if (!b.ok) return true;
  if (a.peak != b.peak) return a.peak < b.peak;
  if (a.batches != b.batches) return a.batches < b.batches;
  return a.area < b.area;
}

/* The better of ALAP and early-under-cap on skel (cap: the budget, or
 * ALAP's own peak when there is none); vpos() gives its schedule (both
 * stay in vx[]: ALAP's in dl, the early walk's in pos). */
static outcome best_on(mplan *P, const uint8_t *skel, int32_t K,
                       int64_t budget) {
  outcome a = eval(P, skel, K, false, 0);
  int64_t cap = budget > 0 ? budget : a.ok ? a.peak : INT64_MAX;
  /* the same deadlines as a's: walked again only when they are valid,
   * and no further than a's peak (a walk over it cannot be better) */
  outcome b = a;
  b.ok = false;
  if (a.ok) b = eval_early(P, K, cap, a.peak);
  else P->evals++;
  P->at_dl = !better(b, a);
  return P->at_dl ? a : b;
}

/* death[v]: the position of v's last reader (its own without one), or
 * `end` when the answers read it after the run; pos[v]: v's position. */
static void fill_deaths(const cn_dag *g, const cn_dag_mem *m,
                        const int32_t *pos, int32_t end, int32_t *death) {
  for (int32_t v = 0; v < g->nv; v++) death[v] = pos[v];
  for (int32_t v = 0; v < g->nv; v++)
    for (int32_t e = g->in_start[v]; e < g->in_start[v + 1]; e++)
      if (pos[v] > death[g->in_edges[e]]) death[g->in_edges[e]] = pos[v];
  for (int32_t v = 0; m->keep != NULL && v < g->nv; v++)
    if (m->keep[v]) death[v] = end;
}

int64_t cn__dag_mem_peak(const cn_dag *g, const cn_dag_mem *m,
                         const int32_t *order, const cn_run_batch *batches,
                         int32_t nb) {
  int32_t *bo = calloc((size_t)g->nv + 1, sizeof(int32_t));
  int32_t *death = malloc((size_t)g->nv * sizeof(int32_t) + 1);
  int64_t *dies = calloc((size_t)nb + 1, sizeof(int64_t));
  int64_t peak = -1;
  if (bo == NULL || death == NULL || dies == NULL) goto out;
  for (int32_t b = 0; b < nb; b++)
    for (int32_t i = 0; i < batches[b].n; i++)
      bo[order[batches[b].start + i]] = b;
  fill_deaths(g, m, bo, nb, death);
  for (int32_t v = 0; v < g->nv; v++) dies[death[v]] += m->bytes[g->vtype[v]];
  int64_t live = 0;
  peak = 0;
  for (int32_t b = 0; b < nb; b++) {
    live += (int64_t)batches[b].n * m->bytes[batches[b].type];
    if (live > peak) peak = live;
    live -= dies[b];
  }
out:
  free(bo);
  free(death);
  free(dies);
  return peak;
}

/* Inserts type t at position p of skel[0 .. K) into out. */
static void with_insert(const uint8_t *skel, int32_t K, int t, int32_t p,
                        uint8_t *out) {
  memcpy(out, skel, (size_t)p);
  out[p] = (uint8_t)t;
  memcpy(out + p + 1, skel + p, (size_t)(K - p));
}

/* How many positions the insertion search tries per type at first (then
 * as many again around the best of them); the types tried are the two
 * whose batches could take the most bytes off the peak (waiting_at_peak). */
#define SAMPLE 12

/* For the peak batch `at` of pos[] (positions < K): waiting[t], bytes of
 * type-t rows live there that were computed before it (a type-t batch
 * inserted later could defer them); freeing[t], bytes of those rows read
 * by a type-t vertex after the peak (a type-t batch inserted earlier
 * could free them). death: room for nv. */
static void waiting_at_peak(const mplan *P, int32_t K, int32_t at,
                            int32_t *death, int64_t *waiting,
                            int64_t *freeing) {
  const cn_dag *g = P->g;
  memset(waiting, 0, sizeof(int64_t) * (size_t)P->T);
  memset(freeing, 0, sizeof(int64_t) * (size_t)P->T);
  fill_deaths(g, P->m, P->pos, K, death);
  for (int32_t v = 0; v < P->nv; v++) {
    if (P->pos[v] >= at || death[v] < at) continue;
    waiting[g->vtype[v]] += vbytes(P, v);
    uint32_t seen = 0;
    for (int32_t e = P->out_start[v]; e < P->out_start[v + 1]; e++) {
      int32_t c = P->out_edges[e];
      if (P->pos[c] > at && !(seen >> g->vtype[c] & 1)) {
        seen |= 1u << g->vtype[c];
        freeing[g->vtype[c]] += vbytes(P, v);
      }
    }
  }
}

/* The plan's scratch, sized for g's vertices, and in one pass over the
 * input edges what every walk reads of a vertex: its consumers (as
 * cn__dag_consumers lists them), its flags (VF_CAND: an early run frees
 * at most its inputs' rows, those not kept, so a vertex whose inputs
 * cannot outweigh its own row never runs early), where each type's
 * ready list starts (rbase), the sources (for one group); and bo[v], v's
 * batch in the policy's schedule (order, batches[0 .. nb)), from which
 * the first deadlines() adds up the policy's peak. -1: out of memory
 * (what was allocated is freed with the plan). */
static int plan_setup(mplan *P, const int32_t *order,
                      const cn_run_batch *batches, int32_t nb) {
  const cn_dag *g = P->g;
  const int32_t nv = g->nv, *is = g->in_start, *ie = g->in_edges;
  const int64_t *bytes = P->m->bytes;
  const uint8_t *keep = P->m->keep, *vtype = g->vtype;
  size_t nv1 = (size_t)nv * sizeof(int32_t) + 1;
  /* the walk reads PF_AHEAD entries past the end of what it listed (its
   * prefetches): room for them, every entry a vertex */
  size_t nvp = ((size_t)nv + PF_AHEAD) * sizeof(int32_t);
  int32_t *os = P->out_start = calloc((size_t)nv + 2, sizeof(int32_t));
  int32_t *oe = P->out_edges = malloc((size_t)is[nv] * sizeof(int32_t) + 1);
  int32_t *bo = P->pos = malloc(nv1);
  P->dl = malloc(nv1);
  P->vx = malloc((size_t)nv * sizeof(mvert) + 1);
  int32_t *due = P->due = malloc(nvp);
  int32_t *rdy = P->rdy = malloc(nvp);
  int32_t *take = P->take = malloc(nvp);
  int32_t *srcs = P->srcs = malloc(nv1);
  uint8_t *vflag = P->vflag = malloc((size_t)nv + 1);
  P->pdies = calloc((size_t)nb + 1, sizeof(int64_t));
  if (!os || !oe || !bo || !P->dl || !P->vx || !due || !rdy || !take ||
      !srcs || !vflag || !P->pdies)
    return -1;
  /* the consumers' counts: os[u + 2]; then os[u + 1] is u's fill cursor */
  for (int32_t e = 0; e < is[nv]; e++) os[ie[e] + 2]++;
  for (int32_t v = 0; v < nv; v++) os[v + 2] += os[v + 1];
  int64_t placed = 0;
  for (int32_t b = 0; b < nb; b++) placed += batches[b].n;
  if (placed != nv) /* not a whole schedule: the rest at batch 0 */
    memset(bo, 0, (size_t)nv * sizeof(int32_t));
  for (int32_t b = 0; b < nb; b++)
    for (int32_t i = 0; i < batches[b].n; i++)
      bo[order[batches[b].start + i]] = b;
  P->bo = bo;
  P->nb0 = nb;
  for (int f = 0; f <= VF_FREES; f++)
    P->fbt[f] = f & VF_KEPT || (f & VF_TYPE) >= P->T ? 0 : bytes[f & VF_TYPE];
  const int64_t *fbt = P->fbt;
  /* keep[v & kmask]: whether v is kept (without keep, nothing is) */
  static const uint8_t none = 0;
  const int32_t kmask = P->m->keep != NULL ? -1 : 0;
  if (keep == NULL) keep = &none;
  int32_t cnt[CN_MAX_TYPES + 1] = {0}, n_src = 0;
  for (int32_t v = 0; v < nv; v++) {
    const int t = vtype[v];
    const int32_t e1 = is[v + 1];
    int32_t e = is[v];
    int64_t gain = -bytes[t];
    if (e == e1) srcs[n_src++] = v;
    due[v] = rdy[v] = take[v] = v;
    for (; e < e1; e++) {
      int32_t u = ie[e]; /* u < v: its flags are set */
      oe[os[u + 1]++] = v;
      gain += fbt[vflag[u] & VF_FREES];
    }
    vflag[v] = (uint8_t)(t | (keep[v & kmask] != 0) * VF_KEPT |
                         (gain > 0) * VF_CAND);
    cnt[t]++;
  }
  P->n_srcs = n_src;
  for (int i = 0; i < PF_AHEAD; i++)
    due[nv + i] = rdy[nv + i] = take[nv + i] = 0;
  P->rbase[0] = 0;
  for (int t = 0; t < P->T; t++) P->rbase[t + 1] = P->rbase[t] + cnt[t];
  return 0;
}

/* The peak of the policy's schedule (plan_setup's bo[]), from the bytes
 * that die after each of its batches (pdies, added up by the first
 * deadlines()), as cn__dag_mem_peak computes it. */
static int64_t policy_peak(const mplan *P, const cn_run_batch *batches) {
  int64_t live = 0, peak = 0;
  for (int32_t b = 0; b < P->nb0; b++) {
    live += (int64_t)batches[b].n * P->m->bytes[batches[b].type];
    if (live > peak) peak = live;
    live -= P->pdies[b];
  }
  return peak;
}

/* The scratch of one round of groups, for skeletons of up to k_max
 * batches: the skeleton and a candidate, and the plan's per-batch lists
 * (the previous round's freed). -1: out of memory. */
static int group_scratch(mplan *P, int32_t k_max, uint8_t **skel,
                         uint8_t **cand) {
  free(*skel);
  free(*cand);
  free(P->prev);
  free(P->kcnt);
  free(P->kn);
  free(P->kfreed);
  free(P->dhead);
  free(P->dtail);
  *skel = malloc((size_t)k_max + 1);
  *cand = malloc((size_t)k_max + 1);
  P->prev = malloc((size_t)P->T * ((size_t)k_max + 1) * sizeof(int32_t) + 1);
  size_t k1 = ((size_t)k_max + 1) * sizeof(int32_t);
  P->kcnt = malloc(k1);
  P->kn = malloc(k1);
  P->dhead = malloc(k1 + sizeof(int32_t));
  P->dtail = malloc(k1);
  P->kfreed = malloc(((size_t)k_max + 1) * sizeof(int64_t));
  if (!*skel || !*cand || !P->prev || !P->kcnt || !P->kn || !P->dhead ||
      !P->dtail || !P->kfreed)
    return -1;
  return 0;
}

/* Under a budget: the batch whose insertion into skel (K batches, plan
 * o) lowers the peak most: of the type that defers most bytes at o's
 * peak and the one that frees most, at sampled positions and then
 * between the best one's neighbours. *tb: its type (-1: none), *pb its
 * position, *ob its plan. Overwrites pos[], dl[] and vx[]. */
static void best_insertion(mplan *P, const uint8_t *skel, int32_t K,
                           outcome o, int64_t budget, uint8_t *cand,
                           outcome *ob_out, int *tb_out, int32_t *pb_out) {
  outcome ob = {0, 0, 0, 0, false};
  int tb = -1;
  int32_t pb = -1;
  int32_t step = K + 1 <= SAMPLE ? 1 : (K + SAMPLE) / SAMPLE;
  int64_t waiting[CN_MAX_TYPES], freeing[CN_MAX_TYPES];
  for (int32_t v = 0; v < P->nv; v++) P->pos[v] = vpos(P, v); /* o's */
  waiting_at_peak(P, K, o.at, P->dl, waiting, freeing);
  uint32_t types = 0; /* the type deferring most, the one freeing most */
  int tw = -1, tf = -1;
  for (int t = 0; t < P->T; t++) {
    if (waiting[t] > 0 && (tw < 0 || waiting[t] > waiting[tw])) tw = t;
    if (freeing[t] > 0 && (tf < 0 || freeing[t] > freeing[tf])) tf = t;
  }
  if (tw >= 0) types |= 1u << tw;
  if (tf >= 0) types |= 1u << tf;
  for (int t = 0; t < P->T; t++) {
    if (P->m->bytes[t] <= 0 || !(types >> t & 1)) continue;
    outcome ot = {0, 0, 0, 0, false};
    int32_t pt = -1;
    for (int32_t p = 0; p <= K; p += step) {
      with_insert(skel, K, t, p, cand);
      outcome c = eval(P, cand, K + 1, true, budget);
      if (better(c, ot)) ot = c, pt = p;
    }
    /* then the positions between the best one's neighbours */
    int32_t fine = step / 6 > 1 ? step / 6 : 1;
    for (int32_t p = pt - step + fine; pt >= 0 && step > 1 && p < pt + step;
         p += fine) {
      if (p < 0 || p > K || p == pt) continue;
      with_insert(skel, K, t, p, cand);
      outcome c = eval(P, cand, K + 1, true, budget);
      if (better(c, ot)) ot = c, pt = p;
    }
    if (better(ot, ob)) ob = ot, tb = t, pb = pt;
  }
  *ob_out = ob;
  *tb_out = tb;
  *pb_out = pb;
}

int cn__dag_mem_order(const cn_dag *g, const cn_dag_mem *m, int64_t budget,
                      int32_t *order, cn_run_batch *batches,
                      int32_t *n_batches, cn_dag_mem_result *res) {
  mplan P = {.g = g, .m = m, .T = g->n_types, .nv = g->nv};
  const int32_t nb0 = *n_batches;
  int rc = CN_E_NOMEM;
  uint8_t *skel = NULL, *cand = NULL, *base = NULL;
  memset(res, 0, sizeof(*res));
  res->batches_before = res->batches = nb0;
  res->groups = 1;
  if (g->nv == 0 || nb0 == 0) {
    res->peak_before = res->peak = cn__dag_mem_peak(g, m, order, batches, nb0);
    res->fits = budget <= 0 || res->peak_before <= budget;
    return res->peak_before < 0 ? CN_E_NOMEM : 0;
  }
  if (plan_setup(&P, order, batches, nb0) != 0) goto out;
  size_t nv1 = (size_t)g->nv * sizeof(int32_t) + 1;
  base = malloc((size_t)nb0 + 1);
  if (base == NULL) goto out;
  for (int32_t b = 0; b < nb0; b++) base[b] = (uint8_t)batches[b].type;
  outcome cur = {0, 0, nb0, 0, true}; /* the policy's; its peak below */
  for (int32_t G = 1;; G = G * 2 < P.n_comp ? G * 2 : P.n_comp) {
    if (set_groups(&P, G) != 0) goto out;
    /* G = 1: one skeleton, sources ready at its start; G > 1: group k
     * owns the k-th copy of the policy's skeleton */
    P.K0 = G == 1 ? INT32_MAX : nb0;
    int32_t K = nb0 * G;
    int32_t k_max = K + nb0; /* at most one copy's worth of insertions */
    if (group_scratch(&P, k_max, &skel, &cand) != 0) goto out;
    for (int32_t k = 0; k < G; k++) memcpy(skel + (size_t)k * nb0, base, nb0);
    outcome o = best_on(&P, skel, K, budget);
    if (G == 1) { /* batches[] is still the policy's */
      cur.peak = P.pdone ? policy_peak(&P, batches)
                         : cn__dag_mem_peak(g, m, order, batches, nb0);
      if (cur.peak < 0) goto out;
      res->peak_before = res->peak = cur.peak;
    }
    /* Under a budget, one group: insert batches while that lowers the
     * peak (or, four times at most in a row, only the sum of live bytes,
     * to get off a plateau where two batches share the peak). */
    int stall = 0;
    bool stale = false; /* vx[] holds a candidate's schedule, not o's */
    while (G == 1 && budget > 0 && o.ok && o.peak > budget && K < k_max &&
           stall < 4) {
      outcome ob;
      int tb;
      int32_t pb;
      best_insertion(&P, skel, K, o, budget, cand, &ob, &tb, &pb);
      stale = true; /* the candidates overwrote vx[] */
      if (tb < 0) break;
      if (ob.peak < o.peak) stall = 0;
      else if (ob.peak == o.peak && ob.area < o.area) stall++;
      else break;
      memmove(skel + pb + 1, skel + pb, (size_t)(K - pb));
      skel[pb] = (uint8_t)tb;
      K++;
      o = best_on(&P, skel, K, budget);
      stale = false;
      res->inserted++;
    }
    if (stale) o = best_on(&P, skel, K, budget); /* vx[]: o's again */
    if (o.ok && (o.peak < cur.peak ||
                 (o.peak == cur.peak && o.batches < cur.batches))) {
      int32_t nb = write_schedule(&P, skel, K, order, batches);
      if (nb < 0) goto out;
      *n_batches = nb;
      cur = o;
      res->peak = o.peak;
      res->batches = nb;
      res->groups = G;
    }
    res->fits = budget <= 0 || cur.peak <= budget;
    if (res->fits) break;
    if (P.comp == NULL) { /* the instances, for the groups */
      if ((P.comp = malloc(nv1)) == NULL) goto out;
      P.n_comp = cn__dag_components(g, P.comp);
    }
    if (G >= P.n_comp) break;
  }
  res->evals = P.evals;
  rc = 0;
out:
  free(P.out_start);
  free(P.out_edges);
  free(P.comp);
  free(P.group);
  free(P.src_start);
  free(P.srcs);
  free(P.dl);
  free(P.pos);
  free(P.vx);
  free(P.due);
  free(P.rdy);
  free(P.take);
  free(P.prev);
  free(P.kcnt);
  free(P.kn);
  free(P.kfreed);
  free(P.dhead);
  free(P.dtail);
  free(P.vflag);
  free(P.pdies);
  free(skel);
  free(cand);
  free(base);
  return rc;
}
