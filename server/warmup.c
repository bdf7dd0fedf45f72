/* warmup.c - a model version's warm-up before it serves (docs/daemon.md
 * "Warm-up"), so the first requests do not pay a cold start.
 *
 * A fresh worker thread has no OpenBLAS buffers, no glibc arena and no run
 * arena: the first requests made them, so a daemon that never served sat
 * 50% below its idle RSS after bursts, and its first client paid for the
 * pages. Before a version is made current (start-up before msg=ready and
 * READY=1, a reload, a load through the repository routes or the poll),
 * the thread loading it posts a warm-up and waits: every worker, not only
 * the first one free, takes its own part (one small synthetic instance of
 * the model's input kind, cn_model_warmup_instance) ahead of queued runs,
 * and executes it as a request's run is executed: same backend context,
 * policy, layout, plan width, the decode session for a decoding model.
 * The outputs are checked like an answer's: a version whose warm-up
 * computes NaN or Inf (finite weights that overflow) fails to load.
 *
 * Threads: the list s->warm and every field of a cn__warmup but `ms`
 * are under s->qmu; the loader waits on s->wcv. A worker writes its own
 * slot of `ms` only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "work.h"

struct cn__warmup {
  cn__model_entry *me;
  int n;             /* workers, each with one part                   */
  bool *taken;       /* [n]: worker i took its part                   */
  double *ms;        /* [n]: how long worker i's part took            */
  int left;          /* parts not finished                            */
  cn_err err;        /* the first part that failed (code 0: none)     */
  cn__warmup *next;
};

/* A worker's part: the synthetic instance through a run (or a decode
 * session), its output checked as format_answer checks an answer's. */
static int part(cn__server *s, cn__model_entry *me, cn_backend_ctx *bk,
                cn_err *err) {
  const cn_model *m = me->model;
  bool decodes = cn_model_decodes(m) != 0;
  json_t *j = cn_model_warmup_instance(m), *out = NULL;
  cn_instance *in = NULL;
  cn_run *run = NULL;
  cn_decode *d = NULL;
  cn_fsm *fsm = NULL;
  int rc;
  if (j == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "no memory for the instance");
    goto out;
  }
  /* The default limits, not the daemon's: they guard against what clients
   * send, and a daemon started with max-nodes 6 still serves a model
   * whose warm-up tree has more. A model whose vocabulary cannot make an
   * instance (tokens over max-token-len) is warned about and served. */
  cn_limits lim;
  cn_limits_default(&lim);
  if (cn_instance_parse(m, j, &lim, 0, &in, err) != 0) {
    CN_LOG(CN_LOG_WARN, "msg=warmup-skipped model=%s version=%s error=\"%s\"",
           me->name, me->version, err->msg);
    cn_err_clear(err);
    rc = 0;
    goto out;
  }
  /* outputs "all": a tree's output layer runs on every node */
  unsigned flags = cn_model_input(m) == CN_INPUT_TREE ? CN_OUT_ALL : 0;
  int max_len = decodes ? 8 : 0;
  if (decodes && s->cfg.serve.continuous_decoding) {
    if (s->policy == CN_POLICY_FSM) {
      pthread_mutex_lock(&me->pol.mu);
      fsm = me->pol.fsm ? cn_fsm_retain(me->pol.fsm) : NULL;
      pthread_mutex_unlock(&me->pol.mu);
    }
    d = cn_decode_new(m, bk, s->policy, fsm);
    if (d == NULL) {
      rc = cn_err_set(err, CN_E_NOMEM, "no memory for the decode session");
      goto out;
    }
    cn_decode_set_layout(d, s->layout);
    if ((rc = cn_decode_add(d, in, flags, max_len)) < 0) {
      cn_err_set(err, rc, "could not add the instance");
      goto out;
    }
    while (cn_decode_active(d) > 0)
      if ((rc = cn_decode_step(d, err)) < 0) goto out;
    int slot;
    if (cn_decode_take_done(d, &slot, 1) == 1) out = cn_decode_output(d, slot);
  } else {
    run = cn_run_new(m, bk);
    if (run == NULL) {
      rc = cn_err_set(err, CN_E_NOMEM, "no memory for the run");
      goto out;
    }
    cn_run_set_layout(run, s->layout);
    cn_run_set_plan_width(run, s->cfg.serve.plan_width);
    if ((rc = cn_run_add(run, in, flags, max_len)) < 0) {
      cn_err_set(err, rc, "could not add the instance");
      goto out;
    }
    if ((rc = cn__policy_exec(s, me, run, err)) != 0) goto out;
    out = cn_run_output(run, 0);
  }
  if (out == NULL) {
    rc = cn_err_set(err, CN_E_INTERNAL, "the instance gave no output");
    goto out;
  }
  rc = cn_output_check(out, err);
out:
  json_decref(out);
  cn_run_free(run);
  cn_decode_free(d);
  cn_fsm_free(fsm);
  cn_instance_free(in);
  json_decref(j);
  return rc;
}

cn__warmup *cn__warmup_next(cn__server *s, int worker) {
  for (cn__warmup *w = s->warm; w != NULL; w = w->next)
    if (worker < w->n && !w->taken[worker]) {
      w->taken[worker] = true;
      return w;
    }
  return NULL;
}

/* Under qmu: one part is over; the loader wakes when the last is. */
static void part_done(cn__server *s, cn__warmup *w, const cn_err *e) {
  if (e != NULL && e->code != 0 && w->err.code == 0) w->err = *e;
  if (--w->left == 0) pthread_cond_broadcast(&s->wcv);
}

void cn__warmup_part(cn__server *s, cn__warmup *w, int worker,
                     cn_backend_ctx *bk) {
  cn_err e;
  cn_err_clear(&e);
  double t0 = cn_now_s();
  if (part(s, w->me, bk, &e) != 0) {
    char msg[sizeof(e.msg)];
    snprintf(msg, sizeof(msg), "warm-up on worker %d: the synthetic %s "
             "instance: %.200s", worker,
             cn_input_kind_name(cn_model_input(w->me->model)), e.msg);
    snprintf(e.msg, sizeof(e.msg), "%s", msg);
    if (e.code == 0) e.code = CN_E_INTERNAL;
  }
  w->ms[worker] = (cn_now_s() - t0) * 1e3;
  pthread_mutex_lock(&s->qmu);
  part_done(s, w, &e);
  pthread_mutex_unlock(&s->qmu);
}

void cn__warmup_abandon(cn__server *s, int worker) {
  cn__warmup *w;
  cn_err e;
  cn_err_clear(&e);
  cn_err_set(&e, CN_E_DRAINING, "the server is shutting down");
  while ((w = cn__warmup_next(s, worker)) != NULL) part_done(s, w, &e);
}

int cn__warmup_run(cn__server *s, cn__model_entry *me, cn_err *err) {
  if (!s->cfg.serve.warmup) return 0;
  double t0 = cn_now_s();
  cn__warmup w;
  memset(&w, 0, sizeof(w));
  w.me = me;
  pthread_mutex_lock(&s->qmu);
  int n = s->n_threads;
  if (s->stopping) {
    pthread_mutex_unlock(&s->qmu);
    return cn_err_set(err, CN_E_DRAINING, "the server is shutting down");
  }
  w.taken = calloc((size_t)(n > 0 ? n : 1), sizeof(bool));
  w.ms = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (w.taken == NULL || w.ms == NULL) {
    pthread_mutex_unlock(&s->qmu);
    free(w.taken);
    free(w.ms);
    return cn_err_set(err, CN_E_NOMEM, "no memory for the warm-up");
  }
  w.n = w.left = n;
  if (n > 0) {
    w.next = s->warm;
    s->warm = &w;
    pthread_cond_broadcast(&s->qcv); /* every worker, not one */
    while (w.left > 0) pthread_cond_wait(&s->wcv, &s->qmu);
    cn__warmup **p = &s->warm;
    while (*p != &w) p = &(*p)->next;
    *p = w.next;
  }
  pthread_mutex_unlock(&s->qmu);
  int rc = 0;
  if (w.err.code != 0) {
    *err = w.err;
    rc = w.err.code;
  } else {
    char list[256] = "";
    size_t len = 0;
    for (int i = 0; i < n && len < sizeof(list) - 16; i++)
      len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%.1f",
                              i ? "," : "", w.ms[i]);
    CN_LOG(CN_LOG_INFO, "msg=model-warmed model=%s version=%s workers=%d "
           "ms=%.1f worker_ms=%s", me->name, me->version, n,
           (cn_now_s() - t0) * 1e3, len ? list : "-");
  }
  free(w.taken);
  free(w.ms);
  return rc;
}
