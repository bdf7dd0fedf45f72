/* test_serve_answers.c - max-answer-memory end to end (docs/daemon.md
 * "Answers held for clients"): clients that send big requests and never
 * read their answers hold at most max-answer-memory of answers, reserved
 * and written together, as the daemon's own gauges show; the requests
 * beyond it get 503 answer_memory_full with Retry-After at once, nothing
 * of them computed; a client that reads is served meanwhile; and once the
 * unread connections close their answers are given back. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve_harness.h"

static th_daemon d;
static const char *const tagger[] = {"bilstm-tagger", NULL};
static const char *INFER = "/v1/models/bilstm-tagger/infer";

static void teardown(void) { th_cleanup(&d); }

/* {"instances": [n sentences of t tokens], "return_hidden": true}:
 * return_hidden asks for 2 x hidden floats a token. */
static char *tagger_body(int n, int t) {
  size_t cap = 64 + (size_t)n * (32 + 6 * (size_t)t);
  char *b = malloc(cap), *p = b;
  p += sprintf(p, "{\"instances\": [");
  for (int i = 0; i < n; i++) {
    p += sprintf(p, "%s{\"tokens\": [", i ? ", " : "");
    for (int k = 0; k < t; k++) p += sprintf(p, "%s\"the\"", k ? "," : "");
    p += sprintf(p, "]}");
  }
  sprintf(p, "], \"return_hidden\": true}");
  return b;
}

/* A connection whose client reads nothing: its receive buffer as small
 * as the kernel allows, so that an answer stays in the daemon. */
static int unread_client(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  return fd;
}

typedef struct {
  double held, reserved, refused, ok, unavailable;
} answers;

static answers read_answers(int port) {
  th_resp r;
  cr_assert_eq(th_http(port, "GET", "/metrics", NULL, NULL, &r), 0);
  answers a = {
      th_metric(r.body, "canopy_answer_bytes"),
      th_metric(r.body, "canopy_answer_reserved_bytes"),
      th_metric(r.body, "canopy_requests_refused_answer_memory_total"),
      th_metric(r.body, "canopy_requests_total{model=\"bilstm-tagger\","
                        "status=\"200\"}"),
      th_metric(r.body, "canopy_requests_total{model=\"bilstm-tagger\","
                        "status=\"503\"}")};
  th_resp_free(&r);
  return a;
}

/* The bound the daemon computes for body's answer (infer.c), read from
 * the 413 of a daemon whose max-answer-bytes is the least. */
static long long answer_bound(const char *body) {
  const char *flags[] = {"--max-answer-bytes", "1024", NULL};
  th_start(&d, flags);
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", INFER, body, NULL, &r), 0);
  cr_assert_eq(r.status, 413, "%s", r.body);
  long long b = -1;
  const char *p = strstr(r.body, "the answer could be ");
  cr_assert_not_null(p, "%s", r.body);
  sscanf(p, "the answer could be %lld bytes", &b);
  th_resp_free(&r);
  cr_assert_eq(th_stop(&d), 0);
  return b;
}

/* K clients each send a tagger request whose answer is a few MB and read
 * nothing; max-answer-memory holds three such answers (their bounds and
 * the head room conn.c reserves). Three are computed and held, unread;
 * the others get 503 at once. Every look at the gauges finds held plus
 * reserved within the bound. A client that reads is served meanwhile,
 * and a big request of its own gets 503 answer_memory_full with
 * Retry-After; once the unread connections close, their answers are
 * given back and the big request is served. Without the bound each
 * unread answer was held until idle-timeout-s (60 connections held
 * 968 MB). */
Test(serve_answers, unread_answers_are_bounded, .fini = teardown,
     .timeout = 240) {
  enum { K = 8, HELD = 3 };
  th_models(&d, tagger);
  char *big = tagger_body(20, 100);
  long long bound = answer_bound(big);
  cr_assert(bound > 1000000, "bound %lld", bound);
  long long per = bound + 1024; /* what one request reserves */
  long long max = HELD * per + 1000;
  char s_bytes[32], s_mem[32];
  snprintf(s_bytes, sizeof(s_bytes), "%lld", per);
  snprintf(s_mem, sizeof(s_mem), "%lld", max);
  const char *flags[] = {"--max-answer-bytes", s_bytes, "--max-answer-memory",
                         s_mem, "--idle-timeout-s", "600", NULL};
  th_start(&d, flags);
  int fd[K];
  for (int k = 0; k < K; k++) {
    fd[k] = unread_client(d.port);
    th_send(fd[k], "POST", INFER, big, NULL);
  }
  /* every request decided: HELD answered 200 (and not read), the rest
   * 503; the gauges within the bound at every look */
  answers a = {0};
  for (int i = 0; i < 6000; i++) {
    a = read_answers(d.port);
    cr_assert(a.held >= 0 && a.reserved >= 0, "no gauges");
    cr_assert(a.held + a.reserved <= (double)max,
              "held %.0f + reserved %.0f over max-answer-memory %lld",
              a.held, a.reserved, max);
    if (a.ok + a.unavailable >= K && a.reserved == 0) break;
    usleep(20000);
  }
  cr_assert_eq(a.ok, HELD, "answered %.0f, refused %.0f", a.ok,
               a.unavailable);
  cr_expect_eq(a.unavailable, K - HELD);
  cr_expect_eq(a.refused, K - HELD);
  /* the answers are held, unread: most of three answers' bytes (the
   * kernel's socket buffers take the rest) */
  cr_expect(a.held > 2.0 * (double)bound && a.held <= (double)max,
            "held %.0f of %lld (bound %lld)", a.held, max, bound);
  /* a client that reads is served meanwhile */
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", INFER,
                       "{\"tokens\": [\"the\", \"cat\", \"sat\"]}", NULL, &r),
               0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  th_resp_free(&r);
  /* its big request is refused: the bound is full */
  cr_assert_eq(th_http(d.port, "POST", INFER, big, NULL, &r), 0);
  cr_expect_eq(r.status, 503, "%s", r.body);
  cr_expect(strstr(r.body, "\"answer_memory_full\"") != NULL, "%s", r.body);
  cr_expect(strstr(r.body, "max-answer-memory") != NULL, "%s", r.body);
  char v[64];
  cr_expect_not_null(th_header(&r, "Retry-After", v, sizeof(v)));
  th_resp_free(&r);
  /* the unread connections go: their answers are given back */
  for (int k = 0; k < K; k++) close(fd[k]);
  for (int i = 0; i < 3000; i++) {
    a = read_answers(d.port);
    if (a.held == 0) break;
    usleep(20000);
  }
  cr_expect_eq(a.held, 0, "still held: %.0f", a.held);
  cr_expect_eq(a.reserved, 0);
  cr_assert_eq(th_http(d.port, "POST", INFER, big, NULL, &r), 0);
  cr_expect_eq(r.status, 200, "%.300s", r.body);
  th_resp_free(&r);
  a = read_answers(d.port);
  cr_expect_eq(a.held + a.reserved, 0, "held %.0f, reserved %.0f", a.held,
               a.reserved);
  free(big);
  cr_expect_eq(th_stop(&d), 0);
}

/* max-answer-memory below max-answer-bytes is refused at start-up: an
 * answer of the largest size could never be held. */
Test(serve_answers, bound_below_one_answer_is_refused, .fini = teardown,
     .timeout = 60) {
  char cmd[600], out[4096];
  snprintf(cmd, sizeof(cmd), "%s serve --max-answer-bytes 2048 "
           "--max-answer-memory 1024 --print-config 2>&1", th_bin());
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(out, 1, sizeof(out) - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  cr_expect_neq(st, 0, "%s", out);
  cr_expect(strstr(out, "max-answer-memory (1024) is less than "
                        "max-answer-bytes (2048)") != NULL, "%s", out);
}
