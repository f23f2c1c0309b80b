/* test_forward.c — the forward engine against its reference and against float math:
 * every format, 1 and many tokens, the three weights sources, deferral, bad requests, a
 * budget of 10%, an injected I/O failure, masks, prefetch and stats. Multi-threaded and
 * multi-node (synthetic) runs are in forward_threads.c (a plain program, so TSan can run it). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "moe_status.h"

static struct forward_engine *engine(const struct fwd_model *m, enum forward_source src,
                                     uint64_t budget, uint32_t max_tokens)
{
	struct forward_config cfg = {
	    .source = src,
	    .mem_budget = budget,
	    .threads_per_node = 1,
	    .max_tokens = max_tokens,
	    .chunk_bytes = 64 * 1024,
	};
	struct forward_engine *e;
	char err[256];
	cr_assert_eq(forward_create(&e, m->cat, &cfg, err, sizeof(err)), 0, "forward_create: %s",
	             err);
	return e;
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
	struct fwd_model_spec spec = {preset, format, gguf, 2, 8, 256, 256, fused};
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
Test(forward_formats, gguf_q6_k_fused_gate_up)
{
	format_case("qwen3-30b-a3b", MOEK_Q6_K, true, true);
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
