/* test_serve_memory.c - the memory budget in `canopy serve`
 * (docs/memory.md), over real HTTP: answers under the budget equal
 * those without it; a run holding a request that cannot fit alone is
 * re-run request by request, so the request that fits is answered 200 and
 * the one that does not hears 413 naming the budget; /metrics exports the
 * budget, each model's arena peak (within the budget) and the split. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_harness.h"

static th_daemon d;
static void teardown(void) { th_cleanup(&d); }

static const char *const tree_only[] = {"treelstm", NULL};

static json_t *outputs_of(const char *body) {
  return th_infer_outputs(d.port, "treelstm", body);
}

/* A balanced binary tree over n words, every node's output asked for. */
static char *balanced(int lo, int hi) {
  if (hi - lo == 1) {
    char *s = malloc(32);
    snprintf(s, 32, "(W w%d)", lo % 7);
    return s;
  }
  char *a = balanced(lo, (lo + hi) / 2), *b = balanced((lo + hi) / 2, hi);
  size_t n = strlen(a) + strlen(b) + 8;
  char *s = malloc(n);
  snprintf(s, n, "(S %s %s)", a, b);
  free(a);
  free(b);
  return s;
}

static char *all_body(const char *tree) {
  json_t *o = json_pack("{s:[{s:s}], s:s}", "instances", "tree", tree,
                        "outputs", "all");
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return s;
}

/* The small and the big request at once, in one window if window.c
 * lets them: 200 for the one that fits, 413 naming the budget for the
 * other. */
static void pair(const char *small, const char *big) {
  int fa = th_connect(d.port), fb = th_connect(d.port);
  th_send(fa, "POST", "/v1/models/treelstm/infer", small, NULL);
  th_send(fb, "POST", "/v1/models/treelstm/infer", big, NULL);
  th_resp ra, rb;
  cr_assert_eq(th_read(fa, &ra), 0);
  cr_assert_eq(th_read(fb, &rb), 0);
  cr_expect_eq(ra.status, 200, "the small tree: %d %s", ra.status, ra.body);
  cr_expect_eq(rb.status, 413, "the big tree: %d %s", rb.status, rb.body);
  cr_expect(strstr(rb.body, "over_memory_budget") != NULL, "%s", rb.body);
  cr_expect(strstr(rb.body, "memory budget is 65536 bytes") != NULL, "%s",
            rb.body);
  th_resp_free(&ra);
  th_resp_free(&rb);
  close(fa);
  close(fb);
}

Test(serve_memory, budget_plans_splits_and_refuses, .fini = teardown,
     .timeout = 120) {
  th_models(&d, tree_only);
  char *body = th_trees_body(64);
  th_start(&d, NULL);
  json_t *want = outputs_of(body);
  cr_expect_eq(th_metric_at(d.port, "canopy_memory_budget_bytes"), 0);
  th_stop(&d);

  const char *flags[] = {"--memory-budget", "64KiB", "--workers", "1",
                         "--max-delay-us", "300000", "--work-conserving",
                         "false", NULL};
  th_start(&d, flags);
  char *big_tree = balanced(0, 256);
  char *small = all_body("(S (W a) (W b))"), *big = all_body(big_tree);
  /* a fresh daemon has no estimate of this model's memory yet: the two
   * run together, over the budget, then one by one */
  pair(small, big);
  cr_expect_eq(th_metric_at(d.port, "canopy_runs_over_budget_total"), 1,
               "the two requests ran together, then one by one");
  json_t *got = outputs_of(body);
  th_expect_json_near(got, want, "outputs under a 64 KiB budget");
  char *gs = json_dumps(got, JSON_COMPACT | JSON_REAL_PRECISION(9)),
       *ws = json_dumps(want, JSON_COMPACT | JSON_REAL_PRECISION(9));
  cr_expect_str_eq(gs, ws, "the budget changed an answer");
  free(gs);
  free(ws);
  /* now window.c knows the model's bytes per vertex: the big request
   * closes the window instead of joining it */
  pair(small, big);
  cr_expect_geq(
      th_metric_at(d.port, "canopy_window_closes_total{reason=\"memory\"}"),
      1);
  char *m = NULL;
  th_resp mr;
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &mr), 0);
  m = mr.body;
  cr_expect_eq(th_metric(m, "canopy_memory_budget_bytes"), 65536);
  double peak =
      th_metric(m, "canopy_model_arena_peak_bytes{model=\"treelstm\"}");
  cr_expect_gt(peak, 0);
  cr_expect_leq(peak, 65536, "a run's arena over the budget");
  th_resp_free(&mr);
  /* many trees that each fit, every node's output asked for: the rows
   * their answers read are kept for all of them, so the request does not
   * fit even one instance at a time; the message says the request is the
   * unit and what to change */
  char *mid_tree = balanced(0, 16);
  json_t *many = json_array();
  for (int i = 0; i < 200; i++)
    json_array_append_new(many, json_pack("{s:s}", "tree", mid_tree));
  json_t *mo = json_pack("{s:o, s:s}", "instances", many, "outputs", "all");
  char *many_body = json_dumps(mo, JSON_COMPACT);
  json_decref(mo);
  char *one = all_body(mid_tree);
  th_resp rr;
  cr_assert_eq(th_http(d.port, "POST", "/v1/models/treelstm/infer", one,
                       NULL, &rr), 0);
  cr_expect_eq(rr.status, 200, "one tree alone fits: %s", rr.body);
  th_resp_free(&rr);
  cr_assert_eq(th_http(d.port, "POST", "/v1/models/treelstm/infer",
                       many_body, NULL, &rr), 0);
  cr_expect_eq(rr.status, 413, "%d %s", rr.status, rr.body);
  cr_expect(strstr(rr.body, "over_memory_budget") != NULL &&
                strstr(rr.body, "the request needs") != NULL &&
                strstr(rr.body, "one instance at a time") != NULL &&
                strstr(rr.body, "outputs \\\"root\\\"") != NULL &&
                strstr(rr.body, "split the request") != NULL,
            "%s", rr.body);
  th_resp_free(&rr);
  free(one);
  free(many_body);
  free(mid_tree);
  free(small);
  free(big);
  free(big_tree);
  free(body);
  json_decref(want);
  json_decref(got);
  cr_expect_eq(th_stop(&d), 0);
}
