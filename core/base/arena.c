/* arena.c - a bump allocator whose memory is kept across resets, for what
 * lives exactly as long as one run of `canopy run` (its instances: tree
 * nodes, ids, spans). A job resets its arena when the run's instances are
 * done and allocates the next run's from the same blocks, so parsing
 * stops calling malloc once the arena has grown to the largest run.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* One block: its bytes follow the header. */
struct cn_arena_block {
  struct cn_arena_block *next;
  size_t size, used;
};

#define ARENA_ALIGN 16
#define ARENA_MIN_BLOCK ((size_t)1 << 16)

/* Why: instance arrays are many and small and die together; a block of
 * 64 KiB or more serves hundreds of them. Blocks are tried in order from
 * the current one; a reset rewinds to the first. */
void *cn__arena_alloc(cn_arena *a, size_t n) {
  n = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  if (n == 0) n = ARENA_ALIGN;
  for (cn_arena_block *b = a->cur; b != NULL; b = b->next) {
    if (b->size - b->used >= n) {
      void *p = (char *)(b + 1) + b->used;
      b->used += n;
      a->cur = b;
      return p;
    }
    if (b->next != NULL) b->next->used = 0; /* rewound by a reset */
  }
  size_t sz = n > ARENA_MIN_BLOCK ? n : ARENA_MIN_BLOCK;
  if (a->last != NULL && a->last->size * 2 > sz && a->last->size < ((size_t)1 << 26))
    sz = a->last->size * 2 > n ? a->last->size * 2 : n;
  cn_arena_block *b = malloc(sizeof(*b) + sz);
  if (b == NULL) return NULL;
  b->next = NULL;
  b->size = sz;
  b->used = n;
  if (a->last != NULL)
    a->last->next = b;
  else
    a->first = b;
  a->last = a->cur = b;
  a->bytes += sz;
  return b + 1;
}

void *cn__arena_calloc(cn_arena *a, size_t n, size_t size) {
  if (size != 0 && n > SIZE_MAX / size) return NULL;
  void *p = cn__arena_alloc(a, n * size);
  if (p != NULL) memset(p, 0, n * size);
  return p;
}

void cn__arena_reset(cn_arena *a) {
  a->cur = a->first;
  if (a->first != NULL) a->first->used = 0;
}

void cn__arena_free(cn_arena *a) {
  for (cn_arena_block *b = a->first, *n; b != NULL; b = n) {
    n = b->next;
    free(b);
  }
  memset(a, 0, sizeof(*a));
}
