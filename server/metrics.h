/* metrics.h - counters kept where the work happens (the handler counts
 * requests, the workers count runs and batches), exposed by one generator
 * (cn__metrics_render, redis genRedisInfoString style) in the Prometheus
 * text format 0.0.4. One mutex guards them: every update is a handful of
 * additions, far cheaper than the request it describes. */
#ifndef CANOPY_SERVER_METRICS_H
#define CANOPY_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "canopy_core.h"

#define CN__HIST_MAX 24

typedef struct cn__hist {
  int n;                       /* buckets (upper bounds, +Inf implied) */
  const double *le;
  uint64_t counts[CN__HIST_MAX + 1];
  double sum;
  uint64_t count;
} cn__hist;

/* Where a request's CPU goes (canopy_stage_seconds_total): its body read
 * into instances and their graphs built; the run's plan; its batches;
 * its answer written. The loop thread's other work is http (gauges). */
typedef enum {
  CN__STAGE_PARSE = 0,
  CN__STAGE_SCHEDULE,
  CN__STAGE_EXECUTE,
  CN__STAGE_OUTPUT,
  CN__N_STAGES
} cn__stage;

/* How a request arrived (canopy_protocol_requests_total): HTTP (/v1 and
 * /v2 alike), or a gRPC call (server/grpc.c), which becomes the same
 * HTTP request. */
enum { CN__PROTO_HTTP = 0, CN__PROTO_GRPC, CN__N_PROTOS };

typedef struct cn__metrics {
  pthread_mutex_t mu;
  int cap;                    /* model slots; slot cap is "" (no model)   */
  int n_models;               /* slots in use (they only grow)            */
  const char **model_names;   /* borrowed, [cap]                          */
  uint64_t *requests;         /* [(cap + 1) * CN__N_STATUS]               */
  uint64_t *instances;        /* [cap + 1] instances answered 200         */
  /* per model slot [cap + 1] (the last: requests naming no model) */
  cn__hist *request_s, *queue_s, *compute_s, *batch_instances;
  uint64_t *model_batches, *model_lower_bound; /* [cap + 1]              */
  /* per model slot [cap + 1], inference requests only (the statistics
   * extension, GET /v2/models/{m}/stats): answered 200 or not, and their
   * durations (arrival to answer, s); queue and compute as each request
   * saw them (the run's time once per request); the run's preparation of
   * its instances (input) and its answers (output), once per run; and
   * when the last one was answered (ms since the epoch) */
  struct cn__infer_stats *infer;
  double *stage_s;             /* [(cap + 1) * CN__N_STAGES] CPU seconds
                                  by stage (cn__stage), summed over the
                                  threads that did them               */
  double loop_parse_s;         /* of parse: on the loop thread          */
  uint64_t *model_arena_peak;  /* [cap + 1] largest arena of a run (the
                                  live high-water mark, docs/memory.md) */
  uint64_t memory_budget;      /* the memory-budget key, bytes (0: none)  */
  uint64_t budget_extra_batches; /* batches budgets added to the policies' */
  uint64_t runs_over_budget;   /* runs re-run request by request: over the
                                  budget together                        */
  uint64_t runs, batches, lower_bound, vertices, kernels;
  uint64_t instances_dropped, cancelled_timeout, cancelled_disconnect;
  uint64_t rejected_overloaded;
  uint64_t conns_refused;      /* beyond max-connections                  */
  uint64_t protocol_requests[CN__N_PROTOS]; /* requests answered, by how
                                  they arrived (CN__PROTO_*)             */
  uint64_t conns_evicted;      /* closed at max-connections for a new one */
  uint64_t answer_refused;     /* 503: the answer would pass
                                  max-answer-memory                      */
  uint64_t gather_bytes, cell_bytes, arena_bytes_total;
  uint64_t arena_bytes_last, arena_bytes_peak;
  uint64_t *retrains;         /* [n_models * CN__N_RETRAIN]               */
  uint64_t window_closes[7];  /* by cn__close_reason                      */
  /* decode sessions (decode.c) */
  uint64_t decode_sessions, decode_joined, decode_early;
  /* per worker: its backend context's counters (cn_backend_counters), as
   * the worker last copied them */
  cn_backend_counters *worker_dev;
  int n_workers;
  double start_time;
} cn__metrics;

/* A model's inference counters (metrics.c keeps one per slot). */
typedef struct cn__infer_stats {
  uint64_t ok, fail;
  double ok_s, fail_s, queue_s, compute_s;
  uint64_t queued, computed;   /* requests that started, finished a run   */
  uint64_t runs;               /* runs executed (execution_count)         */
  double run_input_s, run_infer_s, run_output_s;
  uint64_t instances;          /* instances answered 200 (inference_count)*/
  uint64_t last_ms;            /* wall clock of the last answer, ms        */
} cn__infer_stats;

/* Values read at render time (owned elsewhere). */
typedef struct cn__gauges {
  long long queue_instances, queued_runs, in_flight, workers, ready,
      draining, open_connections;
  long long body_bytes;
  long long answer_held, answer_reserved; /* max-answer-memory */
  double loop_cpu_s; /* the loop thread's CPU seconds since it began
                        serving (http_s: less what it spent parsing) */
} cn__gauges;

/* in as a Prometheus label value, cut to cap (text format 0.0.4). */
void cn__metrics_label_escape(char *out, size_t cap, const char *in);

int cn__metrics_init(cn__metrics *m, int cap, const char **names);
/* Model slots 0..n-1 are in use (names filled in first). */
void cn__metrics_set_models(cn__metrics *m, int n);
/* Slot i holds another model from now on: its counters start again. */
void cn__metrics_reset_model(cn__metrics *m, int i);
void cn__metrics_free(cn__metrics *m);
/* A request answered (any status but 499) that arrived by protocol
 * (CN__PROTO_*), counted by protocol and by status under one lock;
 * model: index or -1 (no model) */
void cn__metrics_request(cn__metrics *m, int protocol, int model, int status,
                         int instances, double seconds);
/* The same for an inference request, which its model's statistics count
 * too: queue_s and compute_s as the request saw them (< 0: it never
 * reached a run). One lock, as cn__metrics_request. */
void cn__metrics_infer_request(cn__metrics *m, int protocol, int model,
                               int status, int instances, double seconds,
                               double queue_s, double compute_s);
/* A copy of model slot i's inference counters (zeros for no model). */
void cn__metrics_infer_stats(cn__metrics *m, int model, cn__infer_stats *out);
/* input_s, output_s: the run's preparation of its instances (within
 * compute_s) and the layout of its answers (after it), for the
 * statistics; 0 where not measured apart (decode sessions). */
void cn__metrics_run(cn__metrics *m, int model, int instances,
                     double queue_s_max,
                     double compute_s, double input_s, double output_s,
                     long long batches,
                     long long lower_bound, long long vertices,
                     long long kernels, size_t gather_bytes, size_t cell_bytes,
                     size_t arena_bytes);
/* The worker count, before the workers start (0 or a negative code). */
int cn__metrics_workers(cn__metrics *m, int n);
/* A worker's backend counters after a run or a release (totals). */
void cn__metrics_worker_backend(cn__metrics *m, int worker,
                                const cn_backend_counters *c);
void cn__metrics_queue_wait(cn__metrics *m, int model, double seconds);
/* n of them under one lock (a run's requests: the lock is the loop's
 * too, taken once a request there). */
void cn__metrics_queue_waits(cn__metrics *m, int model, const double *seconds,
                             int n);
/* CPU seconds a model's requests spent in a stage; on_loop: the loop
 * thread's (not http's). */
void cn__metrics_stage(cn__metrics *m, int model, cn__stage stage,
                       double seconds, bool on_loop);
/* A worker's run: every stage's seconds (off the loop) under one lock. */
void cn__metrics_stages(cn__metrics *m, int model,
                        const double seconds[CN__N_STAGES]);
/* A run's memory (docs/memory.md): its arena and the batches a memory budget
 * added; over: a run over the budget split request by request. */
void cn__metrics_memory(cn__metrics *m, int model, size_t arena_bytes,
                        long long extra_batches, bool over);
void cn__metrics_dropped(cn__metrics *m, int instances, int disconnect,
                         int timeout);
void cn__metrics_overloaded(cn__metrics *m);
void cn__metrics_conn_refused(cn__metrics *m);
void cn__metrics_conn_evicted(cn__metrics *m);
void cn__metrics_answer_refused(cn__metrics *m);
/* One online retraining round of a model's policy. */
enum { CN__RETRAIN_SWAPPED = 0, CN__RETRAIN_KEPT, CN__RETRAIN_FAILED,
       CN__N_RETRAIN };
void cn__metrics_retrain(cn__metrics *m, int model, int result);
/* Why an aggregation window closed into a run (window.c). */
typedef enum {
  CN__CLOSE_IDLE_WORKER = 0, /* a request found a worker idle: start now  */
  CN__CLOSE_WORKER_FREED,    /* a worker finished: it takes what waits    */
  CN__CLOSE_MAX_DELAY,       /* max-delay-us passed                       */
  CN__CLOSE_SIZE,            /* max-instances / max-vertices reached      */
  CN__CLOSE_FLUSH,           /* drain                                     */
  CN__CLOSE_JOIN,            /* a decode session of the model takes joins */
  CN__CLOSE_MEMORY,          /* the next request would take the run's
                                arena over memory-budget (docs/memory.md) */
  CN__N_CLOSE
} cn__close_reason;
void cn__metrics_window_close(cn__metrics *m, cn__close_reason why);
/* Decode sessions (decode.c): a session started; instances that joined
 * one in flight; instances answered while others still decoded. */
void cn__metrics_decode(cn__metrics *m, int sessions, int joined, int early);
/* The whole exposition; caller frees. */
char *cn__metrics_render(cn__metrics *m, const cn__gauges *g);

#endif
