/* worker.c - the worker threads: each owns one backend context (a CPU
 * context, or a CUDA stream of its own) and executes closed runs from the
 * job queue in its own thread: one at a time on the CPU; on a device it
 * issues the next run before it answers the one before (overlap).
 *
 * A worker formats every answer of its run (JSON serialisation is a real
 * cost at high rates), so the loop only copies pointers. Requests that
 * were cancelled before the run started are skipped: their instances
 * never reach the engine.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "work.h"

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

typedef struct worker_arg {
  cn__server *s;
  int index;
  cn_backend_ctx *bk;
  bool overlap; /* issue a run before the one before is answered */
  /* runs answered, reset (cn_run_reset: their graph and plan arrays, no
   * arena) for the next ones: two, as many as an overlapping worker has
   * in flight; freed when the worker goes idle */
  cn_run *spare[2];
  int n_spare;
} worker_arg;

/* The request's answer. An instance whose output holds a non-finite value
 * (JSON has no NaN) fails its request with 500 non_finite, naming the
 * instance and field; the run's other requests are answered as usual. */
static char *answer_non_finite(cn__job *j, int i, cn_err *err, int *status) {
  char msg[sizeof(err->msg)];
  snprintf(msg, sizeof(msg), "instance %d: %.280s", i, err->msg);
  snprintf(err->msg, sizeof(err->msg), "%s", msg);
  err->instance = i;
  CN_LOG(CN_LOG_ERROR, "msg=non-finite-output model=%s version=%s "
         "error=\"%s\"", j->me->name, j->me->version, err->msg);
  json_t *e = cn_err_to_json(err);
  char *body = json_dumps(e, DUMP_FLAGS);
  json_decref(e);
  *status = cn_err_http_status(err->code);
  return body;
}

/* The stats of an answer from run j. */
static cn__answer_stats run_stats(const cn__job *j, double queue_ms,
                                  double compute_ms) {
  cn__answer_stats st = {
      .queue_ms = queue_ms, .compute_ms = compute_ms,
      .batches = j->st.batches, .lower_bound = j->st.lower_bound,
      .run = j->id, .run_requests = j->n, .run_instances = j->instances};
  return st;
}

/* What every /v1 answer of a run shares, written once for the run: the
 * envelope's head (model and version) and the run's stats (compute_ms ..
 * run_instances). Writing them per answer, a printf of compute_ms among
 * them, took about a third of the worker's time on an answer's
 * envelope. */
typedef struct run_text {
  cn_buf head, stats;
} run_text;

/* A v2 request's answer: v2's tensors are laid out from /v1's output
 * objects (kserve_answer.c). */
static char *format_v2(cn__job *j, cn__req *r, cn_run *run, int *slots,
                       int *status) {
  json_t *outs = json_array();
  for (int i = 0; i < r->n_inst; i++) {
    json_t *out = cn_run_output(run, slots[i]);
    cn_err err;
    cn_err_clear(&err);
    if (cn_output_check(out, &err) != 0) {
      json_decref(out);
      json_decref(outs);
      return answer_non_finite(j, i, &err, status);
    }
    json_array_append_new(outs, out);
  }
  cn__answer_stats st = run_stats(j, r->queue_ms, r->compute_ms);
  return cn__kserve_answer(r, j->me, outs, cn__answer_stats_json(&st, r),
                           status);
}

/* A /v1 answer, written once into its buffer: the envelope (answer_parts.c)
 * around the outputs straight from the run's states
 * (cn_run_write_output). */
static char *format_answer(cn__job *j, cn__req *r, cn_run *run, int *slots,
                           const run_text *rt, int *status) {
  *status = 200;
  if (r->v2) return format_v2(j, r, run, slots, status);
  cn_buf b = {0};
  if (rt->head.failed) cn__answer_head(&b, j->me);
  else cn_buf_put(&b, rt->head.p, rt->head.len);
  for (int i = 0; i < r->n_inst; i++) {
    cn_err err;
    cn_err_clear(&err);
    if (i > 0) cn_buf_puts(&b, ",");
    int rc = cn_run_write_output(run, slots[i], &b, &err);
    if (rc == CN_E_NON_FINITE) {
      cn_buf_free(&b);
      return answer_non_finite(j, i, &err, status);
    }
    if (rc != 0) break; /* no memory: b.failed */
  }
  cn__answer_stats st = run_stats(j, r->queue_ms, r->compute_ms);
  if (!rt->stats.failed) {
    st.run_text = rt->stats.p;
    st.run_text_len = rt->stats.len;
  }
  cn__answer_tail(&b, &st, r);
  if (b.failed) cn_buf_free(&b);
  return b.p; /* NULL: no memory, as json_dumps's */
}

static void run_job(worker_arg *w, cn__job *j);

/* A run over the memory budget together: each request runs on its own,
 * so only one that does not fit alone hears 413 (docs/memory.md). */
static void run_each(worker_arg *w, cn__job *j) {
  cn__metrics_memory(&w->s->metrics, j->me->index, 0, 0, true);
  for (int i = 0; i < j->n; i++) {
    cn__job one = *j;
    one.reqs = &j->reqs[i];
    one.n = 1;
    one.instances = j->reqs[i]->n_inst;
    run_job(w, &one);
  }
}

/* Sizing runs by memory: the arena this model's runs needed per 1,024
 * vertices at the policy's batch count, a moving average window.c
 * reads. */
static void note_memory(cn__model_slot *sl, const cn_run_stats *st) {
  if (sl == NULL || st->vertices <= 0) return;
  long long now = (long long)((double)st->arena_bytes_unbudgeted * 1024.0 /
                              (double)st->vertices);
  long long prev = atomic_load(&sl->arena_per_kvertex);
  atomic_store(&sl->arena_per_kvertex,
               prev == 0 ? now : (long long)(0.8 * prev + 0.2 * now));
}

/* A run on its way: issued to the backend, its answers not yet read
 * (run_start, answer_job). */
typedef struct inflight {
  cn__job *j;
  cn_run *run;
  int **slots;
  double t0;
  double t_added; /* its instances are in the run: t0 .. t_added is the
                     statistics' compute_input */
} inflight;

static void answer_error(cn__job *j, const cn_err *err) {
  CN_LOG(CN_LOG_ERROR, "msg=run-failed model=%s code=%s error=\"%s\"",
         j->me->name, cn_err_code(err->code), err->msg);
  for (int i = 0; i < j->n; i++) {
    cn__req *r = j->reqs[i];
    json_t *e = cn_err_to_json(err);
    r->result = json_dumps(e, DUMP_FLAGS);
    r->result_status = cn_err_http_status(err->code);
    json_decref(e);
  }
}

/* f's run, done: kept reset among the worker's spares (its arena given
 * back now), or freed when there are two already. */
static void inflight_free(worker_arg *w, inflight *f) {
  if (f->run != NULL && w->n_spare < 2 &&
      cn_run_reset(f->run, f->j->me->model, w->bk) == 0)
    w->spare[w->n_spare++] = f->run;
  else
    cn_run_free(f->run);
  for (int i = 0; f->slots != NULL && i < f->j->n; i++) free(f->slots[i]);
  free(f->slots);
  f->run = NULL;
  f->slots = NULL;
}

/* Adds j's live requests to a run and issues it. With async the run may
 * still be computing on the device when this returns (the
 * worker prepares its next run meanwhile). True: f holds the run,
 * answer_job answers it; false: every request already has its answer (an
 * error, no live request, or a run over the budget answered one request
 * at a time). */
static bool run_start(worker_arg *w, cn__job *j, bool async, inflight *f) {
  cn__server *s = w->s;
  *f = (inflight){j, NULL, NULL, cn_now_s(), 0};
  double c0 = cn_thread_cpu_s();
  f->slots = calloc((size_t)j->n, sizeof(int *));
  f->run = w->n_spare > 0 ? w->spare[--w->n_spare] : NULL;
  if (f->run != NULL && cn_run_reset(f->run, j->me->model, w->bk) != 0) {
    cn_run_free(f->run);
    f->run = NULL;
  }
  if (f->run == NULL) f->run = cn_run_new(j->me->model, w->bk);
  if (f->run != NULL) {
    cn_run_set_layout(f->run, s->layout);
    cn_run_set_plan_width(f->run, s->cfg.serve.plan_width);
    cn_run_set_memory_budget(f->run, s->cfg.serve.memory_budget);
    cn_run_set_async(f->run, async);
  }
  int live = 0, dropped = 0, n_waits = 0;
  double waits[64]; /* queue waits, into the metrics 64 at a time */
  cn_err err;
  cn_err_clear(&err);
  if (f->slots == NULL || f->run == NULL) {
    cn_err_set(&err, CN_E_NOMEM, "no memory for the run");
    goto fail;
  }
  for (int i = 0; i < j->n; i++) {
    cn__req *r = j->reqs[i];
    if (atomic_load(&r->cancelled)) {
      dropped += r->n_inst;
      continue;
    }
    r->queue_ms = (f->t0 - r->t_arrive) * 1e3;
    if (n_waits == 64) {
      cn__metrics_queue_waits(&s->metrics, j->me->index, waits, n_waits);
      n_waits = 0;
    }
    waits[n_waits++] = f->t0 - r->t_arrive;
    f->slots[i] = malloc((size_t)r->n_inst * sizeof(int));
    if (f->slots[i] == NULL) {
      cn_err_set(&err, CN_E_NOMEM, "no memory for the run");
      goto fail;
    }
    for (int k = 0; k < r->n_inst; k++) {
      f->slots[i][k] =
          cn_run_add(f->run, r->inst[k], r->flags, r->max_decode_len);
      if (f->slots[i][k] < 0) {
        cn_err_set(&err, f->slots[i][k], "could not add instance %d", k);
        goto fail;
      }
    }
    live++;
  }
  if (dropped > 0) cn__metrics_dropped(&s->metrics, dropped, 0, 0);
  cn__metrics_queue_waits(&s->metrics, j->me->index, waits, n_waits);
  n_waits = 0;
  /* the instances added: their graphs built (parse) */
  cn__metrics_stage(&s->metrics, j->me->index, CN__STAGE_PARSE,
                    cn_thread_cpu_s() - c0, false);
  if (live == 0) goto done;
  f->t_added = cn_now_s();
  if (cn__policy_exec(s, j->me, f->run, &err) != 0) goto fail;
  return true;
fail:
  cn__metrics_queue_waits(&s->metrics, j->me->index, waits, n_waits);
  if (err.code == CN_E_OVER_BUDGET && live > 1) {
    CN_LOG(CN_LOG_INFO, "msg=run-over-budget model=%s requests=%d "
           "error=\"%s\"", j->me->name, live, err.msg);
    inflight_free(w, f);
    run_each(w, j);
    goto done;
  }
  answer_error(j, &err);
done:
  inflight_free(w, f);
  return false;
}

/* Waits for f's run, then sets every live request's answer: outputs, or
 * the run's error. */
static void answer_job(worker_arg *w, inflight *f) {
  cn__server *s = w->s;
  cn__job *j = f->j;
  cn_err err;
  cn_err_clear(&err);
  if (cn_run_wait(f->run, &err) != 0) {
    answer_error(j, &err);
    inflight_free(w, f);
    return;
  }
  double ms = (cn_now_s() - f->t0) * 1e3;
  cn_run_get_stats(f->run, &j->st);
  j->compute_ms = ms;
  cn__policy_observe(s, j->me, f->run); /* after the timing: not compute */
  long long prev = atomic_load(&s->ewma_compute_us);
  atomic_store(&s->ewma_compute_us,
               prev == 0 ? (long long)(ms * 1e3)
                         : (long long)(0.8 * prev + 0.2 * ms * 1e3));
  cn__metrics_memory(&s->metrics, j->me->index, j->st.arena_bytes,
                     j->st.batches - j->st.policy_batches, false);
  note_memory(j->slot, &j->st);
  double t_out = cn_now_s();
  double c0 = cn_thread_cpu_s();
  /* the text the run's answers share, written once (without memory for
   * it, failed: each answer writes its own) */
  run_text rt = {{0}, {0}};
  cn__answer_head(&rt.head, j->me);
  cn__answer_stats rst = run_stats(j, 0, ms);
  cn__answer_run_text(&rt.stats, &rst);
  for (int i = 0; i < j->n; i++) {
    cn__req *r = j->reqs[i];
    if (f->slots[i] == NULL) continue;
    r->compute_ms = ms;
    r->result = format_answer(j, r, f->run, f->slots[i], &rt,
                              &r->result_status);
    cn__answer_compress(r);
  }
  cn_buf_free(&rt.head);
  cn_buf_free(&rt.stats);
  /* counted once its answers are laid out: their time is the run's too */
  cn__metrics_run(&s->metrics, j->me->index, j->st.instances, 0, ms / 1e3,
                  f->t_added - f->t0, cn_now_s() - t_out, j->st.batches,
                  j->st.lower_bound, j->st.vertices, j->st.kernels,
                  j->st.gather_bytes, j->st.cell_bytes, j->st.arena_bytes);
  double c1 = cn_thread_cpu_s();
  inflight_free(w, f);
  /* the run's graph freed counts with the graph built, as canopy run
   * counts it; the four stages under one lock */
  double sec[CN__N_STAGES] = {0};
  sec[CN__STAGE_PARSE] = cn_thread_cpu_s() - c1;
  sec[CN__STAGE_SCHEDULE] = j->st.schedule_s;
  sec[CN__STAGE_EXECUTE] = j->st.execute_s;
  sec[CN__STAGE_OUTPUT] = c1 - c0;
  cn__metrics_stages(&s->metrics, j->me->index, sec);
}

static void run_job(worker_arg *w, cn__job *j) {
  inflight f;
  if (run_start(w, j, false, &f)) answer_job(w, &f);
}

/* The worker's backend counters into /metrics. */
static void report_backend(worker_arg *w) {
  cn_backend_counters c;
  cn_backend_get_counters(w->bk, &c);
  cn__metrics_worker_backend(&w->s->metrics, w->index, &c);
}

/* A job is over: its requests answered (the loop sends them). */
static void job_over(worker_arg *w, cn__job *j) {
  report_backend(w);
  cn__jobs_over(w->s, j);
}

/* Answers the run in flight, if any. */
static void finish_prev(worker_arg *w, inflight *prev, bool *have) {
  if (!*have) return;
  *have = false;
  answer_job(w, prev);
  job_over(w, prev->j);
}

/* The worker's spare runs, freed: at idle, as the backend's arenas. */
static void spares_free(worker_arg *w) {
  while (w->n_spare > 0) cn_run_free(w->spare[--w->n_spare]);
}

static void *worker_main(void *arg) {
  worker_arg *w = arg;
  cn__server *s = w->s;
  /* named so top -H and scripts/bench/daemon.sh can tell the workers'
   * CPU from the loop thread's */
  char name[16];
  snprintf(name, sizeof(name), "cn-worker-%d", w->index);
  pthread_setname_np(pthread_self(), name);
  bool kept = false; /* ran a job since it last gave memory back */
  /* On a device a worker issues its next run before it reads the answers
   * of the one before, so the host prepares run N+1 (parse, plan, index
   * arrays) while the device computes run N: at most
   * two runs in flight, and a run waits for nobody when the queue is
   * empty. */
  inflight prev;
  bool have_prev = false;
  for (;;) {
    cn__job *j;
    cn__warmup *wu;
    cn__take t = cn__jobs_take(s, w->index,
                               have_prev ? CN__WAIT_NONE
                               : kept    ? CN__WAIT_IDLE
                                         : CN__WAIT_FOREVER,
                               &j, &wu);
    if (t == CN__TAKE_EMPTY) {
      /* nothing to overlap it with: its answers now */
      finish_prev(w, &prev, &have_prev);
      continue;
    }
    if (t == CN__TAKE_IDLE) {
      /* A second without work: the run arenas the backend keeps for the
       * next run (up to 256 MiB) go back to the system, so RSS after a
       * burst returns near its idle value; a busy worker keeps them and
       * never pays for fresh pages. */
      spares_free(w);
      cn_backend_release(w->bk);
      report_backend(w);
      cn__malloc_trim();
      kept = false;
      continue;
    }
    if (t == CN__TAKE_WARMUP) {
      finish_prev(w, &prev, &have_prev);
      cn__warmup_part(s, wu, w->index, w->bk);
      kept = true; /* given back after a second idle, as after a run */
      continue;
    }
    if (t == CN__TAKE_STOP) break;
    atomic_fetch_sub(&s->waiting_instances, j->instances);
    kept = true;
    if (cn__decode_wants(s, j)) { /* lstm-nmt: continuous decoding */
      finish_prev(w, &prev, &have_prev);
      cn__decode_job(s, w->bk, j);
      job_over(w, j);
      continue;
    }
    if (!w->overlap) {
      run_job(w, j);
      job_over(w, j);
      continue;
    }
    inflight cur;
    bool issued = run_start(w, j, true, &cur);
    finish_prev(w, &prev, &have_prev); /* the run before, while j's computes */
    if (issued) {
      prev = cur;
      have_prev = true;
    } else {
      job_over(w, j);
    }
  }
  spares_free(w);
  cn_backend_close(w->bk);
  free(w);
  return NULL;
}

/* Opens every worker's backend context first, so a backend that cannot
 * open stops start-up with its error instead of failing requests later. */
int cn__workers_start(cn__server *s, cn_err *err) {
  int n = s->cfg.serve.workers;
  /* CANOPY_RUN_OVERLAP=0 turns the overlap off on a device (to measure
   * what it gives), =1 on for the cpu backend too (the tests: the same
   * path, the same answers), as for canopy run */
  const char *ov = getenv("CANOPY_RUN_OVERLAP");
  int overlap = ov != NULL && ov[0] != '\0' ? strcmp(ov, "0") != 0 : -1;
  bool on = false; /* what the workers do (one backend for all) */
  s->threads = calloc((size_t)n, sizeof(pthread_t));
  if (s->threads == NULL || cn__metrics_workers(&s->metrics, n) != 0)
    return cn_err_set(err, CN_E_NOMEM, "no memory");
  for (int i = 0; i < n; i++) {
    worker_arg *w = calloc(1, sizeof(*w));
    if (w == NULL) return cn_err_set(err, CN_E_NOMEM, "no memory");
    w->s = s;
    w->index = i;
    int rc = cn_backend_open(s->cfg.serve.backend, 0, &w->bk, err);
    if (rc != 0) {
      free(w);
      return rc;
    }
    w->overlap = overlap < 0 ? cn_backend_is_device(w->bk) : overlap != 0;
    on = w->overlap;
    if (pthread_create(&s->threads[i], NULL, worker_main, w) != 0) {
      cn_backend_close(w->bk);
      free(w);
      return cn_err_set(err, CN_E_INTERNAL, "cannot start worker %d", i);
    }
    s->n_threads++;
  }
  CN_LOG(CN_LOG_INFO, "msg=workers-started workers=%d backend=%s "
         "overlap=%s", n, s->cfg.serve.backend,
         on ? "true" : "false");
  return 0;
}

/* Workers finish the queued runs, then exit; joined here. */
void cn__workers_stop(cn__server *s) {
  cn__jobs_stop(s);
  for (int i = 0; i < s->n_threads; i++) pthread_join(s->threads[i], NULL);
  free(s->threads);
  s->threads = NULL;
  s->n_threads = 0;
}
