/* test_pqtree.c - PQ-trees and the ED-Batch memory layout (core/pqtree.c,
 * core/pqtree_align.c) against brute force.
 *
 * The tree: on thousands of random small instances, after every reduce
 * the orders cn_pq_enumerate admits are exactly the permutations meeting
 * every accepted constraint, and a reduce fails exactly when none meets
 * them plus the new one (leaving the tree as it was). The layout: the
 * paper's Fig. 3/4 example, random small instances against all
 * permutations, planted larger instances, broadcasts and conflicts. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cell/pqtree.h"

#define MAXN 7
#define MAXPERM 5040

static int fact[MAXN + 1] = {1, 1, 2, 6, 24, 120, 720, 5040};
static uint64_t rng_state;

static uint32_t rnd(void) { /* xorshift64*: fixed seed, same run each time */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 2685821657736338717ULL) >> 32);
}

static int rndn(int n) { return (int)(rnd() % (uint32_t)n); }

/* The r-th permutation of 0..n-1 in lexicographic order. */
static void unrank(int n, int r, int *p) {
  int pool[MAXN];
  for (int i = 0; i < n; i++) pool[i] = i;
  for (int i = 0; i < n; i++) {
    int f = fact[n - 1 - i], j = r / f;
    r %= f;
    p[i] = pool[j];
    memmove(pool + j, pool + j + 1, (size_t)(n - 1 - i - j) * sizeof(int));
  }
}

static int rank(int n, const int *p) {
  int r = 0;
  for (int i = 0; i < n; i++) {
    int smaller = 0;
    for (int j = i + 1; j < n; j++) smaller += p[j] < p[i];
    r += smaller * fact[n - 1 - i];
  }
  return r;
}

/* mask's leaves consecutive in the order whose positions are pos? */
static int consecutive(int n, const int *pos, unsigned mask) {
  int lo = MAXN, hi = -1, c = 0;
  for (int v = 0; v < n; v++)
    if (mask >> v & 1) {
      c++;
      if (pos[v] < lo) lo = pos[v];
      if (pos[v] > hi) hi = pos[v];
    }
  return c <= 1 || hi - lo == c - 1;
}

typedef struct seen {
  int n;
  unsigned char hit[MAXPERM];
  int dup, bad;
} seen;

static void collect(const int *order, void *ctx) {
  seen *s = ctx;
  unsigned used = 0;
  for (int i = 0; i < s->n; i++) {
    if (order[i] < 0 || order[i] >= s->n || (used >> order[i] & 1)) {
      s->bad++;
      return;
    }
    used |= 1u << order[i];
  }
  int r = rank(s->n, order);
  if (s->hit[r]) s->dup++;
  s->hit[r] = 1;
}

/* The admitted set equals the brute-force set for the accepted masks. */
static void check_tree(const cn_pq *t, int n, const unsigned *acc, int n_acc,
                       const char *what) {
  seen s = {.n = n};
  long cnt = cn_pq_enumerate(t, collect, &s);
  char buf[256];
  cn_pq_format(t, buf, sizeof(buf));
  cr_assert_eq(s.bad, 0, "%s: enumerate gave a non-permutation (%s)", what,
               buf);
  cr_assert_eq(s.dup, 0, "%s: enumerate repeated an order (%s)", what, buf);
  long want = 0;
  for (int r = 0; r < fact[n]; r++) {
    int p[MAXN], pos[MAXN], ok = 1;
    unrank(n, r, p);
    for (int i = 0; i < n; i++) pos[p[i]] = i;
    for (int c = 0; c < n_acc && ok; c++) ok = consecutive(n, pos, acc[c]);
    want += ok;
    cr_assert_eq(s.hit[r], ok, "%s: tree %s %s order rank %d", what, buf,
                 ok ? "misses" : "wrongly admits", r);
  }
  cr_assert_eq(cnt, want, "%s: count %ld, brute force %ld", what, cnt, want);
  int fr[MAXN], pos[MAXN];
  cn_pq_frontier(t, fr);
  for (int i = 0; i < n; i++) pos[fr[i]] = i;
  for (int c = 0; c < n_acc; c++)
    cr_assert(consecutive(n, pos, acc[c]), "%s: frontier breaks a set", what);
}

static int satisfiable(int n, const unsigned *acc, int n_acc) {
  for (int r = 0; r < fact[n]; r++) {
    int p[MAXN], pos[MAXN], ok = 1;
    unrank(n, r, p);
    for (int i = 0; i < n; i++) pos[p[i]] = i;
    for (int c = 0; c < n_acc && ok; c++) ok = consecutive(n, pos, acc[c]);
    if (ok) return 1;
  }
  return 0;
}

Test(pqtree, universal_and_format) {
  cn_pq *t = cn_pq_new(5);
  char buf[64];
  cn_pq_format(t, buf, sizeof(buf));
  cr_assert_str_eq(buf, "P[0 1 2 3 4]");
  cr_assert_eq(cn_pq_enumerate(t, NULL, NULL), 120);
  cr_assert_eq(cn_pq_reduce(t, (int[]){1, 2}, 2), 0);
  cr_assert_eq(cn_pq_reduce(t, (int[]){3, 2, 3}, 3), 0); /* duplicate */
  cn_pq_format(t, buf, sizeof(buf));
  cr_assert_str_eq(buf, "P[0 4 Q[1 2 3]]");
  cr_assert_eq(cn_pq_enumerate(t, NULL, NULL), 12);
  /* {1, 3} cannot be consecutive with 2 between them */
  cr_assert_eq(cn_pq_reduce(t, (int[]){1, 3}, 2), CN_PQ_CONFLICT);
  cn_pq_format(t, buf, sizeof(buf));
  cr_assert_str_eq(buf, "P[0 4 Q[1 2 3]]");
  cr_assert_eq(cn_pq_reduce(t, (int[]){1, 9}, 2), CN_PQ_CONFLICT);
  cr_assert_eq(cn_pq_reduce(t, (int[]){4}, 1), 0); /* k <= 1: no-op */
  cn_pq_format(t, buf, 6); /* truncated, still terminated */
  cr_assert_str_eq(buf, "P[0 4");
  cn_pq *c = cn_pq_clone(t);
  cr_assert_eq(cn_pq_reduce(c, (int[]){0, 1}, 2), 0);
  cn_pq_format(t, buf, sizeof(buf));
  cr_assert_str_eq(buf, "P[0 4 Q[1 2 3]]", "a clone is independent");
  cn_pq_format(c, buf, sizeof(buf));
  cr_assert(!strcmp(buf, "P[4 Q[0 1 2 3]]") || !strcmp(buf, "P[4 Q[3 2 1 0]]"),
            "got %s", buf);
  cn_pq_free(c);
  cn_pq_free(t);
  t = cn_pq_new(1);
  int o[1];
  cn_pq_frontier(t, o);
  cr_assert_eq(o[0], 0);
  cr_assert_eq(cn_pq_enumerate(t, NULL, NULL), 1);
  cn_pq_free(t);
  cr_assert_null(cn_pq_new(0));
}

/* Part 1: every reduce against brute force over all n! permutations. */
Test(pqtree, reduce_brute_force) {
  rng_state = 0x9e3779b97f4a7c15ULL;
  int n_inst = 4000, n_fail = 0, n_reduce = 0;
  for (int inst = 0; inst < n_inst; inst++) {
    int n = 1 + rndn(MAXN), n_con = 1 + rndn(5), n_acc = 0;
    unsigned acc[8];
    cn_pq *t = cn_pq_new(n);
    cr_assert_not_null(t);
    check_tree(t, n, acc, 0, "universal");
    for (int c = 0; c < n_con; c++) {
      unsigned mask = 0;
      int set[2 * MAXN], k = 0;
      /* random subset, biased towards mid sizes; a few duplicates */
      for (int v = 0; v < n; v++)
        if (rndn(100) < 45) mask |= 1u << v;
      for (int v = 0; v < n; v++)
        if (mask >> v & 1) set[k++] = v;
      if (k > 0 && rndn(4) == 0) {
        int dup = set[rndn(k)];
        set[k++] = dup;
      }
      for (int i = k - 1; i > 0; i--) { /* shuffle */
        int j = rndn(i + 1), x = set[i];
        set[i] = set[j];
        set[j] = x;
      }
      char before[256], after[256];
      cn_pq_format(t, before, sizeof(before));
      acc[n_acc] = mask;
      int can = satisfiable(n, acc, n_acc + 1);
      int rc = cn_pq_reduce(t, set, k);
      n_reduce++;
      cr_assert_eq(rc == 0, can,
                   "inst %d: reduce of mask %#x on %s gave %d, brute force "
                   "says %s",
                   inst, mask, before, rc, can ? "possible" : "impossible");
      if (rc == 0) {
        n_acc++;
      } else {
        n_fail++;
        cn_pq_format(t, after, sizeof(after));
        cr_assert_str_eq(after, before, "a failed reduce changed the tree");
      }
      check_tree(t, n, acc, n_acc, before);
    }
    cn_pq_free(t);
  }
  printf("pqtree: %d instances, %d reduces (%d refused), all match brute "
         "force\n", n_inst, n_reduce, n_fail);
  cr_assert_gt(n_fail, 100, "the random sets should hit conflicts too");
}

/* ---- layout -------------------------------------------------------------- */

static int layout(int n, const cn_pq_batch *b, int nb, int *order,
                  unsigned char *kept) {
  int rc = cn_pq_layout(n, b, nb, order, kept);
  cr_assert_eq(rc, 0);
  unsigned used = 0;
  int *pos = malloc((size_t)n * sizeof(int));
  for (int i = 0; i < n; i++) {
    cr_assert(order[i] >= 0 && order[i] < n);
    pos[order[i]] = i;
    if (n <= 32) {
      cr_assert_eq(used >> order[i] & 1, 0, "order repeats a variable");
      used |= 1u << order[i];
    }
  }
  for (int i = 0; i < nb; i++)
    if (kept[i])
      cr_assert(cn_pq_batch_ok(&b[i], pos), "kept batch %d not satisfied", i);
  free(pos);
  return rc;
}

/* ED-Batch Fig. 3/4, x1..x8 -> 0..7. B1 = {result [x4 x5], sources
 * [x1 x3], [x2 x1]}. For B2 §3.1 gives the adjacency sets {x6 x7 x8} and
 * {x4 x3 x5}; the scatter "[x8 x6 x7]", the transfer "{x4 x5} -> {x6 x7}"
 * and the stated solution fix the op order: result [x8 x6 x7], source
 * [x3 x4 x5]. The sets as written in §3.2 ([x6 x7 x8], [x4 x3 x5]) are
 * also satisfiable (e.g. x2 x1 x3 x4 x5 x7 x6 x8); both must be kept. */
Test(layout, paper_fig3) {
  int b1[] = {3, 4, 0, 2, 1, 0};
  int b2[] = {7, 5, 6, 2, 3, 4};
  int b2_as_sets[] = {5, 6, 7, 3, 2, 4};
  cn_pq_batch bs[2] = {{3, 2, b1}, {2, 3, b2}};
  int order[8], pos[8];
  unsigned char kept[2];
  int paper[8] = {1, 0, 2, 3, 4, 7, 5, 6}; /* (x2,x1,x3,x4,x5,x8,x6,x7) */
  for (int i = 0; i < 8; i++) pos[paper[i]] = i;
  cr_assert(cn_pq_batch_ok(&bs[0], pos) && cn_pq_batch_ok(&bs[1], pos),
            "the paper's solution meets both batches");
  layout(8, bs, 2, order, kept);
  cr_assert(kept[0] && kept[1]);
  printf("fig3 order:");
  for (int i = 0; i < 8; i++) printf(" x%d", order[i] + 1);
  printf("\n");
  bs[1].vars = b2_as_sets;
  layout(8, bs, 2, order, kept);
  cr_assert(kept[0] && kept[1]);
  /* The tree of Fig. 4(a): Q2 = (x2, x1, x3, Q3 = (x4, x5)), P1 over
   * {x6, x7, x8}, under a P root. */
  cn_pq *t = cn_pq_new(8);
  int sets[][3] = {{3, 4}, {0, 2}, {1, 0}, {5, 6, 7}, {3, 2, 4}};
  int sz[] = {2, 2, 2, 3, 3};
  for (int i = 0; i < 5; i++) cr_assert_eq(cn_pq_reduce(t, sets[i], sz[i]), 0);
  char buf[128];
  cn_pq_format(t, buf, sizeof(buf));
  cr_assert(strstr(buf, "Q[1 0 2 P[3 4]]") || strstr(buf, "Q[P[3 4] 2 0 1]") ||
                strstr(buf, "Q[1 0 2 P[4 3]]") ||
                strstr(buf, "Q[P[4 3] 2 0 1]"),
            "Fig. 4(a) tree, got %s", buf);
  cr_assert(strstr(buf, "P[5 6 7]"), "got %s", buf);
  cn_pq_free(t);
}

static int pos_of_perm[MAXPERM][MAXN];

static void all_pos(int n) {
  for (int r = 0; r < fact[n]; r++) {
    int p[MAXN];
    unrank(n, r, p);
    for (int i = 0; i < n; i++) pos_of_perm[r][p[i]] = i;
  }
}

/* Some permutation meets every batch with use[] set? */
static int brute_layout(int n, const cn_pq_batch *b, int nb,
                        const unsigned char *use) {
  for (int r = 0; r < fact[n]; r++) {
    int ok = 1;
    for (int i = 0; i < nb && ok; i++)
      if (use[i]) ok = cn_pq_batch_ok(&b[i], pos_of_perm[r]);
    if (ok) return 1;
  }
  return 0;
}

/* Random operands: 1-3 operands of 2-3 distinct variables each. */
static void random_batch(int n, cn_pq_batch *b, int *vars, int bcast) {
  b->n_operands = 1 + rndn(3);
  b->n_ops = 2 + rndn(n >= 3 ? 2 : 1);
  b->vars = vars;
  for (int o = 0; o < b->n_operands; o++) {
    int *v = vars + o * b->n_ops;
    if (bcast && rndn(5) == 0) { /* a broadcast operand */
      for (int i = 0; i < b->n_ops; i++) v[i] = rndn(n);
      v[1] = v[0];
      continue;
    }
    for (int i = 0; i < b->n_ops; i++) {
      int again;
      do {
        v[i] = rndn(n);
        again = 0;
        for (int j = 0; j < i; j++) again |= v[j] == v[i];
      } while (again);
    }
  }
}

/* Part 2 against brute force. The greedy rule says: batch i is kept iff
 * some permutation meets it together with the batches kept before it.
 * The passes are exact (see pqtree_align.c), so this must hold in every
 * case, which is stronger than "all kept when all can be kept". */
static void layout_brute(int bcast) {
  int n_inst = 3000, all_sat = 0, all_kept = 0, dropped = 0, exact = 0;
  for (int inst = 0; inst < n_inst; inst++) {
    int n = 2 + rndn(MAXN - 1), nb = 1 + rndn(3);
    cn_pq_batch b[3];
    int vars[3][9], order[MAXN];
    unsigned char kept[3], use[3] = {0, 0, 0};
    for (int i = 0; i < nb; i++) random_batch(n, &b[i], vars[i], bcast);
    all_pos(n);
    layout(n, b, nb, order, kept);
    for (int i = 0; i < nb; i++) {
      use[i] = 1;
      int can = brute_layout(n, b, nb, use);
      use[i] = (unsigned char)can;
      cr_assert_eq(kept[i], can,
                   "inst %d batch %d: kept %d, brute force says %s", inst, i,
                   kept[i], can ? "it fits" : "it conflicts");
      exact++;
      dropped += !kept[i];
    }
    unsigned char every[3] = {1, 1, 1};
    if (brute_layout(n, b, nb, every)) {
      all_sat++;
      int k = 1;
      for (int i = 0; i < nb; i++) k &= kept[i];
      all_kept += k;
    }
  }
  printf("layout%s: %d instances, %d batches checked against the greedy "
         "rule (%d dropped); all batches satisfiable in %d, all kept in %d "
         "(%.1f%%)\n", bcast ? " (broadcasts)" : "", n_inst, exact, dropped,
         all_sat, all_kept, 100.0 * all_kept / (all_sat ? all_sat : 1));
  /* Threshold 100%: DecideNodesOrder is exact once BroadcastConstraint
   * has made every batch's operand subtrees isomorphic. */
  cr_assert_eq(all_kept, all_sat);
  cr_assert_gt(dropped, 50, "the random batches should conflict sometimes");
}

Test(layout, brute_force) {
  rng_state = 0x243f6a8885a308d3ULL;
  layout_brute(0);
}

Test(layout, brute_force_with_broadcasts) {
  rng_state = 0x13198a2e03707344ULL;
  layout_brute(1);
}

/* Larger planted instances: batches cut from one hidden order (each
 * operand a block of it, all listing their ops in one shared order), so
 * every batch can be kept together and must be. */
Test(layout, planted) {
  rng_state = 0xa4093822299f31d0ULL;
  for (int inst = 0; inst < 300; inst++) {
    int n = 8 + rndn(120), nb = 1 + rndn(12);
    int *hidden = malloc((size_t)n * sizeof(int));
    int *order = malloc((size_t)n * sizeof(int));
    cn_pq_batch b[12];
    int *vars[12];
    unsigned char kept[12];
    for (int i = 0; i < n; i++) hidden[i] = i;
    for (int i = n - 1; i > 0; i--) {
      int j = rndn(i + 1), x = hidden[i];
      hidden[i] = hidden[j];
      hidden[j] = x;
    }
    for (int i = 0; i < nb; i++) {
      int m = 1 + rndn(4), k = 2 + rndn(n / 4 < 8 ? n / 4 : 8), perm[16];
      for (int j = 0; j < k; j++) perm[j] = j;
      for (int j = k - 1; j > 0; j--) {
        int r = rndn(j + 1), x = perm[j];
        perm[j] = perm[r];
        perm[r] = x;
      }
      vars[i] = malloc((size_t)m * k * sizeof(int));
      for (int o = 0; o < m; o++) {
        int start = rndn(n - k + 1);
        for (int j = 0; j < k; j++)
          vars[i][o * k + perm[j]] = hidden[start + j];
      }
      b[i] = (cn_pq_batch){m, k, vars[i]};
    }
    layout(n, b, nb, order, kept);
    for (int i = 0; i < nb; i++)
      cr_assert(kept[i], "planted inst %d (n %d): batch %d dropped", inst, n,
                i);
    for (int i = 0; i < nb; i++) free(vars[i]);
    free(hidden);
    free(order);
  }
}

Test(layout, broadcast_single_and_conflict) {
  int order[6], pos[6];
  unsigned char kept[2];
  /* Result [0 1 2], a broadcast source [4 0 4] and a source [5 3 4]:
   * the broadcast gets no constraint (taken as an operand it could not be
   * aligned: 4 is op 2 of one operand and ops 0 and 2 of the other). */
  int v1[] = {0, 1, 2, 4, 0, 4, 5, 3, 4};
  cn_pq_batch b1 = {3, 3, v1};
  layout(6, &b1, 1, order, kept);
  cr_assert(kept[0]);
  for (int i = 0; i < 6; i++) pos[order[i]] = i;
  int v1b[] = {0, 1, 2, 5, 3, 4}; /* the same without the broadcast */
  cr_assert(cn_pq_batch_ok(&(cn_pq_batch){2, 3, v1b}, pos));
  /* batch_ok itself ignores broadcasts, and is exact otherwise */
  int id[] = {0, 1, 2, 3, 4, 5};
  int v2[] = {0, 1, 2, 3, 5, 3};
  cr_assert(cn_pq_batch_ok(&(cn_pq_batch){2, 3, v2}, id));
  int v3[] = {0, 1, 3, 4};
  cr_assert(cn_pq_batch_ok(&(cn_pq_batch){2, 2, v3}, id));
  int v4[] = {0, 1, 4, 3};
  cr_assert_not(cn_pq_batch_ok(&(cn_pq_batch){2, 2, v4}, id));
  int v5[] = {0, 2};
  cr_assert_not(cn_pq_batch_ok(&(cn_pq_batch){1, 2, v5}, id));

  /* A single batch whose operands share no variable is always kept
   * (sharing ones may be unsatisfiable alone, e.g. [0 1] ~ [1 0]; the
   * brute-force tests cover those), broadcasts or not. */
  rng_state = 0x082efa98ec4e6c89ULL;
  for (int inst = 0; inst < 500; inst++) {
    int m = 1 + rndn(4), k = 1 + rndn(5), n = m * k + rndn(4), vars[20];
    int *ord = malloc((size_t)n * sizeof(int));
    unsigned char kp[1];
    for (int i = 0; i < n; i++) ord[i] = i;
    for (int i = n - 1; i > 0; i--) {
      int j = rndn(i + 1), x = ord[i];
      ord[i] = ord[j];
      ord[j] = x;
    }
    for (int i = 0; i < m * k; i++) vars[i] = ord[i];
    if (k > 1 && rndn(3) == 0) vars[k] = vars[k + 1] = vars[0]; /* bcast */
    cn_pq_batch b = {m, k, vars};
    layout(n, &b, 1, ord, kp);
    cr_assert(kp[0], "single batch %d dropped", inst);
    free(ord);
  }

  /* An impossible pair: [0 1] ~ [2 3] and [0 1] ~ [3 2]. The first is
   * kept, the second dropped; the order meets the first. */
  int p1[] = {0, 1, 2, 3}, p2[] = {0, 1, 3, 2};
  cn_pq_batch pair[2] = {{2, 2, p1}, {2, 2, p2}};
  layout(4, pair, 2, order, kept);
  cr_assert(kept[0] && !kept[1]);
  pair[0].vars = p2;
  pair[1].vars = p1;
  layout(4, pair, 2, order, kept);
  cr_assert(kept[0] && !kept[1]);
  /* Adjacency conflicts: {0 1}, {1 2}, {0 2} on 4 variables. */
  int a[] = {0, 1}, bq[] = {1, 2}, cq[] = {0, 2};
  cn_pq_batch adj[3] = {{1, 2, a}, {1, 2, bq}, {1, 2, cq}};
  unsigned char k3[3];
  layout(4, adj, 3, order, k3);
  cr_assert(k3[0] && k3[1] && !k3[2]);
  /* Invalid batches are dropped, not fatal. */
  int bad[] = {0, 9};
  cn_pq_batch inval[2] = {{1, 2, bad}, {1, 2, a}};
  layout(4, inval, 2, order, kept);
  cr_assert(!kept[0] && kept[1]);
}
