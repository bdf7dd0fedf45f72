/* mvrnn.c - Matrix-Vector RNN (Socher et al. 2012), docs/models.md "mvrnn".
 *
 * State of every node vertex: [a | A], H + H·H floats (vector, then the
 * H×H matrix row-major). Per batch of n vertices:
 *   leaf:     a = embed[w]; A = leaf.M[w] (w < K) else leaf.M[0]; both
 *             gathered straight into the rows.
 *   internal: X[n,2H] = [B a; A b] (batched mat-vecs); p = tanh(X·Wᵀ + b);
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

static int64_t scratch_floats(const cn_model *m, int type, int64_t n,
                              int64_t n_inputs) {
  return n * 2 * m->dims.H;
}

static void exec(cn_run *r, int type, const int32_t *verts, int n) {
  cn_backend_ctx *bk = r->bk;
  int H = (int)r->m->dims.H;
  int S = H + H * H;
  float *out = r->arena + r->state_off[verts[0]];
  if (type == T_LEAF) { /* the output type is a cell (below) */
    int64_t K = r->m->dims.K;
    int64_t *e = cn__aux_off(r, verts, n, H);
    int64_t *mo = cn__run_idx(r, n);
    for (int i = 0; i < n; i++) {
      int64_t w = r->vaux[verts[i]];
      mo[i] = (w < K ? w : 0) * (int64_t)H * H;
    }
    CN_BK(bk, gather, out, S, r->wb[EMBED], e, n, H);
    CN_BK(bk, gather, out + H, S, r->wb[LEAF_M], mo, n, H * H);
  } else {
    float *X = cn__run_scratch(r);
    int64_t *o1 = cn__inputs_off(r, verts, n, 0);
    int64_t *o2 = cn__inputs_off(r, verts, n, 1);
    CN_BK(bk, mvrnn_vec, n, H, r->arena, o1, o2, X);
    CN_BK(bk, gemm, n, H, 2 * H, X, 2 * H, r->wb[INT_W], 2 * H, r->wb[INT_B],
          0.0f, out, S);
    CN_BK(bk, tanh_rows, n, H, out, S);
    CN_BK(bk, mvrnn_mat, n, H, r->wb[INT_WM], r->arena, o1, o2, out + H, S);
  }
}


/* The output cell as op IR (core/cell/cell.h); the leaf (a matrix per word)
 * and internal (matrix products per vertex) cells stay hand-written. */
static int cell(const cn_model *m, int type, cn_ir *g) {
  if (type == T_OUTPUT) return cn__ir_output_layer(m, g, 1, OUT_W, OUT_B);
  return 1;
}

const cn_family cn__fam_mvrnn = {
    .name = "mvrnn",
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
