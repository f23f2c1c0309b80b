/* test_forward_slots.c — slot size classes: a llama.cpp mix (Q4_K_M, Q3_K_M: experts of two
 * sizes) gets a run of slots per size, so the budget that holds every expert (--mem-budget
 * 100%) holds every expert of a mix, and part of it holds more experts than slots all sized for
 * the largest would. On one and two (synthetic) nodes, with pinned layers; under the smallest
 * budget that serves, eviction still frees a slot of the size a demand needs; and a mix sliced
 * over two nodes under half the budget keeps the reference's bits.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "fixture.h"
#include "forward_internal.h"
#include "residency_internal.h"

static struct sidecar_error ferr;

static const char *nodes_spec(uint32_t n)
{
	return n == 1 ? NULL : "pack:1 numa:2 core:1 pu:1";
}

/* budget 0: the budget that holds every expert (what --mem-budget 100% gives), not warmed. */
static int engine_of(struct forward_engine **e, const struct fwd_model *m, uint32_t n_nodes,
                     uint64_t budget, uint32_t pin_layers)
{
	const char *synthetic = nodes_spec(n_nodes);
	struct forward_config cfg = {
	    .source = FORWARD_SOURCE_RESIDENCY,
	    .mem_budget = budget,
	    .pin_layers = pin_layers,
	    .numa = synthetic ? FORWARD_NUMA_SYNTHETIC : FORWARD_NUMA_AUTO,
	    .numa_synthetic = synthetic,
	    .threads_per_node = 1,
	    .max_tokens = 32,
	    .chunk_bytes = 64 * 1024,
	    .lazy_load = true,
	};
	return forward_create(e, m->cat, &cfg, &ferr);
}

static struct forward_engine *engine(const struct fwd_model *m, uint32_t n_nodes, uint64_t budget,
                                     uint32_t pin_layers)
{
	struct forward_engine *e;
	cr_assert_eq(engine_of(&e, m, n_nodes, budget, pin_layers), 0, "forward_create: %s",
	             ferr.msg);
	cr_assert_eq(e->w.n_res, n_nodes);
	return e;
}

/* Experts per layer: 8, or 4 under the sanitizers (far slower): the same size classes,
 * budgets and evictions, half the experts to write and read. */
#ifdef MOE_SANITIZED
enum { LAYER_EXPERTS = 4 };
#else
enum { LAYER_EXPERTS = 8 };
#endif

/* Experts large enough that the formats' sizes differ by more than the blocks alignment
 * adds (Q5_K and Q4_K downs of 768 × 512: 48 KiB apart). */
static void make_mix(struct fwd_model *m, enum moe_gen_mix mix, uint32_t layers)
{
	char err[256];
	struct fwd_model_spec spec = {.preset = "qwen3-30b-a3b",
	                              .gguf = true,
	                              .layers = layers,
	                              .experts = LAYER_EXPERTS,
	                              .hidden = 512,
	                              .ffn = 768,
	                              .mix = mix};
	cr_assert_eq(fwd_model_make(m, &spec, err, sizeof(err)), 0, "%s", err);
}

/* One expert's largest slot on every node: what every slot took before size classes. */
static uint64_t largest_slot(const struct residency *r)
{
	uint64_t sum = 0;
	for (uint32_t n = 0; n < r->n_nodes; n++)
		sum += r->node[n].pool.slot_bytes;
	return sum;
}

/* The slot bytes in use now, on every node, from the pools themselves. */
static uint64_t slot_bytes_in_use(struct residency *r)
{
	uint64_t used = 0;
	pthread_mutex_lock(&r->lock);
	for (uint32_t n = 0; n < r->n_nodes; n++) {
		const struct slot_pool *p = &r->node[n].pool;
		for (uint32_t c = 0; c < p->n_classes; c++)
			used += (uint64_t)(p->classes[c].n_slots - p->classes[c].n_free) *
			        p->classes[c].slot_bytes;
	}
	pthread_mutex_unlock(&r->lock);
	return used;
}

static void within_budget(struct residency *r, const char *what)
{
	struct residency_counters c;
	residency_counters(r, &c);
	const uint64_t used = slot_bytes_in_use(r);
	cr_assert_leq(used, c.budget_bytes, "%s: %" PRIu64 " slot bytes in use, budget %" PRIu64,
	              what, used, c.budget_bytes);
	cr_assert_leq(c.resident_bytes, c.budget_bytes, "%s", what);
	cr_assert_leq((uint64_t)c.slots_used * c.slot_bytes, c.budget_bytes, "%s", what);
	uint64_t pools = 0;
	for (uint32_t n = 0; n < r->n_nodes; n++)
		pools += r->node[n].pool.slots_bytes;
	cr_assert_leq(pools, c.budget_bytes, "%s: the pools exceed the budget", what);
}

/* Demands every expert once (in a stride order that mixes layers and sizes), releasing each
 * before the next: the request path's one-at-a-time worst case. */
static void touch_all(struct residency *r, uint32_t pass)
{
	const uint32_t n = r->n_ids, step = 7; /* coprime with the 8 (4) experts a layer has */
	for (uint32_t i = 0; i < n; i++) {
		const uint32_t id = (uint32_t)(((uint64_t)i * step + pass) % n);
		struct expert_ref ref;
		const int rc =
		    residency_acquire(r, id / r->n_experts, id % r->n_experts, 1.0f, 0, &ref);
		cr_assert_eq(rc, 0, "pass %u: layer %u expert %u: %d", pass, id / r->n_experts,
		             id % r->n_experts, rc);
		residency_release(r, &ref);
		within_budget(r, "touch");
	}
}

/* At the budget that holds every expert: after one touch each, every expert is RESIDENT and
 * a second pass hits every one. */
static void full_budget_case(enum moe_gen_mix mix, uint32_t layers, uint32_t n_nodes,
                             uint32_t pin_layers, uint32_t classes)
{
	struct fwd_model m;
	make_mix(&m, mix, layers);
	struct forward_engine *e = engine(&m, n_nodes, 0, pin_layers);
	struct residency *r = e->w.res;
	const uint64_t every = weights_every_expert_bytes(&e->w);
	struct residency_counters c;
	residency_counters(r, &c);
	cr_assert_eq(c.budget_bytes, every);
	cr_assert_eq(r->n_classes, classes, "%s: %u size classes", moe_gen_mix_name(mix),
	             r->n_classes);
	const uint64_t before = every / largest_slot(r);
	cr_log_info("%s, %u layers, %u node(s): %u experts; the budget for every expert holds "
	            "%u slots (%" PRIu64 " sized for the largest)",
	            moe_gen_mix_name(mix), layers, n_nodes, r->n_ids, c.slots, before);
	if (classes > 1)
		cr_assert_lt(before, r->n_ids, "slots of the largest size would hold them all");
	cr_assert_geq(c.slots, r->n_ids);
	touch_all(r, 0);
	residency_counters(r, &c);
	/* the pinned layers' warm-up counted theirs */
	cr_assert_eq(c.evictions, 0);
	cr_assert_eq(c.cold_misses, r->n_ids);
	for (uint32_t id = 0; id < r->n_ids; id++)
		cr_assert_eq(residency_state(r, id / r->n_experts, id % r->n_experts),
		             EXPERT_RESIDENT, "layer %u expert %u", id / r->n_experts,
		             id % r->n_experts);
	const uint64_t hits = c.hits;
	touch_all(r, 3);
	residency_counters(r, &c);
	cr_assert_eq(c.cold_misses, r->n_ids, "the second pass missed");
	cr_assert_eq(c.hits - hits, r->n_ids, "the second pass must hit every expert");
	cr_assert_eq(c.evictions, 0);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* Q4_K_M: down Q6_K on 5 of 9 blocks; Q3_K_M: down Q5_K on the first 16th of the blocks;
 * Q2_K: one size (gate/up Q2_K, every down Q3_K). */
Test(forward_slots, q4_k_m_every_expert_at_full_budget)
{
	full_budget_case(MOE_GEN_MIX_Q4_K_M, 9, 1, 0, 2);
}
Test(forward_slots, q3_k_m_every_expert_at_full_budget)
{
	full_budget_case(MOE_GEN_MIX_Q3_K_M, 16, 1, 0, 2);
}
Test(forward_slots, q2_k_every_expert_at_full_budget)
{
	full_budget_case(MOE_GEN_MIX_Q2_K, 9, 1, 0, 1);
}
Test(forward_slots, q4_k_m_every_expert_at_full_budget_two_nodes)
{
	full_budget_case(MOE_GEN_MIX_Q4_K_M, 9, 2, 0, 2);
}
/* Block 0 (Q6_K down) pinned: the class of the large experts holds its pinned layer and
 * its share of the others. */
Test(forward_slots, q4_k_m_every_expert_at_full_budget_pinned)
{
	full_budget_case(MOE_GEN_MIX_Q4_K_M, 9, 1, 2, 2);
}

/* Half the budget: more experts fit than slots of the largest size would hold, and the bytes
 * in use never exceed the budget while the experts of both sizes evict each other's kind. */
static void half_budget_case(enum moe_gen_mix mix, uint32_t layers)
{
	struct fwd_model m;
	make_mix(&m, mix, layers);
	struct forward_engine *full = engine(&m, 1, 0, 0);
	const uint64_t budget = weights_every_expert_bytes(&full->w) / 2;
	forward_destroy(full);
	struct forward_engine *e = engine(&m, 1, budget, 0);
	struct residency *r = e->w.res;
	struct residency_counters c;
	residency_counters(r, &c);
	const uint64_t before = budget / largest_slot(r);
	cr_log_info("%s at half: %u slots (%" PRIu64 " sized for the largest)",
	            moe_gen_mix_name(mix), c.slots, before);
	cr_assert_gt(c.slots, before, "%u slots, %" PRIu64 " of the largest size", c.slots, before);
	cr_assert_lt(c.slots, r->n_ids);
	for (uint32_t pass = 0; pass < 3; pass++)
		touch_all(r, pass);
	residency_counters(r, &c);
	cr_assert_gt(c.evictions, 0);
	cr_assert_gt(c.slots_used, before, "fewer experts held than the largest-slot sizing");
	forward_destroy(e);
	fwd_model_free(&m);
}

Test(forward_slots, q4_k_m_half_budget_holds_more)
{
	half_budget_case(MOE_GEN_MIX_Q4_K_M, 9);
}
Test(forward_slots, q3_k_m_half_budget_holds_more)
{
	half_budget_case(MOE_GEN_MIX_Q3_K_M, 16);
}

/* A budget below one slot of each size is refused, naming the smallest that serves; that one
 * serves: every expert is read in turn, each size's one slot evicting its own kind, with no
 * deadlock and no byte over the budget. */
Test(forward_slots, smallest_budget_evicts_within_each_size)
{
	struct fwd_model m;
	make_mix(&m, MOE_GEN_MIX_Q4_K_M, 9);
	struct forward_engine *e;
	cr_assert_neq(engine_of(&e, &m, 1, 4096, 0), 0);
	const char *at = strstr(ferr.msg, "the smallest budget that serves is ");
	cr_assert_not_null(at, "%s", ferr.msg);
	const uint64_t smallest =
	    strtoull(at + strlen("the smallest budget that serves is "), NULL, 10);
	cr_assert_gt(smallest, 4096);
	cr_assert_neq(engine_of(&e, &m, 1, smallest - 1, 0), 0, "one byte less served");
	e = engine(&m, 1, smallest, 0);
	struct residency *r = e->w.res;
	struct residency_counters c;
	residency_counters(r, &c);
	cr_assert_eq(c.slots, 2, "one slot of each size");
	for (uint32_t pass = 0; pass < 2; pass++)
		touch_all(r, pass);
	residency_counters(r, &c);
	cr_assert_geq(c.cold_misses, 2 * r->n_ids - 2);
	cr_assert_eq(c.evictions, c.cold_misses - 2);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* A Q4_K_M mix sliced over two nodes under half the budget: requests keep the reference's
 * bits on every layer while experts of both sizes come and go. */
Test(forward_slots, q4_k_m_two_nodes_half_budget_bits)
{
	struct fwd_model m;
	make_mix(&m, MOE_GEN_MIX_Q4_K_M, 9);
	struct forward_engine *full = engine(&m, 2, 0, 0);
	const uint64_t budget = weights_every_expert_bytes(&full->w) / 2;
	forward_destroy(full);
	struct forward_engine *e = engine(&m, 2, budget, 0);
	const size_t h = m.cat->info.hidden;
	for (uint32_t i = 0; i < 27; i++) {
		struct fwd_req q;
		const uint32_t tokens = i % 4 == 3 ? 24 : 1 + i % 3;
		fwd_req_make(&q, m.cat, fwd_moe_block(m.cat, i % m.cat->info.n_moe_layers), tokens,
		             4, 0, MOEK_ACT_F32, 900 + i, false);
		struct forward_result res, ref;
		const int rc = forward_run(e, &q.q, q.out, NULL, &res);
		cr_assert_eq(rc, MOE_OK, "request %u: %d %s", i, rc, res.message);
		cr_assert_eq(forward_reference(e, &q.q, q.ref, NULL, &ref), MOE_OK, "%s",
		             ref.message);
		const long d = fwd_first_diff(q.out, q.ref, q.q.n_tokens * h);
		cr_assert_eq(d, -1, "request %u: element %ld differs from the reference", i, d);
		within_budget(e->w.res, "request");
		fwd_req_free(&q);
	}
	struct residency_counters c;
	residency_counters(e->w.res, &c);
	cr_assert_gt(c.evictions, 0, "half the budget must evict");
	forward_destroy(e);
	fwd_model_free(&m);
}
