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
/* heat: the default half-life, in policy accesses, as a multiple of the capacity (the
 * simulator's sweep: 64 and more gain alike, 1 to 4 lose to sieve+layer; docs/residency.md). */
#define POLICY_HEAT_HALF_LIFE_CAPACITIES 256.0f

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

/* Heat decayed to the policy's clock. */
static inline float policy_heat_now(const struct residency_policy *p, uint32_t id)
{
	uint64_t age = p->now - p->heat_at[id];
	if (!age || p->heat[id] == 0)
		return p->heat[id];
	return p->heat[id] * exp2f(-(float)age / p->half_life);
}

/* Brings the stored heat to the policy's clock. */
static inline void policy_heat_settle(struct residency_policy *p, uint32_t id)
{
	p->heat[id] = policy_heat_now(p, id);
	p->heat_at[id] = p->now;
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
