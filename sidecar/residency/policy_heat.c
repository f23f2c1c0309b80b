/* policy_heat.c — heat: evict the expert its layer used least lately, where heat is a count
 * of the expert's uses decayed over its layer's visits (policy.c, update_heat) with a
 * half-life of POLICY_HEAT_HALF_LIFE_TOKENS of them unless the spec sets one — an estimate
 * of how often the layer needs it (frequency), where LRU and SIEVE rank by the last use
 * (recency). A use counts 1 whatever its router score: a miss reads the same bytes either
 * way. The heat is kept for experts that left (a returning expert brings its count), and is
 * not capped. Ties go to the oldest in the queue. A prefetch of priority p only takes an
 * expert colder than p (p = 1: a decayed count below one use, a rate below about one use
 * in half_life / ln 2 of its layer's tokens).
 *
 * The victim search scans the partition (a layer's share with +layer): O(experts held), under
 * the residency lock, once per admission that evicts. */
#include "policy_internal.h"

/* The coldest evictable expert below `below`, the oldest of equals. */
static uint32_t heat_victim(struct residency_policy *p, struct policy_queue *q, float below,
                            policy_can_evict_fn can, void *arg)
{
	uint32_t best = POLICY_NONE;
	float best_heat = below;
	for (uint32_t id = q->tail; id != POLICY_NONE; id = p->prev[id]) {
		if (can && !can(arg, id))
			continue;
		const float h = policy_heat_now(p, id);
		if (h < best_heat) {
			best = id;
			best_heat = h;
		}
	}
	return best;
}

static uint32_t heat_demand_victim(struct residency_policy *p, struct policy_queue *q, uint32_t n,
                                   policy_can_evict_fn can, void *arg)
{
	(void)n;
	return heat_victim(p, q, INFINITY, can, arg);
}

const struct policy_algorithm policy_heat_algorithm = {
    .victim = heat_demand_victim,
    .prefetch_victim = heat_victim, /* only an expert colder than the priority */
};
