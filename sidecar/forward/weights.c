/* weights.c — where the forward engine's expert weights come from, and their kernel views.
 *
 * Three sources behind one view builder:
 *   RESIDENCY     sidecar/residency/ slot pool: cold experts read with io_uring on demand;
 *   ALL_RESIDENT  every expert's matrices read into one buffer at create (the compute floor);
 *   MMAP          pointers into a read-only mapping of each model file (the page cache decides
 *                 what is in memory, as llama.cpp does: the baseline).
 * Biases and FP8 block scales are small and become f32 (so views never point at misaligned or
 * non-f32 side data): RESIDENCY reads them with the expert into its slot and converts them
 * there on the loader (side_in_slot), held and evicted with the expert; the other sources read
 * them once at create into `aux`. The big matrices are never copied or duplicated per node:
 * views point into the source's bytes.
 *
 * RESIDENCY with several NUMA nodes: one residency with a part per node, each holding only
 * that node's rows of every expert (sub-extents of the files: gate/up rows [f_n, f_n+1), down
 * rows [o_n, o_n+1), the pool's split, and the same rows of their biases and FP8 block scales),
 * in memory bound to the node; weights are never duplicated (only an FP8 block row of scales
 * that straddles two nodes' rows is read by both). One policy decides for every node. A
 * layout that cannot be cut so (rows not contiguous, an expert too small for the nodes) keeps
 * one unbound pool of whole experts, logged at create.
 *
 * MXFP4 in the Hugging Face layout (gpt-oss checkpoints: _blocks and _scales tensors) is
 * converted to the GGUF 17-byte blocks the kernels take, once per load, in the memory the
 * bytes were read into: RESIDENCY by a post-load hook on each residency's loader thread,
 * before the expert becomes RESIDENT (blocks and scales are adjacent extents of the slot, and
 * the GGUF bytes are exactly their sum); ALL_RESIDENT at create. The MMAP source is refused
 * for it (a read-only page-cache mapping cannot be converted, and a private copy would
 * defeat what that baseline measures).
 *
 * INT4 checkpoints (compressed-tensors pack-quantized, GPTQ) are repacked into INT4_G32 rows
 * the same way, once per load: the repacked rows outgrow the packed weights, so the residency
 * map gives each such data extent the room of its rows (catalog_adapter.c) and the hook
 * copies a projection's source tensors aside before writing the rows over them. The MMAP
 * source is refused for them as for Hugging Face MXFP4.
 *
 * RESIDENCY and ALL_RESIDENT then rearrange each expert, in the same memory, into the layout the
 * decode kernels read fastest (decode_layout.c: gate and up alternating, groups of 8 rows
 * interleaved where the format has the layout); every view is built for that layout. The
 * MMAP source (and forward_config.file_layout) keeps the files' rows.
 *
 * Not supported (refused at create with a message): FP8 in a fused gate_up tensor.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "forward_internal.h"
#include "log.h"
#include "policy.h"

#define AUX_NONE UINT64_MAX

static int read_exact(int fd, const char *path, void *buf, uint64_t len, uint64_t off,
                      struct sidecar_error *err)
{
	uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = pread(fd, p, len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			error_set(err, MOE_ESYS, "%s: read at offset %llu: %s", path,
			          (unsigned long long)off,
			          n < 0 ? strerror(errno) : "unexpected end of file");
			return -1;
		}
		p += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

static size_t bias_elem_bytes(uint32_t format)
{
	return format == MOEK_F32 ? 4 : 2;
}

/* Floats of side data an expert needs. */
static uint64_t aux_floats(const struct moe_expert *x)
{
	uint64_t n = 0;
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		const struct moe_proj_ref *r = &x->proj[p];
		if (!r->present)
			continue;
		if (r->bias.length)
			n += r->rows;
		if (moek_format_scale_block(r->format))
			n += r->scale.length / 4;
	}
	return n;
}

static int check_supported(struct forward_weights *w, const struct moe_catalog *cat,
                           enum forward_source source, struct sidecar_error *err)
{
	for (uint32_t l = 0; l < cat->info.n_layers; l++) {
		if (!cat->layers[l].moe)
			continue;
		const struct moe_expert *x = &cat->layers[l].experts[0];
		for (int p = 0; p < MOE_PROJ_COUNT; p++) {
			const struct moe_proj_ref *r = &x->proj[p];
			if (!r->present)
				continue;
			if (r->layout == MOE_LAYOUT_MXFP4_HF) {
				w->mxfp4_hf = true;
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
			if (r->layout == MOE_LAYOUT_INT4_CT || r->layout == MOE_LAYOUT_INT4_GPTQ) {
				w->int4 = true;
				if (source == FORWARD_SOURCE_MMAP) {
					error_set(
					    err, MOE_EINVAL,
					    "layer %u %s: INT4 checkpoint weights (%s) cannot be "
					    "served from the mmap source (the kernels take "
					    "INT4_G32 blocks, and a read-only page-cache mapping "
					    "cannot be repacked in place): use the residency or "
					    "all-resident source",
					    l, moe_proj_name((enum moe_proj)p),
					    r->layout == MOE_LAYOUT_INT4_CT ? "compressed-tensors"
					                                    : "GPTQ");
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

/* Reads biases and FP8 scales of every expert into w->aux as f32. */
static int load_aux(struct forward_weights *w, const int *fds, struct sidecar_error *err)
{
	const struct moe_catalog *cat = w->cat;
	const size_t n_ids = (size_t)w->n_moe_layers * w->n_experts;
	w->aux_index = calloc(n_ids ? n_ids : 1, sizeof(*w->aux_index));
	uint64_t total = 0;
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++)
			total += aux_floats(moe_catalog_expert(cat, w->model_layer[l], e));
	w->aux = malloc((total ? total : 1) * sizeof(float));
	uint16_t *tmp =
	    malloc(cat->info.expert_ffn * 2 * sizeof(float) + cat->info.hidden * 4 + 64);
	if (!w->aux_index || !w->aux || !tmp) {
		free(tmp);
		error_set(err, MOE_ENOMEM, "expert side data (%llu floats): out of memory",
		          (unsigned long long)total);
		return -1;
	}
	uint64_t at = 0;
	int rc = 0;
	for (uint32_t l = 0; l < w->n_moe_layers && rc == 0; l++)
		for (uint32_t e = 0; e < w->n_experts && rc == 0; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[l], e);
			struct expert_aux *a = &w->aux_index[(size_t)l * w->n_experts + e];
			for (int i = 0; i < 3; i++)
				a->bias[i] = a->scale[i] = AUX_NONE;
			for (int p = 0; p < MOE_PROJ_COUNT && rc == 0; p++) {
				const struct moe_proj_ref *r = &x->proj[p];
				if (!r->present)
					continue;
				const char *path = cat->files[r->data.file].path;
				if (moek_format_scale_block(r->format) && r->scale.length) {
					rc = read_exact(fds[r->scale.file],
					                cat->files[r->scale.file].path, &w->aux[at],
					                r->scale.length, r->scale.offset, err);
					a->scale[p] = at; /* FP8 is never fused: p < 3 */
					at += r->scale.length / 4;
				}
				if (rc || !r->bias.length)
					continue;
				size_t eb = bias_elem_bytes(r->bias_format);
				if (r->bias.length != r->rows * eb) {
					error_set(err, MOE_EINVAL,
					          "%s: layer %u expert %u %s bias: %llu bytes, "
					          "expected %llu",
					          path, w->model_layer[l], e,
					          moe_proj_name((enum moe_proj)p),
					          (unsigned long long)r->bias.length,
					          (unsigned long long)(r->rows * eb));
					rc = -1;
					break;
				}
				rc = read_exact(fds[r->bias.file], cat->files[r->bias.file].path,
				                tmp, r->bias.length, r->bias.offset, err);
				if (rc)
					break;
				float *dst = &w->aux[at];
				for (uint64_t i = 0; i < r->rows; i++)
					dst[i] = eb == 4 ? ((float *)(void *)tmp)[i]
					         : r->bias_format == MOEK_BF16
					             ? moek_bf16_to_f32(tmp[i])
					             : moek_f16_to_f32(tmp[i]);
				if (p == MOE_PROJ_GATE_UP) {
					uint64_t ffn = r->rows / 2;
					if (r->order ==
					    MOE_GATE_UP_INTERLEAVED) { /* even gate, odd up */
						float *t = (float *)(void *)tmp;
						for (uint64_t i = 0; i < r->rows; i++)
							t[i] = dst[i];
						for (uint64_t i = 0; i < ffn; i++) {
							dst[i] = t[2 * i];
							dst[ffn + i] = t[2 * i + 1];
						}
					}
					a->bias[MOE_PROJ_GATE] = at;
					a->bias[MOE_PROJ_UP] = at + ffn;
				} else {
					a->bias[p] = at;
				}
				at += r->rows;
			}
		}
	free(tmp);
	return rc;
}

/* ---- MXFP4, Hugging Face layout → GGUF blocks ---- */

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

/* Scratch bytes a converter needs for any MXFP4 matrix (or slice of one) of the catalog. */
static size_t mxfp4_hf_scratch_bytes(const struct forward_weights *w)
{
	uint64_t most = 0;
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++) {
			const struct moe_expert *x =
			    moe_catalog_expert(w->cat, w->model_layer[l], e);
			for (int p = 0; p < MOE_PROJ_COUNT; p++)
				if (x->proj[p].present &&
				    x->proj[p].layout == MOE_LAYOUT_MXFP4_HF &&
				    x->proj[p].scale.length > most)
					most = x->proj[p].scale.length;
		}
	return (size_t)most + (size_t)MXFP4_HF_CHUNK_BLOCKS * 16;
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

/* ---- INT4 checkpoints → INT4_G32 rows ---- */

static bool is_int4(const struct moe_proj_ref *r)
{
	return r->layout == MOE_LAYOUT_INT4_CT || r->layout == MOE_LAYOUT_INT4_GPTQ;
}

/* The checkpoint bytes of an INT4 projection: weights, scales and (GPTQ) zeros. */
static uint64_t int4_source_bytes(const struct moe_proj_ref *r)
{
	return r->data.length + r->scale.length + r->zeros.length;
}

/* Scratch for the largest INT4 projection's source tensors (0: the model has none). */
static size_t int4_scratch_bytes(const struct forward_weights *w)
{
	uint64_t most = 0;
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++) {
			const struct moe_expert *x =
			    moe_catalog_expert(w->cat, w->model_layer[l], e);
			for (int p = 0; p < MOE_PROJ_COUNT; p++)
				if (x->proj[p].present && is_int4(&x->proj[p]) &&
				    int4_source_bytes(&x->proj[p]) > most)
					most = int4_source_bytes(&x->proj[p]);
		}
	return (size_t)most;
}

/* Repacks projection r from its source tensors at src (weights, scales, zeros back to back)
 * into INT4_G32 rows at dst (moe_proj_kernel_bytes(r) bytes, not overlapping src). */
static int int4_repack(const struct moe_proj_ref *r, const uint8_t *src, uint8_t *dst,
                       struct sidecar_error *err)
{
	const uint8_t *sc = src + r->data.length, *zs = sc + r->scale.length;
	char why[200];
	const int rc =
	    r->layout == MOE_LAYOUT_INT4_CT
	        ? moek_int4_from_ct(src, sc, r->rows, r->cols, r->group, dst, why, sizeof(why))
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
		if (d < 0 || s < 0 || (gptq && z < 0) || (uint32_t)d >= x->n_extents ||
		    (uint32_t)s >= x->n_extents || (gptq && (uint32_t)z >= x->n_extents) ||
		    x->length[d] != r->data.length || x->length[s] != r->scale.length ||
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

static int build_templates(struct forward_weights *w, struct sidecar_error *err);

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

/* ---- side data in the slot (side_in_slot) ---- */

/* Where an extent's f32 rows live once converted: its data pointer rounded up to a float
 * boundary (the extent's room covers the shift). */
static float *side_rows(uint8_t *data)
{
	return (float *)(void *)(((uintptr_t)data + 3) & ~(uintptr_t)3);
}

static const float *held_side_rows(const uint8_t *data)
{
	return (const float *)(const void *)(((uintptr_t)data + 3) & ~(uintptr_t)3);
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

/* The views' scales and biases from the held slot (side_in_slot), matrix by matrix: gate,
 * up, down, each from the tensor its rows come from. */
static void side_view(const struct forward_weights *w, const struct expert_ref *ref,
                      const struct expert_template *t, struct moek_expert *v)
{
	struct moek_matrix *mats[3] = {&v->gate, &v->up, &v->down};
	for (int i = 0; i < 3; i++) {
		const int p = t->source[i];
		const int8_t s = w->roles.scale[p], b = w->roles.bias[p];
		if (s >= 0 && moek_format_scale_block(mats[i]->format))
			mats[i]->scales = held_side_rows(ref->data[s]);
		if (b >= 0)
			mats[i]->bias = held_side_rows(ref->data[b]) +
			                (i == 1 && p == MOE_PROJ_GATE_UP ? v->gate.rows : 0);
	}
}

/* The residency's post-load hook: the Hugging Face MXFP4 conversion, then the decode layout. */
static int transform_after_load(void *arg, const struct residency_loaded *x,
                                struct sidecar_error *err)
{
	struct load_transform *t = arg;
	const struct forward_weights *w = t->w;
	if (w->mxfp4_hf && mxfp4_hf_after_load(t->hf, x, err) != 0)
		return -EINVAL;
	if (w->int4 && int4_after_load(t, x, err) != 0)
		return -EINVAL;
	if (w->side_in_slot &&
	    (w->sliced ? node_side_after_load(t, x, err) : side_after_load(t, x, err)) != 0)
		return -EINVAL;
	if (!w->decode.on)
		return 0;
	struct moek_expert shape;
	struct decode_piece p;
	if (weights_shape_view(w, x->layer, x->expert, &shape, err) != 0)
		return -EINVAL;
	loaded_piece(w, t->node, x, &shape, &p);
	return decode_layout_apply(&w->decode, &t->decode, &p, err) != 0 ? -EINVAL : 0;
}

static int open_files(const struct moe_catalog *cat, int **fds_out, struct sidecar_error *err)
{
	int *fds = malloc(cat->n_files * sizeof(int));
	if (!fds) {
		error_set(err, MOE_ENOMEM, "out of memory");
		return -1;
	}
	for (uint32_t i = 0; i < cat->n_files; i++) {
		fds[i] = open(cat->files[i].path, O_RDONLY | O_CLOEXEC);
		if (fds[i] < 0) {
			error_set(err, MOE_ESYS, "%s: %s", cat->files[i].path, strerror(errno));
			while (i-- > 0)
				close(fds[i]);
			free(fds);
			return -1;
		}
	}
	*fds_out = fds;
	return 0;
}

static void close_files(const struct moe_catalog *cat, int *fds)
{
	for (uint32_t i = 0; fds && i < cat->n_files; i++)
		close(fds[i]);
	free(fds);
}

static size_t align64(size_t v)
{
	return (v + 63) & ~(size_t)63;
}

/* Binds the pages of each node's rows of (moe_layer, expert) to that node: gate/up rows of its
 * intermediate range, down rows of its output range, the same split the pool runs (pages
 * straddling two nodes' rows stay with the first toucher). */
static void bind_rows(struct forward_topology *topo, uint32_t node, const struct moek_matrix *m,
                      size_t r0, size_t r1)
{
	const size_t page = 4096;
	const size_t stride = m->row_stride ? m->row_stride : moek_row_bytes(m->format, m->cols);
	uintptr_t a = (uintptr_t)m->data + r0 * stride, b = (uintptr_t)m->data + r1 * stride;
	a = (a + page - 1) & ~(uintptr_t)(page - 1);
	b &= ~(uintptr_t)(page - 1);
	if (b > a)
		topology_bind_area(topo, node, (void *)a, b - a);
}

static void bind_expert(struct forward_weights *w, struct forward_topology *topo, uint32_t l,
                        uint32_t e)
{
	struct moek_expert v;
	if (weights_static_view(w, l, e, &v, NULL) != 0)
		return;
	const size_t align = moek_expert_split_align(&v);
	size_t f[FORWARD_MAX_NODES + 1], o[FORWARD_MAX_NODES + 1];
	forward_split_range(v.gate.rows, align, topo->n_nodes, f);
	forward_split_range(v.down.rows, FORWARD_DOWN_ALIGN, topo->n_nodes, o);
	for (uint32_t n = 0; n < topo->n_nodes; n++) {
		bind_rows(topo, n, &v.gate, f[n], f[n + 1]);
		if (v.up.data != v.gate.data)
			bind_rows(topo, n, &v.up, f[n], f[n + 1]);
		bind_rows(topo, n, &v.down, o[n], o[n + 1]);
	}
}

/* Bytes a projection's matrix takes in memory in the layout the kernels read: Hugging Face
 * MXFP4 becomes GGUF blocks, as many bytes as its blocks and scales together. */
static uint64_t kernel_bytes(const struct moe_proj_ref *r)
{
	return moe_proj_kernel_bytes(r);
}

/* Rearranges the all-resident copy of (l, e) into the decode layout. */
static int decode_all_resident(struct forward_weights *w, struct decode_scratch *scratch,
                               uint32_t l, uint32_t e, struct sidecar_error *err)
{
	const struct moe_expert *x = moe_catalog_expert(w->cat, w->model_layer[l], e);
	uint8_t **d = (uint8_t **)&w->data[((size_t)l * w->n_experts + e) * MOE_PROJ_COUNT];
	struct moek_expert shape;
	if (weights_shape_view(w, l, e, &shape, err) != 0)
		return -1;
	const struct decode_piece p =
	    whole_piece(&shape, d[MOE_PROJ_GATE], d[MOE_PROJ_UP],
	                x->proj[MOE_PROJ_GATE_UP].present ? d[MOE_PROJ_GATE_UP] : NULL,
	                d[MOE_PROJ_DOWN], kernel_bytes(&x->proj[MOE_PROJ_DOWN]));
	struct sidecar_error why;
	if (decode_layout_apply(&w->decode, scratch, &p, &why) != 0) {
		error_set(err, MOE_EINVAL, "layer %u expert %u: %s", w->model_layer[l], e, why.msg);
		return -1;
	}
	return 0;
}

static int load_all_resident(struct forward_weights *w, const int *fds,
                             const struct forward_config *cfg, struct forward_topology *topo,
                             struct sidecar_error *err)
{
	const struct moe_catalog *cat = w->cat;
	size_t total = 0;
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[l], e);
			for (int p = 0; p < MOE_PROJ_COUNT; p++)
				if (x->proj[p].present)
					total += align64(kernel_bytes(&x->proj[p]));
		}
	w->resident_len = total ? total : 64;
	void *buf =
	    mmap(NULL, w->resident_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		error_set(err, MOE_ESYS, "all-resident weights: %zu bytes: %s", w->resident_len,
		          strerror(errno));
		return -1;
	}
	w->resident = buf;
	/* Transparent huge pages where the system grants them on request (THP "madvise"
	 * mode): decode streams a few MiB of scattered experts per layer, and 4 KiB pages make
	 * that a TLB miss per page, as the residency pool's advised pages avoid. A refusal only
	 * costs speed. */
	(void)madvise(buf, w->resident_len, MADV_HUGEPAGE);
	/* Lay every projection out first, so the node split can bind pages before they are
	 * touched; then read. */
	size_t at = 0;
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[l], e);
			for (int p = 0; p < MOE_PROJ_COUNT; p++)
				if (x->proj[p].present) {
					w->data[((size_t)l * w->n_experts + e) * MOE_PROJ_COUNT +
					        p] = w->resident + at;
					at += align64(kernel_bytes(&x->proj[p]));
				}
		}
	if (topo->memory_bound)
		for (uint32_t l = 0; l < w->n_moe_layers; l++)
			for (uint32_t e = 0; e < w->n_experts; e++)
				bind_expert(w, topo, l, e);
	const uint64_t n_ids = (uint64_t)w->n_moe_layers * w->n_experts;
	struct mxfp4_hf_converter conv = {0};
	if (w->mxfp4_hf && converter_init(w, &conv, err) != 0)
		return -1;
	struct decode_scratch scratch = {0};
	struct moek_expert shape;
	uint8_t *int4_buf = NULL;
	if (w->int4 && !(int4_buf = malloc(int4_scratch_bytes(w)))) {
		free(conv.scratch);
		error_set(err, MOE_ENOMEM, "INT4 repack scratch (%zu bytes): out of memory",
		          int4_scratch_bytes(w));
		return -1;
	}
	if (w->decode.on && (weights_shape_view(w, 0, 0, &shape, err) != 0 ||
	                     decode_scratch_init(&scratch, &shape, err) != 0)) {
		free(conv.scratch);
		free(int4_buf);
		return -1;
	}
	int rc = 0;
	for (uint32_t l = 0; l < w->n_moe_layers && rc == 0; l++)
		for (uint32_t e = 0; e < w->n_experts && rc == 0; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[l], e);
			for (int p = 0; p < MOE_PROJ_COUNT && rc == 0; p++) {
				const struct moe_proj_ref *r = &x->proj[p];
				if (!r->present)
					continue;
				uint8_t *dst =
				    (uint8_t *)w
				        ->data[((size_t)l * w->n_experts + e) * MOE_PROJ_COUNT + p];
				if (is_int4(r)) { /* the tensors into the scratch, rows into dst */
					const struct moe_extent *xs[3] = {&r->data, &r->scale,
					                                  &r->zeros};
					uint64_t used = 0;
					for (int k = 0; k < 3 && rc == 0; k++) {
						rc = read_exact(fds[xs[k]->file],
						                cat->files[xs[k]->file].path,
						                int4_buf + used, xs[k]->length,
						                xs[k]->offset, err);
						used += xs[k]->length;
					}
					struct sidecar_error why;
					if (rc == 0 && int4_repack(r, int4_buf, dst, &why)) {
						error_set(err, MOE_EINVAL,
						          "layer %u expert %u %s: %s",
						          w->model_layer[l], e,
						          moe_proj_name((enum moe_proj)p), why.msg);
						rc = -1;
					}
					continue;
				}
				rc = read_exact(fds[r->data.file], cat->files[r->data.file].path,
				                dst, r->data.length, r->data.offset, err);
				if (rc || r->layout != MOE_LAYOUT_MXFP4_HF)
					continue;
				/* the scales right behind the blocks, then both become GGUF blocks
				 */
				uint8_t *sc = dst + r->data.length;
				rc = read_exact(fds[r->scale.file], cat->files[r->scale.file].path,
				                sc, r->scale.length, r->scale.offset, err);
				struct sidecar_error why;
				if (rc == 0 &&
				    mxfp4_hf_convert(dst, r->data.length, sc, r->scale.length,
				                     conv.scratch, conv.scratch_len, &why)) {
					error_set(err, MOE_EINVAL, "layer %u expert %u %s: %s",
					          w->model_layer[l], e,
					          moe_proj_name((enum moe_proj)p), why.msg);
					rc = -1;
				}
			}
			if (rc == 0 && w->decode.on)
				rc = decode_all_resident(w, &scratch, l, e, err);
			if (rc == 0 && cfg->progress)
				cfg->progress(cfg->progress_arg, "loading experts",
				              (uint64_t)l * w->n_experts + e + 1, n_ids);
		}
	free(conv.scratch);
	free(int4_buf);
	decode_scratch_free(&scratch);
	w->budget_bytes = total;
	return rc;
}

static int map_files(struct forward_weights *w, struct sidecar_error *err)
{
	const struct moe_catalog *cat = w->cat;
	w->file_map = calloc(cat->n_files, sizeof(void *));
	w->file_map_len = calloc(cat->n_files, sizeof(size_t));
	if (!w->file_map || !w->file_map_len) {
		error_set(err, MOE_ENOMEM, "out of memory");
		return -1;
	}
	for (uint32_t i = 0; i < cat->n_files; i++) {
		int fd = open(cat->files[i].path, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			error_set(err, MOE_ESYS, "%s: %s", cat->files[i].path, strerror(errno));
			return -1;
		}
		size_t len = cat->files[i].size ? cat->files[i].size : 1;
		void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
		int saved = errno;
		close(fd);
		if (m == MAP_FAILED) {
			error_set(err, MOE_ESYS, "%s: mmap: %s", cat->files[i].path,
			          strerror(saved));
			return -1;
		}
		w->file_map[i] = m;
		w->file_map_len[i] = len;
	}
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[l], e);
			for (int p = 0; p < MOE_PROJ_COUNT; p++)
				if (x->proj[p].present)
					w->data[((size_t)l * w->n_experts + e) * MOE_PROJ_COUNT +
					        p] =
					    (const uint8_t *)w->file_map[x->proj[p].data.file] +
					    x->proj[p].data.offset;
		}
	w->budget_bytes = cat->expert_bytes_total;
	return 0;
}

/* Bytes of every extent in a map, plus pad_per_extent each: 0 for the map's share of the
 * model, 8192 for the slot bytes "every expert fits" needs (an extent's aligned superset may
 * add up to two 4 KiB blocks). */
static uint64_t map_bytes(const struct expert_map *map, uint64_t pad_per_extent)
{
	uint64_t total = 0;
	for (uint32_t id = 0; id < map->n_layers * map->n_experts; id++) {
		uint32_t n;
		const struct expert_extent *x = expert_map_extents(map, id, &n);
		for (uint32_t i = 0; i < n; i++)
			total += (x[i].room > x[i].length ? x[i].room : x[i].length) +
			         pad_per_extent; /* an INT4 repack's room */
	}
	return total;
}

/* With a budget that holds every expert, loads them all before the engine serves: at 100%
 * budget the first touch of each expert would otherwise be a cold read inside a request (and
 * the loader's I/O and completions would compete with compute for the cores for as long as
 * the trace keeps naming new experts). Every load is started first (the loader runs them at
 * full depth), then each is waited for. Not counted as demand (RESIDENCY_RETRY): hits, misses
 * and the policy's access history start with the first request. A failed read is logged and
 * put back to COLD, so only requests that name that expert see the error (read again on
 * demand). */
static void warm_all(struct forward_weights *w, const struct forward_config *cfg)
{
	const uint32_t total = w->n_moe_layers * w->n_experts;
	uint32_t done = 0, failed = 0;
	if (cfg->progress)
		cfg->progress(cfg->progress_arg, "warming every expert", 0, total);
	struct expert_ref ref;
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t l = 0; l < w->n_moe_layers; l++)
			for (uint32_t x = 0; x < w->n_experts; x++) {
				const unsigned flags =
				    RESIDENCY_RETRY | (pass == 0 ? RESIDENCY_NOWAIT : 0u);
				struct residency *res = w->res;
				const int rc = residency_acquire(res, l, x, -1.0f, flags, &ref);
				const bool ok = rc == 0;
				if (ok) {
					residency_release(res, &ref);
				} else if (pass == 1 && rc != -ESHUTDOWN && rc != -EPERM) {
					char why[160];
					residency_error_message(res, l, x, why, sizeof(why));
					if (failed++ < 8)
						log_warn(
						    "forward",
						    "warming layer %u expert %u: %s (left cold: "
						    "read again on demand)",
						    w->model_layer[l], x,
						    why[0] ? why : strerror(-rc));
					residency_retry_failed(res, l, x);
				}
				if (ok && pass == 1 && cfg->progress)
					cfg->progress(cfg->progress_arg, "warming every expert",
					              ++done, total);
			}
	if (failed)
		log_warn("forward", "warming: %u of %u expert loads failed", failed, total);
	if (cfg->progress && done != total)
		cfg->progress(cfg->progress_arg, "warming every expert", total, total);
}

/* The whole-expert view of (l, x) with placeholder data (shapes, formats and split only). */
int weights_shape_view(const struct forward_weights *w, uint32_t l, uint32_t x,
                       struct moek_expert *v, struct sidecar_error *err)
{
	static const float dummy[16];
	const uint8_t *d = (const uint8_t *)dummy;
	const uint8_t *data[MOE_PROJ_COUNT] = {d, d, d, d};
	if (weights_view(w, l, x, data, v, err) != 0)
		return -1;
	/* Scales held in the slot (side_in_slot) have no address until the expert is held: a
	 * stand-in, so that the view checks as the kernels will see it. */
	struct moek_matrix *mats[3] = {&v->gate, &v->up, &v->down};
	for (int i = 0; i < 3; i++)
		if (!mats[i]->scales && moek_format_scale_block(mats[i]->format))
			mats[i]->scales = dummy;
	return 0;
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

/* Whether every row of r lies in one run of its data (and scales) extent, row after row. */
static bool rows_contiguous(const struct moe_proj_ref *r)
{
	if (is_int4(r)) /* GPTQ packs along the input; node slices are not cut from either */
		return false;
	return r->data.length == r->rows * data_row_bytes(r) &&
	       (r->layout != MOE_LAYOUT_MXFP4_HF ||
	        r->scale.length == r->rows * scale_row_bytes(r));
}

/* Appends rows [r0, r1) of projection r to a node's map: the data rows, then (Hugging Face
 * MXFP4) the same rows of the scales, so the post-load conversion finds them adjacent. */
static int add_rows(struct expert_map *map, uint32_t l, uint32_t x, const struct moe_proj_ref *r,
                    uint64_t r0, uint64_t r1, struct sidecar_error *err)
{
	const uint64_t rb = data_row_bytes(r), sb = scale_row_bytes(r);
	struct sidecar_error e;
	int rc =
	    expert_map_add(map, l, x, r->data.file, r->data.offset + r0 * rb, (r1 - r0) * rb, &e);
	if (rc == 0 && sb)
		rc = expert_map_add(map, l, x, r->scale.file, r->scale.offset + r0 * sb,
		                    (r1 - r0) * sb, &e);
	if (rc)
		error_pass(err, &e);
	return rc;
}

/* The matrices whose side data (FP8 block scales, bias) a node's slice carries, as gate, up,
 * down: a fused gate_up stands for both gate and up. */
static void side_matrices(const struct moe_expert *ce, const struct moe_proj_ref *mats[3])
{
	const struct moe_proj_ref *gu = &ce->proj[MOE_PROJ_GATE_UP];
	mats[0] = gu->present ? gu : &ce->proj[MOE_PROJ_GATE];
	mats[1] = gu->present ? gu : &ce->proj[MOE_PROJ_UP];
	mats[2] = &ce->proj[MOE_PROJ_DOWN];
}

/* The pieces every node holds of an expert shaped like ce, in map order: separate gate, up,
 * down; fused interleaved gate_up, down; fused concatenated gate_up (its gate rows, its up
 * rows), down. Records where each piece's data (and scales) extent is. */
static void node_layout(struct forward_weights *w, const struct moe_expert *ce)
{
	const struct moe_proj_ref *gu = &ce->proj[MOE_PROJ_GATE_UP];
	const struct moe_proj_ref *pieces[3] = {&ce->proj[MOE_PROJ_GATE], &ce->proj[MOE_PROJ_UP],
	                                        &ce->proj[MOE_PROJ_DOWN]};
	w->node_pieces = 3;
	if (gu->present) {
		pieces[0] = pieces[1] = gu;
		if (gu->order == MOE_GATE_UP_INTERLEAVED) {
			pieces[1] = pieces[2];
			w->node_pieces = 2;
		}
	}
	uint32_t at = 0, pairs = 0;
	for (uint32_t i = 0; i < w->node_pieces; i++) {
		w->piece_data[i] = (uint8_t)at++;
		if (pieces[i]->layout == MOE_LAYOUT_MXFP4_HF) {
			for (uint32_t n = 0; n < FORWARD_MAX_NODES; n++) {
				w->hf_conv[n].blocks[pairs] = (uint8_t)(at - 1);
				w->hf_conv[n].scales[pairs] = (uint8_t)at;
			}
			pairs++;
			at++;
		}
	}
	/* then per matrix its FP8 block scales and its bias rows (a fused gate_up's bias: one
	 * extent when its rows alternate, else gate's then up's) */
	const struct moe_proj_ref *mats[3];
	side_matrices(ce, mats);
	w->node_bias_interleaved =
	    gu->present && gu->bias.length && gu->order == MOE_GATE_UP_INTERLEAVED;
	for (int i = 0; i < 3; i++) {
		w->node_scale[i] = w->node_bias[i] = -1;
		if (moek_format_scale_block(mats[i]->format) && mats[i]->scale.length)
			w->node_scale[i] = (int8_t)at++;
		if (!mats[i]->bias.length)
			continue;
		if (i == 1 && w->node_bias_interleaved)
			w->node_bias[1] = w->node_bias[0];
		else
			w->node_bias[i] = (int8_t)at++;
	}
	w->node_extents = at;
	for (uint32_t n = 0; n < FORWARD_MAX_NODES; n++)
		w->hf_conv[n].n_pairs = pairs;
}

/* Appends rows [r0, r1) of a side tensor (FP8 block scales: block rows; bias: rows) of
 * row_bytes each to a node's map, with room for them as f32 on a float boundary. */
static int add_side_rows(struct expert_map *map, uint32_t l, uint32_t x, const struct moe_extent *t,
                         uint64_t row_bytes, uint64_t r0, uint64_t r1, uint64_t f32_row_bytes,
                         struct sidecar_error *err)
{
	struct sidecar_error e;
	int rc = expert_map_add(map, l, x, t->file, t->offset + r0 * row_bytes,
	                        (r1 - r0) * row_bytes, &e);
	if (rc == 0)
		rc = expert_map_set_room(map, l, x, (r1 - r0) * f32_row_bytes + 3, &e);
	if (rc)
		error_pass(err, &e);
	return rc;
}

/* FP8 block scales of a matrix of `rows` x `cols`: bytes per block row, and whether the
 * tensor holds exactly its blocks (so that block rows can be cut). */
static uint64_t scale_block_row_bytes(const struct moe_proj_ref *r)
{
	return (r->cols + MOEK_FP8_BLOCK - 1) / MOEK_FP8_BLOCK * 4;
}

/* Adds node n's side data of expert (l, x) — matrix i's rows [r[i], r[i+1]) — to its map, in
 * node_layout's order: per matrix its FP8 block scales (the block rows its rows touch: a block
 * row straddling two nodes' rows is read by both), then its bias rows. Returns 0, 1 when the
 * tensors cannot be cut (why), or -1 (err). */
static int add_node_side(struct forward_weights *w, struct expert_map *m, uint32_t l, uint32_t x,
                         const struct moe_expert *ce, const uint64_t rows[3][2], char *why,
                         size_t why_len, struct sidecar_error *err)
{
	const struct moe_proj_ref *gu = &ce->proj[MOE_PROJ_GATE_UP];
	const struct moe_proj_ref *mats[3];
	side_matrices(ce, mats);
	for (int i = 0; i < 3; i++) {
		const struct moe_proj_ref *r = mats[i];
		const uint64_t r0 = rows[i][0], r1 = rows[i][1];
		if (w->node_scale[i] >= 0) {
			const uint64_t sb = scale_block_row_bytes(r);
			const uint64_t block_rows = (r->rows + MOEK_FP8_BLOCK - 1) / MOEK_FP8_BLOCK;
			if (r->scale.length != block_rows * sb) {
				snprintf(why, why_len,
				         "layer %u: FP8 scales of %llu bytes, not %llu",
				         w->model_layer[l], (unsigned long long)r->scale.length,
				         (unsigned long long)(block_rows * sb));
				return 1;
			}
			if (add_side_rows(m, l, x, &r->scale, sb, r0 / MOEK_FP8_BLOCK,
			                  (r1 + MOEK_FP8_BLOCK - 1) / MOEK_FP8_BLOCK, sb, err) != 0)
				return -1;
		}
		if (w->node_bias[i] < 0 || (i == 1 && w->node_bias_interleaved))
			continue;
		const uint64_t eb = bias_elem_bytes(r->bias_format);
		if (r->bias.length != r->rows * eb) {
			snprintf(why, why_len, "layer %u: a bias of %llu bytes, not %llu",
			         w->model_layer[l], (unsigned long long)r->bias.length,
			         (unsigned long long)(r->rows * eb));
			return 1;
		}
		uint64_t b0 = r0, b1 = r1; /* the bias rows of the matrix's rows */
		if (i < 2 && w->node_bias_interleaved) {
			b0 = 2 * r0;
			b1 = 2 * r1;
		} else if (i == 1 && gu->present) {
			b0 = r->rows / 2 + r0;
			b1 = r->rows / 2 + r1;
		}
		if (add_side_rows(m, l, x, &r->bias, eb, b0, b1, 4, err) != 0)
			return -1;
	}
	return 0;
}

/* Builds node_map[0..n_nodes): each node's rows of every expert, extents in the order
 * node_layout says (each data extent followed by its Hugging Face MXFP4 scales, if any; then
 * the same rows of the FP8 block scales and biases); interleaved gate_up rows are
 * [2 f_n, 2 f_n+1). Returns 0, 1 if the model cannot be sliced (why says why), or -1 (err). */
static int build_node_maps(struct forward_weights *w, uint32_t n_nodes, char *why, size_t why_len,
                           struct sidecar_error *err)
{
	const struct moe_catalog *cat = w->cat;
	const char **paths = malloc(cat->n_files * sizeof(char *));
	if (!paths) {
		error_set(err, MOE_ENOMEM, "node maps: out of memory");
		return -1;
	}
	for (uint32_t f = 0; f < cat->n_files; f++)
		paths[f] = cat->files[f].path;
	int rc = 0;
	struct sidecar_error e;
	for (uint32_t n = 0; n < n_nodes && rc == 0; n++)
		rc = expert_map_init(&w->node_map[n], w->n_moe_layers, w->n_experts, cat->n_files,
		                     paths, &e)
		         ? error_pass(err, &e)
		         : 0;
	free(paths);
	for (uint32_t l = 0; l < w->n_moe_layers && rc == 0; l++)
		for (uint32_t x = 0; x < w->n_experts && rc == 0; x++) {
			const struct moe_expert *ce = moe_catalog_expert(cat, w->model_layer[l], x);
			struct moek_expert v;
			if (weights_shape_view(w, l, x, &v, err) != 0)
				return -1;
			size_t f[FORWARD_MAX_NODES + 1], o[FORWARD_MAX_NODES + 1];
			forward_expert_split(&v, n_nodes, f, o);
			for (uint32_t n = 0; n < n_nodes; n++)
				if (f[n] == f[n + 1] || o[n] == o[n + 1]) {
					snprintf(
					    why, why_len,
					    "layer %u: %u intermediate / %u output rows do not "
					    "split over %u nodes (%zu-row units)",
					    w->model_layer[l], v.gate.rows, v.down.rows, n_nodes,
					    moek_expert_split_align(&v));
					return 1;
				}
			const struct moe_proj_ref *gu = &ce->proj[MOE_PROJ_GATE_UP];
			const struct moe_proj_ref *parts[3] = {&ce->proj[MOE_PROJ_GATE],
			                                       &ce->proj[MOE_PROJ_UP],
			                                       &ce->proj[MOE_PROJ_DOWN]};
			if (l == 0 && x == 0)
				node_layout(w, ce);
			for (int p = gu->present ? 2 : 0; p < 3; p++) {
				const struct moe_proj_ref *r = parts[p];
				if (!rows_contiguous(r)) {
					snprintf(why, why_len,
					         "layer %u %s: rows are not contiguous in the file",
					         w->model_layer[l],
					         moe_proj_name((enum moe_proj)p));
					return 1;
				}
			}
			if (gu->present && !rows_contiguous(gu)) {
				snprintf(why, why_len,
				         "layer %u gate_up: rows are not contiguous in the file",
				         w->model_layer[l]);
				return 1;
			}
			const uint64_t ffn = v.gate.rows;
			for (uint32_t n = 0; n < n_nodes && rc == 0; n++) {
				struct expert_map *m = &w->node_map[n];
				if (!gu->present) {
					for (int p = 0; p < 2 && rc == 0; p++)
						rc = add_rows(m, l, x, parts[p], f[n], f[n + 1],
						              err);
				} else if (gu->order == MOE_GATE_UP_INTERLEAVED) {
					rc = add_rows(m, l, x, gu, 2 * f[n], 2 * f[n + 1], err);
				} else {
					rc = add_rows(m, l, x, gu, f[n], f[n + 1], err);
					if (rc == 0)
						rc = add_rows(m, l, x, gu, ffn + f[n],
						              ffn + f[n + 1], err);
				}
				if (rc == 0)
					rc = add_rows(m, l, x, parts[2], o[n], o[n + 1], err);
				const uint64_t rows[3][2] = {
				    {f[n], f[n + 1]}, {f[n], f[n + 1]}, {o[n], o[n + 1]}};
				if (rc == 0)
					rc = add_node_side(w, m, l, x, ce, rows, why, why_len, err);
				if (rc == 1)
					return 1;
			}
			if (rc)
				return -1;
		}
	return rc;
}

static void free_node_maps(struct forward_weights *w)
{
	for (uint32_t n = 0; n < FORWARD_MAX_NODES; n++)
		if (w->node_map[n].n_extents)
			expert_map_free(&w->node_map[n]);
}

/* The whole-expert map (catalog order: per projection data, scales, bias): which extents the
 * post-load conversion pairs up. The scales must directly follow the blocks. */
static int whole_map_pairs(struct forward_weights *w, struct sidecar_error *err)
{
	const struct moe_expert *x = moe_catalog_expert(w->cat, w->model_layer[0], 0);
	struct mxfp4_hf_converter *c = &w->hf_conv[0];
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

/* RESIDENCY, first part: the expert maps (whole, or each node's slices) and the per-residency
 * load transforms. The pools come later (weights_start_residency), once the engine knows what
 * memory its request buffers leave them. */
static int open_residency_maps(struct forward_weights *w, struct forward_topology *topo,
                               struct sidecar_error *err)
{
	w->n_nodes = topo->n_nodes;
	w->n_res = 1;
	if (topo->n_nodes > 1) {
		char why[200] = "";
		int rc = build_node_maps(w, topo->n_nodes, why, sizeof(why), err);
		if (rc < 0)
			return -1;
		if (rc == 0) {
			w->sliced = true;
			w->n_res = topo->n_nodes;
		} else {
			free_node_maps(w);
			log_warn("forward",
			         "residency: one slot pool for all %u nodes, not bound to any "
			         "(each node's slices cannot be cut: %s)",
			         topo->n_nodes, why);
		}
	}
	struct sidecar_error e;
	if (!w->sliced && expert_map_from_catalog(w->cat, &w->map, &w->roles, NULL, &e) != 0)
		return error_pass(err, &e);
	if (w->mxfp4_hf && !w->sliced && whole_map_pairs(w, err) != 0)
		return -1;
	for (uint32_t n = 0; w->mxfp4_hf && n < w->n_res; n++)
		if (converter_init(w, &w->hf_conv[n], err) != 0)
			return -1;
	for (uint32_t n = 0; n < w->n_res; n++) {
		w->transform[n] = (struct load_transform){.w = w, .node = n, .hf = &w->hf_conv[n]};
		if (w->side_in_slot) {
			const size_t rows = 2 * (size_t)w->cat->info.expert_ffn +
			                    (size_t)w->cat->info.hidden; /* any bias's rows */
			w->transform[n].side_scratch = malloc(rows * sizeof(float));
			if (!w->transform[n].side_scratch)
				return error_set(err, MOE_ENOMEM,
				                 "bias scratch (%zu bytes): out of memory",
				                 rows * sizeof(float));
		}
		if (w->int4) {
			w->transform[n].int4_scratch_len = int4_scratch_bytes(w);
			w->transform[n].int4_scratch = malloc(w->transform[n].int4_scratch_len);
			if (!w->transform[n].int4_scratch) {
				error_set(err, MOE_ENOMEM,
				          "INT4 repack scratch (%zu bytes): out of memory",
				          w->transform[n].int4_scratch_len);
				return -1;
			}
		}
		struct moek_expert shape;
		if (w->decode.on &&
		    (weights_shape_view(w, 0, 0, &shape, err) != 0 ||
		     decode_scratch_init(&w->transform[n].decode, &shape, err) != 0))
			return -1;
	}
	return 0;
}

uint64_t weights_every_expert_bytes(const struct forward_weights *w)
{
	uint64_t total = 0;
	for (uint32_t n = 0; n < w->n_res; n++)
		total += map_bytes(w->sliced ? &w->node_map[n] : &w->map, 8192u);
	return total;
}

int weights_start_residency(struct forward_weights *w, const struct forward_config *cfg,
                            struct forward_topology *topo, struct sidecar_error *err)
{
	char policy[128];
	const char *base = cfg->policy ? cfg->policy : POLICY_DEFAULT_SPEC;
	if (cfg->pin_layers && !strstr(base, "+pin"))
		snprintf(policy, sizeof(policy), "%s+pin%u", base, cfg->pin_layers);
	else
		snprintf(policy, sizeof(policy), "%s", base);
	/* One part per node when sliced (the residency splits the budget over them in
	 * proportion to their slices), else one part of whole experts. */
	struct residency_node parts[FORWARD_MAX_NODES];
	uint64_t every = 0; /* the budget that holds every expert */
	for (uint32_t n = 0; n < w->n_res; n++) {
		const struct expert_map *map = w->sliced ? &w->node_map[n] : &w->map;
		int node = -1; /* one pool for several nodes: not bound */
		if (w->sliced)
			node = topo->memory_bound ? (int)topo->nodes[n].os_index : -1;
		else if (topo->n_nodes == 1 && !topo->synthetic)
			node = (int)topo->nodes[0].os_index;
		parts[n] = (struct residency_node){
		    .map = map, .numa_node = node, .post_load_arg = &w->transform[n]};
		every += map_bytes(map, 8192u);
	}
	struct residency_config rc = {
	    .mem_budget = cfg->mem_budget ? cfg->mem_budget : every,
	    .policy = policy,
	    .chunk_bytes = cfg->chunk_bytes,
	    .queue_depth = cfg->queue_depth,
	    .no_direct = cfg->no_direct,
	    .retry_backoff_ms = cfg->retry_backoff_ms,
	    .retry_backoff_max_ms = cfg->retry_backoff_max_ms,
	    .post_load = w->mxfp4_hf || w->int4 || w->decode.on || w->side_in_slot
	                     ? transform_after_load
	                     : NULL,
	};
	struct sidecar_error why = {0};
	if (residency_create_nodes(&w->res, parts, w->n_res, &rc, &why) != 0)
		return error_set(err, MOE_EINVAL, "%s", why.msg);
	if (w->fault_hook) /* before the warm-up's first read */
		residency_set_fault_hook(w->res, w->fault_hook, w->fault_arg);
	w->budget_bytes = rc.mem_budget;
	/* The budget in force, as STATS reports it (every expert fitting: the pools' slot bytes,
	 * a little above the experts' own), before any expert is read. */
	struct residency_counters c;
	residency_counters(w->res, &c);
	log_info("forward",
	         "residency budget_bytes=%llu slots=%u slot_bytes=%llu pool_bytes=%llu nodes=%u "
	         "policy=%s",
	         (unsigned long long)w->budget_bytes, c.slots, (unsigned long long)c.slot_bytes,
	         (unsigned long long)((uint64_t)c.slots * c.slot_bytes), w->n_res, policy);
	if (cfg->pin_layers) {
		if (cfg->progress)
			cfg->progress(cfg->progress_arg, "warming pinned layers", 0,
			              cfg->pin_layers);
		struct sidecar_error e;
		if (residency_warm_pinned(w->res, &e) != 0)
			return error_pass(err, &e);
		if (cfg->progress)
			cfg->progress(cfg->progress_arg, "warming pinned layers", cfg->pin_layers,
			              cfg->pin_layers);
	}
	if (!cfg->mem_budget && !cfg->lazy_load)
		warm_all(w, cfg);
	return 0;
}

int weights_open(struct forward_weights *w, const struct moe_catalog *cat,
                 const struct forward_config *cfg, struct forward_topology *topo,
                 struct sidecar_error *err)
{
	memset(w, 0, sizeof(*w));
	w->source = cfg->source;
	w->cat = cat;
	w->n_moe_layers = cat->info.n_moe_layers;
	w->n_experts = cat->info.n_experts;
	if (check_supported(w, cat, cfg->source, err))
		return -1;
	w->model_layer = calloc(w->n_moe_layers ? w->n_moe_layers : 1, sizeof(uint32_t));
	w->moe_index = calloc(cat->info.n_layers ? cat->info.n_layers : 1, sizeof(int32_t));
	if (!w->model_layer || !w->moe_index) {
		error_set(err, MOE_ENOMEM, "out of memory");
		return -1;
	}
	uint32_t m = 0;
	for (uint32_t l = 0; l < cat->info.n_layers; l++) {
		w->moe_index[l] = cat->layers[l].moe && m < w->n_moe_layers ? (int32_t)m : -1;
		if (w->moe_index[l] >= 0)
			w->model_layer[m++] = l;
	}
	int *fds = NULL;
	if (open_files(cat, &fds, err))
		return -1;
	/* The residency holds each expert's side data with its rows, converted on the loader
	 * (side_after_load; sliced: each node's rows of it, node_side_after_load); the other
	 * sources take it converted once from aux. */
	w->side_in_slot = cfg->source == FORWARD_SOURCE_RESIDENCY;
	int rc = w->side_in_slot ? 0 : load_aux(w, fds, err);
	if (rc == 0)
		rc = build_templates(w, err);
	if (rc == 0 && w->n_moe_layers) { /* the decode layout: the views below are built for it */
		struct moek_expert shape;
		rc = weights_shape_view(w, 0, 0, &shape, err);
		if (rc == 0)
			decode_layout_plan(&w->decode,
			                   moe_catalog_expert(cat, w->model_layer[0], 0), &shape,
			                   !cfg->file_layout && cfg->source != FORWARD_SOURCE_MMAP);
	}
	if (rc == 0 && cfg->source != FORWARD_SOURCE_RESIDENCY) {
		size_t n = (size_t)w->n_moe_layers * w->n_experts * MOE_PROJ_COUNT;
		w->data = calloc(n ? n : 1, sizeof(*w->data));
		if (!w->data) {
			error_set(err, MOE_ENOMEM, "out of memory");
			rc = -1;
		}
	}
	if (rc == 0 && cfg->source == FORWARD_SOURCE_ALL_RESIDENT)
		rc = load_all_resident(w, fds, cfg, topo, err);
	close_files(cat, fds);
	if (rc)
		return -1;
	if (cfg->source == FORWARD_SOURCE_MMAP)
		return map_files(w, err);
	if (cfg->source == FORWARD_SOURCE_RESIDENCY)
		return open_residency_maps(w, topo, err);
	return 0;
}

void weights_close(struct forward_weights *w)
{
	if (w->res)
		residency_destroy(w->res);
	free_node_maps(w);
	if (w->map.n_extents)
		expert_map_free(&w->map);
	for (uint32_t n = 0; n < FORWARD_MAX_NODES; n++) {
		free(w->hf_conv[n].scratch);
		free(w->transform[n].int4_scratch);
		free(w->transform[n].side_scratch);
		decode_scratch_free(&w->transform[n].decode);
	}
	if (w->resident)
		munmap(w->resident, w->resident_len);
	for (uint32_t i = 0; w->file_map && i < w->cat->n_files; i++)
		if (w->file_map[i])
			munmap(w->file_map[i], w->file_map_len[i]);
	free(w->file_map);
	free(w->file_map_len);
	free(w->data);
	free(w->aux);
	free(w->aux_index);
	free(w->templates);
	free(w->model_layer);
	free(w->moe_index);
	memset(w, 0, sizeof(*w));
}

static void matrix_of(const struct moe_proj_ref *r, const uint8_t *data, struct moek_matrix *m)
{
	m->format = r->format;
	m->rows = (uint32_t)r->rows;
	m->cols = (uint32_t)r->cols;
	m->data = data;
	m->row_stride = 0;
}

/* Describes (moe_layer, expert) once, from the catalog and its side data: formats, shapes,
 * strides, scales and biases, and where each matrix's rows start in the data of its tensor
 * (weights_view adds the data pointers). */
static void expert_template(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                            struct expert_template *t)
{
	const struct moe_catalog *cat = w->cat;
	const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[moe_layer], expert);
	const struct expert_aux *a =
	    w->aux_index ? &w->aux_index[(size_t)moe_layer * w->n_experts + expert] : NULL;
	struct moek_expert *v = &t->view;
	memset(t, 0, sizeof(*t));
	if (cat->info.swiglu_limit > 0) {
		v->activation = MOEK_SWIGLU_OAI;
		v->limit = cat->info.swiglu_limit;
		v->alpha = MOEK_SWIGLU_OAI_ALPHA;
	}
	const struct moe_proj_ref *fused = &x->proj[MOE_PROJ_GATE_UP];
	if (fused->present) {
		const size_t rb = moek_row_bytes(fused->format, fused->cols);
		const uint64_t ffn = fused->rows / 2;
		matrix_of(fused, NULL, &v->gate);
		matrix_of(fused, NULL, &v->up);
		v->gate.rows = v->up.rows = (uint32_t)ffn;
		t->source[0] = t->source[1] = MOE_PROJ_GATE_UP;
		if (fused->order == MOE_GATE_UP_INTERLEAVED) {
			t->up_offset = rb;
			v->gate.row_stride = v->up.row_stride = 2 * rb;
		} else {
			t->up_offset = ffn * rb;
		}
	} else {
		matrix_of(&x->proj[MOE_PROJ_GATE], NULL, &v->gate);
		matrix_of(&x->proj[MOE_PROJ_UP], NULL, &v->up);
		t->source[0] = MOE_PROJ_GATE;
		t->source[1] = MOE_PROJ_UP;
	}
	matrix_of(&x->proj[MOE_PROJ_DOWN], NULL, &v->down);
	t->source[2] = MOE_PROJ_DOWN;
	struct moek_matrix *mats[3] = {&v->gate, &v->up, &v->down};
	for (int i = 0; a && i < 3; i++) {
		if (a->scale[i] != AUX_NONE)
			mats[i]->scales = &w->aux[a->scale[i]];
		if (a->bias[i] != AUX_NONE)
			mats[i]->bias = &w->aux[a->bias[i]];
	}
}

static int build_templates(struct forward_weights *w, struct sidecar_error *err)
{
	const size_t n = (size_t)w->n_moe_layers * w->n_experts;
	w->templates = malloc((n ? n : 1) * sizeof(*w->templates));
	if (!w->templates)
		return error_set(err, MOE_ENOMEM, "expert views (%zu bytes): out of memory",
		                 n * sizeof(*w->templates));
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t x = 0; x < w->n_experts; x++)
			expert_template(w, l, x, &w->templates[(size_t)l * w->n_experts + x]);
	return 0;
}

int weights_view(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                 const uint8_t *const data[MOE_PROJ_COUNT], struct moek_expert *v,
                 struct sidecar_error *err)
{
	const struct expert_template *t = &w->templates[(size_t)moe_layer * w->n_experts + expert];
	*v = t->view;
	struct moek_matrix *mats[3] = {&v->gate, &v->up, &v->down};
	for (int i = 0; i < 3; i++) {
		const uint8_t *d = data[t->source[i]];
		if (!d) {
			error_set(err, MOE_EINVAL, "layer %u expert %u: %s weights missing",
			          w->model_layer[moe_layer], expert,
			          moe_proj_name((enum moe_proj)i));
			return -1;
		}
		mats[i]->data = i == 1 && t->source[1] == MOE_PROJ_GATE_UP ? d + t->up_offset : d;
	}
	decode_layout_view(&w->decode, v);
	return 0;
}

int weights_static_view(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                        struct moek_expert *v, struct sidecar_error *err)
{
	return weights_view(w, moe_layer, expert,
	                    &w->data[((size_t)moe_layer * w->n_experts + expert) * MOE_PROJ_COUNT],
	                    v, err);
}

/* The view of node n's slices (extents in build_node_maps order): weights_view's shapes,
 * formats and side data, with the data of node n's rows and row0 = f_n / o_n. */
static int node_view(const struct forward_weights *w, uint32_t n, const struct expert_ref *ref,
                     struct moek_expert *v, struct sidecar_error *err)
{
	const struct expert_template *t =
	    &w->templates[(size_t)ref->layer * w->n_experts + ref->expert];
	if (ref->n_extents != w->node_extents) {
		error_set(
		    err, MOE_EINVAL, "layer %u expert %u: node %u holds %u extents, expected %u",
		    w->model_layer[ref->layer], ref->expert, n, ref->n_extents, w->node_extents);
		return -1;
	}
	if (weights_shape_view(w, ref->layer, ref->expert, v, err) != 0)
		return -1;
	size_t f[FORWARD_MAX_NODES + 1], o[FORWARD_MAX_NODES + 1];
	forward_expert_split(v, w->n_nodes, f, o);
	const uint8_t *const *d = ref->data;
	if (w->node_pieces == 2) { /* interleaved gate_up: gate rows even, up odd (2-row stride) */
		v->gate.data = d[w->piece_data[0]];
		v->up.data = d[w->piece_data[0]] + t->up_offset;
	} else {
		v->gate.data = d[w->piece_data[0]];
		v->up.data = d[w->piece_data[1]];
	}
	v->down.data = d[w->piece_data[w->node_pieces - 1]];
	v->gate.row0 = v->up.row0 = (uint32_t)f[n];
	v->down.row0 = (uint32_t)o[n];
	/* Side data in the node's slot (node_side_after_load): the kernels index scales and
	 * biases by the global row, so each pointer is set back by the rows the node lacks. */
	struct moek_matrix *mats[3] = {&v->gate, &v->up, &v->down};
	for (int i = 0; i < 3; i++) {
		const size_t r0 = i < 2 ? f[n] : o[n];
		if (w->node_scale[i] >= 0) {
			const size_t stride =
			    mats[i]->scale_stride
			        ? mats[i]->scale_stride
			        : (mats[i]->cols + MOEK_FP8_BLOCK - 1) / MOEK_FP8_BLOCK;
			mats[i]->scales =
			    held_side_rows(d[w->node_scale[i]]) - r0 / MOEK_FP8_BLOCK * stride;
		}
		if (w->node_bias[i] >= 0)
			mats[i]->bias = held_side_rows(d[w->node_bias[i]]) - r0 +
			                (i == 1 && w->node_bias_interleaved ? f[n + 1] - f[n] : 0);
	}
	decode_layout_view(&w->decode, v);
	return 0;
}

int weights_held_view(const struct forward_weights *w, struct held_expert *h,
                      struct sidecar_error *err)
{
	if (w->sliced) {
		for (uint32_t n = 0; n < w->n_res; n++) {
			struct expert_ref ref;
			if (residency_ref_node(w->res, &h->ref, n, &ref) != 0 ||
			    node_view(w, n, &ref, &h->node_view[n], err) != 0)
				return error_set(err, MOE_EINVAL, "layer %u expert %u: node %u: %s",
				                 w->model_layer[h->ref.layer], h->ref.expert, n,
				                 err->msg);
		}
		h->view = h->node_view[0];
		return 0;
	}
	const struct expert_ref *ref = &h->ref;
	const uint8_t *data[MOE_PROJ_COUNT] = {0};
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		int8_t i = w->roles.data[p];
		if (i >= 0 && (uint32_t)i < ref->n_extents)
			data[p] = ref->data[i];
	}
	if (weights_view(w, ref->layer, ref->expert, data, &h->view, err) != 0)
		return -1;
	if (w->side_in_slot)
		side_view(w, ref, &w->templates[(size_t)ref->layer * w->n_experts + ref->expert],
		          &h->view);
	return 0;
}

void weights_release(const struct forward_weights *w, struct held_expert *h)
{
	if (h->held)
		residency_release(w->res, &h->ref);
	h->held = false;
}

uint64_t weights_res_bytes(const struct forward_weights *w, uint32_t node, uint32_t moe_layer,
                           uint32_t expert)
{
	const struct expert_map *map = w->sliced ? &w->node_map[node] : &w->map;
	uint32_t n;
	const struct expert_extent *x =
	    expert_map_extents(map, moe_layer * w->n_experts + expert, &n);
	uint64_t total = 0;
	for (uint32_t i = 0; i < n; i++)
		total += x[i].length;
	return total;
}

/* ---- The scheduler's interface ---------------------------------------------------------- */

int weights_demand(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert, bool wait,
                   struct held_expert *h, enum weights_found *found, uint64_t *cold_bytes,
                   struct sidecar_error *err)
{
	*found = WEIGHTS_NOT_YET;
	*cold_bytes = 0;
	if (w->source != FORWARD_SOURCE_RESIDENCY) {
		if (weights_static_view(w, moe_layer, expert, &h->view, err) != 0)
			return -EINVAL;
		*found = WEIGHTS_HIT;
		return 1;
	}
	if (!h->held) {
		const enum expert_state pre = residency_state(w->res, moe_layer, expert);
		const unsigned flags =
		    (wait ? 0u : RESIDENCY_NOWAIT) | (h->counted ? RESIDENCY_RETRY : 0u);
		const int rc = residency_acquire(w->res, moe_layer, expert, -1.0f, flags, &h->ref);
		if (!h->counted && (rc == 0 || rc == -EINPROGRESS)) {
			h->counted = true;
			*found = pre == EXPERT_RESIDENT  ? WEIGHTS_HIT
			         : pre == EXPERT_LOADING ? WEIGHTS_IN_FLIGHT
			                                 : WEIGHTS_COLD;
			for (uint32_t n = 0; *found == WEIGHTS_COLD && n < w->n_res; n++)
				*cold_bytes += weights_res_bytes(w, n, moe_layer, expert);
		}
		if (rc == -EINPROGRESS || rc == -EAGAIN)
			return 0;
		if (rc != 0)
			return rc;
		h->held = true;
	}
	if (weights_held_view(w, h, err) != 0)
		return -EINVAL;
	return 1;
}

void weights_error_message(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                           char *buf, size_t len)
{
	buf[0] = '\0';
	if (w->source == FORWARD_SOURCE_RESIDENCY)
		residency_error_message(w->res, moe_layer, expert, buf, len);
}

bool weights_ready(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert)
{
	if (w->source == FORWARD_SOURCE_ALL_RESIDENT)
		return true;
	return w->source == FORWARD_SOURCE_RESIDENCY &&
	       residency_state(w->res, moe_layer, expert) == EXPERT_RESIDENT;
}

bool weights_cold(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert)
{
	return w->source == FORWARD_SOURCE_RESIDENCY &&
	       residency_state(w->res, moe_layer, expert) == EXPERT_COLD;
}

void weights_hint(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert, float pri)
{
	if (w->source == FORWARD_SOURCE_RESIDENCY)
		residency_hint(w->res, moe_layer, &expert, 1, pri);
}

bool weights_prefetch(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                      float pri)
{
	return w->source == FORWARD_SOURCE_RESIDENCY &&
	       residency_prefetch(w->res, moe_layer, &expert, 1, pri) > 0;
}

void weights_set_gpu_mask(const struct forward_weights *w, uint32_t moe_layer, const uint8_t *mask)
{
	if (w->source == FORWARD_SOURCE_RESIDENCY)
		residency_set_gpu_mask(w->res, moe_layer, mask);
}

uint32_t weights_retry_failed(const struct forward_weights *w)
{
	return w->source == FORWARD_SOURCE_RESIDENCY ? residency_retry_all_failed(w->res) : 0;
}

int weights_node_counters(const struct forward_weights *w, uint32_t node,
                          struct residency_counters *out)
{
	if (w->source != FORWARD_SOURCE_RESIDENCY)
		return -1;
	return residency_node_counters(w->res, node, out);
}

void weights_counters(const struct forward_weights *w, struct forward_stats *out)
{
	if (w->source != FORWARD_SOURCE_RESIDENCY) {
		out->resident_bytes =
		    w->source == FORWARD_SOURCE_ALL_RESIDENT ? w->budget_bytes : 0;
		out->slot_bytes_used = out->pool_bytes = out->resident_bytes;
		out->budget_bytes = w->budget_bytes;
		return;
	}
	struct residency_counters all;
	residency_counters(w->res, &all);
	out->resident_bytes = all.resident_bytes;
	out->slot_bytes_used = (uint64_t)all.slots_used * all.slot_bytes;
	out->pool_bytes = (uint64_t)all.slots * all.slot_bytes;
	out->budget_bytes = all.budget_bytes;
	out->slots = all.slots;
	out->evictions = all.evictions;
	out->loader_bytes_read = all.bytes_read;
	out->prefetches = all.prefetches;
	out->prefetch_hits = all.prefetch_hits;
	out->prefetch_wasted = all.prefetch_wasted;
	out->failed_experts = all.failed_now;
	out->failed_retries = all.failed_retries;
	out->fixed_reads = all.fixed_reads;
	out->plain_reads = all.plain_reads;
	out->fixed_buffers = all.fixed_buffers;
	out->pool_hugetlb = all.hugetlb;
	out->pool_thp = all.thp;
	out->n_nodes = w->n_res;
	for (uint32_t n = 0; n < w->n_res; n++) {
		struct residency_counters rc;
		residency_node_counters(w->res, n, &rc);
		out->nodes[n] = (struct forward_node_stats){
		    .node = n,
		    .resident_bytes = rc.resident_bytes,
		    .slot_bytes_used = (uint64_t)rc.slots_used * rc.slot_bytes,
		    .budget_bytes = rc.budget_bytes,
		    .slots = rc.slots,
		    .slots_used = rc.slots_used,
		    .hits = rc.hits,
		    .cold_misses = rc.cold_misses,
		    .inflight_misses = rc.inflight_misses,
		    .loader_bytes_read = rc.bytes_read,
		    .evictions = rc.evictions,
		    .failed_experts = rc.failed_now,
		};
	}
}
