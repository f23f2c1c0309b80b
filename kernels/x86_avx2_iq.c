/* x86_avx2_iq.c — AVX2 decode dots of the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S;
 * IQ1_S in iq1_body, IQ1_M in iq1m_body) against Q8_K,
 * for moek_avx2_ops (x86_avx2.c's table).
 *
 * Compiled with x86_avx2.c's flags and run only after its CPUID check. Per 32 weights: four
 * grid entries (8 magnitude bytes each, 8 / 25 / 43; IQ3_XXS, IQ3_S: eight of 4 bytes, up to
 * 62, by one vpgatherdd) in one register, the four
 * 8-bit sign patterns from ksigns_iq2xs broadcast and compared against the bit masks into
 * ±1 bytes, which sign the activations (vpsignb); maddubs of magnitudes and signed
 * activations (|pair| <= 2 · 62 · 127, no saturation), madd by the odd scale 2s + 1 per 16
 * or 32 weights, one exact int32 sum per super-block, then one f32 FMA per token and
 * super-block by d · y.d · 0.125 (IQ3_XXS 0.25, IQ3_S 1) — moek_iq_dot_q8k_ref's arithmetic, so the
 * same bits.
 * Prefill: x86_avx2.c's table hands the f32 tiles the reference dequantizer's rows.
 *
 * As everywhere in the kernels, each result's summation order depends only on k.
 */
#include <immintrin.h>
#include <string.h>

#include "x86_avx2.h"

ALWAYS_INLINE int32_t iq_hsum(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
	return _mm_cvtsi128_si32(s);
}

/* ±1 bytes from four 8-bit sign patterns (pattern l in byte l of `s`, bit j: weight 8l + j
 * negative). */
ALWAYS_INLINE __m256i iq_signs(uint32_t s)
{
	const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2,
	                                        2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
	const __m256i bits =
	    _mm256_set1_epi64x((long long)0x8040201008040201ull); /* byte j: 1 << j */
	const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s), spread);
	const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(b, bits), bits);
	return _mm256_or_si256(neg, _mm256_set1_epi8(1));
}

ALWAYS_INLINE uint32_t iq_le32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* 32 weights' magnitudes, ±1 signs and the int16 scale words (one per 16 weights) of
 * sub-block ib of block x. */
ALWAYS_INLINE void iq_unpack(uint32_t format, const void *x, int ib, __m256i *w, __m256i *s,
                             __m256i *ls)
{
	const uint8_t *ks = moek_ksigns_iq2xs;
	if (format == MOEK_IQ2_XXS) {
		const uint8_t *c = (const uint8_t *)((const struct block_iq2_xxs *)x)->qs + 8 * ib;
		const uint32_t sg = iq_le32(c + 4);
		*w = _mm256_setr_epi64x(
		    (long long)moek_iq2xxs_grid[c[0]], (long long)moek_iq2xxs_grid[c[1]],
		    (long long)moek_iq2xxs_grid[c[2]], (long long)moek_iq2xxs_grid[c[3]]);
		*s = iq_signs((uint32_t)ks[sg & 127] | (uint32_t)ks[(sg >> 7) & 127] << 8 |
		              (uint32_t)ks[(sg >> 14) & 127] << 16 |
		              (uint32_t)ks[(sg >> 21) & 127] << 24);
		*ls = _mm256_set1_epi16((short)(2 * (sg >> 28) + 1));
	} else if (format == MOEK_IQ3_XXS) {
		const struct block_iq3_xxs *b = x;
		const uint32_t sg = iq_le32(b->qs + QK_K / 4 + 4 * ib);
		const __m256i idx =
		    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * ib)));
		*w = _mm256_i32gather_epi32((const int *)moek_iq3xxs_grid, idx, 4);
		*s = iq_signs((uint32_t)ks[sg & 127] | (uint32_t)ks[(sg >> 7) & 127] << 8 |
		              (uint32_t)ks[(sg >> 14) & 127] << 16 |
		              (uint32_t)ks[(sg >> 21) & 127] << 24);
		*ls = _mm256_set1_epi16((short)(2 * (sg >> 28) + 1));
	} else if (format == MOEK_IQ2_S) {
		const struct block_iq2_s *b = x;
		const uint8_t *c = b->qs + 4 * ib;
		const unsigned qh = b->qh[ib];
		*w = _mm256_setr_epi64x((long long)moek_iq2s_grid[c[0] | (qh & 3) << 8],
		                        (long long)moek_iq2s_grid[c[1] | ((qh >> 2) & 3) << 8],
		                        (long long)moek_iq2s_grid[c[2] | ((qh >> 4) & 3) << 8],
		                        (long long)moek_iq2s_grid[c[3] | ((qh >> 6) & 3) << 8]);
		*s = iq_signs(iq_le32(b->qs + 32 + 4 * ib));
		const int sc = b->scales[ib];
		*ls = _mm256_setr_m128i(_mm_set1_epi16((short)(2 * (sc & 15) + 1)),
		                        _mm_set1_epi16((short)(2 * (sc >> 4) + 1)));
	} else if (format == MOEK_IQ3_S) {
		const struct block_iq3_s *b = x;
		const __m256i hi =
		    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b->qh[ib]),
		                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
		                     _mm256_set1_epi32(1));
		const __m256i idx = _mm256_or_si256(
		    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * ib))),
		    _mm256_slli_epi32(hi, 8));
		*w = _mm256_i32gather_epi32((const int *)moek_iq3s_grid, idx, 4);
		*s = iq_signs(iq_le32(b->signs + 4 * ib));
		*ls = _mm256_set1_epi16(
		    (short)(1 + 2 * ((b->scales[ib / 2] >> (4 * (ib % 2))) & 15)));
	} else {
		const struct block_iq2_xs *b = x;
		const uint16_t *c = b->qs + 4 * ib;
		*w = _mm256_setr_epi64x(
		    (long long)moek_iq2xs_grid[c[0] & 511], (long long)moek_iq2xs_grid[c[1] & 511],
		    (long long)moek_iq2xs_grid[c[2] & 511], (long long)moek_iq2xs_grid[c[3] & 511]);
		*s = iq_signs((uint32_t)ks[c[0] >> 9] | (uint32_t)ks[c[1] >> 9] << 8 |
		              (uint32_t)ks[c[2] >> 9] << 16 | (uint32_t)ks[c[3] >> 9] << 24);
		const int sc = b->scales[ib];
		*ls = _mm256_setr_m128i(_mm_set1_epi16((short)(2 * (sc & 15) + 1)),
		                        _mm_set1_epi16((short)(2 * (sc >> 4) + 1)));
	}
}

ALWAYS_INLINE void iq_body(const void *w, const void *act, size_t as, const int NT, size_t k,
                           float *out, uint32_t format)
{
	const size_t bb = format == MOEK_IQ2_XXS   ? sizeof(struct block_iq2_xxs)
	                  : format == MOEK_IQ3_XXS ? sizeof(struct block_iq3_xxs)
	                  : format == MOEK_IQ3_S   ? sizeof(struct block_iq3_s)
	                  : format == MOEK_IQ2_S   ? sizeof(struct block_iq2_s)
	                                           : sizeof(struct block_iq2_xs);
	/* d · (0.5 + s) · k = d · (2s + 1) · k / 2; IQ3_S: d · (2s + 1) */
	const float f = format == MOEK_IQ3_XXS ? 0.25f : format == MOEK_IQ3_S ? 1.0f : 0.125f;
	const bool far = wide_activation(k / QK_K * sizeof(struct block_q8_K));
	__m128 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm_setzero_ps();
	for (size_t i = 0; i < k / QK_K; i++) {
		const uint8_t *blk = (const uint8_t *)w + i * bb;
		prefetch_ahead(blk, far), prefetch_ahead(blk + 64, far);
		__m256i sumi[8];
		for (int t = 0; t < NT; t++)
			sumi[t] = _mm256_setzero_si256();
		for (int ib = 0; ib < QK_K / 32; ib++) {
			__m256i mag, sg, ls;
			iq_unpack(format, blk, ib, &mag, &sg, &ls);
			for (int t = 0; t < NT; t++) {
				const __m256i y = _mm256_loadu_si256(
				    (const __m256i *)(q8k_token(act, as, t, i)->qs + 32 * ib));
				const __m256i p =
				    _mm256_maddubs_epi16(mag, _mm256_sign_epi8(y, sg));
				sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, ls));
			}
		}
		const float d = _cvtsh_ss(((const uint16_t *)blk)[0]);
		for (int t = 0; t < NT; t++)
			acc[t] = _mm_fmadd_ss(_mm_set_ss(d * q8k_token(act, as, t, i)->d * f),
			                      _mm_cvtsi32_ss(_mm_setzero_ps(), iq_hsum(sumi[t])),
			                      acc[t]);
	}
	for (int t = 0; t < NT; t++)
		out[t] = _mm_cvtss_f32(acc[t]);
}

/* IQ1_S: ternary weights sign the activations (vpsignb: −y, 0 or y), maddubs by ones sums
 * pairs, madd by 8 · (2s + 1); the delta's part, ±(2s + 1) · Σ q per 32 weights, comes from
 * Q8_K's bsums. One exact int32 sum per super-block (moek_iq_dot_q8k_ref's), then the FMA. */
ALWAYS_INLINE void iq1_body(const void *w, const void *act, size_t as, const int NT, size_t k,
                            float *out, uint32_t format)
{
	(void)format;
	const bool far = wide_activation(k / QK_K * sizeof(struct block_q8_K));
	const __m256i ones = _mm256_set1_epi8(1);
	__m128 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm_setzero_ps();
	for (size_t i = 0; i < k / QK_K; i++) {
		const struct block_iq1_s *x = (const struct block_iq1_s *)w + i;
		prefetch_ahead(x, far);
		__m256i sumi[8];
		int32_t dsum[8];
		for (int t = 0; t < NT; t++)
			sumi[t] = _mm256_setzero_si256(), dsum[t] = 0;
		for (int ib = 0; ib < QK_K / 32; ib++) {
			const unsigned qh = x->qh[ib];
			const uint8_t *c = x->qs + 4 * ib;
			const __m256i g = _mm256_setr_epi64x(
			    (long long)moek_iq1s_grid[c[0] | (qh & 7) << 8],
			    (long long)moek_iq1s_grid[c[1] | ((qh >> 3) & 7) << 8],
			    (long long)moek_iq1s_grid[c[2] | ((qh >> 6) & 7) << 8],
			    (long long)moek_iq1s_grid[c[3] | ((qh >> 9) & 7) << 8]);
			const int ls = (int)(2 * ((qh >> 12) & 7) + 1);
			const __m256i ls8 = _mm256_set1_epi16((short)(8 * ls));
			for (int t = 0; t < NT; t++) {
				const struct block_q8_K *y = q8k_token(act, as, t, i);
				const __m256i q =
				    _mm256_loadu_si256((const __m256i *)(y->qs + 32 * ib));
				const __m256i p =
				    _mm256_maddubs_epi16(ones, _mm256_sign_epi8(q, g));
				sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, ls8));
				const int bs = y->bsums[2 * ib] + y->bsums[2 * ib + 1];
				dsum[t] += ls * (qh & 0x8000 ? -bs : bs);
			}
		}
		const float d = _cvtsh_ss(x->d);
		for (int t = 0; t < NT; t++)
			acc[t] = _mm_fmadd_ss(
			    _mm_set_ss(d * q8k_token(act, as, t, i)->d * 0.125f),
			    _mm_cvtsi32_ss(_mm_setzero_ps(), iq_hsum(sumi[t]) + dsum[t]), acc[t]);
	}
	for (int t = 0; t < NT; t++)
		out[t] = _mm_cvtss_f32(acc[t]);
}

/* IQ1_M: per group of 8 the integer weights 8 · grid ± 1 (|w| <= 9: vpsignb of 8 by the ternary
 * bytes plus the delta's ±1), the sign trick into maddubs, madd by 2s + 1 per 16 weights; one
 * exact int32 sum per super-block (moek_iq_dot_q8k_ref's), then the FMA by d · y.d · 0.125. */
ALWAYS_INLINE void iq1m_body(const void *w, const void *act, size_t as, const int NT, size_t k,
                             float *out, uint32_t format)
{
	(void)format;
	const bool far = wide_activation(k / QK_K * sizeof(struct block_q8_K));
	const __m256i eight = _mm256_set1_epi8(8);
	__m128 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm_setzero_ps();
	for (size_t i = 0; i < k / QK_K; i++) {
		const struct block_iq1_m *x = (const struct block_iq1_m *)w + i;
		prefetch_ahead(x, far);
		uint16_t sc[4];
		memcpy(sc, x->scales, sizeof(sc));
		__m256i sumi[8];
		for (int t = 0; t < NT; t++)
			sumi[t] = _mm256_setzero_si256();
		for (int ib = 0; ib < QK_K / 32; ib++) {
			const uint8_t *c = x->qs + 4 * ib, *h = x->qh + 2 * ib;
			const __m256i g = _mm256_setr_epi64x(
			    (long long)moek_iq1s_grid[c[0] | (h[0] & 7) << 8],
			    (long long)moek_iq1s_grid[c[1] | ((h[0] >> 4) & 7) << 8],
			    (long long)moek_iq1s_grid[c[2] | (h[1] & 7) << 8],
			    (long long)moek_iq1s_grid[c[3] | ((h[1] >> 4) & 7) << 8]);
			const __m256i dl =
			    _mm256_setr_epi64x(h[0] & 0x08 ? -1LL : 0x0101010101010101LL,
			                       h[0] & 0x80 ? -1LL : 0x0101010101010101LL,
			                       h[1] & 0x08 ? -1LL : 0x0101010101010101LL,
			                       h[1] & 0x80 ? -1LL : 0x0101010101010101LL);
			const __m256i wq = _mm256_add_epi8(_mm256_sign_epi8(eight, g), dl);
			const __m256i aw = _mm256_abs_epi8(wq);
			const unsigned s = sc[ib / 2] >> (6 * (ib % 2));
			const __m256i ls =
			    _mm256_setr_m128i(_mm_set1_epi16((short)(2 * (s & 7) + 1)),
			                      _mm_set1_epi16((short)(2 * ((s >> 3) & 7) + 1)));
			for (int t = 0; t < NT; t++) {
				const __m256i q = _mm256_loadu_si256(
				    (const __m256i *)(q8k_token(act, as, t, i)->qs + 32 * ib));
				const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(q, wq));
				sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, ls));
			}
		}
		const float d =
		    _cvtsh_ss((unsigned short)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) |
		                               ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000)));
		for (int t = 0; t < NT; t++)
			acc[t] = _mm_fmadd_ss(_mm_set_ss(d * q8k_token(act, as, t, i)->d * 0.125f),
			                      _mm_cvtsi32_ss(_mm_setzero_ps(), iq_hsum(sumi[t])),
			                      acc[t]);
	}
	for (int t = 0; t < NT; t++)
		out[t] = _mm_cvtss_f32(acc[t]);
}

/* The row dot (specialised on the token count) and the many-row entry of one format. */
#define IQ_ENTRIES(fmt, FMT) IQ_BODY_ENTRIES(fmt, FMT, iq_body)
#define IQ_BODY_ENTRIES(fmt, FMT, iq_body)                                                         \
	X8_ENTRY(dot_##fmt, iq_body, FMT, )                                                        \
	void moek_avx2_dot_##fmt(const void *w, const float *sr, const void *act, size_t as,       \
	                         size_t nt, size_t k, float *out)                                  \
	{                                                                                          \
		(void)sr;                                                                          \
		dot_##fmt(w, act, as, nt, k, out);                                                 \
	}                                                                                          \
	void moek_avx2_rows_##fmt(const void *w, size_t stride, size_t nr, const void *act,        \
	                          size_t k, float *out)                                            \
	{                                                                                          \
		for (size_t r = 0; r < nr; r++)                                                    \
			iq_body((const uint8_t *)w + r * stride, act, 0, 1, k, out + r, FMT);      \
	}

IQ_ENTRIES(iq2_xxs, MOEK_IQ2_XXS)
IQ_ENTRIES(iq2_xs, MOEK_IQ2_XS)
IQ_ENTRIES(iq3_xxs, MOEK_IQ3_XXS)
IQ_ENTRIES(iq3_s, MOEK_IQ3_S)
IQ_ENTRIES(iq2_s, MOEK_IQ2_S)
IQ_BODY_ENTRIES(iq1_s, MOEK_IQ1_S, iq1_body)
IQ_BODY_ENTRIES(iq1_m, MOEK_IQ1_M, iq1m_body)
