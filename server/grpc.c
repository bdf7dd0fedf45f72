/* grpc.c - the daemon's gRPC front end: cleartext HTTP/2 (h2c, prior
 * knowledge) connections on the loop thread, beside the HTTP/1.1 ones
 * (conn.c), serving inference.GRPCInferenceService (docs/api.md "gRPC").
 *
 * nghttp2 does HTTP/2's framing, HPACK and flow control; this file feeds
 * it the bytes libuv reads (nghttp2_session_mem_recv) and writes what it
 * has to send (nghttp2_session_mem_send), so there is no thread and no
 * second loop: a call is a stream, and a connection carries up to
 * MAX_STREAMS of them at once. A call's one request message is gathered
 * (bounded by grpc-max-message-bytes and max-body-memory; inflated by
 * encoding.c within the same bound when it comes compressed), turned by
 * grpc_service.c into the HTTP/1.1 request of /v2 it asks for, and fed to
 * an in-memory HTTP connection (cn__conn_new_mem): the same routing,
 * limits, batching, answers, metrics and logs as HTTP. The HTTP answer
 * comes back through that connection's sink, and grpc_service.c makes it
 * the response message and the grpc-status trailer.
 *
 * Bounds, as HTTP's (conn.c): a new connection must send its first
 * request within header-timeout-s; a call's headers and message must
 * arrive within header-timeout-s + body-timeout-s of its first frame,
 * else DEADLINE_EXCEEDED; a connection with no call open is closed
 * (GOAWAY) after idle-timeout-s; an answer whose DATA does not move for
 * idle-timeout-s (a peer that keeps its window shut or does not read)
 * closes the connection; at most WBUF_MAX bytes wait in the socket's
 * write queue before nothing more is read. While the daemon drains, each
 * connection gets GOAWAY naming the last call it took: those calls are
 * answered (an inference not yet admitted gets UNAVAILABLE, as HTTP's
 * 503), later ones are refused by HTTP/2 itself, and the connection
 * closes once its calls are done.
 *
 * As conn.c's connections, one can be fed bytes with no socket
 * (cn__grpc_new_mem, cn__grpc_feed): tests/fuzz/fuzz_grpc.c does.
 *
 * This file holds a connection's session: its reads and writes, the
 * dispatch of its calls and its close. The listener, the sweep of the
 * deadlines, drain and the in-memory entry points are grpc_accept.c's; a
 * call's framing, limits and answer are grpc_call.c's (grpc_impl.h).
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <nghttp2/nghttp2.h>

#include "encoding.h"
#include "grpc_impl.h"

/* ---- the connection list and close ------------------------------------- */

gconn *cn__grpc_conns; /* the loop's gRPC connections */

static void stream_free(gstream *st);

/* The in-memory connections set aside while an answer was being
 * written (in_sink): freed now. */
void cn__grpc_bury(gconn *gc) {
  for (int i = 0; i < gc->n_grave; i++) cn__conn_free_mem(gc->graveyard[i]);
  gc->n_grave = 0;
}

/* A call's in-memory connection is done with: freed, or set aside while
 * an answer is on the stack. A request still waiting on it is answered
 * 499 first, as for a client that hung up. */
static void release_mc(gconn *gc, cn__conn *mc) {
  cn__conn_eof(mc);
  if (gc->in_sink == 0) {
    cn__conn_free_mem(mc);
    return;
  }
  if (gc->n_grave == gc->grave_cap) {
    int cap = gc->grave_cap ? gc->grave_cap * 2 : 8;
    cn__conn **g = realloc(gc->graveyard, (size_t)cap * sizeof(*g));
    if (g == NULL) abort(); /* freeing it now would be a use after free */
    gc->graveyard = g;
    gc->grave_cap = cap;
  }
  gc->graveyard[gc->n_grave++] = mc;
}

void cn__grpc_conn_free(gconn *gc) {
  gc->in_sink = 0;
  cn__grpc_bury(gc);
  free(gc->graveyard);
  nghttp2_session_del(gc->ng);
  free(gc);
}

static void on_closed(uv_handle_t *h) { cn__grpc_conn_free(h->data); }

void cn__grpc_conn_close(gconn *gc) {
  if (gc->closed) return;
  cn__server *s = gc->srv;
  gc->closed = true;
  while (gc->streams != NULL) stream_free(gc->streams);
  if (gc->prev) gc->prev->next = gc->next;
  else if (cn__grpc_conns == gc) cn__grpc_conns = gc->next;
  if (gc->next) gc->next->prev = gc->prev;
  gc->prev = gc->next = NULL;
  if (gc->counted) atomic_fetch_sub(&s->open_conns, 1);
  gc->counted = false;
  if (gc->sock) {
    if (gc->reading) uv_read_stop((uv_stream_t *)&gc->tcp);
    gc->reading = false;
    if (!uv_is_closing((uv_handle_t *)&gc->tcp))
      uv_close((uv_handle_t *)&gc->tcp, on_closed);
  }
}

/* ---- output ------------------------------------------------------------- */

typedef struct wreq {
  uv_write_t w;
  char *buf;
  size_t len;
} wreq;

static void reads(gconn *gc);

/* How long a finished connection reads (and drops) the client's bytes
 * after its FIN, as the HTTP front end's LINGER_S. */
#define GRPC_LINGER_S 2.0

static void on_shutdown(uv_shutdown_t *sh, int status) {
  (void)status;
  free(sh);
}

/* The connection is done (GOAWAY sent or received, every call closed) and
 * its last frames are queued: send FIN once they are out, and read,
 * dropping, until the client closes or GRPC_LINGER_S passes. Closing at
 * once loses answers the client has not read yet: a close with the
 * client's bytes unread (a WINDOW_UPDATE, a PING, a call sent before the
 * GOAWAY reached it) sends RST, and so does the kernel for bytes arriving
 * after the close, either of which discards what was on its way to the
 * client (the answers to the calls a drain finished). */
static void gconn_linger(gconn *gc) {
  gc->lingering = true;
  gc->deadline = cn_now_s() + GRPC_LINGER_S;
  uv_shutdown_t *sh = malloc(sizeof(*sh));
  if (sh == NULL ||
      uv_shutdown(sh, (uv_stream_t *)&gc->tcp, on_shutdown) != 0) {
    free(sh);
    cn__grpc_conn_close(gc);
    return;
  }
  reads(gc);
}

static void on_written(uv_write_t *w, int status) {
  wreq *q = (wreq *)w;
  gconn *gc = w->data;
  gc->wbytes -= q->len;
  free(q->buf);
  free(q);
  if (gc->closed) return;
  if (status < 0) {
    cn__grpc_conn_close(gc);
    return;
  }
  cn__grpc_flush(gc);
}

/* buf (taken over) to the socket: at once where it takes it, else
 * queued. */
static void write_out(gconn *gc, char *buf, size_t len) {
  if (!gc->sock) {
    if (gc->sink) gc->sink(gc->sink_ud, buf, len);
    free(buf);
    return;
  }
  uv_buf_t b = uv_buf_init(buf, (unsigned)len);
  int n = gc->wbytes == 0 ? uv_try_write((uv_stream_t *)&gc->tcp, &b, 1)
                          : UV_EAGAIN;
  if (n == (int)len) {
    free(buf);
    return;
  }
  if (n < 0 && n != UV_EAGAIN) {
    free(buf);
    cn__grpc_conn_close(gc);
    return;
  }
  if (n > 0) {
    b.base += n;
    b.len -= (size_t)n;
  }
  wreq *q = malloc(sizeof(*q));
  if (q == NULL) {
    free(buf);
    cn__grpc_conn_close(gc);
    return;
  }
  q->buf = buf;
  q->len = b.len;
  q->w.data = gc;
  if (uv_write(&q->w, (uv_stream_t *)&gc->tcp, &b, 1, on_written) != 0) {
    free(buf);
    free(q);
    cn__grpc_conn_close(gc);
    return;
  }
  gc->wbytes += b.len;
}

/* What nghttp2 has to send, written out (in one buffer a turn), unless the
 * socket's queue is full; then the connection closes if it is done (GOAWAY
 * sent or received, every call closed). Not inside mem_recv: the frames
 * received are handled first. */
void cn__grpc_flush(gconn *gc) {
  if (gc->closed || gc->lingering || gc->in_recv > 0) return;
  while (gc->wbytes < WBUF_MAX) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
      const uint8_t *p;
      ssize_t n = nghttp2_session_mem_send(gc->ng, &p);
      if (n < 0) {
        free(buf);
        cn__grpc_conn_close(gc);
        return;
      }
      if (n == 0) break;
      if (len + (size_t)n > cap) {
        size_t nc = cap ? cap * 2 : 16384;
        while (nc < len + (size_t)n) nc *= 2;
        char *q = realloc(buf, nc);
        if (q == NULL) {
          free(buf);
          cn__grpc_conn_close(gc);
          return;
        }
        buf = q;
        cap = nc;
      }
      memcpy(buf + len, p, (size_t)n);
      len += (size_t)n;
      if (len >= WBUF_MAX) break;
    }
    if (len == 0) {
      free(buf);
      break;
    }
    write_out(gc, buf, len);
    if (gc->closed) return;
  }
  if (!nghttp2_session_want_read(gc->ng) &&
      !nghttp2_session_want_write(gc->ng)) {
    if (gc->sock) gconn_linger(gc);
    else if (gc->wbytes == 0) cn__grpc_conn_close(gc);
    return;
  }
  reads(gc);
}

/* The in-memory connection's sink: the HTTP answer to the call. */
static void on_http_answer(void *ud, const char *d, size_t n) {
  gstream *st = ud;
  if (n >= 12 && memcmp(d, "HTTP/1.1 100", 12) == 0) return;
  uint8_t *msg = NULL;
  size_t len = 0;
  char err[512], id[72];
  int rc = cn__grpc_answer(st->method, d, n, &msg, &len, err, sizeof(err),
                           id, sizeof(id));
  if (rc != 0) {
    cn__grpc_call_answer(st, rc, err, NULL, 0, id);
  } else {
    uint8_t *f = malloc(len + 5);
    if (f == NULL) {
      free(msg);
      cn__grpc_call_answer(st, CN__GRPC_RESOURCE_EXHAUSTED,
                           "no memory for the answer", NULL, 0, id);
    } else {
      f[0] = 0;
      f[1] = (uint8_t)(len >> 24);
      f[2] = (uint8_t)(len >> 16);
      f[3] = (uint8_t)(len >> 8);
      f[4] = (uint8_t)len;
      memcpy(f + 5, msg, len);
      free(msg);
      cn__grpc_call_answer(st, CN__GRPC_OK, NULL, f, len + 5, id);
    }
  }
  gconn *gc = st->gc; /* st may be freed by the flush (stream closed) */
  gc->in_sink++;
  cn__grpc_flush(gc);
  gc->in_sink--;
}

/* ---- calls -------------------------------------------------------------- */

static void stream_free(gstream *st) {
  gconn *gc = st->gc;
  if (st->mc != NULL) {
    cn__conn *mc = st->mc;
    st->mc = NULL;
    release_mc(gc, mc);
  }
  cn__grpc_body_release(st);
  if (st->out != NULL)
    atomic_fetch_sub(&gc->srv->answer_held, (long long)st->out_len);
  free(st->out);
  if (st->ready) { /* off the list of calls to dispatch */
    gstream **pp = &gc->rhead;
    while (*pp && *pp != st) pp = &(*pp)->rnext;
    if (*pp) *pp = st->rnext;
    gc->rtail = NULL;
    for (gstream *x = gc->rhead; x; x = x->rnext) gc->rtail = x;
  }
  if (st->prev) st->prev->next = st->next;
  else if (gc->streams == st) gc->streams = st->next;
  if (st->next) st->next->prev = st->prev;
  gc->n_streams--;
  if (gc->ng != NULL) /* nghttp2 keeps no pointer to freed memory */
    nghttp2_session_set_stream_user_data(gc->ng, st->id, NULL);
  free(st);
  if (gc->n_streams == 0 && !gc->closed)
    gc->deadline = cn_now_s() + gc->srv->cfg.serve.idle_timeout_s;
}

/* The call's message, checked, made into its HTTP request and fed to an
 * in-memory connection of its own. */
static void dispatch(gstream *st) {
  cn__server *s = st->gc->srv;
  const cn_serve_config *sc = &s->cfg.serve;
  char err[600];
  st->dispatched = true;
  if (!st->post || !st->grpc_ct) {
    cn__grpc_call_error(st, CN__GRPC_INVALID_ARGUMENT,
                        "a gRPC call is a POST with "
                        "content-type application/grpc");
    return;
  }
  if (st->method < 0) {
    snprintf(err, sizeof(err), "unknown method %.100s: this server serves "
             "inference.GRPCInferenceService's ServerLive, ServerReady, "
             "ModelReady, ServerMetadata, ModelMetadata, ModelInfer, "
             "ModelConfig, ModelStatistics, RepositoryIndex, "
             "RepositoryModelLoad and RepositoryModelUnload", st->path);
    cn__grpc_call_error(st, CN__GRPC_UNIMPLEMENTED, err);
    return;
  }
  if (st->in_len < 5) {
    cn__grpc_call_error(st, CN__GRPC_INVALID_ARGUMENT, st->in_len == 0
               ? "the call has no request message"
               : "the request message ends inside its 5-byte prefix");
    return;
  }
  const unsigned char *u = (const unsigned char *)st->in;
  size_t len = (size_t)u[1] << 24 | (size_t)u[2] << 16 | (size_t)u[3] << 8 |
               (size_t)u[4];
  if (len != st->in_len - 5) {
    snprintf(err, sizeof(err), "the request is %zu bytes but its message "
             "prefix says %zu: a unary call carries one message",
             st->in_len - 5, len);
    cn__grpc_call_error(st, CN__GRPC_INVALID_ARGUMENT, err);
    return;
  }
  const char *msg = st->in + 5;
  char *inflated = NULL;
  if (u[0] != 0) { /* compressed: inflated within grpc-max-message-bytes */
    int enc = strcmp(st->encoding, "gzip") == 0      ? CN__ENC_GZIP
              : strcmp(st->encoding, "deflate") == 0 ? CN__ENC_DEFLATE
                                                     : CN__ENC_BAD;
    if (enc == CN__ENC_BAD) {
      snprintf(err, sizeof(err), "the message is compressed with '%.15s': "
               "this server takes gzip, deflate or identity "
               "(grpc-encoding)", st->encoding);
      cn__grpc_call_error(st, CN__GRPC_UNIMPLEMENTED, err);
      return;
    }
    cn_err e;
    cn_err_clear(&e);
    size_t sent = len;
    if (cn__inflate(enc, msg, sent, (size_t)sc->grpc_max_message_bytes,
                    &inflated, &len, &e) != 0) {
      if (e.code == CN_E_TOO_LARGE)
        snprintf(err, sizeof(err), "the message inflates (%s) to more than "
                 "%d bytes (grpc-max-message-bytes; it was sent as %zu "
                 "bytes)", st->encoding, sc->grpc_max_message_bytes, sent);
      else
        snprintf(err, sizeof(err), "%s", e.msg);
      cn__grpc_call_error(st, e.code == CN_E_BAD_REQUEST
                                  ? CN__GRPC_INVALID_ARGUMENT
                                  : CN__GRPC_RESOURCE_EXHAUSTED,
                          err);
      return;
    }
    msg = inflated;
  }
  if (atomic_load(&s->open_conns) >= sc->max_connections) {
    free(inflated);
    snprintf(err, sizeof(err), "too many connections and calls in progress "
             "(max-connections %d); retry later", sc->max_connections);
    cn__grpc_call_error(st, CN__GRPC_UNAVAILABLE, err);
    return;
  }
  char *req;
  size_t rlen;
  int rc = cn__grpc_request(st->method, (const uint8_t *)msg, len,
                            &st->meta, &req, &rlen, err, sizeof(err));
  free(inflated);
  cn__grpc_body_release(st);
  if (rc != 0) {
    cn__grpc_call_error(st, rc, err);
    return;
  }
  st->mc = cn__conn_new_mem(s, on_http_answer, st);
  if (st->mc == NULL) {
    free(req);
    cn__grpc_call_error(st, CN__GRPC_RESOURCE_EXHAUSTED,
                        "no memory for the call");
    return;
  }
  cn__conn_set_protocol(st->mc, CN__PROTO_GRPC);
  cn__conn_feed(st->mc, req, rlen);
  free(req);
}

static void dispatch_ready(gconn *gc) {
  while (gc->rhead != NULL && !gc->closed) {
    gstream *st = gc->rhead;
    gc->rhead = st->rnext;
    if (gc->rhead == NULL) gc->rtail = NULL;
    st->rnext = NULL;
    st->ready = false;
    dispatch(st);
  }
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t code,
                           void *ud) {
  gstream *st = nghttp2_session_get_stream_user_data(ng, id);
  if (st != NULL) stream_free(st);
  return 0;
}

static nghttp2_session_callbacks *callbacks(void) {
  static nghttp2_session_callbacks *cbs;
  if (cbs != NULL) return cbs;
  if (nghttp2_session_callbacks_new(&cbs) != 0) return NULL;
  nghttp2_session_callbacks_set_on_begin_headers_callback(
      cbs, cn__grpc_on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cbs, cn__grpc_on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs,
                                                            cn__grpc_on_data);
  nghttp2_session_callbacks_set_on_frame_recv_callback(
      cbs, cn__grpc_on_frame_recv);
  nghttp2_session_callbacks_set_on_frame_send_callback(
      cbs, cn__grpc_on_frame_send);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs,
                                                         on_stream_close);
  return cbs;
}

/* ---- connections -------------------------------------------------------- */

gconn *cn__grpc_conn_new(cn__server *s) {
  nghttp2_session_callbacks *cbs = callbacks();
  gconn *gc = calloc(1, sizeof(*gc));
  if (gc == NULL || cbs == NULL) {
    free(gc);
    return NULL;
  }
  gc->srv = s;
  nghttp2_option *opt = NULL;
  if (nghttp2_option_new(&opt) != 0) {
    free(gc);
    return NULL;
  }
  nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
  int rc = nghttp2_session_server_new2(&gc->ng, cbs, gc, opt);
  nghttp2_option_del(opt);
  if (rc != 0) {
    free(gc);
    return NULL;
  }
  nghttp2_settings_entry iv[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 16384},
  };
  nghttp2_submit_settings(gc->ng, NGHTTP2_FLAG_NONE, iv,
                          sizeof(iv) / sizeof(iv[0]));
  nghttp2_session_set_local_window_size(gc->ng, NGHTTP2_FLAG_NONE, 0,
                                        CONN_WINDOW);
  double now = cn_now_s();
  const cn_serve_config *sc = &s->cfg.serve;
  gc->deadline = now + (sc->header_timeout_s < sc->idle_timeout_s
                            ? sc->header_timeout_s
                            : sc->idle_timeout_s);
  gc->last_out = now;
  gc->next = cn__grpc_conns;
  if (cn__grpc_conns) cn__grpc_conns->prev = gc;
  cn__grpc_conns = gc;
  if (atomic_load(&s->draining)) {
    gc->goaway = true;
    nghttp2_submit_goaway(gc->ng, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR,
                          NULL, 0);
  }
  return gc;
}

/* Bytes read: through nghttp2, then the calls they completed. */
void cn__grpc_conn_feed(gconn *gc, const char *data, size_t n) {
  if (gc->in_sink == 0) cn__grpc_bury(gc);
  if (gc->closed || gc->lingering) return;
  gc->in_recv++;
  ssize_t rc = nghttp2_session_mem_recv(gc->ng, (const uint8_t *)data, n);
  gc->in_recv--;
  if (gc->closed) return;
  if (rc < 0) {
    CN_LOG(CN_LOG_DEBUG, "msg=grpc-connection-error error=\"%s\"",
           nghttp2_strerror((int)rc));
    /* nghttp2 queued GOAWAY for a protocol error: send it, then close */
    cn__grpc_flush(gc);
    cn__grpc_conn_close(gc);
    return;
  }
  if (atomic_load(&gc->srv->draining))
    atomic_store(&gc->srv->last_request_us, (long long)(cn_now_s() * 1e6));
  dispatch_ready(gc);
  cn__grpc_flush(gc);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b) {
  static char buf[65536]; /* the loop thread's; fed on before the next */
  b->base = buf;
  b->len = sizeof(buf);
}

static void on_read(uv_stream_t *stm, ssize_t n, const uv_buf_t *b) {
  gconn *gc = stm->data;
  if (n < 0) {
    cn__grpc_conn_close(gc);
    return;
  }
  if (n > 0) cn__grpc_conn_feed(gc, b->base, (size_t)n);
}

static void reads(gconn *gc) {
  if (!gc->sock || gc->closed) return;
  bool want = gc->wbytes < WBUF_MAX || gc->lingering;
  if (want && !gc->reading) {
    if (uv_read_start((uv_stream_t *)&gc->tcp, on_alloc, on_read) == 0)
      gc->reading = true;
  } else if (!want && gc->reading) {
    uv_read_stop((uv_stream_t *)&gc->tcp);
    gc->reading = false;
  }
}
