/* test_serve_repo.c - the model repository under attack and under races,
 * end to end against the real daemon with
 * --model-control explicit: loads bounded and joined, unload cancelling a
 * load, a SIGHUP during a load not lost, slots freed, names escaped in
 * /metrics and the log, the routes guarded off loopback, and the signals
 * a daemon meets at start-up. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "logfmt_test_util.h"
#include "serve_harness.h"

static th_daemon d;
static const char *const tree_only[] = {"treelstm", NULL};

static void teardown(void) { th_cleanup(&d); }

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[2048];
  snprintf(cmd, sizeof(cmd), fmt, a, b);
  cr_assert(system(cmd) == 0, "%s", cmd);
}

/* models/<name>: a copy of treelstm whose weights file holds one more
 * tensor, 128 MiB of zeros the family does not read: its load reads and
 * hashes them (a few hundred ms), then serves. (Zeros past the tensors
 * would be bytes in no tensor: refused, and never read.) */
static void slow_model(const char *name) {
  char dst[512], w[600];
  snprintf(dst, sizeof(dst), "%s/models/%s", d.dir, name);
  sh("cp -r %s/models/treelstm %s", d.dir, dst);
  snprintf(w, sizeof(w), "%s/weights.safetensors", dst);
  FILE *f = fopen(w, "rb");
  cr_assert_not_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  rewind(f);
  unsigned char *buf = malloc((size_t)size);
  cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  unsigned long long hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | buf[i];
  json_t *hdr = json_loadb((const char *)buf + 8, hl, 0, NULL);
  cr_assert_not_null(hdr);
  json_int_t data = (json_int_t)(size - 8 - (long)hl), pad = 128 << 20;
  json_object_set_new(hdr, "zz.pad", json_pack("{s:s, s:[I], s:[I, I]}",
                                               "dtype", "F32", "shape",
                                               pad / 4, "data_offsets", data,
                                               data + pad));
  char *text = json_dumps(hdr, JSON_COMPACT);
  size_t tl = strlen(text), spaces = (8 - (8 + tl) % 8) % 8;
  f = fopen(w, "wb");
  cr_assert_not_null(f);
  unsigned char lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((tl + spaces) >> (8 * i));
  fwrite(lenb, 1, 8, f);
  fwrite(text, 1, tl, f);
  for (size_t i = 0; i < spaces; i++) fputc(' ', f);
  fwrite(buf + 8 + hl, 1, (size_t)data, f);
  cr_assert_eq(fclose(f), 0);
  cr_assert_eq(truncate(w, (off_t)(8 + tl + spaces) + data + pad), 0);
  free(text);
  json_decref(hdr);
  free(buf);
}

static double loads(const char *model, const char *result) {
  char s[256];
  snprintf(s, sizeof(s), "canopy_model_loads_total{model=\"%s\",result=\"%s\"}",
           model, result);
  return th_metric_at(d.port, s);
}

static void post(int fd, const char *model, const char *what) {
  char path[256];
  snprintf(path, sizeof(path), "/v2/repository/models/%s/%s", model, what);
  th_send(fd, "POST", path, NULL, NULL);
}

/* One load per model in flight: three requests for slow share one load
 * (one more failure counted, not three); a load of another model beyond
 * max-loads 1 gets 429. */
Test(repo, loads_join_and_are_bounded, .fini = teardown, .timeout = 90) {
  th_models(&d, tree_only);
  slow_model("slow");
  slow_model("slow2");
  const char *flags[] = {"--model-control", "explicit", "--max-loads", "1",
                         "--strict-startup", "false", NULL};
  th_start(&d, flags);
  double before = loads("slow", "ok");
  cr_assert_eq(before, 1, "%g", before); /* at start-up */
  int fd[4];
  for (int i = 0; i < 4; i++) cr_assert((fd[i] = th_connect(d.port)) >= 0);
  for (int i = 0; i < 3; i++) post(fd[i], "slow", "load");
  post(fd[3], "slow2", "load");
  th_resp r;
  cr_assert_eq(th_read(fd[3], &r), 0);
  cr_expect_eq(r.status, 429, "a second model's load beyond max-loads: %d %s",
               r.status, r.body);
  th_resp_free(&r);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(th_read(fd[i], &r), 0);
    cr_expect_eq(r.status, 200, "%d %s", r.status, r.body);
    th_resp_free(&r);
    close(fd[i]);
  }
  close(fd[3]);
  cr_expect_eq(loads("slow", "ok"), before + 1,
               "three requests made more than one load");
  cr_expect_eq(th_stop(&d), 0);
}

/* An unload while a load is in flight cancels it: UNLOADED at once, the
 * load's request is told, and its result is discarded (the model stays
 * UNLOADED, no second load counted). */
Test(repo, unload_cancels_a_load_in_flight, .fini = teardown,
     .timeout = 90) {
  th_models(&d, tree_only);
  slow_model("slow");
  const char *flags[] = {"--model-control", "explicit", "--strict-startup",
                         "false", NULL};
  th_start(&d, flags);
  int a = th_connect(d.port);
  post(a, "slow", "load");
  th_log_wait(&d, "msg=model-loading model=slow ", 1);
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", "/v2/repository/models/slow/unload",
                       NULL, NULL, &r), 0);
  cr_expect_eq(r.status, 200, "%d %s", r.status, r.body);
  cr_expect(strstr(r.body, "UNLOADED") != NULL, "%s", r.body);
  th_resp_free(&r);
  cr_assert_eq(th_read(a, &r), 0);
  cr_expect_eq(r.status, 503, "%d %s", r.status, r.body);
  cr_expect(strstr(r.body, "unloaded while it loaded") != NULL, "%s", r.body);
  th_resp_free(&r);
  close(a);
  th_log_wait(&d, "msg=model-load-discarded model=slow ", 1);
  cr_assert_eq(th_http(d.port, "POST", "/v2/repository/index", NULL, NULL,
                       &r), 0);
  cr_expect(strstr(r.body, "{\"name\":\"slow\",\"state\":\"UNLOADED\"") !=
                NULL, "%s", r.body);
  th_resp_free(&r);
  cr_expect_eq(loads("slow", "ok"), 1, "the discarded load counted: %g",
               loads("slow", "ok"));
  cr_expect_eq(th_stop(&d), 0);
}

/* A SIGHUP while a model loads is not lost: the slot is looked at once
 * more when the load ends, and the version now in the directory serves. */
Test(repo, sighup_during_a_load_is_not_lost, .fini = teardown,
     .timeout = 90) {
  th_models(&d, tree_only);
  char v1[512], v2[512], m[512];
  snprintf(v1, sizeof(v1), "%s/v1", d.dir);
  snprintf(v2, sizeof(v2), "%s/v2", d.dir);
  snprintf(m, sizeof(m), "%s/models/m", d.dir);
  sh("cp -r %s/models/treelstm %s", d.dir, v1);
  sh("cp -r %s/models/treelstm %s", d.dir, v2);
  /* v1 loads slowly (a 48 MB model.json string); v2 is version "two" */
  sh("python3 -c \"import json,sys; p=sys.argv[1]+'/model.json'; "
     "j=json.load(open(p)); j['version']='one'; j['pad']='x'*(48<<20); "
     "json.dump(j,open(p,'w'))\" %s%s", v1, "");
  sh("python3 -c \"import json,sys; p=sys.argv[1]+'/model.json'; "
     "j=json.load(open(p)); j['version']='two'; "
     "json.dump(j,open(p,'w'))\" %s%s", v2, "");
  const char *flags[] = {"--model-control", "explicit", NULL};
  th_start(&d, flags);
  sh("ln -s %s %s", v1, m);
  int a = th_connect(d.port);
  post(a, "m", "load");
  th_log_wait(&d, "msg=model-loading model=m ", 1);
  /* the directory changes to v2 and SIGHUP comes while v1 loads */
  char cmd[2200];
  snprintf(cmd, sizeof(cmd), "ln -sfn %s %s.new && mv -T %s.new %s", v2, m,
           m, m);
  cr_assert(system(cmd) == 0, "%s", cmd);
  kill(d.pid, SIGHUP);
  th_resp r;
  cr_assert_eq(th_read(a, &r), 0);
  th_resp_free(&r);
  close(a);
  bool two = false;
  for (double end = th_now() + TH_DEADLINE_S; th_now() < end && !two;) {
    cr_assert_eq(th_http(d.port, "GET", "/v2/models/m/ready", NULL, NULL,
                         &r), 0);
    two = r.status == 200 && strstr(r.body, "\"version\":\"two\"") != NULL;
    th_resp_free(&r);
    if (!two) usleep(20000);
  }
  cr_expect(two, "the SIGHUP during the load was lost: v1 serves for good");
  cr_expect_eq(th_stop(&d), 0);
}

/* Slots are freed: a model unloaded whose directory is gone frees its
 * slot, so 300 names over the daemon's life load (the bound is 256 live
 * models); before, the 257th name got 413 for good. */
Test(repo, slots_are_freed_for_new_names, .fini = teardown,
     .timeout = 120) {
  th_models(&d, tree_only);
  const char *flags[] = {"--model-control", "explicit", "--warmup", "false",
                         NULL};
  th_start(&d, flags);
  for (int i = 0; i < 300; i++) {
    char name[64], link[512], path[256], target[512];
    snprintf(name, sizeof(name), "n%03d", i);
    snprintf(link, sizeof(link), "%s/models/%s", d.dir, name);
    snprintf(target, sizeof(target), "%s/models/treelstm", d.dir);
    cr_assert_eq(symlink(target, link), 0);
    th_resp r;
    snprintf(path, sizeof(path), "/v2/repository/models/%s/load", name);
    cr_assert_eq(th_http(d.port, "POST", path, NULL, NULL, &r), 0);
    cr_assert_eq(r.status, 200, "load %d: %d %s", i, r.status, r.body);
    th_resp_free(&r);
    cr_assert_eq(unlink(link), 0);
    snprintf(path, sizeof(path), "/v2/repository/models/%s/unload", name);
    cr_assert_eq(th_http(d.port, "POST", path, NULL, NULL, &r), 0);
    cr_assert_eq(r.status, 200, "unload %d: %d %s", i, r.status, r.body);
    th_resp_free(&r);
  }
  cr_expect_eq(th_stop(&d), 0);
}

/* Label values are escaped (Prometheus text format: backslash, quote,
 * newline); a directory whose name holds a control character is refused
 * with a reason, and its log line stays one line. */
Test(repo, names_escaped_in_metrics_and_log, .fini = teardown,
     .timeout = 60) {
  th_models(&d, tree_only);
  sh("cp -r %s/models/treelstm '%s/models/q\"x'", d.dir, d.dir);
  sh("cp -r %s/models/treelstm '%s/models/a\\b'", d.dir, d.dir);
  char nl[512];
  snprintf(nl, sizeof(nl), "%s/models/l\nm", d.dir);
  char src[512];
  snprintf(src, sizeof(src), "%s/models/treelstm", d.dir);
  cr_assert_eq(symlink(src, nl), 0);
  const char *flags[] = {"--strict-startup", "false", NULL};
  th_start(&d, flags);
  th_resp r;
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  cr_expect(strstr(r.body, "canopy_model_ready{model=\"q\\\"x\",") != NULL,
            "%s", r.body);
  cr_expect(strstr(r.body, "canopy_model_ready{model=\"a\\\\b\",") != NULL,
            "%s", r.body);
  cr_expect(strstr(r.body, "model=\"q\"x\"") == NULL, "unescaped quote");
  /* every line is a comment or `name{...} value` */
  for (char *line = strtok(r.body, "\n"); line; line = strtok(NULL, "\n"))
    cr_expect(line[0] == '#' || strncmp(line, "canopy_", 7) == 0,
              "a line that is not a sample: %s", line);
  th_resp_free(&r);
  cr_assert_eq(th_http(d.port, "POST", "/v2/repository/index", NULL, NULL,
                       &r), 0);
  cr_expect(strstr(r.body, "control character (byte 0x0a)") != NULL, "%s",
            r.body);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
  char *log = th_read_file(d.log);
  cr_assert_not_null(log);
  cr_expect(strstr(log, "model=\"l\\nm\"") != NULL, "%s", log);
  for (char *p = strchr(log, '\n'); p && p[1]; p = strchr(p + 1, '\n'))
    cr_expect(strncmp(p + 1, "ts=", 3) == 0, "a log line split: %.80s", p + 1);
  free(log);
}

/* Every line of the log is one logfmt record with one msg and one level
 * (a value could once add fields: "version=v1 msg=injected level=error"). */
static void log_is_logfmt(char *log) {
  for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
    int n_msg, n_level;
    int pairs = tu_logfmt_pairs(line, &n_msg, &n_level);
    cr_expect(pairs > 0 && n_msg == 1 && n_level == 1,
              "not one logfmt record (%d pairs, %d msg, %d level): %s",
              pairs, n_msg, n_level, line);
  }
}

/* Is every byte of s (n bytes) ASCII? */
static bool ascii(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] >= 0x80) return false;
  return true;
}

/* A directory whose name is not UTF-8 is refused as one with a control
 * character is: UNAVAILABLE in the index, its name and reason there as
 * JSON strings (the entry once had no name), one error log line, and no
 * series in /metrics, which stays valid for promtool (Prometheus once
 * dropped every series of the scrape); a load of such a name is 400. A
 * name with a space and a version with a newline and fields of its own
 * are each one quoted value of one log line. */
Test(repo, names_not_utf8_refused_and_log_values_quoted, .fini = teardown,
     .timeout = 60) {
  th_models(&d, tree_only);
  sh("cp -r %s/models/treelstm '%s/models/bad\xff\xfename'", d.dir, d.dir);
  sh("cp -r %s/models/treelstm '%s/models/sp ace'", d.dir, d.dir);
  sh("cp -r %s/models/treelstm %s/models/injected", d.dir, d.dir);
  char mj[600];
  snprintf(mj, sizeof(mj), "%s/models/injected/model.json", d.dir);
  json_error_t je;
  json_t *j = json_load_file(mj, 0, &je);
  cr_assert_not_null(j, "%s", je.text);
  json_object_set_new(j, "version",
                      json_string("v1\nmsg=injected level=error"));
  cr_assert_eq(json_dump_file(j, mj, JSON_INDENT(2)), 0);
  json_decref(j);
  const char *flags[] = {"--strict-startup", "false", "--model-control",
                         "explicit", NULL};
  th_start(&d, flags);
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", "/v2/repository/index", NULL, NULL,
                       &r), 0);
  json_t *idx = json_loads(r.body, 0, &je);
  cr_assert_not_null(idx, "%s", r.body);
  json_t *e, *bad = NULL;
  size_t i;
  json_array_foreach(idx, i, e) {
    const char *name = json_string_value(json_object_get(e, "name"));
    cr_expect_not_null(name, "an entry without a name: %s", r.body);
    if (name != NULL && strncmp(name, "bad", 3) == 0) bad = e;
  }
  cr_assert_not_null(bad, "%s", r.body);
  cr_expect_str_eq(json_string_value(json_object_get(bad, "name")),
                   "bad\\xff\\xfename");
  cr_expect_str_eq(json_string_value(json_object_get(bad, "state")),
                   "UNAVAILABLE");
  const char *why = json_string_value(json_object_get(bad, "reason"));
  cr_expect(why != NULL &&
                strstr(why, "is not UTF-8 (byte 0xff at offset 3)") != NULL,
            "%s", r.body);
  json_decref(idx);
  th_resp_free(&r);
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  cr_expect(ascii(r.body, r.body_len), "a byte that is not ASCII");
  cr_expect(th_metric(r.body, "canopy_model_ready{model=\"sp ace\","
                              "version=\"c1a197539d7d\"}") >= 0 ||
                strstr(r.body, "canopy_model_ready{model=\"sp ace\"") != NULL,
            "%s", r.body);
  if (system("command -v promtool >/dev/null") == 0) {
    char path[400], cmd[900];
    snprintf(path, sizeof(path), "%s/metrics.txt", d.dir);
    FILE *f = fopen(path, "w");
    fwrite(r.body, 1, r.body_len, f);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s > %s.out 2>&1",
             path, path);
    cr_expect_eq(system(cmd), 0, "promtool check metrics failed (%s.out)",
                 path);
  }
  th_resp_free(&r);
  cr_assert_eq(th_http(d.port, "POST", "/v2/repository/models/bad%FF/load",
                       NULL, NULL, &r), 0);
  cr_expect_eq(r.status, 400, "%d %s", r.status, r.body);
  cr_expect(strstr(r.body, "is not UTF-8 (byte 0xff at offset 3)") != NULL,
            "%s", r.body);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
  char *log = th_read_file(d.log);
  cr_assert_not_null(log);
  cr_expect(strstr(log, "msg=model-load-failed model=\"bad\\xff\\xfename\" "
                        "error=\"the directory's name is not UTF-8") != NULL,
            "%s", log);
  cr_expect(strstr(log, "msg=model-loaded model=\"sp ace\" ") != NULL, "%s",
            log);
  cr_expect(strstr(log, "msg=model-loaded model=injected "
                        "version=\"v1\\nmsg=injected level=error\" ") != NULL,
            "%s", log);
  log_is_logfmt(log);
  free(log);
}

/* With no repository-token on a non-loopback host the load and unload
 * routes answer 403 (anyone on the network could load models), unless
 * repository-insecure; the start-up log says which. */
Test(repo, routes_need_a_token_off_loopback, .fini = teardown,
     .timeout = 60) {
  th_models(&d, tree_only);
  const char *flags[] = {"--model-control", "explicit", "--host", "0.0.0.0",
                         NULL};
  th_start(&d, flags);
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST",
                       "/v2/repository/models/treelstm/load", NULL, NULL,
                       &r), 0);
  cr_expect_eq(r.status, 403, "%d %s", r.status, r.body);
  cr_expect(strstr(r.body, "repository-token") != NULL, "%s", r.body);
  th_resp_free(&r);
  cr_assert_eq(th_http(d.port, "POST", "/v2/repository/index", NULL, NULL,
                       &r), 0);
  cr_expect_eq(r.status, 200, "the index only reads");
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
  char *log = th_read_file(d.log);
  cr_expect(strstr(log, "msg=repository-routes state=refused") != NULL);
  free(log);
  const char *insecure[] = {"--model-control", "explicit", "--host",
                            "0.0.0.0", "--repository-insecure", "true",
                            NULL};
  th_start(&d, insecure);
  cr_assert_eq(th_http(d.port, "POST",
                       "/v2/repository/models/treelstm/load", NULL, NULL,
                       &r), 0);
  cr_expect_eq(r.status, 200, "%d %s", r.status, r.body);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}

/* SIGPIPE during start-up (its stderr a pipe nobody reads) does not
 * kill the daemon (141 by default); SIGUSR1 and SIGUSR2 are ignored. */
Test(repo, sigpipe_at_startup_and_sigusr_do_not_kill, .fini = teardown,
     .timeout = 60) {
  th_models(&d, tree_only);
  int p[2];
  cr_assert_eq(pipe(p), 0);
  close(p[0]); /* every write to it is EPIPE, or SIGPIPE */
  d.port = 0;
  char models[300];
  snprintf(models, sizeof(models), "%s/models", d.dir);
  /* a free port: bind one and let it go */
  th_daemon probe = d;
  th_start(&probe, NULL);
  int port = probe.port;
  th_stop(&probe);
  char ps[16];
  snprintf(ps, sizeof(ps), "%d", port);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 2);
    execl(th_bin(), th_bin(), "serve", "--port", ps, "--models-dir", models,
          (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  d.pid = pid;
  d.port = port;
  bool up = false;
  for (double end = th_now() + TH_DEADLINE_S; th_now() < end && !up;) {
    th_resp r;
    if (th_http(port, "GET", "/healthz", NULL, NULL, &r) == 0) {
      up = true;
      th_resp_free(&r);
      break;
    }
    int st;
    cr_assert(waitpid(pid, &st, WNOHANG) == 0,
              "the daemon died at start-up: %s %d",
              WIFSIGNALED(st) ? "signal" : "exit",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    usleep(10000);
  }
  cr_assert(up);
  /* no wait: a signal's default action (exit) would be taken no later
   * than the SIGTERM sent after it, and th_stop's status 0 says it was
   * not */
  kill(pid, SIGUSR1);
  kill(pid, SIGUSR2);
  th_resp r;
  cr_expect_eq(th_http(port, "GET", "/healthz", NULL, NULL, &r), 0,
               "SIGUSR1/2 stopped the daemon");
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}

/* A subdirectory the daemon cannot read is reported, not
 * skipped in silence: its model.json a dangling symbolic link or a link
 * loop (and, when not root, a 0700 directory of another mode's making:
 * chmod 000), each in the log with its path and reason, UNAVAILABLE with
 * a reason in the index, and a start-up failure under strict-startup. A
 * directory with no model.json at all is a warning in the log only. */
Test(repo, unreadable_directories_reported, .fini = teardown,
     .timeout = 60) {
  th_models(&d, tree_only);
  char p[600];
  snprintf(p, sizeof(p), "%s/models/dangling", d.dir);
  cr_assert_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof(p), "%s/models/dangling/model.json", d.dir);
  cr_assert_eq(symlink("gone.json", p), 0);
  snprintf(p, sizeof(p), "%s/models/loop", d.dir);
  cr_assert_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof(p), "%s/models/loop/model.json", d.dir);
  cr_assert_eq(symlink("model.json", p), 0);
  snprintf(p, sizeof(p), "%s/models/empty", d.dir);
  cr_assert_eq(mkdir(p, 0755), 0);
  bool root = geteuid() == 0; /* root enters a 000 directory */
  if (!root) {
    sh("cp -r %s/models/treelstm %s/models/private", d.dir, d.dir);
    sh("chmod 000 %s/models/private%s", d.dir, "");
  }
  /* strict-startup (the default): start-up fails naming the directory */
  char cmd[1200], err[400];
  snprintf(err, sizeof(err), "%s/strict.err", d.dir);
  snprintf(cmd, sizeof(cmd), "timeout 30 %s serve --models-dir %s/models "
           "--port 0 2>%s", th_bin(), d.dir, err);
  int st = system(cmd);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
  char *e = th_read_file(err);
  cr_assert_not_null(e);
  cr_expect(strstr(e, "the directory 'dangling'") != NULL, "%s", e);
  cr_expect(strstr(e, "strict-startup false") != NULL, "%s", e);
  free(e);
  const char *flags[] = {"--strict-startup", "false", NULL};
  th_start(&d, flags);
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", "/v2/repository/index", NULL, NULL,
                       &r), 0);
  json_error_t je;
  json_t *idx = json_loads(r.body, 0, &je);
  cr_assert_not_null(idx, "%s", r.body);
  const char *want[] = {"dangling", "loop", root ? NULL : "private", NULL};
  for (int w = 0; want[w] != NULL; w++) {
    json_t *hit = NULL, *o;
    size_t i;
    json_array_foreach(idx, i, o) {
      if (strcmp(json_string_value(json_object_get(o, "name")), want[w]) == 0)
        hit = o;
    }
    cr_assert_not_null(hit, "%s not in the index: %s", want[w], r.body);
    cr_expect_str_eq(json_string_value(json_object_get(hit, "state")),
                     "UNAVAILABLE");
    const char *why = json_string_value(json_object_get(hit, "reason"));
    cr_expect(why != NULL && strstr(why, "cannot read") != NULL &&
              strstr(why, want[w]) != NULL, "%s: %s", want[w], why);
  }
  cr_expect(strstr(r.body, "\"empty\"") == NULL, "%s", r.body);
  cr_expect(strstr(r.body, "Too many levels of symbolic links") != NULL,
            "%s", r.body);
  cr_expect(strstr(r.body, "a symbolic link to nothing") != NULL, "%s",
            r.body);
  json_decref(idx);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
  if (!root) sh("chmod 755 %s/models/private%s", d.dir, "");
  char *log = th_read_file(d.log);
  cr_assert_not_null(log);
  cr_expect(strstr(log, "level=warn msg=not-a-model model=empty") != NULL,
            "%s", log);
  cr_expect(strstr(log, "models/loop/model.json") != NULL, "%s", log);
  cr_expect(strstr(log, "msg=model-load-failed model=dangling") != NULL,
            "%s", log);
  free(log);
}
