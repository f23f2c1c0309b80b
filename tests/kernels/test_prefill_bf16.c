/* test_prefill_bf16.c — the avx512 ISA's bf16 prefill tiles (vdpbf16ps):
 *   the tile kernel against a double computation over the same bf16 operands, within the f32
 *     accumulation's own error bound, for every row count up to and past a register block,
 *     1..5 panels, k from 32 to 288 with zero-padded columns; each (row, token) sum the same
 *     bits whatever rows and panels it is computed with (the FFN's split determinism);
 *   the f32 → bf16 rounding: nearest even, NaN kept, any length;
 *   the FFN from 16 to 512 tokens on the bf16 tiles against the scalar reference, within
 *     test_ffn's per-format bounds (bf16 activations and weights: 2^-9 relative per operand).
 * Skipped where the CPU lacks what the avx512 ISA needs.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "expert_fixture.h"
#include "kernels_internal.h"

static const struct moek_isa_ops *avx512_or_skip(void)
{
	char names[160];
	if (moek_isa_missing(MOEK_ISA_AVX512))
		cr_skip_test("skipped: no %s",
		             moek_cpu_feature_names(moek_isa_missing(MOEK_ISA_AVX512), names,
		                                    sizeof(names)));
	cr_assert_eq(moek_set_isa(MOEK_ISA_AVX512), 0);
	const struct moek_isa_ops *ops = moek_isa_current();
	cr_assert(ops->tile_bf16 && ops->round_bf16, "avx512 without bf16 tiles");
	return ops;
}

static uint32_t lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* bf16 bits of a random value in about [-2, 2], a few exactly zero. */
static uint16_t random_bf16(uint32_t *s)
{
	const uint32_t v = lcg(s);
	if (v % 17 == 0)
		return 0;
	const float f = ((float)(v & 0xFFFF) / 32768.0f - 1.0f) * 2.0f;
	uint32_t bits;
	memcpy(&bits, &f, sizeof(bits));
	return (uint16_t)(bits >> 16);
}

static double bf16_value(uint16_t b)
{
	const uint32_t bits = (uint32_t)b << 16;
	float f;
	memcpy(&f, &bits, sizeof(f));
	return f;
}

enum { MAX_ROWS = 25, MAX_PANELS = 5, MAX_K = 288, LDW = 320, LDC = MAX_PANELS * 16 };

/* Element (k, j) of a panel (moek_tile_bf16_fn's layout). */
static size_t pair_at(size_t k, size_t j)
{
	return k / 2 * 32 + j * 2 + k % 2;
}

Test(prefill_bf16, tile_kernel_matches_double_within_f32_accumulation)
{
	const struct moek_isa_ops *ops = avx512_or_skip();
	static uint16_t w[MAX_ROWS * LDW], xp[MAX_PANELS * MAX_K * 16];
	static float c0[MAX_ROWS * LDC], c[MAX_ROWS * LDC], one[LDC];
	const size_t xs = MAX_K * 16; /* elements between panels */
	uint32_t seed = 12345;
	static const size_t ks[] = {32, 64, 96, 288};
	for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
		const size_t k = ks[ki], used = k - (ki % 2 ? 13 : 0); /* padded columns: zero */
		for (size_t i = 0; i < MAX_ROWS * LDW; i++)
			w[i] = i % LDW < used ? random_bf16(&seed) : 0;
		for (size_t p = 0; p < MAX_PANELS; p++)
			for (size_t kk = 0; kk < MAX_K; kk++)
				for (size_t j = 0; j < 16; j++)
					xp[p * xs + pair_at(kk, j)] =
					    kk < used ? random_bf16(&seed) : 0;
		for (size_t i = 0; i < MAX_ROWS * LDC; i++)
			c0[i] = (float)((int)(lcg(&seed) % 201) - 100) / 64.0f;
		for (size_t nr = 1; nr <= MAX_ROWS; nr++)
			for (size_t np = 1; np <= MAX_PANELS; np++) {
				memcpy(c, c0, sizeof(c));
				ops->tile_bf16(w, LDW, nr, xp, xs, np, k, c, LDC);
				for (size_t r = 0; r < MAX_ROWS; r++)
					for (size_t p = 0; p < MAX_PANELS; p++)
						for (size_t j = 0; j < 16; j++) {
							const size_t at = r * LDC + p * 16 + j;
							if (r >= nr || p >= np) {
								cr_assert_eq(
								    c[at], c0[at],
								    "nr %zu np %zu: row %zu "
								    "panel %zu written",
								    nr, np, r, p);
								continue;
							}
							/* f32 accumulation of k exact products:
							 * |error| <= k u (|c0| + sum |w x|) */
							double want = c0[at], mag = fabs(c0[at]);
							for (size_t kk = 0; kk < k; kk++) {
								const double v =
								    bf16_value(w[r * LDW + kk]) *
								    bf16_value(xp[p * xs +
								                  pair_at(kk, j)]);
								want += v, mag += fabs(v);
							}
							const double bound =
							    (double)(k + 1) * 0x1p-24 * mag;
							cr_assert_leq(
							    fabs(c[at] - want), bound,
							    "k %zu nr %zu np %zu (%zu, %zu, "
							    "%zu): %.9g vs %.9g",
							    k, nr, np, r, p, j, c[at], want);
						}
				/* the same bits as the row alone in a one-panel call */
				for (size_t r = 0; r < nr; r += 5)
					for (size_t p = 0; p < np; p++) {
						memcpy(one, c0 + r * LDC + p * 16,
						       16 * sizeof(float));
						ops->tile_bf16(w + r * LDW, LDW, 1, xp + p * xs, xs,
						               1, k, one, LDC);
						cr_assert_arr_eq(
						    one, c + r * LDC + p * 16, 16 * sizeof(float),
						    "k %zu nr %zu np %zu: row %zu panel "
						    "%zu differs from its own call",
						    k, nr, np, r, p);
					}
			}
	}
	moek_set_isa(MOEK_ISA_AUTO);
}

/* One-hot operands pin the layout: row r's weight at column q times token j's element q. */
Test(prefill_bf16, tile_kernel_layout)
{
	const struct moek_isa_ops *ops = avx512_or_skip();
	enum { K = 64 };
	static uint16_t w[3 * K], xp[2 * K * 16];
	float c[3 * 32];
	for (size_t q = 0; q < K; q += 7) {
		memset(w, 0, sizeof(w));
		memset(c, 0, sizeof(c));
		for (size_t r = 0; r < 3; r++)
			w[r * K + q] = 0x3f80 + (uint16_t)(r << 4); /* 1, 1.125, 1.25 */
		for (size_t p = 0; p < 2; p++)
			for (size_t kk = 0; kk < K; kk++)
				for (size_t j = 0; j < 16; j++) /* token value (p * 16 + j + 1) */
					xp[p * K * 16 + pair_at(kk, j)] =
					    kk == q
					        ? (uint16_t)(((uint32_t)0x3f80 +
					                      ((p * 16 + j) << 2))) /* distinct */
					        : 0;
		ops->tile_bf16(w, K, 3, xp, K * 16, 2, K, c, 32);
		for (size_t r = 0; r < 3; r++)
			for (size_t p = 0; p < 2; p++)
				for (size_t j = 0; j < 16; j++) {
					const double want =
					    bf16_value(w[r * K + q]) *
					    bf16_value(xp[p * K * 16 + pair_at(q, j)]);
					cr_assert_eq(c[r * 32 + p * 16 + j], (float)want,
					             "q %zu row %zu token %zu", q, r, p * 16 + j);
				}
	}
	moek_set_isa(MOEK_ISA_AUTO);
}

static uint16_t rne_bf16(float f)
{
	uint32_t b;
	memcpy(&b, &f, sizeof(b));
	if ((b & 0x7FFFFFFFu) > 0x7F800000u)
		return (uint16_t)((b >> 16) | 0x40); /* quiet NaN */
	return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1)) >> 16);
}

Test(prefill_bf16, rounding_is_nearest_even)
{
	const struct moek_isa_ops *ops = avx512_or_skip();
	enum { N = 77 };
	float x[N];
	uint16_t got[N + 1];
	uint32_t seed = 7;
	for (size_t i = 0; i < N; i++) {
		const uint32_t bits = lcg(&seed) << 8 | (lcg(&seed) & 0xFF);
		memcpy(&x[i], &bits, sizeof(bits));
		if (!isfinite(x[i]) || fabsf(x[i]) < 0x1p-120f) /* no denormal results */
			x[i] = (float)i;
	}
	x[3] = 1.0f + 0x1p-8f;     /* a tie: to even (1.0) */
	x[4] = 1.0f + 3 * 0x1p-8f; /* a tie: to even (up) */
	x[5] = 3.3895314e38f;      /* rounds to infinity */
	x[6] = NAN;
	for (size_t n = 0; n <= N; n += 11) {
		got[n] = 0xBEEF;
		ops->round_bf16(x, got, n);
		for (size_t i = 0; i < n; i++) {
			if (isnan(x[i])) {
				cr_expect((got[i] & 0x7F80) == 0x7F80 && (got[i] & 0x7F), "NaN %zu",
				          i);
				continue;
			}
			cr_expect_eq(got[i], rne_bf16(x[i]), "n %zu element %zu: %04x vs %04x", n,
			             i, got[i], rne_bf16(x[i]));
		}
		cr_expect_eq(got[n], 0xBEEF, "n %zu: wrote past the end", n);
	}
	moek_set_isa(MOEK_ISA_AUTO);
}

struct ffn_case {
	uint32_t format, down_format;
	size_t hidden, ffn;
	double max_nmse; /* vs the scalar reference: test_ffn's bound for the format */
};

/* The FFN of f on n tokens (seed) on the avx512 ISA with `kernel` as its bf16 tiles: its
 * nmse against the scalar reference; the call must take the bf16 tiles. */
static double ffn_nmse(struct fixture *f, const struct ffn_case *fc, size_t n, uint32_t seed,
                       moek_tile_bf16_fn kernel)
{
	float *x = fixture_tokens(n, fc->hidden, seed);
	cr_assert_eq(moek_set_isa(MOEK_ISA_SCALAR), 0);
	float *ref = fixture_run(f, x, n, NULL);
	cr_assert_eq(moek_set_isa(MOEK_ISA_AVX512), 0);
	const moek_tile_bf16_fn own = moek_avx512_ops.tile_bf16;
	moek_avx512_ops.tile_bf16 = kernel;
	struct moek_ffn_call call = {.expert = &f->expert, .n_tokens = n};
	const size_t bytes = moek_ffn_scratch_bytes(&f->expert, n, 1);
	void *scratch = malloc(bytes);
	float *out = calloc(n * fc->hidden, sizeof(float));
	cr_assert(scratch && out);
	call.x = x, call.out = out, call.scratch = scratch;
	call.scratch_bytes = bytes, call.n_workers = 1;
	char err[200];
	const int rc = moek_ffn_run(&call, err, sizeof(err));
	moek_avx512_ops.tile_bf16 = own;
	cr_assert_eq(rc, 0, "%s", err);
	cr_expect_eq(moek_ffn_call_path(&call), MOEK_PATH_TILES_BF16,
	             "%s n=%zu: not on the bf16 tiles", moek_format_lookup(fc->format)->name, n);
	const double e = nmse_f(out, ref, n * fc->hidden);
	free(out), free(scratch), free(ref), free(x);
	return e;
}

/* The FFN on the bf16 tiles from their first token count to 512 (4 token chunks, a partial
 * panel) within the format's bound against the scalar reference; the path is the bf16
 * tiles. */
Test(prefill_bf16, ffn_matches_the_reference)
{
	avx512_or_skip();
	static const struct ffn_case cases[] = {
	    {MOEK_BF16, 0, 320, 200, 1e-5},
	    {MOEK_F16, 0, 320, 200, 3e-5},
	    {MOEK_Q8_0, 0, 320, 224, 5e-4},
	    {MOEK_Q4_0, 0, 320, 224, 5e-4},
	    {MOEK_MXFP4, 0, 320, 224, 5e-4},
	    {MOEK_Q4_K, MOEK_Q6_K, 512, 256, 1e-3},
	    {MOEK_IQ4_XS, 0, 512, 256, 1e-3},
	    {MOEK_Q2_K, MOEK_Q3_K, 512, 256, 1e-3},
	    {MOEK_INT4_G32, 0, 320, 224, 5e-4},
	    {MOEK_NVFP4, 0, 320, 256, 5e-4},
	    {MOEK_Q5_K, MOEK_IQ4_NL, 256, 288, 1e-3},
	    {MOEK_Q8_0, MOEK_F32, 320, 224, 5e-4}, /* f32 tiles for down */
	};
	static const size_t counts[] = {MOEK_PREFILL_MIN_TOKENS_BF16, 41, 512}; /* the largest */
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		const struct ffn_case *fc = &cases[ci];
		struct fixture f;
		fixture_init(&f, fc->format, fc->down_format, fc->hidden, fc->ffn, MOEK_SWIGLU, 1,
		             fc->format + 31);
		const char *name = moek_format_lookup(fc->format)->name;
		for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
			const size_t n = counts[i];
			if (n == 512 && ci % 3) /* the long call for a third of the cases */
				continue;
			const double e =
			    ffn_nmse(&f, fc, n, (uint32_t)(n + ci), moek_avx512_ops.tile_bf16);
			cr_expect_lt(e, fc->max_nmse, "%s n=%zu: nmse %.3g against the reference",
			             name, n, e);
			cr_log_info("%-8s n=%-3zu bf16 tiles vs scalar nmse %.3g", name, n, e);
		}
		fixture_free(&f);
	}
	moek_set_isa(MOEK_ISA_AUTO);
}

/* The FFN with the AMX tile kernel's model (moek_amx_tile_bf16_emulated: the AMX kernel's
 * loops, tile configs and addressing, the tile instructions modelled in C) in place of
 * vdpbf16ps: how ffn.c calls the bf16 tiles (row counts, k steps, panel strides) suits the
 * AMX kernel, on any CPU with the avx512 ISA, within the same bounds. */
Test(prefill_bf16, ffn_on_the_amx_tile_model)
{
	avx512_or_skip();
	static const struct ffn_case cases[] = {
	    {MOEK_BF16, 0, 320, 200, 1e-5},
	    {MOEK_Q4_K, MOEK_Q6_K, 512, 256, 1e-3},
	    {MOEK_Q8_0, MOEK_F32, 320, 224, 5e-4},
	};
	static const size_t counts[] = {MOEK_PREFILL_MIN_TOKENS_BF16, 41, 300};
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		const struct ffn_case *fc = &cases[ci];
		struct fixture f;
		fixture_init(&f, fc->format, fc->down_format, fc->hidden, fc->ffn, MOEK_SWIGLU, 1,
		             fc->format + 77);
		for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
			const size_t n = counts[i];
			const double e = ffn_nmse(&f, fc, n, (uint32_t)(n + 3 * ci),
			                          moek_amx_tile_bf16_emulated);
			cr_expect_lt(e, fc->max_nmse, "%s n=%zu: nmse %.3g on the AMX model",
			             moek_format_lookup(fc->format)->name, n, e);
		}
		fixture_free(&f);
	}
	moek_set_isa(MOEK_ISA_AUTO);
}
