/* decode.c - continuous decoding (continuous-decoding true): a worker runs
 * a closed lstm-nmt run as a core decode session (cn_decode) and keeps it
 * open to the model's later runs.
 *
 * Between two steps of its session the worker takes, from the job queue,
 * the runs of the same model version that fit the size bounds
 * (max-instances and max-vertices count the requests still decoding), and
 * adds their instances: their encoders run at the next step, then their
 * decoders. A request is answered as soon as its last instance emits
 * </s> or reaches its cap: its answer goes back to the loop in a job of
 * its own, while the session goes on. While a session takes joins, the
 * loop closes the model's window at the end of each loop turn
 * (CN__CLOSE_JOIN in window.c), so a newcomer waits for the next step,
 * not for max-delay-us.
 *
 * A session's graph bookkeeping grows with every instance it ever took
 * (core/run/run_decode.c), so past EPOCH_VERTICES it stops taking joins,
 * finishes what it holds and ends; the queue then starts a fresh one. It
 * stops taking joins too as soon as the queue holds a run it cannot take
 * (another model's, or a newer version's): its worker then serves the
 * queue in order once the session's instances are done.
 *
 * The session's runs (the first and every one it took) go back to the
 * loop when it ends; their requests answered early are skipped there (they
 * are no longer waiting). Every instance reads only its own states and the
 * CPU backend computes a row alike in any batch, so the answers equal
 * whole-run decoding bit for bit (tests/test_decode.c, test_serve_ops.c).
 */
#include <stdlib.h>
#include <string.h>

#include "work.h"

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

/* Past this many vertices a session takes no more joins. */
#define EPOCH_VERTICES (1 << 19)

typedef struct dreq {
  cn__req *r;
  int left;          /* instances still decoding */
  double t_join;
  long long b_join;  /* session batches when it joined */
  json_t *outs;      /* its outputs, filled as instances finish */
} dreq;

typedef struct session {
  cn__server *s;
  cn__model_entry *me;
  cn_decode *d;
  cn__job **jobs;     /* every run taken, the first included */
  int n_jobs, cap_jobs;
  dreq *reqs;
  int n_reqs, cap_reqs;
  int *owner;         /* per slot: its request (index into reqs) */
  int *owner_k;       /* per slot: its instance index in the request */
  int cap_owner;
  int active_inst;    /* instances of requests not yet answered */
  size_t active_vertices;
  int joined, early;
  bool accepting;
} session;

bool cn__decode_wants(cn__server *s, const cn__job *j) {
  return s->cfg.serve.continuous_decoding && cn_model_decodes(j->me->model);
}

static int grow(void **p, int *cap, int need, size_t elem) {
  if (need <= *cap) return 0;
  int c = *cap ? *cap * 2 : 64;
  while (c < need) c *= 2;
  void *q = realloc(*p, (size_t)c * elem);
  if (q == NULL) return -1;
  *p = q;
  *cap = c;
  return 0;
}

/* The request's answer, in the envelope of worker.c's (answer_parts.c), v2's
 * too; stats.batches: the session's batches while the request was in it. */
static char *format(session *ss, dreq *q, double now, int *status) {
  cn__req *r = q->r;
  json_t *outs = q->outs;
  q->outs = NULL;
  *status = 200;
  r->compute_ms = (now - q->t_join) * 1e3;
  cn__answer_stats st = {
      .queue_ms = r->queue_ms, .compute_ms = r->compute_ms,
      .batches = cn_decode_batches(ss->d) - q->b_join, .lower_bound = 0,
      .continuous = true,
      .run = ss->jobs[0]->id, /* the session's number: its first run's */
      .run_requests = -1};
  if (r->v2)
    return cn__kserve_answer(r, ss->me, outs, cn__answer_stats_json(&st, r),
                             status);
  cn_buf b = {0};
  cn__answer_head(&b, ss->me);
  for (size_t i = 0; i < json_array_size(outs); i++) {
    if (i > 0) cn_buf_puts(&b, ",");
    cn_buf_json(&b, json_array_get(outs, i));
  }
  cn__answer_tail(&b, &st, r);
  json_decref(outs);
  if (b.failed) cn_buf_free(&b);
  return b.p;
}

/* Hands one request back to the loop now, in a job of its own (its run's
 * job still holds it; the loop skips it there). */
static void answer_now(session *ss, cn__req *r) {
  cn__job *t = calloc(1, sizeof(*t));
  cn__req **reqs = t ? malloc(sizeof(*reqs)) : NULL;
  if (reqs == NULL) { /* no memory: answered when the session ends */
    free(t);
    return;
  }
  t->me = ss->me;
  t->slot = ss->me->slot;
  atomic_fetch_add(&t->me->refs, 1);
  atomic_fetch_add(&r->refs, 1);
  reqs[0] = r;
  t->reqs = reqs;
  t->n = t->cap = 1;
  t->instances = r->n_inst;
  t->vertices = r->vertices;
  cn__jobs_done(ss->s, t);
}

static void fail_request(dreq *q, const cn_err *err) {
  cn__req *r = q->r;
  json_t *e = cn_err_to_json(err);
  free(r->result);
  r->result = json_dumps(e, DUMP_FLAGS);
  r->result_status = cn_err_http_status(err->code);
  json_decref(e);
  json_decref(q->outs);
  q->outs = NULL;
  q->left = 0;
}

/* Adds the live requests of j to the session (j is the session's now). */
static int take_job(session *ss, cn__job *j, cn_err *err) {
  cn__server *s = ss->s;
  if (grow((void **)&ss->jobs, &ss->cap_jobs, ss->n_jobs + 1,
           sizeof(*ss->jobs)))
    return cn_err_set(err, CN_E_NOMEM, "no memory for the session");
  ss->jobs[ss->n_jobs++] = j;
  double now = cn_now_s();
  bool in_flight = cn_decode_batches(ss->d) > 0 && cn_decode_active(ss->d) > 0;
  int dropped = 0;
  for (int i = 0; i < j->n; i++) {
    cn__req *r = j->reqs[i];
    if (atomic_load(&r->cancelled)) {
      dropped += r->n_inst;
      continue;
    }
    if (grow((void **)&ss->reqs, &ss->cap_reqs, ss->n_reqs + 1,
             sizeof(*ss->reqs)))
      return cn_err_set(err, CN_E_NOMEM, "no memory for the session");
    dreq *q = &ss->reqs[ss->n_reqs++];
    memset(q, 0, sizeof(*q));
    q->r = r;
    q->t_join = now;
    q->b_join = cn_decode_batches(ss->d);
    q->outs = json_array();
    r->queue_ms = (now - r->t_arrive) * 1e3;
    cn__metrics_queue_wait(&s->metrics, ss->me->index, now - r->t_arrive);
    for (int k = 0; k < r->n_inst; k++) {
      json_array_append_new(q->outs, json_null());
      int slot = cn_decode_add(ss->d, r->inst[k], r->flags,
                               r->max_decode_len);
      if (slot < 0)
        return cn_err_set(err, slot, "could not add instance %d", k);
      if (grow((void **)&ss->owner, &ss->cap_owner, slot + 1, sizeof(int)))
        return cn_err_set(err, CN_E_NOMEM, "no memory for the session");
      ss->owner_k = realloc(ss->owner_k, (size_t)ss->cap_owner * sizeof(int));
      if (ss->owner_k == NULL)
        return cn_err_set(err, CN_E_NOMEM, "no memory for the session");
      ss->owner[slot] = ss->n_reqs - 1;
      ss->owner_k[slot] = k;
      q->left++;
    }
    ss->active_inst += r->n_inst;
    ss->active_vertices += r->vertices;
    if (in_flight) ss->joined += r->n_inst;
  }
  if (dropped > 0) cn__metrics_dropped(&s->metrics, dropped, 0, 0);
  return 0;
}

static void stop_accepting(session *ss) {
  if (!ss->accepting) return;
  ss->accepting = false;
  atomic_fetch_sub(&ss->me->slot->decoding, 1);
}

/* Takes the queued runs of the session's model version that fit, in
 * queue order: the first of them that does not fit stops the scan (the
 * ones behind it do not overtake it). A queued run the session cannot
 * take (another model, or another version of this one) ends the joins:
 * every worker is busy, or it would not be queued, and a session fed by
 * its own model's traffic would keep this worker from it for an epoch. */
static int take_queued(session *ss, cn_err *err) {
  cn__server *s = ss->s;
  const cn_serve_config *sc = &s->cfg.serve;
  if (cn_decode_vertices(ss->d) >= EPOCH_VERTICES) {
    stop_accepting(ss);
    return 0;
  }
  bool foreign;
  int inst = ss->active_inst;
  size_t verts = ss->active_vertices;
  cn__job *got = cn__jobs_take_joins(s, ss->me, &inst, &verts,
                                     sc->max_instances,
                                     (size_t)sc->max_vertices, &foreign);
  if (foreign) stop_accepting(ss);
  int rc = 0;
  while (got != NULL) {
    cn__job *j = got;
    got = j->next;
    j->next = NULL;
    atomic_fetch_sub(&s->waiting_instances, j->instances);
    if (rc == 0) rc = take_job(ss, j, err);
    else if (grow((void **)&ss->jobs, &ss->cap_jobs, ss->n_jobs + 1,
                  sizeof(*ss->jobs)) == 0)
      ss->jobs[ss->n_jobs++] = j; /* answered with the error at the end */
    else
      cn__jobs_done(s, j); /* answered "no result" by the loop */
  }
  return rc;
}

/* Outputs of the slots that finished; answers the requests they complete. */
static void collect(session *ss) {
  int done[128], n;
  while ((n = cn_decode_take_done(ss->d, done, 128)) > 0) {
    double now = cn_now_s();
    for (int i = 0; i < n; i++) {
      dreq *q = &ss->reqs[ss->owner[done[i]]];
      json_t *o = cn_decode_output(ss->d, done[i]);
      if (q->outs == NULL) { /* failed already */
        json_decref(o);
        continue;
      }
      cn_err err;
      cn_err_clear(&err);
      if (cn_output_check(o, &err) != 0) { /* as worker.c's format_answer */
        int k = ss->owner_k[done[i]];
        char msg[sizeof(err.msg)];
        snprintf(msg, sizeof(msg), "instance %d: %.280s", k, err.msg);
        snprintf(err.msg, sizeof(err.msg), "%s", msg);
        err.instance = k;
        json_decref(o);
        CN_LOG(CN_LOG_ERROR, "msg=non-finite-output model=%s version=%s "
               "error=\"%s\"", ss->me->name, ss->me->version, err.msg);
        cn__req *r = q->r;
        fail_request(q, &err);
        ss->active_inst -= r->n_inst;
        ss->active_vertices -= r->vertices;
        answer_now(ss, r);
        continue;
      }
      json_array_set_new(q->outs, (size_t)ss->owner_k[done[i]],
                         o ? o : json_null());
      if (--q->left > 0) continue;
      cn__req *r = q->r;
      r->result = format(ss, q, now, &r->result_status);
      cn__answer_compress(r);
      ss->active_inst -= r->n_inst;
      ss->active_vertices -= r->vertices;
      if (cn_decode_active(ss->d) > 0) ss->early += r->n_inst;
      answer_now(ss, r);
    }
  }
}

void cn__decode_job(cn__server *s, cn_backend_ctx *bk, cn__job *j) {
  session ss = {.s = s, .me = j->me, .accepting = true};
  cn_err err;
  cn_err_clear(&err);
  cn_fsm *fsm = NULL;
  if (s->policy == CN_POLICY_FSM) {
    pthread_mutex_lock(&j->me->pol.mu);
    fsm = j->me->pol.fsm ? cn_fsm_retain(j->me->pol.fsm) : NULL;
    pthread_mutex_unlock(&j->me->pol.mu);
  }
  atomic_fetch_add(&ss.me->slot->decoding, 1);
  double t0 = cn_now_s();
  ss.d = cn_decode_new(j->me->model, bk, s->policy, fsm);
  int rc;
  if (ss.d == NULL) {
    rc = cn_err_set(&err, CN_E_NOMEM, "no memory for the decode session");
    ss.jobs = &j; /* answered below */
    ss.n_jobs = 1;
    goto failed;
  }
  cn_decode_set_layout(ss.d, s->layout);
  cn__metrics_decode(&s->metrics, 1, 0, 0);
  rc = take_job(&ss, j, &err);
  while (rc == 0) {
    if (ss.accepting && (rc = take_queued(&ss, &err)) != 0) break;
    if (cn_decode_active(ss.d) == 0) break;
    if ((rc = cn_decode_step(ss.d, &err)) < 0) break;
    rc = 0;
    collect(&ss);
  }
failed:
  stop_accepting(&ss);
  if (rc != 0) {
    CN_LOG(CN_LOG_ERROR, "msg=decode-failed model=%s code=%s error=\"%s\"",
           j->me->name, cn_err_code(err.code), err.msg);
    for (int i = 0; i < ss.n_reqs; i++)
      if (ss.reqs[i].outs != NULL) fail_request(&ss.reqs[i], &err);
    /* requests of runs taken but not added get the error too; those
     * answered already are the loop's now */
    for (int k = 0; k < ss.n_jobs; k++)
      for (int i = 0; i < ss.jobs[k]->n; i++) {
        cn__req *r = ss.jobs[k]->reqs[i];
        bool known = false;
        for (int m = 0; m < ss.n_reqs && !known; m++)
          known = ss.reqs[m].r == r;
        if (known || atomic_load(&r->cancelled)) continue;
        dreq q = {.r = r};
        fail_request(&q, &err);
      }
  }
  if (ss.d != NULL) {
    cn_run_stats st;
    cn_decode_get_stats(ss.d, &st);
    double sec = cn_now_s() - t0;
    cn__metrics_run(&s->metrics, ss.me->index, st.instances, 0, sec, 0, 0,
                    st.batches, st.lower_bound, st.vertices, st.kernels,
                    st.gather_bytes, st.cell_bytes, st.arena_bytes);
    cn__metrics_decode(&s->metrics, 0, ss.joined, ss.early);
    j->st = st;
    j->compute_ms = sec * 1e3;
  }
  cn_decode_free(ss.d);
  cn_fsm_free(fsm);
  /* the first run goes back through worker_main; the others from here */
  for (int k = 0; k < ss.n_jobs; k++)
    if (ss.jobs[k] != j) cn__jobs_done(s, ss.jobs[k]);
  for (int i = 0; i < ss.n_reqs; i++) json_decref(ss.reqs[i].outs);
  if (ss.jobs != &j) free(ss.jobs);
  free(ss.reqs);
  free(ss.owner);
  free(ss.owner_k);
}
