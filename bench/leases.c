/* bench_leases — expert leases (serve --leases): how fast experts are made available to an
 * engine, against the memory and the disk they come from, in one run.
 *
 *   resident   LEASE + RELEASE of a whole layer whose experts are resident (the sidecar's
 *              bookkeeping only): GB/s of expert bytes made available
 *   cold       the same for layers that must be read first (a 50 % budget, layers swept in
 *              order so that each lease finds its layer evicted): GB/s
 *   memcpy     copying a leased layer out of the read-only pool mapping (what an engine's
 *              H2D copy or staging does at best): GB/s
 *   deinterleave  moe_lease_deinterleave of the same layer into GGUF rows (the decode
 *              layout's cost to an engine that needs rows): GB/s
 *   O_DIRECT   every expert's extents read with O_DIRECT through io_uring (odirect.h): GB/s
 *
 * Ratios: resident / memcpy, cold / O_DIRECT, deinterleave / memcpy, and the BF16 form on
 * every worker against a second sidecar of one worker (--threads 1), alternating. A timeline of one
 * layer (lease, copy, release) is printed too.
 *
 * Split: the same model on a sidecar that splits each expert's rows over two synthetic NUMA
 * nodes (one pool each, 1 worker per node) against one of one node (2 workers), alternating
 * rounds: a cold sweep, resident lease+release, the copy out slice by slice and
 * moe_lease_rows (the whole matrices as GGUF rows, gathered from the slices) — split / one.
 *
 *   bench_leases [--format q4_k|bf16|q8_0…] [--layers N] [--experts N] [--hidden N] [--ffn N]
 *                [--rounds N] [--file-layout] [--dir DIR]
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "catalog.h"
#include "catalog_adapter.h"
#include "clock.h"
#include "expert_map.h"
#include "moe_client.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "odirect.h"
#include "stats_field.h"

static char tmp_dir[256];
static pid_t tmp_owner;

static void cleanup(void)
{
	if (getpid() != tmp_owner)
		return;
	char p[300];
	snprintf(p, sizeof(p), "%s/model.gguf", tmp_dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/s.sock", tmp_dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/s1.sock", tmp_dir);
	unlink(p);
	/* a sidecar killed before its exit leaves its socket's lock */
	snprintf(p, sizeof(p), "%s/s.sock.lock", tmp_dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/s1.sock.lock", tmp_dir);
	unlink(p);
	rmdir(tmp_dir);
}

static char staging_mib[16] = "0"; /* each channel's: room for one layer's BF16 form */

static const char *spawn_numa; /* --numa for the next spawn (NULL: the default) */

static pid_t spawn(const char *model, const char *sock, const char *budget, bool file_layout,
                   const char *threads)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0)
		return -1;
	const pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		char fd[16];
		snprintf(fd, sizeof(fd), "%d", dup(p[1]));
		const char *argv[20] = {MOE_SIDECAR_BIN,
		                        "serve",
		                        model,
		                        "--leases",
		                        "--mem-budget",
		                        budget,
		                        "--socket",
		                        sock,
		                        "--ready-fd",
		                        fd,
		                        "--log-level",
		                        "warn",
		                        "--probes-instance",
		                        spawn_numa ? "bench-leases-split"
		                        : threads  ? "bench-leases-1"
		                                   : "bench-leases",
		                        "--lease-staging-mib",
		                        staging_mib,
		                        NULL};
		int a = 16;
		if (file_layout)
			argv[a++] = "--file-layout";
		if (threads) {
			argv[a++] = "--threads";
			argv[a++] = threads;
		}
		if (spawn_numa) {
			argv[a++] = "--numa";
			argv[a++] = spawn_numa;
		}
		execv(MOE_SIDECAR_BIN, (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	char line[256];
	const ssize_t n = read(p[0], line, sizeof(line) - 1);
	close(p[0]);
	if (n < 6 || strncmp(line, "READY ", 6) != 0) {
		waitpid(pid, NULL, 0);
		return -1;
	}
	return pid;
}

static uint64_t matrix_bytes(const struct moe_lease_matrix *m)
{
	const struct moek_format_info *f = moek_format_lookup(m->format);
	return f ? (uint64_t)m->rows * (m->cols / f->block_elems) * f->block_bytes : 0;
}

static uint64_t lease_bytes(const struct moe_lease_expert *le, uint32_t n)
{
	uint64_t b = 0;
	for (uint32_t i = 0; i < n; i++)
		b +=
		    matrix_bytes(&le[i].gate) + matrix_bytes(&le[i].up) + matrix_bytes(&le[i].down);
	return b;
}

/* One round of the split comparison on c: a cold sweep of every layer, resident lease+release
 * of the last, then (held) its copy out slice by slice and moe_lease_rows; times add up in r,
 * copy and rows as minima. 0, or -1 (a lease failed). */
struct lease_rates {
	double cold_s, res_s, cp_s, rows_s;
	uint64_t cold_bytes, res_bytes, layer_bytes;
};
static int split_round(struct moe_client *c, const int32_t *blocks, uint32_t n_layers,
                       uint32_t experts, struct moe_lease_expert *le, uint8_t *dst,
                       struct lease_rates *r)
{
	for (uint32_t l = 0; l < n_layers; l++) {
		const double t0 = monotonic_s();
		if (moe_lease(c, blocks[l], NULL, experts, 0, le, 30000) != MOE_OK ||
		    moe_lease_release(c, NULL, 0, 5000) != MOE_OK)
			return -1;
		r->cold_s += monotonic_s() - t0;
		r->cold_bytes += lease_bytes(le, experts);
	}
	const int32_t layer = blocks[n_layers - 1];
	for (uint32_t i = 0; i < 10; i++) {
		const double t0 = monotonic_s();
		if (moe_lease(c, layer, NULL, experts, 0, le, 30000) != MOE_OK ||
		    moe_lease_release(c, NULL, 0, 5000) != MOE_OK)
			return -1;
		r->res_s += monotonic_s() - t0;
		r->res_bytes += lease_bytes(le, experts);
	}
	if (moe_lease(c, layer, NULL, experts, 0, le, 30000) != MOE_OK)
		return -1;
	r->layer_bytes = lease_bytes(le, experts);
	double t0 = monotonic_s();
	size_t at = 0;
	for (uint32_t i = 0; i < experts; i++) {
		const struct moe_lease_matrix *m[3] = {&le[i].gate, &le[i].up, &le[i].down};
		for (int p = 0; p < 3; p++) {
			struct moe_lease_slice sl[MOE_LEASE_MAX_POOLS];
			uint32_t k = 0;
			moe_lease_slices(c, &le[i], m[p], sl, MOE_LEASE_MAX_POOLS, &k);
			for (uint32_t j = 0; j < k; j++) {
				const void *base;
				moe_lease_pool_at(c, sl[j].pool, &base, NULL, NULL);
				const uint64_t b = matrix_bytes(m[p]) / m[p]->rows * sl[j].rows;
				memcpy(dst + at, (const uint8_t *)base + sl[j].offset, b);
				at += b;
			}
		}
	}
	const double cp = monotonic_s() - t0;
	t0 = monotonic_s();
	at = 0;
	for (uint32_t i = 0; i < experts; i++) {
		const struct moe_lease_matrix *m[3] = {&le[i].gate, &le[i].up, &le[i].down};
		for (int p = 0; p < 3; p++) {
			const uint64_t b = matrix_bytes(m[p]);
			moe_lease_rows(c, &le[i], m[p], dst + at, b);
			at += b;
		}
	}
	const double rows = monotonic_s() - t0;
	r->cp_s = !r->cp_s || cp < r->cp_s ? cp : r->cp_s;
	r->rows_s = !r->rows_s || rows < r->rows_s ? rows : r->rows_s;
	return moe_lease_release(c, NULL, 0, 5000) == MOE_OK ? 0 : -1;
}

/* Waits (up to 60 s) until c's sidecar has populated every group of its slot pools: the
 * background pre-faulting competes with what is measured. */
static void wait_populated(struct moe_client *c)
{
	char *js = malloc(1u << 20);
	for (int i = 0; js && i < 600; i++) {
		if (moe_stats_json(c, js, 1u << 20, 5000) != MOE_OK)
			break;
		const double g = stats_field(js, "pool_groups"),
		             done = stats_field(js, "pool_populated_groups");
		if (!(done < g))
			break;
		struct timespec ts = {.tv_nsec = 100000000};
		nanosleep(&ts, NULL);
	}
	free(js);
}

int main(int argc, char **argv)
{
	const char *fmt_name = "q4_k", *dir = "/var/tmp";
	uint32_t layers = 8, experts = 64, hidden = 1024, ffn = 512, rounds = 5;
	bool file_layout = false;
	static const struct option opts[] = {{"format", required_argument, NULL, 'f'},
	                                     {"layers", required_argument, NULL, 'l'},
	                                     {"experts", required_argument, NULL, 'e'},
	                                     {"hidden", required_argument, NULL, 'h'},
	                                     {"ffn", required_argument, NULL, 'F'},
	                                     {"rounds", required_argument, NULL, 'r'},
	                                     {"file-layout", no_argument, NULL, 'L'},
	                                     {"dir", required_argument, NULL, 'd'},
	                                     {0}};
	for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		switch (c) {
		case 'f': fmt_name = optarg; break;
		case 'l': layers = (uint32_t)atoi(optarg); break;
		case 'e': experts = (uint32_t)atoi(optarg); break;
		case 'h': hidden = (uint32_t)atoi(optarg); break;
		case 'F': ffn = (uint32_t)atoi(optarg); break;
		case 'r': rounds = (uint32_t)atoi(optarg); break;
		case 'L': file_layout = true; break;
		case 'd': dir = optarg; break;
		default:
			fprintf(stderr, "bench_leases: see the comment at the top of leases.c\n");
			return 2;
		}
	}
	uint32_t format = UINT32_MAX;
	for (size_t i = 0; moek_format_at(i); i++)
		if (!strcasecmp(moek_format_at(i)->name, fmt_name))
			format = moek_format_at(i)->format;
	if (format == UINT32_MAX || experts > 256 || layers < 4) {
		fprintf(stderr,
		        "bench_leases: format %s unknown, or experts > 256, or layers < 4\n",
		        fmt_name);
		return 2;
	}
	snprintf(tmp_dir, sizeof(tmp_dir), "%s/bench-leases.XXXXXX", dir);
	if (!mkdtemp(tmp_dir)) {
		fprintf(stderr, "bench_leases: mkdtemp in %s: %s\n", dir, strerror(errno));
		return 1;
	}
	tmp_owner = getpid();
	atexit(cleanup);
	char model[300], sock[300];
	snprintf(model, sizeof(model), "%s/model.gguf", tmp_dir);
	snprintf(sock, sizeof(sock), "%s/s.sock", tmp_dir);
	struct sidecar_error err;
	struct moe_gen_options go = {.preset = "qwen3-30b-a3b",
	                             .out = model,
	                             .format = format,
	                             .seed = 5,
	                             .layers = layers,
	                             .experts = experts,
	                             .hidden = hidden,
	                             .ffn = ffn};
	if (moe_gen_write(&go, &err) != 0) {
		fprintf(stderr, "bench_leases: generating the model: %s\n", err.msg);
		return 1;
	}
	/* The disk's floor: every expert's extents with O_DIRECT. */
	struct moe_catalog *cat;
	struct expert_map map = {0};
	if (moe_catalog_open(model, &cat, &err) != 0 ||
	    expert_map_from_catalog(cat, &map, NULL, NULL, &err) != 0) {
		fprintf(stderr, "bench_leases: %s\n", err.msg);
		return 1;
	}
	int *fds = calloc(map.n_files, sizeof(int));
	for (uint32_t f = 0; f < map.n_files; f++)
		fds[f] = open(map.paths[f], O_RDONLY | O_DIRECT);
	uint32_t n_ranges = 0;
	uint64_t range_bytes = 0, odirect_bytes = 0;
	struct bench_range *ranges = bench_expert_ranges(&map, fds, &n_ranges, &range_bytes);
	if (!ranges)
		return 1;
	const double od_s = bench_odirect_read(ranges, n_ranges, 1u << 20, 32, &odirect_bytes);
	if (od_s <= 0) {
		fprintf(stderr, "bench_leases: the O_DIRECT baseline failed (a disk file system? "
		                "--dir)\n");
		return 1;
	}
	const double od_gbs = (double)odirect_bytes / od_s / 1e9;

	/* Room for one layer's BF16 form (3 matrices of ffn x hidden per expert). */
	snprintf(staging_mib, sizeof(staging_mib), "%llu",
	         (unsigned long long)(((uint64_t)experts * 3 * ffn * hidden * 2 >> 20) + 8));
	/* 50 %: the layers swept in order never find theirs resident after the first ones. */
	const pid_t pid = spawn(model, sock, "50%", file_layout, NULL);
	if (pid < 0) {
		fprintf(stderr, "bench_leases: the sidecar did not start\n");
		return 1;
	}
	struct moe_connect_opts o = {
	    .socket_path = sock, .max_tokens = 256, .n_slots = 2, .client_name = "bench_leases"};
	struct moe_client *c;
	if (moe_connect(&o, &c) != MOE_OK) {
		fprintf(stderr, "bench_leases: %s\n", moe_connect_error());
		kill(pid, SIGTERM);
		return 1;
	}
	const struct moe_info *inf = moe_info(c);
	int32_t *blocks = malloc(inf->n_moe_layers * sizeof(int32_t));
	moe_model_layers(c, blocks, inf->n_moe_layers);
	struct moe_lease_expert *le = calloc(experts, sizeof(*le));
	const void *pool;
	size_t pool_bytes;
	moe_lease_pool(c, &pool, &pool_bytes, NULL);

	/* Cold: sweep every layer `rounds` times (after the first sweep each layer was evicted
	 * by the ones after it: 50 % holds about half of them). */
	uint64_t cold_bytes = 0;
	double cold_s = 0;
	for (uint32_t r = 0; r < rounds + 1; r++)
		for (uint32_t l = 0; l < inf->n_moe_layers; l++) {
			const double t0 = monotonic_s();
			int rc = moe_lease(c, blocks[l], NULL, experts, 0, le, 30000);
			if (rc == MOE_OK)
				rc = moe_lease_release(c, NULL, 0, 5000);
			if (rc != MOE_OK) {
				fprintf(stderr, "bench_leases: cold lease: %s\n",
				        moe_last_error(c));
				kill(pid, SIGTERM);
				return 1;
			}
			if (r > 0) { /* the first sweep finds the warm-up's leftovers */
				cold_s += monotonic_s() - t0;
				cold_bytes += lease_bytes(le, experts);
			}
		}
	/* Resident: one layer, again and again; then its copies. */
	uint64_t res_bytes = 0;
	double res_s = 0;
	const int32_t layer = blocks[inf->n_moe_layers - 1];
	moe_lease(c, layer, NULL, experts, 0, le, 30000);
	moe_lease_release(c, NULL, 0, 5000);
	const uint32_t reps = 50;
	for (uint32_t i = 0; i < reps; i++) {
		const double t0 = monotonic_s();
		moe_lease(c, layer, NULL, experts, 0, le, 30000);
		moe_lease_release(c, NULL, 0, 5000);
		res_s += monotonic_s() - t0;
		res_bytes += lease_bytes(le, experts);
	}
	/* Held: copy out (memcpy) and de-interleave, with a timeline of one layer. */
	const double tl0 = monotonic_s();
	moe_lease(c, layer, NULL, experts, 0, le, 30000);
	const double tl_lease = monotonic_s() - tl0;
	const uint64_t layer_bytes = lease_bytes(le, experts);
	uint8_t *dst = malloc(layer_bytes + 4096);
	memset(dst, 1, layer_bytes + 4096);
	double cp_s = 1e9, di_s = 1e9;
	for (uint32_t r = 0; r < rounds; r++) {
		double t0 = monotonic_s();
		size_t at = 0;
		for (uint32_t i = 0; i < experts; i++) {
			const struct moe_lease_matrix *m[3] = {&le[i].gate, &le[i].up, &le[i].down};
			for (int p = 0; p < 3; p++) {
				const uint64_t b = matrix_bytes(m[p]);
				memcpy(dst + at, (const uint8_t *)pool + m[p]->offset, b);
				at += b;
			}
		}
		const double cp = monotonic_s() - t0;
		cp_s = cp < cp_s ? cp : cp_s;
		t0 = monotonic_s();
		at = 0;
		for (uint32_t i = 0; i < experts; i++) {
			const struct moe_lease_matrix *m[3] = {&le[i].gate, &le[i].up, &le[i].down};
			for (int p = 0; p < 3; p++) {
				const uint64_t b = matrix_bytes(m[p]);
				moe_lease_deinterleave(m[p], pool, dst + at, b);
				at += b;
			}
		}
		const double di = monotonic_s() - t0;
		di_s = di < di_s ? di : di_s;
	}
	const double tr0 = monotonic_s();
	moe_lease_release(c, NULL, 0, 5000);
	const double tl_release = monotonic_s() - tr0;
	const uint32_t interleaved = le[0].gate.interleave;
	/* The BF16 form of the same resident layer: GB/s of BF16 rows written to staging, on
	 * this sidecar's workers and, alternating with it, on a second sidecar of one worker
	 * (--threads 1: the serving thread alone, as before the BF16 form ran on the pool). */
	char sock1[300];
	snprintf(sock1, sizeof(sock1), "%s/s1.sock", tmp_dir);
	const pid_t pid1 = spawn(model, sock1, "50%", file_layout, "1");
	struct moe_client *c1 = NULL;
	struct moe_connect_opts o1 = o;
	o1.socket_path = sock1;
	if (pid1 < 0 || moe_connect(&o1, &c1) != MOE_OK) {
		fprintf(stderr, "bench_leases: the one-worker sidecar did not start\n");
		c1 = NULL;
	}
	double bf_s = 1e9, bf1_s = 1e9;
	uint64_t bf_bytes = 0;
	for (uint32_t r = 0; r < rounds * 2; r++) {
		struct moe_client *cc = (r & 1) && c1 ? c1 : c;
		const double t0 = monotonic_s();
		const int rc = moe_lease(cc, layer, NULL, experts, MOE_LEASE_BF16, le, 30000);
		const double t = monotonic_s() - t0;
		if (rc != MOE_OK) {
			fprintf(stderr, "bench_leases: BF16 lease: %s\n", moe_last_error(cc));
			break;
		}
		if (cc == c1)
			bf1_s = t < bf1_s ? t : bf1_s;
		else
			bf_s = t < bf_s ? t : bf_s;
		bf_bytes = 0;
		for (uint32_t i = 0; i < experts; i++)
			bf_bytes += le[i].gate.bytes + le[i].up.bytes + le[i].down.bytes;
		moe_lease_release(cc, NULL, 0, 5000);
	}

	const double res_gbs = (double)res_bytes / res_s / 1e9,
	             cold_gbs = (double)cold_bytes / cold_s / 1e9,
	             cp_gbs = (double)layer_bytes / cp_s / 1e9,
	             di_gbs = (double)layer_bytes / di_s / 1e9;
	printf("bench_leases: %s, %u layers x %u experts (hidden %u, ffn %u), %s layout; a layer "
	       "is %.1f MiB\n",
	       fmt_name, layers, experts, hidden, ffn,
	       interleaved ? "decode (interleaved by 8)" : "file rows", layer_bytes / 1048576.0);
	printf("  %-34s %8.2f GB/s   / memcpy %.3f\n", "lease resident (lease+release)", res_gbs,
	       res_gbs / cp_gbs);
	printf("  %-34s %8.2f GB/s   / O_DIRECT %.3f\n", "lease cold (read, lease, release)",
	       cold_gbs, cold_gbs / od_gbs);
	printf("  %-34s %8.2f GB/s\n", "memcpy out of the pool mapping", cp_gbs);
	printf("  %-34s %8.2f GB/s   / memcpy %.3f\n", "moe_lease_deinterleave", di_gbs,
	       di_gbs / cp_gbs);
	printf("  %-34s %8.2f GB/s\n", "O_DIRECT, every expert", od_gbs);
	if (bf_bytes) {
		printf("  %-34s %8.2f GB/s of BF16 (%.1f ms a layer, every worker)",
		       "lease BF16 form (resident)", (double)bf_bytes / bf_s / 1e9, bf_s * 1e3);
		if (c1 && bf1_s < 1e9)
			printf("   x%.2f of one worker's (%.1f ms)", bf1_s / bf_s, bf1_s * 1e3);
		printf("\n");
	}
	printf("  timeline of one resident layer: lease %.3f ms, copy %.3f ms, de-interleave %.3f "
	       "ms, release %.3f ms\n",
	       tl_lease * 1e3, cp_s * 1e3, di_s * 1e3, tl_release * 1e3);
	moe_close(c);
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	if (c1)
		moe_close(c1);
	if (pid1 > 0) {
		kill(pid1, SIGTERM);
		waitpid(pid1, NULL, 0);
	}
	/* Split over two synthetic nodes against one node, the same worker count, alternating. */
	char sock_a[300], sock_b[300];
	snprintf(sock_a, sizeof(sock_a), "%s/s.sock", tmp_dir);
	snprintf(sock_b, sizeof(sock_b), "%s/s1.sock", tmp_dir);
	spawn_numa = NULL;
	const pid_t pa = spawn(model, sock_a, "50%", file_layout, "2");
	spawn_numa = "synthetic:pack:1 numa:2 core:1 pu:1";
	const pid_t pb = spawn(model, sock_b, "50%", file_layout, "1");
	struct moe_client *ca = NULL, *cb = NULL;
	struct moe_connect_opts oa = o, ob = o;
	oa.socket_path = sock_a;
	ob.socket_path = sock_b;
	if (pa > 0 && pb > 0 && moe_connect(&oa, &ca) == MOE_OK &&
	    moe_connect(&ob, &cb) == MOE_OK) {
		struct lease_rates ra = {0}, rb = {0};
		bool ok = moe_lease_pool_count(cb) == 2;
		if (!ok)
			fprintf(stderr,
			        "bench_leases: the split sidecar shares %u pools (its slices "
			        "cannot be cut for this shape?)\n",
			        moe_lease_pool_count(cb));
		wait_populated(ca);
		wait_populated(cb);
		/* a first sweep each, untimed: the warm-up's leftovers */
		struct lease_rates warm = {0};
		ok = ok &&
		     split_round(ca, blocks, inf->n_moe_layers, experts, le, dst, &warm) == 0 &&
		     split_round(cb, blocks, inf->n_moe_layers, experts, le, dst, &warm) == 0;
		for (uint32_t r = 0; ok && r < rounds; r++)
			ok = split_round(ca, blocks, inf->n_moe_layers, experts, le, dst, &ra) ==
			         0 &&
			     split_round(cb, blocks, inf->n_moe_layers, experts, le, dst, &rb) == 0;
		if (ok) {
#define GBS(b, t) ((double)(b) / (t) / 1e9)
			printf("  split over 2 synthetic nodes (1 worker each) / one node (2 "
			       "workers), "
			       "%u alternating rounds:\n",
			       rounds);
			printf("    %-32s %8.2f / %8.2f GB/s   split/one %.3f\n", "lease cold",
			       GBS(rb.cold_bytes, rb.cold_s), GBS(ra.cold_bytes, ra.cold_s),
			       GBS(rb.cold_bytes, rb.cold_s) / GBS(ra.cold_bytes, ra.cold_s));
			printf("    %-32s %8.2f / %8.2f GB/s   split/one %.3f\n", "lease resident",
			       GBS(rb.res_bytes, rb.res_s), GBS(ra.res_bytes, ra.res_s),
			       GBS(rb.res_bytes, rb.res_s) / GBS(ra.res_bytes, ra.res_s));
			printf("    %-32s %8.2f / %8.2f GB/s   split/one %.3f\n",
			       "copy out (slice by slice)", GBS(rb.layer_bytes, rb.cp_s),
			       GBS(ra.layer_bytes, ra.cp_s),
			       GBS(rb.layer_bytes, rb.cp_s) / GBS(ra.layer_bytes, ra.cp_s));
			printf("    %-32s %8.2f / %8.2f GB/s   split/one %.3f\n",
			       "moe_lease_rows (GGUF rows)", GBS(rb.layer_bytes, rb.rows_s),
			       GBS(ra.layer_bytes, ra.rows_s),
			       GBS(rb.layer_bytes, rb.rows_s) / GBS(ra.layer_bytes, ra.rows_s));
#undef GBS
		} else
			fprintf(stderr, "bench_leases: split comparison: %s\n",
			        cb ? moe_last_error(cb) : "");
	} else
		fprintf(stderr, "bench_leases: the split comparison's sidecars did not start\n");
	if (ca)
		moe_close(ca);
	if (cb)
		moe_close(cb);
	for (int i = 0; i < 2; i++) {
		const pid_t q = i ? pb : pa;
		if (q > 0) {
			kill(q, SIGTERM);
			waitpid(q, NULL, 0);
		}
	}
	free(dst);
	free(le);
	free(blocks);
	free(ranges);
	for (uint32_t f = 0; f < map.n_files; f++)
		close(fds[f]);
	free(fds);
	expert_map_free(&map);
	moe_catalog_close(cat);
	return 0;
}
