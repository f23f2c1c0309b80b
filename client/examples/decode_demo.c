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

#include "latency.h"
#include "moe_client.h"
#include "moe_proto.h"
#include "stats_field.h"
#include "trace.h"

#define TIMEOUT_MS 30000

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

/* The command line. */
struct demo_args {
	const char *socket_path, *trace_path;
	long steps, n_seq, k_defer;
	unsigned long long seed;
	int prefetch, json;
};

/* The command line into *a: -1 to go on, else the status to exit with. */
static int parse_demo_args(int argc, char **argv, struct demo_args *a)
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
	*a = (struct demo_args){.steps = 64, .n_seq = 1, .k_defer = 1, .seed = 1, .prefetch = 1};
	int c;
	while ((c = getopt_long(argc, argv, "s:n:t:d:f:r:pjh", longopts, NULL)) != -1) {
		switch (c) {
		case 's': a->socket_path = optarg; break;
		case 'n': a->steps = strtol(optarg, NULL, 10); break;
		case 't': a->n_seq = strtol(optarg, NULL, 10); break;
		case 'd': a->k_defer = strtol(optarg, NULL, 10); break;
		case 'f': a->trace_path = optarg; break;
		case 'r': a->seed = strtoull(optarg, NULL, 10); break;
		case 'p': a->prefetch = 0; break;
		case 'j': a->json = 1; break;
		case 'h': usage(stdout); return 0;
		case 'V':
			printf("moe-decode-demo %s (protocol ABI %u.%u)\n", MOE_VERSION,
			       MOE_ABI_MAJOR, MOE_ABI_MINOR);
			return 0;
		default: usage(stderr); return 2;
		}
	}
	if (a->steps < 1 || a->steps > 1000000 || a->n_seq < 1 || a->n_seq > 256 ||
	    a->k_defer < 0 || a->k_defer > 2 || optind < argc) {
		usage(stderr);
		return 2;
	}
	return -1;
}

/* Routing: the trace file, checked against the model's shape, or the generator's, one line
 * per (token, layer) for n_tokens tokens. 0, or -1 with the sentence printed. */
static int load_routing(const struct demo_args *a, const struct moe_info *inf, uint32_t n_tokens,
                        struct routing_trace *tr)
{
	struct sidecar_error err = {0};
	if (a->trace_path) {
		if (trace_load(a->trace_path, tr, &err) != 0) {
			fprintf(stderr, "moe-decode-demo: %s\n", err.msg);
			return -1;
		}
		if (tr->n_layers != inf->n_moe_layers || tr->n_experts != inf->n_experts) {
			fprintf(stderr,
			        "moe-decode-demo: %s: trace has %u layers x %u experts, the model "
			        "%u x %u\n",
			        a->trace_path, tr->n_layers, tr->n_experts, inf->n_moe_layers,
			        inf->n_experts);
			trace_free(tr);
			return -1;
		}
		return 0;
	}
	struct trace_gen_params gp;
	if (trace_gen_preset("qwen3-30b-a3b", &gp, &err) != 0) {
		fprintf(stderr, "moe-decode-demo: %s\n", err.msg);
		return -1;
	}
	gp.n_layers = inf->n_moe_layers;
	gp.n_experts = inf->n_experts;
	gp.top_k = inf->model_top_k;
	gp.steps = n_tokens;
	gp.seed = a->seed;
	if (trace_generate(&gp, tr, &err) != 0) {
		fprintf(stderr, "moe-decode-demo: %s\n", err.msg);
		return -1;
	}
	return 0;
}

/* One decode run: the routing, its index, the buffers, and what the loop measured. */
struct decode_run {
	const struct demo_args *a;
	struct moe_client *cl;
	uint32_t n_layers, top_k, hidden, first;
	struct routing_trace tr;
	uint32_t *line_of; /* line of (token, layer), or UINT32_MAX */
	uint64_t *lat;     /* [layer][step] round trips, ns */
	float *x;
	uint64_t rng, deferred, failures;
	struct moe_slot slot, hint_slot;
};

/* Line of (token, layer) in the trace, or UINT32_MAX. */
static uint32_t routing_line(const struct decode_run *r, long step, long s, uint32_t li)
{
	uint32_t tok = (uint32_t)(step * r->a->n_seq + s);
	return r->line_of[(size_t)tok * r->n_layers + li];
}

/* Random activations and the trace's routing of layer li into the FORWARD slot. */
static void fill_forward_slot(struct decode_run *r, long step, uint32_t li)
{
	const long n_seq = r->a->n_seq;
	float *xin = r->slot.input;
	for (size_t i = 0; i < (size_t)n_seq * r->hidden; i++) {
		r->rng = r->rng * 6364136223846793005ull + 1442695040888963407ull;
		r->x[i] = (float)((double)(r->rng >> 40) / 16777216.0 - 0.5);
	}
	memcpy(xin, r->x, (size_t)n_seq * r->hidden * sizeof(float));
	for (long s = 0; s < n_seq; s++) {
		uint32_t ln = routing_line(r, step, s, li);
		for (uint32_t j = 0; j < r->top_k; j++) {
			bool have = ln != UINT32_MAX && j < r->tr.lines[ln].count;
			uint32_t k = have ? r->tr.lines[ln].first + j : 0;
			r->slot.expert_ids[s * r->top_k + j] = have ? (int32_t)r->tr.ids[k] : -1;
			r->slot.expert_weights[s * r->top_k + j] =
			    have && r->tr.scores ? r->tr.scores[k] : 1.0f / (float)(j + 1);
		}
	}
}

/* The lookahead for layer li + 1, posted before layer li's FORWARD, not awaited: moe_forward
 * consumes its completion. 0, or -1 with the sentence printed. */
static int post_lookahead(struct decode_run *r, long step, uint32_t li)
{
	uint32_t nh = 0;
	for (long s = 0; s < r->a->n_seq; s++) {
		uint32_t ln = routing_line(r, step, s, li + 1);
		for (uint32_t j = 0; ln != UINT32_MAX && j < r->tr.lines[ln].count; j++) {
			uint32_t k = r->tr.lines[ln].first + j;
			r->hint_slot.expert_ids[nh] = (int32_t)r->tr.ids[k];
			r->hint_slot.expert_weights[nh++] =
			    r->tr.scores ? r->tr.scores[k] * (float)r->top_k : 1.0f;
		}
	}
	int rc;
	if (nh && (rc = moe_prefetch_post(r->cl, &r->hint_slot, (int32_t)(r->first + li + 1), nh,
	                                  0)) != MOE_OK) {
		fprintf(stderr, "moe-decode-demo: PREFETCH layer %u: %s: %s\n", r->first + li + 1,
		        moe_strerror(rc), moe_last_error(r->cl));
		return -1;
	}
	return 0;
}

/* One layer of one step: the hint, then the FORWARD, its round trip recorded. 0 or -1. */
static int decode_layer(struct decode_run *r, long step, uint32_t li)
{
	fill_forward_slot(r, step, li);
	uint64_t t0 = monotonic_ns();
	if (r->a->prefetch && li + 1 < r->n_layers && post_lookahead(r, step, li) != 0)
		return -1;
	struct moe_completion done;
	uint32_t kd = li + 1 < r->n_layers ? (uint32_t)r->a->k_defer : 0;
	int rc =
	    moe_forward(r->cl, &r->slot, (int32_t)(r->first + li), (uint32_t)r->a->n_seq,
	                (uint16_t)r->top_k, kd, MOE_DTYPE_F32, MOE_DTYPE_F32, 0, &done, TIMEOUT_MS);
	uint64_t t1 = monotonic_ns();
	if (rc != MOE_OK) {
		fprintf(stderr, "moe-decode-demo: FORWARD layer %u step %ld: %s: %s\n",
		        r->first + li, step, moe_strerror(rc), moe_last_error(r->cl));
		return -1;
	}
	r->deferred += done.value;
	r->lat[(size_t)li * r->a->steps + step] = t1 - t0;
	return 0;
}

/* Every step through every MoE layer, until the first failure; the elapsed ns. */
static uint64_t decode_all_steps(struct decode_run *r)
{
	r->rng = r->a->seed * 2654435761u + 7;
	moe_slot_acquire(r->cl, &r->slot);
	moe_slot_acquire(r->cl, &r->hint_slot);
	uint64_t t_start = monotonic_ns();
	for (long step = 0; step < r->a->steps && !r->failures; step++)
		for (uint32_t li = 0; li < r->n_layers && !r->failures; li++)
			if (decode_layer(r, step, li) != 0)
				r->failures++;
	uint64_t t_end = monotonic_ns();
	moe_slot_release(r->cl, r->slot.index);
	moe_slot_release(r->cl, r->hint_slot.index);
	return t_end - t_start;
}

/* The sidecar's STATS JSON (malloc'd, "{}" when it could not be had; NULL out of memory), on
 * a connection of its own: the decode channel's output area (one token row) is too small for
 * the JSON of a model with many layers. */
static char *fetch_stats(const char *socket_path, uint32_t hidden)
{
	char *stats = malloc(1u << 20);
	struct moe_connect_opts so = {.socket_path = socket_path,
	                              .max_tokens = (uint32_t)((256u << 10) / (hidden * 4u) + 1),
	                              .n_slots = 1,
	                              .client_name = "moe-decode-demo stats"};
	if (so.max_tokens > 256)
		so.max_tokens = 256;
	struct moe_client *sc = NULL;
	int rc = !stats ? MOE_ENOMEM : moe_connect(&so, &sc);
	if (rc == MOE_OK)
		rc = moe_stats_json(sc, stats, 1u << 20, TIMEOUT_MS);
	if (rc != MOE_OK) {
		fprintf(stderr, "moe-decode-demo: STATS: %s: %s\n", moe_strerror(rc),
		        sc ? moe_last_error(sc) : moe_connect_error());
		if (stats)
			snprintf(stats, 64, "{}");
	}
	moe_close(sc);
	return stats;
}

static double hit_rate_of(const char *stats)
{
	const double hits = stats_field(stats, "hits"), cold = stats_field(stats, "cold_misses"),
	             infl = stats_field(stats, "inflight_misses");
	return hits / (hits + cold + infl);
}

static void print_demo_json(const struct decode_run *r, double secs, const char *stats)
{
	const long steps = r->a->steps, n_seq = r->a->n_seq;
	const double tps = (double)steps * (double)n_seq / secs, hit_rate = hit_rate_of(stats);
	printf("{\"steps\":%ld,\"tokens_per_step\":%ld,\"tokens_per_s\":%.3f,\"deferred\":%"
	       "llu,"
	       "\"hit_rate\":%.6f,\"layers\":[",
	       steps, n_seq, tps, (unsigned long long)r->deferred,
	       isfinite(hit_rate) ? hit_rate : 0);
	for (uint32_t li = 0; li < r->n_layers; li++) {
		uint64_t *v = &r->lat[(size_t)li * steps];
		printf("%s{\"layer\":%u,\"p50_us\":%.1f,\"p99_us\":%.1f}", li ? "," : "",
		       r->first + li, (double)percentile_u64(v, (size_t)steps, 0.5) / 1e3,
		       (double)percentile_u64(v, (size_t)steps, 0.99) / 1e3);
	}
	printf("],\"stats\":%s}\n", stats ? stats : "{}");
}

static void print_demo_table(const struct decode_run *r, const struct moe_info *inf, double secs,
                             const char *stats)
{
	const long steps = r->a->steps, n_seq = r->a->n_seq;
	const double tps = (double)steps * (double)n_seq / secs;
	const double hits = stats_field(stats, "hits"), cold = stats_field(stats, "cold_misses"),
	             infl = stats_field(stats, "inflight_misses");
	printf("moe-decode-demo: %s, %u MoE layers x %u experts (top-%u), hidden %u\n",
	       inf->model_name, r->n_layers, inf->n_experts, r->top_k, r->hidden);
	printf("%ld steps x %ld tokens in %.2f s: %.1f tokens/s, %llu experts deferred, "
	       "hints %s\n",
	       steps, n_seq, secs, tps, (unsigned long long)r->deferred,
	       r->a->prefetch ? "on" : "off");
	printf("\n%6s %10s %10s   (FORWARD round trip incl. the hint, as the client sees "
	       "it)\n",
	       "layer", "p50 us", "p99 us");
	for (uint32_t li = 0; li < r->n_layers; li++) {
		uint64_t *v = &r->lat[(size_t)li * steps];
		printf("%6u %10.1f %10.1f\n", r->first + li,
		       (double)percentile_u64(v, (size_t)steps, 0.5) / 1e3,
		       (double)percentile_u64(v, (size_t)steps, 0.99) / 1e3);
	}
	printf("\nsidecar: hits %.0f, cold misses %.0f, in-flight misses %.0f: hit rate "
	       "%.1f%%; read %.1f MiB on demand, %.1f MiB in all (prefetches %.0f, used "
	       "%.0f); resident %.1f of %.1f MiB\n",
	       hits, cold, infl, 100.0 * hit_rate_of(stats),
	       stats_field(stats, "bytes_read") / 1048576.0,
	       stats_field(stats, "loader_bytes_read") / 1048576.0,
	       stats_field(stats, "prefetches"), stats_field(stats, "prefetch_hits"),
	       stats_field(stats, "resident_bytes") / 1048576.0,
	       stats_field(stats, "budget_bytes") / 1048576.0);
	const char *un = stats ? strstr(stats, "probes unavailable: ") : NULL;
	if (un) {
		const char *end = strchr(un, '"');
		printf("page cache: %.*s\n", end ? (int)(end - un) : 80, un);
	} else {
		printf("page cache: filled %.1f MiB, direct %.1f MiB, buffered %.1f MiB, "
		       "bypass ratio %.4f\n",
		       stats_field(stats, "pagecache_fill_bytes") / 1048576.0,
		       stats_field(stats, "direct_bytes") / 1048576.0,
		       stats_field(stats, "buffered_bytes") / 1048576.0,
		       stats_field(stats, "bypass_ratio"));
	}
}

/* The routing, its index and the buffers, the loop, then STATS and the report: the exit
 * status. */
static int run_demo(struct decode_run *r, const struct moe_info *inf)
{
	const struct demo_args *a = r->a;
	const uint32_t n_tokens_total = (uint32_t)(a->steps * a->n_seq);
	if (load_routing(a, inf, n_tokens_total, &r->tr) != 0)
		return 1;
	r->line_of = malloc((size_t)n_tokens_total * r->n_layers * sizeof(uint32_t));
	r->lat = malloc((size_t)a->steps * r->n_layers * sizeof(uint64_t));
	r->x = malloc((size_t)a->n_seq * r->hidden * sizeof(float));
	if (!r->line_of || !r->lat || !r->x) {
		fprintf(stderr, "moe-decode-demo: out of memory\n");
		return 1;
	}
	memset(r->line_of, 0xff, (size_t)n_tokens_total * r->n_layers * sizeof(uint32_t));
	for (uint32_t i = 0; i < r->tr.n_lines; i++)
		if (r->tr.lines[i].step < n_tokens_total && r->tr.lines[i].layer < r->n_layers)
			r->line_of[(size_t)r->tr.lines[i].step * r->n_layers +
			           r->tr.lines[i].layer] = i;
	const double secs = (double)decode_all_steps(r) / 1e9;
	char *stats = fetch_stats(a->socket_path, r->hidden);
	if (a->json)
		print_demo_json(r, secs, stats);
	else
		print_demo_table(r, inf, secs, stats);
	free(stats);
	return r->failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct demo_args a;
	int status = parse_demo_args(argc, argv, &a);
	if (status >= 0)
		return status;
	struct moe_connect_opts o = {.socket_path = a.socket_path,
	                             .max_tokens = (uint32_t)a.n_seq,
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
	struct decode_run r = {.a = &a,
	                       .cl = cl,
	                       .n_layers = inf->n_moe_layers,
	                       .top_k = inf->model_top_k,
	                       .hidden = inf->hidden,
	                       .first = inf->first_moe_layer};
	status = run_demo(&r, inf);
	free(r.line_of);
	free(r.lat);
	free(r.x);
	trace_free(&r.tr);
	moe_close(cl);
	return status;
}
