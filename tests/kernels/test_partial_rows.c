/* test_partial_rows.c — partial matrices (struct moek_matrix row0) and the *_rows phase entry
 * points: an expert computed from per-node copies of its rows (gate/up rows [f_n, f_n+1),
 * down rows [o_n, o_n+1), each in an allocation of its own, as the forward engine's per-node
 * residency holds them) gives the whole-expert call's bits, for decode and prefill token
 * counts and every weight-format family; and a partial matrix is refused where it cannot be
 * used (moek_expert_slice, row0 beyond the rows).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "expert_fixture.h"

static size_t stride_of(const struct moek_matrix *m)
{
	return m->row_stride ? m->row_stride : moek_row_bytes(m->format, m->cols);
}

/* A copy of rows [r0, r1) of m in a fresh allocation, described with row0 = r0. The copy is
 * offset by one byte-aligned step from malloc's start when the format allows it, so a kernel
 * reading through the full matrix's address by mistake would read the wrong bytes. */
static struct moek_matrix partial_copy(const struct moek_matrix *m, size_t r0, size_t r1,
                                       void **owner)
{
	const size_t stride = stride_of(m);
	uint8_t *buf = malloc((r1 - r0) * stride + 64);
	cr_assert(buf);
	memset(buf, 0xa5, (r1 - r0) * stride + 64);
	uint8_t *dst = buf + 32;
	memcpy(dst, (const uint8_t *)m->data + r0 * stride, (r1 - r0) * stride);
	*owner = buf;
	struct moek_matrix p = *m;
	p.data = dst;
	p.row_stride = stride;
	p.row0 = (uint32_t)r0;
	return p;
}

static void split(size_t total, size_t align, unsigned parts, size_t *at)
{
	const size_t units = (total + align - 1) / align;
	for (unsigned n = 0; n < parts; n++) {
		size_t v = units * n / parts * align;
		at[n] = v < total ? v : total;
	}
	at[parts] = total;
}

/* The expert from `parts` per-node partial copies, every phase on the calling thread. */
static float *run_partial(const struct fixture *f, const float *x, size_t n, const float *w,
                          unsigned parts)
{
	float *out = calloc(n * f->hidden, sizeof(float));
	const size_t bytes = moek_ffn_scratch_bytes(&f->expert, n, 2);
	void *scratch = malloc(bytes);
	cr_assert(out && scratch);
	struct moek_ffn_call c = {.expert = &f->expert,
	                          .n_tokens = n,
	                          .x = x,
	                          .x_dtype = MOEK_ACT_F32,
	                          .weights = w,
	                          .out = out,
	                          .scratch = scratch,
	                          .scratch_bytes = bytes,
	                          .n_workers = 2};
	char err[256];
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), 0, "%s", err);
	size_t fs[5], os[5];
	split(f->ffn, moek_expert_split_align(&f->expert), parts, fs);
	split(f->hidden, 8, parts, os);
	struct moek_expert node[4];
	void *owners[4][3];
	for (unsigned p = 0; p < parts; p++) {
		node[p] = f->expert;
		node[p].gate = partial_copy(&f->expert.gate, fs[p], fs[p + 1], &owners[p][0]);
		node[p].up = partial_copy(&f->expert.up, fs[p], fs[p + 1], &owners[p][1]);
		node[p].down = partial_copy(&f->expert.down, os[p], os[p + 1], &owners[p][2]);
	}
	moek_ffn_load(&c, 0, 0, n);
	for (unsigned p = parts; p-- > 0;) { /* two workers per node, 16-row hidden pieces */
		const size_t mid = fs[p] + (fs[p + 1] - fs[p]) / 32 * 16;
		moek_ffn_hidden_rows(&c, &node[p], 1, mid, fs[p + 1]);
		moek_ffn_hidden_rows(&c, &node[p], 0, fs[p], mid);
	}
	for (unsigned p = 0; p < parts; p++) {
		const size_t mid = os[p] + (os[p + 1] - os[p]) / 16 * 8;
		moek_ffn_down_rows(&c, &node[p], p % 2, os[p], mid);
		moek_ffn_down_rows(&c, &node[p], (p + 1) % 2, mid, os[p + 1]);
	}
	for (unsigned p = 0; p < parts; p++)
		for (int i = 0; i < 3; i++)
			free(owners[p][i]);
	free(scratch);
	return out;
}

static void check_partial(uint32_t format, size_t hidden, size_t ffn, int bias)
{
	static const size_t token_counts[] = {1, 3, 17, 37};
	static const enum moek_isa isas[] = {MOEK_ISA_SCALAR, MOEK_ISA_AVX2, MOEK_ISA_AVX512,
	                                     MOEK_ISA_AMX};
	struct fixture f;
	fixture_init(&f, format, 0, hidden, ffn, bias ? MOEK_SWIGLU_OAI : MOEK_SWIGLU, bias, 41);
	for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
		if (moek_set_isa(isas[i]) != 0)
			continue;
		for (size_t k = 0; k < sizeof(token_counts) / sizeof(token_counts[0]); k++) {
			const size_t n = token_counts[k];
			float *x = fixture_tokens(n, hidden, 7 + (uint32_t)n);
			float *w = malloc(n * sizeof(float));
			for (size_t t = 0; t < n; t++)
				w[t] = 0.5f + 1.0f / (float)(t + 1);
			float *whole = fixture_run(&f, x, n, w);
			for (unsigned parts = 1; parts <= 3; parts++) {
				float *got = run_partial(&f, x, n, w, parts);
				cr_assert_arr_eq(got, whole, n * hidden * sizeof(float),
				                 "%s %s n=%zu %u nodes: bits differ",
				                 moek_format_lookup(format)->name, moek_isa_name(),
				                 n, parts);
				free(got);
			}
			free(whole);
			free(w);
			free(x);
		}
	}
	moek_set_isa(MOEK_ISA_AUTO);
	fixture_free(&f);
}

Test(partial_rows, k_quants)
{
	check_partial(MOEK_Q4_K, 512, 768, 0);
	check_partial(MOEK_Q5_K, 256, 512, 0);
	check_partial(MOEK_Q6_K, 256, 768, 1);
	check_partial(MOEK_Q2_K, 256, 512, 0);
	check_partial(MOEK_Q3_K, 512, 768, 1);
}

Test(partial_rows, iq4_nl_and_iq4_xs)
{
	check_partial(MOEK_IQ4_NL, 320, 416, 0);
	check_partial(MOEK_IQ4_XS, 256, 512, 1);
}

Test(partial_rows, q8_0_and_q4_0)
{
	check_partial(MOEK_Q8_0, 320, 416, 0);
	check_partial(MOEK_Q4_0, 256, 512, 1);
	check_partial(MOEK_INT4_G32, 256, 512, 1);
}

Test(partial_rows, mxfp4)
{
	check_partial(MOEK_MXFP4, 320, 448, 1);
}

Test(partial_rows, bf16_and_fp8)
{
	check_partial(MOEK_BF16, 264, 200, 0);
	check_partial(MOEK_FP8_E4M3_B128, 320, 384, 1);
}

Test(partial_rows, slice_and_prepare_refuse_bad_row0)
{
	struct fixture f;
	fixture_init(&f, MOEK_Q8_0, 0, 256, 256, MOEK_SWIGLU, 0, 5);
	struct moek_expert e = f.expert, slice;
	char err[256] = "";
	e.down.row0 = 8;
	cr_assert_eq(moek_expert_slice(&e, 0, 128, &slice, err, sizeof(err)), -1);
	cr_assert(strstr(err, "partial matrix"), "message: %s", err);
	e = f.expert;
	e.gate.row0 = e.gate.rows; /* no row present */
	cr_assert_eq(moek_ffn_scratch_bytes(&e, 1, 1), 0);
	void *scratch = malloc(1 << 20);
	float out[256] = {0}, *x = fixture_tokens(1, 256, 1);
	struct moek_ffn_call c = {.expert = &e,
	                          .n_tokens = 1,
	                          .x = x,
	                          .out = out,
	                          .scratch = scratch,
	                          .scratch_bytes = 1 << 20,
	                          .n_workers = 1};
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), -1);
	cr_assert(strstr(err, "first present row"), "message: %s", err);
	free(x);
	free(scratch);
	fixture_free(&f);
}
