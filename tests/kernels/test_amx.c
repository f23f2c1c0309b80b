/* test_amx.c — the AMX prefill micro-kernels (x86_amx_tile.h), BF16 (tdpbf16ps) and Q8_0
 * (tdpbssd). BF16: the emulated backend (moek_amx_tile_bf16_emulated, every CPU) gives, bit for
 * bit, the scalar reference below — the contract's sum (kernels_internal.h) taken in
 * TDPBF16PS's order as the Intel SDM writes it — for every row count across the 32-row groups'
 * edges (1..40), 1..5 panels, k from one step to 2880, weight rows, panels and sums with gaps
 * between them, into sums that are not zero; it reads no weight column past k and no panel
 * element between panels, writes nothing past the panels and rows it owns; a split of the rows
 * or panels between calls gives the same bits; and the model keeps the instruction's DAZ / FTZ.
 * The hardware backend (moek_amx_tile_bf16) runs the same cases where the CPU and the OS let
 * this process use AMX, held to a tolerance (the hardware may add a step's 32 products in
 * another order) and to its own bits across splits. Q8_0: both backends give the reference's
 * bits (exact integer dots, the same scaling), over the same shapes. Without AMX the hardware
 * tests are skipped.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng_state >> 33);
}
static float uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)(rng() & 0xffffff) / (float)0x1000000;
}

static float bf16_value(uint16_t h)
{
	const uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, sizeof(f));
	return f;
}
static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

/* Fillers the kernel must never read (a NaN would reach a sum) or write (checked by bits) */
#define PAD_BF16 ((uint16_t)0x7fc1)
#define GUARD_BITS 0x7fc0deadu

/* One call's shape: ldw - k weight columns, xp_stride - 16 k panel elements, ldc - 16 np sum
 * columns of padding */
struct tile_case {
	size_t nr, np, k, ldw, xp_stride, ldc;
};

/* Operands of a case: bf16 weights, the tokens' bf16 values (token t = 16 p + j, row-major,
 * k apart) and their panels, the sums' starting values. Allocated to the byte the kernel may
 * touch (the sanitizer builds see one past), with the padding filled. */
struct tile_data {
	struct tile_case tc;
	uint16_t *w, *x, *xp;
	float *c0;
};

static void data_make(struct tile_data *d, const struct tile_case *tc)
{
	const size_t nt = tc->np * 16, k = tc->k;
	d->tc = *tc;
	d->w = malloc(sizeof(uint16_t) * tc->nr * tc->ldw);
	d->x = malloc(sizeof(uint16_t) * nt * k);
	d->xp = malloc(sizeof(uint16_t) * ((tc->np - 1) * tc->xp_stride + 16 * k));
	d->c0 = malloc(sizeof(float) * tc->nr * tc->ldc);
	cr_assert(d->w && d->x && d->xp && d->c0);
	for (size_t r = 0; r < tc->nr; r++)
		for (size_t i = 0; i < tc->ldw; i++)
			d->w[r * tc->ldw + i] =
			    i < k ? moek_f32_to_bf16(uniform(-1.0f, 1.0f)) : PAD_BF16;
	for (size_t i = 0; i < nt * k; i++)
		d->x[i] = moek_f32_to_bf16(uniform(-2.0f, 2.0f));
	for (size_t i = 0; i < (tc->np - 1) * tc->xp_stride + 16 * k; i++)
		d->xp[i] = PAD_BF16;
	/* the contract's layout: element (k, j) of panel p at p * stride + (k/2) * 32 + 2j + k%2 */
	for (size_t p = 0; p < tc->np; p++)
		for (size_t j = 0; j < 16; j++)
			for (size_t kk = 0; kk < k; kk++)
				d->xp[p * tc->xp_stride + kk / 2 * 32 + j * 2 + kk % 2] =
				    d->x[(p * 16 + j) * k + kk];
	for (size_t r = 0; r < tc->nr; r++)
		for (size_t i = 0; i < tc->ldc; i++) {
			const uint32_t guard = GUARD_BITS;
			if (i < tc->np * 16)
				d->c0[r * tc->ldc + i] = uniform(-4.0f, 4.0f);
			else
				memcpy(&d->c0[r * tc->ldc + i], &guard, sizeof(float));
		}
}

static void data_free(struct tile_data *d)
{
	free(d->w), free(d->x), free(d->xp), free(d->c0);
}

/* The reference: per 32-column step, the even and the odd products of its 16 pairs summed
 * apart from zero in k order, then their sum added to the row's sum (TDPBF16PS in the SDM).
 * Products of two bf16 values are exact in f32, so this is the model's arithmetic without
 * its DAZ / FTZ, which these operands never reach. */
static void reference(const struct tile_data *d, float *c)
{
	const struct tile_case *tc = &d->tc;
	memcpy(c, d->c0, sizeof(float) * tc->nr * tc->ldc);
	for (size_t r = 0; r < tc->nr; r++)
		for (size_t t = 0; t < tc->np * 16; t++) {
			const uint16_t *w = d->w + r * tc->ldw, *x = d->x + t * tc->k;
			float acc = c[r * tc->ldc + t];
			for (size_t s = 0; s < tc->k; s += 32) {
				float even = 0.0f, odd = 0.0f;
				for (size_t i = s; i < s + 32; i += 2) {
					even += bf16_value(w[i]) * bf16_value(x[i]);
					odd += bf16_value(w[i + 1]) * bf16_value(x[i + 1]);
				}
				acc += even + odd;
			}
			c[r * tc->ldc + t] = acc;
		}
}

static float *run(moek_tile_bf16_fn fn, const struct tile_data *d)
{
	const struct tile_case *tc = &d->tc;
	float *c = malloc(sizeof(float) * tc->nr * tc->ldc);
	cr_assert(c);
	memcpy(c, d->c0, sizeof(float) * tc->nr * tc->ldc);
	fn(d->w, tc->ldw, tc->nr, d->xp, tc->xp_stride, tc->np, tc->k, c, tc->ldc);
	return c;
}

static const char *describe(const struct tile_case *tc)
{
	static char buf[128];
	snprintf(buf, sizeof(buf), "nr=%zu np=%zu k=%zu ldw=%zu xp_stride=%zu ldc=%zu", tc->nr,
	         tc->np, tc->k, tc->ldw, tc->xp_stride, tc->ldc);
	return buf;
}

/* The padding columns of c kept their guard bits */
static void check_guards(const struct tile_case *tc, const float *c)
{
	for (size_t r = 0; r < tc->nr; r++)
		for (size_t i = tc->np * 16; i < tc->ldc; i++)
			cr_assert_eq(f32_bits(c[r * tc->ldc + i]), GUARD_BITS,
			             "%s: c[%zu][%zu] written", describe(tc), r, i);
}

/* Bits of the reference (exact: the emulated backend) or within `tol` of |terms| (hardware) */
static void check_against_reference(const struct tile_data *d, const float *got, bool exact)
{
	const struct tile_case *tc = &d->tc;
	float *want = malloc(sizeof(float) * tc->nr * tc->ldc);
	cr_assert(want);
	reference(d, want);
	check_guards(tc, got);
	for (size_t r = 0; r < tc->nr; r++)
		for (size_t t = 0; t < tc->np * 16; t++) {
			const float g = got[r * tc->ldc + t], e = want[r * tc->ldc + t];
			if (exact) {
				cr_assert_eq(f32_bits(g), f32_bits(e),
				             "%s: c[%zu][%zu] %.9g, want %.9g", describe(tc), r, t,
				             (double)g, (double)e);
				continue;
			}
			double magnitude = fabs(d->c0[r * tc->ldc + t]);
			for (size_t i = 0; i < tc->k; i++)
				magnitude += fabs((double)bf16_value(d->w[r * tc->ldw + i]) *
				                  bf16_value(d->x[t * tc->k + i]));
			cr_assert(isfinite(g) && fabs((double)g - e) <= 1e-6 * magnitude + 1e-30,
			          "%s: c[%zu][%zu] %.9g, reference %.9g", describe(tc), r, t,
			          (double)g, (double)e);
		}
	free(want);
}

/* The reference itself against the double sum of the same bf16 operands (so that bits of the
 * reference are worth matching): within f32's accumulation error of the terms' magnitude. */
Test(amx_tile, reference_is_the_contract)
{
	const struct tile_case tc = {
	    .nr = 5, .np = 2, .k = 2880, .ldw = 2880, .xp_stride = 2880 * 16, .ldc = 32};
	struct tile_data d;
	data_make(&d, &tc);
	float *c = malloc(sizeof(float) * tc.nr * tc.ldc);
	cr_assert(c);
	reference(&d, c);
	for (size_t r = 0; r < tc.nr; r++)
		for (size_t t = 0; t < tc.np * 16; t++) {
			double exact = d.c0[r * tc.ldc + t], magnitude = fabs(exact);
			for (size_t i = 0; i < tc.k; i++) {
				/* the token's value read back from its panel: the layout as written
				 */
				const size_t p = t / 16, j = t % 16;
				const double term =
				    (double)bf16_value(d.w[r * tc.ldw + i]) *
				    bf16_value(d.xp[p * tc.xp_stride + i / 2 * 32 + j * 2 + i % 2]);
				exact += term, magnitude += fabs(term);
			}
			cr_assert(fabs(c[r * tc.ldc + t] - exact) <= 1e-6 * magnitude,
			          "c[%zu][%zu] %.9g vs exact %.9g", r, t, (double)c[r * tc.ldc + t],
			          exact);
		}
	free(c);
	data_free(&d);
}

static bool amx_available(void)
{
	return (moek_cpu_features() & MOEK_CPU_AMX) != 0;
}

/* Each case through `fn` against the reference, and split between calls against itself */
static void check_split(moek_tile_bf16_fn fn, const struct tile_data *d, const float *whole);

static void check_case(moek_tile_bf16_fn fn, const struct tile_case *tc, bool exact, bool split)
{
	struct tile_data d;
	data_make(&d, tc);
	float *c = run(fn, &d);
	check_against_reference(&d, c, exact);
	if (split)
		check_split(fn, &d, c);
	free(c);
	data_free(&d);
}

/* The rows cut at `rcut` and the panels at `pcut` (four calls, the empty ones too): the same
 * bits as the whole call */
static void check_split_at(moek_tile_bf16_fn fn, const struct tile_data *d, const float *whole,
                           size_t rcut, size_t pcut)
{
	const struct tile_case *tc = &d->tc;
	float *c = malloc(sizeof(float) * tc->nr * tc->ldc);
	cr_assert(c);
	memcpy(c, d->c0, sizeof(float) * tc->nr * tc->ldc);
	const size_t r0[2] = {0, rcut}, rn[2] = {rcut, tc->nr - rcut};
	const size_t p0[2] = {0, pcut}, pn[2] = {pcut, tc->np - pcut};
	for (int i = 0; i < 2; i++)
		for (int q = 0; q < 2; q++) {
			if (rn[i] == 0 || pn[q] == 0)
				continue;
			fn(d->w + r0[i] * tc->ldw, tc->ldw, rn[i], d->xp + p0[q] * tc->xp_stride,
			   tc->xp_stride, pn[q], tc->k, c + r0[i] * tc->ldc + p0[q] * 16, tc->ldc);
		}
	for (size_t r = 0; r < tc->nr; r++)
		for (size_t t = 0; t < tc->ldc; t++)
			cr_assert_eq(f32_bits(c[r * tc->ldc + t]), f32_bits(whole[r * tc->ldc + t]),
			             "%s cut at row %zu, panel %zu: c[%zu][%zu] %.9g, whole %.9g",
			             describe(tc), rcut, pcut, r, t, (double)c[r * tc->ldc + t],
			             (double)whole[r * tc->ldc + t]);
	free(c);
}

static void check_split(moek_tile_bf16_fn fn, const struct tile_data *d, const float *whole)
{
	const struct tile_case *tc = &d->tc;
	const size_t rcuts[] = {1, 7, 16, 17, 31};
	for (size_t i = 0; i < sizeof(rcuts) / sizeof(rcuts[0]); i++)
		if (rcuts[i] < tc->nr)
			check_split_at(fn, d, whole, rcuts[i], tc->np / 2);
	check_split_at(fn, d, whole, tc->nr / 2, tc->np > 1 ? 1 : 0);
}

/* Row counts across the edges of the 16-row tiles and the 32-row groups, 1..5 panels, one to
 * three k steps; every other case with gaps after rows, panels and sums */
static void edges(moek_tile_bf16_fn fn, bool exact)
{
	const size_t ks[] = {32, 64, 96};
	for (size_t ki = 0; ki < 3; ki++)
		for (size_t nr = 1; nr <= 40; nr++)
			for (size_t np = 1; np <= 5; np++) {
				const size_t k = ks[ki], gap = (nr + np) % 2;
				const struct tile_case tc = {
				    .nr = nr,
				    .np = np,
				    .k = k,
				    .ldw = k + gap * 40,
				    .xp_stride = 16 * k + gap * 48,
				    .ldc = np * 16 + gap * 5,
				};
				check_case(fn, &tc, exact, nr % 8 == 1 || nr >= 31);
			}
}

/* Long rows: 2048 (k steps of whole tiles) and 2880 (gpt-oss' hidden size, a multiple of 32) */
static void long_rows(moek_tile_bf16_fn fn, bool exact)
{
	const size_t ks[] = {2048, 2880}, nrs[] = {1, 16, 33}, nps[] = {1, 2, 3};
	for (size_t ki = 0; ki < 2; ki++)
		for (size_t ri = 0; ri < 3; ri++)
			for (size_t pi = 0; pi < 3; pi++) {
				const size_t k = ks[ki];
				const struct tile_case tc = {
				    .nr = nrs[ri],
				    .np = nps[pi],
				    .k = k,
				    .ldw = k + 64 * pi,
				    .xp_stride = 16 * k + 32 * ri,
				    .ldc = nps[pi] * 16 + 3 * ki,
				};
				check_case(fn, &tc, exact, ri == 2);
			}
}

Test(amx_tile, emulated_edges)
{
	edges(moek_amx_tile_bf16_emulated, true);
}

Test(amx_tile, emulated_long_rows)
{
	long_rows(moek_amx_tile_bf16_emulated, true);
}

/* k = 0 and nr = 0 / np = 0 leave c alone (nothing to add; no tile touched) */
static void empty_calls(moek_tile_bf16_fn fn)
{
	float c[16] = {1.5f};
	const uint16_t w[32] = {0}, xp[16 * 32] = {0};
	fn(w, 32, 1, xp, 16 * 32, 1, 0, c, 16);
	fn(w, 32, 0, xp, 16 * 32, 1, 32, c, 16);
	fn(w, 32, 1, xp, 16 * 32, 0, 32, c, 16);
	cr_assert_eq(c[0], 1.5f);
	for (size_t j = 1; j < 16; j++)
		cr_assert_eq(f32_bits(c[j]), 0u);
}

Test(amx_tile, emulated_empty_calls)
{
	empty_calls(moek_amx_tile_bf16_emulated);
}

/* TDPBF16PS's DAZ and FTZ (SDM: input denormals are treated as zero, output denormals are
 * flushed), MXCSR aside: a denormal bf16 weight contributes nothing even against a huge
 * activation, and a product below f32's normal range leaves the sum at zero. Row 0: w[0] =
 * 2^-130 (bf16 0x0010, denormal) times 2^100; row 1: w[0] = 2^-70 times 2^-70 = 2^-140; row 2:
 * a normal product (2^-3 · 2^2) as a control. */
static void denormals(moek_tile_bf16_fn fn)
{
	enum { K = 32 };
	uint16_t w[3 * K] = {0}, xp[16 * K] = {0};
	w[0 * K] = 0x0010;                     /* 2^-130 */
	w[1 * K] = moek_f32_to_bf16(0x1p-70f); /* normal */
	w[2 * K] = moek_f32_to_bf16(0x1p-3f);
	/* token 0, k = 0: element 0 of the panel */
	float c[3 * 16] = {0};
	xp[0] = moek_f32_to_bf16(0x1p100f);
	fn(w, K, 1, xp, 16 * K, 1, K, c, 16);
	cr_assert_eq(f32_bits(c[0]), 0u, "denormal weight: %a, want 0 (DAZ)", (double)c[0]);
	xp[0] = moek_f32_to_bf16(0x1p-70f);
	fn(w + K, K, 1, xp, 16 * K, 1, K, c + 16, 16);
	cr_assert_eq(f32_bits(c[16]), 0u, "2^-140: %a, want 0 (FTZ)", (double)c[16]);
	xp[0] = moek_f32_to_bf16(0x1p2f);
	fn(w + 2 * K, K, 1, xp, 16 * K, 1, K, c + 32, 16);
	cr_assert_eq(c[32], 0.5f, "2^-3 * 2^2: %a", (double)c[32]);
}

Test(amx_tile, emulated_denormals)
{
	denormals(moek_amx_tile_bf16_emulated);
}

#if defined(__x86_64__)
Test(amx_tile, hardware_edges)
{
	if (!amx_available())
		cr_skip_test("skipped: no amx");
	edges(moek_amx_tile_bf16, false);
}

Test(amx_tile, hardware_long_rows)
{
	if (!amx_available())
		cr_skip_test("skipped: no amx");
	long_rows(moek_amx_tile_bf16, false);
}

Test(amx_tile, hardware_empty_calls)
{
	if (!amx_available())
		cr_skip_test("skipped: no amx");
	empty_calls(moek_amx_tile_bf16);
}

Test(amx_tile, hardware_denormals)
{
	if (!amx_available())
		cr_skip_test("skipped: no amx");
	denormals(moek_amx_tile_bf16);
}

/* How far the hardware's sums are from the model's bits, for whoever reads the log on an AMX
 * machine: the fraction of sums that match exactly (1.0 would mean the SDM's order is the
 * hardware's). Not asserted: the order is the hardware's own. */
Test(amx_tile, hardware_against_model)
{
	if (!amx_available())
		cr_skip_test("skipped: no amx");
	const struct tile_case tc = {
	    .nr = 40, .np = 3, .k = 2880, .ldw = 2880, .xp_stride = 2880 * 16, .ldc = 48};
	struct tile_data d;
	data_make(&d, &tc);
	float *hw = run(moek_amx_tile_bf16, &d), *emu = run(moek_amx_tile_bf16_emulated, &d);
	size_t same = 0;
	for (size_t i = 0; i < tc.nr * tc.ldc; i++)
		same += f32_bits(hw[i]) == f32_bits(emu[i]);
	cr_log_info("amx hardware vs model: %zu of %zu sums bit-identical", same, tc.nr * tc.ldc);
	free(hw), free(emu);
	data_free(&d);
}
#endif

/* ---- Q8_0 (tdpbssd) -------------------------------------------------------------------------
 * Codes over the whole int8 range (-128 included), f16 weight scales, f32 token scales; the
 * reference's formula is the contract's, so both backends must give its bits: integer dots are
 * exact, the scaling is the same C on both. */

/* ldw and xp_stride in bytes */
struct q8_case {
	size_t nr, np, k, ldw, xp_stride, ldc;
};

struct q8_data {
	struct q8_case qc;
	uint8_t *w, *xp; /* Q8_0 rows (padding 0xff), panels (padding 0xff: NaN scales) */
	int8_t *xq;      /* token t's codes, k apart */
	float *xd;       /* token t's block scales, k / 32 apart */
	float *c0;
};

static void q8_make(struct q8_data *d, const struct q8_case *qc)
{
	const size_t nt = qc->np * 16, k = qc->k, nb = k / 32;
	const size_t xp_bytes =
	    (qc->np - 1) * qc->xp_stride + nb * sizeof(struct moek_q8_panel_block);
	d->qc = *qc;
	d->w = malloc(qc->nr * qc->ldw);
	d->xp = malloc(xp_bytes);
	d->xq = malloc(nt * k);
	d->xd = malloc(sizeof(float) * nt * nb);
	d->c0 = malloc(sizeof(float) * qc->nr * qc->ldc);
	cr_assert(d->w && d->xp && d->xq && d->xd && d->c0);
	memset(d->w, 0xff, qc->nr * qc->ldw);
	for (size_t r = 0; r < qc->nr; r++)
		for (size_t b = 0; b < nb; b++) {
			struct block_q8_0 blk;
			blk.d = moek_f32_to_f16(uniform(0.001f, 0.02f));
			for (size_t i = 0; i < 32; i++)
				blk.qs[i] = (int8_t)(rng() & 0xff);
			memcpy(d->w + r * qc->ldw + b * sizeof(blk), &blk, sizeof(blk));
		}
	for (size_t i = 0; i < nt * k; i++)
		d->xq[i] = (int8_t)(rng() & 0xff);
	for (size_t i = 0; i < nt * nb; i++)
		d->xd[i] = uniform(0.001f, 0.05f);
	memset(d->xp, 0xff, xp_bytes);
	for (size_t p = 0; p < qc->np; p++)
		for (size_t b = 0; b < nb; b++) {
			struct moek_q8_panel_block pb;
			for (size_t j = 0; j < 16; j++) {
				pb.d[j] = d->xd[(p * 16 + j) * nb + b];
				for (size_t i = 0; i < 32; i++)
					pb.qs[i / 4 * 64 + j * 4 + i % 4] =
					    d->xq[(p * 16 + j) * k + b * 32 + i];
			}
			memcpy(d->xp + p * qc->xp_stride + b * sizeof(pb), &pb, sizeof(pb));
		}
	for (size_t r = 0; r < qc->nr; r++)
		for (size_t i = 0; i < qc->ldc; i++) {
			const uint32_t guard = GUARD_BITS;
			if (i < qc->np * 16)
				d->c0[r * qc->ldc + i] = uniform(-4.0f, 4.0f);
			else
				memcpy(&d->c0[r * qc->ldc + i], &guard, sizeof(float));
		}
}

static void q8_free(struct q8_data *d)
{
	free(d->w), free(d->xp), free(d->xq), free(d->xd), free(d->c0);
}

static void q8_reference(const struct q8_data *d, float *c)
{
	const struct q8_case *qc = &d->qc;
	const size_t nb = qc->k / 32;
	memcpy(c, d->c0, sizeof(float) * qc->nr * qc->ldc);
	for (size_t r = 0; r < qc->nr; r++)
		for (size_t t = 0; t < qc->np * 16; t++) {
			float acc = c[r * qc->ldc + t];
			for (size_t b = 0; b < nb; b++) {
				struct block_q8_0 blk;
				memcpy(&blk, d->w + r * qc->ldw + b * sizeof(blk), sizeof(blk));
				int32_t dot = 0;
				for (size_t i = 0; i < 32; i++)
					dot += blk.qs[i] * d->xq[t * qc->k + b * 32 + i];
				const float dw = moek_f16_to_f32(blk.d), dx = d->xd[t * nb + b];
				acc = acc + dw * dx * (float)dot;
			}
			c[r * qc->ldc + t] = acc;
		}
}

typedef void (*q8_fn)(const void *w, size_t ldw, size_t nr, const void *xp, size_t xp_stride,
                      size_t np, size_t k, float *c, size_t ldc);

static const char *q8_describe(const struct q8_case *qc)
{
	static char buf[128];
	snprintf(buf, sizeof(buf), "q8_0 nr=%zu np=%zu k=%zu ldw=%zu xp_stride=%zu ldc=%zu", qc->nr,
	         qc->np, qc->k, qc->ldw, qc->xp_stride, qc->ldc);
	return buf;
}

/* The whole call, then the rows and panels cut in four calls: the reference's bits both times */
static void q8_check_case(q8_fn fn, const struct q8_case *qc, size_t rcut, size_t pcut)
{
	struct q8_data d;
	q8_make(&d, qc);
	const size_t n = qc->nr * qc->ldc;
	float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
	cr_assert(want && got);
	q8_reference(&d, want);
	for (int split = 0; split < 2; split++) {
		memcpy(got, d.c0, sizeof(float) * n);
		const size_t rc = split ? rcut : qc->nr, pc = split ? pcut : qc->np;
		const size_t r0[2] = {0, rc}, rn[2] = {rc, qc->nr - rc};
		const size_t p0[2] = {0, pc}, pn[2] = {pc, qc->np - pc};
		for (int i = 0; i < 2; i++)
			for (int q = 0; q < 2; q++)
				if (rn[i] && pn[q])
					fn(d.w + r0[i] * qc->ldw, qc->ldw, rn[i],
					   d.xp + p0[q] * qc->xp_stride, qc->xp_stride, pn[q],
					   qc->k, got + r0[i] * qc->ldc + p0[q] * 16, qc->ldc);
		for (size_t r = 0; r < qc->nr; r++)
			for (size_t t = 0; t < qc->ldc; t++)
				cr_assert_eq(
				    f32_bits(got[r * qc->ldc + t]), f32_bits(want[r * qc->ldc + t]),
				    "%s (cut at row %zu, panel %zu): c[%zu][%zu] %.9g, want %.9g",
				    q8_describe(qc), rc, pc, r, t, (double)got[r * qc->ldc + t],
				    (double)want[r * qc->ldc + t]);
	}
	free(want), free(got);
	q8_free(&d);
}

static void q8_edges(q8_fn fn)
{
	const size_t ks[] = {32, 64, 96};
	for (size_t ki = 0; ki < 3; ki++)
		for (size_t nr = 1; nr <= 40; nr++)
			for (size_t np = 1; np <= 5; np++) {
				const size_t k = ks[ki], nb = k / 32, gap = (nr + np) % 2;
				const struct q8_case qc = {
				    .nr = nr,
				    .np = np,
				    .k = k,
				    .ldw = nb * sizeof(struct block_q8_0) + gap * 6,
				    .xp_stride = nb * sizeof(struct moek_q8_panel_block) + gap * 64,
				    .ldc = np * 16 + gap * 3,
				};
				q8_check_case(fn, &qc, nr / 3, np / 2);
			}
}

static void q8_long_rows(q8_fn fn)
{
	const size_t ks[] = {2048, 2880}, nrs[] = {1, 16, 33}, nps[] = {1, 2, 3};
	for (size_t ki = 0; ki < 2; ki++)
		for (size_t ri = 0; ri < 3; ri++)
			for (size_t pi = 0; pi < 3; pi++) {
				const size_t k = ks[ki], nb = k / 32;
				const struct q8_case qc = {
				    .nr = nrs[ri],
				    .np = nps[pi],
				    .k = k,
				    .ldw = nb * sizeof(struct block_q8_0) + 34 * pi,
				    .xp_stride = nb * sizeof(struct moek_q8_panel_block) + 4 * ri,
				    .ldc = nps[pi] * 16 + ki,
				};
				q8_check_case(fn, &qc, nrs[ri] / 2, nps[pi] - 1);
			}
}

Test(amx_q8_0, emulated_edges)
{
	q8_edges(moek_amx_tile_q8_0_emulated);
}

Test(amx_q8_0, emulated_long_rows)
{
	q8_long_rows(moek_amx_tile_q8_0_emulated);
}

#if defined(__x86_64__)
Test(amx_q8_0, hardware_edges)
{
	if (!amx_available())
		cr_skip_test("skipped: no amx");
	q8_edges(moek_amx_tile_q8_0);
}

Test(amx_q8_0, hardware_long_rows)
{
	if (!amx_available())
		cr_skip_test("skipped: no amx");
	q8_long_rows(moek_amx_tile_q8_0);
}
#endif
