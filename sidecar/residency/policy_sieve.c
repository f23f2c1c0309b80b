/* policy_sieve.c — SIEVE (Zhang et al., "SIEVE is Simpler than LRU", NSDI'24) and
 * SIEVE+heat.
 *
 * SIEVE: new experts enter at the head of a FIFO queue with the visited bit clear; a hit only
 * sets the bit (no list move). To evict, the hand walks from where it stopped toward the head
 * (wrapping to the tail): a visited expert has its bit cleared and survives, the first
 * unvisited one is the victim, and the hand stays at its newer neighbour.
 *
 * SIEVE+heat: the hand also spares an unvisited expert whose heat (decayed average of router
 * scores, raised by lookahead hints) is at least heat_keep, halving the heat as it passes, so a hot
 * or hinted expert survives a pass or two more and every expert is eventually evictable.
 *
 * Experts the caller may not evict now (referenced, loading, needed by the current step) are
 * skipped without touching their state. The walk is bounded: after the bits and heats met on
 * the way are spent, a second pass finds a victim if any evictable expert exists. */
#include "policy_internal.h"

static uint32_t step_toward_head(const struct residency_policy *p, const struct policy_queue *q,
                                 uint32_t id)
{
	uint32_t n = p->prev[id];
	return n != POLICY_NONE ? n : q->tail;
}

static uint32_t sieve_victim(struct residency_policy *p, struct policy_queue *q, uint32_t n,
                             policy_can_evict_fn can, void *arg)
{
	const bool heat = p->spec.kind == POLICY_SIEVE_HEAT;
	const float keep = p->spec.heat_keep;
	uint32_t id = q->hand != POLICY_NONE ? q->hand : q->tail;
	/* Heat never exceeds POLICY_HEAT_MAX × keep (policy.c), so after at most 7 halvings per
	 * expert, one visited-bit pass and one final pass, a victim is found if one exists. */
	uint64_t limit = (uint64_t)n * (heat ? 9 : 2) + 1;
	for (uint64_t steps = 0; steps < limit; steps++, id = step_toward_head(p, q, id)) {
		if (can && !can(arg, id))
			continue;
		if (p->visited[id]) {
			p->visited[id] = 0;
			continue;
		}
		if (heat && policy_heat_now(p, id) >= keep) {
			policy_heat_halve(p, id);
			continue;
		}
		q->hand = id; /* policy_remove moves the hand on to the newer neighbour */
		return id;
	}
	return POLICY_NONE;
}

static uint32_t sieve_prefetch_victim(struct residency_policy *p, struct policy_queue *q,
                                      float priority, policy_can_evict_fn can, void *arg)
{
	const bool heat = p->spec.kind == POLICY_SIEVE_HEAT;
	uint32_t start = q->hand != POLICY_NONE ? q->hand : q->tail;
	uint32_t id = start;
	do {
		if ((!can || can(arg, id)) && !p->visited[id] &&
		    (!heat || policy_heat_now(p, id) < priority))
			return id;
		id = step_toward_head(p, q, id);
	} while (id != start);
	return POLICY_NONE;
}

const struct policy_algorithm policy_sieve_algorithm = {
    .victim = sieve_victim,
    .prefetch_victim = sieve_prefetch_victim,
};
