/* test_serve_start.c — what `serve MODEL` checks before it reads the model, and what it says
 * when it cannot have something another sidecar holds.
 *
 * Warming a real model reads every expert (minutes); the options, the socket, its directory
 * and the one-sidecar lock need no model, so they are refused first. The proof needs no
 * clock: the MODEL given here does not exist, so any refusal other than "no such file" came
 * before the model was touched; and with a model that does exist, the refused sidecar's log
 * has no line about it.
 */
#include <criterion/criterion.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve_fixture.h"

#define NO_MODEL "/nonexistent/model.gguf"

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

Test(serve_start, a_second_sidecar_on_a_held_socket_is_refused_before_the_model)
{
	struct sidecar_proc first, second;
	harness_tempdir(&first);
	cr_assert_eq(sidecar_start(&first, NULL, NULL), 0);
	harness_tempdir(&second);
	snprintf(second.socket, sizeof(second.socket), "%s", first.socket);
	const char *extra[] = {NO_MODEL, NULL};
	char *log = refused_start(&second, extra, 1);
	char want[64];
	snprintf(want, sizeof(want), "another moe-sidecar (pid %d) is serving", (int)first.pid);
	cr_expect(strstr(log, want), "%s", log);
	cr_expect_not(strstr(log, "nonexistent"), "the model was opened first: %s", log);
	free(log);

	/* With a model that exists: not one line about it (its catalog, probes, warming). */
	char model[160];
	snprintf(model, sizeof(model), "%s/model.gguf", second.dir);
	cr_assert_eq(ref_generate(model, "q8_0", 7), 0);
	const char *with_model[] = {model, "--probes-instance", "test-serve-start", NULL};
	log = refused_start(&second, with_model, 1);
	cr_expect(strstr(log, want), "%s", log);
	cr_expect_not(strstr(log, "model path=") || strstr(log, "warming") || strstr(log, "probes"),
	              "the model was read before the lock was checked: %s", log);
	free(log);

	struct moe_client *c;
	struct moe_connect_opts o = {.socket_path = first.socket};
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "the first sidecar lost its socket: %s",
	             moe_connect_error());
	cr_expect_eq(moe_ping(c, 5000), MOE_OK);
	moe_close(c);
	sidecar_cleanup(&second);
	sidecar_cleanup(&first);
}

/* "0" or "0,1": the NUMA nodes this machine has (/sys/devices/system/node/nodeN), in order. */
static void machine_numa_nodes(char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = '\0';
	for (int n = 0; n < 4096 && used < len; n++) {
		char dir[64];
		struct stat st;
		snprintf(dir, sizeof(dir), "/sys/devices/system/node/node%d", n);
		if (stat(dir, &st) == 0)
			used +=
			    (size_t)snprintf(buf + used, len - used, "%s%d", used ? "," : "", n);
	}
}

Test(serve_start, options_that_need_no_model_are_refused_before_it)
{
	char numa_said[160], nodes[64];
	machine_numa_nodes(nodes, sizeof(nodes));
	cr_assert(nodes[0], "no /sys/devices/system/node/node*");
	snprintf(numa_said, sizeof(numa_said),
	         "--numa: none of the listed nodes exists on this machine (its NUMA nodes: %s)",
	         nodes);
	const struct {
		const char *option, *value, *says;
	} cases[] = {
	    {"--policy", "sieve+heat", "--policy 'sieve+heat': unknown modifier '+heat'"},
	    {"--numa", "4095", numa_said},
	    {"--numa", "synthetic:no-such-spec", "bad synthetic topology"},
	    {"--probes-instance", "../escape", "probe instance name '../escape' is invalid"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct sidecar_proc sp;
		harness_tempdir(&sp);
		const char *extra[] = {NO_MODEL, cases[i].option, cases[i].value, NULL};
		char *log = refused_start(&sp, extra, 2);
		cr_expect(strstr(log, cases[i].says), "%s %s: %s", cases[i].option, cases[i].value,
		          log);
		cr_expect_not(strstr(log, "nonexistent"), "%s %s: the model came first: %s",
		              cases[i].option, cases[i].value, log);
		struct stat st;
		char run[80];
		snprintf(run, sizeof(run), "%s/run", sp.dir);
		cr_expect_neq(stat(run, &st), 0, "the socket directory was made for nothing");
		free(log);
		sidecar_cleanup(&sp);
	}
}

Test(serve_start, a_bad_socket_directory_is_refused_before_the_model)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char target[80], link[80];
	snprintf(target, sizeof(target), "%s/real", sp.dir);
	snprintf(link, sizeof(link), "%s/run", sp.dir);
	cr_assert_eq(mkdir(target, 0700), 0);
	cr_assert_eq(symlink(target, link), 0);
	const char *extra[] = {NO_MODEL, NULL};
	char *log = refused_start(&sp, extra, 1);
	cr_expect(strstr(log, "is a symbolic link"), "%s", log);
	cr_expect_not(strstr(log, "nonexistent"), "the model came first: %s", log);
	free(log);
	sidecar_cleanup(&sp);
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

/* More worker threads than the node has CPUs is accepted (tests and benchmarks ask for it) but
 * said, with both figures: the workers take turns. */
Test(serve_start, more_threads_than_cpus_is_served_with_a_warning)
{
	cpu_set_t cpus;
	cr_assert_eq(sched_getaffinity(0, sizeof(cpus), &cpus), 0);
	const int n_cpus = CPU_COUNT(&cpus);
	char threads[16], said[96];
	snprintf(threads, sizeof(threads), "%d", n_cpus + 1);
	const char *extra[] = {"--threads", threads, NULL};
	struct served s;
	served_start(&s, "q8_0", extra);
	snprintf(said, sizeof(said), "--threads %d is above the ", n_cpus + 1);
	char *log = slurp(s.sp.log);
	cr_assert(log && strstr(log, said) && strstr(log, " CPUs of NUMA node "), "%s",
	          log ? log : "(no log)");
	if (strstr(log, "numa node=0 os_index=0") && !strstr(log, "numa node=1 ")) {
		snprintf(said, sizeof(said), "--threads %d is above the %d CPUs of NUMA node 0",
		         n_cpus + 1, n_cpus); /* one node: all of this process's CPUs */
		cr_assert(strstr(log, said), "%s", log);
	}
	free(log);
	served_stop(&s);
}
