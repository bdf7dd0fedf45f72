/* test_config.c - the key table, the config file and their agreement:
 * every key appears in config/canopy.conf, the file parses, precedence
 * is defaults < file < environment < flags, errors name the key. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  cr_assert(f != NULL, "cannot open %s", path);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

Test(config, every_key_in_sample) {
  const char *path = getenv("CANOPY_CONF_SAMPLE");
  cr_assert(path != NULL);
  const char *text = slurp(path);
  int n;
  const cn_config_key *k = cn_config_keys(&n);
  for (int i = 0; i < n; i++) {
    char line[128];
    snprintf(line, sizeof(line), "\n%s ", k[i].name);
    char cline[128];
    snprintf(cline, sizeof(cline), "\n# %s ", k[i].name);
    cr_expect(strstr(text, line) != NULL || strstr(text, cline) != NULL,
              "key %s is missing from %s", k[i].name, path);
  }
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  cr_expect_eq(cn_config_load_file(&c, path, &err), 0, "%s", err.msg);
  cn_config dflt;
  cn_config_defaults(&dflt);
  cr_expect(memcmp(&c, &dflt, offsetof(cn_config, from)) == 0,
            "the sample's values are not the defaults");
}

Test(config, precedence_and_errors) {
  char path[] = "/tmp/canopy-conf-XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "w");
  fprintf(f, "# comment\nworkers 3   # trailing\nport 9000\n"
             "host \"0.0.0.0\"\npolicy depth\n");
  fclose(f);
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_config_load_file(&c, path, &err), 0, "%s", err.msg);
  cr_expect_eq(c.serve.workers, 3);
  cr_expect_str_eq(c.serve.host, "0.0.0.0");
  setenv("CANOPY_PORT", "9100", 1);
  cr_assert_eq(cn_config_from_env(&c, &err), 0);
  cr_expect_eq(c.serve.port, 9100);
  cr_assert_eq(cn_config_set(&c, "port", "9200", &err), 0);
  cr_expect_eq(c.serve.port, 9200);
  unsetenv("CANOPY_PORT");
  cr_expect_neq(cn_config_set(&c, "workers", "0", &err), 0);
  cr_expect(strstr(err.msg, "workers") != NULL, "%s", err.msg);
  cr_expect_neq(cn_config_set(&c, "policy", "fsm9", &err), 0);
  cr_expect(strstr(err.msg, "policy") != NULL, "%s", err.msg);
  f = fopen(path, "w");
  fprintf(f, "workers 2\nmax-delay-us lots\n");
  fclose(f);
  cr_expect_neq(cn_config_load_file(&c, path, &err), 0);
  cr_expect(strstr(err.msg, "max-delay-us") != NULL &&
                strstr(err.msg, ":2:") != NULL,
            "%s", err.msg);
  f = fopen(path, "w");
  fprintf(f, "no-such-key 1\n");
  fclose(f);
  cr_expect_neq(cn_config_load_file(&c, path, &err), 0);
  cr_expect(strstr(err.msg, "no-such-key") != NULL, "%s", err.msg);
  remove(path);
}

/* An environment typo (CANOPY_WORKER) stops start-up naming the key, as a
 * config-file typo does; CANOPY_ variables that are nothing like a key
 * (the tests' CANOPY_DATA and CANOPY_BIN) are not Canopy's settings. */
Test(config, environment_typos_are_errors) {
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  setenv("CANOPY_WORKER", "3", 1);
  cr_expect_eq(cn_config_from_env(&c, &err), CN_E_BAD_CONFIG);
  cr_expect(strstr(err.msg, "CANOPY_WORKER") != NULL &&
                strstr(err.msg, "CANOPY_WORKERS") != NULL,
            "%s", err.msg);
  unsetenv("CANOPY_WORKER");
  setenv("CANOPY_MAX_DELAY_MS", "3", 1); /* a unit typo, 1 edit */
  cr_expect_eq(cn_config_from_env(&c, &err), CN_E_BAD_CONFIG);
  cr_expect(strstr(err.msg, "max-delay-us") != NULL, "%s", err.msg);
  unsetenv("CANOPY_MAX_DELAY_MS");
  setenv("CANOPY_DATA", "/tmp", 1);
  setenv("CANOPY_BIN", "/bin/true", 1);
  setenv("CANOPY_URL", "http://x", 1);
  setenv("CANOPY_CUDA_MODULE", "/x.so", 1);
  setenv("CANOPY_WORKERS", "3", 1);
  cr_expect_eq(cn_config_from_env(&c, &err), 0, "%s", err.msg);
  cr_expect_eq(c.serve.workers, 3);
  unsetenv("CANOPY_WORKERS");
}

/* A removed key (http-mode: the MHD front end is gone) is an error naming
 * it as removed, in a file, the environment and cn_config_set, not an
 * unknown key nor silently ignored. */
Test(config, removed_key_says_so) {
  char path[] = "/tmp/canopy-conf-XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "w");
  fprintf(f, "workers 3\nhttp-mode uv-poll\n");
  fclose(f);
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  cr_expect_neq(cn_config_load_file(&c, path, &err), 0);
  cr_expect(strstr(err.msg, "'http-mode' was removed") != NULL, "%s",
            err.msg);
  cr_expect(strstr(err.msg, ":2:") != NULL, "%s", err.msg);
  unlink(path);
  cn_err_clear(&err);
  cr_expect_neq(cn_config_set(&c, "http-mode", "mhd-thread", &err), 0);
  cr_expect(strstr(err.msg, "was removed") != NULL, "%s", err.msg);
  setenv("CANOPY_HTTP_MODE", "mhd-thread", 1);
  cn_err_clear(&err);
  cr_expect_neq(cn_config_from_env(&c, &err), 0);
  cr_expect(strstr(err.msg, "CANOPY_HTTP_MODE") != NULL &&
                strstr(err.msg, "was removed") != NULL,
            "%s", err.msg);
  unsetenv("CANOPY_HTTP_MODE");
  cr_expect_null(cn_config_removed("workers"));
  cr_expect_not_null(cn_config_removed("http-mode"));
}

/* A config file that is a directory was read as an empty file, and the
 * daemon started on the defaults without a word: it is an error, as a
 * missing file is. */
Test(config, directory_is_not_a_config_file) {
  char dir[] = "/tmp/canopy-confdir-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  cr_expect_eq(cn_config_load_file(&c, dir, &err), CN_E_BAD_CONFIG);
  cr_expect(strstr(err.msg, dir) != NULL &&
                strstr(err.msg, "is a directory") != NULL,
            "%s", err.msg);
  rmdir(dir);
}

/* A key set twice (a typo for another key, most likely) is an error
 * naming both lines, not the last line silently winning. */
Test(config, duplicate_key_names_both_lines) {
  char path[] = "/tmp/canopy-conf-XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "w");
  fprintf(f, "workers 3\nport 9000\n# comment\nworkers 4\n");
  fclose(f);
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  cr_expect_eq(cn_config_load_file(&c, path, &err), CN_E_BAD_CONFIG);
  cr_expect(strstr(err.msg, ":4: key 'workers' is set again") != NULL &&
                strstr(err.msg, "line 1") != NULL,
            "%s", err.msg);
  remove(path);
}

/* Spaces around a number, true/false or a choice are dropped at both
 * ends, from every source alike (strtoll skips only leading spaces, so
 * CANOPY_WORKERS=' 3' would be taken and '3 ' refused). */
Test(config, spaces_around_values_trimmed_alike) {
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  const char *vals[] = {" 3", "3 ", " 3\t", "3"};
  for (int i = 0; i < 4; i++) {
    c.serve.workers = 1;
    setenv("CANOPY_WORKERS", vals[i], 1);
    cr_expect_eq(cn_config_from_env(&c, &err), 0, "'%s': %s", vals[i],
                 err.msg);
    cr_expect_eq(c.serve.workers, 3, "env '%s'", vals[i]);
    c.serve.workers = 1;
    cr_expect_eq(cn_config_set(&c, "workers", vals[i], &err), 0, "'%s': %s",
                 vals[i], err.msg);
    cr_expect_eq(c.serve.workers, 3, "flag '%s'", vals[i]);
  }
  unsetenv("CANOPY_WORKERS");
  cr_expect_eq(cn_config_set(&c, "reuse-port", " true ", &err), 0, "%s",
               err.msg);
  cr_expect(c.serve.reuse_port);
  cr_expect_eq(cn_config_set(&c, "policy", "fsm ", &err), 0, "%s", err.msg);
  cr_expect_str_eq(c.serve.policy, "fsm");
  /* what is not a number stays refused, spaces inside included */
  cr_expect_neq(cn_config_set(&c, "workers", "3 4", &err), 0);
  cr_expect_neq(cn_config_set(&c, "workers", "  ", &err), 0);
  cr_expect_neq(cn_config_set(&c, "workers", "3x", &err), 0);
  /* the file: a quoted value with spaces reads as the flag does */
  char path[] = "/tmp/canopy-conf-XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "w");
  fprintf(f, "workers \" 5 \"\nport \"9001 \"\n");
  fclose(f);
  cr_expect_eq(cn_config_load_file(&c, path, &err), 0, "%s", err.msg);
  cr_expect_eq(c.serve.workers, 5);
  cr_expect_eq(c.serve.port, 9001);
  remove(path);
}

/* CANOPY_Workers names a key but is not the variable read (CANOPY_WORKERS):
 * it was silently ignored while an unknown CANOPY_ name is refused. */
Test(config, environment_case_variant_is_an_error) {
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  const char *vars[] = {"CANOPY_Workers", "CANOPY_workers",
                        "CANOPY_MAX_DELAY_us"};
  const char *want[] = {"did you mean CANOPY_WORKERS",
                        "did you mean CANOPY_WORKERS",
                        "did you mean CANOPY_MAX_DELAY_US"};
  for (int i = 0; i < 3; i++) {
    setenv(vars[i], "3", 1);
    cr_expect_eq(cn_config_from_env(&c, &err), CN_E_BAD_CONFIG, "%s",
                 vars[i]);
    cr_expect(strstr(err.msg, vars[i]) != NULL &&
                  strstr(err.msg, want[i]) != NULL,
              "%s: %s", vars[i], err.msg);
    unsetenv(vars[i]);
  }
  setenv("CANOPY_WORKERS", "3", 1);
  cr_expect_eq(cn_config_from_env(&c, &err), 0, "%s", err.msg);
  unsetenv("CANOPY_WORKERS");
}

/* Runs a command; returns its exit status and what it wrote (both
 * streams) in out. */
static int run_cmd(const char *cmd, char *out, size_t cap) {
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p, "%s", cmd);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A flag given twice took the last value silently, while a key set twice
 * in a file is refused: the flag is refused too, in both commands that
 * take keys as flags. */
Test(config, flag_given_twice_is_an_error) {
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  cn_config_flags seen;
  memset(&seen, 0, sizeof(seen));
  cr_expect_eq(cn_config_set_flag(&c, &seen, "workers", "3", &err), 0);
  cr_expect_eq(cn_config_set_flag(&c, &seen, "port", "9000", &err), 0);
  cr_expect_eq(cn_config_set_flag(&c, &seen, "workers", "4", &err),
               CN_E_BAD_CONFIG);
  cr_expect(strstr(err.msg, "--workers is given twice") != NULL, "%s",
            err.msg);
  cr_expect_eq(c.serve.workers, 3);
  const char *bin = getenv("CANOPY_BIN");
  cr_assert_not_null(bin);
  static const char *const cmds[] = {
      "serve --models-dir /nonexistent --port 0 --workers 3 --workers 4",
      "serve --models-dir /nonexistent --port 0 --workers=3 --workers 4",
      "serve --models-dir /nonexistent --config /dev/null --config /dev/null",
      "run --model /nonexistent --input /dev/null --max-nodes 3 "
      "--max-nodes 4",
  };
  for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
    char cmd[512], out[4096];
    snprintf(cmd, sizeof(cmd), "%s %s 2>&1", bin, cmds[i]);
    cr_expect_neq(run_cmd(cmd, out, sizeof(out)), 0, "%s", cmds[i]);
    cr_expect(strstr(out, "is given twice") != NULL, "%s: %s", cmds[i], out);
  }
}

/* A file that a Windows editor saved starts with a UTF-8 byte order mark,
 * which was read as part of the first key ('\ufeffworkers'). */
Test(config, byte_order_mark_is_skipped) {
  char path[] = "/tmp/canopy-conf-XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "w");
  fprintf(f, "\xEF\xBB\xBFworkers 3\nport 9002\n");
  fclose(f);
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  cr_expect_eq(cn_config_load_file(&c, path, &err), 0, "%s", err.msg);
  cr_expect_eq(c.serve.workers, 3);
  cr_expect_eq(c.serve.port, 9002);
  /* only at the start: one on another line is still an unknown key */
  f = fopen(path, "w");
  fprintf(f, "workers 3\n\xEF\xBB\xBFport 9002\n");
  fclose(f);
  cr_expect_eq(cn_config_load_file(&c, path, &err), CN_E_BAD_CONFIG);
  cr_expect(strstr(err.msg, ":2:") != NULL, "%s", err.msg);
  remove(path);
}

/* --print-config prints the effective configuration, each
 * value with where it came from (defaults < file < environment < flags),
 * as a config file that reads back to the same values; the token is not
 * printed. --print-sample-config is the self-documenting sample. */
Test(config, print_config_says_each_source) {
  const char *bin = getenv("CANOPY_BIN");
  cr_assert_not_null(bin);
  char path[] = "/tmp/canopy-conf-XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fprintf(f, "workers 3\n# comment\nmax-delay-us 500\nqueue-depth 7\n"
          "port 9001\n");
  fclose(f);
  char cmd[1024], out[16384];
  snprintf(cmd, sizeof(cmd), "CANOPY_QUEUE_DEPTH=100 CANOPY_PORT=9002 %s "
           "serve --config %s --port 9003 --repository-token s3cr3t "
           "--print-config 2>&1", bin, path);
  cr_assert_eq(run_cmd(cmd, out, sizeof(out)), 0, "%s", out);
  char want[4][256];
  snprintf(want[0], sizeof(want[0]), "\nworkers 3 ");
  snprintf(want[1], sizeof(want[1]), "# config %s:1\n", path);
  cr_expect(strstr(out, want[0]) != NULL, "%s", out);
  cr_expect(strstr(out, want[1]) != NULL, "%s", out);
  static const char *const lines[][2] = {
      {"\nmax-delay-us 500 ", "config "},
      {"\nqueue-depth 100 ", "# environment CANOPY_QUEUE_DEPTH\n"},
      {"\nport 9003 ", "# flag --port\n"},
      {"\nmax-nodes 4096 ", "# default\n"},
      {"\n# repository-token (set, not shown) ", "# flag --repository-token"},
  };
  for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
    const char *l = strstr(out, lines[i][0]);
    cr_expect(l != NULL, "no line '%s' in %s", lines[i][0] + 1, out);
    if (l == NULL) continue;
    const char *eol = strchr(l + 1, '\n');
    const char *src = strstr(l, lines[i][1]);
    cr_expect(src != NULL && eol != NULL && src < eol + 1,
              "line '%s' lacks source '%s'", lines[i][0] + 1, lines[i][1]);
  }
  cr_expect(strstr(out, "s3cr3t") == NULL, "the token was printed");
  /* the output is a config file: it reads back to those values */
  char back[] = "/tmp/canopy-conf-XXXXXX";
  fd = mkstemp(back);
  cr_assert(fd >= 0);
  f = fdopen(fd, "w");
  fputs(out, f);
  fclose(f);
  cn_config c;
  cn_config_defaults(&c);
  cn_err err;
  cn_err_clear(&err);
  cr_expect_eq(cn_config_load_file(&c, back, &err), 0, "%s", err.msg);
  cr_expect_eq(c.serve.workers, 3);
  cr_expect_eq(c.serve.queue_depth, 100);
  cr_expect_eq(c.serve.port, 9003);
  cr_expect_eq(c.serve.max_delay_us, 500);
  unlink(back);
  /* a bad value is still an error, not a printout */
  snprintf(cmd, sizeof(cmd), "CANOPY_WORKERS=lots %s serve --config %s "
           "--print-config 2>&1", bin, path);
  cr_expect_eq(run_cmd(cmd, out, sizeof(out)), 1, "%s", out);
  cr_expect(strstr(out, "CANOPY_WORKERS workers: 'lots'") != NULL, "%s", out);
  unlink(path);
  /* the sample is config/canopy.conf, byte for byte */
  snprintf(cmd, sizeof(cmd), "%s serve --print-sample-config", bin);
  static char sample[65536];
  cr_assert_eq(run_cmd(cmd, sample, sizeof(sample)), 0);
  const char *conf = getenv("CANOPY_CONF_SAMPLE");
  cr_assert_not_null(conf);
  cr_expect_str_eq(sample, slurp(conf), "config/canopy.conf is not "
                   "`canopy serve --print-sample-config`: regenerate it");
}
