/* routing.h — what the engine routes to the CPU side: per-(layer, expert) token counts and an
 * exponentially decayed heat, for STATS, `stats --experts` and GPU expert placement.
 *
 * Owns: one count and one heat per (MoE layer, expert), and each MoE layer's token clock.
 * Layers here are MoE layer indices (0..n_moe_layers-1, as in residency), not blocks.
 *
 * Heat: every token routed to an expert adds 1; heat halves every half_life_tokens tokens
 * served at that layer (a clock per layer, so a layer the engine keeps on the GPU does not
 * cool the others). An expert picked with probability p per token settles at about
 * p · half_life / ln 2. The tokens of one FORWARD count as simultaneous. Stored lazily — the
 * heat at the expert's last use and that use's clock — and decayed when read; a layer's
 * stamps are refreshed every 2^30 tokens, so a stamp's age always fits in 31 bits.
 *
 * Threading: routing_add from one thread at a time (whichever executes FORWARDs: they are
 * serialised, forward_queue.c), without locks or allocation (relaxed atomic stores). Readers
 * (routing_read, routing_write_json) on any thread at any time: each value is consistent
 * on its own (one atomic word), not across experts.
 */
#ifndef MOE_SIDECAR_ROUTING_H
#define MOE_SIDECAR_ROUTING_H

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "json_writer.h"

#define ROUTING_HALF_LIFE_DEFAULT 1024u /* tokens of a layer */
#define ROUTING_HALF_LIFE_MAX (1u << 30)

/* Open so that routing_add, run per FORWARD on the executing thread, is inline beside it. */
struct routing {
	uint32_t n_layers, n_experts, half_life;
	_Atomic uint64_t *clock;  /* [n_layers]: tokens served at the layer */
	_Atomic uint64_t *counts; /* [n_layers * n_experts] */
	/* [n_layers * n_experts]: low 32 bits = the float heat at the last use, high 32 = the
	 * layer's clock then (its low 32 bits). One word, so a reader never sees a heat with
	 * another use's stamp. */
	_Atomic uint64_t *heat;
};

static inline uint64_t routing_heat_pack(float h, uint32_t stamp)
{
	uint32_t bits;
	memcpy(&bits, &h, sizeof(bits));
	return (uint64_t)stamp << 32 | bits;
}

/* The heat of a packed word at clock `now`. */
static inline float routing_heat_at(const struct routing *r, uint64_t packed, uint32_t now)
{
	uint32_t bits = (uint32_t)packed;
	float h;
	memcpy(&h, &bits, sizeof(h));
	/* A reader may see a use stamped after the clock it read: age 0 then. */
	const int32_t age = (int32_t)(now - (uint32_t)(packed >> 32));
	return age > 0 ? h * exp2f(-(float)age / (float)r->half_life) : h;
}

/* NULL on allocation failure (or a zero dimension). half_life_tokens 0: the default. */
struct routing *routing_create(uint32_t n_layers, uint32_t n_experts, uint32_t half_life_tokens);
void routing_destroy(struct routing *r);

uint32_t routing_half_life(const struct routing *r);

/* One FORWARD at MoE layer `layer`: n_tokens rows of k ids (-1 = skip; ids were validated:
 * each in range, at most once per row). */
static inline void routing_add(struct routing *r, uint32_t layer, uint32_t n_tokens, uint32_t k,
                               const int32_t *ids)
{
	if (layer >= r->n_layers)
		return;
	const uint64_t before = atomic_load_explicit(&r->clock[layer], memory_order_relaxed);
	const uint64_t after = before + n_tokens;
	const uint32_t now = (uint32_t)after;
	const size_t base = (size_t)layer * r->n_experts;
	if ((before >> 30) != (after >> 30)) /* re-stamp the layer: ages stay below 2^31 */
		for (uint32_t x = 0; x < r->n_experts; x++) {
			uint64_t p = atomic_load_explicit(&r->heat[base + x], memory_order_relaxed);
			atomic_store_explicit(&r->heat[base + x],
			                      routing_heat_pack(routing_heat_at(r, p, now), now),
			                      memory_order_relaxed);
		}
	atomic_store_explicit(&r->clock[layer], after, memory_order_relaxed);
	for (size_t i = 0; i < (size_t)n_tokens * k; i++) {
		const int32_t id = ids[i];
		if (id < 0 || (uint32_t)id >= r->n_experts)
			continue;
		_Atomic uint64_t *c = &r->counts[base + (uint32_t)id];
		atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
		                      memory_order_relaxed);
		_Atomic uint64_t *h = &r->heat[base + (uint32_t)id];
		const uint64_t p = atomic_load_explicit(h, memory_order_relaxed);
		atomic_store_explicit(h, routing_heat_pack(routing_heat_at(r, p, now) + 1.0f, now),
		                      memory_order_relaxed);
	}
}

/* Copies layer-major [n_layers][n_experts] counts and heat now (either may be NULL). */
void routing_read(const struct routing *r, uint64_t *counts, float *heat);

/* Writes the member `"experts":[{"layer":B,"tokens":T,"counts":[…],"heat":[…]},…]` into w's
 * open object, for every MoE layer (B from blocks[], the layer's transformer block), heat with
 * 3 decimals. */
void routing_write_json(const struct routing *r, const uint32_t *blocks, struct json_writer *w);

/* Bytes routing_write_json may need at most. */
size_t routing_json_max(const struct routing *r);

#endif
