/* test_log.c - the daemon's log formatter (server/log.c) against a
 * logfmt reader written apart (logfmt_test_util.c) and against printf: a
 * value from outside is quoted and escaped when it needs, whatever it
 * holds; a value quoted by the format is escaped; a literal piece is
 * copied; numbers print as printf prints them; a line cut at its length
 * stays one record with its quotes closed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "logfmt_test_util.h"

static char path[] = "/tmp/canopy-log-XXXXXX";
static int saved = -1;

/* stderr goes to a temporary file while a test logs. */
static void capture(void) {
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  close(fd);
}

static void release(void) {
  if (saved >= 0) {
    dup2(saved, STDERR_FILENO);
    close(saved);
    saved = -1;
  }
  unlink(path);
}

/* The lines written so far, with "ts=... level=... " cut off each. */
static char *logged(void) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* The last line logged, whole (no newline), after checking it is one
 * logfmt record with one msg and one level. */
static const char *last_line(void) {
  char *all = logged();
  size_t n = strlen(all);
  cr_assert(n > 0 && all[n - 1] == '\n', "no whole line: %s", all);
  all[n - 1] = '\0';
  char *line = strrchr(all, '\n');
  line = line ? line + 1 : all;
  int n_msg, n_level;
  int pairs = tu_logfmt_pairs(line, &n_msg, &n_level);
  cr_expect(pairs > 0 && n_msg == 1 && n_level == 1,
            "not one logfmt record (%d pairs, %d msg, %d level): %s", pairs,
            n_msg, n_level, line);
  return line;
}

/* The part of the last line after "level=info ". */
static const char *rest(void) {
  const char *l = last_line();
  const char *p = strstr(l, "level=info ");
  cr_assert_not_null(p, "%s", l);
  return p + strlen("level=info ");
}

Test(log, values_quoted_when_they_need, .init = capture, .fini = release) {
  static const struct {
    const char *in, *out;
  } cases[] = {
      {"plain", "v=plain"},
      {"", "v=\"\""},
      {"sp ace", "v=\"sp ace\""},
      {"v1\nmsg=injected level=error", "v=\"v1\\nmsg=injected level=error\""},
      {"a=b", "v=\"a=b\""},
      {"say \"hi\"", "v=\"say \\\"hi\\\"\""},
      {"back\\slash", "v=\"back\\\\slash\""},
      {"tab\there\r", "v=\"tab\\there\\r\""},
      {"ctl\x01\x1f\x7f", "v=\"ctl\\x01\\x1f\\x7f\""},
      {"bad\xff\xfename", "v=\"bad\\xff\\xfename\""},
      {"cut\xc3", "v=\"cut\\xc3\""},
      {"overlong\xc0\xaf", "v=\"overlong\\xc0\\xaf\""},
      {"surrogate\xed\xa0\x80", "v=\"surrogate\\xed\\xa0\\x80\""},
      {"\xc3\xa9t\xc3\xa9", "v=\xc3\xa9t\xc3\xa9"},
      {"\xf0\x9f\x8c\xb3 tree", "v=\"\xf0\x9f\x8c\xb3 tree\""},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    cn__log(CN_LOG_INFO, "msg=t v=%s", cases[i].in);
    const char *r = rest();
    cr_expect(strncmp(r, "msg=t ", 6) == 0 && strcmp(r + 6, cases[i].out) == 0,
              "case %zu: got '%s', want 'msg=t %s'", i, r, cases[i].out);
  }
}

Test(log, quoted_by_the_format_escaped_pieces_copied, .init = capture,
     .fini = release) {
  cn__log(CN_LOG_INFO, "msg=t error=\"%s\" k=1", "say \"x\"\nnext=1 \\");
  cr_expect_str_eq(rest(), "msg=t error=\"say \\\"x\\\"\\nnext=1 \\\\\" k=1");
  cn__log(CN_LOG_INFO, "msg=t total_ms=%.3f%s%s", 1.5, " reason=",
          "timeout");
  cr_expect_str_eq(rest(), "msg=t total_ms=1.500 reason=timeout");
  cn__log(CN_LOG_INFO, "msg=t v=%.3s w=%s", "abcdef", "x");
  cr_expect_str_eq(rest(), "msg=t v=abc w=x");
}

Test(log, numbers_as_printf, .init = capture, .fini = release) {
  char want[256];
  long long big = -1234567890123LL;
  size_t z = 18446744073709551615ULL;
  snprintf(want, sizeof(want),
           "msg=t a=%d b=%lld c=%llu d=%.3f e=%5.1f f=%x g=%zu h=%u i=%c "
           "j=%%",
           -7, big, 42ULL, 3.14159, 2.25, 255u, z, 9u, 'q');
  cn__log(CN_LOG_INFO,
          "msg=t a=%d b=%lld c=%llu d=%.3f e=%5.1f f=%x g=%zu h=%u i=%c "
          "j=%%",
          -7, big, 42ULL, 3.14159, 2.25, 255u, z, 9u, 'q');
  /* e's width pads with a space: not logfmt, so compare the text only */
  char *all = logged();
  cr_expect(strstr(all, want) != NULL, "got %s want %s", all, want);
  cn__log(CN_LOG_INFO, "msg=t w=%*d p=%.*f", 4, 7, 2, 1.0 / 3);
  snprintf(want, sizeof(want), "msg=t w=%*d p=%.*f", 4, 7, 2, 1.0 / 3);
  cr_expect(strstr(logged(), want) != NULL, "want %s", want);
}

/* A line is at most 2 KiB: a longer value is cut, and the line stays one
 * record, its quotes closed, whatever is cut (a value, an escape, a
 * quoted piece of the format). */
Test(log, long_values_cut_into_one_record, .init = capture,
     .fini = release) {
  char *v = malloc(6001);
  for (int i = 0; i < 6000; i++) v[i] = " a\n\"\xc3\xa9"[i % 6];
  v[6000] = '\0';
  for (int shift = 0; shift < 8; shift++) {
    cn__log(CN_LOG_INFO, "msg=t v=%s after=1", v + shift);
    const char *l = last_line();
    cr_expect(strlen(l) < 2048, "%zu bytes", strlen(l));
    cn__log(CN_LOG_INFO, "msg=t error=\"%s\" after=1", v + shift);
    l = last_line();
    cr_expect(strlen(l) < 2048, "%zu bytes", strlen(l));
  }
  free(v);
}
