/* answers.c - the answers of the tree and tagger families, docs/api.md:
 * each instance's JSON object (logits, label, per-node and per-token
 * objects, hidden states), the same written straight into a buffer, the
 * states they read, and the bound on their size; and the vertices of a
 * tree instance, which those answers are read from. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "families/families.h"

/* A tree's vertices written straight into the run's arrays, which have
 * room for them (cn__run_vertex_room): what cn__run_add_vertex does a
 * vertex, in closed form. The nodes are added backwards (children come
 * after their parent in pre-order, so every child before its parent):
 * node i is vertex top - i, its inputs are top - child, and the edges
 * before its own are those of the nodes after it, cs[n] - cs[i + 1].
 * Nothing reads back what it wrote, so each array is one pass, and the
 * arrays come in restrict-qualified, so that storing a vertex's type (a
 * byte, which may alias anything) does not make the compiler reload the
 * others after it. Then one output vertex for each of the first n_out
 * nodes. Fills the slot's node map (nodev). */
static void tree_vertices(const cn_tree_types *tt, const cn_instance *inst,
                          int slot, int32_t n_out, int32_t nv0, int32_t ne0,
                          int32_t *restrict nodev, uint8_t *restrict vtype,
                          int32_t *restrict vslot, int32_t *restrict vnode,
                          int32_t *restrict vaux, int32_t *restrict in_start,
                          int32_t *restrict in_edges,
                          int64_t *restrict n_of_type) {
  const int32_t *restrict cs = inst->child_start;
  const int32_t *restrict children = inst->tree.children;
  const int32_t *restrict ids = inst->ids;
  const uint8_t *restrict node_type = inst->node_type;
  const int32_t n = inst->tree.n_nodes, top = nv0 + n - 1;
  const int32_t ne_end = ne0 + (cs[n] - cs[0]); /* after the nodes' edges */
  for (int32_t i = 0; i < n; i++) {
    nodev[i] = top - i;
    vslot[top - i] = slot;
    vnode[top - i] = i;
    vaux[top - i] = ids[i];
    in_start[top - i + 1] = ne_end - (cs[i] - cs[0]);
  }
  if (tt->by_node_type) {
    for (int32_t i = 0; i < n; i++) {
      vtype[top - i] = node_type[i];
      n_of_type[node_type[i]]++;
    }
  } else {
    const int leaf = tt->leaf, ia = tt->internal_a, ib = tt->internal_b;
    int32_t n_leaf = 0, n_b = 0;
    for (int32_t i = 0; i < n; i++) {
      int type = leaf;
      if (cs[i + 1] == cs[i])
        n_leaf++;
      else if (ib >= 0 && node_type[i] == 'b')
        type = ib, n_b++;
      else
        type = ia;
      vtype[top - i] = (uint8_t)type;
    }
    n_of_type[leaf] += n_leaf;
    n_of_type[ia] += n - n_leaf - n_b;
    if (ib >= 0) n_of_type[ib] += n_b;
  }
  int32_t *restrict e = in_edges + ne0;
  for (int32_t i = n - 1; i >= 0; i--)
    for (int32_t k = cs[i]; k < cs[i + 1]; k++) *e++ = top - children[k];
  const int out = tt->output;
  for (int32_t i = 0; i < n_out; i++) {
    int32_t v = top + 1 + i;
    vtype[v] = (uint8_t)out;
    vslot[v] = slot;
    vnode[v] = i;
    vaux[v] = 0;
    in_edges[ne_end + i] = top - i;
    in_start[v + 1] = ne_end + i + 1;
  }
  n_of_type[out] += n_out;
}

int cn__tree_build(cn_run *r, int slot, const cn_tree_types *tt) {
  const cn_instance *inst = r->slots[slot].inst;
  const cn_tree *t = &inst->tree;
  /* the children by child_start, not the nodes: a run's trees were
   * parsed a whole chunk earlier and have left the cache, and this
   * reads 4 bytes a node where the nodes are 56 */
  const int32_t *cs = inst->child_start;
  unsigned flags = r->slots[slot].flags;
  int32_t n = t->n_nodes;
  /* every line of the four arrays asked for at once: their misses
   * overlap instead of coming one after another as the walk meets them */
  for (int32_t i = 0; i <= n; i += 16) {
    __builtin_prefetch(cs + i);
    __builtin_prefetch(inst->ids + i);
    __builtin_prefetch(t->children + i);
  }
  for (int32_t i = 0; i < n; i += 64) __builtin_prefetch(inst->node_type + i);
  int32_t base = cn__run_reserve_nodes(r, n);
  if (base < 0) return CN_E_NOMEM;
  int32_t n_out = (flags & CN_OUT_ALL) ? n : 1;
  if (r->live == NULL) {
    /* a planned run: room for the whole tree at once (its edges: every
     * node's children, and one an output), then written in place */
    if (cn__run_vertex_room(r, n + n_out, (cs[n] - cs[0]) + n_out) != 0)
      return CN_E_NOMEM;
    int32_t nv = r->nv, ne = r->ne;
    tree_vertices(tt, inst, slot, n_out, nv, ne, r->node_vertex + base,
                  r->vtype, r->vslot, r->vnode, r->vaux, r->in_start,
                  r->in_edges, r->n_of_type);
    r->slots[slot].out_v0 = nv + n;
    r->nv = nv + n + n_out;
    r->ne = ne + (cs[n] - cs[0]) + n_out;
    r->slots[slot].node_v0 = base;
    r->slots[slot].n_out = n_out;
    return 0;
  }
  /* A dynamic run: each vertex through cn__run_add_vertex, which tells
   * the run's frontier of it. */
  for (int32_t i = n - 1; i >= 0; i--) {
    int32_t first = cs[i], n_children = cs[i + 1] - first;
    int type = tt->leaf;
    if (tt->by_node_type)
      type = inst->node_type[i];
    else if (n_children > 0)
      type = (tt->internal_b >= 0 && inst->node_type[i] == 'b')
                 ? tt->internal_b
                 : tt->internal_a;
    /* Inputs: the children's vertices, read from the node map in place
     * (indices into node_vertex stay valid while we only append vertices). */
    int32_t in[64];
    int32_t *inputs = in;
    if (n_children > (int32_t)CN_ARRAY_SIZE(in)) {
      inputs = malloc((size_t)n_children * sizeof(int32_t));
      if (inputs == NULL) return CN_E_NOMEM;
    }
    for (int32_t k = 0; k < n_children; k++)
      inputs[k] = r->node_vertex[base + t->children[first + k]];
    int32_t v = cn__run_add_vertex(r, type, slot, i, inst->ids[i], inputs,
                                   n_children);
    if (inputs != in) free(inputs);
    if (v < 0) return CN_E_NOMEM;
    r->node_vertex[base + i] = v;
  }
  cn_run_slot *s = &r->slots[slot];
  s->node_v0 = base;
  s->out_v0 = r->nv;
  s->n_out = (flags & CN_OUT_ALL) ? n : 1;
  for (int32_t i = 0; i < s->n_out; i++) {
    int32_t in = r->node_vertex[base + i];
    if (cn__run_add_vertex(r, tt->output, slot, i, 0, &in, 1) < 0)
      return CN_E_NOMEM;
  }
  return 0;
}

int cn__tree_build3(cn_run *r, int slot) {
  static const cn_tree_types tt = {0, 1, -1, 2, false};
  return cn__tree_build(r, slot, &tt);
}

json_t *cn__tree_output_h(const cn_run *r, int slot) {
  return cn__tree_output(r, slot, (int)r->m->dims.H);
}

int64_t cn__tree_count(const cn_instance *in, unsigned flags, int max_decode) {
  return (int64_t)in->n + ((flags & CN_OUT_ALL) ? in->n : 1);
}

json_t *cn__json_float(double x) {
  /* json_real refuses NaN and infinity (NULL): null marks the value for
   * cn_output_check, and a field never goes missing without a word */
  return isfinite(x) ? json_real(x) : json_null();
}

json_t *cn__json_floats(const float *x, int64_t n) {
  json_t *a = json_array();
  for (int64_t i = 0; i < n; i++) json_array_append_new(a, cn__json_float(x[i]));
  return a;
}

int cn__argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i; /* lowest index wins a tie */
  return best;
}

json_t *cn__logits_object(const cn_run *r, json_t *o, const float *z) {
  const cn_model *m = r->m;
  int C = (int)m->dims.C;
  int label = cn__argmax(z, C);
  json_object_set_new(o, "logits", cn__json_floats(z, C));
  json_object_set_new(o, "label", json_integer(label));
  if (m->labels != NULL && label < m->n_labels)
    json_object_set_new(o, "label_name", json_string(m->labels[label]));
  return o;
}

void cn__logits_nodes(const cn_run *r, int slot, json_t *o) {
  const cn_run_slot *s = &r->slots[slot];
  json_t *nodes = json_array();
  for (int32_t i = 0; i < s->n_out; i++)
    json_array_append_new(
        nodes, cn__logits_object(r, json_object(),
                                 cn__run_state_host(r, s->out_v0 + i)));
  json_object_set_new(o, "nodes", nodes);
}

json_t *cn__tree_output(const cn_run *r, int slot, int h_floats) {
  const cn_run_slot *s = &r->slots[slot];
  json_t *o = json_object();
  cn__logits_object(r, o, cn__run_state_host(r, s->out_v0));
  if (s->flags & CN_OUT_ALL) cn__logits_nodes(r, slot, o);
  if (s->flags & CN_OUT_HIDDEN) {
    int32_t root = r->node_vertex[s->node_v0];
    json_object_set_new(o, "h",
                        cn__json_floats(cn__run_state_host(r, root), h_floats));
  }
  return o;
}

#define PUTL(b, lit) cn_buf_put(b, lit, sizeof(lit) - 1)
#define LIT(s) ((int64_t)sizeof(s) - 1)

/* The first non-finite field's name, as cn_output_check's find_null
 * walks the object: keys in order, "[i]" for an object in an array. */
static int non_finite(char *field, size_t cap, const char *name, int index) {
  if (index >= 0)
    snprintf(field, cap, "%s[%d].logits", name, index);
  else
    snprintf(field, cap, "%s", name);
  return CN_E_NON_FINITE;
}

bool cn__logits_write(const cn_run *r, cn_buf *b, const float *z) {
  const cn_model *m = r->m;
  int C = (int)m->dims.C;
  int label = cn__argmax(z, C);
  PUTL(b, "\"logits\":");
  bool ok = cn_buf_floats(b, z, C);
  PUTL(b, ",\"label\":");
  cn_buf_int(b, label);
  if (m->labels != NULL && label < m->n_labels) {
    PUTL(b, ",\"label_name\":");
    cn_buf_string(b, m->labels[label]);
  }
  return ok;
}

int cn__tree_write(const cn_run *r, int slot, int h_floats, cn_buf *b,
                   char *field, size_t cap) {
  const cn_run_slot *s = &r->slots[slot];
  int rc = 0;
  PUTL(b, "{");
  if (!cn__logits_write(r, b, cn__run_state_host(r, s->out_v0)))
    rc = non_finite(field, cap, "logits", -1);
  if (s->flags & CN_OUT_ALL) {
    PUTL(b, ",\"nodes\":[");
    for (int32_t i = 0; i < s->n_out; i++) {
      if (i > 0) PUTL(b, ",");
      PUTL(b, "{");
      if (!cn__logits_write(r, b, cn__run_state_host(r, s->out_v0 + i)) &&
          rc == 0)
        rc = non_finite(field, cap, "nodes", i);
      PUTL(b, "}");
    }
    PUTL(b, "]");
  }
  if (s->flags & CN_OUT_HIDDEN) {
    int32_t root = r->node_vertex[s->node_v0];
    PUTL(b, ",\"h\":");
    if (!cn_buf_floats(b, cn__run_state_host(r, root), h_floats) && rc == 0)
      rc = non_finite(field, cap, "h", -1);
  }
  PUTL(b, "}");
  return rc;
}

int cn__tree_write_h(const cn_run *r, int slot, cn_buf *b, char *field,
                     size_t cap) {
  return cn__tree_write(r, slot, (int)r->m->dims.H, b, field, cap);
}

/* Mirrors cn__tree_output: the logits rows, the root's h. */
void cn__tree_reads(cn_run *r, int slot, int h_floats) {
  const cn_run_slot *s = &r->slots[slot];
  int C = (int)r->m->dims.C;
  cn__run_need(r, s->out_v0, 0, C);
  if (s->flags & CN_OUT_ALL)
    for (int32_t i = 0; i < s->n_out; i++) cn__run_need(r, s->out_v0 + i, 0, C);
  if (s->flags & CN_OUT_HIDDEN)
    cn__run_need(r, r->node_vertex[s->node_v0], 0, h_floats);
}

void cn__tree_reads_h(cn_run *r, int slot) {
  cn__tree_reads(r, slot, (int)r->m->dims.H);
}

/* Mirrors cn__tagger_output's logits (and a CRF finish(): the same rows). */
void cn__tagger_reads(cn_run *r, int slot) {
  const cn_run_slot *s = &r->slots[slot];
  for (int32_t i = 0; i < s->n_out; i++)
    cn__run_need(r, s->out_v0 + i, 0, (int)r->m->dims.C);
}

json_t *cn__tagger_output(const cn_run *r, int slot, int h_floats,
                          void (*hidden)(const cn_run *r, int slot, int i,
                                         float *buf)) {
  const cn_run_slot *s = &r->slots[slot];
  const cn_model *m = r->m;
  int C = (int)m->dims.C;
  json_t *o = json_object();
  json_t *logits = json_array(), *tags = json_array();
  json_t *names = m->labels != NULL ? json_array() : NULL;
  for (int32_t i = 0; i < s->n_out; i++) {
    const float *z = cn__run_state_host(r, s->out_v0 + i);
    int t = r->out_tag != NULL ? r->out_tag[s->out_v0 + i]
                               : cn__argmax(z, C);
    json_array_append_new(logits, cn__json_floats(z, C));
    json_array_append_new(tags, json_integer(t));
    if (names != NULL)
      json_array_append_new(names, json_string(t < m->n_labels
                                                   ? m->labels[t] : ""));
  }
  json_object_set_new(o, "logits", logits);
  json_object_set_new(o, "tags", tags);
  if (names != NULL) json_object_set_new(o, "tag_names", names);
  if (r->out_score != NULL)
    json_object_set_new(o, "path_score",
                        cn__json_float(r->out_score[slot]));
  if (s->flags & CN_OUT_HIDDEN) {
    json_t *hs = json_array();
    float *buf = malloc((size_t)h_floats * sizeof(float));
    for (int32_t i = 0; buf != NULL && i < s->n_out; i++) {
      hidden(r, slot, i, buf);
      json_array_append_new(hs, cn__json_floats(buf, h_floats));
    }
    free(buf);
    json_object_set_new(o, "h", hs);
  }
  return o;
}

/* Tags remembered from the logits' pass, so that the tags and their
 * names do not look the states up and take the argmax again; positions
 * past it are computed again. */
#define TAGS_KEPT 512
/* Label names rendered once an answer: the first of each written as a
 * JSON string, the others copied from it. */
#define NAMES_KEPT 64

static inline int tag_at(const cn_run *r, const cn_run_slot *s, int C,
                         int32_t i) {
  return r->out_tag != NULL
             ? r->out_tag[s->out_v0 + i]
             : cn__argmax(cn__run_state_host(r, s->out_v0 + i), C);
}

/* The logits, tags and tag names of a tagger answer are most of its
 * bytes: room for all of them (their bound, as cn__bound_tagger counts
 * it) is reserved once and they are written without a check each. */
int cn__tagger_write(const cn_run *r, int slot, int h_floats,
                     void (*hidden)(const cn_run *r, int slot, int i,
                                    float *buf),
                     cn_buf *b, char *field, size_t cap) {
  const cn_run_slot *s = &r->slots[slot];
  const cn_model *m = r->m;
  int C = (int)m->dims.C, rc = 0;
  int32_t n = s->n_out;
  int64_t need = LIT("{\"logits\":[]") + n * (cn__bound_floats(C) + 1) +
                 LIT(",\"tags\":[]") + n * (cn__bound_int(C) + 1) +
                 CN__JSON_SCRATCH;
  if (m->labels != NULL)
    need += LIT(",\"tag_names\":[]") + n * (m->json_label_max + 1);
  if (need < 0 || (uint64_t)need > SIZE_MAX / 2) {
    b->failed = 1;
    return 0;
  }
  char *p = cn_buf_room(b, (size_t)need);
  if (p == NULL) return 0; /* b->failed: the caller's no-memory error */
  int tags[TAGS_KEPT];
  int finite = 1;
  memcpy(p, "{\"logits\":[", 11);
  p += 11;
  for (int32_t i = 0; i < n; i++) {
    const float *z = cn__run_state_host(r, s->out_v0 + i);
    p = cn__f32_json_array(p, z, C, &finite);
    *p++ = ',';
    if (i < TAGS_KEPT)
      tags[i] = r->out_tag != NULL ? r->out_tag[s->out_v0 + i]
                                   : cn__argmax(z, C);
  }
  if (n > 0) p--;
  if (!finite) rc = non_finite(field, cap, "logits", -1);
  memcpy(p, "],\"tags\":[", 10);
  p += 10;
  for (int32_t i = 0; i < n; i++) {
    p = cn__json_int_at(p, i < TAGS_KEPT ? tags[i] : tag_at(r, s, C, i));
    *p++ = ',';
  }
  if (n > 0) p--;
  *p++ = ']';
  if (m->labels != NULL) {
    const char *name_at[NAMES_KEPT] = {NULL};
    size_t name_len[NAMES_KEPT];
    memcpy(p, ",\"tag_names\":[", 14);
    p += 14;
    for (int32_t i = 0; i < n; i++) {
      int t = i < TAGS_KEPT ? tags[i] : tag_at(r, s, C, i);
      if (t >= 0 && t < NAMES_KEPT && name_at[t] != NULL) {
        memcpy(p, name_at[t], name_len[t]);
        p += name_len[t];
      } else {
        const char *name = t < m->n_labels ? m->labels[t] : "";
        char *at = p;
        p = cn__json_string_at(p, name, strlen(name));
        if (t >= 0 && t < NAMES_KEPT) {
          name_at[t] = at;
          name_len[t] = (size_t)(p - at);
        }
      }
      *p++ = ',';
    }
    if (n > 0) p--;
    *p++ = ']';
  }
  *p = '\0';
  b->len = (size_t)(p - b->p);
  if (r->out_score != NULL) {
    float ps = r->out_score[slot];
    PUTL(b, ",\"path_score\":");
    cn_buf_float(b, ps);
    if (!isfinite(ps) && rc == 0) rc = non_finite(field, cap, "path_score", -1);
  }
  if (s->flags & CN_OUT_HIDDEN) {
    /* a row on the stack unless it is wide: no allocation an answer */
    float row[512];
    float *buf = h_floats <= 512 ? row
                                 : malloc((size_t)h_floats * sizeof(float));
    PUTL(b, ",\"h\":[");
    for (int32_t i = 0; buf != NULL && i < s->n_out; i++) {
      hidden(r, slot, i, buf);
      if (i > 0) PUTL(b, ",");
      if (!cn_buf_floats(b, buf, h_floats) && rc == 0)
        rc = non_finite(field, cap, "h", -1);
    }
    if (buf != row) free(buf);
    PUTL(b, "]");
  }
  PUTL(b, "}");
  return rc;
}

/* ---- answer bounds ---- */

int64_t cn__bound_floats(int64_t n) {
  return 2 + n * (CN_JSON_FLOAT_MAX + 1);
}

int64_t cn__bound_int(int64_t max) {
  int64_t d = 1;
  for (; max >= 10; max /= 10) d++;
  return d;
}

int64_t cn__bound_logits_object(const cn_model *m) {
  int64_t C = m->dims.C;
  return LIT("{\"logits\":") + cn__bound_floats(C) + LIT(",\"label\":") +
         cn__bound_int(C) + LIT(",\"label_name\":") + m->json_label_max +
         LIT("}");
}

int64_t cn__bound_tree(const cn_model *m, int64_t n, unsigned flags,
                       int64_t h_floats) {
  int64_t b = cn__bound_logits_object(m);
  if (flags & CN_OUT_ALL)
    b += LIT(",\"nodes\":[]") + n * (cn__bound_logits_object(m) + 1);
  if (flags & CN_OUT_HIDDEN) b += LIT(",\"h\":") + cn__bound_floats(h_floats);
  return b;
}

int64_t cn__bound_tagger(const cn_model *m, int64_t n, unsigned flags,
                         int64_t h_floats) {
  int64_t C = m->dims.C;
  int64_t b = LIT("{\"logits\":[]") + n * (cn__bound_floats(C) + 1) +
              LIT(",\"tags\":[]") + n * (cn__bound_int(C) + 1) +
              LIT(",\"path_score\":") + CN_JSON_FLOAT_MAX + LIT("}");
  if (m->labels != NULL)
    b += LIT(",\"tag_names\":[]") + n * (m->json_label_max + 1);
  if (flags & CN_OUT_HIDDEN)
    b += LIT(",\"h\":[]") + n * (cn__bound_floats(h_floats) + 1);
  return b;
}

int64_t cn__tree_answer_bound(const cn_model *m, const cn_instance *in,
                              unsigned flags, int max_decode_len) {
  (void)max_decode_len;
  return cn__bound_tree(m, in->n, flags, m->dims.H);
}
