/* decode_demo.c — `moe-decode-demo --socket PATH [--steps N] [--trace FILE] …`: a synthetic
 * decode loop through the real channel, as an engine would drive it.
 *
 * Per decode step and MoE layer L: post a PREFETCH hint for layer L+1 (the routing the trace
 * says L+1 will use — the best a lookahead predictor can do), then FORWARD layer L with the
 * trace's experts and router scores as weights, deferring the k_defer lowest-weighted experts
 * into layer L+1 (none on the last layer). Routing comes from the residency area's synthetic
 * generator (Zipf popularity, token-to-token reuse, cross-layer correlation, phase drift) or a
 * trace file in its text format (docs/residency.md). Activations are random: this measures
 * the sidecar, not a model. Outputs are not checked here (tests/serving does that against the
 * in-process oracle). Prints tokens/s, per-layer latency p50/p99 as the client saw it, and the
 * sidecar's STATS (hit rate, bytes read, page-cache bypass); --json prints one object.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "latency.h"
#include "moe_client.h"
#include "moe_proto.h"
#include "trace.h"

#define TIMEOUT_MS 30000

/* A top-level number of the sidecar's STATS object ("key":N before "layers"), or NAN. */
static double stat_of(const char *json, const char *key)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	const char *layers = strstr(json, "\"layers\":");
	const char *p = strstr(json, pat);
	if (!p || (layers && p > layers))
		return NAN;
	p += strlen(pat);
	if (!strncmp(p, "null", 4))
		return NAN;
	return strtod(p, NULL);
}

static void usage(FILE *to)
{
	fprintf(to,
	        "usage: moe-decode-demo --socket PATH [options]\n"
	        "  --steps N      decode steps (default 64)\n"
	        "  --tokens T     sequences decoded together (tokens per FORWARD, default 1)\n"
	        "  --k-defer D    experts per token deferred to the next layer (default 1; 0..2)\n"
	        "  --trace FILE   routing trace (moe-trace text format) instead of the generator\n"
	        "  --seed S       generator seed (default 1)\n"
	        "  --no-prefetch  do not post lookahead hints\n"
	        "  --json         one JSON object instead of the table\n"
	        "  --version      this program's and its protocol's versions\n");
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"socket", required_argument, NULL, 's'},
	    {"steps", required_argument, NULL, 'n'},
	    {"tokens", required_argument, NULL, 't'},
	    {"k-defer", required_argument, NULL, 'd'},
	    {"trace", required_argument, NULL, 'f'},
	    {"seed", required_argument, NULL, 'r'},
	    {"no-prefetch", no_argument, NULL, 'p'},
	    {"json", no_argument, NULL, 'j'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	const char *socket_path = NULL, *trace_path = NULL;
	long steps = 64, n_seq = 1, k_defer = 1;
	unsigned long long seed = 1;
	int prefetch = 1, json = 0, c;
	while ((c = getopt_long(argc, argv, "s:n:t:d:f:r:pjh", longopts, NULL)) != -1) {
		switch (c) {
		case 's': socket_path = optarg; break;
		case 'n': steps = strtol(optarg, NULL, 10); break;
		case 't': n_seq = strtol(optarg, NULL, 10); break;
		case 'd': k_defer = strtol(optarg, NULL, 10); break;
		case 'f': trace_path = optarg; break;
		case 'r': seed = strtoull(optarg, NULL, 10); break;
		case 'p': prefetch = 0; break;
		case 'j': json = 1; break;
		case 'h': usage(stdout); return 0;
		case 'V':
			printf("moe-decode-demo %s (protocol ABI %u.%u)\n", MOE_VERSION,
			       MOE_ABI_MAJOR, MOE_ABI_MINOR);
			return 0;
		default: usage(stderr); return 2;
		}
	}
	if (steps < 1 || steps > 1000000 || n_seq < 1 || n_seq > 256 || k_defer < 0 ||
	    k_defer > 2 || optind < argc) {
		usage(stderr);
		return 2;
	}

	struct moe_connect_opts o = {.socket_path = socket_path,
	                             .max_tokens = (uint32_t)n_seq,
	                             .n_slots = 4,
	                             .client_name = "moe-decode-demo"};
	struct moe_client *cl;
	int rc = moe_connect(&o, &cl);
	if (rc != MOE_OK) {
		fprintf(stderr, "moe-decode-demo: %s: %s\n", moe_strerror(rc), moe_connect_error());
		return 1;
	}
	const struct moe_info *inf = moe_info(cl);
	if (!inf->n_moe_layers) {
		fprintf(stderr, "moe-decode-demo: the sidecar serves no model (start it with "
		                "`moe-sidecar serve MODEL`)\n");
		moe_close(cl);
		return 1;
	}
	const uint32_t n_layers = inf->n_moe_layers, top_k = inf->model_top_k, hidden = inf->hidden,
	               first = inf->first_moe_layer;

	/* Routing: one trace line per (token, layer); token = step * n_seq + sequence. */
	struct routing_trace tr;
	struct sidecar_error err = {0};
	const uint32_t n_tokens_total = (uint32_t)(steps * n_seq);
	if (trace_path) {
		if (trace_load(trace_path, &tr, &err) != 0) {
			fprintf(stderr, "moe-decode-demo: %s\n", err.msg);
			moe_close(cl);
			return 1;
		}
		if (tr.n_layers != n_layers || tr.n_experts != inf->n_experts) {
			fprintf(stderr,
			        "moe-decode-demo: %s: trace has %u layers x %u experts, the model "
			        "%u x %u\n",
			        trace_path, tr.n_layers, tr.n_experts, n_layers, inf->n_experts);
			trace_free(&tr);
			moe_close(cl);
			return 1;
		}
	} else {
		struct trace_gen_params gp;
		if (trace_gen_preset("qwen3-30b-a3b", &gp, &err) != 0) {
			fprintf(stderr, "moe-decode-demo: %s\n", err.msg);
			moe_close(cl);
			return 1;
		}
		gp.n_layers = n_layers;
		gp.n_experts = inf->n_experts;
		gp.top_k = top_k;
		gp.steps = n_tokens_total;
		gp.seed = seed;
		if (trace_generate(&gp, &tr, &err) != 0) {
			fprintf(stderr, "moe-decode-demo: %s\n", err.msg);
			moe_close(cl);
			return 1;
		}
	}
	/* Index: line of (token, layer), or UINT32_MAX. */
	uint32_t *line_of = malloc((size_t)n_tokens_total * n_layers * sizeof(uint32_t));
	uint64_t *lat = malloc((size_t)steps * n_layers * sizeof(uint64_t));
	float *x = malloc((size_t)n_seq * hidden * sizeof(float));
	if (!line_of || !lat || !x) {
		fprintf(stderr, "moe-decode-demo: out of memory\n");
		return 1;
	}
	memset(line_of, 0xff, (size_t)n_tokens_total * n_layers * sizeof(uint32_t));
	for (uint32_t i = 0; i < tr.n_lines; i++)
		if (tr.lines[i].step < n_tokens_total && tr.lines[i].layer < n_layers)
			line_of[(size_t)tr.lines[i].step * n_layers + tr.lines[i].layer] = i;

	uint64_t rng = seed * 2654435761u + 7;
	struct moe_slot slot, hint_slot;
	moe_slot_acquire(cl, &slot);
	moe_slot_acquire(cl, &hint_slot);
	uint64_t t_start = now_ns(), deferred = 0, failures = 0;
	for (long step = 0; step < steps && !failures; step++) {
		for (uint32_t li = 0; li < n_layers && !failures; li++) {
			/* Routing of this layer for each sequence of the batch. */
			float *xin = slot.input;
			for (size_t i = 0; i < (size_t)n_seq * hidden; i++) {
				rng = rng * 6364136223846793005ull + 1442695040888963407ull;
				x[i] = (float)((double)(rng >> 40) / 16777216.0 - 0.5);
			}
			memcpy(xin, x, (size_t)n_seq * hidden * sizeof(float));
			for (long s = 0; s < n_seq; s++) {
				uint32_t tok = (uint32_t)(step * n_seq + s);
				uint32_t ln = line_of[(size_t)tok * n_layers + li];
				for (uint32_t j = 0; j < top_k; j++) {
					bool have = ln != UINT32_MAX && j < tr.lines[ln].count;
					uint32_t r = have ? tr.lines[ln].first + j : 0;
					slot.expert_ids[s * top_k + j] =
					    have ? (int32_t)tr.ids[r] : -1;
					slot.expert_weights[s * top_k + j] =
					    have && tr.scores ? tr.scores[r]
					                      : 1.0f / (float)(j + 1);
				}
			}
			uint64_t t0 = now_ns();
			/* Lookahead for the next layer, posted before this layer's FORWARD. */
			if (prefetch && li + 1 < n_layers) {
				uint32_t nh = 0;
				for (long s = 0; s < n_seq; s++) {
					uint32_t tok = (uint32_t)(step * n_seq + s);
					uint32_t ln = line_of[(size_t)tok * n_layers + li + 1];
					for (uint32_t j = 0;
					     ln != UINT32_MAX && j < tr.lines[ln].count; j++) {
						uint32_t r = tr.lines[ln].first + j;
						hint_slot.expert_ids[nh] = (int32_t)tr.ids[r];
						hint_slot.expert_weights[nh++] =
						    tr.scores ? tr.scores[r] * (float)top_k : 1.0f;
					}
				}
				/* Posted, not awaited: moe_forward consumes its completion. */
				if (nh && (rc = moe_prefetch_post(cl, &hint_slot,
				                                  (int32_t)(first + li + 1), nh,
				                                  0)) != MOE_OK) {
					fprintf(
					    stderr, "moe-decode-demo: PREFETCH layer %u: %s: %s\n",
					    first + li + 1, moe_strerror(rc), moe_last_error(cl));
					failures++;
					break;
				}
			}
			struct moe_completion done;
			uint32_t kd = li + 1 < n_layers ? (uint32_t)k_defer : 0;
			rc = moe_forward(cl, &slot, (int32_t)(first + li), (uint32_t)n_seq,
			                 (uint16_t)top_k, kd, MOE_DTYPE_F32, MOE_DTYPE_F32, 0,
			                 &done, TIMEOUT_MS);
			uint64_t t1 = now_ns();
			if (rc != MOE_OK) {
				fprintf(stderr,
				        "moe-decode-demo: FORWARD layer %u step %ld: %s: %s\n",
				        first + li, step, moe_strerror(rc), moe_last_error(cl));
				failures++;
				break;
			}
			deferred += done.value;
			lat[(size_t)li * steps + step] = t1 - t0;
		}
	}
	uint64_t t_end = now_ns();
	moe_slot_release(cl, slot.index);
	moe_slot_release(cl, hint_slot.index);

	/* STATS on a connection of its own: the decode channel's output area (one token row)
	 * is too small for the JSON of a model with many layers. */
	char *stats = malloc(1u << 20);
	struct moe_connect_opts so = {.socket_path = socket_path,
	                              .max_tokens = (uint32_t)((256u << 10) / (hidden * 4u) + 1),
	                              .n_slots = 1,
	                              .client_name = "moe-decode-demo stats"};
	if (so.max_tokens > 256)
		so.max_tokens = 256;
	struct moe_client *sc = NULL;
	rc = !stats ? MOE_ENOMEM : moe_connect(&so, &sc);
	if (rc == MOE_OK)
		rc = moe_stats_json(sc, stats, 1u << 20, TIMEOUT_MS);
	if (rc != MOE_OK) {
		fprintf(stderr, "moe-decode-demo: STATS: %s: %s\n", moe_strerror(rc),
		        sc ? moe_last_error(sc) : moe_connect_error());
		if (stats)
			snprintf(stats, 64, "{}");
	}
	moe_close(sc);
	const double secs = (double)(t_end - t_start) / 1e9;
	const double tps = (double)steps * (double)n_seq / secs;
	const double hits = stat_of(stats, "hits"), cold = stat_of(stats, "cold_misses"),
	             infl = stat_of(stats, "inflight_misses");
	const double hit_rate = hits / (hits + cold + infl);
	if (json) {
		printf("{\"steps\":%ld,\"tokens_per_step\":%ld,\"tokens_per_s\":%.3f,\"deferred\":%"
		       "llu,"
		       "\"hit_rate\":%.6f,\"layers\":[",
		       steps, n_seq, tps, (unsigned long long)deferred,
		       isfinite(hit_rate) ? hit_rate : 0);
		for (uint32_t li = 0; li < n_layers; li++) {
			uint64_t *v = &lat[(size_t)li * steps];
			printf("%s{\"layer\":%u,\"p50_us\":%.1f,\"p99_us\":%.1f}", li ? "," : "",
			       first + li, (double)percentile_u64(v, (size_t)steps, 0.5) / 1e3,
			       (double)percentile_u64(v, (size_t)steps, 0.99) / 1e3);
		}
		printf("],\"stats\":%s}\n", stats ? stats : "{}");
	} else {
		printf("moe-decode-demo: %s, %u MoE layers x %u experts (top-%u), hidden %u\n",
		       inf->model_name, n_layers, inf->n_experts, top_k, hidden);
		printf("%ld steps x %ld tokens in %.2f s: %.1f tokens/s, %llu experts deferred, "
		       "hints %s\n",
		       steps, n_seq, secs, tps, (unsigned long long)deferred,
		       prefetch ? "on" : "off");
		printf("\n%6s %10s %10s   (FORWARD round trip incl. the hint, as the client sees "
		       "it)\n",
		       "layer", "p50 us", "p99 us");
		for (uint32_t li = 0; li < n_layers; li++) {
			uint64_t *v = &lat[(size_t)li * steps];
			printf("%6u %10.1f %10.1f\n", first + li,
			       (double)percentile_u64(v, (size_t)steps, 0.5) / 1e3,
			       (double)percentile_u64(v, (size_t)steps, 0.99) / 1e3);
		}
		printf("\nsidecar: hits %.0f, cold misses %.0f, in-flight misses %.0f: hit rate "
		       "%.1f%%; read %.1f MiB on demand, %.1f MiB in all (prefetches %.0f, used "
		       "%.0f); resident %.1f of %.1f MiB\n",
		       hits, cold, infl, 100.0 * hit_rate, stat_of(stats, "bytes_read") / 1048576.0,
		       stat_of(stats, "loader_bytes_read") / 1048576.0,
		       stat_of(stats, "prefetches"), stat_of(stats, "prefetch_hits"),
		       stat_of(stats, "resident_bytes") / 1048576.0,
		       stat_of(stats, "budget_bytes") / 1048576.0);
		const char *un = stats ? strstr(stats, "probes unavailable: ") : NULL;
		if (un) {
			const char *end = strchr(un, '"');
			printf("page cache: %.*s\n", end ? (int)(end - un) : 80, un);
		} else {
			printf("page cache: filled %.1f MiB, direct %.1f MiB, buffered %.1f MiB, "
			       "bypass ratio %.4f\n",
			       stat_of(stats, "pagecache_fill_bytes") / 1048576.0,
			       stat_of(stats, "direct_bytes") / 1048576.0,
			       stat_of(stats, "buffered_bytes") / 1048576.0,
			       stat_of(stats, "bypass_ratio"));
		}
	}
	free(stats);
	free(line_of);
	free(lat);
	free(x);
	trace_free(&tr);
	moe_close(cl);
	return failures ? 1 : 0;
}
