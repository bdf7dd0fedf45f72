/* fsm_train.c - learning an FSM batching policy by Q-learning (ED-Batch
 * §2.3, "Training").
 *
 * The environment is a training graph under Alg. 1; the state is E(G_t),
 * the action a_t a type on the frontier, the reward (eq. 1)
 *   r(S_t, a_t) = -1 + α · |Frontier_a(G_t)| / |Frontier(G_t^a)|.
 * eq. 1 as printed has the ratio upside down; its worked example ("5/7 and
 * 1/1 for the O and I node", §2.3) and Lemma 1 (a ratio of 1 is optimal)
 * fix the orientation used here: ready type-a vertices over the vertices
 * heading the type-a subgraph, in (0, 1]. The -1 counts batches, so the
 * return of an episode is minus its batch count plus α × the ratios.
 *
 * Tabular Q-learning with n-step returns, γ = 1 by default:
 *   G_τ = Σ_{i=τ}^{τ+n-1} γ^{i-τ} r_i + γ^n max_a Q(S_{τ+n}, a)
 *   Q(S_τ, a_τ) ← Q + lr · (G_τ - Q)   (the first update sets Q = G_τ).
 * Q of an action never taken is 0, above any learned value (every reward
 * is negative for α < 1), so greedy steps try each action once; ties go to
 * the higher eq. 1 ratio, so the first greedy episodes follow the §5.3
 * heuristic and learning starts from it. ε decays linearly.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "sched/fsm_impl.h"

typedef struct rng {
  uint64_t s;
} rng;

static uint64_t rng_next(rng *r) { /* xorshift64* */
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 2685821657736338717ull;
}

static double rng_unit(rng *r) {
  return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Q(S, a) for choosing: 0 when never updated. */
static double qval(const cn_qtab *t, int64_t s, int a) {
  return s >= 0 && (t->seen[s] >> a & 1) ? t->q[s * t->n_types + a] : 0.0;
}

/* max_a Q(S, a) over the frontier's ready types (S non-terminal). */
static double vmax(const cn_qtab *t, uint32_t key, const cn_frontier *f) {
  int64_t s = cn__qtab_find(t, key);
  double v = -INFINITY;
  for (int a = 0; a < f->n_types; a++)
    if (f->n_ready[a] > 0 && qval(t, s, a) > v) v = qval(t, s, a);
  return v == -INFINITY ? 0.0 : v;
}

/* ε-greedy over the ready types; greedy ties: higher eq. 1 ratio, then the
 * agenda's choice. */
static int explore(const cn_qtab *t, uint32_t key, const cn_frontier *f,
                   double eps, rng *g) {
  int ready[CN_MAX_TYPES], n = 0;
  for (int a = 0; a < f->n_types; a++)
    if (f->n_ready[a] > 0) ready[n++] = a;
  if (n == 1) return ready[0];
  if (rng_unit(g) < eps) return ready[rng_next(g) % (uint64_t)n];
  int64_t s = cn__qtab_find(t, key);
  int ag = cn__frontier_agenda(f), best = -1;
  double bq = 0, br = 0;
  for (int i = 0; i < n; i++) {
    int a = ready[i];
    double q = qval(t, s, a), r = cn__frontier_ratio(f, a);
    if (best < 0 || q > bq + 1e-9 ||
        (q > bq - 1e-9 && (r > br + 1e-12 || (r > br - 1e-12 && a == ag)))) {
      best = a;
      bq = q;
      br = r;
    }
  }
  return best;
}

typedef struct step {
  uint32_t key;
  int a;
  double r;
} step;

static int update(cn_qtab *t, const step *st, double G, double lr) {
  int64_t s = cn__qtab_get(t, st->key);
  if (s < 0) return CN_E_NOMEM;
  double *q = t->q + s * t->n_types + st->a;
  if (!(t->seen[s] >> st->a & 1)) {
    *q = G;
    t->seen[s] |= (uint8_t)(1u << st->a);
  } else {
    *q += lr * (G - *q);
  }
  return 0;
}

/* n-step return of window entry τ (of len), bootstrapped with v. */
static double nstep_return(const step *w, int n, int tau, int len,
                           double gamma, double v) {
  double G = 0, gk = 1;
  for (int i = 0; i < len; i++) {
    G += gk * w[(tau + i) % n].r;
    gk *= gamma;
  }
  return G + gk * v;
}

/* One episode of Alg. 1 on f with learning; out: scratch of f->nv. */
static int episode(cn_qtab *t, cn_frontier *f, const cn_fsm_opts *o,
                   double eps, rng *g, step *w, int32_t *out) {
  int n = o->nstep, rc = cn__frontier_reset(f);
  long long k = 0; /* steps taken */
  while (rc == 0 && f->n_done < f->nv) {
    uint32_t key = cn__fsm_state(o->encoding, f);
    int a = explore(t, key, f, eps, g);
    double r = -1.0 + o->alpha * cn__frontier_ratio(f, a); /* eq. 1 */
    if (cn__frontier_commit(f, a, out) <= 0) return CN_E_INTERNAL;
    w[k % n] = (step){key, a, r};
    k++;
    if (k >= n && f->n_done < f->nv) {
      uint32_t nk = cn__fsm_state(o->encoding, f);
      double G = nstep_return(w, n, (int)((k - n) % n), n, o->gamma,
                              vmax(t, nk, f));
      rc = update(t, &w[(k - n) % n], G, o->learning_rate);
    }
  }
  /* The last min(n, k) steps end at the terminal state (value 0). */
  for (long long tau = k > n ? k - n : 0; rc == 0 && tau < k; tau++) {
    double G = nstep_return(w, n, (int)(tau % n), (int)(k - tau), o->gamma,
                            0.0);
    rc = update(t, &w[tau % n], G, o->learning_rate);
  }
  return rc;
}

/* The states the greedy policy meets (unique), when keys != NULL. */
typedef struct keyset {
  uint32_t *k;
  int n, cap;
} keyset;

static int keyset_add(keyset *s, uint32_t key) {
  for (int i = 0; i < s->n; i++)
    if (s->k[i] == key) return 0;
  if (s->n == s->cap) {
    int c = s->cap ? s->cap * 2 : 64;
    uint32_t *k = realloc(s->k, (size_t)c * sizeof(uint32_t));
    if (k == NULL) return CN_E_NOMEM;
    s->k = k;
    s->cap = c;
  }
  s->k[s->n++] = key;
  return 0;
}

/* Batches of the greedy policy over every training frontier. */
static long long evaluate(const cn_fsm *p, cn_frontier *fs, int nf,
                          int32_t *out, keyset *keys) {
  long long total = 0;
  for (int i = 0; i < nf; i++) {
    cn_frontier *f = &fs[i];
    if (cn__frontier_reset(f)) return CN_E_NOMEM;
    while (f->n_done < f->nv) {
      if (keys != NULL &&
          keyset_add(keys, cn__fsm_state(p->enc, f)))
        return CN_E_NOMEM;
      if (cn__frontier_commit(f, cn__fsm_choose(p, f), out) <= 0)
        return CN_E_INTERNAL;
      total++;
    }
  }
  return total;
}

/* The types on the frontier of a state key (fsm.c's encodings). */
static uint32_t key_types(cn_fsm_encoding enc, uint32_t key) {
  if (enc == CN_FSM_ENC_BASE) return key;
  if (enc == CN_FSM_ENC_MAX || enc == CN_FSM_ENC_BOUND) return key & 0xff;
  uint32_t m = 0;
  for (; key != 0; key >>= 4) m |= 1u << ((key & 15) - 1);
  return m;
}

/* Polish (an addition to ED-Batch's Q-learning): coordinate descent on
 * the greedy table. For each state the greedy policy meets, try every
 * action the state allows by raising its Q above the others, and keep the
 * change when the whole sample then needs fewer batches. Q-learning on
 * aliased states (one FSM state stands for many frontiers) settles on noisy
 * values; this makes the kept table a local optimum of the real objective.
 * Each round costs (states × types) evaluations of the sample. */
static int polish(cn_fsm *p, cn_frontier *fs, int nf, int32_t *out,
                  int rounds, long long *best) {
  int T = p->n_types, rc = 0;
  keyset ks = {0};
  for (int round = 0; round < rounds; round++) {
    bool improved = false;
    ks.n = 0;
    long long b = evaluate(p, fs, nf, out, &ks);
    if (b < 0) { rc = (int)b; break; }
    for (int i = 0; i < ks.n && rc == 0; i++) {
      uint32_t types = key_types(p->enc, ks.k[i]);
      for (int a = 0; a < T && rc == 0; a++) {
        if (!(types >> a & 1)) continue;
        int64_t s = cn__qtab_get(&p->tab, ks.k[i]);
        if (s < 0) { rc = CN_E_NOMEM; break; }
        double *q = p->tab.q + s * T, save[CN_MAX_TYPES], top = 0;
        uint8_t seen = p->tab.seen[s];
        memcpy(save, q, (size_t)T * sizeof(double));
        for (int c = 0; c < T; c++)
          if ((seen >> c & 1) && (top == 0 || q[c] > top)) top = q[c];
        q[a] = top + 1.0;
        p->tab.seen[s] |= (uint8_t)(1u << a);
        long long nb = evaluate(p, fs, nf, out, NULL);
        if (nb < 0) { rc = (int)nb; break; }
        if (nb < *best) {
          *best = nb;
          improved = true;
        } else { /* the table may have grown: look the slot up again */
          s = cn__qtab_find(&p->tab, ks.k[i]);
          memcpy(p->tab.q + s * T, save, (size_t)T * sizeof(double));
          p->tab.seen[s] = seen;
        }
      }
    }
    if (!improved || rc != 0) break;
  }
  free(ks.k);
  return rc;
}

/* Distillation (ED-Batch §5.3 calls the FSM "a time-efficient distiller"
 * of the sufficient-condition heuristic): schedule the sample with that
 * heuristic and, in each state, favour the action it took most often. A
 * second starting point for polish() beside the Q-learned table. */
static int distill(cn_qtab *t, cn_fsm_encoding enc, cn_frontier *fs, int nf,
                   int32_t *out) {
  for (int i = 0; i < nf; i++) {
    cn_frontier *f = &fs[i];
    if (cn__frontier_reset(f)) return CN_E_NOMEM;
    while (f->n_done < f->nv) {
      int a = cn__frontier_next(f, CN_POLICY_SUFFICIENT, NULL);
      int64_t s = cn__qtab_get(t, cn__fsm_state(enc, f));
      if (s < 0) return CN_E_NOMEM;
      t->seen[s] |= (uint8_t)(1u << a);
      t->q[s * t->n_types + a] += 1.0; /* a vote */
      if (cn__frontier_commit(f, a, out) <= 0) return CN_E_INTERNAL;
    }
  }
  return 0;
}

/* The options, defaulted when NULL, with nstep and eval_every at least 1. */
static void read_opts(const cn_fsm_opts *opts, cn_fsm_opts *o) {
  if (opts == NULL) cn_fsm_opts_default(o); else *o = *opts;
  if (o->nstep < 1) o->nstep = 1;
  if (o->eval_every < 1) o->eval_every = 1;
}

/* What the policy file says it was trained for: the family, its type
 * names and the model key of the encoding. */
static void name_model(cn_fsm *p, const cn_model *m, cn_fsm_encoding enc) {
  snprintf(p->family, sizeof(p->family), "%s", m->fam->name);
  for (int t = 0; t < m->fam->n_types; t++)
    snprintf(p->type_names[t], sizeof(p->type_names[t]), "%s",
             m->fam->type_names[t]);
  p->key = cn__fsm_model_key(m, enc);
}

/* One frontier per training graph, counted into p->st (lower bound,
 * vertices); *nf says how many to free, *maxv the largest graph. */
static int init_frontiers(cn_fsm *p, const cn_graph_set *train,
                          cn_fsm_encoding enc, cn_frontier *fs, int *nf,
                          int32_t *maxv) {
  int T = p->n_types, ng = cn_graph_set_count(train), rc;
  cn_fsm_stats *st = &p->st;
  for (*nf = 0; *nf < ng; ++*nf) {
    cn_frontier *f = &fs[*nf];
    cn_dag g;
    int64_t lb;
    cn__graph_set_get(train, *nf, &g, &lb);
    if ((rc = cn__frontier_init(f, T, true)) != 0 ||
        (rc = cn__frontier_add_dag(f, &g)) != 0 ||
        /* Only E_bound reads the drops; the other encodings skip the
         * look-ahead upkeep on every commit of every episode. */
        (enc == CN_FSM_ENC_BOUND && (rc = cn__frontier_tails(f)) != 0)) {
      ++*nf;
      return rc;
    }
    st->lower_bound += lb;
    st->vertices += g.nv;
    if (g.nv > *maxv) *maxv = g.nv;
  }
  return 0;
}

/* The baselines on the sample (also the describe() numbers); -1 when one
 * could not be computed. */
static int baselines(const cn_graph_set *train, cn_fsm_stats *st) {
  st->agenda = cn_graph_set_batches(train, CN_POLICY_AGENDA, NULL, NULL);
  st->depth = cn_graph_set_batches(train, CN_POLICY_DEPTH, NULL, NULL);
  st->sufficient = cn_graph_set_batches(train, CN_POLICY_SUFFICIENT, NULL,
                                        NULL);
  st->lookahead = cn_graph_set_batches(train, CN_POLICY_LOOKAHEAD, NULL,
                                       NULL);
  st->lookahead2 = cn_graph_set_batches(train, CN_POLICY_LOOKAHEAD2, NULL,
                                        NULL);
  if (st->agenda < 0 || st->depth < 0 || st->sufficient < 0 ||
      st->lookahead < 0 || st->lookahead2 < 0)
    return -1;
  return 0;
}

/* The Q-learning (file comment): episodes over the sample in turn, ε
 * decaying, the greedy table evaluated every eval_every episodes and kept
 * in *best when it needs fewer batches. Stops at the lower bound, after
 * o->iterations episodes or at o->time_limit_s from t0. */
static int learn(cn_fsm *p, cn_frontier *fs, int nf, const cn_fsm_opts *o,
                 step *w, int32_t *scratch, cn_qtab *best, double t0) {
  cn_fsm_stats *st = &p->st;
  int rc;
  /* The empty table is the agenda policy: the first best. */
  st->fsm = evaluate(p, fs, nf, scratch, NULL);
  if (st->fsm < 0) return CN_E_NOMEM;
  if ((rc = cn__qtab_copy(best, &p->tab)) != 0) return rc;
  rng g = {o->seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull};
  int it = 0;
  while (it < o->iterations && st->fsm > st->lower_bound) {
    double frac = o->iterations > 1 ? (double)it / (o->iterations - 1) : 1.0;
    double eps = o->epsilon_start + (o->epsilon_end - o->epsilon_start) * frac;
    if ((rc = episode(&p->tab, &fs[it % nf], o, eps, &g, w, scratch)) != 0)
      return rc;
    it++;
    bool timeout = o->time_limit_s > 0 && cn_now_s() - t0 > o->time_limit_s;
    if (it % o->eval_every == 0 || it == o->iterations || timeout) {
      long long b = evaluate(p, fs, nf, scratch, NULL);
      if (b < 0) return CN_E_NOMEM;
      if (b < st->fsm) {
        st->fsm = b;
        st->best_iteration = it;
        if ((rc = cn__qtab_copy(best, &p->tab)) != 0) return rc;
      }
    }
    if (timeout) break;
  }
  st->iterations = it;
  return 0;
}

/* The distilled table, when it beats the learned one on the sample. */
static int try_distilled(cn_fsm *p, cn_fsm_encoding enc, cn_frontier *fs,
                         int nf, int32_t *scratch) {
  int rc = 0;
  cn_fsm *d = cn__fsm_new(p->n_types, enc);
  if (d == NULL || (rc = distill(&d->tab, enc, fs, nf, scratch))) {
    cn_fsm_free(d);
    return rc ? rc : CN_E_NOMEM;
  }
  long long b = evaluate(d, fs, nf, scratch, NULL);
  if (b >= 0 && b < p->st.fsm) {
    cn_qtab x = p->tab;
    p->tab = d->tab;
    d->tab = x;
    p->st.fsm = b;
    p->st.distilled = 1;
  }
  cn_fsm_free(d);
  return 0;
}

/* Never worse than the heuristics on the sample, so that learning a
 * policy never costs batches against the built-in ones: execute
 * whichever launches fewest batches there (ties keep the FSM, then the
 * order lookahead2, lookahead, sufficient, agenda, depth). */
static void choose_fallback(cn_fsm *p) {
  const cn_fsm_stats *st = &p->st;
  long long fb[5] = {st->lookahead2, st->lookahead, st->sufficient,
                     st->agenda, st->depth},
            win = st->fsm;
  const cn_policy_kind fk[5] = {CN_POLICY_LOOKAHEAD2, CN_POLICY_LOOKAHEAD,
                                CN_POLICY_SUFFICIENT, CN_POLICY_AGENDA,
                                CN_POLICY_DEPTH};
  for (int i = 0; i < 5; i++)
    if (fb[i] < win) {
      win = fb[i];
      p->executes = fk[i];
    }
}

/* The steps in order: frontiers and baselines of the sample, Q-learning,
 * then, while above the lower bound, the distilled table and polish, and
 * last the fallback to a heuristic that beats the table. */
int cn_fsm_train(const cn_model *m, const cn_graph_set *train,
                 const cn_fsm_opts *opts, cn_fsm **out, cn_err *err) {
  int rc = CN_E_NOMEM, nf = 0;
  cn_fsm_opts o;
  read_opts(opts, &o);
  int T = m->fam->n_types, ng = cn_graph_set_count(train);
  cn_frontier *fs = NULL;
  int32_t *scratch = NULL;
  step *w = NULL;
  cn_qtab best = {0};
  *out = NULL;
  cn_fsm *p = cn__fsm_new(T, o.encoding);
  if (p == NULL) goto fail_rc;
  if (cn__graph_set_n_types(train) != T || ng == 0 ||
      o.encoding < 0 || o.encoding >= CN_FSM_ENC__COUNT) {
    rc = cn_err_set(err, CN_E_INTERNAL,
                    ng == 0 ? "no training graphs (empty input?)"
                            : "training graphs do not fit model %s",
                    m->fam->name);
    goto out;
  }
  double t0 = cn_now_s();
  name_model(p, m, o.encoding);
  cn_fsm_stats *st = &p->st;
  st->graphs = ng;
  int32_t maxv = 1;
  fs = calloc((size_t)ng, sizeof(*fs));
  w = calloc((size_t)o.nstep, sizeof(*w));
  if (fs == NULL || w == NULL) goto fail_rc;
  if ((rc = init_frontiers(p, train, o.encoding, fs, &nf, &maxv)) != 0)
    goto out;
  scratch = malloc((size_t)maxv * sizeof(int32_t));
  if (scratch == NULL) goto fail_rc;
  if (baselines(train, st) != 0) goto fail_rc;
  if ((rc = learn(p, fs, nf, &o, w, scratch, &best, t0)) != 0) goto out;
  cn__qtab_free(&p->tab);
  p->tab = best;
  memset(&best, 0, sizeof(best));
  if (st->fsm > st->lower_bound &&
      (rc = try_distilled(p, o.encoding, fs, nf, scratch)) != 0)
    goto out;
  if (st->fsm > st->lower_bound && o.polish_rounds > 0 &&
      (rc = polish(p, fs, nf, scratch, o.polish_rounds, &st->fsm)) != 0)
    goto out;
  if (o.fallback) choose_fallback(p);
  st->seconds = cn_now_s() - t0;
  rc = 0;
  goto out;
fail_rc:
  rc = CN_E_NOMEM;
out:
  if (rc != 0 && err != NULL && err->code == 0)
    cn_err_set(err, rc, "could not train a batching policy (%s)",
               cn_err_default_msg(rc));
  for (int i = 0; i < nf; i++) cn__frontier_free(&fs[i]);
  free(fs);
  free(w);
  free(scratch);
  cn__qtab_free(&best);
  if (rc != 0) {
    cn_fsm_free(p);
    return rc;
  }
  *out = p;
  return 0;
}
