/* test_serve_policy.c - learned FSM policies in `canopy serve`: with an
 * empty policy cache the daemon starts at once on the
 * agenda fallback; live traffic fills the reservoir; the background
 * retrainer learns a policy that launches fewer batches than agenda on it
 * and swaps it in (GET /v1/models/{m} says "online", /metrics counts it,
 * the cache holds the file); outputs are unchanged by the swap (1e-5);
 * after a restart on the same cache the policy comes from the cache. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve_harness.h"

#define N_REQ 40
#define PER_REQ 8

static th_daemon d;
static void teardown(void) { th_cleanup(&d); }

/* Request bodies of PER_REQ trees each, outputs "all" (every node: the
 * case where agenda launches about twice the lower bound). */
static char **bodies(void) {
  char path[600];
  snprintf(path, sizeof(path), "%s/trees-binary.jsonl", th_data());
  FILE *f = fopen(path, "r");
  cr_assert(f != NULL, "cannot open %s", path);
  char **b = calloc(N_REQ, sizeof(char *));
  char *line = NULL;
  size_t cap = 0;
  for (int i = 0; i < N_REQ; i++) {
    json_t *arr = json_array();
    for (int k = 0; k < PER_REQ; k++) {
      cr_assert(getline(&line, &cap, f) > 0, "too few trees in %s", path);
      json_t *inst = json_loads(line, 0, NULL);
      cr_assert(inst != NULL);
      json_array_append_new(arr, inst);
    }
    json_t *o = json_object();
    json_object_set_new(o, "instances", arr);
    json_object_set_new(o, "outputs", json_string("all"));
    b[i] = json_dumps(o, JSON_COMPACT);
    json_decref(o);
  }
  free(line);
  fclose(f);
  return b;
}

static json_t *infer(const char *body) {
  return th_infer_outputs(d.port, "treelstm", body);
}

static json_t *policy(void) {
  th_resp r;
  cr_assert_eq(th_http(d.port, "GET", "/v1/models/treelstm", NULL, NULL, &r),
               0);
  cr_assert_eq(r.status, 200);
  json_t *j = json_loads(r.body, 0, NULL);
  cr_assert(j != NULL, "%s", r.body);
  json_t *p = json_incref(json_object_get(j, "policy"));
  json_decref(j);
  th_resp_free(&r);
  cr_assert(json_is_object(p));
  return p;
}

static const char *source(const json_t *p) {
  return json_string_value(json_object_get(p, "source"));
}

static int policy_files(const char *dir) {
  DIR *dd = opendir(dir);
  if (dd == NULL) return 0;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(dd)) != NULL)
    if (strstr(de->d_name, ".fsm.json") != NULL) n++;
  closedir(dd);
  return n;
}

Test(serve_policy, online_retrain_swap_and_cache, .fini = teardown,
     .timeout = 120) {
  static const char *const fams[] = {"treelstm", NULL};
  th_models(&d, fams);
  char cache[400];
  snprintf(cache, sizeof(cache), "%s/policy-cache", d.dir);
  const char *const flags[] = {
      "--policy", "fsm", "--policy-cache", cache, "--retrain-interval-s",
      "1", "--reservoir-graphs", "32", "--retrain-min-graphs", "16",
      "--max-delay-us", "0", "--workers", "2", NULL};
  char **b = bodies();
  th_start(&d, flags);

  /* an empty cache: served at once, on agenda */
  json_t *p = policy();
  cr_expect_str_eq(source(p), "agenda-fallback");
  cr_expect_str_eq(json_string_value(json_object_get(p, "kind")), "fsm");
  json_decref(p);
  char *log = th_read_file(d.log);
  cr_expect(log && strstr(log, "msg=policy-not-cached") &&
                strstr(log, "policy-cache"),
            "no warning naming the cache file: %s", log);
  free(log);
  json_t *before = infer(b[0]);

  for (int i = 1; i < N_REQ; i++) json_decref(infer(b[i]));

  /* the retrainer learns from the reservoir and swaps */
  for (double end = th_now() + TH_DEADLINE_S; th_now() < end;) {
    p = policy();
    if (strcmp(source(p), "online") == 0) break;
    json_decref(p);
    p = NULL;
    usleep(100000);
  }
  cr_assert(p != NULL, "the policy never became \"online\"; see %s", d.log);
  /* "online" is published before the swap is counted and its file
   * stored; the log line that says where it went comes after all three */
  th_log_wait(&d, "msg=policy-swapped model=treelstm", 1);
  log = th_read_file(d.log);
  cr_expect(log && strstr(log, "stored=yes"), "the policy was not stored: "
            "%s", log);
  free(log);
  long long bat = json_integer_value(json_object_get(p, "batches"));
  long long ag = json_integer_value(json_object_get(p, "agenda_batches"));
  long long lb = json_integer_value(json_object_get(p, "lower_bound"));
  cr_expect(bat > 0 && bat < ag, "batches %lld, agenda %lld", bat, ag);
  cr_expect(lb > 0 && lb <= bat, "lower bound %lld, batches %lld", lb, bat);
  cr_expect(json_integer_value(json_object_get(p, "swaps")) >= 1);
  cr_expect(json_integer_value(json_object_get(p, "trained_on_graphs")) >=
            16);
  json_decref(p);

  th_resp r;
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  cr_expect(th_metric(r.body, "canopy_policy_retrains_total{model="
                              "\"treelstm\",result=\"swapped\"}") >= 1,
            "%s", r.body);
  th_resp_free(&r);
  cr_expect(policy_files(cache) == 1, "no policy file in %s", cache);

  /* the swap changes the schedule, not the numbers */
  json_t *after = infer(b[0]);
  th_expect_json_near(before, after, "outputs after the swap");
  json_decref(after);
  cr_expect_eq(th_stop(&d), 0);

  /* a restart on the same cache serves the learned policy from it */
  const char *const flags2[] = {"--policy", "fsm", "--policy-cache", cache,
                                "--retrain-interval-s", "0", NULL};
  th_start(&d, flags2);
  p = policy();
  cr_expect_str_eq(source(p), "cache");
  cr_expect(json_integer_value(json_object_get(p, "trained_on_graphs")) >=
            16);
  json_decref(p);
  after = infer(b[0]);
  th_expect_json_near(before, after, "outputs after the restart");
  json_decref(after);
  json_decref(before);
  cr_expect_eq(th_stop(&d), 0);
  for (int i = 0; i < N_REQ; i++) free(b[i]);
  free(b);
}

/* Other policies are still accepted and described; a bad one stops
 * start-up with the key named. (No .timeout: libcriterion 2.4.1's runner
 * leaks 48 bytes under ASan when two timed tests overlap; meson's timeout
 * still applies.) */
Test(serve_policy, other_kinds, .fini = teardown) {
  static const char *const fams[] = {"treelstm", NULL};
  th_models(&d, fams);
  th_start(&d, (const char *const[]){"--policy", "sufficient", NULL});
  json_t *p = policy();
  cr_expect_str_eq(json_string_value(json_object_get(p, "kind")),
                   "sufficient");
  json_decref(p);
  json_decref(infer("{\"instances\":[{\"tree\":\"(3 (2 a) (4 b))\"}]}"));
  cr_expect_eq(th_stop(&d), 0);
  char cmd[700];
  snprintf(cmd, sizeof(cmd),
           "%s serve --models-dir %s/models --policy fsm9 2>&1 | grep -q "
           "policy",
           th_bin(), d.dir);
  cr_expect_eq(system(cmd), 0, "a bad policy must name the key");
}

/* A FIFO at the model's policy file: start-up would block for ever
 * opening it, with nothing logged. It is refused as /dev/zero or a
 * directory there is: the policy-not-cached warning, agenda, ready. */
Test(serve_policy, fifo_policy_file_does_not_block_startup,
     .fini = teardown, .timeout = 60) {
  static const char *const fams[] = {"treelstm", NULL};
  th_models(&d, fams);
  char cache[400];
  snprintf(cache, sizeof(cache), "%s/policy-cache", d.dir);
  const char *const flags[] = {"--policy", "fsm", "--policy-cache", cache,
                               "--retrain-interval-s", "0", NULL};
  th_start(&d, flags); /* an empty cache: the warning names the file */
  char *log = th_read_file(d.log);
  cr_assert_not_null(log);
  char *at = strstr(log, "msg=policy-not-cached");
  cr_assert_not_null(at, "%s", log);
  at = strstr(at, "file=\"");
  cr_assert_not_null(at, "%s", log);
  char file[600];
  size_t n = strcspn(at + 6, "\"");
  cr_assert_lt(n, sizeof(file));
  memcpy(file, at + 6, n);
  file[n] = '\0';
  free(log);
  cr_expect_eq(th_stop(&d), 0);
  mkdir(cache, 0755);
  cr_assert_eq(mkfifo(file, 0644), 0, "%s", file);
  th_start(&d, flags); /* asserts it comes up */
  json_t *p = policy();
  cr_expect_str_eq(source(p), "agenda-fallback");
  json_decref(p);
  log = th_read_file(d.log);
  cr_expect(log && strstr(log, "msg=policy-not-cached") &&
                strstr(log, "not a regular file (a FIFO)"),
            "%s", log);
  free(log);
  cr_expect_eq(th_stop(&d), 0);
  unlink(file);
}
