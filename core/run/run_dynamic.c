/* run_dynamic.c - runs whose graph grows while they execute.
 *
 * lstm-nmt decodes greedily: whether instance i takes step t + 1 is known
 * only once step t's argmax is. Program-counter autobatching (Radul et
 * al. 2020, §3) batches such data-dependent loops across instances: every
 * instance advances at its own step, and whatever is ready runs together.
 * Here that is ED-Batch Alg. 1 driven live: the frontier holds the ready
 * vertices, the policy picks a type, its whole frontier runs as one batch,
 * and decoded() may append the vertices of later steps (their inputs already
 * computed), which join the frontier for the next pick. Instances that
 * stop (</s> or the cap) simply add nothing: no padding to the longest
 * output.
 *
 * Memory is still planned up front: every type's state buffer holds its
 * vertices plus the ones build() reserved (the decode cap), so rows never
 * move; only the scratch, whose largest batch is unknown in advance, is a
 * separate block grown when a batch needs more.
 */
#include <stdlib.h>
#include <string.h>

#include "run/run_api.h"

/* Rows for the batch, in launch order, then the batch step. */
static int launch(cn_run *r, int t, const int32_t *verts, int32_t n,
                  int64_t *next_row) {
  int64_t edges = 0;
  for (int32_t i = 0; i < n; i++) {
    int k;
    cn__run_inputs(r, verts[i], &k);
    edges += k;
    r->state_off[verts[i]] =
        r->type_base[t] + next_row[t]++ * r->state_floats[t];
  }
  return cn__run_step(r, t, verts, n, edges);
}

int cn__run_exec_dynamic(cn_run *r, cn_policy_kind policy, cn_err *err) {
  const cn_family *f = r->fam;
  int rc = CN_E_NOMEM;
  int32_t *verts = NULL;
  cn_frontier fr;
  bool have_frontier = false;
  int64_t total = r->nv, off = 0, next_row[CN_MAX_TYPES] = {0};
  for (int t = 0; t < f->n_types; t++) {
    total += r->reserve[t];
    r->state_floats[t] = f->state_floats(r->m, t);
    r->type_base[t] = off;
    off += (r->n_of_type[t] + r->reserve[t]) * r->state_floats[t];
    off = (off + 15) & ~(int64_t)15;
  }
  if (total > INT32_MAX) {
    rc = CN_E_TOO_LARGE;
    goto out;
  }
  r->scratch_off = off;
  r->arena_floats = off + 16;
  r->arena = r->bk->vt->alloc(r->bk, (size_t)r->arena_floats * sizeof(float));
  free(r->state_off); /* a reset run's, of another size */
  r->state_off = malloc((size_t)total * sizeof(int64_t));
  verts = malloc((size_t)total * sizeof(int32_t));
  if (r->arena == NULL || r->state_off == NULL || verts == NULL) goto out;
  r->cap_state_off = total;
  for (int64_t v = 0; v < total; v++) r->state_off[v] = -1;
  cn__run_bind_weights(r);
  long long k0 = r->bk->kernels;
  r->n_batches = 0;

  if (policy == CN_POLICY_NONE) {
    /* One vertex at a time in index order: appended vertices come after
     * their inputs, so the order stays topological. */
    for (int32_t v = 0; v < r->nv; v++)
      if ((rc = launch(r, r->vtype[v], &v, 1, next_row)) != 0) goto out;
  } else {
    bool sub = policy == CN_POLICY_SUFFICIENT || policy == CN_POLICY_FSM;
    cn_dag g = cn__run_dag(r);
    if (cn__frontier_init(&fr, f->n_types, sub) != 0) goto out;
    have_frontier = true;
    if (cn__frontier_add_dag(&fr, &g) != 0) goto out;
    if (cn__policy_needs_tails(policy, r->sched_fsm) &&
        cn__frontier_tails(&fr) != 0)
      goto out;
    r->live = &fr;
    int t;
    while ((t = cn__frontier_next(&fr, policy, r->sched_fsm)) >= 0) {
      int32_t n = cn__frontier_commit(&fr, t, verts);
      if (n <= 0) {
        rc = CN_E_INTERNAL;
        goto out;
      }
      if ((rc = launch(r, t, verts, n, next_row)) != 0) goto out;
    }
    r->live = NULL;
  }
  if (r->bk->vt->host_memory) r->bk->vt->sync(r->bk); /* else: the fetch */
  r->kernels = r->bk->kernels - k0;
  r->lower_bound = cn__sched_lower_bound(r);
  rc = cn__run_copy_back(r, NULL, 0, err);
out:
  r->live = NULL;
  if (have_frontier) cn__frontier_free(&fr);
  free(verts);
  if (rc != 0 && err != NULL && err->code == CN_OK)
    cn_err_set(err, rc, "the run could not execute (%s)",
               cn_err_default_msg(rc));
  return rc;
}
