/* config.c - the declarative key table and its parsers.
 *
 * Every setting Canopy reads lives in keys[] below (redis config.c
 * `static_configs[]`): its name, type, bounds, default and help. The flags
 * (--name), the environment (CANOPY_NAME), the config file (`name value`),
 * `--help` and the sample config/canopy.conf are all derived from it, so a
 * key cannot exist in one place and be missing from another.
 */
#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"

#define LIM(f) offsetof(cn_config, limits.f)
#define SRV(f) offsetof(cn_config, serve.f)
#define SRVS(f) SRV(f), sizeof(((cn_config *)0)->serve.f)

#define INT_KEY(name, lo, hi, dflt, off, help, group) \
  {name, CN_CFG_INT, lo, hi, dflt, off, 0, help, NULL, group}
#define STR_KEY(name, dflt, field, help, choices) \
  {name, CN_CFG_STRING, 0, 0, dflt, SRVS(field), help, choices, "serve"}
#define BYTES_KEY(name, hi, dflt, off, help, group) \
  {name, CN_CFG_BYTES, 0, hi, dflt, off, 0, help, NULL, group}
#define BOOL_KEY(name, dflt, off, help) \
  {name, CN_CFG_BOOL, 0, 0, dflt, off, 0, help, "true|false", "serve"}

static const cn_config_key keys[] = {
    /* ---- input limits: core enforces them, every command accepts them */
    INT_KEY("max-nodes", 1, 1 << 24, "4096", LIM(max_nodes),
            "most nodes in one tree (tokens of a sequence: max-seq-len)",
            "limits"),
    INT_KEY("max-depth", 1, 1 << 20, "512", LIM(max_depth),
            "deepest tree accepted, leaf = 1", "limits"),
    INT_KEY("max-token-len", 1, 1 << 20, "256", LIM(max_token_len),
            "longest word or label, in bytes", "limits"),
    INT_KEY("max-children", 1, 1 << 20, "256", LIM(max_children),
            "most children of one node (childsum-treelstm)", "limits"),
    INT_KEY("max-seq-len", 1, 1 << 24, "1024", LIM(max_seq_len),
            "longest sequence, lattice (characters) or DAG (nodes)",
            "limits"),
    INT_KEY("max-spans", 1, 1 << 24, "8192", LIM(max_spans),
            "most word spans of a lattice / predecessor edges of a DAG",
            "limits"),
    /* ---- the daemon (`canopy serve`) */
    STR_KEY("config", "", config,
            "config file of `key value` lines read before the environment "
            "and flags",
            NULL),
    STR_KEY("host", "127.0.0.1", host, "address to listen on", NULL),
    INT_KEY("port", 0, 65535, "8080", SRV(port), "TCP port to listen on",
            "serve"),
    INT_KEY("grpc-port", 0, 65535, "0", SRV(grpc_port),
            "TCP port of the gRPC front end (inference.GRPCInferenceService, "
            "cleartext HTTP/2; Triton's is 8001); 0: no gRPC",
            "serve"),
    INT_KEY("grpc-max-message-bytes", 64, 1 << 30, "8388608",
            SRV(grpc_max_message_bytes),
            "largest gRPC request message, in bytes (RESOURCE_EXHAUSTED "
            "beyond); the /v2 request it becomes is held to max-body-bytes "
            "too",
            "serve"),
    BOOL_KEY("reuse-port", "false", SRV(reuse_port),
             "share the port with other processes that set it too "
             "(SO_REUSEPORT); false: a port in use is a start-up error"),
    STR_KEY("models-dir", "models", models_dir,
            "every subdirectory holding a model.json is served under its "
            "name",
            NULL),
    STR_KEY("backend", "cpu", backend, "compute backend of every worker",
            "cpu|cuda"),
    STR_KEY("policy", "sufficient", policy,
            "batching policy of every run (sufficient: the fastest measured "
            "on CPU, docs/policies.md); fsm: the model's learned policy "
            "from policy-cache (agenda until one is cached or learned online)",
            "none|depth|agenda|sufficient|lookahead|lookahead2|plan|fsm"),
    STR_KEY("layout", "pq", layout,
            "vertex functions, compiled from the op IR: laid out by the "
            "PQ-tree (pq) or one buffer per variable (naive); fused, the "
            "hand-written kernels pq replaced, is read as pq",
            "pq|naive|fused"),
    STR_KEY("policy-cache", "", policy_cache,
            "directory of learned policies shared with `canopy run` and "
            "`canopy policy train`; empty: $CANOPY_POLICY_CACHE, else "
            "$XDG_CACHE_HOME/canopy/policies, else ~/.cache/canopy/policies",
            NULL),
    STR_KEY("encoding", "bound", encoding,
            "policy fsm: state encoding of the learned policy (ED-Batch 2.3; "
            "bound: max plus the types that lower the bound on what is left "
            "the most)",
            "base|max|sort|bound"),
    INT_KEY("plan-width", 1, 65536, "16", SRV(plan_width),
            "policy plan: beam width of the search over each run graph "
            "before it runs; wider finds fewer batches and costs more CPU",
            "serve"),
    BYTES_KEY("memory-budget", 1LL << 50, "0", SRV(memory_budget),
              "bytes of arena (states and scratch) one run may hold, per "
              "worker (KiB, MiB, GiB suffixes allowed); runs are planned "
              "under it with extra batches, an instance alone over it is "
              "answered 413; 0: no budget (docs/memory.md)",
              "serve"),
    INT_KEY("retrain-interval-s", 0, 86400, "60", SRV(retrain_interval_s),
            "policy fsm: retrain each model's policy from its recent run "
            "graphs this often, in a low-priority thread; 0: never",
            "serve"),
    INT_KEY("reservoir-graphs", 1, 1 << 20, "256", SRV(reservoir_graphs),
            "policy fsm: recent run graphs kept per model (FIFO) to retrain "
            "on",
            "serve"),
    INT_KEY("retrain-min-graphs", 1, 1 << 20, "32", SRV(retrain_min_graphs),
            "policy fsm: retrain only once the reservoir holds this many "
            "graphs",
            "serve"),
    INT_KEY("workers", 1, 256, "2", SRV(workers),
            "worker threads, each with its own backend context", "serve"),
    INT_KEY("blas-threads", 0, 256, "0", SRV(blas_threads),
            "threads splitting each product of a worker; 0: max(1, cores / workers)", "serve"),
    INT_KEY("max-delay-us", 0, 60000000, "2000", SRV(max_delay_us),
            "the most a request waits for company: a run closes this long "
            "after its first request arrived",
            "serve"),
    BOOL_KEY("work-conserving", "true", SRV(work_conserving),
             "a request that finds a worker idle starts its run at once, and "
             "a worker that finishes takes every request waiting; false: "
             "every run waits out max-delay-us unless it fills"),
    BOOL_KEY("continuous-decoding", "true", SRV(continuous_decoding),
             "lstm-nmt: requests that arrive while a decode run is in flight "
             "join it at its next step, and each is answered as soon as its "
             "instances finish; false: a run ends with its slowest instance "
             "and newcomers wait for the next run"),
    INT_KEY("max-instances", 1, 1 << 20, "256", SRV(max_instances),
            "a run closes when it holds this many instances", "serve"),
    INT_KEY("split-min-instances", 0, 1 << 20, "8",
            SRV(split_min_instances),
            "a run that closes while workers are idle is split among them, "
            "in parts of at least this many instances; 0: never split",
            "serve"),
    INT_KEY("max-vertices", 1, 1 << 28, "262144", SRV(max_vertices),
            "a run closes before this many vertices; a bigger request is 413",
            "serve"),
    INT_KEY("queue-depth", 1, 1 << 24, "8192", SRV(queue_depth),
            "instances waiting for a worker; beyond it requests get 429",
            "serve"),
    INT_KEY("max-body-bytes", 64, 1 << 30, "8388608", SRV(max_body_bytes),
            "largest request body, in bytes (413 beyond)", "serve"),
    INT_KEY("max-body-memory", 64, 0x7fffffff, "268435456",
            SRV(max_body_memory),
            "bytes of request bodies held at once (being received or "
            "waiting for their parse); a body over 16 KiB that would pass "
            "it gets 429; at least max-body-bytes",
            "serve"),
    INT_KEY("max-answer-bytes", 1024, 0x7fffffff, "67108864",
            SRV(max_answer_bytes),
            "largest answer a request may ask for, in bytes: a request whose "
            "answer could pass it (bounded from the model's sizes, the "
            "instances and outputs/return_hidden before it runs) gets 413",
            "serve"),
    INT_KEY("max-answer-memory", 1024, 0x7fffffff, "268435456",
            SRV(max_answer_memory),
            "bytes of answers held at once: written to clients that have "
            "not read them yet, or reserved (their max-answer-bytes bound) "
            "for requests admitted and not yet answered; an inference whose "
            "answer would pass it gets 503 answer_memory_full; at least "
            "max-answer-bytes",
            "serve"),
    INT_KEY("max-instances-per-request", 1, 1 << 20, "1024",
            SRV(max_instances_per_request),
            "most instances in one request (413 beyond)", "serve"),
    INT_KEY("timeout-ms", 0, 3600000, "30000", SRV(timeout_ms),
            "default request timeout (504); a request's timeout_ms wins; "
            "0: none",
            "serve"),
    INT_KEY("drain-grace-ms", 0, 3600000, "10000", SRV(drain_grace_ms),
            "on SIGTERM/SIGINT, in-flight work gets this long to finish",
            "serve"),
    INT_KEY("max-connections", 1, 1 << 20, "1024", SRV(max_connections),
            "open client connections at most", "serve"),
    INT_KEY("idle-timeout-s", 1, 86400, "30", SRV(idle_timeout_s),
            "an idle keep-alive connection is closed after this long",
            "serve"),
    INT_KEY("header-timeout-s", 1, 3600, "10", SRV(header_timeout_s),
            "a request's head (request line and headers) must arrive within "
            "this long of its first byte; else 408 and close",
            "serve"),
    INT_KEY("body-timeout-s", 1, 86400, "30", SRV(body_timeout_s),
            "a request's body must arrive within this long of its head; "
            "else 408 and close",
            "serve"),
    STR_KEY("model-control", "none", model_control,
            "what may change the served models: none (start-up only; SIGHUP "
            "is logged and ignored), explicit (the repository routes and "
            "SIGHUP rescan models-dir), poll (as explicit, and a rescan "
            "every poll-interval-s)",
            "none|explicit|poll"),
    INT_KEY("poll-interval-s", 1, 86400, "10", SRV(poll_interval_s),
            "model-control poll: rescan models-dir this often", "serve"),
    STR_KEY("repository-token", "", repository_token,
            "if set, POST /v2/repository/... needs the header "
            "'Authorization: Bearer TOKEN'",
            NULL),
    BOOL_KEY("repository-insecure", "false", SRV(repository_insecure),
             "allow the repository's load and unload routes with no "
             "repository-token on a non-loopback host (anyone who reaches "
             "the port may load models); false: there they answer 403 "
             "until a token is set"),
    INT_KEY("max-loads", 1, 64, "2", SRV(max_loads),
            "model loads in flight at once (each holds about one model's "
            "size in memory); a POST .../load beyond it gets 429, a "
            "rescan's load waits for a free one",
            "serve"),
    BOOL_KEY("strict-startup", "true", SRV(strict_startup),
             "a model that fails to load stops start-up; false: it is "
             "UNAVAILABLE in the repository index and the others serve"),
    BOOL_KEY("warmup", "true", SRV(warmup),
             "before a model version serves (start-up, reload, load), "
             "each worker runs one small synthetic instance of it, so the "
             "first request finds its buffers made; a version whose "
             "warm-up computes NaN or Inf fails to load"),
    STR_KEY("log-level", "info", log_level,
            "error | warn | info (one line a request) | debug",
            "error|warn|info|debug"),
};

/* Keys that were removed: a config file or environment that still sets
 * one stops start-up with this, not with "unknown key". */
static const struct {
  const char *name, *why;
} removed[] = {
    {"http-mode", "the HTTP front end is Canopy's own (libuv and "
                  "http_parser) and has one mode; remove the setting"},
};

const char *cn_config_removed(const char *name) {
  for (size_t i = 0; i < sizeof(removed) / sizeof(removed[0]); i++)
    if (strcmp(removed[i].name, name) == 0) return removed[i].why;
  return NULL;
}

#define N_KEYS (sizeof(keys) / sizeof(keys[0]))
_Static_assert(N_KEYS <= CN_CONFIG_MAX_KEYS, "raise CN_CONFIG_MAX_KEYS");

const cn_config_key *cn_config_keys(int *n) {
  *n = (int)N_KEYS;
  return keys;
}

const cn_config_key *cn_config_find(const char *name) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (strcmp(keys[i].name, name) == 0) return &keys[i];
  return NULL;
}

/* Is value[0, n) one of the '|'-separated choices? */
static bool in_choices(const char *choices, const char *value, size_t n) {
  for (const char *p = choices; *p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncmp(p, value, n) == 0) return true;
    if (bar == NULL) break;
    p = bar + 1;
  }
  return false;
}

/* A number, true/false or one of a key's choices has no spaces, so the
 * spaces around one are dropped, at both ends and from every source (a
 * file's line, CANOPY_WORKERS=' 3 ', --workers ' 3'); strtoll alone took
 * them in front and refused them behind. Free text (a path, a host, a
 * token) is taken as given. */
static void trim(const char *value, const char **s, size_t *n) {
  const char *a = value, *e = value + strlen(value);
  while (a < e && isspace((unsigned char)*a)) a++;
  while (e > a && isspace((unsigned char)e[-1])) e--;
  *s = a;
  *n = (size_t)(e - a);
}

static int set_key(cn_config *c, const cn_config_key *k, const char *value,
                   const char *source, cn_err *err) {
  char *p = (char *)c + k->offset;
  const char *t;
  size_t tn;
  char num[64];
  trim(value, &t, &tn);
  switch (k->type) {
    case CN_CFG_INT: {
      char *end = num;
      errno = 0;
      long long v = 0;
      if (tn > 0 && tn < sizeof(num)) {
        memcpy(num, t, tn);
        num[tn] = '\0';
        v = strtoll(num, &end, 10);
      }
      if (errno != 0 || end == num || *end != '\0')
        return cn_err_set(err, CN_E_BAD_CONFIG,
                          "%s %s: '%s' is not an integer", source, k->name,
                          value);
      if (v < k->min || v > k->max)
        return cn_err_set(err, CN_E_BAD_CONFIG,
                          "%s %s: %lld is out of range [%lld, %lld]", source,
                          k->name, v, k->min, k->max);
      *(int *)p = (int)v;
      return 0;
    }
    case CN_CFG_BYTES: {
      char *end = num;
      errno = 0;
      long long v = 0, unit = 1;
      if (tn > 0 && tn < sizeof(num)) {
        memcpy(num, t, tn);
        num[tn] = '\0';
        v = strtoll(num, &end, 10);
      }
      if (end != num && strcmp(end, "KiB") == 0) unit = 1LL << 10, end += 3;
      else if (end != num && strcmp(end, "MiB") == 0) unit = 1LL << 20, end += 3;
      else if (end != num && strcmp(end, "GiB") == 0) unit = 1LL << 30, end += 3;
      if (errno != 0 || end == num || *end != '\0' || v < 0 ||
          v > k->max / unit)
        return cn_err_set(err, CN_E_BAD_CONFIG,
                          "%s %s: '%s' is not a size in bytes from 0 to "
                          "%lld (a number, optionally with KiB, MiB or GiB)",
                          source, k->name, value, k->max);
      *(long long *)p = v * unit;
      return 0;
    }
    case CN_CFG_BOOL:
      if (in_choices("true|1|yes", t, tn))
        *(bool *)p = true;
      else if (in_choices("false|0|no", t, tn))
        *(bool *)p = false;
      else
        return cn_err_set(err, CN_E_BAD_CONFIG,
                          "%s %s: '%s' is not true or false", source, k->name,
                          value);
      return 0;
    case CN_CFG_STRING:
      if (k->choices == NULL) t = value, tn = strlen(value);
      if (tn >= k->size)
        return cn_err_set(err, CN_E_BAD_CONFIG,
                          "%s %s: value longer than %zu bytes", source,
                          k->name, k->size - 1);
      if (k->choices != NULL && !in_choices(k->choices, t, tn))
        return cn_err_set(err, CN_E_BAD_CONFIG,
                          "%s %s: '%s' is not one of %s", source, k->name,
                          value, k->choices);
      memcpy(p, t, tn);
      p[tn] = '\0';
      return 0;
  }
  return CN_E_INTERNAL;
}

static void mark(cn_config *c, const cn_config_key *k, cn_config_from from,
                 int line) {
  size_t ki = (size_t)(k - keys);
  c->from[ki] = (unsigned char)from;
  c->line[ki] = line;
}

void cn_config_mark(cn_config *c, const char *name, cn_config_from from) {
  const cn_config_key *k = cn_config_find(name);
  if (k != NULL) mark(c, k, from, 0);
}

void cn_config_defaults(cn_config *c) {
  memset(c, 0, sizeof(*c));
  for (size_t i = 0; i < N_KEYS; i++)
    (void)set_key(c, &keys[i], keys[i].dflt, "default", NULL);
}

int cn_config_set(cn_config *c, const char *name, const char *value,
                  cn_err *err) {
  const cn_config_key *k = cn_config_find(name);
  if (k == NULL && cn_config_removed(name) != NULL)
    return cn_err_set(err, CN_E_BAD_CONFIG,
                      "configuration key '%s' was removed: %s", name,
                      cn_config_removed(name));
  if (k == NULL)
    return cn_err_set(err, CN_E_BAD_CONFIG, "unknown configuration key '%s'",
                      name);
  int rc = set_key(c, k, value, "option", err);
  if (rc == 0) mark(c, k, CN_CFG_FROM_FLAG, 0);
  return rc;
}

int cn_config_set_flag(cn_config *c, cn_config_flags *seen, const char *name,
                       const char *value, cn_err *err) {
  const cn_config_key *k = cn_config_find(name);
  if (k != NULL) {
    size_t ki = (size_t)(k - keys);
    /* as a key set twice in a file: the first would be silently lost */
    if (seen->set[ki])
      return cn_err_set(err, CN_E_BAD_CONFIG, "option --%s is given twice "
                        "(set each key once)", name);
    seen->set[ki] = 1;
  }
  return cn_config_set(c, name, value, err);
}

/* A CANOPY_ variable that is no key but one or two edits from one
 * (CANOPY_WORKER) is a typo, and stops start-up as a config-file typo
 * does. Others (CANOPY_DATA, CANOPY_BIN: the tests', CANOPY_URL: the
 * clients') are not settings and are left alone: the CANOPY_ namespace of
 * the environment is shared, a config file is not. */
static int env_typos(cn_err *err) {
  extern char **environ;
  for (char **e = environ; e != NULL && *e != NULL; e++) {
    if (strncmp(*e, "CANOPY_", 7) != 0) continue;
    char name[96];
    size_t n = 0;
    for (const char *s = *e + 7; *s && *s != '=' && n + 1 < sizeof(name); s++)
      name[n++] = *s == '_' ? '-' : (char)tolower((unsigned char)*s);
    name[n] = '\0';
    int len = (int)strcspn(*e, "=");
    const cn_config_key *k = cn_config_find(name);
    if (k != NULL) {
      /* CANOPY_Workers names workers but is not CANOPY_WORKERS, which is
       * the only one read: refused rather than silently ignored */
      char var[96] = "CANOPY_";
      size_t j = strlen(var);
      for (const char *s = k->name; *s && j + 1 < sizeof(var); s++)
        var[j++] = *s == '-' ? '_' : (char)toupper((unsigned char)*s);
      var[j] = '\0';
      if ((size_t)len == j && strncmp(*e, var, j) == 0) continue;
      return cn_err_set(err, CN_E_BAD_CONFIG, "environment %.*s: no such "
                        "configuration key; did you mean %s (key %s)? "
                        "Variables are upper case", len, *e, var, k->name);
    }
    if (cn_config_removed(name) != NULL)
      return cn_err_set(err, CN_E_BAD_CONFIG, "environment %.*s: "
                        "configuration key '%s' was removed: %s", len, *e,
                        name, cn_config_removed(name));
    int best = 3;
    const char *near = NULL;
    for (size_t i = 0; i < N_KEYS; i++) {
      int d = cn_edit_distance(name, keys[i].name, false);
      if (d < best) best = d, near = keys[i].name;
    }
    if (near == NULL || best > (n >= 6 ? 2 : 1)) continue;
    char var[96] = "CANOPY_";
    size_t j = strlen(var);
    for (const char *s = near; *s && j + 1 < sizeof(var); s++)
      var[j++] = *s == '-' ? '_' : (char)toupper((unsigned char)*s);
    var[j] = '\0';
    return cn_err_set(err, CN_E_BAD_CONFIG, "environment %.*s: no such "
                      "configuration key; did you mean %s (key %s)?", len, *e,
                      var, near);
  }
  return 0;
}

int cn_config_from_env(cn_config *c, cn_err *err) {
  int rc = env_typos(err);
  if (rc != 0) return rc;
  for (size_t i = 0; i < N_KEYS; i++) {
    char var[96] = "CANOPY_";
    size_t j = strlen(var);
    for (const char *s = keys[i].name; *s && j + 1 < sizeof(var); s++)
      var[j++] = *s == '-' ? '_' : (char)toupper((unsigned char)*s);
    var[j] = '\0';
    const char *v = getenv(var);
    if (v == NULL) continue;
    if ((rc = set_key(c, &keys[i], v, var, err)) != 0) return rc;
    mark(c, &keys[i], CN_CFG_FROM_ENV, 0);
  }
  return 0;
}

/* `key value` lines: the value is the rest of the line, trimmed, and may
 * be wrapped in double quotes (for an empty value or one with spaces). */
int cn_config_load_file(cn_config *c, const char *path, cn_err *err) {
  int rc = 0;
  char line[4096];
  int first[N_KEYS]; /* the line that set each key, 0 when none yet */
  memset(first, 0, sizeof(first));
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return cn_err_set(err, CN_E_BAD_CONFIG, "config %s: cannot open: %s",
                      path, strerror(errno));
  /* fopen opens a directory, and reading it fails like an empty file:
   * say so rather than start with the defaults. (A pipe is fine:
   * --config <(...) is one.) */
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
    fclose(f);
    return cn_err_set(err, CN_E_BAD_CONFIG, "config %s: cannot read: it is "
                      "a directory, not a file", path);
  }
  int lineno = 1;
  for (; fgets(line, sizeof(line), f) != NULL; lineno++) {
    char *s = line, *e;
    if (strchr(line, '\n') == NULL && !feof(f)) {
      rc = cn_err_set(err, CN_E_BAD_CONFIG, "config %s:%d: line too long",
                      path, lineno);
      goto out;
    }
    /* a UTF-8 byte order mark (Windows editors write one) is no part of
     * the first key */
    if (lineno == 1 && strncmp(s, "\xEF\xBB\xBF", 3) == 0) s += 3;
    char *hash = strchr(s, '#');
    if (hash != NULL) *hash = '\0';
    while (isspace((unsigned char)*s)) s++;
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    if (*s == '\0') continue;
    char *key = s;
    while (*s && !isspace((unsigned char)*s)) s++;
    if (*s) *s++ = '\0';
    while (isspace((unsigned char)*s)) s++;
    size_t vl = strlen(s);
    if (vl >= 2 && s[0] == '"' && s[vl - 1] == '"') {
      s[vl - 1] = '\0';
      s++;
    }
    const cn_config_key *k = cn_config_find(key);
    if (k == NULL && cn_config_removed(key) != NULL) {
      rc = cn_err_set(err, CN_E_BAD_CONFIG,
                      "config %s:%d: configuration key '%s' was removed: %s",
                      path, lineno, key, cn_config_removed(key));
      goto out;
    }
    if (k == NULL) {
      rc = cn_err_set(err, CN_E_BAD_CONFIG,
                      "config %s:%d: unknown configuration key '%s'", path,
                      lineno, key);
      goto out;
    }
    /* a key set twice is most likely a typo for another key, and the
     * second line silently winning would hide it */
    size_t ki = (size_t)(k - keys);
    if (first[ki] != 0) {
      rc = cn_err_set(err, CN_E_BAD_CONFIG, "config %s:%d: key '%s' is set "
                      "again; line %d set it first (set each key once)",
                      path, lineno, key, first[ki]);
      goto out;
    }
    first[ki] = lineno;
    char where[1200];
    snprintf(where, sizeof(where), "config %s:%d:", path, lineno);
    rc = set_key(c, k, s, where, err);
    if (rc != 0) goto out;
    mark(c, k, CN_CFG_FROM_FILE, lineno);
  }
  if (ferror(f))
    rc = cn_err_set(err, CN_E_BAD_CONFIG, "config %s:%d: cannot read: %s",
                    path, lineno, strerror(errno));
out:
  fclose(f);
  return rc;
}

static void usage_key(FILE *f, const cn_config_key *k) {
  fprintf(f, "  --%-26s %s (default %s", k->name, k->help,
          k->dflt[0] ? k->dflt : "none");
  if (k->type == CN_CFG_INT) fprintf(f, ", %lld..%lld", k->min, k->max);
  if (k->type == CN_CFG_BYTES)
    fprintf(f, ", %lld..%lld bytes", k->min, k->max);
  if (k->choices != NULL) fprintf(f, ", one of %s", k->choices);
  fprintf(f, ")\n");
}

void cn_config_usage_group(FILE *f, const char *group) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (strcmp(keys[i].group, group) == 0) usage_key(f, &keys[i]);
}

void cn_config_usage(FILE *f) { cn_config_usage_group(f, "limits"); }

void cn_config_write_sample(FILE *f) {
  fprintf(f,
          "# canopy.conf - configuration of `canopy serve`.\n"
          "#\n"
          "# One `key value` a line; '#' starts a comment. Every key is also "
          "a flag\n# (--key value) and an environment variable (CANOPY_KEY, "
          "dashes as\n# underscores). Precedence: defaults < this file < "
          "environment < flags.\n# Use it with `canopy serve --config "
          "config/canopy.conf`. Each line below\n# is the key's default; "
          "generated by `canopy serve --print-sample-config`.\n");
  const char *group = "";
  for (size_t i = 0; i < N_KEYS; i++) {
    const cn_config_key *k = &keys[i];
    if (strcmp(group, k->group) != 0) {
      group = k->group;
      fprintf(f, "\n# ---- %s\n",
              strcmp(group, "limits") == 0 ? "input limits (413 too_large beyond)"
                                           : "the daemon");
    }
    fprintf(f, "\n# %s", k->help);
    if (k->type == CN_CFG_INT) fprintf(f, " [%lld..%lld]", k->min, k->max);
    if (k->choices != NULL) fprintf(f, " [%s]", k->choices);
    fprintf(f, "\n");
    if (strcmp(k->name, "config") == 0)
      fprintf(f, "# (only as a flag or CANOPY_CONFIG)\n# %s \"\"\n",
              k->name);
    else
      fprintf(f, "%s %s\n", k->name, k->dflt[0] ? k->dflt : "\"\"");
  }
}

/* A value as a config file's line holds it: quoted when empty or when it
 * holds a space, a '#' or a quote (then it would not read back as one). */
static void value_text(const cn_config *c, const cn_config_key *k, char *out,
                       size_t cap) {
  const char *p = (const char *)c + k->offset;
  switch (k->type) {
    case CN_CFG_INT:
      snprintf(out, cap, "%d", *(const int *)p);
      return;
    case CN_CFG_BYTES:
      snprintf(out, cap, "%lld", *(const long long *)p);
      return;
    case CN_CFG_BOOL:
      snprintf(out, cap, "%s", *(const bool *)p ? "true" : "false");
      return;
    case CN_CFG_STRING:
      if (p[0] == '\0' || strpbrk(p, " \t#\"") != NULL)
        snprintf(out, cap, "\"%s\"", p);
      else
        snprintf(out, cap, "%s", p);
      return;
  }
}

void cn_config_write_effective(FILE *f, const cn_config *c) {
  fprintf(f, "# canopy serve: the effective configuration (defaults < config "
          "file < environment\n# < flags); each line's comment says where "
          "its value came from. Every key is\n# described in "
          "config/canopy.conf (`canopy serve --print-sample-config`).\n");
  for (size_t i = 0; i < N_KEYS; i++) {
    const cn_config_key *k = &keys[i];
    char val[1100], line[1200], src[1200];
    value_text(c, k, val, sizeof(val));
    bool secret = strcmp(k->name, "repository-token") == 0;
    /* the file key is read before the others, never from a file */
    bool comment = strcmp(k->name, "config") == 0 ||
                   (secret && val[0] != '"');
    if (secret && val[0] != '"') snprintf(val, sizeof(val), "(set, not shown)");
    snprintf(line, sizeof(line), "%s%s %s", comment ? "# " : "", k->name,
             val);
    switch ((cn_config_from)c->from[i]) {
      case CN_CFG_FROM_FILE:
        snprintf(src, sizeof(src), "config %s:%d", c->serve.config,
                 c->line[i]);
        break;
      case CN_CFG_FROM_ENV: {
        char var[96] = "CANOPY_";
        size_t j = strlen(var);
        for (const char *s = k->name; *s && j + 1 < sizeof(var); s++)
          var[j++] = *s == '-' ? '_' : (char)toupper((unsigned char)*s);
        var[j] = '\0';
        snprintf(src, sizeof(src), "environment %s", var);
        break;
      }
      case CN_CFG_FROM_FLAG:
        snprintf(src, sizeof(src), "flag --%s", k->name);
        break;
      default:
        snprintf(src, sizeof(src), "default");
    }
    fprintf(f, "%-40s # %s\n", line, src);
  }
}
