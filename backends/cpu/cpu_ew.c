/* cpu_ew.c - the CPU backend's fused elementwise programs (backend.h
 * cn_ew_prog): a compiled cell's elementwise instructions run a tile of
 * rows at a time in vector blocks (fastmath.h), the loops compiled once
 * per instruction set. cpu.c owns the context and calls
 * cn__cpu_ew_program; the tests force each copy (cpu_ew.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_ew.h"
#include "fastmath.h"

/* The fused loops are compiled three times, for AVX-512, AVX2 and the
 * x86-64 baseline (ew_rows_wide, ew_rows_avx2, ew_rows_base), and
 * cpu_ew_program picks one by what the CPU supports. None of the three may
 * contract a multiply and an add into FMA (avx512f alone does not enable
 * it), so each computes the same floats, only wider: answers do not depend
 * on which the CPU runs. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CN_EW_X86 1
#define CN_EW_TARGET(t) __attribute__((target(t)))
#else
#define CN_EW_X86 0
#define CN_EW_TARGET(t)
#endif

/* ---- the fused elementwise program (backend.h cn_ew_prog) ----
 *
 * Rows go through the program a tile at a time: each instruction runs over
 * every row of the tile before the next one starts, so its op is decoded
 * once per tile rather than once per row. An instruction whose operands
 * all lie at fixed strides (rows of the batch, the tile's scratch, a
 * constant or broadcast row) is one two-dimensional loop over the tile,
 * each row a few vector operations with no decoding, no pointer lookup
 * and no overlap check (at H = 8 an instruction is 8 floats, and the
 * bookkeeping around them cost many times the arithmetic). The per-row
 * scratch (the tmp slot) is one row per row of the tile, the tile as long
 * as keeps it within EW_TILE_BYTES (in L1 with the rows' operands). Rows
 * are independent (backend.h), so the order changes no value: every float
 * is the same expression of the same operands.
 *
 * A segment loop's instructions run per edge, in edge order, row by row,
 * as the contract states them: they may write the per-row scratch that
 * the next edge overwrites. */
#define EW_TILE_BYTES 16384
#define EW_TILE_MAX 64

/* The op expressions' functions (backend.h CN_EW_OPS), from fastmath.h,
 * on a float or on a block of 8 or 16 (the same bits either way). */
#define EW_FN_(x, f)                                                       \
  _Generic((x), cn_v16: f##_v16, cn_v8: f##_v8, default: f)(x)
#define cn_ew_sigmoid(x) EW_FN_(x, cn_sigmoid)
#define cn_ew_tanh(x) EW_FN_(x, cn_tanh)
#define cn_ew_exp(x) EW_FN_(x, cn_exp)
#define cn_ew_relu(x) EW_FN_(x, cn_relu)
#define cn_ew_step(x) EW_FN_(x, cn_step)

/* How an operand's row is found, resolved once per program:
 * EWK_ROWS base + r·ld (ld 0: a broadcast row); EWK_OFF base + off[r],
 * a missing row (off < 0) reads `zero` and is not written; EWK_TMP the
 * tile's scratch, base + t·ld for the row's place t in the tile;
 * EWK_FIXED base (a constant row); EWK_NONE: a unary op's b, or a
 * constant d (nothing is written). */
enum { EWK_ROWS, EWK_OFF, EWK_TMP, EWK_FIXED, EWK_NONE };

typedef struct ew_operand {
  float *base;
  const int64_t *off;
  int64_t ld;
  int kind;
  int edge; /* in a segment loop: indexed by the edge, not the row */
} ew_operand;

typedef struct ew_step {
  int op, width;
  bool serial; /* d overlaps a or b at other columns: one float at a time */
  bool flat;   /* every operand at a fixed stride: one 2-D loop a tile */
  ew_operand x[3]; /* d, a, b */
} ew_step;

/* For each op of the list, four loops (blocks of 16 only where `wide`):
 * ew_<op>: one row of w floats, in blocks of 16 and 8 (vectors: each
 *   read whole before any of it is written, so d may be a or b exactly,
 *   an accumulating chain; no overlap check), then the floats left one by
 *   one;
 * ew_<op>_pair: that on two rows at once, where w % 16 >= 8: each row's
 *   blocks of 16, then the two rows' last 8 as one vector of 16 (at H = 8
 *   a row is 8 floats: half the vector operations, full-width exp and
 *   divides). Each float is the same expression of the same operands as
 *   in ew_<op> (fastmath.h: a lane has the same bits in a vector of 8 or
 *   16), and within a row the blocks keep their order;
 * ew_<op>_2d: over `rows` rows, each operand ld floats after the last
 *   (ld 0: the same row every time): two rows at a time where pairs pay
 *   (EW_PAIR_PAYS), else one loop over the blocks where w is a multiple
 *   of the block (EW_BLOCKS_2D), else row by row;
 * ew_<op>_serial: the plain loop in column order, for an instruction
 *   whose d overlaps a source at other columns (core emits none). */
/* One block of V at column j: a (and b) loaded, EXPR stored to d. */
#define EW_ONE(V, ARITY, EXPR)                                             \
  do {                                                                     \
    V a, b = {0}, d_;                                                      \
    memcpy(&a, pa + j, sizeof(V));                                         \
    if (ARITY == 2) memcpy(&b, pb + j, sizeof(V));                         \
    (void)b;                                                               \
    d_ = (EXPR);                                                           \
    memcpy(pd + j, &d_, sizeof(V));                                        \
  } while (0)
#define EW_BLOCK(V, ARITY, EXPR)                                           \
  for (; j + (int)(sizeof(V) / 4) <= w; j += (int)(sizeof(V) / 4))        \
    EW_ONE(V, ARITY, EXPR);
/* `rows` rows of w floats, w a multiple of the block, as one loop over
 * the blocks: row by row, each row's blocks in order (the blocks
 * EW_BLOCK makes of it), with nothing to set up per row, so the op's
 * constants stay in registers across the rows (at H = 8 a row is one
 * block, and setting up exp's constants per row cost a third as much
 * again). */
#define EW_BLOCKS_2D(V, ARITY, EXPR)                                       \
  for (int j = 0; r < rows;) {                                             \
    EW_ONE(V, ARITY, EXPR);                                                \
    j += (int)(sizeof(V) / 4);                                             \
    if (j == w) {                                                          \
      j = 0;                                                               \
      r++;                                                                 \
      pd += ldd;                                                           \
      pa += lda;                                                           \
      pb += ldb;                                                           \
    }                                                                      \
  }
/* Two blocks of 8 (x at j of rows 0 and 1) as one vector of 16, and back */
#define EW_LO16 0, 1, 2, 3, 4, 5, 6, 7
#define EW_HI16 8, 9, 10, 11, 12, 13, 14, 15
#define EW_JOIN(x0, x1, j)                                                 \
  __extension__({                                                          \
    cn_v8 lo_, hi_;                                                        \
    memcpy(&lo_, (x0) + (j), sizeof(lo_));                                 \
    memcpy(&hi_, (x1) + (j), sizeof(hi_));                                 \
    __builtin_shufflevector(lo_, hi_, EW_LO16, EW_HI16);                   \
  })
/* Whether two rows' last 8 floats pay as one vector of 16: for exp and
 * what is made of it (a few dozen operations a vector, then half as many
 * vectors); an add or a product costs less than joining and splitting the
 * rows, and a divide takes as long per float either way. */
#define EW_PAIR_PAYS(OP)                                                   \
  ((OP) == CN_EW_SIGMOID || (OP) == CN_EW_TANH || (OP) == CN_EW_EXP)
#define EW_OP_FN(NAME, ARITY, EXPR)                                        \
  __attribute__((always_inline)) static inline void ew_##NAME(             \
      int w, float *pd, const float *pa, const float *pb, bool wide) {     \
    int j = 0;                                                             \
    if (wide) EW_BLOCK(cn_v16, ARITY, EXPR)                                \
    EW_BLOCK(cn_v8, ARITY, EXPR)                                           \
    for (; j < w; j++) {                                                   \
      float a = pa[j], b = ARITY == 2 ? pb[j] : 0.0f;                      \
      (void)b;                                                             \
      pd[j] = (EXPR);                                                      \
    }                                                                      \
  }                                                                        \
  __attribute__((always_inline)) static inline void ew_##NAME##_pair(      \
      int w, float *pd0, float *pd1, const float *pa0, const float *pa1,   \
      const float *pb0, const float *pb1) {                                \
    int j0 = w & ~15, j = 0;                                               \
    {                                                                      \
      float *pd = pd0;                                                     \
      const float *pa = pa0, *pb = pb0;                                    \
      EW_BLOCK(cn_v16, ARITY, EXPR)                                        \
    }                                                                      \
    j = 0;                                                                 \
    {                                                                      \
      float *pd = pd1;                                                     \
      const float *pa = pa1, *pb = pb1;                                    \
      EW_BLOCK(cn_v16, ARITY, EXPR)                                        \
    }                                                                      \
    {                                                                      \
      cn_v16 a = EW_JOIN(pa0, pa1, j0), b = {0}, d_;                       \
      if (ARITY == 2) b = EW_JOIN(pb0, pb1, j0);                           \
      (void)b;                                                             \
      d_ = (EXPR);                                                         \
      cn_v8 lo = __builtin_shufflevector(d_, d_, EW_LO16);                 \
      cn_v8 hi = __builtin_shufflevector(d_, d_, EW_HI16);                 \
      memcpy(pd0 + j0, &lo, sizeof(lo));                                   \
      memcpy(pd1 + j0, &hi, sizeof(hi));                                   \
    }                                                                      \
    for (j = j0 + 8; j < w; j++) { /* w % 8 floats, row by row */          \
      float a = pa0[j], b = ARITY == 2 ? pb0[j] : 0.0f;                    \
      (void)b;                                                             \
      pd0[j] = (EXPR);                                                     \
      a = pa1[j], b = ARITY == 2 ? pb1[j] : 0.0f;                          \
      pd1[j] = (EXPR);                                                     \
    }                                                                      \
  }                                                                        \
  __attribute__((always_inline)) static inline void ew_##NAME##_2d(        \
      int64_t rows, int w, float *pd, int64_t ldd, const float *pa,        \
      int64_t lda, const float *pb, int64_t ldb, bool wide) {              \
    int64_t r = 0;                                                         \
    bool pair = wide && EW_PAIR_PAYS(CN_EW_##NAME) && (w & 15) >= 8;       \
    if (!pair && w > 0 && w % (wide ? 16 : 8) == 0) {                      \
      if (wide)                                                            \
        EW_BLOCKS_2D(cn_v16, ARITY, EXPR)                                  \
      else                                                                 \
        EW_BLOCKS_2D(cn_v8, ARITY, EXPR)                                   \
      return;                                                              \
    }                                                                      \
    if (pair)                                                              \
      for (; r + 2 <= rows; r += 2) {                                      \
        ew_##NAME##_pair(w, pd, pd + ldd, pa, pa + lda, pb, pb + ldb);     \
        pd += 2 * ldd;                                                     \
        pa += 2 * lda;                                                     \
        pb += 2 * ldb;                                                     \
      }                                                                    \
    for (; r < rows; r++) {                                                \
      ew_##NAME(w, pd, pa, pb, wide);                                      \
      pd += ldd;                                                           \
      pa += lda;                                                           \
      pb += ldb;                                                           \
    }                                                                      \
  }                                                                        \
  static void ew_##NAME##_serial(int w, float *pd, const float *pa,        \
                                 const float *pb) {                        \
    for (int j = 0; j < w; j++) {                                          \
      float a = pa[j], b = ARITY == 2 ? pb[j] : 0.0f;                      \
      (void)b;                                                             \
      pd[j] = (EXPR);                                                      \
    }                                                                      \
  }
CN_EW_OPS(EW_OP_FN)
#undef EW_OP_FN

/* Operand x's row at the tile's first row r0, and the floats from one
 * row to the next (a flat step's operands only). */
static inline float *ew_flat(const ew_operand *o, int64_t r0, int64_t *ld) {
  switch (o->kind) {
  case EWK_ROWS: *ld = o->ld; return o->base + r0 * o->ld;
  case EWK_TMP: *ld = o->ld; return o->base;
  default: *ld = 0; return o->base;
  }
}

/* An operand over the rows of one call of ew_step_rows, resolved once:
 * row k (0 ..) at p + k·ld, or, where off != NULL, at base + off[k]
 * (NULL where off[k] < 0: a missing row). NONE: every row NULL. */
typedef struct ew_rowsof {
  float *p, *base;
  const int64_t *off;
  int64_t ld;
} ew_rowsof;

__attribute__((always_inline)) static inline ew_rowsof
ew_rows_of(const ew_operand *o, int64_t i0, int64_t t) {
  switch (o->kind) {
  case EWK_ROWS: return (ew_rowsof){o->base + i0 * o->ld, NULL, NULL, o->ld};
  case EWK_OFF: return (ew_rowsof){NULL, o->base, o->off + i0, 0};
  case EWK_TMP: return (ew_rowsof){o->base + t * o->ld, NULL, NULL, o->ld};
  case EWK_FIXED: return (ew_rowsof){o->base, NULL, NULL, 0};
  default: return (ew_rowsof){NULL, NULL, NULL, 0};
  }
}

__attribute__((always_inline)) static inline float *
ew_row_k(const ew_rowsof *o, int64_t k) {
  if (o->off != NULL) return o->off[k] < 0 ? NULL : o->base + o->off[k];
  return o->p + k * o->ld;
}

/* Step s on the rows [r0, r1) of the tile starting at row t0; in a
 * segment loop (r1 = r0 + 1) its edge operands at edge e. Always inlined:
 * each copy of ew_rows (one per instruction set) gets its own vectorised
 * copy.
 * Operands left where they lie (off) and edge operands are resolved once
 * per call, then row by row; a row with no destination is not written,
 * a missing source reads `zero`. */
__attribute__((always_inline)) static inline void
ew_step_rows(const ew_step *s, int64_t r0, int64_t r1, int64_t t0, int64_t e,
             const float *zero, bool wide) {
  const int w = s->width;
  if (s->flat) { /* the rows [r0, r1) as one 2-D loop */
    int64_t ldd, lda, ldb = 0;
    float *d = ew_flat(&s->x[0], r0, &ldd);
    const float *a = ew_flat(&s->x[1], r0, &lda), *b = a;
    if (s->x[2].kind != EWK_NONE) b = ew_flat(&s->x[2], r0, &ldb);
    switch (s->op) {
#define EW_CASE(NAME, ARITY, EXPR)                                         \
  case CN_EW_##NAME:                                                       \
    ew_##NAME##_2d(r1 - r0, w, d, ldd, a, lda, b, ldb, wide);              \
    break;
      CN_EW_OPS(EW_CASE)
#undef EW_CASE
    default: break;
    }
    return;
  }
  ew_rowsof x[3];
  for (int q = 0; q < 3; q++)
    x[q] = ew_rows_of(&s->x[q], s->x[q].edge ? e : r0, r0 - t0);
  const int64_t rows = r1 - r0;
  switch (s->op) {
/* the rows one by one, the serial loop or the vector one chosen once */
#define EW_ROWS_LOOP(ARITY, CALL)                                          \
  for (int64_t k = 0; k < rows; k++) {                                     \
    float *d = ew_row_k(&x[0], k);                                         \
    const float *a = ew_row_k(&x[1], k), *b = zero;                        \
    if (a == NULL) a = zero;                                               \
    if (ARITY == 2) {                                                      \
      b = ew_row_k(&x[2], k);                                              \
      if (b == NULL) b = zero;                                             \
    }                                                                      \
    if (d == NULL) continue; /* never write a missing row */              \
    CALL;                                                                  \
  }
#define EW_CASE(NAME, ARITY, EXPR)                                         \
  case CN_EW_##NAME:                                                       \
    if (s->serial)                                                         \
      EW_ROWS_LOOP(ARITY, ew_##NAME##_serial(w, d, a, b))                  \
    else                                                                   \
      EW_ROWS_LOOP(ARITY, ew_##NAME(w, d, a, b, wide))                     \
    break;
    CN_EW_OPS(EW_CASE)
#undef EW_CASE
#undef EW_ROWS_LOOP
  default: break;
  }
}

/* The rows [0, n) through every step, a tile of `tile` rows at a time;
 * the segment loop's steps [eb, ee) once per edge of each row. Inlined
 * into one function per instruction set (below), the ops' loops with it.
 * wide: vectors of 16 (and two rows of 8 as one) where the instruction
 * set has them. Without AVX-512, gcc lowers a 16-float vector's
 * comparisons and shuffles float by float (exp's clamps and floor: a
 * few hundred scalar instructions a vector), so there blocks of 8 do
 * all the work: the same floats (fastmath.h), each row in one pass. */
typedef struct ew_run {
  const ew_step *st;
  int n_st, eb, ee;
  int64_t n, tile;
  const float *zero;
  const int64_t *seg;
} ew_run;

__attribute__((always_inline)) static inline void ew_rows(const ew_run *u,
                                                          bool wide) {
  const ew_step *st = u->st;
  const int eb = u->eb, ee = u->ee;
  for (int64_t r0 = 0; r0 < u->n; r0 += u->tile) {
    int64_t r1 = r0 + u->tile < u->n ? r0 + u->tile : u->n;
    for (int i = 0; i < eb; i++)
      ew_step_rows(&st[i], r0, r1, r0, 0, u->zero, wide);
    for (int64_t r = r0; ee > eb && r < r1; r++)
      for (int64_t e = u->seg[r]; e < u->seg[r + 1]; e++)
        for (int i = eb; i < ee; i++)
          ew_step_rows(&st[i], r, r + 1, r0, e, u->zero, wide);
    for (int i = ee > eb ? ee : eb; i < u->n_st; i++)
      ew_step_rows(&st[i], r0, r1, r0, 0, u->zero, wide);
  }
}

CN_EW_TARGET("avx512f") static void ew_rows_wide(const ew_run *u) {
  ew_rows(u, true);
}
#if CN_EW_X86
CN_EW_TARGET("avx2") static void ew_rows_avx2(const ew_run *u) {
  ew_rows(u, false);
}
static void ew_rows_base(const ew_run *u) { ew_rows(u, false); }
#endif

/* The copy cn__cpu_ew_force chose: 0 the widest this CPU runs, 1 wide,
 * 2 avx2, 3 base. */
static int ew_forced;

int cn__cpu_ew_force(const char *name) {
  int k = name == NULL ? 0
          : strcmp(name, "wide") == 0 ? 1
          : strcmp(name, "avx2") == 0 ? 2
          : strcmp(name, "base") == 0 ? 3 : -1;
#if CN_EW_X86
  if (k == 1 && !__builtin_cpu_supports("avx512f")) k = -1;
  if (k == 2 && !__builtin_cpu_supports("avx2")) k = -1;
#else
  if (k > 1) k = -1;
#endif
  if (k < 0) return -1;
  ew_forced = k;
  return 0;
}

/* The copy of ew_rows for this CPU's widest vectors (or the forced one). */
static void ew_rows_run(const ew_run *u) {
#if CN_EW_X86
  int k = ew_forced;
  if (k == 0)
    k = __builtin_cpu_supports("avx512f") ? 1
        : __builtin_cpu_supports("avx2") ? 2 : 3;
  if (k == 1)
    ew_rows_wide(u);
  else if (k == 2)
    ew_rows_avx2(u);
  else
    ew_rows_base(u);
#else
  ew_rows_wide(u);
#endif
}

/* Whether operands x and y of one instruction of width w are the same
 * slot at overlapping but different columns (core's compiler emits none;
 * the plain loop keeps such an instruction's column order). */
static bool ew_shifted(const cn_ew_arg *x, const cn_ew_arg *y, int w) {
  return x->slot >= 0 && x->slot == y->slot && x->col != y->col &&
         x->col < y->col + w && y->col < x->col + w;
}

/* Resolves operand q (0: d, 1: a, 2: b) of instruction i: a constant
 * becomes a row of k at *kp (a constant d writes nothing), the tmp slot
 * the tile's scratch. */
static void ew_resolve(const cn_ew_prog *p, const cn_ew_slot *slots, int i,
                       int q, float *tmp, float **kp, ew_operand *o) {
  const cn_ew_insn *in = &p->insn[i];
  const cn_ew_arg *x = q == 0 ? &in->d : q == 1 ? &in->a : &in->b;
  bool loop = p->edge_end > p->edge_begin && p->seg != NULL;
  *o = (ew_operand){NULL, NULL, 0, EWK_NONE, 0};
  if (q == 2 && !cn_ew_binary(in->op)) return;
  if (x->slot < 0) {
    if (q == 0) return;
    o->kind = EWK_FIXED;
    for (int j = 0; j < in->width; j++) (*kp)[j] = x->k;
    o->base = *kp;
    *kp += in->width;
  } else if (x->slot == p->tmp_slot) {
    o->kind = EWK_TMP;
    o->base = tmp + x->col;
    o->ld = p->tmp_width;
  } else {
    const cn_ew_slot *sl = &slots[x->slot];
    /* a slot with no rows in this batch may have no base: no offset is
     * applied to a null pointer (undefined in C) */
    o->base = sl->base != NULL ? sl->base + x->col : NULL;
    o->off = sl->off;
    o->ld = sl->ld;
    o->kind = sl->off != NULL ? EWK_OFF : EWK_ROWS;
    o->edge = loop && i >= p->edge_begin && i < p->edge_end &&
              x->slot >= p->edge_slot0;
  }
}

int cn__cpu_ew_widest(const cn_ew_prog *p) {
  int maxw = 1;
  for (int i = 0; i < p->n_insn; i++)
    if (p->insn[i].width > maxw) maxw = p->insn[i].width;
  return maxw;
}

void cn__cpu_ew_ws_free(cn__cpu_ew_ws *c) {
  free(c->ew);
  free(c->ew_steps);
}

/* The fused elementwise program (Cavs' fusion). Constants become rows of
 * k, made once; each operand is resolved to (base, ld | off) once. */
void cn__cpu_ew_program(cn__cpu_ew_ws *c, const float *zero,
                        const cn_ew_prog *p, const cn_ew_slot *slots, int n) {
  if (n <= 0 || p->n_insn <= 0) return;
  int64_t tw = p->tmp_slot >= 0 && p->tmp_width > 0 ? p->tmp_width : 0;
  int64_t tile = tw > 0 ? EW_TILE_BYTES / ((int64_t)sizeof(float) * tw) : n;
  if (tile > EW_TILE_MAX) tile = EW_TILE_MAX;
  if (tile < 1) tile = 1;
  if (tile > n) tile = n;
  int64_t need = tile * tw;
  for (int i = 0; i < p->n_insn; i++) {
    const cn_ew_insn *in = &p->insn[i];
    if (in->a.slot < 0) need += in->width;
    if (in->b.slot < 0 && cn_ew_binary(in->op)) need += in->width;
  }
  if (p->n_insn > c->n_ew_steps) {
    ew_step *t = realloc(c->ew_steps, (size_t)p->n_insn * sizeof(ew_step));
    if (t == NULL) abort(); /* a compiled cell's instructions: a few */
    c->ew_steps = t;
    c->n_ew_steps = p->n_insn;
  }
  if (need > c->n_ew) {
    float *w = realloc(c->ew, (size_t)need * sizeof(float));
    if (w == NULL) abort(); /* sized by a compiled cell: a few KiB */
    c->ew = w;
    c->n_ew = need;
  }
  bool loop = p->edge_end > p->edge_begin && p->seg != NULL;
  /* c->ew stays NULL while no program needed scratch: no offset on it */
  float *tmp = c->ew, *kp = c->ew != NULL ? c->ew + tile * tw : NULL;
  ew_step *st = c->ew_steps;
  for (int i = 0; i < p->n_insn; i++) {
    const cn_ew_insn *in = &p->insn[i];
    ew_step *s = &st[i];
    s->op = in->op;
    s->width = in->width;
    s->serial = ew_shifted(&in->d, &in->a, in->width) ||
                (cn_ew_binary(in->op) &&
                 ew_shifted(&in->d, &in->b, in->width));
    s->flat = !s->serial;
    for (int q = 0; q < 3; q++) {
      ew_operand *o = &s->x[q];
      ew_resolve(p, slots, i, q, tmp, &kp, o);
      if (o->kind == EWK_OFF || o->edge || (q == 0 && o->kind == EWK_NONE))
        s->flat = false;
    }
  }
  ew_run u = {st, p->n_insn, loop ? p->edge_begin : 0,
              loop ? p->edge_end : 0, n, tile, zero, p->seg};
  ew_rows_run(&u);
}
