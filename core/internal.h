/* internal.h - declarations shared inside core/ only. server/ must not
 * include this file; it sees canopy_core.h. */
#ifndef CANOPY_CORE_INTERNAL_H
#define CANOPY_CORE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "canopy_core.h"

#define CN_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define CN_MAX_TYPES 8
#define CN_MAX_TENSORS 24

/* splitmix64 (Steele et al. 2014): a tiny, well-mixed stream, for weight
 * init and Zobrist keys. */
static inline uint64_t cn__splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Checked allocation helpers: NULL on overflow or failure. */
void *cn__xcalloc(size_t n, size_t size);
void *cn__xrealloc(void *p, size_t n, size_t size);

/* ---- parsed trees (tree_parse.c) ---------------------------------------
 * Nodes are numbered in pre-order (the order their opening bracket
 * appears). Node i's children are children[first_child .. +n_children], in
 * order. Strings (word, label) point into the tree's own pool and are NOT
 * NUL-terminated; use the lengths. A leaf has a word and no children; an
 * internal node has children and no word. The tree owns all its memory. */
typedef struct cn_tree_node {
  int32_t parent;      /* -1 for the root */
  int32_t first_child; /* index into cn_tree.children */
  int32_t n_children;
  int32_t depth;       /* root = 1 */
  const char *word;    /* leaves only, else NULL */
  int32_t word_len;
  const char *label;   /* may be NULL (no label) */
  int32_t label_len;
  int8_t type;         /* JSON "type": 'a', 'b', or 0 when absent */
  int64_t offset;      /* byte offset of the node in a bracketed string, or -1 */
} cn_tree_node;

typedef struct cn_tree {
  int32_t n_nodes;
  cn_tree_node *nodes;
  int32_t *children;   /* n_nodes - 1 entries */
  char *pool;          /* backing store for words and labels */
  int32_t height;      /* max node depth */
} cn_tree;

/* Parse a bracketed (Penn / SST) tree string of len bytes (API.md "Details
 * that are part of the contract"). Iterative: no recursion, so deep input
 * cannot overflow the stack. Limits: max_nodes, max_depth, max_token_len.
 * On error returns CN_E_BAD_TREE (or CN_E_TOO_LARGE for a limit) with
 * err->offset = byte offset of the problem and err->node when known. */
int cn_tree_parse_bracketed(const char *s, size_t len, const cn_limits *lim,
                            cn_tree *out, cn_err *err);
/* Parse a JSON NODE tree ({"word"} or {"label", "type", "children"}).
 * Iterative. Errors name the node by pre-order index (err->node). */
int cn_tree_parse_json(const json_t *root, const cn_limits *lim, cn_tree *out,
                       cn_err *err);
void cn_tree_free(cn_tree *t);

/* ---- vocabularies (vocab.c) --------------------------------------------
 * One token a line; line k is id k; id 0 is <unk>. Open-addressing hash. */
typedef struct cn_vocab cn_vocab;
int cn_vocab_load(const char *path, cn_vocab **out, cn_err *err);
/* Builds a vocabulary from an array of tokens (copied). */
int cn_vocab_from_list(const char *const *tokens, int n, cn_vocab **out);
void cn_vocab_free(cn_vocab *v);
int cn_vocab_size(const cn_vocab *v);
/* Id of token s[0..len), 0 (<unk>) if absent. lowercase: ASCII A-Z folded
 * before look-up (the stored tokens are used as they are). */
int cn_vocab_lookup(const cn_vocab *v, const char *s, size_t len,
                    bool lowercase);
const char *cn_vocab_token(const cn_vocab *v, int id); /* NULL if out of range */
/* Writes one token a line. */
int cn_vocab_write(const char *path, const char *const *tokens, int n,
                   cn_err *err);
/* Ranks a bag of tokens (repeats counted; the array is sorted in place) by
 * descending count, then bytewise. *out (malloc'd, *n_out entries) lists
 * the specials first, then at most max - n_specials distinct tokens; it
 * points into specials and tokens, copying nothing. Specials, empty tokens
 * and tokens holding a line break are left out of the ranking. */
int cn__vocab_rank(char **tokens, size_t n, const char *const *specials,
                   int n_specials, int max, const char ***out, int *n_out);

/* ---- safetensors (safetensors.c) ---------------------------------------
 * A .safetensors file read whole into memory of its own (never a mapping of
 * the file: what happens to the file afterwards cannot change or break a
 * loaded model), with its SHA-256; every tensor's header entry is checked
 * (dtype, shape product × dtype size == byte span, offsets inside the data
 * section, no overlap) before any is used. */
typedef struct cn_tensor {
  char name[96];
  int ndim;
  int64_t shape[4];
  int64_t numel;
  const float *data; /* into the file's bytes; F32 only */
} cn_tensor;

typedef struct cn_safetensors {
  void *bytes;       /* the whole file, 64-byte aligned, owned */
  size_t n_bytes;
  char sha256[65];   /* of the file, lowercase hex */
  int n;
  cn_tensor *tensors;
} cn_safetensors;

int cn_safetensors_open(const char *path, cn_safetensors *st, cn_err *err);
const cn_tensor *cn_safetensors_find(const cn_safetensors *st,
                                     const char *name);
void cn_safetensors_close(cn_safetensors *st);

/* Tensor to write: name, shape, data (numel floats). */
typedef struct cn_tensor_out {
  const char *name;
  int ndim;
  int64_t shape[4];
  const float *data;
} cn_tensor_out;
int cn_safetensors_write(const char *path, const cn_tensor_out *t, int n,
                         cn_err *err);

/* ---- families (core/families/) ------------------------------------------- */
typedef struct cn_run cn_run;
typedef struct cn_family cn_family;
struct cn_ir;  /* core/cell.h */
struct cn_cell;

/* Sizes a family's tensor shapes are written in. */
typedef struct cn_dims {
  int64_t H, D, C, V;     /* hidden, embed, classes, vocab                  */
  int64_t Vw, Dw, Vt, K;  /* word vocab/embed, target vocab, mvrnn matrices */
  bool crf;               /* model.json "crf": the family's CRF tensors too
                             (bilstm-tagger, MODELS.md)                    */
} cn_dims;

enum {
  CN_INIT_LINEAR = 0, /* U(-1/√fan_in, 1/√fan_in), fan_in = last dim        */
  CN_INIT_BIAS,       /* U(-1/√H, 1/√H)                                     */
  CN_INIT_EMBED,      /* N(0, 1) scaled to unit-ish rows: U(-1, 1)·√3/√D…   */
  CN_INIT_MATRICES,   /* identity + small noise, per [K, H, H] slice        */
  CN_INIT_SCORES      /* U(-0.1, 0.1): CRF scores, as pytorch-crf's
                         CRF.reset_parameters                              */
};

typedef struct cn_tensor_spec {
  const char *name;
  int ndim;
  int64_t shape[3]; /* -1: any size ≥ 1 (checked as such) */
  int init;
} cn_tensor_spec;

struct cn_family {
  const char *name;
  cn_input_kind input;
  int n_types;
  const char *type_names[CN_MAX_TYPES];
  bool has_classes; /* has an output layer with C classes */
  bool crf;         /* accepts model.json "crf" (MODELS.md bilstm-tagger)  */
  int max_arity;    /* trees: most children per node (0: lim->max_children) */
  /* The tensors of the family at these sizes, in binding order; returns
   * their number (≤ CN_MAX_TENSORS). */
  int (*tensors)(const cn_dims *d, cn_tensor_spec *out);
  /* The graph grows while it runs (lstm-nmt decoding): exec() adds the
   * vertices of later steps; build() reserves their count in r->reserve. */
  bool dynamic;
  /* Adds the instance's vertices to the run; returns 0 or an error. */
  int (*build)(cn_run *r, int slot);
  /* Vertices build() will add for this instance (upper bound for families
   * whose graph is decided at run time; max_decode_len 0: default). */
  int64_t (*count)(const cn_instance *in, unsigned flags, int max_decode_len);
  /* Floats of per-vertex state (the vertex's row in its type buffer), and
   * of scratch one batch of n vertices with n_inputs input edges in all
   * needs. */
  int64_t (*state_floats)(const cn_model *m, int type);
  int64_t (*scratch_floats)(const cn_model *m, int type, int64_t n,
                            int64_t n_inputs);
  /* Executes one batch: n vertices of one type, all inputs ready. */
  void (*exec)(cn_run *r, int type, const int32_t *verts, int n);
  /* After every batch ran and the states are host-readable
   * (cn__run_state_host): one pass over the whole run on the host, e.g.
   * bilstm-tagger's CRF decoding of every instance together. Fills
   * r->out_tag / r->out_score; returns 0 or an error. NULL: none. */
  int (*finish)(cn_run *r, cn_err *err);
  /* Writes the per-instance output object (API.md). */
  json_t *(*output)(const cn_run *r, int slot);
  /* The vertex function of a type as op IR (core/cell.h), for the naive
   * and pq layouts; returns 0, or 1 when the type has only its
   * hand-written exec(). NULL: no type is described. */
  int (*cell)(const cn_model *m, int type, struct cn_ir *g);
};

const cn_family *cn__family_find(const char *name);
/* model.c: "treelstm, treegru, ..." (every registered family) into buf. */
void cn__family_names(char *buf, size_t cap);
/* model.c: whether the family sizes a tensor by Vw (word_vocab) or by Vt
 * (tgt_vocab), i.e. which extra vocabularies its model.json must name. */
void cn__family_needs(const cn_family *fam, bool *word, bool *tgt);

/* ---- models (model.c) ---------------------------------------------------*/
typedef struct cn_lexicon cn_lexicon;

struct cn_model {
  char *dir;
  const cn_family *fam;
  json_t *json;           /* model.json, kept for describe() */
  cn_dims dims;
  cn_vocab *vocab;        /* input tokens / characters */
  cn_vocab *word_vocab;   /* latticelstm */
  cn_vocab *tgt_vocab;    /* lstm-nmt */
  char **labels;          /* C names or NULL */
  int n_labels;
  bool lowercase;
  char **type_b_labels;   /* treelstm-2type */
  int n_type_b_labels;
  int max_decode_len;     /* lstm-nmt */
  cn_lexicon *lexicon;    /* latticelstm: loaded from lexicon_path      */
  char *lexicon_path;     /* latticelstm: model.json "lexicon", joined to dir;
                             NULL when absent */
  cn_safetensors st;
  int n_tensors;
  const cn_tensor *w[CN_MAX_TENSORS]; /* in the family's spec order */
  /* compiled vertex functions (core/cell.h): [layout - 1][type], NULL
   * where the family has no IR for the type */
  struct cn_cell *cell[2][CN_MAX_TYPES];
};

/* ---- instances (instance.c) ---------------------------------------------*/
struct cn_instance {
  const cn_model *m;
  cn_input_kind kind;
  cn_tree tree;           /* CN_INPUT_TREE */
  int32_t *ids;           /* per node: word id (trees), token ids (seq)... */
  uint8_t *node_type;     /* trees: per node vertex type (family's index) */
  int32_t n;              /* tree nodes / tokens / chars / DAG nodes */
  /* lattices: word spans [start, end) and their word_vocab ids, sorted by
   * (end, start); DAGs: predecessors of node j are
   * prev[prev_start[j] .. prev_start[j + 1]). */
  int32_t n_spans;
  int32_t *span_start, *span_end, *span_word;
  int32_t *prev_start, *prev;
};

/* ---- sequences, lattices, DAGs (seq_parse.c) ----------------------------
 * Parse the non-tree INSTANCE forms of API.md into *in (kind already set).
 * Errors: CN_E_BAD_INSTANCE / CN_E_BAD_LATTICE / CN_E_TOO_LARGE with the
 * offending token, span or node in err->node. */
int cn__parse_sequence(const cn_model *m, const json_t *inst,
                       const cn_limits *lim, cn_instance *in, cn_err *err);
int cn__parse_lattice(const cn_model *m, const json_t *inst,
                      const cn_limits *lim, cn_instance *in, cn_err *err);
int cn__parse_dag(const cn_model *m, const json_t *inst, const cn_limits *lim,
                  cn_instance *in, cn_err *err);

/* ---- lexicon (lexicon.c) --------------------------------------------------
 * A byte trie of the lexicon's words, built once per model at load. */
int cn_lexicon_load(const char *path, cn_lexicon **out, cn_err *err);
int cn_lexicon_from_list(const char *const *words, int n, cn_lexicon **out);
void cn_lexicon_free(cn_lexicon *lx);
/* Every span [b, e), e - b >= 2, whose joined characters (chars[i] of
 * len[i] bytes; ASCII-lowercased when lowercase) are a lexicon word, in
 * (start, end) order. Calls emit(ctx, b, e) per span; stops early and
 * returns its non-zero result. Work is O(n · longest word). */
int cn_lexicon_match(const cn_lexicon *lx, const char *const *chars,
                     const int32_t *len, int32_t n, bool lowercase,
                     int (*emit)(void *ctx, int32_t b, int32_t e), void *ctx);

/* ---- runs (run.c) -------------------------------------------------------
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

typedef struct cn_run_batch {
  int32_t type;
  int32_t start, n;      /* into order[] */
} cn_run_batch;

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
  int64_t max_batch[CN_MAX_TYPES];
  int64_t *state_off;    /* per vertex: float offset of its state row      */
  int32_t *order;        /* vertices in execution order                    */
  cn_run_batch *batches;
  int32_t n_batches;
  int64_t lower_bound;
  const struct cn_fsm *sched_fsm; /* CN_POLICY_FSM: the learned policy (or
                                     NULL: agenda); set by cn_run_exec_fsm */
  /* memory */
  float *arena;          /* backend memory: states, then scratch           */
  float *host;           /* host copy of the states (device backends only) */
  int64_t arena_floats, scratch_off, scratch_floats;
  float *scratch;        /* the batch's scratch: inside the arena for a
                            planned run, its own block (grown) when dynamic */
  int64_t *idx_host;     /* index staging for the batch being launched     */
  int64_t idx_cap, idx_used;
  const float *wb[CN_MAX_TENSORS]; /* the model's tensors, backend copies  */
  bool executed;
  /* data-dependent graphs (cn_family.dynamic) */
  int64_t reserve[CN_MAX_TYPES]; /* vertices exec() may still add, by type */
  struct cn_frontier *live;      /* mirrors vertices added while running  */
  int64_t cap_state_off;
  bool own_scratch;
  int exec_rc;                   /* set by an exec() that could not finish */
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
  long long kernels;
};

/* Adds a vertex with the given inputs; returns its index or -1 (no memory). */
int32_t cn__run_add_vertex(cn_run *r, int type, int slot, int node, int aux,
                           const int32_t *inputs, int n_inputs);
/* Reserves n entries of node_vertex for a slot; returns the first. */
int32_t cn__run_reserve_nodes(cn_run *r, int32_t n);
/* Inputs of vertex v. */
static inline const int32_t *cn__run_inputs(const cn_run *r, int32_t v,
                                            int *n) {
  *n = r->in_start[v + 1] - r->in_start[v];
  return r->in_edges + r->in_start[v];
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
/* Rows `width` floats wide at base + idx[r]: returns a pointer and row
 * stride that read them directly when they are evenly spaced, else gathers
 * them into dst (row stride ldd) and returns dst. Counts copied bytes. */
const float *cn__run_rows(cn_run *r, float *dst, int ldd, const float *base,
                          const int64_t *idx, int n, int width, int *ld);
/* Host-readable view of a vertex's state after execution. */
const float *cn__run_state_host(const cn_run *r, int32_t v);
/* off[i] = state offset of input `which` of verts[i], or -1 if it has no
 * such input (a unary node's second child). Staged in the run's indices. */
int64_t *cn__inputs_off(cn_run *r, const int32_t *verts, int n, int which);
/* off[i] = state offset of verts[i] plus add. */
int64_t *cn__verts_off(cn_run *r, const int32_t *verts, int n, int64_t add);
/* off[i] = vaux[verts[i]] · stride (an embedding row). */
int64_t *cn__aux_off(cn_run *r, const int32_t *verts, int n, int64_t stride);

/* Executes one batch with the run's layout: the compiled cell when the
 * model has one for the type, else the family's exec(). */
void cn__run_exec_batch(cn_run *r, int type, const int32_t *verts, int n);
/* Scratch floats and index entries that batch needs. */
void cn__run_batch_needs(const cn_run *r, int type, int64_t n, int64_t edges,
                         int64_t *scratch, int64_t *idx);

/* Executes a run of a dynamic family (run_dynamic.c): frontier by
 * frontier, the graph growing as exec() adds vertices. */
int cn__run_exec_dynamic(cn_run *r, cn_policy_kind policy, cn_err *err);
/* Shared by run.c and run_dynamic.c. */
void cn__run_bind_weights(cn_run *r);
int cn__run_copy_back(cn_run *r, cn_err *err);

/* ---- scheduling a run (run_sched.c) ---------------------------------------
 * Fills r->order and r->batches for the policy, and r->lower_bound. With
 * CN_POLICY_FSM the policy object is r->sched_fsm (NULL: agenda). */
int cn__sched_plan(cn_run *r, cn_policy_kind policy, cn_err *err);
/* Σ_t depth_t over the run (MODELS.md lower bound). */
int64_t cn__sched_lower_bound(const cn_run *r);

/* ---- scheduling (sched.c) ------------------------------------------------
 * A typed DAG as the scheduler sees it (borrowed arrays): vertices in a
 * topological order, inputs of v at in_edges[in_start[v] .. in_start[v+1]). */
typedef struct cn_dag {
  int n_types;
  int32_t nv;
  const uint8_t *vtype;
  const int32_t *in_start, *in_edges;
} cn_dag;

static inline cn_dag cn__run_dag(const cn_run *r) {
  cn_dag g = {r->fam->n_types, r->nv, r->vtype, r->in_start, r->in_edges};
  return g;
}
int64_t cn__dag_lower_bound(const cn_dag *g);
/* Schedules g with a policy. order (g->nv entries) and batches (g->nv) may
 * be NULL to count only; *n_batches gets the count. fsm: CN_POLICY_FSM's
 * learned policy (NULL: agenda); plan_width: CN_POLICY_PLAN's beam width.
 * Returns 0 or CN_E_NOMEM/CN_E_INTERNAL. */
int cn__sched_dag(const cn_dag *g, cn_policy_kind policy,
                  const struct cn_fsm *fsm, int plan_width, int32_t *order,
                  cn_run_batch *batches, int32_t *n_batches);

/* sched_opt.c: the fewest batches g can run in (ED-Batch §2.1's problem),
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
/* The types a search branches on, from the ready types (bits of live):
 * the forced one if any (-1: none), else the ready types that feed
 * something, else every ready type. */
static inline uint32_t cn__dag_branch_types(uint32_t live, int forced,
                                            uint32_t feeds) {
  if (forced >= 0) return 1u << forced;
  return live & feeds ? live & feeds : live;
}
/* tail[v × n_types + t]: the most type-t vertices on a path from v to a
 * sink (v included), from g's consumers; malloc'd, NULL when out of
 * memory. */
int32_t *cn__dag_tails(const cn_dag *g, const int32_t *out_start,
                       const int32_t *out_edges);

/* sched_plan.c: a schedule by beam search over the product of the graph's
 * instance automata (width states kept per step, ranked by batches so far
 * plus the bound on what is left): an upper bound on the optimum where the
 * exact search runs out of budget, and the schedule of CN_POLICY_PLAN.
 * *schedule (may be NULL) gets the types, malloc'd. Returns 0 or
 * CN_E_NOMEM. */
int cn__dag_beam(const cn_dag *g, int width, int64_t *batches,
                 uint8_t **schedule);

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
  int32_t *sub;                  /* [v][t]: inputs with a type-t vertex left
                                    at or above them (track_sub)          */
  int32_t *q[CN_MAX_TYPES];      /* ready FIFO per type                    */
  int64_t qhead[CN_MAX_TYPES], qtail[CN_MAX_TYPES], qcap[CN_MAX_TYPES];
  int32_t *stack;
  int32_t *tail;                 /* [v][t] (cn__frontier_tails): most type-t
                                    vertices on a path from v to a sink    */
  int32_t *seen_in;              /* scratch of drops(), zero between calls */
  int32_t tails_nv;              /* vertices the tails were computed for   */
  uint32_t feeds;                /* (tails) bit t: a type-t vertex has
                                    consumers (cn__dag_feeding_types)     */
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
  /* The lookahead2 policy's (frontier_la2.c), with the instances. */
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
/* The policy's next type (ED-Batch Alg. 1 line 3), -1 when nothing is
 * ready. Frontier policies: agenda, sufficient (needs track_sub; without it
 * agenda), fsm (fsm NULL: agenda). none/depth are static plans, not
 * frontier policies: they answer agenda here. */
int cn__frontier_next(const cn_frontier *f, cn_policy_kind policy,
                      const struct cn_fsm *fsm);
/* Whether the policy (with fsm for CN_POLICY_FSM) reads drops(), so the
 * driver should call cn__frontier_tails once the graph is added. */
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
 * lower bound Σ_t depth_t of what is left (MODELS.md), 0 for types not
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

#endif /* CANOPY_CORE_INTERNAL_H */
