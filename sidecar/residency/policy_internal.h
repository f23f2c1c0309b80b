/* policy_internal.h — what policy.c shares with the per-algorithm files (policy_lru.c,
 * policy_sieve.c, policy_heat.c): the partition queue and its list operations. Not a public
 * interface. */
#ifndef MOE_RESIDENCY_POLICY_INTERNAL_H
#define MOE_RESIDENCY_POLICY_INTERNAL_H

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

/* Heat decayed to the policy's clock; and halving it (the SIEVE+heat hand sparing). */
float policy_heat_now(const struct residency_policy *p, uint32_t id);
void policy_heat_halve(struct residency_policy *p, uint32_t id);

void policy_queue_push_head(struct residency_policy *p, struct policy_queue *q, uint32_t id);
void policy_queue_unlink(struct residency_policy *p, struct policy_queue *q, uint32_t id);

/* Per-algorithm victim search inside one partition; POLICY_NONE if none may go. */
uint32_t lru_victim(struct residency_policy *p, struct policy_queue *q, policy_can_evict_fn can,
                    void *arg);
uint32_t sieve_victim(struct residency_policy *p, struct policy_queue *q, uint32_t n,
                      policy_can_evict_fn can, void *arg);
uint32_t heat_victim(struct residency_policy *p, struct policy_queue *q, float below,
                     policy_can_evict_fn can, void *arg);
uint32_t sieve_prefetch_victim(struct residency_policy *p, struct policy_queue *q, float priority,
                               policy_can_evict_fn can, void *arg);

#endif
