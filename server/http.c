/* http.c - the HTTP front end: libmicrohttpd parses HTTP/1.1, this file
 * turns its callbacks into requests (route, body, validation) and answers.
 *
 * http-mode uv-poll (the default): MHD runs without a thread of its own;
 * its epoll fd is watched by a uv_poll in the loop, and a uv_timer follows
 * MHD_get_timeout, so every MHD callback runs on the loop thread and a
 * request goes to its aggregation window without crossing threads.
 * http-mode mhd-thread: MHD's internal epoll thread runs the callbacks and
 * hands parsed requests to the loop through a locked inbox + uv_async.
 * docs/daemon.md compares the two.
 *
 * An inference request is suspended (MHD_suspend_connection) while it
 * waits; the loop answers it with cn__req_answer, which resumes it, and
 * MHD calls the handler again to send the stored answer.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "routes.h"
#include "serve_impl.h"

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

char *cn__error_body(int code, const char *msg, int instance) {
  cn_err e;
  cn_err_clear(&e);
  cn_err_set(&e, code, "%s", msg);
  e.instance = instance;
  json_t *j = cn_err_to_json(&e);
  char *s = json_dumps(j, DUMP_FLAGS);
  json_decref(j);
  return s;
}

static void req_free(cn__req *r) {
  for (int i = 0; i < r->n_inst; i++) cn_instance_free(r->inst[i]);
  cn__model_release(r->me);
  free(r->inst);
  free(r->body);
  free(r->result);
  free(r->resp);
  free(r);
}

void cn__req_unref(cn__req *r) {
  if (atomic_fetch_sub(&r->refs, 1) == 1) req_free(r);
}

/* A request id: the client's X-Request-Id when it is short and plain,
 * else a fresh one (never echo bytes that could split a header). */
static void set_id(cn__server *s, cn__req *r, const char *given) {
  bool ok = given != NULL && given[0] != '\0' && strlen(given) <= 64;
  for (const char *p = given; ok && *p; p++)
    ok = (*p >= 0x21 && *p <= 0x7e);
  if (ok) {
    strcpy(r->id, given);
    return;
  }
  unsigned long long n = atomic_fetch_add(&s->next_id, 1);
  snprintf(r->id, sizeof(r->id), "cn-%08llx-%06llx",
           (unsigned long long)s->metrics.start_time & 0xffffffffULL, n);
}

/* Counts and logs a request once, when its status is decided. */
static void account(cn__req *r, int status, const char *reason) {
  cn__server *s = r->srv;
  double secs = cn__now() - r->t_arrive;
  int model = r->me ? r->me->index : r->slot ? r->slot->index : -1;
  if (status != 499)
    cn__metrics_request(&s->metrics, model, status, r->n_inst, secs);
  CN_LOG(status >= 500 && status != 503 && status != 504 ? CN_LOG_ERROR
                                                         : CN_LOG_INFO,
         "msg=request id=%s method=%s path=\"%s\" model=%s version=%s "
         "status=%d instances=%d queue_ms=%.3f compute_ms=%.3f "
         "total_ms=%.3f%s%s",
         r->id, r->method, r->path,
         r->me ? r->me->name : r->slot ? r->slot->name : "-",
         r->me ? r->me->version : "-", status, r->n_inst, r->queue_ms,
         r->compute_ms, secs * 1e3, reason ? " reason=" : "",
         reason ? reason : "");
}

/* Queues body (taking it over) on the connection, with the headers every
 * answer carries. */
static enum MHD_Result send_body(cn__req *r, int status, char *body,
                                 const char *ctype) {
  if (body == NULL) {
    status = 500;
    body = strdup("{\"error\":{\"code\":\"internal\",\"message\":\"out of "
                  "memory\"}}");
    if (body == NULL) return MHD_NO;
  }
  struct MHD_Response *resp = MHD_create_response_from_buffer(
      strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (resp == NULL) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(resp, "Content-Type", ctype);
  MHD_add_response_header(resp, "X-Request-Id", r->id);
  if (status == 429 || status == 503) {
    char ra[16];
    snprintf(ra, sizeof(ra), "%d", cn__retry_after_s(r->srv));
    MHD_add_response_header(resp, "Retry-After", ra);
  }
  /* Draining: this answer is the connection's last. Without the header a
   * keep-alive client sends its next request into a socket that closes
   * at exit, and that request is lost; with it the client reconnects
   * (to another replica, behind a load balancer). */
  if (atomic_load(&r->srv->draining))
    MHD_add_response_header(resp, "Connection", "close");
  if (status == 405)
    MHD_add_response_header(resp, "Allow",
                            strstr(r->path, "/infer") ? "POST"
                                                      : "GET, HEAD");
  enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static enum MHD_Result answer_now(cn__req *r, int status, char *body,
                                  const char *ctype) {
  r->state = CN__REQ_ANSWERED;
  account(r, status, NULL);
  return send_body(r, status, body, ctype ? ctype : "application/json");
}

static enum MHD_Result answer_err(cn__req *r, int code, const char *msg) {
  return answer_now(r, cn_err_http_status(code),
                    cn__error_body(code, msg, -1), NULL);
}

static enum MHD_Result answer_cn_err(cn__req *r, const cn_err *e) {
  json_t *j = cn_err_to_json(e);
  char *s = json_dumps(j, DUMP_FLAGS);
  json_decref(j);
  return answer_now(r, cn_err_http_status(e->code), s, NULL);
}

void cn__req_answer(cn__req *r, int status, char *body, const char *reason) {
  cn__server *s = r->srv;
  if (r->state != CN__REQ_WAITING) {
    free(body);
    return;
  }
  r->state = CN__REQ_ANSWERED;
  atomic_store(&r->cancelled, 1);
  r->status = status;
  r->resp = body;
  r->reason = reason;
  if (r->tmo_open) {
    r->tmo_open = false;
    uv_close((uv_handle_t *)&r->tmo, cn__handle_unref_cb);
  }
  if (r->poll_open) {
    r->poll_open = false;
    uv_close((uv_handle_t *)&r->poll, cn__handle_unref_cb);
  }
  if (r->wprev) r->wprev->wnext = r->wnext;
  else s->waiting = r->wnext;
  if (r->wnext) r->wnext->wprev = r->wprev;
  r->wprev = r->wnext = NULL;
  account(r, status, reason);
  MHD_resume_connection(r->conn);
  cn__http_kick(s);
}

/* A suspended request goes to the loop thread: at once in uv-poll mode
 * (this is the loop), through the inbox from MHD's thread otherwise. */
static enum MHD_Result hand_over(cn__req *r) {
  cn__server *s = r->srv;
  if (!s->mhd_thread) {
    cn__batcher_dispatch(s, r);
    return MHD_YES;
  }
  pthread_mutex_lock(&s->imu);
  if (s->itail) s->itail->inbox_next = r;
  else s->ihead = r;
  s->itail = r;
  pthread_mutex_unlock(&s->imu);
  uv_async_send(&s->inbox_async);
  return MHD_YES;
}

/* The body is complete: validate, then suspend and hand over. */
static enum MHD_Result infer_ready(cn__req *r) {
  cn__server *s = r->srv;
  if (r->too_large) {
    char msg[128];
    snprintf(msg, sizeof(msg), "the body is over %d bytes (max-body-bytes)",
             s->cfg.serve.max_body_bytes);
    return answer_err(r, CN_E_TOO_LARGE, msg);
  }
  if (atomic_load(&s->draining))
    return answer_err(r, CN_E_DRAINING, "the server is shutting down");
  cn_err e;
  cn_err_clear(&e);
  if (cn__infer_parse(r, &e) != 0) {
    int n = r->n_inst;
    r->n_inst = 0; /* error lines report no instances */
    for (int i = 0; i < n; i++) cn_instance_free(r->inst[i]);
    return answer_cn_err(r, &e);
  }
  r->state = CN__REQ_WAITING;
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  r->fd = ci ? ci->connect_fd : -1;
  MHD_suspend_connection(r->conn);
  return hand_over(r);
}

static cn__req *req_new(cn__server *s, struct MHD_Connection *c,
                        const char *url, const char *method) {
  cn__req *r = calloc(1, sizeof(*r));
  if (r == NULL) return NULL;
  atomic_init(&r->refs, 1); /* the connection's */
  atomic_init(&r->cancelled, 0);
  r->srv = s;
  r->conn = c;
  r->fd = -1;
  r->t_arrive = cn__now();
  r->timeout_ms = s->cfg.serve.timeout_ms;
  snprintf(r->method, sizeof(r->method), "%s", method);
  /* logged inside quotes: keep it printable and quote-free */
  snprintf(r->path, sizeof(r->path), "%s", url);
  for (char *p = r->path; *p; p++)
    if (*p < 0x20 || *p == '"' || *p == 0x7f) *p = '?';
  set_id(s, r,
         MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id"));
  atomic_fetch_add(&s->in_flight, 1);
  atomic_fetch_add(&s->requests_seen, 1);
  atomic_store(&s->last_request_us, (long long)(cn__now() * 1e6));
  return r;
}

/* Why a named model cannot be used: 404 naming its state. */
static enum MHD_Result answer_no_model(cn__req *r) {
  char msg[600];
  cn__model_slot *sl = r->slot;
  if (sl == NULL) {
    snprintf(msg, sizeof(msg), "no such model '%s' (GET /v1/models lists "
             "them)", r->model_name);
  } else {
    pthread_mutex_lock(&sl->vmu);
    snprintf(msg, sizeof(msg), "model '%.128s' is not loaded (%s%s%.400s)",
             sl->name, sl->state == CN__MODEL_UNLOADED ? "unloaded"
             : sl->state == CN__MODEL_LOADING         ? "loading"
                                                      : "unavailable",
             sl->reason[0] && sl->state != CN__MODEL_UNLOADED ? ": " : "",
             sl->state != CN__MODEL_UNLOADED ? sl->reason : "");
    pthread_mutex_unlock(&sl->vmu);
  }
  return answer_err(r, CN_E_NO_SUCH_MODEL, msg);
}

/* The mutating repository routes: allowed by model-control, and with the
 * bearer token when one is configured. */
static bool repo_allowed(cn__req *r, enum MHD_Result *ret) {
  const cn_serve_config *sc = &r->srv->cfg.serve;
  if (strcmp(sc->model_control, "none") == 0) {
    *ret = answer_err(r, CN_E_FORBIDDEN, "model-control is none: models "
                      "change only at start-up (set model-control explicit "
                      "or poll)");
    return false;
  }
  if (sc->repository_token[0] != '\0') {
    const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                "Authorization");
    size_t tl = strlen(sc->repository_token);
    bool ok = h != NULL && strncmp(h, "Bearer ", 7) == 0 &&
              strlen(h + 7) == tl;
    /* compare every byte, whatever the first difference */
    unsigned char diff = 0;
    for (size_t i = 0; ok && i < tl; i++)
      diff |= (unsigned char)(h[7 + i] ^ sc->repository_token[i]);
    if (!ok || diff != 0) {
      *ret = answer_err(r, CN_E_UNAUTHORIZED, "this route needs "
                        "'Authorization: Bearer TOKEN' (repository-token)");
      return false;
    }
  }
  return true;
}

static char *ready_body(cn__model_entry *me) {
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(me->name));
  json_object_set_new(o, "version", json_string(me->version));
  json_object_set_new(o, "ready", json_true());
  char *b = json_dumps(o, DUMP_FLAGS);
  json_decref(o);
  return b;
}

/* Every route but a valid POST .../infer or .../load is answered in one
 * go. */
static enum MHD_Result answer_route(cn__req *r, const char *method) {
  cn__server *s = r->srv;
  cn__route rt = r->route;
  cn__model_entry *me = r->me;
  enum MHD_Result ret;
  bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
  bool post = strcmp(method, "POST") == 0;
  bool wants_post = rt == CN__RT_INFER || rt == CN__RT_REPO_INDEX ||
                    rt == CN__RT_REPO_LOAD || rt == CN__RT_REPO_UNLOAD;
  if (rt == CN__RT_NONE)
    return answer_err(r, CN_E_NO_SUCH_ROUTE, "no such route");
  if ((wants_post && !post) || (!wants_post && !get))
    return answer_err(r, CN_E_METHOD_NOT_ALLOWED,
                      wants_post ? "use POST" : "use GET");
  if ((rt == CN__RT_MODEL || rt == CN__RT_INFER) && me == NULL)
    return answer_no_model(r);
  if (rt == CN__RT_MODEL_READY) {
    cn__model_entry *cur = cn__model_retain(r->slot);
    if (cur == NULL) {
      if (r->slot == NULL) return answer_no_model(r);
      char msg[200];
      snprintf(msg, sizeof(msg), "model '%s' is not ready",
               r->slot->name);
      return answer_err(r, CN_E_UNAVAILABLE, msg);
    }
    char *b = ready_body(cur);
    cn__model_release(cur);
    return answer_now(r, 200, b, NULL);
  }
  if (rt == CN__RT_REPO_UNLOAD) {  /* the index only reads: no guard */
    if (!repo_allowed(r, &ret)) return ret;
    {
      cn__model_entry *cur = cn__model_retain(r->slot);
      if (cur == NULL) return answer_no_model(r);
      cn__model_release(cur);
      cn__repo_unload(s, r->slot);
      char *b = strdup("{\"state\":\"UNLOADED\"}");
      return answer_now(r, 200, b, NULL);
    }
  }
  if (rt == CN__RT_REPO_LOAD) {
    if (!repo_allowed(r, &ret)) return ret;
    if (atomic_load(&s->draining))
      return answer_err(r, CN_E_DRAINING, "the server is shutting down");
    /* loaded on a loader thread; the answer comes when it is done */
    r->state = CN__REQ_WAITING;
    MHD_suspend_connection(r->conn);
    return hand_over(r);
  }
  int status;
  char *body = NULL;
  const char *ctype;
  if (cn__route_get(s, rt, me, &status, &body, &ctype) != 0) {
    free(body);
    return answer_err(r, CN_E_INTERNAL, "could not build the answer");
  }
  return answer_now(r, status, body, ctype);
}

/* Counts the Content-Length headers and whether any two differ. */
typedef struct cl_scan {
  int n;
  bool differ;
  const char *first;
} cl_scan;

static enum MHD_Result scan_cl(void *cls, enum MHD_ValueKind kind,
                               const char *key, const char *value) {
  cl_scan *c = cls;
  if (strcasecmp(key, "Content-Length") != 0) return MHD_YES;
  if (c->n++ == 0) c->first = value;
  else if (strcmp(c->first, value ? value : "") != 0) c->differ = true;
  return MHD_YES;
}

/* MHD's access handler: called once with the headers, once per body chunk,
 * once at the end of the body, and once more after a resume. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  cn__server *s = cls;
  cn__req *r = *con_cls;
  if (r == NULL) {
    r = req_new(s, c, url, method);
    if (r == NULL) return MHD_NO;
    *con_cls = r;
    cn__model_slot *sl;
    const char *name;
    size_t len;
    cn__route rt = cn__route_find(s, url, &sl, &name, &len);
    r->slot = sl;
    r->route = rt;
    if (name != NULL)
      snprintf(r->model_name, sizeof(r->model_name), "%.*s",
               (int)(len < sizeof(r->model_name) ? len
                                                 : sizeof(r->model_name) - 1),
               name);
    /* the version this request will use, held until it is freed: a
     * reload meanwhile does not change it */
    if (rt == CN__RT_INFER || rt == CN__RT_MODEL) r->me = cn__model_retain(sl);
    cn__model_entry *me = r->me;
    /* Two different Content-Length headers: which one frames the body is
     * a guess, and behind a proxy that guesses the other way it is
     * request smuggling (RFC 9112 §6.3). Refused; answering on this first
     * call also closes the connection. */
    cl_scan cls_ = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_cl, &cls_);
    if (cls_.differ)
      return answer_err(r, CN_E_BAD_REQUEST,
                        "conflicting Content-Length headers");
    /* MHD calls again at the end of the (empty or not) body; answering
     * then keeps the connection alive (an answer queued on this first
     * call would close it). A body declared too large is refused now. */
    if (rt == CN__RT_INFER && me != NULL && strcmp(method, "POST") == 0) {
      const char *cl =
          MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
      if (cl != NULL && strtoull(cl, NULL, 10) >
                            (unsigned long long)s->cfg.serve.max_body_bytes) {
        r->too_large = 1;
        return infer_ready(r);
      }
    }
    return MHD_YES;
  }
  if (r->state == CN__REQ_ANSWERED && r->status == 499)
    return MHD_NO; /* the client went away: close */
  if (r->state == CN__REQ_ANSWERED && r->resp != NULL) {
    char *body = r->resp; /* after a resume: send the stored answer */
    r->resp = NULL;
    return send_body(r, r->status, body, "application/json");
  }
  if (r->state != CN__REQ_RECEIVING) {
    *upload_size = 0; /* answered already: the rest is ignored */
    return MHD_YES;
  }
  bool infer = r->route == CN__RT_INFER && r->me != NULL &&
               strcmp(method, "POST") == 0;
  if (*upload_size > 0) {
    size_t n = *upload_size;
    *upload_size = 0;
    /* MHD takes an answer only once the body is in: until then a body
     * that will not be used is read and dropped */
    if (!infer || r->too_large) return MHD_YES;
    if (r->body_len + n > (size_t)s->cfg.serve.max_body_bytes) {
      r->too_large = 1; /* keep reading, keep nothing */
      free(r->body);
      r->body = NULL;
      r->body_len = r->body_cap = 0;
      return MHD_YES;
    }
    if (r->body_len + n > r->body_cap) {
      size_t cap = r->body_cap ? r->body_cap : 4096;
      while (cap < r->body_len + n) cap *= 2;
      char *b = realloc(r->body, cap);
      if (b == NULL) return MHD_NO;
      r->body = b;
      r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, upload, n);
    r->body_len += n;
    return MHD_YES;
  }
  if (!infer) return answer_route(r, method);
  return infer_ready(r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  cn__server *s = cls;
  cn__req *r = *con_cls;
  if (r == NULL) return;
  *con_cls = NULL;
  atomic_fetch_sub(&s->in_flight, 1);
  cn__req_unref(r);
}

/* Open connections, for the drain: it waits for clients still talking. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode toe) {
  cn__server *s = cls;
  atomic_fetch_add(&s->open_conns,
                   toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

void cn__http_set_callbacks(cn__server *s, cn__http_cbs *cbs) {
  (void)s;
  cbs->on_connection = on_connection;
  cbs->on_request = on_request;
  cbs->on_completed = on_completed;
}
