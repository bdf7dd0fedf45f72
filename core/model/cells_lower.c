/* cells_lower.c - a cells type's checked ops (cells_json.c) into the op
 * IR (core/cell/cell.h), walking back from the state so that only the
 * ops it needs reach the IR. A value is a list of pieces, IR nodes side
 * by side: a slice of a linear is a linear over those weight rows, a
 * slice of a source its columns, a slice of an elementwise op the op over
 * its operands' slices, a concat the pieces joined, a linear over several
 * pieces one product per piece summed. The compiler's K- and N-merges
 * then put the products back together (docs/cells.md). */
#include <string.h>

#include "cell/cell.h"
#include "model/cells_impl.h"

/* ---- lowering into the op IR --------------------------------------------- */
static int memo_find(const cells_ctx *c, int op, int off, int w) {
  for (int k = 0; k < c->n_memo; k++)
    if (c->memo[k].op == op && c->memo[k].off == off && c->memo[k].w == w)
      return c->memo[k].node;
  return -1;
}

static int memo_put(cells_ctx *c, int op, int off, int w, int node) {
  if (c->n_memo < CN_IR_MAX) c->memo[c->n_memo++] = (memo){op, off, w, node};
  return node;
}

static int push_piece(cells_ctx *c, int i, piece *out, int *np, int node,
                      int w) {
  if (*np >= CN_CELLS_MAX_PIECES)
    return cn__cells_op_err(c, i,
                            "its value splits into more than %d pieces; slice "
                            "or concat less finely",
                            CN_CELLS_MAX_PIECES);
  out[(*np)++] = (piece){node, w};
  return 0;
}

static int lower(cells_ctx *c, int i, int off, int w, piece *out, int *np);

/* The one IR node standing for columns [off, off + w) of op i, which the
 * caller knows to be one piece. */
static int lower_one(cells_ctx *c, int i, int off, int w, int *node) {
  piece p[CN_CELLS_MAX_PIECES];
  int n = 0, rc = lower(c, i, off, w, p, &n);
  if (rc != 0) return rc;
  if (n != 1)
    return cn__cells_op_err(c, i, "internal: a segment split in %d", n);
  *node = p[0].node;
  return 0;
}

static int ir_kind(int kind) {
  switch (kind) {
  case OP_ADD: return CN_IR_ADD;
  case OP_SUB: return CN_IR_SUB;
  case OP_MUL: return CN_IR_MUL;
  case OP_DIV: return CN_IR_DIV;
  case OP_SIGMOID: return CN_IR_SIGMOID;
  case OP_TANH: return CN_IR_TANH;
  case OP_EXP: return CN_IR_EXP;
  case OP_RELU: return CN_IR_RELU;
  case OP_STEP: return CN_IR_STEP;
  case OP_SCALE: return CN_IR_SCALE;
  default: return CN_IR_RSUB;
  }
}

/* An input of the vertex (an edge's state, or the sum or mean over its
 * edges), columns [off, off + w) of it; an input read as the identity
 * where absent only whole. */
static int lower_input(cells_ctx *c, int i, int off, int w, int *node) {
  const jop *p = &c->ops[i];
  cn_ir *g = c->g;
  cn_ir_src s = p->kind == OP_INPUT       ? CN_SRC_INPUT
                : p->kind == OP_INPUT_SUM ? CN_SRC_INPUT_SUM
                                          : CN_SRC_INPUT_MEAN;
  *node = cn_ir_src_(g, s, -1, p->edge, p->c0 + off, w,
                     p->name[0] ? p->name : "input");
  if (p->identity) {
    if (off != 0 || w != p->width)
      return cn__cells_op_err(c, i, "a slice of an input read as the "
                              "identity where absent");
    g->node[*node].fill = CN_FILL_IDENTITY;
  }
  return 0;
}

/* A per-vertex matrix product, whole: each operand must lower to one
 * piece. */
static int lower_matmul(cells_ctx *c, int i, int off, int w, int *node) {
  const jop *p = &c->ops[i];
  if (off != 0 || w != p->width)
    return cn__cells_op_err(c, i, "a slice of a matmul's result (slice "
                            "its operands instead)");
  int ab[2] = {-1, -1}, ref[2] = {p->a, p->b}, rc;
  for (int q = 0; q < 2; q++) {
    if (ref[q] < 0) continue;
    piece pc[CN_CELLS_MAX_PIECES];
    int npc = 0;
    if ((rc = lower(c, ref[q], 0, c->ops[ref[q]].width, pc, &npc)))
      return rc;
    if (npc != 1)
      return cn__cells_op_err(c, i, "'%s' is a concatenation of %d "
                              "values; a matmul operand must be one",
                              q == 0 ? "a" : "b", npc);
    ab[q] = pc[0].node;
  }
  int M = p->m, K = p->a >= 0 ? c->ops[p->a].width / M : p->r1 - p->r0;
  *node = cn_ir_bmm(c->g, ab[0], ab[1], p->t, p->r0, p->c0, M, K, w / M);
  return 0;
}

/* A segment sum over the input edges: one per piece of its operand,
 * appended to out. */
static int lower_edge_sum(cells_ctx *c, int i, int off, int w, piece *out,
                          int *np) {
  piece a[CN_CELLS_MAX_PIECES];
  int na = 0, rc;
  if ((rc = lower(c, c->ops[i].a, off, w, a, &na))) return rc;
  for (int k = 0; k < na; k++)
    if ((rc = push_piece(c, i, out, np, cn_ir_seg_sum(c->g, a[k].node),
                         a[k].w)))
      return rc;
  return 0;
}

/* A linear over every piece of its operands, weight rows [r0 + off, +w). */
static int lower_linear(cells_ctx *c, int i, int off, int w, int *node) {
  const jop *p = &c->ops[i];
  piece x[CN_CELLS_MAX_PIECES];
  int nx = 0, xs[CN_CELLS_MAX_PIECES], rc;
  for (int k = 0; k < p->nx; k++)
    if ((rc = lower(c, p->x[k], 0, c->ops[p->x[k]].width, x, &nx))) return rc;
  for (int k = 0; k < nx; k++) xs[k] = x[k].node;
  *node = cn_ir_linear(c->g, xs, nx, p->t, p->r0 + off, w, p->bt,
                       p->r0 + off);
  return 0;
}

/* A one-operand op (a function, a scale, k - a, a + k). Over an operand of
 * several pieces, the op of each piece is appended to out and *node stays
 * -1. */
static int lower_unary(cells_ctx *c, int i, int off, int w, piece *out,
                       int *np, int *node) {
  const jop *p = &c->ops[i];
  cn_ir *g = c->g;
  piece a[CN_CELLS_MAX_PIECES];
  int na = 0, at = off, rc;
  if ((rc = lower(c, p->a, off, w, a, &na))) return rc;
  if (na > 1) { /* elementwise over each piece */
    for (int k = 0; k < na; k++) {
      int o1 = -1;
      if ((rc = lower_one(c, i, at, a[k].w, &o1)) ||
          (rc = push_piece(c, i, out, np, o1, a[k].w)))
        return rc;
      at += a[k].w;
    }
    return 0;
  }
  if (p->kind == OP_SHIFT) /* a + k = k - (-a) */
    *node = cn_ir_const_op(g, CN_IR_RSUB, p->k,
                           cn_ir_const_op(g, CN_IR_SCALE, -1.0f, a[0].node));
  else if (p->kind == OP_SCALE || p->kind == OP_RSUB)
    *node = cn_ir_const_op(g, ir_kind(p->kind), p->k, a[0].node);
  else
    *node = cn_ir_unary(g, ir_kind(p->kind), a[0].node);
  return 0;
}

/* A two-operand op. Where either operand is several pieces, it is cut at
 * every boundary of either, each segment's op appended to out (each lies
 * within one piece of each operand), and *node stays -1. */
static int lower_binary(cells_ctx *c, int i, int off, int w, piece *out,
                        int *np, int *node) {
  const jop *p = &c->ops[i];
  piece a[CN_CELLS_MAX_PIECES], b[CN_CELLS_MAX_PIECES];
  int na = 0, nb = 0, rc;
  if ((rc = lower(c, p->a, off, w, a, &na)) ||
      (rc = lower(c, p->b, off, w, b, &nb)))
    return rc;
  if (na == 1 && nb == 1) {
    *node = cn_ir_binary(c->g, ir_kind(p->kind), a[0].node, b[0].node);
    return 0;
  }
  int ia = 0, ib = 0, ea = off + a[0].w, eb = off + b[0].w, at = off;
  while (at < off + w) {
    int end = ea < eb ? ea : eb, o1 = -1;
    if ((rc = lower_one(c, i, at, end - at, &o1)) ||
        (rc = push_piece(c, i, out, np, o1, end - at)))
      return rc;
    at = end;
    if (at == ea && ++ia < na) ea += a[ia].w;
    if (at == eb && ++ib < nb) eb += b[ib].w;
  }
  return 0;
}

/* A concat: the pieces of the parts that columns [off, off + w) cover,
 * appended to out. */
static int lower_concat(cells_ctx *c, int i, int off, int w, piece *out,
                        int *np) {
  const jop *p = &c->ops[i];
  int base = 0, rc;
  for (int k = 0; k < p->nx && base < off + w; k++) {
    int xw = c->ops[p->x[k]].width;
    int lo = off > base ? off : base;
    int hi = off + w < base + xw ? off + w : base + xw;
    if (lo < hi && (rc = lower(c, p->x[k], lo - base, hi - lo, out, np)))
      return rc;
    base += xw;
  }
  return 0;
}

/* Appends to out the pieces that make columns [off, off + w) of op i: the
 * memoized node, or the op's own lowering (one step per kind above); an
 * op lowered to one node is memoized and appended here. */
static int lower(cells_ctx *c, int i, int off, int w, piece *out, int *np) {
  const jop *p = &c->ops[i];
  cn_ir *g = c->g;
  int node = memo_find(c, i, off, w), rc = 0;
  if (node >= 0) return push_piece(c, i, out, np, node, w);
  switch (p->kind) {
  case OP_INPUT:
  case OP_INPUT_SUM:
  case OP_INPUT_MEAN: rc = lower_input(c, i, off, w, &node); break;
  case OP_TABLE:
    node = cn_ir_src_(g, CN_SRC_EMBED, p->t, 0, off, w,
                      p->name[0] ? p->name : "table");
    break;
  case OP_MATMUL: rc = lower_matmul(c, i, off, w, &node); break;
  case OP_INPUT_EACH:
    node = cn_ir_src_(g, CN_SRC_EDGE, -1, 0, p->c0 + off, w,
                      p->name[0] ? p->name : "input_each");
    break;
  case OP_EDGE_SUM: return lower_edge_sum(c, i, off, w, out, np);
  case OP_EMBED:
    node = cn_ir_src_(g, CN_SRC_EMBED, p->t, 0, off, w,
                      p->name[0] ? p->name : "x");
    break;
  case OP_PARAM: node = cn_ir_param(g, p->t, p->c0 + off, w); break;
  case OP_LINEAR: rc = lower_linear(c, i, off, w, &node); break;
  case OP_SIGMOID:
  case OP_TANH:
  case OP_EXP:
  case OP_RELU:
  case OP_STEP:
  case OP_SCALE:
  case OP_RSUB:
  case OP_SHIFT: rc = lower_unary(c, i, off, w, out, np, &node); break;
  case OP_ADD:
  case OP_SUB:
  case OP_MUL:
  case OP_DIV: rc = lower_binary(c, i, off, w, out, np, &node); break;
  case OP_SLICE: return lower(c, p->a, p->c0 + off, w, out, np);
  case OP_CONCAT: return lower_concat(c, i, off, w, out, np);
  }
  if (rc != 0 || node < 0) return rc; /* failed, or its pieces are in out */
  if (g->overflow)
    return cn__cells_op_err(c, i,
                            "the type needs more than %d IR nodes (CN_IR_MAX) "
                            "once lowered",
                            CN_IR_MAX);
  memo_put(c, i, off, w, node);
  return push_piece(c, i, out, np, node, w);
}

/* Whether node v cannot itself be marked as state columns: a weight or a
 * segment sum (no kernel writes it; a source is gathered straight into
 * the state), a product or a pure sum of products (the
 * compiler folds them into a GEMM whose output may not be the state), or
 * a node already placed. */
static bool needs_copy(const cn_ir *g, int v, bool top) {
  const cn_ir_node *nd = &g->node[v];
  if (top && nd->out_col >= 0) return true;
  switch (nd->kind) {
  case CN_IR_SEG_SUM: /* a source of the vertex cell once split */
  case CN_IR_PARAM:
  case CN_IR_MATMUL: return true;
  case CN_IR_ADD:
    return needs_copy(g, nd->a, false) && needs_copy(g, nd->b, false);
  default: return false;
  }
}

/* Lowers the state list: its pieces become the state's columns. */
int cn__cells_lower_state(cells_ctx *c, const json_t *st) {
  cn_cells *cl = c->m->cells;
  if (!json_is_array(st) || json_array_size(st) < 1 ||
      json_array_size(st) > CN_CELLS_MAX_X)
    return cn__cells_bad(c->err, c->file,
                         "type '%s': 'state' must list 1 to %d ops "
                         "(its columns, in order)",
                         c->type, CN_CELLS_MAX_X);
  int col = 0, rc;
  for (size_t k = 0; k < json_array_size(st); k++) {
    int r;
    /* resolved as if by an op after the last */
    const json_t *v = json_array_get(st, k);
    int n = c->n_ops;
    c->ops[n] = (jop){.kind = CN_CELLS_STATE, .name = "", .a = -1, .b = -1};
    c->n_ops = n + 1;
    rc = cn__cells_get_ref(c, n, v, "state", &r);
    c->n_ops = n;
    if (rc != 0) return rc;
    if (c->ops[r].identity)
      return cn__cells_bad(c->err, c->file,
                           "type '%s': 'state' lists op %d, an input that is "
                           "the identity where absent (only a matmul may "
                           "read it)",
                           c->type, r);
    if (c->ops[r].per_edge)
      return cn__cells_bad(c->err, c->file,
                           "type '%s': 'state' lists op %d, a per-edge value "
                           "(sum it over the input edges with edge_sum)",
                           c->type, r);
    piece pc[CN_CELLS_MAX_PIECES];
    int np = 0;
    if ((rc = lower(c, r, 0, c->ops[r].width, pc, &np))) return rc;
    for (int q = 0; q < np; q++) {
      int node = pc[q].node;
      if (needs_copy(c->g, node, true))
        node = cn_ir_const_op(c->g, CN_IR_SCALE, 1.0f, node);
      if (col + pc[q].w <= cl->state) cn_ir_output(c->g, node, col);
      col += pc[q].w;
    }
  }
  if (col != cl->state)
    return cn__cells_bad(c->err, c->file,
                         "type '%s': 'state' is %d floats wide, but "
                         "cells.state is %d (state widths must agree)",
                         c->type, col, cl->state);
  if (c->g->overflow)
    return cn__cells_bad(c->err, c->file,
                         "type '%s' needs more than %d IR nodes "
                         "(CN_IR_MAX) once lowered",
                         c->type, CN_IR_MAX);
  c->g->state_floats = cl->state;
  return 0;
}
