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
 * Where isa.c found AVX512-VNNI (MOEK_FORM_VNNI; iqz_body, below) 64 weights a step in one zmm:
 * grid entries by vpgatherqq / vpgatherdd, signs as a k-mask negating the activations, maddubs,
 * vpdpwssd by scale words spread by vpermw; with VBMI too (MOEK_FORM_VBMI) the ksigns bytes of a
 * block by vpmultishiftqb + vpermi2b. The same exact int32 per super-block: the same bits.
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

/* ---- The VNNI form (MOEK_FORM_VNNI): 64 weights a step in one zmm ------------------------- */

/* The VBMI form's two instructions (MOEK_FORM_VBMI, which isa.c only sets with the VNNI one),
 * as inline assembly like x86_avx2_iq4.c's vpermb: executed only where that form is on.
 * multishift: byte b of qword q = the 8 bits of data qword q from bit ctrl byte b (mod 64);
 * permt2b: byte b = the 128-byte table lo:hi at the low 7 bits of idx byte b. */
VNNI_CODE ALWAYS_INLINE __m512i iqz_multishift(__m512i ctrl, __m512i data)
{
	__m512i r;
	__asm__("vpmultishiftqb %2, %1, %0" : "=v"(r) : "v"(ctrl), "v"(data));
	return r;
}
/* permb_z: byte b = data byte idx[b] (low 6 bits) where byte b is the low byte of its qword,
 * else 0 (vpermb with a zeroing mask) */
VNNI_CODE ALWAYS_INLINE __m512i iqz_permb_z(__m512i idx, __m512i data)
{
	__m512i r;
	const __mmask64 m = 0x0101010101010101ull;
	__asm__("vpermb %2, %1, %0%{%3%}%{z%}" : "=v"(r) : "v"(idx), "v"(data), "Yk"(m));
	return r;
}
VNNI_CODE ALWAYS_INLINE __m512i iqz_permt2b(__m512i lo, __m512i idx, __m512i hi)
{
	__asm__("vpermt2b %2, %1, %0" : "+v"(lo) : "v"(idx), "v"(hi));
	return lo;
}

ALWAYS_INLINE uint16_t iq1m_d16(const struct block_iq1_m *x)
{
	uint16_t sc[4];
	memcpy(sc, x->scales, sizeof(sc));
	return (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
	                  (sc[3] & 0xf000));
}

/* Per super-block, the scales as int16 words in one register and, per step j (weights 64j ..
 * 64j + 63), the vpermw indices that spread them over the 32 pair sums of the step; the IQ1
 * formats also the coefficients of Q8_K's bsums (one per 16 weights, in a ymm). */
struct iqz_scales {
	__m512i w;
	__m256i bs;
};

/* vpermw indices: word w of step j reads the scale of weights 64j + 2w (per 32 weights in
 * `per32`, else per 16), laid out as iqz_scales_of puts them: word stride `stride` (IQ2_XXS 4,
 * IQ3_XXS 2, IQ1_S 1), or (nib) nibble n at word (n & 1) * 8 + n / 2. */
VNNI_CODE ALWAYS_INLINE __m512i iqz_index(uint32_t format, int j)
{
	const __m512i w =
	    _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
	                     13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
	const __m512i n32 = _mm512_add_epi16(_mm512_set1_epi16((short)(2 * j)),
	                                     _mm512_srli_epi16(w, 4)),
	              n16 = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * j)),
	                                     _mm512_srli_epi16(w, 3));
	const __m512i one = _mm512_set1_epi16(1);
	if (format == MOEK_IQ2_XXS)
		return _mm512_slli_epi16(n32, 2);
	if (format == MOEK_IQ3_XXS)
		return _mm512_slli_epi16(n32, 1);
	if (format == MOEK_IQ1_S)
		return n32;
	if (format == MOEK_IQ1_M)
		return n16;
	const __m512i n = format == MOEK_IQ3_S ? n32 : n16; /* nibbles */
	return _mm512_add_epi16(_mm512_slli_epi16(_mm512_and_si512(n, one), 3),
	                        _mm512_srli_epi16(n, 1));
}

/* nibbles of `n` bytes (n <= 8, in the low bytes of v): low nibble of byte m at word m, high at
 * word 8 + m, as 2s + 1 */
VNNI_CODE ALWAYS_INLINE __m512i iqz_nibble_scales(uint64_t v)
{
	const __m128i b = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)v));
	const __m256i s = _mm256_inserti128_si256(
	    _mm256_castsi128_si256(_mm_and_si128(b, _mm_set1_epi16(15))), _mm_srli_epi16(b, 4), 1);
	return _mm512_zextsi256_si512(
	    _mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1)));
}

VNNI_CODE ALWAYS_INLINE struct iqz_scales iqz_scales_of(uint32_t format, const uint8_t *blk)
{
	struct iqz_scales r = {_mm512_setzero_si512(), _mm256_setzero_si256()};
	const __m512i one = _mm512_set1_epi16(1);
	if (format == MOEK_IQ2_XXS) { /* qword m = a | b << 32, s = b >> 28: word 4m */
		const __m512i s = _mm512_srli_epi64(
		    _mm512_loadu_si512(((const struct block_iq2_xxs *)blk)->qs), 60);
		r.w = _mm512_add_epi16(_mm512_add_epi16(s, s), one);
	} else if (format == MOEK_IQ3_XXS) { /* dword m = b: word 2m */
		const __m256i s = _mm256_srli_epi32(
		    _mm256_loadu_si256(
		        (const __m256i *)(((const struct block_iq3_xxs *)blk)->qs + QK_K / 4)),
		    28);
		r.w = _mm512_zextsi256_si512(
		    _mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1)));
	} else if (format == MOEK_IQ1_S) { /* qh[m] bits 12-14: word m; bit 15 the delta */
		const __m128i qh =
		    _mm_loadu_si128((const __m128i *)((const struct block_iq1_s *)blk)->qh);
		const __m128i ls = _mm_add_epi16(
		    _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7)), 1),
		    _mm_set1_epi16(1));
		r.w = _mm512_zextsi256_si512(_mm256_castsi128_si256(_mm_slli_epi16(ls, 3)));
		/* bsums 2m, 2m + 1: ls · (-8 ∓ 1), -9 where the delta is negative */
		const __m128i c = _mm_mullo_epi16(
		    ls, _mm_sub_epi16(_mm_set1_epi16(-7),
		                      _mm_and_si128(_mm_srai_epi16(qh, 15), _mm_set1_epi16(2))));
		r.bs = _mm256_cvtepu16_epi32(c); /* each word twice, as dwords' halves */
		r.bs = _mm256_or_si256(r.bs, _mm256_slli_epi32(r.bs, 16));
	} else if (format == MOEK_IQ1_M) { /* u16 k bits 3i..3i+2: weights 64k + 16i, word 4k+i */
		const __m128i sc =
		    _mm_loadl_epi64((const __m128i *)((const struct block_iq1_m *)blk)->scales);
		const __m256i x4 = _mm256_permutexvar_epi16(
		    _mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
		    _mm256_castsi128_si256(sc));
		const __m256i s = _mm256_and_si256(
		    _mm256_srlv_epi16(
		        x4, _mm256_setr_epi16(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)),
		    _mm256_set1_epi16(7));
		const __m256i ls = _mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1));
		r.w = _mm512_zextsi256_si512(ls);
		r.bs = _mm256_mullo_epi16(ls, _mm256_set1_epi16(-9));
	} else if (format == MOEK_IQ3_S) {
		uint32_t v;
		memcpy(&v, ((const struct block_iq3_s *)blk)->scales, sizeof(v));
		r.w = iqz_nibble_scales(v);
	} else {
		uint64_t v;
		memcpy(&v,
		       format == MOEK_IQ2_S ? ((const struct block_iq2_s *)blk)->scales
		                            : ((const struct block_iq2_xs *)blk)->scales,
		       sizeof(v));
		r.w = iqz_nibble_scales(v);
	}
	return r;
}

VNNI_CODE ALWAYS_INLINE uint32_t iqz_ks4(uint32_t b)
{
	const uint8_t *ks = moek_ksigns_iq2xs;
	return (uint32_t)ks[b & 127] | (uint32_t)ks[(b >> 7) & 127] << 8 |
	       (uint32_t)ks[(b >> 14) & 127] << 16 | (uint32_t)ks[(b >> 21) & 127] << 24;
}

/* 8 grid entries of 8 bytes by vpgatherqq (inline assembly: GCC's intrinsic fails register
 * allocation in these bodies): measured faster here than 8 loads put together by inserts. */
VNNI_CODE ALWAYS_INLINE __m512i iqz_gather64(const uint64_t *g, __m512i idx)
{
	__m512i r;
	__mmask16 m;
	__asm__("vpxord %x0, %x0, %x0\n\tkxnorw %1, %1, %1\n\tvpgatherqq (%2,%3,8), %0%{%1%}"
	        : "=&v"(r), "=&Yk"(m)
	        : "r"(g), "v"(idx)
	        : "memory");
	return r;
}

/* The ksigns table as two registers, for iqz_block_signs. */
struct iqz_ks {
	__m512i lo, hi;
};

/* VBMI form, per super-block: the sign masks of its 32 groups of 8 whose 7-bit ksigns indices
 * are in `idx` (the low 7 bits of byte g: group g; IQ2_XS: of byte 2g), byte g of out[0..3]
 * (bit j of byte g: weight 8g + j negative). vpermi2b reads the 128-byte table. */
VNNI_CODE ALWAYS_INLINE void iqz_block_signs(uint32_t format, const uint8_t *blk, struct iqz_ks ks,
                                             uint64_t out[4])
{
	__m512i idx;
	if (format == MOEK_IQ2_XS) { /* u16 g >> 9, bytes 2g -> g */
		const __m512i q = _mm512_srli_epi16(
		    _mm512_loadu_si512(((const struct block_iq2_xs *)blk)->qs), 9);
		idx = _mm512_zextsi256_si512(_mm512_cvtepi16_epi8(q));
	} else {
		/* IQ2_XXS: b_m is dword 2m + 1 of qs; IQ3_XXS: dword m of qs + 64 */
		const __m512i b =
		    format == MOEK_IQ2_XXS
		        ? _mm512_permutexvar_epi32(
		              _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13,
		                                15),
		              _mm512_loadu_si512(((const struct block_iq2_xxs *)blk)->qs))
		        : _mm512_castsi256_si512(_mm256_loadu_si256(
		              (const __m256i *)(((const struct block_iq3_xxs *)blk)->qs +
		                                QK_K / 4)));
		/* qword q = b_2q | b_2q+1 << 32: groups 8q .. 8q + 7 at bits 7l (l < 4), 32 + 7l */
		idx = iqz_multishift(_mm512_set1_epi64(0x352e2720150e0700), b);
	}
	const __m256i sg = _mm512_castsi512_si256(iqz_permt2b(ks.lo, idx, ks.hi));
	_mm256_storeu_si256((__m256i *)out, sg);
}

/* Step j (weights 64j .. 64j + 63) of block x: unsigned weights `u` (magnitudes; IQ1: the
 * weight plus 1 (IQ1_S) or 9 (IQ1_M), the bsums coefficients take the offset back) and the
 * mask of the negative ones; `bs` the VBMI form's block signs (iqz_block_signs). */
VNNI_CODE ALWAYS_INLINE void iqz_unpack(uint32_t format, const uint8_t *blk, int j, __m512i *u,
                                        uint64_t *neg, const int form, const uint64_t *bs)
{
	*neg = 0;
	if (format == MOEK_IQ2_XXS) {
		const uint8_t *c =
		    (const uint8_t *)((const struct block_iq2_xxs *)blk)->qs + 16 * j;
		/* bytes 0-3, 8-11 zero-extended to qwords (VBMI form: one vpermb) */
		const __m512i idx =
		    form == 2
		        ? iqz_permb_z(_mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0),
		                      _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)c)))
		        : _mm512_cvtepu8_epi64(_mm_shuffle_epi8(
		              _mm_loadu_si128((const __m128i *)c),
		              _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0)));
		*u = iqz_gather64(moek_iq2xxs_grid, idx);
		*neg = form == 2
		           ? bs[j]
		           : iqz_ks4(iq_le32(c + 4)) | (uint64_t)iqz_ks4(iq_le32(c + 12)) << 32;
	} else if (format == MOEK_IQ3_XXS) {
		const struct block_iq3_xxs *b = (const struct block_iq3_xxs *)blk;
		const __m512i idx =
		    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * j)));
		*u = _mm512_i32gather_epi32(idx, (const int *)moek_iq3xxs_grid, 4);
		const uint8_t *s = b->qs + QK_K / 4 + 8 * j;
		*neg = form == 2 ? bs[j]
		                 : iqz_ks4(iq_le32(s)) | (uint64_t)iqz_ks4(iq_le32(s + 4)) << 32;
	} else if (format == MOEK_IQ3_S) {
		const struct block_iq3_s *b = (const struct block_iq3_s *)blk;
		uint16_t hb;
		memcpy(&hb, b->qh + 2 * j, sizeof(hb));
		const __m512i lo =
		    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * j)));
		const __m512i idx =
		    _mm512_mask_or_epi32(lo, (__mmask16)hb, lo, _mm512_set1_epi32(256));
		*u = _mm512_i32gather_epi32(idx, (const int *)moek_iq3s_grid, 4);
		memcpy(neg, b->signs + 8 * j, sizeof(*neg));
	} else if (format == MOEK_IQ2_XS) {
		const uint16_t *c = ((const struct block_iq2_xs *)blk)->qs + 8 * j;
		const __m512i idx =
		    _mm512_and_si512(_mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)c)),
		                     _mm512_set1_epi64(511));
		*u = iqz_gather64(moek_iq2xs_grid, idx);
		if (form == 2) {
			*neg = bs[j];
		} else {
			const uint8_t *ks = moek_ksigns_iq2xs;
			*neg = (uint64_t)ks[c[0] >> 9] | (uint64_t)ks[c[1] >> 9] << 8 |
			       (uint64_t)ks[c[2] >> 9] << 16 | (uint64_t)ks[c[3] >> 9] << 24 |
			       (uint64_t)ks[c[4] >> 9] << 32 | (uint64_t)ks[c[5] >> 9] << 40 |
			       (uint64_t)ks[c[6] >> 9] << 48 | (uint64_t)ks[c[7] >> 9] << 56;
		}
	} else {
		/* IQ2_S, IQ1_S, IQ1_M: index = qs byte | high bits << 8, the high bits of group
		 * l at bit sh_l of the u32 at `h` (2 bits in IQ2_S's qh bytes; 3 in IQ1_S's u16,
		 * 12-14 the scale; IQ1_M: nibbles of qh bytes, bit 3 the delta sign) */
		const uint8_t *c, *h;
		__m512i sh, hm;
		const uint64_t *grid = format == MOEK_IQ2_S ? moek_iq2s_grid : moek_iq1s_grid;
		if (format == MOEK_IQ2_S) {
			const struct block_iq2_s *b = (const struct block_iq2_s *)blk;
			c = b->qs + 8 * j, h = b->qh + 2 * j;
			sh = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14),
			hm = _mm512_set1_epi64(3);
			memcpy(neg, b->qs + 32 + 8 * j, sizeof(*neg));
		} else if (format == MOEK_IQ1_S) {
			const struct block_iq1_s *b = (const struct block_iq1_s *)blk;
			c = b->qs + 8 * j, h = (const uint8_t *)(b->qh + 2 * j);
			sh = _mm512_setr_epi64(0, 3, 6, 9, 16, 19, 22, 25),
			hm = _mm512_set1_epi64(7);
		} else {
			const struct block_iq1_m *b = (const struct block_iq1_m *)blk;
			c = b->qs + 8 * j, h = b->qh + 4 * j;
			sh = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28),
			hm = _mm512_set1_epi64(15);
		}
		const __m512i nib = _mm512_and_si512(
		    _mm512_srlv_epi64(_mm512_set1_epi64((long long)iq_le32(h)), sh), hm);
		const __m512i lo = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)c));
		const __m512i idx = _mm512_or_si512(
		    lo, _mm512_slli_epi64(_mm512_and_si512(nib, _mm512_set1_epi64(7)), 8));
		const __m512i g = iqz_gather64(grid, idx);
		if (format == MOEK_IQ2_S) {
			*u = g;
		} else if (format == MOEK_IQ1_S) {
			*u = _mm512_add_epi8(g, _mm512_set1_epi8(1));
		} else {
			/* 8 (g + 1) + 1 + δ: 2 less (no borrow: every byte >= 2) where δ = -1 */
			const __m512i g1 = _mm512_add_epi8(g, _mm512_set1_epi8(1));
			const __m512i u8 =
			    _mm512_add_epi8(_mm512_slli_epi16(g1, 3), _mm512_set1_epi8(2));
			*u = _mm512_mask_sub_epi64(
			    u8, _mm512_test_epi64_mask(nib, _mm512_set1_epi64(8)), u8,
			    _mm512_set1_epi8(2));
		}
	}
}

/* One row against NT Q8_K tokens: per step the signs negate the activations (masked vpsubb),
 * maddubs of the unsigned weights and them (|pair| <= 2 · 62 · 128), vpdpwssd by the scale
 * words; the IQ1 formats' offset times the scale is taken back through the bsums. The
 * int32 sum per super-block is exact, so it equals iq_body's (moek_iq_dot_q8k_ref's), and so
 * does the FMA after it. */
VNNI_CODE ALWAYS_INLINE void iqz_body(const void *w, const void *act, size_t as, const int NT,
                                      size_t k, float *out, uint32_t format, const int form)
{
	const size_t bb = format == MOEK_IQ2_XXS   ? sizeof(struct block_iq2_xxs)
	                  : format == MOEK_IQ3_XXS ? sizeof(struct block_iq3_xxs)
	                  : format == MOEK_IQ3_S   ? sizeof(struct block_iq3_s)
	                  : format == MOEK_IQ2_S   ? sizeof(struct block_iq2_s)
	                  : format == MOEK_IQ1_S   ? sizeof(struct block_iq1_s)
	                  : format == MOEK_IQ1_M   ? sizeof(struct block_iq1_m)
	                                           : sizeof(struct block_iq2_xs);
	const bool iq1 = format == MOEK_IQ1_S || format == MOEK_IQ1_M;
	const float f = format == MOEK_IQ3_XXS ? 0.25f : format == MOEK_IQ3_S ? 1.0f : 0.125f;
	const bool far = wide_activation(k / QK_K * sizeof(struct block_q8_K));
	const __m512i ix0 = iqz_index(format, 0), ix1 = iqz_index(format, 1),
	              ix2 = iqz_index(format, 2), ix3 = iqz_index(format, 3);
	const bool ksg = form == 2 && (format == MOEK_IQ2_XXS || format == MOEK_IQ3_XXS ||
	                               format == MOEK_IQ2_XS);
	struct iqz_ks ks = {_mm512_setzero_si512(), _mm512_setzero_si512()};
	if (ksg)
		ks = (struct iqz_ks){_mm512_loadu_si512(moek_ksigns_iq2xs),
		                     _mm512_loadu_si512(moek_ksigns_iq2xs + 64)};
	__m128 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm_setzero_ps();
	for (size_t i = 0; i < k / QK_K; i++) {
		const uint8_t *blk = (const uint8_t *)w + i * bb;
		prefetch_ahead(blk, far), prefetch_ahead(blk + 64, far);
		const struct iqz_scales sc = iqz_scales_of(format, blk);
		uint64_t bs[4] = {0, 0, 0, 0};
		if (ksg)
			iqz_block_signs(format, blk, ks, bs);
		__m512i sumi[8];
		for (int t = 0; t < NT; t++)
			sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
		for (int j = 0; j < QK_K / 64; j++) {
			__m512i u;
			uint64_t neg;
			iqz_unpack(format, blk, j, &u, &neg, form, bs);
			const __m512i ls = _mm512_permutexvar_epi16(j == 0   ? ix0
			                                            : j == 1 ? ix1
			                                            : j == 2 ? ix2
			                                                     : ix3,
			                                            sc.w);
			for (int t = 0; t < NT; t++) {
				__m512i y =
				    _mm512_loadu_si512(q8k_token(act, as, t, i)->qs + 64 * j);
				if (!iq1)
					y = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
				sumi[t] =
				    _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(u, y), ls);
			}
		}
		const float d = format == MOEK_IQ1_M
		                    ? _cvtsh_ss(iq1m_d16((const struct block_iq1_m *)blk))
		                    : _cvtsh_ss(((const uint16_t *)blk)[0]);
		for (int t = 0; t < NT; t++) {
			const struct block_q8_K *y = q8k_token(act, as, t, i);
			__m512i v = sumi[t];
			if (iq1) /* the offset's part, in the same reduction (exact) */
				v = _mm512_add_epi32(
				    v, _mm512_zextsi256_si512(_mm256_madd_epi16(
				           _mm256_loadu_si256((const __m256i *)y->bsums), sc.bs)));
			const int32_t s = _mm512_reduce_add_epi32(v);
			acc[t] = _mm_fmadd_ss(_mm_set_ss(d * y->d * f),
			                      _mm_cvtsi32_ss(_mm_setzero_ps(), s), acc[t]);
		}
	}
	for (int t = 0; t < NT; t++)
		out[t] = _mm_cvtss_f32(acc[t]);
}

#define iqz_vnni(w, act, as, NT, k, out, FMT) iqz_body(w, act, as, NT, k, out, FMT, 1)
#define iqz_vbmi(w, act, as, NT, k, out, FMT) iqz_body(w, act, as, NT, k, out, FMT, 2)

/* The row dot (specialised on the token count) and the many-row entry of one format, in the
 * AVX2 form (`body`) and the VNNI one (iqz_body), picked per call. */
#define IQ_BODY_ENTRIES(fmt, FMT, body)                                                            \
	X8_ENTRY(dot_##fmt, body, FMT, )                                                           \
	X8_ENTRY(dotz_##fmt, iqz_vnni, FMT, VNNI_CODE)                                             \
	X8_ENTRY(dotb_##fmt, iqz_vbmi, FMT, VNNI_CODE)                                             \
	static void avx2_dot_##fmt(const void *w, const float *sr, const void *act, size_t as,     \
	                           size_t nt, size_t k, float *out)                                \
	{                                                                                          \
		(void)sr;                                                                          \
		dot_##fmt(w, act, as, nt, k, out);                                                 \
	}                                                                                          \
	VNNI_CODE static void vnni_dot_##fmt(const void *w, const float *sr, const void *act,      \
	                                     size_t as, size_t nt, size_t k, float *out)           \
	{                                                                                          \
		(void)sr;                                                                          \
		if (moek_isa_forms() & MOEK_FORM_VBMI)                                             \
			dotb_##fmt(w, act, as, nt, k, out);                                        \
		else                                                                               \
			dotz_##fmt(w, act, as, nt, k, out);                                        \
	}                                                                                          \
	static void avx2_rows_##fmt(const void *w, size_t stride, size_t nr, const void *act,      \
	                            size_t k, float *out)                                          \
	{                                                                                          \
		for (size_t r = 0; r < nr; r++)                                                    \
			body((const uint8_t *)w + r * stride, act, 0, 1, k, out + r, FMT);         \
	}                                                                                          \
	VNNI_CODE static void vnni_rows_##fmt(const void *w, size_t stride, size_t nr,             \
	                                      const void *act, size_t k, float *out)               \
	{                                                                                          \
		const bool vbmi = moek_isa_forms() & MOEK_FORM_VBMI;                               \
		for (size_t r = 0; r < nr; r++)                                                    \
			if (vbmi)                                                                  \
				iqz_body((const uint8_t *)w + r * stride, act, 0, 1, k, out + r,   \
				         FMT, 2);                                                  \
			else                                                                       \
				iqz_body((const uint8_t *)w + r * stride, act, 0, 1, k, out + r,   \
				         FMT, 1);                                                  \
	}                                                                                          \
	VNNI_PICK_DOT(moek_avx2_dot_##fmt, avx2_dot_##fmt, vnni_dot_##fmt)                         \
	VNNI_PICK_ROWS(moek_avx2_rows_##fmt, avx2_rows_##fmt, vnni_rows_##fmt)

IQ_BODY_ENTRIES(iq2_xxs, MOEK_IQ2_XXS, iq_body)
IQ_BODY_ENTRIES(iq2_xs, MOEK_IQ2_XS, iq_body)
IQ_BODY_ENTRIES(iq3_xxs, MOEK_IQ3_XXS, iq_body)
IQ_BODY_ENTRIES(iq3_s, MOEK_IQ3_S, iq_body)
IQ_BODY_ENTRIES(iq2_s, MOEK_IQ2_S, iq_body)
IQ_BODY_ENTRIES(iq1_s, MOEK_IQ1_S, iq1_body)
IQ_BODY_ENTRIES(iq1_m, MOEK_IQ1_M, iq1m_body)
