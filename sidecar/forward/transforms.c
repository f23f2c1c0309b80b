/* transforms.c — an expert's bytes as read turned into what the kernels take, once per load.
 *
 * Every step that depends on a checkpoint's layout lives here (transforms.h): a new layout
 * touches model/ and this file only.
 *
 * MXFP4 in the Hugging Face layout (gpt-oss checkpoints: _blocks and _scales tensors) is
 * converted to the GGUF 17-byte blocks the kernels take, once per load, in the memory the
 * bytes were read into: RESIDENCY by a post-load hook on each node's layout thread, before
 * the expert becomes RESIDENT (blocks and scales are adjacent extents of the slot, and the
 * GGUF bytes are exactly their sum); ALL_RESIDENT at create. The MMAP source is refused for it
 * (a read-only page-cache mapping cannot be converted, and a private copy would defeat what
 * that baseline measures).
 *
 * INT4 checkpoints (compressed-tensors pack-quantized, GPTQ) are repacked into INT4_G32 rows
 * the same way, once per load: the repacked rows outgrow the packed weights, so the residency
 * map gives each such data extent the room of its rows (catalog_adapter.c) and the hook
 * copies a projection's source tensors aside before writing the rows over them. The MMAP
 * source is refused for them as for Hugging Face MXFP4, and their rows are never cut into
 * node slices (GPTQ packs along the input).
 *
 * Llama-4's Hugging Face experts (MOE_LAYOUT_TRANSPOSED: F32/F16/BF16 stored input-major) take
 * the same path: copied aside, then written back as rows (a transpose, same size); their rows
 * are not contiguous in the file, so they are never cut into node slices either.
 * ModelOpt NVFP4 (weight, weight_scale) takes the INT4 path: its tensors are copied aside and
 * ggml's NVFP4 blocks written over the weight extent (their sum is the blocks' size); its
 * weight_scale_2 was read at open and rides in the views (moek_matrix.tensor_scale).
 *
 * Side data (biases, FP8 block scales) held in the slot (side_in_slot) becomes f32 rows on a
 * float boundary of its extent; a fused gate_up's alternating bias rows are put in
 * gate-then-up order. Then the decode layout (decode_layout.c) rearranges gate, up and down.
 *
 * Not supported (refused at create with a message): FP8 in a fused gate_up tensor.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expert_view.h"
#include "transforms.h"
#include "weights.h"

/* What a repacked projection is, and what the kernels take instead (mmap refusals). */
static const char *repacked_what(const struct moe_proj_ref *r)
{
	switch (r->layout) {
	case MOE_LAYOUT_INT4_CT: return "INT4 checkpoint weights (compressed-tensors)";
	case MOE_LAYOUT_INT4_GPTQ:
		return r->awq ? "INT4 checkpoint weights (AWQ)" : "INT4 checkpoint weights (GPTQ)";
	case MOE_LAYOUT_NVFP4_MODELOPT: return "NVFP4 in ModelOpt's weight/weight_scale layout";
	case MOE_LAYOUT_TRANSPOSED: return "Llama-4's input-major experts";
	default: return "a repacked layout";
	}
}

static const char *repacked_into(enum moe_weight_layout l)
{
	switch (l) {
	case MOE_LAYOUT_NVFP4_MODELOPT: return "ggml's NVFP4 blocks";
	case MOE_LAYOUT_TRANSPOSED: return "rows";
	default: return "INT4_G32 blocks";
	}
}

int transforms_check(struct forward_weights *w, enum forward_source source,
                     struct sidecar_error *err)
{
	const struct moe_catalog *cat = w->cat;
	for (uint32_t l = 0; l < cat->info.n_layers; l++) {
		if (!cat->layers[l].moe)
			continue;
		const struct moe_expert *x = &cat->layers[l].experts[0];
		for (int p = 0; p < MOE_PROJ_COUNT; p++) {
			const struct moe_proj_ref *r = &x->proj[p];
			if (!r->present)
				continue;
			if (r->layout == MOE_LAYOUT_MXFP4_HF) {
				w->xf.mxfp4_hf = true;
				if (source == FORWARD_SOURCE_MMAP) {
					error_set(
					    err, MOE_EINVAL,
					    "layer %u %s: MXFP4 in the Hugging Face "
					    "_blocks/_scales layout cannot be served from the "
					    "mmap source (the kernels take GGUF blocks, and a "
					    "read-only page-cache mapping cannot be converted "
					    "in place): use the residency or all-resident "
					    "source, or convert the model to GGUF",
					    l, moe_proj_name((enum moe_proj)p));
					return -1;
				}
			}
			if (moe_layout_repacked(r->layout)) {
				w->xf.int4 =
				    true; /* rewritten at load from a copy of its tensors */
				if (source == FORWARD_SOURCE_MMAP) {
					error_set(
					    err, MOE_EINVAL,
					    "layer %u %s: %s cannot be served from the mmap source "
					    "(the kernels take %s, and a read-only page-cache "
					    "mapping cannot be %s in place): use the residency or "
					    "all-resident source%s",
					    l, moe_proj_name((enum moe_proj)p), repacked_what(r),
					    repacked_into(r->layout),
					    r->layout == MOE_LAYOUT_TRANSPOSED ? "transposed"
					                                       : "repacked",
					    r->layout == MOE_LAYOUT_TRANSPOSED
					        ? ", or convert the model to GGUF"
					        : "");
					return -1;
				}
			}
			if (p == MOE_PROJ_GATE_UP && moek_format_scale_block(r->format)) {
				error_set(
				    err, MOE_EINVAL,
				    "layer %u: FP8 in a fused gate_up tensor is not supported", l);
				return -1;
			}
		}
	}
	return 0;
}

/* Converts one matrix in place: `blocks` (16 bytes per 32 elements, blocks_len) and `scales`
 * (one E8M0 byte per 32 elements, scales_len) become GGUF 17-byte blocks starting at
 * `blocks`. The scales must lie at or after the end of the blocks; the output
 * (blocks_len + scales_len bytes) then ends at or before the end of the scales, so only the
 * two extents and the gap between them are written. Output block b overlaps input blocks
 * b and b+1 and possibly scales of earlier blocks: the scales are copied to scratch first,
 * then the blocks are converted from the last chunk backwards, each chunk through scratch
 * (see mxfp4_hf_scratch_bytes). Returns 0 or -1 (err). */
static int mxfp4_hf_convert(uint8_t *blocks, uint64_t blocks_len, const uint8_t *scales,
                            uint64_t scales_len, uint8_t *scratch, size_t scratch_len,
                            struct sidecar_error *err)
{
	const uint64_t nb = scales_len;
	if (blocks_len != nb * 16 || nb == 0) {
		error_set(err, MOE_EINVAL,
		          "MXFP4 (Hugging Face layout): %llu bytes of blocks for %llu scales "
		          "(16 per scale expected)",
		          (unsigned long long)blocks_len, (unsigned long long)scales_len);
		return -1;
	}
	if (scales < blocks + blocks_len) {
		error_set(err, MOE_EINVAL,
		          "MXFP4 (Hugging Face layout): the scales do not follow the blocks in "
		          "memory (cannot convert in place)");
		return -1;
	}
	if (scratch_len < nb + (uint64_t)MXFP4_HF_CHUNK_BLOCKS * 16) {
		error_set(err, MOE_EINVAL,
		          "MXFP4 (Hugging Face layout): %llu scales exceed the converter's "
		          "scratch (%zu bytes)",
		          (unsigned long long)nb, scratch_len);
		return -1;
	}
	uint8_t *sc = scratch, *chunk = scratch + nb;
	memcpy(sc, scales, nb);
	for (uint64_t b1 = nb; b1 > 0;) {
		const uint64_t b0 = b1 > MXFP4_HF_CHUNK_BLOCKS ? b1 - MXFP4_HF_CHUNK_BLOCKS : 0;
		memcpy(chunk, blocks + 16 * b0, 16 * (b1 - b0));
		moek_mxfp4_from_hf(chunk, sc + b0, 32 * (b1 - b0), blocks + 17 * b0);
		b1 = b0;
	}
	return 0;
}

/* The largest of bytes_of(projection) over every expert of the catalog (0 where it is 0). */
static uint64_t largest_over_catalog(const struct forward_weights *w,
                                     uint64_t (*bytes_of)(const struct moe_proj_ref *))
{
	uint64_t most = 0;
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++) {
			const struct moe_expert *x =
			    moe_catalog_expert(w->cat, w->model_layer[l], e);
			for (int p = 0; p < MOE_PROJ_COUNT; p++)
				if (x->proj[p].present && bytes_of(&x->proj[p]) > most)
					most = bytes_of(&x->proj[p]);
		}
	return most;
}

static uint64_t mxfp4_hf_scale_bytes(const struct moe_proj_ref *r)
{
	return r->layout == MOE_LAYOUT_MXFP4_HF ? r->scale.length : 0;
}

/* Scratch bytes a converter needs for any MXFP4 matrix (or slice of one) of the catalog. */
static size_t mxfp4_hf_scratch_bytes(const struct forward_weights *w)
{
	return (size_t)largest_over_catalog(w, mxfp4_hf_scale_bytes) +
	       (size_t)MXFP4_HF_CHUNK_BLOCKS * 16;
}

static int converter_init(const struct forward_weights *w, struct mxfp4_hf_converter *c,
                          struct sidecar_error *err)
{
	c->scratch_len = mxfp4_hf_scratch_bytes(w);
	c->scratch = malloc(c->scratch_len);
	if (!c->scratch) {
		error_set(err, MOE_ENOMEM, "MXFP4 conversion scratch (%zu bytes): out of memory",
		          c->scratch_len);
		return -1;
	}
	return 0;
}

/* Converts every (blocks, scales) pair of a loaded expert. */
static int mxfp4_hf_after_load(const struct mxfp4_hf_converter *c, const struct residency_loaded *x,
                               struct sidecar_error *err)
{
	for (uint32_t i = 0; i < c->n_pairs; i++) {
		const uint32_t b = c->blocks[i], s = c->scales[i];
		if (b >= x->n_extents || s >= x->n_extents ||
		    x->data[s] + x->length[s] > x->slot + x->slot_bytes) {
			error_set(err, MOE_EINVAL,
			          "MXFP4 conversion: extents %u and %u are not in the slot (%u "
			          "extents)",
			          b, s, x->n_extents);
			return -EINVAL;
		}
		if (mxfp4_hf_convert(x->data[b], x->length[b], x->data[s], x->length[s], c->scratch,
		                     c->scratch_len, err) != 0)
			return -EINVAL;
	}
	return 0;
}

/* Whether a projection is rewritten at load from a copy of its tensors: the INT4 checkpoints,
 * ModelOpt NVFP4 and Llama-4's input-major experts. */
static bool is_int4(const struct moe_proj_ref *r)
{
	return moe_layout_repacked(r->layout);
}

/* dst[r][c] = src[c][r] for a rows x cols matrix of esize-byte elements stored cols x rows,
 * in tiles so that both sides stay in cache. */
static void transpose_rows(const uint8_t *src, uint8_t *dst, uint64_t rows, uint64_t cols,
                           size_t esize)
{
	enum { TILE = 32 };
	for (uint64_t c0 = 0; c0 < cols; c0 += TILE)
		for (uint64_t r0 = 0; r0 < rows; r0 += TILE) {
			const uint64_t c1 = c0 + TILE < cols ? c0 + TILE : cols;
			const uint64_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
			for (uint64_t c = c0; c < c1; c++)
				for (uint64_t r = r0; r < r1; r++)
					memcpy(dst + (r * cols + c) * esize,
					       src + (c * rows + r) * esize, esize);
		}
}

/* The checkpoint bytes of a repacked projection: weights, scales and (GPTQ) zeros; 0 for any
 * other layout. */
static uint64_t int4_source_bytes(const struct moe_proj_ref *r)
{
	return is_int4(r) ? r->data.length + r->scale.length + r->zeros.length : 0;
}

/* Scratch for the largest INT4 projection's source tensors (0: the model has none). */
static size_t int4_scratch_bytes(const struct forward_weights *w)
{
	return (size_t)largest_over_catalog(w, int4_source_bytes);
}

/* Repacks projection r from its source tensors at src (weights, scales, zeros back to back)
 * into INT4_G32 rows at dst (moe_proj_kernel_bytes(r) bytes, not overlapping src). */
static int int4_repack(const struct moe_proj_ref *r, const uint8_t *src, uint8_t *dst,
                       struct sidecar_error *err)
{
	const uint8_t *sc = src + r->data.length, *zs = sc + r->scale.length;
	char why[200];
	if (r->layout == MOE_LAYOUT_TRANSPOSED) {
		const size_t esize = r->format == MOEK_F32 ? 4 : 2;
		if (r->data.length != r->rows * r->cols * esize)
			return error_set(err, MOE_EINVAL,
			                 "transpose: %llu bytes for a %llu x %llu matrix",
			                 (unsigned long long)r->data.length,
			                 (unsigned long long)r->rows, (unsigned long long)r->cols);
		transpose_rows(src, dst, r->rows, r->cols, esize);
		return 0;
	}
	const int rc =
	    r->layout == MOE_LAYOUT_NVFP4_MODELOPT
	        ? moek_nvfp4_from_modelopt(src, sc, r->rows, r->cols, dst, why, sizeof(why))
	    : r->layout == MOE_LAYOUT_INT4_CT
	        ? moek_int4_from_ct(src, sc, r->rows, r->cols, r->group, dst, why, sizeof(why))
	    : r->awq
	        ? moek_int4_from_awq(src, zs, sc, r->rows, r->cols, r->group, dst, why, sizeof(why))
	        : moek_int4_from_gptq(src, zs, sc, r->rows, r->cols, r->group, r->gptq_v1, dst, why,
	                              sizeof(why));
	return rc ? error_set(err, MOE_EINVAL, "%s", why) : 0;
}

/* The post-load repack of every INT4 projection of a loaded expert (whole-expert map): each
 * projection's tensors are copied into the scratch, then its rows written from its data
 * pointer on, into the room the map reserved there. */
static int int4_after_load(const struct load_transform *t, const struct residency_loaded *x,
                           struct sidecar_error *err)
{
	const struct forward_weights *w = t->w;
	const struct moe_expert *ce =
	    moe_catalog_expert(w->cat, w->model_layer[x->layer], x->expert);
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		const struct moe_proj_ref *r = &ce->proj[p];
		if (!r->present || !is_int4(r))
			continue;
		const int8_t d = w->roles.data[p], s = w->roles.scale[p], z = w->roles.zeros[p];
		const bool gptq = r->layout == MOE_LAYOUT_INT4_GPTQ;
		const bool scaled = r->layout != MOE_LAYOUT_TRANSPOSED;
		if (d < 0 || (scaled && s < 0) || (gptq && z < 0) || (uint32_t)d >= x->n_extents ||
		    (scaled && (uint32_t)s >= x->n_extents) ||
		    (gptq && (uint32_t)z >= x->n_extents) || x->length[d] != r->data.length ||
		    (scaled && x->length[s] != r->scale.length) ||
		    int4_source_bytes(r) > t->int4_scratch_len ||
		    x->data[d] + moe_proj_kernel_bytes(r) > x->slot + x->slot_bytes) {
			error_set(err, MOE_EINVAL,
			          "INT4 repack: layer %u expert %u %s: the loaded extents do not "
			          "match the catalog",
			          w->model_layer[x->layer], x->expert,
			          moe_proj_name((enum moe_proj)p));
			return -EINVAL;
		}
		uint8_t *buf = t->int4_scratch;
		memcpy(buf, x->data[d], r->data.length);
		if (scaled)
			memcpy(buf + r->data.length, x->data[s], r->scale.length);
		if (gptq)
			memcpy(buf + r->data.length + r->scale.length, x->data[z], r->zeros.length);
		struct sidecar_error why;
		if (int4_repack(r, buf, x->data[d], &why) != 0) {
			error_set(err, why.status, "layer %u expert %u %s: %s",
			          w->model_layer[x->layer], x->expert,
			          moe_proj_name((enum moe_proj)p), why.msg);
			return -EINVAL;
		}
	}
	return 0;
}

/* The decode-layout piece of a whole expert (shape: its view) read into memory: gate and up
 * from tensors of their own, or from a fused gate_up (up's rows then follow gate's; unused
 * when the rows alternate), down. */
static struct decode_piece whole_piece(const struct moek_expert *shape, uint8_t *gate, uint8_t *up,
                                       uint8_t *fused, uint8_t *down, size_t down_bytes)
{
	const size_t rb = moek_row_bytes(shape->gate.format, shape->gate.cols);
	return (struct decode_piece){.gate = fused ? fused : gate,
	                             .up = fused ? fused + shape->gate.rows * rb : up,
	                             .down = down,
	                             .rows = shape->gate.rows,
	                             .cols = shape->gate.cols,
	                             .down_rows = shape->down.rows,
	                             .down_cols = shape->down.cols,
	                             .down_bytes = down_bytes,
	                             .gate_up_format = shape->gate.format,
	                             .down_format = shape->down.format};
}

/* The decode-layout piece of a loaded expert (or of node n's slices of it). */
static void loaded_piece(const struct forward_weights *w, uint32_t node,
                         const struct residency_loaded *x, const struct moek_expert *shape,
                         struct decode_piece *p)
{
	if (w->sliced) {
		size_t f[FORWARD_MAX_NODES + 1], o[FORWARD_MAX_NODES + 1];
		forward_expert_split(shape, w->n_nodes, f, o);
		const uint8_t last = w->piece_data[w->node_pieces - 1];
		*p = whole_piece(shape, x->data[w->piece_data[0]],
		                 w->node_pieces == 3 ? x->data[w->piece_data[1]] : NULL, NULL,
		                 x->data[last], x->length[last]);
		p->rows = f[node + 1] - f[node]; /* the node's rows of the expert */
		p->down_rows = o[node + 1] - o[node];
		return;
	}
	const int8_t gu = w->roles.data[MOE_PROJ_GATE_UP], down = w->roles.data[MOE_PROJ_DOWN];
	const struct moe_proj_ref *dr =
	    &moe_catalog_expert(w->cat, w->model_layer[x->layer], x->expert)->proj[MOE_PROJ_DOWN];
	const size_t down_bytes = is_int4(dr) ? moe_proj_kernel_bytes(dr) : x->length[down];
	*p = gu >= 0 ? whole_piece(shape, NULL, NULL, x->data[gu], x->data[down], down_bytes)
	             : whole_piece(shape, x->data[w->roles.data[MOE_PROJ_GATE]],
	                           x->data[w->roles.data[MOE_PROJ_UP]], NULL, x->data[down],
	                           down_bytes);
}

/* Where an extent's f32 rows live once converted: its data pointer rounded up to a float
 * boundary (the extent's room covers the shift). */
static float *side_rows(uint8_t *data)
{
	return (float *)(void *)(((uintptr_t)data + 3) & ~(uintptr_t)3);
}

/* Widens n bias elements of `format` (f32, f16 or bf16) at data into f32 at side_rows(data),
 * from the last element down: an element is read before it is written over. */
static void widen_bias(uint8_t *data, uint64_t n, uint32_t format)
{
	float *dst = side_rows(data);
	if (bias_elem_bytes(format) == 4) {
		memmove(dst, data, n * 4);
		return;
	}
	for (uint64_t i = n; i-- > 0;) {
		uint16_t v;
		memcpy(&v, data + 2 * i, 2);
		dst[i] = format == MOEK_BF16 ? moek_bf16_to_f32(v) : moek_f16_to_f32(v);
	}
}

/* Puts 2k alternating rows (gate, up, gate, …) in gate-then-up order, through scratch. */
static void deinterleave_rows(float *rows, uint64_t k, float *scratch)
{
	memcpy(scratch, rows, 2 * k * sizeof(float));
	for (uint64_t i = 0; i < k; i++) {
		rows[i] = scratch[2 * i];
		rows[k + i] = scratch[2 * i + 1];
	}
}

/* Node t->node's side data of a loaded expert (node_layout's extents), in place as f32 rows
 * at side_rows(): its FP8 block rows, its bias rows (a fused gate_up's alternating rows put in
 * gate-then-up order). */
static int node_side_after_load(const struct load_transform *t, const struct residency_loaded *x,
                                struct sidecar_error *err)
{
	const struct forward_weights *w = t->w;
	const struct expert_template *tp =
	    &w->templates[(size_t)x->layer * w->n_experts + x->expert];
	const struct moe_expert *ce =
	    moe_catalog_expert(w->cat, w->model_layer[x->layer], x->expert);
	for (int i = 0; i < 3; i++) {
		const int8_t s = w->node_scale[i], b = w->node_bias[i];
		if ((s >= 0 && (uint32_t)s >= x->n_extents) ||
		    (b >= 0 && (uint32_t)b >= x->n_extents))
			return error_set(
			    err, MOE_EINVAL,
			    "layer %u expert %u: node %u holds %u extents, expected %u",
			    w->model_layer[x->layer], x->expert, x->node, x->n_extents,
			    w->node_extents);
		if (s >= 0)
			memmove(side_rows(x->data[s]), x->data[s], x->length[s]);
		if (b < 0 || (i == 1 && w->node_bias_interleaved))
			continue;
		const uint32_t format = ce->proj[tp->source[i]].bias_format;
		const uint64_t n = x->length[b] / bias_elem_bytes(format);
		widen_bias(x->data[b], n, format);
		if (i == 0 && w->node_bias_interleaved)
			deinterleave_rows(side_rows(x->data[b]), n / 2, t->side_scratch);
	}
	return 0;
}

/* Converts the side data of a loaded expert in place: FP8 block scales (f32 in the file) and
 * biases (f32, f16 or bf16; a fused gate_up's put in gate-then-up order) become f32 rows at
 * side_rows() of their extents. */
static int side_after_load(const struct load_transform *t, const struct residency_loaded *x,
                           struct sidecar_error *err)
{
	const struct forward_weights *w = t->w;
	const struct moe_expert *ce =
	    moe_catalog_expert(w->cat, w->model_layer[x->layer], x->expert);
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		const struct moe_proj_ref *r = &ce->proj[p];
		if (!r->present)
			continue;
		const int8_t s = w->roles.scale[p], b = w->roles.bias[p];
		if (s >= 0 && moek_format_scale_block(r->format))
			memmove(side_rows(x->data[s]), x->data[s], x->length[s]);
		if (b < 0)
			continue;
		const size_t eb = bias_elem_bytes(r->bias_format);
		if (x->length[b] != r->rows * eb)
			return error_set(
			    err, MOE_EINVAL,
			    "%s: layer %u expert %u %s bias: %llu bytes, expected %llu",
			    w->cat->files[r->bias.file].path, w->model_layer[x->layer], x->expert,
			    moe_proj_name((enum moe_proj)p), (unsigned long long)x->length[b],
			    (unsigned long long)(r->rows * eb));
		float *dst = side_rows(x->data[b]);
		if (eb == 4) {
			memmove(dst, x->data[b], r->rows * 4);
		} else { /* widened from the last row down: a row is read before it is written over
			  */
			for (uint64_t i = r->rows; i-- > 0;) {
				uint16_t v;
				memcpy(&v, x->data[b] + 2 * i, 2);
				dst[i] = r->bias_format == MOEK_BF16 ? moek_bf16_to_f32(v)
				                                     : moek_f16_to_f32(v);
			}
		}
		if (p == MOE_PROJ_GATE_UP && r->order == MOE_GATE_UP_INTERLEAVED) {
			const uint64_t ffn = r->rows / 2; /* even rows gate, odd up */
			memcpy(t->side_scratch, dst, r->rows * sizeof(float));
			for (uint64_t i = 0; i < ffn; i++) {
				dst[i] = t->side_scratch[2 * i];
				dst[ffn + i] = t->side_scratch[2 * i + 1];
			}
		}
	}
	return 0;
}

/* The residency's post-load hook: the Hugging Face MXFP4 conversion, then the decode layout. */
int transform_after_load(void *arg, const struct residency_loaded *x, struct sidecar_error *err)
{
	struct load_transform *t = arg;
	const struct forward_weights *w = t->w;
	if (w->xf.mxfp4_hf && mxfp4_hf_after_load(&t->hf, x, err) != 0)
		return -1;
	if (w->xf.int4 && int4_after_load(t, x, err) != 0)
		return -1;
	if (w->side_in_slot &&
	    (w->sliced ? node_side_after_load(t, x, err) : side_after_load(t, x, err)) != 0)
		return -1;
	if (!w->decode.on)
		return 0;
	struct moek_expert shape;
	struct decode_piece p;
	if (weights_shape_view(w, x->layer, x->expert, &shape, err) != 0)
		return -1;
	loaded_piece(w, t->node, x, &shape, &p);
	return decode_layout_apply(&w->decode, &t->decode, &p, err) != 0 ? -1 : 0;
}

/* File bytes per row of projection r's data and (Hugging Face MXFP4) scales extents. */
static uint64_t data_row_bytes(const struct moe_proj_ref *r)
{
	return r->layout == MOE_LAYOUT_MXFP4_HF ? r->cols / 2
	                                        : moek_row_bytes(r->format, (size_t)r->cols);
}
static uint64_t scale_row_bytes(const struct moe_proj_ref *r)
{
	return r->layout == MOE_LAYOUT_MXFP4_HF ? r->cols / 32 : 0;
}

bool transform_row_bytes(const struct moe_proj_ref *r, uint64_t *data_row, uint64_t *scale_row)
{
	*data_row = data_row_bytes(r);
	*scale_row = scale_row_bytes(r);
	if (is_int4(r)) /* GPTQ packs along the input; node slices are not cut from either */
		return false;
	return r->data.length == r->rows * *data_row &&
	       (*scale_row == 0 || r->scale.length == r->rows * *scale_row);
}

void transforms_add_pair(struct forward_weights *w, uint8_t blocks, uint8_t scales)
{
	for (uint32_t n = 0; n < FORWARD_MAX_NODES; n++) {
		struct mxfp4_hf_converter *c = &w->transform[n].hf;
		c->blocks[c->n_pairs] = blocks;
		c->scales[c->n_pairs++] = scales;
	}
}

/* The whole-expert map (catalog order: per projection data, scales, bias): which extents the
 * post-load conversion pairs up. The scales must directly follow the blocks. */
static int whole_map_pairs(struct forward_weights *w, struct sidecar_error *err)
{
	const struct moe_expert *x = moe_catalog_expert(w->cat, w->model_layer[0], 0);
	struct mxfp4_hf_converter *c = &w->transform[0].hf;
	c->n_pairs = 0;
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		if (!x->proj[p].present || x->proj[p].layout != MOE_LAYOUT_MXFP4_HF)
			continue;
		const int8_t b = w->roles.data[p], s = w->roles.scale[p];
		if (b < 0 || s != b + 1) {
			error_set(err, MOE_EINVAL,
			          "%s: MXFP4 blocks and scales are not adjacent in the expert map "
			          "(extents %d and %d)",
			          moe_proj_name((enum moe_proj)p), b, s);
			return -1;
		}
		c->blocks[c->n_pairs] = (uint8_t)b;
		c->scales[c->n_pairs++] = (uint8_t)s;
	}
	return 0;
}

int transforms_init(struct forward_weights *w, struct sidecar_error *err)
{
	if (w->xf.mxfp4_hf && !w->sliced && whole_map_pairs(w, err) != 0)
		return -1;
	for (uint32_t n = 0; n < w->n_res; n++) {
		struct load_transform *t = &w->transform[n];
		t->w = w;
		t->node = n;
		if (w->xf.mxfp4_hf && converter_init(w, &t->hf, err) != 0)
			return -1;
		if (w->side_in_slot) {
			const size_t rows = 2 * (size_t)w->cat->info.expert_ffn +
			                    (size_t)w->cat->info.hidden; /* any bias's rows */
			t->side_scratch = malloc(rows * sizeof(float));
			if (!t->side_scratch)
				return error_set(err, MOE_ENOMEM,
				                 "bias scratch (%zu bytes): out of memory",
				                 rows * sizeof(float));
		}
		if (w->xf.int4) {
			t->int4_scratch_len = int4_scratch_bytes(w);
			t->int4_scratch = malloc(t->int4_scratch_len);
			if (!t->int4_scratch) {
				error_set(err, MOE_ENOMEM,
				          "INT4 repack scratch (%zu bytes): out of memory",
				          t->int4_scratch_len);
				return -1;
			}
		}
		struct moek_expert shape;
		if (w->decode.on && (weights_shape_view(w, 0, 0, &shape, err) != 0 ||
		                     decode_scratch_init(&t->decode, &shape, err) != 0))
			return -1;
	}
	return 0;
}

void transforms_free(struct forward_weights *w)
{
	for (uint32_t n = 0; n < FORWARD_MAX_NODES; n++) {
		free(w->transform[n].hf.scratch);
		free(w->transform[n].int4_scratch);
		free(w->transform[n].side_scratch);
		decode_scratch_free(&w->transform[n].decode);
	}
}

/* ---- ALL_RESIDENT: each projection read in the kernels' layout ---- */

int transforms_read_begin(const struct forward_weights *w, struct proj_reader *rd,
                          struct sidecar_error *err)
{
	memset(rd, 0, sizeof(*rd));
	if (w->xf.mxfp4_hf && converter_init(w, &rd->conv, err) != 0)
		return -1;
	if (w->xf.int4 && !(rd->int4_buf = malloc(int4_scratch_bytes(w)))) {
		free(rd->conv.scratch);
		rd->conv.scratch = NULL;
		return error_set(err, MOE_ENOMEM, "INT4 repack scratch (%zu bytes): out of memory",
		                 int4_scratch_bytes(w));
	}
	return 0;
}

void transforms_read_end(struct proj_reader *rd)
{
	free(rd->conv.scratch);
	free(rd->int4_buf);
	memset(rd, 0, sizeof(*rd));
}

int transform_read_proj(const struct forward_weights *w, struct proj_reader *rd, const int *fds,
                        uint32_t l, uint32_t e, int p, uint8_t *dst, struct sidecar_error *err)
{
	const struct moe_catalog *cat = w->cat;
	const struct moe_proj_ref *r = &moe_catalog_expert(cat, w->model_layer[l], e)->proj[p];
	int rc = 0;
	if (is_int4(r)) { /* the tensors into the scratch, rows into dst */
		const struct moe_extent *xs[3] = {&r->data, &r->scale, &r->zeros};
		uint64_t used = 0;
		for (int k = 0; k < 3 && rc == 0; k++) {
			rc = weights_read_exact(fds[xs[k]->file], cat->files[xs[k]->file].path,
			                        rd->int4_buf + used, xs[k]->length, xs[k]->offset,
			                        err);
			used += xs[k]->length;
		}
		struct sidecar_error why;
		if (rc == 0 && int4_repack(r, rd->int4_buf, dst, &why)) {
			error_set(err, MOE_EINVAL, "layer %u expert %u %s: %s", w->model_layer[l],
			          e, moe_proj_name((enum moe_proj)p), why.msg);
			rc = -1;
		}
		return rc;
	}
	rc = weights_read_exact(fds[r->data.file], cat->files[r->data.file].path, dst,
	                        r->data.length, r->data.offset, err);
	if (rc || r->layout != MOE_LAYOUT_MXFP4_HF)
		return rc;
	/* the scales right behind the blocks, then both become GGUF blocks */
	uint8_t *sc = dst + r->data.length;
	rc = weights_read_exact(fds[r->scale.file], cat->files[r->scale.file].path, sc,
	                        r->scale.length, r->scale.offset, err);
	struct sidecar_error why;
	if (rc == 0 && mxfp4_hf_convert(dst, r->data.length, sc, r->scale.length, rd->conv.scratch,
	                                rd->conv.scratch_len, &why)) {
		error_set(err, MOE_EINVAL, "layer %u expert %u %s: %s", w->model_layer[l], e,
		          moe_proj_name((enum moe_proj)p), why.msg);
		rc = -1;
	}
	return rc;
}

int transform_decode_whole(const struct forward_weights *w, struct decode_scratch *scratch,
                           uint32_t l, uint32_t e, uint8_t *const d[MOE_PROJ_COUNT],
                           struct sidecar_error *err)
{
	const struct moe_expert *x = moe_catalog_expert(w->cat, w->model_layer[l], e);
	struct moek_expert shape;
	if (weights_shape_view(w, l, e, &shape, err) != 0)
		return -1;
	const struct decode_piece p =
	    whole_piece(&shape, d[MOE_PROJ_GATE], d[MOE_PROJ_UP],
	                x->proj[MOE_PROJ_GATE_UP].present ? d[MOE_PROJ_GATE_UP] : NULL,
	                d[MOE_PROJ_DOWN], moe_proj_kernel_bytes(&x->proj[MOE_PROJ_DOWN]));
	struct sidecar_error why;
	if (decode_layout_apply(&w->decode, scratch, &p, &why) != 0) {
		error_set(err, MOE_EINVAL, "layer %u expert %u: %s", w->model_layer[l], e, why.msg);
		return -1;
	}
	return 0;
}
