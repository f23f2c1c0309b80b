/* bench/loader.c — cold-load throughput of the residency loader against a plain io_uring
 * O_DIRECT sequential read of the same bytes, in the same run.
 *
 * The model is generated (libmoe_gen; default: 2 layers × 32 experts of Qwen3-30B-A3B's
 * shapes in Q8_0 GGUF, ≈320 MB, expert slabs not 4 KiB-aligned) or given with --model.
 * Each round, with the page cache of the model files dropped first:
 *   loader:   a fresh residency (budget = every expert) demands every expert at once and
 *             waits for all; timed from the first demand to the last load;
 *   baseline: one io_uring, O_DIRECT, the same aligned byte ranges read in file order in
 *             blocks of the same size at the same queue depth into registered buffers.
 * Rounds alternate which goes first (the disk is noisy). Reported: medians of both rates,
 * the median of the per-round ratios loader/baseline, and the loader's system CPU time per
 * GiB (getrusage, all threads). Design targets: ratio ≥ 0.90, sys ≤ 0.15 s/GiB.
 *
 *   bench_loader [--model PATH | --preset NAME] [--layers N] [--experts N] [--format F]
 *                [--rounds N] [--chunk BYTES] [--depth N] [--dir DIR] [--json]
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "catalog_adapter.h"
#include "clock.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "odirect.h"
#include "progress.h"
#include "residency.h"

static double cpu_sys_s(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static int drop_page_cache(const struct expert_map *map)
{
	for (uint32_t f = 0; f < map->n_files; f++) {
		int fd = open(map->paths[f], O_RDONLY);
		if (fd < 0) {
			fprintf(stderr, "bench_loader: %s: %s\n", map->paths[f], strerror(errno));
			return -1;
		}
		if (fdatasync(fd) != 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) {
			fprintf(stderr, "bench_loader: %s: dropping its page cache: %s\n",
			        map->paths[f], strerror(errno));
			close(fd);
			return -1;
		}
		close(fd);
	}
	return 0;
}

/* The loader: every expert demanded at once, then waited for. Returns seconds. */
static double run_loader(const struct expert_map *map, const struct residency_config *cfg,
                         double *sys_s, uint64_t *bytes_read, struct residency_counters *out)
{
	struct residency *r;
	struct sidecar_error err = {0};
	if (residency_create(&r, map, cfg, &err) != 0) {
		fprintf(stderr, "bench_loader: %s\n", err.msg);
		return -1;
	}
	const uint32_t n_ids = map->n_layers * map->n_experts;
	double secs = -1;
	double sys0 = cpu_sys_s();
	double t0 = monotonic_s();
	for (uint32_t id = 0; id < n_ids; id++) {
		struct expert_ref ref;
		int rc = residency_acquire(r, id / map->n_experts, id % map->n_experts, 1.0f,
		                           RESIDENCY_NOWAIT, &ref);
		if (rc == 0) {
			residency_release(r, &ref);
		} else if (rc != -EINPROGRESS) {
			fprintf(stderr, "bench_loader: demand %u: %s\n", id, strerror(-rc));
			goto out;
		}
	}
	for (uint32_t id = 0; id < n_ids; id++) {
		struct expert_ref ref;
		int rc = residency_acquire(r, id / map->n_experts, id % map->n_experts, 1.0f,
		                           RESIDENCY_RETRY, &ref);
		if (rc != 0) {
			residency_error_message(r, id / map->n_experts, id % map->n_experts,
			                        err.msg, sizeof(err.msg));
			fprintf(stderr, "bench_loader: %s\n", err.msg);
			goto out;
		}
		residency_release(r, &ref);
	}
	secs = monotonic_s() - t0;
	*sys_s = cpu_sys_s() - sys0;
	residency_counters(r, out);
	*bytes_read = out->bytes_read;
out:
	residency_destroy(r);
	return secs;
}

static int compare_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), compare_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static const char usage_text[] =
    "usage: bench_loader [--model PATH | --preset NAME] [--layers N] [--experts N]\n"
    "                    [--format Q4_K|Q8_0|BF16|…] [--rounds N] [--chunk BYTES]\n"
    "                    [--depth N] [--dir DIR] [--json]\n";

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"model", required_argument, NULL, 'm'},  {"preset", required_argument, NULL, 'p'},
	    {"layers", required_argument, NULL, 'l'}, {"experts", required_argument, NULL, 'e'},
	    {"format", required_argument, NULL, 'f'}, {"rounds", required_argument, NULL, 'r'},
	    {"chunk", required_argument, NULL, 'c'},  {"depth", required_argument, NULL, 'd'},
	    {"dir", required_argument, NULL, 'D'},    {"json", no_argument, NULL, 'j'},
	    {"help", no_argument, NULL, 'h'},         {0},
	};
	const char *model = NULL, *preset = "qwen3-30b-a3b", *format_name = "Q8_0", *dir = "/tmp";
	unsigned long layers = 2, experts = 32, rounds = 5, chunk = 1u << 20, depth = 16;
	bool json = false;
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		char *end = NULL;
		unsigned long *num = NULL;
		switch (c) {
		case 'm': model = optarg; break;
		case 'p': preset = optarg; break;
		case 'f': format_name = optarg; break;
		case 'D': dir = optarg; break;
		case 'j': json = true; break;
		case 'l': num = &layers; break;
		case 'e': num = &experts; break;
		case 'r': num = &rounds; break;
		case 'c': num = &chunk; break;
		case 'd': num = &depth; break;
		case 'h': fputs(usage_text, stdout); return 0;
		default: fputs(usage_text, stderr); return 2;
		}
		if (num) {
			errno = 0;
			*num = strtoul(optarg, &end, 10);
			if (errno || *end || !*num || optarg[0] == '-' || *num > (1ul << 30)) {
				fprintf(stderr, "bench_loader: '%s' is not a positive integer\n",
				        optarg);
				return 2;
			}
		}
	}
	if (optind != argc || chunk % 4096 || depth > 4096 || rounds > 100) {
		fprintf(stderr, "bench_loader: chunk must be a multiple of 4096, depth ≤ 4096, "
		                "rounds ≤ 100\n");
		return 2;
	}
	char tmp[256] = "";
	struct sidecar_error merr = {0};
	if (!model) {
		uint32_t format = UINT32_MAX;
		for (uint32_t f = 0; f < 2000 && format == UINT32_MAX; f++) {
			const struct moek_format_info *fi = moek_format_lookup(f);
			if (fi && !strcmp(fi->name, format_name))
				format = f;
		}
		if (format == UINT32_MAX) {
			fprintf(stderr, "bench_loader: unknown format '%s'\n", format_name);
			return 2;
		}
		snprintf(tmp, sizeof(tmp), "%s/moe-bench-loader.XXXXXX", dir);
		if (!mkdtemp(tmp)) {
			fprintf(stderr, "bench_loader: mkdtemp %s: %s\n", tmp, strerror(errno));
			return 1;
		}
		static char path[300];
		snprintf(path, sizeof(path), "%s/model.gguf", tmp);
		struct moe_gen_options opt = {.preset = preset,
		                              .out = path,
		                              .format = format,
		                              .seed = 1,
		                              .layers = (uint32_t)layers,
		                              .experts = (uint32_t)experts,
		                              .progress = !json};
		if (moe_gen_write(&opt, &merr) != 0) {
			fprintf(stderr, "bench_loader: generating the model: %s\n", merr.msg);
			nftw(tmp, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
			return 1;
		}
		model = path;
	}
	int status = 1;
	struct moe_catalog *cat = NULL;
	struct expert_map map = {0};
	struct bench_range *ranges = NULL;
	int *fds = NULL;
	struct sidecar_error err = {0};
	if (moe_catalog_open(model, &cat, &merr) != 0) {
		fprintf(stderr, "bench_loader: %s\n", merr.msg);
		goto out;
	}
	if (expert_map_from_catalog(cat, &map, NULL, NULL, &err) != 0) {
		fprintf(stderr, "bench_loader: %s\n", err.msg);
		goto out;
	}
	fds = malloc(map.n_files * sizeof(int));
	if (!fds)
		goto out;
	for (uint32_t f = 0; f < map.n_files; f++)
		fds[f] = -1;
	for (uint32_t f = 0; f < map.n_files; f++) {
		fds[f] = open(map.paths[f], O_RDONLY | O_DIRECT);
		if (fds[f] < 0) {
			fprintf(stderr,
			        "bench_loader: %s: O_DIRECT open: %s (the baseline needs "
			        "direct I/O; use --dir on a disk file system)\n",
			        map.paths[f], strerror(errno));
			goto out;
		}
	}
	uint32_t n_ranges;
	uint64_t range_bytes;
	ranges = bench_expert_ranges(&map, fds, &n_ranges, &range_bytes);
	if (!ranges)
		goto out;
	uint64_t budget = 0;
	{
		/* Room for every expert: the slot of the largest, times the experts, + slack. */
		uint64_t largest = 0;
		for (uint32_t id = 0; id < map.n_layers * map.n_experts; id++) {
			uint32_t m;
			const struct expert_extent *e = expert_map_extents(&map, id, &m);
			uint64_t b = 0;
			for (uint32_t i = 0; i < m; i++)
				b += (e[i].offset % 4096 + e[i].length + 4095) / 4096 * 4096 + 4096;
			largest = b > largest ? b : largest;
		}
		budget = largest * map.n_layers * map.n_experts + (1u << 20);
	}
	struct residency_config cfg = {
	    .numa_node = 0,
	    .mem_budget = budget,
	    .policy = "lru",
	    .chunk_bytes = (uint32_t)chunk,
	    .queue_depth = (uint32_t)depth,
	};
	double loader_gbps[100], base_gbps[100], ratio[100], sys_per_gib[100];
	struct residency_counters counters = {0};
	if (!json)
		printf("bench_loader: %s: %u layers × %u experts, %.1f MiB of expert bytes; chunk "
		       "%lu KiB, depth %lu, %lu rounds\n",
		       model, map.n_layers, map.n_experts,
		       (double)cat->expert_bytes_total / (1 << 20), chunk >> 10, depth, rounds);
	for (unsigned long i = 0; i < rounds; i++) {
		double lsecs = 0, bsecs = 0, sys = 0;
		uint64_t lbytes = 0, bbytes = 0;
		for (int half = 0; half < 2; half++) {
			bool loader_now = (half == 0) == (i % 2 == 0);
			if (drop_page_cache(&map))
				goto out;
			if (loader_now)
				lsecs = run_loader(&map, &cfg, &sys, &lbytes, &counters);
			else
				bsecs = bench_odirect_read(ranges, n_ranges, (uint32_t)chunk,
				                           (uint32_t)depth, &bbytes);
			if ((loader_now ? lsecs : bsecs) < 0)
				goto out;
		}
		loader_gbps[i] = (double)lbytes / lsecs / 1e9;
		base_gbps[i] = (double)bbytes / bsecs / 1e9;
		ratio[i] = loader_gbps[i] / base_gbps[i];
		sys_per_gib[i] = sys / ((double)lbytes / (1u << 30));
		if (!json)
			printf(
			    "round %lu: loader %.3f GB/s, baseline %.3f GB/s, ratio %.3f, sys %.3f "
			    "s/GiB\n",
			    i + 1, loader_gbps[i], base_gbps[i], ratio[i], sys_per_gib[i]);
	}
	double ml = median(loader_gbps, (int)rounds), mb = median(base_gbps, (int)rounds);
	double mr = median(ratio, (int)rounds), ms = median(sys_per_gib, (int)rounds);
	if (json) {
		printf("{\"loader_gbps\": %.4f, \"baseline_gbps\": %.4f, \"ratio\": %.4f, "
		       "\"sys_cpu_s_per_gib\": %.4f, \"rounds\": %lu, \"bytes\": %llu, "
		       "\"chunk_bytes\": %lu, \"depth\": %lu, \"fixed_buffers\": %s, "
		       "\"reads\": %llu}\n",
		       ml, mb, mr, ms, rounds, (unsigned long long)counters.bytes_read, chunk,
		       depth, counters.buffers_registered ? "true" : "false",
		       (unsigned long long)counters.reads);
	} else {
		printf("median: loader %.3f GB/s, baseline %.3f GB/s, ratio %.3f (target ≥ 0.90), "
		       "sys %.3f s/GiB (target ≤ 0.15); loader: %llu reads, read_fixed %s\n",
		       ml, mb, mr, ms, (unsigned long long)counters.reads,
		       counters.buffers_registered ? "yes" : "no");
	}
	status = 0;
out:
	if (fds)
		for (uint32_t f = 0; f < map.n_files; f++)
			if (fds[f] >= 0)
				close(fds[f]);
	free(fds);
	free(ranges);
	expert_map_free(&map);
	if (cat)
		moe_catalog_close(cat);
	if (tmp[0])
		nftw(tmp, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
	return status;
}
