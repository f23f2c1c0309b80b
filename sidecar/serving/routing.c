/* routing.c — per-(layer, expert) counts and decayed heat (contract in routing.h). */
#include "routing.h"

#include <stdlib.h>
#include <string.h>

struct routing *routing_create(uint32_t n_layers, uint32_t n_experts, uint32_t half_life_tokens)
{
	if (!n_layers || !n_experts)
		return NULL;
	struct routing *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	const size_t n = (size_t)n_layers * n_experts;
	r->n_layers = n_layers;
	r->n_experts = n_experts;
	r->half_life = half_life_tokens ? half_life_tokens : ROUTING_HALF_LIFE_DEFAULT;
	r->clock = calloc(n_layers, sizeof(*r->clock));
	r->counts = calloc(n, sizeof(*r->counts));
	r->heat = calloc(n, sizeof(*r->heat));
	if (!r->clock || !r->counts || !r->heat) {
		routing_destroy(r);
		return NULL;
	}
	return r;
}

void routing_destroy(struct routing *r)
{
	if (!r)
		return;
	free(r->clock);
	free(r->counts);
	free(r->heat);
	free(r);
}

uint32_t routing_half_life(const struct routing *r)
{
	return r->half_life;
}

void routing_read(const struct routing *r, uint64_t *counts, float *heat)
{
	for (uint32_t l = 0; l < r->n_layers; l++) {
		const uint32_t now =
		    (uint32_t)atomic_load_explicit(&r->clock[l], memory_order_relaxed);
		for (uint32_t x = 0; x < r->n_experts; x++) {
			const size_t i = (size_t)l * r->n_experts + x;
			if (counts)
				counts[i] =
				    atomic_load_explicit(&r->counts[i], memory_order_relaxed);
			if (heat)
				heat[i] = routing_heat_at(
				    r, atomic_load_explicit(&r->heat[i], memory_order_relaxed),
				    now);
		}
	}
}

size_t routing_json_max(const struct routing *r)
{
	/* per layer: the object's keys and three numbers; per expert: a count (≤ 20 digits)
	 * and a heat (≤ 16 characters with 3 decimals under the cap of 2^30 tokens), commas */
	return 32 + (size_t)r->n_layers * (96 + (size_t)r->n_experts * 40);
}

void routing_write_json(const struct routing *r, const uint32_t *blocks, struct json_writer *w)
{
	jw_key(w, "experts");
	jw_array_begin(w);
	for (uint32_t l = 0; l < r->n_layers; l++) {
		const uint64_t clock = atomic_load_explicit(&r->clock[l], memory_order_relaxed);
		jw_object_begin(w);
		jw_kv_u64(w, "layer", blocks[l]);
		jw_kv_u64(w, "tokens", clock);
		jw_key(w, "counts");
		jw_array_begin(w);
		const size_t base = (size_t)l * r->n_experts;
		for (uint32_t x = 0; x < r->n_experts; x++)
			jw_u64(w, atomic_load_explicit(&r->counts[base + x], memory_order_relaxed));
		jw_array_end(w);
		jw_key(w, "heat");
		jw_array_begin(w);
		for (uint32_t x = 0; x < r->n_experts; x++) {
			const float h = routing_heat_at(
			    r, atomic_load_explicit(&r->heat[base + x], memory_order_relaxed),
			    (uint32_t)clock);
			jw_double(w, (double)h, 3);
		}
		jw_array_end(w);
		jw_object_end(w);
	}
	jw_array_end(w);
}
