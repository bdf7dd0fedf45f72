/* cuda_blas.cu - the products, on cuBLAS (column-major) for row-major
 * operands: a row-major X[r, c] with leading dimension ld is, to cuBLAS,
 * the column-major Xᵀ[c, r] with the same ld. So
 *   C = A·Wᵀ          is  Cᵀ = W·Aᵀ:  Sgemm(T, N, m=N, n=M, k=K, W, A)
 *   C_r = A_r·B_r     is  C_rᵀ = B_rᵀ·A_rᵀ: SgemmStridedBatched(N, N, ...)
 * and no operand is ever transposed in memory.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* ---- products with a bias: one cublasLt call ---------------------------
 * Cᵀ = W·Aᵀ (+ Cᵀ) + bias: the bias is a vector over Cᵀ's rows, which is
 * what cublasLt's BIAS epilogue broadcasts. Plain FP32 compute (no TF32),
 * as the cublasSgemm path. Per shape, the layouts and the heuristic's
 * algorithm are kept (direct-mapped; a batch's M repeats run after run),
 * so a hit costs no query. A shape cublasLt refuses takes the old path;
 * a failed call turns cublasLt off for the context. */

bool cu_lt_open(cu_ctx *c) {
  const char *e = getenv("CANOPY_CUDA_LT");
  c->lt_off = true;
  if (e != NULL && strcmp(e, "0") == 0) return false;
  cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  size_t ws = CU_BLAS_WORKSPACE;
  c->lt_plans = (cu_lt_plan *)calloc(CU_LT_PLANS, sizeof(cu_lt_plan));
  if (c->lt_plans == NULL ||
      cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescCreate(&c->lt_bias, CUBLAS_COMPUTE_32F, CUDA_R_32F) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(c->lt_bias, CUBLASLT_MATMUL_DESC_TRANSA,
                                     &t, sizeof(t)) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(c->lt_bias, CUBLASLT_MATMUL_DESC_TRANSB,
                                     &n, sizeof(n)) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(c->lt_bias, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                     &epi, sizeof(epi)) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulPreferenceCreate(&c->lt_pref) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulPreferenceSetAttribute(
          c->lt_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
          sizeof(ws)) != CUBLAS_STATUS_SUCCESS) {
    cu_lt_close(c);
    return false;
  }
  c->lt_off = false;
  return true;
}

static void plan_drop(cu_lt_plan *p) {
  if (p->a != NULL) (void)cublasLtMatrixLayoutDestroy(p->a);
  if (p->b != NULL) (void)cublasLtMatrixLayoutDestroy(p->b);
  if (p->c != NULL) (void)cublasLtMatrixLayoutDestroy(p->c);
  memset(p, 0, sizeof(*p));
}

void cu_lt_close(cu_ctx *c) {
  for (int i = 0; c->lt_plans != NULL && i < CU_LT_PLANS; i++)
    plan_drop(&c->lt_plans[i]);
  free(c->lt_plans);
  c->lt_plans = NULL;
  if (c->lt_pref != NULL) (void)cublasLtMatmulPreferenceDestroy(c->lt_pref);
  if (c->lt_bias != NULL) (void)cublasLtMatmulDescDestroy(c->lt_bias);
  if (c->lt != NULL) (void)cublasLtDestroy(c->lt);
  c->lt_pref = NULL;
  c->lt_bias = NULL;
  c->lt = NULL;
  c->lt_off = true;
}

/* The plan of a shape: found, or made (layouts, one heuristic query). */
static cu_lt_plan *lt_plan(cu_ctx *c, int M, int N, int K, int lda, int ldw,
                           int ldc, bool beta) {
  uint64_t h = (uint64_t)M * 0x9E3779B97F4A7C15ull ^
               ((uint64_t)N << 20 ^ (uint64_t)K << 40) ^
               ((uint64_t)lda * 31 + (uint64_t)ldw * 17 + (uint64_t)ldc) ^
               (uint64_t)beta;
  h ^= h >> 29;
  cu_lt_plan *p = &c->lt_plans[h % CU_LT_PLANS];
  if (p->a != NULL && p->M == M && p->N == N && p->K == K && p->lda == lda &&
      p->ldw == ldw && p->ldc == ldc && p->beta == beta)
    return p;
  plan_drop(p);
  p->M = M, p->N = N, p->K = K, p->lda = lda, p->ldw = ldw, p->ldc = ldc;
  p->beta = beta;
  /* column-major: W is K×N (transposed by the op), A is K×M, C is N×M */
  if (cublasLtMatrixLayoutCreate(&p->a, CUDA_R_32F, K, N, ldw) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&p->b, CUDA_R_32F, K, M, lda) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, N, M, ldc) !=
          CUBLAS_STATUS_SUCCESS) {
    plan_drop(p);
    return NULL;
  }
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  memset(&r, 0, sizeof(r));
  if (cublasLtMatmulAlgoGetHeuristic(c->lt, c->lt_bias, p->a, p->b, p->c,
                                     p->c, c->lt_pref, 1, &r, &found) ==
          CUBLAS_STATUS_SUCCESS &&
      found > 0 && r.state == CUBLAS_STATUS_SUCCESS) {
    p->algo = r.algo;
    p->ws = r.workspaceSize;
    p->ok = true;
  }
  return p;
}

/* One launch for C = A·Wᵀ + bias (+ beta·C); false: not done, take the
 * old path. */
static bool gemm_bias_lt(cu_ctx *c, int M, int N, int K, const float *A,
                         int lda, const float *W, int ldw, const float *bias,
                         float beta, float *C, int ldc) {
  if (c->lt_off) return false;
  cu_lt_plan *p = lt_plan(c, M, N, K, lda, ldw, ldc, beta != 0.0f);
  if (p == NULL || !p->ok || p->ws > CU_BLAS_WORKSPACE) return false;
  const float one = 1.0f;
  cublasStatus_t st = cublasLtMatmulDescSetAttribute(
      c->lt_bias, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmul(c->lt, c->lt_bias, &one, W, p->a, A, p->b, &beta, C,
                        p->c, C, p->c, &p->algo, c->blas_ws, p->ws,
                        c->stream);
  if (st != CUBLAS_STATUS_SUCCESS) { /* never again on this context */
    c->lt_off = true;
    return false;
  }
  c->base.ctr.launches++;
  return true;
}

void cu_gemm(cn_backend_ctx *bk, int M, int N, int K, const float *A,
             int lda, const float *W, int ldw, const float *bias, float beta,
             float *C, int ldc) {
  cu_ctx *c = cu_of(bk);
  if (M <= 0 || N <= 0 || !cu_enter(c)) return;
  if (bias != NULL &&
      gemm_bias_lt(c, M, N, K, A, lda, W, ldw, bias, beta, C, ldc))
    return;
  if (bias != NULL) {
    /* C = beta·C + bias (bias alone when beta = 0), then accumulate. */
    if (!cu_bias_rows(c, M, N, bias, beta, C, ldc)) return;
    beta = 1.0f;
  }
  const float one = 1.0f;
  c->base.ctr.launches++;
  CN_CUBLAS_CHECK(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K,
                                 &one, W, ldw, A, lda, &beta, C, ldc));
}

void cu_gemm_strided(cn_backend_ctx *bk, int count, int M, int N, int K,
                     const float *A, int lda, long long sa, const float *B,
                     int ldb, long long sb, float beta, float *C, int ldc,
                     long long sc) {
  cu_ctx *c = cu_of(bk);
  if (count <= 0 || M <= 0 || N <= 0 || !cu_enter(c)) return;
  const float one = 1.0f;
  c->base.ctr.launches++;
  CN_CUBLAS_CHECK(c, cublasSgemmStridedBatched(
                         c->blas, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B,
                         ldb, sb, A, lda, sa, &beta, C, ldc, sc, count));
}

/* The identity of side H in c->eye (ld H), for gemm_batched's NULL
 * operands; rebuilt when the side changes. */
static const float *cu_identity(cu_ctx *c, int H) {
  if (c->eye_H == H) return c->eye;
  cu_pool_put(c, c->eye);
  c->eye = (float *)cu_pool_get(c, (size_t)H * H * sizeof(float));
  c->eye_H = 0;
  if (c->eye == NULL) {
    cu_fail(c, __FILE__, __LINE__, "cudaMalloc(identity)",
            "out of device memory");
    return NULL;
  }
  if (!cu_eye(c, c->eye, H)) return NULL;
  c->eye_H = H;
  return c->eye;
}

/* C_r = Σ_t A_{t,r} · B_{t,r} over host pointer arrays: read from the
 * staged batch when it holds all three and no operand is the identity;
 * else copied into one array and staged as one upload ((2·terms + 1) ·
 * count words, like indices), a NULL operand (the identity) pointing at a
 * cached identity matrix, so every problem runs the same product: adding
 * exact zeros, the sums equal the cpu backend's copy-and-add. Then one
 * cublasSgemmBatched per term (beta, then 1: the terms of an output
 * summed in term order, as the cpu backend does), row-major operands read
 * as their column-major transposes (C_rᵀ = B_rᵀ · A_rᵀ). */
void cu_gemm_batched(cn_backend_ctx *bk, int count, int terms, int M, int N,
                     int K, const float *const *A, int lda,
                     const float *const *B, int ldb, float beta,
                     float *const *C, int ldc) {
  cu_ctx *c = cu_of(bk);
  if (count <= 0 || terms <= 0 || M <= 0 || N <= 0 || !cu_enter(c)) return;
  int64_t tc = (int64_t)terms * count;
  const int64_t *dA = cu_staged(c, (const int64_t *)(const void *)A, tc);
  const int64_t *dB = cu_staged(c, (const int64_t *)(const void *)B, tc);
  const int64_t *dC = cu_staged(c, (const int64_t *)(const void *)C, count);
  for (int64_t i = 0; i < tc && dA != NULL && dB != NULL; i++)
    if (A[i] == NULL || B[i] == NULL) dA = NULL;
  if (dA == NULL || dB == NULL || dC == NULL) {
    int64_t *p =
        (int64_t *)malloc((size_t)(2 * tc + count) * sizeof(int64_t));
    if (p == NULL) {
      cu_fail(c, __FILE__, __LINE__, "malloc", "out of host memory");
      return;
    }
    bool ok = true;
    for (int64_t i = 0; i < tc && ok; i++) {
      const float *a = A[i], *b = B[i];
      if (a == NULL) ok = (a = cu_identity(c, K)) != NULL; /* M = K = lda */
      if (b == NULL && ok) ok = (b = cu_identity(c, N)) != NULL;
      p[i] = (int64_t)(intptr_t)a;
      p[tc + i] = (int64_t)(intptr_t)b;
    }
    for (int r = 0; r < count; r++) p[2 * tc + r] = (int64_t)(intptr_t)C[r];
    const int64_t *host[1] = {p};
    const int64_t len[1] = {2 * tc + count};
    const int64_t *dev[1];
    ok = ok && cu_stage(c, 1, host, len, dev);
    free(p);
    if (!ok) return;
    dA = dev[0];
    dB = dev[0] + tc;
    dC = dev[0] + 2 * tc;
  }
  const float one = 1.0f;
  for (int t = 0; t < terms; t++) {
    c->base.ctr.launches++;
    if (!CN_CUBLAS_CHECK(
            c, cublasSgemmBatched(
                   c->blas, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one,
                   (const float *const *)(dB + (int64_t)t * count), ldb,
                   (const float *const *)(dA + (int64_t)t * count), lda,
                   t == 0 ? &beta : &one, (float *const *)dC, ldc, count)))
      return;
  }
}

