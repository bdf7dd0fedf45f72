/* f32fmt_all.c - cn_f32_json over all 2^32 float32 bit patterns: each
 * finite one prints a decimal of at most 9 significant digits, at most
 * CN_JSON_FLOAT_MAX characters, that strtof reads back as the same bits
 * (-0 included); NaN and infinity print null. Split over the cores;
 * ~11 CPU-minutes (strtof is most of it), so not in the default suite:
 * `ninja -C build f32fmt_all`. `f32fmt_all FIRST LAST [STEP]` checks the
 * bit patterns FIRST, FIRST + STEP, ... up to LAST (hex or decimal).
 * Prints the failures (the first few) and exits 1 on any. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "canopy_core.h"

static atomic_ullong failures, checked;

typedef struct part {
  uint64_t lo, hi, step;
} part;

static void *check_range(void *arg) {
  const part *p = arg;
  unsigned long long bad = 0, n = 0;
  for (uint64_t i = p->lo; i < p->hi; i += p->step) {
    uint32_t b = (uint32_t)i;
    float x;
    memcpy(&x, &b, sizeof(x));
    char out[CN_JSON_FLOAT_MAX + 1];
    size_t len = cn_f32_json(x, out);
    bool ok;
    if (!isfinite(x)) {
      ok = strcmp(out, "null") == 0;
    } else {
      char *end;
      float y = strtof(out, &end);
      uint32_t yb;
      memcpy(&yb, &y, sizeof(yb));
      /* significant digits: first non-zero digit to last non-zero */
      int first = -1, last = -1, at = 0;
      for (const char *c = out; *c && *c != 'e'; c++) {
        if (*c < '0' || *c > '9') continue;
        if (*c != '0') {
          if (first < 0) first = at;
          last = at;
        }
        at++;
      }
      int digits = first < 0 ? 0 : last - first + 1;
      ok = *end == '\0' && yb == b && len <= CN_JSON_FLOAT_MAX &&
           len == strlen(out) && digits <= 9;
    }
    n++;
    if (!ok && ++bad <= 10)
      fprintf(stderr, "f32fmt_all: %08x printed '%s'\n", b, out);
  }
  atomic_fetch_add(&failures, bad);
  atomic_fetch_add(&checked, n);
  return NULL;
}

int main(int argc, char **argv) {
  uint64_t first = 0, last = 0xffffffffu, step = 1;
  if (argc >= 3) {
    first = strtoull(argv[1], NULL, 0);
    last = strtoull(argv[2], NULL, 0);
    if (argc >= 4) step = strtoull(argv[3], NULL, 0);
    if (last > 0xffffffffu || first > last || step == 0) {
      fprintf(stderr, "usage: f32fmt_all [FIRST LAST [STEP]]\n");
      return 2;
    }
  }
  uint64_t count = (last - first) / step + 1;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int n = cores > 0 && cores < 256 ? (int)cores : 1;
  pthread_t th[256];
  part parts[256];
  uint64_t per = count / (uint64_t)n;
  for (int i = 0; i < n; i++) {
    parts[i].lo = first + per * (uint64_t)i * step;
    parts[i].hi = i == n - 1 ? last + 1 : first + per * (uint64_t)(i + 1) * step;
    parts[i].step = step;
    pthread_create(&th[i], NULL, check_range, &parts[i]);
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  printf("f32fmt_all: %llu bit patterns, %llu failures\n",
         (unsigned long long)checked, (unsigned long long)failures);
  return failures == 0 && checked == count ? 0 : 1;
}
