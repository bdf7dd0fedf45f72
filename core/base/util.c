/* util.c - checked allocation, the monotonic clock. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

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
