/* fsm.c - learned FSM batching policies (ED-Batch §2).
 *
 * A policy maps the state E(G) of the frontier to the type of the next
 * batch (Alg. 1 line 3). E is one of the three encodings of §2.3; π is
 * learned by tabular Q-learning (Watkins & Dayan 1992) with n-step
 * bootstrapping and ε-greedy exploration on a sample of run graphs, with the
 * reward of eq. 1. Every eval_every episodes the greedy policy is scheduled
 * on the whole sample and the best table so far is kept; learning stops
 * early once the sample's lower bound Σ_t depth_t is reached (§5.3, "The
 * compilation overhead"). States (and actions) never updated fall back to
 * the agenda choice, so the empty table is exactly the agenda policy and
 * the kept table never launches more batches than agenda on the sample.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched/fsm_impl.h"

static const char *const enc_names[CN_FSM_ENC__COUNT] = {"base", "max",
                                                         "sort", "bound"};

const char *cn_fsm_encoding_name(cn_fsm_encoding e) {
  return e >= 0 && e < CN_FSM_ENC__COUNT ? enc_names[e] : "?";
}

int cn_fsm_encoding_parse(const char *name, cn_fsm_encoding *out) {
  for (int e = 0; e < CN_FSM_ENC__COUNT; e++)
    if (strcmp(name, enc_names[e]) == 0) {
      *out = (cn_fsm_encoding)e;
      return 0;
    }
  return CN_E_BAD_CONFIG;
}

void cn_fsm_opts_default(cn_fsm_opts *o) {
  memset(o, 0, sizeof(*o));
  o->encoding = CN_FSM_ENC_BOUND;
  o->iterations = 1000;
  o->eval_every = 50;
  o->nstep = 4;
  o->alpha = 0.5;
  o->learning_rate = 0.2;
  o->gamma = 1.0;
  o->epsilon_start = 0.5;
  o->epsilon_end = 0.02;
  o->seed = 1;
  o->time_limit_s = 60;
  o->fallback = 1;
  o->polish_rounds = 8;
}

/* ED-Batch §2.3. E_base: bit t for each type on the frontier. E_max: that
 * plus (1 + the most common type, lowest on a tie) in bits 8..11. E_sort:
 * the types on the frontier by descending count (lowest type first on a
 * tie), (1 + type) in successive 4-bit digits: 8 types fill 32 bits. */
uint32_t cn__fsm_encode(cn_fsm_encoding enc, int n_types,
                        const int64_t *n_ready) {
  uint32_t mask = 0;
  int arg = -1;
  for (int t = 0; t < n_types; t++)
    if (n_ready[t] > 0) {
      mask |= 1u << t;
      if (arg < 0 || n_ready[t] > n_ready[arg]) arg = t;
    }
  if (mask == 0) return 0;
  if (enc == CN_FSM_ENC_BASE) return mask;
  if (enc == CN_FSM_ENC_MAX) return mask | (uint32_t)(arg + 1) << 8;
  int ord[CN_MAX_TYPES], n = 0;
  for (int t = 0; t < n_types; t++) {
    if (n_ready[t] == 0) continue;
    int i = n; /* insertion sort: stable, so ties keep the lower type first */
    while (i > 0 && n_ready[ord[i - 1]] < n_ready[t]) {
      ord[i] = ord[i - 1];
      i--;
    }
    ord[i] = t;
    n++;
  }
  uint32_t key = 0;
  for (int i = 0; i < n; i++) key |= (uint32_t)(ord[i] + 1) << (4 * i);
  return key;
}

/* E_bound (ours, beside §2.3's three): E_max's bits, plus in bits 12..19
 * the ready types whose batch lowers the bound on what is left the most
 * (cn__frontier_drops). The frontier's counts cannot tell which of two
 * ready types is on the longest remaining path; this bit can. */
uint32_t cn__fsm_encode_bound(int n_types, const int64_t *n_ready,
                              const int64_t *drop) {
  uint32_t key = cn__fsm_encode(CN_FSM_ENC_MAX, n_types, n_ready);
  if (key == 0) return 0;
  int64_t top = -1;
  for (int t = 0; t < n_types; t++)
    if (n_ready[t] > 0 && drop[t] > top) top = drop[t];
  for (int t = 0; t < n_types; t++)
    if (n_ready[t] > 0 && drop[t] == top) key |= 1u << (12 + t);
  return key;
}

uint32_t cn__fsm_state(cn_fsm_encoding enc, const cn_frontier *f) {
  if (enc != CN_FSM_ENC_BOUND)
    return cn__fsm_encode(enc, f->n_types, f->n_ready);
  int64_t drop[CN_MAX_TYPES];
  cn__frontier_drops(f, drop);
  return cn__fsm_encode_bound(f->n_types, f->n_ready, drop);
}

bool cn__fsm_needs_tails(const cn_fsm *p) {
  return p->executes == CN_POLICY_LOOKAHEAD ||
         p->executes == CN_POLICY_LOOKAHEAD2 ||
         (p->executes == CN_POLICY_FSM && p->enc == CN_FSM_ENC_BOUND);
}

/* ---- the Q table ------------------------------------------------------- */
int cn__qtab_init(cn_qtab *t, int n_types, uint32_t cap) {
  memset(t, 0, sizeof(*t));
  uint32_t c = 16;
  while (c < cap) c *= 2;
  t->n_types = n_types;
  t->cap = c;
  t->keys = calloc(c, sizeof(uint32_t));
  t->seen = calloc(c, 1);
  t->q = calloc((size_t)c * (size_t)n_types, sizeof(double));
  if (!t->keys || !t->seen || !t->q) {
    cn__qtab_free(t);
    return CN_E_NOMEM;
  }
  return 0;
}

void cn__qtab_free(cn_qtab *t) {
  free(t->keys);
  free(t->seen);
  free(t->q);
  memset(t, 0, sizeof(*t));
}

int cn__qtab_copy(cn_qtab *dst, const cn_qtab *src) {
  cn_qtab c;
  if (cn__qtab_init(&c, src->n_types, src->cap)) return CN_E_NOMEM;
  c.n = src->n;
  memcpy(c.keys, src->keys, src->cap * sizeof(uint32_t));
  memcpy(c.seen, src->seen, src->cap);
  memcpy(c.q, src->q, (size_t)src->cap * src->n_types * sizeof(double));
  cn__qtab_free(dst);
  *dst = c;
  return 0;
}

static uint32_t slot_of(uint32_t key, uint32_t cap) {
  return (key * 2654435761u) & (cap - 1); /* Knuth's multiplicative hash */
}

int64_t cn__qtab_find(const cn_qtab *t, uint32_t key) {
  if (key == 0 || t->cap == 0) return -1;
  for (uint32_t i = slot_of(key, t->cap);; i = (i + 1) & (t->cap - 1)) {
    if (t->keys[i] == key) return i;
    if (t->keys[i] == 0) return -1;
  }
}

int64_t cn__qtab_get(cn_qtab *t, uint32_t key) {
  int64_t s = cn__qtab_find(t, key);
  if (s >= 0 || key == 0) return s;
  if (2 * (t->n + 1) > t->cap) { /* keep the load under one half */
    cn_qtab g;
    if (cn__qtab_init(&g, t->n_types, t->cap * 2)) return -1;
    for (uint32_t i = 0; i < t->cap; i++) {
      if (t->keys[i] == 0) continue;
      int64_t j = cn__qtab_get(&g, t->keys[i]);
      g.seen[j] = t->seen[i];
      memcpy(g.q + j * g.n_types, t->q + (size_t)i * t->n_types,
             (size_t)t->n_types * sizeof(double));
    }
    cn__qtab_free(t);
    *t = g;
  }
  uint32_t i = slot_of(key, t->cap);
  while (t->keys[i] != 0) i = (i + 1) & (t->cap - 1);
  t->keys[i] = key;
  t->n++;
  return i;
}

/* ---- the policy object --------------------------------------------------- */
cn_fsm *cn__fsm_new(int n_types, cn_fsm_encoding enc) {
  cn_fsm *p = calloc(1, sizeof(*p));
  if (p == NULL) return NULL;
  atomic_init(&p->refs, 1);
  p->n_types = n_types;
  p->enc = enc;
  p->executes = CN_POLICY_FSM;
  if (cn__qtab_init(&p->tab, n_types, 16)) {
    free(p);
    return NULL;
  }
  return p;
}

cn_fsm *cn_fsm_retain(const cn_fsm *p) {
  cn_fsm *q = (cn_fsm *)p; /* the count is the one mutable field */
  if (q != NULL) atomic_fetch_add(&q->refs, 1);
  return q;
}

void cn_fsm_free(cn_fsm *p) {
  if (p == NULL || atomic_fetch_sub(&p->refs, 1) != 1) return;
  cn__qtab_free(&p->tab);
  free(p);
}

cn_fsm_encoding cn_fsm_get_encoding(const cn_fsm *p) { return p->enc; }
cn_policy_kind cn__fsm_executes(const cn_fsm *p) { return p->executes; }
uint64_t cn__fsm_key(const cn_fsm *p) { return p->key; }

long long cn_fsm_train_batches(const cn_fsm *p, long long *lower_bound) {
  if (lower_bound) *lower_bound = p->st.lower_bound;
  return p->st.fsm;
}

/* Greedy π(S) = argmax_a Q(S, a) over the ready types whose Q was learned
 * (ED-Batch §2.3, "During inference"); -1 when the table knows none. */
static int greedy(const cn_qtab *tab, cn_fsm_encoding enc,
                  const cn_frontier *f) {
  int64_t s = cn__qtab_find(tab, cn__fsm_state(enc, f));
  if (s < 0) return -1;
  const double *q = tab->q + s * tab->n_types;
  int best = -1;
  for (int a = 0; a < f->n_types; a++)
    if (f->n_ready[a] > 0 && (tab->seen[s] >> a & 1) &&
        (best < 0 || q[a] > q[best]))
      best = a;
  return best;
}

int cn__fsm_n_types(const cn_fsm *p) { return p->n_types; }

int cn__fsm_choose(const cn_fsm *p, const cn_frontier *f) {
  int a = greedy(&p->tab, p->enc, f);
  return a >= 0 ? a : cn__frontier_agenda(f);
}


json_t *cn_fsm_describe(const cn_fsm *p) {
  char key[20];
  snprintf(key, sizeof(key), "%016llx", (unsigned long long)p->key);
  const cn_fsm_stats *s = &p->st;
  return json_pack(
      "{s:s, s:s, s:s, s:s, s:i, s:i, s:I, s:i, s:i, s:b, s:f, s:{s:I, s:I, "
      "s:I, s:I, s:I, s:I, s:I}, s:s}",
      "kind", "fsm", "family", p->family, "encoding",
      cn_fsm_encoding_name(p->enc), "executes", cn_policy_name(p->executes),
      "states", (int)p->tab.n, "trained_on_graphs", s->graphs,
      "trained_on_vertices", (json_int_t)s->vertices, "iterations",
      s->iterations, "best_iteration", s->best_iteration, "distilled",
      s->distilled, "train_seconds",
      s->seconds, "batches", "fsm", (json_int_t)s->fsm, "agenda",
      (json_int_t)s->agenda, "depth", (json_int_t)s->depth, "sufficient",
      (json_int_t)s->sufficient, "lookahead", (json_int_t)s->lookahead,
      "lookahead2", (json_int_t)s->lookahead2, "lower_bound", (json_int_t)s->lower_bound,
      "key", key);
}
