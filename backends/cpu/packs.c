/* packs.c - packed copies of a model's weights, kept per context under the
 * model's uid (packs.h). A tree model's run multiplies by the same
 * internal weight once per level, a greedy decoder by its projection once
 * per step, and daemon runs are small: packing per call or per run cost up to
 * a tenth of a run of 8 trees at H=512. */
#include "packs.h"

#include <stdbool.h>
#include <stdlib.h>

#include "gemm.h"

/* Copies kept past a run at most: above it the next run drops those of
 * other models, then all. */
#define KEEP_BYTES ((size_t)128 << 20)

void cn__packs_drop(cn__packs *pk) {
  for (int i = 0; i < pk->n_packs; i++) free(pk->packs[i].P);
  pk->n_packs = 0;
  pk->bytes = 0;
}

void cn__packs_free(cn__packs *pk) {
  cn__packs_drop(pk);
  free(pk->packs);
  free(pk->ranges);
  *pk = (cn__packs){0};
}

/* Copies for the same uid serve again: a uid is never reused, and a
 * model's weights do not change while it is loaded. */
void cn__packs_begin(cn__packs *pk, uint64_t uid) {
  pk->n_ranges = 0;
  pk->uid = uid;
  bool over = pk->bytes > KEEP_BYTES;
  size_t live = 0;
  for (int i = 0; i < pk->n_packs; i++) {
    struct cn__pack *q = &pk->packs[i];
    if (q->uid == 0 || (over && q->uid != uid)) q->W = NULL;
    if (q->W != NULL) live += q->cap * sizeof(float);
  }
  if (over && (live > KEEP_BYTES || pk->bytes > 2 * KEEP_BYTES))
    cn__packs_drop(pk);
}

void cn__packs_note(cn__packs *pk, const float *host, size_t n) {
  for (int i = 0; i < pk->n_ranges; i++)
    if (pk->ranges[i].lo == host && pk->ranges[i].hi == host + n) return;
  if (pk->n_ranges == pk->cap_ranges) {
    int cap = pk->cap_ranges ? 2 * pk->cap_ranges : 32;
    struct cn__packs_range *r =
        realloc(pk->ranges, (size_t)cap * sizeof(*r));
    if (r == NULL) return; /* products by it pack per call */
    pk->ranges = r;
    pk->cap_ranges = cap;
  }
  pk->ranges[pk->n_ranges++] = (struct cn__packs_range){host, host + n};
}

/* An entry for a new copy of need floats: the smallest free one that
 * holds it, else a new one; NULL when out of memory. */
static struct cn__pack *slot_for(cn__packs *pk, size_t need) {
  struct cn__pack *best = NULL;
  for (int i = 0; i < pk->n_packs; i++) {
    struct cn__pack *q = &pk->packs[i];
    if (q->W == NULL && q->cap >= need && (best == NULL || q->cap < best->cap))
      best = q;
  }
  if (best != NULL) return best;
  if (pk->n_packs == pk->cap_packs) {
    int cap = pk->cap_packs ? 2 * pk->cap_packs : 16;
    struct cn__pack *a = realloc(pk->packs, (size_t)cap * sizeof(*a));
    if (a == NULL) return NULL;
    pk->packs = a;
    pk->cap_packs = cap;
  }
  size_t bytes = (need * sizeof(float) + 63) / 64 * 64;
  float *P = aligned_alloc(64, bytes ? bytes : 64);
  if (P == NULL) return NULL;
  pk->bytes += bytes;
  best = &pk->packs[pk->n_packs++];
  *best = (struct cn__pack){.P = P, .cap = bytes / sizeof(float)};
  return best;
}

const float *cn__packs_get(cn__packs *pk, int N, int K, const float *W,
                           int ldw) {
  const float *end = W + (size_t)(N - 1) * ldw + K;
  bool known = false;
  for (int i = 0; i < pk->n_ranges && !known; i++)
    known = W >= pk->ranges[i].lo && end <= pk->ranges[i].hi;
  if (!known) return NULL;
  for (int i = 0; i < pk->n_packs; i++) {
    const struct cn__pack *q = &pk->packs[i];
    if (q->W == W && q->uid == pk->uid && q->N == N && q->K == K &&
        q->ldw == ldw)
      return q->P;
  }
  struct cn__pack *q = slot_for(pk, cn__gemm_packed_floats(N, K));
  if (q == NULL) return NULL;
  cn__gemm_pack_nt(N, K, W, ldw, q->P);
  q->W = W;
  q->uid = pk->uid;
  q->N = N;
  q->K = K;
  q->ldw = ldw;
  return q->P;
}
