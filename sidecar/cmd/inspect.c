/* inspect.c — `moe-sidecar inspect MODEL [--json]`: what the catalog sees in a model —
 * architecture, layers, experts, formats, bytes per expert and in total, slab alignment —
 * so an operator can check a model before serving it. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "catalog.h"
#include "commands.h"
#include "json_writer.h"

static const struct moe_expert *first_expert(const struct moe_catalog *cat)
{
	for (uint32_t L = 0; L < cat->info.n_layers; L++)
		if (cat->layers[L].moe)
			return &cat->layers[L].experts[0];
	return NULL;
}

/* Per-layer formats of projection p: up to 8 distinct formats, the MoE layers of each. A
 * K-quant mix (Q4_K_M puts some layers' down in Q6_K) shows as more than one. */
struct proj_formats {
	uint32_t n;
	uint32_t format[8];
	uint32_t layers[8]; /* how many MoE layers use format[i] */
};

static void proj_formats(const struct moe_catalog *cat, int p, struct proj_formats *pf)
{
	memset(pf, 0, sizeof(*pf));
	for (uint32_t L = 0; L < cat->info.n_layers; L++) {
		const struct moe_layer *ly = &cat->layers[L];
		if (!ly->moe || !ly->experts[0].proj[p].present)
			continue;
		uint32_t f = ly->experts[0].proj[p].format, i = 0;
		while (i < pf->n && pf->format[i] != f)
			i++;
		if (i == pf->n && pf->n < 8)
			pf->format[pf->n++] = f;
		if (i < pf->n)
			pf->layers[i]++;
	}
}

static bool formats_vary(const struct moe_catalog *cat)
{
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		struct proj_formats pf;
		proj_formats(cat, p, &pf);
		if (pf.n > 1)
			return true;
	}
	return false;
}

/* Returns 0, or -errno when writing failed. */
static int print_json(FILE *o, const struct moe_catalog *cat)
{
	const struct moe_model_hparams *in = &cat->info;
	const struct moe_expert *ex = first_expert(cat);
	uint64_t n_experts_total = (uint64_t)in->n_moe_layers * in->n_experts;
	struct json_writer w;
	jw_init_file(&w, o);
	jw_object_begin(&w);
	jw_kv_string(&w, "architecture", in->arch_name);
	jw_kv_string(&w, "family", moe_arch_name(in->arch));
	jw_kv_string(&w, "container", in->container == MOE_CONTAINER_GGUF ? "gguf" : "safetensors");
	jw_kv_u64(&w, "n_layers", in->n_layers);
	jw_kv_u64(&w, "n_moe_layers", in->n_moe_layers);
	jw_kv_u64(&w, "n_experts", in->n_experts);
	jw_kv_u64(&w, "top_k", in->top_k);
	jw_kv_u64(&w, "n_shared_experts", in->n_shared_experts);
	jw_kv_u64(&w, "hidden", in->hidden);
	jw_kv_u64(&w, "expert_ffn", in->expert_ffn);
	jw_kv_string(&w, "gating", moe_gating_name(in->gating));
	jw_kv_bool(&w, "norm_topk_prob", in->norm_topk_prob);
	jw_kv_double(&w, "routed_scaling", (double)in->routed_scaling, JW_SHORT);
	jw_kv_double(&w, "swiglu_limit", (double)in->swiglu_limit, JW_SHORT);
	jw_kv_bool(&w, "expert_bias", in->has_bias);
	jw_kv_bool(&w, "score_bias", in->score_bias);
	jw_kv_u64(&w, "n_group", in->n_group);
	jw_kv_u64(&w, "topk_group", in->topk_group);
	jw_kv_bool(&w, "shared_expert_gate", in->shared_expert_gate);
	jw_kv_bool(&w, "weight_on_input", in->weight_on_input);
	jw_kv_u64(&w, "moe_layer_step", in->moe_layer_step);
	jw_kv_u64(&w, "nextn_layers", in->nextn_layers);
	jw_key(&w, "formats");
	jw_array_begin(&w);
	for (uint32_t i = 0; i < cat->n_formats; i++)
		jw_string(&w, moe_format_name(cat->formats[i]));
	jw_array_end(&w);
	if (cat->quant.kind != MOE_QUANT_NONE) {
		char q[96];
		jw_kv_string(&w, "quantization",
		             moe_quant_config_describe(&cat->quant, q, sizeof(q)));
	}
	jw_key(&w, "proj_formats");
	jw_object_begin(&w);
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		struct proj_formats pf;
		proj_formats(cat, p, &pf);
		if (!pf.n)
			continue;
		jw_key(&w, moe_proj_name((enum moe_proj)p));
		jw_object_begin(&w);
		for (uint32_t i = 0; i < pf.n; i++)
			jw_kv_u64(&w, moe_format_name(pf.format[i]), pf.layers[i]);
		jw_object_end(&w);
	}
	jw_object_end(&w);
	jw_kv_u64(&w, "expert_bytes", ex ? ex->bytes : 0);
	jw_kv_u64(&w, "expert_bytes_total", cat->expert_bytes_total);
	jw_kv_u64(&w, "experts_total", n_experts_total);
	jw_kv_u64(&w, "experts_aligned_4k", cat->n_experts_aligned_4k);
	jw_key(&w, "moe_layers");
	jw_array_begin(&w);
	for (uint32_t L = 0; L < in->n_layers; L++)
		if (cat->layers[L].moe)
			jw_u64(&w, L);
	jw_array_end(&w);
	jw_key(&w, "files");
	jw_array_begin(&w);
	for (uint32_t i = 0; i < cat->n_files; i++) {
		jw_object_begin(&w);
		jw_kv_string(&w, "path", cat->files[i].path);
		jw_kv_u64(&w, "size", cat->files[i].size);
		jw_object_end(&w);
	}
	jw_array_end(&w);
	jw_object_end(&w);
	return jw_finish_line(&w);
}

static void print_bytes(FILE *o, uint64_t v)
{
	const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double d = (double)v;
	int i = 0;
	while (d >= 1024 && i < 4) {
		d /= 1024;
		i++;
	}
	fprintf(o, "%" PRIu64 " bytes (%.2f %s)", v, d, u[i]);
}

static void print_text(FILE *o, const struct moe_catalog *cat)
{
	const struct moe_model_hparams *in = &cat->info;
	const struct moe_expert *ex = first_expert(cat);
	/* the file's own name; the family the catalog reads it as when that differs */
	const char *family = moe_arch_name(in->arch),
	           *container = in->container == MOE_CONTAINER_GGUF ? "GGUF" : "safetensors";
	if (strcmp(family, in->arch_name))
		fprintf(o, "architecture    %s (family %s, %s)\n", in->arch_name, family,
		        container);
	else
		fprintf(o, "architecture    %s (%s)\n", in->arch_name, container);
	fprintf(o, "layers          %u (%u MoE:", in->n_layers, in->n_moe_layers);
	uint32_t shown = 0;
	for (uint32_t L = 0; L < in->n_layers; L++)
		if (cat->layers[L].moe && shown++ < 8)
			fprintf(o, " %u", L);
	fprintf(o, "%s)\n", in->n_moe_layers > 8 ? " …" : "");
	fprintf(o, "experts         %u routed, top-%u, %u shared%s", in->n_experts, in->top_k,
	        in->n_shared_experts, in->shared_expert_gate ? " (gated)" : "");
	if (in->moe_layer_step > 1)
		fprintf(o, ", MoE every %u blocks", in->moe_layer_step);
	if (in->nextn_layers)
		fprintf(o, ", %u multi-token-prediction block%s", in->nextn_layers,
		        in->nextn_layers > 1 ? "s" : "");
	fprintf(o, "\n");
	fprintf(o, "dims            hidden %" PRIu64 ", expert ffn %" PRIu64 "\n", in->hidden,
	        in->expert_ffn);
	fprintf(o, "gating          %s, norm_topk_prob %s, routed scaling %g",
	        moe_gating_name(in->gating), in->norm_topk_prob ? "yes" : "no",
	        (double)in->routed_scaling);
	if (in->score_bias)
		fprintf(o, ", score bias");
	if (in->n_group > 1)
		fprintf(o, ", %u of %u groups", in->topk_group, in->n_group);
	if (in->weight_on_input)
		fprintf(o, ", weight on the expert's input");
	if (in->swiglu_limit > 0)
		fprintf(o, ", swiglu limit %g", (double)in->swiglu_limit);
	fprintf(o, "%s\n", in->has_bias ? ", expert biases" : "");
	fprintf(o, "formats        ");
	for (uint32_t i = 0; i < cat->n_formats; i++)
		fprintf(o, " %s", moe_format_name(cat->formats[i]));
	fprintf(o, "\n");
	if (cat->quant.kind != MOE_QUANT_NONE) {
		char q[96];
		fprintf(o, "checkpoint      %s (repacked to %s at load)\n",
		        moe_quant_config_describe(&cat->quant, q, sizeof(q)),
		        cat->quant.kind == MOE_QUANT_NVFP4 ? "NVFP4 blocks" : "INT4_G32");
	}
	if (ex) {
		fprintf(o, "per expert      ");
		print_bytes(o, ex->bytes);
		fprintf(o, ":");
		for (int p = 0; p < MOE_PROJ_COUNT; p++)
			if (ex->proj[p].present)
				fprintf(o, " %s %s %" PRIu64 "x%" PRIu64,
				        moe_proj_name((enum moe_proj)p),
				        moe_format_name(ex->proj[p].format), ex->proj[p].rows,
				        ex->proj[p].cols);
		fprintf(o, "%s\n", formats_vary(cat) ? " (first MoE layer)" : "");
	}
	if (formats_vary(cat)) {
		fprintf(o, "per layer      ");
		for (int p = 0, k = 0; p < MOE_PROJ_COUNT; p++) {
			struct proj_formats pf;
			proj_formats(cat, p, &pf);
			if (!pf.n)
				continue;
			fprintf(o, "%s %s", k++ ? ";" : "", moe_proj_name((enum moe_proj)p));
			for (uint32_t i = 0; i < pf.n; i++)
				fprintf(o, "%s %s in %u layers", i ? "," : "",
				        moe_format_name(pf.format[i]), pf.layers[i]);
		}
		fprintf(o, "\n");
	}
	fprintf(o, "all experts     ");
	print_bytes(o, cat->expert_bytes_total);
	fprintf(o, " in %" PRIu64 " experts\n", (uint64_t)in->n_moe_layers * in->n_experts);
	fprintf(o, "4 KiB aligned   %" PRIu64 " of %" PRIu64 " expert slabs%s\n",
	        cat->n_experts_aligned_4k, (uint64_t)in->n_moe_layers * in->n_experts,
	        cat->n_experts_aligned_4k ? "" : " (the loader reads aligned supersets)");
	fprintf(o, "files           %u\n", cat->n_files);
	for (uint32_t i = 0; i < cat->n_files; i++) {
		fprintf(o, "  %s  ", cat->files[i].path);
		print_bytes(o, cat->files[i].size);
		fprintf(o, "\n");
	}
}

int cmd_inspect(int argc, char **argv)
{
	const char *model = NULL;
	int json = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: moe-sidecar inspect MODEL [--json]\n"
			       "  MODEL: a .gguf file (first split), a .safetensors file, or a "
			       "directory with config.json\n");
			return 0;
		} else if (argv[i][0] == '-' || model) {
			fprintf(stderr, "moe-sidecar inspect: unexpected argument '%s'\n", argv[i]);
			return 2;
		} else {
			model = argv[i];
		}
	}
	if (!model) {
		fprintf(stderr, "usage: moe-sidecar inspect MODEL [--json]\n");
		return 2;
	}
	struct sidecar_error err;
	struct moe_catalog *cat;
	if (moe_catalog_open(model, &cat, &err)) {
		fprintf(stderr, "moe-sidecar inspect: %s\n", err.msg);
		return 1;
	}
	int rc = 0;
	if (json)
		rc = print_json(stdout, cat);
	else
		print_text(stdout, cat);
	moe_catalog_close(cat);
	if (rc != 0) {
		fprintf(stderr, "moe-sidecar inspect: writing the JSON: %s\n", strerror(-rc));
		return 1;
	}
	return fflush(stdout) ? 1 : 0;
}
