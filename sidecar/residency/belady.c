/* belady.c — Belady's OPT for offline evaluation (see sim.h for the replay rules).
 *
 * Precomputes, for every reference, the position of the next reference to the same expert;
 * keeps the resident experts in a max-heap keyed by that position. Experts of the line being
 * served are keyed -1 (never the maximum unless nothing else is left, and then the miss is
 * not admitted); at the end of the line they get their real next-use keys. O(refs · log C).
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

int sim_run_belady(const struct routing_trace *t, uint32_t capacity, uint32_t pin_layers,
                   struct sim_result *out, struct sidecar_error *err)
{
	const uint32_t E = t->n_experts, n_ids = t->n_layers * t->n_experts;
	if (pin_layers > t->n_layers || (uint64_t)pin_layers * E > capacity)
		return error_set(err, MOE_EINVAL, "belady: %u pinned layers do not fit in %u slots",
		                 pin_layers, capacity);
	const uint32_t cap = capacity - pin_layers * E;
	int64_t *next_use = malloc((size_t)t->n_refs * sizeof(*next_use) + 1);
	int64_t *last = malloc((size_t)n_ids * sizeof(*last));
	struct opt_heap h = {
	    .ids = malloc(((size_t)(cap < n_ids ? cap : n_ids) + 1) * sizeof(uint32_t)),
	    .pos = malloc((size_t)n_ids * sizeof(uint32_t)),
	    .key = malloc((size_t)n_ids * sizeof(int64_t)),
	};
	int rc = -1;
	if (!next_use || !last || !h.ids || !h.pos || !h.key) {
		error_set(err, MOE_ENOMEM, "belady: out of memory for %u references", t->n_refs);
		goto out;
	}
	for (uint32_t i = 0; i < n_ids; i++) {
		last[i] = NEVER;
		h.pos[i] = UINT32_MAX;
	}
	/* Backward pass: next reference of the same expert, by reference index. */
	for (uint32_t li = t->n_lines; li-- > 0;) {
		const struct trace_line *l = &t->lines[li];
		for (uint32_t j = l->first; j < l->first + l->count; j++) {
			uint32_t id = l->layer * E + t->ids[j];
			next_use[j] = last[id];
			last[id] = j;
		}
	}
	struct sim_result r = {0};
	for (uint32_t li = 0; li < t->n_lines; li++) {
		const struct trace_line *l = &t->lines[li];
		const bool pinned = l->layer < pin_layers;
		r.refs += l->count;
		if (pinned) {
			r.hits += l->count;
			continue;
		}
		for (uint32_t j = l->first; j < l->first + l->count; j++) {
			uint32_t id = l->layer * E + t->ids[j];
			if (h.pos[id] != UINT32_MAX)
				heap_set(&h, id, IN_USE);
		}
		for (uint32_t j = l->first; j < l->first + l->count; j++) {
			uint32_t id = l->layer * E + t->ids[j];
			if (h.pos[id] != UINT32_MAX) {
				r.hits++;
				continue;
			}
			if (cap == 0)
				continue;
			if (h.n >= cap) {
				if (h.key[h.ids[0]] == IN_USE)
					continue; /* everything resident is in use: not admitted */
				heap_pop(&h);
			}
			heap_set(&h, id, IN_USE);
		}
		for (uint32_t j = l->first; j < l->first + l->count; j++) {
			uint32_t id = l->layer * E + t->ids[j];
			if (h.pos[id] != UINT32_MAX)
				heap_set(&h, id, next_use[j]);
		}
	}
	*out = r;
	rc = 0;
out:
	free(next_use);
	free(last);
	free(h.ids);
	free(h.pos);
	free(h.key);
	return rc;
}
