/* test_serve_bigbody.c - big infer bodies end to end (docs/daemon.md
 * "Bodies"): bodies that no valid request is are refused 413 from a count
 * of their bytes, before jansson builds them; a valid big body, parsed off
 * the loop, answers as its instances do in small requests; a client that
 * hangs up while its body is parsed frees its connection; SIGTERM waits
 * for parses and answers every request; and the daemon's peak memory
 * stays far under what building those bodies would take. */
#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve_harness.h"

static th_daemon d;
static const char *const tree_only[] = {"treelstm", NULL};
static const char *ONE =
    "{\"instances\":[{\"tree\":\"(3 (2 It) (4 (2 is) (2 fine)))\"}]}";
static const char *INFER = "/v1/models/treelstm/infer";
#define MAX_BODY 8388608 /* the max-body-bytes default */

static void teardown(void) { th_cleanup(&d); }

/* head + item, item, ... + tail, as long as fits max-body-bytes. */
static char *filled(const char *head, const char *item, const char *tail) {
  size_t hl = strlen(head), il = strlen(item), tl = strlen(tail);
  size_t n = (MAX_BODY - hl - tl) / (il + 1);
  char *b = malloc(hl + n * (il + 1) + tl + 1), *p = b;
  memcpy(p, head, hl);
  p += hl;
  for (size_t i = 0; i < n; i++) {
    if (i) *p++ = ',';
    memcpy(p, item, il);
    p += il;
  }
  memcpy(p, tail, tl + 1);
  return b;
}

/* VmHWM of pid, in kB (-1: unknown); unused under ASan (its shadow
 * memory makes the figure meaningless). */
__attribute__((unused)) static long hwm_kb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  while (f && fgets(line, sizeof(line), f))
    if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb;
}

typedef struct {
  const char *body;
  int port;
  int status;
  char *answer;
} post_t;

static void *post_thread(void *arg) {
  post_t *p = arg;
  th_resp r;
  p->status = -1;
  if (th_http(p->port, "POST", INFER, p->body, NULL, &r) == 0) {
    p->status = r.status;
    p->answer = r.body;
    r.body = NULL;
    th_resp_free(&r);
  }
  return NULL;
}

/* Four hostile 8 MiB bodies at once, each refused naming its limit; the
 * daemon never builds them (main built the first into ~650 MB). */
Test(serve_bigbody, hostile_bodies_refused_before_building, .fini = teardown,
     .timeout = 120) {
  th_models(&d, tree_only);
  th_start(&d, NULL);
  char *bodies[4] = {
      /* 2.8 M tiny instances */
      filled("{\"instances\":[", "{}", "]}"),
      /* instances not under "instances": a JSON array of objects */
      filled("[", "{\"tree\":\"(a)\"}", "]"),
      /* many objects inside one instance (an ignored key) */
      filled("{\"tree\":\"(a b)\",\"junk\":[", "{}", "]}"),
      /* many arrays inside one instance */
      filled("{\"instances\":[{\"tree\":\"(a b)\",\"junk\":[", "[]", "]}]}"),
  };
  const char *want[4] = {"max-instances-per-request", "JSON objects",
                         "JSON objects", "JSON arrays"};
  post_t p[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    cr_assert_gt(strlen(bodies[i]), MAX_BODY - 64);
    p[i] = (post_t){bodies[i], d.port, 0, NULL};
    pthread_create(&t[i], NULL, post_thread, &p[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 4; i++) {
    cr_expect_eq(p[i].status, 413, "body %d: %d %s", i, p[i].status,
                 p[i].answer ? p[i].answer : "");
    cr_expect(p[i].answer && strstr(p[i].answer, "\"too_large\""),
              "body %d: %s", i, p[i].answer);
    cr_expect(p[i].answer && strstr(p[i].answer, want[i]), "body %d: %s",
              i, p[i].answer);
    free(p[i].answer);
    free(bodies[i]);
  }
  /* the first names the count and the limit as before */
  /* and the daemon still answers */
  th_expect_status(d.port, "POST", INFER, ONE, 200);
#if !defined(__SANITIZE_ADDRESS__)
  /* a memory bound, with a wide margin: the bodies themselves are 32 MB;
   * jansson's trees of them would be ~650 MB each */
  long kb = hwm_kb(d.pid);
  cr_expect(kb > 0 && kb < 300 * 1024, "VmHWM %ld kB", kb);
#endif
  cr_expect_eq(th_stop(&d), 0);
}

/* The answer to an inference body, checked 200 with n outputs (the
 * caller frees it). */
static json_t *post_for_outputs(const char *body, size_t n) {
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", INFER, body, NULL, &r), 0);
  cr_assert_eq(r.status, 200, "%.300s", r.body);
  json_t *j = json_loads(r.body, 0, NULL);
  th_resp_free(&r);
  cr_assert_eq(json_array_size(json_object_get(j, "outputs")), n);
  return j;
}

/* 1,000 real trees in one body (~250 KB: over the 16 KiB that sends a
 * body to the threadpool) answer exactly as the same trees in twenty
 * small bodies (parsed inline). */
Test(serve_bigbody, big_body_answers_as_small_ones, .fini = teardown,
     .timeout = 120) {
  th_models(&d, tree_only);
  th_start(&d, NULL);
  char path[512];
  snprintf(path, sizeof(path), "%s/trees-binary.jsonl", th_data());
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  size_t cap = 1 << 22, len = 0;
  char *big = malloc(cap), line[8192];
  char *small[20];
  size_t slen[20];
  len += (size_t)snprintf(big, cap, "{\"outputs\":\"all\",\"instances\":[");
  for (int s = 0; s < 20; s++) {
    small[s] = malloc(1 << 18);
    slen[s] = (size_t)snprintf(small[s], 1 << 18,
                               "{\"outputs\":\"all\",\"instances\":[");
  }
  for (int k = 0; k < 1000; k++) {
    if (fgets(line, sizeof(line), f) == NULL) {
      rewind(f);
      cr_assert_not_null(fgets(line, sizeof(line), f));
    }
    line[strcspn(line, "\n")] = '\0';
    len += (size_t)snprintf(big + len, cap - len, "%s%s", k ? "," : "", line);
    int s = k / 50;
    slen[s] += (size_t)snprintf(small[s] + slen[s], (1 << 18) - slen[s],
                                "%s%s", k % 50 ? "," : "", line);
  }
  fclose(f);
  snprintf(big + len, cap - len, "]}");
  cr_assert_gt(strlen(big), 64 * 1024);
  cr_assert_lt(strlen(big), 1024 * 1024); /* the medium lane */
  json_t *all = post_for_outputs(big, 1000);
  json_t *outs = json_object_get(all, "outputs");
  for (int s = 0; s < 20; s++) {
    snprintf(small[s] + slen[s], (1 << 18) - slen[s], "]}");
    cr_assert_lt(strlen(small[s]), 16 * 1024);
    json_t *part = post_for_outputs(small[s], 50);
    json_t *po = json_object_get(part, "outputs");
    for (size_t i = 0; i < 50; i++) {
      char where[64];
      snprintf(where, sizeof(where), "instance %zu", (size_t)s * 50 + i);
      th_expect_json_near(json_array_get(outs, (size_t)s * 50 + i),
                          json_array_get(po, i), where);
    }
    json_decref(part);
    free(small[s]);
  }
  json_decref(all);
  free(big);
  cr_expect_eq(th_stop(&d), 0);
}

/* A body valid as far as the count goes that takes jansson a while: one
 * instance with millions of numbers under a key it ignores. */
static char *slow_body(void) {
  return filled("{\"instances\":[{\"tree\":\"(a b)\",\"junk\":[", "0",
                "]}]}");
}

/* Starts the daemon and sends three clients' slow bodies (fd: their
 * connections), so that parses are running or queued when the test acts. */
static void start_with_slow_bodies(int fd[3]) {
  th_models(&d, tree_only);
  th_start(&d, NULL);
  char *body = slow_body();
  for (int i = 0; i < 3; i++) {
    fd[i] = th_connect(d.port);
    th_send(fd[i], "POST", INFER, body, NULL);
  }
  free(body);
}

/* The client hangs up while its body is parsed (or waits to be): its
 * connection goes, the daemon answers the next request, and drains. */
Test(serve_bigbody, hangup_while_parsing_frees_the_connection,
     .fini = teardown, .timeout = 120) {
  int fd[3];
  start_with_slow_bodies(fd);
  for (int i = 0; i < 3; i++) close(fd[i]);
  /* only the /metrics probe's own connection stays */
  double open = -1;
  for (double end = th_now() + TH_DEADLINE_S; th_now() < end && open != 1;) {
    open = th_metric_at(d.port, "canopy_open_connections");
    if (open != 1) usleep(20000);
  }
  cr_expect_eq(open, 1, "open connections: %g", open);
  /* each was cancelled as a hang-up (its EOF follows its body, read long
   * before a parse of millions of numbers ends) */
  cr_expect_eq(th_metric_at(d.port, "canopy_requests_cancelled_total{reason="
                                 "\"disconnect\"}"), 3);
  th_expect_status(d.port, "POST", INFER, ONE, 200);
  cr_expect_eq(th_stop(&d), 0);
}

/* SIGTERM with big bodies in the parse queue: every client gets an answer
 * (its result, or 503 draining; never a dropped connection) and the
 * daemon exits 0 once the parses are back. */
Test(serve_bigbody, sigterm_answers_bodies_being_parsed, .fini = teardown,
     .timeout = 120) {
  int fd[3];
  start_with_slow_bodies(fd);
  kill(d.pid, SIGTERM);
  for (int i = 0; i < 3; i++) {
    th_resp r;
    cr_assert_eq(th_read(fd[i], &r), 0, "client %d got no answer", i);
    cr_expect(r.status == 503 || r.status == 200, "client %d: %d %s", i,
              r.status, r.body);
    if (r.status == 503)
      cr_expect(strstr(r.body, "\"draining\"") != NULL, "%s", r.body);
    th_resp_free(&r);
    close(fd[i]);
  }
  cr_expect_eq(th_stop(&d), 0);
}

/* A medium body (400 real trees, ~100 KB: between the 16 KiB and 1 MiB
 * lanes' bounds) is parsed while huge ones are, not after them: with
 * three slow 8 MiB bodies ahead of it, parsed one at a time, its answer
 * comes while the last of them is still unanswered. */
Test(serve_bigbody, medium_body_does_not_wait_behind_huge_ones,
     .fini = teardown, .timeout = 120) {
  th_models(&d, tree_only);
  th_start(&d, NULL);
  char *mid = th_trees_body(400);
  cr_assert_gt(strlen(mid), 64 * 1024); /* over main's old 64 KiB, too */
  cr_assert_lt(strlen(mid), 1024 * 1024);
  char *huge = slow_body();
  int h[3];
  for (int i = 0; i < 3; i++) {
    h[i] = th_connect(d.port);
    th_send(h[i], "POST", INFER, huge, NULL);
  }
  free(huge);
  /* the huge ones are in before it (in flight: them and /metrics) */
  double n = 0;
  for (double end = th_now() + TH_DEADLINE_S; th_now() < end && n < 4;) {
    n = th_metric_at(d.port, "canopy_in_flight_requests");
    if (n < 4) usleep(5000);
  }
  cr_assert_eq(n, 4, "in flight: %g", n);
  int m = th_connect(d.port);
  th_send(m, "POST", INFER, mid, NULL);
  free(mid);
  th_resp r;
  cr_assert_eq(th_read(m, &r), 0);
  cr_expect_eq(r.status, 200, "%.300s", r.body);
  json_t *o = json_loads(r.body, 0, NULL);
  cr_expect_eq(json_array_size(json_object_get(o, "outputs")), 400);
  json_decref(o);
  th_resp_free(&r);
  close(m);
  /* the third huge body was not answered yet: nothing to read */
  struct pollfd pf = {.fd = h[2], .events = POLLIN};
  cr_expect_eq(poll(&pf, 1, 0), 0,
               "the medium body waited for the huge ones' parses");
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(th_read(h[i], &r), 0, "huge body %d got no answer", i);
    cr_expect_eq(r.status, 200, "huge body %d: %d %.200s", i, r.status,
                 r.body);
    th_resp_free(&r);
    close(h[i]);
  }
  cr_expect_eq(th_stop(&d), 0);
}

/* max-body-memory bounds the bodies held at once: two connections each
 * sending most of a 1 MiB body hold the 2 MiB allowed, a third gets 429
 * with Retry-After and is closed, a one-tree request is served all the
 * same, and once the first completes (parsed,
 * its body freed) a new big request is served. Without the bound,
 * max-connections bodies of max-body-bytes could be held (8 GiB at the
 * defaults). */
Test(serve_bigbody, bodies_held_are_bounded, .fini = teardown, .timeout = 60) {
  th_models(&d, tree_only);
  const char *flags[] = {"--max-body-bytes", "1048576", "--max-body-memory",
                         "2097152", NULL};
  th_start(&d, flags);
  enum { LEN = 1048576, SENT = 900 * 1024 };
  char *body = malloc(LEN + 1);
  const char *json = "{\"tree\": \"(2 a)\"}";
  memset(body, ' ', LEN);
  body[LEN] = '\0';
  memcpy(body, json, strlen(json)); /* then spaces: valid JSON */
  char head[200];
  snprintf(head, sizeof(head), "POST %s HTTP/1.1\r\nHost: x\r\n"
           "Content-Length: %d\r\n\r\n", INFER, LEN);
  int fd[3];
  for (int k = 0; k < 2; k++) {
    fd[k] = th_connect(d.port);
    cr_assert(fd[k] >= 0);
    cr_assert_eq(write(fd[k], head, strlen(head)), (ssize_t)strlen(head));
    size_t off = 0;
    while (off < SENT) {
      ssize_t w = write(fd[k], body + off, SENT - off);
      cr_assert(w > 0);
      off += (size_t)w;
    }
  }
  double held = 0;
  for (double end = th_now() + TH_DEADLINE_S;
       th_now() < end && held < 2097152;) {
    held = th_metric_at(d.port, "canopy_body_bytes");
    if (held < 2097152) usleep(20000);
  }
  cr_assert_eq(held, 2097152, "two bodies' buffers held: %.0f", held);
  /* the third: refused as soon as its body would pass the bound and
   * 16 KiB */
  fd[2] = th_connect(d.port);
  cr_assert_eq(write(fd[2], head, strlen(head)), (ssize_t)strlen(head));
  cr_assert_eq(write(fd[2], body, 32768), 32768);
  th_resp r;
  cr_assert_eq(th_read(fd[2], &r), 0);
  cr_expect_eq(r.status, 429, "%s", r.body);
  cr_expect(strstr(r.body, "max-body-memory") != NULL, "%s", r.body);
  char v[64];
  cr_expect(th_header(&r, "Retry-After", v, sizeof(v)) != NULL);
  cr_expect(th_header(&r, "Connection", v, sizeof(v)) != NULL &&
            strcasecmp(v, "close") == 0);
  th_resp_free(&r);
  close(fd[2]);
  /* an ordinary request is still served: bodies of up to 16 KiB are
   * never refused for max-body-memory (else a few connections
   * holding big bodies would turn every POST away) */
  cr_assert_eq(th_http(d.port, "POST", INFER, json, NULL, &r), 0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  th_resp_free(&r);
  /* the first finishes: answered, its body given back */
  size_t off = SENT;
  while (off < LEN) {
    ssize_t w = write(fd[0], body + off, LEN - off);
    cr_assert(w > 0);
    off += (size_t)w;
  }
  cr_assert_eq(th_read(fd[0], &r), 0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  th_resp_free(&r);
  close(fd[0]);
  close(fd[1]); /* the second hangs up: its body is given back too */
  for (double end = th_now() + TH_DEADLINE_S;
       th_now() < end && (held = th_metric_at(d.port, "canopy_body_bytes"));)
    usleep(20000);
  cr_expect_eq(held, 0, "every body given back: %.0f held", held);
  cr_assert_eq(th_http(d.port, "POST", INFER, body, NULL, &r), 0);
  cr_expect_eq(r.status, 200, "a big body fits again: %s", r.body);
  th_resp_free(&r);
  free(body);
  cr_expect_eq(th_stop(&d), 0);
}
