/* test_serve_limits.c — a real sidecar at the edges of its memory: budgets of fewer expert slots
 * than MoE layers (served, slower, never hung), budgets that cannot serve (refused at start with
 * the smallest that can).
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve_fixture.h"

/* One expert of the reference model in Q8_0: gate, up and down, 34 bytes per 32 weights. */
#define Q8_0_EXPERT_BYTES (3ull * REF_FFN * REF_HIDDEN / 32 * 34)

/* A budget of exactly `slots` slots: each slot holds an expert's three extents, each read as
 * its 4 KiB-aligned superset (at most two pages more), so slots × (expert + 6 pages) holds
 * `slots` slots and not one more while the expert is larger than 6 × slots pages. */
static void budget_of_slots(char *buf, size_t len, unsigned slots)
{
	snprintf(buf, len, "%llu", (unsigned long long)(slots * (Q8_0_EXPERT_BYTES + 6 * 4096)));
}

static float *rows(uint32_t n_tokens)
{
	float *p = calloc((size_t)n_tokens * REF_HIDDEN, sizeof(float));
	cr_assert_not_null(p);
	return p;
}

/* fc through the sidecar equals the oracle's immediate part bit for bit; the oracle's deferred
 * part goes to def_out (k_defer > 0). */
static void expect_exact(struct served *s, const struct fwd_case *fc, const float *deferred_in,
                         float *def_out, const char *what)
{
	const size_t n = (size_t)fc->n_tokens * REF_HIDDEN;
	float *got = rows(fc->n_tokens), *want = rows(fc->n_tokens);
	struct moe_completion done;
	int st = served_forward(s, fc, got, &done);
	cr_assert_eq(st, MOE_OK, "%s: %s (value %u index %u)", what, moe_strerror(st), done.value,
	             done.index);
	cr_assert_eq(ref_forward(s->ref, fc->layer, fc->n_tokens, fc->k, fc->k_defer, fc->x_wire,
	                         fc->in_dtype, fc->ids, fc->weights, deferred_in, want,
	                         fc->k_defer ? def_out : NULL),
	             MOE_OK);
	cr_assert_eq(memcmp(got, want, n * sizeof(float)), 0, "%s: output differs from the oracle",
	             what);
	free(got);
	free(want);
}

/* Three MoE layers on one or two slots under the default sieve+layer: layer 2's share of the
 * slots is 0 (and layer 1's with one slot). Every layer is served, alone and as a decode step
 * whose deferred expert is still held by the previous layer's wave; after the client leaves, a
 * new one is served and SIGTERM stops the sidecar cleanly. (A FORWARD of a layer with a share
 * of 0 used to wait forever, and the control thread with it once its client left.) */
Test(serve_limits, fewer_slots_than_layers_are_served)
{
	for (unsigned slots = 1; slots <= 2; slots++) {
		char budget[32];
		budget_of_slots(budget, sizeof(budget), slots);
		const char *extra[] = {"--mem-budget", budget, NULL};
		struct served s;
		served_start(&s, "q8_0", extra);
		cr_assert_eq(ref_expert_bytes(s.ref), Q8_0_EXPERT_BYTES * REF_LAYERS * REF_EXPERTS);
		const uint32_t ne = ref_n_experts(s.ref), k = ref_top_k(s.ref);
		for (int32_t layer = REF_LAYERS - 1; layer >= 0; layer--) {
			struct fwd_case fc;
			fwd_case_make(&fc, 100 + (uint64_t)layer, layer, 2, k, ne, REF_HIDDEN,
			              false);
			char what[64];
			snprintf(what, sizeof(what), "%u slot(s), layer %d alone", slots, layer);
			expect_exact(&s, &fc, NULL, NULL, what);
			fwd_case_free(&fc);
		}
		/* A decode step: each layer defers one expert into the next. */
		float *def = rows(1), *next_def = rows(1);
		for (int32_t layer = 0; layer < (int32_t)REF_LAYERS; layer++) {
			struct fwd_case fc;
			fwd_case_make(&fc, 200 + (uint64_t)layer, layer, 1, k, ne, REF_HIDDEN,
			              false);
			fc.k_defer = layer + 1 < (int32_t)REF_LAYERS ? 1 : 0;
			char what[64];
			snprintf(what, sizeof(what), "%u slot(s), decode layer %d", slots, layer);
			expect_exact(&s, &fc, layer ? def : NULL, next_def, what);
			float *t = def;
			def = next_def;
			next_def = t;
			fwd_case_free(&fc);
		}
		/* Every entry deferred, its expert resident: the deferred wave left running
		 * holds it when the next layer must wait for a slot (the only one, with one). */
		for (int32_t layer = 0; layer < 2; layer++) {
			struct fwd_case fc;
			fwd_case_make(&fc, 400 + (uint64_t)layer, layer, 1, 1, ne, REF_HIDDEN,
			              false);
			fc.ids[0] = 5 + layer;
			if (layer == 0) { /* resident first, then deferred */
				expect_exact(&s, &fc, NULL, NULL, "layer 0, expert 5");
				fc.k_defer = 1;
			}
			char what[64];
			snprintf(what, sizeof(what), "%u slot(s), layer %d all deferred", slots,
			         layer);
			expect_exact(&s, &fc, layer ? def : NULL, next_def, what);
			float *t = def;
			def = next_def;
			next_def = t;
			fwd_case_free(&fc);
		}
		free(def);
		free(next_def);
		/* The client goes; the next one is accepted and served. */
		moe_close(s.c);
		struct moe_connect_opts o = {.socket_path = s.sp.socket, .max_tokens = 64};
		cr_assert_eq(moe_connect(&o, &s.c), MOE_OK, "reconnect: %s", moe_connect_error());
		struct fwd_case fc;
		fwd_case_make(&fc, 300, REF_LAYERS - 1, 1, k, ne, REF_HIDDEN, false);
		expect_exact(&s, &fc, NULL, NULL, "after a reconnect");
		fwd_case_free(&fc);
		served_stop(&s); /* SIGTERM; asserts a clean exit */
	}
}

/* Pinned layers that leave no slot for the others cannot serve: refused at start, saying the
 * smallest budget that can. */
Test(serve_limits, a_budget_that_cannot_serve_is_refused_with_the_minimum)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char model[160], budget[32];
	snprintf(model, sizeof(model), "%s/model.gguf", sp.dir);
	cr_assert_eq(ref_generate(model, "q8_0", 7), 0);
	budget_of_slots(budget, sizeof(budget), REF_EXPERTS); /* exactly layer 0 */
	const char *argv[] = {model, "--pin-layers", "1", "--mem-budget", budget, NULL};
	int st = 0;
	cr_assert_neq(sidecar_start(&sp, argv, &st), 0, "a budget without a free slot started");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit status 0x%x", st);
	char *log = slurp(sp.log);
	cr_assert(log && strstr(log, "the other layers one more") &&
	              strstr(log, "the smallest budget that serves this policy is"),
	          "%s", log ? log : "(no log)");
	free(log);
	sidecar_cleanup(&sp);
}
