/* tree_json.c - the JSON form of a tree (docs/api.md: {"word"} or {"label",
 * "type", "children"}), parsed iteratively like the bracketed form; see
 * tree_parse.c for the conventions both parsers share. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "input/tree_impl.h"

/* ---- JSON form --------------------------------------------------------- */

typedef struct js_frame {
  const json_t *arr;   /* the node's "children" */
  size_t next;         /* next child to visit */
  int32_t node;
  int32_t depth;
} js_frame;

typedef struct js_ctx {
  cn__tree_limits lim;
  cn_tree *t;
  int32_t cap;
  js_frame *stack;
  int32_t sp, stack_cap;
  size_t pool_len;
  cn_err *err;
} js_ctx;

static const char *js_type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number";
  case JSON_TRUE: return "true";
  case JSON_FALSE: return "false";
  case JSON_NULL: return "null";
  }
  return "something else";
}

/* The JSON-pointer-like path of the node being visited, e.g.
 * "/children/1/children/0" ("the root" for the root), read off the stack.
 * Deep paths keep the first two and last three steps. */
static void js_path(const js_ctx *c, char *buf, size_t n) {
  size_t at = 0;
  if (c->sp == 0) {
    snprintf(buf, n, "the root");
    return;
  }
  at += (size_t)snprintf(buf, n, "at ");
  for (int32_t k = 0; k < c->sp && at < n; k++) {
    if (c->sp > 6 && k == 2) {
      at += (size_t)snprintf(buf + at, n - at, "/...");
      k = c->sp - 4;
      continue;
    }
    at += (size_t)snprintf(buf + at, n - at, "/children/%zu",
                           c->stack[k].next - 1);
  }
}

/* Checks that an optional string member is a non-empty string within
 * max_token_len; *s / *slen are set when it is present. */
static int js_string_member(js_ctx *c, const json_t *obj, const char *key,
                            int32_t idx, const char **s, size_t *slen) {
  int rc = 0;
  char path[160];
  const json_t *v = json_object_get(obj, key);
  *s = NULL;
  *slen = 0;
  if (v == NULL || json_is_null(v)) goto out;
  if (!json_is_string(v) || json_string_length(v) == 0) {
    rc = cn__tree_fail(c->err, CN_E_BAD_TREE, -1, idx,
                   "node %d (%s): '%s' must be a non-empty string, not %s",
                   (int)idx, (js_path(c, path, sizeof(path)), path), key,
                   json_is_string(v) ? "an empty string" : js_type_name(v));
    goto out;
  }
  if (json_string_length(v) > (size_t)c->lim.max_token_len) {
    rc = cn__tree_fail(c->err, CN_E_TOO_LARGE, -1, idx,
                   "node %d (%s): '%s' is %zu bytes long, over the limit of "
                   "%d (max-token-len)",
                   (int)idx, (js_path(c, path, sizeof(path)), path), key,
                   json_string_length(v),
                   (int)c->lim.max_token_len);
    goto out;
  }
  *s = json_string_value(v);
  *slen = json_string_length(v);
out:
  return rc;
}

/* Visits one NODE value: numbers it (pre-order), checks it, and pushes its
 * children array for the caller's loop to walk. Words and labels point into
 * the JSON for now; cn_tree_parse_json copies them into the pool at the end. */
static int js_visit(js_ctx *c, const json_t *v, int32_t parent,
                    int32_t depth) {
  int rc = 0;
  int32_t idx;
  char path[160];
#define JS_PATH() (js_path(c, path, sizeof(path)), path)
  rc = cn__tree_add_node(c->t, &c->cap, &c->lim, parent, depth, -1, &idx, c->err);
  if (rc) goto out;
  c->t->nodes[idx].offset = -1;
  if (depth > c->lim.max_depth) {
    rc = cn__tree_fail(c->err, CN_E_TOO_LARGE, -1, idx,
                   "node %d (%s) is at depth %d: the tree is deeper than the "
                   "limit of %d levels (max-depth)",
                   (int)idx, JS_PATH(), (int)depth, (int)c->lim.max_depth);
    goto out;
  }
  if (!json_is_object(v)) {
    rc = cn__tree_fail(c->err, CN_E_BAD_TREE, -1, idx,
                   "node %d (%s) must be an object like {\"word\": ...} or "
                   "{\"label\": ..., \"children\": [...]}, not %s",
                   (int)idx, JS_PATH(), js_type_name(v));
    goto out;
  }
  const char *word, *label;
  size_t word_len, label_len;
  rc = js_string_member(c, v, "word", idx, &word, &word_len);
  if (rc) goto out;
  rc = js_string_member(c, v, "label", idx, &label, &label_len);
  if (rc) goto out;
  const json_t *type = json_object_get(v, "type");
  int8_t type_c = 0;
  if (type != NULL && !json_is_null(type)) {
    const char *ts = json_is_string(type) ? json_string_value(type) : NULL;
    if (ts == NULL || json_string_length(type) != 1 ||
        (ts[0] != 'a' && ts[0] != 'b')) {
      rc = cn__tree_fail(c->err, CN_E_BAD_TREE, -1, idx,
                     "node %d (%s): 'type' must be \"a\" or \"b\"",
                     (int)idx, JS_PATH());
      goto out;
    }
    type_c = (int8_t)ts[0];
  }
  const json_t *kids = json_object_get(v, "children");
  if (kids != NULL && json_is_null(kids)) kids = NULL; /* null = absent */
  if (word != NULL && kids != NULL) {
    rc = cn__tree_fail(c->err, CN_E_BAD_TREE, -1, idx,
                   "node %d (%s) has both 'word' and 'children': a leaf "
                   "has a word and no children",
                   (int)idx, JS_PATH());
    goto out;
  }
  if (word == NULL &&
      (kids == NULL || !json_is_array(kids) || json_array_size(kids) == 0)) {
    if (kids == NULL)
      rc = cn__tree_fail(c->err, CN_E_BAD_TREE, -1, idx,
                     "node %d (%s) has neither 'word' (a leaf) nor "
                     "'children' (an internal node)",
                     (int)idx, JS_PATH());
    else
      rc = cn__tree_fail(c->err, CN_E_BAD_TREE, -1, idx,
                     "node %d (%s): 'children' must be a non-empty array, "
                     "not %s",
                     (int)idx, JS_PATH(),
                     json_is_array(kids) ? "an empty array"
                                         : js_type_name(kids));
    goto out;
  }
  cn_tree_node *n = &c->t->nodes[idx];
  n->type = type_c;
  n->word = word;
  n->word_len = (int32_t)word_len;
  n->label = label;
  n->label_len = (int32_t)label_len;
  c->pool_len += word_len + label_len;
  if (word != NULL) goto out;
  if (c->sp == c->stack_cap) {
    int32_t ncap = c->stack_cap < 64 ? 64 : c->stack_cap * 2;
    js_frame *ns = cn__xrealloc(c->stack, (size_t)ncap, sizeof(*ns));
    if (ns == NULL) {
      rc = cn__tree_fail(c->err, CN_E_NOMEM, -1, idx,
                     "out of memory at nesting depth %d", (int)depth);
      goto out;
    }
    c->stack = ns;
    c->stack_cap = ncap;
  }
  c->stack[c->sp++] = (js_frame){kids, 0, idx, depth};
out:
  return rc;
#undef JS_PATH
}

/* Why: clients that already hold a tree as a data structure send it as JSON
 * NODE objects instead of a bracketed string (docs/api.md). Same result type,
 * same limits; errors name the node by pre-order index and its path. On
 * failure *out is zeroed. */
int cn_tree_parse_json(const json_t *root, const cn_limits *lim, cn_tree *out,
                       cn_err *err) {
  int rc = 0;
  js_ctx c;
  memset(&c, 0, sizeof(c));
  memset(out, 0, sizeof(*out));
  c.t = out;
  c.err = err;
  cn__tree_limits_resolve(lim, &c.lim);
  if (root == NULL) {
    rc = cn__tree_fail(err, CN_E_BAD_TREE, -1, 0, "node 0 (the root) is missing");
    goto out;
  }

  rc = js_visit(&c, root, -1, 1);
  if (rc) goto out;
  while (c.sp > 0) {
    js_frame *f = &c.stack[c.sp - 1];
    if (f->next >= json_array_size(f->arr)) {
      c.sp--;
      continue;
    }
    const json_t *child = json_array_get(f->arr, f->next++);
    rc = js_visit(&c, child, f->node, f->depth + 1);
    if (rc) goto out;
  }

  /* Copy words and labels out of the JSON into the tree's one pool. */
  out->pool = malloc(c.pool_len ? c.pool_len : 1);
  if (out->pool == NULL) {
    rc = cn__tree_fail(err, CN_E_NOMEM, -1, -1,
                   "out of memory copying %zu bytes of words", c.pool_len);
    goto out;
  }
  size_t at = 0;
  for (int32_t i = 0; i < out->n_nodes; i++) {
    cn_tree_node *n = &out->nodes[i];
    if (n->word != NULL) {
      memcpy(out->pool + at, n->word, (size_t)n->word_len);
      n->word = out->pool + at;
      at += (size_t)n->word_len;
    }
    if (n->label != NULL) {
      memcpy(out->pool + at, n->label, (size_t)n->label_len);
      n->label = out->pool + at;
      at += (size_t)n->label_len;
    }
  }
  rc = cn__tree_link_children(out, err);

out:
  free(c.stack);
  if (rc) cn_tree_free(out);
  return rc;
}
