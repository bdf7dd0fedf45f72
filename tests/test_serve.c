/* test_serve.c - `canopy serve` end to end over real HTTP: every route,
 * error code and status of docs/api.md, X-Request-Id, limits, 429, 504,
 * client disconnect, drain, and promtool on /metrics. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve_harness.h"

static th_daemon d;
static const char *const tree_only[] = {"treelstm", NULL};
static const char *ONE =
    "{\"instances\":[{\"tree\":\"(3 (2 It) (4 (2 is) (2 fine)))\"}]}";

static void teardown(void) { th_cleanup(&d); }

/* Checks status and, for errors, the docs/api.md error object and its code. */
static void expect(int port, const char *method, const char *path,
                   const char *body, int status, const char *code) {
  th_resp r;
  cr_assert_eq(th_http(port, method, path, body, NULL, &r), 0, "%s %s",
               method, path);
  cr_expect_eq(r.status, status, "%s %s: %d, want %d: %s", method, path,
               r.status, status, r.body);
  char id[80];
  cr_expect(th_header(&r, "X-Request-Id", id, sizeof(id)) != NULL);
  json_error_t je;
  json_t *j = json_loads(r.body, 0, &je);
  if (strcmp(path, "/metrics") != 0)
    cr_expect(j != NULL, "%s %s: body is not JSON: %s", method, path,
              r.body);
  if (code != NULL && j != NULL) {
    json_t *e = json_object_get(j, "error");
    cr_expect(json_is_object(e), "no error object: %s", r.body);
    cr_expect_str_eq(json_string_value(json_object_get(e, "code")), code);
    cr_expect(json_string_length(json_object_get(e, "message")) > 0);
  }
  json_decref(j);
  th_resp_free(&r);
}

Test(serve, routes_and_errors, .fini = teardown, .timeout = 30) {
  th_models(&d, tree_only);
  th_start(&d, NULL);
  int p = d.port;
  expect(p, "GET", "/healthz", NULL, 200, NULL);
  expect(p, "GET", "/readyz", NULL, 200, NULL);
  expect(p, "GET", "/v2/health/live", NULL, 200, NULL);
  expect(p, "GET", "/v2/health/ready", NULL, 200, NULL);
  expect(p, "GET", "/v1/models", NULL, 200, NULL);
  expect(p, "GET", "/v1/models/treelstm", NULL, 200, NULL);
  expect(p, "GET", "/metrics", NULL, 200, NULL);
  expect(p, "POST", "/v1/models/treelstm/infer", ONE, 200, NULL);
  expect(p, "GET", "/nope", NULL, 404, "no_such_route");
  expect(p, "GET", "/v1/models/treelstm/other", NULL, 404, "no_such_route");
  expect(p, "GET", "/v1/models/nope", NULL, 404, "no_such_model");
  /* an encoded NUL once cut the path short (served treelstm's info), an
   * encoded '/' split a name from its route (served as infer), and '.'
   * or '..' named models-dir or its parent */
  expect(p, "GET", "/v1/models/treelstm%00junk", NULL, 404, "no_such_route");
  expect(p, "POST", "/v1/models/treelstm%2finfer", ONE, 404,
         "no_such_route");
  expect(p, "POST", "/v1/models/../infer", ONE, 404, "no_such_model");
  expect(p, "POST", "/v1/models/%2e%2e/infer", ONE, 404, "no_such_model");
  expect(p, "GET", "/v1/models/.hidden", NULL, 404, "no_such_model");
  expect(p, "POST", "/v1/models/nope/infer", ONE, 404, "no_such_model");
  /* a name that is not UTF-8 once got an error without a message (jansson
   * refused the string), and a backslash in the path escaped the quotes
   * of its log line (checked below) */
  expect(p, "GET", "/v1/models/%ff", NULL, 404, "no_such_model");
  expect(p, "POST", "/v1/models/a%c3/infer", ONE, 404, "no_such_model");
  expect(p, "GET", "/x\\", NULL, 404, "no_such_route");
  /* the absolute form of a target (RFC 9112 §3.2.2) */
  expect(p, "POST", "http://x/v1/models/treelstm/infer", ONE, 200, NULL);
  expect(p, "GET", "HTTP://x:8080/healthz?a=b", NULL, 200, NULL);
  expect(p, "DELETE", "/metrics", NULL, 405, "method_not_allowed");
  expect(p, "GET", "/v1/models/treelstm/infer", NULL, 405,
         "method_not_allowed");
  expect(p, "POST", "/healthz", "{}", 405, "method_not_allowed");
  const char *infer = "/v1/models/treelstm/infer";
  expect(p, "POST", infer, "{\"instances\": [", 400, "bad_json");
  expect(p, "POST", infer, "[1,2]", 400, "bad_json");
  expect(p, "POST", infer, "{\"instances\": {}}", 400, "bad_instance");
  expect(p, "POST", infer, "{\"instances\": []}", 400, "bad_instance");
  expect(p, "POST", infer, "{\"instances\": [3]}", 400, "bad_instance");
  expect(p, "POST", infer, "{\"instances\": [{\"text\": \"a b\"}]}", 400,
         "bad_instance");
  expect(p, "POST", infer, "{\"tree\": \"(3 (2 It)\"}", 400, "bad_tree");
  expect(p, "POST", infer, "{\"tree\": \"(a b c d)\"}", 400,
         "too_many_children");
  expect(p, "POST", infer, "{\"tree\": \"(2 a)\", \"outputs\": \"x\"}", 400,
         "bad_instance");
  expect(p, "POST", infer, "{\"tree\": \"(2 a)\", \"timeout_ms\": -1}", 400,
         "bad_instance");
  expect(p, "POST", infer, "{\"tree\": \"(2 a)\", \"timeout_ms\": \"9\"}",
         400, "bad_instance");
  /* single INSTANCE body, outputs=all, return_hidden */
  th_resp r;
  cr_assert_eq(th_http(p, "POST", infer,
                       "{\"tree\": \"(1 (2 a) (3 b))\", \"outputs\": \"all\", "
                       "\"return_hidden\": true}",
                       "X-Request-Id: my-id-42\r\n", &r),
               0);
  cr_assert_eq(r.status, 200, "%s", r.body);
  char id[80];
  cr_expect_str_eq(th_header(&r, "X-Request-Id", id, sizeof(id)), "my-id-42");
  th_resp_free(&r);
  /* an id with a quote or a backslash is replaced: it is logged unquoted,
   * and x"msg=forged\ once made a logfmt line of its own choosing */
  cr_assert_eq(th_http(p, "GET", "/healthz", NULL,
                       "X-Request-Id: x\"msg=forged\\\r\n", &r), 0);
  th_header(&r, "X-Request-Id", id, sizeof(id));
  cr_expect(strchr(id, '"') == NULL && strchr(id, '\\') == NULL &&
            strlen(id) > 0, "id %s", id);
  th_resp_free(&r);
  cr_assert_eq(th_http(p, "POST", infer,
                       "{\"tree\": \"(1 (2 a) (3 b))\", \"outputs\": \"all\", "
                       "\"return_hidden\": true}",
                       "X-Request-Id: 0f8e-41ab:9/x+y=z@q_r.s\r\n", &r),
               0);
  cr_expect_str_eq(th_header(&r, "X-Request-Id", id, sizeof(id)),
                   "0f8e-41ab:9/x+y=z@q_r.s");
  json_t *j = json_loads(r.body, 0, NULL);
  json_t *o = json_array_get(json_object_get(j, "outputs"), 0);
  cr_expect_eq(json_array_size(json_object_get(o, "nodes")), 3);
  cr_expect(json_array_size(json_object_get(o, "h")) > 0);
  json_t *st = json_object_get(j, "stats");
  cr_expect(json_integer_value(json_object_get(st, "batches")) >=
            json_integer_value(json_object_get(st, "lower_bound")));
  cr_expect(json_is_number(json_object_get(st, "queue_ms")));
  cr_expect(json_is_number(json_object_get(st, "compute_ms")));
  json_decref(j);
  th_resp_free(&r);
  /* the model description names the policy in use: by default
   * sufficient, the fastest measured on CPU (docs/policies.md; it replaced
   * fsm as the default), which needs no learned policy */
  cr_assert_eq(th_http(p, "GET", "/v1/models/treelstm", NULL, NULL, &r), 0);
  j = json_loads(r.body, 0, NULL);
  cr_expect_str_eq(json_string_value(json_object_get(
                       json_object_get(j, "policy"), "kind")),
                   "sufficient");
  cr_expect_null(json_object_get(json_object_get(j, "policy"), "source"));
  cr_expect_str_eq(json_string_value(json_object_get(j, "family")),
                   "treelstm");
  json_decref(j);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
  char *log = th_read_file(d.log);
  cr_assert_not_null(log);
  cr_expect(strstr(log, "path=\"/x?\" ") != NULL &&
                strstr(log, "path=\"/x\\") == NULL,
            "%s", log);
  /* a path that names nothing is logged as sent, not as "" */
  cr_expect(strstr(log, "path=\"/v1/models/treelstm%00junk\"") != NULL,
            "%s", log);
  free(log);
}

Test(serve, limits_413, .fini = teardown, .timeout = 30) {
  th_models(&d, tree_only);
  const char *flags[] = {"--max-body-bytes", "1000",
                         "--max-instances-per-request", "2",
                         "--max-vertices", "10", "--max-depth", "8", NULL};
  th_start(&d, flags);
  const char *infer = "/v1/models/treelstm/infer";
  char big[3000];
  snprintf(big, sizeof(big), "{\"tree\": \"(2 %02000d)\"}", 0);
  expect(d.port, "POST", infer, big, 413, "too_large");
  expect(d.port, "POST", infer,
         "{\"instances\":[{\"tree\":\"(2 a)\"},{\"tree\":\"(2 a)\"},"
         "{\"tree\":\"(2 a)\"}]}",
         413, "too_large");
  /* 4 leaves + 3 internal + 7 outputs (outputs=all) > 10 */
  const char *wide = "{\"outputs\":\"all\",\"tree\":\"(1 (1 (2 a) (2 b)) "
                     "(1 (2 c) (2 d)))\"}";
  expect(d.port, "POST", infer, wide, 413, "too_large");
  expect(d.port, "POST", infer,
         "{\"tree\":\"(a (b (c (d (e (f (g (h (i (j k))))))))))\"}", 413,
         "too_large");
  /* and the daemon is still fine */
  expect(d.port, "POST", infer, ONE, 200, NULL);
  cr_expect_eq(th_stop(&d), 0);
}

/* One worker, a 60 s window and a queue of 2 instances make 429 and 504
 * deterministic: the first request waits in the window (the queue depth
 * says so), the next one does not fit in the queue, and the first one's
 * timeout_ms (5 s: the span the test has to send the second) passes
 * first. */
Test(serve, overload_429_and_timeout_504, .fini = teardown, .timeout = 60) {
  th_models(&d, tree_only);
  const char *flags[] = {"--workers", "1", "--queue-depth", "2",
                         "--max-delay-us", "60000000",
                         "--work-conserving", "false", NULL};
  th_start(&d, flags);
  const char *infer = "/v1/models/treelstm/infer";
  int a = th_connect(d.port);
  th_send(a, "POST", infer,
          "{\"tree\": \"(2 a)\", \"timeout_ms\": 5000}", NULL);
  th_metric_wait(d.port, "canopy_queue_depth_instances", 1);
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", infer,
                       "{\"instances\":[{\"tree\":\"(2 a)\"},"
                       "{\"tree\":\"(2 b)\"}]}",
                       NULL, &r),
               0);
  cr_expect_eq(r.status, 429, "%s", r.body);
  char ra[16];
  cr_expect(th_header(&r, "Retry-After", ra, sizeof(ra)) != NULL);
  cr_expect(atoi(ra) >= 1);
  cr_expect(strstr(r.body, "\"overloaded\"") != NULL);
  th_resp_free(&r);
  cr_assert_eq(th_read(a, &r), 0);
  cr_expect_eq(r.status, 504, "%s", r.body);
  cr_expect(strstr(r.body, "\"timeout\"") != NULL);
  th_resp_free(&r);
  close(a);
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  cr_expect_eq(th_metric(r.body, "canopy_instances_dropped_total"), 1);
  cr_expect_eq(th_metric(r.body, "canopy_runs_total"), 0);
  cr_expect_eq(th_metric(r.body, "canopy_queue_depth_instances"), 0);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}

/* The daemon's timeout-ms is served by one list of the waiting requests
 * and one timer (a request's own timeout_ms by a timer of its own): each
 * is answered 504 when due, one that leaves the list first (a client that
 * hangs up) moves the timer on to the next, and a request with a longer
 * timeout_ms of its own stays waiting meanwhile. The 60 s window keeps
 * every request waiting; what is waited on is each answer. */
Test(serve, default_timeout_list, .fini = teardown, .timeout = 60) {
  th_models(&d, tree_only);
  const char *flags[] = {"--workers", "1", "--max-delay-us", "60000000",
                         "--work-conserving", "false", "--timeout-ms", "2000",
                         NULL};
  th_start(&d, flags);
  const char *infer = "/v1/models/treelstm/infer";
  int first = th_connect(d.port), a = th_connect(d.port),
      own = th_connect(d.port);
  th_send(first, "POST", infer, "{\"tree\": \"(2 a)\"}", NULL);
  th_metric_wait(d.port, "canopy_queue_depth_instances", 1);
  th_send(a, "POST", infer, "{\"tree\": \"(2 b)\"}", NULL);
  th_metric_wait(d.port, "canopy_queue_depth_instances", 2);
  th_send(own, "POST", infer, "{\"tree\": \"(2 c)\", \"timeout_ms\": 600000}",
          NULL);
  th_metric_wait(d.port, "canopy_queue_depth_instances", 3);
  close(first); /* the list's head leaves it (499) */
  th_metric_wait(d.port, "canopy_queue_depth_instances", 2);
  th_resp r;
  cr_assert_eq(th_read(a, &r), 0);
  cr_expect_eq(r.status, 504, "%s", r.body);
  cr_expect(strstr(r.body, "no result within timeout_ms 2000") != NULL, "%s",
            r.body);
  th_resp_free(&r);
  close(a);
  /* the list is empty, its own timer still runs: one more joins it */
  th_metric_wait(d.port, "canopy_queue_depth_instances", 1);
  int b = th_connect(d.port);
  th_send(b, "POST", infer, "{\"tree\": \"(2 d)\"}", NULL);
  cr_assert_eq(th_read(b, &r), 0);
  cr_expect_eq(r.status, 504, "%s", r.body);
  th_resp_free(&r);
  close(b);
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  cr_expect_eq(th_metric(r.body, "canopy_queue_depth_instances"), 1,
               "%s", r.body);
  cr_expect_eq(th_metric(r.body, "canopy_runs_total"), 0);
  th_resp_free(&r);
  close(own);
  th_metric_wait(d.port, "canopy_queue_depth_instances", 0);
  cr_expect_eq(th_stop(&d), 0);
}

/* A full queue refuses a request before parsing it (under overload about
 * half the requests are refused, and parsing each one only to refuse it
 * took the loop thread's time): bad JSON is 429 while the queue is full,
 * 400 once it has room. */
Test(serve, full_queue_refuses_before_parsing, .fini = teardown,
     .timeout = 60) {
  th_models(&d, tree_only);
  const char *flags[] = {"--workers", "1", "--queue-depth", "1",
                         "--max-delay-us", "60000000",
                         "--work-conserving", "false", NULL};
  th_start(&d, flags);
  const char *infer = "/v1/models/treelstm/infer";
  int a = th_connect(d.port);
  th_send(a, "POST", infer,
          "{\"tree\": \"(2 a)\", \"timeout_ms\": 5000}", NULL);
  th_metric_wait(d.port, "canopy_queue_depth_instances", 1);
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", infer, "{\"instances\": [", NULL, &r),
               0);
  cr_expect_eq(r.status, 429, "%s", r.body);
  cr_expect(strstr(r.body, "the queue is full") != NULL, "%s", r.body);
  char ra[16];
  cr_expect(th_header(&r, "Retry-After", ra, sizeof(ra)) != NULL);
  th_resp_free(&r);
  cr_assert_eq(th_read(a, &r), 0);
  cr_expect_eq(r.status, 504, "%s", r.body);
  th_resp_free(&r);
  close(a);
  expect(d.port, "POST", infer, "{\"instances\": [", 400, "bad_json");
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  cr_expect_eq(th_metric(r.body, "canopy_requests_rejected_overloaded_total"), 1,
               "%s", r.body);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}

Test(serve, disconnect_drops_instances, .fini = teardown, .timeout = 30) {
  th_models(&d, tree_only);
  const char *flags[] = {"--max-delay-us", "1500000", "--work-conserving",
                         "false", NULL};
  th_start(&d, flags);
  int a = th_connect(d.port);
  th_send(a, "POST", "/v1/models/treelstm/infer",
          "{\"instances\":[{\"tree\":\"(2 a)\"},{\"tree\":\"(2 b)\"}]}",
          NULL);
  th_metric_wait(d.port, "canopy_queue_depth_instances", 2);
  close(a);
  th_metric_wait(d.port,
                 "canopy_requests_cancelled_total{reason=\"disconnect\"}", 1);
  th_resp r;
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  cr_expect_eq(th_metric(r.body,
                         "canopy_requests_cancelled_total{reason=\"disconnect\"}"),
               1, "%s", r.body);
  cr_expect_eq(th_metric(r.body, "canopy_instances_dropped_total"), 2);
  th_resp_free(&r);
  /* nothing ran: the next request's run is the first, of its instance
   * alone */
  expect(d.port, "POST", "/v1/models/treelstm/infer", ONE, 200, NULL);
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  cr_expect_eq(th_metric(r.body, "canopy_runs_total"), 1);
  cr_expect_eq(th_metric(r.body, "canopy_batch_size_instances_sum{model="
                                 "\"treelstm\"}"), 1, "%s", r.body);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}

/* Four one-instance requests in one 300 ms window: with two idle workers
 * and split-min-instances 2 the window runs as two runs of two; with
 * split-min-instances 0 (or one worker) as one run. The answers are the
 * same either way. */
static json_t *window_of_four(const char *split, const char *workers,
                              double *runs) {
  th_models(&d, tree_only);
  const char *flags[] = {"--max-delay-us", "300000", "--workers", workers,
                         "--split-min-instances", split,
                         "--work-conserving", "false", NULL};
  th_start(&d, flags);
  static const char *const trees[] = {"(2 a)", "(3 (2 b) (1 c))",
                                      "(4 (2 d) (3 (1 e) (0 f)))", "(1 g)"};
  int fds[4];
  for (int i = 0; i < 4; i++) {
    char body[256];
    snprintf(body, sizeof(body), "{\"instances\":[{\"tree\":\"%s\"}]}",
             trees[i]);
    fds[i] = th_connect(d.port);
    th_send(fds[i], "POST", "/v1/models/treelstm/infer", body, NULL);
  }
  json_t *outs = json_array();
  long long ids[4];
  int distinct = 0;
  for (int i = 0; i < 4; i++) {
    th_resp r;
    cr_assert_eq(th_read(fds[i], &r), 0);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    json_array_append(outs, json_object_get(j, "outputs"));
    /* each part of a split window is a run of its own, numbered */
    ids[i] = json_integer_value(
        json_object_get(json_object_get(j, "stats"), "run"));
    cr_expect(ids[i] >= 1, "%s", r.body);
    bool seen = false;
    for (int k = 0; k < i; k++) seen = seen || ids[k] == ids[i];
    distinct += !seen;
    json_decref(j);
    th_resp_free(&r);
    close(fds[i]);
  }
  th_resp r;
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  *runs = th_metric(r.body, "canopy_runs_total");
  cr_expect_eq(distinct, *runs, "one run number a run");
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
  th_cleanup(&d);
  return outs;
}

Test(serve, window_split_among_idle_workers, .fini = teardown,
     .timeout = 30) {
  double split_runs, whole_runs, one_worker_runs;
  json_t *split = window_of_four("2", "2", &split_runs);
  json_t *whole = window_of_four("0", "2", &whole_runs);
  json_t *one = window_of_four("2", "1", &one_worker_runs);
  cr_expect_eq(split_runs, 2);
  cr_expect_eq(whole_runs, 1);
  cr_expect_eq(one_worker_runs, 1);
  for (int i = 0; i < 4; i++) {
    th_expect_json_near(json_array_get(split, i), json_array_get(whole, i),
                        "split against whole");
    th_expect_json_near(json_array_get(one, i), json_array_get(whole, i),
                        "one worker against whole");
  }
  json_decref(split);
  json_decref(whole);
  json_decref(one);
}

/* SIGTERM with requests waiting in a 10 s window (the span the test has
 * to ask readyz in; the drain's grace is longer): readyz turns 503 on an
 * open connection, new connections are refused, every accepted request is
 * answered 200, and the process exits 0. */
Test(serve, sigterm_drains, .fini = teardown, .timeout = 60) {
  th_models(&d, tree_only);
  const char *flags[] = {"--max-delay-us", "10000000", "--work-conserving",
                         "false", "--drain-grace-ms", "60000", NULL};
  th_start(&d, flags);
  int k = th_connect(d.port);
  th_resp r;
  th_send(k, "GET", "/readyz", NULL, NULL);
  cr_assert_eq(th_read(k, &r), 0);
  cr_expect_eq(r.status, 200);
  th_resp_free(&r);
  int c[8];
  for (int i = 0; i < 8; i++) {
    c[i] = th_connect(d.port);
    th_send(c[i], "POST", "/v1/models/treelstm/infer", ONE, NULL);
  }
  th_metric_wait(d.port, "canopy_queue_depth_instances", 8);
  kill(d.pid, SIGTERM);
  th_log_wait(&d, "msg=draining", 1);
  th_send(k, "GET", "/readyz", NULL, NULL);
  cr_assert_eq(th_read(k, &r), 0);
  cr_expect_eq(r.status, 503);
  cr_expect(strstr(r.body, "draining") != NULL);
  th_resp_free(&r);
  close(k);
  cr_expect_eq(th_connect(d.port), -1, "new connections are refused");
  for (int i = 0; i < 8; i++) {
    cr_assert_eq(th_read(c[i], &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body);
    th_resp_free(&r);
    close(c[i]);
  }
  int st;
  waitpid(d.pid, &st, 0);
  d.pid = 0;
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The daemon's own request id: "cn-" then the start time and a counter,
 * both hex (http.c set_id). */
static bool generated_id(const char *id) {
  unsigned a, b;
  char tail;
  return id != NULL && strlen(id) == 18 &&
         sscanf(id, "cn-%8x-%6x%c", &a, &b, &tail) == 2;
}

/* A bad X-Request-Id gets an id of the daemon's own, whatever made it
 * bad: a control character (the head is refused 400 mid-value; its id
 * was once the header's name, "X-Request-Id"), a value cut by one, a
 * space, a quote, nothing, or more than 64 bytes. A good one is echoed
 * on the 400 of a head refused after it. */
Test(serve, bad_request_id_gets_a_generated_one, .fini = teardown,
     .timeout = 30) {
  th_models(&d, tree_only);
  th_start(&d, NULL);
  char long_id[100];
  memset(long_id, 'a', 65);
  long_id[65] = '\0';
  char long_head[200];
  snprintf(long_head, sizeof(long_head), "X-Request-Id: %s\r\n", long_id);
  static const char *const bad[] = {
      "X-Request-Id: a\x01" "b\r\n", "X-Request-Id: abc\x01\r\n",
      "X-Request-Id: \x01\r\n", "X-Request-Id: a\x7f" "b\r\n",
      "X-Request-Id: a b\r\n", "X-Request-Id: a\"b\r\n",
      "X-Request-Id: \r\n", "X-Request-\x01Id: ok\r\n", NULL};
  for (int i = 0; i <= (int)(sizeof(bad) / sizeof(bad[0])) - 1; i++) {
    const char *h = bad[i] ? bad[i] : long_head;
    char req[400];
    snprintf(req, sizeof(req), "GET /healthz HTTP/1.1\r\nHost: x\r\n%s\r\n",
             h);
    int fd = th_connect(d.port);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    th_resp r;
    cr_assert_eq(th_read(fd, &r), 0, "no answer to %s", h);
    char id[80];
    const char *got = th_header(&r, "X-Request-Id", id, sizeof(id));
    cr_expect(generated_id(got), "header %s: status %d, id '%s'", h,
              r.status, got ? got : "(none)");
    th_resp_free(&r);
    close(fd);
  }
  /* a good id before a header that makes the head bad is the request's */
  const char *req = "GET /healthz HTTP/1.1\r\nHost: x\r\n"
                    "X-Request-Id: good-1\r\nX-Other: a\x01" "b\r\n\r\n";
  int fd = th_connect(d.port);
  cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
  th_resp r;
  cr_assert_eq(th_read(fd, &r), 0);
  cr_expect_eq(r.status, 400, "%s", r.body);
  char id[80];
  cr_expect_str_eq(th_header(&r, "X-Request-Id", id, sizeof(id)), "good-1");
  th_resp_free(&r);
  close(fd);
  cr_expect_eq(th_stop(&d), 0);
}

Test(serve, promtool_check_metrics, .fini = teardown, .timeout = 30) {
  if (system("command -v promtool >/dev/null") != 0)
    cr_skip_test("promtool not installed (Debian package prometheus)");
  th_models(&d, tree_only);
  th_start(&d, NULL);
  th_resp r;
  expect(d.port, "POST", "/v1/models/treelstm/infer", ONE, 200, NULL);
  expect(d.port, "POST", "/v1/models/treelstm/infer", "{", 400, "bad_json");
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  char ct[128];
  cr_expect(strstr(th_header(&r, "Content-Type", ct, sizeof(ct)),
                   "version=0.0.4") != NULL);
  char path[400], cmd[900];
  snprintf(path, sizeof(path), "%s/metrics.txt", d.dir);
  FILE *f = fopen(path, "w");
  fwrite(r.body, 1, r.body_len, f);
  fclose(f);
  static const char *const must[] = {
      "canopy_requests_total{model=\"treelstm\",status=\"200\"}",
      "canopy_batches_total", "canopy_lower_bound_batches_total",
      "canopy_in_flight_requests",
      "canopy_policy_retrains_total{model=\"treelstm\",result=\"kept\"}",
      "canopy_gather_copied_bytes_total", "canopy_arena_bytes",
      "canopy_batch_size_instances_count{model=\"treelstm\"}",
      "canopy_queue_depth_instances",
      "canopy_request_duration_seconds_count{model=\"treelstm\"}",
      "canopy_queue_duration_seconds_count{model=\"treelstm\"}",
      "canopy_compute_duration_seconds_count{model=\"treelstm\"}"};
  for (size_t i = 0; i < sizeof(must) / sizeof(must[0]); i++)
    cr_expect(th_metric(r.body, must[i]) >= 0, "missing %s", must[i]);
  cr_expect(th_metric(r.body, "canopy_batches_total") > 0);
  cr_expect(th_metric(r.body, "canopy_policy_retrains_total{model="
                              "\"treelstm\",result=\"swapped\"}") == 0);
  cr_expect(th_metric(r.body, "canopy_batch_size_instances_count{model="
                              "\"treelstm\"}") == 1);
  cr_expect(th_metric(r.body, "canopy_gather_copied_bytes_total") >= 0);
  th_resp_free(&r);
  snprintf(cmd, sizeof(cmd), "promtool check metrics < %s > %s.out 2>&1",
           path, path);
  cr_expect_eq(system(cmd), 0, "promtool check metrics failed (%s.out)",
               path);
  cr_expect_eq(th_stop(&d), 0);
}

/* stats.run says which requests shared a run: a window closed by size
 * (max-instances 3) holds the two requests (3 instances) sent meanwhile,
 * and the next two form the next run. */
Test(serve, stats_name_the_run, .fini = teardown, .timeout = 30) {
  th_models(&d, tree_only);
  const char *flags[] = {"--workers", "1", "--max-instances", "3",
                         "--max-delay-us", "5000000",
                         "--work-conserving", "false", NULL};
  th_start(&d, flags);
  const char *infer = "/v1/models/treelstm/infer";
  long long runs[2];
  for (int round = 0; round < 2; round++) {
    /* 1 + 2 instances fill the window */
    int fd[2] = {th_connect(d.port), th_connect(d.port)};
    th_send(fd[0], "POST", infer, "{\"tree\": \"(2 a)\"}", NULL);
    th_send(fd[1], "POST", infer,
            "{\"instances\":[{\"tree\":\"(2 a)\"},{\"tree\":\"(1 b)\"}]}",
            NULL);
    long long run = -1;
    for (int k = 0; k < 2; k++) {
      th_resp r;
      cr_assert_eq(th_read(fd[k], &r), 0);
      cr_assert_eq(r.status, 200, "%s", r.body);
      json_t *j = json_loads(r.body, 0, NULL);
      json_t *st = json_object_get(j, "stats");
      long long got = json_integer_value(json_object_get(st, "run"));
      cr_expect(got >= 1, "%s", r.body);
      if (k == 0) run = got;
      cr_expect_eq(got, run, "requests of one window, one run: %s", r.body);
      cr_expect_eq(json_integer_value(json_object_get(st, "run_requests")),
                   2, "%s", r.body);
      cr_expect_eq(json_integer_value(json_object_get(st, "run_instances")),
                   3, "%s", r.body);
      json_decref(j);
      th_resp_free(&r);
      close(fd[k]);
    }
    runs[round] = run;
  }
  cr_expect_neq(runs[0], runs[1], "the next window is the next run");
  cr_expect_eq(th_stop(&d), 0);
}

static double runs_total(int port) {
  th_resp r;
  cr_assert_eq(th_http(port, "GET", "/metrics", NULL, NULL, &r), 0);
  double v = th_metric(r.body, "canopy_runs_total");
  th_resp_free(&r);
  return v;
}

/* A request whose answer could pass max-answer-bytes is 413 before it
 * runs (328 KB of tokens can ask for a 227 MB answer): the error
 * names the key and return_hidden, no run is made for it, and the same
 * instances without return_hidden are served. */
Test(serve, answer_bytes_413, .fini = teardown, .timeout = 30) {
  th_models(&d, (const char *const[]){"bilstm-tagger", NULL});
  th_start(&d, (const char *const[]){"--max-answer-bytes", "300000", NULL});
  const char *infer = "/v1/models/bilstm-tagger/infer";
  /* 16 instances of 64 tokens: ~110 bytes a token at most without
   * return_hidden, over 500 more with it */
  size_t cap = 1 << 16;
  char *plain = malloc(cap), *hidden = malloc(cap);
  size_t n = (size_t)snprintf(plain, cap, "{\"instances\":[");
  for (int i = 0; i < 16; i++) {
    n += (size_t)snprintf(plain + n, cap - n, "%s{\"tokens\":[", i ? "," : "");
    for (int t = 0; t < 64; t++)
      n += (size_t)snprintf(plain + n, cap - n, "%s\"the\"", t ? "," : "");
    n += (size_t)snprintf(plain + n, cap - n, "]}");
  }
  snprintf(hidden, cap, "%s],\"return_hidden\":true}", plain);
  strcat(plain, "]}");
  double runs0 = runs_total(d.port);
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", infer, hidden, NULL, &r), 0);
  cr_expect_eq(r.status, 413, "%d: %s", r.status, r.body);
  json_t *j = json_loads(r.body, 0, NULL);
  const char *msg = json_string_value(
      json_object_get(json_object_get(j, "error"), "message"));
  const char *code = json_string_value(
      json_object_get(json_object_get(j, "error"), "code"));
  cr_expect(code != NULL && strcmp(code, "too_large") == 0, "%s", r.body);
  cr_expect(msg != NULL && strstr(msg, "max-answer-bytes") != NULL &&
                strstr(msg, "no return_hidden") != NULL &&
                strstr(msg, "300000") != NULL,
            "%s", r.body);
  json_decref(j);
  th_resp_free(&r);
  cr_expect_eq(runs_total(d.port), runs0, "the refused request ran");
  cr_assert_eq(th_http(d.port, "POST", infer, plain, NULL, &r), 0);
  cr_expect_eq(r.status, 200, "%d: %.300s", r.status, r.body);
  cr_expect_lt(r.body_len, (size_t)300000);
  th_resp_free(&r);
  cr_expect_eq(runs_total(d.port), runs0 + 1);
  free(plain);
  free(hidden);
  cr_expect_eq(th_stop(&d), 0);
}
