/* cells_json.c - a model described by its cells (model.json "family":
 * "cells", docs/cells.md): the structure, each vertex type's op graph as
 * JSON, how a vertex's type is chosen, the output layer.
 *
 * Loading has two passes per type. Parsing checks every op against the
 * weights (operands earlier in the list, widths, tensor names and shapes)
 * and derives its width, so a mistake is refused naming the type, the
 * op's index and its name. Lowering (cells_lower.c) then turns the ops
 * the state needs into the op IR (core/cell/cell.h), folding `slice` and
 * `concat` away. */
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
  const char *keys[5];
} op_defs[] = {
    [OP_INPUT] = {"input", {"edge", "cols"}},
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

/* Reads op i; its width from its operands and tensors. */
static int parse_op(cells_ctx *c, int i, const json_t *o) {
  jop *p = &c->ops[i];
  int state = c->m->cells->state, rc;
  int kind = p->kind;
  const char *key;
  json_t *v;
  /* Unknown keys are refused: a mistyped "bais" must not pass quietly. */
  json_object_foreach((json_t *)o, key, v) {
    bool ok = strcmp(key, "op") == 0 || strcmp(key, "name") == 0 ||
              strcmp(key, "width") == 0;
    for (int k = 0; !ok && k < 5 && op_defs[kind].keys[k]; k++)
      ok = strcmp(key, op_defs[kind].keys[k]) == 0;
    if (!ok) return cn__cells_op_err(c, i, "unknown key '%s'", key);
  }
  switch (kind) {
  case OP_INPUT: {
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
  } /* fall through */
  case OP_INPUT_SUM:
  case OP_INPUT_MEAN:
    if ((rc = cn__cells_get_cols(c, i, o, "cols", state, &p->c0, &p->c1)))
      return rc;
    p->width = p->c1 - p->c0;
    break;
  case OP_EMBED:
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
    break;
  case OP_PARAM:
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
    break;
  case OP_LINEAR: {
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
    break;
  }
  case OP_ADD:
  case OP_SUB:
  case OP_MUL:
  case OP_DIV:
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
    break;
  case OP_SCALE:
  case OP_RSUB:
  case OP_SHIFT: {
    const json_t *k = json_object_get(o, "k");
    if (!json_is_number(k) || !(fabs(json_number_value(k)) <= FLT_MAX))
      return cn__cells_op_err(c, i,
                              "'k' must be a number a float holds (finite, "
                              "|k| <= %g)",
                              (double)FLT_MAX);
    p->k = (float)json_number_value(k);
  } /* fall through */
  case OP_SIGMOID:
  case OP_TANH:
  case OP_EXP:
  case OP_RELU:
    if ((rc = get_operand(c, i, o, "a", &p->a))) return rc;
    p->width = c->ops[p->a].width;
    break;
  case OP_SLICE:
    if ((rc = get_operand(c, i, o, "a", &p->a)) ||
        (rc = cn__cells_get_cols(c, i, o, "cols", c->ops[p->a].width, &p->c0,
                                 &p->c1)))
      return rc;
    if (json_object_get(o, "cols") == NULL)
      return cn__cells_op_err(c, i, "'cols' is missing");
    p->width = p->c1 - p->c0;
    break;
  case OP_CONCAT:
    if ((rc = get_refs(c, i, o, "x", p->x, &p->nx))) return rc;
    p->width = 0;
    for (int k = 0; k < p->nx; k++) p->width += c->ops[p->x[k]].width;
    break;
  }
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

/* ---- the description ----------------------------------------------------- */
static int check_keys(cn_err *err, const char *file, const char *where,
                      const json_t *o, const char *const *keys) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    bool ok = false;
    for (int k = 0; keys[k] && !ok; k++) ok = strcmp(key, keys[k]) == 0;
    if (!ok)
      return cn__cells_bad(err, file, "%s: unknown key '%s'", where, key);
  }
  return 0;
}

static int parse_when(cn_cells *cl, cn_cells_type *ty, const json_t *w,
                      const char *file, cn_err *err) {
  static const struct {
    const char *name;
    int when, structure;
  } whens[] = {
      {"leaf", CN_WHEN_LEAF, CN_CELLS_TREE},
      {"internal", CN_WHEN_INTERNAL, CN_CELLS_TREE},
      {"step", CN_WHEN_STEP, CN_CELLS_SEQUENCE},
      {"forward", CN_WHEN_FORWARD, CN_CELLS_BISEQUENCE},
      {"backward", CN_WHEN_BACKWARD, CN_CELLS_BISEQUENCE},
      {"node", CN_WHEN_NODE, CN_CELLS_DAG},
  };
  const char *s = json_string_value(w);
  for (size_t k = 0; s != NULL && k < CN_ARRAY_SIZE(whens); k++)
    if (strcmp(s, whens[k].name) == 0) {
      if (whens[k].structure != cl->structure) break;
      ty->when = whens[k].when;
      return 0;
    }
  const json_t *labels = json_object_get(w, "labels");
  if (cl->structure == CN_CELLS_TREE && json_is_object(w) &&
      json_object_size(w) == 1 && json_is_array(labels) &&
      json_array_size(labels) >= 1) {
    ty->when = CN_WHEN_LABELS;
    ty->n_labels = (int)json_array_size(labels);
    ty->labels = cn__xcalloc((size_t)ty->n_labels, sizeof(char *));
    if (ty->labels == NULL) return cn_err_set(err, CN_E_NOMEM, "out of memory");
    for (int k = 0; k < ty->n_labels; k++) {
      const char *l = json_string_value(json_array_get(labels, (size_t)k));
      if (l == NULL)
        return cn__cells_bad(
            err, file, "type '%s': 'when' labels must be strings", ty->name);
      if ((ty->labels[k] = strdup(l)) == NULL)
        return cn_err_set(err, CN_E_NOMEM, "out of memory");
    }
    return 0;
  }
  static const char *takes[] = {
      [CN_CELLS_TREE] = "\"leaf\", \"internal\" or {\"labels\": [...]}",
      [CN_CELLS_SEQUENCE] = "\"step\"",
      [CN_CELLS_BISEQUENCE] = "\"forward\" or \"backward\"",
      [CN_CELLS_DAG] = "\"node\""};
  return cn__cells_bad(err, file,
                       "type '%s': 'when' must be %s for this structure",
                       ty->name, takes[cl->structure]);
}

/* Which types the structure needs, each exactly once. */
static int check_types(cn_cells *cl, const char *file, cn_err *err) {
  int count[CN_WHEN_NODE + 1] = {0}, first[CN_WHEN_NODE + 1];
  for (int t = 0; t < cl->n_types; t++) {
    int w = cl->type[t].when;
    if (count[w]++ == 0) first[w] = t;
  }
  static const int need[][2] = {
      [CN_CELLS_TREE] = {CN_WHEN_LEAF, CN_WHEN_INTERNAL},
      [CN_CELLS_SEQUENCE] = {CN_WHEN_STEP, -1},
      [CN_CELLS_BISEQUENCE] = {CN_WHEN_FORWARD, CN_WHEN_BACKWARD},
      [CN_CELLS_DAG] = {CN_WHEN_NODE, -1}};
  static const char *names[] = {"leaf",    "internal", "labels", "step",
                                "forward", "backward", "node"};
  for (int w = 0; w <= CN_WHEN_NODE; w++) {
    bool needed = need[cl->structure][0] == w || need[cl->structure][1] == w;
    if (needed && count[w] != 1)
      return cn__cells_bad(err, file,
                           "the structure needs exactly one type with "
                           "\"when\": \"%s\" (found %d)",
                           names[w], count[w]);
  }
  if (cl->structure == CN_CELLS_TREE) {
    cl->leaf = first[CN_WHEN_LEAF];
    cl->internal = first[CN_WHEN_INTERNAL];
  }
  return 0;
}

static int parse_type(cn_model *m, int t, const json_t *o, const char *file,
                      jop *ops, cn_err *err) {
  cn_cells *cl = m->cells;
  cn_cells_type *ty = &cl->type[t];
  static const char *const keys[] = {"name", "when", "ops", "state", NULL};
  if (!json_is_object(o))
    return cn__cells_bad(err, file, "types[%d] is not an object", t);
  const char *name = json_string_value(json_object_get(o, "name"));
  size_t nl = name != NULL ? strlen(name) : 0;
  bool name_ok =
      nl >= 1 && nl < sizeof(ty->name) && strcmp(name, "output") != 0;
  for (size_t k = 0; name_ok && k < nl; k++)
    name_ok = (name[k] >= 'a' && name[k] <= 'z') ||
              (name[k] >= 'A' && name[k] <= 'Z') ||
              (name[k] >= '0' && name[k] <= '9') || name[k] == '_' ||
              name[k] == '.' || name[k] == '-';
  if (!name_ok)
    return cn__cells_bad(err, file,
                         "types[%d]: 'name' must be 1 to %zu characters "
                         "of [A-Za-z0-9_.-], not \"output\"",
                         t, sizeof(ty->name) - 1);
  memcpy(ty->name, name, nl + 1);
  for (int k = 0; k < t; k++)
    if (strcmp(cl->type[k].name, name) == 0)
      return cn__cells_bad(err, file, "types[%d]: name '%s' is taken", t, name);
  char where[64];
  snprintf(where, sizeof(where), "type '%s'", ty->name);
  int rc = check_keys(err, file, where, o, keys);
  if (rc == 0) rc = parse_when(cl, ty, json_object_get(o, "when"), file, err);
  if (rc != 0) return rc;
  ty->ir = calloc(1, sizeof(cn_ir));
  cells_ctx *c = calloc(1, sizeof(cells_ctx));
  if (ty->ir == NULL || c == NULL) {
    free(c);
    return cn_err_set(err, CN_E_NOMEM, "out of memory");
  }
  *c = (cells_ctx){.m = m,
                   .file = file,
                   .type = ty->name,
                   .err = err,
                   .ops = ops,
                   .g = ty->ir};
  rc = cn__cells_parse_ops(c, json_object_get(o, "ops"));
  ty->n_ops = c->n_ops;
  if (rc == 0) rc = cn__cells_lower_state(c, json_object_get(o, "state"));
  free(c);
  return rc;
}

/* logits = W · [s[from] of each direction] + b, as the built-ins' output
 * layer (families/cells.c cn__ir_output_layer). */
static int parse_output(cn_model *m, const json_t *o, const char *file,
                        jop *ops, cn_err *err) {
  cn_cells *cl = m->cells;
  static const char *const keys[] = {"from", "weight", "bias", NULL};
  if (!json_is_object(o))
    return cn__cells_bad(err, file,
                         "'output' must be an object {\"from\", "
                         "\"weight\", \"bias\"}");
  int rc = check_keys(err, file, "output", o, keys);
  if (rc != 0) return rc;
  cl->out_ir = calloc(1, sizeof(cn_ir));
  cells_ctx *c = calloc(1, sizeof(cells_ctx));
  if (cl->out_ir == NULL || c == NULL) {
    free(c);
    return cn_err_set(err, CN_E_NOMEM, "out of memory");
  }
  *c = (cells_ctx){.m = m,
                   .file = file,
                   .type = "output",
                   .err = err,
                   .ops = ops,
                   .g = cl->out_ir,
                   .n_ops = 1};
  ops[0] = (jop){.kind = OP_LINEAR, .name = "output", .a = -1, .b = -1};
  int c1, ndir = cl->structure == CN_CELLS_BISEQUENCE ? 2 : 1;
  if ((rc = cn__cells_get_cols(c, 0, o, "from", cl->state, &cl->out_c0, &c1)))
    goto out;
  cl->out_w = c1 - cl->out_c0;
  int W = cn__cells_tensor(c, 0, "weight", json_object_get(o, "weight")),
      B = -1;
  if (W < 0) {
    rc = err->code;
    goto out;
  }
  const cn_tensor *Wt = m->w[W];
  if (Wt->ndim != 2 || Wt->shape[0] != m->dims.C ||
      Wt->shape[1] != (int64_t)ndir * cl->out_w) {
    rc = cn__cells_op_err(c, 0, "weight '%s' must be [C, %s%d] = [%lld, %d]",
                          Wt->name, ndir == 2 ? "2 x " : "", cl->out_w,
                          (long long)m->dims.C, ndir * cl->out_w);
    goto out;
  }
  if (json_object_get(o, "bias") != NULL) {
    if ((B = cn__cells_tensor(c, 0, "bias", json_object_get(o, "bias"))) < 0) {
      rc = err->code;
      goto out;
    }
    if (m->w[B]->ndim != 1 || m->w[B]->shape[0] != m->dims.C) {
      rc = cn__cells_op_err(c, 0, "bias '%s' must be [C] = [%lld]",
                            m->w[B]->name, (long long)m->dims.C);
      goto out;
    }
  }
  int x[2];
  for (int k = 0; k < ndir; k++)
    x[k] = cn_ir_src_(c->g, CN_SRC_INPUT, -1, k, cl->out_c0, cl->out_w, "h");
  cn_ir_output(c->g, cn_ir_linear(c->g, x, ndir, W, 0, (int)m->dims.C, B, 0),
               0);
  c->g->state_floats = (int)m->dims.C;
out:
  free(c);
  return rc;
}

static int parse_cells(cn_model *m, const json_t *j, const char *file, jop *ops,
                       cn_err *err) {
  static const char *const keys[] = {"structure", "arity",  "state", "hidden",
                                     "types",     "output", NULL};
  static const char *structures[] = {"tree", "sequence", "bisequence", "dag"};
  cn_cells *cl = m->cells;
  if (!json_is_object(j))
    return cn_err_set(err, CN_E_BAD_MODEL,
                      "%s: key 'cells' is missing or "
                      "not an object (docs/cells.md)",
                      file);
  int rc = check_keys(err, file, "'cells'", j, keys);
  if (rc != 0) return rc;
  const char *s = json_string_value(json_object_get(j, "structure"));
  cl->structure = -1;
  for (int k = 0; s != NULL && k < 4; k++)
    if (strcmp(s, structures[k]) == 0) cl->structure = k;
  if (cl->structure < 0)
    return cn__cells_bad(err, file,
                         "'structure' must be \"tree\", \"sequence\", "
                         "\"bisequence\" or \"dag\"");
  const json_t *ar = json_object_get(j, "arity");
  cl->arity = 2;
  if (ar != NULL && (cl->structure != CN_CELLS_TREE || !json_is_integer(ar) ||
                     json_integer_value(ar) < 0 || json_integer_value(ar) > 64))
    return cn__cells_bad(err, file,
                         "'arity' is for trees only: an integer from 0 "
                         "(any) to 64");
  if (ar != NULL) cl->arity = (int)json_integer_value(ar);
  const json_t *st = json_object_get(j, "state");
  if (!json_is_integer(st) || json_integer_value(st) < 1 ||
      json_integer_value(st) > (1 << 16))
    return cn__cells_bad(err, file, "'state' must be an integer from 1 to %d",
                         1 << 16);
  cl->state = (int)json_integer_value(st);
  int h1;
  cells_ctx hc = {
      .m = m, .file = file, .type = NULL, .err = err, .ops = ops, .n_ops = 1};
  ops[0] = (jop){.kind = OP_SLICE, .name = "hidden", .a = -1, .b = -1};
  if ((rc = cn__cells_get_cols(&hc, 0, j, "hidden", cl->state, &cl->h0, &h1)))
    return rc;
  cl->hw = h1 - cl->h0;
  const json_t *types = json_object_get(j, "types");
  if (!json_is_array(types) || json_array_size(types) < 1 ||
      json_array_size(types) > CN_MAX_TYPES - 1)
    return cn__cells_bad(err, file, "'types' must list 1 to %d vertex types",
                         CN_MAX_TYPES - 1);
  cl->n_types = (int)json_array_size(types);
  for (int t = 0; t < cl->n_types; t++)
    if ((rc = parse_type(m, t, json_array_get(types, (size_t)t), file, ops,
                         err)))
      return rc;
  if ((rc = check_types(cl, file, err))) return rc;
  return parse_output(m, json_object_get(j, "output"), file, ops, err);
}

/* Every tensor in the file feeds some op: a mistyped name in the JSON
 * would otherwise leave the intended tensor silently unused. */
static int check_all_used(const cn_model *m, const char *file, cn_err *err) {
  for (int i = 0; i < m->st.n; i++) {
    bool used = false;
    for (int k = 0; k < m->n_tensors && !used; k++)
      used = m->w[k] == &m->st.tensors[i];
    if (!used)
      return cn__cells_bad(
          err, file,
          "tensor '%s' in weights.safetensors is used by "
          "no op (a cells model uses all its weights; remove it or "
          "check the names)",
          m->st.tensors[i].name);
  }
  return 0;
}

int cn__cells_load(cn_model *m, const char *file, cn_err *err) {
  m->cells = calloc(1, sizeof(cn_cells));
  jop *ops = calloc(CN_CELLS_MAX_OPS + 1, sizeof(jop));
  int rc = CN_E_NOMEM;
  if (m->cells == NULL || ops == NULL) {
    cn_err_set(err, rc, "%s: out of memory", file);
    goto out;
  }
  m->n_tensors = 0;
  m->dims.D = 0; /* set by the first embed op */
  if ((rc =
           parse_cells(m, json_object_get(m->json, "cells"), file, ops, err)) ||
      (rc = check_all_used(m, file, err)))
    goto out;
  cn_cells *cl = m->cells;
  const cn_family *tmpl = cn__family_cells();
  if ((m->own_fam = malloc(sizeof(cn_family))) == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "%s: out of memory", file);
    goto out;
  }
  *m->own_fam = *tmpl;
  static const cn_input_kind input[] = {[CN_CELLS_TREE] = CN_INPUT_TREE,
                                        [CN_CELLS_SEQUENCE] = CN_INPUT_SEQUENCE,
                                        [CN_CELLS_BISEQUENCE] =
                                            CN_INPUT_SEQUENCE,
                                        [CN_CELLS_DAG] = CN_INPUT_DAG};
  m->own_fam->input = input[cl->structure];
  m->own_fam->max_arity = cl->structure == CN_CELLS_TREE ? cl->arity : 0;
  m->own_fam->n_types = cl->n_types + 1;
  for (int t = 0; t < cl->n_types; t++)
    m->own_fam->type_names[t] = cl->type[t].name;
  m->own_fam->type_names[cl->n_types] = "output";
  m->fam = m->own_fam;
  /* model.json's sizes, as the built-ins report them: H the width of "h",
   * D the first embedding's (above) */
  m->dims.H = cl->hw;
  rc = 0;
out:
  free(ops);
  return rc;
}

void cn__cells_free(cn_cells *c) {
  if (c == NULL) return;
  for (int t = 0; t < CN_MAX_TYPES - 1; t++) {
    for (int k = 0; k < c->type[t].n_labels; k++) free(c->type[t].labels[k]);
    free(c->type[t].labels);
    free(c->type[t].ir);
  }
  free(c->out_ir);
  free(c);
}

int cn__cells_tree_type(const cn_model *m, const cn_tree_node *nd) {
  const cn_cells *cl = m->cells;
  if (nd->n_children == 0) return cl->leaf;
  for (int t = 0; nd->label != NULL && t < cl->n_types; t++)
    for (int k = 0; k < cl->type[t].n_labels; k++)
      if (strlen(cl->type[t].labels[k]) == (size_t)nd->label_len &&
          memcmp(cl->type[t].labels[k], nd->label, (size_t)nd->label_len) == 0)
        return t;
  return cl->internal;
}
