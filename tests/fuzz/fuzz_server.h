/* fuzz_server.h - the in-memory daemon of the targets that feed a
 * connection bytes (fuzz_http.c, fuzz_grpc.c): the server's state with one
 * small treelstm loaded, small body limits, explicit model control, no
 * socket, no loop running and no worker thread; every request waits until
 * the target answers it (hand_over). */
#ifndef CANOPY_FUZZ_SERVER_H
#define CANOPY_FUZZ_SERVER_H

#include "fuzz_common.h"
#include "handlers.h"
#include "routes.h"

/* Makes srv that daemon, hand_over receiving the requests that would go
 * to a worker. */
static inline void fuzz_server_setup(cn__server *srv,
                                     void (*hand_over)(cn__server *,
                                                       cn__req *)) {
  cn_config_defaults(&srv->cfg);
  char models[600];
  snprintf(models, sizeof(models), "%s/models", fuzz_tmpdir());
  char dir[700];
  snprintf(dir, sizeof(dir), "%s/treelstm", models);
  fuzz_small_model("treelstm", dir, NULL, NULL);
  snprintf(srv->cfg.serve.models_dir, sizeof(srv->cfg.serve.models_dir),
           "%s", models);
  srv->cfg.serve.max_body_bytes = 4096;
  srv->cfg.serve.grpc_max_message_bytes = 4096;
  /* the repository routes answer (load waits, as an inference does) */
  snprintf(srv->cfg.serve.model_control,
           sizeof(srv->cfg.serve.model_control), "explicit");
  srv->cfg.serve.retrain_interval_s = 0;
  srv->cfg.serve.warmup = false; /* no worker threads run here to warm it */
  snprintf(srv->cfg.serve.policy_cache, sizeof(srv->cfg.serve.policy_cache),
           "%s/policies", fuzz_tmpdir());
  setenv("CANOPY_POLICY_CACHE", srv->cfg.serve.policy_cache, 1);
  cn__log_level = -1; /* quiet */
  pthread_mutex_init(&srv->qmu, NULL);
  pthread_mutex_init(&srv->dmu, NULL);
  pthread_mutex_init(&srv->lmu, NULL);
  srv->n_threads = 1;
  srv->hand_over = hand_over;
  srv->http = &cn__http_handlers;
  cn__http1_attach(srv);
  const char **names = calloc(CN__MAX_MODELS + 1, sizeof(char *));
  srv->models = calloc(CN__MAX_MODELS, sizeof(cn__model_slot));
  CHECK(names && srv->models);
  CHECK(cn__metrics_init(&srv->metrics, CN__MAX_MODELS, names) == 0);
  CHECK(uv_loop_init(&srv->loop) == 0);
  cn_err e;
  cn_err_clear(&e);
  CHECK(cn__repo_load_all(srv, &e) == 0);
  cn__repo_guard_init(srv);
}

#endif
