/* work.h - batching and the workers: aggregation windows
 * (window.c), the queues to and from the workers (job_queue.c), the worker
 * threads (worker.c), decode sessions (decode.c), warm-ups (warmup.c),
 * learned policies (learned_policy.c), and the answers the workers lay out
 * (answer_parts.c, kserve_answer.c). No notion of sockets: requests are
 * answered through request.h. */
#ifndef CANOPY_SERVER_WORK_H
#define CANOPY_SERVER_WORK_H

#include "request.h"

/* window.c (loop thread) */
void cn__window_submit(cn__server *s, cn__req *r);
/* The queue has no room for one instance: msg says so (for a 429), and
 * the refusal is counted. */
bool cn__window_full(cn__server *s, char *msg, size_t cap);
void cn__window_cancel(cn__req *r, const char *reason, int status);
void cn__window_on_done(uv_async_t *a);
void cn__window_flush_all(cn__server *s);
void cn__window_fail_waiting(cn__server *s, int code, const char *msg);
int cn__retry_after_s(cn__server *s);

/* job_queue.c: closed runs to the workers (the job queue), finished ones back
 * to the loop (the done queue, done_async) */
void cn__jobs_push(cn__server *s, cn__job *j);
void cn__jobs_done(cn__server *s, cn__job *j);
void cn__job_free(cn__job *j);
/* Runs queued and not yet taken (any thread). */
int cn__jobs_queued(cn__server *s);
/* Workers that would sit idle if one more run were queued now. */
int cn__jobs_idle_workers(cn__server *s);
/* No run queued and no worker computing one. */
bool cn__jobs_idle(cn__server *s);
/* What a worker takes next (cn__jobs_take). */
typedef enum {
  CN__TAKE_JOB,    /* *j: a run, the worker counted busy till it is over */
  CN__TAKE_WARMUP, /* *wu: a warm-up part, before any queued run       */
  CN__TAKE_EMPTY,  /* CN__WAIT_NONE and nothing queued                 */
  CN__TAKE_IDLE,   /* CN__WAIT_IDLE and a second passed with nothing   */
  CN__TAKE_STOP    /* stopping and nothing left: the worker exits      */
} cn__take;
typedef enum { CN__WAIT_NONE, CN__WAIT_IDLE, CN__WAIT_FOREVER } cn__wait;
/* Workers: the next run or warm-up part for worker `worker`, waiting as
 * `wait` says (CN__WAIT_NONE: not at all when no run is queued). */
cn__take cn__jobs_take(cn__server *s, int worker, cn__wait wait, cn__job **j,
                       cn__warmup **wu);
/* A worker's run is over: it is no longer busy, and j goes back to the
 * loop (cn__jobs_done). */
void cn__jobs_over(cn__server *s, cn__job *j);
/* Decode sessions: the queued runs of version me from the head of the
 * queue, in order, while they fit in inst instances and verts vertices
 * beyond the session's (*inst, *verts grow by theirs); a list through
 * next. *foreign: the head is a run of another version. */
cn__job *cn__jobs_take_joins(cn__server *s, const cn__model_entry *me,
                             int *inst, size_t *verts, int max_inst,
                             size_t max_verts, bool *foreign);
/* Workers exit once the queued runs are done (cn__workers_stop). */
void cn__jobs_stop(cn__server *s);

/* answer_parts.c: the stats of an answer, a run's (worker.c) or a decode
 * session's (decode.c): the keys each has, in the order written. */
typedef struct cn__answer_stats {
  double queue_ms, compute_ms;
  long long batches, lower_bound;
  bool continuous;          /* "continuous": true (a decode session's)   */
  unsigned long long run;   /* the run's number (a session's: its first) */
  int run_requests;         /* < 0: no run_requests nor run_instances    */
  int run_instances;
  /* cn__answer_run_text of these stats, when the caller wrote it once for
   * every answer of its run (NULL: written from the fields) */
  const char *run_text;
  size_t run_text_len;
} cn__answer_stats;
/* /v1's answer envelope, written in one place for both: its head,
 * {"model":..,"model_version":..,"outputs":[ (the outputs follow), and its
 * tail, ],"stats":{..}} with unknown_tokens (and unknown_positions). */
void cn__answer_head(cn_buf *b, const cn__model_entry *me);
void cn__answer_tail(cn_buf *b, const cn__answer_stats *st,
                     const cn__req *r);
/* The part of the tail a run's answers share (compute_ms .. run_instances,
 * each after a comma). */
void cn__answer_run_text(cn_buf *b, const cn__answer_stats *st);
/* The same stats as a json_t (a v2 answer's "parameters"), new reference. */
json_t *cn__answer_stats_json(const cn__answer_stats *st, const cn__req *r);

/* answer_parts.c: adds unknown_tokens (and, asked for, unknown_positions) to an
 * answer's stats (worker.c's and decode.c's answers) */
void cn__stats_unknown(json_t *st, const cn__req *r);
/* The same two keys written into an answer being written (worker.c),
 * each after a comma. */
void cn__stats_unknown_write(cn_buf *b, const cn__req *r);
/* An answer that is a json_t (decode sessions, v2) as text, its floats
 * as every answer prints them (cn_buf_json); caller frees. */
char *cn__answer_dump(const json_t *j);

/* answer_parts.c: compresses r's answer (result, a 200) for the coding its
 * Accept-Encoding took (Content-Encoding in result_head). */
void cn__answer_compress(cn__req *r);

/* Workers: r's v2 answer from /v1's per-instance outputs (takes outs and
 * stats, which become "parameters"); *status 200, or 500 with the error.
 * An answer with binary tensor data sets r's result_len, result_ctype and
 * result_head. */
char *cn__kserve_answer(cn__req *r, const cn__model_entry *me, json_t *outs,
                        json_t *stats, int *status);

/* learned_policy.c: learned policies per model, and the online retrainer */
void cn__policy_init(cn__server *s, cn__model_entry *me);
/* The policy object of GET /v1/models/{name} (new reference). */
json_t *cn__policy_describe(cn__server *s, cn__model_entry *me);
/* Workers: executes run with the model's policy; then keeps its graph. */
int cn__policy_exec(cn__server *s, cn__model_entry *me, cn_run *run,
                    cn_err *err);
void cn__policy_observe(cn__server *s, cn__model_entry *me,
                        const cn_run *run);
int cn__retrainer_start(cn__server *s);
void cn__retrainer_signal_stop(cn__server *s); /* any thread, idempotent */
void cn__retrainer_join(cn__server *s);

/* decode.c (workers): continuous decoding */
bool cn__decode_wants(cn__server *s, const cn__job *j);
/* Runs j as a decode session that takes the model's queued runs at step
 * boundaries, answering each request as its instances finish. */
void cn__decode_job(cn__server *s, cn_backend_ctx *bk, cn__job *j);
/* warmup.c: a version's warm-up on every worker (docs/daemon.md). */
/* Loader or start-up thread (never a worker): with the warmup key on,
 * each worker runs one synthetic instance of me before it returns; a part
 * that fails (NaN or Inf outputs, a shutdown) fails it, err naming the
 * warm-up. Logs msg=model-warmed. */
int cn__warmup_run(cn__server *s, cn__model_entry *me, cn_err *err);
/* Workers, under qmu: a warm-up whose part this worker has not taken
 * (marked taken), or NULL. */
cn__warmup *cn__warmup_next(cn__server *s, int worker);
/* Workers, no lock held: executes the part, then reports it (takes qmu). */
void cn__warmup_part(cn__server *s, cn__warmup *w, int worker,
                     cn_backend_ctx *bk);
/* A worker that exits, under qmu: its parts not taken fail (draining). */
void cn__warmup_abandon(cn__server *s, int worker);
/* worker.c */
int cn__workers_start(cn__server *s, cn_err *err);
void cn__workers_stop(cn__server *s);

#endif
