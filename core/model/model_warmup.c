/* model_warmup.c - a small synthetic INSTANCE for a model, in the form a client
 * would send (docs/api.md), so a daemon can run it through the same path as a
 * request before a version serves (docs/daemon.md "Warm-up").
 *
 * The instance touches every vertex type a real input of the model's kind
 * touches: a tree has leaves and internal nodes (and, where the family or
 * the cells description has one, a node of the second internal type and a
 * node with three children); a lattice has characters and word spans; a
 * DAG has a node with two predecessors. Its tokens come from the model's
 * own vocabularies, so embeddings are real rows and not only <unk>.
 */
#include <stdio.h>
#include <string.h>

#include "model/model.h"

/* The k-th warm-up token of v: ids spread over the vocabulary, skipping
 * id 0 (<unk> by convention) when there is anything else, and tokens of
 * more than 32 bytes (under every max-token-len a daemon is likely to
 * set; the next id is tried, a few times). */
static const char *pick(const cn_vocab *v, int k, const char *fallback) {
  int n = v != NULL ? cn_vocab_size(v) : 0;
  if (n <= 0) return fallback;
  for (int tries = 0; tries < 8; tries++) {
    int id = n > 1 ? 1 + (int)(((long long)k * 7919 + tries) % (n - 1)) : 0;
    const char *t = cn_vocab_token(v, id);
    if (t != NULL && t[0] != '\0' && strlen(t) <= 32) return t;
  }
  return fallback;
}

static json_t *leaf(const cn_model *m, int k) {
  json_t *o = json_object();
  json_object_set_new(o, "word", json_string(pick(m->vocab, k, "a")));
  return o;
}

/* An internal node over children a, b (and c when not NULL): stolen. */
static json_t *node(json_t *a, json_t *b, json_t *c, const char *label,
                    const char *type) {
  json_t *o = json_object();
  json_t *ch = json_array();
  json_array_append_new(ch, a);
  json_array_append_new(ch, b);
  if (c != NULL) json_array_append_new(ch, c);
  if (label != NULL) json_object_set_new(o, "label", json_string(label));
  if (type != NULL) json_object_set_new(o, "type", json_string(type));
  json_object_set_new(o, "children", ch);
  return o;
}

/* ((w0 w1)_b (w2 (w3 w4 [w5]))): seven or eight nodes, two levels of
 * internal nodes above the leaves. The left internal node is of the second
 * internal type where the model has one: treelstm-2type's "type": "b", or
 * a cells type chosen by label (docs/cells.md "labels"). */
static json_t *tree(const cn_model *m) {
  const char *label = NULL, *type = NULL;
  if (m->n_type_b_labels > 0) type = "b";
  if (m->cells != NULL)
    for (int t = 0; t < m->cells->n_types && label == NULL; t++)
      if (m->cells->type[t].when == CN_WHEN_LABELS &&
          m->cells->type[t].n_labels > 0)
        label = m->cells->type[t].labels[0];
  int arity = m->cells != NULL ? m->cells->arity : m->fam->max_arity;
  bool three = arity == 0 || arity >= 3;
  json_t *left = node(leaf(m, 0), leaf(m, 1), NULL, label, type);
  json_t *right = node(leaf(m, 3), leaf(m, 4), three ? leaf(m, 5) : NULL,
                       NULL, NULL);
  return node(left, node(leaf(m, 2), right, NULL, NULL, NULL), NULL, NULL,
              NULL);
}

static json_t *tokens(const cn_vocab *v, int n, const char *fallback) {
  json_t *a = json_array();
  for (int k = 0; k < n; k++)
    json_array_append_new(a, json_string(pick(v, k, fallback)));
  return a;
}

/* Six characters and two word spans of the model's word vocabulary, one
 * overlapping the other, as a lattice of docs/models.md latticelstm. */
static json_t *lattice(const cn_model *m) {
  json_t *o = json_object();
  json_object_set_new(o, "chars", tokens(m->vocab, 6, "a"));
  json_t *w = json_array();
  static const int span[2][2] = {{0, 2}, {1, 4}};
  for (int k = 0; k < 2; k++) {
    json_t *s = json_object();
    json_object_set_new(s, "start", json_integer(span[k][0]));
    json_object_set_new(s, "end", json_integer(span[k][1]));
    json_object_set_new(s, "token", json_string(pick(m->word_vocab, k, "a")));
    json_array_append_new(w, s);
  }
  json_object_set_new(o, "words", w);
  return o;
}

/* 0 → 1 → 3, 0 → 2 → 3, 3 → 4: a source, a node with two predecessors,
 * a sink. */
static json_t *dag(const cn_model *m) {
  static const int prev[5][2] = {{-1, -1}, {0, -1}, {0, -1}, {1, 2}, {3, -1}};
  json_t *nodes = json_array();
  for (int j = 0; j < 5; j++) {
    json_t *nd = json_object();
    json_object_set_new(nd, "token", json_string(pick(m->vocab, j, "a")));
    json_t *p = json_array();
    for (int k = 0; k < 2; k++)
      if (prev[j][k] >= 0) json_array_append_new(p, json_integer(prev[j][k]));
    json_object_set_new(nd, "prev", p);
    json_array_append_new(nodes, nd);
  }
  json_t *o = json_object();
  json_object_set_new(o, "nodes", nodes);
  return o;
}

json_t *cn_model_warmup_instance(const cn_model *m) {
  json_t *o = NULL;
  switch (cn_model_input(m)) {
    case CN_INPUT_TREE:
      o = json_object();
      json_object_set_new(o, "tree", tree(m));
      break;
    case CN_INPUT_SEQUENCE:
      o = json_object();
      json_object_set_new(o, "tokens", tokens(m->vocab, 6, "a"));
      break;
    case CN_INPUT_LATTICE:
      o = lattice(m);
      break;
    case CN_INPUT_DAG:
      o = dag(m);
      break;
  }
  return o;
}
