/* test_cells_json.c - models described by cells (model.json "family":
 * "cells", docs/cells.md; the descriptions in tests/cells/, written by
 * tests/cells/gen_cells.py):
 *   - the built-in families the IR expresses, described as cells over the
 *     same weights, equal their hand-written kernels (1e-5);
 *   - three cells that are not built in (a peephole Tree-LSTM, a ReLU
 *     child-sum tree GRU with a label type, an Elman tagger) and one using
 *     every op equal a plain one-vertex-at-a-time evaluation written here
 *     from their equations (1e-4), and batched equals unbatched under
 *     every policy and layout;
 *   - every malformed description is refused naming the type and the op;
 *   - what `canopy model info` reports for a cells model. */
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
typedef struct builtin {
  const char *family, *data;
} builtin;

static const builtin builtins[] = {
    {"treelstm", "trees-binary.jsonl"},
    {"treelstm-2type", "trees-binary.jsonl"},
    {"treegru", "trees-binary.jsonl"},
    {"bilstm-tagger", "sequences.jsonl"},
    {"latticegru", "dags.jsonl"},
};

Test(cells_json, builtins_as_cells_equal_hand_written, .timeout = 300) {
  for (size_t b = 0; b < CN_ARRAY_SIZE(builtins); b++) {
    char dir[256];
    cn_model *ref_m = tu_model(builtins[b].family, H, D, builtins[b].data,
                               dir, sizeof(dir));
    json_t *j = cells_json(builtins[b].family);
    cn_model *m;
    cn_err e;
    cr_assert_eq(load_cells(dir, j, &m, &e), 0, "%s: %s",
                 builtins[b].family, e.msg);
    cr_assert_eq(cn_model_n_types(m), cn_model_n_types(ref_m));
    for (int t = 0; t < cn_model_n_types(m); t++)
      cr_assert_str_eq(cn_model_type_name(m, t), cn_model_type_name(ref_m, t));
    json_t *in = tu_data_lines(builtins[b].data, 60);
    unsigned flags = CN_OUT_ALL | CN_OUT_HIDDEN;
    tu_layout = CN_LAYOUT_FUSED; /* the hand-written kernels */
    json_t *ref = tu_run(ref_m, in, CN_POLICY_NONE, 1, flags, NULL, NULL);
    for (int l = CN_LAYOUT_FUSED; l <= CN_LAYOUT_PQ; l++)
      for (int p = 0; p < CN_POLICY__COUNT; p++) {
        tu_layout = (cn_layout)l;
        json_t *got = tu_run(m, in, (cn_policy_kind)p, 64, flags, NULL, NULL);
        double d = tu_json_maxdiff(ref, got);
        cr_expect_leq(d, 1e-5, "%s as cells, layout %s, policy %s: diff %g",
                      builtins[b].family, cn_layout_name((cn_layout)l),
                      cn_policy_name((cn_policy_kind)p), d);
        json_decref(got);
      }
    tu_layout = CN_LAYOUT_FUSED;
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
    const builtin *bi = NULL;
    for (size_t b = 0; b < CN_ARRAY_SIZE(builtins); b++)
      if (strcmp(builtins[b].family, fams[f]) == 0) bi = &builtins[b];
    cn_model *ref_m = tu_model(bi->family, H, D, bi->data, dir, sizeof(dir));
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
    tu_layout = CN_LAYOUT_FUSED;
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
    for (int l = CN_LAYOUT_FUSED; l <= CN_LAYOUT_PQ; l++)
      for (int p = 0; p < CN_POLICY__COUNT; p++) {
        tu_layout = (cn_layout)l;
        json_t *got = tu_run(m, in, (cn_policy_kind)p, 64, flags, NULL, NULL);
        double d = tu_json_maxdiff(ref, got);
        cr_expect_leq(d, 1e-5, "%s layout %s policy %s: diff %g",
                      customs[k].name, cn_layout_name((cn_layout)l),
                      cn_policy_name((cn_policy_kind)p), d);
        json_decref(got);
      }
    tu_layout = CN_LAYOUT_FUSED;
    json_decref(ref);
    json_decref(in);
    cn_model_free(m);
    tu_rmdir(dir);
  }
}

/* ---- malformed descriptions ---------------------------------------------- */
static json_t *ops_of(json_t *j, int type) {
  return json_object_get(
      json_array_get(json_object_get(json_object_get(j, "cells"), "types"),
                     (size_t)type),
      "ops");
}

static json_t *op_of(json_t *j, int type, int i) {
  return json_array_get(ops_of(j, type), (size_t)i);
}

/* Loads j against the built-in treelstm's weights and expects a refusal
 * whose message holds each of the want strings. */
static void refused(const char *dir, json_t *j, const char *what,
                    const char *const *want) {
  cn_model *m;
  cn_err e;
  int rc = load_cells(dir, j, &m, &e);
  cr_expect_eq(rc, CN_E_BAD_MODEL, "%s: loaded (rc %d)", what, rc);
  for (int k = 0; want[k] != NULL; k++)
    cr_expect(strstr(e.msg, want[k]) != NULL, "%s: '%s' lacks '%s'", what,
              e.msg, want[k]);
  cn_model_free(m);
  json_decref(j);
}

#define REFUSED(what, j, ...)                                                \
  refused(dir, j, what, (const char *const[]){__VA_ARGS__, NULL})

Test(cells_json, malformed_refused_with_the_op_named, .timeout = 120) {
  char dir[256];
  cn_model *ref_m = tu_model("treelstm", H, D, "trees-binary.jsonl", dir,
                             sizeof(dir));
  cn_model_free(ref_m);
  json_t *j;
  /* The description itself loads. */
  {
    cn_model *m;
    cn_err e;
    j = cells_json("treelstm");
    cr_assert_eq(load_cells(dir, j, &m, &e), 0, "%s", e.msg);
    cn_model_free(m);
    json_decref(j);
  }
  /* internal: 0 h1, 1 c1, 2 h2, 3 c2, 4 g, 5 sg, ... */
  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 5), "op", json_string("softplus"));
  REFUSED("unknown op", j, "type 'internal' op 5 'sg'", "unknown op "
          "'softplus'");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 5), "a", json_string("h1"));
  json_object_set_new(op_of(j, 1, 5), "width", json_integer(5 * H));
  REFUSED("declared width", j, "op 5 'sg' (sigmoid)", "width mismatch");

  j = cells_json("treelstm");
  { /* iu = i ⊙ u with u replaced by g (5H) */
    json_t *ops = ops_of(j, 1);
    for (size_t i = 0; i < json_array_size(ops); i++)
      if (strcmp(json_string_value(json_object_get(json_array_get(ops, i),
                                                   "name")), "iu") == 0) {
        json_object_set_new(json_array_get(ops, i), "b", json_string("g"));
        char want[64];
        snprintf(want, sizeof(want), "op %zu 'iu' (mul)", i);
        REFUSED("operand widths", j, want, "width mismatch", "is 16 wide",
                "80");
        break;
      }
  }

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 4), "weight", json_string("internal.Q"));
  REFUSED("missing tensor", j, "op 4 'g' (linear)",
          "tensor 'internal.Q' is missing");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 4), "x", json_string("h1"));
  json_object_del(op_of(j, 1, 4), "width");
  REFUSED("tensor shape", j, "op 4 'g' (linear)",
          "weight 'internal.U' must be [N, 16]");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 0, 0), "tensor", json_string("leaf.W"));
  REFUSED("embedding shape", j, "type 'leaf' op 0 'x' (embed)",
          "must be [V, D]");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 4), "bias", json_string("leaf.b"));
  REFUSED("bias shape", j, "op 4 'g'", "bias 'leaf.b' must be [80]");

  j = cells_json("treelstm");
  json_object_del(op_of(j, 0, 1), "bias");
  REFUSED("unused tensor", j, "tensor 'leaf.b'", "used by no op");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 5), "a", json_string("tc"));
  REFUSED("later op by name", j, "op 5 'sg'", "refers to 'tc'",
          "does not come before it");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 5), "a", json_integer(5));
  REFUSED("itself (a cycle)", j, "op 5 'sg'", "refers to op 5",
          "no cycles");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 5), "a", json_integer(9));
  REFUSED("later op by index", j, "op 5 'sg'", "refers to op 9");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 5), "a", json_string("nothing"));
  REFUSED("unknown name", j, "op 5 'sg'", "which no op is named");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 4), "bais", json_string("internal.b"));
  REFUSED("unknown key", j, "op 4 'g'", "unknown key 'bais'");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 1), "cols",
                      json_pack("[ii]", H, 3 * H));
  REFUSED("input beyond the state", j, "op 1 'c1' (input)",
          "within [0, 32)");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 0), "edge", json_integer(2));
  REFUSED("edge beyond the arity", j, "op 0 'h1'", "at most 2 children");

  j = cells_json("treelstm");
  json_array_remove(json_object_get(json_array_get(json_object_get(
                        json_object_get(j, "cells"), "types"), 1), "state"),
                    1);
  REFUSED("state width", j, "type 'internal'", "'state' is 16 floats",
          "cells.state is 32");

  j = cells_json("treelstm");
  json_array_set_new(json_object_get(json_array_get(json_object_get(
                         json_object_get(j, "cells"), "types"), 1), "state"),
                     1, json_string("cc"));
  REFUSED("state names no op", j, "type 'internal': 'state' refers to 'cc'",
          "which no op is named");

  j = cells_json("treelstm");
  json_object_set_new(json_object_get(j, "cells"), "output",
                      json_pack("{s:[ii], s:s, s:s}", "from", 0, 2 * H,
                                "weight", "out.W", "bias", "out.b"));
  REFUSED("output weight", j, "type 'output'", "weight 'out.W' must be",
          "[5, 32]");

  j = cells_json("treelstm");
  json_object_set_new(json_array_get(json_object_get(
                          json_object_get(j, "cells"), "types"), 1),
                      "when", json_string("leaf"));
  REFUSED("two leaf types", j, "exactly one type", "\"leaf\"");

  j = cells_json("treelstm");
  json_object_set_new(json_array_get(json_object_get(
                          json_object_get(j, "cells"), "types"), 1),
                      "when", json_string("step"));
  REFUSED("a sequence's type in a tree", j, "type 'internal'",
          "'when' must be");

  j = cells_json("treelstm");
  json_object_set_new(json_object_get(j, "cells"), "structure",
                      json_string("graph"));
  REFUSED("unknown structure", j, "'structure' must be");

  /* More ops than a type may hold. */
  j = cells_json("treelstm");
  {
    json_t *ops = ops_of(j, 0);
    while (json_array_size(ops) <= 256)
      json_array_append_new(ops, json_pack("{s:s, s:i}", "op", "tanh", "a",
                                           0));
    REFUSED("too many ops", j, "type 'leaf'", "1 to 256 ops");
  }
  /* Few ops, but more IR nodes than CN_IR_MAX once lowered: every op of
   * the chain works on 12 pieces. */
  j = cells_json("treelstm");
  {
    json_t *ops = ops_of(j, 0);
    json_t *pieces = json_array();
    for (int k = 0; k < D; k++) {
      json_t *o = json_pack("{s:s, s:s, s:[ii]}", "op", "slice", "a", "x",
                            "cols", k, k + 1);
      json_object_set_new(o, "name", json_sprintf("p%d", k));
      json_array_append_new(ops, o);
      json_array_append_new(pieces, json_sprintf("p%d", k));
    }
    json_array_append_new(ops, json_pack("{s:s, s:s, s:o}", "name", "cat",
                                         "op", "concat", "x", pieces));
    const char *prev = "cat";
    char names[40][8];
    for (int k = 0; k < 40; k++) {
      snprintf(names[k], sizeof(names[k]), "t%d", k);
      json_array_append_new(ops, json_pack("{s:s, s:s, s:s}", "name",
                                           names[k], "op", "tanh", "a", prev));
      prev = names[k];
    }
    json_t *st = json_object_get(json_array_get(json_object_get(
        json_object_get(j, "cells"), "types"), 0), "state");
    json_array_clear(st);
    json_array_append_new(st, json_string("h"));
    json_array_append_new(st, json_string("c"));
    json_array_append_new(st, json_string(prev));
    REFUSED("too many IR nodes", j, "type 'leaf'", "more than 256 IR nodes");
  }
  /* Within the IR's size but beyond what one compiled cell holds: nine
   * products over nine different inputs. */
  j = cells_json("treelstm");
  {
    json_t *ops = ops_of(j, 0);
    char prev[16] = "";
    for (int k = 0; k < 9; k++) {
      json_t *x = json_array(), *o;
      for (int q = 0; q < D; q++) json_array_append_new(x, json_sprintf("p%d", k));
      o = json_pack("{s:s, s:s, s:[ii]}", "op", "slice", "a", "x", "cols", k,
                    k + 1);
      json_object_set_new(o, "name", json_sprintf("p%d", k));
      json_array_append_new(ops, o);
      o = json_pack("{s:s, s:o, s:s, s:[ii]}", "op", "linear", "x", x,
                    "weight", "leaf.W", "rows", 0, H);
      json_object_set_new(o, "name", json_sprintf("l%d", k));
      json_array_append_new(ops, o);
      if (k > 0) {
        o = json_pack("{s:s, s:s}", "op", "add", "a", prev);
        json_object_set_new(o, "b", json_sprintf("l%d", k));
        json_object_set_new(o, "name", json_sprintf("s%d", k));
        json_array_append_new(ops, o);
        snprintf(prev, sizeof(prev), "s%d", k);
      } else {
        snprintf(prev, sizeof(prev), "l0");
      }
    }
    json_array_append_new(ops, json_pack("{s:s, s:s, s:s}", "name", "t",
                                         "op", "tanh", "a", prev));
    json_t *st = json_object_get(json_array_get(json_object_get(
        json_object_get(j, "cells"), "types"), 0), "state");
    json_array_set_new(st, 1, json_string("t"));
    REFUSED("beyond the compiler's limits", j, "the leaf cell could not be "
            "compiled", "more than 8 products");
  }
  tu_rmdir(dir);
}

/* A node's type by its label (treelstm-2type's NP and PP as cells). */
Test(cells_json, label_types_choose_vertices) {
  char dir[256];
  cn_model *ref_m = tu_model("treelstm-2type", H, D, "trees-binary.jsonl",
                             dir, sizeof(dir));
  json_t *j = cells_json("treelstm-2type");
  cn_model *m;
  cn_err e;
  cr_assert_eq(load_cells(dir, j, &m, &e), 0, "%s", e.msg);
  json_t *in = json_pack("{s:s}", "tree", "(S (NP (W a) (W b)) (VP (W c) "
                         "(PP (W d) (W e))))");
  cn_instance *inst;
  cr_assert_eq(cn_instance_parse(m, in, NULL, 0, &inst, &e), 0, "%s", e.msg);
  /* pre-order: S, NP, (W a), (W b), VP, (W c), PP, (W d), (W e) */
  const char *want[] = {"internal_a", "internal_b", "leaf", "leaf",
                        "internal_a", "leaf", "internal_b", "leaf", "leaf"};
  cr_assert_eq(inst->tree.n_nodes, 9);
  for (int i = 0; i < inst->tree.n_nodes; i++)
    cr_expect_str_eq(cn_model_type_name(m, inst->node_type[i]), want[i],
                     "node %d", i);
  cn_instance_free(inst);
  json_decref(in);
  json_decref(j);
  cn_model_free(m);
  cn_model_free(ref_m);
  tu_rmdir(dir);
}

/* docs/cells.md's example (the first ```json block after "## model.json:
 * cells") loads over a treelstm of its sizes and answers as the
 * hand-written treelstm does: the documented format is the one served. */
Test(cells_json, docs_example_is_served, .timeout = 120) {
  const char *docs = getenv("CANOPY_DOCS");
  cr_assert_not_null(docs, "CANOPY_DOCS (docs/) is not set");
  char path[512];
  snprintf(path, sizeof(path), "%s/cells.md", docs);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  static char text[1 << 17];
  size_t n = fread(text, 1, sizeof(text) - 1, f);
  fclose(f);
  text[n] = '\0';
  const char *sec = strstr(text, "## model.json: cells");
  cr_assert_not_null(sec);
  const char *b = strstr(sec, "```json\n");
  cr_assert_not_null(b);
  b += 8;
  const char *e = strstr(b, "```");
  cr_assert_not_null(e);
  json_error_t je;
  json_t *j = json_loadb(b, (size_t)(e - b), 0, &je);
  cr_assert_not_null(j, "docs example: line %d: %s", je.line, je.text);
  char dir[256];
  cn_model *ref_m = tu_model("treelstm", 128, 128, "trees-binary.jsonl",
                             dir, sizeof(dir));
  cn_model *m;
  cn_err err;
  cr_assert_eq(load_cells(dir, j, &m, &err), 0, "docs example: %s", err.msg);
  json_t *in = tu_data_lines("trees-binary.jsonl", 20);
  unsigned flags = CN_OUT_ALL | CN_OUT_HIDDEN;
  json_t *ref = tu_run(ref_m, in, CN_POLICY_NONE, 1, flags, NULL, NULL);
  json_t *got = tu_run(m, in, CN_POLICY_AGENDA, 20, flags, NULL, NULL);
  double d = tu_json_maxdiff(ref, got);
  cr_expect_leq(d, 1e-5, "docs example against treelstm: %g", d);
  json_decref(ref);
  json_decref(got);
  json_decref(in);
  json_decref(j);
  cn_model_free(m);
  cn_model_free(ref_m);
  tu_rmdir(dir);
}

/* A learned batching policy is cached by the model's key: two cells
 * descriptions over the same weights and type names are different graphs,
 * so they must not share one; the same description loaded twice does. */
Test(cells_json, policy_key_follows_the_description) {
  char dir[256];
  cn_model *ref_m = tu_model("treelstm", H, D, "trees-binary.jsonl", dir,
                             sizeof(dir));
  cn_model *m[3];
  cn_err e;
  for (int k = 0; k < 3; k++) {
    json_t *j = cells_json("treelstm");
    if (k == 2) /* another cell: tanh where treelstm has σ */
      json_object_set_new(op_of(j, 1, 5), "op", json_string("tanh"));
    cr_assert_eq(load_cells(dir, j, &m[k], &e), 0, "%s", e.msg);
    json_decref(j);
  }
  uint64_t k0 = cn__fsm_model_key(m[0], CN_FSM_ENC_BOUND);
  cr_expect_eq(k0, cn__fsm_model_key(m[1], CN_FSM_ENC_BOUND));
  cr_expect_neq(k0, cn__fsm_model_key(m[2], CN_FSM_ENC_BOUND));
  cr_expect_neq(k0, cn__fsm_model_key(ref_m, CN_FSM_ENC_BOUND));
  for (int k = 0; k < 3; k++) cn_model_free(m[k]);
  cn_model_free(ref_m);
  tu_rmdir(dir);
}
