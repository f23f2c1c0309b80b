/* forward.h — the in-process forward engine: one MoE layer for n tokens, computed by pinned
 * worker pools over weights that are resident, loaded on demand, or mmapped.
 *
 * Owns: NUMA topology (hwloc, real or synthetic), one worker pool per node, the weights
 * source (RESIDENCY: sidecar/residency/, ALL_RESIDENT: everything loaded at create, MMAP:
 * pointers into the model files' mapping — the page-cache baseline), the per-request
 * scheduler, per-client GPU masks, per-layer counters and latency histograms. The plain
 * single-threaded oracle every result is compared to (forward_reference) is test code:
 * tests/forward/oracle.h.
 *
 * Layers are transformer block indices (the wire's sqe.layer); dense blocks are rejected with
 * MOE_EBADLAYER. Expert ids are int32, -1 = skip that entry, each expert at most once per
 * token.
 *
 * Determinism contract: an output element's value depends only on the request (inputs, ids,
 * weights, k_defer) and the ISA, never on thread count, node count, source or the order in
 * which expert loads complete. Each (token, k) contribution is computed on its own, in one
 * kernel batch per expert holding every entry that names it (immediate and deferred alike, in
 * (token, position) order: the kernels' per-token bits depend on the batch), and a token's
 * contributions are summed in a fixed order:
 * by routing weight descending, ties by position k; immediate ones first, then — in the
 * separate deferred buffer — the deferred ones in the same order. `deferred_in` (what the
 * previous layer deferred) is added last.
 *
 * Deferral (kt-kernel): of each token's valid ids, the k_defer lowest-weighted (ties: the later
 * position) are deferred. Because the order above puts them last, for k_defer = 1
 * out_immediate + out_deferred equals the undeferred output bit for bit (f32); for k_defer > 1
 * they agree within float rounding of the re-association.
 *
 * Threading: forward_run serialises requests on the engine (one runs at a time, using every
 * worker of every node); call it from any thread; the calling thread participates as a
 * worker of node 0. It may wait for NVMe reads of cold experts, so a caller that must stay
 * responsive (the sidecar's dispatcher) calls it only when forward_would_run_now says no
 * read is needed, and otherwise hands the request to a thread of its own (the serving
 * layer's forward thread). With immediate_ready and settle_later, forward_run returns once
 * the immediate part is delivered and the deferred experts compute behind it (forward_request).
 * prefetch, masks and stats may be called from any thread at any time, concurrently with
 * forward_run.
 *
 * Shutdown: forward_run never waits forever: a cold read gives up after the loader's read
 * timeout and retries (RESIDENCY), so a forward thread finishes its current request in bounded
 * time; stop feeding it, join it, then forward_destroy.
 *
 * Allocation: everything is sized at create from max_tokens and max_ids_per_token;
 * forward_run allocates nothing and logs nothing per token. The locks prefetch, masks and stats
 * take are never held across I/O; requests themselves are serialised on the engine, so one
 * waiting for a cold expert (with nothing left to compute) delays the next request.
 */
#ifndef MOE_FORWARD_H
#define MOE_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "error.h"
#include "json_writer.h"
#include "residency.h"

enum forward_source {
	FORWARD_SOURCE_RESIDENCY = 0, /* slot pool under a budget; cold experts read on demand */
	FORWARD_SOURCE_ALL_RESIDENT,  /* every expert read at create (compute floor) */
	FORWARD_SOURCE_MMAP,          /* the model files mmapped; the page cache does residency */
};

enum forward_numa_mode {
	FORWARD_NUMA_AUTO = 0,  /* every NUMA node of this machine (hwloc) */
	FORWARD_NUMA_LIST,      /* the nodes in numa_list (OS indices) */
	FORWARD_NUMA_SYNTHETIC, /* hwloc synthetic topology numa_synthetic, e.g.
	                           "pack:1 numa:2 core:1 pu:1": threads are not pinned and memory
	                           binding to nodes that do not exist degrades to a logged no-op */
};

#define FORWARD_MAX_NODES 8u
#define FORWARD_MAX_CLIENTS 64u /* distinct client ids with their own GPU mask */

/* Warming progress: done/total experts (or bytes); called from the creating thread. */
typedef void (*forward_progress_fn)(void *arg, const char *what, uint64_t done, uint64_t total);

struct forward_config {
	enum forward_source source;
	/* RESIDENCY */
	uint64_t mem_budget; /* bytes of expert slots over all nodes; 0 = every expert fits */
	/* Bytes the engine may take for its request buffers and slot pools together (0: no
	 * limit). The request buffers are taken first; mem_budget 0 then means every expert if
	 * they fit, else what is left; a mem_budget that does not fit is refused. */
	uint64_t mem_limit;
	bool keep_budget;   /* mem_budget 0 was asked for: refuse rather than cut it to the limit */
	const char *policy; /* residency policy spec (policy.h); NULL: POLICY_DEFAULT_SPEC */
	uint32_t pin_layers;  /* first N MoE layers fully resident (appended as +pinN) */
	uint32_t chunk_bytes; /* loader read size; 0 = residency default */
	uint32_t queue_depth; /* loader reads in flight; 0 = residency default */
	bool no_direct;       /* buffered reads (tests, --no-direct) */
	bool pool_pages_auto; /* residency_config's (--pool-pages auto) */
	/* FAILED experts: backoff before a demand reads one again (residency_config's;
	 * 0 = defaults) */
	uint32_t retry_backoff_ms, retry_backoff_max_ms;
	bool lazy_load; /* mem_budget 0: skip the warm-up that loads every expert at create, so
	                   each is read on its first demand (tests of the demand path) */
	/* RESIDENCY and ALL_RESIDENT: serve the files' rows as they are instead of the decode
	 * layout (gate/up alternating, rows interleaved by 8: decode_layout.c) — the bits the
	 * MMAP source gives, which cannot rearrange a read-only mapping (tests compare them) */
	bool file_layout;
	/* RESIDENCY: the slot pool a memfd other processes may map read-only (expert leases,
	 * forward_lease_pool; slot_pool.h says what it costs) */
	bool shareable_pool;
	/* NUMA and threads */
	enum forward_numa_mode numa;
	uint32_t numa_list[FORWARD_MAX_NODES];
	uint32_t numa_list_len;
	const char *numa_synthetic;
	uint32_t threads_per_node; /* 0 = one per PU (hardware thread) the process may use */
	/* Request limits: size every preallocated buffer */
	uint32_t max_tokens;        /* tokens per forward_run (>= 1) */
	uint32_t max_ids_per_token; /* k (>= 1); 0 = the model's top_k */
	/* Warming: ALL_RESIDENT load and RESIDENCY pinned layers */
	forward_progress_fn progress;
	void *progress_arg;
};

struct forward_engine;

/* Checks the NUMA part of config (numa, numa_list, numa_synthetic, threads_per_node) against
 * this machine the way forward_create would, without a model: a start-up can refuse a bad
 * --numa before reading anything. 0, or -1 with err. */
int forward_check_topology(const struct forward_config *config, struct sidecar_error *err);

/* Creates the engine: topology, pools, weights source (loads everything for ALL_RESIDENT,
 * warms pinned layers for RESIDENCY — and every expert when mem_budget is 0, unless
 * lazy_load: an expert that fails to load there is logged and left to be read on demand —
 * maps the files for MMAP). The catalog must outlive it.
 * Returns 0, or -1 with err naming what was wrong (unsupported layout, budget below one
 * expert, hwloc failure …); -ENOSPC when the memory the engine may use (mem_limit) cannot
 * hold its request buffers and the slot pools asked for, or the pools it leaves hold no
 * slot. */
int forward_create(struct forward_engine **out, const struct moe_catalog *cat,
                   const struct forward_config *config, struct sidecar_error *err);
/* What forward_create would take for a RESIDENCY config (config->source), without creating
 * the engine: topology and weight maps are opened and closed, nothing is allocated for the
 * requests or the slots and no expert is read. The same rule as forward_create's: the request
 * buffers first, then the slots. 0 with out filled, or -1 with err — what forward_create
 * would refuse (a budget that does not fit the limit, no routed experts, a bad --numa). */
struct forward_budget {
	uint64_t request_bytes; /* the request plans' buffers */
	uint64_t every_bytes;   /* slot bytes that hold every expert, over all nodes */
	uint64_t budget_bytes;  /* bytes of slots the engine would get (every_bytes: all fit) */
	bool cut;               /* the limit cut an unset budget below every_bytes */
	unsigned n_workers;     /* the pools' workers, all nodes */
};
int forward_plan_budget(const struct moe_catalog *cat, const struct forward_config *config,
                        struct forward_budget *out, struct sidecar_error *err);
/* Joins the workers and frees everything. No forward_run may be in progress. */
void forward_destroy(struct forward_engine *e);

/* Topology actually used, for logs and tests. */
struct forward_topology_info {
	uint32_t n_nodes;
	uint32_t node_os_index[FORWARD_MAX_NODES];
	uint32_t threads[FORWARD_MAX_NODES];
	bool synthetic;
	bool memory_bound; /* false: binding was a no-op (1 node, synthetic, or refused) */
	bool pinned_per_pu[FORWARD_MAX_NODES]; /* node n's workers each on a PU of their own */
	uint32_t pus[FORWARD_MAX_NODES]; /* node n's CPUs this process may use (its affinity) */
};
void forward_topology(const struct forward_engine *e, struct forward_topology_info *out);
/* The topology an engine created with config would use (numa, threads_per_node), without
 * creating one. 0, or -1 with err as forward_check_topology. */
int forward_topology_describe(const struct forward_config *config,
                              struct forward_topology_info *out, struct sidecar_error *err);

/* One layer. Inputs are trusted to be readable for their sizes (the caller copied them out of
 * shared memory); their *values* are not trusted. */
struct forward_result;

struct forward_request {
	uint32_t client; /* < FORWARD_MAX_CLIENTS: whose GPU mask applies */
	int32_t layer;   /* transformer block index */
	uint32_t n_tokens;
	uint32_t k; /* ids per token */
	uint32_t
	    k_defer;   /* at most this many deferred per token; must be 0 on the last MoE layer */
	const void *x; /* n_tokens x hidden activations of dtype x_dtype */
	unsigned x_dtype;         /* enum moe_dtype / moek_act_dtype */
	const int32_t *ids;       /* n_tokens x k, -1 = skip */
	const float *weights;     /* n_tokens x k, finite */
	const float *deferred_in; /* optional n_tokens x hidden f32 added last to out (what the
	                             previous layer deferred); NULL = none */
	/* Optional early delivery (forward_run only; the reference ignores it): called once, on
	 * the calling thread, as soon as out_immediate is final — every expert with an immediate
	 * entry computed, deferred_in added — and before this thread computes the deferred-only
	 * experts (those already resident may be computing on the pool's other workers during
	 * the call: they start just before it); res has n_deferred and the counts so far. The
	 * engine is still taken (another forward_run waits), no lock is held. forward_run then
	 * finishes out_deferred. A deferred-only expert that fails (its read, at any point) does
	 * not fail the immediate part: it is still delivered, and forward_run returns the failure
	 * (res names the expert) with res->immediate_delivered set — the deferred part is lost.
	 * Lets a server post the result while the deferred experts compute or load — the point of
	 * deferral. */
	void (*immediate_ready)(void *arg, const struct forward_result *res);
	void *immediate_arg;
	/* Defer non-resident experts first (RESIDENCY source; deferral hides cold I/O):
	 * of each token's entries, still min(k_defer, valid) are deferred, but those whose expert
	 * is not resident on every node at planning time go first (lowest weight first), then
	 * the lowest-weighted. Results then depend on what is resident (immediate + deferred is
	 * the undeferred sum up to float re-association); forward_reference ignores it. */
	bool defer_cold;
	/* kt-kernel's rule (MOE_FWD_DEFER_UNION): per token the k - k_defer highest-weighted of
	 * all k entries (-1 included) are protected; an expert protected for any token is
	 * immediate for every token, every other entry deferred. Not with defer_cold. */
	bool defer_union;
	/* With immediate_ready: forward_run may return once the immediate part is delivered and
	 * every deferred-only expert is computing on the pool's other workers (none left to load
	 * or failed), with res->deferred_pending set. out_deferred is then final only after
	 * forward_settle or once the engine's next forward_run has started its first wave — which
	 * it plans while the deferred experts still compute: that overlap is the point. The
	 * caller keeps out_deferred alive until then (forward_destroy does not write it). */
	bool settle_later;
	/* Batch-invariant kernels (moek_ffn_call.batch_invariant): a token's outputs then depend
	 * only on its own x row, ids, weights and k_defer (and the ISA), never on the other tokens
	 * of the request, their count, its position, the thread count or the node split. Only
	 * defer_cold (what is resident decides what is deferred) still reaches a token's bits. */
	bool batch_invariant;
};

struct forward_result {
	int status;          /* MOE_OK or a negative enum moe_status */
	int32_t bad_token;   /* token of the offending entry, or -1 */
	int32_t bad_index;   /* position k of the offending id/weight, or -1 */
	int32_t bad_expert;  /* the expert concerned (EBADEXPERT, EIO, EMASKED), or -1 */
	char message[160];   /* "layer 3 expert 17: model.gguf offset 123: Input/output error" */
	uint32_t n_deferred; /* (token, id) entries deferred into out_deferred */
	uint32_t experts;    /* distinct experts computed */
	uint32_t hits, cold_misses, inflight_misses;
	uint64_t bytes_read;      /* by cold misses of this request */
	uint64_t queue_us;        /* waiting for the engine (another request running) */
	uint64_t io_us;           /* waiting for expert loads with nothing to compute */
	uint64_t compute_us;      /* computing */
	bool immediate_delivered; /* immediate_ready was called (out_immediate final then) */
	bool deferred_pending;    /* settle_later took effect: out_deferred not yet written */
};

/* Computes out_immediate (n_tokens x hidden f32, overwritten) = Σ immediate w·expert(x)
 * + deferred_in, and out_deferred (n_tokens x hidden f32, overwritten; may be NULL only when
 * k_defer = 0) = Σ deferred w·expert(x). Returns res->status. On error the outputs are
 * unspecified and res names the problem: MOE_EBADLAYER, MOE_EBADTOKENS, MOE_EBADTOPK,
 * MOE_EBADDTYPE, MOE_EBADEXPERT (id >= n_experts or < -1, or an id repeated within a token's
 * row: bad_index is the repeat's position), MOE_EBADWEIGHT, MOE_ENONFINITE,
 * MOE_EMASKED, MOE_EIO (naming the expert and file), MOE_EBADFIELD (k_defer on the last
 * layer), MOE_ESHUTDOWN. Every held expert is released on every path. */
int forward_run(struct forward_engine *e, const struct forward_request *req, float *out_immediate,
                float *out_deferred, struct forward_result *res);

/* Finishes a deferred part left running by forward_run (forward_request.settle_later): waits
 * for it (helping), writes its out_deferred, lets its experts go. Nothing pending: returns at
 * once. Takes the engine like forward_run. */
void forward_settle(struct forward_engine *e);

/* True if forward_run of these ids (n entries, -1 = skip; out-of-range ids count as "no
 * wait": validation fails them at once) would compute without waiting for a load: every
 * named expert is resident now (RESIDENCY), or the source keeps everything in memory
 * (ALL_RESIDENT). MMAP answers false (page faults). A hint for choosing a thread, not a
 * promise: an expert may be evicted right after. Reads ids once each; any thread. */
bool forward_would_run_now(struct forward_engine *e, int32_t layer, const int32_t *ids, size_t n);

/* Lookahead hints for `layer` (transformer block index). ids: n expert ids (invalid ones are
 * ignored), scores (may be NULL) their router probabilities × top_k. With scores_per_expert
 * set, `scores` holds n = n_experts router scores and ids is ignored: the (at most top_k)
 * highest positive finite scores are prefetched. Never waits; returns loads started (0 for sources
 * other than RESIDENCY), or a negative moe_status. */
int forward_prefetch(struct forward_engine *e, int32_t layer, const int32_t *ids,
                     const float *scores, uint32_t n, bool scores_per_expert);
/* The same, writing the experts whose loads it started into started_ids (room for n, or for
 * the model's top-k with scores_per_expert; NULL: not wanted), as many as it returns. */
int forward_prefetch_started(struct forward_engine *e, int32_t layer, const int32_t *ids,
                             const float *scores, uint32_t n, bool scores_per_expert,
                             uint32_t *started_ids);

/* Sets client's GPU mask: bits as the wire's MOE_OP_MASK (bit e of byte
 * layer * ceil(n_experts/8) + e/8; layer = transformer block). layer = -1: `bits` covers every
 * block; else just that block's bytes. A FORWARD of this client naming a masked expert fails
 * with MOE_EMASKED; an expert is kept out of residency only while every attached client masks
 * it. forward_client_detach forgets the client (its mask no longer counts). */
int forward_set_mask(struct forward_engine *e, uint32_t client, int32_t layer, const uint8_t *bits,
                     size_t n_bytes);
void forward_client_attach(struct forward_engine *e, uint32_t client);
/* forward_set_mask calls that changed their client's mask (switches), and the experts every
 * attached client masks now, which residency neither loads nor keeps (masked). */
void forward_mask_info(struct forward_engine *e, uint64_t *switches, uint64_t *masked);
void forward_client_detach(struct forward_engine *e, uint32_t client);

/* ---- Expert leases (leases.c) ------------------------------------------------------------
 * Experts pinned in the shared slot pools (shareable_pool: one pool, or one per NUMA node when
 * each expert's rows are split over nodes) for another process that maps the pools' memfds
 * read-only. A table of leases per lessee (a channel); the thread that serves the lessee calls
 * these, one at a time per table. */
struct moe_lease_expert;
struct forward_leases;
/* The pools' memfds (the engine's: dup them to keep them) and bytes, *n of them (up to
 * FORWARD_MAX_NODES: node part i's pool at i), 0; or -1 with why (not a residency, a private
 * pool). */
int forward_lease_pools(struct forward_engine *e, int *fds, uint64_t *bytes, uint32_t *n, char *why,
                        size_t len);
/* A table of at most cap (1..65536) leases pinning at most max_bytes together, with the
 * staging area the BF16 form fills (staging_bytes at staging, a mapping the lessee sees; NULL:
 * none); 0, or -1 (no shared pool, out of memory). */
int forward_leases_create(struct forward_engine *e, uint32_t cap, uint64_t max_bytes, void *staging,
                          uint64_t staging_bytes, struct forward_leases **out);
/* Releases every lease and frees. NULL: nothing. */
void forward_leases_destroy(struct forward_leases *t);
struct forward_lease_result {
	uint32_t bad;        /* on error: the index of the expert that failed */
	uint32_t cold;       /* experts that were not resident when asked */
	uint32_t slices;     /* slice descriptions written after the experts (split pools) */
	uint64_t cold_bytes; /* bytes read for them */
	uint64_t bytes;      /* bytes the call pinned */
	bool waited;         /* it waited for a load */
};
/* The bytes a LEASE of n experts may write at out: n descriptions, and (pools split over
 * nodes, the raw form) their slices. */
size_t forward_lease_reply_bytes(const struct forward_leases *t, uint32_t n, bool bf16);
/* Leases experts[0, n) of block `layer`, all or none: each is made resident (cold ones
 * waited for until deadline_ns, CLOCK_MONOTONIC) and pinned; out (out_bytes) receives n
 * struct moe_lease_expert saying where each lies in the pool and its lease id — with the pools
 * split over nodes, each matrix as slices (area SLICES), the slice table after the n
 * descriptions, which only a lessee of ABI minor >= 4 (abi_minor) reads: an older one is
 * refused, naming why. bf16: each matrix is also dequantized to BF16 rows (moek_dequantize,
 * on the engine's workers) into the staging area, which out[i] then describes (area
 * STAGING, never sliced); it is MOE_ENOLEASE when the area is full. MOE_OK, or MOE_EBADLAYER,
 * MOE_EBADEXPERT (out of range, repeated), MOE_ENOLEASE (the table's count or byte bound,
 * side data outside the pool, slices to an older lessee), MOE_ETOOSMALL (out_bytes),
 * MOE_ETIMEDOUT, MOE_EMASKED, MOE_EIO, MOE_ESHUTDOWN — with the sentence in why and
 * res->bad. */
int forward_lease_take(struct forward_leases *t, int32_t layer, const int32_t *experts, uint32_t n,
                       bool bf16, uint32_t abi_minor, uint64_t deadline_ns, void *out,
                       size_t out_bytes, struct forward_lease_result *res, char *why, size_t len);
/* MOE_OK, or MOE_EBADLEASE: no such lease held (never taken, or released already). */
int forward_lease_release(struct forward_leases *t, uint32_t id);
uint32_t forward_leases_release_all(struct forward_leases *t);
void forward_leases_held(const struct forward_leases *t, uint32_t *n, uint64_t *bytes);

/* Ends the backoff of every FAILED expert (residency_retry_all_failed on each node): each is
 * read again by its next demand. Returns how many there were. Any thread. */
uint32_t forward_retry_failed(struct forward_engine *e);

/* Statistics. Latency percentiles come from log-linear histograms (lat_hist_bucket: the upper
 * bound of the bucket, at most 12.5% above the true value). The same histograms, summed into
 * power-of-two buckets, are exported as they are: le[k] counts the successful requests whose
 * latency, recorded in whole µs (truncated), was below 2^k µs — so every one of them took at
 * most 2^k µs, exactly (1 µs … 2^23 µs = 8.4 s); count is all of them, sum_us their sum. */
enum forward_lat { FORWARD_LAT_QUEUE, FORWARD_LAT_IO, FORWARD_LAT_COMPUTE, FORWARD_LAT_TOTAL };
#define FORWARD_LAT_KINDS 4
#define FORWARD_LAT_BUCKETS 24
struct forward_latency {
	uint64_t p50_us, p99_us;
	uint64_t count, sum_us;
	uint64_t le[FORWARD_LAT_BUCKETS]; /* cumulative: latency <= 2^k µs */
};
/* The per-layer counters, listed once: the engine's atomics (forward_internal.h), each
 * layer's copy and the sums over layers below. A new one: its name here, its count in
 * record_layer (forward/engine.c), its row in sidecar/serving/stats_table.h. */
/* clang-format off */
#define FORWARD_LAYER_COUNTERS(X) \
	X(requests) X(tokens) X(hits) X(cold_misses) X(inflight_misses) X(bytes_read) X(failures)
/* clang-format on */
#define FORWARD_COUNTER_FIELD(name) uint64_t name;
struct forward_layer_stats {
	uint32_t layer; /* transformer block */
	FORWARD_LAYER_COUNTERS(FORWARD_COUNTER_FIELD)
	uint64_t queue_p50_us, queue_p99_us, io_p50_us, io_p99_us, compute_p50_us, compute_p99_us;
	uint64_t total_p50_us, total_p99_us;
	struct forward_latency lat[FORWARD_LAT_KINDS];
};
/* One residency's own counters (RESIDENCY): node n's pool of its slices of every expert, or,
 * with one pool for all nodes, node 0 naming that pool. */
struct forward_node_stats {
	uint32_t node;            /* its index in the topology's nodes */
	uint32_t os_index;        /* the OS's NUMA node number */
	uint64_t slot_bytes_used; /* residency.slots_used × residency.slot_bytes */
	/* residency_node_counters of the node: its loader's reads (bytes_read …), its slots,
	 * budget and resident slices' bytes, and the expert counters (hits, evictions,
	 * failed_now …: one per expert, the same on every node). */
	struct residency_counters residency;
};

struct forward_stats {
	FORWARD_LAYER_COUNTERS(FORWARD_COUNTER_FIELD) /* summed over the layers */
	/* resident_bytes: the file bytes of the experts resident now (never above the model's
	 * expert bytes); slot_bytes_used: the memory their slots take (slots are sized for the
	 * largest expert, with each extent's 4 KiB-aligned superset); pool_bytes: every slot;
	 * budget_bytes: what the pools may take (pool_bytes <= budget_bytes). ALL_RESIDENT: every
	 * expert, all four equal. */
	uint64_t resident_bytes, slot_bytes_used, pool_bytes, budget_bytes;
	uint64_t request_bytes; /* the request plans' buffers, allocated at create */
	/* RESIDENCY only (zero otherwise): the whole residency's counters as residency_counters
	 * gives them — every one of RESIDENCY_COUNTERS (residency.h), with no line of its own
	 * here — and its slots (the same count on every node), failed_now (experts FAILED now,
	 * one per expert whatever the nodes), fixed_buffers, hugetlb and thp (every pool).
	 * residency.bytes_read is everything the loaders read, demand and prefetch; bytes_read
	 * above only the cold demand misses of requests. */
	struct residency_counters residency;
	uint32_t
	    n_nodes; /* residency parts (RESIDENCY): one per node when sliced, else 1; else 0 */
	struct forward_node_stats nodes[FORWARD_MAX_NODES];
	uint32_t n_layers;                  /* entries in layers (MoE layers only) */
	struct forward_layer_stats *layers; /* caller's array of forward_stats_layers() entries */
};
uint32_t forward_stats_layers(const struct forward_engine *e);
/* Tests and debugging: the counters of node `node`'s part of the residency (RESIDENCY with
 * several nodes and a layout that slices: each node's own pool of its slices and its loader's
 * reads, with the residency's expert counters; otherwise node 0 names the one pool). Returns
 * 0, or -1 if there is no such part. Any thread. */
int forward_node_residency(struct forward_engine *e, uint32_t node, struct residency_counters *out);
/* Fills *out (out->layers must point at forward_stats_layers() entries). */
void forward_stats(struct forward_engine *e, struct forward_stats *out);
/* RESIDENCY: bytes of the slot pools resident in memory now (they are pre-faulted behind
 * create, so RSS holds only this part of pool_bytes); 0 for the other sources. */
uint64_t forward_pool_resident_bytes(struct forward_engine *e);

/* The engine's own JSON view, for tests and tools that run an engine in process; the daemon's
 * STATS document is written from sidecar/serving/stats_table.h (stats_doc.c) instead.
 * Writes `st` as one JSON object (no trailing newline):
 *   {"requests":…, "tokens":…, "hits":…, "cold_misses":…, "inflight_misses":…,
 *    "bytes_read":…, "failures":…, "resident_bytes":…, "slot_bytes_used":…,
 *    "pool_bytes":…, "budget_bytes":…, "slots":…, "evictions":…,
 *    "loader_bytes_read":…, "prefetches":…, "prefetch_hits":…, "prefetch_wasted":…,
 *    "failed_experts":…, "failed_retries":…, "fixed_reads":…, "plain_reads":…,
 *    "fixed_buffers":…, "pool_hugetlb":0|1, "pool_thp":0|1,
 *    "nodes":[{"node":…, "os_index":…, "resident_bytes":…, "slot_bytes_used":…,
 *              "budget_bytes":…, "slots":…, "slots_used":…, "hits":…, "cold_misses":…,
 *              "inflight_misses":…, "loader_bytes_read":…, "evictions":…,
 *              "failed_experts":…}, …],
 *    "layers":[{"layer":…, "requests":…, "tokens":…, "hits":…, "cold_misses":…,
 *               "inflight_misses":…, "bytes_read":…, "failures":…,
 *               "queue_us":{"p50":…,"p99":…}, "io_us":{…}, "compute_us":{…},
 *               "total_us":{…}}, …]}
 * Layers with no request are left out. Returns the length it needs (without the NUL), like
 * snprintf: the output is complete only when that is < len. */
size_t forward_stats_json(const struct forward_stats *st, char *buf, size_t len);

/* The same members, written into w's open object (for a caller that adds members of its own). */
void forward_stats_write(const struct forward_stats *st, struct json_writer *w);

#endif /* MOE_FORWARD_H */
