/* loader.h — one NUMA node's expert loader: a thread (pinned to the node) owning an io_uring,
 * reading the node's slices of experts from the model files into the node's slots (loader.c).
 *
 * The loader knows no expert state machine. Its owner (residency.c) describes the node's part
 * in a `struct loader_config` and answers the loader through `struct loader_ops`: the loader
 * asks it for work and hands back each finished load. Dependencies run one way: residency.c
 * includes this header and calls loader_*; loader.c reaches its owner only through the ops.
 *
 * Threading: loader_start, loader_stop and loader_set_fault_hook belong to the owner's thread;
 * loader_wake may be called from any thread. take_work and drop_queued run on the loader
 * thread; load_done on the loader thread, or on the node's layout thread for a load with a
 * post-load hook (never twice at once for one load). They take the owner's lock themselves,
 * and no thread of the loader holds a lock across I/O. A third thread per node populates and
 * registers the pool's groups ahead of the loads (loader.c).
 * Errors: loader_start returns NULL and fills the record (util/error.h).
 */
#ifndef MOE_RESIDENCY_LOADER_H
#define MOE_RESIDENCY_LOADER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "expert_map.h"
#include "fault_hook.h"
#include "post_load.h"
#include "residency.h" /* RESIDENCY_COUNTERS: the NODE ones are struct loader_stats */
#include "slot_pool.h"

/* Where extent i of an expert lands in its slot: the aligned superset of the extent is
 * read at slot_offset; the data starts data_skip bytes into it. */
struct extent_layout {
	uint64_t slot_offset, read_offset, read_length, data_skip;
};

#define LOADER_LAT_BUCKETS 32 /* bucket b: read latency in [2^b, 2^(b+1)) µs; 0: < 2 µs */

/* The node's I/O counters, bumped by the loader with relaxed atomics (statistics):
 * RESIDENCY_COUNTERS' NODE ones (residency.h) and the read latencies. */
#define LOADER_NODE_STAT(name, scope) RESIDENCY_ONLY(NODE, scope, _Atomic uint64_t name;)
struct loader_stats {
	RESIDENCY_COUNTERS(LOADER_NODE_STAT)
	_Atomic uint64_t latency_us_log2[LOADER_LAT_BUCKETS];
};

/* One expert to load into its slot. */
struct loader_job {
	uint32_t id;           /* layer * n_experts + expert */
	uint32_t slot;         /* the slot it goes to (one load per slot at a time) */
	uint32_t failed_loads; /* the expert's failed loads in a row (told to the fault hook) */
	bool demand;           /* issued before every prefetch */
};

/* How the node's part of a load ended. */
struct loader_result {
	uint32_t id;
	int error;               /* 0: the slice is in its slot; else a negative errno */
	uint32_t file, attempts; /* error: the read that failed, and how often it was tried */
	uint64_t offset;
	const char *post_load_msg; /* the post-load hook failed with this message; else NULL */
};

struct loader_ops {
	/* Moves the work queued for `node` into jobs (at most max, demands first) and returns
	 * how many; -1 once the owner stops (the loader then cancels its reads and ends). */
	int (*take_work)(void *owner, uint32_t node, struct loader_job *jobs, uint32_t max);
	/* The node's part of res->id's load ended (on success its slot holds the slice). */
	void (*load_done)(void *owner, uint32_t node, const struct loader_result *res);
	/* When the loader ends: ends every load still queued for `node` with -ESHUTDOWN. */
	void (*drop_queued)(void *owner, uint32_t node);
};

struct loader_config {
	uint32_t node;      /* the owner's index of this part (ops, hook, residency_loaded) */
	int numa_node;      /* the pool's node (-1: none) */
	bool pin_to_node;   /* run the thread on numa_node's CPUs (several nodes) */
	uint32_t n_experts; /* id = layer * n_experts + expert */
	const struct expert_map *map;       /* this node's slices; outlives the loader */
	const struct extent_layout *layout; /* [ids][EXPERT_MAX_EXTENTS] */
	const struct slot_pool *pool;       /* this node's slots */
	const int *fds;                     /* [map->n_files] */
	const bool *buffered;               /* [map->n_files] opened without O_DIRECT */
	uint32_t alignment;                 /* O_DIRECT alignment of every file */
	uint32_t chunk_bytes, queue_depth, max_retries, read_timeout_ms;
	uint64_t fixed_buffer_max; /* residency_config's */
	bool no_register_buffers;
	bool pool_pages_auto;             /* residency_config's */
	residency_post_load_fn post_load; /* NULL: none */
	void *post_load_arg;
	loader_populate_fn populate_hook; /* tests only (fault_hook.h); NULL: none */
	void *populate_arg;
	struct loader_stats *io; /* the node's counters; outlive the loader */
	const struct loader_ops *ops;
	void *owner;
};

/* Sets up the ring (files and slots registered where the kernel allows, else plain reads:
 * logged) and starts the thread. The config is copied. NULL with err filled on failure. */
struct loader *loader_start(const struct loader_config *config, struct sidecar_error *err);
/* New work was queued: the loader asks take_work again. Any thread, without locks. */
void loader_wake(struct loader *l);
/* Joins the thread (which cancels its reads in flight once take_work answers -1, and ends
 * every load it held with -ESHUTDOWN through load_done), frees everything. NULL: nothing. */
void loader_stop(struct loader *l);
/* Tests only (fault_hook.h): before the first work is queued. */
void loader_set_fault_hook(struct loader *l, loader_fault_fn hook, void *arg);
bool loader_buffers_registered(const struct loader *l);
uint32_t loader_fixed_buffers(const struct loader *l);

#endif
