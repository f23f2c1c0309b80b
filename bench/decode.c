/* decode.c — bench_decode: a decode trace through the full path (client → channel → sidecar
 * → residency → kernels) at expert budgets of 100%, 50% and 25%, against two baselines
 * measured in the same run on the same requests:
 *
 *   floor  the forward engine in this process with every expert resident (ALL_RESIDENT):
 *          what the computation costs without a channel and without I/O;
 *   mmap   the forward engine in a child process over an mmap of the model files (MMAP: the
 *          page cache does residency, as llama.cpp does), under the same memory limit as the
 *          sidecar's budget: a cgroup v2 memory.max, else a cgroup v1 memory.limit_in_bytes
 *          (the output says which), else no limit (said loudly).
 *
 * Every mode replays the same requests: per step and MoE layer, the trace's top-k experts with
 * its router scores as weights, k_defer of them deferred into the next layer (none on the last),
 * random activations from a fixed seed; the sidecar also gets the next layer's experts as a
 * PREFETCH hint before each FORWARD (--hints: an oracle lookahead by default, the best a predictor
 * can do). A warm-up pass (a quarter of the steps) precedes the timed steps in every mode; the
 * sidecar's starts with a hint naming every expert once (the floor starts with every expert
 * loaded). Figures are ratios against the floor and the mmap baseline; absolute numbers depend on
 * the machine.
 *
 * The full-budget row is the one compared with the floor, on a machine whose load drifts: it
 * alternates floor and sidecar for --rounds rounds (default 7) and reports the round with the
 * median ratio, so each ratio compares two runs taken seconds apart. A round during which the
 * VM ran its two vCPUs as one core's worth (bench/cores.h: checked before and after) is redone,
 * up to 3 x --rounds attempts, and counted.
 *
 *   bench_decode [--quick] [--json] [--model PATH] [--steps N] [--plot FILE.png]
 *                [--sidecar-threads N]   (serve --threads; default: serve's, the node's cores)
 *                [--threads N]           (every engine, the floor's and mmap's included, and
 *                                         the sidecar unless --sidecar-threads says otherwise,
 *                                         with N workers per node: --threads 1 on a 2-core
 *                                         machine leaves the replaying client a core of its
 *                                         own, which separates the hand-off from the cores
 *                                         the client takes from the workers)
 *                [--client-spin]         (the replaying client waits with MOE_WAIT_SPIN: for
 *                                         a client with a core of its own, e.g. --threads 1
 *                                         on a 2-core machine; on shared cores it halves the
 *                                         sidecar's rate)
 *                [--budgets P,P,...]     (percentages of expert bytes; default 100,50,25)
 *                [--rounds N]            (floor/sidecar alternations at 100%; default 7)
 *                [--defer-cold]          (the sidecar's FORWARDs carry MOE_FWD_DEFER_COLD: the
 *                                         non-resident experts are the deferred ones)
 *                [--file-layout]         (every engine keeps the files' rows: serve
 *                                         --file-layout, forward_config.file_layout)
 *                [--sequential]          (one engine holds the model at a time: the floor is
 *                                         destroyed before the sidecar starts and the 100%
 *                                         rounds restart the sidecar; automatic when 2.5
 *                                         copies of the experts exceed the RAM)
 *                [--prefill N,N]         (rows of an N-token prompt through every MoE layer
 *                                         at the 100% and 50% budgets, and in the floor)
 *                [--json-file PATH]      (the --json object written there as well)
 *                [--numa SPEC]           (serve --numa: the sidecar's NUMA nodes, e.g.
 *                                         "synthetic:pack:1 numa:2 core:1 pu:1" for two
 *                                         synthetic nodes, each expert sliced over them)
 *                [--hints oracle|none|router]  (what the sidecar is told before each FORWARD:
 *                                         the next layer's true experts (default); nothing;
 *                                         the top-k of the next layer's router, the model's
 *                                         ffn_gate_inp, on this layer's input: pre-gating,
 *                                         with its precision/recall against the trace)
 *                [--policy SPEC]         (serve --policy, and the replay's)
 *                [--pool-pages huge|auto] (serve --pool-pages: the slot pool's pages)
 *                [--keep-traces DIR]     (the recorded runs below 100% kept in DIR)
 *
 * Also reported per budget: hits that a hint had loaded, bytes read per token (demand misses
 * and everything the loader read), the page cache the sidecar filled from the model files
 * (its eBPF probes, cold start included), and the cold start — seconds from spawning `serve`
 * to READY, to the first FORWARD answered and to the hinted set resident — with the loader's
 * rate over that span against the disk's floor (odirect.h: the same bytes read once with
 * O_DIRECT at the loader's chunk and depth, measured in the same run).
 * Below 100%, the bytes the loader read per timed token against Belady's OPT over the same
 * requests: the sidecar's run is recorded (serve --record-trace: its FORWARDs and the loads its
 * PREFETCHes started) and replayed over the model's size classes at the sidecar's budget
 * (sidecar/residency/sim.h), OPT given the same prefetches.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "catalog_adapter.h"
#include "cores.h"
#include "forward.h"
#include "latency.h"
#include "moe_client.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "moe_proto.h"
#include "odirect.h"
#include "router.h"
#include "sim.h"
#include "stats_field.h"
#include "trace.h"

/* The record of the last engine call that failed (forward.h). */
static struct sidecar_error ferr;

#define MAX_FRACTIONS 8
#define MAX_ROUNDS 15
static double fractions[MAX_FRACTIONS] = {1.0, 0.5, 0.25};
static int N_FRACTIONS = 3;
static uint32_t engine_threads; /* --threads; 0 = each engine's default */
static bool client_spin;        /* --client-spin: the replaying client's MOE_WAIT_SPIN */
static bool sequential;       /* --sequential (or a model too big for two copies): one at a time */
static const char *json_file; /* --json-file: the JSON object there too, beside the table */
static const char *numa_spec; /* --numa: serve's --numa (NULL: serve's default) */
/* --hints: what the sidecar is told before each FORWARD about the next layer's experts. */
enum hints_mode { HINTS_ORACLE, HINTS_NONE, HINTS_ROUTER };
static enum hints_mode hints = HINTS_ORACLE;
static const char *const hints_names[] = {"oracle", "none", "router"};
static struct moe_router router; /* --hints router: the model's ffn_gate_inp weights */
static const char *pool_pages;   /* --pool-pages: serve's (NULL: its default) */
static const char *policy_arg;   /* --policy: serve's, and the replay's (NULL: the default) */
static const char *keep_traces;  /* --keep-traces DIR: the recorded runs kept there */
#define K_DEFER 1u
#define TIMEOUT_MS 60000

/* --budgets: comma-separated percentages in (0, 100], kept in the order given. */
static int parse_budgets(const char *arg)
{
	int n = 0;
	for (const char *p = arg; *p;) {
		char *end;
		double v = strtod(p, &end);
		if (end == p || v <= 0 || v > 100 || n == MAX_FRACTIONS ||
		    (*end != ',' && *end != '\0')) {
			fprintf(stderr,
			        "bench_decode: --budgets %s: expected up to %d percentages in "
			        "(0, 100], comma-separated\n",
			        arg, MAX_FRACTIONS);
			return -1;
		}
		fractions[n++] = v / 100.0;
		p = *end ? end + 1 : end;
	}
	if (n == 0) {
		fprintf(stderr, "bench_decode: --budgets: empty list\n");
		return -1;
	}
	for (int i = 1; i < n; i++) /* largest first, as the default and the plot expect */
		for (int j = i; j > 0 && fractions[j] > fractions[j - 1]; j--) {
			double t = fractions[j];
			fractions[j] = fractions[j - 1];
			fractions[j - 1] = t;
		}
	N_FRACTIONS = n;
	return 0;
}

static double pct_us(uint64_t *v, size_t n, double p)
{
	return (double)percentile_u64(v, n, p) / 1e3;
}

/* ---- The workload ----------------------------------------------------------------------- */

struct workload {
	uint32_t n_layers, first_layer, n_experts, top_k, hidden;
	uint32_t warm_steps, steps; /* replayed: warm_steps, then steps timed */
	struct routing_trace tr;
	uint32_t *line_of; /* (step, layer) → trace line */
};

/* The request of (step, layer): ids, weights and (unless x is NULL: a hint needs none) x. */
static void workload_request(const struct workload *w, uint32_t step, uint32_t li, int32_t *ids,
                             float *weights, float *x)
{
	uint32_t ln = w->line_of[(size_t)step * w->n_layers + li];
	for (uint32_t j = 0; j < w->top_k; j++) {
		bool have = ln != UINT32_MAX && j < w->tr.lines[ln].count;
		uint32_t r = have ? w->tr.lines[ln].first + j : 0;
		ids[j] = have ? (int32_t)w->tr.ids[r] : -1;
		weights[j] = have && w->tr.scores ? w->tr.scores[r] : 1.0f / (float)(j + 1);
	}
	uint64_t s = ((uint64_t)step << 20 | li) * 0x9e3779b97f4a7c15ull + 1;
	for (uint32_t i = 0; x && i < w->hidden; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		x[i] = (float)((double)(s >> 40) / 16777216.0 - 0.5);
	}
}

/* Timing of one mode. */
struct result {
	double tokens_per_s;
	double hit_rate;       /* sidecar only, over the timed steps; NAN otherwise */
	double prefetch_hits;  /* of the hits, experts a hint had loaded (sidecar only) */
	double bytes_read;     /* sidecar only, over the timed steps (demand misses) */
	double loader_bytes;   /* sidecar only: everything its loader read in the timed steps */
	double pagecache_fill; /* sidecar only: page-cache bytes filled from the model files
	                          while it served (probes), NAN without probes */
	/* cold start (sidecar only), seconds from spawning `serve`: READY written, the first
	 * FORWARD answered, the hinted set resident (what fits the budget); warm_bytes is the
	 * expert bytes resident then */
	double ready_s, first_s, warm_s, warm_bytes;
	double warm_read_bytes; /* what the loader read until then (evicted loads included) */
	/* the cold start's parts, from STATS when the warm set was reached: seconds the populate
	 * threads spent on the pool, the loaders had reads in flight, the post-load stage
	 * converted experts (summed over nodes); the pool's groups, and how many were populated
	 * when the sidecar was first asked (just after READY) */
	struct {
		double populate_s, read_busy_s, layout_s;
		double groups, groups_at_ready;
	} parts;
	/* timed decode steps: the loader's bytes over the time it had reads in flight */
	double busy_gbps;
	double p50_us[64], p99_us[64];
	double p99_all_us;
	/* sidecar only, at the end of its run: registered buffers the slot pool is spread over,
	 * the share of the loader's reads that were read_fixed, the pool's pages */
	double fixed_buffers, fixed_share;
	const char *pages;
	/* against Belady's OPT over the same recorded trace (serve --record-trace) and budget,
	 * bytes per timed token: OPT given the sidecar's prefetches, OPT with none, the
	 * sidecar's policy replayed (NAN: not computed) */
	double opt_bytes, opt_nopf_bytes, replay_bytes;
	double budget_bytes; /* the sidecar's, from STATS */
	/* --hints router: the hinted experts against the next layer's true ones, timed steps */
	double hint_hits, hint_sent, hint_true;
	int ok;
};

static void summarise(const struct workload *w, uint64_t *lat, uint64_t t_ns, struct result *r)
{
	r->tokens_per_s = (double)w->steps / ((double)t_ns / 1e9);
	for (uint32_t li = 0; li < w->n_layers && li < 64; li++) {
		uint64_t *v = malloc((size_t)w->steps * sizeof(uint64_t));
		if (!v)
			return;
		memcpy(v, &lat[(size_t)li * w->steps], (size_t)w->steps * sizeof(uint64_t));
		r->p50_us[li] = pct_us(v, w->steps, 0.5);
		r->p99_us[li] = pct_us(v, w->steps, 0.99);
		free(v);
	}
	r->p99_all_us = pct_us(lat, (size_t)w->steps * w->n_layers, 0.99);
	r->ok = 1;
}

/* ---- In process (floor and mmap) -------------------------------------------------------- */

static int run_inprocess(const struct workload *w, struct forward_engine *e, struct result *r)
{
	const uint32_t h = w->hidden, k = w->top_k;
	float *x = malloc(h * sizeof(float)), *wts = malloc(k * sizeof(float));
	int32_t *ids = malloc(k * sizeof(int32_t));
	float *out = malloc(h * sizeof(float)), *def[2] = {calloc(h, 4), calloc(h, 4)};
	uint64_t *lat = malloc((size_t)w->steps * w->n_layers * sizeof(uint64_t));
	if (!x || !wts || !ids || !out || !def[0] || !def[1] || !lat)
		return -1;
	uint64_t t0 = 0;
	int rc = 0;
	for (uint32_t step = 0; step < w->warm_steps + w->steps && rc == 0; step++) {
		if (step == w->warm_steps)
			t0 = monotonic_ns();
		bool owed = false;
		uint32_t cur = 0;
		for (uint32_t li = 0; li < w->n_layers; li++) {
			workload_request(w, step, li, ids, wts, x);
			uint32_t kd = li + 1 < w->n_layers ? K_DEFER : 0;
			struct forward_request req = {.layer = (int32_t)(w->first_layer + li),
			                              .n_tokens = 1,
			                              .k = k,
			                              .k_defer = kd,
			                              .x = x,
			                              .x_dtype = MOEK_ACT_F32,
			                              .ids = ids,
			                              .weights = wts,
			                              .deferred_in = owed ? def[cur] : NULL};
			struct forward_result res;
			uint64_t a = monotonic_ns();
			rc = forward_run(e, &req, out, kd ? def[1 - cur] : NULL, &res);
			uint64_t b = monotonic_ns();
			if (rc != 0) {
				fprintf(stderr, "bench_decode: in-process layer %u: %s\n", li,
				        res.message);
				break;
			}
			owed = kd && res.n_deferred;
			cur = 1 - cur;
			if (step >= w->warm_steps)
				lat[(size_t)li * w->steps + (step - w->warm_steps)] = b - a;
		}
	}
	if (rc == 0)
		summarise(w, lat, monotonic_ns() - t0, r);
	r->hit_rate = NAN;
	free(x);
	free(wts);
	free(ids);
	free(out);
	free(def[0]);
	free(def[1]);
	free(lat);
	return rc;
}

/* ---- Against Belady's OPT ----------------------------------------------------------------- */

/* The sidecar's recorded run (serve --record-trace: its FORWARDs and the loads its PREFETCHes
 * started) cut to the timed steps and replayed over the model's size classes at the
 * sidecar's budget: Belady's OPT given the same prefetches, OPT with none, and the sidecar's
 * policy (which should read what the sidecar did). Recorded steps: the cold-start FORWARD is
 * step 0, warm-up step s is step s + 1. */
static void against_belady(const struct workload *w, const struct moe_catalog *cat,
                           const char *path, struct result *r)
{
	r->opt_bytes = r->opt_nopf_bytes = r->replay_bytes = NAN;
	struct routing_trace t;
	struct sidecar_error err = {0};
	if (trace_load(path, &t, &err) != 0) {
		fprintf(stderr, "bench_decode: the recorded trace: %s\n", err.msg);
		return;
	}
	const uint32_t from = w->warm_steps + 1, end = from + w->steps;
	uint32_t n = 0, np = 0;
	while (n < t.n_lines && t.lines[n].step < end)
		n++;
	while (np < t.n_prefetches && t.prefetches[np].before_line < n)
		np++;
	t.n_lines = n;
	t.n_prefetches = np;
	struct expert_map map;
	struct sim_sizes sz;
	struct policy_spec spec;
	if (expert_map_from_catalog(cat, &map, NULL, NULL, &err) != 0) {
		fprintf(stderr, "bench_decode: %s\n", err.msg);
		trace_free(&t);
		return;
	}
	int rc = sim_sizes_from_map(&map, 4096, &sz, &err);
	expert_map_free(&map);
	if (rc == 0 && (rc = sim_sizes_budget(&sz, (uint64_t)r->budget_bytes, &err)) != 0)
		sim_sizes_free(&sz);
	if (rc == 0 && (rc = policy_spec_parse(policy_arg ? policy_arg : POLICY_DEFAULT_SPEC, &spec,
	                                       &err)) != 0)
		sim_sizes_free(&sz);
	if (rc != 0) {
		fprintf(stderr, "bench_decode: against Belady: %s\n", err.msg);
		trace_free(&t);
		return;
	}
	struct sim_options o = {.sizes = &sz, .prefetches = true, .from_step = from};
	struct sim_result res;
	if (sim_replay_belady(&t, &o, &res, &err) == 0)
		r->opt_bytes = (double)(res.demand_bytes + res.prefetch_bytes) / w->steps;
	if (sim_replay_policy(&t, &spec, &o, &res, &err) == 0)
		r->replay_bytes = (double)(res.demand_bytes + res.prefetch_bytes) / w->steps;
	o.prefetches = false;
	if (sim_replay_belady(&t, &o, &res, &err) == 0)
		r->opt_nopf_bytes = (double)res.demand_bytes / w->steps;
	sim_sizes_free(&sz);
	trace_free(&t);
}

/* ---- Memory limit for the mmap baseline -------------------------------------------------- */

struct mem_limit {
	char dir[256];
	char what[512]; /* what was used, for the output */
	int version;    /* 2, 1, or 0 = none */
};

static int write_file(const char *dir, const char *name, const char *text)
{
	char path[320];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, text, strlen(text));
	int saved = errno;
	close(fd);
	errno = saved;
	return n == (ssize_t)strlen(text) ? 0 : -1;
}

static uint64_t read_u64_file(const char *dir, const char *name)
{
	char path[320];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "r");
	unsigned long long v = 0;
	if (f) {
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

/* Creates a memory cgroup for this run: v2 (memory in the root's subtree_control), else v1. */
static void mem_limit_create(struct mem_limit *m, const char *tag)
{
	memset(m, 0, sizeof(*m));
	char ctl[256] = "";
	FILE *f = fopen("/sys/fs/cgroup/cgroup.subtree_control", "r");
	if (f) {
		if (!fgets(ctl, sizeof(ctl), f))
			ctl[0] = '\0';
		fclose(f);
	}
	if (strstr(ctl, "memory")) {
		snprintf(m->dir, sizeof(m->dir), "/sys/fs/cgroup/moe-bench-%s", tag);
		if (mkdir(m->dir, 0755) == 0 || errno == EEXIST) {
			m->version = 2;
			snprintf(m->what, sizeof(m->what), "cgroup v2 memory.max (%s)", m->dir);
			return;
		}
	}
	snprintf(m->dir, sizeof(m->dir), "/sys/fs/cgroup/memory/moe-bench-%s", tag);
	if (mkdir(m->dir, 0755) == 0 || errno == EEXIST) {
		m->version = 1;
		snprintf(
		    m->what, sizeof(m->what),
		    "cgroup v1 memory.limit_in_bytes (%s; no cgroup v2 memory controller here)",
		    m->dir);
		return;
	}
	snprintf(m->what, sizeof(m->what),
	         "NO MEMORY LIMIT: neither a cgroup v2 memory controller nor a writable cgroup v1 "
	         "memory hierarchy (%s); the mmap baseline is optimistic",
	         strerror(errno));
	m->dir[0] = '\0';
}

static void mem_limit_destroy(struct mem_limit *m)
{
	if (m->version)
		rmdir(m->dir);
}

/* In the child: join the cgroup; returns 0 or -1. */
static int mem_limit_join(const struct mem_limit *m)
{
	if (!m->version)
		return 0;
	char pid[32];
	snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	return write_file(m->dir, "cgroup.procs", pid);
}

/* In the child, after its own allocations: limit = what it uses now + budget. */
static int mem_limit_set(const struct mem_limit *m, uint64_t budget)
{
	if (!m->version)
		return 0;
	uint64_t base =
	    read_u64_file(m->dir, m->version == 2 ? "memory.current" : "memory.usage_in_bytes");
	char v[32];
	snprintf(v, sizeof(v), "%llu\n", (unsigned long long)(base + budget));
	return write_file(m->dir, m->version == 2 ? "memory.max" : "memory.limit_in_bytes", v);
}

static void drop_page_cache(const struct moe_catalog *cat)
{
	for (uint32_t i = 0; i < cat->n_files; i++) {
		int fd = open(cat->files[i].path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			fdatasync(fd);
			posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
			close(fd);
		}
	}
}

/* The mmap baseline in a child inside the memory limit; the result comes back over a pipe. */
static int run_mmap_limited(const struct workload *w, const struct moe_catalog *cat,
                            const struct mem_limit *m, uint64_t budget, struct result *r)
{
	int p[2];
	if (pipe(p) != 0)
		return -1;
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		close(p[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		struct result cr;
		memset(&cr, 0, sizeof(cr));
		if (mem_limit_join(m) != 0) {
			fprintf(stderr, "bench_decode: joining %s: %s\n", m->dir, strerror(errno));
			_exit(1);
		}
		struct forward_config fc = {.source = FORWARD_SOURCE_MMAP,
		                            .max_tokens = 1,
		                            .threads_per_node = engine_threads};
		struct forward_engine *e;
		if (forward_create(&e, cat, &fc, &ferr) != 0) {
			fprintf(stderr, "bench_decode: mmap engine: %s\n", ferr.msg);
			_exit(1);
		}
		drop_page_cache(cat);
		if (mem_limit_set(m, budget) != 0) {
			fprintf(stderr, "bench_decode: setting the limit in %s: %s\n", m->dir,
			        strerror(errno));
			_exit(1);
		}
		if (run_inprocess(w, e, &cr) != 0)
			_exit(1);
		if (write(p[1], &cr, sizeof(cr)) != (ssize_t)sizeof(cr))
			_exit(1);
		_exit(0); /* no teardown: the kernel reclaims faster than munmap under a limit */
	}
	close(p[1]);
	ssize_t n = read(p[0], r, sizeof(*r));
	close(p[0]);
	int st;
	waitpid(pid, &st, 0);
	return n == (ssize_t)sizeof(*r) && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* ---- Through the sidecar ---------------------------------------------------------------- */

static const char *sidecar_threads = "0"; /* --sidecar-threads; "0" = serve's default */
static uint16_t forward_flags; /* --defer-cold: MOE_FWD_DEFER_COLD on the sidecar's FORWARDs */
static bool file_layout;       /* --file-layout: every engine keeps the files' rows */

static uint32_t max_prefill; /* --prefill's largest token count (0: no prefill rows) */

static uint64_t spawned_ns; /* when the running sidecar was forked */

/* Starts `serve`; *ready_s receives the seconds from fork to its READY line. */
static const char *record_path; /* serve --record-trace for the next spawn (NULL: none) */

static pid_t sidecar_spawn(const char *model, double fraction, const char *sock, double *ready_s)
{
	const uint64_t t_spawn = monotonic_ns();
	spawned_ns = t_spawn;
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0)
		return -1;
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int ready = dup(p[1]);
		char fd[16], budget[32], inst[48];
		snprintf(fd, sizeof(fd), "%d", ready);
		snprintf(budget, sizeof(budget), "%.2f%%", fraction * 100.0);
		snprintf(inst, sizeof(inst), "bench-decode-%d", (int)getppid());
		const char *argv[28] = {MOE_SIDECAR_BIN,
		                        "serve",
		                        model,
		                        "--mem-budget",
		                        budget,
		                        "--socket",
		                        sock,
		                        "--ready-fd",
		                        fd,
		                        "--log-level",
		                        "warn",
		                        "--probes-instance",
		                        inst,
		                        NULL};
		int at = 13;
		if (strcmp(sidecar_threads, "0") != 0) {
			argv[at++] = "--threads";
			argv[at++] = sidecar_threads;
		}
		if (file_layout)
			argv[at++] = "--file-layout";
		if (numa_spec) {
			argv[at++] = "--numa";
			argv[at++] = numa_spec;
		}
		if (record_path) {
			argv[at++] = "--record-trace";
			argv[at++] = record_path;
		}
		if (pool_pages) {
			argv[at++] = "--pool-pages";
			argv[at++] = pool_pages;
		}
		if (policy_arg) {
			argv[at++] = "--policy";
			argv[at++] = policy_arg;
		}
		char max_tokens[16];
		if (max_prefill > 256) { /* serve's default, which the STATS connection needs */
			snprintf(max_tokens, sizeof(max_tokens), "%u", max_prefill);
			argv[at++] = "--max-tokens";
			argv[at++] = max_tokens;
		}
		execv(MOE_SIDECAR_BIN, (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	char line[512];
	ssize_t n = read(p[0], line, sizeof(line) - 1);
	close(p[0]);
	if (n < 6 || strncmp(line, "READY ", 6) != 0) {
		waitpid(pid, NULL, 0);
		return -1;
	}
	*ready_s = (double)(monotonic_ns() - t_spawn) / 1e9;
	return pid;
}

/* Router hints against the true routing of (step, li): hits, hinted, true experts. */
static void hint_score(const struct workload *w, uint32_t step, uint32_t li, const int32_t *hint,
                       uint32_t k, struct result *r)
{
	int32_t truth[64];
	float tw[64];
	workload_request(w, step, li, truth, tw, NULL);
	for (uint32_t j = 0; j < k; j++) {
		r->hint_sent += hint[j] >= 0;
		r->hint_true += truth[j] >= 0;
		for (uint32_t i = 0; hint[j] >= 0 && i < k; i++)
			r->hint_hits += truth[i] == hint[j];
	}
}

static int run_sidecar(const struct workload *w, const char *sock, struct result *r)
{
	struct moe_connect_opts o = {
	    .socket_path = sock, .max_tokens = 1, .n_slots = 4, .client_name = "bench_decode"};
	struct moe_client *c, *sc;
	int rc = moe_connect(&o, &c);
	if (rc != MOE_OK) {
		fprintf(stderr, "bench_decode: %s\n", moe_connect_error());
		return -1;
	}
	if (client_spin)
		moe_set_wait_policy(c, MOE_WAIT_SPIN);
	/* STATS on a connection of its own, with an output area the JSON fits in. */
	o.max_tokens = (256u << 10) / (w->hidden * 4u) + 1;
	o.max_tokens = o.max_tokens > 256 ? 256 : o.max_tokens;
	o.n_slots = 1;
	rc = moe_connect(&o, &sc);
	if (rc != MOE_OK) {
		fprintf(stderr, "bench_decode: %s\n", moe_connect_error());
		moe_close(c);
		return -1;
	}
	const uint32_t h = w->hidden, k = w->top_k;
	float *wts = malloc(k * sizeof(float)), *x = malloc(h * sizeof(float));
	int32_t *ids = malloc(k * sizeof(int32_t)), *hint = malloc(k * sizeof(int32_t));
	float *hint_w = malloc(k * sizeof(float));
	uint64_t *lat = malloc((size_t)w->steps * w->n_layers * sizeof(uint64_t));
	char *js = malloc(1u << 20);
	if (!wts || !x || !ids || !hint || !hint_w || !lat || !js)
		return -1;
	if (moe_stats_json(sc, js, 1u << 20, TIMEOUT_MS) == MOE_OK) {
		r->parts.groups_at_ready = stats_field(js, "populated_groups");
		r->parts.groups = stats_field(js, "pool_groups");
	}
	struct moe_slot slot, hint_slot;
	moe_slot_acquire(c, &slot);
	moe_slot_acquire(c, &hint_slot);
	/* Cold start: the first FORWARD (step 0, first layer) on a sidecar that has loaded
	 * nothing yet. */
	{
		workload_request(w, 0, 0, ids, wts, x);
		memcpy(slot.input, x, h * sizeof(float));
		memcpy(slot.expert_ids, ids, k * sizeof(int32_t));
		memcpy(slot.expert_weights, wts, k * sizeof(float));
		struct moe_completion done;
		rc = moe_forward(c, &slot, (int32_t)w->first_layer, 1, (uint16_t)k, 0, MOEK_ACT_F32,
		                 MOEK_ACT_F32, forward_flags, &done, TIMEOUT_MS);
		r->first_s = (double)(monotonic_ns() - spawned_ns) / 1e9;
	}
	/* Warm-up, part 1: hint every expert once (what fits stays: at 100% all of them, as in
	 * the floor); part 2 is the warm-up steps below. */
	for (uint32_t li = 0; li < w->n_layers && rc == MOE_OK; li++)
		for (uint32_t e0 = 0; e0 < w->n_experts && rc == MOE_OK; e0 += k) {
			uint32_t nh = 0;
			for (uint32_t e = e0; e < w->n_experts && nh < k; e++, nh++) {
				hint[nh] = (int32_t)e;
				hint_w[nh] = 1.0f;
			}
			rc = moe_prefetch(c, (int32_t)(w->first_layer + li), hint, hint_w, nh, NULL,
			                  TIMEOUT_MS);
		}
	/* The hinted loads run in the background: let them finish before anything is timed. The
	 * loader is done when what it has read stops growing (resident bytes alone can stand
	 * still while a budget below the model evicts one expert for the next) and the pool is
	 * populated. */
	double last = -1, last_read = -1;
	uint64_t changed = monotonic_ns();
	for (int stable = 0, polls = 0; rc == MOE_OK && stable < 3 && polls < 60000; polls++) {
		rc = moe_stats_json(sc, js, 1u << 20, TIMEOUT_MS);
		const double now_resident = stats_field(js, "resident_bytes");
		const double now_read = stats_field(js, "loader_bytes_read");
		/* a load may wait for its part of the pool to be populated: not done before */
		const double groups = stats_field(js, "pool_groups");
		const bool pool_done =
		    isnan(groups) || stats_field(js, "populated_groups") >= groups;
		const bool same = now_resident == last && now_read == last_read && pool_done;
		if (!same) {
			changed = monotonic_ns();
			r->warm_bytes = now_resident;
			r->warm_read_bytes = now_read;
			r->parts.populate_s = stats_field(js, "populate_s");
			r->parts.read_busy_s = stats_field(js, "loader_busy_s");
			r->parts.layout_s = stats_field(js, "layout_s");
		}
		stable = same ? stable + 1 : 0;
		last = now_resident;
		last_read = now_read;
		nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
	}
	r->warm_s = (double)(changed - spawned_ns) / 1e9;
	uint64_t t0 = 0;
	double h0 = 0, m0 = 0, b0 = 0, p0 = 0, l0 = 0, f0 = 0, busy0 = 0;
	for (uint32_t step = 0; step < w->warm_steps + w->steps && rc == MOE_OK; step++) {
		if (step == w->warm_steps) {
			if (moe_stats_json(sc, js, 1u << 20, TIMEOUT_MS) == MOE_OK) {
				h0 = stats_field(js, "hits");
				m0 = stats_field(js, "cold_misses") +
				     stats_field(js, "inflight_misses");
				b0 = stats_field(js, "bytes_read");
				p0 = stats_field(js, "prefetch_hits");
				l0 = stats_field(js, "loader_bytes_read");
				f0 = stats_field(js, "pagecache_fill_bytes");
				busy0 = stats_field(js, "loader_busy_s");
			}
			t0 = monotonic_ns();
		}
		for (uint32_t li = 0; li < w->n_layers && rc == MOE_OK; li++) {
			workload_request(w, step, li, ids, wts, x);
			uint64_t a = monotonic_ns();
			if (li + 1 < w->n_layers && hints != HINTS_NONE) {
				if (hints == HINTS_ORACLE) {
					workload_request(w, step, li + 1, hint, hint_w, NULL);
				} else {
					/* pre-gating: the next layer's router on this layer's
					 * input, what an engine has before this layer runs */
					const uint32_t n =
					    moe_router_topk(&router, li + 1, x, k, hint, hint_w);
					for (uint32_t j = n; j < k; j++)
						hint[j] = -1;
					if (step >= w->warm_steps)
						hint_score(w, step, li + 1, hint, k, r);
				}
				uint32_t nh = 0;
				for (uint32_t j = 0; j < k; j++)
					if (hint[j] >= 0) {
						hint_slot.expert_ids[nh] = hint[j];
						hint_slot.expert_weights[nh++] =
						    hint_w[j] * (float)k;
					}
				/* Posted, not awaited, as an engine would: the FORWARD's wait
				 * consumes its completion (moe_call), so the slot is free again
				 * by the next layer. */
				if (nh)
					rc = moe_prefetch_post(c, &hint_slot,
					                       (int32_t)(w->first_layer + li + 1),
					                       nh, 0);
			}
			memcpy(slot.input, x, h * sizeof(float));
			memcpy(slot.expert_ids, ids, k * sizeof(int32_t));
			memcpy(slot.expert_weights, wts, k * sizeof(float));
			uint32_t kd = li + 1 < w->n_layers ? K_DEFER : 0;
			struct moe_completion done;
			if (rc == MOE_OK)
				rc = moe_forward(c, &slot, (int32_t)(w->first_layer + li), 1,
				                 (uint16_t)k, kd, MOEK_ACT_F32, MOEK_ACT_F32,
				                 forward_flags, &done, TIMEOUT_MS);
			uint64_t b = monotonic_ns();
			if (rc != MOE_OK)
				fprintf(stderr, "bench_decode: sidecar layer %u: %s: %s\n", li,
				        moe_strerror(rc), moe_last_error(c));
			if (step >= w->warm_steps)
				lat[(size_t)li * w->steps + (step - w->warm_steps)] = b - a;
		}
	}
	uint64_t t1 = monotonic_ns();
	if (rc == MOE_OK) {
		summarise(w, lat, t1 - t0, r);
		if (moe_stats_json(sc, js, 1u << 20, TIMEOUT_MS) == MOE_OK) {
			double hits = stats_field(js, "hits") - h0;
			double miss = stats_field(js, "cold_misses") +
			              stats_field(js, "inflight_misses") - m0;
			r->hit_rate = hits / (hits + miss);
			r->prefetch_hits = (stats_field(js, "prefetch_hits") - p0) / (hits + miss);
			r->bytes_read = stats_field(js, "bytes_read") - b0;
			r->loader_bytes = stats_field(js, "loader_bytes_read") - l0;
			const double busy = stats_field(js, "loader_busy_s") - busy0;
			r->busy_gbps = busy > 0 ? r->loader_bytes / busy / 1e9 : NAN;
			/* the probes count from the sidecar's start: cold start included */
			r->pagecache_fill = stats_field(js, "pagecache_fill_bytes");
			(void)f0;
			const double fixed = stats_field(js, "fixed_reads");
			r->fixed_buffers = stats_field(js, "fixed_buffers");
			r->fixed_share = fixed / (fixed + stats_field(js, "plain_reads"));
			r->budget_bytes = stats_field(js, "budget_bytes");
			r->pages = stats_field(js, "pool_hugetlb") == 1 ? "hugetlb"
			           : stats_field(js, "pool_thp") == 1   ? "thp"
			                                                : "4k";
		}
	}
	moe_slot_release(c, slot.index);
	moe_slot_release(c, hint_slot.index);
	moe_close(c);
	moe_close(sc);
	free(wts);
	free(x);
	free(ids);
	free(hint);
	free(hint_w);
	free(lat);
	free(js);
	return rc == MOE_OK ? 0 : -1;
}

/* ---- Prefill ----------------------------------------------------------------------------- */

#define MAX_PREFILLS 4
static uint32_t prefills[MAX_PREFILLS]; /* --prefill: token counts */
static int n_prefills;

/* A prompt of n tokens: token t is routed as trace step t % (warm + timed steps), its
 * activations from the same seed as the decode's. */
struct prompt {
	float *x, *weights;
	int32_t *ids;
	float *out;
};

static int prompt_make(const struct workload *w, uint32_t li, uint32_t n, struct prompt *p)
{
	const size_t h = w->hidden, k = w->top_k;
	p->x = malloc(n * h * sizeof(float));
	p->out = calloc(n * h, sizeof(float));
	p->weights = malloc(n * k * sizeof(float));
	p->ids = malloc(n * k * sizeof(int32_t));
	if (!p->x || !p->out || !p->weights || !p->ids)
		return -1;
	const uint32_t steps = w->warm_steps + w->steps;
	for (uint32_t t = 0; t < n; t++)
		workload_request(w, t % steps, li, p->ids + t * k, p->weights + t * k,
		                 p->x + t * h);
	return 0;
}

static void prompt_free(struct prompt *p)
{
	free(p->x);
	free(p->out);
	free(p->weights);
	free(p->ids);
}

/* The n-token prompt through every MoE layer of an in-process engine: tokens/s. */
static double prefill_inprocess(const struct workload *w, struct forward_engine *e, uint32_t n)
{
	uint64_t busy = 0;
	for (uint32_t li = 0; li < w->n_layers; li++) {
		struct prompt p;
		if (prompt_make(w, li, n, &p) != 0)
			return NAN;
		struct forward_request req = {.layer = (int32_t)(w->first_layer + li),
		                              .n_tokens = n,
		                              .k = w->top_k,
		                              .x = p.x,
		                              .x_dtype = MOEK_ACT_F32,
		                              .ids = p.ids,
		                              .weights = p.weights};
		struct forward_result res;
		uint64_t a = monotonic_ns();
		int rc = forward_run(e, &req, p.out, NULL, &res);
		busy += monotonic_ns() - a;
		prompt_free(&p);
		if (rc != 0) {
			fprintf(stderr, "bench_decode: prefill of %u tokens, layer %u: %s\n", n, li,
			        res.message);
			return NAN;
		}
	}
	return (double)n / ((double)busy / 1e9);
}

/* The same through the sidecar (a connection of its own sized for n tokens). */
static double prefill_sidecar(const struct workload *w, const char *sock, uint32_t n)
{
	struct moe_connect_opts o = {.socket_path = sock,
	                             .max_tokens = n,
	                             .top_k = w->top_k,
	                             .n_slots = 1,
	                             .client_name = "bench_decode prefill"};
	struct moe_client *c;
	if (moe_connect(&o, &c) != MOE_OK) {
		fprintf(stderr, "bench_decode: %s\n", moe_connect_error());
		return NAN;
	}
	struct moe_slot slot;
	moe_slot_acquire(c, &slot);
	const size_t h = w->hidden, k = w->top_k;
	uint64_t busy = 0;
	int rc = MOE_OK;
	for (uint32_t li = 0; li < w->n_layers && rc == MOE_OK; li++) {
		struct prompt p;
		if (prompt_make(w, li, n, &p) != 0) {
			rc = MOE_ENOMEM;
			break;
		}
		memcpy(slot.input, p.x, n * h * sizeof(float));
		memcpy(slot.expert_ids, p.ids, n * k * sizeof(int32_t));
		memcpy(slot.expert_weights, p.weights, n * k * sizeof(float));
		prompt_free(&p);
		struct moe_completion done;
		uint64_t a = monotonic_ns();
		rc = moe_forward(c, &slot, (int32_t)(w->first_layer + li), n, (uint16_t)k, 0,
		                 MOEK_ACT_F32, MOEK_ACT_F32, 0, &done, 10 * TIMEOUT_MS);
		busy += monotonic_ns() - a;
		if (rc != MOE_OK)
			fprintf(stderr, "bench_decode: prefill of %u tokens, layer %u: %s: %s\n", n,
			        li, moe_strerror(rc), moe_last_error(c));
	}
	moe_slot_release(c, slot.index);
	moe_close(c);
	return rc == MOE_OK ? (double)n / ((double)busy / 1e9) : NAN;
}

static int parse_prefill(const char *arg)
{
	n_prefills = 0;
	for (const char *q = arg; *q;) {
		char *end;
		unsigned long v = strtoul(q, &end, 10);
		if (end == q || v < 1 || v > 65536 || n_prefills == MAX_PREFILLS ||
		    (*end != ',' && *end != '\0')) {
			fprintf(stderr,
			        "bench_decode: --prefill %s: expected up to %d token counts in "
			        "1..65536, comma-separated\n",
			        arg, MAX_PREFILLS);
			return -1;
		}
		prefills[n_prefills++] = (uint32_t)v;
		max_prefill = (uint32_t)v > max_prefill ? (uint32_t)v : max_prefill;
		q = *end ? end + 1 : end;
	}
	return 0;
}

/* The loader's rate over the cold start: the expert bytes resident once the hinted set was,
 * over the seconds from READY to then. */
/* Writes JSON text to f with every number printf gave as nan or -nan as null. */
static void json_write_nulls(FILE *f, const char *s)
{
	char prev = 0;
	while (*s) {
		const bool after_sep = prev == ':' || prev == ',' || prev == '[';
		const bool neg = *s == '-';
		if (after_sep && !strncmp(neg ? s + 1 : s, "nan", 3)) {
			fputs("null", f);
			s += neg ? 4 : 3;
			prev = 'l';
		} else {
			prev = *s;
			fputc(*s++, f);
		}
	}
}

/* The O_DIRECT floor over the first ranges holding `max_bytes` (the whole list if fewer). */
static double disk_sample(const struct bench_range *ranges, uint32_t n, uint64_t max_bytes)
{
	uint32_t k = 0;
	for (uint64_t bytes = 0; k < n && bytes < max_bytes; k++)
		bytes += ranges[k].length;
	uint64_t got = 0;
	const double secs = k ? bench_odirect_read(ranges, k, 1u << 20, 32, &got) : -1;
	return secs > 0 ? (double)got / secs / 1e9 : NAN;
}

/* The loader's rate over the cold start, from spawning `serve` to the warm set: at 100% the
 * sidecar warms every expert before READY, so the span starts at the spawn, not at READY. */
static double cold_gbps(const struct result *r)
{
	return r->warm_s > 0 ? r->warm_read_bytes / r->warm_s / 1e9 : NAN;
}

/* ---- Main ------------------------------------------------------------------------------- */

static char tmp_dir[] = "/tmp/bench-decode.XXXXXX";

/* atexit: the generated model and the socket directory. Only the process that made it. */
static pid_t tmp_owner;
static void remove_tmp_dir(void)
{
	if (getpid() != tmp_owner)
		return;
	char path[sizeof(tmp_dir) + 16];
	snprintf(path, sizeof(path), "%s/model.gguf", tmp_dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/s.sock", tmp_dir);
	unlink(path);
	rmdir(tmp_dir);
}

static void plot(const char *png, const struct result *side, const struct result *floor_r,
                 const struct result *mm)
{
	FILE *g = popen("gnuplot", "w");
	if (!g) {
		fprintf(stderr, "bench_decode: gnuplot: %s (no plot)\n", strerror(errno));
		return;
	}
	fprintf(g,
	        "set terminal png size 1200,480\nset output '%s'\nset multiplot layout 1,2\n"
	        "set title 'Decode through moe-sidecar vs in-process baselines'\n"
	        "set xlabel 'expert budget (fraction of expert bytes)'\n"
	        "set ylabel 'tokens/s (relative to the all-resident floor)'\n"
	        "set key top left\nset grid\nset yrange [0:*]\nset offsets 0, 0, graph 0.15, "
	        "0\nset xrange [0.2:1.05]\n"
	        "plot '-' with linespoints lw 2 title 'sidecar', "
	        "'-' with linespoints lw 2 title 'mmap + page cache (same limit)', "
	        "'-' with lines dt 2 title 'in-process, all resident (floor)'\n",
	        png);
	for (int s = 0; s < 3; s++) {
		for (int i = N_FRACTIONS - 1; i >= 0; i--) {
			double v = s == 0   ? side[i].tokens_per_s
			           : s == 1 ? mm[i].tokens_per_s
			                    : floor_r->tokens_per_s;
			if (s == 1 && !mm[i].ok) /* no mmap baseline: a gap, not a zero */
				fprintf(g, "%g NaN\n", fractions[i]);
			else
				fprintf(g, "%g %g\n", fractions[i], v / floor_r->tokens_per_s);
		}
		fprintf(g, "e\n");
	}
	fprintf(g, "set title 'Expert hit rate of the sidecar'\n"
	           "set ylabel 'share of routed experts found resident'\nset yrange [0:1.05]\n"
	           "set key bottom right\n"
	           "plot '-' with linespoints lw 2 title 'hit rate', "
	           "'-' with linespoints lw 2 title 'of which a prefetch had loaded', "
	           "x with lines dt 2 title 'budget fraction (uniform routing)'\n");
	for (int s = 0; s < 2; s++) {
		for (int i = N_FRACTIONS - 1; i >= 0; i--)
			fprintf(g, "%g %g\n", fractions[i],
			        s == 0 ? side[i].hit_rate : side[i].prefetch_hits);
		fprintf(g, "e\n");
	}
	fprintf(g, "unset multiplot\n");
	if (pclose(g) != 0)
		fprintf(stderr, "bench_decode: gnuplot failed (no plot)\n");
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"quick", no_argument, NULL, 'q'},
	    {"json", no_argument, NULL, 'j'},
	    {"model", required_argument, NULL, 'm'},
	    {"steps", required_argument, NULL, 'n'},
	    {"plot", required_argument, NULL, 'p'},
	    {"help", no_argument, NULL, 'h'},
	    {"sidecar-threads", required_argument, NULL, 't'},
	    {"threads", required_argument, NULL, 'T'},
	    {"client-spin", no_argument, NULL, 'S'},
	    {"budgets", required_argument, NULL, 'b'},
	    {"rounds", required_argument, NULL, 'r'},
	    {"defer-cold", no_argument, NULL, 'd'},
	    {"file-layout", no_argument, NULL, 'F'},
	    {"sequential", no_argument, NULL, 's'},
	    {"prefill", required_argument, NULL, 'P'},
	    {"json-file", required_argument, NULL, 'J'},
	    {"numa", required_argument, NULL, 'N'},
	    {"hints", required_argument, NULL, 'H'},
	    {"policy", required_argument, NULL, 'L'},
	    {"pool-pages", required_argument, NULL, 'G'},
	    {"keep-traces", required_argument, NULL, 'K'},
	    {NULL, 0, NULL, 0},
	};
	int quick = 0, json = 0, c;
	const char *model_arg = NULL, *png = NULL;
	long steps = 0, rounds = 7;
	while ((c = getopt_long(argc, argv, "qjm:n:p:t:T:b:r:dFSsP:J:N:H:L:G:K:h", longopts,
	                        NULL)) != -1) {
		switch (c) {
		case 'q': quick = 1; break;
		case 'j': json = 1; break;
		case 'm': model_arg = optarg; break;
		case 'n': steps = strtol(optarg, NULL, 10); break;
		case 'p': png = optarg; break;
		case 't': sidecar_threads = optarg; break;
		case 'T': {
			char *end;
			const long v = strtol(optarg, &end, 10);
			if (*end || v < 1 || v > 1024) {
				fprintf(stderr, "bench_decode: --threads %s: expected 1..1024\n",
				        optarg);
				return 2;
			}
			engine_threads = (uint32_t)v;
			if (strcmp(sidecar_threads, "0") == 0)
				sidecar_threads = optarg;
			break;
		}
		case 'r': rounds = strtol(optarg, NULL, 10); break;
		case 'd': forward_flags = MOE_FWD_DEFER_COLD; break;
		case 'F': file_layout = true; break;
		case 'S': client_spin = true; break;
		case 's': sequential = true; break;
		case 'J': json_file = optarg; break;
		case 'N': numa_spec = optarg; break;
		case 'L': policy_arg = optarg; break;
		case 'G': pool_pages = optarg; break;
		case 'K': keep_traces = optarg; break;
		case 'H':
			if (!strcmp(optarg, "oracle"))
				hints = HINTS_ORACLE;
			else if (!strcmp(optarg, "none"))
				hints = HINTS_NONE;
			else if (!strcmp(optarg, "router"))
				hints = HINTS_ROUTER;
			else {
				fprintf(
				    stderr,
				    "bench_decode: --hints %s: expected oracle, none or router\n",
				    optarg);
				return 2;
			}
			break;
		case 'P':
			if (parse_prefill(optarg) != 0)
				return 2;
			break;
		case 'b':
			if (parse_budgets(optarg) != 0)
				return 2;
			break;
		default:
			fprintf(c == 'h' ? stdout : stderr,
			        "usage: bench_decode [--quick] [--json] [--model PATH] [--steps N] "
			        "[--plot FILE.png] [--sidecar-threads N] [--threads N] "
			        "[--client-spin] [--budgets P,P,...] "
			        "[--rounds N] [--defer-cold] [--file-layout] [--sequential] "
			        "[--prefill N,N] [--json-file PATH] [--numa SPEC] "
			        "[--hints oracle|none|router] [--policy SPEC] [--pool-pages "
			        "huge|auto] [--keep-traces DIR]\n");
			return c == 'h' ? 0 : 2;
		}
	}
	if (!steps)
		steps = quick ? 24 : 128;
	if (rounds < 1 || rounds > MAX_ROUNDS) {
		fprintf(stderr, "bench_decode: --rounds %ld: expected 1..%d\n", rounds, MAX_ROUNDS);
		return 2;
	}
	if (steps < 4 || steps > 100000) {
		fprintf(stderr, "bench_decode: --steps %ld: expected 4..100000\n", steps);
		return 2;
	}

	/* The model: given, or generated (the run.sh shape; --quick: a quarter of it). The
	 * temporary directory goes on every exit path (atexit), model and all. */
	char *dir = tmp_dir, model[128], sock[160];
	if (!mkdtemp(dir)) {
		perror("bench_decode: mkdtemp");
		return 1;
	}
	tmp_owner = getpid();
	atexit(remove_tmp_dir);
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	if (model_arg) {
		snprintf(model, sizeof(model), "%s", model_arg);
	} else {
		snprintf(model, sizeof(model), "%s/model.gguf", dir);
		struct moe_gen_options go = {.preset = "qwen3-30b-a3b",
		                             .out = model,
		                             .format = MOEK_Q8_0,
		                             .seed = 3,
		                             .layers = quick ? 4 : 8,
		                             .experts = quick ? 32 : 64,
		                             .hidden = quick ? 512 : 768,
		                             .ffn = 256};
		struct sidecar_error merr;
		if (moe_gen_write(&go, &merr) != 0) {
			fprintf(stderr, "bench_decode: generating the model: %s\n", merr.msg);
			return 1;
		}
	}
	struct moe_catalog *cat;
	struct sidecar_error merr;
	if (moe_catalog_open(model, &cat, &merr) != 0) {
		fprintf(stderr, "bench_decode: %s\n", merr.msg);
		return 1;
	}
	if (hints == HINTS_ROUTER && moe_router_load(cat, &router, &merr) != 0) {
		fprintf(stderr, "bench_decode: --hints router: %s\n", merr.msg);
		return 1;
	}
	struct workload w = {.n_experts = cat->info.n_experts,
	                     .top_k = cat->info.top_k,
	                     .hidden = (uint32_t)cat->info.hidden,
	                     .steps = (uint32_t)steps,
	                     .warm_steps = (uint32_t)(steps / 4)};
	bool first = true;
	for (uint32_t l = 0; l < cat->info.n_layers; l++)
		if (cat->layers[l].moe) {
			if (first)
				w.first_layer = l;
			first = false;
			w.n_layers++;
		}
	if (w.n_layers != cat->info.n_layers - w.first_layer || w.n_layers > 64) {
		fprintf(stderr, "bench_decode: needs contiguous MoE layers (at most 64)\n");
		return 1;
	}
	struct trace_gen_params gp;
	struct sidecar_error serr = {0};
	if (trace_gen_preset("qwen3-30b-a3b", &gp, &serr) != 0) {
		fprintf(stderr, "bench_decode: %s\n", serr.msg);
		return 1;
	}
	gp.n_layers = w.n_layers;
	gp.n_experts = w.n_experts;
	gp.top_k = w.top_k;
	gp.steps = w.warm_steps + w.steps;
	gp.seed = 11;
	if (trace_generate(&gp, &w.tr, &serr) != 0) {
		fprintf(stderr, "bench_decode: %s\n", serr.msg);
		return 1;
	}
	w.line_of = malloc((size_t)gp.steps * w.n_layers * sizeof(uint32_t));
	if (!w.line_of)
		return 1;
	memset(w.line_of, 0xff, (size_t)gp.steps * w.n_layers * sizeof(uint32_t));
	for (uint32_t i = 0; i < w.tr.n_lines; i++)
		if (w.tr.lines[i].step < gp.steps && w.tr.lines[i].layer < w.n_layers)
			w.line_of[(size_t)w.tr.lines[i].step * w.n_layers + w.tr.lines[i].layer] =
			    i;

	/* (a) The floor: its engine stays up for the alternating rounds of the 100% row, unless
	 * the run is sequential (one engine holding the model in memory at a time). */
	struct result floor_r, side[MAX_FRACTIONS], mm[MAX_FRACTIONS];
	memset(&floor_r, 0, sizeof(floor_r));
	memset(side, 0, sizeof(side));
	memset(mm, 0, sizeof(mm));
	double floor_prefill[MAX_PREFILLS], side_prefill[MAX_FRACTIONS][MAX_PREFILLS];
	double disk_row[MAX_FRACTIONS]; /* each row's disk sample, GB/s */
	for (int i = 0; i < MAX_FRACTIONS; i++)
		for (int j = 0; j < MAX_PREFILLS; j++)
			side_prefill[i][j] = NAN;
	for (int i = 0; i < MAX_FRACTIONS; i++)
		disk_row[i] = NAN;
	if (!sequential) {
		/* two copies of the experts (floor and sidecar at 100%) and the mmap child must
		 * fit beside each other with room to spare, or engines take turns */
		long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
		double ram = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
		sequential = ram > 0 && 2.5 * (double)cat->expert_bytes_total > ram;
	}
	const struct forward_config floor_cfg = {.source = FORWARD_SOURCE_ALL_RESIDENT,
	                                         .max_tokens = max_prefill ? max_prefill : 1,
	                                         .threads_per_node = engine_threads,
	                                         .file_layout = file_layout};
	struct forward_engine *floor_e;
	if (forward_create(&floor_e, cat, &floor_cfg, &ferr) != 0) {
		fprintf(stderr, "bench_decode: floor engine: %s\n", ferr.msg);
		return 1;
	}
	if (run_inprocess(&w, floor_e, &floor_r) != 0)
		return 1;
	for (int j = 0; j < n_prefills; j++)
		floor_prefill[j] = prefill_inprocess(&w, floor_e, prefills[j]);
	if (sequential) {
		forward_destroy(floor_e);
		floor_e = NULL;
	}
	/* Diagnostic: the same engine over the residency source with every expert fitting, in
	 * process: separates what the channel costs from what residency bookkeeping costs.
	 * Not in a sequential run (a third copy of the model). */
	struct result resid_r;
	memset(&resid_r, 0, sizeof(resid_r));
	resid_r.tokens_per_s = NAN;
	struct forward_engine *resid_e = NULL;
	if (!sequential) {
		struct forward_config fc = {.source = FORWARD_SOURCE_RESIDENCY,
		                            .max_tokens = 1,
		                            .threads_per_node = engine_threads,
		                            .file_layout = file_layout};
		struct forward_engine *e;
		if (forward_create(&e, cat, &fc, &ferr) != 0) {
			fprintf(stderr, "bench_decode: residency engine: %s\n", ferr.msg);
			return 1;
		}
		for (uint32_t li = 0; li < w.n_layers; li++)
			for (uint32_t e0 = 0; e0 < w.n_experts; e0++) {
				int32_t id = (int32_t)e0;
				forward_prefetch(e, (int32_t)(w.first_layer + li), &id, NULL, 1,
				                 false);
			}
		/* Let the hinted loads finish before anything is timed. */
		uint64_t last = UINT64_MAX;
		for (int stable = 0, polls = 0; stable < 3 && polls < 1500; polls++) {
			struct forward_stats fst;
			memset(&fst, 0, sizeof(fst));
			forward_stats(e, &fst);
			stable = fst.resident_bytes == last ? stable + 1 : 0;
			last = fst.resident_bytes;
			nanosleep(&(struct timespec){.tv_nsec = 20000000}, NULL);
		}
		if (run_inprocess(&w, e, &resid_r) != 0)
			return 1;
		resid_e = e;
	}
	/* The disk's floor: the experts' bytes read once with O_DIRECT at the loader's chunk
	 * (1 MiB) and depth (32), page cache dropped first. */
	double disk_gbps = NAN;
	struct bench_range *disk_ranges = NULL;
	uint32_t n_disk_ranges = 0, n_disk_fds = 0;
	int *disk_fds = NULL;
	{
		struct expert_map map = {0};
		if (expert_map_from_catalog(cat, &map, NULL, NULL, &serr) == 0) {
			int *fds = calloc(map.n_files, sizeof(int));
			bool open_ok = fds != NULL;
			for (uint32_t f = 0; open_ok && f < map.n_files; f++) {
				fds[f] = open(map.paths[f], O_RDONLY | O_DIRECT | O_CLOEXEC);
				open_ok = fds[f] >= 0;
			}
			uint32_t n_ranges = 0;
			uint64_t range_bytes = 0, got = 0;
			struct bench_range *ranges =
			    open_ok ? bench_expert_ranges(&map, fds, &n_ranges, &range_bytes)
			            : NULL;
			drop_page_cache(cat);
			double secs =
			    ranges ? bench_odirect_read(ranges, n_ranges, 1u << 20, 32, &got) : -1;
			if (secs > 0)
				disk_gbps = (double)got / secs / 1e9;
			/* kept for each row's own sample of the disk, next to its cold start */
			disk_ranges = ranges;
			n_disk_ranges = ranges ? n_ranges : 0;
			disk_fds = fds;
			n_disk_fds = fds ? map.n_files : 0;
			expert_map_free(&map);
		}
		if (isnan(disk_gbps))
			fprintf(stderr, "bench_decode: no disk floor (%s)\n",
			        serr.msg[0] ? serr.msg : "O_DIRECT read failed");
	}
	struct mem_limit lim;
	char tag[32];
	snprintf(tag, sizeof(tag), "%d", (int)getpid());
	mem_limit_create(&lim, tag);
	if (!lim.version)
		fprintf(stderr, "bench_decode: WARNING: %s\n", lim.what);

	double round_ratio[MAX_ROUNDS], round_resid[MAX_ROUNDS], round_cores[MAX_ROUNDS];
	long n_rounds = 0, shared_rounds = 0;
	for (int i = 0; i < N_FRACTIONS; i++) {
		const uint64_t budget = (uint64_t)((double)cat->expert_bytes_total * fractions[i]);
		if (!json)
			fprintf(stderr, "bench_decode: %.0f%% budget%s\n", fractions[i] * 100,
			        sequential ? " (engines one at a time)" : "");
		drop_page_cache(cat);
		/* The virtio disk's rate moves by several times over minutes: each row's cold
		 * start is set against a sample read just before it (up to 4 GiB of the experts'
		 * ranges in file order, the same block size and depth). */
		disk_row[i] = disk_sample(disk_ranges, n_disk_ranges, UINT64_C(4) << 30);
		drop_page_cache(cat);
		double ready_s = 0;
		char rec[200];
		snprintf(rec, sizeof(rec), "%s/recorded-%d.trace", dir, i);
		record_path = fractions[i] < 1.0 ? rec : NULL; /* 100%: rounds, nothing to read */
		pid_t sp = sidecar_spawn(model, fractions[i], sock, &ready_s);
		if (sp < 0) {
			fprintf(stderr, "bench_decode: the sidecar did not start at %.0f%%\n",
			        fractions[i] * 100);
			return 1;
		}
		int rc = 0;
		if (fractions[i] == 1.0) {
			/* Floor and sidecar alternate; the round with the median ratio is
			 * reported (its floor becomes the floor of every row). Sequential: the
			 * sidecar is stopped while the floor runs and started again (a cold start
			 * each round). */
			struct result fl[MAX_ROUNDS], sd[MAX_ROUNDS], rs[MAX_ROUNDS], cold = {0};
			for (long attempt = 0; n_rounds < rounds && rc == 0; attempt++) {
				/* a round the VM ran on one core's worth (cores.h) is redone */
				const double c0 = bench_cores_now();
				memset(&fl[n_rounds], 0, sizeof(fl[0]));
				memset(&sd[n_rounds], 0, sizeof(sd[0]));
				memset(&rs[n_rounds], 0, sizeof(rs[0]));
				rs[n_rounds].tokens_per_s = NAN;
				if (attempt == 0) {
					fl[0] = floor_r;
					rs[0] = resid_r;
				} else if (sequential) {
					kill(sp, SIGTERM);
					waitpid(sp, NULL, 0);
					struct forward_engine *fe;
					if (forward_create(&fe, cat, &floor_cfg, &ferr) != 0 ||
					    run_inprocess(&w, fe, &fl[n_rounds]) != 0)
						return 1;
					forward_destroy(fe);
					drop_page_cache(cat);
					sp = sidecar_spawn(model, 1.0, sock, &ready_s);
					if (sp < 0)
						return 1;
				} else if (run_inprocess(&w, floor_e, &fl[n_rounds]) != 0 ||
				           run_inprocess(&w, resid_e, &rs[n_rounds]) != 0) {
					return 1;
				}
				round_resid[n_rounds] =
				    rs[n_rounds].tokens_per_s / fl[n_rounds].tokens_per_s;
				rc = run_sidecar(&w, sock, &sd[n_rounds]);
				sd[n_rounds].ready_s = ready_s;
				if (attempt == 0)
					cold = sd[0];
				round_ratio[n_rounds] =
				    sd[n_rounds].tokens_per_s / fl[n_rounds].tokens_per_s;
				const double c1 = bench_cores_now();
				round_cores[n_rounds] = c0 < c1 ? c0 : c1;
				if (round_cores[n_rounds] < BENCH_TWO_CORES && rc == 0 &&
				    attempt + 1 < 3 * rounds) {
					shared_rounds++;
					continue;
				}
				n_rounds++;
			}
			if (rc == 0) {
				long m = 0;
				for (long a = 0; a < n_rounds; a++) {
					long below = 0;
					for (long b = 0; b < n_rounds; b++)
						below +=
						    round_ratio[b] < round_ratio[a] ||
						    (round_ratio[b] == round_ratio[a] && b < a);
					if (below == n_rounds / 2)
						m = a;
				}
				floor_r = fl[m];
				resid_r = rs[m];
				side[i] = sd[m];
				/* The cold start is the first round's: later rounds of a sidecar
				 * left running are not cold (sequential ones are, and alike). */
				side[i].ready_s = cold.ready_s;
				side[i].first_s = cold.first_s;
				side[i].warm_s = cold.warm_s;
				side[i].warm_bytes = cold.warm_bytes;
				side[i].warm_read_bytes = cold.warm_read_bytes;
				side[i].parts = cold.parts;
			}
		} else {
			rc = run_sidecar(&w, sock, &side[i]);
			side[i].ready_s = ready_s;
		}
		if (rc == 0 && (fractions[i] == 1.0 || fractions[i] == 0.5))
			for (int j = 0; j < n_prefills; j++)
				side_prefill[i][j] = prefill_sidecar(&w, sock, prefills[j]);
		kill(sp, SIGTERM);
		waitpid(sp, NULL, 0);
		if (rc != 0)
			return 1;
		side[i].opt_bytes = side[i].opt_nopf_bytes = side[i].replay_bytes = NAN;
		if (record_path) {
			against_belady(&w, cat, rec, &side[i]);
			char kept[512];
			snprintf(kept, sizeof(kept), "%s/recorded-%.0f-%s.trace",
			         keep_traces ? keep_traces : "", fractions[i] * 100,
			         hints_names[hints]);
			if (!keep_traces || rename(rec, kept) != 0)
				unlink(rec);
		}
		if (run_mmap_limited(&w, cat, &lim, budget, &mm[i]) != 0)
			fprintf(stderr, "bench_decode: mmap baseline at %.0f%% failed\n",
			        fractions[i] * 100);
	}
	mem_limit_destroy(&lim);
	if (floor_e)
		forward_destroy(floor_e);
	if (resid_e)
		forward_destroy(resid_e);

	FILE *out = json ? stdout : json_file ? fopen(json_file, "w") : NULL;
	if (json_file && !json && !out)
		fprintf(stderr, "bench_decode: %s: %s\n", json_file, strerror(errno));
	char *jbuf = NULL;
	size_t jlen = 0;
	/* written to memory first: a figure that could not be measured (NaN) becomes null */
	FILE *jo = out ? open_memstream(&jbuf, &jlen) : NULL;
	if (jo) {
		fprintf(jo,
		        "{\"model\":\"%s\",\"layers\":%u,\"experts\":%u,\"top_k\":%u,\"hidden\":%u,"
		        "\"expert_bytes\":%llu,\"steps\":%u,\"k_defer\":%u,\"mmap_limit\":\"%s\","
		        "\"inprocess_residency_tokens_per_s\":%.3f,\"full_budget_round_ratios\":[",
		        model_arg ? model : "generated", w.n_layers, w.n_experts, w.top_k, w.hidden,
		        (unsigned long long)cat->expert_bytes_total, w.steps, K_DEFER, lim.what,
		        resid_r.tokens_per_s);
		for (long r = 0; r < n_rounds; r++)
			fprintf(jo, "%s%.4f", r ? "," : "", round_ratio[r]);
		fprintf(jo, "],\"full_budget_round_cores\":[");
		for (long r = 0; r < n_rounds; r++)
			fprintf(jo, "%s%.2f", r ? "," : "", round_cores[r]);
		fprintf(jo, "],\"full_budget_shared_rounds\":%ld,\"rows\":[", shared_rounds);
		for (int i = 0; i < N_FRACTIONS; i++) {
			/* No mmap baseline (the model cannot be served from a mapping): null. */
			char mm_tps[32] = "null", vs_mm[32] = "null";
			if (mm[i].ok) {
				snprintf(mm_tps, sizeof(mm_tps), "%.3f", mm[i].tokens_per_s);
				snprintf(vs_mm, sizeof(vs_mm), "%.4f",
				         side[i].tokens_per_s / mm[i].tokens_per_s);
			}
			fprintf(jo,
			        "%s{\"budget_fraction\":%.2f,\"tokens_per_s\":%.3f,"
			        "\"inprocess_tokens_per_s\":%.3f,\"mmap_tokens_per_s\":%s,"
			        "\"hit_rate\":%.4f,\"p99_layer_us\":%.1f,\"p50_layer_us\":%.1f,"
			        "\"bytes_read\":%.0f,\"vs_floor\":%.4f,\"vs_mmap\":%s,"
			        "\"prefetch_hit_rate\":%.4f,\"bytes_read_per_token\":%.0f,"
			        "\"loader_bytes_per_token\":%.0f,\"pagecache_fill_bytes\":%.0f,"
			        "\"ready_s\":%.3f,\"first_forward_s\":%.3f,\"warm_s\":%.3f,"
			        "\"warm_bytes\":%.0f,\"cold_loader_gbps\":%.3f,\"disk_sample_"
			        "gbps\":%.3f,"
			        "\"fixed_buffers\":%.0f,"
			        "\"fixed_read_share\":%.4f,\"pool_pages\":\"%s\","
			        "\"belady_bytes_per_token\":%.0f,\"vs_belady\":%.4f,"
			        "\"belady_no_prefetch_bytes_per_token\":%.0f,"
			        "\"replayed_policy_bytes_per_token\":%.0f,"
			        "\"hint_precision\":%.4f,\"hint_recall\":%.4f,",
			        i ? "," : "", fractions[i], side[i].tokens_per_s,
			        floor_r.tokens_per_s, mm_tps, side[i].hit_rate, side[i].p99_all_us,
			        side[i].p50_us[0], side[i].bytes_read,
			        side[i].tokens_per_s / floor_r.tokens_per_s, vs_mm,
			        side[i].prefetch_hits, side[i].bytes_read / w.steps,
			        side[i].loader_bytes / w.steps,
			        isnan(side[i].pagecache_fill) ? -1.0 : side[i].pagecache_fill,
			        side[i].ready_s, side[i].first_s, side[i].warm_s,
			        side[i].warm_bytes, cold_gbps(&side[i]),
			        isnan(disk_row[i]) ? -1.0 : disk_row[i], side[i].fixed_buffers,
			        isnan(side[i].fixed_share) ? 0.0 : side[i].fixed_share,
			        side[i].pages ? side[i].pages : "n/a", side[i].opt_bytes,
			        side[i].loader_bytes / w.steps / side[i].opt_bytes,
			        side[i].opt_nopf_bytes, side[i].replay_bytes,
			        side[i].hint_hits / side[i].hint_sent,
			        side[i].hint_hits / side[i].hint_true);
			fprintf(
			    jo,
			    "\"warm_read_bytes\":%.0f,\"cold_populate_s\":%.3f,"
			    "\"cold_read_busy_s\":%.3f,\"cold_layout_s\":%.3f,\"pool_groups\":%.0f,"
			    "\"groups_at_ready\":%.0f,\"decode_loader_busy_gbps\":%.3f,\"prefill\":"
			    "[",
			    side[i].warm_read_bytes, side[i].parts.populate_s,
			    side[i].parts.read_busy_s, side[i].parts.layout_s, side[i].parts.groups,
			    side[i].parts.groups_at_ready,
			    isnan(side[i].busy_gbps) ? -1.0 : side[i].busy_gbps);
			for (int j = 0; j < n_prefills; j++)
				fprintf(jo,
				        "%s{\"tokens\":%u,\"tokens_per_s\":%.1f,\"floor_tokens_per_"
				        "s\":%.1f}",
				        j ? "," : "", prefills[j],
				        isnan(side_prefill[i][j]) ? -1.0 : side_prefill[i][j],
				        floor_prefill[j]);
			fprintf(jo, "]}");
		}
		fprintf(jo, "],\"disk_floor_gbps\":%.3f,\"sequential\":%s,\"hints\":\"%s\"}\n",
		        isnan(disk_gbps) ? -1.0 : disk_gbps, sequential ? "true" : "false",
		        hints_names[hints]);
		fclose(jo);
		json_write_nulls(out, jbuf);
		free(jbuf);
	}
	if (out && out != stdout)
		fclose(out);
	if (!json) {
		printf("bench_decode: %u MoE layers x %u experts (top-%u), hidden %u, %.1f MiB of "
		       "experts; %u timed decode steps after %u warm-up, k_defer %u\n",
		       w.n_layers, w.n_experts, w.top_k, w.hidden,
		       (double)cat->expert_bytes_total / 1048576.0, w.steps, w.warm_steps, K_DEFER);
		printf("mmap baseline limit: %s\n\n", lim.what);
		printf("in-process floor (all resident): %.1f tokens/s; in-process over residency, "
		       "everything fitting (diagnostic): %.1f tokens/s (%.2fx)\n\n",
		       floor_r.tokens_per_s, resid_r.tokens_per_s,
		       resid_r.tokens_per_s / floor_r.tokens_per_s);
		printf("%7s %10s %9s %10s %9s %8s %10s %10s %10s\n", "budget", "sidecar",
		       "vs floor", "mmap", "vs mmap", "hit%", "p99 us", "MiB read", "");
		for (int i = 0; i < N_FRACTIONS; i++) {
			char mm_tps[16] = "n/a", vs_mm[16] = "n/a";
			if (mm[i].ok) {
				snprintf(mm_tps, sizeof(mm_tps), "%.1f", mm[i].tokens_per_s);
				snprintf(vs_mm, sizeof(vs_mm), "%.2fx",
				         side[i].tokens_per_s / mm[i].tokens_per_s);
			}
			printf("%6.0f%% %10.1f %8.2fx %10s %9s %7.1f%% %10.1f %10.1f\n",
			       fractions[i] * 100, side[i].tokens_per_s,
			       side[i].tokens_per_s / floor_r.tokens_per_s, mm_tps, vs_mm,
			       100 * side[i].hit_rate, side[i].p99_all_us,
			       side[i].bytes_read / 1048576.0);
		}
		printf("\n%7s %9s %11s %11s %12s %9s %9s %9s %10s %8s %9s %6s\n", "budget",
		       "prefetch%", "read MiB/t", "load MiB/t", "pcache MiB", "ready s", "first s",
		       "warm s", "load GB/s", "vs disk", "fixed buf", "pages");
		for (int i = 0; i < N_FRACTIONS; i++) {
			char pc[16] = "n/a";
			if (!isnan(side[i].pagecache_fill))
				snprintf(pc, sizeof(pc), "%.1f",
				         side[i].pagecache_fill / 1048576.0);
			printf("%6.0f%% %8.1f%% %11.2f %11.2f %12s %9.2f %9.2f %9.2f %10.2f %7.2fx "
			       "%9.0f %6s\n",
			       fractions[i] * 100, 100 * side[i].prefetch_hits,
			       side[i].bytes_read / w.steps / 1048576.0,
			       side[i].loader_bytes / w.steps / 1048576.0, pc, side[i].ready_s,
			       side[i].first_s, side[i].warm_s, cold_gbps(&side[i]),
			       cold_gbps(&side[i]) / disk_row[i], side[i].fixed_buffers,
			       side[i].pages ? side[i].pages : "n/a");
		}
		printf("disk floor: %.2f GB/s at the start (the experts' bytes read once with "
		       "O_DIRECT, "
		       "1 MiB x 32 in flight); each row's \"vs disk\" is against its own sample "
		       "(up to 4 GiB) read just before its cold start:",
		       disk_gbps);
		for (int i = 0; i < N_FRACTIONS; i++)
			printf(" %.2f", disk_row[i]);
		printf(" GB/s%s\n", sequential ? "; engines ran one at a time (sequential)" : "");
		printf("\nhints: %s%s; bytes per timed token against Belady's OPT over the "
		       "recorded run (same trace, budget and size classes; OPT given the sidecar's "
		       "prefetches):\n",
		       hints_names[hints],
		       hints == HINTS_ORACLE ? " (the next layer's true experts)"
		       : hints == HINTS_NONE ? " (no PREFETCH)"
		                             : " (the next layer's router on this layer's input)");
		printf("%7s %11s %11s %9s %14s %13s %10s %8s\n", "budget", "load MiB/t",
		       "OPT MiB/t", "vs OPT", "OPT no-pf MiB/t", "replay MiB/t", "hint prec",
		       "recall");
		for (int i = 0; i < N_FRACTIONS; i++) {
			if (isnan(side[i].opt_bytes)) {
				printf("%6.0f%% %11.2f %11s\n", fractions[i] * 100,
				       side[i].loader_bytes / w.steps / 1048576.0,
				       "(not replayed)");
				continue;
			}
			char prec[16] = "-", rec[16] = "-";
			if (side[i].hint_sent > 0) {
				snprintf(prec, sizeof(prec), "%.3f",
				         side[i].hint_hits / side[i].hint_sent);
				snprintf(rec, sizeof(rec), "%.3f",
				         side[i].hint_hits / side[i].hint_true);
			}
			printf("%6.0f%% %11.2f %11.2f %8.2fx %14.2f %13.2f %10s %8s\n",
			       fractions[i] * 100, side[i].loader_bytes / w.steps / 1048576.0,
			       side[i].opt_bytes / 1048576.0,
			       side[i].loader_bytes / w.steps / side[i].opt_bytes,
			       side[i].opt_nopf_bytes / 1048576.0, side[i].replay_bytes / 1048576.0,
			       prec, rec);
		}
		printf(
		    "\ncold start (spawn -> warm set) against the row's disk sample, and its parts "
		    "(seconds, summed over nodes: the pool's populate thread, the loader with "
		    "reads in flight, the post-load layout stage); decode: the loader's GB/s "
		    "while it had reads in flight over the timed steps\n");
		printf("%7s %9s %9s %10s %8s %11s %10s %10s %9s %12s %9s\n", "budget", "warm s",
		       "read GB", "cold GB/s", "vs disk", "populate s", "groups", "read s",
		       "layout s", "decode GB/s", "vs disk");
		for (int i = 0; i < N_FRACTIONS; i++) {
			char groups[32];
			snprintf(groups, sizeof(groups), "%.0f/%.0f", side[i].parts.groups_at_ready,
			         side[i].parts.groups);
			printf("%6.0f%% %9.2f %9.2f %10.2f %7.2fx %11.2f %10s %10.2f %9.2f %12.2f "
			       "%8.2fx\n",
			       fractions[i] * 100, side[i].warm_s, side[i].warm_read_bytes / 1e9,
			       cold_gbps(&side[i]), cold_gbps(&side[i]) / disk_row[i],
			       side[i].parts.populate_s, groups, side[i].parts.read_busy_s,
			       side[i].parts.layout_s, side[i].busy_gbps,
			       side[i].busy_gbps / disk_row[i]);
		}
		printf("(groups: populated when first asked after READY / the pool's)\n");
		if (n_prefills) {
			printf(
			    "\nprefill through every MoE layer, tokens/s (floor: in-process, all "
			    "resident):\n%7s",
			    "tokens");
			printf(" %10s", "floor");
			for (int i = 0; i < N_FRACTIONS; i++)
				if (fractions[i] == 1.0 || fractions[i] == 0.5)
					printf("   sidecar %3.0f%%", fractions[i] * 100);
			printf("\n");
			for (int j = 0; j < n_prefills; j++) {
				printf("%7u %10.1f", prefills[j], floor_prefill[j]);
				for (int i = 0; i < N_FRACTIONS; i++)
					if (fractions[i] == 1.0 || fractions[i] == 0.5)
						printf(" %15.1f", side_prefill[i][j]);
				printf("\n");
			}
		}
		printf("\nper-layer FORWARD latency through the sidecar, p50 / p99 us:\n%6s",
		       "layer");
		for (int i = 0; i < N_FRACTIONS; i++)
			printf("   %9.0f%% budget", fractions[i] * 100);
		printf("\n");
		for (uint32_t li = 0; li < w.n_layers; li++) {
			printf("%6u", w.first_layer + li);
			for (int i = 0; i < N_FRACTIONS; i++)
				printf("   %8.0f / %7.0f", side[i].p50_us[li], side[i].p99_us[li]);
			printf("\n");
		}
		if (n_rounds) {
			printf("\n100%% budget, sidecar / floor per alternating round:");
			for (long r = 0; r < n_rounds; r++)
				printf(" %.3f", round_ratio[r]);
			printf(" (the median round is reported)\n");
			printf("cores' worth of FMA throughput around each round:");
			for (long r = 0; r < n_rounds; r++)
				printf(" %.2f", round_cores[r]);
			printf("; %ld round%s redone (run on one core's worth)\n", shared_rounds,
			       shared_rounds == 1 ? "" : "s");
			printf("per-layer p50 in that round (layer 0): floor %.1f us, in-process "
			       "residency %.1f us, sidecar %.1f us\n",
			       floor_r.p50_us[0], resid_r.p50_us[0], side[0].p50_us[0]);
			printf("in-process over residency / floor, same rounds:");
			for (long r = 0; r < n_rounds; r++)
				printf(" %.3f", round_resid[r]);
			printf("\n");
		}
		printf("\ntargets:");
		for (int i = 0; i < N_FRACTIONS; i++) {
			if (fractions[i] == 0.5 && mm[i].ok)
				printf(" 50%% budget >= 3x mmap (%.2fx);",
				       side[i].tokens_per_s / mm[i].tokens_per_s);
			else if (fractions[i] == 0.5)
				printf(
				    " 50%% budget >= 3x mmap (no mmap baseline for this model);");
			if (fractions[i] == 1.0)
				printf(" 100%% budget within 10%% of the floor (%.2fx);",
				       side[i].tokens_per_s / floor_r.tokens_per_s);
		}
		printf("\n");
	}
	if (png)
		plot(png, side, &floor_r, mm);

	free(disk_ranges);
	for (uint32_t f = 0; f < n_disk_fds; f++)
		if (disk_fds[f] > 0)
			close(disk_fds[f]);
	free(disk_fds);
	free(w.line_of);
	trace_free(&w.tr);
	moe_catalog_close(cat);
	return 0;
}
