/* test_dot_avx512.c — the avx512 table's own decode dots (x86_avx512.c) against the scalar
 * reference, and their determinism contract (kernels_internal.h).
 *
 * - BF16 row dot (vdpbf16ps, 512-bit): every token count 1..MOEK_DOT_TOKENS, widths from a
 *   partial 32-column step to 14336 (odd multiples of 16 and 32, odd widths, Qwen3's 768),
 *   tokens act_stride apart with padding, within float reassociation of the exact dot of the
 *   bf16 operands.
 * - BF16 one-token many-row dot: row by row the bits of the row dot with nt = 1, for every cut
 *   of a row range into two calls.
 * - BF16 group dot (the interleaved decode layout): every token count, within reassociation
 *   of the exact dot; a token's results do not move when another token's activations change.
 * - The path log (moek_isa_format_path) names them.
 * Skipped where the CPU cannot run the avx512 table (test_kernel_ffn covers the others).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

#if defined(__x86_64__)

#define DOT_TEST_SEED 4242u
#include "dot_test_util.h"

/* The avx512 table, built and made active; NULL (the test skipped) where the CPU lacks it. */
static const struct moek_isa_ops *avx512_or_skip(void)
{
	const unsigned missing = moek_isa_missing(MOEK_ISA_AVX512);
	if (missing) {
		char names[128];
		cr_skip_test("skipped: no %s",
		             moek_cpu_feature_names(missing, names, sizeof(names)));
		return NULL;
	}
	cr_assert_eq(moek_set_isa(MOEK_ISA_AVX512), 0);
	return &moek_avx512_ops;
}

/* Random bf16 values in [-mag, mag], with some exact zeros and wide-range outliers. */
static void fill_bf16(uint16_t *v, size_t n, float mag)
{
	for (size_t i = 0; i < n; i++) {
		float f = uniform(-mag, mag);
		if (i % 97 == 5)
			f *= 64.0f;
		if (i % 131 == 7)
			f = 0.0f;
		v[i] = moek_f32_to_bf16(f);
	}
}

/* The exact dot of n bf16 pairs (products exact in double) and the sum of their magnitudes. */
static double exact_dot(const uint16_t *w, size_t w_step, const uint16_t *x, size_t n,
                        double *magnitude)
{
	double s = 0, m = 0;
	for (size_t c = 0; c < n; c++) {
		const double p =
		    (double)moek_bf16_to_f32(w[c * w_step]) * (double)moek_bf16_to_f32(x[c]);
		s += p;
		m += fabs(p);
	}
	*magnitude = m;
	return s;
}

/* f32 accumulation of k products in any order: well within 1e-5 of the magnitudes' sum at
 * these widths (the per-format bound of test_dot_forms). */
static void assert_close(float got, double exact, double magnitude, const char *what, size_t k,
                         size_t nt, size_t r, size_t t)
{
	cr_assert(fabs((double)got - exact) <= 1e-5 * (magnitude + 1e-30),
	          "%s k=%zu nt=%zu row %zu token %zu: %.9g vs exact %.9g", what, k, nt, r, t,
	          (double)got, exact);
}

/* 16: one group unit; 33 and 63: odd, under and over one 32-column step; 48, 80, 2064: odd
 * multiples of 16; 96, 2080: odd multiples of 32; 768: Qwen3's down rows; 2880: gpt-oss;
 * 7168: DeepSeek's hidden rows; 14336: Mixtral's down rows (past the far prefetch). */
static const size_t row_widths[] = {16,   33,   48,   63,   80,   96,   768,
                                    1000, 2064, 2080, 2880, 7168, 14336};

Test(dot_avx512, bf16_row_dot_every_token_count)
{
	const struct moek_isa_ops *ops = avx512_or_skip();
	enum { ROWS = 3, PAD = 40 };
	for (size_t ki = 0; ki < sizeof(row_widths) / sizeof(row_widths[0]); ki++) {
		const size_t k = row_widths[ki], stride = k + PAD; /* elements per token row */
		uint16_t *w = malloc(ROWS * k * 2), *x = malloc(MOEK_DOT_TOKENS * stride * 2);
		cr_assert(w && x);
		fill_bf16(w, ROWS * k, 1.0f);
		fill_bf16(x, MOEK_DOT_TOKENS * stride, 3.0f);
		for (size_t nt = 1; nt <= MOEK_DOT_TOKENS; nt++)
			for (size_t r = 0; r < ROWS; r++) {
				float out[MOEK_DOT_TOKENS];
				ops->dot[MOEK_FMT_BF16](w + r * k, NULL, x, stride * 2, nt, k, out);
				for (size_t t = 0; t < nt; t++) {
					double mag;
					const double e =
					    exact_dot(w + r * k, 1, x + t * stride, k, &mag);
					assert_close(out[t], e, mag, "BF16 row dot", k, nt, r, t);
				}
			}
		free(w), free(x);
	}
}

Test(dot_avx512, bf16_many_rows_same_bits_as_row_dot_any_cut)
{
	const struct moek_isa_ops *ops = avx512_or_skip();
	enum { ROWS = 11 };
	for (size_t ki = 0; ki < sizeof(row_widths) / sizeof(row_widths[0]); ki++) {
		const size_t k = row_widths[ki], rb = k * 2 + 64; /* rows apart by more than k */
		uint8_t *w = malloc(ROWS * rb);
		uint16_t *x = malloc(k * 2);
		cr_assert(w && x);
		for (size_t r = 0; r < ROWS; r++)
			fill_bf16((uint16_t *)(w + r * rb), k, 1.0f);
		fill_bf16(x, k, 2.0f);
		float one[ROWS], many[ROWS];
		for (size_t r = 0; r < ROWS; r++)
			ops->dot[MOEK_FMT_BF16](w + r * rb, NULL, x, 0, 1, k, one + r);
		for (size_t cut = 0; cut <= ROWS; cut++) {
			memset(many, 0xff, sizeof(many));
			ops->dot_rows[MOEK_FMT_BF16](w, rb, cut, x, k, many);
			ops->dot_rows[MOEK_FMT_BF16](w + cut * rb, rb, ROWS - cut, x, k,
			                             many + cut);
			cr_assert_arr_eq(many, one, sizeof(one),
			                 "BF16 k=%zu cut at row %zu: bits differ", k, cut);
		}
		free(w), free(x);
	}
}

/* 16 rows (two groups) of k columns, interleaved, against MOEK_DOT_TOKENS tokens. */
Test(dot_avx512, bf16_group_dot_every_token_count)
{
	const struct moek_isa_ops *ops = avx512_or_skip();
	enum { ROWS = 16, PAD = 24 };
	static const size_t widths[] = {16, 48, 96, 768, 2064, 2880, 7168, 14336};
	for (size_t ki = 0; ki < sizeof(widths) / sizeof(widths[0]); ki++) {
		const size_t k = widths[ki], stride = k + PAD;
		uint16_t *w = malloc(ROWS * k * 2), *g = malloc(ROWS * k * 2);
		uint16_t *x = malloc(MOEK_DOT_TOKENS * stride * 2);
		cr_assert(w && g && x);
		fill_bf16(w, ROWS * k, 1.0f);
		fill_bf16(x, MOEK_DOT_TOKENS * stride, 3.0f);
		cr_assert_eq(moek_interleave(MOEK_BF16, w, 0, ROWS, k, g), 0);
		for (size_t nt = 1; nt <= MOEK_DOT_TOKENS; nt++)
			for (size_t grp = 0; grp < ROWS / MOEK_INTERLEAVE; grp++) {
				float out[MOEK_DOT_TOKENS * MOEK_INTERLEAVE];
				ops->dot_x8[MOEK_FMT_BF16](g + grp * MOEK_INTERLEAVE * k, x,
				                           stride * 2, nt, k, out);
				for (size_t t = 0; t < nt; t++)
					for (size_t r = 0; r < MOEK_INTERLEAVE; r++) {
						const size_t row = grp * MOEK_INTERLEAVE + r;
						double mag;
						const double e = exact_dot(w + row * k, 1,
						                           x + t * stride, k, &mag);
						assert_close(out[t * MOEK_INTERLEAVE + r], e, mag,
						             "BF16 group dot", k, nt, row, t);
					}
			}
		free(w), free(g), free(x);
	}
}

Test(dot_avx512, bf16_group_dot_tokens_independent)
{
	const struct moek_isa_ops *ops = avx512_or_skip();
	const size_t k = 2064;
	uint16_t *w = malloc(MOEK_INTERLEAVE * k * 2), *g = malloc(MOEK_INTERLEAVE * k * 2);
	uint16_t *x = malloc(MOEK_DOT_TOKENS * k * 2);
	cr_assert(w && g && x);
	fill_bf16(w, MOEK_INTERLEAVE * k, 1.0f);
	fill_bf16(x, MOEK_DOT_TOKENS * k, 3.0f);
	cr_assert_eq(moek_interleave(MOEK_BF16, w, 0, MOEK_INTERLEAVE, k, g), 0);
	for (size_t nt = 2; nt <= MOEK_DOT_TOKENS; nt++) {
		float before[MOEK_DOT_TOKENS * MOEK_INTERLEAVE], after[MOEK_DOT_TOKENS * 8];
		ops->dot_x8[MOEK_FMT_BF16](g, x, k * 2, nt, k, before);
		const size_t changed = nt / 2;
		uint16_t *tok = x + changed * k, *saved = malloc(k * 2);
		cr_assert(saved);
		memcpy(saved, tok, k * 2);
		fill_bf16(tok, k, 5.0f);
		ops->dot_x8[MOEK_FMT_BF16](g, x, k * 2, nt, k, after);
		for (size_t t = 0; t < nt; t++)
			if (t != changed)
				cr_assert_arr_eq(after + t * 8, before + t * 8, 8 * sizeof(float),
				                 "nt=%zu: token %zu moved with token %zu", nt, t,
				                 changed);
		memcpy(tok, saved, k * 2);
		free(saved);
	}
	free(w), free(g), free(x);
}

/* The path log names what BF16 decode runs under avx512; the other formats keep AVX2's. */
Test(dot_avx512, path_log_names_the_kernels)
{
	(void)avx512_or_skip();
	char path[192];
	moek_isa_format_path(MOEK_BF16, path, sizeof(path));
	cr_expect(strstr(path, "decode avx512 vdpbf16ps") != NULL, "%s", path);
	moek_isa_format_path(MOEK_Q6_K, path, sizeof(path));
	cr_expect(strstr(path, "decode avx2 integer dots (vnni forms)") != NULL, "%s", path);
}

#else

Test(dot_avx512, x86_only)
{
	cr_skip_test("the avx512 table is x86-64 only");
}

#endif
