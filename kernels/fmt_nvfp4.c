/* fmt_nvfp4.c — reference codecs of NVFP4 (ggml type 40).
 *
 * A block of 64 weights is four 16-element sub-blocks, each with an unsigned E4M3 scale and
 * 16 E2M1 codes (kernels_internal.h, struct block_nvfp4): value = E2M1(code) · UE4M3(d[s]).
 * The kernels read both halves of that product as ggml does: the codes as the doubled integers
 * of moek_mxfp4_kvalues and the scale halved (moek_ue4m3_half), so the dot products stay
 * integer sums.
 *
 * The quantizer is written from the definition: per sub-block the scale that maps the
 * magnitude extreme onto 6 (E2M1's largest), rounded to the nearest UE4M3 (ties to even,
 * saturating at 448), then each code the nearest E2M1 level at the scale actually stored (a tie
 * takes the smaller magnitude). It is not ggml's quantize_row_nvfp4_ref bit for bit (that one
 * rounds the scale's mantissa half up), but its blocks are valid ones any reader decodes the
 * same. Pure functions; no allocation; thread-safe.
 */
#include <math.h>
#include <stdio.h>

#include "kernels_internal.h"

/* Midpoints between neighbouring doubled E2M1 magnitudes {0, 1, 2, 3, 4, 6, 8, 12}: the code
 * of |v| is the count of midpoints below it (a tie keeps the smaller level; NaN gives 0). */
static const float e2m1_midpoints[7] = {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f};

static inline uint8_t e2m1_code(float v)
{
	const float a = fabsf(v);
	uint8_t c = 0;
	for (int i = 0; i < 7; i++)
		c += a > e2m1_midpoints[i];
	return c && v < 0 ? (uint8_t)(c | 8) : c;
}

void moek_quantize_nvfp4(const float *x, void *dst, size_t n)
{
	struct block_nvfp4 *y = dst;
	for (size_t i = 0; i < n / QK_NVFP4; i++, x += QK_NVFP4) {
		for (int s = 0; s < QK_NVFP4 / QK_NVFP4_SUB; s++) {
			const float *xb = x + s * QK_NVFP4_SUB;
			float amax = 0.0f;
			for (int j = 0; j < QK_NVFP4_SUB; j++)
				amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
			/* E4M3 of a positive finite value: its sign bit clear, never 0x7F */
			const uint8_t ue =
			    amax > 0.0f && isfinite(amax) ? moek_f32_to_fp8_e4m3(amax / 6.0f) : 0;
			y[i].d[s] = ue;
			const float d = moek_ue4m3_half(ue);
			const float inv = d > 0.0f ? 1.0f / d : 0.0f;
			for (int j = 0; j < QK_NVFP4_SUB / 2; j++)
				y[i].qs[s * 8 + j] = (uint8_t)(e2m1_code(xb[j] * inv) |
				                               e2m1_code(xb[j + 8] * inv) << 4);
		}
	}
}

void moek_dequantize_nvfp4(const void *src, float *y, size_t n)
{
	const struct block_nvfp4 *b = src;
	for (size_t i = 0; i < n / QK_NVFP4; i++, y += QK_NVFP4) {
		for (int s = 0; s < QK_NVFP4 / QK_NVFP4_SUB; s++) {
			const float d = moek_ue4m3_half(b[i].d[s]);
			for (int j = 0; j < QK_NVFP4_SUB / 2; j++) {
				const uint8_t q = b[i].qs[s * 8 + j];
				y[s * 16 + j] = (float)moek_mxfp4_kvalues[q & 15] * d;
				y[s * 16 + j + 8] = (float)moek_mxfp4_kvalues[q >> 4] * d;
			}
		}
	}
}

/* ---- ModelOpt checkpoints ----------------------------------------------------------------- */

int moek_nvfp4_from_modelopt(const void *weight, const void *scales, size_t rows, size_t cols,
                             void *dst, char *err, size_t err_len)
{
	if (rows == 0 || cols == 0 || cols % QK_NVFP4) {
		snprintf(
		    err, err_len,
		    "NVFP4 (ModelOpt): %zu x %zu, rows must be a positive multiple of 64 inputs "
		    "(ggml's NVFP4 block)",
		    rows, cols);
		return -1;
	}
	const uint8_t *w = weight, *sc = scales;
	struct block_nvfp4 *y = dst;
	const size_t nb = cols / QK_NVFP4;
	for (size_t r = 0; r < rows; r++)
		for (size_t b = 0; b < nb; b++, y++) {
			const uint8_t *s = sc + r * (cols / QK_NVFP4_SUB) + 4 * b;
			for (int k = 0; k < 4; k++)
				if (s[k] & 0x80 || s[k] == 0x7F) {
					snprintf(
					    err, err_len,
					    "NVFP4 (ModelOpt): weight_scale of row %zu columns "
					    "%zu..%zu is %s (E4M3 byte 0x%02x): block scales are "
					    "positive",
					    r, (4 * b + (size_t)k) * QK_NVFP4_SUB,
					    (4 * b + (size_t)k + 1) * QK_NVFP4_SUB - 1,
					    (s[k] & 0x7F) == 0x7F ? "NaN" : "negative", s[k]);
					return -1;
				}
			memcpy(y->d, s, 4);
			/* sub-block k: elements 16k + j (j < 8) from byte 8k + j / 2 ... of the row
			 */
			const uint8_t *src = w + r * (cols / 2) + b * (QK_NVFP4 / 2);
			for (int k = 0; k < 4; k++)
				for (int j = 0; j < 8; j++) {
					const int e0 = 16 * k + j, e1 = e0 + 8;
					const unsigned lo = (src[e0 / 2] >> (4 * (e0 % 2))) & 15u;
					const unsigned hi = (src[e1 / 2] >> (4 * (e1 % 2))) & 15u;
					y->qs[8 * k + j] = (uint8_t)(lo | hi << 4);
				}
		}
	return 0;
}

void moek_nvfp4_to_modelopt(const void *src, size_t rows, size_t cols, void *weight, void *scales)
{
	const struct block_nvfp4 *x = src;
	uint8_t *w = weight, *sc = scales;
	const size_t nb = cols / QK_NVFP4;
	memset(w, 0, rows * cols / 2);
	for (size_t r = 0; r < rows; r++)
		for (size_t b = 0; b < nb; b++, x++) {
			memcpy(sc + r * (cols / QK_NVFP4_SUB) + 4 * b, x->d, 4);
			uint8_t *d = w + r * (cols / 2) + b * (QK_NVFP4 / 2);
			for (int k = 0; k < 4; k++)
				for (int j = 0; j < 8; j++) {
					const int e0 = 16 * k + j, e1 = e0 + 8;
					const uint8_t q = x->qs[8 * k + j];
					d[e0 / 2] |= (uint8_t)((q & 15u) << (4 * (e0 % 2)));
					d[e1 / 2] |= (uint8_t)((q >> 4) << (4 * (e1 % 2)));
				}
		}
}
