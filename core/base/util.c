/* util.c - checked allocation, the monotonic clock, malloc's thresholds. */
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
