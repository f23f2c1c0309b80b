/* forward_internal.h — what the forward engine's files share: topology, worker pool, weights
 * sources and the engine struct. Not an API: forward.h is.
 *
 * Threading: forward_run and the oracle (forward_oracle_begin) take the engine one at a time
 * (`running` under run_lock, never held across compute or I/O); mask_lock guards the client masks;
 * counters are atomics. The pool's wave description is written by the thread running the request
 * while wave_seq is odd and read by workers once it is even again (pool.c).
 */
#ifndef MOE_FORWARD_INTERNAL_H
#define MOE_FORWARD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "catalog_adapter.h"
#include "fault_hook.h"
#include "forward.h"
#include "moe_kernels.h"

/* ---- topology.c ---- */
struct forward_node {
	uint32_t os_index;
	void *cpuset; /* hwloc_bitmap_t of the node's PUs (NULL when synthetic: not pinned) */
	uint32_t threads;
	/* The node's PUs (OS indices), one per core first, then each core's second PU, …: worker
	 * i of the node runs on pus[i] when the node has a PU per worker (pin_per_pu). */
	uint32_t *pus, n_pus;
	bool pin_per_pu;
};
struct forward_topology {
	void *topo; /* hwloc_topology_t */
	bool synthetic;
	bool memory_bound;
	uint32_t n_nodes;
	struct forward_node nodes[FORWARD_MAX_NODES];
};
int topology_open(struct forward_topology *t, const struct forward_config *cfg, char *err,
                  size_t err_len);
void topology_close(struct forward_topology *t);
/* Pins the calling thread, worker `local` of node n: to its own PU (pus[local]) when the node
 * has one per worker, else to the node's PUs when there are several nodes; nothing when
 * synthetic. Worker 0 of node 0 is the caller of pool_run_wave, whose affinity is the
 * caller's own: it is never pinned, and pus[0] is left to it. */
void topology_pin_worker(struct forward_topology *t, uint32_t node, uint32_t local);
/* Binds [addr, addr+len) to node n; a refused binding is logged once and ignored. */
void topology_bind_area(struct forward_topology *t, uint32_t node, void *addr, size_t len);

/* The node split both the pool and memory binding use: [0, total) cut into `parts` ranges on
 * multiples of `align` (the last ends at total); split[n]..split[n+1] is node n's. */
void forward_split_range(size_t total, size_t align, uint32_t parts, size_t *split);
#define FORWARD_DOWN_ALIGN 8 /* output rows per down-phase unit */

/* ---- pool.c ---- */
/* One expert group of a wave: a prepared moek_ffn_call and the node split of its ranges. */
struct wave_group {
	struct moek_ffn_call call;
	/* Node n's weight rows for the hidden and down phases (call.expert's shape; a per-node
	 * partial view with the sliced residency, else call.expert itself). */
	const struct moek_expert *node_expert[FORWARD_MAX_NODES];
	size_t f_split[FORWARD_MAX_NODES + 1]; /* node n owns intermediate rows [f_split[n], …) */
	size_t o_split[FORWARD_MAX_NODES + 1]; /* and output rows [o_split[n], o_split[n+1]) */
	size_t f_align; /* node split of the intermediate rows (weights are bound along it) */
	size_t h_align; /* finer split of a node's hidden phase among its threads */
};
struct pool_item {
	uint32_t group;
	uint32_t begin, end;
};
struct pool_worker {
	struct forward_pool *pool;
	pthread_t thread;
	uint32_t node, index; /* index: global worker number (call scratch slot) */
	uint32_t local;       /* worker number within its node */
	bool started;
};
struct forward_pool {
	struct forward_topology *topo;
	uint32_t n_workers;
	struct pool_worker *workers; /* n_workers; [0] is the thread calling pool_run_wave */
	/* Wave start: wave_seq moves on by two for each wave (odd while the caller writes the
	 * wave's description, even once it is published) and at stop; a worker spins on it
	 * briefly, then sleeps on it as a futex, counted in wave_sleepers so the caller makes the
	 * wake-up system call only when someone sleeps. */
	_Atomic uint32_t wave_seq, wave_sleepers;
	atomic_bool stopping;
	/* Phase ends: done[ph] counts finished items (all waves, wrapping); a wave's phase is over
	 * when it reaches target[ph]. Waiters spin, then sleep on it (done_sleepers). */
	_Atomic uint32_t done[3], done_sleepers;
	uint32_t target[3];
	/* Workers inside a wave; wave_seq is odd while the caller rewrites the wave, which waits
	 * for active to drop to 0 first. */
	_Atomic uint32_t active;
	/* Workers started: pool_create waits for all (counted in wave_sleepers meanwhile). */
	_Atomic uint32_t checked_in;
	bool in_flight; /* a wave started behind the caller, not yet joined */
	bool ready;     /* threads may have started (pool_destroy stops them) */
	/* The current wave (written before the start, read after it). */
	struct wave_group *groups;
	uint32_t n_groups;
	struct pool_item *items[3][FORWARD_MAX_NODES]; /* per phase, per node */
	uint32_t n_items[3][FORWARD_MAX_NODES];
	atomic_uint next[3][FORWARD_MAX_NODES];
	uint32_t item_capacity;
};
int pool_create(struct forward_pool *p, struct forward_topology *topo, uint32_t max_groups,
                char *err, size_t err_len);
void pool_destroy(struct forward_pool *p);
/* Runs load, hidden and down of every group (calls already prepared with n_workers =
 * p->n_workers) on the workers, the caller included, each phase over before the next. */
void pool_run_wave(struct forward_pool *p, struct wave_group *groups, uint32_t n_groups);
/* The same, but with POOL_WAVE_BEHIND and pool_runs_behind (node 0 has a worker besides the
 * caller) the caller takes no part: the wave runs on the other workers while the caller goes
 * on, until pool_wait_wave (which the next start also does). Without, as pool_run_wave. */
enum { POOL_WAVE_BEHIND = 1u };
void pool_start_wave(struct forward_pool *p, struct wave_group *groups, uint32_t n_groups,
                     unsigned flags);
void pool_wait_wave(struct forward_pool *p);
bool pool_runs_behind(const struct forward_pool *p);
/* How many of the wave's groups (the first ones) a node of `threads` workers runs whole, one
 * worker each for the group's hidden and down rows; the others are cut into one chunk per
 * worker (two in a wave started behind its caller). Groups of equal token counts cost the same, so
 * the first n_groups - n_groups % threads give every worker the same share whole and the rest is
 * split evenly; with unequal counts every group is split (no worker waits for another's large
 * group). Two workers streaming halves of the same small expert lose to each running its own
 * (docs/performance.md). */
uint32_t pool_whole_groups(const struct wave_group *groups, uint32_t n_groups, uint32_t threads);

/* ---- forward.c: latency histograms ---- */
/* Buckets in µs: one per value below 8, then 8 per power of two up to 2^26 µs (67 s; longer
 * lands in the last), so a bucket's upper bound is at most 12.5% above any value in it —
 * percentiles good to one significant figure and a bit, in 1.6 KiB per histogram. */
#define LAT_HIST_SUB 8u
#define LAT_HIST_BUCKETS (LAT_HIST_SUB + 24u * LAT_HIST_SUB)
unsigned lat_hist_bucket(uint64_t us);
uint64_t lat_hist_upper(unsigned bucket); /* the largest value the bucket holds */

/* ---- decode_layout.c ---- */
/* How resident experts are rearranged for the decode kernels (decode_layout.c): off for the
 * MMAP source and forward_config.file_layout. A matrix's groups of 8 rows are interleaved
 * where its format has that layout (moek_interleave_supported) and the model's rows come in
 * 8s: decided per format, as a mix changes formats from layer to layer. */
struct decode_layout {
	bool on;
	bool gate_up_rows8, down_rows8; /* the expert's gate/up rows, down rows: multiples of 8 */
	bool rows_interleaved;          /* the file's gate_up alternates rows (gpt-oss) */
};
/* One thread's scratch: one unit (a group of 8 of the widest rows) and a bitmap. */
struct decode_scratch {
	uint8_t *unit;
	size_t unit_len;
	uint64_t *visited;
	size_t visited_units;
};
/* An expert's (or a node slice's) bytes as read: gate rows at gate, up rows at up (separate
 * extents in ascending order, or gate + rows · row bytes in a fused tensor; rows_interleaved:
 * one fused range at gate, up unused), down rows at down. */
struct decode_piece {
	uint8_t *gate, *up, *down;
	size_t rows, cols;           /* gate/up rows held here, hidden size */
	size_t down_rows, down_cols; /* down rows held here, intermediate size */
	size_t down_bytes;
	uint32_t gate_up_format, down_format;
};
/* ce: any expert of the model (the catalog's layout); shape: its kernel view. */
void decode_layout_plan(struct decode_layout *dl, const struct moe_expert *ce,
                        const struct moek_expert *shape, bool on);
int decode_scratch_init(struct decode_scratch *s, const struct moek_expert *shape, char *err,
                        size_t err_len);
void decode_scratch_free(struct decode_scratch *s);
/* Rearranges one piece in place; 0, or -1 with err (extents out of order, rows off the
 * groups). */
int decode_layout_apply(const struct decode_layout *dl, struct decode_scratch *s,
                        const struct decode_piece *p, char *err, size_t err_len);
/* Turns a view whose gate.data is the start of the rearranged range (up and down as built
 * from the files) into the view of the rearranged expert. */
void decode_layout_view(const struct decode_layout *dl, struct moek_expert *v);

/* ---- the test oracle's access (tests/forward/oracle.c) ---- */
struct forward_oracle_shape {
	uint32_t moe_layer; /* of the request */
	uint32_t hidden;    /* floats per output row */
	uint32_t n_experts; /* per layer */
	size_t x_row_bytes; /* one input row in the request's dtype */
};
/* Takes the engine (as forward_run does, settling a deferred part first) and validates q the
 * way forward_run does. MOE_OK: the caller holds the engine until forward_oracle_end. Else
 * the error, res filled, the engine given back. */
int forward_oracle_begin(struct forward_engine *e, const struct forward_request *q,
                         float *out_deferred, struct forward_result *res,
                         struct forward_oracle_shape *shape);
void forward_oracle_end(struct forward_engine *e);
/* Runs expert x's FFN over c (tokens, inputs, weights, output set by the caller; expert view
 * and scratch set here, cleared on return) on the calling thread, the weights read as
 * forward_run reads them (each residency acquired waiting; a sliced source node by node).
 * MOE_OK, or the error with res filled as forward_run would. */
int forward_oracle_expert(struct forward_engine *e, const struct forward_request *q,
                          uint32_t moe_layer, uint32_t x, struct moek_ffn_call *c,
                          struct forward_result *res);

/* forward_create with a read-fault hook installed in every residency before its first read
 * (fault_hook.h): for tests and the test-hooks daemon only. */
int forward_create_with_fault_hook(struct forward_engine **out, const struct moe_catalog *cat,
                                   const struct forward_config *config, loader_fault_fn hook,
                                   void *hook_arg, char *err, size_t err_len);

/* ---- weights.c ---- */
/* f32 side data of one expert: biases and FP8 block scales (converted from the files at
 * create; small). Offsets in floats into weights.aux, UINT64_MAX = absent. */
struct expert_aux {
	uint64_t bias[3];  /* gate, up, down */
	uint64_t scale[3]; /* gate, up, down */
};
/* MXFP4 in the Hugging Face layout (_blocks + _scales extents) is converted to GGUF 17-byte
 * blocks in place, once per load: by each residency's loader thread (post-load hook) or, for
 * ALL_RESIDENT, at create. One converter per residency, used only by its loader thread. */
#define MXFP4_HF_CHUNK_BLOCKS 1024u /* blocks converted per step (16 KiB of input) */
struct mxfp4_hf_converter {
	uint32_t n_pairs;
	uint8_t blocks[EXPERT_MAX_EXTENTS], scales[EXPERT_MAX_EXTENTS]; /* extent indices */
	uint8_t *scratch; /* a copy of one matrix's scales + one chunk of its blocks */
	size_t scratch_len;
};
/* What a residency's loader does to an expert after reading it (post-load hook): the
 * Hugging Face MXFP4 conversion, then the decode layout. One per residency. */
struct load_transform {
	const struct forward_weights *w;
	uint32_t node; /* the residency's index (its node slices when sliced) */
	struct mxfp4_hf_converter *hf;
	struct decode_scratch decode;
	uint8_t *int4_scratch; /* INT4 checkpoints: a copy of one projection's source tensors */
	size_t int4_scratch_len;
};
struct forward_weights {
	enum forward_source source;
	/* Tests only (forward_create_with_fault_hook): installed in every residency */
	loader_fault_fn fault_hook;
	void *fault_arg;
	const struct moe_catalog *cat;
	uint32_t n_moe_layers, n_experts;
	uint32_t *model_layer; /* [n_moe_layers] transformer block of each MoE layer */
	int32_t *moe_index;    /* [cat n_layers] MoE layer of each block, -1 dense */
	struct expert_map map; /* RESIDENCY, one residency: whole experts */
	struct expert_extent_roles roles;
	/* RESIDENCY: n_res residencies. sliced (several NUMA nodes, a layout that slices): one
	 * per node, res[n] over node_map[n], node n's rows of every expert (gate/up rows
	 * [f_n, f_n+1), down rows [o_n, o_n+1), the split forward_expert_split computes), bound
	 * to the node when memory binding is real. Otherwise one residency (res[0] over map). */
	uint32_t n_res;
	bool sliced;
	uint32_t n_nodes; /* the topology's nodes (the split of every expert) */
	struct residency *res[FORWARD_MAX_NODES];
	struct expert_map node_map[FORWARD_MAX_NODES];
	/* Sliced: node maps hold per piece (gate, up, down; gate_up, down; or gate_up's gate
	 * rows, its up rows, down) its data extent, then (Hugging Face MXFP4) its scales. */
	uint32_t node_pieces, node_extents;
	uint8_t piece_data[3]; /* extent index of each piece's data */
	bool mxfp4_hf;         /* some projection is MXFP4 in the Hugging Face layout */
	bool int4;             /* some projection is an INT4 checkpoint's (repacked at load) */
	struct mxfp4_hf_converter hf_conv[FORWARD_MAX_NODES]; /* one per residency */
	struct decode_layout decode;                          /* RESIDENCY, ALL_RESIDENT */
	struct load_transform transform[FORWARD_MAX_NODES];   /* one per residency */
	void **file_map;                                      /* MMAP: one mapping per file */
	size_t *file_map_len;
	uint8_t *resident; /* ALL_RESIDENT: every data extent, 64-byte aligned each */
	size_t resident_len;
	const uint8_t **data; /* MMAP/ALL_RESIDENT: [moe_layer][expert][proj] data pointer */
	float *aux;
	struct expert_aux *aux_index; /* [moe_layer][expert] */
	uint64_t budget_bytes;
};
/* A held expert: its kernel views and (RESIDENCY) the references to release. */
struct held_expert {
	struct moek_expert view; /* the whole expert, or (sliced) node 0's view: the call's
	                            plan template (same formats and shapes as every node's) */
	struct moek_expert node_view[FORWARD_MAX_NODES]; /* sliced: node n's rows (row0 set) */
	struct expert_ref ref[FORWARD_MAX_NODES];        /* ref[n] of res[n], held if bit n */
	uint32_t held_nodes;                             /* bit n: ref[n] is held */
};
/* Opens a source: ALL_RESIDENT loads everything, MMAP maps the files, RESIDENCY builds the
 * expert maps only — its pools are created and warmed by weights_start_residency. */
int weights_open(struct forward_weights *w, const struct moe_catalog *cat,
                 const struct forward_config *cfg, struct forward_topology *topo, char *err,
                 size_t err_len);
void weights_close(struct forward_weights *w);
/* RESIDENCY: creates each node's residency under cfg->mem_budget (0: every expert), then
 * warms the pinned layers and (budget 0, not lazy) every expert. */
int weights_start_residency(struct forward_weights *w, const struct forward_config *cfg,
                            struct forward_topology *topo, char *err, size_t err_len);
/* RESIDENCY: the pools' bytes when every expert fits (their slots, aligned). */
uint64_t weights_every_expert_bytes(const struct forward_weights *w);
/* The view of (moe_layer, expert) from data pointers per projection (NULL = absent). */
int weights_view(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                 const uint8_t *const data[MOE_PROJ_COUNT], struct moek_expert *view, char *err,
                 size_t err_len);
/* For ALL_RESIDENT and MMAP: the view at once. */
int weights_static_view(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                        struct moek_expert *view, char *err, size_t err_len);
/* For RESIDENCY: the views of an expert whose every residency's reference is held
 * (h->held_nodes covers res[0..n_res)): h->view and, sliced, h->node_view[]. */
int weights_held_view(const struct forward_weights *w, struct held_expert *h, char *err,
                      size_t err_len);
/* Releases every reference h holds. */
void weights_release(const struct forward_weights *w, struct held_expert *h);
/* The node split of an expert (its view): intermediate rows f[n]..f[n+1] and output rows
 * o[n]..o[n+1] of node n — what the pool runs and what each node's residency holds. */
void forward_expert_split(const struct moek_expert *v, uint32_t n_nodes, size_t *f, size_t *o);
/* Bytes of (moe_layer, expert) in residency `node`'s map. */
uint64_t weights_res_bytes(const struct forward_weights *w, uint32_t node, uint32_t moe_layer,
                           uint32_t expert);

#endif
