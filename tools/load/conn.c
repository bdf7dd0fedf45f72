/* conn.c - canopy-load's keep-alive connections: connect, write one
 * prepared request, read its answer with http_parser (status line,
 * Content-Length or chunks, Retry-After, Connection: close), close and
 * reconnect. One request in flight per connection; main.c decides what
 * is sent when.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "load.h"

static http_parser_settings settings;

/* Header names are kept lower case and cut at 15 bytes: only
 * "retry-after" matters here (the parser itself reads Content-Length,
 * Transfer-Encoding and Connection). */
static int on_field(http_parser *p, const char *at, size_t len) {
  ld_conn *c = p->data;
  if (c->in_value) {
    c->flen = 0;
    c->in_value = 0;
  }
  for (size_t i = 0; i < len && c->flen + 1 < sizeof(c->field); i++) {
    char ch = at[i];
    if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');
    c->field[c->flen++] = ch;
  }
  c->field[c->flen] = '\0';
  return 0;
}

static int on_value(http_parser *p, const char *at, size_t len) {
  ld_conn *c = p->data;
  c->in_value = 1;
  if (len > 0 && strcmp(c->field, "retry-after") == 0) c->retry_after = 1;
  return 0;
}

/* The answer is whole: note it; read_cb acts once http_parser_execute
 * has returned (a callback must not close the handle under it). */
static int on_complete(http_parser *p) {
  ld_conn *c = p->data;
  c->done = 1;
  c->status = (int)p->status_code;
  c->keep = http_should_keep_alive(p);
  return 0;
}

int ld_conns_init(ld_load *L) {
  memset(&settings, 0, sizeof(settings));
  settings.on_header_field = on_field;
  settings.on_header_value = on_value;
  settings.on_message_complete = on_complete;
  L->conns = calloc((size_t)L->n_conns, sizeof(*L->conns));
  L->idle = calloc((size_t)L->n_conns, sizeof(int));
  L->closed = calloc((size_t)L->n_conns, sizeof(int));
  if (!L->conns || !L->idle || !L->closed) return -1;
  for (int i = 0; i < L->n_conns; i++) {
    L->conns[i].idx = i;
    L->conns[i].L = L;
    L->conns[i].state = LD_CLOSED;
    L->closed[L->n_closed++] = i;
  }
  return 0;
}

static void idle_remove(ld_load *L, ld_conn *c) {
  int pos = c->idle_pos;
  int last = L->idle[--L->n_idle];
  L->idle[pos] = last;
  L->conns[last].idle_pos = pos;
}

static void close_cb(uv_handle_t *h) {
  ld_conn *c = h->data;
  c->state = LD_CLOSED;
  c->L->closed[c->L->n_closed++] = c->idx;
  c->L->on_closed(c->L, c);
}

/* Close c whatever it is doing; a request in flight is the caller's to
 * count as an error. */
void ld_conn_close(ld_load *L, ld_conn *c) {
  if (c->state == LD_CLOSED || c->state == LD_CLOSING) return;
  if (c->state == LD_IDLE) idle_remove(L, c);
  if (c->state == LD_BUSY) L->n_busy--;
  if (c->state == LD_CONNECTING) L->n_connecting--;
  if (c->state == LD_IDLE || c->state == LD_BUSY) L->n_open--;
  c->state = LD_CLOSING;
  uv_close((uv_handle_t *)&c->tcp, close_cb);
}

static void fail(ld_load *L, ld_conn *c, int why) {
  L->errors[why]++;
  ld_conn_close(L, c);
}

static void alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  /* one loop thread, and read_cb consumes every byte before returning */
  static char space[65536];
  buf->base = space;
  buf->len = sizeof(space);
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  ld_conn *c = s->data;
  ld_load *L = c->L;
  if (c->state != LD_BUSY && c->state != LD_IDLE) return;
  if (n == 0) return;
  if (n < 0) {
    if (c->state == LD_IDLE) { /* the server ended a keep-alive: fine */
      ld_conn_close(L, c);
      return;
    }
    /* EOF ends an answer that has no length */
    if (n == UV_EOF) http_parser_execute(&c->parser, &settings, NULL, 0);
    if (!c->done) {
      fail(L, c, LD_E_RESET);
      return;
    }
  } else if (c->state == LD_IDLE) { /* bytes nobody asked for: no request
                                        of ours failed, so no error */
    ld_conn_close(L, c);
    return;
  } else {
    size_t got = http_parser_execute(&c->parser, &settings, buf->base,
                                     (size_t)n);
    if (HTTP_PARSER_ERRNO(&c->parser) != HPE_OK ||
        (got != (size_t)n && !c->done)) {
      fail(L, c, LD_E_PARSE);
      return;
    }
  }
  if (!c->done) return;
  c->done = 0;
  L->on_response(L, c, c->status, uv_hrtime());
  L->n_busy--;
  c->state = LD_IDLE;
  L->idle[L->n_idle] = c->idx;
  c->idle_pos = L->n_idle++;
  if (!c->keep || n < 0) ld_conn_close(L, c);
  else L->on_idle(L, c);
}

static void connect_cb(uv_connect_t *req, int status) {
  ld_conn *c = req->data;
  ld_load *L = c->L;
  if (c->state != LD_CONNECTING) return; /* closed meanwhile */
  if (status < 0) {
    L->backoff_until = uv_hrtime() + 10 * 1000000ull;
    fail(L, c, LD_E_CONNECT);
    return;
  }
  L->n_connecting--;
  L->n_open++;
  c->state = LD_IDLE;
  L->idle[L->n_idle] = c->idx;
  c->idle_pos = L->n_idle++;
  if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) != 0) {
    fail(L, c, LD_E_CONNECT);
    return;
  }
  L->on_idle(L, c);
}

/* Open a closed connection (the caller popped it from L->closed). */
void ld_conn_connect(ld_load *L, ld_conn *c) {
  uv_tcp_init(L->loop, &c->tcp);
  c->tcp.data = c;
  c->creq.data = c;
  uv_tcp_nodelay(&c->tcp, 1);
  c->state = LD_CONNECTING;
  L->n_connecting++;
  int rc = uv_tcp_connect(&c->creq, &c->tcp, (struct sockaddr *)&L->addr,
                          connect_cb);
  if (rc != 0) {
    L->backoff_until = uv_hrtime() + 10 * 1000000ull;
    fail(L, c, LD_E_CONNECT);
  }
}

static void write_cb(uv_write_t *w, int status) {
  ld_conn *c = w->data;
  if (status < 0 && c->state == LD_BUSY) fail(c->L, c, LD_E_WRITE);
}

/* Write the next prepared request on idle c; t_due is when the schedule
 * made it due, the origin of its latency. */
void ld_conn_send(ld_load *L, ld_conn *c, uint64_t t_due) {
  idle_remove(L, c);
  c->state = LD_BUSY;
  L->n_busy++;
  L->sent++;
  c->t_due = t_due;
  c->t_sent = uv_hrtime();
  c->retry_after = 0;
  c->done = 0;
  c->flen = 0;
  c->in_value = 0;
  c->field[0] = '\0';
  http_parser_init(&c->parser, HTTP_RESPONSE);
  c->parser.data = c;
  c->wreq.data = c;
  uv_buf_t b = L->reqs[L->next_req];
  L->next_req = (L->next_req + 1) % L->n_reqs;
  if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, write_cb) != 0)
    fail(L, c, LD_E_WRITE);
}

/* Requests unanswered after --timeout-s are errors; their connections
 * are closed (and reopened when needed). */
void ld_conns_check_timeouts(ld_load *L, uint64_t now) {
  uint64_t limit = (uint64_t)(L->timeout_s * 1e9);
  for (int i = 0; i < L->n_conns; i++) {
    ld_conn *c = &L->conns[i];
    if (c->state == LD_BUSY && now > c->t_sent && now - c->t_sent > limit)
      fail(L, c, LD_E_TIMEOUT);
  }
}
