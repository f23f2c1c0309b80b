/* test_batch_invariant.c — a batch-invariant FFN call gives a token the same bits alone and
 * inside batches of 2, 7, 8, 9, 64 and 255 (17 for the last two under the sanitizers) other
 * random tokens at a random position, with any worker count and split of the phases, for
 * every weight format in GGUF rows and in the interleaved decode layout, under every ISA this
 * CPU runs; the ops tables' token_exact entries hold; and without the flag the paths do
 * depend on the batch (so the matrix can fail).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "expert_fixture.h"
#include "kernels_internal.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

enum { HIDDEN = 256, FFN = 256, POOL = 300 };

static const enum moek_isa isas[] = {MOEK_ISA_SCALAR, MOEK_ISA_AVX2, MOEK_ISA_AVX512, MOEK_ISA_AMX};

static uint32_t next_rand(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* One call of n tokens (x rows, weights w) on `workers` workers, each phase cut into
 * `pieces` ranges handed out round-robin, last first. Returns the n x hidden output. */
static float *run(const struct moek_expert *e, const float *x, size_t n, const float *w,
                  bool invariant, unsigned workers, size_t pieces)
{
	const size_t hidden = e->gate.cols, ffn = e->gate.rows;
	float *out = calloc(n * hidden, sizeof(float));
	const size_t bytes = moek_ffn_scratch_bytes(e, n, workers);
	void *scratch = malloc(bytes);
	cr_assert(out && scratch);
	struct moek_ffn_call c = {.expert = e,
	                          .n_tokens = n,
	                          .x = x,
	                          .x_dtype = MOEK_ACT_F32,
	                          .weights = w,
	                          .out = out,
	                          .scratch = scratch,
	                          .scratch_bytes = bytes,
	                          .n_workers = workers,
	                          .batch_invariant = invariant};
	char err[256];
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), 0, "%s", err);
	for (size_t p = pieces; p-- > 0;)
		moek_ffn_load(&c, (unsigned)(p % workers), n * p / pieces, n * (p + 1) / pieces);
	const size_t align = moek_ffn_hidden_align(e) > moek_expert_split_align(e)
	                         ? moek_ffn_hidden_align(e)
	                         : moek_expert_split_align(e);
	const size_t units = (ffn + align - 1) / align;
	for (size_t p = pieces; p-- > 0;) {
		size_t b = units * p / pieces * align, end = units * (p + 1) / pieces * align;
		moek_ffn_hidden(&c, (unsigned)(p % workers), b, end > ffn ? ffn : end);
	}
	for (size_t p = pieces; p-- > 0;)
		moek_ffn_down(&c, (unsigned)(p % workers), hidden * p / pieces,
		              hidden * (p + 1) / pieces);
	free(scratch);
	return out;
}

/* The layouts the sidecar serves a format in: its GGUF rows, and the decode layout (gate and
 * up alternating, rows interleaved by 8) where the format has one. */
struct layouts {
	struct moek_expert e[2];
	void *buf;
	size_t n;
};

static void layouts_init(struct layouts *l, const struct fixture *f)
{
	l->e[0] = f->expert;
	l->n = 1;
	l->buf = NULL;
	if (!moek_interleave_supported(f->expert.gate.format) ||
	    !moek_interleave_supported(f->expert.down.format))
		return;
	const size_t bytes = moek_expert_packed_bytes(&f->expert);
	l->buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
	char err[256];
	cr_assert_eq(moek_expert_pack(&f->expert, true, l->buf, bytes, &l->e[1], err, sizeof(err)),
	             0, "%s", err);
	l->n = 2;
}

/* The same token (x row 0 of the pool, weight 0.75) alone and in every batch: equal bits. */
static void check_format(uint32_t format)
{
	/* under the sanitizers 17 (two full runs of MOEK_DOT_TOKENS and one more) stands for 64
	 * and 255: the same loops over runs of 8 tokens, fewer of them */
	static const size_t full[] = {2, 7, 8, 9, 64, 255};
	static const size_t small[] = {2, 7, 8, 9, 17};
	const size_t *batches = SANITIZED ? small : full;
	const size_t n_batches =
	    SANITIZED ? sizeof(small) / sizeof(small[0]) : sizeof(full) / sizeof(full[0]);
	struct fixture f;
	fixture_init(&f, format, 0, HIDDEN, FFN, MOEK_SWIGLU, 1, 41 + format);
	struct layouts l;
	layouts_init(&l, &f);
	float *pool = fixture_tokens(POOL, HIDDEN, 7 + format);
	float *x = malloc(255 * HIDDEN * sizeof(float)), *w = malloc(255 * sizeof(float));
	cr_assert(x && w);
	const float w0 = 0.75f;
	for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
		if (moek_set_isa(isas[i]) != 0)
			continue;
		for (size_t li = 0; li < l.n; li++) {
			const struct moek_expert *e = &l.e[li];
			float *alone = run(e, pool, 1, &w0, true, 1, 1);
			uint32_t seed = 1234u + (uint32_t)(format * 7 + li * 3 + i);
			for (size_t b = 0; b < n_batches; b++) {
				const size_t n = batches[b];
				const size_t at = next_rand(&seed) % n;
				for (size_t t = 0; t < n; t++) {
					const size_t src =
					    t == at ? 0 : 1 + next_rand(&seed) % (POOL - 1);
					memcpy(x + t * HIDDEN, pool + src * HIDDEN,
					       HIDDEN * sizeof(float));
					w[t] = t == at ? w0
					               : (float)(next_rand(&seed) % 1000) / 1000.0f;
				}
				const unsigned workers = 1 + next_rand(&seed) % 4;
				const size_t pieces = 1 + next_rand(&seed) % 5;
				float *got = run(e, x, n, w, true, workers, pieces);
				cr_assert_arr_eq(got + at * HIDDEN, alone, HIDDEN * sizeof(float),
				                 "%s %s %s: token at %zu of %zu (%u workers, %zu "
				                 "pieces): bits differ from the token alone",
				                 moek_format_lookup(format)->name, moek_isa_name(),
				                 li ? "interleaved" : "rows", at, n, workers,
				                 pieces);
				free(got);
			}
			free(alone);
		}
	}
	moek_set_isa(MOEK_ISA_AUTO);
	free(x);
	free(w);
	free(pool);
	free(l.buf);
	fixture_free(&f);
}

#define FORMAT_TEST(name, id)                                                                      \
	Test(batch_invariant, name)                                                                \
	{                                                                                          \
		check_format(id);                                                                  \
	}
FORMAT_TEST(f32, MOEK_F32)
FORMAT_TEST(f16, MOEK_F16)
FORMAT_TEST(bf16, MOEK_BF16)
FORMAT_TEST(q8_0, MOEK_Q8_0)
FORMAT_TEST(q4_0, MOEK_Q4_0)
FORMAT_TEST(q2_K, MOEK_Q2_K)
FORMAT_TEST(q3_K, MOEK_Q3_K)
FORMAT_TEST(q4_K, MOEK_Q4_K)
FORMAT_TEST(q5_K, MOEK_Q5_K)
FORMAT_TEST(q6_K, MOEK_Q6_K)
FORMAT_TEST(iq4_nl, MOEK_IQ4_NL)
FORMAT_TEST(iq4_xs, MOEK_IQ4_XS)
FORMAT_TEST(mxfp4, MOEK_MXFP4)
FORMAT_TEST(fp8, MOEK_FP8_E4M3_B128)
FORMAT_TEST(int4_g32, MOEK_INT4_G32)
FORMAT_TEST(nvfp4, MOEK_NVFP4)
FORMAT_TEST(iq2_xxs, MOEK_IQ2_XXS)
FORMAT_TEST(iq2_xs, MOEK_IQ2_XS)
FORMAT_TEST(iq2_s, MOEK_IQ2_S)
FORMAT_TEST(iq3_xxs, MOEK_IQ3_XXS)
FORMAT_TEST(iq3_s, MOEK_IQ3_S)
FORMAT_TEST(iq1_s, MOEK_IQ1_S)
FORMAT_TEST(iq1_m, MOEK_IQ1_M)

/* Every weight format of the table has a test above (a new row needs one). */
Test(batch_invariant, every_format_listed)
{
	static const uint32_t listed[] = {
	    MOEK_F32,   MOEK_F16,           MOEK_BF16,     MOEK_Q8_0,  MOEK_Q4_0,    MOEK_Q2_K,
	    MOEK_Q3_K,  MOEK_Q4_K,          MOEK_Q5_K,     MOEK_Q6_K,  MOEK_IQ4_NL,  MOEK_IQ4_XS,
	    MOEK_MXFP4, MOEK_FP8_E4M3_B128, MOEK_INT4_G32, MOEK_NVFP4, MOEK_IQ2_XXS, MOEK_IQ2_XS,
	    MOEK_IQ2_S, MOEK_IQ3_XXS,       MOEK_IQ3_S,    MOEK_IQ1_S, MOEK_IQ1_M};
	for (size_t i = 0; moek_format_at(i); i++) {
		const struct moek_format_info *fi = moek_format_at(i);
		if (!fi->weight_format)
			continue;
		bool found = false;
		for (size_t j = 0; j < sizeof(listed) / sizeof(listed[0]); j++)
			found |= listed[j] == fi->format;
		cr_expect(found, "format %s has no batch-invariance test", fi->name);
	}
}

/* The token_exact entries the invariant mode relies on: each such dot gives every token of
 * a call of nt tokens the bits of a call of that token alone. */
Test(batch_invariant, token_exact_entries_hold)
{
	enum { K = 1024 };
	float *wf = malloc(8 * K * sizeof(float)), *xf = malloc(8 * K * sizeof(float));
	uint8_t *wq = malloc(8 * K * 4), *group = malloc(8 * K * 4);
	uint8_t *act = aligned_alloc(64, 8 * 2 * K * 4);
	cr_assert(wf && xf && wq && group && act);
	uint32_t seed = 99;
	for (size_t i = 0; i < 8 * K; i++) {
		wf[i] = (float)(next_rand(&seed) % 2001) / 1000.0f - 1.0f;
		xf[i] = (float)(next_rand(&seed) % 2001) / 1000.0f - 1.0f;
	}
	float sr[K / 128];
	for (size_t i = 0; i < K / 128; i++)
		sr[i] = 0.01f * (float)(i + 1);
	size_t checked = 0;
	for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
		if (moek_set_isa(isas[i]) != 0)
			continue;
		const struct moek_isa_ops *ops = moek_isa_current();
		/* the forms the CPU has (VNNI, VBMI), then the plain AVX2 ones */
		for (int plain = 0; plain < 2; plain++) {
			if (plain && !moek_set_isa_forms(0))
				continue;
			for (size_t fi = 0; fi < MOEK_FMT_COUNT; fi++) {
				const uint32_t format = moek_formats[fi].info.format;
				for (int x8 = 0; x8 < 2; x8++) {
					const bool listed =
					    x8 ? ops->token_exact_x8[fi] || ops->dot_x8_exact[fi]
					       : ops->token_exact[fi] || ops->dot_exact[fi];
					if (!listed)
						continue;
					cr_assert(x8 ? ops->dot_x8[fi] != NULL
					             : ops->dot[fi] != NULL);
					cr_assert(
					    x8 ? !(ops->token_exact_x8[fi] && ops->dot_x8_exact[fi])
					       : !(ops->token_exact[fi] && ops->dot_exact[fi]),
					    "%s %s: a token-exact dot needs no exact form",
					    ops->name, moek_formats[fi].info.name);
					/* the dot the invariant mode gives several tokens at once
					 */
					const moek_dot_fn many_dot = x8 || ops->token_exact[fi]
					                                 ? ops->dot[fi]
					                                 : ops->dot_exact[fi];
					const moek_dot_x8_fn many_x8 =
					    !x8 || ops->token_exact_x8[fi] ? ops->dot_x8[fi]
					                                   : ops->dot_x8_exact[fi];
					if (moek_formats[fi].info.scale_block)
						for (size_t j = 0; j < 8 * K; j++)
							wq[j] = moek_f32_to_fp8_e4m3(wf[j]);
					else
						cr_assert_eq(
						    moek_quantize(format, wf, 8, K, wq, NULL), 0);
					if (x8)
						cr_assert_eq(
						    moek_interleave(format, wq, 0, 8, K, group), 0);
					const uint32_t af = moek_isa_act_fmt(ops, fi, x8);
					const size_t as =
					    ((af == MOEK_F32 ? K * sizeof(float)
					                     : moek_isa_act_row_bytes(ops, af, K)) +
					     63) /
					    64 * 64;
					for (size_t t = 0; t < 8; t++) {
						if (af == MOEK_F32)
							memcpy(act + t * as, xf + t * K,
							       K * sizeof(float));
						else
							moek_isa_quantize_act(ops, af, xf + t * K,
							                      K, act + t * as);
					}
					for (size_t nt = 2; nt <= 8; nt++) {
						float many[64], one[8];
						if (x8)
							many_x8(group, act, as, nt, K, many);
						else
							many_dot(wq,
							         moek_formats[fi].info.scale_block
							             ? sr
							             : NULL,
							         act, as, nt, K, many);
						for (size_t t = 0; t < nt; t++) {
							const size_t nv = x8 ? 8 : 1;
							if (x8)
								ops->dot_x8[fi](group, act + t * as,
								                as, 1, K, one);
							else
								ops->dot[fi](
								    wq,
								    moek_formats[fi]
								            .info.scale_block
								        ? sr
								        : NULL,
								    act + t * as, as, 1, K, one);
							cr_assert_arr_eq(
							    many + t * nv, one, nv * sizeof(float),
							    "%s %s%s: token %zu of %zu differs "
							    "from "
							    "the token alone",
							    ops->name, moek_formats[fi].info.name,
							    x8 ? " (groups)" : "", t, nt);
						}
					}
					checked++;
				}
			}
		}
	}
	moek_set_isa(MOEK_ISA_AUTO);
	if (moek_isa_supported(MOEK_ISA_AVX2))
		cr_expect_gt(checked, 0, "no token_exact entry checked");
	free(wf);
	free(xf);
	free(wq);
	free(group);
	free(act);
}

/* Without the flag the default paths stay batch-dependent where they always were (a token's
 * last bits change with the batch, here at 64 tokens: the tiles), so the matrix above can
 * fail; with it a token gets what the default gives it alone. */
Test(batch_invariant, default_mode_depends_on_the_batch)
{
	if (moek_set_isa(MOEK_ISA_AVX2) != 0)
		cr_skip_test("no AVX2");
	struct fixture f;
	fixture_init(&f, MOEK_BF16, 0, HIDDEN, FFN, MOEK_SWIGLU, 1, 5);
	float *x = fixture_tokens(64, HIDDEN, 9), *w = malloc(64 * sizeof(float));
	for (size_t t = 0; t < 64; t++)
		w[t] = 1.0f;
	float *alone = run(&f.expert, x, 1, w, false, 1, 1);
	float *batch = run(&f.expert, x, 64, w, false, 1, 1);
	cr_expect_neq(memcmp(alone, batch, HIDDEN * sizeof(float)), 0,
	              "BF16 on avx2: the default path gave the same bits at 1 and 64 tokens");
	/* the invariant mode gives every token the default path's one-token bits */
	float *inv = run(&f.expert, x, 64, w, true, 1, 1);
	cr_expect_arr_eq(inv, alone, HIDDEN * sizeof(float),
	                 "BF16 on avx2: invariant bits at 64 tokens differ from one token's");
	free(alone);
	free(batch);
	free(inv);
	moek_set_isa(MOEK_ISA_AUTO);
	free(x);
	free(w);
	fixture_free(&f);
}
