/* kserve.c - the Open Inference Protocol (KServe v2) over HTTP, as a
 * mapping onto /v1 (docs/api.md "Open Inference Protocol"): metadata from
 * what the model describes, a request turned into the /v1 request it asks
 * for (then parsed, checked, batched and run by /v1's own path: infer.c,
 * window.c, worker.c), and /v1's per-instance outputs laid out as v2
 * tensors. Nothing here computes: every number of a v2 answer is the very
 * JSON value /v1 would have printed, so the two answers hold the same
 * bytes for the same instance.
 *
 * One input, INSTANCE (BYTES, shape [N] or [N, 1]): each element one /v1
 * instance as a JSON string, in the JSON body or as binary tensor data
 * after it (Triton's binary tensor data extension: a JSON header of
 * Inference-Header-Content-Length bytes, then each element as a 4-byte
 * little-endian length and its bytes). Outputs: LOGITS FP32, LABEL BYTES,
 * PATH_SCORE FP32, OUTPUT_TOKENS BYTES, HIDDEN FP32 and OFFSETS INT64
 * [N + 1], whose rows i are OFFSETS[i] .. OFFSETS[i + 1] of every per-node
 * or per-token tensor (laid out by kserve_answer.c), each in JSON or as
 * binary data, LOGITS and HIDDEN also as their top K classes
 * (classification), as the request asks. */
#include <stdlib.h>
#include <string.h>

#include "bodyscan.h"
#include "kserve_impl.h"
#include "handlers.h"

#ifndef CANOPY_VERSION
#define CANOPY_VERSION "dev"
#endif

/* ---- metadata ---------------------------------------------------------- */

json_t *cn__kserve_server_meta(void) {
  json_t *ext = json_array();
  json_array_append_new(ext, json_string("model_repository"));
  json_array_append_new(ext, json_string("model_configuration"));
  json_array_append_new(ext, json_string("statistics"));
  json_array_append_new(ext, json_string("binary_tensor_data"));
  json_array_append_new(ext, json_string("classification"));
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string("canopy"));
  json_object_set_new(o, "version", json_string(CANOPY_VERSION));
  json_object_set_new(o, "extensions", ext);
  return o;
}

/* GET /v2/models/{m}: rows are -1 (they follow the instances), widths are
 * the model's. */
json_t *cn__kserve_model_meta(const cn__model_entry *me) {
  cn__v2_sig g;
  cn__v2_model_sig(me, &g);
  json_t *ins = json_array(), *outs = json_array(), *vers = json_array();
  json_array_append_new(ins, cn__v2_tensor_meta("INSTANCE", "BYTES", -1, -1));
  for (int i = 0; i < CN__V2_N_OUTPUTS; i++) {
    unsigned b = cn__v2_outputs[i].bit;
    if (!(g.outputs & b)) continue;
    long long w = b == CN__V2_LOGITS ? g.classes
                  : b == CN__V2_HIDDEN ? g.hidden : -1;
    const cn__v2_output *d = &cn__v2_outputs[i];
    json_array_append_new(outs, cn__v2_tensor_meta(d->name, d->dtype, -1, w));
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

/* The binary tensor data extension: the body's first
 * Inference-Header-Content-Length bytes are its JSON, the rest the
 * tensors' bytes. */
int cn__kserve_header_len(const cn__req *r, size_t len, size_t *json_len,
                          cn_err *e) {
  *json_len = len;
  if (r->v2_hlen == -1) return 0;
  if (r->v2_hlen < 0)
    return cn_err_set(e, CN_E_BAD_REQUEST, "Inference-Header-Content-Length "
                      "must be a byte count: the length of the body's JSON "
                      "header, before the tensors' binary data");
  if ((unsigned long long)r->v2_hlen > len)
    return cn_err_set(e, CN_E_BAD_REQUEST, "Inference-Header-Content-Length "
                      "is %lld but the body has %zu bytes%s", r->v2_hlen, len,
                      r->body_enc != 0 ? " once inflated" : "");
  *json_len = (size_t)r->v2_hlen;
  return 0;
}

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
  for (int i = 0; i < CN__V2_N_OUTPUTS; i++)
    if (outputs & cn__v2_outputs[i].bit)
      snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s",
               buf[0] ? ", " : "", cn__v2_outputs[i].name);
}

/* A boolean parameter: 0, 1, or -1 (absent); a non-boolean is an error. */
static int bool_param(const json_t *par, const char *key, const char *where,
                      int *v, cn_err *e) {
  const json_t *b = json_object_get(par, key);
  *v = b == NULL ? -1 : json_is_true(b);
  if (b != NULL && !json_is_boolean(b))
    return BAD(e, "%s parameters.%s must be true or false", where, key);
  return 0;
}

/* An output's "classification": K, its top K as "value:index[:label]"
 * (Triton's classification extension), on the outputs of scores. */
static int classification(const json_t *par, const char *name, unsigned bit,
                          int *topk, cn_err *e) {
  const json_t *c = json_object_get(par, "classification");
  if (c == NULL) return 0;
  if (!json_is_integer(c) || json_integer_value(c) < 0 ||
      json_integer_value(c) > 1 << 20)
    return BAD(e, "output %.64s: parameters.classification must be an "
               "integer in [0, %d], the number of classes to answer", name,
               1 << 20);
  if (json_integer_value(c) == 0) return 0; /* none, as tritonclient's 0 */
  if (bit != CN__V2_LOGITS && bit != CN__V2_HIDDEN)
    return BAD(e, "output %.64s: classification applies to LOGITS and "
               "HIDDEN (rows of FP32 scores)", name);
  *topk = (int)json_integer_value(c);
  return 0;
}

/* "outputs": [{"name": ..., "parameters": {"binary_data",
 * "classification"}}]: which tensors to answer (p->v2_outputs, 0: all),
 * which of them in binary (binary_data, else the request's
 * binary_data_output) and which as classes. */
static int requested_outputs(const cn__model_entry *me, const json_t *j,
                             cn__parsed *p, cn_err *e) {
  const json_t *outs = json_object_get(j, "outputs"), *o;
  const json_t *rpar = json_object_get(j, "parameters");
  size_t i;
  int all_binary;
  cn__v2_sig g;
  cn__v2_model_sig(me, &g);
  if (rpar != NULL && !json_is_object(rpar))
    return BAD(e, "\"parameters\" must be an object");
  int rc = bool_param(rpar, "binary_data_output", "the request's",
                      &all_binary, e);
  if (rc != 0) return rc;
  /* every output, those answered unasked (OFFSETS) too, unless one says
   * otherwise */
  p->v2_binary = all_binary == 1 ? ~0u : 0;
  if (outs == NULL) return 0;
  if (!json_is_array(outs))
    return BAD(e, "\"outputs\" must be an array of {\"name\": ...}");
  json_array_foreach(outs, i, o) {
    const char *name = json_string_value(json_object_get(o, "name"));
    const json_t *par = json_object_get(o, "parameters");
    if (name == NULL)
      return BAD(e, "\"outputs\"[%zu] must be an object with a \"name\"", i);
    if (par != NULL && !json_is_object(par))
      return BAD(e, "output %.64s: \"parameters\" must be an object", name);
    int k = 0;
    while (k < CN__V2_N_OUTPUTS && strcmp(name, cn__v2_outputs[k].name) != 0)
      k++;
    unsigned bit = k < CN__V2_N_OUTPUTS ? cn__v2_outputs[k].bit : 0;
    if (!(bit & g.outputs)) {
      char names[128];
      output_names(g.outputs, names, sizeof(names));
      return cn_err_set(e, CN_E_BAD_INSTANCE, "unknown output '%.64s': "
                        "model '%s' answers %s", name, me->name, names);
    }
    if (p->v2_outputs & bit)
      return BAD(e, "output %.64s is asked for twice", name);
    char where[80];
    snprintf(where, sizeof(where), "output %.64s", name);
    int bin;
    if ((rc = bool_param(par, "binary_data", where, &bin, e)) != 0 ||
        (rc = classification(par, name, bit, &p->v2_topk[k], e)) != 0)
      return rc;
    if (bin == 1) p->v2_binary |= bit;
    if (bin == 0) p->v2_binary &= ~bit;
    p->v2_outputs |= bit;
  }
  return 0;
}

/* One element of INSTANCE: one instance's JSON text. */
typedef struct span {
  const char *p;
  size_t n;
} span;

/* INSTANCE's elements from its binary data (Triton's binary tensor data
 * extension): each a 4-byte little-endian length, then that many bytes.
 * n elements fill size bytes exactly. */
static int binary_elements(const char *b, size_t size, long long n,
                           span *els, cn_err *e) {
  size_t off = 0;
  for (long long i = 0; i < n; i++) {
    if (size - off < 4)
      return BAD(e, "input INSTANCE's binary data (binary_data_size %zu) "
                 "ends inside element %lld's 4-byte length: it holds fewer "
                 "than the %lld elements its shape says", size, i, n);
    const unsigned char *u = (const unsigned char *)b + off;
    size_t len = (size_t)u[0] | (size_t)u[1] << 8 | (size_t)u[2] << 16 |
                 (size_t)u[3] << 24;
    off += 4;
    if (len > size - off)
      return BAD(e, "INSTANCE[%lld]'s 4-byte length says %zu bytes but "
                 "%zu remain of the tensor's binary_data_size %zu", i, len,
                 size - off, size);
    els[i].p = b + off;
    els[i].n = len;
    off += len;
  }
  if (off != size)
    return BAD(e, "input INSTANCE's binary_data_size is %zu bytes but its "
               "%lld elements (shape) take %zu: %zu bytes left over", size,
               n, off, size - off);
  return 0;
}

/* INSTANCE's elements from its JSON "data": flat ([N] or [N, 1]
 * row-major) or nested ([N, 1] as [[s], ...]). */
static int json_elements(const json_t *d, long long n, span *els,
                         cn_err *e) {
  for (long long i = 0; i < n; i++) {
    const json_t *v = json_array_get(d, (size_t)i);
    if (json_is_array(v) && json_array_size(v) == 1)
      v = json_array_get(v, 0); /* [N, 1], nested */
    if (!json_is_string(v)) {
      int rc = BAD(e, "INSTANCE[%lld] is not a string: each element is one "
                   "instance as a JSON string (BYTES)", i);
      e->instance = (int)i;
      return rc;
    }
    els[i].p = json_string_value(v);
    els[i].n = json_string_length(v);
  }
  return 0;
}

/* The one input tensor, INSTANCE (BYTES, shape [N] or [N, 1]): its N
 * elements in *els (malloc'd; they point into j or the body). bin: the
 * bytes after the JSON header. */
static int instance_input(const cn__model_entry *me, const json_t *j,
                          const char *bin, size_t bin_len, span **els,
                          long long *n_els, cn_err *e) {
  const json_t *ins = json_object_get(j, "inputs"), *in, *found = NULL;
  size_t i, used = 0;
  *els = NULL;
  *n_els = 0;
  if (!json_is_array(ins) || json_array_size(ins) == 0)
    return BAD(e, "\"inputs\" must be an array holding the tensor INSTANCE "
               "(BYTES, shape [N] or [N, 1])");
  json_array_foreach(ins, i, in) {
    const char *name = json_string_value(json_object_get(in, "name"));
    if (name == NULL)
      return BAD(e, "\"inputs\"[%zu] must be an object with a \"name\"", i);
    if (strcmp(name, "INSTANCE") != 0)
      return cn_err_set(e, CN_E_BAD_INSTANCE, "unknown input '%.64s': model "
                        "'%s' takes one input, INSTANCE (BYTES, shape [N] "
                        "or [N, 1])",
                        name, me->name);
    if (found != NULL)
      return BAD(e, "the input INSTANCE is given twice");
    found = in;
  }
  in = found;
  const char *dt = json_string_value(json_object_get(in, "datatype"));
  if (dt == NULL || strcmp(dt, "BYTES") != 0)
    return BAD(e, "input INSTANCE has datatype %.32s; it is BYTES (each "
               "element one instance as a JSON string)", dt ? dt : "(none)");
  const json_t *shape = json_object_get(in, "shape");
  size_t rank = json_array_size(shape);
  if (!json_is_array(shape) || rank < 1 || rank > 2 ||
      !json_is_integer(json_array_get(shape, 0)) ||
      (rank == 2 && (!json_is_integer(json_array_get(shape, 1)) ||
                     json_integer_value(json_array_get(shape, 1)) != 1)))
    return BAD(e, "input INSTANCE's shape must be [N] or [N, 1], N the "
               "number of instances");
  long long n = json_integer_value(json_array_get(shape, 0));
  const char *sh = rank == 2 ? ", 1" : "";
  const json_t *par = json_object_get(in, "parameters");
  const json_t *bsz = json_object_get(par, "binary_data_size");
  const json_t *d = json_object_get(in, "data");
  if (bsz != NULL) { /* binary tensor data */
    if (!json_is_integer(bsz) || json_integer_value(bsz) < 0)
      return BAD(e, "input INSTANCE's parameters.binary_data_size must be "
                 "an integer >= 0 (bytes)");
    if (d != NULL)
      return BAD(e, "input INSTANCE has both \"data\" and "
                 "parameters.binary_data_size: send one");
    long long size = json_integer_value(bsz);
    if ((unsigned long long)size > bin_len)
      return BAD(e, "input INSTANCE's binary_data_size %lld runs past the "
                 "body's end: %zu bytes follow the JSON header "
                 "(Inference-Header-Content-Length)", size, bin_len);
    if (n < 0 || n > size / 4)
      return BAD(e, "input INSTANCE has shape [%lld%s] but its binary data "
                 "(%lld bytes, 4 or more an element) cannot hold that many "
                 "elements", n, sh, size);
    used = (size_t)size;
  } else {
    if (!json_is_array(d))
      return BAD(e, "input INSTANCE's \"data\" must be an array (or send "
                 "it as binary data with parameters.binary_data_size)");
    if (n != (long long)json_array_size(d))
      return cn_err_set(e, CN_E_BAD_INSTANCE, "input INSTANCE has shape "
                        "[%lld%s] but %zu elements in \"data\"", n, sh,
                        json_array_size(d));
  }
  if (used != bin_len)
    return BAD(e, "the body has %zu bytes after its JSON header "
               "(Inference-Header-Content-Length) but its inputs' "
               "binary_data_size add up to %zu", bin_len, used);
  if (n == 0) return BAD(e, "input INSTANCE is empty (shape [0%s])", sh);
  span *s = calloc((size_t)n, sizeof(*s));
  if (s == NULL)
    return cn_err_set(e, CN_E_NOMEM, "no memory for %lld elements", n);
  int rc = bsz != NULL ? binary_elements(bin, used, n, s, e)
                       : json_elements(d, n, s, e);
  if (rc != 0) {
    free(s);
    return rc;
  }
  *els = s;
  *n_els = n;
  return 0;
}

/* Counts every element's containers before jansson builds them: the
 * /v1 request they make, {"instances": [...]}, is held to /v1's bounds
 * (infer.c). */
static int check_element_counts(const cn__server *s, const span *els,
                                long long n, cn_err *e) {
  cn__body_counts k = {.objects = 1, .arrays = 1, .instances = (size_t)n};
  for (long long i = 0; i < n; i++) {
    cn__body_counts c;
    cn__body_scan(els[i].p, els[i].n, &c);
    k.objects += c.objects;
    k.arrays += c.arrays;
  }
  return cn__limits_check_counts(s, &k, e);
}

/* Each element's JSON text, parsed as /v1 parses a body. */
static int parse_elements(const span *els, long long n, json_t *insts,
                          cn_err *e) {
  for (long long i = 0; i < n; i++) {
    json_error_t je;
    json_t *inst = json_loadb(els[i].p, els[i].n,
                              JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (inst == NULL || !json_is_object(inst)) {
      json_decref(inst);
      int rc = cn_err_set(e, inst ? CN_E_BAD_INSTANCE : CN_E_BAD_JSON,
                          "INSTANCE[%lld] %s%s", i,
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
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    json_t *v = json_object_get(par, keys[i]);
    if (v != NULL) json_object_set(v1, keys[i], v);
  }
  if (!(want & CN__V2_HIDDEN)) return 0;
  const json_t *rh = json_object_get(v1, "return_hidden");
  /* a return_hidden that is no boolean is left for /v1's check to refuse
   * ("must be a boolean"), with HIDDEN asked for or not: it once became
   * true here, and "yes" was 200 with HIDDEN, 400 without */
  if (rh != NULL && !json_is_boolean(rh)) return 0;
  if (json_is_false(rh))
    return BAD(e, "HIDDEN is asked for in \"outputs\" but "
               "parameters.return_hidden is false");
  json_object_set_new(v1, "return_hidden", json_true());
  return 0;
}

int cn__kserve_request(const cn__req *r, const json_t *j, const char *bin,
                       size_t bin_len, json_t **v1, cn__parsed *p,
                       cn_err *e) {
  span *els = NULL;
  long long n = 0;
  json_t *o = json_object(), *insts = json_array();
  int rc;
  *v1 = NULL;
  json_object_set_new(o, "instances", insts);
  if ((rc = request_id(j, p, e)) != 0 ||
      (rc = requested_outputs(r->me, j, p, e)) != 0 ||
      (rc = instance_input(r->me, j, bin, bin_len, &els, &n, e)) != 0 ||
      (rc = check_element_counts(r->srv, els, n, e)) != 0 ||
      (rc = parse_elements(els, n, insts, e)) != 0 ||
      (rc = copy_parameters(j, o, p->v2_outputs, e)) != 0) {
    free(els);
    json_decref(o);
    return rc;
  }
  free(els);
  *v1 = o;
  return 0;
}

/* What a v2 answer may hold beyond the /v1 values infer.c's bound counts
 * (values: that bound): classification strings, each a value's text
 * (counted), its index and its label, K a row of at most every node or
 * token; binary data, where an OFFSETS element takes 8 bytes and a BYTES
 * element one more than its quoted JSON; the compressed form's overhead
 * (zlib's deflateBound, generously). */
long long cn__kserve_answer_extra(const cn__req *r, const cn__parsed *p,
                                  long long values) {
  long long x = 0, rows = (long long)p->vertices + p->n_inst;
  size_t label = 0, k;
  const json_t *l;
  cn__v2_sig g;
  cn__v2_model_sig(r->me, &g);
  json_array_foreach(json_object_get(r->me->describe, "labels"), k, l)
    if (json_string_length(l) > label) label = json_string_length(l);
  for (int i = 0; i < CN__V2_N_OUTPUTS; i++) {
    bool logits = cn__v2_outputs[i].bit == CN__V2_LOGITS;
    long long w = logits ? g.classes : g.hidden;
    long long topk = p->v2_topk[i] < w ? p->v2_topk[i] : w;
    if (topk > 0) x += rows * topk * (24 + (logits ? (long long)label : 0));
  }
  if (p->v2_binary != 0)
    x += (values + x) / 3 + 8 * (long long)(p->n_inst + 1) +
         64 * CN__V2_N_OUTPUTS;
  if (r->answer_enc != 0) x += (values + x) / 512 + 64;
  return x;
}
