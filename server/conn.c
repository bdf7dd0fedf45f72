/* conn.c - Canopy's HTTP/1.1 connections: libuv sockets, Debian's
 * libhttp-parser (nodejs's http_parser 2.9), deadlines and the write path.
 *
 * One cn__conn per client connection, all on the loop thread. Its input
 * is parsed by http_parser; the parsed request goes to http.c (route,
 * validate, answer) and its answer comes back here as one buffer of
 * headers and body. A connection carries one request at a time: the
 * parser is paused at the end of each message, and the next pipelined
 * request is parsed only once the answer to the previous one is written,
 * so answers go out in order. While a request waits for its run the
 * socket is still read (into a bounded buffer) so that a client that
 * hangs up is seen at once (499); while an answer is unwritten nothing is
 * read, so a client that does not read its answers holds one answer's
 * memory, not more.
 *
 * Deadlines (one sweep timer for every connection, HTTP_TICK_MS):
 *   header-timeout-s  from the first byte of a request to its blank line;
 *   body-timeout-s    from there to the body's last byte;
 *   idle-timeout-s    between requests, and for an answer the client does
 *                     not read.
 * A header or body deadline that passes is answered 408 and the
 * connection closed; an idle one is closed silently.
 *
 * Input and output are separate from the socket (cn__conn_feed, the
 * sink), so tests/fuzz/fuzz_http.c drives the same parser and handlers in
 * memory.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <http_parser.h>

#include "routes.h"
#include "serve_impl.h"

/* Limits of a request head (not configurable: they bound memory, not
 * what clients need): the URL, the whole head, the header lines. */
#define MAX_URL 8192
#define MAX_HEAD 32768
#define MAX_HEADERS 100
/* Input read ahead of the request being answered (pipelined requests). */
#define MAX_AHEAD 65536
/* After an answer that closes the connection, the rest of what the client
 * sends is read and dropped for this long, so that the client reads the
 * answer instead of a reset. */
#define LINGER_S 2.0

enum { PH_IDLE, PH_HEAD, PH_BODY, PH_ANSWER, PH_LINGER, PH_CLOSED };

typedef struct hdr {
  size_t name, value; /* offsets into hb, NUL-terminated */
} hdr;

struct cn__conn {
  cn__server *srv;
  uv_tcp_t tcp;
  bool sock;                /* a socket; else output goes to sink      */
  bool counted;             /* in open_conns                           */
  bool refused;             /* beyond max-connections: in refused_conns */
  cn__conn *prev, *next;    /* s->conns                                */
  http_parser p;
  int phase;
  double deadline;          /* cn__now() seconds; 0: none              */
  /* the head of the request being read */
  char *hb;
  size_t hlen, hcap;
  int part;                 /* 0 url, 1 field, 2 value: the last piece */
  size_t url_len;
  hdr h[MAX_HEADERS];
  int nh;
  bool expect_continue;
  /* the request being read or answered */
  cn__req *r;
  bool complete;            /* message complete, not yet handled       */
  bool must_close;          /* close once the answer is written        */
  int err_code;             /* a callback refused: CN_E_* ...          */
  char err_msg[200];        /* ... and why                             */
  /* input read and not yet parsed */
  char *in;
  size_t in_len, in_cap;
  bool reading;
  bool pumping;             /* inside conn_pump: answers do not recurse */
  /* output */
  int writes;               /* uv_writes not yet done                  */
  double write_deadline;
  cn__conn_sink sink;
  void *sink_ud;
};

static http_parser_settings settings;

static void conn_pump(cn__conn *c);
static void conn_close(cn__conn *c);
static void conn_reads(cn__conn *c);

/* ---- the head ------------------------------------------------------- */

static int hb_put(cn__conn *c, const char *d, size_t n) {
  if (c->hlen + n + 1 > MAX_HEAD) return -1;
  if (c->hlen + n + 1 > c->hcap) {
    size_t cap = c->hcap ? c->hcap : 512;
    while (cap < c->hlen + n + 1) cap *= 2;
    char *b = realloc(c->hb, cap);
    if (b == NULL) return -1;
    c->hb = b;
    c->hcap = cap;
  }
  memcpy(c->hb + c->hlen, d, n);
  c->hlen += n;
  c->hb[c->hlen] = '\0'; /* a head cut short still reads as strings */
  return 0;
}

/* A callback's refusal: -1 stops http_parser (from on_headers_complete,
 * 1 would only mean "no body"). */
static int refuse(cn__conn *c, int code, const char *msg) {
  c->err_code = code;
  snprintf(c->err_msg, sizeof(c->err_msg), "%s", msg);
  return -1;
}

static int head_too_large(cn__conn *c) {
  char m[120];
  snprintf(m, sizeof(m), "the request head is over %d bytes", MAX_HEAD);
  return refuse(c, CN_E_HEADER_TOO_LARGE, m);
}

const char *cn__conn_header(const cn__conn *c, const char *name) {
  for (int i = 0; i < c->nh; i++)
    if (strcasecmp(c->hb + c->h[i].name, name) == 0)
      return c->hb + c->h[i].value;
  return NULL;
}

static int on_message_begin(http_parser *p) {
  cn__conn *c = p->data;
  c->phase = PH_HEAD;
  c->deadline = cn__now() + c->srv->cfg.serve.header_timeout_s;
  c->hlen = 0;
  c->part = 0;
  c->url_len = 0;
  c->nh = 0;
  c->expect_continue = false;
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t n) {
  cn__conn *c = p->data;
  c->url_len += n;
  if (c->url_len > MAX_URL) {
    char m[80];
    snprintf(m, sizeof(m), "the URL is over %d bytes", MAX_URL);
    return refuse(c, CN_E_URI_TOO_LONG, m);
  }
  return hb_put(c, at, n) ? head_too_large(c) : 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n) {
  cn__conn *c = p->data;
  if (c->phase != PH_HEAD) return 0; /* a chunked body's trailer: unused */
  if (c->part != 1) { /* a new header: end the URL or the last value */
    if (c->nh == MAX_HEADERS) {
      char m[80];
      snprintf(m, sizeof(m), "more than %d header lines", MAX_HEADERS);
      return refuse(c, CN_E_HEADER_TOO_LARGE, m);
    }
    if (hb_put(c, "", 1)) return head_too_large(c);
    c->h[c->nh].name = c->hlen;
    c->h[c->nh].value = c->hlen;
    c->nh++;
    c->part = 1;
  }
  return hb_put(c, at, n) ? head_too_large(c) : 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n) {
  cn__conn *c = p->data;
  if (c->phase != PH_HEAD) return 0;
  if (c->part != 2) {
    if (c->part != 1 || hb_put(c, "", 1)) return head_too_large(c);
    c->h[c->nh - 1].value = c->hlen;
    c->part = 2;
  }
  return hb_put(c, at, n) ? head_too_large(c) : 0;
}

/* Framing checks http_parser leaves to its caller, then the request. */
static int on_headers_complete(http_parser *p) {
  cn__conn *c = p->data;
  cn__server *s = c->srv;
  if (hb_put(c, "", 1)) return head_too_large(c);
  if (c->part == 1) c->h[c->nh - 1].value = c->hlen - 1; /* no value */
  int n_cl = 0, n_te = 0;
  const char *te = NULL;
  for (int i = 0; i < c->nh; i++) {
    const char *k = c->hb + c->h[i].name;
    /* RFC 9112 §5.1: no whitespace between a field name and its colon
     * (http_parser reads "Content-Length :" as the length; a proxy may
     * not), and a name is a token */
    for (const char *q = k; *q; q++)
      if (*q <= 0x20 || *q >= 0x7f || strchr("\"(),/:;<=>?@[\\]{}", *q))
        return refuse(c, CN_E_BAD_REQUEST,
                      "a header name holds whitespace or a separator");
    /* a value's trailing whitespace is not part of it (§5.5) */
    char *v = c->hb + c->h[i].value;
    for (size_t vl = strlen(v); vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t');)
      v[--vl] = '\0';
    if (strcasecmp(k, "Content-Length") == 0) n_cl++;
    if (strcasecmp(k, "Transfer-Encoding") == 0) {
      n_te++;
      te = c->hb + c->h[i].value;
    }
    if (strcasecmp(k, "Expect") == 0) {
      if (strcasecmp(c->hb + c->h[i].value, "100-continue") == 0)
        c->expect_continue = true;
      else
        return refuse(c, CN_E_BAD_REQUEST, "unsupported Expect header");
    }
  }
  /* RFC 9112 §6.3: which length frames the body would be a guess, and
   * behind a proxy that guesses the other way it is request smuggling */
  if (n_cl > 1)
    return refuse(c, CN_E_BAD_REQUEST, "more than one Content-Length header");
  if (n_cl > 0 && n_te > 0)
    return refuse(c, CN_E_BAD_REQUEST,
                  "both Content-Length and Transfer-Encoding");
  if (n_te > 1 || (te != NULL && strcasecmp(te, "chunked") != 0))
    return refuse(c, CN_E_NOT_IMPLEMENTED,
                  "Transfer-Encoding other than chunked");
  if (p->http_major != 1 || p->http_minor > 1)
    return refuse(c, CN_E_BAD_REQUEST, "unsupported HTTP version (1.0 "
                  "and 1.1 are served)");
  char method[16];
  snprintf(method, sizeof(method), "%s",
           http_method_str((enum http_method)p->method));
  c->r = cn__http_begin(s, c, method, c->hb);
  if (c->r == NULL) return refuse(c, CN_E_NOMEM, "out of memory");
  bool chunked = te != NULL;
  bool body = chunked || (p->content_length > 0 &&
                          p->content_length != ULLONG_MAX);
  if (body) {
    c->phase = PH_BODY;
    c->deadline = cn__now() + s->cfg.serve.body_timeout_s;
  }
  /* a body declared too large is refused before it is sent */
  if (cn__http_head_done(c->r, body && !chunked ? p->content_length : 0)) {
    c->must_close = true;
    return -1;
  }
  if (body && c->expect_continue && p->http_major == 1 && p->http_minor >= 1)
    cn__conn_write(c, strdup("HTTP/1.1 100 Continue\r\n\r\n"), 25);
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t n) {
  cn__conn *c = p->data;
  if (c->r == NULL) return -1;
  if (cn__http_body(c->r, at, n)) { /* answered (too large): stop here */
    c->must_close = true;
    return -1;
  }
  return 0;
}

static int on_message_complete(http_parser *p) {
  cn__conn *c = p->data;
  c->phase = PH_ANSWER;
  c->deadline = 0;
  c->complete = true;
  http_parser_pause(p, 1);
  return 0;
}

/* ---- answers --------------------------------------------------------- */

static const char *reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

static void on_shutdown(uv_shutdown_t *sh, int status) { free(sh); }

/* The last answer is out: send FIN, keep reading (and dropping) until the
 * client closes or LINGER_S passes. */
static void conn_shutdown(cn__conn *c) {
  if (!c->sock || c->phase == PH_CLOSED) return;
  uv_shutdown_t *sh = malloc(sizeof(*sh));
  if (sh == NULL || uv_shutdown(sh, (uv_stream_t *)&c->tcp, on_shutdown) != 0)
    free(sh);
  conn_reads(c);
}

typedef struct wreq {
  uv_write_t w;
  char *buf;
} wreq;

static void on_written(uv_write_t *w, int status) {
  wreq *q = (wreq *)w;
  cn__conn *c = w->data;
  free(q->buf);
  free(q);
  c->writes--;
  if (c->phase == PH_CLOSED) return; /* cancelled by the close */
  if (status < 0) {
    conn_close(c);
    return;
  }
  if (c->writes > 0) return;
  if (c->phase == PH_LINGER) conn_shutdown(c);
  else conn_pump(c);
}

/* Writes buf (taken over) out: at once where the socket takes it, else
 * queued; the connection reads nothing more until it is written. */
void cn__conn_write(cn__conn *c, char *buf, size_t len) {
  if (buf == NULL) {
    conn_close(c);
    return;
  }
  if (c->phase == PH_CLOSED) {
    free(buf);
    return;
  }
  if (!c->sock) {
    if (c->sink) c->sink(c->sink_ud, buf, len);
    free(buf);
    return;
  }
  uv_buf_t b = uv_buf_init(buf, (unsigned)len);
  int n = c->writes == 0 ? uv_try_write((uv_stream_t *)&c->tcp, &b, 1)
                         : UV_EAGAIN;
  if (n == (int)len) {
    free(buf);
    return;
  }
  if (n < 0 && n != UV_EAGAIN) {
    free(buf);
    conn_close(c);
    return;
  }
  if (n > 0) {
    b.base += n;
    b.len -= (size_t)n;
  }
  wreq *q = malloc(sizeof(*q));
  if (q == NULL) {
    free(buf);
    conn_close(c);
    return;
  }
  q->buf = buf;
  q->w.data = c;
  if (uv_write(&q->w, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
    free(buf);
    free(q);
    conn_close(c);
    return;
  }
  c->writes++;
  c->write_deadline = cn__now() + c->srv->cfg.serve.idle_timeout_s;
  conn_reads(c);
}

/* The request is done with: the connection's reference goes. */
static void release_req(cn__conn *c) {
  cn__req *r = c->r;
  if (r == NULL) return;
  c->r = NULL;
  c->nh = 0; /* its headers are not the next request's */
  c->hlen = 0;
  r->conn = NULL;
  atomic_fetch_sub(&c->srv->in_flight, 1);
  cn__req_unref(r);
}

/* One answer: status line, headers, body (HEAD: none), in one buffer. */
void cn__conn_respond(cn__req *r, int status, char *body, size_t blen,
                      const char *ctype, const char *extra) {
  cn__conn *c = r->conn;
  if (c == NULL || c->r != r) {
    free(body);
    return;
  }
  cn__server *s = c->srv;
  if (status == 499) { /* the client hung up: nothing to write */
    free(body);
    release_req(c);
    conn_close(c);
    return;
  }
  bool head = strcmp(r->method, "HEAD") == 0;
  bool keep = !c->must_close && !atomic_load(&s->draining) &&
              http_should_keep_alive(&c->p) && !c->p.upgrade;
  if (c->phase != PH_ANSWER) keep = false; /* answered before the body end */
  size_t cap = 512 + strlen(r->id) + (extra ? strlen(extra) : 0) +
               (head ? 0 : blen);
  char *out = malloc(cap);
  if (out == NULL) {
    free(body);
    release_req(c);
    conn_close(c);
    return;
  }
  int n = snprintf(out, cap,
                   "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n"
                   "Content-Length: %zu\r\nX-Request-Id: %s\r\n%s%s",
                   status, reason_phrase(status), ctype, blen, r->id,
                   extra ? extra : "",
                   !keep ? "Connection: close\r\n"
                   : c->p.http_minor == 0 ? "Connection: keep-alive\r\n"
                                          : "");
  if (status == 429 || status == 503)
    n += snprintf(out + n, cap - (size_t)n, "Retry-After: %d\r\n",
                  cn__retry_after_s(s));
  n += snprintf(out + n, cap - (size_t)n, "\r\n");
  if (!head && blen > 0) memcpy(out + n, body, blen);
  size_t len = (size_t)n + (head ? 0 : blen);
  free(body);
  release_req(c);
  if (!keep) c->must_close = true;
  c->phase = keep ? PH_IDLE : PH_LINGER;
  c->deadline = keep ? cn__now() + s->cfg.serve.idle_timeout_s
                     : cn__now() + LINGER_S;
  cn__conn_write(c, out, len);
  if (c->phase == PH_CLOSED || c->writes > 0) return; /* on_written goes on */
  if (!keep && !c->sock) conn_close(c);
  else if (!keep) conn_shutdown(c);
  else if (!c->pumping) conn_pump(c); /* an answer that waited */
}

/* An error of the front end itself (framing, limits, deadlines): one JSON
 * answer with a request id, then close. */
static void answer_error(cn__conn *c, int code, const char *msg) {
  c->must_close = true;
  if (c->r == NULL) {
    const char *url = c->phase == PH_HEAD && c->hlen > 0 ? c->hb : "-";
    c->r = cn__http_begin(c->srv, c, "-", url);
    if (c->r == NULL) {
      conn_close(c);
      return;
    }
  }
  cn__http_fail(c->r, code, msg);
}

/* Why http_parser stopped, as one of docs/api.md's errors. */
static void parse_error(cn__conn *c) {
  enum http_errno e = HTTP_PARSER_ERRNO(&c->p);
  if (c->err_code != 0) {
    int code = c->err_code;
    c->err_code = 0;
    answer_error(c, code, c->err_msg);
    return;
  }
  if (c->phase == PH_LINGER || c->phase == PH_CLOSED)
    return; /* a callback answered already (413) */
  char m[200];
  int code = CN_E_BAD_REQUEST;
  switch (e) {
    case HPE_HEADER_OVERFLOW:
      code = CN_E_HEADER_TOO_LARGE;
      snprintf(m, sizeof(m), "the request head is too large");
      break;
    case HPE_INVALID_CONTENT_LENGTH:
      snprintf(m, sizeof(m), "Content-Length is not a valid length");
      break;
    case HPE_UNEXPECTED_CONTENT_LENGTH:
      snprintf(m, sizeof(m), "more than one Content-Length header, or both "
               "Content-Length and Transfer-Encoding");
      break;
    case HPE_INVALID_TRANSFER_ENCODING:
      code = CN_E_NOT_IMPLEMENTED;
      snprintf(m, sizeof(m), "Transfer-Encoding other than chunked");
      break;
    default:
      snprintf(m, sizeof(m), "malformed HTTP request: %s",
               http_errno_description(e));
  }
  answer_error(c, code, m);
}

/* ---- the input ------------------------------------------------------- */

/* Parses what was read, one request at a time: stops at the end of a
 * message until its answer is written. */
static void conn_pump(cn__conn *c) {
  c->pumping = true;
  while ((c->phase == PH_IDLE || c->phase == PH_HEAD ||
          c->phase == PH_BODY) &&
         c->writes == 0 && c->in_len > 0) {
    if (HTTP_PARSER_ERRNO(&c->p) == HPE_PAUSED) http_parser_pause(&c->p, 0);
    size_t n = http_parser_execute(&c->p, &settings, c->in, c->in_len);
    if (c->phase == PH_CLOSED) return;
    if (n > c->in_len) n = c->in_len;
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
    enum http_errno e = HTTP_PARSER_ERRNO(&c->p);
    if (e != HPE_OK && e != HPE_PAUSED) {
      c->in_len = 0;
      parse_error(c);
      break;
    }
    if (c->complete) {
      c->complete = false;
      if (c->p.upgrade) c->must_close = true; /* not HTTP after this */
      cn__http_complete(c->r); /* answers now, or later (waiting) */
    }
  }
  c->pumping = false;
  if (c->phase == PH_LINGER) c->in_len = 0;
  conn_reads(c);
}

/* Bytes from the client. */
void cn__conn_feed(cn__conn *c, const char *data, size_t n) {
  if (c->phase == PH_CLOSED || n == 0) return;
  if (c->phase == PH_LINGER) return; /* read and dropped */
  if (c->in_len + n > c->in_cap) {
    size_t cap = c->in_cap ? c->in_cap : 1024;
    while (cap < c->in_len + n) cap *= 2;
    char *b = realloc(c->in, cap);
    if (b == NULL) {
      conn_close(c);
      return;
    }
    c->in = b;
    c->in_cap = cap;
  }
  memcpy(c->in + c->in_len, data, n);
  c->in_len += n;
  conn_pump(c);
  /* nothing held: give the buffer back (2,000 idle connections) */
  if (c->in_len == 0 && c->in_cap > 4096) {
    free(c->in);
    c->in = NULL;
    c->in_cap = 0;
  }
}

/* The client closed its side (or the socket failed). */
void cn__conn_eof(cn__conn *c) {
  if (c->phase == PH_CLOSED) return;
  cn__req *r = c->r;
  if (r != NULL && r->state == CN__REQ_WAITING && r->route == CN__RT_INFER) {
    cn__batcher_cancel(r, "disconnect", 499); /* closes c */
    if (c->phase == PH_CLOSED) return;
  }
  conn_close(c);
}

/* Deadlines: called by the sweep timer (and the fuzz target). */
void cn__conn_tick(cn__conn *c, double now) {
  if (c->phase == PH_CLOSED) return;
  if (c->writes > 0 && now > c->write_deadline) {
    conn_close(c); /* an answer the client does not read */
    return;
  }
  if (c->deadline == 0 || now <= c->deadline) return;
  switch (c->phase) {
    case PH_HEAD:
    case PH_BODY: {
      char m[120];
      bool head = c->phase == PH_HEAD;
      snprintf(m, sizeof(m), "the request %s did not arrive within %d s "
               "(%s)", head ? "head" : "body",
               head ? c->srv->cfg.serve.header_timeout_s
                    : c->srv->cfg.serve.body_timeout_s,
               head ? "header-timeout-s" : "body-timeout-s");
      c->deadline = 0;
      if (c->r != NULL && c->r->state != CN__REQ_RECEIVING) break;
      answer_error(c, CN_E_REQUEST_TIMEOUT, m);
      break;
    }
    case PH_IDLE:
    case PH_LINGER:
      if (c->writes == 0) conn_close(c);
      break;
    default:
      break;
  }
}

/* ---- sockets --------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b) {
  static char buf[65536]; /* the loop thread's; fed on before the next */
  b->base = buf;
  b->len = sizeof(buf);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  cn__conn *c = st->data;
  if (n < 0) {
    cn__conn_eof(c);
    return;
  }
  if (n > 0) cn__conn_feed(c, b->base, (size_t)n);
}

/* Reading is on while there is room ahead and no answer unwritten. */
static void conn_reads(cn__conn *c) {
  if (!c->sock || c->phase == PH_CLOSED) return;
  bool want = c->writes == 0 && c->in_len < MAX_AHEAD;
  if (want && !c->reading) {
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
      c->reading = true;
  } else if (!want && c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = false;
  }
}

static void conn_free(cn__conn *c) {
  free(c->hb);
  free(c->in);
  free(c);
}

static void on_closed(uv_handle_t *h) { conn_free(h->data); }

static void conn_close(cn__conn *c) {
  if (c->phase == PH_CLOSED) return;
  cn__server *s = c->srv;
  cn__req *r = c->r;
  c->phase = PH_CLOSED;
  if (r != NULL && r->state == CN__REQ_WAITING && r->route == CN__RT_INFER)
    cn__batcher_cancel(r, "disconnect", 499);
  release_req(c);
  if (c->prev) c->prev->next = c->next;
  else if (s->conns == c) s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
  if (c->counted) atomic_fetch_sub(&s->open_conns, 1);
  if (c->refused) s->refused_conns--;
  c->counted = c->refused = false;
  if (c->sock) {
    if (c->reading) uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = false;
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
      uv_close((uv_handle_t *)&c->tcp, on_closed);
  }
}

static cn__conn *conn_new(cn__server *s) {
  cn__conn *c = calloc(1, sizeof(*c));
  if (c == NULL) return NULL;
  c->srv = s;
  http_parser_init(&c->p, HTTP_REQUEST);
  c->p.data = c;
  c->phase = PH_IDLE;
  return c;
}

static void list_add(cn__server *s, cn__conn *c) {
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
}

static void settings_init(void) {
  settings.on_message_begin = on_message_begin;
  settings.on_url = on_url;
  settings.on_header_field = on_header_field;
  settings.on_header_value = on_header_value;
  settings.on_headers_complete = on_headers_complete;
  settings.on_body = on_body;
  settings.on_message_complete = on_message_complete;
}

cn__conn *cn__conn_new_mem(cn__server *s, cn__conn_sink sink, void *ud) {
  settings_init();
  cn__conn *c = conn_new(s);
  if (c == NULL) return NULL;
  c->sink = sink;
  c->sink_ud = ud;
  c->counted = true;
  atomic_fetch_add(&s->open_conns, 1);
  c->deadline = cn__now() + s->cfg.serve.idle_timeout_s;
  list_add(s, c);
  return c;
}

bool cn__conn_closed(const cn__conn *c) {
  return c->phase == PH_CLOSED || c->phase == PH_LINGER;
}

void cn__conn_free_mem(cn__conn *c) {
  conn_close(c);
  conn_free(c);
}

/* Beyond max-connections: one 503 and close. The connection is accepted
 * (a listen backlog that fills would hang clients instead). */
static void refuse_conn(cn__conn *c) {
  cn__server *s = c->srv;
  char m[160];
  snprintf(m, sizeof(m), "too many connections (max-connections %d); retry "
           "later", s->cfg.serve.max_connections);
  c->phase = PH_HEAD;
  c->hlen = 0;
  answer_error(c, CN_E_UNAVAILABLE, m);
}

static void on_connection(uv_stream_t *ls, int status) {
  cn__server *s = ls->data;
  if (status < 0) {
    CN_LOG(CN_LOG_WARN, "msg=accept-failed error=\"%s\"",
           uv_strerror(status));
    return;
  }
  cn__conn *c = conn_new(s);
  if (c == NULL) return;
  c->sock = true;
  uv_tcp_init(&s->loop, &c->tcp);
  c->tcp.data = c;
  if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
    uv_close((uv_handle_t *)&c->tcp, on_closed);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  list_add(s, c);
  if (atomic_load(&s->open_conns) >= s->cfg.serve.max_connections) {
    if (s->refused_conns >= s->cfg.serve.max_connections) {
      conn_close(c); /* a flood: no answer, no descriptor held */
      return;
    }
    s->refused_conns++;
    c->refused = true;
    cn__metrics_conn_refused(&s->metrics);
    refuse_conn(c);
    return;
  }
  c->counted = true;
  atomic_fetch_add(&s->open_conns, 1);
  c->deadline = cn__now() + (s->cfg.serve.header_timeout_s <
                                     s->cfg.serve.idle_timeout_s
                                 ? s->cfg.serve.header_timeout_s
                                 : s->cfg.serve.idle_timeout_s);
  conn_reads(c);
}

static void on_tick(uv_timer_t *t) {
  cn__server *s = t->data;
  double now = cn__now();
  for (cn__conn *c = s->conns, *next; c != NULL; c = next) {
    next = c->next; /* c may leave the list */
    cn__conn_tick(c, now);
  }
}

int cn__conn_listen(cn__server *s, int fd, cn_err *err) {
  settings_init();
  uv_tcp_init(&s->loop, &s->listener);
  s->listener.data = s;
  int rc = uv_tcp_open(&s->listener, fd);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
  if (rc != 0) {
    uv_close((uv_handle_t *)&s->listener, NULL);
    return cn_err_set(err, CN_E_BAD_CONFIG, "port: %s", uv_strerror(rc));
  }
  s->listening = true;
  uv_timer_init(&s->loop, &s->conn_timer);
  s->conn_timer.data = s;
  uv_timer_start(&s->conn_timer, on_tick, HTTP_TICK_MS, HTTP_TICK_MS);
  uv_unref((uv_handle_t *)&s->conn_timer);
  return 0;
}

/* Drain: the listening socket closes (connect() is refused); open
 * connections are still served, each answer with Connection: close. */
void cn__conn_quiesce(cn__server *s) {
  if (!s->listening) return;
  s->listening = false;
  uv_close((uv_handle_t *)&s->listener, NULL);
}

/* Stop: every connection closes (their requests were answered). */
void cn__conn_close_all(cn__server *s) {
  cn__conn_quiesce(s);
  while (s->conns != NULL) conn_close(s->conns);
}
