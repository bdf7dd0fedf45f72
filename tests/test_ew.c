/* test_ew.c - the cpu backend's fused elementwise program (backend.h
 * cn_ew_prog) against a plain reference, under every copy of its loops.
 *
 * - Random programs (every op, widths 1 .. 40, operands that are rows of
 *   the batch, rows found through an index with missing ones, a broadcast
 *   row, constants and the per-row scratch) give, under each copy this
 *   CPU runs (cpu_ew.h: vectors of 16, of 8, the baseline), exactly the
 *   floats of the reference: the contract's instructions evaluated in
 *   order, row by row and column by column, with fastmath.h's scalar
 *   functions (whose operations the vector forms repeat lane by lane).
 * - A row's floats do not depend on how many rows share the call (1 row
 *   alone, against all rows at once).
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "cpu/cpu_ew.h"
#pragma GCC diagnostic ignored "-Wpsabi"
#include "cpu/fastmath.h"

enum { NR = 70, W0 = 48, W1 = 40, WB = 40, WO = 40, TW = 40, MAXI = 12 };
enum { S_IN, S_IDX, S_BIAS, S_OUT, S_TMP, N_SLOTS };

static uint32_t rng = 12345;
static uint32_t next(void) {
  rng = rng * 1664525u + 1013904223u;
  return rng >> 8;
}
static float unit(void) { return (float)(next() % 20001) / 2500.0f - 4.0f; }

/* The slots' widths (the tmp slot's is TW). */
static int width_of(int slot) {
  static const int w[N_SLOTS] = {W0, W1, WB, WO, TW};
  return w[slot];
}

/* One operand of width w: a slot at a column where w fits, or (src) a
 * constant. */
static cn_ew_arg arg(int w, bool src) {
  static const int dsts[] = {S_TMP, S_OUT, S_IDX};
  int slot = src ? (int)(next() % (N_SLOTS + 1)) - 1 : dsts[next() % 3];
  if (slot < 0) return (cn_ew_arg){-1, 0, unit()};
  int room = width_of(slot) - w;
  return (cn_ew_arg){(int16_t)slot, room > 0 ? (int32_t)(next() % (room + 1)) : 0,
                     0.0f};
}

/* A program: the scratch filled first (it starts undefined), then random
 * instructions. exp reads only the inputs (|x| <= 4) and a divide divides
 * by the bias (|b| >= 0.5), so every value stays finite. */
static int make_program(cn_ew_insn *in) {
  int n = 0;
  in[n++] = (cn_ew_insn){CN_EW_MOV, TW, {S_TMP, 0, 0}, {S_IN, 0, 0}, {-1, 0, 0}};
  int k = 3 + (int)(next() % (MAXI - 3));
  while (n < k) {
    int op = (int)(next() % CN_EW__COUNT);
    int w = 1 + (int)(next() % 40);
    cn_ew_insn x = {(uint8_t)op, w, arg(w, false), arg(w, true), arg(w, true)};
    if (op == CN_EW_EXP) x.a = (cn_ew_arg){S_IN, (int32_t)(next() % (W0 - w + 1)), 0};
    if (op == CN_EW_DIV) x.b = (cn_ew_arg){S_BIAS, (int32_t)(next() % (WB - w + 1)), 0};
    in[n++] = x;
  }
  return n;
}

/* The contract, one float at a time. */
static float ref_op(int op, float a, float b) {
  switch (op) {
#define cn_ew_sigmoid(x) cn_sigmoid(x)
#define cn_ew_tanh(x) cn_tanh(x)
#define cn_ew_exp(x) cn_exp(x)
#define cn_ew_relu(x) cn_relu(x)
#define cn_ew_step(x) cn_step(x)
#define REF_CASE(NAME, ARITY, EXPR) case CN_EW_##NAME: return (EXPR);
    CN_EW_OPS(REF_CASE)
#undef REF_CASE
  default: return 0.0f;
  }
}

typedef struct batch {
  float *in, *idx, *bias, *out;
  int64_t off[NR];
} batch;

static float *row_ptr(batch *b, float *tmp, int slot, int r, int col) {
  switch (slot) {
  case S_IN: return b->in + (size_t)r * W0 + col;
  case S_IDX: return b->off[r] < 0 ? NULL : b->idx + b->off[r] + col;
  case S_BIAS: return b->bias + col;
  case S_OUT: return b->out + (size_t)r * WO + col;
  default: return tmp + col;
  }
}

static void reference(const cn_ew_insn *in, int n_insn, batch *b, int rows) {
  static const float zero[64];
  float tmp[TW];
  for (int r = 0; r < rows; r++)
    for (int i = 0; i < n_insn; i++) {
      const cn_ew_insn *x = &in[i];
      float *d = row_ptr(b, tmp, x->d.slot, r, x->d.col);
      const float *pa = x->a.slot < 0 ? NULL : row_ptr(b, tmp, x->a.slot, r, x->a.col);
      const float *pb = x->b.slot < 0 ? NULL : row_ptr(b, tmp, x->b.slot, r, x->b.col);
      if (x->a.slot >= 0 && pa == NULL) pa = zero;
      if (x->b.slot >= 0 && pb == NULL) pb = zero;
      if (d == NULL) continue;
      for (int j = 0; j < x->width; j++) {
        float a = pa ? pa[j] : x->a.k, bb = pb ? pb[j] : x->b.k;
        d[j] = ref_op(x->op, a, bb);
      }
    }
}

static float *floats(size_t n) {
  float *p = malloc(n * sizeof(float));
  cr_assert_not_null(p);
  for (size_t i = 0; i < n; i++) p[i] = unit();
  return p;
}

/* A fresh batch: inputs random, the index a permutation of rows with
 * every fifth missing, the bias away from zero. */
static void batch_make(batch *b) {
  b->in = floats((size_t)NR * W0);
  b->idx = floats((size_t)NR * W1);
  b->bias = floats(WB);
  for (int j = 0; j < WB; j++) b->bias[j] = b->bias[j] < 0 ? b->bias[j] - 0.5f : b->bias[j] + 0.5f;
  b->out = floats((size_t)NR * WO);
  for (int r = 0; r < NR; r++)
    b->off[r] = r % 5 == 3 ? -1 : (int64_t)((r * 37) % NR) * W1;
}

static void batch_copy(batch *d, const batch *s) {
  d->in = malloc((size_t)NR * W0 * 4), d->idx = malloc((size_t)NR * W1 * 4);
  d->bias = malloc(WB * 4), d->out = malloc((size_t)NR * WO * 4);
  memcpy(d->in, s->in, (size_t)NR * W0 * 4);
  memcpy(d->idx, s->idx, (size_t)NR * W1 * 4);
  memcpy(d->bias, s->bias, WB * 4);
  memcpy(d->out, s->out, (size_t)NR * WO * 4);
  memcpy(d->off, s->off, sizeof(s->off));
}

static void batch_free(batch *b) {
  free(b->in), free(b->idx), free(b->bias), free(b->out);
}

/* The program on rows [r0, r0 + n) of b through the backend. */
static void run(cn_backend_ctx *bk, const cn_ew_insn *in, int n_insn,
                batch *b, int r0, int n) {
  cn_ew_slot sl[N_SLOTS] = {
      {b->in + (size_t)r0 * W0, W0, NULL},
      {b->idx, 0, b->off + r0},
      {b->bias, 0, NULL},
      {b->out + (size_t)r0 * WO, WO, NULL},
      {NULL, 0, NULL}};
  cn_ew_prog p = {n_insn, in, N_SLOTS, S_TMP, TW, 0, 0, 0, NULL};
  bk->vt->ew_program(bk, &p, sl, n);
}

static bool same(const batch *x, const batch *y) {
  return memcmp(x->out, y->out, (size_t)NR * WO * 4) == 0 &&
         memcmp(x->idx, y->idx, (size_t)NR * W1 * 4) == 0;
}

Test(ew, every_copy_gives_the_reference_bits) {
  static const char *copies[] = {"wide", "avx2", "base"};
  cn_backend_ctx *bk = NULL;
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn__backend_cpu_open(&bk, &err), 0, "%s", err.msg);
  int ran = 0;
  for (int c = 0; c < 3; c++) {
    if (cn__cpu_ew_force(copies[c]) != 0) continue;
    ran++;
    rng = 777;
    for (int t = 0; t < 300; t++) {
      cn_ew_insn in[MAXI];
      int n = make_program(in);
      batch ref, got, alone;
      batch_make(&ref);
      batch_copy(&got, &ref);
      batch_copy(&alone, &ref);
      reference(in, n, &ref, NR);
      run(bk, in, n, &got, 0, NR);
      cr_assert(same(&ref, &got), "copy %s, program %d: differs from the "
                "reference", copies[c], t);
      for (int r = 0; r < NR; r++) run(bk, in, n, &alone, r, 1);
      cr_assert(same(&ref, &alone), "copy %s, program %d: rows one at a "
                "time differ from the reference", copies[c], t);
      batch_free(&ref), batch_free(&got), batch_free(&alone);
    }
  }
  cr_assert_eq(cn__cpu_ew_force("no-such-copy"), -1);
  cr_assert_eq(cn__cpu_ew_force(NULL), 0);
  cr_assert_geq(ran, 1, "no copy of the loops ran");
  cn_backend_close(bk);
}
