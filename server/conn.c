/* conn.c - the socket side of Canopy's HTTP/1.1 connections (libuv):
 * an answer's status line and headers, its write (at once where the
 * socket takes it, else queued, reading stopped meanwhile), reading into
 * the bounded input buffer, the deadlines, the client's EOF, close.
 * Accept, the connection limit and the listener are conn_accept.c's;
 * parsing is conn_parse.c's; the connection is described in
 * conn_impl.h.
 *
 * Deadlines (one sweep timer for every connection, HTTP_TICK_MS):
 *   header-timeout-s  from the first byte of a request to its blank line;
 *   body-timeout-s    from there to the body's last byte;
 *   idle-timeout-s    between requests, and for an answer the client does
 *                     not read.
 * A header or body deadline that passes is answered 408 and the
 * connection closed; an idle one is closed silently (so is a new
 * connection that sent nothing, at the smaller of header-timeout-s and
 * idle-timeout-s: there is no request to answer).
 *
 * While the daemon drains, an answer closes its connection unless bytes
 * of a pipelined request wait behind it (whole, or cut by the 64 KiB
 * read-ahead): the connection is read on until its client is quiet for
 * DRAIN_QUIET_S, each request it finishes is answered, the last with
 * Connection: close.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "conn_impl.h"

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
  cn__conn_reads(c);
}

/* ---- progress (EVICT_RATE) ------------------------------------------ */

void cn__conn_progress_start(cn__conn *c) {
  c->credit = EVICT_RATE * EVICT_GRACE_S;
  c->credit_at = cn_now_s();
}

double cn__conn_credit_at(const cn__conn *c, double now) {
  return c->credit - EVICT_RATE * (now - c->credit_at);
}

void cn__conn_progress(cn__conn *c, size_t n) {
  double now = cn_now_s(), v = cn__conn_credit_at(c, now) + (double)n;
  c->credit = v < EVICT_RATE * EVICT_AHEAD_S ? v : EVICT_RATE * EVICT_AHEAD_S;
  c->credit_at = now;
  if (c->credit >= 0) c->slow_logged = false;
}

int cn__conn_peer_port(const cn__conn *c) {
  struct sockaddr_storage a;
  int len = sizeof(a);
  if (!c->sock ||
      uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&a, &len) != 0)
    return 0;
  if (a.ss_family == AF_INET)
    return ntohs(((struct sockaddr_in *)&a)->sin_port);
  if (a.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
  return 0;
}

/* An answer's progress is what left its write queue since the last look
 * (by the sweep, and at the connection limit). */
void cn__conn_write_progress(cn__conn *c) {
  if (!c->sock || c->writes == 0) return;
  size_t q = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
  if (q < c->wq_seen) {
    cn__conn_progress(c, c->wq_seen - q);
    /* idle-timeout-s is for an answer the client does not read: one it
     * reads, however big, is not cut (a 53 MB answer read at 1 MB/s
     * must not be cut at 30 s) */
    c->write_deadline = cn_now_s() + c->srv->cfg.serve.idle_timeout_s;
  }
  c->wq_seen = q;
}

/* A write the socket did not take at once: its buffer is held until it
 * is out, or cancelled by the close (answer_held: max-answer-memory). */
typedef struct wreq {
  uv_write_t w;
  char *buf;
  size_t len;     /* the answer's bytes, counted in answer_held */
} wreq;

static void on_written(uv_write_t *w, int status) {
  wreq *q = (wreq *)w;
  cn__conn *c = w->data;
  atomic_fetch_sub(&c->srv->answer_held, (long long)q->len);
  free(q->buf);
  free(q);
  c->writes--;
  if (c->phase == PH_CLOSED) return; /* cancelled by the close */
  if (status < 0) {
    cn__conn_close(c);
    return;
  }
  if (c->writes > 0) return;
  if (c->phase == PH_LINGER) conn_shutdown(c);
  else c->srv->conn_proto->resume(c);
}

static void write_held(cn__conn *c, char *buf, size_t len, size_t held);

/* Writes buf (taken over) out: at once where the socket takes it, else
 * queued; the connection reads nothing more until it is written. */
void cn__conn_write(cn__conn *c, char *buf, size_t len) {
  write_held(c, buf, len, len);
}

/* The same for the rest of an answer of held bytes (held >= len: what
 * the socket took of it at once is counted in answer_held as well, as
 * for an answer written from one buffer). */
static void write_held(cn__conn *c, char *buf, size_t len, size_t held) {
  if (buf == NULL) {
    cn__conn_close(c);
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
    cn__conn_close(c);
    return;
  }
  if (n > 0) {
    b.base += n;
    b.len -= (size_t)n;
  }
  wreq *q = malloc(sizeof(*q));
  if (q == NULL) {
    free(buf);
    cn__conn_close(c);
    return;
  }
  q->buf = buf;
  q->len = held;
  q->w.data = c;
  if (uv_write(&q->w, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
    free(buf);
    free(q);
    cn__conn_close(c);
    return;
  }
  atomic_fetch_add(&c->srv->answer_held, (long long)held);
  if (c->writes++ == 0) cn__conn_progress_start(c);
  c->wq_seen = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
  c->write_deadline = cn_now_s() + c->srv->cfg.serve.idle_timeout_s;
  cn__conn_reads(c);
}

/* Writes an answer's head and body (body taken over) out: both in one
 * writev where the socket takes them at once, so the body is not copied
 * behind its head; else what is left joined into one buffer and queued
 * (cn__conn_write). */
static void write_parts(cn__conn *c, const char *head, size_t hlen,
                        char *body, size_t blen) {
  size_t done = 0;
  if (c->phase != PH_CLOSED && c->sock && c->writes == 0) {
    uv_buf_t b[2] = {uv_buf_init((char *)head, (unsigned)hlen),
                     uv_buf_init(body, (unsigned)blen)};
    int n = uv_try_write((uv_stream_t *)&c->tcp, b, blen > 0 ? 2 : 1);
    if (n == (int)(hlen + blen)) {
      free(body);
      return;
    }
    if (n < 0 && n != UV_EAGAIN) {
      free(body);
      cn__conn_close(c);
      return;
    }
    if (n > 0) done = (size_t)n;
  }
  size_t len = hlen + blen - done;
  char *buf = malloc(len > 0 ? len : 1);
  if (buf != NULL) {
    size_t h = done < hlen ? hlen - done : 0;
    memcpy(buf, head + (hlen - h), h);
    if (len > h) memcpy(buf + h, body + (blen - (len - h)), len - h);
  }
  free(body);
  write_held(c, buf, len, hlen + blen); /* NULL: closes */
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
  c->srv->http->release(r);
}

/* s's bytes at p; returns the end (the head's pieces, each bounded by the
 * buffer's size computed before). */
static char *put(char *p, const char *s, size_t n) {
  memcpy(p, s, n);
  return p + n;
}

static char *put_str(char *p, const char *s) { return put(p, s, strlen(s)); }

/* A string literal's bytes, its length counted by the compiler. */
#define PUT_LIT(p, lit) put((p), (lit), sizeof(lit) - 1)

/* v in decimal; returns the end. */
static char *put_uint(char *p, unsigned long long v) {
  char t[24];
  int n = 0;
  do {
    t[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) *p++ = t[--n];
  return p;
}

/* One answer: status line, headers, body (HEAD: none), in one buffer,
 * laid out by hand (no format string parsed per answer). */
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
    cn__conn_close(c);
    return;
  }
  bool head = strcmp(r->method, "HEAD") == 0;
  bool keep = !c->must_close && http_should_keep_alive(&c->p) &&
              !c->p.upgrade;
  if (c->phase != PH_ANSWER) keep = false; /* answered before the body end */
  /* Draining: this is the connection's last answer unless bytes of a
   * pipelined request already wait behind it: a whole request, or part of
   * one whose rest may still be in the socket (the read-ahead holds 64
   * KiB). Those are answered too (an inference
   * 503 draining, health or metadata as usual), the last with Connection:
   * close; the connection is read on until its client is quiet for
   * DRAIN_QUIET_S (cn__conn_drain_quiet). */
  if (keep && atomic_load(&s->draining) && c->in_len == 0)
    keep = false;
  /* the head: on the stack unless its header lines are long */
  char hbuf[1024];
  size_t cap = 512 + strlen(r->id) + strlen(ctype) +
               (extra ? strlen(extra) : 0);
  char *out = cap <= sizeof(hbuf) ? hbuf : malloc(cap);
  if (out == NULL) {
    free(body);
    release_req(c);
    cn__conn_close(c);
    return;
  }
  char *p = PUT_LIT(out, "HTTP/1.1 ");
  p = put_uint(p, (unsigned)status);
  *p++ = ' ';
  p = put_str(p, reason_phrase(status));
  p = PUT_LIT(p, "\r\nContent-Type: ");
  p = put_str(p, ctype);
  p = PUT_LIT(p, "\r\nContent-Length: ");
  p = put_uint(p, blen);
  p = PUT_LIT(p, "\r\nX-Request-Id: ");
  p = put_str(p, r->id);
  p = PUT_LIT(p, "\r\n");
  if (extra != NULL) p = put_str(p, extra);
  if (!keep) p = PUT_LIT(p, "Connection: close\r\n");
  else if (c->p.http_minor == 0) p = PUT_LIT(p, "Connection: keep-alive\r\n");
  if (status == 429 || status == 503) {
    int ra = s->http->retry_after_s(s);
    p = PUT_LIT(p, "Retry-After: ");
    p = put_uint(p, ra < 0 ? 0 : (unsigned)ra);
    p = PUT_LIT(p, "\r\n");
  }
  p = PUT_LIT(p, "\r\n");
  size_t hlen = (size_t)(p - out);
  if (head) { /* HEAD: the length of the body, not the body */
    free(body);
    body = NULL;
    blen = 0;
  }
  release_req(c);
  if (keep && c->hcap > 4096) { /* a big head: idle, hold 512 bytes again */
    free(c->hb);
    c->hb = NULL;
    c->hcap = 0;
  }
  if (!keep) c->must_close = true;
  c->phase = keep ? PH_IDLE : PH_LINGER;
  double now = cn_now_s();
  if (keep) c->since = now;
  if (keep) c->served = true;
  c->deadline = keep ? now + s->cfg.serve.idle_timeout_s : now + LINGER_S;
  if (keep && atomic_load(&s->draining)) cn__conn_drain_quiet(c);
  write_parts(c, out, hlen, body, blen);
  if (out != hbuf) free(out);
  if (c->phase == PH_CLOSED || c->writes > 0) return; /* on_written goes on */
  if (!keep && !c->sock) cn__conn_close(c);
  else if (!keep) conn_shutdown(c);
  else if (!c->pumping) s->conn_proto->resume(c); /* an answer waited */
}

/* Draining, with the connection kept for what its client still sends:
 * it closes once DRAIN_QUIET_S pass without a byte, and at the latest when
 * drain-grace-ms ends. Each byte read moves the deadline on (and tells
 * serve.c's drain_check that a client is still talking). */
void cn__conn_drain_quiet(cn__conn *c) {
  cn__server *s = c->srv;
  double now = cn_now_s();
  double end = s->drain_started + s->cfg.serve.drain_grace_ms / 1e3;
  c->quiet_until = now + DRAIN_QUIET_S < end ? now + DRAIN_QUIET_S : end;
  if (c->quiet_until <= now) c->quiet_until = now + 1e-3;
  atomic_store(&s->last_request_us, (long long)(now * 1e6));
}

/* The client closed its side (or the socket failed). */
void cn__conn_eof(cn__conn *c) {
  if (c->phase == PH_CLOSED) return;
  if (c->r != NULL) {
    c->srv->http->hangup(c->r); /* a waiting request: closes c */
    if (c->phase == PH_CLOSED) return;
  }
  cn__conn_close(c);
}

/* Deadlines: called by the sweep timer (and the fuzz target). */
void cn__conn_tick(cn__conn *c, double now) {
  if (c->phase == PH_CLOSED) return;
  cn__conn_write_progress(c);
  if (c->writes > 0 && now > c->write_deadline) {
    cn__conn_close(c); /* an answer the client does not read */
    return;
  }
  if (c->quiet_until != 0 && now > c->quiet_until && c->writes == 0 &&
      (c->phase == PH_IDLE || c->phase == PH_HEAD || c->phase == PH_BODY) &&
      (c->r == NULL || c->r->state == CN__REQ_RECEIVING)) {
    cn__conn_close(c); /* draining, and its client went quiet */
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
      c->srv->conn_proto->fail(c, CN_E_REQUEST_TIMEOUT, m);
      break;
    }
    case PH_IDLE:
    case PH_LINGER:
      if (c->writes == 0) cn__conn_close(c);
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
  if (n > 0) c->srv->conn_proto->feed(c, b->base, (size_t)n);
}

/* Reading is on while there is room ahead and no answer unwritten. */
void cn__conn_reads(cn__conn *c) {
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

void cn__conn_on_closed(uv_handle_t *h) { conn_free(h->data); }

void cn__conn_close(cn__conn *c) {
  if (c->phase == PH_CLOSED) return;
  cn__server *s = c->srv;
  cn__req *r = c->r;
  c->phase = PH_CLOSED;
  if (r != NULL) s->http->hangup(r);
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
      uv_close((uv_handle_t *)&c->tcp, cn__conn_on_closed);
  }
}

cn__conn *cn__conn_create(cn__server *s) {
  cn__conn *c = calloc(1, sizeof(*c));
  if (c == NULL) return NULL;
  c->srv = s;
  http_parser_init(&c->p, HTTP_REQUEST);
  c->p.data = c;
  c->phase = PH_IDLE;
  c->since = cn_now_s();
  return c;
}

void cn__conn_list_add(cn__server *s, cn__conn *c) {
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
}

cn__conn *cn__conn_new_mem(cn__server *s, cn__conn_sink sink, void *ud) {
  cn__conn *c = cn__conn_create(s);
  if (c == NULL) return NULL;
  c->sink = sink;
  c->sink_ud = ud;
  c->counted = true;
  atomic_fetch_add(&s->open_conns, 1);
  c->deadline = cn_now_s() + s->cfg.serve.idle_timeout_s;
  cn__conn_list_add(s, c);
  return c;
}

void cn__conn_set_protocol(cn__conn *c, int protocol) {
  c->protocol = protocol;
}

int cn__conn_protocol(const cn__conn *c) { return c->protocol; }

bool cn__conn_closed(const cn__conn *c) {
  return c->phase == PH_CLOSED || c->phase == PH_LINGER;
}

void cn__conn_free_mem(cn__conn *c) {
  cn__conn_close(c);
  conn_free(c);
}
