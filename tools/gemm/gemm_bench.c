/* gemm_bench.c - canopy-gemm-bench: backends/cpu/gemm.c against OpenBLAS's
 * sgemm on the products Canopy's models make, side by side, and against
 * the two Debian candidates for a product library, when the build finds
 * them: oneDNN's matmul primitive (libdnnl-dev 2.6, its weights reordered
 * once into the layout the primitive picks) and libxsmm's JIT kernels
 * (libxsmm-dev 1.17, one kernel dispatched per shape, the weights
 * transposed once).
 *
 *   canopy-gemm-bench [--threads N]
 *
 * OpenBLAS is opened at run time (libopenblas.so.0, dlopen), so Canopy
 * itself does not link it; it honours OPENBLAS_CORETYPE as usual: run it
 * with the variable set and unset, and say which. Prints one row per
 * shape: GFLOP/s of OpenBLAS, of gemm.c packing the right operand on every
 * call (cn__gemm_nt) and with it packed once (cn__gemm_packed, as the cpu
 * backend does for a model's weights), of oneDNN and libxsmm ("-": not
 * built in, or no kernel for the shape), the ratio of gemm.c packed to
 * OpenBLAS, and the largest difference (they sum in different orders).
 * Then, per library, whether each row of the M-row product has the bits
 * of that row computed alone (M = 1): what an answer independent of its
 * batch needs (docs/api.md). Measures; asserts nothing. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/gemm.h"

#ifdef CN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef CN_HAVE_XSMM
#include <libxsmm.h>
#endif

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *,
                         int, const float *, int, float, float *, int);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}


/* One product C[M×N] = A[M×K] · W[N×K]ᵀ by a library with its weights
 * prepared once; run() may be called repeatedly. */
typedef struct lib_mm {
  void *state;
  void (*run)(struct lib_mm *, const float *A, float *C);
  void (*done)(struct lib_mm *);
} lib_mm;

#ifdef CN_HAVE_DNNL
typedef struct {
  dnnl_engine_t eng;
  dnnl_stream_t st;
  dnnl_primitive_t mm;
  dnnl_memory_t src, w, dst;
} dnnl_mm;

static dnnl_engine_t dnnl_eng;
static dnnl_stream_t dnnl_st;

static void dnnl_run(lib_mm *l, const float *A, float *C) {
  dnnl_mm *d = l->state;
  dnnl_memory_set_data_handle(d->src, (void *)A);
  dnnl_memory_set_data_handle(d->dst, C);
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, d->src},
                             {DNNL_ARG_WEIGHTS, d->w},
                             {DNNL_ARG_DST, d->dst}};
  dnnl_primitive_execute(d->mm, dnnl_st, 3, args);
  dnnl_stream_wait(dnnl_st);
}

static void dnnl_done(lib_mm *l) {
  dnnl_mm *d = l->state;
  dnnl_primitive_destroy(d->mm);
  dnnl_memory_destroy(d->src), dnnl_memory_destroy(d->w);
  dnnl_memory_destroy(d->dst);
  free(d);
}

/* The matmul primitive for M × N × K with weights in the layout it
 * chooses (format "any"), W reordered into it once. */
static int dnnl_make(lib_mm *l, int M, int N, int K, const float *W) {
  if (dnnl_eng == NULL) {
    if (dnnl_engine_create(&dnnl_eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&dnnl_st, dnnl_eng, dnnl_stream_default_flags) !=
            dnnl_success)
      return -1;
  }
  dnnl_memory_desc_t src_md, w_user, w_any, dst_md;
  dnnl_dims_t sd = {M, K}, wd = {K, N}, dd = {M, N};
  dnnl_memory_desc_init_by_tag(&src_md, 2, sd, dnnl_f32, dnnl_ab);
  dnnl_memory_desc_init_by_tag(&w_user, 2, wd, dnnl_f32, dnnl_ba); /* W[N][K] */
  dnnl_memory_desc_init_by_tag(&w_any, 2, wd, dnnl_f32, dnnl_format_tag_any);
  dnnl_memory_desc_init_by_tag(&dst_md, 2, dd, dnnl_f32, dnnl_ab);
  dnnl_matmul_desc_t desc;
  dnnl_primitive_desc_t pd, rpd;
  if (dnnl_matmul_desc_init(&desc, &src_md, &w_any, NULL, &dst_md) != dnnl_success ||
      dnnl_primitive_desc_create(&pd, &desc, NULL, dnnl_eng, NULL) != dnnl_success)
    return -1;
  dnnl_mm *d = calloc(1, sizeof(*d));
  const dnnl_memory_desc_t *wq = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  dnnl_memory_t wu;
  dnnl_primitive_t reorder;
  dnnl_primitive_create(&d->mm, pd);
  dnnl_memory_create(&d->src, &src_md, dnnl_eng, DNNL_MEMORY_NONE);
  dnnl_memory_create(&d->dst, &dst_md, dnnl_eng, DNNL_MEMORY_NONE);
  dnnl_memory_create(&d->w, wq, dnnl_eng, DNNL_MEMORY_ALLOCATE);
  dnnl_memory_create(&wu, &w_user, dnnl_eng, (void *)W);
  dnnl_reorder_primitive_desc_create(&rpd, &w_user, dnnl_eng, wq, dnnl_eng, NULL);
  dnnl_primitive_create(&reorder, rpd);
  dnnl_exec_arg_t rargs[2] = {{DNNL_ARG_FROM, wu}, {DNNL_ARG_TO, d->w}};
  dnnl_primitive_execute(reorder, dnnl_st, 2, rargs);
  dnnl_stream_wait(dnnl_st);
  dnnl_primitive_destroy(reorder);
  dnnl_primitive_desc_destroy(rpd);
  dnnl_primitive_desc_destroy(pd);
  dnnl_memory_destroy(wu);
  l->state = d, l->run = dnnl_run, l->done = dnnl_done;
  return 0;
}
#endif

#ifdef CN_HAVE_XSMM
typedef struct {
  libxsmm_smmfunction k;
  float *Wt; /* W transposed, [K][N]: column-major N × K */
} xsmm_mm;

/* libxsmm is column-major: C row-major [M][N] is Cᵀ, N × M column-major,
 * and Cᵀ = W · Aᵀ, with W (N × K column-major) held as Wt and Aᵀ (K × M
 * column-major) being A row-major as it lies. */
static void xsmm_run(lib_mm *l, const float *A, float *C) {
  xsmm_mm *x = l->state;
  x->k(x->Wt, A, C);
}

static void xsmm_done(lib_mm *l) {
  xsmm_mm *x = l->state;
  free(x->Wt);
  free(x);
}

static int xsmm_make(lib_mm *l, int M, int N, int K, const float *W) {
  libxsmm_blasint m = N, n = M, k = K, lda = N, ldb = K, ldc = N;
  float alpha = 1.0f, beta = 0.0f;
  int flags = LIBXSMM_GEMM_FLAG_NONE, prefetch = LIBXSMM_PREFETCH_NONE;
  libxsmm_smmfunction fn = libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc,
                                               &alpha, &beta, &flags, &prefetch);
  if (fn == NULL) return -1; /* no JIT kernel for this shape */
  xsmm_mm *x = malloc(sizeof(*x));
  x->k = fn;
  x->Wt = malloc(sizeof(float) * (size_t)N * K);
  for (int j = 0; j < N; j++)
    for (int q = 0; q < K; q++) x->Wt[(size_t)q * N + j] = W[(size_t)j * K + q];
  l->state = x, l->run = xsmm_run, l->done = xsmm_done;
  return 0;
}
#endif

typedef int (*make_fn)(lib_mm *, int M, int N, int K, const float *W);

/* Best of 3 seconds per product, or -1 with no kernel; C gets the answer. */
static double lib_time(make_fn make, int M, int N, int K, const float *A,
                       const float *W, float *C, int reps, int *invariant) {
  lib_mm l, one;
  *invariant = -1;
  if (make == NULL || make(&l, M, N, K, W) != 0) return -1;
  double best = 1e9;
  for (int round = 0; round < 3; round++) {
    double t = now();
    for (int r = 0; r < reps; r++) l.run(&l, A, C);
    t = (now() - t) / reps;
    if (t < best) best = t;
  }
  /* every row alone against its row of the batch, bit for bit */
  if (make(&one, 1, N, K, W) == 0) {
    float *row = malloc(sizeof(float) * (size_t)N);
    *invariant = 1;
    for (int i = 0; i < M && *invariant; i++) {
      one.run(&one, A + (size_t)i * K, row);
      if (memcmp(row, C + (size_t)i * N, sizeof(float) * (size_t)N) != 0)
        *invariant = 0;
    }
    free(row);
    one.done(&one);
  }
  l.done(&l);
  return best;
}

static const char *yes_no(int v) { return v < 0 ? "-" : v ? "yes" : "no"; }

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
  make_fn dnnl = NULL, xsmm = NULL;
#ifdef CN_HAVE_DNNL
  dnnl = dnnl_make; /* its OpenMP threads: OMP_NUM_THREADS, set below */
#endif
#ifdef CN_HAVE_XSMM
  libxsmm_init();
  xsmm = xsmm_make; /* one thread: a JIT kernel is one call */
#endif
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  const char *ct = getenv("OPENBLAS_CORETYPE");
  printf("gemm.c path %s, %d thread(s); OPENBLAS_CORETYPE=%s\n",
         cn__gemm_path(), threads, ct ? ct : "unset");
  /* M rows (a batch) × the products of treelstm's internal cell (5H × 2H),
   * an LSTM's recurrence (4H × H) and an lstm-nmt projection (V × H) */
  static const int shapes[][3] = {
      {1, 640, 256},    {8, 640, 256},    {64, 640, 256},  {512, 640, 256},
      {1, 2560, 1024},  {8, 2560, 1024},  {64, 2560, 1024}, {512, 2560, 1024},
      {64, 512, 128},   {512, 2048, 512}, {1, 8000, 128},   {64, 8000, 128}};
  printf("%6s %6s %6s %14s %14s %14s %12s %12s %8s %10s  %s\n", "M", "N", "K",
         "openblas GF/s", "gemm.c GF/s", "packed GF/s", "onednn GF/s",
         "libxsmm GF/s", "ratio", "max diff",
         "rows as alone: openblas gemm.c onednn libxsmm");
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
    /* rows alone: OpenBLAS and gemm.c packed, then the libraries */
    float *row = malloc(sizeof(float) * (size_t)N);
    int inv_blas = 1, inv_gemm = 1, inv_dnnl, inv_xsmm;
    for (int i = 0; i < M; i++) {
      sgemm(ROW_MAJOR, NO_TRANS, TRANS, 1, N, K, 1.0f, A + (size_t)i * K, K,
            W, K, 0.0f, row, N);
      if (memcmp(row, C + (size_t)i * N, sizeof(float) * (size_t)N)) inv_blas = 0;
      cn__gemm_packed(1, N, K, A + (size_t)i * K, K, P, NULL, 0.0f, row, N);
      if (memcmp(row, D + (size_t)i * N, sizeof(float) * (size_t)N)) inv_gemm = 0;
    }
    double td = lib_time(dnnl, M, N, K, A, W, C, reps, &inv_dnnl);
    double tx = lib_time(xsmm, M, N, K, A, W, C, reps, &inv_xsmm);
    char gd[32] = "-", gx[32] = "-";
    if (td > 0) snprintf(gd, sizeof(gd), "%.1f", fl / td / 1e9);
    if (tx > 0) snprintf(gx, sizeof(gx), "%.1f", fl / tx / 1e9);
    printf("%6d %6d %6d %14.1f %14.1f %14.1f %12s %12s %8.2f %10.1e  %s %s %s %s\n",
           M, N, K, fl / tb / 1e9, fl / tc / 1e9, fl / tp / 1e9, gd, gx,
           tb / tp, md, yes_no(inv_blas), yes_no(inv_gemm), yes_no(inv_dnnl),
           yes_no(inv_xsmm));
    fflush(stdout);
    free(row);
    free(A), free(W), free(C), free(D), free(P);
  }
  return 0;
}
