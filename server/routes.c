/* routes.c - which route a path names, and the bodies of the GET routes
 * (models, health, metrics). Everything here only reads state that is
 * immutable while serving or kept in atomics, so it may run on the loop
 * or on MHD's thread. */
#include <stdlib.h>
#include <string.h>

#include "routes.h"
#include "serve_impl.h"

/* /v1/models/{name}[/infer]: name is one path segment. */
static cn__model_entry *find_model(cn__server *s, const char *name,
                                   size_t len) {
  for (int i = 0; i < s->n_models; i++)
    if (strlen(s->models[i].name) == len &&
        strncmp(s->models[i].name, name, len) == 0)
      return &s->models[i];
  return NULL;
}

cn__route cn__route_find(cn__server *s, const char *path,
                         cn__model_entry **me) {
  static const struct {
    const char *path;
    cn__route rt;
  } fixed[] = {{"/healthz", CN__RT_LIVE},
               {"/v2/health/live", CN__RT_LIVE},
               {"/readyz", CN__RT_READY},
               {"/v2/health/ready", CN__RT_READY},
               {"/metrics", CN__RT_METRICS},
               {"/v1/models", CN__RT_MODELS},
               {"/v1/models/", CN__RT_MODELS}};
  *me = NULL;
  for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
    if (strcmp(path, fixed[i].path) == 0) return fixed[i].rt;
  const char *pre = "/v1/models/";
  if (strncmp(path, pre, strlen(pre)) != 0) return CN__RT_NONE;
  const char *name = path + strlen(pre);
  const char *slash = strchr(name, '/');
  size_t len = slash ? (size_t)(slash - name) : strlen(name);
  cn__route rt;
  if (slash == NULL)
    rt = CN__RT_MODEL;
  else if (strcmp(slash, "/infer") == 0)
    rt = CN__RT_INFER;
  else
    return CN__RT_NONE;
  *me = find_model(s, name, len);
  return rt;
}

static char *dump(json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
  json_decref(j);
  return s;
}

static char *models_list(cn__server *s) {
  json_t *arr = json_array();
  for (int i = 0; i < s->n_models; i++) {
    cn__model_entry *me = &s->models[i];
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(me->name));
    json_object_set_new(o, "family",
                        json_string(cn_model_family(me->model)));
    json_object_set_new(
        o, "input",
        json_string(cn_input_kind_name(cn_model_input(me->model))));
    json_object_set_new(o, "ready", json_true());
    json_array_append_new(arr, o);
  }
  json_t *root = json_object();
  json_object_set_new(root, "models", arr);
  return dump(root);
}

/* GET /v1/models/{name}: cn_model_describe plus the name, built once at
 * start-up; the "policy" object (which changes when the retrainer swaps
 * policies) is added per request by cn__policy_describe. */
json_t *cn__model_describe_full(cn__server *s, cn__model_entry *me) {
  json_t *o = cn_model_describe(me->model);
  json_object_set_new(o, "name", json_string(me->name));
  json_object_set_new(o, "ready", json_true());
  return o;
}

static cn__gauges gauges(cn__server *s) {
  cn__gauges g;
  g.queue_instances = atomic_load(&s->waiting_instances);
  pthread_mutex_lock(&s->qmu);
  g.queued_runs = s->queued_jobs;
  pthread_mutex_unlock(&s->qmu);
  g.in_flight = atomic_load(&s->in_flight);
  g.workers = s->n_threads;
  g.draining = atomic_load(&s->draining);
  g.ready = !g.draining;
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
      *body = cn__metrics_render(&s->metrics, &g);
      *ctype = "text/plain; version=0.0.4; charset=utf-8";
      break;
    }
    case CN__RT_MODELS:
      *body = models_list(s);
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
