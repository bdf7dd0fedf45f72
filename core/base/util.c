/* util.c - checked allocation, the monotonic clock, malloc's thresholds,
 * the edit distance behind every did-you-mean. */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "base/base.h"

void *cn__xcalloc(size_t n, size_t size) {
  if (n == 0 || size == 0) return calloc(1, 1);
  if (n > SIZE_MAX / size) return NULL;
  return calloc(n, size);
}

void *cn__xrealloc(void *p, size_t n, size_t size) {
  if (size != 0 && n > SIZE_MAX / size) return NULL;
  return realloc(p, (n != 0 && size != 0) ? n * size : 1);
}

double cn_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double cn__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double cn__now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

void cn_malloc_thresholds(size_t bytes) {
#ifdef __GLIBC__
  const char *t = getenv("GLIBC_TUNABLES");
  if (t != NULL && strstr(t, "malloc.") != NULL &&
      strstr(t, "_threshold") != NULL)
    return;
  mallopt(M_MMAP_THRESHOLD, (int)bytes);
  mallopt(M_TRIM_THRESHOLD, (int)bytes);
#else
  (void)bytes;
#endif
}

/* One row of the dynamic programme (Wagner-Fischer), so 65 ints of stack:
 * the config's keys, model.json's keys and model names all use it. */
int cn_edit_distance(const char *a, const char *b, bool fold_case) {
  size_t na = strlen(a), nb = strlen(b);
  if (na > 64 || nb > 64) return 3;
  int row[65];
  for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= na; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= nb; j++) {
      int up = row[j];
      unsigned char ca = (unsigned char)a[i - 1], cb = (unsigned char)b[j - 1];
      if (fold_case) {
        ca = (unsigned char)tolower(ca);
        cb = (unsigned char)tolower(cb);
      }
      int sub = diag + (ca != cb);
      int del = row[j] + 1, ins = row[j - 1] + 1;
      row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
      diag = up;
    }
  }
  return row[nb] > 3 ? 3 : row[nb];
}
