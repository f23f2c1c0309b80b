/* test_residency_messages.c — what the residency tells an operator when reads cannot be what
 * it would like: buffered reads asked for are not reported as a refusal, and a non-root
 * process whose slots exceed its locked-memory limit is told about RLIMIT_MEMLOCK. The log
 * goes to stderr: each test sends it to a file for the duration and reads it back. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"

#define NOBODY 65534

/* stderr into a fresh file; returns the saved stderr for stderr_restore. */
static int stderr_to(const char *path)
{
	int saved = dup(2);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert(saved >= 0 && fd >= 0);
	dup2(fd, 2);
	close(fd);
	return saved;
}

static void stderr_restore(int saved)
{
	dup2(saved, 2);
	close(saved);
}

static char *slurp_file(const char *path)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	static char buf[65536];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

Test(residency_messages, no_direct_is_logged_as_asked_not_as_unsupported)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 3, 2, 5000);
	char log[300];
	snprintf(log, sizeof(log), "%s/log", f.dir);
	struct residency_config cfg = {
	    .numa_node = -1, .mem_budget = 1 << 20, .policy = "lru", .no_direct = true};
	int saved = stderr_to(log);
	struct residency *r = fixture_residency(&f, &cfg);
	stderr_restore(saved);
	struct residency_counters c;
	residency_counters(r, &c);
	cr_expect_eq(c.buffered_files, 1, "buffered reads are still counted");
	residency_destroy(r);
	const char *text = slurp_file(log);
	cr_expect(strstr(text, "as asked (--no-direct)"), "%s", text);
	cr_expect_not(strstr(text, "not supported"), "%s", text);
	unlink(log);
	fixture_destroy(&f);
}

/* A child drops to nobody under a small RLIMIT_MEMLOCK and creates a residency over 1 MiB of
 * slots. Returns its exit status (0: created, 201: refused, 200: could not drop privileges);
 * what it logged and the error it got are in the file `log`. */
static int residency_as_nobody(struct fixture *f, const char *log, rlim_t memlock)
{
	pid_t kid = fork();
	cr_assert_geq(kid, 0);
	if (kid == 0) {
		const struct rlimit lim = {memlock, memlock};
		stderr_to(log);
		if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0 || setgroups(0, NULL) != 0 ||
		    setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
		    setresuid(NOBODY, NOBODY, NOBODY) != 0)
			_exit(200);
		struct residency_config cfg = {.numa_node = -1, .mem_budget = 1 << 20};
		struct residency *r;
		struct sidecar_error err = {0};
		if (residency_create(&r, &f->map, &cfg, &err) != 0) {
			fprintf(stderr, "residency_create: %s\n", err.msg);
			_exit(201);
		}
		struct expert_ref ref; /* slots are registered as their group is populated */
		if (residency_acquire(r, 0, 0, 1.0f, 0, &ref) == 0)
			residency_release(r, &ref);
		residency_destroy(r);
		_exit(0);
	}
	int st;
	cr_assert_eq(waitpid(kid, &st, 0), kid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 200, "could not drop privileges");
	return WEXITSTATUS(st);
}

/* Under 64 KiB the rings fit and registering the slots fails; under 4 KiB (on kernels that
 * charge the rings too) io_uring_queue_init fails. Either way the message names the limit. */
Test(residency_messages, memlock_limit_is_named_when_registering_buffers_fails)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to run the residency as another uid (65534)");
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 4, 2, 5000);
	cr_assert_eq(chmod(f.dir, 0755), 0);
	cr_assert_eq(chmod(f.path, 0644), 0);
	char log[300];
	snprintf(log, sizeof(log), "%s/log", f.dir);

	int rc = residency_as_nobody(&f, log, 64 << 10);
	const char *text = slurp_file(log);
	if (rc == 201 && strstr(text, "io_uring") && !strstr(text, "RLIMIT_MEMLOCK"))
		cr_skip_test("io_uring refused to an unprivileged process here: %s", text);
	cr_assert_eq(rc, 0, "%s", text);
	cr_expect(strstr(text, "fixed buffers failed (Cannot allocate memory)"), "%s", text);
	cr_expect(strstr(text, "RLIMIT_MEMLOCK (64 KiB") && strstr(text, "ulimit -l"), "%s", text);

	rc = residency_as_nobody(&f, log, 4 << 10);
	text = slurp_file(log);
	cr_expect(strstr(text, "RLIMIT_MEMLOCK (4 KiB") && strstr(text, "ulimit -l"), "%s: %s",
	          rc ? "refused" : "created", text);
	unlink(log);
	fixture_destroy(&f);
}
