/* test_routing_heat.c — sidecar/serving/routing.c on its own: counts, the heat's decay against its
 * formula, stamps refreshed across 2^30-token clocks, and the JSON it writes for STATS.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "routing.h"

Test(routing, counts_and_heat_decay_by_the_layers_clock)
{
	struct routing *r = routing_create(2, 4, 2); /* half-life 2 tokens */
	cr_assert_not_null(r);
	cr_assert_eq(routing_half_life(r), 2);
	const int32_t a[] = {1, 3, 1, -1}; /* 2 tokens of k = 2 at layer 0 */
	routing_add(r, 0, 2, 2, a);
	routing_add(r, 1, 1, 2, a); /* layer 1's clock does not age layer 0 */
	const int32_t b[] = {3, -1};
	routing_add(r, 0, 1, 2, b); /* layer 0 clock 3: expert 1 aged 1 token */
	uint64_t counts[8];
	float heat[8];
	routing_read(r, counts, heat);
	const uint64_t want[8] = {0, 2, 0, 2, 0, 1, 0, 1};
	cr_assert_arr_eq(counts, want, sizeof(want));
	cr_assert_float_eq(heat[1], 2.0f * exp2f(-0.5f), 1e-6f);
	cr_assert_float_eq(heat[3], 1.0f * exp2f(-0.5f) + 1.0f, 1e-6f);
	cr_assert_float_eq(heat[5], 1.0f, 1e-6f);
	cr_assert_float_eq(heat[0], 0.0f, 1e-9f);
	routing_destroy(r);
}

/* A layer's clock passes 2^31 tokens: without refreshed stamps the 32-bit age would wrap
 * negative and the old heat would read as new. */
Test(routing, heat_survives_clocks_past_32_bits)
{
	struct routing *r = routing_create(1, 2, ROUTING_HALF_LIFE_MAX); /* 2^30 tokens */
	const int32_t id[] = {0};
	routing_add(r, 0, 1, 1, id);
	for (int i = 0; i < 6; i++)
		routing_add(r, 0, 1u << 29, 0, NULL); /* k = 0: the clock moves, nothing routed */
	float heat[2];
	routing_read(r, NULL, heat);
	cr_assert_float_eq(heat[0], 0.125f, 1e-4f, "3 half-lives later: %f", heat[0]);
	routing_destroy(r);
}

Test(routing, json_lists_every_layer_with_its_block)
{
	struct routing *r = routing_create(2, 3, 0);
	cr_assert_eq(routing_half_life(r), ROUTING_HALF_LIFE_DEFAULT);
	const int32_t a[] = {2};
	routing_add(r, 1, 1, 1, a);
	const uint32_t blocks[] = {3, 7};
	char buf[512];
	struct json_writer w;
	jw_init_buffer(&w, buf, sizeof(buf));
	jw_object_begin(&w);
	routing_write_json(r, blocks, &w);
	jw_object_end(&w);
	cr_assert_eq(jw_finish(&w), 0);
	const size_t n = jw_length(&w);
	cr_assert_str_eq(buf, "{\"experts\":[{\"layer\":3,\"tokens\":0,\"counts\":[0,0,0],"
	                      "\"heat\":[0.000,0.000,0.000]},{\"layer\":7,\"tokens\":1,"
	                      "\"counts\":[0,0,1],\"heat\":[0.000,0.000,1.000]}]}");
	cr_assert_leq(n - 2, routing_json_max(r), "the member within its bound");
	char tiny[8];
	jw_init_buffer(&w, tiny, sizeof(tiny));
	jw_object_begin(&w);
	routing_write_json(r, blocks, &w);
	jw_object_end(&w);
	cr_assert_eq(jw_finish(&w), -ENOBUFS, "truncation reported");
	cr_assert_eq(jw_length(&w), n, "the length it needs");
	routing_destroy(r);
}
