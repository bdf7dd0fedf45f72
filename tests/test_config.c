/* test_config.c - the key table, the config file and their agreement:
 * every key appears in config/canopy.conf, the file parses, precedence
 * is defaults < file < environment < flags, errors name the key. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
  cr_expect(memcmp(&c, &dflt, sizeof(c)) == 0,
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
