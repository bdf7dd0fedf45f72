/* tree_parse.c - bracketed (Penn / SST) and JSON trees into cn_tree.
 *
 * Both parsers are iterative: the only stack is an array on the heap that
 * grows with the nesting depth (and never past lim->max_depth), so a
 * 100000-deep adversarial tree costs memory, not the C stack.
 *
 * Bracketed grammar (docs/api.md "Details that are part of the contract"), as
 * implemented here:
 *   - whitespace is ASCII space, \t, \n, \r; any is allowed before and after
 *     the one top-level tree; anything else outside it is bad_tree;
 *   - an atom is a maximal run of bytes that are neither whitespace nor '('
 *     nor ')'; bytes >= 0x80 (UTF-8) are atom bytes; other control bytes
 *     (0x00-0x1f, 0x7f) are rejected;
 *   - (X w)        two atoms: a leaf labelled X with word w;
 *   - (X c ...)    an atom followed by a bracket, or by >= 2 more items: an
 *                  internal node labelled X whose children are the items
 *                  after it; so (X a b) is X over two unlabelled leaves a, b
 *                  and (X (Y a) b c) is X over leaf Y:a and leaves b, c;
 *   - ((..) ...)   first item a bracket: an internal node with no label;
 *   - a bare word in a child position is an unlabelled leaf;
 *   - (w) and () are bad_tree.
 * Nodes are numbered in pre-order: a bracket gets its number when its '('
 * is read, a bare word where it appears. Words and labels point into a copy
 * of the input owned by the tree (one allocation).
 *
 * JSON form: {"word": "w"} is a leaf, {"children": [NODE, ...]} (non-empty)
 * an internal node; "label" (any node) and "type" ("a" or "b") are optional;
 * a member that is JSON null counts as absent; "word" and "label" must be
 * non-empty strings; a node with both "word" and "children" is an error;
 * unknown keys are ignored. Errors name the node (pre-order index) and its
 * path, e.g. "node 4 (at /children/1/children/1)". offset is -1.
 *
 * Limits (both forms): max_nodes counts every node, bare-word leaves
 * included; max_depth bounds node depth (root = 1, so a lone leaf has depth
 * 1); max_token_len bounds the bytes of every word and label. A limit <= 0
 * means "no limit"; lim == NULL means cn_limits_default(). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "input/tree_impl.h"

/* ---- shared helpers ---------------------------------------------------- */


void cn__tree_limits_resolve(const cn_limits *lim, cn__tree_limits *out) {
  cn_limits def;
  if (lim == NULL) {
    cn_limits_default(&def);
    lim = &def;
  }
  /* Node indices are int32; keep one spare so n + 1 never overflows. */
  out->max_nodes = lim->max_nodes > 0 ? lim->max_nodes : INT32_MAX - 1;
  out->max_depth = lim->max_depth > 0 ? lim->max_depth : INT32_MAX - 1;
  out->max_token_len = lim->max_token_len > 0 ? lim->max_token_len
                                              : INT32_MAX - 1;
}

/* Fills err (which may be NULL) with code, where and a message, and
 * returns code. Unlike cn_err_set it also records offset and node, the
 * two things a person needs to find the problem in their input. */
int cn__tree_fail(cn_err *err, int code, long long offset, int node,
                     const char *fmt, ...) {
  if (err == NULL) return code;
  va_list ap;
  err->code = code;
  err->offset = offset;
  err->node = node;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
  va_end(ap);
  return code;
}

/* Appends one node (parent, depth, offset; everything else empty) and
 * returns its index in *idx. The node array grows by doubling, so a tree
 * costs O(log n) allocations, not one per node. where is the byte offset
 * (bracketed) or -1 (JSON) used in the max_nodes message. */
int cn__tree_add_node(cn_tree *t, int32_t *cap, const cn__tree_limits *lim,
                         int32_t parent, int32_t depth, int64_t where,
                         int32_t *idx, cn_err *err) {
  int rc = 0;
  if (t->n_nodes >= lim->max_nodes) {
    if (where >= 0)
      rc = cn__tree_fail(err, CN_E_TOO_LARGE, where, t->n_nodes,
                     "the tree has more nodes than the limit of %d "
                     "(max-nodes); node %d starts at byte %lld",
                     (int)lim->max_nodes, (int)t->n_nodes,
                     (long long)where);
    else
      rc = cn__tree_fail(err, CN_E_TOO_LARGE, -1, t->n_nodes,
                     "the tree has more nodes than the limit of %d "
                     "(max-nodes); node %d is one too many",
                     (int)lim->max_nodes, (int)t->n_nodes);
    goto out;
  }
  if (t->n_nodes == *cap) {
    int32_t ncap = *cap < 32 ? 32 : (*cap > INT32_MAX / 2 ? INT32_MAX : *cap * 2);
    cn_tree_node *nn = cn__xrealloc(t->nodes, (size_t)ncap, sizeof(*nn));
    if (nn == NULL) {
      rc = cn__tree_fail(err, CN_E_NOMEM, where, -1,
                     "out of memory growing a tree to %d nodes", (int)ncap);
      goto out;
    }
    t->nodes = nn;
    *cap = ncap;
  }
  cn_tree_node *n = &t->nodes[t->n_nodes];
  memset(n, 0, sizeof(*n));
  n->parent = parent;
  n->depth = depth;
  n->offset = where;
  if (depth > t->height) t->height = depth;
  *idx = t->n_nodes++;
out:
  return rc;
}

/* Builds the children CSR (first_child / n_children / children) from the
 * parent links. Pre-order numbering finishes a node's children only after
 * their subtrees, so this is done once at the end: count, prefix-sum, then
 * place nodes in index order, which is each parent's children order. O(n). */
int cn__tree_link_children(cn_tree *t, cn_err *err) {
  return cn__tree_link_children_in(t, NULL, err);
}

int cn__tree_link_children_in(cn_tree *t, int32_t *cap, cn_err *err) {
  int rc = 0;
  int32_t n = t->n_nodes;
  if (cap == NULL) {
    t->children = cn__xcalloc(n > 1 ? (size_t)(n - 1) : 1, sizeof(int32_t));
  } else if (*cap < n) { /* a scratch tree's array, grown to the largest */
    int32_t *c = cn__xrealloc(t->children, (size_t)n, sizeof(int32_t));
    if (c != NULL) t->children = c, *cap = n;
    else free(t->children), t->children = NULL, *cap = 0;
  }
  if (t->children == NULL) {
    rc = cn__tree_fail(err, CN_E_NOMEM, -1, -1,
                   "out of memory linking a tree of %d nodes", (int)n);
    goto out;
  }
  for (int32_t i = 0; i < n; i++) t->nodes[i].n_children = 0;
  for (int32_t i = 1; i < n; i++) t->nodes[t->nodes[i].parent].n_children++;
  int32_t at = 0;
  for (int32_t i = 0; i < n; i++) {
    t->nodes[i].first_child = at;
    at += t->nodes[i].n_children;
    t->nodes[i].n_children = 0;
  }
  for (int32_t i = 1; i < n; i++) {
    cn_tree_node *p = &t->nodes[t->nodes[i].parent];
    t->children[p->first_child + p->n_children++] = i;
  }
out:
  return rc;
}

void cn_tree_free(cn_tree *t) {
  if (t == NULL) return;
  free(t->nodes);
  free(t->children);
  free(t->pool);
  memset(t, 0, sizeof(*t));
}

/* ---- bracketed form ---------------------------------------------------- */

/* The byte classes of the grammar (the file comment), one table look-up a
 * byte: whitespace, the two brackets, control bytes (0x00-0x1f but the
 * whitespace, and 0x7f), and atom bytes (everything else, UTF-8 included:
 * the zero the table is filled with from 0x80 on). */
enum { BC_ATOM = 0, BC_WS, BC_OPEN, BC_CLOSE, BC_CTRL };
static const uint8_t br_class[256] = {
    /* 0x00 */ 4, 4, 4, 4, 4, 4, 4, 4, 4, 1, 1, 4, 4, 1, 4, 4,
    /* 0x10 */ 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
    /* 0x20 */ 1, 0, 0, 0, 0, 0, 0, 0, 2, 3, 0, 0, 0, 0, 0, 0,
    /* 0x30 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* 0x40 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* 0x50 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* 0x60 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* 0x70 */ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4,
};

#define BR_CLASS(ch) br_class[(unsigned char)(ch)]

/* The bytes of w (8 bytes of the tree, first byte lowest) that end an
 * atom - whitespace and control bytes (all below 0x21), '(', ')' and
 * 0x7f - each marked by its high bit; bytes >= 0x80 are atom bytes and
 * never marked. Exact byte for byte (no carry crosses a byte: every sum
 * is of a 7-bit value and at most 0x7f), so the lowest mark is the end. */
static inline uint64_t br_atom_end8(uint64_t w) {
  const uint64_t ones = 0x0101010101010101ull, high = ones * 0x80;
  uint64_t h = w & ~high;
  uint64_t below = ~(h + ones * 0x5f);           /* h < 0x21          */
  uint64_t br = (h | ones) ^ (ones * 0x29);      /* 0 for '(' and ')' */
  uint64_t del = h ^ (ones * 0x7f);              /* 0 for 0x7f        */
  uint64_t m = below | ~(br + ones * 0x7f) | ~(del + ones * 0x7f);
  return m & ~w & high;
}

/* The end of the atom whose first byte is s[i]: 8 bytes a step while 8
 * remain, then byte by byte. */
static inline size_t br_atom_end(const char *s, size_t len, size_t i) {
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    uint64_t m = br_atom_end8(w);
    if (m != 0) return i + ((size_t)__builtin_ctzll(m) >> 3);
  }
  while (i < len && BR_CLASS(s[i]) == BC_ATOM) i++;
  return i;
}

/* How many of the n bytes at s to print so that at most max bytes are
 * shown and a UTF-8 sequence is never cut (messages end up in JSON, which
 * must be valid UTF-8). */
static size_t br_cut_utf8(const char *s, size_t n, size_t max) {
  if (n <= max) return n;
  while (max > 0 && ((unsigned char)s[max] & 0xc0) == 0x80) max--;
  return max;
}

/* Writes a byte for a message: 'x' when printable ASCII, else its hex. */
static const char *br_show_byte(unsigned char ch, char buf[8]) {
  if (ch > 0x20 && ch < 0x7f)
    snprintf(buf, 8, "'%c'", ch);
  else
    snprintf(buf, 8, "0x%02x", ch);
  return buf;
}

/* What an open bracket has seen so far. Its first one or two atoms stay
 * pending until the next item says whether they are a label, a word or
 * bare leaves. Only the innermost bracket can have pending atoms: an item
 * that opens a child settles its parent first, so every bracket below the
 * top is BR_OPEN and the stack holds node indices alone. */
enum {
  BR_EMPTY = 0, /* "("                                            */
  BR_ATOM1,     /* "(X"        X is a label or (w) is an error    */
  BR_ATOM2,     /* "(X w"      leaf X:w, or X over leaves w, ...  */
  BR_OPEN       /* an internal node: label settled, has a child   */
};

/* ---- the failures, out of line (the loop keeps its state in registers,
 * and none of these runs on a tree that parses) ---------------------- */

/* A node past lim->max_nodes: node n would start at byte where. */
static int br_fail_nodes(cn_err *err, int32_t max_nodes, int32_t n,
                         size_t where) {
  return cn__tree_fail(err, CN_E_TOO_LARGE, (long long)where, n,
                       "the tree has more nodes than the limit of %d "
                       "(max-nodes); node %d starts at byte %lld",
                       (int)max_nodes, (int)n, (long long)where);
}

/* A bracket (word false) or a bare word (word true) at byte off, at
 * depth past lim->max_depth; n is the node it would have been. */
static int br_fail_depth(cn_err *err, int32_t max_depth, int32_t n,
                         size_t off, int32_t depth, bool word) {
  if (word)
    return cn__tree_fail(err, CN_E_TOO_LARGE, (long long)off, n,
                         "the tree is deeper than the limit of %d levels "
                         "(max-depth): "
                         "the word at byte %zu is at depth %d",
                         (int)max_depth, off, (int)depth);
  return cn__tree_fail(err, CN_E_TOO_LARGE, (long long)off, n,
                       "the tree is deeper than the limit of %d levels "
                       "(max-depth): "
                       "the bracket at byte %zu is at depth %d",
                       (int)max_depth, off, (int)depth);
}

/* ')' closing a bracket of no item (state BR_EMPTY) or one atom
 * s[a1 .. a1 + a1_len): () and (w) are refused, each with its message. */
static int br_fail_close(cn_err *err, const char *s, const cn_tree_node *nd,
                         int32_t node, int state, size_t a1, int32_t a1_len) {
  long long off = (long long)nd[node].offset;
  if (state == BR_EMPTY)
    return cn__tree_fail(err, CN_E_BAD_TREE, off, node,
                         "empty brackets '()' at byte %lld (node %d): a node "
                         "is (LABEL word) or (LABEL child ...)",
                         off, (int)node);
  return cn__tree_fail(err, CN_E_BAD_TREE, off, node,
                       "brackets at byte %lld (node %d) hold only the word "
                       "'%.*s': a leaf is (LABEL word), and a bare word needs "
                       "no brackets",
                       off, (int)node, (int)br_cut_utf8(s + a1, a1_len, 40),
                       s + a1);
}

/* The node array doubled (at least 32) from *cap, as cn__tree_add_node
 * grows it. Out of line: it runs O(log n) times a tree, and never once
 * warm. */
static int br_grow(cn_tree *t, int32_t *cap, size_t where, cn_err *err) {
  int32_t ncap = *cap < 32 ? 32 : (*cap > INT32_MAX / 2 ? INT32_MAX
                                                        : *cap * 2);
  cn_tree_node *nn = cn__xrealloc(t->nodes, (size_t)ncap, sizeof(*nn));
  if (nn == NULL)
    return cn__tree_fail(err, CN_E_NOMEM, (long long)where, -1,
                         "out of memory growing a tree to %d nodes",
                         (int)ncap);
  t->nodes = nn;
  *cap = ncap;
  return 0;
}

/* The parser's stack of open brackets' nodes doubled (at least 64). */
static int br_grow_stack(int32_t **stack, int32_t *cap, size_t i,
                         int32_t depth, cn_err *err) {
  int32_t ncap = *cap < 64 ? 64 : *cap * 2;
  int32_t *ns = cn__xrealloc(*stack, (size_t)ncap, sizeof(*ns));
  if (ns == NULL)
    return cn__tree_fail(err, CN_E_NOMEM, (long long)i, -1,
                         "out of memory at nesting depth %d", (int)depth);
  *stack = ns;
  *cap = ncap;
  return 0;
}

/* The children arrays (pre-order CSR, as cn__tree_link_children_in makes
 * them) from the counts the parse kept, in one pass: a parent precedes its
 * children, so its first_child is set before the first of them is placed;
 * its n_children counts again from 0 as they are. */
static void br_link(cn_tree *t) {
  cn_tree_node *nd = t->nodes;
  int32_t *ch = t->children;
  int32_t n = t->n_nodes, at = nd[0].n_children;
  nd[0].first_child = 0;
  nd[0].n_children = 0;
  for (int32_t i = 1; i < n; i++) {
    cn_tree_node *p = &nd[nd[i].parent];
    ch[p->first_child + p->n_children++] = i;
    nd[i].first_child = at;
    at += nd[i].n_children;
    nd[i].n_children = 0;
  }
}

static int br_parse(const char *s, size_t len, const cn_limits *lim,
                    cn_tree *out, cn_tree_scratch *sc, char *pool,
                    cn_err *err);

/* Why: requests carry trees as Penn / SST strings; this turns one into the
 * pre-order cn_tree every tree family builds its vertices from, or says
 * exactly which byte is wrong. Promises: on success *out owns all its
 * memory; on failure *out is zeroed and err->offset names the byte. */
int cn_tree_parse_bracketed(const char *s, size_t len, const cn_limits *lim,
                            cn_tree *out, cn_err *err) {
  memset(out, 0, sizeof(*out));
  return br_parse(s, len, lim, out, NULL, NULL, err);
}

/* The same parse into a scratch tree whose arrays are reused from the
 * last call (grown, never shrunk): no allocation once they have grown to
 * the largest tree. On failure the scratch keeps its arrays and holds no
 * tree. */
int cn__tree_parse_bracketed_scratch(const char *s, size_t len,
                                     const cn_limits *lim, cn_tree_scratch *sc,
                                     cn_err *err) {
  sc->t.n_nodes = 0;
  sc->t.height = 0;
  return br_parse(s, len, lim, &sc->t, sc, NULL, err);
}

int cn__tree_parse_bracketed_into(const char *s, size_t len,
                                  const cn_limits *lim, cn_tree_scratch *sc,
                                  char *pool, cn_err *err) {
  sc->t.n_nodes = 0;
  sc->t.height = 0;
  return br_parse(s, len, lim, &sc->t, sc, pool, err);
}

void cn__tree_scratch_free(cn_tree_scratch *sc) {
  cn_tree_free(&sc->t);
  free(sc->stack);
  memset(sc, 0, sizeof(*sc));
}

/* Appends node n under par (-1: the root) at depth d, starting at byte
 * w, into idx: the max_nodes check, the array grown, the parent's child
 * counted. The loop's state lives in locals (a store through the node
 * array would otherwise make the compiler reload every field of a
 * context struct after it). */
#define BR_NODE(par, d, w, idx)                                         \
  do {                                                                     \
    if (n >= lm.max_nodes) {                                               \
      rc = br_fail_nodes(err, lm.max_nodes, n, (w));                       \
      goto out;                                                            \
    }                                                                      \
    if (n == cap) {                                                        \
      rc = br_grow(out, &cap, (w), err);                                   \
      if (rc) goto out;                                                    \
      nd = out->nodes;                                                     \
    }                                                                      \
    nd[n] = (cn_tree_node){.parent = (par), .depth = (d),               \
                           .offset = (int64_t)(w)};                        \
    if ((par) >= 0) nd[par].n_children++;                            \
    if ((d) > height) height = (d);                                        \
    (idx) = n++;                                                           \
  } while (0)

/* An unlabelled leaf for the bare word s[off .. off + wl) under the top
 * bracket (so at depth sp + 1). */
#define BR_BARE_LEAF(off, wl)                                              \
  do {                                                                     \
    int32_t d_ = sp + 1, x_;                                               \
    if (d_ > lm.max_depth) {                                               \
      rc = br_fail_depth(err, lm.max_depth, n, (off), d_, true);           \
      goto out;                                                            \
    }                                                                      \
    BR_NODE(top, d_, (off), x_);                                           \
    nd[x_].word = pool + (off);                                            \
    nd[x_].word_len = (wl);                                                \
  } while (0)

/* The top bracket gets one more item that is not a ')' (a bracket or an
 * atom after its pending ones): its pending atoms resolve. The first is
 * the label, a pending second one becomes a bare leaf, and the node is an
 * internal node from here on. */
#define BR_SETTLE()                                                        \
  do {                                                                     \
    if (state != BR_OPEN) {                                                \
      if (state != BR_EMPTY) {                                             \
        nd[top].label = pool + a1;                                         \
        nd[top].label_len = a1_len;                                        \
      }                                                                    \
      if (state == BR_ATOM2) {                                             \
        state = BR_OPEN;                                                   \
        BR_BARE_LEAF(a2, a2_len);                                          \
      }                                                                    \
      state = BR_OPEN;                                                     \
    }                                                                      \
  } while (0)

/* Why one function serves both: the grammar and every message stay in
 * one place. sc == NULL: out is fresh and owns what it gets (freed on
 * failure); else out is sc->t and every array comes from, and goes back
 * to, the scratch. pool (scratch only; NULL: the scratch's own) is where
 * the copy of s goes that words and labels point into: len bytes of the
 * caller's.
 *
 * One loop over the bytes, a table look-up each; an atom is scanned 8
 * bytes a step (br_atom_end). Nodes are written in place as their
 * bracket or word is read, each parent counting its children, so the
 * children arrays take one pass at the end (br_link). */
static int br_parse(const char *s, size_t len, const cn_limits *lim,
                    cn_tree *out, cn_tree_scratch *sc, char *pool,
                    cn_err *err) {
  int rc = 0;
  cn__tree_limits lm;
  int32_t cap = 0, scap = 0;
  int32_t *stk = NULL;
  if (sc != NULL) {
    cap = sc->node_cap;
    stk = sc->stack;
    scap = sc->stack_cap;
  }
  cn__tree_limits_resolve(lim, &lm);
  if (s == NULL && len > 0) {
    rc = cn__tree_fail(err, CN_E_INTERNAL, -1, -1, "no tree string given");
    goto out;
  }

  size_t i = 0;
  while (i < len && BR_CLASS(s[i]) == BC_WS) i++;
  if (i == len) {
    rc = cn__tree_fail(err, CN_E_BAD_TREE, (long long)i, -1,
                   "the tree is empty: expected '(' at byte %zu", i);
    goto out;
  }
  if (s[i] != '(') {
    char shown[8];
    rc = cn__tree_fail(err, CN_E_BAD_TREE, (long long)i, -1,
                   "a tree must start with '(': found %s at byte %zu",
                   br_show_byte((unsigned char)s[i], shown), i);
    goto out;
  }
  if (pool == NULL) {
    if (sc == NULL) {
      out->pool = malloc(len);
    } else if (sc->pool_cap < len) {
      char *p = realloc(out->pool, len);
      if (p != NULL) out->pool = p, sc->pool_cap = len;
      else free(out->pool), out->pool = NULL, sc->pool_cap = 0;
    }
    if (out->pool == NULL) {
      rc = cn__tree_fail(err, CN_E_NOMEM, -1, -1,
                     "out of memory copying a tree of %zu bytes", len);
      goto out;
    }
    pool = out->pool;
  }
  memcpy(pool, s, len);

  /* the top-level tree: until it closes, every byte is an item of the
   * top bracket; after it, only whitespace may follow. The innermost
   * bracket (node top, sp deep) and its pending atoms live in locals. */
  cn_tree_node *nd = out->nodes;
  int32_t n = 0, height = 0, sp = 0, top = -1;
  int state = BR_OPEN;
  size_t a1 = 0, a2 = 0;
  int32_t a1_len = 0, a2_len = 0;
  while (i < len) {
    unsigned char ch = (unsigned char)s[i];
    switch (BR_CLASS(ch)) {
    case BC_WS:
      i++;
      continue;
    case BC_ATOM: {
      size_t start = i;
      i = br_atom_end(s, len, i + 1);
      if (i - start > (size_t)lm.max_token_len) {
        rc = cn__tree_fail(err, CN_E_TOO_LARGE, (long long)start, -1,
                       "the word or label at byte %zu is %zu bytes long, "
                       "over the limit of %d (max-token-len)",
                       start, i - start, (int)lm.max_token_len);
        goto out;
      }
      int32_t alen = (int32_t)(i - start);
      if (state == BR_EMPTY) {
        a1 = start, a1_len = alen, state = BR_ATOM1;
      } else if (state == BR_ATOM1) {
        a2 = start, a2_len = alen, state = BR_ATOM2;
      } else {
        BR_SETTLE();
        BR_BARE_LEAF(start, alen);
      }
      continue;
    }
    case BC_OPEN: {
      /* a new node, numbered now (pre-order), one level deeper */
      if (sp > 0) BR_SETTLE();
      int32_t depth = sp + 1, idx;
      if (depth > lm.max_depth) {
        rc = br_fail_depth(err, lm.max_depth, n, i, depth, false);
        goto out;
      }
      BR_NODE(top, depth, i, idx);
      if (sp == scap) {
        rc = br_grow_stack(&stk, &scap, i, depth, err);
        if (rc) goto out;
      }
      stk[sp++] = idx;
      top = idx;
      state = BR_EMPTY;
      i++;
      continue;
    }
    case BC_CLOSE:
      /* a bracket of two atoms is the leaf X:w; () and (w) are refused */
      if (state == BR_ATOM2) {
        nd[top].label = pool + a1;
        nd[top].label_len = a1_len;
        nd[top].word = pool + a2;
        nd[top].word_len = a2_len;
      } else if (state != BR_OPEN) {
        rc = br_fail_close(err, s, nd, top, state, a1, a1_len);
        goto out;
      }
      i++;
      if (--sp == 0) goto closed;
      top = stk[sp - 1];
      state = BR_OPEN;
      continue;
    default:
      rc = cn__tree_fail(err, CN_E_BAD_TREE, (long long)i, -1,
                     "control byte 0x%02x at byte %zu is not allowed in a "
                     "tree", ch, i);
      goto out;
    }
  }
  rc = cn__tree_fail(err, CN_E_BAD_TREE, (long long)len, top,
                 "expected ')' at end of input (byte %zu): %d bracket%s "
                 "still open, the innermost opened at byte %lld",
                 len, (int)sp, sp == 1 ? "" : "s",
                 (long long)nd[top].offset);
  goto out;

closed:
  for (; i < len; i++) {
    unsigned char ch = (unsigned char)s[i];
    int k = BR_CLASS(ch);
    if (k == BC_WS) continue;
    if (k == BC_CTRL)
      rc = cn__tree_fail(err, CN_E_BAD_TREE, (long long)i, -1,
                     "control byte 0x%02x at byte %zu is not allowed in a "
                     "tree", ch, i);
    else if (ch == ')')
      rc = cn__tree_fail(err, CN_E_BAD_TREE, (long long)i, -1,
                     "unbalanced ')' at byte %zu: the tree already closed",
                     i);
    else
      rc = cn__tree_fail(err, CN_E_BAD_TREE, (long long)i, -1,
                     "text after the tree at byte %zu: a tree string holds "
                     "exactly one top-level (...)", i);
    goto out;
  }
  out->height = height;
  {
    if (sc == NULL) {
      out->children = cn__xcalloc(n > 1 ? (size_t)(n - 1) : 1,
                                  sizeof(int32_t));
    } else if (sc->child_cap < n) { /* grown to the largest tree */
      int32_t *ch = cn__xrealloc(out->children, (size_t)n, sizeof(int32_t));
      if (ch != NULL) out->children = ch, sc->child_cap = n;
      else free(out->children), out->children = NULL, sc->child_cap = 0;
    }
    if (out->children == NULL) {
      rc = cn__tree_fail(err, CN_E_NOMEM, -1, -1,
                     "out of memory linking a tree of %d nodes", (int)n);
      goto out;
    }
    out->n_nodes = n;
    br_link(out);
  }

out:
  if (sc == NULL) {
    free(stk);
    if (rc) cn_tree_free(out);
  } else {
    sc->node_cap = cap;
    sc->stack = stk;
    sc->stack_cap = scap;
    if (rc) out->n_nodes = 0;
  }
  return rc;
}
