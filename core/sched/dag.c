/* dag.c - what the scheduler knows of a typed DAG before it schedules it:
 * the lower bound on its batches, its consumers, the tails the look-ahead
 * policies and searches read; and the names of the batching policies. The
 * lowest file of sched/: it calls no other file of the folder.
 */
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "sched/sched_api.h"

/* The bound from one int32 counter per (vertex, type): for any DAG. */
static int64_t lower_bound_wide(const cn_dag *g) {
  int T = g->n_types;
  /* cnt[v][t]: most type-t vertices on any path ending at v. */
  int32_t *cnt = cn__xcalloc((size_t)g->nv * (size_t)T, sizeof(int32_t));
  if (cnt == NULL) return -1;
  int32_t best[CN_MAX_TYPES] = {0};
  for (int32_t v = 0; v < g->nv; v++) {
    int32_t *c = cnt + (size_t)v * T;
    for (int32_t i = g->in_start[v]; i < g->in_start[v + 1]; i++) {
      const int32_t *p = cnt + (size_t)g->in_edges[i] * T;
      for (int t = 0; t < T; t++)
        if (p[t] > c[t]) c[t] = p[t];
    }
    c[g->vtype[v]]++;
    for (int t = 0; t < T; t++)
      if (c[t] > best[t]) best[t] = c[t];
  }
  free(cnt);
  int64_t lb = 0;
  for (int t = 0; t < T; t++) lb += best[t];
  return lb;
}

/* Lane-wise max of two words of counters, each below half its lane (H:
 * the lanes' high bits, w: the lane width): the high bit of a lane of
 * (a | H) - b is set where a's lane >= b's (no borrow crosses a lane,
 * since every lane of a | H is at least half its range and b's is
 * below), widened to the lane's mask. */
static inline uint64_t max_lanes(uint64_t a, uint64_t b, uint64_t H, int w) {
  uint64_t ge = ((a | H) - b) & H;
  uint64_t m = ge | (ge - (ge >> (w - 1)));
  return b ^ ((a ^ b) & m);
}

_Static_assert(CN_MAX_TYPES <= 8, "a type's counter fits a byte lane");

/* The lane-wise max of cnt[0 .. nv) (lanes of w bits, each below half
 * its lane). With SSE2, two words at a time: signed 16-bit lanes (a
 * value below half its lane is not negative) or unsigned 8-bit ones. */
static uint64_t max_all_lanes(const uint64_t *cnt, int32_t nv, uint64_t H,
                              const int w) {
  uint64_t best = 0;
  int32_t v = 0;
#ifdef __SSE2__
  __m128i m = _mm_setzero_si128();
  for (; v + 2 <= nv; v += 2) {
    __m128i x = _mm_loadu_si128((const __m128i *)(cnt + v));
    m = w == 16 ? _mm_max_epi16(m, x) : _mm_max_epu8(m, x);
  }
  uint64_t two[2];
  _mm_storeu_si128((__m128i *)two, m);
  best = max_lanes(two[0], two[1], H, w);
#endif
  for (; v < nv; v++) best = max_lanes(best, cnt[v], H, w);
  return best;
}

/* The bound in lanes of w bits (16 or 8), cnt: nv words of scratch; -2
 * where a counter reaches half its lane. A type not below n_types counts
 * in no lane (one[] is 0 there). Inlined once per lane width, so that w
 * is a constant. */
__attribute__((always_inline)) static inline int64_t
lower_bound_lanes(const cn_dag *g, uint64_t *cnt, const int w) {
  const int T = g->n_types;
  const uint64_t H = w == 16 ? 0x8000800080008000ull : 0x8080808080808080ull;
  const int32_t *is = g->in_start, *ie = g->in_edges, nv = g->nv;
  const uint8_t *vt = g->vtype;
  uint64_t one[256] = {0}, over = 0; /* one[t]: 1 in type t's lane */
  for (int t = 0; t < T; t++) one[t] = (uint64_t)1 << (w * t);
  for (int32_t v = 0; v < nv; v++) {
    int32_t i = is[v], e = is[v + 1];
    uint64_t c = i < e ? cnt[ie[i++]] : 0;
    for (; i < e; i++) c = max_lanes(c, cnt[ie[i]], H, w);
    c += one[vt[v]];
    over |= c; /* the first counter to reach half its lane sets its bit */
    cnt[v] = c;
  }
  if (over & H) return -2;
  /* cnt only grows along edges, so the most of each type on a path is
   * the most in any vertex's counter */
  uint64_t best = max_all_lanes(cnt, nv, H, w);
  int64_t lb = 0;
  for (int t = 0; t < T; t++)
    lb += (int64_t)(best >> (w * t) & (((uint64_t)1 << w) - 1));
  return lb;
}

/* Why not the wide counters only: they cost a calloc of nv × T int32 and
 * a loop over the types per edge, as much as planning the run itself.
 * The same counters fit one word per vertex, a lane per type (16 bits
 * for up to 4 types, 8 for up to 8), while each stays below half its
 * lane (32,768 or 128 vertices of a type along a path); the max over an
 * edge is then a few word operations. A counter reaching half its lane
 * hands the DAG to the wide counters from the start: the same value
 * either way. */
int64_t cn__dag_lower_bound(const cn_dag *g) {
  int T = g->n_types;
  if (g->nv == 0) return 0;
  if (T < 1 || T > CN_MAX_TYPES) return lower_bound_wide(g);
  uint64_t *cnt = malloc((size_t)g->nv * sizeof(uint64_t));
  if (cnt == NULL) return -1;
  int64_t lb = T <= 4 ? lower_bound_lanes(g, cnt, 16)
                      : lower_bound_lanes(g, cnt, 8);
  free(cnt);
  return lb == -2 ? lower_bound_wide(g) : lb;
}

/* tail[v×T + t]: the most type-t vertices on a path from v to a sink,
 * consumers after v (inputs come first). */
void cn__dag_fill_tails(const cn_dag *g, const int32_t *out_start,
                        const int32_t *out_edges, int32_t *tail) {
  int T = g->n_types;
  for (int32_t v = g->nv - 1; v >= 0; v--) {
    int32_t *tv = tail + (size_t)v * T;
    for (int32_t e = out_start[v]; e < out_start[v + 1]; e++) {
      const int32_t *tu = tail + (size_t)out_edges[e] * T;
      for (int t = 0; t < T; t++)
        if (tu[t] > tv[t]) tv[t] = tu[t];
    }
    tv[g->vtype[v]]++;
  }
}

static int32_t uf_root(int32_t *up, int32_t v) {
  while (up[v] != v) v = up[v] = up[up[v]]; /* path halving */
  return v;
}

int32_t cn__dag_components(const cn_dag *g, int32_t *comp) {
  int32_t *up = comp;
  for (int32_t v = 0; v < g->nv; v++) {
    up[v] = v;
    for (int32_t i = g->in_start[v]; i < g->in_start[v + 1]; i++) {
      int32_t a = uf_root(up, g->in_edges[i]), b = uf_root(up, v);
      if (a != b) up[a > b ? a : b] = a < b ? a : b;
    }
  }
  /* A root is its component's smallest vertex (unions hang the larger
   * root under the smaller), so it is labelled before the rest: labels
   * are kept as -(label + 1) until every vertex has one. */
  for (int32_t v = 0; v < g->nv; v++) up[v] = uf_root(up, v);
  int32_t n = 0;
  for (int32_t v = 0; v < g->nv; v++)
    up[v] = up[v] == v ? -(++n) : up[up[v]];
  for (int32_t v = 0; v < g->nv; v++) up[v] = -up[v] - 1;
  return n;
}

uint32_t cn__dag_feeding_types(const cn_dag *g) {
  uint32_t m = 0;
  for (int32_t e = 0; e < g->in_start[g->nv]; e++)
    m |= 1u << g->vtype[g->in_edges[e]];
  return m;
}

int cn__dag_consumers(const cn_dag *g, int32_t **out_start,
                      int32_t **out_edges) {
  int32_t nv = g->nv;
  size_t ne = (size_t)g->in_start[nv];
  int32_t *start = cn__xcalloc((size_t)nv + 2, sizeof(int32_t));
  int32_t *edges = cn__xcalloc(ne + 1, sizeof(int32_t));
  *out_start = start;
  *out_edges = edges;
  if (start == NULL || edges == NULL) return CN_E_NOMEM;
  for (size_t e = 0; e < ne; e++) start[g->in_edges[e] + 2]++;
  for (int32_t v = 0; v < nv; v++) start[v + 2] += start[v + 1];
  for (int32_t v = 0; v < nv; v++) /* start[u + 1]: u's fill cursor */
    for (int32_t e = g->in_start[v]; e < g->in_start[v + 1]; e++)
      edges[start[g->in_edges[e] + 1]++] = v;
  return 0;
}

int32_t *cn__dag_tails(const cn_dag *g, const int32_t *out_start,
                       const int32_t *out_edges) {
  int32_t *tail = cn__xcalloc((size_t)g->nv * (size_t)g->n_types + 1,
                              sizeof(int32_t));
  if (tail != NULL) cn__dag_fill_tails(g, out_start, out_edges, tail);
  return tail;
}

static const char *const policy_names[CN_POLICY__COUNT] = {
    "none",      "depth",      "agenda", "sufficient",
    "lookahead", "lookahead2", "plan",   "fsm"};

const char *cn_policy_name(cn_policy_kind p) {
  return p >= 0 && p < CN_POLICY__COUNT ? policy_names[p] : "?";
}

int cn_policy_parse(const char *name, cn_policy_kind *out) {
  for (int p = 0; p < CN_POLICY__COUNT; p++)
    if (strcmp(name, policy_names[p]) == 0) {
      *out = (cn_policy_kind)p;
      return 0;
    }
  return CN_E_BAD_CONFIG;
}
