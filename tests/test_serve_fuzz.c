/* test_serve_fuzz.c - garbage over the wire never harms the daemon or
 * another request: random bytes, broken HTTP, mutated JSON bodies (a
 * seeded generator, so a failure reproduces), interleaved with a valid
 * request whose answer must stay the same. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve_harness.h"

static th_daemon d;
static void teardown(void) { th_cleanup(&d); }

static unsigned long long rng = 0x9e3779b97f4a7c15ULL;
static unsigned next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (unsigned)(rng >> 11);
}

static const char *VALID =
    "{\"instances\":[{\"tree\":\"(3 (2 It) (4 (2 is) (2 fine)))\"},"
    "{\"tree\":{\"children\":[{\"word\":\"a\"},{\"word\":\"b\"}]}}]}";

static void raw(int port, const char *bytes, size_t n) {
  int fd = th_connect(port);
  cr_assert(fd >= 0, "the daemon stopped accepting connections");
  struct timeval tv = {.tv_sec = 0, .tv_usec = 300000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  send(fd, bytes, n, MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  char buf[4096];
  while (recv(fd, buf, sizeof(buf), 0) > 0) {
  }
  close(fd);
}

Test(serve_fuzz, garbage_never_harms, .fini = teardown, .timeout = 60) {
  th_models(&d, (const char *const[]){"treelstm", NULL});
  th_start(&d, (const char *const[]){"--max-delay-us", "0",
                                     "--max-body-bytes", "65536", NULL});
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", "/v1/models/treelstm/infer", VALID,
                       NULL, &r),
               0);
  cr_assert_eq(r.status, 200);
  char *golden = strdup(strstr(r.body, "\"outputs\""));
  *strstr(golden, "\"stats\"") = '\0';
  th_resp_free(&r);
  static const char *broken[] = {
      "GET\r\n\r\n",
      "GARBAGE / HTTP/1.1\r\n\r\n",
      "POST /v1/models/treelstm/infer HTTP/1.1\r\nContent-Length: 10\r\n\r\n{",
      "POST /v1/models/treelstm/infer HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
      "POST /v1/models/treelstm/infer HTTP/1.1\r\nHost: x\r\n"
      "Transfer-Encoding: chunked\r\n\r\nzz\r\n",
      "POST /v1/models/treelstm/infer HTTP/1.1\r\nHost: x\r\n"
      "Content-Length: 99999999999999999999\r\n\r\n",
      "GET /%00%ff/../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET /healthz HTTP/9.9\r\n\r\n",
      "GET /healthz HTTP/1.1\r\nX-Request-Id: \x01\x02\"\r\nHost: x\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof(broken) / sizeof(broken[0]); i++)
    raw(d.port, broken[i], strlen(broken[i]));
  char buf[8192];
  for (int round = 0; round < 150; round++) {
    size_t n = strlen(VALID);
    memcpy(buf, VALID, n + 1);
    int kind = round % 3;
    if (kind == 0) { /* random bytes as the whole request */
      n = 1 + next() % 2000;
      for (size_t i = 0; i < n; i++) buf[i] = (char)next();
      raw(d.port, buf, n);
      continue;
    }
    /* a mutated body: flips, cuts, insertions of JSON punctuation */
    static const char punct[] = "{}[]\",:()\\ 0aé";
    int muts = 1 + (int)(next() % 4);
    for (int m = 0; m < muts && n > 1; m++) {
      size_t at = next() % n;
      switch (next() % 3) {
        case 0: buf[at] = punct[next() % (sizeof(punct) - 1)]; break;
        case 1: n = at; break;
        default:
          if (n + 1 < sizeof(buf)) {
            memmove(buf + at + 1, buf + at, n - at);
            buf[at] = punct[next() % (sizeof(punct) - 1)];
            n++;
          }
      }
    }
    buf[n] = '\0';
    if (strlen(buf) != n) continue; /* an embedded NUL: skip */
    cr_assert_eq(th_http(d.port, "POST", "/v1/models/treelstm/infer", buf,
                         NULL, &r),
                 0, "no answer to body %s", buf);
    cr_expect(r.status == 200 || r.status == 400 || r.status == 413,
              "status %d for %s: %s", r.status, buf, r.body);
    cr_expect(strncmp(r.body, "{", 1) == 0);
    if (r.status != 200)
      cr_expect(strstr(r.body, "\"error\"") != NULL, "%s", r.body);
    th_resp_free(&r);
    if (round % 10 == 1) {
      cr_assert_eq(th_http(d.port, "POST", "/v1/models/treelstm/infer",
                           VALID, NULL, &r),
                   0);
      cr_assert_eq(r.status, 200);
      cr_expect(strncmp(strstr(r.body, "\"outputs\""), golden,
                        strlen(golden)) == 0,
                "a valid request's answer changed");
      th_resp_free(&r);
    }
  }
  free(golden);
  cr_assert_eq(th_http(d.port, "GET", "/healthz", NULL, NULL, &r), 0);
  cr_expect_eq(r.status, 200);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}
