/* http_test_util.c - see http_test_util.h. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "http_test_util.h"

th_daemon ht_d;
const char *const ht_tree_only[] = {"treelstm", NULL};
const char *const HT_INFER = "/v1/models/treelstm/infer";
const char *const HT_ONE = "{\"instances\":[{\"tree\":\"(3 (2 It) (4 (2 is) "
                           "(2 fine)))\"}]}";

void ht_teardown(void) { th_cleanup(&ht_d); }

double ht_metric(const char *sample) {
  return th_metric_at(ht_d.port, sample);
}

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void send_str(int fd, const char *s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

/* Everything the daemon sends until it closes (or 10 s pass). */
char *read_all(int fd, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap);
  struct timeval tv = {.tv_sec = 10};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  for (;;) {
    if (n + 1 >= cap) b = realloc(b, cap *= 2);
    ssize_t k = recv(fd, b + n, cap - n - 1, 0);
    if (k <= 0) break;
    n += (size_t)k;
  }
  b[n] = '\0';
  *len = n;
  return b;
}

int count_of(const char *hay, size_t n, const char *needle) {
  int k = 0;
  size_t nl = strlen(needle);
  for (const char *p = hay; (p = memmem(p, n - (size_t)(p - hay), needle,
                                        nl)) != NULL;
       p += nl)
    k++;
  return k;
}

/* One answer that ends the connection: exactly one status line, status
 * `status`, an X-Request-Id, Connection: close, and a JSON error of
 * docs/api.md with `code`. */
void expect_one_error(int fd, int status, const char *code,
                      const char *what) {
  size_t n;
  char *all = read_all(fd, &n);
  cr_expect_eq(count_of(all, n, "HTTP/1."), 1, "%s: %d status lines in "
               "%.300s", what, count_of(all, n, "HTTP/1."), all);
  int st = 0;
  sscanf(all, "HTTP/1.1 %d", &st);
  cr_expect_eq(st, status, "%s: status %d, want %d: %.300s", what, st,
               status, all);
  cr_expect(strcasestr(all, "\r\nX-Request-Id: ") != NULL, "%s: no id: %.300s",
            what, all);
  cr_expect(strcasestr(all, "\r\nConnection: close\r\n") != NULL,
            "%s: no Connection: close: %.300s", what, all);
  const char *body = strstr(all, "\r\n\r\n");
  json_t *j = body ? json_loads(body + 4, 0, NULL) : NULL;
  cr_expect(j != NULL, "%s: the body is not JSON: %.300s", what, all);
  json_t *e = json_object_get(json_object_get(j, "error"), "code");
  cr_expect(json_is_string(e) && strcmp(json_string_value(e), code) == 0,
            "%s: code, want %s: %.300s", what, code, all);
  json_decref(j);
  free(all);
}
