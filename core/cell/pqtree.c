/* pqtree.c - PQ-trees (Booth & Lueker 1976), the consecutive-ones
 * structure under ED-Batch's memory layout (§3.2, Fig. 4(a)).
 *
 * Nodes live in flat int arrays, one slot per node: leaf i is slot i,
 * internal nodes take the slots after the leaves (a free list recycles
 * them). Children form a doubly linked list through next/prev, so a Q-node
 * reverses, and templates splice, without moving arrays. Everything sits in
 * one buffer, so a clone is one memcpy: a reduce that must restructure
 * works on a clone and swaps it in only on success, which is how a failed
 * reduce leaves the tree exactly as it was.
 *
 * REDUCE is the plain recursive form of Booth & Lueker's algorithm:
 * count the set's leaves under every node, find the pertinent root (the
 * deepest node holding all of them), then, bottom-up over the partial
 * nodes only (a node with all or none of its leaves in the set is left
 * alone: L1, P0, P1, Q1), apply the templates P2-P6 and Q2-Q3. A node made
 * partial below the root always becomes a Q-node whose children run
 * empty..full, left to right. This costs O(n) per reduce instead of
 * O(|set|), which is immaterial for trees under 200 leaves. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cell/pqtree.h"

#define FIELDS 10

struct cn_pq {
  /* shape */
  int n_leaves;
  int cap;        /* slots per field */
  int n_slots;    /* slots ever used (high-water mark) */
  int root;
  int free_head;  /* free internal slots, chained through next[] */
  /* one buffer of FIELDS * cap ints; the pointers below index into it */
  int *buf;
  int *kind, *parent, *first, *last, *next, *prev, *nch;
  int *cnt, *nleaf; /* reduce scratch: set leaves / all leaves below */
  int *scr;         /* traversal scratch */
};

enum { ST_EMPTY, ST_FULL, ST_PARTIAL };

static void bind(cn_pq *t) {
  int **f[FIELDS] = {&t->kind, &t->parent, &t->first, &t->last, &t->next,
                     &t->prev, &t->nch,    &t->cnt,   &t->nleaf, &t->scr};
  for (int i = 0; i < FIELDS; i++) *f[i] = t->buf + (size_t)i * t->cap;
}

/* Doubles the slot count, keeping every field's contents. */
static int grow(cn_pq *t) {
  int ncap = t->cap * 2;
  int *nb = cn__xcalloc((size_t)FIELDS * ncap, sizeof(int));
  if (nb == NULL) return CN_E_NOMEM;
  for (int i = 0; i < FIELDS; i++)
    memcpy(nb + (size_t)i * ncap, t->buf + (size_t)i * t->cap,
           (size_t)t->cap * sizeof(int));
  free(t->buf);
  t->buf = nb;
  t->cap = ncap;
  bind(t);
  return 0;
}

/* A fresh internal node with no children; its id, or CN_E_NOMEM. */
static int node_alloc(cn_pq *t, int kind) {
  int v;
  if (t->free_head >= 0) {
    v = t->free_head;
    t->free_head = t->next[v];
  } else {
    if (t->n_slots == t->cap && grow(t) < 0) return CN_E_NOMEM;
    v = t->n_slots++;
  }
  t->kind[v] = kind;
  t->parent[v] = t->first[v] = t->last[v] = t->next[v] = t->prev[v] = -1;
  t->nch[v] = t->cnt[v] = t->nleaf[v] = 0;
  return v;
}

static void node_free(cn_pq *t, int v) {
  t->kind[v] = CN__PQ_FREE;
  t->next[v] = t->free_head;
  t->free_head = v;
}

static void unlink_node(cn_pq *t, int c) {
  int p = t->parent[c];
  if (p < 0) return;
  if (t->prev[c] >= 0) t->next[t->prev[c]] = t->next[c];
  else t->first[p] = t->next[c];
  if (t->next[c] >= 0) t->prev[t->next[c]] = t->prev[c];
  else t->last[p] = t->prev[c];
  t->nch[p]--;
  t->parent[c] = t->next[c] = t->prev[c] = -1;
}

static void append(cn_pq *t, int p, int c) {
  t->parent[c] = p;
  t->prev[c] = t->last[p];
  t->next[c] = -1;
  if (t->last[p] >= 0) t->next[t->last[p]] = c;
  else t->first[p] = c;
  t->last[p] = c;
  t->nch[p]++;
}

static void prepend(cn_pq *t, int p, int c) {
  t->parent[c] = p;
  t->next[c] = t->first[p];
  t->prev[c] = -1;
  if (t->first[p] >= 0) t->prev[t->first[p]] = c;
  else t->last[p] = c;
  t->first[p] = c;
  t->nch[p]++;
}

/* Puts the unlinked node c just before ref, under ref's parent. */
static void insert_before(cn_pq *t, int ref, int c) {
  int p = t->parent[ref];
  t->parent[c] = p;
  t->next[c] = ref;
  t->prev[c] = t->prev[ref];
  if (t->prev[ref] >= 0) t->next[t->prev[ref]] = c;
  else t->first[p] = c;
  t->prev[ref] = c;
  t->nch[p]++;
}

/* The unlinked node nw takes old's place (in old's parent, or as root). */
static void replace_node(cn_pq *t, int old, int nw) {
  int p = t->parent[old];
  if (p < 0) {
    t->root = nw;
    t->parent[nw] = -1;
    return;
  }
  insert_before(t, old, nw);
  unlink_node(t, old);
}

static void reverse_children(cn_pq *t, int q) {
  for (int c = t->first[q]; c >= 0;) {
    int nx = t->next[c];
    t->next[c] = t->prev[c];
    t->prev[c] = nx;
    c = nx;
  }
  int f = t->first[q];
  t->first[q] = t->last[q];
  t->last[q] = f;
}

/* Replaces the node part by its children, in order or reversed, and frees
 * it: the splice that Q2, Q3 and P6 do to a partial Q-node. */
static void splice(cn_pq *t, int part, int reversed) {
  for (;;) {
    int c = reversed ? t->last[part] : t->first[part];
    if (c < 0) break;
    unlink_node(t, c);
    insert_before(t, part, c);
  }
  unlink_node(t, part);
  node_free(t, part);
}

static int status(const cn_pq *t, int v) {
  if (t->cnt[v] == 0) return ST_EMPTY;
  return t->cnt[v] == t->nleaf[v] ? ST_FULL : ST_PARTIAL;
}

/* Unlinks x's children of status st and returns them as one node: the
 * child itself when there is one, else a new P-node over them (the
 * "full/empty children grouped under a P-node" step of P2-P6). *out is -1
 * when there are none. 0 or CN_E_NOMEM. */
static int group(cn_pq *t, int x, int st, int *out) {
  int n = 0, only = -1;
  *out = -1;
  for (int c = t->first[x]; c >= 0; c = t->next[c])
    if (status(t, c) == st) {
      n++;
      only = c;
    }
  if (n == 0) return 0;
  if (n == 1) {
    unlink_node(t, only);
    *out = only;
    return 0;
  }
  int g = node_alloc(t, CN__PQ_P);
  if (g < 0) return g;
  for (int c = t->first[x]; c >= 0;) {
    int nx = t->next[c];
    if (status(t, c) == st) {
      unlink_node(t, c);
      append(t, g, c);
      t->cnt[g] += t->cnt[c];
      t->nleaf[g] += t->nleaf[c];
    }
    c = nx;
  }
  *out = g;
  return 0;
}

/* Scans a Q-node's children for E* [P] F* (root: E* [P] F* [P] E*),
 * returning 1 on a match with the partial children found. */
static int q_scan(const cn_pq *t, int x, int root, int *left, int *right) {
  int c = t->first[x];
  *left = *right = -1;
  while (c >= 0 && status(t, c) == ST_EMPTY) c = t->next[c];
  if (c >= 0 && status(t, c) == ST_PARTIAL) {
    *left = c;
    c = t->next[c];
  }
  while (c >= 0 && status(t, c) == ST_FULL) c = t->next[c];
  if (root) {
    if (c >= 0 && status(t, c) == ST_PARTIAL) {
      *right = c;
      c = t->next[c];
    }
    while (c >= 0 && status(t, c) == ST_EMPTY) c = t->next[c];
  }
  return c < 0;
}

/* Templates for a partial P-node x. Below the root (P3, P5) x ends as a
 * Q-node ordered empty..full standing where x stood; at the root (P2, P4,
 * P6) the full leaves end consecutive (Booth & Lueker's P-templates). */
static int p_template(cn_pq *t, int x, int is_root, int np, int q1, int q2) {
  int ge, gf, rc;
  if (np > (is_root ? 2 : 1)) return CN_PQ_CONFLICT;
  if (!is_root && np == 0) { /* P3 */
    if ((rc = group(t, x, ST_EMPTY, &ge)) < 0) return rc;
    if ((rc = group(t, x, ST_FULL, &gf)) < 0) return rc;
    t->kind[x] = CN__PQ_Q;
    append(t, x, ge);
    append(t, x, gf);
    return 0;
  }
  if (!is_root) { /* P5: q1 replaces x, empties before it, fulls after */
    if ((rc = group(t, x, ST_EMPTY, &ge)) < 0) return rc;
    if ((rc = group(t, x, ST_FULL, &gf)) < 0) return rc;
    unlink_node(t, q1);
    replace_node(t, x, q1);
    t->cnt[q1] = t->cnt[x];
    t->nleaf[q1] = t->nleaf[x];
    node_free(t, x);
    if (ge >= 0) prepend(t, q1, ge);
    if (gf >= 0) append(t, q1, gf);
    return 0;
  }
  if ((rc = group(t, x, ST_FULL, &gf)) < 0) return rc;
  if (np == 0) { /* P2 */
    if (gf >= 0) append(t, x, gf);
    return 0;
  }
  if (gf >= 0) append(t, q1, gf); /* P4 and P6: fulls at q1's full end */
  if (np == 2) {                   /* P6: then q2's children, full first */
    for (int c; (c = t->last[q2]) >= 0;) {
      unlink_node(t, c);
      append(t, q1, c);
    }
    unlink_node(t, q2);
    node_free(t, q2);
  }
  if (t->nch[x] == 1) { /* x had nothing but q1 left: q1 replaces it */
    unlink_node(t, q1);
    replace_node(t, x, q1);
    node_free(t, x);
  }
  return 0;
}

/* Templates for a partial Q-node x: Q2 below the root (reversing x if its
 * full end is on the left), Q3 at the root (Booth & Lueker's Q-templates). */
static int q_template(cn_pq *t, int x, int is_root, int *changed) {
  int left, right;
  if (!q_scan(t, x, is_root, &left, &right)) {
    if (is_root) return CN_PQ_CONFLICT;
    reverse_children(t, x);
    if (!q_scan(t, x, 0, &left, &right)) return CN_PQ_CONFLICT;
  }
  if (left >= 0) splice(t, left, 0);
  if (right >= 0) splice(t, right, 1);
  if (!is_root || left >= 0 || right >= 0) *changed = 1;
  return 0;
}

/* Applies the templates bottom-up below and at x, a partial node: the
 * partial children first, so that each arrives as a Q-node ordered
 * empty..full, which is all the templates at x need to know of it. */
static int process(cn_pq *t, int x, int is_root, int *changed) {
  int np = 0, q[3] = {-1, -1, -1}, rc;
  for (int c = t->first[x]; c >= 0;) {
    int nx = t->next[c]; /* c may be replaced in place (P5) */
    if (status(t, c) == ST_PARTIAL &&
        (rc = process(t, c, 0, changed)) < 0)
      return rc;
    c = nx;
  }
  for (int c = t->first[x]; c >= 0; c = t->next[c])
    if (status(t, c) == ST_PARTIAL) {
      if (np < 3) q[np] = c;
      np++;
    }
  if (t->kind[x] == CN__PQ_Q) {
    if (np > (is_root ? 2 : 1)) return CN_PQ_CONFLICT;
    return q_template(t, x, is_root, changed);
  }
  *changed = 1;
  return p_template(t, x, is_root, np, q[0], q[1]);
}

/* Pre-order of the live nodes into t->scr; returns how many. */
static int preorder(cn_pq *t) {
  int n = 0, top = 0;
  int *stack = t->nleaf; /* borrowed: recomputed by the caller afterwards */
  stack[top++] = t->root;
  while (top > 0) {
    int v = stack[--top];
    t->scr[n++] = v;
    for (int c = t->last[v]; c >= 0; c = t->prev[c]) stack[top++] = c;
  }
  return n;
}

/* Q-nodes with two children are P-nodes (same two orders); nodes with one
 * child are dropped. Keeps the tree proper, which enumerate relies on. */
static void normalize(cn_pq *t) {
  for (int v = t->n_leaves; v < t->n_slots; v++) {
    if (t->kind[v] == CN__PQ_FREE) continue;
    if (t->nch[v] == 2) t->kind[v] = CN__PQ_P;
    if (t->nch[v] == 1) {
      int c = t->first[v];
      unlink_node(t, c);
      replace_node(t, v, c);
      node_free(t, v);
    }
  }
}

/* Counts the set's leaves under every node (cnt, nleaf) and returns the
 * pertinent root: the deepest node holding all of them. *d gets the number
 * of distinct leaves; -1 when one is out of range. Writes only the scratch
 * fields, so it may run on the caller's tree. */
static int pertinent_root(cn_pq *t, const int *set, int k, int *d) {
  *d = 0;
  memset(t->cnt, 0, (size_t)t->n_slots * sizeof(int));
  for (int i = 0; i < k; i++) {
    if (set[i] < 0 || set[i] >= t->n_leaves) return -1;
    if (t->cnt[set[i]] == 0) (*d)++;
    t->cnt[set[i]] = 1;
  }
  int n = preorder(t);
  for (int i = n - 1; i >= 0; i--) {
    int v = t->scr[i];
    if (t->kind[v] == CN__PQ_LEAF) {
      t->nleaf[v] = 1;
      continue;
    }
    t->cnt[v] = t->nleaf[v] = 0;
    for (int c = t->first[v]; c >= 0; c = t->next[c]) {
      t->cnt[v] += t->cnt[c];
      t->nleaf[v] += t->nleaf[c];
    }
  }
  int r = t->root;
  for (int moved = 1; moved;) {
    moved = 0;
    for (int c = t->first[r]; c >= 0; c = t->next[c])
      if (t->cnt[c] == *d) {
        r = c;
        moved = 1;
        break;
      }
  }
  return r;
}

/* Whether the set is consecutive in every admitted order already: the
 * pertinent root is full, or a Q-node whose pertinent children are a run
 * of full ones (Q3 with nothing to splice). */
static int implied(const cn_pq *t, int r) {
  if (status(t, r) == ST_FULL) return 1;
  if (t->kind[r] != CN__PQ_Q) return 0;
  int left, right;
  return q_scan(t, r, 1, &left, &right) && left < 0 && right < 0;
}

/* REDUCE. The counts and the implied-already test run on t's scratch
 * fields; only a reduce that restructures pays for a clone, on which the
 * templates run (the clone carries the counts along) and which is swapped
 * in on success, so a failure leaves t as it was. */
int cn__pq_reduce(cn_pq *t, const int *set, int k, int *changed) {
  int d;
  *changed = 0;
  if (k <= 1) return 0;
  int r = pertinent_root(t, set, k, &d);
  if (r < 0) return CN_PQ_CONFLICT;
  if (d <= 1 || d == t->n_leaves || implied(t, r)) return 0;
  cn_pq *w = cn_pq_clone(t);
  if (w == NULL) return CN_E_NOMEM;
  int rc = process(w, r, 1, changed);
  if (rc == 0) { /* swap the result in; w takes the old contents away */
    normalize(w);
    cn_pq tmp = *t;
    *t = *w;
    *w = tmp;
  }
  cn_pq_free(w);
  return rc;
}

int cn_pq_reduce(cn_pq *t, const int *set, int k) {
  int changed;
  return cn__pq_reduce(t, set, k, &changed);
}

cn_pq *cn_pq_new(int n_leaves) {
  if (n_leaves < 1) return NULL;
  cn_pq *t = calloc(1, sizeof(*t));
  if (t == NULL) return NULL;
  t->n_leaves = n_leaves;
  t->cap = 2 * n_leaves + 8;
  t->buf = cn__xcalloc((size_t)FIELDS * t->cap, sizeof(int));
  if (t->buf == NULL) {
    free(t);
    return NULL;
  }
  bind(t);
  t->free_head = -1;
  t->n_slots = n_leaves;
  for (int i = 0; i < n_leaves; i++) {
    t->kind[i] = CN__PQ_LEAF;
    t->parent[i] = t->first[i] = t->last[i] = t->next[i] = t->prev[i] = -1;
  }
  if (n_leaves == 1) {
    t->root = 0;
    return t;
  }
  t->root = node_alloc(t, CN__PQ_P); /* cap > n_leaves: cannot fail */
  for (int i = 0; i < n_leaves; i++) append(t, t->root, i);
  return t;
}

void cn_pq_free(cn_pq *t) {
  if (t == NULL) return;
  free(t->buf);
  free(t);
}

cn_pq *cn_pq_clone(const cn_pq *t) {
  cn_pq *c = malloc(sizeof(*c));
  if (c == NULL) return NULL;
  *c = *t;
  c->buf = cn__xrealloc(NULL, (size_t)FIELDS * t->cap, sizeof(int));
  if (c->buf == NULL) {
    free(c);
    return NULL;
  }
  memcpy(c->buf, t->buf, (size_t)FIELDS * t->cap * sizeof(int));
  bind(c);
  return c;
}

int cn_pq_n_leaves(const cn_pq *t) { return t->n_leaves; }

/* The frontier: leaves left to right, by a walk along first-child,
 * next-sibling and parent links (no stack, no allocation). */
void cn_pq_frontier(const cn_pq *t, int *order) {
  int n = 0, v = t->root;
  for (;;) {
    while (t->first[v] >= 0) v = t->first[v];
    order[n++] = v;
    while (v != t->root && t->next[v] < 0) v = t->parent[v];
    if (v == t->root) return;
    v = t->next[v];
  }
}

/* ---- enumeration ------------------------------------------------------- */

typedef struct enum_state {
  const cn_pq *t;
  int *node_of; /* internal node -> index among internal nodes, else -1 */
  int *off;     /* index -> offset of its children in ch / perm */
  int *ch;      /* children ids, list order */
  int *perm;    /* current arrangement: child positions into ch */
  int *rev;     /* Q-nodes: reversed? */
  int *order;
  int n_out;
} enum_state;

static void enum_emit(enum_state *s, int v) {
  const cn_pq *t = s->t;
  if (t->kind[v] == CN__PQ_LEAF) {
    s->order[s->n_out++] = v;
    return;
  }
  int i = s->node_of[v], m = t->nch[v], o = s->off[i];
  for (int j = 0; j < m; j++) {
    int pj = t->kind[v] == CN__PQ_Q ? (s->rev[i] ? m - 1 - j : j)
                                    : s->perm[o + j];
    enum_emit(s, s->ch[o + pj]);
  }
}

/* Next permutation in lexicographic order; 0 when a wrapped to sorted. */
static int next_perm(int *a, int m) {
  int i = m - 2;
  while (i >= 0 && a[i] >= a[i + 1]) i--;
  if (i < 0) {
    for (int l = 0, r = m - 1; l < r; l++, r--) {
      int x = a[l]; a[l] = a[r]; a[r] = x;
    }
    return 0;
  }
  int j = m - 1;
  while (a[j] <= a[i]) j--;
  int x = a[i]; a[i] = a[j]; a[j] = x;
  for (int l = i + 1, r = m - 1; l < r; l++, r--) {
    x = a[l]; a[l] = a[r]; a[r] = x;
  }
  return 1;
}

/* An odometer over every internal node's arrangement: each P-node runs
 * through its permutations, each Q-node through its two directions. In a
 * proper tree distinct settings give distinct frontiers, so each admitted
 * order is produced once. */
long cn_pq_enumerate(const cn_pq *t, void (*fn)(const int *order, void *ctx),
                     void *ctx) {
  enum_state s = {.t = t};
  long count = 0;
  int n_int = 0, total = 0;
  int ns = t->n_slots;
  s.node_of = malloc((size_t)ns * sizeof(int));
  s.off = malloc((size_t)(ns + 1) * sizeof(int));
  s.rev = calloc((size_t)ns + 1, sizeof(int));
  s.ch = malloc((size_t)ns * sizeof(int));
  s.perm = malloc((size_t)ns * sizeof(int));
  s.order = malloc((size_t)t->n_leaves * sizeof(int));
  if (!s.node_of || !s.off || !s.rev || !s.ch || !s.perm || !s.order) {
    count = CN_E_NOMEM;
    goto out;
  }
  for (int v = 0; v < ns; v++) {
    s.node_of[v] = -1;
    if (t->kind[v] != CN__PQ_P && t->kind[v] != CN__PQ_Q) continue;
    s.node_of[v] = n_int;
    s.off[n_int++] = total;
    int j = 0;
    for (int c = t->first[v]; c >= 0; c = t->next[c], j++) {
      s.ch[total + j] = c;
      s.perm[total + j] = j;
    }
    total += j;
  }
  int *ids = malloc((size_t)(n_int + 1) * sizeof(int));
  if (ids == NULL) {
    count = CN_E_NOMEM;
    goto out;
  }
  for (int v = 0, i = 0; v < ns; v++)
    if (s.node_of[v] >= 0) ids[i++] = v;
  for (;;) {
    s.n_out = 0;
    enum_emit(&s, t->root);
    if (fn) fn(s.order, ctx);
    count++;
    int i = 0;
    for (; i < n_int; i++) { /* advance the odometer */
      int v = ids[i], m = t->nch[v];
      if (t->kind[v] == CN__PQ_Q) {
        s.rev[i] ^= 1;
        if (s.rev[i]) break;
      } else if (next_perm(s.perm + s.off[i], m)) {
        break;
      }
    }
    if (i == n_int) break;
  }
  free(ids);
out:
  free(s.node_of);
  free(s.off);
  free(s.rev);
  free(s.ch);
  free(s.perm);
  free(s.order);
  return count;
}

/* ---- formatting and accessors ------------------------------------------ */

static void put(char *buf, size_t cap, size_t *len, const char *s) {
  for (; *s; s++) {
    if (*len + 1 < cap) buf[*len] = *s;
    (*len)++;
  }
}

static void format_node(const cn_pq *t, int v, char *buf, size_t cap,
                        size_t *len) {
  char num[16];
  if (t->kind[v] == CN__PQ_LEAF) {
    snprintf(num, sizeof(num), "%d", v);
    put(buf, cap, len, num);
    return;
  }
  put(buf, cap, len, t->kind[v] == CN__PQ_P ? "P[" : "Q[");
  for (int c = t->first[v]; c >= 0; c = t->next[c]) {
    format_node(t, c, buf, cap, len);
    if (t->next[c] >= 0) put(buf, cap, len, " ");
  }
  put(buf, cap, len, "]");
}

void cn_pq_format(const cn_pq *t, char *buf, size_t cap) {
  size_t len = 0;
  if (cap == 0) return;
  format_node(t, t->root, buf, cap, &len);
  buf[len < cap ? len : cap - 1] = '\0';
}

int cn__pq_n_slots(const cn_pq *t) { return t->n_slots; }
int cn__pq_root(const cn_pq *t) { return t->root; }
int cn__pq_kind(const cn_pq *t, int v) { return t->kind[v]; }
int cn__pq_parent(const cn_pq *t, int v) { return t->parent[v]; }
int cn__pq_first(const cn_pq *t, int v) { return t->first[v]; }
int cn__pq_next(const cn_pq *t, int v) { return t->next[v]; }
int cn__pq_n_children(const cn_pq *t, int v) { return t->nch[v]; }
