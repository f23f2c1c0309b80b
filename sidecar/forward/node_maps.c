/* node_maps.c — the RESIDENCY's maps when experts are sliced over NUMA nodes: each node's
 * rows of every expert as sub-extents of the files.
 *
 * Node n holds gate/up rows [f_n, f_n+1) and down rows [o_n, o_n+1) of every expert (the
 * split the pool runs, forward_expert_split), then the same rows of their biases and the FP8
 * block rows of scales those rows touch (a block row straddling two nodes' rows is the one
 * thing read by both). Where a layout's rows can be cut, and what a row weighs in the file,
 * is the transforms' to say (transform_row_bytes); a layout that cannot be cut so keeps one
 * unbound pool of whole experts (weights.c logs why).
 */
#include <stdio.h>
#include <stdlib.h>

#include "weights.h"

/* Appends rows [r0, r1) of projection r to a node's map: the data rows, then (Hugging Face
 * MXFP4) the same rows of the scales, so the post-load conversion finds them adjacent. */
static int add_rows(struct expert_map *map, uint32_t l, uint32_t x, const struct moe_proj_ref *r,
                    uint64_t r0, uint64_t r1, struct sidecar_error *err)
{
	uint64_t rb, sb;
	(void)transform_row_bytes(r, &rb, &sb); /* build_node_maps checked that rows cut */
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
	uint32_t at = 0;
	for (uint32_t i = 0; i < w->node_pieces; i++) {
		w->piece_data[i] = (uint8_t)at++;
		uint64_t rb, sb;
		(void)transform_row_bytes(pieces[i], &rb, &sb);
		if (sb) { /* a paired scales extent, folded into the data by the transforms */
			transforms_add_pair(w, (uint8_t)(at - 1), (uint8_t)at);
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
int node_maps_build(struct forward_weights *w, uint32_t n_nodes, char *why, size_t why_len,
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
				uint64_t rb, sb;
				if (!transform_row_bytes(r, &rb, &sb)) {
					snprintf(why, why_len,
					         "layer %u %s: rows are not contiguous in the file",
					         w->model_layer[l],
					         moe_proj_name((enum moe_proj)p));
					return 1;
				}
			}
			uint64_t rb, sb;
			if (gu->present && !transform_row_bytes(gu, &rb, &sb)) {
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

void node_maps_free(struct forward_weights *w)
{
	for (uint32_t n = 0; n < FORWARD_MAX_NODES; n++)
		if (w->node_map[n].n_extents)
			expert_map_free(&w->node_map[n]);
}
