/* sched_api.h - the scheduler (sched/): typed DAGs (cn_dag), the frontier of
 * ED-Batch Alg. 1, the heuristics, learned FSM policies, plan and optimum
 * searches, graph sets. It decides from a cn_dag it is given and never
 * sees a run or calls execution: core/run asks it for the next batch
 * (run/run_sched.c, run/run_dynamic.c). Depends on base/ only (the policy
 * cache and FSM training also read model/'s cn_model). */
#ifndef CANOPY_SCHED_H
#define CANOPY_SCHED_H

#include "base/base.h"

/* ---- scheduling (sched.c) ------------------------------------------------
 * A typed DAG as the scheduler sees it (borrowed arrays): vertices in a
 * topological order, inputs of v at in_edges[in_start[v] .. in_start[v+1]). */
typedef struct cn_dag {
  int n_types;
  int32_t nv;
  const uint8_t *vtype;
  const int32_t *in_start, *in_edges;
} cn_dag;

/* A batch of a schedule: order[start .. start + n) are n vertices of one
 * type (the scheduler's output; a run keeps them in r->batches). */
typedef struct cn_run_batch {
  int32_t type;
  int32_t start, n;      /* into order[] */
} cn_run_batch;

/* ---- facts of a typed DAG (dag.c: the lowest file of sched/, which
 * every other may call) ------------------------------------------------- */
/* Σ_t depth_t: no schedule of g has fewer batches (docs/models.md). */
int64_t cn__dag_lower_bound(const cn_dag *g);
/* The consumers of every vertex: v's at out_edges[out_start[v] ..
 * out_start[v + 1]), ascending. Both malloc'd (the caller frees them, also
 * on error); returns 0 or CN_E_NOMEM. */
int cn__dag_consumers(const cn_dag *g, int32_t **out_start,
                      int32_t **out_edges);
/* Bit t set: some type-t vertex of g has a consumer. A type that feeds
 * nothing (outputs) never needs a batch before the last: its batches ready
 * nothing, so moving them all to the end and merging them there keeps
 * every other batch as it was. The searches branch on it only when no
 * feeding type is ready, which keeps an optimal schedule in reach. */
uint32_t cn__dag_feeding_types(const cn_dag *g);
/* The instances of g: its weakly connected components, numbered 0, 1, ...
 * in the order of their first vertex, into comp (g->nv entries; union-find
 * over the edges, in place). Returns how many. */
int32_t cn__dag_components(const cn_dag *g, int32_t *comp);
/* tail[v × n_types + t]: the most type-t vertices on a path from v to a
 * sink (v included), from g's consumers; malloc'd, NULL when out of
 * memory. cn__dag_fill_tails writes them into a zeroed array of the
 * caller's. */
int32_t *cn__dag_tails(const cn_dag *g, const int32_t *out_start,
                       const int32_t *out_edges);
void cn__dag_fill_tails(const cn_dag *g, const int32_t *out_start,
                        const int32_t *out_edges, int32_t *tail);

/* sched.c: schedules g with a policy. order (g->nv entries) and batches (g->nv) may
 * be NULL to count only; *n_batches gets the count. fsm: CN_POLICY_FSM's
 * learned policy (NULL: agenda); plan_width: CN_POLICY_PLAN's beam width.
 * Returns 0 or CN_E_NOMEM/CN_E_INTERNAL. */
int cn__sched_dag(const cn_dag *g, cn_policy_kind policy,
                  const struct cn_fsm *fsm, int plan_width, int32_t *order,
                  cn_run_batch *batches, int32_t *n_batches);

/* dag_optimum.c: the fewest batches g can run in (ED-Batch §2.1's problem),
 * by IDA* over done-sets with at most `budget` expanded states. exact = 1:
 * lower == upper is the optimum and schedule (malloc'd, `upper` types; the
 * caller frees it) reaches it. exact = 0: the budget ran out; lower is
 * proven (≥ the bound), upper is 0 (unknown). Returns 0 or CN_E_NOMEM. */
typedef struct cn_dag_optimum {
  int64_t lower, upper;
  int exact;
  long long nodes;   /* states expanded */
  uint8_t *schedule;
} cn_dag_optimum;
int cn__dag_optimum(const cn_dag *g, long long budget, cn_dag_optimum *res);
/* The types a search branches on, from the ready types (bits of live):
 * the forced one if any (-1: none), else the ready types that feed
 * something, else every ready type. */
static inline uint32_t cn__dag_branch_types(uint32_t live, int forced,
                                            uint32_t feeds) {
  if (forced >= 0) return 1u << forced;
  return live & feeds ? live & feeds : live;
}

/* dag_beam.c: a schedule by beam search over the product of the graph's
 * instance automata (width states kept per step, ranked by batches so far
 * plus the bound on what is left): an upper bound on the optimum where the
 * exact search runs out of budget, and the schedule of CN_POLICY_PLAN.
 * *schedule (may be NULL) gets the types, malloc'd. Returns 0 or
 * CN_E_NOMEM. */
int cn__dag_beam(const cn_dag *g, int width, int64_t *batches,
                 uint8_t **schedule);

/* dag_memory.c: a batch order by memory (docs/memory.md). A
 * vertex's row (bytes[its type]) is live from its batch to the batch of
 * its last consumer, or to the end when keep[v] (NULL: nothing kept); a
 * batch's rows are taken while its inputs are still held. */
typedef struct cn_dag_mem {
  const int64_t *bytes; /* [type] */
  const uint8_t *keep;  /* [v], may be NULL */
} cn_dag_mem;
typedef struct cn_dag_mem_result {
  int64_t peak_before, peak; /* modelled peak of the given / new schedule */
  int32_t batches_before, batches;
  int32_t inserted;          /* batches added to the skeleton (budget) */
  int32_t groups;            /* instance groups run one after another */
  long long evals;           /* skeletons walked */
  bool fits;                 /* peak <= budget (always, budget <= 0) */
} cn_dag_mem_result;
/* The peak live bytes of a schedule under that model; -1: no memory. */
int64_t cn__dag_mem_peak(const cn_dag *g, const cn_dag_mem *m,
                         const int32_t *order, const cn_run_batch *batches,
                         int32_t nb);
/* Rewrites a schedule of g (order, batches, *n_batches: the policy's) in
 * place: budget <= 0, the lowest peak found at no more batches; budget >
 * 0, a peak <= budget with as few extra batches as the search finds
 * (res->fits 0: none found; the schedule is then the lowest peak found).
 * batches must have room for nv entries. Returns 0 or CN_E_NOMEM. */
int cn__dag_mem_order(const cn_dag *g, const cn_dag_mem *m, int64_t budget,
                      int32_t *order, cn_run_batch *batches,
                      int32_t *n_batches, cn_dag_mem_result *res);

/* ---- the frontier (frontier.c): ED-Batch Alg. 1, one step at a time -------
 * The ready vertices of a typed DAG that may still grow: a driver adds
 * vertices (inputs first), asks a policy for the next type, commits the
 * batch of every ready vertex of that type, and may add vertices that depend
 * on committed ones before the next step (lstm-nmt decoding). Static plans
 * (cn__sched_dag) and FSM training drive the same object.
 *
 *   cn_frontier f;
 *   cn__frontier_init(&f, n_types, false);
 *   cn__frontier_add(&f, type, inputs, n) ...      // or cn__frontier_add_dag
 *   while ((t = cn__frontier_next(&f, CN_POLICY_FSM, fsm)) >= 0) {
 *     n = cn__frontier_commit(&f, t, verts);       // verts: room for nv
 *     ... execute verts[0..n) ... cn__frontier_add(...) for new vertices
 *   }
 *   cn__frontier_free(&f);
 *
 * Read-only for drivers: n_types, nv, n_done, n_ready[], n_sub[]. Not
 * thread-safe; one driver at a time. */
typedef struct cn_frontier {
  int n_types;
  int32_t nv, n_done;
  int64_t n_ready[CN_MAX_TYPES]; /* |Frontier_t(G)|: ready type-t vertices  */
  int64_t n_sub[CN_MAX_TYPES];   /* |Frontier(G^t)| (track_sub): type-t
                                    vertices with no type-t vertex left
                                    among their ancestors (ED-Batch §2.3) */
  int64_t n_of_type[CN_MAX_TYPES];
  double depth_sum[CN_MAX_TYPES];
  /* private */
  bool track_sub;
  int32_t cap_v, ne, cap_e;
  uint8_t *vtype, *done;
  int32_t *depth, *pending, *in_start, *in_edges;
  int32_t *out_head, *out_tail, *e_next, *e_dst; /* out-edges, per source  */
  bool csr;                      /* out-edges as ranges: v's consumers are
                                    e_dst[out_head[v] .. out_head[v + 1])
                                    (a DAG added at once), not lists      */
  int32_t *sub;                  /* [v][t]: inputs with a type-t vertex left
                                    at or above them (track_sub)          */
  uint64_t *sub0;                /* [v]: byte t is sub[t][v] before any
                                    commit, for the rows of sub_lazy      */
  uint32_t sub_lazy;             /* bit t: sub's row t is not written yet
                                    (a DAG added at once), sub0 holds it   */
  int32_t *q[CN_MAX_TYPES];      /* ready FIFO per type                    */
  int64_t qhead[CN_MAX_TYPES], qtail[CN_MAX_TYPES], qcap[CN_MAX_TYPES];
  int32_t *stack;
  int32_t *tail;                 /* [v][t] (cn__frontier_tails): most type-t
                                    vertices on a path from v to a sink    */
  int32_t *seen_in;              /* scratch of drops(), zero between calls */
  int32_t tails_nv;              /* vertices the tails were computed for   */
  uint32_t feeds;                /* (tails) bit t: a type-t vertex has
                                    consumers (cn__dag_feeding_types)     */
  bool borrow;                   /* set by the caller before
                                    cn__frontier_add_dag on an empty
                                    frontier: the DAG outlives it and no
                                    vertex will be added, so its vtype,
                                    in_start and in_edges are read in
                                    place, not copied                     */
  bool borrowed;                 /* they were (not the frontier's to free) */
  bool complete;                 /* set by the caller: no vertex will be
                                    added, so a type that feeds nothing can
                                    wait (lookahead2)                     */
  int32_t mt[CN_MAX_TYPES][CN_MAX_TYPES]; /* [a][t]: max tail_t over the
                                    ready type-a vertices (only grows until
                                    a commit of a clears it)               */
  int32_t *qc[CN_MAX_TYPES];     /* ready vertices with consumers, per type */
  int64_t qc_n[CN_MAX_TYPES], qc_cap[CN_MAX_TYPES];
  int32_t *comp;                 /* [v] (cn__frontier_tails): v's instance,
                                    a weakly connected component; a vertex
                                    added later joins its first input's  */
  int32_t n_comp;
  /* The lookahead2 policy's (frontier_lookahead2.c), with the instances. */
  int32_t *cm;                   /* [c][a][t]: max tail_t over instance c's
                                    ready type-a vertices (kept like mt)  */
  int32_t *cin[CN_MAX_TYPES];    /* instances with ready type-a vertices   */
  int32_t cin_n[CN_MAX_TYPES];
  uint8_t *cin_on;               /* [c][a]: c is in cin[a]                 */
  int32_t *cm1;                  /* [c][a][t]: cm after a first batch      */
  int32_t *cb;                   /* [c][t]                                 */
  int32_t *cx, *cs;              /* [c][t]: max and second over a of cm1   */
  uint8_t *ca;                   /* [c][t]: the a of the max               */
  int32_t *clist;                /* instances with ready vertices          */
  uint8_t *cmark;
  int32_t *seen2;                /* like seen_in, for a second batch       */
  int32_t *n1;                   /* vertices a first batch makes ready     */
} cn_frontier;

/* track_sub: keep n_sub[] (eq. 1's ratio; the sufficient policy and FSM
 * training need it; costs O(E·T) per episode). */
int cn__frontier_init(cn_frontier *f, int n_types, bool track_sub);
void cn__frontier_free(cn_frontier *f);
/* Appends a vertex whose inputs are existing vertices; returns its index or
 * a negative error. Inputs already committed count as computed. */
int32_t cn__frontier_add(cn_frontier *f, int type, const int32_t *inputs,
                         int n_inputs);
int cn__frontier_add_dag(cn_frontier *f, const cn_dag *g);
/* Back to nothing committed (same vertices): FSM training episodes. */
int cn__frontier_reset(cn_frontier *f);
/* frontier_policy.c: the policy's next type (ED-Batch Alg. 1 line 3), -1
 * when nothing is ready. Frontier policies: agenda, sufficient (needs
 * track_sub; without it agenda), fsm (fsm NULL: agenda). none/depth are
 * static plans, not frontier policies: they answer agenda here. */
int cn__frontier_next(const cn_frontier *f, cn_policy_kind policy,
                      const struct cn_fsm *fsm);
/* frontier_policy.c: whether the policy (with fsm for CN_POLICY_FSM)
 * reads drops(), so the driver should call cn__frontier_tails once the
 * graph is added. */
bool cn__policy_needs_tails(cn_policy_kind policy, const struct cn_fsm *fsm);
int cn__frontier_agenda(const cn_frontier *f);
/* ED-Batch eq. 1's ratio for type t: |Frontier_t(G)| / |Frontier(G^t)|,
 * in (0, 1] when t is ready (track_sub), 0 when not. */
double cn__frontier_ratio(const cn_frontier *f, int t);
/* Look-ahead for static graphs: computes every vertex's tail (the most
 * type-t vertices on a path from it to a sink) once all vertices are added.
 * Vertices added later count only themselves. */
int cn__frontier_tails(cn_frontier *f);
/* drop[t], for each ready type t: how much committing t now lowers the
 * lower bound Σ_t depth_t of what is left (docs/models.md), 0 for types not
 * ready or without tails. Returns the bound now. O(ready × types + the
 * edges out of the ready vertices). */
int64_t cn__frontier_drops(const cn_frontier *f, int64_t *drop);
/* Commits the batch of every ready type-t vertex (Alg. 1 lines 4-6):
 * writes them to out (FIFO order) and returns how many. */
int32_t cn__frontier_commit(cn_frontier *f, int t, int32_t *out);

/* ---- learned policies (fsm.c) ------------------------------------------- */
/* The state key E(G) of the frontier counts (ED-Batch §2.3): never 0 for
 * a non-empty frontier. */
uint32_t cn__fsm_encode(cn_fsm_encoding enc, int n_types,
                        const int64_t *n_ready);
/* π(E(G)); unseen states and actions fall back to agenda. */
int cn__fsm_choose(const struct cn_fsm *p, const cn_frontier *f);
/* Which plan the policy executes (CN_POLICY_FSM, or the heuristic that
 * beat it on its training sample). */
cn_policy_kind cn__fsm_executes(const struct cn_fsm *p);
/* The state of f under enc (cn__fsm_encode, or E_bound from f's drops). */
uint32_t cn__fsm_state(cn_fsm_encoding enc, const cn_frontier *f);
uint32_t cn__fsm_encode_bound(int n_types, const int64_t *n_ready,
                              const int64_t *drop);
/* Whether what p executes reads cn__frontier_drops. */
bool cn__fsm_needs_tails(const struct cn_fsm *p);
/* The number of vertex types p was trained for. */
int cn__fsm_n_types(const struct cn_fsm *p);
/* graph_set.c: the set's vertex types. */
int cn__graph_set_n_types(const cn_graph_set *s);
/* graph_set.c: adds a copy of g (n_edges input edges) to the set. */
int cn__graph_set_add_dag(cn_graph_set *s, const cn_dag *g, int32_t n_edges);

#endif /* CANOPY_SCHED_H */
