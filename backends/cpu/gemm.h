/* gemm.h - the cpu backend's products, computed one fixed way.
 *
 * Every element of C = A·Wᵀ is computed by the same sequence of float
 * operations, whatever M is, wherever its row sits in A, whichever other
 * rows share the product, however many threads split it, and whichever of
 * the AVX-512, AVX2 or portable code paths the CPU runs (gemm.c says how).
 * An instance's answer therefore never depends on what it was batched
 * with, on any CPU and under any OPENBLAS_CORETYPE, which OpenBLAS cannot
 * promise: its kernels sum a row differently by product shape (small-matrix
 * kernels, M tails, thread splits). */
#ifndef CANOPY_CPU_GEMM_H
#define CANOPY_CPU_GEMM_H

/* C[M,N] = A[M,K]·W[N,K]ᵀ, then + beta·C (when beta != 0), then + bias[N]
 * (when bias != NULL), each row of A lda floats apart, of W ldw, of C ldc.
 * Element (i, j) is, exactly:
 *   s_l  = Σ over k ≡ l (mod 16), k ascending, by fused multiply-add
 *          (l = 0..15; the last chunk of 16 zero-padded)
 *   s    = ((s_0+s_8 + s_4+s_12) + (s_2+s_10 + s_6+s_14))
 *        + ((s_1+s_9 + s_5+s_13) + (s_3+s_11 + s_7+s_15)),
 *          pairwise as in gemm.c's reduce_scalar
 *   C    = (beta != 0 ? beta·C + s : s) (+ bias[j])
 * Large products are split over column panels between up to
 * cn__gemm_threads() threads; the split changes no element. */
void cn__gemm_nt(int M, int N, int K, const float *A, int lda,
                 const float *W, int ldw, const float *bias, float beta,
                 float *C, int ldc);

/* Threads one product may use (1: the calling thread only). */
void cn__gemm_set_threads(int n);
int cn__gemm_threads(void);

/* The code path in use: "avx512", "avx2" or "portable". For the tests:
 * cn__gemm_force(name) selects a path the CPU can run (0), or returns -1
 * when it cannot; NULL restores the best one. */
const char *cn__gemm_path(void);
int cn__gemm_force(const char *name);

#endif
