/* gemm_bench.c - canopy-gemm-bench: backends/cpu/gemm.c against OpenBLAS's
 * sgemm on the products Canopy's models make (issue 32), side by side.
 *
 *   canopy-gemm-bench [--threads N]
 *
 * OpenBLAS is opened at run time (libopenblas.so.0, dlopen), so Canopy
 * itself does not link it; it honours OPENBLAS_CORETYPE as usual: run it
 * with the variable set and unset, and say which. Prints one row per
 * shape: GFLOP/s of OpenBLAS, of gemm.c packing the right operand on every
 * call (cn__gemm_nt) and with it packed once (cn__gemm_packed, as the cpu
 * backend does for a model's weights within a run), the ratio of the last
 * to OpenBLAS, and the largest difference (the two sum in different
 * orders). Measures; asserts nothing. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/gemm.h"

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *,
                         int, const float *, int, float, float *, int);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int threads = 1;
  if (argc == 3 && strcmp(argv[1], "--threads") == 0) threads = atoi(argv[2]);
  void *lib = dlopen("libopenblas.so.0", RTLD_NOW);
  sgemm_fn sgemm = lib ? (sgemm_fn)dlsym(lib, "cblas_sgemm") : NULL;
  void (*set_threads)(int) =
      lib ? (void (*)(int))dlsym(lib, "openblas_set_num_threads") : NULL;
  if (sgemm == NULL) {
    fprintf(stderr, "canopy-gemm-bench: no libopenblas.so.0 (apt-get install "
                    "libopenblas0): %s\n", dlerror());
    return 1;
  }
  if (set_threads) set_threads(threads);
  cn__gemm_set_threads(threads);
  const char *ct = getenv("OPENBLAS_CORETYPE");
  printf("gemm.c path %s, %d thread(s); OPENBLAS_CORETYPE=%s\n",
         cn__gemm_path(), threads, ct ? ct : "unset");
  /* M rows (a batch) × the products of treelstm's internal cell (5H × 2H),
   * an LSTM's recurrence (4H × H) and an lstm-nmt projection (V × H) */
  static const int shapes[][3] = {
      {1, 640, 256},    {8, 640, 256},    {64, 640, 256},  {512, 640, 256},
      {1, 2560, 1024},  {8, 2560, 1024},  {64, 2560, 1024}, {512, 2560, 1024},
      {64, 512, 128},   {512, 2048, 512}, {1, 8000, 128},   {64, 8000, 128}};
  printf("%6s %6s %6s %14s %14s %14s %8s %10s\n", "M", "N", "K",
         "openblas GF/s", "gemm.c GF/s", "packed GF/s", "ratio", "max diff");
  for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
    int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
    float *A = malloc(sizeof(float) * (size_t)M * K);
    float *W = malloc(sizeof(float) * (size_t)N * K);
    float *C = malloc(sizeof(float) * (size_t)M * N);
    float *D = malloc(sizeof(float) * (size_t)M * N);
    float *P = malloc(sizeof(float) * (cn__gemm_packed_floats(N, K) + 16));
    if (!A || !W || !C || !D || !P) return 1;
    srand(1);
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < (size_t)N * K; i++) W[i] = rand() / (float)RAND_MAX - 0.5f;
    double fl = 2.0 * M * N * K;
    int reps = (int)(1e9 / fl) + 3;
    cn__gemm_pack_nt(N, K, W, K, P);
    double tb = 1e9, tc = 1e9, tp = 1e9;
    for (int round = 0; round < 3; round++) { /* best of 3, interleaved */
      double t = now();
      for (int r = 0; r < reps; r++)
        sgemm(ROW_MAJOR, NO_TRANS, TRANS, M, N, K, 1.0f, A, K, W, K, 0.0f, C, N);
      t = (now() - t) / reps;
      if (t < tb) tb = t;
      t = now();
      for (int r = 0; r < reps; r++)
        cn__gemm_nt(M, N, K, A, K, W, K, NULL, 0.0f, D, N);
      t = (now() - t) / reps;
      if (t < tc) tc = t;
      t = now();
      for (int r = 0; r < reps; r++)
        cn__gemm_packed(M, N, K, A, K, P, NULL, 0.0f, D, N);
      t = (now() - t) / reps;
      if (t < tp) tp = t;
    }
    double md = 0;
    for (size_t i = 0; i < (size_t)M * N; i++) {
      double d = (double)C[i] - D[i];
      if (d < 0) d = -d;
      if (d > md) md = d;
    }
    printf("%6d %6d %6d %14.1f %14.1f %14.1f %8.2f %10.1e\n", M, N, K,
           fl / tb / 1e9, fl / tc / 1e9, fl / tp / 1e9, tb / tp, md);
    free(A), free(W), free(C), free(D), free(P);
  }
  return 0;
}
