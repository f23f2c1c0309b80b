/* expert_view.c — each expert described once, at open, and its kernel views.
 *
 * The template of an expert (expert_view.h) holds everything of its view that does not depend
 * on where its bytes are: formats, shapes, strides (the decode layout's too), side data when
 * it lives in aux, and the tensor each matrix's rows come from. A view adds the data pointers
 * of the source holding the expert: the static sources' per-projection pointers, a held
 * slot's extents, or (sliced) each node's slices with their first rows.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expert_view.h"
#include "topology.h"

static void matrix_of(const struct moe_proj_ref *r, const uint8_t *data, struct moek_matrix *m)
{
	m->format = r->format;
	m->rows = (uint32_t)r->rows;
	m->cols = (uint32_t)r->cols;
	m->data = data;
	m->row_stride = 0;
	m->tensor_scale = r->tensor_scale; /* ModelOpt NVFP4's weight_scale_2; else 0 */
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
	v->weight_on_input = cat->info.weight_on_input;
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

/* The decode layout and the node split, once per expert: the rearranged strides and interleave
 * and where up starts after gate (decode_layout_template) and forward_expert_split. */
static void template_finish(const struct forward_weights *w, struct expert_template *t)
{
	struct moek_expert *v = &t->view;
	t->decode_up = decode_layout_template(&w->decode, v);
	t->decoded = w->decode.on;
	forward_expert_split(v, w->n_nodes, t->f_split, t->o_split);
	t->f_align = moek_expert_split_align(v);
	t->h_align = moek_ffn_hidden_align(v);
}

int expert_templates_build(struct forward_weights *w, bool decode, struct sidecar_error *err)
{
	const size_t n = (size_t)w->n_moe_layers * w->n_experts;
	w->templates = malloc((n ? n : 1) * sizeof(*w->templates));
	if (!w->templates)
		return error_set(err, MOE_ENOMEM, "expert views (%zu bytes): out of memory",
		                 n * sizeof(*w->templates));
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t x = 0; x < w->n_experts; x++)
			expert_template(w, l, x, &w->templates[(size_t)l * w->n_experts + x]);
	if (!w->n_moe_layers)
		return 0;
	struct moek_expert shape; /* the decode layout is planned on the files' layout */
	if (weights_shape_view(w, 0, 0, &shape, err) != 0)
		return -1;
	decode_layout_plan(&w->decode, moe_catalog_expert(w->cat, w->model_layer[0], 0), &shape,
	                   decode);
	for (size_t i = 0; i < n; i++)
		template_finish(w, &w->templates[i]);
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
	if (t->decoded)
		v->up.data = v->gate.data + t->decode_up;
	return 0;
}

int weights_static_view(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                        struct moek_expert *v, struct sidecar_error *err)
{
	return weights_view(w, moe_layer, expert,
	                    &w->data[((size_t)moe_layer * w->n_experts + expert) * MOE_PROJ_COUNT],
	                    v, err);
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
	const size_t *f = t->f_split, *o = t->o_split;
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
	if (t->decoded)
		v->up.data = v->gate.data + t->decode_up;
	return 0;
}

/* The whole-expert view of a held slot (not sliced): data and, side_in_slot, scales and
 * biases from the slot. */
static int slot_view(const struct forward_weights *w, const struct expert_ref *ref,
                     struct moek_expert *v, struct sidecar_error *err)
{
	const uint8_t *data[MOE_PROJ_COUNT] = {0};
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		int8_t i = w->roles.data[p];
		if (i >= 0 && (uint32_t)i < ref->n_extents)
			data[p] = ref->data[i];
	}
	if (weights_view(w, ref->layer, ref->expert, data, v, err) != 0)
		return -1;
	if (w->side_in_slot)
		side_view(w, ref, &w->templates[(size_t)ref->layer * w->n_experts + ref->expert],
		          v);
	return 0;
}

int expert_held_view(const struct forward_weights *w, struct held_expert *h,
                     struct sidecar_error *err)
{
	const struct expert_ref *held = &h->hold.ref;
	h->tp = &w->templates[(size_t)held->layer * w->n_experts + held->expert];
	if (!w->sliced)
		return slot_view(w, held, &h->view, err);
	for (uint32_t n = 0; n < w->n_res; n++) {
		struct expert_ref ref;
		char where[64];
		snprintf(where, sizeof(where), "layer %u expert %u: node %u",
		         w->model_layer[held->layer], held->expert, n);
		if (residency_ref_node(w->res, held, n, &ref) != 0)
			return error_set(err, MOE_EINVAL, "%s: no such node part", where);
		if (node_view(w, n, &ref, &h->node_view[n], err) != 0)
			return error_prefix(err, where);
	}
	h->view = h->node_view[0];
	return 0;
}

int expert_layer_views(const struct forward_weights *w, struct held_expert *held, uint32_t n,
                       uint32_t *ready, uint32_t *failed, struct sidecar_error *err)
{
	for (uint32_t i = 0; i < n; i++) {
		struct held_expert *h = &held[i];
		if (!h->hold.held || !h->hold.pending)
			continue;
		if (expert_held_view(w, h, err) != 0) {
			*failed = i;
			return -1;
		}
		h->hold.pending = false;
		(*ready)++;
	}
	return 0;
}
