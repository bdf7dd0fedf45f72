/* cells_family.c - the family of models described by cells (model.json
 * "family": "cells", docs/cells.md). This record is a template: the loader
 * (core/model/cells_json.c) copies it into each model with the types the
 * model names, and these callbacks read the model's cn_cells. The vertex
 * graph of each structure is the built-ins' own: a tree as treelstm's
 * (answers.c), a sequence as a tagger's chain, a bisequence as
 * bilstm-tagger's two chains, a DAG as latticegru's; one output vertex per
 * tree node asked for, per token, or for the DAG's sink. Every type runs
 * its compiled cell (there are no hand-written kernels to fall back on). */
#include <stdlib.h>
#include <string.h>

#include "cell/cell.h"
#include "families/families.h"

static const cn_cells *cells_of(const cn_model *m) { return m->cells; }

static int out_type(const cn_model *m) { return cells_of(m)->n_types; }

/* A chain over the tokens, forwards or backwards; node_vertex[base + t] is
 * token t's vertex. */
static int chain(cn_run *r, int slot, int type, int32_t base, bool back) {
  const cn_instance *in = r->slots[slot].inst;
  int32_t n = in->n;
  for (int32_t s = 0; s < n; s++) {
    int32_t t = back ? n - 1 - s : s;
    int32_t prev = s > 0 ? r->node_vertex[base + (back ? t + 1 : t - 1)] : -1;
    int32_t v = cn__run_add_vertex(r, type, slot, t, in->ids[t], &prev, s > 0);
    if (v < 0) return CN_E_NOMEM;
    r->node_vertex[base + t] = v;
  }
  return 0;
}

static int build_sequence(cn_run *r, int slot, bool both) {
  const cn_cells *cl = cells_of(r->m);
  const cn_instance *in = r->slots[slot].inst;
  int32_t n = in->n;
  int32_t base = cn__run_reserve_nodes(r, both ? 2 * n : n);
  if (base < 0) return CN_E_NOMEM;
  int fwd = 0, bwd = 1; /* types in JSON order: find them by their "when" */
  for (int t = 0; t < cl->n_types; t++) {
    if (cl->type[t].when == CN_WHEN_FORWARD || cl->type[t].when == CN_WHEN_STEP)
      fwd = t;
    if (cl->type[t].when == CN_WHEN_BACKWARD) bwd = t;
  }
  int rc = chain(r, slot, fwd, base, false);
  if (rc == 0 && both) rc = chain(r, slot, bwd, base + n, true);
  if (rc != 0) return rc;
  cn_run_slot *s = &r->slots[slot];
  s->node_v0 = base;
  s->out_v0 = r->nv;
  s->n_out = n;
  for (int32_t t = 0; t < n; t++) {
    int32_t io[2] = {r->node_vertex[base + t],
                     both ? r->node_vertex[base + n + t] : -1};
    if (cn__run_add_vertex(r, out_type(r->m), slot, t, 0, io, both ? 2 : 1) <
        0)
      return CN_E_NOMEM;
  }
  return 0;
}

static int build(cn_run *r, int slot) {
  const cn_cells *cl = cells_of(r->m);
  switch (cl->structure) {
  case CN_CELLS_TREE: {
    cn_tree_types tt = {cl->leaf, cl->internal, -1, out_type(r->m), true};
    return cn__tree_build(r, slot, &tt);
  }
  case CN_CELLS_SEQUENCE: return build_sequence(r, slot, false);
  case CN_CELLS_BISEQUENCE: return build_sequence(r, slot, true);
  default: return cn__dag_build(r, slot, 0, out_type(r->m));
  }
}

static int64_t count(const cn_instance *in, unsigned flags, int max_decode) {
  switch (cells_of(in->m)->structure) {
  case CN_CELLS_TREE: return cn__tree_count(in, flags, max_decode);
  case CN_CELLS_SEQUENCE: return 2 * (int64_t)in->n;
  case CN_CELLS_BISEQUENCE: return 3 * (int64_t)in->n;
  default: return (int64_t)in->n + 1;
  }
}

static int64_t state_floats(const cn_model *m, int type) {
  return type == out_type(m) ? m->dims.C : cells_of(m)->state;
}

/* The "hidden" columns of a vertex's state. */
static json_t *hidden_of(const cn_run *r, int32_t v) {
  const cn_cells *cl = cells_of(r->m);
  return cn__json_floats(cn__run_state_host_at(r, v, cl->h0), cl->hw);
}

static void seq_hidden(const cn_run *r, int slot, int i, float *buf) {
  const cn_cells *cl = cells_of(r->m);
  const cn_run_slot *s = &r->slots[slot];
  int32_t n = s->inst->n;
  memcpy(buf, cn__run_state_host_at(r, r->node_vertex[s->node_v0 + i], cl->h0),
         (size_t)cl->hw * sizeof(float));
  if (cl->structure == CN_CELLS_BISEQUENCE)
    memcpy(buf + cl->hw,
           cn__run_state_host_at(r, r->node_vertex[s->node_v0 + n + i],
                                 cl->h0),
           (size_t)cl->hw * sizeof(float));
}

static json_t *output(const cn_run *r, int slot) {
  const cn_cells *cl = cells_of(r->m);
  const cn_run_slot *s = &r->slots[slot];
  if (cl->structure == CN_CELLS_SEQUENCE ||
      cl->structure == CN_CELLS_BISEQUENCE)
    return cn__tagger_output(
        r, slot, cl->hw * (cl->structure == CN_CELLS_BISEQUENCE ? 2 : 1),
        seq_hidden);
  json_t *o = cn__logits_object(r, json_object(),
                                cn__run_state_host(r, s->out_v0));
  if (cl->structure == CN_CELLS_TREE && (s->flags & CN_OUT_ALL))
    cn__logits_nodes(r, slot, o);
  if (s->flags & CN_OUT_HIDDEN) {
    int32_t node = cl->structure == CN_CELLS_TREE ? 0 : s->inst->n - 1;
    json_object_set_new(o, "h",
                        hidden_of(r, r->node_vertex[s->node_v0 + node]));
  }
  return o;
}

static void reads(cn_run *r, int slot) { /* mirrors output() */
  const cn_cells *cl = cells_of(r->m);
  const cn_run_slot *s = &r->slots[slot];
  int32_t n = s->inst->n;
  int C = (int)r->m->dims.C;
  if (cl->structure == CN_CELLS_SEQUENCE ||
      cl->structure == CN_CELLS_BISEQUENCE) {
    cn__tagger_reads(r, slot);
    if (!(s->flags & CN_OUT_HIDDEN)) return;
    for (int32_t i = 0; i < s->n_out; i++) { /* as seq_hidden() */
      cn__run_need(r, r->node_vertex[s->node_v0 + i], cl->h0, cl->hw);
      if (cl->structure == CN_CELLS_BISEQUENCE)
        cn__run_need(r, r->node_vertex[s->node_v0 + n + i], cl->h0, cl->hw);
    }
    return;
  }
  cn__run_need(r, s->out_v0, 0, C);
  if (cl->structure == CN_CELLS_TREE && (s->flags & CN_OUT_ALL))
    for (int32_t i = 0; i < s->n_out; i++) cn__run_need(r, s->out_v0 + i, 0, C);
  if (s->flags & CN_OUT_HIDDEN) {
    int32_t node = cl->structure == CN_CELLS_TREE ? 0 : n - 1;
    cn__run_need(r, r->node_vertex[s->node_v0 + node], cl->h0, cl->hw);
  }
}

static int64_t answer_bound(const cn_model *m, const cn_instance *in,
                            unsigned flags, int max_decode_len) {
  (void)max_decode_len;
  const cn_cells *cl = cells_of(m);
  if (cl->structure == CN_CELLS_SEQUENCE ||
      cl->structure == CN_CELLS_BISEQUENCE)
    return cn__bound_tagger(
        m, in->n, flags,
        (int64_t)cl->hw * (cl->structure == CN_CELLS_BISEQUENCE ? 2 : 1));
  if (cl->structure == CN_CELLS_TREE)
    return cn__bound_tree(m, in->n, flags, cl->hw);
  return cn__bound_tree(m, in->n, flags & CN_OUT_HIDDEN, cl->hw);
}

static int cell(const cn_model *m, int type, cn_ir *g) {
  const cn_cells *cl = cells_of(m);
  *g = type == out_type(m) ? *cl->out_ir : *cl->type[type].ir;
  return 0;
}

const cn_family cn__fam_cells = {
    .name = "cells",
    .input = CN_INPUT_TREE, /* the loader sets input, types and arity */
    .n_types = 0,
    .has_classes = true,
    .max_arity = 2,
    .tensors = NULL,
    .build = build,
    .count = count,
    .state_floats = state_floats,
    .output = output,
    .reads = reads,
    .answer_bound = answer_bound,
    .cell = cell,
};
