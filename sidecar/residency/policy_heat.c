/* policy_heat.c — heat: evict the coldest expert, where heat is the policy's exponentially
 * decayed sum of router scores (policy.c, update_heat) with a long half-life —
 * POLICY_HEAT_HALF_LIFE_CAPACITIES × the capacity, in policy accesses, unless the spec sets
 * one — so it ranks experts by how often and how strongly the router picked them lately
 * (frequency), where LRU and SIEVE rank by the last use (recency). Unlike sieve-heat's its
 * heat is not capped: the order among hot experts is kept. Ties go to the oldest in the
 * queue. A prefetch of priority p only takes an expert colder than p.
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
