/* nmt.c - LSTM encoder-decoder with greedy decoding, docs/models.md "lstm-nmt".
 *
 * Vertices: enc_t per source token (reads enc_(t-1)); dec_1 reads the
 * encoder's last state and <s>; proj_t reads dec_t and picks y_t; dec_(t+1)
 * reads dec_t and proj_t (the argmax feeds the next step). Only dec_1 and
 * proj_1 exist when the run starts: decoded() of a proj batch appends the next
 * step of every instance that neither emitted </s> nor hit its cap
 * (run_dynamic.c). States: enc/dec [h | c] 2H; proj none (its logits live
 * in scratch; the argmax becomes the vertex's aux). One instance's lower
 * bound is n + 2T (docs/models.md).
 */
#include <stdlib.h>

#include "cell/cell.h"
#include "families/families.h"

enum { SRC_E, TGT_E, E_WIH, E_WHH, E_BIH, E_BHH, D_WIH, D_WHH, D_BIH, D_BHH,
       PROJ_W, PROJ_B };
enum { T_ENC, T_DEC, T_PROJ };
enum { BOS = 1, EOS = 2 };

static int spec(const cn_dims *d, cn_tensor_spec *t) {
  int64_t H = d->H, D = d->D;
  t[SRC_E] = (cn_tensor_spec){"src_embed", 2, {d->V, D}, CN_INIT_EMBED};
  t[TGT_E] = (cn_tensor_spec){"tgt_embed", 2, {d->Vt, D}, CN_INIT_EMBED};
  static const char *names[8] = {"enc.W_ih", "enc.W_hh", "enc.b_ih",
                                 "enc.b_hh", "dec.W_ih", "dec.W_hh",
                                 "dec.b_ih", "dec.b_hh"};
  for (int k = 0; k < 2; k++) {
    int b = E_WIH + 4 * k;
    t[b] = (cn_tensor_spec){names[4 * k], 2, {4 * H, D}, CN_INIT_LINEAR};
    t[b + 1] = (cn_tensor_spec){names[4 * k + 1], 2, {4 * H, H},
                                CN_INIT_LINEAR};
    t[b + 2] = (cn_tensor_spec){names[4 * k + 2], 1, {4 * H}, CN_INIT_BIAS};
    t[b + 3] = (cn_tensor_spec){names[4 * k + 3], 1, {4 * H}, CN_INIT_BIAS};
  }
  t[PROJ_W] = (cn_tensor_spec){"proj.W", 2, {d->Vt, H}, CN_INIT_LINEAR};
  t[PROJ_B] = (cn_tensor_spec){"proj.b", 1, {d->Vt}, CN_INIT_BIAS};
  return 12;
}

/* min(request cap, model cap); docs/api.md: each defaults to 50. */
static int cap_of(const cn_model *m, int request) {
  int model = m->max_decode_len > 0 ? m->max_decode_len : 50;
  return request > 0 && request < model ? request : model;
}

static int64_t count(const cn_instance *in, unsigned flags, int max_decode) {
  return (int64_t)in->n + 2 * (int64_t)cap_of(in->m, max_decode);
}

/* node_vertex[base + t]: enc_t; [base + n + s]: dec_(s+1);
 * [base + n + cap + s]: proj_(s+1). */
static int build(cn_run *r, int slot) {
  cn_run_slot *s = &r->slots[slot];
  const cn_instance *in = s->inst;
  int32_t n = in->n;
  int cap = cap_of(r->m, s->max_decode_len);
  s->max_decode_len = cap;
  int32_t base = cn__run_reserve_nodes(r, n + 2 * cap);
  if (base < 0) return CN_E_NOMEM;
  for (int32_t t = 0; t < n; t++) {
    int32_t prev = t > 0 ? r->node_vertex[base + t - 1] : -1;
    int32_t v = cn__run_add_vertex(r, T_ENC, slot, t, in->ids[t], &prev,
                                   t > 0);
    if (v < 0) return CN_E_NOMEM;
    r->node_vertex[base + t] = v;
  }
  int32_t last = r->node_vertex[base + n - 1];
  int32_t d = cn__run_add_vertex(r, T_DEC, slot, 0, BOS, &last, 1);
  if (d < 0) return CN_E_NOMEM;
  int32_t p = cn__run_add_vertex(r, T_PROJ, slot, 0, 0, &d, 1);
  if (p < 0) return CN_E_NOMEM;
  r->node_vertex[base + n] = d;
  r->node_vertex[base + n + cap] = p;
  r->reserve[T_DEC] += cap - 1;
  r->reserve[T_PROJ] += cap - 1;
  s = &r->slots[slot];
  s->node_v0 = base;
  s->n_out = 0; /* decoder steps taken, set as proj batches run */
  return 0;
}

static int64_t state_floats(const cn_model *m, int type) {
  return type == T_PROJ ? 0 : 2 * m->dims.H;
}

/* After a proj batch: y = the argmax of its logits (the cell's results,
 * in scratch: a proj vertex keeps no row); then each instance's next
 * step, unless it emitted </s>, reached its cap, or its logits were not
 * finite (y = -1: an argmax over NaN is a made-up token). */
static void decoded(cn_run *r, int type, const int32_t *verts, int n,
                    const float *L, int ld) {
  if (type != T_PROJ) return;
  int Vt = (int)r->m->dims.Vt;
  /* The argmax ids go to host index staging (room for n int64 is room for
   * n int32): no allocation per batch. */
  int32_t *y = (int32_t *)cn__run_idx(r, n);
  CN_BK(r->bk, argmax_rows, n, Vt, L, ld, y);
  for (int i = 0; i < n; i++) {
    int32_t p = verts[i], slot = r->vslot[p], t = r->vnode[p];
    cn_run_slot *s = &r->slots[slot];
    r->vaux[p] = y[i];
    s->n_out = t + 1;
    /* -1: non-finite logits; the output says so and decoding stops */
    if (y[i] < 0 || y[i] == EOS || t + 1 >= s->max_decode_len) continue;
    int32_t base = s->node_v0, nsrc = s->inst->n, cap = s->max_decode_len;
    int32_t in2[2] = {r->node_vertex[base + nsrc + t], p};
    int32_t d = cn__run_add_vertex(r, T_DEC, slot, t + 1, y[i], in2, 2);
    int32_t q = d < 0 ? -1 : cn__run_add_vertex(r, T_PROJ, slot, t + 1, 0,
                                                 &d, 1);
    if (q < 0) { /* the graph arrays could not grow */
      r->exec_rc = CN_E_NOMEM;
      return;
    }
    r->node_vertex[base + nsrc + t + 1] = d;
    r->node_vertex[base + nsrc + cap + t + 1] = q;
  }
}

static json_t *output(const cn_run *r, int slot) {
  const cn_run_slot *s = &r->slots[slot];
  int32_t base = s->node_v0, nsrc = s->inst->n, cap = s->max_decode_len;
  json_t *o = json_object(), *toks = json_array(), *ids = json_array();
  for (int32_t t = 0; t < s->n_out; t++) {
    int32_t y = r->vaux[r->node_vertex[base + nsrc + cap + t]];
    if (y == EOS) break;
    if (y < 0) { /* the step's logits held NaN or an infinity: null, which
                  * cn_output_check turns into 500 non_finite */
      json_array_append_new(ids, json_null());
      break;
    }
    const char *tok = cn_vocab_token(r->m->tgt_vocab, y);
    json_array_append_new(toks, json_string(tok ? tok : "<unk>"));
    json_array_append_new(ids, json_integer(y));
  }
  json_object_set_new(o, "output_tokens", toks);
  json_object_set_new(o, "output_ids", ids);
  if ((s->flags & CN_OUT_HIDDEN) && s->n_out > 0) {
    int32_t d = r->node_vertex[base + nsrc + s->n_out - 1];
    json_object_set_new(o, "h", cn__json_floats(cn__run_state_host(r, d),
                                                r->m->dims.H));
  }
  return o;
}

/* The tokens are host data (argmax); only "h" reads a state. */
static void reads(cn_run *r, int slot) {
  const cn_run_slot *s = &r->slots[slot];
  if ((s->flags & CN_OUT_HIDDEN) && s->n_out > 0)
    cn__run_need(r, r->node_vertex[s->node_v0 + s->inst->n + s->n_out - 1],
                 0, (int)r->m->dims.H); /* as output()'s d */
}

/* output() prints at most cap steps: a token (or "<unk>") and an id (or
 * null) each. */
static int64_t answer_bound(const cn_model *m, const cn_instance *in,
                            unsigned flags, int max_decode_len) {
  (void)in;
  int64_t cap = cap_of(m, max_decode_len);
  int64_t id = cn__bound_int(m->dims.Vt);
  if (id < 4) id = 4; /* null */
  int64_t b = (int64_t)sizeof("{\"output_tokens\":[],\"output_ids\":[]}") -
              1 + cap * (m->json_token_max + 1) + cap * (id + 1);
  if (flags & CN_OUT_HIDDEN) b += (int64_t)sizeof(",\"h\":") - 1 +
                                  cn__bound_floats(m->dims.H);
  return b;
}

/* The cells as op IR (core/cell/cell.h): the encoder and decoder steps
 * nn.LSTMCell, the projection the logits h·proj.Wᵀ + proj.b (Vt wide,
 * into the batch's scratch: a proj vertex keeps no row). What runs next is
 * decoded()'s: the argmax (a general backend operation) and the graph's
 * growth. */
static int cell(const cn_model *m, int type, cn_ir *g) {
  if (type == T_ENC)
    return cn__ir_lstm_cell(m, g, SRC_E, E_WIH, E_WHH, E_BIH, E_BHH);
  if (type == T_DEC)
    return cn__ir_lstm_cell(m, g, TGT_E, D_WIH, D_WHH, D_BIH, D_BHH);
  int H = (int)m->dims.H, Vt = (int)m->dims.Vt;
  int h = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, H, "h");
  cn_ir_output(g, cn_ir_linear(g, &h, 1, PROJ_W, 0, Vt, PROJ_B, 0), 0);
  g->state_floats = Vt;
  return 0;
}

const cn_family cn__fam_nmt = {
    .name = "lstm-nmt",
    .input = CN_INPUT_SEQUENCE,
    .n_types = 3,
    .type_names = {"enc", "dec", "proj"},
    .has_classes = false,
    .dynamic = true,
    .tensors = spec,
    .build = build,
    .count = count,
    .state_floats = state_floats,
    .decoded = decoded,
    .output = output,
    .reads = reads,
    .answer_bound = answer_bound,
    .cell = cell,
};
