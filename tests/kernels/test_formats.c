/* test_formats.c — the weight-format table, golden vectors for dequantizing hand-built blocks
 * (Q4_0, Q2_K 4-bit scales/mins, Q3_K 6-bit scale packing and hmask, Q4_K scale/min
 * packing, Q5_K high bits, Q6_K, IQ4_NL grid and nibble order, IQ4_XS split 6-bit scales,
 * MXFP4 nibble order and extreme E8M0
 * exponents, FP8 E4M3 subnormals/NaN/saturation, bf16 rounding), the HF<->GGUF MXFP4
 * converters, and round-trip accuracy of every reference quantizer.
 *
 * Expected values are written from the format definitions (REFERENCE.md §2, ggml-common.h),
 * never computed by the code under test.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe_kernels.h"

static const float e2m1[16] = {0,    0.5f,  1,  1.5f,  2,  3,  4,  6,
                               -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

Test(formats, table_rows_match_ggml)
{
	static const struct {
		uint32_t id;
		const char *name;
		uint32_t elems, bytes;
	} want[] = {
	    {0, "F32", 1, 4},
	    {1, "F16", 1, 2},
	    {2, "Q4_0", 32, 18},
	    {8, "Q8_0", 32, 34},
	    {10, "Q2_K", 256, 84},
	    {11, "Q3_K", 256, 110},
	    {12, "Q4_K", 256, 144},
	    {13, "Q5_K", 256, 176},
	    {14, "Q6_K", 256, 210},
	    {15, "Q8_K", 256, 292},
	    {20, "IQ4_NL", 32, 18},
	    {23, "IQ4_XS", 256, 136},
	    {16, "IQ2_XXS", 256, 66},
	    {17, "IQ2_XS", 256, 74},
	    {18, "IQ3_XXS", 256, 98},
	    {21, "IQ3_S", 256, 110},
	    {19, "IQ1_S", 256, 50},
	    {29, "IQ1_M", 256, 56},
	    {22, "IQ2_S", 256, 82},
	    {30, "BF16", 1, 2},
	    {39, "MXFP4", 32, 17},
	    {40, "NVFP4", 64, 36},
	    {1000, "FP8_E4M3_B128", 1, 1},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const struct moek_format_info *f = moek_format_lookup(want[i].id);
		cr_assert_not_null(f, "format %u", want[i].id);
		cr_expect_str_eq(f->name, want[i].name);
		cr_expect_eq(f->block_elems, want[i].elems, "%s", want[i].name);
		cr_expect_eq(f->block_bytes, want[i].bytes, "%s", want[i].name);
		cr_expect_eq(f->weight_format, want[i].id != MOEK_Q8_K, "%s", want[i].name);
	}
	cr_expect_null(moek_format_lookup(3)); /* Q4_1: not supported */
	cr_expect_null(moek_format_lookup(999));
	cr_expect_eq(moek_row_bytes(MOEK_Q4_K, 2048), 8 * 144);
	cr_expect_eq(moek_row_bytes(MOEK_MXFP4, 2880), 90 * 17);
	cr_expect_eq(moek_row_bytes(MOEK_Q4_K, 300), 0, "not a multiple of 256");
	cr_expect_eq(moek_row_bytes(MOEK_FP8_E4M3_B128, 7168), 7168);
	cr_expect_eq(moek_row_bytes(77, 256), 0);
	cr_expect_eq(moek_fp8_scale_bytes(129, 256), 2 * 2 * sizeof(float));
	cr_expect_eq(moek_fp8_scale_bytes(7168, 2048), 56 * 16 * sizeof(float));
}

Test(formats, quantize_rejects_bad_arguments)
{
	float x[256] = {0};
	uint8_t out[1024];
	float scales[4];
	cr_expect_eq(moek_quantize(MOEK_Q4_K, x, 1, 100, out, NULL), -1,
	             "cols not a multiple of 256");
	cr_expect_eq(moek_quantize(MOEK_Q8_0, x, 1, 40, out, NULL), -1,
	             "cols not a multiple of 32");
	cr_expect_eq(moek_quantize(77, x, 1, 32, out, NULL), -1, "unknown format");
	cr_expect_eq(moek_quantize(MOEK_FP8_E4M3_B128, x, 1, 32, out, NULL), -1, "fp8 no scales");
	cr_expect_eq(moek_quantize(MOEK_Q8_0, x, 1, 32, out, scales), -1, "scales on Q8_0");
	cr_expect_eq(moek_dequantize(MOEK_Q4_K, out, NULL, 1, 100, x), -1);
	cr_expect_eq(moek_quantize_row(MOEK_FP8_E4M3_B128, x, 32, out), -1);
	cr_expect_eq(moek_quantize_row(MOEK_Q8_K, x, 256, out), 0);
}

Test(formats, bf16_rounds_to_nearest_even)
{
	/* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0) */
	cr_expect_eq(moek_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
	/* 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even) */
	cr_expect_eq(moek_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
	cr_expect_eq(moek_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81, "above half");
	cr_expect_eq(moek_f32_to_bf16(-2.0f), 0xc000);
	cr_expect(isnan(moek_bf16_to_f32(moek_f32_to_bf16(NAN))));
	cr_expect_eq(moek_f32_to_bf16(INFINITY), 0x7f80);
	/* through the weight quantizer too */
	const float x[2] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f};
	uint16_t q[2];
	cr_assert_eq(moek_quantize(MOEK_BF16, x, 1, 2, q, NULL), 0);
	cr_expect_eq(q[0], 0x3f80);
	cr_expect_eq(q[1], 0x3f82);
}

Test(formats, q4_0_golden)
{
	uint8_t blk[18] = {0x00, 0x38}; /* d = 0.5 (f16 0x3800, little-endian) */
	blk[2 + 0] = 0x1F;              /* elem 0: 15-8 = 7, elem 16: 1-8 = -7 */
	blk[2 + 15] = 0x80;             /* elem 15: 0-8 = -8, elem 31: 8-8 = 0 */
	for (int j = 1; j < 15; j++)
		blk[2 + j] = 0x88;
	float y[32];
	cr_assert_eq(moek_dequantize(MOEK_Q4_0, blk, NULL, 1, 32, y), 0);
	cr_expect_eq(y[0], 3.5f);
	cr_expect_eq(y[16], -3.5f);
	cr_expect_eq(y[15], -4.0f);
	cr_expect_eq(y[31], 0.0f);
	cr_expect_eq(y[5], 0.0f);

	/* quantizer: the extreme is -4 (negative), so d = -4 / -8 = 0.5 */
	float x[32] = {0};
	x[3] = -4.0f;
	x[20] = 1.0f;
	x[7] = 3.5f;
	uint8_t q[18];
	cr_assert_eq(moek_quantize(MOEK_Q4_0, x, 1, 32, q, NULL), 0);
	cr_expect_eq(q[0] | q[1] << 8, 0x3800);
	cr_expect_eq(q[2 + 3] & 15, 0, "-4 / 0.5 + 8 = 0");
	cr_expect_eq(q[2 + 4] >> 4, 10, "elem 20: 1 / 0.5 + 8 = 10");
	cr_expect_eq(q[2 + 7] & 15, 15, "3.5 / 0.5 + 8 = 15");
}

Test(formats, q8_0_golden)
{
	float x[32];
	for (int j = 0; j < 32; j++)
		x[j] = (float)(j - 16); /* amax 16 -> d = 16/127 */
	uint8_t q[34];
	cr_assert_eq(moek_quantize(MOEK_Q8_0, x, 1, 32, q, NULL), 0);
	cr_expect_eq(q[0] | q[1] << 8, moek_f32_to_f16(16.0f / 127.0f));
	cr_expect_eq((int8_t)q[2 + 0], -127);
	cr_expect_eq((int8_t)q[2 + 16], 0);
	cr_expect_eq((int8_t)q[2 + 17], 8, "1 * 127/16 = 7.94");
	cr_expect_eq((int8_t)q[2 + 31], 119, "15 * 127/16 = 119.06");
}

/* Scales/mins of the hand-built K-quant block: sub-blocks 4..7 need the high 2 bits. */
static const uint8_t k_sc[8] = {1, 2, 3, 63, 17, 33, 48, 5};
static const uint8_t k_m[8] = {0, 4, 10, 63, 20, 40, 1, 63};
/* packed by hand from the layout: bytes 0-3 sc[j] | sc[j+4]>>4 << 6, bytes 4-7 m[j] |
 * m[j+4]>>4 << 6, bytes 8-11 sc[j+4]&15 | (m[j+4]&15) << 4 */
static const uint8_t k_packed[12] = {0x41, 0x82, 0xC3, 0x3F, 0x40, 0x84,
                                     0x0A, 0xFF, 0x41, 0x81, 0x10, 0xF5};

Test(formats, q4_K_scale_min_packing_golden)
{
	uint8_t blk[144];
	blk[0] = 0x00, blk[1] = 0x3c; /* d = 1 */
	blk[2] = 0x00, blk[3] = 0x38; /* dmin = 0.5 */
	memcpy(blk + 4, k_packed, 12);
	for (int c = 0; c < 4; c++)
		for (int l = 0; l < 32; l++)
			blk[16 + 32 * c + l] = (uint8_t)((l & 15) | ((15 - (l & 15)) << 4));
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_Q4_K, blk, NULL, 1, 256, y), 0);
	for (int j = 0; j < 8; j++) {
		for (int l = 0; l < 32; l++) {
			const int q = (j % 2 == 0) ? (l & 15) : 15 - (l & 15);
			const float want = 1.0f * k_sc[j] * q - 0.5f * k_m[j];
			cr_assert_eq(y[32 * j + l], want, "sub-block %d elem %d: %g != %g", j, l,
			             y[32 * j + l], want);
		}
	}
}

Test(formats, q5_K_high_bit_golden)
{
	uint8_t blk[176];
	blk[0] = 0x00, blk[1] = 0x3c; /* d = 1 */
	blk[2] = 0x00, blk[3] = 0x38; /* dmin = 0.5 */
	memcpy(blk + 4, k_packed, 12);
	for (int l = 0; l < 32; l++) /* qh[l] bit 2c+s: 5th bit of sub-block 2c+s, element l */
		blk[16 + l] = (l % 3 == 0) ? 0x55 : 0xAA;
	for (int c = 0; c < 4; c++)
		for (int l = 0; l < 32; l++)
			blk[48 + 32 * c + l] = (uint8_t)((l & 15) | ((15 - (l & 15)) << 4));
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_Q5_K, blk, NULL, 1, 256, y), 0);
	for (int j = 0; j < 8; j++) {
		for (int l = 0; l < 32; l++) {
			int q = (j % 2 == 0) ? (l & 15) : 15 - (l & 15);
			const int high = (j % 2 == 0) == (l % 3 == 0);
			q += high ? 16 : 0;
			const float want = 1.0f * k_sc[j] * q - 0.5f * k_m[j];
			cr_assert_eq(y[32 * j + l], want, "sub-block %d elem %d", j, l);
		}
	}
}

/* Q2_K: scales[16] (low nibble scale, high nibble min per 16 elements), qs[64] (element
 * 128h + 32s + l at bits 2s of byte 32h + l), f16 d at 80, f16 dmin at 82. Sub-block j has
 * scale j and min 15 - j; every code is 0 except in bytes 0 and 49. */
Test(formats, q2_K_scales_mins_and_codes_golden)
{
	uint8_t blk[84] = {0};
	for (int j = 0; j < 16; j++)
		blk[j] = (uint8_t)(j | (15 - j) << 4);
	blk[16 + 0] = 0xE4;             /* codes 0, 1, 2, 3 of elements 0, 32, 64, 96 */
	blk[16 + 49] = 0x1B;            /* codes 3, 2, 1, 0 of elements 145, 177, 209, 241 */
	blk[80] = 0x00, blk[81] = 0x38; /* d = 0.5 */
	blk[82] = 0x00, blk[83] = 0x34; /* dmin = 0.25 */
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_Q2_K, blk, NULL, 1, 256, y), 0);
	/* y = d · sc · q − dmin · m, worked by hand */
	static const struct {
		int e;
		float want;
	} hand[] = {
	    {0, -3.75f},  /* sub-block 0: 0.5·0·0 − 0.25·15 */
	    {32, -2.25f}, /* 2: 0.5·2·1 − 0.25·13 */
	    {64, 1.25f},  /* 4: 0.5·4·2 − 0.25·11 */
	    {96, 6.75f},  /* 6: 0.5·6·3 − 0.25·9 */
	    {145, 12.0f}, /* 9: 0.5·9·3 − 0.25·6 */
	    {177, 10.0f}, /* 11: 0.5·11·2 − 0.25·4 */
	    {209, 6.0f},  /* 13: 0.5·13·1 − 0.25·2 */
	    {241, 0.0f},  /* 15: 0.5·15·0 − 0.25·0 */
	    {1, -3.75f},  {17, -3.5f}, {255, 0.0f}, {128, -1.75f},
	};
	for (size_t i = 0; i < sizeof(hand) / sizeof(hand[0]); i++)
		cr_expect_eq(y[hand[i].e], hand[i].want, "elem %d: %g != %g", hand[i].e,
		             y[hand[i].e], hand[i].want);
	for (int e = 0; e < 256; e++) {
		const bool coded =
		    e == 32 || e == 64 || e == 96 || e == 145 || e == 177 || e == 209;
		if (!coded)
			cr_assert_eq(y[e], -0.25f * (float)(15 - e / 16), "elem %d", e);
	}
}

/* Q3_K: hmask[32] at 0, qs[64] at 32, 12 scale bytes at 96, f16 d at 108. The 16 stored
 * scales (value + 32) are {0, 63, 32, 33, 31, 16, 47, 1, 62, 5, 40, 20, 50, 9, 35, 60}, packed
 * by hand: bytes 0-7 hold the low nibbles of scales j (low) and j + 8 (high), bytes 8-11
 * the high 2 bits of scales i, i + 4, i + 8, i + 12 at bits 0, 2, 4, 6. Codes are
 * low2 − (hmask bit clear ? 4 : 0); all zero (−4) except at the elements listed. */
Test(formats, q3_K_scale_packing_and_hmask_golden)
{
	static const int value[16] = {-32, 31,  0, 1,   -1, -16, 15, -31,
	                              30,  -27, 8, -12, 18, -23, 3,  28};
	static const uint8_t scales[12] = {0xE0, 0x5F, 0x80, 0x41, 0x2F, 0x90,
	                                   0x3F, 0xC1, 0xF4, 0x07, 0xAA, 0xD2};
	uint8_t blk[110] = {0};
	uint8_t *hmask = blk, *qs = blk + 32;
	memcpy(blk + 96, scales, 12);
	blk[108] = 0x00, blk[109] = 0x38; /* d = 0.5 */
	qs[0] = 0x1B;                     /* low 2 bits 3, 2, 1, 0 of elements 0, 32, 64, 96 */
	hmask[0] = 0x05;                  /* high bit of elements 0 and 64 */
	qs[49] = 0xC6;                    /* low 2 bits 2, 1, 0, 3 of elements 145, 177, 209, 241 */
	hmask[17] = 0x90;                 /* high bit of elements 145 and 241 */
	hmask[31] = 0x01;                 /* element 31: code 0 */
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_Q3_K, blk, NULL, 1, 256, y), 0);
	static const struct {
		int e;
		float want;
	} hand[] = {
	    {0, -48.0f},  /* sub-block 0: 0.5·(−32)·3 */
	    {32, -0.0f},  /* 2: 0.5·0·(2 − 4) */
	    {64, -0.5f},  /* 4: 0.5·(−1)·1 */
	    {96, -30.0f}, /* 6: 0.5·15·(0 − 4) */
	    {128, -60.f}, /* 8: 0.5·30·(0 − 4) */
	    {145, -27.f}, /* 9: 0.5·(−27)·2 */
	    {177, 18.0f}, /* 11: 0.5·(−12)·(1 − 4) */
	    {209, 46.0f}, /* 13: 0.5·(−23)·(0 − 4) */
	    {241, 42.0f}, /* 15: 0.5·28·3 */
	    {31, 0.0f},   /* 1: 0.5·31·0 */
	    {16, -62.0f}, /* 1: 0.5·31·(0 − 4) */
	    {255, -56.f}, /* 15: 0.5·28·(0 − 4) */
	};
	for (size_t i = 0; i < sizeof(hand) / sizeof(hand[0]); i++)
		cr_expect_eq(y[hand[i].e], hand[i].want, "elem %d: %g != %g", hand[i].e,
		             y[hand[i].e], hand[i].want);
	for (int e = 0; e < 256; e++) {
		const bool coded = e == 0 || e == 32 || e == 64 || e == 96 || e == 145 ||
		                   e == 177 || e == 209 || e == 241 || e == 31;
		if (!coded)
			cr_assert_eq(y[e], -2.0f * (float)value[e / 16], "elem %d", e);
	}
}

/* The quantizers write these layouts: a Q3_K row whose 16-element groups use all 8 levels of
 * one power-of-two scale comes back exactly, with exactly the hmask bits of its non-negative
 * codes set; a Q2_K row of levels 0..3 gets those codes (its scale, 0.125 / 15 in f16 times
 * 15, is within 2^-11 of 0.125). */
Test(formats, q2_K_q3_K_exact_levels_round_trip)
{
	float x[256], y[256];
	uint8_t q[110];
	for (int e = 0; e < 256; e++) /* levels -4..3 in every group, times 2^-4 */
		x[e] = (float)((e * 5 + e / 16) % 8 - 4) * 0.0625f;
	cr_assert_eq(moek_quantize(MOEK_Q3_K, x, 1, 256, q, NULL), 0);
	cr_assert_eq(moek_dequantize(MOEK_Q3_K, q, NULL, 1, 256, y), 0);
	for (int e = 0; e < 256; e++) {
		cr_assert_eq(y[e], x[e], "Q3_K elem %d: %g != %g", e, y[e], x[e]);
		const bool high = (q[e % 32] >> (e / 32)) & 1;
		cr_assert_eq(high, x[e] >= 0, "Q3_K hmask of elem %d", e);
	}
	for (int e = 0; e < 256; e++) /* levels 0..3 with min 0: codes are the levels */
		x[e] = (float)((e * 3 + e / 16) % 4) * 0.125f;
	cr_assert_eq(moek_quantize(MOEK_Q2_K, x, 1, 256, q, NULL), 0);
	cr_assert_eq(moek_dequantize(MOEK_Q2_K, q, NULL, 1, 256, y), 0);
	for (int e = 0; e < 256; e++) {
		cr_assert(fabsf(y[e] - x[e]) <= 0x1p-11f * 3, "Q2_K elem %d: %g != %g", e, y[e],
		          x[e]);
		const int code = (q[16 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
		cr_assert_eq(code, (e * 3 + e / 16) % 4, "Q2_K code of elem %d", e);
	}
}

static int q6_value(int e)
{
	return (e * 7 + e / 64) % 64;
}

Test(formats, q6_K_golden)
{
	uint8_t blk[210] = {0};
	uint8_t *ql = blk, *qh = blk + 128;
	int8_t *sc = (int8_t *)(blk + 192);
	blk[208] = 0x00, blk[209] = 0x34; /* d = 0.25 */
	for (int i = 0; i < 16; i++)
		sc[i] = (int8_t)(i * 9 - 70);
	/* element e = 128h + 32q + l: low 4 bits in ql[64h + l + 32(q&1)], nibble (q>>1);
	 * high 2 bits in qh[32h + l] at bit 2q */
	for (int e = 0; e < 256; e++) {
		const int h = e / 128, q = (e % 128) / 32, l = e % 32, v = q6_value(e);
		ql[64 * h + l + 32 * (q & 1)] |= (uint8_t)((v & 15) << (4 * (q >> 1)));
		qh[32 * h + l] |= (uint8_t)((v >> 4) << (2 * q));
	}
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_Q6_K, blk, NULL, 1, 256, y), 0);
	for (int e = 0; e < 256; e++) {
		const float want = 0.25f * (float)sc[e / 16] * (float)(q6_value(e) - 32);
		cr_assert_eq(y[e], want, "elem %d: %g != %g", e, y[e], want);
	}
}

/* ggml's kvalues_iq4nl, written out from the format definition */
static const int iq4_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};

Test(formats, iq4_nl_golden)
{
	uint8_t blk[18] = {0x00, 0x38}; /* d = 0.5 */
	blk[2 + 0] = 0xF0;              /* elem 0: code 0 (-127), elem 16: code 15 (113) */
	blk[2 + 15] = 0x78;             /* elem 15: code 8 (1), elem 31: code 7 (-10) */
	for (int j = 1; j < 15; j++)
		blk[2 + j] = 0x99; /* code 9 (13) */
	float y[32];
	cr_assert_eq(moek_dequantize(MOEK_IQ4_NL, blk, NULL, 1, 32, y), 0);
	cr_expect_eq(y[0], -63.5f);
	cr_expect_eq(y[16], 56.5f);
	cr_expect_eq(y[15], 0.5f);
	cr_expect_eq(y[31], -5.0f);
	for (int j = 1; j < 15; j++)
		cr_expect(y[j] == 6.5f && y[j + 16] == 6.5f, "elem %d: %g %g", j, y[j], y[j + 16]);

	/* every level times 0.25, twice: the search finds d = 0.25 and the codes exactly */
	float x[32];
	for (int j = 0; j < 32; j++)
		x[j] = 0.25f * (float)iq4_grid[j % 16];
	uint8_t q[18];
	cr_assert_eq(moek_quantize(MOEK_IQ4_NL, x, 1, 32, q, NULL), 0);
	cr_expect_eq(q[0] | q[1] << 8, 0x3400, "d = 0.25");
	for (int j = 0; j < 16; j++)
		cr_expect_eq(q[2 + j], j | j << 4, "byte %d: elements %d and %d are level %d", j, j,
		             j + 16, j);
}

/* IQ4_XS sub-block scales ls (6 bits; value d * (ls - 32) * level), packed by hand: low
 * nibbles in scales_l (sub-block j in nibble j % 2 of byte j / 2), high 2 bits in scales_h
 * (bits 2j, 2j + 1). ls = 0, 63, 32, 31, 17, 48, 5, 40:
 *   low 4 bits  0, 15, 0, 15, 1, 0, 5, 8 -> scales_l F0 F0 01 85
 *   high 2 bits 0, 3, 2, 1, 1, 3, 0, 2   -> scales_h 0x8D6C */
static const int xs_ls[8] = {0, 63, 32, 31, 17, 48, 5, 40};

Test(formats, iq4_xs_split_scales_golden)
{
	uint8_t blk[136] = {0x00, 0x38, 0x6C, 0x8D, 0xF0, 0xF0, 0x01, 0x85}; /* d = 0.5 */
	for (int j = 0; j < 8; j++)
		for (int l = 0; l < 16; l++)
			blk[8 + 16 * j + l] = (uint8_t)(((l + j) % 16) | (15 - l) << 4);
	float y[256];
	cr_assert_eq(moek_dequantize(MOEK_IQ4_XS, blk, NULL, 1, 256, y), 0);
	for (int j = 0; j < 8; j++)
		for (int l = 0; l < 16; l++) {
			const float s = 0.5f * (float)(xs_ls[j] - 32);
			const float lo = s * (float)iq4_grid[(l + j) % 16];
			const float hi = s * (float)iq4_grid[15 - l];
			cr_assert(y[32 * j + l] == lo && y[32 * j + l + 16] == hi,
			          "sub-block %d elem %d: %g %g, want %g %g", j, l, y[32 * j + l],
			          y[32 * j + l + 16], lo, hi);
		}

	/* sub-block j = every level times m_j / 64, twice: the largest scale (-32/64) sets
	 * d = 1/64, each sub-block gets ls = m_j + 32 and its codes exactly:
	 * ls = 0, 63, 33, 31, 48, 15, 40, 32 -> scales_l F0 F1 F0 08, scales_h 0xA36C */
	static const int m[8] = {-32, 31, 1, -1, 16, -17, 8, 0};
	float x[256];
	for (int j = 0; j < 8; j++)
		for (int e = 0; e < 32; e++)
			x[32 * j + e] = (float)(iq4_grid[e % 16] * m[j]) / 64.0f;
	uint8_t q[136];
	cr_assert_eq(moek_quantize(MOEK_IQ4_XS, x, 1, 256, q, NULL), 0);
	static const uint8_t head[8] = {0x00, 0x24, 0x6C, 0xA3, 0xF0, 0xF1, 0xF0, 0x08};
	cr_expect_arr_eq(q, head, 8,
	                 "d, scales_h, scales_l: %02x %02x %02x %02x %02x %02x %02x %02x", q[0],
	                 q[1], q[2], q[3], q[4], q[5], q[6], q[7]);
	for (int j = 0; j < 8; j++)
		for (int l = 0; l < 16; l++)
			cr_expect_eq(q[8 + 16 * j + l], m[j] ? l | l << 4 : 0x88,
			             "sub-block %d byte %d", j, l);
	cr_assert_eq(moek_dequantize(MOEK_IQ4_XS, q, NULL, 1, 256, y), 0);
	cr_expect_arr_eq(y, x, sizeof(x), "exact round trip");
}

Test(formats, q8_K_scale_is_signed_and_bsums_sum_16)
{
	float x[256];
	for (int i = 0; i < 256; i++)
		x[i] = 0.01f * (float)((i * 37) % 101 - 50);
	x[9] = 2.0f; /* positive extreme: d = -2/127 */
	uint8_t q[292];
	cr_assert_eq(moek_quantize_row(MOEK_Q8_K, x, 256, q), 0);
	float d;
	memcpy(&d, q, 4);
	cr_expect_float_eq(d, -2.0f / 127.0f, 1e-9);
	cr_expect_eq((int8_t)q[4 + 9], -127);
	for (int b = 0; b < 16; b++) {
		int sum = 0;
		for (int i = 0; i < 16; i++)
			sum += (int8_t)q[4 + 16 * b + i];
		int16_t bsum;
		memcpy(&bsum, q + 4 + 256 + 2 * b, 2);
		cr_expect_eq(bsum, sum, "bsum %d", b);
	}
}

Test(formats, mxfp4_codes_and_nibble_order)
{
	uint8_t blk[17];
	blk[0] = 127; /* 2^0 */
	for (int j = 0; j < 16; j++)
		blk[1 + j] = (uint8_t)(j | ((15 - j) << 4)); /* elem j: code j; elem j+16: 15-j */
	float y[32];
	cr_assert_eq(moek_dequantize(MOEK_MXFP4, blk, NULL, 1, 32, y), 0);
	for (int j = 0; j < 16; j++) {
		cr_expect_eq(y[j], e2m1[j], "elem %d", j);
		cr_expect_eq(y[j + 16], e2m1[15 - j], "elem %d", j + 16);
	}
}

Test(formats, mxfp4_extreme_exponents)
{
	uint8_t blk[17];
	float y[32];
	memset(blk + 1, 0x71, 16); /* low nibble code 1 (0.5), high nibble code 7 (6) */
	blk[0] = 0;                /* 2^-127: a float subnormal scale */
	cr_assert_eq(moek_dequantize(MOEK_MXFP4, blk, NULL, 1, 32, y), 0);
	cr_expect_eq(y[0], 0x1p-128f, "0.5 * 2^-127");
	cr_expect_eq(y[16], 0x1.8p-125f, "6 * 2^-127");
	blk[0] = 254; /* 2^127 */
	cr_assert_eq(moek_dequantize(MOEK_MXFP4, blk, NULL, 1, 32, y), 0);
	cr_expect_eq(y[0], 0x1p126f, "0.5 * 2^127");
	cr_expect(isinf(y[16]) && y[16] > 0, "6 * 2^127 overflows f32");
	blk[0] = 255; /* NaN per OCP MX */
	cr_assert_eq(moek_dequantize(MOEK_MXFP4, blk, NULL, 1, 32, y), 0);
	cr_expect(isnan(y[0]) && isnan(y[31]));
	cr_expect(isnan(moek_e8m0_to_f32(255)));
	cr_expect_eq(moek_e8m0_to_f32(127), 1.0f);
	cr_expect_eq(moek_e8m0_to_f32(0), 0x1p-127f);
	/* the quantizer picks e so that amax / 2^(e-127) is in [4, 8) */
	float x[32] = {0};
	x[0] = 6.0f;
	x[17] = -1.0f;
	uint8_t q[17];
	cr_assert_eq(moek_quantize(MOEK_MXFP4, x, 1, 32, q, NULL), 0);
	cr_expect_eq(q[0], 127 + 2 - 2, "floor(log2 6) = 2 -> e = 127");
	cr_expect_eq(q[1] & 15, 7, "6.0 is code 7");
	cr_expect_eq(q[2] >> 4, 10, "-1.0 is code 10");
}

static uint8_t hf_code(int i)
{
	return (uint8_t)((i * 3 + i / 16 + 5) & 15);
}

Test(formats, mxfp4_hf_converter_pairs_j_with_j_plus_16)
{
	enum { N = 64 };
	uint8_t blocks[N / 2], scales[N / 32] = {120, 130};
	for (int k = 0; k < N / 2; k++) /* HF: byte k holds elements 2k (low) and 2k+1 (high) */
		blocks[k] = (uint8_t)(hf_code(2 * k) | (hf_code(2 * k + 1) << 4));
	uint8_t gguf[2 * 17];
	moek_mxfp4_from_hf(blocks, scales, N, gguf);
	for (int b = 0; b < 2; b++) {
		cr_expect_eq(gguf[17 * b], scales[b]);
		for (int j = 0; j < 16; j++) {
			const int e = 32 * b + j;
			cr_expect_eq(gguf[17 * b + 1 + j], hf_code(e) | (hf_code(e + 16) << 4),
			             "block %d byte %d", b, j);
		}
	}
	float y[N];
	cr_assert_eq(moek_dequantize(MOEK_MXFP4, gguf, NULL, 1, N, y), 0);
	for (int i = 0; i < N; i++)
		cr_expect_eq(y[i], e2m1[hf_code(i)] * ldexpf(1.0f, scales[i / 32] - 127), "%d", i);
	uint8_t back_blocks[N / 2], back_scales[N / 32];
	moek_mxfp4_to_hf(gguf, N, back_blocks, back_scales);
	cr_expect_arr_eq(back_blocks, blocks, sizeof(blocks));
	cr_expect_arr_eq(back_scales, scales, sizeof(scales));
}

/* The vectorised converter against the definition (GGUF byte j = element j | element j+16 << 4,
 * HF byte k = element 2k | element 2k+1 << 4) on every byte value in every position. */
Test(formats, mxfp4_from_hf_matches_the_definition_on_random_blocks)
{
	enum { BLOCKS = 1024 };
	static uint8_t blocks[BLOCKS * 16], scales[BLOCKS], got[BLOCKS * 17];
	uint32_t seed = 12345;
	for (size_t i = 0; i < sizeof(blocks); i++) {
		seed = seed * 1664525u + 1013904223u;
		blocks[i] =
		    (uint8_t)(i < 256 * 16 ? i / 16 : seed >> 24); /* all bytes, then random */
	}
	for (size_t b = 0; b < BLOCKS; b++)
		scales[b] = (uint8_t)(b * 7);
	moek_mxfp4_from_hf(blocks, scales, BLOCKS * 32, got);
	for (size_t b = 0; b < BLOCKS; b++) {
		const uint8_t *src = blocks + 16 * b;
		cr_assert_eq(got[17 * b], scales[b], "block %zu scale", b);
		for (int j = 0; j < 16; j++) {
			const int lo = (src[j / 2] >> (4 * (j % 2))) & 0xF;
			const int hi = (src[(j + 16) / 2] >> (4 * ((j + 16) % 2))) & 0xF;
			cr_assert_eq(got[17 * b + 1 + j], lo | hi << 4, "block %zu byte %d", b, j);
		}
	}
}

Test(formats, fp8_e4m3_decode_golden)
{
	cr_expect_eq(moek_fp8_e4m3_to_f32(0x00), 0.0f);
	cr_expect(signbit(moek_fp8_e4m3_to_f32(0x80)) && moek_fp8_e4m3_to_f32(0x80) == 0.0f);
	cr_expect_eq(moek_fp8_e4m3_to_f32(0x01), 0x1p-9f, "smallest subnormal");
	cr_expect_eq(moek_fp8_e4m3_to_f32(0x07), 7 * 0x1p-9f, "largest subnormal");
	cr_expect_eq(moek_fp8_e4m3_to_f32(0x08), 0x1p-6f, "smallest normal");
	cr_expect_eq(moek_fp8_e4m3_to_f32(0x38), 1.0f);
	cr_expect_eq(moek_fp8_e4m3_to_f32(0x77), 240.0f);
	cr_expect_eq(moek_fp8_e4m3_to_f32(0x7e), 448.0f);
	cr_expect_eq(moek_fp8_e4m3_to_f32(0xfe), -448.0f);
	cr_expect_eq(moek_fp8_e4m3_to_f32(0x78), 256.0f, "exp 15 is finite in E4M3fn");
	cr_expect(isnan(moek_fp8_e4m3_to_f32(0x7f)));
	cr_expect(isnan(moek_fp8_e4m3_to_f32(0xff)));
}

Test(formats, fp8_e4m3_encode_rounds_and_saturates)
{
	cr_expect_eq(moek_f32_to_fp8_e4m3(448.0f), 0x7e);
	cr_expect_eq(moek_f32_to_fp8_e4m3(1000.0f), 0x7e);
	cr_expect_eq(moek_f32_to_fp8_e4m3(INFINITY), 0x7e);
	cr_expect_eq(moek_f32_to_fp8_e4m3(-INFINITY), 0xfe);
	cr_expect(isnan(moek_fp8_e4m3_to_f32(moek_f32_to_fp8_e4m3(NAN))));
	cr_expect_eq(moek_f32_to_fp8_e4m3(0x1p-10f), 0x00, "half of min subnormal: tie to 0");
	cr_expect_eq(moek_f32_to_fp8_e4m3(3 * 0x1p-10f), 0x02, "1.5 ulp: tie to even 2");
	cr_expect_eq(moek_f32_to_fp8_e4m3(1.0625f), 0x38, "tie between m=0 and m=1 -> 0");
	cr_expect_eq(moek_f32_to_fp8_e4m3(1.1875f), 0x3a, "tie between m=1 and m=2 -> 2");
	cr_expect_eq(moek_f32_to_fp8_e4m3(0.0155f), 0x08, "rounds up into the normals");
	cr_expect_eq(moek_f32_to_fp8_e4m3(-0.0f), 0x80);
	for (int c = 0; c < 256; c++) {
		if ((c & 0x7f) == 0x7f)
			continue;
		cr_assert_eq(moek_f32_to_fp8_e4m3(moek_fp8_e4m3_to_f32((uint8_t)c)), c,
		             "code 0x%02x does not round-trip", c);
	}
}

Test(formats, fp8_block_scales_are_amax_over_448)
{
	enum { R = 130, C = 200 }; /* partial edge blocks in both directions */
	float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C);
	uint8_t *q = malloc(R * C);
	float scales[4];
	cr_assert(x && y && q);
	for (int r = 0; r < R; r++)
		for (int c = 0; c < C; c++)
			x[r * C + c] = sinf((float)(r * C + c)) * (r < 128 ? 1.0f : 1e-3f) *
			               (c < 128 ? 1.0f : 30.0f);
	cr_assert_eq(moek_fp8_scale_bytes(R, C), sizeof(scales));
	cr_assert_eq(moek_quantize(MOEK_FP8_E4M3_B128, x, R, C, q, scales), 0);
	for (int b = 0; b < 4; b++) {
		const int r0 = (b / 2) * 128, c0 = (b % 2) * 128;
		float amax = 0;
		for (int r = r0; r < R && r < r0 + 128; r++)
			for (int c = c0; c < C && c < c0 + 128; c++)
				amax = fmaxf(amax, fabsf(x[r * C + c]));
		cr_expect_float_eq(scales[b], amax / 448.0f, 1e-12f * amax, "block %d", b);
	}
	cr_assert_eq(moek_dequantize(MOEK_FP8_E4M3_B128, q, scales, R, C, y), 0);
	for (int r = 0; r < R; r++) {
		for (int c = 0; c < C; c++) {
			const float s = scales[(r / 128) * 2 + c / 128];
			const float err = fabsf(y[r * C + c] - x[r * C + c]);
			/* 3 mantissa bits: half an ulp is 1/16 relative; subnormals 2^-10 absolute
			 */
			cr_assert(err <= fabsf(x[r * C + c]) / 16.0f + s * 0x1p-10f,
			          "(%d,%d): %g vs %g", r, c, y[r * C + c], x[r * C + c]);
		}
	}
	free(x);
	free(y);
	free(q);
}

/* Round trip through each reference quantizer on ggml's test signal (0.1 + 2 cos(i + off)):
 * normalised error sum (y-x)^2 / sum x^2 within the format's budget. A layout or rounding
 * bug gives errors of order 1. */
Test(formats, quantizer_round_trip_accuracy)
{
	static const struct {
		uint32_t format;
		double max_nmse;
	} budget[] = {
	    {MOEK_F32, 0.0},       {MOEK_F16, 1e-7},
	    {MOEK_BF16, 5e-6},     {MOEK_Q8_0, 2e-5},
	    {MOEK_Q4_0, 5e-3},     {MOEK_Q4_K, 4e-3},
	    {MOEK_Q5_K, 1e-3},     {MOEK_Q6_K, 3e-4},
	    {MOEK_MXFP4, 1.5e-2},  {MOEK_FP8_E4M3_B128, 1.2e-3},
	    {MOEK_Q8_K, 2e-5},     {MOEK_IQ4_NL, 5e-3},
	    {MOEK_IQ4_XS, 5e-3},   {MOEK_Q3_K, 2.5e-2},
	    {MOEK_Q2_K, 8e-2},     {MOEK_INT4_G32, 5e-3},
	    {MOEK_IQ2_XXS, 0.12},  {MOEK_IQ2_XS, 0.095},
	    {MOEK_IQ3_XXS, 0.065}, {MOEK_IQ3_S, 0.025},
	    {MOEK_IQ1_S, 0.18},    {MOEK_IQ1_M, 0.18},
	    {MOEK_IQ2_S, 0.065},
	};
	enum { R = 4, C = 1024 };
	static float x[R * C], y[R * C];
	static uint8_t q[R * C * 4];
	float scales[8];
	for (int i = 0; i < R * C; i++)
		x[i] = 0.1f + 2.0f * cosf((float)i + 0.3f);
	for (size_t f = 0; f < sizeof(budget) / sizeof(budget[0]); f++) {
		const uint32_t fmt = budget[f].format;
		float *sc = fmt == MOEK_FP8_E4M3_B128 ? scales : NULL;
		cr_assert_eq(moek_quantize(fmt, x, R, C, q, sc), 0, "format %u", fmt);
		cr_assert_eq(moek_dequantize(fmt, q, sc, R, C, y), 0);
		double num = 0, den = 0;
		for (int i = 0; i < R * C; i++) {
			num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
			den += (double)x[i] * x[i];
		}
		cr_expect(num / den <= budget[f].max_nmse, "%s: nmse %.3g > %.3g",
		          moek_format_lookup(fmt)->name, num / den, budget[f].max_nmse);
		cr_log_info("%s round-trip nmse %.3g", moek_format_lookup(fmt)->name, num / den);
	}
}

/* An all-zero block quantizes to zeros in every format (no 0/0). */
Test(formats, zero_block_quantizes_to_zero)
{
	static const uint32_t fmts[] = {
	    MOEK_Q4_0,  MOEK_Q8_0,     MOEK_Q4_K,    MOEK_Q5_K,          MOEK_Q6_K,
	    MOEK_MXFP4, MOEK_IQ4_NL,   MOEK_IQ4_XS,  MOEK_FP8_E4M3_B128, MOEK_Q2_K,
	    MOEK_Q3_K,  MOEK_INT4_G32, MOEK_IQ2_XXS, MOEK_IQ2_XS,        MOEK_IQ3_XXS,
	    MOEK_IQ3_S, MOEK_IQ1_S,    MOEK_IQ1_M,   MOEK_IQ2_S};
	float x[256] = {0}, y[256];
	uint8_t q[512];
	float scale[2]; /* FP8: 1 x 2 blocks of 128 */
	for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++) {
		float *sc = fmts[f] == MOEK_FP8_E4M3_B128 ? scale : NULL;
		cr_assert_eq(moek_quantize(fmts[f], x, 1, 256, q, sc), 0);
		cr_assert_eq(moek_dequantize(fmts[f], q, sc, 1, 256, y), 0);
		for (int i = 0; i < 256; i++)
			cr_assert_eq(y[i], 0.0f, "%s elem %d", moek_format_lookup(fmts[f])->name,
			             i);
	}
}

/* UE4M3 as the spec (and ggml_ue4m3_to_fp32, before its halving) defines it: bit 7 ignored,
 * 4 exponent bits of bias 7, 3 mantissa bits, subnormals m · 2^-9; ggml reads the byte 0x7F
 * (and only that byte: 0xFF is 0x7F with bit 7 set, which it ignores) as 0. */
static float spec_ue4m3(uint8_t b)
{
	if (b == 0x7F)
		return 0.0f;
	const int e = (b >> 3) & 15, m = b & 7;
	return e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
}

/* Hand-built NVFP4 blocks (ggml type 40): four UE4M3 scales, then sub-block s's 8 bytes, byte
 * j low nibble = element 16s + j, high nibble = element 16s + j + 8; value E2M1 · scale. */
Test(formats, nvfp4_golden_blocks)
{
	static const uint8_t scales[2][4] = {
	    {0x38, 0x00, 0x01, 0x7F}, /* 1.0, 0, 2^-9 (subnormal), 0 (ggml's 0x7F) */
	    {0x3C, 0x80, 0x50, 0xFF}, /* 1.5, 0 (bit 7 ignored), 8, 480 (0x7F | 0x80) */
	};
	uint8_t blk[2][36];
	for (int b = 0; b < 2; b++) {
		memcpy(blk[b], scales[b], 4);
		for (int s = 0; s < 4; s++)
			for (int j = 0; j < 8; j++) /* low: code j (+), high: code 15 - j (−) */
				blk[b][4 + 8 * s + j] = (uint8_t)((j + b) % 16 | (15 - j) << 4);
	}
	float y[128];
	cr_assert_eq(moek_dequantize(MOEK_NVFP4, blk, NULL, 1, 128, y), 0);
	for (int b = 0; b < 2; b++)
		for (int s = 0; s < 4; s++)
			for (int j = 0; j < 8; j++) {
				const float d = spec_ue4m3(scales[b][s]);
				const int e = 64 * b + 16 * s + j;
				cr_expect_eq(y[e], e2m1[(j + b) % 16] * d, "elem %d", e);
				cr_expect_eq(y[e + 8], e2m1[15 - j] * d, "elem %d", e + 8);
			}
	cr_expect_eq(y[64 + 48 + 8 + 6], -0.5f * 480.0f, "0xFF reads as 480, not 0");
	cr_expect_eq(y[0 + 16 * 2 + 7], 6.0f * 0x1p-9f, "subnormal scale");
	/* the quantizer's blocks decode back within one E2M1 step of the original */
	float x[64], back[64];
	for (int i = 0; i < 64; i++)
		x[i] = (float)((i * 37) % 23 - 11) * 0.173f;
	uint8_t q[36];
	cr_assert_eq(moek_quantize(MOEK_NVFP4, x, 1, 64, q, NULL), 0);
	cr_assert_eq(moek_dequantize(MOEK_NVFP4, q, NULL, 1, 64, back), 0);
	for (int s = 0; s < 4; s++) {
		cr_expect_lt(q[s], 0x7F, "scale %d: a positive finite E4M3", s);
		const float d = spec_ue4m3(q[s]);
		for (int j = 0; j < 16; j++)
			cr_expect_leq(fabsf(back[16 * s + j] - x[16 * s + j]), 1.0f * d + 1e-6f,
			              "elem %d", 16 * s + j);
	}
}

/* ModelOpt's NVFP4 tensors (weight: byte k holds elements 2k low and 2k + 1 high; weight_scale:
 * one float8_e4m3fn per 16) into NVFP4 blocks: hand-built bytes decode to E2M1 · E4M3 as the
 * definitions give them; the inverse gives the bytes back; a negative or NaN scale is refused
 * naming its row and columns. */
Test(formats, nvfp4_from_modelopt_pairs_2k_with_2k_plus_1)
{
	enum { R = 2, C = 128 };
	uint8_t weight[R * C / 2], scales[R * C / 16], blocks[R * C / 64 * 36], w2[R * C / 2],
	    s2[R * C / 16];
	int code[R * C];
	for (int i = 0; i < R * C; i++)
		code[i] = (i * 7 + i / 16) % 16;
	for (int i = 0; i < R * C / 2; i++)
		weight[i] = (uint8_t)(code[2 * i] | code[2 * i + 1] << 4);
	for (int i = 0; i < R * C / 16; i++)
		scales[i] = (uint8_t)(0x08 + 5 * i); /* 2^-6 (smallest normal) upwards */
	scales[3] = 0x05;                            /* a subnormal: 5 · 2^-9 */
	char err[200] = "";
	cr_assert_eq(moek_nvfp4_from_modelopt(weight, scales, R, C, blocks, err, sizeof(err)), 0,
	             "%s", err);
	float y[R * C];
	cr_assert_eq(moek_dequantize(MOEK_NVFP4, blocks, NULL, R, C, y), 0);
	for (int i = 0; i < R * C; i++)
		cr_assert_eq(y[i], e2m1[code[i]] * moek_fp8_e4m3_to_f32(scales[i / 16]), "elem %d",
		             i);
	moek_nvfp4_to_modelopt(blocks, R, C, w2, s2);
	cr_assert_eq(memcmp(w2, weight, sizeof(weight)), 0);
	cr_assert_eq(memcmp(s2, scales, sizeof(scales)), 0);
	scales[9] = 0xB8; /* -1.0: row 1, columns 16..31 */
	cr_assert_eq(moek_nvfp4_from_modelopt(weight, scales, R, C, blocks, err, sizeof(err)), -1);
	cr_assert_str_eq(err, "NVFP4 (ModelOpt): weight_scale of row 1 columns 16..31 is negative "
	                      "(E4M3 byte 0xb8): block scales are positive");
	scales[9] = 0x7F;
	cr_assert_eq(moek_nvfp4_from_modelopt(weight, scales, R, C, blocks, err, sizeof(err)), -1);
	cr_assert(strstr(err, "is NaN (E4M3 byte 0x7f)"), "%s", err);
	cr_assert_eq(moek_nvfp4_from_modelopt(weight, scales, R, 96, blocks, err, sizeof(err)), -1);
	cr_assert_str_eq(err, "NVFP4 (ModelOpt): 2 x 96, rows must be a positive multiple of 64 "
	                      "inputs (ggml's NVFP4 block)");
}
