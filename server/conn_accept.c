/* conn_accept.c - the listener of Canopy's HTTP/1.1 connections: accept,
 * the connection limit (max-connections: a refusal, or the eviction of
 * the connection that moves least), the sweep timer that runs each
 * connection's deadlines (HTTP_TICK_MS) and logs slow clients, and the
 * listener's start, quiesce and stop. A connection's sockets, answers and
 * deadlines are conn.c's; it is described in conn_impl.h.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "conn_impl.h"

/* Beyond max-connections: one 503 and close. The connection is accepted
 * (a listen backlog that fills would hang clients instead). */
static void refuse_conn(cn__conn *c) {
  cn__server *s = c->srv;
  char m[160];
  snprintf(m, sizeof(m), "too many connections (max-connections %d); retry "
           "later", s->cfg.serve.max_connections);
  c->phase = PH_HEAD;
  c->hlen = 0;
  s->conn_proto->fail(c, CN_E_UNAVAILABLE, m);
}

/* At max-connections a new connection takes the place of an open one
 * that is making no progress:
 *   - one still sending its head (a slow client, or slowloris trickling
 *     header bytes to hold a slot), or open without a byte;
 *   - one whose body is being read, or whose answer is being written,
 *     slower than EVICT_RATE bytes/s (conn_impl.h: a credit of bytes ahead
 *     of that rate, so a burst then silence buys at most EVICT_AHEAD_S);
 *     slowloris with a whole head and a trickled body, or a client that
 *     never reads a big answer;
 *   - failing those, an idle keep-alive connection that has been served
 *     (a well-behaved client, spared while any of the above is open: its
 *     next request could cross the close).
 * Among them the one longest without a whole request head goes, counted
 * from accept or the last keep-alive answer. A request waiting for its
 * run, and a body or answer moving faster, are never taken. Otherwise
 * 2,000 connections that each send a byte now and then keep every other
 * client out at the default limit until their deadlines, and an attacker
 * who reconnects keeps them out for good;
 * this way the attacker's oldest connection goes, and a client that sends
 * its request at once is served before it can become the oldest. nginx
 * does alike (ngx_drain_connections closes idle keep-alive connections
 * when it runs out); Apache's mod_reqtimeout has the same rate floor. The
 * victim is closed at once, unanswered: a 408 would hold its slot for the
 * linger, and a status line on an idle keep-alive connection could be
 * read as the answer to its next request. A walk of the connection list
 * (max-connections entries) per connection accepted at the limit.
 * Returns the victim's class (0 no progress, 1 idle keep-alive), or -1:
 * not to be taken. */
static int evictable(cn__conn *c, double now) {
  if (!c->counted || !c->sock) return -1;
  if (c->writes > 0) {
    cn__conn_write_progress(c);
    return cn__conn_credit_at(c, now) < 0 ? 0 : -1;
  }
  if (c->phase == PH_IDLE || c->phase == PH_HEAD) {
    if (c->r != NULL) return -1;
    return c->phase == PH_IDLE && c->served ? 1 : 0;
  }
  if (c->phase != PH_BODY || c->r == NULL ||
      c->r->state != CN__REQ_RECEIVING)
    return -1;
  return cn__conn_credit_at(c, now) < 0 ? 0 : -1;
}

static cn__conn *eviction_victim(cn__server *s) {
  double now = cn_now_s();
  cn__conn *v = NULL;
  int vk = 2;
  for (cn__conn *c = s->conns; c != NULL; c = c->next) {
    int k = evictable(c, now);
    if (k >= 0 && (k < vk || (k == vk && c->since < v->since))) {
      v = c;
      vk = k;
    }
  }
  return v;
}

static const char *victim_what(const cn__conn *c) {
  if (c->writes > 0) return "answer";
  if (c->phase == PH_BODY) return "body";
  if (c->phase == PH_HEAD) return "head";
  return c->served ? "keep-alive" : "idle";
}

static void on_connection(uv_stream_t *ls, int status) {
  cn__server *s = ls->data;
  if (status < 0) {
    CN_LOG(CN_LOG_WARN, "msg=accept-failed error=\"%s\"",
           uv_strerror(status));
    return;
  }
  cn__conn *c = cn__conn_create(s);
  if (c == NULL) return;
  c->sock = true;
  uv_tcp_init(&s->loop, &c->tcp);
  c->tcp.data = c;
  if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
    uv_close((uv_handle_t *)&c->tcp, cn__conn_on_closed);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  cn__conn *victim = NULL;
  if (atomic_load(&s->open_conns) >= s->cfg.serve.max_connections &&
      (victim = eviction_victim(s)) != NULL) {
    CN_LOG(CN_LOG_DEBUG, "msg=connection-evicted phase=%s waited_s=%.1f "
           "peer=%d", victim_what(victim), cn_now_s() - victim->since,
           cn__conn_peer_port(victim));
    cn__conn_close(victim);
    cn__metrics_conn_evicted(&s->metrics);
  }
  cn__conn_list_add(s, c);
  if (atomic_load(&s->open_conns) >= s->cfg.serve.max_connections) {
    if (s->refused_conns >= s->cfg.serve.max_connections) {
      cn__conn_close(c); /* a flood: no answer, no descriptor held */
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
  CN_LOG(CN_LOG_DEBUG, "msg=connection-accepted peer=%d open=%d",
         cn__conn_peer_port(c), (int)atomic_load(&s->open_conns));
  c->deadline = cn_now_s() + (s->cfg.serve.header_timeout_s <
                                     s->cfg.serve.idle_timeout_s
                                 ? s->cfg.serve.header_timeout_s
                                 : s->cfg.serve.idle_timeout_s);
  cn__conn_reads(c);
}

/* At debug level, a line when a body being read or an answer being
 * written falls behind EVICT_RATE (it may be evicted from then on): what
 * a test of the connection limit waits for before it connects the client
 * that should take its place, instead of sleeping "long enough". */
static void log_slow(cn__conn *c, double now) {
  if (c->slow_logged || c->phase == PH_CLOSED || !c->counted) return;
  if (c->writes == 0 && (c->phase != PH_BODY || c->r == NULL ||
                         c->r->state != CN__REQ_RECEIVING))
    return;
  if (evictable(c, now) != 0) return;
  c->slow_logged = true;
  CN_LOG(CN_LOG_DEBUG, "msg=connection-slow phase=%s peer=%d",
         victim_what(c), cn__conn_peer_port(c));
}

static void on_tick(uv_timer_t *t) {
  cn__server *s = t->data;
  double now = cn_now_s();
  for (cn__conn *c = s->conns, *next; c != NULL; c = next) {
    next = c->next; /* c may leave the list */
    cn__conn_tick(c, now);
    if (cn__log_level >= CN_LOG_DEBUG) log_slow(c, now);
  }
}

int cn__conn_listen(cn__server *s, int fd, cn_err *err) {
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
  while (s->conns != NULL) cn__conn_close(s->conns);
}
