/* treegru.c - binary Tree-GRU, docs/models.md "treegru".
 *
 * State of every node vertex: h, H floats. Every vertex type is
 * described in the op IR below and runs compiled (core/cell/cell.h).
 */
#include "cell/cell.h"
#include "families/families.h"

enum { EMBED, LEAF_W, LEAF_B, INT_UG, INT_BG, INT_UN, INT_BN, OUT_W, OUT_B };
enum { T_LEAF, T_INTERNAL, T_OUTPUT };

static int spec(const cn_dims *d, cn_tensor_spec *t) {
  int64_t H = d->H, D = d->D, C = d->C, V = d->V;
  t[EMBED] = (cn_tensor_spec){"embed", 2, {V, D}, CN_INIT_EMBED};
  t[LEAF_W] = (cn_tensor_spec){"leaf.W", 2, {H, D}, CN_INIT_LINEAR};
  t[LEAF_B] = (cn_tensor_spec){"leaf.b", 1, {H}, CN_INIT_BIAS};
  t[INT_UG] = (cn_tensor_spec){"internal.Ug", 2, {3 * H, 2 * H},
                               CN_INIT_LINEAR};
  t[INT_BG] = (cn_tensor_spec){"internal.bg", 1, {3 * H}, CN_INIT_BIAS};
  t[INT_UN] = (cn_tensor_spec){"internal.Un", 2, {H, 2 * H}, CN_INIT_LINEAR};
  t[INT_BN] = (cn_tensor_spec){"internal.bn", 1, {H}, CN_INIT_BIAS};
  t[OUT_W] = (cn_tensor_spec){"out.W", 2, {C, H}, CN_INIT_LINEAR};
  t[OUT_B] = (cn_tensor_spec){"out.b", 1, {C}, CN_INIT_BIAS};
  return 9;
}


static int64_t state_floats(const cn_model *m, int type) {
  return type == T_OUTPUT ? m->dims.C : m->dims.H;
}

/* The cells as op IR (core/cell/cell.h), docs/models.md "treegru":
 *   leaf: h = tanh(leaf.W x + leaf.b).
 *   internal: (r1, r2, z) = σ(Ug [h1; h2] + bg);
 *         n = tanh(Un [r1⊙h1; r2⊙h2] + bn); h = z⊙(h1 + h2)/2 + (1-z)⊙n. */
static int cell(const cn_model *m, int type, cn_ir *g) {
  int H = (int)m->dims.H, D = (int)m->dims.D;
  if (type == T_OUTPUT) return cn__ir_output_layer(m, g, 1, OUT_W, OUT_B);
  g->state_floats = H;
  if (type == T_LEAF) {
    int x = cn_ir_src_(g, CN_SRC_EMBED, EMBED, 0, 0, D, "x");
    int h = cn_ir_unary(g, CN_IR_TANH,
                        cn_ir_linear(g, &x, 1, LEAF_W, 0, H, LEAF_B, 0));
    cn_ir_output(g, h, 0);
    return 0;
  }
  int x[2] = {cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, H, "h1"),
              cn_ir_src_(g, CN_SRC_INPUT, -1, 1, 0, H, "h2")};
  int gate[3];
  for (int q = 0; q < 3; q++)
    gate[q] = cn_ir_unary(g, CN_IR_SIGMOID,
                          cn_ir_linear(g, x, 2, INT_UG, q * H, H, INT_BG,
                                       q * H));
  int rh[2] = {cn_ir_binary(g, CN_IR_MUL, gate[0], x[0]),
               cn_ir_binary(g, CN_IR_MUL, gate[1], x[1])};
  int n = cn_ir_unary(g, CN_IR_TANH,
                      cn_ir_linear(g, rh, 2, INT_UN, 0, H, INT_BN, 0));
  int z = gate[2];
  int avg = cn_ir_const_op(g, CN_IR_SCALE, 0.5f,
                           cn_ir_binary(g, CN_IR_ADD, x[0], x[1]));
  int h = cn_ir_binary(
      g, CN_IR_ADD, cn_ir_binary(g, CN_IR_MUL, z, avg),
      cn_ir_binary(g, CN_IR_MUL, cn_ir_const_op(g, CN_IR_RSUB, 1.0f, z), n));
  cn_ir_output(g, h, 0);
  return 0;
}

const cn_family cn__fam_treegru =
    CN__TREE_FAMILY("treegru", 2, spec, cn__tree_build3, state_floats, cell,
                    "leaf", "internal", "output");
