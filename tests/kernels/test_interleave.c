/* test_interleave.c — MXFP4 rows interleaved in groups of 8 (moek_mxfp4_interleave, struct
 * moek_matrix.interleave): the permutation and its inverse, the rows it dequantizes to, the
 * FFN over it against the same expert in GGUF rows (prefill and the scalar path bit for bit,
 * the decode dots within float reassociation), bit-identical results for any split of rows
 * (ranges cutting groups included), the VNNI form against the AVX2 one, slices, scales at the
 * E8M0 edges, and descriptors the kernels must refuse.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "expert_fixture.h"
#include "kernels_internal.h"

static uint32_t lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* An interleaved copy of m (GGUF MXFP4 rows); the buffer is returned in *owner. */
static struct moek_matrix interleaved_copy(const struct moek_matrix *m, void **owner)
{
	const size_t bytes = moek_row_bytes(MOEK_MXFP4, m->cols) * m->rows;
	void *buf = malloc(bytes);
	cr_assert(buf);
	cr_assert_eq(moek_mxfp4_interleave(m->data, m->row_stride, m->rows, m->cols, buf), 0);
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

static void twin_init(struct twin *t, size_t hidden, size_t ffn, enum moek_activation act, int bias,
                      uint32_t seed)
{
	fixture_init(&t->f, MOEK_MXFP4, 0, hidden, ffn, act, bias, seed);
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

Test(interleave, round_trip_and_shape_checks)
{
	const size_t rows = 24, cols = 96, rb = moek_row_bytes(MOEK_MXFP4, cols);
	uint8_t *src = malloc(rows * rb), *x8 = malloc(rows * rb), *back = malloc(rows * rb);
	cr_assert(src && x8 && back);
	uint32_t s = 7;
	for (size_t i = 0; i < rows * rb; i++)
		src[i] = (uint8_t)lcg(&s);
	cr_assert_eq(moek_mxfp4_interleave(src, 0, rows, cols, x8), 0);
	cr_assert_neq(memcmp(src, x8, rows * rb), 0, "interleaving changed nothing");
	cr_assert_eq(moek_mxfp4_deinterleave(x8, rows, cols, back), 0);
	cr_assert_eq(memcmp(src, back, rows * rb), 0, "deinterleave is not the inverse");
	/* row 11's block 2 as the layout says: group 1, lane 3, column 2 */
	const uint8_t *col = x8 + 1 * 8 * rb + 2 * 136;
	for (int v = 0; v < 4; v++)
		cr_assert_eq(memcmp(col + 32 * v + 4 * 3, src + 11 * rb + 2 * 17 + 1 + 4 * v, 4),
		             0);
	cr_assert_eq(col[128 + 3], src[11 * rb + 2 * 17]);
	/* a strided source (rows of a wider matrix) */
	uint8_t *wide = calloc(rows, rb + 40);
	cr_assert(wide);
	for (size_t r = 0; r < rows; r++)
		memcpy(wide + r * (rb + 40), src + r * rb, rb);
	memset(back, 0, rows * rb);
	cr_assert_eq(moek_mxfp4_interleave(wide, rb + 40, rows, cols, back), 0);
	cr_assert_eq(memcmp(x8, back, rows * rb), 0);
	cr_assert_eq(moek_mxfp4_interleave(src, 0, 12, cols, x8), -1, "12 rows accepted");
	cr_assert_eq(moek_mxfp4_interleave(src, 0, rows, 48, x8), -1, "48 columns accepted");
	cr_assert_eq(moek_mxfp4_deinterleave(x8, 4, cols, back), -1);
	free(src), free(x8), free(back), free(wide);
}

Test(interleave, rows_dequantize_to_the_gguf_rows)
{
	const size_t rows = 16, cols = 128, rb = moek_row_bytes(MOEK_MXFP4, cols);
	uint8_t *src = malloc(rows * rb), *x8 = malloc(rows * rb);
	float *want = malloc(rows * cols * sizeof(float)), got[128];
	uint8_t blocks[4 * 17];
	cr_assert(src && x8 && want);
	uint32_t s = 11;
	for (size_t i = 0; i < rows * rb; i++)
		src[i] = (uint8_t)lcg(&s);
	/* the E8M0 edges: 0 (2^-127, subnormal), 1, 254, 255 (NaN) */
	src[0 * rb] = 0, src[1 * rb + 17] = 1, src[2 * rb + 34] = 254, src[3 * rb] = 255;
	cr_assert_eq(moek_mxfp4_interleave(src, 0, rows, cols, x8), 0);
	cr_assert_eq(moek_dequantize(MOEK_MXFP4, src, NULL, rows, cols, want), 0);
	for (size_t r = 0; r < rows; r++) {
		moek_mxfp4_x8_gather(x8 + r / 8 * 8 * rb, r % 8, 0, 4, blocks);
		cr_assert_eq(memcmp(blocks, src + r * rb, rb), 0, "row %zu's blocks differ", r);
		cr_assert_eq(moek_dequantize(MOEK_MXFP4, blocks, NULL, 1, cols, got), 0);
		cr_assert_eq(memcmp(got, want + r * cols, sizeof(got)), 0, "row %zu differs", r);
		moek_mxfp4_x8_gather(x8 + r / 8 * 8 * rb, r % 8, 2, 2, blocks);
		cr_assert_eq(memcmp(blocks, src + r * rb + 34, 34), 0,
		             "row %zu from block 2 differs", r);
	}
	free(src), free(x8), free(want);
}

/* Decode (1, 3, 8, 13 tokens) within float reassociation of the GGUF-row dots; prefill (the
 * same dequantized tiles) and the scalar path (the same dequantized rows) bit for bit. */
Test(interleave, ffn_equals_the_gguf_rows)
{
	struct twin t;
	twin_init(&t, 256, 192, MOEK_SWIGLU_OAI, 1, 5);
	const size_t counts[] = {1, 3, 8, 13, 40};
	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
		const size_t n = counts[i];
		float *x = fixture_tokens(n, t.f.hidden, 100 + (uint32_t)n);
		float *w = malloc(n * sizeof(float));
		cr_assert(w);
		for (size_t k = 0; k < n; k++)
			w[k] = 0.25f + 0.5f * (float)k / (float)n;
		float *ref = fixture_run(&t.f, x, n, w);
		struct fixture fx = t.f;
		fx.expert = t.x8;
		float *got = fixture_run(&fx, x, n, w);
		const size_t m = n * t.f.hidden;
		if (n >= MOEK_PREFILL_MIN_TOKENS) {
			cr_assert_eq(memcmp(got, ref, m * sizeof(float)), 0,
			             "prefill, %zu tokens: bits differ from the GGUF rows", n);
		} else {
			const double e = nmse_f(got, ref, m);
			cr_assert_lt(e, 1e-11, "decode, %zu tokens: nmse %g against the GGUF rows",
			             n, e);
		}
		cr_assert_eq(moek_set_isa(MOEK_ISA_SCALAR), 0);
		float *sref = fixture_run(&t.f, x, n, w), *sgot = fixture_run(&fx, x, n, w);
		cr_assert_eq(memcmp(sgot, sref, m * sizeof(float)), 0,
		             "scalar path, %zu tokens: bits differ", n);
		cr_assert_eq(moek_set_isa(MOEK_ISA_AUTO), 0);
		free(x), free(w), free(ref), free(got), free(sref), free(sgot);
	}
	twin_free(&t);
}

/* Any split of the hidden and down rows, cuts inside groups included, gives the same bits. */
Test(interleave, splits_cutting_groups_give_the_same_bits)
{
	struct twin t;
	twin_init(&t, 320, 256, MOEK_SWIGLU, 0, 9);
	const size_t counts[] = {1, 5, 8};
	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
		const size_t n = counts[i];
		float *x = fixture_tokens(n, t.f.hidden, 7);
		float *whole = run_split(&t.x8, x, n, NULL, 1, t.f.ffn, NULL, 0);
		const size_t cuts_a[] = {3, 8, 13, 101, 319}, cuts_b[] = {160};
		float *a = run_split(&t.x8, x, n, NULL, 3, 16, cuts_a, 5);
		float *b = run_split(&t.x8, x, n, NULL, 2, 48, cuts_b, 1);
		const size_t bytes = n * t.f.hidden * sizeof(float);
		cr_assert_eq(memcmp(a, whole, bytes), 0, "%zu tokens: split A differs", n);
		cr_assert_eq(memcmp(b, whole, bytes), 0, "%zu tokens: split B differs", n);
		free(x), free(whole), free(a), free(b);
	}
	twin_free(&t);
}

Test(interleave, vnni_form_gives_the_avx2_bits)
{
	if (!moek_avx2_set_vnni(true)) {
		cr_log_info("no AVX512-VNNI here: the plain AVX2 form is the only one");
		return;
	}
	struct twin t;
	twin_init(&t, 256, 128, MOEK_SWIGLU, 0, 21);
	for (size_t n = 1; n <= 8; n += 3) {
		float *x = fixture_tokens(n, t.f.hidden, 3);
		struct fixture fx = t.f;
		fx.expert = t.x8;
		cr_assert(moek_avx2_set_vnni(true));
		float *v = fixture_run(&fx, x, n, NULL);
		cr_assert(moek_avx2_set_vnni(false));
		float *p = fixture_run(&fx, x, n, NULL);
		cr_assert(moek_avx2_set_vnni(true));
		cr_assert_eq(memcmp(v, p, n * t.f.hidden * sizeof(float)), 0,
		             "%zu tokens: VNNI and AVX2 forms differ", n);
		free(x), free(v), free(p);
	}
	twin_free(&t);
}

/* NaN and subnormal scales flow through the interleaved dots as through the GGUF ones. */
Test(interleave, e8m0_edges_in_the_decode_dot)
{
	struct twin t;
	twin_init(&t, 128, 64, MOEK_SWIGLU, 0, 13);
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
	struct twin t;
	twin_init(&t, 192, 256, MOEK_SWIGLU, 0, 17);
	const size_t at = 128;
	cr_assert_eq(at % moek_expert_split_align(&t.x8), 0);
	float *x = fixture_tokens(2, t.f.hidden, 2);
	cr_assert_eq(moek_set_isa(MOEK_ISA_SCALAR), 0);
	for (int part = 0; part < 2; part++) {
		struct moek_expert sg, sx;
		char err[256];
		const size_t b = part ? at : 0, e = part ? t.f.ffn : at;
		cr_assert_eq(moek_expert_slice(&t.f.expert, b, e, &sg, err, sizeof(err)), 0, "%s",
		             err);
		cr_assert_eq(moek_expert_slice(&t.x8, b, e, &sx, err, sizeof(err)), 0, "%s", err);
		struct fixture fg = t.f, fx = t.f;
		fg.expert = sg, fx.expert = sx;
		float *want = fixture_run(&fg, x, 2, NULL), *got = fixture_run(&fx, x, 2, NULL);
		cr_assert_eq(memcmp(got, want, 2 * t.f.hidden * sizeof(float)), 0,
		             "slice [%zu, %zu) differs", b, e);
		free(want), free(got);
	}
	cr_assert_eq(moek_set_isa(MOEK_ISA_AUTO), 0);
	free(x);
	twin_free(&t);
}

Test(interleave, descriptors_the_kernels_refuse)
{
	struct twin t;
	twin_init(&t, 128, 64, MOEK_SWIGLU, 0, 3);
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
	struct fixture q;
	fixture_init(&q, MOEK_Q4_0, 0, 64, 64, MOEK_SWIGLU, 0, 1);
	e = q.expert;
	e.gate.interleave = e.up.interleave = MOEK_INTERLEAVE;
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), -1);
	cr_assert(strstr(err, "MXFP4"), "%s", err);
	fixture_free(&q);
	/* slices of interleaved rows hold whole groups, even under a down that allows any cut */
	struct fixture b;
	fixture_init(&b, MOEK_BF16, 0, 128, 64, MOEK_SWIGLU, 0, 1);
	e = b.expert;
	cr_assert_lt(moek_expert_split_align(&e), MOEK_INTERLEAVE, "BF16 alone allows finer cuts");
	e.gate = t.x8.gate, e.up = t.x8.up; /* interleaved MXFP4 gate/up over a BF16 down */
	cr_assert_eq(moek_expert_split_align(&e) % MOEK_INTERLEAVE, 0);
	cr_assert_eq(moek_ffn_prepare(&(struct moek_ffn_call){.expert = &e, .n_workers = 1}, err,
	                              sizeof(err)),
	             -1, "no scratch: must fail after the expert checks pass");
	cr_assert(strstr(err, "scratch"), "the mixed expert was refused: %s", err);
	fixture_free(&b);
	twin_free(&t);
}
