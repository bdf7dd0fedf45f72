/* util.c - checked allocation. */
#include <stdint.h>
#include <stdlib.h>

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
