/* pqtree.h - PQ-trees (Booth & Lueker 1976) and the ED-Batch memory layout
 * built on them (ED-Batch §3.2, Appendix B Alg. 2-7).
 *
 * A PQ-tree over leaves 0..n-1 stands for a set of admitted leaf orders:
 * the children of a P-node may be permuted freely, those of a Q-node only
 * reversed. Each cn_pq_reduce adds one "these leaves are consecutive"
 * constraint. cn_pq_layout uses the tree to place the variables of a
 * static subgraph in memory so that batched operands are contiguous and
 * aligned, which saves the gather/scatter copies around each batch.
 *
 * Sizes here are small (a static subgraph has < 200 variables), so the
 * code favours plain, checkable steps over Booth & Lueker's linear-time
 * bookkeeping. core/cell/pqtree.c holds the tree, core/cell/pqtree_align.c the
 * layout. */
#ifndef CANOPY_PQTREE_H
#define CANOPY_PQTREE_H

#include <stddef.h>

/* cn_pq_reduce's answer when the new constraint contradicts the earlier
 * ones (the tree is then left exactly as it was). */
#define CN_PQ_CONFLICT (-1)

typedef struct cn_pq cn_pq; /* opaque */

/* The universal tree: one P-node over leaves 0..n-1 (n >= 1; a single
 * leaf is its own root). The caller owns the result and frees it with
 * cn_pq_free. NULL on no memory or n < 1. */
cn_pq *cn_pq_new(int n_leaves);
void cn_pq_free(cn_pq *t);
/* A deep copy, owned by the caller; NULL on no memory. */
cn_pq *cn_pq_clone(const cn_pq *t);
int cn_pq_n_leaves(const cn_pq *t);

/* Restricts the tree so that the leaves in set[0..k) are consecutive in
 * every admitted order (Booth & Lueker REDUCE, templates L1, P1-P6,
 * Q1-Q3). Returns 0; CN_PQ_CONFLICT (-1) when no order satisfies it
 * together with the earlier constraints, or when set names a leaf out of
 * range; CN_E_NOMEM on no memory. On any failure the tree is left exactly
 * as it was. Duplicates in set are ignored; k <= 1 is a no-op. */
int cn_pq_reduce(cn_pq *t, const int *set, int k);

/* One admitted order (the frontier, children left to right):
 * order[0..n_leaves). */
void cn_pq_frontier(const cn_pq *t, int *order);

/* Calls fn for every admitted order (all P-node permutations x all Q-node
 * reversals, each order exactly once) and returns how many there were;
 * meant for tests on <= 8 leaves. CN_E_NOMEM on no memory. */
long cn_pq_enumerate(const cn_pq *t, void (*fn)(const int *order, void *ctx),
                     void *ctx);

/* Debug: writes the tree like "P[0 Q[1 2 3] 4]" into buf (truncated to
 * cap - 1 characters, always NUL-terminated when cap > 0). */
void cn_pq_format(const cn_pq *t, char *buf, size_t cap);

/* ---- ED-Batch memory layout (§3.2) -------------------------------------
 * A batch is several ops of one kind run as one kernel. It has m operands
 * (result and sources), each an array of k variables aligned by op index:
 * operand o's i-th variable belongs to op i. A batch with m = 1 is a plain
 * adjacency constraint. */
typedef struct cn_pq_batch {
  int n_operands;   /* m >= 1 */
  int n_ops;        /* k >= 1 */
  const int *vars;  /* m * k variable ids, operand-major: vars[o*k + i] */
} cn_pq_batch;

/* Finds a leaf order (order[pos] = variable) of the n_vars variables in
 * which, for every batch kept, each operand's variables are consecutive
 * and all operands list their ops in the same relative order (for ops i,
 * j: pos(o[i]) < pos(o[j]) iff pos(o'[i]) < pos(o'[j]) for all operands
 * o, o').
 *
 * An operand that names one variable more than once is a broadcast: it
 * gets no constraint (the caller copies it). Batches are taken in order;
 * one whose constraints conflict with those already kept is dropped
 * (kept[b] = 0) and never fails the whole layout (ED-Batch Alg. 2 line
 * 14). A batch with a variable id outside [0, n_vars), n_operands < 1 or
 * n_ops < 1 is dropped too. Every kept batch satisfies cn_pq_batch_ok on
 * the returned order. Returns 0, or CN_E_NOMEM on no memory (order and
 * kept are then unspecified). */
int cn_pq_layout(int n_vars, const cn_pq_batch *b, int n_batches, int *order,
                 unsigned char *kept);

/* Checks one batch against an order given as pos[var]: 1 when every
 * non-broadcast operand is consecutive and all of them are aligned, else
 * 0. Exact; allocates nothing. */
int cn_pq_batch_ok(const cn_pq_batch *b, const int *pos);

/* ---- internal: pqtree.c <-> pqtree_align.c ------------------------------
 * Read-only access to the node arrays. Node ids 0..n_leaves-1 are the
 * leaves; internal nodes have larger ids, below cn__pq_n_slots. */
enum { CN__PQ_LEAF = 0, CN__PQ_P = 1, CN__PQ_Q = 2, CN__PQ_FREE = 3 };
int cn__pq_n_slots(const cn_pq *t);
int cn__pq_root(const cn_pq *t);
int cn__pq_kind(const cn_pq *t, int node);
int cn__pq_parent(const cn_pq *t, int node);     /* -1 for the root */
int cn__pq_first(const cn_pq *t, int node);      /* -1 for a leaf */
int cn__pq_next(const cn_pq *t, int node);       /* next sibling or -1 */
int cn__pq_n_children(const cn_pq *t, int node);
/* cn_pq_reduce that also says whether the tree's structure changed
 * (*changed = 0 when the constraint was already implied). */
int cn__pq_reduce(cn_pq *t, const int *set, int k, int *changed);

#endif
