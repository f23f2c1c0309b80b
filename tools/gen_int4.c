/* gen_int4.c — the generator's INT4 checkpoint quantizer: float matrices into the tensors of
 * compressed-tensors pack-quantized and GPTQ checkpoints, written from the formats'
 * definitions (moe_kernels.h, moek_int4_from_ct / moek_int4_from_gptq, read them back).
 *
 * Both are symmetric with a group's scale s = amax / 7.5 (the largest magnitude maps to the
 * ends of −8..7, as compressed-tensors' symmetric observer picks it), stored in the
 * checkpoint's dtype (BF16, F16) and used as stored: q = clamp(nearest-even(x / s), −8, 7).
 * compressed-tensors keeps q + 8 as offset binary; GPTQ keeps q + 8 with zero point 8 (v1
 * stores it minus one: 7). g_idx is i / group.
 *
 * AWQ is asymmetric, as AutoAWQ's GEMM quantizer: per group s = (max − min) / 15 (stored F16,
 * used as stored), zero z = clamp(nearest-even(−min / s), 0, 15), q = clamp(nearest-even(x / s)
 * + z, 0, 15); output o's nibble in its word is AWQ's [0, 4, 1, 5, 2, 6, 3, 7][o % 8].
 * Pure; no allocation.
 */
#include <math.h>
#include <string.h>

#include "gen_internal.h"
#include "moe_kernels.h"

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* The stored scale of a group and the code (0..15) of x in it. */
static float group_scale(const float *x, size_t n, bool f16, uint16_t *stored)
{
	float amax = 0.0f;
	for (size_t j = 0; j < n; j++)
		amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
	*stored = f16 ? moek_f32_to_f16(amax / 7.5f) : moek_f32_to_bf16(amax / 7.5f);
	return f16 ? moek_f16_to_f32(*stored) : moek_bf16_to_f32(*stored);
}

static unsigned code_of(float x, float s)
{
	float v = s != 0.0f ? x / s : 0.0f;
	v = v > -8.0f ? (v < 7.0f ? v : 7.0f) : -8.0f;
	return (unsigned)((int)rintf(v) + 8);
}

void gen_int4_ct(const float *x, size_t rows, size_t cols, size_t group, uint8_t *packed,
                 uint8_t *scales)
{
	memset(packed, 0, rows * cols / 2);
	for (size_t r = 0; r < rows; r++)
		for (size_t g = 0; g < cols / group; g++) {
			const float *xg = x + r * cols + g * group;
			uint16_t st;
			const float s = group_scale(xg, group, false, &st);
			scales[2 * (r * (cols / group) + g)] = (uint8_t)st;
			scales[2 * (r * (cols / group) + g) + 1] = (uint8_t)(st >> 8);
			for (size_t j = 0; j < group; j++) {
				const size_t e = g * group + j; /* word e / 8, bits 4 (e % 8) */
				packed[r * cols / 2 + e / 2] |=
				    (uint8_t)(code_of(xg[j], s) << (4 * (e % 2)));
			}
		}
}

void gen_int4_gptq(const float *x, size_t rows, size_t cols, size_t group, uint8_t *qweight,
                   uint8_t *qzeros, uint8_t *scales, uint8_t *g_idx)
{
	memset(qweight, 0, rows * cols / 2);
	memset(qzeros, 0, rows / 2 * (cols / group));
	for (size_t o = 0; o < rows; o++)
		for (size_t g = 0; g < cols / group; g++) {
			const float *xg = x + o * cols + g * group;
			uint16_t st;
			const float s = group_scale(xg, group, true, &st);
			scales[2 * (g * rows + o)] = (uint8_t)st;
			scales[2 * (g * rows + o) + 1] = (uint8_t)(st >> 8);
			/* zero point 8, stored minus one (v1): nibble o % 8 of word (g, o / 8) */
			qzeros[4 * (g * (rows / 8) + o / 8) + (o % 8) / 2] |=
			    (uint8_t)(7u << (4 * (o % 2)));
			for (size_t j = 0; j < group; j++) {
				const size_t i =
				    g * group + j; /* word (i / 8, o), bits 4 (i % 8) */
				qweight[4 * (i / 8 * rows + o) + (i % 8) / 2] |=
				    (uint8_t)(code_of(xg[j], s) << (4 * (i % 2)));
			}
		}
	for (size_t i = 0; i < cols; i++)
		put32(g_idx + 4 * i, (uint32_t)(i / group));
}

void gen_int4_awq(const float *x, size_t rows, size_t cols, size_t group, uint8_t *qweight,
                  uint8_t *qzeros, uint8_t *scales)
{
	static const uint8_t awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
	memset(qweight, 0, rows * cols / 2);
	memset(qzeros, 0, rows / 2 * (cols / group));
	for (size_t o = 0; o < rows; o++) {
		const unsigned n = awq_nibble[o % 8];
		for (size_t g = 0; g < cols / group; g++) {
			const float *xg = x + o * cols + g * group;
			float lo = 0.0f, hi = 0.0f;
			for (size_t j = 0; j < group; j++) {
				lo = xg[j] < lo ? xg[j] : lo;
				hi = xg[j] > hi ? xg[j] : hi;
			}
			const uint16_t st = moek_f32_to_f16((hi - lo) / 15.0f);
			const float s = moek_f16_to_f32(st);
			scales[2 * (g * rows + o)] = (uint8_t)st;
			scales[2 * (g * rows + o) + 1] = (uint8_t)(st >> 8);
			float zf = s != 0.0f ? rintf(-lo / s) : 0.0f;
			zf = zf > 0.0f ? (zf < 15.0f ? zf : 15.0f) : 0.0f;
			const unsigned z = (unsigned)zf;
			/* word (g, o / 8), nibble n: byte n / 2, shift 4 (n % 2) */
			qzeros[4 * (g * (rows / 8) + o / 8) + n / 2] |=
			    (uint8_t)(z << (4 * (n % 2)));
			for (size_t j = 0; j < group; j++) {
				const size_t i = g * group + j; /* word (i, o / 8) */
				float v = s != 0.0f ? rintf(xg[j] / s) + zf : zf;
				v = v > 0.0f ? (v < 15.0f ? v : 15.0f) : 0.0f;
				qweight[4 * (i * (rows / 8) + o / 8) + n / 2] |=
				    (uint8_t)((unsigned)v << (4 * (n % 2)));
			}
		}
	}
}
