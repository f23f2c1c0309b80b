/* slot_pool.c — see slot_pool.h. */
#include "slot_pool.h"

#include <assert.h>
#include <errno.h>
#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_2M (2u << 20)

/* Free 2 MiB pages in the huge-page pool (0 when none or unreadable). */
static uint64_t free_huge_pages(void)
{
	FILE *f = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
	if (!f)
		return 0;
	unsigned long long n = 0;
	if (fscanf(f, "%llu", &n) != 1)
		n = 0;
	fclose(f);
	return n;
}

int slot_pool_create(struct slot_pool *pool, int node, uint64_t budget, size_t slot_bytes,
                     struct sidecar_error *err)
{
	memset(pool, 0, sizeof(*pool));
	pool->node = -1;
	if (!slot_bytes || slot_bytes > ((size_t)1 << 40))
		return error_set(err, MOE_EINVAL, "slot pool: bad slot size %zu bytes", slot_bytes);
	slot_bytes = (slot_bytes + SLOT_ALIGN - 1) & ~(size_t)(SLOT_ALIGN - 1);
	uint64_t n = budget / slot_bytes;
	if (n == 0)
		return error_set(
		    err, MOE_EINVAL,
		    "slot pool: budget of %llu bytes holds no slot of %zu bytes (the largest "
		    "expert, aligned); the smallest budget that serves is %zu bytes",
		    (unsigned long long)budget, slot_bytes, slot_bytes);
	if (n >= SLOT_NONE)
		n = SLOT_NONE - 1;
	pool->slot_bytes = slot_bytes;
	pool->n_slots = (uint32_t)n;
	pool->budget = budget;
	size_t bytes = (size_t)n * slot_bytes;

	/* Huge-page pool first, when it can hold the whole region (rounded up to 2 MiB but still
	 * within the budget); else ordinary pages with a THP hint. */
	size_t huge_bytes = (bytes + HUGE_2M - 1) & ~(size_t)(HUGE_2M - 1);
	void *base = MAP_FAILED;
	if (huge_bytes <= budget && free_huge_pages() >= huge_bytes / HUGE_2M) {
		base = mmap(NULL, huge_bytes, PROT_READ | PROT_WRITE,
		            MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
		if (base != MAP_FAILED) {
			pool->hugetlb = true;
			bytes = huge_bytes;
		}
	}
	if (base == MAP_FAILED) {
		base =
		    mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (base == MAP_FAILED) {
			int e = errno;
			return error_set(err, e == ENOMEM ? MOE_ENOMEM : MOE_ESYS,
			                 "slot pool: mmap of %zu bytes (%u slots of %zu): %s",
			                 bytes, pool->n_slots, slot_bytes, strerror(e));
		}
		pool->thp_advised = madvise(base, bytes, MADV_HUGEPAGE) == 0;
	}
	pool->base = base;
	pool->map_bytes = bytes;
	/* Not inherited by a fork: a child has no use for the slots, and copying a mapping whose
	 * pages the loader pinned (registered buffers) splits the parent's huge-page mappings
	 * into 4 KiB ones for good, so a process that forks after creating a residency (a
	 * benchmark's children) would lose every huge page of its pool. */
	(void)madvise(base, bytes, MADV_DONTFORK);
	if (node >= 0 && numa_available() >= 0) {
		if (node > numa_max_node()) {
			error_set(err, MOE_EINVAL,
			          "slot pool: NUMA node %d does not exist (max %d)", node,
			          numa_max_node());
			slot_pool_destroy(pool);
			return -1;
		}
		numa_tonode_memory(base, bytes, node); /* mbind before first touch */
		pool->numa_bound = true;
		pool->node = node;
	}
	/* Pre-fault on the bound node so no load pays for page faults. */
#ifdef MADV_POPULATE_WRITE
	if (madvise(base, bytes, MADV_POPULATE_WRITE) != 0)
#endif
		memset(base, 0, bytes);

	pool->free_slots = malloc((size_t)pool->n_slots * sizeof(uint32_t));
	if (!pool->free_slots) {
		error_set(err, MOE_ENOMEM, "slot pool: out of memory for %u slot indices",
		          pool->n_slots);
		slot_pool_destroy(pool);
		return -1;
	}
	/* Slot 0 on top of the stack: tests and traces see a stable order. */
	for (uint32_t i = 0; i < pool->n_slots; i++)
		pool->free_slots[i] = pool->n_slots - 1 - i;
	pool->n_free = pool->n_slots;
	return 0;
}

void slot_pool_destroy(struct slot_pool *pool)
{
	if (pool->base && munmap(pool->base, pool->map_bytes) != 0)
		abort(); /* only a bad address could fail: memory corruption */
	free(pool->free_slots);
	memset(pool, 0, sizeof(*pool));
}

uint32_t slot_pool_get(struct slot_pool *pool)
{
	return pool->n_free ? pool->free_slots[--pool->n_free] : SLOT_NONE;
}

void slot_pool_put(struct slot_pool *pool, uint32_t slot)
{
	assert(slot < pool->n_slots && pool->n_free < pool->n_slots); /* no double put */
	pool->free_slots[pool->n_free++] = slot;
}
