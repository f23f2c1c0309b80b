/* placement.c — `moe-sidecar placement (--trace FILE | --socket S) --gpu-experts N
 * [--strategy S] [--by counts|heat] [--json]`: which experts an engine should keep on its GPU.
 *
 * The load per (MoE layer, expert) comes from a routing trace (each line adds 1 to each
 * expert it names) or from a running sidecar (moe_expert_stats: tokens routed, or heat).
 * Every strategy of libmoe_client's moe_placement runs on the same load; the output is each
 * one's covered share (the routed token-expert pairs the GPU would serve) and its worst layer
 * (the largest share of a layer's pairs left to the CPU: a step waits for its slowest layer),
 * then the chosen strategy's mask in the two shapes engines take: moe_set_gpu_mask's (layer
 * -1: one row of ceil(n_experts / 8) bytes per transformer block, hex) and kt-kernel's
 * gpu_experts_mask ([layers, experts] bool, printed as each layer's expert ids; JSON: the
 * full matrix). A trace knows MoE layers only: its rows are MoE layers (say so); a sidecar
 * gives the blocks.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "json_writer.h"
#include "moe_client.h"
#include "option_values.h"
#include "trace.h"

#define PLACEMENT_TIMEOUT_MS 10000

static void placement_usage(FILE *to)
{
	fprintf(
	    to,
	    "usage: moe-sidecar placement (--trace FILE | --socket PATH)\n"
	    "                             (--gpu-experts N | --gpu-bytes B [--expert-bytes B])\n"
	    "                             [--strategy S] [--by counts|heat] [--json]\n\n"
	    "  --trace FILE      load = how often each (layer, expert) appears in a routing "
	    "trace\n"
	    "  --socket PATH     load = a running sidecar's per-expert counts (or heat)\n"
	    "  --gpu-experts N   experts the GPU holds, over all layers\n"
	    "  --gpu-bytes B     or a GPU budget in bytes (K/M/G/T suffix); --socket: divided by\n"
	    "                    the model's bytes per expert, --trace: needs --expert-bytes\n"
	    "  --expert-bytes B  bytes of one expert (with --trace and --gpu-bytes)\n"
	    "  --strategy S      the mask to print: frequency (default), uniform,\n"
	    "                    front-loading, balanced\n"
	    "  --by counts|heat  --socket: tokens routed since start (default) or decayed heat\n"
	    "  --json            one JSON object: coverage of every strategy, the mask\n");
}

/* The load, its shape and the block of each MoE layer. */
struct placement_input {
	uint32_t n_moe_layers, n_experts, n_blocks;
	double *load;
	int32_t *blocks;
	uint64_t expert_bytes; /* bytes per expert, 0 unknown */
	char source[300];
};

static int load_trace(const char *path, struct placement_input *in)
{
	struct routing_trace t;
	struct sidecar_error err = {0};
	if (trace_load(path, &t, &err) != 0) {
		fprintf(stderr, "moe-sidecar placement: %s\n", err.msg);
		return -1;
	}
	in->n_moe_layers = in->n_blocks = t.n_layers;
	in->n_experts = t.n_experts;
	in->load = calloc((size_t)t.n_layers * t.n_experts, sizeof(double));
	in->blocks = malloc(t.n_layers * sizeof(int32_t));
	if (!in->load || !in->blocks) {
		trace_free(&t);
		fprintf(stderr, "moe-sidecar placement: out of memory\n");
		return -1;
	}
	for (uint32_t l = 0; l < t.n_layers; l++)
		in->blocks[l] = (int32_t)l;
	for (uint32_t i = 0; i < t.n_lines; i++) {
		const struct trace_line *line = &t.lines[i];
		for (uint32_t j = line->first; j < line->first + line->count; j++)
			in->load[(size_t)line->layer * t.n_experts + t.ids[j]] += 1;
	}
	snprintf(in->source, sizeof(in->source),
	         "trace %s: %u lines, %u MoE layers x %u experts (mask rows = MoE layers)", path,
	         t.n_lines, t.n_layers, t.n_experts);
	trace_free(&t);
	return 0;
}

static int load_socket(const char *path, bool heat, struct placement_input *in)
{
	struct moe_connect_opts o = {
	    .socket_path = path, .n_slots = 1, .client_name = "moe-sidecar placement"};
	struct moe_client *c;
	int rc = moe_connect(&o, &c);
	if (rc != MOE_OK) {
		fprintf(stderr, "moe-sidecar placement: %s: %s\n", moe_strerror(rc),
		        moe_connect_error());
		return -1;
	}
	const struct moe_info *i = moe_info(c);
	in->n_moe_layers = i->n_moe_layers;
	in->n_experts = i->n_experts;
	in->n_blocks = i->n_layers;
	const size_t cells = (size_t)i->n_moe_layers * i->n_experts;
	uint64_t *counts = calloc(cells ? cells : 1, sizeof(*counts));
	float *h = calloc(cells ? cells : 1, sizeof(*h));
	in->load = calloc(cells ? cells : 1, sizeof(double));
	in->blocks = calloc(i->n_moe_layers ? i->n_moe_layers : 1, sizeof(int32_t));
	uint32_t half_life = 0;
	if (!counts || !h || !in->load || !in->blocks) {
		rc = MOE_ENOMEM;
		goto out;
	}
	rc = moe_model_layers(c, in->blocks, i->n_moe_layers);
	if (rc >= 0)
		rc = moe_expert_stats(c, counts, h, cells, &half_life, PLACEMENT_TIMEOUT_MS);
	if (rc != MOE_OK)
		goto out;
	for (size_t x = 0; x < cells; x++)
		in->load[x] = heat ? (double)h[x] : (double)counts[x];
	/* Bytes per expert: the model's expert bytes (STATS) over its experts. */
	char *json = malloc(64u << 10);
	uint64_t total = 0;
	if (json && moe_stats_json(c, json, 64u << 10, PLACEMENT_TIMEOUT_MS) == MOE_OK) {
		const char *k = strstr(json, "\"expert_bytes\":");
		if (k)
			total = strtoull(k + 15, NULL, 10);
	}
	free(json);
	in->expert_bytes = cells ? total / cells : 0;
	snprintf(in->source, sizeof(in->source),
	         "sidecar %s: model %s, %u MoE layers x %u experts, load = %s", path, i->model_name,
	         i->n_moe_layers, i->n_experts, heat ? "heat" : "tokens routed since start");
	if (heat)
		snprintf(in->source + strlen(in->source), sizeof(in->source) - strlen(in->source),
		         " (half-life %u tokens)", half_life);
out:
	if (rc != MOE_OK)
		fprintf(stderr, "moe-sidecar placement: %s: %s\n", moe_strerror(rc),
		        moe_last_error(c));
	moe_close(c);
	free(counts);
	free(h);
	return rc == MOE_OK ? 0 : -1;
}

/* The largest share of one layer's load the mask leaves to the CPU. */
static double worst_layer(const struct placement_input *in, const uint8_t *mask)
{
	const size_t row = (in->n_experts + 7u) / 8u;
	double worst = 0;
	for (uint32_t l = 0; l < in->n_moe_layers; l++) {
		double all = 0, cpu = 0;
		for (uint32_t e = 0; e < in->n_experts; e++) {
			const double v = in->load[(size_t)l * in->n_experts + e];
			all += v;
			if (!((mask[(size_t)in->blocks[l] * row + e / 8] >> (e % 8)) & 1u))
				cpu += v;
		}
		if (all > 0 && cpu / all > worst)
			worst = cpu / all;
	}
	return worst;
}

/* What the command line asks for. */
struct placement_args {
	const char *trace, *sock;
	uint64_t gpu_experts, gpu_bytes, expert_bytes;
	int strategy;
	bool json, heat, have_n;
};

/* One option into *a: -1 to go on, else the status to exit with (0 after --help). */
static int apply_placement_option(int c, const char *arg, struct placement_args *a)
{
	switch (c) {
	case 't': a->trace = arg; return -1;
	case 's': a->sock = arg; return -1;
	case 'n':
		if (option_u64(arg, 0, UINT32_MAX, &a->gpu_experts) != 0) {
			fprintf(stderr,
			        "moe-sidecar placement: --gpu-experts '%s': expected a number of "
			        "experts\n",
			        arg);
			return 2;
		}
		a->have_n = true;
		return -1;
	case 'b':
	case 'e':
		if (option_bytes(arg, c == 'b' ? &a->gpu_bytes : &a->expert_bytes) != 0) {
			fprintf(stderr,
			        "moe-sidecar placement: --%s '%s': expected BYTES (K/M/G/T suffix "
			        "allowed)\n",
			        c == 'b' ? "gpu-bytes" : "expert-bytes", arg);
			return 2;
		}
		return -1;
	case 'S':
		a->strategy = moe_placement_parse(arg);
		if (a->strategy < 0) {
			fprintf(stderr,
			        "moe-sidecar placement: --strategy '%s': expected frequency, "
			        "uniform, front-loading or balanced\n",
			        arg);
			return 2;
		}
		return -1;
	case 'y':
		if (strcmp(arg, "counts") && strcmp(arg, "heat")) {
			fprintf(stderr,
			        "moe-sidecar placement: --by '%s': expected counts or heat\n", arg);
			return 2;
		}
		a->heat = !strcmp(arg, "heat");
		return -1;
	case 'j': a->json = true; return -1;
	case 'h': placement_usage(stdout); return 0;
	default: placement_usage(stderr); return 2;
	}
}

/* The command line into *a: -1 to go on, else the status to exit with. */
static int parse_placement_args(int argc, char **argv, struct placement_args *a)
{
	static const struct option longopts[] = {
	    {"trace", required_argument, NULL, 't'},
	    {"socket", required_argument, NULL, 's'},
	    {"gpu-experts", required_argument, NULL, 'n'},
	    {"gpu-bytes", required_argument, NULL, 'b'},
	    {"expert-bytes", required_argument, NULL, 'e'},
	    {"strategy", required_argument, NULL, 'S'},
	    {"by", required_argument, NULL, 'y'},
	    {"json", no_argument, NULL, 'j'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	*a = (struct placement_args){.strategy = MOE_PLACE_FREQUENCY};
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		int status = apply_placement_option(c, optarg, a);
		if (status >= 0)
			return status;
	}
	if (optind < argc) {
		fprintf(stderr, "moe-sidecar placement: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!a->trace == !a->sock) {
		fprintf(stderr,
		        "moe-sidecar placement: give one of --trace FILE or --socket PATH\n");
		return 2;
	}
	if (a->have_n == (a->gpu_bytes != 0)) {
		fprintf(stderr, "moe-sidecar placement: give one of --gpu-experts N or --gpu-bytes "
		                "B\n");
		return 2;
	}
	if (a->heat && a->trace) {
		fprintf(stderr, "moe-sidecar placement: --by heat needs --socket (a trace has "
		                "counts)\n");
		return 2;
	}
	return -1;
}

/* Every strategy's mask on one load: MOE_PLACE_COUNT masks of n_blocks rows of row bytes. */
struct placements {
	uint8_t *masks;
	size_t row, mask_bytes;
	double covered[MOE_PLACE_COUNT], worst[MOE_PLACE_COUNT];
};

static const uint8_t *placement_mask(const struct placements *p, int strategy)
{
	return p->masks + (size_t)strategy * p->mask_bytes;
}

/* Runs every strategy for gpu_experts experts; 0, or 1 with the sentence printed. */
static int place_every_strategy(const struct placement_input *in, uint64_t gpu_experts,
                                struct placements *p)
{
	p->row = (in->n_experts + 7u) / 8u;
	p->mask_bytes = p->row * in->n_blocks;
	p->masks = calloc(MOE_PLACE_COUNT, p->mask_bytes ? p->mask_bytes : 1);
	if (!p->masks)
		return 1;
	for (int s = 0; s < MOE_PLACE_COUNT; s++) {
		uint8_t *mask = p->masks + (size_t)s * p->mask_bytes;
		int rc = moe_placement(in->load, in->n_moe_layers, in->n_experts, in->blocks,
		                       in->n_blocks, (uint32_t)gpu_experts, s, mask, p->mask_bytes,
		                       &p->covered[s]);
		if (rc != MOE_OK) {
			fprintf(stderr, "moe-sidecar placement: %s: %s\n", moe_placement_name(s),
			        moe_strerror(rc));
			return 1;
		}
		p->worst[s] = worst_layer(in, mask);
	}
	return 0;
}

/* The JSON object (see the file's comment); 0, or 1 with the sentence printed. */
static int print_placement_json(const struct placement_input *in, uint64_t gpu_experts,
                                int strategy, const struct placements *p)
{
	const uint8_t *mask = placement_mask(p, strategy);
	const uint64_t cells = (uint64_t)in->n_moe_layers * in->n_experts;
	char *hex = malloc(2 * p->mask_bytes + 1);
	if (!hex) {
		fprintf(stderr, "moe-sidecar placement: out of memory\n");
		return 1;
	}
	for (size_t b = 0; b < p->mask_bytes; b++)
		snprintf(hex + 2 * b, 3, "%02x", mask[b]);
	hex[2 * p->mask_bytes] = '\0';
	struct json_writer w;
	jw_init_file(&w, stdout);
	jw_object_begin(&w);
	jw_kv_string(&w, "source", in->source);
	jw_kv_u64(&w, "n_moe_layers", in->n_moe_layers);
	jw_kv_u64(&w, "n_experts", in->n_experts);
	jw_kv_u64(&w, "n_blocks", in->n_blocks);
	jw_kv_u64(&w, "gpu_experts", gpu_experts < cells ? gpu_experts : cells);
	jw_kv_string(&w, "strategy", moe_placement_name(strategy));
	jw_key(&w, "coverage");
	jw_object_begin(&w);
	for (int s = 0; s < MOE_PLACE_COUNT; s++)
		jw_kv_double(&w, moe_placement_name(s), p->covered[s], 6);
	jw_object_end(&w);
	jw_key(&w, "worst_layer_cpu_share");
	jw_object_begin(&w);
	for (int s = 0; s < MOE_PLACE_COUNT; s++)
		jw_kv_double(&w, moe_placement_name(s), p->worst[s], 6);
	jw_object_end(&w);
	jw_key(&w, "moe_layers");
	jw_array_begin(&w);
	for (uint32_t l = 0; l < in->n_moe_layers; l++)
		jw_i64(&w, in->blocks[l]);
	jw_array_end(&w);
	jw_kv_string(&w, "mask_hex", hex);
	jw_key(&w, "gpu_experts_mask");
	jw_array_begin(&w);
	for (uint32_t b = 0; b < in->n_blocks; b++) {
		jw_array_begin(&w);
		for (uint32_t e = 0; e < in->n_experts; e++)
			jw_bool(&w, (mask[(size_t)b * p->row + e / 8] >> (e % 8)) & 1u);
		jw_array_end(&w);
	}
	jw_array_end(&w);
	jw_object_end(&w);
	free(hex);
	const int wrc = jw_finish_line(&w);
	if (wrc != 0) {
		fprintf(stderr, "moe-sidecar placement: writing the JSON: %s\n", strerror(-wrc));
		return 1;
	}
	return 0;
}

/* The table of strategies, then the chosen mask in both shapes. */
static void print_placement_text(const struct placement_input *in, uint64_t gpu_experts,
                                 int strategy, const struct placements *p)
{
	const uint8_t *mask = placement_mask(p, strategy);
	const uint64_t cells = (uint64_t)in->n_moe_layers * in->n_experts;
	const size_t row = p->row;
	printf("%s\n", in->source);
	printf("GPU budget: %" PRIu64 " of %" PRIu64 " experts (%.1f%%)\n\n",
	       gpu_experts < cells ? gpu_experts : cells, cells,
	       cells ? 100.0 * (double)(gpu_experts < cells ? gpu_experts : cells) / (double)cells
	             : 0.0);
	printf("%-14s %18s %22s\n", "strategy", "covered on GPU", "worst layer on CPU");
	for (int s = 0; s < MOE_PLACE_COUNT; s++)
		printf("%-14s %17.1f%% %21.1f%%%s\n", moe_placement_name(s), 100.0 * p->covered[s],
		       100.0 * p->worst[s], s == strategy ? "  <- mask" : "");
	printf("\nmask for moe_set_gpu_mask(c, -1, bits, %zu): %u rows of %zu bytes, hex, "
	       "block: bytes\n",
	       p->mask_bytes, in->n_blocks, row);
	for (uint32_t b = 0; b < in->n_blocks; b++) {
		printf("%5u: ", b);
		for (size_t x = 0; x < row; x++)
			printf("%02x", mask[(size_t)b * row + x]);
		printf("\n");
	}
	printf("\nkt-kernel gpu_experts_mask ([%u, %u] bool): true at these experts, per "
	       "layer\n",
	       in->n_blocks, in->n_experts);
	for (uint32_t b = 0; b < in->n_blocks; b++) {
		printf("%5u:", b);
		for (uint32_t e = 0; e < in->n_experts; e++)
			if ((mask[(size_t)b * row + e / 8] >> (e % 8)) & 1u)
				printf(" %u", e);
		printf("\n");
	}
}

/* The load, the budget in experts, every strategy's mask, the output: the exit status. */
static int place_and_print(const struct placement_args *a, struct placement_input *in)
{
	uint64_t gpu_experts = a->gpu_experts;
	if ((a->trace ? load_trace(a->trace, in) : load_socket(a->sock, a->heat, in)) != 0)
		return 1;
	if (a->expert_bytes)
		in->expert_bytes = a->expert_bytes;
	if (a->gpu_bytes) {
		if (!in->expert_bytes) {
			fprintf(stderr, "moe-sidecar placement: --gpu-bytes needs the bytes of one "
			                "expert: --expert-bytes B\n");
			return 2;
		}
		gpu_experts = a->gpu_bytes / in->expert_bytes;
	}
	struct placements p = {0};
	int status = place_every_strategy(in, gpu_experts, &p);
	if (status == 0 && a->json)
		status = print_placement_json(in, gpu_experts, a->strategy, &p);
	else if (status == 0)
		print_placement_text(in, gpu_experts, a->strategy, &p);
	free(p.masks);
	return status;
}

int cmd_placement(int argc, char **argv)
{
	struct placement_args a;
	int status = parse_placement_args(argc, argv, &a);
	if (status >= 0)
		return status;
	struct placement_input in = {0};
	status = place_and_print(&a, &in);
	free(in.load);
	free(in.blocks);
	return status;
}
