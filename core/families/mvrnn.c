/* mvrnn.c - Matrix-Vector RNN (Socher et al. 2012), docs/models.md "mvrnn".
 *
 * State of every node vertex: [a | A], H + H·H floats (vector, then the
 * H×H matrix row-major). Every type is a cell (below):
 *   leaf:     a = embed[w]; A = leaf.M[w] (w < K) else leaf.M[0].
 *   internal: X = [B a; A b] (batched mat-vecs); p = tanh(X·Wᵀ + b);
 *             P = WM[:, :H]·A + WM[:, H:]·B (batched mat-mats). A unary
 *             node's missing child is b = 0, B = I.
 *   output:   logits = p·out.Wᵀ + out.b.
 * The mat-mat products dominate: ED-Batch §6 notes MV-RNN is bound by them.
 */
#include "cell/cell.h"
#include "families/families.h"

enum { EMBED, LEAF_M, INT_W, INT_B, INT_WM, OUT_W, OUT_B };
enum { T_LEAF, T_INTERNAL, T_OUTPUT };

static int spec(const cn_dims *d, cn_tensor_spec *t) {
  int64_t H = d->H, C = d->C, V = d->V;
  int64_t K = d->K > 0 ? d->K : -1; /* any number of leaf matrices */
  t[EMBED] = (cn_tensor_spec){"embed", 2, {V, H}, CN_INIT_EMBED};
  t[LEAF_M] = (cn_tensor_spec){"leaf.M", 3, {K, H, H}, CN_INIT_MATRICES};
  t[INT_W] = (cn_tensor_spec){"internal.W", 2, {H, 2 * H}, CN_INIT_LINEAR};
  t[INT_B] = (cn_tensor_spec){"internal.b", 1, {H}, CN_INIT_BIAS};
  t[INT_WM] = (cn_tensor_spec){"internal.WM", 2, {H, 2 * H}, CN_INIT_LINEAR};
  t[OUT_W] = (cn_tensor_spec){"out.W", 2, {C, H}, CN_INIT_LINEAR};
  t[OUT_B] = (cn_tensor_spec){"out.b", 1, {C}, CN_INIT_BIAS};
  return 7;
}


static int64_t state_floats(const cn_model *m, int type) {
  return type == T_OUTPUT ? m->dims.C : m->dims.H + m->dims.H * m->dims.H;
}

/* The cells as op IR (core/cell/cell.h), per-vertex products (CN_IR_BMM)
 * where the hand-written kernels had mvrnn_vec and mvrnn_mat:
 *   leaf:     a = embed[w], A = leaf.M[w] (row 0 past leaf.M's K rows):
 *             both sources, gathered straight into the state;
 *   internal: x1 = B·a, x2 = A·b (one batched call: same shapes);
 *             p = tanh([x1; x2]·Wᵀ + b); P = WM[:, :H]·A + WM[:, H:]·B
 *             (the second product accumulated into the first, in place).
 *             A missing second child reads b = 0 and B = I (its source's
 *             fill), so a unary node gives x = [a; 0], P = WM_l·A + WM_r. */
static int cell(const cn_model *m, int type, cn_ir *g) {
  int H = (int)m->dims.H, HH = H * H;
  if (type == T_OUTPUT) return cn__ir_output_layer(m, g, 1, OUT_W, OUT_B);
  if (type == T_LEAF) {
    int a = cn_ir_src_(g, CN_SRC_EMBED, EMBED, 0, 0, H, "a");
    int A = cn_ir_src_(g, CN_SRC_EMBED, LEAF_M, 0, 0, HH, "A");
    cn_ir_output(g, a, 0); /* gathered straight into the state */
    cn_ir_output(g, A, H);
    g->state_floats = H + HH;
    return 0;
  }
  int a = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, H, "a");
  int A = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, H, HH, "A");
  int b = cn_ir_src_(g, CN_SRC_INPUT, -1, 1, 0, H, "b");
  int B = cn_ir_src_(g, CN_SRC_INPUT, -1, 1, H, HH, "B");
  g->node[B].fill = CN_FILL_IDENTITY;
  int x[2] = {cn_ir_bmm(g, B, a, -1, 0, 0, H, H, 1),
              cn_ir_bmm(g, A, b, -1, 0, 0, H, H, 1)};
  cn_ir_output(g, cn_ir_unary(g, CN_IR_TANH,
                              cn_ir_linear(g, x, 2, INT_W, 0, H, INT_B, 0)),
               0);
  int P = cn_ir_binary(g, CN_IR_ADD,
                       cn_ir_bmm(g, -1, A, INT_WM, 0, 0, H, H, H),
                       cn_ir_bmm(g, -1, B, INT_WM, 0, H, H, H, H));
  cn_ir_output(g, P, H);
  g->state_floats = H + HH;
  return 0;
}

const cn_family cn__fam_mvrnn =
    CN__TREE_FAMILY("mvrnn", 2, spec, cn__tree_build3, state_floats, cell,
                    "leaf", "internal", "output");
