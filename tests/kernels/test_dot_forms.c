/* test_dot_forms.c — the faster forms of the AVX2 decode dots that some CPUs allow give the bits
 * of the plain AVX2 form, and the plain form stays covered on CPUs that have them.
 *
 * - Q4_K / Q5_K / Q6_K / Q2_K / Q3_K / IQ4_XS with AVX512-VNNI (vpdpwssd instead of madd + add,
 *   MOEK_FORM_VNNI) and Q8_0 (vpdpbusd instead of maddubs + madd): same bits for every token
 *   count (1..MOEK_DOT_TOKENS), one super-block and odd super-block counts, rows narrower
 *   and wider than the far-prefetch threshold; exact against the double dot of the
 *   dequantized operands.
 * - The one-token many-row entry (dot_rows) gives, row by row, the bits of the single-row dot,
 *   every format that has one (the lattice i-quants included), both forms, several widths and
 *   row counts.
 * - Whole expert FFN, decode (1 and 3 tokens) and prefill (20), Q4_K, Q5_K, Q6_K, Q8_0, Q4_0,
 *   MXFP4, IQ4_NL, IQ4_XS, BF16, F16, Q3_K, Q2_K, small and wide (14336-column down rows, the
 *   far-prefetch path) shapes: the AVX2 path forced to its plain form gives the same output
 *   bits as with every form the CPU allows, and stays within the accuracy bound of the float
 *   originals (so the plain form is checked on its own, too).
 * The comparisons are skipped where the CPU lacks AVX512-VNNI + AVX512VL (the plain form is the
 * only one there, and test_kernel_ffn covers it); the forced-plain accuracy check always runs.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "expert_fixture.h"
#include "kernels_internal.h"

#if defined(__x86_64__)

#define DOT_TEST_SEED 777u
#include "dot_test_util.h"

static bool vnni_available(void)
{
	if (!have_avx2() || !set_vnni_forms(true))
		return false;
	set_vnni_forms(false);
	return true;
}

/* One format with Q8_K (K-quants) or Q8_0 activations, k columns, ROWS rows against
 * MOEK_DOT_TOKENS tokens: both forms. */
static void check_kquant(uint32_t fmt, size_t k)
{
	enum { ROWS = 5 };
	const struct moek_isa_ops *ops = &moek_avx2_ops;
	const uint32_t act = moek_isa_act_format(ops, fmt, false);
	cr_assert(act == MOEK_Q8_K || act == MOEK_Q8_0, "%s", moek_format_lookup(fmt)->name);
	const size_t rb = moek_row_bytes(fmt, k), ab = moek_isa_act_row_bytes(ops, act, k);
	float *w = malloc(sizeof(float) * ROWS * k), *wd = malloc(sizeof(float) * ROWS * k);
	float *x = malloc(sizeof(float) * k * MOEK_DOT_TOKENS);
	float *xd = malloc(sizeof(float) * k * MOEK_DOT_TOKENS);
	uint8_t *wq = malloc(rb * ROWS),
	        *xq = aligned_alloc(64, (ab * MOEK_DOT_TOKENS + 63) / 64 * 64);
	cr_assert(w && wd && x && xd && wq && xq);
	for (size_t i = 0; i < ROWS * k; i++) /* outliers: sub-block scales and mins spread */
		w[i] = uniform(-1.0f, 1.0f) * (i % 89 == 0 ? 30.0f : 1.0f) +
		       (i % 512 < 32 ? 2.0f : 0.0f);
	for (size_t i = 0; i < k * MOEK_DOT_TOKENS; i++)
		x[i] = uniform(-3.0f, 3.0f);
	cr_assert_eq(moek_quantize(fmt, w, ROWS, k, wq, NULL), 0);
	cr_assert_eq(moek_dequantize(fmt, wq, NULL, ROWS, k, wd), 0);
	for (size_t t = 0; t < MOEK_DOT_TOKENS; t++) {
		moek_isa_quantize_act(ops, act, x + t * k, k, xq + t * ab);
		moek_isa_dequantize_act(ops, act, xq + t * ab, k, xd + t * k);
	}
	const moek_dot_fn dot = ops->dot[moek_fmt_index(fmt)];
	const char *name = moek_format_lookup(fmt)->name;
	for (size_t nt = 1; nt <= MOEK_DOT_TOKENS; nt++) {
		for (size_t r = 0; r < ROWS; r++) {
			float plain[MOEK_DOT_TOKENS], vnni[MOEK_DOT_TOKENS];
			cr_assert(set_vnni_forms(false));
			dot(wq + r * rb, NULL, xq, ab, nt, k, plain);
			cr_assert(set_vnni_forms(true));
			dot(wq + r * rb, NULL, xq, ab, nt, k, vnni);
			cr_assert(memcmp(plain, vnni, nt * sizeof(float)) == 0,
			          "%s k=%zu nt=%zu row %zu: %.9g (madd) vs %.9g (vnni)", name, k,
			          nt, r, (double)plain[0], (double)vnni[0]);
			for (size_t t = 0; t < nt; t++) {
				double exact = 0, magnitude = 0;
				for (size_t c = 0; c < k; c++) {
					exact += (double)wd[r * k + c] * xd[t * k + c];
					magnitude += fabs((double)wd[r * k + c] * xd[t * k + c]);
				}
				cr_assert(fabs(vnni[t] - exact) <= 1e-5 * (magnitude + 1.0),
				          "%s k=%zu nt=%zu row %zu token %zu: %.9g vs exact %.9g",
				          name, k, nt, r, t, (double)vnni[t], exact);
			}
		}
	}
	set_vnni_forms(false);
	free(w), free(wd), free(x), free(xd), free(wq), free(xq);
}

/* 256: one super-block; 768: Qwen3's down rows; 4352: 17 super-blocks; 14336: Mixtral's down
 * rows (Q8_K activations past the far-prefetch threshold). */
static const size_t kquant_widths[] = {256, 768, 4352, 14336};

Test(dot_forms, q4_K_vnni_same_bits_as_madd)
{
	if (!vnni_available())
		cr_skip_test("no AVX512-VNNI + AVX512VL here");
	for (size_t i = 0; i < sizeof(kquant_widths) / sizeof(kquant_widths[0]); i++)
		check_kquant(MOEK_Q4_K, kquant_widths[i]);
}

Test(dot_forms, q5_K_vnni_same_bits_as_madd)
{
	if (!vnni_available())
		cr_skip_test("no AVX512-VNNI + AVX512VL here");
	for (size_t i = 0; i < sizeof(kquant_widths) / sizeof(kquant_widths[0]); i++)
		check_kquant(MOEK_Q5_K, kquant_widths[i]);
}

Test(dot_forms, iq4_xs_vnni_same_bits_as_madd)
{
	if (!vnni_available())
		cr_skip_test("no AVX512-VNNI + AVX512VL here");
	for (size_t i = 0; i < sizeof(kquant_widths) / sizeof(kquant_widths[0]); i++)
		check_kquant(MOEK_IQ4_XS, kquant_widths[i]);
}

Test(dot_forms, q6_K_vnni_same_bits_as_madd)
{
	if (!vnni_available())
		cr_skip_test("no AVX512-VNNI + AVX512VL here");
	for (size_t i = 0; i < sizeof(kquant_widths) / sizeof(kquant_widths[0]); i++)
		check_kquant(MOEK_Q6_K, kquant_widths[i]);
}

Test(dot_forms, q8_0_vnni_same_bits_as_madd)
{
	if (!vnni_available())
		cr_skip_test("no AVX512-VNNI + AVX512VL here");
	for (size_t i = 0; i < sizeof(kquant_widths) / sizeof(kquant_widths[0]); i++)
		check_kquant(MOEK_Q8_0, kquant_widths[i]);
}

Test(dot_forms, q2_K_vnni_same_bits_as_madd)
{
	if (!vnni_available())
		cr_skip_test("no AVX512-VNNI + AVX512VL here");
	for (size_t i = 0; i < sizeof(kquant_widths) / sizeof(kquant_widths[0]); i++)
		check_kquant(MOEK_Q2_K, kquant_widths[i]);
}

Test(dot_forms, q3_K_vnni_same_bits_as_madd)
{
	if (!vnni_available())
		cr_skip_test("no AVX512-VNNI + AVX512VL here");
	for (size_t i = 0; i < sizeof(kquant_widths) / sizeof(kquant_widths[0]); i++)
		check_kquant(MOEK_Q3_K, kquant_widths[i]);
}

/* dot_rows over nr rows of k columns against one token = dot row by row, bit for bit. */
static void check_rows(uint32_t fmt, size_t k, size_t nr)
{
	const struct moek_isa_ops *ops = &moek_avx2_ops;
	const moek_dot_rows_fn rows = ops->dot_rows[moek_fmt_index(fmt)];
	const moek_dot_fn dot = ops->dot[moek_fmt_index(fmt)];
	const char *name = moek_format_lookup(fmt)->name;
	cr_assert(rows && dot, "%s: no many-row dot", name);
	const uint32_t act = moek_isa_act_format(ops, fmt, false);
	const size_t rb = moek_row_bytes(fmt, k), ab = moek_isa_act_row_bytes(ops, act, k);
	float *w = malloc(sizeof(float) * nr * k), *x = malloc(sizeof(float) * k);
	uint8_t *wq = malloc(rb * nr), *xq = aligned_alloc(64, (ab + 63) / 64 * 64);
	float *got = malloc(sizeof(float) * nr), *want = malloc(sizeof(float) * nr);
	cr_assert(w && x && wq && xq && got && want);
	for (size_t i = 0; i < nr * k; i++)
		w[i] = uniform(-1.0f, 1.0f) * (i % 61 == 0 ? 20.0f : 1.0f);
	for (size_t i = 0; i < k; i++)
		x[i] = uniform(-2.0f, 2.0f);
	cr_assert_eq(moek_quantize(fmt, w, nr, k, wq, NULL), 0);
	moek_isa_quantize_act(ops, act, x, k, xq);
	const bool forms = vnni_available();
	for (int vnni = 0; vnni <= (int)forms; vnni++) {
		cr_assert(set_vnni_forms(vnni));
		rows(wq, rb, nr, xq, k, got);
		for (size_t r = 0; r < nr; r++)
			dot(wq + r * rb, NULL, xq, ab, 1, k, &want[r]);
		for (size_t r = 0; r < nr; r++)
			cr_assert(memcmp(&got[r], &want[r], sizeof(float)) == 0,
			          "%s k=%zu row %zu/%zu vnni=%d: %.9g (rows) vs %.9g (dot)", name,
			          k, r, nr, vnni, (double)got[r], (double)want[r]);
	}
	set_vnni_forms(false);
	free(w), free(x), free(wq), free(xq), free(got), free(want);
}

Test(dot_forms, many_row_dot_same_bits_as_row_by_row)
{
	if (!have_avx2())
		cr_skip_test("no AVX2 here");
	static const uint32_t fmts[] = {
	    MOEK_F16,      MOEK_BF16,  MOEK_Q8_0,    MOEK_Q4_0,   MOEK_MXFP4,  MOEK_Q4_K,
	    MOEK_Q5_K,     MOEK_Q6_K,  MOEK_Q2_K,    MOEK_Q3_K,   MOEK_IQ4_NL, MOEK_IQ4_XS,
	    MOEK_INT4_G32, MOEK_NVFP4, MOEK_IQ2_XXS, MOEK_IQ2_XS, MOEK_IQ2_S,  MOEK_IQ3_XXS,
	    MOEK_IQ3_S,    MOEK_IQ1_S, MOEK_IQ1_M};
	static const size_t widths[] = {256, 768, 2304, 14336}; /* K-quant multiples; 14336 wide */
	for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++)
		for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++) {
			check_rows(fmts[f], widths[i], 1);
			check_rows(fmts[f], widths[i], 7);
		}
	/* formats without one: FP8 (its scale rows), F32 */
	cr_assert_null(moek_avx2_ops.dot_rows[moek_fmt_index(MOEK_FP8_E4M3_B128)]);
	cr_assert_null(moek_avx2_ops.dot_rows[moek_fmt_index(MOEK_F32)]);
}

/* The FFN through moek_set_isa(MOEK_ISA_AVX2) (every form the CPU allows), then with the
 * forms switched back to plain AVX2: same bits; the plain result within `bound` (mean
 * relative error) of the double FFN over the float originals. */
static void check_ffn_forms(uint32_t format, size_t hidden, size_t ffn, size_t n, double bound)
{
	cr_assert_eq(moek_set_isa(MOEK_ISA_AVX2), 0);
	struct fixture f;
	fixture_init(&f, format, 0, hidden, ffn, MOEK_SWIGLU, 0, 5);
	float *x = fixture_tokens(n, hidden, 9);
	const bool forms = vnni_available();
	float *fast = NULL;
	if (forms) {
		cr_assert(set_vnni_forms(true));
		fast = fixture_run(&f, x, n, NULL);
	}
	set_vnni_forms(false);
	float *plain = fixture_run(&f, x, n, NULL);
	const char *name = moek_format_lookup(format)->name;
	if (fast)
		for (size_t i = 0; i < n * hidden; i++)
			cr_assert(memcmp(&fast[i], &plain[i], sizeof(float)) == 0,
			          "%s %zux%zu n=%zu element %zu: %.9g (all forms) vs %.9g (plain)",
			          name, hidden, ffn, n, i, (double)fast[i], (double)plain[i]);
	double *want = calloc(n * hidden, sizeof(double));
	cr_assert(want);
	fixture_oracle(&f, 1, x, n, NULL, want);
	const double err = mean_rel_abs(plain, want, n * hidden);
	cr_assert(err <= bound, "%s %zux%zu n=%zu, plain AVX2: relative error %.4f > %.4f", name,
	          hidden, ffn, n, err, bound);
	/* put the library back as the ISA choice leaves it */
	cr_assert_eq(moek_set_isa(MOEK_ISA_AVX2), 0);
	free(want), free(plain), free(fast), free(x);
	fixture_free(&f);
}

static const struct {
	uint32_t format;
	double bound; /* test_kernel_ffn's bounds against the float originals */
} ffn_formats[] = {
    {MOEK_Q4_K, 0.15},    {MOEK_Q5_K, 0.08},   {MOEK_Q6_K, 0.05}, {MOEK_Q8_0, 0.03},
    {MOEK_Q4_0, 0.2},     {MOEK_MXFP4, 0.3},   {MOEK_BF16, 0.02}, {MOEK_F16, 6e-3},
    {MOEK_IQ4_NL, 0.2},   {MOEK_IQ4_XS, 0.15}, {MOEK_Q3_K, 0.35}, {MOEK_Q2_K, 0.8},
    {MOEK_INT4_G32, 0.2}, {MOEK_NVFP4, 0.3},
};

Test(dot_forms, ffn_plain_avx2_same_bits_small_expert)
{
	if (!have_avx2())
		cr_skip_test("no AVX2 here");
	for (size_t i = 0; i < sizeof(ffn_formats) / sizeof(ffn_formats[0]); i++) {
		check_ffn_forms(ffn_formats[i].format, 512, 768, 1, ffn_formats[i].bound);
		check_ffn_forms(ffn_formats[i].format, 512, 768, 3, ffn_formats[i].bound);
		check_ffn_forms(ffn_formats[i].format, 256, 512, 20, ffn_formats[i].bound);
	}
}

Test(dot_forms, ffn_plain_avx2_same_bits_wide_down_rows)
{
	if (!have_avx2())
		cr_skip_test("no AVX2 here");
	/* 14336 intermediate features: down's rows take the far prefetch */
	for (size_t i = 0; i < sizeof(ffn_formats) / sizeof(ffn_formats[0]); i++)
		check_ffn_forms(ffn_formats[i].format, 256, 14336, 1, ffn_formats[i].bound);
}

/* The decode chunks' vector SwiGLU (moek_avx2_ops.swiglu) against the formula in double:
 * within a few float roundings over the range activations take, saturating ends exact or
 * negligible, a NaN as ffn.c's activate() treats it, and the same bits for an element
 * whatever the call's range (main loop or tail, with or without bias). */
static double swiglu_ref(double g, double u, bool oai, double limit, float alpha)
{
	if (oai) { /* e^'s argument rounded to float as the kernels' (and activate()'s) is */
		g = g < limit ? g : limit;
		u = u > limit ? limit : u < -limit ? -limit : u;
		return g / (1.0 + exp((double)(-alpha * (float)g))) * (u + 1.0);
	}
	return g / (1.0 + exp(-g)) * u;
}

Test(dot_forms, swiglu_vector)
{
	if (!have_avx2())
		cr_skip_test("no AVX2 here");
	enum { N = 4099 };
	float *g = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float));
	float *bg = malloc(N * sizeof(float)), *h = malloc(N * sizeof(float));
	float *parts = malloc(N * sizeof(float));
	cr_assert(g && u && bg && h && parts);
	uint32_t seed = 12345;
	for (size_t i = 0; i < N; i++) {
		seed = seed * 1664525u + 1013904223u;
		g[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 60.0f; /* -30 .. 30 */
		seed = seed * 1664525u + 1013904223u;
		u[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 8.0f;
		bg[i] = (float)(i % 13) * 0.125f - 0.75f;
	}
	for (int oai = 0; oai < 2; oai++)
		for (int bias = 0; bias < 2; bias++) {
			memcpy(h, g, N * sizeof(float));
			moek_avx2_ops.swiglu(h, u, bias ? bg : NULL, NULL, N, oai, 7.0f, 1.702f);
			double worst = 0;
			for (size_t i = 0; i < N; i++) {
				const double gi = (double)g[i] + (bias ? (double)bg[i] : 0.0);
				const double want =
				    swiglu_ref((double)(float)gi, u[i], oai, 7.0, 1.702);
				const double err = fabs(h[i] - want) / (fabs(want) + 1e-30);
				if (fabs(want) > 1e-30 && err > worst)
					worst = err;
			}
			cr_assert_lt(worst, 2e-6, "oai %d bias %d: relative error %g", oai, bias,
			             worst);
			/* pieces of 1, 3, 8, 13 ... elements: the same bits */
			memcpy(parts, g, N * sizeof(float));
			for (size_t i = 0, len = 1; i < N; i += len, len = len * 3 % 17 + 1) {
				const size_t n = N - i < len ? N - i : len;
				moek_avx2_ops.swiglu(parts + i, u + i, bias ? bg + i : NULL, NULL,
				                     n, oai, 7.0f, 1.702f);
			}
			cr_assert_eq(memcmp(parts, h, N * sizeof(float)), 0,
			             "oai %d bias %d: split calls differ", oai, bias);
		}
	/* the ends: g -> +inf gives g u, g -> -inf gives (-)0; NaN stays NaN (plain) or
	 * becomes the limit (gpt-oss, as fminf does) */
	float e[8] = {100.0f, -100.0f, 1e30f, -1e30f, NAN, 0.0f, -0.0f, 88.5f};
	const float one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
	moek_avx2_ops.swiglu(e, one, NULL, NULL, 8, false, 0, 0);
	cr_assert_eq(e[0], 100.0f);
	cr_assert_lt(fabsf(e[1]), 1e-30f);
	cr_assert_eq(e[2], 1e30f);
	cr_assert_lt(fabsf(e[3]), 1e-30f, "%g", e[3]);
	cr_assert(isnan(e[4]));
	cr_assert_eq(e[5], 0.0f);
	cr_assert_eq(e[7], 88.5f);
	float o[2] = {NAN, 3.0f};
	const float uo[2] = {NAN, 100.0f};
	moek_avx2_ops.swiglu(o, uo, NULL, NULL, 2, true, 7.0f, 1.702f);
	cr_assert_float_eq(o[0], (float)swiglu_ref(7.0, 7.0, true, 7.0, 1.702f), 1e-5);
	cr_assert_float_eq(o[1], (float)swiglu_ref(3.0, 7.0, true, 7.0, 1.702f), 1e-5);
	free(g), free(u), free(bg), free(h), free(parts);
}

#else
Test(dot_forms, x86_only)
{
	cr_skip_test("x86-64 only");
}
#endif
