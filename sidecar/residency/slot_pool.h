/* slot_pool.h — one NUMA node's expert slots: a single region allocated once at start-up,
 * cut into equal 4 KiB-aligned slots, never grown, never returned to the system until
 * destroy. The slot count is budget / slot size, so the pool cannot exceed its byte budget.
 *
 * Memory: MAP_HUGETLB when the huge-page pool has room for the whole region, otherwise
 * ordinary pages advised MADV_HUGEPAGE (transparent huge pages); bound to the node with
 * mbind (libnuma) when NUMA is available; pre-faulted so the first load never page-faults.
 * Registering the slots with io_uring (read_fixed) is the loader's job (loader.c).
 *
 * Threading: the free list is not locked; the owner (residency.c) calls get/put under its
 * lock. Addresses and sizes are immutable after create.
 * Errors: slot_pool_create returns 0, or -1 with the record (util/error.h).
 */
#ifndef MOE_RESIDENCY_SLOT_POOL_H
#define MOE_RESIDENCY_SLOT_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define SLOT_ALIGN 4096u
#define SLOT_NONE UINT32_MAX

struct slot_pool {
	int node;          /* NUMA node the memory is bound to (-1: not bound) */
	size_t slot_bytes; /* multiple of SLOT_ALIGN */
	uint32_t n_slots;
	uint64_t budget; /* bytes allowed; n_slots * slot_bytes <= budget */
	uint8_t *base;
	size_t map_bytes; /* the mapping's length (≥ n_slots * slot_bytes, ≤ budget) */
	bool hugetlb;     /* backed by the huge-page pool */
	bool thp_advised; /* MADV_HUGEPAGE accepted */
	bool numa_bound;
	uint32_t *free_slots; /* stack of free slot indices */
	uint32_t n_free;
};

/* Creates the pool: `budget` bytes on `node` (-1: wherever), slots of `slot_bytes` rounded up
 * to SLOT_ALIGN. Fails with a message if the budget holds no slot or the mapping fails. */
int slot_pool_create(struct slot_pool *pool, int node, uint64_t budget, size_t slot_bytes,
                     struct sidecar_error *err);
void slot_pool_destroy(struct slot_pool *pool);

static inline uint8_t *slot_pool_addr(const struct slot_pool *pool, uint32_t slot)
{
	return pool->base + (size_t)slot * pool->slot_bytes;
}

/* A free slot, or SLOT_NONE. */
uint32_t slot_pool_get(struct slot_pool *pool);
void slot_pool_put(struct slot_pool *pool, uint32_t slot);

#endif
