/* repo_control.c - what changes which models serve, other than a load:
 * an unload (the route's, or a rescan's for a directory gone), the rescan
 * of the models directory (SIGHUP and the poll timer: new directories
 * load, changed ones reload, removed ones unload), and the guard of the
 * repository routes. Loop thread. The loads themselves are repo.c's.
 */
#include <arpa/inet.h>
#include <time.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "notify.h"
#include "repo_dirs.h"
#include "handlers.h"

void cn__repo_unload(cn__server *s, cn__model_slot *sl) {
  /* a load in flight or queued is cancelled: its result is discarded
   * (else it would make the model READY again), and the requests
   * that waited on it are told */
  bool cancelled = cn__repo_busy(sl);
  sl->gen++;
  sl->queued = false;
  sl->rescan_owed = false;
  if (sl->joined != NULL) {
    cn_err e;
    cn_err_clear(&e);
    cn_err_set(&e, CN_E_UNAVAILABLE, "model '%.128s' was unloaded while it "
               "loaded: that load is discarded", sl->name);
    cn__repo_answer_joined(sl, NULL, &e);
  }
  pthread_mutex_lock(&sl->vmu);
  cn__model_entry *old = sl->cur;
  sl->cur = NULL;
  sl->state = CN__MODEL_UNLOADED;
  snprintf(sl->reason, sizeof(sl->reason), "unloaded");
  pthread_mutex_unlock(&sl->vmu);
  CN_LOG(CN_LOG_INFO, "msg=model-unloaded model=%s version=%s "
         "load_cancelled=%s", sl->name, old ? old->version : "-",
         cancelled ? "true" : "false");
  cn__model_release(old); /* its requests finish on it */
  /* its directory gone: the slot is free for another name */
  if (!cn__dirs_present(s->cfg.serve.models_dir, sl->name)) cn__repo_slot_free(s, sl);
}

/* Has the directory changed since its last load was tried? A version
 * that failed is not retried, nor one unloaded through the API reloaded,
 * until its files change. */
static bool slot_changed(cn__server *s, cn__model_slot *sl) {
  struct stat now[2];
  cn__repo_slot_signature(s, sl, now);
  return !cn__dirs_same(now, sl->tried);
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
  cn__unservable *bad;
  int n_bad;
  int n = cn__dirs_list(s->cfg.serve.models_dir, &names, &bad, &n_bad);
  if (n < 0) {
    CN_LOG(CN_LOG_ERROR, "msg=rescan-failed why=%s models_dir=\"%s\"", why,
           s->cfg.serve.models_dir);
    return;
  }
  int loads = 0, unloads = 0;
  for (int i = 0; i < n; i++) {
    cn__model_slot *sl = cn__repo_find(s, names[i], strlen(names[i]));
    /* loading: its files may change after the load opened them, so the
     * slot gets one more look when the load ends (else a SIGHUP
     * during a load would be lost) */
    if (sl != NULL && sl->loading) {
      sl->rescan_owed = true;
      continue;
    }
    /* new, reappeared after removal, or changed since the last try */
    if (sl == NULL || slot_changed(s, sl)) {
      cn__repo_load_async(s, names[i], NULL);
      loads++;
    }
  }
  int m = atomic_load(&s->n_models);
  for (int i = 0; i < m; i++) {
    cn__model_slot *sl = &s->models[i];
    if (!sl->used) continue;
    bool present = false;
    for (int k = 0; k < n && !present; k++)
      present = strcmp(names[k], sl->name) == 0;
    if (present || sl->loading) continue;
    sl->queued = false;
    pthread_mutex_lock(&sl->vmu);
    bool has = sl->cur != NULL;
    pthread_mutex_unlock(&sl->vmu);
    /* gone: whatever appears under the name later is new */
    memset(sl->tried, 0, sizeof(sl->tried));
    if (has) {
      cn__repo_unload(s, sl);
      unloads++;
    }
    /* no version and no directory: the slot is free for another name */
    cn__repo_slot_free(s, sl);
  }
  if (loads + unloads > 0 || strcmp(why, "poll") != 0)
    CN_LOG(CN_LOG_INFO, "msg=rescan why=%s directories=%d loads=%d "
           "unloads=%d", why, n, loads, unloads);
  for (int i = 0; i < n_bad && strcmp(why, "poll") != 0; i++)
    cn__dirs_log_unservable(&bad[i]);
  cn__dirs_free_unservable(bad, n_bad);
  cn__dirs_free_names(names, n);
  if (reload) {
    s->reload_notify = true;
    if (s->loads_pending == 0) {
      s->reload_notify = false;
      cn__notify("READY=1\nSTATUS=serving");
    }
  }
}

static bool host_is_loopback(const char *host) {
  struct in_addr a4;
  struct in6_addr a6;
  if (inet_pton(AF_INET, host, &a4) == 1)
    return (ntohl(a4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, host, &a6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&a6) ||
           (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
  return strcmp(host, "localhost") == 0;
}

void cn__repo_guard_init(cn__server *s) {
  const cn_serve_config *sc = &s->cfg.serve;
  bool token = sc->repository_token[0] != '\0';
  bool loop = host_is_loopback(sc->host);
  s->repo_open = token || loop || sc->repository_insecure;
  if (strcmp(sc->model_control, "none") == 0) return;
  if (token)
    CN_LOG(CN_LOG_INFO, "msg=repository-routes state=token");
  else if (loop)
    CN_LOG(CN_LOG_INFO, "msg=repository-routes state=loopback host=%s",
           sc->host);
  else if (sc->repository_insecure)
    CN_LOG(CN_LOG_WARN, "msg=repository-routes state=insecure host=%s "
           "reason=\"repository-insecure: anyone who reaches the port may "
           "load and unload models\"", sc->host);
  else
    CN_LOG(CN_LOG_WARN, "msg=repository-routes state=refused host=%s "
           "reason=\"no repository-token on a non-loopback host: load and "
           "unload answer 403 (set repository-token, or "
           "repository-insecure true)\"", sc->host);
}
