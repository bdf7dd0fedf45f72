/* learned_policy.c - learned FSM batching policies in the daemon (ED-Batch §2),
 * per model:
 *
 *   start-up   cn_policy_cache_load only (a file read: never trains). A HIT
 *              is served at once; a MISS, STALE or CORRUPT file is logged
 *              as a warning naming the file and the reason, and the model
 *              is served with the agenda fallback (CN_POLICY_FSM with no
 *              policy object) until the retrainer learns one.
 *   workers    take a reference to the policy in use under `pol.mu` (a
 *              pointer copy and an atomic increment), execute, drop it;
 *              then copy the run's typed DAG into the reservoir under
 *              `pol.rmu` (O(vertices)), with a trylock: when the retrainer
 *              is snapshotting, the worker skips that one graph instead of
 *              waiting on a SCHED_IDLE thread.
 *   retrainer  one low-priority thread (SCHED_IDLE where permitted, else
 *              nice 19) wakes every retrain-interval-s; for each model
 *              whose reservoir holds at least retrain-min-graphs graphs
 *              and has new ones, it snapshots the reservoir under `rmu`
 *              (shares the immutable graphs, O(capacity)), trains with no
 *              lock held (cn_fsm_train, time limit 2 s), and swaps the
 *              pointer under `mu` only when the candidate launches fewer
 *              batches on the snapshot than the policy in use. A swapped
 *              policy is stored in the policy cache. Workers holding the
 *              old policy keep it alive through their reference.
 *
 * The reservoir is cn_graph_set's ring: the most recent reservoir-graphs
 * run graphs (FIFO), so the policy follows the traffic as it drifts.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "work.h"

#define RETRAIN_TIME_LIMIT_S 2.0

static const char *cache_dir(cn__server *s) {
  return s->cfg.serve.policy_cache[0] ? s->cfg.serve.policy_cache : NULL;
}

static cn_fsm_encoding encoding(cn__server *s) {
  cn_fsm_encoding e = CN_FSM_ENC_BOUND;
  cn_fsm_encoding_parse(s->cfg.serve.encoding, &e);
  return e;
}

/* Numbers a cached policy brings along (its training sample's). */
static void from_describe(cn__policy *p) {
  json_t *d = cn_fsm_describe(p->fsm);
  json_t *b = json_object_get(d, "batches");
  p->batches = cn_fsm_train_batches(p->fsm, &p->lower_bound);
  json_t *ag = json_object_get(b, "agenda");
  p->agenda_batches = json_is_integer(ag) ? json_integer_value(ag) : -1;
  p->evaluated_on =
      (int)json_integer_value(json_object_get(d, "trained_on_graphs"));
  json_decref(d);
}

void cn__policy_init(cn__server *s, cn__model_entry *me) {
  cn__policy *p = &me->pol;
  pthread_mutex_init(&p->mu, NULL);
  pthread_mutex_init(&p->rmu, NULL);
  p->agenda_batches = -1;
  if (s->policy != CN_POLICY_FSM) return;
  const cn_serve_config *sc = &s->cfg.serve;
  char path[4096] = "?";
  cn_policy_cache_path(me->model, cache_dir(s), path, sizeof(path));
  cn_err err;
  cn_err_clear(&err);
  double t0 = cn_now_s();
  int st = cn_policy_cache_load(me->model, cache_dir(s), encoding(s), &p->fsm,
                                &err);
  double ms = (cn_now_s() - t0) * 1e3;
  if (st == CN_CACHE_HIT) {
    p->source = "cache";
    from_describe(p);
    CN_LOG(CN_LOG_INFO, "msg=policy-loaded model=%s file=\"%s\" "
           "encoding=%s batches=%lld lower_bound=%lld load_ms=%.2f",
           me->name, path, sc->encoding, p->batches, p->lower_bound, ms);
  } else {
    static const char *const why[] = {"hit", "miss", "stale", "corrupt"};
    p->fsm = NULL;
    p->source = "agenda-fallback";
    CN_LOG(CN_LOG_WARN, "msg=policy-not-cached model=%s file=\"%s\" "
           "status=%s reason=\"%s\" serving=agenda-fallback retrain=%s",
           me->name, path, st >= 0 && st <= 3 ? why[st] : "error", err.msg,
           sc->retrain_interval_s > 0 ? "online" : "off");
  }
  if (sc->retrain_interval_s > 0)
    p->reservoir = cn_graph_set_new(cn_model_n_types(me->model),
                                    sc->reservoir_graphs);
}

json_t *cn__policy_describe(cn__server *s, cn__model_entry *me) {
  cn__policy *p = &me->pol;
  if (s->policy != CN_POLICY_FSM) {
    json_t *o = json_object();
    json_object_set_new(o, "kind", json_string(cn_policy_name(s->policy)));
    return o;
  }
  pthread_mutex_lock(&p->mu); /* copy, then build the JSON unlocked */
  cn__policy c = *p;
  cn_fsm *f = p->fsm ? cn_fsm_retain(p->fsm) : NULL;
  pthread_mutex_unlock(&p->mu);
  p = &c;
  p->fsm = f;
  json_t *o = p->fsm ? cn_fsm_describe(p->fsm) : json_object();
  json_t *tb = json_object_get(o, "batches");
  if (tb != NULL) json_object_set(o, "train_batches", tb);
  json_object_set_new(o, "kind", json_string("fsm"));
  if (p->fsm == NULL) {
    json_object_set_new(o, "encoding", json_string(s->cfg.serve.encoding));
    json_object_set_new(o, "executes", json_string("agenda"));
    json_object_set_new(o, "trained_on_graphs", json_integer(0));
  }
  json_object_set_new(o, "source", json_string(p->source));
  json_object_set_new(o, "batches", p->evaluated_on > 0
                                        ? json_integer(p->batches)
                                        : json_null());
  json_object_set_new(o, "lower_bound", p->evaluated_on > 0
                                            ? json_integer(p->lower_bound)
                                            : json_null());
  json_object_set_new(o, "agenda_batches",
                      p->agenda_batches >= 0
                          ? json_integer(p->agenda_batches)
                          : json_null());
  json_object_set_new(o, "evaluated_on_graphs", json_integer(p->evaluated_on));
  json_object_set_new(o, "swaps", json_integer(p->swaps));
  json_t *rt = json_object();
  json_object_set_new(rt, "interval_s",
                      json_integer(s->cfg.serve.retrain_interval_s));
  json_object_set_new(rt, "swapped", json_integer(p->retrains[0]));
  json_object_set_new(rt, "kept", json_integer(p->retrains[1]));
  json_object_set_new(rt, "failed", json_integer(p->retrains[2]));
  json_object_set_new(rt, "last_train_seconds", json_real(p->last_train_s));
  cn_fsm_free(f);
  p = &me->pol;
  pthread_mutex_lock(&p->rmu);
  json_object_set_new(rt, "reservoir_graphs",
                      json_integer(p->reservoir
                                       ? cn_graph_set_count(p->reservoir)
                                       : 0));
  pthread_mutex_unlock(&p->rmu);
  json_object_set_new(o, "retrain", rt);
  return o;
}

int cn__policy_exec(cn__server *s, cn__model_entry *me, cn_run *run,
                    cn_err *err) {
  if (s->policy != CN_POLICY_FSM) return cn_run_exec(run, s->policy, err);
  cn__policy *p = &me->pol;
  pthread_mutex_lock(&p->mu);
  cn_fsm *f = p->fsm ? cn_fsm_retain(p->fsm) : NULL;
  pthread_mutex_unlock(&p->mu);
  int rc = f ? cn_run_exec_fsm(run, f, err)
             : cn_run_exec(run, CN_POLICY_FSM, err); /* agenda */
  cn_fsm_free(f);
  return rc;
}

void cn__policy_observe(cn__server *s, cn__model_entry *me,
                        const cn_run *run) {
  cn__policy *p = &me->pol;
  if (p->reservoir == NULL) return;
  /* trylock: a worker never waits for the (low-priority) retrainer's
   * snapshot; losing one graph of a sample is harmless */
  if (pthread_mutex_trylock(&p->rmu) != 0) return;
  if (cn_graph_set_add_run(p->reservoir, run) == 0) p->added++;
  pthread_mutex_unlock(&p->rmu);
}

/* ---- the retrainer ------------------------------------------------------ */

static void count(cn__server *s, cn__model_entry *me, int result) {
  cn__metrics_retrain(&s->metrics, me->index, result);
}

static void retrain_one(cn__server *s, cn__model_entry *me) {
  cn__policy *p = &me->pol;
  const cn_serve_config *sc = &s->cfg.serve;
  pthread_mutex_lock(&p->rmu);
  int n = cn_graph_set_count(p->reservoir);
  if (n < sc->retrain_min_graphs || p->added == p->trained_at) {
    pthread_mutex_unlock(&p->rmu);
    return; /* too few graphs, or nothing new since the last round */
  }
  cn_graph_set *snap = cn_graph_set_snapshot(p->reservoir);
  p->trained_at = p->added;
  long long seed = p->added;
  pthread_mutex_unlock(&p->rmu);

  cn_err err;
  cn_err_clear(&err);
  cn_fsm *cand = NULL, *cur = NULL;
  cn_fsm_opts o;
  cn_fsm_opts_default(&o);
  o.encoding = encoding(s);
  o.time_limit_s = RETRAIN_TIME_LIMIT_S;
  o.seed = (uint64_t)seed;
  double t0 = cn_now_s();
  int rc = snap == NULL ? cn_err_set(&err, CN_E_NOMEM, "no memory")
                        : cn_fsm_train(me->model, snap, &o, &cand, &err);
  double train_s = cn_now_s() - t0;
  long long lb = 0, before = -1, after = -1, agenda = -1;
  if (rc == 0) {
    pthread_mutex_lock(&p->mu);
    cur = p->fsm ? cn_fsm_retain(p->fsm) : NULL;
    pthread_mutex_unlock(&p->mu);
    before = cn_graph_set_batches(snap, CN_POLICY_FSM, cur, &lb);
    after = cn_graph_set_batches(snap, CN_POLICY_FSM, cand, NULL);
    agenda = cn_graph_set_batches(snap, CN_POLICY_AGENDA, NULL, NULL);
    if (before < 0 || after < 0)
      rc = cn_err_set(&err, CN_E_INTERNAL, "cannot evaluate on the snapshot");
  }
  if (rc != 0) {
    CN_LOG(CN_LOG_WARN, "msg=policy-retrain-failed model=%s graphs=%d "
           "error=\"%s\"", me->name, n, err.msg);
    pthread_mutex_lock(&p->mu);
    p->retrains[CN__RETRAIN_FAILED]++;
    pthread_mutex_unlock(&p->mu);
    count(s, me, CN__RETRAIN_FAILED);
    goto out;
  }
  bool swap = after < before;
  cn_fsm *old = NULL, *keep = swap ? cn_fsm_retain(cand) : NULL;
  pthread_mutex_lock(&p->mu);
  if (swap) {
    old = p->fsm;
    p->fsm = cand;
    cand = NULL;
    p->source = "online";
    p->swaps++;
  }
  p->batches = swap ? after : before;
  p->agenda_batches = agenda;
  p->lower_bound = lb;
  p->evaluated_on = cn_graph_set_count(snap);
  p->last_train_s = train_s;
  p->retrains[swap ? CN__RETRAIN_SWAPPED : CN__RETRAIN_KEPT]++;
  pthread_mutex_unlock(&p->mu);
  count(s, me, swap ? CN__RETRAIN_SWAPPED : CN__RETRAIN_KEPT);
  cn_fsm_free(old); /* workers still running with it hold their own ref */
  if (swap) {
    cn_err serr;
    cn_err_clear(&serr);
    char path[4096] = "?";
    cn_policy_cache_path(me->model, cache_dir(s), path, sizeof(path));
    int src = cn_policy_cache_store(me->model, cache_dir(s), keep, &serr);
    CN_LOG(CN_LOG_INFO, "msg=policy-swapped model=%s batches_before=%lld "
           "batches_after=%lld lower_bound=%lld agenda=%lld graphs=%d "
           "train_s=%.3f file=\"%s\" stored=%s error=%s", me->name, before,
           after, lb, agenda, n, train_s, path, src == 0 ? "yes" : "no",
           src == 0 ? "-" : serr.msg);
    cn_fsm_free(keep);
  } else {
    CN_LOG(CN_LOG_INFO, "msg=policy-kept model=%s batches_current=%lld "
           "batches_candidate=%lld lower_bound=%lld graphs=%d train_s=%.3f",
           me->name, before, after, lb, n, train_s);
  }
out:
  cn_fsm_free(cand);
  cn_fsm_free(cur);
  cn_graph_set_free(snap);
}

/* Lowest priority this thread may take: SCHED_IDLE (runs only when a core
 * would otherwise idle; allowed unprivileged on Linux), else nice 19. */
static const char *lower_priority(void) {
#ifdef SCHED_IDLE
  struct sched_param sp = {0};
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp) == 0)
    return "sched-idle";
#endif
  if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19) == 0)
    return "nice-19";
  return "normal";
}

static void *retrainer_main(void *arg) {
  cn__server *s = arg;
  pthread_setname_np(pthread_self(), "cn-retrain");
  const char *prio = lower_priority();
  CN_LOG(CN_LOG_INFO, "msg=retrainer-started interval_s=%d "
         "reservoir_graphs=%d min_graphs=%d priority=%s",
         s->cfg.serve.retrain_interval_s, s->cfg.serve.reservoir_graphs,
         s->cfg.serve.retrain_min_graphs, prio);
  pthread_mutex_lock(&s->rtmu);
  while (!s->rt_stop) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += s->cfg.serve.retrain_interval_s;
    int w = 0;
    while (!s->rt_stop && w != ETIMEDOUT)
      w = pthread_cond_timedwait(&s->rtcv, &s->rtmu, &dl);
    if (s->rt_stop) break;
    pthread_mutex_unlock(&s->rtmu);
    int n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++) {
      pthread_mutex_lock(&s->rtmu);
      bool stop = s->rt_stop;
      pthread_mutex_unlock(&s->rtmu);
      if (stop) break;
      /* the version serving now, held while it trains (a reload may
       * replace it meanwhile: the old one's policy is then simply lost) */
      cn__model_entry *me = cn__model_retain(&s->models[i]);
      if (me != NULL && me->pol.reservoir != NULL) retrain_one(s, me);
      cn__model_release(me);
    }
    pthread_mutex_lock(&s->rtmu);
  }
  pthread_mutex_unlock(&s->rtmu);
  return NULL;
}

int cn__retrainer_start(cn__server *s) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&s->rtmu, NULL);
  pthread_cond_init(&s->rtcv, &ca);
  pthread_condattr_destroy(&ca);
  if (s->policy != CN_POLICY_FSM || s->cfg.serve.retrain_interval_s <= 0)
    return 0;
  if (pthread_create(&s->rt_thread, NULL, retrainer_main, s) != 0) {
    CN_LOG(CN_LOG_WARN, "msg=retrainer-not-started error=\"%s\"",
           strerror(errno));
    return -1;
  }
  s->rt_started = true;
  return 0;
}

void cn__retrainer_signal_stop(cn__server *s) {
  if (!s->rt_started) return;
  pthread_mutex_lock(&s->rtmu);
  s->rt_stop = true;
  pthread_cond_broadcast(&s->rtcv);
  pthread_mutex_unlock(&s->rtmu);
}

/* Waits for at most the round in progress (training is capped at
 * RETRAIN_TIME_LIMIT_S per model). */
void cn__retrainer_join(cn__server *s) {
  if (!s->rt_started) return;
  cn__retrainer_signal_stop(s);
  double t0 = cn_now_s();
  pthread_join(s->rt_thread, NULL);
  s->rt_started = false;
  CN_LOG(CN_LOG_INFO, "msg=retrainer-stopped join_ms=%.1f",
         (cn_now_s() - t0) * 1e3);
}
