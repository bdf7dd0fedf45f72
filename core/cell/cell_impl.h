/* cell_impl.h - what the compiler of vertex functions (cell_compile.c)
 * and its layout and emission pass (cell_layout.c) share. */
#ifndef CANOPY_CELL_IMPL_H
#define CANOPY_CELL_IMPL_H

#include "cell/cell.h"

/* An instruction whose operands are still vars (-1: none). */
typedef struct var_insn {
  uint8_t op;
  int32_t width;
  int32_t d, a, b;
} var_insn;

typedef struct cell_item {
  int node, kernel, level, seq;
  var_insn insn;
} cell_item;

/* Lowers every ew node to one instruction (an unmerged sum to a chain). */

/* Same-kind instructions at one level of one kernel: an ED-Batch batch. */
typedef struct cell_group {
  int n, item[16];
} cell_group;

/* Places the vars (pq: the PQ-tree layout over the products' operands and
 * the groups; naive: a buffer each); kept[g]: group g's constraint held. */
int cn__cell_layout(cn_cell *c, const cell_group *groups, int n_groups,
                    const cell_item *items, unsigned char *kept);
/* Orders a product's operand vars by their place in memory. */
void cn__cell_sort_by_pos(const cn_cell *c, int32_t *v, int n);
/* Fills c->ew[].insn in launch form. */
int cn__cell_emit(cn_cell *c, const cell_item *items, int n_items,
                  const cell_group *groups, const int *in_group,
                  const unsigned char *kept);
/* Kernels, copy kernels, floats copied and staging, per execution. */
void cn__cell_count_costs(cn_cell *c);
/* cell_compile.c: one graph without per-edge values into a cell
 * (cn__cell_compile_weights, cell_edges.c, splits the others first). */
int cn__cell_compile_one(const cn_tensor *const *w, const char *family,
                         int type, const char *type_name, const cn_ir *g,
                         int layout, cn_cell **out, cn_err *err);

#endif
