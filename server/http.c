/* http.c - the request logic of the front end: conn.c parses HTTP/1.1 and
 * hands over each request head, body piece and end; this file routes,
 * keeps the body, validates, and answers.
 *
 * Everything runs on the loop thread. A request answered at once is sent
 * before the handler returns. An inference (or a repository load) waits:
 * it goes to window.c (or a loader thread), and the loop answers it
 * later with cn__req_answer, which writes the answer on its connection;
 * conn.c reads nothing more of that connection's requests meanwhile.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "encoding.h"
#include "routes.h"
#include "handlers.h"

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

/* A request id: the client's X-Request-Id when it is short and plain
 * (letters, digits and - _ . : / + = @: a UUID, a hex id, nginx's
 * $request_id), else a fresh one. Never echo bytes that could split a
 * header, nor quotes or backslashes that would break the logfmt line the
 * id is logged in unquoted. */
/* src[0 .. n) into dst (cap bytes), cut to cap - 1 and NUL-terminated:
 * what snprintf's "%.*s" wrote, without its format parse on every
 * request. */
static void copy_cut(char *dst, size_t cap, const char *src, size_t n) {
  if (n > cap - 1) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* v in lower-case hex, at least `width` digits (as "%0*llx"); returns the
 * end. */
static char *put_hex(char *p, unsigned long long v, int width) {
  char t[16];
  int n = 0;
  do {
    t[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v != 0);
  while (n < width) t[n++] = '0';
  while (n > 0) *p++ = t[--n];
  return p;
}

static void set_id(cn__server *s, cn__req *r, const char *given) {
  bool ok = given != NULL && given[0] != '\0' && strlen(given) <= 64;
  for (const char *p = given; ok && *p; p++)
    ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
         (*p >= '0' && *p <= '9') || strchr("-_.:/+=@", *p) != NULL;
  if (ok) {
    strcpy(r->id, given);
    return;
  }
  unsigned long long n = atomic_fetch_add(&s->next_id, 1);
  /* "cn-%08llx-%06llx": at most 3 + 8 + 1 + 16 bytes and the NUL */
  char *p = r->id;
  memcpy(p, "cn-", 3);
  p = put_hex(p + 3,
              (unsigned long long)s->metrics.start_time & 0xffffffffULL, 8);
  *p++ = '-';
  p = put_hex(p, n, 6);
  *p = '\0';
}

static void answer_err(cn__req *r, int code, const char *msg) {
  cn__req_answer_now(r, cn_err_http_status(code),
                     cn__error_body(code, msg, -1), NULL);
}

/* An error of the front end (framing, limits, deadlines, max-connections):
 * conn.c closes the connection after it. */
static void http_fail(cn__req *r, int code, const char *msg) {
  answer_err(r, code, msg);
}

static void answer_cn_err(cn__req *r, const cn_err *e) {
  json_t *j = cn_err_to_json(e);
  char *s = json_dumps(j, DUMP_FLAGS);
  json_decref(j);
  cn__req_answer_now(r, cn_err_http_status(e->code), s, NULL);
}

/* A request that waits (an inference for its run, a load for its loader
 * thread) goes to window.c; cn__req_answer answers it. */
static void hand_over(cn__req *r) {
  cn__server *s = r->srv;
  if (s->hand_over != NULL) s->hand_over(s, r);
  else if (r->route == CN__RT_REPO_LOAD)
    cn__repo_load_async(s, r->model_name, r);
  else cn__window_submit(s, r);
}

static void http_parsed(cn__req *r);

/* The body is complete: validate, then suspend and hand over. A big body
 * is parsed on the threadpool first (bigparse.c), except with no loop
 * running (the HTTP fuzz target answers requests itself). */
static void infer_ready(cn__req *r) {
  cn__server *s = r->srv;
  if (atomic_load(&s->draining)) {
    answer_err(r, CN_E_DRAINING, "the server is shutting down");
    return;
  }
  char full[160];
  if (s->hand_over == NULL && cn__window_full(s, full, sizeof(full))) {
    answer_err(r, CN_E_OVERLOADED, full); /* not parsed: window.c */
    return;
  }
  /* a compressed body is parsed off the loop whatever its size: it may
   * inflate a thousandfold */
  if ((r->body_len > CN__BIG_BODY_BYTES || r->body_enc != CN__ENC_NONE) &&
      s->hand_over == NULL) {
    cn__bigparse_submit(r, http_parsed);
    return;
  }
  cn_err e;
  cn_err_clear(&e);
  int rc;
  if (s->hand_over != NULL) { /* no loop turns: timed alone */
    double t0 = cn_thread_cpu_s();
    rc = cn__infer_parse(r, &e);
    cn__metrics_stage(&s->metrics, r->me->index, CN__STAGE_PARSE,
                      cn_thread_cpu_s() - t0, true);
  } else {
    double t0 = cn__parse_begin(s);
    rc = cn__infer_parse(r, &e);
    cn__parse_end(s, r->me->index, t0);
  }
  if (rc != 0 || cn__req_reserve_answer(r, &e) != 0) {
    answer_cn_err(r, &e);
    return;
  }
  r->state = CN__REQ_WAITING;
  hand_over(r);
}

/* r's big body is parsed (r->prc, r->perr, r->parsed): answer or hand
 * over. */
static void http_parsed(cn__req *r) {
  if (r->prc != 0) {
    answer_cn_err(r, &r->perr);
    return;
  }
  cn__infer_commit(r, &r->parsed);
  cn_err e;
  cn_err_clear(&e);
  if (cn__req_reserve_answer(r, &e) != 0) {
    answer_cn_err(r, &e);
    return;
  }
  r->state = CN__REQ_WAITING;
  hand_over(r);
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

#define MAX_PATH 8200

/* The path of a request target: up to '?' or '#', %XX decoded (as MHD
 * did; a model name is one segment of it). */
static bool url_path(char *dst, size_t cap, const char *url) {
  size_t n = 0;
  for (const char *p = url; *p && *p != '?' && *p != '#' && n + 1 < cap;
       p++) {
    int hi, lo;
    if (p[0] == '%' && (hi = hexval(p[1])) >= 0 && (lo = hexval(p[2])) >= 0) {
      dst[n] = (char)(hi * 16 + lo);
      /* an encoded NUL would cut the path short, and an encoded '/'
       * would split a segment (a model name): neither names anything */
      if (dst[n] == '\0' || dst[n] == '/') {
        dst[0] = '\0';
        return false;
      }
      n++;
      p += 2;
    } else {
      dst[n++] = *p;
    }
  }
  dst[n] = '\0';
  return true;
}

/* What the head says of the body and the answer, kept for the parse
 * (which may run on the threadpool, away from the connection): its
 * content coding, the coding the answer may use, and the binary tensor
 * data extension's Inference-Header-Content-Length (kserve.c). */
static void body_framing(cn__req *r, const cn__conn *c) {
  const char *h = cn__conn_header(c, "Inference-Header-Content-Length");
  r->v2_hlen = -1;
  if (h != NULL) {
    char *end;
    while (*h == ' ' || *h == '\t') h++;
    unsigned long long v = strtoull(h, &end, 10);
    while (*end == ' ' || *end == '\t') end++;
    r->v2_hlen = *h >= '0' && *h <= '9' && *end == '\0' && v < (1ULL << 40)
                     ? (long long)v : -2;
  }
  r->body_enc = (unsigned char)cn__enc_of_content(
      cn__conn_header(c, "Content-Encoding"));
  r->answer_enc = (unsigned char)cn__enc_of_accept(
      cn__conn_header(c, "Accept-Encoding"));
}

static cn__req *req_new(cn__server *s, cn__conn *c, const char *url,
                        const char *method) {
  cn__req *r = calloc(1, sizeof(*r));
  if (r == NULL) return NULL;
  atomic_init(&r->refs, 1); /* the connection's */
  atomic_init(&r->cancelled, 0);
  r->srv = s;
  r->conn = c;
  r->t_arrive = cn_now_s(); /* the clock read once for both below */
  r->timeout_ms = s->cfg.serve.timeout_ms;
  copy_cut(r->method, sizeof(r->method), method, strlen(method));
  /* logged inside quotes: keep it printable and quote-free */
  copy_cut(r->path, sizeof(r->path), url, strnlen(url, sizeof(r->path)));
  for (char *p = r->path; *p; p++)
    if (*p < 0x20 || *p == '"' || *p == '\\' || *p == 0x7f) *p = '?';
  set_id(s, r, cn__conn_header(c, "X-Request-Id"));
  body_framing(r, c);
  atomic_fetch_add(&s->in_flight, 1);
  atomic_fetch_add(&s->requests_seen, 1);
  atomic_store(&s->last_request_us, (long long)(r->t_arrive * 1e6));
  return r;
}

/* Why a named model cannot be used: 404 naming its state. */
static void answer_no_model(cn__req *r) {
  char msg[600];
  cn__model_slot *sl = r->slot;
  char near[CN__NAME_MAX];
  if (sl == NULL && r->model_name_len < CN__NAME_MAX &&
      cn__repo_nearest(r->srv, r->model_name, near, sizeof(near))) {
    snprintf(msg, sizeof(msg), "no such model '%s'; did you mean '%s'? "
             "(names are case-sensitive; GET /v1/models lists them)",
             r->model_name, near);
  } else if (sl == NULL) {
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
  answer_err(r, CN_E_NO_SUCH_MODEL, msg);
}

/* The mutating repository routes: allowed by model-control, and with the
 * bearer token when one is configured; with none, only on a loopback host
 * or with repository-insecure (cn__repo_guard_init). */
static bool repo_allowed(cn__req *r) {
  const cn_serve_config *sc = &r->srv->cfg.serve;
  if (strcmp(sc->model_control, "none") == 0) {
    answer_err(r, CN_E_FORBIDDEN, "model-control is none: models "
                      "change only at start-up (set model-control explicit "
                      "or poll)");
    return false;
  }
  if (!r->srv->repo_open) {
    char msg[600];
    snprintf(msg, sizeof(msg), "the repository's load and unload routes "
             "are off: the daemon listens on %.200s (not loopback) with no "
             "repository-token; set repository-token (or repository-insecure "
             "true to let anyone who reaches the port load models)", sc->host);
    answer_err(r, CN_E_FORBIDDEN, msg);
    return false;
  }
  if (sc->repository_token[0] != '\0') {
    const char *h = cn__conn_header(r->conn, "Authorization");
    size_t tl = strlen(sc->repository_token);
    bool ok = h != NULL && strncmp(h, "Bearer ", 7) == 0 &&
              strlen(h + 7) == tl;
    /* compare every byte, whatever the first difference */
    unsigned char diff = 0;
    for (size_t i = 0; ok && i < tl; i++)
      diff |= (unsigned char)(h[7 + i] ^ sc->repository_token[i]);
    if (!ok || diff != 0) {
      answer_err(r, CN_E_UNAUTHORIZED, "this route needs "
                        "'Authorization: Bearer TOKEN' (repository-token)");
      return false;
    }
  }
  return true;
}

/* A path's /versions/{v} that is not the version serving: 404 saying
 * which one is (true: answered). */
static bool answer_bad_version(cn__req *r, const cn__model_entry *me) {
  if (r->want_version[0] == '\0' ||
      (!r->version_bad && strcmp(r->want_version, me->version) == 0))
    return false;
  char msg[640];
  snprintf(msg, sizeof(msg), "model '%s' has no version '%.80s': it serves "
           "version '%s' (GET /v2/models/%s)", me->name, r->want_version,
           me->version, me->name);
  answer_err(r, CN_E_NO_SUCH_MODEL, msg);
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

/* The checks every route passes before its answer: a route, a name that
 * can be a model's, the method, and the model and version the route
 * names. true: r is answered (refused). */
static bool route_refused(cn__req *r) {
  cn__route rt = r->route;
  cn__model_entry *me = r->me;
  const char *method = r->method;
  bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
  bool post = strcmp(method, "POST") == 0;
  bool wants_post = rt == CN__RT_INFER || rt == CN__RT_REPO_INDEX ||
                    rt == CN__RT_REPO_LOAD || rt == CN__RT_REPO_UNLOAD;
  if (rt == CN__RT_NONE) {
    answer_err(r, CN_E_NO_SUCH_ROUTE, "no such route");
    return true;
  }
  if (r->model_name_len >= CN__NAME_MAX) {
    char msg[160];
    snprintf(msg, sizeof(msg), "no such model: the name has %zu bytes; a "
             "model name has at most %d", r->model_name_len,
             CN__NAME_MAX - 1);
    answer_err(r, CN_E_NO_SUCH_MODEL, msg);
    return true;
  }
  /* models-dir's hidden entries are never models, and '.' and '..' would
   * make the load route read models-dir itself or its parent */
  if (r->model_name_len > 0 && r->model_name[0] == '.') {
    answer_err(r, CN_E_NO_SUCH_MODEL, "no such model: a model name does "
               "not start with '.' (models-dir's hidden entries are never "
               "models)");
    return true;
  }
  if ((wants_post && !post) || (!wants_post && !get)) {
    answer_err(r, CN_E_METHOD_NOT_ALLOWED, wants_post ? "use POST"
                                                      : "use GET");
    return true;
  }
  /* a route of one model, or the statistics of one (/v2/models/stats,
   * every model's, names none) */
  bool one_model = rt == CN__RT_MODEL || rt == CN__RT_INFER ||
                   rt == CN__RT_V2_MODEL || rt == CN__RT_V2_CONFIG ||
                   (rt == CN__RT_V2_STATS && r->model_name_len > 0);
  if (one_model && me == NULL) {
    answer_no_model(r);
    return true;
  }
  if (me != NULL && answer_bad_version(r, me)) return true;
  return false;
}

/* GET .../ready: the version serving now, checked against the one the
 * request names. */
static void answer_model_ready(cn__req *r) {
  cn__model_entry *cur = cn__model_retain(r->slot);
  if (cur == NULL) {
    if (r->slot == NULL) {
      answer_no_model(r);
      return;
    }
    char msg[200];
    snprintf(msg, sizeof(msg), "model '%s' is not ready",
             r->slot->name);
    answer_err(r, CN_E_UNAVAILABLE, msg);
    return;
  }
  if (answer_bad_version(r, cur)) {
    cn__model_release(cur);
    return;
  }
  char *b = ready_body(cur);
  cn__model_release(cur);
  cn__req_answer_now(r, 200, b, NULL);
}

/* POST .../unload, behind the repository guard. */
static void answer_repo_unload(cn__req *r) {
  cn__server *s = r->srv;
  if (!repo_allowed(r)) return;
  cn__model_entry *cur = cn__model_retain(r->slot);
  /* a model loading (or waiting to) is unloaded too: its load is
   * cancelled */
  if (cur == NULL && (r->slot == NULL || !cn__repo_busy(r->slot))) {
    answer_no_model(r);
    return;
  }
  cn__model_release(cur);
  cn__repo_unload(s, r->slot);
  cn__req_answer_now(r, 200, strdup("{\"state\":\"UNLOADED\"}"), NULL);
}

/* POST .../load, behind the repository guard. */
static void answer_repo_load(cn__req *r) {
  cn__server *s = r->srv;
  if (!repo_allowed(r)) return;
  if (atomic_load(&s->draining)) {
    answer_err(r, CN_E_DRAINING, "the server is shutting down");
    return;
  }
  /* loaded on a loader thread; the answer comes when it is done */
  r->state = CN__REQ_WAITING;
  hand_over(r);
}

/* Every route but a valid POST .../infer or .../load is answered in one
 * go. */
static void answer_route(cn__req *r) {
  cn__server *s = r->srv;
  cn__route rt = r->route;
  cn__model_entry *me = r->me;
  if (route_refused(r)) return;
  if (rt == CN__RT_MODEL_READY) {
    answer_model_ready(r);
    return;
  }
  if (rt == CN__RT_REPO_UNLOAD) { /* the index only reads: no guard */
    answer_repo_unload(r);
    return;
  }
  if (rt == CN__RT_REPO_LOAD) {
    answer_repo_load(r);
    return;
  }
  int status;
  char *body = NULL;
  const char *ctype;
  if (cn__route_get(s, rt, me, &status, &body, &ctype) != 0) {
    free(body);
    answer_err(r, CN_E_INTERNAL, "could not build the answer");
    return;
  }
  cn__req_answer_now(r, status, body, ctype);
}

static bool wants_body(const cn__req *r) {
  return r->route == CN__RT_INFER && r->me != NULL && !r->version_bad &&
         strcmp(r->method, "POST") == 0;
}

/* conn.c: a request head is in (the connection holds the reference). */
static cn__req *http_begin(cn__server *s, cn__conn *c, const char *method,
                           const char *url) {
  /* RFC 9112 §3.2.2: a server accepts the absolute form of a target
   * (http://host/path, what a request to a proxy carries) */
  if (strncasecmp(url, "http://", 7) == 0 ||
      strncasecmp(url, "https://", 8) == 0) {
    const char *p = strstr(url, "://") + 3;
    url = p + strcspn(p, "/?#");
    if (*url != '/') url = "/";
  }
  char path[MAX_PATH];
  bool decoded = url_path(path, sizeof(path), url);
  /* logged as decoded, or as sent where that names nothing (%00, %2F) */
  cn__req *r = req_new(s, c, decoded ? path : url, method);
  if (r == NULL) return NULL;
  cn__route_match m;
  cn__route rt = cn__route_find(s, path, &m);
  r->slot = m.slot;
  r->route = rt;
  r->v2 = m.v2;
  if (m.name != NULL) {
    /* a name too long to be a model's is kept only for messages (cut),
     * never looked up or loaded cut */
    r->model_name_len = m.len;
    copy_cut(r->model_name, sizeof(r->model_name), m.name, m.len);
  }
  if (m.version != NULL) { /* a version too long to be one never matches */
    r->version_bad = m.vlen >= sizeof(r->want_version);
    copy_cut(r->want_version, sizeof(r->want_version), m.version, m.vlen);
  }
  /* the version this request will use, held until it is freed: a reload
   * meanwhile does not change it */
  if (rt == CN__RT_INFER || rt == CN__RT_MODEL || rt == CN__RT_V2_MODEL ||
      rt == CN__RT_V2_CONFIG || rt == CN__RT_V2_STATS)
    r->me = cn__model_retain(m.slot);
  if (r->me != NULL && r->want_version[0] != '\0' &&
      strcmp(r->want_version, r->me->version) != 0)
    r->version_bad = true; /* the body is not read: answered 404 */
  return r;
}

static void too_large(cn__req *r) {
  char msg[128];
  snprintf(msg, sizeof(msg), "the body is over %d bytes (max-body-bytes)",
           r->srv->cfg.serve.max_body_bytes);
  answer_err(r, CN_E_TOO_LARGE, msg);
}

/* The head is parsed; body_len: its Content-Length (0 when chunked or
 * none). A body declared over max-body-bytes is refused before it is read,
 * whatever the route: none takes more, and reading it only to drop it
 * would hold the connection (returns 1: answered). */
static int http_head_done(cn__req *r, unsigned long long body_len) {
  if (body_len > (unsigned long long)r->srv->cfg.serve.max_body_bytes) {
    too_large(r);
    return 1;
  }
  r->body_declared = (size_t)body_len;
  return 0;
}

/* A body's first buffer: the length it declared where that is below
 * 4 KiB, else 4 KiB, grown by doubling as its bytes arrive (so a big
 * declared length holds no memory before its bytes come). A small body
 * in a buffer of its own size comes from malloc's per-thread cache: a
 * 4 KiB buffer for a 600-byte tree took ~240 instructions more to
 * allocate and free (callgrind, one tree a request). */
#define BODY_FIRST_CAP 4096
static size_t body_first_cap(const cn__req *r) {
  size_t d = r->body_declared;
  return d > 0 && d < BODY_FIRST_CAP ? d : BODY_FIRST_CAP;
}

/* A piece of the body: kept for an inference, dropped otherwise. Over
 * max-body-bytes it is refused at once (returns 1: answered). */
static int http_body(cn__req *r, const char *data, size_t n) {
  if (!wants_body(r)) return 0;
  size_t max = (size_t)r->srv->cfg.serve.max_body_bytes;
  if (r->body_len + n > max) {
    too_large(r);
    return 1;
  }
  if (r->body_len + n > r->body_cap) {
    size_t cap = r->body_cap ? r->body_cap : body_first_cap(r);
    while (cap < r->body_len + n) cap *= 2;
    if (cap > max) cap = max;
    /* the bodies held at once are bounded (max-body-memory): many
     * connections each sending a big body, or waiting for their turn to
     * be parsed, would otherwise hold max-connections x max-body-bytes.
     * A body of up to CN__BIG_BODY_BYTES is counted but never refused:
     * those are bounded by max-connections x 16 KiB already, and a few
     * connections holding big bodies would otherwise turn every ordinary
     * request away (32 half-sent 8 MiB bodies would make every POST
     * 429 for body-timeout-s) */
    long long grow = (long long)(cap - r->body_cap);
    long long held = atomic_fetch_add(&r->srv->body_bytes, grow) + grow;
    if (cap > CN__BIG_BODY_BYTES &&
        held > (long long)r->srv->cfg.serve.max_body_memory) {
      atomic_fetch_sub(&r->srv->body_bytes, grow);
      char msg[200];
      snprintf(msg, sizeof(msg), "the server holds %lld bytes of request "
               "bodies (max-body-memory %d); retry later", held - grow,
               r->srv->cfg.serve.max_body_memory);
      answer_err(r, CN_E_OVERLOADED, msg);
      return 1;
    }
    char *b = realloc(r->body, cap);
    if (b == NULL) {
      atomic_fetch_sub(&r->srv->body_bytes, grow);
      answer_err(r, CN_E_NOMEM, "out of memory");
      return 1;
    }
    r->body = b;
    r->body_cap = cap;
  }
  memcpy(r->body + r->body_len, data, n);
  r->body_len += n;
  return 0;
}

/* The request is complete: answered now, or handed over to wait. */
static void http_complete(cn__req *r) {
  if (r->state != CN__REQ_RECEIVING) return;
  if (wants_body(r)) infer_ready(r);
  else answer_route(r);
}

/* The client hung up: a request waiting for its run leaves it (the
 * window.c answers it 499, which closes the connection). */
static void http_hangup(cn__req *r) {
  if (r->state == CN__REQ_WAITING && r->route == CN__RT_INFER)
    cn__window_cancel(r, "disconnect", 499);
}

const cn__http_hooks cn__http_handlers = {
    http_begin, http_head_done, http_body,       http_complete,
    http_fail,  http_hangup,    cn__req_unref,   cn__retry_after_s};
