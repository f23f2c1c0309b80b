/* fmt_iq4.c — reference codecs of IQ4_NL and IQ4_XS (ggml types 20 and 23).
 *
 * Both store 4-bit codes into one fixed non-linear grid of 16 int8 levels (moek_iq4_kvalues,
 * denser near zero, as the values of a bell-shaped weight distribution are); a code means
 * level × scale. IQ4_NL has one f16 scale per 32 elements. IQ4_XS has one f16 scale d per
 * 256 elements and a 6-bit signed scale (ls − 32) per 32: value = d · (ls − 32) · level.
 *
 * The quantizers are written from those definitions. Per 32 elements, the scale is the
 * least-squares fit of the best of 16 code assignments: the block's signed extreme mapped onto
 * each end of the grid (−127 and +113) and onto nearby levels −127 + t, 113 + t (t = −4..3);
 * each assignment is refitted (scale = Σ q·x / Σ q²) and the one with the lowest squared error
 * kept, as ggml's reference searches. Unweighted: the error is the plain squared error (ggml
 * weights by x² without an importance matrix). IQ4_XS then quantizes the 8 sub-block scales
 * against a super-block scale (the largest one onto −32) and re-picks each sub-block's codes
 * for the scale it got. Codes are always re-picked for the scale actually stored (after f16
 * rounding), as the nearest level.
 *
 * The tables' rows are in formats.c. Pure functions; no allocation; thread-safe.
 */
#include <math.h>
#include <string.h>

#include "kernels_internal.h"

const int8_t moek_iq4_kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

enum { IQ4_SUB = 32 };

/* Midpoints between neighbouring levels: the code of v is the count of midpoints below v
 * (a tie keeps the lower level; NaN gives code 0). */
static const float iq4_midpoints[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f,
                                        -28.5f,  -16.0f, -4.5f,  7.0f,   19.0f,
                                        31.5f,   45.5f,  61.0f,  79.0f,  101.0f};

static inline int iq4_code(float v)
{
	int c = 0;
	for (int i = 0; i < 15; i++)
		c += v > iq4_midpoints[i];
	return c;
}

/* The scale search evaluates 32 candidate scales per block in vector lanes (GCC/Clang vector
 * extensions; built for baseline x86-64 and for AVX2 and picked per call, as formats.c's
 * K-quant searches). Every step is exact or one IEEE single-precision operation in a fixed
 * order, so both builds give the same bits. */
#pragma GCC diagnostic ignored "-Wpsabi" /* 32-byte vectors never cross this file's ABI */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
#define IQ4_INLINE static inline __attribute__((always_inline))

IQ4_INLINE f32x8 splat8(float v)
{
	return (f32x8){v, v, v, v, v, v, v, v};
}

/* The level nearest each lane's v, as iq4_code picks it: the lowest level plus the step to
 * each next level whose midpoint v exceeds (sums of small integers: exact). The midpoints and
 * steps come in as vectors the caller keeps in registers across its loops. */
IQ4_INLINE f32x8 iq4_level8(f32x8 v, const f32x8 mid[15], const f32x8 step[15])
{
	f32x8 q = splat8((float)moek_iq4_kvalues[0]);
	for (int i = 0; i < 15; i++)
		q += (f32x8)((i32x8)(v > mid[i]) & (i32x8)step[i]);
	return q;
}

/* The candidates: the block's signed extreme mapped onto level -127 + t (lanes 0-7) or
 * 113 + t (lanes 8-15), t = -4..3. Sixteen keep the search in registers: 32 (t = -8..7)
 * lowered the round-trip error by 3% at twice the time. */
enum { IQ4_CANDIDATES = 16 };
static const float iq4_targets[IQ4_CANDIDATES] = {-131, -130, -129, -128, -127, -126, -125, -124,
                                                  109,  110,  111,  112,  113,  114,  115,  116};

/* The scale of 32 elements (signed; 0 when they are all zero). Each candidate's codes are
 * refitted by least squares (scale = Σ q·x / Σ q²); the lowest squared error wins, the first
 * candidate on a tie. */
IQ4_INLINE float iq4_block_scale(const float *x)
{
	float amax = 0.0f, max = 0.0f; /* max: the signed value of largest magnitude */
	for (int j = 0; j < IQ4_SUB; j++) {
		if (fabsf(x[j]) > amax) { /* NaN never wins */
			amax = fabsf(x[j]);
			max = x[j];
		}
	}
	if (!(amax > 1e-30f))
		return 0.0f;
	if (!isfinite(amax))
		return max / (float)moek_iq4_kvalues[0];
	enum { G = IQ4_CANDIDATES / 8 };
	f32x8 id[G], sumqx[G], sumq2[G], mid[15], step[15];
	for (int i = 0; i < 15; i++) {
		mid[i] = splat8(iq4_midpoints[i]);
		step[i] = splat8((float)(moek_iq4_kvalues[i + 1] - moek_iq4_kvalues[i]));
	}
	for (int g = 0; g < G; g++) {
		f32x8 t;
		memcpy(&t, iq4_targets + 8 * g, sizeof(t));
		id[g] = t / splat8(max);
		sumqx[g] = sumq2[g] = splat8(0.0f);
	}
	for (int j = 0; j < IQ4_SUB; j++) {
		const f32x8 xj = splat8(x[j]);
		for (int g = 0; g < G; g++) {
			const f32x8 q = iq4_level8(xj * id[g], mid, step);
			sumqx[g] += q * xj;
			sumq2[g] += q * q;
		}
	}
	float d = 0.0f, best = 0.0f;
	for (int c = 0; c < IQ4_CANDIDATES; c++) {
		const float sqx = sumqx[c / 8][c % 8], sq2 = sumq2[c / 8][c % 8];
		if (sq2 > 0.0f && sqx * sqx > best * sq2) {
			d = sqx / sq2;
			best = d * sqx;
		}
	}
	return d;
}

/* Codes of 32 elements for the stored scale s (IQ4 nibble order into qs[16]). */
IQ4_INLINE void iq4_pack(const float *x, float s, uint8_t qs[16])
{
	const float is = s != 0.0f ? 1.0f / s : 0.0f;
	for (int j = 0; j < IQ4_SUB / 2; j++)
		qs[j] = (uint8_t)(iq4_code(x[j] * is) | iq4_code(x[j + 16] * is) << 4);
}

IQ4_INLINE void quantize_iq4_nl_rows(const float *x, void *dst, size_t n)
{
	struct block_iq4_nl *y = dst;
	for (size_t i = 0; i < n / QK4_NL; i++, x += QK4_NL) {
		y[i].d = moek_f32_to_f16(iq4_block_scale(x));
		iq4_pack(x, moek_f16_to_f32(y[i].d), y[i].qs);
	}
}

void moek_dequantize_iq4_nl(const void *src, float *y, size_t n)
{
	const struct block_iq4_nl *b = src;
	for (size_t i = 0; i < n / QK4_NL; i++, y += QK4_NL) {
		const float d = moek_f16_to_f32(b[i].d);
		for (int j = 0; j < QK4_NL / 2; j++) {
			y[j] = d * (float)moek_iq4_kvalues[b[i].qs[j] & 15];
			y[j + 16] = d * (float)moek_iq4_kvalues[b[i].qs[j] >> 4];
		}
	}
}

IQ4_INLINE void quantize_iq4_xs_rows(const float *x, void *dst, size_t n)
{
	struct block_iq4_xs *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float scales[QK_K / IQ4_SUB], amax = 0.0f, max = 0.0f;
		for (int ib = 0; ib < QK_K / IQ4_SUB; ib++) {
			scales[ib] = iq4_block_scale(x + IQ4_SUB * ib);
			if (fabsf(scales[ib]) > amax) {
				amax = fabsf(scales[ib]);
				max = scales[ib];
			}
		}
		memset(&y[i], 0, sizeof(y[i]));
		/* the largest sub-block scale maps onto -32, the 6-bit range's far end */
		const float d = amax > 0.0f ? max / -32.0f : 0.0f;
		y[i].d = moek_f32_to_f16(d);
		const float dd = moek_f16_to_f32(y[i].d);
		const float id = dd != 0.0f && isfinite(dd) ? 1.0f / dd : 0.0f;
		for (int ib = 0; ib < QK_K / IQ4_SUB; ib++) {
			const float v = id * scales[ib];
			/* nearest, ties to even, clamped to -32..31; NaN gives -32 */
			const int l = !(v > -32.0f) ? -32 : v >= 31.0f ? 31 : (int)lrintf(v);
			const int ls = l + 32;
			y[i].scales_l[ib / 2] |= (uint8_t)((ls & 15) << (4 * (ib % 2)));
			y[i].scales_h |= (uint16_t)((ls >> 4) << (2 * ib));
			iq4_pack(x + IQ4_SUB * ib, dd * (float)l, y[i].qs + 16 * ib);
		}
	}
}

/* Each row quantizer twice, baseline and AVX2, picked by the CPU per call. */
MOEK_AVX2_DISPATCH(quantize_iq4_nl, void moek_quantize_iq4_nl)
MOEK_AVX2_DISPATCH(quantize_iq4_xs, void moek_quantize_iq4_xs)

void moek_dequantize_iq4_xs(const void *src, float *y, size_t n)
{
	const struct block_iq4_xs *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = moek_f16_to_f32(b[i].d);
		for (int ib = 0; ib < QK_K / IQ4_SUB; ib++, y += IQ4_SUB) {
			const float dl = d * (float)moek_iq4_xs_scale(&b[i], ib);
			const uint8_t *qs = b[i].qs + 16 * ib;
			for (int j = 0; j < 16; j++) {
				y[j] = dl * (float)moek_iq4_kvalues[qs[j] & 15];
				y[j + 16] = dl * (float)moek_iq4_kvalues[qs[j] >> 4];
			}
		}
	}
}
