/* cell_edges.c - segment ops (cell.h): a graph with per-edge values split
 * into the edge cell and the vertex cell, each compiled by
 * cn__cell_compile_one (cell_compile.c), then the edge cell's last fused
 * kernel moved into the vertex kernel that reads the sums (a segment loop).
 * cn__cell_compile_weights, the compiler's entry, is here: it decides
 * whether a graph is split. */
#include <stdlib.h>
#include <string.h>

#include "cell/cell.h"
#include "cell/cell_impl.h"

/* ---- segment ops: the edge cell and the vertex cell (cell.h) ------------ */
/* Marks the edge values of g (edge[v]); params are neither (param[v]).
 * Returns a message for a graph the split cannot take, or NULL. */
static const char *edge_values(const cn_ir *g, bool *edge, bool *any,
                               int *from1) {
  *any = false;
  *from1 = -1;
  for (int v = 0; v < g->n; v++) {
    const cn_ir_node *nd = &g->node[v];
    edge[v] = false;
    if (nd->kind == CN_IR_SRC) {
      edge[v] = nd->src == CN_SRC_EDGE;
      if (edge[v] && *from1 >= 0 && *from1 != nd->from1)
        return "per-edge sources over different sets of edges (one edge "
               "set a type)";
      if (edge[v]) *from1 = nd->from1;
      if (nd->src == CN_SRC_SEG) return "a CN_SRC_SEG source in a family IR";
    } else if (nd->kind == CN_IR_SEG_SUM) {
      if (nd->a < 0 || !edge[nd->a])
        return "a segment sum of a value that is not per edge";
    } else if (nd->kind != CN_IR_PARAM) {
      int ops[2] = {nd->a, nd->b}, seen = -1;
      for (int k = 0; k < 2; k++) {
        if (ops[k] < 0 || g->node[ops[k]].kind == CN_IR_PARAM) continue;
        if (seen >= 0 && seen != (int)edge[ops[k]])
          return "an op mixing a per-edge value with a per-vertex one "
                 "(only a segment sum takes an edge value to the vertex)";
        seen = edge[ops[k]];
      }
      edge[v] = seen == 1;
    }
    if (edge[v] && nd->out_col >= 0)
      return "a per-edge value as the vertex's state";
    *any |= edge[v];
  }
  return NULL;
}

/* Splits g into ge (the edge values and the params they read; every
 * segment sum's operand an output column of the edge row) and gv (the
 * rest; a segment sum becomes a CN_SRC_SEG source reading those columns). */
static void split_edges(const cn_ir *g, const bool *edge, cn_ir *ge,
                        cn_ir *gv) {
  int me[CN_IR_MAX], mv[CN_IR_MAX], seg_col[CN_IR_MAX];
  bool in_e[CN_IR_MAX] = {false}, in_v[CN_IR_MAX] = {false};
  for (int v = 0; v < g->n; v++) {
    const cn_ir_node *nd = &g->node[v];
    seg_col[v] = -1;
    if (nd->kind == CN_IR_PARAM) continue;
    bool *side = edge[v] ? in_e : in_v;
    side[v] = true;
    if (nd->kind == CN_IR_SEG_SUM) continue;
    if (nd->a >= 0 && g->node[nd->a].kind == CN_IR_PARAM) side[nd->a] = true;
    if (nd->b >= 0 && g->node[nd->b].kind == CN_IR_PARAM) side[nd->b] = true;
  }
  ge->n = gv->n = 0;
  ge->state_floats = 0;
  gv->state_floats = g->state_floats;
  for (int v = 0; v < g->n; v++) {
    const cn_ir_node *nd = &g->node[v];
    me[v] = mv[v] = -1;
    if (in_e[v]) {
      cn_ir_node x = *nd;
      x.a = nd->a >= 0 ? me[nd->a] : -1;
      x.b = nd->b >= 0 ? me[nd->b] : -1;
      me[v] = ge->n;
      ge->node[ge->n++] = x;
    }
    if (!in_v[v]) continue;
    if (gv->n + 2 > CN_IR_MAX) { /* with a copy below */
      gv->overflow = true;
      break;
    }
    cn_ir_node x = *nd;
    if (nd->kind == CN_IR_SEG_SUM) {
      int a = nd->a;
      if (seg_col[a] < 0) { /* the operand's columns in the edge row */
        seg_col[a] = ge->state_floats;
        ge->node[me[a]].out_col = seg_col[a];
        ge->state_floats += g->node[a].width;
      }
      x = (cn_ir_node){.kind = CN_IR_SRC, .src = CN_SRC_SEG,
                       .width = nd->width, .a = -1, .b = -1, .t = -1,
                       .c0 = seg_col[a], .out_col = -1, .name = nd->name};
      if (nd->out_col >= 0) { /* a source is not written: copy it (×1) */
        gv->node[gv->n++] = x;
        x = (cn_ir_node){.kind = CN_IR_SCALE, .width = nd->width,
                         .a = gv->n - 1, .b = -1, .t = -1, .k = 1.0f,
                         .out_col = nd->out_col};
      }
    } else {
      x.a = nd->a >= 0 ? mv[nd->a] : -1;
      x.b = nd->b >= 0 ? mv[nd->b] : -1;
    }
    mv[v] = gv->n;
    gv->node[gv->n++] = x;
  }
}

/* Whether ew kernel k of c reads var v. */
static bool ew_reads(const cn_cell *c, int k, int v) {
  for (int i = 0; i < c->ew[k].n_insn; i++) {
    const cn_ew_insn *in = &c->ew[k].insn[i];
    if (in->a.slot == v || in->b.slot == v) return true;
  }
  return false;
}

/* Fuses the segment ops into one kernel (cn_ew_prog's segment loop): the
 * edge cell's last fused kernel, with each segment sum accumulated per
 * edge, moves into the first kernel of the vertex cell that reads a sum;
 * the edge cell stops before it and the sums are not gathered. Cavs'
 * fusion across the reduction: the per-edge values never make a round
 * trip through a gather_sum launch. Left as it is (two cells, a
 * gather_sum each) when the edge cell does not end in a fused kernel
 * (naive: it ends storing its outputs) or a product reads a sum. */
static int fuse_edges(cn_cell *c) {
  cn_cell *e = c->edge;
  if (e->n_steps == 0 || e->steps[e->n_steps - 1].kind != CN_STEP_EW)
    return 0;
  const cn_cell_ew *le = &e->ew[e->steps[e->n_steps - 1].i];
  for (int j = 0; j < e->n_gemm; j++) /* every result made by that kernel */
    for (int q = 0; q < e->gemm[j].n_out; q++)
      if (e->vars[e->gemm[j].out[q]].out_col >= 0) return 0;
  for (int j = 0; j < e->n_bmm; j++)
    if (e->vars[e->bmm[j].out].out_col >= 0) return 0;
  int sv[16], ev[16], ns = 0;
  for (int s = 0; s < c->n_srcs; s++) {
    const cn_cell_src *src = &c->srcs[s];
    if (src->kind != CN_SRC_SEG) continue;
    if (src->var < 0) return 0;
    for (int j = 0; j < c->n_gemm; j++)
      for (int k = 0; k < c->gemm[j].n_in; k++)
        if (c->gemm[j].in[k] == src->var) return 0;
    for (int j = 0; j < c->n_bmm; j++)
      if (c->bmm[j].l == src->var || c->bmm[j].r == src->var) return 0;
    ev[ns] = -1; /* the edge result it sums */
    for (int v = 0; v < e->n_vars; v++)
      if (e->vars[v].out_col == src->col && e->vars[v].width == src->width)
        ev[ns] = v;
    if (ev[ns] < 0) return 0;
    sv[ns++] = s;
  }
  int k = -1; /* the vertex kernel the sums go to: the first reading one */
  for (int s = 0; s < c->n_steps && k < 0; s++) {
    if (c->steps[s].kind != CN_STEP_EW) continue;
    for (int q = 0; q < ns && k < 0; q++)
      if (ew_reads(c, c->steps[s].i, c->srcs[sv[q]].var)) k = c->steps[s].i;
  }
  if (k < 0 || ns == 0) return 0;
  cn_cell_ew *ke = &c->ew[k];
  int n = ns + le->n_insn + ns + ke->n_insn;
  cn_ew_insn *in = calloc((size_t)n, sizeof(*in));
  if (in == NULL) return CN_E_NOMEM;
  int at = 0, base = c->n_vars + 1, tmp0 = (int)c->tmp_floats;
  for (int q = 0; q < ns; q++) /* sum = 0 */
    in[at++] = (cn_ew_insn){CN_EW_MOV, c->srcs[sv[q]].width,
                            {(int16_t)c->srcs[sv[q]].var, 0, 0.0f},
                            {-1, 0, 0.0f}, {-1, 0, 0.0f}};
  for (int i = 0; i < le->n_insn; i++) { /* per edge: its values ... */
    cn_ew_insn x = le->insn[i];
    cn_ew_arg *args[3] = {&x.d, &x.a, &x.b};
    for (int q = 0; q < 3; q++) {
      if (args[q]->slot < 0) continue;
      if (args[q]->slot == e->n_vars) /* its scratch, after the vertex's */
        *args[q] = (cn_ew_arg){(int16_t)c->n_vars, args[q]->col + tmp0, 0};
      else
        args[q]->slot = (int16_t)(base + args[q]->slot);
    }
    in[at++] = x;
  }
  for (int q = 0; q < ns; q++) /* ... and the sums: sum = sum + value */
    in[at++] = (cn_ew_insn){CN_EW_ADD, c->srcs[sv[q]].width,
                            {(int16_t)c->srcs[sv[q]].var, 0, 0.0f},
                            {(int16_t)c->srcs[sv[q]].var, 0, 0.0f},
                            {(int16_t)(base + ev[q]), 0, 0.0f}};
  memcpy(in + at, ke->insn, (size_t)ke->n_insn * sizeof(*in));
  free(ke->insn);
  ke->insn = in;
  ke->n_insn = n;
  ke->n_ops += le->n_ops;
  ke->edge_begin = ns;
  ke->edge_end = ns + le->n_insn + ns;
  c->tmp_floats += e->tmp_floats;
  for (int q = 0; q < ns; q++) c->srcs[sv[q]].fused = true;
  c->kernels -= ns; /* no gather_sum */
  e->kernels -= 1;  /* nor its last kernel */
  int last = e->steps[e->n_steps - 1].i;
  free(e->ew[last].insn);
  e->ew[last] = (cn_cell_ew){0};
  if (last == e->n_ew - 1) e->n_ew--;
  e->n_steps--;
  return 0;
}

int cn__cell_compile_weights(const cn_tensor *const *w, const char *family,
                             int type, const char *type_name, const cn_ir *g,
                             int layout, cn_cell **out, cn_err *err) {
  bool edge[CN_IR_MAX], any;
  int from1;
  *out = NULL;
  const char *bad = g->overflow ? NULL : edge_values(g, edge, &any, &from1);
  if (bad != NULL)
    return cn_err_set(err, CN_E_INTERNAL, "%s: the %s cell has %s", family,
                      type_name, bad);
  if (g->overflow || !any)
    return cn__cell_compile_one(w, family, type, type_name, g, layout, out, err);
  double t0 = cn__now_ms();
  cn_ir *ge = calloc(1, sizeof(*ge)), *gv = calloc(1, sizeof(*gv));
  int rc = CN_E_NOMEM;
  if (ge == NULL || gv == NULL) {
    rc = cn_err_set(err, rc, "no memory to compile the %s cell", type_name);
    goto out;
  }
  split_edges(g, edge, ge, gv);
  cn_cell *e = NULL;
  rc = cn__cell_compile_one(w, family, type, type_name, ge, layout, &e, err);
  if (rc == 0) rc = cn__cell_compile_one(w, family, type, type_name, gv, layout, out, err);
  if (rc != 0) {
    cn__cell_free(e);
    goto out;
  }
  cn_cell *c = *out;
  c->edge = e;
  c->edge_floats = ge->state_floats;
  c->edge_from1 = from1;
  if ((rc = fuse_edges(c)) != 0) {
    cn_err_set(err, rc, "no memory to compile the %s cell", type_name);
    cn__cell_free(c);
    *out = NULL;
    goto out;
  }
  /* one report for the pair: the edge cell's launches run per batch too */
  c->kernels += e->kernels;
  c->mem_kernels += e->mem_kernels;
  c->batches_dropped += e->batches_dropped;
  c->ew_batched += e->ew_batched;
  c->compile_ms = cn__now_ms() - t0;
out:
  free(ge);
  free(gv);
  return rc;
}
