/* interleave.c — weight rows interleaved in groups of 8 (struct moek_matrix.interleave).
 *
 * Owns the byte layout of the interleaved formats and the permutations into and out of it.
 * A one-token decode dot over GGUF rows spends most of its work per row and per block, not per
 * weight: it reloads the activation block, converts the block's scale and folds a vector into
 * one row's sum. With the blocks of 8 rows stored side by side, one SIMD multiply covers
 * 4 weights of each of the 8 rows against 4 activations broadcast to every lane, the 8 scales
 * are one load, and the 8 results land in 8 lanes with no horizontal sum (x86_avx2.c).
 *
 * The layout is described per format as a list of segments of a block, in the order they are
 * stored in a column (the 8 rows' blocks of one block index): a "vector" segment of L bytes
 * becomes L/4 32-byte vectors, vector v holding bytes 4v..4v+3 of the segment of row r at
 * bytes 4r..4r+3; a "scalar" segment of s bytes becomes 8 consecutive copies, row r's at r·s.
 * Nothing is added or dropped: an interleaved matrix has exactly the bytes of the GGUF one.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kernels_internal.h"

/* The layouts of the formats that have one; their format table rows point here. */
/* 4 vectors of nibble bytes (elements 4v..4v+3 low, 16+4v.. high), then 8 E8M0 bytes */
const struct moek_x8_layout moek_x8_mxfp4 = {2, {{1, 16, true}, {0, 1, false}}, 0, 0};
/* 8 vectors of int8 weights (elements 4v..4v+3), then 8 f16 scales */
const struct moek_x8_layout moek_x8_q8_0 = {2, {{2, 32, true}, {0, 2, false}}, 0, 0};
/* 8 f16 d, 8 f16 dmin, 3 vectors of packed 6-bit scales (bytes 4g..4g+3 of the 12),
 * 32 vectors of nibble bytes (chunk c = vectors 8c..8c+7: sub-block 2c low, 2c+1 high) */
const struct moek_x8_layout moek_x8_q4_K = {
    4, {{0, 2, false}, {2, 2, false}, {4, 12, true}, {16, 128, true}}, 0, 0};
/* 16 elements: 8 vectors of bf16 pairs (elements 2v, 2v+1) */
const struct moek_x8_layout moek_x8_bf16 = {1, {{0, 32, true}}, 16, 32};
/* 4 vectors of nibble bytes (as MXFP4), then one vector of the 8 scale-and-zero words */
const struct moek_x8_layout moek_x8_int4_g32 = {2, {{4, 16, true}, {0, 4, true}}, 0, 0};
/* 8 vectors of code bytes (vectors 2s, 2s+1: sub-block s), then one vector of the 8 rows' 4
 * UE4M3 scales */
const struct moek_x8_layout moek_x8_nvfp4 = {2, {{4, 32, true}, {0, 4, true}}, 0, 0};
/* 8 f16 d, 8 f16 dmin, 4 vectors of scale bytes (sub-blocks 4g..4g+3), 16 vectors of qs */
const struct moek_x8_layout moek_x8_q2_K = {
    4, {{80, 2, false}, {82, 2, false}, {0, 16, true}, {16, 64, true}}, 0, 0};
/* 8 f16 d, 3 vectors of packed scales (bytes 4g..4g+3 of the 12), 8 vectors of hmask,
 * 16 vectors of qs (as Q2_K's) */
/* 4 vectors of nibble bytes (as MXFP4), then 8 f16 scales */
const struct moek_x8_layout moek_x8_iq4_nl = {2, {{2, 16, true}, {0, 2, false}}, 0, 0};
/* 8 f16 d, 8 scales_h words, one vector of scales_l, 32 vectors of nibble bytes */
const struct moek_x8_layout moek_x8_iq4_xs = {
    4, {{0, 2, false}, {2, 2, false}, {4, 4, true}, {8, 128, true}}, 0, 0};
const struct moek_x8_layout moek_x8_q3_K = {
    4, {{108, 2, false}, {96, 12, true}, {0, 32, true}, {32, 64, true}}, 0, 0};

static const struct moek_x8_layout *layout_of(uint32_t format)
{
	const struct moek_format_traits *t = moek_format_traits(format);
	return t ? t->x8 : NULL;
}

bool moek_interleave_supported(uint32_t format)
{
	return layout_of(format) != NULL;
}

size_t moek_x8_block(uint32_t format, size_t *block_bytes)
{
	const struct moek_format_traits *t = moek_format_traits(format);
	const struct moek_x8_layout *l = t ? t->x8 : NULL;
	if (!l)
		return 0;
	if (block_bytes)
		*block_bytes = l->block_elems ? l->block_bytes : t->info.block_bytes;
	return l->block_elems ? l->block_elems : t->info.block_elems;
}

/* Row r's block of an interleaved column, back as a GGUF block (constant-size copies: this
 * runs for every row the prefill path dequantizes). */
static void gather_block(const struct moek_x8_layout *l, const uint8_t *column, size_t r,
                         uint8_t *block)
{
	size_t at = 0; /* the segment's start in the column */
	for (size_t i = 0; i < l->n; i++) {
		const struct moek_x8_segment *s = &l->seg[i];
		uint8_t *b = block + s->offset;
		if (s->vector)
			for (size_t v = 0; v < s->bytes / 4u; v++)
				memcpy(b + 4 * v, column + at + 32 * v + 4 * r, 4);
		else if (s->bytes == 1)
			*b = column[at + r];
		else
			memcpy(b, column + at + 2 * r, 2);
		at += (size_t)MOEK_INTERLEAVE * s->bytes;
	}
}

/* Rows of a whole number of groups: checks the shape, gives the layout and block sizes. */
static const struct moek_x8_layout *shape(uint32_t format, size_t rows, size_t cols, size_t *nb,
                                          size_t *bb)
{
	const struct moek_x8_layout *l = layout_of(format);
	const size_t be = moek_x8_block(format, bb);
	if (!l || !be || !rows || !cols || rows % MOEK_INTERLEAVE || cols % be)
		return NULL;
	*nb = cols / be;
	return l;
}

/* out[32 w + 4 r ..] = the 4 bytes at rows + r · stride + 4 w, for `words` words of 8 rows:
 * the portable form of moek_isa_ops.x8_transpose. */
static void transpose_words(const uint8_t *rows, size_t stride, size_t words, uint8_t *out)
{
	for (size_t w = 0; w < words; w++)
		for (size_t r = 0; r < MOEK_INTERLEAVE; r++)
			memcpy(out + 32 * w + 4 * r, rows + r * stride + 4 * w, 4);
}

/* One group: 8 rows `stride` apart, nb blocks of bb bytes each, into dst. Vector segments go
 * through the ISA's word transpose where it has one: the load path rearranges every expert it
 * reads, and a portable byte loop is several times slower than the disk fills it. */
static void interleave_group(const struct moek_x8_layout *l, size_t bb, const uint8_t *in,
                             size_t stride, size_t nb, uint8_t *dst)
{
	const struct moek_isa_ops *ops = moek_isa_current();
	void (*transpose)(const uint8_t *, size_t, size_t, uint8_t *) =
	    ops->x8_transpose ? ops->x8_transpose : transpose_words;
	for (size_t b = 0; b < nb; b++, dst += MOEK_INTERLEAVE * bb) {
		size_t at = 0;
		for (size_t i = 0; i < l->n; i++) {
			const struct moek_x8_segment *s = &l->seg[i];
			const uint8_t *from = in + b * bb + s->offset;
			if (s->vector)
				transpose(from, stride, s->bytes / 4u, dst + at);
			else if (s->bytes == 1) /* E8M0 */
				for (size_t r = 0; r < MOEK_INTERLEAVE; r++)
					dst[at + r] = from[r * stride];
			else /* f16 scales: a constant size, no library call per row */
				for (size_t r = 0; r < MOEK_INTERLEAVE; r++)
					memcpy(dst + at + 2 * r, from + r * stride, 2);
			at += (size_t)MOEK_INTERLEAVE * s->bytes;
		}
	}
}

int moek_interleave(uint32_t format, const void *src, size_t row_stride, size_t rows, size_t cols,
                    void *dst)
{
	size_t nb, bb;
	const struct moek_x8_layout *l = shape(format, rows, cols, &nb, &bb);
	if (!l)
		return -1;
	const size_t rb = nb * bb, stride = row_stride ? row_stride : rb;
	for (size_t g = 0; g < rows / MOEK_INTERLEAVE; g++)
		interleave_group(l, bb, (const uint8_t *)src + g * MOEK_INTERLEAVE * stride, stride,
		                 nb, (uint8_t *)dst + g * MOEK_INTERLEAVE * rb);
	return 0;
}

int moek_deinterleave(uint32_t format, const void *src, size_t rows, size_t cols, void *dst)
{
	size_t nb, bb;
	const struct moek_x8_layout *l = shape(format, rows, cols, &nb, &bb);
	if (!l)
		return -1;
	const size_t rb = nb * bb;
	for (size_t g = 0; g < rows / MOEK_INTERLEAVE; g++) {
		const uint8_t *column = (const uint8_t *)src + g * MOEK_INTERLEAVE * rb;
		uint8_t *out = (uint8_t *)dst + g * MOEK_INTERLEAVE * rb;
		for (size_t b = 0; b < nb; b++, column += MOEK_INTERLEAVE * bb)
			for (size_t r = 0; r < MOEK_INTERLEAVE; r++)
				gather_block(l, column, r, out + r * rb + b * bb);
	}
	return 0;
}

void moek_x8_gather(uint32_t format, const void *group, size_t lane, size_t b0, size_t nb,
                    void *blocks)
{
	const struct moek_x8_layout *l = layout_of(format);
	size_t bb;
	(void)moek_x8_block(format, &bb);
	const uint8_t *column = (const uint8_t *)group + b0 * MOEK_INTERLEAVE * bb;
	for (size_t b = 0; b < nb; b++, column += MOEK_INTERLEAVE * bb)
		gather_block(l, column, lane, (uint8_t *)blocks + b * bb);
}

void moek_x8_bf16_row(const void *group, size_t lane, size_t k0, size_t n, float *dst)
{
	const uint8_t *at = (const uint8_t *)group + 4 * lane; /* vector p, lane's 4 bytes */
	for (size_t p = k0 / 2; p < (k0 + n) / 2; p++) {
		uint32_t pair, even, odd;
		memcpy(&pair, at + 32 * p, 4);
		even = pair << 16, odd = pair & 0xffff0000u;
		memcpy(dst + 2 * p - k0, &even, 4);
		memcpy(dst + 2 * p + 1 - k0, &odd, 4);
	}
}

/* ---- A whole expert in its decode layout ---------------------------------------------------- */

static size_t matrix_bytes(const struct moek_matrix *m)
{
	return moek_row_bytes(m->format, m->cols) * m->rows;
}

size_t moek_expert_packed_bytes(const struct moek_expert *src)
{
	return 2 * matrix_bytes(&src->gate) + matrix_bytes(&src->down);
}

static bool overlaps(const void *a, size_t na, const void *b, size_t nb)
{
	const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
	return x < y + nb && y < x + na;
}

static size_t src_stride(const struct moek_matrix *m)
{
	return m->row_stride ? m->row_stride : moek_row_bytes(m->format, m->cols);
}

/* Rows [r0, r0 + n) of m to dst, packed (interleaved when x8: n is then 8). */
static void copy_rows(const struct moek_matrix *m, size_t r0, size_t n, bool x8, uint8_t *dst)
{
	const size_t rb = moek_row_bytes(m->format, m->cols), stride = src_stride(m);
	const uint8_t *src = (const uint8_t *)m->data + r0 * stride;
	if (x8) {
		(void)moek_interleave(m->format, src, stride, n, m->cols, dst); /* shape checked */
		return;
	}
	for (size_t r = 0; r < n; r++)
		memcpy(dst + r * rb, src + r * stride, rb);
}

static bool use_x8(const struct moek_matrix *m, bool interleave)
{
	return interleave && moek_interleave_supported(m->format) && m->rows % MOEK_INTERLEAVE == 0;
}

int moek_expert_pack(const struct moek_expert *src, bool interleave, void *dst, size_t dst_bytes,
                     struct moek_expert *packed, char *err, size_t len)
{
	if (moek_expert_check(src, err, len))
		return -1;
	const struct moek_matrix *mats[3] = {&src->gate, &src->up, &src->down};
	for (int i = 0; i < 3; i++) {
		const struct moek_matrix *m = mats[i];
		if (m->row0 || m->interleave) {
			if (err && len)
				snprintf(err, len,
				         "expert pack: the source must be whole matrices in "
				         "GGUF rows (first row %u, interleave %u)",
				         m->row0, m->interleave);
			return -1;
		}
		if (overlaps(m->data, (m->rows - 1) * src_stride(m) + matrix_bytes(m) / m->rows,
		             dst, dst_bytes)) {
			if (err && len)
				snprintf(err, len, "expert pack: destination overlaps the source");
			return -1;
		}
	}
	const size_t need = moek_expert_packed_bytes(src);
	if (!dst || dst_bytes < need) {
		if (err && len)
			snprintf(err, len, "expert pack: %zu bytes of destination, %zu needed",
			         dst ? dst_bytes : 0, need);
		return -1;
	}
	const bool x8_gu = use_x8(&src->gate, interleave), x8_d = use_x8(&src->down, interleave);
	const size_t rb = moek_row_bytes(src->gate.format, src->gate.cols);
	const size_t unit = x8_gu ? MOEK_INTERLEAVE : 1, ffn = src->gate.rows;
	uint8_t *out = dst;
	for (size_t r = 0; r < ffn; r += unit, out += 2 * unit * rb) {
		copy_rows(&src->gate, r, unit, x8_gu, out);
		copy_rows(&src->up, r, unit, x8_gu, out + unit * rb);
	}
	if (x8_d)
		(void)moek_interleave(src->down.format, src->down.data, src_stride(&src->down),
		                      src->down.rows, src->down.cols, out);
	else
		copy_rows(&src->down, 0, src->down.rows, false, out);
	*packed = *src;
	packed->gate.data = dst;
	packed->up.data = (const uint8_t *)dst + unit * rb;
	packed->gate.row_stride = packed->up.row_stride = 2 * rb;
	packed->gate.interleave = packed->up.interleave = x8_gu ? MOEK_INTERLEAVE : 0;
	packed->down.data = out;
	packed->down.row_stride = 0;
	packed->down.interleave = x8_d ? MOEK_INTERLEAVE : 0;
	return 0;
}
