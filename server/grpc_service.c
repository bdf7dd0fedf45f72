/* grpc_service.c - the methods of inference.GRPCInferenceService
 * (server/grpc_service.proto) as the Open Inference Protocol's HTTP
 * requests (docs/api.md "gRPC"): each call's protobuf message becomes the
 * HTTP/1.1 request to /v2 it asks for (grpc_request.c), and the HTTP
 * answer becomes the method's response message and gRPC status (here). grpc.c hands that request
 * to an in-memory connection, so every call is routed, checked, batched,
 * run, counted and logged by the same code as /v1 and /v2; nothing here
 * decides an answer.
 *
 * ModelInfer: the inputs go as Triton's binary tensor data (each input's
 * raw_input_contents, or its contents.bytes_contents as 4-byte
 * little-endian lengths and bytes), every output is asked for as binary
 * data, and the answer's binary tensors become raw_output_contents, as
 * Triton answers: each FP32 the very float32 /v1 prints. "parameters"
 * go as /v2's JSON parameters, and the answer's ("stats") come back as
 * InferParameters.
 *
 * The other methods' answers are /v2's JSON, which is the proto3 JSON
 * form of their messages (Triton's REST answers are made that way):
 * json_message fills any message from it through protobuf-c's
 * descriptors, so no method has a hand-written copy. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "grpc.h"
#include "grpc_service_impl.h"

int cn__grpc_method(const char *path) {
  size_t pl = strlen(SERVICE_PREFIX);
  if (strncmp(path, SERVICE_PREFIX, pl) != 0) return -1;
  for (int i = 0; i < M_COUNT; i++)
    if (strcmp(path + pl, methods[i].name) == 0) return i;
  return -1;
}

const char *cn__grpc_method_name(int method) {
  return method >= 0 && method < M_COUNT ? methods[method].name : "-";
}

int cn__grpc_status_of_http(int st) {
  switch (st) {
    case 200: return CN__GRPC_OK;
    case 400: case 415: return CN__GRPC_INVALID_ARGUMENT;
    case 401: return CN__GRPC_UNAUTHENTICATED;
    case 403: return CN__GRPC_PERMISSION_DENIED;
    case 404: return CN__GRPC_NOT_FOUND;
    case 405: case 501: return CN__GRPC_UNIMPLEMENTED;
    case 408: case 504: return CN__GRPC_DEADLINE_EXCEEDED;
    case 409: return CN__GRPC_FAILED_PRECONDITION;
    case 413: case 429: return CN__GRPC_RESOURCE_EXHAUSTED;
    case 499: return CN__GRPC_CANCELLED;
    case 503: return CN__GRPC_UNAVAILABLE;
    default: return st >= 500 ? CN__GRPC_INTERNAL : CN__GRPC_UNKNOWN;
  }
}

/* ---- answers: JSON into a message, by its descriptor -------------------- */

/* Every allocation of one message being built, freed together once it
 * is packed. */
typedef struct pool {
  void **p;
  size_t n, cap;
  bool oom;
} pool;

static void *pool_alloc(pool *pl, size_t size) {
  if (pl->n == pl->cap) {
    size_t cap = pl->cap ? pl->cap * 2 : 32;
    void **q = realloc(pl->p, cap * sizeof(*q));
    if (q == NULL) {
      pl->oom = true;
      return NULL;
    }
    pl->p = q;
    pl->cap = cap;
  }
  void *m = calloc(1, size ? size : 1);
  if (m == NULL) {
    pl->oom = true;
    return NULL;
  }
  pl->p[pl->n++] = m;
  return m;
}

static void pool_free(pool *pl) {
  for (size_t i = 0; i < pl->n; i++) free(pl->p[i]);
  free(pl->p);
}

static char *pool_strdup(pool *pl, const char *s, size_t n) {
  char *d = pool_alloc(pl, n + 1);
  if (d) memcpy(d, s, n);
  return d;
}

static ProtobufCMessage *json_message(pool *pl,
                                      const ProtobufCMessageDescriptor *d,
                                      const json_t *j);

/* proto3 JSON numbers: a JSON number, or (64-bit) a decimal string. */
static long long json_ll(const json_t *v) {
  if (json_is_integer(v)) return (long long)json_integer_value(v);
  if (json_is_real(v)) return (long long)json_real_value(v);
  if (json_is_string(v)) return strtoll(json_string_value(v), NULL, 10);
  if (json_is_boolean(v)) return json_is_true(v);
  return 0;
}

static unsigned long long json_ull(const json_t *v) {
  if (json_is_string(v)) return strtoull(json_string_value(v), NULL, 10);
  long long x = json_ll(v);
  return x < 0 ? 0 : (unsigned long long)x;
}

static double json_dbl(const json_t *v) {
  if (json_is_number(v)) return json_number_value(v);
  if (json_is_string(v)) return strtod(json_string_value(v), NULL);
  return 0;
}

static size_t scalar_size(ProtobufCType t) {
  switch (t) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_ENUM:
      return 4;
    case PROTOBUF_C_TYPE_FLOAT: return sizeof(float);
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
    default: return 8;
  }
}

/* One value of field f from v into dst (one element of its type). */
static void json_value(pool *pl, const ProtobufCFieldDescriptor *f,
                       const json_t *v, void *dst) {
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
      *(int32_t *)dst = (int32_t)json_ll(v);
      break;
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
      *(uint32_t *)dst = (uint32_t)json_ull(v);
      break;
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
      *(int64_t *)dst = (int64_t)json_ll(v);
      break;
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
      *(uint64_t *)dst = (uint64_t)json_ull(v);
      break;
    case PROTOBUF_C_TYPE_FLOAT: *(float *)dst = (float)json_dbl(v); break;
    case PROTOBUF_C_TYPE_DOUBLE: *(double *)dst = json_dbl(v); break;
    case PROTOBUF_C_TYPE_BOOL:
      *(protobuf_c_boolean *)dst = json_is_true(v);
      break;
    case PROTOBUF_C_TYPE_ENUM: {
      int32_t x = (int32_t)json_ll(v);
      if (json_is_string(v)) {
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value_by_name(
            f->descriptor, json_string_value(v));
        x = ev ? ev->value : 0;
      }
      *(int32_t *)dst = x;
      break;
    }
    case PROTOBUF_C_TYPE_STRING: {
      const char *s = json_is_string(v) ? json_string_value(v) : "";
      size_t n = json_is_string(v) ? json_string_length(v) : 0;
      char *c = pool_strdup(pl, s, n);
      *(char **)dst = c ? c : (char *)protobuf_c_empty_string;
      break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
      ProtobufCBinaryData *b = dst;
      const char *s = json_is_string(v) ? json_string_value(v) : "";
      b->len = json_is_string(v) ? json_string_length(v) : 0;
      b->data = (uint8_t *)pool_strdup(pl, s, b->len);
      if (b->data == NULL) b->len = 0;
      break;
    }
    case PROTOBUF_C_TYPE_MESSAGE:
      *(ProtobufCMessage **)dst = json_message(pl, f->descriptor, v);
      break;
  }
}

/* A map entry message {key, value} from one key of a JSON object. */
static ProtobufCMessage *map_entry(pool *pl,
                                   const ProtobufCMessageDescriptor *d,
                                   const char *key, const json_t *v) {
  ProtobufCMessage *m = pool_alloc(pl, d->sizeof_message);
  if (m == NULL) return NULL;
  protobuf_c_message_init(d, m);
  json_t *k = json_string(key);
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    json_value(pl, f, f->id == 1 ? k : v, (char *)m + f->offset);
  }
  json_decref(k);
  return m;
}

/* The message d from the JSON object j, as proto3's JSON mapping reads
 * it (names as in the .proto; enums by name; 64-bit numbers as numbers
 * or strings; maps as objects). Keys the message lacks are ignored. */
static ProtobufCMessage *json_message(pool *pl,
                                      const ProtobufCMessageDescriptor *d,
                                      const json_t *j) {
  ProtobufCMessage *m = pool_alloc(pl, d->sizeof_message);
  if (m == NULL) return NULL;
  protobuf_c_message_init(d, m);
  if (!json_is_object(j)) return m;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const json_t *v = json_object_get(j, f->name);
    if (v == NULL || json_is_null(v)) continue;
    char *dst = (char *)m + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = json_is_array(v) ? json_array_size(v)
                 : json_is_object(v) ? json_object_size(v) : 0;
      size_t es = scalar_size(f->type);
      char *arr = n ? pool_alloc(pl, n * es) : NULL;
      if (n && arr == NULL) continue;
      if (json_is_object(v) && f->type == PROTOBUF_C_TYPE_MESSAGE) {
        const char *k;
        const json_t *x;
        size_t idx = 0;
        json_object_foreach((json_t *)v, k, x)
          ((ProtobufCMessage **)arr)[idx++] =
              map_entry(pl, f->descriptor, k, x);
      } else if (json_is_array(v)) {
        for (size_t k = 0; k < n; k++)
          json_value(pl, f, json_array_get(v, k), arr + k * es);
      }
      *(size_t *)((char *)m + f->quantifier_offset) = n;
      *(void **)dst = arr;
      continue;
    }
    json_value(pl, f, v, dst);
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
      *(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
    else if (f->label == PROTOBUF_C_LABEL_OPTIONAL &&
             f->type != PROTOBUF_C_TYPE_MESSAGE &&
             f->type != PROTOBUF_C_TYPE_STRING)
      *(protobuf_c_boolean *)((char *)m + f->quantifier_offset) = 1;
  }
  return m;
}

/* ---- answers ------------------------------------------------------------ */

/* The HTTP/1.1 answer's parts: status, headers looked up by name. */
typedef struct http_answer {
  int status;
  const char *head;
  size_t head_len;
  const char *body;
  size_t body_len;
} http_answer;

static int parse_http(const char *d, size_t n, http_answer *a) {
  memset(a, 0, sizeof(*a));
  if (n < 12 || memcmp(d, "HTTP/1.1 ", 9) != 0) return -1;
  a->status = atoi(d + 9);
  const char *end = memmem(d, n, "\r\n\r\n", 4);
  if (end == NULL) return -1;
  a->head = d;
  a->head_len = (size_t)(end - d) + 2;
  a->body = end + 4;
  a->body_len = n - (size_t)(a->body - d);
  return 0;
}

/* A header's value (up to its CRLF) into out; false: absent. */
static bool header(const http_answer *a, const char *name, char *out,
                   size_t cap) {
  size_t nl = strlen(name);
  const char *p = a->head, *end = a->head + a->head_len;
  while (p < end) {
    const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
    if (eol == NULL) break;
    if ((size_t)(eol - p) > nl + 1 && strncasecmp(p, name, nl) == 0 &&
        p[nl] == ':') {
      const char *v = p + nl + 1;
      while (v < eol && *v == ' ') v++;
      size_t vl = (size_t)(eol - v);
      if (vl >= cap) vl = cap - 1;
      memcpy(out, v, vl);
      out[vl] = '\0';
      return true;
    }
    p = eol + 2;
  }
  return false;
}

/* /v2's error answer {"error": message} (or /v1's {"error": {"message"}})
 * as the gRPC status message. */
static void error_message(const http_answer *a, char *err, size_t cap) {
  json_t *j = json_loadb(a->body, a->body_len, 0, NULL);
  const json_t *e = json_object_get(j, "error");
  const char *msg = json_is_string(e) ? json_string_value(e)
                    : json_string_value(json_object_get(e, "message"));
  snprintf(err, cap, "%s", msg ? msg : "the server gave no reason");
  json_decref(j);
}

/* A JSON value of the answer's "parameters" (its stats) as an
 * InferParameter: booleans, integers, numbers and strings as themselves;
 * anything else (unknown_positions' arrays) as its JSON text. */
static Inference__InferParameter *param_of(pool *pl, const json_t *v) {
  Inference__InferParameter *p = pool_alloc(pl, sizeof(*p));
  if (p == NULL) return NULL;
  inference__infer_parameter__init(p);
  if (json_is_boolean(v)) {
    p->parameter_choice_case =
        INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
    p->bool_param = json_is_true(v);
  } else if (json_is_integer(v)) {
    p->parameter_choice_case =
        INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
    p->int64_param = json_integer_value(v);
  } else if (json_is_real(v)) {
    p->parameter_choice_case =
        INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM;
    p->double_param = json_real_value(v);
  } else {
    char *s = json_is_string(v) ? NULL : json_dumps(v, JSON_COMPACT |
                                                    JSON_ENCODE_ANY);
    const char *t = json_is_string(v) ? json_string_value(v) : s ? s : "";
    p->parameter_choice_case =
        INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
    p->string_param = pool_strdup(pl, t, strlen(t));
    if (p->string_param == NULL)
      p->string_param = (char *)protobuf_c_empty_string;
    free(s);
  }
  return p;
}

/* /v2's binary answer (JSON header, then each output's bytes in order)
 * as ModelInferResponse with raw_output_contents, pointing into body. */
static int infer_answer(pool *pl, const http_answer *a,
                        ProtobufCMessage **out, char *err, size_t cap) {
  char hv[32];
  size_t hl = a->body_len;
  if (header(a, "Inference-Header-Content-Length", hv, sizeof(hv)))
    hl = strtoull(hv, NULL, 10);
  if (hl > a->body_len) {
    snprintf(err, cap, "the answer's JSON header runs past its body");
    return CN__GRPC_INTERNAL;
  }
  json_error_t je;
  json_t *j = json_loadb(a->body, hl, 0, &je);
  if (!json_is_object(j)) {
    json_decref(j);
    snprintf(err, cap, "the answer is not JSON: %s", je.text);
    return CN__GRPC_INTERNAL;
  }
  Inference__ModelInferResponse *r = pool_alloc(pl, sizeof(*r));
  if (r == NULL) goto oom;
  inference__model_infer_response__init(r);
  const json_t *v;
  const char *k;
#define STR_OF(key)                                                      \
  (json_is_string(json_object_get(j, key))                               \
       ? pool_strdup(pl, json_string_value(json_object_get(j, key)),     \
                     json_string_length(json_object_get(j, key)))        \
       : (char *)protobuf_c_empty_string)
  r->model_name = STR_OF("model_name");
  r->model_version = STR_OF("model_version");
  r->id = STR_OF("id");
#undef STR_OF
  if (!r->model_name || !r->model_version || !r->id) goto oom;
  const json_t *par = json_object_get(j, "parameters");
  if (json_is_object(par) && json_object_size(par) > 0) {
    r->n_parameters = json_object_size(par);
    r->parameters = pool_alloc(pl, r->n_parameters * sizeof(void *));
    if (r->parameters == NULL) goto oom;
    size_t i = 0;
    json_object_foreach((json_t *)par, k, v) {
      Inference__ModelInferResponse__ParametersEntry *e =
          pool_alloc(pl, sizeof(*e));
      if (e == NULL) goto oom;
      inference__model_infer_response__parameters_entry__init(e);
      e->key = pool_strdup(pl, k, strlen(k));
      e->value = param_of(pl, v);
      if (e->key == NULL || e->value == NULL) goto oom;
      r->parameters[i++] = e;
    }
  }
  const json_t *outs = json_object_get(j, "outputs");
  size_t n = json_array_size(outs), off = hl;
  if (n > 0) {
    r->n_outputs = r->n_raw_output_contents = n;
    r->outputs = pool_alloc(pl, n * sizeof(void *));
    r->raw_output_contents = pool_alloc(pl, n * sizeof(ProtobufCBinaryData));
    if (r->outputs == NULL || r->raw_output_contents == NULL) goto oom;
  }
  for (size_t i = 0; i < n; i++) {
    const json_t *o = json_array_get(outs, i);
    Inference__ModelInferResponse__InferOutputTensor *t =
        pool_alloc(pl, sizeof(*t));
    if (t == NULL) goto oom;
    inference__model_infer_response__infer_output_tensor__init(t);
    const char *name = json_string_value(json_object_get(o, "name"));
    const char *dt = json_string_value(json_object_get(o, "datatype"));
    t->name = pool_strdup(pl, name ? name : "", name ? strlen(name) : 0);
    t->datatype = pool_strdup(pl, dt ? dt : "", dt ? strlen(dt) : 0);
    const json_t *sh = json_object_get(o, "shape");
    t->n_shape = json_array_size(sh);
    t->shape = t->n_shape ? pool_alloc(pl, t->n_shape * sizeof(int64_t))
                          : NULL;
    if (t->name == NULL || t->datatype == NULL ||
        (t->n_shape && t->shape == NULL))
      goto oom;
    for (size_t d = 0; d < t->n_shape; d++)
      t->shape[d] = json_integer_value(json_array_get(sh, d));
    const json_t *bs =
        json_object_get(json_object_get(o, "parameters"), "binary_data_size");
    long long size = json_integer_value(bs);
    if (!json_is_integer(bs) || size < 0 ||
        (unsigned long long)size > a->body_len - off) {
      json_decref(j);
      snprintf(err, cap, "output %.64s of the answer is not binary data "
               "within its body", t->name);
      return CN__GRPC_INTERNAL;
    }
    r->raw_output_contents[i].data = (uint8_t *)a->body + off;
    r->raw_output_contents[i].len = (size_t)size;
    off += (size_t)size;
    r->outputs[i] = t;
  }
  json_decref(j);
  *out = &r->base;
  return 0;
oom:
  json_decref(j);
  snprintf(err, cap, "no memory for the answer");
  return CN__GRPC_RESOURCE_EXHAUSTED;
}

int cn__grpc_answer(int method, const char *http, size_t n, uint8_t **msg,
                    size_t *msg_len, char *err, size_t cap, char *id,
                    size_t idcap) {
  http_answer a;
  pool pl = {0};
  ProtobufCMessage *m = NULL;
  json_t *j = NULL;
  int rc = 0;
  *msg = NULL;
  *msg_len = 0;
  if (idcap > 0) id[0] = '\0';
  if (method < 0 || method >= M_COUNT || parse_http(http, n, &a) != 0) {
    snprintf(err, cap, "the server's answer is not HTTP/1.1");
    return CN__GRPC_INTERNAL;
  }
  if (idcap > 0 && !header(&a, "X-Request-Id", id, idcap)) id[0] = '\0';
  bool ready_method = method == M_SERVER_READY || method == M_MODEL_READY;
  /* readiness is an answer, not an error: 503 is "not ready" (Triton's
   * ServerReady and ModelReady say false; a model not served too) */
  if (ready_method && a.status != 200 &&
      (a.status == 503 || (method == M_MODEL_READY && a.status == 404))) {
    j = json_pack("{s:b}", "ready", 0);
  } else if (a.status != 200) {
    error_message(&a, err, cap);
    return cn__grpc_status_of_http(a.status);
  } else if (method == M_MODEL_INFER) {
    rc = infer_answer(&pl, &a, &m, err, cap);
  } else {
    json_error_t je;
    j = json_loadb(a.body, a.body_len, JSON_DECODE_ANY, &je);
    if (j == NULL && a.body_len == 0) j = json_object();
    if (j == NULL) {
      snprintf(err, cap, "the server's answer is not JSON: %s", je.text);
      return CN__GRPC_INTERNAL;
    }
    /* the REST answers that are a message's field, not the message */
    if (method == M_MODEL_CONFIG) j = json_pack("{s:o}", "config", j);
    else if (method == M_REPOSITORY_INDEX)
      j = json_pack("{s:o}", "models", j);
  }
  if (rc == 0 && m == NULL) {
    m = json_message(&pl, methods[method].resp, j);
    if (pl.oom || m == NULL) {
      snprintf(err, cap, "no memory for the answer");
      rc = CN__GRPC_RESOURCE_EXHAUSTED;
    }
  }
  json_decref(j);
  if (rc == 0) {
    size_t len = protobuf_c_message_get_packed_size(m);
    *msg = malloc(len ? len : 1);
    if (*msg == NULL) {
      snprintf(err, cap, "no memory for the answer");
      rc = CN__GRPC_RESOURCE_EXHAUSTED;
    } else {
      *msg_len = protobuf_c_message_pack(m, *msg);
    }
  }
  pool_free(&pl);
  return rc;
}
