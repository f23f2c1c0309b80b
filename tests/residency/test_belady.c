/* test_belady.c — Belady's OPT: the textbook reference string, an exhaustive search on tiny
 * random traces (OPT must equal the best of all eviction choices under the same rules), and
 * every live policy never beating it. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static struct routing_trace parse(const char *text)
{
	struct routing_trace t;
	struct sidecar_error err = {0};
	cr_assert_eq(trace_parse(text, strlen(text), "test", &t, &err), 0, "%s", err.msg);
	return t;
}

/* 7 0 1 2 0 3 0 4 2 3 0 3 2 1 2 0 1 7 0 1 with 3 frames: OPT has 9 faults. */
Test(belady, textbook_reference_string)
{
	const int refs[] = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1};
	char text[1024];
	int n = snprintf(text, sizeof(text), "moe-trace 1 n_layers=1 n_experts=8 top_k=1\n");
	for (int i = 0; i < 20; i++)
		n += snprintf(text + n, sizeof(text) - (size_t)n, "%d 0 %d\n", i, refs[i]);
	struct routing_trace t = parse(text);
	struct sim_result r;
	struct sidecar_error err = {0};
	cr_assert_eq(sim_run_belady(&t, 3, 0, &r, &err), 0, "%s", err.msg);
	cr_assert_eq(r.refs, 20);
	cr_assert_eq(r.refs - r.hits, 9);
	/* LRU on the same string has 12 faults (textbook). */
	struct policy_spec lru;
	cr_assert_eq(policy_spec_parse("lru", &lru, &err), 0);
	cr_assert_eq(sim_run_policy(&t, &lru, 3, false, &r, &err), 0, "%s", err.msg);
	cr_assert_eq(r.refs - r.hits, 12);
	trace_free(&t);
}

/* Exhaustive: best hits from reference j with resident set `mask`, under sim.h's rules. */
struct brute {
	const struct routing_trace *t;
	uint32_t cap;
	uint32_t *ref_line; /* line of each reference */
	int *memo;          /* [(n_refs+1) << n_ids], -1 = unknown */
	uint32_t n_ids;
};

static uint32_t ref_id(const struct brute *b, uint32_t j)
{
	return b->t->lines[b->ref_line[j]].layer * b->t->n_experts + b->t->ids[j];
}

static int best(struct brute *b, uint32_t j, uint32_t mask)
{
	if (j == b->t->n_refs)
		return 0;
	int *m = &b->memo[((size_t)j << b->n_ids) | mask];
	if (*m >= 0)
		return *m;
	uint32_t id = ref_id(b, j);
	int result;
	if (mask & (1u << id)) {
		result = 1 + best(b, j + 1, mask);
	} else if ((uint32_t)__builtin_popcount(mask) < b->cap) {
		result = best(b, j + 1, mask | (1u << id));
	} else {
		const struct trace_line *l = &b->t->lines[b->ref_line[j]];
		uint32_t in_use = 0;
		for (uint32_t k = l->first; k < l->first + l->count; k++)
			in_use |= 1u << ref_id(b, k);
		result = -1;
		for (uint32_t v = 0; v < b->n_ids; v++) {
			if (!(mask & (1u << v)) || (in_use & (1u << v)))
				continue;
			int r = best(b, j + 1, (mask & ~(1u << v)) | (1u << id));
			if (r > result)
				result = r;
		}
		if (result < 0)
			result = best(b, j + 1, mask); /* nothing evictable: not admitted */
	}
	*m = result;
	return result;
}

Test(belady, equals_exhaustive_search_on_tiny_traces)
{
	uint64_t s = 99;
	const char *policies[] = {"lru",        "lru+layer",        "sieve", "sieve+layer",
	                          "sieve-heat", "sieve-heat+layer", "heat",  "heat+layer"};
	for (int trial = 0; trial < 300; trial++) {
		char text[4096];
		uint32_t layers = 1 + trial % 2, experts = layers == 1 ? 6 : 4, top_k = 2;
		int n =
		    snprintf(text, sizeof(text), "moe-trace 1 n_layers=%u n_experts=%u top_k=%u\n",
		             layers, experts, top_k);
		uint32_t lines = 4 + trial % 9;
		for (uint32_t li = 0; li < lines; li++) {
			s = s * 6364136223846793005ull + 1442695040888963407ull;
			uint32_t a = (uint32_t)(s >> 33) % experts,
			         b = (uint32_t)(s >> 45) % experts;
			bool two = (s >> 20) & 1 && a != b;
			if (two && a > b) { /* by id: the order the replays serve a line in */
				const uint32_t x = a;
				a = b;
				b = x;
			}
			n += snprintf(text + n, sizeof(text) - (size_t)n, "%u %u %u%s", li / layers,
			              li % layers, a, two ? "," : "\n");
			if (two)
				n += snprintf(text + n, sizeof(text) - (size_t)n, "%u\n", b);
		}
		struct routing_trace t = parse(text);
		struct brute b = {.t = &t, .n_ids = layers * experts};
		b.ref_line = malloc(t.n_refs * sizeof(uint32_t));
		for (uint32_t li = 0; li < t.n_lines; li++)
			for (uint32_t j = 0; j < t.lines[li].count; j++)
				b.ref_line[t.lines[li].first + j] = li;
		b.memo = malloc(((size_t)t.n_refs + 1) * ((size_t)1 << b.n_ids) * sizeof(int));
		for (uint32_t cap = 1; cap <= 4; cap++) {
			b.cap = cap;
			memset(b.memo, 0xff,
			       ((size_t)t.n_refs + 1) * ((size_t)1 << b.n_ids) * sizeof(int));
			int opt = best(&b, 0, 0);
			struct sim_result r;
			struct sidecar_error err = {0};
			cr_assert_eq(sim_run_belady(&t, cap, 0, &r, &err), 0, "%s", err.msg);
			cr_assert_eq((int)r.hits, opt,
			             "trial %d cap %u: belady %llu, exhaustive %d\n%s", trial, cap,
			             (unsigned long long)r.hits, opt, text);
			for (size_t p = 0; p < sizeof(policies) / sizeof(policies[0]); p++) {
				struct policy_spec spec;
				cr_assert_eq(policy_spec_parse(policies[p], &spec, &err), 0);
				struct sim_result pr;
				cr_assert_eq(sim_run_policy(&t, &spec, cap, true, &pr, &err), 0,
				             "%s", err.msg);
				cr_assert_leq(pr.hits, r.hits, "%s beat OPT (trial %d cap %u)",
				              policies[p], trial, cap);
			}
		}
		free(b.memo);
		free(b.ref_line);
		trace_free(&t);
	}
}

Test(belady, pinned_layers_are_hits)
{
	struct routing_trace t = parse("moe-trace 1 n_layers=2 n_experts=4 top_k=2\n"
	                               "0 0 0,1\n0 1 0\n1 0 2,3\n1 1 1\n");
	struct sim_result r;
	struct sidecar_error err = {0};
	cr_assert_eq(sim_run_belady(&t, 5, 1, &r, &err), 0, "%s", err.msg);
	cr_assert_eq(r.refs, 6);
	cr_assert_eq(r.hits, 4, "layer 0's four references are pinned hits");
	cr_assert_eq(sim_run_belady(&t, 3, 1, &r, &err), -1);
	cr_assert_eq(err.status, MOE_EINVAL);
	cr_assert(strstr(err.msg, "pinned layers do not fit"), "%s", err.msg);
	trace_free(&t);
}

/* Bytes with size classes, worked by hand. Experts 0-2 take 4 KiB, 3-5 40 KiB: two classes
 * (the sizes differ by more than two blocks). A budget of two small slots and one large one
 * splits as the residency splits it (one slot each, then the rest in proportion: the 4 KiB
 * left is one more small slot). References 0 3 1 4 2 3 0 4 1 3:
 *   small class, 2 slots, 0 1 2 0 1: 0, 1 miss; 2 misses and evicts 1 (next use after 0's);
 *     0 hits; 1 misses: 4 loads, 16384 bytes;
 *   large class, 1 slot, 3 4 3 4 3: every reference misses: 5 loads, 204800 bytes.
 * One pool of three slots all sized for the largest would instead have held 2 large experts. */
Test(belady, bytes_with_two_size_classes_worked_by_hand)
{
	const uint64_t bytes[6] = {4096, 4096, 4096, 40960, 40960, 40960};
	struct sim_sizes s;
	struct sidecar_error err = {0};
	cr_assert_eq(sim_sizes_from_bytes(bytes, 6, 4096, 1, &s, &err), 0, "%s", err.msg);
	cr_assert_eq(s.n_classes, 2);
	cr_assert_eq(s.class_of[2], 0);
	cr_assert_eq(s.class_of[3], 1);
	cr_assert_eq(s.all_bytes, 3 * 4096 + 3 * 40960);
	cr_assert_eq(sim_sizes_budget(&s, 2 * 4096 + 40960, &err), 0, "%s", err.msg);
	cr_assert_eq(s.slots[0], 2);
	cr_assert_eq(s.slots[1], 1);
	cr_assert_neq(sim_sizes_budget(&s, 40960, &err), 0, "below one slot of each class");
	cr_assert(strstr(err.msg, "45056"), "%s", err.msg);
	cr_assert_eq(sim_sizes_budget(&s, 2 * 4096 + 40960, &err), 0, "%s", err.msg);

	const int refs[] = {0, 3, 1, 4, 2, 3, 0, 4, 1, 3};
	char text[1024];
	int n = snprintf(text, sizeof(text), "moe-trace 1 n_layers=1 n_experts=6 top_k=1\n");
	for (int i = 0; i < 10; i++)
		n += snprintf(text + n, sizeof(text) - (size_t)n, "%d 0 %d\n", i, refs[i]);
	struct routing_trace t = parse(text);
	const struct sim_options o = {.sizes = &s};
	struct sim_result r;
	cr_assert_eq(sim_replay_belady(&t, &o, &r, &err), 0, "%s", err.msg);
	cr_assert_eq(r.refs, 10);
	cr_assert_eq(r.hits, 1);
	cr_assert_eq(r.demand_loads, 9);
	cr_assert_eq(r.demand_bytes, 4 * 4096 + 5 * 40960);
	cr_assert_eq(r.prefetch_bytes, 0);
	/* Counting from step 5 on: 3 0 4 1 3 — 0 hits, the rest read. */
	const struct sim_options late = {.sizes = &s, .from_step = 5};
	cr_assert_eq(sim_replay_belady(&t, &late, &r, &err), 0, "%s", err.msg);
	cr_assert_eq(r.refs, 5);
	cr_assert_eq(r.hits, 1);
	cr_assert_eq(r.demand_bytes, 4096 + 3 * 40960);
	/* Every policy reads at least OPT's bytes under the same classes. */
	static const char *const specs[] = {"lru", "sieve+layer", "heat+layer", "sieve-heat"};
	for (size_t i = 0; i < sizeof(specs) / sizeof(*specs); i++) {
		struct policy_spec spec;
		cr_assert_eq(policy_spec_parse(specs[i], &spec, &err), 0);
		struct sim_result p;
		cr_assert_eq(sim_replay_policy(&t, &spec, &o, &p, &err), 0, "%s", err.msg);
		cr_assert_geq(p.demand_bytes, 4 * 4096 + 5 * 40960, "%s", specs[i]);
		cr_assert_eq(p.refs, 10);
	}
	trace_free(&t);
	sim_sizes_free(&s);
}

/* Prefetches given to OPT, worked by hand (2 slots, 1 byte per load):
 *   0: miss {0}; p 2,0: 2 read into the free slot {0,2}, 0 held (nothing read);
 *   1: miss, evicts 0 (next use at 3, after 2's at 2) {2,1}; 2: hit (never used again);
 *   p 3: read (the sidecar read it), not kept: its next use (none) is no earlier than 2's;
 *   0: miss, evicts 2 {1,0}; 1: hit.
 * 3 demand loads, 2 prefetch loads, 2 hits. Without the prefetches OPT has 4 demand loads. */
Test(belady, prefetches_are_reads_that_opt_keeps_only_when_worth_it)
{
	struct routing_trace t = parse("moe-trace 1 n_layers=1 n_experts=4 top_k=1\n"
	                               "0 0 0\n"
	                               "p 0 2,0\n"
	                               "1 0 1\n"
	                               "2 0 2\n"
	                               "p 0 3\n"
	                               "3 0 0\n"
	                               "4 0 1\n");
	cr_assert_eq(t.n_lines, 5);
	cr_assert_eq(t.n_prefetches, 2);
	cr_assert_eq(t.prefetches[0].before_line, 1);
	cr_assert_eq(t.prefetches[1].before_line, 3);
	struct sidecar_error err = {0};
	struct sim_result r;
	const struct sim_options o = {.capacity = 2, .prefetches = true};
	cr_assert_eq(sim_replay_belady(&t, &o, &r, &err), 0, "%s", err.msg);
	cr_assert_eq(r.refs, 5);
	cr_assert_eq(r.hits, 2);
	cr_assert_eq(r.demand_loads, 3);
	cr_assert_eq(r.prefetch_loads, 2);
	cr_assert_eq(r.demand_bytes + r.prefetch_bytes, 5);
	const struct sim_options none = {.capacity = 2};
	cr_assert_eq(sim_replay_belady(&t, &none, &r, &err), 0, "%s", err.msg);
	cr_assert_eq(r.demand_loads, 4);
	cr_assert_eq(r.prefetch_loads, 0);
	/* A policy replays the same prefetch lines: LRU loads 2 into its free slot too. */
	struct policy_spec lru;
	cr_assert_eq(policy_spec_parse("lru", &lru, &err), 0);
	cr_assert_eq(sim_replay_policy(&t, &lru, &o, &r, &err), 0, "%s", err.msg);
	cr_assert_geq(r.prefetch_loads, 1);
	cr_assert_geq(r.demand_loads + r.prefetch_loads, 5);
	/* The writer writes the prefetch lines back where they were. */
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_eq(trace_write(f, &t), 0);
	fclose(f);
	cr_assert(strstr(buf, "0 0 0\np 0 2,0\n1 0 1\n"), "%s", buf);
	cr_assert(strstr(buf, "2 0 2\np 0 3\n3 0 0\n"), "%s", buf);
	free(buf);
	trace_free(&t);
}
