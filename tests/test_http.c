/* test_http.c - the HTTP/1.1 front end (server/conn.c, conn_parse.c) end
 * to end, over real sockets on a free port: slow clients and the header
 * and body deadlines, malformed requests (one status
 * line, one JSON error with a request id each), Expect: 100-continue,
 * chunked bodies and their framing, HEAD, HTTP/1.0 and a client that does
 * not read its answers. Pipelining: test_http_pipeline.c; the connection
 * limit: test_http_limits.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "http_test_util.h"
#include "serve_harness.h"

/* Connections that send a request head (or body) a few bytes at a time
 * hold no worker and no other client back: a normal request is answered
 * meanwhile, and each slow one gets one 408 JSON and is closed once its
 * deadline passes (header-timeout-s, body-timeout-s). */
#define N_HEAD 300
#define N_BODY 100
Test(http, slow_clients_get_408_and_others_are_served, .fini = ht_teardown,
     .timeout = 90) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  cr_assert(rl.rlim_cur >= N_HEAD + N_BODY + 64, "RLIMIT_NOFILE %llu",
            (unsigned long long)rl.rlim_cur);
  th_models(&ht_d, ht_tree_only);
  const char *flags[] = {"--header-timeout-s", "2", "--body-timeout-s", "2",
                         "--idle-timeout-s", "60", NULL};
  th_start(&ht_d, flags);
  int fd[N_HEAD + N_BODY];
  for (int i = 0; i < N_HEAD + N_BODY; i++) {
    fd[i] = th_connect(ht_d.port);
    cr_assert(fd[i] >= 0, "connection %d", i);
    if (i < N_HEAD) {
      send_str(fd[i], "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    } else {
      char h[200];
      snprintf(h, sizeof(h), "POST %s HTTP/1.1\r\nHost: x\r\n"
               "Content-Length: 1000\r\n\r\n{", HT_INFER);
      send_str(fd[i], h);
    }
  }
  /* trickle for a while, but stop before the deadline has long passed */
  double t0 = now_s();
  bool served = false;
  for (int round = 0; now_s() - t0 < 1.5; round++) {
    for (int i = 0; i < N_HEAD + N_BODY; i++)
      send_str(fd[i], i < N_HEAD ? "X-A: b\r\n" : " ");
    if (!served) {
      th_resp r;
      cr_assert_eq(th_http(ht_d.port, "POST", HT_INFER, HT_ONE, NULL, &r), 0);
      cr_expect_eq(r.status, 200, "%s", r.body);
      cr_expect(strstr(r.body, "\"outputs\"") != NULL, "%s", r.body);
      th_resp_free(&r);
      cr_assert_eq(th_http(ht_d.port, "GET", "/healthz", NULL, NULL, &r), 0);
      cr_expect_eq(r.status, 200, "%s", r.body);
      th_resp_free(&r);
      served = true;
    }
    usleep(250000);
  }
  for (int i = 0; i < N_HEAD + N_BODY; i++) {
    char what[64];
    snprintf(what, sizeof(what), "%s connection %d",
             i < N_HEAD ? "head" : "body", i);
    expect_one_error(fd[i], 408, "request_timeout", what);
    close(fd[i]);
  }
  /* and the daemon still serves, with nothing left in flight */
  th_resp r;
  cr_assert_eq(th_http(ht_d.port, "POST", HT_INFER, HT_ONE, NULL, &r), 0);
  cr_expect_eq(r.status, 200);
  th_resp_free(&r);
  cr_expect_eq(ht_metric("canopy_in_flight_requests"), 1); /* this one */
  cr_expect_eq(ht_metric("canopy_requests_total{status=\"408\"}"),
               N_HEAD, "head timeouts");
  cr_expect_eq(th_stop(&ht_d), 0);
}

/* A connection that sends part of a request head and then nothing more
 * gets one 408 JSON at header-timeout-s and is closed; one that sends
 * nothing at all is closed silently (no status line: there is no request
 * to answer, and nginx's ngx_http_wait_request_handler does the same) at
 * the smaller of header-timeout-s and idle-timeout-s. */
Test(http, stalled_head_gets_408_and_silent_connection_closes_quietly,
     .fini = ht_teardown, .timeout = 30) {
  th_models(&ht_d, ht_tree_only);
  const char *flags[] = {"--header-timeout-s", "1", "--idle-timeout-s", "60",
                         NULL};
  th_start(&ht_d, flags);
  int part = th_connect(ht_d.port), none = th_connect(ht_d.port);
  cr_assert(part >= 0 && none >= 0);
  send_str(part, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: st");
  expect_one_error(part, 408, "request_timeout", "a stalled head");
  close(part);
  /* nothing sent: EOF (recv 0), not a timeout and not an answer */
  struct timeval tv = {.tv_sec = 10};
  setsockopt(none, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char b[256];
  ssize_t k = recv(none, b, sizeof(b), 0);
  cr_expect_eq(k, 0, "a connection that sent nothing: recv %zd (%.*s)", k,
               k > 0 ? (int)k : 0, b);
  close(none);
  cr_expect_eq(ht_metric("canopy_requests_total{status=\"408\"}"), 1,
               "one 408: the silent connection is not a request");
  cr_expect_eq(th_stop(&ht_d), 0);
}

/* Malformed requests on raw sockets: one status line and one JSON error
 * with X-Request-Id each, then close (framing is lost). */
Test(http, malformed_requests_get_one_json_error, .fini = ht_teardown,
     .timeout = 60) {
  th_models(&ht_d, ht_tree_only);
  th_start(&ht_d, NULL);
  static char big_head[40000], long_url[9000];
  strcpy(big_head, "GET /healthz HTTP/1.1\r\nX-Big: ");
  size_t n = strlen(big_head);
  memset(big_head + n, 'a', sizeof(big_head) - n - 5);
  memcpy(big_head + sizeof(big_head) - 5, "\r\n\r\n", 5);
  memcpy(long_url, "GET /", 5);
  memset(long_url + 5, 'a', sizeof(long_url) - 5);
  char *tail = long_url + sizeof(long_url) - 16;
  snprintf(tail, 16, " HTTP/1.1\r\n\r\n");
  static char many[4096] = "GET /healthz HTTP/1.1\r\n";
  for (int i = 0; i < 150; i++) strcat(many, "X: y\r\n");
  strcat(many, "\r\n");
  const char *P = "POST /v1/models/treelstm/infer HTTP/1.1\r\nHost: x\r\n";
  static const struct {
    const char *head, *rest, *code;
    int status;
    const char *what;
  } cases[] = {
      {"Content-Length: -1\r\n\r\n", "", "bad_request", 400, "length -1"},
      {"Content-Length: 12345678901234567890\r\n\r\n", "", "too_large", 413,
       "20-digit length"},
      {"Content-Length: 123456789012345678901234\r\n\r\n", "", "bad_request",
       400, "24-digit length"},
      {"Content-Length: 17\r\nContent-Length: 5\r\n\r\n",
       "{\"tree\": \"(2 a)\"}", "bad_request", 400, "two lengths"},
      {"Content-Length: 17\r\nTransfer-Encoding: chunked\r\n\r\n",
       "{\"tree\": \"(2 a)\"}", "bad_request", 400, "CL and TE"},
      {"Transfer-Encoding: chunked\r\nContent-Length: 17\r\n\r\n",
       "{\"tree\": \"(2 a)\"}", "bad_request", 400, "TE and CL"},
      {"Transfer-Encoding: gzip\r\n\r\n", "xxxx", "not_implemented", 501,
       "TE gzip"},
      {"Transfer-Encoding: chunked\r\n\r\n", "zz\r\nabc\r\n0\r\n\r\n",
       "bad_request", 400, "bad chunk size"},
      {"Content-Length: 5\r\nExpect: 200-ok\r\n\r\n", "hello", "bad_request",
       400, "unknown Expect"},
      {"Content-Length : 5\r\n\r\n", "{\"tree\": \"(2 a)\"}", "bad_request",
       400, "a space before the colon (smuggling)"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    int fd = th_connect(ht_d.port);
    cr_assert(fd >= 0);
    send_str(fd, P);
    send_str(fd, cases[i].head);
    send_str(fd, cases[i].rest);
    expect_one_error(fd, cases[i].status, cases[i].code, cases[i].what);
    close(fd);
  }
  const struct {
    const char *req, *code;
    int status;
    const char *what;
  } raw[] = {
      {big_head, "header_too_large", 431, "a header over the limit"},
      {many, "header_too_large", 431, "150 header lines"},
      {long_url, "uri_too_long", 414, "a URL over the limit"},
      {"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 tls hello\r\n\r\n",
       "bad_request", 400, "garbage (a TLS hello)"},
      {"GET / HTTP/9.9\r\n\r\n", "bad_request", 400, "HTTP/9.9"},
      {"GET /healthz HTTP/1.2\r\n\r\n", "bad_request", 400, "HTTP/1.2"},
      {"GET /healthz HTTP/1.1\r\nBad Header\r\n\r\n", "bad_request", 400,
       "a header without a colon"},
      {"GET\r\n\r\n", "bad_request", 400, "no URL"},
      /* RFC 9112 §3.2: HTTP/1.1 needs exactly one Host */
      {"GET /healthz HTTP/1.1\r\n\r\n", "bad_request", 400,
       "HTTP/1.1 without Host"},
      {"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
       "bad_request", 400, "two Host headers"},
      {"GET /healthz HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n",
       "bad_request", 400, "two Host headers in HTTP/1.0"},
  };
  for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
    int fd = th_connect(ht_d.port);
    cr_assert(fd >= 0);
    send_str(fd, raw[i].req);
    expect_one_error(fd, raw[i].status, raw[i].code, raw[i].what);
    close(fd);
  }
  /* none of it is left in flight, and the daemon serves on */
  cr_expect_eq(ht_metric("canopy_in_flight_requests"), 1);
  cr_expect_eq(th_stop(&ht_d), 0);
}

/* Expect: 100-continue gets the interim answer before the body is sent
 * (curl waits 1 s without it); chunked bodies, in many pieces, give the
 * answer a Content-Length body gives. */
Test(http, expect_continue_and_chunked_bodies, .fini = ht_teardown,
     .timeout = 30) {
  th_models(&ht_d, ht_tree_only);
  th_start(&ht_d, NULL);
  th_resp plain;
  cr_assert_eq(th_http(ht_d.port, "POST", HT_INFER, HT_ONE, NULL, &plain), 0);
  cr_assert_eq(plain.status, 200);
  json_t *want_doc = json_loads(plain.body, 0, NULL);
  json_t *want = json_object_get(want_doc, "outputs");
  char h[256];
  snprintf(h, sizeof(h), "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: "
           "%zu\r\nExpect: 100-continue\r\n\r\n", HT_INFER, strlen(HT_ONE));
  int fd = th_connect(ht_d.port);
  send_str(fd, h);
  char buf[64] = {0};
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  cr_assert_eq(poll(&pf, 1, 5000), 1, "no 100 Continue");
  ssize_t k = recv(fd, buf, 25, 0);
  cr_expect_eq(k, 25);
  cr_expect_str_eq(buf, "HTTP/1.1 100 Continue\r\n\r\n");
  send_str(fd, HT_ONE);
  th_resp r;
  cr_assert_eq(th_read(fd, &r), 0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  th_resp_free(&r);
  /* chunked, in pieces of 7 bytes, with a chunk extension and a trailer,
   * on the same keep-alive connection */
  snprintf(h, sizeof(h), "POST %s HTTP/1.1\r\nHost: x\r\n"
           "Transfer-Encoding: chunked\r\n\r\n", HT_INFER);
  send_str(fd, h);
  size_t len = strlen(HT_ONE);
  for (size_t off = 0; off < len; off += 7) {
    size_t m = len - off < 7 ? len - off : 7;
    char c[64];
    snprintf(c, sizeof(c), "%zx%s\r\n%.*s\r\n", m, off == 0 ? ";x=y" : "",
             (int)m, HT_ONE + off);
    send_str(fd, c);
    usleep(2000);
  }
  send_str(fd, "0\r\nX-Trailer: z\r\n\r\n");
  cr_assert_eq(th_read(fd, &r), 0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  json_t *got_doc = json_loads(r.body, 0, NULL);
  json_t *got = json_object_get(got_doc, "outputs");
  cr_expect(json_equal(got, want), "chunked: %s", r.body);
  json_decref(got_doc);
  json_decref(want_doc);
  th_resp_free(&r);
  close(fd);
  th_resp_free(&plain);
  cr_expect_eq(th_stop(&ht_d), 0);
}

/* Debian's http_parser, built
 * non-strict, takes any two bytes after a chunk's data as its CRLF and any
 * junk after a chunk size as an extension. Both are refused 400 (request
 * smuggling behind a proxy that reads the framing another way), also when
 * the bytes after the data come in a later read; whitespace before a
 * chunk extension's ';' is still served, as is a CRLF split across reads. */
static int chunked_post(const char *const *parts, int nparts) {
  char h[256];
  snprintf(h, sizeof(h), "POST %s HTTP/1.1\r\nHost: x\r\n"
           "Transfer-Encoding: chunked\r\n\r\n", HT_INFER);
  int fd = th_connect(ht_d.port);
  cr_assert(fd >= 0);
  send_str(fd, h);
  for (int i = 0; i < nparts; i++) {
    usleep(30000); /* each part its own read */
    send_str(fd, parts[i]);
  }
  return fd;
}

/* A chunked body sent in n parts (each its own read), and what it tests. */
typedef struct chunked_case {
  const char *parts[4];
  int n;
  const char *what;
} chunked_case;

Test(http, chunk_framing_is_checked_on_raw_bytes, .fini = ht_teardown,
     .timeout = 30) {
  th_models(&ht_d, ht_tree_only);
  th_start(&ht_d, NULL);
  char size[32], data[512];
  snprintf(size, sizeof(size), "%zx", strlen(HT_ONE));
  snprintf(data, sizeof(data), "%s", HT_ONE);
  char line[64], ws[64], body_xx[600];
  snprintf(line, sizeof(line), "%s\r\n", size);
  snprintf(ws, sizeof(ws), "%s \t;ext=1\r\n", size);
  /* served: BWS before ';', the CRLF after the data in two more reads,
   * and a size with 30 leading zeros (no digits of it) */
  char zeros[80];
  snprintf(zeros, sizeof(zeros), "000000000000000000000000000000%s\r\n",
           size);
  const chunked_case served[] = {
      {{zeros, data, "\r\n0\r\n\r\n"}, 3, "leading zeros"},
      {{ws, data, "\r", "\n0\r\n\r\n"}, 4, "BWS, CRLF in two reads"},
  };
  for (size_t i = 0; i < sizeof(served) / sizeof(served[0]); i++) {
    int fd = chunked_post(served[i].parts, served[i].n);
    th_resp r;
    cr_assert_eq(th_read(fd, &r), 0, "%s", served[i].what);
    cr_expect_eq(r.status, 200, "%s: %s", served[i].what, r.body);
    th_resp_free(&r);
    close(fd);
  }
  /* served: chunked requests one after another on one connection, two
   * of them pipelined in one write */
  {
    char one[600], three[2000];
    snprintf(one, sizeof(one), "POST %s HTTP/1.1\r\nHost: x\r\n"
             "Transfer-Encoding: chunked\r\n\r\n%s\r\n%s\r\n0\r\n\r\n",
             HT_INFER, size, HT_ONE);
    snprintf(three, sizeof(three), "%s%s", one, one);
    int fd = th_connect(ht_d.port);
    cr_assert(fd >= 0);
    send_str(fd, one);
    for (int i = 0; i < 3; i++) {
      if (i == 1) send_str(fd, three);
      th_resp r;
      cr_assert_eq(th_read(fd, &r), 0, "chunked request %d", i + 1);
      cr_expect_eq(r.status, 200, "chunked request %d: %s", i + 1, r.body);
      th_resp_free(&r);
    }
    close(fd);
  }
  /* refused */
  snprintf(body_xx, sizeof(body_xx), "%s\r\n%sXX0\r\n\r\n", size, HT_ONE);
  char junk[64], trail[64];
  snprintf(junk, sizeof(junk), "%s zz\r\n", size);
  snprintf(trail, sizeof(trail), "%s \r\n", size);
  const chunked_case bad[] = {
      {{body_xx}, 1, "XX after the data, one read"},
      {{line, data, "XX0\r\n\r\n"}, 3, "XX after the data, a later read"},
      {{line, data, "\r", "X0\r\n\r\n"}, 4, "CR then X, later reads"},
      {{line, data, "\n0\r\n\r\n"}, 3, "LF alone after the data"},
      {{junk, data, "\r\n0\r\n\r\n"}, 3, "junk after the size"},
      {{trail, data, "\r\n0\r\n\r\n"}, 3, "whitespace, no ';'"},
      {{"0 zz\r\n\r\n"}, 1, "junk after the last chunk's size"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int fd = chunked_post(bad[i].parts, bad[i].n);
    expect_one_error(fd, 400, "bad_request", bad[i].what);
    close(fd);
  }
  /* a trailer section is bounded like a head (10,000 lines were read),
   * and HTTP/1.0 with Transfer-Encoding has faulty framing (RFC 9112
   * §6.1); both were served */
  {
    static char many[4096];
    snprintf(many, sizeof(many), "%s\r\n0\r\n", HT_ONE);
    for (int i = 0; i < 150; i++) strcat(many, "X: y\r\n");
    strcat(many, "\r\n");
    const char *parts[] = {line, many};
    int fd = chunked_post(parts, 2);
    expect_one_error(fd, 431, "header_too_large", "150 trailer lines");
    close(fd);
    char h10[600];
    snprintf(h10, sizeof(h10), "POST %s HTTP/1.0\r\nTransfer-Encoding: "
             "chunked\r\n\r\n%s\r\n%s\r\n0\r\n\r\n", HT_INFER, size, HT_ONE);
    fd = th_connect(ht_d.port);
    send_str(fd, h10);
    expect_one_error(fd, 400, "bad_request", "HTTP/1.0 and chunked");
    close(fd);
  }
  cr_expect_eq(ht_metric("canopy_in_flight_requests"), 1);
  cr_expect_eq(th_stop(&ht_d), 0);
}

/* HEAD has the GET headers and no body; HTTP/1.0 closes unless it asks
 * for keep-alive; a chunked body over max-body-bytes is 413. */
Test(http, head_http10_and_body_limit, .fini = ht_teardown, .timeout = 30) {
  th_models(&ht_d, ht_tree_only);
  const char *flags[] = {"--max-body-bytes", "100", NULL};
  th_start(&ht_d, flags);
  int fd = th_connect(ht_d.port);
  send_str(fd, "HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz "
               "HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  size_t n;
  char *all = read_all(fd, &n);
  close(fd);
  cr_expect_eq(count_of(all, n, "HTTP/1.1 200"), 2, "%s", all);
  const char *second = strstr(all + 1, "HTTP/1.1 200");
  cr_assert_not_null(second);
  cr_expect(strstr(all, "\r\n\r\nHTTP/1.1 200") == second - 4,
            "HEAD sent a body: %s", all);
  free(all);
  fd = th_connect(ht_d.port);
  send_str(fd, "GET /healthz HTTP/1.0\r\n\r\n");
  all = read_all(fd, &n); /* EOF after one answer */
  cr_expect_eq(count_of(all, n, "HTTP/1.1 200"), 1, "%s", all);
  cr_expect(strcasestr(all, "Connection: close") != NULL, "%s", all);
  free(all);
  close(fd);
  fd = th_connect(ht_d.port);
  send_str(fd, "GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  th_resp r;
  cr_assert_eq(th_read(fd, &r), 0);
  cr_expect_eq(r.status, 200);
  char v[32];
  cr_expect(th_header(&r, "Connection", v, sizeof(v)) &&
            strcasecmp(v, "keep-alive") == 0);
  th_resp_free(&r);
  send_str(fd, "GET /healthz HTTP/1.0\r\n\r\n");
  cr_assert_eq(th_read(fd, &r), 0, "HTTP/1.0 keep-alive was closed");
  th_resp_free(&r);
  close(fd);
  fd = th_connect(ht_d.port);
  char h[256];
  snprintf(h, sizeof(h), "POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
           "chunked\r\n\r\n", HT_INFER);
  send_str(fd, h);
  for (int i = 0; i < 20; i++) send_str(fd, "10\r\n0123456789abcdef\r\n");
  expect_one_error(fd, 413, "too_large", "chunked over max-body-bytes");
  close(fd);
  cr_expect_eq(ht_metric("canopy_in_flight_requests"), 1);
  cr_expect_eq(th_stop(&ht_d), 0);
}

static long rss_kb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  while (f && fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
  if (f) fclose(f);
  return kb;
}

/* A client that pipelines requests and never reads the answers: the
 * daemon stops reading from it once an answer is unwritten, so the
 * client's sends block (the kernel buffers fill) and the daemon's memory
 * does not grow with what the client would send. */
Test(http, client_that_does_not_read_is_not_buffered, .fini = ht_teardown,
     .timeout = 60) {
  th_models(&ht_d, ht_tree_only);
  th_start(&ht_d, NULL);
  long before = rss_kb(ht_d.pid);
  int fd = th_connect(ht_d.port);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  size_t rl = strlen(req), sent = 0;
  double t0 = now_s(), last = t0;
  /* send until the daemon has taken nothing for 1 s (or 64 MB went) */
  while (now_s() - last < 1.0 && sent < (64u << 20)) {
    ssize_t w = send(fd, req, rl, MSG_NOSIGNAL);
    if (w > 0) {
      sent += (size_t)w;
      last = now_s();
    } else {
      usleep(10000);
    }
  }
  long after = rss_kb(ht_d.pid);
  cr_expect_lt(sent, (size_t)(64u << 20), "the daemon read all %zu bytes",
               sent);
  cr_expect_lt(after - before, 64 * 1024, "RSS grew %ld kB", after - before);
  close(fd);
  th_resp r;
  cr_assert_eq(th_http(ht_d.port, "GET", "/healthz", NULL, NULL, &r), 0);
  cr_expect_eq(r.status, 200);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&ht_d), 0);
}

