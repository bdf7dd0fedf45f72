/* treegru.c - binary Tree-GRU, docs/models.md "treegru".
 *
 * State of every node vertex: h, H floats. Per batch of n vertices:
 *   leaf:     h = tanh(X·leaf.Wᵀ + leaf.b) written straight into the rows.
 *   internal: X[n,2H] = [h1; h2]; G[n,3H] = X·Ugᵀ + bg;
 *             X := [σ(r1)⊙h1; σ(r2)⊙h2]; N[n,H] = X·Unᵀ + bn;
 *             h = σ(z)⊙(h1 + h2)/2 + (1 - σ(z))⊙tanh(N).
 *   output:   logits = h·out.Wᵀ + out.b.
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

static int64_t scratch_floats(const cn_model *m, int type, int64_t n,
                              int64_t n_inputs) {
  int64_t H = m->dims.H, D = m->dims.D;
  if (type == T_LEAF) return n * D;
  if (type == T_OUTPUT) return n * H;
  return n * (2 * H + 3 * H + H);
}

static void exec(cn_run *r, int type, const int32_t *verts, int n) {
  cn_backend_ctx *bk = r->bk;
  int H = (int)r->m->dims.H, D = (int)r->m->dims.D;
  float *out = r->arena + r->state_off[verts[0]];
  float *X = cn__run_scratch(r);
  if (type == T_OUTPUT) {
    cn__exec_output(r, verts, n, H, r->wb[OUT_W], r->wb[OUT_B]);
  } else if (type == T_LEAF) {
    cn_gemm_part x = {r->wb[EMBED], cn__aux_off(r, verts, n, D), 0, D,
                      r->wb[LEAF_W], D};
    cn__run_gemm_rows(r, n, H, 1, &x, r->wb[LEAF_B], 0.0f, out, H, X, NULL);
    CN_BK(bk, tanh_rows, n, H, out, H);
  } else {
    float *G = X + (int64_t)n * 2 * H;
    float *N = G + (int64_t)n * 3 * H;
    int64_t *o1 = cn__inputs_off(r, verts, n, 0);
    int64_t *o2 = cn__inputs_off(r, verts, n, 1);
    CN_BK(bk, gather, X, 2 * H, r->arena, o1, n, H);
    CN_BK(bk, gather, X + H, 2 * H, r->arena, o2, n, H);
    r->gather_bytes += (size_t)n * 2 * (size_t)H * sizeof(float);
    CN_BK(bk, gemm, n, 3 * H, 2 * H, X, 2 * H, r->wb[INT_UG], 2 * H,
          r->wb[INT_BG], 0.0f, G, 3 * H);
    CN_BK(bk, treegru_gates, n, H, G, X);
    CN_BK(bk, gemm, n, H, 2 * H, X, 2 * H, r->wb[INT_UN], 2 * H,
          r->wb[INT_BN], 0.0f, N, H);
    CN_BK(bk, treegru_out, n, H, G, N, r->arena, o1, o2, out, H);
  }
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

const cn_family cn__fam_treegru = {
    .name = "treegru",
    .input = CN_INPUT_TREE,
    .n_types = 3,
    .type_names = {"leaf", "internal", "output"},
    .has_classes = true,
    .max_arity = 2,
    .tensors = spec,
    .build = cn__tree_build3,
    .count = cn__tree_count,
    .state_floats = state_floats,
    .scratch_floats = scratch_floats,
    .exec = exec,
    .output = cn__tree_output_h,
    .reads = cn__tree_reads_h,
    .answer_bound = cn__tree_answer_bound,
    .cell = cell,
};
