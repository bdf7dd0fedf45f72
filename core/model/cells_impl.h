/* cells_impl.h - what the cells loader (cells_json.c: the description;
 * cells_ops.c: the op lists) and its lowering into the op IR
 * (cells_lower.c) share. */
#ifndef CANOPY_CELLS_IMPL_H
#define CANOPY_CELLS_IMPL_H

#include "model/model.h"

#define CN_CELLS_MAX_OPS 256   /* JSON ops in one type                */
#define CN_CELLS_MAX_X 16      /* operands of one linear or concat    */
#define CN_CELLS_MAX_PIECES 64 /* IR nodes one value may split into   */

enum {
  OP_INPUT,
  OP_INPUT_SUM,
  OP_INPUT_MEAN,
  OP_EMBED,
  OP_PARAM,
  OP_LINEAR,
  OP_ADD,
  OP_SUB,
  OP_MUL,
  OP_DIV,
  OP_SIGMOID,
  OP_TANH,
  OP_EXP,
  OP_RELU,
  OP_SCALE,
  OP_RSUB,
  OP_SHIFT,
  OP_SLICE,
  OP_CONCAT,
  OP_INPUT_EACH, /* segment ops (cell.h): a value per input edge        */
  OP_EDGE_SUM,   /* Σ of a per-edge value over the vertex's input edges */
  OP_MATMUL,     /* a per-vertex matrix product (cell.h CN_IR_BMM)      */
  OP_TABLE,      /* the token's row of a table of any rank               */
  OP_STEP        /* a > 0 ? 1 : 0                                        */
};

/* jop.kind of the state list while its references are resolved */
#define CN_CELLS_STATE (-2)

typedef struct jop {
  int kind;
  const char *name; /* borrowed from the JSON; "" when unnamed */
  int width;
  int a, b;                  /* operands (op indices), -1 */
  int nx, x[CN_CELLS_MAX_X]; /* linear, concat */
  int edge;
  int c0, c1; /* cols [c0, c1) */
  int t, bt;  /* tensor indices (m->w), -1 */
  int r0;     /* linear rows start */
  float k;
  bool per_edge; /* a value per input edge (input_each and what reads it) */
  int m, r1;     /* matmul: the left operand's rows; the weight block's
                    rows [r0, r1) (its columns: c0, c1)                 */
  bool identity; /* input: an absent edge reads the identity matrix      */
} jop;

typedef struct memo {
  int op, off, w, node;
} memo;

typedef struct piece {
  int node, w;
} piece;

/* One type being read (or the output layer). */
typedef struct cells_ctx {
  cn_model *m;
  const char *file, *type;
  cn_err *err;
  int n_ops;
  jop *ops;
  cn_ir *g;
  int n_memo;
  memo memo[CN_IR_MAX];
} cells_ctx;

/* Errors: "model.json: cells: type 'internal' op 7 'mul_3' (mul): ..."
 * for op i of the type being read, and "model.json: cells: ..." for the
 * rest. Both return CN_E_BAD_MODEL. */
int cn__cells_op_err(const cells_ctx *c, int i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int cn__cells_bad(cn_err *err, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The index of tensor `name` (key `key` of op i) in m->w, bound on first
 * use; -1 with the error set when the file lacks it or holds NaN or Inf. */
int cn__cells_tensor(cells_ctx *c, int i, const char *key, const json_t *v);
/* Key `key` of o as a [start, end) column range within [0, limit);
 * absent gives [0, limit). */
int cn__cells_get_cols(cells_ctx *c, int i, const json_t *o, const char *key,
                       int limit, int *c0, int *c1);
/* Reads a type's "ops" array into c->ops, checking each op against the
 * weights and deriving its width. */
int cn__cells_parse_ops(cells_ctx *c, const json_t *arr);
/* An operand of op i: an earlier op by index (integer) or by name. */
int cn__cells_get_ref(cells_ctx *c, int i, const json_t *v, const char *key,
                      int *out);
/* Lowers the type's ops that its "state" list needs into c->g, the state
 * columns marked; checks the state's width. */
int cn__cells_lower_state(cells_ctx *c, const json_t *st);

#endif
