/* harness.h — starting and observing a real moe-sidecar from the channel tests.
 *
 * A test gets a private temp directory, a sidecar started with --ready-fd (no sleeping:
 * the test waits for the READY line), its log in <dir>/sidecar.log, and helpers to look at
 * the process from outside (/proc fd count, CPU ticks) and to stop it with a signal.
 */
#ifndef MOE_TEST_HARNESS_H
#define MOE_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct sidecar_proc {
	pid_t pid;
	char dir[48];     /* temp directory, removed by sidecar_cleanup */
	char socket[100]; /* <dir>/run/sidecar.sock unless given */
	char log[100];    /* <dir>/sidecar.log */
};

/* Makes the temp directory (mode 0755 so other uids can traverse it). */
void harness_tempdir(struct sidecar_proc *sp);

/* Starts `moe-sidecar serve --socket sp->socket --ready-fd N extra…` and waits for READY
 * (moe-sidecar-testhooks when extra holds a --debug-… option). extra is a NULL-terminated
 * list (may be NULL). Returns 0, or -1 if it exited instead
 * (then *exit_status holds its waitpid status when non-NULL). */
int sidecar_start(struct sidecar_proc *sp, const char *const *extra, int *exit_status);

/* The same, with the sidecar running as uid (and gid = uid, no supplementary groups);
 * (uid_t)-1 keeps the caller's. Needs root for another uid. */
int sidecar_start_as(struct sidecar_proc *sp, const char *const *extra, int *exit_status,
                     uid_t uid);

/* The same, with the sidecar moved into a cgroup before it runs (it writes its pid to
 * `cgroup_procs`, e.g. /sys/fs/cgroup/memory/x/cgroup.procs; exit status 125 if it cannot). */
int sidecar_start_in_cgroup(struct sidecar_proc *sp, const char *const *extra, int *exit_status,
                            const char *cgroup_procs);

/* SIGTERM (or sig) and waitpid; returns the wait status. */
int sidecar_stop(struct sidecar_proc *sp, int sig);

/* Removes the temp directory and everything in it. */
void sidecar_cleanup(struct sidecar_proc *sp);

/* Open file descriptors of a process (entries in /proc/PID/fd), or -1. */
int proc_fd_count(pid_t pid);

/* utime + stime of a process in clock ticks, or -1. */
long proc_cpu_ticks(pid_t pid);

/* Runs argv (NULL-terminated; argv[0] a path) with stdout and stderr into out (cap bytes,
 * NUL-terminated, the rest dropped); in_child(arg), when given, runs in the child before the
 * exec (an affinity, a limit; it _exits on failure). Returns the exit status, -1 if it did
 * not exit, -2 if the child could not be started. */
int run_capture(const char *const *argv, void (*in_child)(const void *arg), const void *arg,
                char *out, size_t cap);

/* Whole file into a NUL-terminated malloc'd buffer (NULL on error). */
char *slurp(const char *path);

/* Number of occurrences of needle in the sidecar's log so far. */
int log_count(const struct sidecar_proc *sp, const char *needle);

/* Waits until the sidecar's log contains needle at least n times, polling on the file with
 * inotify (no fixed sleeps); gives up after timeout_ms. Returns true if seen. */
bool log_wait(const struct sidecar_proc *sp, const char *needle, int n, int timeout_ms);

/* Deterministic PRNG for tests (splitmix64). */
static inline uint64_t test_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#endif
