/* cuda_mem.cu - what every file of the CUDA backend uses: error
 * reporting, making the context's device current, the device pool behind
 * alloc() and scratch, and the pinned index staging ring. The lowest file
 * of backends/cuda: it calls no other. See docs/cuda.md.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* ---- errors ---- */

void cu_fail(cu_ctx *c, const char *file, int line, const char *what,
             const char *why) {
  if (c == NULL || c->failed) return;
  const char *slash = strrchr(file, '/');
  c->failed = CN_E_BACKEND;
  snprintf(c->msg, sizeof(c->msg), "backend 'cuda': %s:%d: %s: %s",
           slash ? slash + 1 : file, line, what, why);
}

const char *cu_blas_str(cublasStatus_t s) { return cublasGetStatusString(s); }

static thread_local int tl_device = -1;

bool cu_set_device(cu_ctx *c) {
  if (tl_device == c->device) return true;
  if (!CN_CUDA_CHECK(c, cudaSetDevice(c->device))) return false;
  tl_device = c->device;
  return true;
}

bool cu_enter(cu_ctx *c) { return !c->failed && cu_set_device(c); }

bool cu_set_device_quiet(cu_ctx *c) {
  if (cudaSetDevice(c->device) != cudaSuccess) return false;
  tl_device = c->device;
  return true;
}

/* ---- the device pool ----
 * Blocks are powers of two (at least 4 KiB); a request takes a free block
 * of its class or makes one with cudaMalloc (counted). Blocks return to
 * the pool on free and go back to the device only at close, so after the
 * first runs of each size class there is no device allocation at all.
 * Reuse is safe without events: every user of a block is on this
 * context's one stream, in order. */

static size_t pool_class(size_t bytes) {
  size_t b = 4096;
  while (b < bytes) b <<= 1;
  return b;
}

/* Hands the unused blocks back to the device (out of device memory, over
 * the bound, or idle): one wait for the stream, whose work may still use
 * a block handed back to the pool. */
void cu_pool_trim(cu_ctx *c) {
  bool any = false;
  for (int i = 0; i < c->n_blocks && !any; i++) any = !c->blocks[i].used;
  if (!any) return;
  (void)cudaStreamSynchronize(c->stream);
  c->base.ctr.syncs++;
  int k = 0;
  for (int i = 0; i < c->n_blocks; i++) {
    if (!c->blocks[i].used) {
      (void)cudaFree(c->blocks[i].p);
      c->pool_bytes -= c->blocks[i].bytes;
      cu_held(c, -(long long)c->blocks[i].bytes);
    } else {
      c->blocks[k++] = c->blocks[i];
    }
  }
  c->n_blocks = k;
}

void *cu_pool_get(cu_ctx *c, size_t bytes) {
  size_t cls = pool_class(bytes);
  for (int i = 0; i < c->n_blocks; i++)
    if (!c->blocks[i].used && c->blocks[i].bytes == cls) {
      c->blocks[i].used = true;
      return c->blocks[i].p;
    }
  if (!cu_set_device(c)) return NULL;
  if (c->n_blocks == c->cap_blocks) {
    int cap = c->cap_blocks ? 2 * c->cap_blocks : 32;
    cu_block *b = (cu_block *)realloc(c->blocks, (size_t)cap * sizeof(*b));
    if (b == NULL) return NULL;
    c->blocks = b;
    c->cap_blocks = cap;
  }
  /* Bounded: the blocks kept unused beyond pool_keep_max go back
   * before the device gives a new one. */
  size_t idle = 0;
  for (int i = 0; i < c->n_blocks; i++)
    if (!c->blocks[i].used) idle += c->blocks[i].bytes;
  if (idle > 0 && idle + cls > c->pool_keep_max) cu_pool_trim(c);
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, cls);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    cu_pool_trim(c);
    e = cudaMalloc(&p, cls);
  }
  if (e != cudaSuccess) {
    /* Not sticky: core reports the allocation failure itself. */
    (void)cudaGetLastError();
    return NULL;
  }
  c->device_allocs++;
  c->base.ctr.allocs++;
  cu_held(c, (long long)cls);
  c->pool_bytes += cls;
  cu_block *nb = &c->blocks[c->n_blocks++];
  nb->p = p;
  nb->bytes = cls;
  nb->used = true;
  return p;
}

void cu_pool_put(cu_ctx *c, void *p) {
  if (p == NULL) return;
  for (int i = c->n_blocks - 1; i >= 0; i--)
    if (c->blocks[i].p == p) {
      c->blocks[i].used = false;
      return;
    }
}

/* ---- index staging ---- */

void cu_stage_old_free(cu_ctx *c, bool wait) {
  if (c->stage_old_host == NULL) return;
  cudaError_t e = cudaEventQuery(c->stage_old_ev);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    if (!wait) return;
    c->base.ctr.syncs++;
    (void)CN_CUDA_CHECK(c, cudaEventSynchronize(c->stage_old_ev));
  }
  (void)CN_CUDA_CHECK(c, cudaFreeHost(c->stage_old_host));
  (void)CN_CUDA_CHECK(c, cudaFree(c->stage_old_dev));
  cu_held(c, -(long long)c->stage_old_cap * 8);
  c->stage_old_host = NULL;
  c->stage_old_dev = NULL;
  c->stage_old_cap = 0;
}

/* Makes a fresh ring of cap words; the current one, if any, is retired:
 * kept (with an event after the work issued so far) until that work has
 * read it. Retiring a second ring before the first is freed waits. */
static bool stage_make(cu_ctx *c, size_t cap) {
  if (c->stage_host != NULL) {
    cu_stage_old_free(c, true);
    if (!CN_CUDA_CHECK(c, cudaEventRecord(c->stage_old_ev, c->stream)))
      return false;
    c->stage_old_host = c->stage_host;
    c->stage_old_dev = c->stage_dev;
    c->stage_old_cap = c->stage_cap;
    c->stage_host = NULL;
    c->stage_dev = NULL;
    c->stage_cap = 0;
    c->stage_grows++;
    /* the halves' events speak of the old ring: fresh ones (an event
     * never recorded has passed) */
    for (int h = 0; h < 2; h++) {
      (void)cudaEventDestroy(c->stage_ev[h]);
      c->stage_ev[h] = NULL;
      if (!CN_CUDA_CHECK(c, cudaEventCreateWithFlags(
                                &c->stage_ev[h], cudaEventDisableTiming)))
        return false;
    }
  }
  if (!CN_CUDA_CHECK(c, cudaHostAlloc((void **)&c->stage_host, cap * 8,
                                      cudaHostAllocDefault)) ||
      !CN_CUDA_CHECK(c, cudaMalloc((void **)&c->stage_dev, cap * 8))) {
    if (c->stage_host != NULL) (void)cudaFreeHost(c->stage_host);
    c->stage_host = NULL;
    c->stage_dev = NULL;
    c->stage_cap = 0;
    return false;
  }
  c->base.ctr.allocs += 2;
  cu_held(c, (long long)cap * 8);
  c->stage_cap = cap;
  c->stage_pos = 0;
  c->stage_half = 0;
  return true;
}

bool cu_stage_grow(cu_ctx *c, size_t need) {
  size_t cap = c->stage_cap ? c->stage_cap : CU_STAGE_MIN;
  while (cap / 2 < need) cap *= 2;
  return stage_make(c, cap);
}

void cu_stage_shrink(cu_ctx *c) {
  cu_stage_old_free(c, true);
  if (c->stage_cap > CU_STAGE_MIN && stage_make(c, CU_STAGE_MIN))
    cu_stage_old_free(c, true);
}

bool cu_stage_reserve(cu_ctx *c, size_t words, int64_t **host,
                      int64_t **dev) {
  *host = NULL;
  *dev = NULL;
  words = (words + 1) & ~(size_t)1;
  if (words == 0) return true;
  /* a switch or a growth records events that must cover every kernel
   * reading the staged batch: none may follow (the callers that read it
   * check cu_stage_fits first) */
  if (!cu_stage_fits(c, words)) cu_batch_end(c);
  cu_stage_old_free(c, false);
  if (words > c->stage_cap / 2 && !cu_stage_grow(c, words)) return false;
  size_t half = c->stage_cap / 2;
  if (c->stage_pos + words > half) {
    /* Switch halves: the copies (and the kernels) that last read the
     * other half must have run. They usually have; when they have not,
     * a run uploads more than a half holds (two runs in flight, a run of
     * thousands of trees), and the ring grows rather than the host
     * waiting for the device in the middle of a run. */
    if (!CN_CUDA_CHECK(c, cudaEventRecord(c->stage_ev[c->stage_half],
                                          c->stream)))
      return false;
    int other = c->stage_half ^ 1;
    cudaError_t e = cudaEventQuery(c->stage_ev[other]);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      if (c->stage_cap < CU_STAGE_MAX) {
        if (!cu_stage_grow(c, 2 * half)) return false;
        half = c->stage_cap / 2;
      } else { /* at its bound: a real wait */
        c->base.ctr.syncs++;
        if (!CN_CUDA_CHECK(c, cudaEventSynchronize(c->stage_ev[other])))
          return false;
        c->stage_half = other;
        c->stage_pos = 0;
      }
    } else {
      c->stage_half = other;
      c->stage_pos = 0;
    }
  }
  size_t at = (size_t)c->stage_half * half + c->stage_pos;
  *host = c->stage_host + at;
  *dev = c->stage_dev + at;
  c->stage_pos += words;
  return true;
}

bool cu_stage_commit(cu_ctx *c, const int64_t *host, size_t words) {
  if (host == NULL || words == 0) return true;
  size_t at = (size_t)(host - c->stage_host);
  c->base.ctr.bytes_to_device += (long long)words * 8;
  c->base.ctr.copies_to_device++;
  return CN_CUDA_CHECK(c, cudaMemcpyAsync(c->stage_dev + at, host,
                                          words * 8, cudaMemcpyHostToDevice,
                                          c->stream));
}

bool cu_stage(cu_ctx *c, int k, const int64_t *const *host,
              const int64_t *len, const int64_t **dev) {
  size_t total = 0;
  for (int pass = 0; pass < 2; pass++) {
    total = 0;
    for (int i = 0; i < k; i++)
      if (len[i] > 0 && host[i] != NULL && !cu_staged(c, host[i], len[i]))
        total += ((size_t)len[i] + 1) & ~(size_t)1;
    if (c->sb_host == NULL || total == 0 || cu_stage_fits(c, total)) break;
    cu_batch_end(c); /* the ring moves on: every array of its own */
  }
  int64_t *hs = NULL, *ds = NULL;
  if (total > 0 && !cu_stage_reserve(c, total, &hs, &ds)) {
    for (int i = 0; i < k; i++) dev[i] = NULL;
    return false;
  }
  size_t o = 0;
  for (int i = 0; i < k; i++) {
    dev[i] = NULL;
    if (len[i] <= 0 || host[i] == NULL) continue;
    if ((dev[i] = cu_staged(c, host[i], len[i])) != NULL) continue;
    memcpy(hs + o, host[i], (size_t)len[i] * 8);
    dev[i] = ds + o;
    o += ((size_t)len[i] + 1) & ~(size_t)1;
  }
  return cu_stage_commit(c, hs, total);
}

/* One copy of the batch's index words; the compute calls that follow
 * read their arrays from it (backend.h). */
void cu_stage_indices(cn_backend_ctx *bk, const int64_t *host,
                      size_t words) {
  cu_ctx *c = cu_of(bk);
  cu_batch_end(c);
  if (host == NULL || words == 0 || !c->batch_staging || !cu_enter(c))
    return;
  int64_t *hs, *ds;
  if (!cu_stage_reserve(c, words, &hs, &ds)) return;
  memcpy(hs, host, words * 8);
  if (!cu_stage_commit(c, hs, words)) return;
  c->sb_host = host;
  c->sb_words = words;
  c->sb_dev = ds;
}
