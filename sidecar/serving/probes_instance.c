/* probes_instance.c — the default probe instance name, derived from the socket path
 * (probes_instance.h). Names are bpffs directory names under /sys/fs/bpf/moe-sidecar/, so a
 * fixed-length hash keeps them short and within pagecache's [A-Za-z0-9_.-] whatever the path
 * holds; the log and STATS say which one a sidecar took.
 */
#include "probes_instance.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv1a64(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 0x100000001b3ull;
	}
	return h;
}

int probes_instance_for_socket(const char *socket_path, char name[PROBES_INSTANCE_NAME_LEN],
                               struct sidecar_error *err)
{
	if (!strcmp(socket_path, PROBES_INSTANCE_SYSTEM_SOCKET)) { /* whether /run has it or not */
		snprintf(name, PROBES_INSTANCE_NAME_LEN, "%s", PROBES_INSTANCE_SYSTEM);
		return 0;
	}
	/* The directory is resolved, not the socket: the path names what a client connects to,
	 * which may be gone (a stale socket) or not be made yet. */
	const char *slash = strrchr(socket_path, '/');
	const char *base = slash ? slash + 1 : socket_path;
	char dir[PATH_MAX];
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == socket_path)
		snprintf(dir, sizeof(dir), "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - socket_path), socket_path);
	if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
		return error_set(err, MOE_EINVAL, "socket path '%s' names no file", socket_path);
	char real[PATH_MAX];
	if (!realpath(dir, real))
		return error_set_errno(err, "%s: the socket's directory", dir);
	char canonical[PATH_MAX + 256];
	snprintf(canonical, sizeof(canonical), "%s/%s", strcmp(real, "/") ? real : "", base);
	if (!strcmp(canonical, PROBES_INSTANCE_SYSTEM_SOCKET))
		snprintf(name, PROBES_INSTANCE_NAME_LEN, "%s", PROBES_INSTANCE_SYSTEM);
	else
		snprintf(name, PROBES_INSTANCE_NAME_LEN, "sock-%016llx",
		         (unsigned long long)fnv1a64(canonical));
	return 0;
}
