/* run_api.h - runs (run/): the vertex graph of many instances, planned into
 * one arena and executed batch by batch on a backend. A run builds its
 * cn_dag, asks core/sched for the schedule (or, for a graph that grows,
 * for the next type, batch by batch), and executes each batch through the
 * type's compiled cell (core/cell). Depends on base/,
 * input/, cell/, model/, sched/ and the backend interface. */
#ifndef CANOPY_RUN_H
#define CANOPY_RUN_H

#include "backend.h"
#include "base/base.h"
#include "cell/cell.h"
#include "model/model.h"
#include "sched/sched_api.h"

/* ---- runs -----------------------------------------------------------------
 * Files, lowest first (each calls only files before it): run_graph.c (the
 * graph, index staging), cell_exec.c (compiled cells), run_batch.c (one
 * batch), run_output.c (the answers' states), run_sched.c (the plan),
 * run_step.c (one batch step, every loop's), run_dynamic.c (a growing
 * graph), run.c (cn_run_exec), run_decode.c.
 * A run's graph is kept as arrays (struct of arrays), grown per run, never
 * per vertex. Vertices are added in a topological order: a vertex's inputs
 * exist before it. Each vertex gets, when its batch is planned, a row in its
 * type's state buffer (Cavs' dynamic tensors): the rows of one batch are
 * consecutive, so a batched kernel writes its outputs in place. */
typedef struct cn_run_slot {
  const cn_instance *inst;
  unsigned flags;
  int max_decode_len;
  int32_t v0, nv;        /* the slot's vertices: [v0, v0 + nv)             */
  int32_t node_v0;       /* node_vertex[node_v0 + i] = vertex of node i     */
  int32_t out_v0, n_out; /* output vertices, in node pre-order             */
} cn_run_slot;

/* The scratch a planned run's batch may use at once, in floats: 8 MB on a
 * host-memory backend, 256 MB on a device. A batch whose scratch would
 * pass it (the leaves of a thousand trees: an embedding row and the gates
 * a leaf) executes in slices of consecutive rows, each within it. Rows are
 * independent and every product computes a row the same way whatever rows
 * are beside it (backends/cpu/gemm.h), so a slice changes no output; on
 * the CPU it keeps the arena from holding, for the whole run, the scratch
 * of its largest batch alone (treelstm at H=128, runs of 1,024: 31 of
 * its 51 MB). A device has the memory and pays a launch per slice. */
#define CN__SCRATCH_SLICE_HOST ((int64_t)2 << 20)
#define CN__SCRATCH_SLICE_DEVICE ((int64_t)64 << 20)

struct cn_run {
  /* borrowed */
  const cn_model *m;
  const cn_family *fam;
  cn_backend_ctx *bk;
  /* instances */
  cn_run_slot *slots;
  int n_slots, cap_slots;
  /* the vertex graph */
  int32_t nv, cap_v;
  uint8_t *vtype;
  int32_t *vslot, *vnode, *vaux;
  int32_t *in_start;     /* nv + 1 entries once finished: CSR of inputs     */
  int32_t *in_edges;
  int32_t ne, cap_e;
  int32_t *node_vertex;  /* per slot, per node: the node's vertex          */
  int32_t n_nodev, cap_nodev;
  /* the plan */
  int64_t n_of_type[CN_MAX_TYPES];
  int64_t state_floats[CN_MAX_TYPES];
  int64_t type_base[CN_MAX_TYPES];   /* float offset of the type's buffer  */
  int64_t *state_off;    /* per vertex: float offset of its state row      */
  int32_t *order;        /* vertices in execution order                    */
  cn_run_batch *batches;
  int32_t n_batches;
  int64_t lower_bound;
  const struct cn_fsm *sched_fsm; /* CN_POLICY_FSM: the learned policy (or
                                     NULL: agenda); set by cn_run_exec_fsm */
  /* memory */
  float *arena;          /* backend memory: states, then scratch           */
  /* what the answers read (device backends only): the spans the family's
   * reads() named, sorted by vertex, and where fetch_rows put them */
  const float *host;     /* backend-owned; valid until the next fetch      */
  bool fetching;         /* cn_run_set_async: host is on its way (a
                            fetch_start not yet waited for)               */
  bool async;            /* cn_run_exec returns once the work is issued   */
  bool finished;         /* the family's finish() ran, counters taken     */
  struct cn_run_span *spans;
  int64_t n_spans, cap_spans;
  int64_t *fetch_idx;    /* off and len arrays handed to fetch_rows        */
  int64_t cap_fetch;
  bool need_failed;      /* cn__run_need ran out of memory                 */
  int64_t arena_floats, scratch_off, scratch_floats;
  float *scratch;        /* the batch's scratch: inside the arena for a
                            planned run, its own block (grown) when dynamic */
  int64_t *idx_host;     /* index staging for the batch being launched     */
  int64_t idx_cap, idx_used;
  struct cn__rows_plan *rows_plans; /* the batch's cells, prepared before
                            they launch (cell_exec.c): the vertex cell's,
                            then the edge cell's                         */
  const float *wb[CN_MAX_TENSORS]; /* the model's tensors, backend copies  */
  bool executed;
  /* data-dependent graphs (cn_family.dynamic) */
  int64_t reserve[CN_MAX_TYPES]; /* vertices decoded() may still add      */
  struct cn_frontier *live;      /* mirrors vertices added while running  */
  int64_t cap_state_off;
  bool own_scratch;
  int exec_rc;                   /* set by a decoded() that could not finish */
  cn_layout layout;
  int plan_width;                /* CN_POLICY_PLAN's beam width           */
  /* results of the family's finish() pass (NULL when it has none) */
  int32_t *out_tag;              /* per vertex: the decoded tag of an
                                    output vertex (others unused)        */
  float *out_score;              /* per slot: the decoded path's score    */
  /* statistics */
  size_t cell_bytes;
  size_t gather_bytes;
  size_t input_bytes;   /* embedding rows gathered (not between vertices) */
  bool rows_in_place;   /* products read their operands' rows where they
                           lie when the backend can (gemm_rows; default 1,
                           CANOPY_ROWS_IN_PLACE=0 gathers them as before) */
  long long kernels;
  double schedule_s, execute_s; /* cn_run_stats': thread CPU seconds    */
  cn_backend_counters ctr0; /* the backend's counters when the run began */
  cn_backend_counters ctr;  /* their difference when it ended           */
  /* memory by liveness (run_arena.c, docs/memory.md): set before exec */
  bool reuse;            /* planned runs: rows reused after their last
                            reader batch (default; CANOPY_ARENA_REUSE=0) */
  bool poison;           /* freed rows become NaN when freed (tests;
                            CANOPY_POISON_FREED=1)                        */
  /* ... and what the plan made of them */
  bool reused;           /* this run's rows share space                   */
  int32_t *slice_rows;   /* per batch: rows a launch executes at once, so
                            the scratch stays within CN__SCRATCH_SLICE_*  */
  int64_t scratch_slice; /* tests: that limit instead (0: the backend's) */
  int64_t mem_budget;    /* bytes the arena may hold (0: no budget)      */
  bool mem_order;        /* order batches by memory (default 1;
                            CANOPY_MEMORY_ORDER=0 turns it off)          */
  int32_t policy_batches;/* the policy's batches before the memory order */
  int32_t mem_groups;    /* instance groups the budget split the run in  */
  int64_t arena_unbudgeted; /* bytes: the plan at the policy's batch count */
  int64_t state_floats_total; /* every vertex's state (the arena without
                                 reuse, less scratch); 0: not planned     */
  int64_t state_floats_live;  /* the most floats held at once (no holes) */
  int32_t *build_room;   /* cn__run_build_room's                        */
  int64_t cap_build_room;
  struct cn_arena_free *frees; /* ranges freed, by the batch after which */
  int64_t n_frees, poison_next;
  /* capacities of the plan's arrays, kept by cn_run_reset (run_graph.c):
   * order and batches (entries), slice_rows, idx_host */
  int64_t cap_plan, cap_slice, cap_idx_host;
};

/* A span of one vertex's state that an answer reads: floats [lo, hi),
 * packed at `at` in the run's host copy. */
typedef struct cn_run_span {
  int32_t v, lo, hi;
  int64_t at;
} cn_run_span;

/* Adds a vertex with the given inputs; returns its index or -1 (no memory).
 * cn__run_add_vertex_grow (run_graph.c) does it all: the arrays grown,
 * a dynamic run's frontier told; cn__run_add_vertex inlines the common
 * case, a planned run with room, as a build() adds vertex after vertex
 * (a lattice hundreds an instance). */
int32_t cn__run_add_vertex_grow(cn_run *r, int type, int slot, int node,
                                int aux, const int32_t *inputs,
                                int n_inputs);
static inline int32_t cn__run_add_vertex(cn_run *r, int type, int slot,
                                         int node, int aux,
                                         const int32_t *inputs,
                                         int n_inputs) {
  int32_t v = r->nv;
  if (v + 1 > r->cap_v || r->ne + n_inputs > r->cap_e || r->live != NULL)
    return cn__run_add_vertex_grow(r, type, slot, node, aux, inputs,
                                   n_inputs);
  r->vtype[v] = (uint8_t)type;
  r->vslot[v] = slot;
  r->vnode[v] = node;
  r->vaux[v] = aux;
  for (int k = 0; k < n_inputs; k++) r->in_edges[r->ne + k] = inputs[k];
  r->ne += n_inputs;
  r->in_start[v + 1] = r->ne;
  r->nv = v + 1;
  r->n_of_type[type]++;
  return v;
}
/* Room for `vertices` more vertices and `edges` more input edges, for a
 * build() that then writes the arrays itself (a planned run only: a
 * dynamic run's frontier must see each vertex); 0 or -1 (no memory). */
int cn__run_vertex_room(cn_run *r, int32_t vertices, int32_t edges);
/* Reserves n entries of node_vertex for a slot; returns the first. */
int32_t cn__run_reserve_nodes(cn_run *r, int32_t n);
/* Room for n int32_t that a build() works in while it adds one instance
 * (spans grouped by end, a vertex's input list): the run's own, grown
 * geometrically and reused by every later build(), so adding an
 * instance allocates nothing once the run has seen its largest. Valid
 * until the next call; NULL: no memory. */
int32_t *cn__run_build_room(cn_run *r, int64_t n);
/* Inputs of vertex v. */
static inline const int32_t *cn__run_inputs(const cn_run *r, int32_t v,
                                            int *n) {
  *n = r->in_start[v + 1] - r->in_start[v];
  /* a run with no edges has no in_edges array (no offset on NULL) */
  return r->in_edges != NULL ? r->in_edges + r->in_start[v] : NULL;
}
/* The vertex's state row, in backend memory. */
static inline float *cn__run_state(const cn_run *r, int32_t v) {
  return r->arena + r->state_off[v];
}
/* Scratch for the batch being executed: at least n · scratch_floats(type). */
static inline float *cn__run_scratch(const cn_run *r) {
  return r->scratch;
}
/* An index array of n entries for the batch being launched; valid until the
 * batch returns. */
int64_t *cn__run_idx(cn_run *r, int64_t n);
/* Whether rows `width` wide at idx[0..n) are evenly spaced, none missing
 * and none overlapping: then they are one matrix with row stride *stride. */
bool cn__rows_even(const int64_t *idx, int n, int width, int *stride);
/* Host-readable view of a vertex's state after execution, from column
 * col on: on a device backend only the spans the family's reads() named
 * are there (NULL for any other). */
const float *cn__run_state_host_at(const cn_run *r, int32_t v, int col);
static inline const float *cn__run_state_host(const cn_run *r, int32_t v) {
  return cn__run_state_host_at(r, v, 0);
}
/* For reads(): output() will read floats [col, col + width) of v's state. */
void cn__run_need(cn_run *r, int32_t v, int col, int width);
/* C[M,N] = [part rows side by side]·[W_q side by side]ᵀ + beta·C (+ bias):
 * the backend's gemm_rows, reading every part where it lies; a backend
 * without it gets the parts gathered into stage (M × ΣK floats) and one
 * gemm, so there the parts' W must be consecutive column blocks of one
 * matrix (W_{q+1} = W_q + K_q, one ldw). The bytes gathered then (of
 * parts with off) are added to *bytes when bytes is not NULL. */
void cn__run_gemm_rows(cn_run *r, int M, int N, int n_parts,
                       const cn_gemm_part *parts, const float *bias,
                       float beta, float *C, int ldc, float *stage,
                       size_t *bytes);
/* Whether products may read their operands in parts (gemm_rows). */
static inline bool cn__run_rows_in_place(const cn_run *r) {
  return r->rows_in_place && r->bk->vt->gemm_rows != NULL;
}

/* ---- one batch (run_batch.c) ----------------------------------------------
 * Executes one batch with the run's layout: the type's compiled cell, then
 * the family's decoded() when it has one. */
void cn__run_exec_batch(cn_run *r, int type, const int32_t *verts, int n);
/* Scratch floats and index entries that batch needs. */
void cn__run_batch_needs(const cn_run *r, int type, int64_t n, int64_t edges,
                         int64_t *scratch, int64_t *idx);

/* Executes a run of a dynamic family (run_dynamic.c): frontier by
 * frontier, the graph growing as decoded() adds vertices. */
int cn__run_exec_dynamic(cn_run *r, cn_policy_kind policy, cn_err *err);
/* The run's own scratch block and index staging, grown to at least that
 * much (run_step.c). */
int cn__run_ensure_scratch(cn_run *r, int64_t floats);
int cn__run_ensure_idx(cn_run *r, int64_t n);
/* One batch step of any run (run_step.c): the batch of n vertices of
 * `type`, their state rows placed, with `edges` inputs in all; its room
 * grown to what it needs, executed, counted in n_batches. edges < 0: a
 * planned run, whose plan sized the room and counted the batches.
 * Returns 0, CN_E_NOMEM, or the error a decoded() left in exec_rc. */
int cn__run_step(cn_run *r, int type, const int32_t *verts, int32_t n,
                 int64_t edges);
/* The stats every run reports alike, planned or a decode session's
 * (run.c): its counts, arena, copies and the backend's counters as
 * cn__run_count last took them; the rest zero. */
void cn__run_stats_common(const cn_run *r, cn_run_stats *s);
/* Binds the model's tensors to the run's backend (run_batch.c). */
void cn__run_bind_weights(cn_run *r);
/* After the last batch (run_output.c): checks the backend's status and, on a device
 * backend, brings what the answers of slots[0..n) read (every slot when
 * slots is NULL) to the host in one fetch. */
int cn__run_copy_back(cn_run *r, const int *slots, int n, cn_err *err);
/* cn__run_copy_back's first half: the fetch issued, not waited for when
 * the backend has fetch_start (r->fetching); cn__run_fetch_wait is the
 * second half (a no-op when nothing is on its way). */
int cn__run_fetch_start(cn_run *r, const int *slots, int n, cn_err *err);
int cn__run_fetch_wait(cn_run *r, cn_err *err);
/* Adds the backend's counters since r->ctr0 to r->ctr and moves ctr0 to
 * now (run.c): a run counts only what happened while it was the one
 * issuing, even when another run was issued between its two halves. */
void cn__run_count(cn_run *r);

/* ---- memory by liveness (run_arena.c) -------------------------------------
 * An offset allocator over floats (free ranges kept sorted and merged,
 * best fit, else the top grows), simulated over a planned run's batches. */
typedef struct cn_offset_alloc {
  int64_t *lo, *len;   /* free ranges below top, by offset, never adjacent */
  int n, cap;
  int64_t top;         /* everything from here up is free                 */
  int64_t peak;        /* the highest top: the memory the plan needs      */
  int64_t live;        /* floats held now                                 */
  int64_t peak_live;   /* the most held at once (peak minus holes)        */
} cn_offset_alloc;
/* Takes size floats; *off its offset. 0, or -1 with no memory. */
int cn__oalloc_alloc(cn_offset_alloc *a, int64_t size, int64_t *off);
/* Gives [off, off + size) back (it must be held). 0, or -1 (no memory). */
int cn__oalloc_free(cn_offset_alloc *a, int64_t off, int64_t size);
void cn__oalloc_done(cn_offset_alloc *a);

/* A range of the arena freed after batch `at` (poisoning). */
typedef struct cn_arena_free {
  int32_t at;
  int64_t off, len;
} cn_arena_free;

/* Places every state row of a planned run by liveness: reorders the rows
 * within each batch (by the batch that reads them last, then in their
 * readers' order), gives each batch one block of the simulated allocator,
 * and frees rows after their last reader batch; rows with keep[v] (read
 * after the run; keep NULL: all) are never freed. Fills r->state_off and
 * r->frees; *states: the floats the state region needs. 0, or -1 with no
 * memory. */
int cn__run_plan_live(cn_run *r, const uint8_t *keep, int64_t *states);

/* Poisons (NaN) the ranges freed after batch b that are not yet. */
void cn__run_poison(cn_run *r, int32_t b);

/* ---- scheduling a run (run_sched.c) ---------------------------------------
 * Fills r->order and r->batches for the policy, and r->lower_bound. With
 * CN_POLICY_FSM the policy object is r->sched_fsm (NULL: agenda). */
int cn__sched_plan(cn_run *r, cn_policy_kind policy, cn_err *err);
/* run_sched.c: rewrites the run's planned batches by memory
 * (core/sched/dag_memory.c): the lowest peak at the policy's batch count,
 * or under `budget` bytes of states (> 0) with as few extra batches as
 * found. keep: rows read after the run. *fits: the peak is under the
 * budget (1 without one); *model_peak: the peak of the model, before the
 * allocator's rounding and holes. Returns 0 or CN_E_NOMEM. */
int cn__sched_memory(cn_run *r, const uint8_t *keep, int64_t budget,
                     bool *fits, int64_t *model_peak, cn_err *err);
/* Σ_t depth_t over the run (docs/models.md lower bound). */
int64_t cn__sched_lower_bound(const cn_run *r);

/* The run's graph as the scheduler sees it (borrowed arrays). */
static inline cn_dag cn__run_dag(const cn_run *r) {
  cn_dag g = {r->fam->n_types, r->nv, r->vtype, r->in_start, r->in_edges};
  return g;
}

/* cell_exec.c: runs cell c on a batch (all inputs ready; rows of verts
 * consecutive in the type's state buffer); its results go to the batch's
 * state rows, or to out (n rows of c->state_floats) when out is not
 * NULL. Every index array of the batch is written before its first
 * launch, and handed to the backend's stage_indices when it has one. */
void cn__cell_exec(cn_run *r, const cn_cell *c, const int32_t *verts, int n,
                   float *out);
/* Makes the run's rows_plans (once; freed with the run): 0 or
 * CN_E_NOMEM. Before the first cn__cell_exec. */
typedef struct cn__rows_plan cn__rows_plan;
int cn__cell_plans(cn_run *r);

#endif /* CANOPY_RUN_H */
