/* x86_avx2.c — AVX2+FMA(+F16C) paths of the expert kernels, picked at run time.
 *
 * This file alone is compiled with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt); nothing in it
 * runs unless isa.c's CPUID check chose moek_avx2_ops, so the library itself never requires
 * AVX2.
 *
 * Decode dot products (one weight row against 1..8 tokens, the row decoded once for all):
 *   Q8_0, Q4_0, MXFP4 against Q8_0 activations; Q4_K, Q5_K, Q6_K against Q8_K activations
 *   (Q2_K, Q3_K in x86_avx2_k23.c; IQ4_NL and IQ4_XS in x86_avx2_iq4.c; IQ2_XXS, IQ2_XS,
 *   IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M in x86_avx2_iq.c) —
 *   integer products (maddubs/madd), one f32 FMA per block (Q4_0/MXFP4: per pair of blocks,
 *   unpacked by one 256-bit shift/mask; K-quants: per 256-element super-block, the 6-bit
 *   sub-block scales applied in integers, mins and Q6_K's -32 through Q8_K's bsums);
 *   BF16, F16 against bf16 activations, F32 and FP8 E4M3 against f32 — converted in registers
 *   and FMA'd.
 *   Where the CPU has AVX512-VNNI + AVX512VL, the Q8_0 / Q4_0 / MXFP4 products use vpdpbusd and the
 *   Q4_K / Q5_K / Q6_K ones vpdpwssd on 256-bit registers (inline assembly; same bits;
 *   MOEK_FORM_VNNI). Every dot prefetches its row PREFETCH_AHEAD bytes ahead (rows with
 *   wide activations also PREFETCH_FAR ahead into L2).
 * Interleaved decode (rows in groups of 8, moek_interleave): MXFP4, Q8_0 and Q4_K, 4 weights
 *   of 8 rows per multiply against 4 broadcast activations, the 8 rows' sums in 8 lanes; BF16,
 *   2 weights of 8 rows per pair of FMAs against one broadcast activation pair.
 * Prefill: dequantization of weight tiles (bit-identical to formats.c) and a 6-row x 16-token
 * outer-product f32 micro-kernel over activation panels.
 *
 * Every function's summation order depends only on k, never on which rows or tokens are
 * processed together: the FFN's split determinism rests on it.
 */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "kernels_internal.h"
#include "x86_avx2.h"

/* 32 nibbles of 16 bytes: bytes 0-15 = low nibbles (elements 0-15), 16-31 = high nibbles. */
static inline __m256i nibbles_32(const uint8_t *p)
{
	const __m128i q = _mm_loadu_si128((const __m128i *)p);
	const __m256i both =
	    _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
	return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* Σ |x|·sign(y, x) pairs -> 8 f32 lanes (|x|, |y| <= 128: no int16 saturation). */
static inline __m256 dot_u8s8_32(__m256i abs_x, __m256i y_signed_by_x)
{
	const __m256i p16 = _mm256_maddubs_epi16(abs_x, y_signed_by_x);
	return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* ---- Q8_0-activation formats (32-element blocks) --------------------------------------------- */

enum q32_kind { Q32_Q8_0, Q32_Q4_0, Q32_MXFP4 };

/* Q8_0: one block against one Q8_0 activation block, by the sign trick (|x|, y signed by x).
 * VNNI form: one vpdpbusd for maddubs + madd — the same int32 sums, as maddubs cannot
 * saturate (|x| <= 128, |y| <= 127: the activation quantizer's range). */
ALWAYS_INLINE __m256 q8_0_block(const struct block_q8_0 *x, const struct block_q8_0 *y, __m256 acc,
                                bool vnni)
{
	const __m256i qx = _mm256_loadu_si256((const __m256i *)x->qs);
	const __m256i qy = _mm256_loadu_si256((const __m256i *)y->qs);
	const __m256 d = _mm256_set1_ps(f16(x->d) * f16(y->d));
	const __m256i ax = _mm256_sign_epi8(qx, qx), sy = _mm256_sign_epi8(qy, qx);
	if (vnni)
		return _mm256_fmadd_ps(
		    d, _mm256_cvtepi32_ps(dpbusd(_mm256_setzero_si256(), ax, sy)), acc);
	return _mm256_fmadd_ps(d, dot_u8s8_32(ax, sy), acc);
}

/* Q4_0 / MXFP4, two blocks at a time: the nibbles of blocks i and i+1 are unpacked with one
 * 256-bit and/shift — low nibbles give elements 0-15 of both blocks, high nibbles elements
 * 16-31 — against activations gathered in the same order (MOEK_ACT_Q8_0X2); lanes 0-3 of the
 * integer sums belong to block i, 4-7 to block i+1, scaled by a per-half scale vector.
 * Weights enter maddubs as unsigned bytes with an offset of 8 (Q4_0's raw codes) or 16
 * (MXFP4: doubled E2M1 value + 16, one vpshufb) and the activations' neg_sum16 takes the
 * offset back out in int32 — exact, so no sign juggling per element. */
/* The bits of 2^(e-128) (the scale of doubled E2M1 values; NaN for e = 255, as the reference)
 * as a constant expression (the `& 1`: only e = 0, 1 reach that branch; it keeps
 * the shift in range for every e the table instantiates). */
#define E8M0_HALF(e)                                                                               \
	((e) == 255 ? 0x7fc00000u : (e) >= 2 ? (uint32_t)((e)-1) << 23 : 0x00200000u << ((e)&1))
#define E8M0_4(e) E8M0_HALF(e), E8M0_HALF((e) + 1), E8M0_HALF((e) + 2), E8M0_HALF((e) + 3)
#define E8M0_16(e) E8M0_4(e), E8M0_4((e) + 4), E8M0_4((e) + 8), E8M0_4((e) + 12)
#define E8M0_64(e) E8M0_16(e), E8M0_16((e) + 16), E8M0_16((e) + 32), E8M0_16((e) + 48)

/* E8M0_HALF of every E8M0 byte, so that a block's scale is one broadcast load. */
static const union {
	uint32_t bits[256];
	float f[256];
} e8m0_half_lut = {{E8M0_64(0), E8M0_64(64), E8M0_64(128), E8M0_64(192)}};

/* MXFP4 codes as doubled E2M1 value + 16 (4..28), the unsigned operand of maddubs. */
static const int8_t mxfp4_values_plus16[16] = {16, 17, 18, 19, 20, 22, 24, 28,
                                               16, 15, 14, 13, 12, 10, 8,  4};

/* Scales of blocks b0 (lanes 0-3) and b1 (lanes 4-7; 0 when b1 is NULL). */
ALWAYS_INLINE __m256 pair_weight_scales(enum q32_kind kind, const uint8_t *b0, const uint8_t *b1)
{
	if (kind == Q32_MXFP4) {
		const __m256 s0 = _mm256_broadcast_ss(&e8m0_half_lut.f[b0[0]]);
		const __m256 s1 =
		    b1 ? _mm256_broadcast_ss(&e8m0_half_lut.f[b1[0]]) : _mm256_setzero_ps();
		return _mm256_blend_ps(s0, s1, 0xF0);
	}
	uint16_t d0, d1 = 0;
	memcpy(&d0, b0, 2);
	if (b1)
		memcpy(&d1, b1, 2);
	const __m128 d = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)d0 | (uint32_t)d1 << 16)));
	return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d),
	                                _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

/* Σ w·y of one pair against one token's activations, as scale-weighted f32 lanes folded into
 * acc. ulo / uhi: the pair's unsigned weight bytes (offset 8 or 16). The integer lane sums
 * are exact either way (maddubs cannot saturate: |4 · 28 · 127| < 2^15), so the VNNI form
 * gives the same bits as maddubs + madd. */
ALWAYS_INLINE __m256 pair_dot(enum q32_kind kind, bool vnni, __m256i ulo, __m256i uhi, __m256 w8,
                              const struct block_q8_0x2 *y, __m256 acc)
{
	const __m256i ylo = _mm256_loadu_si256((const __m256i *)y->lo);
	const __m256i yhi = _mm256_loadu_si256((const __m256i *)y->hi);
	__m256i off = _mm256_loadu_si256((const __m256i *)y->neg_sum16);
	if (kind == Q32_Q4_0)
		off = _mm256_srai_epi32(off, 1); /* -8 · Σy */
	__m256i s32;
	if (vnni) {
		s32 = dpbusd(dpbusd(off, ulo, ylo), uhi, yhi);
	} else {
		const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(ulo, ylo),
		                                     _mm256_maddubs_epi16(uhi, yhi));
		s32 = _mm256_add_epi32(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)), off);
	}
	return _mm256_fmadd_ps(_mm256_mul_ps(w8, _mm256_loadu_ps(y->d)), _mm256_cvtepi32_ps(s32),
	                       acc);
}

/* The unsigned weight bytes (offset 8 / 16) and lane scales of the pair of blocks at b0 (bb
 * bytes each); without has_two the second block is absent: zero bytes, zero scale. */
ALWAYS_INLINE void pair_unpack(enum q32_kind kind, const uint8_t *b0, size_t bb, bool has_two,
                               __m256i *ulo, __m256i *uhi, __m256 *w8)
{
	const size_t qoff = kind == Q32_MXFP4 ? 1 : 2;
	const __m256i low4 = _mm256_set1_epi8(0x0F);
	const __m256i q = _mm256_inserti128_si256(
	    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + qoff))),
	    has_two ? _mm_loadu_si128((const __m128i *)(b0 + bb + qoff)) : _mm_setzero_si128(), 1);
	*ulo = _mm256_and_si256(q, low4);
	*uhi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
	if (kind == Q32_MXFP4) {
		const __m256i values16 = _mm256_broadcastsi128_si256(
		    _mm_loadu_si128((const __m128i *)mxfp4_values_plus16));
		*ulo = _mm256_shuffle_epi8(values16, *ulo);
		*uhi = _mm256_shuffle_epi8(values16, *uhi);
	}
	*w8 = pair_weight_scales(kind, b0, has_two ? b0 + bb : NULL);
}

/* exact: every token's sums in the two chains of NT = 1 (moek_isa_ops.dot_exact), for the
 * batch-invariant mode; else several tokens take one chain each. */
ALWAYS_INLINE void q32_body(const void *w, const float *sr, const void *act, size_t as,
                            const int NT, size_t k, float *out, enum q32_kind kind, bool vnni,
                            bool exact)
{
	(void)sr;
	const size_t bb = kind == Q32_Q8_0 ? 34 : kind == Q32_Q4_0 ? 18 : 17, nb = k / 32;
	const bool far =
	    wide_activation(kind == Q32_Q8_0 ? nb * sizeof(struct block_q8_0)
	                                     : (nb + 1) / 2 * sizeof(struct block_q8_0x2));
	const uint8_t *x = w;
	__m256 acc[8], acc1[8];
	for (int t = 0; t < NT; t++)
		acc[t] = acc1[t] = _mm256_setzero_ps();
	const bool two = NT == 1 || exact;
	if (kind != Q32_Q8_0) { /* pairs of blocks against MOEK_ACT_Q8_0X2 activations */
		size_t p = 0;
		__m256i ulo, uhi;
		__m256 w8;
		if (two) { /* two accumulators (even / odd pairs): the FMA chain would bound */
			for (; p + 2 <= nb / 2; p += 2) {
				prefetch_ahead(x + 2 * p * bb, far);
				pair_unpack(kind, x + 2 * p * bb, bb, true, &ulo, &uhi, &w8);
				for (int t = 0; t < NT; t++)
					acc[t] = pair_dot(
					    kind, vnni, ulo, uhi, w8,
					    (const struct block_q8_0x2 *)((const uint8_t *)act +
					                                  t * as) +
					        p,
					    acc[t]);
				pair_unpack(kind, x + 2 * (p + 1) * bb, bb, true, &ulo, &uhi, &w8);
				for (int t = 0; t < NT; t++)
					acc1[t] = pair_dot(
					    kind, vnni, ulo, uhi, w8,
					    (const struct block_q8_0x2 *)((const uint8_t *)act +
					                                  t * as) +
					        p + 1,
					    acc1[t]);
			}
		}
		for (; 2 * p < nb; p++) {
			prefetch_ahead(x + 2 * p * bb, far);
			pair_unpack(kind, x + 2 * p * bb, bb, 2 * p + 1 < nb, &ulo, &uhi, &w8);
			for (int t = 0; t < NT; t++)
				acc[t] = pair_dot(
				    kind, vnni, ulo, uhi, w8,
				    (const struct block_q8_0x2 *)((const uint8_t *)act + t * as) +
				        p,
				    acc[t]);
		}
	} else {
		const struct block_q8_0 *xb = w;
		size_t i = 0;
		if (two) { /* two accumulators: the FMA latency chain would bound */
			for (; i + 2 <= nb; i += 2) {
				prefetch_ahead(xb + i, far);
				for (int t = 0; t < NT; t++) {
					const struct block_q8_0 *y =
					    (const struct block_q8_0 *)((const uint8_t *)act +
					                                t * as);
					acc[t] = q8_0_block(xb + i, y + i, acc[t], vnni);
					acc1[t] = q8_0_block(xb + i + 1, y + i + 1, acc1[t], vnni);
				}
			}
		}
		for (; i < nb; i++) { /* several tokens, and an odd last block */
			if (i % 2 == 0)
				prefetch_ahead(xb + i, far);
			for (int t = 0; t < NT; t++)
				acc[t] = q8_0_block(
				    xb + i,
				    (const struct block_q8_0 *)((const uint8_t *)act + t * as) + i,
				    acc[t], vnni);
		}
	}
	for (int t = 0; t < NT; t++)
		out[t] = hsum(two ? _mm256_add_ps(acc[t], acc1[t]) : acc[t]);
}

/* ---- MOEK_ACT_Q8_0X2: the activations of the Q4_0 / MXFP4 / IQ4_NL dot products -------------- */

static size_t act_row_bytes(uint32_t act_format, size_t k)
{
	if (act_format == MOEK_ACT_Q8_0S)
		return (k + 31) / 32 * sizeof(struct block_q8_0s);
	return (k + 63) / 64 * sizeof(struct block_q8_0x2);
}

/* 8 f32 lanes -> the largest |x| (NaN lanes ignored, as fmaxf does). */
static inline float amax_f32x8(__m256 m)
{
	__m128 v = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
	v = _mm_max_ps(_mm_movehl_ps(v, v), v);
	v = _mm_max_ss(_mm_movehdup_ps(v), v);
	return _mm_cvtss_f32(v);
}

static inline __m256 abs_ps(__m256 v)
{
	return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

/* 32 int32 lanes (four vectors, in element order) -> 32 int8 in element order. The values
 * are already within [-127, 127] or saturate there. */
static inline __m256i pack_i32x32(__m256i a, __m256i b, __m256i c, __m256i d)
{
	const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
	const __m256i q = _mm256_packs_epi16(ab, cd); /* lanes: a0 b0 c0 d0 | a1 b1 c1 d1 */
	return _mm256_max_epi8(
	    _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)),
	    _mm256_set1_epi8(-127));
}

/* Q8_0's rounding (d = amax / 127, q = round-half-away(clamp(x / d, ±127)), NaN -> 127 as
 * fminf) with d kept in f32; 32 elements at b into lo[0..15] / hi[0..15]. */
static void quantize_q8_0_block(const float *xb, float *d_out, int8_t *lo, int8_t *hi)
{
	__m256 v[4], m = _mm256_setzero_ps();
	for (int j = 0; j < 4; j++) {
		v[j] = _mm256_loadu_ps(xb + 8 * j);
		m = _mm256_max_ps(abs_ps(v[j]), m); /* NaN in the first operand: keeps m */
	}
	const float amax = amax_f32x8(m);
	const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
	*d_out = d;
	const __m256 idv = _mm256_set1_ps(id), lim = _mm256_set1_ps(127.0f);
	const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
	__m256i q[4];
	for (int j = 0; j < 4; j++) {
		__m256 t = _mm256_min_ps(_mm256_mul_ps(v[j], idv), lim); /* NaN -> 127 */
		t = _mm256_max_ps(t, _mm256_sub_ps(_mm256_setzero_ps(), lim));
		const __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
		const __m256 away =
		    _mm256_and_ps(_mm256_cmp_ps(abs_ps(_mm256_sub_ps(t, tr)), half, _CMP_GE_OQ),
		                  _mm256_or_ps(one, _mm256_and_ps(t, _mm256_set1_ps(-0.0f))));
		q[j] = _mm256_cvttps_epi32(_mm256_add_ps(tr, away));
	}
	const __m256i q8 = pack_i32x32(q[0], q[1], q[2], q[3]);
	_mm_storeu_si128((__m128i *)lo, _mm256_castsi256_si128(q8));
	_mm_storeu_si128((__m128i *)hi, _mm256_extracti128_si256(q8, 1));
}

/* Q8_K exactly as the reference (formats.c): the first element of largest |x| sets
 * iscale = -127 / max, q = clamp(nearest-even(iscale * x), ±127), bsums of 16, d = 1 / iscale.
 * A block holding a non-finite value takes the reference itself. */
static void quantize_q8_K_avx2(const float *x, size_t k, struct block_q8_K *y)
{
	for (size_t i = 0; i < k / QK_K; i++, x += QK_K) {
		__m256 m = _mm256_setzero_ps();
		for (int j = 0; j < QK_K; j += 8)
			m = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + j)), m);
		const float amax = amax_f32x8(m);
		bool finite = isfinite(amax);
		for (int j = 0; finite && j < QK_K; j += 8) /* NaN lanes were skipped by max */
			finite =
			    _mm256_movemask_ps(_mm256_cmp_ps(
			        _mm256_loadu_ps(x + j), _mm256_loadu_ps(x + j), _CMP_UNORD_Q)) == 0;
		if (!finite || amax == 0.0f) {
			moek_quantize_row(MOEK_Q8_K, x, QK_K, &y[i]);
			continue;
		}
		int first = 0;
		while (fabsf(x[first]) != amax)
			first++;
		const float iscale = -127.f / x[first];
		const __m256 isv = _mm256_set1_ps(iscale);
		const __m256i ones = _mm256_set1_epi8(1);
		for (int j = 0; j < QK_K; j += 32) {
			__m256i q[4];
			for (int p = 0; p < 4; p++)
				q[p] = _mm256_cvtps_epi32(
				    _mm256_mul_ps(isv, _mm256_loadu_ps(x + j + 8 * p)));
			const __m256i q8 = pack_i32x32(q[0], q[1], q[2], q[3]);
			_mm256_storeu_si256((__m256i *)(y[i].qs + j), q8);
			/* sums of 16: maddubs(1, q) gives pair sums, madd(1) quads, hadd */
			const __m256i s32 =
			    _mm256_madd_epi16(_mm256_maddubs_epi16(ones, q8), _mm256_set1_epi16(1));
			const __m128i s = _mm_hadd_epi32(_mm256_castsi256_si128(s32),
			                                 _mm256_extracti128_si256(s32, 1));
			const __m128i s2 = _mm_hadd_epi32(s, s); /* 16-sums: elements 0-15, 16-31 */
			y[i].bsums[j / 16] = (int16_t)_mm_cvtsi128_si32(s2);
			y[i].bsums[j / 16 + 1] = (int16_t)_mm_extract_epi32(s2, 1);
		}
		y[i].d = 1.0f / iscale;
	}
}

static void quantize_act(uint32_t act_format, const float *x, size_t k, void *dst)
{
	if (act_format == MOEK_Q8_K) {
		quantize_q8_K_avx2(x, k, dst);
		return;
	}
	if (act_format == MOEK_ACT_Q8_0S) {
		struct block_q8_0s *y = dst;
		for (size_t b = 0; 32 * b < k; b++) {
			quantize_q8_0_block(x + 32 * b, &y[b].d, y[b].qs, y[b].qs + 16);
			/* maddubs(1, q) pairs, madd(1) quads, then the 8 quads */
			const __m256i q = _mm256_loadu_si256((const __m256i *)y[b].qs);
			const __m256i s32 = _mm256_madd_epi16(
			    _mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
			__m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32),
			                          _mm256_extracti128_si256(s32, 1));
			s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
			s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
			y[b].neg16_sum = -16 * _mm_cvtsi128_si32(s);
		}
		return;
	}
	struct block_q8_0x2 *y = dst;
	for (size_t p = 0; 64 * p < k; p++) {
		memset(&y[p], 0, sizeof(y[p]));
		for (size_t b = 0; b < 2 && 64 * p + 32 * b < k; b++) {
			float d;
			quantize_q8_0_block(x + 64 * p + 32 * b, &d, y[p].lo + 16 * b,
			                    y[p].hi + 16 * b);
			for (int j = 0; j < 4; j++)
				y[p].d[4 * b + j] = d;
		}
		const __m256i sum = _mm256_add_epi16(
		    _mm256_maddubs_epi16(_mm256_set1_epi8(1),
		                         _mm256_loadu_si256((const __m256i *)y[p].lo)),
		    _mm256_maddubs_epi16(_mm256_set1_epi8(1),
		                         _mm256_loadu_si256((const __m256i *)y[p].hi)));
		_mm256_storeu_si256(
		    (__m256i *)y[p].neg_sum16,
		    _mm256_sub_epi32(
		        _mm256_setzero_si256(),
		        _mm256_slli_epi32(_mm256_madd_epi16(sum, _mm256_set1_epi16(1)), 4)));
	}
}

static void dequantize_act(uint32_t act_format, const void *src, size_t k, float *dst)
{
	if (act_format == MOEK_ACT_Q8_0S) {
		const struct block_q8_0s *y = src;
		for (size_t i = 0; i < k; i++)
			dst[i] = y[i / 32].d * (float)y[i / 32].qs[i % 32];
		return;
	}
	const struct block_q8_0x2 *y = src;
	for (size_t i = 0; i < k; i++) {
		const struct block_q8_0x2 *pb = &y[i / 64];
		const size_t b = (i % 64) / 32, j = i % 32;
		dst[i] =
		    pb->d[4 * b] * (float)(j < 16 ? pb->lo[16 * b + j] : pb->hi[16 * b + j - 16]);
	}
}

DOT_ENTRY(dot_q8_0_avx2, q32_body, Q32_Q8_0, false, false)
DOT_ENTRY(dot_q8_0_exact_avx2, q32_body, Q32_Q8_0, false, true)
DOT_ENTRY(dot_q4_0_avx2, q32_body, Q32_Q4_0, false, false)
DOT_ENTRY(dot_q4_0_exact_avx2, q32_body, Q32_Q4_0, false, true)
DOT_ENTRY(dot_mxfp4_avx2, q32_body, Q32_MXFP4, false, false)
DOT_ENTRY(dot_mxfp4_exact_avx2, q32_body, Q32_MXFP4, false, true)

/* The VNNI forms (the row dots below, the group dots further on) are compiled for the AVX-512
 * subset MOEK_FORM_VNNI needs (isa.c): the compiler may then fold a weight vector's load into the
 * EVEX shift that splits its nibbles and merge and/or into vpternlog — fewer instructions per
 * MXFP4 block (docs/performance.md). The integer sums are exact and the float steps the same, so
 * the bits are the AVX2 form's. */

VNNI_DOT_ENTRY(dot_q8_0_vnni, q32_body, Q32_Q8_0, true, false)
VNNI_DOT_ENTRY(dot_q8_0_exact_vnni, q32_body, Q32_Q8_0, true, true)
VNNI_DOT_ENTRY(dot_q4_0_vnni, q32_body, Q32_Q4_0, true, false)
VNNI_DOT_ENTRY(dot_q4_0_exact_vnni, q32_body, Q32_Q4_0, true, true)
VNNI_DOT_ENTRY(dot_mxfp4_vnni, q32_body, Q32_MXFP4, true, false)
VNNI_DOT_ENTRY(dot_mxfp4_exact_vnni, q32_body, Q32_MXFP4, true, true)
ROWS_ENTRY(rows_q8_0_avx2, q32_body, Q32_Q8_0, false, false)
ROWS_ENTRY(rows_q4_0_avx2, q32_body, Q32_Q4_0, false, false)
ROWS_ENTRY(rows_mxfp4_avx2, q32_body, Q32_MXFP4, false, false)
VNNI_ROWS_ENTRY(rows_q8_0_vnni, q32_body, Q32_Q8_0, true, false)
VNNI_ROWS_ENTRY(rows_q4_0_vnni, q32_body, Q32_Q4_0, true, false)
VNNI_ROWS_ENTRY(rows_mxfp4_vnni, q32_body, Q32_MXFP4, true, false)

/* The entry points of the formats that have a VNNI form: each picks its form per call. */
#define VNNI_DISPATCH_DOT(fmt) static VNNI_PICK_DOT(dot_##fmt, dot_##fmt##_avx2, dot_##fmt##_vnni)
#define VNNI_DISPATCH_ROWS(fmt)                                                                    \
	static VNNI_PICK_ROWS(rows_##fmt, rows_##fmt##_avx2, rows_##fmt##_vnni)

VNNI_DISPATCH_DOT(q8_0)

VNNI_DISPATCH_DOT(q4_0)

VNNI_DISPATCH_DOT(mxfp4)
VNNI_DISPATCH_DOT(q8_0_exact)
VNNI_DISPATCH_DOT(q4_0_exact)
VNNI_DISPATCH_DOT(mxfp4_exact)

VNNI_DISPATCH_ROWS(q8_0)

VNNI_DISPATCH_ROWS(q4_0)

VNNI_DISPATCH_ROWS(mxfp4)

/* ---- Interleaved rows (moek_interleave): 8 rows per SIMD multiply ---------------------------
 *
 * A column of an interleaved group holds one block of each of 8 rows; each of its 32-byte
 * vectors carries 4 bytes of every row (lane r = row r). One vector times 4 activations
 * broadcast to all lanes (vpdpbusd with an embedded broadcast, or maddubs + madd) adds 4
 * weights of each of the 8 rows into 8 int32 lanes; the 8 rows' scales are one load; nothing
 * is summed horizontally. A GGUF-row dot instead reloads the activation block, converts a
 * scale and folds a vector per row and block — most of its work is not spent on weights
 * (docs/performance.md, `bench_kernels --dots`). The integer sums are exact, so the VNNI and the
 * AVX2 forms give the same bits; against the GGUF-row dots only the float reassociation differs.
 *
 * Software prefetch where it pays, which depends on the CPU (x8_prefetch below).
 *
 * Activations: Q8_0 and MXFP4 take MOEK_ACT_Q8_0S (the block's d and -16 times the sum of its
 * values next to them, elements in order), Q4_K takes Q8_K as its row dot does. */

/* Software prefetch of the group dots' weight stream: every line `near` bytes ahead into L1
 * and `near + gap` bytes ahead into L2, issued as the dot moves on (a cursor per call, so each
 * line is asked for once). Past the end of a group it runs into the next group of the same
 * matrix, which the caller reads next; a prefetch never faults.
 *
 * Whether it pays depends on the core and on the token count (docs/performance.md, "Kernel
 * design measurements"). On the Intel Xeon VMs one core's plain read is slow enough that, with
 * the hardware prefetcher alone, a group dot's compute time adds to its memory time instead of
 * hiding behind it; the software prefetch hides it. On the AMD EPYC VMs it costs weight
 * bandwidth at one token, so there the hardware prefetcher works alone; with several tokens
 * (more work per line) the same stall appears and the prefetch pays there too. Index 0: one
 * token, 1: several. */
atomic_uint moek_avx2_x8_pf_near[2], moek_avx2_x8_pf_gap[2];
static atomic_bool x8_pf_set;

static void set_prefetch(int several, unsigned near, unsigned gap)
{
	atomic_store_explicit(&moek_avx2_x8_pf_near[several], near, memory_order_relaxed);
	atomic_store_explicit(&moek_avx2_x8_pf_gap[several], near ? gap : 0, memory_order_relaxed);
}

void moek_avx2_set_group_prefetch(unsigned near, unsigned gap)
{
	set_prefetch(0, near, gap);
	set_prefetch(1, near, gap);
	atomic_store_explicit(&x8_pf_set, true, memory_order_relaxed);
}

void moek_avx2_group_prefetch(unsigned *near, unsigned *gap)
{
	if (!atomic_load_explicit(&x8_pf_set, memory_order_relaxed)) {
		const bool intel = moek_cpu_features() & MOEK_CPU_INTEL;
		set_prefetch(0, intel ? 1536 : 0, intel ? 3072 : 0);
		set_prefetch(1, 1536, 3072);
		atomic_store_explicit(&x8_pf_set, true, memory_order_relaxed);
	}
	*near = atomic_load_explicit(&moek_avx2_x8_pf_near[0], memory_order_relaxed);
	*gap = atomic_load_explicit(&moek_avx2_x8_pf_gap[0], memory_order_relaxed);
}

/* Four activation bytes, read as one broadcast operand. */
struct act4 {
	int8_t b[4];
};

#define X8 MOEK_INTERLEAVE

static inline int32_t load_i32(const int8_t *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return v;
}

/* acc + Σ over each lane's 4 bytes of u (unsigned) · the 4 signed bytes at s (the same for
 * every lane), exact in int32. The AVX2 form needs every u·s pair sum within int16: callers
 * pass u <= 28 (MXFP4 codes + 16, Q4_K nibbles); Q8_0 uses x8_dot4_sign. */
ALWAYS_INLINE __m256i x8_dot4(bool vnni, __m256i acc, __m256i u, const int8_t *s)
{
	if (vnni) {
		__asm__("vpdpbusd %2%{1to8%}, %1, %0"
		        : "+v"(acc)
		        : "v"(u), "m"(*(const struct act4 *)s));
		return acc;
	}
	return _mm256_add_epi32(
	    acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_set1_epi32(load_i32(s))),
	                           _mm256_set1_epi16(1)));
}

ALWAYS_INLINE const struct block_q8_0s *x8_q8_0s(const void *act, size_t as, int t, size_t b)
{
	return (const struct block_q8_0s *)((const uint8_t *)act + (size_t)t * as) + b;
}

ALWAYS_INLINE const struct block_q8_K *x8_q8_K(const void *act, size_t as, int t, size_t i)
{
	return (const struct block_q8_K *)((const uint8_t *)act + (size_t)t * as) + i;
}

ALWAYS_INLINE void x8_store(const __m256 *acc, int NT, float *out)
{
	for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(out + 8 * t, acc[t]);
}

/* MXFP4: per column four vectors of nibble bytes (vector v: elements 4v..4v+3 low,
 * 16+4v..19+4v high) and the 8 E8M0 bytes. The scale of row r is 2^(e-127) · d / 2 (d: the
 * activation block's), computed as bits(e << 23 | (e in {0, 255} ? 1 << 22 : 0)) · (d · 0.5):
 * e = 0 gives 2^-127 (the subnormal the reference gives), e = 255 a NaN, the others the exact
 * power of two. Codes enter as doubled E2M1 values + 16; -16 · Σy takes the offset back out. */
ALWAYS_INLINE __m256 x8_e8m0_scales(const uint8_t *e8)
{
	/* No 0 or 255 among the 8 bytes (the rule in real checkpoints): the shift alone. The
	 * test runs on the integer ALUs, which a group dot leaves idle, and spares the vector
	 * pipes a few instructions per block (bench_kernels --dots). */
	uint64_t b;
	memcpy(&b, e8, 8);
	const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
	const uint64_t zero_or_ff = (((b - ones) & ~b) | ((~b - ones) & b)) & highs;
	const __m256i e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)b));
	if (__builtin_expect(zero_or_ff == 0, 1))
		return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
	const __m256i edge = _mm256_cmpgt_epi32(
	    _mm256_set1_epi32(2),
	    _mm256_and_si256(_mm256_add_epi32(e, _mm256_set1_epi32(1)), _mm256_set1_epi32(255)));
	return _mm256_castsi256_ps(_mm256_or_si256(
	    _mm256_slli_epi32(e, 23), _mm256_and_si256(edge, _mm256_set1_epi32(1 << 22))));
}

ALWAYS_INLINE void x8_mxfp4_body(const void *group, const void *act, size_t as, const int NT,
                                 size_t k, float *out, int form) /* 0 AVX2, 1 VNNI, 2 + VBMI */
{
	const bool vnni = form != 0;
	const uint8_t *col = group;
	const __m256i low4 = _mm256_set1_epi8(0x0F);
	const __m256i values16 =
	    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mxfp4_values_plus16));
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	struct x8_stream pf = x8_stream_at(col, NT);
	for (size_t b = 0; b < k / QK_MXFP4; b++, col += X8 * 17) {
		x8_prefetch(&pf, col + X8 * 17);
		/* one token: four chains (low/high nibbles, even/odd vector), the multiply's
		 * latency would bound a single one; more tokens are chains of their own */
		__m256i sum[8], chain[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
		                            _mm256_setzero_si256()};
		for (int t = 0; t < NT; t++)
			sum[t] = _mm256_set1_epi32(x8_q8_0s(act, as, t, b)->neg16_sum);
		for (int v = 0; v < 4; v++) {
			const __m256i q = _mm256_loadu_si256((const __m256i *)(col + 32 * v));
			__m256i lo, hi;
			if (form == 2) { /* vpermb reads 5 index bits: values16 holds the 16 codes
				            twice, so the high nibble's bit 4 needs no mask */
				const __m256i qh = _mm256_srli_epi16(q, 4);
				__asm__("vpermb %1, %2, %0" : "=v"(lo) : "v"(values16), "v"(q));
				__asm__("vpermb %1, %2, %0" : "=v"(hi) : "v"(values16), "v"(qh));
			} else {
				lo = _mm256_shuffle_epi8(values16, _mm256_and_si256(q, low4));
				hi = _mm256_shuffle_epi8(
				    values16, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
			}
			for (int t = 0; t < NT; t++) {
				const int8_t *y = x8_q8_0s(act, as, t, b)->qs;
				__m256i *s_lo = NT == 1 && v % 2 ? &chain[0] : &sum[t];
				__m256i *s_hi = NT == 1 ? &chain[1 + v % 2] : &sum[t];
				*s_lo = x8_dot4(vnni, *s_lo, lo, y + 4 * v);
				*s_hi = x8_dot4(vnni, *s_hi, hi, y + 16 + 4 * v);
			}
		}
		if (NT == 1)
			sum[0] = _mm256_add_epi32(_mm256_add_epi32(sum[0], chain[0]),
			                          _mm256_add_epi32(chain[1], chain[2]));
		const __m256 sc = x8_e8m0_scales(col + 128);
		for (int t = 0; t < NT; t++) {
			const __m256 f =
			    _mm256_mul_ps(sc, _mm256_set1_ps(x8_q8_0s(act, as, t, b)->d * 0.5f));
			acc[t] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(sum[t]), acc[t]);
		}
	}
	x8_store(acc, NT, out);
}

/* Q8_0: per column eight vectors of int8 weights (vector v: elements 4v..4v+3) and the 8 f16
 * scales. VNNI: weights xor 0x80 are the values + 128 as unsigned bytes, -128 · Σy takes the
 * offset out. AVX2: |w| against y signed by w (maddubs cannot saturate: 2 · 128 · 127). */
ALWAYS_INLINE void x8_q8_0_body(const void *group, const void *act, size_t as, const int NT,
                                size_t k, float *out, bool vnni)
{
	const uint8_t *col = group;
	const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	struct x8_stream pf = x8_stream_at(col, NT);
	for (size_t b = 0; b < k / QK8_0; b++, col += X8 * 34) {
		x8_prefetch(&pf, col + X8 * 34);
		/* one token: four chains (vector v % 4), as in x8_mxfp4_body */
		__m256i sum[8], chain[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
		                            _mm256_setzero_si256()};
		for (int t = 0; t < NT; t++)
			sum[t] = vnni ? _mm256_set1_epi32(8 * x8_q8_0s(act, as, t, b)->neg16_sum)
			              : _mm256_setzero_si256();
		for (int v = 0; v < 8; v++) {
			const __m256i w = _mm256_loadu_si256((const __m256i *)(col + 32 * v));
			const __m256i u = vnni ? _mm256_xor_si256(w, flip) : _mm256_sign_epi8(w, w);
			for (int t = 0; t < NT; t++) {
				const int8_t *y = x8_q8_0s(act, as, t, b)->qs + 4 * v;
				__m256i *s = NT == 1 && v % 4 ? &chain[v % 4 - 1] : &sum[t];
				if (vnni) {
					*s = x8_dot4(true, *s, u, y);
				} else {
					const __m256i ys =
					    _mm256_sign_epi8(_mm256_set1_epi32(load_i32(y)), w);
					*s = _mm256_add_epi32(
					    *s,
					    _mm256_madd_epi16(_mm256_maddubs_epi16(u, ys), ones));
				}
			}
		}
		if (NT == 1)
			sum[0] = _mm256_add_epi32(_mm256_add_epi32(sum[0], chain[0]),
			                          _mm256_add_epi32(chain[1], chain[2]));
		const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(col + 256)));
		for (int t = 0; t < NT; t++)
			acc[t] = _mm256_fmadd_ps(
			    _mm256_mul_ps(d, _mm256_set1_ps(x8_q8_0s(act, as, t, b)->d)),
			    _mm256_cvtepi32_ps(sum[t]), acc[t]);
	}
	x8_store(acc, NT, out);
}

/* Q4_K: per super-block column 8 f16 d, 8 f16 dmin, three vectors of the packed 6-bit scales
 * (vector g: bytes 4g..4g+3 of each row's 12) and 32 vectors of nibble bytes (chunk c =
 * vectors 8c..8c+7: low nibbles sub-block 2c, high nibbles 2c+1, elements 64c + 4v.. and
 * 64c + 32 + 4v..). The 8 rows' scales and mins are unpacked in vector lanes (byte j of a
 * lane = sub-block j or j + 4); sub-block sums are scaled in integers — AVX2: the 8 vectors'
 * maddubs pairs summed in int16 (8 · 2 · 15 · 127 < 2^15), then one madd by the scale; VNNI:
 * vpdpbusd sums, then one multiply — and the mins go through Q8_K's bsums. */
/* Byte b of each int32 lane of v, zero-extended to the lane — or, as_int16_pairs, to both of
 * its int16 words (the madd operand form). */
ALWAYS_INLINE __m256i x8_k_byte(__m256i v, int b, bool as_int16_pairs)
{
	const __m256i at = as_int16_pairs ? _mm256_setr_epi32(0, 0x40004, 0x80008, 0xc000c, 0,
	                                                      0x40004, 0x80008, 0xc000c)
	                                  : _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12);
	const uint32_t pick = as_int16_pairs ? 0x80008000u | (uint32_t)b | (uint32_t)b << 16
	                                     : 0x80808000u | (uint32_t)b;
	return _mm256_shuffle_epi8(v, _mm256_add_epi32(_mm256_set1_epi32((int32_t)pick), at));
}

ALWAYS_INLINE void x8_q4_K_body(const void *group, const void *act, size_t as, const int NT,
                                size_t k, float *out, bool vnni)
{
	const uint8_t *col = group;
	const __m256i m4 = _mm256_set1_epi8(0x0F), m6 = _mm256_set1_epi8(0x3F),
	              m30 = _mm256_set1_epi8(0x30), low_bytes = _mm256_set1_epi16(0x00FF);
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	struct x8_stream pf = x8_stream_at(col, NT);
	for (size_t i = 0; i < k / QK_K; i++, col += X8 * 144) {
		const __m256i v0 = _mm256_loadu_si256((const __m256i *)(col + 32));
		const __m256i v1 = _mm256_loadu_si256((const __m256i *)(col + 64));
		const __m256i v2 = _mm256_loadu_si256((const __m256i *)(col + 96));
		const __m256i sc[2] = {
		    _mm256_and_si256(v0, m6),
		    _mm256_or_si256(_mm256_and_si256(v2, m4),
		                    _mm256_and_si256(_mm256_srli_epi16(v0, 2), m30))};
		const __m256i mn[2] = {
		    _mm256_and_si256(v1, m6),
		    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v2, 4), m4),
		                    _mm256_and_si256(_mm256_srli_epi16(v1, 2), m30))};
		const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)col));
		const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(col + 16)));
		__m256i isum[8];
		for (int t = 0; t < NT; t++) {
			/* Σ_j m_j · (Σy over sub-block j), the 16-element bsums taken in pairs:
			 * int16 words (m_j, m_j+2) of a lane against (ys_j, ys_j+2) */
			const int16_t *bs = x8_q8_K(act, as, t, i)->bsums;
			int32_t ys[8];
			for (int j = 0; j < 8; j++)
				ys[j] = bs[2 * j] + bs[2 * j + 1];
			__m256i msum = _mm256_setzero_si256();
			for (int h = 0; h < 2; h++) {
				const int32_t *y4 = ys + 4 * h;
				const __m256i even = _mm256_and_si256(mn[h], low_bytes);
				const __m256i odd = _mm256_srli_epi16(mn[h], 8);
				msum = _mm256_add_epi32(
				    msum,
				    _mm256_madd_epi16(even, _mm256_set1_epi32((
				                                int32_t)((uint32_t)(uint16_t)y4[0] |
				                                         (uint32_t)y4[2] << 16))));
				msum = _mm256_add_epi32(
				    msum,
				    _mm256_madd_epi16(
				        odd, _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)y4[1] |
				                                         (uint32_t)y4[3] << 16))));
			}
			const __m256 yd = _mm256_set1_ps(x8_q8_K(act, as, t, i)->d);
			acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, yd), _mm256_cvtepi32_ps(msum),
			                          acc[t]);
			isum[t] = _mm256_setzero_si256();
		}
		for (int c = 0; c < 4; c++) {
			const uint8_t *qc = col + 128 + 32 * 8 * c;
			x8_prefetch(&pf, qc + 32 * 8);
			/* one token: two chains each (even/odd vector), as in x8_mxfp4_body */
			__m256i slo[8], shi[8], slo1 = _mm256_setzero_si256(), shi1 = slo1;
			for (int t = 0; t < NT; t++)
				slo[t] = shi[t] = _mm256_setzero_si256();
			for (int v = 0; v < 8; v++) {
				const __m256i q =
				    _mm256_loadu_si256((const __m256i *)(qc + 32 * v));
				const __m256i lo = _mm256_and_si256(q, m4);
				/* VNNI: the high nibbles in place, 16 times their value (the sum is
				 * shifted back once per chunk, exactly) */
				const __m256i hi =
				    vnni ? _mm256_andnot_si256(m4, q)
				         : _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
				for (int t = 0; t < NT; t++) {
					const int8_t *y =
					    x8_q8_K(act, as, t, i)->qs + 64 * c + 4 * v;
					__m256i *pl = NT == 1 && v % 2 ? &slo1 : &slo[t];
					__m256i *ph = NT == 1 && v % 2 ? &shi1 : &shi[t];
					if (vnni) {
						*pl = x8_dot4(true, *pl, lo, y);
						*ph = x8_dot4(true, *ph, hi, y + 32);
					} else {
						*pl = _mm256_add_epi16(
						    *pl, _mm256_maddubs_epi16(
						             lo, _mm256_set1_epi32(load_i32(y))));
						*ph = _mm256_add_epi16(
						    *ph,
						    _mm256_maddubs_epi16(
						        hi, _mm256_set1_epi32(load_i32(y + 32))));
					}
				}
			}
			if (NT == 1) {
				slo[0] = vnni ? _mm256_add_epi32(slo[0], slo1)
				              : _mm256_add_epi16(slo[0], slo1);
				shi[0] = vnni ? _mm256_add_epi32(shi[0], shi1)
				              : _mm256_add_epi16(shi[0], shi1);
			}
			/* scales of sub-blocks 2c and 2c + 1: bytes (2c) % 4 and (2c+1) % 4 of
			 * the lanes of sc[c / 2] */
			const __m256i s_lo = x8_k_byte(sc[c / 2], (2 * c) % 4, !vnni);
			const __m256i s_hi = x8_k_byte(sc[c / 2], (2 * c + 1) % 4, !vnni);
			for (int t = 0; t < NT; t++) {
				if (vnni)
					isum[t] = _mm256_add_epi32(
					    isum[t], _mm256_add_epi32(
					                 _mm256_mullo_epi32(slo[t], s_lo),
					                 _mm256_mullo_epi32(
					                     _mm256_srai_epi32(shi[t], 4), s_hi)));
				else
					isum[t] = _mm256_add_epi32(
					    isum[t],
					    _mm256_add_epi32(_mm256_madd_epi16(slo[t], s_lo),
					                     _mm256_madd_epi16(shi[t], s_hi)));
			}
		}
		for (int t = 0; t < NT; t++) {
			const __m256 yd = _mm256_set1_ps(x8_q8_K(act, as, t, i)->d);
			acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, yd), _mm256_cvtepi32_ps(isum[t]),
			                         acc[t]);
		}
	}
	x8_store(acc, NT, out);
}

/* BF16: per unit of 16 columns eight vectors of bf16 pairs (vector v: elements 2v and 2v+1 of
 * row r in lane r) against bf16 activations. A pair's even element shifted up 16 bits is its
 * f32 value, its odd element masked in place is; the activation pair is one 32-bit broadcast
 * split the same way. A GGUF-row BF16 dot loads as many activation bytes as weight bytes —
 * at 7168 columns a 14 KiB activation row that the weight stream evicts from L1 before every
 * row comes back from L2, and those reloads cost part of a core's DRAM stream
 * (docs/performance.md); here each activation pair serves 8 rows. One token: four
 * vectors per step, even and odd sums of each in chains of their own (eight). */
ALWAYS_INLINE void x8_bf16_body(const void *group, const void *act, size_t as, const int NT,
                                size_t k, float *out, bool exact)
{
	const uint8_t *col = group;
	const __m256i odd_mask = _mm256_set1_epi32((int)0xffff0000u);
	if (exact) { /* (no integer products: the entry's flag picks the token-exact form) */
		/* every token in the eight chains of one token, two tokens per pass over the group
		 * (16 chains: AVX2's registers) */
		for (int t0 = 0; t0 < NT; t0 += 2) {
			const int nb = NT - t0 < 2 ? NT - t0 : 2;
			const uint8_t *c2 = group;
			struct x8_stream pf2 = x8_stream_at(c2, 1);
			__m256 ev[2][4], od[2][4];
			for (int b = 0; b < 2; b++)
				for (int j = 0; j < 4; j++)
					ev[b][j] = od[b][j] = _mm256_setzero_ps();
			for (size_t p = 0; p < k / 2; p += 4, c2 += 4 * 32) {
				x8_prefetch(&pf2, c2 + 4 * 32);
				for (int j = 0; j < 4; j++) {
					const __m256i w =
					    _mm256_loadu_si256((const __m256i *)(c2 + 32 * j));
					for (int b = 0; b < nb; b++) {
						const __m256i y = _mm256_set1_epi32(
						    load_i32((const int8_t *)act +
						             (size_t)(t0 + b) * as + 4 * (p + j)));
						ev[b][j] = _mm256_fmadd_ps(
						    _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
						    _mm256_castsi256_ps(_mm256_slli_epi32(y, 16)),
						    ev[b][j]);
						od[b][j] = _mm256_fmadd_ps(
						    _mm256_castsi256_ps(
						        _mm256_and_si256(w, odd_mask)),
						    _mm256_castsi256_ps(
						        _mm256_and_si256(y, odd_mask)),
						    od[b][j]);
					}
				}
			}
			for (int b = 0; b < nb; b++) {
				const __m256 s01 = _mm256_add_ps(_mm256_add_ps(ev[b][0], od[b][0]),
				                                 _mm256_add_ps(ev[b][1], od[b][1]));
				const __m256 s23 = _mm256_add_ps(_mm256_add_ps(ev[b][2], od[b][2]),
				                                 _mm256_add_ps(ev[b][3], od[b][3]));
				_mm256_storeu_ps(out + 8 * (t0 + b), _mm256_add_ps(s01, s23));
			}
		}
		return;
	}
	if (NT == 1) {
		const uint8_t *x = act;
		__m256 ev[4], od[4];
		for (int j = 0; j < 4; j++)
			ev[j] = od[j] = _mm256_setzero_ps();
		struct x8_stream pf = x8_stream_at(col, NT);
		for (size_t p = 0; p < k / 2; p += 4, col += 4 * 32) {
			x8_prefetch(&pf, col + 4 * 32);
			for (int j = 0; j < 4; j++) {
				const __m256i w =
				    _mm256_loadu_si256((const __m256i *)(col + 32 * j));
				const __m256i y =
				    _mm256_set1_epi32(load_i32((const int8_t *)x + 4 * (p + j)));
				ev[j] = _mm256_fmadd_ps(
				    _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
				    _mm256_castsi256_ps(_mm256_slli_epi32(y, 16)), ev[j]);
				od[j] = _mm256_fmadd_ps(
				    _mm256_castsi256_ps(_mm256_and_si256(w, odd_mask)),
				    _mm256_castsi256_ps(_mm256_and_si256(y, odd_mask)), od[j]);
			}
		}
		const __m256 s01 =
		    _mm256_add_ps(_mm256_add_ps(ev[0], od[0]), _mm256_add_ps(ev[1], od[1]));
		const __m256 s23 =
		    _mm256_add_ps(_mm256_add_ps(ev[2], od[2]), _mm256_add_ps(ev[3], od[3]));
		_mm256_storeu_ps(out, _mm256_add_ps(s01, s23));
		return;
	}
	__m256 ev[8], od[8];
	for (int t = 0; t < NT; t++)
		ev[t] = od[t] = _mm256_setzero_ps();
	struct x8_stream pf = x8_stream_at(col, NT);
	for (size_t p = 0; p < k / 2; p++, col += 32) {
		x8_prefetch(&pf, col + 32);
		const __m256i w = _mm256_loadu_si256((const __m256i *)col);
		const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
		             wo = _mm256_castsi256_ps(_mm256_and_si256(w, odd_mask));
		for (int t = 0; t < NT; t++) {
			const __m256i y = _mm256_set1_epi32(
			    load_i32((const int8_t *)act + (size_t)t * as + 4 * p));
			ev[t] = _mm256_fmadd_ps(we, _mm256_castsi256_ps(_mm256_slli_epi32(y, 16)),
			                        ev[t]);
			od[t] = _mm256_fmadd_ps(
			    wo, _mm256_castsi256_ps(_mm256_and_si256(y, odd_mask)), od[t]);
		}
	}
	for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(out + 8 * t, _mm256_add_ps(ev[t], od[t]));
}

#define X8_DISPATCH(fmt)                                                                           \
	X8_ENTRY(x8_##fmt##_avx2, x8_##fmt##_body, false, )                                        \
	X8_ENTRY(x8_##fmt##_vnni, x8_##fmt##_body, true, VNNI_CODE)                                \
	static VNNI_PICK_X8(x8_##fmt, x8_##fmt##_avx2, x8_##fmt##_vnni)

X8_ENTRY(x8_mxfp4_avx2, x8_mxfp4_body, 0, )
X8_ENTRY(x8_mxfp4_vnni, x8_mxfp4_body, 1, VNNI_CODE)
X8_ENTRY(x8_mxfp4_vbmi, x8_mxfp4_body, 2, VNNI_CODE)
static void x8_mxfp4(const void *g, const void *act, size_t as, size_t nt, size_t k, float *out)
{
	if (!(moek_isa_forms() & MOEK_FORM_VNNI))
		x8_mxfp4_avx2(g, act, as, nt, k, out);
	else if ((moek_isa_forms() & MOEK_FORM_VBMI))
		x8_mxfp4_vbmi(g, act, as, nt, k, out);
	else
		x8_mxfp4_vnni(g, act, as, nt, k, out);
}
X8_DISPATCH(q8_0)
X8_DISPATCH(q4_K)
X8_ENTRY(x8_bf16, x8_bf16_body, false, )
X8_ENTRY(x8_bf16_exact, x8_bf16_body, true, )

/* ---- Q8_K-activation formats (K-quants) ---------------------------------------------------- */

/* The 12 packed bytes of Q4_K/Q5_K as 8 scale bytes (sc) and 8 min bytes (m), 6 bits each. */
static inline void k4_unpack(const uint8_t *q, uint8_t sc[8], uint8_t m[8])
{
	uint32_t u[3], s[2], n[2];
	memcpy(u, q, 12);
	s[0] = u[0] & 0x3f3f3f3fu;                                        /* sc 0-3: q[j] & 63 */
	n[0] = u[1] & 0x3f3f3f3fu;                                        /* m 0-3: q[j+4] & 63 */
	s[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4); /* sc 4-7 */
	n[1] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4); /* m 4-7 */
	memcpy(sc, s, 8);
	memcpy(m, n, 8);
}

/* m_j · (activation sum of 32-element sub-block j) from Q8_K's 16-element bsums, summed in
 * pairs of sub-blocks: 4 int32 lanes whose total is Σ_j. mins: the 8 m_j as int16. */
static inline __m128i k4_min_lanes(__m128i mins, const int16_t *bsums)
{
	const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums),
	                                     _mm_loadu_si128((const __m128i *)(bsums + 8)));
	return _mm_madd_epi16(pairs, mins);
}

ALWAYS_INLINE void q45k_body(const void *w, const float *sr, const void *act, size_t as,
                             const int NT, size_t k, float *out, const int five_bit, bool vnni)
{
	(void)sr;
	const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
	const size_t bb = five_bit ? sizeof(struct block_q5_K) : sizeof(struct block_q4_K);
	const bool far = wide_activation(k / QK_K * sizeof(struct block_q8_K));
	__m256 acc[8];
	__m128 acc_min[8]; /* Σ dmin·d_y·(m_j · sub-block sums), 4 partial lanes */
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps(), acc_min[t] = _mm_setzero_ps();
	/* word 2c (low nibbles of chunk c) and 2c+1 (high nibbles) of the 8 scales, broadcast */
	const __m256i pick_lo[4] = {_mm256_set1_epi16(0x0100), _mm256_set1_epi16(0x0504),
	                            _mm256_set1_epi16(0x0908), _mm256_set1_epi16(0x0d0c)};
	const __m256i pick_hi[4] = {_mm256_set1_epi16(0x0302), _mm256_set1_epi16(0x0706),
	                            _mm256_set1_epi16(0x0b0a), _mm256_set1_epi16(0x0f0e)};
	for (size_t i = 0; i < k / QK_K; i++) {
		const uint8_t *blk = (const uint8_t *)w + i * bb;
		const struct block_q4_K *x4 = (const struct block_q4_K *)blk;
		const struct block_q5_K *x5 = (const struct block_q5_K *)blk;
		const uint8_t *qs = five_bit ? x5->qs : x4->qs;
		prefetch_ahead(blk, far), prefetch_ahead(blk + 64, far),
		    prefetch_ahead(blk + 128, far);
		uint8_t sc[8], m[8];
		k4_unpack(five_bit ? x5->scales : x4->scales, sc, m);
		const __m256i sc16 = _mm256_broadcastsi128_si256(
		    _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
		const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m));
		const __m256i qh =
		    five_bit ? _mm256_loadu_si256((const __m256i *)x5->qh) : _mm256_setzero_si256();
		__m256i sumi[8], sumi_hi[8]; /* VNNI: two chains (low / high nibbles) */
		for (int t = 0; t < NT; t++)
			sumi[t] = sumi_hi[t] = _mm256_setzero_si256();
		for (int c = 0; c < 4; c++) {
			const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
			__m256i lo = _mm256_and_si256(q, low4);
			__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
			if (five_bit) { /* bit 2c / 2c+1 of qh[l]: 5th bit of sub-block 2c / 2c+1 */
				const __m256i hl = _mm256_and_si256(
				    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one);
				const __m256i hh = _mm256_and_si256(
				    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one);
				lo = _mm256_or_si256(lo, _mm256_slli_epi16(hl, 4));
				hi = _mm256_or_si256(hi, _mm256_slli_epi16(hh, 4));
			}
			const __m256i slo = _mm256_shuffle_epi8(sc16, pick_lo[c]);
			const __m256i shi = _mm256_shuffle_epi8(sc16, pick_hi[c]);
			for (int t = 0; t < NT; t++) {
				const int8_t *yq = q8k_token(act, as, t, i)->qs + 64 * c;
				const __m256i ylo = _mm256_loadu_si256((const __m256i *)yq);
				const __m256i yhi = _mm256_loadu_si256((const __m256i *)(yq + 32));
				if (vnni) { /* same int32 sums (exact either way) */
					sumi[t] =
					    dpwssd(sumi[t], _mm256_maddubs_epi16(lo, ylo), slo);
					sumi_hi[t] =
					    dpwssd(sumi_hi[t], _mm256_maddubs_epi16(hi, yhi), shi);
					continue;
				}
				const __m256i plo =
				    _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), slo);
				const __m256i phi =
				    _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), shi);
				sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(plo, phi));
			}
		}
		const float d = f16(x4->d), dmin = f16(x4->dmin); /* same offsets in Q5_K */
		if (vnni)
			for (int t = 0; t < NT; t++)
				sumi[t] = _mm256_add_epi32(sumi[t], sumi_hi[t]);
		for (int t = 0; t < NT; t++) {
			const struct block_q8_K *y = q8k_token(act, as, t, i);
			acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d),
			                         _mm256_cvtepi32_ps(sumi[t]), acc[t]);
			acc_min[t] =
			    _mm_fmadd_ps(_mm_set1_ps(dmin * y->d),
			                 _mm_cvtepi32_ps(k4_min_lanes(mins, y->bsums)), acc_min[t]);
		}
	}
	for (int t = 0; t < NT; t++) {
		__m128 mn = _mm_add_ps(acc_min[t], _mm_movehl_ps(acc_min[t], acc_min[t]));
		mn = _mm_add_ss(mn, _mm_movehdup_ps(mn));
		out[t] = hsum(acc[t]) - _mm_cvtss_f32(mn);
	}
}

DOT_ENTRY(dot_q4_K_avx2, q45k_body, 0, false)
DOT_ENTRY(dot_q5_K_avx2, q45k_body, 1, false)
VNNI_DOT_ENTRY(dot_q4_K_vnni, q45k_body, 0, true)
VNNI_DOT_ENTRY(dot_q5_K_vnni, q45k_body, 1, true)
ROWS_ENTRY(rows_q4_K_avx2, q45k_body, 0, false)
ROWS_ENTRY(rows_q5_K_avx2, q45k_body, 1, false)
VNNI_ROWS_ENTRY(rows_q4_K_vnni, q45k_body, 0, true)
VNNI_ROWS_ENTRY(rows_q5_K_vnni, q45k_body, 1, true)

VNNI_DISPATCH_ROWS(q4_K)

VNNI_DISPATCH_ROWS(q5_K)

VNNI_DISPATCH_DOT(q4_K)

VNNI_DISPATCH_DOT(q5_K)

/* Σ q·y over 32 elements (q 6-bit unsigned, y signed), scaled per 16 elements by the int16
 * scale vector s (first 16 elements: low half, last 16: high half), as 8 int32 lanes. */
static inline __m256i q6_scaled(__m256i q, __m256i y, __m256i s)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), s);
}

static inline __m256i scale_pair(int8_t s0, int8_t s1)
{
	return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(s0)),
	                               _mm_set1_epi16(s1), 1);
}

ALWAYS_INLINE void q6k_body(const void *w, const float *sr, const void *act, size_t as,
                            const int NT, size_t k, float *out, bool vnni)
{
	(void)sr;
	const struct block_q6_K *x = w;
	const __m256i low4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
	const bool far = wide_activation(k / QK_K * sizeof(struct block_q8_K));
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	for (size_t i = 0; i < k / QK_K; i++) {
		/* VNNI: a second chain per token at one or two tokens (vpdpwssd's latency) */
		const bool two = vnni && NT <= 2;
		__m256i sumi[8], sumi2[8];
		for (int l = 0; l < 4; l++)
			prefetch_ahead((const uint8_t *)(x + i) + 64 * l, far);
		/* the -32 offset: 32 · Σ_g sc_g · bsum_g, the 16 scale groups = the 16 bsums */
		const __m256i sc16 =
		    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
		for (int t = 0; t < NT; t++) {
			const __m256i bs =
			    _mm256_loadu_si256((const __m256i *)q8k_token(act, as, t, i)->bsums);
			sumi[t] =
			    _mm256_sub_epi32(_mm256_setzero_si256(),
			                     _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
			sumi2[t] = _mm256_setzero_si256();
		}
		for (int h = 0; h < 2; h++) {
			const uint8_t *ql = x[i].ql + 64 * h;
			const int8_t *sc = x[i].scales + 8 * h;
			const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
			const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
			const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
			const __m256i q1 =
			    _mm256_or_si256(_mm256_and_si256(l0, low4),
			                    _mm256_slli_epi16(_mm256_and_si256(qh, three), 4));
			const __m256i q2 = _mm256_or_si256(
			    _mm256_and_si256(l1, low4),
			    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), three),
			                      4));
			const __m256i q3 = _mm256_or_si256(
			    _mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
			    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), three),
			                      4));
			const __m256i q4 = _mm256_or_si256(
			    _mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
			    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), three),
			                      4));
			const __m256i s1 = scale_pair(sc[0], sc[1]), s2 = scale_pair(sc[2], sc[3]);
			const __m256i s3 = scale_pair(sc[4], sc[5]), s4 = scale_pair(sc[6], sc[7]);
			for (int t = 0; t < NT; t++) {
				const int8_t *yq = q8k_token(act, as, t, i)->qs + 128 * h;
				const __m256i y1 = _mm256_loadu_si256((const __m256i *)yq);
				const __m256i y2 = _mm256_loadu_si256((const __m256i *)(yq + 32));
				const __m256i y3 = _mm256_loadu_si256((const __m256i *)(yq + 64));
				const __m256i y4 = _mm256_loadu_si256((const __m256i *)(yq + 96));
				if (vnni) { /* same int32 sums (exact either way) */
					__m256i *c2 = two ? &sumi2[t] : &sumi[t];
					sumi[t] = dpwssd(sumi[t], _mm256_maddubs_epi16(q1, y1), s1);
					*c2 = dpwssd(*c2, _mm256_maddubs_epi16(q2, y2), s2);
					sumi[t] = dpwssd(sumi[t], _mm256_maddubs_epi16(q3, y3), s3);
					*c2 = dpwssd(*c2, _mm256_maddubs_epi16(q4, y4), s4);
					continue;
				}
				__m256i p = q6_scaled(q1, y1, s1);
				p = _mm256_add_epi32(p, q6_scaled(q2, y2, s2));
				p = _mm256_add_epi32(p, q6_scaled(q3, y3, s3));
				p = _mm256_add_epi32(p, q6_scaled(q4, y4, s4));
				sumi[t] = _mm256_add_epi32(sumi[t], p);
			}
		}
		const float d = f16(x[i].d);
		if (two)
			for (int t = 0; t < NT; t++)
				sumi[t] = _mm256_add_epi32(sumi[t], sumi2[t]);
		for (int t = 0; t < NT; t++)
			acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * q8k_token(act, as, t, i)->d),
			                         _mm256_cvtepi32_ps(sumi[t]), acc[t]);
	}
	for (int t = 0; t < NT; t++)
		out[t] = hsum(acc[t]);
}

DOT_ENTRY(dot_q6_K_avx2, q6k_body, false)
VNNI_DOT_ENTRY(dot_q6_K_vnni, q6k_body, true)
ROWS_ENTRY(rows_q6_K_avx2, q6k_body, false)
VNNI_ROWS_ENTRY(rows_q6_K_vnni, q6k_body, true)

VNNI_DISPATCH_DOT(q6_K)

VNNI_DISPATCH_ROWS(q6_K)

/* ---- Float formats against f32 activations ------------------------------------------------ */

/* F32 weights against f32 activations. */
ALWAYS_INLINE const float *f32_token(const void *act, size_t as, int t)
{
	return (const float *)((const uint8_t *)act + (size_t)t * as);
}

ALWAYS_INLINE void f32_body(const void *w, const float *sr, const void *act, size_t as,
                            const int NT, size_t k, float *out, int unused)
{
	(void)sr, (void)unused;
	const float *a = w;
	const bool far = wide_activation(k * sizeof(float));
	size_t i = 0;
	if (NT == 1) { /* four accumulators over 32 elements to cover the FMA latency */
		const float *x = act;
		__m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
		for (; i + 32 <= k; i += 32) {
			prefetch_ahead(a + i, far), prefetch_ahead(a + i + 16, far);
			s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s0);
			s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(x + i + 8),
			                     s1);
			s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16),
			                     _mm256_loadu_ps(x + i + 16), s2);
			s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24),
			                     _mm256_loadu_ps(x + i + 24), s3);
		}
		for (; i + 8 <= k; i += 8)
			s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s0);
		float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
		for (; i < k; i++)
			s += a[i] * x[i];
		out[0] = s;
		return;
	}
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	for (; i + 8 <= k; i += 8) {
		const __m256 v = _mm256_loadu_ps(a + i);
		for (int t = 0; t < NT; t++)
			acc[t] =
			    _mm256_fmadd_ps(v, _mm256_loadu_ps(f32_token(act, as, t) + i), acc[t]);
	}
	for (int t = 0; t < NT; t++) {
		float s = hsum(acc[t]);
		for (size_t j = i; j < k; j++)
			s += a[j] * f32_token(act, as, t)[j];
		out[t] = s;
	}
}

DOT_ENTRY(dot_f32w, f32_body, 0)

/* 16 bf16 values as f32: even elements (low halves of the 32-bit lanes) and odd elements.
 * Pairing even with even and odd with odd needs no permutation of either operand. */
static inline void bf16x16(const uint16_t *p, __m256 *even, __m256 *odd)
{
	const __m256i v = _mm256_loadu_si256((const __m256i *)p);
	*even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
	*odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* 16 f16 values as f32, split the same way (even / odd elements). */
static inline void f16x16(const uint16_t *p, __m256 *even, __m256 *odd)
{
	const __m256i v = _mm256_loadu_si256((const __m256i *)p);
	const __m256i ev = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
	const __m256i od = _mm256_srli_epi32(v, 16);
	/* pack each lane's f16 into the low 16 bits of 8 consecutive halves, then widen */
	const __m256i shuf =
	    _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5,
	                     8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
	const __m256i pe = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(ev, shuf), 0x08);
	const __m256i po = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(od, shuf), 0x08);
	*even = _mm256_cvtph_ps(_mm256_castsi256_si128(pe));
	*odd = _mm256_cvtph_ps(_mm256_castsi256_si128(po));
}

ALWAYS_INLINE const uint16_t *bf16_token(const void *act, size_t as, int t)
{
	return (const uint16_t *)((const uint8_t *)act + (size_t)t * as);
}

/* BF16 / F16 weights against bf16 activations: 16 columns per step as even/odd f32 halves,
 * one accumulator pair per token (two pairs over 32 columns for a single token). */
/* exact: as q32_body's (each token in the four chains of NT = 1). */
ALWAYS_INLINE void half_body(const void *w, const float *sr, const void *act, size_t as,
                             const int NT, size_t k, float *out, const int is_f16, const bool exact)
{
	(void)sr;
	const uint16_t *a = w;
	const bool far = wide_activation(k * sizeof(uint16_t));
	__m256 e0[8], o0[8], e1[8], o1[8];
	for (int t = 0; t < NT; t++)
		e0[t] = o0[t] = e1[t] = o1[t] = _mm256_setzero_ps();
	const bool four = NT == 1 || exact;
	size_t i = 0;
	if (four) {
		for (; i + 32 <= k; i += 32) {
			__m256 we, wo, xe, xo;
			prefetch_ahead(a + i, far);
			if (is_f16)
				f16x16(a + i, &we, &wo);
			else
				bf16x16(a + i, &we, &wo);
			for (int t = 0; t < NT; t++) {
				bf16x16(bf16_token(act, as, t) + i, &xe, &xo);
				e0[t] = _mm256_fmadd_ps(we, xe, e0[t]);
				o0[t] = _mm256_fmadd_ps(wo, xo, o0[t]);
			}
			if (is_f16)
				f16x16(a + i + 16, &we, &wo);
			else
				bf16x16(a + i + 16, &we, &wo);
			for (int t = 0; t < NT; t++) {
				bf16x16(bf16_token(act, as, t) + i + 16, &xe, &xo);
				e1[t] = _mm256_fmadd_ps(we, xe, e1[t]);
				o1[t] = _mm256_fmadd_ps(wo, xo, o1[t]);
			}
		}
	}
	for (; i + 16 <= k; i += 16) {
		__m256 we, wo;
		if (is_f16)
			f16x16(a + i, &we, &wo);
		else
			bf16x16(a + i, &we, &wo);
		for (int t = 0; t < NT; t++) {
			__m256 xe, xo;
			bf16x16(bf16_token(act, as, t) + i, &xe, &xo);
			e0[t] = _mm256_fmadd_ps(we, xe, e0[t]);
			o0[t] = _mm256_fmadd_ps(wo, xo, o0[t]);
		}
	}
	for (int t = 0; t < NT; t++) {
		__m256 s = _mm256_add_ps(e0[t], o0[t]);
		if (four)
			s = _mm256_add_ps(s, _mm256_add_ps(e1[t], o1[t]));
		float r = hsum(s);
		for (size_t j = i; j < k; j++)
			r += (is_f16 ? f16(a[j]) : moek_bf16_to_f32(a[j])) *
			     moek_bf16_to_f32(bf16_token(act, as, t)[j]);
		out[t] = r;
	}
}

DOT_ENTRY(dot_f16, half_body, 1, false)
DOT_ENTRY(dot_bf16, half_body, 0, false)
DOT_ENTRY(dot_f16_exact, half_body, 1, true)
DOT_ENTRY(dot_bf16_exact, half_body, 0, true)
ROWS_ENTRY(rows_f16, half_body, 1, false)
ROWS_ENTRY(rows_bf16, half_body, 0, false)

static float dot_f32(const float *a, const float *b, size_t k)
{
	float r;
	dot_f32w(a, NULL, b, 0, 1, k, &r);
	return r;
}

static inline __m256 load_bf16(const uint16_t *p)
{
	const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
static inline __m256 load_f16(const uint16_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
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

/* FP8: weights decoded 16 at a time and multiplied by their block's scale once, then FMA'd
 * into each token's two accumulators; columns past the last multiple of 16 in scalar. */
ALWAYS_INLINE void fp8_body(const void *w, const float *sr, const void *act, size_t as,
                            const int NT, size_t k, float *out, int unused)
{
	(void)unused;
	const uint8_t *q = w;
	const bool far = wide_activation(k * sizeof(float));
	__m256 a0[8], a1[8];
	float tail[8];
	for (int t = 0; t < NT; t++)
		a0[t] = a1[t] = _mm256_setzero_ps(), tail[t] = 0.0f;
	for (size_t b0 = 0; b0 < k; b0 += MOEK_FP8_BLOCK) {
		const size_t b1 = b0 + MOEK_FP8_BLOCK < k ? b0 + MOEK_FP8_BLOCK : k;
		const float s = sr[b0 / MOEK_FP8_BLOCK];
		const __m256 sv = _mm256_set1_ps(s * 256.0f);
		prefetch_ahead(q + b0, far), prefetch_ahead(q + b0 + 64, far);
		size_t i = b0;
		for (; i + 16 <= b1; i += 16) {
			__m256 lo, hi;
			fp8x16_scaled(q + i, &lo, &hi);
			lo = _mm256_mul_ps(lo, sv);
			hi = _mm256_mul_ps(hi, sv);
			for (int t = 0; t < NT; t++) {
				const float *x = f32_token(act, as, t);
				a0[t] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + i), a0[t]);
				a1[t] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + i + 8), a1[t]);
			}
		}
		for (; i < b1; i++)
			for (int t = 0; t < NT; t++)
				tail[t] +=
				    moek_fp8_e4m3_to_f32(q[i]) * s * f32_token(act, as, t)[i];
	}
	for (int t = 0; t < NT; t++)
		out[t] = hsum(_mm256_add_ps(a0[t], a1[t])) + tail[t];
}

DOT_ENTRY(dot_fp8, fp8_body, 0)

/* ---- Dequantization for prefill tiles -------------------------------------------------------- */

/* Tile dequantization widens bytes to f32 8 at a time straight from memory (vpmovsxbd /
 * vpmovzxbd with a memory operand): bytes computed in registers (nibbles, table lookups) go
 * through a small stack buffer first, which costs one store instead of the lane extracts and
 * byte shifts of widening from a register. */

/* 8 bytes at p as int32 lanes, sign- or zero-extended. */
static inline __m256i widen_i8x8(const void *p)
{
	return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline __m256i widen_u8x8(const void *p)
{
	return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* 32 signed bytes at q as floats: elements 0-15 times d0, 16-31 times d1 (one rounding each). */
static inline void store_i8x32_2(const int8_t *q, __m256 d0, __m256 d1, float *dst)
{
	for (int p = 0; p < 4; p++)
		_mm256_storeu_ps(
		    dst + 8 * p,
		    _mm256_mul_ps(p < 2 ? d0 : d1, _mm256_cvtepi32_ps(widen_i8x8(q + 8 * p))));
}

/* The same for 32 bytes computed in a register, through the stack. */
static inline void store_i8x32_reg(__m256i q, __m256 d0, __m256 d1, float *dst)
{
	int8_t buf[32];
	_mm256_storeu_si256((__m256i *)buf, q);
	store_i8x32_2(buf, d0, d1, dst);
}

/* 32 unsigned 4/5-bit levels q (bytes at q) as d * q - m (two roundings, as the reference). */
static inline void store_k4x32(const uint8_t *q, __m256 dv, __m256 mv, float *dst)
{
	for (int p = 0; p < 4; p++)
		_mm256_storeu_ps(
		    dst + 8 * p,
		    _mm256_sub_ps(_mm256_mul_ps(dv, _mm256_cvtepi32_ps(widen_u8x8(q + 8 * p))),
		                  mv));
}

/* Dequantization for prefill tiles, one function per format (moek_avx2_ops.dequantize;
 * F32 has none: the reference copies); bit-identical to the reference for every format
 * (same products, same single roundings). A vector loop that leaves a tail hands it to the
 * reference. */
static void ref_tail(enum moek_fmt f, const void *w, const float *scale_row, float *dst, size_t i,
                     size_t k)
{
	if (i < k)
		moek_fmt_dequantize_ref(f, (const uint8_t *)w + moek_fmt_row_bytes(f, i),
		                        scale_row ? scale_row + i / MOEK_FP8_BLOCK : NULL, dst + i,
		                        k - i);
}

static void dequantize_bf16(const void *w, const float *scale_row, float *dst, size_t k)
{
	size_t i = 0;
	for (; i + 8 <= k; i += 8)
		_mm256_storeu_ps(dst + i, load_bf16((const uint16_t *)w + i));
	ref_tail(MOEK_FMT_BF16, w, scale_row, dst, i, k);
}

static void dequantize_f16(const void *w, const float *scale_row, float *dst, size_t k)
{
	size_t i = 0;
	for (; i + 8 <= k; i += 8)
		_mm256_storeu_ps(dst + i, load_f16((const uint16_t *)w + i));
	ref_tail(MOEK_FMT_F16, w, scale_row, dst, i, k);
}

static void dequantize_fp8(const void *w, const float *scale_row, float *dst, size_t k)
{
	size_t i = 0;
	for (; i + 16 <= k; i += 16) {
		__m256 lo, hi;
		const __m256 s = _mm256_set1_ps(scale_row[i / MOEK_FP8_BLOCK] * 256.0f);
		fp8x16_scaled((const uint8_t *)w + i, &lo, &hi);
		_mm256_storeu_ps(dst + i, _mm256_mul_ps(lo, s));
		_mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(hi, s));
	}
	ref_tail(MOEK_FMT_FP8_E4M3_B128, w, scale_row, dst, i, k);
}

static void dequantize_q8_0(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	size_t i = 0;
	for (const struct block_q8_0 *b = w; i < k; i += QK8_0, b++) {
		const __m256 d = _mm256_set1_ps(f16(b->d));
		store_i8x32_2(b->qs, d, d, dst + i);
	}
}

static void dequantize_q4_0(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	size_t i = 0;
	for (const struct block_q4_0 *b = w; i < k; i += QK4_0, b++) {
		const __m256 d = _mm256_set1_ps(f16(b->d));
		store_i8x32_reg(_mm256_sub_epi8(nibbles_32(b->qs), _mm256_set1_epi8(8)), d, d,
		                dst + i);
	}
}

static void dequantize_mxfp4(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	size_t i = 0;
	const __m256i values =
	    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)moek_mxfp4_kvalues));
	for (const struct block_mxfp4 *b = w; i < k; i += QK_MXFP4, b++) {
		const __m256 d = _mm256_broadcast_ss(&e8m0_half_lut.f[b->e]);
		store_i8x32_lanes(_mm256_shuffle_epi8(values, nibbles_32(b->qs)), d, dst + i);
	}
}

static inline __attribute__((always_inline)) void dequantize_k45(const void *w, float *dst,
                                                                 size_t k, bool five)
{
	const __m256i low4 = _mm256_set1_epi8(0x0F);
	size_t i = 0;
	const size_t bb = five ? sizeof(struct block_q5_K) : sizeof(struct block_q4_K);
	for (; i < k; i += QK_K) {
		const uint8_t *blk = (const uint8_t *)w + i / QK_K * bb;
		const struct block_q4_K *x4 = (const struct block_q4_K *)blk;
		const struct block_q5_K *x5 = (const struct block_q5_K *)blk;
		uint8_t sc[8], m[8];
		k4_unpack(five ? x5->scales : x4->scales, sc, m);
		/* d · sc_j and dmin · m_j for the 8 sub-blocks in one multiply each (the
		 * reference's single roundings), read back by broadcast loads */
		float dsc[8], dm[8];
		_mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(f16(x4->d)),
		                                    _mm256_cvtepi32_ps(widen_u8x8(sc))));
		_mm256_storeu_ps(dm, _mm256_mul_ps(_mm256_set1_ps(f16(x4->dmin)),
		                                   _mm256_cvtepi32_ps(widen_u8x8(m))));
		const uint8_t *qs = five ? x5->qs : x4->qs;
		const __m256i qh =
		    five ? _mm256_loadu_si256((const __m256i *)x5->qh) : _mm256_setzero_si256();
		for (int c = 0; c < 4; c++) {
			const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
			__m256i lo = _mm256_and_si256(q, low4);
			__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
			if (five) {
				const __m256i one = _mm256_set1_epi8(1);
				lo = _mm256_or_si256(
				    lo,
				    _mm256_slli_epi16(
				        _mm256_and_si256(
				            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one),
				        4));
				hi = _mm256_or_si256(
				    hi, _mm256_slli_epi16(
				            _mm256_and_si256(
				                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)),
				                one),
				            4));
			}
			uint8_t levels[64];
			_mm256_storeu_si256((__m256i *)levels, lo);
			_mm256_storeu_si256((__m256i *)(levels + 32), hi);
			store_k4x32(levels, _mm256_broadcast_ss(&dsc[2 * c]),
			            _mm256_broadcast_ss(&dm[2 * c]), dst + i + 64 * c);
			store_k4x32(levels + 32, _mm256_broadcast_ss(&dsc[2 * c + 1]),
			            _mm256_broadcast_ss(&dm[2 * c + 1]), dst + i + 64 * c + 32);
		}
	}
}

static void dequantize_q4_K(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	dequantize_k45(w, dst, k, false);
}

static void dequantize_q5_K(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	dequantize_k45(w, dst, k, true);
}

static void dequantize_q2_K(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	moek_avx2_dequantize_q2_K(w, dst, k);
}

static void dequantize_q3_K(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	moek_avx2_dequantize_q3_K(w, dst, k);
}

static void dequantize_q6_K(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	const __m256i low4 = _mm256_set1_epi8(0x0F);
	size_t i = 0;
	for (const struct block_q6_K *x = w; i < k; i += QK_K, x++) {
		const float d = f16(x->d);
		const __m256i three = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
		for (int h = 0; h < 2; h++) {
			const uint8_t *ql = x->ql + 64 * h;
			const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
			const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
			const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
			const __m256i q[4] = {
			    _mm256_or_si256(_mm256_and_si256(l0, low4),
			                    _mm256_slli_epi16(_mm256_and_si256(qh, three), 4)),
			    _mm256_or_si256(
			        _mm256_and_si256(l1, low4),
			        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), three),
			                          4)),
			    _mm256_or_si256(
			        _mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
			        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), three),
			                          4)),
			    _mm256_or_si256(
			        _mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
			        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), three),
			                          4)),
			};
			for (int j = 0; j < 4; j++) { /* 32 elements, scales sc[2j], sc[2j+1] */
				const int8_t *sc = x->scales + 8 * h + 2 * j;
				store_i8x32_reg(
				    _mm256_sub_epi8(q[j], m32), _mm256_set1_ps(d * (float)sc[0]),
				    _mm256_set1_ps(d * (float)sc[1]), dst + i + 128 * h + 32 * j);
			}
		}
	}
}

static void dequantize_iq4_nl(const void *w, const float *scale_row, float *dst, size_t k)
{
	ref_tail(MOEK_FMT_IQ4_NL, w, scale_row, dst,
	         moek_avx2_dequantize_iq4(MOEK_IQ4_NL, w, dst, k), k);
}

/* The lattice i-quants' prefill rows: the reference decoder (gathers of grid entries; not
 * measured to be worth a vector form yet). */
static void dequantize_iq2_xxs(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	moek_dequantize_iq2_xxs(w, dst, k);
}

static void dequantize_iq2_xs(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	moek_dequantize_iq2_xs(w, dst, k);
}

static void dequantize_iq3_xxs(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	moek_dequantize_iq3_xxs(w, dst, k);
}

static void dequantize_iq3_s(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	moek_dequantize_iq3_s(w, dst, k);
}

static void dequantize_iq1_s(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	moek_dequantize_iq1_s(w, dst, k);
}

static void dequantize_iq1_m(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	moek_dequantize_iq1_m(w, dst, k);
}

static void dequantize_iq2_s(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	moek_dequantize_iq2_s(w, dst, k);
}

static void dequantize_iq4_xs(const void *w, const float *scale_row, float *dst, size_t k)
{
	ref_tail(MOEK_FMT_IQ4_XS, w, scale_row, dst,
	         moek_avx2_dequantize_iq4(MOEK_IQ4_XS, w, dst, k), k);
}

static void dequantize_int4(const void *w, const float *scale_row, float *dst, size_t k)
{
	(void)scale_row;
	moek_avx2_dequantize_int4(w, dst, k);
}

/* ---- Prefill micro-kernel ------------------------------------------------------------------
 * Outer products: for each k, 16 tokens' activations (two vectors of the panel) times each
 * row's broadcast weight. 6 rows x 16 tokens = 12 accumulators; 8 loads per 12 FMAs. Every
 * (row, token) lane is its own FMA chain over k, so the row grouping never changes a result. */

static void kernel_6x16(const float *w, size_t ldw, const float *xp, size_t k, float *c, size_t ldc)
{
	__m256 c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8);
	__m256 c10 = _mm256_loadu_ps(c + ldc), c11 = _mm256_loadu_ps(c + ldc + 8);
	__m256 c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
	__m256 c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
	__m256 c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
	__m256 c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
	for (size_t i = 0; i < k; i++) {
		const __m256 x0 = _mm256_loadu_ps(xp + 16 * i),
		             x1 = _mm256_loadu_ps(xp + 16 * i + 8);
		__m256 b = _mm256_broadcast_ss(w + i);
		c00 = _mm256_fmadd_ps(b, x0, c00), c01 = _mm256_fmadd_ps(b, x1, c01);
		b = _mm256_broadcast_ss(w + ldw + i);
		c10 = _mm256_fmadd_ps(b, x0, c10), c11 = _mm256_fmadd_ps(b, x1, c11);
		b = _mm256_broadcast_ss(w + 2 * ldw + i);
		c20 = _mm256_fmadd_ps(b, x0, c20), c21 = _mm256_fmadd_ps(b, x1, c21);
		b = _mm256_broadcast_ss(w + 3 * ldw + i);
		c30 = _mm256_fmadd_ps(b, x0, c30), c31 = _mm256_fmadd_ps(b, x1, c31);
		b = _mm256_broadcast_ss(w + 4 * ldw + i);
		c40 = _mm256_fmadd_ps(b, x0, c40), c41 = _mm256_fmadd_ps(b, x1, c41);
		b = _mm256_broadcast_ss(w + 5 * ldw + i);
		c50 = _mm256_fmadd_ps(b, x0, c50), c51 = _mm256_fmadd_ps(b, x1, c51);
	}
	_mm256_storeu_ps(c, c00), _mm256_storeu_ps(c + 8, c01);
	_mm256_storeu_ps(c + ldc, c10), _mm256_storeu_ps(c + ldc + 8, c11);
	_mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
	_mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
	_mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
	_mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

static void kernel_1x16(const float *w, const float *xp, size_t k, float *c)
{
	__m256 c0 = _mm256_loadu_ps(c), c1 = _mm256_loadu_ps(c + 8);
	for (size_t i = 0; i < k; i++) {
		const __m256 b = _mm256_broadcast_ss(w + i);
		c0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(xp + 16 * i), c0);
		c1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(xp + 16 * i + 8), c1);
	}
	_mm256_storeu_ps(c, c0), _mm256_storeu_ps(c + 8, c1);
}

static void tile(const float *w, size_t ldw, size_t nr, const float *xp, size_t k, float *c,
                 size_t ldc)
{
	size_t r = 0;
	for (; r + 6 <= nr; r += 6)
		kernel_6x16(w + r * ldw, ldw, xp, k, c + r * ldc, ldc);
	for (; r < nr; r++)
		kernel_1x16(w + r * ldw, xp, k, c + r * ldc);
}

/* ---- moek_interleave's word transpose ------------------------------------------------------- */

/* 8 x 8 words: r[i] holds words 0-7 of row i; afterwards r[w] holds word w of every row. */
static inline void transpose_8x8(__m256i r[8])
{
	__m256i t[8], u[8];
	for (int i = 0; i < 8; i += 2) {
		t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);     /* a0 b0 a1 b1 | a4 b4 a5 b5 */
		t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
	}
	for (int i = 0; i < 8; i += 4) {
		u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);     /* word 0 | 4 of 4 rows */
		u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]); /* word 1 | 5 */
		u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
		u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
	}
	for (int w = 0; w < 4; w++) {
		r[w] = _mm256_permute2x128_si256(u[w], u[w + 4], 0x20);
		r[w + 4] = _mm256_permute2x128_si256(u[w], u[w + 4], 0x31);
	}
}

/* ---- The decode chunks' SwiGLU --------------------------------------------------------- */

/* e^x, 8 lanes: x = n ln2 + r (|r| <= ln2 / 2, ln2 split in two for the reduction), e^r by
 * the degree-6 polynomial of Cephes' expf, 2^n into the exponent. x is clamped to
 * [-87, 88.37] first — NaN passes (the min/max keep their second operand) — so 2^n stays a normal
 * float: below -87 the result stays at e^-87 ~ 1.6e-38, which 1 + e^x cannot tell from 0;
 * above expf's overflow (88.72) it is +inf, as expf's. */
ALWAYS_INLINE __m256 exp8_ps(__m256 x)
{
	const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(88.72283f), _CMP_GT_OQ);
	x = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.37f), x));
	const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
	                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
	__m256 p = _mm256_set1_ps(1.9875691500e-4f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
	p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
	const __m256i e =
	    _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_blendv_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(INFINITY),
	                        over);
}

/* 8 elements of the activation, as ffn.c's activate(): g / (1 + e^-g) · u, or (gpt-oss) g
 * clamped above and u both ways at limit (fminf/fmaxf: a NaN becomes the limit, as min/max
 * with the limit second do), g / (1 + e^(-alpha g)) · (u + 1). */
ALWAYS_INLINE __m256 swiglu8(__m256 g, __m256 u, bool oai, float limit, float alpha)
{
	if (oai) {
		const __m256 lim = _mm256_set1_ps(limit);
		g = _mm256_min_ps(g, lim);
		u = _mm256_max_ps(_mm256_min_ps(u, lim), _mm256_set1_ps(-limit));
		const __m256 e = exp8_ps(_mm256_mul_ps(_mm256_set1_ps(-alpha), g));
		return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
		                     _mm256_add_ps(u, _mm256_set1_ps(1.0f)));
	}
	const __m256 e = exp8_ps(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
	return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

/* The tail goes through the same 8-lane code (zero-padded), so a row's bits do not depend on
 * where a call's range starts or ends. In a Qwen3 decode the scalar loop (libm expf) took
 * ~1.3% of the kernel time (perf, one thread, MXFP4x8). */
static void swiglu(float *h, const float *u, const float *bg, const float *bu, size_t n, bool oai,
                   float limit, float alpha)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 g = _mm256_loadu_ps(h + i), v = _mm256_loadu_ps(u + i);
		if (bg)
			g = _mm256_add_ps(g, _mm256_loadu_ps(bg + i));
		if (bu)
			v = _mm256_add_ps(v, _mm256_loadu_ps(bu + i));
		_mm256_storeu_ps(h + i, swiglu8(g, v, oai, limit, alpha));
	}
	if (i < n) {
		float g[8] = {0}, v[8] = {0};
		for (size_t j = 0; j < n - i; j++) { /* the main loop's adds, and no others */
			g[j] = bg ? h[i + j] + bg[i + j] : h[i + j];
			v[j] = bu ? u[i + j] + bu[i + j] : u[i + j];
		}
		_mm256_storeu_ps(
		    g, swiglu8(_mm256_loadu_ps(g), _mm256_loadu_ps(v), oai, limit, alpha));
		memcpy(h + i, g, (n - i) * sizeof(float));
	}
}

static void x8_transpose(const uint8_t *rows, size_t stride, size_t words, uint8_t *out)
{
	size_t w = 0;
	for (; w + 8 <= words; w += 8) {
		__m256i r[8];
		for (int i = 0; i < 8; i++)
			r[i] = _mm256_loadu_si256((const __m256i *)(rows + i * stride + 4 * w));
		transpose_8x8(r);
		for (int i = 0; i < 8; i++)
			_mm256_storeu_si256((__m256i *)(out + 32 * (w + i)), r[i]);
	}
	if (w + 4 <= words) { /* 4 words of each row, the upper half of every register unused */
		__m256i r[8];
		for (int i = 0; i < 8; i++)
			r[i] = _mm256_castsi128_si256(
			    _mm_loadu_si128((const __m128i *)(rows + i * stride + 4 * w)));
		transpose_8x8(r);
		for (int i = 0; i < 4; i++)
			_mm256_storeu_si256((__m256i *)(out + 32 * (w + i)), r[i]);
		w += 4;
	}
	for (; w < words; w++)
		for (size_t i = 0; i < 8; i++)
			memcpy(out + 32 * w + 4 * i, rows + i * stride + 4 * w, 4);
}

/* Decode: row and group dots, VNNI forms on where the CPU has them for the integer ones;
 * prefill: f32 tiles (ffn.c says from how many tokens). */
static const char *describe(uint32_t format, bool prefill)
{
	if (prefill)
		return "avx2 f32 fma tiles";
	const uint32_t act = moek_vec_dot_format(format);
	if (act == MOEK_Q8_0 || act == MOEK_Q8_K)
		return moek_isa_forms() & MOEK_FORM_VNNI &&
		               format != MOEK_NVFP4 /* none: sign trick */
		           ? "avx2 integer dots (vnni forms)"
		           : "avx2 integer dots";
	return act == MOEK_BF16 ? "avx2 fma dots on bf16 activations" : "avx2 fma dots";
}

const struct moek_isa_ops moek_avx2_ops = {
    .act_row_bytes = act_row_bytes,
    .quantize_act = quantize_act,
    .dequantize_act = dequantize_act,
    .name = "avx2",
    .dot =
        {
            [MOEK_FMT_F32] = dot_f32w,
            [MOEK_FMT_F16] = dot_f16,
            [MOEK_FMT_BF16] = dot_bf16,
            [MOEK_FMT_Q8_0] = dot_q8_0,
            [MOEK_FMT_Q4_0] = dot_q4_0,
            [MOEK_FMT_MXFP4] = dot_mxfp4,
            [MOEK_FMT_Q4_K] = dot_q4_K,
            [MOEK_FMT_Q5_K] = dot_q5_K,
            [MOEK_FMT_Q6_K] = dot_q6_K,
            [MOEK_FMT_IQ4_NL] = moek_avx2_dot_iq4_nl,
            [MOEK_FMT_IQ4_XS] = moek_avx2_dot_iq4_xs,
            [MOEK_FMT_IQ2_XXS] = moek_avx2_dot_iq2_xxs,
            [MOEK_FMT_IQ2_XS] = moek_avx2_dot_iq2_xs,
            [MOEK_FMT_IQ3_XXS] = moek_avx2_dot_iq3_xxs,
            [MOEK_FMT_IQ3_S] = moek_avx2_dot_iq3_s,
            [MOEK_FMT_IQ1_S] = moek_avx2_dot_iq1_s,
            [MOEK_FMT_IQ1_M] = moek_avx2_dot_iq1_m,
            [MOEK_FMT_IQ2_S] = moek_avx2_dot_iq2_s,
            [MOEK_FMT_Q2_K] = moek_avx2_dot_q2_K,
            [MOEK_FMT_Q3_K] = moek_avx2_dot_q3_K,
            [MOEK_FMT_INT4_G32] = moek_avx2_dot_int4,
            [MOEK_FMT_NVFP4] = moek_avx2_dot_nvfp4,
            [MOEK_FMT_FP8_E4M3_B128] = dot_fp8,
        },
    .dot_rows =
        {
            [MOEK_FMT_F16] = rows_f16,
            [MOEK_FMT_BF16] = rows_bf16,
            [MOEK_FMT_Q8_0] = rows_q8_0,
            [MOEK_FMT_Q4_0] = rows_q4_0,
            [MOEK_FMT_MXFP4] = rows_mxfp4,
            [MOEK_FMT_Q4_K] = rows_q4_K,
            [MOEK_FMT_Q5_K] = rows_q5_K,
            [MOEK_FMT_Q6_K] = rows_q6_K,
            [MOEK_FMT_IQ4_NL] = moek_avx2_rows_iq4_nl,
            [MOEK_FMT_IQ4_XS] = moek_avx2_rows_iq4_xs,
            [MOEK_FMT_IQ2_XXS] = moek_avx2_rows_iq2_xxs,
            [MOEK_FMT_IQ2_XS] = moek_avx2_rows_iq2_xs,
            [MOEK_FMT_IQ3_XXS] = moek_avx2_rows_iq3_xxs,
            [MOEK_FMT_IQ3_S] = moek_avx2_rows_iq3_s,
            [MOEK_FMT_IQ1_S] = moek_avx2_rows_iq1_s,
            [MOEK_FMT_IQ1_M] = moek_avx2_rows_iq1_m,
            [MOEK_FMT_IQ2_S] = moek_avx2_rows_iq2_s,
            [MOEK_FMT_Q2_K] = moek_avx2_rows_q2_K,
            [MOEK_FMT_Q3_K] = moek_avx2_rows_q3_K,
            [MOEK_FMT_INT4_G32] = moek_avx2_rows_int4,
            [MOEK_FMT_NVFP4] = moek_avx2_rows_nvfp4,
        },
    .dot_x8 =
        {
            [MOEK_FMT_Q8_0] = x8_q8_0,
            [MOEK_FMT_MXFP4] = x8_mxfp4,
            [MOEK_FMT_Q4_K] = x8_q4_K,
            [MOEK_FMT_BF16] = x8_bf16,
            [MOEK_FMT_INT4_G32] = moek_avx2_x8_int4,
            [MOEK_FMT_NVFP4] = moek_avx2_x8_nvfp4,
            [MOEK_FMT_Q2_K] = moek_avx2_x8_q2_K,
            [MOEK_FMT_Q3_K] = moek_avx2_x8_q3_K,
            [MOEK_FMT_IQ4_NL] = moek_avx2_x8_iq4_nl,
            [MOEK_FMT_IQ4_XS] = moek_avx2_x8_iq4_xs,
        },
    /* the dots whose per-token sums do not depend on how many tokens share the call (one
     * accumulator chain per token, the same at any nt); the others keep a faster one-token
     * form (x86_avx512.c keeps these: its own BF16 dots are not on the list) */
    .token_exact =
        {
            [MOEK_FMT_Q2_K] = true,
            [MOEK_FMT_Q3_K] = true,
            [MOEK_FMT_Q4_K] = true,
            [MOEK_FMT_Q5_K] = true,
            [MOEK_FMT_Q6_K] = true,
            [MOEK_FMT_IQ4_XS] = true,
            [MOEK_FMT_FP8_E4M3_B128] = true,
        },
    /* the other dots' token-exact forms: several tokens, each in the chains of nt = 1 */
    .dot_exact =
        {
            [MOEK_FMT_F16] = dot_f16_exact,
            [MOEK_FMT_BF16] = dot_bf16_exact,
            [MOEK_FMT_Q8_0] = dot_q8_0_exact,
            [MOEK_FMT_Q4_0] = dot_q4_0_exact,
            [MOEK_FMT_MXFP4] = dot_mxfp4_exact,
            [MOEK_FMT_INT4_G32] = moek_avx2_dot_int4_exact,
            [MOEK_FMT_IQ4_NL] = moek_avx2_dot_iq4_nl_exact,
        },
    .dot_x8_exact = {[MOEK_FMT_BF16] = x8_bf16_exact},
    .token_exact_x8 =
        {
            [MOEK_FMT_Q8_0] = true,
            [MOEK_FMT_MXFP4] = true,
            [MOEK_FMT_Q4_K] = true,
            [MOEK_FMT_INT4_G32] = true,
        },
    /* the private activation layouts of the row dots and the group dots (kernels_internal.h,
     * MOEK_ACT_Q8_0X2, MOEK_ACT_Q8_0S); the others take the row's vec_dot_format */
    .act =
        {
            [MOEK_FMT_Q4_0] = MOEK_ACT_Q8_0X2,
            [MOEK_FMT_MXFP4] = MOEK_ACT_Q8_0X2,
            [MOEK_FMT_IQ4_NL] = MOEK_ACT_Q8_0X2,
            [MOEK_FMT_INT4_G32] = MOEK_ACT_Q8_0X2,
            [MOEK_FMT_NVFP4] = MOEK_ACT_Q8_0X2,
        },
    .act_x8 =
        {
            [MOEK_FMT_Q8_0] = MOEK_ACT_Q8_0S,
            [MOEK_FMT_MXFP4] = MOEK_ACT_Q8_0S,
            [MOEK_FMT_INT4_G32] = MOEK_ACT_Q8_0S,
            [MOEK_FMT_NVFP4] = MOEK_ACT_Q8_0S,
            [MOEK_FMT_IQ4_NL] = MOEK_ACT_Q8_0S,
        },
    .dequantize =
        {
            [MOEK_FMT_F16] = dequantize_f16,
            [MOEK_FMT_BF16] = dequantize_bf16,
            [MOEK_FMT_Q8_0] = dequantize_q8_0,
            [MOEK_FMT_Q4_0] = dequantize_q4_0,
            [MOEK_FMT_MXFP4] = dequantize_mxfp4,
            [MOEK_FMT_Q4_K] = dequantize_q4_K,
            [MOEK_FMT_Q5_K] = dequantize_q5_K,
            [MOEK_FMT_Q6_K] = dequantize_q6_K,
            [MOEK_FMT_IQ4_NL] = dequantize_iq4_nl,
            [MOEK_FMT_IQ4_XS] = dequantize_iq4_xs,
            [MOEK_FMT_IQ2_XXS] = dequantize_iq2_xxs,
            [MOEK_FMT_IQ2_XS] = dequantize_iq2_xs,
            [MOEK_FMT_IQ3_XXS] = dequantize_iq3_xxs,
            [MOEK_FMT_IQ3_S] = dequantize_iq3_s,
            [MOEK_FMT_IQ1_S] = dequantize_iq1_s,
            [MOEK_FMT_IQ1_M] = dequantize_iq1_m,
            [MOEK_FMT_IQ2_S] = dequantize_iq2_s,
            [MOEK_FMT_Q2_K] = dequantize_q2_K,
            [MOEK_FMT_Q3_K] = dequantize_q3_K,
            [MOEK_FMT_INT4_G32] = dequantize_int4,
            [MOEK_FMT_NVFP4] = moek_avx2_dequantize_nvfp4,
            [MOEK_FMT_FP8_E4M3_B128] = dequantize_fp8,
        },
    .dot_f32 = dot_f32,
    .tile = tile,
    .prefill = true,
    .x8_transpose = x8_transpose,
    .swiglu = swiglu,
    .describe = describe,
};
