/* gemm.c - C = A·B with every element computed one fixed way (gemm.h).
 *
 * Why not OpenBLAS: its sgemm picks a kernel by shape (SkylakeX's
 * small-matrix kernel below M·N 1200, tail kernels for the last M % 16
 * rows, a split of M between threads), and those kernels round the same
 * row's sums differently. So a row's answer depended on how many rows
 * shared its product, differently under each OPENBLAS_CORETYPE.
 * Here the arithmetic of an element is a function of K alone: one running
 * sum, k ascending, one fused multiply-add per k (gemm.h), then beta·C and
 * the bias. FMA rounds once, so the AVX-512, AVX2 and portable paths give
 * the same bits, and no element depends on which rows, or how many, are
 * computed beside it: a block of rows shares loads of B, never sums.
 *
 * Layout: B is packed into strips of NR = 32 columns, k-major
 * (strip s holds B[k, 32s .. 32s+31] for k = 0 .. K-1, zero past N), so a
 * kernel step loads a row of the strip as vectors and broadcasts one
 * element of each of MR rows of A: MR × 32 running sums in registers
 * (AVX-512: 6 rows × 2 vectors, 12 FMAs per 2 loads and 6 broadcasts,
 * or two strips at once, 6 × 4 vectors, 24 FMAs per 4 loads and 6
 * broadcasts; AVX2: 2 rows × 4 vectors), no horizontal reduction. The earlier kernel
 * (16 lane sums per element, reduced by a tree) spent a third of its
 * instructions reducing at K = 128-256. Rows of A are taken in chunks that
 * stay in L2 while every strip passes over them; strips are split between
 * threads (OpenMP) when the product is large. docs/benchmarks.md has the
 * figures against OpenBLAS and the earlier kernel.
 *
 * Built without the backend's fast-math flags (backends/meson.build):
 * nothing here may be reassociated or contracted. */
#include "gemm.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CN_X86 1
#endif

#define NR CN_GEMM_NR
/* Rows of A per chunk: a chunk stays in L2 while every strip passes. */
#define A_CHUNK_BYTES (256 * 1024)
/* Multiply-adds below which a product stays on the calling thread: waking
 * a second thread and joining it costs more than it saves below ~16M (a
 * run of 64 trees at H=128 on 2 cores: 4.5k trees/s split, 6.1k not). */
#define PARALLEL_MIN ((int64_t)1 << 24)

typedef struct job {
  int M, N, K; /* K: the parts' together */
  int n_parts;
  cn__gemm_part part[CN_GEMM_MAX_PARTS];
  const float *zeros;
  const float *bias;
  float beta;
  float *C;
  int ldc;
} job;

/* Rows i0 .. i0+mr-1 of C, columns j0 .. j0+nr-1 (nr ≤ NR), from strip s
 * of every part's packed operand. */
typedef void (*block_fn)(const job *p, int i0, int mr, int j0, int nr,
                         int s);

/* Row i of part q, and strip s of its packed operand. */
static inline const float *row_of(const job *p, const cn__gemm_part *q,
                                  int i) {
  if (q->off == NULL) return q->A + (size_t)i * (size_t)q->lda;
  return q->off[i] < 0 ? p->zeros : q->A + q->off[i];
}

static inline const float *strip_of(const cn__gemm_part *q, int s) {
  return q->P + (size_t)s * (size_t)q->K * NR;
}

/* ---- the portable path: the definition the others must equal ---- */

static void store_row(const job *p, int i, int j0, int nr, const float *s) {
  float *c = p->C + (size_t)i * p->ldc + j0;
  for (int j = 0; j < nr; j++) {
    float t = s[j];
    if (p->beta != 0.0f) {
      float bc = p->beta * c[j];
      t = bc + t;
    }
    if (p->bias != NULL) t = t + p->bias[j0 + j];
    c[j] = t;
  }
}

static void block_portable(const job *p, int i0, int mr, int j0, int nr,
                           int st) {
  for (int i = 0; i < mr; i++) {
    float s[NR] = {0};
    for (int q = 0; q < p->n_parts; q++) {
      const float *a = row_of(p, &p->part[q], i0 + i);
      const float *P = strip_of(&p->part[q], st);
      for (int k = 0; k < p->part[q].K; k++) {
        const float *b = P + (size_t)k * NR;
        for (int j = 0; j < NR; j++) s[j] = fmaf(a[k], b[j], s[j]);
      }
    }
    store_row(p, i0 + i, j0, nr, s);
  }
}

#ifdef CN_X86
/* ---- AVX2: a row of a strip is four 8-float vectors ---- */
#define CN_T_AVX2 __attribute__((target("avx2,fma")))

/* Lanes j < n of 8 (n may be ≤ 0 or ≥ 8). */
CN_T_AVX2 static inline __m256i mask8(int n) {
  static const int32_t ramp[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n),
                            _mm256_loadu_si256((const void *)ramp));
}

/* store_row on nv ≤ 4 vectors of sums; inlined into each block, whose
 * nv is a constant. */
CN_T_AVX2 __attribute__((always_inline)) static inline void
store_avx2(const job *p, int i, int j0, int nr, const __m256 s[4], int nv) {
  float *c = p->C + (size_t)i * p->ldc + j0;
  for (int q = 0; q < nv; q++) {
    int n = nr - 8 * q;
    if (n <= 0) break;
    __m256i m = mask8(n);
    __m256 t = s[q];
    if (p->beta != 0.0f)
      t = _mm256_add_ps(
          _mm256_mul_ps(_mm256_set1_ps(p->beta), _mm256_maskload_ps(c + 8 * q, m)),
          t);
    if (p->bias != NULL)
      t = _mm256_add_ps(t, _mm256_maskload_ps(p->bias + j0 + 8 * q, m));
    _mm256_maskstore_ps(c + 8 * q, m, t);
  }
}

/* MR rows by the strip's first NV vectors (nr <= 8·NV: the columns past
 * them are past N, neither computed nor stored). Each stored element is
 * the same sum whatever NV, so the bits do not depend on it. */
#define AVX2_BLOCK(MR, NV)                                                   \
  CN_T_AVX2 static void block_avx2_##MR##_##NV(const job *p, int i0, int j0, \
                                               int nr, int st) {              \
    __m256 s[MR][4];                                                         \
    const float *a[MR];                                                      \
    for (int i = 0; i < MR; i++)                                             \
      for (int q = 0; q < 4; q++) s[i][q] = _mm256_setzero_ps();             \
    for (int pq = 0; pq < p->n_parts; pq++) {                                \
      const cn__gemm_part *pt = &p->part[pq];                                \
      const float *P = strip_of(pt, st);                                     \
      for (int i = 0; i < MR; i++) a[i] = row_of(p, pt, i0 + i);             \
      for (int k = 0; k < pt->K; k++) {                                      \
        const float *b = P + (size_t)k * NR;                                 \
        __m256 w[NV];                                                        \
        for (int q = 0; q < NV; q++) w[q] = _mm256_loadu_ps(b + 8 * q);      \
        for (int i = 0; i < MR; i++) {                                       \
          __m256 x = _mm256_broadcast_ss(a[i] + k);                          \
          for (int q = 0; q < NV; q++)                                       \
            s[i][q] = _mm256_fmadd_ps(x, w[q], s[i][q]);                     \
        }                                                                    \
      }                                                                      \
    }                                                                        \
    for (int i = 0; i < MR; i++) store_avx2(p, i0 + i, j0, nr, s[i], NV);    \
  }
#define AVX2_BLOCKS(MR)                                                      \
  AVX2_BLOCK(MR, 1) AVX2_BLOCK(MR, 2) AVX2_BLOCK(MR, 3) AVX2_BLOCK(MR, 4)
AVX2_BLOCKS(1)
AVX2_BLOCKS(2)

/* A block by the kernel for its rows and the vectors its columns need
 * (N = 40 at H = 8: the second strip is one vector of 8, not four). */
CN_T_AVX2 static void block_avx2(const job *p, int i0, int mr, int j0,
                                 int nr, int st) {
  switch ((mr == 2 ? 4 : 0) + (nr > 24 ? 3 : nr > 16 ? 2 : nr > 8 ? 1 : 0)) {
  case 0: block_avx2_1_1(p, i0, j0, nr, st); break;
  case 1: block_avx2_1_2(p, i0, j0, nr, st); break;
  case 2: block_avx2_1_3(p, i0, j0, nr, st); break;
  case 3: block_avx2_1_4(p, i0, j0, nr, st); break;
  case 4: block_avx2_2_1(p, i0, j0, nr, st); break;
  case 5: block_avx2_2_2(p, i0, j0, nr, st); break;
  case 6: block_avx2_2_3(p, i0, j0, nr, st); break;
  default: block_avx2_2_4(p, i0, j0, nr, st); break;
  }
}

/* ---- AVX-512: a row of a strip is two 16-float vectors ---- */
#define CN_T_AVX512 __attribute__((target("avx512f,avx2,fma")))

static inline __mmask16 mask16(int n) {
  return n >= 16 ? (__mmask16)0xffff
                 : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* Inlined into each block: a call per row and strip cost more than the
 * row's sums at H = 8. */
CN_T_AVX512 __attribute__((always_inline)) static inline void
store_avx512(const job *p, int i, int j0, int nr, __m512 s0, __m512 s1) {
  float *c = p->C + (size_t)i * p->ldc + j0;
  __mmask16 m0 = mask16(nr), m1 = mask16(nr - 16);
  if (p->beta != 0.0f) {
    __m512 b = _mm512_set1_ps(p->beta);
    s0 = _mm512_add_ps(_mm512_mul_ps(b, _mm512_maskz_loadu_ps(m0, c)), s0);
    s1 = _mm512_add_ps(_mm512_mul_ps(b, _mm512_maskz_loadu_ps(m1, c + 16)),
                       s1);
  }
  if (p->bias != NULL) {
    s0 = _mm512_add_ps(s0, _mm512_maskz_loadu_ps(m0, p->bias + j0));
    s1 = _mm512_add_ps(s1, _mm512_maskz_loadu_ps(m1, p->bias + j0 + 16));
  }
  _mm512_mask_storeu_ps(c, m0, s0);
  _mm512_mask_storeu_ps(c + 16, m1, s1);
}

#define AVX512_BLOCK_(NAME, MR, HALF)                                        \
  CN_T_AVX512 static void NAME##_##MR(const job *p, int i0, int j0,          \
                                            int nr, int st) {                 \
    __m512 s0[MR], s1[MR];                                                   \
    const float *a[MR];                                                      \
    for (int i = 0; i < MR; i++) s0[i] = s1[i] = _mm512_setzero_ps();        \
    for (int pq = 0; pq < p->n_parts; pq++) {                                \
      const cn__gemm_part *pt = &p->part[pq];                                \
      const float *P = strip_of(pt, st);                                     \
      for (int i = 0; i < MR; i++) a[i] = row_of(p, pt, i0 + i);             \
      for (int k = 0; k < pt->K; k++) {                                      \
        const float *b = P + (size_t)k * NR;                                 \
        __m512 w0 = _mm512_loadu_ps(b);                                      \
        __m512 w1 = HALF ? w0 : _mm512_loadu_ps(b + 16);                     \
        for (int i = 0; i < MR; i++) {                                       \
          __m512 x = _mm512_set1_ps(a[i][k]);                                \
          s0[i] = _mm512_fmadd_ps(x, w0, s0[i]);                             \
          if (!HALF) s1[i] = _mm512_fmadd_ps(x, w1, s1[i]);                  \
        }                                                                    \
      }                                                                      \
    }                                                                        \
    for (int i = 0; i < MR; i++)                                             \
      store_avx512(p, i0 + i, j0, nr, s0[i], s1[i]);                         \
  }
#define AVX512_BLOCK(MR) AVX512_BLOCK_(block_avx512, MR, 0) \
  AVX512_BLOCK_(blockh_avx512, MR, 1)
AVX512_BLOCK(1)
AVX512_BLOCK(2)
AVX512_BLOCK(3)
AVX512_BLOCK(4)
AVX512_BLOCK(5)
AVX512_BLOCK(6)
/* blockh_avx512_MR, block2h_avx512_MR: the same blocks where the last
 * strip's columns 16 .. 31 are past N (N = 40 at H = 8: 5·H), so their
 * sums are neither computed nor stored (mask 0); every stored element is
 * the same sum as in the full block. */

/* Two strips side by side (64 columns): 6 rows × 4 vectors of running
 * sums, one broadcast of A per 4 FMAs instead of 2. Each element's sum is
 * the same one (k ascending, one FMA a step), so the bits are those of
 * two single-strip blocks; it only loads A half as often. */
#define AVX512_BLOCK2_(NAME, MR, HALF)                                       \
  CN_T_AVX512 static void NAME##_##MR(const job *p, int i0, int j0,          \
                                             int nr, int st) {                \
    __m512 s0[MR], s1[MR], s2[MR], s3[MR];                                   \
    const float *a[MR];                                                      \
    for (int i = 0; i < MR; i++)                                             \
      s0[i] = s1[i] = s2[i] = s3[i] = _mm512_setzero_ps();                   \
    for (int pq = 0; pq < p->n_parts; pq++) {                                \
      const cn__gemm_part *pt = &p->part[pq];                                \
      const float *P = strip_of(pt, st), *Q = strip_of(pt, st + 1);          \
      for (int i = 0; i < MR; i++) a[i] = row_of(p, pt, i0 + i);             \
      for (int k = 0; k < pt->K; k++) {                                      \
        const float *b = P + (size_t)k * NR, *c = Q + (size_t)k * NR;        \
        __m512 w0 = _mm512_loadu_ps(b), w1 = _mm512_loadu_ps(b + 16);        \
        __m512 w2 = _mm512_loadu_ps(c);                                      \
        __m512 w3 = HALF ? w2 : _mm512_loadu_ps(c + 16);                     \
        for (int i = 0; i < MR; i++) {                                       \
          __m512 x = _mm512_set1_ps(a[i][k]);                                \
          s0[i] = _mm512_fmadd_ps(x, w0, s0[i]);                             \
          s1[i] = _mm512_fmadd_ps(x, w1, s1[i]);                             \
          s2[i] = _mm512_fmadd_ps(x, w2, s2[i]);                             \
          if (!HALF) s3[i] = _mm512_fmadd_ps(x, w3, s3[i]);                  \
        }                                                                    \
      }                                                                      \
    }                                                                        \
    for (int i = 0; i < MR; i++) {                                           \
      store_avx512(p, i0 + i, j0, NR, s0[i], s1[i]);                         \
      store_avx512(p, i0 + i, j0 + NR, nr - NR, s2[i], s3[i]);               \
    }                                                                        \
  }
#define AVX512_BLOCK2(MR) AVX512_BLOCK2_(block2_avx512, MR, 0) \
  AVX512_BLOCK2_(block2h_avx512, MR, 1)
AVX512_BLOCK2(1)
AVX512_BLOCK2(2)
AVX512_BLOCK2(3)
AVX512_BLOCK2(4)
AVX512_BLOCK2(5)
AVX512_BLOCK2(6)

/* A block of mr ≤ 6 rows by the kernel unrolled for that many: NAME_mr,
 * or HNAME_mr where the last strip's columns past 16 are not wanted
 * (last > 0: the columns the block's last strip stores). */
#define AVX512_BY_ROWS(NAME, HNAME, LAST)                                    \
  CN_T_AVX512 static void NAME(const job *p, int i0, int mr, int j0, int nr, \
                               int st) {                                     \
    if ((LAST) <= 16) {                                                      \
      switch (mr) {                                                          \
      case 6: HNAME##_6(p, i0, j0, nr, st); return;                          \
      case 5: HNAME##_5(p, i0, j0, nr, st); return;                          \
      case 4: HNAME##_4(p, i0, j0, nr, st); return;                          \
      case 3: HNAME##_3(p, i0, j0, nr, st); return;                          \
      case 2: HNAME##_2(p, i0, j0, nr, st); return;                          \
      default: HNAME##_1(p, i0, j0, nr, st); return;                         \
      }                                                                      \
    }                                                                        \
    switch (mr) {                                                            \
    case 6: NAME##_6(p, i0, j0, nr, st); break;                              \
    case 5: NAME##_5(p, i0, j0, nr, st); break;                              \
    case 4: NAME##_4(p, i0, j0, nr, st); break;                              \
    case 3: NAME##_3(p, i0, j0, nr, st); break;                              \
    case 2: NAME##_2(p, i0, j0, nr, st); break;                              \
    default: NAME##_1(p, i0, j0, nr, st); break;                             \
    }                                                                        \
  }
/* strip st (nr ≤ NR columns) */
AVX512_BY_ROWS(block_avx512, blockh_avx512, nr)
/* strips st and st + 1 (nr: the columns of both, > NR) */
AVX512_BY_ROWS(block2_avx512, block2h_avx512, nr - NR)
#endif /* CN_X86 */

/* ---- paths ---- */

typedef struct gemm_path {
  const char *name;
  block_fn block;
  block_fn block2; /* two strips at once, or NULL */
  int mr; /* rows a block takes at most */
  int (*supported)(void);
} gemm_path;

static int always(void) { return 1; }
#ifdef CN_X86
static int has_avx2(void) {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
static int has_avx512(void) {
  return has_avx2() && __builtin_cpu_supports("avx512f");
}
#endif

static const gemm_path paths[] = {
#ifdef CN_X86
    {"avx512", block_avx512, block2_avx512, 6, has_avx512},
    {"avx2", block_avx2, NULL, 2, has_avx2},
#endif
    {"portable", block_portable, NULL, 4, always},
};
enum { N_PATHS = sizeof(paths) / sizeof(paths[0]) };

static const gemm_path *forced;
static int n_threads = 1;

static const gemm_path *best_path(void) {
  static const gemm_path *best;
  if (best == NULL) {
    const gemm_path *b = &paths[N_PATHS - 1];
    for (int i = 0; i < N_PATHS; i++)
      if (paths[i].supported()) {
        b = &paths[i];
        break;
      }
    best = b; /* the same answer from any thread: a benign race */
  }
  return best;
}

static const gemm_path *cur_path(void) {
  return forced != NULL ? forced : best_path();
}

const char *cn__gemm_path(void) { return cur_path()->name; }

int cn__gemm_force(const char *name) {
  if (name == NULL) {
    forced = NULL;
    return 0;
  }
  for (int i = 0; i < N_PATHS; i++)
    if (strcmp(paths[i].name, name) == 0 && paths[i].supported()) {
      forced = &paths[i];
      return 0;
    }
  return -1;
}

void cn__gemm_set_threads(int n) { n_threads = n < 1 ? 1 : n; }
int cn__gemm_threads(void) { return n_threads; }

/* ---- packing ---- */

static int n_strips(int N) { return (N + NR - 1) / NR; }

size_t cn__gemm_packed_floats(int N, int K) {
  return (size_t)n_strips(N > 0 ? N : 0) * NR * (size_t)(K > 0 ? K : 0);
}

/* A transpose: k taken 64 at a time, so the 64 rows of the strip being
 * written (8 KiB) stay in L1 while its 32 columns are filled. */
void cn__gemm_pack_nt(int N, int K, const float *W, int ldw, float *P) {
  for (int s = 0; s < n_strips(N); s++) {
    float *d = P + (size_t)s * K * NR;
    for (int k0 = 0; k0 < K; k0 += 64) {
      int k1 = K - k0 < 64 ? K : k0 + 64;
      for (int j = 0; j < NR; j++) {
        int col = s * NR + j;
        const float *w = W + (size_t)col * ldw;
        for (int k = k0; k < k1; k++)
          d[(size_t)k * NR + j] = col < N ? w[k] : 0.0f;
      }
    }
  }
}

void cn__gemm_pack_nn(int N, int K, const float *B, int ldb, float *P) {
  for (int s = 0; s < n_strips(N); s++) {
    float *d = P + (size_t)s * K * NR;
    int j0 = s * NR, nr = N - j0 < NR ? N - j0 : NR;
    for (int k = 0; k < K; k++) {
      memcpy(d + (size_t)k * NR, B + (size_t)k * ldb + j0,
             (size_t)nr * sizeof(float));
      memset(d + (size_t)k * NR + nr, 0, (size_t)(NR - nr) * sizeof(float));
    }
  }
}

/* ---- a matrix times a vector, unpacked ---- */

/* Rows i0 .. i0+7 of y = A·x (+ beta·y), each the arithmetic of
 * block_portable's element: one running sum from zero, k ascending, one
 * fused multiply-add per k (fmaf(a, b, s) is fmaf(b, a, s): the product is
 * exact before its one rounding), then store_row's beta·y + sum. Eight
 * rows at a time so that eight independent chains keep the FMA units
 * busy. */
#define MATVEC_BODY                                                         \
  int i = 0;                                                                \
  for (; i + 8 <= M; i += 8) {                                              \
    const float *a0 = A + (size_t)i * lda;                                  \
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;   \
    for (int k = 0; k < K; k++) {                                           \
      float xk = x[k];                                                      \
      s0 = fmaf(a0[k], xk, s0);                                             \
      s1 = fmaf(a0[(size_t)lda + k], xk, s1);                               \
      s2 = fmaf(a0[2 * (size_t)lda + k], xk, s2);                           \
      s3 = fmaf(a0[3 * (size_t)lda + k], xk, s3);                           \
      s4 = fmaf(a0[4 * (size_t)lda + k], xk, s4);                           \
      s5 = fmaf(a0[5 * (size_t)lda + k], xk, s5);                           \
      s6 = fmaf(a0[6 * (size_t)lda + k], xk, s6);                           \
      s7 = fmaf(a0[7 * (size_t)lda + k], xk, s7);                           \
    }                                                                       \
    float sv[8] = {s0, s1, s2, s3, s4, s5, s6, s7};                         \
    for (int r = 0; r < 8; r++) {                                           \
      float t = sv[r], *c = y + (size_t)(i + r) * incy;                     \
      if (beta != 0.0f) {                                                   \
        float bc = beta * *c;                                               \
        t = bc + t;                                                         \
      }                                                                     \
      *c = t;                                                               \
    }                                                                       \
  }                                                                         \
  for (; i < M; i++) {                                                      \
    const float *a = A + (size_t)i * lda;                                   \
    float t = 0, *c = y + (size_t)i * incy;                                 \
    for (int k = 0; k < K; k++) t = fmaf(a[k], x[k], t);                    \
    if (beta != 0.0f) {                                                     \
      float bc = beta * *c;                                                 \
      t = bc + t;                                                           \
    }                                                                       \
    *c = t;                                                                 \
  }

static void matvec_portable(int M, int K, const float *A, int lda,
                            const float *x, float beta, float *y, int incy) {
  MATVEC_BODY
}

#ifdef CN_X86
__attribute__((target("avx2,fma"))) static void matvec_fma(
    int M, int K, const float *A, int lda, const float *x, float beta,
    float *y, int incy) {
  MATVEC_BODY
}
#endif

/* Why: a matrix used once (a vertex's own matrix times a vector) costs
 * more to pack than to multiply; read in place, each element still gets
 * the packed kernels' arithmetic, so the bits are theirs. */
void cn__gemm_matvec(int M, int K, const float *A, int lda, const float *x,
                     float beta, float *y, int incy) {
#ifdef CN_X86
  if (cur_path() != &paths[N_PATHS - 1]) {
    matvec_fma(M, K, A, lda, x, beta, y, incy);
    return;
  }
#endif
  matvec_portable(M, K, A, lda, x, beta, y, incy);
}

/* ---- the driver: chunks of rows × strips × blocks of MR rows ---- */

static void strips(const job *p, const gemm_path *g, int s0, int s1) {
  int64_t row_bytes = (int64_t)(p->K > 0 ? p->K : 1) * (int64_t)sizeof(float);
  int chunk = (int)(A_CHUNK_BYTES / row_bytes) / g->mr * g->mr;
  if (chunk < g->mr) chunk = g->mr;
  for (int r0 = 0; r0 < p->M; r0 += chunk) {
    int r1 = p->M - r0 < chunk ? p->M : r0 + chunk;
    for (int s = s0, w; s < s1; s += w) { /* w strips at a time */
      bool two = g->block2 != NULL && s + 1 < s1;
      block_fn block = two ? g->block2 : g->block;
      w = two ? 2 : 1;
      int j0 = s * NR, nr = p->N - j0 < w * NR ? p->N - j0 : w * NR;
      for (int i = r0; i < r1; i += g->mr)
        block(p, i, r1 - i < g->mr ? r1 - i : g->mr, j0, nr, s);
    }
  }
}

/* ---- the team: helper threads of one calling thread ----
 *
 * A thread that makes a large product (a daemon worker, a `canopy run`
 * job) gets helpers the first time, kept until it exits; between products
 * they sleep on a condition variable. OpenMP is not used: its
 * threads spin between parallel regions unless OMP_WAIT_POLICY=passive is
 * in the environment before the process starts (libgomp reads it in its
 * constructor; nothing in the program can change it). Products come every
 * few tens of µs, so a spinning helper held its core all the time: with
 * cores to spare beside the workers (`serve --workers 1` on 2 cores) it
 * took that core from the loop thread, for 10-17% fewer answers a second
 * and twice the p99 (docs/benchmarks.md). Strip s0..s1 of the
 * product goes to member t of nt: the same split as before, and each
 * element is computed by one thread, so the bits do not depend on it. */
#define MAX_HELPERS 63
/* Before sleeping, a helper waits this many pauses (about 20-40 µs) for
 * the next product, and the caller as long for its helpers: a run's
 * products come back to back, a few µs of elementwise work apart, and a
 * wake-up through the kernel costs 5-30 µs each time. Long enough to
 * bridge a run's products, short enough that between runs the core goes
 * back to whoever needs it. */
#define SPIN_PAUSES 2048

static inline void cpu_pause(void) {
#ifdef CN_X86
  _mm_pause();
#endif
}

typedef struct team {
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  _Atomic unsigned long gen; /* bumped for each product handed out */
  _Atomic int busy;          /* helpers still computing the current one */
  _Atomic bool quit;
  pid_t pid;         /* the process its helpers run in */
  int n;             /* helpers started */
  pthread_t tid[MAX_HELPERS];
  /* the current product: members 1 .. nt-1 are helpers */
  const job *p;
  const gemm_path *g;
  int ns, nt;
} team;

typedef struct helper_arg {
  team *t;
  int index;         /* 1 .. */
  unsigned long gen; /* the team's gen when it was started: products
                        handed out later are its to join */
} helper_arg;

static void strips_of_member(const job *p, const gemm_path *g, int ns,
                             int t, int nt) {
  strips(p, g, (int)((int64_t)ns * t / nt), (int)((int64_t)ns * (t + 1) / nt));
}

static void *helper_main(void *arg) {
  helper_arg a = *(helper_arg *)arg;
  free(arg);
  team *t = a.t;
  unsigned long seen = a.gen;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    if (t->gen == seen && !t->quit) { /* spin a while, then sleep */
      pthread_mutex_unlock(&t->mu);
      for (int i = 0; i < SPIN_PAUSES && atomic_load(&t->gen) == seen &&
                      !atomic_load(&t->quit);
           i++)
        cpu_pause();
      pthread_mutex_lock(&t->mu);
    }
    while (t->gen == seen && !t->quit) pthread_cond_wait(&t->go, &t->mu);
    if (t->quit) break;
    seen = t->gen;
    if (a.index >= t->nt) continue; /* not needed for this product */
    const job *p = t->p;
    const gemm_path *g = t->g;
    int ns = t->ns, nt = t->nt;
    pthread_mutex_unlock(&t->mu);
    strips_of_member(p, g, ns, a.index, nt);
    pthread_mutex_lock(&t->mu);
    if (--t->busy == 0) pthread_cond_signal(&t->done);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

static void team_free(void *arg) {
  team *t = arg;
  pthread_mutex_lock(&t->mu);
  t->quit = true;
  pthread_cond_broadcast(&t->go);
  pthread_mutex_unlock(&t->mu);
  for (int i = 0; i < t->n; i++) pthread_join(t->tid[i], NULL);
  pthread_cond_destroy(&t->go);
  pthread_cond_destroy(&t->done);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

static pthread_key_t team_key;
static int team_key_ok = -1; /* -1: not tried; 0: no key; 1: made */
static pthread_once_t team_once = PTHREAD_ONCE_INIT;

static void team_key_make(void) {
  team_key_ok = pthread_key_create(&team_key, team_free) == 0;
}

/* This thread's team with at least `helpers` helpers started, or NULL
 * (no memory, no threads: the caller computes alone). The team's helpers
 * are joined when this thread exits. */
static team *my_team(int helpers) {
  pthread_once(&team_once, team_key_make);
  if (team_key_ok != 1) return NULL;
  team *t = pthread_getspecific(team_key);
  /* A child of fork() inherits the pointer, not the helpers: it starts
   * a team of its own (the parent's stays the parent's; its memory is
   * the child's to lose). Without this a product would wait forever. */
  if (t != NULL && t->pid != getpid()) t = NULL;
  if (t == NULL) {
    t = calloc(1, sizeof(*t));
    if (t == NULL) return NULL;
    t->pid = getpid();
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    if (pthread_setspecific(team_key, t) != 0) {
      team_free(t);
      return NULL;
    }
  }
  if (helpers > MAX_HELPERS) helpers = MAX_HELPERS;
  while (t->n < helpers) {
    helper_arg *a = malloc(sizeof(*a));
    if (a == NULL) break;
    a->t = t;
    a->index = t->n + 1;
    a->gen = t->gen; /* only this thread changes gen */
    if (pthread_create(&t->tid[t->n], NULL, helper_main, a) != 0) {
      free(a);
      break;
    }
    t->n++;
  }
  return t->n > 0 ? t : NULL;
}

/* Splits the strips between threads when the product is large. */
static void run_job(const job *p) {
  const gemm_path *g = cur_path();
  int ns = n_strips(p->N);
  int threads = n_threads;
  if ((int64_t)p->M * p->N * p->K < PARALLEL_MIN || ns < 2) threads = 1;
  if (threads > ns) threads = ns;
  team *t = threads > 1 ? my_team(threads - 1) : NULL;
  if (t == NULL) {
    strips(p, g, 0, ns);
    return;
  }
  if (threads > t->n + 1) threads = t->n + 1;
  pthread_mutex_lock(&t->mu);
  t->p = p, t->g = g, t->ns = ns, t->nt = threads;
  t->busy = threads - 1;
  t->gen++;
  pthread_cond_broadcast(&t->go);
  pthread_mutex_unlock(&t->mu);
  strips_of_member(p, g, ns, 0, threads);
  for (int i = 0; i < SPIN_PAUSES && atomic_load(&t->busy) > 0; i++)
    cpu_pause();
  pthread_mutex_lock(&t->mu);
  while (t->busy > 0) pthread_cond_wait(&t->done, &t->mu);
  pthread_mutex_unlock(&t->mu);
}

void cn__gemm_packed_parts(int M, int N, int n_parts,
                           const cn__gemm_part *parts, const float *zeros,
                           const float *bias, float beta, float *C,
                           int ldc) {
  if (M <= 0 || N <= 0 || n_parts < 1 || n_parts > CN_GEMM_MAX_PARTS) return;
  job p = {.M = M, .N = N, .n_parts = n_parts, .zeros = zeros,
           .bias = bias, .beta = beta, .C = C, .ldc = ldc};
  for (int q = 0; q < n_parts; q++) {
    p.part[q] = parts[q];
    if (p.part[q].K < 0) p.part[q].K = 0;
    p.K += p.part[q].K;
  }
  run_job(&p);
}

void cn__gemm_packed(int M, int N, int K, const float *A, int lda,
                     const float *P, const float *bias, float beta, float *C,
                     int ldc) {
  cn__gemm_part one = {A, NULL, lda, K, P};
  cn__gemm_packed_parts(M, N, 1, &one, NULL, bias, beta, C, ldc);
}

/* A packed copy for one call; a caller that multiplies by the same matrix
 * again keeps its own (cn__gemm_pack_*). */
static float *pack_buffer(int N, int K) {
  size_t bytes = cn__gemm_packed_floats(N, K) * sizeof(float);
  bytes = (bytes + 63) / 64 * 64;
  float *P = aligned_alloc(64, bytes ? bytes : 64);
  if (P == NULL) {
    fprintf(stderr, "canopy: gemm: no memory for a %d×%d operand\n", N, K);
    abort(); /* a model's matrix or a child's state: small */
  }
  return P;
}

void cn__gemm_nt(int M, int N, int K, const float *A, int lda,
                 const float *W, int ldw, const float *bias, float beta,
                 float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  float *P = pack_buffer(N, K);
  cn__gemm_pack_nt(N, K, W, ldw, P);
  cn__gemm_packed(M, N, K, A, lda, P, bias, beta, C, ldc);
  free(P);
}
