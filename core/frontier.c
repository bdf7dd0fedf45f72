/* frontier.c - the frontier of a typed DAG, one batch at a time.
 *
 * ED-Batch Alg. 1: while the graph is not empty, a policy names the next
 * type (line 3), every ready vertex of that type forms the batch (line 4),
 * the batch runs (line 5) and the frontier is updated (line 6). This file
 * is that loop's state, shared by the static plans (sched.c), FSM training
 * (fsm.c) and a dynamic executor that adds vertices while it runs (lstm-nmt
 * decoding): everything here looks at the frontier, never at the future.
 *
 * Besides the ready counts |Frontier_t(G)|, the frontier can keep
 * |Frontier(G^t)| (ED-Batch §2.3): the type-t vertices left with no type-t
 * vertex left among their ancestors, i.e. those a type-t batch could run
 * before any other type-t batch. The ratio of the two is eq. 1's second
 * term and the sufficient condition of Lemma 1 / §5.3. Kept incrementally:
 * sub[v][t] counts v's inputs p with "a type-t vertex left at or above p";
 * committing a type-t vertex clears that flag for it, and a zero count
 * clears it for a non-t consumer in turn. Each (vertex, type) flag clears at
 * most once, so a whole schedule costs O((V + E)·T).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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
  free(f->vtype);
  free(f->done);
  free(f->depth);
  free(f->pending);
  free(f->in_start);
  free(f->in_edges);
  free(f->out_head);
  free(f->out_tail);
  free(f->e_next);
  free(f->e_dst);
  free(f->sub);
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
         (f->vtype[p] == t || f->sub[(size_t)p * f->n_types + t] > 0);
}

static inline void max_into(int32_t *best, const int32_t *tl, int T) {
  for (int t = 0; t < T; t++)
    if (tl[t] > best[t]) best[t] = tl[t];
}

/* Folds w's tail (or, added after the tails, w itself) into row. */
static inline void fold_tail(const cn_frontier *f, int32_t *row, int32_t w) {
  if (w < f->tails_nv)
    max_into(row, f->tail + (size_t)w * f->n_types, f->n_types);
  else if (row[f->vtype[w]] < 1)
    row[f->vtype[w]] = 1;
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

static int push_ready(cn_frontier *f, int32_t v) {
  int t = f->vtype[v];
  if (f->qtail[t] == f->qcap[t]) {
    int64_t c = f->qcap[t] ? f->qcap[t] * 2 : 64;
    if (grow32(&f->q[t], (size_t)c)) return -1;
    f->qcap[t] = c;
  }
  f->q[t][f->qtail[t]++] = v;
  f->n_ready[t]++;
  return f->tail != NULL ? note_ready(f, v) : 0;
}

/* Per-vertex state of v from its inputs, as if added now. */
static int settle(cn_frontier *f, int32_t v) {
  int T = f->n_types, t = f->vtype[v];
  int32_t d = -1, pend = 0;
  int32_t *sv = f->sub + (size_t)v * T;
  if (f->track_sub) memset(sv, 0, (size_t)T * sizeof(int32_t));
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
  if (f->track_sub && sv[t] == 0) f->n_sub[t]++;
  if (pend == 0 && push_ready(f, v)) return CN_E_NOMEM;
  return 0;
}

int32_t cn__frontier_add(cn_frontier *f, int type, const int32_t *inputs,
                         int n_inputs) {
  int T = f->n_types;
  int32_t v = f->nv;
  if (type < 0 || type >= T || n_inputs < 0) return CN_E_INTERNAL;
  for (int i = 0; i < n_inputs; i++)
    if (inputs[i] < 0 || inputs[i] >= v) return CN_E_INTERNAL;
  if (v + 1 > f->cap_v) {
    size_t c = f->cap_v ? (size_t)f->cap_v * 2 : 256;
    if (c > INT32_MAX / 2) return CN_E_NOMEM;
    uint8_t *vt = cn__xrealloc(f->vtype, c, 1);
    if (vt == NULL) return CN_E_NOMEM;
    f->vtype = vt;
    uint8_t *dn = cn__xrealloc(f->done, c, 1);
    if (dn == NULL) return CN_E_NOMEM;
    f->done = dn;
    if (grow32(&f->depth, c) || grow32(&f->pending, c) ||
        grow32(&f->in_start, c + 1) || grow32(&f->out_head, c) ||
        grow32(&f->out_tail, c) || grow32(&f->stack, c) ||
        (f->track_sub && grow32(&f->sub, c * (size_t)T)) ||
        (f->comp != NULL && grow32(&f->comp, c)))
      return CN_E_NOMEM;
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
  }
  if (f->ne + n_inputs > f->cap_e) {
    size_t c = f->cap_e ? (size_t)f->cap_e : 256;
    while (c < (size_t)f->ne + (size_t)n_inputs) c *= 2;
    if (c > INT32_MAX / 2) return CN_E_NOMEM;
    if (grow32(&f->in_edges, c) || grow32(&f->e_next, c) ||
        grow32(&f->e_dst, c))
      return CN_E_NOMEM;
    f->cap_e = (int32_t)c;
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

int cn__frontier_add_dag(cn_frontier *f, const cn_dag *g) {
  for (int32_t v = 0; v < g->nv; v++) {
    int32_t b = g->in_start[v];
    int32_t w = cn__frontier_add(f, g->vtype[v], g->in_edges + b,
                                 g->in_start[v + 1] - b);
    if (w < 0) return w;
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

/* ED-Batch §5.3: the ready type maximising eq. 1's ratio; ties go to the
 * agenda's order (least average depth, then lowest type). */
static int next_sufficient(const cn_frontier *f) {
  int best = -1;
  double br = -1, bavg = 0;
  for (int t = 0; t < f->n_types; t++) {
    if (f->n_ready[t] == 0) continue;
    double r = cn__frontier_ratio(f, t);
    double avg = f->depth_sum[t] / (double)f->n_of_type[t];
    if (best < 0 || r > br + 1e-12 || (r > br - 1e-12 && avg < bavg)) {
      best = t;
      br = r;
      bavg = avg;
    }
  }
  return best;
}

/* The ready type whose batch lowers the bound on what is left the most;
 * ties: the smaller batch (it leaves the larger ones to grow), then the
 * agenda's order. Without tails: agenda. */
static int next_lookahead(const cn_frontier *f) {
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

static int next_lookahead2(const cn_frontier *f); /* below, with its helpers */

bool cn__policy_needs_tails(cn_policy_kind policy, const struct cn_fsm *fsm) {
  if (policy == CN_POLICY_LOOKAHEAD || policy == CN_POLICY_LOOKAHEAD2 ||
      policy == CN_POLICY_PLAN)
    return true;
  return policy == CN_POLICY_FSM && fsm != NULL && cn__fsm_needs_tails(fsm);
}

int cn__frontier_next(const cn_frontier *f, cn_policy_kind policy,
                      const struct cn_fsm *fsm) {
  if (f->n_done == f->nv) return -1;
  switch (policy) {
    case CN_POLICY_SUFFICIENT:
      return f->track_sub ? next_sufficient(f) : cn__frontier_agenda(f);
    case CN_POLICY_LOOKAHEAD: return next_lookahead(f);
    case CN_POLICY_LOOKAHEAD2:
    case CN_POLICY_PLAN: /* a graph that grows cannot be planned ahead */
      return next_lookahead2(f);
    case CN_POLICY_FSM:
      if (fsm == NULL) return cn__frontier_agenda(f);
      /* A policy that lost to a heuristic on its sample runs that one. */
      if (cn__fsm_executes(fsm) == CN_POLICY_SUFFICIENT && f->track_sub)
        return next_sufficient(f);
      if (cn__fsm_executes(fsm) == CN_POLICY_LOOKAHEAD)
        return next_lookahead(f);
      if (cn__fsm_executes(fsm) == CN_POLICY_LOOKAHEAD2)
        return next_lookahead2(f);
      if (cn__fsm_executes(fsm) != CN_POLICY_FSM)
        return cn__frontier_agenda(f);
      return cn__fsm_choose(fsm, f);
    default: return cn__frontier_agenda(f);
  }
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

/* A type-t vertex v was committed: the flag "type t left at or above" goes
 * false for v, then for every consumer whose count drops to zero. */
static void clear_sub(cn_frontier *f, int32_t v, int t) {
  int T = f->n_types;
  int32_t sp = 0;
  f->stack[sp++] = v;
  while (sp > 0) {
    int32_t u = f->stack[--sp];
    for (int32_t e = f->out_head[u]; e >= 0; e = f->e_next[e]) {
      int32_t w = f->e_dst[e];
      if (--f->sub[(size_t)w * T + t] != 0) continue;
      if (f->vtype[w] == t)
        f->n_sub[t]++; /* w now heads G^t */
      else
        f->stack[sp++] = w; /* each w is pushed once: its count hit 0 */
    }
  }
}

int32_t cn__frontier_commit(cn_frontier *f, int t, int32_t *out) {
  if (t < 0 || t >= f->n_types) return 0;
  int64_t h = f->qhead[t], e = f->qtail[t];
  f->qhead[t] = e;
  int32_t n = 0;
  /* Mark the whole batch done first: its vertices' outputs are computed
   * together, and none of them is an input of another (all were ready). */
  for (int64_t i = h; i < e; i++) {
    int32_t v = f->q[t][i];
    f->done[v] = 1;
    out[n++] = v;
  }
  f->n_done += n;
  f->n_ready[t] -= n;
  memset(f->mt[t], 0, sizeof(f->mt[t]));
  clear_instances(f, t);
  f->qc_n[t] = 0;
  if (f->track_sub) f->n_sub[t] -= n;
  for (int32_t i = 0; i < n; i++) {
    int32_t v = out[i];
    for (int32_t k = f->out_head[v]; k >= 0; k = f->e_next[k]) {
      int32_t w = f->e_dst[k];
      if (--f->pending[w] == 0 && push_ready(f, w)) return CN_E_NOMEM;
    }
    if (f->track_sub) clear_sub(f, v, t);
  }
  return n;
}

/* ---- look-ahead: the bound on what is left ------------------------------ */
static int32_t uf_root(int32_t *up, int32_t v) {
  while (up[v] != v) v = up[v] = up[up[v]]; /* path halving */
  return v;
}

/* The run's instances: weakly connected components (union-find over the
 * edges), numbered 0.. in order of their first vertex; and the lookahead2
 * policy's per-instance scratch. */
static int find_instances(cn_frontier *f) {
  int T = f->n_types;
  free_instances(f);
  f->comp = malloc(((size_t)f->cap_v + 1) * sizeof(int32_t));
  if (f->comp == NULL) return -1;
  int32_t *up = f->comp;
  for (int32_t v = 0; v < f->nv; v++) {
    up[v] = v;
    for (int32_t i = f->in_start[v]; i < f->in_start[v + 1]; i++) {
      int32_t a = uf_root(up, f->in_edges[i]), b = uf_root(up, v);
      if (a != b) up[a > b ? a : b] = a < b ? a : b;
    }
  }
  /* A root is its component's smallest vertex (unions hang the larger
   * root under the smaller), so it is labelled before the rest: labels
   * are kept as -(label + 1) until every vertex has one. */
  for (int32_t v = 0; v < f->nv; v++) up[v] = uf_root(up, v);
  int32_t n = 0;
  for (int32_t v = 0; v < f->nv; v++)
    up[v] = up[v] == v ? -(++n) : up[up[v]];
  for (int32_t v = 0; v < f->nv; v++) up[v] = -up[v] - 1;
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
  free(f->tail);
  free(f->seen_in);
  f->tail = cn__xcalloc((size_t)f->cap_v * (size_t)T, sizeof(int32_t));
  f->seen_in = cn__xcalloc((size_t)f->cap_v + 1, sizeof(int32_t));
  if (f->tail == NULL || f->seen_in == NULL) return CN_E_NOMEM;
  memset(f->feeds, 0, sizeof(f->feeds));
  /* Consumers come after their inputs. */
  for (int32_t v = f->nv - 1; v >= 0; v--) {
    int32_t *tv = f->tail + (size_t)v * T;
    for (int32_t e = f->out_head[v]; e >= 0; e = f->e_next[e]) {
      const int32_t *tw = f->tail + (size_t)f->e_dst[e] * T;
      for (int t = 0; t < T; t++)
        if (tw[t] > tv[t]) tv[t] = tw[t];
    }
    tv[f->vtype[v]]++;
    if (f->out_head[v] >= 0) f->feeds[f->vtype[v]] = 1;
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
 * inputs per consumer until uncount_batch(f, t). */
static int32_t count_batch(const cn_frontier *f, int t, int32_t *out) {
  int32_t n = 0;
  for (int64_t i = 0; i < f->qc_n[t]; i++)
    for (int32_t e = f->out_head[f->qc[t][i]]; e >= 0; e = f->e_next[e]) {
      int32_t w = f->e_dst[e];
      if (++f->seen_in[w] == f->pending[w]) out[n++] = w;
    }
  return n;
}

static void uncount_batch(const cn_frontier *f, int t) {
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
    int32_t n = count_batch(f, t, f->n1);
    for (int32_t i = 0; i < n; i++) fold_tail(f, best, f->n1[i]);
    uncount_batch(f, t);
    int64_t after = 0;
    for (int u = 0; u < T; u++) after += best[u];
    drop[t] = now - after;
  }
  return now;
}

/* ---- lookahead2: two batches ahead, instance by instance ----------------
 * The lookahead policy's one-batch greedy fails on a type whose batch is
 * worth nothing until its consumers' batch follows (a lattice's `word`,
 * then its `link`): it leaves the second half for later while the frontier
 * moves on, and the words the next char batches make ready then need
 * another pair. This policy scores each ready type by the best state two
 * batches on (first, then any second type), then by the state one batch
 * on; ties go to the smaller batch, then to agenda.
 *
 * A state's score is the run's bound on what is left (as lookahead), then,
 * on ties, Σ_c B_c³ over the instances c (weakly connected components),
 * where B_c = Σ_t max tail_t over c's ready vertices is instance c's own
 * bound: a run is a disjoint union of instances and a batch advances each
 * on its own, so the run takes at least max_c B_c more batches, and the
 * soft maximum favours progress on the instances furthest behind, the ones
 * that will decide when the run ends. The beam search (sched_plan.c) ranks
 * its states the same way. On the training lines of ../shared/data (runs
 * of 64, outputs=all) it launches 1,147 batches for latticelstm against
 * 1,187 for lookahead (bound 988), 127 against 137 for treelstm-2type
 * (bound 122). O(types² × (instances × types² + the edges out of the two
 * batches)) a step. */
typedef struct la2_score {
  int32_t bound; /* Σ_t max_c B_c,t: the run's bound on what is left */
  double soft;   /* Σ_c B_c³                                          */
} la2_score;

static bool la2_less(la2_score a, la2_score b) {
  return a.bound < b.bound || (a.bound == b.bound && a.soft < b.soft - 0.5);
}

/* Per listed instance c and type u: the largest and second largest of
 * cm1[c][a][u] over a, and the a of the largest, so that la2_rows can
 * leave out any one a in O(T) per instance, not O(T²). */
static void la2_top(const cn_frontier *f, int32_t nc) {
  int T = f->n_types;
  size_t TT = (size_t)T * (size_t)T;
  for (int32_t k = 0; k < nc; k++) {
    int32_t c = f->clist[k];
    int32_t *x = f->cx + (size_t)c * T, *s = f->cs + (size_t)c * T;
    uint8_t *am = f->ca + (size_t)c * T;
    memset(x, 0, (size_t)T * sizeof(int32_t));
    memset(s, 0, (size_t)T * sizeof(int32_t));
    memset(am, 0, (size_t)T);
    for (int a = 0; a < T; a++) {
      const int32_t *m = f->cm1 + (size_t)c * TT + (size_t)a * T;
      for (int u = 0; u < T; u++) {
        if (m[u] > x[u]) {
          s[u] = x[u];
          x[u] = m[u];
          am[u] = (uint8_t)a;
        } else if (m[u] > s[u]) {
          s[u] = m[u];
        }
      }
    }
  }
}

/* cb[c] = max over types a != skip of cm1[c][a], for the listed instances
 * (from la2_top's maxima). */
static void la2_rows(const cn_frontier *f, int32_t nc, int skip) {
  int T = f->n_types;
  for (int32_t k = 0; k < nc; k++) {
    size_t o = (size_t)f->clist[k] * T;
    int32_t *b = f->cb + o;
    for (int u = 0; u < T; u++)
      b[u] = f->ca[o + u] == skip ? f->cs[o + u] : f->cx[o + u];
  }
}

/* The score of the state whose per-instance maxima are in cb. */
static la2_score la2_eval(const cn_frontier *f, int32_t nc) {
  int T = f->n_types;
  la2_score s = {0, 0.0};
  int32_t run[CN_MAX_TYPES] = {0};
  for (int32_t k = 0; k < nc; k++) {
    const int32_t *b = f->cb + (size_t)f->clist[k] * T;
    int32_t x = 0;
    max_into(run, b, T);
    for (int u = 0; u < T; u++) x += b[u];
    s.soft += (double)x * x * x;
  }
  for (int u = 0; u < T; u++) s.bound += run[u];
  return s;
}

/* The second batch (type t2 after t1, whose batch made n1[0..nn) ready):
 * the consumers it makes ready go into cb. pass 1 undoes the counts. */
static void la2_second(const cn_frontier *f, int t1, int t2, int32_t nn,
                       int pass) {
  int T = f->n_types;
  for (int src = 0; src < 2; src++) {
    int64_t n = src == 0 ? (t2 != t1 ? f->qc_n[t2] : 0) : nn;
    for (int64_t i = 0; i < n; i++) {
      int32_t v = src == 0 ? f->qc[t2][i] : f->n1[i];
      if (src == 1 && f->vtype[v] != t2) continue;
      for (int32_t e = f->out_head[v]; e >= 0; e = f->e_next[e]) {
        int32_t w = f->e_dst[e];
        if (pass == 1)
          f->seen2[w] = 0;
        else if (f->seen_in[w] + ++f->seen2[w] == f->pending[w])
          fold_tail(f, f->cb + (size_t)f->comp[w] * T, w);
      }
    }
  }
}

static int next_lookahead2(const cn_frontier *f) {
  if (f->comp == NULL) return next_lookahead(f);
  int T = f->n_types;
  size_t TT = (size_t)T * (size_t)T;
  /* The instances with ready vertices; their rows are kept up to date
   * as vertices become ready and batches run (note_ready, commit). */
  int32_t nc = 0;
  for (int a = 0; a < T; a++)
    for (int32_t k = 0; k < f->cin_n[a]; k++) {
      int32_t c = f->cin[a][k];
      if (!f->cmark[c]) {
        f->cmark[c] = 1;
        f->clist[nc++] = c;
      }
    }
  /* In a graph that is complete, a type that feeds nothing (outputs) is
   * left for last: its batches ready nothing, so running it while another
   * type can run only costs a batch, and at the end one batch takes all of
   * it. Neither a first nor a second batch of it is scored while another
   * type is ready. */
  bool others = false;
  if (f->complete)
    for (int a = 0; a < T; a++) others |= f->n_ready[a] > 0 && f->feeds[a];
  int best = -1;
  la2_score b1 = {0, 0.0}, b2 = {0, 0.0};
  double bavg = 0;
  for (int t1 = 0; t1 < T; t1++) {
    if (f->n_ready[t1] == 0 || (others && !f->feeds[t1])) continue;
    /* After the first batch: its type's rows go, what it readies comes. */
    int64_t n1_of[CN_MAX_TYPES] = {0};
    int32_t nn = count_batch(f, t1, f->n1);
    for (int32_t i = 0; i < nn; i++) n1_of[f->vtype[f->n1[i]]]++;
    for (int32_t k = 0; k < nc; k++) {
      size_t o = (size_t)f->clist[k] * TT;
      memcpy(f->cm1 + o, f->cm + o, TT * sizeof(int32_t));
      memset(f->cm1 + o + (size_t)t1 * T, 0, (size_t)T * sizeof(int32_t));
    }
    for (int32_t i = 0; i < nn; i++) {
      int32_t w = f->n1[i];
      size_t row = (size_t)f->comp[w] * TT + (size_t)f->vtype[w] * T;
      fold_tail(f, f->cm1 + row, w);
    }
    la2_top(f, nc);
    la2_rows(f, nc, -1);
    la2_score s1 = la2_eval(f, nc), s2 = s1;
    bool second = false;
    bool others2 = false;
    if (f->complete)
      for (int a = 0; a < T; a++)
        others2 |= (a != t1 ? f->n_ready[a] : 0) + n1_of[a] > 0 && f->feeds[a];
    for (int t2 = 0; t2 < T; t2++) {
      if ((t2 != t1 ? f->n_ready[t2] : 0) + n1_of[t2] == 0 ||
          (others2 && !f->feeds[t2]))
        continue;
      la2_rows(f, nc, t2);
      la2_second(f, t1, t2, nn, 0);
      la2_second(f, t1, t2, nn, 1);
      la2_score s = la2_eval(f, nc);
      if (!second || la2_less(s, s2)) s2 = s;
      second = true;
    }
    uncount_batch(f, t1);
    double avg = f->depth_sum[t1] / (double)f->n_of_type[t1];
    bool better;
    if (best < 0 || la2_less(s2, b2))
      better = true;
    else if (la2_less(b2, s2))
      better = false;
    else if (la2_less(s1, b1))
      better = true;
    else if (la2_less(b1, s1))
      better = false;
    else
      better = f->n_ready[t1] < f->n_ready[best] ||
               (f->n_ready[t1] == f->n_ready[best] && avg < bavg);
    if (better) {
      best = t1;
      b1 = s1;
      b2 = s2;
      bavg = avg;
    }
  }
  for (int32_t k = 0; k < nc; k++) f->cmark[f->clist[k]] = 0;
  return best;
}
