/* sim_sizes.c — the experts' sizes and size classes for the replay (sim.h), planned by the
 * rules residency.c applies to a real pool (plan_classes, split_budget; one node, no pinned
 * layers), so that a simulated budget holds what the sidecar's would. */
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define SIM_SLOT_ALIGN 4096u /* slot_pool.h: SLOT_ALIGN */

static int compare_u64(const void *a, const void *b)
{
	const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

void sim_sizes_free(struct sim_sizes *s)
{
	free(s->class_of);
	free(s->bytes);
	memset(s, 0, sizeof(*s));
}

/* Classes: runs of slot sizes spanning at most two blocks per extent above their smallest;
 * more than SIM_MAX_CLASSES runs: one class (every slot sized for the largest). */
static int plan(const uint64_t *slot, uint32_t n_ids, uint64_t span, struct sim_sizes *s,
                struct sidecar_error *err)
{
	uint64_t *sorted = malloc((size_t)n_ids * sizeof(uint64_t));
	if (!sorted)
		return error_set(err, MOE_ENOMEM, "simulate: out of memory for %u experts", n_ids);
	memcpy(sorted, slot, (size_t)n_ids * sizeof(uint64_t));
	qsort(sorted, n_ids, sizeof(uint64_t), compare_u64);
	uint64_t start[SIM_MAX_CLASSES + 1];
	uint32_t n = 0;
	for (uint32_t i = 0; i < n_ids && n <= SIM_MAX_CLASSES; i++)
		if (!n || sorted[i] > start[n - 1] + span)
			start[n++] = sorted[i];
	free(sorted);
	if (n > SIM_MAX_CLASSES || n == 0)
		n = 1;
	s->n_classes = n;
	s->all_bytes = 0;
	for (uint32_t id = 0; id < n_ids; id++) {
		uint32_t c = n - 1;
		while (c > 0 && slot[id] < start[c])
			c--;
		s->class_of[id] = (uint8_t)c;
		s->count[c]++;
		const uint64_t sb =
		    (slot[id] + SIM_SLOT_ALIGN - 1) / SIM_SLOT_ALIGN * SIM_SLOT_ALIGN;
		if (sb > s->slot_bytes[c])
			s->slot_bytes[c] = sb;
	}
	for (uint32_t c = 0; c < n; c++)
		s->all_bytes += s->count[c] * s->slot_bytes[c];
	return 0;
}

static int sizes_alloc(struct sim_sizes *s, uint32_t n_ids, struct sidecar_error *err)
{
	memset(s, 0, sizeof(*s));
	s->n_ids = n_ids;
	s->class_of = calloc(n_ids ? n_ids : 1, 1);
	s->bytes = calloc(n_ids ? n_ids : 1, sizeof(uint64_t));
	if (!s->class_of || !s->bytes) {
		sim_sizes_free(s);
		return error_set(err, MOE_ENOMEM, "simulate: out of memory for %u experts", n_ids);
	}
	return 0;
}

int sim_sizes_from_bytes(const uint64_t *bytes, uint32_t n_ids, uint64_t alignment,
                         uint32_t max_extents, struct sim_sizes *out, struct sidecar_error *err)
{
	if (sizes_alloc(out, n_ids, err))
		return -1;
	memcpy(out->bytes, bytes, (size_t)n_ids * sizeof(uint64_t));
	if (plan(bytes, n_ids, 2 * alignment * (max_extents ? max_extents : 1), out, err)) {
		sim_sizes_free(out);
		return -1;
	}
	return 0;
}

int sim_sizes_from_map(const struct expert_map *map, uint64_t alignment, struct sim_sizes *out,
                       struct sidecar_error *err)
{
	const uint32_t n_ids = map->n_layers * map->n_experts;
	if (alignment < 1)
		alignment = 4096;
	if (sizes_alloc(out, n_ids, err))
		return -1;
	uint64_t *slot = malloc((size_t)n_ids * sizeof(uint64_t));
	if (!slot) {
		sim_sizes_free(out);
		return error_set(err, MOE_ENOMEM, "simulate: out of memory for %u experts", n_ids);
	}
	uint32_t most = 1;
	for (uint32_t id = 0; id < n_ids; id++) {
		uint32_t n;
		const struct expert_extent *ext = expert_map_extents(map, id, &n);
		uint64_t at = 0, read = 0;
		for (uint32_t i = 0; i < n; i++) { /* residency.c: compute_layout */
			const uint64_t start = ext[i].offset / alignment * alignment;
			const uint64_t end =
			    (ext[i].offset + ext[i].length + alignment - 1) / alignment * alignment;
			const uint64_t kept = ext[i].offset - start + ext[i].room;
			at += kept > end - start ? (kept + alignment - 1) / alignment * alignment
			                         : end - start;
			read += end - start;
		}
		slot[id] = at;
		out->bytes[id] = read;
		if (n > most)
			most = n;
	}
	const int rc = plan(slot, n_ids, 2 * alignment * most, out, err);
	free(slot);
	if (rc)
		sim_sizes_free(out);
	return rc;
}

int sim_sizes_budget(struct sim_sizes *s, uint64_t budget, struct sidecar_error *err)
{
	if (s->n_classes == 1) { /* residency.c: create_pools */
		const uint64_t n = budget / s->slot_bytes[0];
		if (n < 1)
			return error_set(
			    err, MOE_EINVAL,
			    "simulate: a budget of %llu bytes holds no slot of %llu bytes",
			    (unsigned long long)budget, (unsigned long long)s->slot_bytes[0]);
		s->slots[0] = (uint32_t)(n < s->count[0] ? n : s->count[0]);
		return 0;
	}
	/* residency.c: split_budget — a slot per class first, the rest in proportion to the
	 * class's other experts' bytes, whole slots left by the rounding to the classes in
	 * order. */
	uint64_t need = 0, rest = 0;
	for (uint32_t c = 0; c < s->n_classes; c++) {
		need += s->slot_bytes[c];
		rest += (s->count[c] - 1) * s->slot_bytes[c];
	}
	if (budget < need)
		return error_set(
		    err, MOE_EINVAL,
		    "simulate: a budget of %llu bytes does not serve experts of %u slot "
		    "sizes; the smallest budget that serves is %llu bytes",
		    (unsigned long long)budget, s->n_classes, (unsigned long long)need);
	const uint64_t extra = budget - need;
	uint64_t left = budget;
	for (uint32_t c = 0; c < s->n_classes; c++) {
		uint64_t n = 1;
		if (rest)
			n += (uint64_t)((unsigned __int128)extra *
			                ((s->count[c] - 1) * s->slot_bytes[c]) / rest /
			                s->slot_bytes[c]);
		s->slots[c] = (uint32_t)(n < s->count[c] ? n : s->count[c]);
		left -= s->slots[c] * s->slot_bytes[c];
	}
	for (uint32_t c = 0; c < s->n_classes; c++) {
		const uint64_t more = left / s->slot_bytes[c];
		const uint64_t room = s->count[c] - s->slots[c];
		const uint32_t add = (uint32_t)(more < room ? more : room);
		s->slots[c] += add;
		left -= add * s->slot_bytes[c];
	}
	return 0;
}
