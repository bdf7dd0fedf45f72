/* window.c - per-model aggregation windows, admission and the hand-back
 * of finished runs. Everything here runs on the loop thread.
 *
 * A model's window opens with the first request that finds none open and
 * closes max-delay-us later, or as soon as it holds max-instances
 * instances, or just before a request would take it past max-vertices,
 * whichever comes first (the time / size bound of just-in-time batching:
 * DyNet's autobatching groups only what is there when it must compute).
 *
 * Work-conserving (the default): waiting for company only pays while every
 * worker is busy, so a request that finds a worker idle has its window
 * closed at the end of the loop turn it arrived in (a uv_check: the
 * requests that arrived in the same poll join it, at no added delay), and
 * a worker that finishes a run takes every window that gathered while it
 * computed (cn__window_on_done). Under load runs are
 * therefore as large as the load makes them, with no timer involved;
 * max-delay-us is only the most a request waits when every worker stays
 * busy. Each close is counted by reason (canopy_window_closes_total).
 *
 * With continuous-decoding, a model whose decode session takes joins has
 * its window closed at the end of the loop turn too (CN__CLOSE_JOIN): the
 * session takes the run from the queue at its next step (decode.c).
 *
 * A closed window is a run: it goes to the job queue for a worker, split
 * into one run per idle worker when workers sit idle (window_close).
 *
 * Admission bounds memory: the instances waiting in windows or in the
 * queue never exceed queue-depth; a request that would pass it is
 * answered 429 with Retry-After, before anything of it is kept.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "work.h"

int cn__retry_after_s(cn__server *s) {
  double compute_s = (double)atomic_load(&s->ewma_compute_us) / 1e6;
  int queued = cn__jobs_queued(s);
  double wait = s->cfg.serve.max_delay_us / 1e6 +
                (1.0 + (double)queued / s->n_threads) * compute_s;
  int secs = (int)ceil(wait);
  return secs < 1 ? 1 : secs > 60 ? 60 : secs;
}

/* The most runs one closing window is split into. */
#define MAX_SPLIT 64

/* Workers that would sit idle if one more run were queued now. */
static int idle_workers(cn__server *s) { return cn__jobs_idle_workers(s); }

/* Moves j's requests from index `from` on into a new run (NULL: no
 * memory, j unchanged). */
static cn__job *job_split_tail(cn__job *j, int from) {
  cn__job *t = calloc(1, sizeof(*t));
  int n = j->n - from;
  cn__req **reqs = t ? malloc((size_t)n * sizeof(*reqs)) : NULL;
  if (reqs == NULL) {
    free(t);
    return NULL;
  }
  t->me = j->me;
  t->slot = j->slot;
  atomic_fetch_add(&t->me->refs, 1); /* each run holds its version */
  t->t_open = j->t_open;
  t->id = ++j->slot->srv->runs_opened; /* a run of its own */
  t->reqs = reqs;
  t->n = t->cap = n;
  for (int i = 0; i < n; i++) { /* the run's references move with them */
    cn__req *r = j->reqs[from + i];
    reqs[i] = r;
    t->instances += r->n_inst;
    t->vertices += r->vertices;
  }
  j->n = from;
  j->instances -= t->instances;
  j->vertices -= t->vertices;
  return t;
}

/* A closed window is a run, or, when workers sit idle, up to one run per
 * idle worker of at least split-min-instances instances each, split at
 * request boundaries with the instances spread evenly. On CPU a worker
 * has one core: one run of 54 treelstm trees (H 128) computes in 4.9 ms
 * while the other core waits, two of 27 side by side in 3.4 ms. With
 * every worker busy the run goes whole: waiting for a worker, large runs
 * are what batching is for. */
static void window_close(cn__model_slot *sl, cn__close_reason why) {
  cn__job *j = sl->window;
  if (j == NULL) return;
  sl->window = NULL;
  uv_timer_stop(&sl->timer);
  cn__server *s = sl->srv;
  cn__metrics_window_close(&s->metrics, why);
  int min = s->cfg.serve.split_min_instances;
  int k = min > 0 ? j->instances / min : 1;
  if (k > j->n) k = j->n;
  if (k > 1) {
    int idle = idle_workers(s);
    if (k > idle) k = idle;
  }
  if (k > MAX_SPLIT) k = MAX_SPLIT;
  /* Part p ends at the first request where the running count reaches
   * (p + 1) / k of the instances, leaving a request for each later part;
   * the parts are cut off the back, last first, and queued as cut. */
  int cut[MAX_SPLIT], nc = 0, acc = 0;
  for (int i = 0, p = 0; k > 1 && i < j->n && p < k - 1; i++) {
    acc += j->reqs[i]->n_inst;
    if ((long long)acc * k >= (long long)(p + 1) * j->instances ||
        j->n - (i + 1) == k - 1 - p) {
      cut[nc++] = i + 1;
      p++;
    }
  }
  for (int c = nc - 1; c >= 0; c--) {
    cn__job *t = job_split_tail(j, cut[c]);
    if (t == NULL) break; /* no memory: what is left goes as one run */
    cn__jobs_push(s, t);
  }
  cn__jobs_push(s, j);
}

/* End of a loop turn in which requests arrived: windows go to the workers
 * that are idle, the models in turn (round robin). */
static void close_for_idle(cn__server *s, cn__close_reason why) {
  int n = atomic_load(&s->n_models);
  /* a model whose decode session takes joins (decode.c): its requests go
   * to the queue now, and the session adds them at its next step */
  for (int k = 0; k < n; k++)
    if (s->models[k].window != NULL && atomic_load(&s->models[k].decoding))
      window_close(&s->models[k], CN__CLOSE_JOIN);
  if (!s->cfg.serve.work_conserving || n == 0) return;
  for (int k = 0; k < n && idle_workers(s) > 0; k++) {
    cn__model_slot *sl = &s->models[(s->next_feed + k) % n];
    if (sl->window != NULL) {
      window_close(sl, why);
      s->next_feed = (sl->index + 1) % n;
    }
  }
}

static void on_idle_check(uv_check_t *c) {
  uv_check_stop(c);
  close_for_idle(c->data, CN__CLOSE_IDLE_WORKER);
}

static void on_window_timer(uv_timer_t *t) {
  window_close(t->data, CN__CLOSE_MAX_DELAY);
}

static int job_append(cn__job *j, cn__req *r) {
  if (j->n == j->cap) {
    int cap = j->cap ? j->cap * 2 : 16;
    cn__req **p = realloc(j->reqs, (size_t)cap * sizeof(*p));
    if (p == NULL) return -1;
    j->reqs = p;
    j->cap = cap;
  }
  j->reqs[j->n++] = r;
  j->instances += r->n_inst;
  j->vertices += r->vertices;
  atomic_fetch_add(&r->refs, 1); /* the run's */
  return 0;
}

static void on_timeout(uv_timer_t *t) {
  cn__window_cancel(t->data, "timeout", 504);
}

/* The timeout list's timer: every request due by now is answered 504
 * (which unlinks it, request.c), then the timer waits for the next. */
static void on_list_timeout(uv_timer_t *t) {
  cn__server *s = t->data;
  uint64_t now = uv_now(&s->loop);
  while (s->tmo_head != NULL && s->tmo_head->tmo_due <= now) {
    cn__req *r = s->tmo_head;
    cn__window_cancel(r, "timeout", 504);
    if (s->tmo_head == r) return; /* not answered: never so (a guard) */
  }
  if (s->tmo_head != NULL)
    uv_timer_start(t, on_list_timeout, s->tmo_head->tmo_due - now, 0);
}

/* r's timeout: the default timeout_ms joins the list (due in submission
 * order, so one timer serves them all), another one a timer of its own,
 * as before (it holds a reference till the timer is closed). Either is
 * due timeout_ms after now on the loop's clock, as a uv timer is. */
static void timeout_start(cn__server *s, cn__req *r) {
  if (r->timeout_ms != s->cfg.serve.timeout_ms) {
    uv_timer_init(&s->loop, &r->tmo);
    r->tmo.data = r;
    atomic_fetch_add(&r->refs, 1);
    r->tmo_open = true;
    uv_timer_start(&r->tmo, on_timeout, (uint64_t)r->timeout_ms, 0);
    return;
  }
  r->tmo_due = uv_now(&s->loop) + (uint64_t)r->timeout_ms;
  r->tmo_listed = true;
  r->tnext = NULL;
  r->tprev = s->tmo_tail;
  if (s->tmo_tail) s->tmo_tail->tnext = r;
  else s->tmo_head = r;
  s->tmo_tail = r;
  if (!uv_is_active((uv_handle_t *)&s->tmo_timer))
    uv_timer_start(&s->tmo_timer, on_list_timeout, (uint64_t)r->timeout_ms,
                   0);
}

static void full_msg(cn__server *s, int waiting, char *msg, size_t cap) {
  snprintf(msg, cap, "the queue is full (%d instances waiting, queue-depth "
           "%d); retry later", waiting, s->cfg.serve.queue_depth);
}

/* Before a request's body is parsed: a queue with no room for even one
 * instance refuses it as cn__window_submit would, and parsing the JSON
 * and building its instances only to refuse them is saved. Under
 * overload about half the requests are refused, and that parsing took
 * loop-thread time the runs' dispatch needed, lowering the goodput under
 * overload. A request that could never fit (413) hears so once the
 * queue has room. */
bool cn__window_full(cn__server *s, char *msg, size_t cap) {
  int waiting = atomic_load(&s->waiting_instances);
  if (waiting < s->cfg.serve.queue_depth) return false;
  full_msg(s, waiting, msg, cap);
  cn__metrics_overloaded(&s->metrics);
  return true;
}

void cn__window_submit(cn__server *s, cn__req *r) {
  cn__model_slot *sl = r->slot;
  const cn_serve_config *sc = &s->cfg.serve;
  r->state = CN__REQ_WAITING;
  r->wnext = s->waiting;
  r->wprev = NULL;
  if (s->waiting) s->waiting->wprev = r;
  s->waiting = r;
  if (atomic_load(&s->draining)) {
    cn__req_answer(r, 503, cn__error_body(CN_E_DRAINING,
                                          "the server is shutting down", -1),
                   "draining");
    return;
  }
  /* A request bigger than the whole queue can never be admitted: 413, so
   * that a client does not retry a 429 forever. */
  if (r->n_inst > sc->queue_depth) {
    char msg[160];
    snprintf(msg, sizeof(msg),
             "%d instances can never fit a queue of %d (queue-depth); send "
             "fewer per request",
             r->n_inst, sc->queue_depth);
    cn__req_answer(r, 413, cn__error_body(CN_E_TOO_LARGE, msg, -1),
                   "too_large");
    return;
  }
  int waiting = atomic_load(&s->waiting_instances);
  if (waiting + r->n_inst > sc->queue_depth) {
    char msg[160];
    full_msg(s, waiting, msg, sizeof(msg));
    cn__metrics_overloaded(&s->metrics);
    cn__req_answer(r, 429, cn__error_body(CN_E_OVERLOADED, msg, -1),
                   "overloaded");
    return;
  }
  if (sl->window != NULL &&
      (sl->window->vertices + r->vertices > (size_t)sc->max_vertices))
    window_close(sl, CN__CLOSE_SIZE);
  /* Runs sized by memory (docs/memory.md): a request that would take the
   * window's arena, as this model's runs have needed it per vertex, over
   * memory-budget starts a run of its own; the run is still planned under
   * the budget, which this keeps from needing extra batches. */
  long long per_k = atomic_load(&sl->arena_per_kvertex);
  if (sl->window != NULL && sc->memory_budget > 0 && per_k > 0 &&
      (long long)((sl->window->vertices + r->vertices) / 1024.0 * per_k) >
          sc->memory_budget)
    window_close(sl, CN__CLOSE_MEMORY);
  /* a window holds one version: a request for a newer one (the model was
   * reloaded meanwhile) closes the old window, which runs on its own */
  if (sl->window != NULL && sl->window->me != r->me)
    window_close(sl, CN__CLOSE_FLUSH);
  if (sl->window == NULL) {
    cn__job *j = calloc(1, sizeof(*j));
    if (j == NULL) {
      cn__req_answer(r, 500, cn__error_body(CN_E_NOMEM, "out of memory", -1),
                     "nomem");
      return;
    }
    j->me = r->me;
    j->slot = sl;
    atomic_fetch_add(&j->me->refs, 1); /* the run holds its version */
    j->t_open = cn_now_s();
    j->id = ++s->runs_opened;
    sl->window = j;
    uv_timer_start(&sl->timer, on_window_timer,
                   (uint64_t)(sc->max_delay_us / 1000), 0);
  }
  if (job_append(sl->window, r) != 0) {
    cn__req_answer(r, 500, cn__error_body(CN_E_NOMEM, "out of memory", -1),
                   "nomem");
    return;
  }
  atomic_fetch_add(&s->waiting_instances, r->n_inst);
  if (r->timeout_ms > 0) timeout_start(s, r);
  if (sl->window->instances >= sc->max_instances ||
      sl->window->vertices >= (size_t)sc->max_vertices)
    window_close(sl, CN__CLOSE_SIZE);
  else if ((sc->work_conserving || atomic_load(&sl->decoding)) &&
           !uv_is_active((uv_handle_t *)&s->idle_check))
    uv_check_start(&s->idle_check, on_idle_check);
}



/* Gives up on a waiting request (timeout, disconnect): if its run has not
 * closed yet its instances leave the window now; if the run is queued the
 * worker skips it; if it is computing the result is thrown away. */
void cn__window_cancel(cn__req *r, const char *reason, int status) {
  cn__server *s = r->srv;
  if (r->state != CN__REQ_WAITING) return;
  cn__model_slot *sl = r->slot;
  cn__job *j = sl->window;
  bool dropped = false;
  for (int i = 0; j != NULL && i < j->n; i++) {
    if (j->reqs[i] != r) continue;
    memmove(&j->reqs[i], &j->reqs[i + 1],
            (size_t)(j->n - i - 1) * sizeof(cn__req *));
    j->n--;
    j->instances -= r->n_inst;
    j->vertices -= r->vertices;
    atomic_fetch_sub(&s->waiting_instances, r->n_inst);
    dropped = true;
    if (j->n == 0) {
      sl->window = NULL;
      uv_timer_stop(&sl->timer);
      cn__job_free(j);
    }
    cn__req_unref(r); /* the run's reference */
    break;
  }
  bool disc = strcmp(reason, "disconnect") == 0;
  if (dropped)
    cn__metrics_dropped(&s->metrics, r->n_inst, disc, !disc);
  else
    cn__metrics_dropped(&s->metrics, 0, disc, !disc);
  char msg[96];
  snprintf(msg, sizeof(msg), "no result within timeout_ms %lld",
           r->timeout_ms);
  cn__req_answer(r, status,
                 disc ? NULL : cn__error_body(CN_E_TIMEOUT, msg, -1), reason);
}

/* Runs come back from the workers: answer the requests still waiting. */
void cn__window_on_done(uv_async_t *a) {
  cn__server *s = a->data;
  pthread_mutex_lock(&s->dmu);
  cn__job *lifo = s->dhead;
  s->dhead = NULL;
  pthread_mutex_unlock(&s->dmu);
  /* work-conserving: the freed workers take what gathered meanwhile
   * first, and compute it while the loop writes the answers below (the
   * other way round a worker sat idle for as long as the writes took) */
  close_for_idle(s, CN__CLOSE_WORKER_FREED);
  /* the workers push finished runs on a stack: answer them in the order
   * they finished, so a run done first is never answered after a later
   * one that came back in the same loop turn */
  cn__job *j = NULL;
  while (lifo != NULL) {
    cn__job *next = lifo->next;
    lifo->next = j;
    j = lifo;
    lifo = next;
  }
  while (j != NULL) {
    cn__job *next = j->next;
    for (int i = 0; i < j->n; i++) {
      cn__req *r = j->reqs[i];
      if (r->state == CN__REQ_WAITING) cn__req_answer_result(r);
    }
    cn__job_free(j);
    j = next;
  }
}

void cn__window_flush_all(cn__server *s) {
  int n = atomic_load(&s->n_models);
  for (int i = 0; i < n; i++) window_close(&s->models[i], CN__CLOSE_FLUSH);
}

/* Grace period over: whatever still waits is answered now. */
void cn__window_fail_waiting(cn__server *s, int code, const char *msg) {
  cn__window_flush_all(s);
  while (s->waiting != NULL)
    cn__req_answer(s->waiting, cn_err_http_status(code),
                   cn__error_body(code, msg, -1), "drain-expired");
}
