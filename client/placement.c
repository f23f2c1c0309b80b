/* placement.c — which experts an engine keeps on its GPU (moe_client.h, "GPU expert
 * placement"): four strategies over per-(layer, expert) load, and the mask moe_set_gpu_mask
 * takes. No client, no I/O; allocates its work arrays per call (never on a request path). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "moe_client.h"

static const char *const strategy_names[MOE_PLACE_COUNT] = {
    [MOE_PLACE_FREQUENCY] = "frequency",
    [MOE_PLACE_UNIFORM] = "uniform",
    [MOE_PLACE_FRONT_LOADING] = "front-loading",
    [MOE_PLACE_BALANCED] = "balanced",
};

const char *moe_placement_name(int strategy)
{
	return strategy >= 0 && strategy < MOE_PLACE_COUNT ? strategy_names[strategy] : NULL;
}

int moe_placement_parse(const char *name)
{
	for (int i = 0; name && i < MOE_PLACE_COUNT; i++)
		if (!strcmp(name, strategy_names[i]))
			return i;
	return MOE_EINVAL;
}

/* Whether cell x goes before cell y: more load first, then the lower index (layer, then
 * expert). */
static bool before(const double *load, uint32_t x, uint32_t y)
{
	return load[x] != load[y] ? load[x] > load[y] : x < y;
}

/* Sorts idx[0..n) with `before` (a stable merge sort through tmp: the library keeps no
 * global state, and qsort takes no context). */
static void sort_cells(uint32_t *idx, uint32_t *tmp, size_t n, const double *load)
{
	for (size_t w = 1; w < n; w *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * w) {
			const size_t mid = lo + w < n ? lo + w : n,
			             hi = lo + 2 * w < n ? lo + 2 * w : n;
			size_t a = lo, b = mid, o = lo;
			while (a < mid && b < hi)
				tmp[o++] = before(load, idx[b], idx[a]) ? idx[b++] : idx[a++];
			while (a < mid)
				tmp[o++] = idx[a++];
			while (b < hi)
				tmp[o++] = idx[b++];
		}
		memcpy(idx, tmp, n * sizeof(*idx));
	}
}

int moe_placement(const double *load, uint32_t n_moe_layers, uint32_t n_experts,
                  const int32_t *blocks, uint32_t n_blocks, uint32_t gpu_experts, int strategy,
                  uint8_t *mask, size_t mask_bytes, double *covered)
{
	const size_t row = (n_experts + 7u) / 8u;
	if (!load || !mask || !n_moe_layers || !n_experts || strategy < 0 ||
	    strategy >= MOE_PLACE_COUNT || mask_bytes != row * n_blocks)
		return MOE_EINVAL;
	for (uint32_t l = 0; l < n_moe_layers; l++) {
		const int32_t b = blocks ? blocks[l] : (int32_t)l;
		if (b < 0 || (uint32_t)b >= n_blocks || (l && blocks && b <= blocks[l - 1]))
			return MOE_EINVAL;
	}
	const size_t cells = (size_t)n_moe_layers * n_experts;
	double total = 0;
	for (size_t i = 0; i < cells; i++) {
		if (!(load[i] >= 0)) /* negative or NaN */
			return MOE_EINVAL;
		total += load[i];
	}
	uint32_t *idx = malloc(cells * sizeof(*idx)), *tmp = malloc(cells * sizeof(*tmp));
	bool *chosen = calloc(cells, sizeof(*chosen));
	if (!idx || !tmp || !chosen) {
		free(idx);
		free(tmp);
		free(chosen);
		return MOE_ENOMEM;
	}
	for (size_t i = 0; i < cells; i++)
		idx[i] = (uint32_t)i;
	const size_t budget = gpu_experts < cells ? gpu_experts : cells;
	/* Each layer's experts hottest first (idx layer-major; sorting in place per layer). */
	if (strategy != MOE_PLACE_FREQUENCY)
		for (uint32_t l = 0; l < n_moe_layers; l++)
			sort_cells(idx + (size_t)l * n_experts, tmp, n_experts, load);
	switch (strategy) {
	case MOE_PLACE_FREQUENCY:
		sort_cells(idx, tmp, cells, load);
		for (size_t i = 0; i < budget; i++)
			chosen[idx[i]] = true;
		break;
	case MOE_PLACE_UNIFORM: {
		const size_t per = budget / n_moe_layers, extra = budget % n_moe_layers;
		for (uint32_t l = 0; l < n_moe_layers; l++)
			for (size_t r = 0; r < per + (l < extra); r++)
				chosen[idx[(size_t)l * n_experts + r]] = true;
		break;
	}
	case MOE_PLACE_FRONT_LOADING:
		for (size_t i = 0; i < budget; i++)
			chosen[idx[i]] = true;
		break;
	case MOE_PLACE_BALANCED: {
		/* CPU load left per layer; next[l] = rank of the layer's next candidate. */
		double *left = calloc(n_moe_layers, sizeof(*left));
		uint32_t *next = calloc(n_moe_layers, sizeof(*next));
		if (!left || !next) {
			free(left);
			free(next);
			free(idx);
			free(tmp);
			free(chosen);
			return MOE_ENOMEM;
		}
		for (size_t i = 0; i < cells; i++)
			left[i / n_experts] += load[i];
		for (size_t n = 0; n < budget; n++) {
			uint32_t best = UINT32_MAX;
			for (uint32_t l = 0; l < n_moe_layers; l++)
				if (next[l] < n_experts &&
				    (best == UINT32_MAX || left[l] > left[best]))
					best = l;
			const uint32_t cell = idx[(size_t)best * n_experts + next[best]++];
			chosen[cell] = true;
			left[best] -= load[cell];
		}
		free(left);
		free(next);
		break;
	}
	}
	memset(mask, 0, mask_bytes);
	double on_gpu = 0;
	for (size_t i = 0; i < cells; i++) {
		if (!chosen[i])
			continue;
		const uint32_t l = (uint32_t)(i / n_experts), e = (uint32_t)(i % n_experts);
		const size_t b = blocks ? (size_t)blocks[l] : l;
		mask[b * row + e / 8] |= (uint8_t)(1u << (e % 8));
		on_gpu += load[i];
	}
	if (covered)
		*covered = total > 0 ? on_gpu / total : 0;
	free(idx);
	free(tmp);
	free(chosen);
	return MOE_OK;
}
