/* run.c - a run: the instance graphs of many requests, planned into one
 * arena and executed batch by batch on one backend context.
 *
 * Life of a run: cn_run_add() appends each instance's vertices (the family's
 * build()); cn_run_exec() plans the batches (sched.c), sizes every type's
 * state buffer and the scratch from that plan, allocates ONE arena from the
 * backend, then launches batch after batch through the family's exec().
 * Nothing is allocated per vertex: the graph lives in a handful of arrays
 * grown geometrically, and all tensors live in the arena (Cavs §4: dynamic
 * tensors, one contiguous buffer per vertex type).
 */
#include <stdlib.h>
#include <string.h>

#include "run/run.h"

static int grow(void **p, int32_t *cap, int32_t need, size_t elem) {
  if (need <= *cap) return 0;
  int32_t c = *cap ? *cap : 64;
  while (c < need) {
    if (c > INT32_MAX / 2) return -1;
    c *= 2;
  }
  void *q = cn__xrealloc(*p, (size_t)c, elem);
  if (q == NULL) return -1;
  *p = q;
  *cap = c;
  return 0;
}

static int resize(void **p, size_t n, size_t elem) {
  void *q = cn__xrealloc(*p, n, elem);
  if (q == NULL) return -1;
  *p = q;
  return 0;
}

cn_run *cn_run_new(const cn_model *m, cn_backend_ctx *bk) {
  cn_run *r = calloc(1, sizeof(*r));
  if (r == NULL) return NULL;
  r->m = m;
  r->fam = m->fam;
  r->bk = bk;
  r->plan_width = CN_PLAN_WIDTH_DEFAULT;
  /* memory by liveness unless CANOPY_ARENA_REUSE=0; poisoning for tests
   * (docs/memory.md, docs/testing.md) */
  const char *e = getenv("CANOPY_ARENA_REUSE");
  r->reuse = e == NULL || strcmp(e, "0") != 0;
  e = getenv("CANOPY_POISON_FREED");
  r->poison = e != NULL && strcmp(e, "0") != 0 && e[0] != '\0';
  r->in_start = malloc(sizeof(int32_t));
  if (r->in_start == NULL) {
    free(r);
    return NULL;
  }
  r->in_start[0] = 0;
  return r;
}

void cn_run_free(cn_run *r) {
  if (r == NULL) return;
  if (r->arena != NULL) r->bk->vt->free(r->bk, r->arena);
  if (r->own_scratch && r->scratch != NULL) r->bk->vt->free(r->bk, r->scratch);
  free(r->slots);
  free(r->vtype);
  free(r->vslot);
  free(r->vnode);
  free(r->vaux);
  free(r->in_start);
  free(r->in_edges);
  free(r->node_vertex);
  free(r->state_off);
  free(r->order);
  free(r->batches);
  free(r->idx_host);
  free(r->spans);
  free(r->fetch_idx);
  free(r->out_tag);
  free(r->out_score);
  free(r->frees);
  free(r);
}

int32_t cn__run_add_vertex(cn_run *r, int type, int slot, int node, int aux,
                           const int32_t *inputs, int n_inputs) {
  int32_t v = r->nv;
  if (v + 1 > r->cap_v) {
    /* All per-vertex arrays share one capacity, doubled when full. */
    size_t c = r->cap_v ? (size_t)r->cap_v * 2 : 256;
    if (c > INT32_MAX / 2 || resize((void **)&r->vtype, c, 1) ||
        resize((void **)&r->vslot, c, 4) || resize((void **)&r->vnode, c, 4) ||
        resize((void **)&r->vaux, c, 4) ||
        resize((void **)&r->in_start, c + 1, 4))
      return -1;
    r->cap_v = (int32_t)c;
  }
  if (grow((void **)&r->in_edges, &r->cap_e, r->ne + n_inputs,
           sizeof(int32_t)))
    return -1;
  r->vtype[v] = (uint8_t)type;
  r->vslot[v] = slot;
  r->vnode[v] = node;
  r->vaux[v] = aux;
  if (n_inputs > 0)
    memcpy(r->in_edges + r->ne, inputs, (size_t)n_inputs * sizeof(int32_t));
  r->ne += n_inputs;
  r->in_start[v + 1] = r->ne;
  r->nv = v + 1;
  r->n_of_type[type]++;
  if (r->live != NULL) { /* a dynamic run: the frontier sees it too */
    if (v >= r->cap_state_off) {
      /* a decode session (run_decode.c) grows as instances join; a run
       * planned up front (run_dynamic.c) never gets here */
      int64_t c = r->cap_state_off ? r->cap_state_off * 2 : 256;
      int64_t *p = cn__xrealloc(r->state_off, (size_t)c, sizeof(int64_t));
      if (p == NULL) return -1;
      for (int64_t i = r->cap_state_off; i < c; i++) p[i] = -1;
      r->state_off = p;
      r->cap_state_off = c;
    }
    if (cn__frontier_add(r->live, type, inputs, n_inputs) != v) return -1;
    r->state_off[v] = -1;
  }
  return v;
}

/* Reserves the node -> vertex map of a slot (n nodes, filled by build()). */
int32_t cn__run_reserve_nodes(cn_run *r, int32_t n) {
  int32_t at = r->n_nodev;
  if (grow((void **)&r->node_vertex, &r->cap_nodev, at + n, sizeof(int32_t)))
    return -1;
  r->n_nodev = at + n;
  return at;
}

int cn_run_add(cn_run *r, const cn_instance *inst, unsigned flags,
               int max_decode_len) {
  if (r->executed) return CN_E_INTERNAL;
  if (inst->m != r->m) return CN_E_INTERNAL;
  if (r->n_slots == r->cap_slots) {
    int32_t c = r->cap_slots;
    if (grow((void **)&r->slots, &c, r->n_slots + 1, sizeof(cn_run_slot)))
      return CN_E_NOMEM;
    r->cap_slots = c;
  }
  int slot = r->n_slots;
  cn_run_slot *s = &r->slots[slot];
  memset(s, 0, sizeof(*s));
  s->inst = inst;
  s->flags = flags;
  s->max_decode_len = max_decode_len;
  s->v0 = r->nv;
  r->n_slots++;
  int rc = r->fam->build(r, slot);
  if (rc != 0) return rc;
  s = &r->slots[slot];
  s->nv = r->nv - s->v0;
  return slot;
}

int64_t *cn__run_idx(cn_run *r, int64_t n) {
  if (r->idx_used + n > r->idx_cap) abort(); /* planned in cn_run_exec */
  int64_t *p = r->idx_host + r->idx_used;
  r->idx_used += n;
  return p;
}

int64_t *cn__inputs_off(cn_run *r, const int32_t *verts, int n, int which) {
  int64_t *off = cn__run_idx(r, n);
  for (int i = 0; i < n; i++) {
    int k;
    const int32_t *in = cn__run_inputs(r, verts[i], &k);
    off[i] = which < k ? r->state_off[in[which]] : -1;
  }
  return off;
}

int64_t *cn__verts_off(cn_run *r, const int32_t *verts, int n, int64_t add) {
  int64_t *off = cn__run_idx(r, n);
  for (int i = 0; i < n; i++) off[i] = r->state_off[verts[i]] + add;
  return off;
}

int64_t *cn__aux_off(cn_run *r, const int32_t *verts, int n, int64_t stride) {
  int64_t *off = cn__run_idx(r, n);
  for (int i = 0; i < n; i++) off[i] = (int64_t)r->vaux[verts[i]] * stride;
  return off;
}

bool cn__rows_even(const int64_t *idx, int n, int width, int *stride) {
  if (n < 1 || idx[0] < 0) return false;
  int64_t s = n > 1 ? idx[1] - idx[0] : width;
  if (s < width || s > INT32_MAX) return false;
  for (int i = 1; i < n; i++)
    if (idx[i] - idx[i - 1] != s) return false;
  *stride = (int)s;
  return true;
}

const float *cn__run_rows(cn_run *r, float *dst, int ldd, const float *base,
                          const int64_t *idx, int n, int width, int *ld) {
  /* Evenly spaced rows: read them in place (the common case once a
   * batch's inputs are a previous batch's consecutive outputs). */
  if (cn__rows_even(idx, n, width, ld)) return base + idx[0];
  CN_BK(r->bk, gather, dst, ldd, base, idx, n, width);
  r->gather_bytes += (size_t)n * (size_t)width * sizeof(float);
  *ld = ldd;
  return dst;
}

const float *cn__run_state_host_at(const cn_run *r, int32_t v, int col) {
  if (r->bk->vt->host_memory) return r->arena + r->state_off[v] + col;
  /* the spans are sorted by vertex, one per vertex */
  int64_t lo = 0, hi = r->n_spans;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (r->spans[mid].v < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (r->host == NULL || lo == r->n_spans || r->spans[lo].v != v ||
      col < r->spans[lo].lo || col >= r->spans[lo].hi)
    return NULL; /* not named by the family's reads(): its bug */
  return r->host + r->spans[lo].at + (col - r->spans[lo].lo);
}

void cn__run_need(cn_run *r, int32_t v, int col, int width) {
  if (width <= 0 || v < 0 || v >= r->nv) return;
  if (r->n_spans == r->cap_spans) {
    int64_t c = r->cap_spans ? 2 * r->cap_spans : 256;
    cn_run_span *p = cn__xrealloc(r->spans, (size_t)c, sizeof(*p));
    if (p == NULL) {
      r->need_failed = true;
      return;
    }
    r->spans = p;
    r->cap_spans = c;
  }
  r->spans[r->n_spans++] = (cn_run_span){v, col, col + width, 0};
}

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

/* Sizes the arena from the plan: the state rows, placed by liveness
 * (run_arena.c) or, without reuse, one buffer per type holding exactly
 * its vertices; then the scratch the largest batch needs. */
static int plan_arena(cn_run *r, cn_err *err) {
  const cn_family *f = r->fam;
  int64_t off = 0, scratch = 0, idx = 0;
  for (int t = 0; t < f->n_types; t++) {
    r->state_floats[t] = f->state_floats(r->m, t);
    r->type_base[t] = off;
    off += r->n_of_type[t] * r->state_floats[t];
    off = (off + 15) & ~(int64_t)15; /* 64-byte aligned buffers */
  }
  r->state_floats_total = off;
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
  r->state_off = malloc((size_t)(r->nv + 1) * sizeof(int64_t));
  if (r->state_off == NULL)
    return cn_err_set(err, CN_E_NOMEM, "no memory to plan a run of %lld "
                      "vertices", (long long)r->nv);
  r->reused = false;
  uint8_t *keep = r->reuse ? rows_read_after(r) : NULL;
  if (keep != NULL) {
    int64_t states;
    int rc = cn__run_plan_live(r, keep, &states);
    free(keep);
    if (rc != 0)
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
  r->arena = r->bk->vt->alloc(r->bk, (size_t)r->arena_floats * sizeof(float));
  r->scratch = r->arena ? r->arena + r->scratch_off : NULL;
  r->idx_host = malloc((size_t)(idx + 1) * sizeof(int64_t));
  r->idx_cap = idx + 1;
  if (r->arena == NULL || r->idx_host == NULL)
    return cn_err_set(err, CN_E_NOMEM,
                      "run arena of %lld bytes could not be allocated",
                      (long long)r->arena_floats * 4);
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
    if (r->poison) cn__run_poison(r, b);
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


void cn__run_exec_batch(cn_run *r, int type, const int32_t *verts, int n) {
  const cn_cell *c = cn__model_cell(r->m, r->layout, type);
  if (c != NULL)
    cn__cell_exec(r, c, verts, n);
  else
    r->fam->exec(r, type, verts, n);
}

void cn__run_batch_needs(const cn_run *r, int type, int64_t n, int64_t edges,
                         int64_t *scratch, int64_t *idx) {
  *scratch = r->fam->scratch_floats(r->m, type, n, edges);
  *idx = 4 * n + 2 * edges + 1;
  const cn_cell *c = cn__model_cell(r->m, r->layout, type);
  if (c == NULL) return;
  int64_t s = cn__cell_scratch_floats(c, n), i = cn__cell_idx(c, n, edges);
  if (s > *scratch) *scratch = s;
  if (i > *idx) *idx = i;
}

void cn_run_set_layout(cn_run *r, cn_layout layout) {
  if ((int)layout >= 0 && layout < CN_LAYOUT__COUNT) r->layout = layout;
}

void cn_run_set_plan_width(cn_run *r, int width) {
  r->plan_width = width < 1 ? 1 : width;
}

void cn_run_set_arena_reuse(cn_run *r, int reuse) { r->reuse = reuse != 0; }

void cn_run_set_poison(cn_run *r, int poison) { r->poison = poison != 0; }

static const char *const layout_names[CN_LAYOUT__COUNT] = {"fused", "naive",
                                                           "pq"};

const char *cn_layout_name(cn_layout l) {
  return (int)l >= 0 && l < CN_LAYOUT__COUNT ? layout_names[l] : "?";
}

int cn_layout_parse(const char *name, cn_layout *out) {
  for (int i = 0; i < CN_LAYOUT__COUNT; i++)
    if (strcmp(name, layout_names[i]) == 0) {
      *out = (cn_layout)i;
      return 0;
    }
  return CN_E_BAD_CONFIG;
}

void cn__run_bind_weights(cn_run *r) {
  if (r->bk->vt->run_begins != NULL) r->bk->vt->run_begins(r->bk, r->m->uid);
  for (int i = 0; i < r->m->n_tensors; i++)
    r->wb[i] = r->bk->vt->weights(r->bk, r->m->w[i]->data,
                                  (size_t)r->m->w[i]->numel);
}

static int backend_status(cn_run *r, cn_err *err) {
  return r->bk->vt->status != NULL ? r->bk->vt->status(r->bk, err) : 0;
}

static int span_cmp(const void *a, const void *b) {
  const cn_run_span *x = a, *y = b;
  return (x->v > y->v) - (x->v < y->v);
}

/* Device backends (issue #33): the answers read a few rows of the run's
 * states (root logits, requested hidden vectors, CRF emissions), so only
 * those come back: the family's reads() names them, they are sorted and
 * merged per vertex, and the backend gathers them on the device into its
 * own host buffer in one transfer with one wait. No host memory of the
 * arena's size, and nothing else crosses the bus. */
int cn__run_copy_back(cn_run *r, const int *slots, int n, cn_err *err) {
  int rc = backend_status(r, err);
  if (rc != 0 || r->bk->vt->host_memory) return rc;
  cn_backend_ctx *bk = r->bk;
  r->host = NULL;
  r->n_spans = 0;
  r->need_failed = false;
  int count = slots != NULL ? n : r->n_slots;
  for (int i = 0; i < count; i++) {
    int s = slots != NULL ? slots[i] : i;
    if (s >= 0 && s < r->n_slots) r->fam->reads(r, s);
  }
  if (r->need_failed)
    return cn_err_set(err, CN_E_NOMEM, "no memory for the run's results");
  if (r->n_spans > 1)
    qsort(r->spans, (size_t)r->n_spans, sizeof(cn_run_span), span_cmp);
  int64_t k = 0;
  for (int64_t i = 0; i < r->n_spans; i++) {
    cn_run_span sp = r->spans[i];
    if (k > 0 && r->spans[k - 1].v == sp.v) { /* one span per vertex */
      cn_run_span *q = &r->spans[k - 1];
      if (sp.lo < q->lo) q->lo = sp.lo;
      if (sp.hi > q->hi) q->hi = sp.hi;
      continue;
    }
    r->spans[k++] = sp;
  }
  r->n_spans = k;
  if (k > INT32_MAX / 2)
    return cn_err_set(err, CN_E_TOO_LARGE, "too many result rows (%lld)",
                      (long long)k);
  if (2 * k > r->cap_fetch) {
    int64_t *p = cn__xrealloc(r->fetch_idx, (size_t)(2 * k), sizeof(int64_t));
    if (p == NULL)
      return cn_err_set(err, CN_E_NOMEM, "no memory for the run's results");
    r->fetch_idx = p;
    r->cap_fetch = 2 * k;
  }
  int64_t *off = r->fetch_idx, *len = r->fetch_idx + k, at = 0;
  for (int64_t i = 0; i < k; i++) {
    cn_run_span *sp = &r->spans[i];
    off[i] = r->state_off[sp->v] + sp->lo;
    len[i] = sp->hi - sp->lo;
    sp->at = at;
    at += len[i];
  }
  const float *h = bk->vt->fetch_rows(bk, r->arena, off, len, (int)k);
  rc = backend_status(r, err);
  if (rc == 0 && h == NULL)
    rc = cn_err_set(err, CN_E_BACKEND, "backend '%s' could not copy the "
                    "run's results back", bk->vt->name);
  if (rc == 0) r->host = h;
  return rc;
}

json_t *cn_run_output(const cn_run *r, int slot) {
  if (slot < 0 || slot >= r->n_slots || !r->executed) return NULL;
  return r->fam->output(r, slot);
}

/* The first null under v (an output holds null only for a non-finite
 * value): true, with its field's path in path ("nodes[3].logits"). */
static bool find_null(const json_t *v, char *path, size_t at, size_t cap) {
  if (json_is_object(v)) {
    const char *k;
    const json_t *e;
    json_object_foreach((json_t *)v, k, e) {
      int n = snprintf(path + at, cap - at, "%s%s", at ? "." : "", k);
      size_t next = n < 0 ? at : at + (size_t)n;
      if (next >= cap) next = cap - 1;
      if (json_is_null(e) || find_null(e, path, next, cap)) return true;
      path[at] = '\0';
    }
    return false;
  }
  if (json_is_array(v)) {
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
      if (json_is_null(e)) return true; /* a number of this array's */
      if (!json_is_object(e) && !json_is_array(e)) continue;
      int n = snprintf(path + at, cap - at, "[%zu]", i);
      size_t next = n < 0 ? at : at + (size_t)n;
      if (next >= cap) next = cap - 1;
      if (find_null(e, path, next, cap)) {
        /* a row of numbers ("logits" per token): name the array itself */
        if (json_is_array(e)) path[at] = '\0';
        return true;
      }
      path[at] = '\0';
    }
  }
  return false;
}

int cn_output_check(const json_t *o, cn_err *err) {
  char path[128] = "";
  if (o == NULL || !find_null(o, path, 0, sizeof(path))) return 0;
  return cn_err_set(err, CN_E_NON_FINITE, "the model computed a non-finite "
                    "value (NaN or infinity) for '%s'; JSON cannot hold it "
                    "(the weights or this input overflow)", path);
}

void cn_run_get_stats(const cn_run *r, cn_run_stats *s) {
  memset(s, 0, sizeof(*s));
  s->instances = r->n_slots;
  s->vertices = r->nv;
  s->batches = r->n_batches;
  s->lower_bound = r->lower_bound;
  s->arena_bytes = (size_t)r->arena_floats * sizeof(float);
  /* the state region: the live high-water mark of a planned run (all the
   * states without reuse, and for a growing graph) */
  s->state_bytes = (size_t)r->scratch_off * sizeof(float);
  s->state_bytes_total = (size_t)(r->state_floats_total > 0
                                      ? r->state_floats_total
                                      : r->scratch_off) * sizeof(float);
  s->gather_bytes = r->gather_bytes;
  s->cell_bytes = r->cell_bytes;
  s->kernels = r->kernels;
  s->device_syncs = r->ctr.syncs;
  s->bytes_to_device = r->ctr.bytes_to_device;
  s->bytes_to_host = r->ctr.bytes_to_host;
  s->device_allocs = r->ctr.allocs;
  s->launches = r->ctr.launches;
}
