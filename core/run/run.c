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

#include "run/run_api.h"

/* The rows the answers read after the run, as the family's reads() names
 * them for a device's fetch (cn__run_need): kept alive to the end. NULL
 * (nothing may be reused) when the family cannot say or memory ran out;
 * the spans are dropped again, cn__run_copy_back collects its own. */
static uint8_t *rows_read_after(cn_run *r) {
  if (r->fam->reads == NULL) return NULL;
  uint8_t *keep = calloc((size_t)r->nv + 1, 1);
  if (keep == NULL) return NULL;
  r->n_spans = 0;
  r->need_failed = false;
  for (int s = 0; s < r->n_slots; s++) r->fam->reads(r, s);
  for (int64_t i = 0; i < r->n_spans; i++) keep[r->spans[i].v] = 1;
  bool failed = r->need_failed;
  r->n_spans = 0;
  r->need_failed = false;
  if (failed) {
    free(keep);
    return NULL;
  }
  return keep;
}

/* Inputs of the vertices [v0, v0 + n) of the run's order. */
static int64_t edges_of(const cn_run *r, int32_t v0, int32_t n) {
  const int32_t *ord = r->order + v0, *in_start = r->in_start;
  int64_t edges = 0;
  for (int32_t i = 0; i < n; i++)
    edges += in_start[ord[i] + 1] - in_start[ord[i]];
  return edges;
}

/* The most scratch one launch may take, in floats. */
static int64_t scratch_cap(const cn_run *r) {
  int64_t cap = r->scratch_slice > 0        ? r->scratch_slice
                : r->bk->vt->host_memory ? CN__SCRATCH_SLICE_HOST
                                         : CN__SCRATCH_SLICE_DEVICE;
  /* under a memory budget one launch's scratch takes a sixteenth of it
   * at most, as its state rows do (slice_needs): the states keep 15/16 of
   * the budget, and a big batch runs in more launches, not more batches
   * (an eighth cost latticelstm 2 more batches at 16 MB, docs/memory.md) */
  int64_t sixteenth = r->mem_budget / 16 / (int64_t)sizeof(float);
  if (r->mem_budget > 0 && sixteenth < cap) cap = sixteenth;
  /* a budget under 64 bytes leaves a sixteenth of no float: one float a
   * launch still divides (slice_needs), and the plan is refused as over
   * the budget instead of dividing by zero */
  return cap > 0 ? cap : 1;
}

/* The rows of batch bt a launch executes at once (all of them unless its
 * scratch would pass the backend's CN__SCRATCH_SLICE_*: then as many equal
 * slices as it takes), and the most scratch and index staging one slice
 * needs. */
static int32_t slice_needs(const cn_run *r, const cn_run_batch *bt,
                           int64_t *scratch, int64_t *idx) {
  int64_t cap = scratch_cap(r);
  cn__run_batch_needs(r, bt->type, bt->n, edges_of(r, bt->start, bt->n),
                      scratch, idx);
  int64_t k = (*scratch + cap - 1) / cap;
  /* Under a memory budget a slice's state rows take a sixteenth of it at
   * most: each slice is a block of its own (run_arena.c), so a batch fits
   * the holes that rows freed earlier left, not only the top. */
  int64_t row = r->state_floats[bt->type] * (int64_t)sizeof(float);
  if (r->mem_budget > 0 && row > 0) {
    int64_t ks = ((int64_t)bt->n * row + r->mem_budget / 16 - 1) /
                 (r->mem_budget / 16 > 0 ? r->mem_budget / 16 : 1);
    if (ks > k) k = ks;
  }
  if (k <= 1 || bt->n < 2) return bt->n;
  int32_t rows = (int32_t)((bt->n + k - 1) / k);
  *scratch = *idx = 0;
  for (int32_t i = 0; i < bt->n; i += rows) {
    int32_t n = bt->n - i < rows ? bt->n - i : rows;
    int64_t s, x;
    cn__run_batch_needs(r, bt->type, n, edges_of(r, bt->start + i, n), &s,
                        &x);
    if (s > *scratch) *scratch = s;
    if (x > *idx) *idx = x;
  }
  return rows;
}

/* Sizes the arena from the plan: the state rows, placed by liveness
 * (run_arena.c) when keep says which rows outlive the run or, without it,
 * one buffer per type holding exactly its vertices; then the scratch the
 * largest launch needs. Allocates nothing on the backend. */
static int plan_rows(cn_run *r, const uint8_t *keep, cn_err *err) {
  const cn_family *f = r->fam;
  int64_t off = 0, scratch = 0, idx = 0;
  for (int t = 0; t < f->n_types; t++) {
    r->state_floats[t] = f->state_floats(r->m, t);
    r->type_base[t] = off;
    off += r->n_of_type[t] * r->state_floats[t];
    off = (off + 15) & ~(int64_t)15; /* 64-byte aligned buffers */
  }
  r->state_floats_total = off;
  /* Scratch and index staging: the most any single launch needs, a batch
   * over the backend's CN__SCRATCH_SLICE_* in slices (slice_needs). */
  if (r->cap_slice < (int64_t)r->n_batches + 1) {
    free(r->slice_rows);
    r->slice_rows = malloc((size_t)(r->n_batches + 1) * sizeof(int32_t));
    r->cap_slice = r->slice_rows != NULL ? r->n_batches + 1 : 0;
  }
  if (r->slice_rows == NULL)
    return cn_err_set(err, CN_E_NOMEM, "no memory to plan a run of %lld "
                      "batches", (long long)r->n_batches);
  for (int32_t b = 0; b < r->n_batches; b++) {
    int64_t s, need;
    r->slice_rows[b] = slice_needs(r, &r->batches[b], &s, &need);
    if (s > scratch) scratch = s;
    if (need > idx) idx = need;
  }
  if (r->cap_state_off < (int64_t)r->nv + 1) {
    free(r->state_off);
    r->state_off = malloc((size_t)(r->nv + 1) * sizeof(int64_t));
    r->cap_state_off = r->state_off != NULL ? r->nv + 1 : 0;
  }
  if (r->state_off == NULL)
    return cn_err_set(err, CN_E_NOMEM, "no memory to plan a run of %lld "
                      "vertices", (long long)r->nv);
  r->reused = false;
  if (keep != NULL) {
    int64_t states;
    if (cn__run_plan_live(r, keep, &states) != 0)
      return cn_err_set(err, CN_E_NOMEM, "no memory to plan the arena of a "
                        "run of %lld vertices", (long long)r->nv);
    /* Blocks are rounded to 64 bytes per batch, buffers once per type:
     * when little dies early (a tagger keeping its hidden rows) the
     * rounding can cost more than reuse saves, and then it is not used. */
    r->reused = states < off;
    if (r->reused) off = states;
    else r->n_frees = 0; /* nothing is freed in the arena used instead */
  }
  if (!r->reused) {
    /* Rows in batch order: a batch's outputs are consecutive rows. */
    int64_t next[CN_MAX_TYPES] = {0};
    for (int32_t b = 0; b < r->n_batches; b++) {
      int t = r->batches[b].type;
      for (int32_t i = 0; i < r->batches[b].n; i++) {
        int32_t v = r->order[r->batches[b].start + i];
        r->state_off[v] = r->type_base[t] + next[t]++ * r->state_floats[t];
      }
    }
    r->state_floats_live = off;
  }
  r->scratch_off = off;
  r->scratch_floats = scratch;
  r->arena_floats = off + scratch + 16;
  r->idx_cap = idx + 1;
  return 0;
}

/* Orders the batches by memory (the lowest peak at the policy's batch
 * count, docs/memory.md) and plans the rows; under a budget, plans until
 * the arena fits: the states get the budget less the scratch's cap,
 * scaled down by what the allocator's holes and rounding added over the
 * model when a plan misses (four tries), else the run is refused. */
static int plan_memory(cn_run *r, const uint8_t *keep, cn_err *err) {
  const int64_t B = r->mem_budget;
  int rc;
  if (keep == NULL || (!r->mem_order && B == 0)) {
    if ((rc = plan_rows(r, keep, err)) != 0) return rc;
    if (B == 0 || r->arena_floats * 4 <= B) return 0;
    return cn_err_set(err, CN_E_OVER_BUDGET,
                      "a run of %d instances needs %lld bytes of arena "
                      "(%s); the memory budget is %lld bytes",
                      r->n_slots,
                      (long long)r->arena_floats * 4,
                      r->reuse ? "this model's rows cannot be reused"
                               : "arena reuse is off",
                      (long long)B);
  }
  /* First the lowest peak at the policy's batch count: under the budget,
   * that is the plan; over it, its allocator-to-model ratio (holes,
   * rounding) scales the model's target for the budget's room. */
  int64_t target = 0, need = 0, states = 0, model = 0;
  bool fits = true;
  int attempt = 0;
  for (; attempt < 4; attempt++) {
    if (attempt > 0 && target <= 0) break;
    /* a try after the first starts from the last one's plan: its
     * inserted batches stay, the search only adds to them */
    if ((rc = cn__sched_memory(r, keep, target, &fits, &model, err)) != 0)
      break;
    if ((rc = plan_rows(r, keep, err)) != 0) break;
    states = r->scratch_off * 4;
    need = r->arena_floats * 4; /* with the arena's 64 bytes of padding */
    if (attempt == 0) r->arena_unbudgeted = need;
    if (B == 0 || need <= B || !fits) break;
    int64_t room = B - scratch_cap(r) * 4 - 64;
    if (room <= 0) break;
    /* the allocator's holes and rounding over the model: the model's
     * target is the room scaled down by what they added last time */
    int64_t t = (int64_t)((double)room * ((double)model / (double)states) *
                          0.98);
    target = target > 0 && t >= target ? target * 9 / 10 : t;
  }
  if (rc != 0 || B == 0 || (need > 0 && need <= B)) return rc;
  if (!fits && r->mem_groups >= r->n_slots)
    return cn_err_set(err, CN_E_OVER_BUDGET,
                      r->n_slots == 1
                          ? "the instance needs %lld bytes of arena (states "
                            "%lld + scratch %lld, the best plan found); the "
                            "memory budget is %lld bytes"
                          : "the request needs %lld bytes of arena even "
                            "one instance at a time (states %lld, mostly the "
                            "rows its answers read, kept for every "
                            "instance, + scratch %lld); the memory budget "
                            "is %lld bytes: ask for outputs \"root\" or "
                            "split the request",
                      (long long)need, (long long)states,
                      (long long)(need - states), (long long)B);
  return cn_err_set(err, CN_E_OVER_BUDGET,
                    "a run of %d instances needs %lld bytes of arena (states "
                    "%lld + scratch %lld, the best of %d plans); the memory "
                    "budget is %lld bytes: run fewer instances at once",
                    r->n_slots, (long long)need, (long long)states,
                    (long long)(need - states), attempt + 1, (long long)B);
}

/* The arena and the index staging the plan sized. */
static int alloc_arena(cn_run *r, cn_err *err) {
  r->arena = r->bk->vt->alloc(r->bk, (size_t)r->arena_floats * sizeof(float));
  r->scratch = r->arena ? r->arena + r->scratch_off : NULL;
  if (r->cap_idx_host < r->idx_cap) {
    free(r->idx_host);
    r->idx_host = malloc((size_t)r->idx_cap * sizeof(int64_t));
    r->cap_idx_host = r->idx_host != NULL ? r->idx_cap : 0;
  }
  if (r->arena == NULL || r->idx_host == NULL || cn__cell_plans(r) != 0)
    return cn_err_set(err, CN_E_NOMEM,
                      "run arena of %lld bytes could not be allocated",
                      (long long)r->arena_floats * 4);
  return 0;
}

static int exec_planned(cn_run *r, cn_policy_kind policy, cn_err *err) {
  double t0 = cn_thread_cpu_s();
  int rc = cn__sched_plan(r, policy, err);
  uint8_t *keep = rc == 0 && r->reuse ? rows_read_after(r) : NULL;
  if (rc == 0) rc = plan_memory(r, keep, err);
  free(keep);
  if (rc == 0) rc = alloc_arena(r, err);
  r->schedule_s += cn_thread_cpu_s() - t0;
  if (rc != 0) return rc;
  cn__run_bind_weights(r);
  long long k0 = r->bk->kernels;
  for (int32_t b = 0; b < r->n_batches; b++) {
    const cn_run_batch *bt = &r->batches[b];
    for (int32_t i = 0, rows = r->slice_rows[b]; i < bt->n; i += rows)
      if ((rc = cn__run_step(r, bt->type, r->order + bt->start + i,
                             bt->n - i < rows ? bt->n - i : rows, -1)) != 0)
        return cn_err_set(err, rc, "the run could not execute (%s)",
                          cn_err_default_msg(rc));
    if (r->poison) cn__run_poison(r, b);
  }
  /* a device backend's fetch waits for the batches itself */
  if (r->bk->vt->host_memory) r->bk->vt->sync(r->bk);
  r->kernels = r->bk->kernels - k0;
  return r->async ? cn__run_fetch_start(r, NULL, 0, err)
                  : cn__run_copy_back(r, NULL, 0, err);
}

/* Plans r as exec_planned does, under its budget, and executes nothing:
 * 0 when a plan fits, CN_E_OVER_BUDGET when none does. */
static int plan_only(cn_run *r, cn_policy_kind policy, cn_err *err) {
  int rc = cn__sched_plan(r, policy, err);
  if (rc != 0) return rc;
  uint8_t *keep = r->reuse ? rows_read_after(r) : NULL;
  rc = plan_memory(r, keep, err);
  free(keep);
  return rc;
}

/* One probe of cn_run_min_budget: 0 when `in` alone has a plan under
 * budget (the arena it needs in *arena), 1 when it has none, else a
 * negative error. *dynamic: the family's graph grows (nothing planned). */
static int probe_budget(const cn_model *m, cn_backend_ctx *bk,
                        const cn_instance *in, cn_policy_kind policy,
                        cn_layout layout, int plan_width, long long budget,
                        long long *arena, bool *dynamic, cn_err *err) {
  cn_run *r = cn_run_new(m, bk);
  if (r == NULL) return cn_err_set(err, CN_E_NOMEM, "no memory for a run");
  int rc = 0;
  *dynamic = r->fam->dynamic;
  if (*dynamic) goto out;
  cn_run_set_layout(r, layout);
  cn_run_set_plan_width(r, plan_width);
  cn_run_set_memory_budget(r, budget);
  if ((rc = cn_run_add(r, in, 0, 0)) < 0) {
    cn_err_set(err, rc, "could not add the instance");
    goto out;
  }
  cn_err e;
  cn_err_clear(&e);
  rc = plan_only(r, policy, &e);
  if (rc == CN_E_OVER_BUDGET) {
    rc = 1;
  } else if (rc != 0) {
    *err = e;
  } else {
    *arena = r->arena_floats * (long long)sizeof(float);
  }
out:
  cn_run_free(r);
  return rc;
}

int cn_run_min_budget(const cn_model *m, cn_backend_ctx *bk,
                      cn_policy_kind policy, cn_layout layout,
                      int plan_width, long long *bytes, cn_err *err) {
  *bytes = 0;
  /* a learned policy may be absent or retrained: the agenda it falls
   * back to stands in for it */
  if (policy == CN_POLICY_FSM) policy = CN_POLICY_AGENDA;
  json_t *j = cn_model_warmup_instance(m);
  cn_instance *in = NULL;
  cn_limits lim;
  cn_limits_default(&lim);
  cn_err e;
  cn_err_clear(&e);
  int rc = 0;
  if (j == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "no memory for the instance");
    goto out;
  }
  /* a vocabulary that makes no instance (tokens over the limits): no
   * floor can be told, and none is imposed */
  if (cn_instance_parse(m, j, &lim, 0, &in, &e) != 0) goto out;
  bool dynamic = false;
  long long arena = 0, hi, lo = 0;
  if ((rc = probe_budget(m, bk, in, policy, layout, plan_width, 0, &arena,
                         &dynamic, err)) != 0 ||
      dynamic)
    goto out;
  /* the arena without a budget fits under itself as a budget; should a
   * plan under a budget need more (its own rounding), double it */
  for (hi = arena > 64 ? arena : 64;; hi *= 2) {
    rc = probe_budget(m, bk, in, policy, layout, plan_width, hi, &arena,
                      &dynamic, err);
    if (rc < 0) goto out;
    if (rc == 0) break;
    if (hi > (1LL << 40)) {
      rc = cn_err_set(err, CN_E_INTERNAL, "no memory budget up to %lld "
                      "bytes lets the warm-up instance run", hi);
      goto out;
    }
  }
  /* lo: no plan under it; hi: a plan (every probe is a fresh run) */
  while (hi - lo > 1) {
    long long mid = lo + (hi - lo) / 2;
    rc = probe_budget(m, bk, in, policy, layout, plan_width, mid, &arena,
                      &dynamic, err);
    if (rc < 0) goto out;
    if (rc == 0) hi = mid;
    else lo = mid;
  }
  rc = 0;
  *bytes = hi;
out:
  cn_instance_free(in);
  json_decref(j);
  return rc;
}

/* The family's run-level host pass (finish), which sees all the run's
 * states at once: a CRF decodes all its instances together there instead
 * of one at a time. */
static int family_finish(cn_run *r, cn_err *err) {
  r->finished = true;
  int rc = r->fam->finish != NULL ? r->fam->finish(r, err) : 0;
  cn__run_count(r);
  return rc;
}

/* Every batch, then family_finish. Asynchronous (cn_run_set_async) on a
 * device backend with fetch_start: returns once every batch and the fetch
 * of what the answers read are issued; cn_run_wait does the rest. */
int cn_run_exec(cn_run *r, cn_policy_kind policy, cn_err *err) {
  if (r->executed)
    return cn_err_set(err, CN_E_INTERNAL, "a run executes only once");
  r->executed = true;
  r->ctr0 = r->bk->ctr;
  if (r->nv == 0) {
    r->finished = true;
    return 0;
  }
  double t0 = cn_thread_cpu_s(), s0 = r->schedule_s;
  int rc = r->fam->dynamic ? cn__run_exec_dynamic(r, policy, err)
                           : exec_planned(r, policy, err);
  cn__run_count(r);
  if (rc != 0) r->finished = true; /* nothing left to wait for */
  if (rc == 0 && !r->fetching) rc = family_finish(r, err);
  r->execute_s += cn_thread_cpu_s() - t0 - (r->schedule_s - s0);
  return rc;
}

int cn_run_wait(cn_run *r, cn_err *err) {
  if (!r->executed)
    return cn_err_set(err, CN_E_INTERNAL, "cn_run_wait before cn_run_exec");
  if (r->finished) return 0;
  r->ctr0 = r->bk->ctr; /* only this run's wait, not what ran between */
  double t0 = cn_thread_cpu_s();
  int rc = cn__run_fetch_wait(r, err);
  if (rc != 0) {
    r->finished = true;
    cn__run_count(r);
  } else {
    rc = family_finish(r, err);
  }
  r->execute_s += cn_thread_cpu_s() - t0;
  return rc;
}

void cn_run_set_async(cn_run *r, int on) { r->async = on != 0; }

void cn__run_count(cn_run *r) {
  const cn_backend_counters *a = &r->ctr0, *b = &r->bk->ctr;
  r->ctr.syncs += b->syncs - a->syncs;
  r->ctr.bytes_to_device += b->bytes_to_device - a->bytes_to_device;
  r->ctr.bytes_to_host += b->bytes_to_host - a->bytes_to_host;
  r->ctr.allocs += b->allocs - a->allocs;
  r->ctr.launches += b->launches - a->launches;
  r->ctr.copies_to_device += b->copies_to_device - a->copies_to_device;
  r->ctr.device_bytes = b->device_bytes;
  r->ctr0 = *b;
}

void cn__run_stats_common(const cn_run *r, cn_run_stats *s) {
  memset(s, 0, sizeof(*s));
  s->instances = r->n_slots;
  s->vertices = r->nv;
  s->batches = r->n_batches;
  s->arena_bytes = (size_t)r->arena_floats * sizeof(float);
  s->gather_bytes = r->gather_bytes;
  s->cell_bytes = r->cell_bytes;
  s->device_syncs = r->ctr.syncs;
  s->bytes_to_device = r->ctr.bytes_to_device;
  s->bytes_to_host = r->ctr.bytes_to_host;
  s->device_allocs = r->ctr.allocs;
  s->launches = r->ctr.launches;
  s->copies_to_device = r->ctr.copies_to_device;
}

void cn_run_get_stats(const cn_run *r, cn_run_stats *s) {
  cn__run_stats_common(r, s);
  s->lower_bound = r->lower_bound;
  /* the state region: the live high-water mark of a planned run (all the
   * states without reuse, and for a growing graph) */
  s->state_bytes = (size_t)r->scratch_off * sizeof(float);
  s->state_bytes_total = (size_t)(r->state_floats_total > 0
                                      ? r->state_floats_total
                                      : r->scratch_off) * sizeof(float);
  s->policy_batches = r->policy_batches > 0 ? r->policy_batches
                                            : r->n_batches;
  s->arena_bytes_unbudgeted = r->arena_unbudgeted > 0
                                  ? (size_t)r->arena_unbudgeted
                                  : s->arena_bytes;
  s->kernels = r->kernels;
  s->schedule_s = r->schedule_s;
  s->execute_s = r->execute_s;
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
