/* test_roundtrip.c — generator → catalog round trips: for every preset × format × container
 * (merged and per-expert, sharded and not), the catalog's extents are read back, dequantized
 * with the kernels' reference dequantizer and compared with the floats the generator
 * regenerates for (seed, layer, expert, projection). A wrong offset, a swapped projection,
 * a wrong nibble order or a wrong gate/up interleave shows up as a large error. */
#include <inttypes.h>
#include <math.h>

#include "model_files.h"
#include "moe_gen.h"
#include "moe_kernels.h"

#define SEED 20260521u

/* Normalised MSE within which each format must reproduce uniform random weights.
 * Measured at 256x256: F16 3.4e-8, BF16 2.2e-6, Q8_0 1.4e-5, Q6_K 1.8e-4, Q5_K 7.6e-4,
 * Q4_K 3.0e-3, Q4_0 4.2e-3, IQ4_NL 4.0e-3, IQ4_XS 4.1e-3, MXFP4 1.0e-2..2.1e-2, FP8 6.5e-4,
 * Q3_K 1.6e-2, Q2_K 5.5e-2;
 * bounds leave 2-5x. */
static double tolerance(uint32_t format)
{
	switch (format) {
	case MOEK_F32: return 1e-14;
	case MOEK_F16: return 2e-7;
	case MOEK_BF16: return 1e-5;
	case MOEK_Q8_0: return 5e-5;
	case MOEK_Q6_K: return 5e-4;
	case MOEK_Q5_K: return 2e-3;
	case MOEK_Q4_K: return 8e-3;
	case MOEK_Q4_0: return 1e-2;
	case MOEK_MXFP4: return 4e-2;
	case MOEK_Q3_K: return 4e-2;
	case MOEK_Q2_K: return 0.12;
	case MOEK_IQ2_XXS: return 0.13; /* measured 0.107 */
	case MOEK_IQ2_XS: return 0.11;
	case MOEK_IQ3_XXS: return 0.05; /* measured 0.034 */
	case MOEK_IQ3_S: return 0.03;   /* measured 0.015 */
	case MOEK_IQ1_S: return 0.2;    /* measured 0.141 */
	case MOEK_IQ1_M: return 0.2;
	case MOEK_IQ2_S: return 0.08; /* measured 0.05 */
	case MOEK_FP8_E4M3_B128: return 2e-3;
	case MOEK_IQ4_NL:
	case MOEK_IQ4_XS: return 1e-2;
	}
	return 0;
}

static double nmse(const float *got, const float *want, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double d = (double)got[i] - want[i];
		num += d * d;
		den += (double)want[i] * want[i];
	}
	return den > 0 ? num / den : num;
}

/* The generator's floats for row-major matrix `p` of expert e (gate_up interleaved or as
 * halves is reassembled from gate and up). */
static void expected_matrix(const struct moe_proj_ref *pr, enum moe_proj p, uint32_t L, uint32_t e,
                            float *out)
{
	const uint64_t rows = pr->rows, cols = pr->cols;
	if (p != MOE_PROJ_GATE_UP) {
		enum moe_gen_tensor w = p == MOE_PROJ_GATE ? MOE_GEN_GATE
		                        : p == MOE_PROJ_UP ? MOE_GEN_UP
		                                           : MOE_GEN_DOWN;
		moe_gen_floats(SEED, L, e, w, cols, 0, rows * cols, out);
		return;
	}
	for (uint64_t r = 0; r < rows; r++) {
		bool up = pr->order == MOE_GATE_UP_INTERLEAVED ? r % 2 : r >= rows / 2;
		uint64_t src = pr->order == MOE_GATE_UP_INTERLEAVED ? r / 2 : r % (rows / 2);
		moe_gen_floats(SEED, L, e, up ? MOE_GEN_UP : MOE_GEN_GATE, cols, src * cols, cols,
		               out + r * cols);
	}
}

static void expected_bias(const struct moe_proj_ref *pr, enum moe_proj p, uint32_t L, uint32_t e,
                          float *out)
{
	for (uint64_t r = 0; r < pr->rows; r++) {
		enum moe_gen_tensor w = p == MOE_PROJ_DOWN ? MOE_GEN_DOWN_BIAS
		                        : p == MOE_PROJ_UP ? MOE_GEN_UP_BIAS
		                                           : MOE_GEN_GATE_BIAS;
		uint64_t src = r;
		if (p == MOE_PROJ_GATE_UP) {
			bool inter = pr->order == MOE_GATE_UP_INTERLEAVED;
			bool up = inter ? r % 2 : r >= pr->rows / 2;
			w = up ? MOE_GEN_UP_BIAS : MOE_GEN_GATE_BIAS;
			src = inter ? r / 2 : r % (pr->rows / 2);
		}
		moe_gen_floats(SEED, L, e, w, 1, src, 1, out + r);
	}
}

/* Dequantizes the weights of one projection into out (rows x cols floats). */
static void load_matrix(const struct moe_catalog *cat, const struct moe_proj_ref *pr, float *out)
{
	void *data = read_extent(cat, &pr->data);
	void *scales = pr->scale.length ? read_extent(cat, &pr->scale) : NULL;
	const size_t n = pr->rows * pr->cols;
	if (pr->layout == MOE_LAYOUT_MXFP4_HF) {
		cr_assert_eq(pr->data.length, n / 2);
		cr_assert_eq(pr->scale.length, n / 32);
		void *gguf = malloc(moek_row_bytes(MOEK_MXFP4, n));
		moek_mxfp4_from_hf(data, scales, n, gguf);
		cr_assert_eq(moek_dequantize(MOEK_MXFP4, gguf, NULL, pr->rows, pr->cols, out), 0);
		free(gguf);
	} else if (pr->layout == MOE_LAYOUT_TRANSPOSED) { /* Llama-4: [cols][rows] on disk */
		const size_t es = pr->format == MOEK_F32 ? 4 : 2;
		cr_assert_eq(pr->data.length, n * es);
		uint8_t *rows = malloc(pr->data.length);
		for (uint64_t c = 0; c < pr->cols; c++)
			for (uint64_t r = 0; r < pr->rows; r++)
				memcpy(rows + (r * pr->cols + c) * es,
				       (uint8_t *)data + (c * pr->rows + r) * es, es);
		cr_assert_eq(moek_dequantize(pr->format, rows, NULL, pr->rows, pr->cols, out), 0);
		free(rows);
	} else {
		cr_assert_eq(pr->data.length, pr->rows * moek_row_bytes(pr->format, pr->cols));
		cr_assert_eq(moek_dequantize(pr->format, data,
		                             pr->format == MOEK_FP8_E4M3_B128 ? scales : NULL,
		                             pr->rows, pr->cols, out),
		             0);
	}
	free(data);
	free(scales);
}

struct case_spec {
	const char *preset;
	uint32_t format;
	bool gguf;
	uint32_t shards;
	bool per_expert;
	uint32_t experts, layers;
	uint64_t hidden, ffn;
	bool fused;
	enum moe_gen_mix mix; /* instead of format */
};

static void check_model(const struct case_spec *c)
{
	char *dir = scratch_dir();
	char out[512];
	snprintf(out, sizeof(out), c->gguf ? "%s/model.gguf" : "%s/hf", dir);
	struct moe_gen_options o = {.preset = c->preset,
	                            .out = out,
	                            .format = c->format,
	                            .seed = SEED,
	                            .layers = c->layers,
	                            .hidden = c->hidden,
	                            .ffn = c->ffn,
	                            .experts = c->experts,
	                            .shards = c->shards,
	                            .per_expert = c->per_expert,
	                            .mix = c->mix};
	struct sidecar_error err;
	cr_assert_eq(moe_gen_write(&o, &err), 0, "%s %s: moe_gen_write: %s", c->preset,
	             moe_format_name(c->format), err.msg);
	char open_path[600];
	if (c->gguf && c->shards > 1)
		snprintf(open_path, sizeof(open_path), "%s/model-00001-of-%05u.gguf", dir,
		         c->shards);
	else
		snprintf(open_path, sizeof(open_path), "%s", out);
	struct moe_catalog *cat;
	cr_assert_eq(moe_catalog_open(open_path, &cat, &err), 0, "%s %s: catalog: %s", c->preset,
	             moe_format_name(c->format), err.msg);
	const struct moe_model_preset *p = moe_model_preset_find(c->preset);
	const struct moe_model_hparams *in = &cat->info;
	cr_assert_eq(in->arch, p->arch);
	cr_assert_eq(in->n_layers, c->layers);
	uint32_t dense = p->leading_dense < c->layers ? p->leading_dense : c->layers - 1;
	const uint32_t step = p->moe_step ? p->moe_step : 1;
	uint32_t n_moe = 0;
	for (uint32_t L = dense; L < c->layers; L++)
		n_moe += (L + 1) % step == 0;
	cr_assert_eq(in->n_moe_layers, n_moe);
	cr_assert_eq(in->n_experts, c->experts);
	cr_assert_eq(in->top_k, p->top_k < c->experts ? p->top_k : c->experts);
	cr_assert_eq(in->hidden, c->hidden);
	cr_assert_eq(in->expert_ffn, c->ffn);
	cr_assert_eq(cat->n_files, c->shards > 1 ? c->shards : 1);
	if (!c->mix) {
		cr_assert_eq(cat->n_formats, 1);
		cr_assert_eq(cat->formats[0], c->format);
	}
	cr_assert_eq(in->has_bias, p->arch == MOE_ARCH_GPT_OSS);
	if (p->arch == MOE_ARCH_DEEPSEEK) {
		cr_assert_eq(in->gating, MOE_GATING_SIGMOID);
		cr_assert_float_eq(in->routed_scaling, 2.5f, 1e-6);
		cr_assert_eq(in->n_shared_experts, 1);
	}
	if (p->arch == MOE_ARCH_GPT_OSS)
		cr_assert_float_eq(in->swiglu_limit, 7.0f, 1e-6);
	/* the families' routing facts, read back from either container */
	cr_assert_eq(in->n_shared_experts, p->n_shared, "%s shared", p->name);
	cr_assert_eq(in->moe_layer_step, step);
	cr_assert_eq(in->weight_on_input, p->arch == MOE_ARCH_LLAMA4);
	cr_assert_eq(in->shared_expert_gate, p->arch == MOE_ARCH_QWEN3NEXT);
	if (p->arch == MOE_ARCH_GLM4MOE || p->arch == MOE_ARCH_MINIMAX_M2 ||
	    p->arch == MOE_ARCH_LLAMA4) {
		cr_assert_eq(in->gating, MOE_GATING_SIGMOID, "%s gating", p->name);
		cr_assert_eq(in->score_bias, p->arch != MOE_ARCH_LLAMA4, "%s score bias", p->name);
	}
	if (p->arch == MOE_ARCH_GLM4MOE)
		cr_assert_float_eq(in->routed_scaling, 2.5f, 1e-6);
	if (p->arch == MOE_ARCH_QWEN3NEXT || p->arch == MOE_ARCH_GLM4MOE)
		cr_assert(in->norm_topk_prob);

	const size_t max_n = 2 * c->hidden * c->ffn;
	float *got = malloc(max_n * sizeof(float)), *want = malloc(max_n * sizeof(float));
	uint64_t total = 0;
	for (uint32_t L = 0; L < in->n_layers; L++) {
		cr_assert_eq(cat->layers[L].moe, L >= dense && (L + 1) % step == 0, "layer %u", L);
		if (!cat->layers[L].moe) {
			cr_assert_null(moe_catalog_expert(cat, L, 0));
			continue;
		}
		for (uint32_t e = 0; e < in->n_experts; e++) {
			const struct moe_expert *ex = moe_catalog_expert(cat, L, e);
			cr_assert_not_null(ex);
			uint64_t bytes = 0;
			for (int pj = 0; pj < MOE_PROJ_COUNT; pj++) {
				const struct moe_proj_ref *pr = &ex->proj[pj];
				if (!pr->present)
					continue;
				size_t n = pr->rows * pr->cols;
				static const enum moe_gen_tensor mats[] = {
				    [MOE_PROJ_GATE] = MOE_GEN_GATE,
				    [MOE_PROJ_UP] = MOE_GEN_UP,
				    [MOE_PROJ_DOWN] = MOE_GEN_DOWN};
				if (c->mix)
					cr_assert_eq(
					    pr->format,
					    moe_gen_mix_format(c->mix, mats[pj], L, c->layers),
					    "%s L%u %s: %s", moe_gen_mix_name(c->mix), L,
					    moe_proj_name((enum moe_proj)pj),
					    moe_format_name(pr->format));
				load_matrix(cat, pr, got);
				expected_matrix(pr, (enum moe_proj)pj, L, e, want);
				double err_right = nmse(got, want, n);
				cr_assert_leq(err_right, tolerance(pr->format),
				              "%s %s L%u e%u %s: nmse %g", c->preset,
				              moe_format_name(pr->format), L, e,
				              moe_proj_name((enum moe_proj)pj), err_right);
				/* the same comparison against the neighbouring expert must fail */
				if (in->n_experts > 1 && e < 2) {
					expected_matrix(pr, (enum moe_proj)pj, L, e ^ 1, want);
					cr_assert_gt(nmse(got, want, n), 0.5,
					             "expert %u looks like %u", e, e ^ 1);
				}
				if (pr->bias.length) {
					uint16_t *raw = read_extent(cat, &pr->bias);
					expected_bias(pr, (enum moe_proj)pj, L, e, want);
					for (uint64_t r = 0; r < pr->rows; r++) {
						float v = pr->bias_format == MOEK_F32
						              ? ((float *)(void *)raw)[r]
						              : moek_bf16_to_f32(raw[r]);
						cr_assert_float_eq(v, want[r], 1e-3,
						                   "bias row %" PRIu64, r);
					}
					free(raw);
				}
				bytes += pr->data.length + pr->scale.length + pr->bias.length;
			}
			cr_assert_eq(ex->bytes, bytes);
			total += bytes;
		}
	}
	cr_assert_eq(cat->expert_bytes_total, total);
	free(got);
	free(want);
	moe_catalog_close(cat);
	remove_tree(dir);
}

static const char *const presets[] = {"qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "olmoe"};
static const uint32_t gguf_formats[] = {MOEK_F32,   MOEK_F16,    MOEK_BF16,  MOEK_Q8_0, MOEK_Q4_0,
                                        MOEK_Q4_K,  MOEK_Q5_K,   MOEK_Q6_K,  MOEK_Q2_K, MOEK_Q3_K,
                                        MOEK_MXFP4, MOEK_IQ4_NL, MOEK_IQ4_XS};
static const uint32_t st_formats[] = {MOEK_F32, MOEK_F16, MOEK_BF16, MOEK_FP8_E4M3_B128};

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* Under the sanitizers (far slower) a preset x format matrix shrinks to its diagonal: format
 * f with preset f % presets only, so every preset and every format still round-trips (the
 * readers take presets and formats apart from each other), in fewer pairs. */
#ifdef MOE_SANITIZED
#define SANITIZED true
#else
#define SANITIZED false
#endif

static bool pair_runs(size_t preset, size_t format)
{
	return !SANITIZED || format % N(presets) == preset;
}

Test(roundtrip, gguf_merged_every_preset_and_format)
{
	for (size_t i = 0; i < N(presets); i++)
		for (size_t f = 0; f < N(gguf_formats); f++)
			if (pair_runs(i, f))
				check_model(&(struct case_spec){presets[i], gguf_formats[f], true,
				                                1, false, 4, 4, 256, 512});
}

Test(roundtrip, gguf_per_expert_and_split)
{
	for (size_t i = 0; i < N(presets); i++) {
		check_model(
		    &(struct case_spec){presets[i], MOEK_Q4_K, true, 1, true, 4, 2, 256, 256});
		check_model(
		    &(struct case_spec){presets[i], MOEK_Q8_0, true, 3, false, 4, 4, 256, 256});
		check_model(
		    &(struct case_spec){presets[i], MOEK_Q6_K, true, 2, true, 4, 2, 256, 256});
	}
}

Test(roundtrip, gpt_oss_gguf_every_format_with_biases)
{
	for (size_t f = 0; f < N(gguf_formats); f++)
		check_model(&(struct case_spec){"gpt-oss-20b", gguf_formats[f], true, 1, false, 4,
		                                2, 256, 256});
	check_model(&(struct case_spec){"gpt-oss-20b", MOEK_MXFP4, true, 2, true, 4, 2, 64, 96});
}

Test(roundtrip, safetensors_every_preset_and_format)
{
	for (size_t i = 0; i < N(presets); i++)
		for (size_t f = 0; f < N(st_formats); f++)
			if (pair_runs(i, f))
				check_model(&(struct case_spec){presets[i], st_formats[f], false, 1,
				                                false, 4, 4, 256, 384});
}

Test(roundtrip, safetensors_sharded_with_index)
{
	for (size_t i = 0; i < N(presets); i++)
		check_model(
		    &(struct case_spec){presets[i], MOEK_BF16, false, 3, false, 4, 4, 128, 256});
	check_model(&(struct case_spec){"deepseek-v3", MOEK_FP8_E4M3_B128, false, 4, false, 4, 5,
	                                200, 136}); /* partial 128x128 scale blocks */
}

Test(roundtrip, gpt_oss_safetensors_mxfp4_interleaved)
{
	check_model(
	    &(struct case_spec){"gpt-oss-20b", MOEK_MXFP4, false, 1, false, 4, 2, 256, 256});
	check_model(&(struct case_spec){"gpt-oss-20b", MOEK_MXFP4, false, 3, false, 4, 3, 96, 160});
}

Test(roundtrip, real_expert_counts)
{
	/* the presets' own expert counts (128, 8, 256, 32, 64) with small dims */
	for (const struct moe_model_preset *p = moe_model_presets; p->name; p++)
		check_model(&(struct case_spec){
		    p->name, p->arch == MOE_ARCH_GPT_OSS ? MOEK_MXFP4 : MOEK_Q4_0, true, 1, false,
		    p->n_experts, p->leading_dense + (p->moe_step ? p->moe_step : 1), 64, 32});
}

Test(roundtrip, gguf_fused_gate_up_halves)
{
	check_model(
	    &(struct case_spec){"qwen3-30b-a3b", MOEK_Q4_K, true, 1, false, 4, 2, 256, 256, true});
	check_model(
	    &(struct case_spec){"gpt-oss-20b", MOEK_MXFP4, true, 2, false, 4, 2, 64, 96, true});
}

Test(generator, floats_are_a_pure_function_of_the_index)
{
	float whole[64], part[64], other[64];
	moe_gen_floats(SEED, 3, 5, MOE_GEN_UP, 64, 0, 64, whole);
	for (uint64_t first = 0; first < 8; first++) {
		moe_gen_floats(SEED, 3, 5, MOE_GEN_UP, 64, first, 64 - first, part);
		cr_assert_arr_eq(part, whole + first, (64 - first) * sizeof(float),
		                 "slice from %" PRIu64 " differs", first);
	}
	double sq = 0;
	for (int i = 0; i < 64; i++) {
		cr_assert(whole[i] >= -0.125f && whole[i] < 0.125f, "out of range: %g", whole[i]);
		sq += whole[i] * whole[i];
	}
	cr_assert_gt(sq, 64 * 0.125 * 0.125 / 3 * 0.5, "values are not spread over the range");
	moe_gen_floats(SEED + 1, 3, 5, MOE_GEN_UP, 64, 0, 64, other);
	cr_assert_gt(nmse(other, whole, 64), 0.5, "the seed does not change the weights");
	moe_gen_floats(SEED, 3, 5, MOE_GEN_GATE, 64, 0, 64, other);
	cr_assert_gt(nmse(other, whole, 64), 0.5, "gate and up are the same");
}

/* llama.cpp's rule on a 48-block model (Qwen3-30B-A3B): Q4_K_M's down is Q6_K in the first
 * and last sixth blocks (n/8 = 6) and every third block from 8 to 41; Q3_K_M's down is Q5_K
 * in the first n/16 = 3 blocks, Q4_K after; Q2_K's down is Q3_K. gate and up never differ. */
Test(generator, mix_rule_is_llama_cpps)
{
	uint32_t q6 = 0;
	for (uint32_t L = 0; L < 48; L++) {
		bool more = L < 6 || L >= 42 || (L >= 6 && (L - 6) % 3 == 2);
		cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_Q4_K_M, MOE_GEN_DOWN, L, 48),
		             more ? MOEK_Q6_K : MOEK_Q4_K, "Q4_K_M block %u", L);
		q6 += more;
		cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_Q3_K_M, MOE_GEN_DOWN, L, 48),
		             L < 3 ? MOEK_Q5_K : MOEK_Q4_K, "Q3_K_M block %u", L);
		cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_Q2_K, MOE_GEN_DOWN, L, 48), MOEK_Q3_K);
		for (enum moe_gen_tensor w = MOE_GEN_GATE; w <= MOE_GEN_UP; w++) {
			cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_Q4_K_M, w, L, 48), MOEK_Q4_K);
			cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_Q3_K_M, w, L, 48), MOEK_Q3_K);
			cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_Q2_K, w, L, 48), MOEK_Q2_K);
		}
	}
	cr_assert_eq(q6, 24);
	cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_Q4_K_M, MOE_GEN_DOWN, 8, 48), MOEK_Q6_K);
	cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_Q4_K_M, MOE_GEN_DOWN, 9, 48), MOEK_Q4_K);
	enum moe_gen_mix m;
	cr_assert_eq(moe_gen_mix_parse("q4_k_m", &m), 0);
	cr_assert_eq(m, MOE_GEN_MIX_Q4_K_M);
	cr_assert_eq(moe_gen_mix_parse("Q2_K", &m), 0);
	cr_assert_eq(m, MOE_GEN_MIX_Q2_K);
	cr_assert_eq(moe_gen_mix_parse("q4_k_s", &m), -1);
	cr_assert_eq(moe_gen_mix_file_type(MOE_GEN_MIX_Q4_K_M), 15);
	/* the i-quant mixes: downs of blocks below n/8 (6) in Q2_K, the rest in the i-quant */
	for (uint32_t L = 0; L < 48; L++)
		for (enum moe_gen_tensor w = MOE_GEN_GATE; w <= MOE_GEN_DOWN; w++) {
			const bool q2 = w == MOE_GEN_DOWN && L < 6;
			cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ2_XXS, w, L, 48),
			             q2 ? MOEK_Q2_K : MOEK_IQ2_XXS, "IQ2_XXS block %u", L);
			cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ2_XS, w, L, 48),
			             q2 ? MOEK_Q2_K : MOEK_IQ2_XS, "IQ2_XS block %u", L);
		}
	cr_assert_eq(moe_gen_mix_parse("iq2_xxs", &m), 0);
	cr_assert_eq(m, MOE_GEN_MIX_IQ2_XXS);
	cr_assert_eq(moe_gen_mix_file_type(MOE_GEN_MIX_IQ2_XXS), 19);
	cr_assert_eq(moe_gen_mix_file_type(MOE_GEN_MIX_IQ2_XS), 20);
	/* IQ3_XXS (no importance matrix): gate/up IQ3_XXS, down Q4_K below n/8, else Q3_K */
	for (uint32_t L = 0; L < 48; L++) {
		cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ3_XXS, MOE_GEN_DOWN, L, 48),
		             L < 6 ? MOEK_Q4_K : MOEK_Q3_K, "IQ3_XXS block %u", L);
		cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ3_XXS, MOE_GEN_UP, L, 48),
		             MOEK_IQ3_XXS);
	}
	cr_assert_eq(moe_gen_mix_file_type(MOE_GEN_MIX_IQ3_XXS), 23);
	for (uint32_t L = 0; L < 48; L++) {
		cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ1_S, MOE_GEN_DOWN, L, 48),
		             L < 6 ? MOEK_Q2_K : MOEK_IQ1_S, "IQ1_S block %u", L);
		cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ1_S, MOE_GEN_GATE, L, 48),
		             MOEK_IQ1_S);
	}
	cr_assert_eq(moe_gen_mix_file_type(MOE_GEN_MIX_IQ1_S), 24);
	cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ1_M, MOE_GEN_DOWN, 5, 48), MOEK_Q2_K);
	cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ1_M, MOE_GEN_DOWN, 6, 48), MOEK_IQ1_M);
	cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ1_M, MOE_GEN_UP, 0, 48), MOEK_IQ1_M);
	cr_assert_eq(moe_gen_mix_file_type(MOE_GEN_MIX_IQ1_M), 31);
	/* IQ2_S: IQ2_XS experts, IQ2_M: IQ2_S; both put the downs below n/8 in IQ3_S */
	cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ2_S, MOE_GEN_DOWN, 5, 48), MOEK_IQ3_S);
	cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ2_S, MOE_GEN_DOWN, 6, 48), MOEK_IQ2_XS);
	cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ2_S, MOE_GEN_GATE, 0, 48), MOEK_IQ2_XS);
	cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ2_M, MOE_GEN_DOWN, 5, 48), MOEK_IQ3_S);
	cr_assert_eq(moe_gen_mix_format(MOE_GEN_MIX_IQ2_M, MOE_GEN_UP, 0, 48), MOEK_IQ2_S);
	cr_assert_eq(moe_gen_mix_parse("iq2_m", &m), 0);
	cr_assert_eq(m, MOE_GEN_MIX_IQ2_M);
	cr_assert_eq(moe_gen_mix_file_type(MOE_GEN_MIX_IQ2_S), 28);
	cr_assert_eq(moe_gen_mix_file_type(MOE_GEN_MIX_IQ2_M), 29);
}

/* Every mix written, read back tensor by tensor: each projection of each block in the
 * rule's format, dequantizing to the generator's floats (merged and per-expert tensors, a
 * model with leading dense blocks, 17 blocks so that every branch of the rules is taken). */
/* Of the i-quant mixes, three that between them write every branch of the i-quant rule and
 * the IQ1 / IQ2 / IQ3 codecs (IQ1_M's spread d too); the i-quant quantizers are slow enough
 * that all seven would triple this test (the rule of each is pinned above, and every format is
 * served alone in test_forward, three of the mixes too). */
static const enum moe_gen_mix mixes[] = {MOE_GEN_MIX_Q4_K_M, MOE_GEN_MIX_Q3_K_M,
                                         MOE_GEN_MIX_Q2_K,   MOE_GEN_MIX_IQ2_XXS,
                                         MOE_GEN_MIX_IQ1_M,  MOE_GEN_MIX_IQ2_M};

Test(roundtrip, gguf_k_quant_mixes)
{
	for (size_t m = 0; m < N(mixes); m++)
		for (int per_expert = 0; per_expert < 2; per_expert++) {
			/* under the sanitizers each mix in one container, the two alternating */
			if (SANITIZED && per_expert != (int)(m % 2))
				continue;
			const char *preset = per_expert ? "deepseek-v3" : "qwen3-30b-a3b";
			/* under the sanitizers the i-quant mixes in 9 blocks, still both sides of
			 * their first-eighth rule: their reference quantizers' searches are most
			 * of this test's time there */
			const bool iquant = mixes[m] != MOE_GEN_MIX_Q4_K_M &&
			                    mixes[m] != MOE_GEN_MIX_Q3_K_M &&
			                    mixes[m] != MOE_GEN_MIX_Q2_K;
			struct case_spec c = {.preset = preset,
			                      .gguf = true,
			                      .shards = 1,
			                      .per_expert = per_expert,
			                      .experts = 2,
			                      .layers = SANITIZED && iquant ? 9 : 17,
			                      .hidden = 256,
			                      .ffn = 256,
			                      .mix = mixes[m]};
			check_model(&c);
		}
}

/* A mix is GGUF-only and needs K-quant blocks. */
Test(generator, mix_refusals)
{
	char *dir = scratch_dir();
	char out[512];
	struct sidecar_error err;
	snprintf(out, sizeof(out), "%s/hf", dir);
	struct moe_gen_options o = {.preset = "qwen3-30b-a3b",
	                            .out = out,
	                            .seed = 1,
	                            .hidden = 256,
	                            .ffn = 256,
	                            .experts = 2,
	                            .mix = MOE_GEN_MIX_Q4_K_M};
	cr_assert_eq(moe_gen_write(&o, &err), -1);
	cr_assert_not_null(strstr(err.msg, "Q4_K_M mix is a GGUF mix"), "%s", err.msg);
	snprintf(out, sizeof(out), "%s/m.gguf", dir);
	o.ffn = 160;
	cr_assert_eq(moe_gen_write(&o, &err), -1);
	cr_assert_not_null(strstr(err.msg, "multiples of the Q4_K block (256)"), "%s", err.msg);
	remove_tree(dir);
}

/* GLM-4.5 (dense first blocks, shared expert), MiniMax-M2 (Mixtral names), Llama-4 (MoE every
 * other block; fused input-major experts in safetensors) and Qwen3-Next: GGUF merged and
 * per-expert, safetensors in every float format the family's checkpoints hold. */
static const char *const new_families[] = {"glm-4.5",      "glm-4.5-air",     "minimax-m2",
                                           "llama4-scout", "llama4-maverick", "qwen3-next-80b-a3b"};

Test(roundtrip, new_families_gguf)
{
	for (size_t i = 0; i < N(new_families); i++) {
		check_model(&(struct case_spec){new_families[i], MOEK_Q4_K, true, 1, false, 4, 5,
		                                256, 256});
		check_model(
		    &(struct case_spec){new_families[i], MOEK_Q8_0, true, 2, true, 4, 4, 64, 96});
	}
}

Test(roundtrip, new_families_safetensors)
{
	static const uint32_t fmts[] = {MOEK_F32, MOEK_BF16, MOEK_F16};
	for (size_t i = 0; i < N(new_families); i++)
		for (size_t f = 0; f < N(fmts); f++)
			check_model(&(struct case_spec){new_families[i], fmts[f], false,
			                                f == 1 ? 2 : 1, false, 4, 5, 128, 192});
	/* MiniMax-M2 ships FP8 with 128x128 block scales */
	check_model(
	    &(struct case_spec){"minimax-m2", MOEK_FP8_E4M3_B128, false, 1, false, 4, 3, 256, 256});
}
