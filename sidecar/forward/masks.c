/* masks.c — what the engine is told besides FORWARDs: prefetch hints, the GPU masks of each
 * client (their intersection goes to the weights), attached clients, retries of failed
 * experts. */
#include <math.h>
#include <string.h>

#include "forward_internal.h"
#include "moe_abi.h"

int forward_prefetch(struct forward_engine *e, int32_t layer, const int32_t *ids,
                     const float *scores, uint32_t n, bool scores_per_expert)
{
	return forward_prefetch_started(e, layer, ids, scores, n, scores_per_expert, NULL);
}

int forward_prefetch_started(struct forward_engine *e, int32_t layer, const int32_t *ids,
                             const float *scores, uint32_t n, bool scores_per_expert,
                             uint32_t *started_ids)
{
	const struct moe_model_hparams *info = &e->cat->info;
	if (layer < 0 || (uint32_t)layer >= info->n_layers || e->w.moe_index[layer] < 0)
		return MOE_EBADLAYER;
	const uint32_t l = (uint32_t)e->w.moe_index[layer];
	int started = 0;
	if (scores_per_expert) {
		if (!scores || n != info->n_experts)
			return MOE_EINVAL;
		/* The top_k highest positive finite scores, best first (k is small:
		 * selection by scans). */
		uint32_t top = info->top_k ? info->top_k : 1;
		float last = INFINITY;
		int32_t last_id = -1;
		for (uint32_t r = 0; r < top; r++) {
			int32_t best = -1;
			for (uint32_t x = 0; x < n; x++) {
				const float s = scores[x];
				if (!isfinite(s) || s <= 0.0f || s > last ||
				    (s == last && (int32_t)x <= last_id))
					continue;
				if (best < 0 || s > scores[best])
					best = (int32_t)x;
			}
			if (best < 0)
				break;
			const uint32_t id = (uint32_t)best;
			const float pri = scores[best] * (float)top;
			weights_hint(&e->w, l, id, pri);
			if (weights_prefetch(&e->w, l, id, pri)) {
				if (started_ids)
					started_ids[started] = id;
				started++;
			}
			last = scores[best];
			last_id = best;
		}
		return started;
	}
	/* Every hint first, then the loads: a hinted resident expert is marked needed before
	 * any of the hint's prefetches looks for a victim. */
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t i = 0; i < n; i++) {
			if (ids[i] < 0 || (uint32_t)ids[i] >= info->n_experts)
				continue;
			const uint32_t id = (uint32_t)ids[i];
			const float pri = scores && isfinite(scores[i]) ? scores[i] : 1.0f;
			if (pass == 0)
				weights_hint(&e->w, l, id, pri);
			else if (weights_prefetch(&e->w, l, id, pri)) {
				if (started_ids)
					started_ids[started] = id;
				started++;
			}
		}
	return started;
}

/* Pushes the all-clients intersection of masks of transformer block `layer` into residency
 * (mask_lock held). */
static void sync_residency_mask(struct forward_engine *e, uint32_t layer)
{
	if (e->w.moe_index[layer] < 0)
		return;
	bool any = false;
	for (uint32_t c = 0; c < FORWARD_MAX_CLIENTS; c++)
		any |= e->attached[c];
	uint32_t masked = 0;
	for (uint32_t x = 0; x < e->cat->info.n_experts; x++) {
		bool all = any;
		for (uint32_t c = 0; c < FORWARD_MAX_CLIENTS && all; c++)
			if (e->attached[c])
				all = masks_bit(e, c, layer, x);
		e->res_mask[x] = all;
		masked += all;
	}
	e->masked_now[layer] = masked;
	weights_set_gpu_mask(&e->w, (uint32_t)e->w.moe_index[layer], e->res_mask);
}

int forward_set_mask(struct forward_engine *e, uint32_t client, int32_t layer, const uint8_t *bits,
                     size_t n_bytes)
{
	const uint32_t n_layers = e->cat->info.n_layers;
	if (client >= FORWARD_MAX_CLIENTS)
		return MOE_EINVAL;
	if (layer < -1 || layer >= (int32_t)n_layers)
		return MOE_EBADLAYER;
	const size_t need = layer < 0 ? n_layers * e->mask_row : e->mask_row;
	if (n_bytes < need)
		return MOE_ETOOSMALL;
	pthread_mutex_lock(&e->mask_lock);
	e->attached[client] = true;
	uint8_t *mine = e->masks + (size_t)client * n_layers * e->mask_row;
	const uint32_t first = layer < 0 ? 0 : (uint32_t)layer;
	bool changed = false;
	for (uint32_t l = first; l < (layer < 0 ? n_layers : first + 1); l++) {
		uint8_t *row = mine + l * e->mask_row;
		const uint8_t *in = bits + (l - first) * e->mask_row;
		for (size_t b = 0; b < e->mask_row; b++) {
			uint8_t v = in[b];
			/* Bits past n_experts in the last byte are ignored: clear them. */
			if (b == e->mask_row - 1 && e->cat->info.n_experts % 8)
				v &= (uint8_t)((1u << (e->cat->info.n_experts % 8)) - 1u);
			changed |= row[b] != v;
			row[b] = v;
		}
		sync_residency_mask(e, l);
	}
	e->mask_switches += changed;
	pthread_mutex_unlock(&e->mask_lock);
	return MOE_OK;
}

static void set_attached(struct forward_engine *e, uint32_t client, bool attached)
{
	if (client >= FORWARD_MAX_CLIENTS)
		return;
	pthread_mutex_lock(&e->mask_lock);
	e->attached[client] = attached;
	if (!attached)
		memset(e->masks + (size_t)client * e->cat->info.n_layers * e->mask_row, 0,
		       e->cat->info.n_layers * e->mask_row);
	for (uint32_t l = 0; l < e->cat->info.n_layers; l++)
		sync_residency_mask(e, l);
	pthread_mutex_unlock(&e->mask_lock);
}

void forward_mask_info(struct forward_engine *e, uint64_t *switches, uint64_t *masked)
{
	pthread_mutex_lock(&e->mask_lock);
	*switches = e->mask_switches;
	uint64_t n = 0;
	for (uint32_t l = 0; l < e->cat->info.n_layers; l++)
		n += e->masked_now[l];
	*masked = n;
	pthread_mutex_unlock(&e->mask_lock);
}

void forward_client_attach(struct forward_engine *e, uint32_t client)
{
	set_attached(e, client, true);
}

void forward_client_detach(struct forward_engine *e, uint32_t client)
{
	set_attached(e, client, false);
}

uint32_t forward_retry_failed(struct forward_engine *e)
{
	return weights_retry_failed(&e->w);
}
