/* test_serve_start.c — what `serve MODEL` says when it cannot have something another
 * sidecar holds.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve_fixture.h"

/* Starts a sidecar that must refuse: returns its log, asserts its exit status. */
static char *refused_start(struct sidecar_proc *sp, const char *const *extra, int want_status)
{
	int st = 0;
	cr_assert_neq(sidecar_start(sp, extra, &st), 0, "the sidecar started");
	char *log = slurp(sp->log);
	cr_assert_not_null(log);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == want_status, "status 0x%x: %s", st, log);
	return log;
}

/* Two sidecars on one host with the default probe instance: the second cannot have the
 * probes, and its warning says how to give it its own. */
Test(serve_start, a_second_sidecar_losing_the_probe_instance_is_told_its_option)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	char *first_log = slurp(s.sp.log);
	bool active = first_log && strstr(first_log, "page-cache probes active");
	free(first_log);
	if (!active) {
		served_stop(&s);
		cr_skip_test("the eBPF probes are unavailable here");
	}
	char instance[64];
	snprintf(instance, sizeof(instance), "test-serve-%d", (int)getpid());
	struct sidecar_proc second;
	harness_tempdir(&second);
	const char *extra[] = {s.model, "--probes-instance", instance, NULL};
	cr_assert_eq(sidecar_start(&second, extra, NULL), 0);
	char want[160];
	snprintf(want, sizeof(want), "another sidecar owns probe instance '%s'", instance);
	cr_expect_eq(log_count(&second, want), 1, "%s", slurp(second.log));
	cr_expect_eq(log_count(&second, "--probes-instance NAME"), 1);
	int st = sidecar_stop(&second, SIGTERM);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	sidecar_cleanup(&second);

	/* --require-probes makes the same finding fatal, with the same hint. */
	harness_tempdir(&second);
	const char *required[] = {s.model, "--probes-instance", instance, "--require-probes", NULL};
	char *log = refused_start(&second, required, 1);
	cr_expect(strstr(log, want) && strstr(log, "--require-probes"), "%s", log);
	free(log);
	sidecar_cleanup(&second);
	served_stop(&s);
}
