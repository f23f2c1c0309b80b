/* residency_internal.h — the state machine's own data (residency.c): the expert table, each
 * node's part (pool, layout, work queues, loader, I/O counters), the counters. Not a public
 * interface, and not the loader's: loader.c sees only its loader_config and loader_ops
 * (loader.h).
 *
 * Locking: `lock` guards entries[], every node's queues, the policy and the free list.
 * Counters are atomics, bumped without the lock (relaxed: they are statistics).
 */
#ifndef MOE_RESIDENCY_INTERNAL_H
#define MOE_RESIDENCY_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "fault_hook.h"
#include "loader.h"
#include "policy.h"
#include "residency.h"
#include "slot_pool.h"

struct expert_entry {
	uint8_t state;      /* enum expert_state */
	uint8_t masked;     /* on the GPU */
	uint8_t prefetched; /* loaded by a prefetch and not used since */
	uint8_t queued;     /* LOADING: bit n, in node n's loader queue, not yet picked up */
	uint8_t pending;    /* LOADING: bit n, node n's part of the load has not ended */
	uint8_t error_node; /* FAILED (or a node failed while LOADING): whose slice failed */
	uint32_t refs;      /* readers (RESIDENT only) */
	uint32_t waiters; /* demands sleeping on this LOADING expert: it stays until they hold it */
	uint32_t slot;    /* LOADING/RESIDENT */
	uint8_t post_load_failed; /* FAILED by the post-load hook: post_load_msg[id] says why */
	int error;             /* FAILED, or LOADING after a node's part failed: negative errno */
	uint32_t failed_loads; /* consecutive failed loads (0 after one that succeeded) */
	uint64_t retry_at_ns;  /* FAILED: a demand from then on reads again (monotonic) */
	uint32_t error_file;
	uint64_t error_offset;
	uint32_t error_attempts;
};

/* A bounded FIFO of expert ids (capacity = number of experts, so it never overflows:
 * an id is queued at most once per queue while `queued` is set... see residency.c). */
struct id_queue {
	uint32_t *ids;
	uint32_t cap, head, count;
};

/* The expert counters: RESIDENCY_COUNTERS' EXPERT ones (relaxed atomics) and LOCKED ones
 * (under struct residency's lock); the I/O counters are each node's loader's (struct
 * loader_stats). */
#define RESIDENCY_EXPERT_STAT(name, scope)                                                         \
	RESIDENCY_ONLY(EXPERT, scope, _Atomic uint64_t name;)                                      \
	RESIDENCY_ONLY(LOCKED, scope, uint64_t name;)
struct residency_stats {
	RESIDENCY_COUNTERS(RESIDENCY_EXPERT_STAT)
};

/* One node's part: its slices of every expert, in its pool, read by its loader. Slot s of
 * an expert is slot s of every node's pool (all pools have the same classes and counts, each
 * class's slots sized for its experts' slices on the node); the free lists are node 0's
 * pool's. */
struct node_part {
	const struct expert_map *map;
	int numa_node;
	void *post_load_arg;
	struct slot_pool pool;
	struct extent_layout *layout; /* [n_ids][EXPERT_MAX_EXTENTS] */
	struct id_queue demand, prefetch;
	struct loader_stats io;  /* this node's reads (the expert counters are r->stats) */
	uint64_t resident_bytes; /* extent bytes of the RESIDENT experts' slices */
	uint64_t budget;         /* the node's share of the budget */
	struct loader *loader;
};

struct residency {
	const struct expert_map *map; /* node 0's */
	struct residency_config config;
	uint32_t n_layers, n_experts, n_ids;
	uint32_t alignment; /* O_DIRECT alignment used for every file: ≥ 4096 */

	pthread_mutex_t lock;
	pthread_cond_t changed; /* an expert left LOADING, or a slot/reference was freed */
	struct expert_entry *entries;
	/* Slot size classes (slot_pool.h): an expert takes a slot of its class, and the class's
	 * policy picks its victims among the class's experts. One class unless the experts'
	 * slots differ in size (a llama.cpp mix): then one per distinct size. */
	uint32_t n_classes;
	uint8_t *class_of; /* [n_ids] */
	struct residency_policy policy[SLOT_MAX_CLASSES];
	uint32_t n_nodes;
	struct node_part node[RESIDENCY_MAX_NODES];
	uint32_t n_slots;      /* slots on every node, every class */
	uint32_t slot_waiters; /* demands waiting for an evictable slot */
	/* Warnings about failed loads [0] and their retries [1]: at most one of each per
	 * FAILURE_LOG_NS, with the count of those left out (atomics: logged without the lock). */
	_Atomic uint64_t failure_log_ns[2];
	_Atomic uint32_t failure_log_skipped[2];
	bool stopping;

	struct residency_stats stats; /* the expert counters (failed_now: experts FAILED, under the
	                                 lock); I/O is per node (node_part.io) */
	char (*post_load_msg)[RESIDENCY_POST_LOAD_MSG]; /* [n_ids] with a post-load hook */
	int *fds;                                       /* [n_files] */
	bool *buffered;                                 /* [n_files] O_DIRECT impossible */
};

static inline uint32_t residency_id(const struct residency *r, uint32_t layer, uint32_t expert)
{
	return layer * r->n_experts + expert;
}

/* The policy that orders expert id: its class's. */
static inline struct residency_policy *residency_policy_of(struct residency *r, uint32_t id)
{
	return &r->policy[r->class_of[id]];
}

static inline void stat_add(_Atomic uint64_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

#endif
