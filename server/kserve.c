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
 * tensor (laid out by kserve_answer.c). */
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

/* "outputs": [{"name": ...}]: which tensors to answer (*want, 0: all). */
static int requested_outputs(const cn__model_entry *me, const json_t *j,
                             unsigned *want, cn_err *e) {
  const json_t *outs = json_object_get(j, "outputs"), *o;
  size_t i;
  cn__v2_sig g;
  cn__v2_model_sig(me, &g);
  if (outs == NULL) return 0;
  if (!json_is_array(outs))
    return BAD(e, "\"outputs\" must be an array of {\"name\": ...}");
  json_array_foreach(outs, i, o) {
    const char *name = json_string_value(json_object_get(o, "name"));
    const json_t *par = json_object_get(o, "parameters");
    if (name == NULL)
      return BAD(e, "\"outputs\"[%zu] must be an object with a \"name\"", i);
    const json_t *bd = json_object_get(par, "binary_data");
    if (bd != NULL && !json_is_boolean(bd))
      return BAD(e, "output %.64s: \"binary_data\" must be a boolean", name);
    if (json_is_true(bd))
      return BAD(e, "output %.64s: binary tensor data is not supported", name);
    unsigned bit = 0;
    for (int k = 0; k < CN__V2_N_OUTPUTS; k++)
      if (strcmp(name, cn__v2_outputs[k].name) == 0)
        bit = cn__v2_outputs[k].bit;
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
  return cn__limits_check_counts(s, &k, e);
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
  const json_t *bdo = json_object_get(par, "binary_data_output");
  if (bdo != NULL && !json_is_boolean(bdo))
    return BAD(e, "\"binary_data_output\" must be a boolean");
  if (json_is_true(bdo))
    return BAD(e, "binary tensor data is not supported "
               "(binary_data_output)");
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
