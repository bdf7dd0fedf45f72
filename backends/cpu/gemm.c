/* gemm.c - C = A·Wᵀ with every element computed one fixed way (gemm.h).
 *
 * Why not OpenBLAS: its sgemm picks a kernel by shape (SkylakeX's
 * small-matrix kernel below M·N 1200, tail kernels for the last M % 16
 * rows, a split of M between threads), and those kernels round the same
 * row's sums differently. So a row's answer depended on how many rows
 * shared its product, differently under each OPENBLAS_CORETYPE (issue 32).
 * Padding rows past one kernel's threshold fixed one kernel only. Here the
 * arithmetic of an element is a function of K alone:
 *
 *   16 running sums, lane l taking k ≡ l (mod 16) in ascending k by fused
 *   multiply-add (an AVX-512 register, two AVX2 registers, or 16 floats
 *   and fmaf); a zero-padded last chunk; one fixed pairwise tree
 *   (reduce_scalar) to one float; then beta·C and the bias.
 *
 * FMA rounds once, so all three code paths give the same bits, and none
 * depends on which rows, or how many, are computed beside the element:
 * blocks of 4 rows × 4 columns share loads, never sums. Rows and columns
 * missing from a block at the edge of C are computed from a copy of a
 * real row and thrown away.
 *
 * Speed: a 4×4 block loads 8 vectors for 16 FMAs, so the FMA units bound
 * it, not the loads; W is walked in panels that stay in L2 (PANEL_BYTES)
 * while every row of A passes over them; panels are split between threads
 * (OpenMP) when the product is large. docs/benchmarks.md has the figures
 * against OpenBLAS.
 *
 * Built without the backend's fast-math flags (backends/meson.build):
 * nothing here may be reassociated or contracted. */
#include "gemm.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CN_X86 1
#endif

/* W rows per panel: a panel of W stays in L2 while all of A passes. */
#define PANEL_BYTES (192 * 1024)
/* Multiply-adds below which a product stays on the calling thread: waking
 * a second thread and joining it costs more than it saves below ~16M (a
 * run of 64 trees at H=128 on 2 cores: 4.5k trees/s split, 6.1k not). */
#define PARALLEL_MIN ((int64_t)1 << 24)

typedef struct nt_args {
  int M, N, K;
  const float *A;
  int lda;
  const float *W;
  int ldw;
  const float *bias;
  float beta;
  float *C;
  int ldc;
} nt_args;

/* out[i][j] for a block: sums s (see gemm.h) of rows a[i], w[j]. */
typedef void (*block_fn)(const nt_args *p, const float *const *a, int mr,
                         const float *const *w, float out[4][4]);

/* The one epilogue: beta·C, then the bias. */
static void store(const nt_args *p, int i0, int mr, int j0, int nr,
                  float out[4][4]) {
  for (int i = 0; i < mr; i++) {
    float *c = p->C + (size_t)(i0 + i) * p->ldc + j0;
    for (int j = 0; j < nr; j++) {
      float t = out[i][j];
      if (p->beta != 0.0f) {
        float bc = p->beta * c[j];
        t = bc + t;
      }
      if (p->bias != NULL) t = t + p->bias[j0 + j];
      c[j] = t;
    }
  }
}

/* ---- the portable path: the definition the others must equal ---- */

static float reduce_scalar(const float v[16]) {
  float s8[8], s4[4], s2[2];
  for (int l = 0; l < 8; l++) s8[l] = v[l] + v[l + 8];
  for (int l = 0; l < 4; l++) s4[l] = s8[l] + s8[l + 4];
  for (int l = 0; l < 2; l++) s2[l] = s4[l] + s4[l + 2];
  return s2[0] + s2[1];
}

static void block_portable(const nt_args *p, const float *const *a, int mr,
                           const float *const *w, float out[4][4]) {
  int K = p->K;
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < 4; j++) {
      float acc[16] = {0};
      for (int k0 = 0; k0 < K; k0 += 16)
        for (int l = 0; l < 16; l++) {
          int k = k0 + l;
          float x = k < K ? a[i][k] : 0.0f, y = k < K ? w[j][k] : 0.0f;
          acc[l] = fmaf(x, y, acc[l]);
        }
      out[i][j] = reduce_scalar(acc);
    }
}

#ifdef CN_X86
/* ---- AVX2: a 16-lane sum is two registers, lanes 0-7 and 8-15 ---- */
#define CN_T_AVX2 __attribute__((target("avx2,fma")))

/* Four 8-lane vectors (s8 of gemm.h's tree) to their four sums. */
CN_T_AVX2 static inline void reduce8x4(__m256 a, __m256 b, __m256 c,
                                       __m256 d, float *o) {
  /* s4: lanes l and l+4 of each; [a | b] and [c | d] */
  __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                            _mm256_permute2f128_ps(a, b, 0x31));
  __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20),
                            _mm256_permute2f128_ps(c, d, 0x31));
  /* s2: lanes l and l+2 within each half */
  ab = _mm256_add_ps(ab, _mm256_permute_ps(ab, 0x4e));
  cd = _mm256_add_ps(cd, _mm256_permute_ps(cd, 0x4e));
  /* s: lanes 0 and 1 */
  ab = _mm256_add_ps(ab, _mm256_permute_ps(ab, 0xb1));
  cd = _mm256_add_ps(cd, _mm256_permute_ps(cd, 0xb1));
  float t[16];
  _mm256_storeu_ps(t, ab);
  _mm256_storeu_ps(t + 8, cd);
  o[0] = t[0];
  o[1] = t[4];
  o[2] = t[8];
  o[3] = t[12];
}

/* Loads 16 floats as two halves, zeros past n (n < 16 in the last chunk). */
CN_T_AVX2 static inline void load16_avx2(const float *x, int n, __m256 *lo,
                                         __m256 *hi) {
  if (n >= 16) {
    *lo = _mm256_loadu_ps(x);
    *hi = _mm256_loadu_ps(x + 8);
    return;
  }
  static const int32_t ramp[16] = {0, 1, 2,  3,  4,  5,  6,  7,
                                   8, 9, 10, 11, 12, 13, 14, 15};
  __m256i nn = _mm256_set1_epi32(n);
  __m256i m0 = _mm256_cmpgt_epi32(nn, _mm256_loadu_si256((const void *)ramp));
  __m256i m1 =
      _mm256_cmpgt_epi32(nn, _mm256_loadu_si256((const void *)(ramp + 8)));
  *lo = _mm256_maskload_ps(x, m0);
  *hi = _mm256_maskload_ps(x + 8, m1);
}

/* MR rows × 2 columns at a time: 2·MR·2 accumulators fit 16 registers
 * only for MR ≤ 2, so the 4 columns go in two passes. */
#define AVX2_BLOCK(MR)                                                        \
  CN_T_AVX2 static void block_avx2_##MR(const nt_args *p,                     \
                                        const float *const *a, int mr,        \
                                        const float *const *w,                \
                                        float out[4][4]) {                    \
    int K = p->K;                                                             \
    for (int jp = 0; jp < 4; jp += 2) {                                       \
      __m256 lo[MR][2], hi[MR][2];                                            \
      for (int i = 0; i < MR; i++)                 \
        for (int j = 0; j < 2; j++)                                           \
          lo[i][j] = hi[i][j] = _mm256_setzero_ps();                          \
      for (int k = 0; k < K; k += 16) {                                       \
        __m256 al[MR], ah[MR], wl[2], wh[2];                                  \
        for (int i = 0; i < MR; i++) load16_avx2(a[i] + k, K - k, &al[i], &ah[i]); \
        for (int j = 0; j < 2; j++)                                           \
          load16_avx2(w[jp + j] + k, K - k, &wl[j], &wh[j]);                  \
        for (int i = 0; i < MR; i++)                                          \
          for (int j = 0; j < 2; j++) {                                       \
            lo[i][j] = _mm256_fmadd_ps(al[i], wl[j], lo[i][j]);               \
            hi[i][j] = _mm256_fmadd_ps(ah[i], wh[j], hi[i][j]);               \
          }                                                                   \
      }                                                                       \
      for (int i = 0; i < MR; i++) {                                          \
        float o[4];                                                           \
        reduce8x4(_mm256_add_ps(lo[i][0], hi[i][0]),                          \
                  _mm256_add_ps(lo[i][1], hi[i][1]), _mm256_setzero_ps(),     \
                  _mm256_setzero_ps(), o);                                    \
        out[i][jp] = o[0];                                                    \
        out[i][jp + 1] = o[1];                                                \
      }                                                                       \
    }                                                                         \
    (void)mr;                                                                 \
  }
AVX2_BLOCK(1)
AVX2_BLOCK(2)

CN_T_AVX2 static void block_avx2(const nt_args *p, const float *const *a,
                                 int mr, const float *const *w,
                                 float out[4][4]) {
  if (mr == 1) {
    block_avx2_1(p, a, mr, w, out);
    return;
  }
  block_avx2_2(p, a, mr, w, out);
  if (mr > 2) {
    float o2[4][4];
    block_avx2_2(p, a + 2, mr - 2, w, o2);
    memcpy(out[2], o2[0], sizeof(o2[0]) * 2);
  }
}

/* ---- AVX-512: a 16-lane sum is one register ---- */
#define CN_T_AVX512 __attribute__((target("avx512f,avx2,fma")))

CN_T_AVX512 static inline __m256 half_sum(__m512 v) {
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return _mm256_add_ps(lo, hi);
}

#define AVX512_BLOCK(MR)                                                      \
  CN_T_AVX512 static void block_avx512_##MR(const nt_args *p,                 \
                                            const float *const *a, int mr,    \
                                            const float *const *w,            \
                                            float out[4][4]) {                \
    int K = p->K;                                                             \
    __m512 acc[MR][4];                                                        \
    for (int i = 0; i < MR; i++)                   \
      for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();            \
    int k = 0;                                                                \
    for (; k + 16 <= K; k += 16) {                                            \
      __m512 av[MR], wv[4];                                                   \
      for (int i = 0; i < MR; i++) av[i] = _mm512_loadu_ps(a[i] + k);         \
      for (int j = 0; j < 4; j++) wv[j] = _mm512_loadu_ps(w[j] + k);          \
      for (int i = 0; i < MR; i++)                 \
        for (int j = 0; j < 4; j++)                                           \
          acc[i][j] = _mm512_fmadd_ps(av[i], wv[j], acc[i][j]);               \
    }                                                                         \
    if (k < K) {                                                              \
      __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);                        \
      __m512 av[MR], wv[4];                                                   \
      for (int i = 0; i < MR; i++) av[i] = _mm512_maskz_loadu_ps(m, a[i] + k); \
      for (int j = 0; j < 4; j++) wv[j] = _mm512_maskz_loadu_ps(m, w[j] + k); \
      for (int i = 0; i < MR; i++)                 \
        for (int j = 0; j < 4; j++)                                           \
          acc[i][j] = _mm512_fmadd_ps(av[i], wv[j], acc[i][j]);               \
    }                                                                         \
    for (int i = 0; i < MR; i++)                   \
      reduce8x4(half_sum(acc[i][0]), half_sum(acc[i][1]),                     \
                half_sum(acc[i][2]), half_sum(acc[i][3]), out[i]);            \
    (void)mr;                                                                 \
  }
AVX512_BLOCK(1)
AVX512_BLOCK(2)
AVX512_BLOCK(4)

CN_T_AVX512 static void block_avx512(const nt_args *p, const float *const *a,
                                     int mr, const float *const *w,
                                     float out[4][4]) {
  if (mr == 1)
    block_avx512_1(p, a, mr, w, out);
  else if (mr == 2)
    block_avx512_2(p, a, mr, w, out);
  else
    block_avx512_4(p, a, mr, w, out);
}
#endif /* CN_X86 */

/* ---- the driver: panels of W, blocks of 4 × 4 ---- */

typedef struct gemm_path {
  const char *name;
  block_fn block;
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
    {"avx512", block_avx512, has_avx512},
    {"avx2", block_avx2, has_avx2},
#endif
    {"portable", block_portable, always},
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

/* Columns [j0, j1) of C, every row. */
static void panel(const nt_args *p, block_fn block, int j0, int j1) {
  for (int i0 = 0; i0 < p->M; i0 += 4) {
    int mr = p->M - i0 < 4 ? p->M - i0 : 4;
    const float *a[4];
    for (int i = 0; i < 4; i++)
      a[i] = p->A + (size_t)(i0 + (i < mr ? i : mr - 1)) * p->lda;
    for (int jb = j0; jb < j1; jb += 4) {
      int nr = j1 - jb < 4 ? j1 - jb : 4;
      const float *w[4];
      for (int j = 0; j < 4; j++)
        w[j] = p->W + (size_t)(jb + (j < nr ? j : nr - 1)) * p->ldw;
      float out[4][4];
      block(p, a, mr, w, out);
      store(p, i0, mr, jb, nr, out);
    }
  }
}

void cn__gemm_nt(int M, int N, int K, const float *A, int lda,
                 const float *W, int ldw, const float *bias, float beta,
                 float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  nt_args p = {M, N, K, A, lda, W, ldw, bias, beta, C, ldc};
  block_fn block = cur_path()->block;
  /* panel width: a multiple of 4 columns whose rows of W fill PANEL_BYTES */
  int64_t row_bytes = (int64_t)(K > 0 ? K : 1) * (int64_t)sizeof(float);
  int pw = (int)(PANEL_BYTES / row_bytes) & ~3;
  if (pw < 4) pw = 4;
  int n_panels = (N + pw - 1) / pw;
  int threads = n_threads;
  if ((int64_t)M * N * K < PARALLEL_MIN) threads = 1;
  if (threads > 1 && n_panels < threads) { /* narrower panels, to share */
    pw = ((N + threads - 1) / threads + 3) & ~3;
    n_panels = (N + pw - 1) / pw;
  }
#ifdef _OPENMP
  if (threads > 1 && n_panels > 1) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int q = 0; q < n_panels; q++) {
      int j0 = q * pw, j1 = j0 + pw < N ? j0 + pw : N;
      panel(&p, block, j0, j1);
    }
    return;
  }
#endif
  for (int q = 0; q < n_panels; q++) {
    int j0 = q * pw, j1 = j0 + pw < N ? j0 + pw : N;
    panel(&p, block, j0, j1);
  }
}
