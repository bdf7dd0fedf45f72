/* latticelstm.c - character lattice LSTM (Zhang & Yang 2018), docs/models.md
 * "latticelstm".
 *
 * Vertices per instance: char_j for every character, word_(b,e) and
 * link_(b,e) for every span, output_j per character. word_(b,e) reads
 * char_b; link_(b,e) reads word_(b,e) (and x_(e-1)); char_j reads char_(j-1)
 * and the words and links of every span ending at j + 1. States: char
 * [h | c] 2H; word cw H; link l H; output C. The word, link and output
 * types are cells (the op IR below, run compiled). The char type is still
 * exec() (issue #34: a variable number of words merged per character):
 * G = [x_j; h_(j-1)]·char.Wᵀ + char.b, the product reading its parts
 * where they lie (cn__run_gemm_rows), then the lattice_char kernel.
 * ED-Batch §6 (Fig. 7): how word cells are batched against char cells is
 * where the policies differ most on this family.
 */
#include <stdlib.h>

#include "cell/cell.h"
#include "families/families.h"

enum { EMBED, WEMBED, CHAR_W, CHAR_B, WORD_W, WORD_B, LINK_W, LINK_B, OUT_W,
       OUT_B };
enum { T_CHAR, T_WORD, T_LINK, T_OUTPUT };

static int spec(const cn_dims *d, cn_tensor_spec *t) {
  int64_t H = d->H, D = d->D, C = d->C, V = d->V;
  int64_t Dw = d->Dw > 0 ? d->Dw : D;
  t[EMBED] = (cn_tensor_spec){"embed", 2, {V, D}, CN_INIT_EMBED};
  t[WEMBED] = (cn_tensor_spec){"word_embed", 2, {d->Vw, Dw}, CN_INIT_EMBED};
  t[CHAR_W] = (cn_tensor_spec){"char.W", 2, {4 * H, D + H}, CN_INIT_LINEAR};
  t[CHAR_B] = (cn_tensor_spec){"char.b", 1, {4 * H}, CN_INIT_BIAS};
  t[WORD_W] = (cn_tensor_spec){"word.W", 2, {3 * H, Dw + H}, CN_INIT_LINEAR};
  t[WORD_B] = (cn_tensor_spec){"word.b", 1, {3 * H}, CN_INIT_BIAS};
  t[LINK_W] = (cn_tensor_spec){"link.W", 2, {H, D + H}, CN_INIT_LINEAR};
  t[LINK_B] = (cn_tensor_spec){"link.b", 1, {H}, CN_INIT_BIAS};
  t[OUT_W] = (cn_tensor_spec){"out.W", 2, {C, H}, CN_INIT_LINEAR};
  t[OUT_B] = (cn_tensor_spec){"out.b", 1, {C}, CN_INIT_BIAS};
  return 10;
}

static int64_t Dw_of(const cn_model *m) {
  return m->dims.Dw > 0 ? m->dims.Dw : m->dims.D;
}

static int64_t count(const cn_instance *in, unsigned flags, int max_decode) {
  return 2 * (int64_t)in->n + 2 * (int64_t)in->n_spans;
}

/* Adds, for each character j in order, the word and link vertices of the
 * spans ending at j + 1 (their char_b is already there: b <= j - 1), then
 * char_j itself reading them; then the outputs. */
static int build(cn_run *r, int slot) {
  const cn_instance *in = r->slots[slot].inst;
  int32_t n = in->n, m = in->n_spans;
  int rc = CN_E_NOMEM;
  int32_t base = cn__run_reserve_nodes(r, n);
  /* spans grouped by end: by_end[first[e] .. first[e + 1]) */
  int32_t *first = calloc((size_t)n + 2, sizeof(int32_t));
  int32_t *by_end = malloc(((size_t)m + 1) * sizeof(int32_t));
  int32_t *inputs = malloc(((size_t)2 * m + 2) * sizeof(int32_t));
  if (base < 0 || !first || !by_end || !inputs) goto out;
  for (int32_t k = 0; k < m; k++) first[in->span_end[k] + 1]++;
  for (int32_t e = 0; e <= n; e++) first[e + 1] += first[e];
  for (int32_t k = 0; k < m; k++) by_end[first[in->span_end[k]]++] = k;
  for (int32_t e = n; e > 0; e--) first[e] = first[e - 1];
  first[0] = 0;
  for (int32_t j = 0; j < n; j++) {
    int32_t k0 = first[j + 1], k1 = first[j + 2], nw = k1 - k0, ni = 0;
    if (j > 0) inputs[ni++] = r->node_vertex[base + j - 1];
    for (int32_t q = k0; q < k1; q++) {
      int32_t k = by_end[q];
      int32_t cb = r->node_vertex[base + in->span_start[k]];
      int32_t w = cn__run_add_vertex(r, T_WORD, slot, k, in->span_word[k],
                                     &cb, 1);
      if (w < 0) goto out;
      int32_t l = cn__run_add_vertex(r, T_LINK, slot, k, in->ids[j], &w, 1);
      if (l < 0) goto out;
      inputs[ni + (q - k0)] = w;
      inputs[ni + nw + (q - k0)] = l;
    }
    int32_t v = cn__run_add_vertex(r, T_CHAR, slot, j, in->ids[j], inputs,
                                   ni + 2 * nw);
    if (v < 0) goto out;
    r->node_vertex[base + j] = v;
  }
  cn_run_slot *s = &r->slots[slot];
  s->node_v0 = base;
  s->out_v0 = r->nv;
  s->n_out = n;
  for (int32_t j = 0; j < n; j++) {
    int32_t c = r->node_vertex[base + j];
    if (cn__run_add_vertex(r, T_OUTPUT, slot, j, 0, &c, 1) < 0) goto out;
  }
  rc = 0;
out:
  free(first);
  free(by_end);
  free(inputs);
  return rc;
}

static int64_t state_floats(const cn_model *m, int type) {
  int64_t H = m->dims.H;
  return type == T_CHAR ? 2 * H : type == T_OUTPUT ? m->dims.C : H;
}

static int64_t scratch_floats(const cn_model *m, int type, int64_t n,
                              int64_t n_inputs) {
  int64_t H = m->dims.H, D = m->dims.D;
  return n * (D + H + 4 * H); /* exec() runs the char vertices only */
}

/* G[n, N] = [x; h]·Wᵀ + b: x the table row vaux·width, h input 0's first
 * H floats (zero without one), both read where they lie (X: the staging a
 * backend without gemm_rows gathers them into, n·(width + H) floats).
 * Returns the input offsets. */
static int64_t *xh_product(cn_run *r, const int32_t *verts, int n,
                           const float *table, int width, const float *W,
                           const float *b, int N, float *G, float *X) {
  int H = (int)r->m->dims.H;
  int64_t *p = cn__inputs_off(r, verts, n, 0);
  cn_gemm_part x[2] = {
      {table, cn__aux_off(r, verts, n, width), 0, width, W, width + H},
      {r->arena, p, 0, H, W + width, width + H}};
  size_t bytes = 0;
  cn__run_gemm_rows(r, n, N, 2, x, b, 0.0f, G, N, X, &bytes);
  /* the table rows are the vertex's input, not bytes between vertices */
  if (bytes > 0) r->gather_bytes += (size_t)n * (size_t)H * sizeof(float);
  return p;
}

static void exec(cn_run *r, int type, const int32_t *verts, int n) {
  cn_backend_ctx *bk = r->bk;
  const float *const *w = r->wb;
  int H = (int)r->m->dims.H, D = (int)r->m->dims.D;
  float *out = r->arena + r->state_off[verts[0]];
  float *X = cn__run_scratch(r);
  /* T_CHAR: the word, link and output types are cells (below) */
  float *G = X + (int64_t)n * (D + H);
  int64_t *cprev = xh_product(r, verts, n, w[EMBED], D, w[CHAR_W],
                              w[CHAR_B], 4 * H, G, X);
  int64_t *seg = cn__run_idx(r, n + 1);
  int64_t E = 0;
  seg[0] = 0;
  for (int i = 0; i < n; i++) {
    int k;
    cn__run_inputs(r, verts[i], &k);
    E += k > 0 ? (k - 1) / 2 : 0;
    seg[i + 1] = E;
  }
  int64_t *cw = cn__run_idx(r, E), *lk = cn__run_idx(r, E);
  for (int i = 0; i < n; i++) {
    int k;
    const int32_t *in = cn__run_inputs(r, verts[i], &k);
    int nw = k > 0 ? (k - 1) / 2 : 0;
    for (int q = 0; q < nw; q++) {
      cw[seg[i] + q] = r->state_off[in[1 + q]];
      lk[seg[i] + q] = r->state_off[in[1 + nw + q]];
    }
  }
  CN_BK(bk, lattice_char, n, H, G, r->arena, cprev, seg, cw, lk, out,
        2 * H);
}

static void hidden(const cn_run *r, int slot, int j, float *buf) {
  const cn_run_slot *s = &r->slots[slot];
  const float *h = cn__run_state_host(r, r->node_vertex[s->node_v0 + j]);
  for (int k = 0; k < (int)r->m->dims.H; k++) buf[k] = h[k];
}

static json_t *output(const cn_run *r, int slot) {
  return cn__tagger_output(r, slot, (int)r->m->dims.H, hidden);
}

static void reads(cn_run *r, int slot) {
  const cn_run_slot *s = &r->slots[slot];
  cn__tagger_reads(r, slot);
  if (s->flags & CN_OUT_HIDDEN) /* as hidden() */
    for (int32_t j = 0; j < s->n_out; j++)
      cn__run_need(r, r->node_vertex[s->node_v0 + j], 0, (int)r->m->dims.H);
}

static int64_t answer_bound(const cn_model *m, const cn_instance *in,
                            unsigned flags, int max_decode_len) {
  (void)max_decode_len;
  return cn__bound_tagger(m, in->n, flags, m->dims.H); /* one per char */
}

/* The word and link cells as op IR (core/cell/cell.h), docs/models.md
 * "latticelstm": cw = σ(f)⊙c_b + σ(i)⊙tanh(u) with (i, f, u) =
 * word.W [xw; h_b] + word.b; l = σ(link.W [x; cw] + link.b). The char cell
 * (a variable number of words, exp-normalised) stays hand-written. */
static int cell(const cn_model *m, int type, cn_ir *g) {
  int H = (int)m->dims.H, D = (int)m->dims.D, Dw = (int)Dw_of(m);
  if (type == T_OUTPUT) return cn__ir_output_layer(m, g, 1, OUT_W, OUT_B);
  if (type == T_CHAR) return 1;
  g->state_floats = H;
  if (type == T_LINK) {
    int x[2] = {cn_ir_src_(g, CN_SRC_EMBED, EMBED, 0, 0, D, "x"),
                cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, H, "cw")};
    int l = cn_ir_unary(g, CN_IR_SIGMOID,
                        cn_ir_linear(g, x, 2, LINK_W, 0, H, LINK_B, 0));
    cn_ir_output(g, l, 0);
    return 0;
  }
  int x[2] = {cn_ir_src_(g, CN_SRC_EMBED, WEMBED, 0, 0, Dw, "xw"),
              cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, H, "h_b")};
  int cb = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, H, H, "c_b");
  int gi = cn_ir_linear(g, x, 2, WORD_W, 0, H, WORD_B, 0);
  int gf = cn_ir_linear(g, x, 2, WORD_W, H, H, WORD_B, H);
  int gu = cn_ir_linear(g, x, 2, WORD_W, 2 * H, H, WORD_B, 2 * H);
  int cw = cn_ir_binary(
      g, CN_IR_ADD,
      cn_ir_binary(g, CN_IR_MUL, cn_ir_unary(g, CN_IR_SIGMOID, gf), cb),
      cn_ir_binary(g, CN_IR_MUL, cn_ir_unary(g, CN_IR_SIGMOID, gi),
                   cn_ir_unary(g, CN_IR_TANH, gu)));
  cn_ir_output(g, cw, 0);
  return 0;
}

const cn_family cn__fam_latticelstm = {
    .name = "latticelstm",
    .input = CN_INPUT_LATTICE,
    .n_types = 4,
    .type_names = {"char", "word", "link", "output"},
    .has_classes = true,
    .tensors = spec,
    .build = build,
    .count = count,
    .state_floats = state_floats,
    .scratch_floats = scratch_floats,
    .exec = exec,
    .output = output,
    .reads = reads,
    .answer_bound = answer_bound,
    .cell = cell,
};
