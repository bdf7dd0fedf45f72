/* tree_parse.c - bracketed (Penn / SST) and JSON trees into cn_tree.
 *
 * Both parsers are iterative: the only stack is an array on the heap (the
 * bracketed parser's sized once for the deepest the string can nest, never
 * past lim->max_depth; the JSON one's grown with the depth), so a
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

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ /* the first byte lowest */
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    uint64_t m = br_atom_end8(w);
    if (m != 0) return i + ((size_t)__builtin_ctzll(m) >> 3);
  }
#endif
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

/* ')' closing a bracket of no item (state BR_EMPTY) or of the one atom
 * a1[0 .. a1_len): () and (w) are refused, each with its message. */
static int br_fail_close(cn_err *err, const cn_tree_node *nd, int32_t node,
                         int state, const char *a1, int32_t a1_len) {
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
                       off, (int)node, (int)br_cut_utf8(a1, a1_len, 40), a1);
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

/* The parser's stack of open brackets' nodes sized for the deepest the
 * tree can be: max_depth brackets, and never more than it has bytes. */
static int br_size_stack(int32_t **stack, int32_t *cap, size_t len,
                         int32_t max_depth, cn_err *err) {
  int32_t need = len < (size_t)max_depth ? (int32_t)len + 1 : max_depth + 1;
  if (need <= *cap) return 0;
  int32_t *ns = cn__xrealloc(*stack, (size_t)need, sizeof(*ns));
  if (ns == NULL)
    return cn__tree_fail(err, CN_E_NOMEM, -1, -1,
                         "out of memory for a tree %d brackets deep",
                         (int)need);
  *stack = ns;
  *cap = need;
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
                    cn_tree *out, cn_tree_scratch *sc, bool view, cn_err *err);

/* Why: requests carry trees as Penn / SST strings; this turns one into the
 * pre-order cn_tree every tree family builds its vertices from, or says
 * exactly which byte is wrong. Promises: on success *out owns all its
 * memory; on failure *out is zeroed and err->offset names the byte. */
int cn_tree_parse_bracketed(const char *s, size_t len, const cn_limits *lim,
                            cn_tree *out, cn_err *err) {
  memset(out, 0, sizeof(*out));
  return br_parse(s, len, lim, out, NULL, false, err);
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
  return br_parse(s, len, lim, &sc->t, sc, false, err);
}

int cn__tree_parse_bracketed_view(const char *s, size_t len,
                                  const cn_limits *lim, cn_tree_scratch *sc,
                                  cn_err *err) {
  sc->t.n_nodes = 0;
  sc->t.height = 0;
  return br_parse(s, len, lim, &sc->t, sc, true, err);
}

void cn__tree_scratch_free(cn_tree_scratch *sc) {
  cn_tree_free(&sc->t);
  free(sc->stack);
  memset(sc, 0, sizeof(*sc));
}

/* The 64 bytes at b classified for the parse loop: *stop marks every
 * byte that is not an atom byte (whitespace, brackets, control bytes),
 * *ws the whitespace among them; bit k is byte k. SSE2 (every x86-64)
 * does 16 bytes an instruction; elsewhere the byte table does it. */
static inline void br_classify64(const char *b, uint64_t *stop,
                                 uint64_t *ws) {
#if defined(__SSE2__)
  uint64_t st = 0, w = 0;
  const __m128i open = _mm_set1_epi8('('), close = _mm_set1_epi8(')');
  const __m128i space = _mm_set1_epi8(' '), del = _mm_set1_epi8(0x7f);
  const __m128i tab = _mm_set1_epi8('\t'), nl = _mm_set1_epi8('\n');
  const __m128i cr = _mm_set1_epi8('\r');
  for (int k = 0; k < 4; k++) {
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(b + 16 * k));
    /* x <= 0x20 (unsigned): whitespace and control bytes */
    __m128i low = _mm_cmpeq_epi8(_mm_min_epu8(x, space), x);
    __m128i s = _mm_or_si128(
        _mm_or_si128(low, _mm_cmpeq_epi8(x, del)),
        _mm_or_si128(_mm_cmpeq_epi8(x, open), _mm_cmpeq_epi8(x, close)));
    __m128i sp = _mm_or_si128(
        _mm_or_si128(_mm_cmpeq_epi8(x, space), _mm_cmpeq_epi8(x, tab)),
        _mm_or_si128(_mm_cmpeq_epi8(x, nl), _mm_cmpeq_epi8(x, cr)));
    st |= (uint64_t)(uint16_t)_mm_movemask_epi8(s) << (16 * k);
    w |= (uint64_t)(uint16_t)_mm_movemask_epi8(sp) << (16 * k);
  }
  *stop = st;
  *ws = w;
#else
  uint64_t st = 0, w = 0;
  for (int k = 0; k < 64; k++) {
    int c = BR_CLASS(b[k]);
    st |= (uint64_t)(c != BC_ATOM) << k;
    w |= (uint64_t)(c == BC_WS) << k;
  }
  *stop = st;
  *ws = w;
#endif
}

/* Appends node n under par (-1: the root) at depth d, starting at byte
 * w, into idx: the max_nodes check and the array grown (one compare
 * against nlim, the lower of the two, while neither is near), the
 * parent's child counted. The loop's state lives in locals (a store
 * through the node array would otherwise make the compiler reload every
 * field of a context struct after it). */
#define BR_NODE(par, d, w, idx)                                            \
  do {                                                                     \
    if (n >= nlim) {                                                       \
      if (n >= lm.max_nodes) {                                             \
        rc = br_fail_nodes(err, lm.max_nodes, n, (w));                     \
        goto out;                                                          \
      }                                                                    \
      rc = br_grow(out, &cap, (w), err);                                   \
      if (rc) goto out;                                                    \
      nd = out->nodes;                                                     \
      nlim = cap < lm.max_nodes ? cap : lm.max_nodes;                      \
    }                                                                      \
    nd[n] = (cn_tree_node){.parent = (par), .depth = (d),                  \
                           .offset = (int64_t)(w)};                        \
    if ((par) >= 0) nd[par].n_children++;                                  \
    if ((d) > height) height = (d);                                        \
    (idx) = n++;                                                           \
  } while (0)

/* An unlabelled leaf for the bare word at byte off, wl bytes, under the
 * top bracket (so at depth sp + 1). */
#define BR_BARE_LEAF(off, wl)                                              \
  do {                                                                     \
    int32_t x_;                                                            \
    if (sp >= lm.max_depth) {                                              \
      rc = br_fail_depth(err, lm.max_depth, n, (off), sp + 1, true);       \
      goto out;                                                            \
    }                                                                      \
    BR_NODE(top, sp + 1, (off), x_);                                       \
    nd[x_].word = pool + (off);                                            \
    nd[x_].word_len = (wl);                                                \
  } while (0)

/* The top bracket gets one more item that is not a ')' (a bracket or an
 * atom after its pending ones): its pending atoms resolve. The first,
 * already its label, stays; a pending second one, held as its word,
 * becomes a bare leaf; the node is an internal node from here on. */
#define BR_SETTLE()                                                        \
  do {                                                                     \
    if (state == BR_ATOM2) {                                               \
      size_t o_ = (size_t)(nd[top].word - pool);                           \
      int32_t l_ = nd[top].word_len;                                       \
      nd[top].word = NULL;                                                 \
      nd[top].word_len = 0;                                                \
      state = BR_OPEN;                                                     \
      BR_BARE_LEAF(o_, l_);                                                \
    }                                                                      \
    state = BR_OPEN;                                                       \
  } while (0)

/* Why one function serves both: the grammar and every message stay in
 * one place. sc == NULL: out is fresh and owns what it gets (freed on
 * failure); else out is sc->t and every array comes from, and goes back
 * to, the scratch. Words and labels point into a copy of s (the tree's
 * pool) or, with view (scratch only), into s itself.
 *
 * One loop over the bytes, a table look-up each; an atom is scanned 8
 * bytes a step (br_atom_end). Nodes are written in place as their
 * bracket or word is read, each parent counting its children, so the
 * children arrays take one pass at the end (br_link). */
static int br_parse(const char *s, size_t len, const cn_limits *lim,
                    cn_tree *out, cn_tree_scratch *sc, bool view,
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
  const char *pool = s; /* where the words point */
  if (!view) {
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
    memcpy(out->pool, s, len);
    pool = out->pool;
  }

  rc = br_size_stack(&stk, &scap, len, lm.max_depth, err);
  if (rc) goto out;

  /* the top-level tree: until it closes, every byte is an item of the
   * top bracket; after it, only whitespace may follow. The innermost
   * bracket (node top, sp deep) and its state live in locals; its
   * pending atoms are written into its node as they come (the first as
   * its label, the second as its word) and moved if they turn out to be
   * something else (BR_SETTLE). */
  cn_tree_node *nd = out->nodes;
  int32_t n = 0, height = 0, sp = 0, top = -1;
  int32_t nlim = cap < lm.max_nodes ? cap : lm.max_nodes;
  int state = BR_OPEN;
  /* 64 bytes a step (br_classify64): the events - brackets, control
   * bytes and the first byte of each atom - are its bits, taken lowest
   * first, so whitespace and the inside of atoms cost nothing. A step
   * starts where no atom is under way (an atom running past the block
   * is scanned to its end, and the next step starts there). The last
   * bytes are classified from a copy padded with spaces. */
  while (i < len) {
    const char *b = s + i;
    char tail[64];
    if (len - i < 64) {
      memset(tail, ' ', sizeof(tail));
      memcpy(tail, b, len - i);
      b = tail;
    }
    uint64_t stop, ws;
    br_classify64(b, &stop, &ws);
    uint64_t atom = ~stop;
    uint64_t ev = (stop & ~ws) | (atom & ~(atom << 1));
    for (; ev != 0; ev &= ev - 1) {
      unsigned k = (unsigned)__builtin_ctzll(ev);
      size_t at = i + k;
      unsigned char ch = (unsigned char)b[k];
      if (ch == '(') {
        /* a new node, numbered now (pre-order), one level deeper */
        if (sp > 0) BR_SETTLE();
        int32_t idx;
        if (sp >= lm.max_depth) {
          rc = br_fail_depth(err, lm.max_depth, n, at, sp + 1, false);
          goto out;
        }
        BR_NODE(top, sp + 1, at, idx);
        stk[sp++] = idx;
        top = idx;
        state = BR_EMPTY;
      } else if (ch == ')') {
        /* a bracket of two atoms is the leaf X:w (its label and word
         * are in place); () and (w) are refused */
        if (state < BR_ATOM2) {
          rc = br_fail_close(err, nd, top, state, nd[top].label,
                             nd[top].label_len);
          goto out;
        }
        if (--sp == 0) {
          i = at + 1;
          goto closed;
        }
        top = stk[sp - 1];
        state = BR_OPEN;
      } else if ((stop >> k) & 1) { /* a control byte */
        rc = cn__tree_fail(err, CN_E_BAD_TREE, (long long)at, -1,
                       "control byte 0x%02x at byte %zu is not allowed in a "
                       "tree", ch, at);
        goto out;
      } else { /* an atom */
        uint64_t after = stop & (~0ull << k);
        size_t end = after != 0 ? i + (size_t)__builtin_ctzll(after)
                                : br_atom_end(s, len, i + 64);
        if (end - at > (size_t)lm.max_token_len) {
          rc = cn__tree_fail(err, CN_E_TOO_LARGE, (long long)at, -1,
                         "the word or label at byte %zu is %zu bytes long, "
                         "over the limit of %d (max-token-len)",
                         at, end - at, (int)lm.max_token_len);
          goto out;
        }
        int32_t alen = (int32_t)(end - at);
        if (state == BR_EMPTY) {
          nd[top].label = pool + at;
          nd[top].label_len = alen;
          state = BR_ATOM1;
        } else if (state == BR_ATOM1) {
          nd[top].word = pool + at;
          nd[top].word_len = alen;
          state = BR_ATOM2;
        } else {
          BR_SETTLE();
          BR_BARE_LEAF(at, alen);
        }
        if (after == 0) { /* the atom ran past the block */
          i = end;
          goto next;
        }
      }
    }
    i += 64;
  next:;
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
