/* treelstm.c - binary constituency Tree-LSTM (Tai et al. 2015, N-ary with
 * N = 2) and its two-internal-type variant, docs/models.md "treelstm" and
 * "treelstm-2type".
 *
 * State of every node vertex: [h | c], 2H floats. Every vertex type is
 * described in the op IR below and runs compiled (core/cell/cell.h): the
 * leaf one product and one fused elementwise kernel, the internal one
 * product over the children's h read where they live and one kernel
 * reading c1, c2 where they live, the output one product.
 */
#include "cell/cell.h"
#include "families/families.h"

enum { EMBED, LEAF_W, LEAF_B, OUT_W, OUT_B, INT_U, INT_B, INT_B_U, INT_B_B };

static int spec_common(const cn_dims *d, cn_tensor_spec *t) {
  int64_t H = d->H, D = d->D, C = d->C, V = d->V;
  t[EMBED] = (cn_tensor_spec){"embed", 2, {V, D}, CN_INIT_EMBED};
  t[LEAF_W] = (cn_tensor_spec){"leaf.W", 2, {3 * H, D}, CN_INIT_LINEAR};
  t[LEAF_B] = (cn_tensor_spec){"leaf.b", 1, {3 * H}, CN_INIT_BIAS};
  t[OUT_W] = (cn_tensor_spec){"out.W", 2, {C, H}, CN_INIT_LINEAR};
  t[OUT_B] = (cn_tensor_spec){"out.b", 1, {C}, CN_INIT_BIAS};
  return 5;
}

static int spec_treelstm(const cn_dims *d, cn_tensor_spec *t) {
  int n = spec_common(d, t);
  t[n++] = (cn_tensor_spec){"internal.U", 2, {5 * d->H, 2 * d->H},
                            CN_INIT_LINEAR};
  t[n++] = (cn_tensor_spec){"internal.b", 1, {5 * d->H}, CN_INIT_BIAS};
  return n;
}

static int spec_2type(const cn_dims *d, cn_tensor_spec *t) {
  int n = spec_common(d, t);
  t[n++] = (cn_tensor_spec){"internal_a.U", 2, {5 * d->H, 2 * d->H},
                            CN_INIT_LINEAR};
  t[n++] = (cn_tensor_spec){"internal_a.b", 1, {5 * d->H}, CN_INIT_BIAS};
  t[n++] = (cn_tensor_spec){"internal_b.U", 2, {5 * d->H, 2 * d->H},
                            CN_INIT_LINEAR};
  t[n++] = (cn_tensor_spec){"internal_b.b", 1, {5 * d->H}, CN_INIT_BIAS};
  return n;
}

/* Types: treelstm {leaf, internal, output}; 2type {leaf, internal_a,
 * internal_b, output}. The output type is always the last. */
static bool is_2type(const cn_run *r) { return r->fam->n_types == 4; }

static int build(cn_run *r, int slot) {
  cn_tree_types tt = {0, 1, is_2type(r) ? 2 : -1, is_2type(r) ? 3 : 2,
                      false};
  return cn__tree_build(r, slot, &tt);
}

static int64_t state_floats(const cn_model *m, int type) {
  return type == m->fam->n_types - 1 ? m->dims.C : 2 * m->dims.H;
}

/* The cells as op IR (core/cell/cell.h), docs/models.md "treelstm":
 *   leaf: g = leaf.W x + leaf.b, (i, o, u); c = σ(i)⊙tanh(u);
 *         h = σ(o)⊙tanh(c).
 *   internal: g = U [h1; h2] + b, (i, f1, f2, o, u);
 *         c = σ(i)⊙tanh(u) + σ(f1)⊙c1 + σ(f2)⊙c2; h = σ(o)⊙tanh(c). */
static int cell(const cn_model *m, int type, cn_ir *g) {
  int H = (int)m->dims.H, D = (int)m->dims.D;
  int last = m->fam->n_types - 1;
  if (type == last) return cn__ir_output_layer(m, g, 1, OUT_W, OUT_B);
  int gate[5], n_gates;
  if (type == 0) {
    int x = cn_ir_src_(g, CN_SRC_EMBED, EMBED, 0, 0, D, "x");
    n_gates = 3;
    for (int q = 0; q < 3; q++)
      gate[q] = cn_ir_linear(g, &x, 1, LEAF_W, q * H, H, LEAF_B, q * H);
  } else {
    int U = type == 2 ? INT_B_U : INT_U, B = type == 2 ? INT_B_B : INT_B;
    int x[2] = {cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, H, "h1"),
                cn_ir_src_(g, CN_SRC_INPUT, -1, 1, 0, H, "h2")};
    n_gates = 5;
    for (int q = 0; q < 5; q++)
      gate[q] = cn_ir_linear(g, x, 2, U, q * H, H, B, q * H);
  }
  int i = cn_ir_unary(g, CN_IR_SIGMOID, gate[0]);
  int o = cn_ir_unary(g, CN_IR_SIGMOID, gate[n_gates - 2]);
  int u = cn_ir_unary(g, CN_IR_TANH, gate[n_gates - 1]);
  int c = cn_ir_binary(g, CN_IR_MUL, i, u);
  if (type != 0)
    for (int k = 0; k < 2; k++) {
      int ck = cn_ir_src_(g, CN_SRC_INPUT, -1, k, H, H, "c");
      int f = cn_ir_unary(g, CN_IR_SIGMOID, gate[1 + k]);
      c = cn_ir_binary(g, CN_IR_ADD, c, cn_ir_binary(g, CN_IR_MUL, f, ck));
    }
  return cn__ir_lstm_state(g, o, c, H);
}

const cn_family cn__fam_treelstm =
    CN__TREE_FAMILY("treelstm", 2, spec_treelstm, build, state_floats, cell,
                    "leaf", "internal", "output");

const cn_family cn__fam_treelstm_2type =
    CN__TREE_FAMILY("treelstm-2type", 2, spec_2type, build, state_floats, cell,
                    "leaf", "internal_a", "internal_b", "output");
