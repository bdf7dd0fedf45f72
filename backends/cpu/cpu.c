/* cpu.c - the CPU backend: gemm.c for every product (one fixed order of
 * sums, so answers never depend on the batch), plain loops for gathers,
 * and the compiled cells' fused elementwise programs run a tile of rows
 * at a time in vector blocks (fastmath.h): backend.h's general
 * operations, no family's own kernel.
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
#include "fastmath.h"
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
  float *ew;   /* ew_program: per-row scratch and constant rows */
  int64_t n_ew;
  struct ew_step *ew_steps; /* ew_program: its operands resolved */
  int n_ew_steps;
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


/* The fused loops are compiled three times, for AVX-512, AVX2 and the
 * x86-64 baseline (ew_rows_wide, ew_rows_avx2, ew_rows_base), and
 * cpu_ew_program picks one by what the CPU supports. None of the three may
 * contract a multiply and an add into FMA (avx512f alone does not enable
 * it), so each computes the same floats, only wider: answers do not depend
 * on which the CPU runs. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CN_EW_X86 1
#define CN_EW_TARGET(t) __attribute__((target(t)))
#else
#define CN_EW_X86 0
#define CN_EW_TARGET(t)
#endif

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
  free(((cpu_ctx *)bk)->ew);
  free(((cpu_ctx *)bk)->ew_steps);
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

/* ---- the fused elementwise program (backend.h cn_ew_prog) ----
 *
 * Rows go through the program a tile at a time: each instruction runs over
 * every row of the tile before the next one starts, so its op is decoded
 * once per tile rather than once per row. An instruction whose operands
 * all lie at fixed strides (rows of the batch, the tile's scratch, a
 * constant or broadcast row) is one two-dimensional loop over the tile,
 * each row a few vector operations with no decoding, no pointer lookup
 * and no overlap check (at H = 8 an instruction is 8 floats, and the
 * bookkeeping around them cost many times the arithmetic). The per-row
 * scratch (the tmp slot) is one row per row of the tile, the tile as long
 * as keeps it within EW_TILE_BYTES (in L1 with the rows' operands). Rows
 * are independent (backend.h), so the order changes no value: every float
 * is the same expression of the same operands.
 *
 * A segment loop's instructions run per edge, in edge order, row by row,
 * as the contract states them: they may write the per-row scratch that
 * the next edge overwrites. */
#define EW_TILE_BYTES 16384
#define EW_TILE_MAX 64

/* The op expressions' functions (backend.h CN_EW_OPS), from fastmath.h,
 * on a float or on a block of 8 or 16 (the same bits either way). */
#define EW_FN_(x, f)                                                       \
  _Generic((x), cn_v16: f##_v16, cn_v8: f##_v8, default: f)(x)
#define cn_ew_sigmoid(x) EW_FN_(x, cn_sigmoid)
#define cn_ew_tanh(x) EW_FN_(x, cn_tanh)
#define cn_ew_exp(x) EW_FN_(x, cn_exp)
#define cn_ew_relu(x) EW_FN_(x, cn_relu)
#define cn_ew_step(x) EW_FN_(x, cn_step)

/* How an operand's row is found, resolved once per program:
 * EWK_ROWS base + r·ld (ld 0: a broadcast row); EWK_OFF base + off[r],
 * a missing row (off < 0) reads `zero` and is not written; EWK_TMP the
 * tile's scratch, base + t·ld for the row's place t in the tile;
 * EWK_FIXED base (a constant row); EWK_NONE: a unary op's b, or a
 * constant d (nothing is written). */
enum { EWK_ROWS, EWK_OFF, EWK_TMP, EWK_FIXED, EWK_NONE };

typedef struct ew_operand {
  float *base;
  const int64_t *off;
  int64_t ld;
  int kind;
  int edge; /* in a segment loop: indexed by the edge, not the row */
} ew_operand;

typedef struct ew_step {
  int op, width;
  bool serial; /* d overlaps a or b at other columns: one float at a time */
  bool flat;   /* every operand at a fixed stride: one 2-D loop a tile */
  ew_operand x[3]; /* d, a, b */
} ew_step;

/* For each op of the list, four loops (blocks of 16 only where `wide`):
 * ew_<op>: one row of w floats, in blocks of 16 and 8 (vectors: each
 *   read whole before any of it is written, so d may be a or b exactly,
 *   an accumulating chain; no overlap check), then the floats left one by
 *   one;
 * ew_<op>_pair: that on two rows at once, where w % 16 >= 8: each row's
 *   blocks of 16, then the two rows' last 8 as one vector of 16 (at H = 8
 *   a row is 8 floats: half the vector operations, full-width exp and
 *   divides). Each float is the same expression of the same operands as
 *   in ew_<op> (fastmath.h: a lane has the same bits in a vector of 8 or
 *   16), and within a row the blocks keep their order;
 * ew_<op>_2d: over `rows` rows, each operand ld floats after the last
 *   (ld 0: the same row every time): two rows at a time where pairs pay
 *   (EW_PAIR_PAYS), else one loop over the blocks where w is a multiple
 *   of the block (EW_BLOCKS_2D), else row by row;
 * ew_<op>_serial: the plain loop in column order, for an instruction
 *   whose d overlaps a source at other columns (core emits none). */
#define EW_BLOCK(V, ARITY, EXPR)                                           \
  for (; j + (int)(sizeof(V) / 4) <= w; j += (int)(sizeof(V) / 4)) {      \
    V a, b = {0}, d_;                                                      \
    memcpy(&a, pa + j, sizeof(V));                                         \
    if (ARITY == 2) memcpy(&b, pb + j, sizeof(V));                         \
    (void)b;                                                               \
    d_ = (EXPR);                                                           \
    memcpy(pd + j, &d_, sizeof(V));                                        \
  }
/* `rows` rows of w floats, w a multiple of the block, as one loop over
 * the blocks: row by row, each row's blocks in order (the blocks
 * EW_BLOCK makes of it), with nothing to set up per row, so the op's
 * constants stay in registers across the rows (at H = 8 a row is one
 * block, and setting up exp's constants per row cost a third as much
 * again). */
#define EW_BLOCKS_2D(V, ARITY, EXPR)                                       \
  for (int j = 0; r < rows;) {                                             \
    V a, b = {0}, d_;                                                      \
    memcpy(&a, pa + j, sizeof(V));                                         \
    if (ARITY == 2) memcpy(&b, pb + j, sizeof(V));                         \
    (void)b;                                                               \
    d_ = (EXPR);                                                           \
    memcpy(pd + j, &d_, sizeof(V));                                        \
    j += (int)(sizeof(V) / 4);                                             \
    if (j == w) {                                                          \
      j = 0;                                                               \
      r++;                                                                 \
      pd += ldd;                                                           \
      pa += lda;                                                           \
      pb += ldb;                                                           \
    }                                                                      \
  }
/* Two blocks of 8 (x at j of rows 0 and 1) as one vector of 16, and back */
#define EW_LO16 0, 1, 2, 3, 4, 5, 6, 7
#define EW_HI16 8, 9, 10, 11, 12, 13, 14, 15
#define EW_JOIN(x0, x1, j)                                                 \
  __extension__({                                                          \
    cn_v8 lo_, hi_;                                                        \
    memcpy(&lo_, (x0) + (j), sizeof(lo_));                                 \
    memcpy(&hi_, (x1) + (j), sizeof(hi_));                                 \
    __builtin_shufflevector(lo_, hi_, EW_LO16, EW_HI16);                   \
  })
/* Whether two rows' last 8 floats pay as one vector of 16: for exp and
 * what is made of it (a few dozen operations a vector, then half as many
 * vectors); an add or a product costs less than joining and splitting the
 * rows, and a divide takes as long per float either way. */
#define EW_PAIR_PAYS(OP)                                                   \
  ((OP) == CN_EW_SIGMOID || (OP) == CN_EW_TANH || (OP) == CN_EW_EXP)
#define EW_OP_FN(NAME, ARITY, EXPR)                                        \
  __attribute__((always_inline)) static inline void ew_##NAME(             \
      int w, float *pd, const float *pa, const float *pb, bool wide) {     \
    int j = 0;                                                             \
    if (wide) EW_BLOCK(cn_v16, ARITY, EXPR)                                \
    EW_BLOCK(cn_v8, ARITY, EXPR)                                           \
    for (; j < w; j++) {                                                   \
      float a = pa[j], b = ARITY == 2 ? pb[j] : 0.0f;                      \
      (void)b;                                                             \
      pd[j] = (EXPR);                                                      \
    }                                                                      \
  }                                                                        \
  __attribute__((always_inline)) static inline void ew_##NAME##_pair(      \
      int w, float *pd0, float *pd1, const float *pa0, const float *pa1,   \
      const float *pb0, const float *pb1) {                                \
    int j0 = w & ~15, j = 0;                                               \
    {                                                                      \
      float *pd = pd0;                                                     \
      const float *pa = pa0, *pb = pb0;                                    \
      EW_BLOCK(cn_v16, ARITY, EXPR)                                        \
    }                                                                      \
    j = 0;                                                                 \
    {                                                                      \
      float *pd = pd1;                                                     \
      const float *pa = pa1, *pb = pb1;                                    \
      EW_BLOCK(cn_v16, ARITY, EXPR)                                        \
    }                                                                      \
    {                                                                      \
      cn_v16 a = EW_JOIN(pa0, pa1, j0), b = {0}, d_;                       \
      if (ARITY == 2) b = EW_JOIN(pb0, pb1, j0);                           \
      (void)b;                                                             \
      d_ = (EXPR);                                                         \
      cn_v8 lo = __builtin_shufflevector(d_, d_, EW_LO16);                 \
      cn_v8 hi = __builtin_shufflevector(d_, d_, EW_HI16);                 \
      memcpy(pd0 + j0, &lo, sizeof(lo));                                   \
      memcpy(pd1 + j0, &hi, sizeof(hi));                                   \
    }                                                                      \
    for (j = j0 + 8; j < w; j++) { /* w % 8 floats, row by row */          \
      float a = pa0[j], b = ARITY == 2 ? pb0[j] : 0.0f;                    \
      (void)b;                                                             \
      pd0[j] = (EXPR);                                                     \
      a = pa1[j], b = ARITY == 2 ? pb1[j] : 0.0f;                          \
      pd1[j] = (EXPR);                                                     \
    }                                                                      \
  }                                                                        \
  __attribute__((always_inline)) static inline void ew_##NAME##_2d(        \
      int64_t rows, int w, float *pd, int64_t ldd, const float *pa,        \
      int64_t lda, const float *pb, int64_t ldb, bool wide) {              \
    int64_t r = 0;                                                         \
    bool pair = wide && EW_PAIR_PAYS(CN_EW_##NAME) && (w & 15) >= 8;       \
    if (!pair && w > 0 && w % (wide ? 16 : 8) == 0) {                      \
      if (wide)                                                            \
        EW_BLOCKS_2D(cn_v16, ARITY, EXPR)                                  \
      else                                                                 \
        EW_BLOCKS_2D(cn_v8, ARITY, EXPR)                                   \
      return;                                                              \
    }                                                                      \
    if (pair)                                                              \
      for (; r + 2 <= rows; r += 2) {                                      \
        ew_##NAME##_pair(w, pd, pd + ldd, pa, pa + lda, pb, pb + ldb);     \
        pd += 2 * ldd;                                                     \
        pa += 2 * lda;                                                     \
        pb += 2 * ldb;                                                     \
      }                                                                    \
    for (; r < rows; r++) {                                                \
      ew_##NAME(w, pd, pa, pb, wide);                                      \
      pd += ldd;                                                           \
      pa += lda;                                                           \
      pb += ldb;                                                           \
    }                                                                      \
  }                                                                        \
  static void ew_##NAME##_serial(int w, float *pd, const float *pa,        \
                                 const float *pb) {                        \
    for (int j = 0; j < w; j++) {                                          \
      float a = pa[j], b = ARITY == 2 ? pb[j] : 0.0f;                      \
      (void)b;                                                             \
      pd[j] = (EXPR);                                                      \
    }                                                                      \
  }
CN_EW_OPS(EW_OP_FN)
#undef EW_OP_FN

/* Operand x's row at the tile's first row r0, and the floats from one
 * row to the next (a flat step's operands only). */
static inline float *ew_flat(const ew_operand *o, int64_t r0, int64_t *ld) {
  switch (o->kind) {
  case EWK_ROWS: *ld = o->ld; return o->base + r0 * o->ld;
  case EWK_TMP: *ld = o->ld; return o->base;
  default: *ld = 0; return o->base;
  }
}

/* An operand over the rows of one call of ew_step_rows, resolved once:
 * row k (0 ..) at p + k·ld, or, where off != NULL, at base + off[k]
 * (NULL where off[k] < 0: a missing row). NONE: every row NULL. */
typedef struct ew_rowsof {
  float *p, *base;
  const int64_t *off;
  int64_t ld;
} ew_rowsof;

__attribute__((always_inline)) static inline ew_rowsof
ew_rows_of(const ew_operand *o, int64_t i0, int64_t t) {
  switch (o->kind) {
  case EWK_ROWS: return (ew_rowsof){o->base + i0 * o->ld, NULL, NULL, o->ld};
  case EWK_OFF: return (ew_rowsof){NULL, o->base, o->off + i0, 0};
  case EWK_TMP: return (ew_rowsof){o->base + t * o->ld, NULL, NULL, o->ld};
  case EWK_FIXED: return (ew_rowsof){o->base, NULL, NULL, 0};
  default: return (ew_rowsof){NULL, NULL, NULL, 0};
  }
}

__attribute__((always_inline)) static inline float *
ew_row_k(const ew_rowsof *o, int64_t k) {
  if (o->off != NULL) return o->off[k] < 0 ? NULL : o->base + o->off[k];
  return o->p + k * o->ld;
}

/* Step s on the rows [r0, r1) of the tile starting at row t0; in a
 * segment loop (r1 = r0 + 1) its edge operands at edge e. Always inlined:
 * each copy of ew_rows (one per instruction set) gets its own vectorised
 * copy.
 * Operands left where they lie (off) and edge operands are resolved once
 * per call, then row by row; a row with no destination is not written,
 * a missing source reads `zero`. */
__attribute__((always_inline)) static inline void
ew_step_rows(const ew_step *s, int64_t r0, int64_t r1, int64_t t0, int64_t e,
             const float *zero, bool wide) {
  const int w = s->width;
  if (s->flat) { /* the rows [r0, r1) as one 2-D loop */
    int64_t ldd, lda, ldb = 0;
    float *d = ew_flat(&s->x[0], r0, &ldd);
    const float *a = ew_flat(&s->x[1], r0, &lda), *b = a;
    if (s->x[2].kind != EWK_NONE) b = ew_flat(&s->x[2], r0, &ldb);
    switch (s->op) {
#define EW_CASE(NAME, ARITY, EXPR)                                         \
  case CN_EW_##NAME:                                                       \
    ew_##NAME##_2d(r1 - r0, w, d, ldd, a, lda, b, ldb, wide);              \
    break;
      CN_EW_OPS(EW_CASE)
#undef EW_CASE
    default: break;
    }
    return;
  }
  ew_rowsof x[3];
  for (int q = 0; q < 3; q++)
    x[q] = ew_rows_of(&s->x[q], s->x[q].edge ? e : r0, r0 - t0);
  const int64_t rows = r1 - r0;
  switch (s->op) {
/* the rows one by one, the serial loop or the vector one chosen once */
#define EW_ROWS_LOOP(ARITY, CALL)                                          \
  for (int64_t k = 0; k < rows; k++) {                                     \
    float *d = ew_row_k(&x[0], k);                                         \
    const float *a = ew_row_k(&x[1], k), *b = zero;                        \
    if (a == NULL) a = zero;                                               \
    if (ARITY == 2) {                                                      \
      b = ew_row_k(&x[2], k);                                              \
      if (b == NULL) b = zero;                                             \
    }                                                                      \
    if (d == NULL) continue; /* never write a missing row */              \
    CALL;                                                                  \
  }
#define EW_CASE(NAME, ARITY, EXPR)                                         \
  case CN_EW_##NAME:                                                       \
    if (s->serial)                                                         \
      EW_ROWS_LOOP(ARITY, ew_##NAME##_serial(w, d, a, b))                  \
    else                                                                   \
      EW_ROWS_LOOP(ARITY, ew_##NAME(w, d, a, b, wide))                     \
    break;
    CN_EW_OPS(EW_CASE)
#undef EW_CASE
#undef EW_ROWS_LOOP
  default: break;
  }
}

/* The rows [0, n) through every step, a tile of `tile` rows at a time;
 * the segment loop's steps [eb, ee) once per edge of each row. Inlined
 * into one function per instruction set (below), the ops' loops with it.
 * wide: vectors of 16 (and two rows of 8 as one) where the instruction
 * set has them. Without AVX-512, gcc lowers a 16-float vector's
 * comparisons and shuffles float by float (exp's clamps and floor: a
 * few hundred scalar instructions a vector), so there blocks of 8 do
 * all the work: the same floats (fastmath.h), each row in one pass. */
typedef struct ew_run {
  const ew_step *st;
  int n_st, eb, ee;
  int64_t n, tile;
  const float *zero;
  const int64_t *seg;
} ew_run;

__attribute__((always_inline)) static inline void ew_rows(const ew_run *u,
                                                          bool wide) {
  const ew_step *st = u->st;
  const int eb = u->eb, ee = u->ee;
  for (int64_t r0 = 0; r0 < u->n; r0 += u->tile) {
    int64_t r1 = r0 + u->tile < u->n ? r0 + u->tile : u->n;
    for (int i = 0; i < eb; i++)
      ew_step_rows(&st[i], r0, r1, r0, 0, u->zero, wide);
    for (int64_t r = r0; ee > eb && r < r1; r++)
      for (int64_t e = u->seg[r]; e < u->seg[r + 1]; e++)
        for (int i = eb; i < ee; i++)
          ew_step_rows(&st[i], r, r + 1, r0, e, u->zero, wide);
    for (int i = ee > eb ? ee : eb; i < u->n_st; i++)
      ew_step_rows(&st[i], r0, r1, r0, 0, u->zero, wide);
  }
}

CN_EW_TARGET("avx512f") static void ew_rows_wide(const ew_run *u) {
  ew_rows(u, true);
}
#if CN_EW_X86
CN_EW_TARGET("avx2") static void ew_rows_avx2(const ew_run *u) {
  ew_rows(u, false);
}
static void ew_rows_base(const ew_run *u) { ew_rows(u, false); }
#endif

/* The copy cn__cpu_ew_force chose: 0 the widest this CPU runs, 1 wide,
 * 2 avx2, 3 base. */
static int ew_forced;

int cn__cpu_ew_force(const char *name) {
  int k = name == NULL ? 0
          : strcmp(name, "wide") == 0 ? 1
          : strcmp(name, "avx2") == 0 ? 2
          : strcmp(name, "base") == 0 ? 3 : -1;
#if CN_EW_X86
  if (k == 1 && !__builtin_cpu_supports("avx512f")) k = -1;
  if (k == 2 && !__builtin_cpu_supports("avx2")) k = -1;
#else
  if (k > 1) k = -1;
#endif
  if (k < 0) return -1;
  ew_forced = k;
  return 0;
}

/* The copy of ew_rows for this CPU's widest vectors (or the forced one). */
static void ew_rows_run(const ew_run *u) {
#if CN_EW_X86
  int k = ew_forced;
  if (k == 0)
    k = __builtin_cpu_supports("avx512f") ? 1
        : __builtin_cpu_supports("avx2") ? 2 : 3;
  if (k == 1)
    ew_rows_wide(u);
  else if (k == 2)
    ew_rows_avx2(u);
  else
    ew_rows_base(u);
#else
  ew_rows_wide(u);
#endif
}

/* Whether operands x and y of one instruction of width w are the same
 * slot at overlapping but different columns (core's compiler emits none;
 * the plain loop keeps such an instruction's column order). */
static bool ew_shifted(const cn_ew_arg *x, const cn_ew_arg *y, int w) {
  return x->slot >= 0 && x->slot == y->slot && x->col != y->col &&
         x->col < y->col + w && y->col < x->col + w;
}

/* Resolves operand q (0: d, 1: a, 2: b) of instruction i: a constant
 * becomes a row of k at *kp (a constant d writes nothing), the tmp slot
 * the tile's scratch. */
static void ew_resolve(const cn_ew_prog *p, const cn_ew_slot *slots, int i,
                       int q, float *tmp, float **kp, ew_operand *o) {
  const cn_ew_insn *in = &p->insn[i];
  const cn_ew_arg *x = q == 0 ? &in->d : q == 1 ? &in->a : &in->b;
  bool loop = p->edge_end > p->edge_begin && p->seg != NULL;
  *o = (ew_operand){NULL, NULL, 0, EWK_NONE, 0};
  if (q == 2 && !cn_ew_binary(in->op)) return;
  if (x->slot < 0) {
    if (q == 0) return;
    o->kind = EWK_FIXED;
    for (int j = 0; j < in->width; j++) (*kp)[j] = x->k;
    o->base = *kp;
    *kp += in->width;
  } else if (x->slot == p->tmp_slot) {
    o->kind = EWK_TMP;
    o->base = tmp + x->col;
    o->ld = p->tmp_width;
  } else {
    const cn_ew_slot *sl = &slots[x->slot];
    /* a slot with no rows in this batch may have no base: no offset is
     * applied to a null pointer (undefined in C) */
    o->base = sl->base != NULL ? sl->base + x->col : NULL;
    o->off = sl->off;
    o->ld = sl->ld;
    o->kind = sl->off != NULL ? EWK_OFF : EWK_ROWS;
    o->edge = loop && i >= p->edge_begin && i < p->edge_end &&
              x->slot >= p->edge_slot0;
  }
}

/* The fused elementwise program (Cavs' fusion). Constants become rows of
 * k, made once; each operand is resolved to (base, ld | off) once. */
static void cpu_ew_program(cn_backend_ctx *bk, const cn_ew_prog *p,
                           const cn_ew_slot *slots, int n) {
  cpu_ctx *c = (cpu_ctx *)bk;
  if (n <= 0 || p->n_insn <= 0) return;
  int64_t tw = p->tmp_slot >= 0 && p->tmp_width > 0 ? p->tmp_width : 0;
  int64_t tile = tw > 0 ? EW_TILE_BYTES / ((int64_t)sizeof(float) * tw) : n;
  if (tile > EW_TILE_MAX) tile = EW_TILE_MAX;
  if (tile < 1) tile = 1;
  if (tile > n) tile = n;
  int64_t need = tile * tw, maxw = 1;
  for (int i = 0; i < p->n_insn; i++) {
    const cn_ew_insn *in = &p->insn[i];
    if (in->width > maxw) maxw = in->width;
    if (in->a.slot < 0) need += in->width;
    if (in->b.slot < 0 && cn_ew_binary(in->op)) need += in->width;
  }
  if (p->n_insn > c->n_ew_steps) {
    ew_step *t = realloc(c->ew_steps, (size_t)p->n_insn * sizeof(ew_step));
    if (t == NULL) abort(); /* a compiled cell's instructions: a few */
    c->ew_steps = t;
    c->n_ew_steps = p->n_insn;
  }
  if (need > c->n_ew) {
    float *w = realloc(c->ew, (size_t)need * sizeof(float));
    if (w == NULL) abort(); /* sized by a compiled cell: a few KiB */
    c->ew = w;
    c->n_ew = need;
  }
  const float *zero = zeros(bk, (int)maxw);
  bool loop = p->edge_end > p->edge_begin && p->seg != NULL;
  /* c->ew stays NULL while no program needed scratch: no offset on it */
  float *tmp = c->ew, *kp = c->ew != NULL ? c->ew + tile * tw : NULL;
  ew_step *st = c->ew_steps;
  for (int i = 0; i < p->n_insn; i++) {
    const cn_ew_insn *in = &p->insn[i];
    ew_step *s = &st[i];
    s->op = in->op;
    s->width = in->width;
    s->serial = ew_shifted(&in->d, &in->a, in->width) ||
                (cn_ew_binary(in->op) &&
                 ew_shifted(&in->d, &in->b, in->width));
    s->flat = !s->serial;
    for (int q = 0; q < 3; q++) {
      ew_operand *o = &s->x[q];
      ew_resolve(p, slots, i, q, tmp, &kp, o);
      if (o->kind == EWK_OFF || o->edge || (q == 0 && o->kind == EWK_NONE))
        s->flat = false;
    }
  }
  ew_run u = {st, p->n_insn, loop ? p->edge_begin : 0,
              loop ? p->edge_end : 0, n, tile, zero, p->seg};
  ew_rows_run(&u);
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
