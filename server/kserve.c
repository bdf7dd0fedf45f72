/* kserve.c - the Open Inference Protocol (KServe v2) over HTTP, as a
 * mapping onto /v1 (docs/api.md "Open Inference Protocol"): metadata from
 * what the model describes, a request turned into the /v1 request it asks
 * for (then parsed, checked, batched and run by /v1's own path: infer.c,
 * batcher.c, worker.c), and /v1's per-instance outputs laid out as v2
 * tensors. Nothing here computes: every number of a v2 answer is the very
 * JSON value /v1 would have printed, so the two answers hold the same
 * bytes for the same instance.
 *
 * One input, INSTANCE (BYTES, shape [N]): each element one /v1 instance as
 * a JSON string. Outputs: LOGITS FP32, LABEL BYTES, PATH_SCORE FP32,
 * OUTPUT_TOKENS BYTES, HIDDEN FP32 and OFFSETS INT64 [N + 1], whose rows
 * i are OFFSETS[i] .. OFFSETS[i + 1] of every per-node or per-token
 * tensor. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "bodyscan.h"
#include "serve_impl.h"

#ifndef CANOPY_VERSION
#define CANOPY_VERSION "dev"
#endif

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

static const struct {
  const char *name, *dtype;
  unsigned bit;
} OUTPUTS[] = {{"LOGITS", "FP32", CN__V2_LOGITS},
               {"LABEL", "BYTES", CN__V2_LABEL},
               {"PATH_SCORE", "FP32", CN__V2_PATH_SCORE},
               {"OUTPUT_TOKENS", "BYTES", CN__V2_OUTPUT_TOKENS},
               {"HIDDEN", "FP32", CN__V2_HIDDEN},
               {"OFFSETS", "INT64", CN__V2_OFFSETS}};
enum { N_OUTPUTS = sizeof(OUTPUTS) / sizeof(OUTPUTS[0]) };

/* ---- metadata ---------------------------------------------------------- */

/* What a model's answers hold, from its description (cn_model_describe). */
typedef struct sig {
  const char *family, *input;
  long long classes;  /* LOGITS' width                                   */
  long long hidden;   /* HIDDEN's: "hidden", twice where the input is read
                         both ways (bilstm-tagger, cells "bisequence"); a
                         test checks it against the answers              */
  unsigned outputs;   /* CN__V2_* the model can answer                   */
} sig;

static const char *dstr(const json_t *d, const char *key) {
  const char *v = json_string_value(json_object_get(d, key));
  return v ? v : "";
}

static void model_sig(const cn__model_entry *me, sig *g) {
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

static json_t *tensor_meta(const char *name, const char *dtype, long long d0,
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

json_t *cn__kserve_server_meta(void) {
  json_t *ext = json_array();
  json_array_append_new(ext, json_string("model_repository"));
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string("canopy"));
  json_object_set_new(o, "version", json_string(CANOPY_VERSION));
  json_object_set_new(o, "extensions", ext);
  return o;
}

/* GET /v2/models/{m}: rows are -1 (they follow the instances), widths are
 * the model's. */
json_t *cn__kserve_model_meta(const cn__model_entry *me) {
  sig g;
  model_sig(me, &g);
  json_t *ins = json_array(), *outs = json_array(), *vers = json_array();
  json_array_append_new(ins, tensor_meta("INSTANCE", "BYTES", -1, -1));
  for (int i = 0; i < N_OUTPUTS; i++) {
    unsigned b = OUTPUTS[i].bit;
    if (!(g.outputs & b)) continue;
    long long w = b == CN__V2_LOGITS ? g.classes
                  : b == CN__V2_HIDDEN ? g.hidden : -1;
    json_array_append_new(outs, tensor_meta(OUTPUTS[i].name, OUTPUTS[i].dtype,
                                            -1, w));
  }
  json_array_append_new(vers, json_string(me->version));
  char platform[96];
  snprintf(platform, sizeof(platform), "canopy_%s", g.family);
  json_t *par = json_object();
  json_object_set_new(par, "family", json_string(g.family));
  json_object_set_new(par, "input", json_string(g.input));
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(me->name));
  json_object_set_new(o, "versions", vers);
  json_object_set_new(o, "platform", json_string(platform));
  json_object_set_new(o, "inputs", ins);
  json_object_set_new(o, "outputs", outs);
  json_object_set_new(o, "parameters", par);
  return o;
}

/* ---- the request ------------------------------------------------------- */

#define BAD(e, ...) cn_err_set((e), CN_E_BAD_INSTANCE, __VA_ARGS__)

static int request_id(const json_t *j, cn__parsed *p, cn_err *e) {
  const json_t *id = json_object_get(j, "id");
  if (id == NULL) return 0;
  if (!json_is_string(id))
    return BAD(e, "\"id\" must be a string");
  p->v2_id = strdup(json_string_value(id));
  return p->v2_id ? 0 : cn_err_set(e, CN_E_NOMEM, "no memory");
}

/* The names the model answers, for a message: "LOGITS, LABEL, ...". */
static void output_names(unsigned outputs, char *buf, size_t cap) {
  buf[0] = '\0';
  for (int i = 0; i < N_OUTPUTS; i++)
    if (outputs & OUTPUTS[i].bit)
      snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s",
               buf[0] ? ", " : "", OUTPUTS[i].name);
}

/* "outputs": [{"name": ...}]: which tensors to answer (*want, 0: all). */
static int requested_outputs(const cn__model_entry *me, const json_t *j,
                             unsigned *want, cn_err *e) {
  const json_t *outs = json_object_get(j, "outputs"), *o;
  size_t i;
  sig g;
  model_sig(me, &g);
  if (outs == NULL) return 0;
  if (!json_is_array(outs))
    return BAD(e, "\"outputs\" must be an array of {\"name\": ...}");
  json_array_foreach(outs, i, o) {
    const char *name = json_string_value(json_object_get(o, "name"));
    const json_t *par = json_object_get(o, "parameters");
    if (name == NULL)
      return BAD(e, "\"outputs\"[%zu] must be an object with a \"name\"", i);
    if (json_is_true(json_object_get(par, "binary_data")))
      return BAD(e, "output %.64s: binary tensor data is not supported", name);
    unsigned bit = 0;
    for (int k = 0; k < N_OUTPUTS; k++)
      if (strcmp(name, OUTPUTS[k].name) == 0) bit = OUTPUTS[k].bit;
    if (!(bit & g.outputs)) {
      char names[128];
      output_names(g.outputs, names, sizeof(names));
      return cn_err_set(e, CN_E_BAD_INSTANCE, "unknown output '%.64s': "
                        "model '%s' answers %s", name, me->name, names);
    }
    *want |= bit;
  }
  return 0;
}

/* The one input tensor, INSTANCE (BYTES, shape [N]): its data in *data. */
static int instance_input(const cn__model_entry *me, const json_t *j,
                          const json_t **data, cn_err *e) {
  const json_t *ins = json_object_get(j, "inputs"), *in;
  size_t i;
  *data = NULL;
  if (!json_is_array(ins) || json_array_size(ins) == 0)
    return BAD(e, "\"inputs\" must be an array holding the tensor INSTANCE "
               "(BYTES, shape [N])");
  json_array_foreach(ins, i, in) {
    const char *name = json_string_value(json_object_get(in, "name"));
    if (name == NULL)
      return BAD(e, "\"inputs\"[%zu] must be an object with a \"name\"", i);
    if (strcmp(name, "INSTANCE") != 0)
      return cn_err_set(e, CN_E_BAD_INSTANCE, "unknown input '%.64s': model "
                        "'%s' takes one input, INSTANCE (BYTES, shape [N])",
                        name, me->name);
    if (*data != NULL)
      return BAD(e, "the input INSTANCE is given twice");
    const char *dt = json_string_value(json_object_get(in, "datatype"));
    if (dt == NULL || strcmp(dt, "BYTES") != 0)
      return BAD(e, "input INSTANCE has datatype %.32s; it is BYTES (each "
                 "element one instance as a JSON string)", dt ? dt : "(none)");
    const json_t *par = json_object_get(in, "parameters");
    if (json_object_get(par, "binary_data_size") != NULL)
      return BAD(e, "binary tensor data is not supported: send INSTANCE's "
                 "\"data\" as JSON");
    const json_t *shape = json_object_get(in, "shape");
    const json_t *d = json_object_get(in, "data");
    if (!json_is_array(shape) || json_array_size(shape) != 1 ||
        !json_is_integer(json_array_get(shape, 0)))
      return BAD(e, "input INSTANCE's shape must be [N], N the number of "
                 "instances");
    long long n = json_integer_value(json_array_get(shape, 0));
    if (!json_is_array(d))
      return BAD(e, "input INSTANCE's \"data\" must be an array");
    if (n != (long long)json_array_size(d))
      return cn_err_set(e, CN_E_BAD_INSTANCE, "input INSTANCE has shape "
                        "[%lld] but %zu elements in \"data\"", n,
                        json_array_size(d));
    if (n == 0) return BAD(e, "input INSTANCE is empty (shape [0])");
    *data = d;
  }
  return 0;
}

/* Counts every element's containers before jansson builds them: the
 * /v1 request they make, {"instances": [...]}, is held to /v1's bounds
 * (infer.c). */
static int check_element_counts(const cn__server *s, const json_t *data,
                                cn_err *e) {
  cn__body_counts k = {.objects = 1, .arrays = 1,
                       .instances = json_array_size(data)};
  const json_t *v;
  size_t i;
  json_array_foreach(data, i, v) {
    if (!json_is_string(v))
      return BAD(e, "INSTANCE[%zu] is not a string: each element is one "
                 "instance as a JSON string (BYTES)", i);
    cn__body_counts c;
    cn__body_scan(json_string_value(v), json_string_length(v), &c);
    k.objects += c.objects;
    k.arrays += c.arrays;
  }
  return cn__infer_check_counts(s, &k, e);
}

/* Each element's JSON text, parsed as /v1 parses a body. */
static int parse_elements(const json_t *data, json_t *insts, cn_err *e) {
  const json_t *v;
  size_t i;
  json_array_foreach(data, i, v) {
    json_error_t je;
    json_t *inst = json_loadb(json_string_value(v), json_string_length(v),
                              JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
                              &je);
    if (inst == NULL || !json_is_object(inst)) {
      json_decref(inst);
      int rc = cn_err_set(e, inst ? CN_E_BAD_INSTANCE : CN_E_BAD_JSON,
                          "INSTANCE[%zu] %s%s", i,
                          inst ? "must hold a JSON object (an instance as "
                                 "in /v1)"
                               : "is not valid JSON: ",
                          inst ? "" : je.text);
      e->instance = (int)i;
      if (inst == NULL) e->offset = je.position;
      return rc;
    }
    json_array_append_new(insts, inst);
  }
  return 0;
}

/* "parameters" carry /v1's options; asking for HIDDEN is return_hidden. */
static int copy_parameters(const json_t *j, json_t *v1, unsigned want,
                           cn_err *e) {
  static const char *const keys[] = {"outputs", "return_hidden",
                                     "timeout_ms", "max_decode_len"};
  const json_t *par = json_object_get(j, "parameters");
  if (par != NULL && !json_is_object(par))
    return BAD(e, "\"parameters\" must be an object");
  if (json_is_true(json_object_get(par, "binary_data_output")))
    return BAD(e, "binary tensor data is not supported "
               "(binary_data_output)");
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    json_t *v = json_object_get(par, keys[i]);
    if (v != NULL) json_object_set(v1, keys[i], v);
  }
  if (!(want & CN__V2_HIDDEN)) return 0;
  if (json_is_false(json_object_get(v1, "return_hidden")))
    return BAD(e, "HIDDEN is asked for in \"outputs\" but "
               "parameters.return_hidden is false");
  json_object_set_new(v1, "return_hidden", json_true());
  return 0;
}

int cn__kserve_request(const cn__req *r, const json_t *j, json_t **v1,
                       cn__parsed *p, cn_err *e) {
  const json_t *data;
  json_t *o = json_object(), *insts = json_array();
  int rc;
  *v1 = NULL;
  json_object_set_new(o, "instances", insts);
  if ((rc = request_id(j, p, e)) != 0 ||
      (rc = requested_outputs(r->me, j, &p->v2_outputs, e)) != 0 ||
      (rc = instance_input(r->me, j, &data, e)) != 0 ||
      (rc = check_element_counts(r->srv, data, e)) != 0 ||
      (rc = parse_elements(data, insts, e)) != 0 ||
      (rc = copy_parameters(j, o, p->v2_outputs, e)) != 0) {
    json_decref(o);
    return rc;
  }
  *v1 = o;
  return 0;
}

/* ---- the answer -------------------------------------------------------- */

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
  tensor t[N_OUTPUTS]; /* in OUTPUTS' order */
  json_t *offsets;
} answer;

static tensor *tens(answer *a, unsigned bit) {
  for (int i = 0; i < N_OUTPUTS; i++)
    if (OUTPUTS[i].bit == bit) return &a->t[i];
  return &a->t[N_OUTPUTS - 1];
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
  json_t *t = tensor_meta(name, dtype, (long long)rows, width);
  json_object_set(t, "data", data);
  return t;
}

/* The tensors that answer: those asked for (all by default) that every
 * instance has, then OFFSETS beside any tensor of rows per node or token
 * (or when asked for). Returns -1 on rows that do not add up. */
static int emit(answer *a, unsigned want, size_t n, size_t total,
                const sig *g, json_t *outs) {
  bool need_offsets = (want & CN__V2_OFFSETS) != 0;
  for (int i = 0; i < N_OUTPUTS; i++) {
    tensor *t = &a->t[i];
    unsigned b = OUTPUTS[i].bit;
    if (b == CN__V2_OFFSETS || !t->present || t->missing) continue;
    if (t->ragged || t->rows != (t->per_row ? total : n)) return -1;
    if (want != 0 && !(want & b)) continue;
    need_offsets |= t->per_row;
    long long w = b == CN__V2_LOGITS   ? (t->rows ? (long long)t->width
                                                  : g->classes)
                  : b == CN__V2_HIDDEN ? (t->rows ? (long long)t->width
                                                  : g->hidden)
                                       : -1;
    json_array_append_new(outs, tensor_json(OUTPUTS[i].name, OUTPUTS[i].dtype,
                                            t->rows, w, t->data));
  }
  if (need_offsets)
    json_array_append_new(outs, tensor_json("OFFSETS", "INT64", n + 1, -1,
                                            a->offsets));
  return 0;
}

static void answer_free(answer *a) {
  for (int i = 0; i < N_OUTPUTS; i++) json_decref(a->t[i].data);
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
  sig g;
  size_t n = json_array_size(outs), total = 0, i;
  const json_t *o;
  memset(&a, 0, sizeof(a));
  model_sig(me, &g);
  for (int k = 0; k < N_OUTPUTS; k++) a.t[k].data = json_array();
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
  char *b = rc == 0 ? json_dumps(v2, DUMP_FLAGS)
                    : internal_error(me->name, status);
  json_decref(v2);
  if (rc == 0) *status = 200;
  return b;
}

/* The loop: /v1's {"error": {"code", "message", "instance"?, ...}} as
 * v2's {"error": message}, the message naming the INSTANCE element where
 * /v1 said it in a field of its own (takes body). */
char *cn__kserve_error(char *body) {
  json_t *j = body ? json_loads(body, 0, NULL) : NULL;
  const json_t *err = json_object_get(j, "error");
  const char *msg = json_string_value(json_object_get(err, "message"));
  const json_t *inst = json_object_get(err, "instance");
  if (msg == NULL) {
    json_decref(j);
    return body;
  }
  bool named = strncmp(msg, "INSTANCE[", 9) == 0 ||
               (strncmp(msg, "instance ", 9) == 0 && isdigit((unsigned char)msg[9]));
  json_t *o = json_object();
  if (json_is_integer(inst) && !named)
    json_object_set_new(o, "error", json_sprintf("INSTANCE[%lld]: %s",
                        (long long)json_integer_value(inst), msg));
  else
    json_object_set_new(o, "error", json_string(msg));
  char *b = json_dumps(o, DUMP_FLAGS);
  json_decref(o);
  json_decref(j);
  if (b == NULL) return body;
  free(body);
  return b;
}
