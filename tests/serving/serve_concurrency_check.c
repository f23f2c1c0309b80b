/* serve_concurrency_check.c — `serve MODEL` under concurrency, as a plain program (no
 * Criterion) so that it also runs under ThreadSanitizer (Criterion cannot start there).
 *
 * A sidecar (built with the same sanitizer) serves a model at a 30% budget, so loads and
 * evictions run under the requests. Two client threads send the same FORWARD sequence
 * (deferred experts included, hints posted before each layer) and must get identical bits;
 * a third connects, submits a FORWARD and closes without waiting, in a loop (a client dying
 * with work in flight); the main thread asks STATS meanwhile. Then a last FORWARD is in flight
 * when SIGTERM arrives: it must complete (success or MOE_ESHUTDOWN) or report the sidecar gone,
 * never hang, and the sidecar must exit 0 — a race TSan finds in it makes it exit non-zero.
 * Meanwhile a fourth client switches its GPU mask with FORWARDs in flight (each FORWARD valid
 * under the mask in force when it was sent: it must succeed), the main thread also asks for
 * the per-expert counts (JSON and table), and the sidecar records the routing to a trace,
 * which must parse afterwards.
 * Exit status 0 = pass. Registered with ctest under the labels `concurrent` and `process`.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "moe_client.h"
#include "moe_kernels.h"
#include "reference.h"
#include "trace.h"

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "serve_concurrency_check: %s:%d: ", __FILE__, __LINE__);   \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define STEPS 12u
#define TOKENS 3u
#define K 6u

static struct sidecar_proc sp;
static atomic_int dying_done;

struct twin {
	float *out; /* STEPS x REF_LAYERS x TOKENS x REF_HIDDEN */
};

static void fill(struct moe_slot *s, uint32_t step, uint32_t layer)
{
	uint64_t r = ((uint64_t)step << 8 | layer) + 99;
	float *x = s->input;
	for (uint32_t i = 0; i < TOKENS * REF_HIDDEN; i++)
		x[i] = (float)((double)(test_rand(&r) >> 11) / 9007199254740992.0 - 0.5);
	for (uint32_t t = 0; t < TOKENS; t++)
		for (uint32_t j = 0; j < K; j++) {
			s->expert_ids[t * K + j] =
			    (int32_t)((t * 5 + j * 3 + step + layer) % REF_EXPERTS);
			s->expert_weights[t * K + j] = 0.1f + (float)((j * 7 + t) % 10) / 10.0f;
		}
}

static void *twin_main(void *arg)
{
	struct twin *tw = arg;
	struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = TOKENS, .n_slots = 3};
	struct moe_client *c;
	CHECK(moe_connect(&o, &c) == MOE_OK, "connect: %s", moe_connect_error());
	struct moe_slot s, hint;
	CHECK(moe_slot_acquire(c, &s) == MOE_OK && moe_slot_acquire(c, &hint) == MOE_OK, "slots");
	for (uint32_t step = 0; step < STEPS; step++)
		for (uint32_t l = 0; l < REF_LAYERS; l++) {
			if (l + 1 < REF_LAYERS) {
				for (uint32_t j = 0; j < 4; j++) {
					hint.expert_ids[j] =
					    (int32_t)((step + l + 1 + j) % REF_EXPERTS);
					hint.expert_weights[j] = 1.0f;
				}
				CHECK(moe_prefetch_post(c, &hint, (int32_t)l + 1, 4, 0) == MOE_OK,
				      "prefetch: %s", moe_last_error(c));
			}
			fill(&s, step, l);
			struct moe_completion d;
			int rc =
			    moe_forward(c, &s, (int32_t)l, TOKENS, K, l + 1 < REF_LAYERS ? 1 : 0,
			                MOEK_ACT_F32, MOEK_ACT_F32, 0, &d, 30000);
			CHECK(rc == MOE_OK, "FORWARD step %u layer %u: %s: %s", step, l,
			      moe_strerror(rc), moe_last_error(c));
			memcpy(tw->out + ((size_t)step * REF_LAYERS + l) * TOKENS * REF_HIDDEN,
			       s.output, (size_t)TOKENS * REF_HIDDEN * sizeof(float));
		}
	moe_close(c);
	return NULL;
}

/* Pipelines FORWARD (names X) · MASK (X on the GPU) · FORWARD (not X) · MASK (X back), 8
 * times: every request must succeed. */
static void *switcher_main(void *arg)
{
	(void)arg;
	struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = TOKENS, .n_slots = 4};
	struct moe_client *c;
	CHECK(moe_connect(&o, &c) == MOE_OK, "connect: %s", moe_connect_error());
	const int32_t layer = 2, X = 5;
	const size_t row = (REF_EXPERTS + 7) / 8;
	for (int round = 0; round < 8; round++) {
		struct moe_slot s[4];
		for (int i = 0; i < 4; i++)
			CHECK(moe_slot_acquire(c, &s[i]) == MOE_OK, "slot");
		for (int i = 0; i < 4; i++) {
			if (i % 2) {
				memset(s[i].input, 0, row * REF_LAYERS);
				if (i == 1)
					((uint8_t *)s[i].input)[layer * row + X / 8] = 1u
					                                               << (X % 8);
				struct moe_request r = {
				    .op = MOE_OP_MASK, .slot = s[i].index, .layer = -1};
				CHECK(moe_submit(c, &r) == MOE_OK, "submit: %s", moe_last_error(c));
				continue;
			}
			fill(&s[i], (uint32_t)round, (uint32_t)layer);
			/* X + 1 + t + j (mod 16) never meets X for t + j < 15; the first FORWARD
			 * names X in place of its first id. */
			for (uint32_t t = 0; t < TOKENS; t++)
				for (uint32_t j = 0; j < K; j++)
					s[i].expert_ids[t * K + j] =
					    i == 0 && j == 0
					        ? X
					        : (int32_t)((X + 1 + t + j) % REF_EXPERTS);
			CHECK(moe_forward_submit(c, s[i].index, layer, TOKENS, K, 0, MOEK_ACT_F32,
			                         MOEK_ACT_F32, 0) == MOE_OK,
			      "submit: %s", moe_last_error(c));
		}
		for (int i = 0; i < 4; i++) {
			struct moe_completion d;
			int rc = moe_forward_wait(c, s[i].index, &d, 30000);
			CHECK(rc == MOE_OK, "mask switch round %d request %d: %s: %s", round, i,
			      moe_strerror(rc), moe_last_error(c));
			CHECK(moe_slot_release(c, s[i].index) == MOE_OK, "release");
		}
	}
	moe_close(c);
	return NULL;
}

static void *dying_main(void *arg)
{
	(void)arg;
	for (int i = 0; i < 10; i++) {
		struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = TOKENS};
		struct moe_client *c;
		CHECK(moe_connect(&o, &c) == MOE_OK, "connect: %s", moe_connect_error());
		struct moe_slot s;
		CHECK(moe_slot_acquire(c, &s) == MOE_OK, "slot");
		fill(&s, (uint32_t)i, 0);
		struct moe_request r = {.op = 3 /* FORWARD */,
		                        .slot = s.index,
		                        .n_tokens = TOKENS,
		                        .ids_per_token = K,
		                        .layer = 0,
		                        .arg = 1};
		CHECK(moe_submit(c, &r) == MOE_OK, "submit: %s", moe_last_error(c));
		moe_close(c); /* gone with a FORWARD (and its deferred state) in flight */
	}
	atomic_store(&dying_done, 1);
	return NULL;
}

int main(void)
{
	harness_tempdir(&sp);
	char model[160], instance[64];
	snprintf(model, sizeof(model), "%s/model.gguf", sp.dir);
	snprintf(instance, sizeof(instance), "serve-concurrency-%d", (int)getpid());
	CHECK(ref_generate(model, "q8_0", 5) == 0, "generating the model");
	char trace_path[200];
	snprintf(trace_path, sizeof(trace_path), "%s/served.trace", sp.dir);
	const char *extra[] = {
	    model,    "--mem-budget",   "30%",      "--threads", "2", "--probes-instance",
	    instance, "--record-trace", trace_path, NULL};
	int st = 0;
	if (sidecar_start(&sp, extra, &st) != 0) {
		char *log = slurp(sp.log);
		fprintf(stderr, "sidecar did not start (0x%x): %s\n", st, log ? log : "");
		return 1;
	}
	const size_t n = (size_t)STEPS * REF_LAYERS * TOKENS * REF_HIDDEN;
	struct twin a = {.out = calloc(n, sizeof(float))}, b = {.out = calloc(n, sizeof(float))};
	CHECK(a.out && b.out, "out of memory");
	pthread_t ta, tb, td, tm;
	CHECK(pthread_create(&tm, NULL, switcher_main, NULL) == 0, "thread");
	CHECK(pthread_create(&ta, NULL, twin_main, &a) == 0, "thread");
	CHECK(pthread_create(&tb, NULL, twin_main, &b) == 0, "thread");
	CHECK(pthread_create(&td, NULL, dying_main, NULL) == 0, "thread");

	struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = 64, .n_slots = 2};
	struct moe_client *c;
	CHECK(moe_connect(&o, &c) == MOE_OK, "connect: %s", moe_connect_error());
	char *js = malloc(1u << 20);
	CHECK(js, "out of memory");
	uint64_t counts[REF_LAYERS * REF_EXPERTS];
	float heat[REF_LAYERS * REF_EXPERTS];
	for (int i = 0; !atomic_load(&dying_done); i++)
		CHECK((i % 3 == 0 ? moe_stats_json(c, js, 1u << 20, 30000)
		       : i % 3 == 1
		           ? moe_stats_json_flags(c, MOE_STATS_EXPERTS, js, 1u << 20, 30000)
		           : moe_expert_stats(c, counts, heat, REF_LAYERS * REF_EXPERTS, NULL,
		                              30000)) == MOE_OK,
		      "STATS: %s", moe_last_error(c));
	pthread_join(tm, NULL);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	pthread_join(td, NULL);
	CHECK(memcmp(a.out, b.out, n * sizeof(float)) == 0,
	      "two clients sending the same requests got different bits");

	/* SIGTERM with a 64-token FORWARD in flight. */
	struct moe_slot s;
	CHECK(moe_slot_acquire(c, &s) == MOE_OK, "slot");
	memset(s.input, 0, s.input_bytes);
	for (uint32_t i = 0; i < 64 * 8; i++) {
		s.expert_ids[i] = (int32_t)(i % REF_EXPERTS);
		s.expert_weights[i] = 1.0f;
	}
	struct moe_request r = {.op = 3, .slot = s.index, .n_tokens = 64, .ids_per_token = 8};
	CHECK(moe_submit(c, &r) == MOE_OK, "submit: %s", moe_last_error(c));
	kill(sp.pid, SIGTERM);
	struct moe_completion done;
	int rc = moe_wait(c, &done, 60000);
	CHECK(rc == MOE_EPEERDEAD ||
	          (rc == MOE_OK && (done.status == MOE_OK || done.status == MOE_ESHUTDOWN)),
	      "in flight at SIGTERM: %s / %s", moe_strerror(rc), moe_strerror(done.status));
	st = sidecar_stop(&sp, SIGTERM);
	moe_close(c);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		char *log = slurp(sp.log);
		fprintf(stderr, "sidecar exit status 0x%x; log:\n%s\n", st, log ? log : "");
		return 1;
	}
	struct routing_trace t;
	struct sidecar_error err = {0};
	CHECK(trace_load(trace_path, &t, &err) == 0, "recorded trace: %s", err.msg);
	CHECK(t.n_lines >= 2 * STEPS * REF_LAYERS * TOKENS, "recorded trace: %u lines", t.n_lines);
	trace_free(&t);
	sidecar_cleanup(&sp);
	free(a.out);
	free(b.out);
	free(js);
	printf("serve_concurrency_check: ok\n");
	return 0;
}
