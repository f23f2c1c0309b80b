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
#include <grp.h>
#include <limits.h>
#include <pwd.h>
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

/* Whether uid may replace (rename away, unlink) the entry `child` of directory dir: as
 * dir's owner, or through group/other write on dir unless the sticky bit limits that to
 * the entry's owner. Root and we are trusted; anyone else who can is a way to redirect the
 * socket path. */
static bool others_can_replace(const struct stat *dir, const struct stat *child, uid_t me)
{
	if (dir->st_uid != 0 && dir->st_uid != me)
		return true;
	if (!(dir->st_mode & 022))
		return false;
	return !(dir->st_mode & S_ISVTX) || (child->st_uid != 0 && child->st_uid != me);
}

/* Whether uid may search (traverse) the directory by its mode bits. */
static bool may_search(const struct stat *dir, uid_t uid)
{
	if (uid == 0 || dir->st_uid == uid)
		return uid == 0 || (dir->st_mode & S_IXUSR);
	if (dir->st_mode & S_IXOTH)
		return true;
	if (!(dir->st_mode & S_IXGRP))
		return false;
	struct passwd pw, *found = NULL;
	char buf[1024];
	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) != 0 || !found)
		return false;
	gid_t groups[64];
	int n = 64;
	if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &n) < 0)
		n = 0;
	for (int i = 0; i < n; i++)
		if (groups[i] == dir->st_gid)
			return true;
	return pw.pw_gid == dir->st_gid;
}

/* --allow-uid names uids that are to connect: say at start, once per uid, which directory
 * on the socket's path keeps one out (its clients would only see "Permission denied"). */
static void warn_unsearchable(const struct listener *l, const char *dir, const struct stat *st,
                              const struct listener_peers *peers, uint64_t *warned)
{
	for (uint32_t i = 0; i < peers->n_uids && i < 64; i++) {
		if ((*warned >> i) & 1 || may_search(st, peers->uids[i]))
			continue;
		*warned |= 1ull << i;
		log_warn("server",
		         "--allow-uid %u cannot reach the socket %s: directory %s has mode %o "
		         "(owner uid %u, group %u), which does not let that uid search it; its "
		         "clients will get \"Permission denied\" (chmod o+x, or an ACL, fixes it)",
		         (unsigned)peers->uids[i], l->path, dir, (unsigned)(st->st_mode & 07777),
		         (unsigned)st->st_uid, (unsigned)st->st_gid);
	}
}

static const char *mode_words(const struct stat *st)
{
	return !(st->st_mode & 022)      ? "writable only by its owner"
	       : (st->st_mode & S_ISVTX) ? "sticky"
	       : (st->st_mode & 002)     ? "writable by everyone"
	                                 : "writable by its group";
}

/* Opens the socket's directory by walking its path from "/" one component at a time,
 * each opened O_NOFOLLOW relative to the one before, so every check below is on the
 * directory the next step goes through. Refused, naming the component: a symbolic link
 * anywhere on the way (a link in a shared directory can lead anywhere), "..", a
 * directory owned by another uid, and an entry another uid can rename away — the attack
 * this prevents: uid X owns a directory on the path, lets root make the socket directory
 * in it, renames that away and binds its own socket at the path; root's clients then talk
 * to X. The last component is created (mode 0700, or 0711 when shared) if it is missing;
 * an existing one must be ours or root's and not writable by others unless sticky (the
 * socket and lock files in it are ours, so sticky protects them). A relative path is
 * walked from the working directory's real path (getcwd resolves no links). */
static int open_dir(struct listener *l, const struct listener_peers *peers,
                    struct sidecar_error *err)
{
	const mode_t mode = peers->shared ? 0711 : 0700;
	uint64_t warned = 0; /* bit i: peers->uids[i] was named already */
	const uid_t me = geteuid();
	char full[PATH_MAX];
	if (l->dir[0] == '/') {
		snprintf(full, sizeof(full), "%s", l->dir);
	} else {
		char cwd[PATH_MAX];
		if (!getcwd(cwd, sizeof(cwd)))
			return error_set(err, MOE_ESYS, "socket path %s: getcwd: %s", l->path,
			                 strerror(errno));
		if ((size_t)snprintf(full, sizeof(full), "%s/%s", cwd, l->dir) >= sizeof(full))
			return error_set(err, MOE_EINVAL, "socket path %s: too long", l->path);
	}
	int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct stat cur;
	if (fd < 0 || fstat(fd, &cur) != 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return error_set(err, MOE_ESYS, "socket path %s: /: %s", l->path, strerror(e));
	}
	warn_unsearchable(l, "/", &cur, peers, &warned);
	/* The components, "" and "." dropped. ".." is refused: the clients resolve the same
	 * path themselves, and "x/.." leads wherever x does once someone replaces x. */
	char *parts[PATH_MAX / 2];
	size_t n_parts = 0;
	char *save = NULL;
	for (char *c = strtok_r(full, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
		if (!strcmp(c, "..")) {
			close(fd);
			return error_set(err, MOE_EINVAL,
			                 "socket path %s: '..' in the path; name the socket's "
			                 "directory without it",
			                 l->path);
		}
		if (strcmp(c, "."))
			parts[n_parts++] = c;
	}
	char walked[PATH_MAX] = ""; /* the prefix opened so far, for messages */
	bool created = false;
	for (size_t i = 0; i < n_parts; i++) {
		const char *c = parts[i];
		const bool last = i + 1 == n_parts;
		const size_t wl = strlen(walked);
		snprintf(walked + wl, sizeof(walked) - wl, "/%s", c);
		if (last && mkdirat(fd, c, mode) == 0)
			created = true;
		else if (last && errno != EEXIST) {
			int e = errno;
			close(fd);
			return error_set(err, MOE_ESYS, "socket directory %s: mkdir: %s", l->dir,
			                 strerror(e));
		}
		int next = openat(fd, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0) {
			int e = errno;
			struct stat lst;
			char target[256] = "";
			if ((e == ELOOP || e == ENOTDIR) &&
			    fstatat(fd, c, &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
			    S_ISLNK(lst.st_mode)) {
				ssize_t n = readlinkat(fd, c, target, sizeof(target) - 1);
				target[n > 0 ? n : 0] = '\0';
				close(fd);
				return error_set(
				    err, MOE_EINVAL,
				    "socket path %s: %s is a symbolic link; refusing it "
				    "(it leads to %s, and a link in a shared directory can "
				    "lead anywhere): name the real directory",
				    l->path, walked, target);
			}
			close(fd);
			if (e == ENOTDIR)
				return error_set(err, MOE_EINVAL,
				                 "socket path %s: %s is not a directory", l->path,
				                 walked);
			return error_set(err, MOE_ESYS, "socket path %s: %s: %s", l->path, walked,
			                 strerror(e));
		}
		struct stat st;
		if (last && created && fchmod(next, mode) != 0) { /* mkdir's mode met the umask */
			int e = errno;
			close(fd);
			close(next);
			return error_set(err, MOE_ESYS, "socket directory %s: chmod %o: %s", l->dir,
			                 (unsigned)mode, strerror(e));
		}
		if (fstat(next, &st) != 0) {
			int e = errno;
			close(fd);
			close(next);
			return error_set(err, MOE_ESYS, "socket path %s: %s: fstat: %s", l->path,
			                 walked, strerror(e));
		}
		if (others_can_replace(&cur, &st, me)) {
			char parent[PATH_MAX];
			snprintf(parent, sizeof(parent), "%.*s", (int)wl, walked);
			close(fd);
			close(next);
			return error_set(
			    err, MOE_EINVAL,
			    "socket path %s: %s can be renamed away by another user: "
			    "its directory %s is owned by uid %u, mode %o (%s), and it "
			    "is owned by uid %u; a socket path must lead through "
			    "directories only root or uid %u can change",
			    l->path, walked, wl ? parent : "/", (unsigned)cur.st_uid,
			    (unsigned)(cur.st_mode & 07777), mode_words(&cur), (unsigned)st.st_uid,
			    (unsigned)me);
		}
		close(fd);
		fd = next;
		cur = st;
		warn_unsearchable(l, walked, &cur, peers, &warned);
	}
	l->dir_fd = fd;
	if (cur.st_uid != me && cur.st_uid != 0)
		return error_set(err, MOE_EINVAL,
		                 "socket directory %s: owned by uid %u, not by us (%u) or root",
		                 l->dir, (unsigned)cur.st_uid, (unsigned)me);
	if (!created && (cur.st_mode & 022) && !(cur.st_mode & S_ISVTX))
		return error_set(err, MOE_EINVAL,
		                 "socket directory %s: mode %o lets others replace the socket",
		                 l->dir, (unsigned)(cur.st_mode & 07777));
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

int listener_open(struct listener *l, const char *path, const struct listener_peers *peers,
                  struct sidecar_error *err)
{
	memset(l, 0, sizeof(*l));
	l->dir_fd = l->lock_fd = l->sock_fd = -1;
	if (strlen(path) >= sizeof(l->path))
		return error_set(err, MOE_EINVAL,
		                 "socket path is %zu bytes; at most %zu fit in sun_path",
		                 strlen(path), sizeof(l->path) - 1);
	snprintf(l->path, sizeof(l->path), "%s", path);
	if (split_path(l, err) != 0 || open_dir(l, peers, err) != 0 || take_lock(l, err) != 0 ||
	    remove_stale_socket(l, err) != 0)
		return -1;
	return bind_socket(l, peers->shared, err);
}

void listener_adopt(struct listener *l, int fd, const char *path)
{
	memset(l, 0, sizeof(*l));
	l->dir_fd = l->lock_fd = -1;
	l->sock_fd = fd;
	l->adopted = true;
	snprintf(l->path, sizeof(l->path), "%s", path);
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
