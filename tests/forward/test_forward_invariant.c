/* test_forward_invariant.c — forward_request.batch_invariant through the engine: a token's
 * output (every expert it names, summed in its own order) has the same bits alone on one node
 * and one thread as inside batches of 2, 7, 8, 9, 64 and 255 random tokens at a random
 * position, on 1 node with 2 threads, 2 synthetic NUMA nodes (each holding its rows of every
 * expert) with 1 and 2 threads each; GGUF rows in the decode layout and safetensors formats.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "forward.h"
#include "moe_abi.h"
#include "moe_kernels.h"

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

enum { K = 4, MAX_TOKENS = 255 };

static struct sidecar_error ferr;

static struct forward_engine *engine(const struct fwd_model *m, const char *synthetic,
                                     uint32_t threads)
{
	struct forward_config cfg = {
	    .source = FORWARD_SOURCE_ALL_RESIDENT,
	    .numa = synthetic ? FORWARD_NUMA_SYNTHETIC : FORWARD_NUMA_AUTO,
	    .numa_synthetic = synthetic,
	    .threads_per_node = threads,
	    .max_tokens = MAX_TOKENS,
	    .max_ids_per_token = K,
	};
	struct forward_engine *e;
	cr_assert_eq(forward_create(&e, m->cat, &cfg, &ferr), 0, "forward_create: %s", ferr.msg);
	return e;
}

static uint64_t next(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return *s >> 33;
}

static void check_model(const char *preset, uint32_t format, bool gguf)
{
	struct fwd_model m;
	char err[256];
	struct fwd_model_spec spec = {preset, format, gguf, 3, 16, 256, 512, false};
	cr_assert_eq(fwd_model_make(&m, &spec, err, sizeof(err)), 0, "%s", err);
	const size_t hidden = m.cat->info.hidden;
	const int32_t layer = fwd_moe_block(m.cat, 0);
	struct forward_engine *one = engine(&m, NULL, 1);
	struct fwd_req alone;
	fwd_req_make(&alone, m.cat, layer, 1, K, 0, MOEK_ACT_F32, 4242, false);
	alone.q.batch_invariant = true;
	struct forward_result res;
	cr_assert_eq(forward_run(one, &alone.q, alone.out, NULL, &res), MOE_OK, "%s", res.message);
	forward_destroy(one);

	static const struct {
		const char *nodes;
		uint32_t threads;
	} splits[] = {
	    {NULL, 2}, {"pack:1 numa:2 core:1 pu:1", 1}, {"pack:1 numa:2 core:2 pu:1", 2}};
	static const uint32_t full[] = {2, 7, 8, 9, 64, 255}, small[] = {2, 8, 9, 64};
	const uint32_t *batches = SANITIZED ? small : full;
	const size_t n_batches = SANITIZED ? 4 : 6;
	uint64_t seed = format;
	for (size_t si = 0; si < sizeof(splits) / sizeof(splits[0]); si++) {
		struct forward_engine *e = engine(&m, splits[si].nodes, splits[si].threads);
		for (size_t b = 0; b < n_batches; b++) {
			const uint32_t n = batches[b];
			struct fwd_req r;
			fwd_req_make(&r, m.cat, layer, n, K, 0, MOEK_ACT_F32, 100 * si + b, true);
			const uint32_t at = (uint32_t)(next(&seed) % n);
			memcpy((float *)r.x + (size_t)at * hidden, alone.x, hidden * sizeof(float));
			memcpy(r.ids + (size_t)at * K, alone.ids, K * sizeof(int32_t));
			memcpy(r.weights + (size_t)at * K, alone.weights, K * sizeof(float));
			r.q.batch_invariant = true;
			cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_OK, "%s",
			             res.message);
			const long d =
			    fwd_first_diff(r.out + (size_t)at * hidden, alone.out, hidden);
			cr_assert_eq(
			    d, -1,
			    "%s %s: token at %u of %u, %s x %u threads: element %ld differs "
			    "from the token alone",
			    preset, moek_format_lookup(format)->name, at, n,
			    splits[si].nodes ? "2 nodes" : "1 node", splits[si].threads, d);
			fwd_req_free(&r);
		}
		forward_destroy(e);
	}
	fwd_req_free(&alone);
	fwd_model_free(&m);
}

Test(forward_invariant, q4_K_decode_layout)
{
	check_model("qwen3-30b-a3b", MOEK_Q4_K, true);
}

Test(forward_invariant, q4_0_rows)
{
	check_model("qwen3-30b-a3b", MOEK_Q4_0, true);
}

Test(forward_invariant, bf16_decode_layout)
{
	check_model("qwen3-30b-a3b", MOEK_BF16, true);
}

Test(forward_invariant, mxfp4_gpt_oss)
{
	check_model("gpt-oss-20b", MOEK_MXFP4, false);
}

Test(forward_invariant, fp8_deepseek)
{
	check_model("deepseek-v3", MOEK_FP8_E4M3_B128, false);
}
