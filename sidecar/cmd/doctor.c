/* doctor.c — `moe-sidecar doctor [MODEL] [--json]`: what serving needs on this machine, one
 * check per line with what was found and what to change.
 *
 * Every fact comes from the code that serving runs: the memory limit (memlimit.h), the
 * budget serve's `auto` picks (serve_model_plan_budget: the same rule, no engine created),
 * the loader's file open (residency_open_file: O_DIRECT, DIOALIGN), the probes' readiness
 * (pagecache_readiness), the topology the pools would use (forward_topology_describe) and
 * the kernels' ISA. What doctor measures itself is only what serving does not decide on:
 * a ring opening, RLIMIT_MEMLOCK, the huge-page settings and a short O_DIRECT read sample.
 *
 * States: ok; warn (serves, at a cost: buffered slots, no page-cache proof, a budget below
 * one decode step); fail (would not serve, or not as intended: no io_uring, no O_DIRECT,
 * a budget the limit refuses). Exit status 1 when any check fails, else 0; 2 for a usage
 * error. The test-hooks daemon also takes --debug-bpffs DIR (bpffs looked for at DIR), for
 * a test of a missing bpffs.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "caps.h"
#include "catalog.h"
#include "clock.h"
#include "commands.h"
#include "forward.h"
#include "json_writer.h"
#include "log.h"
#include "memlimit.h"
#include "moe_kernels.h"
#include "pagecache.h"
#include "residency.h"
#include "served_model.h"

enum check_state { CHECK_OK, CHECK_WARN, CHECK_FAIL };

static const char *const state_names[] = {"ok", "warn", "fail"};

struct check {
	const char *name;
	enum check_state state;
	char found[1024]; /* what was found, with its figures */
	char fix[320];    /* one sentence: a command or an option ("" when ok) */
};

#define MAX_CHECKS 12u
#define SAMPLE_MAX_BYTES (UINT64_C(64) << 20)  /* the read sample: at most this much … */
#define SAMPLE_MAX_NS UINT64_C(1000000000)     /* … or this long */
#define SAMPLE_READ_BYTES (1u << 20)           /* per read */
#define SAMPLE_TEMP_BYTES (UINT64_C(32) << 20) /* the temporary file without a MODEL */

struct doctor {
	const char *model; /* NULL: the machine only */
	const char *dir;   /* without a MODEL: where the O_DIRECT checks run */
	const char *bpffs; /* where bpffs should be (NULL: /sys/fs/bpf); tests only */
	struct moe_catalog *cat;
	bool have_budget;
	struct serve_model_budget budget;
	char budget_error[sizeof(((struct sidecar_error *)0)->msg)];
	struct mem_limit ml;
	/* the file the O_DIRECT checks and the sample read (a model file or a temporary one) */
	char sample_path[4096];
	bool sample_is_temp;
	struct check checks[MAX_CHECKS];
	unsigned n;
};

__attribute__((format(printf, 3, 4))) static struct check *add(struct doctor *d, const char *name,
                                                               const char *fmt, ...)
{
	assert(d->n < MAX_CHECKS);
	struct check *c = &d->checks[d->n++];
	c->name = name;
	c->state = CHECK_OK;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->found, sizeof(c->found), fmt, ap);
	va_end(ap);
	return c;
}

__attribute__((format(printf, 3, 4))) static void set_fix(struct check *c, enum check_state s,
                                                          const char *fmt, ...)
{
	c->state = s;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->fix, sizeof(c->fix), fmt, ap);
	va_end(ap);
}

static double mib(uint64_t b)
{
	return (double)b / (1u << 20);
}

/* Bytes for people: MiB below 1 GiB, else GiB. Used within one full expression. */
struct bytes_text {
	char s[32];
};
static struct bytes_text human(uint64_t b)
{
	struct bytes_text t;
	if (b < (UINT64_C(1) << 30))
		snprintf(t.s, sizeof(t.s), "%.1f MiB", mib(b));
	else
		snprintf(t.s, sizeof(t.s), "%.2f GiB", (double)b / (1u << 30));
	return t;
}

/* A one-line file's first integer; false when absent or unparsable. */
static bool read_int_file(const char *path, long long *out)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	bool ok = fscanf(f, "%lld", out) == 1;
	fclose(f);
	return ok;
}

/* ---- the checks ------------------------------------------------------------------------- */

/* The loader reads through one io_uring per node: a ring must open. */
static void check_io_uring(struct doctor *d)
{
	long long disabled = 0;
	const bool sysctl = read_int_file("/proc/sys/kernel/io_uring_disabled", &disabled);
	struct io_uring ring;
	const int rc = io_uring_queue_init(8, &ring, 0);
	if (rc == 0)
		io_uring_queue_exit(&ring);
	char setting[64];
	if (sysctl)
		snprintf(setting, sizeof(setting), "kernel.io_uring_disabled=%lld", disabled);
	else
		snprintf(setting, sizeof(setting), "no kernel.io_uring_disabled (all may use it)");
	struct check *c =
	    add(d, "io_uring", "%s; a ring %s%s%s", setting,
	        rc == 0 ? "opens" : "does not open: ", rc == 0 ? "" : strerror(-rc), "");
	if (rc == 0)
		return;
	if (rc == -EPERM && disabled == 1)
		set_fix(c, CHECK_FAIL,
		        "allow this user: sysctl -w kernel.io_uring_group=<its group id>, or "
		        "sysctl -w kernel.io_uring_disabled=0");
	else if (rc == -EPERM || disabled == 2)
		set_fix(c, CHECK_FAIL,
		        "sysctl -w kernel.io_uring_disabled=0 (and lift any seccomp "
		        "filter on io_uring_setup)");
	else if (rc == -ENOMEM)
		set_fix(c, CHECK_FAIL,
		        "the ring's memory counts against RLIMIT_MEMLOCK: raise it (ulimit -l; "
		        "systemd: LimitMEMLOCK=)");
	else
		set_fix(c, CHECK_FAIL, "use a kernel with io_uring (5.19 or later)");
}

static const char *fs_name(long type)
{
	switch ((unsigned long)type) {
	case 0xEF53: return "ext4";
	case 0x58465342: return "xfs";
	case 0x9123683E: return "btrfs";
	case 0x01021994: return "tmpfs";
	case 0x858458f6: return "ramfs";
	case 0x794c7630: return "overlayfs";
	case 0x6969: return "nfs";
	case 0x65735546: return "fuse";
	case 0x2fc12fc1: return "zfs";
	case 0xF2F52010: return "f2fs";
	default: return NULL;
	}
}

/* Without a MODEL: a temporary file of SAMPLE_TEMP_BYTES in dir, written through the page
 * cache and synced (a direct read of it comes from the disk all the same). */
static int make_temp_file(struct doctor *d, char *why, size_t len)
{
	snprintf(d->sample_path, sizeof(d->sample_path), "%s/.moe-doctor-XXXXXX", d->dir);
	int fd = mkstemp(d->sample_path);
	if (fd < 0) {
		snprintf(why, len, "%.300s: cannot create a file there: %s", d->dir,
		         strerror(errno));
		return -1;
	}
	d->sample_is_temp = true;
	char *block = malloc(SAMPLE_READ_BYTES);
	int rc = block ? 0 : -1;
	for (uint64_t i = 0; rc == 0 && i < SAMPLE_TEMP_BYTES / SAMPLE_READ_BYTES; i++) {
		memset(block, (int)(i * 37 + 1), SAMPLE_READ_BYTES);
		if (write(fd, block, SAMPLE_READ_BYTES) != (ssize_t)SAMPLE_READ_BYTES)
			rc = -1;
	}
	if (rc == 0 && fsync(fd) != 0)
		rc = -1;
	if (rc != 0)
		snprintf(why, len, "%.300s: writing %.0f MiB to sample: %s", d->sample_path,
		         mib(SAMPLE_TEMP_BYTES), block ? strerror(errno) : "out of memory");
	free(block);
	close(fd);
	return rc;
}

/* The loader opens every model file as residency_open_file does: O_DIRECT where the
 * filesystem takes it, else buffered through the page cache. */
static void check_o_direct(struct doctor *d, struct residency_file *sample)
{
	sample->fd = -1;
	char why[512];
	if (!d->model && make_temp_file(d, why, sizeof(why)) != 0) {
		struct check *c = add(d, "o_direct", "%s", why);
		set_fix(c, CHECK_FAIL,
		        "give doctor a writable directory on the models' disk: --dir DIR");
		return;
	}
	uint32_t n_files = d->model ? d->cat->n_files : 1, refused = 0, alignment = 0;
	char refused_path[4096] = "";
	for (uint32_t i = 0; i < n_files; i++) {
		const char *path = d->model ? d->cat->files[i].path : d->sample_path;
		struct residency_file rf;
		struct sidecar_error err;
		if (residency_open_file(path, false, &rf, &err) != 0) {
			struct check *c = add(d, "o_direct", "%s", err.msg);
			set_fix(c, CHECK_FAIL, "make the model's files readable by this user");
			if (sample->fd >= 0)
				close(sample->fd);
			sample->fd = -1;
			return;
		}
		if (rf.direct_refused && !refused++)
			snprintf(refused_path, sizeof(refused_path), "%s", path);
		if (rf.alignment > alignment)
			alignment = rf.alignment;
		if (i == 0) { /* the sample reads the first file (a GGUF's only one, a shard) */
			*sample = rf;
			if (path != d->sample_path)
				snprintf(d->sample_path, sizeof(d->sample_path), "%s", path);
		} else {
			close(rf.fd);
		}
	}
	struct statfs fs;
	char fstype[32] = "?";
	if (statfs(d->sample_path, &fs) == 0) {
		const char *name = fs_name((long)fs.f_type);
		if (name)
			snprintf(fstype, sizeof(fstype), "%s", name);
		else
			snprintf(fstype, sizeof(fstype), "0x%lx", (unsigned long)fs.f_type);
	}
	const char *what = d->model ? "the model's files" : d->dir;
	if (refused) {
		struct check *c =
		    add(d, "o_direct",
		        "%s (%s): O_DIRECT refused (EINVAL) for %u of %u file%s, e.g. %s: "
		        "the loader would read them through the page cache",
		        what, fstype, refused, n_files, n_files == 1 ? "" : "s", refused_path);
		set_fix(c, CHECK_FAIL,
		        "move the model to a filesystem with direct I/O (ext4, xfs, btrfs), or "
		        "serve it buffered on purpose with --no-direct");
		return;
	}
	add(d, "o_direct", "%s (%s): O_DIRECT opens, alignment %u bytes (statx DIOALIGN)", what,
	    fstype, alignment);
}

/* The loader registers the slots as fixed buffers, pinned memory charged to RLIMIT_MEMLOCK
 * without CAP_IPC_LOCK; refused, it reads into them with plain reads. */
static void check_memlock(struct doctor *d)
{
	const unsigned cap_ipc_lock = 14;
	struct rlimit lim;
	if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0) {
		struct check *c =
		    add(d, "memlock", "getrlimit(RLIMIT_MEMLOCK): %s", strerror(errno));
		set_fix(c, CHECK_WARN, "check the process's limits (cat /proc/self/limits)");
		return;
	}
	const bool unlimited = lim.rlim_cur == RLIM_INFINITY,
	           cap = process_has_capability(cap_ipc_lock);
	char limit[64];
	if (unlimited)
		snprintf(limit, sizeof(limit), "unlimited");
	else
		snprintf(limit, sizeof(limit), "%llu KiB",
		         (unsigned long long)(lim.rlim_cur >> 10));
	const uint64_t need = d->have_budget ? d->budget.engine.budget_bytes : 0;
	char needs[96] = "";
	if (need)
		snprintf(needs, sizeof(needs), "; the pool's registered buffers: %.1f MiB",
		         mib(need));
	else if (!d->model)
		snprintf(needs, sizeof(needs),
		         "; the pool's registered buffers: the expert budget "
		         "(give a MODEL to compare)");
	struct check *c = add(d, "memlock", "RLIMIT_MEMLOCK %s%s%s", limit,
	                      cap ? ", CAP_IPC_LOCK (not charged)" : "", needs);
	if (cap || unlimited || (need && lim.rlim_cur >= need))
		return;
	if (need || !d->model)
		set_fix(c, CHECK_WARN,
		        "the slots would be read with plain reads, not fixed buffers: raise the "
		        "limit (ulimit -l unlimited; systemd: LimitMEMLOCK=infinity)");
}

/* The slot pool takes reserved huge pages when enough are free, else ordinary pages with
 * MADV_HUGEPAGE (slot_pool.c): either needs nothing below 2 MiB pages to be fast. */
static void check_huge_pages(struct doctor *d)
{
	char thp[64] = "absent";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	if (f) {
		char line[128] = "";
		if (fgets(line, sizeof(line), f)) {
			const char *open = strchr(line, '['),
			           *close = open ? strchr(open, ']') : NULL;
			if (open && close)
				snprintf(thp, sizeof(thp), "%.*s", (int)(close - open - 1),
				         open + 1);
		}
		fclose(f);
	}
	uint64_t free_pages = 0, page_kib = 0;
	f = fopen("/proc/meminfo", "r");
	if (f) {
		char line[256];
		unsigned long long v;
		while (fgets(line, sizeof(line), f)) {
			if (sscanf(line, "HugePages_Free: %llu", &v) == 1)
				free_pages = v;
			else if (sscanf(line, "Hugepagesize: %llu kB", &v) == 1)
				page_kib = v;
		}
		fclose(f);
	}
	const uint64_t reserved = free_pages * page_kib * 1024;
	const uint64_t need = d->have_budget ? d->budget.engine.budget_bytes : 0;
	const bool hugetlb = need && reserved >= need;
	const bool thp_on = !strcmp(thp, "always") || !strcmp(thp, "madvise");
	struct check *c =
	    add(d, "huge_pages", "transparent huge pages: %s; reserved huge pages free: %.1f MiB%s",
	        thp, mib(reserved), hugetlb ? " (hold the pool)" : "");
	if (!hugetlb && !thp_on)
		set_fix(c, CHECK_WARN,
		        "the slots would sit on 4 KiB pages: echo madvise > "
		        "/sys/kernel/mm/transparent_hugepage/enabled, or reserve huge pages "
		        "(vm.nr_hugepages)");
}

static void check_numa(struct doctor *d)
{
	struct forward_config fc = {.numa = FORWARD_NUMA_AUTO};
	struct forward_topology_info t;
	struct sidecar_error err;
	if (forward_topology_describe(&fc, &t, &err) != 0) {
		struct check *c = add(d, "numa", "%s", err.msg);
		set_fix(c, CHECK_FAIL, "check that hwloc sees this machine (lstopo)");
		return;
	}
	cpu_set_t set;
	const int allowed = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : -1;
	const long online = sysconf(_SC_NPROCESSORS_ONLN);
	char nodes[256] = "";
	size_t used = 0;
	for (uint32_t n = 0; n < t.n_nodes && used < sizeof(nodes); n++)
		used += (size_t)snprintf(nodes + used, sizeof(nodes) - used, "%snode %u: %u CPUs",
		                         n ? ", " : "", t.node_os_index[n], t.pus[n]);
	unsigned workers = 0; /* the pools': each node's threads (pool_worker_count) */
	for (uint32_t n = 0; n < t.n_nodes; n++)
		workers += t.threads[n];
	struct check *c =
	    add(d, "numa",
	        "%u NUMA node%s (%s); this process may use %d of %ld online CPUs; "
	        "the pools would run %u workers",
	        t.n_nodes, t.n_nodes == 1 ? "" : "s", nodes, allowed, online, workers);
	if (allowed > 0 && online > allowed)
		set_fix(c, CHECK_WARN,
		        "the pools use only these CPUs (a node with none gets no pool): widen "
		        "the affinity (taskset -c, numactl, systemd CPUAffinity=) or the cgroup's "
		        "cpuset (AllowedCPUs=, cpuset.cpus) if the sidecar should have the rest");
}

static void check_memory(struct doctor *d)
{
	const struct mem_limit *ml = &d->ml;
	char cgroup[320] = "no cgroup memory limit";
	if (ml->cgroup_from)
		snprintf(cgroup, sizeof(cgroup), "cgroup limit %s (%s)", human(ml->cgroup_bytes).s,
		         ml->cgroup_file);
	struct check *c = add(d, "memory", "limit %s from %s; %s; host figure %s of MemTotal %s",
	                      human(ml->bytes).s, ml->from, cgroup, human(ml->host_bytes).s,
	                      human(ml->total_bytes).s);
	const size_t n = strlen(c->found);
	if (d->have_budget) {
		const struct serve_model_budget *b = &d->budget;
		snprintf(c->found + n, sizeof(c->found) - n,
		         "; auto: the engine may use %s (3/4 of the limit less %.1f MiB "
		         "held), request buffers %.1f MiB, expert budget %s",
		         human(b->engine_bytes).s, mib(mem_rss_self()),
		         mib(b->engine.request_bytes), human(b->engine.budget_bytes).s);
	} else if (d->model) {
		snprintf(c->found + n, sizeof(c->found) - n, "; auto: refused: %s",
		         d->budget_error);
		set_fix(c, CHECK_FAIL,
		        "raise the memory limit (the cgroup's memory.max or limit_in_bytes, or "
		        "--mem-limit) or lower --max-tokens");
	} else {
		snprintf(c->found + n, sizeof(c->found) - n,
		         "; auto gives the experts up to %s (3/4 of it) less the request "
		         "buffers",
		         human(ml->bytes / 4 * 3).s);
	}
}

static void check_probes(struct doctor *d)
{
	struct pagecache_readiness r;
	pagecache_readiness(d->bpffs, &r);
	char caps[128];
	snprintf(caps, sizeof(caps),
	         "CAP_BPF %s, CAP_PERFMON %s (both needed); CAP_SYS_ADMIN %s (only to mount bpffs "
	         "or tracefs)",
	         r.cap_bpf ? "yes" : "no", r.cap_perfmon ? "yes" : "no",
	         r.cap_sys_admin ? "yes" : "no");
	struct check *c =
	    add(d, "probes", "BPF programs %s; BTF %s; bpffs %s at %s; tracefs %s at %s; %s",
	        !r.built     ? "not built in"
	        : r.can_load ? "load"
	                     : "refused",
	        r.btf ? "present" : "absent",
	        r.bpffs   ? "mounted"
	        : r.ready ? "not mounted (serve mounts it)"
	                  : "not mounted",
	        r.bpffs_path, r.tracefs ? "mounted" : "not mounted", r.tracefs_path, caps);
	if (!r.ready)
		set_fix(c, CHECK_WARN,
		        "serve runs without page-cache proof (--require-probes would refuse): %s",
		        r.why);
}

static void check_isa(struct doctor *d)
{
	char features[160];
	moek_cpu_feature_names(moek_cpu_features(), features, sizeof(features));
	const char *forced = getenv("MOEK_ISA");
	struct check *c = add(d, "isa", "the kernels run %s%s%s%s (CPU features: %s)",
	                      moek_isa_name(), forced ? " (MOEK_ISA=" : "", forced ? forced : "",
	                      forced ? ")" : "", features[0] ? features : "none");
	if (moek_isa_active() == MOEK_ISA_SCALAR)
		set_fix(c, CHECK_WARN,
		        "the scalar reference kernels are slow: run on a CPU with AVX2 and FMA%s",
		        forced ? ", or unset MOEK_ISA" : "");
}

/* At most SAMPLE_MAX_BYTES or SAMPLE_MAX_NS of O_DIRECT reads from the start of the file,
 * one SAMPLE_READ_BYTES read at a time (a floor for the loader's queue of reads). */
static void check_read_rate(struct doctor *d, const struct residency_file *sample)
{
	if (sample->fd < 0 || sample->buffered) {
		struct check *c = add(d, "read_rate", "not measured: %s",
		                      sample->fd < 0 ? "no file to read" : "O_DIRECT refused");
		set_fix(c, CHECK_WARN, "fix o_direct first");
		return;
	}
	void *buf = aligned_alloc(sample->alignment, SAMPLE_READ_BYTES);
	if (!buf) {
		struct check *c = add(d, "read_rate", "not measured: out of memory");
		set_fix(c, CHECK_WARN, "run doctor with more memory free");
		return;
	}
	uint64_t bytes = 0;
	int error = 0;
	const uint64_t t0 = monotonic_ns();
	uint64_t elapsed = 0;
	while (bytes < SAMPLE_MAX_BYTES && elapsed < SAMPLE_MAX_NS) {
		const ssize_t n = pread(sample->fd, buf, SAMPLE_READ_BYTES, (off_t)bytes);
		if (n < 0)
			error = errno;
		elapsed = monotonic_ns() - t0;
		if (n <= 0)
			break;
		bytes += (uint64_t)n;
		if ((size_t)n < SAMPLE_READ_BYTES)
			break; /* end of file */
	}
	free(buf);
	if (error) {
		struct check *c = add(d, "read_rate", "%s: O_DIRECT read at %.0f MiB: %s",
		                      d->sample_path, mib(bytes), strerror(error));
		set_fix(c, CHECK_FAIL, "check the disk (dmesg): the loader's reads would fail too");
		return;
	}
	const double s = elapsed ? (double)elapsed / 1e9 : 1e-9;
	add(d, "read_rate",
	    "%.0f MB/s: %.1f MiB in %.0f ms, O_DIRECT, %u KiB reads one at a time, from %s%s",
	    (double)bytes / s / 1e6, mib(bytes), s * 1e3, SAMPLE_READ_BYTES >> 10,
	    d->sample_is_temp ? "a temporary file in " : "",
	    d->sample_is_temp ? d->dir : d->sample_path);
}

/* The budget auto picks against the model's experts, and what it means for hits. */
static void check_model(struct doctor *d)
{
	if (!d->have_budget) {
		struct check *c = add(d, "model", "%s: serve would refuse the budget: %s", d->model,
		                      d->budget_error);
		set_fix(c, CHECK_FAIL, "raise the memory limit or give --mem-budget what fits");
		return;
	}
	const struct moe_model_hparams *in = &d->cat->info;
	const struct forward_budget *e = &d->budget.engine;
	const uint64_t all = (uint64_t)in->n_moe_layers * in->n_experts;
	const uint64_t step = (uint64_t)in->n_moe_layers * in->top_k;
	const double share = e->every_bytes ? (double)e->budget_bytes / (double)e->every_bytes : 1;
	if (!e->cut || share >= 1) {
		add(d, "model",
		    "%s: %s of experts (%" PRIu64 " experts, %u MoE layers x %u); auto's "
		    "budget holds every one: all resident after the warm-up, every expert a hit",
		    d->model, human(d->budget.expert_bytes).s, all, in->n_moe_layers,
		    in->n_experts);
		return;
	}
	const uint64_t held = (uint64_t)(share * (double)all);
	struct check *c =
	    add(d, "model",
	        "%s: auto's budget of %s holds about %.1f%% of %s of experts (~%" PRIu64
	        " of %" PRIu64 "); a decode step routes %" PRIu64
	        " (%u MoE layers x top-%u). Expected hit rate: above %.0f%% only as far as the "
	        "routing repeats experts, which doctor cannot see (simulate a recorded trace)",
	        d->model, human(e->budget_bytes).s, 100 * share, human(e->every_bytes).s, held, all,
	        step, in->n_moe_layers, in->top_k, 100 * share);
	if (held < step)
		set_fix(
		    c, CHECK_WARN,
		    "fewer experts than one decode step routes: every step reloads experts, hit "
		    "rate at most %.0f%%; raise the memory limit to hold at least %s",
		    100.0 * (double)held / (double)step,
		    human((uint64_t)((double)e->every_bytes * (double)step / (double)all)).s);
	else
		set_fix(
		    c, CHECK_WARN,
		    "cold experts are read from disk on demand: raise the memory limit, or keep "
		    "the hottest on the GPU (moe-sidecar placement)");
}

/* ---- printing --------------------------------------------------------------------------- */

static enum check_state overall(const struct doctor *d)
{
	enum check_state worst = CHECK_OK;
	for (unsigned i = 0; i < d->n; i++)
		if (d->checks[i].state > worst)
			worst = d->checks[i].state;
	return worst;
}

static void print_text(FILE *o, const struct doctor *d)
{
	for (unsigned i = 0; i < d->n; i++) {
		const struct check *c = &d->checks[i];
		fprintf(o, "%-4s  %-10s  %s", state_names[c->state], c->name, c->found);
		if (c->fix[0])
			fprintf(o, "  -> %s", c->fix);
		fputc('\n', o);
	}
	const enum check_state all = overall(d);
	fprintf(o, "%s\n",
	        all == CHECK_FAIL   ? "doctor: serving would not run well here: fix what fails"
	        : all == CHECK_WARN ? "doctor: serving would run, at the costs warned of"
	                            : "doctor: serving would run well here");
}

static int print_json(FILE *o, const struct doctor *d)
{
	struct json_writer w;
	jw_init_file(&w, o);
	jw_object_begin(&w);
	jw_key(&w, "model");
	if (d->model)
		jw_string(&w, d->model);
	else
		jw_null(&w);
	jw_kv_string(&w, "state", state_names[overall(d)]);
	jw_key(&w, "checks");
	jw_array_begin(&w);
	for (unsigned i = 0; i < d->n; i++) {
		const struct check *c = &d->checks[i];
		jw_object_begin(&w);
		jw_kv_string(&w, "name", c->name);
		jw_kv_string(&w, "state", state_names[c->state]);
		jw_kv_string(&w, "found", c->found);
		jw_kv_string(&w, "fix", c->fix);
		jw_object_end(&w);
	}
	jw_array_end(&w);
	jw_object_end(&w);
	return jw_finish_line(&w);
}

static void usage(FILE *to)
{
	fprintf(to, "usage: moe-sidecar doctor [MODEL] [--json] [--dir DIR]\n"
	            "  checks what serving needs on this machine, one line per check with its "
	            "fix;\n"
	            "  with MODEL also whether it fits the budget serve's auto would pick\n"
	            "  --json     one object with an array of checks\n"
	            "  --dir DIR  without MODEL: where to sample O_DIRECT reads (default .)\n"
	            "exit status: 0 when serving would run well, 1 when a check fails\n");
}

int cmd_doctor(int argc, char **argv)
{
	struct doctor d = {.dir = "."};
	bool json = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = true;
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
			d.dir = argv[++i];
#ifdef MOE_TEST_HOOKS
		} else if (!strcmp(argv[i], "--debug-bpffs") && i + 1 < argc) {
			d.bpffs = argv[++i];
#endif
		} else if (argv[i][0] == '-' || d.model) {
			fprintf(stderr, "moe-sidecar doctor: unexpected argument '%s'\n", argv[i]);
			usage(stderr);
			return 2;
		} else {
			d.model = argv[i];
		}
	}
	log_set_level(LOG_WARN); /* the report is the output; library events only when wrong */
	if (d.model) {
		struct sidecar_error err;
		if (moe_catalog_open(d.model, &d.cat, &err) != 0) {
			fprintf(stderr, "moe-sidecar doctor: %s\n", err.msg);
			return 1;
		}
	}
	mem_limit_read("", &d.ml);
	if (d.cat) {
		/* serve's defaults, its memory limit and what this process holds now */
		struct serve_model_config cfg = {
		    .path = d.model,
		    .numa = "auto",
		    .max_tokens = SERVE_MODEL_DEFAULT_MAX_TOKENS,
		    .mem_limit = d.ml.bytes,
		    .mem_limit_from = d.ml.from,
		    .mem_base = mem_rss_self(),
		    .mem_total = d.ml.total_bytes,
		};
		struct sidecar_error err;
		d.have_budget = serve_model_plan_budget(&cfg, d.cat, &d.budget, &err) == 0;
		if (!d.have_budget)
			snprintf(d.budget_error, sizeof(d.budget_error), "%s", err.msg);
	}
	struct residency_file sample = {.fd = -1};
	check_io_uring(&d);
	check_o_direct(&d, &sample);
	check_memlock(&d);
	check_huge_pages(&d);
	check_numa(&d);
	check_memory(&d);
	check_probes(&d);
	check_isa(&d);
	check_read_rate(&d, &sample);
	if (d.cat)
		check_model(&d);
	if (sample.fd >= 0)
		close(sample.fd);
	if (d.sample_is_temp)
		unlink(d.sample_path);
	moe_catalog_close(d.cat);
	int rc = 0;
	if (json)
		rc = print_json(stdout, &d);
	else
		print_text(stdout, &d);
	if (rc != 0) {
		fprintf(stderr, "moe-sidecar doctor: writing the JSON: %s\n", strerror(-rc));
		return 1;
	}
	if (fflush(stdout) != 0)
		return 1;
	return overall(&d) == CHECK_FAIL ? 1 : 0;
}
