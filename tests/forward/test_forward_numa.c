/* test_forward_numa.c — the RESIDENCY source on several (synthetic) NUMA nodes: one residency
 * with a part per node, each holding only that node's rows of every expert (and of their
 * biases and FP8 scales). Under a budget below the model, for 1 to 4 nodes and several
 * formats, at 1 and many tokens: the results keep the all-resident single-node engine's bits,
 * every node holds exactly the same experts (no node keeps a slice of an evicted one),
 * resident bytes stay within each node's share of the budget, each node's slots are sized for
 * its slice (never the whole expert), each expert is counted once per request; and an I/O
 * error on one node's slice fails exactly the requests that need that expert.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "fixture.h"
#include "forward_internal.h"
#include "moe_abi.h"
#include "moe_kernels.h"

/* The record of the last engine call that failed (forward.h). */
static struct sidecar_error ferr;

#define TWO_NODES "pack:1 numa:2 core:1 pu:1"

/* Requests per budget case: 36 take decode and prefill (24 tokens) paths through many rounds
 * of eviction. Under the sanitizers (far slower) 12 take the same paths (two prefills,
 * evictions, cold misses on every node); every case and format still runs. */
#ifdef MOE_SANITIZED
enum { BUDGET_REQUESTS = 12 };
#else
enum { BUDGET_REQUESTS = 36 };
#endif

/* The synthetic topology of n nodes (one PU each). */
static const char *nodes_spec(uint32_t n)
{
	static const char *specs[] = {NULL, "pack:1 numa:1 core:1 pu:1", TWO_NODES,
	                              "pack:1 numa:3 core:1 pu:1", "pack:1 numa:4 core:1 pu:1"};
	cr_assert(n >= 1 && n <= 4);
	return specs[n];
}

static struct forward_engine *engine(const struct fwd_model *m, enum forward_source src,
                                     const char *synthetic, uint64_t budget, loader_fault_fn hook,
                                     void *hook_arg)
{
	struct forward_config cfg = {
	    .source = src,
	    .mem_budget = budget,
	    .numa = synthetic ? FORWARD_NUMA_SYNTHETIC : FORWARD_NUMA_AUTO,
	    .numa_synthetic = synthetic,
	    .threads_per_node = 1,
	    .max_tokens = 32,
	    .chunk_bytes = 64 * 1024,
	    .lazy_load = true,
	};
	struct forward_engine *e;
	cr_assert_eq(forward_create_with_fault_hook(&e, m->cat, &cfg, hook, hook_arg, &ferr), 0,
	             "forward_create: %s", ferr.msg);
	return e;
}

static void make_model_of(struct fwd_model *m, const char *preset, uint32_t format, bool gguf,
                          uint32_t experts, uint64_t hidden, uint64_t ffn, bool fused)
{
	char err[256];
	struct fwd_model_spec spec = {preset, format, gguf, 3, experts, hidden, ffn, fused};
	cr_assert_eq(fwd_model_make(m, &spec, err, sizeof(err)), 0, "%s", err);
}

static void make_model(struct fwd_model *m, uint32_t format, uint32_t experts, uint64_t hidden,
                       uint64_t ffn, bool fused)
{
	make_model_of(m, "qwen3-30b-a3b", format, true, experts, hidden, ffn, fused);
}

/* Largest expert of the model (whole, every projection). */
static uint64_t largest_expert(const struct moe_catalog *cat)
{
	uint64_t best = 0;
	for (uint32_t i = 0; i < cat->info.n_moe_layers; i++)
		for (uint32_t x = 0; x < cat->info.n_experts; x++) {
			const uint64_t b =
			    moe_catalog_expert(cat, (uint32_t)fwd_moe_block(cat, i), x)->bytes;
			best = b > best ? b : best;
		}
	return best;
}

/* Every node holds exactly the experts the residency has RESIDENT (their slices' bytes, and
 * one slot per RESIDENT or LOADING expert), so no node keeps a slice of an evicted expert. */
static void check_same_experts_everywhere(struct forward_engine *e, uint32_t n_nodes, uint32_t req)
{
	uint32_t held = 0;
	uint64_t want[FORWARD_MAX_NODES] = {0};
	for (uint32_t l = 0; l < e->w.n_moe_layers; l++)
		for (uint32_t x = 0; x < e->w.n_experts; x++) {
			const enum expert_state st = residency_state(e->w.res, l, x);
			held += st == EXPERT_RESIDENT || st == EXPERT_LOADING;
			for (uint32_t n = 0; st == EXPERT_RESIDENT && n < n_nodes; n++)
				want[n] += weights_res_bytes(&e->w, n, l, x);
		}
	for (uint32_t n = 0; n < n_nodes; n++) {
		struct residency_counters c;
		cr_assert_eq(forward_node_residency(e, n, &c), 0);
		cr_assert_eq(c.resident_bytes, want[n],
		             "request %u: node %u holds %llu bytes, its slices of the resident "
		             "experts are %llu",
		             req, n, (unsigned long long)c.resident_bytes,
		             (unsigned long long)want[n]);
		cr_assert_eq(c.slots_used, held, "request %u: node %u uses %u slots for %u experts",
		             req, n, c.slots_used, held);
	}
}

static void budget_case_of(const char *preset, uint32_t format, bool gguf, bool fused,
                           uint32_t n_nodes, uint64_t ffn)
{
	struct fwd_model m;
	make_model_of(&m, preset, format, gguf, 16, 256, ffn, fused);
	const size_t h = m.cat->info.hidden;
	const uint64_t budget = m.cat->expert_bytes_total * 3 / 10;
	struct forward_engine *e =
	    engine(&m, FORWARD_SOURCE_RESIDENCY, nodes_spec(n_nodes), budget, NULL, NULL);
	struct forward_engine *one = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, NULL, 0, NULL, NULL);
	cr_assert_eq(e->w.n_res, n_nodes, "the model must slice over %u nodes", n_nodes);
	const uint64_t expert = largest_expert(m.cat);
	struct residency_counters node[FORWARD_MAX_NODES];
	uint64_t budgets = 0;
	for (uint32_t n = 0; n < n_nodes; n++) {
		cr_assert_eq(forward_node_residency(e, n, &node[n]), 0, "node %u's residency", n);
		/* Slots hold the node's share of the rows (each extent padded by at most two
		 * 4 KiB blocks), never the whole expert. */
		if (n_nodes > 1)
			cr_assert_lt(
			    node[n].slot_bytes, expert, "node %u: slot of %llu bytes, expert %llu",
			    n, (unsigned long long)node[n].slot_bytes, (unsigned long long)expert);
		cr_assert_geq(node[n].slot_bytes, expert / n_nodes - expert / 16);
		cr_assert_leq(node[n].slot_bytes,
		              expert / n_nodes + expert / 16 + e->w.node_extents * 8192 + 8192);
		/* the same count of slots on every node: the budget split by slice bytes */
		cr_assert_eq(node[n].slots, node[0].slots, "node %u: %u slots, node 0 %u", n,
		             node[n].slots, node[0].slots);
		budgets += node[n].budget_bytes;
	}
	cr_assert_eq(forward_node_residency(e, n_nodes, &node[0]), -1);
	cr_assert_eq(budgets, budget);
	struct forward_stats st = {0};
	uint64_t experts = 0;
	for (uint32_t i = 0; i < BUDGET_REQUESTS; i++) {
		struct fwd_req r;
		const uint32_t tokens = i % 6 == 5 ? 24 : 1 + i % 8; /* decode and prefill paths */
		fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, i % m.cat->info.n_moe_layers), tokens,
		             4, 0, MOEK_ACT_F32, 500 + i, i % 5 == 0);
		struct forward_result res, ref;
		int rc = forward_run(e, &r.q, r.out, NULL, &res);
		cr_assert_eq(rc, MOE_OK, "request %u: %d %s", i, rc, res.message);
		cr_assert_eq(res.hits + res.cold_misses + res.inflight_misses, res.experts,
		             "request %u: %u experts counted as %u hits, %u cold, %u in flight", i,
		             res.experts, res.hits, res.cold_misses, res.inflight_misses);
		experts += res.experts;
		cr_assert_eq(forward_run(one, &r.q, r.ref, NULL, &ref), MOE_OK);
		long d = fwd_first_diff(r.out, r.ref, r.q.n_tokens * h);
		cr_assert_eq(d, -1,
		             "request %u (%u tokens, %u nodes): element %ld differs from one "
		             "node, all resident",
		             i, tokens, n_nodes, d);
		cr_assert_eq(forward_reference(e, &r.q, r.ref, NULL, &ref), MOE_OK, "%s",
		             ref.message);
		d = fwd_first_diff(r.out, r.ref, r.q.n_tokens * h);
		cr_assert_eq(d, -1, "request %u: element %ld differs from the reference", i, d);
		forward_stats(e, &st);
		cr_assert_leq(st.resident_bytes, st.budget_bytes, "request %u: over budget", i);
		for (uint32_t n = 0; n < n_nodes; n++) {
			cr_assert_eq(forward_node_residency(e, n, &node[n]), 0);
			cr_assert_leq((uint64_t)node[n].slots_used * node[n].slot_bytes,
			              node[n].budget_bytes, "request %u: node %u over its budget",
			              i, n);
		}
		check_same_experts_everywhere(e, n_nodes, i);
		fwd_req_free(&r);
	}
	cr_assert_eq(st.budget_bytes, budget);
	cr_assert_eq(st.hits + st.cold_misses + st.inflight_misses, experts);
	cr_assert_gt(st.residency.evictions, 0, "a 30%% budget must evict");
	cr_assert_gt(st.cold_misses, 0);
	/* STATS shows each node's residency: its own counters, adding up to the totals; every
	 * node read its own rows. */
	struct forward_stats now = {0};
	forward_stats(e, &now);
	cr_assert_eq(now.n_nodes, n_nodes);
	uint64_t resident = 0, read = 0;
	for (uint32_t n = 0; n < n_nodes; n++) {
		cr_assert_eq(forward_node_residency(e, n, &node[n]), 0);
		cr_assert_gt(node[n].bytes_read, 0);
		const struct forward_node_stats *ns = &now.nodes[n];
		cr_assert_eq(ns->node, n);
		cr_assert_eq(ns->residency.resident_bytes, node[n].resident_bytes, "node %u", n);
		cr_assert_eq(ns->residency.budget_bytes, node[n].budget_bytes, "node %u", n);
		cr_assert_eq(ns->residency.bytes_read, node[n].bytes_read, "node %u", n);
		cr_assert_eq(ns->residency.hits, node[n].hits, "node %u", n);
		cr_assert_eq(ns->residency.cold_misses, node[n].cold_misses, "node %u", n);
		cr_assert_eq(ns->residency.slots_used, node[n].slots_used, "node %u", n);
		cr_assert_gt(ns->residency.hits + ns->residency.cold_misses, 0,
		             "node %u served no demand", n);
		resident += ns->residency.resident_bytes;
		read += ns->residency.bytes_read;
	}
	cr_assert_eq(resident, now.resident_bytes);
	cr_assert_eq(read, now.residency.bytes_read);
	char json[65536];
	const size_t len = forward_stats_json(&now, json, sizeof(json));
	cr_assert_lt(len, sizeof(json));
	cr_assert_not_null(strstr(json, "\"nodes\":[{\"node\":0,"), "%s", json);
	if (n_nodes > 1)
		cr_assert_not_null(strstr(json, "},{\"node\":1,"), "%s", json);
	forward_destroy(one);
	forward_destroy(e);
	fwd_model_free(&m);
}

Test(forward_numa, budget_q8_0_one_node)
{
	budget_case_of("qwen3-30b-a3b", MOEK_Q8_0, true, false, 1, 512);
}

Test(forward_numa, budget_q8_0)
{
	budget_case_of("qwen3-30b-a3b", MOEK_Q8_0, true, false, 2, 512);
}

Test(forward_numa, budget_q8_0_three_nodes)
{
	budget_case_of("qwen3-30b-a3b", MOEK_Q8_0, true, false, 3, 512);
}

Test(forward_numa, budget_q8_0_four_nodes)
{
	budget_case_of("qwen3-30b-a3b", MOEK_Q8_0, true, false, 4, 512);
}

Test(forward_numa, budget_q4_k_fused_gate_up)
{
	budget_case_of("qwen3-30b-a3b", MOEK_Q4_K, true, true, 2, 512);
}

Test(forward_numa, budget_q4_k_fused_gate_up_four_nodes)
{
	budget_case_of("qwen3-30b-a3b", MOEK_Q4_K, true, true, 4, 1024);
}

/* DeepSeek's FP8 with 128x128 block scales: each node's block rows of the scales in its slot
 * (with four nodes, down's 64-row slices share a block row of scales, read by both). */
Test(forward_numa, budget_fp8_block_scales)
{
	budget_case_of("deepseek-v3", MOEK_FP8_E4M3_B128, false, false, 2, 512);
}

Test(forward_numa, budget_fp8_block_scales_four_nodes)
{
	budget_case_of("deepseek-v3", MOEK_FP8_E4M3_B128, false, false, 4, 512);
}

/* gpt-oss as Hugging Face ships it: MXFP4 blocks and E8M0 scales in separate tensors, gate
 * and up fused with their rows interleaved (a node's slice is every other row pair of its
 * range), biases (each node's rows of them in its slot), the clamped SwiGLU. */
static void gpt_oss_case(uint32_t n_nodes)
{
	struct fwd_model probe;
	make_model_of(&probe, "gpt-oss-20b", MOEK_MXFP4, false, 16, 256, 512, false);
	const struct moe_proj_ref *gu =
	    &moe_catalog_expert(probe.cat, (uint32_t)fwd_moe_block(probe.cat, 0), 0)
	         ->proj[MOE_PROJ_GATE_UP];
	cr_assert(gu->present && gu->order == MOE_GATE_UP_INTERLEAVED && gu->bias.length,
	          "the generator's gpt-oss checkpoint has no interleaved gate_up with a bias");
	fwd_model_free(&probe);
	budget_case_of("gpt-oss-20b", MOEK_MXFP4, false, false, n_nodes, 512);
}

Test(forward_numa, budget_gpt_oss_hf_interleaved_gate_up)
{
	gpt_oss_case(2);
}

Test(forward_numa, budget_gpt_oss_hf_three_nodes)
{
	gpt_oss_case(3);
}

/* One node: exactly one residency (node 0 names it), whole experts in its slots. */
Test(forward_numa, one_node_keeps_one_pool)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 8, 256, 256, false);
	struct forward_engine *e =
	    engine(&m, FORWARD_SOURCE_RESIDENCY, NULL, m.cat->expert_bytes_total / 2, NULL, NULL);
	struct residency_counters rc;
	cr_assert_eq(forward_node_residency(e, 0, &rc), 0);
	cr_assert_geq(rc.slot_bytes, largest_expert(m.cat));
	cr_assert_eq(forward_node_residency(e, 1, &rc), -1);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* An expert too small to split over the nodes keeps one shared pool (whole experts), logged,
 * and still computes the same bits. */
Test(forward_numa, unsliceable_model_keeps_one_pool)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 8, 64, 32, false); /* 32 rows: one 32-row unit, two nodes */
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_RESIDENCY, TWO_NODES,
	                                  m.cat->expert_bytes_total / 2, NULL, NULL);
	struct forward_engine *one = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, NULL, 0, NULL, NULL);
	struct residency_counters rc;
	cr_assert_eq(forward_node_residency(e, 0, &rc), 0);
	cr_assert_geq(rc.slot_bytes, largest_expert(m.cat));
	cr_assert_eq(forward_node_residency(e, 1, &rc), -1);
	struct fwd_req r;
	fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, 1), 3, 2, 0, MOEK_ACT_F32, 9, false);
	struct forward_result res;
	cr_assert_eq(forward_run(e, &r.q, r.out, NULL, &res), MOE_OK, "%s", res.message);
	cr_assert_eq(forward_run(one, &r.q, r.ref, NULL, &res), MOE_OK);
	cr_assert_eq(fwd_first_diff(r.out, r.ref, 3 * m.cat->info.hidden), -1);
	fwd_req_free(&r);
	forward_destroy(one);
	forward_destroy(e);
	fwd_model_free(&m);
}

/* Fails every read of (MoE layer 1, expert 3) by one node's loader: that node's slice of the
 * expert fails, the other nodes' load. */
struct node_fault {
	uint32_t node;
	atomic_int hits;
};

static int fail_node_slice(void *arg, const struct loader_read_info *info, int res)
{
	struct node_fault *f = arg;
	if (info->layer == 1 && info->expert == 3 && info->node == f->node) {
		atomic_fetch_add(&f->hits, 1);
		return -EIO;
	}
	return res;
}

static void failed_slice_case(uint32_t n_nodes, uint32_t bad_node)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 8, 256, 256, false);
	struct node_fault fault = {.node = bad_node};
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_RESIDENCY, nodes_spec(n_nodes),
	                                  m.cat->expert_bytes_total / 2, fail_node_slice, &fault);
	cr_assert_eq(e->w.n_res, n_nodes);
	struct forward_engine *ok = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, NULL, 0, NULL, NULL);
	uint32_t failed, passed;
	char why[256];
	cr_assert_eq(
	    fwd_replay_expert3_failure(e, ok, m.cat, 3, 700, &failed, &passed, why, sizeof(why)), 0,
	    "%s", why);
	cr_assert_gt(failed, 0);
	cr_assert_gt(passed, 0);
	cr_assert_gt(atomic_load(&fault.hits), 0);
	/* Only one node's reads failed, yet the whole expert is FAILED (one decision for every
	 * node: the others keep no slice of it), counted once, and its message names the node. */
	cr_assert_eq(residency_state(e->w.res, 1, 3), EXPERT_FAILED);
	check_same_experts_everywhere(e, n_nodes, failed + passed);
	struct residency_counters c[FORWARD_MAX_NODES];
	for (uint32_t n = 0; n < n_nodes; n++) {
		cr_assert_eq(forward_node_residency(e, n, &c[n]), 0);
		cr_assert_gt(c[n].failures, 0);
		cr_assert_eq(c[n].failures, c[0].failures);
		cr_assert_eq(c[n].failed_now, 1);
	}
	char msg[256], want[32];
	residency_error_message(e->w.res, 1, 3, msg, sizeof(msg));
	snprintf(want, sizeof(want), "node %u's slice", bad_node);
	cr_assert_not_null(strstr(msg, want), "%s", msg);
	cr_assert_eq(forward_would_run_now(e, fwd_moe_block(m.cat, 1), (const int32_t[]){3}, 1),
	             false);
	forward_destroy(ok);
	forward_destroy(e);
	fwd_model_free(&m);
}

Test(forward_numa, failed_slice_fails_only_its_requests)
{
	failed_slice_case(2, 1);
}

Test(forward_numa, failed_slice_of_node_0_of_three)
{
	failed_slice_case(3, 0);
}

Test(forward_numa, failed_slice_of_the_last_of_four)
{
	failed_slice_case(4, 3);
}

/* Every GGUF weight format the kernels take, sliced over 2 and 3 nodes under the budget:
 * the same bits as one node with every expert resident, and as the reference. */
Test(forward_numa, budget_every_gguf_format)
{
	static const uint32_t formats[] = {
	    MOEK_F32,  MOEK_F16,  MOEK_BF16,   MOEK_Q8_0,   MOEK_Q4_0, MOEK_MXFP4, MOEK_Q4_K,
	    MOEK_Q5_K, MOEK_Q6_K, MOEK_IQ4_NL, MOEK_IQ4_XS, MOEK_Q2_K, MOEK_Q3_K};
	for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++) {
		const uint32_t nodes = 2 + (uint32_t)(i % 2);
		/* a 256-column block of down per node: K formats cut evenly */
		budget_case_of("qwen3-30b-a3b", formats[i], true, false, nodes, 256 * nodes);
	}
}
