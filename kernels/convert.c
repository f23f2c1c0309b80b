/* convert.c — activation dtype conversion (f32 <-> f16 <-> bf16).
 *
 * Exact: round to nearest even, NaN preserved (quietened), f16 overflow to Inf, f16
 * subnormals handled. The scalar functions are the definition; on x86 with AVX2 and F16C the
 * whole-array conversions run 8–16 elements at a time with the same bits (F16C's vcvtps2ph
 * rounds exactly as the scalar code; its f16 → f32 quietens NaNs, which the scalar code does
 * not, so those lanes are rebuilt in integers). Used for activations leaving the channel — a
 * FORWARD's f32 sum converted to the engine's bf16/f16 — where a scalar loop is a measurable
 * slice of a decode layer (docs/performance.md, "Kernel design measurements"). The SIMD path
 * follows the kernels' ISA choice (MOEK_ISA=scalar / moek_set_isa force the scalar one).
 */
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CONVERT_X86 1
#endif

#include "kernels_internal.h"

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

float moek_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t moek_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force a quiet payload */
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
	return (uint16_t)(u >> 16);
}

float moek_f16_to_f32(uint16_t h)
{
	const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	const uint32_t exp = (h >> 10) & 0x1fu;
	const uint32_t mant = h & 0x3ffu;
	if (exp == 0x1f) /* Inf / NaN */
		return bits_f32(sign | 0x7f800000u | (mant << 13));
	if (exp != 0)
		return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
	/* zero or subnormal: mant * 2^-24, exact in f32 */
	float v = (float)mant * 0x1p-24f;
	return sign ? -v : v;
}

uint16_t moek_f32_to_f16(float f)
{
	const uint32_t u = f32_bits(f);
	const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	const uint32_t abs = u & 0x7fffffffu;
	if (abs > 0x7f800000u) /* NaN */
		return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
	if (abs >= 0x477ff000u) /* rounds to >= 65520: Inf */
		return (uint16_t)(sign | 0x7c00u);
	if (abs < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
		/* value * 2^24 rounded to nearest even is the subnormal mantissa; the float add
		 * does the rounding for us in the default rounding mode. */
		float v = bits_f32(abs) * 0x1p24f;
		float r = v + 0x1p23f - 0x1p23f;
		return (uint16_t)(sign | (uint16_t)r);
	}
	/* normal: rebias exponent, round mantissa from 23 to 10 bits to nearest even */
	uint32_t r = abs + 0x0fffu + ((abs >> 13) & 1u);
	return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

#ifdef CONVERT_X86
__attribute__((target("avx2,f16c"))) static size_t bf16_to_f32_avx2(const uint16_t *s, float *d,
                                                                    size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
		_mm256_storeu_si256((__m256i *)(d + i), _mm256_slli_epi32(w, 16));
	}
	return i;
}

__attribute__((target("avx2,f16c"))) static size_t f16_to_f32_avx2(const uint16_t *s, float *d,
                                                                   size_t n)
{
	const __m256i exp_mask = _mm256_set1_epi32(0x7c00), mant_mask = _mm256_set1_epi32(0x3ff);
	const __m256i sign_mask = _mm256_set1_epi32(0x8000), inf32 = _mm256_set1_epi32(0x7f800000);
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		const __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
		__m256i v = _mm256_castps_si256(_mm256_cvtph_ps(h));
		/* Inf/NaN lanes: sign | 0x7f800000 | mant << 13, the payload kept as is. */
		const __m256i w = _mm256_cvtepu16_epi32(h);
		const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(w, exp_mask), exp_mask);
		const __m256i exact = _mm256_or_si256(
		    _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, sign_mask), 16), inf32),
		    _mm256_slli_epi32(_mm256_and_si256(w, mant_mask), 13));
		v = _mm256_blendv_epi8(v, exact, special);
		_mm256_storeu_si256((__m256i *)(d + i), v);
	}
	return i;
}

__attribute__((target("avx2,f16c"))) static __m256i bf16_round8(__m256i u)
{
	const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
	const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
	const __m256i r = _mm256_srli_epi32(
	    _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
	const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
	return _mm256_blendv_epi8(r, q, nan);
}

__attribute__((target("avx2,f16c"))) static size_t f32_to_bf16_avx2(const float *s, uint16_t *d,
                                                                    size_t n)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		const __m256i a = bf16_round8(_mm256_loadu_si256((const __m256i *)(s + i)));
		const __m256i b = bf16_round8(_mm256_loadu_si256((const __m256i *)(s + i + 8)));
		/* packus interleaves 128-bit lanes: a0-3 b0-3 a4-7 b4-7; restore the order. */
		const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
		_mm256_storeu_si256((__m256i *)(d + i), p);
	}
	return i;
}

__attribute__((target("avx2,f16c"))) static size_t f32_to_f16_avx2(const float *s, uint16_t *d,
                                                                   size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(d + i),
		                 _mm256_cvtps_ph(_mm256_loadu_ps(s + i),
		                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	return i;
}
#endif

/* The SIMD path: when the kernels' active ISA is built on AVX2 and F16C (isa.c), which
 * MOEK_ISA=scalar / moek_set_isa can turn off. */
static bool use_simd(void)
{
#ifdef CONVERT_X86
	return moek_isa_active_has(MOEK_CPU_AVX2 | MOEK_CPU_F16C);
#else
	return false;
#endif
}

static void store_16(unsigned dtype, const float *src, uint16_t *dst, size_t n)
{
	size_t i = 0;
#ifdef CONVERT_X86
	if (use_simd())
		i = dtype == MOEK_ACT_BF16 ? f32_to_bf16_avx2(src, dst, n)
		                           : f32_to_f16_avx2(src, dst, n);
#endif
	if (dtype == MOEK_ACT_BF16)
		for (; i < n; i++)
			dst[i] = moek_f32_to_bf16(src[i]);
	else
		for (; i < n; i++)
			dst[i] = moek_f32_to_f16(src[i]);
}

static void load_f32(unsigned dtype, const void *src, float *dst, size_t n)
{
	const uint16_t *s16 = src;
	switch (dtype) {
	case MOEK_ACT_F32: memcpy(dst, src, n * sizeof(float)); break;
	case MOEK_ACT_F16:
	case MOEK_ACT_BF16: {
		const bool f16 = dtype == MOEK_ACT_F16;
		size_t i = 0;
#ifdef CONVERT_X86
		if (use_simd())
			i = f16 ? f16_to_f32_avx2(s16, dst, n) : bf16_to_f32_avx2(s16, dst, n);
#endif
		for (; i < n; i++)
			dst[i] = f16 ? moek_f16_to_f32(s16[i]) : moek_bf16_to_f32(s16[i]);
		break;
	}
	default: memset(dst, 0, n * sizeof(float)); break; /* callers validate dtypes */
	}
}

void moek_convert(unsigned dst_dtype, void *dst, unsigned src_dtype, const void *src, size_t n)
{
	if (dst_dtype == src_dtype) {
		memcpy(dst, src, n * (dst_dtype == MOEK_ACT_F32 ? 4u : 2u));
		return;
	}
	if (dst_dtype == MOEK_ACT_F32) {
		load_f32(src_dtype, src, dst, n);
		return;
	}
	/* to a 16-bit dtype: straight from f32, else through f32 in cache-sized chunks (no
	 * allocation) */
	uint16_t *d16 = dst;
	if (src_dtype == MOEK_ACT_F32) {
		store_16(dst_dtype, src, d16, n);
		return;
	}
	float buf[1024];
	for (size_t done = 0; done < n;) {
		size_t k = n - done < 1024 ? n - done : 1024;
		load_f32(src_dtype, (const uint16_t *)src + done, buf, k);
		store_16(dst_dtype, buf, d16 + done, k);
		done += k;
	}
}
