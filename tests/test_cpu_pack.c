/* test_cpu_pack.c - the cpu backend's packed weights.
 *
 * The cpu backend packs a weight matrix for gemm.c the first time a run
 * multiplies by it and keeps the copy for the model's later runs (a model
 * has a uid no other model gets). Checked through the backend's interface:
 * - a product by a run's weight gives the bits of the same product by an
 *   operand the backend does not know (packed per call), for sub-blocks
 *   of the weight too (rows and columns of a larger matrix);
 * - another model's run never uses the copies: a model freed and another
 *   put at the same address (here: the same buffer rewritten, a new uid)
 *   gets its own numbers; a model of unknown identity (uid 0) neither;
 * - the same model's next run does use them (shown by breaking the
 *   contract: its weights rewritten in place still give the old numbers);
 * - gemm_strided (B not transposed) equals a double-precision product. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"

static float *rnd(size_t n, unsigned seed) {
  float *p = malloc(n * sizeof(float));
  cr_assert_not_null(p);
  srand(seed);
  for (size_t i = 0; i < n; i++) p[i] = (float)rand() / RAND_MAX - 0.5f;
  return p;
}

static cn_backend_ctx *open_cpu(void) {
  cn_backend_ctx *bk = NULL;
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_backend_open("cpu", 0, &bk, &err), 0, "%s", err.msg);
  cr_assert_not_null(bk->vt->run_begins, "the cpu backend packs per run");
  return bk;
}

/* C = A·W[rows r0.., cols c0..]ᵀ + bias, W a run's weight when bind. */
static void product(cn_backend_ctx *bk, uint64_t uid, bool bind,
                    const float *W, int ldw, size_t w_floats, int M, int N,
                    int K, const float *A, const float *bias, float *C) {
  const float *w = W;
  if (bind) {
    bk->vt->run_begins(bk, uid);
    w = bk->vt->weights(bk, W, w_floats);
  }
  bk->vt->gemm(bk, M, N, K, A, K, w, ldw, bias, 0.0f, C, N);
}

Test(cpu_pack, a_run_weight_gives_the_per_call_bits) {
  cn_backend_ctx *bk = open_cpu();
  int rows = 300, cols = 200; /* W: a larger matrix, used in parts */
  float *W = rnd((size_t)rows * cols, 1), *bias = rnd((size_t)rows, 2);
  int parts[][4] = {/* r0, c0, N, K */
                    {0, 0, 300, 200}, {100, 0, 100, 200}, {7, 33, 41, 99},
                    {0, 100, 300, 100}, {299, 199, 1, 1}};
  for (size_t q = 0; q < sizeof(parts) / sizeof(parts[0]); q++) {
    int r0 = parts[q][0], c0 = parts[q][1], N = parts[q][2], K = parts[q][3];
    const float *w = W + (size_t)r0 * cols + c0;
    for (int M = 1; M <= 37; M += 9) {
      float *A = rnd((size_t)M * K, 3 + M);
      float *C1 = malloc((size_t)M * N * sizeof(float));
      float *C2 = malloc((size_t)M * N * sizeof(float));
      /* a copy the backend never saw: packed per call */
      float *Wc = malloc((size_t)rows * cols * sizeof(float));
      memcpy(Wc, W, (size_t)rows * cols * sizeof(float));
      bk->vt->run_begins(bk, 1);
      (void)bk->vt->weights(bk, W, (size_t)rows * cols);
      bk->vt->gemm(bk, M, N, K, A, K, w, cols, bias, 0.0f, C1, N);
      bk->vt->gemm(bk, M, N, K, A, K, w, cols, bias, 0.0f, C1, N); /* again */
      bk->vt->gemm(bk, M, N, K, A, K, Wc + (w - W), cols, bias, 0.0f, C2, N);
      cr_assert_eq(memcmp(C1, C2, (size_t)M * N * sizeof(float)), 0,
                   "part %zu M %d: packed once differs from per call", q, M);
      free(A), free(C1), free(C2), free(Wc);
    }
  }
  free(W), free(bias);
  cn_backend_close(bk);
}

static bool same(const float *x, const float *y, size_t n) {
  return memcmp(x, y, n * sizeof(float)) == 0;
}

Test(cpu_pack, another_models_run_never_uses_the_copies) {
  cn_backend_ctx *bk = open_cpu();
  int M = 5, N = 70, K = 48;
  size_t nw = (size_t)N * K, nc = (size_t)M * N;
  float *W = rnd(nw, 10), *A = rnd((size_t)M * K, 11), *W2 = rnd(nw, 12);
  float *C1 = malloc(nc * sizeof(float)), *C2 = malloc(nc * sizeof(float));
  float *old = malloc(nc * sizeof(float));
  product(bk, 7, true, W, K, nw, M, N, K, A, NULL, old);
  /* model 7 freed; model 8 loaded at the same address */
  memcpy(W, W2, nw * sizeof(float));
  product(bk, 8, true, W, K, nw, M, N, K, A, NULL, C1);
  product(bk, 0, false, W2, K, nw, M, N, K, A, NULL, C2);
  cr_assert(same(C1, C2, nc), "model 8 used model 7's packed weights");
  /* uid 0: nothing kept from one run to the next */
  product(bk, 0, true, W, K, nw, M, N, K, A, NULL, C1);
  float *W3 = rnd(nw, 13);
  memcpy(W, W3, nw * sizeof(float));
  product(bk, 0, true, W, K, nw, M, N, K, A, NULL, C1);
  product(bk, 0, false, W3, K, nw, M, N, K, A, NULL, C2);
  cr_assert(same(C1, C2, nc), "a uid-0 run used an earlier run's copy");
  /* the same model's next run: the copy serves again (the contract broken
   * on purpose, to see it) */
  product(bk, 9, true, W, K, nw, M, N, K, A, NULL, old);
  for (size_t i = 0; i < nw; i++) W[i] = -W[i];
  product(bk, 9, true, W, K, nw, M, N, K, A, NULL, C1);
  cr_assert(same(C1, old, nc), "model 9's second run packed again");
  free(W), free(W2), free(W3), free(A), free(C1), free(C2), free(old);
  cn_backend_close(bk);
}

Test(cpu_pack, gemm_strided_is_a_product_by_b_as_it_lies) {
  cn_backend_ctx *bk = open_cpu();
  int count = 3, M = 9, N = 37, K = 21;
  long long sa = (long long)M * K, sb = (long long)K * N, sc = (long long)M * N;
  float *A = rnd((size_t)count * sa, 20), *B = rnd((size_t)count * sb, 21);
  float *C = rnd((size_t)count * sc, 22);
  float *C0 = malloc((size_t)count * sc * sizeof(float));
  memcpy(C0, C, (size_t)count * sc * sizeof(float));
  bk->vt->gemm_strided(bk, count, M, N, K, A, K, sa, B, N, sb, 1.0f, C, N, sc);
  for (int r = 0; r < count; r++)
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double want = C0[r * sc + (size_t)i * N + j], mag = fabs(want);
        for (int k = 0; k < K; k++) {
          double t = (double)A[r * sa + (size_t)i * K + k] *
                     B[r * sb + (size_t)k * N + j];
          want += t;
          mag += fabs(t);
        }
        cr_assert_leq(fabs(C[r * sc + (size_t)i * N + j] - want),
                      2.0 * (K + 1) * 6e-8 * mag + 1e-30, "r %d C[%d,%d]", r,
                      i, j);
      }
  free(A), free(B), free(C), free(C0);
  cn_backend_close(bk);
}

/* gemm_batched: pointer arrays, a shared (repeated) operand, mat-vecs
 * (N = 1, also with strided B and C columns), against a double product. */
static void batched_case(cn_backend_ctx *bk, int count, int M, int N, int K,
                         int ldb, int ldc, bool shared_a, float beta) {
  float *A = rnd((size_t)count * M * K, 30), *B = rnd((size_t)count * K * ldb, 31);
  float *C = rnd((size_t)count * M * ldc, 32);
  float *C0 = malloc((size_t)count * M * ldc * sizeof(float));
  memcpy(C0, C, (size_t)count * M * ldc * sizeof(float));
  const float *pa[8], *pb[8];
  float *pc[8];
  for (int r = 0; r < count; r++) {
    pa[r] = A + (shared_a ? 0 : (size_t)r * M * K);
    pb[r] = B + (size_t)r * K * ldb;
    pc[r] = C + (size_t)r * M * ldc;
  }
  bk->vt->gemm_batched(bk, count, 1, M, N, K, pa, K, pb, ldb, beta, pc, ldc);
  for (int r = 0; r < count; r++)
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        size_t ci = (size_t)r * M * ldc + (size_t)i * ldc + j;
        double want = beta * C0[ci], mag = fabs(want);
        for (int k = 0; k < K; k++) {
          double t = (double)pa[r][(size_t)i * K + k] * pb[r][(size_t)k * ldb + j];
          want += t;
          mag += fabs(t);
        }
        cr_assert_leq(fabs(C[ci] - want), 2.0 * (K + 1) * 6e-8 * mag + 1e-30,
                      "count %d M %d N %d r %d C[%d,%d]", count, M, N, r, i, j);
      }
  free(A), free(B), free(C), free(C0);
}

Test(cpu_pack, gemm_batched_is_a_product_per_pointer) {
  cn_backend_ctx *bk = open_cpu();
  batched_case(bk, 4, 9, 37, 21, 37, 37, false, 0.0f);
  batched_case(bk, 4, 9, 37, 21, 37, 37, true, 1.0f);  /* repeated A */
  batched_case(bk, 5, 17, 1, 17, 1, 1, false, 0.0f);   /* mat-vecs */
  batched_case(bk, 5, 17, 1, 17, 3, 2, true, 1.0f);    /* strided columns */
  /* a NULL operand is the identity: C = the other (+ beta·C), exactly */
  int n = 6;
  float *X = rnd((size_t)n * 2 * n, 40), *C = rnd((size_t)n * n * 2, 41);
  float *C0 = malloc((size_t)n * n * 2 * sizeof(float));
  memcpy(C0, C, (size_t)n * n * 2 * sizeof(float));
  const float *pa[2] = {X, NULL}, *pb[2] = {NULL, X + n};
  float *pc[2] = {C, C + (size_t)n * n};
  bk->vt->gemm_batched(bk, 2, 1, n, n, n, pa, 2 * n, pb, 2 * n, 1.0f, pc, n);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) {
        float want = C0[(size_t)r * n * n + (size_t)i * n + j] +
                     X[(size_t)i * 2 * n + (r ? n : 0) + j];
        cr_assert_eq(pc[r][(size_t)i * n + j], want, "identity r %d", r);
      }
  /* two terms an output: C_r = X_l·Y_r + X_r·Z_r, term order */
  const float *ta[4] = {X, X, X + n, X + n};
  const float *tb[4] = {X, X + n, X + n, X};
  bk->vt->gemm_batched(bk, 2, 2, n, n, n, ta, 2 * n, tb, 2 * n, 0.0f, pc, n);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) {
        double want = 0, mag = 0;
        for (int t = 0; t < 2; t++)
          for (int k = 0; k < n; k++) {
            double p = (double)ta[t * 2 + r][(size_t)i * 2 * n + k] *
                       tb[t * 2 + r][(size_t)k * 2 * n + j];
            want += p;
            mag += fabs(p);
          }
        cr_assert_leq(fabs(pc[r][(size_t)i * n + j] - want),
                      4.0 * (n + 1) * 6e-8 * mag + 1e-30, "terms r %d", r);
      }
  free(X), free(C), free(C0);
  cn_backend_close(bk);
}
