/* run.c - a run: the instance graphs of many requests, planned into one
 * arena and executed batch by batch on one backend context.
 *
 * Life of a run: cn_run_add() appends each instance's vertices (the family's
 * build(), run_graph.c); cn_run_exec() plans the batches (run_sched.c),
 * sizes every type's state buffer and the scratch from that plan, allocates
 * ONE arena from the backend, then launches batch after batch (run_batch.c)
 * and brings the answers' states back (run_output.c); a growing graph goes
 * to run_dynamic.c instead. Nothing is allocated per vertex, and all
 * tensors live in the arena (Cavs §4: dynamic tensors, one contiguous
 * buffer per vertex type). The top of run/ but decode sessions
 * (run_decode.c): no file it calls calls it back.
 */
#include <stdlib.h>
#include <string.h>

#include "run/run.h"

/* Sizes the arena from the plan: each type's buffer holds exactly its
 * vertices; the scratch holds the largest batch's needs. */
static int plan_arena(cn_run *r, cn_err *err) {
  const cn_family *f = r->fam;
  int64_t off = 0, scratch = 0, idx = 0;
  for (int t = 0; t < f->n_types; t++) {
    r->state_floats[t] = f->state_floats(r->m, t);
    r->type_base[t] = off;
    off += r->n_of_type[t] * r->state_floats[t];
    off = (off + 15) & ~(int64_t)15; /* 64-byte aligned buffers */
  }
  /* Scratch and index staging: the most any single batch needs. */
  for (int32_t b = 0; b < r->n_batches; b++) {
    const cn_run_batch *bt = &r->batches[b];
    int64_t edges = 0;
    for (int32_t i = 0; i < bt->n; i++) {
      int k;
      cn__run_inputs(r, r->order[bt->start + i], &k);
      edges += k;
    }
    int64_t s, need;
    cn__run_batch_needs(r, bt->type, bt->n, edges, &s, &need);
    if (s > scratch) scratch = s;
    if (need > idx) idx = need;
  }
  r->scratch_off = off;
  r->scratch_floats = scratch;
  r->arena_floats = off + scratch + 16;
  r->arena = r->bk->vt->alloc(r->bk, (size_t)r->arena_floats * sizeof(float));
  r->scratch = r->arena ? r->arena + r->scratch_off : NULL;
  r->idx_host = malloc((size_t)(idx + 1) * sizeof(int64_t));
  r->idx_cap = idx + 1;
  r->state_off = malloc((size_t)(r->nv + 1) * sizeof(int64_t));
  if (r->arena == NULL || r->idx_host == NULL || r->state_off == NULL)
    return cn_err_set(err, CN_E_NOMEM,
                      "run arena of %lld bytes could not be allocated",
                      (long long)r->arena_floats * 4);
  /* Rows in batch order: a batch's outputs are consecutive rows. */
  int64_t next[CN_MAX_TYPES] = {0};
  for (int32_t b = 0; b < r->n_batches; b++) {
    int t = r->batches[b].type;
    for (int32_t i = 0; i < r->batches[b].n; i++) {
      int32_t v = r->order[r->batches[b].start + i];
      r->state_off[v] = r->type_base[t] + next[t]++ * r->state_floats[t];
    }
  }
  return 0;
}

static int exec_planned(cn_run *r, cn_policy_kind policy, cn_err *err) {
  int rc = cn__sched_plan(r, policy, err);
  if (rc != 0) return rc;
  rc = plan_arena(r, err);
  if (rc != 0) return rc;
  cn__run_bind_weights(r);
  long long k0 = r->bk->kernels;
  for (int32_t b = 0; b < r->n_batches; b++) {
    const cn_run_batch *bt = &r->batches[b];
    r->idx_used = 0;
    cn__run_exec_batch(r, bt->type, r->order + bt->start, bt->n);
  }
  /* a device backend's fetch waits for the batches itself */
  if (r->bk->vt->host_memory) r->bk->vt->sync(r->bk);
  r->kernels = r->bk->kernels - k0;
  return cn__run_copy_back(r, NULL, 0, err);
}

/* Every batch, then the family's run-level host pass (finish), which sees
 * all the run's states at once: a CRF decodes all its instances together
 * there instead of one at a time. */
int cn_run_exec(cn_run *r, cn_policy_kind policy, cn_err *err) {
  if (r->executed)
    return cn_err_set(err, CN_E_INTERNAL, "a run executes only once");
  r->executed = true;
  r->ctr0 = r->bk->ctr;
  if (r->nv == 0) return 0;
  int rc = r->fam->dynamic ? cn__run_exec_dynamic(r, policy, err)
                           : exec_planned(r, policy, err);
  if (rc == 0 && r->fam->finish != NULL) rc = r->fam->finish(r, err);
  cn__run_count(r);
  return rc;
}

void cn__run_count(cn_run *r) {
  const cn_backend_counters *a = &r->ctr0, *b = &r->bk->ctr;
  r->ctr.syncs = b->syncs - a->syncs;
  r->ctr.bytes_to_device = b->bytes_to_device - a->bytes_to_device;
  r->ctr.bytes_to_host = b->bytes_to_host - a->bytes_to_host;
  r->ctr.allocs = b->allocs - a->allocs;
  r->ctr.launches = b->launches - a->launches;
  r->ctr.device_bytes = b->device_bytes;
}

void cn_run_get_stats(const cn_run *r, cn_run_stats *s) {
  memset(s, 0, sizeof(*s));
  s->instances = r->n_slots;
  s->vertices = r->nv;
  s->batches = r->n_batches;
  s->lower_bound = r->lower_bound;
  s->arena_bytes = (size_t)r->arena_floats * sizeof(float);
  s->gather_bytes = r->gather_bytes;
  s->cell_bytes = r->cell_bytes;
  s->kernels = r->kernels;
  s->device_syncs = r->ctr.syncs;
  s->bytes_to_device = r->ctr.bytes_to_device;
  s->bytes_to_host = r->ctr.bytes_to_host;
  s->device_allocs = r->ctr.allocs;
  s->launches = r->ctr.launches;
}

/* cn_run_exec with a learned policy (NULL: the agenda). */
int cn_run_exec_fsm(cn_run *r, const cn_fsm *p, cn_err *err) {
  if (p != NULL && cn__fsm_n_types(p) != r->fam->n_types)
    return cn_err_set(err, CN_E_INTERNAL,
                      "the policy has %d vertex types, model %s has %d",
                      cn__fsm_n_types(p), r->fam->name, r->fam->n_types);
  r->sched_fsm = p;
  return cn_run_exec(r, CN_POLICY_FSM, err);
}
