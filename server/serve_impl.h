/* serve_impl.h - internal declarations shared by the daemon's files.
 *
 * Threads and who touches what:
 *   loop thread   owns every uv handle, the client connections (conn.c:
 *                 parsing, deadlines, writes), the aggregation windows,
 *                 the list of waiting requests, and answers them;
 *   workers       take closed runs from the job queue, execute them and
 *                 hand them back through the done queue (uv_async).
 * A request is reference counted (atomic): its connection holds one
 * reference until its answer is written out or the connection closes, a run holds one until the loop
 * has taken the run back, and each open uv handle holds one until its
 * close callback (nothing is freed inside its own callback).
 */
#ifndef CANOPY_SERVE_IMPL_H
#define CANOPY_SERVE_IMPL_H

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/stat.h>

#include <uv.h>

#include "canopy_core.h"
#include "config.h"
#include "log.h"
#include "metrics.h"

typedef struct cn__job cn__job;
typedef struct cn__server cn__server;
typedef struct cn__model_slot cn__model_slot;
typedef struct cn__conn cn__conn;
typedef struct cn__warmup cn__warmup;

/* malloc_trim gives free glibc heap pages back (serve.c, worker.c,
 * bigparse.c). Under AddressSanitizer glibc's malloc is not the allocator
 * and its trim, racing from two threads, corrupted glibc's arena list
 * (SEGV in mtrim, "attached_threads > 0" at thread exit): left out. */
#if defined(__SANITIZE_ADDRESS__)
#define CN__ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CN__ASAN 1
#endif
#endif
static inline void cn__malloc_trim(void) {
#ifndef CN__ASAN
  malloc_trim(0);
#endif
}

/* The sweep of connection deadlines (conn.c), in ms. */
#define HTTP_TICK_MS 100

/* The most models one daemon knows at once (loaded, loading, failed or
 * unloaded with their directory still there): a slot is freed, for
 * another name, once its model is unloaded and its directory gone. */
#define CN__MAX_MODELS 256

/* A model's name (its directory's) has fewer bytes than this. */
#define CN__NAME_MAX 128

/* A model's learned batching policy (policy fsm; policy.c). Workers take
 * a reference to `fsm` under `mu` (a few instructions) and add their run's
 * graph to `reservoir` under `rmu`; the retrainer snapshots the reservoir
 * under `rmu`, trains with no lock held, and swaps `fsm` under `mu`. */
typedef struct cn__policy {
  pthread_mutex_t mu;        /* fsm and the fields below it               */
  cn_fsm *fsm;               /* NULL: the agenda fallback                 */
  const char *source;        /* "cache" | "online" | "agenda-fallback"   */
  long long batches;         /* of the policy in use on `evaluated_on`    */
  long long agenda_batches;  /* agenda's on the same graphs (-1: unknown) */
  long long lower_bound;     /* of those graphs                           */
  int evaluated_on;          /* graphs those numbers were measured on     */
  int swaps;
  long long retrains[3];     /* swapped, kept, failed                     */
  double last_train_s;
  pthread_mutex_t rmu;       /* reservoir and added                       */
  cn_graph_set *reservoir;   /* recent run graphs, FIFO (NULL: not fsm)   */
  long long added;           /* graphs ever added                         */
  long long trained_at;      /* `added` when the last round snapshotted   */
} cn__policy;

/* One loaded version of a model (repo.c): immutable once loaded (`pol`
 * guards itself) and reference counted. Its slot holds one reference
 * while it is the version new requests get; every request and run that
 * uses it holds one, so a request finishes on the version it started
 * with, and an old version is freed when its last run ends. */
typedef struct cn__model_entry {
  char name[CN__NAME_MAX];
  char version[72];    /* model.json "version", else sha256[:12] */
  cn_model *model;
  int index;           /* metrics label slot (the slot's) */
  json_t *describe;    /* GET /v1/models/{name} body, less "policy" */
  cn__policy pol;
  atomic_int refs;
  cn__model_slot *slot;
} cn__model_entry;

/* What the repository knows of one model name (repo.c). */
enum { CN__MODEL_LOADING = 0, CN__MODEL_READY, CN__MODEL_UNAVAILABLE,
       CN__MODEL_UNLOADED };

struct cn__model_slot {
  char name[CN__NAME_MAX];
  char label[2 * CN__NAME_MAX]; /* name as a Prometheus label value
                                   (\\ \" \\n escaped)                */
  int index;                 /* in s->models and the metrics labels    */
  cn__server *srv;
  pthread_mutex_t vmu;       /* cur, state, reason, counters           */
  cn__model_entry *cur;      /* the version new requests get; NULL: none */
  int state;
  char reason[512];          /* why UNAVAILABLE, or the last failed load */
  long long loads_ok, loads_failed;
  /* loop thread only */
  bool used;                 /* holds a name; else free for another    */
  bool loading;              /* a load of this name is under way       */
  bool rescan_owed;          /* a rescan found it loading: once more
                                when the load ends                     */
  bool queued;               /* a rescan's load waits for max-loads    */
  unsigned gen;              /* bumped by unload: a load started under
                                an older gen is discarded              */
  unsigned load_gen;         /* gen the load in flight started under   */
  struct cn__req *joined;    /* POST .../load requests its load answers
                                (held; linked by lnext)                */
  struct stat tried[2];      /* model.json, weights when the last load
                                started: what a rescan compares       */
  cn__job *window;           /* the open aggregation window            */
  uv_timer_t timer;
  /* any thread */
  atomic_int decoding;       /* decode sessions taking joins (decode.c) */
  atomic_int entries;        /* versions alive that point here: the slot
                                is not freed while one is              */
};

enum { CN__REQ_RECEIVING = 0, CN__REQ_WAITING, CN__REQ_ANSWERED };

/* What infer.c reads of a body, before it is the request's. */
typedef struct cn__parsed {
  cn_instance **inst;
  int n_inst;
  size_t vertices;
  unsigned flags;
  int max_decode_len;
  long long timeout_ms;
  char *v2_id;          /* a v2 request's "id", owned (NULL: none)      */
  unsigned v2_outputs;  /* a v2 request's "outputs" (CN__V2_*; 0: all)  */
} cn__parsed;

typedef struct cn__req {
  /* any thread */
  atomic_int refs;
  atomic_int cancelled;     /* timed out or disconnected: skip its work */
  /* set by the handler before submission, read-only afterwards */
  cn__server *srv;
  char id[72];
  char method[8];
  char path[160];
  cn__model_slot *slot;     /* the name the path named (NULL: none)     */
  char model_name[CN__NAME_MAX]; /* that name as written in the path */
  size_t model_name_len;    /* its length; >= CN__NAME_MAX: too long    */
  cn__model_entry *me;      /* its version, held (infer and model GET)  */
  int route;                /* cn__route */
  bool v2;                  /* an Open Inference Protocol route (kserve.c):
                               v2 answers and errors                      */
  char want_version[72];    /* the path's /versions/{v} ("": none)       */
  bool version_bad;         /* {v} is not the version of me              */
  cn__conn *conn;           /* NULL once answered or disconnected     */
  cn_instance **inst;
  int n_inst;
  size_t vertices;
  unsigned flags;
  int max_decode_len;
  long long timeout_ms;
  char *v2_id;              /* v2: the request's "id", echoed (owned)    */
  unsigned v2_outputs;      /* v2: the outputs asked for (0: all)        */
  double t_arrive;          /* first byte of the request seen (s)        */
  char *body;               /* the upload, bounded by max-body-bytes     */
  size_t body_len, body_cap;
  /* written by a worker, read by the loop after the run comes back */
  char *result;
  int result_status;
  double queue_ms, compute_ms;
  /* loop thread only */
  int state;
  uv_timer_t tmo;
  bool tmo_open;
  struct cn__req *wprev, *wnext; /* list of waiting requests */
  struct cn__req *lnext;    /* a slot's joined loads (repo.c)          */
  /* the answer */
  int status;
  const char *reason;       /* timeout / disconnect / ... for the log    */
  /* a big body parsed off the loop (bigparse.c): the pool thread writes
   * parsed, perr and prc, and frees body; the loop reads them in the
   * after-work callback */
  uv_work_t pwork;
  struct cn__req *pnext;    /* loop: the FIFO of bodies waiting to parse */
  bool pbig;                /* in the huge lane (one parse at a time)    */
  cn__parsed parsed;
  cn_err perr;
  int prc;
} cn__req;

/* A run being gathered (window) or queued for / computed by a worker. */
struct cn__job {
  cn__model_entry *me;       /* the version, held by the job            */
  cn__model_slot *slot;
  cn__req **reqs;
  int n, cap;
  int instances;
  unsigned long long id;     /* the daemon's run number, from 1          */
  size_t vertices;
  double t_open;
  cn__job *next;
  /* worker results */
  cn_run_stats st;
  double compute_ms;
};

struct cn__server {
  cn_config cfg;
  cn_policy_kind policy;
  cn_layout layout;
  cn__model_slot *models;    /* CN__MAX_MODELS; names never move       */
  atomic_int n_models;       /* slots in use                           */
  pthread_mutex_t lmu;       /* loaded: finished loads -> loop          */
  struct cn__load *loaded;
  uv_async_t load_async;
  uv_timer_t poll_timer;     /* model-control poll                     */
  int loads_pending;         /* loop: loader threads not yet back      */
  bool repo_open;            /* the load/unload routes may run: a token,
                                a loopback host or repository-insecure */
  bool reload_notify;        /* loop: READY=1 owed once they are back  */
  uv_loop_t loop;
  uv_tcp_t listener;         /* conn.c                                 */
  bool listening;
  int listen_fd;             /* bound, not yet listening: -1 none     */
  int bound_port;
  uv_timer_t conn_timer;     /* the deadline sweep                     */
  cn__conn *conns;           /* every client connection (loop thread)  */
  int refused_conns;         /* beyond max-connections, being answered */
  uv_async_t done_async;
  /* Where a request that waits goes (cn__batcher_dispatch; the HTTP fuzz
   * target answers them itself, with no loop running). */
  void (*hand_over)(cn__server *s, cn__req *r);
  uv_signal_t sigterm, sigint, sighup;
  uv_timer_t drain_timer;
  /* bodies parsed off the loop (bigparse.c; loop thread): parses on the
   * threadpool (all, and the huge lane's), and each lane's FIFO of those
   * waiting for one: huge (ph) and medium (mh) */
  int parsing, parsing_big;
  cn__req *phead, *ptail;
  cn__req *mhead, *mtail;
  /* shared */
  atomic_int draining;
  atomic_int open_conns;         /* client connections open              */
  atomic_llong body_bytes;       /* request bodies held (max-body-memory) */
  atomic_llong last_request_us;  /* cn__now() of the newest request (or,
                                  * draining, byte read), µs              */
  atomic_int waiting_instances; /* in windows or queued, not yet running */
  atomic_int in_flight;         /* requests submitted and not answered   */
  atomic_uint_fast64_t next_id;
  atomic_llong ewma_compute_us;
  /* job queue: loop -> workers */
  pthread_mutex_t qmu;
  pthread_cond_t qcv;
  cn__job *qhead, *qtail;
  int queued_jobs;
  int busy_workers;          /* workers computing a run                 */
  cn__warmup *warm;          /* warm-ups some worker has yet to take   */
  pthread_cond_t wcv;        /* a warm-up's last part is done          */
  int next_feed;             /* loop: model a freed worker serves first */
  unsigned long long runs_opened; /* loop: the last run's number (job id) */
  uv_timer_t trim_timer;     /* loop: malloc_trim once the load passed  */
  long long trimmed_at;      /* loop: requests_seen at the last trim    */
  atomic_llong requests_seen;  /* requests received, ever               */
  uv_check_t idle_check;     /* loop: start runs for idle workers after
                                the requests of this loop turn are in  */
  bool stopping;
  /* done queue: workers -> loop */
  pthread_mutex_t dmu;
  cn__job *dhead;
  /* loop thread */
  cn__req *waiting;          /* requests submitted and not yet answered */
  double drain_started;
  pthread_t *threads;
  int n_threads;
  /* the online retrainer (policy.c) */
  pthread_mutex_t rtmu;
  pthread_cond_t rtcv;
  bool rt_stop, rt_started;
  pthread_t rt_thread;
  cn__metrics metrics;
};

/* The daemon's clock: core's monotonic seconds (cn_now_s, core/base),
 * under the name the daemon's files call. */
static inline double cn__now(void) { return cn_now_s(); }

/* http.c: requests and answers (called by conn.c) */
cn__req *cn__http_begin(cn__server *s, cn__conn *c, const char *method,
                        const char *url);
int cn__http_head_done(cn__req *r, unsigned long long body_len);
int cn__http_body(cn__req *r, const char *data, size_t n);
void cn__http_complete(cn__req *r);
void cn__http_fail(cn__req *r, int code, const char *msg);
void cn__req_unref(cn__req *r);
/* Frees the body, giving its bytes back to max-body-memory (any thread). */
void cn__req_body_free(cn__req *r);
void cn__handle_unref_cb(uv_handle_t *h); /* close_cb: h->data is a req */

/* listen.c: the listening socket and the file descriptor limit */
/* Binds the port (before the models load: a port in use fails at once). */
int cn__http_bind(cn__server *s, cn_err *err);
/* Closes a port bound and not yet listening (a start-up that failed). */
void cn__http_unbind(cn__server *s);
/* Listens on it and accepts connections. */
int cn__http_start(cn__server *s, cn_err *err);
void cn__http_quiesce(cn__server *s); /* stop accepting connections */
void cn__http_close_handles(cn__server *s);

/* conn.c: HTTP/1.1 connections */
int cn__conn_listen(cn__server *s, int fd, cn_err *err);
void cn__conn_quiesce(cn__server *s);
void cn__conn_close_all(cn__server *s);
const char *cn__conn_header(const cn__conn *c, const char *name);
/* The answer to r (body taken over; extra: more header lines, each
 * ending in CRLF); 499 writes nothing and closes. */
void cn__conn_respond(cn__req *r, int status, char *body, size_t blen,
                      const char *ctype, const char *extra);
void cn__conn_write(cn__conn *c, char *buf, size_t len);
/* In memory (tests/fuzz/fuzz_http.c): a connection without a socket whose
 * output goes to sink; bytes in with cn__conn_feed, deadlines with
 * cn__conn_tick, the client's EOF with cn__conn_eof. */
typedef void (*cn__conn_sink)(void *ud, const char *data, size_t n);
cn__conn *cn__conn_new_mem(cn__server *s, cn__conn_sink sink, void *ud);
void cn__conn_feed(cn__conn *c, const char *data, size_t n);
void cn__conn_tick(cn__conn *c, double now);
void cn__conn_eof(cn__conn *c);
bool cn__conn_closed(const cn__conn *c);
void cn__conn_free_mem(cn__conn *c);
/* Answers a waiting request from the loop: closes its handles, records
 * metrics and the log line, writes the answer. Takes over body. */
void cn__req_answer(cn__req *r, int status, char *body, const char *reason);
char *cn__error_body(int code, const char *msg, int instance);

/* infer.c: parses r->body (and frees it) into r's options and instances */
int cn__infer_parse(cn__req *r, cn_err *e);
/* The same in two steps: the parse (any thread; writes only p; p holds
 * nothing on failure), then, on the loop, p becomes r's. */
int cn__infer_parse_into(const cn__req *r, cn__parsed *p, cn_err *e);
void cn__infer_commit(cn__req *r, cn__parsed *p);
void cn__parsed_free(cn__parsed *p);
/* The limits on a body's JSON containers and instances, from counts
 * (bodyscan.h): 413 too_large naming the limit, else 0. */
struct cn__body_counts;
int cn__infer_check_counts(const cn__server *s,
                           const struct cn__body_counts *k, cn_err *e);

/* kserve.c: the Open Inference Protocol (KServe v2) as a mapping onto /v1
 * (docs/api.md). Output tensors, as bits of a request's "outputs": */
enum {
  CN__V2_LOGITS = 1u << 0,
  CN__V2_LABEL = 1u << 1,
  CN__V2_PATH_SCORE = 1u << 2,
  CN__V2_OUTPUT_TOKENS = 1u << 3,
  CN__V2_HIDDEN = 1u << 4,
  CN__V2_OFFSETS = 1u << 5
};
/* GET /v2 and GET /v2/models/{model} bodies (new references). */
json_t *cn__kserve_server_meta(void);
json_t *cn__kserve_model_meta(const cn__model_entry *me);
/* Any thread: the v2 body j as the /v1 request it asks for (*v1, a new
 * reference: {"instances": [...], options}); sets p's v2_id and
 * v2_outputs. On failure *v1 is NULL and e says why (400, or 413 as /v1). */
int cn__kserve_request(const cn__req *r, const json_t *j, json_t **v1,
                       cn__parsed *p, cn_err *e);
/* Workers: r's v2 answer from /v1's per-instance outputs (takes outs and
 * stats, which become "parameters"); *status 200, or 500 with the error. */
char *cn__kserve_answer(const cn__req *r, const cn__model_entry *me,
                        json_t *outs, json_t *stats, int *status);
/* Loop: a /v1 error body as v2's {"error": message} (takes body). */
char *cn__kserve_error(char *body);

/* bigparse.c (loop thread): bodies over CN__BIG_BODY_BYTES are parsed on
 * libuv's threadpool, in two lanes with a FIFO each: medium ones (up to
 * CN__MEDIUM_BODY_BYTES) CN__MEDIUM_PARSES at a time, huge ones
 * CN__BIG_PARSES at a time. The request is WAITING (on s->waiting)
 * meanwhile; cn__http_parsed(r) runs on the loop once its parse ended,
 * unless it was answered (disconnect, drain) meanwhile. */
#define CN__BIG_BODY_BYTES (16 * 1024)
#define CN__MEDIUM_BODY_BYTES (1024 * 1024)
#define CN__MEDIUM_PARSES 3
#define CN__BIG_PARSES 1
void cn__bigparse_submit(cn__req *r);
/* http.c: r's big body is parsed (r->prc, r->perr, r->parsed): answer or
 * hand over. */
void cn__http_parsed(cn__req *r);

/* routes.h: the routes and the GET bodies */

/* batcher.c (loop thread) */
void cn__batcher_submit(cn__server *s, cn__req *r);
/* The queue has no room for one instance: msg says so (for a 429), and
 * the refusal is counted. */
bool cn__batcher_full(cn__server *s, char *msg, size_t cap);
/* A suspended request, on the loop: an inference to its window, a
 * repository load to a loader thread. */
void cn__batcher_dispatch(cn__server *s, cn__req *r);
void cn__batcher_cancel(cn__req *r, const char *reason, int status);
void cn__batcher_on_done(uv_async_t *a);
void cn__batcher_flush_all(cn__server *s);
void cn__batcher_fail_waiting(cn__server *s, int code, const char *msg);
int cn__retry_after_s(cn__server *s);

/* policy.c: learned policies per model, and the online retrainer */
void cn__policy_init(cn__server *s, cn__model_entry *me);
void cn__policy_destroy(cn__model_entry *me);
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

/* repo.c: the model repository: versions, loads, rescans, the index */
cn__model_slot *cn__repo_find(cn__server *s, const char *name, size_t len);
/* Start-up: may the load and unload routes run (repo_open), said in the
 * log: with a repository-token, on a loopback host, or with
 * repository-insecure (issue #39: anyone on the network could load). */
void cn__repo_guard_init(cn__server *s);
/* Loop: is a load or its queue under way for sl (an unload cancels it)? */
bool cn__repo_busy(const cn__model_slot *sl);
/* name as a Prometheus label value, cut to cap (repo_report.c). */
void cn__repo_label_escape(char *out, size_t cap, const char *in);
/* A reference to the version new requests get (NULL: none loaded). */
cn__model_entry *cn__model_retain(cn__model_slot *sl);
void cn__model_release(cn__model_entry *me);
/* Start-up: every model directory, loaded in name order. */
int cn__repo_load_all(cn__server *s, cn_err *err);
void cn__repo_free_all(cn__server *s);
/* Loop: load (or reload) a model directory on a loader thread; r, if not
 * NULL, is a suspended POST .../load answered when it is done. */
void cn__repo_load_async(cn__server *s, const char *name, cn__req *r);
void cn__repo_unload(cn__server *s, cn__model_slot *sl);
/* Loop: new directories load, changed ones reload, removed ones unload. */
void cn__repo_rescan(cn__server *s, const char *why);
void cn__repo_on_loaded(uv_async_t *a);
json_t *cn__repo_index(cn__server *s);
/* Prometheus text of canopy_model_ready / canopy_model_loads_total. */
char *cn__repo_metrics(cn__server *s);

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
void cn__workers_push(cn__server *s, cn__job *j);
/* Adds unknown_tokens (and, asked for, unknown_positions) to an answer's
 * stats (worker.c; decode.c's answers too). */
void cn__stats_unknown(json_t *st, const cn__req *r);
void cn__workers_stop(cn__server *s);
void cn__job_free(cn__job *j);
/* A worker hands a job back to the loop (the done queue). */
void cn__workers_done(cn__server *s, cn__job *j);

#endif
