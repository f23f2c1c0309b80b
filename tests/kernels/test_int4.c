/* test_int4.c — MOEK_INT4_G32 and its repacks from INT4 checkpoints: golden blocks written from
 * the format definitions (compressed-tensors pack_to_int32: element 8w + i in bits 4i..4i+3 of
 * word w, value nibble − 8; GPTQ: qweight packed along the input, qzeros along the output, v1
 * zeros stored minus one), group sizes above 32, accuracy against the float originals through
 * a checkpoint quantizer written here from the definitions, and the refusals.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe_kernels.h"

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

Test(int4, table_row)
{
	const struct moek_format_info *f = moek_format_lookup(MOEK_INT4_G32);
	cr_assert(f);
	cr_assert_str_eq(f->name, "INT4_G32");
	cr_assert_eq(f->block_elems, 32);
	cr_assert_eq(f->block_bytes, 20);
	cr_assert(f->weight_format);
	cr_assert_eq(moek_row_bytes(MOEK_INT4_G32, 7168), 224 * 20);
	cr_assert_eq(moek_row_bytes(MOEK_INT4_G32, 48), 0);
	char names[256];
	cr_assert(strstr(moek_weight_format_names(names, sizeof(names)), "INT4_G32"));
}

/* The block: f32 scale word with the zero point in its low 4 bits, Q4_0's nibble order. */
Test(int4, native_block_golden)
{
	uint8_t blk[20];
	put32(blk, 0x3f000000u | 5u); /* d = 0.5, z = 5 */
	for (int j = 0; j < 16; j++)
		blk[4 + j] = (uint8_t)(j | (15 - j) << 4); /* elem j: j, elem j+16: 15 - j */
	float y[32];
	cr_assert_eq(moek_dequantize(MOEK_INT4_G32, blk, NULL, 1, 32, y), 0);
	for (int j = 0; j < 16; j++) {
		cr_assert_eq(y[j], 0.5f * (float)(j - 5), "elem %d", j);
		cr_assert_eq(y[j + 16], 0.5f * (float)(15 - j - 5), "elem %d", j + 16);
	}
}

/* The reference quantizer: the element of largest magnitude is exactly −8 · d (symmetric,
 * zero point 8), and a scale with its low bits set is stored without them. */
Test(int4, native_quantizer_golden)
{
	float x[32], y[32];
	for (int j = 0; j < 32; j++)
		x[j] = (float)(j % 7) - 3.0f;
	x[9] = -8.0f; /* d = 1 */
	uint8_t q[20];
	cr_assert_eq(moek_quantize(MOEK_INT4_G32, x, 1, 32, q, NULL), 0);
	cr_assert_eq(q[0] & 15, 8, "zero point 8");
	cr_assert_eq(moek_dequantize(MOEK_INT4_G32, q, NULL, 1, 32, y), 0);
	for (int j = 0; j < 32; j++)
		cr_assert_eq(y[j], x[j], "elem %d: %g vs %g", j, (double)y[j], (double)x[j]);
	for (int j = 0; j < 32; j++) /* d = 0.3: not representable with 4 bits fewer */
		x[j] *= 0.3f;
	cr_assert_eq(moek_quantize(MOEK_INT4_G32, x, 1, 32, q, NULL), 0);
	uint32_t w =
	    (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
	float d, d0 = 0.3f;
	uint32_t bits = w & ~15u, b0;
	memcpy(&d, &bits, 4);
	memcpy(&b0, &d0, 4);
	cr_assert_eq(bits, b0 & ~15u, "scale bits %08x, want %08x", bits, b0 & ~15u);
	cr_assert(fabsf(d - 0.3f) < 1e-6f);
}

/* compressed-tensors: word w of a row holds elements 8w..8w+7, element 8w + i in bits
 * 4i..4i+3, stored nibble − 8; scales BF16 per group. */
Test(int4, compressed_tensors_packing_golden)
{
	enum { COLS = 64 };
	uint8_t packed[COLS / 2], scales[2 * 2], dst[2 * 20];
	int want_q[COLS];
	for (int w = 0; w < COLS / 8; w++) {
		uint32_t word = 0;
		for (int i = 0; i < 8; i++) {
			const int e = 8 * w + i;
			const unsigned nib = (unsigned)(e * 5 + 3) % 16;
			want_q[e] = (int)nib - 8;
			word |= nib << (4 * i);
		}
		put32(packed + 4 * w, word);
	}
	put16(scales, 0x3f00);     /* 0.5 */
	put16(scales + 2, 0xc080); /* -4.0 */
	char err[200] = "";
	cr_assert_eq(moek_int4_from_ct(packed, scales, 1, COLS, 32, dst, err, sizeof(err)), 0, "%s",
	             err);
	float y[COLS];
	cr_assert_eq(moek_dequantize(MOEK_INT4_G32, dst, NULL, 1, COLS, y), 0);
	for (int e = 0; e < COLS; e++)
		cr_assert_eq(y[e], (e < 32 ? 0.5f : -4.0f) * (float)want_q[e], "elem %d: %g", e,
		             (double)y[e]);
	/* one group of 64: its scale serves both 32-blocks */
	cr_assert_eq(moek_int4_from_ct(packed, scales, 1, COLS, 64, dst, err, sizeof(err)), 0);
	cr_assert_eq(moek_dequantize(MOEK_INT4_G32, dst, NULL, 1, COLS, y), 0);
	for (int e = 0; e < COLS; e++)
		cr_assert_eq(y[e], 0.5f * (float)want_q[e], "group 64 elem %d", e);
}

/* GPTQ: 8 outputs x 64 inputs, group 32. qweight word (i / 8, o) holds input i of output o in
 * bits 4 (i % 8); qzeros word (g, 0) holds output o's zero in bits 4 o; scales F16 [g][o]. */
static void gptq_case(uint8_t *qweight, uint8_t *qzeros, uint8_t *scales, int zero_stored[2][8],
                      int code[8][64])
{
	for (int wi = 0; wi < 8; wi++)
		for (int o = 0; o < 8; o++) {
			uint32_t word = 0;
			for (int n = 0; n < 8; n++) {
				const int i = 8 * wi + n;
				code[o][i] = (i * 7 + o * 3 + 1) % 16;
				word |= (uint32_t)code[o][i] << (4 * n);
			}
			put32(qweight + 4 * (wi * 8 + o), word);
		}
	for (int g = 0; g < 2; g++) {
		uint32_t word = 0;
		for (int o = 0; o < 8; o++) {
			zero_stored[g][o] = (o + 5 * g) % 15; /* 0..14: v1-representable */
			word |= (uint32_t)zero_stored[g][o] << (4 * o);
		}
		put32(qzeros + 4 * g, word);
		for (int o = 0; o < 8; o++) /* f16 0.25 · (1 + o + g): exact in f16 */
			put16(scales + 2 * (g * 8 + o),
			      moek_f32_to_f16(0.25f * (float)(1 + o + g)));
	}
}

Test(int4, gptq_packing_and_zero_points_v1_v2)
{
	uint8_t qweight[8 * 8 * 4], qzeros[2 * 4], scales[2 * 8 * 2], dst[8 * 2 * 20];
	int zs[2][8], code[8][64];
	gptq_case(qweight, qzeros, scales, zs, code);
	float y[8 * 64];
	char err[200] = "";
	for (int v1 = 0; v1 <= 1; v1++) {
		cr_assert_eq(moek_int4_from_gptq(qweight, qzeros, scales, 8, 64, 32, v1, dst, err,
		                                 sizeof(err)),
		             0, "%s", err);
		cr_assert_eq(moek_dequantize(MOEK_INT4_G32, dst, NULL, 8, 64, y), 0);
		for (int o = 0; o < 8; o++)
			for (int i = 0; i < 64; i++) {
				const int g = i / 32, z = zs[g][o] + v1;
				const float s = 0.25f * (float)(1 + o + g);
				cr_assert_eq(y[o * 64 + i], s * (float)(code[o][i] - z),
				             "v%d output %d input %d: %g, want %g", v1 ? 1 : 2, o,
				             i, (double)y[o * 64 + i],
				             (double)(s * (code[o][i] - z)));
			}
	}
	/* group 64: one zero and scale per output for both 32-blocks */
	cr_assert_eq(
	    moek_int4_from_gptq(qweight, qzeros, scales, 8, 64, 64, false, dst, err, sizeof(err)),
	    0);
	cr_assert_eq(moek_dequantize(MOEK_INT4_G32, dst, NULL, 8, 64, y), 0);
	for (int o = 0; o < 8; o++)
		for (int i = 0; i < 64; i++)
			cr_assert_eq(y[o * 64 + i],
			             0.25f * (float)(1 + o) * (float)(code[o][i] - zs[0][o]));
}

/* AutoAWQ GEMM: qweight [in, out / 8] packed along the output in AWQ's order (nibble p holds
 * output 8w + [0, 2, 4, 6, 1, 3, 5, 7][p]), qzeros [in / group, out / 8] the same, scales
 * [in / group, out]. Hand-built words whose nibble p holds p (even inputs) or 7 − p (odd
 * inputs and the zeros) give known values: output o reads nibble N(o) = [0, 4, 1, 5, 2, 6, 3,
 * 7][o], so code N(o) or 7 − N(o), zero 7 − N(o). */
Test(int4, awq_nibble_order_and_zero_points)
{
	static const int N[8] = {0, 4, 1, 5, 2, 6, 3, 7};
	uint8_t qweight[64 * 4], qzeros[2 * 4], scales[2 * 8 * 2], dst[8 * 2 * 20];
	for (int i = 0; i < 64; i++)
		put32(qweight + 4 * i, i % 2 ? 0x01234567u : 0x76543210u);
	for (int g = 0; g < 2; g++) {
		put32(qzeros + 4 * g, 0x01234567u);
		for (int o = 0; o < 8; o++)
			put16(scales + 2 * (g * 8 + o),
			      moek_f32_to_f16(0.5f * (float)(1 + o + 3 * g)));
	}
	char err[200] = "";
	cr_assert_eq(moek_int4_from_awq(qweight, qzeros, scales, 8, 64, 32, dst, err, sizeof(err)),
	             0, "%s", err);
	float y[8 * 64];
	cr_assert_eq(moek_dequantize(MOEK_INT4_G32, dst, NULL, 8, 64, y), 0);
	for (int o = 0; o < 8; o++)
		for (int i = 0; i < 64; i++) {
			const int q = i % 2 ? 7 - N[o] : N[o], z = 7 - N[o];
			const float want = 0.5f * (float)(1 + o + 3 * (i / 32)) * (float)(q - z);
			cr_assert_eq(y[o * 64 + i], want, "output %d input %d: %g, want %g", o, i,
			             (double)y[o * 64 + i], (double)want);
		}
	/* output 1 of an even input is nibble 4 (= 4), not nibble 1: the order, not 0..7 */
	cr_assert_eq(y[1 * 64 + 0], 0.5f * 2.0f * (float)(4 - 3));
	/* outputs not a multiple of 8, a group not dividing the row: refused by name */
	cr_assert_eq(moek_int4_from_awq(qweight, qzeros, scales, 4, 64, 32, dst, err, sizeof(err)),
	             -1);
	cr_assert_str_eq(err, "AWQ INT4: 4 x 64 in groups of 32 (groups must be a multiple of 32 "
	                      "dividing the row; rows a multiple of 8)");
	cr_assert_eq(moek_int4_from_awq(qweight, qzeros, scales, 8, 64, 48, dst, err, sizeof(err)),
	             -1);
}

Test(int4, refusals_name_what_was_found)
{
	uint8_t buf[4096] = {0}, dst[4096];
	char err[200] = "";
	cr_assert_eq(moek_int4_from_ct(buf, buf, 1, 64, 48, dst, err, sizeof(err)), -1);
	cr_assert_str_eq(err, "compressed-tensors INT4: 1 x 64 in groups of 48 (groups must be a "
	                      "multiple of 32 dividing the row)");
	cr_assert_eq(moek_int4_from_ct(buf, buf, 1, 96, 64, dst, err, sizeof(err)), -1);
	cr_assert_str_eq(err, "compressed-tensors INT4: 1 x 96 in groups of 64 (groups must be a "
	                      "multiple of 32 dividing the row)");
	cr_assert_eq(moek_int4_from_gptq(buf, buf, buf, 4, 64, 32, false, dst, err, sizeof(err)),
	             -1);
	cr_assert_str_eq(err, "GPTQ INT4: 4 x 64 in groups of 32 (groups must be a multiple of 32 "
	                      "dividing the row; rows a multiple of 8)");
	/* v1 stored zero 15 means zero point 16 */
	put32(buf + 1024, 0xfu << 12); /* output 3's zero */
	cr_assert_eq(moek_int4_from_gptq(buf, buf + 1024, buf + 2048, 8, 32, 32, true, dst, err,
	                                 sizeof(err)),
	             -1);
	cr_assert_str_eq(err, "GPTQ INT4 (v1 zero points): output 3 group 0 stores zero 15, i.e. "
	                      "zero point 16, which INT4_G32 cannot hold");
	/* v2 takes 15 as it is */
	cr_assert_eq(moek_int4_from_gptq(buf, buf + 1024, buf + 2048, 8, 32, 32, false, dst, err,
	                                 sizeof(err)),
	             0);
}

/* A checkpoint quantizer from the compressed-tensors definition (symmetric: scale = amax /
 * 7.5 in BF16, q = clamp(round(x / scale), −8, 7)), through the repack: the normalised error
 * against the float originals is that of a 4-bit symmetric quantizer, for groups 32 and 128. */
static uint16_t bf16_of(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_val(uint16_t h)
{
	const uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

Test(int4, compressed_tensors_accuracy_against_floats)
{
	enum { R = 16, C = 1024 };
	static float x[R * C], y[R * C];
	static uint8_t packed[R * C / 2], scales[R * C / 32 * 2], dst[R * C / 32 * 20];
	unsigned seed = 12345;
	for (int i = 0; i < R * C; i++) {
		seed = seed * 1103515245u + 12345u;
		x[i] = ((float)(seed >> 8) * 0x1p-24f - 0.5f) * 0.2f;
	}
	const size_t groups[] = {32, 128};
	const double bound[] = {5e-3, 8e-3};
	for (size_t gi = 0; gi < 2; gi++) {
		const size_t G = groups[gi];
		memset(packed, 0, sizeof(packed));
		for (size_t r = 0; r < R; r++)
			for (size_t g = 0; g < C / G; g++) {
				float amax = 0;
				for (size_t j = 0; j < G; j++)
					amax = fmaxf(amax, fabsf(x[r * C + g * G + j]));
				const uint16_t sb = bf16_of(amax / 7.5f);
				put16(scales + 2 * (r * (C / G) + g), sb);
				const float s = bf16_val(sb);
				for (size_t j = 0; j < G; j++) {
					const size_t e = g * G + j;
					float q = rintf(x[r * C + e] / s);
					q = q < -8 ? -8 : q > 7 ? 7 : q;
					packed[r * C / 2 + e / 2] |=
					    (uint8_t)(((unsigned)((int)q + 8)) << (4 * (e % 2)));
				}
			}
		char err[200];
		cr_assert_eq(moek_int4_from_ct(packed, scales, R, C, G, dst, err, sizeof(err)), 0);
		cr_assert_eq(moek_dequantize(MOEK_INT4_G32, dst, NULL, R, C, y), 0);
		double num = 0, den = 0;
		for (int i = 0; i < R * C; i++) {
			num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
			den += (double)x[i] * x[i];
		}
		cr_log_info("compressed-tensors group %zu: nmse %.3g", G, num / den);
		cr_expect(num / den <= bound[gi], "group %zu: nmse %.3g > %.3g", G, num / den,
		          bound[gi]);
		cr_expect(num / den > 1e-4, "a 4-bit quantizer cannot be this exact: %.3g",
		          num / den);
	}
}
