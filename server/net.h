/* net.h - the connections, the lowest layer of the daemon:
 * the listening socket (listen.c), HTTP/1.1 framing (conn_parse.c) and the
 * sockets (conn.c). They know requests only as the handles they hand up
 * through cn__http_hooks, and call nothing above them by name
 * (docs/architecture.md, "server/ in layers"). */
#ifndef CANOPY_SERVER_NET_H
#define CANOPY_SERVER_NET_H

#include "server.h"

/* What the connections (conn.c, conn_parse.c) hand up: a request head,
 * its body, its end, an error of the front end, a client that hung up,
 * the connection done with a request, and the Retry-After of a 429/503.
 * The daemon's entry sets it to http.c's handlers (cn__http_handlers); the
 * connections call nothing above them by name. */
typedef struct cn__http_hooks {
  cn__req *(*begin)(cn__server *s, cn__conn *c, const char *method,
                    const char *url);
  int (*head_done)(cn__req *r, unsigned long long body_len);
  int (*body)(cn__req *r, const char *data, size_t n);
  void (*complete)(cn__req *r);
  void (*fail)(cn__req *r, int code, const char *msg);
  void (*hangup)(cn__req *r);
  void (*release)(cn__req *r);
  int (*retry_after_s)(cn__server *s);
} cn__http_hooks;

/* listen.c: the listening socket and the file descriptor limit */
/* Binds the port (before the models load: a port in use fails at once). */
int cn__http_bind(cn__server *s, cn_err *err);
/* Closes a port bound and not yet listening (a start-up that failed). */
void cn__http_unbind(cn__server *s);
/* Listens on it and accepts connections. */
int cn__http_start(cn__server *s, cn_err *err);
void cn__http_quiesce(cn__server *s); /* stop accepting connections */
void cn__http_close_handles(cn__server *s);

/* conn.c: HTTP/1.1 connections */
int cn__conn_listen(cn__server *s, int fd, cn_err *err);
void cn__conn_quiesce(cn__server *s);
void cn__conn_close_all(cn__server *s);
/* conn_parse.c: HTTP/1.1 over the server's connections (before listening,
 * or before cn__conn_new_mem). */
void cn__http1_attach(cn__server *s);
const char *cn__conn_header(const cn__conn *c, const char *name);
/* The answer to r (body taken over; extra: more header lines, each
 * ending in CRLF); 499 writes nothing and closes. */
void cn__conn_respond(cn__req *r, int status, char *body, size_t blen,
                      const char *ctype, const char *extra);
void cn__conn_write(cn__conn *c, char *buf, size_t len);
/* In memory (tests/fuzz/fuzz_http.c): a connection without a socket whose
 * output goes to sink; bytes in with cn__conn_feed, deadlines with
 * cn__conn_tick, the client's EOF with cn__conn_eof. */
typedef void (*cn__conn_sink)(void *ud, const char *data, size_t n);
cn__conn *cn__conn_new_mem(cn__server *s, cn__conn_sink sink, void *ud);
void cn__conn_feed(cn__conn *c, const char *data, size_t n);
void cn__conn_tick(cn__conn *c, double now);
void cn__conn_eof(cn__conn *c);
bool cn__conn_closed(const cn__conn *c);
void cn__conn_free_mem(cn__conn *c);
/* How the connection's requests arrive (metrics.h CN__PROTO_*): HTTP,
 * unless set (grpc.c's in-memory connections are gRPC calls). */
void cn__conn_set_protocol(cn__conn *c, int protocol);
int cn__conn_protocol(const cn__conn *c);

/* grpc.c: the gRPC front end, HTTP/2 connections on grpc-port whose calls
 * become HTTP/1.1 requests on in-memory connections (grpc.h). Built with
 * nghttp2 and protobuf-c (CN_HAVE_GRPC). */
int cn__grpc_listen(cn__server *s, int fd, cn_err *err);
void cn__grpc_quiesce(cn__server *s); /* drain: GOAWAY, no new connections */
void cn__grpc_close_all(cn__server *s);
/* In memory (tests/fuzz/fuzz_grpc.c), as cn__conn_new_mem: the client's
 * bytes in with cn__grpc_feed, the server's out to sink. */
typedef struct cn__grpc_conn cn__grpc_conn;
cn__grpc_conn *cn__grpc_new_mem(cn__server *s, cn__conn_sink sink, void *ud);
void cn__grpc_feed(cn__grpc_conn *c, const char *data, size_t n);
void cn__grpc_tick(cn__grpc_conn *c, double now);
bool cn__grpc_closed(const cn__grpc_conn *c);
void cn__grpc_free_mem(cn__grpc_conn *c);

#endif
