/* cuda_blas.cu - the products, on cuBLAS (column-major) for row-major
 * operands: a row-major X[r, c] with leading dimension ld is, to cuBLAS,
 * the column-major Xᵀ[c, r] with the same ld. So
 *   C = A·Wᵀ          is  Cᵀ = W·Aᵀ:  Sgemm(T, N, m=N, n=M, k=K, W, A)
 *   C_r = A_r·B_r     is  C_rᵀ = B_rᵀ·A_rᵀ: SgemmStridedBatched(N, N, ...)
 * and no operand is ever transposed in memory.
 */
#include <stdlib.h>

#include "cuda_internal.h"

void cu_gemm(cn_backend_ctx *bk, int M, int N, int K, const float *A,
             int lda, const float *W, int ldw, const float *bias, float beta,
             float *C, int ldc) {
  cu_ctx *c = cu_of(bk);
  if (M <= 0 || N <= 0 || !cu_enter(c)) return;
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

/* out_r = WM[:, :H]·A_r + WM[:, H:]·B_r: two pointer-array batched
 * products over the whole batch. A missing second child's B = I points at
 * a cached identity, so every row runs the same product (WM·I adds WM's
 * right half exactly, as the cpu backend does). The pointer arrays are
 * built on the host (the offsets are host data) and staged like indices. */
void cu_mvrnn_mat(cn_backend_ctx *bk, int n, int H, const float *WM,
                  const float *base, const int64_t *off1,
                  const int64_t *off2, float *out, int ldo) {
  cu_ctx *c = cu_of(bk);
  if (n <= 0 || !cu_enter(c)) return;
  if (c->eye_H != H) {
    cu_pool_put(c, c->eye);
    c->eye = (float *)cu_pool_get(c, (size_t)H * H * sizeof(float));
    c->eye_H = 0;
    if (c->eye == NULL) {
      cu_fail(c, __FILE__, __LINE__, "cudaMalloc(identity)",
              "out of device memory");
      return;
    }
    if (!cu_eye(c, c->eye, H)) return;
    c->eye_H = H;
  }
  int64_t *p = (int64_t *)malloc((size_t)n * 5 * sizeof(int64_t));
  if (p == NULL) {
    cu_fail(c, __FILE__, __LINE__, "malloc", "out of host memory");
    return;
  }
  int64_t *pa = p, *pb = p + n, *pc = p + 2 * n, *pl = p + 3 * n,
          *pr = p + 4 * n;
  for (int r = 0; r < n; r++) {
    pa[r] = (int64_t)(intptr_t)(base + off1[r] + H);
    pb[r] = (int64_t)(intptr_t)(off2[r] < 0 ? c->eye : base + off2[r] + H);
    pc[r] = (int64_t)(intptr_t)(out + (int64_t)r * ldo);
    pl[r] = (int64_t)(intptr_t)WM;
    pr[r] = (int64_t)(intptr_t)(WM + H);
  }
  const int64_t *host[1] = {p};
  const int64_t len[1] = {5 * (int64_t)n};
  const int64_t *dev[1];
  bool ok = cu_stage(c, 1, host, len, dev);
  free(p);
  if (!ok) return;
  const float *const *dA = (const float *const *)dev[0];
  const float *const *dB = (const float *const *)(dev[0] + n);
  float *const *dC = (float *const *)(dev[0] + 2 * n);
  const float *const *dL = (const float *const *)(dev[0] + 3 * n);
  const float *const *dR = (const float *const *)(dev[0] + 4 * n);
  const float one = 1.0f, zero = 0.0f;
  /* P_rᵀ = A_rᵀ·WLᵀ, then P_rᵀ += B_rᵀ·WRᵀ. */
  c->base.ctr.launches += 2;
  if (CN_CUBLAS_CHECK(c, cublasSgemmBatched(c->blas, CUBLAS_OP_N, CUBLAS_OP_N,
                                            H, H, H, &one, dA, H, dL, 2 * H,
                                            &zero, dC, H, n)))
    CN_CUBLAS_CHECK(c, cublasSgemmBatched(c->blas, CUBLAS_OP_N, CUBLAS_OP_N,
                                          H, H, H, &one, dB, H, dR, 2 * H,
                                          &one, dC, H, n));
}
