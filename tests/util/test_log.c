/* test_log.c — sidecar/util/log.c when its stream goes away: a line that cannot be written is
 * dropped and counted, the process lives on (SIGPIPE ignored, as serve does), and the next line
 * written on a working stream is followed by one warning saying how many were lost. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

/* fd 2 becomes the write end of a fresh pipe; returns its read end (closed by the caller). */
static int stderr_to_pipe(void)
{
	int p[2];
	cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
	cr_assert_eq(dup2(p[1], STDERR_FILENO), STDERR_FILENO);
	close(p[1]);
	return p[0];
}

Test(log, lines_to_a_closed_pipe_are_counted_and_said_once_on_the_next_stream)
{
	signal(SIGPIPE, SIG_IGN);
	const int saved = dup(STDERR_FILENO);
	cr_assert_geq(saved, 0);
	log_set_level(LOG_INFO);
	const uint64_t before = log_lines_dropped();

	close(stderr_to_pipe()); /* `| head -0`: nobody reads */
	errno = ENOENT;
	log_info("test", "lost one");
	cr_assert_eq(errno, ENOENT, "log_event leaves errno as it found it");
	log_warn("test", "lost two");
	log_debug("test", "below the level: never written, never counted");
	cr_assert_eq(log_lines_dropped(), before + 2);

	const int r = stderr_to_pipe();
	log_info("test", "written");
	log_info("test", "written too");
	cr_assert_eq(dup2(saved, STDERR_FILENO), STDERR_FILENO);
	char out[4096];
	ssize_t n = read(r, out, sizeof(out) - 1);
	cr_assert_gt(n, 0);
	out[n] = '\0';
	close(r);
	close(saved);
	const char *said = "warn  log      2 log line(s) lost before this one";
	const char *first = strstr(out, "written\n"), *warn = strstr(out, said),
	           *second = strstr(out, "written too\n");
	cr_assert(first && warn && second && first < warn && warn < second, "%s", out);
	cr_assert_null(strstr(warn + strlen(said), "lost before"), "said once: %s", out);
	cr_assert_null(strstr(out, "lost one"), "%s", out);
	cr_assert_eq(log_lines_dropped(), before + 2, "the count since start stays");
}
