/* weights.c — where the forward engine's expert weights come from: the scheduler's interface
 * (weights.h) over three sources, and the RESIDENCY source itself.
 *
 *   RESIDENCY     sidecar/residency/ slot pools: cold experts read with io_uring on demand,
 *                 turned into the kernels' layout on the loader (transforms.c);
 *   ALL_RESIDENT  every expert's matrices read into one buffer at create (static_sources.c);
 *   MMAP          pointers into a read-only mapping of each model file (static_sources.c).
 * Each expert is described once at open (expert_view.c); the views point into the source's
 * bytes, never a copy. Biases and FP8 block scales become f32: RESIDENCY reads them with the
 * expert into its slot and converts them there on the loader (side_in_slot), held and evicted
 * with the expert; the other sources read them once at create into `aux`.
 *
 * RESIDENCY with several NUMA nodes: one residency with a part per node, each holding only
 * that node's rows of every expert (node_maps.c), in memory bound to the node; one policy
 * decides for every node. A layout that cannot be cut so keeps one unbound pool of whole
 * experts, logged at create.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "log.h"
#include "policy.h"
#include "weights.h"

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
		int rc = node_maps_build(w, topo->n_nodes, why, sizeof(why), err);
		if (rc < 0)
			return -1;
		if (rc == 0) {
			w->sliced = true;
			w->n_res = topo->n_nodes;
		} else {
			node_maps_free(w);
			log_warn("forward",
			         "residency: one slot pool for all %u nodes, not bound to any "
			         "(each node's slices cannot be cut: %s)",
			         topo->n_nodes, why);
		}
	}
	struct sidecar_error e;
	if (!w->sliced && expert_map_from_catalog(w->cat, &w->map, &w->roles, NULL, &e) != 0)
		return error_pass(err, &e);
	return transforms_init(w, err);
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
	    .pool_pages_auto = cfg->pool_pages_auto,
	    .shareable_pool = cfg->shareable_pool,
	    .retry_backoff_ms = cfg->retry_backoff_ms,
	    .retry_backoff_max_ms = cfg->retry_backoff_max_ms,
	    .post_load = w->xf.mxfp4_hf || w->xf.int4 || w->decode.on || w->side_in_slot
	                     ? transform_after_load
	                     : NULL,
	};
	struct sidecar_error why = {0};
	if (residency_create_nodes_held(&w->res, parts, w->n_res, &rc, w->populate_hook,
	                                w->populate_arg, &why) != 0)
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
	w->n_nodes = topo->n_nodes;
	if (transforms_check(w, cfg->source, err))
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
	if (weights_open_files(cat, &fds, err))
		return -1;
	/* The residency holds each expert's side data with its rows, converted on the loader
	 * (side_after_load; sliced: each node's rows of it, node_side_after_load); the other
	 * sources take it converted once from aux. */
	w->side_in_slot = cfg->source == FORWARD_SOURCE_RESIDENCY;
	int rc = w->side_in_slot ? 0 : static_load_aux(w, fds, err);
	if (rc == 0) /* every view is built for the decode layout */
		rc = expert_templates_build(
		    w, !cfg->file_layout && cfg->source != FORWARD_SOURCE_MMAP, err);
	if (rc == 0 && cfg->source != FORWARD_SOURCE_RESIDENCY) {
		size_t n = (size_t)w->n_moe_layers * w->n_experts * MOE_PROJ_COUNT;
		w->data = calloc(n ? n : 1, sizeof(*w->data));
		if (!w->data) {
			error_set(err, MOE_ENOMEM, "out of memory");
			rc = -1;
		}
	}
	if (rc == 0 && cfg->source == FORWARD_SOURCE_ALL_RESIDENT)
		rc = static_load_all_resident(w, fds, cfg, topo, err);
	weights_close_files(cat, fds);
	if (rc)
		return -1;
	if (cfg->source == FORWARD_SOURCE_MMAP)
		return static_map_files(w, err);
	if (cfg->source == FORWARD_SOURCE_RESIDENCY)
		return open_residency_maps(w, topo, err);
	return 0;
}

void weights_close(struct forward_weights *w)
{
	if (w->res)
		residency_destroy(w->res);
	node_maps_free(w);
	if (w->map.n_extents)
		expert_map_free(&w->map);
	transforms_free(w);
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

static enum weights_found found_as(uint8_t found)
{
	return found == RESIDENCY_FOUND_HIT         ? WEIGHTS_HIT
	       : found == RESIDENCY_FOUND_IN_FLIGHT ? WEIGHTS_IN_FLIGHT
	       : found == RESIDENCY_FOUND_COLD      ? WEIGHTS_COLD
	                                            : WEIGHTS_NOT_YET;
}

/* The bytes a cold demand of (moe_layer, expert) read, over every node part. */
static uint64_t cold_read_bytes(const struct forward_weights *w, uint32_t moe_layer,
                                uint32_t expert)
{
	uint64_t bytes = 0;
	for (uint32_t n = 0; n < w->n_res; n++)
		bytes += weights_res_bytes(w, n, moe_layer, expert);
	return bytes;
}

/* A static source's expert: its view at once, found resident. */
static int static_demand(const struct forward_weights *w, uint32_t moe_layer, struct held_expert *h,
                         struct sidecar_error *err)
{
	const uint32_t expert = h->hold.expert;
	if (weights_static_view(w, moe_layer, expert, &h->view, err) != 0)
		return -EINVAL;
	h->tp = &w->templates[(size_t)moe_layer * w->n_experts + expert];
	return 1;
}

int weights_demand(const struct forward_weights *w, uint32_t moe_layer, struct held_expert *h,
                   bool wait, enum weights_found *found, uint64_t *cold_bytes,
                   struct sidecar_error *err)
{
	struct residency_hold *hd = &h->hold;
	*found = WEIGHTS_NOT_YET;
	*cold_bytes = 0;
	if (w->source != FORWARD_SOURCE_RESIDENCY) {
		*found = WEIGHTS_HIT;
		return static_demand(w, moe_layer, h, err);
	}
	if (!hd->held) {
		const enum expert_state pre = residency_state(w->res, moe_layer, hd->expert);
		const unsigned flags =
		    (wait ? 0u : RESIDENCY_NOWAIT) | (hd->counted ? RESIDENCY_RETRY : 0u);
		const int rc =
		    residency_acquire(w->res, moe_layer, hd->expert,
		                      hd->score >= 0 ? hd->score : -1.0f, flags, &hd->ref);
		if (!hd->counted && (rc == 0 || rc == -EINPROGRESS)) {
			hd->counted = true;
			*found = pre == EXPERT_RESIDENT  ? WEIGHTS_HIT
			         : pre == EXPERT_LOADING ? WEIGHTS_IN_FLIGHT
			                                 : WEIGHTS_COLD;
			if (*found == WEIGHTS_COLD)
				*cold_bytes = cold_read_bytes(w, moe_layer, hd->expert);
		}
		if (rc == -EINPROGRESS || rc == -EAGAIN)
			return 0;
		if (rc != 0)
			return rc;
		hd->held = true;
	}
	if (expert_held_view(w, h, err) != 0)
		return -EINVAL;
	return 1;
}

/* The demands counted by the last layer call, taken into c (and cleared in the holds). */
static void take_counts(const struct forward_weights *w, uint32_t moe_layer,
                        struct held_expert *held, uint32_t n, struct weights_demand_counts *c)
{
	for (uint32_t i = 0; i < n; i++) {
		struct residency_hold *hd = &held[i].hold;
		const enum weights_found found = found_as(hd->found);
		hd->found = RESIDENCY_FOUND_NOT_YET;
		c->hits += found == WEIGHTS_HIT;
		c->inflight_misses += found == WEIGHTS_IN_FLIGHT;
		c->cold_misses += found == WEIGHTS_COLD;
		if (found == WEIGHTS_COLD)
			c->bytes_read += cold_read_bytes(w, moe_layer, hd->expert);
	}
}

int weights_demand_layer(const struct forward_weights *w, uint32_t moe_layer,
                         struct held_expert *held, uint32_t n, uint32_t *cursor, uint32_t *ready,
                         struct weights_demand_counts *counts, struct sidecar_error *err)
{
	if (w->source != FORWARD_SOURCE_RESIDENCY) {
		while (*cursor < n) {
			struct held_expert *h = &held[(*cursor)++];
			if (!h->hold.pending)
				continue;
			const int rc = static_demand(w, moe_layer, h, err);
			if (rc < 0)
				return rc;
			counts->hits++;
			h->hold.pending = false;
			(*ready)++;
		}
		*cursor = 2 * n;
		return 0;
	}
	/* One call into the residency for the layer's references, one for their views. */
	const int rc =
	    residency_demand_layer(w->res, moe_layer, &held[0].hold, sizeof(held[0]), n, cursor);
	take_counts(w, moe_layer, held, n, counts);
	uint32_t failed;
	if (expert_layer_views(w, held, n, ready, &failed, err) != 0) {
		/* The walk resumes after the expert whose view failed (its region of the walk). */
		*cursor = (*cursor - 1) / n * n + failed + 1;
		return -EINVAL;
	}
	return rc;
}

void weights_release_layer(const struct forward_weights *w, struct held_expert *held,
                           const uint32_t *which, uint32_t n)
{
	if (w->source == FORWARD_SOURCE_RESIDENCY)
		residency_release_layer(w->res, &held[0].hold, sizeof(held[0]), which, n);
}

bool weights_layer_ready(const struct forward_weights *w, uint32_t moe_layer, const int32_t *ids,
                         size_t n)
{
	if (w->source == FORWARD_SOURCE_ALL_RESIDENT)
		return true;
	if (w->source == FORWARD_SOURCE_RESIDENCY)
		return residency_layer_resident(w->res, moe_layer, ids, n);
	for (size_t i = 0; i < n; i++) { /* MMAP: a page fault may read */
		const int32_t id = ((const volatile int32_t *)ids)[i];
		if (id >= 0 && (uint32_t)id < w->n_experts)
			return false;
	}
	return true;
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
	struct residency_counters *all = &out->residency;
	residency_counters(w->res, all);
	out->resident_bytes = all->resident_bytes;
	out->slot_bytes_used = (uint64_t)all->slots_used * all->slot_bytes;
	out->pool_bytes = (uint64_t)all->slots * all->slot_bytes;
	out->budget_bytes = all->budget_bytes;
	out->n_nodes = w->n_res;
	for (uint32_t n = 0; n < w->n_res; n++) {
		struct forward_node_stats *node = &out->nodes[n];
		node->node = n;
		residency_node_counters(w->res, n, &node->residency);
		node->slot_bytes_used =
		    (uint64_t)node->residency.slots_used * node->residency.slot_bytes;
	}
}
