/* harness.c — see harness.h. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void harness_tempdir(struct sidecar_proc *sp)
{
	memset(sp, 0, sizeof(*sp));
	snprintf(sp->dir, sizeof(sp->dir), "/tmp/moe-test.XXXXXX");
	if (!mkdtemp(sp->dir)) {
		perror("mkdtemp");
		abort();
	}
	chmod(sp->dir, 0755);
	snprintf(sp->socket, sizeof(sp->socket), "%s/run/sidecar.sock", sp->dir);
	snprintf(sp->log, sizeof(sp->log), "%s/sidecar.log", sp->dir);
}

int sidecar_start(struct sidecar_proc *sp, const char *const *extra, int *exit_status)
{
	return sidecar_start_as(sp, extra, exit_status, (uid_t)-1);
}

static int start(struct sidecar_proc *sp, const char *const *extra, int *exit_status, uid_t uid,
                 const char *cgroup_procs);

int sidecar_start_as(struct sidecar_proc *sp, const char *const *extra, int *exit_status, uid_t uid)
{
	return start(sp, extra, exit_status, uid, NULL);
}

int sidecar_start_in_cgroup(struct sidecar_proc *sp, const char *const *extra, int *exit_status,
                            const char *cgroup_procs)
{
	return start(sp, extra, exit_status, (uid_t)-1, cgroup_procs);
}

/* The daemon to run: the test-hooks build when a test asks for a fault-injection option
 * (--debug-…), which the shipped moe-sidecar does not have. */
static const char *daemon_for(const char *const *extra)
{
#ifdef MOE_SIDECAR_TESTHOOKS_BIN
	for (int i = 0; extra && extra[i]; i++)
		if (strncmp(extra[i], "--debug-", 8) == 0)
			return MOE_SIDECAR_TESTHOOKS_BIN;
#else
	(void)extra;
#endif
	return MOE_SIDECAR_BIN;
}

static int start(struct sidecar_proc *sp, const char *const *extra, int *exit_status, uid_t uid,
                 const char *cgroup_procs)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0)
		return -1;
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		/* Never outlive a test that failed half-way. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int logfd = open(sp->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (logfd >= 0)
			dup2(logfd, 2);
		if (cgroup_procs) {
			int cg = open(cgroup_procs, O_WRONLY | O_CLOEXEC);
			if (cg < 0 || write(cg, "0", 1) != 1)
				_exit(125);
			close(cg);
		}
		if (uid != (uid_t)-1 && (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 ||
		                         setresuid(uid, uid, uid) != 0))
			_exit(126);
		int ready = dup(p[1]); /* without O_CLOEXEC */
		char fdbuf[16];
		snprintf(fdbuf, sizeof(fdbuf), "%d", ready);
		const char *bin = daemon_for(extra);
		const char *argv[32] = {bin,          "serve", "--socket",    sp->socket,
		                        "--ready-fd", fdbuf,   "--log-level", "debug"};
		int n = 8;
		for (int i = 0; extra && extra[i] && n < 31; i++)
			argv[n++] = extra[i];
		argv[n] = NULL;
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	char line[512];
	size_t have = 0;
	for (;;) {
		ssize_t n = read(p[0], line + have, sizeof(line) - 1 - have);
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	close(p[0]);
	line[have] = '\0';
	if (strncmp(line, "READY ", 6) != 0) {
		int st = 0;
		waitpid(pid, &st, 0);
		if (exit_status)
			*exit_status = st;
		return -1;
	}
	sp->pid = pid;
	return 0;
}

int sidecar_stop(struct sidecar_proc *sp, int sig)
{
	int st = -1;
	if (sp->pid > 0) {
		kill(sp->pid, sig);
		while (waitpid(sp->pid, &st, 0) < 0 && errno == EINTR)
			;
		sp->pid = 0;
	}
	return st;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

void sidecar_cleanup(struct sidecar_proc *sp)
{
	if (sp->pid > 0)
		sidecar_stop(sp, SIGKILL);
	if (sp->dir[0] && !getenv("MOE_TEST_KEEP")) /* keep logs for a post-mortem */
		nftw(sp->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int proc_fd_count(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

long proc_cpu_ticks(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	char *s = slurp(path);
	if (!s)
		return -1;
	/* Fields after the ")" that ends comm: state is field 3; utime 14, stime 15. */
	char *p = strrchr(s, ')');
	long ut = -1, st = -1;
	if (p)
		sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st);
	free(s);
	return ut < 0 || st < 0 ? -1 : ut + st;
}

int run_capture(const char *const *argv, void (*in_child)(const void *arg), const void *arg,
                char *out, size_t cap)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0)
		return -2;
	const pid_t kid = fork();
	if (kid < 0) {
		close(p[0]);
		close(p[1]);
		return -2;
	}
	if (kid == 0) {
		dup2(p[1], 1);
		dup2(p[1], 2);
		if (in_child)
			in_child(arg);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	size_t have = 0;
	for (ssize_t n; have + 1 < cap && (n = read(p[0], out + have, cap - 1 - have)) > 0;)
		have += (size_t)n;
	if (cap)
		out[have] = '\0';
	char drain[4096]; /* the rest, so the child never blocks on a full pipe */
	while (read(p[0], drain, sizeof(drain)) > 0)
		;
	close(p[0]);
	int st;
	if (waitpid(kid, &st, 0) != kid)
		return -2;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *slurp(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (len + 1 >= cap)
			buf = realloc(buf, cap *= 2);
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	return buf;
}

int log_count(const struct sidecar_proc *sp, const char *needle)
{
	char *s = slurp(sp->log);
	if (!s)
		return 0;
	int n = 0;
	for (char *p = s; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	free(s);
	return n;
}

static uint64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

bool log_wait(const struct sidecar_proc *sp, const char *needle, int n, int timeout_ms)
{
	int in = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	if (in >= 0)
		inotify_add_watch(in, sp->log, IN_MODIFY);
	const uint64_t end = mono_ms() + (uint64_t)timeout_ms;
	bool seen;
	while (!(seen = log_count(sp, needle) >= n)) {
		uint64_t now = mono_ms();
		if (now >= end)
			break;
		struct pollfd p = {.fd = in, .events = POLLIN};
		/* A write to the log wakes us; the bound only guards a missed watch. */
		poll(&p, 1, (int)(end - now < 200 ? end - now : 200));
		char buf[4096];
		while (in >= 0 && read(in, buf, sizeof(buf)) > 0)
			;
	}
	if (in >= 0)
		close(in);
	return seen;
}
