/* expert_view.h — the ground the weights files share: each expert described once (its
 * template), the weights' state, a held expert, and the kernel views built from them
 * (expert_view.c).
 *
 * Owns: nothing at run time; the types' owners are weights.c (forward_weights: open/close),
 * the engine (held_expert, in its request plan).
 * Threading: templates are written at open and read-only after; a view is built by the thread
 * that holds the expert.
 */
#ifndef MOE_FORWARD_EXPERT_VIEW_H
#define MOE_FORWARD_EXPERT_VIEW_H

#include <stdbool.h>
#include <stdint.h>

#include "catalog_adapter.h"
#include "decode_layout.h"
#include "fault_hook.h"
#include "forward.h"
#include "moe_kernels.h"
#include "residency.h"
#include "transforms.h"

#define AUX_NONE UINT64_MAX

/* f32 side data of one expert: biases and FP8 block scales (converted from the files at
 * create; small). Offsets in floats into weights.aux, UINT64_MAX = absent. */
struct expert_aux {
	uint64_t bias[3];  /* gate, up, down */
	uint64_t scale[3]; /* gate, up, down */
};
/* One expert described once (at open): its kernel view without data (formats, shapes,
 * strides and interleave of the decode layout, scales, biases), the tensor each matrix's rows
 * come from (gate, up, down: MOE_PROJ_GATE/UP or MOE_PROJ_GATE_UP, MOE_PROJ_DOWN), where up
 * starts in a fused gate_up (up_offset) or, in the decode layout, after gate's first unit
 * (decode_up), and the node split the pool runs it with. weights_view adds the data pointers
 * of whichever source holds the expert. */
struct expert_template {
	struct moek_expert view;
	uint8_t source[3];
	bool decoded; /* in the decode layout: up at gate + decode_up */
	size_t up_offset, decode_up;
	size_t f_split[FORWARD_MAX_NODES + 1]; /* node n: intermediate rows [f_split[n], …) */
	size_t o_split[FORWARD_MAX_NODES + 1]; /* and output rows [o_split[n], o_split[n+1]) */
	size_t f_align;                        /* moek_expert_split_align of the view */
	size_t h_align;                        /* moek_ffn_hidden_align of the view */
};
struct forward_weights {
	enum forward_source source;
	/* Tests only (forward_create_with_fault_hook): installed in the residency */
	loader_fault_fn fault_hook;
	void *fault_arg;
	loader_populate_fn populate_hook; /* tests only: residency_create_nodes_held's */
	void *populate_arg;
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
	bool node_bias_interleaved;      /* a fused gate_up's bias, rows alternating: one extent */
	struct checkpoint_transforms xf; /* which post-load transforms the layouts need */
	struct decode_layout decode;     /* RESIDENCY, ALL_RESIDENT */
	struct load_transform transform[FORWARD_MAX_NODES]; /* one per node part */
	void **file_map;                                    /* MMAP: one mapping per file */
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
/* A request's hold on one expert: which and how far its demand is (hold: expert and pending
 * set by the engine before the first demand; RESIDENCY: the reference to release), and its
 * kernel views (built once held). */
struct held_expert {
	struct residency_hold hold;
	const struct expert_template *tp; /* set with the views: the node split */
	struct moek_expert view;          /* the whole expert, or (sliced) node 0's view: the call's
	                                     plan template (same formats and shapes as every node's) */
	struct moek_expert node_view[FORWARD_MAX_NODES]; /* sliced: node n's rows (row0 set) */
};
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
/* Node n's rows of a held expert: its slice's view when sliced, else the whole expert. */
static inline const struct moek_expert *weights_node_view(const struct forward_weights *w,
                                                          const struct held_expert *h, uint32_t n)
{
	return w->sliced ? &h->node_view[n] : &h->view;
}
/* Describes every expert once, from the catalog and its side data (aux, when not in the slot):
 * w->templates; plans the decode layout (decode: whether the source rearranges) and puts it
 * and the node split over w->n_nodes into every template. */
int expert_templates_build(struct forward_weights *w, bool decode, struct sidecar_error *err);
/* The views of a held expert (h->hold.held, RESIDENCY): each node's slices when sliced, else
 * the whole expert's from its slot; sets h->tp. 0, or -1 with err (a layout that cannot be
 * viewed). */
int expert_held_view(const struct forward_weights *w, struct held_expert *h,
                     struct sidecar_error *err);
/* A layer's newly held experts (held[i]: hold.held and still hold.pending) made ready: their
 * views built (expert_held_view) and pending cleared, each counted in *ready. 0, or -1 with
 * err and *failed the index of the first whose views could not be built (left pending). */
int expert_layer_views(const struct forward_weights *w, struct held_expert *held, uint32_t n,
                       uint32_t *ready, uint32_t *failed, struct sidecar_error *err);

#endif
