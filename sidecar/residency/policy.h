/* policy.h — residency policies: which resident expert to evict, behind one interface.
 *
 * The same policy code runs live (residency.c, under the residency lock) and offline in the
 * simulator (simulate.c). A policy only orders experts; it never touches memory or I/O. The
 * caller owns the resident set and tells the policy what happened (insert, access, remove,
 * hint); the policy answers one question: "which expert goes to make room for this one?".
 *
 * Experts are named by a dense id, layer * n_experts + expert. Capacity is counted in slots
 * (one expert per slot: slots are sized for the largest expert of the model, or, with experts
 * of several sizes, one policy per size class orders that class's experts over its slots:
 * policy_create_members).
 *
 * Policies (name as accepted by policy_spec_parse):
 *   lru          one recency list
 *   sieve        SIEVE (NSDI'24): FIFO queue, a visited bit, a hand moving tail → head
 *   sieve-heat   SIEVE whose hand also spares experts with high heat: an exponentially
 *                decayed average of router scores over time, raised by lookahead hints
 *   heat         the expert its layer used least lately goes: a count of its uses decayed
 *                with a half-life of 128 of its layer's tokens (a frequency estimate)
 * Modifiers, appended with '+':
 *   +layer       layer-aware capacity: one queue and an equal share of the capacity per
 *                layer (a single global queue is a known trap: layers are visited cyclically)
 *   +pinN        the first N layers are pinned: fully resident, never offered to the policy
 * e.g. "sieve+layer+pin2". Without +layer every policy keeps one global queue.
 *
 * Threading: none of its own; the caller serialises every call on one policy.
 * Allocation: only in policy_create; every other call is allocation-free.
 */
#ifndef MOE_RESIDENCY_POLICY_H
#define MOE_RESIDENCY_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define POLICY_NONE UINT32_MAX
#define POLICY_FULL (UINT32_MAX - 1) /* policy_make_room: cannot admit now */

enum policy_kind {
	POLICY_LRU = 0,
	POLICY_SIEVE = 1,
	POLICY_SIEVE_HEAT = 2,
	POLICY_HEAT = 3,
	POLICY_KIND_COUNT
};

struct policy_spec {
	enum policy_kind kind;
	bool per_layer;       /* +layer: one partition per layer */
	uint32_t pin_layers;  /* +pinN: layers [0, N) fully resident */
	float heat_half_life; /* sieve-heat: scored events for a score to lose half its
	                         weight (0, the default: the policy's capacity); heat: its
	                         layer's visits for a use to (0: POLICY_HEAT_HALF_LIFE_TOKENS) */
	float heat_keep;      /* sieve-heat: heat at or above which the hand spares (default 2) */
};

/* The policy a residency gets when its configuration names none. */
#define POLICY_DEFAULT_SPEC "heat+layer"

/* Parses "lru", "sieve+layer+pin2", …: 0, or -1 with a message naming the bad part. */
int policy_spec_parse(const char *text, struct policy_spec *out, struct sidecar_error *err);
/* What policy_spec_parse accepts, from the same tables, for help texts:
 * "lru, sieve, sieve-heat; modifiers +layer, +pinN". */
void policy_spec_help(char *buf, size_t len);
/* Canonical name of a spec ("sieve-heat+layer+pin2") into buf. */
void policy_spec_name(const struct policy_spec *spec, char *buf, size_t len);

/* Asked by the policy before it names a victim: may this resident expert go now? (Live: not
 * referenced and not loading. Simulator: not needed by the step being served.) */
typedef bool (*policy_can_evict_fn)(void *arg, uint32_t id);

struct policy_queue; /* one per partition (policy_internal.h) */

struct residency_policy {
	struct policy_spec spec;
	uint32_t n_layers, n_experts, n_ids;
	uint32_t capacity;           /* slots offered to the policy (pinned ones excluded) */
	uint32_t n_partitions;       /* n_layers with +layer, else 1 */
	uint32_t *quota;             /* [n_partitions] slots each partition may hold */
	uint32_t *count;             /* [n_partitions] experts each partition holds now */
	uint32_t resident;           /* experts the policy holds (sum of count) */
	struct policy_queue *queues; /* [n_partitions] */
	/* Per id: intrusive doubly-linked queue, visited bit, heat. */
	uint32_t *prev, *next;
	uint8_t *in_queue, *visited;
	float *heat;       /* as of heat_at[id] */
	uint64_t *heat_at; /* policy_clock (policy_internal.h) at the last update */
	uint64_t now;
	float half_life; /* resolved heat_half_life */
	/* heat's clock: its layer's visits — a run of scored events (uses) on one layer with
	 * no expert twice: a token's (or a batch's) demand of that layer's experts of this
	 * policy — so it ages in tokens of its own layer. */
	uint64_t *visits;    /* [n_layers] */
	uint64_t *seen;      /* [n_ids] the visit of the expert's last scored event */
	uint32_t last_layer; /* the layer of the last scored event (POLICY_NONE: none yet) */
};

/* Creates a policy for n_layers × n_experts over `capacity` slots in total. Pinned layers
 * (spec->pin_layers) take n_experts slots each out of the capacity, minus `n_masked_pinned`
 * (pinned experts that are GPU-masked and so never held). Any capacity of one slot or more
 * serves every layer, also with +layer and fewer slots than layers (see policy_make_room).
 * 0, or -1 with err: a bad shape or spec, no memory, or a capacity below
 * policy_slots_needed (the pinned layers do not fit with one slot left for the others). */
int policy_create(struct residency_policy *p, const struct policy_spec *spec, uint32_t n_layers,
                  uint32_t n_experts, uint32_t capacity, uint32_t n_masked_pinned,
                  struct sidecar_error *err);
/* The smallest capacity policy_create accepts for a spec whose pin_layers ≤ n_layers: the
 * pinned layers' experts less n_masked_pinned, and one slot for the other layers if any. */
uint64_t policy_slots_needed(const struct policy_spec *spec, uint32_t n_layers, uint32_t n_experts,
                             uint32_t n_masked_pinned);
/* The same for the experts of one slot size class (residency.c): layer_experts[l] of layer
 * l's experts are this policy's members (the others belong to another class's policy and are
 * never inserted here). The pinned layers' members take their slots out of the capacity;
 * +layer shares go to the unpinned layers in proportion to their members, so a capacity of
 * every member gives each layer all of its own. */
int policy_create_members(struct residency_policy *p, const struct policy_spec *spec,
                          uint32_t n_layers, uint32_t n_experts, uint32_t capacity,
                          const uint32_t *layer_experts, struct sidecar_error *err);
/* The smallest capacity policy_create_members accepts: the pinned layers' members, and one
 * slot for the unpinned layers' if they have any. */
uint64_t policy_members_slots_needed(const struct policy_spec *spec, uint32_t n_layers,
                                     const uint32_t *layer_experts);
void policy_destroy(struct residency_policy *p);

static inline uint32_t policy_id(const struct residency_policy *p, uint32_t layer, uint32_t expert)
{
	return layer * p->n_experts + expert;
}

static inline bool policy_is_pinned(const struct residency_policy *p, uint32_t id)
{
	return id / p->n_experts < p->spec.pin_layers;
}

/* Events. Pinned ids are accepted and ignored (they are never in a queue). */
/* Scores are router probabilities scaled by top_k (1.0 = an average selected expert); a
 * negative score means "no score" (a prefetch: nothing was used). */
void policy_insert(struct residency_policy *p, uint32_t id, float score); /* admitted (miss) */
void policy_access(struct residency_policy *p, uint32_t id, float score); /* used (hit) */
void policy_remove(struct residency_policy *p, uint32_t id); /* left the resident set */
/* Lookahead hint: the expert is likely needed soon with this router score. SIEVE and
 * sieve-heat: a resident expert gets its visited bit (survives the hand's next pass, and no
 * prefetch takes it); sieve-heat also adds the score to its heat. LRU ignores hints. */
void policy_hint(struct residency_policy *p, uint32_t id, float score);

/* Does admitting `incoming` want an eviction first? (total or its partition full) */
bool policy_needs_eviction(const struct residency_policy *p, uint32_t incoming);

/* The admission rule, the one every caller (residency, simulator) applies: what admitting
 * `incoming` takes. POLICY_NONE: admit it as it is; an id: evict that expert first
 * (policy_remove), then admit; POLICY_FULL: it cannot be admitted now (every slot holds an
 * expert `can` refuses). At most one eviction per admission. With +layer a layer at its share
 * evicts its own; when it cannot (its experts in use, or a share of 0 slots: fewer slots than
 * layers) it takes a free slot over its share, or, every slot taken, an expert of the layer
 * most over its share — so a demand is refused only when every slot is in use. */
uint32_t policy_make_room(struct residency_policy *p, uint32_t incoming, policy_can_evict_fn can,
                          void *arg);
/* The same for a prefetch with priority in [0, 1] (policy_prefetch_victim's rules): never
 * beyond a layer's share, never what the policy values more; POLICY_FULL: drop it. */
uint32_t policy_make_room_prefetch(struct residency_policy *p, uint32_t incoming, float priority,
                                   policy_can_evict_fn can, void *arg);

/* Names the expert to evict to admit `incoming`, or POLICY_NONE if nothing may go. Demand
 * eviction moves the policy's state (LRU: none; SIEVE: the hand, clearing visited bits).
 * The victim stays in the policy until the caller calls policy_remove. */
uint32_t policy_victim(struct residency_policy *p, uint32_t incoming, policy_can_evict_fn can,
                       void *arg);

/* Victim for a prefetch of `incoming` with priority in [0, 1]: only an expert the policy
 * values less than what the prefetch brings, found without changing any state (a prefetch
 * never clears a visited bit or moves the hand). LRU: the least recent expert. SIEVE: an
 * unvisited expert. SIEVE-heat: an unvisited expert whose heat is below `priority`. */
uint32_t policy_prefetch_victim(struct residency_policy *p, uint32_t incoming, float priority,
                                policy_can_evict_fn can, void *arg);

#endif
