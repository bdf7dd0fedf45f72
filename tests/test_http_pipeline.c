/* test_http_pipeline.c - pipelined requests over real sockets on a free
 * port (server/conn.c, conn_parse.c): answered in order with their own
 * ids, and across a SIGTERM every request that had fully arrived answered,
 * also past the 64 KiB read-ahead; a request cut short is dropped. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "http_test_util.h"
#include "serve_harness.h"

/* Waits for the daemon, told to stop, to exit, and expects status 0. */
static void expect_exit_0(void) {
  int status;
  waitpid(ht_d.pid, &status, 0);
  ht_d.pid = 0;
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "exit status %d", status);
}

/* Pipelined requests in one write are answered in order, each with its
 * own X-Request-Id, an inference waiting for its run among them. */
Test(http, pipelined_requests_answered_in_order, .fini = ht_teardown,
     .timeout = 30) {
  th_models(&ht_d, ht_tree_only);
  th_start(&ht_d, NULL);
  char req[4096];
  snprintf(req, sizeof(req),
           "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: p-1\r\n\r\n"
           "POST %s HTTP/1.1\r\nHost: x\r\nX-Request-Id: p-2\r\nContent-Length: %zu\r\n"
           "\r\n%s"
           "GET /v1/models/nope HTTP/1.1\r\nHost: x\r\nX-Request-Id: p-3\r\n\r\n"
           "POST %s HTTP/1.1\r\nHost: x\r\nX-Request-Id: p-4\r\nContent-Length: %zu\r\n"
           "\r\n%s"
           "HEAD /readyz HTTP/1.1\r\nHost: x\r\nX-Request-Id: p-5\r\n\r\n"
           "GET /readyz HTTP/1.1\r\nHost: x\r\nX-Request-Id: p-6\r\n"
           "Connection: close\r\n\r\n",
           HT_INFER, strlen(HT_ONE), HT_ONE, HT_INFER, strlen(HT_ONE), HT_ONE);
  int fd = th_connect(ht_d.port);
  send_str(fd, req);
  size_t n;
  char *all = read_all(fd, &n);
  close(fd);
  cr_expect_eq(count_of(all, n, "HTTP/1.1 "), 6, "%s", all);
  static const char *ids[] = {"p-1", "p-2", "p-3", "p-4", "p-5", "p-6"};
  static const int st[] = {200, 200, 404, 200, 200, 200};
  const char *p = all;
  for (int i = 0; i < 6; i++) {
    p = strstr(p, "HTTP/1.1 ");
    cr_assert_not_null(p, "answer %d missing", i);
    int s = 0;
    sscanf(p, "HTTP/1.1 %d", &s);
    cr_expect_eq(s, st[i], "answer %d: %.200s", i, p);
    char want[64];
    snprintf(want, sizeof(want), "X-Request-Id: %s\r\n", ids[i]);
    const char *end = strstr(p, "\r\n\r\n");
    cr_assert_not_null(end);
    cr_expect(memmem(p, (size_t)(end - p) + 2, want, strlen(want)) != NULL,
              "answer %d is not %s: %.200s", i, ids[i], p);
    p = end;
  }
  free(all);
  cr_expect_eq(th_stop(&ht_d), 0);
}

/* One answer taken off the front of buf[*off, n): its status, whether it
 * says Connection: close, its X-Request-Id and its JSON error code (empty
 * if none). false when no whole answer is there (a head without its blank
 * line, or a body shorter than its Content-Length). */
typedef struct answer {
  int status;
  bool close;
  char id[64];
  char code[32];
} answer;

static bool next_answer(const char *buf, size_t n, size_t *off, answer *a) {
  const char *p = buf + *off;
  size_t left = n - *off;
  const char *end = memmem(p, left, "\r\n\r\n", 4);
  char head[4096];
  size_t hl = end ? (size_t)(end - p) + 4 : 0;
  if (end == NULL || hl >= sizeof(head)) return false;
  memcpy(head, p, hl);
  head[hl] = '\0';
  memset(a, 0, sizeof(*a));
  const char *cl = strcasestr(head, "\r\nContent-Length: ");
  if (sscanf(head, "HTTP/1.1 %d", &a->status) != 1 || cl == NULL)
    return false;
  size_t blen = strtoul(cl + 18, NULL, 10);
  if (left < hl + blen) return false;
  a->close = strcasestr(head, "\r\nConnection: close\r\n") != NULL;
  const char *id = strcasestr(head, "\r\nX-Request-Id: ");
  if (id != NULL) sscanf(id + 16, "%63[^\r]", a->id);
  json_t *j = json_loadb(p + hl, blen, 0, NULL);
  json_t *e = json_object_get(json_object_get(j, "error"), "code");
  if (json_is_string(e))
    snprintf(a->code, sizeof(a->code), "%s", json_string_value(e));
  json_decref(j);
  *off += hl + blen;
  return true;
}

/* n requests pipelined in one send, then SIGTERM while the first
 * waits in its model's 2 s window. Every request had fully arrived, so
 * every one is answered, in order: the first 200 (its run still happens),
 * the inferences behind it 503 draining (parsed after the drain began:
 * docs/daemon.md), the model's metadata 200; only the last answer says
 * Connection: close, the connection closes after it, and the daemon exits
 * 0. If the first answer closed the connection, the rest would never be
 * answered. With `partial`, a last request cut short follows
 * them and gets no answer. The first request is seen in flight (the
 * canopy_in_flight_requests gauge) before the signal, so the test does not
 * race its window. */
/* The first request's window: the span in which the test must send
 * SIGTERM once it has seen the request waiting (a hundred times what it
 * takes); the window is what ends the drain (its grace is longer). */
#define WINDOW_US "10000000"
static void pipelined_at_sigterm(int n, bool partial) {
  th_models(&ht_d, ht_tree_only);
  const char *flags[] = {"--max-delay-us", WINDOW_US, "--work-conserving",
                         "false", "--drain-grace-ms", "60000", NULL};
  th_start(&ht_d, flags);
  char req[8192];
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    if (i == 2)
      len += (size_t)snprintf(req + len, sizeof(req) - len,
                              "GET /v1/models/treelstm HTTP/1.1\r\nHost: x\r\n"
                              "X-Request-Id: q-%d\r\n\r\n", i + 1);
    else
      len += (size_t)snprintf(req + len, sizeof(req) - len,
                              "POST %s HTTP/1.1\r\nHost: x\r\nX-Request-Id: q-%d\r\n"
                              "Content-Length: %zu\r\n\r\n%s",
                              HT_INFER, i + 1, strlen(HT_ONE), HT_ONE);
  }
  if (partial) /* a request the client had not finished: not answered */
    len += (size_t)snprintf(req + len, sizeof(req) - len,
                            "POST %s HTTP/1.1\r\nHost: x\r\nX-Request-Id: q-cut\r\n"
                            "Content-Length: 100\r\n\r\n{", HT_INFER);
  int fd = th_connect(ht_d.port);
  cr_assert(fd >= 0);
  cr_assert_eq(send(fd, req, len, MSG_NOSIGNAL), (ssize_t)len);
  /* in flight: the first request and the /metrics request asking */
  cr_assert_eq(th_metric_wait(ht_d.port, "canopy_in_flight_requests", 2), 2,
               "the first request is not waiting in its window");
  kill(ht_d.pid, SIGTERM);
  size_t got;
  char *all = read_all(fd, &got); /* until the daemon closes */
  close(fd);
  size_t off = 0;
  int k = 0;
  answer a;
  for (; k < n && next_answer(all, got, &off, &a); k++) {
    char want[16];
    snprintf(want, sizeof(want), "q-%d", k + 1);
    cr_expect_str_eq(a.id, want, "answer %d out of order", k + 1);
    int st = k == 0 || k == 2 ? 200 : 503;
    cr_expect_eq(a.status, st, "answer %d: %d %s", k + 1, a.status, a.code);
    if (st == 503) cr_expect_str_eq(a.code, "draining");
    /* with a request cut short behind them, no answer closes: the client
     * may still be sending it; the connection closes when it goes quiet */
    cr_expect_eq(a.close, k == n - 1 && !partial, "answer %d of %d: "
                 "Connection: close %s", k + 1, n,
                 a.close ? "too early" : "missing");
  }
  cr_expect_eq(k, n, "%d of %d pipelined requests answered: %.400s", k, n,
               all);
  cr_expect_eq(off, got, "bytes after the last answer: %.200s", all + off);
  free(all);
  expect_exit_0();
}

Test(http, two_pipelined_requests_answered_at_sigterm, .fini = ht_teardown,
     .timeout = 60) {
  pipelined_at_sigterm(2, false);
}

Test(http, three_pipelined_requests_answered_at_sigterm, .fini = ht_teardown,
     .timeout = 60) {
  pipelined_at_sigterm(3, false);
}

/* A request cut short (its client goes quiet) gets no answer: the
 * connection is read on for DRAIN_QUIET_S after the answer before it (no
 * Connection: close, as the rest may come), then closed. */
Test(http, pipelined_request_cut_short_at_sigterm_is_dropped,
     .fini = ht_teardown, .timeout = 60) {
  pipelined_at_sigterm(2, true);
}

/* Two pipelined requests of ~40 KB each in one
 * write (78 KB, more than the 64 KiB read-ahead) on a keep-alive
 * connection, after SIGTERM. The first is answered 503 draining at once,
 * while the read-ahead holds only part of the second; the connection is
 * read on and the second is answered too, with Connection: close. Before
 * the fix the first answer closed the connection. A request waiting in
 * its model's 2 s window on another connection keeps the drain going. */
static char *padded_infer(const char *id, size_t pad) {
  size_t blen = strlen(HT_ONE) + pad;
  char *b = malloc(blen + 512);
  int h = snprintf(b, 512, "POST %s HTTP/1.1\r\nHost: x\r\nX-Request-Id: %s\r\n"
                   "Content-Length: %zu\r\n\r\n%s", HT_INFER, id, blen, HT_ONE);
  memset(b + h, ' ', pad); /* JSON whitespace */
  b[h + pad] = '\0';
  return b;
}

Test(http, pipelined_past_the_read_ahead_answered_at_sigterm,
     .fini = ht_teardown, .timeout = 60) {
  th_models(&ht_d, ht_tree_only);
  const char *flags[] = {"--max-delay-us", WINDOW_US, "--work-conserving",
                         "false", "--drain-grace-ms", "60000", NULL};
  th_start(&ht_d, flags);
  int waiter = th_connect(ht_d.port), fd = th_connect(ht_d.port);
  cr_assert(waiter >= 0 && fd >= 0);
  th_send(waiter, "POST", HT_INFER, HT_ONE, NULL);
  cr_assert_eq(th_metric_wait(ht_d.port, "canopy_in_flight_requests", 2), 2,
               "the first request is not waiting in its window");
  kill(ht_d.pid, SIGTERM);
  th_log_wait(&ht_d, "msg=draining", 1);
  char *b = padded_infer("big-1", 39000), *c = padded_infer("big-2", 39000);
  size_t lb = strlen(b), lc = strlen(c);
  char *both = malloc(lb + lc);
  memcpy(both, b, lb);
  memcpy(both + lb, c, lc);
  cr_assert_gt(lb + lc, 65536);
  cr_assert_eq(send(fd, both, lb + lc, MSG_NOSIGNAL), (ssize_t)(lb + lc));
  size_t got;
  char *all = read_all(fd, &got);
  size_t off = 0;
  answer a;
  int k = 0;
  for (; k < 2 && next_answer(all, got, &off, &a); k++) {
    char want[16];
    snprintf(want, sizeof(want), "big-%d", k + 1);
    cr_expect_str_eq(a.id, want);
    cr_expect_eq(a.status, 503, "answer %d: %d %s", k + 1, a.status, a.code);
    cr_expect_str_eq(a.code, "draining");
    cr_expect_eq(a.close, k == 1, "answer %d: Connection: close %s", k + 1,
                 a.close ? "too early" : "missing");
  }
  cr_expect_eq(k, 2, "%d of 2 pipelined requests answered: %.300s", k, all);
  cr_expect_eq(off, got, "bytes after the last answer");
  free(all);
  free(both);
  free(b);
  free(c);
  close(fd);
  th_resp r;
  cr_expect_eq(th_read(waiter, &r), 0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  th_resp_free(&r);
  close(waiter);
  expect_exit_0();
}
