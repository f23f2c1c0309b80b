/* fmt_k23.c — scalar reference of Q2_K and Q3_K, the 2- and 3-bit K-quants of llama.cpp's
 * Q2_K and Q3_K_M mixes (the formats.c table points here).
 *
 * Both split a 256-element super-block into 16 sub-blocks of 16 elements with a 4-bit (Q2_K,
 * plus a 4-bit min) or 6-bit (Q3_K) scale against one f16 super-scale, and store the codes in
 * the same traversal as Q6_K's ql: byte 32h + l of qs holds elements 128h + 32s + l at bit
 * 2s (s = 0..3). Q3_K's third bit of element e is bit e / 32 of hmask[e % 32].
 *
 * The quantizers search as ggml's quantize_row_q2_K_ref / q3_K_ref do: Q2_K fits scale and
 * min per sub-block by a weighted (|x|) absolute-error search over 16 candidate grids, Q3_K
 * a symmetric scale refined element by element against x²-weighted squared error; then the
 * sub-block scales are quantized against the largest and every level recomputed from the
 * rounded scales. Written from the format definitions; rounding is ggml's (nearest, ties to
 * even). Pure functions; no allocation; thread-safe.
 */
#include <math.h>
#include <string.h>

#include "kernels_internal.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* d · sc · q - dmin · m rounded as written, as the SIMD paths */
#endif

enum { SUB = 16, NSUB = QK_K / SUB };

/* Round to nearest, ties to even (ggml's nearest_int), for the quantizers' range; NaN and
 * out-of-range values are clamped first so no conversion is undefined. */
static inline int nearest(float v)
{
	if (!(v > -4194303.f))
		return -4194303;
	if (v > 4194303.f)
		return 4194303;
	return (int)lrintf(v);
}

static inline int clampi(int v, int lo, int hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/* Codes L[0..255] (0..3) into qs: byte 32h + l, bits 2s, element 128h + 32s + l. */
static void pack_2bit(const uint8_t L[QK_K], uint8_t qs[QK_K / 4])
{
	for (int h = 0; h < 2; h++)
		for (int l = 0; l < 32; l++) {
			const uint8_t *q = L + 128 * h + l;
			qs[32 * h + l] =
			    (uint8_t)(q[0] | (q[32] << 2) | (q[64] << 4) | (q[96] << 6));
		}
}

static inline int code_2bit(const uint8_t *qs, int e)
{
	return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

/* ---- Q2_K ---------------------------------------------------------------------------------- */

/* x ≈ scale · L + min over 16 values, L in 0..3, min <= 0, minimising Σ |x| · |error|: the
 * start grid 3 / (max - min), then 16 grids (2.5 + 0.1 is) / (max - min), each refitted by
 * weighted least squares (min clamped to 0, refitting the scale alone) and kept if its
 * absolute error is lower. Returns the scale; *neg_min = -min; L holds the best levels. */
static float fit_scale_min_2bit(const float *x, uint8_t L[SUB], float *neg_min)
{
	const int nmax = 3;
	float w[SUB], min = x[0], max = x[0], sum_w = 0, sum_x = 0;
	for (int i = 0; i < SUB; i++) {
		w[i] = fabsf(x[i]);
		min = x[i] < min ? x[i] : min;
		max = x[i] > max ? x[i] : max;
		sum_w += w[i];
		sum_x += w[i] * x[i];
	}
	if (min > 0)
		min = 0;
	if (max == min) {
		memset(L, 0, SUB);
		*neg_min = -min;
		return 0.f;
	}
	float iscale = (float)nmax / (max - min), scale = 1 / iscale, best = 0;
	for (int i = 0; i < SUB; i++) {
		L[i] = (uint8_t)clampi(nearest(iscale * (x[i] - min)), 0, nmax);
		best += w[i] * fabsf(scale * L[i] + min - x[i]);
	}
	for (int is = 0; is <= 15; is++) {
		uint8_t Lc[SUB];
		float sum_l = 0, sum_l2 = 0, sum_xl = 0;
		iscale = (-0.5f + 0.1f * (float)is + (float)nmax) / (max - min);
		for (int i = 0; i < SUB; i++) {
			Lc[i] = (uint8_t)clampi(nearest(iscale * (x[i] - min)), 0, nmax);
			const float wl = w[i] * Lc[i];
			sum_l += wl;
			sum_l2 += wl * Lc[i];
			sum_xl += wl * x[i];
		}
		const float D = sum_w * sum_l2 - sum_l * sum_l;
		if (!(D > 0))
			continue;
		float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
		float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
		if (this_min > 0) {
			this_min = 0;
			this_scale = sum_xl / sum_l2;
		}
		float err = 0;
		for (int i = 0; i < SUB; i++)
			err += w[i] * fabsf(this_scale * Lc[i] + this_min - x[i]);
		if (err < best) {
			memcpy(L, Lc, SUB);
			best = err;
			scale = this_scale;
			min = this_min;
		}
	}
	*neg_min = -min;
	return scale;
}

void moek_quantize_q2_K(const float *x, void *dst, size_t n)
{
	struct block_q2_K *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		uint8_t L[QK_K];
		float scales[NSUB], mins[NSUB], max_scale = 0, max_min = 0;
		for (int j = 0; j < NSUB; j++) {
			scales[j] = fit_scale_min_2bit(x + SUB * j, L + SUB * j, &mins[j]);
			max_scale = scales[j] > max_scale ? scales[j] : max_scale;
			max_min = mins[j] > max_min ? mins[j] : max_min;
		}
		/* 4-bit scales and mins against the largest of each (15 = the largest) */
		const float is = max_scale > 0 ? 15.f / max_scale : 0.f;
		const float im = max_min > 0 ? 15.f / max_min : 0.f;
		for (int j = 0; j < NSUB; j++)
			y[i].scales[j] = (uint8_t)(clampi(nearest(is * scales[j]), 0, 15) |
			                           clampi(nearest(im * mins[j]), 0, 15) << 4);
		y[i].d = moek_f32_to_f16(max_scale > 0 ? max_scale / 15.f : 0.f);
		y[i].dmin = moek_f32_to_f16(max_min > 0 ? max_min / 15.f : 0.f);
		/* the levels again, against the scales as stored */
		const float d = moek_f16_to_f32(y[i].d), dmin = moek_f16_to_f32(y[i].dmin);
		for (int j = 0; j < NSUB; j++) {
			const float dj = d * (float)(y[i].scales[j] & 0xF);
			if (dj == 0.0f)
				continue;
			const float mj = dmin * (float)(y[i].scales[j] >> 4);
			for (int l = 0; l < SUB; l++)
				L[SUB * j + l] =
				    (uint8_t)clampi(nearest((x[SUB * j + l] + mj) / dj), 0, 3);
		}
		pack_2bit(L, y[i].qs);
	}
}

void moek_dequantize_q2_K(const void *src, float *y, size_t n)
{
	const struct block_q2_K *b = src;
	for (size_t i = 0; i < n / QK_K; i++, y += QK_K) {
		const float d = moek_f16_to_f32(b[i].d), dmin = moek_f16_to_f32(b[i].dmin);
		for (int e = 0; e < QK_K; e++) {
			const uint8_t s = b[i].scales[e / SUB];
			y[e] = d * (float)(s & 0xF) * (float)code_2bit(b[i].qs, e) -
			       dmin * (float)(s >> 4);
		}
	}
}

/* ---- Q3_K ---------------------------------------------------------------------------------- */

/* x ≈ scale · L over 16 values, L in -4..3: the start grid -4 / (signed extreme), then up to
 * 5 passes that move each level to the one the other levels' least-squares fit asks for,
 * kept when the x²-weighted fit improves. Returns the scale (0 for a group of tiny values,
 * L all 0). */
static float fit_scale_3bit(const float *x, int8_t L[SUB])
{
	const int nmax = 4;
	float max = 0, amax = 0;
	for (int i = 0; i < SUB; i++)
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	if (amax < 1e-15f) {
		memset(L, 0, SUB);
		return 0.f;
	}
	const float iscale = -(float)nmax / max;
	float sumlx = 0, suml2 = 0;
	for (int i = 0; i < SUB; i++) {
		L[i] = (int8_t)clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
		const float w = x[i] * x[i];
		sumlx += w * x[i] * L[i];
		suml2 += w * L[i] * L[i];
	}
	for (int pass = 0; pass < 5; pass++) {
		int changed = 0;
		for (int i = 0; i < SUB; i++) {
			const float w = x[i] * x[i];
			float slx = sumlx - w * x[i] * L[i];
			if (!(slx > 0))
				continue;
			float sl2 = suml2 - w * L[i] * L[i];
			const int nl = clampi(nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
			if (nl == L[i])
				continue;
			slx += w * x[i] * nl;
			sl2 += w * nl * nl;
			if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
				L[i] = (int8_t)nl;
				sumlx = slx;
				suml2 = sl2;
				changed++;
			}
		}
		if (!changed)
			break;
	}
	return sumlx / suml2;
}

void moek_quantize_q3_K(const float *x, void *dst, size_t n)
{
	struct block_q3_K *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		int8_t Ls[QK_K];
		uint8_t L[QK_K];
		float scales[NSUB], max_scale = 0, amax = 0;
		for (int j = 0; j < NSUB; j++) {
			scales[j] = fit_scale_3bit(x + SUB * j, Ls + SUB * j);
			if (fabsf(scales[j]) > amax) {
				amax = fabsf(scales[j]);
				max_scale = scales[j];
			}
		}
		memset(y[i].scales, 0, sizeof(y[i].scales));
		y[i].d = 0;
		if (max_scale != 0.0f) {
			/* 6-bit signed scales: the extreme maps to -32 */
			const float iscale = -32.f / max_scale;
			for (int j = 0; j < NSUB; j++) {
				const int l = clampi(nearest(iscale * scales[j]), -32, 31) + 32;
				y[i].scales[j % 8] |= (uint8_t)((l & 0xF) << (j < 8 ? 0 : 4));
				y[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
			}
			y[i].d = moek_f32_to_f16(1 / iscale);
		}
		/* the levels again, against the scales as stored; a zero scale keeps code 4 (0) */
		const float d = moek_f16_to_f32(y[i].d);
		uint8_t sc[NSUB];
		moek_q3_scales(y[i].scales, sc);
		for (int j = 0; j < NSUB; j++) {
			const float dj = d * (float)(sc[j] - 32);
			for (int l = 0; l < SUB; l++) {
				const int e = SUB * j + l;
				L[e] =
				    (uint8_t)(dj == 0.0f ? Ls[e] + 4
				                         : clampi(nearest(x[e] / dj), -4, 3) + 4);
			}
		}
		memset(y[i].hmask, 0, sizeof(y[i].hmask));
		for (int e = 0; e < QK_K; e++)
			if (L[e] > 3) {
				y[i].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
				L[e] -= 4;
			}
		pack_2bit(L, y[i].qs);
	}
}

void moek_dequantize_q3_K(const void *src, float *y, size_t n)
{
	const struct block_q3_K *b = src;
	for (size_t i = 0; i < n / QK_K; i++, y += QK_K) {
		const float d = moek_f16_to_f32(b[i].d);
		uint8_t sc[NSUB];
		moek_q3_scales(b[i].scales, sc);
		for (int e = 0; e < QK_K; e++) {
			const int hi = (b[i].hmask[e % 32] >> (e / 32)) & 1;
			const int q = code_2bit(b[i].qs, e) - (hi ? 0 : 4);
			y[e] = d * (float)(sc[e / SUB] - 32) * (float)q;
		}
	}
}
