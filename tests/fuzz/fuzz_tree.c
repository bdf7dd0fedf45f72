/* fuzz_tree.c - libFuzzer target for core/tree_parse.c.
 *
 * The bytes go to cn_tree_parse_bracketed under the default limits and
 * under tiny ones; when they are JSON, the value goes to cn_tree_parse_json
 * (and a "tree" string member to the bracketed parser). Besides "no crash,
 * no leak, no UB", every successful parse is checked for the promises of
 * internal.h, and for two round trips: the canonical bracketed form reparses
 * to the same tree, and so does the tree written as JSON NODEs. A broken
 * promise aborts, which libFuzzer reports as a crash.
 *
 * tests/fuzz/run_corpus.c runs this same entry point over the seed corpus
 * so the corpus is a regression test in builds without clang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "fuzz_tree: %s:%d: check failed: %s\n", __FILE__,    \
              __LINE__, #cond);                                            \
      abort();                                                             \
    }                                                                      \
  } while (0)

/* The promises of internal.h's cn_tree comment. */
static void check_tree(const cn_tree *t, const cn_limits *l) {
  CHECK(t->n_nodes > 0 && t->n_nodes <= l->max_nodes);
  CHECK(t->height >= 1 && t->height <= l->max_depth);
  CHECK(t->nodes[0].parent == -1 && t->nodes[0].depth == 1);
  long long sum = 0;
  int32_t h = 0;
  for (int32_t i = 0; i < t->n_nodes; i++) {
    const cn_tree_node *n = &t->nodes[i];
    if (n->depth > h) h = n->depth;
    if (i > 0) {
      CHECK(n->parent >= 0 && n->parent < i);
      CHECK(n->depth == t->nodes[n->parent].depth + 1);
    }
    CHECK((n->word != NULL) == (n->n_children == 0));
    CHECK(n->word == NULL || (n->word_len > 0 && n->word_len <= l->max_token_len));
    CHECK(n->label == NULL || (n->label_len > 0 && n->label_len <= l->max_token_len));
    CHECK(n->n_children >= 0 && n->first_child >= 0 &&
          n->first_child + n->n_children <= t->n_nodes - 1 + (n->n_children == 0));
    for (int32_t j = 0; j < n->n_children; j++) {
      int32_t c = t->children[n->first_child + j];
      CHECK(c > i && c < t->n_nodes && t->nodes[c].parent == i);
      if (j == 0) CHECK(c == i + 1);
      else CHECK(c > t->children[n->first_child + j - 1]);
    }
    sum += n->n_children;
  }
  CHECK(sum == t->n_nodes - 1);
  CHECK(h == t->height);
}

static int same_str(const char *a, int32_t al, const char *b, int32_t bl) {
  if ((a == NULL) != (b == NULL) || al != bl) return 0;
  return a == NULL || memcmp(a, b, (size_t)al) == 0;
}

static void check_same(const cn_tree *a, const cn_tree *b) {
  CHECK(a->n_nodes == b->n_nodes && a->height == b->height);
  for (int32_t i = 0; i < a->n_nodes; i++) {
    const cn_tree_node *x = &a->nodes[i], *y = &b->nodes[i];
    CHECK(x->parent == y->parent && x->n_children == y->n_children &&
          x->first_child == y->first_child && x->depth == y->depth);
    CHECK(same_str(x->word, x->word_len, y->word, y->word_len));
    CHECK(same_str(x->label, x->label_len, y->label, y->label_len));
  }
}

/* Canonical bracketed form of node i (recursive: only used on trees of
 * bounded height, see below). */
static void put(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n + 1 > *cap) {
    *cap = (*len + n + 1) * 2;
    *b = realloc(*b, *cap);
    CHECK(*b != NULL);
  }
  memcpy(*b + *len, s, n);
  *len += n;
}

static void write_node(const cn_tree *t, int32_t i, char **b, size_t *len,
                       size_t *cap) {
  const cn_tree_node *n = &t->nodes[i];
  if (n->word && !n->label) {
    put(b, len, cap, n->word, (size_t)n->word_len);
    return;
  }
  put(b, len, cap, "(", 1);
  if (n->label) put(b, len, cap, n->label, (size_t)n->label_len);
  if (n->word) {
    put(b, len, cap, " ", 1);
    put(b, len, cap, n->word, (size_t)n->word_len);
  }
  for (int32_t j = 0; j < n->n_children; j++) {
    if (j > 0 || n->label) put(b, len, cap, " ", 1);
    write_node(t, t->children[n->first_child + j], b, len, cap);
  }
  put(b, len, cap, ")", 1);
}

/* The JSON NODE form of node i; *bad is set when a word or label is not
 * UTF-8 (jansson refuses it), and then the JSON is not a faithful copy. */
static json_t *to_json(const cn_tree *t, int32_t i, int *bad) {
  const cn_tree_node *n = &t->nodes[i];
  json_t *o = json_object();
  if (n->label) {
    json_t *v = json_stringn(n->label, (size_t)n->label_len);
    if (v == NULL) *bad = 1;
    json_object_set_new(o, "label", v);
  }
  if (n->type) {
    char ty[2] = {(char)n->type, 0};
    json_object_set_new(o, "type", json_string(ty));
  }
  if (n->word) {
    json_t *v = json_stringn(n->word, (size_t)n->word_len);
    if (v == NULL) *bad = 1;
    json_object_set_new(o, "word", v);
    return o;
  }
  json_t *a = json_array();
  for (int32_t j = 0; j < n->n_children; j++)
    json_array_append_new(a, to_json(t, t->children[n->first_child + j], bad));
  json_object_set_new(o, "children", a);
  return o;
}

/* Round trips of a parsed tree. Recursion depth is the tree height, which
 * is capped here so the harness itself cannot overflow its stack. */
static void round_trips(const cn_tree *t, const cn_limits *l, int bracketed) {
  if (t->height > 256) return;
  cn_err e;
  cn_tree u;
  if (bracketed) {
    char *b = NULL;
    size_t len = 0, cap = 0;
    write_node(t, 0, &b, &len, &cap);
    CHECK(cn_tree_parse_bracketed(b, len, l, &u, &e) == 0);
    check_same(t, &u);
    cn_tree_free(&u);
    free(b);
  }
  int bad = 0;
  json_t *j = to_json(t, 0, &bad);
  if (!bad) {
    CHECK(cn_tree_parse_json(j, l, &u, &e) == 0);
    check_same(t, &u);
    for (int32_t i = 0; i < t->n_nodes; i++)
      CHECK(u.nodes[i].type == t->nodes[i].type);
    cn_tree_free(&u);
  }
  json_decref(j);
}

static void run_bracketed(const char *s, size_t len) {
  cn_limits def, tiny;
  cn_limits_default(&def);
  tiny = def;
  tiny.max_nodes = 8;
  tiny.max_depth = 4;
  tiny.max_token_len = 4;
  cn_err e;
  cn_tree a, b;
  cn_err_clear(&e);
  int ra = cn_tree_parse_bracketed(s, len, &def, &a, &e);
  CHECK(ra == 0 || ra == CN_E_BAD_TREE || ra == CN_E_TOO_LARGE);
  if (ra) {
    CHECK(a.nodes == NULL && a.pool == NULL && a.children == NULL);
    CHECK(e.code == ra && e.msg[0] != '\0');
    CHECK(e.offset >= 0 && (size_t)e.offset <= len);
  } else {
    check_tree(&a, &def);
    round_trips(&a, &def, 1);
  }
  int rb = cn_tree_parse_bracketed(s, len, &tiny, &b, &e);
  CHECK(rb == 0 || rb == CN_E_BAD_TREE || rb == CN_E_TOO_LARGE);
  /* Tighter limits never accept more, and never change a tree. */
  if (rb == 0) {
    CHECK(ra == 0);
    check_tree(&b, &tiny);
    check_same(&a, &b);
  }
  if (ra == CN_E_BAD_TREE) CHECK(rb != 0);
  cn_tree_free(&a);
  cn_tree_free(&b);
  /* A limit <= 0 means "none": must still be iterative and sound. */
  cn_limits none = {0};
  int rn = cn_tree_parse_bracketed(s, len, &none, &a, &e);
  CHECK(rn == 0 || rn == CN_E_BAD_TREE);
  if (ra == 0) CHECK(rn == 0);
  cn_tree_free(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  run_bracketed((const char *)data, size);

  json_error_t je;
  json_t *j = json_loadb((const char *)data, size,
                         JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  if (j == NULL) return 0;
  cn_limits def;
  cn_limits_default(&def);
  cn_tree t;
  cn_err e;
  cn_err_clear(&e);
  int rc = cn_tree_parse_json(j, &def, &t, &e);
  CHECK(rc == 0 || rc == CN_E_BAD_TREE || rc == CN_E_TOO_LARGE);
  if (rc == 0) {
    check_tree(&t, &def);
    round_trips(&t, &def, 0);
  } else {
    CHECK(t.nodes == NULL && e.node >= 0 && e.msg[0] != '\0');
  }
  cn_tree_free(&t);
  const json_t *s = json_is_object(j) ? json_object_get(j, "tree") : NULL;
  if (json_is_string(s)) run_bracketed(json_string_value(s), json_string_length(s));
  else if (s != NULL) {
    rc = cn_tree_parse_json(s, &def, &t, &e);
    if (rc == 0) check_tree(&t, &def);
    cn_tree_free(&t);
  }
  json_decref(j);
  return 0;
}
