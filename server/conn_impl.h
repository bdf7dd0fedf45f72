/* conn_impl.h - one HTTP/1.1 client connection, shared by the three parts
 * of Canopy's front end (libuv sockets, Debian's libhttp-parser, i.e.
 * nodejs's http_parser 2.9):
 *   conn_parse.c  the request side: http_parser's callbacks, the framing
 *                 checks of RFC 9112, parse errors as JSON answers, and
 *                 the pump that hands parsed requests to http.c;
 *   conn.c        the socket side: the answer and its write, reading and
 *                 backpressure, deadlines, close;
 *   conn_accept.c accept, the connection limit and eviction, the sweep
 *                 timer, the listener.
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
 * memory, not more, and all clients together at most max-answer-memory
 * (conn.c counts what waits to be written, request.c reserves).
 *
 * Input and output are separate from the socket (cn__conn_feed, the
 * sink), so tests/fuzz/fuzz_http.c drives the same parser and handlers in
 * memory.
 */
#ifndef CANOPY_SERVER_CONN_IMPL_H
#define CANOPY_SERVER_CONN_IMPL_H

#include <http_parser.h>

#include "net.h"

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
/* While the daemon drains, a connection whose client may still be sending
 * a pipelined request is read on until it sends nothing for this long
 * (never past drain-grace-ms). */
#define DRAIN_QUIET_S 0.25
/* A body being read, or an answer being written, must move at least this
 * many bytes/s (Apache mod_reqtimeout's floor) or it may be evicted at
 * max-connections (conn.c's eviction_victim). Its progress is a credit of
 * bytes ahead of that schedule: EVICT_GRACE_S worth at its start, at most
 * EVICT_AHEAD_S worth however fast it went, so a burst followed by silence
 * buys at most EVICT_AHEAD_S (with the average since the start as the
 * rule, a 16 KB burst would buy the whole body-timeout-s). */
#define EVICT_RATE 500.0
#define EVICT_GRACE_S 1.0
#define EVICT_AHEAD_S 2.0

/* Where a chunked body's raw bytes are (conn_parse.c, chunk_check). */
enum { CK_NONE, CK_HEAD_LF, CK_SIZE0, CK_SIZE, CK_BWS, CK_EXT, CK_SIZE_LF,
       CK_DATA, CK_DATA_CR, CK_DATA_LF, CK_DONE };

enum { PH_IDLE, PH_HEAD, PH_BODY, PH_ANSWER, PH_LINGER, PH_CLOSED };

typedef struct hdr {
  size_t name, value; /* offsets into hb, NUL-terminated */
  size_t name_len;    /* the name's bytes (on_headers_complete) */
} hdr;

struct cn__conn {
  cn__server *srv;
  uv_tcp_t tcp;
  bool sock;                /* a socket; else output goes to sink      */
  int protocol;             /* how its requests arrived (CN__PROTO_*)  */
  bool counted;             /* in open_conns                           */
  bool refused;             /* beyond max-connections: in refused_conns */
  cn__conn *prev, *next;    /* s->conns                                */
  http_parser p;
  int phase;
  double deadline;          /* cn_now_s() seconds; 0: none              */
  double quiet_until;       /* draining: close when no byte came by then */
  double since;             /* since when without a whole request head
                             * (accept, or the last keep-alive answer):
                             * the oldest is evicted at max-connections */
  bool served;              /* has answered a request (keep-alive)     */
  /* progress of the body being read or the answer being written, in
   * bytes ahead of EVICT_RATE (conn.c: conn_progress) */
  double credit, credit_at;
  bool slow_logged;         /* its fall behind EVICT_RATE was logged   */
  size_t wq_seen;           /* the write queue's size when last looked */
  size_t trailer_len;       /* a chunked body's trailer section: bytes */
  int trailer_lines;        /* ... and lines                           */
  /* the head of the request being read */
  char *hb;
  size_t hlen, hcap;
  int part;                 /* 0 url, 1 field, 2 value: the last piece */
  size_t url_len;
  hdr h[MAX_HEADERS];
  int nh;
  bool head_done;           /* every header line read to its end       */
  bool expect_continue;
  /* a chunked body's framing, checked on the raw bytes (conn_parse.c's
   * chunk_check): where in it the next byte is, and the chunk's size */
  int ck;                   /* CK_*: 0 none (not a chunked body)       */
  uint64_t ck_left;         /* CK_DATA: data bytes still to come       */
  int ck_digits;
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

/* What the transport (conn.c) hands up to the HTTP/1.1 framing above it
 * (conn_parse.c), which puts it on the server (cn__http1_attach): conn.c
 * calls nothing above itself by name. */
struct cn__conn_proto {
  void (*feed)(cn__conn *c, const char *data, size_t n); /* bytes read    */
  void (*resume)(cn__conn *c); /* an answer is out: parse what waits     */
  void (*fail)(cn__conn *c, int code, const char *msg); /* 408, 503, ... */
};

/* conn_parse.c */
/* Parses what was read, one request at a time. */
void cn__conn_pump(cn__conn *c);
/* An error of the front end itself: one JSON answer, then close. */
void cn__conn_answer_error(cn__conn *c, int code, const char *msg);

/* conn.c */
void cn__conn_close(cn__conn *c);
/* Reading is on while there is room ahead and no answer unwritten. */
void cn__conn_reads(cn__conn *c);
/* Draining: read on until the client is quiet (DRAIN_QUIET_S). */
void cn__conn_drain_quiet(cn__conn *c);
/* A body or an answer begins; n bytes of it moved (EVICT_RATE). */
void cn__conn_progress_start(cn__conn *c);
void cn__conn_progress(cn__conn *c, size_t n);
/* The client's TCP port, for debug lines that name a connection (0: not
 * a socket). */
int cn__conn_peer_port(const cn__conn *c);
/* What conn_accept.c shares of conn.c: a connection's progress credit at
 * now (below zero: slower than EVICT_RATE); an answer's progress since
 * the last look (its write queue); a new connection of s, not yet
 * listed, and its listing; the close callback that frees it. */
double cn__conn_credit_at(const cn__conn *c, double now);
void cn__conn_write_progress(cn__conn *c);
cn__conn *cn__conn_create(cn__server *s);
void cn__conn_list_add(cn__server *s, cn__conn *c);
void cn__conn_on_closed(uv_handle_t *h);

#endif
