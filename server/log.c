/* log.c - one logfmt line per event: `ts=... level=... msg=... k=v`. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

int cn__log_level = CN_LOG_INFO;

static const char *names[] = {"error", "warn", "info", "debug"};

int cn__log_parse_level(const char *name) {
  for (int i = 0; i < 4; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

void cn__log_escape(char *out, size_t cap, const char *in) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
    char e[8];
    int k;
    if (*p == '\\' || *p == '"') k = snprintf(e, sizeof(e), "\\%c", *p);
    else if (*p == '\n') k = snprintf(e, sizeof(e), "\\n");
    else if (*p == '\r') k = snprintf(e, sizeof(e), "\\r");
    else if (*p == '\t') k = snprintf(e, sizeof(e), "\\t");
    else if (*p < 0x20 || *p == 0x7f) k = snprintf(e, sizeof(e), "\\x%02x", *p);
    else k = snprintf(e, sizeof(e), "%c", *p);
    if (n + (size_t)k + 1 > cap) break;
    memcpy(out + n, e, (size_t)k);
    n += (size_t)k;
  }
  if (cap > 0) out[n] = '\0';
}

/* The line is formatted into one buffer and written with one write(2), so
 * lines from the loop and the workers never interleave mid-line. */
void cn__log(int level, const char *fmt, ...) {
  char line[2048];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof(line),
                   "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                   tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                   names[level < 0 ? 0 : level > 3 ? 3 : level]);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof(line) - 2) len = sizeof(line) - 2;
  /* a record is one line whatever its values hold: a stray control
   * character becomes a space */
  for (size_t i = (size_t)n; i < len; i++)
    if ((unsigned char)line[i] < 0x20) line[i] = ' ';
  line[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w;
}
