/* test_policy.c — residency policies against hand-computed sequences: LRU order, SIEVE's
 * hand and visited bits (a worked example in the style of the NSDI'24 paper's figure),
 * SIEVE+heat sparing hot and hinted experts, prefetch never clearing state, layer-aware
 * partitions, pinning, and random operation sequences checked against the invariants. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "policy_internal.h"

static struct residency_policy make(const char *spec_text, uint32_t layers, uint32_t experts,
                                    uint32_t capacity)
{
	struct policy_spec spec;
	struct sidecar_error err = {0};
	cr_assert_eq(policy_spec_parse(spec_text, &spec, &err), 0, "%s", err.msg);
	struct residency_policy p;
	cr_assert_eq(policy_create(&p, &spec, layers, experts, capacity, 0, &err), 0, "%s",
	             err.msg);
	return p;
}

/* Admit id the way the live cache does (policy_make_room, then insert). Returns the victim
 * or POLICY_NONE. */
static uint32_t admit_if(struct residency_policy *p, uint32_t id, policy_can_evict_fn can,
                         void *arg)
{
	uint32_t v = policy_make_room(p, id, can, arg);
	cr_assert_neq(v, POLICY_FULL, "no room to admit %u", id);
	if (v != POLICY_NONE)
		policy_remove(p, v);
	policy_insert(p, id, 1.0f);
	return v;
}

static uint32_t admit(struct residency_policy *p, uint32_t id)
{
	return admit_if(p, id, NULL, NULL);
}

Test(policy_lru, evicts_least_recent)
{
	struct residency_policy p = make("lru", 1, 8, 3);
	cr_assert_eq(admit(&p, 0), POLICY_NONE);
	cr_assert_eq(admit(&p, 1), POLICY_NONE);
	cr_assert_eq(admit(&p, 2), POLICY_NONE);
	policy_access(&p, 0, 1);       /* order (old→new): 1 2 0 */
	cr_assert_eq(admit(&p, 3), 1); /* 2 0 3 */
	policy_access(&p, 2, 1);       /* 0 3 2 */
	cr_assert_eq(admit(&p, 4), 0); /* 3 2 4 */
	cr_assert_eq(admit(&p, 5), 3); /* 2 4 5 */
	cr_assert_eq(p.resident, 3);
	policy_destroy(&p);
}

static bool not_id(void *arg, uint32_t id)
{
	return id != *(uint32_t *)arg;
}

static bool not_busy_id(void *arg, uint32_t id)
{
	return not_id(arg, id);
}

static bool never(void *arg, uint32_t id)
{
	(void)arg;
	(void)id;
	return false;
}

Test(policy_lru, skips_what_may_not_go)
{
	struct residency_policy p = make("lru", 1, 8, 2);
	admit(&p, 0);
	admit(&p, 1);
	uint32_t busy = 0;
	cr_assert_eq(policy_victim(&p, 2, not_id, &busy), 1);
	policy_destroy(&p);
}

enum { A, B, C, D, E, F, G, H, I, J, K, L };

/* Seven slots hold A..G (A oldest); A, B and G were hit. The hand starts at the tail. */
Test(policy_sieve, paper_style_example)
{
	struct residency_policy p = make("sieve", 1, 16, 7);
	for (uint32_t id = A; id <= G; id++)
		admit(&p, id);
	policy_access(&p, A, 1);
	policy_access(&p, B, 1);
	policy_access(&p, G, 1);
	/* H: A and B are visited (bits cleared, kept in place), C is the victim. */
	cr_assert_eq(admit(&p, H), C);
	cr_assert_eq(p.visited[A], 0);
	cr_assert_eq(p.visited[B], 0);
	cr_assert_eq(p.visited[G], 1);
	/* Hits on A and D; I: the hand is at D (visited → cleared), E goes. */
	policy_access(&p, A, 1);
	policy_access(&p, D, 1);
	cr_assert_eq(admit(&p, I), E);
	/* J: the hand moved on to F, unvisited. */
	cr_assert_eq(admit(&p, J), F);
	/* K: G is visited (cleared); next toward the head is H, new and unvisited. */
	cr_assert_eq(admit(&p, K), H);
	/* L: the hand is at I (unvisited) — new objects are not spared. */
	cr_assert_eq(admit(&p, L), I);
	/* Queue now (old→new): A B D G J K L, the hand at J; only A is visited. Hits on J, K
	 * and L: the hand clears them, reaches the head, wraps to the tail, clears A and
	 * evicts B. */
	policy_access(&p, J, 1);
	policy_access(&p, K, 1);
	policy_access(&p, L, 1);
	cr_assert_eq(admit(&p, 12), B);
	cr_assert_eq(p.visited[A], 0);
	cr_assert_eq(p.visited[J] + p.visited[K] + p.visited[L], 0);
	/* The hand stopped at D (B's newer neighbour), unvisited. */
	cr_assert_eq(admit(&p, 13), D);
	cr_assert_eq(p.resident, 7);
	policy_destroy(&p);
}

Test(policy_sieve, skips_busy_without_clearing_them)
{
	struct residency_policy p = make("sieve", 1, 8, 3);
	admit(&p, 0);
	admit(&p, 1);
	admit(&p, 2);
	policy_access(&p, 0, 1);
	uint32_t busy = 1;
	/* 0 visited → cleared; 1 busy → skipped; 2 unvisited → victim. */
	cr_assert_eq(policy_victim(&p, 5, not_id, &busy), 2);
	cr_assert_eq(p.visited[0], 0);
	policy_destroy(&p);
}

Test(policy_sieve, prefetch_never_clears_visited_bits)
{
	struct residency_policy p = make("sieve", 1, 8, 2);
	admit(&p, 0);
	admit(&p, 1);
	policy_access(&p, 0, 1);
	policy_access(&p, 1, 1);
	cr_assert_eq(policy_prefetch_victim(&p, 2, 1.0f, NULL, NULL), POLICY_NONE);
	cr_assert_eq(p.visited[0], 1);
	cr_assert_eq(p.visited[1], 1);
	/* Demand does clear them, and evicts the oldest. */
	cr_assert_eq(policy_victim(&p, 2, NULL, NULL), 0);
	policy_destroy(&p);
}

/* Plain SIEVE takes a lookahead hint as one visited bit (no heat); LRU ignores hints. */
Test(policy_sieve, hint_gives_one_pass)
{
	struct residency_policy p = make("sieve", 1, 8, 3);
	admit(&p, 0);
	admit(&p, 1);
	admit(&p, 2);
	policy_hint(&p, 0, 1.0f);
	cr_assert_eq(p.visited[0], 1);
	cr_assert_eq(policy_prefetch_victim(&p, 3, 1.0f, NULL, NULL), 1, "a prefetch spares it");
	cr_assert_eq(policy_victim(&p, 3, NULL, NULL), 1, "the demand hand spares it once");
	cr_assert_eq(p.visited[0], 0, "the hand used up the hint");
	policy_destroy(&p);
	struct residency_policy l = make("lru", 1, 8, 3);
	admit(&l, 0);
	admit(&l, 1);
	admit(&l, 2);
	policy_hint(&l, 0, 1.0f);
	cr_assert_eq(policy_victim(&l, 3, NULL, NULL), 0, "LRU: hints do not count");
	policy_destroy(&l);
}

Test(policy_sieve_heat, hint_gives_one_pass_and_heat_guards_prefetch)
{
	struct residency_policy p = make("sieve-heat", 1, 8, 3);
	admit(&p, 0);
	admit(&p, 1);
	admit(&p, 2);
	for (uint32_t id = 0; id < 3; id++)
		p.heat[id] = 0; /* as if never scored */
	/* Plain SIEVE would evict 0 (oldest, unvisited). A lookahead hint marks it needed. */
	policy_hint(&p, 0, 1.0f);
	cr_assert_eq(p.visited[0], 1);
	cr_assert_float_eq(policy_heat_now(&p, 0), 1.0f, 1e-6);
	cr_assert_eq(policy_victim(&p, 3, NULL, NULL), 1);
	cr_assert_eq(p.visited[0], 0, "the hand used up the hint");
	policy_remove(&p, 1);
	policy_insert(&p, 3, -1); /* a prefetch: no score, no heat */
	/* Hot experts: heat 3 at the current clock. A prefetch of priority 0.5 takes none. */
	p.heat[2] = p.heat[3] = 3.0f;
	p.heat_at[2] = p.heat_at[3] = p.now;
	cr_assert_eq(policy_prefetch_victim(&p, 4, 0.5f, NULL, NULL), POLICY_NONE);
	/* Priority 5 outweighs them: the first unvisited one from the hand (2) may go. */
	cr_assert_eq(policy_prefetch_victim(&p, 4, 5.0f, NULL, NULL), 2);
	/* Heat makes the demand hand spare an unvisited expert once, halving it. */
	cr_assert_eq(policy_victim(&p, 4, NULL, NULL), 0, "0: heat 1 < keep 2, unvisited");
	cr_assert_float_eq(policy_heat_now(&p, 2), 1.5f, 1e-5, "2 was spared, its heat halved");
	cr_assert_float_eq(policy_heat_now(&p, 3), 1.5f, 1e-5, "3 was spared, its heat halved");
	policy_destroy(&p);
}

Test(policy_heat, decayed_sum_of_scores)
{
	struct residency_policy p = make("sieve-heat", 1, 4, 4); /* half-life = 4 accesses */
	cr_assert_float_eq(p.half_life, 4.0f, 1e-6);
	policy_insert(&p, 0, 1.0f);
	cr_assert_float_eq(policy_heat_now(&p, 0), 1.0f, 1e-6);
	policy_access(&p, 0, 2.0f); /* one access later */
	float expect = 1.0f * exp2f(-1.0f / 4) + 2.0f;
	cr_assert_float_eq(policy_heat_now(&p, 0), expect, 1e-5);
	policy_insert(&p, 1, 0.0f);
	for (int i = 0; i < 3; i++)
		policy_access(&p, 1, 0.0f); /* four ticks of the clock in all */
	cr_assert_float_eq(policy_heat_now(&p, 0), expect / 2, 1e-5, "half-life of 4 accesses");
	policy_destroy(&p);
}

/* heat: the coldest goes (a decayed count of uses, uncapped), the oldest on a tie; a
 * prefetch only takes one colder than its priority; the half-life defaults to 128 tokens. */
Test(policy_heat, the_coldest_goes_and_prefetch_only_below_its_priority)
{
	struct residency_policy p = make("heat", 1, 8, 3);
	cr_assert_float_eq(p.half_life, POLICY_HEAT_HALF_LIFE_TOKENS, 1e-6);
	admit(&p, 0); /* heats 1, in the layer's first visit */
	admit(&p, 1);
	admit(&p, 2);
	for (int i = 0; i < 400; i++)
		policy_access(&p, 0, 1.0f); /* each a repeat: a visit of its own */
	cr_assert_eq(p.visits[0], 401);
	policy_access(&p, 2, 1.0f); /* in 0's last visit */
	cr_assert_eq(p.visits[0], 401);
	const float h0 = (1.0f - exp2f(-401.0f / 128)) / (1.0f - exp2f(-1.0f / 128));
	cr_assert_float_eq(policy_heat_now(&p, 0), h0, 1e-2, "uncapped (sieve-heat's is 128)");
	cr_assert_gt(h0, 128.0f);
	/* 1 is the coldest (one use, 400 visits ago: 0.11). */
	cr_assert_float_eq(policy_heat_now(&p, 1), exp2f(-400.0f / 128), 1e-5);
	cr_assert_eq(policy_victim(&p, 3, NULL, NULL), 1);
	cr_assert_eq(policy_prefetch_victim(&p, 3, 0.1f, NULL, NULL), POLICY_NONE,
	             "nothing colder than 0.1");
	cr_assert_eq(policy_prefetch_victim(&p, 3, 0.5f, NULL, NULL), 1);
	/* With 1 in use, 2 (two uses) goes before 0 (401). */
	uint32_t busy = 1;
	cr_assert_eq(policy_victim(&p, 3, not_busy_id, &busy), 2);
	/* Equal heats: the oldest. */
	struct residency_policy q = make("heat", 1, 8, 2);
	admit(&q, 5);
	admit(&q, 6);
	q.heat[5] = q.heat[6] = 1.0f;
	q.heat_at[5] = q.heat_at[6] = policy_clock(&q, 5);
	cr_assert_eq(policy_victim(&q, 7, NULL, NULL), 5);
	policy_destroy(&q);
	policy_destroy(&p);
}

/* heat counts uses, not scores (a miss reads the same bytes whatever its score), and ages in
 * its own layer's tokens: the expert a layer used twice with low scores outlives the one it
 * used once with a high score, and no number of other layers' tokens ages a layer's heat. */
Test(policy_heat, counts_uses_in_its_layers_tokens)
{
	struct residency_policy p = make("heat+layer", 2, 4, 4); /* 2 slots per layer */
	const uint32_t a = policy_id(&p, 0, 0), b = policy_id(&p, 0, 1), c = policy_id(&p, 0, 2);
	const uint32_t x = policy_id(&p, 1, 0);
	/* Token 1: layer 0 uses a (score 3.0) and b (0.1), layer 1 uses x. */
	policy_insert(&p, a, 3.0f);
	policy_insert(&p, b, 0.1f);
	policy_insert(&p, x, 1.0f);
	/* Token 2: layer 0 uses b again (0.1), layer 1 uses x. */
	policy_access(&p, b, 0.1f);
	policy_access(&p, x, 1.0f);
	cr_assert_eq(p.visits[0], 2);
	cr_assert_eq(p.visits[1], 2);
	cr_assert_float_eq(policy_heat_now(&p, a), exp2f(-1.0f / 128), 1e-6);
	cr_assert_float_eq(policy_heat_now(&p, b), 1.0f + exp2f(-1.0f / 128), 1e-6);
	/* A new expert of layer 0 evicts a: used once (a sum of scores would keep a, 3.0
	 * against b's 0.2). */
	cr_assert_eq(policy_make_room(&p, c, NULL, NULL), a);
	/* 1000 tokens of layer 1 alone (x repeated: each a new visit of layer 1). */
	const float hb = policy_heat_now(&p, b);
	for (int i = 0; i < 1000; i++)
		policy_access(&p, x, 1.0f);
	cr_assert_eq(p.visits[1], 1002);
	cr_assert_eq(p.visits[0], 2, "another layer's tokens are not this layer's");
	cr_assert_float_eq(policy_heat_now(&p, b), hb, 1e-6, "b did not age");
	/* 128 more tokens of layer 0 (b repeated): a's use loses exactly half its weight. */
	const float ha = policy_heat_now(&p, a);
	for (int i = 0; i < 128; i++)
		policy_access(&p, b, 0.5f);
	cr_assert_float_eq(policy_heat_now(&p, a), ha / 2, 1e-6, "half-life: 128 of its tokens");
	/* A prefetch (no score) and a score of NaN are not uses: no heat, no visit. */
	const uint64_t v0 = p.visits[0];
	policy_remove(&p, a);
	policy_insert(&p, c, -1.0f);
	policy_access(&p, c, NAN);
	cr_assert_eq(p.visits[0], v0);
	cr_assert_float_eq(policy_heat_now(&p, c), 0.0f, 1e-9);
	policy_destroy(&p);
}

Test(policy_layer, partitions_evict_within_layer)
{
	struct residency_policy p = make("lru+layer", 2, 4, 4);
	cr_assert_eq(p.quota[0], 2);
	cr_assert_eq(p.quota[1], 2);
	admit(&p, policy_id(&p, 0, 0));
	admit(&p, policy_id(&p, 0, 1));
	admit(&p, policy_id(&p, 1, 0));
	/* Layer 0 is at its share although one slot is free: it evicts its own LRU. */
	cr_assert(policy_needs_eviction(&p, policy_id(&p, 0, 2)));
	cr_assert_eq(admit(&p, policy_id(&p, 0, 2)), policy_id(&p, 0, 0));
	cr_assert_not(policy_needs_eviction(&p, policy_id(&p, 1, 1)));
	/* A global LRU would have taken layer 1's expert 0 (older than layer 0's). */
	struct residency_policy g = make("lru", 2, 4, 3);
	admit(&g, policy_id(&g, 1, 0));
	admit(&g, policy_id(&g, 0, 0));
	admit(&g, policy_id(&g, 0, 1));
	cr_assert_eq(admit(&g, policy_id(&g, 0, 2)), policy_id(&g, 1, 0));
	policy_destroy(&g);
	policy_destroy(&p);
}

Test(policy_pin, pinned_layers_reduce_capacity_and_never_queue)
{
	struct residency_policy p = make("sieve+pin1", 3, 4, 6);
	cr_assert_eq(p.capacity, 2);
	policy_insert(&p, policy_id(&p, 0, 1), 1);
	cr_assert_eq(p.resident, 0, "a pinned expert entered the queue");
	cr_assert_not(policy_needs_eviction(&p, policy_id(&p, 0, 3)));
	policy_destroy(&p);

	struct policy_spec spec;
	struct sidecar_error err = {0};
	cr_assert_eq(policy_spec_parse("lru+pin2", &spec, &err), 0);
	cr_assert_eq(policy_slots_needed(&spec, 3, 4, 0), 9);
	cr_assert_eq(policy_create(&p, &spec, 3, 4, 7, 0, &err), -1);
	cr_assert_eq(err.status, MOE_EINVAL);
	cr_assert(strstr(err.msg, "pinned") != NULL, "%s", err.msg);
	/* The pinned layers fitting exactly leave layer 2 no slot: its first demand would
	 * never load. One more slot serves it. */
	cr_assert_eq(policy_create(&p, &spec, 3, 4, 8, 0, &err), -1);
	cr_assert(strstr(err.msg, "the other layers one more") != NULL, "%s", err.msg);
	cr_assert_eq(policy_create(&p, &spec, 3, 4, 9, 0, &err), 0, "%s", err.msg);
	cr_assert_eq(p.capacity, 1);
	policy_destroy(&p);
	/* Masked (GPU) experts of pinned layers need no slot. */
	cr_assert_eq(policy_slots_needed(&spec, 3, 4, 1), 8);
	cr_assert_eq(policy_create(&p, &spec, 3, 4, 8, 1, &err), 0, "%s", err.msg);
	cr_assert_eq(p.capacity, 1);
	policy_destroy(&p);
	/* Every layer pinned: nothing else needs a slot. */
	cr_assert_eq(policy_spec_parse("lru+pin3", &spec, &err), 0);
	cr_assert_eq(policy_create(&p, &spec, 3, 4, 12, 0, &err), 0, "%s", err.msg);
	cr_assert_eq(p.capacity, 0);
	policy_destroy(&p);
}

/* One size class's policy (policy_create_members): layers 0 and 2 of 4 are its members (the
 * other layers' experts are another class's). +layer shares follow the members, so a capacity
 * of every member holds each member layer whole without an eviction; pinned members are
 * reserved, and a class of pinned members only needs no slot for the others. */
Test(policy_layer, members_of_one_size_class)
{
	struct policy_spec spec;
	struct sidecar_error err = {0};
	cr_assert_eq(policy_spec_parse("sieve+layer", &spec, &err), 0);
	const uint32_t members[4] = {4, 0, 4, 0};
	cr_assert_eq(policy_members_slots_needed(&spec, 4, members), 1);
	struct residency_policy p;
	cr_assert_eq(policy_create_members(&p, &spec, 4, 4, 8, members, &err), 0, "%s", err.msg);
	cr_assert_eq(p.quota[0], 4);
	cr_assert_eq(p.quota[1], 0);
	cr_assert_eq(p.quota[2], 4);
	for (uint32_t x = 0; x < 4; x++) {
		cr_assert_eq(admit(&p, policy_id(&p, 0, x)), POLICY_NONE);
		cr_assert_eq(admit(&p, policy_id(&p, 2, x)), POLICY_NONE);
	}
	cr_assert_eq(p.resident, 8);
	const uint32_t v = admit(&p, policy_id(&p, 0, 0)); /* resident: no eviction */
	cr_assert_eq(v, POLICY_NONE);
	policy_destroy(&p);
	/* Half of it: each member layer gets half its experts. */
	cr_assert_eq(policy_create_members(&p, &spec, 4, 4, 4, members, &err), 0, "%s", err.msg);
	cr_assert_eq(p.quota[0], 2);
	cr_assert_eq(p.quota[2], 2);
	policy_destroy(&p);
	/* Pinned: layer 0 is pinned and a member; the class's only other member layer is 2. */
	cr_assert_eq(policy_spec_parse("sieve+layer+pin1", &spec, &err), 0);
	cr_assert_eq(policy_members_slots_needed(&spec, 4, members), 5);
	cr_assert_eq(policy_create_members(&p, &spec, 4, 4, 4, members, &err), -1);
	cr_assert_eq(policy_create_members(&p, &spec, 4, 4, 8, members, &err), 0, "%s", err.msg);
	cr_assert_eq(p.capacity, 4);
	cr_assert_eq(p.quota[2], 4);
	policy_destroy(&p);
	const uint32_t pinned_only[4] = {4, 0, 0, 0};
	cr_assert_eq(policy_members_slots_needed(&spec, 4, pinned_only), 4);
	cr_assert_eq(policy_create_members(&p, &spec, 4, 4, 4, pinned_only, &err), 0, "%s",
	             err.msg);
	cr_assert_eq(p.capacity, 0);
	policy_destroy(&p);
}

/* Fewer slots than layers: layers past the first `capacity` have a share of 0 slots. They
 * are still served — into a free slot, else in place of an expert of the layer most over its
 * share — and one admission evicts at most one expert. */
Test(policy_layer, fewer_slots_than_layers_serves_every_layer)
{
	const char *specs[] = {"lru+layer", "sieve+layer", "sieve-heat+layer", "heat+layer"};
	for (size_t k = 0; k < sizeof(specs) / sizeof(specs[0]); k++) {
		struct residency_policy p = make(specs[k], 8, 4, 3);
		cr_assert_eq(p.quota[3], 0, "%s", specs[k]);
		/* A free slot: admitted as is, over its share. */
		cr_assert_eq(policy_make_room(&p, policy_id(&p, 7, 0), NULL, NULL), POLICY_NONE,
		             "%s", specs[k]);
		policy_insert(&p, policy_id(&p, 7, 0), 1.0f);
		admit(&p, policy_id(&p, 0, 0));
		admit(&p, policy_id(&p, 1, 0));
		cr_assert_eq(p.resident, 3);
		/* Full: layer 5 (share 0) takes one expert of the layer most over its share
		 * (layer 7: one over 0), not every resident expert. */
		cr_assert_eq(admit(&p, policy_id(&p, 5, 1)), policy_id(&p, 7, 0), "%s", specs[k]);
		cr_assert_eq(p.resident, 3);
		/* Layer 5 full at its share with its expert in use: another layer gives. */
		uint32_t busy = policy_id(&p, 5, 1);
		uint32_t v = admit_if(&p, policy_id(&p, 5, 2), not_busy_id, &busy);
		cr_assert_neq(v, busy, "%s", specs[k]);
		cr_assert_eq(p.resident, 3);
		/* Everything in use: refused, nothing evicted. */
		cr_assert_eq(policy_make_room(&p, policy_id(&p, 6, 0), never, NULL), POLICY_FULL,
		             "%s", specs[k]);
		cr_assert_eq(p.resident, 3);
		policy_destroy(&p);
	}
}

Test(policy_spec, parse_and_name)
{
	struct policy_spec s;
	char name[64];
	struct sidecar_error err = {0};
	cr_assert_eq(policy_spec_parse("sieve-heat+layer+pin3", &s, &err), 0, "%s", err.msg);
	cr_assert_eq(s.kind, POLICY_SIEVE_HEAT);
	cr_assert(s.per_layer);
	cr_assert_eq(s.pin_layers, 3);
	policy_spec_name(&s, name, sizeof(name));
	cr_assert_str_eq(name, "sieve-heat+layer+pin3");
	cr_assert_neq(policy_spec_parse("arc", &s, &err), 0);
	cr_assert(strstr(err.msg, "unknown algorithm 'arc'") != NULL, "%s", err.msg);
	cr_assert_neq(policy_spec_parse("lru+layr", &s, &err), 0);
	cr_assert(strstr(err.msg, "+layr") != NULL, "%s", err.msg);
	cr_assert_neq(policy_spec_parse("lru+pin", &s, &err), 0);
	cr_assert_neq(policy_spec_parse("lru+pin1x", &s, &err), 0);
	cr_assert_neq(policy_spec_parse("", &s, &err), 0);
}

/* Random admissions/hits/removals under every policy, with more slots than layers and with
 * fewer: the policy never holds more than its capacity, never names a pinned, absent or busy
 * expert, refuses a demand only when every resident expert is busy, and its counts match its
 * queues. */
static bool not_busy(void *arg, uint32_t id)
{
	const uint8_t *busy = arg;
	return !busy[id];
}

Test(policy_random, invariants_hold)
{
	const char *specs[] = {"lru",         "lru+layer",  "sieve",
	                       "sieve+layer", "sieve-heat", "sieve-heat+layer",
	                       "heat",        "heat+layer", "sieve+layer+pin1",
	                       "lru+pin2"};
	uint64_t s = 12345;
	for (size_t run = 0; run < 2 * sizeof(specs) / sizeof(specs[0]); run++) {
		const size_t k = run / 2;
		const uint32_t capacity = run % 2 ? 3 : 13; /* 3: fewer slots than layers */
		if (capacity == 3 && strstr(specs[k], "+pin"))
			continue;
		struct residency_policy p = make(specs[k], 4, 6, capacity);
		uint8_t resident[24] = {0}, busy[24] = {0};
		for (int step = 0; step < 20000; step++) {
			s = s * 6364136223846793005ull + 1442695040888963407ull;
			uint32_t id = (uint32_t)(s >> 33) % 24;
			uint32_t op = (uint32_t)(s >> 20) % 8;
			busy[(s >> 40) % 24] ^= 1;
			if (policy_is_pinned(&p, id))
				continue;
			if (op == 0 && resident[id]) {
				policy_remove(&p, id);
				resident[id] = 0;
			} else if (resident[id]) {
				policy_access(&p, id, (float)(op % 3));
			} else {
				bool ok = true;
				uint32_t v = op == 7 ? policy_make_room_prefetch(&p, id, 0.5f,
				                                                 not_busy, busy)
				                     : policy_make_room(&p, id, not_busy, busy);
				if (v == POLICY_FULL) {
					ok = false;
					for (uint32_t i = 0; i < 24 && op != 7; i++)
						cr_assert(!resident[i] || busy[i],
						          "%s (%u slots): demand for %u refused "
						          "while %u may go",
						          specs[k], capacity, id, i);
				} else if (v != POLICY_NONE) {
					cr_assert_lt(v, 24);
					cr_assert(resident[v], "%s: victim %u not resident",
					          specs[k], v);
					cr_assert_not(busy[v], "%s: busy victim %u", specs[k], v);
					cr_assert_not(policy_is_pinned(&p, v));
					policy_remove(&p, v);
					resident[v] = 0;
				}
				if (ok) {
					policy_insert(&p, id, op == 7 ? -1.0f : 1.0f);
					resident[id] = 1;
				}
			}
			uint32_t n = 0;
			for (uint32_t i = 0; i < 24; i++)
				n += resident[i];
			cr_assert_eq(n, p.resident, "%s: count drift", specs[k]);
			cr_assert_leq(p.resident, p.capacity, "%s: over capacity", specs[k]);
			/* Walk every queue: its length matches its count. */
			for (uint32_t q = 0; q < p.n_partitions; q++) {
				uint32_t len = 0;
				for (uint32_t it = p.queues[q].head; it != POLICY_NONE;
				     it = p.next[it])
					len++;
				cr_assert_eq(len, p.count[q], "%s: queue %u length", specs[k], q);
			}
		}
		policy_destroy(&p);
	}
}
