/* jsonw.c - answers written straight into one growable buffer (cn_buf):
 * numbers by cn_f32_json (f32fmt.c), strings escaped as jansson's compact
 * dump escapes them, and cn_buf_json for the few parts of an answer that
 * are still a json_t (errors, stats, v2's tensors), printed the same way,
 * so every float of every answer path reads alike.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"

double cn_thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *cn_buf_room(cn_buf *b, size_t n) {
  if (b->failed) return NULL;
  if (b->cap - b->len < n + 1) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n + 1) {
      if (cap > SIZE_MAX / 2) {
        b->failed = 1;
        return NULL;
      }
      cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (p == NULL) {
      b->failed = 1;
      return NULL;
    }
    b->p = p;
    b->cap = cap;
  }
  return b->p + b->len;
}

void cn_buf_put(cn_buf *b, const char *s, size_t n) {
  char *at = cn_buf_room(b, n);
  if (at == NULL) return;
  memcpy(at, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void cn_buf_puts(cn_buf *b, const char *s) { cn_buf_put(b, s, strlen(s)); }

void cn_buf_float(cn_buf *b, float x) {
  char *at = cn_buf_room(b, CN_JSON_FLOAT_MAX + 1);
  if (at != NULL) b->len += cn_f32_json(x, at);
}

char *cn__json_int_at(char *p, long long v) {
  char tmp[24];
  int n = 0;
  unsigned long long u = v < 0 ? 0ull - (unsigned long long)v
                               : (unsigned long long)v;
  do {
    tmp[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (v < 0) *p++ = '-';
  for (int i = 0; i < n; i++) p[i] = tmp[n - 1 - i];
  return p + n;
}

void cn_buf_int(cn_buf *b, long long v) {
  char *at = cn_buf_room(b, 24);
  if (at == NULL) return;
  char *p = cn__json_int_at(at, v);
  *p = '\0';
  b->len += (size_t)(p - at);
}

/* One reservation for the whole array, then no check per number. */
int cn_buf_floats(cn_buf *b, const float *x, int64_t n) {
  int finite = 1;
  char *at = cn_buf_room(b, 2 + (size_t)n * (CN_JSON_FLOAT_MAX + 1) +
                                CN__JSON_SCRATCH);
  if (at == NULL) return 1;
  char *p = cn__f32_json_array(at, x, n, &finite);
  *p = '\0';
  b->len += (size_t)(p - at);
  return finite;
}

/* Bytes that a JSON string holds as they are: not '"', '\\' or a control
 * character. */
static inline bool plain(unsigned char c) {
  return c >= 0x20 && c != '"' && c != '\\';
}

char *cn__json_string_at(char *p, const char *s, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  *p++ = '"';
  const unsigned char *end = (const unsigned char *)s + n;
  for (const unsigned char *c = (const unsigned char *)s; c < end; c++) {
    if (plain(*c)) {
      *p++ = (char)*c;
      continue;
    }
    *p++ = '\\';
    switch (*c) {
    case '"': *p++ = '"'; break;
    case '\\': *p++ = '\\'; break;
    case '\b': *p++ = 'b'; break;
    case '\f': *p++ = 'f'; break;
    case '\n': *p++ = 'n'; break;
    case '\r': *p++ = 'r'; break;
    case '\t': *p++ = 't'; break;
    default:
      *p++ = 'u', *p++ = '0', *p++ = '0';
      *p++ = hex[*c >> 4], *p++ = hex[*c & 15];
    }
  }
  *p++ = '"';
  return p;
}

/* n bytes of s as a JSON string. */
static void put_string(cn_buf *b, const char *s, size_t n) {
  char *at = cn_buf_room(b, 2 + 6 * n); /* every byte as \u00XX at most */
  if (at == NULL) return;
  char *p = cn__json_string_at(at, s, n);
  *p = '\0';
  b->len += (size_t)(p - at);
}

void cn_buf_string(cn_buf *b, const char *s) { put_string(b, s, strlen(s)); }

void cn_buf_free(cn_buf *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

/* A real that is not a float32 (a duration in the stats): as jansson's
 * "%.9g" writes it, with a ".0" after an integer and no '+' or leading
 * zeros in the exponent. */
static void put_double(cn_buf *b, double x) {
  char tmp[40];
  int n = snprintf(tmp, sizeof(tmp), "%.9g", x);
  if (n < 0 || (size_t)n >= sizeof(tmp) - 3) return;
  if (strchr(tmp, '.') == NULL && strchr(tmp, 'e') == NULL) {
    tmp[n++] = '.';
    tmp[n++] = '0';
    tmp[n] = '\0';
  }
  char *e = strchr(tmp, 'e');
  if (e != NULL) {
    char *from = e + 1, *to = e + 1;
    if (*from == '+') from++;
    else if (*from == '-') from++, to++;
    while (*from == '0' && from[1] != '\0') from++;
    memmove(to, from, strlen(from) + 1);
    n = (int)strlen(tmp);
  }
  cn_buf_put(b, tmp, (size_t)n);
}

void cn_buf_double(cn_buf *b, double x) {
  float f = (float)x;
  if ((double)f == x) cn_buf_float(b, f);
  else put_double(b, x);
}

void cn_buf_json(cn_buf *b, const json_t *j) {
  switch (json_typeof(j)) {
  case JSON_OBJECT: {
    const char *k;
    json_t *v;
    int first = 1;
    cn_buf_put(b, "{", 1);
    json_object_foreach((json_t *)j, k, v) {
      if (!first) cn_buf_put(b, ",", 1);
      first = 0;
      cn_buf_string(b, k);
      cn_buf_put(b, ":", 1);
      cn_buf_json(b, v);
    }
    cn_buf_put(b, "}", 1);
    break;
  }
  case JSON_ARRAY: {
    size_t i;
    json_t *v;
    cn_buf_put(b, "[", 1);
    json_array_foreach(j, i, v) {
      if (i > 0) cn_buf_put(b, ",", 1);
      cn_buf_json(b, v);
    }
    cn_buf_put(b, "]", 1);
    break;
  }
  case JSON_STRING:
    put_string(b, json_string_value(j), json_string_length(j));
    break;
  case JSON_INTEGER:
    cn_buf_int(b, (long long)json_integer_value(j));
    break;
  case JSON_REAL:
    cn_buf_double(b, json_real_value(j));
    break;
  case JSON_TRUE:
    cn_buf_put(b, "true", 4);
    break;
  case JSON_FALSE:
    cn_buf_put(b, "false", 5);
    break;
  default:
    cn_buf_put(b, "null", 4);
  }
}
