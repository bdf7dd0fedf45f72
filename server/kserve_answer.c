/* kserve_answer.c - a v2 request's answer (docs/api.md "Open Inference
 * Protocol"), laid out on the worker from /v1's per-instance output
 * objects: LOGITS, LABEL, PATH_SCORE, OUTPUT_TOKENS and HIDDEN flattened
 * row-major, each row one instance's (root, sink, decoder state, path
 * score) or one node's or token's, the latter located by OFFSETS. The
 * values are /v1's own json_t numbers and strings, referenced, never
 * recomputed, and printed as /v1's are (cn_buf_json: shortest float32):
 * the two answers agree byte for byte on every number. */
#include <stdlib.h>
#include <string.h>

#include "kserve_impl.h"
#include "work.h"

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

/* ---- what a model answers (kserve.c's metadata says the same) ---- */

const cn__v2_output cn__v2_outputs[CN__V2_N_OUTPUTS] = {
    {"LOGITS", "FP32", CN__V2_LOGITS},
    {"LABEL", "BYTES", CN__V2_LABEL},
    {"PATH_SCORE", "FP32", CN__V2_PATH_SCORE},
    {"OUTPUT_TOKENS", "BYTES", CN__V2_OUTPUT_TOKENS},
    {"HIDDEN", "FP32", CN__V2_HIDDEN},
    {"OFFSETS", "INT64", CN__V2_OFFSETS}};

static const char *dstr(const json_t *d, const char *key) {
  const char *v = json_string_value(json_object_get(d, key));
  return v ? v : "";
}

void cn__v2_model_sig(const cn__model_entry *me, cn__v2_sig *g) {
  const json_t *d = me->describe;
  g->family = dstr(d, "family");
  g->input = dstr(d, "input");
  g->classes = json_integer_value(json_object_get(d, "classes"));
  g->hidden = json_integer_value(json_object_get(d, "hidden"));
  if (strcmp(g->family, "bilstm-tagger") == 0 ||
      strcmp(dstr(d, "structure"), "bisequence") == 0)
    g->hidden *= 2;
  if (cn_model_decodes(me->model)) {
    g->outputs = CN__V2_OUTPUT_TOKENS | CN__V2_HIDDEN | CN__V2_OFFSETS;
    return;
  }
  g->outputs = CN__V2_LOGITS | CN__V2_HIDDEN;
  if (json_object_get(d, "labels") != NULL) g->outputs |= CN__V2_LABEL;
  if (json_is_true(json_object_get(d, "crf")))
    g->outputs |= CN__V2_PATH_SCORE;
  /* per token (sequences, lattices) or per node (trees, outputs "all") */
  if (strcmp(g->input, "dag") != 0) g->outputs |= CN__V2_OFFSETS;
}

json_t *cn__v2_tensor_meta(const char *name, const char *dtype, long long d0,
                           long long d1) {
  json_t *shape = json_array();
  json_array_append_new(shape, json_integer(d0));
  if (d1 >= 0) json_array_append_new(shape, json_integer(d1));
  json_t *t = json_object();
  json_object_set_new(t, "name", json_string(name));
  json_object_set_new(t, "datatype", json_string(dtype));
  json_object_set_new(t, "shape", shape);
  return t;
}

/* ---- the answer ---- */

/* One output tensor being laid out: data flattened row-major. */
typedef struct tensor {
  json_t *data;
  size_t rows;
  size_t width;   /* of each row (LOGITS, HIDDEN)                      */
  bool present;   /* some instance has it                              */
  bool missing;   /* some instance lacks it: not answered              */
  bool per_row;   /* rows per node or token (OFFSETS), else one an
                     instance                                          */
  bool ragged;    /* rows of different widths: a bug                   */
} tensor;

typedef struct answer {
  tensor t[CN__V2_N_OUTPUTS]; /* in cn__v2_outputs' order */
  json_t *offsets;
} answer;

static tensor *tens(answer *a, unsigned bit) {
  for (int i = 0; i < CN__V2_N_OUTPUTS; i++)
    if (cn__v2_outputs[i].bit == bit) return &a->t[i];
  return &a->t[CN__V2_N_OUTPUTS - 1];
}

/* A row of numbers (one logits or h vector). */
static void put_row(tensor *t, const json_t *row) {
  size_t w = json_array_size(row), k;
  json_t *v;
  if (!json_is_array(row)) {
    t->missing = true;
    return;
  }
  if (t->rows > 0 && w != t->width) t->ragged = true;
  t->width = w;
  t->present = true;
  json_array_foreach(row, k, v) json_array_append(t->data, v);
  t->rows++;
}

/* One element (a label name, a path score, a token). */
static void put_item(tensor *t, json_t *v) {
  if (v == NULL) {
    t->missing = true;
    return;
  }
  t->present = true;
  json_array_append(t->data, v);
  t->rows++;
}

/* Rows per token: an array of rows, or of elements. */
static void put_rows(tensor *t, const json_t *rows, bool numbers) {
  json_t *row;
  size_t k;
  if (!json_is_array(rows)) {
    t->missing = true;
    return;
  }
  t->per_row = t->present = true;
  json_array_foreach(rows, k, row) {
    if (numbers) put_row(t, row);
    else put_item(t, row);
  }
}

/* One instance's /v1 output object (docs/api.md) into the tensors;
 * returns its rows. */
static size_t put_instance(answer *a, const json_t *o) {
  const json_t *toks = json_object_get(o, "output_tokens");
  const json_t *nodes = json_object_get(o, "nodes");
  const json_t *logits = json_object_get(o, "logits");
  const json_t *h = json_object_get(o, "h");
  if (json_is_array(json_array_get(h, 0))) /* per token */
    put_rows(tens(a, CN__V2_HIDDEN), h, true);
  else if (h != NULL) /* the root's, the sink's, the decoder's last */
    put_row(tens(a, CN__V2_HIDDEN), h);
  if (toks != NULL) { /* a decoder */
    put_rows(tens(a, CN__V2_OUTPUT_TOKENS), toks, false);
    return json_array_size(toks);
  }
  if (nodes != NULL) { /* a tree, outputs "all": pre-order */
    tensor *tl = tens(a, CN__V2_LOGITS), *tn = tens(a, CN__V2_LABEL);
    const json_t *n;
    size_t k;
    tl->per_row = tn->per_row = true;
    json_array_foreach(nodes, k, n) {
      put_row(tl, json_object_get(n, "logits"));
      put_item(tn, json_object_get(n, "label_name"));
    }
    return json_array_size(nodes);
  }
  if (json_is_array(json_array_get(logits, 0))) { /* per token */
    put_rows(tens(a, CN__V2_LOGITS), logits, true);
    put_rows(tens(a, CN__V2_LABEL), json_object_get(o, "tag_names"), false);
    json_t *ps = json_object_get(o, "path_score");
    if (ps != NULL) put_item(tens(a, CN__V2_PATH_SCORE), ps);
    return json_array_size(logits);
  }
  put_row(tens(a, CN__V2_LOGITS), logits); /* the root's, the sink's */
  put_item(tens(a, CN__V2_LABEL), json_object_get(o, "label_name"));
  return 1;
}

static json_t *tensor_json(const char *name, const char *dtype, size_t rows,
                           long long width, json_t *data) {
  json_t *t = cn__v2_tensor_meta(name, dtype, (long long)rows, width);
  json_object_set(t, "data", data);
  return t;
}

/* The tensors that answer: those asked for (all by default) that every
 * instance has, then OFFSETS beside any tensor of rows per node or token
 * (or when asked for). Returns -1 on rows that do not add up. */
static int emit(answer *a, unsigned want, size_t n, size_t total,
                const cn__v2_sig *g, json_t *outs) {
  bool need_offsets = (want & CN__V2_OFFSETS) != 0;
  for (int i = 0; i < CN__V2_N_OUTPUTS; i++) {
    tensor *t = &a->t[i];
    unsigned b = cn__v2_outputs[i].bit;
    if (b == CN__V2_OFFSETS || !t->present || t->missing) continue;
    if (t->ragged || t->rows != (t->per_row ? total : n)) return -1;
    if (want != 0 && !(want & b)) continue;
    need_offsets |= t->per_row;
    long long w = b == CN__V2_LOGITS   ? (t->rows ? (long long)t->width
                                                  : g->classes)
                  : b == CN__V2_HIDDEN ? (t->rows ? (long long)t->width
                                                  : g->hidden)
                                       : -1;
    const cn__v2_output *d = &cn__v2_outputs[i];
    json_array_append_new(outs, tensor_json(d->name, d->dtype,
                                            t->rows, w, t->data));
  }
  if (need_offsets)
    json_array_append_new(outs, tensor_json("OFFSETS", "INT64", n + 1, -1,
                                            a->offsets));
  return 0;
}

static void answer_free(answer *a) {
  for (int i = 0; i < CN__V2_N_OUTPUTS; i++) json_decref(a->t[i].data);
  json_decref(a->offsets);
}

static char *internal_error(const char *model, int *status) {
  cn_err e;
  cn_err_clear(&e);
  cn_err_set(&e, CN_E_INTERNAL, "the outputs of model '%s' do not lay out "
             "as v2 tensors (rows that do not add up): a bug", model);
  CN_LOG(CN_LOG_ERROR, "msg=v2-layout model=%s", model);
  json_t *j = cn_err_to_json(&e);
  char *b = json_dumps(j, DUMP_FLAGS);
  json_decref(j);
  *status = cn_err_http_status(e.code);
  return b;
}

/* Workers: the v2 answer of r from /v1's outputs, one object an instance
 * (takes outs and stats; the stats become "parameters"). */
char *cn__kserve_answer(const cn__req *r, const cn__model_entry *me,
                        json_t *outs, json_t *stats, int *status) {
  answer a;
  cn__v2_sig g;
  size_t n = json_array_size(outs), total = 0, i;
  const json_t *o;
  memset(&a, 0, sizeof(a));
  cn__v2_model_sig(me, &g);
  for (int k = 0; k < CN__V2_N_OUTPUTS; k++) a.t[k].data = json_array();
  a.offsets = json_array();
  json_array_append_new(a.offsets, json_integer(0));
  json_array_foreach(outs, i, o) {
    total += put_instance(&a, o);
    json_array_append_new(a.offsets, json_integer((json_int_t)total));
  }
  json_t *tensors = json_array(), *v2 = json_object();
  int rc = emit(&a, r->v2_outputs, n, total, &g, tensors);
  json_object_set_new(v2, "model_name", json_string(me->name));
  json_object_set_new(v2, "model_version", json_string(me->version));
  if (r->v2_id != NULL) json_object_set_new(v2, "id", json_string(r->v2_id));
  json_object_set_new(v2, "parameters", stats);
  json_object_set_new(v2, "outputs", tensors);
  answer_free(&a);
  json_decref(outs);
  char *b = rc == 0 ? cn__answer_dump(v2)
                    : internal_error(me->name, status);
  json_decref(v2);
  if (rc == 0) *status = 200;
  return b;
}

