/* server.h - internal declarations shared by the daemon's files.
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
#ifndef CANOPY_SERVER_SERVER_H
#define CANOPY_SERVER_SERVER_H

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <time.h>

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

/* A model's learned batching policy (policy fsm; learned_policy.c).
 * Workers take a reference to `fsm` under `mu` (a few instructions) and add their run's
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
  atomic_llong arena_per_kvertex; /* arena bytes per 1,024 vertices of its
                                runs at the policy's batch count (EWMA,
                                worker.c): window.c closes a window
                                that would pass memory-budget          */
};

enum { CN__REQ_RECEIVING = 0, CN__REQ_WAITING, CN__REQ_ANSWERED };

/* How many output tensors the Open Inference Protocol answers (the
 * CN__V2_* bits at the end of this file). */
#define CN__V2_TENSORS 6

/* Line readers kept between requests (cn__server.readers): one a request
 * in flight at a time, past which a reader is freed when given back; and
 * the body bytes past which a reader's memory is not kept at all. */
#define CN__READERS_KEPT 64
/* Models whose parses one loop turn times apart (cn__server.parse_*). */
#define CN__PARSE_MODELS 8
#define CN__READER_KEEP_BYTES (64 * 1024)

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
  long long answer_bound; /* bytes its answer could take (infer.c)     */
  unsigned v2_binary;   /* ... those answered as binary tensor data     */
  int v2_topk[CN__V2_TENSORS]; /* ... classification K, by bit index
                                  (0: the tensor itself)               */
  cn_line_reader *rd;   /* holds inst when they were read without a DOM
                           (infer.c; NULL: each is cn_instance_free's)  */
  size_t rd_bytes;      /* the body bytes rd read (request.c keeps a
                           reader that read few for the next request)  */
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
  long long answer_bound;   /* bytes its answer could take (infer.c)     */
  long long answer_reserved; /* of max-answer-memory, until it is answered
                                (request.c; 0: none)                     */
  unsigned v2_binary;       /* v2: those answered as binary tensor data  */
  int v2_topk[CN__V2_TENSORS]; /* v2: classification K by bit index     */
  cn_line_reader *rd;       /* the reader inst live in (NULL: none)      */
  size_t rd_bytes;          /* the body bytes it read                    */
  /* the body's framing, from the head (http.c) */
  long long v2_hlen;        /* Inference-Header-Content-Length: the JSON's
                               bytes (-1: none; -2: not a byte count)    */
  unsigned char body_enc;   /* Content-Encoding (encoding.h CN__ENC_*)   */
  unsigned char answer_enc; /* the coding Accept-Encoding takes          */
  double t_arrive;          /* first byte of the request seen (s)        */
  char *body;               /* the upload, bounded by max-body-bytes     */
  size_t body_len, body_cap;
  size_t body_declared;     /* its Content-Length (0: none, or chunked)  */
  /* written by a worker, read by the loop after the run comes back */
  char *result;
  int result_status;
  size_t result_len;        /* result's bytes when it is not a C string
                               (binary tensor data, compressed); 0: it is */
  const char *result_ctype; /* its Content-Type (NULL: JSON)             */
  char result_head[128];    /* its header lines, each ending in CRLF     */
  double queue_ms, compute_ms;
  /* loop thread only */
  int state;
  uv_timer_t tmo;           /* a timeout_ms other than the default's  */
  bool tmo_open;
  /* the default timeout_ms: due at tmo_due (the loop's clock, uv_now),
   * in the server's timeout list (window.c; request.c unlinks) */
  bool tmo_listed;
  uint64_t tmo_due;
  struct cn__req *tprev, *tnext;
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
  void (*parsed_cb)(struct cn__req *r); /* the loop, once it is parsed  */
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
  pthread_cond_t lcv;        /* a load joined `loaded` (server_stop)    */
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
  bool grpc_bound;           /* grpc-port bound, not yet listening: grpc_fd */
  int grpc_fd;
  int grpc_bound_port;
  uv_timer_t conn_timer;     /* the deadline sweep                     */
  cn__conn *conns;           /* every client connection (loop thread)  */
  int refused_conns;         /* beyond max-connections, being answered */
  uv_async_t done_async;
  const struct cn__http_hooks *http;     /* what the connections call    */
  const struct cn__conn_proto *conn_proto; /* conn.c -> conn_parse.c    */
  /* Where a request that waits goes instead of its window or loader
   * thread (http.c hand_over): the HTTP fuzz target answers them itself,
   * with no loop running. */
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
  /* max-answer-memory: bytes of answers written to connections and not
   * yet taken by their clients (conn.c), and bytes reserved for the
   * answers of requests admitted and not yet answered (request.c) */
  atomic_llong answer_held, answer_reserved;
  atomic_llong last_request_us;  /* cn_now_s() of the newest request (or,
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
  /* loop: the waiting requests with the default timeout_ms, in the order
   * they are due (submission order), and the one timer for its head:
   * a timer per request cost a heap insert, a close and its callback */
  cn__req *tmo_head, *tmo_tail;
  uv_timer_t tmo_timer;
  double drain_started;
  pthread_t *threads;
  int n_threads;
  /* the online retrainer (learned_policy.c) */
  pthread_mutex_t rtmu;
  pthread_cond_t rtcv;
  bool rt_stop, rt_started;
  pthread_t rt_thread;
  cn__metrics metrics;
  /* the parse stage of this loop turn (parse_time.c): its parses' wall
   * time by model, made CPU seconds when the turn's I/O callbacks are
   * over */
  uv_check_t parse_check;
  bool parse_open;           /* a parse ran in this turn              */
  double parse_cpu0, parse_wall0; /* the turn's first parse began     */
  int parse_n;
  int parse_model[CN__PARSE_MODELS];
  double parse_wall[CN__PARSE_MODELS];
  /* line readers that read request bodies without a DOM (request.c
   * cn__reader_take/give): a few kept between requests, under a flag */
  atomic_int readers_lock;
  int n_readers;
  cn_line_reader *readers[CN__READERS_KEPT];
  pthread_t loop_thread;       /* the thread running the loop, and its CPU
                                  seconds when it began serving (http_s) */
  double loop_cpu0;
};


/* The output tensors of the Open Inference Protocol (kserve.c), as bits of
 * a request's "outputs" (cn__req.v2_outputs). */
enum {
  CN__V2_LOGITS = 1u << 0,
  CN__V2_LABEL = 1u << 1,
  CN__V2_PATH_SCORE = 1u << 2,
  CN__V2_OUTPUT_TOKENS = 1u << 3,
  CN__V2_HIDDEN = 1u << 4,
  CN__V2_OFFSETS = 1u << 5
};

#endif
