/* slot_pool.h — one NUMA node's expert slots: a single region allocated once at start-up,
 * cut into 4 KiB-aligned slots, never grown, never returned to the system until destroy.
 *
 * Size classes: the region holds one run of equal slots per class (a model of one format has
 * one class; a llama.cpp mix such as Q4_K_M has two or three, one per distinct expert size).
 * Slots are numbered across the classes: class c holds slots [first, first + n_slots), and a
 * slot is taken from (and given back to) its class's free list. The slots of every class
 * together never exceed the byte budget.
 *
 * Memory: MAP_HUGETLB when the huge-page pool has room for the whole region, otherwise
 * ordinary pages advised MADV_HUGEPAGE (transparent huge pages); bound to the node with
 * mbind (libnuma) when NUMA is available. Not pre-faulted at create: the loader's populate
 * thread pre-faults it in groups of whole slots (slot_pool_populate) ahead of the loads, and
 * registers each group with io_uring (read_fixed) once populated (loader.c).
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
#define SLOT_MAX_CLASSES 8u

/* One size class: n_slots slots of slot_bytes at base + offset, numbered from `first`; its
 * free list is free_slots[first, first + n_free). */
struct slot_class {
	size_t slot_bytes; /* multiple of SLOT_ALIGN */
	uint32_t n_slots, first, n_free;
	size_t offset; /* bytes from the region's base */
};

struct slot_pool {
	int node;          /* NUMA node the memory is bound to (-1: not bound) */
	size_t slot_bytes; /* the largest class's */
	uint32_t n_slots;  /* every class's */
	uint64_t budget;   /* bytes allowed; the slots of every class together ≤ budget */
	uint8_t *base;
	size_t slots_bytes; /* Σ n_slots × slot_bytes over the classes */
	size_t map_bytes;   /* the mapping's length (≥ slots_bytes, ≤ budget) */
	bool hugetlb;       /* backed by the huge-page pool */
	bool thp_advised;   /* MADV_HUGEPAGE accepted */
	bool numa_bound;
	uint32_t n_classes;
	struct slot_class classes[SLOT_MAX_CLASSES];
	uint32_t *free_slots; /* each class's stack of free slot indices, at its `first` */
	uint32_t n_free;      /* every class's */
	/* Shareable pools (slot_pool_create_ex): the memfd the region maps (MAP_SHARED), sealed
	 * F_SEAL_FUTURE_WRITE so that every mapping made from it from now on — another
	 * process's, after SCM_RIGHTS — can only be read. shared: fd is the pool's (a zeroed
	 * pool has none). */
	int fd;
	bool shared;
};

/* Creates the pool: `budget` bytes on `node` (-1: wherever), as many slots of `slot_bytes`
 * (rounded up to SLOT_ALIGN) as it holds: one class. Fails with a message if the budget holds
 * no slot or the mapping fails. */
int slot_pool_create(struct slot_pool *pool, int node, uint64_t budget, size_t slot_bytes,
                     struct sidecar_error *err);
/* The same with n_classes (1..SLOT_MAX_CLASSES) classes: n_slots[c] slots of slot_bytes[c]
 * (rounded up to SLOT_ALIGN), which must fit in `budget` together. A class may have 0 slots. */
int slot_pool_create_classes(struct slot_pool *pool, int node, uint64_t budget,
                             const size_t *slot_bytes, const uint32_t *n_slots, uint32_t n_classes,
                             struct sidecar_error *err);
/* The same, shareable (expert leases): the region is a memfd ("moe-slot-pool", MFD_HUGETLB
 * when the huge-page pool holds it) mapped MAP_SHARED and sealed against shrinking, growing
 * and writes through any later mapping; pool->fd names it. Shared memory gets transparent huge
 * pages only where /sys/kernel/mm/transparent_hugepage/shmem_enabled allows (advise, always):
 * a private pool keeps them otherwise, which is why sharing is asked, not the default. */
int slot_pool_create_ex(struct slot_pool *pool, int node, uint64_t budget, const size_t *slot_bytes,
                        const uint32_t *n_slots, uint32_t n_classes, bool shareable,
                        struct sidecar_error *err);
int slot_pool_create_one(struct slot_pool *pool, int node, uint64_t budget, size_t slot_bytes,
                         bool shareable, struct sidecar_error *err);
void slot_pool_destroy(struct slot_pool *pool);

/* The class slot `slot` belongs to (a pool has few: a short walk). */
static inline const struct slot_class *slot_pool_class_of(const struct slot_pool *pool,
                                                          uint32_t slot)
{
	uint32_t c = 0;
	while (c + 1 < pool->n_classes && slot >= pool->classes[c + 1].first)
		c++;
	return &pool->classes[c];
}

static inline uint8_t *slot_pool_addr(const struct slot_pool *pool, uint32_t slot)
{
	const struct slot_class *c = slot_pool_class_of(pool, slot);
	return pool->base + c->offset + (size_t)(slot - c->first) * c->slot_bytes;
}

static inline size_t slot_pool_slot_bytes(const struct slot_pool *pool, uint32_t slot)
{
	return slot_pool_class_of(pool, slot)->slot_bytes;
}

/* Pre-faults [offset, offset + bytes) of the slots on the pool's node (MADV_POPULATE_WRITE;
 * where the kernel lacks it, zeroes the range: call it before any slot of the range is used).
 * huge: in a THP-advised pool (thp_advised, not hugetlb), the range is advised MADV_HUGEPAGE
 * before, else MADV_NOHUGEPAGE (4 KiB pages); elsewhere it changes nothing. Any thread; offset a
 * multiple of SLOT_ALIGN. */
void slot_pool_populate(const struct slot_pool *pool, size_t offset, size_t bytes, bool huge);

/* Which pages a THP-advised pool is populated with, step by step, from what each kind cost:
 * huge pages unless 4 KiB pages were measured POPULATE_SMALL_MARGIN times faster or more.
 * Where the hypervisor takes freed memory back (free page reporting), first-touching huge
 * pages ran 4-6x slower than 4 KiB ones on the VMs here (docs/residency.md, "Slot pool"),
 * while reads into 4 KiB pages run at ~0.7 of those into huge ones — hence the margin. The
 * first step is huge, the second small (each kind measured once), then every
 * POPULATE_PROBE_EVERY-th step takes the kind not chosen, to follow a rate that changes as
 * the memory left changes. Pure: the caller times the steps (tests feed it figures). */
#define POPULATE_SMALL_MARGIN 2.0
#define POPULATE_PROBE_EVERY 8u
struct populate_pages {
	double ns_per_byte[2]; /* the last step of each kind: [0] 4 KiB, [1] huge; 0 = none yet */
	uint32_t steps;        /* steps noted */
};
/* The kind for the next step: true = huge pages. */
bool populate_pages_huge(const struct populate_pages *p);
/* Notes a step of `bytes` populated with that kind in `ns`. */
void populate_pages_note(struct populate_pages *p, bool huge, uint64_t bytes, uint64_t ns);
/* Bytes of the pool's slots resident in memory now (mincore, page by page): what of it the
 * process's RSS holds. A page once resident stays so (the pool is never given back). */
uint64_t slot_pool_resident_bytes(const struct slot_pool *pool);

/* A free slot of class `c`, or SLOT_NONE. */
uint32_t slot_pool_get(struct slot_pool *pool, uint32_t c);
/* Gives `slot` back to its class. */
void slot_pool_put(struct slot_pool *pool, uint32_t slot);

#endif
