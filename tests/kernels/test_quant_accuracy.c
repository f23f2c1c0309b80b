/* test_quant_accuracy.c — pins the accuracy of every weight quantizer on random data, so a
 * faster quantizer can never quietly be a worse one, and feeds them hostile floats.
 *
 * Normalised error sum (y - x)^2 / sum x^2 of quantize -> dequantize over 16 x 4096 values,
 * for uniform [-1, 1) data and a bell-shaped sum of four uniforms (heavier centre, like real
 * weights). Bounds: the values of the plain scalar reference before the quantizers were
 * vectorised (commit 077ba1b), rounded up in the third significant digit. (The vectorised
 * quantizers give that reference's exact bytes: test_quant_reference.)
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>

#include "moe_kernels.h"

enum { ROWS = 16, COLS = 4096, N = ROWS * COLS };

enum data_shape { UNIFORM, BELL };

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static float uniform(uint64_t *s)
{
	return (float)((int32_t)(xorshift(s) >> 40) - (1 << 23)) * 0x1p-23f;
}

static void fill(enum data_shape shape, float *x)
{
	uint64_t s = 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < N; i++) {
		if (shape == UNIFORM) {
			x[i] = uniform(&s);
		} else {
			float a = 0;
			for (int k = 0; k < 4; k++)
				a += uniform(&s);
			x[i] = 0.5f * a;
		}
	}
}

static double round_trip_nmse(uint32_t format, const float *x)
{
	static float y[N];
	static uint8_t q[N * 2];
	float scales[(ROWS + 127) / 128 * COLS / 128];
	float *sc = format == MOEK_FP8_E4M3_B128 ? scales : NULL;
	cr_assert_eq(moek_quantize(format, x, ROWS, COLS, q, sc), 0);
	cr_assert_eq(moek_dequantize(format, q, sc, ROWS, COLS, y), 0);
	double num = 0, den = 0;
	for (int i = 0; i < N; i++) {
		const double d = (double)y[i] - x[i];
		num += d * d;
		den += (double)x[i] * x[i];
	}
	return num / den;
}

static const struct {
	uint32_t format;
	double max_nmse[2]; /* UNIFORM, BELL */
} budget[] = {
    {MOEK_Q4_0, {4.25e-3, 6.70e-3}},
    {MOEK_Q8_0, {1.44e-5, 2.59e-5}},
    {MOEK_Q4_K, {2.98e-3, 4.74e-3}},
    {MOEK_Q5_K, {7.65e-4, 1.21e-3}},
    {MOEK_Q6_K, {1.77e-4, 2.90e-4}},
    {MOEK_MXFP4, {2.08e-2, 1.23e-2}},
    {MOEK_FP8_E4M3_B128, {6.50e-4, 7.08e-4}},
    {MOEK_IQ4_NL, {4.03e-3, 5.19e-3}},
    {MOEK_IQ4_XS, {4.09e-3, 5.27e-3}},
    {MOEK_Q2_K, {5.48e-2, 8.32e-2}},
    {MOEK_Q3_K, {1.56e-2, 2.14e-2}},
    {MOEK_INT4_G32, {4.25e-3, 6.70e-3}},
    {MOEK_IQ2_XXS, {0.12, 0.12}},
    {MOEK_IQ2_XS, {0.095, 0.095}},
    {MOEK_IQ3_XXS, {0.05, 0.05}},
    {MOEK_IQ3_S, {0.025, 0.025}},
    {MOEK_IQ1_S, {0.18, 0.22}},
    {MOEK_IQ1_M, {0.18, 0.22}},
    {MOEK_IQ2_S, {0.065, 0.07}},
    {MOEK_NVFP4, {1.04e-2, 9.20e-3}},
};

static void check(enum data_shape shape)
{
	static float x[N];
	fill(shape, x);
	for (size_t f = 0; f < sizeof(budget) / sizeof(budget[0]); f++) {
		const char *name = moek_format_lookup(budget[f].format)->name;
		const double nmse = round_trip_nmse(budget[f].format, x);
		cr_log_info("%s %s: nmse %.6g (bound %.3g)", shape == UNIFORM ? "uniform" : "bell",
		            name, nmse, budget[f].max_nmse[shape]);
		cr_expect(nmse <= budget[f].max_nmse[shape], "%s, %s data: nmse %.6g > %.3g", name,
		          shape == UNIFORM ? "uniform" : "bell", nmse, budget[f].max_nmse[shape]);
	}
}

Test(quant_accuracy, uniform_data_within_reference_error)
{
	check(UNIFORM);
}

Test(quant_accuracy, bell_data_within_reference_error)
{
	check(BELL);
}

/* NaN, infinities and extremes in one block (a 256-value K-quant super-block; FP8: the first
 * 128x128 scale block) quantize without undefined behaviour (UBSan) and do not leak into the
 * next block, which still round-trips within its format's uniform-data budget x 4. */
Test(quant_accuracy, hostile_block_does_not_spill)
{
	static const float hostile[] = {NAN,    -NAN,   INFINITY, -INFINITY, 3e38f,
	                                -3e38f, 1e-45f, 0.0f,     -0.0f};
	enum { R = 1, C = 512 };
	static float x[R * C], y[R * C];
	static uint8_t q[R * C * 2];
	float scales[4];
	for (size_t f = 0; f < sizeof(budget) / sizeof(budget[0]); f++) {
		const uint32_t fmt = budget[f].format;
		const char *name = moek_format_lookup(fmt)->name;
		const int block = fmt == MOEK_FP8_E4M3_B128 ? 128 : 256;
		for (size_t h = 0; h < sizeof(hostile) / sizeof(hostile[0]); h++) {
			uint64_t s = 12345 + h;
			for (int i = 0; i < C; i++)
				x[i] = uniform(&s);
			for (int i = 0; i < block; i += 7)
				x[i] = hostile[h];
			float *sc = fmt == MOEK_FP8_E4M3_B128 ? scales : NULL;
			cr_assert_eq(moek_quantize(fmt, x, R, C, q, sc), 0);
			cr_assert_eq(moek_dequantize(fmt, q, sc, R, C, y), 0);
			double num = 0, den = 0;
			for (int i = block; i < C; i++) {
				num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
				den += (double)x[i] * x[i];
			}
			cr_expect(num / den <= 4 * budget[f].max_nmse[UNIFORM],
			          "%s: after a block with %g, the next block's nmse is %.3g", name,
			          (double)hostile[h], num / den);
		}
	}
}
