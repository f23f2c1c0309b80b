/* fmt_int4.c — MOEK_INT4_G32: the sidecar's layout of INT4 group-quantized checkpoints.
 *
 * Owns the format's reference codecs (the format table's row, formats.c) and the load-time
 * repacks from the two checkpoint encodings giant MoE models ship in: compressed-tensors
 * pack-quantized (Kimi-K2: symmetric, group 32, BF16 scales) and GPTQ (v1 and v2 zero points).
 * Both become one block layout (kernels_internal.h, struct block_int4_g32): a group's scale
 * and zero point share one f32 word and its codes sit in Q4_0's nibble order, so the dot
 * products unpack them as they unpack Q4_0 and take the zero point back out through the
 * activations' block sums. A checkpoint group of 64 or 128 repeats its scale and zero in each
 * of its 32-element blocks: exact, since every block of the group holds the same pair.
 *
 * Inputs are bytes (little-endian words at any alignment): a repack reads a slot the loader
 * filled from file offsets that need not be 4-byte aligned. Pure functions; no allocation;
 * thread-safe.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels_internal.h"

/* Stores scale d (its low 4 mantissa bits dropped) and zero point z (0..15) in a block. */
static void put_scale(struct block_int4_g32 *b, float d, unsigned z)
{
	uint32_t bits;
	memcpy(&bits, &d, sizeof(bits));
	bits = (bits & ~15u) | (z & 15u);
	for (int i = 0; i < 4; i++)
		b->dz[i] = (uint8_t)(bits >> (8 * i));
}

/* Code c (0..15) of element j of a block. */
static void put_code(struct block_int4_g32 *b, size_t j, unsigned c)
{
	uint8_t *q = &b->qs[j % 16];
	*q = j < 16 ? (uint8_t)((*q & 0xF0) | c) : (uint8_t)((*q & 0x0F) | (c << 4));
}

/* ---- Reference codecs ------------------------------------------------------------------- */

/* Symmetric groups as ggml's Q4_0 picks them: d from the signed element of largest magnitude
 * (d = max / −8, so that element is exactly −8 · d), rounded towards zero to what a block
 * holds; codes q = clamp(nearest-even(x / d), −8, 7) + 8 and zero point 8. */
void moek_int4_quantize_row(const float *x, void *dst, size_t n)
{
	struct block_int4_g32 *y = dst;
	for (size_t i = 0; i < n / QK_INT4; i++, x += QK_INT4) {
		float amax = 0.0f, max = 0.0f;
		for (int j = 0; j < QK_INT4; j++)
			if (amax < fabsf(x[j])) { /* NaN never wins */
				amax = fabsf(x[j]);
				max = x[j];
			}
		memset(&y[i], 0, sizeof(y[i]));
		put_scale(&y[i], max / -8.0f, 8);
		int z;
		const float d = moek_int4_scale(&y[i], &z);
		const float id = d != 0.0f && isfinite(d) ? 1.0f / d : 0.0f;
		for (int j = 0; j < QK_INT4; j++) {
			float v = x[j] * id;
			v = v > -8.0f ? (v < 7.0f ? v : 7.0f) : -8.0f; /* NaN lands on −8 */
			put_code(&y[i], (size_t)j, (unsigned)((int)lrintf(v) + 8));
		}
	}
}

void moek_int4_dequantize_row(const void *src, float *y, size_t n)
{
	const struct block_int4_g32 *b = src;
	for (size_t i = 0; i < n / QK_INT4; i++, y += QK_INT4) {
		int z;
		const float d = moek_int4_scale(&b[i], &z);
		for (int j = 0; j < QK_INT4 / 2; j++) {
			y[j] = d * (float)((b[i].qs[j] & 15) - z);
			y[j + QK_INT4 / 2] = d * (float)((b[i].qs[j] >> 4) - z);
		}
	}
}

/* ---- Repacks from checkpoints ---------------------------------------------------------------- */

static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/* Nibble n (0..7) of the little-endian int32 word at p: bits 4n..4n+3 are in byte n / 2. */
static unsigned word_nibble(const uint8_t *p, size_t n)
{
	return (p[n / 2] >> (4 * (n % 2))) & 15u;
}

static int check_shape(const char *what, size_t rows, size_t cols, size_t group, size_t row_mult,
                       char *err, size_t err_len)
{
	if (rows == 0 || cols == 0 || group == 0 || group % QK_INT4 || cols % group ||
	    rows % row_mult) {
		snprintf(err, err_len,
		         "%s INT4: %zu x %zu in groups of %zu (groups must be a multiple of 32 "
		         "dividing the row%s)",
		         what, rows, cols, group, row_mult > 1 ? "; rows a multiple of 8" : "");
		return -1;
	}
	return 0;
}

int moek_int4_from_ct(const void *packed, const void *scales, size_t rows, size_t cols,
                      size_t group, void *dst, char *err, size_t err_len)
{
	if (check_shape("compressed-tensors", rows, cols, group, 1, err, err_len))
		return -1;
	const uint8_t *q = packed, *s = scales;
	struct block_int4_g32 *y = dst;
	const size_t nb = cols / QK_INT4, groups = cols / group;
	for (size_t r = 0; r < rows; r++) {
		const uint8_t *qr = q + r * (cols / 2), *sr = s + r * groups * 2;
		for (size_t b = 0; b < nb; b++, y++) {
			/* scale: BF16 bits << 16, exact in f32 */
			const uint32_t bits = (uint32_t)le16(sr + 2 * (b * QK_INT4 / group)) << 16;
			float d;
			memcpy(&d, &bits, sizeof(d));
			put_scale(y, d, 8); /* offset-binary: value = nibble − 8 */
			/* element 2m of the row is byte m's low nibble, 2m + 1 its high nibble */
			const uint8_t *src = qr + b * (QK_INT4 / 2);
			for (size_t j = 0; j < QK_INT4 / 2; j++) {
				const unsigned lo = (src[j / 2] >> (4 * (j % 2))) & 15u;
				const unsigned hi = (src[(j + 16) / 2] >> (4 * (j % 2))) & 15u;
				y->qs[j] = (uint8_t)(lo | hi << 4);
			}
		}
	}
	return 0;
}

/* AutoAWQ's pack order: nibble p of a word holds column 8w + AWQ_ORDER[p] ([0, 2, 4, 6, 1, 3,
 * 5, 7]), so column c sits in nibble awq_nibble[c % 8]. */
static const uint8_t awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

int moek_int4_from_awq(const void *qweight, const void *qzeros, const void *scales, size_t rows,
                       size_t cols, size_t group, void *dst, char *err, size_t err_len)
{
	if (check_shape("AWQ", rows, cols, group, 8, err, err_len))
		return -1;
	const uint8_t *qw = qweight, *qz = qzeros, *sc = scales;
	struct block_int4_g32 *y = dst;
	const size_t nb = cols / QK_INT4, wpr = rows / 8; /* words per input row */
	/* per 32 inputs (32 rows of qweight: 16 · rows bytes, cache-resident), every output */
	for (size_t b = 0; b < nb; b++) {
		const size_t g = b * QK_INT4 / group;
		for (size_t o = 0; o < rows; o++) {
			struct block_int4_g32 *yb = y + o * nb + b;
			const size_t w = o / 8, n = awq_nibble[o % 8];
			put_scale(yb, moek_f16_to_f32(le16(sc + 2 * (g * rows + o))),
			          word_nibble(qz + 4 * (g * wpr + w), n));
			/* input i of output o: nibble awq_nibble[o % 8] of word (i, o / 8) */
			for (size_t j = 0; j < QK_INT4 / 2; j++) {
				const size_t i0 = b * QK_INT4 + j, i1 = i0 + 16;
				const unsigned lo = word_nibble(qw + 4 * (i0 * wpr + w), n);
				const unsigned hi = word_nibble(qw + 4 * (i1 * wpr + w), n);
				yb->qs[j] = (uint8_t)(lo | hi << 4);
			}
		}
	}
	return 0;
}

int moek_int4_from_gptq(const void *qweight, const void *qzeros, const void *scales, size_t rows,
                        size_t cols, size_t group, bool v1, void *dst, char *err, size_t err_len)
{
	if (check_shape("GPTQ", rows, cols, group, 8, err, err_len))
		return -1;
	const uint8_t *qw = qweight, *qz = qzeros, *sc = scales;
	struct block_int4_g32 *y = dst;
	const size_t nb = cols / QK_INT4;
	/* 8 outputs at a time: their words of one input octet are one 32-byte run of qweight,
	 * so each cache line read is used whole while 8 output rows are written in order */
	for (size_t o0 = 0; o0 < rows; o0 += 8)
		for (size_t b = 0; b < nb; b++)
			for (size_t o = o0; o < o0 + 8; o++) {
				struct block_int4_g32 *yb = y + o * nb + b;
				const size_t g = b * QK_INT4 / group;
				unsigned z = word_nibble(qz + 4 * (g * (rows / 8) + o / 8), o % 8);
				if (v1 && z == 15) {
					snprintf(
					    err, err_len,
					    "GPTQ INT4 (v1 zero points): output %zu group %zu "
					    "stores zero 15, i.e. zero point 16, which INT4_G32 "
					    "cannot hold",
					    o, g);
					return -1;
				}
				z += v1;
				put_scale(yb, moek_f16_to_f32(le16(sc + 2 * (g * rows + o))), z);
				/* input i of output o: nibble i % 8 of word (i / 8, o) */
				for (size_t j = 0; j < QK_INT4 / 2; j++) {
					const size_t i0 = b * QK_INT4 + j, i1 = i0 + 16;
					const unsigned lo =
					    word_nibble(qw + 4 * (i0 / 8 * rows + o), i0 % 8);
					const unsigned hi =
					    word_nibble(qw + 4 * (i1 / 8 * rows + o), i1 % 8);
					yb->qs[j] = (uint8_t)(lo | hi << 4);
				}
			}
	return 0;
}
