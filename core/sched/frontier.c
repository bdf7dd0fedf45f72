/* frontier.c - the frontier of a typed DAG, one batch at a time.
 *
 * ED-Batch Alg. 1: while the graph is not empty, a policy names the next
 * type (line 3), every ready vertex of that type forms the batch (line 4),
 * the batch runs (line 5) and the frontier is updated (line 6). This file
 * is that loop's state, shared by the static plans (sched.c), FSM training
 * (fsm_train.c) and a dynamic executor that adds vertices while it runs
 * (lstm-nmt decoding): everything here looks at the frontier, never at the
 * future. Line 3, the policy's pick, is frontier_policy.c's: it sits above
 * this file, lookahead2 (frontier_lookahead2.c) and the FSM (fsm.c), which all
 * read the frontier, so none of them calls back into a file that calls it.
 *
 * Besides the ready counts |Frontier_t(G)|, the frontier can keep
 * |Frontier(G^t)| (ED-Batch §2.3): the type-t vertices left with no type-t
 * vertex left among their ancestors, i.e. those a type-t batch could run
 * before any other type-t batch. The ratio of the two is eq. 1's second
 * term and the sufficient condition of Lemma 1 / §5.3. Kept incrementally:
 * sub[t][v] counts v's inputs p with "a type-t vertex left at or above p"
 * (one int32 row per type; a DAG added at once keeps them a byte per
 * type in one word per vertex, sub0, until a row is needed);
 * committing a type-t vertex clears that flag for it, and a zero count
 * clears it for a non-t consumer in turn. Each (vertex, type) flag clears at
 * most once, so a whole schedule costs O((V + E)·T).
 */
#include <stdlib.h>
#include <string.h>

#include "sched/frontier_impl.h"

static int grow32(int32_t **p, size_t n) {
  int32_t *q = cn__xrealloc(*p, n, sizeof(int32_t));
  if (q == NULL) return -1;
  *p = q;
  return 0;
}

/* The instances and lookahead2's scratch (find_instances). */
static void free_instances(cn_frontier *f) {
  free(f->comp);
  free(f->cm);
  for (int t = 0; t < CN_MAX_TYPES; t++) {
    free(f->cin[t]);
    f->cin[t] = NULL;
    f->cin_n[t] = 0;
  }
  free(f->cin_on);
  f->cin_on = NULL;
  free(f->cm1);
  free(f->cb);
  free(f->cx);
  free(f->cs);
  free(f->ca);
  f->cx = f->cs = NULL;
  f->ca = NULL;
  free(f->clist);
  free(f->cmark);
  free(f->seen2);
  free(f->n1);
  f->comp = f->cm = f->cm1 = f->cb = f->clist = f->seen2 = f->n1 = NULL;
  f->cmark = NULL;
}

int cn__frontier_init(cn_frontier *f, int n_types, bool track_sub) {
  memset(f, 0, sizeof(*f));
  if (n_types < 1 || n_types > CN_MAX_TYPES) return CN_E_INTERNAL;
  f->n_types = n_types;
  f->track_sub = track_sub;
  f->in_start = malloc(sizeof(int32_t));
  if (f->in_start == NULL) return CN_E_NOMEM;
  f->in_start[0] = 0;
  return 0;
}

void cn__frontier_free(cn_frontier *f) {
  if (!f->borrowed) {
    free(f->vtype);
    free(f->in_start);
    free(f->in_edges);
  }
  free(f->done);
  free(f->depth);
  free(f->pending);
  free(f->out_head);
  free(f->out_tail);
  free(f->e_next);
  free(f->e_dst);
  free(f->sub);
  free(f->sub0);
  free(f->stack);
  free(f->tail);
  free(f->seen_in);
  free_instances(f);
  for (int t = 0; t < CN_MAX_TYPES; t++) {
    free(f->q[t]);
    free(f->qc[t]);
  }
  memset(f, 0, sizeof(*f));
}

/* "A type-t vertex is left at or above p" (see the file comment). */
static inline bool above(const cn_frontier *f, int32_t p, int t) {
  return !f->done[p] &&
         (f->vtype[p] == t || f->sub[(size_t)t * f->cap_v + p] > 0);
}

static void clear_instances(cn_frontier *f, int t);

/* Look-ahead upkeep of a vertex that became ready (with tails). */
static int note_ready(cn_frontier *f, int32_t v) {
  int t = f->vtype[v];
  fold_tail(f, f->mt[t], v);
  if (f->cm != NULL) { /* the same per instance, for lookahead2 */
    int T = f->n_types;
    int32_t c = f->comp[v];
    fold_tail(f, f->cm + ((size_t)c * T + t) * T, v);
    if (!f->cin_on[(size_t)c * T + t]) {
      f->cin_on[(size_t)c * T + t] = 1;
      f->cin[t][f->cin_n[t]++] = c;
    }
  }
  if (f->out_head[v] < 0) return 0; /* a sink readies nothing */
  if (f->qc_n[t] == f->qc_cap[t]) {
    int64_t c = f->qc_cap[t] ? f->qc_cap[t] * 2 : 64;
    if (grow32(&f->qc[t], (size_t)c)) return -1;
    f->qc_cap[t] = c;
  }
  f->qc[t][f->qc_n[t]++] = v;
  return 0;
}

/* Doubles type t's ready queue: off the path of a push (the queues of a
 * DAG added at once are sized to it, reserve_queues). */
__attribute__((noinline, cold)) static int grow_queue(cn_frontier *f, int t) {
  int64_t c = f->qcap[t] ? f->qcap[t] * 2 : 64;
  if (grow32(&f->q[t], (size_t)c)) return -1;
  f->qcap[t] = c;
  return 0;
}

static inline int push_ready(cn_frontier *f, int32_t v) {
  int t = f->vtype[v];
  if (f->qtail[t] == f->qcap[t] && grow_queue(f, t)) return -1;
  f->q[t][f->qtail[t]++] = v;
  f->n_ready[t]++;
  return f->tail != NULL ? note_ready(f, v) : 0;
}

/* Writes the rows of sub named in `rows` that are still lazy (sub_lazy)
 * from sub0, where add_dag_fresh left them and a commit over ranges
 * counts them down in place (commit_csr): a pass a row, only where the
 * rows are needed (a vertex added, a commit over lists), instead of T
 * stores a vertex while the DAG is added. */
/* Byte t of sub0[v] in memory, where a commit counts it down in place. */
static inline uint8_t *sub0_lane(const cn_frontier *f, int t) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return (uint8_t *)f->sub0 + (7 - t);
#else
  return (uint8_t *)f->sub0 + t;
#endif
}

static void sub_rows(cn_frontier *f, uint32_t rows) {
  rows &= f->sub_lazy;
  for (int t = 0; rows != 0; t++, rows >>= 1) {
    if (!(rows & 1)) continue;
    int32_t *row = f->sub + (size_t)t * f->cap_v, nv = f->nv;
    const uint64_t *s0 = f->sub0;
    const int sh = 8 * t;
    for (int32_t v = 0; v < nv; v++) row[v] = (int32_t)(s0[v] >> sh & 255);
    f->sub_lazy &= ~(1u << t);
  }
}

/* Per-vertex state of v from its inputs, as if added now. */
static int settle(cn_frontier *f, int32_t v) {
  int T = f->n_types, t = f->vtype[v];
  int32_t d = -1, pend = 0, sv[CN_MAX_TYPES] = {0};
  for (int32_t i = f->in_start[v]; i < f->in_start[v + 1]; i++) {
    int32_t p = f->in_edges[i];
    if (f->depth[p] > d) d = f->depth[p];
    if (!f->done[p]) pend++;
    if (f->track_sub)
      for (int a = 0; a < T; a++) sv[a] += above(f, p, a);
  }
  f->depth[v] = d + 1;
  f->pending[v] = pend;
  f->done[v] = 0;
  if (f->track_sub) {
    for (int a = 0; a < T; a++) f->sub[(size_t)a * f->cap_v + v] = sv[a];
    if (sv[t] == 0) f->n_sub[t]++;
  }
  if (pend == 0 && push_ready(f, v)) return CN_E_NOMEM;
  return 0;
}

/* Room for c vertices (c > cap_v) in every per-vertex array. */
static int reserve_v(cn_frontier *f, size_t c) {
  int T = f->n_types;
  if (c > INT32_MAX / 2) return CN_E_NOMEM;
  uint8_t *vt = cn__xrealloc(f->vtype, c, 1);
  if (vt == NULL) return CN_E_NOMEM;
  f->vtype = vt;
  uint8_t *dn = cn__xrealloc(f->done, c, 1);
  if (dn == NULL) return CN_E_NOMEM;
  f->done = dn;
  if (grow32(&f->depth, c) || grow32(&f->pending, c) ||
      grow32(&f->in_start, c + 1) || grow32(&f->out_head, c + 1) ||
      grow32(&f->out_tail, c) || grow32(&f->stack, c) ||
      (f->comp != NULL && grow32(&f->comp, c)))
    return CN_E_NOMEM;
  if (f->track_sub) { /* one row per type: each row moves to its place;
                        a vertex's entries are written when it is added */
    sub_rows(f, ~0u);
    int32_t *ns = cn__xrealloc(NULL, c * (size_t)T, sizeof(int32_t));
    if (ns == NULL) return CN_E_NOMEM;
    for (int t = 0; t < T && f->sub != NULL; t++)
      memcpy(ns + (size_t)t * c, f->sub + (size_t)t * f->cap_v,
             (size_t)f->nv * sizeof(int32_t));
    free(f->sub);
    f->sub = ns;
  }
  if (f->seen_in != NULL) {
    if (grow32(&f->seen_in, c + 1)) return CN_E_NOMEM;
    memset(f->seen_in + f->cap_v + 1, 0,
           (c - (size_t)f->cap_v) * sizeof(int32_t));
  }
  if (f->seen2 != NULL) {
    if (grow32(&f->seen2, c + 1) || grow32(&f->n1, c + 1))
      return CN_E_NOMEM;
    memset(f->seen2 + f->cap_v + 1, 0,
           (c - (size_t)f->cap_v) * sizeof(int32_t));
  }
  f->cap_v = (int32_t)c;
  return 0;
}

/* Room for c edges (c > cap_e). */
static int reserve_e(cn_frontier *f, size_t c) {
  if (c > INT32_MAX / 2) return CN_E_NOMEM;
  if (grow32(&f->in_edges, c) || grow32(&f->e_next, c) ||
      grow32(&f->e_dst, c))
    return CN_E_NOMEM;
  f->cap_e = (int32_t)c;
  return 0;
}

/* Turns consumer ranges (f->csr: v's at e_dst[out_head[v] ..
 * out_head[v + 1])) into the lists every other reader walks (out_head,
 * out_tail, e_next): the same consumers in the same order; and marks
 * the vertices committed so far done. Once, before the first vertex is
 * added to a frontier added at once, or its tails are computed. */
static void link_consumers(cn_frontier *f) {
  if (!f->csr) return;
  /* done[]: the vertices the queues have handed out (a commit over
   * ranges does not mark them; see cn__frontier_commit) */
  memset(f->done, 0, (size_t)f->nv);
  for (int t = 0; t < f->n_types; t++)
    for (int64_t i = 0; i < f->qhead[t]; i++) f->done[f->q[t][i]] = 1;
  int32_t s = f->nv > 0 ? f->out_head[0] : 0;
  for (int32_t v = 0; v < f->nv; v++) {
    int32_t e = f->out_head[v + 1]; /* still a start: v + 1 is not linked */
    f->out_head[v] = s < e ? s : -1;
    f->out_tail[v] = s < e ? e - 1 : -1;
    for (int32_t k = s; k < e; k++) f->e_next[k] = k + 1 < e ? k + 1 : -1;
    s = e;
  }
  f->csr = false;
}

int32_t cn__frontier_add(cn_frontier *f, int type, const int32_t *inputs,
                         int n_inputs) {
  int T = f->n_types;
  int32_t v = f->nv;
  if (type < 0 || type >= T || n_inputs < 0 || f->borrowed)
    return CN_E_INTERNAL;
  for (int i = 0; i < n_inputs; i++)
    if (inputs[i] < 0 || inputs[i] >= v) return CN_E_INTERNAL;
  link_consumers(f);
  sub_rows(f, ~0u);
  if (v + 1 > f->cap_v &&
      reserve_v(f, f->cap_v ? (size_t)f->cap_v * 2 : 256) != 0)
    return CN_E_NOMEM;
  if (f->ne + n_inputs > f->cap_e) {
    size_t c = f->cap_e ? (size_t)f->cap_e : 256;
    while (c < (size_t)f->ne + (size_t)n_inputs) c *= 2;
    if (reserve_e(f, c) != 0) return CN_E_NOMEM;
  }
  f->vtype[v] = (uint8_t)type;
  f->out_head[v] = f->out_tail[v] = -1;
  if (f->comp != NULL) f->comp[v] = n_inputs > 0 ? f->comp[inputs[0]] : 0;
  for (int i = 0; i < n_inputs; i++) {
    /* In-edge i of v is out-edge e of its source, appended at the tail so
     * consumers are visited in the order they were added. */
    int32_t e = f->ne + i, p = inputs[i];
    f->in_edges[e] = p;
    f->e_dst[e] = v;
    f->e_next[e] = -1;
    if (f->out_tail[p] < 0)
      f->out_head[p] = e;
    else
      f->e_next[f->out_tail[p]] = e;
    f->out_tail[p] = e;
  }
  f->ne += n_inputs;
  f->in_start[v + 1] = f->ne;
  f->nv = v + 1;
  f->n_of_type[type]++;
  int rc = settle(f, v);
  if (rc != 0) return rc;
  f->depth_sum[type] += f->depth[v];
  return v;
}

/* Lays every vertex's consumers out in one range of edge slots (f->csr),
 * in the order they were added, so that walking them reads consecutive
 * memory instead of chasing e_next across the whole edge array, and costs
 * no link per edge: cn__frontier_commit's walks (the ready counts, the
 * sub flags) were bound by those cache misses. Only for a frontier made
 * of one DAG (cn__frontier_add_dag on an empty one), whose edges were
 * added in vertex order. out_head[v + 2] holds v's consumer count on
 * entry (cnt_ready); after the prefix sums, out_head[v + 1] is v's fill
 * cursor, which ends at v's end: the start of v + 1. */
static void pack_consumers(cn_frontier *f, bool counted) {
  int32_t nv = f->nv, *os = f->out_head;
  if (!counted) {
    memset(os, 0, ((size_t)nv + 1) * sizeof(int32_t));
    for (int32_t e = 0; e < f->ne; e++) os[f->in_edges[e] + 2]++;
  }
  os[0] = os[1] = 0;
  for (int32_t v = 0; v + 2 <= nv; v++) os[v + 2] += os[v + 1];
  const int32_t *is = f->in_start, *ie = f->in_edges;
  for (int32_t v = 0; v < nv; v++) /* consumers in the order added */
    for (int32_t i = is[v]; i < is[v + 1]; i++)
      f->e_dst[os[ie[i] + 1]++] = v;
  f->csr = true;
}

/* cn__frontier_add of every vertex of g, in order, into an empty
 * frontier, in passes over arrays instead of a call per vertex: the same
 * state (depths, pending counts, sub rows, ready FIFOs in vertex order,
 * the consumers of pack_consumers) at a fraction of the cost. One pass
 * reads each vertex's inputs once for all of it and counts its inputs'
 * consumers; pack_consumers then lays the consumers out. Nothing is
 * committed yet, so every input is pending and sub[a][v] counts v's
 * inputs p with a type-a vertex at or above p: a byte each of sub0[v],
 * written out to the rows when a row is first walked (sub_rows). */
static int add_dag_fresh(cn_frontier *f, const cn_dag *g) {
  const int T = f->n_types;
  const int32_t nv = g->nv;
  const int32_t *is = g->in_start, *ie = g->in_edges;
  const uint8_t *vt = g->vtype;
  const bool track = f->track_sub;
  uint64_t *s0 = NULL;
  if (track) {
    free(f->sub0);
    f->sub0 = s0 = cn__xrealloc(NULL, (size_t)nv, sizeof(uint64_t));
    if (s0 == NULL) return CN_E_NOMEM;
  }
  if (f->borrow && ie != NULL) { /* read in place (cn_frontier.borrow) */
    free(f->vtype);
    free(f->in_start);
    free(f->in_edges);
    f->vtype = (uint8_t *)vt;
    f->in_start = (int32_t *)is;
    f->in_edges = (int32_t *)ie;
    f->borrowed = true;
  } else {
    memcpy(f->vtype, vt, (size_t)nv);
    memcpy(f->in_start, is, ((size_t)nv + 1) * sizeof(int32_t));
    if (is[nv] > 0)
      memcpy(f->in_edges, ie, (size_t)is[nv] * sizeof(int32_t));
  } /* done[]: see cn__frontier_commit */
  f->ne = is[nv];
  f->nv = nv;
  /* above(p, a) for every a at once: anc[p], the types among p and its
   * ancestors (bit a), is p's own type and its inputs' anc; sub[a][v]
   * counts v's inputs with bit a, summed a byte per type through
   * spread[] (CN_MAX_TYPES <= 8) where v has fewer than 256 inputs
   * (the rest: `wide`, counted one type at a time below). anc lives in
   * the stack, which is free until a commit. */
  uint64_t spread[256];
  for (int m = 0; m < 256; m++) {
    spread[m] = 0;
    for (int a = 0; a < 8; a++)
      if (m >> a & 1) spread[m] |= (uint64_t)1 << (8 * a);
  }
  uint8_t *anc = (uint8_t *)f->stack;
  int32_t *depth = f->depth, *pending = f->pending, *os = f->out_head;
  int64_t n_of[CN_MAX_TYPES] = {0}, dsum[CN_MAX_TYPES] = {0};
  int64_t n_sub[CN_MAX_TYPES] = {0};
  int32_t wide = 0;
  memset(os, 0, ((size_t)nv + 1) * sizeof(int32_t));
  for (int32_t v = 0; v < nv; v++) {
    unsigned t = vt[v];
    if (t >= (unsigned)T) return CN_E_INTERNAL;
    int32_t b = is[v], e = is[v + 1], d = -1;
    unsigned m = 1u << t;
    uint64_t c = 0;
    for (int32_t i = b; i < e; i++) {
      int32_t p = ie[i];
      if ((uint32_t)p >= (uint32_t)v) return CN_E_INTERNAL; /* inputs first */
      if (depth[p] > d) d = depth[p];
      m |= anc[p];
      c += spread[anc[p]];
      os[p + 2]++; /* pack_consumers' counts: p + 2 <= v + 1 <= nv */
    }
    depth[v] = d + 1;
    pending[v] = e - b;
    n_of[t]++;
    dsum[t] += d + 1;
    anc[v] = (uint8_t)m;
    if (track) {
      s0[v] = c;
      if (e - b < 256) {
        n_sub[t] += (c >> (8 * t) & 255) == 0;
      } else {
        int32_t k = 0;
        for (int32_t i = b; i < e; i++) k += anc[ie[i]] >> t & 1;
        n_sub[t] += k == 0;
        wide++;
      }
    }
    if (b == e && push_ready(f, v)) return CN_E_NOMEM; /* vertex order */
  }
  /* integer depths: the sums of the vertex-by-vertex doubles, exactly;
   * a queue holds at most its type's vertices (reserve_queues) */
  for (int t = 0; t < T; t++) {
    f->n_of_type[t] += n_of[t];
    f->depth_sum[t] += (double)dsum[t];
    f->n_sub[t] += n_sub[t];
    if (n_of[t] > f->qcap[t]) {
      if (grow32(&f->q[t], (size_t)n_of[t])) return CN_E_NOMEM;
      f->qcap[t] = n_of[t];
    }
  }
  if (track) {
    f->sub_lazy = (1u << T) - 1;
    if (wide > 0) { /* the rows now, the wide vertices' counted in full */
      sub_rows(f, ~0u);
      const size_t cap = (size_t)f->cap_v;
      for (int32_t v = 0; v < nv; v++) {
        if (is[v + 1] - is[v] < 256) continue;
        for (int a = 0; a < T; a++) {
          int32_t k = 0;
          for (int32_t i = is[v]; i < is[v + 1]; i++) k += anc[ie[i]] >> a & 1;
          f->sub[(size_t)a * cap + v] = k;
        }
      }
    }
  }
  pack_consumers(f, true);
  return 0;
}

/* Why: a run of a thousand trees pushes tens of thousands of vertices
 * through each type's ready queue, which doubled from 64 entries a dozen
 * times a type (half the run's reallocations, each copying the queue);
 * a queue's tail only grows, so the type's vertices in all are the most it
 * holds: sized once to that, as the other arrays are. Capacity only: no
 * order changes. */
static int reserve_queues(cn_frontier *f, const cn_dag *g) {
  int64_t n[CN_MAX_TYPES] = {0};
  for (int32_t v = 0; v < g->nv; v++)
    if (g->vtype[v] < CN_MAX_TYPES) n[g->vtype[v]]++;
  for (int t = 0; t < f->n_types; t++) {
    int64_t c = f->qtail[t] + n[t];
    if (c <= f->qcap[t]) continue;
    if (grow32(&f->q[t], (size_t)c)) return -1;
    f->qcap[t] = c;
  }
  return 0;
}

int cn__frontier_add_dag(cn_frontier *f, const cn_dag *g) {
  bool fresh = f->nv == 0;
  if (f->borrowed) return CN_E_INTERNAL; /* nothing can be added */
  /* every array sized once, not doubled vertex by vertex */
  if ((size_t)f->nv + (size_t)g->nv > (size_t)f->cap_v &&
      reserve_v(f, (size_t)f->nv + (size_t)g->nv) != 0)
    return CN_E_NOMEM;
  if ((size_t)f->ne + (size_t)g->in_start[g->nv] > (size_t)f->cap_e &&
      reserve_e(f, (size_t)f->ne + (size_t)g->in_start[g->nv]) != 0)
    return CN_E_NOMEM;
  if (fresh && g->nv > 0 && f->comp == NULL && f->tail == NULL)
    return add_dag_fresh(f, g); /* sizes the queues from its type counts */
  if (reserve_queues(f, g) != 0) return CN_E_NOMEM;
  for (int32_t v = 0; v < g->nv; v++) {
    int32_t b = g->in_start[v];
    /* a DAG without edges may have no edge array: no offset on NULL */
    int32_t w = cn__frontier_add(f, g->vtype[v],
                                 g->in_edges != NULL ? g->in_edges + b : NULL,
                                 g->in_start[v + 1] - b);
    if (w < 0) return w;
  }
  if (fresh && f->nv > 0) { /* laid out, and lists for the tails' readers */
    pack_consumers(f, false);
    link_consumers(f);
  }
  return 0;
}

int cn__frontier_reset(cn_frontier *f) {
  memset(f->n_ready, 0, sizeof(f->n_ready));
  memset(f->n_sub, 0, sizeof(f->n_sub));
  memset(f->qhead, 0, sizeof(f->qhead));
  memset(f->qtail, 0, sizeof(f->qtail));
  memset(f->qc_n, 0, sizeof(f->qc_n));
  memset(f->mt, 0, sizeof(f->mt));
  for (int t = 0; f->cm != NULL && t < f->n_types; t++) clear_instances(f, t);
  f->n_done = 0;
  f->sub_lazy = 0; /* settle writes every row, inputs first */
  for (int32_t v = 0; v < f->nv; v++) f->done[v] = 0;
  for (int32_t v = 0; v < f->nv; v++)
    if (settle(f, v)) return CN_E_NOMEM;
  return 0;
}

int cn__frontier_agenda(const cn_frontier *f) {
  int best = -1;
  double best_avg = 0;
  for (int t = 0; t < f->n_types; t++) {
    if (f->n_ready[t] == 0) continue;
    double avg = f->depth_sum[t] / (double)f->n_of_type[t];
    if (best < 0 || avg < best_avg) {
      best = t;
      best_avg = avg;
    }
  }
  return best;
}

double cn__frontier_ratio(const cn_frontier *f, int t) {
  if (!f->track_sub || f->n_ready[t] == 0 || f->n_sub[t] == 0) return 0.0;
  return (double)f->n_ready[t] / (double)f->n_sub[t];
}

/* The ready type whose batch lowers the bound on what is left the most;
 * ties: the smaller batch (it leaves the larger ones to grow), then the
 * agenda's order. Without tails: agenda. */
int cn__frontier_next_lookahead(const cn_frontier *f) {
  if (f->tail == NULL) return cn__frontier_agenda(f);
  int64_t drop[CN_MAX_TYPES];
  cn__frontier_drops(f, drop);
  int best = -1;
  double bavg = 0;
  for (int t = 0; t < f->n_types; t++) {
    if (f->n_ready[t] == 0) continue;
    double avg = f->depth_sum[t] / (double)f->n_of_type[t];
    if (best < 0 || drop[t] > drop[best] ||
        (drop[t] == drop[best] &&
         (f->n_ready[t] < f->n_ready[best] ||
          (f->n_ready[t] == f->n_ready[best] && avg < bavg)))) {
      best = t;
      bavg = avg;
    }
  }
  return best;
}

/* Every ready type-t vertex was committed: no instance has one now. */
static void clear_instances(cn_frontier *f, int t) {
  int T = f->n_types;
  for (int32_t k = 0; k < f->cin_n[t]; k++) {
    int32_t c = f->cin[t][k];
    f->cin_on[(size_t)c * T + t] = 0;
    memset(f->cm + ((size_t)c * T + t) * T, 0, (size_t)T * sizeof(int32_t));
  }
  f->cin_n[t] = 0;
}

/* How far ahead in a batch the commit walk asks for the lines it will
 * read (prefetch_ahead), in vertices: each stage's loads have landed by
 * the time the next stage needs them. */
#define AHEAD_HEAD 12
#define AHEAD_EDGE 8
#define AHEAD_DST 4

/* A batch takes one vertex from each of the run's instances, so
 * every vertex the commit walk sits on its own cache lines of each
 * per-vertex array, and the walk is a chain of dependent misses (the
 * vertex's first out-edge, its consumer, the consumer's counts). The
 * batch is known in full before the walk starts, so the lines of the
 * vertices a few places ahead are requested while this one is walked:
 * the first out-edge of out[i + AHEAD_HEAD], the first consumer of
 * out[i + AHEAD_EDGE] (whose first out-edge has arrived by then), and
 * that consumer's counts for out[i + AHEAD_DST]. A prefetch reads
 * nothing it changes, so the walk and its results are the same. Inlined
 * early on purpose: a call of a function made only of prefetches counts
 * as free of side effects and is dropped. Consumer ranges (f->csr): a
 * vertex without consumers has an empty range, whose first slot is
 * another vertex's or the end of the array, so it is only prefetched,
 * never read. */
__attribute__((always_inline)) static inline void
prefetch_ahead(const cn_frontier *f, const int32_t *st, const int32_t *out,
               int32_t i, int32_t n) {
  if (i + AHEAD_HEAD < n)
    __builtin_prefetch(&f->out_head[out[i + AHEAD_HEAD]]);
  if (i + AHEAD_EDGE < n) {
    int32_t k = f->out_head[out[i + AHEAD_EDGE]];
    if (k >= 0) {
      __builtin_prefetch(&f->e_dst[k]);
      if (!f->csr) __builtin_prefetch(&f->e_next[k]);
    }
  }
  if (i + AHEAD_DST < n) {
    int32_t v = out[i + AHEAD_DST], k = f->out_head[v];
    if (k >= 0 && (!f->csr || k < f->out_head[v + 1])) {
      int32_t w = f->e_dst[k];
      __builtin_prefetch(&f->pending[w], 1);
      if (st != NULL) __builtin_prefetch(&st[w], 1);
    }
  }
}

/* prefetch_ahead over consumer ranges, where most of a batch has a full
 * AHEAD_HEAD vertices after it: one test for those, and no list links.
 * A range's first slot may be the end of e_dst (a vertex without
 * consumers at the end): a prefetch there reads nothing. */
__attribute__((always_inline)) static inline void
prefetch_csr(const cn_frontier *f, const int32_t *st, const uint8_t *sb,
             const int32_t *out, int32_t i, int32_t n) {
  const int32_t *os = f->out_head, *dst = f->e_dst;
  if (i + AHEAD_HEAD >= n) {
    prefetch_ahead(f, st, out, i, n);
    return;
  }
  __builtin_prefetch(&os[out[i + AHEAD_HEAD]]);
  __builtin_prefetch(&dst[os[out[i + AHEAD_EDGE]]]);
  int32_t v = out[i + AHEAD_DST], k = os[v];
  if (k < os[v + 1]) {
    int32_t w = dst[k];
    __builtin_prefetch(&f->pending[w], 1);
    if (st != NULL) __builtin_prefetch(&st[w], 1);
    if (sb != NULL) __builtin_prefetch(&sb[(size_t)w * 8], 1);
  }
}

/* The commit walk over consumer ranges (f->csr, so no tails and no lists
 * to follow): cn__frontier_commit's walk, edge for edge, with the ready
 * counts left to the caller (qtail - qhead) instead of counted per
 * push. The counts "a type-t vertex left at or above" of w are st[w]
 * (a written row) or, while the row is lazy, byte t of sub0[w] (sb[8w]),
 * counted down where add_dag_fresh left it: inlined once for each. */
__attribute__((always_inline)) static inline void
commit_csr_walk(cn_frontier *f, int t, const int32_t *out, int32_t n,
                int32_t *st, uint8_t *sb) {
  const int32_t *os = f->out_head, *dst = f->e_dst;
  const uint8_t *vt = f->vtype;
  int32_t *pending = f->pending, *stack = f->stack;
  /* no room to check: add_dag_fresh sized each queue to its type's
   * vertices, each is pushed once (a reset starts the queues over), and
   * ranges end when a vertex is added */
#define PUSH(w)                                                          \
  do {                                                                   \
    int tw_ = vt[w];                                                     \
    f->q[tw_][f->qtail[tw_]++] = (w);                                    \
  } while (0)
#define DEC(w) (sb != NULL ? --sb[(size_t)(w) * 8] : --st[w])
  if (!f->track_sub) {
    for (int32_t i = 0; i < n; i++) {
      prefetch_csr(f, NULL, NULL, out, i, n);
      int32_t v = out[i];
      for (int32_t k = os[v]; k < os[v + 1]; k++) {
        int32_t w = dst[k];
        if (--pending[w] == 0) PUSH(w);
      }
    }
    return;
  }
  for (int32_t i = 0; i < n; i++) {
    int32_t v = out[i], sp = 0;
    prefetch_csr(f, st, sb, out, i, n);
    for (int32_t k = os[v]; k < os[v + 1]; k++) {
      int32_t w = dst[k];
      if (--pending[w] == 0) PUSH(w);
      if (DEC(w) != 0) continue;
      if (vt[w] == t)
        f->n_sub[t]++; /* w now heads G^t */
      else
        stack[sp++] = w;
    }
    while (sp > 0) { /* the flag cleared below the consumers */
      int32_t u = stack[--sp];
      for (int32_t k = os[u]; k < os[u + 1]; k++) {
        int32_t w = dst[k];
        if (DEC(w) != 0) continue;
        if (vt[w] == t)
          f->n_sub[t]++;
        else
          stack[sp++] = w;
      }
    }
  }
#undef DEC
#undef PUSH
}

static void commit_csr(cn_frontier *f, int t, const int32_t *out, int32_t n) {
  if (!f->track_sub)
    commit_csr_walk(f, t, out, n, NULL, NULL);
  else if (f->sub_lazy >> t & 1)
    commit_csr_walk(f, t, out, n, NULL, sub0_lane(f, t));
  else
    commit_csr_walk(f, t, out, n, f->sub + (size_t)t * f->cap_v, NULL);
}

int32_t cn__frontier_commit(cn_frontier *f, int t, int32_t *out) {
  if (t < 0 || t >= f->n_types) return 0;
  int64_t h = f->qhead[t], e = f->qtail[t];
  f->qhead[t] = e;
  int32_t n = (int32_t)(e - h);
  memcpy(out, f->q[t] + h, (size_t)n * sizeof(int32_t));
  /* Mark the whole batch done first: its vertices' outputs are computed
   * together, and none of them is an input of another (all were ready).
   * Only settle reads done, for a vertex added later or a reset, so over
   * ranges (f->csr) it is left to link_consumers, which the first
   * cn__frontier_add runs, and to the reset, which clears it. */
  if (!f->csr)
    for (int32_t i = 0; i < n; i++) f->done[out[i]] = 1;
  f->n_done += n;
  f->n_ready[t] -= n;
  memset(f->mt[t], 0, sizeof(f->mt[t]));
  clear_instances(f, t);
  f->qc_n[t] = 0;
  if (f->track_sub) f->n_sub[t] -= n;
  if (f->csr) {
    commit_csr(f, t, out, n);
    for (int a = 0; a < f->n_types; a++)
      f->n_ready[a] = f->qtail[a] - f->qhead[a];
    return n;
  }
  if (!f->track_sub) {
    for (int32_t i = 0; i < n; i++) {
      prefetch_ahead(f, NULL, out, i, n);
      for (int32_t k = f->out_head[out[i]]; k >= 0; k = f->e_next[k]) {
        int32_t w = f->e_dst[k];
        if (--f->pending[w] == 0 && push_ready(f, w)) return CN_E_NOMEM;
      }
    }
    return n;
  }
  sub_rows(f, 1u << t); /* lists: the row, written out if lazy */
  /* With sub: one walk over each vertex's consumers both counts their
   * inputs down and starts the walk that clears the flag "a type-t vertex left at or
   * above" for them (the rest of which follows
   * before the next vertex): each edge is read once, not twice. The
   * counts do not depend on each other, so the ready order and every
   * count are those of the two walks one after the other. */
  int32_t *st = f->sub + (size_t)t * f->cap_v;
  for (int32_t i = 0; i < n; i++) {
    int32_t v = out[i], sp = 0;
    prefetch_ahead(f, st, out, i, n);
    for (int32_t k = f->out_head[v]; k >= 0; k = f->e_next[k]) {
      int32_t w = f->e_dst[k];
      if (--f->pending[w] == 0 && push_ready(f, w)) return CN_E_NOMEM;
      if (--st[w] != 0) continue;
      if (f->vtype[w] == t)
        f->n_sub[t]++; /* w now heads G^t */
      else
        f->stack[sp++] = w;
    }
    while (sp > 0) { /* the flag cleared below the consumers */
      int32_t u = f->stack[--sp];
      for (int32_t k = f->out_head[u]; k >= 0; k = f->e_next[k]) {
        int32_t w = f->e_dst[k];
        if (--st[w] != 0) continue;
        if (f->vtype[w] == t)
          f->n_sub[t]++;
        else
          f->stack[sp++] = w;
      }
    }
  }
  return n;
}

/* ---- look-ahead: the bound on what is left ------------------------------ */

/* The run's instances: weakly connected components (union-find over the
 * edges), numbered 0.. in order of their first vertex; and the lookahead2
 * policy's per-instance scratch. */
static int find_instances(cn_frontier *f) {
  int T = f->n_types;
  free_instances(f);
  f->comp = malloc(((size_t)f->cap_v + 1) * sizeof(int32_t));
  if (f->comp == NULL) return -1;
  cn_dag g = {f->n_types, f->nv, f->vtype, f->in_start, f->in_edges};
  int32_t n = cn__dag_components(&g, f->comp);
  f->n_comp = n;
  size_t c = n > 0 ? (size_t)n : 1;
  f->cm = calloc(c * (size_t)T * (size_t)T, sizeof(int32_t));
  f->cin_on = calloc(c * (size_t)T, 1);
  for (int t = 0; t < T; t++)
    if ((f->cin[t] = malloc(c * sizeof(int32_t))) == NULL) return -1;
  f->cm1 = malloc(c * (size_t)T * (size_t)T * sizeof(int32_t));
  f->cb = malloc(c * (size_t)T * sizeof(int32_t));
  f->cx = malloc(c * (size_t)T * sizeof(int32_t));
  f->cs = malloc(c * (size_t)T * sizeof(int32_t));
  f->ca = malloc(c * (size_t)T);
  f->clist = malloc(c * sizeof(int32_t));
  f->cmark = calloc(c, 1);
  f->seen2 = calloc((size_t)f->cap_v + 1, sizeof(int32_t));
  f->n1 = malloc(((size_t)f->cap_v + 1) * sizeof(int32_t));
  return f->cm && f->cin_on && f->cm1 && f->cb && f->cx && f->cs && f->ca &&
                 f->clist && f->cmark &&
                 f->seen2 && f->n1
             ? 0
             : -1;
}

int cn__frontier_tails(cn_frontier *f) {
  int T = f->n_types;
  link_consumers(f);
  free(f->tail);
  free(f->seen_in);
  f->tail = cn__xcalloc((size_t)f->cap_v * (size_t)T, sizeof(int32_t));
  f->seen_in = cn__xcalloc((size_t)f->cap_v + 1, sizeof(int32_t));
  if (f->tail == NULL || f->seen_in == NULL) return CN_E_NOMEM;
  /* the queue of ready vertices with consumers at once at its most (a
   * vertex is ready once), as reserve_queues does for the ready queues */
  for (int t = 0; t < T; t++) {
    int64_t c = f->n_of_type[t];
    if (c <= f->qc_cap[t]) continue;
    if (grow32(&f->qc[t], (size_t)c)) return CN_E_NOMEM;
    f->qc_cap[t] = c;
  }
  f->feeds = 0;
  /* Consumers come after their inputs. */
  for (int32_t v = f->nv - 1; v >= 0; v--) {
    int32_t *tv = f->tail + (size_t)v * T;
    for (int32_t e = f->out_head[v]; e >= 0; e = f->e_next[e]) {
      const int32_t *tw = f->tail + (size_t)f->e_dst[e] * T;
      for (int t = 0; t < T; t++)
        if (tw[t] > tv[t]) tv[t] = tw[t];
    }
    tv[f->vtype[v]]++;
    if (f->out_head[v] >= 0) f->feeds |= 1u << f->vtype[v];
  }
  f->tails_nv = f->nv;
  if (find_instances(f)) return CN_E_NOMEM;
  memset(f->qc_n, 0, sizeof(f->qc_n));
  memset(f->mt, 0, sizeof(f->mt));
  for (int t = 0; t < T; t++)
    for (int64_t i = f->qhead[t]; i < f->qtail[t]; i++)
      if (note_ready(f, f->q[t][i])) return CN_E_NOMEM;
  return 0;
}

/* The consumers a batch of every ready type-t vertex makes ready (every
 * pending input in the batch), written to out; seen_in keeps the batch's
 * inputs per consumer until cn__frontier_uncount_batch(f, t). */
int32_t cn__frontier_count_batch(const cn_frontier *f, int t, int32_t *out) {
  int32_t n = 0;
  for (int64_t i = 0; i < f->qc_n[t]; i++)
    for (int32_t e = f->out_head[f->qc[t][i]]; e >= 0; e = f->e_next[e]) {
      int32_t w = f->e_dst[e];
      if (++f->seen_in[w] == f->pending[w]) out[n++] = w;
    }
  return n;
}

void cn__frontier_uncount_batch(const cn_frontier *f, int t) {
  for (int64_t i = 0; i < f->qc_n[t]; i++)
    for (int32_t e = f->out_head[f->qc[t][i]]; e >= 0; e = f->e_next[e])
      f->seen_in[f->e_dst[e]] = 0;
}

int64_t cn__frontier_drops(const cn_frontier *f, int64_t *drop) {
  int T = f->n_types;
  memset(drop, 0, (size_t)T * sizeof(int64_t));
  if (f->tail == NULL) return 0;
  /* mt[a][u]: the most type-u vertices ahead of a ready type-a vertex.
   * Every vertex left has a ready ancestor, so the bound on what is left is
   * Σ_u max_a mt[a][u]. Committing t removes mt[t] and adds the tails of
   * the consumers it makes ready. Vertices added after the tails count only
   * themselves (and readying them is seen only through inputs that had
   * consumers when they became ready). */
  int64_t now = 0;
  for (int u = 0; u < T; u++) {
    int32_t b = 0;
    for (int a = 0; a < T; a++)
      if (f->mt[a][u] > b) b = f->mt[a][u];
    now += b;
  }
  for (int t = 0; t < T; t++) {
    if (f->n_ready[t] == 0) continue;
    int32_t best[CN_MAX_TYPES] = {0};
    for (int a = 0; a < T; a++)
      if (a != t) max_into(best, f->mt[a], T);
    int32_t n = cn__frontier_count_batch(f, t, f->n1);
    for (int32_t i = 0; i < n; i++) fold_tail(f, best, f->n1[i]);
    cn__frontier_uncount_batch(f, t);
    int64_t after = 0;
    for (int u = 0; u < T; u++) after += best[u];
    drop[t] = now - after;
  }
  return now;
}
