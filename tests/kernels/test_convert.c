/* test_convert.c — moek_convert: the SIMD conversions give exactly the scalar definition's
 * bits (every 16-bit input pattern, NaN payloads included; f32 inputs around every rounding
 * boundary, specials and random patterns), for every length (vector bodies and tails), and
 * from 16-bit to 16-bit through f32.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe_kernels.h"

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static void simd_or_skip(void)
{
	if (moek_set_isa(MOEK_ISA_AVX2) != 0)
		cr_skip_test("this CPU has no AVX2: only the scalar conversion exists");
}

Test(convert, every_16_bit_pattern_widens_to_the_scalar_bits)
{
	simd_or_skip();
	enum { N = 65536 };
	uint16_t *h = malloc(N * sizeof(uint16_t));
	float *got = malloc(N * sizeof(float));
	for (uint32_t i = 0; i < N; i++)
		h[i] = (uint16_t)i;
	const unsigned dtypes[2] = {MOEK_ACT_F16, MOEK_ACT_BF16};
	for (int d = 0; d < 2; d++) {
		moek_convert(MOEK_ACT_F32, got, dtypes[d], h, N);
		for (uint32_t i = 0; i < N; i++) {
			const float want = d == 0 ? moek_f16_to_f32(h[i]) : moek_bf16_to_f32(h[i]);
			cr_assert_eq(f32_bits(got[i]), f32_bits(want),
			             "%s 0x%04x: 0x%08x, want 0x%08x", d == 0 ? "f16" : "bf16",
			             h[i], f32_bits(got[i]), f32_bits(want));
		}
	}
	free(h);
	free(got);
}

/* f32 patterns: specials, both sides of every f16/bf16 rounding and range boundary, and
 * random bits (every exponent, NaN payloads). */
static size_t f32_cases(uint32_t *u, size_t cap)
{
	size_t n = 0;
	const uint32_t fixed[] = {
	    0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x7f800000, 0xff800000, 0x7fc00000,
	    0xffc00001, 0x7f800001, 0xff812345, 0x7fbfffff, 0x477fe000, 0x477fefff, 0x477ff000,
	    0x477ff001, 0xc77ff000, 0x33000000, 0x33000001, 0x337fffff, 0x38800000, 0x387fffff,
	    0x387fe000, 0x387ff000, 0x3f808000, 0x3f818000, 0x3f808001, 0x7f7fffff, 0xff7f8000};
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		u[n++] = fixed[i];
	/* Every exponent with mantissas at the bf16 (bit 15) and f16 (bit 12) half points. */
	for (uint32_t e = 0; e < 256; e++)
		for (uint32_t m = 0; m < 8; m++) {
			const uint32_t base = e << 23;
			const uint32_t mant[8] = {0x0000,  0x7fff, 0x8000, 0x8001,
			                          0x18000, 0x0fff, 0x1000, 0x3000};
			u[n++] = base | mant[m];
			u[n++] = 0x80000000u | base | mant[m] | (m << 17);
		}
	uint64_t s = 0x9e3779b97f4a7c15ull;
	while (n < cap) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		u[n++] = (uint32_t)(s >> 32);
	}
	return n;
}

Test(convert, f32_narrows_to_the_scalar_bits_at_every_length)
{
	simd_or_skip();
	enum { CAP = 1 << 18 };
	uint32_t *u = malloc(CAP * sizeof(uint32_t));
	const size_t n = f32_cases(u, CAP);
	float *f = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		f[i] = bits_f32(u[i]);
	uint16_t *got = malloc((n + 1) * sizeof(uint16_t));
	const unsigned dtypes[2] = {MOEK_ACT_F16, MOEK_ACT_BF16};
	for (int d = 0; d < 2; d++) {
		moek_convert(dtypes[d], got, MOEK_ACT_F32, f, n);
		for (size_t i = 0; i < n; i++) {
			const uint16_t want =
			    d == 0 ? moek_f32_to_f16(f[i]) : moek_f32_to_bf16(f[i]);
			cr_assert_eq(got[i], want, "%s of 0x%08x: 0x%04x, want 0x%04x",
			             d == 0 ? "f16" : "bf16", u[i], got[i], want);
		}
		/* Lengths 0..40 from odd offsets: bodies and tails; nothing past n written. */
		for (size_t len = 0; len <= 40; len++) {
			got[len] = 0xabcd;
			moek_convert(dtypes[d], got, MOEK_ACT_F32, f + 3, len);
			for (size_t i = 0; i < len; i++) {
				const uint16_t want =
				    d == 0 ? moek_f32_to_f16(f[3 + i]) : moek_f32_to_bf16(f[3 + i]);
				cr_assert_eq(got[i], want, "length %zu element %zu", len, i);
			}
			cr_assert_eq(got[len], 0xabcd, "length %zu wrote past its end", len);
		}
	}
	free(u);
	free(f);
	free(got);
}

Test(convert, sixteen_bit_to_sixteen_bit_goes_through_f32_exactly)
{
	simd_or_skip();
	enum { N = 65536 };
	uint16_t *h = malloc(N * sizeof(uint16_t)), *got = malloc(N * sizeof(uint16_t));
	for (uint32_t i = 0; i < N; i++)
		h[i] = (uint16_t)(i * 40503u);
	moek_convert(MOEK_ACT_BF16, got, MOEK_ACT_F16, h, N);
	for (uint32_t i = 0; i < N; i++)
		cr_assert_eq(got[i], moek_f32_to_bf16(moek_f16_to_f32(h[i])), "f16 0x%04x", h[i]);
	moek_convert(MOEK_ACT_F16, got, MOEK_ACT_BF16, h, N);
	for (uint32_t i = 0; i < N; i++)
		cr_assert_eq(got[i], moek_f32_to_f16(moek_bf16_to_f32(h[i])), "bf16 0x%04x", h[i]);
	free(h);
	free(got);
}
