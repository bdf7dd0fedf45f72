/* test_cell.c - the vertex functions compiled from the op IR (core/cell.h),
 * batched by every policy and layout, against the same model run one
 * vertex at a time (tests/reference/compare.py holds them against an
 * independent implementation of docs/models.md); the copies each layout
 * leaves (ED-Batch's claims as checks on counts, never
 * on times); the compiler's product batching on cells whose best
 * batching is known. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <string.h>

#include "cell/cell.h"
#include "engine_util.h"
#include "internal.h"

ParameterizedTestParameters(cell, batched_equals_unbatched) {
  return cr_make_param_array(tu_family, tu_families, tu_n_families);
}

ParameterizedTest(tu_family *c, cell, batched_equals_unbatched,
                  .timeout = 120) {
  char dir[256];
  int H = strcmp(c->family, "mvrnn") == 0 ? 16 : 24;
  cn_model *m = tu_model(c->family, H, H, c->data, dir, sizeof(dir));
  json_t *in = tu_data_lines(c->data, 80);
  unsigned flags = CN_OUT_ALL | CN_OUT_HIDDEN;
  tu_layout = CN_LAYOUT_PQ; /* one vertex a batch, one instance a run */
  json_t *ref = tu_run(m, in, CN_POLICY_NONE, 1, flags, NULL, NULL);
  const cn_policy_kind pols[] = {CN_POLICY_NONE, CN_POLICY_DEPTH,
                                 CN_POLICY_AGENDA};
  const int sizes[] = {1, 64};
  for (int l = 0; l < CN_LAYOUT__COUNT; l++)
    for (size_t p = 0; p < 3; p++)
      for (size_t s = 0; s < 2; s++) {
        tu_layout = (cn_layout)l;
        json_t *got = tu_run(m, in, pols[p], sizes[s], flags, NULL, NULL);
        double d = tu_json_maxdiff(ref, got);
        cr_expect_leq(d, 1e-5, "%s layout %s policy %s batch %d: diff %g",
                      c->family, cn_layout_name((cn_layout)l),
                      cn_policy_name(pols[p]), sizes[s], d);
        json_decref(got);
      }
  tu_layout = CN_LAYOUT_PQ;
  json_decref(ref);
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* The layouts' promise, as counts: with pq no copy is left inside the
 * cells of these families, naive copies, and pq launches no more kernels
 * than naive. */
static void copies(const char *family, const char *data) {
  char dir[256];
  cn_model *m = tu_model(family, 32, 32, data, dir, sizeof(dir));
  json_t *in = tu_data_lines(data, 64);
  cn_run_stats st[2];
  for (int l = 0; l < 2; l++) {
    tu_layout = l == 0 ? CN_LAYOUT_NAIVE : CN_LAYOUT_PQ;
    json_decref(tu_run(m, in, CN_POLICY_AGENDA, 64, CN_OUT_ALL, NULL, NULL));
    st[l] = tu_stats;
  }
  tu_layout = CN_LAYOUT_PQ;
  cr_expect_gt(st[0].cell_bytes, 0, "%s: naive copied nothing", family);
  cr_expect_eq(st[1].cell_bytes, 0, "%s: pq copied %zu bytes in cells",
               family, st[1].cell_bytes);
  cr_expect_leq(st[1].kernels, st[0].kernels, "%s: pq %lld > naive %lld",
                family, st[1].kernels, st[0].kernels);
  cr_expect_leq(st[1].gather_bytes, st[0].gather_bytes);
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
}

Test(cell, pq_leaves_no_copies) {
  copies("treelstm", "trees-binary.jsonl");
  copies("treegru", "trees-binary.jsonl");
  copies("bilstm-tagger", "sequences.jsonl");
  copies("latticegru", "dags.jsonl");
  copies("lstm-nmt", "sequences.jsonl");
}

/* The products each compiled cell launches: the batching search must find
 * ED-Batch's one product per gate set (LSTM: [x h] -> 4 gates; Tree-LSTM
 * internal: [h1 h2] -> 5 gates) and the GRU's two (r and z could share a
 * product over [x h], but n needs W_hn h apart: two is the fewest). */
static const cn_cell *cell_of(const cn_model *m, int layout, int type) {
  return m->cell[layout][type];
}

Test(cell, product_batching) {
  char dir[256];
  struct {
    const char *family, *data;
    int type, products, fused;
  } cases[] = {
      {"treelstm", "trees-binary.jsonl", 0, 1, 1},
      {"treelstm", "trees-binary.jsonl", 1, 1, 1},
      {"treegru", "trees-binary.jsonl", 1, 2, 2},
      {"bilstm-tagger", "sequences.jsonl", 0, 1, 1},
      {"latticegru", "dags.jsonl", 0, 2, 1},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    cn_model *m = tu_model(cases[i].family, 16, 16, cases[i].data, dir,
                           sizeof(dir));
    for (int l = 0; l < CN_LAYOUT__COUNT; l++) {
      const cn_cell *c = cell_of(m, l, cases[i].type);
      cr_assert_not_null(c);
      cr_expect_eq(c->n_gemm, cases[i].products, "%s type %d: %d products",
                   cases[i].family, cases[i].type, c->n_gemm);
      cr_expect_eq(c->n_ew, cases[i].fused, "%s type %d: %d fused kernels",
                   cases[i].family, cases[i].type, c->n_ew);
      if (l == CN_LAYOUT_PQ) {
        cr_expect_eq(c->mem_kernels, 0, "%s type %d: %d copy kernels",
                     cases[i].family, cases[i].type, c->mem_kernels);
        cr_expect_eq(c->batches_dropped, 0);
      }
    }
    cn_model_free(m);
    tu_rmdir(dir);
  }
}

/* g does not compile: CN_E_INTERNAL, a message holding why, no cell. */
static void expect_refused(const cn_model *m, const cn_ir *g,
                           const char *why) {
  cn_cell *c = NULL;
  cn_err err;
  cn_err_clear(&err);
  cr_expect_eq(cn__cell_compile(m, 1, g, CN_LAYOUT_PQ, &c, &err),
               CN_E_INTERNAL);
  cr_expect_null(c);
  cr_expect(strstr(err.msg, why) != NULL, "'%s' lacks '%s'", err.msg, why);
}

/* A malformed graph is refused with a message, not run. */
Test(cell, malformed_ir_refused) {
  char dir[256];
  cn_model *m = tu_model("treelstm", 8, 8, "trees-binary.jsonl", dir,
                         sizeof(dir));
  cn_ir *g = calloc(1, sizeof(*g));
  int a = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, 8, "h");
  int b = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, 4, "short");
  cn_ir_binary(g, CN_IR_ADD, a, b); /* widths differ */
  expect_refused(m, g, "internal");
  free(g);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* Segment ops (cell.h): an edge value reaches the vertex only through a
 * segment sum; the graphs that break the rule are refused with a message
 * that says which rule. (The ops themselves run in childsum-treelstm's
 * internal cell: batched_equals_unbatched above, and the reference.) */
Test(cell, segment_rules_refused) {
  char dir[256];
  cn_model *m = tu_model("treelstm", 8, 8, "trees-binary.jsonl", dir,
                         sizeof(dir));
  const char *why[] = {"mixing a per-edge value", "not per edge",
                       "per-edge value as the vertex's state"};
  for (int k = 0; k < 3; k++) {
    cn_ir *g = calloc(1, sizeof(*g));
    int e = cn_ir_src_(g, CN_SRC_EDGE, -1, 0, 0, 8, "h_k");
    int v = cn_ir_src_(g, CN_SRC_INPUT_SUM, -1, 0, 0, 8, "hs");
    if (k == 0) cn_ir_output(g, cn_ir_binary(g, CN_IR_ADD, e, v), 0);
    if (k == 1) cn_ir_output(g, cn_ir_seg_sum(g, v), 0);
    if (k == 2) cn_ir_output(g, cn_ir_unary(g, CN_IR_TANH, e), 0);
    g->state_floats = 8;
    expect_refused(m, g, why[k]);
    free(g);
  }
  cn_model_free(m);
  tu_rmdir(dir);
}

/* Per-vertex products (cell.h CN_IR_BMM): operand shapes must match, and a
 * source read as the identity where its edge is absent may only be a
 * product's operand (an elementwise op would read zeros there). The
 * products themselves run in mvrnn's internal cell: batched_equals_unbatched
 * above, and the reference. */
Test(cell, per_vertex_product_rules) {
  char dir[256];
  cn_model *m = tu_model("treelstm", 4, 4, "trees-binary.jsonl", dir,
                         sizeof(dir));
  for (int k = 0; k < 2; k++) {
    cn_ir *g = calloc(1, sizeof(*g));
    int A = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, 16, "A");
    int x = cn_ir_src_(g, CN_SRC_INPUT, -1, 1, 0, 4, "x");
    g->node[A].fill = CN_FILL_IDENTITY;
    int y = k == 0 ? cn_ir_bmm(g, A, x, -1, 0, 0, 4, 5, 1) /* 16 != 4·5 */
                   : cn_ir_bmm(g, A, x, -1, 0, 0, 4, 4, 1);
    if (k == 1) /* A also read elementwise */
      y = cn_ir_binary(g, CN_IR_ADD, y,
                       cn_ir_unary(g, CN_IR_TANH,
                                   cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, 4,
                                              "a")));
    cn_ir_output(g, cn_ir_unary(g, CN_IR_TANH, y), 0);
    g->state_floats = 4;
    cn_cell *c = NULL;
    cn_err err;
    cn_err_clear(&err);
    int rc = cn__cell_compile(m, 1, g, CN_LAYOUT_PQ, &c, &err);
    if (k == 0) {
      cr_expect_eq(rc, CN_E_INTERNAL, "mismatched shapes compiled");
      cr_expect_null(c);
    } else { /* a second source over the same columns is fine */
      cr_expect_eq(rc, 0, "%s", err.msg);
      cn__cell_free(c);
    }
    free(g);
  }
  /* the identity-filled source read elementwise: refused */
  cn_ir *g = calloc(1, sizeof(*g));
  int A = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, 4, "A");
  g->node[A].fill = CN_FILL_IDENTITY;
  cn_ir_output(g, cn_ir_unary(g, CN_IR_TANH, A), 0);
  g->state_floats = 4;
  expect_refused(m, g, "identity-filled");
  free(g);
  cn_model_free(m);
  tu_rmdir(dir);
}
