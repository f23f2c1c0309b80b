/* test_iquants.c — ggml's lattice i-quants IQ2_XXS, IQ2_XS, IQ3_XXS, IQ3_S, IQ1_S (fmt_iq.c,
 * iq_grids.c,
 * x86_avx2_iq.c):
 * - the codebooks and sign table are ggml's: sizes, entries read off ggml-common.h, byte
 *   values, strict order, and a checksum of each table (a transcription slip fails one);
 * - golden blocks: bytes built by hand decode to the floats the format's formula gives;
 * - random blocks decode bit for bit as this file's own decoder, written from ggml's
 *   dequantize_row_iq2_* (and as the reference dot's integer sums say);
 * - the quantizers' round trip error stays within a budget;
 * - the AVX2 dots give the scalar reference dot's bits for 1..8 tokens, their many-row entry
 *   the single-row bits, and both match the exact dot of the dequantized operands.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

static uint32_t rng_state = 2024u;
static uint32_t rng(void)
{
	rng_state = rng_state * 1664525u + 1013904223u;
	return rng_state >> 8;
}
static float uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)(rng() & 0xffffff) * 0x1p-24f;
}

static uint64_t fnv(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

static void check_grid(const uint64_t *g, size_t n, const char *name)
{
	for (size_t e = 0; e < n; e++) {
		for (int j = 0; j < 8; j++) {
			const uint8_t v = (uint8_t)(g[e] >> (8 * j));
			cr_assert(v == 0x08 || v == 0x19 || v == 0x2b, "%s[%zu] byte %d: %#x", name,
			          e, j, v);
		}
		if (e)
			cr_assert(g[e - 1] < g[e], "%s: entries %zu, %zu out of order", name, e - 1,
			          e);
	}
}

Test(iquants, tables_are_ggmls)
{
	check_grid(moek_iq2xxs_grid, 256, "iq2xxs_grid");
	check_grid(moek_iq2xs_grid, 512, "iq2xs_grid");
	check_grid(moek_iq2s_grid, 1024, "iq2s_grid");
	cr_assert_eq(moek_iq2s_grid[9], 0x08080808082b0808ull);
	cr_assert_eq(moek_iq2s_grid[237], 0x0819081908080808ull);
	cr_assert_eq(moek_iq2s_grid[1023], 0x2b2b2b2b2b2b2b2bull);
	cr_assert_eq(fnv(moek_iq2s_grid, sizeof(moek_iq2s_grid)), 0xcdb5ae5bcfe7fb32ull);
	/* entries as ggml-common.h lists them */
	cr_assert_eq(moek_iq2xxs_grid[0], 0x0808080808080808ull);
	cr_assert_eq(moek_iq2xxs_grid[3], 0x0808080808082b08ull);
	cr_assert_eq(moek_iq2xxs_grid[17], 0x080808082b080808ull);
	cr_assert_eq(moek_iq2xxs_grid[252], 0x2b2b082b08080808ull);
	cr_assert_eq(moek_iq2xxs_grid[255], 0x2b2b2b1908081908ull);
	cr_assert_eq(moek_iq2xs_grid[0], 0x0808080808080808ull);
	cr_assert_eq(moek_iq2xs_grid[7], 0x080808080819192bull);
	cr_assert_eq(moek_iq2xs_grid[23], 0x080808082b080808ull);
	cr_assert_eq(moek_iq2xs_grid[508], 0x2b2b2b2b082b2b08ull);
	cr_assert_eq(moek_iq2xs_grid[511], 0x2b2b2b2b2b2b2b2bull);
	static const uint8_t ks_head[16] = {0,   129, 130, 3,   132, 5,   6,   135,
	                                    136, 9,   10,  139, 12,  141, 142, 15};
	cr_assert(memcmp(moek_ksigns_iq2xs, ks_head, sizeof(ks_head)) == 0);
	for (int i = 0; i < 128; i++)
		cr_assert_eq(moek_ksigns_iq2xs[i], i | (__builtin_popcount(i) & 1) << 7,
		             "ksigns[%d]", i);
	/* checksums of the transcribed tables (FNV-1a of their bytes, little-endian) */
	cr_assert_eq(fnv(moek_iq2xxs_grid, sizeof(moek_iq2xxs_grid)), 0x5bd45ef8a547a7e8ull);
	cr_assert_eq(fnv(moek_iq2xs_grid, sizeof(moek_iq2xs_grid)), 0xa3e52388268ca2a3ull);
	/* iq3xxs_grid: 4 magnitudes per entry, each 4 + 8i (i < 7) or 62, ascending */
	for (size_t e = 0; e < 256; e++) {
		for (int j = 0; j < 4; j++) {
			const uint8_t v = (uint8_t)(moek_iq3xxs_grid[e] >> (8 * j));
			cr_assert(v == 62 || (v >= 4 && v <= 52 && v % 8 == 4), "iq3xxs_grid[%zu]",
			          e);
		}
		if (e)
			cr_assert(moek_iq3xxs_grid[e - 1] < moek_iq3xxs_grid[e], "iq3xxs_grid %zu",
			          e);
	}
	cr_assert_eq(moek_iq3xxs_grid[0], 0x04040404u);
	cr_assert_eq(moek_iq3xxs_grid[5], 0x04040c3eu);
	cr_assert_eq(moek_iq3xxs_grid[8], 0x04041c0cu);
	cr_assert_eq(moek_iq3xxs_grid[248], 0x3e1c1c1cu);
	cr_assert_eq(moek_iq3xxs_grid[255], 0x3e341c04u);
	cr_assert_eq(fnv(moek_iq3xxs_grid, sizeof(moek_iq3xxs_grid)), 0x2748ed45beb63233ull);
	/* iq3s_grid: 4 odd magnitudes 1 … 15 per entry, ascending */
	for (size_t e = 0; e < 512; e++) {
		for (int j = 0; j < 4; j++) {
			const uint8_t v = (uint8_t)(moek_iq3s_grid[e] >> (8 * j));
			cr_assert(v % 2 == 1 && v <= 15, "iq3s_grid[%zu]", e);
		}
		if (e)
			cr_assert(moek_iq3s_grid[e - 1] < moek_iq3s_grid[e], "iq3s_grid %zu", e);
	}
	cr_assert_eq(moek_iq3s_grid[0], 0x01010101u);
	cr_assert_eq(moek_iq3s_grid[7], 0x01010305u);
	cr_assert_eq(moek_iq3s_grid[21], 0x01010d05u);
	cr_assert_eq(moek_iq3s_grid[504], 0x0f090307u);
	cr_assert_eq(moek_iq3s_grid[511], 0x0f0f0101u);
	cr_assert_eq(fnv(moek_iq3s_grid, sizeof(moek_iq3s_grid)), 0x5f1781aa06d14fbfull);
	/* iq1s_grid: bytes 0xff, 0 or 1 (−1, 0, 1), ascending as base-3 numbers read from byte 7
	 * down (−1 < 0 < 1) */
	for (size_t e = 0; e < 2048; e++) {
		uint32_t key = 0, prev = 0;
		for (int j = 7; j >= 0; j--) {
			const uint8_t v = (uint8_t)(moek_iq1s_grid[e] >> (8 * j));
			cr_assert(v == 0xff || v == 0 || v == 1, "iq1s_grid[%zu]", e);
			key = 3 * key + (v == 0xff ? 0 : v + 1u);
			if (e) {
				const uint8_t p = (uint8_t)(moek_iq1s_grid[e - 1] >> (8 * j));
				prev = 3 * prev + (p == 0xff ? 0 : p + 1u);
			}
		}
		if (e)
			cr_assert(prev < key, "iq1s_grid %zu out of order", e);
	}
	cr_assert_eq(moek_iq1s_grid[0], 0xffffffffffffffffull);
	cr_assert_eq(moek_iq1s_grid[5], 0xffffffffff00ff00ull);
	cr_assert_eq(moek_iq1s_grid[100], 0xffff000000000000ull);
	cr_assert_eq(moek_iq1s_grid[1024], 0x0000000000ff0100ull);
	cr_assert_eq(moek_iq1s_grid[2047], 0x0101010101010101ull);
	cr_assert_eq(fnv(moek_iq1s_grid, sizeof(moek_iq1s_grid)), 0x31aaba1fc89a41d0ull);
}

/* ---- this file's decoder, from ggml's formulas ------------------------------------------- */

static float half(uint16_t h)
{
	return moek_f16_to_f32(h);
}

static void decode(uint32_t fmt, const uint8_t *blk, float *y)
{
	uint16_t d16;
	memcpy(&d16, blk, 2);
	const float d = half(d16);
	if (fmt == MOEK_IQ1_M) { /* d is in the scale words' top nibbles: no d16 field */
		uint16_t sc[4];
		memcpy(sc, blk + 48, 8);
		const uint16_t dm = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) |
		                               ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
		const float dd = half(dm);
		for (int ib = 0; ib < 8; ib++) {
			const float dl1 =
			    dd * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1);
			const float dl2 =
			    dd * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1);
			const uint8_t *qs = blk + 4 * ib, *qh = blk + 32 + 2 * ib;
			const int idx[4] = {
			    qs[0] | ((qh[0] << 8) & 0x700), qs[1] | ((qh[0] << 4) & 0x700),
			    qs[2] | ((qh[1] << 8) & 0x700), qs[3] | ((qh[1] << 4) & 0x700)};
			const float delta[4] = {
			    qh[0] & 0x08 ? -0.125f : 0.125f, qh[0] & 0x80 ? -0.125f : 0.125f,
			    qh[1] & 0x08 ? -0.125f : 0.125f, qh[1] & 0x80 ? -0.125f : 0.125f};
			for (int l = 0; l < 4; l++)
				for (int j = 0; j < 8; j++)
					y[32 * ib + 8 * l + j] =
					    (l < 2 ? dl1 : dl2) *
					    ((float)(int8_t)(moek_iq1s_grid[idx[l]] >> (8 * j)) +
					     delta[l]);
		}
		return;
	}
	if (fmt == MOEK_IQ1_S) {
		for (int ib = 0; ib < 8; ib++) {
			uint16_t qh;
			memcpy(&qh, blk + 2 + 32 + 2 * ib, 2);
			const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
			const float delta = qh & 0x8000 ? -0.125f : 0.125f;
			for (int l = 0; l < 4; l++) {
				const uint64_t e = moek_iq1s_grid[blk[2 + 4 * ib + l] |
				                                  ((qh >> (3 * l)) & 7) << 8];
				for (int j = 0; j < 8; j++)
					y[32 * ib + 8 * l + j] =
					    dl * ((float)(int8_t)(e >> (8 * j)) + delta);
			}
		}
		return;
	}
	for (int ib = 0; ib < 8; ib++) {
		for (int l = 0; l < 4; l++) {
			uint64_t entry;
			uint8_t signs;
			float db;
			if (fmt == MOEK_IQ2_S) {
				const uint8_t qh = blk[2 + 64 + ib], sc = blk[2 + 64 + 8 + ib];
				db = d * (0.5f + (float)(l < 2 ? sc & 15 : sc >> 4)) * 0.25f;
				entry = moek_iq2s_grid[blk[2 + 4 * ib + l] |
				                       ((qh << (8 - 2 * l)) & 0x300)];
				signs = blk[2 + 32 + 4 * ib + l];
			} else if (fmt == MOEK_IQ3_S) {
				const uint8_t *q = blk + 2 + 8 * ib, qh = blk[2 + 64 + ib];
				const uint8_t sc = blk[2 + 64 + 8 + 32 + ib / 2];
				db = d * (float)(1 + 2 * (ib % 2 ? sc >> 4 : sc & 15));
				entry = moek_iq3s_grid[q[2 * l] | ((qh << (8 - 2 * l)) & 256)] |
				        (uint64_t)moek_iq3s_grid[q[2 * l + 1] |
				                                 ((qh << (7 - 2 * l)) & 256)]
				            << 32;
				signs = blk[2 + 64 + 8 + 4 * ib + l];
			} else if (fmt == MOEK_IQ3_XXS) {
				const uint8_t *q = blk + 2 + 8 * ib;
				uint32_t aux;
				memcpy(&aux, blk + 2 + 64 + 4 * ib, 4);
				db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
				entry = moek_iq3xxs_grid[q[2 * l]] |
				        (uint64_t)moek_iq3xxs_grid[q[2 * l + 1]] << 32;
				signs = moek_ksigns_iq2xs[(aux >> (7 * l)) & 127];
			} else if (fmt == MOEK_IQ2_XXS) {
				const uint8_t *q = blk + 2 + 8 * ib;
				uint32_t aux;
				memcpy(&aux, q + 4, 4);
				db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
				entry = moek_iq2xxs_grid[q[l]];
				signs = moek_ksigns_iq2xs[(aux >> (7 * l)) & 127];
			} else {
				uint16_t c;
				memcpy(&c, blk + 2 + 2 * (4 * ib + l), 2);
				const uint8_t sc = blk[2 + 64 + ib];
				db = d * (0.5f + (float)(l < 2 ? sc & 15 : sc >> 4)) * 0.25f;
				entry = moek_iq2xs_grid[c & 511];
				signs = moek_ksigns_iq2xs[c >> 9];
			}
			for (int j = 0; j < 8; j++)
				y[32 * ib + 8 * l + j] = db * (float)(uint8_t)(entry >> (8 * j)) *
				                         (signs & (1u << j) ? -1.0f : 1.0f);
		}
	}
}

/* IQ2_XXS by hand: d = 0.5, sub-block 0 with scale code 3 (db = 0.5 · 3.5 · 0.25), grid
 * entries 0, 1, 255, 3, sign patterns 1 (weights 0 and 7 negative), 0, 127 (0-6: 7 minus
 * signs, so 7 too: all 8), 2; the other sub-blocks all zero codes (entry 0, scale 0). */
Test(iquants, iq2_xxs_golden)
{
	uint8_t blk[66] = {0};
	const uint16_t d = moek_f32_to_f16(0.5f);
	memcpy(blk, &d, 2);
	blk[2] = 0, blk[3] = 1, blk[4] = 255, blk[5] = 3;
	const uint32_t aux = 1u | 0u << 7 | 127u << 14 | 2u << 21 | 3u << 28;
	memcpy(blk + 6, &aux, 4);
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_IQ2_XXS, blk, NULL, 1, 256, y), 0);
	const float db = 0.5f * 3.5f * 0.25f;
	/* entry 0: all 8; signs ksigns[1] = 0x81 */
	for (int j = 0; j < 8; j++)
		cr_assert_eq(y[j], (j == 0 || j == 7 ? -8.0f : 8.0f) * db, "y[%d] = %g", j, y[j]);
	/* entry 1 = 0x080808080808082b: weight 8 is 43 */
	cr_assert_eq(y[8], 43.0f * db);
	for (int j = 9; j < 16; j++)
		cr_assert_eq(y[j], 8.0f * db);
	/* entry 255 = 0x2b2b2b1908081908, all negative */
	static const float e255[8] = {8, 0x19, 8, 8, 0x19, 0x2b, 0x2b, 0x2b};
	for (int j = 0; j < 8; j++)
		cr_assert_eq(y[16 + j], -e255[j] * db, "y[%d]", 16 + j);
	/* entry 3 = 0x0808080808082b08, ksigns[2] = 0x82: weights 1 and 7 negative */
	for (int j = 0; j < 8; j++)
		cr_assert_eq(y[24 + j], (j == 1 ? -43.0f : j == 7 ? -8.0f : 8.0f) * db);
	for (int i = 32; i < 256; i++)
		cr_assert_eq(y[i], 8.0f * 0.5f * 0.5f * 0.25f, "y[%d]", i);
}

/* IQ2_XS by hand: d = 2, group 0 code 511 | 1 << 9 (entry 511: all 43, weights 0 and 7
 * negative), group 2 code 7 (0x080808080819192b), scales[0] = 0x52 (weights 0-15: s = 2,
 * 16-31: s = 5); everything else zero (entry 0, scale 0). */
Test(iquants, iq2_xs_golden)
{
	uint8_t blk[74] = {0};
	const uint16_t d = moek_f32_to_f16(2.0f), c0 = 511 | 1 << 9, c2 = 7;
	memcpy(blk, &d, 2);
	memcpy(blk + 2, &c0, 2);
	memcpy(blk + 6, &c2, 2);
	blk[66] = 0x52;
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_IQ2_XS, blk, NULL, 1, 256, y), 0);
	const float lo = 2.0f * 2.5f * 0.25f, hi = 2.0f * 5.5f * 0.25f, z = 2.0f * 0.5f * 0.25f;
	for (int j = 0; j < 8; j++)
		cr_assert_eq(y[j], (j == 0 || j == 7 ? -43.0f : 43.0f) * lo);
	for (int j = 8; j < 16; j++)
		cr_assert_eq(y[j], 8.0f * lo);
	static const float e7[8] = {0x2b, 0x19, 0x19, 8, 8, 8, 8, 8};
	for (int j = 0; j < 8; j++)
		cr_assert_eq(y[16 + j], e7[j] * hi, "y[%d]", 16 + j);
	for (int j = 24; j < 32; j++)
		cr_assert_eq(y[j], 8.0f * hi);
	for (int i = 32; i < 256; i++)
		cr_assert_eq(y[i], 8.0f * z, "y[%d]", i);
}

/* IQ3_XXS by hand: d = 1, sub-block 1 with scale code 2 (db = 2.5 · 0.5), group 0 entries 5
 * (0x04040c3e) and 255 (0x3e341c04), sign pattern 3 (weights 0, 1 negative); everything else
 * zero (entry 0 = 0x04040404, scale 0: db = 0.25). */
Test(iquants, iq3_xxs_golden)
{
	uint8_t blk[98] = {0};
	const uint16_t d = moek_f32_to_f16(1.0f);
	memcpy(blk, &d, 2);
	blk[2 + 8] = 5, blk[2 + 9] = 255;
	const uint32_t aux = 3u | 2u << 28;
	memcpy(blk + 2 + 64 + 4, &aux, 4);
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_IQ3_XXS, blk, NULL, 1, 256, y), 0);
	static const float want[8] = {-0x3e, -0x0c, 4, 4, 4, 0x1c, 0x34, 0x3e};
	for (int j = 0; j < 8; j++)
		cr_assert_eq(y[32 + j], want[j] * 1.25f, "y[%d] = %g", 32 + j, y[32 + j]);
	for (int i = 0; i < 256; i++)
		if (i < 32 || i >= 40)
			cr_assert_eq(y[i], 4.0f * (i < 64 && i >= 32 ? 1.25f : 0.25f), "y[%d]", i);
}

/* IQ3_S by hand: d = 0.5, sub-block 3 with scale 4 (scales[1] high nibble: db = 0.5 · 9),
 * group 1 of it (weights 104-111) entries 256 + 7 (9th bit in qh bit 2) and 511 (low byte 255,
 * 9th bit in qh bit 3), signs 0x81 (weights 0 and 7; no parity rule); everything else zero
 * (entry 0 = 0x01010101, scale 0: db = 0.5). */
Test(iquants, iq3_s_golden)
{
	uint8_t blk[110] = {0};
	const uint16_t d = moek_f32_to_f16(0.5f);
	memcpy(blk, &d, 2);
	blk[2 + 8 * 3 + 2] = 7, blk[2 + 8 * 3 + 3] = 255;
	blk[2 + 64 + 3] = 1u << 2 | 1u << 3;
	blk[2 + 64 + 8 + 4 * 3 + 1] = 0x81;
	blk[2 + 64 + 8 + 32 + 1] = 4u << 4;
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_IQ3_S, blk, NULL, 1, 256, y), 0);
	const uint32_t e1 = moek_iq3s_grid[263], e2 = moek_iq3s_grid[511];
	for (int j = 0; j < 8; j++) {
		const float m = (float)(uint8_t)((j < 4 ? e1 : e2) >> (8 * (j % 4)));
		cr_assert_eq(y[104 + j], (j == 0 || j == 7 ? -m : m) * 4.5f, "y[%d] = %g", 104 + j,
		             y[104 + j]);
	}
	for (int i = 0; i < 256; i++)
		if (i < 104 || i >= 112)
			cr_assert_eq(y[i], i >= 96 && i < 128 ? 4.5f : 0.5f, "y[%d]", i);
}

/* IQ1_S by hand: d = 2, sub-block 2 with scale 3 (dl = 2 · 7), negative delta, group 1 of it
 * (weights 72-79) entry 1024 + 5 (high bits 4 in qh bits 3-5); everything else zero codes:
 * entry 0 (all −1), scale 0 (dl = 2), delta +1/8. */
Test(iquants, iq1_s_golden)
{
	uint8_t blk[50] = {0};
	const uint16_t d = moek_f32_to_f16(2.0f), qh = 4u << 3 | 3u << 12 | 0x8000u;
	memcpy(blk, &d, 2);
	blk[2 + 4 * 2 + 1] = 5;
	memcpy(blk + 2 + 32 + 2 * 2, &qh, 2);
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_IQ1_S, blk, NULL, 1, 256, y), 0);
	const uint64_t e = moek_iq1s_grid[1029];
	for (int j = 0; j < 8; j++)
		cr_assert_eq(y[72 + j], 14.0f * ((float)(int8_t)(e >> (8 * j)) - 0.125f), "y[%d]",
		             72 + j);
	for (int i = 0; i < 256; i++) {
		if (i >= 72 && i < 80)
			continue;
		const bool sub2 = i >= 64 && i < 96;
		cr_assert_eq(y[i], sub2 ? 14.0f * (-1.0f - 0.125f) : 2.0f * (-1.0f + 0.125f),
		             "y[%d]", i);
	}
}

/* IQ1_M by hand: d = 1 (f16 0x3c00: nibbles 0, 0, c, 3 in the scale words' tops), the
 * 16-weight unit 5 (weights 80-95) with scale 6 (dl = 13: word 1, bits 3-5), its group 11
 * (weights 88-95) entry 2047 (all 1; high bits 7 in qh[5] bits 4-6) with negative delta
 * (qh[5] bit 7); everything else zero codes: entry 0 (all −1), scale 0 (dl = 1), +1/8. */
Test(iquants, iq1_m_golden)
{
	uint8_t blk[56] = {0};
	uint16_t sc[4] = {0, 6u << 3, 0, 0};
	for (int k = 0; k < 4; k++)
		sc[k] |= (uint16_t)(((0x3c00u >> (4 * k)) & 15) << 12);
	memcpy(blk + 48, sc, 8);
	blk[11] = 255;
	blk[32 + 5] = (uint8_t)((7u | 8u) << 4);
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_IQ1_M, blk, NULL, 1, 256, y), 0);
	for (int i = 0; i < 256; i++) {
		const float want = i >= 88 && i < 96   ? 13.0f * (1.0f - 0.125f)
		                   : i >= 80 && i < 88 ? 13.0f * (-1.0f + 0.125f)
		                                       : -1.0f + 0.125f;
		cr_assert_eq(y[i], want, "y[%d] = %g", i, y[i]);
	}
}

/* IQ2_S by hand: d = 4, sub-block 6 with scales 1 (weights 192-207: db = 4 · 1.5 · 0.25) and
 * 9 (208-223: db = 4 · 9.5 · 0.25), group 25 (weights 200-207) entry 512 + 3 (high bits 2 in
 * qh[6] bits 2-3) with sign byte 0x41 (weights 0 and 6; no parity rule); everything else
 * zero codes (entry 0, all 8; scale 0: db = 0.5, signs +). */
Test(iquants, iq2_s_golden)
{
	uint8_t blk[82] = {0};
	const uint16_t d = moek_f32_to_f16(4.0f);
	memcpy(blk, &d, 2);
	blk[2 + 25] = 3;
	blk[2 + 64 + 6] = 2u << 2;
	blk[2 + 32 + 25] = 0x41;
	blk[2 + 64 + 8 + 6] = 1u | 9u << 4;
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_IQ2_S, blk, NULL, 1, 256, y), 0);
	const uint64_t e = moek_iq2s_grid[515];
	for (int j = 0; j < 8; j++) {
		const float m = (float)(uint8_t)(e >> (8 * j)) * 1.5f;
		cr_assert_eq(y[200 + j], j == 0 || j == 6 ? -m : m, "y[%d]", 200 + j);
	}
	for (int i = 0; i < 256; i++) {
		if (i >= 200 && i < 208)
			continue;
		const float db = i >= 192 && i < 208 ? 1.5f : i >= 208 && i < 224 ? 9.5f : 0.5f;
		cr_assert_eq(y[i], 8.0f * db, "y[%d]", i);
	}
}

static const uint32_t fmts[] = {MOEK_IQ2_XXS, MOEK_IQ2_XS, MOEK_IQ3_XXS, MOEK_IQ3_S,
                                MOEK_IQ1_S,   MOEK_IQ1_M,  MOEK_IQ2_S};
enum { NFMT = sizeof(fmts) / sizeof(fmts[0]) };

/* Random bytes (any bit pattern is a valid block; d kept finite) decode as the formula. */
Test(iquants, random_blocks_decode_as_the_formula)
{
	enum { NB = 64 };
	for (size_t f = 0; f < NFMT; f++) {
		const size_t bb = moek_row_bytes(fmts[f], 256);
		uint8_t *q = malloc(NB * bb);
		float *y = malloc(NB * 256 * sizeof(float)), want[256];
		cr_assert(q && y);
		for (size_t i = 0; i < NB * bb; i++)
			q[i] = (uint8_t)rng();
		for (size_t b = 0; b < NB; b++) {
			const uint16_t d = moek_f32_to_f16(uniform(-3.0f, 3.0f));
			if (fmts[f] != MOEK_IQ1_M) {
				memcpy(q + b * bb, &d, 2);
				continue;
			}
			for (int k = 0; k < 4; k++) { /* IQ1_M: d in the scale words' top nibbles */
				uint8_t *hi = q + b * bb + 48 + 2 * k + 1;
				*hi = (uint8_t)((*hi & 15) | ((d >> (4 * k)) & 15) << 4);
			}
		}
		cr_assert_eq(moek_dequantize(fmts[f], q, NULL, 1, NB * 256, y), 0);
		for (size_t b = 0; b < NB; b++) {
			decode(fmts[f], q + b * bb, want);
			cr_assert(memcmp(want, y + 256 * b, sizeof(want)) == 0, "%s block %zu",
			          moek_format_lookup(fmts[f])->name, b);
		}
		free(q), free(y);
	}
}

/* Round trip of smooth and random data within each format's budget (nmse). */
Test(iquants, quantizer_round_trip)
{
	/* measured (cosine, uniform): IQ2_XXS 0.108 0.107, IQ2_XS 0.084 0.086, IQ3_XXS 0.053 0.034
	 */
	static const double budget[] = {0.12, 0.095, 0.065, 0.025, 0.18, 0.18, 0.065};
	enum { N = 2048 };
	static float x[N], y[N];
	static uint8_t q[N];
	for (size_t f = 0; f < NFMT; f++) {
		for (int shape = 0; shape < 2; shape++) {
			for (int i = 0; i < N; i++)
				x[i] = shape ? uniform(-1.0f, 1.0f)
				             : 0.1f + 2.0f * cosf((float)i + 0.3f);
			cr_assert_eq(moek_quantize(fmts[f], x, 1, N, q, NULL), 0);
			cr_assert_eq(moek_dequantize(fmts[f], q, NULL, 1, N, y), 0);
			double num = 0, den = 0;
			for (int i = 0; i < N; i++) {
				num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
				den += (double)x[i] * x[i];
			}
			cr_log_info("%s shape %d nmse %.4g", moek_format_lookup(fmts[f])->name,
			            shape, num / den);
			cr_expect(num / den <= budget[f], "%s shape %d: nmse %.4g > %.3g",
			          moek_format_lookup(fmts[f])->name, shape, num / den, budget[f]);
		}
	}
}

/* The AVX2 dots against the scalar reference dot: same bits, every token count, in each form
 * this CPU runs (plain AVX2; the VNNI form; VNNI + VBMI); the reference against the exact double
 * dot of the dequantized operands (a few float roundings). */
Test(iquants, avx2_dot_same_bits_as_reference)
{
	if (!moek_isa_supported(MOEK_ISA_AVX2))
		cr_skip_test("no AVX2 here");
#if defined(__x86_64__)
	static const size_t widths[] = {256, 768, 2048, 14336};
	static const unsigned forms[] = {0, MOEK_FORM_VNNI, MOEK_FORM_VNNI | MOEK_FORM_VBMI};
	for (size_t fo = 0; fo < sizeof(forms) / sizeof(forms[0]); fo++) {
		if ((forms[fo] & moek_isa_forms_available()) != forms[fo])
			continue;
		cr_assert(moek_set_isa_forms(forms[fo]));
		cr_log_info("forms %#x", forms[fo]);
		for (size_t f = 0; f < NFMT; f++)
			for (size_t wi = 0; wi < sizeof(widths) / sizeof(widths[0]); wi++) {
				const size_t k = widths[wi], nt = 8, nr = 3;
				const size_t rb = moek_row_bytes(fmts[f], k),
				             ab = moek_row_bytes(MOEK_Q8_K, k);
				float *w = malloc(nr * k * sizeof(float)),
				      *x = malloc(nt * k * sizeof(float));
				float *wd = malloc(k * sizeof(float)),
				      *xd = malloc(k * sizeof(float));
				uint8_t *wq = malloc(nr * rb),
				        *xq = aligned_alloc(64, (nt * ab + 63) / 64 * 64);
				cr_assert(w && x && wd && xd && wq && xq);
				for (size_t i = 0; i < nr * k; i++)
					w[i] = uniform(-1.0f, 1.0f) * (i % 61 == 0 ? 8.0f : 1.0f);
				for (size_t i = 0; i < nt * k; i++)
					x[i] = uniform(-2.0f, 2.0f);
				cr_assert_eq(moek_quantize(fmts[f], w, nr, k, wq, NULL), 0);
				cr_assert_eq(moek_quantize(MOEK_Q8_K, x, nt, k, xq, NULL), 0);
				const enum moek_fmt fi = moek_fmt_index(fmts[f]);
				const moek_dot_fn dot = moek_avx2_ops.dot[fi];
				const moek_dot_rows_fn rows = moek_avx2_ops.dot_rows[fi];
				cr_assert(dot && rows);
				for (size_t r = 0; r < nr; r++) {
					const uint8_t *row = wq + r * rb;
					moek_dequantize(fmts[f], row, NULL, 1, k, wd);
					for (size_t n = 1; n <= nt; n++) {
						float out[8];
						dot(row, NULL, xq, ab, n, k, out);
						for (size_t t = 0; t < n; t++) {
							const void *xt = xq + t * ab;
							const float ref = moek_iq_dot_q8k_ref(
							    fmts[f], row, xt, k);
							cr_assert(memcmp(&out[t], &ref, 4) == 0,
							          "%s forms %#x k=%zu row %zu "
							          "nt=%zu t=%zu: %.9g vs %.9g",
							          moek_format_lookup(fmts[f])->name,
							          forms[fo], k, r, n, t,
							          (double)out[t], (double)ref);
							if (n > 1)
								continue;
							moek_dequantize(MOEK_Q8_K, xt, NULL, 1, k,
							                xd);
							double exact = 0, mag = 0;
							for (size_t i = 0; i < k; i++) {
								exact += (double)wd[i] * xd[i];
								mag += fabs((double)wd[i] * xd[i]);
							}
							cr_assert(fabs(ref - exact) <= 1e-5 * mag,
							          "%s k=%zu: %.9g vs exact %.9g",
							          moek_format_lookup(fmts[f])->name,
							          k, (double)ref, exact);
						}
					}
				}
				float got[3];
				rows(wq, rb, nr, xq, k, got);
				for (size_t r = 0; r < nr; r++) {
					float one;
					dot(wq + r * rb, NULL, xq, ab, 1, k, &one);
					cr_assert(memcmp(&one, &got[r], 4) == 0,
					          "rows vs dot, row %zu", r);
				}
				free(w), free(x), free(wd), free(xd), free(wq), free(xq);
			}
	}
	cr_assert(moek_set_isa_forms(0));
#endif
}
