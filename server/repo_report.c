/* repo_report.c - what the repository says of itself: the index
 * (POST /v2/repository/index) and its metrics series. Any thread: a
 * slot's version and state are read under its mutex. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repo_dirs.h"
#include "handlers.h"
#include "log.h"

static const char *state_name(int st) {
  switch (st) {
    case CN__MODEL_LOADING: return "LOADING";
    case CN__MODEL_READY: return "READY";
    case CN__MODEL_UNAVAILABLE: return "UNAVAILABLE";
    default: return "UNLOADED";
  }
}

/* A directory's name (or a reason naming it) as a JSON string: a name
 * that is not UTF-8 is refused (repo_dirs.c), and jansson refuses it too,
 * so its entry once had no "name" at all; such bytes are written \xHH. */
static json_t *text_json(const char *t) {
  json_t *j = json_string(t);
  if (j != NULL) return j;
  size_t n = strlen(t), k = 0;
  char *esc = malloc(4 * n + 1);
  if (esc == NULL) return json_string("?");
  while (*t) {
    long at = cn__utf8_bad_at(t);
    size_t ok = at < 0 ? strlen(t) : (size_t)at;
    memcpy(esc + k, t, ok);
    k += ok;
    t += ok;
    if (*t) {
      k += (size_t)snprintf(esc + k, 5, "\\x%02x", (unsigned char)*t);
      t++;
    }
  }
  esc[k] = '\0';
  j = json_string(esc);
  free(esc);
  return j;
}

json_t *cn__repo_index(cn__server *s) {
  json_t *arr = json_array();
  int m = atomic_load(&s->n_models);
  for (int i = 0; i < m; i++) {
    cn__model_slot *sl = &s->models[i];
    if (!sl->used) continue;
    pthread_mutex_lock(&sl->vmu);
    bool has = sl->cur != NULL;
    pthread_mutex_unlock(&sl->vmu);
    /* unloaded and its directory gone: no longer in the repository, whether
     * or not slot_free could free it yet (requests still holding it) */
    if (!has && !cn__repo_busy(sl) && !cn__dirs_present(s->cfg.serve.models_dir, sl->name)) continue;
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(sl->name));
    pthread_mutex_lock(&sl->vmu);
    if (sl->cur != NULL)
      json_object_set_new(o, "version", json_string(sl->cur->version));
    json_object_set_new(o, "state", json_string(state_name(sl->state)));
    if (sl->reason[0] != '\0')
      json_object_set_new(o, "reason", json_string(sl->reason));
    pthread_mutex_unlock(&sl->vmu);
    json_array_append_new(arr, o);
  }
  /* directories the daemon has not loaded (model-control none, or not yet
   * rescanned) */
  char **names;
  cn__unservable *bad;
  int n_bad;
  int n = cn__dirs_list(s->cfg.serve.models_dir, &names, &bad, &n_bad);
  for (int i = 0; n >= 0 && i < n_bad; i++) {
    if (bad[i].not_model) continue;
    json_t *o = json_object();
    json_object_set_new(o, "name", text_json(bad[i].name));
    json_object_set_new(o, "state", json_string("UNAVAILABLE"));
    char why[360];
    snprintf(why, sizeof(why), "%s: %s", bad[i].why, bad[i].fix);
    json_object_set_new(o, "reason", text_json(why));
    json_array_append_new(arr, o);
  }
  if (n >= 0) cn__dirs_free_unservable(bad, n_bad);
  int used = 0;
  for (int i = 0; i < m; i++) used += s->models[i].used;
  char over[200];
  snprintf(over, sizeof(over), "not loaded: models-dir holds more model "
           "directories than the %d a daemon serves (the first in byte order "
           "of their names)", CN__MAX_MODELS);
  for (int i = 0; i < n; i++) {
    if (cn__repo_find(s, names[i], strlen(names[i])) != NULL) continue;
    json_t *o = json_object();
    /* past the bound: UNAVAILABLE (it cannot be served); never loaded
     * nor tried: Triton's UNKNOWN, not UNAVAILABLE, which says a load
     * failed */
    json_object_set_new(o, "name", json_string(names[i]));
    json_object_set_new(o, "state", json_string(
        used >= CN__MAX_MODELS ? "UNAVAILABLE" : "UNKNOWN"));
    json_object_set_new(o, "reason", json_string(
        used >= CN__MAX_MODELS ? over
        : strcmp(s->cfg.serve.model_control, "none") == 0
            ? "not loaded: new since start-up, and model-control is none "
              "(restart to serve it)"
            : "not loaded: new since the last scan of models-dir (POST "
              "/v2/repository/models/{model}/load, or SIGHUP, loads it)"));
    json_array_append_new(arr, o);
  }
  if (n >= 0) cn__dirs_free_names(names, n);
  return arr;
}

char *cn__repo_metrics(cn__server *s) {
  size_t cap = 4096, len = 0;
  char *b = malloc(cap);
  if (b == NULL) return NULL;
  int m = atomic_load(&s->n_models);
#define APPEND(...)                                                          \
  do {                                                                       \
    int k_ = snprintf(b + len, cap - len, __VA_ARGS__);                     \
    while (k_ >= 0 && (size_t)k_ >= cap - len) {                             \
      char *nb = realloc(b, cap *= 2);                                       \
      if (nb == NULL) { free(b); return NULL; }                              \
      b = nb;                                                                \
      k_ = snprintf(b + len, cap - len, __VA_ARGS__);                        \
    }                                                                        \
    len += (size_t)k_;                                                       \
  } while (0)
  APPEND("# HELP canopy_model_ready 1 for the version a model serves\n"
         "# TYPE canopy_model_ready gauge\n");
  for (int i = 0; i < m; i++) {
    cn__model_slot *sl = &s->models[i];
    if (!sl->used) continue;
    pthread_mutex_lock(&sl->vmu);
    char ver[160];
    if (sl->cur != NULL) cn__metrics_label_escape(ver, sizeof(ver), sl->cur->version);
    if (sl->cur != NULL)
      APPEND("canopy_model_ready{model=\"%s\",version=\"%s\"} 1\n", sl->label,
             ver);
    else
      APPEND("canopy_model_ready{model=\"%s\",version=\"\"} 0\n", sl->label);
    pthread_mutex_unlock(&sl->vmu);
  }
  APPEND("# HELP canopy_model_loads_total model loads (start-up, reloads) "
         "by result\n# TYPE canopy_model_loads_total counter\n");
  for (int i = 0; i < m; i++) {
    cn__model_slot *sl = &s->models[i];
    if (!sl->used) continue;
    pthread_mutex_lock(&sl->vmu);
    long long ok = sl->loads_ok, bad = sl->loads_failed;
    pthread_mutex_unlock(&sl->vmu);
    APPEND("canopy_model_loads_total{model=\"%s\",result=\"ok\"} %lld\n"
           "canopy_model_loads_total{model=\"%s\",result=\"failed\"} %lld\n",
           sl->label, ok, sl->label, bad);
  }
#undef APPEND
  return b;
}

/* Is host (the listen address, an IP literal or a name) loopback only? */
