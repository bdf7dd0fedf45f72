/* grpc_impl.h - one gRPC connection and its calls, shared by the three
 * parts of the gRPC front end:
 *   grpc.c        the HTTP/2 session on the loop: a connection, its
 *                 reads and writes, the dispatch of a call to its
 *                 in-memory HTTP connection, its close;
 *   grpc_accept.c the listener, accept, the sweep of every connection's
 *                 deadlines, drain, and the in-memory connections;
 *   grpc_call.c   one call's framing: nghttp2's callbacks that gather its
 *                 headers and message within its limits, and its answer
 *                 (the response message and the grpc-status trailers).
 * All on the loop thread. */
#ifndef CANOPY_SERVER_GRPC_IMPL_H
#define CANOPY_SERVER_GRPC_IMPL_H

#include <nghttp2/nghttp2.h>

#include "grpc.h"

/* Calls open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS). */
#define MAX_STREAMS 128
/* Bytes written and not yet taken by the socket, past which nothing more
 * is read from the connection nor made to send. */
#define WBUF_MAX (1 << 20)
/* HTTP/2's flow-control windows: a call's message arrives without waiting
 * on WINDOW_UPDATEs up to this (gRPC's own default is 64 KiB). */
#define STREAM_WINDOW (1 << 20)
#define CONN_WINDOW (16 << 20)

typedef struct gconn gconn;

/* One call (an HTTP/2 stream). */
typedef struct gstream {
  gconn *gc;
  int32_t id;
  int method;               /* grpc_service.c's index; -1 unknown       */
  char path[160];
  bool post, grpc_ct;       /* :method POST, content-type application/grpc */
  char encoding[16];        /* grpc-encoding: a compressed message's coding */
  cn__grpc_meta meta;
  double t_begin;           /* its first frame (the call's deadline)    */
  /* the request: its framed messages */
  char *in;
  size_t in_len, in_cap;
  size_t held;              /* of in_cap, counted in body_bytes          */
  bool complete;            /* END_STREAM received                      */
  bool dispatched;          /* handed to the in-memory connection       */
  bool answered;            /* response submitted                       */
  bool ready;               /* on the connection's list to dispatch     */
  cn__conn *mc;             /* the in-memory HTTP connection of the call */
  /* the answer: one framed message, then the trailers */
  uint8_t *out;
  size_t out_len, out_off;
  int status;
  char message[600];
  struct gstream *prev, *next, *rnext;
} gstream;

struct gconn {
  cn__server *srv;
  uv_tcp_t tcp;
  bool sock, counted, closed, reading, goaway;
  bool lingering;           /* done: FIN sent, reading until the peer's */
  nghttp2_session *ng;
  gstream *streams, *rhead, *rtail; /* open calls; complete, to dispatch */
  int n_streams;
  double deadline;          /* idle or first-request deadline (0: none) */
  double last_out;          /* DATA last went out (or the answer began)  */
  int in_recv;              /* inside nghttp2_session_mem_recv           */
  int in_sink;              /* inside an in-memory connection's answer  */
  /* in-memory connections done with while one of them was answering
   * (in_sink): freed once outside its stack (conn.c goes on using the one
   * answering after its sink returns) */
  cn__conn **graveyard;
  int n_grave, grave_cap;
  size_t wbytes;            /* in the socket's write queue              */
  cn__conn_sink sink;
  void *sink_ud;
  gconn *prev, *next;
};

struct cn__grpc_conn {
  gconn c;
};

/* grpc.c: the loop's connections (a list), and what grpc_accept.c runs
 * of a connection: a new one of s (its session, the server's SETTINGS
 * queued), the bytes read fed to its session, what its session has to
 * send written out, the in-memory connections set aside while an answer
 * was on the stack freed, its close, and its memory freed once closed. */
extern gconn *cn__grpc_conns;
gconn *cn__grpc_conn_new(cn__server *s);
void cn__grpc_conn_feed(gconn *gc, const char *data, size_t n);
void cn__grpc_flush(gconn *gc);
void cn__grpc_bury(gconn *gc);
void cn__grpc_conn_close(gconn *gc);
void cn__grpc_conn_free(gconn *gc);

/* grpc_call.c: a call's answer (status, message, the framed response
 * message f of n bytes or NULL, the request's id for the log), and an
 * answer with no message. */
void cn__grpc_call_answer(gstream *st, int status, const char *message,
                          uint8_t *f, size_t n, const char *id);
void cn__grpc_call_error(gstream *st, int status, const char *message);
/* The call's request message dropped, and its bytes given back to
 * max-body-memory. */
void cn__grpc_body_release(gstream *st);
/* nghttp2's callbacks for a call's frames (grpc.c registers them). */
int cn__grpc_on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f,
                              void *ud);
int cn__grpc_on_header(nghttp2_session *ng, const nghttp2_frame *f,
                       const uint8_t *name, size_t namelen,
                       const uint8_t *value, size_t valuelen, uint8_t flags,
                       void *ud);
int cn__grpc_on_data(nghttp2_session *ng, uint8_t flags, int32_t id,
                     const uint8_t *data, size_t len, void *ud);
int cn__grpc_on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f,
                           void *ud);
int cn__grpc_on_frame_send(nghttp2_session *ng, const nghttp2_frame *f,
                           void *ud);

#endif
