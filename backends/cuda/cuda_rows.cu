/* cuda_rows.cu - gathers, argmax and the identity gemm_batched uses
 * for a NULL operand. Each is one kernel launch over the batch (one thread
 * per output float, grid-stride), preceded by one asynchronous copy of the call's
 * host index arrays into the staging ring (cu_stage). The arithmetic
 * follows backends/cpu/cpu.c operation for operation (expf, tanhf, no fast
 * math) so results agree to float rounding. The fused elementwise
 * programs of compiled cells are in cuda_ew.cu.
 */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

#define THREADS 256

typedef long long ll;

#define GRID_LOOP(i, total)                                              \
  for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < (total);    \
       i += (ll)gridDim.x * blockDim.x)

static unsigned grid_for(ll total) {
  unsigned b = cu_blocks(total, THREADS);
  return b > 65535u * 8u ? 65535u * 8u : b; /* grid-stride beyond */
}

#define LAUNCH(c, total, kernel, ...)                                     \
  do {                                                                   \
    kernel<<<grid_for(total), THREADS, 0, (c)->stream>>>(__VA_ARGS__);   \
    CN_CUDA_LAUNCHED(c);                                                 \
  } while (0)

/* ---- helpers for the products ---- */

__global__ void k_bias_rows(int M, int N, const float *bias, float beta,
                            float *C, int ldc) {
  GRID_LOOP(i, (ll)M * N) {
    ll r = i / N;
    int j = (int)(i % N);
    float *c = C + r * ldc + j;
    *c = beta == 0.0f ? bias[j] : beta * *c + bias[j];
  }
}

bool cu_bias_rows(cu_ctx *c, int M, int N, const float *bias, float beta,
                  float *C, int ldc) {
  LAUNCH(c, (ll)M * N, k_bias_rows, M, N, bias, beta, C, ldc);
  return !c->failed;
}

__global__ void k_eye(float *I, int H) {
  GRID_LOOP(i, (ll)H * H) I[i] = (i / H == i % H) ? 1.0f : 0.0f;
}

bool cu_eye(cu_ctx *c, float *I, int H) {
  LAUNCH(c, (ll)H * H, k_eye, I, H);
  return !c->failed;
}

/* ---- gathers ---- */

__global__ void k_gather(float *dst, int ldd, const float *base,
                         const int64_t *idx, int n, int width) {
  GRID_LOOP(i, (ll)n * width) {
    ll r = i / width;
    int j = (int)(i % width);
    int64_t o = idx[r];
    dst[r * ldd + j] = o < 0 ? 0.0f : base[o + j];
  }
}

void cu_gather(cn_backend_ctx *bk, float *dst, int ldd, const float *base,
               const int64_t *idx, int n, int width) {
  cu_ctx *c = cu_of(bk);
  if (n <= 0 || width <= 0 || !cu_enter(c)) return;
  const int64_t *h[1] = {idx}, *d[1];
  const int64_t len[1] = {n};
  if (!cu_stage(c, 1, h, len, d)) return;
  LAUNCH(c, (ll)n * width, k_gather, dst, ldd, base, d[0], n, width);
}

__global__ void k_gather_sum(float *dst, int ldd, const float *base,
                             const int64_t *idx, const int64_t *seg, int n,
                             int width, int mean) {
  GRID_LOOP(i, (ll)n * width) {
    ll r = i / width;
    int j = (int)(i % width);
    float s = 0.0f;
    for (int64_t k = seg[r]; k < seg[r + 1]; k++) s += base[idx[k] + j];
    if (mean && seg[r + 1] > seg[r])
      s *= 1.0f / (float)(seg[r + 1] - seg[r]);
    dst[r * ldd + j] = s;
  }
}

void cu_gather_sum(cn_backend_ctx *bk, float *dst, int ldd, const float *base,
                   const int64_t *idx, const int64_t *seg, int n, int width,
                   int mean) {
  cu_ctx *c = cu_of(bk);
  if (n <= 0 || width <= 0 || !cu_enter(c)) return;
  const int64_t *h[2] = {seg, idx}, *d[2];
  const int64_t len[2] = {n + 1, seg[n]};
  if (!cu_stage(c, 2, h, len, d)) return;
  LAUNCH(c, (ll)n * width, k_gather_sum, dst, ldd, base, d[1], d[0], n,
         width, mean);
}

/* ---- argmax and elementwise ---- */

/* One block per row; the lowest index wins a tie, and a row holding a NaN
 * or an infinity gives -1, as in the cpu loop. */
__global__ void k_argmax_rows(int n, int w, const float *X, int ld,
                              int32_t *out) {
  __shared__ float sv[THREADS];
  __shared__ int si[THREADS];
  for (ll r = blockIdx.x; r < n; r += gridDim.x) {
    const float *x = X + r * ld;
    int best = -1, bad = 0;
    float bv = 0.0f;
    for (int j = threadIdx.x; j < w; j += blockDim.x) {
      if (!isfinite(x[j])) bad = 1;
      if (best < 0 || x[j] > bv) {
        best = j;
        bv = x[j];
      }
    }
    bad = __syncthreads_or(bad);
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = best;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) {
        int oi = si[threadIdx.x + s];
        float ov = sv[threadIdx.x + s];
        int mi = si[threadIdx.x];
        if (oi >= 0 && (mi < 0 || ov > sv[threadIdx.x] ||
                        (ov == sv[threadIdx.x] && oi < mi))) {
          si[threadIdx.x] = oi;
          sv[threadIdx.x] = ov;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[r] = bad ? -1 : si[0] < 0 ? 0 : si[0];
    __syncthreads();
  }
}

void cu_argmax_rows(cn_backend_ctx *bk, int n, int w, const float *X, int ld,
                    int32_t *out) {
  cu_ctx *c = cu_of(bk);
  if (n <= 0) return;
  bool ok = cu_enter(c);
  if (ok && c->am_cap < (size_t)n) {
    size_t cap = c->am_cap ? c->am_cap : 1024;
    while (cap < (size_t)n) cap *= 2;
    ok = CN_CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
    c->base.ctr.syncs++;
    if (c->am_dev != NULL) CN_CUDA_CHECK(c, cudaFree(c->am_dev));
    if (c->am_host != NULL) CN_CUDA_CHECK(c, cudaFreeHost(c->am_host));
    if (c->am_dev != NULL) cu_held(c, -(long long)c->am_cap * 4);
    c->am_dev = NULL;
    c->am_host = NULL;
    c->am_cap = 0;
    ok = ok &&
         CN_CUDA_CHECK(c, cudaMalloc((void **)&c->am_dev, cap * 4)) &&
         CN_CUDA_CHECK(c, cudaHostAlloc((void **)&c->am_host, cap * 4,
                                        cudaHostAllocDefault));
    if (ok) {
      c->am_cap = cap;
      c->device_allocs++;
      c->base.ctr.allocs += 2;
      cu_held(c, (long long)cap * 4);
    }
  }
  if (ok) {
    unsigned grid = n < 65535 * 8 ? (unsigned)n : 65535u * 8u;
    k_argmax_rows<<<grid, THREADS, 0, c->stream>>>(n, w, X, ld, c->am_dev);
    ok = CN_CUDA_LAUNCHED(c) &&
         CN_CUDA_CHECK(c, cudaMemcpyAsync(c->am_host, c->am_dev,
                                          (size_t)n * 4,
                                          cudaMemcpyDeviceToHost,
                                          c->stream)) &&
         CN_CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
    c->base.ctr.syncs++;
    c->base.ctr.bytes_to_host += (long long)n * 4;
  }
  /* The decoder reads out right away: after a failure it reads zeros (the
   * run then fails at status()). */
  if (ok)
    memcpy(out, c->am_host, (size_t)n * sizeof(int32_t));
  else
    memset(out, 0, (size_t)n * sizeof(int32_t));
}


/* ---- compiled vertex functions (core/cell_*.c) ---- */

__global__ void k_copy_rows(float *dst, int ldd, const float *src, int lds,
                            int n, int width) {
  GRID_LOOP(i, (ll)n * width) {
    ll r = i / width;
    int j = (int)(i % width);
    dst[r * ldd + j] = src[r * lds + j];
  }
}

/* A kernel rather than cudaMemcpy2DAsync: it also takes lds = 0 (one row
 * copied to every row) and pitches below the width, which the 2D copy
 * rejects. */
void cu_copy_rows(cn_backend_ctx *bk, float *dst, int ldd, const float *src,
                  int lds, int n, int width) {
  cu_ctx *c = cu_of(bk);
  if (n <= 0 || width <= 0 || !cu_enter(c)) return;
  LAUNCH(c, (ll)n * width, k_copy_rows, dst, ldd, src, lds, n, width);
}
