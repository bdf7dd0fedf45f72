/* cell_compile.c - a vertex function's op IR into a cn_cell (cell.h):
 * the products (cell_products.c decides them), fusion of the elementwise
 * ops between products, the schedule, the PQ-tree or naive memory layout,
 * and the packed weights. Runs once per (model, type, layout) at
 * model load.
 */
#include <stdlib.h>
#include <string.h>

#include "cell/cell.h"
#include "cell/cell_compiler.h"
#include "cell/cell_impl.h"

static bool is_ew_kind(int k) {
  return k >= CN_IR_ADD && k <= CN_IR_STEP;
}

/* ---- variables ---------------------------------------------------------- */
static int new_var(cn_cell *c, int node, int space, int width) {
  cn_cell_var *v = &c->vars[c->n_vars];
  *v = (cn_cell_var){.space = (uint8_t)space, .width = width, .node = node,
                     .src = -1, .t = -1, .out_col = -1};
  return c->n_vars++;
}

/* The term whose value is node v (a product's output), or -1. */
static int term_of_value(const compiler *cp, int v) {
  for (int i = 0; i < cp->n_terms; i++)
    if (cp->terms[i].value == v) return i;
  return -1;
}

/* An elementwise node once products are decided: the IR's own ew ops
 * outside merged sums, plus the roots of unmerged sums (a chain of adds
 * over their products' outputs). */
static bool ew_node(const compiler *cp, int v) {
  const cn_ir_node *nd = &cp->g->node[v];
  int t = cp->tree_of[v];
  if (cp->bmm_root[v] >= 0) return false; /* a per-vertex product or sum */
  if (t >= 0)
    return cp->trees[t].root == v && !cp->merged[t] &&
           cp->trees[t].n_mm > 1;
  return is_ew_kind(nd->kind);
}

/* The operands an ew node reads (unmerged sum: its products' outputs). */
static int ew_operands(const compiler *cp, int v, int *ops) {
  const cn_ir_node *nd = &cp->g->node[v];
  int t = cp->tree_of[v];
  if (t >= 0) {
    for (int k = 0; k < cp->trees[t].n_mm; k++) ops[k] = cp->trees[t].mm[k];
    return cp->trees[t].n_mm;
  }
  int n = 0;
  if (nd->a >= 0) ops[n++] = nd->a;
  if (nd->b >= 0) ops[n++] = nd->b;
  return n;
}

/* Kahn order over products and fused elementwise kernels: all ready
 * elementwise ops form one kernel, then every ready product, repeat.
 * Fills producer[] with the step index of each value. */
static int schedule(compiler *cp) {
  const cn_ir *g = cp->g;
  cn_cell *c = cp->c;
  int left = 0;
  for (int v = 0; v < g->n; v++) {
    cp->producer[v] = -1;
    int k = g->node[v].kind;
    cp->done[v] = k == CN_IR_SRC || k == CN_IR_PARAM;
    cp->is_ew[v] = ew_node(cp, v);
    if (cp->is_ew[v]) left++;
  }
  /* need[v]: some product still reads v, directly or through ew ops. An
   * ew op joins a kernel only when a product waits for it, or when no
   * product is left: so the ops that do not feed a product all fuse into
   * the last kernel instead of opening an early one. */
  bool need[CN_IR_MAX] = {false};
  for (int j = 0; j < cp->n_gemm; j++)
    for (int k = 0; k < cp->gemm_nin[j]; k++) need[cp->gemm_in[j][k]] = true;
  int bmm_left = 0;
  for (int v = 0; v < g->n; v++) {
    bmm_left += cp->bmm_root[v] == v;
    if (!is_bmm(g, v)) continue;
    if (g->node[v].a >= 0) need[g->node[v].a] = true;
    if (g->node[v].b >= 0) need[g->node[v].b] = true;
  }
  for (int v = g->n - 1; v >= 0; v--) {
    if (!need[v] || !cp->is_ew[v]) continue;
    int ops[8], n = ew_operands(cp, v, ops);
    for (int k = 0; k < n; k++) need[ops[k]] = true;
  }
  bool gemm_done[8] = {false};
  int gemms_left = cp->n_gemm;
  c->n_ew = 0;
  while (left > 0 || gemms_left > 0 || bmm_left > 0) {
    bool progress = false;
    /* One fused kernel: every ew op whose operands are ready, in node
     * (topological) order so chains join the same kernel. */
    int ew_index = -1, step = -1;
    for (int v = 0; v < g->n; v++) {
      if (!cp->is_ew[v] || cp->done[v]) continue;
      if ((gemms_left > 0 || bmm_left > 0) && !need[v]) continue;
      int ops[8], n = ew_operands(cp, v, ops);
      bool ready = true;
      for (int k = 0; k < n; k++) ready &= available(cp, ops[k]);
      if (!ready) continue;
      if (ew_index < 0) {
        if (c->n_ew >= 8) return CN_E_INTERNAL;
        ew_index = c->n_ew++;
        c->ew[ew_index] = (cn_cell_ew){0};
        int rc = add_step(c, CN_STEP_EW, ew_index);
        if (rc != 0) return rc;
        step = c->n_steps - 1;
      }
      cp->done[v] = true;
      cp->producer[v] = step;
      c->ew[ew_index].n_ops++;
      left--;
      progress = true;
    }
    for (int j = 0; j < cp->n_gemm; j++) {
      if (gemm_done[j]) continue;
      bool ready = true;
      for (int k = 0; k < cp->gemm_nin[j]; k++)
        ready &= available(cp, cp->gemm_in[j][k]);
      if (!ready) continue;
      gemm_done[j] = true;
      gemms_left--;
      progress = true;
      int rc = add_step(c, CN_STEP_GEMM, j);
      if (rc != 0) return rc;
      for (int q = 0; q < cp->gemm_nt[j]; q++) {
        int val = cp->terms[cp->gemm_terms[j][q]].value;
        cp->done[val] = true;
        cp->producer[val] = c->n_steps - 1;
      }
    }
    int rc = cn__cell_schedule_bmm(cp, &progress);
    if (rc != 0) return rc;
    bmm_left = 0;
    for (int v = 0; v < g->n; v++)
      bmm_left += cp->bmm_root[v] == v && !cp->done[v];
    if (!progress) return CN_E_INTERNAL; /* a cycle: the family's bug */
  }
  return 0;
}

/* ---- variables and spaces ------------------------------------------------ */
static bool consumed_by_gemm(const compiler *cp, int v) {
  for (int j = 0; j < cp->n_gemm; j++)
    for (int k = 0; k < cp->gemm_nin[j]; k++)
      if (cp->gemm_in[j][k] == v) return true;
  return false;
}

/* Last step reading v among ew nodes; -1 if none. */
static int last_ew_reader(const compiler *cp, int v) {
  int last = -1;
  for (int u = 0; u < cp->g->n; u++) {
    if (!cp->is_ew[u]) continue;
    int ops[8], n = ew_operands(cp, u, ops);
    for (int k = 0; k < n; k++)
      if (ops[k] == v && cp->producer[u] > last) last = cp->producer[u];
  }
  return last;
}

/* Whether a per-vertex product reads v. */
static bool read_by_bmm(const compiler *cp, int v) {
  for (int u = 0; u < cp->g->n; u++)
    if (is_bmm(cp->g, u) && (cp->g->node[u].a == v || cp->g->node[u].b == v))
      return true;
  return false;
}

static int make_vars(compiler *cp) {
  const cn_ir *g = cp->g;
  cn_cell *c = cp->c;
  bool naive = cp->layout == CN_LAYOUT_NAIVE;
  for (int v = 0; v < g->n; v++) cp->var_of[v] = -1;
  for (int v = 0; v < g->n; v++) {
    const cn_ir_node *nd = &g->node[v];
    if (cp->bmm_root[v] >= 0 && cp->bmm_root[v] != v)
      continue; /* a member of a sum: the sum's var (below) */
    bool value = nd->kind == CN_IR_SRC || nd->kind == CN_IR_PARAM ||
                 cp->is_ew[v] || term_of_value(cp, v) >= 0 ||
                 cp->bmm_root[v] == v;
    if (!value) continue;
    if (nd->kind == CN_IR_PARAM) {
      if (last_ew_reader(cp, v) < 0) continue; /* only folded into biases */
      int var = new_var(c, v, CN_SP_PARAM, nd->width);
      c->vars[var].t = nd->t;
      c->vars[var].col = nd->r0;
      cp->var_of[v] = var;
      continue;
    }
    if (nd->kind == CN_IR_SRC) {
      if (c->n_srcs >= (int)CN_ARRAY_SIZE(c->srcs)) return CN_E_INTERNAL;
      bool pooled = nd->src == CN_SRC_INPUT_MEAN ||
                    nd->src == CN_SRC_INPUT_SUM || nd->src == CN_SRC_SEG;
      bool others = consumed_by_gemm(cp, v) || last_ew_reader(cp, v) >= 0;
      /* only per-vertex products read it: they read it where it lies (an
       * absent edge: the fill buffer), in every layout */
      /* a source that is itself state columns is gathered straight there */
      bool to_state = nd->out_col >= 0;
      bool bmm_only = read_by_bmm(cp, v) && !others && !pooled && !to_state;
      bool gather = to_state || (!bmm_only && (naive || pooled ||
                                               consumed_by_gemm(cp, v)));
      if (nd->fill != CN_FILL_ZERO && !bmm_only) return CN_E_INTERNAL;
      int var = new_var(c, v,
                        to_state && !naive ? CN_SP_STATE
                        : gather           ? CN_SP_ROW
                                           : CN_SP_INPLACE,
                        nd->width);
      if (to_state) {
        c->vars[var].out_col = nd->out_col;
        if (!naive) c->vars[var].col = nd->out_col;
      }
      c->vars[var].src = c->n_srcs;
      cn_cell_src *src = &c->srcs[c->n_srcs++];
      *src = (cn_cell_src){.kind = nd->src, .fill = nd->fill,
                           .from1 = nd->from1, .t = nd->t,
                           .edge = nd->r0, .col = nd->c0,
                           .width = nd->width, .var = gather ? var : -1};
      /* what an absent edge reads: zeros from a buffer of the cell's, or
       * the identity, which gemm_batched takes as a NULL operand */
      if (bmm_only && nd->src == CN_SRC_INPUT &&
          nd->fill == CN_FILL_ZERO) {
        src->fill_buf = calloc((size_t)nd->width, sizeof(float));
        if (src->fill_buf == NULL) return CN_E_NOMEM;
      }
      cp->var_of[v] = var;
      continue;
    }
    int space;
    if (nd->out_col >= 0 && !naive)
      space = CN_SP_STATE;
    else if (nd->out_col >= 0 || consumed_by_gemm(cp, v) ||
             term_of_value(cp, v) >= 0 || cp->bmm_root[v] == v ||
             read_by_bmm(cp, v) || last_ew_reader(cp, v) > cp->producer[v])
      space = CN_SP_ROW;
    else
      space = CN_SP_TMP;
    int var = new_var(c, v, space, nd->width);
    if (space == CN_SP_STATE) c->vars[var].col = nd->out_col;
    c->vars[var].out_col = nd->out_col;
    cp->var_of[v] = var;
  }
  for (int v = 0; v < g->n; v++) /* a sum's members write the sum's var */
    if (cp->bmm_root[v] >= 0) cp->var_of[v] = cp->var_of[cp->bmm_root[v]];
  return 0;
}

/* ---- elementwise programs ----------------------------------------------- */
static int ew_op_of(int kind) {
  switch (kind) {
  case CN_IR_ADD: return CN_EW_ADD;
  case CN_IR_SUB: case CN_IR_RSUB: return CN_EW_SUB;
  case CN_IR_MUL: case CN_IR_SCALE: return CN_EW_MUL;
  case CN_IR_DIV: return CN_EW_DIV;
  case CN_IR_SIGMOID: return CN_EW_SIGMOID;
  case CN_IR_TANH: return CN_EW_TANH;
  case CN_IR_RELU: return CN_EW_RELU;
  case CN_IR_STEP: return CN_EW_STEP;
  default: return CN_EW_EXP;
  }
}

/* Constant operands are vars too (CN_SP_CONST). */
static int const_var(cn_cell *c, float k) {
  int v = new_var(c, -1, CN_SP_CONST, 0);
  c->vars[v].k = k;
  return v;
}

static int lower_ew(compiler *cp, cell_item *items, int *n_items) {
  const cn_ir *g = cp->g;
  cn_cell *c = cp->c;
  int n = 0;
  for (int v = 0; v < g->n; v++) {
    if (!cp->is_ew[v]) continue;
    int kernel = c->steps[cp->producer[v]].i;
    int d = cp->var_of[v], w = g->node[v].width;
    int ops[8], no = ew_operands(cp, v, ops);
    int lvl = 0;
    for (int k = 0; k < no; k++)
      if (cp->producer[ops[k]] == cp->producer[v] &&
          cp->level[ops[k]] + 1 > lvl)
        lvl = cp->level[ops[k]] + 1;
    cp->level[v] = lvl + (no > 2 && cp->tree_of[v] >= 0 ? no - 2 : 0);
    if (cp->tree_of[v] >= 0) { /* unmerged sum: d = t1 + t2 (+ t3 ...) */
      for (int k = 1; k < no; k++) {
        if (n >= 4 * CN_IR_MAX) return CN_E_INTERNAL;
        items[n] = (cell_item){
            v, kernel, lvl + k - 1, n,
            {CN_EW_ADD, w, d, k == 1 ? cp->var_of[ops[0]] : d,
             cp->var_of[ops[k]]}};
        n++;
      }
      continue;
    }
    const cn_ir_node *nd = &g->node[v];
    int a = cp->var_of[nd->a], b = nd->b >= 0 ? cp->var_of[nd->b] : -1;
    if (nd->kind == CN_IR_SCALE) b = const_var(c, nd->k);
    if (nd->kind == CN_IR_RSUB) b = a, a = const_var(c, nd->k);
    items[n] = (cell_item){v, kernel, lvl, n,
                           {(uint8_t)ew_op_of(nd->kind), w, d, a, b}};
    n++;
  }
  *n_items = n;
  return 0;
}

static int item_cmp(const void *x, const void *y) {
  const cell_item *a = x, *b = y;
  if (a->kernel != b->kernel) return a->kernel - b->kernel;
  if (a->level != b->level) return a->level - b->level;
  return a->seq - b->seq;
}

/* Same-kind instructions at one level of one kernel whose operands all
 * live in the cell row or the tmp row: candidates for one wider
 * instruction (an ED-Batch batch with operands d, a, b). */
static bool batchable_var(const cn_cell *c, int v) {
  return v >= 0 && (c->vars[v].space == CN_SP_ROW ||
                    c->vars[v].space == CN_SP_TMP);
}

static bool same_group(const cn_cell *c, const cell_item *x, const cell_item *y) {
  const var_insn *p = &x->insn, *q = &y->insn;
  if (x->kernel != y->kernel || x->level != y->level || p->op != q->op ||
      p->width != q->width)
    return false;
  int pv[3] = {p->d, p->a, p->b}, qv[3] = {q->d, q->a, q->b};
  for (int k = 0; k < 3; k++) {
    if ((pv[k] < 0) != (qv[k] < 0)) return false;
    if (pv[k] < 0) continue;
    if (!batchable_var(c, pv[k]) || !batchable_var(c, qv[k])) return false;
    if (c->vars[pv[k]].space != c->vars[qv[k]].space) return false;
  }
  return p->d != p->a && p->d != p->b; /* chains accumulate in place */
}

/* ---- layout --------------------------------------------------------------- */
/* Packs a product's weights [N, K] and bias in its operand order. */
static int pack_gemm(compiler *cp, int j) {
  cn_cell *c = cp->c;
  cn_cell_gemm *gm = &c->gemm[j];
  int64_t colof[CN_IR_MAX] = {0};
  int64_t K = 0, N = 0;
  for (int k = 0; k < gm->n_in; k++) {
    colof[c->vars[gm->in[k]].node] = K;
    K += c->vars[gm->in[k]].width;
  }
  for (int q = 0; q < gm->n_out; q++) N += c->vars[gm->out[q]].width;
  gm->K = (int32_t)K;
  gm->N = (int32_t)N;
  gm->W = calloc((size_t)(N * K), sizeof(float));
  if (gm->W == NULL) return CN_E_NOMEM;
  int64_t row = 0;
  bool any_bias = false;
  for (int q = 0; q < gm->n_out; q++) {
    const term *tm = &cp->terms[term_of_value(cp, c->vars[gm->out[q]].node)];
    int w = c->vars[gm->out[q]].width;
    for (int k = 0; k < tm->n_mm; k++) {
      const cn_ir_node *mm = &cp->g->node[tm->mm[k]];
      const cn_tensor *T = cp->w[mm->t];
      int64_t cols = T->ndim == 2 ? T->shape[1] : 1;
      int kw = cp->g->node[mm->a].width;
      for (int i = 0; i < w; i++)
        for (int jj = 0; jj < kw; jj++)
          gm->W[(row + i) * K + colof[mm->a] + jj] +=
              T->data[(mm->r0 + i) * cols + mm->c0 + jj];
    }
    any_bias |= tm->n_par > 0;
    row += w;
  }
  if (!any_bias) return 0;
  gm->bias = calloc((size_t)N, sizeof(float));
  if (gm->bias == NULL) return CN_E_NOMEM;
  row = 0;
  for (int q = 0; q < gm->n_out; q++) {
    const term *tm = &cp->terms[term_of_value(cp, c->vars[gm->out[q]].node)];
    int w = c->vars[gm->out[q]].width;
    for (int k = 0; k < tm->n_par; k++) {
      const cn_ir_node *p = &cp->g->node[tm->par[k]];
      for (int i = 0; i < w; i++)
        gm->bias[row + i] += cp->w[p->t]->data[p->r0 + i];
    }
    row += w;
  }
  return 0;
}

/* A plain source (one input edge, or an embedding row) that no fused
 * kernel reads and no state column holds is only ever a product's
 * operand: a backend with gemm_rows reads it where it lies (cell_exec.c),
 * the concatenation the product sees never copied together (Serenity
 * §3.3's identity rewriting). */
static void mark_product_only_sources(cn_cell *c) {
  for (int s = 0; s < c->n_srcs; s++) {
    cn_cell_src *src = &c->srcs[s];
    int v = src->var;
    src->rows = v >= 0 && c->vars[v].out_col < 0 &&
                (src->kind == CN_SRC_INPUT || src->kind == CN_SRC_EMBED ||
                 src->kind == CN_SRC_EDGE);
    for (int e = 0; e < c->n_ew && src->rows; e++)
      for (int i = 0; i < c->ew[e].n_insn; i++) {
        const cn_ew_insn *in = &c->ew[e].insn[i];
        if (in->d.slot == v || in->a.slot == v || in->b.slot == v)
          src->rows = false;
      }
  }
}

/* The compiler's decisions before any instruction: the uses of each
 * node, the product trees and per-vertex product sums, how products are
 * batched, the steps' order and the variables. On failure *why says which
 * fixed size the cell outgrew. */
static int plan(compiler *cp, const char **why) {
  const cn_ir *g = cp->g;
  for (int v = 0; v < g->n; v++) {
    if (g->node[v].a >= 0) cp->uses[g->node[v].a]++;
    if (g->node[v].b >= 0) cp->uses[g->node[v].b]++;
  }
  cn__cell_find_trees(cp);
  cn__cell_find_bmm_sums(cp);
  int rc = cn__cell_choose_batching(cp);
  if (rc != 0) *why = " (more than 8 products, or 32 product blocks)";
  if (rc == 0) rc = add_step(cp->c, CN_STEP_GATHER, 0);
  if (rc == 0 && (rc = schedule(cp)) != 0)
    *why = " (more than 8 fused elementwise kernels or 40 steps)";
  if (rc == 0 && (rc = make_vars(cp)) != 0)
    *why = " (more than 16 sources, or an identity-filled source that is not "
           "only a per-vertex product's operand)";
  return rc;
}

/* The cell's products over its variables: each per-vertex product's
 * operand vars (or a weight block), refused where an identity-filled
 * operand is not square in its place; each batched product's inputs and
 * outputs. */
static int bind_products(compiler *cp, const char **why) {
  cn_cell *c = cp->c;
  const cn_ir *g = cp->g;
  c->n_bmm = cp->n_bmm_step;
  for (int k = 0; k < cp->n_bmm_step; k++) {
    const cn_ir_node *nd = &g->node[cp->bmm_node[k]];
    c->bmm[k] = (cn_cell_bmm){
        .l = nd->a >= 0 ? cp->var_of[nd->a] : -1,
        .r = nd->b >= 0 ? cp->var_of[nd->b] : -1,
        .out = cp->var_of[cp->bmm_node[k]],
        .t = nd->t, .r0 = nd->r0, .c0 = nd->c0,
        .m = nd->m, .kk = nd->kk, .nn = nd->width / nd->m};
    /* the identity stands in only where it is square in its place */
    const cn_cell_bmm *bm = &c->bmm[k];
    for (int q = 0; q < 2; q++) {
      int v = q == 0 ? bm->l : bm->r;
      if (v >= 0 && c->vars[v].src >= 0 &&
          c->srcs[c->vars[v].src].fill == CN_FILL_IDENTITY &&
          (q == 0 ? bm->m != bm->kk : bm->kk != bm->nn)) {
        *why = " (an identity-filled operand of a product that is not square)";
        return CN_E_INTERNAL;
      }
    }
  }
  c->n_gemm = cp->n_gemm;
  for (int j = 0; j < cp->n_gemm; j++) {
    cn_cell_gemm *gm = &c->gemm[j];
    gm->n_in = cp->gemm_nin[j];
    for (int k = 0; k < gm->n_in; k++) gm->in[k] = cp->var_of[cp->gemm_in[j][k]];
    gm->n_out = cp->gemm_nt[j];
    for (int q = 0; q < gm->n_out; q++)
      gm->out[q] = cp->var_of[cp->terms[cp->gemm_terms[j][q]].value];
  }
  return 0;
}

/* Groups the level-sorted elementwise items: each item with the later
 * ones same_group accepts (at most 16 a group); in_group[i] is item i's
 * group or -1. Returns the number of groups. Level order inside each
 * kernel is a valid order for any grouping of same-level instructions
 * (their operands come from lower levels). */
static int group_items(const cn_cell *c, const cell_item *items, int n_items,
                       cell_group *groups, int *in_group) {
  int n_groups = 0;
  for (int i = 0; i < n_items; i++) in_group[i] = -1;
  for (int i = 0; i < n_items; i++) {
    if (in_group[i] >= 0 || n_groups >= CN_IR_MAX) continue;
    cell_group gr = {.n = 1, .item = {i}};
    for (int j = i + 1; j < n_items && gr.n < 16; j++)
      if (in_group[j] < 0 && same_group(c, &items[i], &items[j]))
        gr.item[gr.n++] = j;
    if (gr.n < 2) continue;
    for (int k = 0; k < gr.n; k++) in_group[gr.item[k]] = n_groups;
    groups[n_groups++] = gr;
  }
  return n_groups;
}

/* A source read in place (alias): one input edge or segment edge that no
 * state column holds and no product reads among several inputs. */
static void mark_alias_sources(cn_cell *c) {
  for (int s = 0; s < c->n_srcs; s++) {
    cn_cell_src *src = &c->srcs[s];
    src->alias = src->var >= 0 && c->vars[src->var].out_col < 0 &&
                 (src->kind == CN_SRC_INPUT || src->kind == CN_SRC_EDGE);
    for (int j = 0; j < c->n_gemm; j++)
      for (int k = 0; k < c->gemm[j].n_in && c->gemm[j].n_in > 1; k++)
        if (c->gemm[j].in[k] == src->var) src->alias = false;
  }
}

int cn__cell_compile_one(const cn_tensor *const *w, const char *family,
                         int type, const char *type_name, const cn_ir *g,
                         int layout, cn_cell **out, cn_err *err) {
  double t0 = cn__now_ms();
  /* what a failure means, for the message (a described cell can ask for
   * more than the fixed-size cell holds) */
  const char *why = "";
  *out = NULL;
  if (g->overflow || g->n == 0)
    return cn_err_set(err, CN_E_INTERNAL,
                      "%s: the %s cell's IR is malformed (too many nodes or "
                      "mismatched widths)",
                      family, type_name);
  compiler *cp = calloc(1, sizeof(*cp));
  cn_cell *c = calloc(1, sizeof(*c));
  cell_item *items = calloc(4 * CN_IR_MAX, sizeof(*items));
  cell_group *groups = calloc(CN_IR_MAX, sizeof(*groups));
  int rc = CN_E_NOMEM;
  if (cp == NULL || c == NULL || items == NULL || groups == NULL) goto out;
  c->vars = calloc(3 * CN_IR_MAX, sizeof(cn_cell_var));
  if (c->vars == NULL) goto out;
  c->layout = layout;
  c->type = type;
  c->state_floats = g->state_floats;
  cp->w = w;
  cp->g = g;
  cp->layout = layout;
  cp->c = c;
  if ((rc = plan(cp, &why)) != 0 || (rc = bind_products(cp, &why)) != 0)
    goto out;
  /* Elementwise: lower, group, lay out, emit. */
  int n_items = 0;
  rc = lower_ew(cp, items, &n_items);
  if (rc != 0) goto out;
  qsort(items, (size_t)n_items, sizeof(*items), item_cmp);
  int in_group[4 * CN_IR_MAX];
  int n_groups = group_items(c, items, n_items, groups, in_group);
  unsigned char kept[CN_IR_MAX];
  rc = cn__cell_layout(c, groups, n_groups, items, kept);
  if (rc != 0) goto out;
  mark_alias_sources(c);
  for (int j = 0; j < c->n_gemm; j++) {
    cn__cell_sort_by_pos(c, c->gemm[j].in, c->gemm[j].n_in);
    cn__cell_sort_by_pos(c, c->gemm[j].out, c->gemm[j].n_out);
    if ((rc = pack_gemm(cp, j)) != 0) goto out;
  }
  if ((rc = cn__cell_emit(c, items, n_items, groups, in_group, kept)) != 0)
    goto out;
  mark_product_only_sources(c);
  /* Naive: outputs are written to their own buffers, then stored. */
  if (layout == CN_LAYOUT_NAIVE) {
    for (int v = 0; v < g->n; v++) c->n_outputs += g->node[v].out_col >= 0;
    if (c->n_outputs > 0 && (rc = add_step(c, CN_STEP_STORE, 0)) != 0)
      goto out;
  }
  cn__cell_count_costs(c);
  c->compile_ms = cn__now_ms() - t0;
  *out = c;
  c = NULL;
  rc = 0;
out:
  if (rc != 0 && rc != CN_E_NOMEM)
    cn_err_set(err, rc, "%s: the %s cell could not be compiled%s",
               family, type_name, why);
  else if (rc == CN_E_NOMEM)
    cn_err_set(err, rc, "no memory to compile the %s cell",
               type_name);
  cn__cell_free(c);
  free(cp);
  free(items);
  free(groups);
  return rc;
}
