/* cell.h - vertex functions as data: a small op IR, its compiler and its
 * executor (ED-Batch §3, Cavs §4.2 fusion).
 *
 * A family describes what one vertex of a type computes as an IR graph
 * (cn_ir): sources read from outside the vertex (an embedding row, a
 * child's state, the mean of the predecessors'), weight blocks, products
 * and elementwise ops. At model load the compiler turns each graph into a
 * cn_cell for a layout:
 *   1. products that share a sum become one product over the concatenated
 *      inputs (K-merge), and products over the same inputs one product with
 *      the concatenated weight rows (N-merge); which sums to K-merge is a
 *      grid search (ED-Batch §3: "search over op batchings") minimising
 *      kernels, then elementwise ops;
 *   2. the elementwise ops between two products are fused into one kernel
 *      (Cavs' fusion), and same-kind ops at one level are batched into one
 *      wider instruction when the layout lets them;
 *   3. memory: CN_LAYOUT_PQ places every variable by the PQ-tree layout
 *      (ED-Batch §3.2, Alg. 2-7, core/cell/pqtree.c) so each product reads and
 *      writes contiguous columns of one row per vertex and outputs land in
 *      the state row; CN_LAYOUT_NAIVE gives every variable its own buffer,
 *      so products gather their operands and scatter their results;
 *   4. the products' weights are packed once, in the order the layout chose.
 * The executor (core/run/cell_exec.c) runs a cell on a batch of n
 * vertices through the backend interface only (gathers, gemm, copy_rows,
 * ew_program). cell/ itself knows no run and no model: it compiles an IR
 * against an array of tensors.
 */
#ifndef CANOPY_CELL_H
#define CANOPY_CELL_H

#include "backend.h"
#include "base/base.h"
#include "input/input.h"

#define CN_IR_MAX 256

typedef enum cn_ir_kind {
  CN_IR_SRC,     /* a value from outside the vertex (src below)            */
  CN_IR_PARAM,   /* floats [r0, r0 + width) of tensor t, every row alike   */
  CN_IR_MATMUL,  /* a · W[r0 : r0 + width, c0 : c0 + width(a)]ᵀ, W = t    */
  CN_IR_ADD,     /* a + b */
  CN_IR_SUB,     /* a - b */
  CN_IR_MUL,     /* a ⊙ b */
  CN_IR_DIV,     /* a / b */
  CN_IR_SIGMOID, /* σ(a) */
  CN_IR_TANH,    /* tanh(a) */
  CN_IR_EXP,     /* e^a */
  CN_IR_SCALE,   /* k · a */
  CN_IR_RSUB,    /* k - a */
  CN_IR_RELU,    /* max(a, 0) */
  CN_IR_STEP,    /* a > 0 ? 1 : 0: a mask, for a choice made per element
                    (m⊙x + (1-m)⊙y is x or y exactly when both are finite) */
  CN_IR_SEG_SUM, /* Σ of edge value a over the vertex's input edges (zero
                    with none): the segment reduction (below)             */
  CN_IR_BMM      /* a per-vertex matrix product (below)                   */
} cn_ir_kind;

typedef enum cn_ir_src {
  CN_SRC_EMBED,      /* columns [c0, c0 + width) of row vaux of tensor t   */
  CN_SRC_INPUT,      /* columns [c0, c0 + width) of input edge r0's state;
                        zero when the vertex has no such input             */
  CN_SRC_INPUT_MEAN, /* mean over every input edge of columns [c0, +width)
                        (zero with none)                                   */
  CN_SRC_INPUT_SUM,  /* their sum                                          */
  CN_SRC_EDGE,       /* columns [c0, c0 + width) of each input edge's
                        state: an edge value (below)                       */
  CN_SRC_SEG         /* compiled cells only: the per-vertex sum of columns
                        [c0, +width) of the edge cell's results            */
} cn_ir_src;

/* Segment ops (child-sum's per-child gates, a lattice char's words): a
 * value is per vertex, or per input edge when it derives from a
 * CN_SRC_EDGE source (params are either). Edge values are
 * computed once per edge of the batch, in edge rows (products over E rows,
 * elementwise work), and reach the vertex only through CN_IR_SEG_SUM; an
 * op may not mix an edge value with a vertex one (no broadcast yet). The
 * compiler splits such a graph in two cells: the edge cell, run over the
 * batch's edges, whose "state" row per edge holds every SEG_SUM operand;
 * then the vertex cell, which reads their sums as CN_SRC_SEG sources (one
 * gather_sum each). Child-Sum Tree-LSTM's forget gates are the example:
 * f_k = σ(U_f h_k + b_f) ⊙ c_k per child, c = … + Σ_k f_k. */

/* Per-vertex weights (MV-RNN's matrices): CN_IR_BMM is, for every vertex, the
 * matrix product L·R of L [m, kk] and R [kk, width / m], each row-major:
 * an operand is a per-vertex value (a, b: a node whose floats are the
 * matrix), or, when a (b) is -1, a block of tensor t shared by the batch:
 * rows from r0, columns from c0, the tensor's own row length apart. Mat-vec
 * products are the width / m = 1 case. A sum of such products becomes one
 * output accumulated in place (beta = 1). A source that only products read
 * may stand for the identity matrix where its edge is absent
 * (CN_FILL_IDENTITY: MV-RNN's unary nodes) instead of zeros. */
typedef enum cn_ir_fill { CN_FILL_ZERO, CN_FILL_IDENTITY } cn_ir_fill;

typedef struct cn_ir_node {
  uint8_t kind, src;
  uint8_t fill;     /* SRC: what an absent input edge reads (cn_ir_fill)   */
  uint8_t from1;    /* SRC INPUT*, EDGE: only the input edges from vertices
                       of type from1 - 1 count (0: every edge): a lattice
                       char's previous char, apart from its words' links  */
  int32_t width;
  int32_t a, b;     /* operands (-1: none)                                 */
  int32_t t;        /* tensor index (family spec order)                    */
  int32_t r0, c0;   /* see the kinds                                       */
  float k;          /* SCALE, RSUB                                         */
  int32_t out_col;  /* >= 0: the value is state columns [out_col, +width)  */
  int32_t m, kk;    /* BMM: the left operand is [m, kk]                    */
  const char *name; /* for dumps                                           */
} cn_ir_node;

typedef struct cn_ir {
  int n;
  int state_floats;
  bool overflow;    /* more than CN_IR_MAX nodes: the family's bug         */
  cn_ir_node node[CN_IR_MAX];
} cn_ir;

/* Builders: each returns the new node's index. */
int cn_ir_src_(cn_ir *g, cn_ir_src src, int t, int edge, int col, int width,
               const char *name);
int cn_ir_param(cn_ir *g, int t, int off, int width);
int cn_ir_matmul(cn_ir *g, int a, int t, int r0, int c0, int width);
int cn_ir_binary(cn_ir *g, cn_ir_kind kind, int a, int b);
int cn_ir_unary(cn_ir *g, cn_ir_kind kind, int a);
int cn_ir_const_op(cn_ir *g, cn_ir_kind kind, float k, int a);
/* Σ_i x[i] · W[r0 : r0 + width, cols of x[i]]ᵀ (+ the bias rows when
 * bt >= 0): the linear layer over the concatenation of x (a view), written
 * as products of weight column blocks and a sum; the compiler decides how
 * to batch them. */
int cn_ir_linear(cn_ir *g, const int *x, int nx, int t, int r0, int width,
                 int bt, int boff);
/* Marks node v as the state columns [col, col + width(v)). */
void cn_ir_output(cn_ir *g, int v, int col);
/* Source v counts only the input edges from vertices of type `type`. */
void cn_ir_from(cn_ir *g, int v, int type);
/* Σ over the vertex's input edges of edge value a (CN_IR_SEG_SUM). */
int cn_ir_seg_sum(cn_ir *g, int a);
/* L·R per vertex (CN_IR_BMM): L [m, kk] is node a, or block (r0, c0) of
 * tensor t when a < 0; R [kk, n] is node b, or that block when b < 0. */
int cn_ir_bmm(cn_ir *g, int a, int b, int t, int r0, int c0, int m, int kk,
              int n);

/* ---- compiled cells --------------------------------------------------- */
typedef enum cn_cell_space {
  CN_SP_NONE,    /* folded into a product / a view of something else      */
  CN_SP_ROW,     /* the batch's cell rows (pq) or its own buffer (naive)   */
  CN_SP_TMP,     /* the fused kernel's per-row scratch                     */
  CN_SP_STATE,   /* the vertex's state row                                  */
  CN_SP_INPLACE, /* a source read where it lives (child state, embedding)  */
  CN_SP_PARAM,   /* a weight row broadcast over the batch                   */
  CN_SP_CONST
} cn_cell_space;

typedef struct cn_cell_var {
  uint8_t space;
  int32_t width;
  int32_t col;     /* ROW (pq): column in the cell row; TMP: in the tmp row;
                      STATE: state column                                  */
  int64_t buf;     /* ROW (naive): its buffer is scratch + n·buf, ld width */
  int32_t node;    /* the IR node it holds                                 */
  int32_t src;     /* INPLACE / gathered sources: index into cell.srcs     */
  int32_t t;       /* PARAM: tensor (its floats from col on)               */
  int32_t out_col; /* >= 0: the value is these state columns               */
  float k;         /* CONST: its value                                      */
} cn_cell_var;

typedef struct cn_cell_src {
  uint8_t kind;    /* cn_ir_src */
  uint8_t fill;    /* cn_ir_fill: an absent edge reads fill_buf            */
  uint8_t from1;   /* input edges from this vertex type + 1 only (0: all)  */
  bool fused;      /* CN_SRC_SEG summed inside a fused kernel: no gather    */
  float *fill_buf; /* zeros an absent edge reads (products only), owned;
                      the identity needs none: a NULL gemm_batched operand */
  int32_t t, edge, col, width;
  int32_t var;     /* ROW var it is gathered into, or -1 (read in place)   */
  bool alias;      /* pq: rows evenly spaced may be read where they are
                      (no product needs it next to another operand)       */
  bool rows;       /* only products read it: a backend with gemm_rows
                      reads its rows where they lie, nothing gathers it   */
} cn_cell_src;

typedef struct cn_cell_gemm {
  int n_in, n_out;
  int32_t in[8], out[16]; /* vars, in packed order                        */
  int32_t K, N;
  float *W;        /* [N, K] packed weights, host, owned                   */
  float *bias;     /* [N] or NULL, owned                                   */
} cn_cell_gemm;

typedef enum cn_cell_step_kind {
  CN_STEP_GATHER, /* sources into ROW vars                                 */
  CN_STEP_GEMM,
  CN_STEP_EW,
  CN_STEP_STORE,  /* naive: output vars copied into the state row          */
  CN_STEP_BMM     /* per-vertex products: one gemm_batched call            */
} cn_cell_step_kind;

typedef struct cn_cell_step {
  uint8_t kind;
  int32_t i;      /* gemm index, ew program index or first bmm             */
  int32_t n;      /* BMM: bmm[i .. i + n), one gemm_batched call: n
                     products of one shape, or (sum) the n terms of one
                     output                                                */
  bool sum;
} cn_cell_step;

/* One per-vertex product: out = L·R (a term of out's sum, when its step
 * is one). An operand is a var (>= 0) or, when -1, the weight block at t
 * (r0, c0). */
typedef struct cn_cell_bmm {
  int32_t l, r, out;
  int32_t t, r0, c0;
  int32_t m, kk, nn;
} cn_cell_bmm;

/* A fused elementwise kernel, ready to launch: operand slot v is var v's
 * view, slot n_vars the per-row scratch (TMP vars), constants inline. */
typedef struct cn_cell_ew {
  int n_insn;
  cn_ew_insn *insn;
  int n_ops;       /* IR ops it fuses, before instruction batching         */
  /* the edge cell's last kernel fused in (segment ops): instructions
   * [edge_begin, edge_end) run per edge, reading the edge cell's vars as
   * slots n_vars + 1 + v (cn_ew_prog's segment loop); 0, 0: none */
  int edge_begin, edge_end;
} cn_cell_ew;

typedef struct cn_cell {
  int layout;      /* cn_layout */
  int type;
  int n_vars, n_srcs, n_gemm, n_ew, n_steps;
  cn_cell_var *vars;
  cn_cell_src srcs[16];
  cn_cell_gemm gemm[8];
  cn_cell_ew ew[8];
  cn_cell_step steps[40];
  int n_bmm;
  cn_cell_bmm bmm[16];
  int64_t row_floats;   /* pq: the cell row; naive: Σ ROW buffer widths   */
  int64_t tmp_floats;   /* the fused kernels' per-row scratch              */
  int64_t copy_floats;  /* naive products' operand staging, per row        */
  int state_floats;
  int n_outputs;        /* naive: output vars the STORE step copies        */
  /* compile-time report (per vertex of a batch) */
  int kernels;          /* launches per execution (gathers included)       */
  int mem_kernels;      /* of which copies inside the cell                 */
  int64_t cell_floats_copied; /* floats moved inside the cell, per vertex  */
  int batches_dropped;  /* PQ batches whose constraint had to go           */
  int ew_batched;       /* elementwise batches run as one instruction      */
  double compile_ms;
  /* segment ops: the edge cell run first over the batch's input edges
   * (its results edge_floats per edge, read by the CN_SRC_SEG sources) */
  struct cn_cell *edge;
  int edge_floats;
  int edge_from1;       /* the edges it runs over: from this type + 1 only */
} cn_cell;

/* Compiles g for a layout, packing the products' weights from w (the
 * model's tensors, indexed as the IR's t); family and type_name name the
 * cell in errors. *out is malloc'd (cn__cell_free). */
int cn__cell_compile_weights(const cn_tensor *const *w, const char *family,
                             int type, const char *type_name, const cn_ir *g,
                             int layout, cn_cell **out, cn_err *err);
void cn__cell_free(cn_cell *c);
/* Scratch floats and index entries one batch of n vertices with `edges`
 * input edges needs. */
int64_t cn__cell_scratch_floats(const cn_cell *c, int64_t n, int64_t edges);
int64_t cn__cell_idx(const cn_cell *c, int64_t n, int64_t edges);

#endif
