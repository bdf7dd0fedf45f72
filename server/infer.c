/* infer.c - the body of POST /v1/models/{model}/infer (docs/api.md): options
 * and instances, validated against the configured limits before anything
 * of the request is queued. A single INSTANCE object (no "instances") is
 * one instance; its option fields sit beside the instance's own. A v2
 * request (POST /v2/models/{model}/infer) is first made into the /v1
 * request it asks for (kserve.c), then parsed here alike. A body sent
 * compressed (Content-Encoding gzip or deflate) is inflated first, within
 * max-body-bytes (encoding.c). */
#include <stdlib.h>
#include <string.h>

#include "bodyscan.h"
#include "encoding.h"
#include "handlers.h"

static int check_counts(const cn__server *s, const char *body, size_t len,
                        cn_err *e) {
  cn__body_counts k;
  cn__body_scan(body, len, &k);
  return cn__limits_check_counts(s, &k, e);
}

/* The answer's envelope beside its outputs (worker.c format_answer):
 * {"model":..,"model_version":..,"outputs":[..],"stats":{..}} with two
 * reals and six integers in "stats" (unknown_tokens the sixth; a seventh,
 * unknown_labels, with its key, for a model that reads labels), and with
 * unknown_positions its key and brackets. A v2 answer (kserve.c) holds the
 * same values less the per-instance keys, plus its "id", six tensors'
 * names, datatypes and shapes, and an offset an instance. */
static int64_t envelope_bound(const cn__req *r, const cn__parsed *p) {
  int64_t strs = 6 * (int64_t)(strlen(r->me->name) +
                               strlen(r->me->version)) + 4;
  if (r->v2)
    strs += 6 * (int64_t)(p->v2_id ? strlen(p->v2_id) : 0) + 1024 +
            24 * (int64_t)p->n_inst;
  return 320 + 40 + strs;
}

/* Refuses a request whose answer could pass max-answer-bytes: the bound
 * is core's (cn_model_answer_bound), from the model's sizes, each
 * instance and the flags, so nothing of it runs (a 328 KB request
 * once asked for a 227 MB answer). */
static int check_answer(const cn__req *r, cn__parsed *p, cn_err *e) {
  int64_t max = r->srv->cfg.serve.max_answer_bytes;
  int64_t b = envelope_bound(r, p);
  for (int i = 0; i < p->n_inst; i++)
    b += cn_model_answer_bound(r->me->model, p->inst[i], p->flags,
                               p->max_decode_len) + 1 +
         /* unknown_positions: [p,...], an int32 and a comma each */
         ((p->flags & CN_OUT_UNKNOWN)
              ? 3 + 12 * (int64_t)cn_instance_unknown(p->inst[i], NULL, 0)
              : 0);
  if (r->v2) b += cn__kserve_answer_extra(r, p, b);
  else if (r->answer_enc != 0) b += b / 512 + 64; /* deflate's overhead */
  p->answer_bound = b; /* reserved of max-answer-memory (http.c) */
  if (b <= max) return 0;
  return cn_err_set(e, CN_E_TOO_LARGE,
                    "the answer could be %lld bytes (a bound from the "
                    "model's sizes, the instances%s%s); at most %lld "
                    "(max-answer-bytes): send fewer or smaller instances%s%s%s",
                    (long long)b,
                    (p->flags & CN_OUT_HIDDEN) ? ", return_hidden" : "",
                    (p->flags & CN_OUT_ALL) ? ", outputs all" : "",
                    (long long)max,
                    (p->flags & CN_OUT_HIDDEN) ? ", no return_hidden" : "",
                    (p->flags & CN_OUT_ALL) ? ", outputs \"root\"" : "",
                    cn_model_decodes(r->me->model)
                        ? ", a smaller max_decode_len" : "");
}

void cn__parsed_free(cn__parsed *p, cn__server *s) {
  for (int i = 0; i < p->n_inst; i++) cn_instance_free(p->inst[i]);
  cn__reader_give(s, p->rd, p->rd_bytes);
  free(p->inst);
  free(p->v2_id);
  p->inst = NULL;
  p->n_inst = 0;
  p->v2_id = NULL;
  p->rd = NULL;
  p->rd_bytes = 0;
}

/* A body sent with a Content-Encoding, inflated within max-body-bytes
 * (encoding.c): *body and *len become the inflated bytes, *held owns
 * them. */
static int inflate_body(const cn__req *r, const char **body, size_t *len,
                        char **held, cn_err *e) {
  if (r->body_enc == CN__ENC_NONE) return 0;
  if (r->body_enc == CN__ENC_BAD)
    return cn_err_set(e, CN_E_UNSUPPORTED_ENCODING, "the body's "
                      "Content-Encoding is not one the daemon takes: send "
                      "gzip, deflate or identity (one coding)");
  int rc = cn__inflate(r->body_enc, *body, *len,
                       (size_t)r->srv->cfg.serve.max_body_bytes, held, len,
                       e);
  if (rc == 0) *body = *held;
  return rc;
}

static bool ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Index of the first byte at or after i that is not JSON whitespace. */
static size_t skip_ws(const char *b, size_t len, size_t i) {
  while (i < len && ws(b[i])) i++;
  return i;
}

/* One more instance slot in p->inst (*cap of them); -1: no memory. */
static int grow_inst(cn__parsed *p, size_t *cap) {
  if ((size_t)p->n_inst < *cap) return 0;
  size_t c = *cap ? 2 * *cap : 4;
  cn_instance **q = realloc(p->inst, c * sizeof(*q));
  if (q == NULL) return -1;
  p->inst = q;
  *cap = c;
  return 0;
}

/* The common bodies read without a DOM: {"instances": [INSTANCE, ...]}
 * and nothing else (no option key, plain whitespace), or one INSTANCE
 * alone, each instance of a shape core reads in one pass
 * (cn_instance_parse_at). Returns 0 (p->inst, p->n_inst, p->vertices set,
 * held by p->rd), 1 when it does not read this body (p as it was: the
 * DOM path reads it and writes any error), or CN_E_NOMEM. */
static int read_direct(const cn__req *r, const char *b, size_t len,
                       cn__parsed *p) {
  static const char key[] = "\"instances\"";
  const size_t max = (size_t)r->srv->cfg.serve.max_instances_per_request;
  const cn_limits *lim = &r->srv->cfg.limits;
  const cn_model *m = r->me->model;
  size_t i = skip_ws(b, len, 0), cap = 0, at;
  int rc = 1;
  if (i >= len || b[i] != '{') return 1;
  p->rd = cn__reader_take(r->srv);
  if (p->rd == NULL) return CN_E_NOMEM;
  p->rd_bytes = len;
  at = skip_ws(b, len, i + 1);
  if (len - at < sizeof(key) - 1 || memcmp(b + at, key, sizeof(key) - 1)) {
    /* one INSTANCE, the whole body */
    if (grow_inst(p, &cap) != 0) { rc = CN_E_NOMEM; goto out; }
    rc = cn_instance_parse_line(m, p->rd, b, len, lim, &p->inst[0]);
    if (rc == 0) p->n_inst = 1;
    goto out;
  }
  at = skip_ws(b, len, at + sizeof(key) - 1);
  if (at >= len || b[at] != ':') goto out;
  at = skip_ws(b, len, at + 1);
  if (at >= len || b[at] != '[') goto out;
  for (at++;;) {
    size_t end;
    at = skip_ws(b, len, at);
    if ((size_t)p->n_inst >= max) goto out; /* the DOM path says so */
    if (grow_inst(p, &cap) != 0) { rc = CN_E_NOMEM; goto out; }
    if ((rc = cn_instance_parse_at(m, p->rd, b, len, at, lim,
                                   &p->inst[p->n_inst], &end)) != 0)
      goto out;
    p->n_inst++;
    rc = 1;
    at = skip_ws(b, len, end);
    if (at < len && b[at] == ',') { at++; continue; }
    if (at >= len || b[at] != ']') goto out;
    break;
  }
  at = skip_ws(b, len, at + 1);
  if (at >= len || b[at] != '}') goto out;
  rc = skip_ws(b, len, at + 1) == len ? 0 : 1;
out:
  if (rc == 0) {
    for (int k = 0; k < p->n_inst; k++)
      p->vertices += cn_instance_vertices(p->inst[k], p->flags & CN_OUT_ALL);
  } else { /* arena instances: the reader's reset frees them */
    cn__reader_give(r->srv, p->rd, p->rd_bytes);
    free(p->inst);
    p->inst = NULL;
    p->n_inst = 0;
    p->rd = NULL;
    p->rd_bytes = 0;
  }
  return rc;
}

/* The body's JSON as a DOM (*j, new reference), a v2 body's made into the
 * /v1 request it asks for (kserve.c): json_len of len bytes are JSON, the
 * rest a v2 body's binary tensor data. */
static int load_body(const cn__req *r, const char *body, size_t len,
                     size_t json_len, cn__parsed *p, json_t **j, cn_err *e) {
  json_error_t je;
  *j = json_loadb(body, json_len, JSON_REJECT_DUPLICATES, &je);
  if (*j == NULL) {
    int rc = cn_err_set(e, CN_E_BAD_JSON, "the %s is not valid JSON: %s",
                        json_len < len ? "body's JSON header "
                                         "(Inference-Header-Content-Length)"
                                       : "body", je.text);
    e->offset = je.position;
    return rc;
  }
  if (!json_is_object(*j))
    return cn_err_set(e, CN_E_BAD_JSON, "the body must be a JSON object");
  if (r->v2) { /* the /v1 request it asks for, parsed as /v1's below */
    json_t *v1;
    int rc = cn__kserve_request(r, *j, body + json_len, len - json_len, &v1,
                                p, e);
    if (rc != 0) return rc;
    json_decref(*j);
    *j = v1;
  }
  return 0;
}

/* "instances" of body j (*insts: NULL when j is one INSTANCE) and how
 * many instances the body has (*n), within max-instances-per-request. */
static int read_envelope(const cn__server *s, const json_t *j,
                         json_t **insts, size_t *n, cn_err *e) {
  *insts = json_object_get(j, "instances");
  *n = 1;
  if (*insts != NULL) {
    if (!json_is_array(*insts))
      return cn_err_set(e, CN_E_BAD_INSTANCE,
                        "\"instances\" must be an array");
    *n = json_array_size(*insts);
    if (*n == 0)
      return cn_err_set(e, CN_E_BAD_INSTANCE, "\"instances\" is empty");
    /* {"instances": [A], "tree": B}: B was once silently ignored */
    const char *form = cn_instance_form_in(j);
    if (form != NULL)
      return cn_err_set(e, CN_E_BAD_INSTANCE, "the body has both "
                        "\"instances\" and an instance's \"%s\": "
                        "ambiguous; put every instance in \"instances\"",
                        form);
  }
  int max = s->cfg.serve.max_instances_per_request;
  if (*n > (size_t)max) return cn__limits_too_many_instances(e, *n, max);
  return 0;
}

/* The body's options (docs/api.md) into p's flags, max_decode_len and
 * timeout_ms. */
static int read_options(const json_t *j, cn__parsed *p, cn_err *e) {
  json_t *v;
  if ((v = json_object_get(j, "outputs")) != NULL) {
    const char *o = json_string_value(v);
    if (o != NULL && strcmp(o, "all") == 0) p->flags |= CN_OUT_ALL;
    else if (o == NULL || strcmp(o, "root") != 0)
      return cn_err_set(e, CN_E_BAD_INSTANCE,
                        "\"outputs\" must be \"root\" or \"all\"");
  }
  if ((v = json_object_get(j, "return_hidden")) != NULL) {
    if (!json_is_boolean(v))
      return cn_err_set(e, CN_E_BAD_INSTANCE,
                        "\"return_hidden\" must be a boolean");
    if (json_is_true(v)) p->flags |= CN_OUT_HIDDEN;
  }
  if ((v = json_object_get(j, "unknown_positions")) != NULL) {
    if (!json_is_boolean(v))
      return cn_err_set(e, CN_E_BAD_INSTANCE,
                        "\"unknown_positions\" must be a boolean");
    if (json_is_true(v)) p->flags |= CN_OUT_UNKNOWN;
  }
  if ((v = json_object_get(j, "max_decode_len")) != NULL) {
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > 1 << 20)
      return cn_err_set(e, CN_E_BAD_INSTANCE,
                        "\"max_decode_len\" must be an integer in [1, %d] "
                        "(the model's own max_decode_len caps it)", 1 << 20);
    p->max_decode_len = (int)json_integer_value(v);
  }
  if ((v = json_object_get(j, "timeout_ms")) != NULL) {
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > 3600000)
      return cn_err_set(e, CN_E_BAD_INSTANCE,
                        "\"timeout_ms\" must be an integer in [1, 3600000] "
                        "(ms); without it the daemon's timeout-ms applies");
    p->timeout_ms = json_integer_value(v);
  }
  return 0;
}

/* The n instances of insts (NULL: j itself is the one) into p->inst, and
 * their vertices into p->vertices. */
static int read_instances(const cn__req *r, const json_t *j,
                          const json_t *insts, size_t n, cn__parsed *p,
                          cn_err *e) {
  p->inst = calloc(n, sizeof(cn_instance *));
  if (p->inst == NULL)
    return cn_err_set(e, CN_E_NOMEM, "no memory for %zu instances", n);
  for (size_t i = 0; i < n; i++) {
    const json_t *ij = insts ? json_array_get(insts, i) : j;
    int rc = cn_instance_parse(r->me->model, ij, &r->srv->cfg.limits, (int)i,
                               &p->inst[i], e);
    if (rc != 0) return rc;
    p->n_inst++;
    p->vertices += cn_instance_vertices(p->inst[i], p->flags & CN_OUT_ALL);
  }
  return 0;
}

/* The request's vertices within max-vertices (a run holds them all). */
static int check_vertices(const cn__server *s, const cn__parsed *p,
                          cn_err *e) {
  int max = s->cfg.serve.max_vertices;
  if (p->vertices <= (size_t)max) return 0;
  return cn_err_set(e, CN_E_TOO_LARGE,
                    "the request has %zu vertices; a run holds at most %d "
                    "(max-vertices)", p->vertices, max);
}

/* Reads the options and instances of r's body into p (any thread: it
 * reads r's body, model and the configuration, and writes only p). On
 * failure p holds nothing. A /v1 body of the common shape is read without
 * a DOM (read_direct); any other, and every error, through jansson. */
int cn__infer_parse_into(const cn__req *r, cn__parsed *p, cn_err *e) {
  cn__server *s = r->srv;
  const char *body = r->body ? r->body : "";
  size_t len = r->body_len, json_len, n;
  char *inflated = NULL;
  json_t *j = NULL, *insts;
  int rc;
  memset(p, 0, sizeof(*p));
  p->flags = r->flags;
  p->max_decode_len = r->max_decode_len;
  p->timeout_ms = r->timeout_ms;
  if ((rc = inflate_body(r, &body, &len, &inflated, e)) != 0) goto out;
  /* a v2 body may be a JSON header and binary tensor data after it */
  json_len = len;
  if (r->v2 && (rc = cn__kserve_header_len(r, len, &json_len, e)) != 0)
    goto out;
  if ((rc = check_counts(s, body, json_len, e)) != 0) goto out;
  if (!r->v2 && (rc = read_direct(r, body, len, p)) != 1) {
    if (rc < 0) rc = cn_err_set(e, rc, "no memory to read the body");
    else if ((rc = check_vertices(s, p, e)) == 0) rc = check_answer(r, p, e);
    goto out;
  }
  if ((rc = load_body(r, body, len, json_len, p, &j, e)) != 0 ||
      (rc = read_envelope(s, j, &insts, &n, e)) != 0 ||
      (rc = read_options(j, p, e)) != 0 ||
      (rc = read_instances(r, j, insts, n, p, e)) != 0 ||
      (rc = check_vertices(s, p, e)) != 0)
    goto out;
  rc = check_answer(r, p, e);
out:
  json_decref(j);
  free(inflated);
  if (rc != 0) cn__parsed_free(p, s);
  return rc;
}

void cn__infer_commit(cn__req *r, cn__parsed *p) {
  r->inst = p->inst;
  r->n_inst = p->n_inst;
  r->vertices = p->vertices;
  r->flags = p->flags;
  r->max_decode_len = p->max_decode_len;
  r->timeout_ms = p->timeout_ms;
  r->v2_id = p->v2_id;
  r->v2_outputs = p->v2_outputs;
  r->answer_bound = p->answer_bound;
  r->v2_binary = p->v2_binary;
  r->rd = p->rd;
  r->rd_bytes = p->rd_bytes;
  memcpy(r->v2_topk, p->v2_topk, sizeof(r->v2_topk));
  memset(p, 0, sizeof(*p));
}

int cn__infer_parse(cn__req *r, cn_err *e) {
  cn__parsed p;
  int rc = cn__infer_parse_into(r, &p, e);
  cn__req_body_free(r);
  if (rc == 0) cn__infer_commit(r, &p);
  return rc;
}

