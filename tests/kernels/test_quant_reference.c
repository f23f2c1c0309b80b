/* test_quant_reference.c — the vectorised quantizers give, byte for byte, what the plain
 * scalar reference gave before them (kernels/formats.c at commit 077ba1b, kept below as the
 * oracle: ggml's make_qkx2_quants / make_qx_quants searches written as simple loops, Q8_0 with
 * roundf, MXFP4 by exhaustive nearest-code search). Inputs: random rows of several shapes and
 * scales, plus the blocks where lock-step lanes could diverge from the scalar loop: all zero,
 * constant, all negative, one outlier, tiny (below ggml's 1e-15 group epsilon), mixed
 * sub-blocks in one super-block, and huge values near the E8M0 limits for MXFP4. IQ4_NL and
 * IQ4_XS, whose search runs candidates in vector lanes, against the same search in plain loops.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels_internal.h"

/* ---- the oracle (scalar reference of 077ba1b) ----------------------------------------- */

static inline int nearest_int(float v)
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

static void oracle_quantize_q8_0(const float *x, void *dst, size_t n)
{
	struct block_q8_0 *y = dst;
	for (size_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
		float amax = 0.0f;
		for (int j = 0; j < QK8_0; j++)
			amax = fmaxf(amax, fabsf(x[j]));
		const float d = amax / 127.0f;
		const float id = d != 0.0f ? 1.0f / d : 0.0f;
		y[i].d = moek_f32_to_f16(d);
		for (int j = 0; j < QK8_0; j++) /* roundf: ties away from zero, as ggml */
			y[i].qs[j] = (int8_t)clampi(
			    (int)roundf(fmaxf(-127.f, fminf(127.f, x[j] * id))), -127, 127);
	}
}

/* Code of the E2M1 value (doubled, times scale e) nearest to x; ties to the lower code. */
static int oracle_mxfp4_best_code(float x, float e)
{
	int best = 0;
	float best_err = fabsf((float)moek_mxfp4_kvalues[0] * e - x);
	for (int c = 1; c < 16; c++) {
		const float err = fabsf((float)moek_mxfp4_kvalues[c] * e - x);
		if (err < best_err) {
			best = c;
			best_err = err;
		}
	}
	return best;
}

static void oracle_quantize_mxfp4(const float *x, void *dst, size_t n)
{
	struct block_mxfp4 *y = dst;
	for (size_t i = 0; i < n / QK_MXFP4; i++, x += QK_MXFP4) {
		float amax = 0.0f;
		for (int j = 0; j < QK_MXFP4; j++)
			amax = fmaxf(amax, fabsf(x[j]));
		/* ggml: e = floor(log2(amax)) - 2 + 127, so amax / 2^(e-127) lands in [4, 8) and
		 * the largest code (6) sits near the top. Clamped to the finite E8M0 range. */
		int e = 0;
		if (amax > 0.0f && isfinite(amax))
			e = clampi((int)floorf(log2f(amax)) - 2 + 127, 0, 254);
		else if (amax > 0.0f)
			e = 254;
		const float half_scale = ldexpf(1.0f, e - 128); /* kvalues are doubled */
		y[i].e = (uint8_t)e;
		for (int j = 0; j < QK_MXFP4 / 2; j++) {
			const int lo = oracle_mxfp4_best_code(x[j], half_scale);
			const int hi = oracle_mxfp4_best_code(x[j + QK_MXFP4 / 2], half_scale);
			y[i].qs[j] = (uint8_t)(lo | (hi << 4));
		}
	}
}

/* Asymmetric search (ggml's make_qkx2_quants): x ~ scale * L + min with L in 0..nmax, min <= 0,
 * minimising the weighted squared error over nstep+1 candidate scales. Returns the scale;
 * *neg_min receives -min (>= 0). */
static float oracle_search_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                                     float *neg_min, uint8_t *Laux, float rmin, float rdelta,
                                     int nstep)
{
	float min = x[0], max = x[0];
	float sum_w = w[0], sum_x = w[0] * x[0];
	for (int i = 1; i < n; i++) {
		if (x[i] < min)
			min = x[i];
		if (x[i] > max)
			max = x[i];
		sum_w += w[i];
		sum_x += w[i] * x[i];
	}
	if (min > 0)
		min = 0;
	if (max == min) {
		memset(L, 0, (size_t)n);
		*neg_min = -min;
		return 0.0f;
	}
	float iscale = (float)nmax / (max - min);
	float scale = 1.0f / iscale;
	float best_error = 0;
	for (int i = 0; i < n; i++) {
		const int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
		L[i] = (uint8_t)l;
		const float diff = scale * (float)l + min - x[i];
		best_error += w[i] * diff * diff;
	}
	for (int is = 0; is <= nstep; is++) {
		iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
		float sum_l = 0, sum_l2 = 0, sum_xl = 0;
		for (int i = 0; i < n; i++) {
			const int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
			Laux[i] = (uint8_t)l;
			sum_l += w[i] * (float)l;
			sum_l2 += w[i] * (float)l * (float)l;
			sum_xl += w[i] * (float)l * x[i];
		}
		const float D = sum_w * sum_l2 - sum_l * sum_l;
		if (D > 0) {
			float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
			float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
			if (this_min > 0) {
				this_min = 0;
				this_scale = sum_xl / sum_l2;
			}
			float cur_error = 0;
			for (int i = 0; i < n; i++) {
				const float diff = this_scale * (float)Laux[i] + this_min - x[i];
				cur_error += w[i] * diff * diff;
			}
			if (cur_error < best_error) {
				memcpy(L, Laux, (size_t)n);
				best_error = cur_error;
				scale = this_scale;
				min = this_min;
			}
		}
	}
	*neg_min = -min;
	return scale;
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): per 32-element sub-block scale/min search,
 * 6-bit quantization of scales and mins against the super-block's d/dmin, then the final
 * levels L (0..nmax) against the rounded scales. Fills d, dmin, scales; returns L. */
static void oracle_quantize_k_superblock(const float *x, int nmax, float rmin, int nstep,
                                         uint16_t *d, uint16_t *dmin, uint8_t packed[K_SCALE_SIZE],
                                         uint8_t L[QK_K])
{
	uint8_t Laux[32];
	float weights[32], mins[QK_K / 32], scales[QK_K / 32];
	float max_scale = 0, max_min = 0;
	for (int j = 0; j < QK_K / 32; j++) {
		float sum_x2 = 0;
		for (int l = 0; l < 32; l++)
			sum_x2 += x[32 * j + l] * x[32 * j + l];
		const float av_x = sqrtf(sum_x2 / 32);
		for (int l = 0; l < 32; l++)
			weights[l] = av_x + fabsf(x[32 * j + l]);
		scales[j] = oracle_search_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j,
		                                    &mins[j], Laux, rmin, 0.1f, nstep);
		if (scales[j] > max_scale)
			max_scale = scales[j];
		if (mins[j] > max_min)
			max_min = mins[j];
	}
	const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
	const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
	memset(packed, 0, K_SCALE_SIZE);
	for (int j = 0; j < QK_K / 32; j++) {
		const uint8_t ls = (uint8_t)clampi(nearest_int(inv_scale * scales[j]), 0, 63);
		const uint8_t lm = (uint8_t)clampi(nearest_int(inv_min * mins[j]), 0, 63);
		if (j < 4) {
			packed[j] |= ls;
			packed[j + 4] |= lm;
		} else {
			packed[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
			packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
			packed[j] |= (uint8_t)((lm >> 4) << 6);
		}
	}
	*d = moek_f32_to_f16(max_scale / 63.f);
	*dmin = moek_f32_to_f16(max_min / 63.f);
	for (int j = 0; j < QK_K / 32; j++) {
		uint8_t sc, m;
		moek_k4_scale_min(j, packed, &sc, &m);
		const float dj = moek_f16_to_f32(*d) * (float)sc;
		if (dj == 0.0f)
			continue;
		const float dm = moek_f16_to_f32(*dmin) * (float)m;
		for (int ii = 0; ii < 32; ii++)
			L[32 * j + ii] =
			    (uint8_t)clampi(nearest_int((x[32 * j + ii] + dm) / dj), 0, nmax);
	}
}

static void oracle_quantize_q4_K(const float *x, void *dst, size_t n)
{
	struct block_q4_K *y = dst;
	uint8_t L[QK_K];
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		oracle_quantize_k_superblock(x, 15, -1.0f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
		for (int j = 0; j < QK_K; j += 64)
			for (int l = 0; l < 32; l++)
				y[i].qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
	}
}

static void oracle_quantize_q5_K(const float *x, void *dst, size_t n)
{
	struct block_q5_K *y = dst;
	uint8_t L[QK_K];
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		oracle_quantize_k_superblock(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
		memset(y[i].qh, 0, sizeof(y[i].qh));
		uint8_t m1 = 1, m2 = 2;
		for (int c = 0; c < 4; c++, m1 <<= 2, m2 <<= 2) {
			for (int j = 0; j < 32; j++) {
				int l1 = L[64 * c + j], l2 = L[64 * c + j + 32];
				if (l1 > 15) {
					l1 -= 16;
					y[i].qh[j] |= m1;
				}
				if (l2 > 15) {
					l2 -= 16;
					y[i].qh[j] |= m2;
				}
				y[i].qs[32 * c + j] = (uint8_t)(l1 | (l2 << 4));
			}
		}
	}
}

/* Symmetric search (ggml's make_qx_quants, rmse_type 1: weights x^2): x ~ scale * (L - nmax)
 * with L in 0..2*nmax-1. Returns the scale (signed). */
static float oracle_search_scale_sym(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0, amax = 0;
	for (int i = 0; i < n; i++) {
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	}
	if (amax < 1e-15f) { /* ggml's GROUP_MAX_EPS */
		memset(L, 0, (size_t)n);
		return 0.0f;
	}
	float iscale = -(float)nmax / max;
	float sumlx = 0, suml2 = 0;
	for (int i = 0; i < n; i++) {
		const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
		L[i] = (int8_t)(l + nmax);
		const float w = x[i] * x[i];
		sumlx += w * x[i] * (float)l;
		suml2 += w * (float)l * (float)l;
	}
	float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
	float best = scale * sumlx;
	for (int is = -9; is <= 9; is++) {
		if (is == 0)
			continue;
		iscale = -((float)nmax + 0.1f * (float)is) / max;
		sumlx = suml2 = 0;
		for (int i = 0; i < n; i++) {
			const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
			const float w = x[i] * x[i];
			sumlx += w * x[i] * (float)l;
			suml2 += w * (float)l * (float)l;
		}
		if (suml2 > 0 && sumlx * sumlx > best * suml2) {
			for (int i = 0; i < n; i++)
				L[i] = (int8_t)(nmax + clampi(nearest_int(iscale * x[i]), -nmax,
				                              nmax - 1));
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
	return scale;
}

static void oracle_quantize_q6_K(const float *x, void *dst, size_t n)
{
	struct block_q6_K *y = dst;
	int8_t L[QK_K];
	float scales[QK_K / 16];
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float max_scale = 0, max_abs_scale = 0;
		for (int ib = 0; ib < QK_K / 16; ib++) {
			scales[ib] = oracle_search_scale_sym(16, 32, x + 16 * ib, L + 16 * ib);
			if (fabsf(scales[ib]) > max_abs_scale) {
				max_abs_scale = fabsf(scales[ib]);
				max_scale = scales[ib];
			}
		}
		if (max_abs_scale < 1e-15f) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		const float iscale = -128.f / max_scale;
		y[i].d = moek_f32_to_f16(1.0f / iscale);
		for (int ib = 0; ib < QK_K / 16; ib++)
			y[i].scales[ib] =
			    (int8_t)clampi(nearest_int(iscale * scales[ib]), -128, 127);
		for (int j = 0; j < QK_K / 16; j++) {
			const float d = moek_f16_to_f32(y[i].d) * (float)y[i].scales[j];
			if (d == 0.0f)
				continue;
			for (int ii = 0; ii < 16; ii++)
				L[16 * j + ii] =
				    (int8_t)(clampi(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
		}
		for (int h = 0; h < 2; h++) { /* two halves of 128 elements */
			uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
			const int8_t *Lh = L + 128 * h;
			for (int l = 0; l < 32; l++) {
				const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64],
				          q4 = Lh[l + 96];
				ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
				ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
				qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) |
				                  ((q4 >> 4) << 6));
			}
		}
	}
}

/* IQ4_NL / IQ4_XS (fmt_iq4.c, which runs the candidates in vector lanes): the same search as
 * plain loops, one candidate at a time, nearest level by a midpoint count. */
static const float iq4_mid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                  7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};

static int oracle_iq4_code(float v)
{
	int c = 0;
	while (c < 15 && v > iq4_mid[c])
		c++;
	return c;
}

static float oracle_iq4_scale(const float *x)
{
	float amax = 0.0f, max = 0.0f;
	for (int j = 0; j < 32; j++)
		if (fabsf(x[j]) > amax)
			amax = fabsf(x[j]), max = x[j];
	if (!(amax > 1e-30f))
		return 0.0f;
	if (!isfinite(amax))
		return max / -127.0f;
	float d = 0.0f, best = 0.0f;
	for (int c = 0; c < 16; c++) {
		const float target = c < 8 ? (float)(-131 + c) : (float)(109 + c - 8);
		const float id = target / max;
		float sumqx = 0.0f, sumq2 = 0.0f;
		for (int j = 0; j < 32; j++) {
			const float q = (float)moek_iq4_kvalues[oracle_iq4_code(x[j] * id)];
			sumqx += q * x[j];
			sumq2 += q * q;
		}
		if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
			d = sumqx / sumq2;
			best = d * sumqx;
		}
	}
	return d;
}

static void oracle_iq4_pack(const float *x, float s, uint8_t *qs)
{
	const float is = s != 0.0f ? 1.0f / s : 0.0f;
	for (int j = 0; j < 16; j++)
		qs[j] =
		    (uint8_t)(oracle_iq4_code(x[j] * is) | oracle_iq4_code(x[j + 16] * is) << 4);
}

static void oracle_quantize_iq4_nl(const float *x, void *dst, size_t n)
{
	struct block_iq4_nl *y = dst;
	for (size_t i = 0; i < n / 32; i++, x += 32) {
		y[i].d = moek_f32_to_f16(oracle_iq4_scale(x));
		oracle_iq4_pack(x, moek_f16_to_f32(y[i].d), y[i].qs);
	}
}

static void oracle_quantize_iq4_xs(const float *x, void *dst, size_t n)
{
	struct block_iq4_xs *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float sc[8], amax = 0.0f, max = 0.0f;
		for (int ib = 0; ib < 8; ib++) {
			sc[ib] = oracle_iq4_scale(x + 32 * ib);
			if (fabsf(sc[ib]) > amax)
				amax = fabsf(sc[ib]), max = sc[ib];
		}
		memset(&y[i], 0, sizeof(y[i]));
		y[i].d = moek_f32_to_f16(amax > 0.0f ? max / -32.0f : 0.0f);
		const float dd = moek_f16_to_f32(y[i].d);
		const float id = dd != 0.0f && isfinite(dd) ? 1.0f / dd : 0.0f;
		for (int ib = 0; ib < 8; ib++) {
			const float v = id * sc[ib];
			const int l = !(v > -32.0f) ? -32 : v >= 31.0f ? 31 : (int)lrintf(v);
			y[i].scales_l[ib / 2] |= (uint8_t)(((l + 32) & 15) << (4 * (ib % 2)));
			y[i].scales_h |= (uint16_t)(((l + 32) >> 4) << (2 * ib));
			oracle_iq4_pack(x + 32 * ib, dd * (float)l, y[i].qs + 16 * ib);
		}
	}
}

/* Q2_K (added after 077ba1b): ggml's make_qkx2_quants with |x| weights and absolute error
 * (16 values, nmax 3, 16 grids from -0.5 in steps of 0.1) as a plain loop, then 4-bit
 * scales and mins against the largest and the levels from the rounded scales. */
enum { SUB = 16, NSUB = 16 };

/* x ≈ scale · L + min over 16 values, L in 0..3, min <= 0, minimising Σ |x| · |error|: the
 * start grid 3 / (max - min), then 16 grids (2.5 + 0.1 is) / (max - min), each refitted by
 * weighted least squares (min clamped to 0, refitting the scale alone) and kept if its
 * absolute error is lower. Returns the scale; *neg_min = -min; L holds the best levels. */
static float oracle_fit_2bit(const float *x, uint8_t L[SUB], float *neg_min)
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
		L[i] = (uint8_t)clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
		best += w[i] * fabsf(scale * L[i] + min - x[i]);
	}
	for (int is = 0; is <= 15; is++) {
		uint8_t Lc[SUB];
		float sum_l = 0, sum_l2 = 0, sum_xl = 0;
		iscale = (-0.5f + 0.1f * (float)is + (float)nmax) / (max - min);
		for (int i = 0; i < SUB; i++) {
			Lc[i] = (uint8_t)clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
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

static void oracle_quantize_q2_K(const float *x, void *dst, size_t n)
{
	struct block_q2_K *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		uint8_t L[QK_K];
		float scales[NSUB], mins[NSUB], max_scale = 0, max_min = 0;
		for (int j = 0; j < NSUB; j++) {
			scales[j] = oracle_fit_2bit(x + SUB * j, L + SUB * j, &mins[j]);
			max_scale = scales[j] > max_scale ? scales[j] : max_scale;
			max_min = mins[j] > max_min ? mins[j] : max_min;
		}
		/* 4-bit scales and mins against the largest of each (15 = the largest) */
		const float is = max_scale > 0 ? 15.f / max_scale : 0.f;
		const float im = max_min > 0 ? 15.f / max_min : 0.f;
		for (int j = 0; j < NSUB; j++)
			y[i].scales[j] = (uint8_t)(clampi(nearest_int(is * scales[j]), 0, 15) |
			                           clampi(nearest_int(im * mins[j]), 0, 15) << 4);
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
				    (uint8_t)clampi(nearest_int((x[SUB * j + l] + mj) / dj), 0, 3);
		}
		for (int h = 0; h < 2; h++)
			for (int l = 0; l < 32; l++) {
				const uint8_t *q = L + 128 * h + l;
				y[i].qs[32 * h + l] =
				    (uint8_t)(q[0] | (q[32] << 2) | (q[64] << 4) | (q[96] << 6));
			}
	}
}

/* ---- the comparison ------------------------------------------------------------------- */

enum { COLS = 1024, ROWS = 8, N = ROWS * COLS };

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static float uniform(uint64_t *s)
{
	return (float)((int32_t)(xorshift(s) >> 40) - (1 << 23)) * 0x1p-23f;
}

/* Row r of the test matrix: a random scale per row, then one special pattern per 256-value
 * super-block (one per 32-value block for the 32-element formats: the patterns repeat). */
static void fill(uint64_t seed, float *x)
{
	uint64_t s = seed;
	for (int r = 0; r < ROWS; r++) {
		const float scale = ldexpf(1.0f, (int)(xorshift(&s) % 40) - 20);
		for (int c = 0; c < COLS; c++)
			x[r * COLS + c] = uniform(&s) * scale;
	}
	float *b = x + COLS; /* row 1: special blocks */
	for (int i = 0; i < 32; i++) {
		b[i] = 0.0f;                               /* all zero */
		b[32 + i] = 0.25f;                         /* constant positive */
		b[64 + i] = -0.5f - 0.01f * (float)i;      /* all negative */
		b[96 + i] = i == 5 ? 100.0f : uniform(&s); /* one outlier */
		b[128 + i] = 1e-17f * uniform(&s);         /* below the group epsilon */
		b[160 + i] = -3.0f;                        /* constant negative */
		b[192 + i] = i < 16 ? 0.0f : uniform(&s);  /* half zero */
		b[224 + i] = (float)(i % 3) - 1.0f;        /* few levels */
	}
	float *h = x + 2 * COLS; /* row 2: magnitudes near the float and E8M0 limits */
	for (int i = 0; i < COLS; i++)
		h[i] = uniform(&s) * ldexpf(1.0f, 100 + (i / 32) % 28);
}

typedef void (*quantize_fn)(const float *x, void *dst, size_t n);

static void compare(uint32_t format, quantize_fn oracle, uint64_t seed)
{
	static float x[N];
	static uint8_t want[N * 2], got[N * 2];
	fill(seed, x);
	const size_t row_bytes = moek_row_bytes(format, COLS);
	cr_assert_eq(moek_quantize(format, x, ROWS, COLS, got, NULL), 0);
	for (int r = 0; r < ROWS; r++)
		oracle(x + (size_t)r * COLS, want + r * row_bytes, COLS);
	for (int r = 0; r < ROWS; r++) {
		const size_t at = r * row_bytes;
		cr_assert(!memcmp(got + at, want + at, row_bytes),
		          "%s, seed %llu: row %d differs from the scalar reference",
		          moek_format_lookup(format)->name, (unsigned long long)seed, r);
	}
}

#define SEEDS 5

Test(quant_reference, q4_K_matches_scalar_reference)
{
	for (uint64_t s = 1; s <= SEEDS; s++)
		compare(MOEK_Q4_K, oracle_quantize_q4_K, s);
}

Test(quant_reference, q5_K_matches_scalar_reference)
{
	for (uint64_t s = 1; s <= SEEDS; s++)
		compare(MOEK_Q5_K, oracle_quantize_q5_K, s);
}

Test(quant_reference, q2_K_matches_scalar_reference)
{
	for (uint64_t s = 1; s <= SEEDS; s++)
		compare(MOEK_Q2_K, oracle_quantize_q2_K, s);
}

Test(quant_reference, q6_K_matches_scalar_reference)
{
	for (uint64_t s = 1; s <= SEEDS; s++)
		compare(MOEK_Q6_K, oracle_quantize_q6_K, s);
}

Test(quant_reference, q8_0_matches_scalar_reference)
{
	for (uint64_t s = 1; s <= SEEDS; s++)
		compare(MOEK_Q8_0, oracle_quantize_q8_0, s);
}

Test(quant_reference, mxfp4_matches_scalar_reference)
{
	for (uint64_t s = 1; s <= SEEDS; s++)
		compare(MOEK_MXFP4, oracle_quantize_mxfp4, s);
}

Test(quant_reference, iq4_nl_matches_scalar_search)
{
	for (uint64_t s = 1; s <= SEEDS; s++)
		compare(MOEK_IQ4_NL, oracle_quantize_iq4_nl, s);
}

Test(quant_reference, iq4_xs_matches_scalar_search)
{
	for (uint64_t s = 1; s <= SEEDS; s++)
		compare(MOEK_IQ4_XS, oracle_quantize_iq4_xs, s);
}
