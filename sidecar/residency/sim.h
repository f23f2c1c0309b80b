/* sim.h — offline replay of a routing trace through the residency policies (simulate.c) and
 * through Belady's OPT (belady.c), counting hits at a given capacity.
 *
 * Rules shared by both, so their hit rates are comparable: capacity counts expert slots;
 * the experts of the (step, layer) being served are all in use together, so none of them may
 * be evicted to admit another (live: they hold references); a miss that finds nothing
 * evictable is served without being admitted (counted a miss). Pinned layers (+pinN) are
 * resident from the start and every reference to them is a hit.
 * Errors: 0, or -1 with the record (util/error.h); MOE_EINVAL when the pinned layers do not
 * fit the capacity (policy_slots_needed tells beforehand).
 */
#ifndef MOE_RESIDENCY_SIM_H
#define MOE_RESIDENCY_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy.h"
#include "trace.h"

struct sim_result {
	uint64_t refs, hits;
};

/* Replays `t` through the policy. With `lookahead`, before serving a line the policy gets
 * hints for the next line's experts (a perfect one-layer lookahead: the upper bound of what
 * the engine's hints can give; only sieve-heat uses hints). */
int sim_run_policy(const struct routing_trace *t, const struct policy_spec *spec, uint32_t capacity,
                   bool lookahead, struct sim_result *out, struct sidecar_error *err);

/* Belady's OPT under the same rules: on a miss with the cache full, evict the resident expert
 * whose next reference is farthest in the future. */
int sim_run_belady(const struct routing_trace *t, uint32_t capacity, uint32_t pin_layers,
                   struct sim_result *out, struct sidecar_error *err);

#endif
