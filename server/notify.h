/* notify.h - tell a service manager (systemd, Type=notify) where the
 * daemon stands: see notify.c. */
#ifndef CANOPY_SERVER_NOTIFY_H
#define CANOPY_SERVER_NOTIFY_H

/* Sends state ("READY=1", "STOPPING=1", newline-separated assignments,
 * sd_notify(3)) to $NOTIFY_SOCKET. Returns 0 when it was sent or when no
 * manager listens (NOTIFY_SOCKET unset), else a negative errno (and logs
 * a warning: the manager will time the start-up out). Any
 * thread; never blocks for long (one datagram on a local socket). */
int cn__notify(const char *state);

#endif
