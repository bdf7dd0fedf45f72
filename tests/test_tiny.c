/* test_tiny.c - one-leaf and two-leaf trees per family against values
 * computed here, in double precision, straight from docs/models.md's equations
 * and the weights file (independently of the engine's kernels). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "engine_util.h"
#include "internal.h"

#define MAXH 16
#define TOL 1e-5

static const cn_model *M;

static const float *T(const char *name) {
  const cn_tensor *t = cn_safetensors_find(&M->st, name);
  cr_assert_not_null(t, "tensor %s", name);
  return t->data;
}

/* y[rows] = W[r0 .. r0+rows, :cols] · x, W stored with ld columns. */
static void mv(const float *W, int ld, int r0, int rows, const double *x,
               int cols, double *y) {
  for (int i = 0; i < rows; i++) {
    double s = 0;
    for (int j = 0; j < cols; j++) s += (double)W[(size_t)(r0 + i) * ld + j] * x[j];
    y[i] = s;
  }
}

static double sg(double x) { return 1.0 / (1.0 + exp(-x)); }

static int wid(const char *w) {
  return cn_vocab_lookup(M->vocab, w, strlen(w), false);
}

static void embed(const char *w, int D, double *x) {
  const float *E = T("embed");
  int id = wid(w);
  for (int j = 0; j < D; j++) x[j] = E[(size_t)id * D + j];
}

static void check_vec(const json_t *a, const double *x, int n, const char *what) {
  cr_assert(json_is_array(a), "%s missing", what);
  cr_assert_eq((int)json_array_size(a), n, "%s size", what);
  for (int i = 0; i < n; i++) {
    double v = json_number_value(json_array_get(a, (size_t)i));
    cr_expect(fabs(v - x[i]) <= TOL, "%s[%d]: engine %.9g, expected %.9g",
              what, i, v, x[i]);
  }
}

static void logits_of(const double *h, int H, double *z) {
  int C = (int)M->dims.C;
  mv(T("out.W"), H, 0, C, h, H, z);
  const float *b = T("out.b");
  for (int i = 0; i < C; i++) z[i] += b[i];
}

/* Runs one bracketed tree with outputs=all and return_hidden. */
static json_t *run1(const char *tree) {
  json_t *in = json_pack("[{s:s}]", "tree", tree);
  json_t *out = tu_run(M, in, CN_POLICY_AGENDA, 8,
                       CN_OUT_ALL | CN_OUT_HIDDEN, NULL, NULL);
  json_decref(in);
  json_t *o = json_incref(json_array_get(out, 0));
  json_decref(out);
  cr_assert_null(json_object_get(o, "error"));
  return o;
}

static void check_node(const json_t *o, int node, const double *h, int H) {
  double z[16];
  logits_of(h, H, z);
  json_t *n = json_array_get(json_object_get(o, "nodes"), (size_t)node);
  check_vec(json_object_get(n, "logits"), z, (int)M->dims.C, "node logits");
  if (node == 0) {
    check_vec(json_object_get(o, "logits"), z, (int)M->dims.C, "logits");
    check_vec(json_object_get(o, "h"), h, H, "h");
  }
}

/* ---- treelstm / treelstm-2type ---- */
static void lstm_leaf(const char *w, int H, double *h, double *c) {
  double x[MAXH], g[3 * MAXH];
  embed(w, H, x);
  mv(T("leaf.W"), H, 0, 3 * H, x, H, g);
  const float *b = T("leaf.b");
  for (int j = 0; j < 3 * H; j++) g[j] += b[j];
  for (int j = 0; j < H; j++) {
    c[j] = sg(g[j]) * tanh(g[2 * H + j]);
    h[j] = sg(g[H + j]) * tanh(c[j]);
  }
}

static void lstm_internal(const char *pre, int H, const double *h1,
                          const double *c1, const double *h2,
                          const double *c2, double *h, double *c) {
  char un[32], bn[32];
  snprintf(un, sizeof(un), "%s.U", pre);
  snprintf(bn, sizeof(bn), "%s.b", pre);
  double x[2 * MAXH], g[5 * MAXH];
  for (int j = 0; j < H; j++) x[j] = h1[j], x[H + j] = h2 ? h2[j] : 0;
  mv(T(un), 2 * H, 0, 5 * H, x, 2 * H, g);
  const float *b = T(bn);
  for (int j = 0; j < 5 * H; j++) g[j] += b[j];
  for (int j = 0; j < H; j++) {
    c[j] = sg(g[j]) * tanh(g[4 * H + j]) + sg(g[H + j]) * c1[j] +
           (c2 ? sg(g[2 * H + j]) * c2[j] : 0);
    h[j] = sg(g[3 * H + j]) * tanh(c[j]);
  }
}

static void treelstm_cases(const char *family, const char *int_a,
                           const char *int_b) {
  char dir[256];
  const int H = 8;
  cn_model *m = tu_model(family, H, H, "trees-binary.jsonl", dir, sizeof(dir));
  M = m;
  double h1[MAXH], c1[MAXH], h2[MAXH], c2[MAXH], h[MAXH], c[MAXH];
  json_t *o = run1("(N the)");
  lstm_leaf("the", H, h1, c1);
  check_node(o, 0, h1, H);
  json_decref(o);

  o = run1("(S (W the) (N of))");
  lstm_leaf("of", H, h2, c2);
  lstm_internal(int_a, H, h1, c1, h2, c2, h, c);
  check_node(o, 0, h, H);
  check_node(o, 1, h1, H);
  check_node(o, 2, h2, H);
  json_decref(o);

  o = run1("(NP (W the) (N of))"); /* NP is a type_b label of the demo */
  lstm_internal(int_b, H, h1, c1, h2, c2, h, c);
  check_node(o, 0, h, H);
  json_decref(o);

  o = run1("(S (W the))"); /* unary: the second child is zero */
  lstm_internal(int_a, H, h1, c1, NULL, NULL, h, c);
  check_node(o, 0, h, H);
  json_decref(o);
  cn_model_free(m);
  tu_rmdir(dir);
}

Test(tiny, treelstm) { treelstm_cases("treelstm", "internal", "internal"); }
Test(tiny, treelstm_2type) {
  treelstm_cases("treelstm-2type", "internal_a", "internal_b");
}

/* ---- treegru ---- */
static void gru_leaf(const char *w, int H, double *h) {
  double x[MAXH];
  embed(w, H, x);
  mv(T("leaf.W"), H, 0, H, x, H, h);
  const float *b = T("leaf.b");
  for (int j = 0; j < H; j++) h[j] = tanh(h[j] + b[j]);
}

Test(tiny, treegru) {
  char dir[256];
  const int H = 8;
  cn_model *m = tu_model("treegru", H, H, "trees-binary.jsonl", dir,
                         sizeof(dir));
  M = m;
  double h1[MAXH], h2[MAXH], h[MAXH];
  json_t *o = run1("(N the)");
  gru_leaf("the", H, h1);
  check_node(o, 0, h1, H);
  json_decref(o);
  gru_leaf("of", H, h2);
  for (int unary = 0; unary < 2; unary++) {
    double x[2 * MAXH], g[3 * MAXH], rx[2 * MAXH], nn[MAXH];
    double *k2 = unary ? NULL : h2;
    for (int j = 0; j < H; j++) x[j] = h1[j], x[H + j] = k2 ? k2[j] : 0;
    mv(T("internal.Ug"), 2 * H, 0, 3 * H, x, 2 * H, g);
    const float *bg = T("internal.bg"), *bn = T("internal.bn");
    for (int j = 0; j < 3 * H; j++) g[j] = sg(g[j] + bg[j]);
    for (int j = 0; j < 2 * H; j++) rx[j] = g[j] * x[j];
    mv(T("internal.Un"), 2 * H, 0, H, rx, 2 * H, nn);
    for (int j = 0; j < H; j++) {
      double z = g[2 * H + j];
      h[j] = z * (x[j] + x[H + j]) / 2 + (1 - z) * tanh(nn[j] + bn[j]);
    }
    o = run1(unary ? "(S (W the))" : "(S (W the) (N of))");
    check_node(o, 0, h, H);
    json_decref(o);
  }
  cn_model_free(m);
  tu_rmdir(dir);
}

/* ---- childsum-treelstm: a leaf, then a node with three children ---- */
static void cs_node(int H, const double *x, int K, double hk[][MAXH],
                    double ck[][MAXH], double *h, double *c) {
  double hs[MAXH] = {0}, wx[4 * MAXH], uh[4 * MAXH];
  for (int k = 0; k < K; k++)
    for (int j = 0; j < H; j++) hs[j] += hk[k][j];
  mv(T("cell.W"), H, 0, 4 * H, x, H, wx);
  mv(T("cell.U"), H, 0, 4 * H, hs, H, uh);
  const float *b = T("cell.b");
  for (int j = 0; j < H; j++) {
    double i = sg(wx[j] + uh[j] + b[j]);
    double o = sg(wx[2 * H + j] + uh[2 * H + j] + b[2 * H + j]);
    double u = tanh(wx[3 * H + j] + uh[3 * H + j] + b[3 * H + j]);
    c[j] = i * u;
    for (int k = 0; k < K; k++) {
      double uf = 0;
      for (int l = 0; l < H; l++)
        uf += (double)T("cell.U")[(size_t)(H + j) * H + l] * hk[k][l];
      c[j] += sg(wx[H + j] + uf + b[H + j]) * ck[k][j];
    }
    h[j] = o * tanh(c[j]);
  }
}

Test(tiny, childsum) {
  char dir[256];
  const int H = 8;
  cn_model *m = tu_model("childsum-treelstm", H, H, "trees-nary.jsonl", dir,
                         sizeof(dir));
  M = m;
  const char *w[3] = {"the", "of", "a"};
  double hk[3][MAXH], ck[3][MAXH], x[MAXH], zero[MAXH] = {0}, h[MAXH],
      c[MAXH];
  for (int k = 0; k < 3; k++) {
    embed(w[k], H, x);
    cs_node(H, x, 0, NULL, NULL, hk[k], ck[k]);
  }
  json_t *o = run1("(N the)");
  check_node(o, 0, hk[0], H);
  json_decref(o);
  cs_node(H, zero, 3, hk, ck, h, c);
  o = run1("(S (W the) (N of) (A a))");
  check_node(o, 0, h, H);
  for (int k = 0; k < 3; k++) check_node(o, k + 1, hk[k], H);
  json_decref(o);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* ---- mvrnn ---- */
Test(tiny, mvrnn) {
  char dir[256];
  const int H = 6;
  cn_model *m = tu_model("mvrnn", H, H, "trees-binary.jsonl", dir,
                         sizeof(dir));
  M = m;
  const cn_tensor *lm = cn_safetensors_find(&M->st, "leaf.M");
  cr_assert_not_null(lm);
  int64_t K = lm->shape[0];
  double a[MAXH], b[MAXH], A[MAXH * MAXH], B[MAXH * MAXH];
  int ia = wid("the"), ib = wid("of");
  embed("the", H, a);
  embed("of", H, b);
  for (int i = 0; i < H * H; i++) {
    A[i] = lm->data[(size_t)(ia < K ? ia : 0) * H * H + i];
    B[i] = lm->data[(size_t)(ib < K ? ib : 0) * H * H + i];
  }
  json_t *o = run1("(N the)");
  check_node(o, 0, a, H);
  json_decref(o);
  for (int unary = 0; unary < 2; unary++) {
    double x[2 * MAXH], p[MAXH];
    for (int i = 0; i < H; i++) {
      double ba = 0, ab = 0;
      for (int j = 0; j < H; j++) {
        ba += (unary ? (i == j) : B[i * H + j]) * a[j];
        ab += A[i * H + j] * (unary ? 0 : b[j]);
      }
      x[i] = ba;
      x[H + i] = ab;
    }
    mv(T("internal.W"), 2 * H, 0, H, x, 2 * H, p);
    const float *bi = T("internal.b");
    for (int i = 0; i < H; i++) p[i] = tanh(p[i] + bi[i]);
    o = run1(unary ? "(S (W the))" : "(S (W the) (N of))");
    check_node(o, 0, p, H);
    json_decref(o);
  }
  /* The matrix P only shows through a parent: check ((the of) the). */
  double P[MAXH * MAXH], p1[MAXH], x[2 * MAXH], p2[MAXH];
  const float *WM = T("internal.WM");
  for (int i = 0; i < H; i++)
    for (int j = 0; j < H; j++) {
      double s = 0;
      for (int k = 0; k < H; k++)
        s += WM[i * 2 * H + k] * A[k * H + j] + WM[i * 2 * H + H + k] * B[k * H + j];
      P[i * H + j] = s;
    }
  for (int i = 0; i < H; i++) { /* p1 = node (the of) */
    double ba = 0, ab = 0;
    for (int j = 0; j < H; j++) ba += B[i * H + j] * a[j], ab += A[i * H + j] * b[j];
    x[i] = ba, x[H + i] = ab;
  }
  mv(T("internal.W"), 2 * H, 0, H, x, 2 * H, p1);
  for (int i = 0; i < H; i++) p1[i] = tanh(p1[i] + T("internal.b")[i]);
  for (int i = 0; i < H; i++) { /* root: children (p1, P), (a, A) */
    double ba = 0, ab = 0;
    for (int j = 0; j < H; j++) ba += A[i * H + j] * p1[j], ab += P[i * H + j] * a[j];
    x[i] = ba, x[H + i] = ab;
  }
  mv(T("internal.W"), 2 * H, 0, H, x, 2 * H, p2);
  for (int i = 0; i < H; i++) p2[i] = tanh(p2[i] + T("internal.b")[i]);
  o = run1("(S (S (W the) (N of)) (W the))");
  check_node(o, 0, p2, H);
  check_node(o, 1, p1, H);
  json_decref(o);
  cn_model_free(m);
  tu_rmdir(dir);
}
