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
#include <dirent.h>
#include <fcntl.h>
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

/* `taskset -c CPU moe-sidecar serve`: the daemon's pools use only that CPU (its log says so)
 * and every worker thread may run on it alone; before, moe-w0.1 was pinned to the node's
 * next CPU, outside the set. The lowest allowed CPU is kept (pus[0], worker 0's). */
Test(serve_start, workers_stay_in_the_affinity_the_sidecar_was_started_with)
{
	cpu_set_t all, one;
	cr_assert_eq(sched_getaffinity(0, sizeof(all), &all), 0);
	if (CPU_COUNT(&all) < 2)
		cr_skip_test("needs two CPUs to leave one out (%d here)", CPU_COUNT(&all));
	int cpu = 0;
	while (!CPU_ISSET(cpu, &all))
		cpu++;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	cr_assert_eq(sched_setaffinity(0, sizeof(one), &one), 0); /* the sidecar inherits it */
	const char *extra[] = {"--threads", "2", NULL};
	struct served s;
	served_start(&s, "q8_0", extra);
	char *log = slurp(s.sp.log);
	cr_assert_not_null(log);
	if (strstr(log, "numa node=1 "))
		cr_skip_test("a one-node machine is needed");
	char want[128], path[96];
	snprintf(want, sizeof(want),
	         "NUMA node 0: 2 workers on CPUs %d (this process may use CPUs %d)", cpu, cpu);
	cr_expect(strstr(log, want), "no '%s' in: %s", want, log);
	free(log);
	snprintf(path, sizeof(path), "/proc/%d/task", (int)s.sp.pid);
	DIR *d = opendir(path);
	cr_assert_not_null(d);
	int workers = 0;
	for (struct dirent *de; (de = readdir(d)) != NULL;) {
		if (de->d_name[0] == '.')
			continue;
		char file[400], comm[32] = "", line[256], cpus[64] = "";
		snprintf(file, sizeof(file), "%s/%s/comm", path, de->d_name);
		FILE *f = fopen(file, "r");
		if (!f)
			continue;
		if (!fgets(comm, sizeof(comm), f))
			comm[0] = '\0';
		fclose(f);
		if (strncmp(comm, "moe-w", 5) != 0)
			continue;
		snprintf(file, sizeof(file), "%s/%s/status", path, de->d_name);
		f = fopen(file, "r");
		cr_assert_not_null(f);
		while (fgets(line, sizeof(line), f))
			sscanf(line, "Cpus_allowed_list: %63s", cpus);
		fclose(f);
		snprintf(want, sizeof(want), "%d", cpu);
		cr_expect_str_eq(cpus, want, "worker %.*s may run on %s", (int)strcspn(comm, "\n"),
		                 comm, cpus);
		workers++;
	}
	closedir(d);
	cr_expect_eq(workers, 1, "one worker thread besides the request's own (moe-w0.1)");
	served_stop(&s);
}

/* --record-trace FILE is opened before the socket and the model, never through a link, never
 * waited on, and refused unless it is a regular file of the sidecar's own with one name.
 * Each case names what the path is; the MODEL does not exist, so the refusal came first. */
Test(serve_start, a_trace_file_that_is_not_a_regular_file_is_refused_before_the_model)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char victim[96], link_victim[96], dangling[96], dangling_target[96], dir[96], fifo[96],
	    fifo_read[96], hard[96], hard2[96], missing[96], foreign[96];
	snprintf(victim, sizeof(victim), "%s/victim", sp.dir);
	snprintf(link_victim, sizeof(link_victim), "%s/served.trace", sp.dir);
	snprintf(dangling, sizeof(dangling), "%s/dangling.trace", sp.dir);
	snprintf(dangling_target, sizeof(dangling_target), "%s/made-by-the-sidecar", sp.dir);
	snprintf(dir, sizeof(dir), "%s/a-directory", sp.dir);
	snprintf(fifo, sizeof(fifo), "%s/fifo", sp.dir);
	snprintf(fifo_read, sizeof(fifo_read), "%s/fifo-with-a-reader", sp.dir);
	snprintf(hard, sizeof(hard), "%s/hard.trace", sp.dir);
	snprintf(hard2, sizeof(hard2), "%s/hard-other-name", sp.dir);
	snprintf(missing, sizeof(missing), "%s/no-such-dir/x.trace", sp.dir);
	snprintf(foreign, sizeof(foreign), "%s/foreign.trace", sp.dir);
	int fd = open(victim, O_WRONLY | O_CREAT | O_EXCL, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "victim\n", 7), 7);
	close(fd);
	cr_assert_eq(symlink(victim, link_victim), 0);
	cr_assert_eq(symlink(dangling_target, dangling), 0);
	cr_assert_eq(mkdir(dir, 0700), 0);
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	cr_assert_eq(mkfifo(fifo_read, 0600), 0);
	const int reader = open(fifo_read, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	cr_assert_geq(reader, 0);
	fd = open(hard, O_WRONLY | O_CREAT | O_EXCL, 0600);
	cr_assert_geq(fd, 0);
	close(fd);
	cr_assert_eq(link(hard, hard2), 0);
	const bool root = geteuid() == 0;
	if (root) {
		fd = open(foreign, O_WRONLY | O_CREAT | O_EXCL, 0600);
		cr_assert_geq(fd, 0);
		close(fd);
		cr_assert_eq(chown(foreign, 65534, 65534), 0);
	}
	const struct {
		const char *path, *says;
	} cases[] = {
	    {link_victim, "is a symbolic link; refusing to follow it"},
	    {dangling, "is a symbolic link; refusing to follow it"},
	    {dir, "is a directory; a trace must be a regular file"},
	    {fifo, "is a FIFO; a trace must be a regular file"},
	    {fifo_read, "is a FIFO; a trace must be a regular file"},
	    {"/dev/full", "is a character device; a trace must be a regular file"},
	    {hard, "has 2 hard links; refusing to overwrite"},
	    {missing, "No such file or directory (is its directory there?)"},
	    {root ? foreign : NULL, "is owned by uid 65534, not by this sidecar's uid 0"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (!cases[i].path)
			continue;
		const char *extra[] = {NO_MODEL, "--record-trace", cases[i].path, NULL};
		char *log = refused_start(&sp, extra, 2);
		char want[256];
		snprintf(want, sizeof(want), "--record-trace %s: %s", cases[i].path, cases[i].says);
		cr_expect(strstr(log, want), "%s: %s", cases[i].path, log);
		cr_expect_not(strstr(log, "nonexistent"), "%s: the model came first: %s",
		              cases[i].path, log);
		struct stat st;
		char run[80];
		snprintf(run, sizeof(run), "%s/run", sp.dir);
		cr_expect_neq(stat(run, &st), 0, "%s: the socket directory came first",
		              cases[i].path);
		free(log);
	}
	close(reader);
	char *text = slurp(victim);
	cr_expect(text && strcmp(text, "victim\n") == 0, "the link's target was written: %s",
	          text ? text : "(gone)");
	free(text);
	struct stat st;
	cr_expect_neq(lstat(dangling_target, &st), 0, "the dangling link's target was created");
	sidecar_cleanup(&sp);
}

/* With a model that exists: the link to a root-owned file is still refused before the model
 * is read (its target keeps its bytes), and a second sidecar cannot record into the file a
 * first one records into (the file's lock, taken before the socket's). */
Test(serve_start, a_trace_file_is_refused_with_a_real_model_and_locked_while_recorded)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char model[160], victim[96], trace[96];
	snprintf(model, sizeof(model), "%s/model.gguf", sp.dir);
	snprintf(victim, sizeof(victim), "%s/victim", sp.dir);
	snprintf(trace, sizeof(trace), "%s/served.trace", sp.dir);
	cr_assert_eq(ref_generate(model, "q8_0", 7), 0);
	int fd = open(victim, O_WRONLY | O_CREAT | O_EXCL, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "victim\n", 7), 7);
	close(fd);
	cr_assert_eq(symlink(victim, trace), 0);
	const char *extra[] = {
	    model, "--record-trace", trace, "--probes-instance", "test-serve-start", NULL};
	char *log = refused_start(&sp, extra, 2);
	cr_expect(strstr(log, "is a symbolic link; refusing to follow it"), "%s", log);
	cr_expect_not(strstr(log, "model path=") || strstr(log, "warming"),
	              "the model was read before the trace was checked: %s", log);
	free(log);
	char *text = slurp(victim);
	cr_expect(text && strcmp(text, "victim\n") == 0, "the link's target was written: %s",
	          text ? text : "(gone)");
	free(text);

	/* A regular file with old bytes: taken, truncated, recorded into; a second sidecar
	 * (another socket) cannot have it, and the first one's trace stays whole. */
	cr_assert_eq(unlink(trace), 0);
	fd = open(trace, O_WRONLY | O_CREAT | O_EXCL, 0600);
	cr_assert_geq(fd, 0);
	for (int i = 0; i < 1000; i++)
		cr_assert_eq(write(fd, "not a trace\n", 12), 12);
	close(fd);
	struct served s;
	const char *record[] = {"--record-trace", trace, NULL};
	served_start(&s, "q8_0", record);
	struct sidecar_proc second;
	harness_tempdir(&second);
	const char *again[] = {NO_MODEL, "--record-trace", trace, NULL};
	log = refused_start(&second, again, 2);
	char want[160];
	snprintf(want, sizeof(want), "--record-trace %s: another process is recording into it",
	         trace);
	cr_expect(strstr(log, want), "%s", log);
	free(log);
	sidecar_cleanup(&second);
	served_stop(&s);
	text = slurp(trace);
	cr_assert_not_null(text);
	cr_expect(strncmp(text, "moe-trace 1 ", 12) == 0 && !strstr(text, "not a trace"),
	          "the old bytes were not truncated, or the header is gone: %.200s", text);
	free(text);
	sidecar_cleanup(&sp);
}
