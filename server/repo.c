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
 * Bounds (docs/reliability.md): one load per model in flight
 * (a second POST .../load joins it), max-loads loads at once (429 beyond;
 * a rescan's load waits), CN__MAX_MODELS live slots (a slot is freed once
 * its model is unloaded and its directory gone). An unload cancels a load
 * in flight (its result is discarded); a rescan that finds a load in
 * flight owes the slot one more look when it ends.
 *
 * Threads: slots are created on the loop thread (or at start-up, before
 * it runs); `cur`, `state` and `reason` are read under the slot's mutex
 * from any thread (the loop, workers, loader threads, the retrainer).
 *
 * Unloads, rescans and the guard of the routes are repo_control.c's;
 * reading the models directory is repo_dirs.c's; the index and the
 * repository's metrics series are repo_report.c's.
 */
#include <arpa/inet.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "notify.h"
#include "repo_dirs.h"
#include "routes.h"
#include "handlers.h"

/* A finished load, handed from a loader thread to the loop. */
struct cn__load {
  struct cn__load *next;
  cn__server *srv;
  cn__model_slot *slot;
  cn__model_entry *ver; /* NULL: failed, err says why */
  cn_err err;
  unsigned gen;         /* the slot's gen when it started */
};

/* The slot's directory as it is now: recorded when a load of it starts,
 * compared by the next rescan (loop thread, or start-up). */
void cn__repo_slot_signature(cn__server *s, cn__model_slot *sl,
                             struct stat sig[2]) {
  char dir[2048];
  snprintf(dir, sizeof(dir), "%s/%s", s->cfg.serve.models_dir, sl->name);
  cn__dirs_signature(dir, sig);
}

cn__model_slot *cn__repo_find(cn__server *s, const char *name, size_t len) {
  int n = atomic_load(&s->n_models);
  for (int i = 0; i < n; i++)
    if (s->models[i].used && strlen(s->models[i].name) == len &&
        strncmp(s->models[i].name, name, len) == 0)
      return &s->models[i];
  return NULL;
}

bool cn__repo_nearest(cn__server *s, const char *name, char *out,
                      size_t cap) {
  int n = atomic_load(&s->n_models), best = 3;
  /* a name that differs only in case, else one or two edits away (one
   * for a short name: "a" is one edit from every one-letter name) */
  int most = strlen(name) >= 5 ? 2 : 1;
  out[0] = '\0';
  for (int i = 0; i < n; i++) {
    const cn__model_slot *sl = &s->models[i];
    if (!sl->used) continue;
    int d = strcasecmp(sl->name, name) == 0 ? 0
        : cn_edit_distance(name, sl->name, true);
    if (d < best && d <= most) {
      best = d;
      snprintf(out, cap, "%s", sl->name);
    }
  }
  return out[0] != '\0';
}

bool cn__repo_busy(const cn__model_slot *sl) {
  return sl->loading || sl->queued;
}

/* Frees sl for another name when nothing holds it: no version, no load,
 * no window, no version alive that points at it (loop thread). */
bool cn__repo_slot_free(cn__server *s, cn__model_slot *sl) {
  pthread_mutex_lock(&sl->vmu);
  bool idle = sl->cur == NULL;
  pthread_mutex_unlock(&sl->vmu);
  if (!sl->used || !idle || cn__repo_busy(sl) || sl->window != NULL ||
      sl->joined != NULL || atomic_load(&sl->entries) != 0 ||
      atomic_load(&sl->decoding) != 0)
    return false;
  CN_LOG(CN_LOG_INFO, "msg=model-slot-freed model=%s slot=%d", sl->name,
         sl->index);
  sl->used = false;
  memset(sl->tried, 0, sizeof(sl->tried));
  return true;
}

/* Live slots: the bound counts models the daemon knows now, not every
 * name it ever saw. When full, slots of models without a
 * version whose directory is gone are freed first. */
static int live_slots(cn__server *s, bool reclaim) {
  int n = atomic_load(&s->n_models), live = 0;
  for (int i = 0; i < n; i++) {
    cn__model_slot *sl = &s->models[i];
    if (sl->used && reclaim && !cn__dirs_present(s->cfg.serve.models_dir, sl->name) && cn__repo_slot_free(s, sl))
      continue;
    live += sl->used;
  }
  return live;
}

/* The slot of name, made if new (loop thread or start-up). NULL: full. */
static cn__model_slot *slot_get(cn__server *s, const char *name) {
  cn__model_slot *sl = cn__repo_find(s, name, strlen(name));
  if (sl != NULL) return sl;
  if (live_slots(s, false) >= CN__MAX_MODELS &&
      live_slots(s, true) >= CN__MAX_MODELS)
    return NULL;
  int n = atomic_load(&s->n_models);
  for (int i = 0; i < n && sl == NULL; i++)
    if (!s->models[i].used && atomic_load(&s->models[i].entries) == 0 &&
        s->models[i].window == NULL && !s->models[i].loading)
      sl = &s->models[i];
  if (sl != NULL) { /* a freed slot: its mutex and timer stay */
    cn__metrics_reset_model(&s->metrics, sl->index);
    pthread_mutex_lock(&sl->vmu);
    sl->state = CN__MODEL_LOADING;
    sl->reason[0] = '\0';
    sl->loads_ok = sl->loads_failed = 0;
    pthread_mutex_unlock(&sl->vmu);
    sl->rescan_owed = sl->queued = false;
    snprintf(sl->name, sizeof(sl->name), "%s", name);
    cn__metrics_label_escape(sl->label, sizeof(sl->label), name);
    sl->used = true;
    return sl;
  }
  if (n >= CN__MAX_MODELS) return NULL;
  sl = &s->models[n];
  memset(sl, 0, sizeof(*sl));
  snprintf(sl->name, sizeof(sl->name), "%s", name);
  cn__metrics_label_escape(sl->label, sizeof(sl->label), name);
  sl->index = n;
  sl->srv = s;
  sl->used = true;
  sl->state = CN__MODEL_LOADING;
  pthread_mutex_init(&sl->vmu, NULL);
  uv_timer_init(&s->loop, &sl->timer);
  sl->timer.data = sl;
  s->metrics.model_names[n] = sl->label;
  atomic_store(&s->n_models, n + 1);
  cn__metrics_set_models(&s->metrics, n + 1);
  return sl;
}

/* GET /v1/models/{name}: cn_model_describe plus the name, built once at
 * start-up; the "policy" object (which changes when the retrainer swaps
 * policies) is added per request by cn__policy_describe. */
static json_t *describe_full(const cn__model_entry *me) {
  json_t *o = cn_model_describe(me->model);
  json_object_set_new(o, "name", json_string(me->name));
  json_object_set_new(o, "version", json_string(me->version));
  json_object_set_new(o, "ready", json_true());
  return o;
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
  atomic_fetch_add(&sl->entries, 1);
  atomic_init(&me->refs, 1);
  cn__policy_init(s, me); /* a cache read at most: never trains */
  me->describe = describe_full(me);
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

int cn__repo_load_all(cn__server *s, cn_err *err) {
  const cn_serve_config *sc = &s->cfg.serve;
  char **names;
  cn__unservable *bad;
  int n_bad;
  int n = cn__dirs_list(s->cfg.serve.models_dir, &names, &bad, &n_bad), rc = 0, loaded = 0;
  if (n < 0)
    return cn_err_set(err, CN_E_BAD_CONFIG, "models-dir: cannot open '%s'",
                      sc->models_dir);
  /* a directory that cannot be served is a model that failed to load */
  for (int i = 0; i < n_bad; i++) {
    cn__dirs_log_unservable(&bad[i]);
    if (sc->strict_startup && rc == 0 && !bad[i].not_model)
      rc = cn_err_set(err, CN_E_BAD_CONFIG, "models-dir: the directory "
                      "'%.60s%s': %s (%s, or set strict-startup false)",
                      bad[i].name, strlen(bad[i].name) > 60 ? "..." : "",
                      bad[i].why, bad[i].fix);
  }
  cn__dirs_free_unservable(bad, n_bad);
  if (rc != 0) goto out;
  if (n == 0 && strcmp(sc->model_control, "none") == 0) {
    rc = cn_err_set(err, CN_E_BAD_CONFIG, "models-dir: no subdirectory of "
                    "'%s' holds a model.json", sc->models_dir);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    cn__model_slot *sl = slot_get(s, names[i]);
    if (sl == NULL && sc->strict_startup) {
      rc = cn_err_set(err, CN_E_BAD_CONFIG, "models-dir: %d model "
                      "directories, more than the %d a daemon serves (set "
                      "strict-startup false to serve the first %d in byte "
                      "order of their names)", n, CN__MAX_MODELS,
                      CN__MAX_MODELS);
      goto out;
    }
    /* the names are sorted: the first CN__MAX_MODELS serve, the others
     * are UNAVAILABLE in the index (repo_report.c says why) */
    if (sl == NULL) {
      char cut[64], esc[260];
      snprintf(cut, sizeof(cut), "%.60s", names[i]);
      cn__log_escape(esc, sizeof(esc), cut);
      CN_LOG(CN_LOG_ERROR, "msg=models-over-bound directories=%d served=%d "
             "first_unserved=\"%s\" reason=\"a daemon serves at most %d "
             "models, the first in byte order of their names\"", n,
             CN__MAX_MODELS, esc, CN__MAX_MODELS);
      break;
    }
    cn__model_entry *me;
    cn_err e;
    cn_err_clear(&e);
    cn__repo_slot_signature(s, sl, sl->tried);
    if (version_load(s, sl, &me, &e) == 0) {
      install(sl, me);
      loaded++;
      continue;
    }
    load_failed(sl, &e);
    if (sc->strict_startup) {
      *err = e;
      snprintf(err->msg, sizeof(err->msg), "model %.40s: %.200s (or set "
               "strict-startup false to start without it)", sl->name, e.msg);
      rc = e.code;
      goto out;
    }
  }
  if (n > 0 && loaded == 0)
    CN_LOG(CN_LOG_WARN, "msg=no-model-loaded models=%d", n);
out:
  cn__dirs_free_names(names, n);
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
  pthread_cond_signal(&s->lcv);
  pthread_mutex_unlock(&s->lmu);
  uv_async_send(&s->load_async);
  return NULL;
}

/* A SIGTERM during loads stopped the loop before they came back: their
 * results, and the POST .../load requests that joined them, were never
 * freed (LSan at exit). The loaders end soon once the workers stopped
 * (their warm-up is abandoned); each is then settled by on_loaded. */
void cn__repo_loads_join(cn__server *s) {
  if (s->loads_pending == 0) return;
  pthread_mutex_lock(&s->lmu);
  for (;;) {
    int back = 0;
    for (struct cn__load *L = s->loaded; L != NULL; L = L->next) back++;
    if (back >= s->loads_pending) break;
    pthread_cond_wait(&s->lcv, &s->lmu);
  }
  pthread_mutex_unlock(&s->lmu);
  cn__repo_on_loaded(&s->load_async);
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
      /* a directory whose files do not load (bad model.json, weights cut
       * short, a warm-up that computes NaN, a file it cannot read) is the
       * repository's fault, not the server's: 400, as the model
       * repository extension says a failed load is; out of memory stays
       * 500 */
      int st = cn_err_http_status(err->code);
      if (err->code == CN_E_BAD_MODEL || err->code == CN_E_BAD_CONFIG ||
          err->code == CN_E_IO || err->code == CN_E_NON_FINITE)
        st = 400;
      cn__req_answer(r, st, cn__error_body(err->code, err->msg, -1),
                     "load-failed");
    }
  }
  cn__req_unref(r);
}

/* Answers every request that joined sl's load, and forgets them. */
void cn__repo_answer_joined(cn__model_slot *sl, cn__model_entry *v,
                            const cn_err *err) {
  cn__req *r = sl->joined;
  sl->joined = NULL;
  while (r != NULL) {
    cn__req *next = r->lnext;
    r->lnext = NULL;
    answer_load(sl, r, v, err);
    r = next;
  }
}

/* Starts a loader thread for sl (loop thread): the one load of sl in
 * flight, counted in loads_pending against max-loads by the caller. */
static int start_load(cn__server *s, cn__model_slot *sl, cn_err *e) {
  struct cn__load *L = calloc(1, sizeof(*L));
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (L != NULL) {
    L->srv = s;
    L->slot = sl;
    L->gen = sl->gen;
  }
  int rc = 0;
  if (L == NULL || pthread_create(&t, &at, loader_main, L) != 0) {
    free(L);
    rc = cn_err_set(e, CN_E_NOMEM, "cannot start a loader thread");
  } else {
    sl->loading = true;
    sl->queued = false;
    sl->load_gen = sl->gen;
    cn__repo_slot_signature(s, sl, sl->tried);
    s->loads_pending++;
    CN_LOG(CN_LOG_INFO, "msg=model-loading model=%s loads_in_flight=%d",
           sl->name, s->loads_pending);
  }
  pthread_attr_destroy(&at);
  return rc;
}

/* Rescans' loads that waited for max-loads, started while there is room. */
static void start_queued(cn__server *s) {
  int n = atomic_load(&s->n_models);
  for (int i = 0; i < n && s->loads_pending < s->cfg.serve.max_loads; i++) {
    cn__model_slot *sl = &s->models[i];
    if (!sl->used || !sl->queued || sl->loading) continue;
    cn_err e;
    cn_err_clear(&e);
    sl->queued = false;
    if (start_load(s, sl, &e) != 0) load_failed(sl, &e);
  }
}

void cn__repo_load_async(cn__server *s, const char *name, cn__req *r) {
  cn_err e;
  cn_err_clear(&e);
  char what[80];
  const char *flaw = cn__dirs_name_flaw(name, what, sizeof(what));
  /* A load asked for by name makes a slot only for a directory that
   * holds a model.json (or a model already known): junk names would
   * otherwise fill the repository's CN__MAX_MODELS slots. */
  bool wanted = flaw == NULL && (r == NULL ||
                           cn__repo_find(s, name, strlen(name)) != NULL ||
                           cn__dirs_present(s->cfg.serve.models_dir, name));
  cn__model_slot *sl = wanted ? slot_get(s, name) : NULL;
  if (r != NULL) { /* a waiting request, answered by answer_load */
    atomic_fetch_add(&r->refs, 1);
    r->state = CN__REQ_WAITING;
    r->wnext = s->waiting;
    r->wprev = NULL;
    r->lnext = NULL;
    if (s->waiting) s->waiting->wprev = r;
    s->waiting = r;
  }
  if (flaw != NULL) {
    cn_err_set(&e, CN_E_BAD_REQUEST, "the model name %s: a model name is "
               "UTF-8 with no control character", flaw);
    answer_load(NULL, r, NULL, &e);
    return;
  }
  if (!wanted) {
    char near[CN__NAME_MAX];
    if (cn__repo_nearest(s, name, near, sizeof(near)))
      cn_err_set(&e, CN_E_NO_SUCH_MODEL, "no model directory '%.120s' in "
                 "models-dir; did you mean '%s'?", name, near);
    else
      cn_err_set(&e, CN_E_NO_SUCH_MODEL, "no model directory '%.200s' in "
                 "models-dir (it needs a model.json)", name);
    answer_load(NULL, r, NULL, &e);
    return;
  }
  if (sl == NULL) {
    cn_err_set(&e, CN_E_TOO_LARGE, "more than %d models (loaded, loading, "
               "failed, or unloaded with their directory still in "
               "models-dir): remove a directory and unload its model",
               CN__MAX_MODELS);
    answer_load(NULL, r, NULL, &e);
    return;
  }
  if (sl->loading) {
    /* one load per model in flight: a request joins it; a rescan owes
     * the slot one more look once it ends (the files may have changed
     * after that load opened them) */
    if (r != NULL) {
      r->lnext = sl->joined;
      sl->joined = r;
      CN_LOG(CN_LOG_INFO, "msg=model-load-joined model=%s id=%s",
             sl->name, r->id);
    } else {
      sl->rescan_owed = true;
    }
    return;
  }
  if (s->loads_pending >= s->cfg.serve.max_loads) {
    if (r == NULL) { /* a rescan's: started when a load ends */
      sl->queued = true;
      return;
    }
    cn_err_set(&e, CN_E_OVERLOADED, "%d model loads are in flight "
               "(max-loads %d): retry later", s->loads_pending,
               s->cfg.serve.max_loads);
    answer_load(NULL, r, NULL, &e);
    return;
  }
  if (start_load(s, sl, &e) != 0) {
    answer_load(sl, r, NULL, &e);
    return;
  }
  if (r != NULL) {
    r->lnext = sl->joined;
    sl->joined = r;
  }
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
    s->loads_pending--;
    bool stale = L->gen != sl->gen;
    if (atomic_load(&s->draining)) {
      cn__model_release(L->ver); /* too late to serve it */
      L->ver = NULL;
      cn_err_set(&L->err, CN_E_DRAINING, "the server is shutting down");
      stale = false;
    }
    if (stale) {
      /* an unload came while it loaded: the result is discarded. Loads
       * asked for since then get a load of their own. */
      CN_LOG(CN_LOG_INFO, "msg=model-load-discarded model=%s version=%s "
             "reason=unloaded", sl->name, L->ver ? L->ver->version : "-");
      cn__model_release(L->ver);
      cn_err e;
      cn_err_clear(&e);
      if (sl->joined != NULL && start_load(s, sl, &e) != 0)
        cn__repo_answer_joined(sl, NULL, &e);
      free(L);
      L = next;
      continue;
    }
    if (L->ver != NULL) {
      atomic_fetch_add(&L->ver->refs, 1); /* for the answers below */
      install(sl, L->ver);
    } else if (L->err.code != CN_E_DRAINING) {
      load_failed(sl, &L->err);
    }
    cn__repo_answer_joined(sl, L->ver, &L->err);
    cn__model_release(L->ver);
    /* a rescan came while it loaded: look once more */
    if (sl->rescan_owed && !atomic_load(&s->draining)) {
      sl->rescan_owed = false;
      struct stat now[2];
      cn__repo_slot_signature(s, sl, now);
      if (!cn__dirs_same(now, sl->tried) && cn__dirs_present(s->cfg.serve.models_dir, sl->name))
        cn__repo_load_async(s, sl->name, NULL);
    }
    free(L);
    L = next;
  }
  if (!atomic_load(&s->draining)) start_queued(s);
  if (s->reload_notify && s->loads_pending == 0) {
    s->reload_notify = false;
    cn__notify("READY=1\nSTATUS=serving");
  }
}
