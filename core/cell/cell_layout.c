/* cell_layout.c - the memory side of a compiled vertex function: the
 * PQ-tree layout of its variables (ED-Batch §3.2) or one buffer each
 * (naive), the fused kernels' instructions in launch form, what an
 * execution costs, and the cell object's own upkeep. */
#include <stdlib.h>
#include <string.h>

#include "cell/cell_impl.h"
#include "cell/pqtree.h"

/* The launch form of an instruction: var v is slot v, TMP vars live in
 * the scratch slot (numbered n_vars) at their column, constants inline.
 * Every var exists by now, so this is done once, here, not per batch. */
static cn_ew_insn bind_insn(const cn_cell *c, const var_insn *in) {
  int32_t v3[3] = {in->d, in->a, in->b};
  cn_ew_arg args[3];
  for (int k = 0; k < 3; k++) {
    args[k] = (cn_ew_arg){-1, 0, 0.0f};
    if (v3[k] < 0) continue;
    const cn_cell_var *x = &c->vars[v3[k]];
    if (x->space == CN_SP_CONST)
      args[k].k = x->k;
    else if (x->space == CN_SP_TMP)
      args[k] = (cn_ew_arg){(int16_t)c->n_vars, x->col, 0.0f};
    else
      args[k] = (cn_ew_arg){(int16_t)v3[k], 0, 0.0f};
  }
  return (cn_ew_insn){in->op, in->width, args[0], args[1], args[2]};
}

/* ---- layout --------------------------------------------------------------- */
int cn__cell_layout(cn_cell *c, const cell_group *groups, int n_groups,
                    const cell_item *items, unsigned char *kept) {
  int nv = c->n_vars;
  if (c->layout == CN_LAYOUT_NAIVE) {
    int64_t buf = 0, tmp = 0;
    for (int v = 0; v < nv; v++) {
      cn_cell_var *x = &c->vars[v];
      if (x->space == CN_SP_ROW) x->buf = buf, buf += x->width;
      if (x->space == CN_SP_TMP) x->col = (int32_t)tmp, tmp += x->width;
    }
    c->row_floats = buf;
    c->tmp_floats = tmp;
    memset(kept, 0, (size_t)n_groups);
    return 0;
  }
  /* The PQ batches: each product's inputs and outputs (one operand each:
   * adjacency, any order: its weights follow), then the ew groups. */
  cn_pq_batch b[64];
  int vars[64 * 48];
  int nb = 0, used = 0;
  for (int j = 0; j < c->n_gemm; j++) {
    const cn_cell_gemm *gm = &c->gemm[j];
    if (gm->n_in > 1) {
      for (int k = 0; k < gm->n_in; k++) vars[used + k] = gm->in[k];
      b[nb++] = (cn_pq_batch){1, gm->n_in, vars + used};
      used += gm->n_in;
    }
    bool rows = gm->n_out > 1;
    for (int k = 0; k < gm->n_out; k++)
      rows &= c->vars[gm->out[k]].space == CN_SP_ROW;
    if (rows) {
      for (int k = 0; k < gm->n_out; k++) vars[used + k] = gm->out[k];
      b[nb++] = (cn_pq_batch){1, gm->n_out, vars + used};
      used += gm->n_out;
    }
  }
  int first_group = nb;
  for (int gi = 0; gi < n_groups && nb < 64; gi++) {
    const cell_group *gr = &groups[gi];
    const var_insn *i0 = &items[gr->item[0]].insn;
    int m = 1 + (i0->a >= 0) + (i0->b >= 0);
    for (int k = 0; k < gr->n; k++) {
      const var_insn *in = &items[gr->item[k]].insn;
      int opv[3] = {in->d, in->a, in->b}, o = 0;
      for (int q = 0; q < 3; q++)
        if (opv[q] >= 0) vars[used + o++ * gr->n + k] = opv[q];
    }
    b[nb++] = (cn_pq_batch){m, gr->n, vars + used};
    used += m * gr->n;
  }
  int order[CN_IR_MAX * 2];
  unsigned char keep[64];
  if (cn_pq_layout(nv, b, nb, order, keep) != 0) return CN_E_NOMEM;
  for (int k = 0; k < nb; k++) c->batches_dropped += !keep[k];
  for (int gi = 0; gi < n_groups; gi++)
    kept[gi] = first_group + gi < nb ? keep[first_group + gi] : 0;
  int64_t row = 0, tmp = 0;
  for (int p = 0; p < nv; p++) {
    cn_cell_var *x = &c->vars[order[p]];
    if (x->space == CN_SP_ROW) x->col = (int32_t)row, row += x->width;
    if (x->space == CN_SP_TMP) x->col = (int32_t)tmp, tmp += x->width;
  }
  c->row_floats = row;
  c->tmp_floats = tmp;
  return 0;
}

static int var_pos(const cn_cell *c, int v) {
  const cn_cell_var *x = &c->vars[v];
  return x->space == CN_SP_ROW && c->layout == CN_LAYOUT_NAIVE ? (int)x->buf
                                                               : x->col;
}

/* Sorts a product's operand vars by their place in memory, so a
 * contiguous run reads as one matrix (the packing follows this order). */
void cn__cell_sort_by_pos(const cn_cell *c, int32_t *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && var_pos(c, v[j]) < var_pos(c, v[j - 1]); j--) {
      int32_t t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
}

/* Whether vars v[0..n) lie back to back in one space, in this order. */
static bool contiguous(const cn_cell *c, const int32_t *v, int n) {
  for (int i = 1; i < n; i++) {
    const cn_cell_var *p = &c->vars[v[i - 1]], *q = &c->vars[v[i]];
    if (p->space != q->space || p->space == CN_SP_INPLACE) return false;
    if (p->space == CN_SP_ROW && c->layout == CN_LAYOUT_NAIVE) return false;
    if (q->col != p->col + p->width) return false;
  }
  return true;
}

/* Kernels and floats copied per execution, by the executor's own rule. */
void cn__cell_count_costs(cn_cell *c) {
  int kernels = 0, mem = 0;
  int64_t copied = 0;
  for (int s = 0; s < c->n_srcs; s++) kernels += c->srcs[s].var >= 0;
  for (int j = 0; j < c->n_gemm; j++) {
    const cn_cell_gemm *gm = &c->gemm[j];
    kernels++;
    if (gm->n_in > 1 && !contiguous(c, gm->in, gm->n_in))
      mem += gm->n_in, copied += gm->K;
    if (gm->n_out > 1 && !contiguous(c, gm->out, gm->n_out))
      mem += gm->n_out, copied += gm->N;
  }
  kernels += c->n_ew;
  for (int s = 0; s < c->n_steps; s++) {
    if (c->steps[s].kind == CN_STEP_STORE) kernels += c->n_outputs;
    if (c->steps[s].kind == CN_STEP_BMM) /* a device: a product a term */
      kernels += c->steps[s].sum ? c->steps[s].n : 1;
  }
  c->kernels = kernels + mem;
  c->mem_kernels = mem;
  c->cell_floats_copied = copied;
  int64_t stage = 0;
  for (int j = 0; j < c->n_gemm; j++) {
    /* the executor stages inputs at 0 and outputs after K */
    int64_t k = c->gemm[j].K, nn = c->gemm[j].n_out > 1 ? c->gemm[j].N : 0;
    if (k + nn > stage) stage = k + nn;
  }
  c->copy_floats = stage;
}

/* Emits each fused kernel's instructions in item order; a kept group
 * whose operands came out contiguous and aligned becomes one wider
 * instruction. */
int cn__cell_emit(cn_cell *c, const cell_item *items, int n_items,
                  const cell_group *groups, const int *in_group,
                  const unsigned char *kept) {
  for (int e = 0; e < c->n_ew; e++) {
    c->ew[e].insn = calloc((size_t)n_items + 1, sizeof(cn_ew_insn));
    if (c->ew[e].insn == NULL) return CN_E_NOMEM;
  }
  bool emitted[4 * CN_IR_MAX] = {false};
  for (int i = 0; i < n_items; i++) {
    if (emitted[i]) continue;
    cn_cell_ew *ew = &c->ew[items[i].kernel];
    int gi = in_group[i];
    if (gi >= 0 && kept[gi]) {
      const cell_group *gr = &groups[gi];
      /* ops sorted by the place of their result */
      int idx[16] = {0};
      for (int k = 0; k < gr->n; k++) idx[k] = gr->item[k];
      for (int a = 1; a < gr->n; a++)
        for (int b = a; b > 0 && c->vars[items[idx[b]].insn.d].col <
                                     c->vars[items[idx[b - 1]].insn.d].col;
             b--) {
          int t = idx[b];
          idx[b] = idx[b - 1];
          idx[b - 1] = t;
        }
      int32_t dv[16], av[16], bv[16];
      for (int k = 0; k < gr->n; k++) {
        dv[k] = items[idx[k]].insn.d;
        av[k] = items[idx[k]].insn.a;
        bv[k] = items[idx[k]].insn.b;
      }
      const var_insn *i0 = &items[idx[0]].insn;
      bool ok = contiguous(c, dv, gr->n) &&
                (i0->a < 0 || contiguous(c, av, gr->n)) &&
                (i0->b < 0 || contiguous(c, bv, gr->n));
      /* The batched instruction must come where its first member was:
       * every member's operands are ready by then (same level). */
      if (ok) {
        var_insn in = *i0;
        in.width = i0->width * gr->n;
        ew->insn[ew->n_insn++] = bind_insn(c, &in);
        for (int k = 0; k < gr->n; k++) emitted[gr->item[k]] = true;
        c->ew_batched++;
        continue;
      }
    }
    ew->insn[ew->n_insn++] = bind_insn(c, &items[i].insn);
    emitted[i] = true;
  }
  return 0;
}

void cn__cell_free(cn_cell *c) {
  if (c == NULL) return;
  for (int j = 0; j < c->n_gemm; j++) {
    free(c->gemm[j].W);
    free(c->gemm[j].bias);
  }
  for (int e = 0; e < c->n_ew; e++) free(c->ew[e].insn);
  for (int s = 0; s < c->n_srcs; s++) free(c->srcs[s].fill_buf);
  cn__cell_free(c->edge);
  free(c->vars);
  free(c);
}

/* With an edge cell (segment ops): the vertex cell's scratch, then the
 * edge results [edges, edge_floats], then the edge cell's scratch. */
int64_t cn__cell_scratch_floats(const cn_cell *c, int64_t n, int64_t edges) {
  int64_t s = n * (c->row_floats + c->copy_floats) + 16;
  if (c->edge != NULL)
    s += edges * c->edge_floats + cn__cell_scratch_floats(c->edge, edges, 0);
  return s;
}

int64_t cn__cell_idx(const cn_cell *c, int64_t n, int64_t edges) {
  /* + the per-vertex products' operand pointers (3 per row each) */
  int64_t i = (int64_t)c->n_srcs * (n + edges + 1) + 2 * n + 1 +
              3 * (int64_t)c->n_bmm * n;
  if (c->edge != NULL) /* + the slot tables of a fused segment loop */
    i += n + 1 + cn__cell_idx(c->edge, edges, 0) +
         3 * (int64_t)(2 * c->edge->n_vars + c->n_vars + 2);
  return i;
}
