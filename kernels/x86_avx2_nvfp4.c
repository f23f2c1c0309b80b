/* x86_avx2_nvfp4.c — AVX2 paths of NVFP4 (fmt_nvfp4.c) for moek_avx2_ops (x86_avx2.c's table).
 *
 * Compiled with x86_avx2.c's flags and run only after its CPUID check.
 *
 * Decode: one 64-element block against one MOEK_ACT_Q8_0X2 pair (activation blocks 2p and
 * 2p+1: lo holds elements 0-15 and 32-47, hi 16-31 and 48-63). One 256-bit load of the 32 code
 * bytes, low and high nibbles masked apart, and two 64-bit unpacks put the codes in exactly that
 * order (sub-block s's bytes 8s..8s+7 hold elements 16s + j low, 16s + j + 8 high): lo's 128-bit
 * lanes are sub-blocks 0 and 2, hi's 1 and 3. The E2M1 levels (doubled, moek_mxfp4_kvalues)
 * come from one vpshufb; signed products through maddubs by the sign trick (|w| <= 12, so pair
 * sums stay far below 2^15) and madd by 1 give int32 lanes that each hold one sub-block's
 * elements against one activation block, so each lane takes one f32 scale: the sub-block's
 * UE4M3 (decoded four at a time, bit-exact with moek_ue4m3_half) times the activation's d.
 *
 * Prefill: dequantization bit-identical to the reference (one product, level · scale).
 *
 * As everywhere in the kernels, each result's summation order depends only on k.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "x86_avx2.h"

#define NVFP4_BLOCK 36

/* The 4 scale bytes at d as moek_ue4m3_half gives them. */
ALWAYS_INLINE __m128 ue4m3_half4(const uint8_t *d)
{
	uint32_t u;
	memcpy(&u, d, 4);
	const __m128i b = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)u));
	const __m128i nan = _mm_cmpeq_epi32(b, _mm_set1_epi32(0x7F));
	const __m128i x = _mm_and_si128(b, _mm_set1_epi32(0x7F));
	const __m128i sub =
	    _mm_cmpeq_epi32(_mm_and_si128(x, _mm_set1_epi32(0x78)), _mm_setzero_si128());
	const __m128 normal =
	    _mm_castsi128_ps(_mm_add_epi32(_mm_slli_epi32(x, 20), _mm_set1_epi32(119 << 23)));
	const __m128 small = _mm_mul_ps(_mm_cvtepi32_ps(x), _mm_set1_ps(0x1p-10f));
	const __m128 r = _mm_blendv_ps(normal, small, _mm_castsi128_ps(sub));
	return _mm_andnot_ps(_mm_castsi128_ps(nan), r);
}

/* The block at b: signed doubled levels in MOEK_ACT_Q8_0X2's order (lo: sub-blocks 0 | 2, hi:
 * 1 | 3) and the lanes' scales. */
ALWAYS_INLINE void nvfp4_unpack(const uint8_t *b, __m256i *lo, __m256i *hi, __m256 *slo,
                                __m256 *shi)
{
	const __m256i low4 = _mm256_set1_epi8(0x0F);
	const __m256i table =
	    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)moek_mxfp4_kvalues));
	const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 4));
	const __m256i ln = _mm256_and_si256(q, low4);
	const __m256i hn = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
	*lo = _mm256_shuffle_epi8(table, _mm256_unpacklo_epi64(ln, hn));
	*hi = _mm256_shuffle_epi8(table, _mm256_unpackhi_epi64(ln, hn));
	const __m256 s = _mm256_castps128_ps256(ue4m3_half4(b));
	*slo = _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
	*shi = _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
}

/* Σ w·y per int32 lane: maddubs of |w| and y signed by w, then madd by 1. Exact. */
ALWAYS_INLINE __m256i nv_signed_dot(__m256i w, __m256i y)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(y, w)),
	                         _mm256_set1_epi16(1));
}

ALWAYS_INLINE __m256 nvfp4_block_dot(__m256i lo, __m256i hi, __m256 slo, __m256 shi,
                                     const struct block_q8_0x2 *y, __m256 acc)
{
	const __m256 d = _mm256_loadu_ps(y->d);
	const __m256i slo32 = nv_signed_dot(lo, _mm256_loadu_si256((const __m256i *)y->lo));
	const __m256i shi32 = nv_signed_dot(hi, _mm256_loadu_si256((const __m256i *)y->hi));
	acc = _mm256_fmadd_ps(_mm256_mul_ps(slo, d), _mm256_cvtepi32_ps(slo32), acc);
	return _mm256_fmadd_ps(_mm256_mul_ps(shi, d), _mm256_cvtepi32_ps(shi32), acc);
}

ALWAYS_INLINE void nvfp4_body(const void *w, const void *act, size_t as, const int NT, size_t k,
                              float *out, bool vnni)
{
	(void)vnni;
	const size_t nb = k / QK_NVFP4;
	const bool far = wide_activation(nb * sizeof(struct block_q8_0x2));
	const uint8_t *x = w;
	const struct block_q8_0x2 *y0 = act;
	__m256 acc[8], acc1 = _mm256_setzero_ps();
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	__m256i lo, hi;
	__m256 slo, shi;
	size_t p = 0;
	if (NT == 1) { /* two accumulators (even / odd blocks): the FMA chain would bound */
		for (; p + 2 <= nb; p += 2) {
			prefetch_ahead(x + p * NVFP4_BLOCK, far);
			nvfp4_unpack(x + p * NVFP4_BLOCK, &lo, &hi, &slo, &shi);
			acc[0] = nvfp4_block_dot(lo, hi, slo, shi, y0 + p, acc[0]);
			nvfp4_unpack(x + (p + 1) * NVFP4_BLOCK, &lo, &hi, &slo, &shi);
			acc1 = nvfp4_block_dot(lo, hi, slo, shi, y0 + p + 1, acc1);
		}
	}
	for (; p < nb; p++) {
		prefetch_ahead(x + p * NVFP4_BLOCK, far);
		nvfp4_unpack(x + p * NVFP4_BLOCK, &lo, &hi, &slo, &shi);
		for (int t = 0; t < NT; t++)
			acc[t] = nvfp4_block_dot(
			    lo, hi, slo, shi,
			    (const struct block_q8_0x2 *)((const uint8_t *)act + t * as) + p,
			    acc[t]);
	}
	for (int t = 0; t < NT; t++)
		out[t] = hsum(NT == 1 ? _mm256_add_ps(acc[0], acc1) : acc[t]);
}

X8_ENTRY(dot_nvfp4, nvfp4_body, false, )

void moek_avx2_dot_nvfp4(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                         size_t k, float *out)
{
	(void)sr;
	dot_nvfp4(w, act, as, nt, k, out);
}

void moek_avx2_rows_nvfp4(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                          float *out)
{
	for (size_t r = 0; r < nr; r++)
		nvfp4_body((const uint8_t *)w + r * stride, act, 0, 1, k, out + r, false);
}

/* 16 levels (the low 128 bits of v) times s into dst. */
ALWAYS_INLINE void store_sub(__m128i v, float s, float *dst)
{
	const __m256 d = _mm256_set1_ps(s);
	_mm256_storeu_ps(dst, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
	_mm256_storeu_ps(
	    dst + 8,
	    _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)))));
}

void moek_avx2_dequantize_nvfp4(const void *w, const float *sr, float *dst, size_t k)
{
	(void)sr;
	const uint8_t *b = w;
	for (size_t i = 0; i + QK_NVFP4 <= k; i += QK_NVFP4, b += NVFP4_BLOCK) {
		__m256i lo, hi;
		__m256 slo, shi;
		nvfp4_unpack(b, &lo, &hi, &slo, &shi);
		float s[4];
		_mm_storeu_ps(s, ue4m3_half4(b));
		store_sub(_mm256_castsi256_si128(lo), s[0], dst + i);
		store_sub(_mm256_castsi256_si128(hi), s[1], dst + i + 16);
		store_sub(_mm256_extracti128_si256(lo, 1), s[2], dst + i + 32);
		store_sub(_mm256_extracti128_si256(hi, 1), s[3], dst + i + 48);
	}
}

/* ---- Interleaved rows (moek_interleave, groups of 8) ---------------------------------------
 * Per column (one block of 64 of each of 8 rows, 288 bytes): 8 vectors of code bytes (vector
 * v: bytes 4v..4v+3 of each row's qs, lane r = row r), then one vector of the 8 rows' 4 scale
 * bytes. Vector v belongs to sub-block s = v / 2: its low nibbles are elements 16s + 4(v % 2)
 * + 0..3, its high nibbles the same + 8 — 4 consecutive elements each, against 4 activations
 * broadcast to every lane (MOEK_ACT_Q8_0S, elements in order: block 2b + s / 2 at (s % 2) ·
 * 16). The signed levels go through maddubs by the sign trick (the activations' block sums
 * cover 32 elements, two sub-blocks of different scales, so the offset form cannot be used);
 * each sub-block's int32 sums take the 8 rows' UE4M3 scales (byte s of each lane of the scale
 * vector, decoded 8 at a time) times the activation block's d in one FMA. */

/* Byte s of each 32-bit lane of v as moek_ue4m3_half gives it. */
ALWAYS_INLINE __m256 ue4m3_half8(__m256i v, int s)
{
	const __m256i b = _mm256_and_si256(_mm256_srli_epi32(v, 8 * s), _mm256_set1_epi32(0xFF));
	const __m256i nan = _mm256_cmpeq_epi32(b, _mm256_set1_epi32(0x7F));
	const __m256i x = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
	const __m256i sub = _mm256_cmpeq_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x78)),
	                                       _mm256_setzero_si256());
	const __m256 normal = _mm256_castsi256_ps(
	    _mm256_add_epi32(_mm256_slli_epi32(x, 20), _mm256_set1_epi32(119 << 23)));
	const __m256 small = _mm256_mul_ps(_mm256_cvtepi32_ps(x), _mm256_set1_ps(0x1p-10f));
	return _mm256_andnot_ps(_mm256_castsi256_ps(nan),
	                        _mm256_blendv_ps(normal, small, _mm256_castsi256_ps(sub)));
}

/* acc + Σ over each lane's 4 levels w · the 4 activations at y (|w| · y signed by w). */
ALWAYS_INLINE __m256i x8_nv_dot4(__m256i acc, __m256i w, __m256i aw, const int8_t *y)
{
	int32_t v;
	memcpy(&v, y, 4);
	const __m256i ys = _mm256_sign_epi8(_mm256_set1_epi32(v), w);
	return _mm256_add_epi32(
	    acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, ys), _mm256_set1_epi16(1)));
}

ALWAYS_INLINE void x8_nvfp4_body(const void *group, const void *act, size_t as, const int NT,
                                 size_t k, float *out, bool vnni)
{
	(void)vnni;
	const uint8_t *col = group;
	const __m256i low4 = _mm256_set1_epi8(0x0F);
	const __m256i table =
	    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)moek_mxfp4_kvalues));
	__m256 acc[MOEK_DOT_TOKENS];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();
	for (size_t b = 0; b < k / QK_NVFP4; b++, col += MOEK_INTERLEAVE * NVFP4_BLOCK) {
		_mm_prefetch((const char *)col + 1536, _MM_HINT_T0);
		_mm_prefetch((const char *)col + 1536 + 64, _MM_HINT_T0);
		_mm_prefetch((const char *)col + 1536 + 128, _MM_HINT_T0);
		_mm_prefetch((const char *)col + 1536 + 192, _MM_HINT_T0);
		_mm_prefetch((const char *)col + 1536 + 256, _MM_HINT_T0);
		const __m256i scales = _mm256_loadu_si256((const __m256i *)(col + 256));
		for (int s = 0; s < 4; s++) {
			__m256i sum[MOEK_DOT_TOKENS];
			for (int t = 0; t < NT; t++)
				sum[t] = _mm256_setzero_si256();
			for (int h = 0; h < 2; h++) {
				const int v = 2 * s + h;
				const __m256i q =
				    _mm256_loadu_si256((const __m256i *)(col + 32 * v));
				const __m256i lo =
				    _mm256_shuffle_epi8(table, _mm256_and_si256(q, low4));
				const __m256i hi = _mm256_shuffle_epi8(
				    table, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
				const __m256i alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
				for (int t = 0; t < NT; t++) {
					const int8_t *y =
					    ((const struct block_q8_0s *)((const uint8_t *)act +
					                                  (size_t)t * as) +
					     2 * b + s / 2)
					        ->qs +
					    16 * (s % 2) + 4 * h;
					sum[t] = x8_nv_dot4(sum[t], lo, alo, y);
					sum[t] = x8_nv_dot4(sum[t], hi, ahi, y + 8);
				}
			}
			const __m256 sc = ue4m3_half8(scales, s);
			for (int t = 0; t < NT; t++) {
				const float d = ((const struct block_q8_0s *)((const uint8_t *)act +
				                                              (size_t)t * as) +
				                 2 * b + s / 2)
				                    ->d;
				acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(sc, _mm256_set1_ps(d)),
				                         _mm256_cvtepi32_ps(sum[t]), acc[t]);
			}
		}
	}
	for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(out + 8 * t, acc[t]);
}

X8_ENTRY(x8_nvfp4, x8_nvfp4_body, false, )

void moek_avx2_x8_nvfp4(const void *group, const void *act, size_t as, size_t nt, size_t k,
                        float *out)
{
	x8_nvfp4(group, act, as, nt, k, out);
}
