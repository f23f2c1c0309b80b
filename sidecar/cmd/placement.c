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
	    "  --gpu-bytes B     or a GPU budget in bytes (K/M/G suffix); --socket: divided by\n"
	    "                    the model's bytes per expert, --trace: needs --expert-bytes\n"
	    "  --expert-bytes B  bytes of one expert (with --trace and --gpu-bytes)\n"
	    "  --strategy S      the mask to print: frequency (default), uniform,\n"
	    "                    front-loading, balanced\n"
	    "  --by counts|heat  --socket: tokens routed since start (default) or decayed heat\n"
	    "  --json            one JSON object: coverage of every strategy, the mask\n");
}

static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-')
		return -1;
	unsigned long long v = strtoull(s, &end, 10);
	unsigned shift = 0;
	if (*end == 'K' || *end == 'k')
		shift = 10;
	else if (*end == 'M' || *end == 'm')
		shift = 20;
	else if (*end == 'G' || *end == 'g')
		shift = 30;
	if (shift)
		end++;
	if (errno || *end || v == 0 || v > (UINT64_MAX >> shift))
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
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

int cmd_placement(int argc, char **argv)
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
	const char *trace = NULL, *sock = NULL;
	uint64_t gpu_experts = 0, gpu_bytes = 0, expert_bytes = 0;
	int strategy = MOE_PLACE_FREQUENCY;
	bool json = false, heat = false, have_n = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 't': trace = optarg; break;
		case 's': sock = optarg; break;
		case 'n': {
			char *end;
			errno = 0;
			gpu_experts = strtoull(optarg, &end, 10);
			if (errno || *end || !*optarg || optarg[0] == '-' ||
			    gpu_experts > UINT32_MAX) {
				fprintf(stderr,
				        "moe-sidecar placement: --gpu-experts '%s': expected a "
				        "number of experts\n",
				        optarg);
				return 2;
			}
			have_n = true;
			break;
		}
		case 'b':
		case 'e':
			if (parse_size(optarg, c == 'b' ? &gpu_bytes : &expert_bytes) != 0) {
				fprintf(stderr,
				        "moe-sidecar placement: --%s '%s': expected BYTES (K/M/G "
				        "suffix allowed)\n",
				        c == 'b' ? "gpu-bytes" : "expert-bytes", optarg);
				return 2;
			}
			break;
		case 'S':
			strategy = moe_placement_parse(optarg);
			if (strategy < 0) {
				fprintf(
				    stderr,
				    "moe-sidecar placement: --strategy '%s': expected frequency, "
				    "uniform, front-loading or balanced\n",
				    optarg);
				return 2;
			}
			break;
		case 'y':
			if (strcmp(optarg, "counts") && strcmp(optarg, "heat")) {
				fprintf(
				    stderr,
				    "moe-sidecar placement: --by '%s': expected counts or heat\n",
				    optarg);
				return 2;
			}
			heat = !strcmp(optarg, "heat");
			break;
		case 'j': json = true; break;
		case 'h': placement_usage(stdout); return 0;
		default: placement_usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "moe-sidecar placement: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!trace == !sock) {
		fprintf(stderr,
		        "moe-sidecar placement: give one of --trace FILE or --socket PATH\n");
		return 2;
	}
	if (have_n == (gpu_bytes != 0)) {
		fprintf(stderr, "moe-sidecar placement: give one of --gpu-experts N or --gpu-bytes "
		                "B\n");
		return 2;
	}
	if (heat && trace) {
		fprintf(stderr, "moe-sidecar placement: --by heat needs --socket (a trace has "
		                "counts)\n");
		return 2;
	}
	struct placement_input in = {0};
	if ((trace ? load_trace(trace, &in) : load_socket(sock, heat, &in)) != 0) {
		free(in.load);
		free(in.blocks);
		return 1;
	}
	if (expert_bytes)
		in.expert_bytes = expert_bytes;
	if (gpu_bytes) {
		if (!in.expert_bytes) {
			fprintf(stderr, "moe-sidecar placement: --gpu-bytes needs the bytes of one "
			                "expert: --expert-bytes B\n");
			free(in.load);
			free(in.blocks);
			return 2;
		}
		gpu_experts = gpu_bytes / in.expert_bytes;
	}
	const size_t row = (in.n_experts + 7u) / 8u, mask_bytes = row * in.n_blocks;
	uint8_t *masks = calloc(MOE_PLACE_COUNT, mask_bytes ? mask_bytes : 1);
	double covered[MOE_PLACE_COUNT], worst[MOE_PLACE_COUNT];
	if (!masks) {
		free(in.load);
		free(in.blocks);
		return 1;
	}
	for (int s = 0; s < MOE_PLACE_COUNT; s++) {
		int rc = moe_placement(in.load, in.n_moe_layers, in.n_experts, in.blocks,
		                       in.n_blocks, (uint32_t)gpu_experts, s,
		                       masks + (size_t)s * mask_bytes, mask_bytes, &covered[s]);
		if (rc != MOE_OK) {
			fprintf(stderr, "moe-sidecar placement: %s: %s\n", moe_placement_name(s),
			        moe_strerror(rc));
			free(masks);
			free(in.load);
			free(in.blocks);
			return 1;
		}
		worst[s] = worst_layer(&in, masks + (size_t)s * mask_bytes);
	}
	const uint8_t *mask = masks + (size_t)strategy * mask_bytes;
	const uint64_t cells = (uint64_t)in.n_moe_layers * in.n_experts;
	if (json) {
		char *hex = malloc(2 * mask_bytes + 1);
		if (!hex) {
			fprintf(stderr, "moe-sidecar placement: out of memory\n");
			free(masks);
			free(in.load);
			free(in.blocks);
			return 1;
		}
		for (size_t b = 0; b < mask_bytes; b++)
			snprintf(hex + 2 * b, 3, "%02x", mask[b]);
		hex[2 * mask_bytes] = '\0';
		struct json_writer w;
		jw_init_file(&w, stdout);
		jw_object_begin(&w);
		jw_kv_string(&w, "source", in.source);
		jw_kv_u64(&w, "n_moe_layers", in.n_moe_layers);
		jw_kv_u64(&w, "n_experts", in.n_experts);
		jw_kv_u64(&w, "n_blocks", in.n_blocks);
		jw_kv_u64(&w, "gpu_experts", gpu_experts < cells ? gpu_experts : cells);
		jw_kv_string(&w, "strategy", moe_placement_name(strategy));
		jw_key(&w, "coverage");
		jw_object_begin(&w);
		for (int s = 0; s < MOE_PLACE_COUNT; s++)
			jw_kv_double(&w, moe_placement_name(s), covered[s], 6);
		jw_object_end(&w);
		jw_key(&w, "worst_layer_cpu_share");
		jw_object_begin(&w);
		for (int s = 0; s < MOE_PLACE_COUNT; s++)
			jw_kv_double(&w, moe_placement_name(s), worst[s], 6);
		jw_object_end(&w);
		jw_key(&w, "moe_layers");
		jw_array_begin(&w);
		for (uint32_t l = 0; l < in.n_moe_layers; l++)
			jw_i64(&w, in.blocks[l]);
		jw_array_end(&w);
		jw_kv_string(&w, "mask_hex", hex);
		jw_key(&w, "gpu_experts_mask");
		jw_array_begin(&w);
		for (uint32_t b = 0; b < in.n_blocks; b++) {
			jw_array_begin(&w);
			for (uint32_t e = 0; e < in.n_experts; e++)
				jw_bool(&w, (mask[(size_t)b * row + e / 8] >> (e % 8)) & 1u);
			jw_array_end(&w);
		}
		jw_array_end(&w);
		jw_object_end(&w);
		free(hex);
		const int wrc = jw_finish(&w);
		if (wrc != 0 || putchar('\n') == EOF) {
			fprintf(stderr, "moe-sidecar placement: writing the JSON: %s\n",
			        strerror(wrc ? -wrc : errno));
			free(masks);
			free(in.load);
			free(in.blocks);
			return 1;
		}
	} else {
		printf("%s\n", in.source);
		printf("GPU budget: %" PRIu64 " of %" PRIu64 " experts (%.1f%%)\n\n",
		       gpu_experts < cells ? gpu_experts : cells, cells,
		       cells ? 100.0 * (double)(gpu_experts < cells ? gpu_experts : cells) /
		                   (double)cells
		             : 0.0);
		printf("%-14s %18s %22s\n", "strategy", "covered on GPU", "worst layer on CPU");
		for (int s = 0; s < MOE_PLACE_COUNT; s++)
			printf("%-14s %17.1f%% %21.1f%%%s\n", moe_placement_name(s),
			       100.0 * covered[s], 100.0 * worst[s],
			       s == strategy ? "  <- mask" : "");
		printf("\nmask for moe_set_gpu_mask(c, -1, bits, %zu): %u rows of %zu bytes, hex, "
		       "block: bytes\n",
		       mask_bytes, in.n_blocks, row);
		for (uint32_t b = 0; b < in.n_blocks; b++) {
			printf("%5u: ", b);
			for (size_t x = 0; x < row; x++)
				printf("%02x", mask[(size_t)b * row + x]);
			printf("\n");
		}
		printf("\nkt-kernel gpu_experts_mask ([%u, %u] bool): true at these experts, per "
		       "layer\n",
		       in.n_blocks, in.n_experts);
		for (uint32_t b = 0; b < in.n_blocks; b++) {
			printf("%5u:", b);
			for (uint32_t e = 0; e < in.n_experts; e++)
				if ((mask[(size_t)b * row + e / 8] >> (e % 8)) & 1u)
					printf(" %u", e);
			printf("\n");
		}
	}
	free(masks);
	free(in.load);
	free(in.blocks);
	return 0;
}
