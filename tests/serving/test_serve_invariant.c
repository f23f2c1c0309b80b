/* test_serve_invariant.c — batch invariance over the channel: a client that asks for it at
 * connect (MOE_CONNECT_BATCH_INVARIANT) is granted it, STATS says so, and the same token gets
 * the same bits alone and inside batches of random tokens at random positions (two synthetic
 * NUMA nodes, two threads each); a sidecar started with --batch-invariant grants it to every
 * channel; a plain channel beside an invariant one is not.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "serve_fixture.h"

#define SYNTH_2NODES "synthetic:pack:1 numa:2 core:1 pu:1"

static struct moe_client *connect_invariant(struct served *s)
{
	struct moe_connect_opts o = {.socket_path = s->sp.socket,
	                             .max_tokens = 64,
	                             .n_slots = 2,
	                             .client_name = "test_invariant",
	                             .flags = MOE_CONNECT_BATCH_INVARIANT};
	struct moe_client *c = NULL;
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "connect: %s", moe_connect_error());
	return c;
}

/* Token 0 of `alone` alone, then at a random position of batches of random tokens: the
 * same output row, bit for bit, on the served model's first MoE layer. */
static void check_token(struct served *s, const char *what)
{
	const uint32_t hidden = ref_hidden(s->ref), n_experts = ref_n_experts(s->ref);
	const uint32_t k = ref_top_k(s->ref) < 4 ? ref_top_k(s->ref) : 4;
	struct fwd_case alone;
	fwd_case_make(&alone, 77, 0, 1, k, n_experts, hidden, false);
	float *want = malloc(hidden * sizeof(float));
	cr_assert_eq(served_forward(s, &alone, want, NULL), MOE_OK);
	static const uint32_t batches[] = {2, 8, 9, 33, 64};
	uint64_t r = 5;
	for (size_t b = 0; b < sizeof(batches) / sizeof(batches[0]); b++) {
		const uint32_t n = batches[b];
		struct fwd_case fc;
		fwd_case_make(&fc, 100 + b, 0, n, k, n_experts, hidden, true);
		const uint32_t at = (uint32_t)(test_rand(&r) % n);
		memcpy(fc.x + (size_t)at * hidden, alone.x, hidden * sizeof(float));
		memcpy(fc.ids + (size_t)at * k, alone.ids, k * sizeof(int32_t));
		memcpy(fc.weights + (size_t)at * k, alone.weights, k * sizeof(float));
		float *got = malloc((size_t)n * hidden * sizeof(float));
		cr_assert_eq(served_forward(s, &fc, got, NULL), MOE_OK);
		cr_assert_arr_eq(got + (size_t)at * hidden, want, hidden * sizeof(float),
		                 "%s: token at %u of %u differs from the token alone", what, at, n);
		free(got);
		fwd_case_free(&fc);
	}
	free(want);
	fwd_case_free(&alone);
}

static void check_format(const char *format)
{
	const char *extra[] = {"--numa", SYNTH_2NODES, "--threads", "2", NULL};
	struct served s;
	served_start(&s, format, extra);
	cr_assert_eq(moe_info(s.c)->batch_invariant, 0, "a plain channel is not invariant");
	struct moe_client *plain = s.c;
	s.c = connect_invariant(&s);
	cr_assert_eq(moe_info(s.c)->batch_invariant, 1, "%s: not granted", format);
	char *stats = served_stats(&s);
	cr_expect(strstr(stats, "\"batch_invariant\":{\"serve\":false,\"channel\":true,"
	                        "\"channels\":1}"),
	          "STATS: %s", stats);
	free(stats);
	check_token(&s, format);
	moe_close(plain);
	served_stop(&s);
}

Test(serve_invariant, bf16_asked_at_connect)
{
	check_format("bf16");
}

Test(serve_invariant, q4_0_asked_at_connect)
{
	check_format("q4_0");
}

Test(serve_invariant, every_channel_with_the_option)
{
	const char *extra[] = {"--batch-invariant", NULL};
	struct served s;
	served_start(&s, "q4_K", extra);
	cr_assert_eq(moe_info(s.c)->batch_invariant, 1, "--batch-invariant: not granted");
	char *stats = served_stats(&s);
	cr_expect(strstr(stats, "\"batch_invariant\":{\"serve\":true,\"channel\":true,"
	                        "\"channels\":1}"),
	          "STATS: %s", stats);
	free(stats);
	check_token(&s, "q4_K --batch-invariant");
	served_stop(&s);
}
