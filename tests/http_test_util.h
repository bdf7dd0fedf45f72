/* http_test_util.h - raw-socket helpers and the daemon fixture of the HTTP
 * front end's tests (test_http.c, test_http_pipeline.c,
 * test_http_limits.c). */
#ifndef CANOPY_HTTP_TEST_UTIL_H
#define CANOPY_HTTP_TEST_UTIL_H

#include <stddef.h>

#include "serve_harness.h"

/* The daemon a test starts (each test runs in its own process), the one
 * model the tests have it serve, that model's infer path and a one-tree
 * request for it. */
extern th_daemon ht_d;
extern const char *const ht_tree_only[];
extern const char *const HT_INFER, *const HT_ONE;
/* A test's .fini: stops ht_d and removes its files. */
void ht_teardown(void);
/* The value of one /metrics sample of ht_d. */
double ht_metric(const char *sample);

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
