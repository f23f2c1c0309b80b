/* test_serve_bits.c — outputs through a real sidecar equal the in-process oracle bit for bit:
 * every weight format, 1 and many tokens, every input dtype, f32 and bf16 output, 1 NUMA node
 * and a synthetic 2-node topology (expert rows split across the nodes), 1 and 2 threads; and a
 * gpt-oss Hugging Face MXFP4 checkpoint (converted at load), also under a budget.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe_kernels.h"
#include "serve_fixture.h"

#define SYNTH_2NODES "synthetic:pack:1 numa:2 core:1 pu:1"

/* First differing element, or -1. */
static long first_diff(const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
			return (long)i;
	return -1;
}

static void check_requests(struct served *s, const char *what)
{
	const uint32_t hidden = ref_hidden(s->ref), n_experts = ref_n_experts(s->ref);
	const uint32_t k = ref_top_k(s->ref) < 4 ? ref_top_k(s->ref) : 4;
	static const uint32_t tokens[] = {1, 7, 33};
	static const uint8_t dtypes[][2] = {{MOE_DTYPE_F32, MOE_DTYPE_F32},
	                                    {MOE_DTYPE_BF16, MOE_DTYPE_F32},
	                                    {MOE_DTYPE_F16, MOE_DTYPE_BF16}};
	uint64_t seed = 1;
	for (int32_t layer = 0; layer < (int32_t)ref_n_layers(s->ref); layer++) {
		for (size_t ti = 0; ti < sizeof(tokens) / sizeof(tokens[0]); ti++) {
			const size_t d = (size_t)(layer + (int32_t)ti) % 3;
			struct fwd_case fc;
			fwd_case_make(&fc, seed++, layer, tokens[ti], k, n_experts, hidden, ti > 0);
			fc.in_dtype = dtypes[d][0];
			fc.out_dtype = dtypes[d][1];
			const size_t n = (size_t)fc.n_tokens * hidden;
			float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
			cr_assert(got && want);
			struct moe_completion done;
			int st = served_forward(s, &fc, got, &done);
			cr_assert_eq(st, MOE_OK, "%s layer %d tokens %u: %s", what, layer,
			             fc.n_tokens, moe_strerror(st));
			cr_assert_eq(ref_forward(s->ref, layer, fc.n_tokens, fc.k, 0, fc.x_wire,
			                         fc.in_dtype, fc.ids, fc.weights, NULL, want, NULL),
			             MOE_OK);
			if (fc.out_dtype !=
			    MOE_DTYPE_F32) { /* what the wire carries, back in f32 */
				void *tmp = malloc(n * sizeof(float));
				moek_convert(fc.out_dtype, tmp, MOEK_ACT_F32, want, n);
				moek_convert(MOEK_ACT_F32, want, fc.out_dtype, tmp, n);
				free(tmp);
			}
			long i = first_diff(got, want, n);
			cr_assert_eq(i, -1,
			             "%s layer %d tokens %u in %s out %s: element %ld is %a, the "
			             "reference says %a",
			             what, layer, fc.n_tokens, moe_dtype_name(fc.in_dtype),
			             moe_dtype_name(fc.out_dtype), i, i >= 0 ? got[i] : 0.0,
			             i >= 0 ? want[i] : 0.0);
			free(got);
			free(want);
			fwd_case_free(&fc);
		}
	}
}

static void run_format(const char *format)
{
	static const char *const configs[][5] = {
	    {"--threads", "1", NULL},
	    {"--threads", "2", "--numa", SYNTH_2NODES, NULL},
	};
	for (size_t c = 0; c < sizeof(configs) / sizeof(configs[0]); c++) {
		struct served s;
		served_start(&s, format, configs[c]);
		char what[96];
		snprintf(what, sizeof(what), "%s %s", format,
		         c ? "2 synthetic nodes x2" : "1 thread");
		check_requests(&s, what);
		served_stop(&s);
	}
}

Test(serve_bits, f32)
{
	run_format("f32");
}
Test(serve_bits, f16)
{
	run_format("f16");
}
Test(serve_bits, bf16)
{
	run_format("bf16");
}
Test(serve_bits, q8_0)
{
	run_format("q8_0");
}
Test(serve_bits, q4_0)
{
	run_format("q4_0");
}
Test(serve_bits, q4_k)
{
	run_format("q4_k");
}
Test(serve_bits, q5_k)
{
	run_format("q5_k");
}
Test(serve_bits, q6_k)
{
	run_format("q6_k");
}
Test(serve_bits, iq4_nl)
{
	run_format("iq4_nl");
}
Test(serve_bits, iq4_xs)
{
	run_format("iq4_xs");
}
Test(serve_bits, mxfp4)
{
	run_format("mxfp4");
}
Test(serve_bits, fp8)
{
	run_format("fp8");
}

/* gpt-oss as Hugging Face ships it (a directory: config.json and safetensors with MXFP4
 * _blocks/_scales, converted to GGUF blocks as each expert is loaded; the reference engine,
 * all-resident, converts at create): one node, two synthetic nodes (each converts its slices),
 * and a budget below the model (experts evicted and converted again on reload). */
Test(serve_bits, mxfp4_gpt_oss_hugging_face)
{
	static const char *const configs[][5] = {
	    {"--threads", "1", NULL},
	    {"--threads", "2", "--numa", SYNTH_2NODES, NULL},
	    {"--threads", "1", "--mem-budget", "30%", NULL},
	};
	static const char *const names[] = {"1 thread", "2 synthetic nodes x2", "30% budget"};
	for (size_t c = 0; c < sizeof(configs) / sizeof(configs[0]); c++) {
		struct served s;
		served_start_preset(&s, "gpt-oss-20b", "mxfp4", true, configs[c]);
		char what[96];
		snprintf(what, sizeof(what), "gpt-oss HF %s", names[c]);
		check_requests(&s, what);
		if (c == 2) { /* the budget really was below the model */
			char *stats = served_stats(&s);
			cr_assert_gt(json_top_u64(stats, "evictions"), 0, "%s: %s", what, stats);
			free(stats);
		}
		served_stop(&s);
	}
}

/* Several thread counts on one node, and a thread count that does not divide the rows. */
Test(serve_bits, thread_counts)
{
	static const char *const threads[] = {"2", "3"};
	for (size_t i = 0; i < 2; i++) {
		const char *extra[] = {"--threads", threads[i], NULL};
		struct served s;
		served_start(&s, "q4_k", extra);
		check_requests(&s, threads[i]);
		served_stop(&s);
	}
}
