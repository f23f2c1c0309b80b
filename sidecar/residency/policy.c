/* policy.c — the policy interface (policy.h): spec parsing, partitions (layer-aware capacity),
 * pinning, the shared queue, and dispatch to the algorithms' rows (policy_lru.c,
 * policy_sieve.c, policy_heat.c; policy_internal.h). Partition bookkeeping lives here so every
 * algorithm gets +layer and +pinN the same way. */
#include "policy.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy_internal.h"

static const char *const kind_names[POLICY_KIND_COUNT] = {"lru", "sieve", "sieve-heat", "heat"};

/* Each kind's victim search; SIEVE and SIEVE-heat share one (it reads spec.kind for heat). */
static const struct policy_algorithm *const algorithms[POLICY_KIND_COUNT] = {
    [POLICY_LRU] = &policy_lru_algorithm,
    [POLICY_SIEVE] = &policy_sieve_algorithm,
    [POLICY_SIEVE_HEAT] = &policy_sieve_algorithm,
    [POLICY_HEAT] = &policy_heat_algorithm,
};

/* The modifiers policy_spec_parse accepts, as help shows them. */
enum policy_modifier { MOD_LAYER, MOD_PIN, MOD_COUNT };
static const struct {
	const char *name; /* after the '+' */
	bool counted;     /* followed by a number: +pinN */
} modifiers[MOD_COUNT] = {{"layer", false}, {"pin", true}};

/* "lru, sieve, sieve-heat" (sep ", ") or "+layer, +pinN" into buf. */
static void list_kinds(char *buf, size_t len)
{
	size_t used = 0;
	for (int k = 0; k < POLICY_KIND_COUNT && used < len; k++) {
		int n = snprintf(buf + used, len - used, "%s%s", k ? ", " : "", kind_names[k]);
		used += n > 0 ? (size_t)n : 0;
	}
}

static void list_modifiers(char *buf, size_t len)
{
	size_t used = 0;
	for (int m = 0; m < MOD_COUNT && used < len; m++) {
		int n = snprintf(buf + used, len - used, "%s+%s%s", m ? ", " : "",
		                 modifiers[m].name, modifiers[m].counted ? "N" : "");
		used += n > 0 ? (size_t)n : 0;
	}
}

void policy_spec_help(char *buf, size_t len)
{
	char kinds[96], mods[96];
	list_kinds(kinds, sizeof(kinds));
	list_modifiers(mods, sizeof(mods));
	snprintf(buf, len, "%s; modifiers %s", kinds, mods);
}

/* Which modifier `mod` (the text after a '+') is, or -1; *count gets +pinN's N. */
static int parse_modifier(const char *mod, uint32_t *count)
{
	for (int m = 0; m < MOD_COUNT; m++) {
		size_t n = strlen(modifiers[m].name);
		if (strncmp(mod, modifiers[m].name, n))
			continue;
		if (!modifiers[m].counted)
			return mod[n] ? -1 : m;
		if (mod[n] < '0' || mod[n] > '9')
			return -1;
		char *end;
		errno = 0;
		unsigned long v = strtoul(mod + n, &end, 10);
		if (*end || errno || v > 100000)
			return -1;
		*count = (uint32_t)v;
		return m;
	}
	return -1;
}

int policy_spec_parse(const char *text, struct policy_spec *out, struct sidecar_error *err)
{
	struct policy_spec s = {.heat_half_life = 0, .heat_keep = 2.0f};
	char buf[96];
	if (strlen(text) >= sizeof(buf))
		return error_set(err, MOE_EINVAL, "policy '%.40s…': name too long", text);
	strcpy(buf, text);
	char *save = NULL;
	char *base = strtok_r(buf, "+", &save);
	int kind = -1;
	for (int k = 0; base && k < POLICY_KIND_COUNT; k++)
		if (!strcmp(base, kind_names[k]))
			kind = k;
	if (kind < 0) {
		char kinds[96];
		list_kinds(kinds, sizeof(kinds));
		return error_set(err, MOE_EINVAL, "policy '%s': unknown algorithm '%s' (%s)", text,
		                 base ? base : "", kinds);
	}
	s.kind = (enum policy_kind)kind;
	for (char *mod = strtok_r(NULL, "+", &save); mod; mod = strtok_r(NULL, "+", &save)) {
		uint32_t count = 0;
		switch (parse_modifier(mod, &count)) {
		case MOD_LAYER: s.per_layer = true; break;
		case MOD_PIN: s.pin_layers = count; break;
		default: {
			char mods[96];
			list_modifiers(mods, sizeof(mods));
			return error_set(err, MOE_EINVAL,
			                 "policy '%s': unknown modifier '+%s' (%s)", text, mod,
			                 mods);
		}
		}
	}
	*out = s;
	return 0;
}

void policy_spec_name(const struct policy_spec *spec, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s%s", kind_names[spec->kind], spec->per_layer ? "+layer" : "");
	if (spec->pin_layers && n >= 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, "+pin%u", spec->pin_layers);
}

uint64_t policy_slots_needed(const struct policy_spec *spec, uint32_t n_layers, uint32_t n_experts,
                             uint32_t n_masked_pinned)
{
	/* The unpinned layers need one slot at least, or their first demand never loads. */
	return (uint64_t)spec->pin_layers * n_experts - n_masked_pinned +
	       (spec->pin_layers < n_layers);
}

uint64_t policy_members_slots_needed(const struct policy_spec *spec, uint32_t n_layers,
                                     const uint32_t *layer_experts)
{
	uint64_t pinned = 0, others = 0;
	for (uint32_t l = 0; l < n_layers; l++)
		*(l < spec->pin_layers ? &pinned : &others) += layer_experts[l];
	return pinned + (others > 0);
}

/* policy_create and policy_create_members: layer_experts NULL (every layer's n_experts, less
 * n_masked_pinned of the pinned ones), or each layer's members. */
static int create(struct residency_policy *p, const struct policy_spec *spec, uint32_t n_layers,
                  uint32_t n_experts, uint32_t capacity, uint32_t n_masked_pinned,
                  const uint32_t *layer_experts, struct sidecar_error *err);

int policy_create(struct residency_policy *p, const struct policy_spec *spec, uint32_t n_layers,
                  uint32_t n_experts, uint32_t capacity, uint32_t n_masked_pinned,
                  struct sidecar_error *err)
{
	return create(p, spec, n_layers, n_experts, capacity, n_masked_pinned, NULL, err);
}

int policy_create_members(struct residency_policy *p, const struct policy_spec *spec,
                          uint32_t n_layers, uint32_t n_experts, uint32_t capacity,
                          const uint32_t *layer_experts, struct sidecar_error *err)
{
	return create(p, spec, n_layers, n_experts, capacity, 0, layer_experts, err);
}

static int create(struct residency_policy *p, const struct policy_spec *spec, uint32_t n_layers,
                  uint32_t n_experts, uint32_t capacity, uint32_t n_masked_pinned,
                  const uint32_t *layer_experts, struct sidecar_error *err)
{
	memset(p, 0, sizeof(*p));
	if (!n_layers || !n_experts || (uint64_t)n_layers * n_experts >= POLICY_FULL)
		return error_set(err, MOE_EINVAL, "policy: bad model shape %u layers × %u experts",
		                 n_layers, n_experts);
	if (spec->pin_layers > n_layers)
		return error_set(err, MOE_EINVAL, "policy: +pin%u but the model has %u layers",
		                 spec->pin_layers, n_layers);
	uint64_t pinned = (uint64_t)spec->pin_layers * n_experts - n_masked_pinned;
	uint64_t needed = policy_slots_needed(spec, n_layers, n_experts, n_masked_pinned);
	uint64_t members = 0; /* the unpinned layers' members (layer_experts) */
	if (layer_experts) {
		pinned = 0;
		for (uint32_t l = 0; l < n_layers; l++) {
			if (layer_experts[l] > n_experts)
				return error_set(err, MOE_EINVAL,
				                 "policy: layer %u has %u members of %u experts", l,
				                 layer_experts[l], n_experts);
			*(l < spec->pin_layers ? &pinned : &members) += layer_experts[l];
		}
		needed = pinned + (members > 0);
	}
	if (needed > capacity)
		return error_set(
		    err, MOE_EINVAL,
		    "policy: %u pinned layers need %llu slots%s but the capacity is %u "
		    "slots",
		    spec->pin_layers, (unsigned long long)pinned,
		    needed > pinned ? " and the other layers one more" : "", capacity);
	p->spec = *spec;
	p->n_layers = n_layers;
	p->n_experts = n_experts;
	p->n_ids = n_layers * n_experts;
	p->capacity = capacity - (uint32_t)pinned;
	p->n_partitions = spec->per_layer ? n_layers : 1;
	p->quota = calloc(p->n_partitions, sizeof(*p->quota));
	p->count = calloc(p->n_partitions, sizeof(*p->count));
	p->queues = calloc(p->n_partitions, sizeof(*p->queues));
	p->prev = malloc(p->n_ids * sizeof(*p->prev));
	p->next = malloc(p->n_ids * sizeof(*p->next));
	p->in_queue = calloc(p->n_ids, 1);
	p->visited = calloc(p->n_ids, 1);
	p->heat = calloc(p->n_ids, sizeof(*p->heat));
	p->heat_at = calloc(p->n_ids, sizeof(*p->heat_at));
	p->visits = calloc(n_layers, sizeof(*p->visits));
	p->seen = calloc(p->n_ids, sizeof(*p->seen));
	p->last_layer = POLICY_NONE;
	if (!p->heat_at || !p->visits || !p->seen || !p->quota || !p->count || !p->queues ||
	    !p->prev || !p->next || !p->in_queue || !p->visited || !p->heat) {
		policy_destroy(p);
		return error_set(err, MOE_ENOMEM, "policy: out of memory for %u experts",
		                 n_layers * n_experts);
	}
	for (uint32_t i = 0; i < p->n_partitions; i++)
		p->queues[i] = (struct policy_queue){POLICY_NONE, POLICY_NONE, POLICY_NONE};
	/* Equal shares over the unpinned layers; the remainder goes to the first ones. */
	p->half_life = spec->heat_half_life > 0    ? spec->heat_half_life
	               : spec->kind == POLICY_HEAT ? POLICY_HEAT_HALF_LIFE_TOKENS
	                                           : (float)(p->capacity ? p->capacity : 1);
	if (spec->per_layer && layer_experts) {
		/* Shares in proportion to the layers' members; the remainder, one slot each, to
		 * the first layers with members (it is below their count). */
		uint32_t given = 0;
		for (uint32_t l = spec->pin_layers; l < n_layers && members; l++) {
			p->quota[l] =
			    (uint32_t)((uint64_t)p->capacity * layer_experts[l] / members);
			given += p->quota[l];
		}
		for (uint32_t l = spec->pin_layers; l < n_layers && given < p->capacity; l++)
			if (layer_experts[l]) {
				p->quota[l]++;
				given++;
			}
	} else if (spec->per_layer) {
		uint32_t free_layers = n_layers - spec->pin_layers;
		for (uint32_t l = spec->pin_layers; l < n_layers; l++) {
			uint32_t i = l - spec->pin_layers;
			p->quota[l] = p->capacity / free_layers + (i < p->capacity % free_layers);
		}
	} else {
		p->quota[0] = p->capacity;
	}
	return 0;
}

void policy_destroy(struct residency_policy *p)
{
	free(p->quota);
	free(p->count);
	free(p->queues);
	free(p->prev);
	free(p->next);
	free(p->in_queue);
	free(p->visited);
	free(p->heat);
	free(p->heat_at);
	free(p->visits);
	free(p->seen);
	memset(p, 0, sizeof(*p));
}

static void queue_push_head(struct residency_policy *p, struct policy_queue *q, uint32_t id)
{
	p->prev[id] = POLICY_NONE;
	p->next[id] = q->head;
	if (q->head != POLICY_NONE)
		p->prev[q->head] = id;
	q->head = id;
	if (q->tail == POLICY_NONE)
		q->tail = id;
}

static void queue_unlink(struct residency_policy *p, struct policy_queue *q, uint32_t id)
{
	uint32_t newer = p->prev[id], older = p->next[id];
	if (q->hand == id)
		q->hand = newer; /* SIEVE: the hand keeps moving toward the head */
	if (newer != POLICY_NONE)
		p->next[newer] = older;
	else
		q->head = older;
	if (older != POLICY_NONE)
		p->prev[older] = newer;
	else
		q->tail = newer;
}

/* sieve-heat: heat = Σ score · 2^(-age / half_life) over the policy's scored events: an
 * exponentially decayed average of the router scores an expert received, so it grows with
 * both how often and how strongly the router picks it, and fades when it stops being picked.
 * heat: Σ 1 · 2^(-age / half_life) over its layer's visits — a decayed count of the uses,
 * what a load costs whatever the score, in tokens of its own layer, so it is the rate at
 * which the layer needs the expert (× half_life / ln 2) whatever the other layers do. */
static void update_heat(struct residency_policy *p, uint32_t id, float score)
{
	if (!(score >= 0))
		return; /* no score (prefetch, warm-up), or NaN: not a use */
	p->now++;
	const uint32_t layer = id / p->n_experts;
	if (layer != p->last_layer || p->seen[id] == p->visits[layer])
		p->visits[layer]++; /* a new visit: another layer came between, or a repeat */
	p->last_layer = layer;
	p->seen[id] = p->visits[layer];
	policy_heat_settle(p, id);
	float h = p->heat[id] + (p->spec.kind == POLICY_HEAT ? 1.0f : score);
	float max = POLICY_HEAT_MAX * p->spec.heat_keep;
	p->heat[id] = h < max || p->spec.kind == POLICY_HEAT ? h : max;
}

void policy_insert(struct residency_policy *p, uint32_t id, float score)
{
	if (id >= p->n_ids || policy_is_pinned(p, id) || p->in_queue[id])
		return;
	uint32_t part = policy_partition(p, id);
	queue_push_head(p, &p->queues[part], id);
	p->in_queue[id] = 1;
	p->visited[id] = 0;
	update_heat(p, id, score);
	p->count[part]++;
	p->resident++;
}

void policy_access(struct residency_policy *p, uint32_t id, float score)
{
	if (id >= p->n_ids || !p->in_queue[id])
		return;
	update_heat(p, id, score);
	if (p->spec.kind == POLICY_LRU) {
		struct policy_queue *q = &p->queues[policy_partition(p, id)];
		queue_unlink(p, q, id);
		queue_push_head(p, q, id);
	} else {
		p->visited[id] = 1;
	}
}

void policy_remove(struct residency_policy *p, uint32_t id)
{
	if (id >= p->n_ids || !p->in_queue[id])
		return;
	uint32_t part = policy_partition(p, id);
	queue_unlink(p, &p->queues[part], id);
	p->in_queue[id] = 0;
	p->visited[id] = 0;
	p->count[part]--;
	p->resident--;
}

void policy_hint(struct residency_policy *p, uint32_t id, float score)
{
	if (id >= p->n_ids || !(score >= 0) || p->spec.kind == POLICY_LRU)
		return;
	/* "Needed soon" is what the visited bit means to the hand: a resident hinted expert
	 * survives the next pass once (SIEVE and SIEVE-heat), so the hint's own prefetches and
	 * demands do not evict it. SIEVE-heat: the score joins its heat like a router score. */
	if (p->in_queue[id])
		p->visited[id] = 1;
	if (p->spec.kind == POLICY_SIEVE_HEAT)
		update_heat(p, id, score);
}

bool policy_needs_eviction(const struct residency_policy *p, uint32_t incoming)
{
	if (incoming >= p->n_ids || policy_is_pinned(p, incoming) || p->in_queue[incoming])
		return false;
	uint32_t part = policy_partition(p, incoming);
	return p->resident >= p->capacity || p->count[part] >= p->quota[part];
}

/* The partition to take from when the incoming one cannot give: the one most over its share
 * that still holds something, skipping `skip` and partitions already tried (tried[]). */
static uint32_t most_over_quota(const struct residency_policy *p, uint32_t skip,
                                const uint8_t *tried)
{
	uint32_t best = POLICY_NONE;
	int64_t best_over = INT64_MIN;
	for (uint32_t i = 0; i < p->n_partitions; i++) {
		if (i == skip || !p->count[i] || (tried && tried[i]))
			continue;
		int64_t over = (int64_t)p->count[i] - (int64_t)p->quota[i];
		if (over > best_over) {
			best_over = over;
			best = i;
		}
	}
	return best;
}

static uint32_t victim_in(struct residency_policy *p, uint32_t part, bool prefetch, float priority,
                          policy_can_evict_fn can, void *arg)
{
	struct policy_queue *q = &p->queues[part];
	if (q->tail == POLICY_NONE)
		return POLICY_NONE;
	const struct policy_algorithm *a = algorithms[p->spec.kind];
	return prefetch ? a->prefetch_victim(p, q, priority, can, arg)
	                : a->victim(p, q, p->count[part], can, arg);
}

static uint32_t find_victim(struct residency_policy *p, uint32_t incoming, bool prefetch,
                            float priority, policy_can_evict_fn can, void *arg)
{
	if (incoming >= p->n_ids)
		return POLICY_NONE;
	uint32_t own = policy_partition(p, incoming);
	if (p->n_partitions == 1)
		return victim_in(p, 0, prefetch, priority, can, arg);
	/* Layer-aware: a full layer evicts its own; otherwise (or if nothing of its own may go)
	 * the layer most over its share gives, then the next, …, then (a demand) its own. */
	if (p->count[own] >= p->quota[own]) {
		uint32_t v = victim_in(p, own, prefetch, priority, can, arg);
		if (v != POLICY_NONE || prefetch)
			return v; /* a prefetch never takes from another layer's share */
	} else if (prefetch && p->resident >= p->capacity) {
		uint32_t other = most_over_quota(p, own, NULL);
		if (other == POLICY_NONE || p->count[other] <= p->quota[other])
			return POLICY_NONE;
		return victim_in(p, other, prefetch, priority, can, arg);
	}
	if (prefetch)
		return POLICY_NONE;
	/* Demand: try other partitions, most over quota first. Bounded by n_partitions. */
	uint8_t tried_small[256];
	uint8_t *tried = p->n_partitions <= sizeof(tried_small) ? tried_small : NULL;
	if (tried)
		memset(tried, 0, p->n_partitions);
	for (uint32_t round = 0; round < p->n_partitions; round++) {
		uint32_t part =
		    tried ? most_over_quota(p, own, tried) : most_over_quota(p, own, NULL);
		if (part == POLICY_NONE)
			break;
		uint32_t v = victim_in(p, part, false, 0, can, arg);
		if (v != POLICY_NONE)
			return v;
		if (!tried)
			break; /* very many layers: the most over its share, then in order */
		tried[part] = 1;
	}
	for (uint32_t part = 0; !tried && part < p->n_partitions; part++) {
		uint32_t v = part == own || !p->count[part]
		                 ? POLICY_NONE
		                 : victim_in(p, part, false, 0, can, arg);
		if (v != POLICY_NONE)
			return v;
	}
	/* Nothing elsewhere may go: a layer under its share replaces one of its own rather than
	 * be refused. */
	if (p->count[own] < p->quota[own] && p->count[own])
		return victim_in(p, own, false, 0, can, arg);
	return POLICY_NONE;
}

uint32_t policy_victim(struct residency_policy *p, uint32_t incoming, policy_can_evict_fn can,
                       void *arg)
{
	return find_victim(p, incoming, false, 0, can, arg);
}

uint32_t policy_make_room(struct residency_policy *p, uint32_t incoming, policy_can_evict_fn can,
                          void *arg)
{
	if (!policy_needs_eviction(p, incoming))
		return POLICY_NONE;
	if (p->resident < p->capacity) {
		/* Only the layer's share is reached: it gives one of its own or, when none may
		 * go (all in use, or a share of 0 slots), takes a free slot over its share.
		 * Evicting another layer's expert instead would only move the free slot, and
		 * would not lower this layer's count: asked again, it would empty every other
		 * layer and still be refused. */
		return victim_in(p, policy_partition(p, incoming), false, 0, can, arg);
	}
	const uint32_t v = find_victim(p, incoming, false, 0, can, arg);
	return v == POLICY_NONE ? POLICY_FULL : v;
}

uint32_t policy_make_room_prefetch(struct residency_policy *p, uint32_t incoming, float priority,
                                   policy_can_evict_fn can, void *arg)
{
	if (!policy_needs_eviction(p, incoming))
		return POLICY_NONE;
	const uint32_t v = find_victim(p, incoming, true, priority, can, arg);
	return v == POLICY_NONE ? POLICY_FULL : v;
}

uint32_t policy_prefetch_victim(struct residency_policy *p, uint32_t incoming, float priority,
                                policy_can_evict_fn can, void *arg)
{
	return find_victim(p, incoming, true, priority, can, arg);
}
