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
