/* transforms.h — what a checkpoint's layout needs done to an expert's bytes before the kernels
 * read them, once per load: Hugging Face MXFP4 to GGUF blocks, INT4 checkpoints
 * (compressed-tensors, GPTQ) to INT4_G32 rows, side data (biases, FP8 block scales) to f32
 * rows, then the decode layout. transforms.c holds every layout-specific step; a new
 * checkpoint layout touches model/ (its reader, moe_proj_kernel_bytes) and transforms.c only.
 *
 * Owns: each node's converter and scratch (one per node, used only by that node's loader
 * thread), the layout facts the node maps cut rows along (transform_row_bytes), and the
 * all-resident source's per-projection read (transform_read_proj).
 * Threading: transforms_check/transforms_init/transforms_free on the creating thread;
 * transform_after_load on a node's loader thread with that node's load_transform.
 */
#ifndef MOE_FORWARD_TRANSFORMS_H
#define MOE_FORWARD_TRANSFORMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "decode_layout.h"
#include "expert_map.h"
#include "forward.h"
#include "residency.h"

struct forward_weights;

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
	struct mxfp4_hf_converter hf;
	struct decode_scratch decode;
	uint8_t *int4_scratch; /* INT4 checkpoints: a copy of one projection's source tensors */
	size_t int4_scratch_len;
	float *side_scratch; /* side_in_slot: one fused bias while its rows are put in order */
};
/* Which transforms the model's layouts need (transforms_check). */
struct checkpoint_transforms {
	bool mxfp4_hf; /* some projection is MXFP4 in the Hugging Face layout */
	bool int4;     /* some projection is an INT4 checkpoint's (repacked at load) */
};

/* Bytes of one bias element of `format` (f32, f16 or bf16). */
static inline size_t bias_elem_bytes(uint32_t format)
{
	return format == MOEK_F32 ? 4 : 2;
}
/* Where an extent's f32 side rows live once converted: its data pointer rounded up to a
 * float boundary (the extent's room covers the shift). */
static inline const float *held_side_rows(const uint8_t *data)
{
	return (const float *)(const void *)(((uintptr_t)data + 3) & ~(uintptr_t)3);
}

/* Records which transforms the catalog's layouts need into w->xf, and refuses what a source
 * cannot serve (MMAP: layouts that must be rewritten in place; FP8 in a fused gate_up). */
int transforms_check(struct forward_weights *w, enum forward_source source,
                     struct sidecar_error *err);
/* RESIDENCY: each node part's load_transform (converters, scratch), once the maps exist. */
int transforms_init(struct forward_weights *w, struct sidecar_error *err);
void transforms_free(struct forward_weights *w);
/* The residency's post-load hook (arg: a struct load_transform): 0, or -1 with err. */
int transform_after_load(void *arg, const struct residency_loaded *x, struct sidecar_error *err);
/* A node map's data rows of r: bytes per row of its data and of its paired scales extent
 * (Hugging Face MXFP4; 0: none). False when r's rows cannot be cut into node slices (not
 * contiguous in the file, or packed across rows). */
bool transform_row_bytes(const struct moe_proj_ref *r, uint64_t *data_row, uint64_t *scale_row);
/* Node maps: the next data extent (index blocks) carries a paired scales extent (scales) that
 * the post-load conversion folds into it. */
void transforms_add_pair(struct forward_weights *w, uint8_t blocks, uint8_t scales);

/* ALL_RESIDENT: a projection's scratch (NULL-free set by transforms_read_begin). */
struct proj_reader {
	struct mxfp4_hf_converter conv;
	uint8_t *int4_buf;
};
int transforms_read_begin(const struct forward_weights *w, struct proj_reader *rd,
                          struct sidecar_error *err);
void transforms_read_end(struct proj_reader *rd);
/* Reads projection p of (moe_layer, expert) from the files (fds) into dst in the layout the
 * kernels take (moe_proj_kernel_bytes(r) bytes). */
int transform_read_proj(const struct forward_weights *w, struct proj_reader *rd, const int *fds,
                        uint32_t moe_layer, uint32_t expert, int p, uint8_t *dst,
                        struct sidecar_error *err);
/* ALL_RESIDENT: rearranges the copy of (l, e) whose projections are at d into the decode
 * layout. */
int transform_decode_whole(const struct forward_weights *w, struct decode_scratch *scratch,
                           uint32_t l, uint32_t e, uint8_t *const d[MOE_PROJ_COUNT],
                           struct sidecar_error *err);

#endif
