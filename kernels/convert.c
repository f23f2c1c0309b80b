/* convert.c — activation dtype conversion (f32 <-> f16 <-> bf16).
 *
 * Scalar and exact: round to nearest even, NaN preserved (quietened), f16 overflow to Inf,
 * f16 subnormals handled. Used for activations entering and leaving the channel, so it is
 * written to be auto-vectorised; the hot expert paths convert inside their own kernels.
 */
#include <string.h>

#include "moe_kernels.h"

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

static void load_f32(unsigned dtype, const void *src, float *dst, size_t n)
{
	const uint16_t *s16 = src;
	switch (dtype) {
	case MOEK_ACT_F32: memcpy(dst, src, n * sizeof(float)); break;
	case MOEK_ACT_F16:
		for (size_t i = 0; i < n; i++)
			dst[i] = moek_f16_to_f32(s16[i]);
		break;
	case MOEK_ACT_BF16:
		for (size_t i = 0; i < n; i++)
			dst[i] = moek_bf16_to_f32(s16[i]);
		break;
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
	/* to a 16-bit dtype: through f32 in cache-sized chunks, no allocation */
	uint16_t *d16 = dst;
	const size_t src_size = src_dtype == MOEK_ACT_F32 ? 4u : 2u;
	float buf[1024];
	for (size_t done = 0; done < n;) {
		size_t k = n - done < 1024 ? n - done : 1024;
		load_f32(src_dtype, (const char *)src + done * src_size, buf, k);
		if (dst_dtype == MOEK_ACT_BF16)
			for (size_t i = 0; i < k; i++)
				d16[done + i] = moek_f32_to_bf16(buf[i]);
		else
			for (size_t i = 0; i < k; i++)
				d16[done + i] = moek_f32_to_f16(buf[i]);
		done += k;
	}
}
