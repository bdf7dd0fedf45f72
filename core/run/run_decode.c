/* run_decode.c - decode sessions: iteration-level batching of a dynamic
 * family (canopy_core.h "decode sessions").
 *
 * A session is the dynamic run of run_dynamic.c turned inside out. There,
 * every instance is added before the first batch, the arena is planned for
 * the decode caps, and the run ends when its slowest instance does; here
 * the caller holds the loop: it adds instances between steps (Orca's
 * iteration-level scheduling, OSDI '22; BatchMaker's cellular batching,
 * EuroSys '18), executes one iteration a step (a batch of each ready
 * type), and takes each instance away as soon as its own graph is
 * complete.
 *
 * The graph is the run's (cn_run, its frontier mirrored through r->live),
 * so a step executes exactly what a whole run would for the same ready
 * vertices: the same compiled cells and decoded(), on rows of the same
 * instance. Only memory differs:
 *   - state rows are handed out in launch order from one arena (a batch's
 *     rows consecutive, as the kernels write them in place), grown by
 *     doubling: rows keep their offsets, so nothing needs re-pointing;
 *   - when the arena has doubled since the last compaction, the rows of
 *     slots still running or not yet output are copied to a fresh arena and
 *     every other row is dropped: a long session holds the states of the
 *     instances in flight, not of every instance it ever decoded.
 * Completion is counted per slot: the vertices it has that have not run.
 * build() adds an instance's first vertices, decoded() adds the next step's
 * (to the slot of the vertex that made them), and a launch takes one off
 * for each vertex it ran; a slot at zero has nothing left to run.
 */
#include <stdlib.h>
#include <string.h>

#include "run/run_api.h"

enum { SLOT_RUNNING, SLOT_DONE, SLOT_OUTPUT };

/* The arena is compacted no smaller than this (floats): small sessions
 * never compact. */
#define MIN_COMPACT_FLOATS (1 << 16)

struct cn_decode {
  cn_run *r;
  cn_frontier fr;
  cn_policy_kind policy;
  const cn_fsm *fsm;
  bool tails_pending; /* the policy reads tails: computed at the first step */
  int broken;         /* an add or a step failed: the error, else 0 */
  int32_t *verts;
  int64_t cap_verts;
  int64_t used;       /* floats of the arena handed out */
  int64_t compact_at; /* compact when used passes this */
  /* per slot */
  int32_t *left;      /* vertices not yet run */
  uint8_t *sstate;
  int cap_slots;
  int active;
  int32_t *done;      /* finished and not yet taken, FIFO */
  int n_done, cap_done;
  int32_t low_slot;   /* every slot below it has been output */
  int32_t cleared_to; /* vertices below it have no row (state_off -1) */
  long long k0;
  /* device backends: the slots whose rows the last fetch brought over */
  int32_t *fetched;
  int n_fetched, cap_fetched;
};

int cn_model_decodes(const cn_model *m) { return m->fam->dynamic; }

cn_decode *cn_decode_new(const cn_model *m, cn_backend_ctx *bk,
                         cn_policy_kind policy, const cn_fsm *fsm) {
  cn_decode *d = calloc(1, sizeof(*d));
  if (d == NULL) return NULL;
  d->r = cn_run_new(m, bk);
  /* the static plans need the whole graph before they start */
  if (policy == CN_POLICY_NONE || policy == CN_POLICY_DEPTH ||
      policy == CN_POLICY_PLAN)
    policy = CN_POLICY_AGENDA;
  if (policy == CN_POLICY_FSM && fsm != NULL &&
      cn__fsm_n_types(fsm) != m->fam->n_types)
    fsm = NULL; /* not this model's: agenda, as cn_run_exec_fsm refuses */
  d->policy = policy;
  d->fsm = fsm;
  bool sub = policy == CN_POLICY_SUFFICIENT || policy == CN_POLICY_FSM;
  if (d->r == NULL || cn__frontier_init(&d->fr, m->fam->n_types, sub) != 0) {
    cn_run_free(d->r);
    free(d);
    return NULL;
  }
  d->tails_pending = cn__policy_needs_tails(policy, fsm);
  cn_run *r = d->r;
  r->live = &d->fr;
  for (int t = 0; t < m->fam->n_types; t++)
    r->state_floats[t] = m->fam->state_floats(m, t);
  cn__run_bind_weights(r);
  d->compact_at = MIN_COMPACT_FLOATS;
  d->k0 = bk->kernels;
  r->ctr0 = bk->ctr;
  return d;
}

void cn_decode_set_layout(cn_decode *d, cn_layout layout) {
  cn_run_set_layout(d->r, layout);
}

static int grow_slots(cn_decode *d, int need) {
  if (need <= d->cap_slots) return 0;
  int c = d->cap_slots ? d->cap_slots * 2 : 64;
  while (c < need) c *= 2;
  int32_t *l = cn__xrealloc(d->left, (size_t)c, sizeof(int32_t));
  if (l == NULL) return CN_E_NOMEM;
  d->left = l;
  uint8_t *s = cn__xrealloc(d->sstate, (size_t)c, 1);
  if (s == NULL) return CN_E_NOMEM;
  d->sstate = s;
  d->cap_slots = c;
  return 0;
}

static int push_done(cn_decode *d, int32_t slot) {
  if (d->n_done == d->cap_done) {
    int c = d->cap_done ? d->cap_done * 2 : 64;
    int32_t *p = cn__xrealloc(d->done, (size_t)c, sizeof(int32_t));
    if (p == NULL) return CN_E_NOMEM;
    d->done = p;
    d->cap_done = c;
  }
  d->done[d->n_done++] = slot;
  d->sstate[slot] = SLOT_DONE;
  d->active--;
  return 0;
}

int cn_decode_add(cn_decode *d, const cn_instance *inst, unsigned flags,
                  int max_decode_len) {
  if (d->broken) return d->broken;
  cn_run *r = d->r;
  int rc = grow_slots(d, r->n_slots + 1);
  if (rc != 0) return rc;
  int32_t nv0 = r->nv;
  int slot = cn_run_add(r, inst, flags, max_decode_len);
  if (slot < 0) {
    /* part of its graph may be in the frontier already */
    d->broken = slot;
    return slot;
  }
  d->left[slot] = r->nv - nv0;
  d->sstate[slot] = SLOT_RUNNING;
  d->active++;
  if (d->left[slot] == 0 && (rc = push_done(d, slot)) != 0) {
    d->broken = rc;
    return rc;
  }
  return slot;
}

/* A slot's rows are still needed: it runs, or its output was not read. */
static bool slot_live(const cn_decode *d, int32_t slot) {
  return d->sstate[slot] != SLOT_OUTPUT;
}

/* Copies the rows of live slots to a fresh arena of at least `extra` more
 * floats; every other row is dropped (its offset becomes -1). */
static int compact(cn_decode *d, int64_t extra) {
  cn_run *r = d->r;
  cn_backend_ctx *bk = r->bk;
  while (d->low_slot < r->n_slots && !slot_live(d, d->low_slot)) d->low_slot++;
  int32_t v0 = d->low_slot < r->n_slots ? r->slots[d->low_slot].v0 : r->nv;
  int64_t keep = 0;
  for (int32_t v = v0; v < r->nv; v++)
    if (r->state_off[v] >= 0 && slot_live(d, r->vslot[v]))
      keep += r->state_floats[r->vtype[v]];
  int64_t want = 2 * (keep + extra) + 64;
  if (want < MIN_COMPACT_FLOATS) want = MIN_COMPACT_FLOATS;
  float *a = bk->vt->alloc(bk, (size_t)want * sizeof(float));
  if (a == NULL) return CN_E_NOMEM;
  /* below v0 every vertex is an output slot's */
  for (int32_t v = d->cleared_to; v < v0; v++) r->state_off[v] = -1;
  if (v0 > d->cleared_to) d->cleared_to = v0;
  int64_t at = 0;
  if (!bk->vt->host_memory) {
    /* a device arena is packed on the device: one gather per type (rows
     * of a type keep their order), no host copy of the states */
    int64_t most = r->nv - v0;
    if (cn__run_ensure_idx(r, most + 1) != 0) {
      bk->vt->free(bk, a);
      return CN_E_NOMEM;
    }
    for (int t = 0; t < r->fam->n_types; t++) {
      int64_t w = r->state_floats[t], n = 0;
      int64_t *idx = r->idx_host;
      for (int32_t v = v0; v < r->nv; v++) {
        if (r->vtype[v] != t || r->state_off[v] < 0) continue;
        if (!slot_live(d, r->vslot[v])) {
          r->state_off[v] = -1;
          continue;
        }
        idx[n] = r->state_off[v];
        r->state_off[v] = at + n * w;
        n++;
      }
      if (n > 0 && w > 0) CN_BK(bk, gather, a + at, (int)w, r->arena, idx,
                                (int)n, (int)w);
      at += n * w;
    }
  } else {
    for (int32_t v = v0; v < r->nv; v++) {
      if (r->state_off[v] < 0) continue;
      if (!slot_live(d, r->vslot[v])) {
        r->state_off[v] = -1;
        continue;
      }
      int64_t w = r->state_floats[r->vtype[v]];
      if (w > 0) memcpy(a + at, r->arena + r->state_off[v], (size_t)w * 4);
      r->state_off[v] = at;
      at += w;
    }
  }
  if (r->arena != NULL) bk->vt->free(bk, r->arena);
  r->arena = a;
  r->arena_floats = want;
  d->used = at;
  d->compact_at = 2 * want > MIN_COMPACT_FLOATS ? 2 * want
                                                 : MIN_COMPACT_FLOATS;
  return 0;
}

/* Room for `floats` more at the end of the arena (64-byte aligned start). */
static int arena_room(cn_decode *d, int64_t floats) {
  cn_run *r = d->r;
  d->used = (d->used + 15) & ~(int64_t)15;
  if (d->used + floats <= r->arena_floats) return 0;
  /* full: compact when it doubled since the last time (the states of
   * finished slots are then most of it), else just grow */
  if (r->arena != NULL && d->used >= d->compact_at) return compact(d, floats);
  cn_backend_ctx *bk = r->bk;
  int64_t want = 2 * (d->used + floats) + 64;
  float *a = bk->vt->alloc(bk, (size_t)want * sizeof(float));
  if (a == NULL) return CN_E_NOMEM;
  if (r->arena != NULL) {
    if (bk->vt->host_memory) {
      memcpy(a, r->arena, (size_t)d->used * sizeof(float));
    } else {
      /* device to device, in rows of at most 16M floats */
      int64_t w = d->used < ((int64_t)1 << 24) ? d->used : (int64_t)1 << 24;
      int64_t rows = w > 0 ? d->used / w : 0, rest = d->used - rows * w;
      if (rows > 0)
        CN_BK(bk, copy_rows, a, (int)w, r->arena, (int)w, (int)rows, (int)w);
      if (rest > 0)
        CN_BK(bk, copy_rows, a + rows * w, (int)rest, r->arena + rows * w,
              (int)rest, 1, (int)rest);
    }
    bk->vt->free(bk, r->arena);
  }
  r->arena = a;
  r->arena_floats = want;
  return 0;
}

static int fail(cn_decode *d, int rc, cn_err *err) {
  d->broken = rc;
  if (err != NULL && err->code == CN_OK)
    cn_err_set(err, rc, "the decode step could not execute (%s)",
               cn_err_default_msg(rc));
  return rc;
}

/* Commits and executes the batch of every ready type-t vertex. */
static int launch(cn_decode *d, int t) {
  cn_run *r = d->r;
  if (d->cap_verts < d->fr.n_ready[t]) {
    int64_t c = d->fr.n_ready[t] * 2;
    int32_t *p = cn__xrealloc(d->verts, (size_t)c, sizeof(int32_t));
    if (p == NULL) return CN_E_NOMEM;
    d->verts = p;
    d->cap_verts = c;
  }
  int32_t n = cn__frontier_commit(&d->fr, t, d->verts);
  if (n <= 0) return CN_E_INTERNAL;
  const int32_t *verts = d->verts;
  int rc = arena_room(d, n * r->state_floats[t]);
  if (rc != 0) return rc;
  int64_t edges = 0;
  for (int32_t i = 0; i < n; i++) {
    int k;
    cn__run_inputs(r, verts[i], &k);
    edges += k;
    r->state_off[verts[i]] = d->used;
    d->used += r->state_floats[t];
  }
  int32_t nv0 = r->nv;
  if ((rc = cn__run_step(r, t, verts, n, edges)) != 0) return rc;
  for (int32_t v = nv0; v < r->nv; v++) d->left[r->vslot[v]]++;
  for (int32_t i = 0; i < n; i++) {
    int32_t s = r->vslot[verts[i]];
    if (--d->left[s] == 0 && (rc = push_done(d, s)) != 0) return rc;
  }
  return 0;
}

/* One iteration: a batch of each type ready when it starts, in the
 * policy's order. Run one batch a step, a policy that prefers shallow
 * vertices (agenda) would run the encoders of a stream of newcomers
 * forever while the decoders of earlier instances wait: with every ready
 * type served each iteration, an instance advances every iteration, as in
 * Orca. */
int cn_decode_step(cn_decode *d, cn_err *err) {
  if (d->broken) return fail(d, d->broken, err);
  if (d->tails_pending) {
    if (cn__frontier_tails(&d->fr) != 0) return fail(d, CN_E_NOMEM, err);
    d->tails_pending = false;
  }
  uint32_t todo = 0;
  for (int t = 0; t < d->fr.n_types; t++)
    if (d->fr.n_ready[t] > 0) todo |= 1u << t;
  if (todo == 0) return 0;
  while (todo != 0) {
    int t = cn__frontier_next(&d->fr, d->policy, d->fsm);
    if (t < 0) break;
    if (!(todo >> t & 1)) { /* served already: the first one left */
      for (t = 0; t < d->fr.n_types; t++)
        if ((todo >> t & 1) && d->fr.n_ready[t] > 0) break;
      if (t == d->fr.n_types) break;
    }
    todo &= ~(1u << t);
    int rc = launch(d, t);
    if (rc != 0) return fail(d, rc, err);
  }
  return 1;
}

/* Brings the rows the answers of slots[0..n) read to the host (device
 * backends), remembering which slots they were. */
static int fetch(cn_decode *d, const int *slots, int n) {
  cn_run *r = d->r;
  if (n > d->cap_fetched) {
    int32_t *p = cn__xrealloc(d->fetched, (size_t)n, sizeof(int32_t));
    if (p == NULL) return CN_E_NOMEM;
    d->fetched = p;
    d->cap_fetched = n;
  }
  d->n_fetched = 0;
  r->scratch_off = d->used;
  cn_err err;
  cn_err_clear(&err);
  int rc = cn__run_copy_back(r, slots, n, &err);
  if (rc != 0) return rc;
  for (int i = 0; i < n; i++) d->fetched[i] = slots[i];
  d->n_fetched = n;
  return 0;
}

int cn_decode_take_done(cn_decode *d, int *slots, int cap) {
  int n = d->n_done < cap ? d->n_done : cap;
  for (int i = 0; i < n; i++) slots[i] = d->done[i];
  if (d->n_done > n) /* done may still be NULL: nothing finished yet */
    memmove(d->done, d->done + n, (size_t)(d->n_done - n) * sizeof(int32_t));
  d->n_done -= n;
  if (n > 0 && !d->r->bk->vt->host_memory) {
    /* the outputs read states on the host: bring over what these slots'
     * answers read, nothing else */
    if (fetch(d, slots, n) != 0) d->broken = CN_E_BACKEND;
  }
  return n;
}

json_t *cn_decode_output(cn_decode *d, int slot) {
  cn_run *r = d->r;
  if (slot < 0 || slot >= r->n_slots || d->sstate[slot] != SLOT_DONE)
    return NULL;
  if (!r->bk->vt->host_memory) {
    /* taken before the last fetch: its rows are no longer in the host
     * buffer, fetch them alone */
    bool have = false;
    for (int i = 0; r->host != NULL && i < d->n_fetched; i++)
      if (d->fetched[i] == slot) {
        have = true;
        break;
      }
    if (!have && fetch(d, &slot, 1) != 0) return NULL;
  }
  json_t *o = r->fam->output(r, slot);
  d->sstate[slot] = SLOT_OUTPUT;
  return o;
}

int cn_decode_active(const cn_decode *d) { return d->active; }

long long cn_decode_vertices(const cn_decode *d) { return d->r->nv; }

long long cn_decode_batches(const cn_decode *d) { return d->r->n_batches; }

void cn_decode_get_stats(const cn_decode *d, cn_run_stats *s) {
  cn__run_count(d->r); /* the backend's counters up to now */
  cn__run_stats_common(d->r, s);
  s->lower_bound = 0; /* Σ depth over a graph that never closes: none */
  s->kernels = d->r->bk->kernels - d->k0;
}

void cn_decode_free(cn_decode *d) {
  if (d == NULL) return;
  d->r->live = NULL;
  cn__frontier_free(&d->fr);
  cn_run_free(d->r);
  free(d->verts);
  free(d->left);
  free(d->sstate);
  free(d->done);
  free(d->fetched);
  free(d);
}
