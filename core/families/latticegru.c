/* latticegru.c - word-lattice GRU encoder (Su et al. 2017, pooled
 * predecessors), docs/models.md "latticegru".
 *
 * Vertices: node_j per DAG node (inputs: its predecessors) and one output
 * for the sink. State of a node: h, H floats: nn.GRUCell over the word's
 * embedding and the mean of the predecessors' h (zero without any),
 * described in the op IR below and run compiled (core/cell/cell.h).
 */
#include <stdio.h>

#include "cell/cell.h"
#include "families/families.h"

enum { EMBED, WIH, WHH, BIH, BHH, OUT_W, OUT_B };
enum { T_NODE, T_OUTPUT };

static int spec(const cn_dims *d, cn_tensor_spec *t) {
  int64_t H = d->H, D = d->D, C = d->C, V = d->V;
  t[EMBED] = (cn_tensor_spec){"embed", 2, {V, D}, CN_INIT_EMBED};
  t[WIH] = (cn_tensor_spec){"gru.W_ih", 2, {3 * H, D}, CN_INIT_LINEAR};
  t[WHH] = (cn_tensor_spec){"gru.W_hh", 2, {3 * H, H}, CN_INIT_LINEAR};
  t[BIH] = (cn_tensor_spec){"gru.b_ih", 1, {3 * H}, CN_INIT_BIAS};
  t[BHH] = (cn_tensor_spec){"gru.b_hh", 1, {3 * H}, CN_INIT_BIAS};
  t[OUT_W] = (cn_tensor_spec){"out.W", 2, {C, H}, CN_INIT_LINEAR};
  t[OUT_B] = (cn_tensor_spec){"out.b", 1, {C}, CN_INIT_BIAS};
  return 7;
}

static int64_t count(const cn_instance *in, unsigned flags, int max_decode) {
  return (int64_t)in->n + 1;
}

/* A DAG's nodes in order, each with its predecessors as inputs, and one
 * output vertex at the sink (the last node); shared with cells models of
 * structure dag (cells_family.c). */
int cn__dag_build(cn_run *r, int slot, int node_type, int out_type) {
  const cn_instance *in = r->slots[slot].inst;
  int32_t n = in->n;
  int32_t base = cn__run_reserve_nodes(r, n);
  if (base < 0) return CN_E_NOMEM;
  int32_t buf[32];
  for (int32_t j = 0; j < n; j++) {
    int32_t k = in->prev_start[j + 1] - in->prev_start[j];
    int32_t *inputs = k <= 32 ? buf : malloc((size_t)k * sizeof(int32_t));
    if (inputs == NULL) return CN_E_NOMEM;
    for (int32_t q = 0; q < k; q++)
      inputs[q] = r->node_vertex[base + in->prev[in->prev_start[j] + q]];
    int32_t v =
        cn__run_add_vertex(r, node_type, slot, j, in->ids[j], inputs, k);
    if (inputs != buf) free(inputs);
    if (v < 0) return CN_E_NOMEM;
    r->node_vertex[base + j] = v;
  }
  cn_run_slot *s = &r->slots[slot];
  s->node_v0 = base;
  s->out_v0 = r->nv;
  s->n_out = 1;
  int32_t sink = r->node_vertex[base + n - 1];
  return cn__run_add_vertex(r, out_type, slot, n - 1, 0, &sink, 1) < 0
             ? CN_E_NOMEM
             : 0;
}

static int build(cn_run *r, int slot) {
  return cn__dag_build(r, slot, T_NODE, T_OUTPUT);
}

static int64_t state_floats(const cn_model *m, int type) {
  return type == T_OUTPUT ? m->dims.C : m->dims.H;
}

static json_t *output(const cn_run *r, int slot) {
  const cn_run_slot *s = &r->slots[slot];
  json_t *o = cn__logits_object(r, json_object(),
                                cn__run_state_host(r, s->out_v0));
  if (s->flags & CN_OUT_HIDDEN) {
    int32_t sink = r->node_vertex[s->node_v0 + s->inst->n - 1];
    json_object_set_new(o, "h", cn__json_floats(cn__run_state_host(r, sink),
                                                r->m->dims.H));
  }
  return o;
}

/* output()'s object written straight into b. */
static int write(const cn_run *r, int slot, cn_buf *b, char *field,
                 size_t cap) {
  const cn_run_slot *s = &r->slots[slot];
  int rc = 0;
  cn_buf_put(b, "{", 1);
  if (!cn__logits_write(r, b, cn__run_state_host(r, s->out_v0)))
    rc = CN_E_NON_FINITE, snprintf(field, cap, "logits");
  if (s->flags & CN_OUT_HIDDEN) {
    int32_t sink = r->node_vertex[s->node_v0 + s->inst->n - 1];
    cn_buf_put(b, ",\"h\":", 5);
    if (!cn_buf_floats(b, cn__run_state_host(r, sink), r->m->dims.H) &&
        rc == 0)
      rc = CN_E_NON_FINITE, snprintf(field, cap, "h");
  }
  cn_buf_put(b, "}", 1);
  return rc;
}

static void reads(cn_run *r, int slot) { /* mirrors output() */
  const cn_run_slot *s = &r->slots[slot];
  cn__run_need(r, s->out_v0, 0, (int)r->m->dims.C);
  if (s->flags & CN_OUT_HIDDEN)
    cn__run_need(r, r->node_vertex[s->node_v0 + s->inst->n - 1], 0,
                 (int)r->m->dims.H);
}

static int64_t answer_bound(const cn_model *m, const cn_instance *in,
                            unsigned flags, int max_decode_len) {
  (void)in, (void)max_decode_len;
  int64_t b = cn__bound_logits_object(m);
  if (flags & CN_OUT_HIDDEN) b += (int64_t)sizeof(",\"h\":") - 1 +
                                  cn__bound_floats(m->dims.H);
  return b;
}

/* The cells as op IR (core/cell/cell.h): hp = mean of the predecessors' h,
 * h = GRUCell(embed[x], hp); output as the tree families. */
static int cell(const cn_model *m, int type, cn_ir *g) {
  if (type == T_OUTPUT) return cn__ir_output_layer(m, g, 1, OUT_W, OUT_B);
  int H = (int)m->dims.H, D = (int)m->dims.D;
  int x = cn_ir_src_(g, CN_SRC_EMBED, EMBED, 0, 0, D, "x");
  int hp = cn_ir_src_(g, CN_SRC_INPUT_MEAN, -1, 0, 0, H, "hp");
  return cn__ir_gru_cell(m, g, x, hp, WIH, WHH, BIH, BHH);
}

const cn_family cn__fam_latticegru = {
    .name = "latticegru",
    .input = CN_INPUT_DAG,
    .n_types = 2,
    .type_names = {"node", "output"},
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
