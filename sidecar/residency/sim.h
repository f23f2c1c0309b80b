/* sim.h — offline replay of a routing trace through the residency policies (simulate.c) and
 * through Belady's OPT (belady.c), counting hits and bytes read at a given capacity.
 *
 * Rules shared by both, so their figures are comparable: the experts of the (step, layer)
 * being served are all in use together, so none of them may be evicted to admit another
 * (live: they hold references); a miss that finds nothing evictable is served without being
 * admitted (counted a miss, its bytes read). Pinned layers (+pinN) are resident from the start
 * and every reference to them is a hit.
 *
 * Capacity, as the real residency has it (slot pools per size class, docs/residency.md):
 * experts belong to size classes, each class has its own slots and its own policy, and an
 * expert only ever takes a slot of its class. Without sizes (struct sim_sizes NULL) there is
 * one class of `capacity` slots and every load reads 1 (bytes = loads). sim_sizes_plan turns
 * each expert's slot bytes and a byte budget into the classes and their slots by the
 * residency's rules (residency.c: plan_classes, split_budget; one node).
 *
 * Prefetches (the trace's `p` lines: loads the sidecar started) are replayed when asked:
 *   - a policy treats one as the sidecar does: nothing if resident or pinned; else
 *     policy_make_room_prefetch at priority 1 (a prefetch only takes what the policy values
 *     less, never another prefetched expert not used yet); admitted, it is a read
 *     (prefetch_bytes), refused, it is dropped (not read);
 *   - Belady's OPT is given the same prefetches: one of an expert OPT does not hold is a read
 *     (prefetch_bytes, charged whether or not OPT keeps it, since the sidecar read it), and
 *     OPT keeps it only if a slot is free or its next use comes before that of the resident
 *     expert used farthest ahead (which it then evicts): the prefetched bytes are counted the
 *     same, and OPT uses a prefetch or not as best serves it.
 * Bytes are counted for the references and prefetches at steps >= from_step (a prefetch's
 * step: that of the reference line it precedes); hits and refs too.
 *
 * Errors: 0, or -1 with the record (util/error.h); MOE_EINVAL when the pinned layers do not
 * fit the capacity (policy_slots_needed tells beforehand).
 */
#ifndef MOE_RESIDENCY_SIM_H
#define MOE_RESIDENCY_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "expert_map.h"
#include "policy.h"
#include "trace.h"

#define SIM_MAX_CLASSES 8 /* SLOT_MAX_CLASSES */

struct sim_result {
	uint64_t refs, hits;
	uint64_t demand_loads, demand_bytes;     /* misses: loads, bytes they read */
	uint64_t prefetch_loads, prefetch_bytes; /* prefetches that read */
	uint64_t prefetch_dropped;               /* prefetches a policy refused */
};

/* Experts' sizes and the slots of each class. */
struct sim_sizes {
	uint32_t n_ids;                       /* n_layers × n_experts of the trace */
	uint32_t n_classes;                   /* 1..SIM_MAX_CLASSES */
	uint8_t *class_of;                    /* [n_ids] */
	uint64_t *bytes;                      /* [n_ids] what a load of the expert reads */
	uint64_t slot_bytes[SIM_MAX_CLASSES]; /* one slot of the class */
	uint32_t count[SIM_MAX_CLASSES];      /* experts of the class */
	uint32_t slots[SIM_MAX_CLASSES];      /* slots of the class (sim_sizes_budget) */
	uint64_t all_bytes;                   /* every expert's slot: the budget of 100 % */
};

/* The sizes of a model's experts: each expert's read bytes (its extents' supersets aligned
 * to `alignment`, as the loader reads them) and slot bytes (the same, its slot), the classes
 * as residency.c plans them. n_ids must match the trace's. 0, or -1 with err. */
int sim_sizes_from_map(const struct expert_map *map, uint64_t alignment, struct sim_sizes *out,
                       struct sidecar_error *err);
/* The same from given slot/read bytes per expert (tests): classes planned as from a map with
 * `max_extents` extents per expert at `alignment`. */
int sim_sizes_from_bytes(const uint64_t *bytes, uint32_t n_ids, uint64_t alignment,
                         uint32_t max_extents, struct sim_sizes *out, struct sidecar_error *err);
/* Each class's slots for a byte budget, as the residency splits it (split_budget, no pinned
 * layers): 0, or -1 with err when the budget is below one slot of each class. */
int sim_sizes_budget(struct sim_sizes *s, uint64_t budget, struct sidecar_error *err);
void sim_sizes_free(struct sim_sizes *s);

struct sim_options {
	const struct sim_sizes *sizes; /* NULL: one class of `capacity` slots, 1 per load */
	uint32_t capacity;             /* slots, without sizes */
	bool lookahead;  /* policies: the next line's experts as hints (see sim_run_policy) */
	bool prefetches; /* replay the trace's prefetch lines */
	uint32_t from_step;
};

int sim_replay_policy(const struct routing_trace *t, const struct policy_spec *spec,
                      const struct sim_options *o, struct sim_result *out,
                      struct sidecar_error *err);
int sim_replay_belady(const struct routing_trace *t, const struct sim_options *o,
                      struct sim_result *out, struct sidecar_error *err);

/* Replays `t` through the policy over `capacity` slots of one size, without prefetches. With
 * `lookahead`, before serving a line the policy gets hints for the next line's experts (a
 * perfect one-layer lookahead: the upper bound of what the engine's hints can give; only
 * sieve-heat uses hints). */
int sim_run_policy(const struct routing_trace *t, const struct policy_spec *spec, uint32_t capacity,
                   bool lookahead, struct sim_result *out, struct sidecar_error *err);

/* Belady's OPT under the same rules: on a miss with the cache full, evict the resident expert
 * whose next reference is farthest in the future. */
int sim_run_belady(const struct routing_trace *t, uint32_t capacity, uint32_t pin_layers,
                   struct sim_result *out, struct sidecar_error *err);

#endif
