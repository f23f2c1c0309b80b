/* test_ffn.c — expert FFN accuracy for every weight format, decode and prefill shapes:
 *   scalar reference vs a double-precision FFN over the same (dequantized) weights: exact up to
 *     f32 rounding — the oracle itself is right;
 *   AVX2 (and AVX-512, AMX where the CPU has them) vs scalar reference: normalised MSE within
 *     ggml's 5e-4 for integer dot products over quantized activations (float formats: f32
 *     rounding only; from 16 tokens on AVX-512, bf16 tiles: bf16 rounding of activations
 *     and weights, 2^-9 relative per operand);
 *   both vs the float originals: mean|out - ref| / mean|ref| within the format's bound
 *     (kt-kernel's ≈0.02 BF16, 0.05 INT8, 0.35 INT4 and tighter where the format allows).
 * Plus the API contract: validation messages, activation dtypes, token ids and strides.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "expert_fixture.h"
#include "kernels_internal.h"

struct fmt_case {
	uint32_t format, down_format;
	size_t hidden, ffn;
	enum moek_activation act;
	int bias;
	double max_rel_orig; /* mean relative abs error vs float originals */
	double max_nmse_opt; /* AVX2 vs scalar reference */
};

static bool have_avx2(void)
{
	return moek_isa_supported(MOEK_ISA_AVX2);
}

static void check_case(const struct fmt_case *fc)
{
	static const size_t token_counts[] = {1, 5, 16, 40};
	struct fixture f;
	fixture_init(&f, fc->format, fc->down_format, fc->hidden, fc->ffn, fc->act, fc->bias,
	             fc->format + 7);
	const char *name = moek_format_lookup(fc->format)->name;
	for (size_t i = 0; i < sizeof(token_counts) / sizeof(token_counts[0]); i++) {
		const size_t n = token_counts[i], m = n * fc->hidden;
		float *x = fixture_tokens(n, fc->hidden, (uint32_t)n);
		float *w = malloc(n * sizeof(float));
		double *want_deq = calloc(m, sizeof(double)),
		       *want_orig = calloc(m, sizeof(double));
		cr_assert(w && want_deq && want_orig);
		for (size_t t = 0; t < n; t++)
			w[t] = 0.25f + 0.5f * (float)t / (float)n;
		fixture_oracle(&f, 0, x, n, w, want_deq);
		fixture_oracle(&f, 1, x, n, w, want_orig);

		cr_assert_eq(moek_set_isa(MOEK_ISA_SCALAR), 0);
		float *ref = fixture_run(&f, x, n, w);
		const double ref_exact = nmse(ref, want_deq, m);
		const double ref_rel = mean_rel_abs(ref, want_orig, m);
		cr_expect(ref_exact < 1e-10, "%s n=%zu: scalar vs double oracle nmse %.3g", name, n,
		          ref_exact);
		cr_expect(ref_rel < fc->max_rel_orig, "%s n=%zu: scalar vs originals %.4f > %.4f",
		          name, n, ref_rel, fc->max_rel_orig);

		static const enum moek_isa isas[] = {MOEK_ISA_AVX2, MOEK_ISA_AVX512, MOEK_ISA_AMX};
		for (size_t ii = 0; ii < sizeof(isas) / sizeof(isas[0]); ii++) {
			if (moek_set_isa(isas[ii]) != 0)
				continue;
			const char *isa = moek_isa_name();
			float *opt = fixture_run(&f, x, n, w);
			const double opt_nmse = nmse_f(opt, ref, m);
			const double opt_rel = mean_rel_abs(opt, want_orig, m);
			cr_expect(opt_nmse < fc->max_nmse_opt, "%s n=%zu: %s vs scalar nmse %.3g",
			          name, n, isa, opt_nmse);
			cr_expect(opt_rel < fc->max_rel_orig,
			          "%s n=%zu: %s vs originals %.4f > %.4f", name, n, isa, opt_rel,
			          fc->max_rel_orig);
			cr_log_info("%-14s n=%-3zu scalar-vs-oracle %.2g  rel(orig) scalar %.4f "
			            "%s %.4f  nmse(%s, scalar) %.2g",
			            name, n, ref_exact, ref_rel, isa, opt_rel, isa, opt_nmse);
			free(opt);
		}
		moek_set_isa(MOEK_ISA_AUTO);
		free(ref);
		free(x);
		free(w);
		free(want_deq);
		free(want_orig);
	}
	fixture_free(&f);
}

/* Shapes are small but not round: partial FP8 blocks, K-chunk remainders (320 = 256 + 64),
 * ffn not a multiple of the prefill tile, prefill with 40 tokens (>= 16). */
#define FMT_TEST(tname, ...)                                                                       \
	Test(ffn_accuracy, tname)                                                                  \
	{                                                                                          \
		const struct fmt_case fc = __VA_ARGS__;                                            \
		check_case(&fc);                                                                   \
	}

FMT_TEST(f32, {MOEK_F32, 0, 320, 200, MOEK_SWIGLU, 0, 1e-5, 1e-10})
/* F16/BF16 weights: the AVX2 decode path rounds activations to bf16 once (2^-9 relative) */
FMT_TEST(f16, {MOEK_F16, 0, 320, 200, MOEK_SWIGLU, 0, 6e-3, 3e-5})
FMT_TEST(bf16, {MOEK_BF16, 0, 320, 200, MOEK_SWIGLU, 0, 0.02, 1e-5})
FMT_TEST(q8_0, {MOEK_Q8_0, 0, 320, 224, MOEK_SWIGLU, 0, 0.03, 5e-4})
FMT_TEST(q4_0, {MOEK_Q4_0, 0, 320, 224, MOEK_SWIGLU, 0, 0.2, 5e-4})
FMT_TEST(int4_g32, {MOEK_INT4_G32, 0, 320, 224, MOEK_SWIGLU, 0, 0.2, 5e-4})
FMT_TEST(int4_g32_with_q8_0_down, {MOEK_INT4_G32, MOEK_Q8_0, 320, 256, MOEK_SWIGLU, 0, 0.2, 5e-4})
/* K-quants: two Q8_K activation quantizations in sequence (x, then the heavy-tailed SwiGLU h
 * in 256-element blocks) stack up to ~2x the single-product budget; the single products are
 * held to ggml's 5e-4 in ffn_dot below. */
FMT_TEST(q4_K, {MOEK_Q4_K, 0, 512, 256, MOEK_SWIGLU, 0, 0.15, 1e-3})
FMT_TEST(q5_K, {MOEK_Q5_K, 0, 512, 256, MOEK_SWIGLU, 0, 0.08, 1e-3})
FMT_TEST(q6_K, {MOEK_Q6_K, 0, 512, 256, MOEK_SWIGLU, 0, 0.05, 1e-3})
/* Q2_K and Q3_K: 2 and 3 bits per weight, so gate, up and down each carry ~0.23 and ~0.12
 * relative error (test_quant_accuracy) and the FFN compounds them. */
FMT_TEST(q3_K, {MOEK_Q3_K, 0, 512, 256, MOEK_SWIGLU, 0, 0.35, 1e-3})
FMT_TEST(q2_K, {MOEK_Q2_K, 0, 512, 256, MOEK_SWIGLU, 0, 0.8, 1e-3})
/* llama.cpp's Q2_K mix: gate/up Q2_K, down Q3_K; Q3_K_M's: gate/up Q3_K, down Q4_K */
FMT_TEST(q2_K_with_q3_K_down, {MOEK_Q2_K, MOEK_Q3_K, 512, 768, MOEK_SWIGLU, 0, 0.6, 1e-3})
FMT_TEST(q3_K_with_q4_K_down, {MOEK_Q3_K, MOEK_Q4_K, 512, 768, MOEK_SWIGLU, 0, 0.3, 1e-3})
FMT_TEST(q4_K_with_q6_K_down, {MOEK_Q4_K, MOEK_Q6_K, 512, 768, MOEK_SWIGLU, 0, 0.15, 1e-3})
FMT_TEST(mxfp4_gpt_oss, {MOEK_MXFP4, 0, 320, 288, MOEK_SWIGLU_OAI, 1, 0.25, 5e-4})
FMT_TEST(mxfp4, {MOEK_MXFP4, 0, 320, 224, MOEK_SWIGLU, 0, 0.3, 5e-4})
/* NVFP4: one 64-element block per activation pair; UE4M3 scales per 16 */
FMT_TEST(nvfp4, {MOEK_NVFP4, 0, 320, 256, MOEK_SWIGLU, 0, 0.3, 5e-4})
FMT_TEST(nvfp4_with_q8_0_down, {MOEK_NVFP4, MOEK_Q8_0, 320, 256, MOEK_SWIGLU, 0, 0.3, 5e-4})
FMT_TEST(fp8_e4m3, {MOEK_FP8_E4M3_B128, 0, 320, 200, MOEK_SWIGLU, 0, 0.08, 1e-10})
/* IQ4_NL: Q8_0 activations in pairs of blocks (224 = 3.5 pairs: an unpaired last block);
 * IQ4_XS: Q8_K as the K-quants; and each as the other's down (mixed block sizes) */
FMT_TEST(iq4_nl, {MOEK_IQ4_NL, 0, 320, 224, MOEK_SWIGLU, 0, 0.2, 5e-4})
FMT_TEST(iq4_xs, {MOEK_IQ4_XS, 0, 512, 256, MOEK_SWIGLU, 0, 0.15, 1e-3})
/* the lattice i-quants: 2 bits a weight (their round-trip nmse is ~0.1: FFN bound as Q2_K's) */
FMT_TEST(iq2_xxs, {MOEK_IQ2_XXS, 0, 512, 256, MOEK_SWIGLU, 0, 0.8, 1e-3})
FMT_TEST(iq2_xs_with_q2_K_down, {MOEK_IQ2_XS, MOEK_Q2_K, 512, 256, MOEK_SWIGLU, 0, 0.8, 1e-3})
FMT_TEST(iq3_xxs, {MOEK_IQ3_XXS, 0, 512, 256, MOEK_SWIGLU, 0, 0.5, 1e-3})
FMT_TEST(iq3_s, {MOEK_IQ3_S, 0, 512, 256, MOEK_SWIGLU, 0, 0.5, 1e-3})
FMT_TEST(iq1_s_with_q2_K_down, {MOEK_IQ1_S, MOEK_Q2_K, 512, 256, MOEK_SWIGLU, 0, 1.2, 1e-3})
FMT_TEST(iq1_m, {MOEK_IQ1_M, 0, 512, 256, MOEK_SWIGLU, 0, 1.2, 1e-3})
FMT_TEST(iq2_s, {MOEK_IQ2_S, 0, 512, 256, MOEK_SWIGLU, 0, 0.8, 1e-3})
FMT_TEST(iq4_xs_with_iq4_nl_down, {MOEK_IQ4_XS, MOEK_IQ4_NL, 512, 288, MOEK_SWIGLU, 0, 0.2, 1e-3})
FMT_TEST(q4_K_with_iq4_xs_down, {MOEK_Q4_K, MOEK_IQ4_XS, 256, 512, MOEK_SWIGLU, 0, 0.15, 1e-3})
/* float formats accept any width: columns not a multiple of 8 (SIMD tails, zero-padded tiles) */
FMT_TEST(bf16_odd_shape, {MOEK_BF16, 0, 100, 36, MOEK_SWIGLU, 1, 0.02, 1e-5})
FMT_TEST(fp8_odd_shape, {MOEK_FP8_E4M3_B128, 0, 100, 140, MOEK_SWIGLU, 0, 0.08, 1e-10})
FMT_TEST(f32_odd_shape, {MOEK_F32, 0, 52, 18, MOEK_SWIGLU_OAI, 1, 1e-5, 1e-10})
FMT_TEST(bf16_gpt_oss, {MOEK_BF16, 0, 320, 200, MOEK_SWIGLU_OAI, 1, 0.02, 1e-5})

/* The clamped activation really clamps: with limit 7, gate values of +-100 saturate. */
Test(ffn_api, gpt_oss_activation_clamps)
{
	struct fixture f;
	fixture_init(&f, MOEK_F32, 0, 32, 8, MOEK_SWIGLU_OAI, 0, 3);
	/* gate row 0 = 100 * e0, up row 0 = 100 * e1, down column 0 = e0: out[0] = h[0] */
	memset(f.gate.data, 0, 8 * 32 * 4);
	memset(f.up.data, 0, 8 * 32 * 4);
	memset(f.down.data, 0, 32 * 8 * 4);
	((float *)f.gate.data)[0] = 100.0f;
	((float *)f.up.data)[1] = 100.0f;
	((float *)f.down.data)[0] = 1.0f;
	float x[32] = {1.0f, 1.0f};
	float *out = fixture_run(&f, x, 1, NULL);
	/* g = min(100, 7) = 7, u = clamp(100) = 7: h = 7 * sigmoid(1.702 * 7) * 8 */
	const double want = 7.0 / (1.0 + exp(-1.702 * 7.0)) * 8.0;
	cr_expect_float_eq(out[0], want, 1e-4, "%g vs %g", out[0], want);
	x[0] = -1.0f, x[1] = -1.0f; /* g = -100 (no lower clamp), u = -7 */
	free(out);
	out = fixture_run(&f, x, 1, NULL);
	const double want2 = -100.0 / (1.0 + exp(1.702 * 100.0)) * (-6.0);
	cr_expect_float_eq(out[0], want2, 1e-6, "%g vs %g", out[0], want2);
	free(out);
	fixture_free(&f);
}

/* 16-bit activations enter exactly: a bf16/f16 call equals the f32 call on the same values,
 * through the decode path (3 tokens) and the prefill panels (20 tokens). */
Test(ffn_api, bf16_and_f16_activations_equal_their_f32_values)
{
	enum { H = 256, NMAX = 20 };
	struct fixture f;
	fixture_init(&f, MOEK_Q8_0, 0, H, 64, MOEK_SWIGLU, 0, 5);
	static const size_t counts[] = {3, NMAX};
	for (size_t i = 0; i < 2; i++) {
		const size_t n = counts[i];
		float *x = fixture_tokens(n, H, 9);
		static uint16_t xb[NMAX * H];
		static float xr[NMAX * H], got[NMAX * H];
		for (unsigned dtype = MOEK_ACT_F16; dtype <= MOEK_ACT_BF16; dtype++) {
			moek_convert(dtype, xb, MOEK_ACT_F32, x, n * H);
			moek_convert(MOEK_ACT_F32, xr, dtype, xb, n * H);
			float *want = fixture_run(&f, xr, n, NULL);
			memset(got, 0, sizeof(got));
			const size_t bytes = moek_ffn_scratch_bytes(&f.expert, n, 1);
			void *scratch = malloc(bytes);
			struct moek_ffn_call c = {.expert = &f.expert,
			                          .n_tokens = n,
			                          .x = xb,
			                          .x_dtype = dtype,
			                          .out = got,
			                          .scratch = scratch,
			                          .scratch_bytes = bytes,
			                          .n_workers = 1};
			char err[200];
			cr_assert_eq(moek_ffn_run(&c, err, sizeof(err)), 0, "%s", err);
			cr_expect_arr_eq(got, want, n * H * sizeof(float), "dtype %u, %zu tokens",
			                 dtype, n);
			free(want);
			free(scratch);
		}
		free(x);
	}
	fixture_free(&f);
}

/* token_ids gather x rows and scatter-add out rows; strides are honoured; out is accumulated
 * (not overwritten) and untouched rows stay as they were. */
Test(ffn_api, token_ids_and_strides)
{
	struct fixture f;
	fixture_init(&f, MOEK_Q4_K, 0, 256, 256, MOEK_SWIGLU, 0, 6);
	enum { ROWS = 6, STRIDE = 300 };
	float *x = fixture_tokens(ROWS, STRIDE, 4);
	static const uint32_t ids[3] = {4, 1, 5};
	const float weights[3] = {0.5f, 2.0f, 1.0f};
	float out[ROWS * STRIDE];
	for (size_t i = 0; i < ROWS * STRIDE; i++)
		out[i] = (float)i;
	const size_t bytes = moek_ffn_scratch_bytes(&f.expert, 3, 1);
	void *scratch = malloc(bytes);
	struct moek_ffn_call c = {.expert = &f.expert,
	                          .n_tokens = 3,
	                          .x = x,
	                          .x_dtype = MOEK_ACT_F32,
	                          .x_stride = STRIDE,
	                          .token_ids = ids,
	                          .weights = weights,
	                          .out = out,
	                          .out_stride = STRIDE,
	                          .scratch = scratch,
	                          .scratch_bytes = bytes,
	                          .n_workers = 1};
	char err[200];
	cr_assert_eq(moek_ffn_run(&c, err, sizeof(err)), 0, "%s", err);
	for (size_t t = 0; t < 3; t++) {
		float xt[256];
		memcpy(xt, x + ids[t] * STRIDE, sizeof(xt));
		float *one = fixture_run(&f, xt, 1, &weights[t]);
		for (size_t o = 0; o < 256; o++)
			cr_assert_eq(out[ids[t] * STRIDE + o],
			             (float)(ids[t] * STRIDE + o) + one[o], "token %zu row %zu", t,
			             o);
		free(one);
	}
	for (size_t r = 0; r < ROWS; r++) {
		if (r == 1 || r == 4 || r == 5)
			continue;
		for (size_t o = 0; o < STRIDE; o++)
			cr_assert_eq(out[r * STRIDE + o], (float)(r * STRIDE + o), "row %zu", r);
	}
	for (size_t r = 0; r < ROWS; r++) /* the padding columns past hidden are never written */
		for (size_t o = 256; o < STRIDE; o++)
			cr_assert_eq(out[r * STRIDE + o], (float)(r * STRIDE + o));
	free(scratch);
	free(x);
	fixture_free(&f);
}

static void expect_prepare_error(struct moek_ffn_call *c, const char *needle)
{
	char err[256] = "";
	cr_expect_eq(moek_ffn_prepare(c, err, sizeof(err)), -1, "expected failure: %s", needle);
	cr_expect(strstr(err, needle) != NULL, "message '%s' lacks '%s'", err, needle);
}

Test(ffn_api, prepare_rejects_bad_calls_with_a_reason)
{
	struct fixture f;
	fixture_init(&f, MOEK_Q8_0, 0, 288, 64, MOEK_SWIGLU, 0, 8);
	float x[288] = {0}, out[288];
	const size_t bytes = moek_ffn_scratch_bytes(&f.expert, 1, 1);
	cr_assert(bytes > 0);
	char *scratch = malloc(bytes + 1);
	struct moek_expert e = f.expert;
	struct moek_ffn_call good = {.expert = &e,
	                             .n_tokens = 1,
	                             .x = x,
	                             .out = out,
	                             .scratch = scratch,
	                             .scratch_bytes = bytes,
	                             .n_workers = 1};
	struct moek_ffn_call c = good;
	char err[256];
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), 0, "%s", err);

	c = good, c.scratch_bytes = bytes - 1;
	expect_prepare_error(&c, "scratch");
	c = good, c.n_workers = 0;
	expect_prepare_error(&c, "n_workers");
	c = good, c.x_dtype = 7;
	expect_prepare_error(&c, "dtype");
	c = good, c.x_stride = 100;
	expect_prepare_error(&c, "x stride");
	c = good, c.n_tokens = MOEK_MAX_TOKENS + 1;
	expect_prepare_error(&c, "beyond the limits");
	cr_expect_eq(moek_ffn_scratch_bytes(&f.expert, (size_t)MOEK_MAX_TOKENS + 1, 1), 0);

	e = f.expert, e.up.rows = 32;
	expect_prepare_error(&good, "gate and up");
	e = f.expert, e.down.cols = 32;
	expect_prepare_error(&good, "down has 32 columns");
	e = f.expert, e.gate.format = MOEK_Q8_K;
	expect_prepare_error(&good, "not a weight format");
	e = f.expert, e.gate.format = e.up.format = MOEK_Q4_K;
	expect_prepare_error(&good, "multiple");
	e = f.expert, e.down.data = scratch + 1; /* odd address: f16 scales misaligned */
	expect_prepare_error(&good, "aligned");
	e = f.expert, e.gate.scales = (const float *)x;
	expect_prepare_error(&good, "non-FP8");
	e = f.expert, e.activation = (enum moek_activation)9;
	expect_prepare_error(&good, "activation");
	e = f.expert, e.activation = MOEK_SWIGLU_OAI, e.limit = 0.0f;
	expect_prepare_error(&good, "limit");
	e = f.expert, e.gate.data = NULL;
	expect_prepare_error(&good, "no weight data");
	cr_expect_eq(moek_ffn_scratch_bytes(&e, 1, 1), 0, "invalid expert: no size");
	free(scratch);
	fixture_free(&f);

	struct fixture g;
	fixture_init(&g, MOEK_FP8_E4M3_B128, 0, 256, 128, MOEK_SWIGLU, 0, 8);
	e = g.expert, e.down.scales = NULL;
	good.scratch = malloc(moek_ffn_scratch_bytes(&g.expert, 1, 1));
	good.scratch_bytes = moek_ffn_scratch_bytes(&g.expert, 1, 1);
	expect_prepare_error(&good, "without block scales");
	free(good.scratch);
	fixture_free(&g);
}

Test(ffn_api, isa_can_be_forced)
{
	cr_assert(moek_isa_supported(MOEK_ISA_SCALAR));
	cr_assert_eq(moek_set_isa(MOEK_ISA_SCALAR), 0);
	cr_expect_eq(moek_isa_active(), MOEK_ISA_SCALAR);
	cr_expect_str_eq(moek_isa_name(), "scalar");
	/* AVX2 runs exactly where the CPU has AVX2, FMA and F16C */
	const unsigned need = MOEK_CPU_AVX2 | MOEK_CPU_FMA | MOEK_CPU_F16C;
	cr_assert_eq(have_avx2(), (moek_cpu_features() & need) == need);
	if (have_avx2()) {
		cr_assert(moek_set_isa_forms(0));
		cr_assert_eq(moek_set_isa(MOEK_ISA_AVX2), 0);
		cr_expect_eq(moek_isa_active(), MOEK_ISA_AVX2);
		cr_expect_str_eq(moek_isa_name(), "avx2");
		cr_expect_eq(moek_isa_forms(), moek_isa_forms_available(),
		             "choosing AVX2 turns on every form the CPU has");
	} else {
		cr_assert_eq(moek_set_isa(MOEK_ISA_AVX2), -1);
		cr_expect_eq(moek_isa_active(), MOEK_ISA_SCALAR, "a refused ISA changes nothing");
	}
	enum moek_isa best = MOEK_ISA_SCALAR;
	for (enum moek_isa i = MOEK_ISA_AVX2; i <= MOEK_ISA_AMX; i++)
		if (moek_isa_supported(i))
			best = i;
	cr_assert_eq(moek_set_isa(MOEK_ISA_AUTO), 0);
	cr_expect_eq(moek_isa_active(), best, "AUTO picks the most capable ISA the CPU runs");
	cr_expect_eq(moek_isa_supported(MOEK_ISA_AUTO), true);
}

/* Each ISA by name, what it needs, and forcing the wide ones where the CPU has them. */
Test(ffn_api, isa_names_and_needs)
{
	for (enum moek_isa i = MOEK_ISA_SCALAR; i <= MOEK_ISA_AMX; i++) {
		enum moek_isa back = MOEK_ISA_AUTO;
		cr_assert_not_null(moek_isa_label(i));
		cr_assert_eq(moek_isa_parse(moek_isa_label(i), &back), 0);
		cr_expect_eq(back, i);
		cr_expect_eq(moek_isa_supported(i), moek_isa_missing(i) == 0, "%s",
		             moek_isa_label(i));
	}
	enum moek_isa none;
	cr_expect_eq(moek_isa_parse("avx1024", &none), -1);
	cr_expect_eq(moek_isa_parse(NULL, &none), -1);
	cr_expect_null(moek_isa_label(MOEK_ISA_AUTO));
	/* each wider ISA needs everything the one before does */
	cr_expect_eq(moek_isa_missing(MOEK_ISA_AVX2) & ~moek_isa_missing(MOEK_ISA_AVX512), 0u);
	cr_expect_eq(moek_isa_missing(MOEK_ISA_AVX512) & ~moek_isa_missing(MOEK_ISA_AMX), 0u);
	char names[128];
	if (moek_isa_missing(MOEK_ISA_AVX512)) {
		cr_assert_eq(moek_set_isa(MOEK_ISA_AVX512), -1);
		cr_skip_test("skipped: no %s",
		             moek_cpu_feature_names(moek_isa_missing(MOEK_ISA_AVX512), names,
		                                    sizeof(names)));
	}
	cr_assert_eq(moek_set_isa(MOEK_ISA_AVX512), 0);
	cr_expect_str_eq(moek_isa_name(), "avx512");
	char path[192];
	moek_isa_format_path(MOEK_BF16, path, sizeof(path));
	cr_expect(strncmp(path, "BF16: decode ", 13) == 0, "%s", path);
	cr_assert_eq(moek_set_isa(MOEK_ISA_AUTO), 0);
}

/* isa.c's CPUID/XGETBV detection against the compiler runtime's own (libgcc / compiler-rt),
 * an independent reading of the same bits. */
Test(ffn_api, cpu_features_match_the_compiler_runtime)
{
#if defined(__x86_64__) && defined(__GNUC__)
	__builtin_cpu_init();
	const unsigned f = moek_cpu_features();
	cr_expect_eq(!!(f & MOEK_CPU_AVX2), !!__builtin_cpu_supports("avx2"));
	cr_expect_eq(!!(f & MOEK_CPU_FMA), !!__builtin_cpu_supports("fma"));
	cr_expect_eq(!!(f & MOEK_CPU_AVX512_VNNI), __builtin_cpu_supports("avx512vnni") &&
	                                               __builtin_cpu_supports("avx512vl") &&
	                                               __builtin_cpu_supports("avx512bw"));
	cr_expect_eq(!!(f & MOEK_CPU_AVX512_VBMI), __builtin_cpu_supports("avx512vbmi") &&
	                                               __builtin_cpu_supports("avx512vl") &&
	                                               __builtin_cpu_supports("avx512bw"));
	cr_expect_eq(!!(f & MOEK_CPU_INTEL), !!__builtin_cpu_is("intel"));
	cr_expect_eq(moek_cpu_features(), f, "detected once: the same answer again");
#else
	cr_expect_eq(moek_cpu_features(), 0u);
#endif
}

/* Each SIMD dot product: (1) exact against the double dot of the dequantized weights and the
 * dequantized quantized activations it consumed — only f32 rounding differs; (2) against
 * float activations, normalised MSE over many rows within ggml's 5e-4 for quantized products. */
Test(ffn_dot, simd_dot_products_match_reference)
{
#if defined(__x86_64__)
	if (!have_avx2()) {
		cr_log_warn("no AVX2 on this CPU: SIMD dot products not tested");
		return;
	}
	static const uint32_t fmts[] = {
	    MOEK_Q8_0,   MOEK_Q4_0,   MOEK_MXFP4,    MOEK_Q4_K,          MOEK_Q5_K,   MOEK_Q6_K,
	    MOEK_BF16,   MOEK_F16,    MOEK_F32,      MOEK_FP8_E4M3_B128, MOEK_Q2_K,   MOEK_Q3_K,
	    MOEK_IQ4_NL, MOEK_IQ4_XS, MOEK_INT4_G32, MOEK_IQ2_XXS,       MOEK_IQ2_XS, MOEK_IQ3_XXS,
	    MOEK_IQ3_S,  MOEK_IQ1_S,  MOEK_IQ1_M,    MOEK_IQ2_S,         MOEK_NVFP4};
	enum { ROWS = 64, K = 1024 };
	float *w = fixture_tokens(ROWS, K, 77), *x = fixture_tokens(1, K, 78);
	float *wd = malloc(sizeof(float) * ROWS * K), *xd = malloc(sizeof(float) * K);
	uint8_t *wq = malloc(ROWS * K * 4), *xq = malloc(K * 4);
	float scales[8];
	cr_assert(wd && xd && wq && xq);
	for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++) {
		const uint32_t fmt = fmts[f], act = moek_isa_act_format(&moek_avx2_ops, fmt, false);
		const char *name = moek_format_lookup(fmt)->name;
		float *sc = fmt == MOEK_FP8_E4M3_B128 ? scales : NULL;
		cr_assert_eq(moek_quantize(fmt, w, ROWS, K, wq, sc), 0);
		cr_assert_eq(moek_dequantize(fmt, wq, sc, ROWS, K, wd), 0);
		moek_isa_quantize_act(&moek_avx2_ops, act, x, K, xq);
		moek_isa_dequantize_act(&moek_avx2_ops, act, xq, K, xd);
		const moek_dot_fn dot = moek_avx2_ops.dot[moek_fmt_index(fmt)];
		cr_assert_not_null(dot, "%s has no AVX2 dot", name);
		double num = 0, den = 0;
		for (size_t r = 0; r < ROWS; r++) {
			const size_t rb = moek_row_bytes(fmt, K);
			float got;
			dot(wq + r * rb, sc ? sc + r / 128 * 8 : NULL, xq, 0, 1, K, &got);
			double exact = 0, vs_float = 0;
			for (size_t k = 0; k < K; k++) {
				exact += (double)wd[r * K + k] * xd[k];
				vs_float += (double)wd[r * K + k] * x[k];
			}
			cr_assert(fabs(got - exact) <= 1e-5 * (fabs(exact) + 1.0),
			          "%s row %zu: %.8g vs exact %.8g", name, r, got, exact);
			num += (got - vs_float) * (got - vs_float);
			den += vs_float * vs_float;
		}
		cr_expect(num / den < 5e-4, "%s: nmse vs float activations %.3g", name, num / den);
		cr_log_info("%-14s dot nmse vs float activations %.3g", name, num / den);
	}
	free(w), free(x), free(wd), free(xd), free(wq), free(xq);
#else
	cr_skip_test("x86-64 only");
#endif
}

/* The SIMD dequantizer (prefill tiles) is bit-identical to the reference, for whole rows and
 * for the column sub-ranges the tiles use. */
Test(ffn_dot, simd_dequantize_matches_reference_bits)
{
#if defined(__x86_64__)
	if (!have_avx2()) {
		cr_log_warn("no AVX2 on this CPU: SIMD dequantizer not tested");
		return;
	}
	static const uint32_t fmts[] = {
	    MOEK_Q8_0,   MOEK_Q4_0,   MOEK_MXFP4,         MOEK_Q4_K,    MOEK_Q5_K,   MOEK_Q6_K,
	    MOEK_BF16,   MOEK_F16,    MOEK_FP8_E4M3_B128, MOEK_F32,     MOEK_Q2_K,   MOEK_Q3_K,
	    MOEK_IQ4_NL, MOEK_IQ4_XS, MOEK_INT4_G32,      MOEK_IQ2_XXS, MOEK_IQ2_XS, MOEK_IQ3_XXS,
	    MOEK_IQ3_S,  MOEK_IQ1_S,  MOEK_IQ1_M,         MOEK_IQ2_S,   MOEK_NVFP4};
	enum { K = 1536 };
	float *w = fixture_tokens(1, K, 99), ref[K], got[K];
	uint8_t q[K * 4];
	float scales[12];
	for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++) {
		float *sc = fmts[f] == MOEK_FP8_E4M3_B128 ? scales : NULL;
		cr_assert_eq(moek_quantize(fmts[f], w, 1, K, q, sc), 0);
		const size_t k0 = 512, kn = 768; /* a tile's column range */
		moek_ref_dequantize_row(fmts[f], q, sc, ref, K);
		moek_isa_dequantize(&moek_avx2_ops, moek_fmt_index(fmts[f]), q, sc, got, K);
		cr_expect_arr_eq(got, ref, sizeof(ref), "%s", moek_format_lookup(fmts[f])->name);
		moek_isa_dequantize(&moek_avx2_ops, moek_fmt_index(fmts[f]),
		                    q + moek_row_bytes(fmts[f], k0), sc ? sc + k0 / 128 : NULL, got,
		                    kn);
		cr_expect_arr_eq(got, ref + k0, kn * sizeof(float), "%s range",
		                 moek_format_lookup(fmts[f])->name);
	}
	free(w);
#else
	cr_skip_test("x86-64 only");
#endif
}

/* gpt-oss stores gate and up interleaved row by row in one tensor (GGUF's fused gate_up keeps
 * them as halves): row_stride views both without a copy, and the result is the same bits as
 * separate matrices, decode and prefill. */
Test(ffn_api, interleaved_gate_up_rows_are_a_strided_view)
{
	struct fixture f;
	fixture_init(&f, MOEK_MXFP4, 0, 320, 224, MOEK_SWIGLU_OAI, 1, 12);
	const size_t rb = moek_row_bytes(MOEK_MXFP4, 320);
	uint8_t *fused = malloc(2 * 224 * rb);
	cr_assert(fused);
	for (size_t r = 0; r < 224; r++) {
		memcpy(fused + (2 * r) * rb, (const uint8_t *)f.gate.data + r * rb, rb);
		memcpy(fused + (2 * r + 1) * rb, (const uint8_t *)f.up.data + r * rb, rb);
	}
	struct fixture view = f;
	view.expert.gate.data = fused;
	view.expert.gate.row_stride = 2 * rb;
	view.expert.up.data = fused + rb;
	view.expert.up.row_stride = 2 * rb;
	for (size_t n = 2; n <= 34; n += 32) {
		float *x = fixture_tokens(n, 320, 13);
		float *want = fixture_run(&f, x, n, NULL), *got = fixture_run(&view, x, n, NULL);
		cr_expect_arr_eq(got, want, n * 320 * sizeof(float), "%zu tokens", n);
		free(want);
		free(got);
		free(x);
	}
	free(fused);
	fixture_free(&f);
}

/* Llama-4: with weight_on_input the routing weight scales the input, out = expert(w·x): the
 * same bits as the plain expert on pre-scaled activations with weight 1, on every ISA and
 * through decode, batched and prefill paths; and not the output-weighted w·expert(x). */
Test(ffn_api, weight_on_input_scales_the_activations)
{
	static const uint32_t formats[] = {MOEK_F32, MOEK_Q8_0, MOEK_Q4_K, MOEK_BF16};
	static const size_t token_counts[] = {1, 5, 20};
	static const enum moek_isa isas[] = {MOEK_ISA_SCALAR, MOEK_ISA_AVX2, MOEK_ISA_AVX512};
	for (size_t fi = 0; fi < sizeof(formats) / sizeof(formats[0]); fi++) {
		struct fixture f;
		fixture_init(&f, formats[fi], 0, 256, 256, MOEK_SWIGLU, 0, 11 + (uint32_t)fi);
		for (size_t i = 0; i < sizeof(token_counts) / sizeof(token_counts[0]); i++) {
			const size_t n = token_counts[i], h = f.hidden;
			float *x = fixture_tokens(n, h, (uint32_t)(n + fi));
			float *xs = malloc(n * h * sizeof(float)), *w = malloc(n * sizeof(float));
			cr_assert(xs && w);
			for (size_t t = 0; t < n; t++) {
				w[t] = 0.3f + 0.6f * (float)t / (float)n;
				for (size_t k = 0; k < h; k++)
					xs[t * h + k] = x[t * h + k] * w[t];
			}
			for (size_t a = 0; a < sizeof(isas) / sizeof(isas[0]); a++) {
				if (!moek_isa_supported(isas[a]))
					continue;
				cr_assert_eq(moek_set_isa(isas[a]), 0);
				f.expert.weight_on_input = false;
				float *want = fixture_run(&f, xs, n, NULL);
				float *out_weighted = fixture_run(&f, x, n, w);
				f.expert.weight_on_input = true;
				float *got = fixture_run(&f, x, n, w);
				cr_assert_arr_eq(got, want, n * h * sizeof(float),
				                 "%s n=%zu isa %d: input-weighted differs from the "
				                 "pre-scaled input",
				                 moek_format_lookup(formats[fi])->name, n,
				                 (int)isas[a]);
				cr_assert_gt(
				    nmse_f(got, out_weighted, n * h), 1e-3,
				    "input and output weighting agree: the flag does nothing");
				free(want);
				free(out_weighted);
				free(got);
			}
			free(x);
			free(xs);
			free(w);
		}
		fixture_free(&f);
	}
	moek_set_isa(MOEK_ISA_AUTO);
}

/* A per-tensor scale (ModelOpt NVFP4's weight_scale_2) multiplies each matrix's products: the
 * FFN of an expert with scales equals the double FFN over its dequantized weights times them,
 * on every path (one-token and several-token dots, prefill tiles) and ISA; scale 1 gives the
 * bits of no scale; a scale that is not finite and positive, or one on interleaved rows, is
 * refused by name. */
Test(ffn_api, tensor_scales_multiply_each_matrix)
{
	struct fixture f;
	fixture_init(&f, MOEK_NVFP4, 0, 320, 256, MOEK_SWIGLU, 0, 31);
	const float sg = 0.37f, su = 1.9f, sd = 0.0113f;
	float *x = fixture_tokens(20, 320, 32);
	float *plain[3];
	static const size_t ns[3] = {1, 3, 20};
	for (int i = 0; i < 3; i++)
		plain[i] = fixture_run(&f, x, ns[i], NULL);
	f.expert.gate.tensor_scale = f.expert.up.tensor_scale = f.expert.down.tensor_scale = 1.0f;
	for (int i = 0; i < 3; i++) {
		float *one = fixture_run(&f, x, ns[i], NULL);
		cr_assert_eq(memcmp(one, plain[i], ns[i] * 320 * sizeof(float)), 0, "scale 1");
		free(one), free(plain[i]);
	}
	f.expert.gate.tensor_scale = sg, f.expert.up.tensor_scale = su;
	f.expert.down.tensor_scale = sd;
	for (size_t i = 0; i < 256 * 320; i++)
		f.gate.deq[i] *= sg, f.up.deq[i] *= su, f.down.deq[i] *= sd;
	static const enum moek_isa isas[] = {MOEK_ISA_SCALAR, MOEK_ISA_AVX2, MOEK_ISA_AVX512};
	for (size_t ii = 0; ii < sizeof(isas) / sizeof(isas[0]); ii++) {
		if (moek_set_isa(isas[ii]) != 0)
			continue;
		for (int i = 0; i < 3; i++) {
			double *want = calloc(ns[i] * 320, sizeof(double));
			fixture_oracle(&f, 0, x, ns[i], NULL, want);
			float *got = fixture_run(&f, x, ns[i], NULL);
			const double e = nmse(got, want, ns[i] * 320);
			cr_assert(e < 5e-4, "isa %s, %zu tokens: nmse %.3g", moek_isa_name(), ns[i],
			          e);
			free(got), free(want);
		}
	}
	moek_set_isa(MOEK_ISA_AUTO);
	char err[200];
	const float bad[] = {-1.0f, NAN, INFINITY};
	for (size_t i = 0; i < 3; i++) {
		struct moek_expert e = f.expert;
		e.up.tensor_scale = bad[i];
		cr_assert_eq(moek_expert_check(&e, err, sizeof(err)), -1);
		cr_assert(strstr(err, "expert up: tensor scale"), "%s", err);
	}
	free(x);
	fixture_free(&f);
}
