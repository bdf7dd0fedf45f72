/* canopy_core.h - the public face of core/.
 *
 * core/ turns inputs into instance graphs, models into bound weights, runs
 * into batch sequences over one planned arena, and drives a backend through
 * the narrow interface in backend.h. It knows nothing of HTTP, threads or
 * devices; everything here is testable in-process.
 *
 * Conventions: functions return 0 or a negative CN_E_*
 * code; a cn_err filled on failure says what went wrong and where.
 */
#ifndef CANOPY_CORE_H
#define CANOPY_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------
 * One table: enum value, wire code (docs/api.md), HTTP status (the one place it
 * is decided), and a default message. libuv UV_ERRNO_MAP style. New codes
 * go at the end: the values are shared with the dlopen'd CUDA module,
 * which may be built apart. */
#define CN_ERRNO_MAP(XX)                                                      \
  XX(BAD_REQUEST, "bad_request", 400, "the HTTP request is malformed")       \
  XX(BAD_JSON, "bad_json", 400, "the body is not valid JSON")                 \
  XX(BAD_INSTANCE, "bad_instance", 400, "the instance is not valid")          \
  XX(BAD_TREE, "bad_tree", 400, "the tree is not valid")                      \
  XX(BAD_LATTICE, "bad_lattice", 400, "the lattice is not valid")             \
  XX(TOO_MANY_CHILDREN, "too_many_children", 400, "a node has too many children") \
  XX(NO_SUCH_MODEL, "no_such_model", 404, "no such model")                    \
  XX(NO_SUCH_ROUTE, "no_such_route", 404, "no such route")                    \
  XX(METHOD_NOT_ALLOWED, "method_not_allowed", 405, "method not allowed")     \
  XX(UNAUTHORIZED, "unauthorized", 401, "a bearer token is required")         \
  XX(FORBIDDEN, "forbidden", 403, "not allowed by the configuration")          \
  XX(UNAVAILABLE, "unavailable", 503, "the model is not available")           \
  XX(TOO_LARGE, "too_large", 413, "the request is over a configured limit")   \
  XX(OVERLOADED, "overloaded", 429, "the server is overloaded, retry later")  \
  XX(DRAINING, "draining", 503, "the server is shutting down")                \
  XX(TIMEOUT, "timeout", 504, "the request timed out")                        \
  XX(BAD_MODEL, "bad_model", 500, "the model could not be loaded")            \
  XX(BAD_CONFIG, "bad_config", 500, "the configuration is not valid")         \
  XX(IO, "io", 500, "input/output error")                                     \
  XX(NOMEM, "internal", 500, "out of memory")                                 \
  XX(BACKEND, "internal", 500, "the compute backend failed")                  \
  XX(INTERNAL, "internal", 500, "internal error")                             \
  XX(REQUEST_TIMEOUT, "request_timeout", 408,                                \
     "the request did not arrive in time")                                   \
  XX(URI_TOO_LONG, "uri_too_long", 414, "the request URL is too long")       \
  XX(HEADER_TOO_LARGE, "header_too_large", 431,                              \
     "the request headers are too large")                                    \
  XX(NOT_IMPLEMENTED, "not_implemented", 501,                                \
     "the request uses an HTTP feature the server does not support")         \
  XX(NON_FINITE, "non_finite", 500,                                          \
     "the model computed a non-finite value (NaN or infinity)")              \
  XX(OVER_BUDGET, "over_memory_budget", 413,                                 \
     "the instances do not fit the memory budget")                          \
  XX(ANSWER_MEMORY, "answer_memory_full", 503,                               \
     "the answers held for clients fill max-answer-memory, retry later")     \
  XX(UNSUPPORTED_ENCODING, "unsupported_encoding", 415,                      \
     "the body's Content-Encoding is not one the server takes")

typedef enum {
  CN_OK = 0,
#define CN__ERR_ENUM(name, code, status, msg) CN_E_##name,
  CN__ERR_FIRST = -1000,
  CN_ERRNO_MAP(CN__ERR_ENUM)
#undef CN__ERR_ENUM
  CN__ERR_LAST
} cn_errno;

const char *cn_err_code(int err);   /* "bad_tree"; "internal" if unknown  */
int cn_err_http_status(int err);    /* 400, 404, ...; 500 if unknown      */
const char *cn_err_default_msg(int err);

/* Written once in core/base for the daemon and the commands too: the
 * CLOCK_MONOTONIC clock in seconds, for durations only (util.c), and a
 * stat(2) st_mode in words: "a directory", "a FIFO", ... (file.c). */
double cn_now_s(void);
const char *cn_file_kind(unsigned mode);
/* glibc's mmap and trim thresholds both fixed at `bytes` for the process,
 * unless GLIBC_TUNABLES sets a malloc threshold (which then wins): the
 * daemon's small ones give memory back, `canopy run`'s large ones keep
 * it for the next run (util.c). */
void cn_malloc_thresholds(size_t bytes);
/* The calling thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID): the
 * stage times (docs/daemon.md "Stage times") are read with it, a few
 * times a run, so that they add up to CPU time and not to time waited. */
double cn_thread_cpu_s(void);
/* The Levenshtein distance of a and b, capped at 3 (a did-you-mean is
 * worth one or two edits, never more); letters compared without case when
 * fold_case. Strings over 64 bytes count as 3 (util.c). */
int cn_edit_distance(const char *a, const char *b, bool fold_case);

/* ---- answers written without printf or a JSON tree (base/jsonw.c) ----
 * A float32 as the shortest decimal that strtof reads back as the same
 * float32 (Ryū, base/f32fmt.c), laid out as "%.9g" lays out: fixed for
 * decimal exponents -4..8, else d.ddde-X; ".0" after an integer; "null"
 * for NaN and infinity. out holds CN_JSON_FLOAT_MAX + 1 bytes; returns
 * the length (NUL-terminated). */
size_t cn_f32_json(float x, char *out);
/* x's shortest digits and exponent (x = digits · 10^exp10); 0, or -1 for
 * NaN and infinity. Zero is digits 0. */
int cn_f32_shortest(float x, uint32_t *digits, int *exp10);
/* A growable output buffer. Appending never fails on its own: it sets
 * failed (no memory) and later appends do nothing. */
typedef struct cn_buf {
  char *p;
  size_t len, cap;
  int failed;
} cn_buf;
/* Room for n more bytes at b->p + b->len (NULL: no memory). */
char *cn_buf_room(cn_buf *b, size_t n);
void cn_buf_put(cn_buf *b, const char *s, size_t n);
void cn_buf_puts(cn_buf *b, const char *s);
void cn_buf_float(cn_buf *b, float x);  /* cn_f32_json */
void cn_buf_int(cn_buf *b, long long v);
/* A real as cn_buf_json writes one: a float32 value by cn_f32_json, any
 * other as jansson's "%.9g" (durations in the stats). */
void cn_buf_double(cn_buf *b, double x);
/* s as a JSON string (quoted; escapes as jansson's compact dump does). */
void cn_buf_string(cn_buf *b, const char *s);
/* n floats as a JSON array; returns whether all were finite (a non-finite
 * one prints as null). */
int cn_buf_floats(cn_buf *b, const float *x, int64_t n);
void cn_buf_free(cn_buf *b);
/* A JSON value written compactly, as json_dumps(JSON_COMPACT |
 * JSON_REAL_PRECISION(9)) writes it but for reals that are float32
 * values: those in cn_f32_json's shortest form. For what is not on a hot
 * path (errors, stats, v2 answers) that still holds a json_t. */
void cn_buf_json(cn_buf *b, const json_t *j);

/* Error detail: what and where. instance/node/offset are -1 when unknown. */
typedef struct cn_err {
  int code;            /* CN_E_* */
  int instance;        /* index of the instance in its request / input file */
  int node;            /* node, token or span index inside the instance */
  long long offset;    /* byte offset inside the instance's text */
  char msg[320];
} cn_err;

void cn_err_clear(cn_err *e);
/* Sets code and a printf-style message; returns code so callers can
 * `return cn_err_set(err, CN_E_BAD_TREE, "...")`. */
int cn_err_set(cn_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* {"error": {"code", "message", "instance"?, "node"?, "offset"?}} */
json_t *cn_err_to_json(const cn_err *e);

/* ---- limits on inputs (config/ fills them; core enforces them) -------- */
typedef struct cn_limits {
  int max_nodes;       /* vertices of one tree / tokens of one sequence     */
  int max_depth;       /* tree depth, leaf = 1                              */
  int max_token_len;   /* bytes of one word or label                        */
  int max_children;    /* children of one node (childsum-treelstm)          */
  int max_seq_len;     /* tokens of a sequence, chars of a lattice, DAG nodes */
  int max_spans;       /* word spans of one lattice / prev edges of one DAG */
} cn_limits;

void cn_limits_default(cn_limits *l);

/* ---- models ------------------------------------------------------------ */
typedef struct cn_model cn_model;

typedef enum {
  CN_INPUT_TREE = 0,
  CN_INPUT_SEQUENCE,
  CN_INPUT_LATTICE,
  CN_INPUT_DAG
} cn_input_kind;

const char *cn_input_kind_name(cn_input_kind k);

/* Loads and checks a model directory (model.json, weights.safetensors,
 * vocabularies). Either the whole model is returned in *out, or nothing is
 * and err says which file, key or tensor is wrong. The caller owns *out and
 * frees it with cn_model_free. A loaded model is immutable and may be shared
 * by any number of threads. */
int cn_model_load(const char *dir, cn_model **out, cn_err *err);
void cn_model_free(cn_model *m);

const char *cn_model_family(const cn_model *m);
cn_input_kind cn_model_input(const cn_model *m);
int cn_model_n_types(const cn_model *m);
const char *cn_model_type_name(const cn_model *m, int type);
/* Family, sizes, labels, input kind, vertex types, weights_sha256 (new
 * reference). */
json_t *cn_model_describe(const cn_model *m);
/* SHA-256 (hex) of the weights file as it was read at load time; the model
 * keeps its own copy of the weights, whatever happens to the file. */
const char *cn_model_weights_sha256(const cn_model *m);
/* model.json's optional "version" string, or NULL. */
const char *cn_model_named_version(const cn_model *m);

/* Writes a fresh model directory: model.json, weights.safetensors with
 * deterministic random weights (scaled so activations do not saturate) and
 * vocabularies built from a JSONL data file (or a tiny built-in list). */
typedef struct cn_model_init_opts {
  const char *family;
  const char *dir;
  int hidden, embed, classes;  /* 0: family default */
  const char *vocab_from;      /* JSONL file of instances, or NULL */
  uint64_t seed;
  int max_vocab;               /* 0: default */
  const char *lexicon;         /* latticelstm: word list copied into the
                                  model (spans for requests without words) */
  int crf;                     /* bilstm-tagger: add the CRF layer (random
                                  crf.* tensors, "crf": true) */
} cn_model_init_opts;

int cn_model_init(const cn_model_init_opts *o, cn_err *err);

/* ---- instances -----------------------------------------------------------
 * A parsed and validated input, ready to join a run. It owns its memory and
 * refers to the model it was parsed for (which must outlive it). */
typedef struct cn_instance cn_instance;

/* Parses one INSTANCE object of docs/api.md for model m. index is the
 * instance's position in its request, copied into err->instance on
 * failure. */
int cn_instance_parse(const cn_model *m, const json_t *inst,
                      const cn_limits *lim, int index, cn_instance **out,
                      cn_err *err);
void cn_instance_free(cn_instance *inst);
/* A reader of instance lines (one JSON object a line, as `canopy run`
 * reads them), reused line after line: what it reads lives in its arena
 * until cn_line_reader_reset, which keeps the memory for the next lines.
 * One thread at a time. */
typedef struct cn_line_reader cn_line_reader;
cn_line_reader *cn_line_reader_new(void);
void cn_line_reader_free(cn_line_reader *rd);
/* Every instance read so far is gone (cn_instance_free is a no-op for
 * them): their memory serves the next ones. */
void cn_line_reader_reset(cn_line_reader *rd);
/* The instance of line[0 .. len) for model m, read without a JSON DOM, as
 * cn_instance_parse would read json_loadb's object of it. Returns 0 (*out
 * set, in rd's arena), 1 when it does not read this line (another shape,
 * or anything cn_instance_parse would refuse: parse it that way, which
 * says why), or CN_E_NOMEM. It never reports an error of its own. */
int cn_instance_parse_line(const cn_model *m, cn_line_reader *rd,
                           const char *line, size_t len, const cn_limits *lim,
                           cn_instance **out);
/* The instance object that opens at buf[at], inside a larger document
 * buf[0 .. len) (an element of a request's "instances"), read as
 * cn_instance_parse_line reads a line; *end gets the index just past its
 * closing brace. Returns 0, 1 (not read: parse it with jansson and
 * cn_instance_parse, which says why), or CN_E_NOMEM (instance_at.c). */
int cn_instance_parse_at(const cn_model *m, cn_line_reader *rd,
                         const char *buf, size_t len, size_t at,
                         const cn_limits *lim, cn_instance **out,
                         size_t *end);
/* The first key of object o that is an instance's form, of any input kind
 * ("tree", "tokens", "text", "chars", "words", "nodes"); NULL when none. */
const char *cn_instance_form_in(const json_t *o);
/* A small synthetic INSTANCE object of m's input kind (docs/api.md), made from
 * m's own vocabularies, that touches every vertex type a real input of
 * that kind touches: what a daemon runs on each worker before a version
 * serves (docs/daemon.md "Warm-up"). New reference; parse it with
 * cn_instance_parse like a request's. */
json_t *cn_model_warmup_instance(const cn_model *m);
/* Words of the instance that are not in the model's vocabulary (looked up
 * as id 0, '<unk>'): tree leaves, sequence tokens, lattice characters, DAG
 * nodes. Returns how many; writes the first cap positions to pos (may be
 * NULL): a tree leaf's position among the leaves left to right, a token's,
 * a character's or a DAG node's index. */
int cn_instance_unknown(const cn_instance *inst, int32_t *pos, int cap);
/* A tree's internal nodes whose label (a bracket label, or a JSON node's
 * "label") the model does not list, and which therefore took the default
 * internal type: for a model whose node types are chosen by label
 * (treelstm-2type's type_b_labels, a "cells" model's label types;
 * cn_model_reads_labels). 0 for every other model and input kind. */
int cn_instance_unknown_labels(const cn_instance *inst);
/* 1 when the model chooses a tree node's type by its label (its stats
 * then carry unknown_labels), else 0. */
int cn_model_reads_labels(const cn_model *m);
/* Vertices this instance adds to a run (for the per-run vertex limit). */
size_t cn_instance_vertices(const cn_instance *inst, int outputs_all);
/* An upper bound, in bytes, on the JSON of this instance's output object
 * (docs/api.md) as the daemon prints it (compact, floats by cn_f32_json,
 * never longer than JSON_REAL_PRECISION(9) printed them), for
 * the request's flags (CN_OUT_*) and max_decode_len (0: the model's):
 * from the model's dimensions, its label and token strings and the
 * instance's size alone, before anything runs (the daemon's
 * max-answer-bytes, docs/daemon.md). */
int64_t cn_model_answer_bound(const cn_model *m, const cn_instance *inst,
                              unsigned flags, int max_decode_len);
/* The most characters one float (a 32-bit value, or null when it is not
 * finite) prints as, by cn_f32_json or at JSON_REAL_PRECISION(9):
 * "-1.23456789e-38" (test_f32fmt and f32fmt_all check cn_f32_json). */
enum { CN_JSON_FLOAT_MAX = 15 };

/* ---- runs ------------------------------------------------------------- */
typedef enum {
  CN_POLICY_NONE = 0, /* one instance at a time, vertex by vertex: reference */
  CN_POLICY_DEPTH,    /* TensorFlow Fold: same type, same topological depth  */
  CN_POLICY_AGENDA,   /* DyNet: ready type of least average depth first      */
  CN_POLICY_SUFFICIENT, /* ED-Batch §5.3: ready type maximising eq. 1's ratio */
  CN_POLICY_LOOKAHEAD, /* the ready type that lowers the bound on what is
                          left the most (static graphs; sched.c)           */
  CN_POLICY_LOOKAHEAD2, /* lookahead two batches deep, ties to the
                           instances furthest behind (frontier.c)          */
  CN_POLICY_PLAN,     /* a beam search over the whole run graph before it
                         runs, never more batches than lookahead2
                         (dag_beam.c); a graph that grows: lookahead2    */
  CN_POLICY_FSM,      /* ED-Batch §2: a learned FSM (cn_run_exec_fsm); with
                         no policy object, the agenda choice                */
  CN_POLICY__COUNT
} cn_policy_kind;

const char *cn_policy_name(cn_policy_kind p);
int cn_policy_parse(const char *name, cn_policy_kind *out);

/* How a compiled vertex function's memory is laid out (ED-Batch
 * §3): every cell is compiled from its op IR (core/cell/cell.h); pq places
 * its variables by the PQ-tree layout (the default), naive gives every
 * variable its own buffer (gathers and scatters around each batched
 * product: the baseline pq is measured against). */
typedef enum {
  CN_LAYOUT_PQ = 0,
  CN_LAYOUT_NAIVE,
  CN_LAYOUT__COUNT
} cn_layout;

const char *cn_layout_name(cn_layout l);
/* "pq" or "naive"; also "fused", the name of the hand-written kernels the
 * compiled cells replaced, read as pq so that old configs and
 * scripts keep working. */
int cn_layout_parse(const char *name, cn_layout *out);

/* The compiled cells of each vertex type (`canopy model info`): per
 * layout, products, fused kernels, copies, compile time. */
json_t *cn_model_describe_cells(const cn_model *m);

/* Per-execution figures of one vertex type's cell (cn_run_bench_type). */
typedef struct cn_cell_bench {
  int compiled;       /* 0: the type runs hand-written kernels only       */
  int n;              /* vertices per execution                           */
  double us;          /* mean microseconds per execution                  */
  long long kernels;  /* launches per execution (gathers included)        */
  size_t cell_bytes;  /* bytes copied inside the cell                     */
  size_t gather_bytes;/* bytes moved between vertices                     */
  int products, fused_kernels, copy_kernels;
  double compile_ms;
} cn_cell_bench;

/* Per-instance request options. */
enum {
  CN_OUT_ALL = 1u << 0,       /* outputs: "all" (every tree node)          */
  CN_OUT_HIDDEN = 1u << 1,    /* return_hidden                              */
  CN_OUT_UNKNOWN = 1u << 2    /* unknown_positions: the daemon's stats list
                                 them (cn_instance_unknown)                 */
};

typedef struct cn_run_stats {
  int instances;
  long long vertices;
  long long batches;      /* batched vertex launches                        */
  long long lower_bound;  /* sum over types of depth_t (docs/models.md)     */
  size_t arena_bytes;     /* bytes of the run's planned arena: the states'
                             live high-water mark plus the scratch        */
  size_t state_bytes;     /* of which states (docs/memory.md)              */
  size_t state_bytes_total; /* every vertex's state at once: the state
                               region without reuse                       */
  long long policy_batches; /* the policy's batches, before the memory
                               order or budget changed them               */
  size_t arena_bytes_unbudgeted; /* the arena at the policy's batch count,
                                    before a budget added batches (equal to
                                    arena_bytes without a budget)        */
  size_t gather_bytes;    /* bytes moved by child gathers and scatters      */
  long long kernels;      /* backend calls (gemm, gather, fused kernels)    */
  size_t cell_bytes;      /* bytes moved by copies inside vertex functions  */
  /* the backend's counters over the run (zero on cpu) */
  long long device_syncs;    /* host waits for the device                  */
  long long bytes_to_device; /* host -> device                             */
  long long bytes_to_host;   /* device -> host: what the answers read      */
  long long device_allocs;   /* device / pinned allocations                */
  long long launches;        /* kernel launches                            */
  long long copies_to_device; /* host -> device copies (uploads) made      */
  /* CPU seconds of the calling thread (cn_thread_cpu_s) in cn_run_exec
   * and cn_run_wait: planning the batches and the arena (schedule_s), and
   * the batches, the copy back and the family's finish (execute_s). A
   * growing graph's run counts all of it as execute_s. */
  double schedule_s, execute_s;
} cn_run_stats;

typedef struct cn_backend_ctx cn_backend_ctx;
typedef struct cn_run cn_run;

/* What a backend counts as it works: a run reports the
 * difference over its execution, /metrics the totals. A host-memory
 * backend (cpu) leaves them at zero. */
typedef struct cn_backend_counters {
  long long syncs;           /* waits of the host for the device           */
  long long bytes_to_device; /* host -> device: indices, weights, states   */
  long long bytes_to_host;   /* device -> host: results, argmax rows       */
  long long allocs;          /* device and pinned-host allocations made    */
  long long launches;        /* kernel launches (a cuBLAS call counts one) */
  long long device_bytes;    /* device memory held now (not a difference)  */
  long long copies_to_device; /* host -> device copies: each a copy the
                                 stream runs in order with the kernels   */
} cn_backend_counters;

/* A run gathers many instances and executes them together. It borrows the
 * model, the backend context and the instances: all must outlive it. */
cn_run *cn_run_new(const cn_model *m, cn_backend_ctx *bk);
/* Makes r, executed or not, a fresh run of m on bk, as cn_run_new would
 * (every setting back to its default, its instances dropped, its arena
 * given back to its backend), but keeps the host arrays its graph and
 * plan grew, so that a caller that runs batch after batch (a job of
 * `canopy run`, a worker of the daemon) allocates and first-touches
 * nothing for them once it has seen its largest run. Arrays holding more
 * than CN_RUN_KEEP_BYTES in all are freed instead (docs/memory.md): what
 * a caller keeps between runs is bounded. The backend arena is never
 * kept: a run's arena and its budget are its own. 0 or CN_E_NOMEM
 * (then r is as cn_run_free left nothing of it but r: free it). */
#define CN_RUN_KEEP_BYTES ((long long)64 << 20)
int cn_run_reset(cn_run *r, const cn_model *m, cn_backend_ctx *bk);
/* Chooses the layout the run's vertex functions execute with (default
 * CN_LAYOUT_PQ); before cn_run_exec. */
void cn_run_set_layout(cn_run *r, cn_layout layout);
/* The beam width of CN_POLICY_PLAN's search before each run (default
 * CN_PLAN_WIDTH_DEFAULT; values below 1 count as 1): wider finds shorter
 * schedules for more CPU time. Before cn_run_exec. */
#define CN_PLAN_WIDTH_DEFAULT 16
void cn_run_set_plan_width(cn_run *r, int width);
/* Memory by liveness (docs/memory.md): a planned run reuses a state row's
 * space after the last batch that reads it (default 1; the
 * environment's CANOPY_ARENA_REUSE=0 makes it 0). Off, every vertex
 * keeps its row to the end, as a run that is benchmarked afterwards
 * (cn_run_bench_type) needs. Before cn_run_exec. */
void cn_run_set_arena_reuse(cn_run *r, int reuse);
/* Tests (docs/testing.md): fill rows with NaN when their space is freed,
 * so a read after reuse cannot pass unnoticed (default: the environment's
 * CANOPY_POISON_FREED=1). Before cn_run_exec. */
void cn_run_set_poison(cn_run *r, int poison);
/* Memory-aware order (docs/memory.md): with reuse on, a planned
 * run's batches are reordered to the lowest peak of live state bytes
 * found at no more batches than the policy's (default 1; the
 * environment's CANOPY_MEMORY_ORDER=0 makes it 0). Before cn_run_exec. */
void cn_run_set_memory_order(cn_run *r, int on);
/* A memory budget: the run's arena (states + scratch) may hold at most
 * `bytes` (0: none). The run plans under it with as few extra batches as
 * it finds (inserted batches, then its instances in groups one after
 * another); cn_run_exec fails with CN_E_OVER_BUDGET, saying what the
 * best plan needs, when not even that fits (one instance alone over the
 * budget). Outputs are the same with and without it. Before cn_run_exec. */
void cn_run_set_memory_budget(cn_run *r, long long bytes);
/* The smallest memory budget, in bytes, under which m's warm-up instance
 * (cn_model_warmup_instance: a few vertices of each type, root output
 * only) has a plan with `policy` (fsm: the agenda it falls back to),
 * `layout` and `plan_width` on bk: under a smaller budget every request of m is refused
 * (413), so a command refuses such a budget at start-up naming this
 * value. 0 when no budget applies to m's runs (a graph that grows while
 * it runs) or its vocabulary makes no instance. Plans only (a bisection
 * over budgets): nothing executes, nothing is allocated on bk. */
int cn_run_min_budget(const cn_model *m, cn_backend_ctx *bk,
                      cn_policy_kind policy, cn_layout layout,
                      int plan_width, long long *bytes, cn_err *err);
/* After cn_run_exec: re-executes n vertices of one of the run's batches of
 * `type` iters times with `layout` and measures them (the ED-Batch Table 2
 * style report; the run's outputs are unchanged). out->n is 0 when the run
 * has no vertex of the type. Static families only. */
int cn_run_bench_type(cn_run *r, int type, cn_layout layout, int n, int iters,
                      cn_cell_bench *out, cn_err *err);
/* Room for the graph of about `instances` instances and `vertices`
 * vertices before the first cn_run_add (a caller that runs batch after
 * batch of similar size passes the last one's counts, cn_run_stats), so
 * the graph's arrays are allocated once instead of grown by doubling.
 * Only a hint: cn_run_add grows past it. 0 or CN_E_NOMEM. */
int cn_run_reserve(cn_run *r, int instances, long long vertices);
/* Adds an instance; returns its slot (0, 1, ...) or a negative error.
 * max_decode_len: lstm-nmt cap from the request (0: model default). */
int cn_run_add(cn_run *r, const cn_instance *inst, unsigned flags,
               int max_decode_len);
/* Plans the arena, schedules with the policy, executes every batch. */
int cn_run_exec(cn_run *r, cn_policy_kind policy, cn_err *err);
/* Host and device overlap (docs/cuda.md): with async
 * on (before cn_run_exec), cn_run_exec on a device backend returns as
 * soon as every batch and the copy of what the answers read are issued,
 * so the caller can prepare its next run while the device computes this
 * one; cn_run_wait then waits for the copy and runs the family's host
 * pass. Outputs and stats are read after cn_run_wait. Up to two runs of
 * one backend context may wait at once (its two fetch buffers): wait for
 * a run, and read its outputs, before the second run after it executes.
 * Families whose graph grows while running (lstm-nmt) and host backends
 * compute everything in cn_run_exec; cn_run_wait is then a no-op. */
void cn_run_set_async(cn_run *r, int on);
int cn_run_wait(cn_run *r, cn_err *err);
/* The per-instance output object of docs/api.md (new reference). JSON holds no
 * NaN or infinity: a non-finite value the model computed is null there,
 * and cn_output_check finds it. On a device backend the rows it reads
 * live in a host buffer the backend context reuses: read a run's outputs
 * before the context executes another run. */
json_t *cn_run_output(const cn_run *r, int slot);
/* cn_run_output's object appended to b, written once (no json_t on the
 * way for the families that write their own: every float by cn_f32_json;
 * the same keys in the same order). 0, or CN_E_NON_FINITE (as
 * cn_output_check says it; b left as it was) or CN_E_NOMEM. */
int cn_run_write_output(const cn_run *r, int slot, cn_buf *b, cn_err *err);
/* 0, or CN_E_NON_FINITE with err naming the first field of the output
 * object o (of cn_run_output or cn_decode_output) that holds a non-finite
 * value: "logits", "nodes[3].logits", "h", "path_score". */
int cn_output_check(const json_t *o, cn_err *err);
void cn_run_get_stats(const cn_run *r, cn_run_stats *s);
/* Batches and lower bound of the instance's own vertices alone are not
 * meaningful under batching; docs/api.md reports the run's. */
void cn_run_free(cn_run *r);

/* ---- learned batching policies (ED-Batch §2) -----------------------------
 * A cn_fsm maps the state E(frontier) to the vertex type to batch next. It
 * is learned per model by tabular Q-learning on a sample of run graphs,
 * kept on disk in a policy cache, and immutable once built: any number of
 * threads may execute runs with one. References are counted (atomically):
 * cn_fsm_retain adds one, cn_fsm_free drops one and frees at zero. */
typedef struct cn_fsm cn_fsm;

typedef enum {
  CN_FSM_ENC_BASE = 0, /* E_base: the set of types on the frontier          */
  CN_FSM_ENC_MAX,      /* E_max: E_base plus the most common type           */
  CN_FSM_ENC_SORT,     /* E_sort: the types sorted by frontier count        */
  CN_FSM_ENC_BOUND,    /* E_max plus the types whose batch would lower the
                          bound on what is left the most (static graphs)   */
  CN_FSM_ENC__COUNT
} cn_fsm_encoding;

const char *cn_fsm_encoding_name(cn_fsm_encoding e);
int cn_fsm_encoding_parse(const char *name, cn_fsm_encoding *out);

/* Training hyper-parameters; cn_fsm_opts_default fills the defaults shown. */
typedef struct cn_fsm_opts {
  cn_fsm_encoding encoding; /* bound                                        */
  int iterations;           /* 1000 episodes (one training graph each)      */
  int eval_every;           /* 50: greedy evaluation, best table kept       */
  int nstep;                /* 4: n-step bootstrapping                      */
  double alpha;             /* 0.5: eq. 1's α                               */
  double learning_rate;     /* 0.2                                          */
  double gamma;             /* 1.0 (episodic)                               */
  double epsilon_start;     /* 0.5: ε-greedy, decayed linearly to ...       */
  double epsilon_end;       /* 0.02                                         */
  uint64_t seed;            /* 1                                            */
  double time_limit_s;      /* 60: stop (keeping the best table) after this */
  int fallback;             /* 1: execute agenda or depth instead when one
                               of them launches fewer batches on the
                               training sample                              */
  int polish_rounds;        /* 8: rounds of coordinate descent on the
                               greedy table after Q-learning (0: none)      */
} cn_fsm_opts;

void cn_fsm_opts_default(cn_fsm_opts *o);

/* A bounded set of run graphs: compact copies of the typed DAGs (vertex
 * types and input edges only), the most recent `capacity` kept (a ring:
 * the oldest is dropped). The online reservoir, and the training sample.
 * Not thread-safe: guard adds with a lock and train from a snapshot (which
 * shares the immutable graphs, O(capacity)). */
typedef struct cn_graph_set cn_graph_set;

cn_graph_set *cn_graph_set_new(int n_types, int capacity);
void cn_graph_set_free(cn_graph_set *s);
/* Copies r's typed DAG (call after cn_run_add, before or after exec). */
int cn_graph_set_add_run(cn_graph_set *s, const cn_run *r);
int cn_graph_set_count(const cn_graph_set *s);
cn_graph_set *cn_graph_set_snapshot(const cn_graph_set *s);
/* Batches the policy launches over every graph of the set (fsm used with
 * CN_POLICY_FSM), and the sum of their lower bounds; < 0 on error. */
long long cn_graph_set_batches(const cn_graph_set *s, cn_policy_kind policy,
                               const cn_fsm *fsm, long long *lower_bound);

/* The fewest batches graph i of the set can run in: an exact search
 * (IDA*, dag_optimum.c) expanding at most `budget` states, for measuring how
 * far policies are from the best possible, not for serving. exact = 1:
 * lower == upper is the optimum; else lower is proven and upper is the
 * best schedule known: the heuristics' and, with beam > 0, a beam search
 * of that width. policy[p]: batches of depth, agenda, sufficient,
 * lookahead, lookahead2 and plan (indexed by cn_policy_kind). */
typedef struct cn_optimum {
  long long lower_bound; /* Σ_t depth_t (docs/models.md)                  */
  long long lower, upper;
  int exact;
  long long nodes;       /* states the search expanded                    */
  long long beam;        /* the beam search's batches (0: not run)        */
  long long policy[CN_POLICY__COUNT];
} cn_optimum;
int cn_graph_set_optimum(const cn_graph_set *s, int i, long long budget,
                         int beam, cn_optimum *out);

/* Learns a policy for m from the graphs (all of m's type count). Takes
 * about iterations × one schedule of a graph; never blocks on I/O. */
int cn_fsm_train(const cn_model *m, const cn_graph_set *train,
                 const cn_fsm_opts *o, cn_fsm **out, cn_err *err);
cn_fsm *cn_fsm_retain(const cn_fsm *p);
void cn_fsm_free(cn_fsm *p);
cn_fsm_encoding cn_fsm_get_encoding(const cn_fsm *p);
/* Batches of the policy on its training sample (and their lower bound). */
long long cn_fsm_train_batches(const cn_fsm *p, long long *lower_bound);
/* {"kind", "encoding", "executes", "states", "trained_on_graphs",
 *  "trained_on_vertices", "iterations", "train_seconds", "batches":
 *  {"fsm", "agenda", "depth", "sufficient", "lower_bound"}, "key"}. */
json_t *cn_fsm_describe(const cn_fsm *p);
/* Plans the run with the learned policy, then as cn_run_exec. The policy
 * must have been trained for the run's model. */
int cn_run_exec_fsm(cn_run *r, const cn_fsm *p, cn_err *err);

/* One file (JSON) per model; written to a temporary file then renamed. */
int cn_fsm_save(const cn_fsm *p, const char *path, cn_err *err);
/* Loads a policy for m with encoding enc. Fails (CN_E_BAD_MODEL, saying
 * why) when the file is corrupt or its key (m's family, types, weights
 * file, enc) does not match: such a file is never trusted. CN_E_IO when it
 * cannot be read. */
int cn_fsm_load(const cn_model *m, cn_fsm_encoding enc, const char *path,
                cn_fsm **out, cn_err *err);

/* ---- decode sessions (run_decode.c) ---------------------------------------
 * Iteration-level batching of a model whose graph grows as it runs
 * (lstm-nmt decoding; Orca's iteration-level scheduling, BatchMaker's
 * cellular batching): a session is a run that never closes. Instances are
 * added between steps and join the frontier at once (their encoder first,
 * then the decode loop); each step is one iteration, a batch of every type
 * ready when it starts (so every instance advances each step); an instance whose graph is complete (it emitted </s> or hit its
 * cap) is reported done at the step that completed it, however long the
 * others go on. Every vertex reads only its own instance's states, and a
 * backend computes a row alike in any batch, so an instance's output equals
 * decoding it alone or in a whole run, bit for bit.
 *
 *   cn_decode *d = cn_decode_new(m, bk, CN_POLICY_AGENDA, NULL);
 *   slot = cn_decode_add(d, inst, flags, max_decode_len);  // any time
 *   while (cn_decode_active(d) > 0) {
 *     cn_decode_step(d, &err);
 *     n = cn_decode_take_done(d, done, cap);   // then, for each:
 *     out = cn_decode_output(d, done[i]);      // once; frees its rows
 *     ... cn_decode_add() the instances that arrived meanwhile ...
 *   }
 *   cn_decode_free(d);
 *
 * Like a run, a session borrows the model, the backend context and each
 * instance until cn_decode_output has been called for its slot. Memory:
 * the states of released slots are dropped when the state arena is
 * compacted (whenever it has doubled since the last compaction); the
 * graph's bookkeeping (tens of bytes a vertex) grows with the session, so
 * a long-lived user starts a new session now and then (cn_decode_vertices).
 * Policies: the frontier ones (agenda, sufficient, lookahead, lookahead2,
 * fsm with `fsm`); the static plans (none, depth, plan) run as agenda. */
typedef struct cn_decode cn_decode;
/* Whether the model's family decodes (a graph that grows while it runs). */
int cn_model_decodes(const cn_model *m);
cn_decode *cn_decode_new(const cn_model *m, cn_backend_ctx *bk,
                         cn_policy_kind policy, const cn_fsm *fsm);
void cn_decode_set_layout(cn_decode *d, cn_layout layout);
/* Adds an instance between steps; returns its slot (0, 1, ... in the
 * order added) or a negative error (then the session is unusable: every
 * later call fails). */
int cn_decode_add(cn_decode *d, const cn_instance *inst, unsigned flags,
                  int max_decode_len);
/* Executes one iteration (at most one batch per vertex type): 1, or 0 when
 * nothing is ready (every instance done), or a negative error (err set). */
int cn_decode_step(cn_decode *d, cn_err *err);
/* Writes up to cap slots that finished since the last call; returns how
 * many (the rest wait for the next call). */
int cn_decode_take_done(cn_decode *d, int *slots, int cap);
/* The output object of a finished slot (new reference, as cn_run_output);
 * once per slot: its states may then be dropped. NULL for a slot that is
 * not finished or was already output. */
json_t *cn_decode_output(cn_decode *d, int slot);
/* Instances added and not finished. */
int cn_decode_active(const cn_decode *d);
/* Vertices the session's graph holds (every instance ever added). */
long long cn_decode_vertices(const cn_decode *d);
/* Batches executed so far (the step count). */
long long cn_decode_batches(const cn_decode *d);
/* As cn_run_get_stats, over the session so far (arena_bytes: the state
 * arena's current size). */
void cn_decode_get_stats(const cn_decode *d, cn_run_stats *s);
void cn_decode_free(cn_decode *d);

/* ---- the policy cache (policy_cache.c) -----------------------------------
 * `canopy policy train`, `run` and `serve` share one default directory:
 * $CANOPY_POLICY_CACHE, else $XDG_CACHE_HOME/canopy/policies, else
 * $HOME/.cache/canopy/policies, else /tmp/canopy-policies. */
int cn_policy_cache_default_dir(char *buf, size_t cap);
/* <dir>/<model dir name>-<hash of its real path>.fsm.json */
int cn_policy_cache_path(const cn_model *m, const char *dir, char *buf,
                         size_t cap);

typedef enum {
  CN_CACHE_HIT = 0, /* *out is the cached policy                           */
  CN_CACHE_MISS,    /* no file                                             */
  CN_CACHE_STALE,   /* a file for other weights/types/encoding: ignored    */
  CN_CACHE_CORRUPT  /* unreadable or damaged: ignored                      */
} cn_cache_status;

/* Returns a cn_cache_status (err->msg says why for STALE and CORRUPT, to
 * be logged as a warning) or a negative error. dir NULL: the default. */
int cn_policy_cache_load(const cn_model *m, const char *dir,
                         cn_fsm_encoding enc, cn_fsm **out, cn_err *err);
/* Creates dir if needed; atomic replace of the model's file. */
int cn_policy_cache_store(const cn_model *m, const char *dir,
                          const cn_fsm *p, cn_err *err);

#ifdef __cplusplus
}
#endif
#endif /* CANOPY_CORE_H */
