/* cell_exec.c - runs a compiled vertex function (cell.h) on one batch.
 *
 * Per batch of n vertices the cell's variables are views (base, ld):
 *   pq:    ROW variables are columns of one cell row per vertex
 *          (scratch + col, ld = row_floats), so a product's operands that
 *          the layout made adjacent are one matrix;
 *   naive: each ROW variable is its own [n, width] buffer, so a product
 *          over several of them stages a copy first, and one writing
 *          several scatters after (the copies counted in cell_bytes);
 *   STATE: the batch's own state rows (consecutive, ld = state floats);
 *   INPLACE: a child's state or an embedding row read where it lives.
 * Sources the products need are gathered into their ROW variables (the
 * bytes between vertices: gather_bytes).
 */
#include <stdlib.h>
#include <string.h>

#include "run/run.h"

typedef struct view {
  float *base;
  int64_t ld;
} view;

static view var_view(const cn_cell *c, const cn_cell_var *x, float *scratch,
                     float *state, int n) {
  switch (x->space) {
  case CN_SP_ROW:
    if (c->layout == CN_LAYOUT_NAIVE)
      return (view){scratch + (int64_t)n * x->buf, x->width};
    return (view){scratch + x->col, c->row_floats};
  case CN_SP_STATE:
    return (view){state + x->col, c->state_floats};
  default:
    return (view){NULL, 0};
  }
}

/* Whether the views of vars v[0..k) are one [n, Σ width] matrix. */
static bool one_matrix(const view *vw, const cn_cell *c, const int32_t *v,
                       int k, int64_t total) {
  for (int i = 0; i < k; i++) {
    if (vw[v[i]].base == NULL || vw[v[i]].ld < total) return false;
    if (i > 0 && (vw[v[i]].ld != vw[v[0]].ld ||
                  vw[v[i]].base != vw[v[i - 1]].base + c->vars[v[i - 1]].width))
      return false;
  }
  return true;
}

/* Per-vertex offsets of a source (state or embedding floats), staged in
 * the run's index room; pooled sources also fill *seg. */
static int64_t *source_offsets(cn_run *r, const cn_cell_src *s,
                               const int32_t *verts, int n, int64_t **seg,
                               int64_t *edges) {
  if (s->kind == CN_SRC_EMBED) {
    const cn_tensor *T = r->m->w[s->t];
    int64_t *off = cn__aux_off(r, verts, n, T->ndim == 2 ? T->shape[1] : 1);
    for (int i = 0; s->col != 0 && i < n; i++) off[i] += s->col;
    return off;
  }
  if (s->kind == CN_SRC_INPUT) {
    int64_t *off = cn__inputs_off(r, verts, n, s->edge);
    if (s->col != 0)
      for (int i = 0; i < n; i++)
        if (off[i] >= 0) off[i] += s->col;
    return off;
  }
  int64_t *sg = cn__run_idx(r, n + 1), e = 0;
  sg[0] = 0;
  for (int i = 0; i < n; i++) {
    int k;
    cn__run_inputs(r, verts[i], &k);
    sg[i + 1] = e += k;
  }
  int64_t *off = cn__run_idx(r, e);
  for (int i = 0; i < n; i++) {
    int k;
    const int32_t *in = cn__run_inputs(r, verts[i], &k);
    for (int q = 0; q < k; q++)
      off[sg[i] + q] = r->state_off[in[q]] + s->col;
  }
  *seg = sg;
  *edges = e;
  return off;
}

static void run_gemm(cn_run *r, const cn_cell *c, const cn_cell_gemm *gm,
                     const view *vw, float *stage, int n) {
  cn_backend_ctx *bk = r->bk;
  const float *A;
  float *C;
  int64_t lda, ldc;
  float *in_stage = stage, *out_stage = stage + (int64_t)n * gm->K;
  if (gm->n_in == 1 || one_matrix(vw, c, gm->in, gm->n_in, gm->K)) {
    A = vw[gm->in[0]].base;
    lda = vw[gm->in[0]].ld;
  } else { /* gather the operand: a copy inside the vertex function */
    int64_t col = 0;
    for (int k = 0; k < gm->n_in; k++) {
      int w = c->vars[gm->in[k]].width;
      CN_BK(bk, copy_rows, in_stage + col, gm->K, vw[gm->in[k]].base,
            (int)vw[gm->in[k]].ld, n, w);
      col += w;
    }
    r->cell_bytes += (size_t)n * (size_t)gm->K * sizeof(float);
    A = in_stage;
    lda = gm->K;
  }
  bool direct = gm->n_out == 1 || one_matrix(vw, c, gm->out, gm->n_out, gm->N);
  if (direct) {
    C = vw[gm->out[0]].base;
    ldc = vw[gm->out[0]].ld;
  } else {
    C = out_stage;
    ldc = gm->N;
  }
  const float *W = bk->vt->weights(bk, gm->W, (size_t)gm->N * gm->K);
  const float *b =
      gm->bias != NULL ? bk->vt->weights(bk, gm->bias, (size_t)gm->N) : NULL;
  CN_BK(bk, gemm, n, gm->N, gm->K, A, (int)lda, W, gm->K, b, 0.0f, C,
        (int)ldc);
  if (direct) return;
  int64_t col = 0; /* scatter the results */
  for (int q = 0; q < gm->n_out; q++) {
    int w = c->vars[gm->out[q]].width;
    CN_BK(bk, copy_rows, vw[gm->out[q]].base, (int)vw[gm->out[q]].ld,
          out_stage + col, gm->N, n, w);
    col += w;
  }
  r->cell_bytes += (size_t)n * (size_t)gm->N * sizeof(float);
}

void cn__cell_exec(cn_run *r, const cn_cell *c, const int32_t *verts, int n) {
  cn_backend_ctx *bk = r->bk;
  float *scratch = cn__run_scratch(r);
  float *stage = scratch + (int64_t)n * c->row_floats;
  float *state = r->arena + r->state_off[verts[0]];
  view vw[3 * CN_IR_MAX];
  cn_ew_slot slots[3 * CN_IR_MAX + 1];
  for (int v = 0; v < c->n_vars; v++) {
    const cn_cell_var *x = &c->vars[v];
    vw[v] = var_view(c, x, scratch, state, n);
    slots[v] = (cn_ew_slot){vw[v].base, vw[v].ld, NULL};
    if (x->space == CN_SP_PARAM)
      slots[v] = (cn_ew_slot){(float *)r->wb[x->t] + x->col, 0, NULL};
  }
  /* Sources: gathered into their ROW variable, or bound in place. */
  for (int s = 0; s < c->n_srcs; s++) {
    const cn_cell_src *src = &c->srcs[s];
    int64_t *seg = NULL, edges = 0;
    int64_t *off = source_offsets(r, src, verts, n, &seg, &edges);
    const float *base = src->kind == CN_SRC_EMBED ? r->wb[src->t] : r->arena;
    if (src->var < 0) {
      for (int v = 0; v < c->n_vars; v++)
        if (c->vars[v].space == CN_SP_INPLACE && c->vars[v].src == s)
          slots[v] = (cn_ew_slot){(float *)base, 0, off};
      continue;
    }
    view d = vw[src->var];
    int stride;
    if (src->alias && c->layout == CN_LAYOUT_PQ &&
        cn__rows_even(off, n, src->width, &stride)) {
      /* The rows are already a matrix (a previous batch's consecutive
       * outputs): read them where they are, no gather (cn__run_rows). */
      vw[src->var] = (view){(float *)base + off[0], stride};
      slots[src->var] = (cn_ew_slot){vw[src->var].base, vw[src->var].ld, NULL};
      continue;
    }
    /* Embedding rows are the vertex's input, not bytes between vertices. */
    size_t *bytes = src->kind == CN_SRC_EMBED ? &r->input_bytes
                                              : &r->gather_bytes;
    if (seg != NULL) {
      CN_BK(bk, gather_sum, d.base, (int)d.ld, base, off, seg, n, src->width,
            src->kind == CN_SRC_INPUT_MEAN);
      *bytes += (size_t)edges * (size_t)src->width * sizeof(float);
    } else {
      CN_BK(bk, gather, d.base, (int)d.ld, base, off, n, src->width);
      *bytes += (size_t)n * (size_t)src->width * sizeof(float);
    }
  }
  slots[c->n_vars] = (cn_ew_slot){NULL, c->tmp_floats, NULL};
  for (int s = 0; s < c->n_steps; s++) {
    const cn_cell_step *st = &c->steps[s];
    if (st->kind == CN_STEP_GEMM) {
      run_gemm(r, c, &c->gemm[st->i], vw, stage, n);
    } else if (st->kind == CN_STEP_EW) {
      const cn_cell_ew *e = &c->ew[st->i];
      cn_ew_prog p = {e->n_insn, e->insn, c->n_vars + 1, c->n_vars,
                      (int)c->tmp_floats};
      CN_BK(bk, ew_program, &p, slots, n);
    } else if (st->kind == CN_STEP_STORE) {
      /* naive: results land in their own buffers, then in the state rows
       * (a result scatter, counted with the bytes between vertices) */
      for (int v = 0; v < c->n_vars; v++) {
        const cn_cell_var *x = &c->vars[v];
        int col = x->out_col;
        if (x->space != CN_SP_ROW || col < 0) continue;
        CN_BK(bk, copy_rows, state + col, c->state_floats, vw[v].base,
              (int)vw[v].ld, n, x->width);
        r->gather_bytes += (size_t)n * (size_t)x->width * sizeof(float);
      }
    }
  }
}

/* ---- describing and measuring cells (canopy model info / bench) -------- */
static json_t *cell_json(const cn_cell *c) {
  json_t *o = json_object();
  int insn = 0, ops = 0;
  for (int e = 0; e < c->n_ew; e++) insn += c->ew[e].n_insn, ops += c->ew[e].n_ops;
  json_object_set_new(o, "products", json_integer(c->n_gemm));
  json_object_set_new(o, "fused_kernels", json_integer(c->n_ew));
  json_object_set_new(o, "elementwise_ops", json_integer(ops));
  json_object_set_new(o, "instructions", json_integer(insn));
  json_object_set_new(o, "kernels", json_integer(c->kernels));
  json_object_set_new(o, "copy_kernels", json_integer(c->mem_kernels));
  json_object_set_new(o, "floats_copied_per_vertex",
                      json_integer(c->cell_floats_copied));
  json_object_set_new(o, "row_floats", json_integer(c->row_floats));
  json_object_set_new(o, "tmp_floats", json_integer(c->tmp_floats));
  json_object_set_new(o, "pq_batches_dropped",
                      json_integer(c->batches_dropped));
  json_object_set_new(o, "compile_ms", json_real(c->compile_ms));
  return o;
}

json_t *cn_model_describe_cells(const cn_model *m) {
  json_t *o = json_object();
  for (int t = 0; t < m->fam->n_types; t++) {
    json_t *ty = json_object();
    for (int l = 0; l < 2; l++)
      if (m->cell[l][t] != NULL)
        json_object_set_new(ty, cn_layout_name(CN_LAYOUT_NAIVE + l),
                            cell_json(m->cell[l][t]));
    if (json_object_size(ty) == 0)
      json_object_set_new(ty, "hand_written_only", json_true());
    json_object_set_new(o, m->fam->type_names[t], ty);
  }
  return o;
}

/* Re-runs the first n vertices of the run's largest batch of `type` (their
 * inputs are ready: the run has executed), iters times after one warm-up,
 * with the layout's cell; the outputs are rewritten with the same values.
 * Scratch and index room of its own, so the run's plan is untouched. */
int cn_run_bench_type(cn_run *r, int type, cn_layout layout, int n, int iters,
                      cn_cell_bench *out, cn_err *err) {
  memset(out, 0, sizeof(*out));
  if (!r->executed || r->batches == NULL || r->fam->dynamic)
    return cn_err_set(err, CN_E_INTERNAL,
                      "bench needs an executed run of a static family");
  if (r->reused) /* its inputs' rows may hold other vertices by now */
    return cn_err_set(err, CN_E_INTERNAL, "bench needs a run whose arena "
                      "keeps every row (cn_run_set_arena_reuse(r, 0))");
  /* The batch with the most inputs present (a chain's first step has no
   * previous state, and a hand-written kernel may skip its product), then
   * the largest. */
  const cn_run_batch *best = NULL;
  int best_in = -1;
  for (int32_t b = 0; b < r->n_batches; b++) {
    const cn_run_batch *bt = &r->batches[b];
    if (bt->type != type) continue;
    int min_in = 1 << 30;
    for (int32_t i = 0; i < bt->n && i < n; i++) {
      int k;
      cn__run_inputs(r, r->order[bt->start + i], &k);
      if (k < min_in) min_in = k;
    }
    int have = bt->n < n ? bt->n : n, best_have = 0;
    if (best != NULL) best_have = best->n < n ? best->n : n;
    if (best == NULL || min_in > best_in ||
        (min_in == best_in && have > best_have))
      best = bt, best_in = min_in;
  }
  if (best == NULL) return 0; /* no vertex of the type */
  if (n > best->n) n = best->n;
  const int32_t *verts = r->order + best->start;
  int64_t edges = 0;
  for (int i = 0; i < n; i++) {
    int k;
    cn__run_inputs(r, verts[i], &k);
    edges += k;
  }
  cn_layout saved = r->layout;
  float *saved_scratch = r->scratch;
  int64_t *saved_idx = r->idx_host, saved_cap = r->idx_cap;
  r->layout = layout;
  int64_t sf, ix;
  cn__run_batch_needs(r, type, n, edges, &sf, &ix);
  float *scratch = r->bk->vt->alloc(r->bk, (size_t)sf * sizeof(float));
  int64_t *idx = malloc((size_t)ix * sizeof(int64_t));
  int rc = 0;
  if (scratch == NULL || idx == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "no memory for the bench");
    goto out;
  }
  r->scratch = scratch;
  r->idx_host = idx;
  r->idx_cap = ix;
  const cn_cell *c = cn__model_cell(r->m, layout, type);
  out->compiled = layout == CN_LAYOUT_FUSED || c != NULL;
  out->n = n;
  if (c != NULL) {
    out->compile_ms = c->compile_ms;
    out->products = c->n_gemm;
    out->fused_kernels = c->n_ew;
    out->copy_kernels = c->mem_kernels;
  }
  size_t cb = r->cell_bytes, gb = r->gather_bytes;
  long long k0 = r->bk->kernels;
  r->idx_used = 0;
  cn__run_exec_batch(r, type, verts, n); /* warm-up */
  r->bk->vt->sync(r->bk);
  out->kernels = r->bk->kernels - k0;
  out->cell_bytes = r->cell_bytes - cb;
  out->gather_bytes = r->gather_bytes - gb;
  double t0 = cn__now_us();
  for (int it = 0; it < iters; it++) {
    r->idx_used = 0;
    cn__run_exec_batch(r, type, verts, n);
  }
  r->bk->vt->sync(r->bk);
  out->us = iters > 0 ? (cn__now_us() - t0) / iters : 0;
out:
  r->layout = saved;
  r->scratch = saved_scratch;
  r->idx_host = saved_idx;
  r->idx_cap = saved_cap;
  if (scratch != NULL) r->bk->vt->free(r->bk, scratch);
  free(idx);
  return rc;
}
