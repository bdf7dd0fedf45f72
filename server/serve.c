/* serve.c - `canopy serve`: configuration, models, the loop, and drain.
 *
 * Start-up is all or nothing: every model under models-dir must load (a
 * model is served whole or not at all, and a daemon missing a model a load
 * balancer expects is worse than one that refuses to start), every worker
 * must open its backend, the port must bind; otherwise exit 1 with the
 * reason. Then the loop runs until SIGTERM/SIGINT, and drain: /readyz
 * turns 503, the listening socket closes, waiting requests finish, and the
 * process exits 0 once nothing is in flight or drain-grace-ms has passed.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends.h"
#include "flags.h"
#include "notify.h"
#include "routes.h"
#include "serve.h"
#include "handlers.h"

static void serve_usage(FILE *f) {
  fprintf(f,
          "usage: canopy serve [--models-dir DIR] [--port P] [options]\n"
          "\n"
          "Serves every subdirectory of DIR that holds a model.json under "
          "its directory\nname, over HTTP/1.1. Every option is also a config-file "
          "key (--config FILE)\nand an environment variable CANOPY_KEY; flags "
          "win over the environment, which\nwins over the file.\n\n"
          "  The HTTP API:            docs/api.md\n"
          "  Model directories:       docs/models.md (families, tensor names, "
          "model.json)\n"
          "  Keys, drain, metrics:    docs/daemon.md\n\n"
          "  --print-config                print the effective configuration "
          "(defaults < file <\n"
          "                                environment < flags) as a config "
          "file, each value\n"
          "                                with its source, and exit\n"
          "  --print-sample-config         print the self-documenting config "
          "file of every key\n"
          "                                at its default "
          "(config/canopy.conf)\n\ndaemon:\n");
  cn_config_usage_group(f, "serve");
  fprintf(f, "input limits:\n");
  cn_config_usage_group(f, "limits");
}

/* defaults < config file < CANOPY_* < flags. The file is named by
 * --config or CANOPY_CONFIG, so it is found before the rest is applied. */
static int parse_config(int argc, char **argv, cn_config *c) {
  cn_err err;
  cn_err_clear(&err);
  cn_config_defaults(c);
  const char *file = getenv("CANOPY_CONFIG");
  cn_config_flags seen;
  memset(&seen, 0, sizeof(seen));
  int config_flags = 0;
  bool print = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      serve_usage(stdout);
      return 1;
    }
    if (strcmp(argv[i], "--print-sample-config") == 0) {
      cn_config_write_sample(stdout);
      return 1;
    }
    if (strcmp(argv[i], "--print-config") == 0) {
      print = true;
      continue;
    }
    const char *v;
    int m = cn__flag_value(argc, argv, &i, "--config", &v);
    if (m < 0) return -1;
    if (m > 0 && ++config_flags > 1) {
      fprintf(stderr, "canopy serve: option --config is given twice (set "
              "each key once)\n");
      return -1;
    }
    if (m > 0) file = v;
  }
  if (file != NULL && file[0] != '\0') {
    snprintf(c->serve.config, sizeof(c->serve.config), "%s", file);
    cn_config_mark(c, "config", config_flags ? CN_CFG_FROM_FLAG
                                              : CN_CFG_FROM_ENV);
    if (cn_config_load_file(c, file, &err) != 0) goto bad;
    /* a `config` line in the file names no other file */
    snprintf(c->serve.config, sizeof(c->serve.config), "%s", file);
  }
  if (cn_config_from_env(c, &err) != 0) goto bad;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--print-config") == 0) continue;
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "canopy serve: unexpected argument '%s'\n", a);
      return -1;
    }
    char name[64];
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    if (len >= sizeof(name)) len = sizeof(name) - 1;
    memcpy(name, a + 2, len);
    name[len] = '\0';
    if (cn_config_find(name) == NULL && cn_config_removed(name) != NULL) {
      fprintf(stderr, "canopy serve: option '%s' was removed: %s\n", a,
              cn_config_removed(name));
      return -1;
    }
    if (cn_config_find(name) == NULL) {
      fprintf(stderr, "canopy serve: unknown option '%s' (see --help)\n", a);
      return -1;
    }
    const char *v;
    char flag[80];
    snprintf(flag, sizeof(flag), "--%s", name);
    if (cn__flag_value(argc, argv, &i, flag, &v) < 0) return -1;
    if (strcmp(name, "config") == 0) continue;
    if (cn_config_set_flag(c, &seen, name, v, &err) != 0) goto bad;
  }
  if (c->serve.max_body_memory < c->serve.max_body_bytes) {
    cn_err_set(&err, CN_E_BAD_CONFIG, "max-body-memory (%d) is less than "
               "max-body-bytes (%d): a body of the largest size could never "
               "be held", c->serve.max_body_memory, c->serve.max_body_bytes);
    goto bad;
  }
  if (c->serve.max_answer_memory < c->serve.max_answer_bytes) {
    cn_err_set(&err, CN_E_BAD_CONFIG, "max-answer-memory (%d) is less than "
               "max-answer-bytes (%d): an answer of the largest size could "
               "never be held", c->serve.max_answer_memory,
               c->serve.max_answer_bytes);
    goto bad;
  }
  if (print) {
    cn_config_write_effective(stdout, c);
    return 1;
  }
  return 0;
bad:
  fprintf(stderr, "canopy serve: %s\n", err.msg);
  return -1;
}

enum { DRAIN_QUIET_MS = 250 };

static void drain_check(uv_timer_t *t) {
  cn__server *s = t->data;
  double waited_ms = (cn_now_s() - s->drain_started) * 1e3;
  if (waited_ms > s->cfg.serve.drain_grace_ms && s->waiting != NULL) {
    CN_LOG(CN_LOG_WARN, "msg=drain-grace-expired in_flight=%d",
           atomic_load(&s->in_flight));
    cn__window_fail_waiting(s, CN_E_DRAINING,
                             "the server shut down before the answer");
  }
  /* Done when nothing is in flight and no client is still talking: a
   * keep-alive client that read an answer sent before the drain began
   * sends its next request a moment later, and that request gets 503
   * draining with Connection: close instead of a closed socket. Clients
   * that hold idle connections open (a proxy's pool) are not waited for
   * beyond DRAIN_QUIET_MS without a request. Past the grace, stop anyway
   * (answered requests get a moment to be written out). */
  double quiet_ms =
      cn_now_s() * 1e3 - (double)atomic_load(&s->last_request_us) / 1e3;
  bool idle = atomic_load(&s->open_conns) == 0 || quiet_ms >= DRAIN_QUIET_MS;
  bool done = (atomic_load(&s->in_flight) == 0 && idle) ||
              waited_ms > s->cfg.serve.drain_grace_ms + 1000;
  /* a body being parsed on the threadpool (bigparse.c) uses the model:
   * wait for it, past the grace too (one parse is bounded, ~1 s) */
  if (s->parsing > 0 || s->phead != NULL || s->mhead != NULL) done = false;
  if (!done) return;
  CN_LOG(CN_LOG_INFO, "msg=drained ms=%.1f open_connections=%d", waited_ms,
         atomic_load(&s->open_conns));
  uv_stop(&s->loop);
}

static void on_signal(uv_signal_t *h, int signum) {
  cn__server *s = h->data;
  if (atomic_exchange(&s->draining, 1)) return;
  CN_LOG(CN_LOG_INFO, "msg=draining signal=%d in_flight=%d grace_ms=%d",
         signum, atomic_load(&s->in_flight), s->cfg.serve.drain_grace_ms);
  s->drain_started = cn_now_s();
  cn__notify("STOPPING=1\nSTATUS=draining");
  cn__http_quiesce(s);
  cn__retrainer_signal_stop(s);
  uv_timer_start(&s->drain_timer, drain_check, 0, 10);
}

/* Once a second: when the load has passed (nothing in flight, queued or
 * computing) and requests were served since the last look, the free
 * memory of every malloc arena goes back to the system. Without it RSS
 * stayed at its peak after a burst (15 -> 173 -> 157 MB, 3 s after). It
 * runs on the loop, after the answers (written by the workers, freed here
 * once sent) are gone, and only when idle, so it costs no request. */
static void on_trim_timer(uv_timer_t *t) {
  cn__server *s = t->data;
  long long served = atomic_load(&s->requests_seen);
  if (served == s->trimmed_at || atomic_load(&s->in_flight) != 0) return;
  if (!cn__jobs_idle(s)) return;
  cn__malloc_trim();
  s->trimmed_at = served;
}

/* malloc_trim gives back the free pages in every arena's bins, but not
 * the top chunk of a thread's arena (glibc shrinks those only from free(),
 * once the top exceeds M_TRIM_THRESHOLD). glibc's default thresholds move:
 * each freed mmapped block (a worker's run arena, a big answer) raises
 * the mmap threshold to its size and the trim threshold to twice that, up
 * to 32 and 64 MiB, so after a few runs the workers' arenas kept tens of
 * MB of top chunk for good (measured: 12.9 MB idle, 55-66 MB after bursts,
 * glibc's malloc_stats: 49 MB of arena, 0.1 MB in use; malloc_trim from
 * gdb: no change). Fixed thresholds: a block over 1 MiB is its own
 * mapping, unmapped when freed (cpu.c keeps its run arenas itself, so
 * runs still reuse them); a thread arena's top over 1 MiB is shrunk when
 * it grows past it. GLIBC_TUNABLES' malloc thresholds, if set, win
 * (cn_malloc_thresholds). */
#define CN__MALLOC_THRESHOLD (1 << 20)

/* SIGHUP: a service manager's `reload`, or the terminal closing (its
 * default action would kill the daemon with no drain and no log line).
 * With model-control explicit or poll it rescans models-dir: new
 * directories load, changed ones reload, removed ones unload; with none
 * it is logged and ignored. */
static void on_sighup(uv_signal_t *h, int signum) {
  cn__server *s = h->data;
  if (atomic_load(&s->draining)) return;
  if (strcmp(s->cfg.serve.model_control, "none") == 0) {
    CN_LOG(CN_LOG_WARN, "msg=sighup action=ignored reason=\"model-control "
           "none: models load at start-up only\"");
    return;
  }
  cn__repo_rescan(s, "sighup");
}

static void on_poll_timer(uv_timer_t *t) {
  cn__server *s = t->data;
  if (!atomic_load(&s->draining)) cn__repo_rescan(s, "poll");
}

/* Closes every handle but the signal handles. Closing those would put
 * back SIGTERM's, SIGINT's and SIGHUP's default actions, and a signal
 * repeated by an operator or a service manager during the exit that
 * follows the drain (workers joined, models freed) would kill the daemon
 * (status -15 instead of 0). Left open but unreferenced, they keep
 * libuv's handler installed: a late signal is written to the loop's
 * signal pipe and never read. The loop is therefore not closed; it is
 * static, so nothing leaks. */
static void close_walk(uv_handle_t *h, void *arg) {
  if (h->type == UV_SIGNAL) {
    uv_unref(h);
    return;
  }
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

/* SIGHUP before the loop's handler exists (the configuration read,
 * models still loading) would kill the daemon with its default action:
 * ignored until then, from the first thing it does. SIGPIPE is ignored
 * by main() already; SIGUSR1 and SIGUSR2 have no meaning to the daemon
 * (docs/daemon.md): ignored, not fatal, so a stray `kill -USR1` (a log
 * rotator's habit) stops nothing. */
static void ignore_early_signals(void) {
  signal(SIGHUP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGUSR1, SIG_IGN);
  signal(SIGUSR2, SIG_IGN);
}

/* The server as it is before any start-up step. A start-up that fails
 * before the loop's handles exist (a model that fails to load, a backend
 * that cannot open) still drains the done queue at `stop`, through
 * done_async's data. */
static void server_reset(cn__server *s) {
  memset(s, 0, sizeof(*s));
  s->http = &cn__http_handlers; /* what the connections hand up */
  s->listen_fd = -1;
  s->done_async.data = s;
}

/* The configuration's settings that are not a start-up step: log level,
 * batching policy, layout. */
static void apply_settings(cn__server *s) {
  const cn_serve_config *sc = &s->cfg.serve;
  cn__log_level = cn__log_parse_level(sc->log_level);
  cn_policy_parse(sc->policy, &s->policy);
  cn_layout_parse(sc->layout, &s->layout);
}

/* The locks, condition variables and loop the threads share. */
static void init_sync(cn__server *s) {
  pthread_mutex_init(&s->qmu, NULL);
  pthread_cond_init(&s->qcv, NULL);
  pthread_cond_init(&s->wcv, NULL);
  pthread_mutex_init(&s->dmu, NULL);
  uv_loop_init(&s->loop);
  pthread_mutex_init(&s->lmu, NULL);
  pthread_cond_init(&s->lcv, NULL);
}

/* The model slots and the metrics over their names; -1 when out of
 * memory. */
static int alloc_models(cn__server *s) {
  const char **names = calloc(CN__MAX_MODELS + 1, sizeof(char *));
  s->models = calloc(CN__MAX_MODELS, sizeof(cn__model_slot));
  if (names == NULL || s->models == NULL ||
      cn__metrics_init(&s->metrics, CN__MAX_MODELS, names)) {
    free(names);
    return -1;
  }
  s->metrics.memory_budget = (uint64_t)s->cfg.serve.memory_budget;
  return 0;
}

/* BLAS threads per worker: blas-threads, or the cores of the affinity
 * mask (taskset, cpusets) shared among the workers; at least 1. */
static int blas_threads(const cn_serve_config *sc) {
  int cores = cn__cpu_count();
  int blas = sc->blas_threads > 0 ? sc->blas_threads : cores / sc->workers;
  return blas < 1 ? 1 : blas;
}

/* The loop's handles: loaded models, model polling, finished runs,
 * drain, memory trim, and the signals. */
static void init_loop_handles(cn__server *s) {
  const cn_serve_config *sc = &s->cfg.serve;
  uv_async_init(&s->loop, &s->load_async, cn__repo_on_loaded);
  s->load_async.data = s;
  uv_timer_init(&s->loop, &s->poll_timer);
  s->poll_timer.data = s;
  if (strcmp(sc->model_control, "poll") == 0)
    uv_timer_start(&s->poll_timer, on_poll_timer,
                   (uint64_t)sc->poll_interval_s * 1000,
                   (uint64_t)sc->poll_interval_s * 1000);
  uv_async_init(&s->loop, &s->done_async, cn__window_on_done);
  s->done_async.data = s;
  uv_timer_init(&s->loop, &s->drain_timer);
  s->drain_timer.data = s;
  uv_check_init(&s->loop, &s->idle_check);
  s->idle_check.data = s;
  uv_timer_init(&s->loop, &s->tmo_timer);
  s->tmo_timer.data = s;
  uv_check_init(&s->loop, &s->parse_check);
  s->parse_check.data = s;
  uv_timer_init(&s->loop, &s->trim_timer);
  s->trim_timer.data = s;
  uv_timer_start(&s->trim_timer, on_trim_timer, 1000, 1000);
  uv_unref((uv_handle_t *)&s->trim_timer);
  uv_signal_init(&s->loop, &s->sigterm);
  uv_signal_init(&s->loop, &s->sigint);
  uv_signal_init(&s->loop, &s->sighup);
  s->sigterm.data = s->sigint.data = s->sighup.data = s;
  uv_signal_start(&s->sigterm, on_signal, SIGTERM);
  uv_signal_start(&s->sigint, on_signal, SIGINT);
  uv_signal_start(&s->sighup, on_sighup, SIGHUP);
}

/* The log line that says the daemon serves, with what it serves with. */
static void log_ready(cn__server *s, int blas, double t_start) {
  const cn_serve_config *sc = &s->cfg.serve;
  CN_LOG(CN_LOG_INFO, "msg=ready models=%d workers=%d blas_threads=%d "
         "policy=%s max_delay_us=%d max_instances=%d queue_depth=%d "
         "startup_ms=%.1f",
         atomic_load(&s->n_models), sc->workers, blas,
         cn_policy_name(s->policy), sc->max_delay_us, sc->max_instances,
         sc->queue_depth, (cn_now_s() - t_start) * 1e3);
}

/* A memory budget under which a served model can run not even its
 * smallest instance would answer every request of it 413 (and one under
 * 64 bytes once divided by zero on the first request): refused at
 * start-up, naming the smallest budget that serves every model. The
 * floors are planned on a cpu context of this thread (plans only: under
 * such small budgets a device's larger scratch slice changes nothing). */
static int check_budget(cn__server *s, cn_err *err) {
  long long budget = s->cfg.serve.memory_budget, need = 0;
  char worst[CN__NAME_MAX] = "";
  if (budget <= 0) return 0;
  cn_backend_ctx *bk = NULL;
  int rc = cn_backend_open("cpu", 0, &bk, err);
  int n = atomic_load(&s->n_models);
  for (int i = 0; rc == 0 && i < n; i++) {
    cn__model_slot *sl = &s->models[i];
    if (!sl->used || sl->cur == NULL) continue;
    long long floor = 0;
    if ((rc = cn_run_min_budget(sl->cur->model, bk, s->policy, s->layout,
                                s->cfg.serve.plan_width, &floor, err)) != 0)
      break;
    if (floor > need) {
      need = floor;
      snprintf(worst, sizeof(worst), "%s", sl->name);
    }
  }
  cn_backend_close(bk);
  if (rc != 0) return rc;
  if (budget >= need) return 0;
  return cn_err_set(err, CN_E_BAD_CONFIG, "memory-budget %lld bytes is too "
                    "small: model %.60s cannot run even its smallest "
                    "instance under %lld bytes (every request would be "
                    "refused); set memory-budget to at least %lld, or 0 for "
                    "no budget", budget, worst, need, need);
}

/* After the loop (or a failed start-up once the metrics exist): fail
 * what still waits, close the handles, join the threads, answer the
 * runs finished after the loop, free the metrics. */
static void server_stop(cn__server *s) {
  cn__window_fail_waiting(s, CN_E_DRAINING, "the server shut down");
  cn__http_close_handles(s);
  uv_walk(&s->loop, close_walk, NULL);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  cn__retrainer_join(s);
  cn__workers_stop(s);
  cn__repo_loads_join(s); /* loads the drain did not wait for */
  cn__window_on_done(&s->done_async); /* runs finished after the loop */
  free((void *)s->metrics.model_names);
  cn__metrics_free(&s->metrics);
}

/* The socket, the loop (unless its signal handles stay: close_walk) and
 * the models. */
static void server_free(cn__server *s) {
  cn__http_unbind(s);
  if (!uv_is_active((uv_handle_t *)&s->sigterm)) uv_loop_close(&s->loop);
  if (s->models != NULL) cn__repo_free_all(s);
  free(s->models);
  cn__readers_free(s);
}

/* `canopy serve`: start-up all or nothing (file comment), the loop until
 * SIGTERM/SIGINT, then drain. Exit status 0 after a drain, 1 when
 * start-up failed. */
int cn_cmd_serve(int argc, char **argv) {
  static cn__server srv; /* static: signal handles point into it */
  cn__server *s = &srv;
  ignore_early_signals();
  int status = 1, rc;
  cn_err err;
  cn_err_clear(&err);
  server_reset(s);
  double t_start = cn_now_s();
  rc = parse_config(argc, argv, &s->cfg);
  if (rc != 0) return rc > 0 ? 0 : 1;
  cn_malloc_thresholds(CN__MALLOC_THRESHOLD); /* before the models load and threads start */
  const cn_serve_config *sc = &s->cfg.serve;
  apply_settings(s);
  init_sync(s);
  if (alloc_models(s) != 0) goto out;
  if (cn__http_bind(s, &err) != 0) {
    fprintf(stderr, "canopy serve: %s\n", err.msg);
    goto out;
  }
  int blas = blas_threads(sc);
  cn_backend_cpu_threads(blas);
  /* the workers first: each version warms up on every one of them
   * before it is installed (warmup.c) */
  if (cn__workers_start(s, &err) != 0) {
    fprintf(stderr, "canopy serve: backend %s: %s\n", sc->backend, err.msg);
    goto stop;
  }
  if (cn__repo_load_all(s, &err) != 0) {
    fprintf(stderr, "canopy serve: %s\n", err.msg);
    goto stop;
  }
  if (check_budget(s, &err) != 0) {
    fprintf(stderr, "canopy serve: %s\n", err.msg);
    goto stop;
  }
  cn__repo_guard_init(s);
  s->metrics.start_time = (double)time(NULL);
  cn__retrainer_start(s); /* failure to start only loses retraining */
  init_loop_handles(s);
  if (cn__http_start(s, &err) != 0) {
    fprintf(stderr, "canopy serve: %s\n", err.msg);
    goto stop;
  }
  log_ready(s, blas, t_start);
  cn__notify("READY=1\nSTATUS=serving"); /* systemd Type=notify */
  s->loop_thread = pthread_self();
  s->loop_cpu0 = cn_thread_cpu_s();
  uv_run(&s->loop, UV_RUN_DEFAULT);
  status = 0;
stop:
  server_stop(s);
out:
  server_free(s);
  return status;
}
