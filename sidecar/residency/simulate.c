/* simulate.c — the replay loop of `moe-sidecar simulate`: a routing trace served through the
 * live policy code (policy.c) at one capacity (rules in sim.h): one policy per size class over
 * the class's slots, as the residency has them. The command itself, with its options, tables
 * and plot, is sidecar/cmd/simulate.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

struct sim_state {
	const uint32_t *line_stamp;
	const uint8_t *prefetched; /* loaded by a prefetch, not used yet */
	uint32_t stamp;
};

/* Experts of the line being served are in use and may not be evicted. */
static bool sim_can_evict(void *arg, uint32_t id)
{
	const struct sim_state *s = arg;
	return s->line_stamp[id] != s->stamp;
}

/* A prefetch never evicts a prefetched expert not used yet (residency.c: may_evict_unhinted):
 * the prefetches of one hint would evict each other. */
static bool sim_can_evict_for_prefetch(void *arg, uint32_t id)
{
	const struct sim_state *s = arg;
	return sim_can_evict(arg, id) && !s->prefetched[id];
}

static float scaled_score(const struct routing_trace *t, uint32_t ref)
{
	return t->scored ? t->scores[ref] * (float)t->top_k : 1.0f;
}

/* The priority a replayed prefetch carries (its score is not recorded): an average selected
 * expert. */
#define SIM_PREFETCH_PRIORITY 1.0f

/* One policy per class: class c's over its slots, with its members per layer. */
static int create_policies(struct residency_policy *p, const struct routing_trace *t,
                           const struct policy_spec *spec, const struct sim_options *o,
                           struct sidecar_error *err)
{
	if (!o->sizes)
		return policy_create(&p[0], spec, t->n_layers, t->n_experts, o->capacity, 0, err);
	const struct sim_sizes *s = o->sizes;
	if (s->n_ids != t->n_layers * t->n_experts)
		return error_set(err, MOE_EINVAL,
		                 "simulate: the sizes are for %u experts, the trace has %u",
		                 s->n_ids, t->n_layers * t->n_experts);
	uint32_t *members = calloc((size_t)s->n_classes * t->n_layers, sizeof(uint32_t));
	if (!members)
		return error_set(err, MOE_ENOMEM, "simulate: out of memory");
	for (uint32_t id = 0; id < s->n_ids; id++)
		members[s->class_of[id] * t->n_layers + id / t->n_experts]++;
	int rc = 0;
	uint32_t c = 0;
	for (; rc == 0 && c < s->n_classes; c++)
		rc = policy_create_members(&p[c], spec, t->n_layers, t->n_experts, s->slots[c],
		                           members + c * t->n_layers, err);
	if (rc)
		while (c-- > 1)
			policy_destroy(&p[c - 1]);
	free(members);
	return rc;
}

/* One reference of the line being served: a hit, or a miss that loads (and evicts). */
static void replay_ref(struct residency_policy *pc, uint32_t id, float score, bool counted,
                       const struct sim_options *o, uint8_t *resident, uint8_t *prefetched,
                       struct sim_state *st, struct sim_result *r)
{
	if (policy_is_pinned(pc, id)) {
		r->hits += counted;
		return;
	}
	if (resident[id]) {
		r->hits += counted;
		prefetched[id] = 0;
		policy_access(pc, id, score);
		return;
	}
	if (counted) {
		r->demand_loads++;
		r->demand_bytes += o->sizes ? o->sizes->bytes[id] : 1;
	}
	const uint32_t v = policy_make_room(pc, id, sim_can_evict, st);
	if (v != POLICY_NONE && v != POLICY_FULL) {
		policy_remove(pc, v);
		resident[v] = 0;
		prefetched[v] = 0;
	}
	if (v != POLICY_FULL) {
		policy_insert(pc, id, score);
		resident[id] = 1;
	}
}

int sim_replay_policy(const struct routing_trace *t, const struct policy_spec *spec,
                      const struct sim_options *o, struct sim_result *out,
                      struct sidecar_error *err)
{
	struct residency_policy pol[SIM_MAX_CLASSES];
	const uint32_t n_classes = o->sizes ? o->sizes->n_classes : 1;
	int rc = create_policies(pol, t, spec, o, err);
	if (rc)
		return rc;
	const uint32_t E = t->n_experts, n_ids = t->n_layers * t->n_experts;
	uint8_t *resident = calloc(n_ids, 1);
	uint32_t *stamp = calloc(n_ids, sizeof(*stamp));
	uint8_t *prefetched = calloc(n_ids, 1);
	if (!resident || !stamp || !prefetched) {
		error_set(err, MOE_ENOMEM, "simulate: out of memory");
		rc = -1;
		goto out;
	}
	struct sim_state st = {stamp, prefetched, 0};
	struct sim_result r = {0};
	const uint32_t n_pf = o->prefetches ? t->n_prefetches : 0;
	uint32_t pf = 0;
	for (uint32_t li = 0; li <= t->n_lines && t->n_lines; li++) {
		const uint32_t step = t->lines[li < t->n_lines ? li : li - 1].step;
		const bool counted = step >= o->from_step;
		st.stamp = li + 1;
		for (; pf < n_pf && t->prefetches[pf].before_line == li; pf++) {
			const struct trace_prefetch *p = &t->prefetches[pf];
			for (uint32_t j = p->first; j < p->first + p->count; j++) {
				const uint32_t id = p->layer * E + t->pf_ids[j];
				struct residency_policy *pc =
				    &pol[o->sizes ? o->sizes->class_of[id] : 0];
				if (resident[id] || policy_is_pinned(pc, id))
					continue;
				const uint32_t v = policy_make_room_prefetch(
				    pc, id, SIM_PREFETCH_PRIORITY, sim_can_evict_for_prefetch, &st);
				if (v == POLICY_FULL) {
					r.prefetch_dropped += counted;
					continue;
				}
				if (v != POLICY_NONE) {
					policy_remove(pc, v);
					resident[v] = 0;
				}
				prefetched[id] = 1;
				policy_insert(pc, id, -1.0f);
				policy_hint(pc, id, SIM_PREFETCH_PRIORITY);
				resident[id] = 1;
				if (counted) {
					r.prefetch_loads++;
					r.prefetch_bytes += o->sizes ? o->sizes->bytes[id] : 1;
				}
			}
		}
		if (li == t->n_lines)
			break;
		const struct trace_line *l = &t->lines[li];
		for (uint32_t j = l->first; j < l->first + l->count; j++)
			stamp[l->layer * E + t->ids[j]] = st.stamp;
		if (o->lookahead && li + 1 < t->n_lines) {
			const struct trace_line *n = &t->lines[li + 1];
			for (uint32_t j = n->first; j < n->first + n->count; j++) {
				const uint32_t id = n->layer * E + t->ids[j];
				policy_hint(&pol[o->sizes ? o->sizes->class_of[id] : 0], id,
				            scaled_score(t, j));
			}
		}
		if (counted)
			r.refs += l->count;
		/* In the sidecar's order: by expert id, those resident (or pinned) first, then the
		 * cold ones (residency_demand_layer over the forward engine's groups). */
		uint32_t order[TRACE_MAX_TOPK], n = 0;
		for (uint32_t j = l->first; j < l->first + l->count; j++) {
			uint32_t at = n++;
			for (; at > 0 && t->ids[order[at - 1]] > t->ids[j]; at--)
				order[at] = order[at - 1];
			order[at] = j;
		}
		for (int pass = 0; pass < 2; pass++)
			for (uint32_t o_i = 0; o_i < n; o_i++) {
				const uint32_t j = order[o_i];
				const uint32_t id = l->layer * E + t->ids[j];
				struct residency_policy *pc =
				    &pol[o->sizes ? o->sizes->class_of[id] : 0];
				const bool held = resident[id] || policy_is_pinned(pc, id);
				if (held != (pass == 0))
					continue;
				replay_ref(pc, id, scaled_score(t, j), counted, o, resident,
				           prefetched, &st, &r);
			}
	}
	*out = r;
	rc = 0;
out:
	free(resident);
	free(stamp);
	free(prefetched);
	for (uint32_t c = 0; c < n_classes; c++)
		policy_destroy(&pol[c]);
	return rc;
}

int sim_run_policy(const struct routing_trace *t, const struct policy_spec *spec, uint32_t capacity,
                   bool lookahead, struct sim_result *out, struct sidecar_error *err)
{
	const struct sim_options o = {.capacity = capacity, .lookahead = lookahead};
	return sim_replay_policy(t, spec, &o, out, err);
}
