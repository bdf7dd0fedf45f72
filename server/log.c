/* log.c - one logfmt line per event: `ts=... level=... msg=... k=v`.
 *
 * The formatter, not each call site, makes a line well formed whatever
 * its values hold: a `%s` right after `=` in the format is a value, and is
 * written in double quotes, escaped, when it needs them (empty, a space,
 * `=`, a quote, a backslash, a control character, bytes that are not
 * UTF-8); a `%s` right after a `"` of the format is inside quotes already
 * and is escaped only. Model names, versions, paths, request ids and
 * client text are such values (a model.json "version" of
 * "v1\nmsg=injected level=error", or a directory named "sp ace", once
 * made fields of their own). A `%s` anywhere else is a piece of the line
 * the code wrote itself (a literal), copied as it is. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
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

/* The length of the well-formed UTF-8 sequence at p (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF), or 0. */
static int utf8_seq(const unsigned char *p) {
  unsigned c = p[0];
  int n;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c >= 0xe0 && c <= 0xef) n = 3;
  else if (c >= 0xf0 && c <= 0xf4) n = 4;
  else return 0;
  unsigned cp = c & (0x3fu >> (n - 1));
  for (int i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0; /* the NUL ends it too */
    cp = cp << 6 | (p[i] & 0x3f);
  }
  if (n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) return 0;
  if (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) return 0;
  return n;
}

long cn__utf8_bad_at(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    int k = utf8_seq(p);
    if (k == 0) return (long)(p - (const unsigned char *)s);
    p += k;
  }
  return -1;
}

/* One character of a value at p (at most left bytes): its escaped form in
 * e (backslash and quote escaped, a control character as \n, \r, \t or
 * \xHH, a byte that is not UTF-8 as \xHH); *used the bytes of p taken. */
static int escape_one(const unsigned char *p, size_t left, char e[8],
                      size_t *used) {
  int k = utf8_seq(p);
  if (k > 1 && (size_t)k <= left) {
    memcpy(e, p, (size_t)k);
    *used = (size_t)k;
    return k;
  }
  *used = 1;
  if (*p == '\\' || *p == '"') return snprintf(e, 8, "\\%c", *p);
  if (*p == '\n') return snprintf(e, 8, "\\n");
  if (*p == '\r') return snprintf(e, 8, "\\r");
  if (*p == '\t') return snprintf(e, 8, "\\t");
  if (*p < 0x20 || *p >= 0x7f) return snprintf(e, 8, "\\x%02x", *p);
  e[0] = (char)*p;
  return 1;
}

void cn__log_escape(char *out, size_t cap, const char *in) {
  size_t n = 0, len = strlen(in), used;
  for (size_t i = 0; i < len; i += used) {
    char e[8];
    int k = escape_one((const unsigned char *)in + i, len - i, e, &used);
    if (n + (size_t)k + 1 > cap) break;
    memcpy(out + n, e, (size_t)k);
    n += (size_t)k;
  }
  if (cap > 0) out[n] = '\0';
}

/* Does s (n bytes) need quotes as a logfmt value? */
static int needs_quotes(const char *s, size_t n) {
  if (n == 0) return 1;
  for (size_t i = 0; i < n;) {
    const unsigned char *p = (const unsigned char *)s + i;
    if (*p <= 0x20 || *p == 0x7f || *p == '=' || *p == '"' || *p == '\\')
      return 1;
    int k = utf8_seq(p);
    if (k == 0 || (size_t)k > n - i) return 1;
    i += (size_t)k;
  }
  return 0;
}

/* The line being built: up to `end`, leaving room for a closing quote and
 * the newline; full once something did not fit (the rest is dropped). */
typedef struct {
  char *b;
  size_t n, end;
  int full;
  int quoted; /* the format's own quotes: inside one now */
} line_buf;

static void put(line_buf *l, const char *s, size_t k) {
  if (l->full) return;
  if (l->n + k > l->end) {
    l->full = 1;
    return;
  }
  memcpy(l->b + l->n, s, k);
  l->n += k;
}

enum { AS_PIECE, AS_VALUE, AS_QUOTED };

/* A string argument: as it is (a piece of the line), a value (quoted when
 * it needs), or inside the format's quotes (escaped). */
static void put_string(line_buf *l, const char *s, size_t n, int as) {
  if (as == AS_PIECE || (as == AS_VALUE && !needs_quotes(s, n))) {
    put(l, s, n);
    return;
  }
  int open = 0;
  if (as == AS_VALUE) {
    put(l, "\"", 1);
    if (l->full) return;
    open = 1;
    l->end--; /* room for the closing quote, so a cut value is closed */
  }
  size_t used;
  for (size_t i = 0; i < n && !l->full; i += used) {
    char e[8];
    int k = escape_one((const unsigned char *)s + i, n - i, e, &used);
    put(l, e, (size_t)k);
  }
  if (open) {
    l->end++;
    l->b[l->n++] = '"';
  }
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
/* One conversion other than %s: its spec (as written in the format, with
 * '*' width or precision already read into w and p) and its argument. */
#define ONE(T)                                                            \
  do {                                                                    \
    T v_ = va_arg(*ap, T);                                                \
    k = nw && np ? snprintf(e, sizeof(e), spec, w, p, v_)                 \
        : nw     ? snprintf(e, sizeof(e), spec, w, v_)                    \
        : np     ? snprintf(e, sizeof(e), spec, p, v_)                    \
                 : snprintf(e, sizeof(e), spec, v_);                      \
  } while (0)

/* Formats fmt's text and conversions into l (printf's conversions, each
 * by its length modifier's type; %n is not one a log line uses). */
static void format_line(line_buf *l, const char *fmt, va_list *ap) {
  const char *f = fmt;
  while (*f && !l->full) {
    if (*f != '%') {
      if (*f == '"') l->quoted = !l->quoted;
      put(l, f++, 1);
      continue;
    }
    if (f[1] == '%') {
      put(l, "%", 1);
      f += 2;
      continue;
    }
    const char *start = f++;
    while (*f && strchr("-+ #0", *f)) f++;
    int nw = 0, np = 0, w = 0, p = -1;
    if (*f == '*') {
      nw = 1;
      f++;
    } else {
      while (*f >= '0' && *f <= '9') f++;
    }
    if (*f == '.') {
      f++;
      p = 0;
      if (*f == '*') {
        np = 1;
        f++;
      } else {
        while (*f >= '0' && *f <= '9') p = p * 10 + (*f++ - '0');
      }
    }
    char len[3] = {0};
    for (int i = 0; i < 2 && *f && strchr("hlzjtL", *f); i++) len[i] = *f++;
    char conv = *f;
    if (conv == '\0') break;
    f++;
    if (nw) w = va_arg(*ap, int);
    if (np) p = va_arg(*ap, int);
    char spec[32], e[512];
    size_t sl = (size_t)(f - start);
    if (sl >= sizeof(spec)) break; /* no such format in this program */
    memcpy(spec, start, sl);
    spec[sl] = '\0';
    int k = 0;
    switch (conv) {
      case 's': {
        const char *s = va_arg(*ap, const char *);
        if (s == NULL) s = "(null)";
        size_t n = p >= 0 ? strnlen(s, (size_t)p) : strlen(s);
        char before = start > fmt ? start[-1] : '\0';
        put_string(l, s, n,
                   before == '=' ? AS_VALUE
                   : before == '"' && l->quoted ? AS_QUOTED
                                                : AS_PIECE);
        continue;
      }
      case 'd':
      case 'i':
        if (strcmp(len, "l") == 0) ONE(long);
        else if (strcmp(len, "ll") == 0) ONE(long long);
        else if (strcmp(len, "z") == 0) ONE(ssize_t);
        else if (strcmp(len, "j") == 0) ONE(intmax_t);
        else if (strcmp(len, "t") == 0) ONE(ptrdiff_t);
        else ONE(int);
        break;
      case 'u':
      case 'o':
      case 'x':
      case 'X':
        if (strcmp(len, "l") == 0) ONE(unsigned long);
        else if (strcmp(len, "ll") == 0) ONE(unsigned long long);
        else if (strcmp(len, "z") == 0) ONE(size_t);
        else if (strcmp(len, "j") == 0) ONE(uintmax_t);
        else if (strcmp(len, "t") == 0) ONE(ptrdiff_t);
        else ONE(unsigned);
        break;
      case 'c':
        ONE(int);
        break;
      case 'p':
        ONE(void *);
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
      case 'a':
      case 'A':
        if (strcmp(len, "L") == 0) ONE(long double);
        else ONE(double);
        break;
      default:
        return; /* not a conversion a log line uses: stop here */
    }
    if (k > 0) put(l, e, (size_t)k < sizeof(e) ? (size_t)k : sizeof(e) - 1);
  }
}
#undef ONE
#pragma GCC diagnostic pop

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
  /* room kept back for a closing quote and the newline */
  line_buf l = {line, (size_t)n, sizeof(line) - 2, 0, 0};
  va_list ap;
  va_start(ap, fmt);
  format_line(&l, fmt, &ap);
  va_end(ap);
  if (l.quoted) line[l.n++] = '"'; /* cut inside the format's quotes */
  /* a record is one line whatever a piece held: a stray control
   * character becomes a space (values are escaped above) */
  for (size_t i = (size_t)n; i < l.n; i++)
    if ((unsigned char)line[i] < 0x20) line[i] = ' ';
  line[l.n++] = '\n';
  ssize_t wr = write(STDERR_FILENO, line, l.n);
  (void)wr;
}
