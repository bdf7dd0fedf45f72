/* frontier_lookahead2.c - the lookahead2 policy over the frontier (frontier.c).
 * Split from frontier.c, which keeps the frontier itself and the
 * one-batch policies. */
#include <string.h>

#include "sched/frontier_impl.h"

/* Two batches ahead, instance by instance.
 * The lookahead policy's one-batch greedy fails on a type whose batch is
 * worth nothing until its consumers' batch follows (a lattice's `word`,
 * then its `link`): it leaves the second half for later while the frontier
 * moves on, and the words the next char batches make ready then need
 * another pair. This policy scores each ready type by the best state two
 * batches on (first, then any second type), then by the state one batch
 * on; ties go to the smaller batch, then to agenda.
 *
 * A state's score is the run's bound on what is left (as lookahead), then,
 * on ties, Σ_c B_c³ over the instances c (weakly connected components),
 * where B_c = Σ_t max tail_t over c's ready vertices is instance c's own
 * bound: a run is a disjoint union of instances and a batch advances each
 * on its own, so the run takes at least max_c B_c more batches, and the
 * soft maximum favours progress on the instances furthest behind, the ones
 * that will decide when the run ends. The beam search (dag_beam.c) ranks
 * its states the same way. On the training lines of data (runs
 * of 64, outputs=all) it launches 1,147 batches for latticelstm against
 * 1,187 for lookahead (bound 988), 127 against 137 for treelstm-2type
 * (bound 122). O(types³ × instances + the edges out of the two batches) a
 * step. */
typedef struct la2_score {
  int32_t bound; /* Σ_t max_c B_c,t: the run's bound on what is left */
  double soft;   /* Σ_c B_c³                                          */
} la2_score;

static bool la2_less(la2_score a, la2_score b) {
  return a.bound < b.bound || (a.bound == b.bound && a.soft < b.soft - 0.5);
}

/* Per listed instance c and type u: the largest and second largest of
 * cm1[c][a][u] over a, and the a of the largest, so that la2_rows can
 * leave out any one a in O(T) per instance, not O(T²). */
static void la2_top(const cn_frontier *f, int32_t nc) {
  int T = f->n_types;
  size_t TT = (size_t)T * (size_t)T;
  for (int32_t k = 0; k < nc; k++) {
    int32_t c = f->clist[k];
    int32_t *x = f->cx + (size_t)c * T, *s = f->cs + (size_t)c * T;
    uint8_t *am = f->ca + (size_t)c * T;
    memset(x, 0, (size_t)T * sizeof(int32_t));
    memset(s, 0, (size_t)T * sizeof(int32_t));
    memset(am, 0, (size_t)T);
    for (int a = 0; a < T; a++) {
      const int32_t *m = f->cm1 + (size_t)c * TT + (size_t)a * T;
      for (int u = 0; u < T; u++) {
        if (m[u] > x[u]) {
          s[u] = x[u];
          x[u] = m[u];
          am[u] = (uint8_t)a;
        } else if (m[u] > s[u]) {
          s[u] = m[u];
        }
      }
    }
  }
}

/* cb[c] = max over types a != skip of cm1[c][a], for the listed instances
 * (from la2_top's maxima). */
static void la2_rows(const cn_frontier *f, int32_t nc, int skip) {
  int T = f->n_types;
  for (int32_t k = 0; k < nc; k++) {
    size_t o = (size_t)f->clist[k] * T;
    int32_t *b = f->cb + o;
    for (int u = 0; u < T; u++)
      b[u] = f->ca[o + u] == skip ? f->cs[o + u] : f->cx[o + u];
  }
}

/* The score of the state whose per-instance maxima are in cb. */
static la2_score la2_eval(const cn_frontier *f, int32_t nc) {
  int T = f->n_types;
  la2_score s = {0, 0.0};
  int32_t run[CN_MAX_TYPES] = {0};
  for (int32_t k = 0; k < nc; k++) {
    const int32_t *b = f->cb + (size_t)f->clist[k] * T;
    int32_t x = 0;
    max_into(run, b, T);
    for (int u = 0; u < T; u++) x += b[u];
    s.soft += (double)x * x * x;
  }
  for (int u = 0; u < T; u++) s.bound += run[u];
  return s;
}

/* The second batch (type t2 after t1, whose batch made n1[0..nn) ready):
 * the consumers it makes ready go into cb. pass 1 undoes the counts. */
static void la2_second(const cn_frontier *f, int t1, int t2, int32_t nn,
                       int pass) {
  int T = f->n_types;
  for (int src = 0; src < 2; src++) {
    int64_t n = src == 0 ? (t2 != t1 ? f->qc_n[t2] : 0) : nn;
    for (int64_t i = 0; i < n; i++) {
      int32_t v = src == 0 ? f->qc[t2][i] : f->n1[i];
      if (src == 1 && f->vtype[v] != t2) continue;
      for (int32_t e = f->out_head[v]; e >= 0; e = f->e_next[e]) {
        int32_t w = f->e_dst[e];
        if (pass == 1)
          f->seen2[w] = 0;
        else if (f->seen_in[w] + ++f->seen2[w] == f->pending[w])
          fold_tail(f, f->cb + (size_t)f->comp[w] * T, w);
      }
    }
  }
}

int cn__frontier_next_lookahead2(const cn_frontier *f) {
  if (f->comp == NULL) return cn__frontier_next_lookahead(f);
  int T = f->n_types;
  size_t TT = (size_t)T * (size_t)T;
  /* The instances with ready vertices; their rows are kept up to date
   * as vertices become ready and batches run (note_ready, commit). */
  int32_t nc = 0;
  for (int a = 0; a < T; a++)
    for (int32_t k = 0; k < f->cin_n[a]; k++) {
      int32_t c = f->cin[a][k];
      if (!f->cmark[c]) {
        f->cmark[c] = 1;
        f->clist[nc++] = c;
      }
    }
  /* In a graph that is complete, a type that feeds nothing (outputs) is
   * left for last: its batches ready nothing, so running it while another
   * type can run only costs a batch, and at the end one batch takes all of
   * it. Neither a first nor a second batch of it is scored while another
   * type is ready: the searches' rule (cn__dag_branch_types). */
  uint32_t feeds = f->complete ? f->feeds : ~0u, live = 0;
  for (int a = 0; a < T; a++)
    if (f->n_ready[a] > 0) live |= 1u << a;
  uint32_t first = cn__dag_branch_types(live, -1, feeds);
  int best = -1;
  la2_score b1 = {0, 0.0}, b2 = {0, 0.0};
  double bavg = 0;
  for (int t1 = 0; t1 < T; t1++) {
    if (!(first >> t1 & 1)) continue;
    /* After the first batch: its type's rows go, what it readies comes. */
    int64_t n1_of[CN_MAX_TYPES] = {0};
    int32_t nn = cn__frontier_count_batch(f, t1, f->n1);
    for (int32_t i = 0; i < nn; i++) n1_of[f->vtype[f->n1[i]]]++;
    for (int32_t k = 0; k < nc; k++) {
      size_t o = (size_t)f->clist[k] * TT;
      memcpy(f->cm1 + o, f->cm + o, TT * sizeof(int32_t));
      memset(f->cm1 + o + (size_t)t1 * T, 0, (size_t)T * sizeof(int32_t));
    }
    for (int32_t i = 0; i < nn; i++) {
      int32_t w = f->n1[i];
      size_t row = (size_t)f->comp[w] * TT + (size_t)f->vtype[w] * T;
      fold_tail(f, f->cm1 + row, w);
    }
    la2_top(f, nc);
    la2_rows(f, nc, -1);
    la2_score s1 = la2_eval(f, nc), s2 = s1;
    bool second = false;
    uint32_t live2 = 0;
    for (int a = 0; a < T; a++)
      if ((a != t1 ? f->n_ready[a] : 0) + n1_of[a] > 0) live2 |= 1u << a;
    uint32_t then = cn__dag_branch_types(live2, -1, feeds);
    for (int t2 = 0; t2 < T; t2++) {
      if (!(then >> t2 & 1)) continue;
      la2_rows(f, nc, t2);
      la2_second(f, t1, t2, nn, 0);
      la2_second(f, t1, t2, nn, 1);
      la2_score s = la2_eval(f, nc);
      if (!second || la2_less(s, s2)) s2 = s;
      second = true;
    }
    cn__frontier_uncount_batch(f, t1);
    double avg = f->depth_sum[t1] / (double)f->n_of_type[t1];
    bool better;
    if (best < 0 || la2_less(s2, b2))
      better = true;
    else if (la2_less(b2, s2))
      better = false;
    else if (la2_less(s1, b1))
      better = true;
    else if (la2_less(b1, s1))
      better = false;
    else
      better = f->n_ready[t1] < f->n_ready[best] ||
               (f->n_ready[t1] == f->n_ready[best] && avg < bavg);
    if (better) {
      best = t1;
      b1 = s1;
      b2 = s2;
      bavg = avg;
    }
  }
  for (int32_t k = 0; k < nc; k++) f->cmark[f->clist[k]] = 0;
  return best;
}
