/* test_tree_json.c - the JSON tree parser (core/tree_json.c): docs/api.md's
 * examples, errors naming the node, limits, adversarial depth; and the 800
 * real trees of data/ through both parsers, checked against the
 * numbers the data's README states. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tree_test_util.h"

/* ---- real data: data/trees-*.jsonl ------------------------------ */

typedef struct data_stats {
  int lines;
  long long nodes, leaves, height_sum;
  int height_min, height_max, leaves_min, leaves_max, nodes_min, nodes_max;
  long long arity[32];
} data_stats;

static void run_data_file(const char *name, data_stats *st) {
  const char *dir = getenv("CANOPY_DATA");
  if (dir == NULL) dir = "data";
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

/* Numbers from data//README.md. */
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
  json_err(s, &l, CN_E_TOO_LARGE, 4, "limit of 4 (max-nodes)");
  l = lim_default();
  l.max_depth = 3;
  json_ok(s, &l, &t);
  cn_tree_free(&t);
  l.max_depth = 2;
  json_err(s, &l, CN_E_TOO_LARGE, 3, "limit of 2 levels (max-depth)");
  l = lim_default();
  l.max_token_len = 2;
  json_ok(s, &l, &t);
  cn_tree_free(&t);
  l.max_token_len = 1;
  json_err(s, &l, CN_E_TOO_LARGE, 4, "limit of 1 (max-token-len)");
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

