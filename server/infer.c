/* infer.c - the body of POST /v1/models/{model}/infer (API.md): options
 * and instances, validated against the configured limits before anything
 * of the request is queued. A single INSTANCE object (no "instances") is
 * one instance; its option fields sit beside the instance's own. */
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

/* Reads the options and instances of an infer body; on success the
 * request holds validated instances ready for a run. */
int cn__infer_parse(cn__req *r, cn_err *e) {
  cn__server *s = r->srv;
  const cn_serve_config *sc = &s->cfg.serve;
  int rc = 0;
  json_error_t je;
  json_t *j = json_loadb(r->body ? r->body : "", r->body_len,
                        JSON_REJECT_DUPLICATES, &je);
  if (j == NULL) {
    rc = cn_err_set(e, CN_E_BAD_JSON, "the body is not valid JSON: %s",
                    je.text);
    e->offset = je.position;
    goto out;
  }
  if (!json_is_object(j)) {
    rc = cn_err_set(e, CN_E_BAD_JSON, "the body must be a JSON object");
    goto out;
  }
  json_t *insts = json_object_get(j, "instances");
  json_t *v;
  size_t n = 1;
  if (insts != NULL) {
    if (!json_is_array(insts)) {
      rc = cn_err_set(e, CN_E_BAD_INSTANCE, "\"instances\" must be an array");
      goto out;
    }
    n = json_array_size(insts);
    if (n == 0) {
      rc = cn_err_set(e, CN_E_BAD_INSTANCE, "\"instances\" is empty");
      goto out;
    }
  }
  if (n > (size_t)sc->max_instances_per_request) {
    rc = cn_err_set(e, CN_E_TOO_LARGE,
                    "%zu instances; at most %d per request "
                    "(max-instances-per-request)",
                    n, sc->max_instances_per_request);
    goto out;
  }
  if ((v = json_object_get(j, "outputs")) != NULL) {
    const char *o = json_string_value(v);
    if (o != NULL && strcmp(o, "all") == 0) r->flags |= CN_OUT_ALL;
    else if (o == NULL || strcmp(o, "root") != 0) {
      rc = cn_err_set(e, CN_E_BAD_INSTANCE, "\"outputs\" must be \"root\" or \"all\"");
      goto out;
    }
  }
  if ((v = json_object_get(j, "return_hidden")) != NULL) {
    if (!json_is_boolean(v)) {
      rc = cn_err_set(e, CN_E_BAD_INSTANCE, "\"return_hidden\" must be a boolean");
      goto out;
    }
    if (json_is_true(v)) r->flags |= CN_OUT_HIDDEN;
  }
  if ((v = json_object_get(j, "max_decode_len")) != NULL) {
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > 1 << 20) {
      rc = cn_err_set(e, CN_E_BAD_INSTANCE,
                      "\"max_decode_len\" must be a positive integer");
      goto out;
    }
    r->max_decode_len = (int)json_integer_value(v);
  }
  if ((v = json_object_get(j, "timeout_ms")) != NULL) {
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > 3600000) {
      rc = cn_err_set(e, CN_E_BAD_INSTANCE,
                      "\"timeout_ms\" must be an integer in [1, 3600000] (ms; "
                      "the daemon's timeout-ms key has the same limit)");
      goto out;
    }
    r->timeout_ms = json_integer_value(v);
  }
  r->inst = calloc(n, sizeof(cn_instance *));
  if (r->inst == NULL) {
    rc = cn_err_set(e, CN_E_NOMEM, "no memory for %zu instances", n);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const json_t *ij = insts ? json_array_get(insts, i) : j;
    rc = cn_instance_parse(r->me->model, ij, &s->cfg.limits, (int)i,
                           &r->inst[i], e);
    if (rc != 0) goto out;
    r->n_inst++;
    r->vertices += cn_instance_vertices(r->inst[i], r->flags & CN_OUT_ALL);
  }
  if (r->vertices > (size_t)sc->max_vertices) {
    rc = cn_err_set(e, CN_E_TOO_LARGE,
                    "the request has %zu vertices; a run holds at most %d "
                    "(max-vertices)",
                    r->vertices, sc->max_vertices);
    goto out;
  }
out:
  json_decref(j);
  free(r->body);
  r->body = NULL;
  return rc;
}

