/* instance.c - one docs/api.md INSTANCE object, parsed and validated for a
 * model: a tree with vocabulary ids and per-node cell kinds. Everything a
 * run needs later is checked here, so a bad instance is refused before it
 * can join (and harm) a run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* label in the list? (n bytes of a tree's label against C strings) */
static bool listed(char *const *list, int n, const cn_tree_node *nd) {
  for (int i = 0; i < n; i++)
    if (strlen(list[i]) == (size_t)nd->label_len &&
        memcmp(list[i], nd->label, (size_t)nd->label_len) == 0)
      return true;
  return false;
}

static bool label_in(const cn_model *m, const cn_tree_node *nd) {
  return nd->label != NULL &&
         listed(m->type_b_labels, m->n_type_b_labels, nd);
}

int cn_model_reads_labels(const cn_model *m) {
  if (m->fam->input != CN_INPUT_TREE) return 0;
  if (m->cells == NULL) return m->n_type_b_labels > 0;
  for (int t = 0; t < m->cells->n_types; t++)
    if (m->cells->type[t].n_labels > 0) return 1;
  return 0;
}

/* Why: a label the model does not list takes the default internal type
 * without a word said; a client whose parser writes "np" where the model
 * lists "NP" learns it from this count, as unknown_tokens tells it of
 * its words. */
static bool label_unknown(const cn_model *m, const cn_tree_node *nd) {
  if (nd->label == NULL) return false;
  if (m->cells == NULL) return !listed(m->type_b_labels, m->n_type_b_labels, nd);
  for (int t = 0; t < m->cells->n_types; t++)
    if (listed(m->cells->type[t].labels, m->cells->type[t].n_labels, nd))
      return false;
  return true;
}

/* Word ids and cell kinds of a parsed tree; arity checked for the family.
 * A block of 64 nodes at a time: first their child_start and their
 * words, looked up together (cn__vocab_lookup_many: each word's table
 * entry asked for before the first look-up), then the checks in node
 * order. The arrays and counts are locals: a store
 * through one of in's arrays would otherwise make the compiler load
 * t->n_nodes and the array pointers again. */
int cn__tree_finish(const cn_model *m, const cn_limits *lim, bool from_json,
                    cn_instance *in, cn_err *err) {
  const cn_tree *t = &in->tree;
  int arity = m->fam->max_arity;
  int32_t n = t->n_nodes;
  in->n = n;
  if (in->ids == NULL) in->ids = malloc((size_t)n * sizeof(int32_t));
  if (in->node_type == NULL) in->node_type = malloc((size_t)n);
  if (in->child_start == NULL)
    in->child_start = malloc(((size_t)n + 1) * sizeof(int32_t));
  if (in->ids == NULL || in->node_type == NULL || in->child_start == NULL)
    return cn_err_set(err, CN_E_NOMEM, "no memory for the instance");
  const cn_tree_node *nodes = t->nodes;
  int32_t *ids = in->ids, *cs = in->child_start;
  uint8_t *types = in->node_type;
  const cn_vocab *voc = m->vocab;
  bool lower = m->lowercase, cells = m->cells != NULL;
  /* the most children a node may have, and what exceeding it is */
  int32_t most = arity > 0 ? arity : lim->max_children;
  cs[n] = n > 0 ? n - 1 : 0;
  /* a JSON tree of treelstm-2type says its nodes' "type", not a label */
  bool by_label = cn_model_reads_labels(m) && (cells || !from_json);
  int32_t unknown = 0;
  const char *words[64];
  int32_t lens[64], wid[64];
  for (int32_t i0 = 0; i0 < n; i0 += 64) {
    int32_t i1 = n - i0 > 64 ? i0 + 64 : n, nw = 0;
    for (int32_t i = i0; i < i1; i++) {
      const cn_tree_node *w = &nodes[i];
      cs[i] = w->first_child;
      if (w->n_children > 0) continue;
      words[nw] = w->word;
      lens[nw++] = w->word_len;
    }
    cn__vocab_lookup_many(voc, words, lens, nw, lower, wid);
    nw = 0;
    for (int32_t i = i0; i < i1; i++) {
      const cn_tree_node *nd = &nodes[i];
      if (nd->n_children == 0) {
        ids[i] = wid[nw++];
        types[i] = cells ? (uint8_t)cn__cells_tree_type(m, nd) : 0;
        continue;
      }
      if ((arity >= 0 && nd->n_children > most)) {
        err->node = i;
        err->offset = nd->offset;
        in->n_unknown_labels = unknown;
        if (arity > 0)
          return cn_err_set(err, CN_E_TOO_MANY_CHILDREN,
                            "node %d has %d children; family %s takes at "
                            "most %d (use childsum-treelstm for any arity)",
                            i, nd->n_children, m->fam->name, arity);
        return cn_err_set(err, CN_E_TOO_LARGE,
                          "node %d has %d children, over the limit of %d "
                          "(max-children)", i, nd->n_children,
                          lim->max_children);
      }
      ids[i] = 0;
      if (by_label && label_unknown(m, nd)) unknown++;
      if (cells) { /* docs/cells.md: leaf, internal, by label */
        types[i] = (uint8_t)cn__cells_tree_type(m, nd);
        continue;
      }
      /* docs/models.md treelstm-2type: a bracket label listed in
       * type_b_labels, or in JSON input the node's "type". */
      bool b = from_json ? nd->type == 'b' : label_in(m, nd);
      types[i] = b ? 'b' : 'a';
    }
  }
  in->n_unknown_labels = unknown;
  return 0;
}

/* The model as a message names it: its directory's name (the name the
 * daemon serves it under, and what `canopy run` was given) and its
 * family, "'sentiment' (treelstm)"; the family alone where the directory
 * has no name. */
static const char *model_called(const cn_model *m, char *buf, size_t cap) {
  const char *d = m->dir ? m->dir : "";
  size_t n = strlen(d);
  while (n > 1 && d[n - 1] == '/') n--; /* "models/x/" */
  size_t b = n;
  while (b > 0 && d[b - 1] != '/') b--;
  if (n == b || (n - b == 1 && d[b] == '.'))
    snprintf(buf, cap, "%s", m->fam->name);
  else
    snprintf(buf, cap, "'%.*s' (%s)", (int)(n - b > 128 ? 128 : n - b),
             d + b, m->fam->name);
  return buf;
}

static int parse_tree(const cn_model *m, const json_t *inst,
                      const cn_limits *lim, cn_instance *in, cn_err *err) {
  const json_t *t = json_object_get(inst, "tree");
  char called[192];
  if (t == NULL)
    return cn_err_set(err, CN_E_BAD_INSTANCE,
                      "instance has no \"tree\" (model %s takes trees)",
                      model_called(m, called, sizeof(called)));
  int rc;
  if (json_is_string(t))
    rc = cn_tree_parse_bracketed(json_string_value(t), json_string_length(t),
                                 lim, &in->tree, err);
  else if (json_is_object(t))
    rc = cn_tree_parse_json(t, lim, &in->tree, err);
  else
    return cn_err_set(err, CN_E_BAD_INSTANCE,
                      "\"tree\" must be a bracketed string or a node object");
  if (rc != 0) return rc;
  return cn__tree_finish(m, lim, json_is_object(t), in, err);
}

/* The keys that say what an instance is (docs/api.md "Instances"). An
 * instance that carries another kind's form, or two forms of its own
 * ("tokens" and "text"), is ambiguous: which one would be computed is a
 * guess, so it is refused rather than half read. Other keys are ignored. */
static const struct {
  const char *key;
  unsigned kinds; /* bit per cn_input_kind */
} forms[] = {
    {"tree", 1u << CN_INPUT_TREE},
    {"tokens", 1u << CN_INPUT_SEQUENCE},
    {"chars", 1u << CN_INPUT_LATTICE},
    {"words", 1u << CN_INPUT_LATTICE},
    {"nodes", 1u << CN_INPUT_DAG},
    {"text", 1u << CN_INPUT_SEQUENCE | 1u << CN_INPUT_LATTICE},
};

const char *cn_instance_form_in(const json_t *o) {
  for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++)
    if (json_object_get(o, forms[i].key) != NULL) return forms[i].key;
  return NULL;
}

static int check_forms(const cn_model *m, const json_t *inst, cn_err *err) {
  static const char *takes[] = {
      [CN_INPUT_TREE] = "\"tree\"",
      [CN_INPUT_SEQUENCE] = "\"tokens\" or \"text\"",
      [CN_INPUT_LATTICE] = "\"chars\" or \"text\", and \"words\"",
      [CN_INPUT_DAG] = "\"nodes\""};
  const char *own = NULL;
  char called[192];
  for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
    if (json_object_get(inst, forms[i].key) == NULL) continue;
    if (!(forms[i].kinds & (1u << m->fam->input)))
      return cn_err_set(err, CN_E_BAD_INSTANCE, "instance has \"%s\", but "
                        "model %s takes %s", forms[i].key,
                        model_called(m, called, sizeof(called)),
                        takes[m->fam->input]);
    if (strcmp(forms[i].key, "words") == 0) continue; /* beside either */
    if (own != NULL)
      return cn_err_set(err, CN_E_BAD_INSTANCE, "instance has both \"%s\" "
                        "and \"%s\": give one", own, forms[i].key);
    own = forms[i].key;
  }
  return 0;
}

int cn_instance_parse(const cn_model *m, const json_t *inst,
                      const cn_limits *lim, int index, cn_instance **out,
                      cn_err *err) {
  int rc;
  cn_limits dflt;
  if (lim == NULL) {
    cn_limits_default(&dflt);
    lim = &dflt;
  }
  cn_err_clear(err);
  *out = NULL;
  cn_instance *in = calloc(1, sizeof(*in));
  if (in == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "no memory for the instance");
    goto out;
  }
  in->m = m;
  in->kind = m->fam->input;
  if (!json_is_object(inst)) {
    rc = cn_err_set(err, CN_E_BAD_INSTANCE, "an instance must be an object");
    goto out;
  }
  if ((rc = check_forms(m, inst, err)) != 0) goto out;
  switch (in->kind) {
    case CN_INPUT_TREE: rc = parse_tree(m, inst, lim, in, err); break;
    case CN_INPUT_SEQUENCE: rc = cn__parse_sequence(m, inst, lim, in, err); break;
    case CN_INPUT_LATTICE: rc = cn__parse_lattice(m, inst, lim, in, err); break;
    case CN_INPUT_DAG: rc = cn__parse_dag(m, inst, lim, in, err); break;
    default: rc = cn_err_set(err, CN_E_INTERNAL, "unknown input kind");
  }
out:
  if (rc != 0) {
    if (err != NULL) err->instance = index;
    cn_instance_free(in);
    return rc;
  }
  *out = in;
  return 0;
}

int cn_instance_unknown(const cn_instance *in, int32_t *pos, int cap) {
  int n = 0, word = 0;
  for (int32_t i = 0; i < in->n; i++) {
    /* a tree's internal nodes read row 0 too, but hold no word */
    if (in->kind == CN_INPUT_TREE &&
        in->child_start[i + 1] > in->child_start[i])
      continue;
    if (in->ids[i] == 0) {
      if (pos != NULL && n < cap) pos[n] = word;
      n++;
    }
    word++;
  }
  return n;
}

int cn_instance_unknown_labels(const cn_instance *in) {
  return in->kind == CN_INPUT_TREE ? in->n_unknown_labels : 0;
}

void cn_instance_free(cn_instance *in) {
  if (in == NULL || in->in_arena) return; /* its reader's arena holds it */
  cn_tree_free(&in->tree);
  free(in->ids);
  free(in->node_type);
  free(in->child_start);
  free(in->span_start);
  free(in->span_end);
  free(in->span_word);
  free(in->prev_start);
  free(in->prev);
  free(in);
}

size_t cn_instance_vertices(const cn_instance *in, int outputs_all) {
  return (size_t)in->m->fam->count(in, outputs_all ? CN_OUT_ALL : 0, 0);
}

int64_t cn_model_answer_bound(const cn_model *m, const cn_instance *in,
                              unsigned flags, int max_decode_len) {
  /* a family without a bound has an unknown answer: refused as too
   * large rather than served unbounded */
  if (m->fam->answer_bound == NULL) return INT64_MAX;
  return m->fam->answer_bound(m, in, flags, max_decode_len);
}
