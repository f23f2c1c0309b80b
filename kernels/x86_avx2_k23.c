/* x86_avx2_k23.c — AVX2 paths of Q2_K and Q3_K (x86_avx2.h; listed in moek_avx2_ops).
 *
 * Decode: one weight row against 1..8 Q8_K activation rows, the row decoded once for all
 * tokens. Per 256-element super-block, each 32-byte load of qs gives the 2-bit codes of four
 * 32-element chunks (shifts 0, 2, 4, 6); a chunk is two 16-element sub-blocks, so maddubs
 * (codes unsigned, activations signed) and madd against a vector holding the two sub-blocks'
 * scales (int16, one per half) give exact int32 sums with the scales applied, one f32 FMA per
 * super-block and token. The constant parts go through Q8_K's 16-element bsums: Q2_K's mins
 * (dmin · Σ m_j · bsum_j, subtracted), Q3_K's −4 of a clear hmask bit (the code enters as
 * low2 + 4 · hbit in 0..7, and 4 · Σ (sc_j − 32) · bsum_j comes back out).
 * VNNI form (MOEK_FORM_VNNI, where the CPU has AVX512-VNNI + VL): vpdpwssd does the madd and
 * the add in one, into chains per token that cover its latency; the int32 sums are exact
 * either way, so the bits are the plain form's.
 * Prefill: dequantization, bit-identical to formats.c (the same products and roundings).
 *
 * The summation order depends only on k: split determinism as every dot (kernels_internal.h).
 */
#include <string.h>

#include "x86_avx2.h"

/* int16 vector of sub-block scale 2c in lanes 0-7 and 2c + 1 in lanes 8-15 from `b`, which
 * holds the 8 scales of chunk c's half as bytes (zero-extended: Q2_K) in both 128-bit lanes.
 * Byte 0x80 in a shuffle control gives 0. */
ALWAYS_INLINE __m256i pair_u8(__m256i b, int c)
{
	const short lo = (short)(0x8000 | (2 * c) % 8), hi = (short)(0x8000 | (2 * c + 1) % 8);
	return _mm256_shuffle_epi8(b, _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)));
}

/* The same from int16 scales (Q3_K's signed ones): `w` holds the 8 int16 scales of chunk c's
 * half in both 128-bit lanes. */
ALWAYS_INLINE __m256i pair_i16(__m256i w, int c)
{
	const int i0 = (2 * c) % 8, i1 = (2 * c + 1) % 8;
	const short lo = (short)(2 * i0 | (2 * i0 + 1) << 8),
	            hi = (short)(2 * i1 | (2 * i1 + 1) << 8);
	return _mm256_shuffle_epi8(w, _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)));
}

/* The 2-bit codes of chunks 4h .. 4h + 3 (q[s]: elements 128h + 32s + 0..31). */
ALWAYS_INLINE void codes_2bit(const uint8_t *qs, __m256i q[4])
{
	const __m256i three = _mm256_set1_epi8(3);
	const __m256i v = _mm256_loadu_si256((const __m256i *)qs);
	q[0] = _mm256_and_si256(v, three);
	q[1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), three);
	q[2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), three);
	q[3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), three);
}

/* Q3_K's 16 scales minus 32 as int16 (moek_q3_scales in registers: a scalar unpack through
 * memory stalls each block on store forwarding). Low nibbles: bytes 0-7 (scales 0-7), their
 * high nibbles (8-15); high 2 bits: byte 8 + j % 4 — the 4 bytes broadcast to every 32-bit
 * lane — shifted right by 2 (j / 4), lane j / 4's count. */
ALWAYS_INLINE __m256i q3_scales_i16(const uint8_t s[K_SCALE_SIZE])
{
	const __m128i low4 = _mm_set1_epi8(0x0F), three = _mm_set1_epi8(3);
	const __m128i b = _mm_loadl_epi64((const __m128i *)s);
	const __m128i lo =
	    _mm_unpacklo_epi64(_mm_and_si128(b, low4), _mm_and_si128(_mm_srli_epi16(b, 4), low4));
	int32_t top;
	memcpy(&top, s + 8, sizeof(top));
	const __m128i hi =
	    _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(top), _mm_setr_epi32(0, 2, 4, 6)), three);
	const __m128i sc = _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
	return _mm256_sub_epi16(_mm256_cvtepu8_epi16(sc), _mm256_set1_epi16(32));
}

/* Chains of int32 sums per token: one, except for the VNNI form at one or two tokens, where
 * vpdpwssd's latency (not covered by other tokens' chains) wants four in flight. More chains
 * at more tokens spill registers (Q3_K at 8 tokens: 0.7 of the plain form's speed). */
#define K23_CHAINS(vnni, NT) ((vnni) && (NT) <= 2 ? 4 / (NT) : 1)

/* Chain s % chains of one token += madd(p, scv). */
ALWAYS_INLINE void add_scaled(bool vnni, int chains, __m256i *sumi, int s, __m256i p, __m256i scv)
{
	__m256i *c = &sumi[s % chains];
	*c = vnni ? dpwssd(*c, p, scv) : _mm256_add_epi32(*c, _mm256_madd_epi16(p, scv));
}

/* The chains' total, in chain order. */
ALWAYS_INLINE __m256i chains_total(const __m256i *sumi, int chains)
{
	__m256i s = sumi[0];
	for (int c = 1; c < chains; c++)
		s = _mm256_add_epi32(s, sumi[c]);
	return s;
}

/* Q3_K: 4 · (bit 4h + s of each hmask byte), added to chunk 4h + s's low bits. */
ALWAYS_INLINE __m256i hbit4(__m256i hmask, int n)
{
	const __m256i bit = _mm256_and_si256(hmask, _mm256_set1_epi8((char)(1 << n)));
	return n >= 2 ? _mm256_srli_epi16(bit, n - 2) : _mm256_slli_epi16(bit, 2 - n);
}

ALWAYS_INLINE void q2k_body(const void *w, const float *sr, const void *act, size_t as,
                            const int NT, size_t k, float *out, bool vnni)
{
	(void)sr;
	const struct block_q2_K *x = w;
	const bool far = wide_activation(k / QK_K * sizeof(struct block_q8_K));
	const __m128i low4 = _mm_set1_epi8(0x0F);
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	for (size_t i = 0; i < k / QK_K; i++) {
		prefetch_ahead(x + i, far), prefetch_ahead((const uint8_t *)(x + i) + 64, far);
		const __m128i sm = _mm_loadu_si128((const __m128i *)x[i].scales);
		const __m128i sc = _mm_and_si128(sm, low4);
		const __m256i mins =
		    _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), low4));
		/* scales 0-7 (chunks 0-3) and 8-15 (chunks 4-7), each in both 128-bit lanes */
		const __m256i sc_half[2] = {_mm256_broadcastsi128_si256(sc),
		                            _mm256_broadcastsi128_si256(_mm_srli_si128(sc, 8))};
		const int ch = K23_CHAINS(vnni, NT);
		__m256i sumi[8][4];
		for (int t = 0; t < NT; t++)
			for (int c = 0; c < ch; c++)
				sumi[t][c] = _mm256_setzero_si256();
		for (int h = 0; h < 2; h++) {
			__m256i q[4];
			codes_2bit(x[i].qs + 32 * h, q);
			for (int s = 0; s < 4; s++) {
				const __m256i scv = pair_u8(sc_half[h], 4 * h + s);
				for (int t = 0; t < NT; t++) {
					const int8_t *yq =
					    q8k_token(act, as, t, i)->qs + 128 * h + 32 * s;
					const __m256i y = _mm256_loadu_si256((const __m256i *)yq);
					add_scaled(vnni, ch, sumi[t], s,
					           _mm256_maddubs_epi16(q[s], y), scv);
				}
			}
		}
		const float d = f16(x[i].d), dmin = f16(x[i].dmin);
		for (int t = 0; t < NT; t++) {
			const struct block_q8_K *y = q8k_token(act, as, t, i);
			const __m256i m =
			    _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y->bsums));
			acc[t] =
			    _mm256_fmadd_ps(_mm256_set1_ps(d * y->d),
			                    _mm256_cvtepi32_ps(chains_total(sumi[t], ch)), acc[t]);
			acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * y->d),
			                          _mm256_cvtepi32_ps(m), acc[t]);
		}
	}
	for (int t = 0; t < NT; t++)
		out[t] = hsum(acc[t]);
}

ALWAYS_INLINE void q3k_body(const void *w, const float *sr, const void *act, size_t as,
                            const int NT, size_t k, float *out, bool vnni)
{
	(void)sr;
	const struct block_q3_K *x = w;
	const bool far = wide_activation(k / QK_K * sizeof(struct block_q8_K));
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	for (size_t i = 0; i < k / QK_K; i++) {
		prefetch_ahead(x + i, far), prefetch_ahead((const uint8_t *)(x + i) + 64, far);
		const __m256i sc16 = q3_scales_i16(x[i].scales);
		const __m256i sc_half[2] = {_mm256_permute4x64_epi64(sc16, 0x44),
		                            _mm256_permute4x64_epi64(sc16, 0xEE)};
		const __m256i hmask = _mm256_loadu_si256((const __m256i *)x[i].hmask);
		const int ch = K23_CHAINS(vnni, NT);
		__m256i sumi[8][4];
		for (int t = 0; t < NT; t++) { /* codes carry +4: take 4 · Σ sc_j · bsum_j out */
			const __m256i bs =
			    _mm256_loadu_si256((const __m256i *)q8k_token(act, as, t, i)->bsums);
			sumi[t][0] =
			    _mm256_sub_epi32(_mm256_setzero_si256(),
			                     _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 2));
			for (int c = 1; c < ch; c++)
				sumi[t][c] = _mm256_setzero_si256();
		}
		for (int h = 0; h < 2; h++) {
			__m256i q[4];
			codes_2bit(x[i].qs + 32 * h, q);
			for (int s = 0; s < 4; s++) {
				const __m256i qv = _mm256_or_si256(q[s], hbit4(hmask, 4 * h + s));
				const __m256i scv = pair_i16(sc_half[h], 4 * h + s);
				for (int t = 0; t < NT; t++) {
					const int8_t *yq =
					    q8k_token(act, as, t, i)->qs + 128 * h + 32 * s;
					const __m256i y = _mm256_loadu_si256((const __m256i *)yq);
					add_scaled(vnni, ch, sumi[t], s,
					           _mm256_maddubs_epi16(qv, y), scv);
				}
			}
		}
		const float d = f16(x[i].d);
		for (int t = 0; t < NT; t++)
			acc[t] =
			    _mm256_fmadd_ps(_mm256_set1_ps(d * q8k_token(act, as, t, i)->d),
			                    _mm256_cvtepi32_ps(chains_total(sumi[t], ch)), acc[t]);
	}
	for (int t = 0; t < NT; t++)
		out[t] = hsum(acc[t]);
}

/* The entry points, specialised on the token count and the form; the VNNI forms are compiled
 * for the AVX-512 subset MOEK_FORM_VNNI needs (isa.c), as x86_avx2.c's. */
DOT_ENTRY(dot_q2_K_avx2, q2k_body, false)
DOT_ENTRY(dot_q3_K_avx2, q3k_body, false)
ROWS_ENTRY(rows_q2_K_avx2, q2k_body, false)
ROWS_ENTRY(rows_q3_K_avx2, q3k_body, false)
VNNI_DOT_ENTRY(dot_q2_K_vnni, q2k_body, true)
VNNI_DOT_ENTRY(dot_q3_K_vnni, q3k_body, true)
VNNI_ROWS_ENTRY(rows_q2_K_vnni, q2k_body, true)
VNNI_ROWS_ENTRY(rows_q3_K_vnni, q3k_body, true)
VNNI_PICK_DOT(moek_avx2_dot_q2_K, dot_q2_K_avx2, dot_q2_K_vnni)
VNNI_PICK_DOT(moek_avx2_dot_q3_K, dot_q3_K_avx2, dot_q3_K_vnni)
VNNI_PICK_ROWS(moek_avx2_rows_q2_K, rows_q2_K_avx2, rows_q2_K_vnni)
VNNI_PICK_ROWS(moek_avx2_rows_q3_K, rows_q3_K_avx2, rows_q3_K_vnni)

/* ---- Interleaved rows (moek_interleave, groups of 8) ------------------------------------------
 *
 * A column holds one super-block of each of 8 rows; each 32-byte vector carries 4 bytes of
 * every row (lane r = row r). Q2_K: 8 f16 d, 8 f16 dmin, 4 vectors of the scale bytes (vector
 * g: sub-blocks 4g..4g+3, low nibble scale, high nibble min), 16 vectors of qs (vector v: qs
 * bytes 4v..4v+3, whose shifts 0, 2, 4, 6 give elements 128h + 32s + 16 half + 4u + 0..3 for
 * v = 8h + 4 half + u). Q3_K: 8 f16 d, 3 vectors of the packed scales (bytes 4g..4g+3 of the
 * 12), 8 vectors of hmask (vector w: hmask bytes 4w..4w+3, i.e. elements l = 4w.. of every
 * chunk), 16 vectors of qs as Q2_K's.
 * One multiply takes 4 codes of each of the 8 rows against 4 broadcast Q8_K activations;
 * the four vectors of a 16-element sub-block are summed in int16 (AVX2: maddubs pairs at most
 * 2 · 7 · 128, four of them 7168) and scaled by one madd against the lanes' scales, or, in the
 * VNNI form, summed by vpdpbusd into int32 and scaled by one vpmulld. Q2_K's mins and Q3_K's
 * −4 offset go through Q8_K's 16-element bsums, one madd per two sub-blocks of each lane.
 * The integer sums are exact in both forms (the same bits); against the row dots only the
 * float sums are reassociated. */

/* Four activation bytes, read as one broadcast operand. */
struct k23_act4 {
	int8_t b[4];
};

/* acc + Σ over each lane's 4 bytes of u (unsigned) · the 4 signed bytes at y: VNNI only. */
ALWAYS_INLINE __m256i x8_dpbusd4(__m256i acc, __m256i u, const int8_t *y)
{
	__asm__("vpdpbusd %2%{1to8%}, %1, %0"
	        : "+v"(acc)
	        : "v"(u), "m"(*(const struct k23_act4 *)y));
	return acc;
}

ALWAYS_INLINE __m256i x8_bcast4(const int8_t *y)
{
	int32_t v;
	memcpy(&v, y, 4);
	return _mm256_set1_epi32(v);
}

/* Byte b of each int32 lane of v, zero-extended to the lane — or, as_int16_pairs, to both of
 * its int16 words (the madd operand form). */
ALWAYS_INLINE __m256i x8_lane_byte(__m256i v, int b, bool as_int16_pairs)
{
	const __m256i at = as_int16_pairs ? _mm256_setr_epi32(0, 0x40004, 0x80008, 0xc000c, 0,
	                                                      0x40004, 0x80008, 0xc000c)
	                                  : _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12);
	const uint32_t pick = as_int16_pairs ? 0x80008000u | (uint32_t)b | (uint32_t)b << 16
	                                     : 0x80808000u | (uint32_t)b;
	return _mm256_shuffle_epi8(v, _mm256_add_epi32(_mm256_set1_epi32((int32_t)pick), at));
}

/* Bytes b and b + 1 of each int32 lane of v, zero-extended to its two int16 words. */
ALWAYS_INLINE __m256i x8_lane_pair(__m256i v, int b)
{
	const uint32_t pick = 0x80008000u | (uint32_t)b | (uint32_t)(b + 1) << 16;
	return _mm256_shuffle_epi8(
	    v, _mm256_add_epi32(
	           _mm256_set1_epi32((int32_t)pick),
	           _mm256_setr_epi32(0, 0x40004, 0x80008, 0xc000c, 0, 0x40004, 0x80008, 0xc000c)));
}

/* Σ_j sc_j · bsum_j over the 16 sub-blocks, per lane: sc4[g] holds sub-blocks 4g..4g+3 as
 * the bytes of each lane (zero-extended, minus `bias`), bs the token's bsums. */
ALWAYS_INLINE __m256i x8_bsum_dot(bool vnni, const __m256i pairs[8], const int16_t *bs)
{
	__m256i s = _mm256_setzero_si256();
	for (int p = 0; p < 8; p++) {
		int32_t two;
		memcpy(&two, bs + 2 * p, 4);
		const __m256i b = _mm256_set1_epi32(two);
		s = vnni ? dpwssd(s, pairs[p], b)
		         : _mm256_add_epi32(s, _mm256_madd_epi16(pairs[p], b));
	}
	return s;
}

/* The codes of shift s (0..3) of a qs vector times x8_code_factor(vnni, s): one mask per
 * code vector where that factor is allowed — VNNI: in place, 4^s · code (vpdpbusd sums into
 * int32); AVX2: 4^(s % 2) · code, the shift by 4 shared by s = 2 and 3 (maddubs pairs of
 * 12 · 128 summed four times stay within int16). */
ALWAYS_INLINE __m256i x8_low2(bool vnni, __m256i q, int s)
{
	if (vnni)
		return _mm256_and_si256(q, _mm256_set1_epi8((char)(3 << 2 * s)));
	const __m256i r = s >= 2 ? _mm256_srli_epi16(q, 4) : q;
	return _mm256_and_si256(r, _mm256_set1_epi8((char)(s % 2 ? 12 : 3)));
}
/* log2 of the factor the codes of shift s carry (x8_low2). */
ALWAYS_INLINE int x8_code_shift(bool vnni, int s)
{
	return vnni ? 2 * s : 2 * (s % 2);
}

/* isum + scale · Σ_u code[u] · y[4u..4u+3] for one sub-block of one token, the codes
 * carrying a factor 2^shift (divided back out exactly: every product is a multiple). */
ALWAYS_INLINE __m256i x8_sub_block(bool vnni, __m256i isum, const __m256i c[4], int shift,
                                   const int8_t *y, __m256i scv)
{
	if (vnni) {
		__m256i p = _mm256_setzero_si256();
		for (int u = 0; u < 4; u++)
			p = x8_dpbusd4(p, c[u], y + 4 * u);
		if (shift) /* now at most 16 · 3 · 128: an int16 in its lane's low word */
			p = _mm256_srai_epi32(p, shift);
		return dpwssd(isum, p, scv); /* scv: the scale in the low word, 0 in the high */
	}
	__m256i p = _mm256_maddubs_epi16(c[0], x8_bcast4(y));
	for (int u = 1; u < 4; u++)
		p = _mm256_add_epi16(p, _mm256_maddubs_epi16(c[u], x8_bcast4(y + 4 * u)));
	if (shift)
		p = _mm256_srai_epi16(p, shift);
	return _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv));
}

#define X8_Q2K_BYTES (MOEK_INTERLEAVE * 84)
#define X8_Q3K_BYTES (MOEK_INTERLEAVE * 110)

ALWAYS_INLINE void x8_q2k_body(const void *group, const void *act, size_t as, const int NT,
                               size_t k, float *out, bool vnni)
{
	const uint8_t *col = group;
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	struct x8_stream pf = x8_stream_at(col, NT);
	for (size_t i = 0; i < k / QK_K; i++, col += X8_Q2K_BYTES) {
		x8_prefetch(&pf, col + X8_Q2K_BYTES);
		const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)col));
		const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(col + 16)));
		__m256i sc[4], mpair[8];
		for (int g = 0; g < 4; g++) {
			const __m256i v = _mm256_loadu_si256((const __m256i *)(col + 32 + 32 * g));
			sc[g] = _mm256_and_si256(v, m4);
			const __m256i mn = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
			mpair[2 * g] = x8_lane_pair(mn, 0);
			mpair[2 * g + 1] = x8_lane_pair(mn, 2);
		}
		__m256i isum[8];
		for (int t = 0; t < NT; t++) {
			const struct block_q8_K *y = q8k_token(act, as, t, i);
			const __m256i msum = x8_bsum_dot(vnni, mpair, y->bsums);
			acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, _mm256_set1_ps(y->d)),
			                          _mm256_cvtepi32_ps(msum), acc[t]);
			isum[t] = _mm256_setzero_si256();
		}
		/* unrolled whole: shift counts, masks and shuffle controls are constants */
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
			for (int half = 0; half < 2; half++) {
				__m256i q[4];
				for (int u = 0; u < 4; u++)
					q[u] = _mm256_loadu_si256(
					    (const __m256i *)(col + 160 +
					                      32 * (8 * h + 4 * half + u)));
#pragma GCC unroll 4
				for (int s = 0; s < 4; s++) {
					const int j = 8 * h + 2 * s + half;
					__m256i c[4];
					for (int u = 0; u < 4; u++)
						c[u] = x8_low2(vnni, q[u], s);
					const __m256i scv = x8_lane_byte(sc[j / 4], j % 4, !vnni);
					for (int t = 0; t < NT; t++)
						isum[t] = x8_sub_block(
						    vnni, isum[t], c, x8_code_shift(vnni, s),
						    q8k_token(act, as, t, i)->qs + 16 * j, scv);
				}
			}
		for (int t = 0; t < NT; t++)
			acc[t] = _mm256_fmadd_ps(
			    _mm256_mul_ps(d, _mm256_set1_ps(q8k_token(act, as, t, i)->d)),
			    _mm256_cvtepi32_ps(isum[t]), acc[t]);
	}
	for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(out + 8 * t, acc[t]);
}

/* Q3_K: the 3-bit codes (low2 + 4 · hbit) of shift s of a qs vector q, bit 4h + s of its hmask
 * vector hm, times 2^x8_q3_shift(vnni, s): the low bits masked where they are (VNNI: bits
 * 2s.., or 4.. for s = 3 after one shift; AVX2: bits 0 or 2, the shift by 4 shared by s = 2 and
 * 3, so that four maddubs pairs of 28 · 128 stay within int16) and the high bit moved next to
 * them. */
ALWAYS_INLINE int x8_q3_shift(bool vnni, int s)
{
	return vnni ? (s == 3 ? 4 : 2 * s) : 2 * (s % 2);
}
ALWAYS_INLINE __m256i x8_q3_code(bool vnni, __m256i q, __m256i hm, int h, int s)
{
	const int lo = x8_q3_shift(vnni, s), n = 4 * h + s, top = lo + 2;
	__m256i low;
	if (vnni)
		low = s == 3 ? _mm256_and_si256(_mm256_srli_epi16(q, 2), _mm256_set1_epi8(0x30))
		             : _mm256_and_si256(q, _mm256_set1_epi8((char)(3 << lo)));
	else
		low = _mm256_and_si256(s >= 2 ? _mm256_srli_epi16(q, 4) : q,
		                       _mm256_set1_epi8((char)(3 << lo)));
	/* the masked bit moves within its byte: never past bit 6, never below bit 0 */
	__m256i hb = _mm256_and_si256(hm, _mm256_set1_epi8((char)(1 << n)));
	if (top > n)
		hb = _mm256_slli_epi16(hb, top - n);
	else if (top < n)
		hb = _mm256_srli_epi16(hb, n - top);
	return _mm256_or_si256(low, hb);
}

/* The 16 6-bit scales of the 8 rows from the 3 vectors of packed bytes (moek_q3_scales in
 * lanes): sc4[q] holds sub-blocks 4q..4q+3 as the bytes of each lane, 0..63. */
ALWAYS_INLINE void x8_q3_scales(const uint8_t *p, __m256i sc4[4])
{
	const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3),
	              mc = _mm256_set1_epi8(0x0C), m30 = _mm256_set1_epi8(0x30);
	const __m256i v0 = _mm256_loadu_si256((const __m256i *)p);
	const __m256i v1 = _mm256_loadu_si256((const __m256i *)(p + 32));
	const __m256i v2 = _mm256_loadu_si256((const __m256i *)(p + 64));
	sc4[0] = _mm256_or_si256(_mm256_and_si256(v0, m4),
	                         _mm256_slli_epi16(_mm256_and_si256(v2, m3), 4));
	sc4[1] = _mm256_or_si256(_mm256_and_si256(v1, m4),
	                         _mm256_slli_epi16(_mm256_and_si256(v2, mc), 2));
	sc4[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), m4),
	                         _mm256_and_si256(v2, m30));
	sc4[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), m4),
	                         _mm256_and_si256(_mm256_srli_epi16(v2, 2), m30));
}

ALWAYS_INLINE void x8_q3k_body(const void *group, const void *act, size_t as, const int NT,
                               size_t k, float *out, bool vnni)
{
	const uint8_t *col = group;
	const __m256i w32 = _mm256_set1_epi16(32), l32 = _mm256_set1_epi32(32);
	__m256 acc[8];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	struct x8_stream pf = x8_stream_at(col, NT);
	for (size_t i = 0; i < k / QK_K; i++, col += X8_Q3K_BYTES) {
		x8_prefetch(&pf, col + X8_Q3K_BYTES);
		const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)col));
		__m256i sc[4], spair[8];
		x8_q3_scales(col + 16, sc);
		for (int q = 0; q < 4; q++) { /* (sc_j - 32, sc_j+1 - 32) as int16 words */
			spair[2 * q] = _mm256_sub_epi16(x8_lane_pair(sc[q], 0), w32);
			spair[2 * q + 1] = _mm256_sub_epi16(x8_lane_pair(sc[q], 2), w32);
		}
		__m256i isum[8];
		for (int t = 0; t < NT;
		     t++) /* codes carry +4: take 4 · Σ (sc_j - 32) · bsum_j out */
			isum[t] = _mm256_sub_epi32(
			    _mm256_setzero_si256(),
			    _mm256_slli_epi32(
			        x8_bsum_dot(vnni, spair, q8k_token(act, as, t, i)->bsums), 2));
			/* unrolled whole: shift counts, masks and shuffle controls are constants */
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
			for (int half = 0; half < 2; half++) {
				__m256i q[4], hm[4];
				for (int u = 0; u < 4; u++) {
					q[u] = _mm256_loadu_si256(
					    (const __m256i *)(col + 368 +
					                      32 * (8 * h + 4 * half + u)));
					hm[u] = _mm256_loadu_si256(
					    (const __m256i *)(col + 112 + 32 * (4 * half + u)));
				}
#pragma GCC unroll 4
				for (int s = 0; s < 4; s++) {
					const int j = 8 * h + 2 * s + half;
					__m256i c[4];
					for (int u = 0; u < 4; u++)
						c[u] = x8_q3_code(vnni, q[u], hm[u], h, s);
					/* sc_j - 32: in both int16 words (madd), or in the low
					 * word with 0 above it (vpdpwssd of an int16 sum) */
					const __m256i scv =
					    _mm256_sub_epi16(x8_lane_byte(sc[j / 4], j % 4, !vnni),
					                     vnni ? l32 : w32);
					for (int t = 0; t < NT; t++)
						isum[t] = x8_sub_block(
						    vnni, isum[t], c, x8_q3_shift(vnni, s),
						    q8k_token(act, as, t, i)->qs + 16 * j, scv);
				}
			}
		for (int t = 0; t < NT; t++)
			acc[t] = _mm256_fmadd_ps(
			    _mm256_mul_ps(d, _mm256_set1_ps(q8k_token(act, as, t, i)->d)),
			    _mm256_cvtepi32_ps(isum[t]), acc[t]);
	}
	for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(out + 8 * t, acc[t]);
}

X8_ENTRY(x8_q2_K_avx2, x8_q2k_body, false, )
X8_ENTRY(x8_q2_K_vnni, x8_q2k_body, true, VNNI_CODE)
VNNI_PICK_X8(moek_avx2_x8_q2_K, x8_q2_K_avx2, x8_q2_K_vnni)
X8_ENTRY(x8_q3_K_avx2, x8_q3k_body, false, )
X8_ENTRY(x8_q3_K_vnni, x8_q3k_body, true, VNNI_CODE)
VNNI_PICK_X8(moek_avx2_x8_q3_K, x8_q3_K_avx2, x8_q3_K_vnni)

/* ---- Prefill: dequantization ---------------------------------------------------------------- */

/* 32 codes (bytes) times the sub-block factors f0 (elements 0-15) and f1 (16-31), minus o0 / o1
 * (Q3_K: zero), each product and difference rounded once, as the reference. */
ALWAYS_INLINE void store_chunk(__m256i q, float f0, float f1, float o0, float o1, float *dst)
{
	const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
	const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
	for (int p = 0; p < 4; p++) {
		const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[p]));
		const __m256 f = _mm256_set1_ps(p < 2 ? f0 : f1),
		             o = _mm256_set1_ps(p < 2 ? o0 : o1);
		_mm256_storeu_ps(dst + 8 * p, _mm256_sub_ps(_mm256_mul_ps(f, v), o));
	}
}

void moek_avx2_dequantize_q2_K(const void *w, float *dst, size_t k)
{
	const struct block_q2_K *x = w;
	for (size_t i = 0; i < k / QK_K; i++, dst += QK_K) {
		const float d = f16(x[i].d), dmin = f16(x[i].dmin);
		float dsc[16], dm[16];
		for (int j = 0; j < 16; j++) {
			dsc[j] = d * (float)(x[i].scales[j] & 0xF);
			dm[j] = dmin * (float)(x[i].scales[j] >> 4);
		}
		for (int h = 0; h < 2; h++) {
			__m256i q[4];
			codes_2bit(x[i].qs + 32 * h, q);
			for (int s = 0; s < 4; s++) {
				const int j = 8 * h + 2 * s;
				store_chunk(q[s], dsc[j], dsc[j + 1], dm[j], dm[j + 1],
				            dst + 128 * h + 32 * s);
			}
		}
	}
}

void moek_avx2_dequantize_q3_K(const void *w, float *dst, size_t k)
{
	const struct block_q3_K *x = w;
	const __m256i four = _mm256_set1_epi8(4);
	for (size_t i = 0; i < k / QK_K; i++, dst += QK_K) {
		const float d = f16(x[i].d);
		uint8_t sc[16];
		float dsc[16];
		moek_q3_scales(x[i].scales, sc);
		for (int j = 0; j < 16; j++)
			dsc[j] = d * (float)(sc[j] - 32);
		const __m256i hmask = _mm256_loadu_si256((const __m256i *)x[i].hmask);
		for (int h = 0; h < 2; h++) {
			__m256i q[4];
			codes_2bit(x[i].qs + 32 * h, q);
			for (int s = 0; s < 4; s++) {
				const int j = 8 * h + 2 * s;
				const __m256i v = _mm256_sub_epi8(
				    _mm256_or_si256(q[s], hbit4(hmask, 4 * h + s)), four);
				store_chunk(v, dsc[j], dsc[j + 1], 0.0f, 0.0f,
				            dst + 128 * h + 32 * s);
			}
		}
	}
}
