/* pqtree_align.c - ED-Batch's memory layout for a static subgraph (§3.2,
 * Fig. 4, Appendix B Alg. 2-7): put variables in an order where every
 * batched operand is contiguous and all operands of a batch are aligned.
 *
 * The three passes of Alg. 2, on one PQ-tree over the variables:
 *  1. ConstructPQTree (line 30): each operand's variables consecutive.
 *  2. BroadcastConstraint (Alg. 3/4): the subtree of an operand, read over
 *     op indices, is a PQ-tree T_o; its constraints (a P-node's leaves, a
 *     Q-node's adjacent children) are carried through the alignment to the
 *     batch's other operands and reduced, until nothing changes. Then all
 *     T_o of a batch admit the same op orders, i.e. they are isomorphic.
 *  3. DecideNodesOrder (Alg. 5/6): corresponding nodes of isomorphic T_o
 *     must take corresponding orders. Q-nodes (and two-child P-nodes) carry
 *     a direction bit, P-nodes a permutation; a union-find whose edges hold
 *     the relative transformation sigma keeps these equations and spots a
 *     contradiction. GetLeafOrder (Alg. 7) then reads the frontier with
 *     every node in the order its class decides.
 *
 * Every reduce in pass 2 is implied by "the tree's constraints hold and
 * the batch is aligned", and pass 3's equations say exactly "every batch
 * is aligned" once the T_o are isomorphic. So the kept batches are
 * satisfiable together iff no pass fails. Batches are added one at a time
 * (greedy, in the caller's order) and a batch is dropped when adding it
 * makes some pass fail (Alg. 2 line 14); on the kept ones the result is
 * exact, not a heuristic. Alg. 3 re-queues only batches whose subtrees
 * changed; here a whole pass over the batches is repeated instead, which is
 * simpler and reaches the same fixpoint.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cell/pqtree.h"

/* A node of T_o: a tree node, or at T_o's root a run lo..hi of a Q-node's
 * children (an operand covering part of a Q-node). */
typedef struct view {
  int node, lo, hi; /* lo < 0: the whole node */
} view;

typedef struct lay {
  int n_vars;
  const cn_pq_batch *b;
  int n_batches;
  const unsigned char *use; /* batches taken into account now */
  unsigned char *live;      /* per batch operand: not a broadcast */
  int *live_off;            /* batch -> first entry in live */
  /* scratch over node slots (cap entries each) */
  int cap;
  int *pre, *stk, *cnt, *nlf, *minA, *minB;
  int *bpar, *bpty;         /* direction union-find: parent, parity */
  int *ppar, *poff, *pmap;  /* permutation union-find: parent, sigma */
  int *pool, pool_top;      /* bump allocator for per-node arrays */
  /* scratch over variables */
  int *opA, *opB, *vars;
  int *sets, n_sets, sets_cap; /* [len, ops...] records */
} lay;

enum { BIT = 1, PERM = 2 };

static int ensure(lay *L, const cn_pq *t) {
  int ns = cn__pq_n_slots(t);
  if (ns <= L->cap) return 0;
  int ncap = ns * 2;
  int **f[] = {&L->pre,  &L->stk,  &L->cnt,  &L->nlf,  &L->minA, &L->minB,
               &L->bpar, &L->bpty, &L->ppar, &L->poff, &L->pmap};
  for (size_t i = 0; i < CN_ARRAY_SIZE(f); i++) {
    int *p = cn__xrealloc(*f[i], (size_t)ncap, sizeof(int));
    if (p == NULL) return CN_E_NOMEM;
    *f[i] = p;
  }
  int *p = cn__xrealloc(L->pool, (size_t)ncap * 6 + 16, sizeof(int));
  if (p == NULL) return CN_E_NOMEM;
  L->pool = p;
  L->cap = ncap;
  return 0;
}

static int is_broadcast(const int *v, int k) {
  for (int i = 0; i < k; i++)
    for (int j = i + 1; j < k; j++)
      if (v[i] == v[j]) return 1;
  return 0;
}

static const int *operand(const cn_pq_batch *b, int o) {
  return b->vars + (size_t)o * b->n_ops;
}

/* Pre-order of t's live nodes into L->pre; returns the count. */
static int preorder(lay *L, const cn_pq *t) {
  int n = 0, top = 0;
  L->stk[top++] = cn__pq_root(t);
  while (top > 0) {
    int v = L->stk[--top];
    L->pre[n++] = v;
    for (int c = cn__pq_first(t, v); c >= 0; c = cn__pq_next(t, c))
      L->stk[top++] = c;
  }
  return n;
}

/* minv[node] = smallest op index among the node's leaves (op[] maps a
 * variable to its op index in one operand, -1 if absent); INT_MAX if none.
 * Children of one node have disjoint op sets, so this names them. */
static void min_ops(lay *L, const cn_pq *t, int n, const int *op, int *minv) {
  for (int i = n - 1; i >= 0; i--) {
    int v = L->pre[i], m = INT_MAX;
    if (cn__pq_kind(t, v) == CN__PQ_LEAF) {
      m = op[v] >= 0 ? op[v] : INT_MAX;
    } else {
      for (int c = cn__pq_first(t, v); c >= 0; c = cn__pq_next(t, c))
        if (minv[c] < m) m = minv[c];
    }
    minv[v] = m;
  }
}

/* The root of T_o for the k distinct variables vars: Alg. 4's FindRoot.
 * The operand is consecutive in t, so it is a node's leaves or a run of a
 * Q-node's children; anything else is a conflict. */
static int find_view(lay *L, const cn_pq *t, const int *vars, int k,
                     view *out) {
  int n = preorder(L, t);
  for (int i = 0; i < n; i++) L->cnt[L->pre[i]] = 0;
  for (int i = 0; i < k; i++) L->cnt[vars[i]] = 1;
  for (int i = n - 1; i >= 0; i--) {
    int v = L->pre[i];
    if (cn__pq_kind(t, v) == CN__PQ_LEAF) {
      L->nlf[v] = 1;
      continue;
    }
    L->cnt[v] = L->nlf[v] = 0;
    for (int c = cn__pq_first(t, v); c >= 0; c = cn__pq_next(t, c)) {
      L->cnt[v] += L->cnt[c];
      L->nlf[v] += L->nlf[c];
    }
  }
  int r = cn__pq_root(t);
  for (int moved = 1; moved;) {
    moved = 0;
    for (int c = cn__pq_first(t, r); c >= 0; c = cn__pq_next(t, c))
      if (L->cnt[c] == k) {
        r = c;
        moved = 1;
        break;
      }
  }
  *out = (view){r, -1, -1};
  if (L->nlf[r] == k) return 0;
  if (cn__pq_kind(t, r) != CN__PQ_Q) return CN_PQ_CONFLICT;
  int state = 0; /* 0 before the run, 1 in it, 2 after it */
  for (int c = cn__pq_first(t, r); c >= 0; c = cn__pq_next(t, c)) {
    if (L->cnt[c] == 0) {
      if (state == 1) state = 2;
      continue;
    }
    if (L->cnt[c] != L->nlf[c] || state == 2) return CN_PQ_CONFLICT;
    if (state == 0) out->lo = c;
    out->hi = c;
    state = 1;
  }
  return 0;
}

static int vfirst(const cn_pq *t, view v) {
  return v.lo >= 0 ? v.lo : cn__pq_first(t, v.node);
}

static int vnext(const cn_pq *t, view v, int c) {
  return v.lo >= 0 && c == v.hi ? -1 : cn__pq_next(t, c);
}

static int vcount(const cn_pq *t, view v) {
  int m = 0;
  for (int c = vfirst(t, v); c >= 0; c = vnext(t, v, c)) m++;
  return m;
}

/* How a node of T_o takes an order: a direction bit (Q-nodes, runs of a
 * Q-node, two-child P-nodes) or a permutation (P-nodes with >= 3). */
static int order_kind(const cn_pq *t, view v, int m) {
  return cn__pq_kind(t, v.node) == CN__PQ_P && v.lo < 0 && m >= 3 ? PERM
                                                                  : BIT;
}

/* ---- pass 2: BroadcastConstraint (Alg. 3/4) ----------------------------- */

static int push_int(lay *L, int x) {
  if (L->n_sets == L->sets_cap) {
    int nc = L->sets_cap ? L->sets_cap * 2 : 256;
    int *p = cn__xrealloc(L->sets, (size_t)nc, sizeof(int));
    if (p == NULL) return CN_E_NOMEM;
    L->sets = p;
    L->sets_cap = nc;
  }
  L->sets[L->n_sets++] = x;
  return 0;
}

/* Appends the op indices of v's leaves (v a whole node). */
static int push_ops(lay *L, const cn_pq *t, int v, const int *op) {
  if (cn__pq_kind(t, v) == CN__PQ_LEAF) return push_int(L, op[v]);
  for (int c = cn__pq_first(t, v); c >= 0; c = cn__pq_next(t, c)) {
    int rc = push_ops(L, t, c, op);
    if (rc < 0) return rc;
  }
  return 0;
}

/* Alg. 4 getSubtreeCons + the op-index half of ParseConstraints: every
 * P-node below the root gives its op set, every Q-node (or the root's run)
 * each pair of adjacent children, as [len, ops...] records in L->sets. */
static int subtree_cons(lay *L, const cn_pq *t, view v, const int *op,
                        int is_root) {
  int rc, kind = cn__pq_kind(t, v.node);
  if (kind == CN__PQ_LEAF) return 0;
  if (kind == CN__PQ_P && v.lo < 0 && !is_root) {
    int at = L->n_sets;
    if ((rc = push_int(L, 0)) < 0 || (rc = push_ops(L, t, v.node, op)) < 0)
      return rc;
    L->sets[at] = L->n_sets - at - 1;
  } else if (kind == CN__PQ_Q) {
    for (int c = vfirst(t, v), d; c >= 0 && (d = vnext(t, v, c)) >= 0;
         c = d) {
      int at = L->n_sets;
      if ((rc = push_int(L, 0)) < 0 || (rc = push_ops(L, t, c, op)) < 0 ||
          (rc = push_ops(L, t, d, op)) < 0)
        return rc;
      L->sets[at] = L->n_sets - at - 1;
    }
  }
  for (int c = vfirst(t, v); c >= 0; c = vnext(t, v, c))
    if ((rc = subtree_cons(L, t, (view){c, -1, -1}, op, 0)) < 0) return rc;
  return 0;
}

/* One batch's share of a BroadcastConstraint round: each operand's
 * subtree constraints, carried to the other operands through the
 * alignment (Alg. 4 ParseConstraints line 20) and reduced (ApplyConstraints).
 * *changed says whether the tree moved. */
static int broadcast_batch(lay *L, cn_pq *t, int bi, int *changed) {
  const cn_pq_batch *b = &L->b[bi];
  const unsigned char *live = L->live + L->live_off[bi];
  int k = b->n_ops, rc, n_live = 0;
  for (int o = 0; o < b->n_operands; o++) n_live += live[o];
  if (n_live < 2) return 0; /* nothing to carry across */
  for (int o = 0; o < b->n_operands; o++) {
    if (!live[o]) continue;
    const int *vo = operand(b, o);
    view v;
    if ((rc = ensure(L, t)) < 0 || (rc = find_view(L, t, vo, k, &v)) < 0)
      return rc;
    for (int i = 0; i < k; i++) L->opA[vo[i]] = i;
    L->n_sets = 0;
    rc = subtree_cons(L, t, v, L->opA, 1);
    for (int i = 0; i < k; i++) L->opA[vo[i]] = -1;
    if (rc < 0) return rc;
    for (int o2 = 0; o2 < b->n_operands; o2++) {
      if (o2 == o || !live[o2]) continue;
      const int *v2 = operand(b, o2);
      for (int s = 0; s < L->n_sets; s += L->sets[s] + 1) {
        int len = L->sets[s], ch;
        for (int j = 0; j < len; j++) L->vars[j] = v2[L->sets[s + 1 + j]];
        if ((rc = cn__pq_reduce(t, L->vars, len, &ch)) < 0) return rc;
        *changed |= ch;
      }
    }
  }
  return 0;
}

/* ---- pass 3: DecideNodesOrder (Alg. 5/6) -------------------------------- */

static void uf_init(lay *L, const cn_pq *t) {
  int ns = cn__pq_n_slots(t), off = 0;
  for (int v = 0; v < ns; v++) {
    L->bpar[v] = L->ppar[v] = v;
    L->bpty[v] = 0;
    L->poff[v] = off;
    int k = cn__pq_kind(t, v);
    if (k == CN__PQ_P || k == CN__PQ_Q) {
      int m = cn__pq_n_children(t, v);
      for (int j = 0; j < m; j++) L->pmap[off + j] = j;
      off += m; /* sum of children < slots: fits in pmap */
    }
  }
}

/* Alg. 6 Find on directions: the root and bit(v) = bit(root) ^ *par. */
static int bit_find(const lay *L, int v, int *par) {
  *par = 0;
  while (L->bpar[v] != v) {
    *par ^= L->bpty[v];
    v = L->bpar[v];
  }
  return v;
}

/* Alg. 6 Union on directions: bit(B) = bit(A) ^ f, or a conflict. */
static int bit_union(lay *L, int a, int b, int f) {
  int pa, pb, ra = bit_find(L, a, &pa), rb = bit_find(L, b, &pb);
  if (ra != rb) {
    L->bpar[ra] = rb;
    L->bpty[ra] = pa ^ pb ^ f;
    return 0;
  }
  return (pa ^ pb ^ f) ? CN_PQ_CONFLICT : 0;
}

/* Alg. 6 Find on permutations. An order of a node with m children is a
 * sequence alpha (alpha[pos] = child index); an edge v -> parent holds
 * sigma with order(parent) = sigma o order(v). Writes into F the composed
 * sigma from v to the root and returns the root. */
static int perm_find(const lay *L, int v, int m, int *F) {
  for (int j = 0; j < m; j++) F[j] = j;
  while (L->ppar[v] != v) {
    const int *s = L->pmap + L->poff[v];
    for (int j = 0; j < m; j++) F[j] = s[F[j]];
    v = L->ppar[v];
  }
  return v;
}

/* Alg. 6 Union on permutations: order(B) = c o order(A). With
 * order(rA) = a o order(A) and order(rB) = b o order(B), the roots are
 * tied by order(rB) = (b c a^-1) o order(rA) (line 16), which must be the
 * identity when they are already one class (line 17). */
static int perm_union(lay *L, int A, int B, const int *c, int m) {
  int *a = L->pool + L->pool_top, *bb = a + m, *ainv = bb + m, *M = ainv + m;
  int ra = perm_find(L, A, m, a), rb = perm_find(L, B, m, bb);
  for (int j = 0; j < m; j++) ainv[a[j]] = j;
  for (int x = 0; x < m; x++) M[x] = bb[c[ainv[x]]];
  if (ra != rb) {
    memcpy(L->pmap + L->poff[ra], M, (size_t)m * sizeof(int));
    L->ppar[ra] = rb;
    return 0;
  }
  for (int x = 0; x < m; x++)
    if (M[x] != x) return CN_PQ_CONFLICT;
  return 0;
}

/* Alg. 5 ParseEquivNodeOrderPair, as a simultaneous walk down T_A and T_B
 * (operands A, B of one batch; op indices in opA/opB, smallest op per
 * node in minA/minB): corresponding nodes must be of the same kind, have
 * children with the same op sets, and take corresponding orders. */
static int match(lay *L, const cn_pq *t, view va, view vb) {
  int ka = cn__pq_kind(t, va.node), kb = cn__pq_kind(t, vb.node);
  if (ka == CN__PQ_LEAF || kb == CN__PQ_LEAF)
    return ka == kb && L->opA[va.node] == L->opB[vb.node] ? 0
                                                         : CN_PQ_CONFLICT;
  int m = vcount(t, va), rc = 0;
  if (m != vcount(t, vb)) return CN_PQ_CONFLICT;
  int kind = order_kind(t, va, m);
  if (kind != order_kind(t, vb, m)) return CN_PQ_CONFLICT;
  int *c = L->pool + L->pool_top, *cb = c + m, save = L->pool_top;
  L->pool_top += 2 * m;
  int j = 0;
  for (int x = vfirst(t, vb); x >= 0; x = vnext(t, vb, x)) cb[j++] = x;
  int i = 0, fwd = 1, bwd = 1;
  for (int x = vfirst(t, va); x >= 0; x = vnext(t, va, x), i++) {
    for (j = 0; j < m && L->minB[cb[j]] != L->minA[x]; j++) {
    }
    if (j == m) {
      rc = CN_PQ_CONFLICT;
      goto out;
    }
    c[i] = j;
    fwd &= j == i;
    bwd &= j == m - 1 - i;
  }
  if (kind == BIT) {
    rc = fwd || bwd ? bit_union(L, va.node, vb.node, !fwd) : CN_PQ_CONFLICT;
  } else {
    rc = perm_union(L, va.node, vb.node, c, m);
  }
  i = 0;
  for (int x = vfirst(t, va); rc == 0 && x >= 0; x = vnext(t, va, x), i++)
    rc = match(L, t, (view){x, -1, -1}, (view){cb[c[i]], -1, -1});
out:
  L->pool_top = save;
  return rc;
}

/* Builds the order equations of every batch in L->use on t (Alg. 2 lines
 * 18-28); CN_PQ_CONFLICT when they contradict each other. */
static int decide_orders(lay *L, const cn_pq *t) {
  int rc = ensure(L, t);
  if (rc < 0) return rc;
  uf_init(L, t);
  for (int bi = 0; bi < L->n_batches; bi++) {
    if (!L->use[bi]) continue;
    const cn_pq_batch *b = &L->b[bi];
    const unsigned char *live = L->live + L->live_off[bi];
    int k = b->n_ops, o0 = -1;
    view v0, v1;
    for (int o = 0; o < b->n_operands && rc == 0; o++) {
      if (!live[o]) continue;
      const int *vo = operand(b, o);
      if (o0 < 0) {
        o0 = o;
        if ((rc = find_view(L, t, vo, k, &v0)) < 0) break;
        for (int i = 0; i < k; i++) L->opA[vo[i]] = i;
        min_ops(L, t, preorder(L, t), L->opA, L->minA);
        continue;
      }
      if ((rc = find_view(L, t, vo, k, &v1)) < 0) break;
      for (int i = 0; i < k; i++) L->opB[vo[i]] = i;
      min_ops(L, t, preorder(L, t), L->opB, L->minB);
      L->pool_top = 0;
      rc = match(L, t, v0, v1);
      for (int i = 0; i < k; i++) L->opB[vo[i]] = -1;
    }
    if (o0 >= 0)
      for (int i = 0; i < k; i++) L->opA[operand(b, o0)[i]] = -1;
    if (rc < 0) return rc;
  }
  return 0;
}

/* ---- Alg. 7 GetLeafOrder ----------------------------------------------- */

static void emit(lay *L, const cn_pq *t, int v, int *order, int *n) {
  int kind = cn__pq_kind(t, v);
  if (kind == CN__PQ_LEAF) {
    order[(*n)++] = v;
    return;
  }
  int m = cn__pq_n_children(t, v), save = L->pool_top;
  int *ch = L->pool + L->pool_top, *F = ch + m, j = 0;
  L->pool_top += 2 * m;
  for (int c = cn__pq_first(t, v); c >= 0; c = cn__pq_next(t, c)) ch[j++] = c;
  if (order_kind(t, (view){v, -1, -1}, m) == BIT) {
    int par;
    bit_find(L, v, &par); /* the class root's bit is 0 */
    for (j = 0; j < m; j++) emit(L, t, ch[par ? m - 1 - j : j], order, n);
  } else {
    /* order(root) = identity = F o order(v): position p holds F^-1(p) */
    perm_find(L, v, m, F);
    for (int p = 0; p < m; p++)
      for (j = 0; j < m; j++)
        if (F[j] == p) emit(L, t, ch[j], order, n);
  }
  L->pool_top = save;
}

/* ---- Alg. 2 Main -------------------------------------------------------- */

static int batch_valid(const cn_pq_batch *b, int n_vars) {
  if (b->n_operands < 1 || b->n_ops < 1 || b->vars == NULL) return 0;
  for (long i = 0; i < (long)b->n_operands * b->n_ops; i++)
    if (b->vars[i] < 0 || b->vars[i] >= n_vars) return 0;
  return 1;
}

/* Tries to add batch bi to the kept ones on t (a scratch copy of the kept
 * batches' tree): its operands' adjacency (line 30), the broadcast
 * fixpoint over all kept batches (line 31), then the order equations
 * (line 32). CN_PQ_CONFLICT when the batches cannot all be met. */
static int try_batch(lay *L, cn_pq *t, unsigned char *use, int bi) {
  const cn_pq_batch *b = &L->b[bi];
  const unsigned char *live = L->live + L->live_off[bi];
  int rc, changed = 1;
  for (int o = 0; o < b->n_operands; o++)
    if (live[o] && (rc = cn_pq_reduce(t, operand(b, o), b->n_ops)) < 0)
      return rc;
  use[bi] = 1;
  /* Each round that changes the tree removes admitted orders; the bound
   * only guards against a bug turning this into a loop. */
  for (int round = 0; changed; round++) {
    if (round > 4 * L->n_vars + 16) return CN_PQ_CONFLICT;
    changed = 0;
    for (int c = 0; c < L->n_batches; c++)
      if (use[c] && (rc = broadcast_batch(L, t, c, &changed)) < 0) return rc;
  }
  return decide_orders(L, t);
}

static void lay_free(lay *L) {
  int *f[] = {L->pre,  L->stk,  L->cnt,  L->nlf,  L->minA, L->minB,
              L->bpar, L->bpty, L->ppar, L->poff, L->pmap, L->pool,
              L->opA,  L->opB,  L->vars, L->sets, L->live_off};
  for (size_t i = 0; i < CN_ARRAY_SIZE(f); i++) free(f[i]);
  free(L->live);
}

int cn_pq_layout(int n_vars, const cn_pq_batch *b, int n_batches, int *order,
                 unsigned char *kept) {
  lay L = {.n_vars = n_vars, .b = b, .n_batches = n_batches, .use = kept};
  cn_pq *cur = NULL, *work = NULL;
  int rc = CN_E_NOMEM, n_live = 0, max_k = 1;
  if (n_vars < 1) return 0;
  for (int bi = 0; bi < n_batches; bi++) {
    kept[bi] = 0;
    if (b[bi].n_operands > 0) n_live += b[bi].n_operands;
  }
  L.live = calloc((size_t)n_live + 1, 1);
  L.live_off = calloc((size_t)n_batches + 1, sizeof(int));
  L.opA = malloc((size_t)n_vars * sizeof(int));
  L.opB = malloc((size_t)n_vars * sizeof(int));
  cur = cn_pq_new(n_vars);
  if (!L.live || !L.live_off || !L.opA || !L.opB || !cur) goto out;
  for (int v = 0; v < n_vars; v++) L.opA[v] = L.opB[v] = -1;
  for (int bi = 0, off = 0; bi < n_batches; bi++) {
    L.live_off[bi] = off;
    if (b[bi].n_operands < 1) continue;
    if (batch_valid(&b[bi], n_vars)) {
      for (int o = 0; o < b[bi].n_operands; o++)
        L.live[off + o] = !is_broadcast(operand(&b[bi], o), b[bi].n_ops);
      if (b[bi].n_ops > max_k) max_k = b[bi].n_ops;
    }
    off += b[bi].n_operands;
  }
  L.vars = malloc((size_t)max_k * sizeof(int));
  if (L.vars == NULL || (rc = ensure(&L, cur)) < 0) goto out;
  for (int bi = 0; bi < n_batches; bi++) {
    if (!batch_valid(&b[bi], n_vars)) continue;
    if ((work = cn_pq_clone(cur)) == NULL) {
      rc = CN_E_NOMEM;
      goto out;
    }
    rc = try_batch(&L, work, kept, bi);
    if (rc == CN_E_NOMEM) goto out;
    if (rc == 0) { /* kept: the new tree becomes the current one */
      cn_pq *x = cur;
      cur = work;
      work = x;
    } else {
      kept[bi] = 0;
    }
    cn_pq_free(work);
    work = NULL;
  }
  /* The order equations of the kept batches on the final tree, and the
   * frontier they decide (Alg. 2 lines 32-33). */
  if ((rc = decide_orders(&L, cur)) < 0) goto out;
  int n = 0;
  L.pool_top = 0;
  emit(&L, cur, cn__pq_root(cur), order, &n);
  /* Belt and braces: the caller re-checks kept batches, so do we. */
  int *pos = L.opB;
  for (int i = 0; i < n_vars; i++) pos[order[i]] = i;
  for (int bi = 0; bi < n_batches; bi++)
    if (kept[bi] && !cn_pq_batch_ok(&b[bi], pos)) kept[bi] = 0;
  rc = 0;
out:
  cn_pq_free(work);
  cn_pq_free(cur);
  lay_free(&L);
  return rc;
}

/* Exact check of one batch against pos[var]: a non-broadcast operand is
 * consecutive iff its positions span k slots (its variables are
 * distinct), and two consecutive operands are aligned iff every op sits at
 * the same offset from its operand's start. */
int cn_pq_batch_ok(const cn_pq_batch *b, const int *pos) {
  int k = b->n_ops, ref = -1, ref_min = 0;
  for (int o = 0; o < b->n_operands; o++) {
    const int *v = operand(b, o);
    if (is_broadcast(v, k)) continue;
    int lo = INT_MAX, hi = INT_MIN;
    for (int i = 0; i < k; i++) {
      if (pos[v[i]] < lo) lo = pos[v[i]];
      if (pos[v[i]] > hi) hi = pos[v[i]];
    }
    if (hi - lo != k - 1) return 0;
    if (ref < 0) {
      ref = o;
      ref_min = lo;
      continue;
    }
    for (int i = 0; i < k; i++)
      if (pos[v[i]] - lo != pos[operand(b, ref)[i]] - ref_min) return 0;
  }
  return 1;
}
