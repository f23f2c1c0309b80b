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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "json_writer.h"

#define ROUTING_HALF_LIFE_DEFAULT 1024u /* tokens of a layer */
#define ROUTING_HALF_LIFE_MAX (1u << 30)

struct routing;

/* NULL on allocation failure (or a zero dimension). half_life_tokens 0: the default. */
struct routing *routing_create(uint32_t n_layers, uint32_t n_experts, uint32_t half_life_tokens);
void routing_destroy(struct routing *r);

uint32_t routing_half_life(const struct routing *r);

/* One FORWARD at MoE layer `layer`: n_tokens rows of k ids (-1 = skip; ids were validated:
 * each in range, at most once per row). */
void routing_add(struct routing *r, uint32_t layer, uint32_t n_tokens, uint32_t k,
                 const int32_t *ids);

/* Copies layer-major [n_layers][n_experts] counts and heat now (either may be NULL). */
void routing_read(const struct routing *r, uint64_t *counts, float *heat);

/* Writes the member `"experts":[{"layer":B,"tokens":T,"counts":[…],"heat":[…]},…]` into w's
 * open object, for every MoE layer (B from blocks[], the layer's transformer block), heat with
 * 3 decimals. */
void routing_write_json(const struct routing *r, const uint32_t *blocks, struct json_writer *w);

/* Bytes routing_write_json may need at most. */
size_t routing_json_max(const struct routing *r);

#endif
