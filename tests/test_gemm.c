/* test_gemm.c - backends/cpu/gemm.c: every element of A·Wᵀ is
 * computed one fixed way.
 *
 * - Against a naive double-precision product: right to float rounding.
 * - Every code path this CPU can run (avx512, avx2, portable) gives the
 *   bits of the portable path, which is gemm.h's definition written out.
 * - A row's bits do not depend on M, on its position, on the other rows
 *   of the product, on N (its columns computed in other blocks or panels),
 *   on the threads splitting the product, nor on beta/bias being applied.
 * - A product over parts read where they lie (cn__gemm_packed_parts: rows
 *   by offset, negative offsets as zeros, strided matrices) has the bits
 *   of the same product over the parts copied side by side.
 * Shapes cover every tail: M, N and K from 1 past several blocks, K not a
 * multiple of 16, strided operands. Each test prints the paths it ran.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu/gemm.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uni(void) { /* U(-1, 1), with a spread of magnitudes */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  float u = (float)(rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
  return (rng & 7) == 0 ? u * 37.0f : u;
}

static float *rnd(size_t n) {
  float *p = malloc(n * sizeof(float) + 1);
  cr_assert_not_null(p);
  for (size_t i = 0; i < n; i++) p[i] = uni();
  return p;
}

static const char *all_paths[] = {"avx512", "avx2", "portable"};

/* The paths this CPU runs, as a printed list; count in *n. */
static int runnable(const char **out) {
  int n = 0;
  for (size_t i = 0; i < sizeof(all_paths) / sizeof(all_paths[0]); i++)
    if (cn__gemm_force(all_paths[i]) == 0) out[n++] = all_paths[i];
  cn__gemm_force(NULL);
  return n;
}

static void print_paths(const char *test) {
  const char *p[3];
  int n = runnable(p);
  printf("%s: gemm paths run:", test);
  for (int i = 0; i < n; i++) printf(" %s", p[i]);
  printf(" (best: %s)\n", cn__gemm_path());
}

Test(gemm, equals_a_double_product) {
  print_paths("equals_a_double_product");
  int shapes[][3] = {{1, 1, 1},   {3, 5, 7},   {4, 4, 16},  {5, 9, 17},
                     {13, 31, 33}, {64, 40, 128}, {7, 300, 250}, {2, 3, 1000}};
  for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
    int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
    int lda = K + 3, ldw = K + 1, ldc = N + 2;
    float *A = rnd((size_t)M * lda), *W = rnd((size_t)N * ldw);
    float *b = rnd((size_t)N), *C = rnd((size_t)M * ldc);
    float *C0 = malloc((size_t)M * ldc * sizeof(float));
    memcpy(C0, C, (size_t)M * ldc * sizeof(float));
    cn__gemm_nt(M, N, K, A, lda, W, ldw, b, 0.5f, C, ldc);
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double want = 0.5 * C0[(size_t)i * ldc + j] + b[j], mag = fabs(want);
        for (int k = 0; k < K; k++) {
          double t = (double)A[(size_t)i * lda + k] * W[(size_t)j * ldw + k];
          want += t;
          mag += fabs(t);
        }
        double got = C[(size_t)i * ldc + j];
        cr_assert_leq(fabs(got - want), 1e-6 * mag + 1e-30,
                      "M %d N %d K %d: C[%d,%d] = %.9g, want %.9g", M, N, K,
                      i, j, got, want);
      }
    free(A), free(W), free(b), free(C), free(C0);
  }
}

/* C = A·Wᵀ (+ beta·C + bias) under a given path and thread count. */
static float *product(const char *path, int threads, int M, int N, int K,
                      const float *A, int lda, const float *W, int ldw,
                      const float *bias, float beta, const float *C0) {
  float *C = malloc((size_t)M * N * sizeof(float) + 1);
  cr_assert_not_null(C);
  if (C0 != NULL) memcpy(C, C0, (size_t)M * N * sizeof(float));
  cr_assert_eq(cn__gemm_force(path), 0, "path %s", path);
  int old = cn__gemm_threads();
  cn__gemm_set_threads(threads);
  cn__gemm_nt(M, N, K, A, lda, W, ldw, bias, beta, C, N);
  cn__gemm_set_threads(old);
  cn__gemm_force(NULL);
  return C;
}

Test(gemm, every_path_gives_the_portable_bits) {
  print_paths("every_path_gives_the_portable_bits");
  const char *paths[3];
  int np = runnable(paths);
  /* N of 1 .. 11, and of 1 .. 64: every count of columns a strip's last
   * vectors can hold (a kernel may compute only the vectors they need) */
  for (int K = 1; K <= 70; K += (K < 20 ? 1 : 7))
    for (int M = 1; M <= 9; M += 2)
      for (int nn = 0; nn < 2; nn++) {
        int N = nn == 0 ? 1 + (K * 7 + M) % 11 : 1 + (K * 13 + M * 3) % 64;
        float *A = rnd((size_t)M * K), *W = rnd((size_t)N * K);
        float *b = rnd((size_t)N), *C0 = rnd((size_t)M * N);
        for (int v = 0; v < 2; v++) {
          float *ref = product("portable", 1, M, N, K, A, K, W, K,
                               v ? b : NULL, v ? 0.75f : 0.0f, C0);
          for (int p = 0; p < np; p++) {
            float *got = product(paths[p], 1, M, N, K, A, K, W, K,
                                 v ? b : NULL, v ? 0.75f : 0.0f, C0);
            cr_assert_eq(memcmp(got, ref, (size_t)M * N * sizeof(float)), 0,
                         "path %s differs from portable at M %d N %d K %d",
                         paths[p], M, N, K);
            free(got);
          }
          free(ref);
        }
        free(A), free(W), free(b), free(C0);
      }
}

/* Every row of an M-row product, for M = 1..70, equals that row computed
 * alone; and reversing the rows permutes the results exactly. */
Test(gemm, a_row_never_depends_on_its_batch) {
  print_paths("a_row_never_depends_on_its_batch");
  const char *paths[3];
  int np = runnable(paths);
  int nk[][2] = {{40, 24}, {160, 64}, {513, 129}};
  for (int p = 0; p < np; p++)
    for (size_t s = 0; s < sizeof(nk) / sizeof(nk[0]); s++) {
      int N = nk[s][0], K = nk[s][1], Mmax = 70;
      float *A = rnd((size_t)Mmax * K), *W = rnd((size_t)N * K);
      float *b = rnd((size_t)N);
      float *alone = malloc((size_t)Mmax * N * sizeof(float));
      for (int i = 0; i < Mmax; i++) {
        float *r = product(paths[p], 1, 1, N, K, A + (size_t)i * K, K, W, K,
                           b, 0.0f, NULL);
        memcpy(alone + (size_t)i * N, r, (size_t)N * sizeof(float));
        free(r);
      }
      for (int M = 1; M <= Mmax; M += (M < 10 ? 1 : 9)) {
        int off = (Mmax - M) / 2; /* a window of rows from the middle */
        float *C = product(paths[p], 1, M, N, K, A + (size_t)off * K, K, W,
                           K, b, 0.0f, NULL);
        for (int i = 0; i < M; i++)
          cr_assert_eq(memcmp(C + (size_t)i * N, alone + (size_t)(off + i) * N,
                              (size_t)N * sizeof(float)), 0,
                       "%s: row %d of an M = %d product (N %d K %d) differs "
                       "from the row alone", paths[p], i, M, N, K);
        free(C);
      }
      /* the same rows in reverse order, two threads */
      float *R = malloc((size_t)Mmax * K * sizeof(float));
      for (int i = 0; i < Mmax; i++)
        memcpy(R + (size_t)i * K, A + (size_t)(Mmax - 1 - i) * K,
               (size_t)K * sizeof(float));
      float *C = product(paths[p], 2, Mmax, N, K, R, K, W, K, b, 0.0f, NULL);
      for (int i = 0; i < Mmax; i++)
        cr_assert_eq(memcmp(C + (size_t)i * N,
                            alone + (size_t)(Mmax - 1 - i) * N,
                            (size_t)N * sizeof(float)), 0,
                     "%s: reversed row %d differs (N %d K %d, 2 threads)",
                     paths[p], i, N, K);
      free(C), free(R), free(A), free(W), free(b), free(alone);
    }
}

/* A large product split between 1, 2 and 3 threads (panels of columns),
 * and a column computed in a product of other width. */
Test(gemm, threads_and_width_change_nothing) {
  print_paths("threads_and_width_change_nothing");
  int M = 96, N = 1030, K = 300;
  float *A = rnd((size_t)M * K), *W = rnd((size_t)N * K);
  float *one = product(cn__gemm_path(), 1, M, N, K, A, K, W, K, NULL, 0.0f,
                       NULL);
  for (int t = 2; t <= 3; t++) {
    float *C = product(cn__gemm_path(), t, M, N, K, A, K, W, K, NULL, 0.0f,
                       NULL);
    cr_assert_eq(memcmp(C, one, (size_t)M * N * sizeof(float)), 0,
                 "%d threads differ from 1", t);
    free(C);
  }
  /* columns 517.. alone: W's rows from 517 on, a narrower product */
  int j0 = 517, n = 13;
  float *C = product(cn__gemm_path(), 1, M, n, K, A, K, W + (size_t)j0 * K,
                     K, NULL, 0.0f, NULL);
  for (int i = 0; i < M; i++)
    cr_assert_eq(memcmp(C + (size_t)i * n, one + (size_t)i * N + j0,
                        (size_t)n * sizeof(float)), 0,
                 "row %d: columns %d.. differ in a product %d wide", i, j0,
                 n);
  free(C), free(one), free(A), free(W);
}

/* gemm.c's team: threads that each split their products between their
 * own helpers at once (a daemon's workers), then exit, their helpers
 * joined (ASan's leak check sees a team left behind), twice over; every
 * product has the bits of the product on one thread. */
typedef struct team_case {
  int M, N, K;
  const float *A, *W, *ref;
  int bad;
} team_case;

static void *team_thread(void *arg) {
  team_case *c = arg;
  for (int r = 0; r < 3; r++) {
    float *C = malloc((size_t)c->M * c->N * sizeof(float));
    cn__gemm_nt(c->M, c->N, c->K, c->A, c->K, c->W, c->K, NULL, 0.0f, C,
                c->N);
    if (memcmp(C, c->ref, (size_t)c->M * c->N * sizeof(float)) != 0)
      c->bad++;
    free(C);
  }
  return NULL;
}

Test(gemm, threads_of_their_own_side_by_side) {
  int M = 96, N = 1030, K = 300; /* 30M multiply-adds: split */
  float *A = rnd((size_t)M * K), *W = rnd((size_t)N * K);
  float *ref = product(cn__gemm_path(), 1, M, N, K, A, K, W, K, NULL, 0.0f,
                       NULL);
  int old = cn__gemm_threads();
  cn__gemm_set_threads(3);
  for (int round = 0; round < 2; round++) {
    pthread_t t[3];
    team_case c[3];
    for (int i = 0; i < 3; i++) {
      c[i] = (team_case){M, N, K, A, W, ref, 0};
      cr_assert_eq(pthread_create(&t[i], NULL, team_thread, &c[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
      pthread_join(t[i], NULL);
      cr_assert_eq(c[i].bad, 0, "round %d, thread %d: %d products differ "
                   "from one thread's", round, i, c[i].bad);
    }
  }
  cn__gemm_set_threads(old);
  free(ref), free(A), free(W);
}

/* A child of fork() makes split products too: the parent's helpers are
 * not in it, so it needs a team of its own (it would wait forever on the
 * parent's). The child exits 0 when its product has one thread's bits. */
Test(gemm, a_forked_child_splits_its_products, .timeout = 30) {
  int M = 96, N = 1030, K = 300;
  float *A = rnd((size_t)M * K), *W = rnd((size_t)N * K);
  float *ref = product(cn__gemm_path(), 1, M, N, K, A, K, W, K, NULL, 0.0f,
                       NULL);
  float *C = product(cn__gemm_path(), 2, M, N, K, A, K, W, K, NULL, 0.0f,
                     NULL); /* this process's team */
  cr_assert_eq(memcmp(C, ref, (size_t)M * N * sizeof(float)), 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    alarm(20); /* a child stuck waiting dies, and the test fails cleanly */
    float *D = product(cn__gemm_path(), 2, M, N, K, A, K, W, K, NULL, 0.0f,
                       NULL);
    _exit(memcmp(D, ref, (size_t)M * N * sizeof(float)) == 0 ? 0 : 1);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child's split product differs or it failed (status %d)",
            status);
  free(C), free(ref), free(A), free(W);
}

Test(gemm, an_unknown_path_is_refused) {
  cr_assert_eq(cn__gemm_force("sse9"), -1);
  cr_assert_not_null(cn__gemm_path());
}

/* Serenity §3.3's identity rewriting as gemm.c does it: 1 to 4 parts of
 * random widths, each either rows picked by offset from a pool (a tenth of
 * them missing: zeros) or a strided matrix, give every code path and 1 or
 * 2 threads the bits of cn__gemm_nt over the rows copied together, with
 * and without beta and bias. The last shape is big enough to be split
 * between threads. */
Test(gemm, parts_read_in_place_give_the_bits_of_a_copy) {
  print_paths("parts_read_in_place_give_the_bits_of_a_copy");
  const char *paths[3];
  int np = runnable(paths);
  int shapes[][2] = {{1, 1}, {7, 33}, {13, 64}, {70, 160}, {96, 520}};
  for (size_t sh = 0; sh < sizeof(shapes) / sizeof(shapes[0]); sh++)
    for (int n_parts = 1; n_parts <= 4; n_parts++) {
      int M = shapes[sh][0], N = shapes[sh][1], K = 0, Kq[4];
      for (int q = 0; q < n_parts; q++) {
        uni();
        Kq[q] = sh == 4 ? 150 : 1 + (int)((rng >> 20) % 70);
        K += Kq[q];
      }
      int pool_rows = 2 * M + 3, zero_k = 0;
      float *pool = rnd((size_t)pool_rows * K + 16);
      float *W = rnd((size_t)N * K), *b = rnd((size_t)N);
      float *A = calloc((size_t)M * K, sizeof(float)); /* the copy */
      int64_t *off[4] = {NULL};
      cn__gemm_part pt[4];
      float *P[4];
      for (int q = 0, col = 0; q < n_parts; col += Kq[q++]) {
        bool by_offset = (q + (int)sh) % 3 != 2;
        if (by_offset) {
          off[q] = malloc((size_t)M * sizeof(int64_t));
          for (int i = 0; i < M; i++) {
            int row = (int)((rng >> 17) % (uint64_t)pool_rows);
            off[q][i] = uni() > 0.8f ? -1 : (int64_t)row * K + q;
          }
          if (Kq[q] > zero_k) zero_k = Kq[q];
        }
        /* a strided part: row i at pool + col % 5 + i·2Kq */
        for (int i = 0; i < M; i++) {
          const float *src =
              !by_offset ? pool + col % 5 + (size_t)i * 2 * Kq[q]
              : off[q][i] < 0 ? NULL
                              : pool + off[q][i];
          for (int k = 0; k < Kq[q]; k++)
            A[(size_t)i * K + col + k] = src == NULL ? 0.0f : src[k];
        }
        P[q] = malloc(cn__gemm_packed_floats(N, Kq[q]) * sizeof(float));
        cn__gemm_pack_nt(N, Kq[q], W + col, K, P[q]);
        pt[q] = (cn__gemm_part){by_offset ? pool : pool + col % 5, off[q],
                                2 * Kq[q], Kq[q], P[q]};
      }
      float *zeros = calloc((size_t)zero_k + 1, sizeof(float));
      float *C0 = rnd((size_t)M * N);
      for (int v = 0; v < 2; v++) {
        const float *bias = v ? b : NULL;
        float beta = v ? 0.75f : 0.0f;
        float *want = product("portable", 1, M, N, K, A, K, W, K, bias, beta,
                              C0);
        for (int p = 0; p < np; p++)
          for (int t = 1; t <= 2; t++) {
            float *got = malloc((size_t)M * N * sizeof(float));
            memcpy(got, C0, (size_t)M * N * sizeof(float));
            cr_assert_eq(cn__gemm_force(paths[p]), 0);
            cn__gemm_set_threads(t);
            cn__gemm_packed_parts(M, N, n_parts, pt, zeros, bias, beta, got,
                                  N);
            cn__gemm_set_threads(1);
            cn__gemm_force(NULL);
            cr_assert_eq(memcmp(got, want, (size_t)M * N * sizeof(float)), 0,
                         "%s, %d threads: %d parts (M %d N %d K %d) differ "
                         "from the rows copied together", paths[p], t,
                         n_parts, M, N, K);
            free(got);
          }
        free(want);
      }
      for (int q = 0; q < n_parts; q++) free(off[q]), free(P[q]);
      free(pool), free(W), free(b), free(A), free(zeros), free(C0);
    }
}

/* A matrix times a vector read in place (cn__gemm_matvec) gives, on every
 * path, the bits of the packed product of the row x by A packed with
 * cn__gemm_pack_nt on the portable path: row counts around the 8-row
 * step, with and without beta, into a column with a stride. */
Test(gemm, a_matvec_in_place_gives_the_packed_bits) {
  const char *paths[8];
  int np = runnable(paths);
  static const int Ms[] = {1, 7, 8, 9, 33, 128};
  static const int Ks[] = {1, 5, 64, 130};
  for (size_t mi = 0; mi < sizeof(Ms) / sizeof(Ms[0]); mi++)
    for (size_t ki = 0; ki < sizeof(Ks) / sizeof(Ks[0]); ki++)
      for (int bi = 0; bi < 2; bi++) {
        int M = Ms[mi], K = Ks[ki], lda = K + 3, inc = 3;
        float beta = bi ? 0.75f : 0.0f;
        float *A = rnd((size_t)M * lda), *x = rnd((size_t)K);
        float *y0 = rnd((size_t)M), *want = malloc((size_t)M * sizeof(float));
        float *P = malloc(cn__gemm_packed_floats(M, K) * sizeof(float));
        memcpy(want, y0, (size_t)M * sizeof(float));
        cr_assert_eq(cn__gemm_force("portable"), 0);
        cn__gemm_pack_nt(M, K, A, lda, P);
        cn__gemm_packed(1, M, K, x, K, P, NULL, beta, want, M);
        for (int p = 0; p < np; p++) {
          cr_assert_eq(cn__gemm_force(paths[p]), 0);
          float *y = malloc((size_t)M * inc * sizeof(float));
          for (int i = 0; i < M; i++) y[(size_t)i * inc] = y0[i];
          cn__gemm_matvec(M, K, A, lda, x, beta, y, inc);
          for (int i = 0; i < M; i++)
            cr_assert(memcmp(&y[(size_t)i * inc], &want[i], sizeof(float)) == 0,
                      "path %s M=%d K=%d beta=%g row %d: %.9g vs %.9g",
                      paths[p], M, K, beta, i, y[(size_t)i * inc], want[i]);
          free(y);
        }
        cn__gemm_force(NULL);
        free(A), free(x), free(y0), free(want), free(P);
      }
}
