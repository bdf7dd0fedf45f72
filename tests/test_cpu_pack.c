/* test_cpu_pack.c - the cpu backend's packed weights (issue 38).
 *
 * The cpu backend packs a weight matrix for gemm.c the first time a run
 * multiplies by it and reuses the copy for the rest of the run. Checked
 * here through the backend's own interface:
 * - a product by a run's weight gives the bits of the same product by an
 *   operand the backend does not know (packed per call), for sub-blocks
 *   of the weight too (rows and columns of a larger matrix);
 * - a new run forgets the copies: a model freed and another one put at the
 *   same address (here: the same buffer rewritten) gets its own numbers;
 * - gemm_strided (B not transposed) equals a double-precision product. */
#include <criterion/criterion.h>
#include <math.h>
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
static void product(cn_backend_ctx *bk, bool bind, const float *W, int ldw,
                    size_t w_floats, int M, int N, int K, const float *A,
                    const float *bias, float *C) {
  const float *w = W;
  if (bind) {
    bk->vt->run_begins(bk);
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
      bk->vt->run_begins(bk);
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

Test(cpu_pack, a_new_run_forgets_the_last_models_weights) {
  cn_backend_ctx *bk = open_cpu();
  int M = 5, N = 70, K = 48;
  float *W = rnd((size_t)N * K, 10), *A = rnd((size_t)M * K, 11);
  float *C1 = malloc((size_t)M * N * sizeof(float));
  float *C2 = malloc((size_t)M * N * sizeof(float));
  product(bk, true, W, K, (size_t)N * K, M, N, K, A, NULL, C1);
  /* the model is freed; another is loaded at the same address */
  float *W2 = rnd((size_t)N * K, 12);
  memcpy(W, W2, (size_t)N * K * sizeof(float));
  product(bk, true, W, K, (size_t)N * K, M, N, K, A, NULL, C1);
  product(bk, false, W2, K, (size_t)N * K, M, N, K, A, NULL, C2);
  cr_assert_eq(memcmp(C1, C2, (size_t)M * N * sizeof(float)), 0,
               "a run used the packed copy of the previous model's weights");
  free(W), free(W2), free(A), free(C1), free(C2);
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
