/* config.h - Canopy's configuration: one declarative table of keys (name,
 * type, bounds, default, help), filled from defaults, then a config file,
 * then CANOPY_* environment variables, then command-line flags. A bad value
 * stops start-up with a message naming the key (redis config.c style). */
#ifndef CANOPY_CONFIG_H
#define CANOPY_CONFIG_H

#include <stdbool.h>
#include <stdio.h>

#include "canopy_core.h"

/* The daemon's settings (`canopy serve`); see config/canopy.conf. */
typedef struct cn_serve_config {
  char host[256];          /* listen address (IPv4 or IPv6 literal)       */
  int port;
  int grpc_port;           /* the gRPC front end's port; 0: none          */
  int grpc_max_message_bytes; /* largest gRPC request message             */
  bool reuse_port;         /* SO_REUSEPORT: share the port on purpose     */
  char models_dir[1024];
  char config[1024];       /* the config file this came from, if any      */
  char backend[16];
  char policy[16];          /* none|depth|agenda|sufficient|fsm          */
  char layout[8];           /* fused|naive|pq (core/cell/cell.h)              */
  char policy_cache[1024];  /* "": cn_policy_cache_default_dir            */
  char encoding[16];        /* fsm state encoding: base|max|sort|bound    */
  int plan_width;           /* policy plan: beam width                    */
  int retrain_interval_s;   /* online retraining period, 0 = off          */
  int reservoir_graphs;     /* run graphs kept per model for retraining   */
  int retrain_min_graphs;   /* fewer graphs than this: no retraining      */
  char log_level[16];
  int workers;
  int blas_threads;        /* 0: max(1, cores / workers)                  */
  int max_delay_us;        /* aggregation window                          */
  bool work_conserving;    /* an idle worker starts a run at once         */
  bool continuous_decoding; /* lstm-nmt: join decode runs in flight       */
  int max_instances;       /* instances that close a run                  */
  int split_min_instances; /* split a closing run among idle workers      */
  int max_vertices;        /* vertices that close a run; bigger: 413      */
  int queue_depth;         /* instances waiting for a worker; beyond: 429 */
  int max_body_bytes;
  int max_body_memory;
  int max_answer_bytes;    /* bound on one answer's JSON; beyond: 413     */
  int max_answer_memory;   /* answers held or reserved at once; beyond: 503 */
  int max_instances_per_request;
  int timeout_ms;          /* default per-request timeout, 0 = none       */
  int drain_grace_ms;
  int max_connections;
  int idle_timeout_s;      /* keep-alive connections idle this long close */
  int header_timeout_s;    /* a request head must arrive within this      */
  int body_timeout_s;      /* a request body must arrive within this      */
  char model_control[16];  /* none | explicit | poll                      */
  int poll_interval_s;     /* model-control poll: rescan this often       */
  char repository_token[256]; /* bearer token of the mutating routes      */
  bool repository_insecure; /* those routes with no token off loopback   */
  int max_loads;           /* model loads in flight at once; beyond: 429  */
  bool strict_startup;     /* one model failing to load stops start-up    */
  bool warmup;             /* each worker runs a version once before it serves */
  long long memory_budget; /* arena bytes one worker's run may hold, 0: no
                              budget (docs/memory.md)                    */
} cn_serve_config;

#define CN_CONFIG_MAX_KEYS 128

/* Where a key's value came from: --print-config says it beside each. */
typedef enum {
  CN_CFG_FROM_DEFAULT = 0,
  CN_CFG_FROM_FILE,      /* line: the config file's line                 */
  CN_CFG_FROM_ENV,       /* CANOPY_<KEY>                                 */
  CN_CFG_FROM_FLAG       /* --key (or cn_config_set)                     */
} cn_config_from;

typedef struct cn_config {
  /* the values */
  cn_limits limits;
  cn_serve_config serve;
  /* where each key's value came from, by index in cn_config_keys (set by
   * the parsers below; not a setting) */
  unsigned char from[CN_CONFIG_MAX_KEYS];
  int line[CN_CONFIG_MAX_KEYS];
} cn_config;

/* CN_CFG_BYTES: a long long of bytes, written plainly or with a KiB, MiB
 * or GiB suffix (powers of 1,024). */
typedef enum { CN_CFG_INT, CN_CFG_STRING, CN_CFG_BOOL, CN_CFG_BYTES } cn_config_type;

typedef struct cn_config_key {
  const char *name;     /* "max-nodes": flag --max-nodes, env CANOPY_MAX_NODES */
  cn_config_type type;
  long long min, max;   /* CN_CFG_INT bounds (inclusive) */
  const char *dflt;     /* default, as text */
  size_t offset;        /* where the value lives in cn_config */
  size_t size;          /* CN_CFG_STRING: buffer size */
  const char *help;
  const char *choices;  /* CN_CFG_STRING: "a|b|c" allowed values, or NULL */
  const char *group;    /* "limits" (every command) or "serve" (daemon)  */
} cn_config_key;

/* The key table and its length. */
const cn_config_key *cn_config_keys(int *n);
const cn_config_key *cn_config_find(const char *name);
/* A key that existed and was removed: why, and what to do instead (NULL:
 * never a key). Setting it is an error that says so. */
const char *cn_config_removed(const char *name);

void cn_config_defaults(cn_config *c);
/* Sets one key from text; errors name the key, the value and the bounds. */
int cn_config_set(cn_config *c, const char *name, const char *value,
                  cn_err *err);
/* Flags: as cn_config_set, but a key given as a flag before through the
 * same seen (zeroed by the caller) is refused, as a key set twice in a
 * config file is. */
typedef struct cn_config_flags {
  unsigned char set[CN_CONFIG_MAX_KEYS];
} cn_config_flags;
int cn_config_set_flag(cn_config *c, cn_config_flags *seen, const char *name,
                       const char *value, cn_err *err);
/* Applies every CANOPY_<KEY> variable present in the environment. */
int cn_config_from_env(cn_config *c, cn_err *err);
/* Reads a config file of `key value` lines; '#' starts a comment. Errors
 * name the file, the line and the key. */
int cn_config_load_file(cn_config *c, const char *path, cn_err *err);
/* Prints "  --key VALUE  help (default D, min..max)" for the "limits"
 * keys (what every command accepts). */
void cn_config_usage(FILE *f);
/* The same for every key of one group ("limits", "serve"). */
void cn_config_usage_group(FILE *f, const char *group);
/* Writes a self-documenting config file with every key at its default
 * (config/canopy.conf is this output). */
void cn_config_write_sample(FILE *f);
/* Records that name's value came from `from` (a key set outside the
 * parsers above: serve's --config / CANOPY_CONFIG). */
void cn_config_mark(cn_config *c, const char *name, cn_config_from from);
/* Writes c as a config file: every key with its value and, in a comment,
 * where the value came from (default, the file and line, CANOPY_<KEY>,
 * --key). A repository-token is not shown, only whether it is set. */
void cn_config_write_effective(FILE *f, const cn_config *c);

#endif
