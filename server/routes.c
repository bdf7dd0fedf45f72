/* routes.c - which route a path names, and the bodies of the GET routes
 * (models, health, metrics). Everything here only reads state that is
 * immutable while serving or kept in atomics. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "routes.h"
#include "handlers.h"

/* One path segment at p: its length up to the next '/' or the end. */
static size_t segment(const char *p) {
  const char *slash = strchr(p, '/');
  return slash ? (size_t)(slash - p) : strlen(p);
}

/* A path with a model name: prefix, one segment, then (versioned)
 * "/versions/" and one more segment, then suffix exactly. */
static bool named(const char *path, const char *pre, const char *suffix,
                  bool versioned, cn__route_match *m) {
  static const char VER[] = "/versions/";
  size_t np = strlen(pre);
  if (strncmp(path, pre, np) != 0) return false;
  const char *n = path + np, *rest = n + segment(n);
  const char *v = NULL;
  size_t vl = 0;
  if (rest == n) return false;
  if (versioned) {
    if (strncmp(rest, VER, sizeof(VER) - 1) != 0) return false;
    v = rest + sizeof(VER) - 1;
    vl = segment(v);
    if (vl == 0) return false;
    rest = v + vl;
  }
  if (strcmp(rest, suffix) != 0) return false;
  m->name = n;
  m->len = (size_t)(segment(n));
  m->version = v;
  m->vlen = vl;
  return true;
}

cn__route cn__route_find(cn__server *s, const char *path,
                         cn__route_match *m) {
#define P(lit) lit, sizeof(lit) - 1
  static const struct {
    const char *path;
    size_t len; /* strlen(path): most paths differ in it */
    cn__route rt;
    bool v2;
  } fixed[] = {{P("/healthz"), CN__RT_LIVE, false},
               {P("/v2/health/live"), CN__RT_V2_LIVE, true},
               {P("/readyz"), CN__RT_READY, false},
               {P("/v2/health/ready"), CN__RT_V2_READY, true},
               {P("/metrics"), CN__RT_METRICS, false},
               {P("/v1/models"), CN__RT_MODELS, false},
               {P("/v1/models/"), CN__RT_MODELS, false},
               {P("/v2/repository/index"), CN__RT_REPO_INDEX, true},
               /* the protocol's text says GET v2, its yaml /v2/ */
               {P("/v2"), CN__RT_V2_SERVER, true},
               {P("/v2/"), CN__RT_V2_SERVER, true},
               /* every model's statistics: never a model named "stats"
                * (as in Triton's statistics extension) */
               {P("/v2/models/stats"), CN__RT_V2_STATS, true}};
  /* the Open Inference Protocol's paths name a version or not */
  static const struct {
    const char *pre, *suffix;
    cn__route rt;
    bool v2, versioned;
  } withname[] = {
      {"/v1/models/", "", CN__RT_MODEL, false, false},
      {"/v1/models/", "/infer", CN__RT_INFER, false, false},
      {"/v2/models/", "/ready", CN__RT_MODEL_READY, true, false},
      {"/v2/models/", "/ready", CN__RT_MODEL_READY, true, true},
      {"/v2/models/", "/config", CN__RT_V2_CONFIG, true, false},
      {"/v2/models/", "/config", CN__RT_V2_CONFIG, true, true},
      {"/v2/models/", "/stats", CN__RT_V2_STATS, true, false},
      {"/v2/models/", "/stats", CN__RT_V2_STATS, true, true},
      {"/v2/models/", "", CN__RT_V2_MODEL, true, false},
      {"/v2/models/", "", CN__RT_V2_MODEL, true, true},
      {"/v2/models/", "/infer", CN__RT_INFER, true, false},
      {"/v2/models/", "/infer", CN__RT_INFER, true, true},
      {"/v2/repository/models/", "/load", CN__RT_REPO_LOAD, true, false},
      {"/v2/repository/models/", "/unload", CN__RT_REPO_UNLOAD, true,
       false}};
#undef P
  memset(m, 0, sizeof(*m));
  size_t n = strlen(path);
  for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
    if (n == fixed[i].len && memcmp(path, fixed[i].path, n) == 0) {
      m->v2 = fixed[i].v2;
      return m->rt = fixed[i].rt;
    }
  for (size_t i = 0; i < sizeof(withname) / sizeof(withname[0]); i++) {
    if (!named(path, withname[i].pre, withname[i].suffix,
               withname[i].versioned, m))
      continue;
    m->slot = cn__repo_find(s, m->name, m->len);
    m->v2 = withname[i].v2;
    return m->rt = withname[i].rt;
  }
  /* no route, but under /v2: the 404 is the protocol's */
  m->v2 = strncmp(path, "/v2", 3) == 0 && (path[3] == '\0' || path[3] == '/');
  return CN__RT_NONE;
}

static char *dump(json_t *j) {
  if (j == NULL) return NULL;
  char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
  json_decref(j);
  return s;
}

static char *models_list(cn__server *s) {
  json_t *arr = json_array();
  int n = atomic_load(&s->n_models);
  for (int i = 0; i < n; i++) {
    cn__model_entry *me = cn__model_retain(&s->models[i]);
    if (me == NULL) continue; /* not loaded: the repository index has it */
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(me->name));
    json_object_set_new(o, "family",
                        json_string(cn_model_family(me->model)));
    json_object_set_new(
        o, "input",
        json_string(cn_input_kind_name(cn_model_input(me->model))));
    json_object_set_new(o, "version", json_string(me->version));
    json_object_set_new(o, "ready", json_true());
    json_array_append_new(arr, o);
    cn__model_release(me);
  }
  json_t *root = json_object();
  json_object_set_new(root, "models", arr);
  return dump(root);
}

static cn__gauges gauges(cn__server *s) {
  cn__gauges g;
  g.queue_instances = atomic_load(&s->waiting_instances);
  g.queued_runs = cn__jobs_queued(s);
  g.in_flight = atomic_load(&s->in_flight);
  g.workers = s->n_threads;
  g.draining = atomic_load(&s->draining);
  g.open_connections = atomic_load(&s->open_conns);
  g.body_bytes = atomic_load(&s->body_bytes);
  g.answer_held = atomic_load(&s->answer_held);
  g.answer_reserved = atomic_load(&s->answer_reserved);
  g.ready = !g.draining;
  /* the loop thread's CPU clock, read from whichever thread renders */
  clockid_t cid;
  struct timespec ts;
  g.loop_cpu_s = 0;
  if (s->loop_cpu0 > 0 && pthread_getcpuclockid(s->loop_thread, &cid) == 0 &&
      clock_gettime(cid, &ts) == 0)
    g.loop_cpu_s = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 -
                   s->loop_cpu0;
  return g;
}

int cn__route_get(cn__server *s, cn__route rt, cn__model_entry *me,
                  int *status, char **body, const char **ctype) {
  *status = 200;
  *ctype = "application/json";
  switch (rt) {
    case CN__RT_LIVE:
      *body = strdup("{\"status\":\"ok\"}");
      break;
    case CN__RT_V2_LIVE: /* the Open Inference Protocol's words */
      *body = strdup("{\"live\":true}");
      break;
    case CN__RT_V2_READY:
      if (atomic_load(&s->draining)) {
        *status = 503;
        *body = cn__error_body(CN_E_DRAINING, "draining: not ready", -1);
      } else {
        *body = strdup("{\"ready\":true}");
      }
      break;
    case CN__RT_V2_CONFIG:
      *body = dump(cn__kserve_model_config(s, me));
      break;
    case CN__RT_V2_STATS:
      *body = dump(cn__kserve_model_stats(s, me));
      break;
    case CN__RT_READY:
      if (atomic_load(&s->draining)) {
        *status = 503;
        *body = cn__error_body(CN_E_DRAINING, "draining: not ready", -1);
      } else {
        *body = strdup("{\"status\":\"ready\"}");
      }
      break;
    case CN__RT_METRICS: {
      cn__gauges g = gauges(s);
      char *a = cn__metrics_render(&s->metrics, &g);
      char *m = cn__repo_metrics(s);
      size_t la = a ? strlen(a) : 0, lm = m ? strlen(m) : 0;
      *body = a && m ? malloc(la + lm + 1) : NULL;
      if (*body != NULL) {
        memcpy(*body, a, la);
        memcpy(*body + la, m, lm + 1);
      }
      free(a);
      free(m);
      *ctype = "text/plain; version=0.0.4; charset=utf-8";
      break;
    }
    case CN__RT_MODELS:
      *body = models_list(s);
      break;
    case CN__RT_REPO_INDEX:
      *body = dump(cn__repo_index(s));
      break;
    case CN__RT_V2_SERVER:
      *body = dump(cn__kserve_server_meta());
      break;
    case CN__RT_V2_MODEL:
      *body = dump(cn__kserve_model_meta(me));
      break;
    case CN__RT_MODEL: {
      json_t *o = json_deep_copy(me->describe);
      if (o != NULL)
        json_object_set_new(o, "policy", cn__policy_describe(s, me));
      *body = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
      json_decref(o);
      break;
    }
    default:
      return -1;
  }
  return *body == NULL ? -1 : 0;
}
