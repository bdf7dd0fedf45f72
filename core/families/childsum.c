/* childsum.c - Child-Sum Tree-LSTM (Tai et al. 2015), any arity, docs/models.md
 * "childsum-treelstm".
 *
 * State of every node vertex: [h | c], 2H floats. cell.W, cell.U, cell.b
 * rows split (i, f, o, u). Per batch of n vertices with E child edges:
 *   leaf (x = embed[w], no children): G[n,4H] = X·cell.Wᵀ + cell.b;
 *             c = σ(i)⊙tanh(u); h = σ(o)⊙tanh(c).
 *   internal (x = 0): hs[n,H] = Σk h_k (segmented gather-sum);
 *             G[n,4H] = hs·cell.Uᵀ + cell.b; Hk[E,H] = every child's h;
 *             F[E,H] = Hk·U_fᵀ; c = σ(i)⊙tanh(u) + Σk σ(F_k + b_f)⊙c_k.
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

/* exec() runs the internal vertices only: the leaf and output ones are
 * cells (below). */
static int64_t scratch_floats(const cn_model *m, int type, int64_t n,
                              int64_t n_inputs) {
  int64_t H = m->dims.H;
  return n * (H + 4 * H) + n_inputs * 2 * H;
}

static void exec(cn_run *r, int type, const int32_t *verts, int n) {
  cn_backend_ctx *bk = r->bk;
  int H = (int)r->m->dims.H;
  float *out = r->arena + r->state_off[verts[0]];
  float *X = cn__run_scratch(r);
  const float *bf = r->wb[CELL_B] + H;
  /* Child edges of the batch, in vertex order: segment i is vertex i's. */
  int64_t *seg = cn__run_idx(r, n + 1);
  int64_t E = 0;
  seg[0] = 0;
  for (int i = 0; i < n; i++) {
    int k;
    cn__run_inputs(r, verts[i], &k);
    E += k;
    seg[i + 1] = E;
  }
  int64_t *coff = cn__run_idx(r, E);
  for (int i = 0; i < n; i++) {
    int k;
    const int32_t *in = cn__run_inputs(r, verts[i], &k);
    for (int j = 0; j < k; j++) coff[seg[i] + j] = r->state_off[in[j]];
  }
  float *hs = X;
  float *G = hs + (int64_t)n * H;
  float *Hk = G + (int64_t)n * 4 * H;
  float *F = Hk + E * H;
  CN_BK(bk, gather_sum, hs, H, r->arena, coff, seg, n, H, 0);
  CN_BK(bk, gemm, n, 4 * H, H, hs, H, r->wb[CELL_U], H, r->wb[CELL_B], 0.0f,
        G, 4 * H);
  int ld;
  const float *hk = cn__run_rows(r, Hk, H, r->arena, coff, (int)E, H, &ld);
  /* U_f is rows H..2H of cell.U. */
  CN_BK(bk, gemm, (int)E, H, H, hk, ld, r->wb[CELL_U] + (int64_t)H * H, H,
        NULL, 0.0f, F, H);
  CN_BK(bk, childsum, n, H, G, F, seg, bf, r->arena, coff, out, 2 * H);
  r->gather_bytes += (size_t)E * (size_t)H * sizeof(float);
}


/* The leaf and output cells as op IR (core/cell/cell.h). A leaf has no
 * children (hs = 0): i = σ(Wi x + bi), o, u likewise; c = i⊙u;
 * h = o⊙tanh(c). The internal cell (one forget gate per child, any
 * arity) stays hand-written. */
static int cell(const cn_model *m, int type, cn_ir *g) {
  int H = (int)m->dims.H, D = (int)m->dims.D;
  if (type == T_OUTPUT) return cn__ir_output_layer(m, g, 1, OUT_W, OUT_B);
  if (type != T_LEAF) return 1;
  int x = cn_ir_src_(g, CN_SRC_EMBED, EMBED, 0, 0, D, "x");
  int i = cn_ir_unary(g, CN_IR_SIGMOID,
                      cn_ir_linear(g, &x, 1, CELL_W, 0, H, CELL_B, 0));
  int o = cn_ir_unary(g, CN_IR_SIGMOID,
                      cn_ir_linear(g, &x, 1, CELL_W, 2 * H, H, CELL_B, 2 * H));
  int u = cn_ir_unary(g, CN_IR_TANH,
                      cn_ir_linear(g, &x, 1, CELL_W, 3 * H, H, CELL_B, 3 * H));
  int c = cn_ir_binary(g, CN_IR_MUL, i, u);
  cn_ir_output(g, cn_ir_binary(g, CN_IR_MUL, o, cn_ir_unary(g, CN_IR_TANH, c)),
               0);
  cn_ir_output(g, c, H);
  g->state_floats = 2 * H;
  return 0;
}

const cn_family cn__fam_childsum = {
    .name = "childsum-treelstm",
    .input = CN_INPUT_TREE,
    .n_types = 3,
    .type_names = {"leaf", "internal", "output"},
    .has_classes = true,
    .max_arity = 0,
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
