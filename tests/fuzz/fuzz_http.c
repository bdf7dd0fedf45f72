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
#include "fuzz_server.h"

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

static void setup(void) { fuzz_server_setup(&srv, keep_waiting); }

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
