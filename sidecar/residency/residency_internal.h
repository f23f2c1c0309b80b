/* residency_internal.h — what residency.c (the state machine) and loader.c (the io_uring
 * threads, one per node) share: the expert table, each node's part (pool, layout, work
 * queues, I/O counters), the counters. Not a public interface.
 *
 * Locking: `lock` guards entries[], every node's queues, the policy and the free list.
 * Counters are atomics, bumped without the lock (relaxed: they are statistics).
 */
#ifndef MOE_RESIDENCY_INTERNAL_H
#define MOE_RESIDENCY_INTERNAL_H

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>

#include "fault_hook.h"
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

/* Where extent i of an expert lands in its slot: the aligned superset of the extent is
 * read at slot_offset; the data starts data_skip bytes into it. */
struct extent_layout {
	uint64_t slot_offset, read_offset, read_length, data_skip;
};

/* A bounded FIFO of expert ids (capacity = number of experts, so it never overflows:
 * an id is queued at most once per queue while `queued` is set... see residency.c). */
struct id_queue {
	uint32_t *ids;
	uint32_t cap, head, count;
};

struct residency_stats {
	_Atomic uint64_t hits, cold_misses, inflight_misses;
	_Atomic uint64_t prefetches, prefetch_hits, prefetch_wasted, prefetch_dropped;
	_Atomic uint64_t evictions, loads, failures, failed_retries;
	_Atomic uint64_t reads, bytes_read, short_reads, retries, timeouts;
	_Atomic uint64_t fixed_reads, plain_reads, buffered_files;
	_Atomic uint64_t latency_us_log2[RESIDENCY_LAT_BUCKETS];
};

struct loader; /* loader.c */

/* One node's part: its slices of every expert, in its pool, read by its loader. Slot s of
 * an expert is slot s of every node's pool (all pools have the same count); the free list
 * is node 0's pool's. */
struct node_part {
	const struct expert_map *map;
	int numa_node;
	void *post_load_arg;
	struct slot_pool pool;
	struct extent_layout *layout; /* [n_ids][EXPERT_MAX_EXTENTS] */
	struct id_queue demand, prefetch;
	struct residency_stats io; /* this node's reads (the expert counters are r->stats) */
	uint64_t resident_bytes;   /* extent bytes of the RESIDENT experts' slices */
	uint64_t budget;           /* the node's share of the budget */
	struct loader *loader;
};

struct residency {
	const struct expert_map *map; /* node 0's */
	struct residency_config config;
	loader_fault_fn fault_hook; /* tests only (fault_hook.h) */
	void *fault_arg;
	uint32_t n_layers, n_experts, n_ids;
	uint32_t alignment; /* O_DIRECT alignment used for every file: ≥ 4096 */

	pthread_mutex_t lock;
	pthread_cond_t changed; /* an expert left LOADING, or a slot/reference was freed */
	struct expert_entry *entries;
	struct residency_policy policy;
	uint32_t n_nodes;
	struct node_part node[RESIDENCY_MAX_NODES];
	uint32_t n_slots;      /* slots on every node */
	uint32_t slot_waiters; /* demands waiting for an evictable slot */
	uint32_t failed_now;   /* experts FAILED */
	/* Warnings about failed loads [0] and their retries [1]: at most one of each per
	 * FAILURE_LOG_NS, with the count of those left out (atomics: logged without the lock). */
	_Atomic uint64_t failure_log_ns[2];
	_Atomic uint32_t failure_log_skipped[2];
	bool stopping;

	struct residency_stats stats; /* the expert counters; I/O is per node (node_part.io) */
	char (*post_load_msg)[RESIDENCY_POST_LOAD_MSG]; /* [n_ids] with a post-load hook */
	int *fds;                                       /* [n_files] */
	bool *buffered;                                 /* [n_files] O_DIRECT impossible */
};

static inline uint32_t residency_id(const struct residency *r, uint32_t layer, uint32_t expert)
{
	return layer * r->n_experts + expert;
}

static inline void stat_add(_Atomic uint64_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* Queues (under lock). */
void id_queue_push(struct id_queue *q, uint32_t id);
bool id_queue_pop(struct id_queue *q, uint32_t *id);

/* Called by node's loader under the lock when its part of an expert's load ends (error 0:
 * its slice is in its slot). post_load_msg (NULL for read errors): the post-load hook failed
 * with this message. When every node's part has ended the expert becomes RESIDENT, or FAILED
 * with the first node's error; returns that error when this call made it FAILED (the caller
 * warns), else 0. */
int residency_load_done(struct residency *r, uint32_t node, uint32_t id, int error, uint32_t file,
                        uint64_t offset, uint32_t attempts, const char *post_load_msg);

/* After the lock is dropped: a warning (rate-limited) that (layer, expert)'s load failed and
 * when it will be read again (retry = false), or that it is being read again (retry = true);
 * failed_loads: the expert's failures in a row, as taken under the lock. */
void residency_warn_failure(struct residency *r, uint32_t id, bool retry, uint32_t failed_loads);

/* loader.c: one loader per node */
int loader_start(struct residency *r, uint32_t node, struct sidecar_error *err);
void loader_wake(struct residency *r); /* new work queued for every node (without the lock) */
void loader_stop(struct residency *r, uint32_t node); /* cancel reads in flight, join */
bool loader_buffers_registered(const struct residency *r, uint32_t node);
uint32_t loader_fixed_buffers(const struct residency *r, uint32_t node);

#endif
