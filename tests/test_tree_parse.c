/* test_tree_parse.c - the bracketed and JSON tree parsers (core/tree_parse.c)
 * against API.md's examples, the 800 real trees of shared/data (checked
 * against the numbers its README states), every error path with its byte
 * offset or node index, the limits, and adversarial depth. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- helpers ----------------------------------------------------------- */

static int str_is(const char *p, int32_t len, const char *want) {
  if (want == NULL) return p == NULL && len == 0;
  return p != NULL && (size_t)len == strlen(want) && memcmp(p, want, len) == 0;
}

static cn_limits lim_default(void) {
  cn_limits l;
  cn_limits_default(&l);
  return l;
}

static void parse_ok(const char *s, cn_tree *t) {
  cn_err e;
  cn_err_clear(&e);
  cn_limits l = lim_default();
  int rc = cn_tree_parse_bracketed(s, strlen(s), &l, t, &e);
  cr_assert_eq(rc, 0, "parse of %s failed: %d %s", s, rc, e.msg);
}

/* Checks node i: label, word, parent, depth and its children in order
 * (kids terminated by -1). */
static void check_node(const cn_tree *t, int i, const char *label,
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
static void check_invariants(const cn_tree *t) {
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

static void expect_err(const char *s, size_t len, const cn_limits *l,
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

#define ERR(s, code, off) expect_err(s, strlen(s), NULL, code, off)

/* Writes t back in canonical bracketed form (single spaces). The parser's
 * output always has a canonical form that reparses to the same tree. */
static void serialize(const cn_tree *t, int i, char **buf, size_t *len,
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

static char *to_string(const cn_tree *t) {
  size_t len = 0, cap = 64;
  char *buf = malloc(cap);
  serialize(t, 0, &buf, &len, &cap);
  buf = realloc(buf, len + 1);
  buf[len] = '\0';
  return buf;
}

/* The JSON NODE form of node i (what a client would send). */
static json_t *to_json(const cn_tree *t, int i) {
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

static void check_same(const cn_tree *a, const cn_tree *b) {
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

/* ---- bracketed: API.md examples and grammar decisions ------------------ */

Test(bracketed, api_example_sst) {
  cn_tree t;
  parse_ok("(3 (2 It) (4 (2 's) (2 fine)))", &t);
  cr_assert_eq(t.n_nodes, 5);
  cr_assert_eq(t.height, 3);
  check_node(&t, 0, "3", NULL, -1, 1, (int[]){1, 2, -1});
  check_node(&t, 1, "2", "It", 0, 2, (int[]){-1});
  check_node(&t, 2, "4", NULL, 0, 2, (int[]){3, 4, -1});
  check_node(&t, 3, "2", "'s", 2, 3, (int[]){-1});
  check_node(&t, 4, "2", "fine", 2, 3, (int[]){-1});
  int64_t offs[] = {0, 3, 10, 13, 20};
  for (int i = 0; i < 5; i++) {
    cr_assert_eq(t.nodes[i].offset, offs[i], "node %d offset", i);
    cr_assert_eq(t.nodes[i].type, 0);
  }
  check_invariants(&t);
  cn_tree_free(&t);
}

Test(bracketed, api_bare_word_is_unlabelled_leaf) {
  cn_tree t;
  parse_ok("(NP the (NN film))", &t);
  cr_assert_eq(t.n_nodes, 3);
  check_node(&t, 0, "NP", NULL, -1, 1, (int[]){1, 2, -1});
  check_node(&t, 1, NULL, "the", 0, 2, (int[]){-1});
  check_node(&t, 2, "NN", "film", 0, 2, (int[]){-1});
  cr_assert_eq(t.nodes[1].offset, 4);
  cr_assert_eq(t.nodes[2].offset, 8);
  check_invariants(&t);
  cn_tree_free(&t);
}

Test(bracketed, api_escaped_quote_word) {
  /* The JSON string "(PU \")" decodes to (PU "): the word is a quote. */
  json_error_t je;
  json_t *j = json_loads("{\"tree\": \"(S (PU \\\") (N hi))\"}", 0, &je);
  cr_assert_not_null(j);
  const json_t *s = json_object_get(j, "tree");
  cn_tree t;
  cn_err e;
  int rc = cn_tree_parse_bracketed(json_string_value(s), json_string_length(s),
                                   NULL, &t, &e);
  cr_assert_eq(rc, 0, "%s", e.msg);
  check_node(&t, 1, "PU", "\"", 0, 2, (int[]){-1});
  check_node(&t, 2, "N", "hi", 0, 2, (int[]){-1});
  cn_tree_free(&t);
  json_decref(j);
}

Test(bracketed, leaf_alone_is_a_tree) {
  cn_tree t;
  parse_ok("(X w)", &t);
  cr_assert_eq(t.n_nodes, 1);
  cr_assert_eq(t.height, 1);
  check_node(&t, 0, "X", "w", -1, 1, (int[]){-1});
  cn_tree_free(&t);
}

Test(bracketed, three_atoms_label_and_two_leaves) {
  cn_tree t;
  parse_ok("(X a b)", &t);
  cr_assert_eq(t.n_nodes, 3);
  check_node(&t, 0, "X", NULL, -1, 1, (int[]){1, 2, -1});
  check_node(&t, 1, NULL, "a", 0, 2, (int[]){-1});
  check_node(&t, 2, NULL, "b", 0, 2, (int[]){-1});
  cn_tree_free(&t);
  parse_ok("(a b c d)", &t);
  check_node(&t, 0, "a", NULL, -1, 1, (int[]){1, 2, 3, -1});
  check_node(&t, 3, NULL, "d", 0, 2, (int[]){-1});
  cn_tree_free(&t);
}

Test(bracketed, bracket_then_bare_words) {
  cn_tree t;
  parse_ok("(X (Y a) b c)", &t);
  cr_assert_eq(t.n_nodes, 4);
  check_node(&t, 0, "X", NULL, -1, 1, (int[]){1, 2, 3, -1});
  check_node(&t, 1, "Y", "a", 0, 2, (int[]){-1});
  check_node(&t, 2, NULL, "b", 0, 2, (int[]){-1});
  check_node(&t, 3, NULL, "c", 0, 2, (int[]){-1});
  check_invariants(&t);
  cn_tree_free(&t);
}

Test(bracketed, pending_second_atom_numbered_before_next_bracket) {
  cn_tree t;
  parse_ok("(X w (Y z) v)", &t);
  cr_assert_eq(t.n_nodes, 4);
  check_node(&t, 0, "X", NULL, -1, 1, (int[]){1, 2, 3, -1});
  check_node(&t, 1, NULL, "w", 0, 2, (int[]){-1});
  check_node(&t, 2, "Y", "z", 0, 2, (int[]){-1});
  check_node(&t, 3, NULL, "v", 0, 2, (int[]){-1});
  cr_assert_eq(t.nodes[1].offset, 3);
  cr_assert_eq(t.nodes[2].offset, 5);
  cr_assert_eq(t.nodes[3].offset, 11);
  cn_tree_free(&t);
}

Test(bracketed, unlabelled_brackets) {
  cn_tree t;
  parse_ok("((A a) (B b))", &t);
  check_node(&t, 0, NULL, NULL, -1, 1, (int[]){1, 2, -1});
  check_node(&t, 1, "A", "a", 0, 2, (int[]){-1});
  cn_tree_free(&t);
  parse_ok("((A a))", &t);
  cr_assert_eq(t.n_nodes, 2);
  check_node(&t, 0, NULL, NULL, -1, 1, (int[]){1, -1});
  cn_tree_free(&t);
  parse_ok("((A a) b)", &t);
  check_node(&t, 0, NULL, NULL, -1, 1, (int[]){1, 2, -1});
  check_node(&t, 2, NULL, "b", 0, 2, (int[]){-1});
  cn_tree_free(&t);
}

Test(bracketed, preorder_and_children_order) {
  cn_tree t;
  parse_ok("(A (B (C c) d) (E e) (F (G (H h)) i))", &t);
  cr_assert_eq(t.n_nodes, 9);
  cr_assert_eq(t.height, 4);
  check_node(&t, 0, "A", NULL, -1, 1, (int[]){1, 4, 5, -1});
  check_node(&t, 1, "B", NULL, 0, 2, (int[]){2, 3, -1});
  check_node(&t, 2, "C", "c", 1, 3, (int[]){-1});
  check_node(&t, 3, NULL, "d", 1, 3, (int[]){-1});
  check_node(&t, 4, "E", "e", 0, 2, (int[]){-1});
  check_node(&t, 5, "F", NULL, 0, 2, (int[]){6, 8, -1});
  check_node(&t, 6, "G", NULL, 5, 3, (int[]){7, -1});
  check_node(&t, 7, "H", "h", 6, 4, (int[]){-1});
  check_node(&t, 8, NULL, "i", 5, 3, (int[]){-1});
  check_invariants(&t);
  cn_tree_free(&t);
}

Test(bracketed, whitespace_and_utf8) {
  cn_tree t;
  parse_ok(" \t\n(A\t(N caf\xc3\xa9)\r\n(B  b) )\r\n ", &t);
  cr_assert_eq(t.n_nodes, 3);
  cr_assert_eq(t.nodes[0].offset, 3);
  check_node(&t, 1, "N", "caf\xc3\xa9", 0, 2, (int[]){-1});
  check_node(&t, 2, "B", "b", 0, 2, (int[]){-1});
  cn_tree_free(&t);
}

Test(bracketed, pool_is_owned) {
  char *s = strdup("(S (A x) (B y))");
  cn_tree t;
  parse_ok(s, &t);
  memset(s, '#', strlen(s));
  free(s);
  check_node(&t, 1, "A", "x", 0, 2, (int[]){-1});
  check_node(&t, 2, "B", "y", 0, 2, (int[]){-1});
  cn_tree_free(&t);
}

Test(bracketed, not_nul_terminated) {
  /* len bounds the input; bytes after it are never read. */
  const char s[] = "(A b)(((((";
  cn_tree t;
  cn_err e;
  cr_assert_eq(cn_tree_parse_bracketed(s, 5, NULL, &t, &e), 0);
  cr_assert_eq(t.n_nodes, 1);
  cn_tree_free(&t);
}

/* ---- bracketed: errors ------------------------------------------------- */

Test(bracketed_errors, contract_cases) {
  ERR("(the)", CN_E_BAD_TREE, 0);
  ERR("()", CN_E_BAD_TREE, 0);
  ERR("the (A b)", CN_E_BAD_TREE, 0);
  ERR("  x (A b)", CN_E_BAD_TREE, 2);
  ERR("(A b) x", CN_E_BAD_TREE, 6);
  ERR("(A b) (C d)", CN_E_BAD_TREE, 6);
  ERR("(3 (2 It) (4 (2 's) (2 fine))) extra", CN_E_BAD_TREE, 31);
  ERR("the film", CN_E_BAD_TREE, 0);
}

Test(bracketed_errors, empty_and_nested_empty) {
  ERR("", CN_E_BAD_TREE, 0);
  ERR("   ", CN_E_BAD_TREE, 3);
  ERR("(A ())", CN_E_BAD_TREE, 3);
  ERR("(NP (the) (NN film))", CN_E_BAD_TREE, 4);
  ERR("((a))", CN_E_BAD_TREE, 1);
}

Test(bracketed_errors, unbalanced) {
  ERR(")", CN_E_BAD_TREE, 0);
  ERR("(A b))", CN_E_BAD_TREE, 5);
  ERR("(A b) )", CN_E_BAD_TREE, 6);
  ERR("(", CN_E_BAD_TREE, 1);
  ERR("(A (B c)", CN_E_BAD_TREE, 8);
  ERR("(A (B c", CN_E_BAD_TREE, 7);
  ERR("(A (B c)   ", CN_E_BAD_TREE, 11);
}

Test(bracketed_errors, messages_say_what_was_expected) {
  cn_err e;
  cn_tree t;
  const char *s = "(A (B (C c)";
  cr_assert_eq(cn_tree_parse_bracketed(s, strlen(s), NULL, &t, &e),
               CN_E_BAD_TREE);
  cr_assert(strstr(e.msg, "expected ')'") != NULL, "%s", e.msg);
  cr_assert(strstr(e.msg, "2 brackets still open") != NULL, "%s", e.msg);
  cr_assert_eq(e.node, 1, "innermost open bracket is node 1");
  s = "(A b))";
  cn_tree_parse_bracketed(s, strlen(s), NULL, &t, &e);
  cr_assert(strstr(e.msg, "unbalanced ')' at byte 5") != NULL, "%s", e.msg);
  s = "(A ())";
  cn_tree_parse_bracketed(s, strlen(s), NULL, &t, &e);
  cr_assert(strstr(e.msg, "empty brackets '()' at byte 3") != NULL, "%s",
            e.msg);
  cr_assert_eq(e.node, 1);
  s = "(A b) c";
  cn_tree_parse_bracketed(s, strlen(s), NULL, &t, &e);
  cr_assert(strstr(e.msg, "text after the tree at byte 6") != NULL, "%s",
            e.msg);
  s = "(A (the))";
  cn_tree_parse_bracketed(s, strlen(s), NULL, &t, &e);
  cr_assert(strstr(e.msg, "'the'") != NULL, "%s", e.msg);
  /* the message must be valid UTF-8 even when a long word is cut */
  char big[200] = "(";
  for (int i = 0; i < 30; i++) strcat(big, "\xc3\xa9");
  strcat(big, ")");
  cn_tree_parse_bracketed(big, strlen(big), NULL, &t, &e);
  json_t *j = cn_err_to_json(&e);
  char *dump = json_dumps(j, 0);
  cr_assert(dump != NULL && strstr(dump, "message") != NULL);
  free(dump);
  json_decref(j);
}

Test(bracketed_errors, control_bytes) {
  expect_err("(A\x01 b)", 7, NULL, CN_E_BAD_TREE, 2);
  expect_err("(A b)\0", 6, NULL, CN_E_BAD_TREE, 5);
  expect_err("(A b\0c)", 7, NULL, CN_E_BAD_TREE, 4);
  expect_err("\x7f(A b)", 6, NULL, CN_E_BAD_TREE, 0);
}

Test(bracketed_errors, null_err_is_allowed) {
  cn_tree t;
  cr_assert_eq(cn_tree_parse_bracketed("(a)", 3, NULL, &t, NULL),
               CN_E_BAD_TREE);
  cr_assert_eq(cn_tree_parse_bracketed("(a b)", 5, NULL, &t, NULL), 0);
  cn_tree_free(&t);
}

/* ---- bracketed: limits ------------------------------------------------- */

Test(bracketed_limits, max_nodes) {
  const char *s = "(3 (2 It) (4 (2 's) (2 fine)))";
  cn_limits l = lim_default();
  cn_tree t;
  cn_err e;
  l.max_nodes = 5;
  cr_assert_eq(cn_tree_parse_bracketed(s, strlen(s), &l, &t, &e), 0);
  cn_tree_free(&t);
  l.max_nodes = 4;
  expect_err(s, strlen(s), &l, CN_E_TOO_LARGE, 20);
  cn_tree_parse_bracketed(s, strlen(s), &l, &t, &e);
  cr_assert(strstr(e.msg, "max_nodes") != NULL, "%s", e.msg);
  cr_assert_eq(e.node, 4);
  /* bare words count: (X a b) is 3 nodes */
  l.max_nodes = 2;
  expect_err("(X a b)", 7, &l, CN_E_TOO_LARGE, 5);
}

Test(bracketed_limits, max_nodes_many_bare_words) {
  size_t n = 10000;
  char *s = malloc(2 * n + 8);
  size_t k = 0;
  s[k++] = '(';
  s[k++] = 'X';
  for (size_t i = 0; i < n; i++) {
    s[k++] = ' ';
    s[k++] = 'a';
  }
  s[k++] = ')';
  cn_limits l = lim_default(); /* max_nodes 4096 */
  /* node 4096 is the 4096th bare word, at byte 2 + 2*4095 + 1 */
  expect_err(s, k, &l, CN_E_TOO_LARGE, 2 + 2 * 4095 + 1);
  l.max_nodes = 0; /* no limit */
  cn_tree t;
  cn_err e;
  cr_assert_eq(cn_tree_parse_bracketed(s, k, &l, &t, &e), 0, "%s", e.msg);
  cr_assert_eq(t.n_nodes, (int)n + 1);
  cr_assert_eq(t.nodes[0].n_children, (int)n);
  check_invariants(&t);
  cn_tree_free(&t);
  free(s);
}

Test(bracketed_limits, max_depth) {
  const char *s = "(3 (2 It) (4 (2 's) (2 fine)))";
  cn_limits l = lim_default();
  cn_tree t;
  cn_err e;
  l.max_depth = 3;
  cr_assert_eq(cn_tree_parse_bracketed(s, strlen(s), &l, &t, &e), 0);
  cn_tree_free(&t);
  l.max_depth = 2;
  expect_err(s, strlen(s), &l, CN_E_TOO_LARGE, 13);
  cn_tree_parse_bracketed(s, strlen(s), &l, &t, &e);
  cr_assert(strstr(e.msg, "max_depth") != NULL, "%s", e.msg);
  /* a bare word sits one level below its bracket */
  l.max_depth = 1;
  cr_assert_eq(cn_tree_parse_bracketed("(X w)", 5, &l, &t, &e), 0);
  cn_tree_free(&t);
  expect_err("(X a b)", 7, &l, CN_E_TOO_LARGE, 3);
}

Test(bracketed_limits, max_token_len) {
  cn_limits l = lim_default();
  cn_tree t;
  cn_err e;
  l.max_token_len = 4;
  cr_assert_eq(cn_tree_parse_bracketed("(NN film)", 9, &l, &t, &e), 0);
  cn_tree_free(&t);
  l.max_token_len = 3;
  expect_err("(NN film)", 9, &l, CN_E_TOO_LARGE, 4);
  expect_err("(LABEL w)", 9, &l, CN_E_TOO_LARGE, 1);
  cn_tree_parse_bracketed("(NN film)", 9, &l, &t, &e);
  cr_assert(strstr(e.msg, "max_token_len") != NULL, "%s", e.msg);
}

static char *deep_string(size_t depth, int closed, size_t *len) {
  char *s = malloc(2 * depth + 8);
  size_t k = 0;
  for (size_t i = 0; i < depth; i++) s[k++] = '(';
  memcpy(s + k, "a b", 3);
  k += 3;
  if (closed)
    for (size_t i = 0; i < depth; i++) s[k++] = ')';
  *len = k;
  return s;
}

Test(bracketed_limits, deep_200000_default_limits) {
  size_t len;
  char *s = deep_string(200000, 1, &len);
  expect_err(s, len, NULL, CN_E_TOO_LARGE, 512); /* the 513th '(' */
  free(s);
}

Test(bracketed_limits, deep_200000_no_limits_is_iterative) {
  size_t len;
  char *s = deep_string(200000, 1, &len);
  cn_limits l = {0};
  cn_tree t;
  cn_err e;
  cr_assert_eq(cn_tree_parse_bracketed(s, len, &l, &t, &e), 0, "%s", e.msg);
  cr_assert_eq(t.n_nodes, 200000);
  cr_assert_eq(t.height, 200000);
  check_node(&t, 199999, "a", "b", 199998, 200000, (int[]){-1});
  check_invariants(&t);
  cn_tree_free(&t);
  free(s);
  s = deep_string(200000, 0, &len);
  expect_err(s, len, &l, CN_E_BAD_TREE, (long long)len);
  free(s);
}

/* ---- real data: shared/data/trees-*.jsonl ------------------------------ */

typedef struct data_stats {
  int lines;
  long long nodes, leaves, height_sum;
  int height_min, height_max, leaves_min, leaves_max, nodes_min, nodes_max;
  long long arity[32];
} data_stats;

static void run_data_file(const char *name, data_stats *st) {
  const char *dir = getenv("CANOPY_DATA");
  if (dir == NULL) dir = "../shared/data";
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "cannot open %s (set CANOPY_DATA)", path);
  memset(st, 0, sizeof(*st));
  st->height_min = st->leaves_min = st->nodes_min = 1 << 30;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    json_error_t je;
    json_t *j = json_loads(line, 0, &je);
    cr_assert_not_null(j, "%s:%d: %s", name, st->lines + 1, je.text);
    const json_t *js = json_object_get(j, "tree");
    cr_assert(json_is_string(js));
    const char *s = json_string_value(js);
    size_t len = json_string_length(js);
    /* Independent count: in this data every node is a bracket (leaves
     * are (TAG word)), so nodes = number of '(' and leaves = number of
     * "(X w)" brackets = number of ')' directly after a non-')'. */
    int opens = 0, leaves = 0;
    for (size_t i = 0; i < len; i++) {
      if (s[i] == '(') opens++;
      if (s[i] == ')' && i > 0 && s[i - 1] != ')') leaves++;
    }
    cn_tree t;
    cn_err e;
    cn_err_clear(&e);
    int rc = cn_tree_parse_bracketed(s, len, NULL, &t, &e);
    cr_assert_eq(rc, 0, "%s:%d: %s", name, st->lines + 1, e.msg);
    check_invariants(&t);
    cr_assert_eq(t.n_nodes, opens, "%s:%d", name, st->lines + 1);
    int nl = 0;
    for (int i = 0; i < t.n_nodes; i++) {
      const cn_tree_node *n = &t.nodes[i];
      cr_assert_not_null(n->label, "every node in the data is labelled");
      cr_assert_eq(s[n->offset], '(');
      if (n->word) nl++;
      else st->arity[n->n_children < 31 ? n->n_children : 31]++;
    }
    cr_assert_eq(nl, leaves, "%s:%d", name, st->lines + 1);
    /* Round trip: the canonical form is exactly the data's string. */
    char *back = to_string(&t);
    cr_assert(strlen(back) == len && memcmp(back, s, len) == 0,
              "%s:%d: round trip\n%s\n%s", name, st->lines + 1, s, back);
    free(back);
    /* The same tree sent as JSON NODEs parses to the same cn_tree. */
    json_t *jt = to_json(&t, 0);
    cn_tree t2;
    rc = cn_tree_parse_json(jt, NULL, &t2, &e);
    cr_assert_eq(rc, 0, "%s:%d json: %s", name, st->lines + 1, e.msg);
    check_same(&t, &t2);
    cn_tree_free(&t2);
    json_decref(jt);

    st->lines++;
    st->nodes += t.n_nodes;
    st->leaves += nl;
    st->height_sum += t.height;
#define MINMAX(v, lo, hi) \
  do {                    \
    if ((v) < (lo)) lo = (v); \
    if ((v) > (hi)) hi = (v); \
  } while (0)
    MINMAX(t.height, st->height_min, st->height_max);
    MINMAX(nl, st->leaves_min, st->leaves_max);
    MINMAX(t.n_nodes, st->nodes_min, st->nodes_max);
    cn_tree_free(&t);
    json_decref(j);
  }
  free(line);
  fclose(f);
}

static void check_avg(long long sum, int n, const char *want) {
  char got[32];
  snprintf(got, sizeof(got), "%.1f", (double)sum / n);
  cr_assert_str_eq(got, want);
}

/* Numbers from shared/data/README.md. */
Test(data, trees_binary) {
  data_stats st;
  run_data_file("trees-binary.jsonl", &st);
  cr_assert_eq(st.lines, 400);
  check_avg(st.nodes, st.lines, "30.9");
  cr_assert_eq(st.nodes_min, 7);
  cr_assert_eq(st.nodes_max, 98);
  check_avg(st.leaves, st.lines, "14.6");
  cr_assert_eq(st.leaves_min, 4);
  cr_assert_eq(st.leaves_max, 47);
  check_avg(st.height_sum, st.lines, "10.7");
  cr_assert_eq(st.height_min, 4);
  cr_assert_eq(st.height_max, 27);
  cr_assert_eq(st.arity[1], 1090);
  cr_assert_eq(st.arity[2], 5442);
  for (int k = 3; k < 32; k++) cr_assert_eq(st.arity[k], 0);
}

Test(data, trees_nary) {
  data_stats st;
  run_data_file("trees-nary.jsonl", &st);
  cr_assert_eq(st.lines, 400);
  check_avg(st.nodes, st.lines, "26.0");
  cr_assert_eq(st.nodes_min, 6);
  cr_assert_eq(st.nodes_max, 78);
  check_avg(st.leaves, st.lines, "14.6");
  check_avg(st.height_sum, st.lines, "7.2");
  cr_assert_eq(st.height_min, 3);
  cr_assert_eq(st.height_max, 18);
  long long want[16] = {0, 1090, 2337, 662, 242, 112, 47, 23, 11, 4, 1, 2, 3, 3, 1, 1};
  for (int k = 0; k < 16; k++)
    cr_assert_eq(st.arity[k], want[k], "arity %d: %lld, want %lld", k,
                 st.arity[k], want[k]);
  for (int k = 16; k < 32; k++) cr_assert_eq(st.arity[k], 0);
}

/* ---- JSON form --------------------------------------------------------- */

static json_t *jload(const char *s) {
  json_error_t je;
  json_t *j = json_loads(s, JSON_DECODE_ANY, &je);
  cr_assert_not_null(j, "test JSON %s: %s", s, je.text);
  return j;
}

static void json_ok(const char *s, const cn_limits *l, cn_tree *t) {
  json_t *j = jload(s);
  cn_err e;
  cn_err_clear(&e);
  int rc = cn_tree_parse_json(j, l, t, &e);
  cr_assert_eq(rc, 0, "%s: %s", s, e.msg);
  json_decref(j); /* the tree must not borrow from the JSON */
  check_invariants(t);
}

static void json_err(const char *s, const cn_limits *l, int code, int node,
                     const char *msg_part) {
  json_t *j = jload(s);
  cn_err e;
  cn_err_clear(&e);
  cn_tree t;
  int rc = cn_tree_parse_json(j, l, &t, &e);
  cr_assert_eq(rc, code, "%s: rc %d (%s), want %d", s, rc, e.msg, code);
  cr_assert_eq(e.node, node, "%s: node %d, want %d (%s)", s, e.node, node,
               e.msg);
  char want[32];
  snprintf(want, sizeof(want), "node %d", node);
  cr_assert(strstr(e.msg, want) != NULL, "'%s' does not name %s", e.msg, want);
  if (msg_part)
    cr_assert(strstr(e.msg, msg_part) != NULL, "'%s' lacks '%s'", e.msg,
              msg_part);
  cr_assert_null(t.nodes);
  cr_assert_null(t.pool);
  cn_tree_free(&t);
  json_decref(j);
}

Test(json, api_examples) {
  cn_tree t;
  json_ok("{\"word\": \"film\"}", NULL, &t);
  cr_assert_eq(t.n_nodes, 1);
  check_node(&t, 0, NULL, "film", -1, 1, (int[]){-1});
  cr_assert_eq(t.nodes[0].offset, -1);
  cn_tree_free(&t);
  json_ok("{\"label\": \"NP\", \"type\": \"a\", \"children\": "
          "[{\"word\": \"the\"}, {\"label\": \"NN\", \"word\": \"film\"}]}",
          NULL, &t);
  cr_assert_eq(t.n_nodes, 3);
  check_node(&t, 0, "NP", NULL, -1, 1, (int[]){1, 2, -1});
  check_node(&t, 1, NULL, "the", 0, 2, (int[]){-1});
  check_node(&t, 2, "NN", "film", 0, 2, (int[]){-1});
  cr_assert_eq(t.nodes[0].type, 'a');
  cr_assert_eq(t.nodes[1].type, 0);
  cn_tree_free(&t);
}

Test(json, preorder_types_unknown_keys) {
  cn_tree t;
  json_ok("{\"type\": \"b\", \"x\": 1, \"children\": ["
          "  {\"label\": \"B\", \"children\": [{\"word\": \"c\"}, {\"word\": \"d\"}]},"
          "  {\"word\": \"e\", \"comment\": [1, 2]},"
          "  {\"label\": null, \"type\": \"a\", \"children\": [{\"word\": \"f\"}]}]}",
          NULL, &t);
  cr_assert_eq(t.n_nodes, 7);
  cr_assert_eq(t.height, 3);
  check_node(&t, 0, NULL, NULL, -1, 1, (int[]){1, 4, 5, -1});
  check_node(&t, 1, "B", NULL, 0, 2, (int[]){2, 3, -1});
  check_node(&t, 2, NULL, "c", 1, 3, (int[]){-1});
  check_node(&t, 3, NULL, "d", 1, 3, (int[]){-1});
  check_node(&t, 4, NULL, "e", 0, 2, (int[]){-1});
  check_node(&t, 5, NULL, NULL, 0, 2, (int[]){6, -1});
  check_node(&t, 6, NULL, "f", 5, 3, (int[]){-1});
  cr_assert_eq(t.nodes[0].type, 'b');
  cr_assert_eq(t.nodes[5].type, 'a');
  cn_tree_free(&t);
}

Test(json, errors_name_the_node) {
  json_err("\"(A b)\"", NULL, CN_E_BAD_TREE, 0, "must be an object");
  json_err("{}", NULL, CN_E_BAD_TREE, 0, "neither");
  json_err("{\"children\": []}", NULL, CN_E_BAD_TREE, 0,
           "'children' must be a non-empty array");
  json_err("{\"children\": {}}", NULL, CN_E_BAD_TREE, 0, "non-empty array");
  json_err("{\"children\": [{\"word\": \"a\"}, {\"word\": 3}]}", NULL,
           CN_E_BAD_TREE, 2, "'word' must be a non-empty string");
  json_err("{\"children\": [{\"word\": \"\"}]}", NULL, CN_E_BAD_TREE, 1,
           "'word'");
  json_err("{\"children\": [{\"word\": \"a\"}, {\"children\": "
           "[{\"word\": \"b\"}, 5]}]}",
           NULL, CN_E_BAD_TREE, 4, "at /children/1/children/1");
  json_err("{\"children\": [{\"word\": \"a\", \"children\": "
           "[{\"word\": \"b\"}]}]}",
           NULL, CN_E_BAD_TREE, 1, "both 'word' and 'children'");
  json_err("{\"type\": \"c\", \"children\": [{\"word\": \"a\"}]}", NULL,
           CN_E_BAD_TREE, 0, "'type' must be \"a\" or \"b\"");
  json_err("{\"children\": [{\"word\": \"a\", \"type\": 1}]}", NULL,
           CN_E_BAD_TREE, 1, "'type'");
  json_err("{\"children\": [{\"word\": \"a\"}, {\"label\": 7, \"children\": "
           "[{\"word\": \"b\"}]}]}",
           NULL, CN_E_BAD_TREE, 2, "'label' must be a non-empty string");
  json_err("{\"children\": [{\"word\": \"a\"}, {\"children\": [{\"word\": "
           "\"b\"}, {\"children\": []}]}]}",
           NULL, CN_E_BAD_TREE, 4, "'children' must be a non-empty array");
  json_err("[{\"word\": \"a\"}]", NULL, CN_E_BAD_TREE, 0, "not an array");
}

Test(json, limits) {
  const char *s = "{\"label\": \"S\", \"children\": [{\"word\": \"a\"}, "
                  "{\"children\": [{\"word\": \"b\"}, {\"word\": \"cc\"}]}]}";
  cn_limits l = lim_default();
  cn_tree t;
  l.max_nodes = 5;
  json_ok(s, &l, &t);
  cn_tree_free(&t);
  l.max_nodes = 4;
  json_err(s, &l, CN_E_TOO_LARGE, 4, "max_nodes");
  l = lim_default();
  l.max_depth = 3;
  json_ok(s, &l, &t);
  cn_tree_free(&t);
  l.max_depth = 2;
  json_err(s, &l, CN_E_TOO_LARGE, 3, "max_depth");
  l = lim_default();
  l.max_token_len = 2;
  json_ok(s, &l, &t);
  cn_tree_free(&t);
  l.max_token_len = 1;
  json_err(s, &l, CN_E_TOO_LARGE, 4, "max_token_len");
  json_err("{\"label\": \"NP\", \"children\": [{\"word\": \"a\"}]}", &l,
           CN_E_TOO_LARGE, 0, "'label'");
}

Test(json, deep_is_iterative) {
  int depth = 10000;
  json_t *root = json_object();
  json_t *cur = root;
  for (int i = 1; i < depth; i++) {
    json_t *kid = json_object();
    json_object_set_new(cur, "children", json_pack("[o]", kid));
    cur = kid;
  }
  json_object_set_new(cur, "word", json_string("w"));
  cn_tree t;
  cn_err e;
  cr_assert_eq(cn_tree_parse_json(root, NULL, &t, &e), CN_E_TOO_LARGE);
  cr_assert_eq(e.node, 512);
  cr_assert(strstr(e.msg, "/...") != NULL, "deep paths are shortened: %s",
            e.msg);
  cn_limits l = {0};
  cr_assert_eq(cn_tree_parse_json(root, &l, &t, &e), 0, "%s", e.msg);
  cr_assert_eq(t.n_nodes, depth);
  cr_assert_eq(t.height, depth);
  check_invariants(&t);
  cn_tree_free(&t);
  json_decref(root);
}

/* ---- cn_tree_free ------------------------------------------------------ */

Test(free, zeroed_and_twice) {
  cn_tree t;
  memset(&t, 0, sizeof(t));
  cn_tree_free(&t);
  cn_tree_free(&t);
  cn_tree_free(NULL);
  parse_ok("(A b)", &t);
  cn_tree_free(&t);
  cr_assert_null(t.nodes);
  cn_tree_free(&t);
}
