/* instance_at.c - an INSTANCE object read where it lies inside a larger
 * document (an element of a daemon request's "instances" array), without
 * a JSON DOM: its extent is found by matching brackets outside strings,
 * then it is read as instance_line.c reads a whole line. Like that
 * reader it only ever succeeds or declines; every error is left to the
 * DOM path (json_loadb, cn_instance_parse), which writes it.
 */
#include <string.h>

#include "model/model.h"

/* The index just past the JSON value that opens with '{' at s[at], or 0
 * when s[at ..) holds no complete one. A string is skipped whole, to the
 * first '"' behind an even run of backslashes (memchr: an instance's
 * bytes are mostly inside its strings); what lies inside is for the
 * reader to judge. */
static size_t object_end(const char *s, size_t len, size_t at) {
  int depth = 0;
  for (size_t i = at; i < len; i++) {
    char c = s[i];
    if (c == '"') {
      size_t open = i;
      for (;;) {
        const char *q = memchr(s + i + 1, '"', len - i - 1);
        if (q == NULL) return 0;
        i = (size_t)(q - s);
        size_t k = i;
        while (k > open + 1 && s[k - 1] == '\\') k--;
        if ((i - k) % 2 == 0) break; /* not escaped: the string's end */
      }
    } else if (c == '{' || c == '[') {
      depth++;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return 0;
}

/* Why: a request body holds its instances inside an envelope; reading
 * each where it lies spares the body's DOM (a heap node per value, a
 * hash table per object), the larger part of a small request's parse. */
int cn_instance_parse_at(const cn_model *m, cn_line_reader *rd,
                         const char *buf, size_t len, size_t at,
                         const cn_limits *lim, cn_instance **out,
                         size_t *end) {
  *out = NULL;
  if (at >= len || buf[at] != '{') return 1;
  size_t e = object_end(buf, len, at);
  if (e == 0) return 1;
  int rc = cn_instance_parse_line(m, rd, buf + at, e - at, lim, out);
  if (rc == 0) *end = e;
  return rc;
}
