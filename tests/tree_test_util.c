/* tree_test_util.c - see tree_test_util.h. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tree_test_util.h"


int str_is(const char *p, int32_t len, const char *want) {
  if (want == NULL) return p == NULL && len == 0;
  return p != NULL && (size_t)len == strlen(want) && memcmp(p, want, len) == 0;
}

cn_limits lim_default(void) {
  cn_limits l;
  cn_limits_default(&l);
  return l;
}

void parse_ok(const char *s, cn_tree *t) {
  cn_err e;
  cn_err_clear(&e);
  cn_limits l = lim_default();
  int rc = cn_tree_parse_bracketed(s, strlen(s), &l, t, &e);
  cr_assert_eq(rc, 0, "parse of %s failed: %d %s", s, rc, e.msg);
}

/* Checks node i: label, word, parent, depth and its children in order
 * (kids terminated by -1). */
void check_node(const cn_tree *t, int i, const char *label,
                       const char *word, int parent, int depth,
                       const int *kids) {
  cr_assert_lt(i, t->n_nodes);
  const cn_tree_node *n = &t->nodes[i];
  cr_assert(str_is(n->label, n->label_len, label), "node %d label %.*s != %s",
            i, n->label_len, n->label ? n->label : "(null)",
            label ? label : "(null)");
  cr_assert(str_is(n->word, n->word_len, word), "node %d word %.*s != %s", i,
            n->word_len, n->word ? n->word : "(null)", word ? word : "(null)");
  cr_assert_eq(n->parent, parent, "node %d parent %d != %d", i, n->parent,
               parent);
  cr_assert_eq(n->depth, depth, "node %d depth %d != %d", i, n->depth, depth);
  int k = 0;
  while (kids[k] >= 0) k++;
  cr_assert_eq(n->n_children, k, "node %d has %d children, want %d", i,
               n->n_children, k);
  for (int j = 0; j < k; j++)
    cr_assert_eq(t->children[n->first_child + j], kids[j],
                 "node %d child %d is %d, want %d", i, j,
                 t->children[n->first_child + j], kids[j]);
}

/* Structural invariants every parsed tree must have. */
void check_invariants(const cn_tree *t) {
  cr_assert_gt(t->n_nodes, 0);
  cr_assert_eq(t->nodes[0].parent, -1);
  cr_assert_eq(t->nodes[0].depth, 1);
  int h = 0;
  long long sum = 0;
  for (int i = 0; i < t->n_nodes; i++) {
    const cn_tree_node *n = &t->nodes[i];
    if (n->depth > h) h = n->depth;
    if (i > 0) {
      cr_assert_lt(n->parent, i, "pre-order: parent before child");
      cr_assert_eq(n->depth, t->nodes[n->parent].depth + 1);
    }
    cr_assert((n->word != NULL) == (n->n_children == 0),
              "node %d: a leaf has a word, an internal node none", i);
    sum += n->n_children;
    for (int j = 0; j < n->n_children; j++) {
      int c = t->children[n->first_child + j];
      cr_assert_eq(t->nodes[c].parent, i);
      if (j > 0) cr_assert_gt(c, t->children[n->first_child + j - 1]);
    }
    /* pre-order: a node's first child comes right after it */
    if (n->n_children > 0) cr_assert_eq(t->children[n->first_child], i + 1);
  }
  cr_assert_eq(sum, t->n_nodes - 1);
  cr_assert_eq(h, t->height);
}

void expect_err(const char *s, size_t len, const cn_limits *l,
                       int code, long long offset) {
  cn_err e;
  cn_err_clear(&e);
  cn_tree t;
  memset(&t, 0x5a, sizeof(t));
  int rc = cn_tree_parse_bracketed(s, len, l, &t, &e);
  cr_assert_eq(rc, code, "%.*s: rc %d (%s), want %d", (int)(len > 80 ? 80 : len),
               s, rc, e.msg, code);
  cr_assert_eq(e.code, code);
  cr_assert_eq(e.offset, offset, "%.*s: offset %lld, want %lld (%s)",
               (int)(len > 80 ? 80 : len), s, e.offset, offset, e.msg);
  cr_assert_neq(e.msg[0], '\0');
  char at[32];
  snprintf(at, sizeof(at), "byte %lld", offset);
  cr_assert(strstr(e.msg, at) != NULL, "message '%s' does not say '%s'",
            e.msg, at);
  cr_assert_null(t.nodes, "a failed parse leaves *out zeroed");
  cr_assert_null(t.children);
  cr_assert_null(t.pool);
  cr_assert_eq(t.n_nodes, 0);
  cn_tree_free(&t);
}


/* Writes t back in canonical bracketed form (single spaces). The parser's
 * output always has a canonical form that reparses to the same tree. */
void serialize(const cn_tree *t, int i, char **buf, size_t *len,
                      size_t *cap) {
  const cn_tree_node *n = &t->nodes[i];
  size_t need = *len + (size_t)n->label_len + (size_t)n->word_len + 8;
  if (need > *cap) {
    *cap = need * 2;
    *buf = realloc(*buf, *cap);
  }
  if (n->word != NULL && n->label == NULL) {
    memcpy(*buf + *len, n->word, n->word_len);
    *len += n->word_len;
    return;
  }
  (*buf)[(*len)++] = '(';
  if (n->label != NULL) {
    memcpy(*buf + *len, n->label, n->label_len);
    *len += n->label_len;
  }
  if (n->word != NULL) {
    (*buf)[(*len)++] = ' ';
    memcpy(*buf + *len, n->word, n->word_len);
    *len += n->word_len;
  }
  for (int j = 0; j < n->n_children; j++) {
    if (j > 0 || n->label != NULL) (*buf)[(*len)++] = ' ';
    serialize(t, t->children[n->first_child + j], buf, len, cap);
    if (*len + 4 > *cap) {
      *cap = *cap * 2;
      *buf = realloc(*buf, *cap);
    }
  }
  (*buf)[(*len)++] = ')';
}

char *to_string(const cn_tree *t) {
  size_t len = 0, cap = 64;
  char *buf = malloc(cap);
  serialize(t, 0, &buf, &len, &cap);
  buf = realloc(buf, len + 1);
  buf[len] = '\0';
  return buf;
}

/* The JSON NODE form of node i (what a client would send). */
json_t *to_json(const cn_tree *t, int i) {
  const cn_tree_node *n = &t->nodes[i];
  json_t *o = json_object();
  if (n->label)
    json_object_set_new(o, "label", json_stringn(n->label, n->label_len));
  if (n->word) {
    json_object_set_new(o, "word", json_stringn(n->word, n->word_len));
    return o;
  }
  json_t *a = json_array();
  for (int j = 0; j < n->n_children; j++)
    json_array_append_new(a, to_json(t, t->children[n->first_child + j]));
  json_object_set_new(o, "children", a);
  return o;
}

void check_same(const cn_tree *a, const cn_tree *b) {
  cr_assert_eq(a->n_nodes, b->n_nodes);
  cr_assert_eq(a->height, b->height);
  for (int i = 0; i < a->n_nodes; i++) {
    const cn_tree_node *x = &a->nodes[i], *y = &b->nodes[i];
    cr_assert_eq(x->parent, y->parent);
    cr_assert_eq(x->depth, y->depth);
    cr_assert_eq(x->n_children, y->n_children);
    cr_assert_eq(x->first_child, y->first_child);
    cr_assert_eq(x->word_len, y->word_len);
    cr_assert_eq(x->label_len, y->label_len);
    cr_assert_eq(x->word == NULL, y->word == NULL);
    cr_assert_eq(x->label == NULL, y->label == NULL);
    if (x->word) cr_assert(memcmp(x->word, y->word, x->word_len) == 0);
    if (x->label) cr_assert(memcmp(x->label, y->label, x->label_len) == 0);
  }
  if (a->n_nodes > 1)
    cr_assert(memcmp(a->children, b->children,
                     sizeof(int32_t) * (a->n_nodes - 1)) == 0);
}

