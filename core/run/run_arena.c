/* run_arena.c - memory by liveness for planned runs, with freed rows
 * poisoned on request (docs/memory.md).
 *
 * A planned run knows its whole batch sequence before it starts, so each
 * vertex's last reader batch is known too (Serenity §3.1: a node's output
 * is deallocated once its out-degree reaches zero). The state rows of a
 * batch are taken as ONE contiguous block (the batched kernels keep
 * writing consecutive rows in place) from an offset allocator simulated
 * over the batch sequence, and handed back, range by range, after their
 * last reader batch; the arena's state region is the allocator's
 * high-water mark instead of every vertex's state.
 *
 * Within a batch the rows are ordered by the batch that reads them last,
 * so what dies together is one range and the block is freed from its
 * front; rows that die in the same batch follow their readers' order
 * there, so the reader batch still finds its inputs evenly spaced
 * (cn__rows_even) and reads them in place. Rows read after the run (the
 * family's reads()) are freed never.
 *
 * This file calls nothing in the other files of run/: run.c hands it the
 * rows that must outlive the run.
 */
#include <stdlib.h>
#include <string.h>

#include "run/run_api.h"

/* Every block and every freed range is a multiple of this many floats
 * (64 bytes), so every block starts aligned as the per-type buffers did. */
#define GRAIN 16

static int64_t round_up(int64_t x) { return (x + GRAIN - 1) & ~(int64_t)(GRAIN - 1); }

/* ---- the offset allocator ------------------------------------------------ */

static int fl_reserve(cn_offset_alloc *a, int need) {
  if (need <= a->cap) return 0;
  int c = a->cap ? 2 * a->cap : 64;
  while (c < need) c *= 2;
  int64_t *lo = cn__xrealloc(a->lo, (size_t)c, sizeof(int64_t));
  if (lo == NULL) return -1;
  a->lo = lo;
  int64_t *len = cn__xrealloc(a->len, (size_t)c, sizeof(int64_t));
  if (len == NULL) return -1;
  a->len = len;
  a->cap = c;
  return 0;
}

static void fl_remove(cn_offset_alloc *a, int i) {
  memmove(a->lo + i, a->lo + i + 1, (size_t)(a->n - i - 1) * sizeof(int64_t));
  memmove(a->len + i, a->len + i + 1,
          (size_t)(a->n - i - 1) * sizeof(int64_t));
  a->n--;
}

/* Best fit among the free ranges below the top (the smallest that holds
 * size; the lowest of equals); else the top grows, starting at the free
 * range that touches it when there is one. Block starts stay where they
 * are: nothing moves once placed. */
int cn__oalloc_alloc(cn_offset_alloc *a, int64_t size, int64_t *off) {
  int best = -1;
  for (int i = 0; i < a->n; i++)
    if (a->len[i] >= size && (best < 0 || a->len[i] < a->len[best])) best = i;
  if (best >= 0) {
    *off = a->lo[best];
    a->lo[best] += size;
    a->len[best] -= size;
    if (a->len[best] == 0) fl_remove(a, best);
  } else if (a->n > 0 && a->lo[a->n - 1] + a->len[a->n - 1] == a->top) {
    *off = a->lo[a->n - 1]; /* the last free range, extended */
    a->top = *off + size;
    fl_remove(a, a->n - 1);
  } else {
    *off = a->top;
    a->top += size;
  }
  if (a->top > a->peak) a->peak = a->top;
  a->live += size;
  if (a->live > a->peak_live) a->peak_live = a->live;
  return 0;
}

/* Gives [off, off + size) back, merged with its free neighbours; a range
 * that reaches the top lowers the top. */
int cn__oalloc_free(cn_offset_alloc *a, int64_t off, int64_t size) {
  if (size <= 0) return 0;
  a->live -= size;
  int i = 0; /* first free range above off */
  int lo = 0, hi = a->n;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (a->lo[mid] < off)
      lo = mid + 1;
    else
      hi = mid;
  }
  i = lo;
  bool left = i > 0 && a->lo[i - 1] + a->len[i - 1] == off;
  bool right = i < a->n && off + size == a->lo[i];
  if (left && right) {
    a->len[i - 1] += size + a->len[i];
    fl_remove(a, i);
    i--;
  } else if (left) {
    a->len[--i] += size;
  } else if (right) {
    a->lo[i] = off;
    a->len[i] += size;
  } else {
    if (fl_reserve(a, a->n + 1)) return -1;
    memmove(a->lo + i + 1, a->lo + i, (size_t)(a->n - i) * sizeof(int64_t));
    memmove(a->len + i + 1, a->len + i, (size_t)(a->n - i) * sizeof(int64_t));
    a->lo[i] = off;
    a->len[i] = size;
    a->n++;
  }
  if (a->lo[i] + a->len[i] == a->top) { /* the top comes down */
    a->top = a->lo[i];
    fl_remove(a, i);
  }
  return 0;
}

void cn__oalloc_done(cn_offset_alloc *a) {
  free(a->lo);
  free(a->len);
  memset(a, 0, sizeof(*a));
}

/* ---- planning a run's rows ---------------------------------------------- */

/* The rows of batch b that one block holds: the whole batch, or under a
 * memory budget each slice a launch executes (run.c's slice_needs keeps a
 * slice's rows to a sixteenth of the budget), so a batch can fill the
 * holes earlier rows left instead of growing the top. */
static int32_t unit_rows(const cn_run *r, int32_t b) {
  int32_t n = r->batches[b].n;
  if (r->mem_budget > 0 && r->slice_rows != NULL && r->slice_rows[b] > 0 &&
      r->slice_rows[b] < n)
    return r->slice_rows[b];
  return n > 0 ? n : 1;
}

/* A freed range, relative to its unit's block, freed after batch `at`. */
typedef struct rel_free {
  int32_t at, batch; /* batch: the unit (a batch's block, or a slice's) */
  int64_t lo, len;
} rel_free;

/* What the row plan keeps of one row, side by side: the plan walks the
 * rows batch by batch, and a batch holds one row of each instance, so
 * each row costs a cache line per array; in one struct it costs one. */
typedef struct row_death {
  int32_t death; /* the batch that reads it last (B: kept, never read) */
  int32_t todo;  /* its death until its death batch lists it, then -1: one
                    comparison says both "dies here" and "not yet listed" */
} row_death;
typedef struct row_state {
  int32_t batch; /* the batch that computes it */
  int32_t next;  /* the row after it in its batch's list of rows read later */
  row_death d;   /* written together, as one word */
} row_state;

/* The scratch of one row plan (cn__run_plan_live), shared by its steps. */
typedef struct live_plan {
  row_state *rs;
  /* head[b]: the first of batch b's list of rows read later (-1: none);
   * seq: one batch's new entries */
  int32_t *head, *seq;
  int32_t *unit0;  /* the first unit (block) of each batch */
  int64_t *block;  /* each unit's offset */
  int32_t *n_at;   /* the frees after each batch */
  rel_free *rel, *sorted;
  /* one batch's rows dying in it, and the start of each group of rows
   * dying together in its new order */
  int32_t *first, *grp;
  /* the rows kept, batch b's from kept0[b], in the scheduler's order;
   * each batch's rows in lists */
  int32_t *kept, *kept0, *n_list;
  int64_t n_rel, cap_rel, max_n;
} live_plan;

/* Each row's batch and death, the batch that reads it last (B: kept, or
 * never read), in one pass over the batches in order: a row's readers
 * come in later batches, so the last to write its death is its last
 * reader (Serenity §3.1's out-degree count, as the batch of the last
 * consumer); the rows kept are collected batch by batch, in the
 * scheduler's order, and set to B after. */
static inline void plan_deaths_(const cn_run *r, const uint8_t *keep,
                                bool all_kept, live_plan *lp) {
  const int32_t B = r->n_batches;
  const int32_t *in_start = r->in_start, *in_edges = r->in_edges;
  row_state *rs = lp->rs;
  int32_t *head = lp->head, *kept = lp->kept, *kept0 = lp->kept0, nk = 0;
  for (int32_t b = 0; b < B; b++) {
    const cn_run_batch *bt = &r->batches[b];
    const int32_t *ord = r->order + bt->start;
    const row_state init = {b, -1, {b, b}};
    const row_death read_here = {b, b};
    if (bt->n > lp->max_n) lp->max_n = bt->n;
    kept0[b] = nk;
    for (int32_t i = 0; i < bt->n; i++) {
      int32_t v = ord[i];
      rs[v] = init;
      kept[nk] = v;
      nk += all_kept || keep[v];
      for (int32_t q = in_start[v], q1 = in_start[v + 1]; q < q1; q++) {
        rs[in_edges[q]].d = read_here;
      }
    }
    head[b] = -1;
    lp->n_list[b] = 0;
  }
  kept0[B] = nk;
  for (int32_t i = 0; i < nk; i++) rs[kept[i]].d = (row_death){B, B};
}

static void plan_deaths(const cn_run *r, const uint8_t *keep,
                        live_plan *lp) {
  if (keep == NULL)
    plan_deaths_(r, keep, true, lp);
  else
    plan_deaths_(r, keep, false, lp);
}

/* Row v takes place `at` of its batch: the inputs it reads last (in
 * batch b) and not yet listed join the batch's new entries, in reading
 * order (the first (row, edge) reading each). */
static inline int32_t place_row(const cn_run *r, row_state *rs, int32_t *ord,
                                int32_t at, int32_t v, int32_t b,
                                int32_t *seq, int32_t ns) {
  const int32_t *in_edges = r->in_edges;
  ord[at] = v;
  for (int32_t q = r->in_start[v], q1 = r->in_start[v + 1]; q < q1; q++) {
    int32_t u = in_edges[q];
    if (rs[u].d.todo == b) {
      rs[u].d.todo = -1;
      seq[ns++] = u;
    }
  }
  return ns;
}

/* Batch b's rows in their order (see cn__run_plan_live), the rows it
 * reads last listed in front of their batches' lists, and the frees of
 * its blocks, group by group as rows die: each block from its front.
 * Batches are placed from the last back. -1: out of memory. */
static int plan_batch_rows(cn_run *r, live_plan *lp, int32_t b) {
  row_state *rs = lp->rs;
  int32_t *head = lp->head, *seq = lp->seq, *unit0 = lp->unit0,
          *n_at = lp->n_at, *first = lp->first, *grp = lp->grp;
  const cn_run_batch *bt = &r->batches[b];
  const int32_t n = bt->n;
  int32_t *ord = r->order + bt->start;
  /* its rows kept (plan_deaths), those in its list, and the rest: those
   * dying in it, none reading them, in the scheduler's order */
  const int32_t *kept = lp->kept + lp->kept0[b];
  int32_t n3 = lp->kept0[b + 1] - lp->kept0[b], n1 = 0;
  if (n - n3 - lp->n_list[b] > 0)
    for (int32_t i = 0; i < n; i++)
      if (rs[ord[i]].d.death == b) first[n1++] = ord[i];
  /* the new order: those dying here, the list (by death, each death
   * batch's rows in its reading order), those kept; the groups of rows
   * dying together start at grp[0 .. ng), the kept rows' last */
  int32_t at = 0, ns = 0, ng = 0, dprev = -1;
  if (n1 > 0) grp[ng++] = 0, dprev = b;
  for (; at < n1; at++) ns = place_row(r, rs, ord, at, first[at], b, seq, ns);
  for (int32_t v = head[b]; v >= 0; v = rs[v].next, at++) {
    if (rs[v].d.death != dprev) grp[ng++] = at, dprev = rs[v].d.death;
    ns = place_row(r, rs, ord, at, v, b, seq, ns);
  }
  if (at + n3 != n) return -1; /* cannot happen: every row is in one part */
  grp[ng] = at; /* the end of the last group that dies */
  for (int32_t i = 0; i < n3; i++, at++)
    ns = place_row(r, rs, ord, at, kept[i], b, seq, ns);
  while (ns > 0) { /* in front of each batch's list, in reading order */
    int32_t u = seq[--ns], c = rs[u].batch;
    rs[u].next = head[c];
    head[c] = u;
    lp->n_list[c]++;
  }
  /* the frees of its blocks (one per unit), group by group as rows die:
   * each block from its front */
  int64_t w = r->state_floats[bt->type];
  int32_t ur = unit_rows(r, b);
  for (int32_t g = 0; g < ng; g++) {
    int32_t i = grp[g], j = grp[g + 1], d = rs[ord[i]].d.death;
    for (int32_t x = i; x < j;) { /* [x, z): the group within one unit */
      int32_t u0 = x / ur * ur, u1 = u0 + ur < n ? u0 + ur : n;
      int32_t z = j < u1 ? j : u1;
      int64_t lo = x == u0 ? 0 : ((x - u0) * w) & ~(int64_t)(GRAIN - 1);
      int64_t end = z == u1 ? round_up((u1 - u0) * w)
                            : ((z - u0) * w) & ~(int64_t)(GRAIN - 1);
      if (end > lo) {
        if (lp->n_rel == lp->cap_rel) {
          lp->cap_rel = lp->cap_rel ? 2 * lp->cap_rel : 256;
          rel_free *p = cn__xrealloc(lp->rel, (size_t)lp->cap_rel,
                                     sizeof(*p));
          if (p == NULL) return -1;
          lp->rel = p;
        }
        lp->rel[lp->n_rel++] = (rel_free){d, unit0[b] + x / ur, lo, end - lo};
        n_at[d]++;
      }
      x = z;
    }
  }
  return 0;
}

/* The frees sorted by the batch after which they happen, then the
 * simulation that places every unit's block in a (r->state_off) and
 * records the frees at their offsets (r->frees). -1: out of memory. */
static int plan_place(cn_run *r, live_plan *lp, cn_offset_alloc *a) {
  const int32_t B = r->n_batches;
  int32_t *n_at = lp->n_at, *unit0 = lp->unit0;
  int64_t *block = lp->block, n_rel = lp->n_rel;
  int64_t *state_off = r->state_off;
  rel_free *rel = lp->rel, *sorted;
  /* the frees by the batch after which they happen (counting sort) */
  sorted = lp->sorted = malloc((size_t)n_rel * sizeof(rel_free) + 1);
  if (sorted == NULL) return -1;
  for (int32_t b = 0, s = 0; b <= B; b++) {
    int32_t c = n_at[b];
    n_at[b] = s;
    s += c;
  }
  for (int64_t i = 0; i < n_rel; i++) sorted[n_at[rel[i].at]++] = rel[i];
  /* n_at[b] is now the end of batch b's frees */
  free(r->frees);
  r->frees = malloc((size_t)n_rel * sizeof(cn_arena_free) + 1);
  r->n_frees = 0;
  if (r->frees == NULL) return -1;
  /* The simulation: batch b's block is taken after the frees of batches
   * before b (its inputs, dying at b, are still held). */
  int64_t f = 0;
  for (int32_t b = 0; b < B; b++) {
    for (; b > 0 && f < n_at[b - 1]; f++) {
      const rel_free *e = &sorted[f];
      int64_t off = block[e->batch] + e->lo;
      if (cn__oalloc_free(a, off, e->len)) return -1;
      r->frees[r->n_frees++] = (cn_arena_free){e->at, off, e->len};
    }
    const cn_run_batch *bt = &r->batches[b];
    int64_t w = r->state_floats[bt->type];
    int32_t ur = unit_rows(r, b);
    for (int32_t u0 = 0; u0 < bt->n; u0 += ur) {
      int32_t nu = bt->n - u0 < ur ? bt->n - u0 : ur;
      int64_t size = round_up(nu * w), *at = &block[unit0[b] + u0 / ur];
      *at = 0;
      if (size > 0 && cn__oalloc_alloc(a, size, at)) return -1;
      const int32_t *ord = r->order + bt->start + u0;
      int64_t o = *at;
      int32_t i = 0;
      for (; i + 4 <= nu; i += 4, o += 4 * w) { /* the loop tested per 4 */
        state_off[ord[i]] = o;
        state_off[ord[i + 1]] = o + w;
        state_off[ord[i + 2]] = o + 2 * w;
        state_off[ord[i + 3]] = o + 3 * w;
      }
      for (; i < nu; i++, o += w) state_off[ord[i]] = o;
    }
  }
  for (; f < n_rel; f++) { /* freed after the last batches: poisoned too */
    const rel_free *e = &sorted[f];
    r->frees[r->n_frees++] =
        (cn_arena_free){e->at, block[e->batch] + e->lo, e->len};
  }
  return 0;
}

/* Rows in each batch, from the last batch back: by death, then in the
 * order their last reader batch (already ordered) reads them, by the
 * first (row, edge) reading each. No sort: the rows a batch d reads
 * last are listed in that order as d is placed, each list put in front
 * of its batch's (lists from later batches come after), so a batch's
 * order is its rows dying in it (the scheduler's order), its list, then
 * the rows kept (the scheduler's order): O(rows + edges) in all, each
 * row's inputs read twice (its death, its place). Then the blocks are
 * placed by simulating the frees (plan_place). */
int cn__run_plan_live(cn_run *r, const uint8_t *keep, int64_t *states) {
  const int32_t B = r->n_batches, nv = r->nv;
  int rc = -1;
  live_plan lp = {0};
  lp.rs = malloc((size_t)nv * sizeof(row_state) + 1);
  lp.head = malloc(((size_t)B + 1) * sizeof(int32_t));
  lp.seq = malloc((size_t)nv * sizeof(int32_t) + 1);
  lp.unit0 = malloc(((size_t)B + 1) * sizeof(int32_t));
  lp.n_at = calloc((size_t)B + 1, sizeof(int32_t));
  lp.kept = malloc((size_t)nv * sizeof(int32_t) + 1);
  lp.kept0 = malloc(((size_t)B + 1) * sizeof(int32_t));
  lp.n_list = malloc(((size_t)B + 1) * sizeof(int32_t));
  cn_offset_alloc a = {0};
  if (!lp.rs || !lp.head || !lp.seq || !lp.unit0 || !lp.n_at || !lp.kept ||
      !lp.kept0 || !lp.n_list)
    goto out;
  lp.unit0[0] = 0;
  for (int32_t b = 0; b < B; b++) {
    int32_t ur = unit_rows(r, b);
    lp.unit0[b + 1] = lp.unit0[b] + (r->batches[b].n + ur - 1) / ur;
  }
  lp.block = malloc((size_t)lp.unit0[B] * sizeof(int64_t) + 1);
  if (lp.block == NULL) goto out;
  plan_deaths(r, keep, &lp);
  lp.first = malloc((size_t)lp.max_n * sizeof(int32_t) + 1);
  lp.grp = malloc(((size_t)lp.max_n + 2) * sizeof(int32_t));
  if (lp.first == NULL || lp.grp == NULL) goto out;
  for (int32_t b = B - 1; b >= 0; b--)
    if (plan_batch_rows(r, &lp, b) != 0) goto out;
  if (plan_place(r, &lp, &a) != 0) goto out;
  *states = a.peak;
  r->state_floats_live = a.peak_live;
  rc = 0;
out:
  cn__oalloc_done(&a);
  free(lp.rs);
  free(lp.head);
  free(lp.seq);
  free(lp.block);
  free(lp.unit0);
  free(lp.n_at);
  free(lp.rel);
  free(lp.sorted);
  free(lp.first);
  free(lp.grp);
  free(lp.kept);
  free(lp.kept0);
  free(lp.n_list);
  return rc;
}

/* Poisoning (docs/testing.md): the ranges freed after batch b become NaN
 * now, so a row read after its space was reused reads NaN, which the
 * answers' finite check (cn_output_check) reports. Through to_device from
 * a host buffer of NaNs: host memory (cpu) and device backends alike. */
void cn__run_poison(cn_run *r, int32_t b) {
  if (r->poison_next >= r->n_frees || r->frees[r->poison_next].at > b) return;
  float nan_buf[4096];
  for (int i = 0; i < 4096; i++) nan_buf[i] = __builtin_nanf("");
  while (r->poison_next < r->n_frees && r->frees[r->poison_next].at <= b) {
    const cn_arena_free *e = &r->frees[r->poison_next++];
    for (int64_t x = 0; x < e->len; x += 4096) {
      int64_t n = e->len - x < 4096 ? e->len - x : 4096;
      r->bk->vt->to_device(r->bk, r->arena + e->off + x, nan_buf,
                           (size_t)n * sizeof(float));
    }
  }
}
