/* cuda_backend.cu - the CUDA backend's face: opening a device, one stream
 * and one cuBLAS handle per context (= per worker thread), the table of
 * backend.h operations, weights uploaded once per (context, tensor),
 * copies and the answers' fetch. The top of backends/cuda: it calls the
 * products (cuda_blas.cu), kernels (cuda_rows.cu, cuda_ew.cu) and the
 * pool and staging (cuda_mem.cu), none of which calls it. See
 * docs/cuda.md.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

static int cu_status(cn_backend_ctx *bk, cn_err *err) {
  cu_ctx *c = cu_of(bk);
  if (!c->failed) return 0;
  int code = c->failed;
  c->failed = 0;
  return cn_err_set(err, code, "%s", c->msg);
}

static void *cu_alloc(cn_backend_ctx *bk, size_t bytes) {
  return cu_pool_get(cu_of(bk), bytes ? bytes : 1);
}

static void cu_free(cn_backend_ctx *bk, void *p) { cu_pool_put(cu_of(bk), p); }

/* ---- weights ---- */

static uint64_t fingerprint(const float *h, size_t n) {
  uint64_t x = 1469598103934665603ull ^ (uint64_t)n;
  for (int s = 0; s <= 16 && n > 0; s++) {
    size_t i = s == 16 ? n - 1 : n / 16 * (size_t)s;
    uint32_t v;
    memcpy(&v, h + i, 4);
    x = (x ^ v) * 1099511628211ull;
  }
  return x;
}

static const float *cu_weights(cn_backend_ctx *bk, const float *host,
                               size_t n) {
  cu_ctx *c = cu_of(bk);
  if (!cu_set_device(c)) return NULL;
  uint64_t fp = fingerprint(host, n);
  cu_weight *w = NULL;
  for (int i = 0; i < c->n_weights; i++)
    if (c->weights[i].host == host && c->weights[i].n == n) {
      w = &c->weights[i];
      if (w->print == fp) return w->dev;
      break; /* another model at the same address: upload again */
    }
  if (w == NULL) {
    if (c->n_weights == c->cap_weights) {
      int cap = c->cap_weights ? 2 * c->cap_weights : 64;
      cu_weight *a =
          (cu_weight *)realloc(c->weights, (size_t)cap * sizeof(*a));
      if (a == NULL) {
        cu_fail(c, __FILE__, __LINE__, "realloc", "out of host memory");
        return NULL;
      }
      c->weights = a;
      c->cap_weights = cap;
    }
    float *d = NULL;
    if (!CN_CUDA_CHECK(c, cudaMalloc((void **)&d, (n ? n : 1) * 4)))
      return NULL;
    c->weight_allocs++;
    c->base.ctr.allocs++;
    cu_held(c, (long long)(n ? n : 1) * 4);
    w = &c->weights[c->n_weights++];
    w->host = host;
    w->n = n;
    w->print = 0;
    w->dev = d;
  }
  /* Pageable source: the call returns once the bytes are staged. */
  if (n > 0 && !CN_CUDA_CHECK(c, cudaMemcpyAsync(w->dev, host, n * 4,
                                                 cudaMemcpyHostToDevice,
                                                 c->stream)))
    return NULL;
  c->base.ctr.bytes_to_device += (long long)n * 4;
  c->base.ctr.copies_to_device += n > 0;
  w->print = fp;
  return w->dev;
}

/* ---- copies ---- */

static void cu_to_device(cn_backend_ctx *bk, void *dst, const void *src,
                         size_t n) {
  cu_ctx *c = cu_of(bk);
  if (n == 0 || !cu_enter(c)) return;
  c->base.ctr.bytes_to_device += (long long)n;
  c->base.ctr.copies_to_device++;
  c->base.ctr.syncs++;
  if (CN_CUDA_CHECK(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice,
                                       c->stream)))
    CN_CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
}

static void cu_to_host(cn_backend_ctx *bk, void *dst, const void *src,
                       size_t n) {
  cu_ctx *c = cu_of(bk);
  if (n == 0 || !cu_enter(c)) return;
  c->base.ctr.bytes_to_host += (long long)n;
  c->base.ctr.syncs++;
  if (CN_CUDA_CHECK(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost,
                                       c->stream)))
    CN_CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
}

static void cu_sync(cn_backend_ctx *bk) {
  cu_ctx *c = cu_of(bk);
  if (!cu_enter(c)) return;
  c->base.ctr.syncs++;
  CN_CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
}

/* ---- fetch_rows: what the answers read, and nothing else ---- */

/* Span k (one block each, grid-stride over spans): tab[k] is its float
 * offset in base, tab[n + k] .. tab[n + k + 1] its place in dst. */
__global__ void k_fetch_rows(float *dst, const float *base,
                             const int64_t *tab, int n) {
  for (long long k = blockIdx.x; k < n; k += gridDim.x) {
    const float *src = base + tab[k];
    float *d = dst + tab[n + k];
    long long len = tab[n + k + 1] - tab[n + k];
    for (long long j = threadIdx.x; j < len; j += blockDim.x) d[j] = src[j];
  }
}

/* Waits for the copy into half h, if one is under way. */
static bool fetch_settle(cu_ctx *c, int h) {
  if (!c->fetch_pending[h]) return true;
  c->fetch_pending[h] = false;
  c->base.ctr.syncs++;
  return CN_CUDA_CHECK(c, cudaEventSynchronize(c->fetch_ev[h]));
}

static void fetch_free(cu_ctx *c) {
  for (int h = 0; h < 2; h++) {
    (void)fetch_settle(c, h);
    c->fetch_buf[h] = NULL;
  }
  if (c->fetch_host != NULL) {
    CN_CUDA_CHECK(c, cudaFreeHost(c->fetch_host));
    cu_pool_put(c, c->fetch_dev);
  }
  if (c->fetch_old != NULL) CN_CUDA_CHECK(c, cudaFreeHost(c->fetch_old));
  c->fetch_host = c->fetch_old = NULL;
  c->fetch_dev = NULL;
  c->fetch_cap = 0;
}

/* Both halves grown to at least `floats` (a power of two), in one pinned
 * block. Half h's rows (the fetch before last) are no longer wanted; the
 * other half's (the last fetch) may still be read, so its block is kept
 * as fetch_old until the next fetch, once its copy has landed. */
static bool fetch_grow(cu_ctx *c, int h, size_t floats) {
  if (floats <= c->fetch_cap) return true;
  size_t cap = 1024;
  while (cap < floats) cap <<= 1;
  if (!fetch_settle(c, h ^ 1)) return false;
  float *old = c->fetch_host;
  if (c->fetch_dev != NULL) cu_pool_put(c, c->fetch_dev);
  c->fetch_host = NULL;
  c->fetch_cap = 0;
  c->fetch_dev = (float *)cu_pool_get(c, cap * sizeof(float));
  if (c->fetch_dev == NULL) {
    c->fetch_old = old;
    cu_fail(c, __FILE__, __LINE__, "cudaMalloc(fetch_rows)",
            "out of device memory");
    return false;
  }
  if (!CN_CUDA_CHECK(c, cudaHostAlloc((void **)&c->fetch_host,
                                      2 * cap * sizeof(float),
                                      cudaHostAllocDefault))) {
    c->fetch_host = NULL;
    cu_pool_put(c, c->fetch_dev);
    c->fetch_dev = NULL;
    c->fetch_old = old;
    return false;
  }
  c->fetch_old = old;
  c->base.ctr.allocs++;
  c->fetch_cap = cap;
  return true;
}

/* One upload of the span table, one gather kernel, one copy into a
 * pinned half, an event: no wait (fetch_wait waits). A single span needs
 * no gather: it is copied as it is. Nothing to copy still records the
 * event, so the wait is for all work issued so far. */
static const float *cu_fetch_start(cn_backend_ctx *bk, const float *base,
                                   const int64_t *off, const int64_t *len,
                                   int n) {
  static const float none[1] = {0.0f};
  cu_ctx *c = cu_of(bk);
  if (!cu_enter(c)) return NULL;
  int h = c->fetch_turn;
  c->fetch_turn ^= 1;
  /* the half's last fetch has landed before its space is written again;
   * a block a growth retired is read no more (it held the fetch before
   * this one's predecessor, landed when the growth settled it) */
  if (!fetch_settle(c, h)) return NULL;
  c->fetch_buf[h] = NULL;
  if (c->fetch_old != NULL) {
    CN_CUDA_CHECK(c, cudaFreeHost(c->fetch_old));
    c->fetch_old = NULL;
  }
  size_t total = 0;
  for (int k = 0; k < n; k++) total += len[k] > 0 ? (size_t)len[k] : 0;
  float *dst = NULL;
  if (total > 0) {
    if (!fetch_grow(c, h, total)) return NULL;
    dst = c->fetch_host + (size_t)h * c->fetch_cap;
    const float *src = NULL;
    if (n == 1) {
      src = base + off[0];
    } else {
      int64_t *hs, *ds;
      if (!cu_stage_reserve(c, 2 * (size_t)n + 1, &hs, &ds)) return NULL;
      int64_t at = 0;
      for (int k = 0; k < n; k++) {
        hs[k] = off[k];
        hs[n + k] = at;
        at += len[k] > 0 ? len[k] : 0;
      }
      hs[2 * n] = at;
      if (!cu_stage_commit(c, hs, 2 * (size_t)n + 1)) return NULL;
      unsigned grid = n < 65535 * 8 ? (unsigned)n : 65535u * 8u;
      k_fetch_rows<<<grid, 128, 0, c->stream>>>(c->fetch_dev, base, ds, n);
      if (!CN_CUDA_LAUNCHED(c)) return NULL;
      src = c->fetch_dev;
    }
    if (!CN_CUDA_CHECK(c, cudaMemcpyAsync(dst, src, total * sizeof(float),
                                          cudaMemcpyDeviceToHost, c->stream)))
      return NULL;
    c->base.ctr.bytes_to_host += (long long)(total * sizeof(float));
  }
  if (!CN_CUDA_CHECK(c, cudaEventRecord(c->fetch_ev[h], c->stream)))
    return NULL;
  c->fetch_pending[h] = true;
  c->fetch_buf[h] = total > 0 ? dst : none;
  return c->fetch_buf[h];
}

/* Waits for the fetch that returned buf (both halves when it returned
 * the shared empty result). */
static int cu_fetch_wait(cn_backend_ctx *bk, const float *buf) {
  cu_ctx *c = cu_of(bk);
  if (!cu_enter(c)) return -1;
  bool ok = true;
  for (int h = 0; h < 2; h++)
    if (buf != NULL && c->fetch_buf[h] == buf) ok = fetch_settle(c, h) && ok;
  return ok ? 0 : -1;
}

/* Both halves at once: one wait. */
static const float *cu_fetch_rows(cn_backend_ctx *bk, const float *base,
                                  const int64_t *off, const int64_t *len,
                                  int n) {
  const float *h = cu_fetch_start(bk, base, off, len, n);
  if (h == NULL || cu_fetch_wait(bk, h) != 0) return NULL;
  return h;
}

/* Idle: the pool's unused blocks and the fetch buffers go
 * back to the device; weights, staging and cuBLAS's workspace stay. */
static void cu_release(cn_backend_ctx *bk) {
  cu_ctx *c = cu_of(bk);
  if (c->device < 0 || !cu_set_device(c)) return;
  fetch_free(c);
  if (c->ew_tmp != NULL) {
    cu_pool_put(c, c->ew_tmp);
    c->ew_tmp = NULL;
    c->ew_tmp_bytes = 0;
  }
  cu_pool_trim(c);
  cu_stage_shrink(c); /* a ring grown for large runs: back to 2 MiB */
  (void)cudaGetLastError();
  if (getenv("CANOPY_CUDA_STATS") != NULL)
    fprintf(stderr,
            "canopy cuda: device %d: released; holds %lld bytes "
            "(%lld syncs, %lld launches, %lld allocations, %lld bytes to "
            "device, %lld bytes to host so far)\n",
            c->device, c->base.ctr.device_bytes, c->base.ctr.syncs,
            c->base.ctr.launches, c->base.ctr.allocs,
            c->base.ctr.bytes_to_device, c->base.ctr.bytes_to_host);
}

/* ---- open / close ---- */

static void cu_close(cn_backend_ctx *bk) {
  cu_ctx *c = cu_of(bk);
  if (c == NULL) return;
  if (c->device >= 0 && cu_set_device_quiet(c)) {
    if (c->stream != NULL) (void)cudaStreamSynchronize(c->stream);
    if (getenv("CANOPY_CUDA_STATS") != NULL)
      fprintf(stderr,
              "canopy cuda: device %d: %lld pool allocations (%zu bytes), "
              "%lld weight tensors, %lld staging grows, %lld backend calls, "
              "%lld launches, %lld syncs, %lld allocations, %lld bytes to "
              "device in %lld copies, %lld bytes to host, %lld bytes held; "
              "products with a bias: %s\n",
              c->device, c->device_allocs, c->pool_bytes, c->weight_allocs,
              c->stage_grows, c->base.kernels, c->base.ctr.launches,
              c->base.ctr.syncs, c->base.ctr.allocs,
              c->base.ctr.bytes_to_device, c->base.ctr.copies_to_device,
              c->base.ctr.bytes_to_host,
              c->base.ctr.device_bytes,
              c->lt_off ? "bias kernel + cublasSgemm" : "cublasLt epilogue");
    cu_lt_close(c);
    if (c->blas != NULL) (void)cublasDestroy(c->blas);
    for (int i = 0; i < c->n_blocks; i++) (void)cudaFree(c->blocks[i].p);
    for (int i = 0; i < c->n_weights; i++) (void)cudaFree(c->weights[i].dev);
    if (c->stage_host != NULL) (void)cudaFreeHost(c->stage_host);
    if (c->stage_dev != NULL) (void)cudaFree(c->stage_dev);
    if (c->stage_old_host != NULL) (void)cudaFreeHost(c->stage_old_host);
    if (c->stage_old_dev != NULL) (void)cudaFree(c->stage_old_dev);
    if (c->stage_old_ev != NULL) (void)cudaEventDestroy(c->stage_old_ev);
    if (c->am_host != NULL) (void)cudaFreeHost(c->am_host);
    if (c->fetch_host != NULL) (void)cudaFreeHost(c->fetch_host);
    if (c->fetch_old != NULL) (void)cudaFreeHost(c->fetch_old);
    for (int h = 0; h < 2; h++)
      if (c->fetch_ev[h] != NULL) (void)cudaEventDestroy(c->fetch_ev[h]);
    if (c->am_dev != NULL) (void)cudaFree(c->am_dev);
    for (int h = 0; h < 2; h++)
      if (c->stage_ev[h] != NULL) (void)cudaEventDestroy(c->stage_ev[h]);
    if (c->stream != NULL) (void)cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
  }
  free(c->blocks);
  free(c->weights);
  free(c);
}

static const cn_backend_vt cuda_vt = {
    .name = "cuda",
    .host_memory = false,
    .close = cu_close,
    .release = cu_release,
    .alloc = cu_alloc,
    .free = cu_free,
    /* no per-model state to set up: device weights are cached by content
     * (cu_weights) */
    .run_begins = NULL,
    .weights = cu_weights,
    .to_device = cu_to_device,
    .to_host = cu_to_host,
    .sync = cu_sync,
    .fetch_rows = cu_fetch_rows,
    .fetch_start = cu_fetch_start,
    .fetch_wait = cu_fetch_wait,
    .stage_indices = cu_stage_indices,
    .gemm = cu_gemm,
    /* cuBLAS reads its operand as one matrix: core gathers the parts */
    .gemm_rows = nullptr,
    .gemm_strided = cu_gemm_strided,
    .gemm_batched = cu_gemm_batched,
    .gather = cu_gather,
    .gather_sum = cu_gather_sum,
    .argmax_rows = cu_argmax_rows,
    .copy_rows = cu_copy_rows,
    .ew_program = cu_ew_program,
    .status = cu_status,
};

/* cuBLAS scratch: its own, from the pool, so products never allocate. */

extern "C" int cn__backend_cuda_open(int device, cn_backend_ctx **out,
                                     cn_err *err) {
  *out = NULL;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cn_err_set(err, CN_E_BACKEND,
                      "backend 'cuda': no CUDA device (cudaGetDeviceCount: "
                      "%s)",
                      cudaGetErrorString(e));
  }
  if (count == 0)
    return cn_err_set(err, CN_E_BACKEND,
                      "backend 'cuda': no CUDA device (cudaGetDeviceCount: "
                      "0 devices)");
  if (device < 0 || device >= count)
    return cn_err_set(err, CN_E_BACKEND,
                      "backend 'cuda': device %d not present (%d device%s)",
                      device, count, count == 1 ? "" : "s");
  cudaDeviceProp prop;
  e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess)
    return cn_err_set(err, CN_E_BACKEND,
                      "backend 'cuda': device %d: cudaGetDeviceProperties: %s",
                      device, cudaGetErrorString(e));
  if (prop.major < 9)
    return cn_err_set(err, CN_E_BACKEND,
                      "backend 'cuda': device %d (%s) is compute capability "
                      "%d.%d; this build carries sm_90 code and compute_90 "
                      "PTX only (add a -gencode for it in "
                      "backends/cuda/meson.build)",
                      device, prop.name, prop.major, prop.minor);

  cu_ctx *c = (cu_ctx *)calloc(1, sizeof(*c));
  if (c == NULL) return cn_err_set(err, CN_E_NOMEM, "no memory for backend");
  c->base.vt = &cuda_vt;
  c->device = device;
  c->pool_keep_max = (size_t)1024 << 20;
  const char *bs = getenv("CANOPY_CUDA_BATCH_STAGING");
  c->batch_staging = bs == NULL || strcmp(bs, "0") != 0;
  const char *keep = getenv("CANOPY_CUDA_POOL_MAX_MB");
  if (keep != NULL && keep[0] != '\0') {
    char *end;
    unsigned long long mb = strtoull(keep, &end, 10);
    if (*end == '\0') c->pool_keep_max = (size_t)mb << 20;
  }
  void *ws = NULL;
  bool ok = cu_set_device(c) &&
            CN_CUDA_CHECK(c, cudaStreamCreateWithFlags(
                                 &c->stream, cudaStreamNonBlocking)) &&
            CN_CUDA_CHECK(c, cudaEventCreateWithFlags(
                                 &c->stage_ev[0], cudaEventDisableTiming)) &&
            CN_CUDA_CHECK(c, cudaEventCreateWithFlags(
                                 &c->stage_ev[1], cudaEventDisableTiming)) &&
            CN_CUDA_CHECK(c, cudaEventCreateWithFlags(
                                 &c->stage_old_ev, cudaEventDisableTiming)) &&
            CN_CUDA_CHECK(c, cudaEventCreateWithFlags(
                                 &c->fetch_ev[0], cudaEventDisableTiming)) &&
            CN_CUDA_CHECK(c, cudaEventCreateWithFlags(
                                 &c->fetch_ev[1], cudaEventDisableTiming)) &&
            CN_CUBLAS_CHECK(c, cublasCreate(&c->blas)) &&
            CN_CUBLAS_CHECK(c, cublasSetStream(c->blas, c->stream)) &&
            /* Plain FP32: no TF32 tensor-op shortcuts (1e-4 vs cpu). */
            CN_CUBLAS_CHECK(c, cublasSetMathMode(c->blas,
                                                 CUBLAS_DEFAULT_MATH)) &&
            cu_stage_grow(c, 1);
  if (ok) {
    ws = cu_pool_get(c, CU_BLAS_WORKSPACE);
    ok = ws != NULL && CN_CUBLAS_CHECK(c, cublasSetWorkspace(
                                              c->blas, ws, CU_BLAS_WORKSPACE));
    c->blas_ws = ws;
    if (ok) (void)cu_lt_open(c); /* else the bias kernel and cublasSgemm */
    if (ws == NULL)
      cu_fail(c, __FILE__, __LINE__, "cudaMalloc(cuBLAS workspace)",
              "out of device memory");
  }
  if (!ok) {
    int rc = cn_err_set(err, CN_E_BACKEND, "%s", c->msg);
    cu_close(&c->base);
    return rc;
  }
  *out = &c->base;
  return 0;
}

/* For tests and benchmarks (declared where used): device allocations the
 * pool made so far. */
extern "C" long long cn__backend_cuda_device_allocs(const cn_backend_ctx *bk) {
  return ((const cu_ctx *)bk)->device_allocs;
}
