/* packs.h - a cpu context's packed copies of model weights.
 *
 * gemm.c multiplies by a packed operand. A model's weight matrices are the
 * same in every run of the model, so a context packs each the first time
 * a run multiplies by it and keeps the copy under the model's uid (core:
 * unique among the models a process loads). A run of another uid never
 * uses it: a freed model's memory may hold the next model. */
#ifndef CANOPY_CPU_PACKS_H
#define CANOPY_CPU_PACKS_H

#include <stddef.h>
#include <stdint.h>

typedef struct cn__packs {
  uint64_t uid; /* the model of the run (cn__packs_begin) */
  struct cn__packs_range {
    const float *lo, *hi;
  } *ranges; /* the run's weights (cn__packs_note) */
  int n_ranges, cap_ranges;
  struct cn__pack {
    const float *W; /* NULL: free for reuse */
    uint64_t uid;   /* the model it was packed for */
    int N, K, ldw;
    float *P;
    size_t cap; /* floats */
  } *packs;
  int n_packs, cap_packs;
  size_t bytes; /* of every P */
} cn__packs;

/* A run binds the weights of model uid (0: unknown, nothing kept). */
void cn__packs_begin(cn__packs *pk, uint64_t uid);
/* host[0..n) is one of the run's weight tensors. */
void cn__packs_note(cn__packs *pk, const float *host, size_t n);
/* W[N,K] (rows ldw apart) packed for gemm.c, or NULL when W is not within
 * a noted tensor (an activation, a child's state) or memory ran out. */
const float *cn__packs_get(cn__packs *pk, int N, int K, const float *W,
                           int ldw);
/* Frees the copies (an idle worker's release); _free: everything. */
void cn__packs_drop(cn__packs *pk);
void cn__packs_free(cn__packs *pk);

#endif
