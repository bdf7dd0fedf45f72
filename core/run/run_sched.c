/* run_sched.c - what a run asks of the scheduler (core/sched): the run
 * hands its typed DAG (cn__run_dag) to the scheduler and writes the plan
 * back into its own arrays. The scheduler works on cn_dag only and never
 * sees a run, so the dependency points one way: run -> sched. Calls no
 * other file of run/; cn_run_exec_fsm, which sets the learned policy and
 * executes, is run.c's.
 */
#include <stdlib.h>
#include <string.h>

#include "run/run_api.h"

int64_t cn__sched_lower_bound(const cn_run *r) {
  cn_dag g = cn__run_dag(r);
  return cn__dag_lower_bound(&g);
}

int cn__sched_plan(cn_run *r, cn_policy_kind policy, cn_err *err) {
  int rc = CN_E_NOMEM;
  cn_dag g = cn__run_dag(r);
  /* a reset run keeps its own (cn_run_reset) */
  if (r->cap_plan < (int64_t)r->nv + 1 || r->order == NULL ||
      r->batches == NULL) {
    free(r->order);
    free(r->batches);
    r->order = malloc(((size_t)r->nv + 1) * sizeof(int32_t));
    r->batches = malloc(((size_t)r->nv + 1) * sizeof(cn_run_batch));
    r->cap_plan = r->order != NULL && r->batches != NULL ? r->nv + 1 : 0;
  }
  if (r->order == NULL || r->batches == NULL) goto out;
  r->n_batches = 0;
  rc = cn__sched_dag(&g, policy, r->sched_fsm, r->plan_width, r->order,
                     r->batches, &r->n_batches);
  if (rc != 0) goto out;
  r->lower_bound = cn__dag_lower_bound(&g);
  if (r->lower_bound < 0) rc = CN_E_NOMEM;
  r->policy_batches = r->n_batches;
out:
  if (rc != 0)
    cn_err_set(err, rc, "could not plan the run's batches (%s)",
               cn_err_default_msg(rc));
  return rc;
}

int cn__sched_memory(cn_run *r, const uint8_t *keep, int64_t budget,
                     bool *fits, int64_t *model_peak, cn_err *err) {
  cn_dag g = cn__run_dag(r);
  int64_t bytes[CN_MAX_TYPES];
  for (int t = 0; t < r->fam->n_types; t++)
    bytes[t] = r->fam->state_floats(r->m, t) * (int64_t)sizeof(float);
  cn_dag_mem m = {bytes, keep};
  cn_dag_mem_result res;
  int rc = cn__dag_mem_order(&g, &m, budget, r->order, r->batches,
                             &r->n_batches, &res);
  if (rc != 0)
    return cn_err_set(err, rc, "could not order the run's batches by "
                      "memory (%s)", cn_err_default_msg(rc));
  r->mem_groups = res.groups;
  *fits = res.fits;
  *model_peak = res.peak;
  return 0;
}

int cn_graph_set_add_run(cn_graph_set *s, const cn_run *r) {
  if (r->fam->n_types != cn__graph_set_n_types(s)) return CN_E_INTERNAL;
  cn_dag g = cn__run_dag(r);
  return cn__graph_set_add_dag(s, &g, r->ne);
}
