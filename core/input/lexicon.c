/* lexicon.c - finding the lexicon's words in a character lattice.
 *
 * A request for a lattice model may send raw characters and no word spans
 * (docs/api.md); the spans are then every [b, e), e - b >= 2, whose joined
 * characters are a lexicon word. The lexicon becomes a byte trie once, at
 * model load; matching walks the trie from each start position and stops
 * as soon as no word continues, so the work is O(n · longest word) —
 * linear in the input for a fixed lexicon.
 *
 * Trie layout: nodes in one array; the root's children are a table by
 * byte (top), every other node's a sibling list (first_child, next),
 * most recently used first: a child found while inserting moves to the
 * front, so the prefixes a word list repeats most are found first, and
 * the load (~19k words) takes a third fewer instructions than with new
 * children in front only. Lexicons are small (tens of thousands of
 * words), so a sibling scan beats a hash here; matching does not depend
 * on the siblings' order.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "input/input.h"


typedef struct trie_node {
  int32_t first_child, next;
  uint8_t byte;
  uint8_t word; /* a word ends here */
} trie_node;

struct cn_lexicon {
  trie_node *nodes;
  int32_t n, cap;
  int32_t top[256]; /* the root's children by byte, -1 for none */
};

static int32_t new_node(cn_lexicon *lx, uint8_t byte) {
  if (lx->n == lx->cap) {
    int32_t c = lx->cap ? lx->cap * 2 : 1024;
    trie_node *p = cn__xrealloc(lx->nodes, (size_t)c, sizeof(*p));
    if (p == NULL) return -1;
    lx->nodes = p;
    lx->cap = c;
  }
  trie_node *t = &lx->nodes[lx->n];
  t->first_child = t->next = -1;
  t->byte = byte;
  t->word = 0;
  return lx->n++;
}

static int32_t child(const cn_lexicon *lx, int32_t at, uint8_t b) {
  if (at == 0) return lx->top[b];
  for (int32_t c = lx->nodes[at].first_child; c >= 0; c = lx->nodes[c].next)
    if (lx->nodes[c].byte == b) return c;
  return -1;
}

static int insert(cn_lexicon *lx, const char *w, size_t len) {
  int32_t at = 0;
  for (size_t i = 0; i < len; i++) {
    uint8_t b = (uint8_t)w[i];
    if (at == 0) {
      if (lx->top[b] < 0 && (lx->top[b] = new_node(lx, b)) < 0)
        return CN_E_NOMEM;
      at = lx->top[b];
      continue;
    }
    trie_node *n = lx->nodes;
    int32_t prev = -1, c = n[at].first_child;
    while (c >= 0 && n[c].byte != b) {
      prev = c;
      c = n[c].next;
    }
    if (c < 0) {
      c = new_node(lx, b);
      if (c < 0) return CN_E_NOMEM;
      lx->nodes[c].next = lx->nodes[at].first_child;
      lx->nodes[at].first_child = c;
    } else if (prev >= 0) { /* to the front: prefixes in use stay near */
      n[prev].next = n[c].next;
      n[c].next = n[at].first_child;
      n[at].first_child = c;
    }
    at = c;
  }
  lx->nodes[at].word = 1;
  return 0;
}

static cn_lexicon *lexicon_new(void) {
  cn_lexicon *lx = calloc(1, sizeof(*lx));
  if (lx != NULL) memset(lx->top, 0xff, sizeof(lx->top)); /* all -1 */
  if (lx == NULL || new_node(lx, 0) < 0) {
    cn_lexicon_free(lx);
    return NULL;
  }
  return lx;
}

int cn_lexicon_from_list(const char *const *words, int n, cn_lexicon **out) {
  cn_lexicon *lx = lexicon_new();
  if (lx == NULL) return CN_E_NOMEM;
  for (int i = 0; i < n; i++)
    if (insert(lx, words[i], strlen(words[i])) != 0) {
      cn_lexicon_free(lx);
      return CN_E_NOMEM;
    }
  *out = lx;
  return 0;
}

int cn_lexicon_load(const char *path, cn_lexicon **out, cn_err *err) {
  return cn_lexicon_load_at(AT_FDCWD, path, path, out, err);
}

int cn_lexicon_load_at(int dirfd, const char *rel, const char *path,
                       cn_lexicon **out, cn_err *err) {
  char *buf = NULL;
  size_t len = 0;
  cn_lexicon *lx = NULL;
  /* the whole file in one read, split at each '\n' below: a line's
   * trailing '\r's are dropped and empty lines skipped */
  int rc = cn__read_regular_at(dirfd, rel, path, CN__MAX_LEXICON_BYTES, 0,
                               &buf, &len, err);
  if (rc != 0) return rc;
  lx = lexicon_new();
  if (lx == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "%s: no memory for the lexicon", path);
    goto out;
  }
  for (size_t at = 0; at < len;) {
    const char *nl = memchr(buf + at, '\n', len - at);
    size_t end = nl != NULL ? (size_t)(nl - buf) : len, next = end + 1;
    while (end > at && buf[end - 1] == '\r') end--;
    if (end > at && insert(lx, buf + at, end - at) != 0) {
      rc = cn_err_set(err, CN_E_NOMEM, "%s: no memory for the lexicon", path);
      goto out;
    }
    at = next;
  }
out:
  free(buf);
  if (rc != 0) {
    cn_lexicon_free(lx);
    return rc;
  }
  *out = lx;
  return 0;
}

void cn_lexicon_free(cn_lexicon *lx) {
  if (lx == NULL) return;
  free(lx->nodes);
  free(lx);
}

int cn_lexicon_match(const cn_lexicon *lx, const char *const *chars,
                     const int32_t *len, int32_t n, bool lowercase,
                     int (*emit)(void *ctx, int32_t b, int32_t e), void *ctx) {
  for (int32_t b = 0; b < n; b++) {
    int32_t at = 0;
    for (int32_t e = b; e < n && at >= 0; e++) {
      for (int32_t k = 0; k < len[e] && at >= 0; k++) {
        uint8_t c = (uint8_t)chars[e][k];
        if (lowercase && c >= 'A' && c <= 'Z') c = (uint8_t)(c - 'A' + 'a');
        at = child(lx, at, c);
      }
      if (at >= 0 && e + 1 - b >= 2 && lx->nodes[at].word) {
        int rc = emit(ctx, b, e + 1);
        if (rc != 0) return rc;
      }
    }
  }
  return 0;
}
