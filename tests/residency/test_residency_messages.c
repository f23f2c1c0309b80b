/* test_residency_messages.c — what the residency tells an operator when reads cannot be what
 * it would like: buffered reads asked for are not reported as a refusal, and a non-root
 * process whose slots exceed its locked-memory limit is told about RLIMIT_MEMLOCK. The log
 * goes to stderr: each test sends it to a file for the duration and reads it back. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixture.h"

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
