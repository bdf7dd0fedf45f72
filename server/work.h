/* work.h - batching and the workers: aggregation windows
 * (batcher.c), the queues to and from the workers (job_queue.c), the worker
 * threads (worker.c), decode sessions (decode.c), warm-ups (warmup.c),
 * learned policies (learned_policy.c), and the answers the workers lay out
 * (answer_parts.c, kserve_answer.c). No notion of sockets: requests are
 * answered through request.h. */
#ifndef CANOPY_SERVER_WORK_H
#define CANOPY_SERVER_WORK_H

#include "request.h"

/* batcher.c (loop thread) */
void cn__batcher_submit(cn__server *s, cn__req *r);
/* The queue has no room for one instance: msg says so (for a 429), and
 * the refusal is counted. */
bool cn__batcher_full(cn__server *s, char *msg, size_t cap);
void cn__batcher_cancel(cn__req *r, const char *reason, int status);
void cn__batcher_on_done(uv_async_t *a);
void cn__batcher_flush_all(cn__server *s);
void cn__batcher_fail_waiting(cn__server *s, int code, const char *msg);
int cn__retry_after_s(cn__server *s);

/* job_queue.c: closed runs to the workers (the job queue), finished ones back
 * to the loop (the done queue, done_async) */
void cn__jobs_push(cn__server *s, cn__job *j);
void cn__jobs_done(cn__server *s, cn__job *j);
void cn__job_free(cn__job *j);

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
