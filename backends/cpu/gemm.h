/* gemm.h - the cpu backend's products, computed one fixed way.
 *
 * Every element of C = A·Wᵀ is computed by the same sequence of float
 * operations, whatever M is, wherever its row sits in A, whichever other
 * rows share the product, however many threads split it, and whichever of
 * the AVX-512, AVX2 or portable code paths the CPU runs (gemm.c says how).
 * An instance's answer therefore never depends on what it was batched
 * with, on any CPU and under any OPENBLAS_CORETYPE, which OpenBLAS cannot
 * promise: its kernels sum a row differently by product shape (small-matrix
 * kernels, M tails, thread splits).
 *
 * The right operand is first packed (strips of CN_GEMM_NR columns, k-major)
 * so that the kernel reads it as vectors along N. A caller that multiplies
 * by the same matrix many times packs it once (cn__gemm_pack_nt or _nn)
 * and calls cn__gemm_packed; cn__gemm_nt packs per call. */
#ifndef CANOPY_CPU_GEMM_H
#define CANOPY_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

/* Columns per packed strip. */
#define CN_GEMM_NR 32

/* Element (i, j) of every product below is, exactly:
 *   s    = 0; for k = 0 .. K-1 ascending: s = fma(A[i,k], B[k,j], s)
 *          (one rounding per step; B = Wᵀ when packed from W)
 *   C    = (beta != 0 ? beta·C + s : s), then + bias[j] when bias != NULL
 * Large products are split over column strips between up to
 * cn__gemm_threads() threads; the split changes no element. */

/* C[M,N] = A[M,K]·W[N,K]ᵀ (+ beta·C) (+ bias[N]); rows of A lda floats
 * apart, of W ldw, of C ldc. Packs W per call. */
void cn__gemm_nt(int M, int N, int K, const float *A, int lda,
                 const float *W, int ldw, const float *bias, float beta,
                 float *C, int ldc);

/* Floats a packed N×K operand takes (64-byte aligned storage is fastest). */
size_t cn__gemm_packed_floats(int N, int K);
/* Packs W[N,K] (to multiply by Wᵀ) or B[K,N] (by B as it lies) into P. */
void cn__gemm_pack_nt(int N, int K, const float *W, int ldw, float *P);
void cn__gemm_pack_nn(int N, int K, const float *B, int ldb, float *P);
/* C[M,N] = A[M,K]·(the packed operand) (+ beta·C) (+ bias[N]). */
/* y[i·incy] = Σ_k A[i, k]·x[k] (+ beta·y[i·incy]) for i < M: the same
 * bits as cn__gemm_packed of the row x by A packed with cn__gemm_pack_nt,
 * without packing A. */
void cn__gemm_matvec(int M, int K, const float *A, int lda, const float *x,
                     float beta, float *y, int incy);
void cn__gemm_packed(int M, int N, int K, const float *A, int lda,
                     const float *P, const float *bias, float beta, float *C,
                     int ldc);

/* A product over a concatenation of row sets (Serenity §3.3's identity
 * rewriting; the indirection of XNNPACK's IGEMM): part q contributes K
 * columns whose row i lies at A + off[i] (off != NULL; a negative offset
 * reads zeros) or at A + i·lda (off == NULL), multiplied by its own packed
 * operand P (K rows, the product's N columns). */
#define CN_GEMM_MAX_PARTS 8
typedef struct cn__gemm_part {
  const float *A;
  const int64_t *off;
  int64_t lda;
  int K;
  const float *P;
} cn__gemm_part;

/* C[M,N] = Σ_q A_q·P_q (+ beta·C) (+ bias[N]), each element computed
 * exactly as cn__gemm_packed computes it over the parts' rows copied side
 * by side: one running sum over the parts' k in order. No copy is made.
 * zeros: at least max K floats of 0 when some off[i] < 0, else NULL. */
void cn__gemm_packed_parts(int M, int N, int n_parts,
                           const cn__gemm_part *parts, const float *zeros,
                           const float *bias, float beta, float *C, int ldc);

/* Threads one product may use (1: the calling thread only). */
void cn__gemm_set_threads(int n);
int cn__gemm_threads(void);

/* The code path in use: "avx512", "avx2" or "portable". For the tests:
 * cn__gemm_force(name) selects a path the CPU can run (0), or returns -1
 * when it cannot; NULL restores the best one. */
const char *cn__gemm_path(void);
int cn__gemm_force(const char *name);

#endif
