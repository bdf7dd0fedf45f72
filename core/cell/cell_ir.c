/* cell_ir.c - building a vertex function's op IR (cell.h). The builders
 * never fail: a graph that outgrows CN_IR_MAX is flagged and the compiler
 * rejects it with CN_E_INTERNAL. */
#include <string.h>

#include "cell/cell.h"

static int push(cn_ir *g, cn_ir_node nd) {
  if (g->n >= CN_IR_MAX) {
    g->overflow = true;
    return 0;
  }
  nd.out_col = -1;
  g->node[g->n] = nd;
  return g->n++;
}

static int width_of(const cn_ir *g, int v) {
  return v >= 0 && v < g->n ? g->node[v].width : 0;
}

int cn_ir_src_(cn_ir *g, cn_ir_src src, int t, int edge, int col, int width,
               const char *name) {
  return push(g, (cn_ir_node){.kind = CN_IR_SRC, .src = (uint8_t)src,
                              .width = width, .a = -1, .b = -1, .t = t,
                              .r0 = edge, .c0 = col, .name = name});
}

int cn_ir_param(cn_ir *g, int t, int off, int width) {
  return push(g, (cn_ir_node){.kind = CN_IR_PARAM, .width = width, .a = -1,
                              .b = -1, .t = t, .r0 = off});
}

int cn_ir_matmul(cn_ir *g, int a, int t, int r0, int c0, int width) {
  return push(g, (cn_ir_node){.kind = CN_IR_MATMUL, .width = width, .a = a,
                              .b = -1, .t = t, .r0 = r0, .c0 = c0});
}

int cn_ir_binary(cn_ir *g, cn_ir_kind kind, int a, int b) {
  int w = width_of(g, a);
  if (w != width_of(g, b)) g->overflow = true; /* widths must agree */
  return push(g, (cn_ir_node){.kind = (uint8_t)kind, .width = w, .a = a,
                              .b = b, .t = -1});
}

int cn_ir_unary(cn_ir *g, cn_ir_kind kind, int a) {
  return push(g, (cn_ir_node){.kind = (uint8_t)kind, .width = width_of(g, a),
                              .a = a, .b = -1, .t = -1});
}

int cn_ir_const_op(cn_ir *g, cn_ir_kind kind, float k, int a) {
  return push(g, (cn_ir_node){.kind = (uint8_t)kind, .width = width_of(g, a),
                              .a = a, .b = -1, .t = -1, .k = k});
}

int cn_ir_linear(cn_ir *g, const int *x, int nx, int t, int r0, int width,
                 int bt, int boff) {
  int sum = -1, c0 = 0;
  for (int i = 0; i < nx; i++) {
    int p = cn_ir_matmul(g, x[i], t, r0, c0, width);
    c0 += width_of(g, x[i]);
    sum = sum < 0 ? p : cn_ir_binary(g, CN_IR_ADD, sum, p);
  }
  if (bt >= 0)
    sum = cn_ir_binary(g, CN_IR_ADD, sum, cn_ir_param(g, bt, boff, width));
  return sum;
}

void cn_ir_output(cn_ir *g, int v, int col) {
  if (v >= 0 && v < g->n) g->node[v].out_col = col;
}

int cn_ir_seg_sum(cn_ir *g, int a) {
  return push(g, (cn_ir_node){.kind = CN_IR_SEG_SUM, .width = width_of(g, a),
                              .a = a, .b = -1, .t = -1});
}

int cn_ir_bmm(cn_ir *g, int a, int b, int t, int r0, int c0, int m, int kk,
              int n) {
  if ((a >= 0 && width_of(g, a) != m * kk) ||
      (b >= 0 && width_of(g, b) != kk * n) || (a < 0 && b < 0) || m <= 0 ||
      kk <= 0 || n <= 0)
    g->overflow = true; /* operand widths must match the shapes */
  return push(g, (cn_ir_node){.kind = CN_IR_BMM, .width = m * n, .a = a,
                              .b = b, .t = t, .r0 = r0, .c0 = c0, .m = m,
                              .kk = kk});
}

void cn_ir_from(cn_ir *g, int v, int type) {
  if (v >= 0 && v < g->n && type >= 0 && type < 255)
    g->node[v].from1 = (uint8_t)(type + 1);
  else
    g->overflow = true;
}
