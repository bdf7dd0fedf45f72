/* devsim.c - the simulated device of devsim.h: the cpu backend's kernels
 * on memory core must treat as a device's. */
#include "devsim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"

/* Kernels the cuda backend launches for a product with a bias: one
 * cublasLt call with the bias in its epilogue (2 where cublasLt refuses
 * the shape: the bias broadcast, then cublasSgemm). */
#define CN_GEMM_BIAS_LAUNCHES 1

typedef struct sim_block {
  void *p;
  size_t bytes; /* a power of two */
  bool used;
} sim_block;

typedef struct sim_weight {
  const float *host;
  size_t n;
  float *copy;
} sim_weight;

typedef struct sim_ctx {
  cn_backend_ctx base;
  cn_backend_ctx *cpu; /* the kernels */
  sim_block *blocks;
  int n_blocks, cap_blocks;
  sim_weight *w;
  int n_w, cap_w;
  /* the two fetch buffers (fetch_start), each with the rows it will hold
   * once waited for: until then it reads NaN, so an answer read before
   * cn_run_wait, or after its buffer's reuse, cannot pass unnoticed */
  float *fetch[2], *fetch_due[2];
  size_t fetch_cap, fetch_len[2]; /* both grown together */
  bool fetch_pending[2];
  int fetch_turn;
  float *fetch_old; /* the other buffer before a growth: it may be read
                       until the next fetch starts, then it goes */
  long long argmax_bytes, argmax_calls, uploads;
  long long rebuilds; /* gemm_batched's pointer arrays staged again: an
                         operand was the identity (NULL) */
  /* stage_indices: the batch's index words as uploaded (the kernels read
   * this copy, so words the host changed after the upload would show),
   * and the host range they mirror */
  const int64_t *staged_host;
  size_t staged_words, staged_cap;
  int64_t *staged;
  bool batch_staging; /* as cuda: CANOPY_CUDA_BATCH_STAGING=0 turns off
                         stage_indices and the tables by value */
} sim_ctx;

/* What cuda_ew.cu passes by value (no upload): a slot table and
 * instructions up to these sizes. */
#define SIM_EW_INLINE_SLOTS 48
#define SIM_EW_INLINE_INSNS 48

static sim_ctx *S(cn_backend_ctx *bk) { return (sim_ctx *)bk; }
#define CPU(bk) (S(bk)->cpu)

/* One upload of index words, as cu_stage makes per call. */
static void upload(cn_backend_ctx *bk, long long words) {
  if (words <= 0) return;
  bk->ctr.bytes_to_device += words * 8;
  bk->ctr.copies_to_device++;
  S(bk)->uploads++;
}

/* An index array of len words a kernel reads: the batch's uploaded copy
 * when the array lies in the staged range, else the host array itself,
 * whose words the call uploads (*words). */
static const int64_t *idx_arg(sim_ctx *s, const int64_t *p, long long len,
                              long long *words) {
  if (p == NULL || len <= 0) return p;
  if (s->staged_host != NULL && p >= s->staged_host &&
      p + len <= s->staged_host + s->staged_words)
    return s->staged + (p - s->staged_host);
  *words += len;
  return p;
}

static void sim_stage_indices(cn_backend_ctx *bk, const int64_t *host,
                              size_t words) {
  sim_ctx *s = S(bk);
  s->staged_host = NULL;
  s->staged_words = 0;
  if (host == NULL || words == 0 || !s->batch_staging) return;
  if (words > s->staged_cap) {
    int64_t *c = realloc(s->staged, words * sizeof(int64_t));
    if (c == NULL) return; /* every call then uploads its own */
    s->staged = c;
    s->staged_cap = words;
  }
  memcpy(s->staged, host, words * sizeof(int64_t));
  s->staged_host = host;
  s->staged_words = words;
  upload(bk, (long long)words);
}

static void fetch_free(sim_ctx *s) {
  for (int i = 0; i < 2; i++) {
    free(s->fetch[i]);
    free(s->fetch_due[i]);
    s->fetch[i] = s->fetch_due[i] = NULL;
    s->fetch_len[i] = 0;
    s->fetch_pending[i] = false;
  }
  s->fetch_cap = 0;
  free(s->fetch_old);
  s->fetch_old = NULL;
}

/* ---- memory: a pool by power-of-two class, as the cuda backend's ---- */

static void *sim_alloc(cn_backend_ctx *bk, size_t bytes) {
  sim_ctx *s = S(bk);
  size_t cls = 4096;
  while (cls < bytes) cls <<= 1;
  for (int i = 0; i < s->n_blocks; i++)
    if (!s->blocks[i].used && s->blocks[i].bytes == cls) {
      s->blocks[i].used = true;
      return s->blocks[i].p;
    }
  if (s->n_blocks == s->cap_blocks) {
    int c = s->cap_blocks ? 2 * s->cap_blocks : 32;
    sim_block *b = realloc(s->blocks, (size_t)c * sizeof(*b));
    if (b == NULL) return NULL;
    s->blocks = b;
    s->cap_blocks = c;
  }
  void *p = malloc(cls);
  if (p == NULL) return NULL;
  /* garbage, as fresh device memory: a read of an unwritten float shows */
  memset(p, 0xff, cls);
  s->blocks[s->n_blocks++] = (sim_block){p, cls, true};
  bk->ctr.allocs++;
  bk->ctr.device_bytes += (long long)cls;
  return p;
}

static void sim_free(cn_backend_ctx *bk, void *p) {
  sim_ctx *s = S(bk);
  for (int i = 0; p != NULL && i < s->n_blocks; i++)
    if (s->blocks[i].p == p) {
      s->blocks[i].used = false;
      return;
    }
}

static void sim_release(cn_backend_ctx *bk) {
  sim_ctx *s = S(bk);
  int k = 0;
  for (int i = 0; i < s->n_blocks; i++) {
    if (s->blocks[i].used) {
      s->blocks[k++] = s->blocks[i];
      continue;
    }
    bk->ctr.device_bytes -= (long long)s->blocks[i].bytes;
    free(s->blocks[i].p);
  }
  s->n_blocks = k;
  fetch_free(s);
}

static const float *sim_weights(cn_backend_ctx *bk, const float *host,
                                size_t n) {
  sim_ctx *s = S(bk);
  for (int i = 0; i < s->n_w; i++)
    if (s->w[i].host == host && s->w[i].n == n) return s->w[i].copy;
  if (s->n_w == s->cap_w) {
    int c = s->cap_w ? 2 * s->cap_w : 64;
    sim_weight *w = realloc(s->w, (size_t)c * sizeof(*w));
    if (w == NULL) return NULL;
    s->w = w;
    s->cap_w = c;
  }
  float *copy = malloc((n ? n : 1) * sizeof(float));
  if (copy == NULL) return NULL;
  if (n > 0) memcpy(copy, host, n * sizeof(float));
  s->w[s->n_w++] = (sim_weight){host, n, copy};
  bk->ctr.allocs++;
  bk->ctr.bytes_to_device += (long long)(n * sizeof(float));
  bk->ctr.copies_to_device += n > 0;
  bk->ctr.device_bytes += (long long)((n ? n : 1) * sizeof(float));
  return copy;
}

static void sim_to_device(cn_backend_ctx *bk, void *dst, const void *src,
                          size_t n) {
  if (n == 0) return;
  memcpy(dst, src, n);
  bk->ctr.bytes_to_device += (long long)n;
  bk->ctr.copies_to_device++;
  bk->ctr.syncs++;
}

static void sim_to_host(cn_backend_ctx *bk, void *dst, const void *src,
                        size_t n) {
  if (n == 0) return;
  memcpy(dst, src, n);
  bk->ctr.bytes_to_host += (long long)n;
  bk->ctr.syncs++;
}

static void sim_sync(cn_backend_ctx *bk) { bk->ctr.syncs++; }

static void fetch_deliver(sim_ctx *s, int i) {
  if (!s->fetch_pending[i]) return;
  memcpy(s->fetch[i], s->fetch_due[i], s->fetch_len[i] * sizeof(float));
  s->fetch_pending[i] = false;
  s->base.ctr.syncs++;
}

static const float *sim_fetch_start(cn_backend_ctx *bk, const float *base,
                                    const int64_t *off, const int64_t *len,
                                    int n) {
  static const float none[1] = {0.0f};
  sim_ctx *s = S(bk);
  int i = s->fetch_turn;
  s->fetch_turn ^= 1;
  fetch_deliver(s, i); /* the buffer's last fetch, if nobody waited */
  free(s->fetch_old);  /* its rows were the previous fetch's but one */
  s->fetch_old = NULL;
  size_t total = 0;
  for (int k = 0; k < n; k++) total += len[k] > 0 ? (size_t)len[k] : 0;
  if (total > s->fetch_cap) { /* both grow: one allocation, as cuda's */
    size_t cap = 1024;
    while (cap < total) cap <<= 1;
    fetch_deliver(s, i ^ 1); /* the other is read from where it is */
    s->fetch_old = s->fetch[i ^ 1];
    free(s->fetch[i]);
    free(s->fetch_due[i]);
    free(s->fetch_due[i ^ 1]);
    s->fetch[i] = malloc(cap * sizeof(float));
    s->fetch[i ^ 1] = malloc(cap * sizeof(float));
    s->fetch_due[i] = malloc(cap * sizeof(float));
    s->fetch_due[i ^ 1] = malloc(cap * sizeof(float));
    s->fetch_cap = cap;
    bk->ctr.allocs++;
    if (!s->fetch[i] || !s->fetch[i ^ 1] || !s->fetch_due[i] ||
        !s->fetch_due[i ^ 1]) {
      fetch_free(s);
      return NULL;
    }
  }
  if (n > 1) {
    upload(bk, 2 * (long long)n + 1);
    bk->ctr.launches++;
  }
  size_t at = 0;
  for (int k = 0; k < n; k++) {
    if (len[k] <= 0) continue;
    memcpy(s->fetch_due[i] + at, base + off[k], (size_t)len[k] * sizeof(float));
    at += (size_t)len[k];
  }
  for (size_t j = 0; j < total; j++) s->fetch[i][j] = __builtin_nanf("");
  s->fetch_len[i] = total;
  s->fetch_pending[i] = total > 0;
  bk->ctr.bytes_to_host += (long long)(total * sizeof(float));
  if (total == 0) bk->ctr.syncs++; /* a wait, and nothing to bring */
  return total > 0 ? s->fetch[i] : none;
}

static int sim_fetch_wait(cn_backend_ctx *bk, const float *buf) {
  sim_ctx *s = S(bk);
  for (int i = 0; i < 2; i++)
    if (buf == s->fetch[i]) fetch_deliver(s, i);
  return 0;
}

static const float *sim_fetch_rows(cn_backend_ctx *bk, const float *base,
                                   const int64_t *off, const int64_t *len,
                                   int n) {
  const float *h = sim_fetch_start(bk, base, off, len, n);
  if (h != NULL) sim_fetch_wait(bk, h);
  return h;
}

/* ---- compute: the cpu kernels, counted as the cuda backend launches ---- */

static void sim_gemm(cn_backend_ctx *bk, int M, int N, int K, const float *A,
                     int lda, const float *W, int ldw, const float *bias,
                     float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  bk->ctr.launches += 1 + (bias != NULL && CN_GEMM_BIAS_LAUNCHES > 1);
  CPU(bk)->vt->gemm(CPU(bk), M, N, K, A, lda, W, ldw, bias, beta, C, ldc);
}

static void sim_gemm_strided(cn_backend_ctx *bk, int count, int M, int N,
                             int K, const float *A, int lda, long long sa,
                             const float *B, int ldb, long long sb,
                             float beta, float *C, int ldc, long long sc) {
  bk->ctr.launches++;
  CPU(bk)->vt->gemm_strided(CPU(bk), count, M, N, K, A, lda, sa, B, ldb, sb,
                            beta, C, ldc, sc);
}

static void sim_gemm_batched(cn_backend_ctx *bk, int count, int terms,
                             int M, int N, int K, const float *const *A,
                             int lda, const float *const *B, int ldb,
                             float beta, float *const *C, int ldc) {
  /* the pointer arrays, staged as cuda does; one product a term */
  sim_ctx *s = S(bk);
  long long w = 0, tc = (long long)terms * count;
  A = (const float *const *)idx_arg(s, (const int64_t *)(const void *)A,
                                    tc, &w);
  B = (const float *const *)idx_arg(s, (const int64_t *)(const void *)B,
                                    tc, &w);
  C = (float *const *)idx_arg(s, (const int64_t *)(const void *)C, count,
                              &w);
  for (long long i = 0; i < tc && w == 0; i++) /* the identity: cuda */
    if (A[i] == NULL || B[i] == NULL) {        /* rebuilds the arrays */
      w = 2 * tc + count;
      s->rebuilds++;
    }
  upload(bk, w);
  bk->ctr.launches += terms;
  CPU(bk)->vt->gemm_batched(CPU(bk), count, terms, M, N, K, A, lda, B, ldb,
                            beta, C, ldc);
}

static void sim_gather(cn_backend_ctx *bk, float *dst, int ldd,
                       const float *base, const int64_t *idx, int n,
                       int width) {
  if (n <= 0 || width <= 0) return;
  long long w = 0;
  idx = idx_arg(S(bk), idx, n, &w);
  upload(bk, w);
  bk->ctr.launches++;
  CPU(bk)->vt->gather(CPU(bk), dst, ldd, base, idx, n, width);
}

static void sim_gather_sum(cn_backend_ctx *bk, float *dst, int ldd,
                           const float *base, const int64_t *idx,
                           const int64_t *seg, int n, int width, int mean) {
  if (n <= 0 || width <= 0) return;
  long long w = 0;
  idx = idx_arg(S(bk), idx, seg[n], &w); /* its length from the host */
  seg = idx_arg(S(bk), seg, n + 1, &w);
  upload(bk, w);
  bk->ctr.launches++;
  CPU(bk)->vt->gather_sum(CPU(bk), dst, ldd, base, idx, seg, n, width, mean);
}


static void sim_argmax_rows(cn_backend_ctx *bk, int n, int w, const float *X,
                            int ld, int32_t *out) {
  if (n <= 0) return;
  bk->ctr.launches++;
  bk->ctr.syncs++;
  bk->ctr.bytes_to_host += (long long)n * 4;
  S(bk)->argmax_bytes += (long long)n * 4;
  S(bk)->argmax_calls++;
  CPU(bk)->vt->argmax_rows(CPU(bk), n, w, X, ld, out);
}


static void sim_copy_rows(cn_backend_ctx *bk, float *dst, int ldd,
                          const float *src, int lds, int n, int width) {
  if (n <= 0 || width <= 0) return;
  bk->ctr.launches++;
  CPU(bk)->vt->copy_rows(CPU(bk), dst, ldd, src, lds, n, width);
}

/* An operand's slot as cuda_ew.cu accepts it: a constant (< 0), a slot
 * of the table, or the tmp slot. */
static bool sim_slot_ok(const cn_ew_prog *p, int slot) {
  return slot < 0 || slot < p->n_slots || slot == p->tmp_slot;
}

/* cuda_ew.cu refuses a program with an op outside backend.h's list or an
 * operand outside the table (b only for an op that reads one); so does
 * the simulated device, loudly, so a compiler that emits one fails the
 * CPU tests as it would fail on a GPU. */
static void sim_ew_check(const cn_ew_prog *p) {
  for (int i = 0; i < p->n_insn; i++) {
    const cn_ew_insn *in = &p->insn[i];
    if (in->op < CN_EW__COUNT && sim_slot_ok(p, in->d.slot) &&
        sim_slot_ok(p, in->a.slot) &&
        (!cn_ew_binary(in->op) || sim_slot_ok(p, in->b.slot)))
      continue;
    fprintf(stderr, "devsim ew_program: instruction %d: bad op %d or slot "
            "(%d, %d, %d) of %d\n", i, (int)in->op, (int)in->d.slot,
            (int)in->a.slot, (int)in->b.slot, p->n_slots);
    abort();
  }
}

static void sim_ew_program(cn_backend_ctx *bk, const cn_ew_prog *p,
                           const cn_ew_slot *slots, int n) {
  if (n <= 0 || p == NULL || p->n_insn <= 0) return;
  sim_ew_check(p);
  /* as cuda_ew.cu: the off arrays (an edge slot's seg[n] long) and the
   * segments the batch did not stage, and the slot table and
   * instructions when they are too big to pass by value, in one upload */
  sim_ctx *s = S(bk);
  bool loop = p->edge_end > p->edge_begin && p->seg != NULL;
  long long E = loop ? p->seg[n] : 0, words = 0;
  cn_ew_slot *tab = malloc((size_t)(p->n_slots + 1) * sizeof(*tab));
  if (tab == NULL) abort();
  memcpy(tab, slots, (size_t)p->n_slots * sizeof(*tab));
  for (int k = 0; k < p->n_slots; k++)
    if (k != p->tmp_slot && tab[k].off != NULL)
      tab[k].off = idx_arg(s, tab[k].off,
                           loop && k >= p->edge_slot0 ? E : n, &words);
  cn_ew_prog q = *p;
  if (loop) q.seg = idx_arg(s, p->seg, n + 1, &words);
  int T = p->n_slots > p->tmp_slot + 1 ? p->n_slots : p->tmp_slot + 1;
  if (!s->batch_staging || T > SIM_EW_INLINE_SLOTS ||
      p->n_insn > SIM_EW_INLINE_INSNS)
    words += (long long)T * 3 +
             ((long long)p->n_insn * (long long)sizeof(cn_ew_insn) + 7) / 8;
  upload(bk, words);
  bk->ctr.launches++;
  CPU(bk)->vt->ew_program(CPU(bk), &q, tab, n);
  free(tab);
}

static void sim_close(cn_backend_ctx *bk) {
  sim_ctx *s = S(bk);
  for (int i = 0; i < s->n_blocks; i++) free(s->blocks[i].p);
  for (int i = 0; i < s->n_w; i++) free(s->w[i].copy);
  free(s->blocks);
  free(s->w);
  fetch_free(s);
  free(s->staged);
  cn_backend_close(s->cpu);
  free(s);
}

static const cn_backend_vt sim_vt = {
    .name = "devsim",
    .host_memory = false,
    .close = sim_close,
    .release = sim_release,
    .alloc = sim_alloc,
    .free = sim_free,
    .weights = sim_weights,
    .to_device = sim_to_device,
    .to_host = sim_to_host,
    .sync = sim_sync,
    .fetch_rows = sim_fetch_rows,
    .fetch_start = sim_fetch_start,
    .fetch_wait = sim_fetch_wait,
    .stage_indices = sim_stage_indices,
    .gemm = sim_gemm,
    .gemm_strided = sim_gemm_strided,
    .gemm_batched = sim_gemm_batched,
    .gather = sim_gather,
    .gather_sum = sim_gather_sum,
    .argmax_rows = sim_argmax_rows,
    .copy_rows = sim_copy_rows,
    .ew_program = sim_ew_program,
    .status = NULL,
};

cn_backend_ctx *devsim_open(void) {
  sim_ctx *s = calloc(1, sizeof(*s));
  if (s == NULL) return NULL;
  cn_err err;
  cn_err_clear(&err);
  if (cn_backend_open("cpu", 0, &s->cpu, &err) != 0) {
    free(s);
    return NULL;
  }
  s->base.vt = &sim_vt;
  const char *bs = getenv("CANOPY_CUDA_BATCH_STAGING");
  s->batch_staging = bs == NULL || strcmp(bs, "0") != 0;
  return &s->base;
}

long long devsim_argmax_bytes(const cn_backend_ctx *bk) {
  return ((const sim_ctx *)bk)->argmax_bytes;
}

long long devsim_argmax_calls(const cn_backend_ctx *bk) {
  return ((const sim_ctx *)bk)->argmax_calls;
}

long long devsim_uploads(const cn_backend_ctx *bk) {
  return ((const sim_ctx *)bk)->uploads;
}

long long devsim_rebuilds(const cn_backend_ctx *bk) {
  return ((const sim_ctx *)bk)->rebuilds;
}
