/* cell_compiler.h - the compiler's working state (cell_compile.c) and
 * its product planning (cell_products.c), shared by those two files only.
 * The compiler calls the planner, never the other way round. */
#ifndef CANOPY_CELL_COMPILER_H
#define CANOPY_CELL_COMPILER_H

#include "cell/cell.h"

#define MAX_TREES 12

/* A term: one output block of a product. Either a whole sum of products
 * (K-merged: several matmuls, the sum's params as bias) or one product. */
typedef struct term {
  int value;        /* IR node the term's result stands for              */
  int n_mm;
  int mm[8];        /* matmul nodes                                      */
  int n_par;
  int par[4];       /* param nodes folded into the bias                  */
  int gemm;         /* which product it ends up in                       */
} term;

/* A sum tree: an ADD whose leaves are products and params only. */
typedef struct sumtree {
  int root;
  int n_mm, mm[8];
  int n_par, par[4];
} sumtree;

typedef struct compiler {
  const cn_tensor *const *w; /* the model's tensors, by index */
  const cn_ir *g;
  int layout;
  int uses[CN_IR_MAX];
  int tree_of[CN_IR_MAX];   /* node -> sum tree that folds it, or -1      */
  int n_trees;
  sumtree trees[MAX_TREES];
  /* chosen batching */
  bool merged[MAX_TREES];
  int n_terms;
  term terms[32];
  int n_gemm;
  int gemm_terms[8][16], gemm_nt[8];
  int gemm_in[8][8], gemm_nin[8];
  /* values */
  int var_of[CN_IR_MAX];    /* IR node -> var, -1 */
  int producer[CN_IR_MAX];  /* step that makes it (-1: available at start) */
  int level[CN_IR_MAX];
  bool is_ew[CN_IR_MAX];
  bool done[CN_IR_MAX];
  /* per-vertex products: bmm_root[v] is the value a BMM node or an ADD of
   * a BMM sum stands for (the sum's root, or the BMM itself), else -1 */
  int bmm_root[CN_IR_MAX];
  int n_bmm_step;            /* BMM nodes in step order (c->bmm's order)  */
  int bmm_node[16];
  cn_cell *c;
} compiler;

static inline bool is_bmm(const cn_ir *g, int v) {
  return g->node[v].kind == CN_IR_BMM;
}

/* Whether node v's value exists at this point of the schedule. */
static inline bool available(const compiler *cp, int v) {
  return cp->done[v];
}

static inline int add_step(cn_cell *c, int kind, int i) {
  if (c->n_steps >= (int)CN_ARRAY_SIZE(c->steps)) return CN_E_INTERNAL;
  c->steps[c->n_steps++] = (cn_cell_step){.kind = (uint8_t)kind, .i = i};
  return 0;
}

/* ---- cell_products.c ---- */
/* Finds the sum trees: largest pure sums of products and params, each a
 * candidate to fold into one product (fills tree_of, trees). */
void cn__cell_find_trees(compiler *cp);
/* Chooses which sums to K-merge and plans the products (terms, gemm_*):
 * 0, or CN_E_INTERNAL when no choice fits. */
int cn__cell_choose_batching(compiler *cp);
/* Marks each per-vertex product's value: itself, or the sum it is
 * accumulated into in one gemm_batched call (fills bmm_root). */
void cn__cell_find_bmm_sums(compiler *cp);
/* Schedules every per-vertex product (sum) whose operands are ready, as
 * BMM steps; sets *progress when any was. 0 or CN_E_INTERNAL. */
int cn__cell_schedule_bmm(compiler *cp, bool *progress);

#endif
