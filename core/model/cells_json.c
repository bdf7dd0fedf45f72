/* cells_json.c - a model described by its cells (model.json "family":
 * "cells", docs/cells.md): the structure, each vertex type's op graph as
 * JSON, how a vertex's type is chosen, the output layer.
 *
 * Loading has two passes per type. Parsing checks every op against the
 * weights (operands earlier in the list, widths, tensor names and shapes)
 * and derives its width, so a mistake is refused naming the type, the
 * op's index and its name (cells_ops.c). Lowering (cells_lower.c) then
 * turns the ops the state needs into the op IR (core/cell/cell.h),
 * folding `slice` and `concat` away. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cell/cell.h"
#include "model/cells_impl.h"

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
 * layer (families/ir_common.c cn__ir_output_layer). */
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
