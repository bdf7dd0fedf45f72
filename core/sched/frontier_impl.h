/* frontier_impl.h - what frontier.c shares with frontier_lookahead2.c. */
#ifndef CANOPY_FRONTIER_IMPL_H
#define CANOPY_FRONTIER_IMPL_H

#include "sched/sched_api.h"

static inline void max_into(int32_t *best, const int32_t *tl, int T) {
  for (int t = 0; t < T; t++)
    if (tl[t] > best[t]) best[t] = tl[t];
}

/* Folds w's tail (or, added after the tails, w itself) into row. */
static inline void fold_tail(const cn_frontier *f, int32_t *row, int32_t w) {
  if (w < f->tails_nv)
    max_into(row, f->tail + (size_t)w * f->n_types, f->n_types);
  else if (row[f->vtype[w]] < 1)
    row[f->vtype[w]] = 1;
}

/* The consumers a batch of every ready type-t vertex makes ready, written
 * to out (frontier.c); the counts stay until cn__frontier_uncount_batch. */
int32_t cn__frontier_count_batch(const cn_frontier *f, int t, int32_t *out);
void cn__frontier_uncount_batch(const cn_frontier *f, int t);
/* The policies' picks (-1: nothing ready). */
int cn__frontier_next_lookahead(const cn_frontier *f);
int cn__frontier_next_lookahead2(const cn_frontier *f);

#endif
