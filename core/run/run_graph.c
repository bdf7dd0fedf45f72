/* run_graph.c - a run's vertex graph and the index staging of a batch.
 *
 * cn_run_add() appends each instance's vertices (the family's build()):
 * the graph lives in a handful of arrays grown geometrically, never one
 * allocation per vertex. While a batch is launched, its index arrays (the
 * state rows of its inputs, its embedding rows) are staged in the run's
 * index room (cn__run_idx), which the plan sized. The lowest file of run/:
 * it calls no other file of the folder.
 */
#include <stdlib.h>
#include <string.h>

#include "run/run_api.h"

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

/* The settings of a fresh run of m on bk: what cn_run_new and
 * cn_run_reset give alike. */
static void run_defaults(cn_run *r, const cn_model *m, cn_backend_ctx *bk) {
  r->m = m;
  r->fam = m->fam;
  r->bk = bk;
  r->plan_width = CN_PLAN_WIDTH_DEFAULT;
  /* memory by liveness unless CANOPY_ARENA_REUSE=0; operands read in
   * place unless CANOPY_ROWS_IN_PLACE=0; poisoning for tests
   * (docs/memory.md, docs/testing.md) */
  const char *e = getenv("CANOPY_ARENA_REUSE");
  r->reuse = e == NULL || strcmp(e, "0") != 0;
  e = getenv("CANOPY_MEMORY_ORDER");
  r->mem_order = e == NULL || strcmp(e, "0") != 0;
  e = getenv("CANOPY_ROWS_IN_PLACE");
  r->rows_in_place = e == NULL || strcmp(e, "0") != 0;
  e = getenv("CANOPY_POISON_FREED");
  r->poison = e != NULL && strcmp(e, "0") != 0 && e[0] != '\0';
}

cn_run *cn_run_new(const cn_model *m, cn_backend_ctx *bk) {
  cn_run *r = calloc(1, sizeof(*r));
  if (r == NULL) return NULL;
  run_defaults(r, m, bk);
  r->in_start = malloc(sizeof(int32_t));
  if (r->in_start == NULL) {
    free(r);
    return NULL;
  }
  r->in_start[0] = 0;
  return r;
}

/* What the run holds on its backend (its arena, a grown scratch), given
 * back; a fetch on its way is waited for first. */
static void release_backend(cn_run *r) {
  if (r->fetching) /* the device may still write into what goes now */
    (void)r->bk->vt->fetch_wait(r->bk, r->host);
  r->fetching = false;
  if (r->arena != NULL) r->bk->vt->free(r->bk, r->arena);
  if (r->own_scratch && r->scratch != NULL) r->bk->vt->free(r->bk, r->scratch);
  r->arena = r->scratch = NULL;
}

/* Every host array of the run, freed (r itself stays). */
static void release_arrays(cn_run *r) {
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
  free(r->rows_plans);
  free(r->spans);
  free(r->fetch_idx);
  free(r->out_tag);
  free(r->out_score);
  free(r->frees);
  free(r->slice_rows);
  free(r->build_room);
}

void cn_run_free(cn_run *r) {
  if (r == NULL) return;
  release_backend(r);
  release_arrays(r);
  free(r);
}

/* Bytes of the host arrays cn_run_reset may keep, by their capacities. */
static long long kept_bytes(const cn_run *r) {
  return (long long)r->cap_slots * (long long)sizeof(cn_run_slot) +
         ((long long)r->cap_v + 1) * (1 + 4 * 4) +
         (long long)r->cap_e * 4 + (long long)r->cap_nodev * 4 +
         r->cap_state_off * 8 +
         r->cap_plan * (4 + (long long)sizeof(cn_run_batch)) +
         r->cap_slice * 4 + r->cap_idx_host * 8 +
         r->cap_spans * (long long)sizeof(cn_run_span) + r->cap_fetch * 8 +
         r->cap_build_room * 4;
}

/* Why: `canopy run` and the daemon's workers run batch after batch; a
 * fresh run per batch allocated its graph and plan arrays anew each time
 * (tens of mallocs, and the first touch of every page of them, for runs
 * of a thousand instances). Kept here with their capacities, they are
 * reused until a run needs more, and freed when they hold more than
 * CN_RUN_KEEP_BYTES. Per-run results (a CRF's tags), the freed ranges and
 * everything on the backend are not kept. */
int cn_run_reset(cn_run *r, const cn_model *m, cn_backend_ctx *bk) {
  release_backend(r);
  free(r->out_tag);
  free(r->out_score);
  free(r->frees);
  r->out_tag = NULL;
  r->out_score = NULL;
  r->frees = NULL;
  if (kept_bytes(r) > CN_RUN_KEEP_BYTES) {
    release_arrays(r);
    memset(r, 0, sizeof(*r));
  }
  cn_run k = *r; /* the arrays and their capacities */
  memset(r, 0, sizeof(*r));
  r->slots = k.slots;
  r->cap_slots = k.cap_slots;
  r->vtype = k.vtype;
  r->vslot = k.vslot;
  r->vnode = k.vnode;
  r->vaux = k.vaux;
  r->in_start = k.in_start;
  r->cap_v = k.cap_v;
  r->in_edges = k.in_edges;
  r->cap_e = k.cap_e;
  r->node_vertex = k.node_vertex;
  r->cap_nodev = k.cap_nodev;
  r->state_off = k.state_off;
  r->cap_state_off = k.cap_state_off;
  r->order = k.order;
  r->batches = k.batches;
  r->cap_plan = k.cap_plan;
  r->slice_rows = k.slice_rows;
  r->cap_slice = k.cap_slice;
  r->idx_host = k.idx_host;
  r->cap_idx_host = k.cap_idx_host;
  r->rows_plans = k.rows_plans;
  r->spans = k.spans;
  r->cap_spans = k.cap_spans;
  r->fetch_idx = k.fetch_idx;
  r->cap_fetch = k.cap_fetch;
  r->build_room = k.build_room;
  r->cap_build_room = k.cap_build_room;
  run_defaults(r, m, bk);
  if (r->in_start == NULL && (r->in_start = malloc(sizeof(int32_t))) == NULL)
    return CN_E_NOMEM;
  r->in_start[0] = 0;
  return 0;
}

/* The per-vertex arrays (one capacity for all) at capacity c. */
static int vertex_room(cn_run *r, size_t c) {
  if (c > INT32_MAX / 2 || resize((void **)&r->vtype, c, 1) ||
      resize((void **)&r->vslot, c, 4) || resize((void **)&r->vnode, c, 4) ||
      resize((void **)&r->vaux, c, 4) ||
      resize((void **)&r->in_start, c + 1, 4))
    return -1;
  r->cap_v = (int32_t)c;
  return 0;
}

/* Why: a run's first chunk has no last run to size its graph arrays
 * by (cn_run_reserve), and grew them by doubling as its instances came,
 * copying each array a dozen times. When an array must grow, the slots
 * reserved for the run (cap_slots) tell how many instances are to come:
 * `used` entries for the n_slots - 1 instances added so far (and part
 * of the one being added) project to used * cap_slots / (n_slots - 1)
 * for all of them, and the array grows to that and an eighth at once
 * (doubling still). Returns what to grow to: at least `used`. */
static int64_t projected(const cn_run *r, int64_t used) {
  /* under 256 entries the instances so far are too few to go by (one
   * small tree first would leave the arrays to grow again) */
  if (used < 256 || r->n_slots < 2 || r->cap_slots <= r->n_slots)
    return used;
  int64_t p = used * r->cap_slots / (r->n_slots - 1);
  p += p / 8; /* the first instances may be smaller than the rest */
  if (p > INT32_MAX / 4) p = INT32_MAX / 4;
  return p > used ? p : used;
}

/* Why: a run of a thousand lattices grows its graph arrays from 256
 * entries by doubling, copying each array a dozen times; the caller
 * that knows the last run's size has them allocated at once. Edges are
 * reserved at two a vertex (a tree's and a lattice's are fewer) and the
 * node map at one a vertex (nodes have a vertex each). */
int cn_run_reserve(cn_run *r, int instances, long long vertices) {
  if (r->executed || instances < 0 || vertices < 0) return 0;
  if (vertices > INT32_MAX / 4) vertices = INT32_MAX / 4;
  int32_t v = (int32_t)vertices, slots = r->cap_slots;
  if ((v > r->cap_v && vertex_room(r, (size_t)v) != 0) ||
      grow((void **)&r->in_edges, &r->cap_e, 2 * v, sizeof(int32_t)) ||
      grow((void **)&r->node_vertex, &r->cap_nodev, v, sizeof(int32_t)) ||
      grow((void **)&r->slots, &slots, instances, sizeof(cn_run_slot)))
    return CN_E_NOMEM;
  r->cap_slots = slots;
  return 0;
}

int32_t cn__run_add_vertex_grow(cn_run *r, int type, int slot, int node,
                                int aux, const int32_t *inputs,
                                int n_inputs) {
  int32_t v = r->nv;
  if (v + 1 > r->cap_v) {
    /* All per-vertex arrays share one capacity, doubled when full (to
     * the instances to come, projected, at once). */
    int64_t c = r->cap_v ? (int64_t)r->cap_v * 2 : 256,
            want = projected(r, (int64_t)v + 1);
    while (c < want) c *= 2;
    if (c > INT32_MAX / 2 || vertex_room(r, (size_t)c) != 0) return -1;
  }
  if (r->ne + n_inputs > r->cap_e &&
      grow((void **)&r->in_edges, &r->cap_e,
           (int32_t)projected(r, (int64_t)r->ne + n_inputs),
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

/* Why: a build() that knows how many vertices and edges its instance
 * adds (a tree: its nodes and outputs) makes room once and writes the
 * arrays in place, instead of a room test and a possible call a vertex.
 * The arrays grow as cn__run_add_vertex_grow grows them: by doubling,
 * to the run's projected size at once. */
int cn__run_vertex_room(cn_run *r, int32_t vertices, int32_t edges) {
  int64_t nv = (int64_t)r->nv + vertices, ne = (int64_t)r->ne + edges;
  if (vertices < 0 || edges < 0 || nv > INT32_MAX / 2 || ne > INT32_MAX)
    return -1;
  if (nv > r->cap_v) {
    int64_t c = r->cap_v ? r->cap_v : 256, want = projected(r, nv);
    while (c < want) c *= 2;
    if (vertex_room(r, (size_t)c) != 0) return -1;
  }
  if (ne > r->cap_e)
    return grow((void **)&r->in_edges, &r->cap_e, (int32_t)projected(r, ne),
                sizeof(int32_t));
  return 0;
}

int32_t *cn__run_build_room(cn_run *r, int64_t n) {
  if (n <= r->cap_build_room) return r->build_room;
  int64_t c = r->cap_build_room ? r->cap_build_room : 256;
  while (c < n) c *= 2;
  int32_t *p = cn__xrealloc(r->build_room, (size_t)c, sizeof(int32_t));
  if (p == NULL) return NULL;
  r->build_room = p;
  r->cap_build_room = c;
  return p;
}

/* Reserves the node -> vertex map of a slot (n nodes, filled by build()). */
int32_t cn__run_reserve_nodes(cn_run *r, int32_t n) {
  int32_t at = r->n_nodev;
  if ((int64_t)at + n > r->cap_nodev &&
      grow((void **)&r->node_vertex, &r->cap_nodev,
           (int32_t)projected(r, (int64_t)at + n), sizeof(int32_t)))
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

bool cn__rows_even(const int64_t *idx, int n, int width, int *stride) {
  if (n < 1 || idx[0] < 0) return false;
  int64_t s = n > 1 ? idx[1] - idx[0] : width;
  if (s < width || s > INT32_MAX) return false;
  for (int i = 1; i < n; i++)
    if (idx[i] - idx[i - 1] != s) return false;
  *stride = (int)s;
  return true;
}

void cn__run_gemm_rows(cn_run *r, int M, int N, int n_parts,
                       const cn_gemm_part *parts, const float *bias,
                       float beta, float *C, int ldc, float *stage,
                       size_t *bytes) {
  cn_backend_ctx *bk = r->bk;
  if (cn__run_rows_in_place(r)) {
    CN_BK(bk, gemm_rows, M, N, n_parts, parts, bias, beta, C, ldc);
    return;
  }
  int K = 0;
  for (int q = 0; q < n_parts; q++) K += parts[q].K;
  for (int q = 0, col = 0; q < n_parts; col += parts[q++].K) {
    const cn_gemm_part *p = &parts[q];
    if (p->off != NULL) {
      CN_BK(bk, gather, stage + col, K, p->base, p->off, M, p->K);
      if (bytes != NULL) *bytes += (size_t)M * (size_t)p->K * sizeof(float);
    } else {
      CN_BK(bk, copy_rows, stage + col, K, p->base, (int)p->ld, M, p->K);
    }
  }
  CN_BK(bk, gemm, M, N, K, stage, K, parts[0].W, parts[0].ldw, bias, beta, C,
        ldc);
}

void cn_run_set_layout(cn_run *r, cn_layout layout) {
  if ((int)layout >= 0 && layout < CN_LAYOUT__COUNT) r->layout = layout;
}

void cn_run_set_plan_width(cn_run *r, int width) {
  r->plan_width = width < 1 ? 1 : width;
}

void cn_run_set_arena_reuse(cn_run *r, int reuse) { r->reuse = reuse != 0; }

void cn_run_set_poison(cn_run *r, int poison) { r->poison = poison != 0; }

void cn_run_set_memory_order(cn_run *r, int on) { r->mem_order = on != 0; }

void cn_run_set_memory_budget(cn_run *r, long long bytes) {
  r->mem_budget = bytes > 0 ? bytes : 0;
}

static const char *const layout_names[CN_LAYOUT__COUNT] = {"pq", "naive"};

const char *cn_layout_name(cn_layout l) {
  return (int)l >= 0 && l < CN_LAYOUT__COUNT ? layout_names[l] : "?";
}

int cn_layout_parse(const char *name, cn_layout *out) {
  for (int i = 0; i < CN_LAYOUT__COUNT; i++)
    if (strcmp(name, layout_names[i]) == 0) {
      *out = (cn_layout)i;
      return 0;
    }
  if (strcmp(name, "fused") == 0) { /* the old name: see canopy_core.h */
    *out = CN_LAYOUT_PQ;
    return 0;
  }
  return CN_E_BAD_CONFIG;
}
