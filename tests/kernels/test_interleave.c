/* test_interleave.c — rows interleaved in groups of 8 (moek_interleave, struct
 * moek_matrix.interleave) for MXFP4, Q8_0, Q4_K, BF16, INT4_G32, Q2_K, Q3_K, IQ4_NL and IQ4_XS
 * (the last four's group dots also bit for bit against a scalar reference of them), and whole
 * experts in their decode layout
 * (moek_expert_pack): the permutation and its inverse, byte positions the layout promises,
 * the rows it dequantizes to, the FFN over it against the same expert in GGUF rows (prefill
 * and the scalar path bit for bit, the decode dots within float reassociation — and, for
 * Q8_0, the activations' unrounded scale), bit-identical results for any split of rows
 * (ranges cutting groups included), the VNNI forms (MXFP4: with and without VBMI) against
 * the AVX2 one, slices, E8M0 scales
 * at their edges, and descriptors the kernels must refuse.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "expert_fixture.h"
#include "kernels_internal.h"

/* Every form the CPU has on (false, nothing changed, where it has no VNNI form), or none. */
static inline bool set_vnni_forms(bool on)
{
	if (!on)
		return moek_set_isa_forms(0);
	const unsigned all = moek_isa_forms_available();
	return (all & MOEK_FORM_VNNI) && moek_set_isa_forms(all);
}

static const uint32_t x8_formats[] = {MOEK_MXFP4,    MOEK_Q8_0, MOEK_Q4_K, MOEK_BF16,
                                      MOEK_INT4_G32, MOEK_Q2_K, MOEK_Q3_K, MOEK_IQ4_NL,
                                      MOEK_IQ4_XS,   MOEK_NVFP4};
#define N_X8 (sizeof(x8_formats) / sizeof(x8_formats[0]))

/* Formats in 256-element super-blocks (K-quants): wider rows where a test needs several. */
static bool k_quant(uint32_t format)
{
	return format == MOEK_Q4_K || format == MOEK_Q2_K || format == MOEK_Q3_K ||
	       format == MOEK_IQ4_XS;
}

static const char *fname(uint32_t format)
{
	return moek_format_lookup(format)->name;
}

/* Decode against the GGUF rows: MXFP4, Q4_K and BF16 see the same activations as the row dots
 * (only the float sums are reassociated); interleaved Q8_0 takes Q8_0 activations with their
 * scale unrounded instead of rounded to f16. Interleaved BF16 keeps its group dot (bf16
 * activations) up to MOEK_PREFILL_MIN_TOKENS tokens, where the GGUF rows already take the
 * float tiles (f32 activations) from MOEK_PREFILL_MIN_TOKENS_FLOAT: there the activations'
 * bf16 rounding is the difference. */
static double decode_nmse_bound(uint32_t format, size_t n)
{
	/* Below MOEK_PREFILL_MIN_TOKENS the GGUF rows may already take the active ISA's bf16
	 * tiles (amx: Q8_0 from 12 tokens) where the interleaved copy keeps its group dots: the
	 * tiles' bound, as for prefill below. */
	const struct moek_isa_ops *ops = moek_isa_current();
	if (format != MOEK_BF16 && ops->tile_bf16 && moek_tile_bf16_takes(format) &&
	    n >= ops->tile_bf16_from[0][moek_fmt_index(format)])
		return 5e-4;
	if (format == MOEK_BF16 && n >= MOEK_PREFILL_MIN_TOKENS_FLOAT)
		return 5e-5;
	return format == MOEK_Q8_0 ? 1e-5 : 1e-11;
}

/* Whether n tokens of interleaved `format` take the active ISA's bf16 tiles rather than the
 * integer group dots (amx: tile_bf16_int_groups, from tile_bf16_from[1]). */
static bool int_group_tiles(uint32_t format, size_t n)
{
	const struct moek_isa_ops *ops = moek_isa_current();
	return ops->tile_bf16_int_groups && moek_tile_bf16_takes(format) &&
	       n >= ops->tile_bf16_from[1][moek_fmt_index(format)];
}

static uint32_t lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* An interleaved copy of m (GGUF rows); the buffer is returned in *owner. */
static struct moek_matrix interleaved_copy(const struct moek_matrix *m, void **owner)
{
	const size_t bytes = moek_row_bytes(m->format, m->cols) * m->rows;
	void *buf = malloc(bytes);
	cr_assert(buf);
	cr_assert_eq(moek_interleave(m->format, m->data, m->row_stride, m->rows, m->cols, buf), 0);
	*owner = buf;
	struct moek_matrix x = *m;
	x.data = buf;
	x.row_stride = 0;
	x.interleave = MOEK_INTERLEAVE;
	return x;
}

struct twin {
	struct fixture f;      /* GGUF rows */
	struct moek_expert x8; /* the same weights interleaved */
	void *owner[3];
};

static void twin_init(struct twin *t, uint32_t format, size_t hidden, size_t ffn,
                      enum moek_activation act, int bias, uint32_t seed)
{
	fixture_init(&t->f, format, 0, hidden, ffn, act, bias, seed);
	t->x8 = t->f.expert;
	t->x8.gate = interleaved_copy(&t->f.expert.gate, &t->owner[0]);
	t->x8.up = interleaved_copy(&t->f.expert.up, &t->owner[1]);
	t->x8.down = interleaved_copy(&t->f.expert.down, &t->owner[2]);
}

static void twin_free(struct twin *t)
{
	for (int i = 0; i < 3; i++)
		free(t->owner[i]);
	fixture_free(&t->f);
}

/* The FFN of e for n tokens with the phases split as given: hidden pieces of `hs` rows
 * (rounded to moek_ffn_hidden_align), down cut at the points in `cuts` (any rows), `workers`
 * workers taking the pieces in turn on this thread. */
static float *run_split(const struct moek_expert *e, const float *x, size_t n, const float *w,
                        unsigned workers, size_t hs, const size_t *cuts, size_t n_cuts)
{
	const size_t hidden = e->gate.cols, ffn = e->gate.rows;
	float *out = calloc(n * hidden, sizeof(float));
	const size_t bytes = moek_ffn_scratch_bytes(e, n, workers);
	void *scratch = malloc(bytes);
	cr_assert(out && scratch && bytes);
	struct moek_ffn_call c = {.expert = e,
	                          .n_tokens = n,
	                          .x = x,
	                          .x_dtype = MOEK_ACT_F32,
	                          .weights = w,
	                          .out = out,
	                          .scratch = scratch,
	                          .scratch_bytes = bytes,
	                          .n_workers = workers};
	char err[256];
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), 0, "%s", err);
	moek_ffn_load(&c, 0, 0, n);
	const size_t a = moek_ffn_hidden_align(e);
	hs = (hs + a - 1) / a * a;
	unsigned wk = 0;
	for (size_t f = 0; f < ffn; f += hs, wk = (wk + 1) % workers)
		moek_ffn_hidden(&c, wk, f, f + hs < ffn ? f + hs : ffn);
	size_t at = 0;
	for (size_t i = 0; i <= n_cuts; i++, wk = (wk + 1) % workers) {
		const size_t to = i < n_cuts ? cuts[i] : hidden;
		moek_ffn_down(&c, wk, at, to);
		at = to;
	}
	free(scratch);
	return out;
}

/* Random bytes for `rows` GGUF rows of `format`, with every f16 scale field made finite (the
 * FFN tests don't need them; the permutation tests only compare bytes). */
static uint8_t *random_rows(size_t bytes, uint32_t seed)
{
	uint8_t *p = malloc(bytes);
	cr_assert(p);
	for (size_t i = 0; i < bytes; i++)
		p[i] = (uint8_t)lcg(&seed);
	return p;
}

/* Where the layout (moe_kernels.h) puts byte `at` of block b of row r, within the group. */
static size_t layout_offset(uint32_t format, size_t cols, size_t r, size_t b, size_t at)
{
	size_t bb;
	(void)moek_x8_block(format, &bb);
	const size_t column = b * 8 * bb;
	switch (format) {
	case MOEK_BF16: /* 16 elements: 8 vectors of pairs */
		return column + 32 * (at / 4) + 4 * r + at % 4;
	case MOEK_MXFP4: /* 4 vectors of qs, 8 E8M0 */
		return column + (at == 0 ? 128 + r : 32 * ((at - 1) / 4) + 4 * r + (at - 1) % 4);
	case MOEK_INT4_G32: /* 4 vectors of qs, 1 vector of the 8 scale words */
		return column +
		       (at < 4 ? 128 + 4 * r + at : 32 * ((at - 4) / 4) + 4 * r + (at - 4) % 4);
	case MOEK_NVFP4: /* 8 vectors of qs, 1 vector of the 8 rows' 4 scales */
		return column +
		       (at < 4 ? 256 + 4 * r + at : 32 * ((at - 4) / 4) + 4 * r + (at - 4) % 4);
	case MOEK_IQ4_XS: /* 8 d, 8 scales_h, 1 vector of scales_l, 32 vectors of qs */
		if (at < 4)
			return column + 16 * (at / 2) + 2 * r + at % 2;
		return column + 32 + 32 * ((at - 4) / 4) + 4 * r + at % 4;
	case MOEK_IQ4_NL: /* 4 vectors of qs, 8 f16 d */
		return column +
		       (at < 2 ? 128 + 2 * r + at : 32 * ((at - 2) / 4) + 4 * r + (at - 2) % 4);
	case MOEK_Q8_0: /* 8 vectors of qs, 8 f16 d */
		return column +
		       (at < 2 ? 256 + 2 * r + at : 32 * ((at - 2) / 4) + 4 * r + (at - 2) % 4);
	case MOEK_Q2_K: /* 8 d, 8 dmin (bytes 80-83), 4 vectors of scales, 16 vectors of qs */
		if (at >= 80)
			return column + 16 * ((at - 80) / 2) + 2 * r + at % 2;
		return column + 32 + 32 * (at / 4) + 4 * r + at % 4;
	case MOEK_Q3_K: /* 8 d (bytes 108-109), 3 vectors of scales (96-107), 8 vectors of
	                   hmask (0-31), 16 vectors of qs (32-95) */
		if (at >= 108)
			return column + 2 * r + at % 2;
		if (at >= 96)
			return column + 16 + 32 * ((at - 96) / 4) + 4 * r + at % 4;
		return column + 112 + 32 * (at / 4) + 4 * r + at % 4;
	default: /* Q4_K: 8 d, 8 dmin, 3 vectors of scales, 32 vectors of qs */
		(void)cols;
		if (at < 4)
			return column + 16 * (at / 2) + 2 * r + at % 2;
		return column + 32 + 32 * ((at - 4) / 4) + 4 * r + (at - 4) % 4;
	}
}

Test(interleave, round_trip_and_layout)
{
	for (size_t fi = 0; fi < N_X8; fi++) {
		const uint32_t format = x8_formats[fi];
		const size_t rows = 24, cols = k_quant(format)        ? 768
		                               : format == MOEK_NVFP4 ? 192
		                                                      : 96;
		size_t bb;
		const size_t rb = moek_row_bytes(format, cols), be = moek_x8_block(format, &bb);
		uint8_t *src = random_rows(rows * rb, 7), *x8 = malloc(rows * rb),
		        *back = malloc(rows * rb);
		cr_assert(x8 && back);
		cr_assert_eq(moek_interleave(format, src, 0, rows, cols, x8), 0);
		cr_assert_neq(memcmp(src, x8, rows * rb), 0, "%s: interleaving changed nothing",
		              fname(format));
		cr_assert_eq(moek_deinterleave(format, x8, rows, cols, back), 0);
		cr_assert_eq(memcmp(src, back, rows * rb), 0, "%s: deinterleave is not the inverse",
		             fname(format));
		/* every byte of row 11's block 2 where the layout says: group 1, lane 3 */
		const uint8_t *group = x8 + 8 * rb;
		for (size_t at = 0; at < bb; at++)
			cr_assert_eq(group[layout_offset(format, cols, 3, 2, at)],
			             src[11 * rb + 2 * bb + at],
			             "%s: byte %zu of the block misplaced", fname(format), at);
		/* a strided source (rows of a wider matrix) */
		uint8_t *wide = calloc(rows, rb + 40);
		cr_assert(wide);
		for (size_t r = 0; r < rows; r++)
			memcpy(wide + r * (rb + 40), src + r * rb, rb);
		cr_assert_eq(moek_interleave(format, wide, rb + 40, rows, cols, back), 0);
		cr_assert_eq(memcmp(x8, back, rows * rb), 0);
		cr_assert_eq(moek_interleave(format, src, 0, 12, cols, x8), -1, "12 rows accepted");
		cr_assert_eq(moek_interleave(format, src, 0, rows, cols + be / 2, x8), -1,
		             "%s: a partial block accepted", fname(format));
		cr_assert_eq(moek_deinterleave(format, x8, 4, cols, back), -1);
		free(src), free(x8), free(back), free(wide);
	}
	cr_assert(!moek_interleave_supported(MOEK_Q4_0) && !moek_interleave_supported(MOEK_F16));
	uint8_t buf[8 * 18];
	cr_assert_eq(moek_interleave(MOEK_Q4_0, buf, 0, 8, 32, buf + 1), -1, "Q4_0 has no layout");
}

Test(interleave, rows_dequantize_to_the_gguf_rows)
{
	for (size_t fi = 0; fi < N_X8; fi++) {
		const uint32_t format = x8_formats[fi];
		struct fixture f; /* real blocks (finite scales) */
		fixture_init(&f, format, 0, 512, 256, MOEK_SWIGLU, 0, 11);
		const struct moek_matrix *m = &f.expert.gate; /* the first 16 of its rows of 512 */
		const size_t rows = 16, cols = m->cols, rb = moek_row_bytes(format, cols);
		size_t bb;
		const size_t be = moek_x8_block(format, &bb), nb = cols / be;
		uint8_t *src = malloc(rows * rb), *x8 = malloc(rows * rb), *blocks = malloc(rb);
		float *want = malloc(rows * cols * sizeof(float)),
		      *got = malloc(cols * sizeof(float));
		cr_assert(src && x8 && blocks && want && got);
		memcpy(src, m->data, rows * rb);
		if (format == MOEK_MXFP4) /* E8M0 edges: 0 (2^-127), 1, 254, 255 (NaN) */
			src[0 * rb] = 0, src[1 * rb + 17] = 1, src[2 * rb + 34] = 254,
			        src[3 * rb] = 255;
		cr_assert_eq(moek_interleave(format, src, 0, rows, cols, x8), 0);
		cr_assert_eq(moek_dequantize(format, src, NULL, rows, cols, want), 0);
		for (size_t r = 0; r < rows; r++) {
			moek_x8_gather(format, x8 + r / 8 * 8 * rb, r % 8, 0, nb, blocks);
			cr_assert_eq(memcmp(blocks, src + r * rb, rb), 0,
			             "%s: row %zu's blocks differ", fname(format), r);
			cr_assert_eq(moek_dequantize(format, blocks, NULL, 1, cols, got), 0);
			cr_assert_eq(memcmp(got, want + r * cols, cols * sizeof(float)), 0,
			             "%s: row %zu differs", fname(format), r);
			moek_x8_gather(format, x8 + r / 8 * 8 * rb, r % 8, 1, nb - 1, blocks);
			cr_assert_eq(memcmp(blocks, src + r * rb + bb, rb - bb), 0,
			             "%s: row %zu from block 1 differs", fname(format), r);
		}
		free(src), free(x8), free(blocks), free(want), free(got);
		fixture_free(&f);
	}
}

/* Decode (1, 3, 8, 13 tokens) within float reassociation of the GGUF-row dots; BF16's prefill
 * (the same dequantized tiles) and the scalar path (the same dequantized rows) bit for bit;
 * the integer formats' many tokens (40, 130: their group dots over quantized activations)
 * bit for bit what the same expert gives in calls of 8 tokens, and within the activations'
 * quantization of the GGUF rows' tiles (f32 activations) — or, where the ISA's tiles take the
 * groups (amx at 130), the GGUF rows' tiles bit for bit; all as close to the float originals
 * as the format allows (test_ffn's bounds). */
Test(interleave, ffn_equals_the_gguf_rows)
{
	for (size_t fi = 0; fi < N_X8; fi++) {
		const uint32_t format = x8_formats[fi];
		struct twin t;
		twin_init(&t, format, 256, 256, MOEK_SWIGLU_OAI, 1, 5);
		const size_t counts[] = {1, 3, 8, 13, 40, 130};
		for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
			const size_t n = counts[i];
			float *x = fixture_tokens(n, t.f.hidden, 100 + (uint32_t)n);
			float *w = malloc(n * sizeof(float));
			double *orig = calloc(n * t.f.hidden, sizeof(double));
			cr_assert(w && orig);
			for (size_t k = 0; k < n; k++)
				w[k] = 0.25f + 0.5f * (float)k / (float)n;
			float *ref = fixture_run(&t.f, x, n, w);
			struct fixture fx = t.f;
			fx.expert = t.x8;
			float *got = fixture_run(&fx, x, n, w);
			const size_t m = n * t.f.hidden;
			/* NVFP4 takes the tiles from 16 tokens, as BF16 (ffn.c); where the ISA's
			 * tiles take over from the integer group dots (amx), the interleaved copy
			 * runs the same tiles as the GGUF rows from its own count */
			if (n >= MOEK_PREFILL_MIN_TOKENS && format != MOEK_BF16 &&
			    format != MOEK_NVFP4 && !int_group_tiles(format, n)) {
				for (size_t t0 = 0; t0 < n; t0 += 8) {
					const size_t nt = n - t0 < 8 ? n - t0 : 8;
					float *part =
					    fixture_run(&fx, x + t0 * t.f.hidden, nt, w + t0);
					cr_assert_eq(
					    memcmp(part, got + t0 * t.f.hidden,
					           nt * t.f.hidden * sizeof(float)),
					    0,
					    "%s, %zu tokens: bits differ from calls of 8 tokens "
					    "(tokens %zu..)",
					    fname(format), n, t0);
					free(part);
				}
				/* ggml's test of its quantized mat-mul (quantized activations)
				 * accepts 5e-4 */
				const double e = nmse_f(got, ref, m);
				cr_assert_lt(e, 5e-4,
				             "%s, %zu tokens: nmse %g against the GGUF rows' tiles",
				             fname(format), n, e);
				cr_log_info("%s, %zu tokens: nmse %g against the tiles",
				            fname(format), n, e);
			} else if (n >= MOEK_PREFILL_MIN_TOKENS) {
				cr_assert_eq(
				    memcmp(got, ref, m * sizeof(float)), 0,
				    "%s prefill, %zu tokens: bits differ from the GGUF rows",
				    fname(format), n);
			} else {
				const double e = nmse_f(got, ref, m);
				cr_assert_lt(e, decode_nmse_bound(format, n),
				             "%s decode, %zu tokens: nmse %g against the GGUF rows",
				             fname(format), n, e);
			}
			fixture_oracle(&t.f, 1, x, n, w, orig);
			const double rel = mean_rel_abs(got, orig, m);
			cr_assert_lt(rel,
			             format == MOEK_BF16   ? 0.01
			             : format == MOEK_Q8_0 ? 0.03
			             : format == MOEK_Q4_K ? 0.15
			             : format == MOEK_Q3_K ? 0.35
			             : format == MOEK_Q2_K ? 0.8
			                                   : 0.3,
			             "%s, %zu tokens: %g from the float originals", fname(format),
			             n, rel);
			cr_assert_eq(moek_set_isa(MOEK_ISA_SCALAR), 0);
			float *sref = fixture_run(&t.f, x, n, w), *sgot = fixture_run(&fx, x, n, w);
			cr_assert_eq(memcmp(sgot, sref, m * sizeof(float)), 0,
			             "%s scalar path, %zu tokens: bits differ", fname(format), n);
			cr_assert_eq(moek_set_isa(MOEK_ISA_AUTO), 0);
			free(x), free(w), free(orig), free(ref), free(got), free(sref), free(sgot);
		}
		twin_free(&t);
	}
}

/* Many tokens: the integer formats' group dots walk tokens in blocks of about 256 KiB of
 * activations (here 816 tokens of 256 columns: 1000 tokens make two blocks, the second
 * partial) and rows in chunks; the result is still, bit for bit, the same expert run in calls
 * of 8 tokens. On an ISA whose tiles take those tokens (amx) the group dots are avx512's, run
 * under avx512. */
Test(interleave, many_tokens_in_blocks)
{
	const uint32_t formats[] = {MOEK_MXFP4, MOEK_Q8_0, MOEK_Q4_K};
	if (moek_isa_current()->tile_bf16_int_groups)
		cr_assert_eq(moek_set_isa(MOEK_ISA_AVX512), 0);
	for (size_t fi = 0; fi < sizeof(formats) / sizeof(formats[0]); fi++) {
		struct twin t;
		twin_init(&t, formats[fi], 256, 256, MOEK_SWIGLU, 1, 11);
		const size_t n = 1000, h = t.f.hidden;
		float *x = fixture_tokens(n, h, 21), *w = malloc(n * sizeof(float));
		cr_assert(w);
		for (size_t k = 0; k < n; k++)
			w[k] = 0.5f + (float)(k % 7) / 8.0f;
		struct fixture fx = t.f;
		fx.expert = t.x8;
		float *got = fixture_run(&fx, x, n, w);
		for (size_t t0 = 0; t0 < n; t0 += 8) {
			const size_t nt = n - t0 < 8 ? n - t0 : 8;
			float *part = fixture_run(&fx, x + t0 * h, nt, w + t0);
			cr_assert_eq(memcmp(part, got + t0 * h, nt * h * sizeof(float)), 0,
			             "%s, %zu tokens: tokens %zu.. differ from a call of 8",
			             fname(formats[fi]), n, t0);
			free(part);
		}
		free(x), free(w), free(got);
		twin_free(&t);
	}
	cr_assert_eq(moek_set_isa(MOEK_ISA_AUTO), 0);
}

/* Any split of the hidden and down rows, cuts inside groups included, gives the same bits. */
Test(interleave, splits_cutting_groups_give_the_same_bits)
{
	for (size_t fi = 0; fi < N_X8; fi++) {
		const uint32_t format = x8_formats[fi];
		struct twin t;
		twin_init(&t, format, k_quant(format) ? 512 : 320, 256, MOEK_SWIGLU, 0, 9);
		const size_t counts[] = {1, 5, 8};
		for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
			const size_t n = counts[i];
			float *x = fixture_tokens(n, t.f.hidden, 7);
			float *whole = run_split(&t.x8, x, n, NULL, 1, t.f.ffn, NULL, 0);
			const size_t cuts_a[] = {3, 8, 13, 101, 319}, cuts_b[] = {160};
			float *a = run_split(&t.x8, x, n, NULL, 3, 16, cuts_a, 5);
			float *b = run_split(&t.x8, x, n, NULL, 2, 48, cuts_b, 1);
			const size_t bytes = n * t.f.hidden * sizeof(float);
			cr_assert_eq(memcmp(a, whole, bytes), 0, "%s, %zu tokens: split A differs",
			             fname(format), n);
			cr_assert_eq(memcmp(b, whole, bytes), 0, "%s, %zu tokens: split B differs",
			             fname(format), n);
			free(x), free(whole), free(a), free(b);
		}
		twin_free(&t);
	}
}

Test(interleave, vnni_form_gives_the_avx2_bits)
{
	if (!set_vnni_forms(true)) {
		cr_log_info("no AVX512-VNNI here: the plain AVX2 form is the only one");
		return;
	}
	for (size_t fi = 0; fi < N_X8; fi++) {
		const uint32_t format = x8_formats[fi];
		struct twin t;
		twin_init(&t, format, 256, 256, MOEK_SWIGLU, 0, 21);
		for (size_t n = 1; n <= 8; n++) {
			float *x = fixture_tokens(n, t.f.hidden, 3);
			struct fixture fx = t.f;
			fx.expert = t.x8;
			cr_assert(set_vnni_forms(true));
			float *v = fixture_run(&fx, x, n, NULL);
			/* MXFP4's VBMI lookup off: the plain VNNI form (where VBMI is on by
			 * default) */
			const bool vbmi = moek_isa_forms() & MOEK_FORM_VBMI;
			cr_assert(moek_set_isa_forms(MOEK_FORM_VNNI));
			float *nv = fixture_run(&fx, x, n, NULL);
			cr_assert(set_vnni_forms(false));
			cr_assert(!moek_set_isa_forms(MOEK_FORM_VBMI), "VBMI form without VNNI");
			cr_assert_eq(moek_isa_forms(), 0, "a refused form changes nothing");
			float *p = fixture_run(&fx, x, n, NULL);
			cr_assert(set_vnni_forms(true));
			cr_assert_eq(memcmp(v, p, n * t.f.hidden * sizeof(float)), 0,
			             "%s, %zu tokens: VNNI%s and AVX2 forms differ", fname(format),
			             n, vbmi ? " (VBMI)" : "");
			cr_assert_eq(memcmp(nv, p, n * t.f.hidden * sizeof(float)), 0,
			             "%s, %zu tokens: VNNI without VBMI and AVX2 forms differ",
			             fname(format), n);
			free(x), free(v), free(nv), free(p);
		}
		twin_free(&t);
	}
}

/* ---- Q2_K, Q3_K, IQ4_NL, IQ4_XS group dots against their scalar reference --------------- */

/* Code of element e (0..255) of a Q2_K / Q3_K block's 2-bit field (qs byte 32 h + l, bits 2 s:
 * element 128 h + 32 s + l). */
static int low2_code(const uint8_t *qs, size_t e)
{
	return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

/* The scalar reference of the Q2_K / Q3_K / IQ4_NL group dots: each row of the interleaved
 * group (its GGUF blocks back through moek_x8_gather) against nt activation rows (Q8_K;
 * IQ4_NL: MOEK_ACT_Q8_0S), a block's integer sums exact and its float steps in the group dots'
 * order — Q2_K: acc − (dmin · dy) · Σ m_j bsum_j, then + (d · dy) · Σ sc_j Σ q y; Q3_K:
 * acc + (d · dy) · Σ (sc_j − 32) Σ (q − 4) y; IQ4_NL: acc + (d · dy) · Σ level · y; IQ4_XS,
 * per 32-element sub-block: acc + Σ level · y · ((d · (ls − 32)) · dy) — each one fused
 * multiply-add: the SIMD forms must give exactly these bits. */
static void k23_group_ref(uint32_t format, const uint8_t *group, const uint8_t *act, size_t as,
                          size_t nt, size_t k, float *out)
{
	size_t bb;
	const size_t nb = k / moek_x8_block(format, &bb);
	uint8_t *blocks = malloc(nb * bb);
	cr_assert(blocks);
	for (size_t r = 0; r < MOEK_INTERLEAVE; r++) {
		moek_x8_gather(format, group, r, 0, nb, blocks);
		for (size_t t = 0; t < nt; t++) {
			float acc = 0.0f;
			for (size_t i = 0; i < nb && format == MOEK_IQ4_NL; i++) {
				const struct block_q8_0s *y =
				    (const struct block_q8_0s *)(act + t * as) + i;
				const struct block_iq4_nl *b =
				    (const struct block_iq4_nl *)blocks + i;
				int32_t sum = 0;
				for (size_t e = 0; e < 16; e++)
					sum += moek_iq4_kvalues[b->qs[e] & 15] * y->qs[e] +
					       moek_iq4_kvalues[b->qs[e] >> 4] * y->qs[e + 16];
				acc = fmaf(moek_f16_to_f32(b->d) * y->d, (float)sum, acc);
			}
			for (size_t i = 0; i < nb && format == MOEK_IQ4_XS; i++) {
				const struct block_q8_K *y =
				    (const struct block_q8_K *)(act + t * as) + i;
				const struct block_iq4_xs *b =
				    (const struct block_iq4_xs *)blocks + i;
				for (int ib = 0; ib < 8; ib++) {
					int32_t sum = 0;
					for (size_t e = 0; e < 16; e++) {
						const uint8_t q = b->qs[16 * ib + e];
						sum +=
						    moek_iq4_kvalues[q & 15] * y->qs[32 * ib + e] +
						    moek_iq4_kvalues[q >> 4] *
						        y->qs[32 * ib + 16 + e];
					}
					const float f =
					    moek_f16_to_f32(b->d) * (float)moek_iq4_xs_scale(b, ib);
					acc = fmaf((float)sum, f * y->d, acc);
				}
			}
			for (size_t i = 0; i < nb && format != MOEK_IQ4_NL && format != MOEK_IQ4_XS;
			     i++) {
				const struct block_q8_K *y =
				    (const struct block_q8_K *)(act + t * as) + i;
				int32_t sum = 0, mins = 0;
				if (format == MOEK_Q2_K) {
					const struct block_q2_K *b =
					    (const struct block_q2_K *)blocks + i;
					for (size_t j = 0; j < 16; j++) {
						int32_t s = 0;
						for (size_t e = 16 * j; e < 16 * j + 16; e++)
							s += low2_code(b->qs, e) * y->qs[e];
						sum += (b->scales[j] & 15) * s;
						mins += (b->scales[j] >> 4) * y->bsums[j];
					}
					acc = fmaf(-(moek_f16_to_f32(b->dmin) * y->d), (float)mins,
					           acc);
					acc = fmaf(moek_f16_to_f32(b->d) * y->d, (float)sum, acc);
				} else {
					const struct block_q3_K *b =
					    (const struct block_q3_K *)blocks + i;
					uint8_t sc[16];
					moek_q3_scales(b->scales, sc);
					for (size_t j = 0; j < 16; j++) {
						int32_t s = 0;
						for (size_t e = 16 * j; e < 16 * j + 16; e++) {
							const int hb =
							    (b->hmask[e % 32] >> (e / 32)) & 1;
							s += (low2_code(b->qs, e) + 4 * hb - 4) *
							     y->qs[e];
						}
						sum += (sc[j] - 32) * s;
					}
					acc = fmaf(moek_f16_to_f32(b->d) * y->d, (float)sum, acc);
				}
			}
			out[t * MOEK_INTERLEAVE + r] = acc;
		}
	}
	free(blocks);
}

/* Random Q2_K / Q3_K / IQ4_NL rows: every byte random but the f16 scales, which are finite
 * (both signs; d or dmin zero now and then). */
static uint8_t *random_k23_rows(uint32_t format, size_t rows, size_t k, uint32_t seed)
{
	const struct moek_format_info *fi = moek_format_lookup(format);
	const size_t bb = fi->block_bytes, n = rows * (k / fi->block_elems);
	const size_t at = format == MOEK_Q2_K ? 80 : format == MOEK_Q3_K ? 108 : 0;
	uint8_t *p = random_rows(n * bb, seed);
	for (size_t i = 0; i < n; i++) {
		for (size_t f = 0; f < (format == MOEK_Q2_K ? 2u : 1u); f++) {
			const float v = lcg(&seed) % 13 == 0
			                    ? 0.0f
			                    : ((float)(lcg(&seed) % 2001) - 1000.0f) * 1e-5f;
			const uint16_t h = moek_f32_to_f16(v);
			memcpy(p + i * bb + at + 2 * f, &h, 2);
		}
	}
	return p;
}

/* The Q2_K / Q3_K / IQ4_NL / IQ4_XS group dots, on every ISA this CPU has (moek_set_isa) and in
 * each form (VNNI on and off), give their scalar reference's bits for random blocks, every token
 * count 1..8 and several widths, including activation rows at a stride wider than the row; and they
 * stay within float reassociation of the GGUF-row dots of the same rows. */
Test(interleave, k23_group_dots_equal_their_scalar_reference)
{
	const uint32_t formats[] = {MOEK_Q2_K, MOEK_Q3_K, MOEK_IQ4_NL, MOEK_IQ4_XS};
	const size_t widths[] = {256, 768, 2048};
	const enum moek_isa isas[] = {MOEK_ISA_AVX2, MOEK_ISA_AVX512};
	for (size_t fi = 0; fi < sizeof(formats) / sizeof(formats[0]); fi++) {
		const uint32_t format = formats[fi];
		const enum moek_fmt f = moek_fmt_index(format);
		if (!moek_interleave_supported(format))
			continue;
		for (size_t wi = 0; wi < sizeof(widths) / sizeof(widths[0]); wi++) {
			const size_t k = widths[wi], rows = 16, nt_max = 8;
			const size_t rb = moek_row_bytes(format, k);
			uint8_t *src =
			    random_k23_rows(format, rows, k, 100 + (uint32_t)(fi * 7 + wi));
			uint8_t *x8 = malloc(rows * rb);
			cr_assert(x8);
			cr_assert_eq(moek_interleave(format, src, 0, rows, k, x8), 0);
			float *x = fixture_tokens(nt_max, k, 7 + (uint32_t)wi);
			/* past the widest activation row (Q8_0X2's, 2 bytes an element): a
			 * stride wider than the row */
			const size_t as = 2 * k + 292;
			uint8_t *act = calloc(nt_max, as), *act_r = calloc(nt_max, as);
			float *want = malloc(nt_max * 8 * sizeof(float)),
			      *got = malloc(nt_max * 8 * sizeof(float)),
			      *row = malloc(nt_max * rows * sizeof(float)),
			      *grp = malloc(nt_max * rows * sizeof(float));
			cr_assert(act && act_r && want && got && row && grp);
			for (size_t ii = 0; ii < sizeof(isas) / sizeof(isas[0]); ii++) {
				if (moek_set_isa(isas[ii]) != 0)
					continue;
				const struct moek_isa_ops *ops = moek_isa_current();
				cr_assert(ops->dot_x8[f], "%s: no group dot on %s", fname(format),
				          ops->name);
				/* the group dot's activations and the row dot's (IQ4_NL: Q8_0S and
				 * Q8_0X2, the same quantization; K-quants: Q8_K both) */
				const uint32_t ag = moek_isa_act_fmt(ops, f, true),
				               ar = moek_isa_act_fmt(ops, f, false);
				for (size_t t = 0; t < nt_max; t++) {
					moek_isa_quantize_act(ops, ag, x + t * k, k, act + t * as);
					moek_isa_quantize_act(ops, ar, x + t * k, k,
					                      act_r + t * as);
				}
				for (int vnni = 0; vnni < 2; vnni++) {
					if (!set_vnni_forms(vnni))
						continue;
					for (size_t nt = 1; nt <= nt_max; nt++) {
						for (size_t g = 0; g < rows / 8; g++) {
							const uint8_t *group = x8 + g * 8 * rb;
							k23_group_ref(format, group, act, as, nt, k,
							              want);
							ops->dot_x8[f](group, act, as, nt, k, got);
							cr_assert_eq(memcmp(got, want,
							                    nt * 8 * sizeof(float)),
							             0,
							             "%s %s%s, %zu columns, %zu "
							             "tokens, group "
							             "%zu: bits differ from the "
							             "scalar reference",
							             fname(format), ops->name,
							             vnni ? " vnni" : "", k, nt, g);
							for (size_t t = 0; t < nt; t++)
								for (size_t r = 0; r < 8; r++)
									grp[t * rows + 8 * g + r] =
									    got[t * 8 + r];
						}
						for (size_t r = 0; r < rows; r++) {
							float o[8];
							ops->dot[f](src + r * rb, NULL, act_r, as,
							            nt, k, o);
							for (size_t t = 0; t < nt; t++)
								row[t * rows + r] = o[t];
						}
						const double e = nmse_f(grp, row, nt * rows);
						cr_assert_lt(
						    e, 1e-11,
						    "%s %s, %zu tokens: nmse %g against the "
						    "row dots",
						    fname(format), ops->name, nt, e);
					}
				}
				set_vnni_forms(true);
			}
			cr_assert_eq(moek_set_isa(MOEK_ISA_AUTO), 0);
			free(src), free(x8), free(x), free(act), free(act_r), free(want), free(got),
			    free(row), free(grp);
		}
	}
}

/* Extreme weights: Q8_0's -128 (|w| = 128 in the sign form, 0 after the 0x80 flip) and
 * 127, Q4_K's largest 6-bit scales and mins over all-15 or all-0 nibbles, INT4_G32's codes 15
 * with zero point 0 and codes 0 with zero point 15, Q2_K's and Q3_K's largest scales over their
 * largest and smallest codes, against
 * activations at +-127 — the corners of the integer sums. Both forms give the same bits
 * (maddubs would saturate silently), within reassociation of the GGUF-row dot. */
Test(interleave, integer_corners)
{
	for (size_t fi = 1; fi < N_X8; fi++) {
		const uint32_t format = x8_formats[fi];
		if (format == MOEK_BF16)
			continue; /* integer sums only */
		struct twin t;
		twin_init(&t, format, 256, 256, MOEK_SWIGLU, 0, 31);
		uint8_t *g = (uint8_t *)t.f.gate.data;
		const size_t rb = moek_row_bytes(format, 256);
		for (size_t r = 0; r < 8; r++) { /* rows 0-7 of gate: every weight at a corner */
			uint8_t *row = g + r * rb;
			if (format == MOEK_Q8_0) {
				for (size_t b = 0; b < 8; b++)
					memset(row + b * 34 + 2, r % 2 ? 0x80 : 0x7f, 32);
			} else if (format == MOEK_INT4_G32) {
				for (size_t b = 0; b < 8; b++) { /* (q - z) = +15 or -15 */
					row[b * 20] =
					    (uint8_t)((row[b * 20] & 0xf0) | (r % 2 ? 15 : 0));
					memset(row + b * 20 + 4, r % 2 ? 0x00 : 0xff, 16);
				}
			} else if (format == MOEK_IQ4_NL) { /* levels 113 or -127 */
				for (size_t b = 0; b < 8; b++)
					memset(row + b * 18 + 2, r % 2 ? 0xff : 0x00, 16);
			} else if (format == MOEK_IQ4_XS) { /* scales +31, levels 113 / -127 */
				memset(row + 2, 0xff, 6);
				memset(row + 8, r % 2 ? 0xff : 0x00, 128);
			} else if (format == MOEK_Q2_K) { /* scales and mins 15, codes 3 or 0 */
				memset(row, 0xff, 16);
				memset(row + 16, r % 2 ? 0xff : 0x00, 64);
			} else if (format == MOEK_Q3_K) { /* scales +31, codes +3 or -4 */
				memset(row + 96, 0xff, 12);
				memset(row, r % 2 ? 0xff : 0x00, 96);
			} else {
				memset(row + 4, 0xff, 12); /* scales and mins 63 */
				memset(row + 16, r % 2 ? 0xff : 0x00, 128);
			}
		}
		free(t.owner[0]);
		t.x8.gate = interleaved_copy(&t.f.expert.gate, &t.owner[0]);
		float *x = fixture_tokens(1, t.f.hidden, 5);
		for (size_t k = 0; k < t.f.hidden; k++)
			x[k] = k % 3 ? 1.0f : -1.0f; /* quantizes to +-127 */
		struct fixture fx = t.f;
		fx.expert = t.x8;
		float *rows = fixture_run(&t.f, x, 1, NULL);
		float *got[2] = {NULL, NULL};
		for (int vnni = 0; vnni < 2; vnni++) {
			if (!set_vnni_forms(vnni))
				break;
			got[vnni] = fixture_run(&fx, x, 1, NULL);
			const double e = nmse_f(got[vnni], rows, t.f.hidden);
			cr_assert_lt(e, decode_nmse_bound(format, 1),
			             "%s %s: nmse %g against GGUF rows", fname(format),
			             vnni ? "VNNI" : "AVX2", e);
		}
		if (got[1])
			cr_assert_eq(memcmp(got[0], got[1], t.f.hidden * sizeof(float)), 0,
			             "%s: the forms differ at the corners", fname(format));
		set_vnni_forms(true);
		free(x), free(rows), free(got[0]), free(got[1]);
		twin_free(&t);
	}
}

/* NaN and subnormal scales flow through the interleaved dots as through the GGUF ones. */
Test(interleave, e8m0_edges_in_the_decode_dot)
{
	struct twin t;
	twin_init(&t, MOEK_MXFP4, 128, 64, MOEK_SWIGLU, 0, 13);
	uint8_t *down = (uint8_t *)t.owner[2];
	/* row 5 of down: block 1's scale NaN; row 6: every block at the smallest scale */
	down[1 * 136 + 128 + 5] = 255;
	for (size_t b = 0; b < 2; b++)
		down[b * 136 + 128 + 6] = 0;
	float *x = fixture_tokens(1, t.f.hidden, 1);
	struct fixture fx = t.f;
	fx.expert = t.x8;
	float *got = fixture_run(&fx, x, 1, NULL);
	cr_assert(isnan(got[5]), "a NaN scale gave %g", (double)got[5]);
	cr_assert(isfinite(got[6]) && fabsf(got[6]) < 1e-30f, "2^-127 scales gave %g",
	          (double)got[6]);
	for (size_t o = 0; o < t.f.hidden; o++)
		if (o != 5)
			cr_assert(isfinite(got[o]), "row %zu: %g", o, (double)got[o]);
	free(x), free(got);
	twin_free(&t);
}

/* A slice of an interleaved expert (the forward engine's NUMA split) computes what the same
 * slice of the GGUF rows does (scalar path: bit for bit). */
Test(interleave, slices_of_an_interleaved_expert)
{
	for (size_t fi = 0; fi < N_X8; fi++) {
		const uint32_t format = x8_formats[fi];
		struct twin t;
		twin_init(&t, format, 256, 512, MOEK_SWIGLU, 0, 17);
		const size_t at = 256;
		cr_assert_eq(at % moek_expert_split_align(&t.x8), 0);
		float *x = fixture_tokens(2, t.f.hidden, 2);
		cr_assert_eq(moek_set_isa(MOEK_ISA_SCALAR), 0);
		for (int part = 0; part < 2; part++) {
			struct moek_expert sg, sx;
			char err[256];
			const size_t b = part ? at : 0, e = part ? t.f.ffn : at;
			cr_assert_eq(moek_expert_slice(&t.f.expert, b, e, &sg, err, sizeof(err)), 0,
			             "%s", err);
			cr_assert_eq(moek_expert_slice(&t.x8, b, e, &sx, err, sizeof(err)), 0, "%s",
			             err);
			struct fixture fg = t.f, fx = t.f;
			fg.expert = sg, fx.expert = sx;
			float *want = fixture_run(&fg, x, 2, NULL),
			      *got = fixture_run(&fx, x, 2, NULL);
			cr_assert_eq(memcmp(got, want, 2 * t.f.hidden * sizeof(float)), 0,
			             "%s: slice [%zu, %zu) differs", fname(format), b, e);
			free(want), free(got);
		}
		cr_assert_eq(moek_set_isa(MOEK_ISA_AUTO), 0);
		free(x);
		twin_free(&t);
	}
}

/* moek_expert_pack: gate and up alternate in one buffer (a row, or a group of 8 of each),
 * down follows; the packed expert computes the bits of the separate one with the same
 * interleaving, at every token count and on the scalar path. */
Test(interleave, packed_experts)
{
	const uint32_t formats[] = {MOEK_MXFP4, MOEK_Q8_0, MOEK_Q4_K, MOEK_BF16, MOEK_Q6_K};
	for (size_t fi = 0; fi < sizeof(formats) / sizeof(formats[0]); fi++) {
		const uint32_t format = formats[fi];
		struct twin t;
		if (moek_interleave_supported(format)) {
			twin_init(&t, format, 256, 256, MOEK_SWIGLU_OAI, 1, 41);
		} else {
			memset(&t, 0, sizeof(t));
			fixture_init(&t.f, format, 0, 256, 256, MOEK_SWIGLU_OAI, 1, 41);
			t.x8 = t.f.expert;
		}
		const size_t rb = moek_row_bytes(format, 256),
		             bytes = moek_expert_packed_bytes(&t.f.expert);
		cr_assert_eq(bytes, 3 * 256 * rb);
		uint8_t *buf = malloc(bytes);
		cr_assert(buf);
		for (int x8 = 0; x8 < 2; x8++) {
			struct moek_expert pk;
			char err[256];
			cr_assert_eq(
			    moek_expert_pack(&t.f.expert, x8, buf, bytes, &pk, err, sizeof(err)), 0,
			    "%s: %s", fname(format), err);
			const bool grouped = x8 && moek_interleave_supported(format);
			const size_t unit = grouped ? 8 : 1;
			cr_assert_eq(pk.gate.data, buf);
			cr_assert_eq((const uint8_t *)pk.up.data - buf, (ptrdiff_t)(unit * rb));
			cr_assert_eq(pk.gate.row_stride, 2 * rb);
			cr_assert_eq((const uint8_t *)pk.down.data - buf,
			             (ptrdiff_t)(2 * 256 * rb));
			cr_assert_eq(pk.gate.interleave, grouped ? MOEK_INTERLEAVE : 0u);
			/* up's row 9 sits right after gate's rows of its unit */
			const uint8_t *up9 = (const uint8_t *)t.f.up.data + 9 * rb;
			if (!grouped)
				cr_assert_eq(memcmp(buf + (2 * 9 + 1) * rb, up9, rb), 0);
			const struct moek_expert *same = grouped ? &t.x8 : &t.f.expert;
			for (int scalar = 0; scalar < 2; scalar++) {
				cr_assert_eq(moek_set_isa(scalar ? MOEK_ISA_SCALAR : MOEK_ISA_AUTO),
				             0);
				for (size_t n = 1; n <= 20; n += 19) {
					float *x = fixture_tokens(n, 256, 9);
					struct fixture fa = t.f, fb = t.f;
					fa.expert = *same, fb.expert = pk;
					float *want = fixture_run(&fa, x, n, NULL),
					      *got = fixture_run(&fb, x, n, NULL);
					cr_assert_eq(memcmp(got, want, n * 256 * sizeof(float)), 0,
					             "%s %s, %zu tokens: the packed expert differs",
					             fname(format), x8 ? "x8" : "rows", n);
					free(x), free(want), free(got);
				}
			}
			cr_assert_eq(moek_set_isa(MOEK_ISA_AUTO), 0);
		}
		char err[256];
		struct moek_expert pk;
		cr_assert_eq(
		    moek_expert_pack(&t.f.expert, true, buf, bytes - 1, &pk, err, sizeof(err)), -1);
		cr_assert(strstr(err, "needed"), "%s", err);
		cr_assert_eq(
		    moek_expert_pack(&t.f.expert, true, t.f.up.data, bytes, &pk, err, sizeof(err)),
		    -1, "an overlapping destination was accepted");
		cr_assert(strstr(err, "overlap"), "%s", err);
		if (moek_interleave_supported(format)) {
			cr_assert_eq(
			    moek_expert_pack(&t.x8, true, buf, bytes, &pk, err, sizeof(err)), -1,
			    "an interleaved source was accepted");
			cr_assert(strstr(err, "GGUF rows"), "%s", err);
			twin_free(&t);
		} else {
			fixture_free(&t.f);
		}
		free(buf);
	}
}

/* Tails: a gate/up whose rows are not a multiple of 8 (100 rows of Q2_K, Q3_K, IQ4_NL or
 * IQ4_XS over an F16 down, whose block allows any width) keeps its GGUF rows in the packed
 * expert, which then computes the separate one's bits; 104 rows are grouped, within
 * reassociation of the rows. */
Test(interleave, rows_not_a_multiple_of_8_stay_rows)
{
	const uint32_t formats[] = {MOEK_Q2_K, MOEK_Q3_K, MOEK_IQ4_NL, MOEK_IQ4_XS};
	for (size_t fi = 0; fi < sizeof(formats) / sizeof(formats[0]); fi++) {
		for (size_t ffn = 100; ffn <= 104; ffn += 4) {
			struct fixture f;
			fixture_init(&f, formats[fi], MOEK_F16, 256, ffn, MOEK_SWIGLU, 0, 61);
			const size_t bytes = moek_expert_packed_bytes(&f.expert);
			uint8_t *buf = malloc(bytes);
			cr_assert(buf);
			struct moek_expert pk;
			char err[256];
			cr_assert_eq(
			    moek_expert_pack(&f.expert, true, buf, bytes, &pk, err, sizeof(err)), 0,
			    "%s", err);
			cr_assert_eq(pk.gate.interleave, ffn % 8 ? 0u : MOEK_INTERLEAVE,
			             "%s, %zu rows", fname(formats[fi]), ffn);
			cr_assert_eq(pk.down.interleave, 0u);
			for (size_t n = 1; n <= 20; n += 19) {
				float *x = fixture_tokens(n, 256, 5);
				struct fixture fp = f;
				fp.expert = pk;
				float *want = fixture_run(&f, x, n, NULL),
				      *got = fixture_run(&fp, x, n, NULL);
				if (ffn % 8)
					cr_assert_eq(
					    memcmp(got, want, n * 256 * sizeof(float)), 0,
					    "%s, %zu rows, %zu tokens: the packed rows differ",
					    fname(formats[fi]), ffn, n);
				else
					cr_assert_lt(nmse_f(got, want, n * 256), 1e-11,
					             "%s, %zu rows, %zu tokens", fname(formats[fi]),
					             ffn, n);
				free(x), free(want), free(got);
			}
			free(buf);
			fixture_free(&f);
		}
	}
}

Test(interleave, descriptors_the_kernels_refuse)
{
	struct twin t;
	twin_init(&t, MOEK_MXFP4, 128, 64, MOEK_SWIGLU, 0, 3);
	char err[256];
	struct moek_expert e = t.x8;
	e.gate.interleave = e.up.interleave = 4;
	cr_assert_eq(moek_ffn_scratch_bytes(&e, 1, 1), 0);
	struct moek_ffn_call c = {.expert = &e, .n_tokens = 0, .n_workers = 1};
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), -1);
	cr_assert(strstr(err, "interleave"), "%s", err);
	e = t.x8;
	e.down.row0 = 4; /* a partial matrix must start on a group */
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), -1);
	cr_assert(strstr(err, "interleave") && strstr(err, "down"), "%s", err);
	e = t.x8;
	e.up.interleave = 0; /* gate and up share their activations: one layout */
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), -1);
	cr_assert(strstr(err, "layout"), "%s", err);
	struct fixture q;
	fixture_init(&q, MOEK_Q4_0, 0, 64, 64, MOEK_SWIGLU, 0, 1);
	e = q.expert;
	e.gate.interleave = e.up.interleave = MOEK_INTERLEAVE;
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), -1);
	cr_assert(
	    strstr(err, "MXFP4, NVFP4, Q8_0, Q4_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, BF16 or INT4_G32") &&
	        strstr(err, "Q4_0"),
	    "%s", err);
	fixture_free(&q);
	/* slices of interleaved rows hold whole groups, even under a down that allows any cut */
	struct fixture b;
	fixture_init(&b, MOEK_BF16, 0, 128, 64, MOEK_SWIGLU, 0, 1);
	e = b.expert;
	cr_assert_lt(moek_expert_split_align(&e), MOEK_INTERLEAVE, "BF16 alone allows finer cuts");
	struct twin bx; /* interleaved BF16 down: its column slices start on a unit of 16 */
	twin_init(&bx, MOEK_BF16, 128, 64, MOEK_SWIGLU, 0, 1);
	cr_assert_eq(moek_expert_split_align(&bx.x8), 16);
	struct moek_expert cut;
	cr_assert_eq(moek_expert_slice(&bx.x8, 8, 64, &cut, err, sizeof(err)), -1);
	cr_assert(strstr(err, "aligned to 16"), "%s", err);
	e = bx.x8;
	e.down.cols = 120; /* not whole units */
	e.gate.rows = e.up.rows = 120;
	cr_assert_eq(moek_ffn_prepare(&(struct moek_ffn_call){.expert = &e, .n_workers = 1}, err,
	                              sizeof(err)),
	             -1);
	cr_assert(strstr(err, "units of 16"), "%s", err);
	twin_free(&bx);
	e = b.expert;
	e.gate = t.x8.gate, e.up = t.x8.up; /* interleaved MXFP4 gate/up over a BF16 down */
	cr_assert_eq(moek_expert_split_align(&e) % MOEK_INTERLEAVE, 0);
	cr_assert_eq(moek_ffn_prepare(&(struct moek_ffn_call){.expert = &e, .n_workers = 1}, err,
	                              sizeof(err)),
	             -1, "no scratch: must fail after the expert checks pass");
	cr_assert(strstr(err, "scratch"), "the mixed expert was refused: %s", err);
	fixture_free(&b);
	twin_free(&t);
}
