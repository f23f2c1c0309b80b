/* policy_lru.c — least-recently-used: the queue is kept in recency order (policy_access moves
 * an expert to the head), so the victim is the evictable expert nearest the tail. Prefetch
 * uses the same victim: what a prefetch brings is about to be used, which by LRU's own
 * ordering is worth more than the least recent expert. */
#include "policy_internal.h"

static uint32_t lru_victim(struct residency_policy *p, struct policy_queue *q,
                           policy_can_evict_fn can, void *arg)
{
	for (uint32_t id = q->tail; id != POLICY_NONE; id = p->prev[id])
		if (!can || can(arg, id))
			return id;
	return POLICY_NONE;
}

static uint32_t lru_demand_victim(struct residency_policy *p, struct policy_queue *q, uint32_t n,
                                  policy_can_evict_fn can, void *arg)
{
	(void)n;
	return lru_victim(p, q, can, arg);
}

static uint32_t lru_prefetch_victim(struct residency_policy *p, struct policy_queue *q,
                                    float priority, policy_can_evict_fn can, void *arg)
{
	(void)priority;
	return lru_victim(p, q, can, arg);
}

const struct policy_algorithm policy_lru_algorithm = {
    .victim = lru_demand_victim,
    .prefetch_victim = lru_prefetch_victim,
};
