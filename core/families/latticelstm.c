/* latticelstm.c - character lattice LSTM (Zhang & Yang 2018), docs/models.md
 * "latticelstm".
 *
 * Vertices per instance: char_j for every character, word_(b,e) and
 * link_(b,e) for every span, output_j per character. word_(b,e) reads
 * char_b; link_(b,e) reads word_(b,e) (and x_(e-1)); char_j reads char_(j-1)
 * and the links of every span ending at j + 1. States: char [h | c] 2H;
 * word cw H; link [l | cw] 2H (the word's cw carried along, so a char
 * reads each word's gate and cell through one edge); output C. Every type
 * is a cell (the op IR below); the char's words are segment ops over its
 * edges from links.
 * ED-Batch §6 (Fig. 7): how word cells are batched against char cells is
 * where the policies differ most on this family.
 */
#include <stdlib.h>
#include <string.h>

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
  /* spans grouped by end: by_end[first[e] .. first[e + 1]), in the
   * run's build room (nothing allocated per instance) */
  int32_t *first = cn__run_build_room(r, (int64_t)n + 2 + (m + 1) +
                                             (2 * (int64_t)m + 2));
  if (base < 0 || first == NULL) goto out;
  int32_t *by_end = first + n + 2, *inputs = by_end + m + 1;
  memset(first, 0, ((size_t)n + 2) * sizeof(int32_t));
  for (int32_t k = 0; k < m; k++) first[in->span_end[k] + 1]++;
  for (int32_t e = 0; e <= n; e++) first[e + 1] += first[e];
  for (int32_t k = 0; k < m; k++) by_end[first[in->span_end[k]]++] = k;
  for (int32_t e = n; e > 0; e--) first[e] = first[e - 1];
  first[0] = 0;
  for (int32_t j = 0; j < n; j++) {
    int32_t k0 = first[j + 1], k1 = first[j + 2], ni = 0;
    if (j > 0) inputs[ni++] = r->node_vertex[base + j - 1];
    for (int32_t q = k0; q < k1; q++) {
      int32_t k = by_end[q];
      int32_t cb = r->node_vertex[base + in->span_start[k]];
      int32_t w = cn__run_add_vertex(r, T_WORD, slot, k, in->span_word[k],
                                     &cb, 1);
      if (w < 0) goto out;
      int32_t l = cn__run_add_vertex(r, T_LINK, slot, k, in->ids[j], &w, 1);
      if (l < 0) goto out;
      inputs[ni + (q - k0)] = l;
    }
    int32_t v = cn__run_add_vertex(r, T_CHAR, slot, j, in->ids[j], inputs,
                                   ni + (k1 - k0));
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
  return rc;
}

static int64_t state_floats(const cn_model *m, int type) {
  int64_t H = m->dims.H;
  return type == T_CHAR || type == T_LINK ? 2 * H
         : type == T_OUTPUT               ? m->dims.C
                                          : H;
}

static void hidden(const cn_run *r, int slot, int j, float *buf) {
  const cn_run_slot *s = &r->slots[slot];
  const float *h = cn__run_state_host(r, r->node_vertex[s->node_v0 + j]);
  for (int k = 0; k < (int)r->m->dims.H; k++) buf[k] = h[k];
}

static json_t *output(const cn_run *r, int slot) {
  return cn__tagger_output(r, slot, (int)r->m->dims.H, hidden);
}

static int write(const cn_run *r, int slot, cn_buf *b, char *field,
                 size_t cap) {
  return cn__tagger_write(r, slot, (int)r->m->dims.H, hidden, b, field, cap);
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

/* The char cell (Zhang & Yang 2018; docs/models.md "latticelstm"):
 * (i, f, o, u) from char.W [x_j; h_(j-1)] + char.b (the previous char
 * read among the inputs from chars: none for j = 0); over the inputs from
 * links, one per word ending here, a_k = e^(l_k) (segment ops, fused into
 * the char's kernel): D = Σ a_k, N = Σ a_k ⊙ cw_k. With words,
 * c = (e^i ⊙ u + N) / (e^i + D), a softmax over the char's own gate and
 * its words' links; without, c = i ⊙ u + f ⊙ c_(j-1). D > 0 exactly when
 * words end here (every a_k > 0), so s = step(D) chooses: c = s ⊙ A +
 * (1 - s) ⊙ B is A or B exactly. h = o ⊙ tanh(c). */
static int char_cell(const cn_model *m, cn_ir *g) {
  int H = (int)m->dims.H, D = (int)m->dims.D;
  int hp = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, H, "h_prev");
  int cp = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, H, H, "c_prev");
  int lk = cn_ir_src_(g, CN_SRC_EDGE, -1, 0, 0, H, "l_k");
  int cw = cn_ir_src_(g, CN_SRC_EDGE, -1, 0, H, H, "cw_k");
  cn_ir_from(g, hp, T_CHAR);
  cn_ir_from(g, cp, T_CHAR);
  cn_ir_from(g, lk, T_LINK);
  cn_ir_from(g, cw, T_LINK);
  int x[2] = {cn_ir_src_(g, CN_SRC_EMBED, EMBED, 0, 0, D, "x"), hp};
  int gate[4];
  for (int k = 0; k < 4; k++)
    gate[k] = cn_ir_linear(g, x, 2, CHAR_W, k * H, H, CHAR_B, k * H);
  int i = cn_ir_unary(g, CN_IR_SIGMOID, gate[0]);
  int f = cn_ir_unary(g, CN_IR_SIGMOID, gate[1]);
  int o = cn_ir_unary(g, CN_IR_SIGMOID, gate[2]);
  int u = cn_ir_unary(g, CN_IR_TANH, gate[3]);
  int ak = cn_ir_unary(g, CN_IR_EXP, lk);
  int den = cn_ir_seg_sum(g, ak);
  int num = cn_ir_seg_sum(g, cn_ir_binary(g, CN_IR_MUL, ak, cw));
  int ai = cn_ir_unary(g, CN_IR_EXP, i);
  int iu = cn_ir_binary(g, CN_IR_MUL, i, u);
  int A = cn_ir_binary(
      g, CN_IR_DIV,
      cn_ir_binary(g, CN_IR_ADD, cn_ir_binary(g, CN_IR_MUL, ai, u), num),
      cn_ir_binary(g, CN_IR_ADD, ai, den));
  int B = cn_ir_binary(g, CN_IR_ADD, iu, cn_ir_binary(g, CN_IR_MUL, f, cp));
  int sw = cn_ir_unary(g, CN_IR_STEP, den);
  int c = cn_ir_binary(
      g, CN_IR_ADD, cn_ir_binary(g, CN_IR_MUL, sw, A),
      cn_ir_binary(g, CN_IR_MUL, cn_ir_const_op(g, CN_IR_RSUB, 1.0f, sw), B));
  return cn__ir_lstm_state(g, o, c, H);
}

/* The cells as op IR (core/cell/cell.h), docs/models.md "latticelstm":
 * cw = σ(f)⊙c_b + σ(i)⊙tanh(u) with (i, f, u) = word.W [xw; h_b] +
 * word.b; l = σ(link.W [x; cw] + link.b), the link's state [l | cw]. */
static int cell(const cn_model *m, int type, cn_ir *g) {
  int H = (int)m->dims.H, D = (int)m->dims.D, Dw = (int)Dw_of(m);
  if (type == T_OUTPUT) return cn__ir_output_layer(m, g, 1, OUT_W, OUT_B);
  if (type == T_CHAR) return char_cell(m, g);
  g->state_floats = H;
  if (type == T_LINK) {
    int cw = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, H, "cw");
    int x[2] = {cn_ir_src_(g, CN_SRC_EMBED, EMBED, 0, 0, D, "x"), cw};
    int l = cn_ir_unary(g, CN_IR_SIGMOID,
                        cn_ir_linear(g, x, 2, LINK_W, 0, H, LINK_B, 0));
    cn_ir_output(g, l, 0);
    /* cw copied by the fused kernel (×1, exact) from the operand the
     * product gathered, rather than a gather of its own */
    cn_ir_output(g, cn_ir_const_op(g, CN_IR_SCALE, 1.0f, cw), H);
    g->state_floats = 2 * H;
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
    .output = output,
    .write = write,
    .reads = reads,
    .answer_bound = answer_bound,
    .cell = cell,
};
