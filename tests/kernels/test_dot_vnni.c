/* test_dot_vnni.c — the AVX512-VNNI form of the AVX2 Q4_0 / MXFP4 / IQ4_NL dot products
 * (MOEK_FORM_VNNI) gives the same bits as the maddubs + madd form it replaces, for every
 * token count (1..MOEK_DOT_TOKENS), odd block counts (the unpaired last block), rows wider than
 * the two-accumulator loop, and every E8M0 exponent (0, 1, 254 and the NaN code 255 included);
 * and, with ordinary scales, stays exact against the double dot of the dequantized operands.
 * Skipped where the CPU or OS lacks AVX512-VNNI + AVX512VL (nothing else can run that form).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

#if defined(__x86_64__)

#define DOT_TEST_SEED 12345u
#include "dot_test_util.h"

/* One format, k columns, ROWS rows against MOEK_DOT_TOKENS token rows: both forms, all nt. */
static void check_format(uint32_t fmt, size_t k, bool hostile_scales)
{
	enum { ROWS = 6 };
	const struct moek_isa_ops *ops = &moek_avx2_ops;
	const uint32_t act = moek_isa_act_format(ops, fmt, false);
	const size_t rb = moek_row_bytes(fmt, k), ab = moek_isa_act_row_bytes(ops, act, k);
	float *w = malloc(sizeof(float) * ROWS * k), *wd = malloc(sizeof(float) * ROWS * k);
	float *x = malloc(sizeof(float) * k * MOEK_DOT_TOKENS);
	float *xd = malloc(sizeof(float) * k * MOEK_DOT_TOKENS);
	uint8_t *wq = malloc(rb * ROWS),
	        *xq = aligned_alloc(64, (ab * MOEK_DOT_TOKENS + 63) / 64 * 64);
	cr_assert(w && wd && x && xd && wq && xq);
	for (size_t i = 0; i < ROWS * k; i++)
		w[i] = uniform(-1.0f, 1.0f) * (i % 97 == 0 ? 40.0f : 1.0f);
	for (size_t i = 0; i < k * MOEK_DOT_TOKENS; i++)
		x[i] = uniform(-2.0f, 2.0f);
	cr_assert_eq(moek_quantize(fmt, w, ROWS, k, wq, NULL), 0);
	if (hostile_scales) { /* MXFP4: E8M0 bytes across the whole range, edges included */
		static const uint8_t edges[] = {0, 1, 2, 126, 127, 128, 200, 254, 255};
		for (size_t b = 0; b < ROWS * k / 32; b++)
			wq[b * sizeof(struct block_mxfp4)] =
			    b < sizeof(edges) ? edges[b] : (uint8_t)(rng() & 0xff);
	}
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
			          "%s k=%zu nt=%zu row %zu: %.9g (maddubs) vs %.9g (vnni)", name, k,
			          nt, r, (double)plain[0], (double)vnni[0]);
			/* hostile exponents: bits only (f32 sums overflow where double does not) */
			for (size_t t = 0; t < nt && !hostile_scales; t++) {
				double exact = 0,
				       magnitude = 0; /* f32 sums: error ~ eps · Σ|terms| */
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

static bool vnni_available(void)
{
	if (!have_avx2() || !set_vnni_forms(true))
		return false;
	set_vnni_forms(false);
	return true;
}

/* 32 and 96: one unpaired block; 160: two pairs and an unpaired block after the
 * two-accumulator loop; 2880 (gpt-oss, 45 pairs) and 4128: long rows with odd pair counts. */
static const size_t widths[] = {32, 64, 96, 160, 256, 2880, 4128};

Test(dot_vnni, q4_0_same_bits_as_maddubs)
{
	if (!vnni_available())
		cr_skip_test("no AVX512-VNNI + AVX512VL here");
	for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++)
		check_format(MOEK_Q4_0, widths[i], false);
}

Test(dot_vnni, mxfp4_same_bits_as_maddubs)
{
	if (!vnni_available())
		cr_skip_test("no AVX512-VNNI + AVX512VL here");
	for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++) {
		check_format(MOEK_MXFP4, widths[i], false);
		check_format(MOEK_MXFP4, widths[i], true);
	}
}

Test(dot_vnni, iq4_nl_same_bits_as_maddubs)
{
	if (!vnni_available())
		cr_skip_test("no AVX512-VNNI + AVX512VL here");
	for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++)
		check_format(MOEK_IQ4_NL, widths[i], false);
}

Test(dot_vnni, enabling_reports_support)
{
	/* where the CPU lacks it, enabling fails and the plain form stays in use; disabling
	 * always succeeds */
	cr_assert(moek_set_isa_forms(0));
	__builtin_cpu_init();
	const bool has = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
	const bool vbmi = has && __builtin_cpu_supports("avx512vbmi");
	cr_assert_eq(moek_isa_forms_available(),
	             (has ? MOEK_FORM_VNNI : 0u) | (vbmi ? MOEK_FORM_VBMI : 0u));
	cr_assert_eq(moek_set_isa_forms(MOEK_FORM_VNNI), has);
	cr_assert_eq(moek_isa_forms(), has ? MOEK_FORM_VNNI : 0u);
	cr_assert_eq(moek_set_isa_forms(MOEK_FORM_VNNI | MOEK_FORM_VBMI), vbmi);
	cr_assert(!moek_set_isa_forms(MOEK_FORM_VBMI), "VBMI form without VNNI");
	cr_assert_eq(moek_isa_forms(),
	             vbmi  ? MOEK_FORM_VNNI | MOEK_FORM_VBMI
	             : has ? MOEK_FORM_VNNI
	                   : 0u,
	             "a refused set changes nothing");
	cr_assert(moek_set_isa_forms(0));
}

#else
Test(dot_vnni, x86_only)
{
	cr_skip_test("x86-64 only");
}
#endif
