/* test_doctor.c — `moe-sidecar doctor` on this machine's real state, and under conditions
 * faked where the real one cannot be changed: RLIMIT_MEMLOCK lowered (and CAP_IPC_LOCK
 * dropped) in the child before exec, a model on a tmpfs (or ramfs) without O_DIRECT, a
 * missing bpffs (the test-hooks daemon's --debug-bpffs). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const char *const check_names[] = {"io_uring", "o_direct", "memlock", "huge_pages", "numa",
                                          "memory",   "probes",   "isa",     "read_rate"};
#define N_CHECKS (sizeof(check_names) / sizeof(check_names[0]))

struct child_setup {
	rlim_t memlock; /* 0: unchanged */
	bool one_cpu;   /* the child runs with the affinity of `cpu` alone (taskset -c CPU) */
	int cpu;
};

/* In the child, before the exec: the limit and affinity setup asks for. */
static void apply_setup(const void *arg)
{
	const struct child_setup *setup = arg;
	if (setup->memlock) {
		struct rlimit lim = {setup->memlock, setup->memlock};
		/* root keeps CAP_IPC_LOCK across exec unless the bounding set loses it */
		if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0 ||
		    prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0) != 0)
			_exit(126);
	}
	if (setup->one_cpu) {
		cpu_set_t one;
		CPU_ZERO(&one);
		CPU_SET(setup->cpu, &one);
		if (sched_setaffinity(0, sizeof(one), &one) != 0)
			_exit(125);
	}
}

/* Runs argv (with setup, if any) into out; returns the exit status (-1: no exit). */
static int doctor_run(const char *const *argv, const struct child_setup *setup, char *out,
                      size_t cap)
{
	const int rc = run_capture(argv, setup ? apply_setup : NULL, setup, out, cap);
	cr_assert_neq(rc, -2, "%s: could not be started", argv[0]);
	return rc;
}

/* A small OLMoE-shaped GGUF at dir/m.gguf (2 MoE layers of 8 experts: about 2 MiB). */
static void make_model(const char *dir, char *path, size_t len)
{
	static char out[4096];
	snprintf(path, len, "%s/m.gguf", dir);
	const char *gen[] = {MOE_GEN_BIN, "--preset", "olmoe", "--layers", "2",
	                     "--hidden",  "256",      "--ffn", "128",      "--experts",
	                     "8",         "--quiet",  "--out", path,       NULL};
	cr_assert_eq(doctor_run(gen, NULL, out, sizeof(out)), 0, "%s", out);
}

/* The line of check `name` in text output ("STATE  NAME  found  -> fix"), NUL-terminated
 * into line. */
static bool check_line(const char *out, const char *name, char *line, size_t len)
{
	for (const char *l = out; *l;) {
		const char *end = strchr(l, '\n');
		size_t n = end ? (size_t)(end - l) : strlen(l);
		char state[8], got[32];
		if (sscanf(l, "%7s %31s", state, got) == 2 && !strcmp(got, name)) {
			snprintf(line, len, "%.*s", (int)n, l);
			return true;
		}
		l += n + (end ? 1 : 0);
	}
	return false;
}

static void rm_rf(const char *dir)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_expect_eq(system(cmd), 0);
}

/* Every check prints one line naming its state; the exit status is 1 exactly when one
 * fails; --json carries the same checks in the same states. */
Test(doctor, real_state_one_line_per_check_and_exit_status_follows_fails)
{
	static char text[16384], json[16384];
	char dir[] = "/var/tmp/moe-doctor-XXXXXX", model[128];
	cr_assert_not_null(mkdtemp(dir));
	make_model(dir, model, sizeof(model));
	const char *argv[] = {MOE_SIDECAR_BIN, "doctor", model, NULL};
	const int rc = doctor_run(argv, NULL, text, sizeof(text));
	bool any_fail = false;
	for (size_t i = 0; i < N_CHECKS + 1; i++) {
		const char *name = i < N_CHECKS ? check_names[i] : "model";
		char line[2048];
		cr_assert(check_line(text, name, line, sizeof(line)), "no '%s' line: %s", name,
		          text);
		const bool ok = !strncmp(line, "ok ", 3), warn = !strncmp(line, "warn ", 5),
		           fail = !strncmp(line, "fail ", 5);
		cr_expect(ok || warn || fail, "%s", line);
		cr_expect_eq(!ok, strstr(line, " -> ") != NULL, "a fix exactly when not ok: %s",
		             line);
		any_fail |= fail;
	}
	cr_expect_eq(rc, any_fail ? 1 : 0, "%s", text);
	/* This machine (the project's CI) has io_uring, O_DIRECT on its disk and the ISA. */
	cr_expect(strstr(text, "ok    io_uring    kernel.io_uring_disabled=0; a ring opens") ||
	              strstr(text, "ok    io_uring    no kernel.io_uring_disabled"),
	          "%s", text);
	cr_expect(strstr(text, "O_DIRECT opens, alignment "), "%s", text);
	cr_expect(strstr(text, "MB/s: "), "%s", text);
	cr_expect(strstr(text, "auto's budget holds every one: all resident"), "%s", text);

	const char *jargv[] = {MOE_SIDECAR_BIN, "doctor", model, "--json", NULL};
	cr_expect_eq(doctor_run(jargv, NULL, json, sizeof(json)), rc, "%s", json);
	char want[256];
	snprintf(want, sizeof(want), "{\"model\":\"%s\",\"state\":", model);
	cr_expect_eq(strncmp(json, want, strlen(want)), 0, "%s", json);
	for (size_t i = 0; i < N_CHECKS; i++) {
		snprintf(want, sizeof(want), "{\"name\":\"%s\",\"state\":\"", check_names[i]);
		cr_expect(strstr(json, want), "no %s in %s", check_names[i], json);
	}
	rm_rf(dir);
}

/* Without a MODEL: the machine checks only, the O_DIRECT sample from a temporary file in
 * --dir that is gone afterwards. */
Test(doctor, without_a_model_samples_a_temporary_file_and_removes_it)
{
	static char out[16384];
	char dir[] = "/var/tmp/moe-doctor-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	const char *argv[] = {MOE_SIDECAR_BIN, "doctor", "--dir", dir, NULL};
	doctor_run(argv, NULL, out, sizeof(out));
	char line[2048], want[256];
	cr_assert(check_line(out, "read_rate", line, sizeof(line)), "%s", out);
	snprintf(want, sizeof(want), "from a temporary file in %s", dir);
	cr_expect(strstr(line, want), "%s", line);
	cr_expect_not(check_line(out, "model", line, sizeof(line)), "%s", out);
	cr_expect_eq(rmdir(dir), 0, "doctor left a file in %s", dir); /* empty again */
}

/* Under taskset -c CPU the numa check counts the CPUs of that affinity and the workers the
 * pools would run on them (before, it counted the node's: "node 0: 2 CPUs", 2 workers), and
 * says how to widen it. */
Test(doctor, numa_follows_the_process_affinity)
{
	static char out[16384];
	cpu_set_t all;
	cr_assert_eq(sched_getaffinity(0, sizeof(all), &all), 0);
	if (CPU_COUNT(&all) < 2)
		cr_skip_test("needs two CPUs to leave one out (%d here)", CPU_COUNT(&all));
	struct child_setup setup = {.one_cpu = true};
	while (!CPU_ISSET(setup.cpu, &all))
		setup.cpu++;
	char dir[] = "/var/tmp/moe-doctor-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	const char *argv[] = {MOE_SIDECAR_BIN, "doctor", "--dir", dir, NULL};
	doctor_run(argv, &setup, out, sizeof(out));
	rm_rf(dir);
	char line[2048];
	cr_assert(check_line(out, "numa", line, sizeof(line)), "%s", out);
	if (!strstr(line, " 1 NUMA node ("))
		cr_skip_test("a one-node machine is needed: %s", line);
	cr_expect(strstr(line, "(node 0: 1 CPUs); this process may use 1 of "), "%s", line);
	cr_expect(strstr(line, "the pools would run 1 workers"), "%s", line);
	cr_expect(strstr(line, "-> the pools use only these CPUs") && strstr(line, "taskset -c"),
	          "%s", line);
}

/* The probes check says which capabilities loading needs and that CAP_SYS_ADMIN only mounts
 * (it listed the three alike). */
Test(doctor, probes_says_cap_sys_admin_only_mounts)
{
	static char out[16384];
	char dir[] = "/var/tmp/moe-doctor-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	const char *argv[] = {MOE_SIDECAR_BIN, "doctor", "--dir", dir, NULL};
	doctor_run(argv, NULL, out, sizeof(out));
	rm_rf(dir);
	char line[2048];
	cr_assert(check_line(out, "probes", line, sizeof(line)), "%s", out);
	cr_expect(strstr(line, "(both needed); CAP_SYS_ADMIN ") &&
	              strstr(line, " (only to mount bpffs or tracefs)"),
	          "%s", line);
}

/* RLIMIT_MEMLOCK below the pool's registered buffers, without CAP_IPC_LOCK: a warning
 * naming the limit and the fix; serving still runs (plain reads), so no failure. */
Test(doctor, memlock_below_the_registered_buffers_warns)
{
	if (geteuid() != 0)
		cr_skip_test("dropping CAP_IPC_LOCK from the bounding set needs root");
	static char out[16384];
	char dir[] = "/var/tmp/moe-doctor-XXXXXX", model[128];
	cr_assert_not_null(mkdtemp(dir));
	make_model(dir, model, sizeof(model));
	const char *argv[] = {MOE_SIDECAR_BIN, "doctor", model, NULL};
	const struct child_setup low = {.memlock = 64 << 10};
	const int rc = doctor_run(argv, &low, out, sizeof(out));
	char line[2048];
	cr_assert(check_line(out, "memlock", line, sizeof(line)), "%s", out);
	cr_expect(strstr(line, "warn  memlock     RLIMIT_MEMLOCK 64 KiB; the pool's registered "
	                       "buffers: 2.0 MiB"),
	          "%s", line);
	cr_expect(strstr(line, "-> the slots would be read with plain reads, not fixed buffers: "
	                       "raise the limit (ulimit -l unlimited"),
	          "%s", line);
	cr_expect_not(strstr(out, "\nfail "), "%s", out);
	cr_expect_eq(rc, 0, "%s", out);
	rm_rf(dir);
}

/* Mounts fstype at dir and writes the model there; true when O_DIRECT is refused on it. */
static bool model_without_o_direct(const char *dir, const char *fstype, char *model, size_t len)
{
	cr_assert_eq(mount(fstype, dir, fstype, 0, "size=16m"), 0, "mount -t %s: %s", fstype,
	             strerror(errno));
	make_model(dir, model, len);
	int fd = open(model, O_RDONLY | O_DIRECT);
	if (fd < 0 && errno == EINVAL)
		return true;
	if (fd >= 0)
		close(fd);
	cr_assert_eq(umount(dir), 0);
	return false;
}

/* A model on a filesystem without O_DIRECT (tmpfs before Linux 6.6; ramfs, which never had
 * it, where tmpfs takes it): the loader would go through the page cache, so a failure with
 * the filesystem named, no read sample, exit status 1. */
Test(doctor, model_without_o_direct_fails)
{
	if (geteuid() != 0)
		cr_skip_test("mounting a tmpfs or ramfs needs root");
	char dir[] = "/tmp/moe-doctor-fs-XXXXXX", model[128];
	cr_assert_not_null(mkdtemp(dir));
	const char *fstype = "tmpfs";
	if (!model_without_o_direct(dir, fstype, model, sizeof(model))) {
		fstype = "ramfs"; /* this kernel's tmpfs takes O_DIRECT */
		cr_assert(model_without_o_direct(dir, fstype, model, sizeof(model)),
		          "ramfs takes O_DIRECT here too");
	}
	static char out[16384];
	const char *argv[] = {MOE_SIDECAR_BIN, "doctor", model, NULL};
	const int rc = doctor_run(argv, NULL, out, sizeof(out));
	char line[2048], want[256];
	cr_assert(check_line(out, "o_direct", line, sizeof(line)), "%s", out);
	snprintf(want, sizeof(want),
	         "fail  o_direct    the model's files (%s): O_DIRECT refused (EINVAL) for 1 of 1 "
	         "file, e.g. %s",
	         fstype, model);
	cr_expect(strstr(line, want), "want '%s' in: %s", want, line);
	cr_expect(strstr(line, "-> move the model to a filesystem with direct I/O"), "%s", line);
	cr_assert(check_line(out, "read_rate", line, sizeof(line)), "%s", out);
	cr_expect(strstr(line, "warn  read_rate   not measured: O_DIRECT refused"), "%s", line);
	cr_expect_eq(rc, 1, "%s", out);
	cr_expect(strstr(out, "doctor: serving would not run well here"), "%s", out);
	cr_expect_eq(umount(dir), 0);
	cr_expect_eq(rmdir(dir), 0);
}

/* bpffs missing where the probes pin: the probes check warns with the mount command. The
 * option exists in the test-hooks daemon only. */
Test(doctor, missing_bpffs_warns_with_the_mount_command)
{
	static char out[16384];
	const char *shipped[] = {MOE_SIDECAR_BIN, "doctor", "--debug-bpffs", "/x", NULL};
	cr_expect_eq(doctor_run(shipped, NULL, out, sizeof(out)), 2, "%s", out);
	cr_expect(strstr(out, "unexpected argument '--debug-bpffs'"), "%s", out);
#ifndef MOE_SIDECAR_TESTHOOKS_BIN
	cr_skip_test("built without MOE_TEST_HOOKS");
#else
	char dir[] = "/var/tmp/moe-doctor-XXXXXX", missing[128];
	cr_assert_not_null(mkdtemp(dir));
	snprintf(missing, sizeof(missing), "%s/no-bpffs", dir);
	const char *argv[] = {MOE_SIDECAR_TESTHOOKS_BIN, "doctor", "--dir", dir,
	                      "--debug-bpffs",           missing,  NULL};
	doctor_run(argv, NULL, out, sizeof(out));
	char line[2048], want[512];
	cr_assert(check_line(out, "probes", line, sizeof(line)), "%s", out);
	snprintf(want, sizeof(want), "bpffs not mounted at %s;", missing);
	cr_expect(strstr(line, want), "%s", line);
	cr_expect_eq(strncmp(line, "warn  probes", 12), 0, "%s", line);
	if (!strstr(line, "BPF programs load; BTF present;")) { /* an earlier reason leads */
		rm_rf(dir);
		cr_skip_test("the probes cannot load here: %s", line);
	}
	snprintf(want, sizeof(want),
	         "-> serve runs without page-cache proof (--require-probes would refuse): %s: No "
	         "such file or directory: create it and mount bpf there (mount -t bpf bpf %s)",
	         missing, missing);
	cr_expect(strstr(line, want), "%s", line);
	rm_rf(dir);
#endif
}
