/* test_forward_numa.c — the RESIDENCY source on several (synthetic) NUMA nodes: one residency
 * per node holding only that node's rows of every expert. Under a budget below the model the
 * results keep the single-node engine's bits, resident bytes stay within the budget on every
 * node, each node's slots are sized for its slice (never the whole expert), each expert is
 * counted once per request, a fused gate_up model slices too, and an I/O error on one node's
 * slice fails exactly the requests that need that expert (the other node's slice is released).
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
	    .max_tokens = 8,
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

static void budget_case_of(const char *preset, uint32_t format, bool gguf, bool fused)
{
	struct fwd_model m;
	make_model_of(&m, preset, format, gguf, 16, 256, 512, fused);
	const size_t h = m.cat->info.hidden;
	const uint64_t budget = m.cat->expert_bytes_total * 3 / 10;
	struct forward_engine *e =
	    engine(&m, FORWARD_SOURCE_RESIDENCY, TWO_NODES, budget, NULL, NULL);
	struct forward_engine *one = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, NULL, 0, NULL, NULL);
	const uint64_t expert = largest_expert(m.cat);
	struct residency_counters node[2];
	for (uint32_t n = 0; n < 2; n++) {
		cr_assert_eq(forward_node_residency(e, n, &node[n]), 0, "node %u's residency", n);
		/* Slots hold the node's half of the rows (three extents, each padded by at
		 * most two 4 KiB blocks), never the whole expert. */
		cr_assert_lt(node[n].slot_bytes, expert, "node %u: slot of %llu bytes, expert %llu",
		             n, (unsigned long long)node[n].slot_bytes, (unsigned long long)expert);
		cr_assert_geq(node[n].slot_bytes, expert / 2 - expert / 16);
		cr_assert_leq(node[n].slot_bytes, expert / 2 + expert / 16 + 3 * 8192);
	}
	cr_assert_eq(forward_node_residency(e, 2, &node[0]), -1);
	cr_assert_eq(node[0].budget_bytes + node[1].budget_bytes, budget);
	struct forward_stats st = {0};
	uint64_t experts = 0;
	for (uint32_t i = 0; i < 36; i++) {
		struct fwd_req r;
		fwd_req_make(&r, m.cat, fwd_moe_block(m.cat, i % 3), 1 + i % 8, 4, 0, MOEK_ACT_F32,
		             500 + i, i % 5 == 0);
		struct forward_result res, ref;
		int rc = forward_run(e, &r.q, r.out, NULL, &res);
		cr_assert_eq(rc, MOE_OK, "request %u: %d %s", i, rc, res.message);
		cr_assert_eq(res.hits + res.cold_misses + res.inflight_misses, res.experts,
		             "request %u: %u experts counted as %u hits, %u cold, %u in flight", i,
		             res.experts, res.hits, res.cold_misses, res.inflight_misses);
		experts += res.experts;
		cr_assert_eq(forward_run(one, &r.q, r.ref, NULL, &ref), MOE_OK);
		long d = fwd_first_diff(r.out, r.ref, r.q.n_tokens * h);
		cr_assert_eq(d, -1, "request %u: element %ld differs from one node", i, d);
		cr_assert_eq(forward_reference(e, &r.q, r.ref, NULL, &ref), MOE_OK, "%s",
		             ref.message);
		d = fwd_first_diff(r.out, r.ref, r.q.n_tokens * h);
		cr_assert_eq(d, -1, "request %u: element %ld differs from the reference", i, d);
		forward_stats(e, &st);
		cr_assert_leq(st.resident_bytes, st.budget_bytes, "request %u: over budget", i);
		for (uint32_t n = 0; n < 2; n++) {
			cr_assert_eq(forward_node_residency(e, n, &node[n]), 0);
			cr_assert_leq((uint64_t)node[n].slots_used * node[n].slot_bytes,
			              node[n].budget_bytes, "request %u: node %u over its budget",
			              i, n);
		}
		fwd_req_free(&r);
	}
	cr_assert_eq(st.budget_bytes, budget);
	cr_assert_eq(st.hits + st.cold_misses + st.inflight_misses, experts);
	cr_assert_gt(st.evictions, 0, "a 30%% budget must evict");
	cr_assert_gt(st.cold_misses, 0);
	/* Both nodes read: each its own rows, so together about the cold experts' bytes. */
	cr_assert_gt(node[0].bytes_read, 0);
	cr_assert_gt(node[1].bytes_read, 0);
	/* STATS shows each node's residency: its own counters, adding up to the totals. */
	struct forward_stats now = {0};
	forward_stats(e, &now);
	cr_assert_eq(now.n_nodes, 2);
	uint64_t resident = 0, read = 0;
	for (uint32_t n = 0; n < 2; n++) {
		cr_assert_eq(forward_node_residency(e, n, &node[n]), 0);
		const struct forward_node_stats *ns = &now.nodes[n];
		cr_assert_eq(ns->node, n);
		cr_assert_eq(ns->resident_bytes, node[n].resident_bytes, "node %u", n);
		cr_assert_eq(ns->budget_bytes, node[n].budget_bytes, "node %u", n);
		cr_assert_eq(ns->loader_bytes_read, node[n].bytes_read, "node %u", n);
		cr_assert_eq(ns->hits, node[n].hits, "node %u", n);
		cr_assert_eq(ns->cold_misses, node[n].cold_misses, "node %u", n);
		cr_assert_eq(ns->slots_used, node[n].slots_used, "node %u", n);
		cr_assert_gt(ns->hits + ns->cold_misses, 0, "node %u served no demand", n);
		resident += ns->resident_bytes;
		read += ns->loader_bytes_read;
	}
	cr_assert_eq(resident, now.resident_bytes);
	cr_assert_eq(read, now.loader_bytes_read);
	char json[65536];
	const size_t len = forward_stats_json(&now, json, sizeof(json));
	cr_assert_lt(len, sizeof(json));
	cr_assert_not_null(strstr(json, "\"nodes\":[{\"node\":0,"), "%s", json);
	cr_assert_not_null(strstr(json, "},{\"node\":1,"), "%s", json);
	forward_destroy(one);
	forward_destroy(e);
	fwd_model_free(&m);
}

Test(forward_numa, budget_q8_0)
{
	budget_case_of("qwen3-30b-a3b", MOEK_Q8_0, true, false);
}

Test(forward_numa, budget_q4_k_fused_gate_up)
{
	budget_case_of("qwen3-30b-a3b", MOEK_Q4_K, true, true);
}

/* gpt-oss as Hugging Face ships it: MXFP4 blocks and E8M0 scales in separate tensors, gate
 * and up fused with their rows interleaved (a node's slice is every other row pair of its
 * range), biases, the clamped SwiGLU. */
Test(forward_numa, budget_gpt_oss_hf_interleaved_gate_up)
{
	struct fwd_model probe;
	make_model_of(&probe, "gpt-oss-20b", MOEK_MXFP4, false, 16, 256, 512, false);
	const struct moe_proj_ref *gu =
	    &moe_catalog_expert(probe.cat, (uint32_t)fwd_moe_block(probe.cat, 0), 0)
	         ->proj[MOE_PROJ_GATE_UP];
	cr_assert(gu->present && gu->order == MOE_GATE_UP_INTERLEAVED,
	          "the generator's gpt-oss checkpoint has no interleaved gate_up");
	fwd_model_free(&probe);
	budget_case_of("gpt-oss-20b", MOEK_MXFP4, false, false);
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

/* Fails every read of (MoE layer 1, expert 3) that starts in node 1's down rows: node 0's
 * slice of the expert loads, node 1's fails. */
struct node1_fault {
	uint64_t from, to; /* file offsets of node 1's down rows of expert 3 */
	atomic_int hits;
};

static int fail_node1_slice(void *arg, const struct loader_read_info *info, int res)
{
	struct node1_fault *f = arg;
	if (info->layer == 1 && info->expert == 3 && info->offset >= f->from &&
	    info->offset < f->to) {
		atomic_fetch_add(&f->hits, 1);
		return -EIO;
	}
	return res;
}

Test(forward_numa, failed_slice_fails_only_its_requests)
{
	struct fwd_model m;
	make_model(&m, MOEK_Q8_0, 8, 256, 256, false);
	const struct moe_proj_ref *down =
	    &moe_catalog_expert(m.cat, (uint32_t)fwd_moe_block(m.cat, 1), 3)->proj[MOE_PROJ_DOWN];
	const uint64_t rb = moek_row_bytes(down->format, down->cols);
	/* node 1's down rows start at row 128 of 256 (8-row units, two nodes); the loader may
	 * start a read on the 4 KiB block below, still above node 0's start */
	struct node1_fault fault = {.from = (down->data.offset + 128 * rb) & ~(uint64_t)4095,
	                            .to = down->data.offset + down->data.length};
	cr_assert_gt(fault.from, down->data.offset);
	struct forward_engine *e = engine(&m, FORWARD_SOURCE_RESIDENCY, TWO_NODES,
	                                  m.cat->expert_bytes_total / 2, fail_node1_slice, &fault);
	struct forward_engine *ok = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, NULL, 0, NULL, NULL);
	uint32_t failed, passed;
	char why[256];
	cr_assert_eq(
	    fwd_replay_expert3_failure(e, ok, m.cat, 3, 700, &failed, &passed, why, sizeof(why)), 0,
	    "%s", why);
	cr_assert_gt(failed, 0);
	cr_assert_gt(passed, 0);
	cr_assert_gt(atomic_load(&fault.hits), 0);
	/* Only node 1's reads failed, yet the whole expert is FAILED (one decision for every
	 * node: node 0 keeps no slice of it), counted once, and its message names node 1. */
	struct residency_counters n0, n1;
	cr_assert_eq(forward_node_residency(e, 0, &n0), 0);
	cr_assert_eq(forward_node_residency(e, 1, &n1), 0);
	cr_assert_gt(n0.failures, 0);
	cr_assert_eq(n0.failures, n1.failures);
	cr_assert_eq(residency_state(e->w.res, 1, 3), EXPERT_FAILED);
	char msg[256];
	residency_error_message(e->w.res, 1, 3, msg, sizeof(msg));
	cr_assert_not_null(strstr(msg, "node 1's slice"), "%s", msg);
	cr_assert_eq(forward_would_run_now(e, fwd_moe_block(m.cat, 1), (const int32_t[]){3}, 1),
	             false);
	forward_destroy(ok);
	forward_destroy(e);
	fwd_model_free(&m);
}
