/* kserve_answer.c - a v2 request's answer (docs/api.md "Open Inference
 * Protocol"), laid out on the worker from /v1's per-instance output
 * objects: LOGITS, LABEL, PATH_SCORE, OUTPUT_TOKENS and HIDDEN flattened
 * row-major, each row one instance's (root, sink, decoder state, path
 * score) or one node's or token's, the latter located by OFFSETS. The
 * values are /v1's own json_t numbers and strings, referenced, never
 * recomputed, and printed as /v1's are (cn_buf_json: shortest float32):
 * the two answers agree byte for byte on every number. A tensor asked for
 * as binary data holds the float32 (or int64) each of those numbers is;
 * one asked for as classes, the text /v1 prints for each of its top
 * values. */
#include <stdint.h>
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

/* ---- classification and binary tensor data ---- */

/* Bytes appended to an answer's binary part. */
typedef struct bytes {
  char *p;
  size_t n, cap;
  bool failed;
} bytes;

static void put(bytes *b, const void *src, size_t n) {
  if (b->failed) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n) cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) {
      b->failed = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}

/* Little-endian, whatever the host. */
static void put_le(bytes *b, uint64_t v, int width) {
  unsigned char u[8];
  for (int i = 0; i < width; i++) u[i] = (unsigned char)(v >> (8 * i));
  put(b, u, (size_t)width);
}

typedef struct scored {
  double v;
  size_t i;
} scored;

/* Higher value first; on a tie, the lower index. */
static int by_score(const void *a, const void *b) {
  const scored *x = a, *y = b;
  if (x->v != y->v) return x->v > y->v ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

/* Triton's classification extension: each row of t ([rows, W] FP32)
 * becomes its K highest values as BYTES "value:index[:label]", shape
 * [rows, K] (K at most W). The value is the very text /v1 prints for it;
 * labels: the model's class names (LOGITS), else NULL. */
static int classify(json_t *t, int k, const json_t *labels) {
  const json_t *shape = json_object_get(t, "shape");
  json_t *data = json_object_get(t, "data");
  size_t rows = (size_t)json_integer_value(json_array_get(shape, 0));
  size_t w = (size_t)json_integer_value(json_array_get(shape, 1));
  size_t kk = (size_t)k < w ? (size_t)k : w;
  scored *row = malloc((w ? w : 1) * sizeof(*row));
  json_t *out = json_array();
  if (row == NULL || out == NULL) {
    free(row);
    json_decref(out);
    return -1;
  }
  for (size_t r = 0; r < rows; r++) {
    for (size_t c = 0; c < w; c++) {
      row[c].v = json_number_value(json_array_get(data, r * w + c));
      row[c].i = c;
    }
    qsort(row, w, sizeof(*row), by_score);
    for (size_t c = 0; c < kk; c++) {
      char *v = cn__answer_dump(json_array_get(data, r * w + row[c].i));
      const char *label = json_string_value(json_array_get(labels,
                                                           row[c].i));
      json_array_append_new(out, label ? json_sprintf("%s:%zu:%s", v ? v : "",
                                                      row[c].i, label)
                                       : json_sprintf("%s:%zu", v ? v : "",
                                                      row[c].i));
      free(v);
    }
  }
  free(row);
  json_t *ns = json_array();
  json_array_append_new(ns, json_integer((json_int_t)rows));
  json_array_append_new(ns, json_integer((json_int_t)kk));
  json_object_set_new(t, "shape", ns);
  json_object_set_new(t, "datatype", json_string("BYTES"));
  json_object_set_new(t, "data", out);
  return 0;
}

/* The binary tensor data extension: t's data, little-endian and row-major
 * (FP32 4 bytes, INT64 8, BYTES a 4-byte length and the bytes), goes to
 * b; t keeps parameters.binary_data_size in its place. An FP32 value is
 * the float /v1's number is (which its 9 significant digits give back
 * exactly). */
static void to_binary(json_t *t, bytes *b) {
  const char *dt = json_string_value(json_object_get(t, "datatype"));
  const json_t *data = json_object_get(t, "data"), *v;
  size_t i, start = b->n;
  json_array_foreach(data, i, v) {
    if (strcmp(dt, "FP32") == 0) {
      float f = (float)json_number_value(v);
      uint32_t u;
      memcpy(&u, &f, sizeof(u));
      put_le(b, u, 4);
    } else if (strcmp(dt, "INT64") == 0) {
      put_le(b, (uint64_t)json_integer_value(v), 8);
    } else {
      put_le(b, (uint64_t)json_string_length(v), 4);
      put(b, json_string_value(v), json_string_length(v));
    }
  }
  json_t *par = json_object();
  json_object_set_new(par, "binary_data_size",
                      json_integer((json_int_t)(b->n - start)));
  json_object_set_new(t, "parameters", par);
  json_object_del(t, "data");
}

/* The tensors as r asks for them: classes, binary data (bin). */
static int finish_tensors(const cn__req *r, const cn__model_entry *me,
                          json_t *tensors, bytes *bin, bool *binary) {
  json_t *t;
  size_t k;
  *binary = false;
  json_array_foreach(tensors, k, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    int i = 0;
    while (i < CN__V2_N_OUTPUTS && strcmp(name, cn__v2_outputs[i].name) != 0)
      i++;
    if (i == CN__V2_N_OUTPUTS) continue;
    unsigned bit = cn__v2_outputs[i].bit;
    if (r->v2_topk[i] > 0 &&
        classify(t, r->v2_topk[i],
                 bit == CN__V2_LOGITS
                     ? json_object_get(me->describe, "labels")
                     : NULL) != 0)
      return -1;
    if (r->v2_binary & bit) {
      to_binary(t, bin);
      *binary = true;
    }
  }
  return bin->failed ? -1 : 0;
}

/* The answer's bytes: the JSON, then the binary data if any (r's
 * result_len, result_ctype and result_head then say so). */
static char *answer_bytes(cn__req *r, json_t *v2, bytes *bin, bool binary) {
  char *head = cn__answer_dump(v2);
  if (head == NULL || !binary) return head;
  size_t hl = strlen(head);
  char *b = realloc(head, hl + bin->n + 1);
  if (b == NULL) {
    free(head);
    return NULL;
  }
  if (bin->n > 0) memcpy(b + hl, bin->p, bin->n);
  b[hl + bin->n] = '\0';
  r->result_len = hl + bin->n;
  r->result_ctype = "application/octet-stream";
  snprintf(r->result_head, sizeof(r->result_head),
           "Inference-Header-Content-Length: %zu\r\n", hl);
  return b;
}

/* Workers: the v2 answer of r from /v1's outputs, one object an instance
 * (takes outs and stats; the stats become "parameters"). */
char *cn__kserve_answer(cn__req *r, const cn__model_entry *me, json_t *outs,
                        json_t *stats, int *status) {
  answer a;
  cn__v2_sig g;
  bytes bin = {0};
  bool binary = false;
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
  char *b = NULL;
  if (rc == 0 && finish_tensors(r, me, tensors, &bin, &binary) != 0) {
    *status = 500;
    b = cn__error_body(CN_E_NOMEM, "no memory for the answer", -1);
  } else {
    b = rc == 0 ? answer_bytes(r, v2, &bin, binary)
                : internal_error(me->name, status);
    if (rc == 0) *status = 200;
  }
  free(bin.p);
  json_decref(v2);
  return b;
}
