/* load.h - canopy-load, an open-loop HTTP/1.1 load generator
 * (docs/benchmarks.md "canopy-load").
 *
 * Requests are due on a fixed schedule (uniform or Poisson at R/s) that
 * never waits for the server; a due request queues until a keep-alive
 * connection is free, and its latency counts from the time it was due,
 * not from when it was written (no coordinated omission, as in wrk2).
 * One libuv loop, one thread: main.c owns the schedule and the report,
 * conn.c the connections and the response parser.
 */
#ifndef CANOPY_LOAD_H
#define CANOPY_LOAD_H

#include <http_parser.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

enum { LD_CLOSED, LD_CONNECTING, LD_IDLE, LD_BUSY, LD_CLOSING };

/* why a request or a connection failed (the report's "errors") */
enum { LD_E_CONNECT, LD_E_WRITE, LD_E_RESET, LD_E_PARSE, LD_E_TIMEOUT,
       LD_E_UNFINISHED, LD_E_COUNT };

struct ld_load;

typedef struct ld_conn {
  /* owned by conn.c */
  uv_tcp_t tcp;
  uv_connect_t creq;
  uv_write_t wreq;
  http_parser parser;
  int state;
  int idx;
  int idle_pos; /* its place in L->idle while idle */
  int done, keep; /* set by the parser's callbacks */
  int status;
  /* the request in flight */
  uint64_t t_due;  /* when the schedule made it due (ns, uv_hrtime) */
  uint64_t t_sent; /* when it was written (for --timeout-s) */
  int retry_after; /* the response carried Retry-After */
  char field[16];  /* the header name being read, lower case, cut short */
  size_t flen;
  int in_value;
  struct ld_load *L;
} ld_conn;

typedef struct ld_load {
  /* options */
  const char *host;
  int port;
  double rate, duration_s, timeout_s, drain_s;
  int n_conns;
  int poisson;
  int closed_loop; /* --closed: no schedule, send on every idle connection */
  uint64_t seed;
  /* the prepared requests, used in turn */
  uv_buf_t *reqs;
  size_t n_reqs, next_req;
  /* the schedule */
  uv_loop_t *loop;
  uv_timer_t tick;
  struct sockaddr_storage addr;
  uint64_t t0, t_end, next_due, t_done;
  uint64_t backoff_until; /* no reconnect before this after a failure */
  int started, finished;
  /* due requests that wait for a connection: a ring of due times */
  uint64_t *due;
  size_t due_cap, due_head, due_len;
  /* connections; idle and closed ones on stacks */
  ld_conn *conns;
  int *idle, n_idle;
  int *closed, n_closed;
  int n_connecting, n_busy, n_open;
  /* counts (the report) */
  uint64_t scheduled, sent, responses;
  uint64_t status[600];
  uint64_t retry_after_429;
  uint64_t errors[LD_E_COUNT];
  uint64_t *lat200; /* ns, one per 200 */
  size_t n_lat, lat_cap;
  /* news from conn.c for main.c, which sets them before ld_conns_init:
   * a connection became idle or closed, a response arrived. conn.c calls
   * them and never main.c itself (check_layout_calls). */
  void (*on_idle)(struct ld_load *L, ld_conn *c);
  void (*on_closed)(struct ld_load *L, ld_conn *c);
  void (*on_response)(struct ld_load *L, ld_conn *c, int status,
                      uint64_t now);
} ld_load;

/* conn.c */
int ld_conns_init(ld_load *L);
void ld_conn_connect(ld_load *L, ld_conn *c);
void ld_conn_send(ld_load *L, ld_conn *c, uint64_t t_due);
void ld_conn_close(ld_load *L, ld_conn *c);
void ld_conns_check_timeouts(ld_load *L, uint64_t now);

#endif
