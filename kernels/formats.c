/* formats.c — the weight-format table and the scalar reference of every format.
 *
 * One row per format (struct moek_format_traits: id, name, block size and bytes, alignment,
 * scale layout, the activation format its dot products pair with, split granularity, its
 * interleaved layout, reference codecs) at its dense index (enum moek_fmt), as ggml's
 * type_traits: callers ask the row instead of switching on the format. The quantizers reproduce
 * ggml's quantize_row_*_ref layout and rounding (Q8_0/Q4_0 from the block's extreme, Q2_K/Q4_K/Q5_K
 * by make_qkx2-style weighted scale/min search, Q6_K by make_qx-style scale search, Q3_K by
 * make_q3-style refined scale search, Q8_K from the signed extreme, MXFP4 with an E8M0 shared
 * exponent), so a file quantized here reads the same in llama.cpp. FP8 E4M3 with one f32 scale_inv
 * per 128x128 block follows DeepSeek-V3 (stored = weight / scale_inv). IQ4_NL and IQ4_XS have their
 * codecs in fmt_iq4.c, the lattice i-quants (IQ2_XXS, IQ2_XS, IQ3_XXS,
 * IQ1_S, IQ3_S, IQ2_S, IQ1_M) theirs in fmt_iq.c.
 *
 * Everything here is the oracle the SIMD paths are tested against. The K-quant searches are
 * also what makes a generated model slow, so they run 8 sub-blocks at once in vector lanes
 * while doing, lane by lane, exactly the scalar reference's arithmetic (same bits as the
 * plain loops they replaced); MXFP4 and Q8_0 avoid per-element libm calls the same way.
 * Pure functions; no allocation; thread-safe.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels_internal.h"

const int8_t moek_mxfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float f16(uint16_t h)
{
	return moek_f16_to_f32(h);
}

/* Round to nearest, ties to even, as ggml's nearest_int (for |v| < 2^22, the only range the
 * quantizers produce; out-of-range and NaN inputs are clamped first so no conversion is UB). */
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

/* ---- Element codecs --------------------------------------------------------------------- */

float moek_fp8_e4m3_to_f32(uint8_t v)
{
	const unsigned exp = (v >> 3) & 15u, mant = v & 7u;
	float mag;
	if (exp == 15 && mant == 7)
		mag = NAN;
	else if (exp == 0)
		mag = ldexpf((float)mant, -9); /* subnormal: m * 2^-9 */
	else
		mag = ldexpf(1.0f + (float)mant / 8.0f, (int)exp - 7);
	return (v & 0x80) ? -mag : mag;
}

uint8_t moek_f32_to_fp8_e4m3(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
	const uint32_t abs = u & 0x7fffffffu;
	if (abs > 0x7f800000u)
		return sign | 0x7f;
	const float a = fabsf(f);
	if (a >= 464.0f) /* 464 is the midpoint of 448 and the non-existent 480: saturate */
		return sign | 0x7e;
	if (a < 0x1p-6f) { /* subnormal range: m * 2^-9, m rounded to nearest even */
		const int m = (int)lrintf(a * 0x1p9f); /* 0..8; 8 is the smallest normal, 0x08 */
		return (uint8_t)(sign | m);
	}
	/* normal: drop 20 mantissa bits with round to nearest even, rebias 127 -> 7 */
	const uint32_t r = abs + 0x7ffffu + ((abs >> 20) & 1u);
	const uint32_t exp = (r >> 23) - 120u;
	return (uint8_t)(sign | (exp << 3) | ((r >> 20) & 7u));
}

float moek_e8m0_to_f32(uint8_t e)
{
	return e == 255 ? NAN : ldexpf(1.0f, (int)e - 127);
}

/* ---- Q8_0 / Q4_0 / MXFP4 (32-element blocks) -------------------------------------------- */

/* roundf(v) (ties away from zero, as ggml's Q8_0) after clamping v to [-127, 127]; NaN gives
 * 127 like fminf. Inline: v - trunc(v) is exact here, so no libm call per element. */
static inline int round_away_127(float v)
{
	v = v < 127.f ? v : 127.f;
	v = v > -127.f ? v : -127.f;
	const int i = (int)v;
	const float frac = v - (float)i;
	return i + (frac >= 0.5f) - (frac <= -0.5f); /* branch-free: random data mispredicts */
}

static void quantize_q8_0(const float *x, void *dst, size_t n)
{
	struct block_q8_0 *y = dst;
	for (size_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
		float amax = 0.0f;
		for (int j = 0; j < QK8_0; j++) /* NaN never wins, as with fmaxf */
			amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
		const float d = amax / 127.0f;
		const float id = d != 0.0f ? 1.0f / d : 0.0f;
		y[i].d = moek_f32_to_f16(d);
		for (int j = 0; j < QK8_0; j++)
			y[i].qs[j] = (int8_t)round_away_127(x[j] * id);
	}
}

static void dequantize_q8_0(const void *src, float *y, size_t n)
{
	const struct block_q8_0 *b = src;
	for (size_t i = 0; i < n / QK8_0; i++) {
		const float d = f16(b[i].d);
		for (int j = 0; j < QK8_0; j++)
			*y++ = d * (float)b[i].qs[j];
	}
}

static void quantize_q4_0(const float *x, void *dst, size_t n)
{
	struct block_q4_0 *y = dst;
	for (size_t i = 0; i < n / QK4_0; i++, x += QK4_0) {
		float amax = 0.0f, max = 0.0f; /* max: the signed value of largest magnitude */
		for (int j = 0; j < QK4_0; j++) {
			if (amax < fabsf(x[j])) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		const float d = max / -8.0f;
		const float id = d != 0.0f ? 1.0f / d : 0.0f;
		y[i].d = moek_f32_to_f16(d);
		for (int j = 0; j < QK4_0 / 2; j++) {
			/* ggml: MIN(15, (int8_t)(x*id + 8.5f)), i.e. truncation after +8.5 */
			float v0 = x[j] * id + 8.5f, v1 = x[j + QK4_0 / 2] * id + 8.5f;
			const int q0 = v0 >= 0.0f ? (v0 < 15.0f ? (int)v0 : 15) : 0;
			const int q1 = v1 >= 0.0f ? (v1 < 15.0f ? (int)v1 : 15) : 0;
			y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
		}
	}
}

static void dequantize_q4_0(const void *src, float *y, size_t n)
{
	const struct block_q4_0 *b = src;
	for (size_t i = 0; i < n / QK4_0; i++, y += QK4_0) {
		const float d = f16(b[i].d);
		for (int j = 0; j < QK4_0 / 2; j++) {
			y[j] = d * (float)((b[i].qs[j] & 15) - 8);
			y[j + QK4_0 / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
		}
	}
}

/* Code of the E2M1 value (doubled, times scale e) nearest to x; ties to the lower code. */
static int mxfp4_best_code(float x, float e)
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

/* mxfp4_best_code(x, half_scale) for v = x / half_scale when every kvalue * half_scale is a
 * finite normal float (both scalings exact): the magnitude index counts the midpoints of
 * 0 1 2 3 4 6 8 12 strictly below |v| (a tie keeps the lower code), and zero is code 0, never
 * 8 (-0). Checked equal to the exhaustive search on every float within 3000 ulps of each
 * midpoint and on random floats, for every such scale. NaN gives 0 as there. */
static inline int mxfp4_code_of_scaled(float v)
{
	const float a = fabsf(v);
	const int k = (a > 0.5f) + (a > 1.5f) + (a > 2.5f) + (a > 3.5f) + (a > 5.0f) + (a > 7.0f) +
	              (a > 10.0f);
	return k == 0 ? 0 : v < 0 ? 8 + k : k;
}

static void quantize_mxfp4(const float *x, void *dst, size_t n)
{
	struct block_mxfp4 *y = dst;
	for (size_t i = 0; i < n / QK_MXFP4; i++, x += QK_MXFP4) {
		float amax = 0.0f;
		for (int j = 0; j < QK_MXFP4; j++)
			amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax; /* fmaxf: NaN never wins */
		/* ggml: e = floor(log2(amax)) - 2 + 127, so amax / 2^(e-127) lands in [4, 8) and
		 * the largest code (6) sits near the top. Clamped to the finite E8M0 range. */
		int e = 0;
		if (amax > 0.0f && isfinite(amax))
			e = clampi((int)floorf(log2f(amax)) - 2 + 127, 0, 254);
		else if (amax > 0.0f)
			e = 254;
		const float half_scale = ldexpf(1.0f, e - 128); /* kvalues are doubled */
		y[i].e = (uint8_t)e;
		if (e >= 1 && e <= 251) { /* every kvalue * half_scale normal and finite */
			const float inv_half_scale = ldexpf(1.0f, 128 - e);
			for (int j = 0; j < QK_MXFP4 / 2; j++) {
				const int lo = mxfp4_code_of_scaled(x[j] * inv_half_scale);
				const int hi =
				    mxfp4_code_of_scaled(x[j + QK_MXFP4 / 2] * inv_half_scale);
				y[i].qs[j] = (uint8_t)(lo | (hi << 4));
			}
			continue;
		}
		for (int j = 0; j < QK_MXFP4 / 2; j++) {
			const int lo = mxfp4_best_code(x[j], half_scale);
			const int hi = mxfp4_best_code(x[j + QK_MXFP4 / 2], half_scale);
			y[i].qs[j] = (uint8_t)(lo | (hi << 4));
		}
	}
}

static void dequantize_mxfp4(const void *src, float *y, size_t n)
{
	const struct block_mxfp4 *b = src;
	for (size_t i = 0; i < n / QK_MXFP4; i++, y += QK_MXFP4) {
		const float s = b[i].e == 255 ? NAN : ldexpf(1.0f, (int)b[i].e - 128);
		for (int j = 0; j < QK_MXFP4 / 2; j++) {
			y[j] = (float)moek_mxfp4_kvalues[b[i].qs[j] & 15] * s;
			y[j + QK_MXFP4 / 2] = (float)moek_mxfp4_kvalues[b[i].qs[j] >> 4] * s;
		}
	}
}

/* ---- K-quants ---------------------------------------------------------------------------- */

/* The K-quant searches run many candidate scales over the same values, so they work on 8-lane
 * float vectors (GCC/Clang vector extensions: one AVX register, or two SSE ones on a baseline
 * x86-64 build), one sub-block per lane. Lane arithmetic is plain IEEE single precision in
 * the reference's order, so the results do not depend on the instruction set. Rounding adds
 * and subtracts 1.5 * 2^23: round to nearest even, as ggml's nearest_int, exact for
 * |v| < 2^22; clamps are `v > lo ? v : lo` so NaN lands on lo and no float-to-int
 * conversion ever sees an out-of-range value. */
#pragma GCC diagnostic ignored "-Wpsabi" /* 32-byte vectors never cross this file's ABI */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* clang contracts a * b + c by default where FMA exists; GCC         \
                                does not in ISO C mode (and ignores this pragma) */
#endif
typedef float f32x8 __attribute__((vector_size(32)));
/* The K-quant row quantizers are built twice, for baseline x86-64 and for AVX2, and picked
 * per call by the CPU (MOEK_AVX2_DISPATCH); everything they call is inlined into each copy. */
#define KQ_INLINE __attribute__((always_inline))
typedef int32_t i32x8 __attribute__((vector_size(32)));
enum { LANES = 8 };

static inline KQ_INLINE f32x8 splat8(float v)
{
	return (f32x8){v, v, v, v, v, v, v, v};
}

static inline KQ_INLINE f32x8 load8(const float *p)
{
	f32x8 v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static inline KQ_INLINE f32x8 select8(i32x8 mask, f32x8 yes, f32x8 no)
{
	return (f32x8)(((i32x8)yes & mask) | ((i32x8)no & ~mask));
}

static inline KQ_INLINE i32x8 splat8_bits(int32_t v)
{
	return (i32x8){v, v, v, v, v, v, v, v};
}

/* round(v) clamped to [lo, hi]; NaN gives lo */
static inline KQ_INLINE f32x8 round_clamp8(f32x8 v, f32x8 lo, f32x8 hi)
{
	const f32x8 magic = splat8(12582912.0f);
	v = select8(v > lo, v, lo);
	v = select8(v < hi, v, hi);
	return (v + magic) - magic;
}

static inline KQ_INLINE f32x8 abs8(f32x8 v)
{
	return (f32x8)((i32x8)v & splat8_bits(0x7fffffff));
}

/* Asymmetric search (ggml's make_qkx2_quants) of the 8 sub-blocks of a super-block at once,
 * one per vector lane, each exactly as the scalar reference does it: x ~ scale * L + min with
 * L in 0..nmax, min <= 0, minimising the weighted squared (mad: absolute) error over the n
 * (16 or 32) values of each sub-block, over the start grid
 * nmax / (max - min) and nstep+1 candidates (rmin + rdelta * is + nmax) / (max - min), each
 * refitted by weighted least squares and kept if its error is lower; min is the best fit's so
 * far (later candidates grid from it, as ggml). Lanes run the candidates in lock-step and
 * keep improvements by mask, so there are no branches and no horizontal sums, and each lane
 * sums in the reference's order: the result is the scalar reference's, bit for bit.
 * xt[i], wt[i] (i < n): element i of each sub-block (transposed). Outputs: L[8 n] (transposed
 * back), the scales and -min (>= 0) of the 8 sub-blocks. */
enum { KQ_SUB = 32 };
static inline KQ_INLINE void search_scale_min8(int nmax, int n, bool mad, const f32x8 *xt,
                                               const f32x8 *wt, uint8_t *L, float scales[8],
                                               float neg_mins[8], float rmin, float rdelta,
                                               int nstep)
{
	f32x8 min = xt[0], max = xt[0], sum_w = wt[0], sum_x = wt[0] * xt[0];
	for (int i = 1; i < n; i++) {
		min = select8(xt[i] < min, xt[i], min);
		max = select8(xt[i] > max, xt[i], max);
		sum_w += wt[i];
		sum_x += wt[i] * xt[i];
	}
	const f32x8 zero = splat8(0.0f), hi = splat8((float)nmax);
	min = select8(min > zero, zero, min);
	const i32x8 flat = max == min; /* the reference returns scale 0, L 0 */
	f32x8 iscale = hi / (max - min);
	f32x8 scale = splat8(1.0f) / iscale, best_error = zero;
	/* the best levels are kept as the grid that gave them, and recomputed at the end */
	f32x8 best_iscale = iscale, best_grid_min = min, l[KQ_SUB];
	for (int i = 0; i < n; i++) {
		l[i] = round_clamp8(iscale * (xt[i] - min), zero, hi);
		const f32x8 diff = scale * l[i] + min - xt[i];
		best_error += mad ? wt[i] * abs8(diff) : wt[i] * diff * diff;
	}
	for (int is = 0; is <= nstep; is++) {
		iscale = (splat8(rmin + rdelta * (float)is) + hi) / (max - min);
		f32x8 sum_l = zero, sum_l2 = zero, sum_xl = zero;
		for (int i = 0; i < n; i++) {
			l[i] = round_clamp8(iscale * (xt[i] - min), zero, hi);
			const f32x8 wl = wt[i] * l[i];
			sum_l += wl;
			sum_l2 += wl * l[i];
			sum_xl += wl * xt[i];
		}
		const f32x8 D = sum_w * sum_l2 - sum_l * sum_l;
		f32x8 this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
		f32x8 this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
		const i32x8 min_positive = this_min > zero;
		this_min = select8(min_positive, zero, this_min);
		this_scale = select8(min_positive, sum_xl / sum_l2, this_scale);
		f32x8 cur_error = zero;
		for (int i = 0; i < n; i++) {
			const f32x8 diff = this_scale * l[i] + this_min - xt[i];
			cur_error += mad ? wt[i] * abs8(diff) : wt[i] * diff * diff;
		}
		const i32x8 better = (D > zero) & (cur_error < best_error);
		best_iscale = select8(better, iscale, best_iscale);
		best_grid_min = select8(better, min, best_grid_min);
		best_error = select8(better, cur_error, best_error);
		scale = select8(better, this_scale, scale);
		min = select8(better, this_min, min);
	}
	scale = select8(flat, zero, scale);
	for (int i = 0; i < n; i++)
		l[i] = round_clamp8(best_iscale * (xt[i] - best_grid_min), zero, hi);
	for (int j = 0; j < LANES; j++) {
		scales[j] = scale[j];
		neg_mins[j] = -min[j];
		for (int i = 0; i < n; i++)
			L[n * j + i] = flat[j] ? 0 : (uint8_t)l[i][j];
	}
}

/* L[i] = round((x[i] + dm) / d) clamped to [lo, hi] + offset, for n (a multiple of 8)
 * elements: the final levels against a sub-block's rounded scale (and min). */
static inline KQ_INLINE void quantize_levels(const float *x, size_t n, float d, float dm, float lo,
                                             float hi, int offset, uint8_t *L)
{
	const f32x8 vd = splat8(d), vdm = splat8(dm), vlo = splat8(lo), vhi = splat8(hi);
	for (size_t i = 0; i < n; i += LANES) {
		const f32x8 l = round_clamp8((load8(x + i) + vdm) / vd, vlo, vhi);
		for (int j = 0; j < LANES; j++)
			L[i + (size_t)j] = (uint8_t)((int)l[j] + offset);
	}
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): per 32-element sub-block scale/min search,
 * 6-bit quantization of scales and mins against the super-block's d/dmin, then the final
 * levels L (0..nmax) against the rounded scales. Fills d, dmin, scales; returns L. */
static inline KQ_INLINE void quantize_k_superblock(const float *x, int nmax, float rmin, int nstep,
                                                   uint16_t *d, uint16_t *dmin,
                                                   uint8_t packed[K_SCALE_SIZE], uint8_t L[QK_K])
{
	f32x8 xt[KQ_SUB], wt[KQ_SUB], sum_x2 = splat8(0);
	for (int i = 0; i < KQ_SUB; i++) {
		for (int j = 0; j < LANES; j++)
			xt[i][j] = x[KQ_SUB * j + i];
		sum_x2 += xt[i] * xt[i];
	}
	f32x8 av_x;
	for (int j = 0; j < LANES; j++)
		av_x[j] = sqrtf(sum_x2[j] / 32);
	for (int i = 0; i < KQ_SUB; i++) {
		const i32x8 abs_bits = (i32x8)xt[i] & splat8_bits(0x7fffffff);
		wt[i] = av_x + (f32x8)abs_bits; /* av_x + fabsf(x) */
	}
	float mins[QK_K / 32], scales[QK_K / 32];
	search_scale_min8(nmax, KQ_SUB, false, xt, wt, L, scales, mins, rmin, 0.1f, nstep);
	float max_scale = 0, max_min = 0;
	for (int j = 0; j < QK_K / 32; j++) {
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
		const float dj = f16(*d) * (float)sc;
		if (dj == 0.0f)
			continue;
		const float dm = f16(*dmin) * (float)m;
		quantize_levels(x + 32 * j, 32, dj, dm, 0.0f, (float)nmax, 0, L + 32 * j);
	}
}

static inline KQ_INLINE void quantize_q4_K_rows(const float *x, void *dst, size_t n)
{
	struct block_q4_K *y = dst;
	uint8_t L[QK_K];
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		quantize_k_superblock(x, 15, -1.0f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
		for (int j = 0; j < QK_K; j += 64)
			for (int l = 0; l < 32; l++)
				y[i].qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
	}
}
MOEK_AVX2_DISPATCH(quantize_q4_K, static void quantize_q4_K)

static void dequantize_q4_K(const void *src, float *y, size_t n)
{
	const struct block_q4_K *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = f16(b[i].d), dmin = f16(b[i].dmin);
		for (int c = 0; c < 4;
		     c++) { /* 32-byte chunk c: sub-blocks 2c (low), 2c+1 (high) */
			const uint8_t *q = b[i].qs + 32 * c;
			uint8_t sc, m;
			moek_k4_scale_min(2 * c, b[i].scales, &sc, &m);
			const float d1 = d * (float)sc, m1 = dmin * (float)m;
			moek_k4_scale_min(2 * c + 1, b[i].scales, &sc, &m);
			const float d2 = d * (float)sc, m2 = dmin * (float)m;
			for (int l = 0; l < 32; l++)
				*y++ = d1 * (float)(q[l] & 0xF) - m1;
			for (int l = 0; l < 32; l++)
				*y++ = d2 * (float)(q[l] >> 4) - m2;
		}
	}
}

static inline KQ_INLINE void quantize_q5_K_rows(const float *x, void *dst, size_t n)
{
	struct block_q5_K *y = dst;
	uint8_t L[QK_K];
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		quantize_k_superblock(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
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
MOEK_AVX2_DISPATCH(quantize_q5_K, static void quantize_q5_K)

static void dequantize_q5_K(const void *src, float *y, size_t n)
{
	const struct block_q5_K *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = f16(b[i].d), dmin = f16(b[i].dmin);
		for (int c = 0; c < 4; c++) {
			const uint8_t *q = b[i].qs + 32 * c;
			const uint8_t u1 = (uint8_t)(1u << (2 * c)), u2 = (uint8_t)(2u << (2 * c));
			uint8_t sc, m;
			moek_k4_scale_min(2 * c, b[i].scales, &sc, &m);
			const float d1 = d * (float)sc, m1 = dmin * (float)m;
			moek_k4_scale_min(2 * c + 1, b[i].scales, &sc, &m);
			const float d2 = d * (float)sc, m2 = dmin * (float)m;
			for (int l = 0; l < 32; l++)
				*y++ = d1 * (float)((q[l] & 0xF) + (b[i].qh[l] & u1 ? 16 : 0)) - m1;
			for (int l = 0; l < 32; l++)
				*y++ = d2 * (float)((q[l] >> 4) + (b[i].qh[l] & u2 ? 16 : 0)) - m2;
		}
	}
}

/* Q2_K and Q3_K: 16 sub-blocks of 16 elements under one f16 super-scale, a 4-bit scale and
 * 4-bit min (Q2_K) or a 6-bit signed scale (Q3_K) each; codes in Q6_K's ql traversal (byte
 * 32h + l of qs holds elements 128h + 32s + l at bit 2s), Q3_K's third bit of element e at
 * bit e / 32 of hmask[e % 32]. Searches as ggml's quantize_row_q2_K_ref / q3_K_ref: Q2_K fits
 * scale and min per sub-block by the |x|-weighted absolute-error grid search (8 sub-blocks
 * per vector, as Q4_K), Q3_K a symmetric scale refined level by level against x²-weighted
 * squared error; then the sub-block scales are quantized against the largest and every
 * level recomputed from the rounded scales. */
enum { SUB = 16, NSUB = QK_K / SUB };

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

static inline KQ_INLINE void quantize_q2_K_rows(const float *x, void *dst, size_t n)
{
	struct block_q2_K *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		uint8_t L[QK_K];
		float scales[NSUB], mins[NSUB], max_scale = 0, max_min = 0;
		for (int g = 0; g < 2; g++) { /* sub-blocks 8g .. 8g + 7, one per lane */
			f32x8 xt[SUB], wt[SUB];
			for (int l = 0; l < SUB; l++) {
				for (int j = 0; j < LANES; j++)
					xt[l][j] = x[128 * g + SUB * j + l];
				wt[l] = abs8(xt[l]);
			}
			search_scale_min8(3, SUB, true, xt, wt, L + 128 * g, scales + 8 * g,
			                  mins + 8 * g, -0.5f, 0.1f, 15);
		}
		for (int j = 0; j < NSUB; j++) {
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
		const float d = f16(y[i].d), dmin = f16(y[i].dmin);
		for (int j = 0; j < NSUB; j++) {
			const float dj = d * (float)(y[i].scales[j] & 0xF);
			if (dj == 0.0f)
				continue;
			const float mj = dmin * (float)(y[i].scales[j] >> 4);
			for (int l = 0; l < SUB; l++)
				L[SUB * j + l] =
				    (uint8_t)clampi(nearest_int((x[SUB * j + l] + mj) / dj), 0, 3);
		}
		pack_2bit(L, y[i].qs);
	}
}
MOEK_AVX2_DISPATCH(quantize_q2_K, static void quantize_q2_K)

static void dequantize_q2_K(const void *src, float *y, size_t n)
{
	const struct block_q2_K *b = src;
	for (size_t i = 0; i < n / QK_K; i++, y += QK_K) {
		const float d = f16(b[i].d), dmin = f16(b[i].dmin);
		for (int e = 0; e < QK_K; e++) {
			const uint8_t s = b[i].scales[e / SUB];
			y[e] = d * (float)(s & 0xF) * (float)code_2bit(b[i].qs, e) -
			       dmin * (float)(s >> 4);
		}
	}
}

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
		L[i] = (int8_t)clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
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
			const int nl = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
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

static void quantize_q3_K(const float *x, void *dst, size_t n)
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
				const int l = clampi(nearest_int(iscale * scales[j]), -32, 31) + 32;
				y[i].scales[j % 8] |= (uint8_t)((l & 0xF) << (j < 8 ? 0 : 4));
				y[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
			}
			y[i].d = moek_f32_to_f16(1 / iscale);
		}
		/* the levels against the stored scales (a zero scale keeps the search's) */
		const float d = f16(y[i].d);
		uint8_t sc[NSUB];
		moek_q3_scales(y[i].scales, sc);
		for (int j = 0; j < NSUB; j++) {
			const float dj = d * (float)(sc[j] - 32);
			for (int l = 0; l < SUB; l++) {
				const int e = SUB * j + l;
				L[e] = (uint8_t)(dj == 0.0f
				                     ? Ls[e] + 4
				                     : clampi(nearest_int(x[e] / dj), -4, 3) + 4);
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

static void dequantize_q3_K(const void *src, float *y, size_t n)
{
	const struct block_q3_K *b = src;
	for (size_t i = 0; i < n / QK_K; i++, y += QK_K) {
		const float d = f16(b[i].d);
		uint8_t sc[NSUB];
		moek_q3_scales(b[i].scales, sc);
		for (int e = 0; e < QK_K; e++) {
			const int hi = (b[i].hmask[e % 32] >> (e / 32)) & 1;
			const int q = code_2bit(b[i].qs, e) - (hi ? 0 : 4);
			y[e] = d * (float)(sc[e / SUB] - 32) * (float)q;
		}
	}
}

/* Symmetric search (ggml's make_qx_quants, rmse_type 1: weights x^2) of 8 consecutive
 * 16-element sub-blocks at once, one per lane, each exactly as the scalar reference: x ~ scale
 * * (L - nmax) with L in 0..2*nmax-1, over the start grid -nmax / max and 18 candidates
 * -(nmax + 0.1 is) / max, each refitted by least squares and kept if better. Lock-step with
 * masks as search_scale_min8, summing in the reference's order: the same bits. x: 128
 * values; fills L[128] and the 8 (signed) scales. */
enum { KQ_SYM = 16 };
static inline KQ_INLINE void search_scale_sym8(int nmax, const float *x, int8_t L[8 * KQ_SYM],
                                               float scales[8])
{
	const f32x8 zero = splat8(0.0f);
	f32x8 xt[KQ_SYM], w[KQ_SYM], wx[KQ_SYM], l[KQ_SYM];
	f32x8 amax = zero, max = zero;
	for (int i = 0; i < KQ_SYM; i++) {
		for (int j = 0; j < LANES; j++)
			xt[i][j] = x[KQ_SYM * j + i];
		const f32x8 ax = (f32x8)((i32x8)xt[i] & splat8_bits(0x7fffffff));
		const i32x8 larger = ax > amax; /* the first largest |x| */
		amax = select8(larger, ax, amax);
		max = select8(larger, xt[i], max);
		w[i] = xt[i] * xt[i];
		wx[i] = w[i] * xt[i];
	}
	const i32x8 tiny = amax < splat8(1e-15f); /* ggml's GROUP_MAX_EPS: L 0, scale 0 */
	const f32x8 lo = splat8((float)-nmax), hi = splat8((float)(nmax - 1));
	f32x8 iscale = splat8((float)-nmax) / max, sumlx = zero, suml2 = zero;
	for (int i = 0; i < KQ_SYM; i++) {
		l[i] = round_clamp8(iscale * xt[i], lo, hi);
		sumlx += wx[i] * l[i];
		suml2 += w[i] * l[i] * l[i];
	}
	f32x8 best_iscale = iscale; /* the best levels' grid; they are recomputed at the end */
	f32x8 scale = select8(suml2 != zero, sumlx / suml2, zero);
	f32x8 best = scale * sumlx;
	for (int is = -9; is <= 9; is++) {
		if (is == 0)
			continue;
		iscale = splat8(-((float)nmax + 0.1f * (float)is)) / max;
		sumlx = suml2 = zero;
		for (int i = 0; i < KQ_SYM; i++) {
			l[i] = round_clamp8(iscale * xt[i], lo, hi);
			sumlx += wx[i] * l[i];
			suml2 += w[i] * l[i] * l[i];
		}
		const i32x8 better = (suml2 > zero) & (sumlx * sumlx > best * suml2);
		best_iscale = select8(better, iscale, best_iscale);
		const f32x8 this_scale = sumlx / suml2;
		scale = select8(better, this_scale, scale);
		best = select8(better, this_scale * sumlx, best);
	}
	scale = select8(tiny, zero, scale);
	for (int i = 0; i < KQ_SYM; i++)
		l[i] = round_clamp8(best_iscale * xt[i], lo, hi);
	for (int j = 0; j < LANES; j++) {
		scales[j] = scale[j];
		for (int i = 0; i < KQ_SYM; i++)
			L[KQ_SYM * j + i] = (int8_t)(tiny[j] ? 0 : (int)l[i][j] + nmax);
	}
}

static inline KQ_INLINE void quantize_q6_K_rows(const float *x, void *dst, size_t n)
{
	struct block_q6_K *y = dst;
	int8_t L[QK_K];
	float scales[QK_K / 16];
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float max_scale = 0, max_abs_scale = 0;
		search_scale_sym8(32, x, L, scales);
		search_scale_sym8(32, x + 128, L + 128, scales + 8);
		for (int ib = 0; ib < QK_K / 16; ib++) {
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
			const float d = f16(y[i].d) * (float)y[i].scales[j];
			if (d == 0.0f)
				continue;
			quantize_levels(x + 16 * j, 16, d, 0.0f, -32.0f, 31.0f, 32,
			                (uint8_t *)L + 16 * j);
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
MOEK_AVX2_DISPATCH(quantize_q6_K, static void quantize_q6_K)

static void dequantize_q6_K(const void *src, float *y, size_t n)
{
	const struct block_q6_K *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = f16(b[i].d);
		for (int h = 0; h < 2; h++, y += 128) {
			const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
			const int8_t *sc = b[i].scales + 8 * h;
			for (int l = 0; l < 32; l++) {
				const int is = l / 16;
				const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
				const int q2 =
				    ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
				const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
				const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
				y[l] = d * (float)sc[is + 0] * (float)q1;
				y[l + 32] = d * (float)sc[is + 2] * (float)q2;
				y[l + 64] = d * (float)sc[is + 4] * (float)q3;
				y[l + 96] = d * (float)sc[is + 6] * (float)q4;
			}
		}
	}
}

static void quantize_q8_K(const float *x, void *dst, size_t n)
{
	struct block_q8_K *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float max = 0, amax = 0;
		for (int j = 0; j < QK_K; j++) {
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		memset(&y[i], 0, sizeof(y[i]));
		if (amax == 0.0f)
			continue;
		const float iscale = -127.f / max;
		for (int j = 0; j < QK_K; j++)
			y[i].qs[j] = (int8_t)clampi(nearest_int(iscale * x[j]), -127, 127);
		for (int j = 0; j < QK_K / 16; j++) {
			int sum = 0;
			for (int ii = 0; ii < 16; ii++)
				sum += y[i].qs[16 * j + ii];
			y[i].bsums[j] = (int16_t)sum;
		}
		y[i].d = 1.0f / iscale;
	}
}

static void dequantize_q8_K(const void *src, float *y, size_t n)
{
	const struct block_q8_K *b = src;
	for (size_t i = 0; i < n / QK_K; i++)
		for (int j = 0; j < QK_K; j++)
			*y++ = b[i].d * (float)b[i].qs[j];
}

/* ---- Plain floats ------------------------------------------------------------------------ */

static void quantize_f32(const float *x, void *dst, size_t n)
{
	memcpy(dst, x, n * sizeof(float));
}
static void dequantize_f32(const void *src, float *y, size_t n)
{
	memcpy(y, src, n * sizeof(float));
}
static void quantize_f16(const float *x, void *dst, size_t n)
{
	moek_convert(MOEK_ACT_F16, dst, MOEK_ACT_F32, x, n);
}
static void dequantize_f16(const void *src, float *y, size_t n)
{
	moek_convert(MOEK_ACT_F32, y, MOEK_ACT_F16, src, n);
}
static void quantize_bf16(const float *x, void *dst, size_t n)
{
	moek_convert(MOEK_ACT_BF16, dst, MOEK_ACT_F32, x, n);
}
static void dequantize_bf16(const void *src, float *y, size_t n)
{
	moek_convert(MOEK_ACT_F32, y, MOEK_ACT_BF16, src, n);
}

/* ---- FP8 E4M3 with 128x128 block scales -------------------------------------------------- */

static size_t fp8_blocks(size_t n)
{
	return (n + MOEK_FP8_BLOCK - 1) / MOEK_FP8_BLOCK;
}

/* One scale_inv per 128x128 block = the block's amax / 448 (1 for an all-zero block, so that
 * stored = weight / scale_inv is never 0/0); partial edge blocks are allowed. */
static void quantize_fp8(const float *src, size_t rows, size_t cols, void *dst_, float *scales)
{
	uint8_t *dst = dst_;
	const size_t ncb = fp8_blocks(cols);
	for (size_t br = 0; br < fp8_blocks(rows); br++) {
		const size_t r0 = br * MOEK_FP8_BLOCK;
		const size_t r1 = r0 + MOEK_FP8_BLOCK < rows ? r0 + MOEK_FP8_BLOCK : rows;
		for (size_t bc = 0; bc < ncb; bc++) {
			const size_t c0 = bc * MOEK_FP8_BLOCK;
			const size_t c1 = c0 + MOEK_FP8_BLOCK < cols ? c0 + MOEK_FP8_BLOCK : cols;
			float amax = 0.0f;
			for (size_t r = r0; r < r1; r++)
				for (size_t c = c0; c < c1; c++)
					amax = fabsf(src[r * cols + c]) > amax
					           ? fabsf(src[r * cols + c])
					           : amax; /* fmaxf: NaN never wins */
			const float scale_inv = amax > 0.0f ? amax / MOEK_FP8_E4M3_MAX : 1.0f;
			scales[br * ncb + bc] = scale_inv;
			for (size_t r = r0; r < r1; r++)
				for (size_t c = c0; c < c1; c++)
					dst[r * cols + c] =
					    moek_f32_to_fp8_e4m3(src[r * cols + c] / scale_inv);
		}
	}
}

static void dequantize_fp8_row(const void *src, const float *scale_row, float *dst, size_t n)
{
	const uint8_t *q = src;
	for (size_t c = 0; c < n; c++)
		dst[c] = moek_fp8_e4m3_to_f32(q[c]) * scale_row[c / MOEK_FP8_BLOCK];
}

/* ---- The table --------------------------------------------------------------------------- */

/* Rows of formats with their scales in the blocks, and of formats with scales of their own. */
#define INLINE_SCALES(codec) .quantize_row = quantize_##codec, .dequantize_row = dequantize_##codec
#define SIDE_SCALES(codec)                                                                         \
	.quantize_scaled = quantize_##codec, .dequantize_row_scaled = dequantize_##codec##_row

/* Row f at index f (enum moek_fmt, kernels_internal.h); a row's fields are documented in struct
 * moek_format_traits and struct moek_format_info. */
const struct moek_format_traits moek_formats[MOEK_FMT_COUNT] =
    {
        [MOEK_FMT_F32] =
            {
                .info = {.format = MOEK_F32,
                         .name = "F32",
                         .block_elems = 1,
                         .block_bytes = 4,
                         .weight_format = true,
                         .align = 4,
                         .safetensors_dtype = "F32"},
                .ggml = true,
                .vec_dot_format = MOEK_F32,
                .down_split_align = 1,
                INLINE_SCALES(f32),
            },
        [MOEK_FMT_F16] =
            {
                .info = {.format = MOEK_F16,
                         .name = "F16",
                         .block_elems = 1,
                         .block_bytes = 2,
                         .weight_format = true,
                         .align = 2,
                         .safetensors_dtype = "F16"},
                .ggml = true,
                .vec_dot_format = MOEK_BF16,
                .down_split_align = 1,
                INLINE_SCALES(f16),
            },
        [MOEK_FMT_Q4_0] =
            {
                .info = {.format = MOEK_Q4_0,
                         .name = "Q4_0",
                         .block_elems = 32,
                         .block_bytes = 18,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_0,
                .down_split_align = 64,
                INLINE_SCALES(q4_0),
            },
        [MOEK_FMT_Q8_0] =
            {
                .info = {.format = MOEK_Q8_0,
                         .name = "Q8_0",
                         .block_elems = 32,
                         .block_bytes = 34,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_0,
                .down_split_align = 1,
                .x8 = &moek_x8_q8_0,
                INLINE_SCALES(q8_0),
            },
        [MOEK_FMT_Q2_K] =
            {
                .info = {.format = MOEK_Q2_K,
                         .name = "Q2_K",
                         .block_elems = 256,
                         .block_bytes = 84,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .x8 = &moek_x8_q2_K,
                INLINE_SCALES(q2_K),
            },
        [MOEK_FMT_Q3_K] =
            {
                .info = {.format = MOEK_Q3_K,
                         .name = "Q3_K",
                         .block_elems = 256,
                         .block_bytes = 110,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .x8 = &moek_x8_q3_K,
                INLINE_SCALES(q3_K),
            },
        [MOEK_FMT_Q4_K] =
            {
                .info = {.format = MOEK_Q4_K,
                         .name = "Q4_K",
                         .block_elems = 256,
                         .block_bytes = 144,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .x8 = &moek_x8_q4_K,
                INLINE_SCALES(q4_K),
            },
        [MOEK_FMT_Q5_K] =
            {
                .info = {.format = MOEK_Q5_K,
                         .name = "Q5_K",
                         .block_elems = 256,
                         .block_bytes = 176,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                INLINE_SCALES(q5_K),
            },
        [MOEK_FMT_Q6_K] =
            {
                .info = {.format = MOEK_Q6_K,
                         .name = "Q6_K",
                         .block_elems = 256,
                         .block_bytes = 210,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                INLINE_SCALES(q6_K),
            },
        [MOEK_FMT_Q8_K] =
            {
                .info = {.format = MOEK_Q8_K,
                         .name = "Q8_K",
                         .block_elems = 256,
                         .block_bytes = 292,
                         .weight_format = false,
                         .align = 4},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                INLINE_SCALES(q8_K),
            },
        [MOEK_FMT_IQ2_XXS] =
            {
                .info = {.format = MOEK_IQ2_XXS,
                         .name = "IQ2_XXS",
                         .block_elems = 256,
                         .block_bytes = 66,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .quantize_row = moek_quantize_iq2_xxs,
                .dequantize_row = moek_dequantize_iq2_xxs,
            },
        [MOEK_FMT_IQ2_XS] =
            {
                .info = {.format = MOEK_IQ2_XS,
                         .name = "IQ2_XS",
                         .block_elems = 256,
                         .block_bytes = 74,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .quantize_row = moek_quantize_iq2_xs,
                .dequantize_row = moek_dequantize_iq2_xs,
            },
        [MOEK_FMT_IQ3_XXS] =
            {
                .info = {.format = MOEK_IQ3_XXS,
                         .name = "IQ3_XXS",
                         .block_elems = 256,
                         .block_bytes = 98,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .quantize_row = moek_quantize_iq3_xxs,
                .dequantize_row = moek_dequantize_iq3_xxs,
            },
        [MOEK_FMT_IQ1_S] =
            {
                .info = {.format = MOEK_IQ1_S,
                         .name = "IQ1_S",
                         .block_elems = 256,
                         .block_bytes = 50,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .quantize_row = moek_quantize_iq1_s,
                .dequantize_row = moek_dequantize_iq1_s,
            },
        [MOEK_FMT_IQ4_NL] =
            {
                .info = {.format = MOEK_IQ4_NL,
                         .name = "IQ4_NL",
                         .block_elems = 32,
                         .block_bytes = 18,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_0,
                .down_split_align = 64,
                .x8 = &moek_x8_iq4_nl,
                .quantize_row = moek_quantize_iq4_nl,
                .dequantize_row = moek_dequantize_iq4_nl,
            },
        [MOEK_FMT_IQ3_S] =
            {
                .info = {.format = MOEK_IQ3_S,
                         .name = "IQ3_S",
                         .block_elems = 256,
                         .block_bytes = 110,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .quantize_row = moek_quantize_iq3_s,
                .dequantize_row = moek_dequantize_iq3_s,
            },
        [MOEK_FMT_IQ2_S] =
            {
                .info = {.format = MOEK_IQ2_S,
                         .name = "IQ2_S",
                         .block_elems = 256,
                         .block_bytes = 82,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .quantize_row = moek_quantize_iq2_s,
                .dequantize_row = moek_dequantize_iq2_s,
            },
        [MOEK_FMT_IQ4_XS] =
            {
                .info = {.format = MOEK_IQ4_XS,
                         .name = "IQ4_XS",
                         .block_elems = 256,
                         .block_bytes = 136,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .x8 = &moek_x8_iq4_xs,
                .quantize_row = moek_quantize_iq4_xs,
                .dequantize_row = moek_dequantize_iq4_xs,
            },
        [MOEK_FMT_IQ1_M] =
            {
                .info = {.format = MOEK_IQ1_M,
                         .name = "IQ1_M",
                         .block_elems = 256,
                         .block_bytes = 56,
                         .weight_format = true,
                         .align = 2},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_K,
                .down_split_align = 1,
                .quantize_row = moek_quantize_iq1_m,
                .dequantize_row = moek_dequantize_iq1_m,
            },
        [MOEK_FMT_BF16] =
            {
                .info = {.format = MOEK_BF16,
                         .name = "BF16",
                         .block_elems = 1,
                         .block_bytes = 2,
                         .weight_format = true,
                         .align = 2,
                         .safetensors_dtype = "BF16"},
                .ggml = true,
                .vec_dot_format = MOEK_BF16,
                .down_split_align = 1,
                .x8 = &moek_x8_bf16,
                INLINE_SCALES(bf16),
            },
        [MOEK_FMT_MXFP4] =
            {
                .info = {.format = MOEK_MXFP4,
                         .name = "MXFP4",
                         .block_elems = 32,
                         .block_bytes = 17,
                         .weight_format = true,
                         .align = 1},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_0,
                .down_split_align = 64,
                .x8 = &moek_x8_mxfp4,
                INLINE_SCALES(mxfp4),
            },
        [MOEK_FMT_NVFP4] =
            {
                .info = {.format = MOEK_NVFP4,
                         .name = "NVFP4",
                         .block_elems = 64,
                         .block_bytes = 36,
                         .weight_format = true,
                         .align = 1},
                .ggml = true,
                .vec_dot_format = MOEK_Q8_0,
                .down_split_align = 64,
                .x8 = &moek_x8_nvfp4,
                .quantize_row = moek_quantize_nvfp4,
                .dequantize_row = moek_dequantize_nvfp4,
            },
        [MOEK_FMT_FP8_E4M3_B128] =
            {
                .info = {.format = MOEK_FP8_E4M3_B128,
                         .name = "FP8_E4M3_B128",
                         .block_elems = 1,
                         .block_bytes = 1,
                         .weight_format = true,
                         .align = 1,
                         .scale_block = MOEK_FP8_BLOCK,
                         .safetensors_dtype = "F8_E4M3"},
                .vec_dot_format = MOEK_F32,
                .down_split_align = 1,
                SIDE_SCALES(fp8),
            },
        [MOEK_FMT_INT4_G32] =
            {
                .info = {.format = MOEK_INT4_G32,
                         .name = "INT4_G32",
                         .block_elems = 32,
                         .block_bytes = 20,
                         .weight_format = true,
                         .align = 1},
                .vec_dot_format = MOEK_Q8_0,
                .down_split_align = 64,
                .x8 = &moek_x8_int4_g32,
                .quantize_row = moek_int4_quantize_row,
                .dequantize_row = moek_int4_dequantize_row,
            },
};

/* Every index has a row: a row left out would be all zeros, and block_elems 0 a division by
 * zero (test_format_table checks every row's fields). The own formats' ids are their index
 * plus a constant, which moek_fmt_index relies on. */
#define MOEK_FMT_CHECK_GGML(name)                                                                  \
	static_assert(MOEK_##name < MOEK_GGML_ID_END, #name " is a ggml id");
#define MOEK_FMT_CHECK_OWN(name)                                                                   \
	static_assert(MOEK_##name - MOEK_OWN_ID_FIRST == MOEK_FMT_##name - MOEK_FMT_OWN_FIRST,     \
	              #name ": own ids follow the table");
MOEK_GGML_FORMATS(MOEK_FMT_CHECK_GGML)
MOEK_OWN_FORMATS(MOEK_FMT_CHECK_OWN)
static_assert(MOEK_FMT_SLOTS <= 255, "indices fit the plan's bytes");

const uint8_t moek_fmt_of_ggml_id[MOEK_GGML_ID_END] = {
#define MOEK_FMT_OF_ID(name) [MOEK_##name] = MOEK_FMT_##name + 1,
    MOEK_GGML_FORMATS(MOEK_FMT_OF_ID)
#undef MOEK_FMT_OF_ID
};

const struct moek_format_traits *moek_format_traits(uint32_t format)
{
	const enum moek_fmt f = moek_fmt_index(format);
	return f == MOEK_FMT_NONE ? NULL : &moek_formats[f];
}

const struct moek_format_traits *moek_format_traits_at(size_t i)
{
	return i < MOEK_FMT_COUNT ? &moek_formats[i] : NULL;
}

const struct moek_format_info *moek_format_lookup(uint32_t format)
{
	const struct moek_format_traits *row = moek_format_traits(format);
	return row ? &row->info : NULL;
}

const struct moek_format_info *moek_format_at(size_t i)
{
	return i < MOEK_FMT_COUNT ? &moek_formats[i].info : NULL;
}

const struct moek_format_info *moek_format_from_safetensors(const char *dtype)
{
	for (size_t i = 0; i < MOEK_FMT_COUNT; i++) {
		const char *st = moek_formats[i].info.safetensors_dtype;
		if (st && strcmp(st, dtype) == 0)
			return &moek_formats[i].info;
	}
	return NULL;
}

const struct moek_format_info *moek_format_from_ggml(uint32_t ggml_type)
{
	const struct moek_format_traits *row = moek_format_traits(ggml_type);
	return row && row->ggml ? &row->info : NULL;
}

uint32_t moek_format_scale_block(uint32_t format)
{
	const struct moek_format_traits *row = moek_format_traits(format);
	return row ? row->info.scale_block : 0;
}

const char *moek_weight_format_names(char *buf, size_t len)
{
	size_t used = 0;
	if (len)
		buf[0] = '\0';
	for (size_t i = 0; len; i++) {
		const struct moek_format_info *fi = moek_format_at(i);
		if (!fi)
			break;
		if (!fi->weight_format)
			continue;
		int n = snprintf(buf + used, len - used, "%s%s", used ? " " : "", fi->name);
		if (n < 0 || (size_t)n >= len - used)
			break;
		used += (size_t)n;
	}
	return buf;
}

uint32_t moek_vec_dot_format(uint32_t weight_format)
{
	const struct moek_format_traits *row = moek_format_traits(weight_format);
	return row ? row->vec_dot_format : MOEK_F32;
}

size_t moek_row_bytes(uint32_t format, size_t n)
{
	const struct moek_format_traits *row = moek_format_traits(format);
	if (!row || n % row->info.block_elems != 0)
		return 0;
	return n / row->info.block_elems * row->info.block_bytes;
}

size_t moek_fp8_scale_bytes(size_t rows, size_t cols)
{
	return fp8_blocks(rows) * fp8_blocks(cols) * sizeof(float);
}

int moek_quantize_row(uint32_t format, const float *src, size_t n, void *dst)
{
	const struct moek_format_traits *row = moek_format_traits(format);
	if (!row || !row->quantize_row || n % row->info.block_elems != 0)
		return -1;
	row->quantize_row(src, dst, n);
	return 0;
}

void moek_ref_dequantize_row(uint32_t format, const void *src, const float *scale_row, float *dst,
                             size_t n)
{
	assert(moek_fmt_index(format) != MOEK_FMT_NONE);
	moek_fmt_dequantize_ref(moek_fmt_index(format), src, scale_row, dst, n);
}

void moek_fmt_dequantize_ref(enum moek_fmt f, const void *src, const float *scale_row, float *dst,
                             size_t n)
{
	const struct moek_format_traits *row = &moek_formats[f];
	assert(f < MOEK_FMT_COUNT && n % row->info.block_elems == 0);
	if (row->info.scale_block)
		row->dequantize_row_scaled(src, scale_row, dst, n);
	else
		row->dequantize_row(src, dst, n);
}

int moek_quantize(uint32_t format, const float *src, size_t rows, size_t cols, void *dst,
                  float *scales)
{
	const struct moek_format_traits *row = moek_format_traits(format);
	if (!row || cols % row->info.block_elems != 0)
		return -1;
	if ((row->info.scale_block != 0) != (scales != NULL))
		return -1;
	if (row->info.scale_block) {
		row->quantize_scaled(src, rows, cols, dst, scales);
		return 0;
	}
	const size_t rb = moek_row_bytes(format, cols);
	for (size_t r = 0; r < rows; r++)
		row->quantize_row(src + r * cols, (uint8_t *)dst + r * rb, cols);
	return 0;
}

int moek_dequantize(uint32_t format, const void *src, const float *scales, size_t rows, size_t cols,
                    float *dst)
{
	const struct moek_format_traits *row = moek_format_traits(format);
	if (!row || cols % row->info.block_elems != 0)
		return -1;
	const size_t sb = row->info.scale_block;
	if ((sb != 0) != (scales != NULL))
		return -1;
	const size_t rb = moek_row_bytes(format, cols);
	for (size_t r = 0; r < rows; r++) {
		const float *scale_row = scales ? scales + r / sb * ((cols + sb - 1) / sb) : NULL;
		moek_ref_dequantize_row(format, (const uint8_t *)src + r * rb, scale_row,
		                        dst + r * cols, cols);
	}
	return 0;
}

/* ---- MXFP4 layout converters -------------------------------------------------------------- */

/* Nibble of element i in the Hugging Face / OCP packing: byte i/2, low nibble for even i. */
static inline uint8_t hf_nibble(const uint8_t *blocks, size_t i)
{
	return (uint8_t)((blocks[i / 2] >> ((i & 1) * 4)) & 0xF);
}

/* The load-time conversion of gpt-oss checkpoints (the residency's loader runs it on every
 * expert it reads), so it is vectorised: per block, split the 16 HF bytes into even and odd
 * elements, interleave them back into element order and pack elements (j, j + 16) into byte
 * j. SSE2 is in every x86-64, so there is nothing to dispatch; the scalar loop is the
 * definition and the path elsewhere. */
void moek_mxfp4_from_hf(const uint8_t *blocks, const uint8_t *scales, size_t n, void *gguf)
{
	struct block_mxfp4 *y = gguf;
	size_t b = 0;
#if defined(__SSE2__)
	const __m128i low4 = _mm_set1_epi8(0x0F);
	for (; b < n / QK_MXFP4; b++) {
		const __m128i v = _mm_loadu_si128((const __m128i *)(blocks + b * (QK_MXFP4 / 2)));
		const __m128i even = _mm_and_si128(v, low4);
		const __m128i odd = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
		const __m128i first = _mm_unpacklo_epi8(even, odd);  /* elements 0..15 */
		const __m128i second = _mm_unpackhi_epi8(even, odd); /* elements 16..31 */
		/* Each byte of `second` is < 16: shifting 16-bit lanes by 4 keeps it in its byte.
		 */
		const __m128i q = _mm_or_si128(first, _mm_slli_epi16(second, 4));
		y[b].e = scales[b];
		_mm_storeu_si128((__m128i *)y[b].qs, q);
	}
#endif
	for (; b < n / QK_MXFP4; b++) {
		const uint8_t *src = blocks + b * (QK_MXFP4 / 2);
		y[b].e = scales[b];
		for (size_t j = 0; j < QK_MXFP4 / 2; j++)
			y[b].qs[j] = (uint8_t)(hf_nibble(src, j) | (hf_nibble(src, j + 16) << 4));
	}
}

void moek_mxfp4_to_hf(const void *gguf, size_t n, uint8_t *blocks, uint8_t *scales)
{
	const struct block_mxfp4 *x = gguf;
	for (size_t b = 0; b < n / QK_MXFP4; b++) {
		uint8_t *dst = blocks + b * (QK_MXFP4 / 2);
		scales[b] = x[b].e;
		for (size_t k = 0; k < QK_MXFP4 / 2; k++) { /* HF byte k: elements 2k, 2k+1 */
			const size_t e0 = 2 * k, e1 = 2 * k + 1;
			const uint8_t n0 = e0 < 16 ? x[b].qs[e0] & 0xF : x[b].qs[e0 - 16] >> 4;
			const uint8_t n1 = e1 < 16 ? x[b].qs[e1] & 0xF : x[b].qs[e1 - 16] >> 4;
			dst[k] = (uint8_t)(n0 | (n1 << 4));
		}
	}
}
