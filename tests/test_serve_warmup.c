/* test_serve_warmup.c - a model version's warm-up before it serves
 * (docs/daemon.md "Warm-up"), end to end on free ports: every worker
 * thread runs its part before the daemon listens (the log line's per-
 * worker times, and each cn-worker thread's own page faults in
 * /proc/PID/task, which a worker that computed nothing does not have); a
 * version whose finite weights overflow at compute fails to load naming
 * the warm-up, at start-up and on a load through the repository routes,
 * where the old version keeps serving; `warmup false` skips it all. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
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

/* Minor page faults of each thread named cn-worker-N of pid (field 10 of
 * /proc/PID/task/TID/stat, per thread); returns how many workers. */
static int worker_faults(pid_t pid, long *faults, int cap) {
  char path[128];
  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  cr_assert(dir != NULL);
  struct dirent *de;
  int n = 0;
  while ((de = readdir(dir)) != NULL) {
    if (de->d_name[0] == '.') continue;
    char p[600], comm[32] = "", stat[1024] = "";
    snprintf(p, sizeof(p), "%s/%s/comm", path, de->d_name);
    FILE *f = fopen(p, "r");
    if (f == NULL) continue;
    if (fgets(comm, sizeof(comm), f) == NULL) comm[0] = '\0';
    fclose(f);
    int idx;
    if (sscanf(comm, "cn-worker-%d", &idx) != 1 || idx < 0 || idx >= cap)
      continue;
    snprintf(p, sizeof(p), "%s/%s/stat", path, de->d_name);
    f = fopen(p, "r");
    cr_assert(f != NULL);
    size_t len = fread(stat, 1, sizeof(stat) - 1, f);
    fclose(f);
    stat[len] = '\0';
    /* after "(comm) ": state ppid pgrp session tty_nr tpgid flags minflt */
    char *q = strrchr(stat, ')');
    cr_assert(q != NULL);
    long v[8];
    cr_assert(sscanf(q + 2, "%*c %ld %ld %ld %ld %ld %ld %ld", &v[0], &v[1],
                     &v[2], &v[3], &v[4], &v[5], &v[6]) == 7);
    faults[idx] = v[6];
    n++;
  }
  closedir(dir);
  return n;
}

/* The log's msg=model-warmed line for model name, or NULL (malloc'd). */
static char *warmed_line(const char *log, const char *name) {
  char *text = th_read_file(log);
  cr_assert(text != NULL);
  char key[160];
  snprintf(key, sizeof(key), "msg=model-warmed model=%s ", name);
  char *at = strstr(text, key), *line = NULL;
  if (at != NULL) {
    char *end = strchr(at, '\n');
    line = strndup(at, end ? (size_t)(end - at) : strlen(at));
  }
  free(text);
  return line;
}

/* Writes out.W = +3.4e38 everywhere and out.b = +3.4e38, -3.4e38, ...
 * into a treelstm's weights: finite (the loader's check passes), but
 * logit 0 is 3.4e38 (sum(h) + 1) and logit 1 is 3.4e38 (sum(h) - 1), so
 * one of them overflows for every input whose h does not sum to 0. */
static void overflow_weights(const char *dir) {
  char path[600];
  snprintf(path, sizeof(path), "%s/weights.safetensors", dir);
  FILE *f = fopen(path, "r+b");
  cr_assert(f != NULL, "%s", path);
  uint64_t hlen;
  cr_assert(fread(&hlen, 8, 1, f) == 1);
  char *h = calloc(1, hlen + 1);
  cr_assert(fread(h, 1, hlen, f) == hlen);
  json_t *hdr = json_loads(h, 0, NULL);
  cr_assert(hdr != NULL);
  static const char *const names[] = {"out.W", "out.b"};
  for (int i = 0; i < 2; i++) {
    json_t *off = json_object_get(json_object_get(hdr, names[i]),
                                  "data_offsets");
    cr_assert(json_array_size(off) == 2, "%s", names[i]);
    long b = (long)json_integer_value(json_array_get(off, 0));
    long e = (long)json_integer_value(json_array_get(off, 1));
    cr_assert(fseek(f, 8 + (long)hlen + b, SEEK_SET) == 0);
    for (long o = b, k = 0; o < e; o += 4, k++) {
      float v = i == 1 && k % 2 == 1 ? -3.4e38f : 3.4e38f;
      fwrite(&v, 4, 1, f);
    }
  }
  json_decref(hdr);
  free(h);
  cr_assert(fclose(f) == 0);
}

/* The repository index entry of name (a new reference), or NULL. */
static json_t *index_entry(int port, const char *name) {
  th_resp r;
  cr_assert(th_http(port, "POST", "/v2/repository/index", "{}", NULL,
                    &r) == 0);
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *a = json_loads(r.body, 0, NULL), *v, *out = NULL;
  size_t i;
  json_array_foreach(a, i, v)
    if (strcmp(json_string_value(json_object_get(v, "name")), name) == 0)
      out = json_incref(v);
  json_decref(a);
  th_resp_free(&r);
  return out;
}

Test(warmup, runs_on_every_worker_before_ready, .fini = teardown,
     .timeout = 60) {
  th_models(&d, tree_only);
  const char *const fl[] = {"--workers", "3", "--log-level", "info", NULL};
  th_start(&d, fl);
  /* each worker wrote its own time into the line */
  char *line = warmed_line(d.log, "treelstm");
  cr_assert(line != NULL, "no msg=model-warmed line; see %s", d.log);
  cr_expect(strstr(line, " workers=3 ") != NULL, "%s", line);
  char *ms = strstr(line, "worker_ms=");
  cr_assert(ms != NULL, "%s", line);
  double a, b, c;
  cr_expect(sscanf(ms, "worker_ms=%lf,%lf,%lf", &a, &b, &c) == 3, "%s", line);
  cr_expect(a > 0 && b > 0 && c > 0, "%s", line);
  /* the line comes before the daemon listens (th_start waited for it) */
  char *text = th_read_file(d.log);
  char *w = strstr(text, "msg=model-warmed"), *ready = strstr(text,
                                                              "msg=ready");
  cr_expect(w != NULL && ready != NULL && w < ready);
  free(text);
  free(line);
  /* and each worker thread touched its own pages: OpenBLAS buffers, its
   * malloc arena, a run arena. A worker that only waited has a handful
   * of faults (its stack): the daemon below with warmup false. */
  long on[3] = {-1, -1, -1};
  cr_assert_eq(worker_faults(d.pid, on, 3), 3);
  th_daemon off;
  memcpy(&off, &d, sizeof(off));
  const char *const fl_off[] = {"--workers", "3", "--warmup", "false", NULL};
  th_start(&off, fl_off);
  /* without warm-up the daemon may be ready before every worker thread
   * has named itself (worker.c names it from inside): wait for it */
  long idle[3] = {-1, -1, -1};
  int named = 0;
  for (double end = th_now() + TH_DEADLINE_S;
       th_now() < end && (named = worker_faults(off.pid, idle, 3)) < 3;)
    usleep(10000);
  cr_assert_eq(named, 3);
  long most = 0;
  for (int i = 0; i < 3; i++) most = idle[i] > most ? idle[i] : most;
  for (int i = 0; i < 3; i++)
    cr_expect(on[i] > most + 10, "worker %d: %ld page faults with warm-up, "
              "an idle worker %ld", i, on[i], most);
  cr_expect_eq(th_stop(&off), 0);
  cr_expect_eq(th_stop(&d), 0);
}

/* The daemon with two workers and strict-startup false over a treelstm
 * whose weights overflow: starts it and returns treelstm's entry of the
 * repository index, checked UNAVAILABLE (the caller frees it). */
static const char *const lenient[] = {"--workers", "2", "--strict-startup",
                                      "false", NULL};
static json_t *start_expect_unavailable(void) {
  th_start(&d, lenient);
  json_t *e = index_entry(d.port, "treelstm");
  cr_assert(e != NULL);
  cr_expect_str_eq(json_string_value(json_object_get(e, "state")),
                   "UNAVAILABLE");
  return e;
}

Test(warmup, overflowing_model_fails_to_load, .fini = teardown,
     .timeout = 60) {
  static const char *const two[] = {"treelstm", "treegru", NULL};
  th_models(&d, two);
  char dir[400];
  snprintf(dir, sizeof(dir), "%s/models/treelstm", d.dir);
  overflow_weights(dir);
  /* strict-startup (the default): start-up stops, naming the warm-up */
  char cmd[1200];
  snprintf(cmd, sizeof(cmd), "timeout 30 %s serve --port 0 --models-dir "
           "%s/models --workers 2 >%s/strict.log 2>&1", th_bin(), d.dir,
           d.dir);
  int st = system(cmd);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
  snprintf(cmd, sizeof(cmd), "%s/strict.log", d.dir);
  char *log = th_read_file(cmd);
  cr_expect(strstr(log, "canopy serve: model treelstm: warm-up on worker") !=
                NULL, "%s", log);
  cr_expect(strstr(log, "non-finite") != NULL, "%s", log);
  free(log);
  /* strict-startup false: UNAVAILABLE with the reason, the other serves */
  json_t *e = start_expect_unavailable();
  const char *why = json_string_value(json_object_get(e, "reason"));
  cr_expect(why != NULL && strstr(why, "warm-up on worker") != NULL &&
                strstr(why, "non-finite") != NULL, "%s", why ? why : "-");
  json_decref(e);
  th_resp r;
  cr_assert(th_http(d.port, "POST", "/v1/models/treegru/infer", ONE, NULL,
                    &r) == 0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  th_resp_free(&r);
  cr_assert(th_http(d.port, "POST", "/v1/models/treelstm/infer", ONE, NULL,
                    &r) == 0);
  cr_expect_eq(r.status, 404, "%s", r.body);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}

Test(warmup, overflowing_version_never_replaces_the_serving_one,
     .fini = teardown, .timeout = 60) {
  th_models(&d, tree_only);
  const char *const fl[] = {"--workers", "2", "--model-control", "explicit",
                            NULL};
  th_start(&d, fl);
  th_resp r;
  cr_assert(th_http(d.port, "POST", "/v1/models/treelstm/infer", ONE, NULL,
                    &r) == 0);
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *a = json_loads(r.body, 0, NULL);
  char version[80];
  snprintf(version, sizeof(version), "%s",
           json_string_value(json_object_get(a, "model_version")));
  json_decref(a);
  th_resp_free(&r);
  char dir[400];
  snprintf(dir, sizeof(dir), "%s/models/treelstm", d.dir);
  overflow_weights(dir);
  cr_assert(th_http(d.port, "POST", "/v2/repository/models/treelstm/load",
                    "{}", NULL, &r) == 0);
  cr_expect_geq(r.status, 400, "%s", r.body);
  cr_expect(strstr(r.body, "warm-up on worker") != NULL, "%s", r.body);
  th_resp_free(&r);
  json_t *e = index_entry(d.port, "treelstm");
  cr_assert(e != NULL);
  cr_expect_str_eq(json_string_value(json_object_get(e, "state")), "READY");
  cr_expect_str_eq(json_string_value(json_object_get(e, "version")), version);
  const char *why = json_string_value(json_object_get(e, "reason"));
  cr_expect(why != NULL && strstr(why, "warm-up") != NULL, "%s",
            why ? why : "-");
  json_decref(e);
  cr_assert(th_http(d.port, "POST", "/v1/models/treelstm/infer", ONE, NULL,
                    &r) == 0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  cr_expect(strstr(r.body, version) != NULL, "%s", r.body);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}

Test(warmup, key_off_skips_it, .fini = teardown, .timeout = 60) {
  th_models(&d, tree_only);
  char dir[400];
  snprintf(dir, sizeof(dir), "%s/models/treelstm", d.dir);
  overflow_weights(dir);
  /* on (the default), the warm-up refuses the version */
  json_t *e = start_expect_unavailable();
  json_decref(e);
  cr_expect_eq(th_stop(&d), 0);
  /* off, in the environment form a container would set: nothing runs, the
   * overflowing version loads */
  setenv("CANOPY_WARMUP", "false", 1);
  th_start(&d, lenient);
  unsetenv("CANOPY_WARMUP");
  char *line = warmed_line(d.log, "treelstm");
  cr_expect(line == NULL, "%s", line);
  free(line);
  e = index_entry(d.port, "treelstm");
  cr_assert(e != NULL);
  cr_expect_str_eq(json_string_value(json_object_get(e, "state")), "READY");
  json_decref(e);
  /* requests are where the overflow shows (outputs all: every node) */
  th_resp r;
  cr_assert(th_http(d.port, "POST", "/v1/models/treelstm/infer",
                    "{\"tree\": \"(3 (2 a) (2 b))\", \"outputs\": \"all\"}",
                    NULL, &r) == 0);
  cr_expect_eq(r.status, 500, "%s", r.body);
  cr_expect(strstr(r.body, "non_finite") != NULL, "%s", r.body);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}
