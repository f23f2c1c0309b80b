/* sd_notify.c — service-manager notification and socket activation (see sd_notify.h). */
#include "sd_notify.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define LISTEN_FDS_START 3

static struct {
	int fd;
	struct sockaddr_un addr;
	socklen_t addr_len;
	uint64_t watchdog_ns;
} notifier = {.fd = -1};

/* A decimal that fits uint64 exactly, or false. */
static bool parse_u64(const char *s, uint64_t *out)
{
	if (!s || !*s)
		return false;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || *s == '-')
		return false;
	*out = v;
	return true;
}

int sd_notify_init(struct sidecar_error *err)
{
	const char *path = getenv("NOTIFY_SOCKET");
	const char *wd = getenv("WATCHDOG_USEC");
	const char *wd_pid = getenv("WATCHDOG_PID");
	uint64_t usec = 0, pid = 0;
	if (wd && (!parse_u64(wd, &usec) || usec == 0 || usec > UINT64_MAX / 1000))
		return error_set(err, MOE_EINVAL,
		                 "WATCHDOG_USEC=%s: expected a positive number of microseconds",
		                 wd);
	if (wd_pid && !parse_u64(wd_pid, &pid))
		return error_set(err, MOE_EINVAL, "WATCHDOG_PID=%s: not a process id", wd_pid);
	if (wd && (!wd_pid || pid == (uint64_t)getpid()))
		notifier.watchdog_ns = usec * 1000;
	if (!path || !*path)
		return 0;
	if (path[0] != '/' && path[0] != '@')
		return error_set(err, MOE_EINVAL,
		                 "NOTIFY_SOCKET=%s: expected an absolute path or @abstract name",
		                 path);
	const size_t n = strlen(path);
	if (n >= sizeof(notifier.addr.sun_path))
		return error_set(err, MOE_EINVAL, "NOTIFY_SOCKET=%s: longer than %zu bytes", path,
		                 sizeof(notifier.addr.sun_path) - 1);
	notifier.addr.sun_family = AF_UNIX;
	memcpy(notifier.addr.sun_path, path, n);
	if (path[0] == '@')
		notifier.addr.sun_path[0] = '\0';
	notifier.addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
	notifier.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (notifier.fd < 0)
		return error_set(err, MOE_ESYS, "NOTIFY_SOCKET: socket: %s", strerror(errno));
	const struct timeval wait = {.tv_sec = 5};
	if (setsockopt(notifier.fd, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof(wait)) != 0)
		return error_set(err, MOE_ESYS, "NOTIFY_SOCKET: SO_SNDTIMEO: %s", strerror(errno));
	return 0;
}

bool sd_notify_enabled(void)
{
	return notifier.fd >= 0;
}

static void send_notice(int flags, const char *fmt, va_list ap)
{
	char msg[512];
	int n = vsnprintf(msg, sizeof(msg), fmt, ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(msg))
		n = sizeof(msg) - 1;
	ssize_t rc;
	do
		rc = sendto(notifier.fd, msg, (size_t)n, flags | MSG_NOSIGNAL,
		            (const struct sockaddr *)&notifier.addr, notifier.addr_len);
	while (rc < 0 && errno == EINTR);
}

void sd_notify(const char *fmt, ...)
{
	if (notifier.fd < 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	send_notice(MSG_DONTWAIT, fmt, ap);
	va_end(ap);
}

void sd_notify_wait(const char *fmt, ...)
{
	if (notifier.fd < 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	send_notice(0, fmt, ap); /* SO_SNDTIMEO (sd_notify_init) bounds the wait */
	va_end(ap);
}

uint64_t sd_watchdog_ns(void)
{
	return notifier.fd >= 0 ? notifier.watchdog_ns : 0;
}

void sd_notify_close(void)
{
	if (notifier.fd >= 0)
		close(notifier.fd);
	notifier.fd = -1;
}

int sd_listen_fd(int *fd, char *path, size_t path_len, struct sidecar_error *err)
{
	*fd = -1;
	path[0] = '\0';
	const char *pid_s = getenv("LISTEN_PID"), *fds_s = getenv("LISTEN_FDS");
	uint64_t pid = 0, fds = 0;
	const bool ours = pid_s && parse_u64(pid_s, &pid) && pid == (uint64_t)getpid();
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	if (!ours)
		return 0;
	if (!fds_s || !parse_u64(fds_s, &fds) || fds != 1)
		return error_set(err, MOE_EINVAL,
		                 "socket activation: LISTEN_FDS=%s; the sidecar serves exactly one "
		                 "socket (ListenStream= once in the .socket unit)",
		                 fds_s ? fds_s : "(unset)");
	const int s = LISTEN_FDS_START;
	struct stat st;
	int type = 0, listening = 0;
	struct sockaddr_un addr = {0};
	socklen_t tl = sizeof(type), ll = sizeof(listening), al = sizeof(addr);
	if (fstat(s, &st) != 0 || !S_ISSOCK(st.st_mode) ||
	    getsockopt(s, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM ||
	    getsockopt(s, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) != 0 || !listening ||
	    getsockname(s, (struct sockaddr *)&addr, &al) != 0 || addr.sun_family != AF_UNIX)
		return error_set(err, MOE_EINVAL,
		                 "socket activation: descriptor %d is not a listening Unix stream "
		                 "socket (ListenStream=/path in the .socket unit)",
		                 s);
	int flags = fcntl(s, F_GETFL);
	if (flags < 0 || fcntl(s, F_SETFL, flags | O_NONBLOCK) != 0 ||
	    fcntl(s, F_SETFD, FD_CLOEXEC) != 0)
		return error_set(err, MOE_ESYS, "socket activation: fcntl on descriptor %d: %s", s,
		                 strerror(errno));
	if (al > offsetof(struct sockaddr_un, sun_path) && addr.sun_path[0])
		snprintf(path, path_len, "%.*s", (int)(al - offsetof(struct sockaddr_un, sun_path)),
		         addr.sun_path);
	else
		snprintf(path, path_len, "(passed socket, fd %d)", s);
	*fd = s;
	return 1;
}
