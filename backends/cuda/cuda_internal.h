/* cuda_internal.h - the CUDA backend's context and helpers, shared by its
 * five translation units (docs/cuda.md), lowest first (a file calls only
 * files before it):
 *   cuda_mem.cu     errors, the device made current, the device pool,
 *                   index staging;
 *   cuda_rows.cu gathers, the fused cells, argmax, elementwise, row
 *                   copies;
 *   cuda_blas.cu    the cuBLAS products (gemm, gemm_strided, gemm_batched);
 *   cuda_ew.cu      the fused elementwise programs of compiled cells;
 *   cuda_backend.cu open/close, the vtable, weights, copies, the fetch.
 * Only backends/cuda includes CUDA headers.
 */
#ifndef CANOPY_CUDA_INTERNAL_H
#define CANOPY_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend.h"
#include "backends.h"
}

/* One block of device memory the pool handed out or keeps for reuse. */
typedef struct cu_block {
  void *p;
  size_t bytes; /* capacity (a power of two, at least 4 KiB) */
  bool used;
} cu_block;

/* A model tensor's device copy, keyed by the host pointer, its length and
 * a fingerprint of sampled values (a model loaded later at the same
 * address is not mistaken for the old one). */
typedef struct cu_weight {
  const float *host;
  size_t n;
  uint64_t print;
  float *dev;
} cu_weight;

/* A product with a bias as one cublasLt call (the bias in its epilogue),
 * per shape: its layouts and the algorithm the heuristic chose. */
typedef struct cu_lt_plan {
  int M, N, K, lda, ldw, ldc;
  bool beta;      /* accumulates into C */
  bool ok;        /* the heuristic found an algorithm */
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
  size_t ws;      /* workspace it needs */
} cu_lt_plan;

#define CU_LT_PLANS 512
/* The index ring's first size and the most it grows to, in int64 words
 * (2 MiB and 64 MiB of pinned memory, and as much on the device). */
#define CU_STAGE_MIN ((size_t)1 << 18)
#define CU_STAGE_MAX ((size_t)1 << 23)
/* cuBLAS's workspace (from the pool; cublasLt's too) */
#define CU_BLAS_WORKSPACE ((size_t)32 << 20)

typedef struct cu_ctx {
  cn_backend_ctx base;
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  /* the products with a bias (cuda_blas.cu): one cublasLt call each
   * instead of a bias kernel and a cublasSgemm: a launch fewer a product; off
   * when cublasLt is refused once (or CANOPY_CUDA_LT=0) */
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t lt_bias;
  cublasLtMatmulPreference_t lt_pref;
  cu_lt_plan *lt_plans; /* CU_LT_PLANS, direct-mapped by shape */
  bool lt_off;
  void *blas_ws;        /* cuBLAS's workspace, cublasLt's too */

  /* The first failure since the last status() call (sticky: compute calls
   * become no-ops until it is reported). */
  int failed;
  char msg[300];

  /* Device pool: every block ever cudaMalloc'd, reused by size. */
  cu_block *blocks;
  int n_blocks, cap_blocks;
  long long device_allocs; /* cudaMalloc calls for the pool */
  long long weight_allocs; /* cudaMalloc calls for weights */
  size_t pool_bytes;

  cu_weight *weights;
  int n_weights, cap_weights;

  /* Index staging: pinned host ring and its device twin, in two halves;
   * ev[h] marks the last work that read half h. A half switch that would
   * wait for the device grows the ring instead (up to CU_STAGE_MAX): the
   * ring it replaced (old) stays until old_ev, recorded after the last
   * work that read it, has passed, so a growth waits for nothing. */
  int64_t *stage_host, *stage_dev;
  size_t stage_cap, stage_pos;
  int stage_half;
  cudaEvent_t stage_ev[2];
  long long stage_grows;
  int64_t *stage_old_host, *stage_old_dev;
  size_t stage_old_cap;
  cudaEvent_t stage_old_ev;
  /* stage_indices: the batch's index words, uploaded in one copy into
   * the ring (sb_dev), mirroring host words [sb_host, sb_host +
   * sb_words); NULL when no batch is staged. Never kept across a half
   * switch or a growth of the ring: the event recorded then must cover
   * every kernel that reads those words (cu_stage_fits). */
  const int64_t *sb_host;
  size_t sb_words;
  const int64_t *sb_dev;
  /* stage_indices and ew_program's tables by value, on (default) or off
   * (CANOPY_CUDA_BATCH_STAGING=0: every call stages its own arrays, an
   * upload per index array, the path measured on an H200) */
  bool batch_staging;

  /* argmax results: device and pinned host. */
  int32_t *am_dev, *am_host;
  size_t am_cap;

  /* gemm_batched's identity (a NULL operand), for one side. */
  float *eye;
  int eye_H;

  /* fetch_rows / fetch_start: the packed spans on the device (a pool
   * block) and their pinned host copy in two halves used in turn (one
   * fetch may be read while the next is under way), grown to the
   * largest fetch, kept until release() or close. An event per half
   * marks its copy done; fetch_old is the pinned block a growth
   * replaced, whose other half may be read until the next fetch. */
  float *fetch_dev, *fetch_host, *fetch_old;
  size_t fetch_cap; /* floats: the device block, and each host half */
  cudaEvent_t fetch_ev[2];
  bool fetch_pending[2]; /* a copy into the half not yet waited for  */
  const float *fetch_buf[2]; /* what the half's last fetch returned    */
  int fetch_turn;

  /* What the pool keeps beyond the blocks in use (bytes): above it, free
   * blocks go back to the device before a new one is made
   * (CANOPY_CUDA_POOL_MAX_MB, default 1024). */
  size_t pool_keep_max;

  /* ew_program's per-row scratch when it does not fit in shared memory:
   * a pool block, grown (never shrunk) to the largest n · tmp_width. */
  float *ew_tmp;
  size_t ew_tmp_bytes;
} cu_ctx;

static inline cu_ctx *cu_of(cn_backend_ctx *bk) { return (cu_ctx *)bk; }

/* Records the first error (file:line, the call and CUDA's words). */
void cu_fail(cu_ctx *c, const char *file, int line, const char *what,
             const char *why);

/* Every CUDA and cuBLAS call goes through one of these: on failure the
 * context remembers "file:line: call: reason" and the expression is
 * false. */
#define CN_CUDA_CHECK(c, call)                                            \
  cu_check_rt((c), (call), __FILE__, __LINE__, #call)
#define CN_CUBLAS_CHECK(c, call)                                          \
  cu_check_blas((c), (call), __FILE__, __LINE__, #call)

static inline bool cu_check_rt(cu_ctx *c, cudaError_t e, const char *file,
                               int line, const char *what) {
  if (e == cudaSuccess) return true;
  cu_fail(c, file, line, what, cudaGetErrorString(e));
  (void)cudaGetLastError(); /* clear a non-sticky error */
  return false;
}

const char *cu_blas_str(cublasStatus_t s);

static inline bool cu_check_blas(cu_ctx *c, cublasStatus_t s,
                                 const char *file, int line,
                                 const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  cu_fail(c, file, line, what, cu_blas_str(s));
  return false;
}

/* Launch check: the configuration error of the last <<<>>>; counts the
 * launch (the launches counter of cn_run_stats). */
#define CN_CUDA_LAUNCHED(c)                                               \
  ((c)->base.ctr.launches++, CN_CUDA_CHECK((c), cudaGetLastError()))

/* Device memory the context holds: pool, weights, staging and argmax
 * twins, kept in base.ctr.device_bytes. */
static inline void cu_held(cu_ctx *c, long long delta) {
  c->base.ctr.device_bytes += delta;
}

/* Enters a compute call: false when the context already failed (the call
 * is skipped) or its device cannot be made current on this thread. */
bool cu_enter(cu_ctx *c);
/* Makes the context's device current on this thread (once per thread and
 * device); false on failure, recorded. _quiet: records nothing (closing). */
bool cu_set_device(cu_ctx *c);
bool cu_set_device_quiet(cu_ctx *c);

/* Copies k host index arrays (lengths len[i], NULL when 0) to the device
 * through the pinned ring with one asynchronous copy on the stream (none
 * for those the staged batch holds); dev[i] receive the device
 * addresses. False on failure (recorded). */
bool cu_stage(cu_ctx *c, int k, const int64_t *const *host,
              const int64_t *len, const int64_t **dev);

/* The same ring, for callers that build their upload in place: reserves
 * `words` int64 (rounded up to even) and returns the pinned host words to
 * fill and their device twin; cu_stage_commit then issues the one
 * asynchronous copy. Nothing else may be staged in between. */
bool cu_stage_reserve(cu_ctx *c, size_t words, int64_t **host,
                      int64_t **dev);
bool cu_stage_commit(cu_ctx *c, const int64_t *host, size_t words);

/* The staged batch's device copy of host words [p, p + len), or NULL
 * when they are not all in it. */
static inline const int64_t *cu_staged(const cu_ctx *c, const int64_t *p,
                                       int64_t len) {
  if (c->sb_host == NULL || p == NULL || len <= 0 || p < c->sb_host ||
      p + len > c->sb_host + c->sb_words)
    return NULL;
  return c->sb_dev + (p - c->sb_host);
}
/* Whether `words` more fit in the ring's current half (no switch, no
 * growth). */
static inline bool cu_stage_fits(const cu_ctx *c, size_t words) {
  words = (words + 1) & ~(size_t)1;
  return c->stage_pos + words <= c->stage_cap / 2;
}
/* Ends the staged batch: later calls stage their own arrays. */
static inline void cu_batch_end(cu_ctx *c) {
  c->sb_host = NULL;
  c->sb_words = 0;
  c->sb_dev = NULL;
}
/* stage_indices (backend.h). */
void cu_stage_indices(cn_backend_ctx *bk, const int64_t *host, size_t words);

/* A scratch block from the pool (stream-ordered reuse); NULL on failure. */
void *cu_pool_get(cu_ctx *c, size_t bytes);
void cu_pool_put(cu_ctx *c, void *p);
/* Hands the pool's unused blocks back to the device (one wait for the
 * stream first). */
void cu_pool_trim(cu_ctx *c);
/* Grows the pinned staging ring to hold at least `need` words in a half
 * (the ring it replaces is freed once the work issued so far is done). */
bool cu_stage_grow(cu_ctx *c, size_t need);
/* Frees the ring a growth replaced (wait: for the work still reading it;
 * else only once that work is done). */
void cu_stage_old_free(cu_ctx *c, bool wait);
/* Back to the first size (idle: the stream was waited for). */
void cu_stage_shrink(cu_ctx *c);

/* Grid size for n threads of `threads` per block. */
static inline unsigned cu_blocks(long long n, int threads) {
  long long b = (n + threads - 1) / threads;
  return (unsigned)(b > 0x7fffffffLL ? 0x7fffffffLL : b);
}

/* cuda_blas.cu */
void cu_gemm(cn_backend_ctx *bk, int M, int N, int K, const float *A,
             int lda, const float *W, int ldw, const float *bias, float beta,
             float *C, int ldc);
void cu_gemm_strided(cn_backend_ctx *bk, int count, int M, int N, int K,
                     const float *A, int lda, long long sa, const float *B,
                     int ldb, long long sb, float beta, float *C, int ldc,
                     long long sc);
/* cublasLt set up for the products with a bias (false: left off). */
bool cu_lt_open(cu_ctx *c);
void cu_lt_close(cu_ctx *c);

/* cuda_rows.cu */
bool cu_bias_rows(cu_ctx *c, int M, int N, const float *bias, float beta,
                  float *C, int ldc);
bool cu_eye(cu_ctx *c, float *I, int H);
void cu_gemm_batched(cn_backend_ctx *bk, int count, int terms, int M, int N,
                     int K, const float *const *A, int lda,
                     const float *const *B, int ldb, float beta,
                     float *const *C, int ldc);
void cu_gather(cn_backend_ctx *bk, float *dst, int ldd, const float *base,
               const int64_t *idx, int n, int width);
void cu_gather_sum(cn_backend_ctx *bk, float *dst, int ldd, const float *base,
                   const int64_t *idx, const int64_t *seg, int n, int width,
                   int mean);
void cu_argmax_rows(cn_backend_ctx *bk, int n, int w, const float *X, int ld,
                    int32_t *out);
void cu_copy_rows(cn_backend_ctx *bk, float *dst, int ldd, const float *src,
                  int lds, int n, int width);
/* cuda_ew.cu */
void cu_ew_program(cn_backend_ctx *bk, const cn_ew_prog *p,
                   const cn_ew_slot *slots, int n);

/* σ as the CPU backend computes it (expf, no fast math). */
__device__ __forceinline__ float sigm(float x) {
  return 1.0f / (1.0f + expf(-x));
}

#endif
