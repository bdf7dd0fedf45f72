/* listen.c - the listening sockets and the descriptor limit; conn.c
 * serves the HTTP connections they accept (uv_tcp in the libuv loop), and
 * grpc.c those of grpc-port when it is set. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net.h"

/* Descriptors kept for everything but client connections: models, logs,
 * the loop's own, workers, loader threads, refused connections. */
#define FD_RESERVE 128

/* Each connection is a descriptor. The soft RLIMIT_NOFILE (often 1024)
 * goes up to the hard limit, as nginx and redis do; if max-connections
 * still does not fit, it is lowered, with a line saying so. */
static void fit_fd_limit(cn__server *s) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) rl.rlim_cur = was;
  }
  int want = s->cfg.serve.max_connections;
  if (rl.rlim_cur != RLIM_INFINITY &&
      (rlim_t)want + FD_RESERVE > rl.rlim_cur) {
    long fit = (long)rl.rlim_cur - FD_RESERVE;
    s->cfg.serve.max_connections = fit < 1 ? 1 : (int)fit;
    CN_LOG(CN_LOG_WARN, "msg=max-connections-clamped wanted=%d "
           "max_connections=%d nofile=%llu reason=\"RLIMIT_NOFILE (raise the "
           "hard limit: ulimit -Hn, LimitNOFILE=)\"",
           want, s->cfg.serve.max_connections,
           (unsigned long long)rl.rlim_cur);
  }
}

static const char *in_use_hint(int e) {
  return e == EADDRINUSE ? " (another process listens there; stop it, "
                           "choose another port, or set reuse-port true "
                           "in both to share it on purpose)"
                         : "";
}

/* The listening socket, made here rather than by libuv so that a port in
 * use is a start-up error saying so. It is bound before the models load,
 * so that a second daemon started by mistake fails at once rather than
 * after loading every model, and listens once they are loaded (Linux
 * refuses the bind where a socket already listens on the port, and the
 * listen where two daemons starting together both bound it). SO_REUSEADDR lets a restarted daemon
 * bind while old connections sit in TIME_WAIT; it does not let two
 * processes listen on one port. SO_REUSEPORT does, and so is set only
 * when the operator asks for it (reuse-port): a second daemon started by
 * mistake must fail, not silently take half the traffic. */
static int bound_socket(const cn_serve_config *sc, const struct addrinfo *ai,
                        const char *key, int port, int *bound_port,
                        cn_err *err) {
  int one = 1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                  0);
  if (fd < 0)
    return cn_err_set(err, CN_E_BAD_CONFIG, "host: socket(): %s",
                      strerror(errno));
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (sc->reuse_port &&
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
    int e = errno;
    close(fd);
    return cn_err_set(err, CN_E_BAD_CONFIG, "reuse-port: SO_REUSEPORT: %s",
                      strerror(e));
  }
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    int e = errno;
    close(fd);
    return cn_err_set(err, CN_E_BAD_CONFIG,
                      "%s: cannot listen on %s:%d: %s%s", key, sc->host,
                      port, strerror(e), in_use_hint(e));
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  *bound_port = port;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
    *bound_port = ntohs(ss.ss_family == AF_INET6
                            ? ((struct sockaddr_in6 *)&ss)->sin6_port
                            : ((struct sockaddr_in *)&ss)->sin_port);
  return fd;
}

/* grpc-port, bound with the HTTP port (the same host, the same rules). */
static int grpc_bind(cn__server *s, const struct addrinfo *http_ai,
                     cn_err *err) {
#ifdef CN_HAVE_GRPC
  const cn_serve_config *sc = &s->cfg.serve;
  struct addrinfo ai = *http_ai;
  struct sockaddr_storage ss;
  memcpy(&ss, http_ai->ai_addr, http_ai->ai_addrlen);
  if (ss.ss_family == AF_INET6)
    ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)sc->grpc_port);
  else
    ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)sc->grpc_port);
  ai.ai_addr = (struct sockaddr *)&ss;
  int fd = bound_socket(sc, &ai, "grpc-port", sc->grpc_port,
                        &s->grpc_bound_port, err);
  if (fd < 0) return fd;
  s->grpc_fd = fd;
  s->grpc_bound = true;
  return 0;
#else
  (void)http_ai;
  return cn_err_set(err, CN_E_BAD_CONFIG, "grpc-port %d: this canopy was "
                    "built without gRPC (meson -Dgrpc: libnghttp2-dev, "
                    "libprotobuf-c-dev, protobuf-c-compiler); set grpc-port "
                    "0", s->cfg.serve.grpc_port);
#endif
}

int cn__http_bind(cn__server *s, cn_err *err) {
  const cn_serve_config *sc = &s->cfg.serve;
  s->listen_fd = -1;
  fit_fd_limit(s);
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
  hints.ai_socktype = SOCK_STREAM;
  char port[8];
  snprintf(port, sizeof(port), "%d", sc->port);
  const char *host = sc->host;
  if (strcmp(host, "localhost") == 0) host = "127.0.0.1";
  if (getaddrinfo(host, port, &hints, &ai) != 0 || ai == NULL)
    return cn_err_set(err, CN_E_BAD_CONFIG,
                      "host: '%s' is not an IPv4 or IPv6 address", sc->host);
  int fd = bound_socket(sc, ai, "port", sc->port, &s->bound_port, err);
  if (fd >= 0) s->listen_fd = fd;
  if (fd >= 0 && sc->grpc_port != 0) fd = grpc_bind(s, ai, err);
  freeaddrinfo(ai);
  if (fd < 0) {
    cn__http_unbind(s);
    return fd;
  }
  return 0;
}

void cn__http_unbind(cn__server *s) {
  if (s->listen_fd >= 0) close(s->listen_fd);
  s->listen_fd = -1;
  if (s->grpc_bound) close(s->grpc_fd);
  s->grpc_bound = false;
}

/* The gRPC port, bound by cn__http_bind: listening from here on. */
static int grpc_start(cn__server *s, cn_err *err) {
#ifdef CN_HAVE_GRPC
  if (!s->grpc_bound) return 0;
  const cn_serve_config *sc = &s->cfg.serve;
  if (listen(s->grpc_fd, 511) != 0) {
    int e = errno;
    return cn_err_set(err, CN_E_BAD_CONFIG,
                      "grpc-port: cannot listen on %s:%d: %s%s", sc->host,
                      sc->grpc_port, strerror(e), in_use_hint(e));
  }
  if (cn__grpc_listen(s, s->grpc_fd, err) != 0) return err->code;
  s->grpc_bound = false; /* the listener's now */
  CN_LOG(CN_LOG_INFO, "msg=listening-grpc host=%s port=%d "
         "max_message_bytes=%d", sc->host, s->grpc_bound_port,
         sc->grpc_max_message_bytes);
#endif
  (void)s, (void)err;
  return 0;
}

int cn__http_start(cn__server *s, cn_err *err) {
  const cn_serve_config *sc = &s->cfg.serve;
  int fd = s->listen_fd;
  if (listen(fd, 511) != 0) {
    int e = errno;
    cn__http_unbind(s);
    return cn_err_set(err, CN_E_BAD_CONFIG,
                      "port: cannot listen on %s:%d: %s%s", sc->host,
                      sc->port, strerror(e), in_use_hint(e));
  }
  cn__http1_attach(s);
  if (cn__conn_listen(s, fd, err) != 0) {
    cn__http_unbind(s);
    return err->code;
  }
  s->listen_fd = -1; /* the listener's now */
  if (grpc_start(s, err) != 0) {
    cn__http_unbind(s);
    return err->code;
  }
  CN_LOG(CN_LOG_INFO, "msg=listening host=%s port=%d reuse_port=%s "
         "max_connections=%d header_timeout_s=%d body_timeout_s=%d",
         sc->host, s->bound_port, sc->reuse_port ? "true" : "false",
         sc->max_connections, sc->header_timeout_s, sc->body_timeout_s);
  return 0;
}

/* Drain: no new connections (the listening socket is closed, so connect()
 * is refused); open connections keep being served. */
void cn__http_quiesce(cn__server *s) {
  cn__conn_quiesce(s);
#ifdef CN_HAVE_GRPC
  cn__grpc_quiesce(s);
#endif
}

/* Stop: every connection closes, before the loop's last turn. */
void cn__http_close_handles(cn__server *s) {
#ifdef CN_HAVE_GRPC
  cn__grpc_close_all(s);
#endif
  cn__conn_close_all(s);
}
