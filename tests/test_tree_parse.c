/* test_tree_parse.c - the bracketed tree parser (core/tree_parse.c) against
 * docs/api.md's examples, every error path with its byte offset, the limits and
 * adversarial depth; cn_tree_free. The JSON form and the real data are in
 * test_tree_json.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tree_test_util.h"

/* ---- bracketed: docs/api.md examples and grammar decisions ------------- */

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
  cr_assert(strstr(e.msg, "limit of 4 (max-nodes)") != NULL, "%s", e.msg);
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
  cr_assert(strstr(e.msg, "limit of 2 levels (max-depth)") != NULL, "%s", e.msg);
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
  cr_assert(strstr(e.msg, "limit of 3 (max-token-len)") != NULL, "%s", e.msg);
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

/* ---- the block scanner against a byte-at-a-time reference --------------
 * The parser reads 64 bytes a step and visits only brackets, atoms and
 * control bytes. ref_parse below is the grammar of tree_parse.c's file
 * comment read one byte at a time, the plainest way; on thousands of
 * generated strings - atoms and whitespace runs across every block
 * boundary, UTF-8, control bytes, broken brackets, small limits - both
 * must agree on every node or on the error's code, byte and node. */

typedef struct ref_node {
  int parent, depth, n_children;
  long long off;
  long lab, lab_len, word, word_len; /* byte offsets; -1: none */
} ref_node;

typedef struct ref_res {
  int code, node, n, height;
  long long off;
  ref_node *nd;
} ref_res;

static int ref_class(unsigned char c) { /* 0 atom 1 ws 2 ( 3 ) 4 control */
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return 1;
  if (c == '(') return 2;
  if (c == ')') return 3;
  if (c < 0x20 || c == 0x7f) return 4;
  return 0;
}

static int ref_fail(ref_res *r, int code, long long off, int node) {
  r->code = code, r->off = off, r->node = node;
  return code;
}

static int ref_add(ref_res *r, int max_nodes, int parent, int depth,
                   long long off) {
  if (r->n >= max_nodes) return -1;
  ref_node *x = &r->nd[r->n];
  *x = (ref_node){parent, depth, 0, off, -1, 0, -1, 0};
  if (parent >= 0) r->nd[parent].n_children++;
  if (depth > r->height) r->height = depth;
  return r->n++;
}

static int ref_parse(const char *s, size_t len, int max_nodes, int max_depth,
                     int max_tok, ref_res *r) {
  struct { int node, state; long a1, a1l, a2, a2l; } st[4096];
  int sp = 0;
  memset(r, 0, sizeof(*r));
  r->nd = calloc(len + 1, sizeof(ref_node));
  size_t i = 0;
  while (i < len && ref_class((unsigned char)s[i]) == 1) i++;
  if (i == len || s[i] != '(')
    return ref_fail(r, CN_E_BAD_TREE, (long long)i, -1);
  for (; i < len;) {
    int c = ref_class((unsigned char)s[i]);
    if (c == 1) { i++; continue; }
    if (c == 4) return ref_fail(r, CN_E_BAD_TREE, (long long)i, -1);
    /* the items an open bracket holds: a bracket or an atom after its
     * pending ones settles it (its first atom the label, a second one a
     * bare leaf) */
    long ab = (long)i, al = 0;
    if (c == 0) {
      size_t j = i + 1;
      while (j < len && ref_class((unsigned char)s[j]) == 0) j++;
      al = (long)(j - i);
      if (al > max_tok) return ref_fail(r, CN_E_TOO_LARGE, ab, -1);
      i = j;
      if (st[sp - 1].state == 0) {
        st[sp - 1].a1 = ab, st[sp - 1].a1l = al, st[sp - 1].state = 1;
        continue;
      }
      if (st[sp - 1].state == 1) {
        st[sp - 1].a2 = ab, st[sp - 1].a2l = al, st[sp - 1].state = 2;
        continue;
      }
    }
    if (c == 0 || (c == 2 && sp > 0)) { /* settle the top bracket */
      int top = st[sp - 1].node, was = st[sp - 1].state;
      if (was == 1 || was == 2)
        r->nd[top].lab = st[sp - 1].a1, r->nd[top].lab_len = st[sp - 1].a1l;
      st[sp - 1].state = 3;
      if (was == 2) {
        if (sp + 1 > max_depth)
          return ref_fail(r, CN_E_TOO_LARGE, st[sp - 1].a2, r->n);
        int x = ref_add(r, max_nodes, top, sp + 1, st[sp - 1].a2);
        if (x < 0) return ref_fail(r, CN_E_TOO_LARGE, st[sp - 1].a2, r->n);
        r->nd[x].word = st[sp - 1].a2, r->nd[x].word_len = st[sp - 1].a2l;
      }
    }
    if (c == 0) { /* a bare leaf */
      if (sp + 1 > max_depth) return ref_fail(r, CN_E_TOO_LARGE, ab, r->n);
      int x = ref_add(r, max_nodes, st[sp - 1].node, sp + 1, ab);
      if (x < 0) return ref_fail(r, CN_E_TOO_LARGE, ab, r->n);
      r->nd[x].word = ab, r->nd[x].word_len = al;
      continue;
    }
    if (c == 2) {
      if (sp + 1 > max_depth) return ref_fail(r, CN_E_TOO_LARGE, (long long)i, r->n);
      int x = ref_add(r, max_nodes, sp > 0 ? st[sp - 1].node : -1, sp + 1,
                      (long long)i);
      if (x < 0) return ref_fail(r, CN_E_TOO_LARGE, (long long)i, r->n);
      cr_assert_lt(sp, 4096);
      st[sp].node = x, st[sp].state = 0, sp++;
      i++;
      continue;
    }
    /* c == 3 */
    int top = st[sp - 1].node;
    if (st[sp - 1].state < 2)
      return ref_fail(r, CN_E_BAD_TREE, r->nd[top].off, top);
    if (st[sp - 1].state == 2) {
      r->nd[top].lab = st[sp - 1].a1, r->nd[top].lab_len = st[sp - 1].a1l;
      r->nd[top].word = st[sp - 1].a2, r->nd[top].word_len = st[sp - 1].a2l;
    }
    sp--;
    i++;
    if (sp == 0) {
      for (; i < len; i++)
        if (ref_class((unsigned char)s[i]) != 1)
          return ref_fail(r, CN_E_BAD_TREE, (long long)i, -1);
      return 0;
    }
  }
  return ref_fail(r, CN_E_BAD_TREE, (long long)len, st[sp - 1].node);
}

/* s's bytes at p..p+n (n -1: NULL) against a parsed word or label. */
static void same_str(const char *s, long p, long n, const char *got,
                     int32_t got_len, const char *what, int node) {
  if (p < 0) {
    cr_assert_null(got, "node %d: %s present", node, what);
    return;
  }
  cr_assert_not_null(got, "node %d: %s missing", node, what);
  cr_assert_eq(got_len, n, "node %d: %s length", node, what);
  cr_assert(memcmp(got, s + p, (size_t)n) == 0, "node %d: %s bytes", node,
            what);
}

static void check_against_ref(const char *s, size_t len, const cn_limits *l,
                              const ref_res *r, int rc, const cn_tree *t,
                              const cn_err *e, bool view) {
  cr_assert_eq(rc, r->code, "%.*s: rc %d (%s), reference %d",
               (int)(len > 200 ? 200 : len), s, rc, e->msg, r->code);
  if (rc != 0) {
    cr_assert_eq(e->offset, r->off, "%.*s: offset %lld, reference %lld (%s)",
                 (int)(len > 200 ? 200 : len), s, e->offset, r->off, e->msg);
    cr_assert_eq(e->node, r->node, "%.*s: node %d, reference %d (%s)",
                 (int)(len > 200 ? 200 : len), s, e->node, r->node, e->msg);
    return;
  }
  cr_assert_eq(t->n_nodes, r->n);
  cr_assert_eq(t->height, r->height);
  int32_t at = 0;
  for (int i = 0; i < r->n; i++) {
    const cn_tree_node *x = &t->nodes[i];
    const ref_node *y = &r->nd[i];
    cr_assert_eq(x->parent, y->parent, "node %d parent", i);
    cr_assert_eq(x->depth, y->depth, "node %d depth", i);
    cr_assert_eq(x->offset, y->off, "node %d offset", i);
    cr_assert_eq(x->n_children, y->n_children, "node %d children", i);
    cr_assert_eq(x->first_child, at, "node %d first child", i);
    at += y->n_children; /* the children arrays in node order */
    cr_assert_eq(x->type, 0);
    same_str(s, y->lab, y->lab_len, x->label, x->label_len, "label", i);
    same_str(s, y->word, y->word_len, x->word, x->word_len, "word", i);
    if (view && x->word != NULL)
      cr_assert(x->word >= s && x->word < s + len, "a view points into s");
  }
  check_invariants(t);
  (void)l;
}

/* A tree of random shape written with random whitespace (runs of it,
 * tabs, newlines), atoms of 1 to 150 bytes (some UTF-8), bare words,
 * then with a few bytes broken now and then. */
static void gen_tree(unsigned *seed, char *b, size_t *k, size_t cap,
                     int depth) {
  static const char *ws[] = {" ", "  ", "\t", "\n", "\r\n", "   \t  "};
#define PUT(c) do { if (*k < cap) b[(*k)++] = (char)(c); } while (0)
#define WS() do { const char *w_ = ws[rand_r(seed) % 6]; \
                  while (*w_) PUT(*w_++); } while (0)
#define ATOM() do { int n_ = rand_r(seed) % 9 == 0 ? 1 + rand_r(seed) % 150 \
                                                : 1 + rand_r(seed) % 6; \
    for (int q_ = 0; q_ < n_; q_++) { \
      if (rand_r(seed) % 17 == 0 && q_ + 1 < n_) { PUT(0xc3); PUT(0xa9); q_++; } \
      else PUT("abcXYZ019.,'-_"[rand_r(seed) % 14]); } } while (0)
  PUT('(');
  if (rand_r(seed) % 8 == 0) WS();
  if (rand_r(seed) % 10 != 0) ATOM(); /* a label */
  int kids = depth > 6 ? 0 : rand_r(seed) % 4;
  if (kids == 0) {
    WS();
    ATOM(); /* a leaf's word */
  }
  for (int c = 0; c < kids; c++) {
    if (c > 0 || rand_r(seed) % 2) WS();
    if (rand_r(seed) % 4 == 0) ATOM();
    else gen_tree(seed, b, k, cap, depth + 1);
  }
  if (rand_r(seed) % 8 == 0) WS();
  PUT(')');
#undef PUT
#undef WS
#undef ATOM
}

Test(bracketed_scan, agrees_with_byte_reference) {
  unsigned seed = 12345;
  size_t cap = 1 << 16;
  char *b = malloc(cap);
  cn_tree_scratch sc;
  memset(&sc, 0, sizeof(sc));
  for (int it = 0; it < 6000; it++) {
    size_t k = 0;
    int lead = rand_r(&seed) % 70; /* the tree at every offset of a block */
    for (int q = 0; q < lead; q++) b[k++] = q % 5 == 0 ? '\t' : ' ';
    gen_tree(&seed, b, &k, cap - 80, 0);
    int trail = rand_r(&seed) % 3;
    for (int q = 0; q < trail; q++) b[k++] = ' ';
    int breaks = rand_r(&seed) % 3 == 0 ? 1 + rand_r(&seed) % 2 : 0;
    for (int q = 0; q < breaks && k > 0; q++) {
      static const char bad[] = "()\x01\x7f\x1f x";
      size_t p = (size_t)rand_r(&seed) % k;
      int how = rand_r(&seed) % 3;
      if (how == 0) b[p] = bad[rand_r(&seed) % 8];
      else if (how == 1) k = p; /* cut */
      else b[p] = (char)0x00;
    }
    cn_limits l = lim_default();
    int lk = rand_r(&seed) % 6;
    if (lk == 0) l.max_nodes = 1 + rand_r(&seed) % 20;
    if (lk == 1) l.max_depth = 1 + rand_r(&seed) % 5;
    if (lk == 2) l.max_token_len = 1 + rand_r(&seed) % 8;
    ref_res r;
    ref_parse(b, k, l.max_nodes, l.max_depth, l.max_token_len, &r);
    /* a fresh tree, the scratch, and the scratch viewing b */
    cn_tree t;
    cn_err e;
    cn_err_clear(&e);
    int rc = cn_tree_parse_bracketed(b, k, &l, &t, &e);
    check_against_ref(b, k, &l, &r, rc, &t, &e, false);
    if (rc == 0) cn_tree_free(&t);
    cn_err_clear(&e);
    rc = cn__tree_parse_bracketed_scratch(b, k, &l, &sc, &e);
    check_against_ref(b, k, &l, &r, rc, &sc.t, &e, false);
    cn_err_clear(&e);
    rc = cn__tree_parse_bracketed_view(b, k, &l, &sc, &e);
    check_against_ref(b, k, &l, &r, rc, &sc.t, &e, true);
    free(r.nd);
  }
  cn__tree_scratch_free(&sc);
  free(b);
}
