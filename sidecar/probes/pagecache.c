/* pagecache.c — the loader of the page-cache probes (see pagecache.h for the API).
 *
 * Owns one instance's pins under /sys/fs/bpf/moe-sidecar/<instance>/:
 *   counters      (dev, ino) → struct pagecache_counters, one entry per watched file
 *   pid_counters  (dev, ino, tgid) → struct pagecache_counters, filled only with per_pid
 *   info          the owner's pid and start time
 *   links/<prog>  one BPF link per attached tracepoint program
 * The instance directory is flock()ed for the owner's lifetime: a live owner holds the lock,
 * a crashed one released it with its last fd, so its pins are stale and can be replaced. The
 * pinned links keep the programs attached after a crash until the next owner (or an operator
 * with rm) removes them.
 *
 * Probes are best effort: any failure to set them up leaves the handle "unavailable" with the
 * reason, and every call keeps working, so a sidecar without privileges still serves. Where the
 * build lacked clang/bpftool/BTF (MOE_PROBES_DISABLED_REASON), only that path is compiled.
 */
#include "pagecache.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "caps.h"
#include "log.h"

#ifdef MOE_PROBES_ENABLED
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "pagecache.skel.h"
#endif

static_assert(sizeof(struct pagecache_file_key) == 16, "file key layout is shared with BPF");
static_assert(sizeof(struct pagecache_pid_key) == 24, "pid key layout is shared with BPF");
static_assert(sizeof(struct pagecache_counters) == 14 * 8, "counters are 14 u64, append only");
static_assert(sizeof(struct pagecache_instance_info) == 32, "info layout is shared with BPF");

#define BPFFS_ROOT "/sys/fs/bpf"
#define PIN_ROOT BPFFS_ROOT "/moe-sidecar"
#define TRACEFS_ROOT "/sys/kernel/tracing"
#define BPF_FS_MAGIC_NUMBER 0xcafe4a11
#define TRACEFS_MAGIC_NUMBER 0x74726163
#define INSTANCE_NAME_MAX 64
#define MAX_PROGRAMS 32
#define PIN_PATH_MAX 256 /* pin_dir + "/links/" + a program name */

struct watched_file {
	char *path;
	struct pagecache_file_key key;
};

struct pagecache_probes {
	bool available;
	bool per_pid;
	bool quiet;
	int replaced_stale_pid;
	int busy_owner;    /* pagecache_busy_owner() */
	int stale_grace_s; /* < 0: never sweep */
	__u64 page_size;
	char instance[INSTANCE_NAME_MAX + 1];
	char pin_dir[128];                                          /* PIN_ROOT/<instance> */
	char status[sizeof(((struct sidecar_error *)0)->msg) + 32]; /* "unavailable: " + error */
	struct sidecar_error error; /* the last failure on this handle: pagecache_last_error */

	struct watched_file *files;
	size_t n_files;

#ifdef MOE_PROBES_ENABLED
	int lock_fd; /* the instance directory, flock(LOCK_EX) while we own it; -1 if not */
	bool pinned; /* pins exist and are ours to remove */
	struct pagecache_bpf *skel;
	struct bpf_link *links[MAX_PROGRAMS];
	const char *link_names[MAX_PROGRAMS];
	size_t n_links;
#endif
	int counters_fd, pid_counters_fd; /* -1 unless available */
};

/* Records the failure on the handle (status from the errno) and returns -errno, the loader
 * API's convention. */
__attribute__((format(printf, 3, 4))) static int fail(struct pagecache_probes *p, int err,
                                                      const char *fmt, ...)
{
	const int e = err < 0 ? -err : err;
	p->error.status = error_status_from_errno(e);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p->error.msg, sizeof(p->error.msg), fmt, ap);
	va_end(ap);
	return -e;
}

static bool instance_name_valid(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n > INSTANCE_NAME_MAX || !strcmp(name, ".") || !strcmp(name, ".."))
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-' || c == '.'))
			return false;
	}
	return true;
}

/* pagecache_file_key_of's work, answering a status: 0, -errno of stat, or -EINVAL when path
 * is not a regular file (pagecache_watch keeps the errno for its own caller). */
static int file_key(const char *path, struct pagecache_file_key *key)
{
	struct stat st;
	if (stat(path, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	memset(key, 0, sizeof(*key));
	key->ino = st.st_ino;
	/* The kernel's dev_t is major << 20 | minor (MINORBITS = 20); glibc's differs. */
	key->dev = (__u32)((major(st.st_dev) << 20) | (minor(st.st_dev) & 0xfffff));
	return 0;
}

int pagecache_file_key_of(const char *path, struct pagecache_file_key *key,
                          struct sidecar_error *err)
{
	const int rc = file_key(path, key);
	if (rc == -EINVAL)
		return error_set(err, MOE_EINVAL, "%s: not a regular file", path);
	if (rc < 0) {
		errno = -rc;
		return error_set_errno(err, "%s", path);
	}
	return 0;
}

void pagecache_stats_derive(struct pagecache_stats *s, __u64 page_size)
{
	s->fault_bytes = s->raw.fault_events * page_size;
	double through_cache = (double)s->raw.buffered_bytes + (double)s->fault_bytes;
	double direct = (double)s->raw.direct_bytes;
	s->bypass_ratio = direct + through_cache > 0 ? direct / (direct + through_cache) : NAN;
}

/* cachestat(2) is syscall 451 on every architecture; glibc 2.36 has no wrapper. */
struct cachestat_range_abi {
	__u64 off;
	__u64 len;
};
struct cachestat_abi {
	__u64 nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

int pagecache_residency_of(const char *path, struct pagecache_residency *out,
                           struct sidecar_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return error_set_errno(err, "%s", path);
	struct cachestat_range_abi range = {0, 0}; /* len 0: to the end of the file */
	struct cachestat_abi cs = {0};
	long rc = syscall(451, fd, &range, &cs, 0);
	int e = errno;
	close(fd);
	if (rc < 0)
		return error_set(err, MOE_ESYS, "%s: cachestat: %s%s", path, strerror(e),
		                 e == ENOSYS ? PAGECACHE_NO_CACHESTAT : "");
	__u64 page = (__u64)sysconf(_SC_PAGESIZE);
	out->cached_bytes = cs.nr_cache * page;
	out->dirty_bytes = cs.nr_dirty * page;
	out->writeback_bytes = cs.nr_writeback * page;
	out->evicted_bytes = cs.nr_evicted * page;
	out->recently_evicted_bytes = cs.nr_recently_evicted * page;
	return 0;
}

static struct watched_file *find_watched(struct pagecache_probes *p, const char *path)
{
	for (size_t i = 0; i < p->n_files; i++)
		if (!strcmp(p->files[i].path, path))
			return &p->files[i];
	return NULL;
}

static bool key_watched_elsewhere(const struct pagecache_probes *p,
                                  const struct pagecache_file_key *key,
                                  const struct watched_file *except)
{
	for (size_t i = 0; i < p->n_files; i++)
		if (&p->files[i] != except && p->files[i].key.ino == key->ino &&
		    p->files[i].key.dev == key->dev)
			return true;
	return false;
}

/* 1 when a filesystem with `magic` is mounted at dir, 0 when another one is, -errno when
 * dir cannot be looked at. */
static int mounted_at(const char *dir, long magic)
{
	struct statfs fs;
	if (statfs(dir, &fs) < 0)
		return -errno;
	return (long)fs.f_type == magic;
}

/* ---------------------------------------------------------------------------------------- */
#ifdef MOE_PROBES_ENABLED

/* libbpf's own messages: kept at debug level, the last warning remembered for the reason. */
static char libbpf_last_warning[256];

static int libbpf_to_log(enum libbpf_print_level level, const char *fmt, va_list args)
{
	char line[512];
	vsnprintf(line, sizeof(line), fmt, args);
	size_t n = strlen(line);
	while (n && (line[n - 1] == '\n' || line[n - 1] == ' '))
		line[--n] = '\0';
	if (level == LIBBPF_WARN)
		snprintf(libbpf_last_warning, sizeof(libbpf_last_warning), "%.255s", line);
	if (level != LIBBPF_DEBUG)
		log_debug("probes", "libbpf: %s", line);
	return 0;
}

/* What a refused BPF call needs: CAP_SYS_ADMIN is not among it (mounting is mount_hint's). */
static const char *privilege_hint(int err)
{
	return (err == EPERM || err == EACCES)
	           ? " (needs root, or CAP_BPF + CAP_PERFMON; CAP_SYS_ADMIN only to mount bpffs "
	             "or tracefs where they are not mounted)"
	           : "";
}

static const char *mount_hint(int err)
{
	return (err == EPERM || err == EACCES) ? " (mounting needs root or CAP_SYS_ADMIN)" : "";
}

/* Mounts fstype at dir unless it is mounted there already. */
static int ensure_mounted(struct pagecache_probes *p, const char *dir, const char *fstype,
                          long magic)
{
	const int m = mounted_at(dir, magic);
	if (m < 0)
		return fail(p, -m, "%s: %s", dir, strerror(-m));
	if (m == 1)
		return 0;
	if (mount(fstype, dir, fstype, 0, "mode=0700") < 0) {
		int e = errno;
		return fail(p, e, "%s is not mounted and mounting it failed: %s%s", dir,
		            strerror(e), mount_hint(e));
	}
	log_info("probes", "mounted %s at %s", fstype, dir);
	return 0;
}

/* Creates dir (0700) or accepts an existing one only if it is a real directory of ours that
 * nobody else can write: bpffs may be world-writable, and pins must not land where another
 * user chose (a symlink, a directory they own). */
static int make_dir(struct pagecache_probes *p, const char *dir)
{
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		int e = errno;
		return fail(p, e, "mkdir %s: %s%s", dir, strerror(e), privilege_hint(e));
	}
	struct stat st;
	if (lstat(dir, &st) < 0)
		return fail(p, errno, "%s: %s", dir, strerror(errno));
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022))
		return fail(p, EPERM,
		            "refusing %s: not a directory owned by uid %u and writable only by it "
		            "(uid %u, mode %03o); remove it",
		            dir, (unsigned)geteuid(), (unsigned)st.st_uid, st.st_mode & 0777);
	return 0;
}

/* What /proc/<pid>/stat says of a process: field 3 (state), 9 (flags), 22 (starttime). */
struct proc_stat {
	char state;
	unsigned long flags;
	__u64 start_ticks;
};

/* 0, or -1 if the process does not exist (or its stat cannot be read). */
static int read_proc_stat(pid_t pid, struct proc_stat *out)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	char *s = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
	if (!s || s[1] != ' ' || !s[2])
		return -1;
	memset(out, 0, sizeof(*out));
	out->state = s[2];
	s++;
	for (int field = 3; field < 22 && s; field++) { /* s: the space before field */
		if (field == 9)
			out->flags = strtoul(s + 1, NULL, 10);
		s = strchr(s + 1, ' ');
	}
	out->start_ticks = s ? strtoull(s + 1, NULL, 10) : 0;
	return 0;
}

static __u64 process_start_ticks(pid_t pid)
{
	struct proc_stat st;
	return read_proc_stat(pid, &st) == 0 ? st.start_ticks : 0;
}

#define PF_EXITING 0x00000004u /* include/linux/sched.h: the task is in do_exit() */

/* Is the recorded owner of an instance still running? Not if its pid is gone or reused (other
 * start time), nor if it is a zombie (Z), dead (X) or exiting: a sidecar killed with -9 stays
 * a zombie until its parent reaps it, with its start time unchanged, and its files (so its
 * flock) are released before that. Its successor must be able to take the instance back. */
static bool owner_alive(const struct pagecache_instance_info *info)
{
	struct proc_stat st;
	if (!info->owner_start_ticks || read_proc_stat((pid_t)info->owner_pid, &st) != 0)
		return false;
	if (st.start_ticks != info->owner_start_ticks)
		return false;
	return st.state != 'Z' && st.state != 'X' && st.state != 'x' && !(st.flags & PF_EXITING);
}

/* The recorded owner still exists but is on its way out (see owner_alive). */
static bool owner_exiting(const struct pagecache_instance_info *info)
{
	struct proc_stat st;
	return info->owner_start_ticks && read_proc_stat((pid_t)info->owner_pid, &st) == 0 &&
	       st.start_ticks == info->owner_start_ticks && !owner_alive(info);
}

/* An exiting process holds its files, so its flock, until late in its exit: after its memory
 * is unmapped, which for a sidecar with a large slot pool takes seconds. Waits for the owner
 * to finish exiting (its pidfd becomes readable once it has released its files), at most
 * PAGECACHE_EXITING_OWNER_WAIT_MS. 0 if it is gone now, -1 if it is still there. */
static int wait_for_exiting_owner(const struct pagecache_probes *p,
                                  const struct pagecache_instance_info *info)
{
	int fd = (int)syscall(SYS_pidfd_open, (pid_t)info->owner_pid, 0);
	if (fd < 0)
		return errno == ESRCH ? 0 : -1;
	/* The pidfd pins the pid: if it still names the owner, it names it until it is read. */
	if (!owner_exiting(info)) {
		close(fd);
		return 0;
	}
	log_info("probes",
	         "instance '%s' is held by pid %u, which is exiting: waiting for it to let go "
	         "(at most %d s)",
	         p->instance, info->owner_pid, PAGECACHE_EXITING_OWNER_WAIT_MS / 1000);
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	int rc;
	do
		rc = poll(&pfd, 1, PAGECACHE_EXITING_OWNER_WAIT_MS);
	while (rc < 0 && errno == EINTR);
	close(fd);
	return rc > 0 ? 0 : -1;
}

static bool read_pinned_info(const char *pin_dir, struct pagecache_instance_info *info)
{
	char path[PIN_PATH_MAX];
	snprintf(path, sizeof(path), "%s/info", pin_dir);
	int fd = bpf_obj_get(path);
	if (fd < 0)
		return false;
	__u32 zero = 0;
	bool ok = bpf_map_lookup_elem(fd, &zero, info) == 0 && info->magic == PAGECACHE_INFO_MAGIC;
	close(fd);
	return ok;
}

/* Removes every pin below dir (one level of subdirectories: links/). */
static int remove_pins(struct pagecache_probes *p, const char *dir, int depth)
{
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : fail(p, errno, "%s: %s", dir, strerror(errno));
	int rc = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		char path[PIN_PATH_MAX];
		if (snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) >= (int)sizeof(path))
			continue;
		if (de->d_type == DT_DIR && depth == 0) {
			rc = remove_pins(p, path, 1);
			if (rc == 0 && rmdir(path) < 0)
				rc = fail(p, errno, "rmdir %s: %s", path, strerror(errno));
		} else if (unlink(path) < 0) {
			rc = fail(p, errno, "unlink %s: %s", path, strerror(errno));
		}
		if (rc)
			break;
	}
	closedir(d);
	return rc;
}

/* Takes the instance directory for us: creates it, locks it, replaces stale pins. */
static int claim_instance(struct pagecache_probes *p)
{
	int rc = make_dir(p, PIN_ROOT);
	if (rc == 0)
		rc = make_dir(p, p->pin_dir);
	if (rc)
		return rc;
	p->lock_fd = open(p->pin_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (p->lock_fd < 0)
		return fail(p, errno, "%s: %s", p->pin_dir, strerror(errno));
	struct pagecache_instance_info info;
	bool has_info = read_pinned_info(p->pin_dir, &info);
	int e = flock(p->lock_fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
	if (e == EWOULDBLOCK && has_info && owner_exiting(&info) &&
	    wait_for_exiting_owner(p, &info) == 0)
		e = flock(p->lock_fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
	if (e) {
		close(p->lock_fd);
		p->lock_fd = -1;
		if (e == EWOULDBLOCK)
			p->busy_owner = has_info ? (int)info.owner_pid : -1;
		if (e == EWOULDBLOCK && has_info)
			return fail(p, EBUSY, "instance '%s' is in use by pid %u (%s)", p->instance,
			            info.owner_pid, p->pin_dir);
		if (e == EWOULDBLOCK)
			return fail(p, EBUSY, "instance '%s' is in use (%s is locked)", p->instance,
			            p->pin_dir);
		return fail(p, e, "flock %s: %s", p->pin_dir, strerror(e));
	}
	struct stat st;
	if (fstat(p->lock_fd, &st) < 0)
		return fail(p, errno, "%s: %s", p->pin_dir, strerror(errno));
	if (st.st_nlink == 0)
		return fail(p, EAGAIN, "%s was removed while opening (a concurrent close); retry",
		            p->pin_dir);
	/* A live owner that somehow lost its lock still owns the pins. */
	if (has_info && info.owner_pid != (__u32)getpid() && owner_alive(&info)) {
		p->busy_owner = (int)info.owner_pid;
		return fail(p, EBUSY, "instance '%s' is in use by live pid %u (%s)", p->instance,
		            info.owner_pid, p->pin_dir);
	}

	DIR *d = opendir(p->pin_dir);
	if (!d)
		return fail(p, errno, "%s: %s", p->pin_dir, strerror(errno));
	bool empty = true;
	for (struct dirent *de; (de = readdir(d));)
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = false;
	closedir(d);
	if (!empty) {
		p->replaced_stale_pid = has_info ? (int)info.owner_pid : -1;
		rc = remove_pins(p, p->pin_dir, 0);
		if (rc)
			return rc;
		if (has_info)
			log_info("probes", "replaced stale pins of instance '%s' (dead pid %u)",
			         p->instance, info.owner_pid);
		else
			log_info("probes", "replaced stale pins of instance '%s' (owner unknown)",
			         p->instance);
	}
	return 0;
}

/* Removes the pin directories of other instances whose owner is dead (their lock is free and
 * the recorded owner is not alive, or nothing is recorded) and that have not changed for
 * stale_grace_s seconds. Unlinking a pinned link detaches its program: a crashed sidecar's
 * probes stop counting here, not at the next start of that very instance name. Best effort:
 * a directory that cannot be removed is logged and left. */
static void sweep_stale_instances(struct pagecache_probes *p)
{
	if (p->stale_grace_s < 0)
		return;
	DIR *d = opendir(PIN_ROOT);
	if (!d)
		return;
	const time_t now = time(NULL);
	const struct sidecar_error saved_error = p->error;
	for (struct dirent *de; (de = readdir(d));) {
		if (de->d_type != DT_DIR || !instance_name_valid(de->d_name) ||
		    !strcmp(de->d_name, p->instance))
			continue;
		char dir[sizeof(((struct pagecache_probes *)0)->pin_dir)];
		if (snprintf(dir, sizeof(dir), "%s/%s", PIN_ROOT, de->d_name) >= (int)sizeof(dir))
			continue;
		int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			continue;
		struct stat st;
		if (fstat(fd, &st) != 0 || now - st.st_mtime < (time_t)p->stale_grace_s ||
		    flock(fd, LOCK_EX | LOCK_NB) != 0) { /* recent, or its owner holds the lock */
			close(fd);
			continue;
		}
		struct pagecache_instance_info info;
		const bool has_info = read_pinned_info(dir, &info);
		if (has_info && owner_alive(&info)) {
			close(fd); /* alive, without its lock: not ours to judge */
			continue;
		}
		if (remove_pins(p, dir, 0) == 0 && rmdir(dir) == 0) {
			if (has_info)
				log_info(
				    "probes",
				    "removed stale pins of instance '%s' (owner pid %u is gone)",
				    de->d_name, info.owner_pid);
			else
				log_info("probes", "removed stale pins of instance '%s' (no owner)",
				         de->d_name);
		} else {
			log_warn("probes", "stale instance '%s' left in place: %s", de->d_name,
			         p->error.msg[0] ? p->error.msg : strerror(errno));
		}
		close(fd);
	}
	closedir(d);
	p->error = saved_error;
}

/* Is the tracepoint behind prog present on this kernel? name gets its short name. */
static bool tracepoint_present(const struct bpf_program *prog, const char **name)
{
	const char *sec = bpf_program__section_name(prog);
	if (!strncmp(sec, "tp_btf/", 7)) {
		*name = sec + 7;
		return libbpf_find_vmlinux_btf_id(*name, BPF_TRACE_RAW_TP) > 0;
	}
	if (!strncmp(sec, "tracepoint/", 11)) {
		const char *event = sec + 11; /* "category/name" */
		const char *slash = strchr(event, '/');
		*name = slash ? slash + 1 : event;
		char path[PIN_PATH_MAX];
		snprintf(path, sizeof(path), TRACEFS_ROOT "/events/%s/id", event);
		if (access(path, F_OK) == 0)
			return true;
		snprintf(path, sizeof(path), "/sys/kernel/debug/tracing/events/%s/id", event);
		return access(path, F_OK) == 0;
	}
	*name = sec;
	return true;
}

static int pin_object(struct pagecache_probes *p, const char *path, bool is_link, void *obj)
{
	int err = is_link ? bpf_link__pin(obj, path) : bpf_map__pin(obj, path);
	if (err)
		return fail(p, err, "pin %s: %s", path, strerror(-err));
	if (chmod(path, 0600) < 0)
		return fail(p, errno, "chmod 0600 %s: %s", path, strerror(errno));
	return 0;
}

static int load_and_pin(struct pagecache_probes *p, char *missing, size_t missing_len)
{
	p->skel = pagecache_bpf__open();
	if (!p->skel)
		return fail(p, errno, "opening the BPF object: %s", strerror(errno));
	p->skel->rodata->per_pid_enabled = p->per_pid;
	p->skel->rodata->page_size = p->page_size;

	struct bpf_program *prog;
	missing[0] = '\0';
	bpf_object__for_each_program(prog, p->skel->obj)
	{
		const char *name;
		if (tracepoint_present(prog, &name))
			continue;
		if (prog == p->skel->progs.page_cache_fill)
			return fail(p, ENOENT,
			            "tracepoint filemap:mm_filemap_add_to_page_cache is absent");
		bpf_program__set_autoload(prog, false);
		size_t n = strlen(missing);
		if (!strstr(missing, name))
			snprintf(missing + n, missing_len - n, "%s%s", n ? ", " : "", name);
	}

	libbpf_last_warning[0] = '\0';
	int err = pagecache_bpf__load(p->skel);
	if (err) {
		int e = -err;
		return fail(p, e, "loading the BPF programs failed: %s%s%s%s", strerror(e),
		            privilege_hint(e), libbpf_last_warning[0] ? "; libbpf: " : "",
		            libbpf_last_warning);
	}
	p->counters_fd = bpf_map__fd(p->skel->maps.counters);
	p->pid_counters_fd = bpf_map__fd(p->skel->maps.pid_counters);

	struct pagecache_instance_info info = {
	    .magic = PAGECACHE_INFO_MAGIC,
	    .version = PAGECACHE_INFO_VERSION,
	    .owner_pid = (__u32)getpid(),
	    .per_pid = p->per_pid,
	    .owner_start_ticks = process_start_ticks(getpid()),
	    .page_size = p->page_size,
	};
	__u32 zero = 0;
	if (bpf_map_update_elem(bpf_map__fd(p->skel->maps.info), &zero, &info, BPF_ANY) < 0)
		return fail(p, errno, "writing the info map: %s", strerror(errno));

	bpf_object__for_each_program(prog, p->skel->obj)
	{
		if (!bpf_program__autoload(prog))
			continue;
		if (p->n_links == MAX_PROGRAMS)
			return fail(p, E2BIG, "more than %d BPF programs", MAX_PROGRAMS);
		struct bpf_link *link = bpf_program__attach(prog);
		if (!link) {
			int e = errno;
			return fail(p, e, "attaching %s: %s%s", bpf_program__section_name(prog),
			            strerror(e), privilege_hint(e));
		}
		p->links[p->n_links] = link;
		p->link_names[p->n_links++] = bpf_program__name(prog);
	}

	/* From here on, whatever is pinned is ours to remove. */
	p->pinned = true;
	struct {
		const char *name;
		struct bpf_map *map;
	} maps[] = {{"counters", p->skel->maps.counters},
	            {"pid_counters", p->skel->maps.pid_counters},
	            {"info", p->skel->maps.info}};
	char path[PIN_PATH_MAX];
	for (size_t i = 0; i < sizeof(maps) / sizeof(maps[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", p->pin_dir, maps[i].name);
		if ((err = pin_object(p, path, false, maps[i].map)))
			return err;
	}
	snprintf(path, sizeof(path), "%s/links", p->pin_dir);
	if ((err = make_dir(p, path)))
		return err;
	for (size_t i = 0; i < p->n_links; i++) {
		snprintf(path, sizeof(path), "%s/links/%s", p->pin_dir, p->link_names[i]);
		if ((err = pin_object(p, path, true, p->links[i])))
			return err;
	}
	return 0;
}

/* Undoes attach(): detaches, unpins, unlocks. Safe on a partly attached handle. */
static void detach(struct pagecache_probes *p)
{
	for (size_t i = 0; i < p->n_links; i++)
		bpf_link__destroy(p->links[i]);
	p->n_links = 0;
	if (p->pinned) {
		/* Unlinking the pins drops the last references: programs detach, maps go. */
		if (remove_pins(p, p->pin_dir, 0) == 0 && rmdir(p->pin_dir) < 0 && errno != ENOENT)
			log_warn("probes", "rmdir %s: %s", p->pin_dir, strerror(errno));
		rmdir(PIN_ROOT); /* shared by instances: only when it became empty */
		p->pinned = false;
	} else if (p->lock_fd >= 0) {
		rmdir(p->pin_dir); /* created by us, never populated */
	}
	if (p->lock_fd >= 0) {
		close(p->lock_fd);
		p->lock_fd = -1;
	}
	pagecache_bpf__destroy(p->skel);
	p->skel = NULL;
	p->counters_fd = p->pid_counters_fd = -1;
}

/* 0 when this process may load a tracepoint program (a two-instruction one, loaded and
 * closed), else -errno: the privilege the probes need, checked before anything is mounted. */
static int bpf_may_load(void)
{
	const struct bpf_insn return_zero[] = {
	    {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = 0},
	    {.code = BPF_JMP | BPF_EXIT},
	};
	int probe_fd =
	    bpf_prog_load(BPF_PROG_TYPE_TRACEPOINT, "moe_probe_check", "GPL", return_zero, 2, NULL);
	if (probe_fd < 0)
		return probe_fd;
	close(probe_fd);
	return 0;
}

static int attach(struct pagecache_probes *p)
{
	libbpf_set_print(libbpf_to_log);
	/* Privilege first: an unprivileged caller must not mount or create anything. */
	const int may = bpf_may_load();
	if (may < 0)
		return fail(p, -may, "cannot load BPF programs: %s%s", strerror(-may),
		            privilege_hint(-may));
	int rc = ensure_mounted(p, BPFFS_ROOT, "bpf", BPF_FS_MAGIC_NUMBER);
	if (rc == 0)
		rc = ensure_mounted(p, TRACEFS_ROOT, "tracefs", TRACEFS_MAGIC_NUMBER);
	if (rc == 0)
		rc = claim_instance(p);
	if (rc == 0)
		sweep_stale_instances(p);
	char missing[256];
	if (rc == 0)
		rc = load_and_pin(p, missing, sizeof(missing));
	if (rc) {
		const struct sidecar_error reason = p->error;
		detach(p);
		p->error = reason;
		return rc;
	}
	snprintf(p->status, sizeof(p->status), "active: %s%s%s%s", p->pin_dir,
	         missing[0] ? " (tracepoints absent on this kernel: " : "", missing,
	         missing[0] ? ")" : "");
	if (missing[0])
		log_warn("probes", "tracepoints absent on this kernel, their counters stay 0: %s",
		         missing);
	return 0;
}

static int map_insert_zero(struct pagecache_probes *p, const struct pagecache_file_key *key,
                           const char *path)
{
	struct pagecache_counters zero = {0};
	if (bpf_map_update_elem(p->counters_fd, key, &zero, BPF_NOEXIST) == 0 || errno == EEXIST)
		return 0;
	if (errno == E2BIG)
		return fail(p, ENOSPC, "%s: cannot watch more than %d files", path,
		            PAGECACHE_MAX_FILES);
	return fail(p, errno, "%s: adding to the watch map: %s", path, strerror(errno));
}

static void map_forget(struct pagecache_probes *p, const struct pagecache_file_key *key)
{
	bpf_map_delete_elem(p->counters_fd, key);
	/* Per-pid entries of that file: collect first, deleting while iterating restarts it. */
	struct pagecache_pid_key cur, next, doomed[256];
	size_t n_doomed;
	do {
		n_doomed = 0;
		void *prev = NULL;
		while (n_doomed < 256 &&
		       bpf_map_get_next_key(p->pid_counters_fd, prev, &next) == 0) {
			if (next.file.ino == key->ino && next.file.dev == key->dev)
				doomed[n_doomed++] = next;
			cur = next;
			prev = &cur;
		}
		for (size_t i = 0; i < n_doomed; i++)
			bpf_map_delete_elem(p->pid_counters_fd, &doomed[i]);
	} while (n_doomed == 256);
}

static int map_read(int fd, const void *key, struct pagecache_counters *out)
{
	if (bpf_map_lookup_elem(fd, key, out) < 0)
		return -errno;
	return 0;
}

static void counters_add(struct pagecache_counters *sum, const struct pagecache_counters *c)
{
	__u64 *to = (__u64 *)sum;
	const __u64 *from = (const __u64 *)c;
	for (size_t i = 0; i < sizeof(*c) / sizeof(__u64); i++)
		to[i] += from[i];
}

static int map_sum(struct pagecache_probes *p, struct pagecache_counters *sum)
{
	struct pagecache_file_key cur, next;
	void *prev = NULL;
	while (bpf_map_get_next_key(p->counters_fd, prev, &next) == 0) {
		struct pagecache_counters c;
		if (bpf_map_lookup_elem(p->counters_fd, &next, &c) == 0)
			counters_add(sum, &c);
		cur = next;
		prev = &cur;
	}
	return 0;
}

static size_t map_list_pids(struct pagecache_probes *p, const struct pagecache_file_key *key,
                            __u32 *tgids, size_t max)
{
	struct pagecache_pid_key cur, next;
	void *prev = NULL;
	size_t n = 0;
	while (n < max && bpf_map_get_next_key(p->pid_counters_fd, prev, &next) == 0) {
		if (next.file.ino == key->ino && next.file.dev == key->dev)
			tgids[n++] = next.tgid;
		cur = next;
		prev = &cur;
	}
	return n;
}

#else /* !MOE_PROBES_ENABLED */

static size_t map_list_pids(struct pagecache_probes *p, const struct pagecache_file_key *key,
                            __u32 *tgids, size_t max)
{
	(void)p, (void)key, (void)tgids, (void)max;
	return 0;
}

static int attach(struct pagecache_probes *p)
{
	return fail(p, ENOTSUP, "%s", MOE_PROBES_DISABLED_REASON);
}

static void detach(struct pagecache_probes *p)
{
	(void)p;
}

static int map_insert_zero(struct pagecache_probes *p, const struct pagecache_file_key *key,
                           const char *path)
{
	(void)p, (void)key, (void)path;
	return 0;
}

static void map_forget(struct pagecache_probes *p, const struct pagecache_file_key *key)
{
	(void)p, (void)key;
}

static int map_read(int fd, const void *key, struct pagecache_counters *out)
{
	(void)fd, (void)key, (void)out;
	return -ENOENT;
}

static int map_sum(struct pagecache_probes *p, struct pagecache_counters *sum)
{
	(void)p, (void)sum;
	return 0;
}

#endif /* MOE_PROBES_ENABLED */

/* One of the file systems the probes need, at dir: mounted, or what to do. */
static void check_mount(const char *dir, const char *fstype, long magic, bool can_mount,
                        bool *mounted, char *shown, size_t shown_len, char *why, size_t why_len)
{
	snprintf(shown, shown_len, "%s", dir);
	const int m = mounted_at(dir, magic);
	*mounted = m == 1;
	if (m == 1 || why[0])
		return;
	if (m < 0)
		snprintf(why, why_len, "%s: %s: create it and mount %s there (mount -t %s %s %s)",
		         dir, strerror(-m), fstype, fstype, fstype, dir);
	else if (!can_mount)
		snprintf(why, why_len,
		         "%s is not mounted and this process may not mount it (no CAP_SYS_ADMIN): "
		         "mount -t %s %s %s",
		         dir, fstype, fstype, dir);
}

void pagecache_readiness(const char *bpffs, struct pagecache_readiness *out)
{
	memset(out, 0, sizeof(*out));
	const int cap_sys_admin = 21, cap_perfmon = 38, cap_bpf = 39;
	out->cap_sys_admin = process_has_capability(cap_sys_admin);
	out->cap_bpf = process_has_capability(cap_bpf);
	out->cap_perfmon = process_has_capability(cap_perfmon);
#ifdef MOE_PROBES_ENABLED
	out->built = true;
	libbpf_set_print(libbpf_to_log);
	const int may = bpf_may_load();
	out->can_load = may == 0;
	if (may < 0)
		snprintf(out->why, sizeof(out->why), "cannot load BPF programs: %s%s",
		         strerror(-may), privilege_hint(-may));
#else
	snprintf(out->why, sizeof(out->why), "%s", MOE_PROBES_DISABLED_REASON);
#endif
	snprintf(out->btf_path, sizeof(out->btf_path), "/sys/kernel/btf/vmlinux");
	out->btf = access(out->btf_path, R_OK) == 0;
	if (!out->btf && !out->why[0])
		snprintf(out->why, sizeof(out->why),
		         "%s: no kernel BTF: the probes are CO-RE programs and need a kernel built "
		         "with CONFIG_DEBUG_INFO_BTF",
		         out->btf_path);
	check_mount(bpffs ? bpffs : BPFFS_ROOT, "bpf", BPF_FS_MAGIC_NUMBER, out->cap_sys_admin,
	            &out->bpffs, out->bpffs_path, sizeof(out->bpffs_path), out->why,
	            sizeof(out->why));
	check_mount(TRACEFS_ROOT, "tracefs", TRACEFS_MAGIC_NUMBER, out->cap_sys_admin,
	            &out->tracefs, out->tracefs_path, sizeof(out->tracefs_path), out->why,
	            sizeof(out->why));
	out->ready = !out->why[0];
}
/* ---------------------------------------------------------------------------------------- */

int pagecache_check_instance_name(const char *name, struct sidecar_error *err)
{
	if (instance_name_valid(name))
		return 0;
	return error_set(err, MOE_EINVAL,
	                 "probe instance name '%.80s' is invalid: use 1-%d of [A-Za-z0-9_.-], not "
	                 "'.' or '..'",
	                 name, INSTANCE_NAME_MAX);
}

int pagecache_open(const struct pagecache_options *opt, struct pagecache_probes **out,
                   struct sidecar_error *err)
{
	*out = NULL;
	const char *instance = opt && opt->instance ? opt->instance : "default";
	if (pagecache_check_instance_name(instance, err) != 0)
		return -1;
	struct pagecache_probes *p = calloc(1, sizeof(*p));
	if (!p)
		return error_set(err, MOE_ENOMEM, "probes: out of memory");
	snprintf(p->instance, sizeof(p->instance), "%s", instance);
	snprintf(p->pin_dir, sizeof(p->pin_dir), "%s/%s", PIN_ROOT, instance);
	p->per_pid = opt && opt->per_pid;
	p->quiet = opt && opt->quiet;
	p->stale_grace_s =
	    !opt || opt->stale_grace_s == 0 ? PAGECACHE_STALE_GRACE_S : opt->stale_grace_s;
	long page = sysconf(_SC_PAGESIZE);
	p->page_size = page > 0 ? (__u64)page : 4096;
	p->counters_fd = p->pid_counters_fd = -1;
#ifdef MOE_PROBES_ENABLED
	p->lock_fd = -1;
#endif
	if (attach(p) == 0) {
		p->available = true;
		log_info("probes", "page-cache probes %s instance=%s per_pid=%d", p->status,
		         p->instance, (int)p->per_pid);
	} else {
		snprintf(p->status, sizeof(p->status), "unavailable: %s", p->error.msg);
		p->pin_dir[0] = '\0';
		if (!p->quiet)
			log_warn("probes", "page-cache probes %s", p->status);
	}
	p->error = (struct sidecar_error){0};
	*out = p;
	return 0;
}

void pagecache_close(struct pagecache_probes *p)
{
	if (!p)
		return;
	if (p->available)
		detach(p);
	for (size_t i = 0; i < p->n_files; i++)
		free(p->files[i].path);
	free(p->files);
	free(p);
}

bool pagecache_available(const struct pagecache_probes *p)
{
	return p && p->available;
}

const char *pagecache_status(const struct pagecache_probes *p)
{
	return p->status;
}

const char *pagecache_pin_dir(const struct pagecache_probes *p)
{
	return p->pin_dir;
}

int pagecache_replaced_stale_pid(const struct pagecache_probes *p)
{
	return p->replaced_stale_pid;
}

int pagecache_busy_owner(const struct pagecache_probes *p)
{
	return p->busy_owner;
}

const char *pagecache_last_error(const struct pagecache_probes *p)
{
	return p->error.msg;
}

int pagecache_watch(struct pagecache_probes *p, const char *path)
{
	if (find_watched(p, path))
		return 0;
	if (p->n_files == PAGECACHE_MAX_FILES)
		return fail(p, ENOSPC, "%s: cannot watch more than %d files", path,
		            PAGECACHE_MAX_FILES);
	struct pagecache_file_key key;
	int rc = file_key(path, &key);
	if (rc)
		return fail(p, rc, "%s: %s", path,
		            rc == -EINVAL ? "not a regular file" : strerror(-rc));
	char *copy = strdup(path);
	struct watched_file *files =
	    copy ? realloc(p->files, (p->n_files + 1) * sizeof(*files)) : NULL;
	if (!files) {
		free(copy);
		return fail(p, ENOMEM, "%s: out of memory", path);
	}
	p->files = files;
	if (p->available && (rc = map_insert_zero(p, &key, path))) {
		free(copy);
		return rc;
	}
	p->files[p->n_files++] = (struct watched_file){.path = copy, .key = key};
	return 0;
}

int pagecache_unwatch(struct pagecache_probes *p, const char *path)
{
	struct watched_file *w = find_watched(p, path);
	if (!w)
		return fail(p, ENOENT, "%s: not watched", path);
	if (p->available && !key_watched_elsewhere(p, &w->key, w))
		map_forget(p, &w->key);
	free(w->path);
	*w = p->files[--p->n_files];
	return 0;
}

int pagecache_read_file(struct pagecache_probes *p, const char *path, struct pagecache_stats *out)
{
	memset(out, 0, sizeof(*out));
	struct watched_file *w = find_watched(p, path);
	if (!w)
		return fail(p, ENOENT, "%s: not watched", path);
	if (p->available) {
		int rc = map_read(p->counters_fd, &w->key, &out->raw);
		if (rc)
			return fail(p, rc, "%s: reading its counters: %s", path, strerror(-rc));
	}
	pagecache_stats_derive(out, p->page_size);
	return 0;
}

int pagecache_read_totals(struct pagecache_probes *p, struct pagecache_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (p->available)
		map_sum(p, &out->raw);
	pagecache_stats_derive(out, p->page_size);
	return 0;
}

int pagecache_read_pid(struct pagecache_probes *p, const char *path, __u32 tgid,
                       struct pagecache_stats *out)
{
	memset(out, 0, sizeof(*out));
	struct watched_file *w = find_watched(p, path);
	if (!w)
		return fail(p, ENOENT, "%s: not watched", path);
	if (!p->per_pid)
		return fail(p, EINVAL, "per-pid counters are off (open with per_pid)");
	if (p->available) {
		struct pagecache_pid_key key = {.file = w->key, .tgid = tgid};
		int rc = map_read(p->pid_counters_fd, &key, &out->raw);
		if (rc)
			return fail(p, rc, "%s: no counters for pid %u", path, tgid);
	}
	pagecache_stats_derive(out, p->page_size);
	return 0;
}

int pagecache_list_pids(struct pagecache_probes *p, const char *path, __u32 *tgids, size_t max,
                        size_t *n)
{
	*n = 0;
	struct watched_file *w = find_watched(p, path);
	if (!w)
		return fail(p, ENOENT, "%s: not watched", path);
	if (p->available && p->per_pid)
		*n = map_list_pids(p, &w->key, tgids, max);
	return 0;
}
