/* slot_pool.c — see slot_pool.h. */
#include "slot_pool.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
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
	return slot_pool_create_one(pool, node, budget, slot_bytes, false, err);
}

int slot_pool_create_one(struct slot_pool *pool, int node, uint64_t budget, size_t slot_bytes,
                         bool shareable, struct sidecar_error *err)
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
	const uint32_t count = (uint32_t)n;
	return slot_pool_create_ex(pool, node, budget, &slot_bytes, &count, 1, shareable, err);
}

int slot_pool_create_classes(struct slot_pool *pool, int node, uint64_t budget,
                             const size_t *slot_bytes, const uint32_t *n_slots, uint32_t n_classes,
                             struct sidecar_error *err)
{
	return slot_pool_create_ex(pool, node, budget, slot_bytes, n_slots, n_classes, false, err);
}

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* A memfd of `bytes` (huge: MFD_HUGETLB) mapped MAP_SHARED, sealed so that no later mapping
 * can write; MAP_FAILED with *fd -1 when it cannot be made. */
static void *map_shared(size_t bytes, bool huge, int *fd)
{
	*fd = memfd_create("moe-slot-pool",
	                   MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0u));
	if (*fd < 0)
		return MAP_FAILED;
	void *base = MAP_FAILED;
	if (ftruncate(*fd, (off_t)bytes) == 0)
		base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (base != MAP_FAILED &&
	    fcntl(*fd, F_ADD_SEALS,
	          F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
		munmap(base, bytes);
		base = MAP_FAILED;
	}
	if (base == MAP_FAILED) {
		const int e = errno;
		close(*fd);
		*fd = -1;
		errno = e;
	}
	return base;
}

int slot_pool_create_ex(struct slot_pool *pool, int node, uint64_t budget, const size_t *slot_bytes,
                        const uint32_t *n_slots, uint32_t n_classes, bool shareable,
                        struct sidecar_error *err)
{
	memset(pool, 0, sizeof(*pool));
	pool->node = -1;
	pool->fd = -1;
	if (n_classes == 0 || n_classes > SLOT_MAX_CLASSES)
		return error_set(err, MOE_EINVAL, "slot pool: %u size classes (1 to %u)", n_classes,
		                 SLOT_MAX_CLASSES);
	size_t bytes = 0;
	uint64_t total = 0;
	for (uint32_t c = 0; c < n_classes; c++) {
		if (!slot_bytes[c] || slot_bytes[c] > ((size_t)1 << 40))
			return error_set(err, MOE_EINVAL, "slot pool: bad slot size %zu bytes",
			                 slot_bytes[c]);
		const size_t b = (slot_bytes[c] + SLOT_ALIGN - 1) & ~(size_t)(SLOT_ALIGN - 1);
		pool->classes[c] = (struct slot_class){.slot_bytes = b,
		                                       .n_slots = n_slots[c],
		                                       .first = (uint32_t)total,
		                                       .offset = bytes};
		bytes += (size_t)n_slots[c] * b;
		total += n_slots[c];
		if (b > pool->slot_bytes)
			pool->slot_bytes = b;
	}
	if (total == 0 || total >= SLOT_NONE || bytes > budget)
		return error_set(err, MOE_EINVAL,
		                 "slot pool: %llu slots of %zu bytes in all do not fit a budget of "
		                 "%llu bytes",
		                 (unsigned long long)total, bytes, (unsigned long long)budget);
	pool->n_classes = n_classes;
	pool->n_slots = (uint32_t)total;
	pool->budget = budget;
	pool->slots_bytes = bytes;

	/* Huge-page pool first, when it can hold the whole region (rounded up to 2 MiB but still
	 * within the budget); else ordinary pages with a THP hint. */
	size_t huge_bytes = (bytes + HUGE_2M - 1) & ~(size_t)(HUGE_2M - 1);
	void *base = MAP_FAILED;
	if (huge_bytes <= budget && free_huge_pages() >= huge_bytes / HUGE_2M) {
		base = shareable ? map_shared(huge_bytes, true, &pool->fd)
		                 : mmap(NULL, huge_bytes, PROT_READ | PROT_WRITE,
		                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
		if (base != MAP_FAILED) {
			pool->hugetlb = true;
			bytes = huge_bytes;
		}
	}
	if (base == MAP_FAILED) {
		base = shareable ? map_shared(bytes, false, &pool->fd)
		                 : mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (base == MAP_FAILED) {
			int e = errno;
			return error_set(err, e == ENOMEM ? MOE_ENOMEM : MOE_ESYS,
			                 "slot pool: %s of %zu bytes (%u slots, the largest of "
			                 "%zu): %s",
			                 shareable ? "shared memfd mapping" : "mmap", bytes,
			                 pool->n_slots, pool->slot_bytes, strerror(e));
		}
		pool->thp_advised = madvise(base, bytes, MADV_HUGEPAGE) == 0;
	}
	pool->base = base;
	pool->map_bytes = bytes;
	pool->shared = pool->fd >= 0;
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
	/* Not populated here: the loader's populate thread pre-faults the slots in groups
	 * (slot_pool_populate) while the first loads run. */
	pool->free_slots = malloc((size_t)pool->n_slots * sizeof(uint32_t));
	if (!pool->free_slots) {
		error_set(err, MOE_ENOMEM, "slot pool: out of memory for %u slot indices",
		          pool->n_slots);
		slot_pool_destroy(pool);
		return -1;
	}
	/* Each class's first slot on top of its stack: tests and traces see a stable order. */
	for (uint32_t c = 0; c < pool->n_classes; c++) {
		struct slot_class *k = &pool->classes[c];
		for (uint32_t i = 0; i < k->n_slots; i++)
			pool->free_slots[k->first + i] = k->first + k->n_slots - 1 - i;
		k->n_free = k->n_slots;
	}
	pool->n_free = pool->n_slots;
	return 0;
}

void slot_pool_populate(const struct slot_pool *pool, size_t offset, size_t bytes, bool huge)
{
	assert(offset % SLOT_ALIGN == 0 && offset + bytes <= pool->slots_bytes);
	uint8_t *p = pool->base + offset;
	if (pool->thp_advised && !pool->hugetlb) /* a hint: pages of either size serve */
		(void)madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#ifdef MADV_POPULATE_WRITE
	if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0)
		return;
#endif
	memset(p, 0, bytes); /* older kernels: touch it; no slot of the range is in use yet */
}

bool populate_pages_huge(const struct populate_pages *p)
{
	if (p->steps < 2)
		return p->steps == 0; /* each kind once: huge, then small */
	const bool huge = !(p->ns_per_byte[0] > 0 && p->ns_per_byte[1] > 0 &&
	                    p->ns_per_byte[1] >= POPULATE_SMALL_MARGIN * p->ns_per_byte[0]);
	return p->steps % POPULATE_PROBE_EVERY == POPULATE_PROBE_EVERY - 1 ? !huge : huge;
}

void populate_pages_note(struct populate_pages *p, bool huge, uint64_t bytes, uint64_t ns)
{
	if (bytes)
		p->ns_per_byte[huge] = (double)(ns ? ns : 1) / (double)bytes;
	p->steps++;
}

void slot_pool_destroy(struct slot_pool *pool)
{
	if (pool->base && munmap(pool->base, pool->map_bytes) != 0)
		abort(); /* only a bad address could fail: memory corruption */
	if (pool->shared)
		close(pool->fd);
	free(pool->free_slots);
	memset(pool, 0, sizeof(*pool));
	pool->fd = -1;
}

uint32_t slot_pool_get(struct slot_pool *pool, uint32_t c)
{
	assert(c < pool->n_classes);
	struct slot_class *k = &pool->classes[c];
	if (!k->n_free)
		return SLOT_NONE;
	pool->n_free--;
	return pool->free_slots[k->first + --k->n_free];
}

void slot_pool_put(struct slot_pool *pool, uint32_t slot)
{
	assert(slot < pool->n_slots);
	struct slot_class *k = &pool->classes[slot_pool_class_of(pool, slot) - pool->classes];
	assert(k->n_free < k->n_slots); /* no double put */
	pool->free_slots[k->first + k->n_free++] = slot;
	pool->n_free++;
}

uint64_t slot_pool_resident_bytes(const struct slot_pool *pool)
{
	enum { CHUNK = 4096 }; /* pages looked at per mincore call */
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	unsigned char vec[CHUNK];
	uint64_t resident = 0;
	if (!pool->base)
		return 0;
	for (size_t off = 0; off < pool->slots_bytes; off += (size_t)CHUNK * page) {
		const size_t len = pool->slots_bytes - off < (size_t)CHUNK * page
		                       ? pool->slots_bytes - off
		                       : (size_t)CHUNK * page;
		if (mincore(pool->base + off, len, vec) != 0)
			return resident;
		for (size_t i = 0; i < (len + page - 1) / page; i++)
			resident += vec[i] & 1u;
	}
	return resident * page < pool->slots_bytes ? resident * page : pool->slots_bytes;
}
