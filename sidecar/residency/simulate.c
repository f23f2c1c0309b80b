/* simulate.c — the replay loop of `moe-sidecar simulate`: a routing trace served through the
 * live policy code (policy.c) at one capacity (rules in sim.h). The command itself, with its
 * options, tables and plot, is sidecar/cmd/simulate.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

struct sim_state {
	const uint32_t *line_stamp;
	uint32_t stamp;
};

/* Experts of the line being served are in use and may not be evicted. */
static bool sim_can_evict(void *arg, uint32_t id)
{
	const struct sim_state *s = arg;
	return s->line_stamp[id] != s->stamp;
}

static float scaled_score(const struct routing_trace *t, uint32_t ref)
{
	return t->scored ? t->scores[ref] * (float)t->top_k : 1.0f;
}

int sim_run_policy(const struct routing_trace *t, const struct policy_spec *spec, uint32_t capacity,
                   bool lookahead, struct sim_result *out, struct sidecar_error *err)
{
	struct residency_policy p;
	int rc = policy_create(&p, spec, t->n_layers, t->n_experts, capacity, 0, err);
	if (rc)
		return rc;
	const uint32_t E = t->n_experts;
	uint8_t *resident = calloc(p.n_ids, 1);
	uint32_t *stamp = calloc(p.n_ids, sizeof(*stamp));
	if (!resident || !stamp) {
		error_set(err, MOE_ENOMEM, "simulate: out of memory");
		rc = -1;
		goto out;
	}
	struct sim_state st = {stamp, 0};
	struct sim_result r = {0};
	for (uint32_t li = 0; li < t->n_lines; li++) {
		const struct trace_line *l = &t->lines[li];
		st.stamp = li + 1;
		for (uint32_t j = l->first; j < l->first + l->count; j++)
			stamp[l->layer * E + t->ids[j]] = st.stamp;
		if (lookahead && li + 1 < t->n_lines) {
			const struct trace_line *n = &t->lines[li + 1];
			for (uint32_t j = n->first; j < n->first + n->count; j++)
				policy_hint(&p, n->layer * E + t->ids[j], scaled_score(t, j));
		}
		r.refs += l->count;
		for (uint32_t j = l->first; j < l->first + l->count; j++) {
			uint32_t id = l->layer * E + t->ids[j];
			float score = scaled_score(t, j);
			if (policy_is_pinned(&p, id)) {
				r.hits++;
				continue;
			}
			if (resident[id]) {
				r.hits++;
				policy_access(&p, id, score);
				continue;
			}
			const uint32_t v = policy_make_room(&p, id, sim_can_evict, &st);
			if (v != POLICY_NONE && v != POLICY_FULL) {
				policy_remove(&p, v);
				resident[v] = 0;
			}
			if (v != POLICY_FULL) {
				policy_insert(&p, id, score);
				resident[id] = 1;
			}
		}
	}
	*out = r;
	rc = 0;
out:
	free(resident);
	free(stamp);
	policy_destroy(&p);
	return rc;
}
