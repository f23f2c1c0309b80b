/* policy_internal.h — what policy.c shares with the per-algorithm files (policy_lru.c,
 * policy_sieve.c, policy_heat.c): the partition queue, the heat arithmetic, and the row each
 * algorithm file provides. Not a public interface.
 *
 * Dependencies run one way: policy.c dispatches through the algorithm rows; the algorithm
 * files call nothing in policy.c (what they share with it is inline here). */
#ifndef MOE_RESIDENCY_POLICY_INTERNAL_H
#define MOE_RESIDENCY_POLICY_INTERNAL_H

#include <math.h>

#include "policy.h"

/* Heat is clamped to this multiple of heat_keep, which bounds SIEVE+heat's hand walk. */
#define POLICY_HEAT_MAX 64.0f
/* heat: the default half-life, in visits of the expert's layer (tokens): the simulator's
 * sweep over 32..∞ on the presets and recorded traces (docs/residency.md, "The default
 * policy"): 64–256 read alike, 128 the least; ∞ (a plain count) and 32 read more. */
#define POLICY_HEAT_HALF_LIFE_TOKENS 128.0f

/* One partition's queue: a doubly-linked list of ids, head = newest, tail = oldest.
 * next[id] points toward the tail (older), prev[id] toward the head (newer). */
struct policy_queue {
	uint32_t head, tail;
	uint32_t hand; /* SIEVE's hand (POLICY_NONE: start at the tail) */
};

static inline uint32_t policy_partition(const struct residency_policy *p, uint32_t id)
{
	return p->spec.per_layer ? id / p->n_experts : 0;
}

/* The clock an expert's heat ages by: heat, its layer's visits (tokens); sieve-heat, the
 * policy's scored events. */
static inline uint64_t policy_clock(const struct residency_policy *p, uint32_t id)
{
	return p->spec.kind == POLICY_HEAT ? p->visits[id / p->n_experts] : p->now;
}

/* Heat decayed to the policy's clock. */
static inline float policy_heat_now(const struct residency_policy *p, uint32_t id)
{
	uint64_t age = policy_clock(p, id) - p->heat_at[id];
	if (!age || p->heat[id] == 0)
		return p->heat[id];
	return p->heat[id] * exp2f(-(float)age / p->half_life);
}

/* Brings the stored heat to the policy's clock. */
static inline void policy_heat_settle(struct residency_policy *p, uint32_t id)
{
	p->heat[id] = policy_heat_now(p, id);
	p->heat_at[id] = policy_clock(p, id);
}

/* Halves the heat (the SIEVE+heat hand sparing an expert). */
static inline void policy_heat_halve(struct residency_policy *p, uint32_t id)
{
	policy_heat_settle(p, id);
	p->heat[id] *= 0.5f;
}

/* One algorithm's victim search inside one partition's queue (never empty when called);
 * POLICY_NONE if none may go. victim: a demand's, where n is the experts the partition holds
 * (it bounds a walk); prefetch_victim: a prefetch's of this priority, changing no state. */
struct policy_algorithm {
	uint32_t (*victim)(struct residency_policy *p, struct policy_queue *q, uint32_t n,
	                   policy_can_evict_fn can, void *arg);
	uint32_t (*prefetch_victim)(struct residency_policy *p, struct policy_queue *q,
	                            float priority, policy_can_evict_fn can, void *arg);
};

extern const struct policy_algorithm policy_lru_algorithm;   /* policy_lru.c */
extern const struct policy_algorithm policy_sieve_algorithm; /* policy_sieve.c: both SIEVEs */
extern const struct policy_algorithm policy_heat_algorithm;  /* policy_heat.c */

#endif
