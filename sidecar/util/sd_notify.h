/* sd_notify.h — the two protocols a service manager (systemd, or anything that speaks them)
 * offers a daemon, written by hand so the sidecar needs no libsystemd:
 *  - notification: datagrams of "KEY=VALUE\n" lines to the AF_UNIX socket named by
 *    $NOTIFY_SOCKET (a path, or "@name" for the abstract namespace): READY=1, STATUS=…,
 *    STOPPING=1, WATCHDOG=1. $WATCHDOG_USEC (with $WATCHDOG_PID, if set, naming us) asks for
 *    a WATCHDOG=1 at least that often;
 *  - socket activation: $LISTEN_PID naming us and $LISTEN_FDS = 1 pass a listening socket as
 *    descriptor 3, so clients can connect before the daemon even runs.
 *
 * Owns: one process-wide datagram socket, opened by sd_notify_init from the environment
 * (read once, at start, before any thread exists). Without $NOTIFY_SOCKET every call is a
 * no-op. Threading: sd_notify_* from any thread after init (one sendto each).
 * Errors: STATUS= and WATCHDOG=1 are best effort (MSG_DONTWAIT: a manager whose queue is full
 * loses them, the dispatcher never waits); READY=1 and STOPPING=1 must arrive, so
 * sd_notify_wait waits for room in the manager's queue, at most 5 s. Never SIGPIPE.
 * sd_notify_init and sd_listen_fd return -1 with err filled.
 */
#ifndef MOE_SD_NOTIFY_H
#define MOE_SD_NOTIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* Reads $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID and opens the socket. 0 (also when
 * there is nothing to notify), or -1 for a variable that cannot be used. */
int sd_notify_init(struct sidecar_error *err);
/* Whether a manager listens (READY etc. go somewhere). */
bool sd_notify_enabled(void);
/* One datagram (the message is given without a trailing newline; lines joined by '\n'),
 * dropped if the manager's queue is full. */
void sd_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same for a message that must not be lost (READY, STOPPING): waits for room, 5 s at most. */
void sd_notify_wait(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The manager's watchdog period in ns, 0 when it asks for none: send WATCHDOG=1 at least
 * every half of it. */
uint64_t sd_watchdog_ns(void);
/* Closes the socket (at exit). */
void sd_notify_close(void);

/* The socket passed by socket activation: 1 with *fd set (a listening AF_UNIX stream
 * socket, made close-on-exec and non-blocking), 0 when none was passed ($LISTEN_PID unset
 * or not ours), -1 with err filled for one that cannot be served ($LISTEN_FDS other than 1,
 * not a listening Unix stream socket). The variables are unset either way, as
 * sd_listen_fds(1) does, so no child inherits them. */
int sd_listen_fd(int *fd, char *path, size_t path_len, struct sidecar_error *err);

#endif
