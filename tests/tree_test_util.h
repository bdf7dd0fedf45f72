/* tree_test_util.h - checks shared by the tree parser tests
 * (test_tree_parse.c: the bracketed form; test_tree_json.c: the JSON form
 * and the real data). */
#ifndef CANOPY_TREE_TEST_UTIL_H
#define CANOPY_TREE_TEST_UTIL_H

#include <jansson.h>
#include <stddef.h>

#include "internal.h"

/* p[0..len) equals want (both absent when want is NULL). */
int str_is(const char *p, int32_t len, const char *want);
cn_limits lim_default(void);
/* Parses a bracketed tree that must be valid, checking the invariants. */
void parse_ok(const char *s, cn_tree *t);
void check_node(const cn_tree *t, int i, const char *label, const char *word,
                int parent, int depth, const int *kids);
/* Pre-order, parents, depths, children arrays and height agree. */
void check_invariants(const cn_tree *t);
/* The bracketed parse of s[0..len) fails with code at byte offset. */
void expect_err(const char *s, size_t len, const cn_limits *l, int code,
                long long offset);
/* The tree written back as brackets / as a JSON NODE. */
void serialize(const cn_tree *t, int i, char **buf, size_t *len,
               size_t *cap);
char *to_string(const cn_tree *t);
json_t *to_json(const cn_tree *t, int i);
/* Same shape, labels, words and types. */
void check_same(const cn_tree *a, const cn_tree *b);
#define ERR(s, code, off) expect_err(s, strlen(s), NULL, code, off)

#endif
