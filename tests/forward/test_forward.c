/* test_forward.c — the forward engine against its reference and against float math:
 * every format, 1 and many tokens, the three weights sources, deferral, bad requests, a
 * budget of 10%, an injected I/O failure, masks, prefetch and stats. Multi-threaded and
 * multi-node (synthetic) runs are in forward_threads.c (a plain program, so TSan can run it). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "forward_internal.h"
#include "moe_abi.h"
#include "moe_gen.h"
#include "moe_kernels.h"

/* The record of the last engine call that failed (forward.h). */
static struct sidecar_error ferr;

/* Experts per layer of the format and mix models: 8, or 4 under the sanitizers (far slower,
 * and the i-quant quantizers that write the models slowest of all): the same paths (every
 * token still names 4 experts, the budgets still evict), half the weights to write. */
#ifdef MOE_SANITIZED
enum { MODEL_EXPERTS = 4 };
#else
enum { MODEL_EXPERTS = 8 };
#endif

static struct forward_engine *engine_layout(const struct fwd_model *m, enum forward_source src,
                                            uint64_t budget, uint32_t max_tokens, bool files)
{
	struct forward_config cfg = {
	    .source = src,
	    .mem_budget = budget,
	    .threads_per_node = 1,
	    .max_tokens = max_tokens,
	    .chunk_bytes = 64 * 1024,
	    .lazy_load = true, /* these tests exercise demand loads */
	    .file_layout = files,
	};
	struct forward_engine *e;
	cr_assert_eq(forward_create(&e, m->cat, &cfg, &ferr), 0, "forward_create: %s", ferr.msg);
	return e;
}

/* An engine over the decode layout (RESIDENCY, ALL_RESIDENT) or the files' rows (MMAP). */
static struct forward_engine *engine(const struct fwd_model *m, enum forward_source src,
                                     uint64_t budget, uint32_t max_tokens)
{
	return engine_layout(m, src, budget, max_tokens, false);
}

/* Runs r through e and through the reference; asserts both succeed with equal bits. */
static void run_equal(struct forward_engine *e, struct fwd_req *r, const char *what)
{
	struct forward_result res, ref;
	int rc = forward_run(e, &r->q, r->out, r->out_def, &res);
	cr_assert_eq(rc, MOE_OK, "%s: forward_run: %d %s", what, rc, res.message);
	rc = forward_reference(e, &r->q, r->ref, r->ref_def, &ref);
	cr_assert_eq(rc, MOE_OK, "%s: reference: %d %s", what, rc, ref.message);
	cr_assert_eq(res.n_deferred, ref.n_deferred, "%s", what);
}

static void assert_bits(const float *a, const float *b, size_t n, const char *what)
{
	long d = fwd_first_diff(a, b, n);
	cr_assert_eq(d, -1, "%s: element %ld differs: %.9g vs %.9g", what, d, d >= 0 ? a[d] : 0.0,
	             d >= 0 ? b[d] : 0.0);
}

static void format_case(const char *preset, uint32_t format, bool gguf, bool fused)
{
	struct fwd_model m;
	char err[256];
	struct fwd_model_spec spec = {preset, format, gguf, 2, MODEL_EXPERTS, 256, 256, fused};
	cr_assert_eq(fwd_model_make(&m, &spec, err, sizeof(err)), 0, "%s", err);
	const size_t h = m.cat->info.hidden;
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, 0, 24);
	const uint32_t k = m.cat->info.top_k < 4 ? m.cat->info.top_k : 4;
	const uint32_t tokens[] = {1, 3, 24};
	for (unsigned i = 0; i < 3; i++)
		for (unsigned dt = 0; dt < 3; dt++) {
			struct fwd_req r;
			fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, 0), tokens[i], k, 0, dt,
			             100 + i * 3 + dt, i == 1);
			char what[96];
			snprintf(what, sizeof(what), "%s %s %u tokens dtype %u",
			         moe_format_name(format), gguf ? "gguf" : "safetensors", tokens[i],
			         dt);
			run_equal(e, &r, what);
			assert_bits(r.out, r.ref, tokens[i] * h, what);
			/* Not all zero: the experts were really computed. */
			double sum = 0;
			for (size_t j = 0; j < tokens[i] * h; j++)
				sum += fabs(r.out[j]);
			cr_assert_gt(sum, 0.0, "%s: output is all zero", what);
			fwd_req_free(&r);
		}
	forward_destroy(e);
	fwd_model_free(&m);
}

Test(forward_formats, gguf_f32)
{
	format_case("qwen3-30b-a3b", MOEK_F32, true, false);
}
Test(forward_formats, gguf_f16)
{
	format_case("qwen3-30b-a3b", MOEK_F16, true, false);
}
Test(forward_formats, gguf_bf16)
{
	format_case("qwen3-30b-a3b", MOEK_BF16, true, false);
}
Test(forward_formats, gguf_q8_0)
{
	format_case("qwen3-30b-a3b", MOEK_Q8_0, true, false);
}
Test(forward_formats, gguf_q4_0)
{
	format_case("qwen3-30b-a3b", MOEK_Q4_0, true, false);
}
Test(forward_formats, gguf_q4_k)
{
	format_case("qwen3-30b-a3b", MOEK_Q4_K, true, false);
}
Test(forward_formats, gguf_q5_k)
{
	format_case("qwen3-30b-a3b", MOEK_Q5_K, true, false);
}
Test(forward_formats, gguf_q2_k)
{
	format_case("qwen3-30b-a3b", MOEK_Q2_K, true, false);
}
Test(forward_formats, gguf_q3_k_fused_gate_up)
{
	format_case("qwen3-30b-a3b", MOEK_Q3_K, true, true);
}
Test(forward_formats, gguf_q6_k_fused_gate_up)
{
	format_case("qwen3-30b-a3b", MOEK_Q6_K, true, true);
}
Test(forward_formats, gguf_iq4_nl)
{
	format_case("qwen3-30b-a3b", MOEK_IQ4_NL, true, false);
}
Test(forward_formats, gguf_iq4_xs_fused_gate_up)
{
	format_case("qwen3-30b-a3b", MOEK_IQ4_XS, true, true);
}
Test(forward_formats, gguf_nvfp4)
{
	format_case("qwen3-30b-a3b", MOEK_NVFP4, true, false);
}
Test(forward_formats, gguf_iq2_xxs_fused_gate_up)
{
	format_case("qwen3-30b-a3b", MOEK_IQ2_XXS, true, true);
}
Test(forward_formats, gguf_iq2_xs)
{
	format_case("qwen3-30b-a3b", MOEK_IQ2_XS, true, false);
}
Test(forward_formats, gguf_iq3_xxs_fused_gate_up)
{
	format_case("qwen3-30b-a3b", MOEK_IQ3_XXS, true, true);
}
Test(forward_formats, gguf_iq3_s)
{
	format_case("qwen3-30b-a3b", MOEK_IQ3_S, true, false);
}
Test(forward_formats, gguf_iq1_s_fused_gate_up)
{
	format_case("qwen3-30b-a3b", MOEK_IQ1_S, true, true);
}
Test(forward_formats, gguf_iq1_m)
{
	format_case("qwen3-30b-a3b", MOEK_IQ1_M, true, false);
}
Test(forward_formats, gguf_iq2_s_fused_gate_up)
{
	format_case("qwen3-30b-a3b", MOEK_IQ2_S, true, true);
}
Test(forward_formats, gguf_mxfp4_gpt_oss_biases)
{
	format_case("gpt-oss-20b", MOEK_MXFP4, true, false);
}
Test(forward_formats, safetensors_fp8_deepseek)
{
	format_case("deepseek-v3", MOEK_FP8_E4M3_B128, false, false);
}
Test(forward_formats, safetensors_bf16_mixtral)
{
	format_case("mixtral-8x7b", MOEK_BF16, false, false);
}

/* The engine's views against the generator's float originals (F32 weights): catches a wrong
 * projection, a swapped gate/up, a wrong expert or layer — which the reference would share. */
Test(forward_accuracy, f32_matches_float_math)
{
	struct fwd_model m;
	char err[256];
	struct fwd_model_spec spec = {"qwen3-30b-a3b", MOEK_F32, true, 3, 8, 64, 96, false};
	cr_assert_eq(fwd_model_make(&m, &spec, err, sizeof(err)), 0, "%s", err);
	const size_t h = 64, f = 96;
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, 0, 4);
	const int32_t block = fwd_moe_block(m.cat, 1);
	struct fwd_req r;
	fwd_req_make(&r, m.cat, block, 2, 3, 0, MOEK_ACT_F32, 5, false);
	struct forward_result res;
	cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_OK, "%s", res.message);
	float *g = malloc(f * h * 4), *u = malloc(f * h * 4), *d = malloc(h * f * 4);
	const float *x = r.x;
	for (uint32_t t = 0; t < 2; t++) {
		double want[64] = {0};
		for (uint32_t j = 0; j < 3; j++) {
			const uint32_t id = (uint32_t)r.ids[t * 3 + j];
			moe_gen_floats(11, (uint32_t)block, id, MOE_GEN_GATE, h, 0, f * h, g);
			moe_gen_floats(11, (uint32_t)block, id, MOE_GEN_UP, h, 0, f * h, u);
			moe_gen_floats(11, (uint32_t)block, id, MOE_GEN_DOWN, f, 0, h * f, d);
			double hid[96];
			for (size_t i = 0; i < f; i++) {
				double a = 0, b = 0;
				for (size_t c = 0; c < h; c++) {
					a += (double)g[i * h + c] * x[t * h + c];
					b += (double)u[i * h + c] * x[t * h + c];
				}
				hid[i] = a / (1.0 + exp(-a)) * b;
			}
			for (size_t o = 0; o < h; o++) {
				double s = 0;
				for (size_t i = 0; i < f; i++)
					s += (double)d[o * f + i] * hid[i];
				want[o] += r.weights[t * 3 + j] * s;
			}
		}
		for (size_t o = 0; o < h; o++)
			cr_assert(fabs(r.out[t * h + o] - want[o]) <= 1e-4 + 1e-3 * fabs(want[o]),
			          "token %u out[%zu] = %g, float math %g", t, o, r.out[t * h + o],
			          want[o]);
	}
	free(g);
	free(u);
	free(d);
	fwd_req_free(&r);
	forward_destroy(e);
	fwd_model_free(&m);
}

static void make_model(struct fwd_model *m, uint32_t format, uint32_t layers, uint32_t experts,
                       uint64_t hidden, uint64_t ffn)
{
	char err[256];
	struct fwd_model_spec spec = {"qwen3-30b-a3b", format, true, layers,
	                              experts,         hidden, ffn,  false};
	cr_assert_eq(fwd_model_make(m, &spec, err, sizeof(err)), 0, "%s", err);
}

/* ALL_RESIDENT and RESIDENCY give the same bits in the decode layout; MMAP, and both of them
 * over the files' rows (file_layout), give the same bits as each other. */
Test(forward_sources, all_sources_same_bits)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q4_K, 2, 16, 256, 256);
	const size_t h = m.cat->info.hidden;
	struct forward_engine *e[5] = {
	    engine(&m, FORWARD_SOURCE_ALL_RESIDENT, 0, 8),
	    engine(&m, FORWARD_SOURCE_RESIDENCY, 0, 8),
	    engine(&m, FORWARD_SOURCE_MMAP, 0, 8),
	    engine_layout(&m, FORWARD_SOURCE_ALL_RESIDENT, 0, 8, true),
	    engine_layout(&m, FORWARD_SOURCE_RESIDENCY, 0, 8, true),
	};
	const char *name[5] = {"", "residency", "", "all-resident, files' rows",
	                       "residency, files' rows"};
	for (uint32_t i = 0; i < 6; i++) {
		struct fwd_req r;
		fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, i % 2), 1 + i, 8, 0, MOEK_ACT_BF16,
		             40 + i, i % 3 == 0);
		const size_t n = (1 + i) * h;
		float *files = malloc(n * sizeof(float));
		cr_assert(files);
		struct forward_result res;
		cr_assert_eq(forward_run(e[0], &r.q, r.ref, NULL, &res), MOE_OK, "%s", res.message);
		cr_assert_eq(forward_run(e[2], &r.q, files, NULL, &res), MOE_OK, "%s", res.message);
		for (int s = 1; s < 5; s++) {
			if (s == 2)
				continue;
			memset(r.out, 0xff, n * sizeof(float));
			cr_assert_eq(forward_run(e[s], &r.q, r.out, NULL, &res), MOE_OK, "%s",
			             res.message);
			assert_bits(r.out, s < 2 ? r.ref : files, n, name[s]);
		}
		fwd_req_free(&r);
		free(files);
	}
	struct forward_stats st = {0};
	forward_stats(e[1], &st);
	cr_assert_gt(st.cold_misses, 0);
	cr_assert_eq(st.requests, 6);
	for (int s = 0; s < 5; s++)
		forward_destroy(e[s]);
	fwd_model_free(&m);
}

/* A llama.cpp mix on `layers` blocks (experts of two sizes): every source against the
 * reference on every block, ALL_RESIDENT and RESIDENCY with a budget that evicts (slots serve
 * experts of both sizes) giving the same bits; `down` is the format of n_down of the downs. */
static void mix_every_source(enum moe_gen_mix mix, uint32_t down, uint32_t n_down, uint32_t layers)
{
	struct fwd_model m;
	char err[256];
	struct fwd_model_spec spec = {.preset = "qwen3-30b-a3b",
	                              .gguf = true,
	                              .layers = layers,
	                              .experts = MODEL_EXPERTS,
	                              .hidden = 256,
	                              .ffn = 256,
	                              .mix = mix};
	cr_assert_eq(fwd_model_make(&m, &spec, err, sizeof(err)), 0, "%s", err);
	/* the catalog holds each format the rule gives once */
	uint32_t seen[8], n_seen = 0;
	for (uint32_t L = 0; L < layers; L++)
		for (enum moe_gen_tensor w = MOE_GEN_GATE; w <= MOE_GEN_DOWN; w++) {
			const uint32_t f = moe_gen_mix_format(mix, w, L, layers);
			uint32_t i = 0;
			while (i < n_seen && seen[i] != f)
				i++;
			if (i == n_seen && n_seen < 8)
				seen[n_seen++] = f;
		}
	cr_assert_eq(m.cat->n_formats, n_seen);
	const size_t h = m.cat->info.hidden;
	struct forward_engine *e[3] = {
	    engine(&m, FORWARD_SOURCE_ALL_RESIDENT, 0, 24),
	    engine(&m, FORWARD_SOURCE_RESIDENCY, m.cat->expert_bytes_total / 4, 24),
	    engine(&m, FORWARD_SOURCE_MMAP, 0, 24),
	};
	uint32_t downs = 0;
	for (uint32_t L = 0; L < layers; L++) {
		downs += moe_catalog_expert(m.cat, L, 0)->proj[MOE_PROJ_DOWN].format == down;
		for (uint32_t n = 1; n <= 24; n += 23) {
			struct fwd_req r;
			fwd_req_make(&r, m.cat, (int32_t)L, n, 4, 0, MOEK_ACT_BF16, 70 + L, false);
			float *resident = malloc(n * h * sizeof(float));
			cr_assert(resident);
			for (int s = 0; s < 3; s++) {
				char what[64];
				snprintf(what, sizeof(what), "%s block %u, %u tokens, source %d",
				         moe_gen_mix_name(mix), L, n, s);
				memset(r.out, 0xff, n * h * sizeof(float));
				run_equal(e[s], &r, what);
				assert_bits(r.out, r.ref, n * h, what);
				if (s == 0)
					memcpy(resident, r.out, n * h * sizeof(float));
				if (s == 1)
					assert_bits(r.out, resident, n * h, what);
			}
			free(resident);
			fwd_req_free(&r);
		}
	}
	cr_assert_eq(downs, n_down);
	struct forward_stats st = {0};
	forward_stats(e[1], &st);
	cr_assert_gt(st.residency.evictions, 0);
	for (int s = 0; s < 3; s++)
		forward_destroy(e[s]);
	fwd_model_free(&m);
}

/* Q4_K_M: down in Q6_K on 5 of 9 blocks, Q4_K elsewhere; Q2_K: gate/up Q2_K, every down
 * Q3_K; Q3_K_M: gate/up Q3_K, down Q4_K (Q5_K only from 16 blocks on). */
Test(forward_formats, gguf_q4_k_m_mix_every_source)
{
	mix_every_source(MOE_GEN_MIX_Q4_K_M, MOEK_Q6_K, 5, 9);
}
/* On 6 blocks the first down is Q4_K (which has the interleaved decode layout) and blocks 2
 * and 5 are Q6_K (which has not): the decode layout is decided per format, not once from the
 * first expert, and its scratch holds the widest rows of either. */
Test(forward_formats, gguf_q4_k_m_mix_first_down_interleaved)
{
	mix_every_source(MOE_GEN_MIX_Q4_K_M, MOEK_Q6_K, 2, 6);
}
Test(forward_formats, gguf_q2_k_mix_every_source)
{
	mix_every_source(MOE_GEN_MIX_Q2_K, MOEK_Q3_K, 9, 9);
}
/* The i-quant mixes (their quantizers are slow: three of the seven, which between them take
 * every branch of the rule; each format is served alone above): IQ1_S's and IQ2_M's downs of
 * the first eighth of the blocks (block 0 of 9) in Q2_K and IQ3_S. */
Test(forward_formats, gguf_iq1_s_mix_every_source)
{
	mix_every_source(MOE_GEN_MIX_IQ1_S, MOEK_Q2_K, 1, 9);
}
Test(forward_formats, gguf_iq2_m_mix_every_source)
{
	mix_every_source(MOE_GEN_MIX_IQ2_M, MOEK_IQ3_S, 1, 9);
}
/* IQ3_XXS: gate/up IQ3_XXS; down Q4_K in block 0 of 9, Q3_K after (three formats) */
Test(forward_formats, gguf_iq3_xxs_mix_every_source)
{
	mix_every_source(MOE_GEN_MIX_IQ3_XXS, MOEK_Q4_K, 1, 9);
}
Test(forward_formats, gguf_q3_k_m_mix_every_source)
{
	mix_every_source(MOE_GEN_MIX_Q3_K_M, MOEK_Q4_K, 9, 9);
}

/* The decode layout (gate/up alternating, groups of 8 interleaved where the format has the
 * layout) against the files' rows, for every container and gate/up arrangement: the same
 * bits where only rows move (no interleaved layout for the format), the interleaved group
 * dots' reassociation (and Q8_0's unrounded activation scale) otherwise. RESIDENCY runs with a
 * budget that evicts, so the rearrangement is redone on reloads. */
static double nmse_ff(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return den > 0 ? num / den : num;
}

static void layout_case(const char *preset, uint32_t format, bool gguf, bool fused)
{
	struct fwd_model m;
	char err[256];
	struct fwd_model_spec spec = {preset, format, gguf, 3, 8, 256, 256, fused};
	cr_assert_eq(fwd_model_make(&m, &spec, err, sizeof(err)), 0, "%s", err);
	const size_t h = m.cat->info.hidden;
	const bool moved_only = !moek_interleave_supported(format);
	struct forward_engine *files = engine_layout(&m, FORWARD_SOURCE_ALL_RESIDENT, 0, 8, true);
	struct forward_engine *res =
	    engine(&m, FORWARD_SOURCE_RESIDENCY, m.cat->expert_bytes_total * 3 / 10, 8);
	const uint32_t k = m.cat->info.top_k < 4 ? m.cat->info.top_k : 4;
	for (uint32_t i = 0; i < 6; i++) {
		struct fwd_req r;
		fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, i % m.cat->info.n_moe_layers),
		             1 + i % 3, k, 0, MOEK_ACT_F32, 60 + i, false);
		const size_t n = r.q.n_tokens * h;
		struct forward_result a, b;
		cr_assert_eq(forward_run(files, &r.q, r.ref, NULL, &a), MOE_OK, "%s", a.message);
		cr_assert_eq(forward_run(res, &r.q, r.out, NULL, &b), MOE_OK, "%s", b.message);
		char what[96];
		snprintf(what, sizeof(what), "%s %s, request %u", moe_format_name(format),
		         gguf ? "gguf" : "safetensors", i);
		if (moved_only) {
			assert_bits(r.out, r.ref, n, what);
		} else {
			const double e = nmse_ff(r.out, r.ref, n);
			cr_assert_lt(e, format == MOEK_Q8_0 ? 1e-5 : 1e-9, "%s: nmse %g", what, e);
		}
		fwd_req_free(&r);
	}
	struct forward_stats st = {0};
	forward_stats(res, &st);
	cr_assert_gt(st.residency.evictions, 0, "a 30%% budget must evict");
	forward_destroy(files);
	forward_destroy(res);
	fwd_model_free(&m);
}

Test(forward_layout, q8_0_gguf)
{
	layout_case("qwen3-30b-a3b", MOEK_Q8_0, true, false);
}
Test(forward_layout, q4_k_gguf_fused_gate_up)
{
	layout_case("qwen3-30b-a3b", MOEK_Q4_K, true, true);
}
Test(forward_layout, mxfp4_gpt_oss_hf_rows_interleaved_gate_up)
{
	layout_case("gpt-oss-20b", MOEK_MXFP4, false, false);
}
Test(forward_layout, mxfp4_gpt_oss_gguf_biases)
{
	layout_case("gpt-oss-20b", MOEK_MXFP4, true, false);
}
Test(forward_layout, bf16_safetensors_mixtral)
{
	layout_case("mixtral-8x7b", MOEK_BF16, false, false);
}
Test(forward_layout, q6_k_gguf_fused_gate_up)
{
	layout_case("qwen3-30b-a3b", MOEK_Q6_K, true, true);
}
Test(forward_layout, q3_k_gguf)
{
	layout_case("qwen3-30b-a3b", MOEK_Q3_K, true, false);
}
Test(forward_layout, q2_k_gguf_fused_gate_up)
{
	layout_case("qwen3-30b-a3b", MOEK_Q2_K, true, true);
}
Test(forward_layout, iq4_nl_gguf)
{
	layout_case("qwen3-30b-a3b", MOEK_IQ4_NL, true, false);
}
Test(forward_layout, iq4_xs_gguf_fused_gate_up)
{
	layout_case("qwen3-30b-a3b", MOEK_IQ4_XS, true, true);
}
Test(forward_layout, fp8_safetensors_deepseek)
{
	layout_case("deepseek-v3", MOEK_FP8_E4M3_B128, false, false);
}

struct warm_seen {
	uint64_t done, total, calls;
};
static void record_warm(void *arg, const char *what, uint64_t done, uint64_t total)
{
	struct warm_seen *w = arg;
	if (strcmp(what, "warming every expert") != 0)
		return;
	cr_assert_leq(done, total);
	cr_assert_geq(done, w->done, "progress never goes back");
	w->done = done;
	w->total = total;
	w->calls++;
}

/* A budget that holds every expert (0): all of them are loaded at create, with progress, so
 * requests never wait for a read — no cold or in-flight misses, nothing read, same bits. */
Test(forward_warm, every_expert_loaded_at_create_when_all_fit)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 2, 8, 256, 256);
	const size_t h = m.cat->info.hidden;
	struct warm_seen seen = {0};
	struct forward_config cfg = {
	    .source = FORWARD_SOURCE_RESIDENCY,
	    .threads_per_node = 1,
	    .max_tokens = 4,
	    .chunk_bytes = 64 * 1024,
	    .progress = record_warm,
	    .progress_arg = &seen,
	};
	struct forward_engine *e;
	cr_assert_eq(forward_create(&e, m.cat, &cfg, &ferr), 0, "%s", ferr.msg);
	const uint64_t n = (uint64_t)m.cat->info.n_moe_layers * m.cat->info.n_experts;
	cr_assert_eq(seen.total, n);
	cr_assert_eq(seen.done, n, "every expert loaded");
	cr_assert_gt(seen.calls, 1);
	struct forward_engine *ref = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, 0, 4);
	for (uint32_t i = 0; i < 8; i++) {
		struct fwd_req r;
		fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, i % 2), 1 + i % 4, 4, 0, MOEK_ACT_F32,
		             700 + i, false);
		struct forward_result res;
		cr_assert_eq(forward_run(ref, &r.q, r.ref, NULL, &res), MOE_OK, "%s", res.message);
		cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_OK, "%s", res.message);
		cr_assert_eq(res.cold_misses + res.inflight_misses, 0, "request %u waited", i);
		cr_assert_eq(res.hits, res.experts);
		assert_bits(r.out, r.ref, r.q.n_tokens * h, "warmed residency");
		fwd_req_free(&r);
	}
	struct forward_stats st = {0};
	forward_stats(e, &st);
	cr_assert_eq(st.cold_misses, 0);
	cr_assert_eq(st.bytes_read, 0);
	cr_assert_gt(st.hits, 0);
	forward_destroy(ref);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* A budget of 10% of the expert bytes: still correct, evictions happen, resident bytes never
 * above the budget, and the process does not grow by the model's size. */
Test(forward_budget, ten_percent)
{
	struct fwd_model m;
	make_model(&m, MOEK_F16, 4, 16, 256, 512);
	const size_t h = m.cat->info.hidden;
	const uint64_t budget = m.cat->expert_bytes_total / 10;
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_RESIDENCY, budget, 4);
	const uint64_t rss0 = fwd_rss_bytes();
	struct forward_stats st = {0};
	for (uint32_t i = 0; i < 40; i++) {
		struct fwd_req r;
		fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, i % 4), 1 + i % 4, 4, 0, MOEK_ACT_F32,
		             900 + i, false);
		run_equal(e, &r, "10% budget");
		assert_bits(r.out, r.ref, r.q.n_tokens * h, "10% budget");
		forward_stats(e, &st);
		cr_assert_leq(
		    st.resident_bytes, st.budget_bytes, "request %u: %llu resident > %llu", i,
		    (unsigned long long)st.resident_bytes, (unsigned long long)st.budget_bytes);
		fwd_req_free(&r);
	}
	const uint64_t rss1 = fwd_rss_bytes();
	cr_assert_eq(st.budget_bytes, budget);
	cr_assert_gt(st.residency.evictions, 0, "a 10%% budget must evict");
	cr_assert_gt(st.cold_misses, 0);
	/* Growth must stay far from the model's size (sanitizer quarantines and the reference's
	 * buffers take a few MiB): under half of what the budget leaves out. */
	const uint64_t total = m.cat->expert_bytes_total;
	cr_assert_lt(rss1 - (rss1 > rss0 ? rss0 : rss1), budget + (total - budget) / 2,
	             "RSS grew by %llu bytes with a budget of %llu of %llu",
	             (unsigned long long)(rss1 - rss0), (unsigned long long)budget,
	             (unsigned long long)total);
	forward_destroy(e);
	fwd_model_free(&m);
}

static int fail_expert_3(void *arg, const struct loader_read_info *info, int res)
{
	atomic_int *hits = arg;
	if (info->layer == 1 && info->expert == 3) {
		atomic_fetch_add(hits, 1);
		return -EIO;
	}
	return res;
}

/* An I/O error in one expert's region fails exactly the requests that need it. */
Test(forward_io, failed_expert_fails_only_its_requests)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 2, 8, 256, 256);
	atomic_int hits = 0;
	struct forward_config cfg = {
	    .source = FORWARD_SOURCE_RESIDENCY,
	    .threads_per_node = 1,
	    .max_tokens = 4,
	};
	struct forward_engine *e;
	cr_assert_eq(forward_create_with_fault_hook(&e, m.cat, &cfg, fail_expert_3, &hits, &ferr),
	             0, "%s", ferr.msg);
	struct forward_engine *ok = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, 0, 4);
	uint32_t failed, passed;
	char why[256];
	cr_assert_eq(
	    fwd_replay_expert3_failure(e, ok, m.cat, 2, 300, &failed, &passed, why, sizeof(why)), 0,
	    "%s", why);
	cr_assert_gt(failed, 0);
	cr_assert_gt(passed, 0);
	cr_assert_gt(atomic_load(&hits), 0);
	forward_destroy(ok);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* Deferral: immediate + deferred equals the undeferred output (bits for one deferred id; a
 * float re-association for more), deferred_in lands in the next layer's output, the last layer
 * cannot defer. */
Test(forward_defer, immediate_plus_deferred_is_undeferred)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 3, 8, 256, 256);
	const size_t h = m.cat->info.hidden;
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, 0, 24);
	const uint32_t tokens[] = {1, 4, 24};
	for (uint32_t kd = 1; kd <= 2; kd++)
		for (int i = 0; i < 3; i++) {
			const uint32_t n = tokens[i];
			struct fwd_req d, u;
			fwd_req_make(&d, m.cat, fwd_moe_block(m.cat, 0), n, 4, kd, MOEK_ACT_F32,
			             70 + (uint64_t)i, i == 1);
			fwd_req_make(&u, m.cat, fwd_moe_block(m.cat, 0), n, 4, 0, MOEK_ACT_F32,
			             70 + (uint64_t)i, i == 1);
			run_equal(e, &d, "deferred");
			assert_bits(d.out, d.ref, n * h, "deferred: immediate vs reference");
			assert_bits(d.out_def, d.ref_def, n * h, "deferred: deferred vs reference");
			struct forward_result res;
			cr_assert_eq(forward_run(e, &u.q, u.out, NULL, &res), MOE_OK);
			cr_assert_eq(res.n_deferred, 0);
			for (size_t j = 0; j < n * h; j++)
				d.out[j] += d.out_def[j];
			if (kd == 1) {
				assert_bits(d.out, u.out, n * h,
				            "k_defer 1: imm + def vs undeferred");
			} else {
				for (size_t j = 0; j < n * h; j++)
					cr_assert(fabsf(d.out[j] - u.out[j]) <=
					              1e-5f + 1e-5f * fabsf(u.out[j]),
					          "k_defer %u, %u tokens: %g vs %g", kd, n,
					          d.out[j], u.out[j]);
			}
			fwd_req_free(&d);
			fwd_req_free(&u);
		}
	/* Layer L's deferred part arrives in layer L+1's output, added last. */
	struct fwd_req a, b;
	fwd_req_make(&a, m.cat, fwd_moe_block(m.cat, 0), 2, 4, 2, MOEK_ACT_F32, 5, false);
	fwd_req_make(&b, m.cat, fwd_moe_block(m.cat, 1), 2, 4, 0, MOEK_ACT_F32, 6, false);
	struct forward_result res;
	cr_assert_eq(forward_run(e, &a.q, a.out, a.out_def, &res), MOE_OK);
	cr_assert_eq(res.n_deferred, 4);
	cr_assert_eq(forward_run(e, &b.q, b.ref, NULL, &res), MOE_OK);
	b.q.deferred_in = a.out_def;
	cr_assert_eq(forward_run(e, &b.q, b.out, NULL, &res), MOE_OK);
	for (size_t j = 0; j < 2 * h; j++)
		b.ref[j] += a.out_def[j];
	assert_bits(b.out, b.ref, 2 * h, "deferred_in");
	/* The last MoE layer never defers. */
	b.q.layer = fwd_moe_block(m.cat, 2);
	b.q.k_defer = 1;
	cr_assert_eq(forward_run(e, &b.q, b.out, b.out_def, &res), MOE_EBADFIELD);
	fwd_req_free(&a);
	fwd_req_free(&b);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* MOE_FWD_DEFER_UNION, kt-kernel's rule: an expert protected (among the k - k_defer
 * highest-weighted of some token's entries, -1 included) is immediate for every token. */
Test(forward_defer, union_rule_protects_an_expert_for_every_token)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 3, 8, 256, 256);
	const size_t h = m.cat->info.hidden;
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, 0, 24);
	/* Two tokens, k 2, k_defer 1: token 0 (3: 0.9, 5: 0.1), token 1 (5: 0.8, 6: 0.2).
	 * Protected: 3 and 5, so only token 1's expert 6 is deferred (the per-token rule would
	 * defer token 0's 5 as well). */
	struct fwd_req r;
	fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, 0), 2, 2, 1, MOEK_ACT_F32, 9, false);
	const int32_t ids[4] = {3, 5, 5, 6};
	const float w[4] = {0.9f, 0.1f, 0.8f, 0.2f};
	memcpy(r.ids, ids, sizeof(ids));
	memcpy(r.weights, w, sizeof(w));
	struct forward_result res;
	cr_assert_eq(forward_run(e, &r.q, r.out, r.out_def, &res), MOE_OK, "%s", res.message);
	cr_assert_eq(res.n_deferred, 2, "per-token rule");
	r.q.defer_union = true;
	run_equal(e, &r, "union, hand-made");
	cr_assert_eq(forward_run(e, &r.q, r.out, r.out_def, &res), MOE_OK, "%s", res.message);
	cr_assert_eq(res.n_deferred, 1, "union rule");
	/* A -1 entry ranks with the others: (-1: 0.9, 3: 0.5) protects nothing at k_defer 1,
	 * so expert 3 is deferred. */
	const int32_t ids2[4] = {-1, 3, -1, 3};
	const float w2[4] = {0.9f, 0.5f, 0.9f, 0.5f};
	memcpy(r.ids, ids2, sizeof(ids2));
	memcpy(r.weights, w2, sizeof(w2));
	run_equal(e, &r, "union, -1 ranked");
	cr_assert_eq(forward_run(e, &r.q, r.out, r.out_def, &res), MOE_OK, "%s", res.message);
	cr_assert_eq(res.n_deferred, 2, "union rule with -1 ranked first");
	fwd_req_free(&r);
	/* Random requests, holes included: the engine's split equals the oracle's, bit for
	 * bit, and immediate + deferred is the undeferred output. */
	const uint32_t tokens[] = {1, 5, 24};
	for (uint32_t kd = 1; kd <= 3; kd++)
		for (int i = 0; i < 3; i++) {
			const uint32_t n = tokens[i];
			struct fwd_req d, u;
			fwd_req_make(&d, m.cat, fwd_moe_block(m.cat, 0), n, 4, kd, MOEK_ACT_F32,
			             90 + (uint64_t)i, i == 1);
			fwd_req_make(&u, m.cat, fwd_moe_block(m.cat, 0), n, 4, 0, MOEK_ACT_F32,
			             90 + (uint64_t)i, i == 1);
			d.q.defer_union = true;
			run_equal(e, &d, "union");
			assert_bits(d.out, d.ref, n * h, "union: immediate vs reference");
			assert_bits(d.out_def, d.ref_def, n * h, "union: deferred vs reference");
			cr_assert_eq(forward_run(e, &u.q, u.out, NULL, &res), MOE_OK);
			for (size_t j = 0; j < n * h; j++)
				cr_assert(fabsf(d.out[j] + d.out_def[j] - u.out[j]) <=
				              1e-5f + 1e-5f * fabsf(u.out[j]),
				          "union k_defer %u, %u tokens: %g vs %g", kd, n,
				          d.out[j] + d.out_def[j], u.out[j]);
			fwd_req_free(&d);
			fwd_req_free(&u);
		}
	/* Not with MOE_FWD_DEFER_COLD. */
	struct fwd_req c;
	fwd_req_make(&c, m.cat, fwd_moe_block(m.cat, 0), 2, 4, 1, MOEK_ACT_F32, 3, false);
	c.q.defer_union = c.q.defer_cold = true;
	cr_assert_eq(forward_run(e, &c.q, c.out, c.out_def, &res), MOE_EBADFIELD);
	fwd_req_free(&c);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* Every bad request gets an error naming the problem; the engine keeps serving. */
Test(forward_errors, bad_requests)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q4_0, 2, 8, 64, 64);
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_RESIDENCY, 0, 4);
	struct fwd_req r;
	fwd_req_make(&r, m.cat, 0, 2, 2, 0, MOEK_ACT_F32, 1, false);
	struct forward_result res;
	struct forward_request q = r.q;
#define EXPECT(want, field, value)                                                                 \
	do {                                                                                       \
		q = r.q;                                                                           \
		q.field = value;                                                                   \
		cr_assert_eq(forward_run(e, &q, r.out, r.out_def, &res), want, #field ": %s",      \
		             res.message);                                                         \
		cr_assert_eq(res.status, want);                                                    \
		cr_assert_neq(res.message[0], 0);                                                  \
	} while (0)
	EXPECT(MOE_EBADLAYER, layer, -1);
	EXPECT(MOE_EBADLAYER, layer, 2);
	EXPECT(MOE_EBADTOKENS, n_tokens, 0);
	EXPECT(MOE_EBADTOKENS, n_tokens, 5);
	EXPECT(MOE_EBADTOPK, k, 0);
	EXPECT(MOE_EBADTOPK, k, 9);
	EXPECT(MOE_EBADDTYPE, x_dtype, 3);
	EXPECT(MOE_EBADFIELD, k_defer, 3);
	EXPECT(MOE_EINVAL, client, FORWARD_MAX_CLIENTS);
	r.ids[3] = 8;
	EXPECT(MOE_EBADEXPERT, client, 0);
	cr_assert_eq(res.bad_token, 1);
	cr_assert_eq(res.bad_index, 1);
	cr_assert_eq(res.bad_expert, 8);
	cr_assert(strstr(res.message, "expert 8") != NULL, "%s", res.message);
	r.ids[3] = -2;
	EXPECT(MOE_EBADEXPERT, client, 0);
	/* An expert named twice in one token's row: the repeat is the offence. */
	r.ids[3] = r.ids[2];
	EXPECT(MOE_EBADEXPERT, client, 0);
	cr_assert_eq(res.bad_token, 1);
	cr_assert_eq(res.bad_index, 1);
	cr_assert_eq(res.bad_expert, r.ids[2]);
	cr_assert(strstr(res.message, "named twice") && strstr(res.message, "first as id 0"), "%s",
	          res.message);
	/* The same expert in two tokens' rows is fine. */
	r.ids[3] = r.ids[0] != r.ids[2] ? r.ids[0] : -1;
	run_equal(e, &r, "one expert in two tokens");
	r.ids[3] = -1;
	r.weights[2] = NAN;
	EXPECT(MOE_EBADWEIGHT, client, 0);
	cr_assert_eq(res.bad_index, 0);
	r.weights[2] = 0.5f;
	((float *)r.x)[64 + 7] = INFINITY;
	EXPECT(MOE_ENONFINITE, client, 0);
	cr_assert_eq(res.bad_token, 1);
	((float *)r.x)[64 + 7] = NAN;
	EXPECT(MOE_ENONFINITE, client, 0);
	((float *)r.x)[64 + 7] = 0.25f;
	/* bf16 activations with an Inf */
	uint16_t xb[128];
	moek_convert(MOEK_ACT_BF16, xb, MOEK_ACT_F32, r.x, 128);
	xb[5] = 0x7f80;
	EXPECT(MOE_ENONFINITE, x, xb);
	/* Still serving, and right. */
	run_equal(e, &r, "after bad requests");
	assert_bits(r.out, r.ref, 2 * 64, "after bad requests");
	struct forward_stats st = {0};
	forward_stats(e, &st);
	cr_assert_geq(st.failures, 10);
	fwd_req_free(&r);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* Masks are per client; residency leaves an expert out only while every attached client
 * masks it. */
Test(forward_mask, per_client_and_intersection)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 2, 8, 64, 64);
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_RESIDENCY, 0, 4);
	const int32_t L = fwd_moe_block(m.cat, 1);
	uint8_t bits[1] = {1u << 2}; /* expert 2 */
	forward_client_attach(e, 0);
	forward_client_attach(e, 1);
	cr_assert_eq(forward_set_mask(e, 0, L, bits, 1), MOE_OK);
	struct fwd_req r;
	fwd_req_make(&r, m.cat, L, 1, 2, 0, MOEK_ACT_F32, 3, false);
	r.ids[0] = 2;
	r.ids[1] = 5;
	struct forward_result res;
	r.q.client = 0;
	cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_EMASKED, "%s", res.message);
	cr_assert_eq(res.bad_expert, 2);
	r.q.client = 1;
	cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_OK, "%s", res.message);
	/* Both clients mask expert 2: it is evicted and never loaded (prefetch starts nothing);
	 * an unmasked cold expert still prefetches. */
	cr_assert_eq(forward_set_mask(e, 1, L, bits, 1), MOE_OK);
	int32_t two = 2, seven = 7;
	cr_assert_eq(forward_prefetch(e, L, &two, NULL, 1, false), 0);
	cr_assert_eq(forward_prefetch(e, L, &seven, NULL, 1, false), 1);
	/* Client 1 leaves: client 0 alone still masks it. */
	forward_client_detach(e, 1);
	cr_assert_eq(forward_prefetch(e, L, &two, NULL, 1, false), 0);
	/* Whole-model mask of client 0 cleared: expert 2 loads again. */
	uint8_t none[2] = {0, 0};
	cr_assert_eq(forward_set_mask(e, 0, -1, none, 1), MOE_ETOOSMALL);
	cr_assert_eq(forward_set_mask(e, 0, -1, none, 2), MOE_OK);
	cr_assert_eq(forward_prefetch(e, L, &two, NULL, 1, false), 1);
	r.q.client = 0;
	cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_OK, "%s", res.message);
	fwd_req_free(&r);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* Prefetched experts are not cold misses when the request comes; router scores pick top_k. */
Test(forward_prefetch, hints_load_ahead)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 2, 8, 64, 64);
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_RESIDENCY, 0, 4);
	const int32_t L = fwd_moe_block(m.cat, 0);
	int32_t ids[3] = {1, 4, 99};
	cr_assert_eq(forward_prefetch(e, L, ids, NULL, 3, false), 2);
	cr_assert_eq(forward_prefetch(e, 5, ids, NULL, 3, false), MOE_EBADLAYER);
	struct fwd_req r;
	fwd_req_make(&r, m.cat, L, 1, 2, 0, MOEK_ACT_F32, 3, false);
	r.ids[0] = 1;
	r.ids[1] = 4;
	struct forward_result res;
	cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_OK, "%s", res.message);
	cr_assert_eq(res.cold_misses, 0);
	cr_assert_eq(res.hits + res.inflight_misses, 2);
	float scores[8] = {0.1f, 0.0f, 0.9f, 0.0f, 0.0f, 0.0f, 0.8f, NAN};
	const int32_t L1 = fwd_moe_block(m.cat, 1);
	int started = forward_prefetch(e, L1, NULL, scores, 8, true);
	cr_assert_eq(started, (int)(m.cat->info.top_k < 3 ? m.cat->info.top_k : 3));
	cr_assert_eq(forward_prefetch(e, L1, NULL, scores, 7, true), MOE_EINVAL);
	fwd_req_free(&r);
	forward_destroy(e);
	fwd_model_free(&m);
}

Test(forward_stats, per_layer_counts)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 2, 8, 64, 64);
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_RESIDENCY, 0, 4);
	for (uint32_t i = 0; i < 5; i++) {
		struct fwd_req r;
		fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, 1), 3, 2, 0, MOEK_ACT_F32, i, false);
		struct forward_result res;
		cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_OK);
		fwd_req_free(&r);
	}
	cr_assert_eq(forward_stats_layers(e), 2);
	struct forward_layer_stats layers[2];
	struct forward_stats st = {.layers = layers};
	forward_stats(e, &st);
	cr_assert_eq(st.requests, 5);
	cr_assert_eq(st.tokens, 15);
	cr_assert_eq(layers[0].requests, 0);
	cr_assert_eq(layers[1].requests, 5);
	cr_assert_eq(layers[1].layer, (uint32_t)fwd_moe_block(m.cat, 1));
	cr_assert_gt(layers[1].cold_misses, 0);
	cr_assert_gt(layers[1].hits, 0, "5 requests over 8 experts must hit");
	cr_assert_gt(layers[1].bytes_read, 0);
	cr_assert_gt(layers[1].total_p50_us, 0);
	cr_assert_geq(layers[1].total_p99_us, layers[1].total_p50_us);
	cr_assert_gt(st.resident_bytes, 0);
	cr_assert_leq(st.resident_bytes, st.budget_bytes);
	/* JSON: the keys the STATS op and `moe-sidecar stats` promise, the numbers above. */
	char json[2048], small[16];
	size_t need = forward_stats_json(&st, json, sizeof(json));
	cr_assert_lt(need, sizeof(json));
	cr_assert_eq(strlen(json), need);
	char want[64];
	snprintf(want, sizeof(want), "{\"requests\":5,\"tokens\":15,");
	cr_assert_eq(strncmp(json, want, strlen(want)), 0, "%s", json);
	const char *keys[] = {"\"hits\":",
	                      "\"cold_misses\":",
	                      "\"inflight_misses\":",
	                      "\"bytes_read\":",
	                      "\"resident_bytes\":",
	                      "\"budget_bytes\":",
	                      "\"layers\":[{\"layer\":1,",
	                      "\"io_us\":{\"p50\":"};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		cr_assert(strstr(json, keys[i]) != NULL, "%s missing in %s", keys[i], json);
	cr_assert_eq(strstr(json, "\"layer\":0,"), NULL, "idle layers are left out: %s", json);
	cr_assert_eq(json[need - 1], '}');
	cr_assert_eq(forward_stats_json(&st, small, sizeof(small)), need,
	             "truncation reports need");
	cr_assert_eq(strlen(small), sizeof(small) - 1);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* Topology choices: a synthetic 2-node machine splits work but binds nothing; a node list
 * naming a node that does not exist and a malformed synthetic spec are errors that say so. */
Test(forward_topology, synthetic_and_bad_choices)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 2, 8, 64, 64);
	struct forward_config cfg = {
	    .source = FORWARD_SOURCE_MMAP,
	    .numa = FORWARD_NUMA_SYNTHETIC,
	    .numa_synthetic = "pack:1 numa:2 core:2 pu:1",
	    .max_tokens = 2,
	};
	struct forward_engine *e;
	cr_assert_eq(forward_create(&e, m.cat, &cfg, &ferr), 0, "%s", ferr.msg);
	struct forward_topology_info ti;
	forward_topology(e, &ti);
	cr_assert_eq(ti.n_nodes, 2);
	cr_assert(ti.synthetic);
	cr_assert_not(ti.memory_bound);
	cr_assert_eq(ti.threads[0], 2, "threads default to the node's PUs");
	forward_destroy(e);
	cfg.numa_synthetic = "numa:banana";
	cr_assert_neq(forward_create(&e, m.cat, &cfg, &ferr), 0);
	cr_assert(strstr(ferr.msg, "banana") != NULL, "%s", ferr.msg);
	cfg.numa = FORWARD_NUMA_LIST;
	cfg.numa_list[0] = 7;
	cfg.numa_list_len = 1;
	cr_assert_neq(forward_create(&e, m.cat, &cfg, &ferr), 0);
	cr_assert(strstr(ferr.msg, "--numa") != NULL, "%s", ferr.msg);
	cfg.numa_list[0] = 0;
	cfg.threads_per_node = 1;
	cr_assert_eq(forward_create(&e, m.cat, &cfg, &ferr), 0, "%s", ferr.msg);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* The CPUs thread `tid` of this process may run on, from /proc (e.g. "1" or "0-1"). */
static bool task_cpus(const char *tid, char *out, size_t len)
{
	char path[320], line[256];
	snprintf(path, sizeof(path), "/proc/self/task/%s/status", tid);
	FILE *f = fopen(path, "r");
	bool found = false;
	while (f && !found && fgets(line, sizeof(line), f))
		if (sscanf(line, "Cpus_allowed_list: %63s", out) == 1 && len >= 64)
			found = true;
	if (f)
		fclose(f);
	return found;
}

/* Counts this process's worker threads of node 0 ("moe-w0.N") and checks their CPU sets:
 * each a single CPU, all different (one_each), or each the whole process's set. */
static int check_worker_cpus(bool one_each, const char *process_cpus)
{
	char seen[16][64];
	int n = 0;
	DIR *d = opendir("/proc/self/task");
	cr_assert_not_null(d);
	for (struct dirent *de; (de = readdir(d)) != NULL;) {
		if (de->d_name[0] == '.')
			continue;
		char path[320], comm[32] = "", cpus[64];
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", de->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (!fgets(comm, sizeof(comm), f))
			comm[0] = '\0';
		fclose(f);
		if (strncmp(comm, "moe-w0.", 7) != 0 || !task_cpus(de->d_name, cpus, sizeof(cpus)))
			continue;
		if (one_each) {
			cr_assert(strchr(cpus, ',') == NULL && strchr(cpus, '-') == NULL,
			          "worker %s may run on %s, not on one CPU", comm, cpus);
			for (int i = 0; i < n && i < 16; i++)
				cr_assert_str_neq(seen[i], cpus, "two workers on CPU %s", cpus);
		} else {
			cr_assert_str_eq(cpus, process_cpus, "worker %s pinned to %s", comm, cpus);
		}
		if (n < 16)
			snprintf(seen[n], sizeof(seen[n]), "%s", cpus);
		n++;
	}
	closedir(d);
	return n;
}

/* On the real topology, workers get a PU each when the node has one per worker (after a
 * request, so every worker has started); with more workers than PUs nothing is pinned on a
 * one-node machine. Worker 0 is the caller and keeps its own affinity. */
Test(forward_topology, workers_pinned_one_pu_each)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 2, 8, 64, 64);
	char process_cpus[64], self[16];
	snprintf(self, sizeof(self), "%d", (int)gettid());
	cr_assert(task_cpus(self, process_cpus, sizeof(process_cpus)));
	for (int over = 0; over < 2; over++) {
		struct forward_config cfg = {.source = FORWARD_SOURCE_ALL_RESIDENT,
		                             .max_tokens = 2};
		struct forward_engine *e;
		cr_assert_eq(forward_create(&e, m.cat, &cfg, &ferr), 0, "%s", ferr.msg);
		struct forward_topology_info ti;
		forward_topology(e, &ti);
		const uint32_t pus = ti.threads[0]; /* the default: one worker per PU */
		forward_destroy(e);
		if (ti.n_nodes != 1)
			cr_skip_test("a one-node machine is needed (%u nodes here)", ti.n_nodes);
		cfg.threads_per_node = over ? pus + 1 : pus;
		cr_assert_eq(forward_create(&e, m.cat, &cfg, &ferr), 0, "%s", ferr.msg);
		forward_topology(e, &ti);
		cr_assert_eq(ti.pinned_per_pu[0], !over, "%u workers on %u PUs", ti.threads[0],
		             pus);
		struct fwd_req r;
		fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, 0), 2, 4, 0, MOEK_ACT_F32, 3, false);
		struct forward_result res;
		cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_OK, "%s", res.message);
		const int workers = check_worker_cpus(!over, process_cpus);
		cr_assert_eq(workers, (int)ti.threads[0] - 1, "worker threads named moe-w0.N");
		fwd_req_free(&r);
		forward_destroy(e);
	}
	char self_after[64];
	cr_assert(task_cpus(self, self_after, sizeof(self_after)));
	cr_assert_str_eq(self_after, process_cpus, "the caller's affinity is left alone");
	fwd_model_free(&m);
}

/* --threads' default counts hardware threads (PUs), not cores: a node of 2 cores of 2 PUs
 * each gets 4 workers (a synthetic topology, so the machine's SMT does not matter). */
Test(forward_topology, threads_default_counts_hardware_threads)
{
	struct forward_config cfg = {.numa = FORWARD_NUMA_SYNTHETIC,
	                             .numa_synthetic = "pack:1 numa:1 core:2 pu:2"};
	struct forward_topology_info ti;
	cr_assert_eq(forward_topology_describe(&cfg, &ti, &ferr), 0, "%s", ferr.msg);
	cr_assert_eq(ti.n_nodes, 1);
	cr_expect_eq(ti.threads[0], 4, "workers %u for 2 cores of 2 PUs", ti.threads[0]);
}

/* taskset / CPUAffinity=: under an affinity of one CPU the default pool has one worker, and
 * with --threads 2 the second worker stays on that CPU (before, it was pinned to the node's
 * next CPU, outside the set). The lowest allowed CPU is kept: it is pus[0], which worker 0
 * (the caller) leaves free, so a worker pinned from the whole node lands elsewhere. */
Test(forward_topology, workers_stay_in_the_process_affinity)
{
	cpu_set_t all, one;
	cr_assert_eq(sched_getaffinity(0, sizeof(all), &all), 0);
	if (CPU_COUNT(&all) < 2)
		cr_skip_test("needs two CPUs to leave one out (%d here)", CPU_COUNT(&all));
	int cpu = 0;
	while (!CPU_ISSET(cpu, &all))
		cpu++;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	cr_assert_eq(sched_setaffinity(0, sizeof(one), &one), 0, "%s", strerror(errno));
	char want[16];
	snprintf(want, sizeof(want), "%d", cpu);

	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 2, 8, 64, 64);
	struct forward_config cfg = {.source = FORWARD_SOURCE_ALL_RESIDENT, .max_tokens = 2};
	struct forward_engine *e;
	cr_assert_eq(forward_create(&e, m.cat, &cfg, &ferr), 0, "%s", ferr.msg);
	struct forward_topology_info ti;
	forward_topology(e, &ti);
	forward_destroy(e);
	if (ti.n_nodes != 1)
		cr_skip_test("a one-node machine is needed (%u nodes here)", ti.n_nodes);
	cr_expect_eq(ti.pus[0], 1, "CPUs the process may use: %u, want 1", ti.pus[0]);
	cr_expect_eq(ti.threads[0], 1, "default workers: %u, want one per allowed CPU",
	             ti.threads[0]);

	cfg.threads_per_node = 2;
	cr_assert_eq(forward_create(&e, m.cat, &cfg, &ferr), 0, "%s", ferr.msg);
	forward_topology(e, &ti);
	cr_expect(!ti.pinned_per_pu[0], "two workers on one CPU are not pinned one per CPU");
	struct fwd_req r;
	fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, 0), 2, 4, 0, MOEK_ACT_F32, 3, false);
	struct forward_result res;
	cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_OK, "%s", res.message);
	cr_assert_eq(check_worker_cpus(false, want), 1, "one worker thread, moe-w0.1");
	fwd_req_free(&r);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* STATS percentiles come from log-linear buckets: every value lands in a bucket whose upper
 * bound is >= it and at most 12.5% (or 1 µs) above it, buckets are ordered, and values past the
 * range land in the last bucket. */
Test(forward_stats_hist, buckets_bound_each_value_within_one_eighth)
{
	unsigned prev = 0;
	for (uint64_t us = 0; us < (UINT64_C(1) << 27); us = us < 64 ? us + 1 : us + us / 37) {
		const unsigned b = lat_hist_bucket(us);
		cr_assert_lt(b, LAT_HIST_BUCKETS);
		cr_assert_geq(b, prev, "bucket of %llu went down", (unsigned long long)us);
		prev = b;
		const uint64_t up = lat_hist_upper(b);
		cr_assert_geq(up, us, "%llu above its bucket's bound %llu", (unsigned long long)us,
		              (unsigned long long)up);
		cr_assert_leq(up, us + us / 8 + 1, "bound %llu too far above %llu",
		              (unsigned long long)up, (unsigned long long)us);
		if (b > 0)
			cr_assert_lt(lat_hist_upper(b - 1), us, "%llu also fits bucket %u",
			             (unsigned long long)us, b - 1);
	}
	cr_assert_eq(lat_hist_bucket(UINT64_C(1) << 40), LAT_HIST_BUCKETS - 1);
	cr_assert_eq(lat_hist_bucket(7), 7);
	cr_assert_eq(lat_hist_upper(lat_hist_bucket(1000)), 1023);
}

/* The pool's item plan: groups of one token count are run whole as far as they share out
 * evenly, the remainder cut one chunk per worker; unequal token counts cut every group. */
Test(forward_pool, whole_groups_where_they_share_out_evenly)
{
	struct wave_group g[8];
	memset(g, 0, sizeof(g));
	for (int i = 0; i < 8; i++)
		g[i].call.n_tokens = 1;
	cr_assert_eq(pool_whole_groups(g, 8, 2), 8);
	cr_assert_eq(pool_whole_groups(g, 8, 3), 6);
	cr_assert_eq(pool_whole_groups(g, 7, 2), 6);
	cr_assert_eq(pool_whole_groups(g, 1, 2), 0, "one group, two workers: split");
	cr_assert_eq(pool_whole_groups(g, 3, 1), 3, "one worker runs everything whole");
	g[5].call.n_tokens = 4;
	cr_assert_eq(pool_whole_groups(g, 8, 2), 0, "unequal token counts: all split");
	cr_assert_eq(pool_whole_groups(g, 5, 2), 4, "the unequal group is not in this wave");
	cr_assert_eq(pool_whole_groups(g, 8, 1), 8);
}
