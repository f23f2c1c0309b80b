/* residency.h — which experts are in memory on the NUMA nodes, and getting the others there.
 *
 * One `struct residency` serves every node: one expert table, one policy (one per slot size
 * class: experts of a mix of sizes take slots of their class, and the class's policy names
 * victims that free one; slot_pool.h) and one state machine, with a part per node — a slot pool
 * bound to the node, a loader thread (pinned to the node) owning that node's io_uring, a layout
 * thread running the post-load hook and a populate thread pre-faulting the pool (loader.c),
 * and that node's expert map, which holds only the node's slices of each expert (tensor-parallel
 * rows) when the caller splits experts over nodes. With one node (residency_create) the map holds
 * whole experts.
 *
 * An expert is resident when every node holds its slice: a load reads each node's slice on
 * that node's loader, into that node's slot (slot s is slot s on every node), and the expert
 * becomes RESIDENT once every node's reads (and post-load hook) are done; a failure on any
 * node makes the whole expert FAILED with that node's error. Eviction, pinning, prefetch and
 * the GPU mask act on the expert as a whole: no node ever holds a slice of an evicted expert.
 *
 * Expert states:  COLD → LOADING → RESIDENT → COLD (evicted), LOADING → FAILED.
 *  - RESIDENT experts carry a reader count; one with readers is never evicted.
 *  - Demands for a LOADING expert wait on the same I/O (no duplicate reads).
 *  - FAILED holds for a backoff: every demand within it gets the same error at once (no I/O
 *    storm on a bad disk); the first demand after it reads again. The backoff starts at
 *    retry_backoff_ms and doubles with each consecutive failed load of the expert, up to
 *    retry_backoff_max_ms; a load that succeeds ends the series. residency_retry_failed and
 *    residency_retry_all_failed end the backoff at once (operator, warm-up).
 *  - GPU-masked experts are never loaded nor counted; demanding one is an error (-EPERM).
 *  - Pinned layers (policy +pinN) are loaded by residency_warm_pinned and never evicted.
 *
 * Threading: every function may be called from any thread. One mutex guards the expert
 * table; it is never held across I/O or a syscall other than futex. The loader threads
 * submit and reap I/O without the lock and take it only to pick up work and publish
 * results (the layout threads: to publish); waiters sleep on a condition variable.
 * residency_create returns before the pools are populated: each node's populate thread
 * pre-faults its pool in groups ahead of the loads, and a load waits for its part.
 *
 * Errors: set-up calls (residency_open_file, residency_create, residency_warm_pinned) return
 * -1 and fill a `struct sidecar_error` (error.h) with a status and one line. The hot-path
 * calls (residency_acquire, prefetch, set_gpu_mask, ref_node, …) return a bare negative
 * errno — -EINPROGRESS, -EAGAIN, -EPERM, -EIO … — which is a status the caller acts on, not a
 * report: they take no error record and build no message; residency_error_message formats a
 * failed expert's error with its file, offset and retry count when the caller wants one.
 * Nothing here logs a failure it returns; the loaders warn (rate-limited) about failed loads,
 * which no call returns to anyone.
 */
#ifndef MOE_RESIDENCY_H
#define MOE_RESIDENCY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "expert_map.h"
#include "post_load.h" /* residency_post_load_fn: what a post-load hook sees */

enum expert_state { EXPERT_COLD = 0, EXPERT_LOADING, EXPERT_RESIDENT, EXPERT_FAILED };

struct residency_config {
	int numa_node; /* -1: do not bind (residency_create; residency_create_nodes: per node) */
	/* Bytes of slots on every node together. With several nodes it is split in proportion
	 * to each node's slot bytes (its slices), so every node has the same number of slots. */
	uint64_t mem_budget;
	const char *policy;       /* policy spec (policy.h); NULL: POLICY_DEFAULT_SPEC */
	uint32_t chunk_bytes;     /* reads are split into chunks of this size (default 1 MiB) */
	uint32_t queue_depth;     /* reads in flight (default 32) */
	uint32_t max_retries;     /* per read, for EIO/EAGAIN/timeouts (default 3) */
	uint32_t read_timeout_ms; /* per read (default 10000) */
	/* A FAILED expert is read again by the first demand after its backoff: retry_backoff_ms
	 * after one failed load (default 1000; RESIDENCY_NO_BACKOFF: at once), doubling per
	 * consecutive failure up to retry_backoff_max_ms (default 60000). */
	uint32_t retry_backoff_ms, retry_backoff_max_ms;
	bool no_register_buffers; /* force plain reads (tests, benchmarks) */
	/* Bytes of slots per registered (fixed) buffer, rounded down to whole slots (at least
	 * one); 0 or above 1 GiB: 1 GiB, the kernel's limit per buffer. A pool of many GiB is
	 * registered as several buffers; a smaller figure spreads a small pool over several
	 * (tests). */
	uint64_t fixed_buffer_max;
	bool no_direct; /* buffered reads, as asked (--no-direct, tests) */
	/* THP-advised pools populated with 4 KiB pages where those fault much faster
	 * (populate_pages, slot_pool.h; serve --pool-pages auto); false: huge pages throughout */
	bool pool_pages_auto;
	bool shareable_pool; /* the pool a memfd another process may map read-only (leases) */
	residency_post_load_fn post_load; /* NULL: the bytes are used as read */
	void *post_load_arg;              /* residency_create; residency_create_nodes: per node */
};

/* One NUMA node's part of a residency (residency_create_nodes). */
#define RESIDENCY_MAX_NODES 8u
struct residency_node {
	const struct expert_map
	    *map;            /* the node's slices of every expert: same files, layers and
	                        experts as every other node's map; outlives the residency */
	int numa_node;       /* -1: do not bind the pool nor pin the loader */
	void *post_load_arg; /* the post-load hook's argument on this node's loader */
};

/* A reader's hold on a resident expert: valid until residency_release. data[] are node 0's
 * extents (the whole expert with one node); residency_ref_node gives another node's. */
struct expert_ref {
	uint32_t layer, expert, slot;
	uint32_t n_extents;
	const uint8_t *data[EXPERT_MAX_EXTENTS]; /* extent i's bytes, in map order */
	uint64_t length[EXPERT_MAX_EXTENTS];
};

#define RESIDENCY_NO_BACKOFF UINT32_MAX /* retry_backoff_ms: every demand retries (tests) */

#define RESIDENCY_LAT_BUCKETS 32 /* bucket b: read latency in [2^b, 2^(b+1)) µs; 0: < 2 µs */

/* The residency's counters, listed once: X(name, scope). Each is a uint64_t of struct
 * residency_counters, carried whole into the engine's figures (forward_stats.residency and
 * each forward_node_stats.residency) and so to a row of sidecar/serving/stats_table.h. scope
 * EXPERT: one relaxed atomic for the whole residency (struct residency_stats), counted where
 * the expert table decides (residency.c); every node reports the same. LOCKED: a plain field
 * of struct residency_stats, kept under the residency's lock (residency.c), for a figure that
 * also goes down; every node reports the same. NODE: one relaxed atomic per node (struct
 * loader_stats), counted by that node's loader (loader.c); residency_counters sums them,
 * residency_node_counters gives the node's. A new one: its line here, its count, its row in
 * stats_table.h (docs/architecture.md, "Figures"). */
/* clang-format off */
#define RESIDENCY_COUNTERS(X)                                                                     \
	X(hits, EXPERT) X(cold_misses, EXPERT) X(inflight_misses, EXPERT)                         \
	X(prefetches, EXPERT) X(prefetch_hits, EXPERT) X(prefetch_wasted, EXPERT)                 \
	X(prefetch_dropped, EXPERT) X(evictions, EXPERT) X(loads, EXPERT) X(failures, EXPERT)     \
	X(failed_retries, EXPERT) /* loads started for an expert whose last load failed */        \
	X(buffered_files, EXPERT) /* files where O_DIRECT was impossible */                       \
	X(failed_now, LOCKED) /* experts FAILED now */                                            \
	X(reads, NODE) X(bytes_read, NODE) X(short_reads, NODE) X(retries, NODE)                  \
	X(timeouts, NODE)                                                                         \
	X(fixed_reads, NODE) X(plain_reads, NODE) /* read_fixed into registered slots vs plain */ \
	X(pool_groups, NODE) X(populated_groups, NODE) /* the pool's groups; pre-faulted so far */ \
	X(populate_ns, NODE) /* time spent pre-faulting and registering them */                 \
	X(populated_small_bytes, NODE) /* of them, with 4 KiB pages where THP was advised */     \
	X(layout_ns, NODE) /* time in the post-load hook (the decode layout), layout thread */   \
	X(busy_ns, NODE) /* time the loader had reads in flight */
/* clang-format on */
#define RESIDENCY_COUNTER_FIELD(name, scope) uint64_t name;
/* RESIDENCY_ONLY(want, scope, code): code when scope is want (EXPERT, LOCKED or NODE), else
 * nothing — for an X that acts on one scope's counters only. */
#define RESIDENCY_ONLY(want, scope, ...) RESIDENCY_ONLY_##want##_##scope(__VA_ARGS__)
#define RESIDENCY_ONLY_EXPERT_EXPERT(...) __VA_ARGS__
#define RESIDENCY_ONLY_EXPERT_LOCKED(...)
#define RESIDENCY_ONLY_EXPERT_NODE(...)
#define RESIDENCY_ONLY_LOCKED_EXPERT(...)
#define RESIDENCY_ONLY_LOCKED_LOCKED(...) __VA_ARGS__
#define RESIDENCY_ONLY_LOCKED_NODE(...)
#define RESIDENCY_ONLY_NODE_EXPERT(...)
#define RESIDENCY_ONLY_NODE_LOCKED(...)
#define RESIDENCY_ONLY_NODE_NODE(...) __VA_ARGS__

struct residency_counters {
	RESIDENCY_COUNTERS(RESIDENCY_COUNTER_FIELD)
	uint64_t latency_us_log2[RESIDENCY_LAT_BUCKETS];
	/* Slots hold one expert each (on every node: a slot per node, its slices); slots and
	 * slots_used count every size class's. slot_bytes: one expert's mean slot on every node
	 * together (residency_node_counters: the node's) — the pools' bytes over their slots,
	 * exact with one class (one format), so slots × slot_bytes is the pools' memory. */
	uint32_t slots, slots_used;
	uint64_t slot_bytes, budget_bytes;
	/* The file bytes of the RESIDENT experts (their extents; at most the map's whole size).
	 * Memory taken is about slots_used × slot_bytes (exact with one class): slots are sized
	 * for their class's largest expert and read each extent's aligned superset, so they hold
	 * more than these bytes. */
	uint64_t resident_bytes;
	uint32_t fixed_buffers; /* registered buffers the slots are spread over (0: none) */
	bool buffers_registered, hugetlb, thp;
};

struct residency;

/* How the loader opens a model file: with O_DIRECT, or buffered through the page cache where
 * the filesystem refuses it (EINVAL: tmpfs, some FUSE filesystems) or no_direct asks; and the
 * alignment its direct reads keep (statx DIOALIGN, at least 4096). */
struct residency_file {
	int fd;              /* the caller closes it */
	bool buffered;       /* opened without O_DIRECT */
	bool direct_refused; /* O_DIRECT was asked and the filesystem refused it */
	uint32_t alignment;  /* offsets, lengths and buffers of direct reads: a power of 2 */
	uint32_t dio_offset_align, dio_mem_align; /* statx's figures; 0: not reported */
};
/* 0 with out filled, or -1 with err ("x.gguf: cannot open: …", an alignment above 2 MiB or
 * not a power of 2). Logs nothing: the caller says what a refusal means to it. */
int residency_open_file(const char *path, bool no_direct, struct residency_file *out,
                        struct sidecar_error *err);

/* Opens the files (O_DIRECT, or buffered with a warning), sizes the slots (aligned superset
 * of each extent) per size class — one for a model of one format, sized for the largest
 * expert; one per expert size of a mix (Q4_K_M …), the budget split over them so that the
 * bytes of every expert's slot hold every expert — allocates the pool, starts the loader. The
 * map must outlive the residency. One node: config's numa_node and post_load_arg. 0, or -1
 * with err (MOE_EINVAL for a budget too small for the policy or the classes, naming the
 * smallest that serves). */
int residency_create(struct residency **out, const struct expert_map *map,
                     const struct residency_config *config, struct sidecar_error *err);
/* The same over n_nodes (1..RESIDENCY_MAX_NODES) nodes, each with its map of slices: a pool
 * per node (bound to its numa_node) with slots sized for its largest slice, and a loader per
 * node pinned to it. config->mem_budget is split over the nodes in proportion to their slot
 * bytes (logged); every node has the same size classes and slot counts. config's numa_node
 * and post_load_arg are not used. */
int residency_create_nodes(struct residency **out, const struct residency_node *nodes,
                           uint32_t n_nodes, const struct residency_config *config,
                           struct sidecar_error *err);
/* Stops the loader (cancelling reads in flight; waiters get -ESHUTDOWN), frees everything.
 * No reference may be held. */
void residency_destroy(struct residency *r);

/* Marks experts of `layer` as living on the GPU (mask[e] != 0): never loaded from now on;
 * unreferenced resident ones are evicted. 0, or -EINVAL (a status) for a layer out of range. */
int residency_set_gpu_mask(struct residency *r, uint32_t layer, const uint8_t *mask);

/* Loads every expert of the pinned layers and waits: 0, or -1 with the first failed expert's
 * message (residency_error_message) and its status in err. */
int residency_warm_pinned(struct residency *r, struct sidecar_error *err);

#define RESIDENCY_NOWAIT 1u /* return -EINPROGRESS / -EAGAIN instead of waiting */
#define RESIDENCY_RETRY 2u  /* follow-up to a NOWAIT call that was counted: not counted again */

/* Demands an expert. 0: `ref` holds it (release it). Otherwise: -EINPROGRESS (NOWAIT:
 * loading; call again with RESIDENCY_RETRY to wait), -EAGAIN (NOWAIT: no slot can be freed
 * now), -EIO, -ETIMEDOUT, -ENODATA and other read errors, -EPERM (GPU-masked), -EINVAL (out
 * of range), -ESHUTDOWN, -ENOSPC (no slot can ever be freed for it: nothing is referenced,
 * loading or awaited, yet nothing may be evicted). A waiting demand sleeps until a slot can
 * be freed: a thread that already holds references should use RESIDENCY_NOWAIT, or it may
 * wait forever once every slot is referenced (capacity must exceed the references held at
 * once). `score` is the router probability × top_k (1.0 = average), or -1. */
int residency_acquire(struct residency *r, uint32_t layer, uint32_t expert, float score,
                      unsigned flags, struct expert_ref *ref);
void residency_release(struct residency *r, struct expert_ref *ref);
/* Node `node`'s extents of the expert `ref` holds (ref itself for node 0), valid while ref
 * is held. -EINVAL when there is no such node. */
int residency_ref_node(const struct residency *r, const struct expert_ref *ref, uint32_t node,
                       struct expert_ref *out);

/* Starts loading experts likely needed soon, behind every demand read. Never evicts what the
 * policy values more than `priority` (same units as scores) and never waits. Returns how many
 * loads were started, or -EINVAL (a status) for a layer out of range. */
int residency_prefetch(struct residency *r, uint32_t layer, const uint32_t *experts, uint32_t n,
                       float priority);
/* Lookahead hint without loading: raises the experts' heat (sieve-heat). */
void residency_hint(struct residency *r, uint32_t layer, const uint32_t *experts, uint32_t n,
                    float score);

enum expert_state residency_state(struct residency *r, uint32_t layer, uint32_t expert);

/* ---- A layer's demand in one call (the request path) ------------------------------------ */

/* How a layer demand found an expert, set by the call that counted it (RESIDENCY_FOUND_*). */
enum residency_found {
	RESIDENCY_FOUND_NOT_YET = 0,
	RESIDENCY_FOUND_HIT,       /* resident */
	RESIDENCY_FOUND_IN_FLIGHT, /* being read for another demand or a prefetch */
	RESIDENCY_FOUND_COLD,      /* read for this demand */
};
/* One expert of a layer's demand, kept by the caller from the first demand to the release
 * (zeroed, with expert and pending set, before the first). It may be a member of a larger
 * record: the layer calls walk an array of those with a stride. */
struct residency_hold {
	uint32_t expert;
	float score;   /* the router's weights for it in this layer's tokens × top-k (heat:
	                  a use whatever it is, 0 included; sieve-heat: added) */
	bool pending;  /* still to be demanded: the layer demand skips the others */
	bool held;     /* ref holds the expert (residency_release_layer lets it go) */
	bool counted;  /* the demand was counted: follow-ups are RESIDENCY_RETRY */
	uint8_t found; /* enum residency_found, set by the call that counted the demand; the
	                  caller reads it and sets it back to NOT_YET */
	struct expert_ref ref;
};
/* One layer's demand without waiting, over holds[i] = (struct residency_hold *)((char *)first
 * + i * stride), i < n: each pending expert not yet held is demanded with RESIDENCY_NOWAIT
 * (RETRY once counted), those resident or loading first, then the cold ones — so a cold read
 * never evicts an expert the same layer is about to use. Those now held get held = true (the
 * caller clears pending once it has used them). *cursor (0 at first) is where the walk
 * stands: returns 0 at the end, or at the first failure its status (as residency_acquire:
 * -EPERM, -EIO, -ENOSPC, …) with holds[(*cursor - 1) % n] the expert that failed; calling
 * again resumes after it. A status, not an error: residency_error_message says why. */
int residency_demand_layer(struct residency *r, uint32_t layer, struct residency_hold *first,
                           size_t stride, uint32_t n, uint32_t *cursor);
/* Releases every held hold of holds[which[i]] (which NULL: holds[0, n)) under one lock;
 * held becomes false. */
void residency_release_layer(struct residency *r, struct residency_hold *first, size_t stride,
                             const uint32_t *which, uint32_t n);
/* True if every id of ids[0, n) in range (0 ≤ id < experts per layer; the peer's memory:
 * read once each) is RESIDENT in `layer`: one look under the lock for the whole layer. */
bool residency_layer_resident(struct residency *r, uint32_t layer, const int32_t *ids, size_t n);
/* FAILED → COLD, so the next demand reads again (its backoff ends; the count of failed loads
 * stays, so a new failure backs off longer). */
void residency_retry_failed(struct residency *r, uint32_t layer, uint32_t expert);
/* The same for every FAILED expert; returns how many there were. */
uint32_t residency_retry_all_failed(struct residency *r);
/* The backoff after `failed_loads` consecutive failed loads under `config`, in ms. */
uint64_t residency_backoff_ms(const struct residency_config *config, uint32_t failed_loads);
void residency_error_message(struct residency *r, uint32_t layer, uint32_t expert, char *buf,
                             size_t len);
/* The whole residency: expert counters (hits, misses, loads, evictions …: one per expert,
 * whatever the nodes), I/O counters summed over the nodes. */
void residency_counters(struct residency *r, struct residency_counters *out);
/* One node's part: the same expert counters, the node's reads, slot and budget bytes and its
 * resident slices' bytes. -1 when there is no such node. */
int residency_node_counters(struct residency *r, uint32_t node, struct residency_counters *out);
uint32_t residency_n_nodes(const struct residency *r);

/* Bytes of every node's slot pool resident in memory now (slot_pool_resident_bytes). */
uint64_t residency_pool_resident_bytes(const struct residency *r);
/* Node `node`'s shared pool (config.shareable_pool, any number of nodes): its memfd (the
 * residency's: dup it to keep it), its mapping here and its length. An expert_ref's data on
 * that node lie at data - *base in that memfd. 0, or -1 when private or no such node. */
int residency_shared_pool_node(const struct residency *r, uint32_t node, int *fd,
                               const uint8_t **base, uint64_t *bytes);

#endif
