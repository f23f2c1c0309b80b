/* test_serve_probes.c — the eBPF page-cache probes as `serve MODEL` uses them: attached at
 * start and watching the model file, reported by STATS with the same numbers an operator
 * reads with `bpftool map dump pinned …/counters`, unpinned at a clean stop; and without
 * privileges a single warning, "probes unavailable: <reason>" in STATS and a sidecar that
 * serves anyway — unless --require-probes makes that fatal. Two sidecars given no
 * --probes-instance take one instance each, named after their sockets.
 *
 * Needs root (eBPF, and a uid to drop to); skips, saying why, where either is missing.
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

#define NOBODY 65534
#define PIN_ROOT "/sys/fs/bpf/moe-sidecar"

static const char *bpftool_path(void)
{
	static const char *const candidates[] = {"/usr/sbin/bpftool", "/sbin/bpftool",
	                                         "/usr/local/sbin/bpftool", "/usr/bin/bpftool"};
	for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++)
		if (access(candidates[i], X_OK) == 0)
			return candidates[i];
	return NULL;
}

/* served_start names the instance after the test process. */
static void instance_dir(char *buf, size_t cap)
{
	snprintf(buf, cap, PIN_ROOT "/test-serve-%d", (int)getpid());
}

static bool probes_active(const char *stats_json)
{
	return strstr(stats_json, "\"probes\":\"active\"") != NULL;
}

/* The unsigned number after "name": at or after `from`; fails the test if absent. */
static unsigned long long u64_after(const char *from, const char *name)
{
	char needle[80];
	snprintf(needle, sizeof(needle), "\"%s\":", name);
	const char *at = strstr(from, needle);
	cr_assert_not_null(at, "no field %s in: %.400s", name, from);
	return strtoull(at + strlen(needle), NULL, 10);
}

/* A few FORWARDs over every layer, so that cold experts are read from the model file. */
static void run_workload(struct served *s)
{
	const uint32_t h = ref_hidden(s->ref), ne = ref_n_experts(s->ref);
	for (uint64_t i = 0; i < 6; i++) {
		struct fwd_case fc;
		fwd_case_make(&fc, 900 + i, (int32_t)(i % 2), 3, 4, ne, h, false);
		struct moe_completion d;
		cr_assert_eq(served_forward(s, &fc, NULL, &d), MOE_OK, "forward %llu: %s",
		             (unsigned long long)i, moe_strerror(d.status));
		fwd_case_free(&fc);
	}
}

Test(serve_probes, stats_json_agrees_with_bpftool_dump_of_the_pinned_counters)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to load eBPF programs");
	const char *bpftool = bpftool_path();
	if (!bpftool)
		cr_skip_test("bpftool is not installed");
	struct served s;
	const char *const extra[] = {"--mem-budget", "30%", NULL};
	served_start(&s, "q8_0", extra);
	char *first = served_stats(&s);
	if (!probes_active(first)) {
		served_stop(&s);
		cr_skip_test("probes unavailable here: %.200s", strstr(first, "probes") ?: first);
	}
	run_workload(&s);

	/* STATS, the bpftool dump, STATS again: nothing reads in between (no hints were posted,
	 * every FORWARD completed), which the two STATS prove. */
	char *before = served_stats(&s);
	char dir[128], cmd[320];
	instance_dir(dir, sizeof(dir));
	snprintf(cmd, sizeof(cmd), "%s -j map dump pinned %s/counters", bpftool, dir);
	FILE *out = popen(cmd, "r");
	cr_assert_not_null(out);
	static char dump[1 << 16];
	size_t n = fread(dump, 1, sizeof(dump) - 1, out);
	dump[n] = '\0';
	cr_assert_eq(pclose(out), 0, "%s failed: %s", cmd, dump);
	char *after = served_stats(&s);

	static const char *const keys[] = {"pagecache_fill_bytes", "direct_bytes",
	                                   "buffered_bytes"};
	struct stat st;
	cr_assert_eq(stat(s.model, &st), 0);
	char ino[64];
	snprintf(ino, sizeof(ino), "\"ino\":%llu", (unsigned long long)st.st_ino);
	const char *entry = strstr(dump, ino);
	cr_assert_not_null(entry, "the model file (ino %llu) is not watched: %.400s",
	                   (unsigned long long)st.st_ino, dump);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		int64_t a = json_top_u64(before, keys[i]), b = json_top_u64(after, keys[i]);
		cr_assert(a >= 0, "STATS has no %s: %s", keys[i], before);
		cr_assert_eq(a, b, "%s moved while nothing was reading", keys[i]);
		cr_expect_eq((unsigned long long)a, u64_after(entry, keys[i]),
		             "%s: STATS %lld, bpftool %llu", keys[i], (long long)a,
		             u64_after(entry, keys[i]));
	}
	/* The counters cover every process's reads of the model file (the test's own reference
	 * engine read it with read(2) while opening): over the workload, which only the sidecar
	 * ran, the expert reads were all direct and never filled the page cache. */
	const int64_t direct =
	    json_top_u64(before, "direct_bytes") - json_top_u64(first, "direct_bytes");
	const int64_t read = json_top_u64(before, "bytes_read") - json_top_u64(first, "bytes_read");
	cr_expect_gt(read, 0, "the workload read cold experts: %s", before);
	cr_expect_geq(direct, read, "direct bytes cover what the loader read (plus alignment)");
	cr_expect_eq(json_top_u64(before, "buffered_bytes"), json_top_u64(first, "buffered_bytes"));
	cr_expect_eq(json_top_u64(before, "pagecache_fill_bytes"),
	             json_top_u64(first, "pagecache_fill_bytes"));
	free(first);
	free(before);
	free(after);
	served_stop(&s);
}

Test(serve_probes, a_clean_stop_removes_the_pins)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to load eBPF programs");
	struct served s;
	served_start(&s, "q8_0", NULL);
	char *js = served_stats(&s);
	const bool active = probes_active(js);
	free(js);
	char dir[128];
	instance_dir(dir, sizeof(dir));
	struct stat st;
	if (!active) {
		served_stop(&s);
		cr_skip_test("probes unavailable here");
	}
	cr_assert_eq(stat(dir, &st), 0, "%s is pinned while serving", dir);
	served_stop(&s);
	cr_assert_neq(stat(dir, &st), 0, "%s is left behind after a clean stop", dir);
}

/* A model in a temp directory that uid `nobody` can read and create its socket folder in. */
static void nobody_setup(struct served *s)
{
	memset(s, 0, sizeof(*s));
	harness_tempdir(&s->sp);
	cr_assert_eq(chmod(s->sp.dir, 01777), 0); /* sticky: a socket path nobody can redirect */
	snprintf(s->model, sizeof(s->model), "%s/model.gguf", s->sp.dir);
	cr_assert_eq(ref_generate(s->model, "q8_0", 7), 0);
	cr_assert_eq(chmod(s->model, 0644), 0);
}

/* Lines of the sidecar's log that are warnings about the probes. */
static int probe_warnings(const struct served *s)
{
	char *log = slurp(s->sp.log);
	cr_assert_not_null(log);
	int n = 0;
	for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
		if (strstr(line, " warn ") && strstr(line, "probe"))
			n++;
	free(log);
	return n;
}

Test(serve_probes, without_privileges_one_warning_and_a_working_sidecar)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to run the sidecar as another uid (65534)");
	struct served s;
	nobody_setup(&s);
	const char *const extra[] = {
	    s.model, "--allow-uid", "0", "--probes-instance", "test-serve-nobody", NULL};
	int st = 0;
	if (sidecar_start_as(&s.sp, extra, &st, NOBODY) != 0) {
		char *log = slurp(s.sp.log);
		cr_assert_fail("sidecar as nobody did not start (0x%x): %s", st, log ?: "");
	}
	struct moe_connect_opts o = {
	    .socket_path = s.sp.socket, .max_tokens = 64, .n_slots = 2, .server_uid = NOBODY};
	cr_assert_eq(moe_connect(&o, &s.c), MOE_OK, "connect: %s", moe_connect_error());
	s.ref = ref_open(s.model);
	cr_assert_not_null(s.ref);
	run_workload(&s);
	char *js = served_stats(&s);
	cr_expect(strstr(js, "probes unavailable: "), "%s", js);
	cr_expect_gt(json_top_u64(js, "requests"), 0, "%s", js);
	free(js);
	cr_expect_eq(probe_warnings(&s), 1, "exactly one warning line about the probes");
	served_stop(&s);
}

Test(serve_probes, require_probes_without_privileges_is_fatal)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to run the sidecar as another uid (65534)");
	struct served s;
	nobody_setup(&s);
	const char *const extra[] = {s.model, "--require-probes", "--probes-instance",
	                             "test-serve-nobody-req", NULL};
	int st = 0;
	cr_assert_neq(sidecar_start_as(&s.sp, extra, &st, NOBODY), 0,
	              "a sidecar that requires probes it cannot have must not start");
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) != 0, "exit status 0x%x", st);
	char *log = slurp(s.sp.log);
	cr_expect(log && strstr(log, "probe"), "the log says why: %s", log ?: "");
	free(log);
	sidecar_cleanup(&s.sp);
}

/* The instance a sidecar's log says it took ("probes instance=NAME socket=…"), into name. */
static void logged_instance(const struct sidecar_proc *sp, char *name, size_t cap)
{
	char *log = slurp(sp->log);
	cr_assert_not_null(log);
	const char *at = strstr(log, "probes instance=");
	cr_assert_not_null(at, "the log names no probe instance: %s", log);
	at += strlen("probes instance=");
	size_t n = strcspn(at, " \n");
	cr_assert_lt(n, cap);
	memcpy(name, at, n);
	name[n] = '\0';
	free(log);
}

Test(serve_probes, two_sidecars_without_probes_instance_take_one_instance_each)
{
	struct sidecar_proc sp[2];
	char model[2][160], name[2][80];
	for (int i = 0; i < 2; i++) {
		memset(&sp[i], 0, sizeof(sp[i]));
		harness_tempdir(&sp[i]); /* each its own <dir>/run/sidecar.sock */
		snprintf(model[i], sizeof(model[i]), "%s/model.gguf", sp[i].dir);
		cr_assert_eq(ref_generate(model[i], "q8_0", 7), 0);
		const char *const extra[] = {model[i], NULL};
		int st = 0;
		if (sidecar_start(&sp[i], extra, &st) != 0) {
			char *log = slurp(sp[i].log);
			cr_assert_fail("sidecar %d did not start (0x%x): %s", i, st, log ?: "");
		}
		logged_instance(&sp[i], name[i], sizeof(name[i]));
		cr_expect_eq(strncmp(name[i], "sock-", 5), 0, "sidecar %d on %s took '%s'", i,
		             sp[i].socket, name[i]);
	}
	cr_expect_str_neq(name[0], name[1], "sockets %s and %s share instance %s", sp[0].socket,
	                  sp[1].socket, name[0]);
	/* With privileges, both are active, each in its own directory, and neither met the other
	 * ("… is in use by pid N"); a clean stop removes each one's own. */
	const bool root = geteuid() == 0;
	for (int i = 0; i < 2; i++) {
		char dir[sizeof(PIN_ROOT) + 80];
		snprintf(dir, sizeof(dir), PIN_ROOT "/%.79s", name[i]);
		cr_expect_eq(log_count(&sp[i], "in use by pid"), 0,
		             "sidecar %d met another's instance", i);
		struct stat st;
		if (root && log_count(&sp[i], "probes active") > 0)
			cr_expect_eq(stat(dir, &st), 0, "%s is pinned while serving", dir);
	}
	for (int i = 0; i < 2; i++) {
		int st = sidecar_stop(&sp[i], SIGTERM);
		cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sidecar %d exit status 0x%x", i,
		          st);
		char dir[sizeof(PIN_ROOT) + 80];
		snprintf(dir, sizeof(dir), PIN_ROOT "/%.79s", name[i]);
		struct stat sb;
		cr_expect_neq(stat(dir, &sb), 0, "%s is left behind after a clean stop", dir);
		sidecar_cleanup(&sp[i]);
	}
}
