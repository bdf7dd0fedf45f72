/* cell_products.c - which products a compiled cell runs (cell_compile.c
 * asks): the sums of products found and K-merged or not (ED-Batch §3's
 * search over op batchings), the terms over the same inputs N-merged into
 * one product; and the per-vertex products (CN_IR_BMM) grouped into
 * gemm_batched calls and scheduled as their operands become ready.
 */
#include <stdlib.h>
#include <string.h>

#include "cell/cell_compiler.h"

/* ---- products over the batch (gemm) -------------------------------------- */
static bool is_mm(const cn_ir *g, int v) {
  return g->node[v].kind == CN_IR_MATMUL;
}

/* Collects the products and params under a pure sum; false when the
 * subtree holds anything else or a shared interior value. */
static bool collect_sum(compiler *cp, int v, sumtree *t, bool top) {
  const cn_ir_node *nd = &cp->g->node[v];
  if (!top && cp->uses[v] != 1 && nd->kind != CN_IR_PARAM) return false;
  if (!top && nd->out_col >= 0) return false;
  if (nd->kind == CN_IR_MATMUL) {
    if (t->n_mm >= 8) return false;
    t->mm[t->n_mm++] = v;
    return true;
  }
  if (nd->kind == CN_IR_PARAM) {
    if (t->n_par >= 4) return false;
    t->par[t->n_par++] = v;
    return true;
  }
  if (nd->kind != CN_IR_ADD) return false;
  return collect_sum(cp, nd->a, t, false) && collect_sum(cp, nd->b, t, false);
}

/* Finds the sum trees: largest pure sums, each folded into products. */
void cn__cell_find_trees(compiler *cp) {
  const cn_ir *g = cp->g;
  for (int v = 0; v < g->n; v++) cp->tree_of[v] = -1;
  for (int v = g->n - 1; v >= 0; v--) {
    if (g->node[v].kind != CN_IR_ADD || cp->tree_of[v] >= 0) continue;
    if (cp->n_trees >= MAX_TREES) break;
    sumtree t = {.root = v};
    if (!collect_sum(cp, v, &t, true) || t.n_mm == 0) continue;
    /* Mark the interior (ADDs and products) as belonging to the tree. */
    int stack[CN_IR_MAX], sp = 0;
    stack[sp++] = v;
    while (sp > 0) {
      int u = stack[--sp];
      const cn_ir_node *nd = &g->node[u];
      if (nd->kind == CN_IR_PARAM) continue;
      cp->tree_of[u] = cp->n_trees;
      if (nd->kind == CN_IR_ADD) {
        stack[sp++] = nd->a;
        stack[sp++] = nd->b;
      }
    }
    cp->trees[cp->n_trees++] = t;
  }
}

static int input_key_cmp(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

/* Builds the terms and products for the merge choice in cp->merged;
 * returns the number of products and sets *ew to the elementwise adds
 * the unmerged sums leave. -1 when a product would be too wide. */
static int plan_products(compiler *cp, int *ew) {
  const cn_ir *g = cp->g;
  cp->n_terms = 0;
  cp->n_gemm = 0;
  *ew = 0;
  for (int i = 0; i < cp->n_trees; i++) {
    const sumtree *t = &cp->trees[i];
    if (cp->merged[i] || t->n_mm == 1) {
      term *tm = &cp->terms[cp->n_terms++];
      *tm = (term){.value = t->root, .n_mm = t->n_mm, .n_par = t->n_par};
      memcpy(tm->mm, t->mm, sizeof(t->mm));
      memcpy(tm->par, t->par, sizeof(t->par));
    } else {
      for (int k = 0; k < t->n_mm; k++) {
        if (cp->n_terms >= 32) return -1;
        term *tm = &cp->terms[cp->n_terms++];
        *tm = (term){.value = t->mm[k], .n_mm = 1, .mm = {t->mm[k]}};
        if (k == 0) { /* the sum's params ride on its first product */
          tm->n_par = t->n_par;
          memcpy(tm->par, t->par, sizeof(t->par));
        }
      }
      *ew += t->n_mm - 1;
    }
    if (cp->n_terms > 28) return -1;
  }
  for (int v = 0; v < g->n; v++)
    if (is_mm(g, v) && cp->tree_of[v] < 0) {
      if (cp->n_terms >= 32) return -1;
      cp->terms[cp->n_terms++] = (term){.value = v, .n_mm = 1, .mm = {v}};
    }
  /* N-merge: terms over the same set of inputs share one product. */
  int keys[32][8], nkeys[32];
  for (int i = 0; i < cp->n_terms; i++) {
    term *tm = &cp->terms[i];
    nkeys[i] = 0;
    for (int k = 0; k < tm->n_mm; k++) {
      int x = g->node[tm->mm[k]].a;
      bool dup = false;
      for (int q = 0; q < nkeys[i]; q++) dup |= keys[i][q] == x;
      if (!dup) keys[i][nkeys[i]++] = x;
    }
    qsort(keys[i], (size_t)nkeys[i], sizeof(int), input_key_cmp);
    tm->gemm = -1;
    for (int j = 0; j < cp->n_gemm; j++)
      if (cp->gemm_nin[j] == nkeys[i] && cp->gemm_nt[j] < 16 &&
          memcmp(cp->gemm_in[j], keys[i], sizeof(int) * (size_t)nkeys[i]) ==
              0) {
        tm->gemm = j;
        break;
      }
    if (tm->gemm < 0) {
      if (cp->n_gemm >= 8) return -1;
      tm->gemm = cp->n_gemm++;
      cp->gemm_nin[tm->gemm] = nkeys[i];
      memcpy(cp->gemm_in[tm->gemm], keys[i], sizeof(int) * (size_t)nkeys[i]);
      cp->gemm_nt[tm->gemm] = 0;
    }
    cp->gemm_terms[tm->gemm][cp->gemm_nt[tm->gemm]++] = i;
  }
  return cp->n_gemm;
}

/* ED-Batch §3's search over op batchings, for the products: every choice
 * of which sums to K-merge (one product over the concatenated inputs)
 * against leaving them as separate products summed elementwise; fewest
 * products first, then fewest elementwise adds. */
int cn__cell_choose_batching(compiler *cp) {
  int multi[MAX_TREES], nm = 0;
  for (int i = 0; i < cp->n_trees; i++)
    if (cp->trees[i].n_mm > 1) multi[nm++] = i;
  long best = -1;
  unsigned best_mask = 0;
  for (unsigned mask = 0; mask < (1u << nm); mask++) {
    for (int i = 0; i < nm; i++) cp->merged[multi[i]] = (mask >> i) & 1u;
    int ew, ng = plan_products(cp, &ew);
    if (ng < 0) continue;
    long cost = (long)ng * 1000 + ew;
    if (best < 0 || cost < best) best = cost, best_mask = mask;
  }
  if (best < 0) return CN_E_INTERNAL;
  for (int i = 0; i < nm; i++) cp->merged[multi[i]] = (best_mask >> i) & 1u;
  int ew;
  return plan_products(cp, &ew) < 0 ? CN_E_INTERNAL : 0;
}

/* ---- per-vertex products (CN_IR_BMM) ------------------------------------- */
/* Whether v is a pure sum of single-use BMMs of one shape (root: the
 * top ADD, which may have any number of uses). */
static bool bmm_sum(const compiler *cp, int v, bool top, int m, int w) {
  const cn_ir_node *nd = &cp->g->node[v];
  if (!top && (cp->uses[v] != 1 || nd->out_col >= 0)) return false;
  if (nd->kind == CN_IR_BMM) return nd->m == m && nd->width == w;
  if (nd->kind != CN_IR_ADD) return false;
  return bmm_sum(cp, nd->a, false, m, w) && bmm_sum(cp, nd->b, false, m, w);
}

static void mark_bmm_sum(compiler *cp, int v, int root) {
  const cn_ir_node *nd = &cp->g->node[v];
  cp->bmm_root[v] = root;
  if (nd->kind == CN_IR_ADD) {
    mark_bmm_sum(cp, nd->a, root);
    mark_bmm_sum(cp, nd->b, root);
  }
}

static bool bmm_same_call(const compiler *cp, int x, int y);
static int bmm_members(const compiler *cp, int root, int *out);

/* Every BMM stands for itself, or for the sum it is accumulated into (one
 * gemm_batched call with a term each: same shapes and leading dims). */
void cn__cell_find_bmm_sums(compiler *cp) {
  const cn_ir *g = cp->g;
  for (int v = 0; v < g->n; v++) cp->bmm_root[v] = -1;
  for (int v = g->n - 1; v >= 0; v--) {
    if (g->node[v].kind != CN_IR_ADD || cp->bmm_root[v] >= 0) continue;
    int u = g->node[v].a;
    while (g->node[u].kind == CN_IR_ADD) u = g->node[u].a;
    if (!is_bmm(g, u) ||
        !bmm_sum(cp, v, true, g->node[u].m, g->node[u].width))
      continue;
    mark_bmm_sum(cp, v, v);
    int mem[CN_IR_MAX], nm = bmm_members(cp, v, mem);
    bool same = nm <= 16;
    for (int k = 1; k < nm; k++) same &= bmm_same_call(cp, mem[0], mem[k]);
    if (!same) /* not one call: the adds stay elementwise */
      for (int w = 0; w <= v; w++)
        if (cp->bmm_root[w] == v) cp->bmm_root[w] = -1;
  }
  for (int v = 0; v < g->n; v++)
    if (is_bmm(g, v) && cp->bmm_root[v] < 0) cp->bmm_root[v] = v;
}

/* The BMM nodes of the sum rooted at v, in node order. */
static int bmm_members(const compiler *cp, int root, int *out) {
  int n = 0;
  for (int v = 0; v <= root; v++)
    if (cp->bmm_root[v] == root && is_bmm(cp->g, v)) out[n++] = v;
  return n;
}

static bool bmm_ready(const compiler *cp, int v) {
  const cn_ir_node *nd = &cp->g->node[v];
  return (nd->a < 0 || available(cp, nd->a)) &&
         (nd->b < 0 || available(cp, nd->b));
}

/* Two products one gemm_batched call can run together: same shapes, and
 * the same leading dimension for a shared weight operand. */
static bool bmm_same_call(const compiler *cp, int x, int y) {
  const cn_ir_node *p = &cp->g->node[x], *q = &cp->g->node[y];
  if (p->m != q->m || p->kk != q->kk || p->width != q->width ||
      (p->a < 0) != (q->a < 0) || (p->b < 0) != (q->b < 0))
    return false;
  if (p->a >= 0 && p->b >= 0) return true;
  const cn_tensor *tp = cp->w[p->t], *tq = cp->w[q->t];
  return tp->numel / tp->shape[0] == tq->numel / tq->shape[0];
}

/* Schedules every BMM sum whose operands are ready: the single products
 * of one shape as one call, each sum as one call of its terms. Sets
 * *progress when any was scheduled. */
int cn__cell_schedule_bmm(compiler *cp, bool *progress) {
  const cn_ir *g = cp->g;
  cn_cell *c = cp->c;
  int ready[CN_IR_MAX], nr = 0;
  for (int v = 0; v < g->n; v++) {
    if (cp->bmm_root[v] != v || cp->done[v]) continue;
    int mem[CN_IR_MAX], nm = bmm_members(cp, v, mem);
    bool ok = true;
    for (int k = 0; k < nm; k++) ok &= bmm_ready(cp, mem[k]);
    if (ok) ready[nr++] = v;
  }
  bool taken[CN_IR_MAX] = {false};
  for (int i = 0; i < nr; i++) {
    if (taken[i]) continue;
    int mem[CN_IR_MAX], nm = bmm_members(cp, ready[i], mem);
    /* a single product: joined by the other singles of its shape */
    int call[16], nc = 0;
    if (nm == 1) {
      for (int j = i; j < nr && nc < 16; j++) {
        int mj[CN_IR_MAX];
        if (taken[j] || bmm_members(cp, ready[j], mj) != 1 ||
            !bmm_same_call(cp, mem[0], mj[0]))
          continue;
        taken[j] = true;
        call[nc++] = mj[0];
      }
    }
    taken[i] = true;
    int cnt = nm == 1 ? nc : nm;
    if (cp->n_bmm_step + cnt > 16) return CN_E_INTERNAL;
    int rc = add_step(c, CN_STEP_BMM, cp->n_bmm_step);
    if (rc != 0) return rc;
    c->steps[c->n_steps - 1].n = cnt;
    c->steps[c->n_steps - 1].sum = nm > 1;
    for (int q = 0; q < cnt; q++)
      cp->bmm_node[cp->n_bmm_step++] = nm == 1 ? call[q] : mem[q];
    /* the sums' values (and their members) exist after their last call */
    for (int q = 0; q < (nm == 1 ? nc : 1); q++) {
      int root = nm == 1 ? cp->bmm_root[call[q]] : ready[i];
      for (int v = 0; v <= root; v++)
        if (cp->bmm_root[v] == root) {
          cp->done[v] = true;
          cp->producer[v] = c->n_steps - 1;
        }
    }
    *progress = true;
  }
  return 0;
}
