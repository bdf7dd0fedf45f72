/* fuzz_http.c - libFuzzer target for the daemon's HTTP front end: the
 * connection parser and request handling the daemon runs (server/conn.c,
 * server/http.c, routes, the infer body parser), driven in memory with no
 * socket and no loop running.
 *
 * The first byte seeds the choices; the rest is the client's bytes, fed
 * in chunks of 1 to 64 bytes. Between chunks a request that waits for
 * its run may be answered (200, 429 or 504), the deadlines may pass, or
 * the client may hang up. One treelstm model is served.
 *
 * Checked on every answer (each is one write): a status line; an
 * X-Request-Id; a Content-Length equal to the body (or no body: HEAD);
 * a JSON error body of docs/api.md for every status >= 400 (/v1's or the
 * Open Inference Protocol's); nothing after
 * an answer with Connection: close. After each input no request is left
 * in flight and no connection open. */
#include "fuzz_common.h"
#include "routes.h"
#include "handlers.h"

#include <jansson.h>
#include <strings.h>

static cn__server srv;
static cn__req *pending;

typedef struct sink_state {
  bool closed;  /* an answer said Connection: close */
  int answers;
} sink_state;

static void check_answer(void *ud, const char *d, size_t n) {
  sink_state *st = ud;
  CHECK(!st->closed);
  CHECK(n > 12 && memcmp(d, "HTTP/1.1 ", 9) == 0);
  int status = atoi(d + 9);
  CHECK(status >= 100 && status <= 599);
  const char *end = memmem(d, n, "\r\n\r\n", 4);
  CHECK(end != NULL);
  size_t hl = (size_t)(end - d) + 4;
  if (status == 100) {
    CHECK(hl == n);
    return;
  }
  st->answers++;
  char *head = strndup(d, hl);
  CHECK(strstr(head, "\r\nX-Request-Id: ") != NULL);
  const char *cl = strstr(head, "\r\nContent-Length: ");
  CHECK(cl != NULL);
  size_t blen = strtoul(cl + 18, NULL, 10);
  CHECK(n == hl || n == hl + blen); /* HEAD: no body */
  if ((status == 429 || status == 503)) CHECK(strstr(head, "\r\nRetry-After: "));
  if (strstr(head, "\r\nConnection: close\r\n") != NULL) st->closed = true;
  if (status >= 400 && n > hl) {
    json_t *j = json_loadb(d + hl, n - hl, 0, NULL);
    CHECK(j != NULL);
    /* /v1's {"error": {"code", "message"}}, or under /v2 the Open
     * Inference Protocol's {"error": message} */
    json_t *err = json_object_get(j, "error");
    CHECK(json_is_string(err) ||
          json_is_string(json_object_get(err, "code")));
    json_decref(j);
  }
  free(head);
}

/* A request that would wait for its run: kept, answered between chunks. */
static void keep_waiting(cn__server *s, cn__req *r) {
  CHECK(pending == NULL); /* one request at a time per connection */
  atomic_fetch_add(&r->refs, 1);
  pending = r;
}

static void answer_pending(unsigned how) {
  if (pending == NULL) return;
  static const int st[] = {200, 429, 504};
  int status = st[how % 3];
  char *body = status == 200 ? strdup("{\"outputs\":[]}")
                             : cn__error_body(status == 429 ? CN_E_OVERLOADED
                                                            : CN_E_TIMEOUT,
                                              "fuzz", -1);
  /* the answer may let the connection parse the next pipelined request,
   * which may wait in turn: pending is free before it is given */
  cn__req *r = pending;
  pending = NULL;
  if (status == 200) { /* as a worker leaves it: compressed if asked */
    r->result = body;
    r->result_status = 200;
    cn__answer_compress(r);
    cn__req_answer_result(r); /* no-op if answered */
  } else {
    cn__req_answer(r, status, body, NULL); /* no-op if answered */
  }
  cn__req_unref(r);
}

static void setup(void) {
  cn_config_defaults(&srv.cfg);
  char models[600];
  snprintf(models, sizeof(models), "%s/models", fuzz_tmpdir());
  char dir[700];
  snprintf(dir, sizeof(dir), "%s/treelstm", models);
  cn_model_init_opts o = {.family = "treelstm", .dir = dir, .hidden = 4,
                          .embed = 4, .classes = 3, .seed = 1};
  cn_err e;
  cn_err_clear(&e);
  CHECK(cn_model_init(&o, &e) == 0);
  snprintf(srv.cfg.serve.models_dir, sizeof(srv.cfg.serve.models_dir), "%s",
           models);
  srv.cfg.serve.max_body_bytes = 4096;
  /* the repository routes answer (load waits, as an inference does) */
  snprintf(srv.cfg.serve.model_control, sizeof(srv.cfg.serve.model_control),
           "explicit");
  srv.cfg.serve.retrain_interval_s = 0;
  srv.cfg.serve.warmup = false; /* no worker threads run here to warm it */
  snprintf(srv.cfg.serve.policy_cache, sizeof(srv.cfg.serve.policy_cache),
           "%s/policies", fuzz_tmpdir());
  setenv("CANOPY_POLICY_CACHE", srv.cfg.serve.policy_cache, 1);
  cn__log_level = -1; /* quiet */
  pthread_mutex_init(&srv.qmu, NULL);
  pthread_mutex_init(&srv.dmu, NULL);
  pthread_mutex_init(&srv.lmu, NULL);
  srv.n_threads = 1;
  srv.hand_over = keep_waiting;
  srv.http = &cn__http_handlers;
  cn__http1_attach(&srv);
  const char **names = calloc(CN__MAX_MODELS + 1, sizeof(char *));
  srv.models = calloc(CN__MAX_MODELS, sizeof(cn__model_slot));
  CHECK(names && srv.models);
  CHECK(cn__metrics_init(&srv.metrics, CN__MAX_MODELS, names) == 0);
  CHECK(uv_loop_init(&srv.loop) == 0);
  CHECK(cn__repo_load_all(&srv, &e) == 0);
  cn__repo_guard_init(&srv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (srv.models == NULL) setup();
  if (size == 0) return 0;
  unsigned x = data[0] * 2654435761u + 1;
  data++, size--;
  sink_state st = {0};
  cn__conn *c = cn__conn_new_mem(&srv, check_answer, &st);
  CHECK(c != NULL);
  size_t off = 0;
  while (off < size && !cn__conn_closed(c)) {
    x = x * 1103515245u + 12345u;
    size_t k = 1 + (x >> 16) % 64;
    if (k > size - off) k = size - off;
    cn__conn_feed(c, (const char *)data + off, k);
    off += k;
    switch ((x >> 8) % 16) {
      case 0: case 1: case 2: case 3:
        answer_pending(x >> 4);
        break;
      case 4:
        cn__conn_tick(c, cn_now_s() + 1e6); /* every deadline passed */
        break;
      default:
        break;
    }
  }
  if (x & 1) answer_pending(x >> 3);
  cn__conn_eof(c); /* the client hangs up: a waiting request is 499 */
  answer_pending(0);
  cn__conn_free_mem(c);
  CHECK(atomic_load(&srv.in_flight) == 0);
  CHECK(atomic_load(&srv.open_conns) == 0);
  return 0;
}
