/* run_batch.c - one batch of a run: the model's compiled cell for the
 * type (cell_exec.c; every type has one, model load checks), then the
 * family's decoded() where it has one; the scratch and index room it
 * needs, the weights bound for it; and re-running a batch to measure it
 * (cn_run_bench_type). Called by the planned run (run.c), the growing one
 * (run_dynamic.c) and decode sessions (run_decode.c).
 */
#include <stdlib.h>
#include <string.h>

#include "run/run_api.h"

/* A type with no arena row (state_floats 0) whose cell has results: they
 * go to the batch's scratch, after the cell's own, for decoded(). */
static bool results_in_scratch(const cn_run *r, int type, const cn_cell *c) {
  return c->state_floats > 0 && r->fam->state_floats(r->m, type) == 0;
}

void cn__run_exec_batch(cn_run *r, int type, const int32_t *verts, int n) {
  const cn_cell *c = cn__model_cell(r->m, r->layout, type);
  float *out = NULL;
  if (results_in_scratch(r, type, c)) {
    int64_t edges = 0; /* the edge cell's scratch comes first: its size */
    for (int i = 0; c->edge != NULL && i < n; i++) {
      int k;
      cn__run_inputs(r, verts[i], &k);
      edges += k;
    }
    out = cn__run_scratch(r) + cn__cell_scratch_floats(c, n, edges);
  }
  cn__cell_exec(r, c, verts, n, out);
  if (r->fam->decoded != NULL)
    r->fam->decoded(r, type, verts, n,
                    out != NULL ? out : r->arena + r->state_off[verts[0]],
                    c->state_floats);
}

void cn__run_batch_needs(const cn_run *r, int type, int64_t n, int64_t edges,
                         int64_t *scratch, int64_t *idx) {
  const cn_cell *c = cn__model_cell(r->m, r->layout, type);
  *scratch = cn__cell_scratch_floats(c, n, edges);
  if (results_in_scratch(r, type, c)) *scratch += n * c->state_floats;
  *idx = 4 * n + 2 * edges + 1;
  int64_t i = cn__cell_idx(c, n, edges);
  if (i > *idx) *idx = i;
}

void cn__run_bind_weights(cn_run *r) {
  if (r->bk->vt->run_begins != NULL) r->bk->vt->run_begins(r->bk, r->m->uid);
  for (int i = 0; i < r->m->n_tensors; i++)
    r->wb[i] = r->bk->vt->weights(r->bk, r->m->w[i]->data,
                                  (size_t)r->m->w[i]->numel);
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
  out->compiled = c != NULL;
  out->n = n;
  if (c != NULL) {
    out->compile_ms = c->compile_ms;
    out->products = c->n_gemm + (c->edge != NULL ? c->edge->n_gemm : 0);
    out->fused_kernels = c->n_ew + (c->edge != NULL ? c->edge->n_ew : 0);
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
