/* bilstm.c - BiLSTM sequence tagger (Huang et al. 2015), docs/models.md
 * "bilstm-tagger", with the optional CRF layer of its §2.4 (crf.c).
 *
 * Per token t: fwd_t reads fwd_(t-1), bwd_t reads bwd_(t+1), output_t reads
 * both. State of fwd/bwd vertices: [h | c], 2H floats: nn.LSTMCell; the
 * output's logits[n,C] = [hf; hb]·out.Wᵀ + out.b. Every type is described
 * in the op IR below and runs compiled (core/cell/cell.h).
 * Batches of fwd vertices advance many sentences one step together, each
 * at its own position. With model.json "crf": true the tags are the
 * Viterbi path over the logits, decoded for the whole run at once in
 * finish() on the host (the output states are host-readable then).
 */
#include <stdio.h>

#include "cell/cell.h"
#include "families/families.h"

enum { EMBED, F_WIH, F_WHH, F_BIH, F_BHH, B_WIH, B_WHH, B_BIH, B_BHH, OUT_W,
       OUT_B, CRF_START, CRF_END, CRF_TRANS };
enum { T_FWD, T_BWD, T_OUTPUT };

static int spec(const cn_dims *d, cn_tensor_spec *t) {
  int64_t H = d->H, D = d->D, C = d->C, V = d->V;
  t[EMBED] = (cn_tensor_spec){"embed", 2, {V, D}, CN_INIT_EMBED};
  const char *dir[2] = {"fwd", "bwd"};
  static char names[2][4][16];
  for (int k = 0; k < 2; k++) {
    snprintf(names[k][0], 16, "%s.W_ih", dir[k]);
    snprintf(names[k][1], 16, "%s.W_hh", dir[k]);
    snprintf(names[k][2], 16, "%s.b_ih", dir[k]);
    snprintf(names[k][3], 16, "%s.b_hh", dir[k]);
    int b = 1 + 4 * k;
    t[b] = (cn_tensor_spec){names[k][0], 2, {4 * H, D}, CN_INIT_LINEAR};
    t[b + 1] = (cn_tensor_spec){names[k][1], 2, {4 * H, H}, CN_INIT_LINEAR};
    t[b + 2] = (cn_tensor_spec){names[k][2], 1, {4 * H}, CN_INIT_BIAS};
    t[b + 3] = (cn_tensor_spec){names[k][3], 1, {4 * H}, CN_INIT_BIAS};
  }
  t[OUT_W] = (cn_tensor_spec){"out.W", 2, {C, 2 * H}, CN_INIT_LINEAR};
  t[OUT_B] = (cn_tensor_spec){"out.b", 1, {C}, CN_INIT_BIAS};
  if (!d->crf) return 11;
  t[CRF_START] = (cn_tensor_spec){"crf.start", 1, {C}, CN_INIT_SCORES};
  t[CRF_END] = (cn_tensor_spec){"crf.end", 1, {C}, CN_INIT_SCORES};
  t[CRF_TRANS] = (cn_tensor_spec){"crf.trans", 2, {C, C}, CN_INIT_SCORES};
  return 14;
}

static int64_t count(const cn_instance *in, unsigned flags, int max_decode) {
  return 3 * (int64_t)in->n;
}

/* node_vertex[base + t] = fwd_t, node_vertex[base + n + t] = bwd_t. */
static int build(cn_run *r, int slot) {
  const cn_instance *in = r->slots[slot].inst;
  int32_t n = in->n;
  int32_t base = cn__run_reserve_nodes(r, 2 * n);
  if (base < 0) return CN_E_NOMEM;
  for (int32_t t = 0; t < n; t++) {
    int32_t prev = t > 0 ? r->node_vertex[base + t - 1] : -1;
    int32_t v = cn__run_add_vertex(r, T_FWD, slot, t, in->ids[t], &prev,
                                   t > 0);
    if (v < 0) return CN_E_NOMEM;
    r->node_vertex[base + t] = v;
  }
  for (int32_t t = n - 1; t >= 0; t--) {
    int32_t next = t + 1 < n ? r->node_vertex[base + n + t + 1] : -1;
    int32_t v = cn__run_add_vertex(r, T_BWD, slot, t, in->ids[t], &next,
                                   t + 1 < n);
    if (v < 0) return CN_E_NOMEM;
    r->node_vertex[base + n + t] = v;
  }
  cn_run_slot *s = &r->slots[slot];
  s->node_v0 = base;
  s->out_v0 = r->nv;
  s->n_out = n;
  for (int32_t t = 0; t < n; t++) {
    int32_t io[2] = {r->node_vertex[base + t], r->node_vertex[base + n + t]};
    if (cn__run_add_vertex(r, T_OUTPUT, slot, t, 0, io, 2) < 0)
      return CN_E_NOMEM;
  }
  return 0;
}

static int64_t state_floats(const cn_model *m, int type) {
  return type == T_OUTPUT ? m->dims.C : 2 * m->dims.H;
}

static void hidden(const cn_run *r, int slot, int t, float *buf) {
  const cn_run_slot *s = &r->slots[slot];
  int H = (int)r->m->dims.H;
  int32_t n = s->n_out;
  const float *hf = cn__run_state_host(r, r->node_vertex[s->node_v0 + t]);
  const float *hb = cn__run_state_host(r, r->node_vertex[s->node_v0 + n + t]);
  for (int j = 0; j < H; j++) buf[j] = hf[j], buf[H + j] = hb[j];
}

static int finish(cn_run *r, cn_err *err) {
  if (!r->m->dims.crf) return 0;
  return cn__crf_decode_run(r, CRF_START, CRF_END, CRF_TRANS, err);
}

static json_t *output(const cn_run *r, int slot) {
  return cn__tagger_output(r, slot, 2 * (int)r->m->dims.H, hidden);
}

static int write(const cn_run *r, int slot, cn_buf *b, char *field,
                 size_t cap) {
  return cn__tagger_write(r, slot, 2 * (int)r->m->dims.H, hidden, b, field, cap);
}

static void reads(cn_run *r, int slot) {
  const cn_run_slot *s = &r->slots[slot];
  int H = (int)r->m->dims.H;
  cn__tagger_reads(r, slot);
  if (!(s->flags & CN_OUT_HIDDEN)) return;
  for (int32_t t = 0; t < s->n_out; t++) { /* as hidden() */
    cn__run_need(r, r->node_vertex[s->node_v0 + t], 0, H);
    cn__run_need(r, r->node_vertex[s->node_v0 + s->n_out + t], 0, H);
  }
}

static int64_t answer_bound(const cn_model *m, const cn_instance *in,
                            unsigned flags, int max_decode_len) {
  (void)max_decode_len;
  return cn__bound_tagger(m, in->n, flags, 2 * m->dims.H);
}

/* The cells as op IR (core/cell/cell.h): nn.LSTMCell each way, and
 * logits = out.W [hf; hb] + out.b. */
static int cell(const cn_model *m, int type, cn_ir *g) {
  if (type == T_OUTPUT) return cn__ir_output_layer(m, g, 2, OUT_W, OUT_B);
  if (type == T_FWD)
    return cn__ir_lstm_cell(m, g, EMBED, F_WIH, F_WHH, F_BIH, F_BHH);
  return cn__ir_lstm_cell(m, g, EMBED, B_WIH, B_WHH, B_BIH, B_BHH);
}

const cn_family cn__fam_bilstm = {
    .name = "bilstm-tagger",
    .input = CN_INPUT_SEQUENCE,
    .n_types = 3,
    .type_names = {"fwd", "bwd", "output"},
    .has_classes = true,
    .crf = true,
    .tensors = spec,
    .build = build,
    .count = count,
    .state_floats = state_floats,
    .finish = finish,
    .output = output,
    .write = write,
    .reads = reads,
    .answer_bound = answer_bound,
    .cell = cell,
};
