/* weights.h — expert weights as the scheduler sees them, whatever their source.
 *
 * Owns: the three sources (RESIDENCY: one residency, with a slot pool and an io_uring loader
 * per NUMA node when the layout slices; ALL_RESIDENT: every expert loaded at create; MMAP: the
 * files mapped), the expert maps the residency loads from (whole experts, or each node's
 * slices), the post-load transforms (Hugging Face MXFP4, INT4 repacking, the decode layout,
 * side data) and the f32 side data (biases, FP8 scales).
 * The engine (engine.c, waves.c, masks.c, stats.c) reaches weights only through the calls under
 * "The scheduler's interface": demand/release, readiness, hints and prefetches, GPU masks, retries
 * and counters, each the same for every source and any node split.
 *
 * Threading: weights_open/close/start_residency on the creating thread; the interface from
 * the thread running a request (and the hint/mask/retry calls from any thread: they go to
 * the residency, which has a lock of its own); counters from any thread.
 */
#ifndef MOE_FORWARD_WEIGHTS_H
#define MOE_FORWARD_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "catalog_adapter.h"
#include "decode_layout.h"
#include "fault_hook.h"
#include "forward.h"
#include "moe_kernels.h"
#include "residency.h"

struct forward_topology;

/* f32 side data of one expert: biases and FP8 block scales (converted from the files at
 * create; small). Offsets in floats into weights.aux, UINT64_MAX = absent. */
struct expert_aux {
	uint64_t bias[3];  /* gate, up, down */
	uint64_t scale[3]; /* gate, up, down */
};
/* One expert described once (at open): its kernel view without data (formats, shapes,
 * strides, scales, biases), the tensor each matrix's rows come from (gate, up, down:
 * MOE_PROJ_GATE/UP or MOE_PROJ_GATE_UP, MOE_PROJ_DOWN) and where up starts in a fused
 * gate_up. weights_view adds the data pointers of whichever source holds the expert. */
struct expert_template {
	struct moek_expert view;
	uint8_t source[3];
	size_t up_offset;
};
/* MXFP4 in the Hugging Face layout (_blocks + _scales extents) is converted to GGUF 17-byte
 * blocks in place, once per load: by each node's loader thread (post-load hook) or, for
 * ALL_RESIDENT, at create. One converter per node, used only by its loader thread. */
#define MXFP4_HF_CHUNK_BLOCKS 1024u /* blocks converted per step (16 KiB of input) */
struct mxfp4_hf_converter {
	uint32_t n_pairs;
	uint8_t blocks[EXPERT_MAX_EXTENTS], scales[EXPERT_MAX_EXTENTS]; /* extent indices */
	uint8_t *scratch; /* a copy of one matrix's scales + one chunk of its blocks */
	size_t scratch_len;
};
/* What a node's loader does to an expert after reading it (post-load hook): the Hugging Face
 * MXFP4 conversion, the INT4 repack, the side data, then the decode layout. One per node. */
struct load_transform {
	const struct forward_weights *w;
	uint32_t node; /* the node (its slices when sliced) */
	struct mxfp4_hf_converter *hf;
	struct decode_scratch decode;
	uint8_t *int4_scratch; /* INT4 checkpoints: a copy of one projection's source tensors */
	size_t int4_scratch_len;
	float *side_scratch; /* side_in_slot: one fused bias while its rows are put in order */
};
struct forward_weights {
	enum forward_source source;
	/* Tests only (forward_create_with_fault_hook): installed in the residency */
	loader_fault_fn fault_hook;
	void *fault_arg;
	const struct moe_catalog *cat;
	uint32_t n_moe_layers, n_experts;
	uint32_t *model_layer; /* [n_moe_layers] transformer block of each MoE layer */
	int32_t *moe_index;    /* [cat n_layers] MoE layer of each block, -1 dense */
	struct expert_map map; /* RESIDENCY, not sliced: whole experts */
	struct expert_extent_roles roles;
	/* RESIDENCY: one residency with n_res node parts. sliced (several NUMA nodes, a layout
	 * that slices): part n over node_map[n], node n's rows of every expert (gate/up rows
	 * [f_n, f_n+1), down rows [o_n, o_n+1), the split forward_expert_split computes, and
	 * the same rows of their biases and FP8 scales), bound to the node when memory binding
	 * is real. Otherwise one part over map. One policy decides for every part. */
	uint32_t n_res;
	bool sliced;
	uint32_t n_nodes; /* the topology's nodes (the split of every expert) */
	struct residency *res;
	struct expert_map node_map[FORWARD_MAX_NODES];
	/* Sliced: node maps hold per piece (gate, up, down; gate_up, down; or gate_up's gate
	 * rows, its up rows, down) its data extent, then (Hugging Face MXFP4) its scales; then
	 * per matrix (gate, up, down) the node's FP8 block scales and bias rows, if any. */
	uint32_t node_pieces, node_extents;
	uint8_t piece_data[3];              /* extent index of each piece's data */
	int8_t node_scale[3], node_bias[3]; /* extent index per matrix (gate, up, down); -1 */
	bool node_bias_interleaved; /* a fused gate_up's bias, rows alternating: one extent */
	bool mxfp4_hf;              /* some projection is MXFP4 in the Hugging Face layout */
	bool int4;                  /* some projection is an INT4 checkpoint's (repacked at load) */
	struct mxfp4_hf_converter hf_conv[FORWARD_MAX_NODES]; /* one per node */
	struct decode_layout decode;                          /* RESIDENCY, ALL_RESIDENT */
	struct load_transform transform[FORWARD_MAX_NODES];   /* one per node */
	void **file_map;                                      /* MMAP: one mapping per file */
	size_t *file_map_len;
	uint8_t *resident; /* ALL_RESIDENT: every data extent, 64-byte aligned each */
	size_t resident_len;
	const uint8_t **data; /* MMAP/ALL_RESIDENT: [moe_layer][expert][proj] data pointer */
	/* Side data (biases, FP8 block scales) as f32. RESIDENCY: in each expert's slot (each
	 * node's rows of it in the node's slot when sliced), converted by the post-load hook
	 * (side_in_slot), read and held with the expert under the budget. Otherwise converted
	 * once at open into aux. */
	bool side_in_slot;
	float *aux;
	struct expert_aux *aux_index;      /* [moe_layer][expert] */
	struct expert_template *templates; /* [moe_layer][expert] */
	uint64_t budget_bytes;
};
/* A held expert: its kernel views and (RESIDENCY) the reference to release. */
struct held_expert {
	struct moek_expert view; /* the whole expert, or (sliced) node 0's view: the call's
	                            plan template (same formats and shapes as every node's) */
	struct moek_expert node_view[FORWARD_MAX_NODES]; /* sliced: node n's rows (row0 set) */
	struct expert_ref ref; /* of res (every node's slices), held if `held` */
	bool held;
	bool counted; /* a demand was counted (weights_demand): retried without counting again */
};
/* Opens a source: ALL_RESIDENT loads everything, MMAP maps the files, RESIDENCY builds the
 * expert maps only — its pools are created and warmed by weights_start_residency. */
int weights_open(struct forward_weights *w, const struct moe_catalog *cat,
                 const struct forward_config *cfg, struct forward_topology *topo,
                 struct sidecar_error *err);
void weights_close(struct forward_weights *w);
/* RESIDENCY: creates the residency (a pool and a loader per node part) under cfg->mem_budget
 * (0: every expert), then warms the pinned layers and (budget 0, not lazy) every expert. */
int weights_start_residency(struct forward_weights *w, const struct forward_config *cfg,
                            struct forward_topology *topo, struct sidecar_error *err);
/* RESIDENCY: the pools' bytes when every expert fits (their slots, aligned). */
uint64_t weights_every_expert_bytes(const struct forward_weights *w);
/* The view of (moe_layer, expert) from data pointers per projection (NULL = absent). */
int weights_view(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                 const uint8_t *const data[MOE_PROJ_COUNT], struct moek_expert *view,
                 struct sidecar_error *err);
/* The view of (moe_layer, expert)'s shape: formats, shapes, strides and side data, with
 * stand-in data pointers (never to be computed with): for planning and sizing. */
int weights_shape_view(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                       struct moek_expert *view, struct sidecar_error *err);
/* For ALL_RESIDENT and MMAP: the view at once. */
int weights_static_view(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                        struct moek_expert *view, struct sidecar_error *err);
/* For RESIDENCY: the views of a held expert (h->held): h->view and, sliced, h->node_view[]. */
int weights_held_view(const struct forward_weights *w, struct held_expert *h,
                      struct sidecar_error *err);
/* Node n's rows of a held expert: its slice's view when sliced, else the whole expert. */
static inline const struct moek_expert *weights_node_view(const struct forward_weights *w,
                                                          const struct held_expert *h, uint32_t n)
{
	return w->sliced ? &h->node_view[n] : &h->view;
}
/* Releases the reference h holds, if any. */
void weights_release(const struct forward_weights *w, struct held_expert *h);
/* Bytes of (moe_layer, expert) in node part `node`'s map. */
uint64_t weights_res_bytes(const struct forward_weights *w, uint32_t node, uint32_t moe_layer,
                           uint32_t expert);

/* ---- The scheduler's interface ---------------------------------------------------------- */

/* How a demand found an expert, counted once per expert: held already (every node's slices),
 * being read (another demand started it), or read by this demand. */
enum weights_found { WEIGHTS_NOT_YET = 0, WEIGHTS_HIT, WEIGHTS_IN_FLIGHT, WEIGHTS_COLD };

/* Demands (moe_layer, expert) into h (h zeroed before the first demand). wait: block until
 * every node holds its slices; else start what must be read and return. Returns 1 when h
 * holds it (h->view, and sliced h->node_view[], built), 0 when still pending (demand again),
 * or a negative errno: -EPERM GPU-masked, -ESHUTDOWN, -ENOSPC no slot can be freed, -EIO or
 * another read error on some node (weights_error_message says which and why), -EINVAL a view
 * that cannot be built. *found is set (HIT, IN_FLIGHT or COLD) by the one call that counts the
 * demand, and *cold_bytes to the bytes read for it; else WEIGHTS_NOT_YET. Static sources hold
 * every expert: 1 and HIT at once. */
int weights_demand(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert, bool wait,
                   struct held_expert *h, enum weights_found *found, uint64_t *cold_bytes,
                   struct sidecar_error *err);
/* The last read error of (moe_layer, expert), naming the node whose slice failed, as a
 * sentence ("" when none). */
void weights_error_message(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                           char *buf, size_t len);
/* True if computing (moe_layer, expert) now needs no read: RESIDENT (RESIDENCY),
 * always (ALL_RESIDENT), never (MMAP: a page fault may read). */
bool weights_ready(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert);
/* True if a demand would start a read (RESIDENCY only). */
bool weights_cold(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert);
/* A hint (the expert will be needed: keep it) and a prefetch (start reading it) at priority
 * pri. weights_prefetch returns true if a read started. No-ops for the static sources. */
void weights_hint(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert, float pri);
bool weights_prefetch(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                      float pri);
/* The GPU mask of one MoE layer (mask[x] != 0: the engine computes x itself). */
void weights_set_gpu_mask(const struct forward_weights *w, uint32_t moe_layer, const uint8_t *mask);
/* Every FAILED expert is read again by its next demand; returns how many there were. */
uint32_t weights_retry_failed(const struct forward_weights *w);
/* Adds the sources' figures to out (resident, pool and budget bytes, slots, evictions,
 * loader reads, prefetches, failures, pool pages). */
void weights_counters(const struct forward_weights *w, struct forward_stats *out);
/* One node part's residency counters; -1 when the source has no residency part there. */
int weights_node_counters(const struct forward_weights *w, uint32_t node,
                          struct residency_counters *out);

#endif
