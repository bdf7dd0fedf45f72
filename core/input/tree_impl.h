/* tree_impl.h - what the two tree parsers share (tree_parse.c: the
 * bracketed form and the helpers; tree_json.c: the JSON form). */
#ifndef CANOPY_TREE_IMPL_H
#define CANOPY_TREE_IMPL_H

#include "input/input.h"

/* The effective limits of one parse: NULL and non-positive fields resolved
 * to numbers so the hot loops compare against plain ints. */
typedef struct cn__tree_limits {
  int32_t max_nodes;
  int32_t max_depth;
  int32_t max_token_len;
} cn__tree_limits;

void cn__tree_limits_resolve(const cn_limits *lim, cn__tree_limits *out);
/* Fills err (may be NULL) with code, offset, node and a message; returns
 * code. */
int cn__tree_fail(cn_err *err, int code, long long offset, int node,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Appends a node; the node array grows by doubling. */
int cn__tree_add_node(cn_tree *t, int32_t *cap, const cn__tree_limits *lim,
                      int32_t parent, int32_t depth, int64_t where,
                      int32_t *idx, cn_err *err);
/* Builds the children arrays from the parent links, O(n). */
int cn__tree_link_children(cn_tree *t, cn_err *err);
/* The same into t->children grown to *cap entries (a scratch tree's);
 * cap NULL: a fresh array. */
int cn__tree_link_children_in(cn_tree *t, int32_t *cap, cn_err *err);

#endif
