/* childsum.c - Child-Sum Tree-LSTM (Tai et al. 2015), any arity, docs/models.md
 * "childsum-treelstm".
 *
 * State of every node vertex: [h | c], 2H floats. cell.W, cell.U, cell.b
 * rows split (i, f, o, u). Every type is a cell (the op IR below):
 *   leaf (x = embed[w], no children): c = σ(i)⊙tanh(u); h = σ(o)⊙tanh(c).
 *   internal (x = 0): hs = Σk h_k; c = σ(i)⊙tanh(u) + Σk σ(F_k + b_f)⊙c_k
 *             with F_k = h_k·U_fᵀ, one per child edge (segment ops);
 *             h = σ(o)⊙tanh(c).
 *   output:   logits = h·out.Wᵀ + out.b.
 */
#include "cell/cell.h"
#include "families/families.h"

enum { EMBED, CELL_W, CELL_U, CELL_B, OUT_W, OUT_B };
enum { T_LEAF, T_INTERNAL, T_OUTPUT };

static int spec(const cn_dims *d, cn_tensor_spec *t) {
  int64_t H = d->H, D = d->D, C = d->C, V = d->V;
  t[EMBED] = (cn_tensor_spec){"embed", 2, {V, D}, CN_INIT_EMBED};
  t[CELL_W] = (cn_tensor_spec){"cell.W", 2, {4 * H, D}, CN_INIT_LINEAR};
  t[CELL_U] = (cn_tensor_spec){"cell.U", 2, {4 * H, H}, CN_INIT_LINEAR};
  t[CELL_B] = (cn_tensor_spec){"cell.b", 1, {4 * H}, CN_INIT_BIAS};
  t[OUT_W] = (cn_tensor_spec){"out.W", 2, {C, H}, CN_INIT_LINEAR};
  t[OUT_B] = (cn_tensor_spec){"out.b", 1, {C}, CN_INIT_BIAS};
  return 6;
}


static int64_t state_floats(const cn_model *m, int type) {
  return type == T_OUTPUT ? m->dims.C : 2 * m->dims.H;
}

/* The input, output and update gates from x·W[rows]ᵀ + cell.b (rows i, o,
 * u of (i, f, o, u)): σ, σ, tanh. */
static void iou(cn_ir *g, int x, int W, int H, int *i, int *o, int *u) {
  int rows[3] = {0, 2, 3}, *out[3] = {i, o, u};
  for (int k = 0; k < 3; k++)
    *out[k] = cn_ir_unary(
        g, k < 2 ? CN_IR_SIGMOID : CN_IR_TANH,
        cn_ir_linear(g, &x, 1, W, rows[k] * H, H, CELL_B, rows[k] * H));
}

/* The internal cell: one forget gate per child, any arity, as segment ops
 * (core/cell/cell.h): hs = Σ_k h_k; i, o, u from hs·U and b (one product
 * of 3H outputs: the forget rows are not computed per vertex);
 * f_k = σ(h_k·U_fᵀ + b_f) ⊙ c_k per child edge (a product over the batch's
 * E edges, then elementwise work on E rows); c = σ(i)⊙tanh(u) + Σ_k f_k;
 * h = σ(o)⊙tanh(c). */
static int internal_cell(const cn_model *m, cn_ir *g) {
  int H = (int)m->dims.H;
  int hs = cn_ir_src_(g, CN_SRC_INPUT_SUM, -1, 0, 0, H, "hs");
  int hk = cn_ir_src_(g, CN_SRC_EDGE, -1, 0, 0, H, "h_k");
  int ck = cn_ir_src_(g, CN_SRC_EDGE, -1, 0, H, H, "c_k");
  int i, o, u;
  iou(g, hs, CELL_U, H, &i, &o, &u);
  int fk = cn_ir_unary(g, CN_IR_SIGMOID,
                       cn_ir_linear(g, &hk, 1, CELL_U, H, H, CELL_B, H));
  int fc = cn_ir_seg_sum(g, cn_ir_binary(g, CN_IR_MUL, fk, ck));
  int c = cn_ir_binary(g, CN_IR_ADD, cn_ir_binary(g, CN_IR_MUL, i, u), fc);
  return cn__ir_lstm_state(g, o, c, H);
}

/* The cells as op IR (core/cell/cell.h). A leaf has no children (hs = 0):
 * i = σ(Wi x + bi), o, u likewise; c = i⊙u; h = o⊙tanh(c). */
static int cell(const cn_model *m, int type, cn_ir *g) {
  int H = (int)m->dims.H, D = (int)m->dims.D;
  if (type == T_OUTPUT) return cn__ir_output_layer(m, g, 1, OUT_W, OUT_B);
  if (type == T_INTERNAL) return internal_cell(m, g);
  int x = cn_ir_src_(g, CN_SRC_EMBED, EMBED, 0, 0, D, "x");
  int i, o, u;
  iou(g, x, CELL_W, H, &i, &o, &u);
  int c = cn_ir_binary(g, CN_IR_MUL, i, u);
  return cn__ir_lstm_state(g, o, c, H);
}

const cn_family cn__fam_childsum =
    CN__TREE_FAMILY("childsum-treelstm", 0, spec, cn__tree_build3,
                    state_floats, cell, "leaf", "internal", "output");
