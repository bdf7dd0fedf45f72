/* cell_exec.c - runs a compiled vertex function (cell.h) on one batch.
 *
 * Per batch of n vertices the cell's variables are views (base, ld):
 *   pq:    ROW variables are columns of one cell row per vertex
 *          (scratch + col, ld = row_floats), so a product's operands that
 *          the layout made adjacent are one matrix;
 *   naive: each ROW variable is its own [n, width] buffer, so a product
 *          over several of them stages a copy first, and one writing
 *          several scatters after (the copies counted in cell_bytes);
 *   STATE: the batch's own state rows (consecutive, ld = state floats);
 *   INPLACE: a child's state or an embedding row read where it lives.
 * Sources the products need are gathered into their ROW variables (the
 * bytes between vertices: gather_bytes), except those only products read
 * when the backend has gemm_rows: a product over a concatenation is then
 * computed as a sum of partial products, each part read where it lies
 * (Serenity §3.3's identity rewriting), with the same bits.
 */
#include <stdlib.h>
#include <string.h>

#include "run/run_api.h"

typedef struct view {
  float *base;
  int64_t ld;
  const int64_t *off; /* a source left where it lies: row r at base+off[r] */
} view;

static view var_view(const cn_cell *c, const cn_cell_var *x, float *scratch,
                     float *state, int n) {
  switch (x->space) {
  case CN_SP_ROW:
    if (c->layout == CN_LAYOUT_NAIVE)
      return (view){scratch + (int64_t)n * x->buf, x->width, NULL};
    return (view){scratch + x->col, c->row_floats, NULL};
  case CN_SP_STATE:
    return (view){state + x->col, c->state_floats, NULL};
  default:
    return (view){NULL, 0, NULL};
  }
}

/* Whether the views of vars v[0..k) are one [n, Σ width] matrix. */
static bool one_matrix(const view *vw, const cn_cell *c, const int32_t *v,
                       int k, int64_t total) {
  for (int i = 0; i < k; i++) {
    if (vw[v[i]].base == NULL || vw[v[i]].off != NULL ||
        vw[v[i]].ld < total)
      return false;
    if (i > 0 && (vw[v[i]].ld != vw[v[0]].ld ||
                  vw[v[i]].base != vw[v[i - 1]].base + c->vars[v[i - 1]].width))
      return false;
  }
  return true;
}

/* Where a cell's rows come from: the batch's vertices (verts[0..nv)),
 * or, for an edge cell, their input edges in vertex order; a vertex cell
 * with segment ops also reads the edge cell's results (eout, rows of
 * edge_floats, vertex i's from eseg[i] to eseg[i + 1]). */
typedef struct cell_rows {
  const int32_t *verts;
  int nv;
  const float *eout;
  const int64_t *eseg;
  int64_t edges;
  struct rows_memo *memo; /* what this batch's sources already derived */
} cell_rows;

/* The index arrays one batch has written, for the sources after them:
 * sources read the same input edges at other columns (a state's h and c,
 * the edge cell's l and cw, the vertex cell's segments over the same
 * edges), so a walk of the batch's inputs is done once per edge list and
 * each further source reads the first one's offsets from its own column.
 * Valid for one cn__cell_exec (the index room is rewritten per batch). */
#define MEMO_MAX 8
typedef struct memo_seg {
  int from1;
  int64_t *seg, edges;
} memo_seg;
typedef struct memo_off {
  int kind, from1, edge; /* kind: CN_SRC_INPUT, or CN_SRC_EDGE for every
                            source with a row per counted edge */
  int32_t col;
  int64_t *off, len;
} memo_off;
typedef struct rows_memo {
  int n_seg, n_off;
  memo_seg seg[MEMO_MAX];
  memo_off off[MEMO_MAX];
} rows_memo;

/* Vertex i's input edges (those from1 counts) are rows seg[i] ..
 * seg[i + 1]. */
static int64_t *edge_segments(cn_run *r, const int32_t *verts, int n,
                              int from1, int64_t *edges, rows_memo *mm) {
  for (int i = 0; mm != NULL && i < mm->n_seg; i++)
    if (mm->seg[i].from1 == from1) {
      *edges = mm->seg[i].edges;
      return mm->seg[i].seg;
    }
  const int32_t *in_start = r->in_start, *in_edges = r->in_edges;
  const uint8_t *vtype = r->vtype;
  int64_t *sg = cn__run_idx(r, n + 1), e = 0;
  sg[0] = 0;
  for (int i = 0; i < n; i++) {
    int32_t q = in_start[verts[i]], q1 = in_start[verts[i] + 1];
    if (from1 == 0)
      e += q1 - q;
    else
      for (; q < q1; q++) e += vtype[in_edges[q]] == from1 - 1;
    sg[i + 1] = e;
  }
  *edges = e;
  if (mm != NULL && mm->n_seg < MEMO_MAX)
    mm->seg[mm->n_seg++] = (memo_seg){from1, sg, e};
  return sg;
}

/* An earlier source's offsets over the same input edges, for column col:
 * the same array read from *shift floats further (an absent edge, -1,
 * stays absent: it is never read at an offset). NULL when none was
 * written, or col lies left of its column (a base is never moved below
 * the arena's start): the caller walks the edges itself. */
static int64_t *memo_offsets(rows_memo *mm, int kind, int from1, int edge,
                             int32_t col, int64_t *shift) {
  for (int i = 0; mm != NULL && i < mm->n_off; i++)
    if (mm->off[i].kind == kind && mm->off[i].from1 == from1 &&
        mm->off[i].edge == edge && col >= mm->off[i].col) {
      *shift = (int64_t)col - mm->off[i].col;
      return mm->off[i].off;
    }
  return NULL;
}

static void memo_keep(rows_memo *mm, int kind, int from1, int edge,
                      int32_t col, int64_t *off, int64_t len) {
  if (mm != NULL && mm->n_off < MEMO_MAX)
    mm->off[mm->n_off++] =
        (memo_off){kind, from1, edge, col, off, len};
}

/* Per-row offsets of a source (state or embedding floats), staged in the
 * run's index room, to be read from *shift floats past the source's base
 * (an earlier source's array shared, memo_offsets); pooled sources also
 * fill *seg. */
static int64_t *source_offsets(cn_run *r, const cn_cell *c,
                               const cn_cell_src *s, const cell_rows *rw,
                               int64_t **seg, int64_t *edges,
                               int64_t *shift) {
  const int32_t *verts = rw->verts;
  const int32_t *in_start = r->in_start, *in_edges = r->in_edges;
  const int64_t *state_off = r->state_off;
  const int64_t col = s->col;
  int n = rw->nv;
  *shift = 0;
  if (s->kind == CN_SRC_EMBED) {
    /* a row of the table (any rank: its first dimension is the rows); a
     * token past the table's rows reads row 0, as MV-RNN's leaf.M asks
     * (K matrices for the K most frequent words) */
    const cn_tensor *T = r->m->w[s->t];
    const int32_t *vaux = r->vaux;
    int64_t rows = T->shape[0], len = rows > 0 ? T->numel / rows : 0;
    int64_t *off = cn__run_idx(r, n);
    for (int i = 0; i < n; i++) {
      int64_t w = vaux[verts[i]];
      off[i] = (w >= 0 && w < rows ? w : 0) * len + col;
    }
    return off;
  }
  if (s->kind == CN_SRC_INPUT) { /* the edge-th input (that counts) */
    int64_t *off = memo_offsets(rw->memo, CN_SRC_INPUT, s->from1, s->edge,
                                s->col, shift);
    if (off != NULL) return off;
    off = cn__run_idx(r, n);
    const uint8_t *vtype = r->vtype;
    const int from1 = s->from1, edge = s->edge;
    for (int i = 0; i < n; i++) {
      int32_t q = in_start[verts[i]], q1 = in_start[verts[i] + 1];
      int64_t o = -1;
      if (from1 == 0) {
        if (q1 - q > edge) o = state_off[in_edges[q + edge]] + col;
      } else {
        for (int seen = 0; q < q1; q++)
          if (vtype[in_edges[q]] == from1 - 1 && seen++ == edge) {
            o = state_off[in_edges[q]] + col;
            break;
          }
      }
      off[i] = o;
    }
    memo_keep(rw->memo, CN_SRC_INPUT, s->from1, s->edge, s->col, off, n);
    return off;
  }
  if (s->kind == CN_SRC_SEG) { /* the edge cell's results, per segment */
    int64_t *off = cn__run_idx(r, rw->edges);
    for (int64_t e = 0; e < rw->edges; e++)
      off[e] = e * c->edge_floats + col;
    *seg = (int64_t *)rw->eseg;
    *edges = rw->edges;
    return off;
  }
  int64_t e;
  int64_t *sg = edge_segments(r, verts, n, s->from1, &e, rw->memo);
  int64_t *off =
      memo_offsets(rw->memo, CN_SRC_EDGE, s->from1, -1, s->col, shift);
  if (off == NULL) {
    const uint8_t *vtype = r->vtype;
    const int from1 = s->from1;
    off = cn__run_idx(r, e);
    for (int i = 0; i < n; i++) {
      int64_t at = sg[i];
      for (int32_t q = in_start[verts[i]], q1 = in_start[verts[i] + 1];
           q < q1; q++)
        if (from1 == 0 || vtype[in_edges[q]] == from1 - 1)
          off[at++] = state_off[in_edges[q]] + col;
    }
    memo_keep(rw->memo, CN_SRC_EDGE, s->from1, -1, s->col, off, e);
  }
  if (s->kind == CN_SRC_EDGE) return off; /* a row per edge */
  *seg = sg;
  *edges = e;
  return off;
}

/* The product's inputs as gemm_rows parts: a source left where it lies is
 * a part of its own; views that sit side by side (rows wide enough for
 * both) are one part. */
static int gemm_parts(const cn_cell *c, const cn_cell_gemm *gm,
                      const view *vw, const float *W, cn_gemm_part *pt) {
  int np = 0, col = 0;
  for (int k = 0; k < gm->n_in; col += c->vars[gm->in[k++]].width) {
    const view *x = &vw[gm->in[k]];
    int w = c->vars[gm->in[k]].width;
    cn_gemm_part *last = np > 0 ? &pt[np - 1] : NULL;
    if (x->off == NULL && last != NULL && last->off == NULL &&
        last->ld == x->ld && last->base + last->K == x->base &&
        x->ld >= last->K + w) {
      last->K += w;
      continue;
    }
    pt[np++] = (cn_gemm_part){x->base, x->off, x->ld, w, W + col, gm->K};
  }
  return np;
}

static void run_gemm(cn_run *r, const cn_cell *c, const cn_cell_gemm *gm,
                     const view *vw, float *stage, int n) {
  cn_backend_ctx *bk = r->bk;
  float *C;
  int64_t ldc;
  float *out_stage = stage + (int64_t)n * gm->K;
  bool direct = gm->n_out == 1 || one_matrix(vw, c, gm->out, gm->n_out, gm->N);
  if (direct) {
    C = vw[gm->out[0]].base;
    ldc = vw[gm->out[0]].ld;
  } else {
    C = out_stage;
    ldc = gm->N;
  }
  const float *W = bk->vt->weights(bk, gm->W, (size_t)gm->N * gm->K);
  const float *b =
      gm->bias != NULL ? bk->vt->weights(bk, gm->bias, (size_t)gm->N) : NULL;
  cn_gemm_part pt[CN_GEMM_PARTS];
  int np = gemm_parts(c, gm, vw, W, pt);
  if (np == 1 && pt[0].off == NULL) { /* one matrix already */
    CN_BK(bk, gemm, n, gm->N, gm->K, pt[0].base, (int)pt[0].ld, W, gm->K, b,
          0.0f, C, (int)ldc);
  } else {
    /* a sum of partial products, each part read where it lies; or, on a
     * backend without gemm_rows, the operand copied together first (a
     * copy inside the vertex function: no source is left in place then) */
    if (!cn__run_rows_in_place(r))
      r->cell_bytes += (size_t)n * (size_t)gm->K * sizeof(float);
    cn__run_gemm_rows(r, n, gm->N, np, pt, b, 0.0f, C, (int)ldc, stage,
                      NULL);
  }
  if (direct) return;
  int64_t col = 0; /* scatter the results */
  for (int q = 0; q < gm->n_out; q++) {
    int w = c->vars[gm->out[q]].width;
    CN_BK(bk, copy_rows, vw[gm->out[q]].base, (int)vw[gm->out[q]].ld,
          out_stage + col, gm->N, n, w);
    col += w;
  }
  r->cell_bytes += (size_t)n * (size_t)gm->N * sizeof(float);
}

/* A per-vertex product's operand for row q: a var's row (an absent edge
 * of a source read in place: its zeros, or NULL, the identity), or the
 * shared weight block. */
static const float *bmm_operand(const cn_run *r, const cn_cell_bmm *bm, int v,
                                const cn_ew_slot *slots,
                                const float *const *fill, int q) {
  if (v < 0) {
    const cn_tensor *T = r->m->w[bm->t];
    return r->wb[bm->t] + (int64_t)bm->r0 * (T->numel / T->shape[0]) + bm->c0;
  }
  const cn_ew_slot *x = &slots[v];
  if (x->off == NULL) return x->base + (int64_t)q * x->ld;
  return x->off[q] >= 0 ? x->base + x->off[q] : fill[v];
}

_Static_assert(sizeof(float *) == sizeof(int64_t) &&
                   sizeof(cn_ew_slot) == 3 * sizeof(int64_t),
               "pointer arrays and slot tables are staged in the run's "
               "index room");

/* A source's gather, prepared: launched once the batch's index arrays
 * are staged. */
typedef struct gather_op {
  view d;
  const float *base;
  const int64_t *off, *seg; /* seg != NULL: a sum over each segment */
  int width, mean;
} gather_op;

#define PLAN_STEPS ((int)(sizeof(((cn_cell *)0)->steps) / \
                          sizeof(((cn_cell *)0)->steps[0])))
#define PLAN_SRCS ((int)(sizeof(((cn_cell *)0)->srcs) / \
                         sizeof(((cn_cell *)0)->srcs[0])))

/* One cell over a batch's rows, prepared (rows_prepare) before anything
 * of the batch launches (rows_launch): every index array the batch needs
 * is in the run's index room first, so a device uploads them in one copy
 * (stage_indices). */
struct cn__rows_plan {
  const cn_cell *c;
  int n;
  float *stage, *state;
  view vw[3 * CN_IR_MAX];
  cn_ew_slot slots[3 * CN_IR_MAX + 1];
  const float *fill[3 * CN_IR_MAX]; /* BMM-read sources in place */
  gather_op g[PLAN_SRCS];
  int n_g;
  /* per step: a BMM's pointer arrays (A, B, C); an EW step's slot table
   * with the edge cell's after its own (a segment loop), or NULL */
  void *arr[PLAN_STEPS][3];
  const int64_t *seg; /* the segment loop's edges per row */
  int edge_slots;     /* the edge cell's slots in that table */
};

int cn__cell_plans(cn_run *r) {
  if (r->rows_plans == NULL)
    r->rows_plans = malloc(2 * sizeof(cn__rows_plan));
  return r->rows_plans != NULL ? 0 : CN_E_NOMEM;
}

/* A BMM step's pointer arrays: one gemm_batched call, the step's
 * products over every row, or the terms of one sum (a term each, summed
 * into its output in order). */
static void bmm_arrays(cn_run *r, const cn_cell *c, const cn_cell_step *st,
                       const cn_ew_slot *slots, const float *const *fill,
                       int n, void **arr) {
  int64_t tc = (int64_t)st->n * n, cnt = st->sum ? n : tc;
  const float **A = (const float **)(void *)cn__run_idx(r, tc);
  const float **B = (const float **)(void *)cn__run_idx(r, tc);
  float **C = (float **)(void *)cn__run_idx(r, cnt);
  for (int k = 0; k < st->n; k++) {
    const cn_cell_bmm *bm = &c->bmm[st->i + k];
    for (int q = 0; q < n; q++) {
      A[(int64_t)k * n + q] = bmm_operand(r, bm, bm->l, slots, fill, q);
      B[(int64_t)k * n + q] = bmm_operand(r, bm, bm->r, slots, fill, q);
      if (k == 0 || !st->sum)
        C[(int64_t)k * n + q] =
            slots[bm->out].base + (int64_t)q * slots[bm->out].ld;
    }
  }
  arr[0] = (void *)A;
  arr[1] = (void *)B;
  arr[2] = (void *)C;
}

/* Its launch. The kernel count follows a device's launches: one batched
 * product a term. */
static void run_bmm(cn_run *r, const cn_cell *c, const cn_cell_step *st,
                    void *const *arr, int n) {
  const cn_cell_bmm *b0 = &c->bmm[st->i];
  int64_t cnt = st->sum ? n : (int64_t)st->n * n;
  const cn_tensor *T = b0->t >= 0 ? r->m->w[b0->t] : NULL;
  int wld = T != NULL ? (int)(T->numel / T->shape[0]) : 0;
  int lda = b0->l >= 0 ? b0->kk : wld, ldb = b0->r >= 0 ? b0->nn : wld;
  int terms = st->sum ? st->n : 1;
  r->bk->kernels += terms - 1;
  CN_BK(r->bk, gemm_batched, (int)cnt, terms, b0->m, b0->nn, b0->kk,
        (const float *const *)arr[0], lda, (const float *const *)arr[1],
        ldb, 0.0f, (float *const *)arr[2], b0->nn);
}

/* Prepares cell c on n rows (rw's vertices, or their edges for an edge
 * cell), its scratch and results where the caller says: binds every
 * variable, writes every index array, and counts the bytes its gathers
 * will move. fe: the edge cell's plan, for a vertex kernel that fuses
 * its last kernel (cn_cell_ew's segment loop). */
static void rows_prepare(cn_run *r, cn__rows_plan *pl, const cn_cell *c,
                         const cell_rows *rw, int n, float *scratch,
                         float *state, const cn__rows_plan *fe) {
  cn_backend_ctx *bk = r->bk;
  view *vw = pl->vw;
  cn_ew_slot *slots = pl->slots;
  pl->c = c;
  pl->n = n;
  pl->stage = scratch + (int64_t)n * c->row_floats;
  pl->state = state;
  pl->n_g = 0;
  pl->seg = rw->eseg;
  pl->edge_slots = 0;
  for (int v = 0; v < c->n_vars; v++) {
    const cn_cell_var *x = &c->vars[v];
    vw[v] = var_view(c, x, scratch, state, n);
    slots[v] = (cn_ew_slot){vw[v].base, vw[v].ld, NULL};
    pl->fill[v] = NULL;
    if (x->space == CN_SP_PARAM)
      slots[v] = (cn_ew_slot){(float *)r->wb[x->t] + x->col, 0, NULL};
  }
  /* Sources: gathered into their ROW variable, or bound in place. */
  for (int s = 0; s < c->n_srcs; s++) {
    const cn_cell_src *src = &c->srcs[s];
    if (src->fused) continue; /* summed inside a kernel (segment loop) */
    int64_t *seg = NULL, edges = 0, shift;
    int64_t *off = source_offsets(r, c, src, rw, &seg, &edges, &shift);
    const float *base = (src->kind == CN_SRC_EMBED ? r->wb[src->t]
                         : src->kind == CN_SRC_SEG ? rw->eout
                                                   : r->arena) +
                        shift;
    if (src->var < 0) {
      const float *fb = src->fill_buf != NULL
                            ? bk->vt->weights(bk, src->fill_buf,
                                              (size_t)src->width)
                            : NULL;
      for (int v = 0; v < c->n_vars; v++)
        if (c->vars[v].space == CN_SP_INPLACE && c->vars[v].src == s) {
          slots[v] = (cn_ew_slot){(float *)base, 0, off};
          pl->fill[v] = fb;
        }
      continue;
    }
    if (src->rows && seg == NULL && cn__run_rows_in_place(r)) {
      /* only products read it: they read its rows where they lie */
      vw[src->var] = (view){(float *)base, 0, off};
      continue;
    }
    view d = vw[src->var];
    int stride;
    if (src->alias && c->layout == CN_LAYOUT_PQ &&
        cn__rows_even(off, n, src->width, &stride)) {
      /* The rows are already a matrix (a previous batch's consecutive
       * outputs): read them where they are, no gather (cn__rows_even). */
      vw[src->var] = (view){(float *)base + off[0], stride, NULL};
      slots[src->var] = (cn_ew_slot){vw[src->var].base, vw[src->var].ld, NULL};
      continue;
    }
    /* Embedding rows are the vertex's input, not bytes between vertices;
     * an edge cell's results are inside the vertex function. */
    size_t *bytes = src->kind == CN_SRC_EMBED ? &r->input_bytes
                    : src->kind == CN_SRC_SEG ? &r->cell_bytes
                                              : &r->gather_bytes;
    *bytes += (size_t)(seg != NULL ? edges : n) * (size_t)src->width *
              sizeof(float);
    pl->g[pl->n_g++] = (gather_op){d, base, off, seg, src->width,
                                   src->kind == CN_SRC_INPUT_MEAN};
  }
  slots[c->n_vars] = (cn_ew_slot){NULL, c->tmp_floats, NULL};
  for (int s = 0; s < c->n_steps; s++) {
    const cn_cell_step *st = &c->steps[s];
    pl->arr[s][0] = NULL;
    if (st->kind == CN_STEP_BMM) {
      bmm_arrays(r, c, st, slots, pl->fill, n, pl->arr[s]);
    } else if (st->kind == CN_STEP_EW && fe != NULL &&
               c->ew[st->i].edge_end > c->ew[st->i].edge_begin) {
      /* the segment loop: the edge cell's slots after this cell's */
      int ne = fe->c->n_vars, nt = c->n_vars + 1 + ne;
      cn_ew_slot *all = (cn_ew_slot *)(void *)cn__run_idx(r, 3 * (int64_t)nt);
      memcpy(all, slots, (size_t)(c->n_vars + 1) * sizeof(*all));
      memcpy(all + c->n_vars + 1, fe->slots, (size_t)ne * sizeof(*all));
      pl->arr[s][0] = all;
      pl->edge_slots = ne;
    }
  }
}

/* Launches what rows_prepare prepared: the gathers, then the steps. */
static void rows_launch(cn_run *r, const cn__rows_plan *pl) {
  cn_backend_ctx *bk = r->bk;
  const cn_cell *c = pl->c;
  int n = pl->n;
  for (int k = 0; k < pl->n_g; k++) {
    const gather_op *g = &pl->g[k];
    if (g->seg != NULL)
      CN_BK(bk, gather_sum, g->d.base, (int)g->d.ld, g->base, g->off,
            g->seg, n, g->width, g->mean);
    else
      CN_BK(bk, gather, g->d.base, (int)g->d.ld, g->base, g->off, n,
            g->width);
  }
  for (int s = 0; s < c->n_steps; s++) {
    const cn_cell_step *st = &c->steps[s];
    if (st->kind == CN_STEP_GEMM) {
      run_gemm(r, c, &c->gemm[st->i], pl->vw, pl->stage, n);
    } else if (st->kind == CN_STEP_BMM) {
      run_bmm(r, c, st, pl->arr[s], n);
    } else if (st->kind == CN_STEP_EW) {
      const cn_cell_ew *e = &c->ew[st->i];
      cn_ew_prog p = {e->n_insn, e->insn, c->n_vars + 1, c->n_vars,
                      (int)c->tmp_floats, 0, 0, 0, NULL};
      const cn_ew_slot *sl = pl->slots;
      if (pl->arr[s][0] != NULL) { /* the segment loop */
        p.n_slots = c->n_vars + 1 + pl->edge_slots;
        p.edge_begin = e->edge_begin;
        p.edge_end = e->edge_end;
        p.edge_slot0 = c->n_vars + 1;
        p.seg = pl->seg;
        sl = pl->arr[s][0];
      }
      CN_BK(bk, ew_program, &p, sl, n);
    } else if (st->kind == CN_STEP_STORE) {
      /* naive: results land in their own buffers, then in the state rows
       * (a result scatter, counted with the bytes between vertices) */
      for (int v = 0; v < c->n_vars; v++) {
        const cn_cell_var *x = &c->vars[v];
        int col = x->out_col;
        if (x->space != CN_SP_ROW || col < 0) continue;
        CN_BK(bk, copy_rows, pl->state + col, c->state_floats, pl->vw[v].base,
              (int)pl->vw[v].ld, n, x->width);
        r->gather_bytes += (size_t)n * (size_t)x->width * sizeof(float);
      }
    }
  }
}

void cn__cell_exec(cn_run *r, const cn_cell *c, const int32_t *verts, int n,
                   float *out) {
  float *scratch = cn__run_scratch(r);
  float *state = out != NULL ? out : r->arena + r->state_off[verts[0]];
  rows_memo memo;
  memo.n_seg = memo.n_off = 0;
  cell_rows rw = {verts, n, NULL, NULL, 0, &memo};
  cn__rows_plan *pv = &r->rows_plans[0], *pe = NULL;
  int64_t idx0 = r->idx_used;
  if (c->edge != NULL) { /* segment ops: the edge cell first (cell.h) */
    const cn_cell *e = c->edge;
    pe = &r->rows_plans[1];
    rw.eseg = edge_segments(r, verts, n, c->edge_from1, &rw.edges, &memo);
    float *eout = scratch + cn__cell_scratch_floats(c, n, 0);
    float *escratch = eout + rw.edges * c->edge_floats;
    cell_rows er = {verts, n, NULL, NULL, 0, &memo};
    if (rw.edges > 0) {
      rows_prepare(r, pe, e, &er, (int)rw.edges, escratch, eout, NULL);
    } else { /* no edge at all: the loop's edge slots are never read */
      pe->c = e;
      pe->n = 0;
      memset(pe->slots, 0, (size_t)(e->n_vars + 1) * sizeof(pe->slots[0]));
    }
    rw.eout = eout;
  }
  rows_prepare(r, pv, c, &rw, n, scratch, state, pe);
  /* every index array of the batch is written: one upload on a device */
  cn_backend_ctx *bk = r->bk;
  bool staged = bk->vt->stage_indices != NULL && r->idx_used > idx0;
  if (staged)
    bk->vt->stage_indices(bk, r->idx_host + idx0,
                          (size_t)(r->idx_used - idx0));
  if (pe != NULL && pe->n > 0) rows_launch(r, pe);
  rows_launch(r, pv);
  if (staged) /* the next batch rewrites those words */
    bk->vt->stage_indices(bk, NULL, 0);
}

/* ---- describing and measuring cells (canopy model info / bench) -------- */
static json_t *cell_json(const cn_cell *c) {
  json_t *o = json_object();
  int insn = 0, ops = 0, ng = c->n_gemm, nk = c->n_ew;
  for (const cn_cell *x = c; x != NULL; x = x->edge)
    for (int e = 0; e < x->n_ew; e++)
      insn += x->ew[e].n_insn, ops += x->ew[e].n_ops;
  if (c->edge != NULL) ng += c->edge->n_gemm, nk += c->edge->n_ew;
  int nb = 0; /* gemm_batched calls: per-vertex products (MV-RNN) */
  for (int s = 0; s < c->n_steps; s++) nb += c->steps[s].kind == CN_STEP_BMM;
  json_object_set_new(o, "products", json_integer(ng));
  if (nb > 0) json_object_set_new(o, "per_vertex_products", json_integer(nb));
  json_object_set_new(o, "fused_kernels", json_integer(nk));
  json_object_set_new(o, "elementwise_ops", json_integer(ops));
  json_object_set_new(o, "instructions", json_integer(insn));
  json_object_set_new(o, "kernels", json_integer(c->kernels));
  json_object_set_new(o, "copy_kernels", json_integer(c->mem_kernels));
  json_object_set_new(o, "floats_copied_per_vertex",
                      json_integer(c->cell_floats_copied));
  json_object_set_new(o, "row_floats", json_integer(c->row_floats));
  json_object_set_new(o, "tmp_floats", json_integer(c->tmp_floats));
  if (c->edge != NULL) { /* segment ops: what runs per input edge */
    json_t *e = json_object();
    json_object_set_new(e, "products", json_integer(c->edge->n_gemm));
    json_object_set_new(e, "fused_kernels", json_integer(c->edge->n_ew));
    json_object_set_new(e, "row_floats", json_integer(c->edge->row_floats));
    json_object_set_new(e, "result_floats", json_integer(c->edge_floats));
    json_object_set_new(o, "per_edge", e);
  }
  json_object_set_new(o, "pq_batches_dropped",
                      json_integer(c->batches_dropped));
  json_object_set_new(o, "compile_ms", json_real(c->compile_ms));
  return o;
}

json_t *cn_model_describe_cells(const cn_model *m) {
  json_t *o = json_object();
  for (int t = 0; t < m->fam->n_types; t++) {
    json_t *ty = json_object();
    for (int l = 0; l < CN_LAYOUT__COUNT; l++)
      if (m->cell[l][t] != NULL)
        json_object_set_new(ty, cn_layout_name((cn_layout)l),
                            cell_json(m->cell[l][t]));
    json_object_set_new(o, m->fam->type_names[t], ty);
  }
  return o;
}
