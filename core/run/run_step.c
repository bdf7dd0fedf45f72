/* run_step.c - one batch step, the body every run's loop shares: the
 * planned run (run.c), the growing graph (run_dynamic.c) and decode
 * sessions (run_decode.c) each choose the next batch and place its state
 * rows their own way, then hand it here: its scratch and index needs, the
 * room for them grown where the run was not planned, the batch executed
 * (run_batch.c), and counted. Calls run_batch.c and cell_exec.c only.
 */
#include <stdlib.h>

#include "run/run_api.h"

int cn__run_ensure_scratch(cn_run *r, int64_t floats) {
  if (floats <= r->scratch_floats) return 0;
  int64_t want = floats + floats / 2;
  float *p = r->bk->vt->alloc(r->bk, (size_t)want * sizeof(float));
  if (p == NULL) return CN_E_NOMEM;
  if (r->scratch != NULL) r->bk->vt->free(r->bk, r->scratch);
  r->scratch = p;
  r->scratch_floats = want;
  r->own_scratch = true;
  return 0;
}

int cn__run_ensure_idx(cn_run *r, int64_t n) {
  if (cn__cell_plans(r) != 0) return CN_E_NOMEM;
  if (n <= r->idx_cap) return 0;
  if (n <= r->cap_idx_host) { /* kept from an earlier run (cn_run_reset) */
    r->idx_cap = r->cap_idx_host;
    return 0;
  }
  int64_t *p = realloc(r->idx_host, (size_t)n * 2 * sizeof(int64_t));
  if (p == NULL) return CN_E_NOMEM;
  r->idx_host = p;
  r->idx_cap = r->cap_idx_host = n * 2;
  return 0;
}

/* Why one function: the three loops once spelled out needs, room,
 * launch and count each, and drifted apart (one checked decoded()'s
 * error, one did not). A planned run's room was sized by its plan, for
 * every slice of every batch (run.c's slice_needs), and its batches are
 * the plan's (a slice is not a batch): edges < 0 says so, and nothing is
 * grown or counted. A growing graph's batch gets its room here, grown
 * when it needs more, and counts in r->n_batches. */
int cn__run_step(cn_run *r, int type, const int32_t *verts, int32_t n,
                 int64_t edges) {
  if (edges >= 0) {
    int64_t scratch, idx;
    cn__run_batch_needs(r, type, n, edges, &scratch, &idx);
    if (cn__run_ensure_scratch(r, scratch) != 0 ||
        cn__run_ensure_idx(r, idx) != 0)
      return CN_E_NOMEM;
  }
  r->idx_used = 0;
  cn__run_exec_batch(r, type, verts, n);
  if (r->exec_rc != 0) return r->exec_rc;
  if (edges >= 0) r->n_batches++;
  return 0;
}
