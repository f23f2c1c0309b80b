/* x86_avx2_int4.c — AVX2 paths of MOEK_INT4_G32 (fmt_int4.c), entries of moek_avx2_ops.
 *
 * Compiled with -mavx2 -mfma -mf16c like x86_avx2.c and run only after isa.c's CPUID check.
 *
 * Decode: the row dot takes two 20-byte blocks at a time against one MOEK_ACT_Q8_0X2 pair,
 * as the Q4_0 dot does (one 256-bit load-and-mask gives elements 0-15 of both blocks in the
 * low nibbles, 16-31 in the high ones; lanes 0-3 of the integer sums are block 0's, 4-7 block
 * 1's). Codes enter maddubs unsigned (0..15); the zero point comes back out through the
 * activations' neg_sum16 (−16 · Σy of each lane's 8 activations): one vpmaddwd of those sums
 * by the lanes' zero points, added to 16 · Σ q·y (vpmaddwd by 16), gives 16 · Σ (q − z) · y
 * exactly in int32; the 1/16 goes into the f32 scale (a power of two: exact). Per pair that is
 * the Q4_0 dot plus one multiply-add and the header's unpack.
 *
 * Interleaved rows (moek_interleave, groups of 8): per column 4 vectors of nibble bytes
 * (vector v: elements 4v..4v+3 low, 16+4v.. high, lane r = row r) and one vector of the 8 rows'
 * scale-and-zero words. 4 codes of each of the 8 rows times 4 broadcast MOEK_ACT_Q8_0S
 * activations per multiply, as the MXFP4 group dot; the zero points come out through the
 * block's −16 · Σy (one vpmaddwd by the 8 lanes' zeros), the scales are one load. Where
 * MOEK_FORM_VNNI is on, each 4-code product is one vpdpbusd with a broadcast operand
 * instead of maddubs + madd (exact integer sums either way: the same bits).
 *
 * Prefill: dequantization for the f32 tiles, bit-identical to the reference (one rounding:
 * d · (q − z)).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels_internal.h"
#include "x86_avx2.h"

#define INT4_BLOCK 20

/* The pair of blocks at b (the second absent without has_two: zero codes, zero scale): codes
 * of elements 0-15 (ulo) and 16-31 (uhi) of both blocks, the lanes' scales / 16 and zero
 * points. */
ALWAYS_INLINE void int4_pair(const uint8_t *b, bool has_two, __m256i *ulo, __m256i *uhi, __m256 *w8,
                             __m256i *z8)
{
	const __m256i low4 = _mm256_set1_epi8(0x0F);
	const __m256i q = _mm256_inserti128_si256(
	    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b + 4))),
	    has_two ? _mm_loadu_si128((const __m128i *)(b + INT4_BLOCK + 4)) : _mm_setzero_si128(),
	    1);
	*ulo = _mm256_and_si256(q, low4);
	*uhi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
	uint32_t h0, h1 = 0;
	memcpy(&h0, b, 4);
	if (has_two)
		memcpy(&h1, b + INT4_BLOCK, 4);
	const __m256i h = _mm256_permutevar8x32_epi32(
	    _mm256_castsi128_si256(_mm_insert_epi32(_mm_cvtsi32_si128((int)h0), (int)h1, 1)),
	    _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
	const __m256i nib = _mm256_set1_epi32(15);
	*z8 = _mm256_and_si256(h, nib);
	*w8 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_andnot_si256(nib, h)),
	                    _mm256_set1_ps(1.0f / 16.0f));
}

/* acc + (d / 16) · dy · 16 · Σ (q − z) · y over the pair's lanes. The integer steps are exact:
 * maddubs pairs are at most 2 · 15 · 127, their sum 7620; times 16 and the zero term
 * (|neg_sum16| ≤ 16 · 8 · 127 fits the low int16 of its lane, whose high half is its sign,
 * multiplied by the zero lane's high half, 0) stay far inside int32. */
ALWAYS_INLINE __m256 int4_pair_dot(__m256i ulo, __m256i uhi, __m256 w8, __m256i z8,
                                   const struct block_q8_0x2 *y, __m256 acc)
{
	const __m256i ylo = _mm256_loadu_si256((const __m256i *)y->lo);
	const __m256i yhi = _mm256_loadu_si256((const __m256i *)y->hi);
	const __m256i p16 =
	    _mm256_add_epi16(_mm256_maddubs_epi16(ulo, ylo), _mm256_maddubs_epi16(uhi, yhi));
	const __m256i ns = _mm256_loadu_si256((const __m256i *)y->neg_sum16);
	const __m256i s32 = _mm256_add_epi32(_mm256_madd_epi16(p16, _mm256_set1_epi16(16)),
	                                     _mm256_madd_epi16(ns, z8));
	return _mm256_fmadd_ps(_mm256_mul_ps(w8, _mm256_loadu_ps(y->d)), _mm256_cvtepi32_ps(s32),
	                       acc);
}

/* exact: every token in the two chains of NT = 1 (moek_isa_ops.dot_exact) */
ALWAYS_INLINE void int4_body(const uint8_t *x, const void *act, size_t as, const int NT, size_t k,
                             float *out, bool exact)
{
	const size_t nb = k / QK_INT4;
	__m256 acc[MOEK_DOT_TOKENS], acc1[MOEK_DOT_TOKENS];
	for (int t = 0; t < NT; t++)
		acc[t] = acc1[t] = _mm256_setzero_ps();
	__m256i ulo, uhi, z8;
	__m256 w8;
	size_t p = 0;
	const bool two = NT == 1 || exact;
	if (two) /* two accumulators (even / odd pairs): the FMA chain would bound */
		for (; p + 2 <= nb / 2; p += 2) {
			_mm_prefetch((const char *)x + 2 * p * INT4_BLOCK + PREFETCH_AHEAD,
			             _MM_HINT_T0);
			int4_pair(x + 2 * p * INT4_BLOCK, true, &ulo, &uhi, &w8, &z8);
			for (int t = 0; t < NT; t++)
				acc[t] = int4_pair_dot(
				    ulo, uhi, w8, z8,
				    (const struct block_q8_0x2 *)((const uint8_t *)act + t * as) +
				        p,
				    acc[t]);
			int4_pair(x + 2 * (p + 1) * INT4_BLOCK, true, &ulo, &uhi, &w8, &z8);
			for (int t = 0; t < NT; t++)
				acc1[t] = int4_pair_dot(
				    ulo, uhi, w8, z8,
				    (const struct block_q8_0x2 *)((const uint8_t *)act + t * as) +
				        p + 1,
				    acc1[t]);
		}
	for (; 2 * p < nb; p++) {
		_mm_prefetch((const char *)x + 2 * p * INT4_BLOCK + PREFETCH_AHEAD, _MM_HINT_T0);
		int4_pair(x + 2 * p * INT4_BLOCK, 2 * p + 1 < nb, &ulo, &uhi, &w8, &z8);
		for (int t = 0; t < NT; t++)
			acc[t] = int4_pair_dot(
			    ulo, uhi, w8, z8,
			    (const struct block_q8_0x2 *)((const uint8_t *)act + t * as) + p,
			    acc[t]);
	}
	for (int t = 0; t < NT; t++)
		out[t] = hsum(two ? _mm256_add_ps(acc[t], acc1[t]) : acc[t]);
}

static void dot_int4(const void *w, const void *act, size_t as, size_t nt, size_t k, float *out,
                     bool exact)
{
	switch (nt) { /* a constant token count keeps the accumulators in registers */
	case 1: int4_body(w, act, as, 1, k, out, exact); break;
	case 2: int4_body(w, act, as, 2, k, out, exact); break;
	case 3: int4_body(w, act, as, 3, k, out, exact); break;
	case 4: int4_body(w, act, as, 4, k, out, exact); break;
	case 5: int4_body(w, act, as, 5, k, out, exact); break;
	case 6: int4_body(w, act, as, 6, k, out, exact); break;
	case 7: int4_body(w, act, as, 7, k, out, exact); break;
	default: int4_body(w, act, as, 8, k, out, exact); break;
	}
}

void moek_avx2_dot_int4(const void *w, const float *scale_row, const void *act, size_t as,
                        size_t nt, size_t k, float *out)
{
	(void)scale_row;
	dot_int4(w, act, as, nt, k, out, false);
}

void moek_avx2_dot_int4_exact(const void *w, const float *scale_row, const void *act, size_t as,
                              size_t nt, size_t k, float *out)
{
	(void)scale_row;
	dot_int4(w, act, as, nt, k, out, true);
}

void moek_avx2_rows_int4(const void *w, size_t row_stride, size_t nr, const void *act, size_t k,
                         float *out)
{
	for (size_t r = 0; r < nr; r++) /* the single-row entry's operations, row by row */
		int4_body((const uint8_t *)w + r * row_stride, act, 0, 1, k, out + r, false);
}

void moek_avx2_dequantize_int4(const void *w, float *dst, size_t k)
{
	const struct block_int4_g32 *b = w;
	const __m256i low4 = _mm256_set1_epi8(0x0F);
	for (size_t i = 0; i < k; i += QK_INT4, b++) {
		int z;
		const __m256 d = _mm256_set1_ps(moek_int4_scale(b, &z));
		const __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
		const __m256i codes = _mm256_and_si256(
		    _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
		    low4);
		const __m256i v = _mm256_sub_epi8(codes, _mm256_set1_epi8((char)z));
		const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
		const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
		for (int j = 0; j < 4; j++)
			_mm256_storeu_ps(
			    dst + i + 8 * j,
			    _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[j]))));
	}
}

/* Group dot step: acc + Σ over each lane's 4 low-nibble codes · the 4 activations at ylo and
 * its 4 high-nibble codes · those at yhi (broadcast to every lane). The two maddubs are added
 * in int16 before one madd: each pair sum is at most 2 · 15 · 127, both together 7620. */
/* Four activation bytes, read as one broadcast operand. */
struct act4 {
	int8_t b[4];
};

ALWAYS_INLINE __m256i x8_dot8(bool vnni, __m256i acc, __m256i lo, __m256i hi, const int8_t *ylo,
                              const int8_t *yhi)
{
	if (vnni) {
		__asm__("vpdpbusd %2%{1to8%}, %1, %0"
		        : "+v"(acc)
		        : "v"(lo), "m"(*(const struct act4 *)ylo));
		__asm__("vpdpbusd %2%{1to8%}, %1, %0"
		        : "+v"(acc)
		        : "v"(hi), "m"(*(const struct act4 *)yhi));
		return acc;
	}
	int32_t a, b;
	memcpy(&a, ylo, 4);
	memcpy(&b, yhi, 4);
	const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)),
	                                     _mm256_maddubs_epi16(hi, _mm256_set1_epi32(b)));
	return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

ALWAYS_INLINE void x8_int4_body(const uint8_t *col, const void *act, size_t as, const int NT,
                                size_t k, float *out, bool vnni)
{
	const __m256i low4 = _mm256_set1_epi8(0x0F), nib = _mm256_set1_epi32(15);
	__m256 acc[MOEK_DOT_TOKENS];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	for (size_t b = 0; b < k / QK_INT4; b++, col += MOEK_INTERLEAVE * INT4_BLOCK) {
		/* one token: two chains (even / odd vector) */
		__m256i sum[MOEK_DOT_TOKENS], chain = _mm256_setzero_si256();
		for (int t = 0; t < NT; t++)
			sum[t] = _mm256_setzero_si256();
		for (int v = 0; v < 4; v++) {
			const __m256i q = _mm256_loadu_si256((const __m256i *)(col + 32 * v));
			const __m256i lo = _mm256_and_si256(q, low4);
			const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
			for (int t = 0; t < NT; t++) {
				const struct block_q8_0s *y =
				    (const struct block_q8_0s *)((const uint8_t *)act + t * as) + b;
				__m256i *s = NT == 1 && v % 2 ? &chain : &sum[t];
				*s = x8_dot8(vnni, *s, lo, hi, y->qs + 4 * v, y->qs + 16 + 4 * v);
			}
		}
		if (NT == 1)
			sum[0] = _mm256_add_epi32(sum[0], chain);
		const __m256i h = _mm256_loadu_si256((const __m256i *)(col + 128));
		const __m256i z8 = _mm256_and_si256(h, nib);
		const __m256 d8 = _mm256_castsi256_ps(_mm256_andnot_si256(nib, h));
		for (int t = 0; t < NT; t++) {
			const struct block_q8_0s *y =
			    (const struct block_q8_0s *)((const uint8_t *)act + t * as) + b;
			/* −Σy (|Σy| ≤ 32 · 127: the low int16 of the lane) times each row's zero */
			const __m256i off =
			    _mm256_madd_epi16(z8, _mm256_set1_epi32(y->neg16_sum / 16));
			acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d8, _mm256_set1_ps(y->d)),
			                         _mm256_cvtepi32_ps(_mm256_add_epi32(sum[t], off)),
			                         acc[t]);
		}
	}
	for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(out + 8 * t, acc[t]);
}

X8_ENTRY(x8_int4_avx2, x8_int4_body, false, )
X8_ENTRY(x8_int4_vnni, x8_int4_body, true, VNNI_CODE)
VNNI_PICK_X8(moek_avx2_x8_int4, x8_int4_avx2, x8_int4_vnni)
