/* cpu.c - the CPU backend: gemm.c for every product (one fixed order of
 * sums, so answers never depend on the batch), plain loops for gathers,
 * and the compiled cells' fused elementwise programs (cpu_ew.c):
 * backend.h's general operations, no family's own kernel.
 *
 * Memory is host memory (vt.host_memory): weights are used where the model
 * mapped them, and core reads results in place. A weight matrix is packed
 * for gemm.c's kernel the first time a model's run multiplies by it, and
 * the copy serves that model's later products (packs.h). One context
 * per worker thread; gemm.c's threads (cn__gemm_set_threads) split each
 * large product.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "cpu_ew.h"
#include "gemm.h"
#include "packs.h"

/* Freed blocks kept for the context's next runs (see cpu_alloc). */
enum { SPARE_BLOCKS = 4 };
#define SPARE_MAX_BYTES ((size_t)256 << 20)

typedef struct cpu_ctx {
  cn_backend_ctx base;
  void *spare[SPARE_BLOCKS]; /* freed blocks, NULL where none */
  size_t spare_bytes;        /* their sizes together             */
  float *zeros; /* a row of zeros standing in for a missing child/state */
  int n_zeros;
  cn__cpu_ew_ws ew; /* ew_program's scratch (cpu_ew.c) */
  float *tr;   /* a product's right operand packed for one call */
  size_t n_tr;
  cn__packs packs; /* the models' weights packed for gemm.c */
} cpu_ctx;

/* A row of at least n zeros, so the fused loops need no branch for a
 * missing input (and vectorise). */
static const float *zeros(cn_backend_ctx *bk, int n) {
  cpu_ctx *c = (cpu_ctx *)bk;
  if (n > c->n_zeros) {
    float *z = calloc((size_t)n, sizeof(float));
    if (z == NULL) abort();
    free(c->zeros);
    c->zeros = z;
    c->n_zeros = n;
  }
  return c->zeros;
}



/* A block is [64-byte header holding its size | 64-aligned payload]. */
#define BLOCK_HEAD 64
static size_t block_size(void *p) {
  return *(size_t *)((char *)p - BLOCK_HEAD);
}

static void cpu_release(cn_backend_ctx *bk) {
  cpu_ctx *c = (cpu_ctx *)bk;
  cn__packs_drop(&c->packs);
  for (int i = 0; i < SPARE_BLOCKS; i++) {
    if (c->spare[i] != NULL) free((char *)c->spare[i] - BLOCK_HEAD);
    c->spare[i] = NULL;
  }
  c->spare_bytes = 0;
}

static void cpu_close(cn_backend_ctx *bk) {
  cpu_release(bk);
  cn__packs_free(&((cpu_ctx *)bk)->packs);
  free(((cpu_ctx *)bk)->zeros);
  cn__cpu_ew_ws_free(&((cpu_ctx *)bk)->ew);
  free(((cpu_ctx *)bk)->tr);
  free(bk);
}

/* Run arenas are a few MB, freed at the end of every run and allocated
 * again by the next: from malloc each time they came back as fresh pages
 * the kernel had to zero, 14% of `canopy run --jobs 2` (a tree LSTM at
 * H=128, perf, clear_page_erms). So a context keeps up to SPARE_BLOCKS freed
 * blocks (SPARE_MAX_BYTES at most) and hands out the smallest that fits;
 * new blocks get an eighth more than asked, so runs that grow a little
 * still reuse them. The cap bounds what a worker keeps between runs.
 * A context belongs to one thread (a worker, a --jobs job): no lock. */
static void *cpu_alloc(cn_backend_ctx *bk, size_t bytes) {
  cpu_ctx *c = (cpu_ctx *)bk;
  size_t n = (bytes + 63) & ~(size_t)63;
  if (n == 0) n = 64;
  int best = -1;
  for (int i = 0; i < SPARE_BLOCKS; i++)
    if (c->spare[i] != NULL && block_size(c->spare[i]) >= n &&
        (best < 0 || block_size(c->spare[i]) < block_size(c->spare[best])))
      best = i;
  if (best >= 0) {
    void *p = c->spare[best];
    c->spare[best] = NULL;
    c->spare_bytes -= block_size(p);
    return p;
  }
  /* an eighth to spare, so the next run a little bigger fits too */
  if (n <= SPARE_MAX_BYTES) n = (n + n / 8 + 63) & ~(size_t)63;
  void *raw = NULL;
  if (posix_memalign(&raw, 64, BLOCK_HEAD + n) != 0) return NULL;
  *(size_t *)raw = n;
  return (char *)raw + BLOCK_HEAD;
}

/* Keeps p for reuse, evicting smaller spare blocks to make room; a block
 * bigger than the cap, or smaller than every spare when all are taken,
 * goes back to malloc. */
static void cpu_free(cn_backend_ctx *bk, void *p) {
  if (p == NULL) return;
  cpu_ctx *c = (cpu_ctx *)bk;
  size_t n = block_size(p);
  for (; n <= SPARE_MAX_BYTES;) {
    int free_slot = -1, smallest = -1;
    for (int i = 0; i < SPARE_BLOCKS; i++) {
      if (c->spare[i] == NULL) {
        if (free_slot < 0) free_slot = i;
      } else if (smallest < 0 ||
                 block_size(c->spare[i]) < block_size(c->spare[smallest])) {
        smallest = i;
      }
    }
    if (free_slot >= 0 && c->spare_bytes + n <= SPARE_MAX_BYTES) {
      c->spare[free_slot] = p;
      c->spare_bytes += n;
      return;
    }
    if (smallest < 0 || block_size(c->spare[smallest]) >= n) break;
    c->spare_bytes -= block_size(c->spare[smallest]); /* evict, retry */
    free((char *)c->spare[smallest] - BLOCK_HEAD);
    c->spare[smallest] = NULL;
  }
  free((char *)p - BLOCK_HEAD);
}

/* A run binds its model's weights: copies packed for that model serve
 * again, never another's (packs.h). */
static void cpu_run_begins(cn_backend_ctx *bk, uint64_t uid) {
  cn__packs_begin(&((cpu_ctx *)bk)->packs, uid);
}

/* The weights are used where they lie; the context notes where they are,
 * so that products by them may use a packed copy. */
static const float *cpu_weights(cn_backend_ctx *bk, const float *host,
                                size_t n) {
  cn__packs_note(&((cpu_ctx *)bk)->packs, host, n);
  return host;
}

/* The context's scratch, at least n floats. */
static float *scratch(cpu_ctx *c, size_t n) {
  if (n > c->n_tr) {
    float *t = realloc(c->tr, (n ? n : 1) * sizeof(float));
    if (t == NULL) abort(); /* a model's matrix: small */
    c->tr = t;
    c->n_tr = n;
  }
  return c->tr;
}

static void cpu_copy(cn_backend_ctx *bk, void *dst, const void *src,
                     size_t n) {
  memcpy(dst, src, n);
}

static void cpu_sync(cn_backend_ctx *bk) {}

/* C[M,N] = A[M,K]·W[N,K]ᵀ (+ bias) + beta·C, by gemm.c: every element
 * computed the same way whatever the batch around its row (gemm.h). */
static void cpu_gemm(cn_backend_ctx *bk, int M, int N, int K, const float *A,
                     int lda, const float *W, int ldw, const float *bias,
                     float beta, float *C, int ldc) {
  cpu_ctx *c = (cpu_ctx *)bk;
  if (M <= 0 || N <= 0) return;
  const float *P = cn__packs_get(&c->packs, N, K, W, ldw);
  if (P == NULL) {
    float *t = scratch(c, cn__gemm_packed_floats(N, K));
    cn__gemm_pack_nt(N, K, W, ldw, t);
    P = t;
  }
  cn__gemm_packed(M, N, K, A, lda, P, bias, beta, C, ldc);
}

/* The same products with the left operand's rows read in parts where they
 * lie (backend.h gemm_rows): gemm.c's running sum continues from part to
 * part, so every element has the bits cpu_gemm gives for the parts copied
 * side by side. */
static void cpu_gemm_rows(cn_backend_ctx *bk, int M, int N, int n_parts,
                          const cn_gemm_part *parts, const float *bias,
                          float beta, float *C, int ldc) {
  cpu_ctx *c = (cpu_ctx *)bk;
  if (M <= 0 || N <= 0 || n_parts < 1 || n_parts > CN_GEMM_PARTS) return;
  cn__gemm_part gp[CN_GEMM_PARTS];
  size_t need = 0;
  int zero_k = 0;
  for (int q = 0; q < n_parts; q++) {
    const cn_gemm_part *pt = &parts[q];
    gp[q] = (cn__gemm_part){pt->base, pt->off, pt->ld, pt->K,
                            cn__packs_get(&c->packs, N, pt->K, pt->W,
                                          pt->ldw)};
    if (gp[q].P == NULL) need += cn__gemm_packed_floats(N, pt->K);
    if (pt->off != NULL && pt->K > zero_k) zero_k = pt->K;
  }
  if (need > 0) { /* activations, or weights not packed: pack per call */
    float *t = scratch(c, need);
    for (int q = 0; q < n_parts; q++)
      if (gp[q].P == NULL) {
        cn__gemm_pack_nt(N, parts[q].K, parts[q].W, parts[q].ldw, t);
        gp[q].P = t;
        t += cn__gemm_packed_floats(N, parts[q].K);
      }
  }
  const float *z = zero_k > 0 ? zeros(bk, zero_k) : NULL;
  cn__gemm_packed_parts(M, N, n_parts, gp, z, bias, beta, C, ldc);
}

static void cpu_gemm_strided(cn_backend_ctx *bk, int count, int M, int N,
                             int K, const float *A, int lda, long long sa,
                             const float *B, int ldb, long long sb, float beta,
                             float *C, int ldc, long long sc) {
  cpu_ctx *c = (cpu_ctx *)bk;
  if (M <= 0 || N <= 0) return;
  float *P = scratch(c, cn__gemm_packed_floats(N, K));
  for (int r = 0; r < count; r++) {
    cn__gemm_pack_nn(N, K, B + r * sb, ldb, P);
    cn__gemm_packed(M, N, K, A + r * sa, lda, P, NULL, beta, C + r * sc, ldc);
  }
}

/* C[M,N] (ldc) = X (ldx) (+ beta·C): a product by the identity. */
static void copy_add(int M, int N, const float *X, int ldx, float beta,
                     float *C, int ldc) {
  for (int i = 0; i < M; i++) {
    float *c = C + (size_t)i * ldc;
    const float *x = X + (size_t)i * ldx;
    if (beta == 0.0f)
      for (int j = 0; j < N; j++) c[j] = x[j];
    else
      for (int j = 0; j < N; j++) c[j] = beta * c[j] + x[j];
  }
}

/* One product C (+)= A·B, P the packing room; packed: the B now packed
 * in P, kept across calls while it repeats. A NULL operand is the
 * identity (C = the other, no product); a mat-vec (N = 1) reads A in
 * place (cn__gemm_matvec), with the packed kernels' bits. */
static void batched_one(int M, int N, int K, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C,
                        int ldc, float *P, float *xy, const float **packed) {
  if (A == NULL || B == NULL) {
    copy_add(M, N, A == NULL ? B : A, A == NULL ? ldb : lda, beta, C, ldc);
    return;
  }
  if (N > 1) {
    if (B != *packed) cn__gemm_pack_nn(N, K, B, ldb, P);
    *packed = B;
    cn__gemm_packed(M, N, K, A, lda, P, NULL, beta, C, ldc);
    return;
  }
  /* C[M,1] = A[M,K]·B[K,1], A read in place: each vertex's matrix is
   * used once, so packing it cost more than the product */
  float *x = xy;
  const float *b = B;
  if (ldb != 1) { /* a column of B, made a row */
    for (int k = 0; k < K; k++) x[k] = B[(size_t)k * ldb];
    b = x;
  }
  cn__gemm_matvec(M, K, A, lda, b, beta, C, ldc);
}

/* Output by output, its terms one after the other while C_r is in cache
 * (MV-RNN's P = WM_l·A + WM_r·B: 64 KB a vertex at H = 128). */
static void cpu_gemm_batched(cn_backend_ctx *bk, int count, int terms, int M,
                             int N, int K, const float *const *A, int lda,
                             const float *const *B, int ldb, float beta,
                             float *const *C, int ldc) {
  cpu_ctx *c = (cpu_ctx *)bk;
  if (M <= 0 || N <= 0) return;
  size_t np = N > 1 ? cn__gemm_packed_floats(N, K) : cn__gemm_packed_floats(M, K);
  float *P = scratch(c, np + (size_t)K + (size_t)M);
  const float *packed = NULL;
  for (int r = 0; r < count; r++)
    for (int t = 0; t < terms; t++) {
      size_t i = (size_t)t * count + r;
      batched_one(M, N, K, A[i], lda, B[i], ldb, t == 0 ? beta : 1.0f, C[r],
                  ldc, P, P + np, &packed);
    }
}

static void cpu_gather(cn_backend_ctx *bk, float *dst, int ldd,
                       const float *base, const int64_t *idx, int n,
                       int width) {
  for (int r = 0; r < n; r++) {
    float *d = dst + (size_t)r * ldd;
    if (idx[r] < 0)
      memset(d, 0, (size_t)width * sizeof(float));
    else
      memcpy(d, base + idx[r], (size_t)width * sizeof(float));
  }
}

static void cpu_gather_sum(cn_backend_ctx *bk, float *dst, int ldd,
                           const float *base, const int64_t *idx,
                           const int64_t *seg, int n, int width, int mean) {
  for (int r = 0; r < n; r++) {
    float *d = dst + (size_t)r * ldd;
    memset(d, 0, (size_t)width * sizeof(float));
    for (int64_t k = seg[r]; k < seg[r + 1]; k++) {
      const float *s = base + idx[k];
      for (int j = 0; j < width; j++) d[j] += s[j];
    }
    if (mean && seg[r + 1] > seg[r]) {
      float inv = 1.0f / (float)(seg[r + 1] - seg[r]);
      for (int j = 0; j < width; j++) d[j] *= inv;
    }
  }
}

/* Not isfinite(): this file is built with -ffinite-math-only, under which
 * the compiler may take it to be always true. An exponent of all ones is
 * an infinity or a NaN. */
static inline bool finite_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  return (u & 0x7f800000u) != 0x7f800000u;
}

static void cpu_argmax_rows(cn_backend_ctx *bk, int n, int w, const float *X,
                            int ld, int32_t *out) {
  for (int r = 0; r < n; r++) {
    const float *x = X + (size_t)r * ld;
    int best = 0;
    bool finite = true;
    for (int j = 0; j < w; j++) {
      finite = finite && finite_bits(x[j]);
      if (x[j] > x[best]) best = j;
    }
    out[r] = finite ? best : -1;
  }
}

/* ---- compiled vertex functions (core/run/cell_exec.c) ---- */
static void cpu_copy_rows(cn_backend_ctx *bk, float *dst, int ldd,
                          const float *src, int lds, int n, int width) {
  for (int r = 0; r < n; r++)
    memcpy(dst + (size_t)r * ldd, src + (size_t)r * lds,
           (size_t)width * sizeof(float));
}

/* The fused elementwise program (cpu_ew.c), its missing rows read from
 * this context's row of zeros. */
static void cpu_ew_program(cn_backend_ctx *bk, const cn_ew_prog *p,
                           const cn_ew_slot *slots, int n) {
  if (n <= 0 || p->n_insn <= 0) return;
  cn__cpu_ew_program(&((cpu_ctx *)bk)->ew, zeros(bk, cn__cpu_ew_widest(p)),
                     p, slots, n);
}

static const cn_backend_vt cpu_vt = {
    .name = "cpu",
    .host_memory = true,
    .close = cpu_close,
    .release = cpu_release,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .run_begins = cpu_run_begins,
    .weights = cpu_weights,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .sync = cpu_sync,
    .gemm = cpu_gemm,
    .gemm_rows = cpu_gemm_rows,
    .gemm_strided = cpu_gemm_strided,
    .gemm_batched = cpu_gemm_batched,
    .gather = cpu_gather,
    .gather_sum = cpu_gather_sum,
    .argmax_rows = cpu_argmax_rows,
    .copy_rows = cpu_copy_rows,
    .ew_program = cpu_ew_program,
};

int cn__backend_cpu_open(cn_backend_ctx **out, cn_err *err) {
  cpu_ctx *c = calloc(1, sizeof(*c));
  if (c == NULL) return cn_err_set(err, CN_E_NOMEM, "no memory for backend");
  c->base.vt = &cpu_vt;
  *out = &c->base;
  return 0;
}
