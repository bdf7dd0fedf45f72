/* logfmt_test_util.c - a reference reader of logfmt lines, for the tests
 * of the daemon's log (logfmt_test_util.h). */
#include <string.h>

#include "logfmt_test_util.h"

/* One logfmt line (go-logfmt's grammar): `key=value` pairs split by
 * spaces, a key and a bare value holding no space, '=', '"' or control
 * character, a quoted value with backslash escapes. The pairs, or -1 if
 * the line is not logfmt; *n_msg and *n_level count those keys. */
int tu_logfmt_pairs(const char *p, int *n_msg, int *n_level) {
  int pairs = 0;
  *n_msg = *n_level = 0;
  while (*p) {
    const char *k = p;
    while (*p && *p != '=' && *p != ' ' && *p != '"' &&
           (unsigned char)*p >= 0x20)
      p++;
    if (p == k || *p != '=') return -1;
    size_t kl = (size_t)(p - k);
    if (kl == 3 && strncmp(k, "msg", 3) == 0) (*n_msg)++;
    if (kl == 5 && strncmp(k, "level", 5) == 0) (*n_level)++;
    p++;
    if (*p == '"') {
      for (p++; *p && *p != '"'; p++) {
        if ((unsigned char)*p < 0x20) return -1;
        if (*p == '\\' && *++p == '\0') return -1;
      }
      if (*p++ != '"') return -1;
    } else {
      while (*p && *p != ' ' && *p != '=' && *p != '"' &&
             (unsigned char)*p >= 0x20)
        p++;
    }
    pairs++;
    if (*p == ' ') p++;
    else if (*p) return -1;
  }
  return pairs;
}
