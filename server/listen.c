/* listen.c - the libmicrohttpd daemon and its place in the libuv loop.
 *
 * uv-poll mode: MHD is started without a thread (MHD_USE_EPOLL); the loop
 * watches MHD's epoll fd with a uv_poll and calls MHD_run when it is
 * readable, and a uv_timer follows MHD_get_timeout (idle connections,
 * resumed connections with work pending). Resuming a connection signals
 * MHD's inter-thread channel, which makes that epoll fd readable, so the
 * loop needs no other wake-up; cn__http_kick also schedules a run at once.
 * mhd-thread mode: MHD runs its own epoll thread; nothing here polls. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve_impl.h"

static void mhd_run(cn__server *s);

static void on_mhd_timer(uv_timer_t *t) { mhd_run(t->data); }

static void on_mhd_poll(uv_poll_t *p, int status, int events) {
  mhd_run(p->data);
}

/* One pass of MHD's event processing, then re-arm the timer to the next
 * moment MHD wants to run without a socket event. */
static void mhd_run(cn__server *s) {
  if (s->mhd == NULL) return;
  MHD_run(s->mhd);
  MHD_UNSIGNED_LONG_LONG to;
  if (MHD_get_timeout(s->mhd, &to) == MHD_YES)
    uv_timer_start(&s->mhd_timer, on_mhd_timer, to > 1000 ? 1000 : to, 0);
  else
    uv_timer_start(&s->mhd_timer, on_mhd_timer, 1000, 0);
}

void cn__http_kick(cn__server *s) {
  if (!s->mhd_thread && s->mhd != NULL)
    uv_timer_start(&s->mhd_timer, on_mhd_timer, 0, 0);
}

static void mhd_logger(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  size_t n = strlen(msg);
  while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
  for (char *p = msg; *p; p++)
    if (*p == '"') *p = '\'';
  CN_LOG(CN_LOG_DEBUG, "msg=mhd detail=\"%s\"", msg);
}

/* The listening socket, made here rather than by MHD so that a port in
 * use is a start-up error saying so. SO_REUSEADDR lets a restarted daemon
 * bind while old connections sit in TIME_WAIT; it does not let two
 * processes listen on one port. SO_REUSEPORT does, and so is set only
 * when the operator asks for it (reuse-port): a second daemon started by
 * mistake must fail, not silently take half the traffic. */
static int listen_socket(const cn_serve_config *sc, const struct addrinfo *ai,
                         int *bound_port, cn_err *err) {
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
                      "port: cannot listen on %s:%d: %s%s", sc->host,
                      sc->port, strerror(e),
                      e == EADDRINUSE
                          ? " (another process listens there; stop it, "
                            "choose another port, or set reuse-port true "
                            "in both to share it on purpose)"
                          : "");
  }
  if (listen(fd, 511) != 0) {
    int e = errno;
    close(fd);
    return cn_err_set(err, CN_E_BAD_CONFIG, "port: listen(): %s",
                      strerror(e));
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  *bound_port = sc->port;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
    *bound_port = ntohs(ss.ss_family == AF_INET6
                            ? ((struct sockaddr_in6 *)&ss)->sin6_port
                            : ((struct sockaddr_in *)&ss)->sin_port);
  return fd;
}

int cn__http_start(cn__server *s, cn_err *err) {
  const cn_serve_config *sc = &s->cfg.serve;
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
  int bound = 0;
  int lfd = listen_socket(sc, ai, &bound, err);
  int family = ai->ai_family;
  freeaddrinfo(ai);
  if (lfd < 0) return lfd;
  unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ERROR_LOG;
  if (s->mhd_thread) flags |= MHD_USE_INTERNAL_POLLING_THREAD;
  if (family == AF_INET6) flags |= MHD_USE_IPv6;
  cn__http_cbs cbs;
  cn__http_set_callbacks(s, &cbs);
  s->mhd = MHD_start_daemon(
      flags, 0, NULL, NULL, cbs.on_request, s, MHD_OPTION_LISTEN_SOCKET,
      (MHD_socket)lfd, MHD_OPTION_NOTIFY_COMPLETED, cbs.on_completed, s,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)sc->max_connections,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)sc->idle_timeout_s,
      MHD_OPTION_NOTIFY_CONNECTION, cbs.on_connection, s,
      MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, s, MHD_OPTION_END);
  if (s->mhd == NULL) {
    close(lfd);
    return cn_err_set(err, CN_E_BAD_CONFIG,
                      "port: libmicrohttpd could not start on %s:%d",
                      sc->host, bound);
  }
  CN_LOG(CN_LOG_INFO, "msg=listening host=%s port=%d http_mode=%s "
         "reuse_port=%s",
         sc->host, bound, sc->http_mode, sc->reuse_port ? "true" : "false");
  const union MHD_DaemonInfo *di;
  if (s->mhd_thread) return 0;
  di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
  if (di == NULL)
    return cn_err_set(err, CN_E_INTERNAL, "MHD has no epoll fd");
  uv_timer_init(&s->loop, &s->mhd_timer);
  s->mhd_timer.data = s;
  int rc = uv_poll_init(&s->loop, &s->mhd_poll, di->epoll_fd);
  if (rc != 0)
    return cn_err_set(err, CN_E_INTERNAL, "uv_poll on MHD's epoll fd: %s",
                      uv_strerror(rc));
  s->mhd_poll.data = s;
  uv_poll_start(&s->mhd_poll, UV_READABLE, on_mhd_poll);
  cn__http_kick(s);
  return 0;
}

/* Drain: no new connections (the listening socket is closed, so connect()
 * is refused); open connections keep being served. */
void cn__http_quiesce(cn__server *s) {
  if (s->mhd == NULL) return;
  MHD_socket fd = MHD_quiesce_daemon(s->mhd);
  if (fd != MHD_INVALID_SOCKET) close(fd);
  cn__http_kick(s);
}

void cn__http_close_handles(cn__server *s) {
  if (s->mhd_thread || s->mhd == NULL) return;
  uv_close((uv_handle_t *)&s->mhd_poll, NULL);
  uv_close((uv_handle_t *)&s->mhd_timer, NULL);
}

void cn__http_stop(cn__server *s) {
  if (s->mhd != NULL) MHD_stop_daemon(s->mhd);
  s->mhd = NULL;
}
