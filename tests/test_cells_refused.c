/* test_cells_refused.c - models described by cells (docs/cells.md):
 *   - every malformed description is refused naming the type and the op;
 *   - label types choose the vertices;
 *   - docs/cells.md's example is served;
 *   - the policy cache key follows the description. */
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

  /* segment ops: a per-edge value meets a per-vertex one only through
   * edge_sum */
  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 0), "op", json_string("input_each"));
  json_object_del(op_of(j, 1, 0), "edge");
  REFUSED("per-edge mixed with per-vertex", j, "op 4 'g' (linear)",
          "mixes a per-edge value (op 0) with a per-vertex one (op 2)");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 5), "op", json_string("edge_sum"));
  REFUSED("edge_sum of a per-vertex value", j, "op 5 'sg' (edge_sum)",
          "is not a per-edge value");

  /* an input read as the identity where absent: a matmul's operand only */
  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 0), "absent", json_string("identity"));
  REFUSED("identity read by a linear", j, "op 4 'g' (linear)",
          "the identity where absent: only a matmul may");

  j = cells_json("treelstm");
  json_object_set_new(op_of(j, 1, 0), "cols", json_pack("[i, i]", 0, 15));
  json_object_set_new(op_of(j, 1, 0), "absent", json_string("identity"));
  REFUSED("identity not square", j, "op 0 'h1' (input)",
          "needs a square matrix");

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

/* Per-vertex matmul (mvrnn.json over a built-in mvrnn's weights): shapes
 * are checked and named. */
Test(cells_json, matmul_shapes_refused, .timeout = 60) {
  char dir[256];
  cn_model_free(tu_model("mvrnn", H, H, "trees-binary.jsonl", dir,
                         sizeof(dir)));
  json_t *j = cells_json("mvrnn"); /* internal: 0 a, 1 A, 2 b, 3 B, 4 x1 */
  {
    cn_model *m;
    cn_err e;
    cr_assert_eq(load_cells(dir, j, &m, &e), 0, "%s", e.msg);
    cn_model_free(m);
  }
  json_decref(j);
  j = cells_json("mvrnn");
  json_object_set_new(op_of(j, 1, 4), "m", json_integer(5));
  REFUSED("matmul rows", j, "op 4 'x1' (matmul)", "'m' (the rows of 'a')");
  j = cells_json("mvrnn");
  json_object_set_new(op_of(j, 1, 4), "m", json_integer(8)); /* B: 8 × 32 */
  REFUSED("matmul inner sizes", j, "op 4 'x1' (matmul)", "not a matrix of",
          "32 rows");
  j = cells_json("mvrnn");
  json_object_set_new(op_of(j, 1, 4), "weight", json_string("internal.WM"));
  REFUSED("matmul with three operands", j, "op 4 'x1' (matmul)",
          "one of them and 'weight'");
  tu_rmdir(dir);
}

/* docs/cells.md's example (the first ```json block after "## model.json:
 * cells") loads over a treelstm of its sizes and answers as the
 * built-in treelstm does: the documented format is the one served. */
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
