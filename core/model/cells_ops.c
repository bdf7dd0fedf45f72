/* cells_ops.c - the op lists of a model described by its cells
 * (docs/cells.md "Ops"): each op read from its JSON object and checked
 * against the weights (operands earlier in the list, widths, tensor names
 * and shapes), its width derived, and every refusal worded to name the
 * type, the op's index, its name and its op. cells_json.c reads the rest
 * of the description; cells_lower.c lowers the ops to the op IR. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cell/cell.h"
#include "model/cells_impl.h"

/* The ops, with the keys each takes besides "op", "name" and "width". */
static const struct {
  const char *name;
  const char *keys[7];
} op_defs[] = {
    [OP_INPUT] = {"input", {"edge", "cols", "absent"}},
    [OP_INPUT_SUM] = {"input_sum", {"cols"}},
    [OP_INPUT_MEAN] = {"input_mean", {"cols"}},
    [OP_EMBED] = {"embed", {"tensor"}},
    [OP_PARAM] = {"param", {"tensor", "cols"}},
    [OP_LINEAR] = {"linear", {"x", "weight", "bias", "rows"}},
    [OP_ADD] = {"add", {"a", "b"}},
    [OP_SUB] = {"sub", {"a", "b"}},
    [OP_MUL] = {"mul", {"a", "b"}},
    [OP_DIV] = {"div", {"a", "b"}},
    [OP_SIGMOID] = {"sigmoid", {"a"}},
    [OP_TANH] = {"tanh", {"a"}},
    [OP_EXP] = {"exp", {"a"}},
    [OP_RELU] = {"relu", {"a"}},
    [OP_SCALE] = {"scale", {"a", "k"}},
    [OP_RSUB] = {"rsub", {"a", "k"}},
    [OP_SHIFT] = {"shift", {"a", "k"}},
    [OP_SLICE] = {"slice", {"a", "cols"}},
    [OP_CONCAT] = {"concat", {"x"}},
    [OP_INPUT_EACH] = {"input_each", {"cols"}},
    [OP_EDGE_SUM] = {"edge_sum", {"a"}},
    [OP_MATMUL] = {"matmul", {"a", "b", "m", "weight", "rows", "cols"}},
    [OP_TABLE] = {"table", {"tensor"}},
    [OP_STEP] = {"step", {"a"}},
};

/* "model.json: cells: type 'internal' op 7 'mul_3' (mul): ..." */
int cn__cells_op_err(const cells_ctx *c, int i, const char *fmt, ...) {
  char what[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  const jop *o = &c->ops[i];
  if (c->type == NULL) /* a key of "cells" itself */
    return cn_err_set(c->err, CN_E_BAD_MODEL, "%s: cells: %s", c->file, what);
  if (o->kind == CN_CELLS_STATE)
    return cn_err_set(c->err, CN_E_BAD_MODEL, "%s: cells: type '%s': %s",
                      c->file, c->type, what);
  return cn_err_set(
      c->err, CN_E_BAD_MODEL, "%s: cells: type '%s' op %d%s%s%s%s%s%s: %s",
      c->file, c->type, i, o->name[0] ? " '" : "", o->name,
      o->name[0] ? "'" : "", o->kind >= 0 ? " (" : "",
      o->kind >= 0 ? op_defs[o->kind].name : "", o->kind >= 0 ? ")" : "", what);
}

int cn__cells_bad(cn_err *err, const char *file, const char *fmt, ...) {
  char what[260];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  return cn_err_set(err, CN_E_BAD_MODEL, "%s: cells: %s", file, what);
}

/* ---- tensors ------------------------------------------------------------- */
/* The index of tensor `name` in m->w, binding it on first use; -1 with the
 * error set when the file lacks it or holds NaN or Inf. */
int cn__cells_tensor(cells_ctx *c, int i, const char *key, const json_t *v) {
  cn_model *m = c->m;
  const char *name = json_string_value(v);
  if (name == NULL || name[0] == '\0') {
    cn__cells_op_err(c, i, "'%s' must be a tensor name (a non-empty string)",
                     key);
    return -1;
  }
  for (int k = 0; k < m->n_tensors; k++)
    if (strcmp(m->w[k]->name, name) == 0) return k;
  const cn_tensor *t = cn_safetensors_find(&m->st, name);
  if (t == NULL) {
    cn__cells_op_err(c, i, "tensor '%s' is missing from weights.safetensors",
                     name);
    return -1;
  }
  if (m->n_tensors >= CN_MAX_TENSORS) {
    cn__cells_op_err(c, i, "tensor '%s': more than %d tensors", name,
                     CN_MAX_TENSORS);
    return -1;
  }
  for (int64_t j = 0; j < t->numel; j++)
    if (!isfinite(t->data[j])) {
      cn__cells_op_err(c, i,
                       "tensor '%s' holds %s at element %lld; weights must be "
                       "finite",
                       name, isnan(t->data[j]) ? "NaN" : "Inf", (long long)j);
      return -1;
    }
  m->w[m->n_tensors] = t;
  return m->n_tensors++;
}

static const cn_tensor *T(const cells_ctx *c, int t) { return c->m->w[t]; }

/* ---- parsing ------------------------------------------------------------- */
/* A [start, end) range within [0, limit); absent gives [0, limit). */
int cn__cells_get_cols(cells_ctx *c, int i, const json_t *o, const char *key,
                       int limit, int *c0, int *c1) {
  const json_t *v = json_object_get(o, key);
  if (v == NULL) {
    *c0 = 0;
    *c1 = limit;
    return 0;
  }
  json_int_t a, b;
  if (!json_is_array(v) || json_array_size(v) != 2 ||
      !json_is_integer(json_array_get(v, 0)) ||
      !json_is_integer(json_array_get(v, 1)))
    return cn__cells_op_err(c, i, "'%s' must be [start, end) (two integers)",
                            key);
  a = json_integer_value(json_array_get(v, 0));
  b = json_integer_value(json_array_get(v, 1));
  if (a < 0 || b <= a || b > limit)
    return cn__cells_op_err(c, i,
                            "'%s' [%lld, %lld) is not a non-empty range "
                            "within [0, %d)",
                            key, (long long)a, (long long)b, limit);
  *c0 = (int)a;
  *c1 = (int)b;
  return 0;
}

/* An operand: an earlier op by index or by name. */
int cn__cells_get_ref(cells_ctx *c, int i, const json_t *v, const char *key,
                      int *out) {
  if (json_is_integer(v)) {
    json_int_t r = json_integer_value(v);
    if (r >= i && r < c->n_ops)
      return cn__cells_op_err(
          c, i,
          "'%s' refers to op %lld, which does not come "
          "before it (ops may only read earlier ops: no cycles)",
          key, (long long)r);
    if (r < 0 || r >= i)
      return cn__cells_op_err(c, i,
                              "'%s' refers to op %lld, which does not exist",
                              key, (long long)r);
    *out = (int)r;
    return 0;
  }
  const char *s = json_string_value(v);
  if (s == NULL)
    return cn__cells_op_err(c, i,
                            "'%s' must name an earlier op (its index or its "
                            "name)",
                            key);
  for (int k = i - 1; k >= 0; k--)
    if (strcmp(c->ops[k].name, s) == 0) {
      *out = k;
      return 0;
    }
  for (int k = i; k < c->n_ops; k++) {
    if (strcmp(c->ops[k].name, s) == 0)
      return cn__cells_op_err(
          c, i,
          "'%s' refers to '%s', op %d, which does not come "
          "before it (ops may only read earlier ops: no cycles)",
          key, s, k);
  }
  return cn__cells_op_err(c, i, "'%s' refers to '%s', which no op is named",
                          key, s);
}

static int get_refs(cells_ctx *c, int i, const json_t *o, const char *key,
                    int *x, int *nx) {
  const json_t *v = json_object_get(o, key);
  if (v == NULL) return cn__cells_op_err(c, i, "'%s' is missing", key);
  if (!json_is_array(v)) {
    *nx = 1;
    return cn__cells_get_ref(c, i, v, key, &x[0]);
  }
  size_t n = json_array_size(v);
  if (n < 1 || n > CN_CELLS_MAX_X)
    return cn__cells_op_err(c, i, "'%s' must list 1 to %d operands, not %zu",
                            key, CN_CELLS_MAX_X, n);
  for (size_t k = 0; k < n; k++) {
    int rc = cn__cells_get_ref(c, i, json_array_get(v, k), key, &x[k]);
    if (rc != 0) return rc;
  }
  *nx = (int)n;
  return 0;
}

static int get_operand(cells_ctx *c, int i, const json_t *o, const char *key,
                       int *out) {
  const json_t *v = json_object_get(o, key);
  if (v == NULL) return cn__cells_op_err(c, i, "'%s' is missing", key);
  return cn__cells_get_ref(c, i, v, key, out);
}

/* Unknown keys are refused: a mistyped "bais" must not pass quietly. */
static int check_keys(cells_ctx *c, int i, const json_t *o, int kind) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    bool ok = strcmp(key, "op") == 0 || strcmp(key, "name") == 0 ||
              strcmp(key, "width") == 0;
    for (int k = 0; !ok && k < (int)CN_ARRAY_SIZE(op_defs[kind].keys) &&
                    op_defs[kind].keys[k];
         k++)
      ok = strcmp(key, op_defs[kind].keys[k]) == 0;
    if (!ok) return cn__cells_op_err(c, i, "unknown key '%s'", key);
  }
  return 0;
}

/* input's 'edge': which child (tree, dag) or the previous step
 * (sequence, edge 0) it reads. */
static int parse_edge(cells_ctx *c, int i, const json_t *o, jop *p) {
  const json_t *e = json_object_get(o, "edge");
  if (!json_is_integer(e) || json_integer_value(e) < 0 ||
      json_integer_value(e) >= 64)
    return cn__cells_op_err(c, i, "'edge' must be an integer from 0 to 63");
  p->edge = (int)json_integer_value(e);
  int ar = c->m->cells->arity;
  if (c->m->cells->structure == CN_CELLS_TREE && ar > 0 && p->edge >= ar)
    return cn__cells_op_err(
        c, i, "'edge' %d: tree nodes have at most %d children", p->edge, ar);
  if (c->m->cells->structure != CN_CELLS_TREE &&
      c->m->cells->structure != CN_CELLS_DAG && p->edge > 0)
    return cn__cells_op_err(c, i,
                            "'edge' %d: a sequence step has one input (edge "
                            "0, the previous step)",
                            p->edge);
  return 0;
}

/* input, input_sum, input_mean: 'cols' of the state. */
static int parse_input_cols(cells_ctx *c, int i, const json_t *o, jop *p) {
  int rc = cn__cells_get_cols(c, i, o, "cols", c->m->cells->state, &p->c0,
                              &p->c1);
  if (rc) return rc;
  p->width = p->c1 - p->c0;
  return 0;
}

/* embed: a [V, D] tensor; the first one sets D. */
static int parse_embed(cells_ctx *c, int i, const json_t *o, jop *p) {
  if ((p->t = cn__cells_tensor(c, i, "tensor",
                               json_object_get(o, "tensor"))) < 0)
    return c->err->code;
  if (T(c, p->t)->ndim != 2 || T(c, p->t)->shape[0] != c->m->dims.V)
    return cn__cells_op_err(c, i,
                            "tensor '%s' must be [V, D] with V = %lld (the "
                            "vocabulary's size)",
                            T(c, p->t)->name, (long long)c->m->dims.V);
  p->width = (int)T(c, p->t)->shape[1];
  if (c->m->dims.D == 0) c->m->dims.D = p->width; /* the first embedding */
  return 0;
}

/* table: the token's row of a tensor of any rank [K, ...]: its first K
 * tokens have rows, any later one reads row 0 (MV-RNN's leaf.M: matrices
 * for the K most frequent words). */
static int parse_table(cells_ctx *c, int i, const json_t *o, jop *p) {
  if ((p->t = cn__cells_tensor(c, i, "tensor",
                               json_object_get(o, "tensor"))) < 0)
    return c->err->code;
  const cn_tensor *Tt = T(c, p->t);
  if (Tt->ndim < 2 || Tt->shape[0] < 1 || Tt->numel / Tt->shape[0] > 1 << 24)
    return cn__cells_op_err(c, i,
                            "tensor '%s' must have rank 2 or more (a row per "
                            "token)",
                            Tt->name);
  p->width = (int)(Tt->numel / Tt->shape[0]);
  return 0;
}

/* An optional 'absent' of an input: "zeros" (the default) or "identity"
 * (a square matrix: only a matmul may read it). */
static int parse_absent(cells_ctx *c, int i, const json_t *o, jop *p) {
  const json_t *a = json_object_get(o, "absent");
  if (a == NULL) return 0;
  const char *s = json_string_value(a);
  if (s != NULL && strcmp(s, "zeros") == 0) return 0;
  int side = 1;
  while (side * side < p->width) side++;
  if (s == NULL || strcmp(s, "identity") != 0)
    return cn__cells_op_err(c, i, "'absent' must be \"zeros\" or "
                            "\"identity\"");
  if (side * side != p->width)
    return cn__cells_op_err(c, i,
                            "'absent': \"identity\" needs a square matrix; "
                            "the input is %d floats wide",
                            p->width);
  p->identity = true;
  return 0;
}

/* matmul: per vertex, L·R, L = operand 'a' as an [m, K] matrix (row-major)
 * or the block 'rows' × 'cols' of 'weight', R = operand 'b' as [K, N] or
 * that block; one of the two is a per-vertex value. */
static int parse_matmul(cells_ctx *c, int i, const json_t *o, jop *p) {
  int rc;
  bool ha = json_object_get(o, "a") != NULL, hb = json_object_get(o, "b") != NULL;
  bool hw = json_object_get(o, "weight") != NULL;
  if (!(ha || hb) || (ha && hb && hw) || (!(ha && hb) && !hw))
    return cn__cells_op_err(c, i,
                            "give 'a' and 'b' (two per-vertex values), or "
                            "one of them and 'weight'");
  if (ha && (rc = get_operand(c, i, o, "a", &p->a))) return rc;
  if (hb && (rc = get_operand(c, i, o, "b", &p->b))) return rc;
  int M, K, N;
  if (hw) {
    if ((p->t = cn__cells_tensor(c, i, "weight",
                                 json_object_get(o, "weight"))) < 0)
      return c->err->code;
    const cn_tensor *W = T(c, p->t);
    if (W->ndim != 2)
      return cn__cells_op_err(c, i, "weight '%s' must be 2-D", W->name);
    if ((rc = cn__cells_get_cols(c, i, o, "rows", (int)W->shape[0], &p->r0,
                                 &p->r1)) ||
        (rc = cn__cells_get_cols(c, i, o, "cols", (int)W->shape[1], &p->c0,
                                 &p->c1)))
      return rc;
  }
  if (ha) {
    const json_t *m = json_object_get(o, "m");
    int wa = c->ops[p->a].width;
    if (!json_is_integer(m) || json_integer_value(m) < 1 ||
        wa % (int)json_integer_value(m) != 0)
      return cn__cells_op_err(c, i,
                              "'m' (the rows of 'a') must be an integer "
                              "dividing its width %d",
                              wa);
    M = (int)json_integer_value(m);
    K = wa / M;
  } else {
    if (json_object_get(o, "m") != NULL)
      return cn__cells_op_err(c, i, "'m' is the weight block's rows here");
    M = p->r1 - p->r0;
    K = p->c1 - p->c0;
  }
  if (hb) {
    int wb = c->ops[p->b].width;
    if (wb % K != 0)
      return cn__cells_op_err(c, i,
                              "'b' is %d floats wide: not a matrix of %d "
                              "rows (the columns of the left operand)",
                              wb, K);
    N = wb / K;
  } else {
    if (p->r1 - p->r0 != K)
      return cn__cells_op_err(c, i,
                              "the weight block has %d rows; the left "
                              "operand has %d columns",
                              p->r1 - p->r0, K);
    N = p->c1 - p->c0;
  }
  p->m = M;
  p->k = (float)K;
  p->width = M * N;
  return 0;
}

/* param: 'cols' of a 1-D tensor. */
static int parse_param(cells_ctx *c, int i, const json_t *o, jop *p) {
  int rc;
  if ((p->t = cn__cells_tensor(c, i, "tensor",
                               json_object_get(o, "tensor"))) < 0)
    return c->err->code;
  if (T(c, p->t)->ndim != 1)
    return cn__cells_op_err(c, i, "tensor '%s' must be 1-D (a vector)",
                            T(c, p->t)->name);
  if ((rc = cn__cells_get_cols(c, i, o, "cols", (int)T(c, p->t)->shape[0],
                               &p->c0, &p->c1)))
    return rc;
  p->width = p->c1 - p->c0;
  return 0;
}

/* linear: operands 'x' times a [N, K] weight, K their total width, 'rows'
 * of N, plus an optional [N] bias. */
static int parse_linear(cells_ctx *c, int i, const json_t *o, jop *p) {
  int rc;
  if ((rc = get_refs(c, i, o, "x", p->x, &p->nx))) return rc;
  if ((p->t = cn__cells_tensor(c, i, "weight",
                               json_object_get(o, "weight"))) < 0)
    return c->err->code;
  const cn_tensor *W = T(c, p->t);
  int64_t K = 0;
  for (int k = 0; k < p->nx; k++) K += c->ops[p->x[k]].width;
  if (W->ndim != 2 || W->shape[1] != K)
    return cn__cells_op_err(
        c, i,
        "weight '%s' must be [N, %lld] (its inputs are "
        "%lld wide), not %s%lld%s%lld]",
        W->name, (long long)K, (long long)K,
        W->ndim == 2 ? "[" : "a tensor of rank ",
        W->ndim == 2 ? (long long)W->shape[0] : (long long)W->ndim,
        W->ndim == 2 ? ", " : " [.., ", (long long)W->shape[W->ndim - 1]);
  int c1;
  if ((rc = cn__cells_get_cols(c, i, o, "rows", (int)W->shape[0], &p->r0,
                               &c1)))
    return rc;
  p->width = c1 - p->r0;
  p->bt = -1;
  if (json_object_get(o, "bias") != NULL) {
    p->bt = cn__cells_tensor(c, i, "bias", json_object_get(o, "bias"));
    if (p->bt < 0) return c->err->code;
    const cn_tensor *B = T(c, p->bt);
    if (B->ndim != 1 || B->shape[0] != W->shape[0])
      return cn__cells_op_err(c, i,
                              "bias '%s' must be [%lld] (the weight's rows)",
                              B->name, (long long)W->shape[0]);
  }
  return 0;
}

/* add, sub, mul, div: operands 'a' and 'b' of one width. */
static int parse_binary(cells_ctx *c, int i, const json_t *o, jop *p) {
  int rc;
  if ((rc = get_operand(c, i, o, "a", &p->a)) ||
      (rc = get_operand(c, i, o, "b", &p->b)))
    return rc;
  if (c->ops[p->a].width != c->ops[p->b].width)
    return cn__cells_op_err(c, i,
                            "width mismatch: 'a' (op %d) is %d wide, 'b' (op "
                            "%d) %d",
                            p->a, c->ops[p->a].width, p->b,
                            c->ops[p->b].width);
  p->width = c->ops[p->a].width;
  return 0;
}

/* scale, rsub, shift: the constant 'k', a number a float holds. */
static int parse_k(cells_ctx *c, int i, const json_t *o, jop *p) {
  const json_t *k = json_object_get(o, "k");
  if (!json_is_number(k) || !(fabs(json_number_value(k)) <= FLT_MAX))
    return cn__cells_op_err(c, i,
                            "'k' must be a number a float holds (finite, "
                            "|k| <= %g)",
                            (double)FLT_MAX);
  p->k = (float)json_number_value(k);
  return 0;
}

/* The elementwise ops of one operand 'a': as wide as it. */
static int parse_unary(cells_ctx *c, int i, const json_t *o, jop *p) {
  int rc;
  if ((rc = get_operand(c, i, o, "a", &p->a))) return rc;
  p->width = c->ops[p->a].width;
  return 0;
}

/* slice: 'cols' (required) of operand 'a'. */
static int parse_slice(cells_ctx *c, int i, const json_t *o, jop *p) {
  int rc;
  if ((rc = get_operand(c, i, o, "a", &p->a)) ||
      (rc = cn__cells_get_cols(c, i, o, "cols", c->ops[p->a].width, &p->c0,
                               &p->c1)))
    return rc;
  if (json_object_get(o, "cols") == NULL)
    return cn__cells_op_err(c, i, "'cols' is missing");
  p->width = p->c1 - p->c0;
  return 0;
}

/* concat: operands 'x' side by side. */
static int parse_concat(cells_ctx *c, int i, const json_t *o, jop *p) {
  int rc;
  if ((rc = get_refs(c, i, o, "x", p->x, &p->nx))) return rc;
  p->width = 0;
  for (int k = 0; k < p->nx; k++) p->width += c->ops[p->x[k]].width;
  return 0;
}

/* An optional 'width' must agree with the width derived. */
static int check_width(cells_ctx *c, int i, const json_t *o, const jop *p) {
  const json_t *w = json_object_get(o, "width");
  if (w != NULL && (!json_is_integer(w) || json_integer_value(w) != p->width))
    return cn__cells_op_err(
        c, i,
        "width mismatch: 'width' says %s%lld, the operands "
        "and tensors give %d",
        json_is_integer(w) ? ""
                           : "(not an "
                             "integer) ",
        json_is_integer(w) ? (long long)json_integer_value(w) : 0LL, p->width);
  return 0;
}

/* Segment ops (docs/cells.md): input_each makes a value per input edge,
 * ops over per-edge values are per edge too, and only edge_sum takes one
 * back to the vertex; an op may not mix the two (params go with either). */
static int check_edges(cells_ctx *c, int i, jop *p) {
  if (p->kind == OP_INPUT_EACH) {
    p->per_edge = true;
    return 0;
  }
  if (p->kind == OP_EDGE_SUM) {
    if (!c->ops[p->a].per_edge)
      return cn__cells_op_err(c, i,
                              "'a' (op %d) is not a per-edge value: edge_sum "
                              "sums what input_each and the ops over it "
                              "compute",
                              p->a);
    return 0;
  }
  int ops[CN_CELLS_MAX_X + 2], n = 0, first = -1;
  if (p->a >= 0) ops[n++] = p->a;
  if (p->b >= 0) ops[n++] = p->b;
  for (int k = 0; k < p->nx; k++) ops[n++] = p->x[k];
  for (int k = 0; k < n; k++) {
    if (c->ops[ops[k]].kind == OP_PARAM) continue;
    if (first < 0) {
      first = ops[k];
      p->per_edge = c->ops[ops[k]].per_edge;
    } else if (c->ops[ops[k]].per_edge != p->per_edge) {
      int e = p->per_edge ? first : ops[k], v = p->per_edge ? ops[k] : first;
      return cn__cells_op_err(c, i,
                              "mixes a per-edge value (op %d) with a "
                              "per-vertex one (op %d): sum the per-edge one "
                              "with edge_sum first",
                              e, v);
    }
  }
  return 0;
}

/* Reads op i; its width from its operands and tensors. */
static int parse_op(cells_ctx *c, int i, const json_t *o) {
  jop *p = &c->ops[i];
  int rc;
  if ((rc = check_keys(c, i, o, p->kind))) return rc;
  switch (p->kind) {
  case OP_INPUT:
    if ((rc = parse_edge(c, i, o, p)) || (rc = parse_input_cols(c, i, o, p)))
      return rc;
    rc = parse_absent(c, i, o, p);
    break;
  case OP_INPUT_SUM:
  case OP_INPUT_MEAN: rc = parse_input_cols(c, i, o, p); break;
  case OP_EMBED: rc = parse_embed(c, i, o, p); break;
  case OP_PARAM: rc = parse_param(c, i, o, p); break;
  case OP_LINEAR: rc = parse_linear(c, i, o, p); break;
  case OP_ADD:
  case OP_SUB:
  case OP_MUL:
  case OP_DIV: rc = parse_binary(c, i, o, p); break;
  case OP_SCALE:
  case OP_RSUB:
  case OP_SHIFT:
    if ((rc = parse_k(c, i, o, p))) return rc;
    /* fall through */
  case OP_SIGMOID:
  case OP_TANH:
  case OP_EXP:
  case OP_RELU: rc = parse_unary(c, i, o, p); break;
  case OP_SLICE: rc = parse_slice(c, i, o, p); break;
  case OP_CONCAT: rc = parse_concat(c, i, o, p); break;
  case OP_INPUT_EACH: rc = parse_input_cols(c, i, o, p); break;
  case OP_EDGE_SUM: rc = parse_unary(c, i, o, p); break;
  case OP_MATMUL: rc = parse_matmul(c, i, o, p); break;
  case OP_TABLE: rc = parse_table(c, i, o, p); break;
  case OP_STEP: rc = parse_unary(c, i, o, p); break;
  }
  if (rc) return rc;
  if ((rc = check_edges(c, i, p))) return rc;
  /* an input read as the identity where absent is only a matmul operand
   * (any other op would read zeros there) */
  int refs[CN_CELLS_MAX_X + 2], nr = 0;
  if (p->a >= 0) refs[nr++] = p->a;
  if (p->b >= 0) refs[nr++] = p->b;
  for (int k = 0; k < p->nx; k++) refs[nr++] = p->x[k];
  for (int k = 0; k < nr && p->kind != OP_MATMUL; k++)
    if (c->ops[refs[k]].identity)
      return cn__cells_op_err(c, i,
                              "reads op %d, an input that is the identity "
                              "where absent: only a matmul may",
                              refs[k]);
  return check_width(c, i, o, p);
}

int cn__cells_parse_ops(cells_ctx *c, const json_t *arr) {
  if (!json_is_array(arr) || json_array_size(arr) < 1 ||
      json_array_size(arr) > CN_CELLS_MAX_OPS)
    return cn__cells_bad(c->err, c->file,
                         "type '%s': 'ops' must be an array of 1 to "
                         "%d ops",
                         c->type, CN_CELLS_MAX_OPS);
  c->n_ops = (int)json_array_size(arr);
  /* Names first, so that a reference to a later op can say so. */
  for (int i = 0; i < c->n_ops; i++) {
    jop *p = &c->ops[i];
    *p = (jop){.kind = -1, .name = "", .a = -1, .b = -1, .t = -1, .bt = -1};
    const json_t *o = json_array_get(arr, (size_t)i);
    if (!json_is_object(o))
      return cn__cells_bad(c->err, c->file, "type '%s' op %d is not an object",
                           c->type, i);
    const json_t *nm = json_object_get(o, "name");
    if (nm != NULL &&
        (json_string_value(nm) == NULL || json_string_length(nm) == 0 ||
         json_string_length(nm) > 64))
      return cn__cells_op_err(c, i, "'name' must be a string of 1 to 64 bytes");
    if (nm != NULL) p->name = json_string_value(nm);
    for (int k = 0; k < i && p->name[0]; k++)
      if (strcmp(c->ops[k].name, p->name) == 0)
        return cn__cells_op_err(c, i, "name '%s' is already op %d's", p->name,
                                k);
  }
  for (int i = 0; i < c->n_ops; i++) {
    const json_t *o = json_array_get(arr, (size_t)i);
    const char *op = json_string_value(json_object_get(o, "op"));
    if (op == NULL)
      return cn__cells_op_err(c, i, "'op' is missing or not a string");
    for (size_t k = 0; k < CN_ARRAY_SIZE(op_defs); k++)
      if (strcmp(op, op_defs[k].name) == 0) c->ops[i].kind = (int)k;
    if (c->ops[i].kind < 0) {
      char known[400];
      size_t n = 0;
      for (size_t k = 0; k < CN_ARRAY_SIZE(op_defs) && n < sizeof(known); k++)
        n += (size_t)snprintf(known + n, sizeof(known) - n, "%s%s",
                              k ? " " : "", op_defs[k].name);
      return cn__cells_op_err(c, i, "unknown op '%.40s' (known: %s)", op,
                              known);
    }
    int rc = parse_op(c, i, o);
    if (rc != 0) return rc;
  }
  return 0;
}
