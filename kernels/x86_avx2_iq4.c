/* x86_avx2_iq4.c — AVX2 paths of IQ4_NL and IQ4_XS for moek_avx2_ops (x86_avx2.c's table).
 *
 * Compiled with x86_avx2.c's flags and run only after its CPUID check. The non-linear grid is
 * one vpshufb: the 16 int8 levels are the table, the nibbles its indices.
 *
 * IQ4_NL against MOEK_ACT_Q8_0X2 activations, pairs of blocks as Q4_0 (x86_avx2.c): one
 * 256-bit and/shift unpacks two blocks' nibbles in the activations' lane order. AVX2 form: the
 * signed levels through maddubs by the sign trick (|w|, y signed by w: |w|, |y| <= 127, so a
 * pair sum stays below 2^15) and madd per half. VNNI form: the levels + 128 as unsigned bytes
 * into vpdpbusd, started from −128 · Σy (8 × the activations' neg_sum16). Both integer sums
 * are exact, so the bits are the same.
 * IQ4_XS against Q8_K, two 32-element sub-blocks per 256-bit unpack (xs_body): the sign trick
 * and madd by the 6-bit scales (VNNI form: vpdpbusd of level + 128 and a multiply by the
 * scales, the offset taken out through Q8_K's bsums), one exact int32 sum and one f32 FMA
 * per 256 elements.
 * Prefill: dequantization bit-identical to fmt_iq4.c (the same products, in the same order).
 *
 * As everywhere in the kernels, each result's summation order depends only on k.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "x86_avx2.h"

/* The grid as a vpshufb table in both lanes: signed levels, or levels + 128 (unsigned). */
ALWAYS_INLINE __m256i iq4_table(bool plus128)
{
	const __m256i t =
	    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)moek_iq4_kvalues));
	return plus128 ? _mm256_xor_si256(t, _mm256_set1_epi8((char)0x80)) : t;
}

/* 32 codes of 16 nibble bytes in element order: bytes 0-15 low nibbles, 16-31 high ones. */
ALWAYS_INLINE __m256i nibbles_32(const uint8_t *p)
{
	const __m128i q = _mm_loadu_si128((const __m128i *)p);
	const __m256i both =
	    _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
	return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* Σ w·y per int32 lane of 4 bytes: maddubs of |w| and y signed by w, then madd by s (int16
 * pairs: 1 for a plain sum, a scale for IQ4_XS). Exact: |w|, |y| <= 127. */
ALWAYS_INLINE __m256i signed_dot(__m256i w, __m256i abs_w, __m256i y, __m256i s)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(y, w)), s);
}

/* ---- IQ4_NL ------------------------------------------------------------------------------ */

/* A pair of blocks at b0 (the second absent without has_two: zero codes, zero scale): levels
 * of elements 0-15 of both blocks (lo) and 16-31 (hi), in MOEK_ACT_Q8_0X2's lane order, and
 * the blocks' scales in lanes 0-3 / 4-7. vnni: levels + 128 (unsigned). */
ALWAYS_INLINE void nl_pair_unpack(const uint8_t *b0, bool has_two, bool vnni, __m256i *lo,
                                  __m256i *hi, __m256 *w8)
{
	const size_t bb = sizeof(struct block_iq4_nl);
	const __m256i low4 = _mm256_set1_epi8(0x0F), table = iq4_table(vnni);
	const __m256i q = _mm256_inserti128_si256(
	    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + 2))),
	    has_two ? _mm_loadu_si128((const __m128i *)(b0 + bb + 2)) : _mm_setzero_si128(), 1);
	*lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, low4));
	*hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
	uint16_t d0, d1 = 0;
	memcpy(&d0, b0, 2);
	if (has_two)
		memcpy(&d1, b0 + bb, 2);
	const __m128 d = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)d0 | (uint32_t)d1 << 16)));
	*w8 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d),
	                               _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

/* acc + one pair against one token's activations. AVX2: lo / hi are the signed levels, alo /
 * ahi their magnitudes; VNNI: lo / hi are levels + 128 (alo, ahi unused). */
ALWAYS_INLINE __m256 nl_pair_dot(bool vnni, __m256i lo, __m256i hi, __m256i alo, __m256i ahi,
                                 __m256 w8, const struct block_q8_0x2 *y, __m256 acc)
{
	const __m256i ylo = _mm256_loadu_si256((const __m256i *)y->lo);
	const __m256i yhi = _mm256_loadu_si256((const __m256i *)y->hi);
	__m256i s32;
	if (vnni) {
		const __m256i off = /* -128 · Σy of each lane's 8 activations */
		    _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)y->neg_sum16), 3);
		s32 = dpbusd(dpbusd(off, lo, ylo), hi, yhi);
	} else {
		const __m256i one = _mm256_set1_epi16(1);
		s32 =
		    _mm256_add_epi32(signed_dot(lo, alo, ylo, one), signed_dot(hi, ahi, yhi, one));
	}
	return _mm256_fmadd_ps(_mm256_mul_ps(w8, _mm256_loadu_ps(y->d)), _mm256_cvtepi32_ps(s32),
	                       acc);
}

/* form: bit 0 the VNNI form, bit 1 token-exact (every token in the two chains of NT = 1,
 * moek_isa_ops.dot_exact) */
ALWAYS_INLINE void nl_body(const void *w, const void *act, size_t as, const int NT, size_t k,
                           float *out, int form)
{
	const bool vnni = form & 1, two = NT == 1 || (form & 2);
	const size_t bb = sizeof(struct block_iq4_nl), nb = k / QK4_NL;
	const bool far = wide_activation((nb + 1) / 2 * sizeof(struct block_q8_0x2));
	const uint8_t *x = w;
	__m256 acc[8], acc1[8];
	for (int t = 0; t < NT; t++)
		acc[t] = acc1[t] = _mm256_setzero_ps();
	__m256i lo, hi, alo = _mm256_setzero_si256(), ahi = _mm256_setzero_si256();
	__m256 w8;
	size_t p = 0;
	if (two) { /* two accumulators (even / odd pairs): the FMA chain would bound */
		for (; p + 2 <= nb / 2; p += 2) {
			prefetch_ahead(x + 2 * p * bb, far);
			nl_pair_unpack(x + 2 * p * bb, true, vnni, &lo, &hi, &w8);
			if (!vnni)
				alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
			for (int t = 0; t < NT; t++)
				acc[t] = nl_pair_dot(
				    vnni, lo, hi, alo, ahi, w8,
				    (const struct block_q8_0x2 *)((const uint8_t *)act + t * as) +
				        p,
				    acc[t]);
			nl_pair_unpack(x + 2 * (p + 1) * bb, true, vnni, &lo, &hi, &w8);
			if (!vnni)
				alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
			for (int t = 0; t < NT; t++)
				acc1[t] = nl_pair_dot(
				    vnni, lo, hi, alo, ahi, w8,
				    (const struct block_q8_0x2 *)((const uint8_t *)act + t * as) +
				        p + 1,
				    acc1[t]);
		}
	}
	for (; 2 * p < nb; p++) {
		prefetch_ahead(x + 2 * p * bb, far);
		nl_pair_unpack(x + 2 * p * bb, 2 * p + 1 < nb, vnni, &lo, &hi, &w8);
		if (!vnni)
			alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
		for (int t = 0; t < NT; t++)
			acc[t] = nl_pair_dot(
			    vnni, lo, hi, alo, ahi, w8,
			    (const struct block_q8_0x2 *)((const uint8_t *)act + t * as) + p,
			    acc[t]);
	}
	for (int t = 0; t < NT; t++)
		out[t] = hsum(two ? _mm256_add_ps(acc[t], acc1[t]) : acc[t]);
}

/* ---- IQ4_XS ------------------------------------------------------------------------------ */

/* The 8 sub-block scales (ls - 32) of a super-block as int32 lanes: scale j's low 4 bits are
 * bits 4j..4j+3 of scales_l read as one little-endian u32, its high 2 bits bits 2j, 2j+1 of
 * scales_h. */
ALWAYS_INLINE __m256i xs_scales32(const struct block_iq4_xs *b)
{
	uint32_t l;
	memcpy(&l, b->scales_l, 4);
	const __m256i lo =
	    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)l),
	                                       _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
	                     _mm256_set1_epi32(15));
	const __m256i hi =
	    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b->scales_h),
	                                       _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
	                     _mm256_set1_epi32(3));
	return _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)),
	                        _mm256_set1_epi32(32));
}

ALWAYS_INLINE int32_t hsum_i32(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
	return _mm_cvtsi128_si32(s);
}

/* Sub-blocks 2c and 2c+1 at once: one 256-bit load and shift/mask of their 32 code bytes gives
 * elements 0-15 of both (lo: sub-block 2c in the low 128 bits, 2c+1 in the high) and 16-31
 * (hi); the activations are loaded in that order. Each int32 lane of the products then holds
 * one sub-block's elements, scaled by its 6-bit scale. The super-block's integer sum is
 * exact in both forms and reduced to one int32 per token before the f32 step, so the AVX2
 * and VNNI forms give the same bits:
 *   AVX2: maddubs of |level| and y signed by the level, madd by the lane's scale (int16);
 *   VNNI: vpdpbusd of level + 128 and y, times the lane's scale (int32), less
 *         128 · Σ_j scale_j · (sum of sub-block j's activations, from Q8_K's bsums). */
ALWAYS_INLINE void xs_body(const void *w, const void *act, size_t as, const int NT, size_t k,
                           float *out, bool vnni)
{
	const struct block_iq4_xs *x = w;
	const bool far = wide_activation(k / QK_K * sizeof(struct block_q8_K));
	const __m256i table = iq4_table(vnni), low4 = _mm256_set1_epi8(0x0F);
	__m128 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm_setzero_ps();
	for (size_t i = 0; i < k / QK_K; i++) {
		const uint8_t *blk = (const uint8_t *)(x + i);
		prefetch_ahead(blk, far), prefetch_ahead(blk + 64, far),
		    prefetch_ahead(blk + 128, far);
		const __m256i ls32 = xs_scales32(x + i);
		/* AVX2: the scales as int16 in both 128-bit lanes, scale j in word j */
		const __m256i ls16 = _mm256_broadcastsi128_si256(_mm_packs_epi32(
		    _mm256_castsi256_si128(ls32), _mm256_extracti128_si256(ls32, 1)));
		__m256i sumi[8];
		for (int t = 0; t < NT; t++) {
			sumi[t] = _mm256_setzero_si256();
			if (vnni) { /* -128 · Σ_j ls_j · (bsums[2j] + bsums[2j+1]) */
				const __m256i pairs = _mm256_or_si256(
				    _mm256_and_si256(ls32, _mm256_set1_epi32(0xFFFF)),
				    _mm256_slli_epi32(ls32, 16)); /* ls_j in both words of lane j */
				const __m256i b = _mm256_loadu_si256(
				    (const __m256i *)q8k_token(act, as, t, i)->bsums);
				sumi[t] = _mm256_sub_epi32(
				    sumi[t], _mm256_slli_epi32(_mm256_madd_epi16(b, pairs), 7));
			}
		}
		for (int c = 0; c < QK_K / 64; c++) {
			const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
			const __m256i wlo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, low4));
			const __m256i whi = _mm256_shuffle_epi8(
			    table, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
			__m256i s, alo = wlo, ahi = whi;
			if (vnni) { /* lanes 0-3: scale 2c, lanes 4-7: scale 2c+1 */
				s = _mm256_permutevar8x32_epi32(
				    ls32, _mm256_setr_epi32(2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1,
				                            2 * c + 1, 2 * c + 1, 2 * c + 1));
			} else { /* words 2c (low 128 bits) and 2c+1 (high) of ls16, broadcast */
				const char b0 = (char)(4 * c), b1 = (char)(4 * c + 1),
				           b2 = (char)(4 * c + 2), b3 = (char)(4 * c + 3);
				s = _mm256_shuffle_epi8(
				    ls16,
				    _mm256_setr_epi8(b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1,
				                     b0, b1, b0, b1, b2, b3, b2, b3, b2, b3, b2, b3,
				                     b2, b3, b2, b3, b2, b3, b2, b3));
				alo = _mm256_abs_epi8(wlo), ahi = _mm256_abs_epi8(whi);
			}
			for (int t = 0; t < NT; t++) {
				const int8_t *y = q8k_token(act, as, t, i)->qs + 64 * c;
				const __m256i ylo = _mm256_loadu2_m128i((const __m128i *)(y + 32),
				                                        (const __m128i *)y);
				const __m256i yhi = _mm256_loadu2_m128i((const __m128i *)(y + 48),
				                                        (const __m128i *)(y + 16));
				if (vnni) {
					const __m256i d32 = dpbusd(
					    dpbusd(_mm256_setzero_si256(), wlo, ylo), whi, yhi);
					sumi[t] =
					    _mm256_add_epi32(sumi[t], _mm256_mullo_epi32(d32, s));
				} else {
					sumi[t] = _mm256_add_epi32(
					    sumi[t],
					    _mm256_add_epi32(signed_dot(wlo, alo, ylo, s),
					                     signed_dot(whi, ahi, yhi, s)));
				}
			}
		}
		const float d = _cvtsh_ss(x[i].d);
		for (int t = 0; t < NT; t++)
			acc[t] = _mm_fmadd_ss(_mm_set_ss(d * q8k_token(act, as, t, i)->d),
			                      _mm_cvtsi32_ss(_mm_setzero_ps(), hsum_i32(sumi[t])),
			                      acc[t]);
	}
	for (int t = 0; t < NT; t++)
		out[t] = _mm_cvtss_f32(acc[t]);
}

/* ---- Entry points -------------------------------------------------------------------------
 * Specialised on the token count (accumulators in registers) and on the form; the VNNI forms
 * are compiled for the AVX-512 subset MOEK_FORM_VNNI needs (isa.c) (as x86_avx2.c's). */

/* The row dot (the shape of the group dots: the blocks hold their scales) and the many-row
 * entry of one format and form. */
#define IQ4_ENTRIES(fmt, body, attr, vnni)                                                         \
	X8_ENTRY(dot_##fmt, body, vnni, attr)                                                      \
	attr static void rows_##fmt(const void *w, size_t stride, size_t nr, const void *act,      \
	                            size_t k, float *out)                                          \
	{                                                                                          \
		for (size_t r = 0; r < nr; r++)                                                    \
			body((const uint8_t *)w + r * stride, act, 0, 1, k, out + r, vnni);        \
	}

IQ4_ENTRIES(nl_avx2, nl_body, , false)
IQ4_ENTRIES(nl_vnni, nl_body, VNNI_CODE, true)
IQ4_ENTRIES(xs_avx2, xs_body, , false)
IQ4_ENTRIES(xs_vnni, xs_body, VNNI_CODE, true)
X8_ENTRY(dot_nl_exact_avx2, nl_body, 2, )
X8_ENTRY(dot_nl_exact_vnni, nl_body, 3, VNNI_CODE)

/* The exported entries pick the form per call; the row dots' sr is unused (moek_dot_fn). */
#define IQ4_PICK_DOT(name, avx2, vnni)                                                             \
	void name(const void *w, const float *sr, const void *act, size_t as, size_t nt, size_t k, \
	          float *out)                                                                      \
	{                                                                                          \
		(void)sr;                                                                          \
		if (moek_isa_forms() & MOEK_FORM_VNNI)                                             \
			vnni(w, act, as, nt, k, out);                                              \
		else                                                                               \
			avx2(w, act, as, nt, k, out);                                              \
	}

IQ4_PICK_DOT(moek_avx2_dot_iq4_nl, dot_nl_avx2, dot_nl_vnni)
IQ4_PICK_DOT(moek_avx2_dot_iq4_nl_exact, dot_nl_exact_avx2, dot_nl_exact_vnni)
VNNI_PICK_ROWS(moek_avx2_rows_iq4_nl, rows_nl_avx2, rows_nl_vnni)
IQ4_PICK_DOT(moek_avx2_dot_iq4_xs, dot_xs_avx2, dot_xs_vnni)
VNNI_PICK_ROWS(moek_avx2_rows_iq4_xs, rows_xs_avx2, rows_xs_vnni)

/* ---- Interleaved IQ4_NL rows (moek_interleave, groups of 8) ------------------------------------
 * Per column 4 vectors of nibble bytes (vector v: elements 4v..4v+3 low, 16+4v.. high, lane r =
 * row r) and the 8 rows' f16 scales, against MOEK_ACT_Q8_0S activations: the Q8_0 group dot
 * (x86_avx2.c) on levels looked up from the nibbles — AVX2: the sign trick into maddubs +
 * madd; VNNI: levels + 128 (the table's own bytes) into vpdpbusd with a broadcast operand,
 * started from −128 · Σy. Exact integer sums either way: the same bits. With VBMI too
 * (MOEK_FORM_VBMI) the levels come from vpermb on the unmasked bytes (IQ4_XS's as well):
 * IQ4_XSx8 in L1 42 → 51 GB/s (docs/kernels.md). */

struct iq4_act4 {
	int8_t b[4];
};

/* acc + Σ over each lane's 4 bytes of the level w (signed; VNNI: w + 128) · the 4 bytes at y. */
ALWAYS_INLINE __m256i x8_iq4_dot4(bool vnni, __m256i acc, __m256i w, const int8_t *y)
{
	if (vnni) {
		__asm__("vpdpbusd %2%{1to8%}, %1, %0"
		        : "+v"(acc)
		        : "v"(w), "m"(*(const struct iq4_act4 *)y));
		return acc;
	}
	int32_t y4;
	memcpy(&y4, y, 4);
	const __m256i ys = _mm256_sign_epi8(_mm256_set1_epi32(y4), w);
	return _mm256_add_epi32(acc,
	                        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), ys),
	                                          _mm256_set1_epi16(1)));
}

/* The levels of the low and high nibbles of q (VNNI: + 128). form 2 (VBMI): vpermb reads 5
 * index bits and the table holds the 16 levels twice, so neither nibble needs a mask. */
ALWAYS_INLINE void x8_iq4_levels(int form, __m256i table, __m256i q, __m256i *lo, __m256i *hi)
{
	if (form == 2) {
		const __m256i qh = _mm256_srli_epi16(q, 4);
		__asm__("vpermb %1, %2, %0" : "=v"(*lo) : "v"(table), "v"(q));
		__asm__("vpermb %1, %2, %0" : "=v"(*hi) : "v"(table), "v"(qh));
		return;
	}
	const __m256i low4 = _mm256_set1_epi8(0x0F);
	*lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, low4));
	*hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
}

#define X8_IQ4_NL_BYTES (MOEK_INTERLEAVE * 18)

ALWAYS_INLINE void x8_nl_body(const void *group, const void *act, size_t as, const int NT, size_t k,
                              float *out, int form) /* 0 AVX2, 1 VNNI, 2 + VBMI */
{
	const bool vnni = form != 0;
	const uint8_t *col = group;
	const __m256i table = iq4_table(vnni);
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	struct x8_stream pf = x8_stream_at(col, NT);
	for (size_t b = 0; b < k / QK4_NL; b++, col += X8_IQ4_NL_BYTES) {
		x8_prefetch(&pf, col + X8_IQ4_NL_BYTES);
		/* one token: four chains (low/high levels, even/odd vector) */
		__m256i sum[8], chain[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
		                            _mm256_setzero_si256()};
		for (int t = 0; t < NT; t++) {
			const struct block_q8_0s *y =
			    (const struct block_q8_0s *)((const uint8_t *)act + (size_t)t * as) + b;
			sum[t] =
			    vnni ? _mm256_set1_epi32(8 * y->neg16_sum) : _mm256_setzero_si256();
		}
		for (int v = 0; v < 4; v++) {
			const __m256i q = _mm256_loadu_si256((const __m256i *)(col + 32 * v));
			__m256i lo, hi;
			x8_iq4_levels(form, table, q, &lo, &hi);
			for (int t = 0; t < NT; t++) {
				const int8_t *y =
				    ((const struct block_q8_0s *)((const uint8_t *)act +
				                                  (size_t)t * as) +
				     b)
				        ->qs;
				__m256i *s_lo = NT == 1 && v % 2 ? &chain[0] : &sum[t];
				__m256i *s_hi = NT == 1 ? &chain[1 + v % 2] : &sum[t];
				*s_lo = x8_iq4_dot4(vnni, *s_lo, lo, y + 4 * v);
				*s_hi = x8_iq4_dot4(vnni, *s_hi, hi, y + 16 + 4 * v);
			}
		}
		if (NT == 1)
			sum[0] = _mm256_add_epi32(_mm256_add_epi32(sum[0], chain[0]),
			                          _mm256_add_epi32(chain[1], chain[2]));
		const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(col + 128)));
		for (int t = 0; t < NT; t++) {
			const struct block_q8_0s *y =
			    (const struct block_q8_0s *)((const uint8_t *)act + (size_t)t * as) + b;
			acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(y->d)),
			                         _mm256_cvtepi32_ps(sum[t]), acc[t]);
		}
	}
	for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(out + 8 * t, acc[t]);
}

/* ---- Interleaved IQ4_XS rows ---------------------------------------------------------------
 * Per super-block column 8 f16 d, the 8 rows' scales_h words, one vector of scales_l (lane r:
 * row r's 4 bytes, sub-block j's low 4 bits at bits 4j..4j+3 of the word) and 32 vectors of
 * nibble bytes (vector v: sub-block v / 4, elements 4 (v % 4).. low, 16 + 4 (v % 4).. high),
 * against Q8_K activations. A 32-element sub-block's sum of level · y is exact in int32 (AVX2:
 * the sign trick, maddubs and madd by 1; VNNI: levels + 128 into vpdpbusd from −128 · Σy, the
 * bsums' pair) and goes into the f32 sums with its scale d · (ls − 32) · dy: one convert and
 * one FMA per sub-block and token, the same float steps in both forms. */

#define X8_IQ4_XS_BYTES (MOEK_INTERLEAVE * 136)

ALWAYS_INLINE void x8_xs_body(const void *group, const void *act, size_t as, const int NT, size_t k,
                              float *out, int form) /* 0 AVX2, 1 VNNI, 2 + VBMI */
{
	const bool vnni = form != 0;
	const uint8_t *col = group;
	const __m256i table = iq4_table(vnni);
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	struct x8_stream pf = x8_stream_at(col, NT);
	for (size_t i = 0; i < k / QK_K; i++, col += X8_IQ4_XS_BYTES) {
		x8_prefetch(&pf, col + X8_IQ4_XS_BYTES);
		const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)col));
		const __m256i sh =
		    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(col + 16)));
		const __m256i sl = _mm256_loadu_si256((const __m256i *)(col + 32));
#pragma GCC unroll 8
		for (int ib = 0; ib < 8; ib++) {
			const __m256i ls = _mm256_or_si256(
			    _mm256_and_si256(_mm256_srli_epi32(sl, 4 * ib), _mm256_set1_epi32(15)),
			    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sh, 2 * ib),
			                                       _mm256_set1_epi32(3)),
			                      4));
			const __m256 f = _mm256_mul_ps(
			    d, _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))));
			__m256i p[8];
			for (int t = 0; t < NT; t++) {
				const int16_t *bs = q8k_token(act, as, t, i)->bsums + 2 * ib;
				p[t] = vnni ? _mm256_set1_epi32(-128 * (bs[0] + bs[1]))
				            : _mm256_setzero_si256();
			}
#pragma GCC unroll 4
			for (int u = 0; u < 4; u++) {
				const __m256i q = _mm256_loadu_si256(
				    (const __m256i *)(col + 64 + 32 * (4 * ib + u)));
				__m256i lo, hi;
				x8_iq4_levels(form, table, q, &lo, &hi);
				for (int t = 0; t < NT; t++) {
					const int8_t *y =
					    q8k_token(act, as, t, i)->qs + 32 * ib + 4 * u;
					p[t] = x8_iq4_dot4(vnni, p[t], lo, y);
					p[t] = x8_iq4_dot4(vnni, p[t], hi, y + 16);
				}
			}
			for (int t = 0; t < NT; t++)
				acc[t] = _mm256_fmadd_ps(
				    _mm256_cvtepi32_ps(p[t]),
				    _mm256_mul_ps(f, _mm256_set1_ps(q8k_token(act, as, t, i)->d)),
				    acc[t]);
		}
	}
	for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(out + 8 * t, acc[t]);
}

X8_ENTRY(x8_xs_avx2, x8_xs_body, 0, )
X8_ENTRY(x8_xs_vnni, x8_xs_body, 1, VNNI_CODE)
X8_ENTRY(x8_xs_vbmi, x8_xs_body, 2, VNNI_CODE)

X8_ENTRY(x8_nl_avx2, x8_nl_body, 0, )
X8_ENTRY(x8_nl_vnni, x8_nl_body, 1, VNNI_CODE)
X8_ENTRY(x8_nl_vbmi, x8_nl_body, 2, VNNI_CODE)

/* The form per call, as MXFP4's group dot picks it (x86_avx2.c). */
#define X8_IQ4_PICK(name, avx2, vnni, vbmi)                                                        \
	void name(const void *g, const void *act, size_t as, size_t nt, size_t k, float *out)      \
	{                                                                                          \
		if (!(moek_isa_forms() & MOEK_FORM_VNNI))                                          \
			avx2(g, act, as, nt, k, out);                                              \
		else if (moek_isa_forms() & MOEK_FORM_VBMI)                                        \
			vbmi(g, act, as, nt, k, out);                                              \
		else                                                                               \
			vnni(g, act, as, nt, k, out);                                              \
	}
X8_IQ4_PICK(moek_avx2_x8_iq4_nl, x8_nl_avx2, x8_nl_vnni, x8_nl_vbmi)
X8_IQ4_PICK(moek_avx2_x8_iq4_xs, x8_xs_avx2, x8_xs_vnni, x8_xs_vbmi)

/* ---- Prefill dequantization ---------------------------------------------------------------- */

size_t moek_avx2_dequantize_iq4(uint32_t format, const void *w, float *dst, size_t k)
{
	const __m256i table = iq4_table(false);
	size_t i = 0;
	if (format == MOEK_IQ4_NL) {
		for (const struct block_iq4_nl *b = w; i + QK4_NL <= k; i += QK4_NL, b++)
			store_i8x32_lanes(_mm256_shuffle_epi8(table, nibbles_32(b->qs)),
			                  _mm256_set1_ps(_cvtsh_ss(b->d)), dst + i);
	} else if (format == MOEK_IQ4_XS) {
		for (const struct block_iq4_xs *b = w; i + QK_K <= k; i += QK_K, b++) {
			const float d = _cvtsh_ss(b->d);
			for (int ib = 0; ib < QK_K / 32; ib++)
				store_i8x32_lanes(
				    _mm256_shuffle_epi8(table, nibbles_32(b->qs + 16 * ib)),
				    _mm256_set1_ps(d * (float)moek_iq4_xs_scale(b, ib)),
				    dst + i + 32 * ib);
		}
	}
	return i;
}
