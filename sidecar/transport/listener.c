/* listener.c — the socket's directory, lock file and bound socket (see listener.h).
 *
 * Why a directory descriptor: the socket usually lives in a directory the sidecar creates,
 * but an operator may point --socket into a shared one (/tmp, a sticky runtime directory).
 * Checking that directory by path and later creating and unlinking by path lets a symlink
 * planted there, or swapped in while the sidecar runs, redirect both: the checks then pass
 * on the link's target and teardown unlinks whatever sits at the path. With one descriptor,
 * opened O_NOFOLLOW and checked with fstat, every later step acts on the directory that was
 * checked.
 *
 * Why bind through /proc/self/fd/N/NAME: Linux has no bindat(). The /proc path resolves
 * through the descriptor's own directory (a magic link to the open file, not to a name), so
 * it is as race-free as an *at() call. fchdir() + a relative bind would do the same but
 * changes the whole process's working directory (and a relative MODEL path resolved after
 * it); the sidecar needs /proc anyway.
 */
#include "listener.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

static bool same_inode(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* dir and name of l->path: "/run/x/s.sock" → "/run/x", "s.sock"; "s.sock" → ".", "s.sock". */
static int split_path(struct listener *l, struct sidecar_error *err)
{
	const char *slash = strrchr(l->path, '/');
	const char *name = slash ? slash + 1 : l->path;
	if (!*name || !strcmp(name, ".") || !strcmp(name, ".."))
		return error_set(err, MOE_EINVAL, "socket path %s does not end in a file name",
		                 l->path);
	snprintf(l->name, sizeof(l->name), "%s", name);
	snprintf(l->lock_name, sizeof(l->lock_name), "%s.lock", name);
	if (!slash)
		snprintf(l->dir, sizeof(l->dir), ".");
	else if (slash == l->path)
		snprintf(l->dir, sizeof(l->dir), "/");
	else
		snprintf(l->dir, sizeof(l->dir), "%.*s", (int)(slash - l->path), l->path);
	return 0;
}

/* Creates the directory (mode 0700, or 0711 when shared) or accepts an existing one that is
 * a real directory, ours or root's, that nobody else can write unless it is sticky. */
static int open_dir(struct listener *l, bool shared, struct sidecar_error *err)
{
	const mode_t mode = shared ? 0711 : 0700;
	bool created = false;
	if (strcmp(l->dir, ".") && strcmp(l->dir, "/")) {
		created = mkdir(l->dir, mode) == 0;
		if (!created && errno != EEXIST)
			return error_set(err, MOE_ESYS, "socket directory %s: mkdir: %s", l->dir,
			                 strerror(errno));
	}
	l->dir_fd = open(l->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (l->dir_fd < 0) {
		int e = errno;
		struct stat st;
		if ((e == ELOOP || e == ENOTDIR) && lstat(l->dir, &st) == 0 && S_ISLNK(st.st_mode))
			return error_set(
			    err, MOE_EINVAL,
			    "socket directory %s is a symbolic link; refusing it (a link "
			    "in a shared directory can lead anywhere): use a real directory",
			    l->dir);
		if (e == ENOTDIR)
			return error_set(err, MOE_EINVAL, "socket directory %s: not a directory",
			                 l->dir);
		return error_set(err, MOE_ESYS, "socket directory %s: %s", l->dir, strerror(e));
	}
	struct stat st;
	if (fstat(l->dir_fd, &st) != 0)
		return error_set(err, MOE_ESYS, "socket directory %s: fstat: %s", l->dir,
		                 strerror(errno));
	if (st.st_uid != geteuid() && st.st_uid != 0)
		return error_set(err, MOE_EINVAL,
		                 "socket directory %s: owned by uid %u, not by us (%u) or root",
		                 l->dir, (unsigned)st.st_uid, (unsigned)geteuid());
	if (created && fchmod(l->dir_fd, mode) != 0) /* mkdir's mode went through the umask */
		return error_set(err, MOE_ESYS, "socket directory %s: chmod %o: %s", l->dir,
		                 (unsigned)mode, strerror(errno));
	if (!created && (st.st_mode & 022) && !(st.st_mode & S_ISVTX))
		return error_set(err, MOE_EINVAL,
		                 "socket directory %s: mode %o lets others replace the socket",
		                 l->dir, (unsigned)(st.st_mode & 07777));
	return 0;
}

/* Takes the lock file next to the socket: a second sidecar on the same path refuses. */
static int take_lock(struct listener *l, struct sidecar_error *err)
{
	/* The previous owner unlinks the file as it stops: if that happens between our open and
	 * our flock, we hold a lock on a file nobody else will open. Then open again. */
	for (int attempt = 0;; attempt++) {
		int fd = openat(l->dir_fd, l->lock_name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC,
		                0600);
		if (fd < 0)
			return error_set(err, MOE_ESYS, "%s.lock: open: %s", l->path,
			                 strerror(errno));
		struct stat st;
		if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
		    st.st_nlink != 1) {
			close(fd);
			return error_set(
			    err, MOE_EINVAL,
			    "%s.lock is not a lock file of ours (a plain file owned by uid "
			    "%u with one link); refusing to write into it: remove it",
			    l->path, (unsigned)geteuid());
		}
		if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
			int e = errno;
			char pid[32] = "";
			ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
			close(fd);
			if (e != EWOULDBLOCK)
				return error_set(err, MOE_ESYS, "%s.lock: flock: %s", l->path,
				                 strerror(e));
			if (n > 0)
				pid[strcspn(pid, "\n")] = '\0';
			return error_set(
			    err, MOE_ESYS,
			    "another moe-sidecar (pid %s) is serving %s; refusing to start",
			    n > 0 ? pid : "?", l->path);
		}
		struct stat now;
		if (fstatat(l->dir_fd, l->lock_name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
		    same_inode(&now, &st)) {
			l->lock_fd = fd;
			break;
		}
		close(fd);
		if (attempt == 2)
			return error_set(err, MOE_ESYS,
			                 "%s.lock keeps being replaced; refusing to start",
			                 l->path);
	}
	char pid[32];
	int len = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	if (ftruncate(l->lock_fd, 0) != 0 || pwrite(l->lock_fd, pid, (size_t)len, 0) != len)
		log_warn("server", "%s.lock: could not record our pid: %s", l->path,
		         strerror(errno));
	return 0;
}

/* We hold the lock, so whoever made a socket at our name is gone. */
static int remove_stale_socket(struct listener *l, struct sidecar_error *err)
{
	struct stat st;
	if (fstatat(l->dir_fd, l->name, &st, AT_SYMLINK_NOFOLLOW) != 0)
		return errno == ENOENT
		           ? 0
		           : error_set(err, MOE_ESYS, "%s: %s", l->path, strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return error_set(err, MOE_EINVAL,
		                 "%s exists and is not a socket; refusing to replace it", l->path);
	if (unlinkat(l->dir_fd, l->name, 0) != 0)
		return error_set(err, MOE_ESYS, "%s: removing stale socket: %s", l->path,
		                 strerror(errno));
	log_info("server", "replaced a stale socket path=%s", l->path);
	return 0;
}

static int bind_socket(struct listener *l, bool shared, struct sidecar_error *err)
{
	l->sock_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (l->sock_fd < 0)
		return error_set(err, MOE_ESYS, "socket(AF_UNIX): %s", strerror(errno));
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int n = snprintf(addr.sun_path, sizeof(addr.sun_path), "/proc/self/fd/%d/%s", l->dir_fd,
	                 l->name);
	if (n < 0 || (size_t)n >= sizeof(addr.sun_path)) {
		const size_t prefix = (size_t)n - strlen(l->name); /* "/proc/self/fd/N/" */
		return error_set(
		    err, MOE_EINVAL,
		    "%s: the socket's file name is too long to bind through /proc/self/fd "
		    "(at most %zu bytes)",
		    l->path, sizeof(addr.sun_path) - 1 - prefix);
	}
	/* Created 0600 whatever the umask (never more open than asked, not even for a moment);
	 * the umask is the process's, so this runs before any other thread exists. */
	mode_t old = umask(0177);
	int rc = bind(l->sock_fd, (struct sockaddr *)&addr, sizeof(addr));
	int e = errno;
	umask(old);
	if (rc != 0)
		return error_set(err, MOE_ESYS, "%s: bind: %s%s", l->path, strerror(e),
		                 e == ENOENT ? " (is /proc mounted?)" : "");
	struct stat st;
	if (fstatat(l->dir_fd, l->name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISSOCK(st.st_mode))
		return error_set(err, MOE_ESYS, "%s: the socket just bound is not there", l->path);
	l->sock_dev = st.st_dev;
	l->sock_ino = st.st_ino;
	if (shared && fchmodat(l->dir_fd, l->name, 0666, 0) != 0)
		return error_set(err, MOE_ESYS, "%s: chmod 666: %s", l->path, strerror(errno));
	return 0;
}

int listener_open(struct listener *l, const char *path, bool shared, struct sidecar_error *err)
{
	memset(l, 0, sizeof(*l));
	l->dir_fd = l->lock_fd = l->sock_fd = -1;
	if (strlen(path) >= sizeof(l->path))
		return error_set(err, MOE_EINVAL,
		                 "socket path is %zu bytes; at most %zu fit in sun_path",
		                 strlen(path), sizeof(l->path) - 1);
	snprintf(l->path, sizeof(l->path), "%s", path);
	if (split_path(l, err) != 0 || open_dir(l, shared, err) != 0 || take_lock(l, err) != 0 ||
	    remove_stale_socket(l, err) != 0)
		return -1;
	return bind_socket(l, shared, err);
}

int listener_listen(struct listener *l, int backlog, struct sidecar_error *err)
{
	if (listen(l->sock_fd, backlog) != 0)
		return error_set(err, MOE_ESYS, "%s: listen: %s", l->path, strerror(errno));
	return 0;
}

/* Unlinks name if it still leads to `mine`; says so when something else took its place. */
static void unlink_if_ours(const struct listener *l, const char *name, const struct stat *mine)
{
	struct stat st;
	if (fstatat(l->dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
		return; /* already gone */
	if (!same_inode(&st, mine)) {
		log_warn("server",
		         "not removing %s/%s: it is no longer the file this sidecar made (replaced "
		         "while it ran)",
		         l->dir, name);
		return;
	}
	if (unlinkat(l->dir_fd, name, 0) != 0)
		log_warn("server", "%s/%s: unlink: %s", l->dir, name, strerror(errno));
}

void listener_close(struct listener *l)
{
	if (l->sock_fd >= 0) {
		close(l->sock_fd);
		l->sock_fd = -1;
	}
	if (l->dir_fd >= 0 && l->sock_ino) {
		struct stat mine = {.st_dev = l->sock_dev, .st_ino = l->sock_ino};
		unlink_if_ours(l, l->name, &mine);
		l->sock_ino = 0;
	}
	if (l->lock_fd >= 0) {
		struct stat mine;
		if (l->dir_fd >= 0 && fstat(l->lock_fd, &mine) == 0)
			unlink_if_ours(l, l->lock_name, &mine);
		close(l->lock_fd); /* the lock goes with its last descriptor */
		l->lock_fd = -1;
	}
	if (l->dir_fd >= 0) {
		close(l->dir_fd);
		l->dir_fd = -1;
	}
}
