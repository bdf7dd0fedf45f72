/* test_cuda.c - the CUDA backend against the cpu backend (docs/cuda.md):
 * every family's batched outputs to 1e-4, every op on random inputs to
 * 1e-4, no device allocation after warm-up; and, without a device, the
 * clean start-up error. Tests that need a GPU report as skipped without
 * one. Built only when the cuda backend is (-Dcuda=enabled / auto). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "engine_util.h"

/* Floats of states the outputs of a run print (engine_util.c). */
static long long answer_floats(const json_t *outs) {
  long long n = 0;
  size_t k;
  const json_t *o;
  json_array_foreach(outs, k, o) n += tu_answer_floats(o);
  return n;
}

static cn_backend_ctx *open_or_skip(const char *name) {
  cn_backend_ctx *bk = NULL;
  cn_err err;
  cn_err_clear(&err);
  if (cn_backend_open(name, 0, &bk, &err) != 0) {
    if (strcmp(name, "cuda") == 0)
      cr_skip_test("no usable CUDA device: %s", err.msg);
    cr_assert_fail("%s: %s", name, err.msg);
  }
  return bk;
}

/* ---- without a device: a clear error, no crash ---- */

Test(cuda, no_device_is_a_clean_error) {
  cn_backend_ctx *bk = NULL;
  cn_err err;
  cn_err_clear(&err);
  int rc = cn_backend_open("cuda", 0, &bk, &err);
  if (rc == 0) {
    cn_backend_close(bk);
    cr_skip_test("a CUDA device is present: nothing to check");
  }
  cr_assert_eq(rc, CN_E_BACKEND);
  cr_assert_eq(err.code, CN_E_BACKEND);
  cr_assert_null(bk);
  cr_assert(strstr(err.msg, "backend 'cuda'") != NULL, "%s", err.msg);
  cr_log_info("cuda open without a device: %s", err.msg);
  /* Asking again gives the same answer (nothing left half-open). */
  cn_err_clear(&err);
  cr_assert_eq(cn_backend_open("cuda", 0, &bk, &err), CN_E_BACKEND);
}

Test(cuda, bad_device_ordinal_is_an_error) {
  cn_backend_ctx *bk = NULL;
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_backend_open("cuda", 4096, &bk, &err), CN_E_BACKEND);
  cr_assert(strstr(err.msg, "backend 'cuda'") != NULL, "%s", err.msg);
}

/* ---- families: cuda equals cpu ---- */

ParameterizedTestParameters(cuda, family_equals_cpu) {
  return cr_make_param_array(tu_family, tu_families, tu_n_families);
}

ParameterizedTest(tu_family *c, cuda, family_equals_cpu, .timeout = 300) {
  cn_backend_ctx *gpu = open_or_skip("cuda");
  cn_backend_ctx *cpu = open_or_skip("cpu");
  char dir[256];
  int H = strcmp(c->family, "mvrnn") == 0 ? 16 : 32;
  cn_model *m = tu_model(c->family, H, H, c->data, dir, sizeof(dir));
  json_t *in = tu_data_lines(c->data, 128);
  unsigned flags = CN_OUT_ALL | CN_OUT_HIDDEN;
  const int sizes[] = {1, 16, 128};
  for (int p = CN_POLICY_NONE; p < CN_POLICY__COUNT; p++) {
    if (p == CN_POLICY_FSM) continue; /* needs a learned policy */
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
      json_t *want = tu_run_on(cpu, m, in, (cn_policy_kind)p, sizes[s],
                               flags, NULL, NULL);
      json_t *got = tu_run_on(gpu, m, in, (cn_policy_kind)p, sizes[s],
                              flags, NULL, NULL);
      double d = tu_json_maxdiff(want, got);
      cr_expect_leq(d, 1e-4, "%s policy %s batch %d: cuda differs by %g",
                    c->family, cn_policy_name((cn_policy_kind)p), sizes[s],
                    d);
      /* only what the answers print comes back, with one wait a run
       * (lstm-nmt also brings each step's argmax, and waits for it) */
      cn_run_stats st = tu_stats;
      long long runs = st.instances;
      if (strcmp(c->family, "lstm-nmt") != 0) {
        cr_expect_eq(st.bytes_to_host, answer_floats(want) * 4,
                     "%s policy %s batch %d: %lld bytes to host in %lld "
                     "runs, the answers print %lld", c->family,
                     cn_policy_name((cn_policy_kind)p), sizes[s],
                     st.bytes_to_host, runs, answer_floats(want) * 4);
        cr_expect_leq(st.device_syncs, 2 * runs,
                      "%s policy %s batch %d: %lld waits in %lld runs",
                      c->family, cn_policy_name((cn_policy_kind)p),
                      sizes[s], st.device_syncs, runs);
      } else {
        cr_expect_geq(st.bytes_to_host, answer_floats(want) * 4);
      }
      cr_expect_geq(st.launches, st.batches, "%s: launches %lld < batches "
                    "%lld", c->family, st.launches, st.batches);
      if (p == CN_POLICY_AGENDA && sizes[s] == 128)
        cr_log_info("%s batch 128: %lld runs, %lld batches, %lld launches "
                    "(%.2f a batch), %lld waits, %lld bytes to host, %lld "
                    "bytes to device", c->family, runs, st.batches,
                    st.launches, (double)st.launches / (double)st.batches,
                    st.device_syncs, st.bytes_to_host, st.bytes_to_device);
      json_decref(want);
      json_decref(got);
    }
  }
  /* Warm: the same runs again allocate nothing on the device, and upload
   * a batch's indices in one copy (MV-RNN's pointer
   * arrays with an identity operand, and lstm-nmt's decoding, excepted). */
  long long a0 = cn__backend_cuda_device_allocs(gpu);
  for (int p = CN_POLICY_NONE; p < CN_POLICY__COUNT; p++) {
    if (p == CN_POLICY_FSM) continue;
    json_decref(
        tu_run_on(gpu, m, in, (cn_policy_kind)p, 128, flags, NULL, NULL));
    if (strcmp(c->family, "mvrnn") != 0 && strcmp(c->family, "lstm-nmt") != 0)
      cr_expect_leq(tu_stats.copies_to_device,
                    tu_stats.batches + tu_stats.instances,
                    "%s policy %s: %lld copies to the device for %lld "
                    "batches in %lld runs", c->family,
                    cn_policy_name((cn_policy_kind)p),
                    tu_stats.copies_to_device, tu_stats.batches,
                    tu_stats.instances);
  }
  cr_expect_eq(cn__backend_cuda_device_allocs(gpu), a0,
               "%s: %lld device allocations after warm-up", c->family,
               cn__backend_cuda_device_allocs(gpu) - a0);
  cr_expect_eq(tu_stats.device_allocs, 0, "%s: the counters saw %lld "
               "allocations after warm-up", c->family, tu_stats.device_allocs);
  /* idle: the pool's unused blocks go back */
  cn_backend_counters ctr;
  cn_backend_get_counters(gpu, &ctr);
  long long held = ctr.device_bytes;
  cn_backend_release(gpu);
  cn_backend_get_counters(gpu, &ctr);
  cr_expect_lt(ctr.device_bytes, held, "%s: release kept all %lld bytes",
               c->family, held);
  cr_expect_gt(ctr.device_bytes, 0); /* the weights stay */
  json_t *after = tu_run_on(gpu, m, in, CN_POLICY_AGENDA, 128, flags, NULL,
                            NULL);
  json_t *ref = tu_run_on(cpu, m, in, CN_POLICY_AGENDA, 128, flags, NULL,
                          NULL);
  cr_expect_leq(tu_json_maxdiff(ref, after), 1e-4,
                "%s: differs after a release", c->family);
  json_decref(after);
  json_decref(ref);
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
  cn_backend_close(gpu);
  cn_backend_close(cpu);
}

/* A batch's indices in one upload and the fused
 * kernels' tables by value (the default) against every call staging its
 * own (CANOPY_CUDA_BATCH_STAGING=0, the path first measured on a GPU):
 * the same kernels on the same numbers, so the same bits, for the
 * families that exercise each op (gathers, segment loops, per-vertex
 * products with the identity, decoding); and fewer copies. */
Test(cuda, batch_staging_changes_no_bit, .timeout = 300) {
  const char *fams[][2] = {{"treelstm", "trees-binary.jsonl"},
                           {"childsum-treelstm", "trees-nary.jsonl"},
                           {"latticelstm", "lattices.jsonl"},
                           {"mvrnn", "trees-binary.jsonl"},
                           {"lstm-nmt", "sequences.jsonl"}};
  for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
    setenv("CANOPY_CUDA_BATCH_STAGING", "0", 1);
    cn_backend_ctx *off = open_or_skip("cuda");
    unsetenv("CANOPY_CUDA_BATCH_STAGING");
    cn_backend_ctx *on = open_or_skip("cuda");
    char dir[256];
    int H = strcmp(fams[f][0], "mvrnn") == 0 ? 16 : 32;
    cn_model *m = tu_model(fams[f][0], H, H, fams[f][1], dir, sizeof(dir));
    json_t *in = tu_data_lines(fams[f][1], 96);
    unsigned flags = CN_OUT_ALL | CN_OUT_HIDDEN;
    json_t *a = tu_run_on(off, m, in, CN_POLICY_AGENDA, 32, flags, NULL,
                          NULL);
    long long copies_off = tu_stats.copies_to_device;
    json_t *b = tu_run_on(on, m, in, CN_POLICY_AGENDA, 32, flags, NULL,
                          NULL);
    long long copies_on = tu_stats.copies_to_device;
    cr_expect(json_equal(a, b), "%s: staging the batch's indices changed "
              "the answers (max %g)", fams[f][0], tu_json_maxdiff(a, b));
    cr_expect_lt(copies_on, copies_off, "%s: %lld copies with the batch "
                 "staged, %lld without", fams[f][0], copies_on, copies_off);
    cr_log_info("%s: %lld copies to the device with the batch staged, %lld "
                "without (%lld batches)", fams[f][0], copies_on, copies_off,
                tu_stats.batches);
    json_decref(a);
    json_decref(b);
    json_decref(in);
    cn_model_free(m);
    tu_rmdir(dir);
    cn_backend_close(on);
    cn_backend_close(off);
  }
}

/* ---- ops: cuda equals cpu on random inputs ---- */

static cn_backend_ctx *G_, *C_; /* cuda, cpu */
static unsigned seed_ = 12345;

static float frand(void) {
  seed_ = seed_ * 1103515245u + 12345u;
  return ((float)((seed_ >> 8) & 0xffff) / 65536.0f) * 2.0f - 1.0f;
}

static float *rnd(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = frand();
  return p;
}

/* A device copy of n host floats. */
static float *up(const float *h, size_t n) {
  float *d = G_->vt->alloc(G_, (n ? n : 1) * sizeof(float));
  cr_assert_not_null(d);
  G_->vt->to_device(G_, d, h, n * sizeof(float));
  return d;
}

/* Device n floats back on the host, compared with the cpu result. */
static void expect_same(const char *op, const float *dev, const float *want,
                        size_t n) {
  float *got = malloc((n ? n : 1) * sizeof(float));
  G_->vt->to_host(G_, got, dev, n * sizeof(float));
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(G_->vt->status(G_, &err), 0, "%s: %s", op, err.msg);
  double md = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - (double)want[i]);
    if (!(d <= md)) md = d;
  }
  cr_expect_leq(md, 1e-4, "%s: cuda differs from cpu by %g", op, md);
  free(got);
}

static void ops_init(void) {
  G_ = NULL;
  cn_err err;
  cn_err_clear(&err);
  if (cn_backend_open("cuda", 0, &G_, &err) != 0) G_ = NULL;
  cr_assert_eq(cn_backend_open("cpu", 0, &C_, &err), 0);
}

static void ops_fini(void) {
  cn_backend_close(G_);
  cn_backend_close(C_);
}

#define NEED_GPU()                                                          \
  do {                                                                     \
    if (G_ == NULL) cr_skip_test("no usable CUDA device");                 \
  } while (0)

enum { N = 37, H = 24, R = 64 }; /* rows, hidden, state rows */

/* Random state offsets (row·S, some -1 when allow_neg). */
static int64_t *offs(int n, int S, bool allow_neg) {
  int64_t *o = malloc((size_t)n * sizeof(int64_t));
  for (int i = 0; i < n; i++) {
    seed_ = seed_ * 1103515245u + 12345u;
    int row = (int)((seed_ >> 8) % R);
    o[i] = allow_neg && (seed_ >> 20) % 4 == 0 ? -1 : (int64_t)row * S;
  }
  return o;
}

/* Segments of 0..3 per row. */
static int64_t *segs(int n) {
  int64_t *s = malloc((size_t)(n + 1) * sizeof(int64_t));
  s[0] = 0;
  for (int i = 0; i < n; i++) {
    seed_ = seed_ * 1103515245u + 12345u;
    s[i + 1] = s[i] + (int64_t)((seed_ >> 10) % 4);
  }
  return s;
}

TestSuite(cuda_ops, .init = ops_init, .fini = ops_fini);

Test(cuda_ops, gemm_and_strided) {
  NEED_GPU();
  int M = 45, Nn = 70, K = 33;
  float *A = rnd((size_t)M * K), *W = rnd((size_t)Nn * K), *b = rnd(Nn);
  for (int beta = 0; beta < 2; beta++)
    for (int bias = 0; bias < 2; bias++) {
      float *Cc = rnd((size_t)M * Nn);
      float *Cd = up(Cc, (size_t)M * Nn);
      float *Ad = up(A, (size_t)M * K), *Wd = up(W, (size_t)Nn * K),
            *bd = up(b, Nn);
      C_->vt->gemm(C_, M, Nn, K, A, K, W, K, bias ? b : NULL, (float)beta,
                   Cc, Nn);
      G_->vt->gemm(G_, M, Nn, K, Ad, K, Wd, K, bias ? bd : NULL, (float)beta,
                   Cd, Nn);
      expect_same("gemm", Cd, Cc, (size_t)M * Nn);
      free(Cc);
    }
  int cnt = 5;
  float *SA = rnd((size_t)cnt * M * K), *SB = rnd((size_t)cnt * K * Nn);
  float *SC = rnd((size_t)cnt * M * Nn);
  float *SAd = up(SA, (size_t)cnt * M * K), *SBd = up(SB, (size_t)cnt * K * Nn);
  float *SCd = up(SC, (size_t)cnt * M * Nn);
  C_->vt->gemm_strided(C_, cnt, M, Nn, K, SA, K, (long long)M * K, SB, Nn,
                       (long long)K * Nn, 0.5f, SC, Nn, (long long)M * Nn);
  G_->vt->gemm_strided(G_, cnt, M, Nn, K, SAd, K, (long long)M * K, SBd, Nn,
                       (long long)K * Nn, 0.5f, SCd, Nn, (long long)M * Nn);
  expect_same("gemm_strided", SCd, SC, (size_t)cnt * M * Nn);
  /* gemm_batched: the same problems by pointer arrays, accumulating */
  const float *pa[5], *pb[5], *pad[5], *pbd[5];
  float *pc[5], *pcd[5];
  for (int r = 0; r < cnt; r++) {
    pa[r] = SA + (size_t)r * M * K, pad[r] = SAd + (size_t)r * M * K;
    pb[r] = SB + (size_t)r * K * Nn, pbd[r] = SBd + (size_t)r * K * Nn;
    pc[r] = SC + (size_t)r * M * Nn, pcd[r] = SCd + (size_t)r * M * Nn;
  }
  C_->vt->gemm_batched(C_, cnt, 1, M, Nn, K, pa, K, pb, Nn, 1.0f, pc, Nn);
  G_->vt->gemm_batched(G_, cnt, 1, M, Nn, K, pad, K, pbd, Nn, 1.0f, pcd, Nn);
  expect_same("gemm_batched", SCd, SC, (size_t)cnt * M * Nn);
  /* two terms an output, the second the identity (NULL): MV-RNN's
   * P = WM_l·A + WM_r·I for a unary node, square products of side h */
  int h = 12;
  float *Q = rnd((size_t)cnt * h * h), *Qd = up(Q, (size_t)cnt * h * h);
  float *QC = rnd((size_t)cnt * h * h), *QCd = up(QC, (size_t)cnt * h * h);
  const float *qa[10], *qb[10], *qad[10], *qbd[10];
  float *qc[5], *qcd[5];
  for (int r = 0; r < cnt; r++) {
    qa[r] = qa[cnt + r] = Q + (size_t)r * h * h;
    qad[r] = qad[cnt + r] = Qd + (size_t)r * h * h;
    qb[r] = Q, qbd[r] = Qd;
    qb[cnt + r] = qbd[cnt + r] = NULL;
    qc[r] = QC + (size_t)r * h * h, qcd[r] = QCd + (size_t)r * h * h;
  }
  C_->vt->gemm_batched(C_, cnt, 2, h, h, h, qa, h, qb, h, 0.0f, qc, h);
  G_->vt->gemm_batched(G_, cnt, 2, h, h, h, qad, h, qbd, h, 0.0f, qcd, h);
  expect_same("gemm_batched (terms, identity)", QCd, QC, (size_t)cnt * h * h);
}

Test(cuda_ops, gathers_and_elementwise) {
  NEED_GPU();
  int S = 2 * H, ldd = H + 5;
  float *base = rnd((size_t)R * S), *based = up(base, (size_t)R * S);
  int64_t *idx = offs(N, S, true);
  float *d = rnd((size_t)N * ldd), *dd = up(d, (size_t)N * ldd);
  C_->vt->gather(C_, d, ldd, base, idx, N, H);
  G_->vt->gather(G_, dd, ldd, based, idx, N, H);
  expect_same("gather", dd, d, (size_t)N * ldd);
  int64_t *seg = segs(N), *gi = offs((int)seg[N], S, false);
  for (int mean = 0; mean < 2; mean++) {
    C_->vt->gather_sum(C_, d, ldd, base, gi, seg, N, H, mean);
    G_->vt->gather_sum(G_, dd, ldd, based, gi, seg, N, H, mean);
    expect_same("gather_sum", dd, d, (size_t)N * ldd);
  }
  /* argmax, with ties (the lowest index wins). */
  int w = 300;
  float *X = rnd((size_t)N * w);
  for (int r = 0; r < N; r += 3) X[(size_t)r * w + 7] = X[(size_t)r * w + 200] = 5;
  /* rows holding NaN or an infinity: -1 on both */
  X[(size_t)1 * w + 250] = NAN;
  X[(size_t)2 * w + 3] = INFINITY;
  X[(size_t)4 * w + 299] = -INFINITY;
  float *Xd = up(X, (size_t)N * w);
  int32_t a[N], b[N];
  C_->vt->argmax_rows(C_, N, w, X, w, a);
  G_->vt->argmax_rows(G_, N, w, Xd, w, b);
  for (int r = 0; r < N; r++) cr_expect_eq(a[r], b[r], "argmax row %d", r);
  cr_expect(a[1] == -1 && a[2] == -1 && a[4] == -1 && a[0] >= 0);
}

/* ew_program's segment loop (segment ops fused: childsum's forget gates,
 * a lattice char's words): acc = Σ_e σ(F_e + b) ⊙ c_e over each row's
 * edges (0..3 a row), F strided over the edges, c read in place by
 * offsets, b broadcast; then h = tanh(acc) ⊙ x. Per-row scratch holds the
 * per-edge product. */
Test(cuda_ops, ew_segment_loop) {
  NEED_GPU();
  int64_t *seg = segs(N), E = seg[N];
  int S = 2 * H;
  float *base = rnd((size_t)R * S), *based = up(base, (size_t)R * S);
  int64_t *co = offs((int)E, S, false);
  float *F = rnd((size_t)(E ? E : 1) * H), *Fd = up(F, (size_t)(E ? E : 1) * H);
  float *b = rnd(H), *bd = up(b, H);
  float *X = rnd((size_t)N * 2 * H), *Xd = up(X, (size_t)N * 2 * H);
  /* slots: 0 acc = X[:, 0:H], 1 x = X[:, H:2H], 2 tmp, 3 F, 4 c, 5 b */
  cn_ew_slot sc[6] = {{X, 2 * H, NULL}, {X + H, 2 * H, NULL}, {NULL, 0, NULL},
                      {F, H, NULL}, {base + H, 0, co}, {b, 0, NULL}};
  cn_ew_slot sg[6] = {{Xd, 2 * H, NULL}, {Xd + H, 2 * H, NULL},
                      {NULL, 0, NULL}, {Fd, H, NULL}, {based + H, 0, co},
                      {bd, 0, NULL}};
  cn_ew_insn in[6] = {
      {CN_EW_MOV, H, {0, 0, 0}, {-1, 0, 0.0f}, {-1, 0, 0}},
      {CN_EW_ADD, H, {2, 0, 0}, {3, 0, 0}, {5, 0, 0}},
      {CN_EW_SIGMOID, H, {2, 0, 0}, {2, 0, 0}, {-1, 0, 0}},
      {CN_EW_MUL, H, {2, 0, 0}, {2, 0, 0}, {4, 0, 0}},
      {CN_EW_ADD, H, {0, 0, 0}, {0, 0, 0}, {2, 0, 0}},
      {CN_EW_TANH, H, {0, 0, 0}, {0, 0, 0}, {-1, 0, 0}}};
  cn_ew_prog p = {6, in, 6, 2, H, 1, 5, 3, seg};
  C_->vt->ew_program(C_, &p, sc, N);
  G_->vt->ew_program(G_, &p, sg, N);
  expect_same("ew_program segment loop", Xd, X, (size_t)N * 2 * H);
}
