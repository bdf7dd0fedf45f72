/* dag_beam.c - a short schedule for a static run, by beam search over the
 * product of its instances' automata.
 *
 * The problem is ED-Batch §2.1's (dag_optimum.c): the fewest steps "run every
 * ready vertex of type t" that run the whole graph. A run's graph is a
 * disjoint union of instance graphs, and a step acts on each instance on its
 * own: an instance's done-set goes to the same successor under type t
 * whatever the other instances are doing. So:
 *
 *   - each instance (weakly connected component) gets an automaton, built
 *     lazily: a state is the instance's done-set, its successor under t is
 *     computed once and memoised, along with dep_t, the most type-t
 *     vertices on any path of what is left of it (the largest tail_t over
 *     its ready vertices, as in dag_optimum.c's heuristic);
 *   - a search state is the vector of its instances' automaton states, so
 *     expanding one costs a table look-up per instance and type, not a copy
 *     of the run's pending counts (dag_optimum.c's first beam did that). A
 *     width of thousands fits in a second on a run of 64 lattices.
 *
 * The beam keeps, after each step, the `width` states of least
 *   f = g + Σ_t max_c dep_t(c)        (batches so far + the bound of what is
 *                                      left, docs/models.md's, on the rest)
 * ties broken by the smaller Σ_c D_c³, D_c = Σ_t dep_t(c) the instance's own
 * bound: a soft maximum, favouring the state whose most loaded instances
 * have the least left (measured on the held-out latticelstm runs at width
 * 256: 1,131 batches, against 1,140 for Σ_c D_c and 1,135 for Σ_c D_c²),
 * then by the hash. States
 * reached twice (same done-set) are kept once. Forced moves as in IDA*: when
 * every type-t vertex left is ready, t is the only child; and a type that
 * feeds nothing waits while one that does is ready (a quarter fewer
 * children on lattices and trees with outputs=all).
 *
 * This is the anytime search Cavs and ED-Batch do not do (they batch online
 * from the frontier); it needs the whole run graph up front, so it plans
 * static runs only (lstm-nmt's decoder grows its graph while it runs).
 * CN_POLICY_PLAN (sched.c) runs it on every run graph. */
#include <stdlib.h>
#include <string.h>

#include "sched/sched_api.h"

/* One instance's automaton. States are numbered in creation order; state 0
 * is "nothing done". */
typedef struct inst {
  int32_t n, words;   /* vertices; 64-bit words per done-set */
  const int32_t *verts; /* global ids, ascending (inputs first) */
  int32_t ns, cap;
  uint64_t *done; /* cap × words */
  uint64_t *key;  /* cap: Zobrist key of the done-set (global ids) */
  int32_t *next;  /* cap × T: successor; -1 not computed; -2 nothing ready */
  int32_t *dep;   /* cap × T */
  int32_t *ready; /* cap × T: ready vertices of each type */
  int32_t *left;  /* cap × T: undone vertices of each type */
  int32_t *roff, *rlen; /* cap: the state's ready vertices, at rpool[roff] */
  int32_t *rpool;       /* global ids */
  int64_t rpool_n, rpool_cap;
  int32_t *slot;  /* open-addressing table of state ids, -1 empty */
  uint32_t slot_mask;
} inst;

typedef struct planner {
  const cn_dag *g;
  int T;
  int32_t ninst;
  inst *in;
  int32_t *comp, *local; /* vertex → instance, index within it */
  int32_t *members;      /* vertices grouped by instance */
  int32_t *tail;         /* nv × T */
  int32_t *out_start, *out_edges; /* consumers of each vertex */
  uint32_t feeds;                 /* cn__dag_feeding_types */
  uint64_t *z;           /* Zobrist key per vertex */
  uint64_t *scratch;     /* one done-set */
  int32_t *rbuf;         /* one ready list */
  int32_t *mark, stamp;  /* [v]: == stamp when v is in rbuf */
} planner;

static inline bool is_done(const uint64_t *d, int32_t i) {
  return (d[i >> 6] >> (i & 63)) & 1;
}

static bool inputs_done(const planner *p, const uint64_t *d, int32_t v) {
  for (int32_t e = p->g->in_start[v]; e < p->g->in_start[v + 1]; e++)
    if (!is_done(d, p->local[p->g->in_edges[e]])) return false;
  return true;
}

static int32_t slot_find(const inst *c, const uint64_t *d, uint64_t key) {
  for (uint32_t h = (uint32_t)key & c->slot_mask;; h = (h + 1) & c->slot_mask) {
    int32_t s = c->slot[h];
    if (s < 0) return -1 - (int32_t)h; /* absent: where it would go */
    if (c->key[s] == key &&
        memcmp(c->done + (size_t)s * c->words, d,
               (size_t)c->words * sizeof(uint64_t)) == 0)
      return s;
  }
}

static int grow(inst *c, int T) {
  int32_t cap = c->cap ? 2 * c->cap : 16;
  uint64_t *done = realloc(c->done, (size_t)cap * c->words * sizeof(uint64_t));
  if (done != NULL) c->done = done;
  uint64_t *key = realloc(c->key, (size_t)cap * sizeof(uint64_t));
  if (key != NULL) c->key = key;
  int32_t **a[6] = {&c->next, &c->dep, &c->ready, &c->left, &c->roff,
                    &c->rlen};
  bool ok = done != NULL && key != NULL;
  for (int k = 0; k < 6 && ok; k++) {
    int32_t *m = realloc(*a[k], (size_t)cap * (k < 4 ? T : 1) *
                                    sizeof(int32_t));
    if (m == NULL) ok = false;
    else *a[k] = m;
  }
  if (!ok) return CN_E_NOMEM;
  c->cap = cap;
  /* Keep the table at most half full. */
  if ((uint32_t)cap * 2 > c->slot_mask + 1) {
    uint32_t size = (c->slot_mask + 1) * 4;
    int32_t *slot = malloc((size_t)size * sizeof(int32_t));
    if (slot == NULL) return CN_E_NOMEM;
    for (uint32_t h = 0; h < size; h++) slot[h] = -1;
    for (int32_t s = 0; s < c->ns; s++) {
      uint32_t h = (uint32_t)c->key[s] & (size - 1);
      while (slot[h] >= 0) h = (h + 1) & (size - 1);
      slot[h] = s;
    }
    free(c->slot);
    c->slot = slot;
    c->slot_mask = size - 1;
  }
  return 0;
}

/* The state of instance c with done-set d (key its Zobrist key), whose
 * ready vertices are rd[0..nr) and undone vertices per type lf: found, or
 * added with its dep/ready/left. Returns its id or CN_E_NOMEM. */
static int32_t intern(planner *p, inst *c, const uint64_t *d, uint64_t key,
                      const int32_t *rd, int32_t nr, const int32_t *lf) {
  int T = p->T;
  int32_t s = slot_find(c, d, key);
  if (s >= 0) return s;
  if (c->ns == c->cap) {
    if (grow(c, T) != 0) return CN_E_NOMEM;
    s = slot_find(c, d, key);
  }
  if (c->rpool_n + nr > c->rpool_cap) {
    int64_t cap = c->rpool_cap ? 2 * c->rpool_cap : 256;
    while (cap < c->rpool_n + nr) cap *= 2;
    int32_t *pool = realloc(c->rpool, (size_t)cap * sizeof(int32_t));
    if (pool == NULL) return CN_E_NOMEM;
    c->rpool = pool;
    c->rpool_cap = cap;
  }
  uint32_t h = (uint32_t)(-1 - s);
  s = c->ns++;
  c->slot[h] = s;
  c->key[s] = key;
  memcpy(c->done + (size_t)s * c->words, d, (size_t)c->words * 8);
  c->roff[s] = (int32_t)c->rpool_n;
  c->rlen[s] = nr;
  memcpy(c->rpool + c->rpool_n, rd, (size_t)nr * sizeof(int32_t));
  c->rpool_n += nr;
  int32_t *dep = c->dep + (size_t)s * T, *rn = c->ready + (size_t)s * T;
  int32_t *nx = c->next + (size_t)s * T;
  memcpy(c->left + (size_t)s * T, lf, (size_t)T * sizeof(int32_t));
  for (int t = 0; t < T; t++) dep[t] = rn[t] = 0, nx[t] = -1;
  for (int32_t i = 0; i < nr; i++) {
    rn[p->g->vtype[rd[i]]]++;
    const int32_t *tl = p->tail + (size_t)rd[i] * T;
    for (int u = 0; u < T; u++)
      if (tl[u] > dep[u]) dep[u] = tl[u];
  }
  return s;
}

/* Successor of state s of instance c under type t (-2: nothing of type t
 * ready), or CN_E_NOMEM. The batch is s's ready type-t vertices; the
 * successor's ready vertices are s's others and the consumers the batch
 * completes, so a new state costs its ready list and the batch's edges, not
 * a scan of the instance. */
static int32_t step(planner *p, inst *c, int32_t s, int t) {
  int T = p->T;
  int32_t nx = c->next[(size_t)s * T + t];
  if (nx != -1) return nx;
  if (c->ready[(size_t)s * T + t] == 0) {
    nx = -2;
  } else {
    uint64_t *d2 = p->scratch, key = c->key[s];
    memcpy(d2, c->done + (size_t)s * c->words, (size_t)c->words * 8);
    int32_t lf[CN_MAX_TYPES], nr = 0;
    memcpy(lf, c->left + (size_t)s * T, (size_t)T * sizeof(int32_t));
    const int32_t *rd = c->rpool + c->roff[s];
    int32_t n = c->rlen[s];
    for (int32_t i = 0; i < n; i++) {
      int32_t v = rd[i];
      if (p->g->vtype[v] != t) {
        p->rbuf[nr++] = v;
        continue;
      }
      int32_t l = p->local[v];
      d2[l >> 6] |= (uint64_t)1 << (l & 63);
      key ^= p->z[v];
      lf[t]--;
    }
    if (++p->stamp == INT32_MAX) { /* never in practice; keeps marks sound */
      memset(p->mark, 0, (size_t)p->g->nv * sizeof(int32_t));
      p->stamp = 1;
    }
    for (int32_t i = 0; i < n; i++) {
      int32_t v = rd[i];
      if (p->g->vtype[v] != t) continue;
      for (int32_t e = p->out_start[v]; e < p->out_start[v + 1]; e++) {
        int32_t w = p->out_edges[e];
        if (p->mark[w] == p->stamp || !inputs_done(p, d2, w)) continue;
        p->mark[w] = p->stamp;
        p->rbuf[nr++] = w;
      }
    }
    nx = intern(p, c, d2, key, p->rbuf, nr, lf);
    if (nx < 0) return nx;
  }
  c->next[(size_t)s * T + t] = nx;
  return nx;
}

static void planner_free(planner *p) {
  for (int32_t k = 0; p->in != NULL && k < p->ninst; k++) {
    inst *c = &p->in[k];
    free(c->done);
    free(c->key);
    free(c->next);
    free(c->dep);
    free(c->ready);
    free(c->left);
    free(c->roff);
    free(c->rlen);
    free(c->rpool);
    free(c->slot);
  }
  free(p->in);
  free(p->comp);
  free(p->local);
  free(p->members);
  free(p->tail);
  free(p->z);
  free(p->scratch);
  free(p->out_start);
  free(p->out_edges);
  free(p->rbuf);
  free(p->mark);
}

static int planner_init(planner *p, const cn_dag *g) {
  memset(p, 0, sizeof(*p));
  p->g = g;
  p->T = g->n_types;
  int32_t nv = g->nv;
  p->comp = malloc((size_t)nv * sizeof(int32_t));
  p->local = malloc((size_t)nv * sizeof(int32_t));
  p->members = malloc((size_t)nv * sizeof(int32_t));
  p->z = malloc((size_t)nv * sizeof(uint64_t));
  if (cn__dag_consumers(g, &p->out_start, &p->out_edges) != 0)
    return CN_E_NOMEM;
  p->tail = cn__dag_tails(g, p->out_start, p->out_edges);
  p->feeds = cn__dag_feeding_types(g);
  if (!p->comp || !p->local || !p->members || !p->z || !p->tail)
    return CN_E_NOMEM;
  p->ninst = cn__dag_components(g, p->comp);
  p->in = cn__xcalloc((size_t)p->ninst, sizeof(inst));
  int32_t *start = cn__xcalloc((size_t)p->ninst + 1, sizeof(int32_t));
  if (p->in == NULL || start == NULL) {
    free(start);
    return CN_E_NOMEM;
  }
  for (int32_t v = 0; v < nv; v++) start[p->comp[v] + 1]++;
  for (int32_t k = 0; k < p->ninst; k++) start[k + 1] += start[k];
  int32_t maxn = 0;
  for (int32_t k = 0; k < p->ninst; k++) {
    inst *c = &p->in[k];
    c->verts = p->members + start[k];
    if (start[k + 1] - start[k] > maxn) maxn = start[k + 1] - start[k];
  }
  for (int32_t v = 0; v < nv; v++) { /* ascending: inputs first */
    inst *c = &p->in[p->comp[v]];
    p->local[v] = c->n;
    p->members[start[p->comp[v]] + c->n++] = v;
  }
  free(start);
  p->scratch = cn__xcalloc((size_t)maxn / 64 + 1, sizeof(uint64_t));
  p->rbuf = malloc(((size_t)maxn + 1) * sizeof(int32_t));
  p->mark = cn__xcalloc((size_t)nv + 1, sizeof(int32_t));
  if (!p->scratch || !p->rbuf || !p->mark) return CN_E_NOMEM;
  uint64_t seed = 0x706c616e6e6572ull;
  for (int32_t v = 0; v < nv; v++) p->z[v] = cn__splitmix64(&seed);
  for (int32_t k = 0; k < p->ninst; k++) {
    inst *c = &p->in[k];
    c->words = c->n / 64 + 1;
    c->slot_mask = 7;
    c->slot = malloc(8 * sizeof(int32_t));
    if (c->slot == NULL) return CN_E_NOMEM;
    for (int h = 0; h < 8; h++) c->slot[h] = -1;
    /* State 0: nothing done; the ready vertices are those without inputs. */
    int32_t nr = 0, lf[CN_MAX_TYPES] = {0};
    for (int32_t i = 0; i < c->n; i++) {
      int32_t v = c->verts[i];
      lf[g->vtype[v]]++;
      if (g->in_start[v] == g->in_start[v + 1]) p->rbuf[nr++] = v;
    }
    memset(p->scratch, 0, (size_t)c->words * 8);
    if (intern(p, c, p->scratch, 0, p->rbuf, nr, lf) != 0) return CN_E_NOMEM;
  }
  return 0;
}

/* A candidate child: parent beam slot, type, rank; its instances' states
 * are at kids[at × instances]. */
typedef struct pcand {
  int32_t parent, t, at;
  int32_t f;
  int64_t spread;
  uint64_t key;
} pcand;

static int pcand_cmp(const void *a, const void *b) {
  const pcand *x = a, *y = b;
  if (x->f != y->f) return x->f < y->f ? -1 : 1;
  if (x->spread != y->spread) return x->spread < y->spread ? -1 : 1;
  return x->key < y->key ? -1 : x->key > y->key;
}

/* Rank of the child of cs (ninst states) under t: f and spread into *c;
 * false when t runs nothing. Fills kid with the child's states. */
static int child(planner *p, const int32_t *cs, int t, int32_t g,
                 int32_t *kid, uint64_t key, pcand *c) {
  int T = p->T;
  int32_t best[CN_MAX_TYPES] = {0};
  int64_t spread = 0;
  bool moved = false;
  for (int32_t k = 0; k < p->ninst; k++) {
    inst *in = &p->in[k];
    int32_t s = step(p, in, cs[k], t);
    if (s == CN_E_NOMEM) return s;
    if (s == -2) s = cs[k];
    else moved = true, key ^= in->key[cs[k]] ^ in->key[s];
    kid[k] = s;
    const int32_t *dep = in->dep + (size_t)s * T;
    int64_t d = 0;
    for (int u = 0; u < T; u++) {
      if (dep[u] > best[u]) best[u] = dep[u];
      d += dep[u];
    }
    spread += d * d * d;
  }
  if (!moved) return 0;
  int32_t h = 0;
  for (int u = 0; u < T; u++) h += best[u];
  c->f = g + 1 + h;
  c->spread = spread;
  c->key = key;
  c->t = t;
  return 1;
}

/* The beam's buffers: up to W kept states of C instance states each (cur,
 * nxt, with their keys), the candidates and their states (kids), and per
 * step each kept state's parent slot and type (par, typ), for the path. */
typedef struct beam {
  size_t W, C;
  int32_t *cur, *nxt, *kids;
  uint64_t *ckey, *nkey;
  pcand *cand;
  int32_t *par;
  uint8_t *typ;
  size_t steps_cap;
} beam;

/* The buffers for width W, C instances, T types; the beam holds one
 * state, every instance in state 0. */
static int beam_alloc(beam *b, size_t W, size_t C, int T) {
  b->W = W;
  b->C = C;
  b->cur = malloc(W * C * sizeof(int32_t));
  b->nxt = malloc(W * C * sizeof(int32_t));
  b->kids = malloc(W * (size_t)T * C * sizeof(int32_t));
  b->ckey = malloc(W * sizeof(uint64_t));
  b->nkey = malloc(W * sizeof(uint64_t));
  b->cand = malloc(W * (size_t)T * sizeof(pcand));
  if (!b->cur || !b->nxt || !b->kids || !b->ckey || !b->nkey || !b->cand)
    return CN_E_NOMEM;
  memset(b->cur, 0, C * sizeof(int32_t)); /* every instance in state 0 */
  b->ckey[0] = 0;
  return 0;
}

static void beam_free(beam *b) {
  free(b->cur);
  free(b->nxt);
  free(b->kids);
  free(b->ckey);
  free(b->nkey);
  free(b->cand);
  free(b->par);
  free(b->typ);
}

/* The types to branch on from the product state cs: the ready types,
 * narrowed by cn__dag_branch_types, one of them forced when every
 * type-t vertex left is ready. */
static uint32_t allowed_types(const planner *p, const int32_t *cs) {
  int T = p->T;
  int64_t rd[CN_MAX_TYPES] = {0}, lf[CN_MAX_TYPES] = {0};
  for (size_t k = 0; k < (size_t)p->ninst; k++) {
    const inst *in = &p->in[k];
    for (int t = 0; t < T; t++) {
      rd[t] += in->ready[(size_t)cs[k] * T + t];
      lf[t] += in->left[(size_t)cs[k] * T + t];
    }
  }
  int forced = -1;
  uint32_t live = 0; /* ready types */
  for (int t = 0; t < T; t++) {
    if (rd[t] > 0) live |= 1u << t;
    if (forced < 0 && rd[t] > 0 && rd[t] == lf[t]) forced = t;
  }
  return cn__dag_branch_types(live, forced, p->feeds);
}

/* Every child of the ncur kept states, ranked, into b->cand and their
 * states into b->kids; *nc says how many. */
static int expand(planner *p, beam *b, size_t ncur, int32_t steps,
                  size_t *nc) {
  size_t C = b->C;
  *nc = 0;
  for (size_t i = 0; i < ncur; i++) {
    const int32_t *cs = b->cur + i * C;
    uint32_t allowed = allowed_types(p, cs);
    for (int t = 0; t < p->T; t++) {
      if (!(allowed >> t & 1)) continue;
      pcand *c = &b->cand[*nc];
      int r = child(p, cs, t, steps, b->kids + *nc * C, b->ckey[i], c);
      if (r < 0) return CN_E_NOMEM;
      if (r == 0) continue;
      c->parent = (int32_t)i;
      c->at = (int32_t)*nc;
      ++*nc;
    }
  }
  return 0;
}

/* Room in par and typ for step `steps` (doubling). */
static int grow_steps(beam *b, int32_t steps) {
  if ((size_t)steps != b->steps_cap) return 0;
  b->steps_cap = b->steps_cap ? 2 * b->steps_cap : 256;
  int32_t *np = realloc(b->par, b->steps_cap * b->W * sizeof(int32_t));
  if (np != NULL) b->par = np;
  uint8_t *nt = realloc(b->typ, b->steps_cap * b->W);
  if (nt != NULL) b->typ = nt;
  if (np == NULL || nt == NULL) return CN_E_NOMEM;
  return 0;
}

/* The best W of the nc sorted candidates, a state reached twice kept
 * once, into nxt with their parents and types at step `steps`; *goal is
 * the first kept that is done (h = 0). Returns how many were kept. */
static size_t keep_best(beam *b, size_t nc, int32_t steps, int32_t *goal) {
  size_t W = b->W, C = b->C, nn = 0;
  for (size_t c = 0; c < nc && nn < W; c++) {
    const pcand *k = &b->cand[c];
    if (nn > 0 && k->key == b->nkey[nn - 1]) continue; /* reached twice */
    memcpy(b->nxt + nn * C, b->kids + (size_t)k->at * C,
           C * sizeof(int32_t));
    b->nkey[nn] = k->key;
    b->par[(size_t)steps * W + nn] = k->parent;
    b->typ[(size_t)steps * W + nn] = (uint8_t)k->t;
    if (k->f == steps + 1 && *goal < 0) *goal = (int32_t)nn; /* h = 0 */
    nn++;
  }
  return nn;
}

/* The kept states become the beam. */
static void beam_swap(beam *b) {
  int32_t *sw = b->cur;
  b->cur = b->nxt;
  b->nxt = sw;
  uint64_t *sk = b->ckey;
  b->ckey = b->nkey;
  b->nkey = sk;
}

/* The types from the first step to the goal, following the parents back;
 * malloc'd into *schedule. */
static int trace_path(const beam *b, int32_t steps, int32_t goal,
                      uint8_t **schedule) {
  uint8_t *path = malloc((size_t)steps);
  if (path == NULL) return CN_E_NOMEM;
  for (int32_t s = steps - 1, at = goal; s >= 0; s--) {
    path[s] = b->typ[(size_t)s * b->W + at];
    at = b->par[(size_t)s * b->W + at];
  }
  *schedule = path;
  return 0;
}

/* Beam search step by step: expand the kept states, rank the children,
 * keep the best `width` until one is done. */
int cn__dag_beam(const cn_dag *g, int width, int64_t *batches,
                 uint8_t **schedule) {
  *batches = 0;
  if (schedule != NULL) *schedule = NULL;
  if (g->nv == 0) return 0;
  if (width < 1) width = 1;
  planner p;
  beam b = {0};
  int rc = planner_init(&p, g);
  if (rc != 0) goto out;
  if ((rc = beam_alloc(&b, (size_t)width, (size_t)p.ninst, p.T)) != 0)
    goto out;
  size_t ncur = 1;
  int32_t steps = 0, goal = -1;
  while (goal < 0) {
    size_t nc;
    if ((rc = expand(&p, &b, ncur, steps, &nc)) != 0) goto out;
    if (nc == 0) { /* cannot happen in a DAG: something is always ready */
      rc = CN_E_INTERNAL;
      goto out;
    }
    qsort(b.cand, nc, sizeof(pcand), pcand_cmp);
    if ((rc = grow_steps(&b, steps)) != 0) goto out;
    ncur = keep_best(&b, nc, steps, &goal);
    steps++;
    beam_swap(&b);
  }
  *batches = steps;
  if (schedule != NULL &&
      (rc = trace_path(&b, steps, goal, schedule)) != 0)
    goto out;
  rc = 0;
out:
  beam_free(&b);
  planner_free(&p);
  return rc;
}
