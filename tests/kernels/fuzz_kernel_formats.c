/* fuzz_kernel_formats — arbitrary bytes as one weight row of any format (byte 0 picks the
 * format, byte 1 the length). Weight files are input the sidecar does not control: decoding
 * them must never crash or trip a sanitizer, the SIMD dequantizer must agree with the
 * reference bit for bit (NaN payloads aside), and the SIMD dot product must agree with the
 * reference dot of the dequantized row wherever that is finite.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint32_t formats[] = {
    MOEK_F32,    MOEK_F16,    MOEK_BF16,     MOEK_Q8_0,          MOEK_Q4_0,   MOEK_Q4_K,
    MOEK_Q5_K,   MOEK_Q6_K,   MOEK_MXFP4,    MOEK_FP8_E4M3_B128, MOEK_Q2_K,   MOEK_Q3_K,
    MOEK_IQ4_NL, MOEK_IQ4_XS, MOEK_INT4_G32, MOEK_IQ2_XXS,       MOEK_IQ2_XS, MOEK_IQ3_XXS,
    MOEK_IQ3_S,  MOEK_IQ1_S,  MOEK_IQ1_M,    MOEK_IQ2_S,         MOEK_NVFP4};

static int same_bits_or_both_nan(float a, float b)
{
	return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof(a)) == 0;
}

/* The affine K-quants (Q2_K, Q4_K, Q5_K) decode d·sc·q − dmin·m, and their dot kernels sum
 * the two parts apart (d·Σ sc·q·x, dmin·Σ m·Σx), as ggml's do: where a row decodes to about 0
 * (d·sc·q = dmin·m) the two sums cancel and leave their float rounding, which the decoded row's
 * magnitude does not bound. This bounds the two sums' magnitudes (q at its largest); 0 for the
 * other formats. */
static double affine_terms(uint32_t format, const uint8_t *row, const float *xd, size_t k)
{
	double mag = 0;
	for (size_t b = 0; b < k / QK_K; b++) {
		const float *x = xd + b * QK_K;
		if (format == MOEK_Q2_K) {
			const struct block_q2_K *blk = (const struct block_q2_K *)row + b;
			const double d = fabs(moek_f16_to_f32(blk->d));
			const double dmin = fabs(moek_f16_to_f32(blk->dmin));
			for (int j = 0; j < QK_K / 16; j++) {
				double sx = 0;
				for (int i = 0; i < 16; i++)
					sx += fabs(x[j * 16 + i]);
				mag +=
				    (d * (blk->scales[j] & 15) * 3 + dmin * (blk->scales[j] >> 4)) *
				    sx;
			}
		} else if (format == MOEK_Q4_K || format == MOEK_Q5_K) {
			const uint8_t *blk =
			    row + b * (format == MOEK_Q4_K ? sizeof(struct block_q4_K)
			                                   : sizeof(struct block_q5_K));
			uint16_t dh, mh; /* d and dmin lead both blocks */
			memcpy(&dh, blk, 2);
			memcpy(&mh, blk + 2, 2);
			const double d = fabs(moek_f16_to_f32(dh)),
			             dmin = fabs(moek_f16_to_f32(mh));
			const double qmax = format == MOEK_Q4_K ? 15 : 31;
			for (int j = 0; j < QK_K / 32; j++) {
				uint8_t sc, m;
				moek_k4_scale_min(j, blk + 4, &sc, &m);
				double sx = 0;
				for (int i = 0; i < 32; i++)
					sx += fabs(x[j * 32 + i]);
				mag += (d * sc * qmax + dmin * m) * sx;
			}
		}
	}
	return mag;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	enum { MAX_K = 2048 };
	static float ref[MAX_K], simd[MAX_K], x[MAX_K];
	static uint8_t act[MAX_K * 4], row[MAX_K * 4];
	if (size < 2)
		return 0;
	const uint32_t format = formats[data[0] % (sizeof(formats) / sizeof(formats[0]))];
	const struct moek_format_info *f = moek_format_lookup(format);
	size_t k = f->block_elems * (1 + data[1] % 8);
	if (f->block_elems == 1)
		k = 16 * (1 + data[1] % 64);
	const size_t bytes = moek_row_bytes(format, k);
	if (size - 2 < bytes)
		return 0;
	memcpy(row, data + 2, bytes); /* aligned copy, as the sidecar's slots are */
	float scales[MAX_K / 128 + 1];
	for (size_t i = 0; i < sizeof(scales) / sizeof(scales[0]); i++)
		scales[i] = 0.01f * (float)(i + 1);
	const float *sr = format == MOEK_FP8_E4M3_B128 ? scales : NULL;
	moek_ref_dequantize_row(format, row, sr, ref, k);
#if defined(__x86_64__)
	if (moek_set_isa(MOEK_ISA_AVX2) != 0)
		return 0;
	moek_isa_dequantize(&moek_avx2_ops, moek_fmt_index(format), row, sr, simd, k);
	for (size_t i = 0; i < k; i++)
		if (!same_bits_or_both_nan(ref[i], simd[i]))
			abort();
	for (size_t i = 0; i < k; i++)
		x[i] = (float)((int)(i * 37 % 19) - 9) * 0.125f;
	const uint32_t act_format = moek_isa_act_format(&moek_avx2_ops, format, false);
	if (act_format == MOEK_F32)
		memcpy(act, x, k * sizeof(float));
	else
		moek_isa_quantize_act(&moek_avx2_ops, act_format, x, k, act);
	float xd[MAX_K], got;
	if (act_format == MOEK_F32)
		memcpy(xd, x, k * sizeof(float));
	else
		moek_isa_dequantize_act(&moek_avx2_ops, act_format, act, k, xd);
	moek_avx2_ops.dot[moek_fmt_index(format)](row, sr, act, 0, 1, k, &got);
	double want = 0, mag = 0;
	for (size_t i = 0; i < k; i++) {
		want += (double)ref[i] * xd[i];
		mag += fabs((double)ref[i] * xd[i]);
	}
	/* float sums of up to 2048 terms: 1e-4 of the terms' magnitude, and of the affine
	 * K-quants' two separately summed parts (a real error in one sub-block's scale or min
	 * is about 1/16 of them) */
	const double terms = mag + affine_terms(format, row, xd, k);
	if (isfinite(terms) && terms < 1e30 && isfinite(got) &&
	    fabs(got - want) > 1e-4 * terms + 1e-30)
		abort();
#endif
	return 0;
}
