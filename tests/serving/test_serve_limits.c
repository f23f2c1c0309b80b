/* test_serve_limits.c — a real sidecar at the edges of its memory: budgets of fewer expert slots
 * than MoE layers (served, slower, never hung), budgets that cannot serve (refused at start with
 * the smallest that can), the memory limit read from the cgroup and MemAvailable (on fake
 * /proc and /sys trees), a channel past the limit refused at the handshake, a sidecar started
 * with the default budget under a cgroup v1 memory limit smaller than its model, a --mem-limit
 * above that limit (lowered to it) and one below what the process holds (refused).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memlimit.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "serve_fixture.h"

/* One expert of the reference model in Q8_0: gate, up and down, 34 bytes per 32 weights. */
#define Q8_0_EXPERT_BYTES (3ull * REF_FFN * REF_HIDDEN / 32 * 34)

/* A budget of exactly `slots` slots: each slot holds an expert's three extents, each read as
 * its 4 KiB-aligned superset (at most two pages more), so slots × (expert + 6 pages) holds
 * `slots` slots and not one more while the expert is larger than 6 × slots pages. */
static void budget_of_slots(char *buf, size_t len, unsigned slots)
{
	snprintf(buf, len, "%llu", (unsigned long long)(slots * (Q8_0_EXPERT_BYTES + 6 * 4096)));
}

static float *rows(uint32_t n_tokens)
{
	float *p = calloc((size_t)n_tokens * REF_HIDDEN, sizeof(float));
	cr_assert_not_null(p);
	return p;
}

/* fc through the sidecar equals the oracle's immediate part bit for bit; the oracle's deferred
 * part goes to def_out (k_defer > 0). */
static void expect_exact(struct served *s, const struct fwd_case *fc, const float *deferred_in,
                         float *def_out, const char *what)
{
	const size_t n = (size_t)fc->n_tokens * REF_HIDDEN;
	float *got = rows(fc->n_tokens), *want = rows(fc->n_tokens);
	struct moe_completion done;
	int st = served_forward(s, fc, got, &done);
	cr_assert_eq(st, MOE_OK, "%s: %s (value %u index %u)", what, moe_strerror(st), done.value,
	             done.index);
	cr_assert_eq(ref_forward(s->ref, fc->layer, fc->n_tokens, fc->k, fc->k_defer, fc->x_wire,
	                         fc->in_dtype, fc->ids, fc->weights, deferred_in, want,
	                         fc->k_defer ? def_out : NULL),
	             MOE_OK);
	cr_assert_eq(memcmp(got, want, n * sizeof(float)), 0, "%s: output differs from the oracle",
	             what);
	free(got);
	free(want);
}

/* Three MoE layers on one or two slots under the default heat+layer: layer 2's share of the
 * slots is 0 (and layer 1's with one slot). Every layer is served, alone and as a decode step
 * whose deferred expert is still held by the previous layer's wave; after the client leaves, a
 * new one is served and SIGTERM stops the sidecar cleanly. (A FORWARD of a layer with a share
 * of 0 used to wait forever, and the control thread with it once its client left.) */
Test(serve_limits, fewer_slots_than_layers_are_served)
{
	for (unsigned slots = 1; slots <= 2; slots++) {
		char budget[32];
		budget_of_slots(budget, sizeof(budget), slots);
		const char *extra[] = {"--mem-budget", budget, NULL};
		struct served s;
		served_start(&s, "q8_0", extra);
		cr_assert_eq(ref_expert_bytes(s.ref), Q8_0_EXPERT_BYTES * REF_LAYERS * REF_EXPERTS);
		/* the start says the pool cannot hold a decode step, and what hit rate that
		 * allows */
		char *log = slurp(s.sp.log), bound[128];
		snprintf(bound, sizeof(bound), "holds %u expert slots, fewer than one decode step",
		         slots);
		cr_assert(log && strstr(log, bound) && strstr(log, "expect a hit rate of at most"),
		          "%s", log ? log : "(no log)");
		free(log);
		const uint32_t ne = ref_n_experts(s.ref), k = ref_top_k(s.ref);
		for (int32_t layer = REF_LAYERS - 1; layer >= 0; layer--) {
			struct fwd_case fc;
			fwd_case_make(&fc, 100 + (uint64_t)layer, layer, 2, k, ne, REF_HIDDEN,
			              false);
			char what[64];
			snprintf(what, sizeof(what), "%u slot(s), layer %d alone", slots, layer);
			expect_exact(&s, &fc, NULL, NULL, what);
			fwd_case_free(&fc);
		}
		/* A decode step: each layer defers one expert into the next. */
		float *def = rows(1), *next_def = rows(1);
		for (int32_t layer = 0; layer < (int32_t)REF_LAYERS; layer++) {
			struct fwd_case fc;
			fwd_case_make(&fc, 200 + (uint64_t)layer, layer, 1, k, ne, REF_HIDDEN,
			              false);
			fc.k_defer = layer + 1 < (int32_t)REF_LAYERS ? 1 : 0;
			char what[64];
			snprintf(what, sizeof(what), "%u slot(s), decode layer %d", slots, layer);
			expect_exact(&s, &fc, layer ? def : NULL, next_def, what);
			float *t = def;
			def = next_def;
			next_def = t;
			fwd_case_free(&fc);
		}
		/* Every entry deferred, its expert resident: the deferred wave left running
		 * holds it when the next layer must wait for a slot (the only one, with one). */
		for (int32_t layer = 0; layer < 2; layer++) {
			struct fwd_case fc;
			fwd_case_make(&fc, 400 + (uint64_t)layer, layer, 1, 1, ne, REF_HIDDEN,
			              false);
			fc.ids[0] = 5 + layer;
			if (layer == 0) { /* resident first, then deferred */
				expect_exact(&s, &fc, NULL, NULL, "layer 0, expert 5");
				fc.k_defer = 1;
			}
			char what[64];
			snprintf(what, sizeof(what), "%u slot(s), layer %d all deferred", slots,
			         layer);
			expect_exact(&s, &fc, layer ? def : NULL, next_def, what);
			float *t = def;
			def = next_def;
			next_def = t;
			fwd_case_free(&fc);
		}
		free(def);
		free(next_def);
		/* The client goes; the next one is accepted and served. */
		moe_close(s.c);
		struct moe_connect_opts o = {.socket_path = s.sp.socket, .max_tokens = 64};
		cr_assert_eq(moe_connect(&o, &s.c), MOE_OK, "reconnect: %s", moe_connect_error());
		struct fwd_case fc;
		fwd_case_make(&fc, 300, REF_LAYERS - 1, 1, k, ne, REF_HIDDEN, false);
		expect_exact(&s, &fc, NULL, NULL, "after a reconnect");
		fwd_case_free(&fc);
		served_stop(&s); /* SIGTERM; asserts a clean exit */
	}
}

/* Pinned layers that leave no slot for the others cannot serve: refused at start, saying the
 * smallest budget that can; so is a budget the memory limit cannot hold, saying what fits. */
Test(serve_limits, a_budget_that_cannot_serve_is_refused_with_the_minimum)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char model[160], budget[32];
	snprintf(model, sizeof(model), "%s/model.gguf", sp.dir);
	cr_assert_eq(ref_generate(model, "q8_0", 7), 0);
	budget_of_slots(budget, sizeof(budget), REF_EXPERTS); /* exactly layer 0 */
	char instance[64];
	snprintf(instance, sizeof(instance), "test-limits-%d", (int)getpid());
	const char *argv[] = {model,  "--pin-layers",      "1",      "--mem-budget",
	                      budget, "--probes-instance", instance, NULL};
	int st = 0;
	cr_assert_neq(sidecar_start(&sp, argv, &st), 0, "a budget without a free slot started");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit status 0x%x", st);
	char *log = slurp(sp.log);
	char smallest[96]; /* 16 slots for layer 0 and one for the others, as the pool sizes
	                      them: the largest expert's extents, each 4 KiB-aligned */
	snprintf(smallest, sizeof(smallest), "the smallest budget that serves this policy is %llu",
	         (unsigned long long)(REF_EXPERTS + 1) * 221184);
	cr_assert(log && strstr(log, "the other layers one more") && strstr(log, smallest) &&
	              !strstr(log, "raise the limit"),
	          "%s", log ? log : "(no log)");
	free(log);
	sidecar_cleanup(&sp);
	/* A budget asked for that the memory limit cannot hold beside the request buffers. */
	harness_tempdir(&sp);
	snprintf(model, sizeof(model), "%s/model.gguf", sp.dir);
	cr_assert_eq(ref_generate(model, "q8_0", 7), 0);
	const char *argv2[] = {model,  "--mem-limit",       "40M",    "--mem-budget",
	                       "100%", "--probes-instance", instance, NULL};
	cr_assert_neq(sidecar_start(&sp, argv2, &st), 0, "a budget past the limit started");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit status 0x%x", st);
	log = slurp(sp.log);
	/* Every expert, or (a sanitizer build holding more before the model) the request
	 * buffers alone, do not fit: either way the error says what the engine may use. */
	cr_assert(log && strstr(log, "bytes the engine may use") && strstr(log, "(--mem-limit)") &&
	              strstr(log, "raise the limit"),
	          "%s", log ? log : "(no log)");
	free(log);
	sidecar_cleanup(&sp);
	/* A budget above the machine's physical memory, named with MemTotal. */
	harness_tempdir(&sp);
	snprintf(model, sizeof(model), "%s/model.gguf", sp.dir);
	cr_assert_eq(ref_generate(model, "q8_0", 7), 0);
	const char *argv3[] = {model, "--mem-budget", "64T", "--probes-instance", instance, NULL};
	cr_assert_neq(sidecar_start(&sp, argv3, &st), 0, "a budget above MemTotal started");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit status 0x%x", st);
	log = slurp(sp.log);
	cr_assert(log && strstr(log, "--mem-budget 70368744177664 bytes (65536.0 GiB) is above "
	                             "this machine's physical memory, MemTotal"),
	          "%s", log ? log : "(no log)");
	free(log);
	sidecar_cleanup(&sp);
}

/* A --mem-limit at or below what the process already holds leaves the engine nothing: refused
 * at start with the sentence every limit too small for the request buffers gets. (1M and 3M
 * used to leave the engine "0 bytes", which the engine reads as no limit: every expert was
 * loaded, "limit_bytes=1048576 left_for_channels=0", and under a cgroup the kernel killed it.) */
Test(serve_limits, a_limit_below_what_the_process_holds_is_refused)
{
	const char *limits[] = {"1M", "3M"};
	for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
		struct sidecar_proc sp;
		harness_tempdir(&sp);
		char model[160], instance[64];
		snprintf(model, sizeof(model), "%s/model.gguf", sp.dir);
		cr_assert_eq(ref_generate(model, "q8_0", 7), 0);
		snprintf(instance, sizeof(instance), "test-limits-%d", (int)getpid());
		const char *argv[] = {model,    "--mem-limit", limits[i], "--probes-instance",
		                      instance, NULL};
		int st = 0;
		const int started = sidecar_start(&sp, argv, &st);
		char *log = slurp(sp.log);
		cr_assert_neq(started, 0, "--mem-limit %s started: %s", limits[i], log ? log : "");
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "--mem-limit %s: exit status 0x%x",
		          limits[i], st);
		char said[128];
		snprintf(said, sizeof(said),
		         "the engine may use the memory limit of %llu bytes "
		         "(--mem-limit) less ",
		         (unsigned long long)(i == 0 ? 1u << 20 : 3u << 20));
		cr_assert(log && strstr(log, "bytes the engine may use; ") && strstr(log, said) &&
		              strstr(log, "raise the limit (--mem-limit, the cgroup's)") &&
		              !strstr(log, "left_for_channels"),
		          "--mem-limit %s: %s", limits[i], log ? log : "(no log)");
		free(log);
		sidecar_cleanup(&sp);
	}
}

/* ---- the memory limit ------------------------------------------------------------------ */

static void put_file(const char *root, const char *rel, const char *text)
{
	char path[512];
	mkdir(root, 0755);
	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		mkdir(path, 0755);
		*p = '/';
	}
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs(text, f);
	fclose(f);
}

/* cgroup v1 as on these VMs (the memory hierarchy mounted on its own, the process deep in
 * it, the tightest limit an ancestor's), v2 ("max" below a parent's limit), and none. */
Test(serve_limits, memory_limit_from_cgroup_v1_v2_and_meminfo)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char root[96];
	snprintf(root, sizeof(root), "%s/v1", sp.dir);
	put_file(root, "proc/meminfo", "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n");
	put_file(root, "proc/self/cgroup",
	         "9:name=systemd:/\n4:memory:/job/task\n3:cpuset:/\n0::/\n");
	put_file(root, "proc/self/mountinfo",
	         "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
	         "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
	         "36 31 0:33 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
	put_file(root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
	put_file(root, "sys/fs/cgroup/memory/job/memory.limit_in_bytes", "41943040\n");
	put_file(root, "sys/fs/cgroup/memory/job/task/memory.limit_in_bytes", "104857600\n");
	struct mem_limit ml;
	mem_limit_read(root, &ml);
	cr_assert_eq(ml.cgroup_bytes, 40u << 20, "%llu", (unsigned long long)ml.cgroup_bytes);
	cr_assert_eq(ml.bytes, 40u << 20);
	cr_assert_eq(ml.available_bytes, 4000000ull * 1024);
	cr_assert_str_eq(ml.from, "cgroup v1 memory.limit_in_bytes");
	cr_assert_str_eq(ml.cgroup_file, "/sys/fs/cgroup/memory/job/memory.limit_in_bytes");
	/* --mem-limit: a cap under the cgroup's limit, lowered to it when above */
	cr_assert(mem_limit_cap(&ml, 1ull << 30), "1 GiB above a 40 MiB cgroup is lowered");
	cr_assert_eq(ml.bytes, 40u << 20);
	cr_assert_str_eq(ml.from, "cgroup v1 memory.limit_in_bytes");
	cr_assert_not(mem_limit_cap(&ml, 10u << 20), "10 MiB under the cgroup's is kept");
	cr_assert_eq(ml.bytes, 10u << 20);
	cr_assert_str_eq(ml.from, "--mem-limit");

	snprintf(root, sizeof(root), "%s/v2", sp.dir);
	put_file(root, "proc/meminfo", "MemAvailable: 30000 kB\n");
	put_file(root, "proc/self/cgroup", "0::/app/worker\n");
	put_file(root, "proc/self/mountinfo",
	         "25 1 0:23 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
	put_file(root, "sys/fs/cgroup/app/memory.max", "209715200\n");
	put_file(root, "sys/fs/cgroup/app/worker/memory.max", "max\n");
	mem_limit_read(root, &ml);
	cr_assert_eq(ml.cgroup_bytes, 200u << 20);
	cr_assert_eq(ml.bytes, 200u << 20, "MemAvailable alone is no limit");
	cr_assert_eq(ml.host_bytes, 0, "no MemTotal: the host's figure is unknown");
	cr_assert_str_eq(ml.from, "cgroup v2 memory.max");

	/* The host's figure: MemTotal less other processes' anonymous and shared memory, the
	 * kernel's unreclaimable memory and 2% headroom — not MemAvailable, which a full page
	 * cache (Cached 12 GiB here) holds down. */
	snprintf(root, sizeof(root), "%s/host", sp.dir);
	put_file(root, "proc/meminfo",
	         "MemTotal: 16777216 kB\nMemFree: 300000 kB\nMemAvailable: 2097152 kB\n"
	         "Cached: 12582912 kB\nAnonPages: 3145728 kB\nShmem: 1048576 kB\n"
	         "SUnreclaim: 102400 kB\nKernelStack: 20480 kB\nPageTables: 81920 kB\n");
	put_file(root, "proc/self/status", "Name: moe\nRssAnon: 1048576 kB\nRssShmem: 0 kB\n");
	put_file(root, "proc/self/cgroup", "0::/\n");
	put_file(root, "proc/self/mountinfo",
	         "25 1 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
	mem_limit_read(root, &ml);
	const uint64_t total = 16ull << 30, others = 3ull << 30,
	               kernel = (102400ull + 20480 + 81920) * 1024, headroom = total / 50;
	cr_assert_eq(ml.total_bytes, total);
	cr_assert_eq(ml.others_bytes, others, "%llu", (unsigned long long)ml.others_bytes);
	cr_assert_eq(ml.kernel_bytes, kernel);
	cr_assert_eq(ml.headroom_bytes, headroom);
	cr_assert_eq(ml.host_bytes, total - others - kernel - headroom);
	cr_assert_eq(ml.bytes, ml.host_bytes);
	cr_assert_gt(ml.bytes, ml.available_bytes);
	cr_assert_str_eq(ml.from, "MemTotal less others' unreclaimable memory");
	/* no cgroup limit: the operator's figure stands, even above the host's estimate */
	cr_assert_not(mem_limit_cap(&ml, 64ull << 30));
	cr_assert_eq(ml.bytes, 64ull << 30);
	cr_assert_str_eq(ml.from, "--mem-limit");

	snprintf(root, sizeof(root), "%s/none", sp.dir);
	put_file(root, "proc/meminfo", "MemTotal: 1048576 kB\nMemAvailable: 1000 kB\n");
	put_file(root, "proc/self/cgroup", "0::/\n");
	put_file(root, "proc/self/mountinfo",
	         "25 1 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
	mem_limit_read(root, &ml);
	cr_assert_eq(ml.cgroup_bytes, 0);
	cr_assert_eq(ml.bytes, (1ull << 30) - (256ull << 20),
	             "1 GiB less the 256 MiB floor of the headroom");
	sidecar_cleanup(&sp);
}

/* With a stated limit, a client whose channel would take the sidecar past it is refused at the
 * handshake with the reason; one that fits is served, and STATS accounts for it. The limit is
 * what a first run holds plus 48 MiB (a sanitizer build holds far more than a plain one). */
Test(serve_limits, a_channel_past_the_memory_limit_is_refused)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	char *js = served_stats(&s);
	const int64_t held = json_top_u64(js, "mem_fixed_bytes");
	cr_assert(held > 0, "%s", js);
	free(js);
	served_stop(&s);
	char limit_arg[32];
	const int64_t limit_mib = held / (1 << 20) + 48;
	snprintf(limit_arg, sizeof(limit_arg), "%lldM", (long long)limit_mib);
	const char *extra[] = {"--mem-limit", limit_arg, "--mem-budget", "50%", NULL};
	served_start(&s, "q8_0", extra);
	js = served_stats(&s);
	const int64_t limit = json_top_u64(js, "mem_limit_bytes"),
	              fixed = json_top_u64(js, "mem_fixed_bytes"),
	              channels = json_top_u64(js, "mem_channel_bytes");
	cr_assert_eq(limit, limit_mib << 20, "%s", js);
	cr_assert(fixed > 0 && channels > 0 && fixed + channels <= limit, "%s", js);
	free(js);
	/* 256 slots of 256 tokens: 128 MiB of channel, above the whole limit. */
	struct moe_connect_opts big = {.socket_path = s.sp.socket,
	                               .max_tokens = 256,
	                               .n_slots = 256,
	                               .client_name = "too big"};
	struct moe_client *c;
	cr_assert_eq(moe_connect(&big, &c), MOE_EREFUSED);
	const char *why = moe_connect_error();
	char of[48];
	snprintf(of, sizeof(of), " of %lld MiB left under", (long long)limit_mib);
	cr_assert(strstr(why, "channel needs 133 MiB") && strstr(why, of) &&
	              strstr(why, "(--mem-limit)") && strstr(why, "fewer slots or tokens"),
	          "%s", why);
	cr_assert(log_count(&s.sp, "refused client") == 1);
	/* A small one is accepted next to ours. */
	struct moe_connect_opts small = {.socket_path = s.sp.socket, .max_tokens = 4, .n_slots = 2};
	cr_assert_eq(moe_connect(&small, &c), MOE_OK, "%s", moe_connect_error());
	moe_close(c);
	struct fwd_case fc;
	fwd_case_make(&fc, 500, 0, 2, 4, ref_n_experts(s.ref), REF_HIDDEN, false);
	expect_exact(&s, &fc, NULL, NULL, "after a refusal");
	fwd_case_free(&fc);
	served_stop(&s);
}

/* The memory cgroup v1 directory this process is in, or false with why. */
static bool own_memory_cgroup(char *dir, size_t len, char *why, size_t why_len)
{
	if (geteuid() != 0) {
		snprintf(why, why_len, "not root: cannot make a memory cgroup");
		return false;
	}
	FILE *f = fopen("/proc/self/cgroup", "r");
	char line[512], path[400] = "";
	bool found = false;
	while (f && !found && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		char *c = strstr(line, ":memory:");
		if (c) {
			snprintf(path, sizeof(path), "%s", c + 8);
			found = true;
		}
	}
	if (f)
		fclose(f);
	if (!found || access("/sys/fs/cgroup/memory/cgroup.procs", W_OK) != 0) {
		snprintf(why, why_len, "no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory");
		return false;
	}
	snprintf(dir, len, "/sys/fs/cgroup/memory%s", strcmp(path, "/") ? path : "");
	return true;
}

static bool write_text(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	bool ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
	close(fd);
	return ok;
}

/* A memory cgroup v1 below this process's, limited to `limit` bytes, in cg; skips the test
 * when it cannot be made (not root, no v1 memory hierarchy). Removed with rmdir once empty. */
static void memory_cgroup_make(char *cg, size_t len, const char *limit)
{
	char parent[512], why[128], file[700];
	if (!own_memory_cgroup(parent, sizeof(parent), why, sizeof(why)))
		cr_skip_test("%s", why);
	snprintf(cg, len, "%s/moe-test-%d", parent, (int)getpid());
	if (mkdir(cg, 0755) != 0)
		cr_skip_test("cannot create the cgroup %s: %s", cg, strerror(errno));
	snprintf(file, sizeof(file), "%s/memory.limit_in_bytes", cg);
	cr_assert(write_text(file, limit), "%s: %s", file, strerror(errno));
}

/* Whether the cgroup's OOM killer has killed anything (memory.oom_control's oom_kill). */
static bool memory_cgroup_oom_killed(const char *cg)
{
	char file[700];
	snprintf(file, sizeof(file), "%s/memory.oom_control", cg);
	char *oom = slurp(file);
	const bool killed = oom && strstr(oom, "oom_kill ") && !strstr(oom, "oom_kill 0");
	free(oom);
	return killed;
}

/* Under a 64 MiB cgroup v1 memory limit, a model of 102 MiB with the default budget: the
 * sidecar reads the limit, cuts its budget to what fits beside its request buffers, says so,
 * serves exactly, refuses a channel that would not fit, and is never OOM-killed. (It used to
 * size the budget from MemAvailable alone: every expert, and the kernel killed it while it
 * faulted in its slot pool, with no message.) */
Test(serve_limits, default_budget_under_a_cgroup_v1_limit_fits_it)
{
#ifdef MOE_SANITIZED
	cr_skip_test("sanitizer build: its shadow memory alone would pass a 64 MiB memory cgroup");
#endif
	char cg[600], file[700];
	memory_cgroup_make(cg, sizeof(cg), "67108864");

	struct served s;
	memset(&s, 0, sizeof(s));
	harness_tempdir(&s.sp);
	snprintf(s.model, sizeof(s.model), "%s/model.gguf", s.sp.dir);
	struct moe_gen_options o = {.preset = "qwen3-30b-a3b",
	                            .out = s.model,
	                            .format = MOEK_Q8_0,
	                            .seed = 11,
	                            .layers = 4,
	                            .hidden = 512,
	                            .ffn = 512,
	                            .experts = 32};
	struct sidecar_error merr;
	cr_assert_eq(moe_gen_write(&o, &merr), 0, "%s", merr.msg);
	char instance[64];
	snprintf(instance, sizeof(instance), "test-limits-%d", (int)getpid());
	const char *argv[] = {s.model, "--probes-instance", instance, "--max-tokens", "16", NULL};
	snprintf(file, sizeof(file), "%s/cgroup.procs", cg);
	int st = 0;
	if (sidecar_start_in_cgroup(&s.sp, argv, &st, file) != 0) {
		char *log = slurp(s.sp.log);
		sidecar_cleanup(&s.sp);
		rmdir(cg);
		cr_assert_fail("the sidecar did not start under the limit (status 0x%x%s): %s", st,
		               WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL ? ", killed: OOM" : "",
		               log ? log : "");
	}
	cr_assert(log_count(&s.sp, "from=\"cgroup v1 memory.limit_in_bytes\"") == 1,
	          "the limit's source is logged");
	cr_assert(log_count(&s.sp, "expert budget cut to ") == 1, "the cut is logged");
	struct moe_connect_opts co = {.socket_path = s.sp.socket, .max_tokens = 8, .n_slots = 2};
	cr_assert_eq(moe_connect(&co, &s.c), MOE_OK, "%s", moe_connect_error());
	s.ref = ref_open(s.model);
	cr_assert_not_null(s.ref);
	const uint32_t h = ref_hidden(s.ref), ne = ref_n_experts(s.ref);
	for (uint32_t i = 0; i < 8; i++) { /* every layer twice: slots are evicted and reused */
		struct fwd_case fc;
		fwd_case_make(&fc, 600 + i, (int32_t)(i % 4), 4, 8, ne, h, false);
		float *got = calloc((size_t)4 * h, sizeof(float)),
		      *want = calloc((size_t)4 * h, sizeof(float));
		struct moe_completion d;
		cr_assert_eq(served_forward(&s, &fc, got, &d), MOE_OK, "%s",
		             moe_strerror(d.status));
		cr_assert_eq(ref_forward(s.ref, fc.layer, 4, 8, 0, fc.x_wire, fc.in_dtype, fc.ids,
		                         fc.weights, NULL, want, NULL),
		             MOE_OK);
		cr_assert_eq(memcmp(got, want, (size_t)4 * h * sizeof(float)), 0, "forward %u", i);
		free(got);
		free(want);
		fwd_case_free(&fc);
	}
	char *js = served_stats(&s);
	cr_assert_eq(json_top_u64(js, "mem_limit_bytes"), 64 << 20, "%s", js);
	cr_assert(json_top_u64(js, "evictions") > 0, "%s", js);
	free(js);
	/* 16 slots of 16 tokens of 512: 8 MiB; with what is held, past 64 MiB. */
	struct moe_connect_opts big = {
	    .socket_path = s.sp.socket, .max_tokens = 16, .n_slots = 256};
	struct moe_client *c;
	cr_assert_eq(moe_connect(&big, &c), MOE_EREFUSED);
	cr_assert(strstr(moe_connect_error(), "(cgroup v1 memory.limit_in_bytes)"), "%s",
	          moe_connect_error());
	cr_assert_not(memory_cgroup_oom_killed(cg));
	served_stop(&s);
	cr_assert_eq(rmdir(cg), 0, "%s: %s", cg, strerror(errno));
}

/* `--mem-limit 1G` under a 256 MiB cgroup v1 limit, with a model of 320 MiB of experts: the
 * limit in force is the cgroup's (the operator's figure is a cap, the cgroup's is what the
 * kernel enforces), the start says so naming both figures, the budget is cut to fit, the
 * sidecar serves and nothing is OOM-killed. (It used to take the 1G as given: "the engine may
 * use 803008512 bytes", pools filled past the cgroup's limit, killed: exit 137.) */
Test(serve_limits, a_mem_limit_above_the_cgroup_limit_is_lowered_to_it)
{
#ifdef MOE_SANITIZED
	cr_skip_test("sanitizer build: its shadow memory alone would crowd a 256 MiB cgroup");
#endif
	char cg[600], file[700];
	memory_cgroup_make(cg, sizeof(cg), "268435456");
	struct served s;
	memset(&s, 0, sizeof(s));
	harness_tempdir(&s.sp);
	snprintf(s.model, sizeof(s.model), "%s/model.gguf", s.sp.dir);
	struct moe_gen_options o = {.preset = "qwen3-30b-a3b",
	                            .out = s.model,
	                            .format = MOEK_Q8_0,
	                            .seed = 12,
	                            .layers = 6,
	                            .hidden = 512,
	                            .ffn = 1024,
	                            .experts = 32};
	struct sidecar_error merr;
	cr_assert_eq(moe_gen_write(&o, &merr), 0, "%s", merr.msg);
	char instance[64];
	snprintf(instance, sizeof(instance), "test-limits-%d", (int)getpid());
	const char *argv[] = {s.model, "--probes-instance", instance, "--mem-limit",
	                      "1G",    "--max-tokens",      "16",     NULL};
	snprintf(file, sizeof(file), "%s/cgroup.procs", cg);
	int st = 0;
	if (sidecar_start_in_cgroup(&s.sp, argv, &st, file) != 0) {
		char *log = slurp(s.sp.log);
		sidecar_cleanup(&s.sp);
		rmdir(cg);
		cr_assert_fail("the sidecar did not start under the limit (status 0x%x%s): %s", st,
		               WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL ? ", killed: OOM" : "",
		               log ? log : "");
	}
	cr_assert_eq(log_count(&s.sp, "--mem-limit 1073741824 bytes is above the cgroup's memory "
	                              "limit of 268435456 bytes ("),
	             1, "the lowering is a warning naming both figures");
	cr_assert_eq(log_count(&s.sp, "limit_bytes=268435456 from=\"cgroup v1 "
	                              "memory.limit_in_bytes\""),
	             1, "the limit in force is the cgroup's");
	cr_assert_eq(log_count(&s.sp, "expert budget cut to "), 1, "the cut is logged");
	struct moe_connect_opts co = {.socket_path = s.sp.socket, .max_tokens = 8, .n_slots = 2};
	cr_assert_eq(moe_connect(&co, &s.c), MOE_OK, "%s", moe_connect_error());
	s.ref = ref_open(s.model);
	cr_assert_not_null(s.ref);
	const uint32_t h = ref_hidden(s.ref), ne = ref_n_experts(s.ref);
	struct fwd_case fc;
	fwd_case_make(&fc, 700, 5, 4, 8, ne, h, false);
	float *got = calloc((size_t)4 * h, sizeof(float)),
	      *want = calloc((size_t)4 * h, sizeof(float));
	struct moe_completion d;
	cr_assert_eq(served_forward(&s, &fc, got, &d), MOE_OK, "%s", moe_strerror(d.status));
	cr_assert_eq(ref_forward(s.ref, fc.layer, 4, 8, 0, fc.x_wire, fc.in_dtype, fc.ids,
	                         fc.weights, NULL, want, NULL),
	             MOE_OK);
	cr_assert_eq(memcmp(got, want, (size_t)4 * h * sizeof(float)), 0);
	free(got);
	free(want);
	fwd_case_free(&fc);
	char *js = served_stats(&s);
	cr_assert_eq(json_top_u64(js, "mem_limit_bytes"), 256 << 20, "%s", js);
	free(js);
	cr_assert_not(memory_cgroup_oom_killed(cg));
	served_stop(&s);
	cr_assert_eq(rmdir(cg), 0, "%s: %s", cg, strerror(errno));
}
