/* verify.c — `moe-sidecar verify MODEL [--socket S] [--layers L,…] [--experts N]
 * [--tokens N,…] [--seed N] [--scale X] [--json] [--log-level L]`: does the served path compute
 * what the model file says? For sampled experts of sampled MoE layers, an fp64 reference from the
 * file's bytes (expert_reference.h: scalar reference dequantizers, double sums) against the
 * same inputs run through the served path — a running sidecar over the channel (--socket),
 * else the in-process forward engine the sidecar serves with — reported as NMSE per format
 * and token count next to the bound the project promises (docs/formats.md, "Accuracy").
 *
 * Each expert is run alone (k = 1: a broken bound names its layer, expert and format), then
 * the sample together at the model's top-k (the weighted sum the engine sees), each on at
 * least VERIFY_JUDGED_TOKENS tokens per count (requests of fewer repeated on fresh tokens),
 * judged as one NMSE. The activations are f32 from one deterministic draw per layer.
 * Exit status: 0 every bound held, 1 one broke (or the served path failed a request), 2 usage
 * or model errors (nothing is loaded before every option is checked).
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "commands.h"
#include "expert_reference.h"
#include "forward.h"
#include "json_writer.h"
#include "log.h"
#include "moe_client.h"
#include "moe_kernels.h"
#include "moe_proto.h"
#include "option_values.h"
#include "progress.h"
#include "splitmix.h"

#define VERIFY_MAX_LIST 64
#define VERIFY_MAX_TOKENS 4096u
#define VERIFY_MAX_GROUPS 64
#define VERIFY_MAX_FAILURES 32
#define VERIFY_MAX_SAMPLE 1024 /* experts per layer */
/* Tokens judged together per (expert, count): requests of fewer are repeated on fresh rows.
 * One token's NMSE scatters around the bound's figure (a token whose output nearly cancels
 * has a large one); the bounds are what the tests hold batches of such tokens to. */
#define VERIFY_JUDGED_TOKENS 16u

struct verify_options {
	const char *model, *socket;
	uint32_t layers[VERIFY_MAX_LIST], n_layers; /* 0: first, middle and last MoE layer */
	uint32_t experts;                           /* per layer */
	uint32_t tokens[VERIFY_MAX_LIST], n_tokens; /* ascending */
	uint64_t seed;
	double scale; /* activations uniform in [-scale, scale) */
	bool json;
};

/* One row of the report: a format (gate/up, and down where it differs) at a token count. */
struct verify_group {
	char format[40];
	uint32_t tokens;
	double err, ref, bound;
	uint32_t checks; /* experts alone and samples together judged in it */
};

struct verify_failure {
	uint32_t layer;
	int32_t expert; /* -1: the sample together */
	char format[40];
	uint32_t tokens;
	double nmse, bound;
};

/* The served path: an engine in this process, or a client of a running sidecar. */
struct served_path {
	struct forward_engine *engine;
	struct moe_client *client;
	struct moe_slot slot;
};

struct verify_run {
	const struct verify_options *o;
	const struct moe_catalog *cat;
	struct expert_reference *ref;
	struct served_path served;
	uint32_t layers[VERIFY_MAX_LIST], n_layers;
	uint32_t n_sample, k, max_tokens;
	uint32_t rows; /* input rows: the most any count's repeated requests take */
	size_t hidden;
	float *x, *w, *out; /* max_tokens x hidden inputs; max_tokens x k weights; outputs */
	int32_t *ids;       /* max_tokens x k */
	double *ref_out;    /* n_sample x max_tokens x hidden: each sampled expert's outputs */
	double *want;       /* max_tokens x hidden */
	struct verify_group groups[VERIFY_MAX_GROUPS];
	uint32_t n_groups;
	struct verify_failure failures[VERIFY_MAX_FAILURES];
	uint32_t n_failures, n_broken;
	struct progress progress;
	uint64_t experts_done;
};

static const char usage_text[] =
    "usage: moe-sidecar verify MODEL [--socket PATH] [--layers L,...] [--experts N]\n"
    "                          [--tokens N,...] [--seed N] [--scale X] [--json]\n"
    "                          [--log-level L]\n"
    "  Checks the served expert computation against an fp64 reference computed from MODEL's\n"
    "  bytes: NMSE per format and token count, against the bound docs/formats.md promises.\n"
    "  --socket PATH   a running sidecar serving MODEL (default: the in-process engine)\n"
    "  --layers L,...  transformer blocks to sample (default: first, middle, last MoE layer)\n"
    "  --experts N     experts sampled per layer (default 4)\n"
    "  --tokens N,...  token counts per request (default 1,8,64: decode, batched, prefill)\n"
    "  --seed N        sampling and inputs (default 1)\n"
    "  --scale X       activations uniform in [-X, X) (default 1; about 20 reaches gpt-oss's\n"
    "                  swiglu clamp)\n"
    "  --json          one JSON object on stdout (progress as JSON log lines on stderr)\n"
    "  --log-level L   debug|info|warn|error: progress and engine events (default info)\n"
    "  exit status: 0 every bound holds, 1 a bound is broken, 2 usage or model error\n";

/* "1,8,64" into list (each in [min, max]); 0, or -1 for a malformed or too long list. */
static int parse_list(const char *s, uint64_t min, uint64_t max, uint32_t *list, uint32_t *n)
{
	*n = 0;
	char buf[512];
	if (!s || strlen(s) >= sizeof(buf))
		return -1;
	strcpy(buf, s);
	char *save = NULL;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		uint64_t v;
		if (*n == VERIFY_MAX_LIST || option_u64(t, min, max, &v))
			return -1;
		list[(*n)++] = (uint32_t)v;
	}
	return *n ? 0 : -1;
}

static int cmp_u32(const void *a, const void *b)
{
	const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/* Sorted, duplicates dropped. */
static void sort_unique(uint32_t *list, uint32_t *n)
{
	qsort(list, *n, sizeof(*list), cmp_u32);
	uint32_t m = 0;
	for (uint32_t i = 0; i < *n; i++)
		if (!m || list[m - 1] != list[i])
			list[m++] = list[i];
	*n = m;
}

enum {
	OPT_SOCKET = 256,
	OPT_LAYERS,
	OPT_EXPERTS,
	OPT_TOKENS,
	OPT_SEED,
	OPT_SCALE,
	OPT_JSON,
	OPT_LOG_LEVEL
};

static int option_error(const char *name, const char *arg, const char *expected)
{
	fprintf(stderr, "moe-sidecar verify: --%s '%s': %s\n", name, arg, expected);
	return 2;
}

static int apply_option(int c, const char *arg, struct verify_options *o)
{
	uint64_t v;
	switch (c) {
	case OPT_SOCKET: o->socket = arg; return 0;
	case OPT_LAYERS:
		if (parse_list(arg, 0, UINT32_MAX - 1, o->layers, &o->n_layers))
			return option_error("layers", arg, "expected block indices L,L,...");
		sort_unique(o->layers, &o->n_layers);
		return 0;
	case OPT_EXPERTS:
		if (option_u64(arg, 1, 1u << 16, &v))
			return option_error("experts", arg, "expected 1..65536");
		o->experts = (uint32_t)v;
		return 0;
	case OPT_TOKENS:
		if (parse_list(arg, 1, VERIFY_MAX_TOKENS, o->tokens, &o->n_tokens))
			return option_error("tokens", arg, "expected counts N,N,... in 1..4096");
		sort_unique(o->tokens, &o->n_tokens);
		return 0;
	case OPT_SEED:
		if (option_u64(arg, 0, UINT64_MAX, &v))
			return option_error("seed", arg, "expected an unsigned integer");
		o->seed = v;
		return 0;
	case OPT_SCALE: {
		char *end;
		o->scale = strtod(arg, &end);
		if (end == arg || *end || !(o->scale > 0 && o->scale <= 1e4))
			return option_error("scale", arg, "expected a number in (0, 10000]");
		return 0;
	}
	case OPT_JSON: o->json = true; return 0;
	case OPT_LOG_LEVEL: {
		const int l = log_level_parse(arg);
		if (l < 0)
			return option_error("log-level", arg, "expected debug|info|warn|error");
		log_set_level((enum log_level)l);
		return 0;
	}
	default: fputs(usage_text, stderr); return 2;
	}
}

/* -1 to go on, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, struct verify_options *o)
{
	static const struct option longopts[] = {
	    {"socket", required_argument, NULL, OPT_SOCKET},
	    {"layers", required_argument, NULL, OPT_LAYERS},
	    {"experts", required_argument, NULL, OPT_EXPERTS},
	    {"tokens", required_argument, NULL, OPT_TOKENS},
	    {"seed", required_argument, NULL, OPT_SEED},
	    {"scale", required_argument, NULL, OPT_SCALE},
	    {"json", no_argument, NULL, OPT_JSON},
	    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	*o = (struct verify_options){
	    .experts = 4, .tokens = {1, 8, 64}, .n_tokens = 3, .seed = 1, .scale = 1};
	optind = 1;
	opterr = 1;
	int c;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (c == 'h') {
			fputs(usage_text, stdout);
			return 0;
		}
		if (apply_option(c, optarg, o))
			return 2;
	}
	if (optind >= argc) {
		fputs(usage_text, stderr);
		return 2;
	}
	if (optind + 1 < argc) {
		fprintf(stderr, "moe-sidecar verify: unexpected argument '%s' (one MODEL only)\n",
		        argv[optind + 1]);
		return 2;
	}
	o->model = argv[optind];
	return -1;
}

/* ---- The served path ---------------------------------------------------------------------- */

static int served_open_engine(struct verify_run *v, struct sidecar_error *err)
{
	struct forward_config fc = {
	    .source = FORWARD_SOURCE_RESIDENCY,
	    .lazy_load = true, /* read on demand: only the sampled experts */
	    .max_tokens = v->max_tokens,
	    .max_ids_per_token = v->k,
	};
	struct forward_budget b;
	if (forward_plan_budget(v->cat, &fc, &b, err))
		return -1;
	/* slots for the sample of every layer and a few more; every expert if that is less */
	const uint64_t experts = (uint64_t)v->cat->info.n_moe_layers * v->cat->info.n_experts;
	const uint64_t per = b.every_bytes / (experts ? experts : 1) + 1;
	const uint64_t want = per * ((uint64_t)v->n_layers * v->n_sample + 4);
	fc.mem_budget = want < b.every_bytes ? want : 0;
	return forward_create(&v->served.engine, v->cat, &fc, err);
}

static int served_open_socket(struct verify_run *v, struct sidecar_error *err)
{
	char fingerprint[33];
	if (moe_model_fingerprint(v->o->model, fingerprint) != MOE_OK)
		return error_set(err, MOE_EINVAL, "%s", moe_connect_error());
	struct moe_connect_opts opts = {.socket_path = v->o->socket,
	                                .max_tokens = v->max_tokens,
	                                .top_k = v->k,
	                                .n_slots = 1,
	                                .client_name = "moe-sidecar verify",
	                                .expect_model = fingerprint};
	int rc = moe_connect(&opts, &v->served.client);
	if (rc != MOE_OK)
		return error_set(err, rc, "%s", moe_connect_error());
	const struct moe_info *in = moe_info(v->served.client);
	if (in->max_tokens < v->max_tokens || in->hidden != v->hidden)
		return error_set(err, MOE_EINVAL,
		                 "the sidecar negotiated %u tokens of %u elements, verify needs "
		                 "%u of %zu",
		                 in->max_tokens, in->hidden, v->max_tokens, v->hidden);
	rc = moe_slot_acquire(v->served.client, &v->served.slot);
	return rc == MOE_OK ? 0 : error_set(err, rc, "%s", moe_last_error(v->served.client));
}

static void served_close(struct served_path *s)
{
	if (s->engine)
		forward_destroy(s->engine);
	moe_close(s->client);
}

/* n tokens (rows of x) of k ids through the served path into v->out (n x hidden f32). 0, or -1 with
 * the reason in why. */
static int served_run(struct verify_run *v, const float *x, uint32_t layer, uint32_t n, uint32_t k,
                      char *why, size_t len)
{
	const size_t h = v->hidden;
	struct served_path *s = &v->served;
	if (s->engine) {
		struct forward_request q = {.layer = (int32_t)layer,
		                            .n_tokens = n,
		                            .k = k,
		                            .x = x,
		                            .x_dtype = MOEK_ACT_F32,
		                            .ids = v->ids,
		                            .weights = v->w};
		struct forward_result res;
		if (forward_run(s->engine, &q, v->out, NULL, &res) == MOE_OK)
			return 0;
		snprintf(why, len, "%s", res.message);
		return -1;
	}
	memcpy(s->slot.input, x, (size_t)n * h * sizeof(float));
	memcpy(s->slot.expert_ids, v->ids, (size_t)n * k * sizeof(int32_t));
	memcpy(s->slot.expert_weights, v->w, (size_t)n * k * sizeof(float));
	struct moe_completion done;
	const int rc = moe_forward(s->client, &s->slot, (int32_t)layer, n, (uint16_t)k, 0,
	                           MOE_DTYPE_F32, MOE_DTYPE_F32, 0, &done, 600000);
	if (rc != MOE_OK) {
		snprintf(why, len, "%s", moe_last_error(s->client));
		return -1;
	}
	memcpy(v->out, s->slot.output, (size_t)n * h * sizeof(float));
	return 0;
}

/* ---- Sampling and checking ---------------------------------------------------------------- */

/* The layers to sample: those asked for (each must be an MoE block), else the first, middle
 * and last MoE layer. 0, or -1 with err. */
static int pick_layers(struct verify_run *v, struct sidecar_error *err)
{
	const struct moe_catalog *cat = v->cat;
	if (v->o->n_layers) {
		for (uint32_t i = 0; i < v->o->n_layers; i++) {
			const uint32_t L = v->o->layers[i];
			if (L >= cat->info.n_layers || !cat->layers[L].moe)
				return error_set(err, MOE_EINVAL,
				                 "--layers: block %u is not an MoE layer of %s", L,
				                 v->o->model);
			v->layers[v->n_layers++] = L;
		}
		return 0;
	}
	uint32_t moe[3], n = 0, seen = 0;
	const uint32_t want[3] = {0, cat->info.n_moe_layers / 2, cat->info.n_moe_layers - 1};
	for (uint32_t L = 0; L < cat->info.n_layers; L++) {
		if (!cat->layers[L].moe)
			continue;
		for (int i = 0; i < 3; i++)
			if (seen == want[i] && (!n || moe[n - 1] != L))
				moe[n++] = L;
		seen++;
	}
	if (!n)
		return error_set(err, MOE_EINVAL, "%s: no MoE layer", v->o->model);
	memcpy(v->layers, moe, n * sizeof(uint32_t));
	v->n_layers = n;
	return 0;
}

/* n_sample distinct experts of the layer (partial Fisher-Yates from the seed). */
static void pick_experts(const struct verify_run *v, uint32_t layer, uint32_t *sample)
{
	const uint32_t n = v->cat->info.n_experts;
	uint32_t *all = malloc(n * sizeof(uint32_t));
	uint64_t s = v->o->seed * 1000003u + layer;
	for (uint32_t i = 0; i < n; i++)
		all[i] = i;
	for (uint32_t i = 0; i < v->n_sample; i++) {
		const uint32_t j = i + (uint32_t)(splitmix64(&s) % (n - i)), t = all[i];
		all[i] = all[j];
		all[j] = t;
		sample[i] = all[i];
	}
	free(all);
	qsort(sample, v->n_sample, sizeof(uint32_t), cmp_u32);
}

static void format_key(const struct moe_expert *x, char *buf, size_t len)
{
	const struct moe_proj_ref *g = x->proj[MOE_PROJ_GATE_UP].present
	                                   ? &x->proj[MOE_PROJ_GATE_UP]
	                                   : &x->proj[MOE_PROJ_GATE];
	const struct moe_proj_ref *d = &x->proj[MOE_PROJ_DOWN];
	if (g->format == d->format)
		snprintf(buf, len, "%s", moe_format_name(g->format));
	else
		snprintf(buf, len, "%s/%s", moe_format_name(g->format), moe_format_name(d->format));
}

static void record(struct verify_run *v, const char *format, uint32_t tokens, double err,
                   double ref, double bound)
{
	uint32_t i = 0;
	while (i < v->n_groups &&
	       (strcmp(v->groups[i].format, format) || v->groups[i].tokens != tokens))
		i++;
	if (i == v->n_groups) {
		if (i == VERIFY_MAX_GROUPS)
			return;
		v->n_groups++;
		struct verify_group *g = &v->groups[i];
		memset(g, 0, sizeof(*g));
		snprintf(g->format, sizeof(g->format), "%s", format);
		g->tokens = tokens;
	}
	struct verify_group *g = &v->groups[i];
	g->err += err;
	g->ref += ref;
	g->checks++;
	if (bound > g->bound)
		g->bound = bound;
}

/* Adds the squared error of v->out (n tokens) against v->want, and the squared reference. */
static void measure(const struct verify_run *v, uint32_t n, double *err, double *ref)
{
	for (size_t i = 0; i < (size_t)n * v->hidden; i++) {
		const double d = (double)v->out[i] - v->want[i];
		*err += d * d;
		*ref += v->want[i] * v->want[i];
	}
}

/* Records one expert's (or the sample's) figures at a token count under its format, and a
 * failure when they break the bound (or are not finite). */
static void judge(struct verify_run *v, uint32_t layer, int32_t expert, const char *format,
                  uint32_t n, double err, double ref, double bound)
{
	record(v, format, n, err, ref, bound);
	const double nmse = ref > 0 ? err / ref : err;
	if (isfinite(nmse) && nmse <= bound)
		return;
	v->n_broken++;
	if (v->n_failures == VERIFY_MAX_FAILURES)
		return;
	struct verify_failure *f = &v->failures[v->n_failures++];
	*f = (struct verify_failure){
	    .layer = layer, .expert = expert, .tokens = n, .nmse = nmse, .bound = bound};
	snprintf(f->format, sizeof(f->format), "%s", format);
}

/* Requests of n tokens judged together: at least VERIFY_JUDGED_TOKENS tokens. */
static uint32_t repeats(uint32_t n)
{
	return (VERIFY_JUDGED_TOKENS + n - 1) / n;
}

/* The tokens' inputs: v->rows rows; request r of n tokens takes rows [r·n, (r+1)·n). */
static void make_inputs(struct verify_run *v, uint32_t layer)
{
	uint64_t s = v->o->seed * 7919u + layer + 1;
	for (size_t i = 0; i < (size_t)v->rows * v->hidden; i++)
		v->x[i] = (float)(v->o->scale * (2 * splitmix64_unit(&s) - 1));
}

/* The routing weight of input row `row` where the model puts it on the expert's input
 * (Llama-4): fixed per row, so that each sampled expert's reference is computed once, on the
 * scaled rows (in [0.25, 1) as the others). */
static float input_weight(const struct verify_run *v, size_t row)
{
	uint64_t s = v->o->seed * 104729u + row;
	return (float)(0.25 + 0.75 * splitmix64_unit(&s));
}

/* A request's routing weight for input row `row`: random in [0.25, 1), or the row's input
 * weight; *out_factor: what the reference output is multiplied by (w, or 1 when the weight
 * went into the reference's input). */
static float route_weight(const struct verify_run *v, uint64_t *s, size_t row, float *out_factor)
{
	const float w = (float)(0.25 + 0.75 * splitmix64_unit(s));
	if (!v->cat->info.weight_on_input) {
		*out_factor = w;
		return w;
	}
	*out_factor = 1.0f;
	return input_weight(v, row);
}

/* Expert sample[i] alone (k = 1) on the requests of n tokens; its error and reference sums. */
static int run_alone(struct verify_run *v, uint32_t layer, const uint32_t *sample, uint32_t i,
                     uint32_t n, uint64_t *s, double sums[2], struct sidecar_error *err)
{
	const size_t h = v->hidden, per = (size_t)v->rows * h;
	char why[200];
	for (uint32_t r = 0; r < repeats(n); r++) {
		const size_t t0 = (size_t)r * n;
		for (uint32_t t = 0; t < n; t++) {
			float f;
			v->ids[t] = (int32_t)sample[i];
			v->w[t] = route_weight(v, s, t0 + t, &f);
			for (size_t o = 0; o < h; o++)
				v->want[t * h + o] = f * v->ref_out[i * per + (t0 + t) * h + o];
		}
		if (served_run(v, v->x + t0 * h, layer, n, 1, why, sizeof(why)))
			return error_set(err, MOE_EIO, "layer %u expert %u, %u tokens: %s", layer,
			                 sample[i], n, why);
		measure(v, n, &sums[0], &sums[1]);
	}
	return 0;
}

/* The sample together on the requests of n tokens: token t takes k of them, rotating. */
static int run_together(struct verify_run *v, uint32_t layer, const uint32_t *sample, uint32_t n,
                        uint64_t *s, double sums[2], struct sidecar_error *err)
{
	const size_t h = v->hidden, per = (size_t)v->rows * h;
	char why[200];
	for (uint32_t r = 0; r < repeats(n); r++) {
		const size_t t0 = (size_t)r * n;
		memset(v->want, 0, (size_t)n * h * sizeof(double));
		for (uint32_t t = 0; t < n; t++)
			for (uint32_t j = 0; j < v->k; j++) {
				const uint32_t i = (t + j) % v->n_sample;
				float f;
				const float w = route_weight(v, s, t0 + t, &f);
				v->ids[t * v->k + j] = (int32_t)sample[i];
				v->w[t * v->k + j] = w;
				for (size_t o = 0; o < h; o++)
					v->want[t * h + o] +=
					    f * v->ref_out[i * per + (t0 + t) * h + o];
			}
		if (served_run(v, v->x + t0 * h, layer, n, v->k, why, sizeof(why)))
			return error_set(err, MOE_EIO,
			                 "layer %u, %u experts per token, %u tokens: %s", layer,
			                 v->k, n, why);
		measure(v, n, &sums[0], &sums[1]);
	}
	return 0;
}

/* Layer `layer`: the reference of each sampled expert on every input row, then every token
 * count through the served path, each expert alone and the sample together. */
static int verify_layer(struct verify_run *v, uint32_t layer, struct sidecar_error *err)
{
	uint32_t sample[VERIFY_MAX_SAMPLE];
	pick_experts(v, layer, sample);
	make_inputs(v, layer);
	const size_t per = (size_t)v->rows * v->hidden;
	/* Llama-4: the reference runs on each row times its routing weight */
	float *ref_x = v->x;
	if (v->cat->info.weight_on_input) {
		if (!(ref_x = malloc(per * sizeof(float))))
			return error_set(err, MOE_ENOMEM, "out of memory");
		for (size_t r = 0; r < v->rows; r++)
			for (size_t o = 0; o < v->hidden; o++)
				ref_x[r * v->hidden + o] =
				    v->x[r * v->hidden + o] * input_weight(v, r);
	}
	for (uint32_t i = 0; i < v->n_sample; i++) {
		if (expert_reference_load(v->ref, layer, sample[i], err)) {
			if (ref_x != v->x)
				free(ref_x);
			return -1;
		}
		expert_reference_run(v->ref, ref_x, v->rows, v->ref_out + i * per);
		progress_update(&v->progress, ++v->experts_done);
	}
	if (ref_x != v->x)
		free(ref_x);
	uint64_t s = v->o->seed * 31337u + layer;
	for (uint32_t ti = 0; ti < v->o->n_tokens; ti++) {
		const uint32_t n = v->o->tokens[ti];
		const enum expert_path path = expert_path_of(n);
		double all_bound = 0;
		char key[40], all_key[40] = "";
		for (uint32_t i = 0; i < v->n_sample; i++) {
			const struct moe_expert *x = moe_catalog_expert(v->cat, layer, sample[i]);
			const double bound = expert_reference_bound(x, path);
			double sums[2] = {0, 0};
			format_key(x, key, sizeof(key));
			if (!i)
				snprintf(all_key, sizeof(all_key), "%s", key);
			all_bound = bound > all_bound ? bound : all_bound;
			if (run_alone(v, layer, sample, i, n, &s, sums, err))
				return -1;
			judge(v, layer, (int32_t)sample[i], key, n, sums[0], sums[1], bound);
		}
		double sums[2] = {0, 0};
		if (run_together(v, layer, sample, n, &s, sums, err))
			return -1;
		judge(v, layer, -1, all_key, n, sums[0], sums[1], all_bound);
	}
	return 0;
}

/* ---- Report ------------------------------------------------------------------------------- */

static double group_nmse(const struct verify_group *g)
{
	return g->ref > 0 ? g->err / g->ref : g->err;
}

static bool group_ok(const struct verify_group *g)
{
	const double e = group_nmse(g);
	return isfinite(e) && e <= g->bound;
}

static const char *served_name(const struct verify_run *v)
{
	return v->o->socket ? "socket" : "in-process";
}

static void print_text(const struct verify_run *v)
{
	printf("verify %s: %u layer(s) x %u expert(s), top-%u, served ", v->o->model, v->n_layers,
	       v->n_sample, v->k);
	if (v->o->socket)
		printf("by the sidecar at %s\n", v->o->socket);
	else
		printf("in process (ISA %s)\n", moek_isa_name());
	printf("%-16s %6s  %-8s %-10s %-10s %s\n", "format", "tokens", "path", "nmse", "bound",
	       "result");
	for (uint32_t i = 0; i < v->n_groups; i++) {
		const struct verify_group *g = &v->groups[i];
		printf("%-16s %6u  %-8s %-10.3g %-10.3g %s\n", g->format, g->tokens,
		       expert_path_name(expert_path_of(g->tokens)), group_nmse(g), g->bound,
		       group_ok(g) ? "ok" : "BROKEN");
	}
	for (uint32_t i = 0; i < v->n_failures; i++) {
		const struct verify_failure *f = &v->failures[i];
		if (f->expert >= 0)
			printf("BROKEN layer %u expert %d %s, %u tokens: nmse %.3g > bound %.3g\n",
			       f->layer, f->expert, f->format, f->tokens, f->nmse, f->bound);
		else
			printf("BROKEN layer %u, the sampled experts together %s, %u tokens: nmse "
			       "%.3g > bound %.3g\n",
			       f->layer, f->format, f->tokens, f->nmse, f->bound);
	}
	if (v->n_broken > v->n_failures)
		printf("… and %u more\n", v->n_broken - v->n_failures);
	printf("%s\n", v->n_broken ? "FAILED: a bound is broken" : "OK: every bound holds");
}

static int print_json(const struct verify_run *v)
{
	struct json_writer w;
	jw_init_file(&w, stdout);
	jw_object_begin(&w);
	jw_kv_string(&w, "model", v->o->model);
	jw_kv_string(&w, "served", served_name(v));
	if (!v->o->socket) /* the sidecar's own is in its log */
		jw_kv_string(&w, "isa", moek_isa_name());
	jw_key(&w, "layers");
	jw_array_begin(&w);
	for (uint32_t i = 0; i < v->n_layers; i++)
		jw_u64(&w, v->layers[i]);
	jw_array_end(&w);
	jw_kv_u64(&w, "experts", v->n_sample);
	jw_kv_u64(&w, "top_k", v->k);
	jw_key(&w, "results");
	jw_array_begin(&w);
	for (uint32_t i = 0; i < v->n_groups; i++) {
		const struct verify_group *g = &v->groups[i];
		jw_object_begin(&w);
		jw_kv_string(&w, "format", g->format);
		jw_kv_u64(&w, "tokens", g->tokens);
		jw_kv_string(&w, "path", expert_path_name(expert_path_of(g->tokens)));
		jw_kv_double(&w, "nmse", group_nmse(g), JW_SHORT);
		jw_kv_double(&w, "bound", g->bound, JW_SHORT);
		jw_kv_u64(&w, "checks", g->checks);
		jw_kv_bool(&w, "ok", group_ok(g));
		jw_object_end(&w);
	}
	jw_array_end(&w);
	jw_key(&w, "broken");
	jw_array_begin(&w);
	for (uint32_t i = 0; i < v->n_failures; i++) {
		const struct verify_failure *f = &v->failures[i];
		jw_object_begin(&w);
		jw_kv_u64(&w, "layer", f->layer);
		if (f->expert >= 0)
			jw_kv_u64(&w, "expert", (uint64_t)f->expert);
		jw_kv_string(&w, "format", f->format);
		jw_kv_u64(&w, "tokens", f->tokens);
		jw_kv_double(&w, "nmse", f->nmse, JW_SHORT);
		jw_kv_double(&w, "bound", f->bound, JW_SHORT);
		jw_object_end(&w);
	}
	jw_array_end(&w);
	jw_kv_bool(&w, "ok", v->n_broken == 0);
	jw_object_end(&w);
	return jw_finish_line(&w);
}

/* ---- The command -------------------------------------------------------------------------- */

static int verify_alloc(struct verify_run *v, struct sidecar_error *err)
{
	const size_t h = v->hidden, n = v->max_tokens;
	v->x = malloc((size_t)v->rows * h * sizeof(float));
	v->out = malloc(n * h * sizeof(float));
	v->w = malloc(n * v->k * sizeof(float));
	v->ids = malloc(n * v->k * sizeof(int32_t));
	v->want = malloc(n * h * sizeof(double));
	v->ref_out = malloc((size_t)v->n_sample * v->rows * h * sizeof(double));
	if (!v->x || !v->out || !v->w || !v->ids || !v->want || !v->ref_out)
		return error_set(err, MOE_ENOMEM, "buffers for %zu tokens: out of memory", n);
	return 0;
}

static void verify_free(struct verify_run *v)
{
	served_close(&v->served);
	expert_reference_close(v->ref);
	free(v->x);
	free(v->out);
	free(v->w);
	free(v->ids);
	free(v->want);
	free(v->ref_out);
}

/* Everything before the first request: sample, buffers, reference, served path. 0, 2 (the
 * model or the options do not fit it) or 1 (the served path cannot be had). */
static int verify_setup(struct verify_run *v, struct sidecar_error *err)
{
	const struct moe_model_hparams *in = &v->cat->info;
	v->hidden = in->hidden;
	v->n_sample = v->o->experts < in->n_experts ? v->o->experts : in->n_experts;
	v->k = in->top_k < v->n_sample ? in->top_k : v->n_sample;
	if (!v->k)
		v->k = 1;
	v->max_tokens = v->o->tokens[v->o->n_tokens - 1];
	if (v->n_sample > VERIFY_MAX_SAMPLE)
		v->n_sample = VERIFY_MAX_SAMPLE;
	for (uint32_t i = 0; i < v->o->n_tokens; i++) {
		const uint32_t n = v->o->tokens[i], rows = repeats(n) * n;
		v->rows = rows > v->rows ? rows : v->rows;
	}
	if (pick_layers(v, err) || verify_alloc(v, err) ||
	    expert_reference_open(v->cat, &v->ref, err))
		return 2;
	const int rc = v->o->socket ? served_open_socket(v, err) : served_open_engine(v, err);
	return rc ? (err->status == MOE_EINVAL || err->status == MOE_EREFUSED ? 2 : 1) : 0;
}

int cmd_verify(int argc, char **argv)
{
	struct verify_options o;
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	log_set_json(o.json);
	struct sidecar_error err = {0};
	struct moe_catalog *cat;
	if (moe_catalog_open(o.model, &cat, &err)) {
		fprintf(stderr, "moe-sidecar verify: %s\n", err.msg);
		return 2;
	}
	struct verify_run *v = calloc(1, sizeof(*v));
	if (!v) {
		moe_catalog_close(cat);
		fprintf(stderr, "moe-sidecar verify: out of memory\n");
		return 1;
	}
	v->o = &o;
	v->cat = cat;
	rc = verify_setup(v, &err);
	if (rc == 0) {
		progress_begin_log(&v->progress, "verify", "fp64 references",
		                   (uint64_t)v->n_layers * v->n_sample, "experts");
		for (uint32_t i = 0; i < v->n_layers && rc == 0; i++)
			if (verify_layer(v, v->layers[i], &err))
				rc = err.status == MOE_EINVAL ? 2 : 1;
		progress_end(&v->progress);
	}
	if (rc != 0) {
		fprintf(stderr, "moe-sidecar verify: %s\n", err.msg);
	} else {
		if (o.json ? print_json(v) : (print_text(v), 0))
			rc = 1;
		if (fflush(stdout))
			rc = 1;
		if (v->n_broken)
			rc = 1;
	}
	verify_free(v);
	free(v);
	moe_catalog_close(cat);
	return rc;
}
