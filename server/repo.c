/* repo.c - the model repository: which versions serve, loading, reloading
 * and unloading without a restart (docs/api.md "Model repository").
 *
 * A slot per model name (CN__MAX_MODELS, never moved: metrics label them)
 * holds the version new requests get. A version (cn__model_entry) is
 * loaded whole, with every start-up check, on a loader thread beside the
 * one serving; only then does the loop make it current. Requests and runs
 * hold references to the version they started with, so a swap loses
 * nothing: the old version is freed when its last run ends. A load that
 * fails leaves the old version serving and records why (index, log,
 * canopy_model_loads_total).
 *
 * Threads: slots are created on the loop thread (or at start-up, before
 * it runs); `cur`, `state` and `reason` are read under the slot's mutex
 * from any thread (the loop, workers, loader threads, the retrainer).
 */
#include <dirent.h>
#include <errno.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "notify.h"
#include "routes.h"
#include "serve_impl.h"

/* A finished load, handed from a loader thread to the loop. */
struct cn__load {
  struct cn__load *next;
  cn__server *srv;
  cn__model_slot *slot;
  cn__model_entry *ver; /* NULL: failed, err says why */
  cn_err err;
  cn__req *r;           /* a suspended POST .../load (a reference), or NULL */
};

static const char *state_name(int st) {
  switch (st) {
    case CN__MODEL_LOADING: return "LOADING";
    case CN__MODEL_READY: return "READY";
    case CN__MODEL_UNAVAILABLE: return "UNAVAILABLE";
    default: return "UNLOADED";
  }
}

/* The files a rescan watches: model.json and the weights. An atomic
 * rename of a new directory, or a rewrite of either file, changes them. */
static void signature(const char *dir, struct stat sig[2]) {
  char p[2200];
  memset(sig, 0, 2 * sizeof(struct stat));
  snprintf(p, sizeof(p), "%s/model.json", dir);
  if (stat(p, &sig[0]) != 0) memset(&sig[0], 0, sizeof(sig[0]));
  snprintf(p, sizeof(p), "%s/weights.safetensors", dir);
  if (stat(p, &sig[1]) != 0) memset(&sig[1], 0, sizeof(sig[1]));
}

/* The slot's directory as it is now: recorded when a load of it starts,
 * compared by the next rescan (loop thread, or start-up). */
static void slot_signature(cn__server *s, cn__model_slot *sl,
                           struct stat sig[2]) {
  char dir[2048];
  snprintf(dir, sizeof(dir), "%s/%s", s->cfg.serve.models_dir, sl->name);
  signature(dir, sig);
}

static bool same_signature(const struct stat a[2], const struct stat b[2]) {
  for (int i = 0; i < 2; i++)
    if (a[i].st_dev != b[i].st_dev || a[i].st_ino != b[i].st_ino ||
        a[i].st_size != b[i].st_size ||
        a[i].st_mtim.tv_sec != b[i].st_mtim.tv_sec ||
        a[i].st_mtim.tv_nsec != b[i].st_mtim.tv_nsec)
      return false;
  return true;
}

cn__model_slot *cn__repo_find(cn__server *s, const char *name, size_t len) {
  int n = atomic_load(&s->n_models);
  for (int i = 0; i < n; i++)
    if (strlen(s->models[i].name) == len &&
        strncmp(s->models[i].name, name, len) == 0)
      return &s->models[i];
  return NULL;
}

/* The slot of name, made if new (loop thread or start-up). NULL: full. */
static cn__model_slot *slot_get(cn__server *s, const char *name) {
  cn__model_slot *sl = cn__repo_find(s, name, strlen(name));
  if (sl != NULL) return sl;
  int n = atomic_load(&s->n_models);
  if (n >= CN__MAX_MODELS) return NULL;
  sl = &s->models[n];
  memset(sl, 0, sizeof(*sl));
  snprintf(sl->name, sizeof(sl->name), "%s", name);
  sl->index = n;
  sl->srv = s;
  sl->state = CN__MODEL_LOADING;
  pthread_mutex_init(&sl->vmu, NULL);
  uv_timer_init(&s->loop, &sl->timer);
  sl->timer.data = sl;
  s->metrics.model_names[n] = sl->name;
  atomic_store(&s->n_models, n + 1);
  cn__metrics_set_models(&s->metrics, n + 1);
  return sl;
}

cn__model_entry *cn__model_retain(cn__model_slot *sl) {
  if (sl == NULL) return NULL;
  pthread_mutex_lock(&sl->vmu);
  cn__model_entry *me = sl->cur;
  if (me != NULL) atomic_fetch_add(&me->refs, 1);
  pthread_mutex_unlock(&sl->vmu);
  return me;
}

void cn__model_release(cn__model_entry *me) {
  if (me == NULL || atomic_fetch_sub(&me->refs, 1) != 1) return;
  CN_LOG(CN_LOG_INFO, "msg=model-version-freed model=%s version=%s",
         me->name, me->version);
  json_decref(me->describe);
  cn__policy_destroy(me);
  cn_model_free(me->model);
  free(me);
}

/* Loads one version of slot sl's directory, with every start-up check.
 * Any thread: touches nothing shared but the policy cache (files). */
static int version_load(cn__server *s, cn__model_slot *sl,
                        cn__model_entry **out, cn_err *err) {
  char dir[2048];
  snprintf(dir, sizeof(dir), "%s/%s", s->cfg.serve.models_dir, sl->name);
  cn__model_entry *me = calloc(1, sizeof(*me));
  if (me == NULL) return cn_err_set(err, CN_E_NOMEM, "no memory");
  int rc = cn_model_load(dir, &me->model, err);
  if (rc != 0) {
    free(me);
    return rc;
  }
  snprintf(me->name, sizeof(me->name), "%s", sl->name);
  const char *v = cn_model_named_version(me->model);
  if (v != NULL) snprintf(me->version, sizeof(me->version), "%s", v);
  else snprintf(me->version, sizeof(me->version), "%.12s",
                cn_model_weights_sha256(me->model));
  me->index = sl->index;
  me->slot = sl;
  atomic_init(&me->refs, 1);
  cn__policy_init(s, me); /* a cache read at most: never trains */
  me->describe = cn__model_describe_full(s, me);
  /* every worker runs it once before it serves: a version that computes
   * NaN or Inf fails here, like NaN weights */
  if ((rc = cn__warmup_run(s, me, err)) != 0) {
    cn__model_release(me);
    return rc;
  }
  *out = me;
  return 0;
}

/* Makes me the version new requests get; the old one is released (its
 * runs finish on it). */
static void install(cn__model_slot *sl, cn__model_entry *me) {
  pthread_mutex_lock(&sl->vmu);
  cn__model_entry *old = sl->cur;
  sl->cur = me;
  sl->state = CN__MODEL_READY;
  sl->reason[0] = '\0';
  sl->loads_ok++;
  pthread_mutex_unlock(&sl->vmu);
  CN_LOG(CN_LOG_INFO, "msg=model-loaded model=%s version=%s family=%s "
         "input=%s weights_sha256=%s replaced=%s",
         me->name, me->version, cn_model_family(me->model),
         cn_input_kind_name(cn_model_input(me->model)),
         cn_model_weights_sha256(me->model), old ? old->version : "-");
  cn__model_release(old);
}

static void load_failed(cn__model_slot *sl, const cn_err *err) {
  pthread_mutex_lock(&sl->vmu);
  sl->loads_failed++;
  if (sl->cur != NULL) {
    snprintf(sl->reason, sizeof(sl->reason), "the last load failed, "
             "version %.72s serves: %.300s", sl->cur->version, err->msg);
  } else {
    sl->state = CN__MODEL_UNAVAILABLE;
    snprintf(sl->reason, sizeof(sl->reason), "%s", err->msg);
  }
  const char *serving = sl->cur ? sl->cur->version : "-";
  pthread_mutex_unlock(&sl->vmu);
  CN_LOG(CN_LOG_ERROR, "msg=model-load-failed model=%s serving=%s "
         "error=\"%s\"", sl->name, serving, err->msg);
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* What a model.json that is not a regular file is, in words (core's
 * loader says the same of the files it opens). */
static const char *file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

/* A subdirectory of models-dir that looks like a model but cannot be
 * served: its name is too long (CN__NAME_MAX bytes or more: the model's
 * name is its directory's), or its model.json is not a regular file (a
 * directory, a FIFO, a device). Each is a load that failed. */
typedef struct {
  char *name;
  char why[160];   /* "the directory's name has 130 bytes; ..." */
  char fix[24];    /* what strict-startup's message tells a person to do */
} unservable;

static void free_unservable(unservable *b, int n) {
  for (int i = 0; i < n; i++) free(b[i].name);
  free(b);
}

static int cmp_unservable(const void *a, const void *b) {
  return strcmp(((const unservable *)a)->name,
                ((const unservable *)b)->name);
}

/* The subdirectories of models-dir that hold a model.json, sorted. Those
 * that cannot be served go to *bad (sorted) when it is not NULL. */
static int list_dirs(cn__server *s, char ***out, unservable **bad,
                     int *n_bad) {
  const char *dir = s->cfg.serve.models_dir;
  *out = NULL;
  if (bad != NULL) {
    *bad = NULL;
    *n_bad = 0;
  }
  DIR *d = opendir(dir);
  if (d == NULL) return -1;
  char **names = calloc(CN__MAX_MODELS * 4, sizeof(char *));
  int n = 0;
  struct dirent *de;
  while (names != NULL && (de = readdir(d)) != NULL &&
         n < CN__MAX_MODELS * 4) {
    char p[4400];
    struct stat st;
    if (de->d_name[0] == '.') continue;
    snprintf(p, sizeof(p), "%s/%s/model.json", dir, de->d_name);
    /* stat follows a symlink to a regular file, and never blocks */
    if (stat(p, &st) != 0) continue;
    size_t len = strlen(de->d_name);
    if (len < CN__NAME_MAX && S_ISREG(st.st_mode)) {
      names[n++] = strdup(de->d_name);
      continue;
    }
    if (bad == NULL) continue;
    unservable *t = realloc(*bad, (size_t)(*n_bad + 1) * sizeof(*t));
    if (t == NULL) continue;
    *bad = t;
    unservable *u = &t[*n_bad];
    if ((u->name = strdup(de->d_name)) == NULL) continue;
    (*n_bad)++;
    if (len >= CN__NAME_MAX) {
      snprintf(u->why, sizeof(u->why), "the directory's name has %zu bytes; "
               "a model name has at most %d", len, CN__NAME_MAX - 1);
      snprintf(u->fix, sizeof(u->fix), "rename it");
    } else {
      snprintf(u->why, sizeof(u->why), "'model.json' is not a regular file "
               "(%s)", file_kind(st.st_mode));
      snprintf(u->fix, sizeof(u->fix), "replace it");
    }
  }
  closedir(d);
  if (names == NULL) return -1;
  qsort(names, (size_t)n, sizeof(char *), cmp_names);
  if (bad != NULL && *n_bad > 1)
    qsort(*bad, (size_t)*n_bad, sizeof(**bad), cmp_unservable);
  *out = names;
  return n;
}

/* "model=NAME" for the log, a long name cut to 60 bytes and "..." */
static void log_unservable(const unservable *u) {
  CN_LOG(CN_LOG_ERROR, "msg=model-load-failed model=%.60s%s error=\"%s\"",
         u->name, strlen(u->name) > 60 ? "..." : "", u->why);
}

static void free_names(char **names, int n) {
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
}

int cn__repo_load_all(cn__server *s, cn_err *err) {
  const cn_serve_config *sc = &s->cfg.serve;
  char **names;
  unservable *bad;
  int n_bad;
  int n = list_dirs(s, &names, &bad, &n_bad), rc = 0, loaded = 0;
  if (n < 0)
    return cn_err_set(err, CN_E_BAD_CONFIG, "models-dir: cannot open '%s'",
                      sc->models_dir);
  /* a directory that cannot be served is a model that failed to load */
  for (int i = 0; i < n_bad; i++) {
    log_unservable(&bad[i]);
    if (sc->strict_startup && rc == 0)
      rc = cn_err_set(err, CN_E_BAD_CONFIG, "models-dir: the directory "
                      "'%.60s%s': %s (%s, or set strict-startup false)",
                      bad[i].name, strlen(bad[i].name) > 60 ? "..." : "",
                      bad[i].why, bad[i].fix);
  }
  free_unservable(bad, n_bad);
  if (rc != 0) goto out;
  if (n == 0 && strcmp(sc->model_control, "none") == 0) {
    rc = cn_err_set(err, CN_E_BAD_CONFIG, "models-dir: no subdirectory of "
                    "'%s' holds a model.json", sc->models_dir);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    cn__model_slot *sl = slot_get(s, names[i]);
    if (sl == NULL) {
      rc = cn_err_set(err, CN_E_BAD_CONFIG, "models-dir: more than %d "
                      "models", CN__MAX_MODELS);
      goto out;
    }
    cn__model_entry *me;
    cn_err e;
    cn_err_clear(&e);
    slot_signature(s, sl, sl->tried);
    if (version_load(s, sl, &me, &e) == 0) {
      install(sl, me);
      loaded++;
      continue;
    }
    load_failed(sl, &e);
    if (sc->strict_startup) {
      *err = e;
      snprintf(err->msg, sizeof(err->msg), "model %.40s: %.270s", sl->name,
               e.msg);
      rc = e.code;
      goto out;
    }
  }
  if (n > 0 && loaded == 0)
    CN_LOG(CN_LOG_WARN, "msg=no-model-loaded models=%d", n);
out:
  free_names(names, n);
  return rc;
}

void cn__repo_free_all(cn__server *s) {
  int n = atomic_load(&s->n_models);
  for (int i = 0; i < n; i++) {
    cn__model_slot *sl = &s->models[i];
    cn__model_release(sl->cur);
    sl->cur = NULL;
    pthread_mutex_destroy(&sl->vmu);
  }
}

static void *loader_main(void *arg) {
  struct cn__load *L = arg;
  cn__server *s = L->srv;
  cn_err_clear(&L->err);
  if (version_load(s, L->slot, &L->ver, &L->err) != 0) L->ver = NULL;
  pthread_mutex_lock(&s->lmu);
  L->next = s->loaded;
  s->loaded = L;
  pthread_mutex_unlock(&s->lmu);
  uv_async_send(&s->load_async);
  return NULL;
}

/* Answers a suspended POST .../load (if it still waits). */
static void answer_load(cn__model_slot *sl, cn__req *r, cn__model_entry *v,
                        const cn_err *err) {
  if (r == NULL) return;
  if (r->state == CN__REQ_WAITING) {
    if (v != NULL) {
      json_t *o = json_object();
      json_object_set_new(o, "name", json_string(sl->name));
      json_object_set_new(o, "version", json_string(v->version));
      json_object_set_new(o, "state", json_string("READY"));
      char *b = json_dumps(o, JSON_COMPACT);
      json_decref(o);
      cn__req_answer(r, 200, b, NULL);
    } else {
      cn__req_answer(r, cn_err_http_status(err->code),
                     cn__error_body(err->code, err->msg, -1), "load-failed");
    }
  }
  cn__req_unref(r);
}

void cn__repo_load_async(cn__server *s, const char *name, cn__req *r) {
  cn_err e;
  cn_err_clear(&e);
  /* A load asked for by name makes a slot only for a directory that
   * holds a model.json (or a model already known): junk names would
   * otherwise fill the repository's CN__MAX_MODELS slots for good. */
  char mj[1200];
  struct stat st;
  snprintf(mj, sizeof(mj), "%s/%s/model.json", s->cfg.serve.models_dir,
           name);
  bool wanted = r == NULL || cn__repo_find(s, name, strlen(name)) != NULL ||
                stat(mj, &st) == 0;
  cn__model_slot *sl = wanted ? slot_get(s, name) : NULL;
  if (r != NULL) { /* a waiting request, answered by answer_load */
    atomic_fetch_add(&r->refs, 1);
    r->state = CN__REQ_WAITING;
    r->wnext = s->waiting;
    r->wprev = NULL;
    if (s->waiting) s->waiting->wprev = r;
    s->waiting = r;
  }
  if (!wanted) {
    cn_err_set(&e, CN_E_NO_SUCH_MODEL, "no model directory '%.200s' in "
               "models-dir (it needs a model.json)", name);
    answer_load(NULL, r, NULL, &e);
    return;
  }
  if (sl == NULL) {
    cn_err_set(&e, CN_E_TOO_LARGE, "more than %d models", CN__MAX_MODELS);
    answer_load(NULL, r, NULL, &e);
    return;
  }
  struct cn__load *L = calloc(1, sizeof(*L));
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (L != NULL) {
    L->srv = s;
    L->slot = sl;
    L->r = r;
  }
  if (L == NULL || pthread_create(&t, &at, loader_main, L) != 0) {
    free(L);
    cn_err_set(&e, CN_E_NOMEM, "cannot start a loader thread");
    answer_load(sl, r, NULL, &e);
  } else {
    sl->loading = true;
    slot_signature(s, sl, sl->tried);
    s->loads_pending++;
    CN_LOG(CN_LOG_INFO, "msg=model-loading model=%s", sl->name);
  }
  pthread_attr_destroy(&at);
}

void cn__repo_on_loaded(uv_async_t *a) {
  cn__server *s = a->data;
  pthread_mutex_lock(&s->lmu);
  struct cn__load *L = s->loaded;
  s->loaded = NULL;
  pthread_mutex_unlock(&s->lmu);
  while (L != NULL) {
    struct cn__load *next = L->next;
    cn__model_slot *sl = L->slot;
    sl->loading = false;
    if (atomic_load(&s->draining)) {
      cn__model_release(L->ver); /* too late to serve it */
      L->ver = NULL;
      cn_err_set(&L->err, CN_E_DRAINING, "the server is shutting down");
    }
    if (L->ver != NULL) {
      atomic_fetch_add(&L->ver->refs, 1); /* for the answer below */
      install(sl, L->ver);
    } else if (L->err.code != CN_E_DRAINING) {
      load_failed(sl, &L->err);
    }
    answer_load(sl, L->r, L->ver, &L->err);
    cn__model_release(L->ver);
    free(L);
    L = next;
    s->loads_pending--;
  }
  if (s->reload_notify && s->loads_pending == 0) {
    s->reload_notify = false;
    cn__notify("READY=1\nSTATUS=serving");
  }
}

void cn__repo_unload(cn__server *s, cn__model_slot *sl) {
  pthread_mutex_lock(&sl->vmu);
  cn__model_entry *old = sl->cur;
  sl->cur = NULL;
  sl->state = CN__MODEL_UNLOADED;
  snprintf(sl->reason, sizeof(sl->reason), "unloaded");
  pthread_mutex_unlock(&sl->vmu);
  CN_LOG(CN_LOG_INFO, "msg=model-unloaded model=%s version=%s", sl->name,
         old ? old->version : "-");
  cn__model_release(old); /* its requests finish on it */
}

/* Has the directory changed since its last load was tried? A version
 * that failed is not retried, nor one unloaded through the API reloaded,
 * until its files change. */
static bool slot_changed(cn__server *s, cn__model_slot *sl) {
  struct stat now[2];
  slot_signature(s, sl, now);
  return !same_signature(now, sl->tried);
}

void cn__repo_rescan(cn__server *s, const char *why) {
  /* a service manager's reload (SIGHUP): RELOADING=1 now, READY=1 once
   * the loads it started are back (sd_notify(3)) */
  bool reload = strcmp(why, "sighup") == 0;
  if (reload) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char msg[96];
    snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%lld",
             (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000);
    cn__notify(msg);
  }
  char **names;
  unservable *bad;
  int n_bad;
  int n = list_dirs(s, &names, &bad, &n_bad);
  if (n < 0) {
    CN_LOG(CN_LOG_ERROR, "msg=rescan-failed why=%s models_dir=\"%s\"", why,
           s->cfg.serve.models_dir);
    return;
  }
  int loads = 0, unloads = 0;
  for (int i = 0; i < n; i++) {
    cn__model_slot *sl = cn__repo_find(s, names[i], strlen(names[i]));
    /* new, reappeared after removal, or changed since the last try */
    if (sl == NULL || (!sl->loading && slot_changed(s, sl))) {
      cn__repo_load_async(s, names[i], NULL);
      loads++;
    }
  }
  int m = atomic_load(&s->n_models);
  for (int i = 0; i < m; i++) {
    cn__model_slot *sl = &s->models[i];
    bool present = false;
    for (int k = 0; k < n && !present; k++)
      present = strcmp(names[k], sl->name) == 0;
    if (present || sl->loading) continue;
    pthread_mutex_lock(&sl->vmu);
    bool has = sl->cur != NULL;
    pthread_mutex_unlock(&sl->vmu);
    /* gone: whatever appears under the name later is new */
    memset(sl->tried, 0, sizeof(sl->tried));
    if (has) {
      cn__repo_unload(s, sl);
      unloads++;
    }
  }
  if (loads + unloads > 0 || strcmp(why, "poll") != 0)
    CN_LOG(CN_LOG_INFO, "msg=rescan why=%s directories=%d loads=%d "
           "unloads=%d", why, n, loads, unloads);
  for (int i = 0; i < n_bad && strcmp(why, "poll") != 0; i++)
    log_unservable(&bad[i]);
  free_unservable(bad, n_bad);
  free_names(names, n);
  if (reload) {
    s->reload_notify = true;
    if (s->loads_pending == 0) {
      s->reload_notify = false;
      cn__notify("READY=1\nSTATUS=serving");
    }
  }
}

json_t *cn__repo_index(cn__server *s) {
  json_t *arr = json_array();
  int m = atomic_load(&s->n_models);
  for (int i = 0; i < m; i++) {
    cn__model_slot *sl = &s->models[i];
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
  unservable *bad;
  int n_bad;
  int n = list_dirs(s, &names, &bad, &n_bad);
  for (int i = 0; n >= 0 && i < n_bad; i++) {
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(bad[i].name));
    json_object_set_new(o, "state", json_string("UNAVAILABLE"));
    char why[200];
    snprintf(why, sizeof(why), "%s: %s", bad[i].why, bad[i].fix);
    json_object_set_new(o, "reason", json_string(why));
    json_array_append_new(arr, o);
  }
  if (n >= 0) free_unservable(bad, n_bad);
  for (int i = 0; i < n; i++) {
    if (cn__repo_find(s, names[i], strlen(names[i])) != NULL) continue;
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(names[i]));
    json_object_set_new(o, "state", json_string("UNAVAILABLE"));
    json_object_set_new(o, "reason", json_string("not loaded: new since the "
                                                 "last scan of models-dir"));
    json_array_append_new(arr, o);
  }
  if (n >= 0) free_names(names, n);
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
    pthread_mutex_lock(&sl->vmu);
    if (sl->cur != NULL)
      APPEND("canopy_model_ready{model=\"%s\",version=\"%s\"} 1\n", sl->name,
             sl->cur->version);
    else
      APPEND("canopy_model_ready{model=\"%s\",version=\"\"} 0\n", sl->name);
    pthread_mutex_unlock(&sl->vmu);
  }
  APPEND("# HELP canopy_model_loads_total model loads (start-up, reloads) "
         "by result\n# TYPE canopy_model_loads_total counter\n");
  for (int i = 0; i < m; i++) {
    cn__model_slot *sl = &s->models[i];
    pthread_mutex_lock(&sl->vmu);
    long long ok = sl->loads_ok, bad = sl->loads_failed;
    pthread_mutex_unlock(&sl->vmu);
    APPEND("canopy_model_loads_total{model=\"%s\",result=\"ok\"} %lld\n"
           "canopy_model_loads_total{model=\"%s\",result=\"failed\"} %lld\n",
           sl->name, ok, sl->name, bad);
  }
#undef APPEND
  return b;
}
