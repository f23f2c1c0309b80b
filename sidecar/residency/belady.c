/* belady.c — Belady's OPT for offline evaluation (see sim.h for the replay rules).
 *
 * Precomputes, for every reference and every prefetch, the position of the next reference to
 * the same expert; keeps each size class's resident experts in a max-heap keyed by that
 * position (the classes' slots are apart, as in the real pool: OPT over each class's slots is
 * the fewest loads of the class). Experts of the line being served are keyed -1 (never the
 * maximum unless nothing else is left, and then the miss is not admitted); at the end of the
 * line they get their real next-use keys. O((refs + prefetches) · log C).
 *
 * Bytes: within a class, OPT minimises loads; the class's experts' read sizes differ by at
 * most two alignment blocks per extent (the class rule), so its bytes are the fewest up to
 * that spread. Over classes with the split fixed (as the residency's is) the classes are
 * independent, so the sum is the fewest for that split.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "sim.h"

#define NEVER INT64_MAX
#define IN_USE (-1)

struct opt_heap {
	uint32_t *ids; /* heap of expert ids, max key at [0] */
	uint32_t *pos; /* [n_ids] index in ids, or UINT32_MAX */
	int64_t *key;  /* [n_ids] */
	uint32_t n;
};

static void heap_swap(struct opt_heap *h, uint32_t a, uint32_t b)
{
	uint32_t ia = h->ids[a], ib = h->ids[b];
	h->ids[a] = ib;
	h->ids[b] = ia;
	h->pos[ib] = a;
	h->pos[ia] = b;
}

static void heap_up(struct opt_heap *h, uint32_t i)
{
	while (i > 0) {
		uint32_t parent = (i - 1) / 2;
		if (h->key[h->ids[parent]] >= h->key[h->ids[i]])
			break;
		heap_swap(h, parent, i);
		i = parent;
	}
}

static void heap_down(struct opt_heap *h, uint32_t i)
{
	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, big = i;
		if (l < h->n && h->key[h->ids[l]] > h->key[h->ids[big]])
			big = l;
		if (r < h->n && h->key[h->ids[r]] > h->key[h->ids[big]])
			big = r;
		if (big == i)
			return;
		heap_swap(h, i, big);
		i = big;
	}
}

static void heap_set(struct opt_heap *h, uint32_t id, int64_t key)
{
	if (h->pos[id] == UINT32_MAX) {
		h->key[id] = key;
		h->ids[h->n] = id;
		h->pos[id] = h->n;
		heap_up(h, h->n++);
		return;
	}
	int64_t old = h->key[id];
	h->key[id] = key;
	if (key > old)
		heap_up(h, h->pos[id]);
	else
		heap_down(h, h->pos[id]);
}

static uint32_t heap_pop(struct opt_heap *h)
{
	uint32_t top = h->ids[0];
	heap_swap(h, 0, h->n - 1);
	h->n--;
	h->pos[top] = UINT32_MAX;
	if (h->n)
		heap_down(h, 0);
	return top;
}

struct opt_class {
	struct opt_heap h;
	uint32_t cap;
};

static uint32_t class_of(const struct sim_options *o, uint32_t id)
{
	return o->sizes ? o->sizes->class_of[id] : 0;
}

static uint64_t load_bytes(const struct sim_options *o, uint32_t id)
{
	return o->sizes ? o->sizes->bytes[id] : 1;
}

/* OPT with pin_layers layers resident outside the classes (one class only: sim_run_belady). */
static int sim_belady_pinned(const struct routing_trace *t, const struct sim_options *o,
                             uint32_t pin_layers, struct sim_result *out, struct sidecar_error *err)
{
	const uint32_t E = t->n_experts, n_ids = t->n_layers * t->n_experts;
	const uint32_t n_classes = o->sizes ? o->sizes->n_classes : 1;
	if (o->sizes && o->sizes->n_ids != n_ids)
		return error_set(err, MOE_EINVAL,
		                 "belady: the sizes are for %u experts, the trace has %u",
		                 o->sizes->n_ids, n_ids);
	if (!o->sizes && (pin_layers > t->n_layers || (uint64_t)pin_layers * E > o->capacity))
		return error_set(err, MOE_EINVAL, "belady: %u pinned layers do not fit in %u slots",
		                 pin_layers, o->capacity);
	if (!t->n_lines) {
		*out = (struct sim_result){0};
		return 0;
	}
	struct opt_class cls[SIM_MAX_CLASSES] = {0};
	const uint32_t n_pf = o->prefetches ? t->n_prefetches : 0;
	int64_t *next_use = malloc((size_t)t->n_refs * sizeof(*next_use) + 1);
	int64_t *pf_next = malloc((size_t)t->n_pf_ids * sizeof(*pf_next) + 1);
	int64_t *last = malloc((size_t)n_ids * sizeof(*last));
	uint32_t *pos = malloc((size_t)n_ids * sizeof(uint32_t));
	int64_t *key = malloc((size_t)n_ids * sizeof(int64_t));
	int rc = -1;
	bool ok = next_use && pf_next && last && pos && key;
	for (uint32_t c = 0; ok && c < n_classes; c++) {
		const uint32_t cap = o->sizes ? o->sizes->slots[c] : o->capacity - pin_layers * E;
		const uint32_t most = o->sizes ? o->sizes->count[c] : n_ids;
		cls[c].cap = cap;
		cls[c].h = (struct opt_heap){
		    .ids = malloc(((size_t)(cap < most ? cap : most) + 1) * sizeof(uint32_t)),
		    .pos = pos,
		    .key = key};
		ok = cls[c].h.ids != NULL;
	}
	if (!ok) {
		error_set(err, MOE_ENOMEM, "belady: out of memory for %u references", t->n_refs);
		goto out;
	}
	for (uint32_t i = 0; i < n_ids; i++) {
		last[i] = NEVER;
		pos[i] = UINT32_MAX;
	}
	/* Backward pass: next reference of the same expert, by reference index; a prefetch
	 * before line li sees the first reference at line li or later. */
	uint32_t pf = n_pf;
	for (uint32_t li = t->n_lines + 1; li-- > 0;) {
		if (li < t->n_lines) {
			const struct trace_line *l = &t->lines[li];
			for (uint32_t j = l->first; j < l->first + l->count; j++) {
				uint32_t id = l->layer * E + t->ids[j];
				next_use[j] = last[id];
				last[id] = j;
			}
		}
		for (; pf > 0 && t->prefetches[pf - 1].before_line >= li; pf--) {
			const struct trace_prefetch *p = &t->prefetches[pf - 1];
			for (uint32_t j = p->first; j < p->first + p->count; j++)
				pf_next[j] = last[p->layer * E + t->pf_ids[j]];
		}
	}
	struct sim_result r = {0};
	pf = 0;
	for (uint32_t li = 0; li <= t->n_lines; li++) {
		const uint32_t step = t->lines[li < t->n_lines ? li : li - 1].step;
		const bool counted = step >= o->from_step;
		for (; pf < n_pf && t->prefetches[pf].before_line == li; pf++) {
			const struct trace_prefetch *p = &t->prefetches[pf];
			if (p->layer < pin_layers)
				continue;
			for (uint32_t j = p->first; j < p->first + p->count; j++) {
				const uint32_t id = p->layer * E + t->pf_ids[j];
				struct opt_class *c = &cls[class_of(o, id)];
				if (pos[id] != UINT32_MAX)
					continue; /* held: nothing to read */
				if (counted) {
					r.prefetch_loads++;
					r.prefetch_bytes += load_bytes(o, id);
				}
				if (!c->cap)
					continue;
				if (c->h.n >= c->cap) {
					if (key[c->h.ids[0]] <= pf_next[j])
						continue; /* read, not kept: worth less than all */
					heap_pop(&c->h);
				}
				heap_set(&c->h, id, pf_next[j]);
			}
		}
		if (li == t->n_lines)
			break;
		const struct trace_line *l = &t->lines[li];
		const bool pinned = l->layer < pin_layers;
		if (counted)
			r.refs += l->count;
		if (pinned) {
			if (counted)
				r.hits += l->count;
			continue;
		}
		for (uint32_t j = l->first; j < l->first + l->count; j++) {
			uint32_t id = l->layer * E + t->ids[j];
			if (pos[id] != UINT32_MAX)
				heap_set(&cls[class_of(o, id)].h, id, IN_USE);
		}
		/* Misses are admitted by expert id, as the sidecar demands them (simulate.c) */
		uint32_t order[TRACE_MAX_TOPK], n = 0;
		for (uint32_t j = l->first; j < l->first + l->count; j++) {
			uint32_t at = n++;
			for (; at > 0 && t->ids[order[at - 1]] > t->ids[j]; at--)
				order[at] = order[at - 1];
			order[at] = j;
		}
		for (uint32_t o_i = 0; o_i < n; o_i++) {
			const uint32_t j = order[o_i];
			uint32_t id = l->layer * E + t->ids[j];
			struct opt_class *c = &cls[class_of(o, id)];
			if (pos[id] != UINT32_MAX) {
				r.hits += counted;
				continue;
			}
			if (counted) {
				r.demand_loads++;
				r.demand_bytes += load_bytes(o, id);
			}
			if (c->cap == 0)
				continue;
			if (c->h.n >= c->cap) {
				if (key[c->h.ids[0]] == IN_USE)
					continue; /* everything resident is in use: not admitted */
				heap_pop(&c->h);
			}
			heap_set(&c->h, id, IN_USE);
		}
		for (uint32_t j = l->first; j < l->first + l->count; j++) {
			uint32_t id = l->layer * E + t->ids[j];
			if (pos[id] != UINT32_MAX)
				heap_set(&cls[class_of(o, id)].h, id, next_use[j]);
		}
	}
	*out = r;
	rc = 0;
out:
	free(next_use);
	free(pf_next);
	free(last);
	free(pos);
	free(key);
	for (uint32_t c = 0; c < n_classes; c++)
		free(cls[c].h.ids);
	return rc;
}

int sim_replay_belady(const struct routing_trace *t, const struct sim_options *o,
                      struct sim_result *out, struct sidecar_error *err)
{
	return sim_belady_pinned(t, o, 0, out, err);
}

int sim_run_belady(const struct routing_trace *t, uint32_t capacity, uint32_t pin_layers,
                   struct sim_result *out, struct sidecar_error *err)
{
	const struct sim_options o = {.capacity = capacity};
	return sim_belady_pinned(t, &o, pin_layers, out, err);
}
