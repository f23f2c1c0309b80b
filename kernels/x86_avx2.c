/* x86_avx2.c — AVX2+FMA(+F16C) paths of the expert kernels, picked at run time.
 *
 * This file alone is compiled with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt); nothing in it
 * runs unless ffn.c's CPUID check chose moek_avx2_ops, so the library itself never requires
 * AVX2.
 *
 * Decode dot products (one weight row · one token):
 *   Q8_0, Q4_0, MXFP4 against Q8_0 activations; Q4_K, Q5_K, Q6_K against Q8_K activations —
 *   integer products (maddubs/madd) per block, one f32 FMA per block (K-quants: per
 *   256-element super-block, with the 6-bit sub-block scales applied in integers and the mins
 *   through Q8_K's bsums);
 *   BF16, F16, F32, FP8 E4M3 against f32 activations — converted in registers and FMA'd.
 * Prefill: a 3-row x 4-token register-blocked f32 micro-kernel over dequantized weight tiles.
 *
 * Every function's summation order depends only on k, never on which rows or tokens are
 * processed together: the FFN's split determinism rests on it.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels_internal.h"

static inline float hsum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline float f16(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* 32 nibbles of 16 bytes: bytes 0-15 = low nibbles (elements 0-15), 16-31 = high nibbles. */
static inline __m256i nibbles_32(const uint8_t *p)
{
	const __m128i q = _mm_loadu_si128((const __m128i *)p);
	const __m256i both =
	    _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
	return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* Σ x·y over 32 signed bytes as 8 f32 lanes (|x|, |y| <= 128: no int16 saturation). */
static inline __m256 dot_i8_32(__m256i x, __m256i y)
{
	const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
	return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* ---- Q8_0-activation formats --------------------------------------------------------------- */

static float dot_q8_0(const void *w, const float *scale_row, const void *act, size_t k)
{
	(void)scale_row;
	const struct block_q8_0 *x = w, *y = act;
	__m256 acc = _mm256_setzero_ps();
	for (size_t i = 0; i < k / QK8_0; i++) {
		const __m256 d = _mm256_set1_ps(f16(x[i].d) * f16(y[i].d));
		const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
		const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
		acc = _mm256_fmadd_ps(d, dot_i8_32(qx, qy), acc);
	}
	return hsum(acc);
}

static float dot_q4_0(const void *w, const float *scale_row, const void *act, size_t k)
{
	(void)scale_row;
	const struct block_q4_0 *x = w;
	const struct block_q8_0 *y = act;
	__m256 acc = _mm256_setzero_ps();
	for (size_t i = 0; i < k / QK4_0; i++) {
		const __m256 d = _mm256_set1_ps(f16(x[i].d) * f16(y[i].d));
		const __m256i qx = _mm256_sub_epi8(nibbles_32(x[i].qs), _mm256_set1_epi8(8));
		const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
		acc = _mm256_fmadd_ps(d, dot_i8_32(qx, qy), acc);
	}
	return hsum(acc);
}

/* 2^(e-128) (the scale of doubled E2M1 values), NaN for e = 255, as the reference. */
static inline float e8m0_half(uint8_t e)
{
	uint32_t bits = e == 255 ? 0x7fc00000u
	                : e >= 2 ? (uint32_t)(e - 1) << 23
	                         : 0x00200000u << e;
	float f;
	memcpy(&f, &bits, sizeof(f));
	return f;
}

static float dot_mxfp4(const void *w, const float *scale_row, const void *act, size_t k)
{
	(void)scale_row;
	const struct block_mxfp4 *x = w;
	const struct block_q8_0 *y = act;
	const __m256i values =
	    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)moek_mxfp4_kvalues));
	__m256 acc = _mm256_setzero_ps();
	for (size_t i = 0; i < k / QK_MXFP4; i++) {
		const __m256 d = _mm256_set1_ps(e8m0_half(x[i].e) * f16(y[i].d));
		const __m256i qx = _mm256_shuffle_epi8(values, nibbles_32(x[i].qs));
		const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
		acc = _mm256_fmadd_ps(d, dot_i8_32(qx, qy), acc);
	}
	return hsum(acc);
}

/* ---- Q8_K-activation formats (K-quants) ---------------------------------------------------- */

/* Σ_j m_j · (sum of the 32 activations of sub-block j), from Q8_K's 16-element bsums. */
static inline int k4_min_dot(const uint8_t *scales, const int16_t *bsums)
{
	int s = 0;
	for (int j = 0; j < 8; j++) {
		uint8_t sc, m;
		moek_k4_scale_min(j, scales, &sc, &m);
		s += m * (bsums[2 * j] + bsums[2 * j + 1]);
	}
	return s;
}

static inline void k4_scales(const uint8_t *packed, int16_t sc[8])
{
	for (int j = 0; j < 8; j++) {
		uint8_t s, m;
		moek_k4_scale_min(j, packed, &s, &m);
		sc[j] = s;
	}
}

static float dot_q4_K(const void *w, const float *scale_row, const void *act, size_t k)
{
	(void)scale_row;
	const struct block_q4_K *x = w;
	const struct block_q8_K *y = act;
	const __m256i low4 = _mm256_set1_epi8(0x0F);
	__m256 acc = _mm256_setzero_ps();
	float acc_min = 0.0f;
	for (size_t i = 0; i < k / QK_K; i++) {
		int16_t sc[8];
		k4_scales(x[i].scales, sc);
		__m256i sumi = _mm256_setzero_si256();
		for (int c = 0; c < 4; c++) {
			const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
			const __m256i lo = _mm256_and_si256(q, low4);
			const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
			const __m256i ylo = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
			const __m256i yhi =
			    _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
			const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo),
			                                      _mm256_set1_epi16(sc[2 * c]));
			const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi),
			                                      _mm256_set1_epi16(sc[2 * c + 1]));
			sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * y[i].d),
		                      _mm256_cvtepi32_ps(sumi), acc);
		acc_min += f16(x[i].dmin) * y[i].d * (float)k4_min_dot(x[i].scales, y[i].bsums);
	}
	return hsum(acc) - acc_min;
}

static float dot_q5_K(const void *w, const float *scale_row, const void *act, size_t k)
{
	(void)scale_row;
	const struct block_q5_K *x = w;
	const struct block_q8_K *y = act;
	const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
	__m256 acc = _mm256_setzero_ps();
	float acc_min = 0.0f;
	for (size_t i = 0; i < k / QK_K; i++) {
		int16_t sc[8];
		k4_scales(x[i].scales, sc);
		const __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
		__m256i sumi = _mm256_setzero_si256();
		for (int c = 0; c < 4; c++) {
			const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
			/* bit 2c / 2c+1 of qh[l]: the 5th bit of element l of sub-block 2c / 2c+1
			 */
			const __m256i hlo =
			    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one);
			const __m256i hhi = _mm256_and_si256(
			    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one);
			const __m256i lo =
			    _mm256_or_si256(_mm256_and_si256(q, low4), _mm256_slli_epi16(hlo, 4));
			const __m256i hi =
			    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4),
			                    _mm256_slli_epi16(hhi, 4));
			const __m256i ylo = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
			const __m256i yhi =
			    _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
			const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo),
			                                      _mm256_set1_epi16(sc[2 * c]));
			const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi),
			                                      _mm256_set1_epi16(sc[2 * c + 1]));
			sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * y[i].d),
		                      _mm256_cvtepi32_ps(sumi), acc);
		acc_min += f16(x[i].dmin) * y[i].d * (float)k4_min_dot(x[i].scales, y[i].bsums);
	}
	return hsum(acc) - acc_min;
}

/* Σ (q - 32)·y over 32 elements with 6-bit q, scaled per 16 elements by s0 (first 16) and
 * s1 (last 16), as 8 int32 lanes. */
static inline __m256i q6_part(__m256i q, __m256i yv, int8_t s0, int8_t s1)
{
	const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, yv),
	                                   _mm256_maddubs_epi16(_mm256_set1_epi8(32), yv));
	const __m256i s = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(s0)),
	                                          _mm_set1_epi16(s1), 1);
	return _mm256_madd_epi16(p, s);
}

static float dot_q6_K(const void *w, const float *scale_row, const void *act, size_t k)
{
	(void)scale_row;
	const struct block_q6_K *x = w;
	const struct block_q8_K *y = act;
	const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
	__m256 acc = _mm256_setzero_ps();
	for (size_t i = 0; i < k / QK_K; i++) {
		__m256i sumi = _mm256_setzero_si256();
		for (int h = 0; h < 2; h++) {
			const uint8_t *ql = x[i].ql + 64 * h;
			const int8_t *sc = x[i].scales + 8 * h;
			const int8_t *yq = y[i].qs + 128 * h;
			const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
			const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
			const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
			const __m256i q1 =
			    _mm256_or_si256(_mm256_and_si256(l0, low4),
			                    _mm256_slli_epi16(_mm256_and_si256(qh, two), 4));
			const __m256i q2 = _mm256_or_si256(
			    _mm256_and_si256(l1, low4),
			    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4));
			const __m256i q3 = _mm256_or_si256(
			    _mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
			    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4));
			const __m256i q4 = _mm256_or_si256(
			    _mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
			    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4));
			sumi = _mm256_add_epi32(
			    sumi,
			    q6_part(q1, _mm256_loadu_si256((const __m256i *)yq), sc[0], sc[1]));
			sumi = _mm256_add_epi32(
			    sumi, q6_part(q2, _mm256_loadu_si256((const __m256i *)(yq + 32)), sc[2],
			                  sc[3]));
			sumi = _mm256_add_epi32(
			    sumi, q6_part(q3, _mm256_loadu_si256((const __m256i *)(yq + 64)), sc[4],
			                  sc[5]));
			sumi = _mm256_add_epi32(
			    sumi, q6_part(q4, _mm256_loadu_si256((const __m256i *)(yq + 96)), sc[6],
			                  sc[7]));
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * y[i].d),
		                      _mm256_cvtepi32_ps(sumi), acc);
	}
	return hsum(acc);
}

/* ---- Float formats against f32 activations ------------------------------------------------ */

static inline __m256 load_bf16(const uint16_t *p)
{
	const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
static inline __m256 load_f16(const uint16_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline __m256 load_f32(const float *p)
{
	return _mm256_loadu_ps(p);
}

/* Four independent accumulators over 32-element steps (to cover FMA latency), then 8-element
 * steps into the first, then a scalar tail; combined in a fixed order. */
#define FLOAT_DOT(name, wtype, load, to_f32)                                                       \
	static float name(const void *w, const float *scale_row, const void *act, size_t k)        \
	{                                                                                          \
		(void)scale_row;                                                                   \
		const wtype *a = w;                                                                \
		const float *x = act;                                                              \
		__m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                        \
		size_t i = 0;                                                                      \
		for (; i + 32 <= k; i += 32) {                                                     \
			s0 = _mm256_fmadd_ps(load(a + i), _mm256_loadu_ps(x + i), s0);             \
			s1 = _mm256_fmadd_ps(load(a + i + 8), _mm256_loadu_ps(x + i + 8), s1);     \
			s2 = _mm256_fmadd_ps(load(a + i + 16), _mm256_loadu_ps(x + i + 16), s2);   \
			s3 = _mm256_fmadd_ps(load(a + i + 24), _mm256_loadu_ps(x + i + 24), s3);   \
		}                                                                                  \
		for (; i + 8 <= k; i += 8)                                                         \
			s0 = _mm256_fmadd_ps(load(a + i), _mm256_loadu_ps(x + i), s0);             \
		float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));       \
		for (; i < k; i++)                                                                 \
			s += to_f32(a[i]) * x[i];                                                  \
		return s;                                                                          \
	}

static inline float bf16_scalar(uint16_t h)
{
	return moek_bf16_to_f32(h);
}
static inline float f32_scalar(float f)
{
	return f;
}

FLOAT_DOT(dot_bf16, uint16_t, load_bf16, bf16_scalar)
FLOAT_DOT(dot_f16, uint16_t, load_f16, f16)
FLOAT_DOT(dot_f32w, float, load_f32, f32_scalar)

static float dot_f32(const float *a, const float *b, size_t k)
{
	return dot_f32w(a, NULL, b, k);
}

/* 16 E4M3 codes as two vectors of f32 each 2^-8 times the code's value: the code's 7
 * magnitude bits placed under an f16 exponent (bias 15 vs 7) and widened exactly by F16C
 * (E4M3 subnormals become f16 subnormals); 0x7f / 0xff become NaN. */
static inline void fp8x16_scaled(const uint8_t *p, __m256 *lo, __m256 *hi)
{
	const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
	const __m256i mag = _mm256_and_si256(v, _mm256_set1_epi16(0x7f));
	__m256i h =
	    _mm256_or_si256(_mm256_slli_epi16(mag, 7),
	                    _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8));
	const __m256i nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f));
	h = _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7e00)));
	*lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
	*hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

static float dot_fp8(const void *w, const float *scale_row, const void *act, size_t k)
{
	const uint8_t *q = w;
	const float *x = act;
	__m256 acc = _mm256_setzero_ps();
	float tail = 0.0f;
	for (size_t b0 = 0; b0 < k; b0 += MOEK_FP8_BLOCK) {
		const size_t b1 = b0 + MOEK_FP8_BLOCK < k ? b0 + MOEK_FP8_BLOCK : k;
		const float s = scale_row[b0 / MOEK_FP8_BLOCK];
		__m256 s0 = _mm256_setzero_ps(), s1 = s0;
		size_t i = b0;
		for (; i + 16 <= b1; i += 16) {
			__m256 lo, hi;
			fp8x16_scaled(q + i, &lo, &hi);
			s0 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + i), s0);
			s1 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + i + 8), s1);
		}
		acc = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), _mm256_set1_ps(s * 256.0f), acc);
		for (; i < b1; i++)
			tail += moek_fp8_e4m3_to_f32(q[i]) * s * x[i];
	}
	return hsum(acc) + tail;
}

/* ---- Dequantization for prefill tiles -------------------------------------------------------- */

static void dequantize_row(uint32_t format, const void *w, const float *scale_row, float *dst,
                           size_t k)
{
	size_t i = 0;
	switch (format) {
	case MOEK_BF16:
		for (; i + 8 <= k; i += 8)
			_mm256_storeu_ps(dst + i, load_bf16((const uint16_t *)w + i));
		break;
	case MOEK_F16:
		for (; i + 8 <= k; i += 8)
			_mm256_storeu_ps(dst + i, load_f16((const uint16_t *)w + i));
		break;
	case MOEK_FP8_E4M3_B128:
		for (; i + 16 <= k; i += 16) {
			__m256 lo, hi;
			const __m256 s = _mm256_set1_ps(scale_row[i / MOEK_FP8_BLOCK] * 256.0f);
			fp8x16_scaled((const uint8_t *)w + i, &lo, &hi);
			_mm256_storeu_ps(dst + i, _mm256_mul_ps(lo, s));
			_mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(hi, s));
		}
		break;
	case MOEK_Q8_0: {
		const struct block_q8_0 *b = w;
		for (; i < k; i += QK8_0) {
			const struct block_q8_0 *blk = &b[i / QK8_0];
			const __m256 d = _mm256_set1_ps(f16(blk->d));
			for (int j = 0; j < QK8_0; j += 8) {
				const __m128i q = _mm_loadl_epi64((const __m128i *)(blk->qs + j));
				_mm256_storeu_ps(
				    dst + i + j,
				    _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
			}
		}
		break;
	}
	default: break;
	}
	if (i < k) /* everything else (and tails) through the reference */
		moek_ref_dequantize_row(format, (const uint8_t *)w + moek_row_bytes(format, i),
		                        scale_row ? scale_row + i / MOEK_FP8_BLOCK : NULL, dst + i,
		                        k - i);
}

/* ---- Prefill micro-kernels -------------------------------------------------------------------
 * c[r][t] += w_r · x_t with one 8-lane accumulator per (r, t), k in steps of 8, then hsum: the
 * same sequence in every kernel shape, so grouping never changes a result. */

static void kernel_3x4(const float *w, size_t ldw, const float *x, size_t ldx, size_t k, float *c,
                       size_t ldc)
{
	__m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
	__m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
	__m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
	const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw;
	const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
	for (size_t i = 0; i < k; i += 8) {
		const __m256 v0 = _mm256_loadu_ps(w0 + i), v1 = _mm256_loadu_ps(w1 + i),
		             v2 = _mm256_loadu_ps(w2 + i);
		__m256 t = _mm256_loadu_ps(x0 + i);
		a00 = _mm256_fmadd_ps(v0, t, a00);
		a10 = _mm256_fmadd_ps(v1, t, a10);
		a20 = _mm256_fmadd_ps(v2, t, a20);
		t = _mm256_loadu_ps(x1 + i);
		a01 = _mm256_fmadd_ps(v0, t, a01);
		a11 = _mm256_fmadd_ps(v1, t, a11);
		a21 = _mm256_fmadd_ps(v2, t, a21);
		t = _mm256_loadu_ps(x2 + i);
		a02 = _mm256_fmadd_ps(v0, t, a02);
		a12 = _mm256_fmadd_ps(v1, t, a12);
		a22 = _mm256_fmadd_ps(v2, t, a22);
		t = _mm256_loadu_ps(x3 + i);
		a03 = _mm256_fmadd_ps(v0, t, a03);
		a13 = _mm256_fmadd_ps(v1, t, a13);
		a23 = _mm256_fmadd_ps(v2, t, a23);
	}
	c[0] += hsum(a00), c[1] += hsum(a01), c[2] += hsum(a02), c[3] += hsum(a03);
	c += ldc;
	c[0] += hsum(a10), c[1] += hsum(a11), c[2] += hsum(a12), c[3] += hsum(a13);
	c += ldc;
	c[0] += hsum(a20), c[1] += hsum(a21), c[2] += hsum(a22), c[3] += hsum(a23);
}

static void kernel_1x4(const float *w, const float *x, size_t ldx, size_t k, float *c)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	for (size_t i = 0; i < k; i += 8) {
		const __m256 v = _mm256_loadu_ps(w + i);
		a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + i), a0);
		a1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + ldx + i), a1);
		a2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + 2 * ldx + i), a2);
		a3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + 3 * ldx + i), a3);
	}
	c[0] += hsum(a0), c[1] += hsum(a1), c[2] += hsum(a2), c[3] += hsum(a3);
}

static void kernel_1x1(const float *w, const float *x, size_t k, float *c)
{
	__m256 a = _mm256_setzero_ps();
	for (size_t i = 0; i < k; i += 8)
		a = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a);
	*c += hsum(a);
}

static void tile(const float *w, size_t ldw, size_t nr, const float *x, size_t ldx, size_t nt,
                 size_t k, float *c, size_t ldc)
{
	assert(k % 8 == 0);
	size_t t = 0;
	for (; t + 4 <= nt; t += 4) {
		size_t r = 0;
		for (; r + 3 <= nr; r += 3)
			kernel_3x4(w + r * ldw, ldw, x + t * ldx, ldx, k, c + r * ldc + t, ldc);
		for (; r < nr; r++)
			kernel_1x4(w + r * ldw, x + t * ldx, ldx, k, c + r * ldc + t);
	}
	for (; t < nt; t++)
		for (size_t r = 0; r < nr; r++)
			kernel_1x1(w + r * ldw, x + t * ldx, k, c + r * ldc + t);
}

const struct moek_isa_ops moek_avx2_ops = {
    .name = "avx2",
    .dot =
        {
            [MOEK_F32] = dot_f32w,
            [MOEK_F16] = dot_f16,
            [MOEK_BF16] = dot_bf16,
            [MOEK_Q8_0] = dot_q8_0,
            [MOEK_Q4_0] = dot_q4_0,
            [MOEK_MXFP4] = dot_mxfp4,
            [MOEK_Q4_K] = dot_q4_K,
            [MOEK_Q5_K] = dot_q5_K,
            [MOEK_Q6_K] = dot_q6_K,
            [63] = dot_fp8,
        },
    .dequantize_row = dequantize_row,
    .dot_f32 = dot_f32,
    .tile = tile,
    .prefill = true,
};
