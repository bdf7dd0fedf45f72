/* grpc_request.c - a gRPC call's protobuf message as the HTTP/1.1 request
 * to /v2 it asks for (cn__grpc_request), which grpc.c hands to an
 * in-memory connection; grpc_service.c turns the answer back.
 *
 * ModelInfer: the inputs go as Triton's binary tensor data (each input's
 * raw_input_contents, or its contents.bytes_contents as 4-byte
 * little-endian lengths and bytes), every output is asked for as binary
 * data, and "parameters" go as /v2's JSON parameters. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "grpc.h"
#include "grpc_service_impl.h"

/* ---- a growing buffer -------------------------------------------------- */

typedef struct gbuf {
  char *p;
  size_t len, cap;
  bool oom;
} gbuf;

static void gb_add(gbuf *b, const void *d, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (q == NULL) {
      b->oom = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, d, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void gb_str(gbuf *b, const char *s) { gb_add(b, s, strlen(s)); }

/* A path segment, percent-encoded (the daemon decodes paths once). */
static void gb_seg(gbuf *b, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (isalnum(*p) || strchr("-._~", *p) != NULL) {
      gb_add(b, p, 1);
    } else {
      char e[4];
      snprintf(e, sizeof(e), "%%%02X", *p);
      gb_add(b, e, 3);
    }
  }
}

/* ---- requests ---------------------------------------------------------- */

/* A header value the HTTP parser takes: printable ASCII only (else left
 * out: the daemon then makes its own request id, or refuses the token). */
static bool header_ok(const char *v) {
  if (v[0] == '\0') return false;
  for (const unsigned char *p = (const unsigned char *)v; *p; p++)
    if (*p < 0x20 || *p > 0x7e) return false;
  return true;
}

/* The request line and headers; the body (blen bytes, hlen of them JSON
 * when the body carries binary tensor data, else -1) follows. */
static void http_head(gbuf *b, const char *method, const gbuf *path,
                      const cn__grpc_meta *meta, size_t blen, long long hlen) {
  char line[128];
  gb_str(b, method);
  gb_str(b, " ");
  gb_add(b, path->p, path->len);
  gb_str(b, " HTTP/1.1\r\nHost: grpc\r\n");
  if (meta != NULL && header_ok(meta->request_id)) {
    gb_str(b, "X-Request-Id: ");
    gb_str(b, meta->request_id);
    gb_str(b, "\r\n");
  }
  if (meta != NULL && header_ok(meta->authorization)) {
    gb_str(b, "Authorization: ");
    gb_str(b, meta->authorization);
    gb_str(b, "\r\n");
  }
  if (strcmp(method, "POST") == 0) {
    snprintf(line, sizeof(line), "Content-Length: %zu\r\n", blen);
    gb_str(b, line);
  }
  if (hlen >= 0) {
    snprintf(line, sizeof(line),
             "Inference-Header-Content-Length: %lld\r\n", hlen);
    gb_str(b, line);
  }
  gb_str(b, "\r\n");
}

/* /v2/models/{name}[/versions/{v}] */
static int model_path(gbuf *p, const char *name, const char *version,
                      char *err, size_t cap) {
  if (name == NULL || name[0] == '\0') {
    snprintf(err, cap, "the model name is empty: name the model to call");
    return CN__GRPC_INVALID_ARGUMENT;
  }
  gb_str(p, "/v2/models/");
  gb_seg(p, name);
  if (version != NULL && version[0] != '\0') {
    gb_str(p, "/versions/");
    gb_seg(p, version);
  }
  return 0;
}

/* An InferParameter as /v2's JSON parameter value. */
static json_t *param_json(const Inference__InferParameter *v) {
  if (v == NULL) return json_null();
  switch (v->parameter_choice_case) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM:
      return json_boolean(v->bool_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
      return json_integer(v->int64_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM:
      return json_string(v->string_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM:
      return json_real(v->double_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
      return v->uint64_param > (uint64_t)INT64_MAX
                 ? json_real((double)v->uint64_param)
                 : json_integer((json_int_t)v->uint64_param);
    default:
      return json_null();
  }
}

/* A map<string, InferParameter> (each entry key, value) as a JSON object;
 * entries is protobuf-c's array of ParametersEntry (all alike). */
typedef struct pentry {
  ProtobufCMessage base;
  char *key;
  Inference__InferParameter *value;
} pentry;

static json_t *params_json(size_t n, void *const *entries) {
  json_t *o = json_object();
  for (size_t i = 0; i < n; i++) {
    const pentry *e = entries[i];
    json_object_set_new(o, e->key, param_json(e->value));
  }
  return o;
}

/* One input's elements as binary tensor data: raw as given, or
 * contents.bytes_contents as 4-byte little-endian lengths and bytes. */
static void input_bytes(gbuf *bin, const Inference__ModelInferRequest *q,
                        size_t i, size_t *size) {
  size_t before = bin->len;
  const Inference__ModelInferRequest__InferInputTensor *in = q->inputs[i];
  if (q->n_raw_input_contents > 0) {
    gb_add(bin, q->raw_input_contents[i].data, q->raw_input_contents[i].len);
  } else if (in->contents != NULL) {
    for (size_t k = 0; k < in->contents->n_bytes_contents; k++) {
      const ProtobufCBinaryData *d = &in->contents->bytes_contents[k];
      unsigned char l[4] = {(unsigned char)d->len,
                            (unsigned char)(d->len >> 8),
                            (unsigned char)(d->len >> 16),
                            (unsigned char)(d->len >> 24)};
      gb_add(bin, l, 4);
      gb_add(bin, d->data, d->len);
    }
  }
  *size = bin->len - before;
}

/* The contents of one input hold a type /v2 carries only as JSON numbers
 * (no model here takes a numeric input): name it, so the daemon's own
 * check refuses the datatype. */
static bool numeric_contents(const Inference__InferTensorContents *c) {
  return c != NULL &&
         (c->n_bool_contents || c->n_int_contents || c->n_int64_contents ||
          c->n_uint_contents || c->n_uint64_contents || c->n_fp32_contents ||
          c->n_fp64_contents);
}

/* ModelInfer as /v2's infer request with binary tensor data. */
static int infer_request(const Inference__ModelInferRequest *q,
                         const cn__grpc_meta *meta, gbuf *out, char *err,
                         size_t cap) {
  gbuf path = {0}, bin = {0};
  int rc = model_path(&path, q->model_name, q->model_version, err, cap);
  if (rc != 0) goto out;
  gb_str(&path, "/infer");
  if (q->n_raw_input_contents > 0 &&
      q->n_raw_input_contents != q->n_inputs) {
    snprintf(err, cap, "expected %zu raw_input_contents, one per input, "
             "got %zu", q->n_inputs, q->n_raw_input_contents);
    rc = CN__GRPC_INVALID_ARGUMENT;
    goto out;
  }
  json_t *j = json_object(), *ins = json_array(), *outs = NULL;
  if (q->id != NULL && q->id[0] != '\0')
    json_object_set_new(j, "id", json_string(q->id));
  for (size_t i = 0; i < q->n_inputs; i++) {
    const Inference__ModelInferRequest__InferInputTensor *in = q->inputs[i];
    if (q->n_raw_input_contents > 0 && in->contents != NULL &&
        (in->contents->n_bytes_contents > 0 ||
         numeric_contents(in->contents))) {
      snprintf(err, cap, "input %.64s has both contents and "
               "raw_input_contents: send one", in->name);
      json_decref(j);
      json_decref(ins);
      rc = CN__GRPC_INVALID_ARGUMENT;
      goto out;
    }
    json_t *t = json_object(), *shape = json_array();
    json_object_set_new(t, "name", json_string(in->name));
    json_object_set_new(t, "datatype", json_string(in->datatype));
    for (size_t k = 0; k < in->n_shape; k++)
      json_array_append_new(shape, json_integer(in->shape[k]));
    json_object_set_new(t, "shape", shape);
    json_t *par = params_json(in->n_parameters, (void *const *)in->parameters);
    size_t size;
    input_bytes(&bin, q, i, &size);
    json_object_set_new(par, "binary_data_size", json_integer((json_int_t)size));
    json_object_set_new(t, "parameters", par);
    json_array_append_new(ins, t);
  }
  json_object_set_new(j, "inputs", ins);
  /* every output as binary data: it becomes raw_output_contents */
  json_t *par = params_json(q->n_parameters, (void *const *)q->parameters);
  json_object_set_new(par, "binary_data_output", json_true());
  /* the call's deadline (grpc-timeout) is the request's timeout_ms unless
   * its parameters name one: the daemon gives up at the same time as the
   * client (504, DEADLINE_EXCEEDED) */
  if (meta != NULL && meta->timeout_ms > 0 &&
      json_object_get(par, "timeout_ms") == NULL)
    json_object_set_new(par, "timeout_ms",
                        json_integer(meta->timeout_ms < 3600000
                                         ? meta->timeout_ms : 3600000));
  json_object_set_new(j, "parameters", par);
  if (q->n_outputs > 0) {
    outs = json_array();
    for (size_t i = 0; i < q->n_outputs; i++) {
      const Inference__ModelInferRequest__InferRequestedOutputTensor *o =
          q->outputs[i];
      json_t *t = json_object();
      json_t *op = params_json(o->n_parameters, (void *const *)o->parameters);
      json_object_set_new(op, "binary_data", json_true());
      json_object_set_new(t, "name", json_string(o->name));
      json_object_set_new(t, "parameters", op);
      json_array_append_new(outs, t);
    }
    json_object_set_new(j, "outputs", outs);
  }
  char *hdr = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (hdr == NULL || bin.oom) {
    free(hdr);
    snprintf(err, cap, "no memory for the request");
    rc = CN__GRPC_RESOURCE_EXHAUSTED;
    goto out;
  }
  size_t hl = strlen(hdr);
  http_head(out, "POST", &path, meta, hl + bin.len, (long long)hl);
  gb_add(out, hdr, hl);
  gb_add(out, bin.p ? bin.p : "", bin.len);
  free(hdr);
out:
  free(path.p);
  free(bin.p);
  return rc;
}

int cn__grpc_request(int method, const uint8_t *msg, size_t len,
                     const cn__grpc_meta *meta, char **out, size_t *out_len,
                     char *err, size_t cap) {
  gbuf b = {0}, path = {0};
  const char *verb = "GET", *body = "";
  int rc = 0;
  *out = NULL;
  *out_len = 0;
  if (method < 0 || method >= M_COUNT) {
    snprintf(err, cap, "unknown method");
    return CN__GRPC_UNIMPLEMENTED;
  }
  ProtobufCMessage *m =
      protobuf_c_message_unpack(methods[method].req, NULL, len, msg);
  if (m == NULL) {
    snprintf(err, cap, "the %s request message (%zu bytes) does not decode "
             "as inference.%s", methods[method].name, len,
             methods[method].req->short_name);
    return CN__GRPC_INVALID_ARGUMENT;
  }
  switch (method) {
    case M_SERVER_LIVE: gb_str(&path, "/v2/health/live"); break;
    case M_SERVER_READY: gb_str(&path, "/v2/health/ready"); break;
    case M_SERVER_METADATA: gb_str(&path, "/v2"); break;
    case M_MODEL_READY: {
      const Inference__ModelReadyRequest *q = (void *)m;
      rc = model_path(&path, q->name, q->version, err, cap);
      gb_str(&path, "/ready");
      break;
    }
    case M_MODEL_METADATA: {
      const Inference__ModelMetadataRequest *q = (void *)m;
      rc = model_path(&path, q->name, q->version, err, cap);
      break;
    }
    case M_MODEL_CONFIG: {
      const Inference__ModelConfigRequest *q = (void *)m;
      rc = model_path(&path, q->name, q->version, err, cap);
      gb_str(&path, "/config");
      break;
    }
    case M_MODEL_STATISTICS: {
      const Inference__ModelStatisticsRequest *q = (void *)m;
      if (q->name[0] == '\0') gb_str(&path, "/v2/models");
      else rc = model_path(&path, q->name, q->version, err, cap);
      gb_str(&path, "/stats");
      break;
    }
    case M_REPOSITORY_INDEX: {
      const Inference__RepositoryIndexRequest *q = (void *)m;
      gb_str(&path, "/v2/repository/index");
      verb = "POST";
      body = q->ready ? "{\"ready\":true}" : "{}";
      break;
    }
    case M_REPOSITORY_LOAD:
    case M_REPOSITORY_UNLOAD: {
      const Inference__RepositoryModelLoadRequest *q = (void *)m;
      gb_str(&path, "/v2/repository/models/");
      if (q->model_name[0] == '\0') {
        snprintf(err, cap, "model_name is empty: name the model to %s",
                 method == M_REPOSITORY_LOAD ? "load" : "unload");
        rc = CN__GRPC_INVALID_ARGUMENT;
      }
      gb_seg(&path, q->model_name);
      gb_str(&path, method == M_REPOSITORY_LOAD ? "/load" : "/unload");
      verb = "POST";
      body = "{}";
      break;
    }
    case M_MODEL_INFER:
      rc = infer_request((const Inference__ModelInferRequest *)m, meta, &b,
                         err, cap);
      break;
  }
  if (rc == 0 && method != M_MODEL_INFER) {
    http_head(&b, verb, &path, meta, strlen(body), -1);
    gb_str(&b, body);
  }
  protobuf_c_message_free_unpacked(m, NULL);
  free(path.p);
  if (rc == 0 && b.oom) {
    snprintf(err, cap, "no memory for the request");
    rc = CN__GRPC_RESOURCE_EXHAUSTED;
  }
  if (rc != 0) {
    free(b.p);
    return rc;
  }
  *out = b.p;
  *out_len = b.len;
  return 0;
}
