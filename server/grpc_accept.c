/* grpc_accept.c - the gRPC listener and what runs every connection from
 * outside: accept within max-connections, the sweep timer that runs each
 * connection's deadlines (tick), GOAWAY on drain (quiesce), the close of
 * them all, and the in-memory connections tests/fuzz/fuzz_grpc.c feeds
 * (cn__grpc_new_mem, cn__grpc_feed). A connection's HTTP/2 session is
 * grpc.c's; a call's framing grpc_call.c's. Loop thread.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <nghttp2/nghttp2.h>

#include "grpc_impl.h"

static uv_tcp_t listener;
static bool listening;
static uv_timer_t tick_timer;
static bool tick_open;

/* Deadlines (the sweep timer; the fuzz target calls it with a time). */
static void tick(gconn *gc, double now) {
  if (gc->in_sink == 0) cn__grpc_bury(gc);
  if (gc->closed) return;
  if (gc->lingering) {
    if (now > gc->deadline) cn__grpc_conn_close(gc);
    return;
  }
  const cn_serve_config *sc = &gc->srv->cfg.serve;
  bool answering = gc->wbytes > 0;
  for (gstream *st = gc->streams, *next; st != NULL; st = next) {
    next = st->next;
    if (st->answered) {
      answering = true;
      continue;
    }
    if (!st->dispatched &&
        now > st->t_begin + sc->header_timeout_s + sc->body_timeout_s) {
      char m[160];
      snprintf(m, sizeof(m), "the request message did not arrive within "
               "%d s (header-timeout-s + body-timeout-s)",
               sc->header_timeout_s + sc->body_timeout_s);
      cn__grpc_body_release(st);
      st->dispatched = true;
      cn__grpc_call_error(st, CN__GRPC_DEADLINE_EXCEEDED, m);
      answering = true;
    }
  }
  if (answering && now > gc->last_out + sc->idle_timeout_s) {
    CN_LOG(CN_LOG_DEBUG, "msg=grpc-connection-stalled streams=%d",
           gc->n_streams);
    /* its answers do not move: the peer does not read */
    cn__grpc_conn_close(gc);
    return;
  }
  if (gc->n_streams == 0 && gc->deadline != 0 && now > gc->deadline) {
    gc->deadline = 0;
    if (!gc->goaway) {
      gc->goaway = true;
      nghttp2_submit_goaway(gc->ng, NGHTTP2_FLAG_NONE,
                            nghttp2_session_get_last_proc_stream_id(gc->ng),
                            NGHTTP2_NO_ERROR, NULL, 0);
    }
    /* closes once the GOAWAY is written (no call open: nghttp2 wants to
     * read no more); a peer that does not read it is closed as stalled */
    cn__grpc_flush(gc);
    if (!gc->closed && gc->wbytes == 0) cn__grpc_conn_close(gc);
    return;
  }
  cn__grpc_flush(gc);
}

static void on_tick(uv_timer_t *t) {
  double now = cn_now_s();
  for (gconn *gc = cn__grpc_conns, *next; gc != NULL; gc = next) {
    next = gc->next;
    if (gc->sock) tick(gc, now);
  }
}

static void free_handle(uv_handle_t *h) { free(h); }

static void on_connection(uv_stream_t *ls, int status) {
  cn__server *s = ls->data;
  if (status < 0) {
    CN_LOG(CN_LOG_WARN, "msg=grpc-accept-failed error=\"%s\"",
           uv_strerror(status));
    return;
  }
  gconn *gc = cn__grpc_conn_new(s);
  if (gc == NULL) { /* no memory: accepted and closed at once */
    uv_tcp_t *tcp = malloc(sizeof(*tcp));
    if (tcp == NULL) return;
    uv_tcp_init(&s->loop, tcp);
    (void)uv_accept(ls, (uv_stream_t *)tcp);
    uv_close((uv_handle_t *)tcp, free_handle);
    return;
  }
  uv_tcp_init(&s->loop, &gc->tcp);
  gc->sock = true;
  gc->tcp.data = gc;
  if (uv_accept(ls, (uv_stream_t *)&gc->tcp) != 0) {
    cn__grpc_conn_close(gc);
    return;
  }
  uv_tcp_nodelay(&gc->tcp, 1);
  if (atomic_load(&s->open_conns) >= s->cfg.serve.max_connections) {
    cn__metrics_conn_refused(&s->metrics);
    /* refused: HTTP/2 has no answer without a request */
    cn__grpc_conn_close(gc);
    return;
  }
  gc->counted = true;
  atomic_fetch_add(&s->open_conns, 1);
  cn__grpc_flush(gc); /* the server's SETTINGS */
}

/* ---- the daemon's side -------------------------------------------------- */

int cn__grpc_listen(cn__server *s, int fd, cn_err *err) {
  uv_tcp_init(&s->loop, &listener);
  listener.data = s;
  int rc = uv_tcp_open(&listener, fd);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&listener, 511, on_connection);
  if (rc != 0) {
    uv_close((uv_handle_t *)&listener, NULL);
    return cn_err_set(err, CN_E_BAD_CONFIG, "grpc-port: %s",
                      uv_strerror(rc));
  }
  listening = true;
  uv_timer_init(&s->loop, &tick_timer);
  tick_timer.data = s;
  tick_open = true;
  uv_timer_start(&tick_timer, on_tick, HTTP_TICK_MS, HTTP_TICK_MS);
  uv_unref((uv_handle_t *)&tick_timer);
  return 0;
}

/* Drain: no new connections; each open one gets GOAWAY naming the last
 * call it took, which are answered before it closes. */
void cn__grpc_quiesce(cn__server *s) {
  if (listening) {
    listening = false;
    uv_close((uv_handle_t *)&listener, NULL);
  }
  for (gconn *gc = cn__grpc_conns, *next; gc != NULL; gc = next) {
    next = gc->next;
    if (gc->goaway || !gc->sock) continue;
    gc->goaway = true;
    nghttp2_submit_goaway(gc->ng, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(gc->ng),
                          NGHTTP2_NO_ERROR, NULL, 0);
    cn__grpc_flush(gc);
  }
}

/* Stop: every connection closes (their calls were answered or failed). */
void cn__grpc_close_all(cn__server *s) {
  cn__grpc_quiesce(s);
  for (gconn *gc = cn__grpc_conns, *next; gc != NULL; gc = next) {
    next = gc->next;
    if (gc->sock) cn__grpc_conn_close(gc);
  }
  if (tick_open) {
    tick_open = false;
    uv_close((uv_handle_t *)&tick_timer, NULL);
  }
}

/* ---- in memory (tests/fuzz/fuzz_grpc.c) --------------------------------- */

cn__grpc_conn *cn__grpc_new_mem(cn__server *s, cn__conn_sink sink,
                                void *ud) {
  gconn *gc = cn__grpc_conn_new(s);
  if (gc == NULL) return NULL;
  gc->sink = sink;
  gc->sink_ud = ud;
  gc->counted = true;
  atomic_fetch_add(&s->open_conns, 1);
  cn__grpc_flush(gc);
  return (cn__grpc_conn *)gc;
}

void cn__grpc_feed(cn__grpc_conn *c, const char *data, size_t n) {
  cn__grpc_conn_feed(&c->c, data, n);
}

void cn__grpc_tick(cn__grpc_conn *c, double now) { tick(&c->c, now); }

bool cn__grpc_closed(const cn__grpc_conn *c) { return c->c.closed; }

void cn__grpc_free_mem(cn__grpc_conn *c) {
  cn__grpc_conn_close(&c->c);
  cn__grpc_conn_free(&c->c);
}
