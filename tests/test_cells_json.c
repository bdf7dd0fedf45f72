/* test_cells_json.c - models described by cells (model.json "family":
 * "cells", docs/cells.md; the descriptions in tests/cells/, written by
 * tests/cells/gen_cells.py):
 *   - the built-in families, described as cells over the same weights
 *     (the JSON the Python tracer writes, not the C builders of
 *     core/families/), equal the built-ins run one instance at a time
 *     (1e-5);
 *   - three cells that are not built in (a peephole Tree-LSTM, a ReLU
 *     child-sum tree GRU with a label type, an Elman tagger) and one using
 *     every op equal a plain one-vertex-at-a-time evaluation written here
 *     from their equations (1e-4), and batched equals unbatched under
 *     every policy and layout.
 * test_cells_refused.c has the malformed descriptions and the rest. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cells_test_util.h"
#include "engine_util.h"
#include "families/families.h"
#include "internal.h"
#include "sched/fsm_impl.h"

#define H 16
#define D 12
#define C 5

/* ---- the built-ins as cells ------------------------------------------------ */
/* The built-in families written as cells (tests/cells), each with its
 * data file. */
typedef struct builtin {
  const char *family, *data;
} builtin;

static builtin builtin_of(const char *family) {
  builtin b = {family, tu_data_for(family)};
  cr_assert_not_null(b.data, "no family %s", family);
  return b;
}

static const char *const builtins[] = {
    "treelstm", "treelstm-2type", "treegru",   "childsum-treelstm",
    "mvrnn",    "bilstm-tagger",  "latticegru",
};

Test(cells_json, builtins_as_cells_equal_builtins, .timeout = 300) {
  for (size_t k = 0; k < CN_ARRAY_SIZE(builtins); k++) {
    builtin b = builtin_of(builtins[k]);
    char dir[256];
    /* mvrnn's embedding is its vector: D = H */
    int dd = strcmp(b.family, "mvrnn") == 0 ? H : D;
    cn_model *ref_m = tu_model(b.family, H, dd, b.data, dir, sizeof(dir));
    json_t *j = cells_json(b.family);
    cn_model *m;
    cn_err e;
    cr_assert_eq(load_cells(dir, j, &m, &e), 0, "%s: %s", b.family, e.msg);
    cr_assert_eq(cn_model_n_types(m), cn_model_n_types(ref_m));
    for (int t = 0; t < cn_model_n_types(m); t++)
      cr_assert_str_eq(cn_model_type_name(m, t), cn_model_type_name(ref_m, t));
    json_t *in = tu_data_lines(b.data, 60);
    unsigned flags = CN_OUT_ALL | CN_OUT_HIDDEN;
    tu_layout = CN_LAYOUT_PQ; /* the built-in's own IR, unbatched */
    json_t *ref = tu_run(ref_m, in, CN_POLICY_NONE, 1, flags, NULL, NULL);
    for (int l = 0; l < CN_LAYOUT__COUNT; l++)
      for (int p = 0; p < CN_POLICY__COUNT; p++) {
        tu_layout = (cn_layout)l;
        json_t *got = tu_run(m, in, (cn_policy_kind)p, 64, flags, NULL, NULL);
        double d = tu_json_maxdiff(ref, got);
        cr_expect_leq(d, 1e-5, "%s as cells, layout %s, policy %s: diff %g",
                      b.family, cn_layout_name((cn_layout)l),
                      cn_policy_name((cn_policy_kind)p), d);
        json_decref(got);
      }
    tu_layout = CN_LAYOUT_PQ;
    json_decref(ref);
    json_decref(in);
    json_decref(j);
    cn_model_free(m);
    cn_model_free(ref_m);
    tu_rmdir(dir);
  }
}

/* The same products and kernels as the built-in's own IR: the folding of
 * slices and concats loses nothing the compiler could merge. */
Test(cells_json, compiles_like_the_built_in) {
  const char *fams[] = {"treelstm", "treegru", "bilstm-tagger",
                        "latticegru"};
  for (size_t f = 0; f < CN_ARRAY_SIZE(fams); f++) {
    char dir[256];
    builtin bi = builtin_of(fams[f]);
    cn_model *ref_m = tu_model(bi.family, H, D, bi.data, dir, sizeof(dir));
    json_t *j = cells_json(fams[f]);
    cn_model *m;
    cn_err e;
    cr_assert_eq(load_cells(dir, j, &m, &e), 0, "%s", e.msg);
    for (int t = 0; t < cn_model_n_types(m); t++)
      for (int l = 0; l < 2; l++) {
        const cn_cell *a = ref_m->cell[l][t], *c = m->cell[l][t];
        cr_assert_not_null(c);
        if (a == NULL) continue;
        cr_expect_eq(c->n_gemm, a->n_gemm, "%s %s: products %d vs %d",
                     fams[f], cn_model_type_name(m, t), c->n_gemm, a->n_gemm);
        cr_expect_eq(c->kernels, a->kernels, "%s %s layout %d: kernels %d "
                     "vs %d", fams[f], cn_model_type_name(m, t), l,
                     c->kernels, a->kernels);
      }
    json_t *info = cn_model_describe_cells(m);
    json_t *leaf = json_object_get(info, cn_model_type_name(m, 0));
    cr_assert_not_null(json_object_get(leaf, "pq"));
    cr_assert_not_null(json_object_get(leaf, "naive"));
    cr_assert_gt(json_integer_value(json_object_get(
                     json_object_get(leaf, "pq"), "fused_kernels")), 0);
    json_decref(info);
    json_t *d = cn_model_describe(m);
    cr_assert_str_eq(json_string_value(json_object_get(d, "family")),
                     "cells");
    cr_assert_eq(json_integer_value(json_object_get(d, "hidden")), H);
    cr_assert_eq(json_integer_value(json_object_get(d, "embed")), D);
    cr_assert_not_null(json_string_value(json_object_get(d, "structure")));
    json_decref(d);
    json_decref(j);
    cn_model_free(m);
    cn_model_free(ref_m);
    tu_rmdir(dir);
  }
}

/* ---- cells that are not built in, against a plain evaluation ---------------- */
typedef struct wt {
  const char *name;
  int ndim;
  int64_t shape[2];
} wt;

static uint64_t rng = 12345;
static float uni(void) { /* U(-0.5, 0.5) */
  return (float)((cn__splitmix64(&rng) >> 40) / (double)(1 << 24)) - 0.5f;
}

/* Random weights for the listed tensors into dir/c/weights.safetensors. */
static void write_weights(const char *dir, const wt *w, int n) {
  char c[600], p[700];
  snprintf(c, sizeof(c), "%s/c", dir);
  mkdir(c, 0700);
  snprintf(p, sizeof(p), "%s/weights.safetensors", c);
  cn_tensor_out t[16];
  float *data[16];
  for (int i = 0; i < n; i++) {
    int64_t numel = 1;
    t[i] = (cn_tensor_out){.name = w[i].name, .ndim = w[i].ndim};
    for (int k = 0; k < w[i].ndim; k++)
      numel *= t[i].shape[k] = w[i].shape[k];
    data[i] = malloc((size_t)numel * sizeof(float));
    for (int64_t k = 0; k < numel; k++) data[i][k] = uni();
    t[i].data = data[i];
  }
  cn_err e;
  cr_assert_eq(cn_safetensors_write(p, t, n, &e), 0, "%s", e.msg);
  for (int i = 0; i < n; i++) free(data[i]);
}

static const float *W(const cn_model *m, const char *name) {
  const cn_tensor *t = cn_safetensors_find(&m->st, name);
  cr_assert_not_null(t, "%s", name);
  return t->data;
}

static float sig(float x) { return 1.0f / (1.0f + expf(-x)); }

/* y[r0 .. r0 + n) = A[r0.., :] x + b (b may be NULL); A [*, k]. */
static void matvec(float *y, const float *A, const float *b, const float *x,
                   int r0, int n, int k) {
  for (int i = 0; i < n; i++) {
    double s = b ? b[r0 + i] : 0;
    for (int j = 0; j < k; j++) s += (double)A[(int64_t)(r0 + i) * k + j] * x[j];
    y[i] = (float)s;
  }
}

static json_t *logits_json(const cn_model *m, const float *h, int hw,
                           bool bias) {
  float z[C];
  matvec(z, W(m, "out.W"), bias ? W(m, "out.b") : NULL, h, 0, C, hw);
  return cn__json_floats(z, C);
}

typedef void (*tree_cell)(const cn_model *m, const cn_tree *t,
                          const cn_instance *in, int i, float *const *st,
                          float *out);

/* One tree, node by node (children after their parent in pre-order): the
 * "nodes" logits, root first. */
static json_t *tree_ref(const cn_model *m, const cn_instance *in, int sw,
                        tree_cell f) {
  const cn_tree *t = &in->tree;
  float **st = calloc((size_t)t->n_nodes, sizeof(float *));
  for (int i = t->n_nodes - 1; i >= 0; i--) {
    st[i] = calloc((size_t)sw, sizeof(float));
    f(m, t, in, i, st, st[i]);
  }
  json_t *nodes = json_array();
  for (int i = 0; i < t->n_nodes; i++)
    json_array_append_new(nodes, logits_json(m, st[i], H, true));
  for (int i = 0; i < t->n_nodes; i++) free(st[i]);
  free(st);
  return nodes;
}

/* Child k's state (NULL: none). */
static const float *child(const cn_tree *t, int i, int k, float *const *st) {
  const cn_tree_node *nd = &t->nodes[i];
  return k < nd->n_children ? st[t->children[nd->first_child + k]] : NULL;
}

static void peephole(const cn_model *m, const cn_tree *t,
                     const cn_instance *in, int i, float *const *st,
                     float *out) {
  const float *pe = W(m, "peep");
  float g[5 * H], zero[2 * H] = {0}, *h = out, *c = out + H;
  if (t->nodes[i].n_children == 0) {
    const float *x = W(m, "embed") + (int64_t)in->ids[i] * D;
    matvec(g, W(m, "leaf.W"), W(m, "leaf.b"), x, 0, 3 * H, D);
    for (int q = 0; q < H; q++) {
      c[q] = sig(g[q]) * tanhf(g[2 * H + q]);
      h[q] = sig(g[H + q] + pe[2 * H + q] * c[q]) * tanhf(c[q]);
    }
    return;
  }
  const float *s1 = child(t, i, 0, st), *s2 = child(t, i, 1, st);
  if (s2 == NULL) s2 = zero;
  float x[2 * H];
  memcpy(x, s1, H * sizeof(float));
  memcpy(x + H, s2, H * sizeof(float));
  matvec(g, W(m, "internal.U"), W(m, "internal.b"), x, 0, 5 * H, 2 * H);
  const float *c1 = s1 + H, *c2 = s2 + H;
  for (int q = 0; q < H; q++) {
    float ig = sig(g[q] + pe[q] * (c1[q] + c2[q]));
    float f1 = sig(g[H + q] + pe[H + q] * c1[q]);
    float f2 = sig(g[2 * H + q] + pe[H + q] * c2[q]);
    c[q] = ig * tanhf(g[4 * H + q]) + (f1 * c1[q] + f2 * c2[q]);
    h[q] = sig(g[3 * H + q] + pe[2 * H + q] * c[q]) * tanhf(c[q]);
  }
}

static void relu_gru(const cn_model *m, const cn_tree *t,
                     const cn_instance *in, int i, float *const *st,
                     float *h) {
  const cn_tree_node *nd = &t->nodes[i];
  if (nd->n_children == 0) {
    const float *x = W(m, "embed") + (int64_t)in->ids[i] * D;
    matvec(h, W(m, "leaf.W"), W(m, "leaf.b"), x, 0, H, D);
    for (int q = 0; q < H; q++) h[q] = h[q] > 0 ? h[q] : 0;
    return;
  }
  float s[H] = {0}, mean[H], zr[2 * H], rm[H], n[H];
  for (int k = 0; k < nd->n_children; k++)
    for (int q = 0; q < H; q++) s[q] += child(t, i, k, st)[q];
  for (int q = 0; q < H; q++) mean[q] = s[q] / (float)nd->n_children;
  matvec(zr, W(m, "zr.W"), W(m, "zr.b"), s, 0, 2 * H, H);
  for (int q = 0; q < 2 * H; q++) zr[q] = sig(zr[q]);
  for (int q = 0; q < H; q++) rm[q] = zr[H + q] * mean[q];
  bool np = nd->label != NULL && nd->label_len == 2 &&
            memcmp(nd->label, "NP", 2) == 0;
  matvec(n, W(m, np ? "nb.W" : "n.W"), W(m, "n.b"), rm, 0, H, H);
  for (int q = 0; q < H; q++) {
    float nn = n[q] > 0 ? n[q] : 0;
    h[q] = (1.0f - zr[q]) * nn + zr[q] * mean[q];
  }
}

/* Per-token logits of a sequence cell run left to right. */
typedef void (*seq_cell)(const cn_model *m, const float *x, const float *prev,
                         bool has_prev, float *out);

static json_t *seq_ref(const cn_model *m, const cn_instance *in, int sw,
                       int h0, int hw, bool bias, seq_cell f) {
  float *prev = calloc((size_t)sw, sizeof(float));
  float *s = calloc((size_t)sw, sizeof(float));
  json_t *lg = json_array();
  for (int i = 0; i < in->n; i++) {
    f(m, W(m, "embed") + (int64_t)in->ids[i] * D, prev, i > 0, s);
    json_array_append_new(lg, logits_json(m, s + h0, hw, bias));
    memcpy(prev, s, (size_t)sw * sizeof(float));
  }
  free(prev);
  free(s);
  return lg;
}

static void elman(const cn_model *m, const float *x, const float *prev,
                  bool has_prev, float *h) {
  float xh[D + H];
  memcpy(xh, x, D * sizeof(float));
  memcpy(xh + D, prev, H * sizeof(float));
  matvec(h, W(m, "rnn.W"), W(m, "rnn.b"), xh, 0, H, D + H);
  for (int q = 0; q < H; q++) h[q] = tanhf(h[q]);
}

/* tests/cells/gen_cells.py allops(): state [u | v | w]. */
static void allops(const cn_model *m, const float *x, const float *prev,
                   bool has_prev, float *s) {
  float a[H];
  matvec(a, W(m, "A"), W(m, "ab"), x, H, H, D);
  const float *bw = W(m, "bw");
  for (int q = 0; q < H; q++) {
    float p = prev[q];
    float r = a[q] > 0 ? a[q] : 0;
    s[q] = a[q] / (expf(r) + 1.0f);
    s[H + q] = (1.0f - sig(p)) * (0.5f * tanhf(a[q])) - p;
    /* one input at most: its sum and its mean are the previous step's */
    s[2 * H + q] = prev[H + q] * prev[2 * H + q] + bw[q];
  }
}

typedef struct custom {
  const char *name, *family_for_vocab, *data;
  int n_w;
  wt w[12];
  int state;
} custom;

static const custom customs[] = {
    {"peephole-treelstm", "treelstm", "trees-binary.jsonl", 8,
     {{"embed", 2, {-1, D}}, {"leaf.W", 2, {3 * H, D}}, {"leaf.b", 1, {3 * H}},
      {"internal.U", 2, {5 * H, 2 * H}}, {"internal.b", 1, {5 * H}},
      {"peep", 1, {3 * H}}, {"out.W", 2, {C, H}}, {"out.b", 1, {C}}},
     2 * H},
    {"relu-treegru", "childsum-treelstm", "trees-nary.jsonl", 10,
     {{"embed", 2, {-1, D}}, {"leaf.W", 2, {H, D}}, {"leaf.b", 1, {H}},
      {"zr.W", 2, {2 * H, H}}, {"zr.b", 1, {2 * H}}, {"n.W", 2, {H, H}},
      {"nb.W", 2, {H, H}}, {"n.b", 1, {H}}, {"out.W", 2, {C, H}},
      {"out.b", 1, {C}}},
     H},
    {"elman-tagger", "bilstm-tagger", "sequences.jsonl", 5,
     {{"embed", 2, {-1, D}}, {"rnn.W", 2, {H, D + H}}, {"rnn.b", 1, {H}},
      {"out.W", 2, {C, H}}, {"out.b", 1, {C}}},
     H},
    {"allops", "bilstm-tagger", "sequences.jsonl", 5,
     {{"embed", 2, {-1, D}}, {"A", 2, {2 * H, D}}, {"ab", 1, {2 * H}},
      {"bw", 1, {H}}, {"out.W", 2, {C, 2 * H}}},
     3 * H},
};

/* Loads custom model k (random weights, the built-in's vocabulary). */
static cn_model *load_custom(const custom *cu, char *dir, json_t **in) {
  cn_model *vm = tu_model(cu->family_for_vocab, H, D, cu->data, dir, 256);
  wt w[12];
  int n = cu->n_w;
  memcpy(w, cu->w, sizeof(w));
  w[0].shape[0] = vm->dims.V;
  cn_model_free(vm);
  write_weights(dir, w, n);
  json_t *j = cells_json(cu->name);
  cn_model *m;
  cn_err e;
  cr_assert_eq(load_cells(dir, j, &m, &e), 0, "%s: %s", cu->name, e.msg);
  json_decref(j);
  *in = tu_data_lines(cu->data, 60);
  return m;
}

/* The reference output of instance i, in the shape cn_run_output gives
 * (the fields compared). */
static json_t *reference(const cn_model *m, const custom *cu,
                         const json_t *inst) {
  cn_instance *in;
  cn_err e;
  cr_assert_eq(cn_instance_parse(m, inst, NULL, 0, &in, &e), 0, "%s", e.msg);
  json_t *o = json_object();
  if (strcmp(cu->name, "peephole-treelstm") == 0 ||
      strcmp(cu->name, "relu-treegru") == 0) {
    json_t *nodes = tree_ref(m, in, cu->state,
                             cu->name[0] == 'p' ? peephole : relu_gru);
    json_object_set(o, "logits", json_array_get(nodes, 0));
    json_object_set_new(o, "nodes", nodes);
  } else if (strcmp(cu->name, "elman-tagger") == 0) {
    json_object_set_new(o, "logits", seq_ref(m, in, H, 0, H, true, elman));
  } else {
    json_object_set_new(o, "logits",
                        seq_ref(m, in, 3 * H, H, 2 * H, false, allops));
  }
  cn_instance_free(in);
  return o;
}

/* got's logits (and nodes' logits) against ref's. */
static double diff_logits(const json_t *ref, const json_t *got) {
  double d = tu_json_maxdiff(json_object_get(ref, "logits"),
                             json_object_get(got, "logits"));
  const json_t *rn = json_object_get(ref, "nodes");
  if (rn == NULL) return d;
  const json_t *gn = json_object_get(got, "nodes");
  if (json_array_size(rn) != json_array_size(gn)) return 1e30;
  for (size_t i = 0; i < json_array_size(rn); i++) {
    double e = tu_json_maxdiff(json_array_get(rn, i),
                               json_object_get(json_array_get(gn, i),
                                               "logits"));
    if (e > d) d = e;
  }
  return d;
}

Test(cells_json, custom_cells_equal_plain_evaluation, .timeout = 300) {
  for (size_t k = 0; k < CN_ARRAY_SIZE(customs); k++) {
    char dir[256];
    json_t *in;
    cn_model *m = load_custom(&customs[k], dir, &in);
    tu_layout = CN_LAYOUT_PQ;
    json_t *got = tu_run(m, in, CN_POLICY_AGENDA, 64, CN_OUT_ALL, NULL, NULL);
    double worst = 0;
    for (size_t i = 0; i < json_array_size(in); i++) {
      json_t *ref = reference(m, &customs[k], json_array_get(in, i));
      double d = diff_logits(ref, json_array_get(got, i));
      if (d > worst) worst = d;
      json_decref(ref);
    }
    cr_expect_leq(worst, 1e-4, "%s: batched vs plain evaluation: %g",
                  customs[k].name, worst);
    cr_expect_gt(json_array_size(in), 10);
    tu_layout = CN_LAYOUT_PQ;
    json_decref(got);
    json_decref(in);
    cn_model_free(m);
    tu_rmdir(dir);
  }
}

/* Batched (64 instances a run, every policy, every layout) equals one
 * instance at a time, vertex by vertex. */
Test(cells_json, custom_cells_batched_equal_unbatched, .timeout = 300) {
  for (size_t k = 0; k < CN_ARRAY_SIZE(customs); k++) {
    char dir[256];
    json_t *in;
    cn_model *m = load_custom(&customs[k], dir, &in);
    unsigned flags = CN_OUT_ALL | CN_OUT_HIDDEN;
    tu_layout = CN_LAYOUT_NAIVE;
    json_t *ref = tu_run(m, in, CN_POLICY_NONE, 1, flags, NULL, NULL);
    for (int l = 0; l < CN_LAYOUT__COUNT; l++)
      for (int p = 0; p < CN_POLICY__COUNT; p++) {
        tu_layout = (cn_layout)l;
        json_t *got = tu_run(m, in, (cn_policy_kind)p, 64, flags, NULL, NULL);
        double d = tu_json_maxdiff(ref, got);
        cr_expect_leq(d, 1e-5, "%s layout %s policy %s: diff %g",
                      customs[k].name, cn_layout_name((cn_layout)l),
                      cn_policy_name((cn_policy_kind)p), d);
        json_decref(got);
      }
    tu_layout = CN_LAYOUT_PQ;
    json_decref(ref);
    json_decref(in);
    cn_model_free(m);
    tu_rmdir(dir);
  }
}
