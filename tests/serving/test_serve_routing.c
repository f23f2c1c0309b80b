/* test_serve_routing.c — what the sidecar learns from the routing it serves: per-expert counts
 * and heat (STATS, the expert table, `stats --experts`), `serve --record-trace` replayed by
 * `simulate`, GPU expert placement (moe_placement, `moe-sidecar placement`), and GPU mask
 * switches with FORWARDs in flight.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "catalog_adapter.h"
#include "serve_fixture.h"
#include "sim.h"
#include "trace.h"

/* Runs cmd, returns its exit status and its stdout (malloc'd, NUL-terminated) in *out. */
static int run_shell(const char *cmd, char **out)
{
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	cr_assert_not_null(buf);
	for (size_t got; (got = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
		n += got;
		if (n + 1 == cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			cr_assert_not_null(buf);
		}
	}
	buf[n] = '\0';
	*out = buf;
	return pclose(p);
}

/* One FORWARD of n tokens at layer with the given ids (k per token), weights w. */
static int forward_ids(struct served *s, int32_t layer, uint32_t n, uint32_t k, const int32_t *ids,
                       const float *w)
{
	struct fwd_case fc;
	fwd_case_make(&fc, 3 + (uint64_t)layer, layer, n, k, ref_n_experts(s->ref),
	              ref_hidden(s->ref), false);
	memcpy(fc.ids, ids, (size_t)n * k * sizeof(int32_t));
	if (w)
		memcpy(fc.weights, w, (size_t)n * k * sizeof(float));
	struct moe_completion d;
	int rc = served_forward(s, &fc, NULL, &d);
	fwd_case_free(&fc);
	return rc;
}

Test(serve_routing, counts_and_heat_follow_the_forwards_served)
{
	const char *extra[] = {"--heat-half-life", "4", NULL};
	struct served s;
	served_start(&s, "q8_0", extra);
	const uint32_t L = ref_n_layers(s.ref), E = ref_n_experts(s.ref);
	/* Layer 1: 3 tokens name 2 (all), 5 (two of them), 9 (one); then 1 token names 2. */
	const int32_t a[] = {2, 5, 2, 9, 5, 2};
	cr_assert_eq(forward_ids(&s, 1, 3, 2, a, NULL), MOE_OK);
	const int32_t b[] = {2, -1};
	cr_assert_eq(forward_ids(&s, 1, 1, 2, b, NULL), MOE_OK);
	/* A refused FORWARD routes nothing. */
	const int32_t bad[] = {7, (int32_t)E};
	cr_assert_eq(forward_ids(&s, 2, 1, 2, bad, NULL), MOE_EBADEXPERT);

	uint64_t *counts = calloc((size_t)L * E, sizeof(*counts));
	float *heat = calloc((size_t)L * E, sizeof(*heat));
	uint32_t half_life = 0;
	cr_assert_eq(moe_expert_stats(s.c, counts, heat, (size_t)L * E, &half_life, 5000), MOE_OK,
	             "%s", moe_last_error(s.c));
	cr_assert_eq(half_life, 4);
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t e = 0; e < E; e++) {
			const uint64_t want = l != 1 ? 0 : e == 2 ? 4 : e == 5 ? 2 : e == 9 ? 1 : 0;
			cr_assert_eq(counts[l * E + e], want, "layer %u expert %u: %llu", l, e,
			             (unsigned long long)counts[l * E + e]);
		}
	/* The layer's clock is 4 tokens; the first FORWARD was 1 token (a quarter half-life)
	 * before it: expert 2 = 3·2^(-1/4) + 1, expert 5 = 2·2^(-1/4). */
	cr_assert_float_eq(heat[1 * E + 2], 3.0f * exp2f(-0.25f) + 1.0f, 1e-4f);
	cr_assert_float_eq(heat[1 * E + 5], 2.0f * exp2f(-0.25f), 1e-4f);
	cr_assert_float_eq(heat[1 * E + 9], exp2f(-0.25f), 1e-4f);
	cr_assert_float_eq(heat[0 * E + 2], 0.0f, 1e-9f);
	/* Too small an array is refused before asking. */
	cr_assert_eq(moe_expert_stats(s.c, counts, NULL, (size_t)L * E - 1, NULL, 5000),
	             MOE_EINVAL);

	/* The JSON has the same figures with MOE_STATS_EXPERTS, and the routing keys always. */
	char *json = malloc(1 << 20);
	cr_assert_eq(moe_stats_json_flags(s.c, MOE_STATS_EXPERTS, json, 1 << 20, 5000), MOE_OK);
	cr_assert(strstr(json, "\"experts\":[{\"layer\":0,\"tokens\":0,"), "%s", json);
	cr_assert(strstr(json, "{\"layer\":1,\"tokens\":4,\"counts\":[0,0,4,0,0,2,0,0,0,1,"), "%s",
	          json);
	cr_assert_eq(json_top_u64(json, "heat_half_life_tokens"), 4);
	cr_assert_eq(json_top_u64(json, "gpu_mask_switches"), 0);
	cr_assert_eq(moe_stats_json(s.c, json, 1 << 20, 5000), MOE_OK);
	cr_assert_null(strstr(json, "\"experts\""), "only when asked: %s", json);
	cr_assert_eq(json_top_u64(json, "heat_half_life_tokens"), 4);
	/* Unknown STATS flags are refused by the sidecar. */
	struct moe_slot sl;
	cr_assert_eq(moe_slot_acquire(s.c, &sl), MOE_OK);
	struct moe_request r = {.op = MOE_OP_STATS, .flags = 0x80, .slot = sl.index};
	struct moe_completion d;
	moe_call(s.c, &r, &d, 5000);
	cr_assert_eq(d.status, MOE_EBADFIELD);
	cr_assert(d.message && strstr(d.message, "flags 0x80"), "%s", d.message);
	cr_assert_eq(moe_slot_release(s.c, sl.index), MOE_OK);

	/* `stats --experts=2` lists the two hottest of layer 1 with their shares. */
	char cmd[512], *out;
	snprintf(cmd, sizeof(cmd), "%s stats --socket %s --experts=2", MOE_SIDECAR_BIN,
	         s.sp.socket);
	cr_assert_eq(run_shell(cmd, &out), 0, "%s", out);
	cr_assert(strstr(out, "half-life 4 tokens"), "%s", out);
	cr_assert(strstr(out, "    1        4 tok:  e2 4 (57.1%)"), "%s", out);
	cr_assert(strstr(out, "e5 2 (28.6%)"), "%s", out);
	cr_assert_null(strstr(out, "e9 1"), "two per layer: %s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s stats --socket %s --json", MOE_SIDECAR_BIN, s.sp.socket);
	cr_assert_eq(run_shell(cmd, &out), 0, "%s", out);
	cr_assert(strstr(out, "\"experts\":["), "%s", out);
	free(out);
	free(json);
	free(counts);
	free(heat);
	served_stop(&s);
}

Test(serve_routing, record_trace_writes_what_was_served_and_simulate_replays_it)
{
	char path[160];
	struct served s;
	/* The fixture's temp directory exists only once started: record next to the socket. */
	const char *extra[] = {"--record-trace", NULL, NULL};
	char dir[] = "/tmp/moe-trace-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/served.trace", dir);
	extra[1] = path;
	served_start(&s, "q8_0", extra);
	const uint32_t L = ref_n_layers(s.ref), E = ref_n_experts(s.ref);
	/* Two decode passes (one token over every layer), then a 2-token batch at layer 0. */
	for (uint32_t step = 0; step < 2; step++)
		for (uint32_t l = 0; l < L; l++) {
			const int32_t ids[] = {(int32_t)((l + step) % E), (int32_t)((l + 3) % E),
			                       -1};
			const float w[] = {3.0f, 1.0f, 9.0f};
			cr_assert_eq(forward_ids(&s, (int32_t)l, 1, 3, ids, w), MOE_OK);
		}
	const int32_t batch[] = {4, 5, 6, 7};
	const float bw[] = {1, 1, 1, 3};
	cr_assert_eq(forward_ids(&s, 0, 2, 2, batch, bw), MOE_OK);
	served_stop(&s); /* drains the recorder */

	struct routing_trace t;
	struct sidecar_error err = {0};
	cr_assert_eq(trace_load(path, &t, &err), 0, "%s", err.msg);
	cr_assert_eq(t.n_layers, L);
	cr_assert_eq(t.n_experts, E);
	cr_assert(t.scored);
	cr_assert_eq(t.n_lines, 2 * L + 2);
	for (uint32_t step = 0; step < 2; step++)
		for (uint32_t l = 0; l < L; l++) {
			const struct trace_line *ln = &t.lines[step * L + l];
			cr_assert_eq(ln->step, step, "a decode pass is one step");
			cr_assert_eq(ln->layer, l);
			cr_assert_eq(ln->count, 2, "the -1 is not a reference");
			cr_assert_eq(t.ids[ln->first], (l + step) % E);
			cr_assert_eq(t.ids[ln->first + 1], (l + 3) % E);
			cr_assert_float_eq(t.scores[ln->first], 0.75f, 1e-4f);
			cr_assert_float_eq(t.scores[ln->first + 1], 0.25f, 1e-4f);
		}
	/* The batch: one step per token, in order, after the decode passes. */
	cr_assert_eq(t.lines[2 * L].step, 2);
	cr_assert_eq(t.lines[2 * L + 1].step, 3);
	cr_assert_eq(t.ids[t.lines[2 * L + 1].first + 1], 7);
	cr_assert_float_eq(t.scores[t.lines[2 * L + 1].first + 1], 0.75f, 1e-4f);
	trace_free(&t);

	char cmd[512], *out;
	snprintf(cmd, sizeof(cmd), "%s simulate %s --capacities 50%% --json", MOE_SIDECAR_BIN,
	         path);
	cr_assert_eq(run_shell(cmd, &out), 0, "%s", out);
	cr_assert(strstr(out, "\"sieve+layer\": [") && strstr(out, "\"belady\": ["), "%s", out);
	free(out);
	/* The placement command reads it too: every strategy, a mask of exactly N experts. */
	snprintf(cmd, sizeof(cmd), "%s placement --trace %s --gpu-experts 4 --json",
	         MOE_SIDECAR_BIN, path);
	cr_assert_eq(run_shell(cmd, &out), 0, "%s", out);
	cr_assert(strstr(out, "\"frequency\":") && strstr(out, "\"front-loading\":") &&
	              strstr(out, "\"balanced\":") && strstr(out, "\"uniform\":"),
	          "%s", out);
	size_t trues = 0;
	for (const char *p = strstr(out, "\"gpu_experts_mask\""); p && (p = strstr(p, "true"));
	     p += 4)
		trues++;
	cr_assert_eq(trues, 4, "%s", out);
	free(out);
	unlink(path);
	rmdir(dir);
}

/* A recorded run replayed in bytes: decode passes at a budget that evicts, with the next
 * layer's experts sent as PREFETCH hints before each FORWARD. The trace holds the loads the
 * hints started (`p` lines); replaying it through the sidecar's policy over the same size
 * classes and budget reads what the sidecar read: its demand loads are the sidecar's cold
 * misses, its prefetch loads the prefetches it started, and its bytes the loader's (each
 * expert's extents' aligned supersets, less what lies past the end of the file). Belady's OPT
 * given the same prefetches reads no more. */
Test(serve_routing, a_recorded_run_replayed_in_bytes_reads_what_the_sidecar_read)
{
	char path[160];
	char dir[] = "/tmp/moe-trace-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/served.trace", dir);
	const char *extra[] = {"--record-trace", path, "--mem-budget", "30%", NULL};
	struct served s;
	served_start(&s, "q4_k", extra);
	const uint32_t L = ref_n_layers(s.ref), E = ref_n_experts(s.ref);
	uint64_t r = 12345;
	int32_t ids[4 * 64];
	for (uint32_t i = 0; i < 4 * 64; i++)
		ids[i] = (int32_t)((test_rand(&r) >> 20) % E);
	for (uint32_t step = 0; step < 4; step++)
		for (uint32_t l = 0; l < L; l++) {
			int32_t cur[2], next[2];
			for (uint32_t j = 0; j < 2; j++) {
				cur[j] = ids[(step * L + l) * 2 % 256 + j];
				next[j] = ids[(step * L + l + 1) * 2 % 256 + j];
			}
			if (cur[1] == cur[0])
				cur[1] = (cur[0] + 1) % (int32_t)E;
			if (l + 1 < L) {
				const float pw[2] = {1, 1};
				uint32_t queued;
				cr_assert_eq(
				    moe_prefetch(s.c, (int32_t)l + 1, next, pw, 2, &queued, 5000),
				    MOE_OK);
			}
			const float w[2] = {0.6f, 0.4f};
			cr_assert_eq(forward_ids(&s, (int32_t)l, 1, 2, cur, w), MOE_OK);
		}
	char *json = served_stats(&s);
	const int64_t cold = json_top_u64(json, "cold_misses"),
	              prefetches = json_top_u64(json, "prefetches"),
	              loader = json_top_u64(json, "loader_bytes_read"),
	              budget = json_top_u64(json, "budget_bytes"),
	              evictions = json_top_u64(json, "evictions"),
	              dropped = json_top_u64(json, "prefetch_dropped");
	free(json);
	char model[200]; /* the fixture removes its own at stop */
	snprintf(model, sizeof(model), "%s/model.gguf", dir);
	cr_assert_eq(link(s.model, model), 0, "link %s: %s", s.model, strerror(errno));
	served_stop(&s);
	cr_assert(cold > 0 && prefetches > 0 && evictions > 0,
	          "cold %lld prefetches %lld evictions %lld", (long long)cold,
	          (long long)prefetches, (long long)evictions);

	struct routing_trace t;
	struct sidecar_error err = {0};
	cr_assert_eq(trace_load(path, &t, &err), 0, "%s", err.msg);
	cr_assert_eq(t.n_lines, 4 * L);
	cr_assert_gt(t.n_prefetches, 0);
	struct moe_catalog *cat;
	cr_assert_eq(moe_catalog_open(model, &cat, &err), 0, "%s", err.msg);
	struct expert_map map;
	struct expert_extent_roles roles;
	cr_assert_eq(expert_map_from_catalog(cat, &map, &roles, NULL, &err), 0, "%s", err.msg);
	struct sim_sizes sz;
	cr_assert_eq(sim_sizes_from_map(&map, 4096, &sz, &err), 0, "%s", err.msg);
	cr_assert_eq(sim_sizes_budget(&sz, (uint64_t)budget, &err), 0, "%s", err.msg);
	struct policy_spec spec;
	cr_assert_eq(policy_spec_parse(POLICY_DEFAULT_SPEC, &spec, &err), 0);
	const struct sim_options o = {.sizes = &sz, .prefetches = true};
	struct sim_result got, opt;
	cr_assert_eq(sim_replay_policy(&t, &spec, &o, &got, &err), 0, "%s", err.msg);
	cr_assert_eq(sim_replay_belady(&t, &o, &opt, &err), 0, "%s", err.msg);
	cr_assert(got.demand_loads == (uint64_t)cold && got.prefetch_loads == (uint64_t)prefetches,
	          "replay: %llu demand and %llu prefetch loads (%llu dropped); sidecar: %lld cold "
	          "misses, %lld prefetches, %lld dropped",
	          (unsigned long long)got.demand_loads, (unsigned long long)got.prefetch_loads,
	          (unsigned long long)got.prefetch_dropped, (long long)cold, (long long)prefetches,
	          (long long)dropped);
	const uint64_t bytes = got.demand_bytes + got.prefetch_bytes;
	/* The loader reads each extent's aligned superset, less a tail past the end of the file:
	 * at most one block per load. */
	cr_assert(bytes >= (uint64_t)loader &&
	              bytes - (uint64_t)loader <= 4096 * (got.demand_loads + got.prefetch_loads),
	          "replay %llu bytes, loader %lld", (unsigned long long)bytes, (long long)loader);
	cr_assert_leq(opt.demand_bytes + opt.prefetch_bytes, bytes);
	cr_assert_eq(opt.prefetch_loads <= got.prefetch_loads + got.demand_loads, true);
	sim_sizes_free(&sz);
	expert_map_free(&map);
	moe_catalog_close(cat);
	trace_free(&t);

	/* The command says the same per token, against OPT's. */
	char cmd[768], *out;
	snprintf(cmd, sizeof(cmd), "%s simulate %s --model %s --capacities %lld --json",
	         MOE_SIDECAR_BIN, path, model, (long long)budget);
	cr_assert_eq(run_shell(cmd, &out), 0, "%s", out);
	cr_assert(strstr(out, "\"reads_unit\": \"bytes\"") && strstr(out, "\"reads_per_token\": {"),
	          "%s", out);
	free(out);
	unlink(model);
	unlink(path);
	rmdir(dir);
}

Test(serve_routing, record_trace_stops_at_its_cap_with_a_log_line)
{
	char path[160];
	char dir[] = "/tmp/moe-trace-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/capped.trace", dir);
	const char *extra[] = {"--record-trace", path, "--record-trace-max-mib", "1", NULL};
	struct served s;
	served_start(&s, "q8_0", extra);
	/* 64-token FORWARDs of 8 ids: ~64 lines of ~60 bytes each; 400 of them ≈ 1.5 MiB. */
	const uint32_t E = ref_n_experts(s.ref), k = 8, n = 64;
	int32_t *ids = malloc(n * k * sizeof(int32_t));
	for (uint32_t i = 0; i < 400; i++) {
		for (uint32_t t = 0; t < n; t++)
			for (uint32_t j = 0; j < k; j++)
				ids[t * k + j] = (int32_t)((t + i + j * 2) % E);
		cr_assert_eq(forward_ids(&s, (int32_t)(i % ref_n_layers(s.ref)), n, k, ids, NULL),
		             MOE_OK);
	}
	free(ids);
	char *json = served_stats(&s);
	cr_assert(strstr(json, "\"trace_stopped\":"), "%s", json);
	free(json);
	cr_assert(
	    log_wait(&s.sp, "reached --record-trace-max-mib 1 MiB: recording stopped", 1, 10000));
	served_stop(&s);
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_assert(st.st_size <= (1 << 20) && st.st_size > (1 << 19), "%lld bytes",
	          (long long)st.st_size);
	struct routing_trace t;
	struct sidecar_error err = {0};
	cr_assert_eq(trace_load(path, &t, &err), 0, "whole lines only: %s", err.msg);
	trace_free(&t);
	unlink(path);
	rmdir(dir);
}

/* A real full disk: the trace on a 64 KiB tmpfs (root: mount; skipped otherwise). The
 * recording stops with one log line, the file is cut back to its last whole line, STATS
 * trace_bytes is its size, and simulate reads it. */
Test(serve_routing, record_trace_on_a_full_disk_keeps_whole_lines)
{
	char dir[] = "/tmp/moe-full-XXXXXX", path[160];
	cr_assert_not_null(mkdtemp(dir));
	if (mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700") != 0) {
		rmdir(dir);
		cr_skip_test("mounting a 64 KiB tmpfs needs root (CAP_SYS_ADMIN): %s",
		             strerror(errno));
	}
	snprintf(path, sizeof(path), "%s/full.trace", dir);
	const char *extra[] = {"--record-trace", path, NULL};
	struct served s;
	served_start(&s, "q8_0", extra);
	const uint32_t E = ref_n_experts(s.ref), k = 8, n = 64;
	int32_t *ids = malloc(n * k * sizeof(int32_t));
	/* 64-token FORWARDs of 8 ids: ~4 KiB of trace each; 40 of them fill the disk. */
	for (uint32_t i = 0; i < 40; i++) {
		for (uint32_t t = 0; t < n; t++)
			for (uint32_t j = 0; j < k; j++)
				ids[t * k + j] = (int32_t)((t + i + j * 2) % E);
		cr_assert_eq(forward_ids(&s, (int32_t)(i % ref_n_layers(s.ref)), n, k, ids, NULL),
		             MOE_OK);
	}
	free(ids);
	cr_assert(log_wait(&s.sp, "write failed (No space left on device)", 1, 10000));
	cr_expect_eq(log_count(&s.sp, "cut back to its last whole line"), 1);
	char *json = served_stats(&s);
	const int64_t trace_bytes = json_top_u64(json, "trace_bytes");
	cr_expect(strstr(json, "\"trace_stopped\":true"), "%s", json);
	free(json);
	served_stop(&s);
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_expect_eq(trace_bytes, (int64_t)st.st_size, "STATS says %lld bytes, the file has %lld",
	             (long long)trace_bytes, (long long)st.st_size);
	struct routing_trace t;
	struct sidecar_error err = {0};
	cr_expect_eq(trace_load(path, &t, &err), 0, "whole lines only: %s", err.msg);
	trace_free(&t);
	char cmd[512], *out;
	snprintf(cmd, sizeof(cmd), "%s simulate %s --capacities 50%% 2>&1", MOE_SIDECAR_BIN, path);
	cr_expect_eq(run_shell(cmd, &out), 0, "%s", out);
	free(out);
	unlink(path);
	cr_expect_eq(umount(dir), 0, "%s", strerror(errno));
	rmdir(dir);
}

/* The mask switch: FORWARDs naming expert X submitted before a MASK that moves X to the GPU
 * are computed under the old mask (exact bits); FORWARDs after it that name X are refused;
 * the switch is counted and X's slot freed. The FORWARDs are prefill-sized (never inline), so
 * they queue on the forward thread while the MASK arrives. */
Test(serve_routing, mask_switch_keeps_forwards_in_flight_on_their_mask)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const uint32_t H = ref_hidden(s.ref), E = ref_n_experts(s.ref), N = 48, K = 4;
	const int32_t layer = 1, X = 6;
	const size_t row = (E + 7) / 8, mask_bytes = row * ref_n_layers(s.ref);
	char *json = served_stats(&s);
	const int64_t resident0 = json_top_u64(json, "resident_bytes");
	free(json);
	for (int round = 0; round < 3; round++) {
		struct fwd_case fc[3];
		struct moe_slot sl[4];
		for (int i = 0; i < 3; i++) {
			fwd_case_make(&fc[i], 100 + (uint64_t)(round * 3 + i), layer, N, K, E, H,
			              false);
			/* Valid on each side of the switch: masking X, F0 and F1 name it and F2
			 * does not; handing it back, the other way round. */
			const bool masking = round != 1;
			const bool names_x = masking ? i < 2 : i == 2;
			for (uint32_t t = 0; t < N; t++)
				for (uint32_t j = 0; j < K; j++)
					fc[i].ids[t * K + j] =
					    j == 0 ? (names_x ? X : X + 1)
					           : (int32_t)((X + 2 + t + j * 3) % E);
			for (uint32_t t = 0; t < N; t++) /* no other id repeats X or X + 1 */
				for (uint32_t j = 1; j < K; j++)
					if (fc[i].ids[t * K + j] == X ||
					    fc[i].ids[t * K + j] == X + 1)
						fc[i].ids[t * K + j] = (X + 9) % (int32_t)E;
			memcpy(fc[i].x_wire, fc[i].x, (size_t)N * H * sizeof(float));
		}
		uint8_t bits[64] = {0};
		if (round != 1) /* rounds 0 and 2 mask X, round 1 hands it back */
			bits[(size_t)layer * row + X / 8] = (uint8_t)(1u << (X % 8));
		/* Submit F0, F1, MASK, F2, then collect. */
		uint32_t order[4];
		for (int i = 0; i < 4; i++) {
			cr_assert_eq(moe_slot_acquire(s.c, &sl[i]), MOE_OK);
			order[i] = sl[i].index;
		}
		for (int i = 0, f = 0; i < 4; i++) {
			if (i == 2) {
				memcpy(sl[i].input, bits, mask_bytes);
				struct moe_request r = {.op = MOE_OP_MASK,
				                        .slot = sl[i].index,
				                        .layer = -1,
				                        .user_data = 9};
				cr_assert_eq(moe_submit(s.c, &r), MOE_OK);
				continue;
			}
			memcpy(sl[i].input, fc[f].x, (size_t)N * H * sizeof(float));
			memcpy(sl[i].expert_ids, fc[f].ids, (size_t)N * K * sizeof(int32_t));
			memcpy(sl[i].expert_weights, fc[f].weights, (size_t)N * K * sizeof(float));
			cr_assert_eq(moe_forward_submit(s.c, sl[i].index, layer, N, (uint16_t)K, 0,
			                                MOE_DTYPE_F32, MOE_DTYPE_F32, 0),
			             MOE_OK);
			f++;
		}
		float *want = malloc((size_t)N * H * sizeof(float));
		for (int i = 0, f = 0; i < 4; i++) {
			struct moe_completion d;
			int rc = moe_forward_wait(s.c, order[i], &d, 20000);
			if (i == 2) {
				cr_assert_eq(rc, MOE_OK, "MASK: %s", moe_last_error(s.c));
				continue;
			}
			cr_assert_eq(rc, MOE_OK, "round %d FORWARD %d: %s", round, f,
			             moe_last_error(s.c));
			cr_assert_eq(ref_forward(s.ref, layer, N, K, 0, fc[f].x, MOE_DTYPE_F32,
			                         fc[f].ids, fc[f].weights, NULL, want, NULL),
			             MOE_OK);
			cr_assert_eq(memcmp(sl[i].output, want, (size_t)N * H * sizeof(float)), 0,
			             "round %d FORWARD %d: not the bits of one computation", round,
			             f);
			f++;
		}
		free(want);
		for (int i = 0; i < 4; i++)
			cr_assert_eq(moe_slot_release(s.c, order[i]), MOE_OK);
		/* After the switch: X refused while masked, served again once handed back. */
		const int32_t ids[] = {X, (X + 1) % (int32_t)E};
		const int rc = forward_ids(&s, layer, 1, 2, ids, NULL);
		cr_assert_eq(rc, round == 1 ? MOE_OK : MOE_EMASKED, "round %d", round);
		json = served_stats(&s);
		cr_assert_eq(json_top_u64(json, "gpu_mask_switches"), round + 1, "%s", json);
		cr_assert_eq(json_top_u64(json, "gpu_masked_experts"), round == 1 ? 0 : 1, "%s",
		             json);
		if (round == 0) /* X's slot was freed (every expert was resident) */
			cr_assert_lt(json_top_u64(json, "resident_bytes"), resident0, "%s", json);
		free(json);
		for (int i = 0; i < 3; i++)
			fwd_case_free(&fc[i]);
	}
	/* Setting the same mask again is not a switch. */
	uint8_t same[64] = {0};
	same[(size_t)layer * row + X / 8] = (uint8_t)(1u << (X % 8));
	cr_assert_eq(moe_set_gpu_mask(s.c, -1, same, mask_bytes, 5000), MOE_OK);
	json = served_stats(&s);
	cr_assert_eq(json_top_u64(json, "gpu_mask_switches"), 3, "%s", json);
	free(json);
	served_stop(&s);
}

/* moe_placement on a load small enough to work by hand. 2 MoE layers in blocks 1 and 3 of 4,
 * 4 experts each:
 *   layer 0: 10  0  5  1      layer 1: 2  8  1  0
 */
Test(serve_routing, placement_strategies_worked_by_hand)
{
	const double load[] = {10, 0, 5, 1, 2, 8, 1, 0};
	const int32_t blocks[] = {1, 3};
	uint8_t mask[4];
	double covered;
	/* frequency, 3: 10, 8, 5 = 23 of 27 */
	cr_assert_eq(
	    moe_placement(load, 2, 4, blocks, 4, 3, MOE_PLACE_FREQUENCY, mask, 4, &covered),
	    MOE_OK);
	cr_assert_eq(mask[0], 0);
	cr_assert_eq(mask[1], 0x5); /* block 1: experts 0, 2 */
	cr_assert_eq(mask[2], 0);
	cr_assert_eq(mask[3], 0x2); /* block 3: expert 1 */
	cr_assert_float_eq(covered, 23.0 / 27.0, 1e-12);
	/* uniform, 3: two in layer 0 (0, 2), one in layer 1 (1) — the same here */
	cr_assert_eq(moe_placement(load, 2, 4, blocks, 4, 3, MOE_PLACE_UNIFORM, mask, 4, &covered),
	             MOE_OK);
	cr_assert(mask[1] == 0x5 && mask[3] == 0x2);
	/* front-loading, 5: layer 0 whole (0, 2, 3, 1), then layer 1's hottest (1) */
	cr_assert_eq(
	    moe_placement(load, 2, 4, blocks, 4, 5, MOE_PLACE_FRONT_LOADING, mask, 4, &covered),
	    MOE_OK);
	cr_assert(mask[1] == 0xf && mask[3] == 0x2, "%x %x", mask[1], mask[3]);
	cr_assert_float_eq(covered, 24.0 / 27.0, 1e-12);
	/* balanced, 2: layer 0 (16 left) gives 0 → 6 left; layer 1 (11) gives 1 → 3 left */
	cr_assert_eq(moe_placement(load, 2, 4, blocks, 4, 2, MOE_PLACE_BALANCED, mask, 4, &covered),
	             MOE_OK);
	cr_assert(mask[1] == 0x1 && mask[3] == 0x2, "%x %x", mask[1], mask[3]);
	/* balanced, 3: then layer 0 (6 left) gives 2 */
	cr_assert_eq(moe_placement(load, 2, 4, blocks, 4, 3, MOE_PLACE_BALANCED, mask, 4, &covered),
	             MOE_OK);
	cr_assert(mask[1] == 0x5 && mask[3] == 0x2);
	/* A budget above every expert takes them all; none takes none. */
	cr_assert_eq(
	    moe_placement(load, 2, 4, blocks, 4, 99, MOE_PLACE_FREQUENCY, mask, 4, &covered),
	    MOE_OK);
	cr_assert(mask[1] == 0xf && mask[3] == 0xf && covered == 1.0);
	cr_assert_eq(moe_placement(load, 2, 4, NULL, 2, 0, MOE_PLACE_BALANCED, mask, 2, &covered),
	             MOE_OK);
	cr_assert(mask[0] == 0 && mask[1] == 0 && covered == 0.0);
	/* Refusals: a mask of the wrong size, blocks out of order, negative load, names. */
	cr_assert_eq(moe_placement(load, 2, 4, blocks, 4, 3, 0, mask, 3, NULL), MOE_EINVAL);
	const int32_t backwards[] = {3, 1};
	cr_assert_eq(moe_placement(load, 2, 4, backwards, 4, 3, 0, mask, 4, NULL), MOE_EINVAL);
	const double neg[] = {1, -1, 0, 0, 0, 0, 0, 0};
	cr_assert_eq(moe_placement(neg, 2, 4, NULL, 2, 1, 0, mask, 2, NULL), MOE_EINVAL);
	cr_assert_eq(moe_placement(load, 2, 4, NULL, 2, 1, MOE_PLACE_COUNT, mask, 2, NULL),
	             MOE_EINVAL);
	cr_assert_str_eq(moe_placement_name(MOE_PLACE_FRONT_LOADING), "front-loading");
	cr_assert_eq(moe_placement_parse("balanced"), MOE_PLACE_BALANCED);
	cr_assert_eq(moe_placement_parse("hottest"), MOE_EINVAL);
	cr_assert_null(moe_placement_name(7));
}

/* `placement --socket`: the sidecar's counts, the mask for its blocks; frequency's mask holds
 * the most routed experts and applying it through moe_set_gpu_mask masks exactly them. */
Test(serve_routing, placement_from_a_running_sidecar)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const uint32_t L = ref_n_layers(s.ref), E = ref_n_experts(s.ref);
	const int32_t hot[] = {3, 11, 3, 12, 3, 11};
	cr_assert_eq(forward_ids(&s, 2, 3, 2, hot, NULL), MOE_OK);
	char cmd[512], *out;
	snprintf(cmd, sizeof(cmd), "%s placement --socket %s --gpu-experts 2", MOE_SIDECAR_BIN,
	         s.sp.socket);
	cr_assert_eq(run_shell(cmd, &out), 0, "%s", out);
	const char *freq = strstr(out, "\nfrequency ");
	const char *pct = freq ? strstr(freq, "83.3%") : NULL;
	cr_assert(pct && pct < strchr(freq + 1, '\n'), "%s", out);
	cr_assert(strstr(out, "kt-kernel gpu_experts_mask ([3, 16] bool)"), "%s", out);
	cr_assert(strstr(out, "    2: 3 11\n"), "%s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s placement --socket %s --gpu-bytes 1 --expert-bytes 1 --json",
	         MOE_SIDECAR_BIN, s.sp.socket);
	cr_assert_eq(run_shell(cmd, &out), 0, "%s", out);
	cr_assert(strstr(out, "\"gpu_experts\":1,") && strstr(out, "\"frequency\":0.500000"), "%s",
	          out);
	free(out);
	/* Bad arguments say what they expected. */
	snprintf(cmd, sizeof(cmd), "%s placement --socket %s --gpu-experts 2 --strategy best 2>&1",
	         MOE_SIDECAR_BIN, s.sp.socket);
	cr_assert_neq(run_shell(cmd, &out), 0);
	cr_assert(strstr(out, "expected frequency, uniform, front-loading or balanced"), "%s", out);
	free(out);

	uint64_t *counts = calloc((size_t)L * E, sizeof(*counts));
	double *load = calloc((size_t)L * E, sizeof(*load));
	cr_assert_eq(moe_expert_stats(s.c, counts, NULL, (size_t)L * E, NULL, 5000), MOE_OK);
	for (size_t i = 0; i < (size_t)L * E; i++)
		load[i] = (double)counts[i];
	int32_t blocks[8];
	cr_assert_eq(moe_model_layers(s.c, blocks, 8), (int)L);
	uint8_t mask[64];
	const size_t mb = (E + 7) / 8 * L;
	double covered;
	cr_assert_eq(
	    moe_placement(load, L, E, blocks, L, 2, MOE_PLACE_FREQUENCY, mask, mb, &covered),
	    MOE_OK);
	cr_assert_eq(moe_set_gpu_mask(s.c, -1, mask, mb, 5000), MOE_OK, "%s", moe_last_error(s.c));
	cr_assert_eq(forward_ids(&s, 2, 3, 2, hot, NULL), MOE_EMASKED);
	const int32_t cold[] = {12, 4};
	cr_assert_eq(forward_ids(&s, 2, 1, 2, cold, NULL), MOE_OK);
	free(counts);
	free(load);
	served_stop(&s);
}
