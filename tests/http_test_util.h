/* http_test_util.h - raw-socket helpers of the HTTP front end's tests
 * (test_http.c, test_http_pipeline.c). */
#ifndef CANOPY_HTTP_TEST_UTIL_H
#define CANOPY_HTTP_TEST_UTIL_H

#include <stddef.h>

/* CLOCK_MONOTONIC, in seconds. */
double now_s(void);
/* All of s, or until the peer closes. */
void send_str(int fd, const char *s);
/* Everything the daemon sends until it closes (or 10 s pass). */
char *read_all(int fd, size_t *len);
/* How many times needle occurs in hay[0..n). */
int count_of(const char *hay, size_t n, const char *needle);
/* One answer that ends the connection: exactly one status line, status
 * `status`, an X-Request-Id, Connection: close, and a JSON error of
 * docs/api.md with `code`. */
void expect_one_error(int fd, int status, const char *code,
                      const char *what);

#endif
