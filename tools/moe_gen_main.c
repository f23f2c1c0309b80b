/* moe_gen_main.c — `moe-gen`: command-line front end of libmoe_gen (see moe_gen.h). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "moe_gen.h"
#include "moe_kernels.h"

/* Whether --format NAME writes fi's format: a weight format of the kernels' table, except
 * INT4_G32, the sidecar's load-time layout of INT4 checkpoints (--format int4-ct | gptq). The
 * help lists exactly these. */
static bool format_writable(const struct moek_format_info *fi)
{
	return fi->weight_format && fi->format != MOEK_INT4_G32;
}

/* The writable formats' names, lower case, space-separated. */
static void writable_format_names(char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = '\0';
	for (size_t i = 0; moek_format_at(i) && used < len; i++) {
		const struct moek_format_info *fi = moek_format_at(i);
		if (!format_writable(fi))
			continue;
		int n = snprintf(buf + used, len - used, "%s%s", used ? " " : "", fi->name);
		if (n < 0)
			break;
		used += (size_t)n;
	}
	for (char *c = buf; *c; c++)
		*c = (char)tolower((unsigned char)*c);
}

static void usage(FILE *o)
{
	char presets[256];
	moe_model_preset_names(presets, sizeof(presets), " | ");
	fprintf(
	    o,
	    "usage: moe-gen --preset NAME --out PATH [options]\n"
	    "       moe-gen --version\n"
	    "  --out PATH       PATH.gguf writes GGUF; any other PATH is a directory that gets\n"
	    "                   config.json + safetensors\n"
	    "  --preset NAME    %s\n",
	    presets);
	char formats[256];
	writable_format_names(formats, sizeof(formats));
	fprintf(o,
	        "  --format F       %s\n"
	        "                   (fp8 = fp8_e4m3_b128; default: q8_0 for GGUF, bf16 for\n"
	        "                   safetensors, fp8 for deepseek-v3 safetensors, mxfp4 for\n"
	        "                   gpt-oss)\n",
	        formats);
	fprintf(o, "  --format int4-ct | gptq | awq\n"
	           "                   an INT4 checkpoint: compressed-tensors pack-quantized,\n"
	           "                   GPTQ v1 or AutoAWQ GEMM (safetensors, experts only)\n"
	           "  --group N|row    its group size (default: 32 int4-ct, 128 gptq, awq); row:\n"
	           "                   one group per row (gptq group_size -1, int4-ct\n"
	           "                   strategy channel)\n");
	fprintf(o, "  --mix M          q4_k_m | q3_k_m | q2_k | iq2_xxs | iq2_xs | iq3_xxs |\n"
	           "                   iq1_s | iq1_m | iq2_s | iq2_m: GGUF experts typed per\n"
	           "                   tensor as"
	           " llama.cpp's quantizer types them (docs/formats.md)\n");
	fprintf(
	    o,
	    "  --seed N         weights are a pure function of (seed, layer, expert, tensor)\n"
	    "  --layers N       number of blocks (default: 2; --full: the real count)\n"
	    "  --hidden N --ffn N --experts N   shrink dims (default: the real model's)\n"
	    "  --shards N       split into N files (GGUF splits / safetensors shards + index)\n"
	    "  --per-expert     GGUF: legacy per-expert 2-D tensors blk.N.ffn_gate.E.weight\n"
	    "  --full-model     every tensor of the architecture (embeddings, attention, norms,\n"
	    "                   shared experts, lm_head; random weights) with a config that\n"
	    "                   transformers and llama.cpp load; the experts are unchanged\n"
	    "  --vocab N --heads N --kv-heads N --head-dim N\n"
	    "                   its dimensions (default: vocab 4096, the others scaled from\n"
	    "                   the preset to --hidden)\n"
	    "  --threads N      threads quantizing tensors (default: online CPUs; the output\n"
	    "                   is the same for any N)\n"
	    "  --quiet          no progress bar\n");
}

/* A writable format (format_writable), by its name in any case; "fp8" and "fp8_e4m3" also
 * name FP8_E4M3_B128. */
static int parse_format(const char *s, uint32_t *out)
{
	if (!strcasecmp(s, "fp8") || !strcasecmp(s, "fp8_e4m3")) {
		*out = MOEK_FP8_E4M3_B128;
		return 0;
	}
	for (size_t i = 0; moek_format_at(i); i++) {
		const struct moek_format_info *fi = moek_format_at(i);
		if (format_writable(fi) && !strcasecmp(s, fi->name)) {
			*out = fi->format;
			return 0;
		}
	}
	return -1;
}

static int parse_u64(const char *flag, const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end || !*s || s[0] == '-') {
		fprintf(stderr, "moe-gen: %s: '%s' is not an unsigned integer\n", flag, s);
		return -1;
	}
	*out = v;
	return 0;
}

/* The field of the option `name` that takes a count (uint32_t), or NULL. */
static uint32_t *count_option(struct moe_gen_options *o, const char *name)
{
	const struct {
		const char *name;
		uint32_t *field;
	} counts[] = {
	    {"--layers", &o->layers}, {"--experts", &o->experts},   {"--alignment", &o->alignment},
	    {"--shards", &o->shards}, {"--threads", &o->threads},   {"--vocab", &o->vocab},
	    {"--heads", &o->heads},   {"--kv-heads", &o->kv_heads}, {"--head-dim", &o->head_dim}};
	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
		if (!strcmp(name, counts[i].name))
			return counts[i].field;
	return NULL;
}

int main(int argc, char **argv)
{
	struct moe_gen_options o = {.seed = 1, .progress = true};
	const char *format = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t n;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--version")) {
			printf("moe-gen %s\n", MOE_VERSION);
			return 0;
		} else if (!strcmp(a, "--full")) {
			o.full = true;
		} else if (!strcmp(a, "--full-model")) {
			o.full_model = true;
		} else if (!strcmp(a, "--per-expert")) {
			o.per_expert = true;
		} else if (!strcmp(a, "--fused")) {
			o.fused_gate_up = true;
		} else if (!strcmp(a, "--quiet")) {
			o.progress = false;
		} else if (!v) {
			fprintf(stderr, "moe-gen: unknown option or missing value: %s\n\n", a);
			usage(stderr);
			return 2;
		} else if (!strcmp(a, "--out")) {
			o.out = v, i++;
		} else if (!strcmp(a, "--preset")) {
			o.preset = v, i++;
		} else if (!strcmp(a, "--format")) {
			format = v, i++;
		} else if (!strcmp(a, "--group") && !strcmp(v, "row")) {
			o.group = MOE_GEN_GROUP_ROW, i++;
		} else if (!strcmp(a, "--mix")) {
			if (moe_gen_mix_parse(v, &o.mix)) {
				fprintf(stderr,
				        "moe-gen: unknown mix '%s' (q4_k_m q3_k_m q2_k iq2_xxs "
				        "iq2_xs iq3_xxs iq1_s iq1_m iq2_s iq2_m)\n",
				        v);
				return 2;
			}
			i++;
		} else {
			if (parse_u64(a, v, &n))
				return 2;
			i++;
			uint32_t *count = count_option(&o, a);
			if (!strcmp(a, "--seed"))
				o.seed = n;
			else if (!strcmp(a, "--hidden"))
				o.hidden = n;
			else if (!strcmp(a, "--ffn"))
				o.ffn = n;
			else if (count && n <= UINT32_MAX)
				*count = (uint32_t)n;
			else if (!strcmp(a, "--group") && n < UINT32_MAX)
				o.group = (uint32_t)n;
			else {
				fprintf(stderr, "moe-gen: unknown option %s\n\n", a);
				usage(stderr);
				return 2;
			}
		}
	}
	if (!o.out || !o.preset) {
		usage(stderr);
		return 2;
	}
	const struct moe_model_preset *p = moe_model_preset_find(o.preset);
	size_t ol = strlen(o.out);
	int gguf = ol > 5 && !strcmp(o.out + ol - 5, ".gguf");
	if (format && o.mix) {
		fprintf(stderr, "moe-gen: --format and --mix exclude each other\n");
		return 2;
	}
	if (format && (!strcasecmp(format, "int4-ct") || !strcasecmp(format, "gptq") ||
	               !strcasecmp(format, "awq"))) {
		o.format = MOEK_INT4_G32;
		o.int4 = !strcasecmp(format, "gptq")  ? MOE_GEN_INT4_GPTQ
		         : !strcasecmp(format, "awq") ? MOE_GEN_INT4_AWQ
		                                      : MOE_GEN_INT4_CT;
	} else if (format) {
		if (parse_format(format, &o.format)) {
			char formats[256];
			writable_format_names(formats, sizeof(formats));
			fprintf(
			    stderr,
			    "moe-gen: unknown format '%s' (one of: %s, fp8, int4-ct, gptq, awq)\n",
			    format, formats);
			return 2;
		}
	} else if (p && p->arch == MOE_ARCH_GPT_OSS) {
		o.format = MOEK_MXFP4;
	} else if (gguf) {
		o.format = MOEK_Q8_0;
	} else {
		o.format = p && p->arch == MOE_ARCH_DEEPSEEK ? MOEK_FP8_E4M3_B128 : MOEK_BF16;
	}
	struct sidecar_error err;
	if (moe_gen_write(&o, &err)) {
		fprintf(stderr, "moe-gen: %s\n", err.msg);
		return 1;
	}
	return 0;
}
