/* notify.c - systemd's readiness protocol without libsystemd.
 *
 * A unit with Type=notify starts the daemon with NOTIFY_SOCKET naming a
 * unix datagram socket (a path, or "@name" in the abstract namespace);
 * the daemon sends "READY=1" once it serves and "STOPPING=1" when it
 * starts to drain (sd_notify(3); the protocol is documented as stable in
 * systemd's "Interface Portability and Stability" promise). That is one
 * sendto(2): linking libsystemd for it would add a dependency to the
 * build, the image and every test machine for twenty lines, so it is
 * spoken here directly, like the daemons systemd's documentation lists as
 * doing so. Without NOTIFY_SOCKET every call is a no-op. */
#include "notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

int cn__notify(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  int rc = 0, fd = -1;
  if (path == NULL || path[0] == '\0') goto out;
  size_t len = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof(a.sun_path)) {
    rc = -EINVAL;
    goto out;
  }
  memcpy(a.sun_path, path, len);
  if (a.sun_path[0] == '@') a.sun_path[0] = '\0'; /* abstract namespace */
  fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    rc = -errno;
    goto out;
  }
  /* The manager learns the sender's pid from the kernel (SO_PASSCRED on
   * its end), which is how NotifyAccess=main knows the message is ours. */
  socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
  if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&a,
             alen) < 0)
    rc = -errno;
out:
  if (fd >= 0) close(fd);
  if (rc < 0)
    CN_LOG(CN_LOG_WARN, "msg=notify-failed socket=\"%s\" error=\"%s\"",
           path, strerror(-rc));
  return rc;
}
