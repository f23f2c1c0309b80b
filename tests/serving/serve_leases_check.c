/* serve_leases_check.c — expert leases (serve --leases) under concurrency, as a plain program
 * (no Criterion) so that it also runs under ThreadSanitizer.
 *
 * A sidecar (built with the same sanitizer) serves a Q4_K model at a 30% budget with two
 * workers, so loads and evictions run under everything. Two lessee threads lease and release
 * overlapping sets of experts (each set shares two experts with the other thread's), in turn
 * in the plain form and the BF16 form (dequantized on the workers); each checks what it got —
 * the plain form's rows are the file's, the BF16 form is moek_dequantize of them — then runs
 * FORWARDs of other experts of the other layers (which make the budget evict) and checks the
 * same bytes again before releasing: a leased expert is never evicted or rewritten. Two more
 * threads send FORWARDs meanwhile. Then the sidecar must exit 0 on SIGTERM — a race TSan finds
 * in it makes it exit non-zero. All of it twice: on one pool, then on a sidecar that splits
 * each expert's rows over two synthetic NUMA nodes' pools (slices; the BF16 form from both).
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

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "serve_leases_check: %s:%d: ", __FILE__, __LINE__);        \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define ROUNDS 8u
#define SET 3u /* experts a lease names */
#define TOKENS 2u
#define K 4u

static struct sidecar_proc sp;

/* The file's rows and their BF16 form, per (layer, expert, projection). */
struct expected {
	void *rows;
	size_t bytes;
	uint16_t *bf16;
	size_t n; /* elements */
};
static struct expected want[REF_LAYERS][REF_EXPERTS][3];
static int32_t first_moe;

static void expect_load(struct ref_engine *r)
{
	for (uint32_t l = 0; l < REF_LAYERS; l++)
		for (uint32_t x = 0; x < REF_EXPERTS; x++)
			for (unsigned p = 0; p < 3; p++) {
				struct expected *e = &want[l][x][p];
				uint32_t f;
				if (ref_expert_rows(r, (int32_t)l, x, p, &e->rows, &e->bytes, &f) !=
				    0)
					continue; /* a dense layer: never leased */
				const size_t cols = p < 2 ? REF_HIDDEN : ref_ffn; /* down: ffn */
				e->n = (e->bytes / moek_row_bytes(f, cols)) * cols;
				float *tmp = malloc(e->n * sizeof(float));
				e->bf16 = malloc(e->n * sizeof(uint16_t));
				CHECK(tmp && e->bf16, "out of memory");
				CHECK(moek_dequantize(f, e->rows, NULL, e->n / cols, cols, tmp) ==
				          0,
				      "dequantize");
				moek_convert(MOE_DTYPE_BF16, e->bf16, MOE_DTYPE_F32, tmp, e->n);
				free(tmp);
			}
}

static void check_lease(struct moe_client *c, const struct moe_lease_expert *le, uint32_t n,
                        bool bf16, const char *when)
{
	const void *pool, *staging = NULL;
	size_t bytes;
	CHECK(moe_lease_pool(c, &pool, &bytes, NULL) == MOE_OK, "pool");
	if (bf16)
		CHECK(moe_lease_staging(c, &staging, &bytes, NULL) == MOE_OK, "staging");
	for (uint32_t i = 0; i < n; i++) {
		const struct moe_lease_matrix *m[3] = {&le[i].gate, &le[i].up, &le[i].down};
		for (unsigned p = 0; p < 3; p++) {
			const struct expected *e = &want[le[i].layer][le[i].expert][p];
			CHECK(e->rows, "layer %d has no file rows of expert %u", le[i].layer,
			      le[i].expert);
			if (bf16) {
				CHECK(m[p]->area == MOE_LEASE_AREA_STAGING &&
				          m[p]->bytes == e->n * 2,
				      "BF16 form's description");
				CHECK(memcmp((const uint8_t *)staging + m[p]->offset, e->bf16,
				             e->n * 2) == 0,
				      "%s: layer %d expert %u proj %u: BF16 form differs from "
				      "moek_dequantize",
				      when, le[i].layer, le[i].expert, p);
				continue;
			}
			void *got = malloc(e->bytes);
			CHECK(got && (m[p]->area == MOE_LEASE_AREA_SLICES
			                  ? moe_lease_rows(c, &le[i], m[p], got, e->bytes)
			                  : moe_lease_deinterleave(m[p], pool, got, e->bytes)) ==
			                 MOE_OK,
			      "deinterleave");
			CHECK(memcmp(got, e->rows, e->bytes) == 0,
			      "%s: layer %d expert %u proj %u: leased bytes differ from the file's",
			      when, le[i].layer, le[i].expert, p);
			free(got);
		}
	}
}

static void fill(struct moe_slot *s, uint32_t step, uint32_t layer, uint32_t avoid)
{
	uint64_t r = ((uint64_t)step << 8 | layer) + 7;
	float *x = s->input;
	for (uint32_t i = 0; i < TOKENS * REF_HIDDEN; i++)
		x[i] = (float)((double)(test_rand(&r) >> 11) / 9007199254740992.0 - 0.5);
	for (uint32_t t = 0; t < TOKENS; t++)
		for (uint32_t j = 0; j < K; j++) {
			s->expert_ids[t * K + j] =
			    (int32_t)((avoid + SET + 1 + t * K + j + step) % REF_EXPERTS);
			s->expert_weights[t * K + j] = 0.25f;
		}
}

static void forward_some(struct moe_client *c, struct moe_slot *s, uint32_t step,
                         int32_t skip_layer, uint32_t avoid)
{
	for (uint32_t l = 0; l < REF_LAYERS; l++) {
		if ((int32_t)l == skip_layer)
			continue;
		fill(s, step, l, avoid);
		struct moe_completion d;
		const int rc = moe_forward(c, s, (int32_t)l, TOKENS, K, 0, MOEK_ACT_F32,
		                           MOEK_ACT_F32, 0, &d, 30000);
		CHECK(rc == MOE_OK, "FORWARD layer %u: %s: %s", l, moe_strerror(rc),
		      moe_last_error(c));
	}
}

/* The first `"key":` number of the STATS document. -1: absent. */
static long long stat_of(const char *js, const char *key)
{
	char k[64];
	snprintf(k, sizeof(k), "\"%s\":", key);
	const char *at = strstr(js, k);
	return at ? strtoll(at + strlen(k), NULL, 10) : -1;
}

struct lessee {
	uint32_t offset; /* first expert of round 0's set */
};

static void *lessee_main(void *arg)
{
	const struct lessee *me = arg;
	struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = TOKENS, .n_slots = 2};
	struct moe_client *c;
	CHECK(moe_connect(&o, &c) == MOE_OK, "connect: %s", moe_connect_error());
	struct moe_slot s;
	CHECK(moe_slot_acquire(c, &s) == MOE_OK, "slot");
	for (uint32_t r = 0; r < ROUNDS; r++) {
		const int32_t layer = first_moe + (int32_t)(r % (REF_LAYERS - (uint32_t)first_moe));
		const uint32_t base = (me->offset + r) % REF_EXPERTS;
		int32_t xs[SET];
		for (uint32_t i = 0; i < SET; i++)
			xs[i] = (int32_t)((base + i) % REF_EXPERTS);
		const bool bf16 = r % 2 == 1;
		struct moe_lease_expert le[SET];
		const int rc = moe_lease(c, layer, xs, SET, bf16 ? MOE_LEASE_BF16 : 0, le, 30000);
		CHECK(rc == MOE_OK, "LEASE layer %d round %u: %s: %s", layer, r, moe_strerror(rc),
		      moe_last_error(c));
		check_lease(c, le, SET, bf16, "at the lease");
		forward_some(c, &s, r, layer, base);
		check_lease(c, le, SET, bf16, "after FORWARDs under the budget");
		CHECK(moe_lease_release(c, NULL, 0, 5000) == MOE_OK, "RELEASE: %s",
		      moe_last_error(c));
	}
	moe_close(c);
	return NULL;
}

static void *forwarder_main(void *arg)
{
	(void)arg;
	struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = TOKENS, .n_slots = 2};
	struct moe_client *c;
	CHECK(moe_connect(&o, &c) == MOE_OK, "connect: %s", moe_connect_error());
	struct moe_slot s;
	CHECK(moe_slot_acquire(c, &s) == MOE_OK, "slot");
	for (uint32_t r = 0; r < ROUNDS; r++)
		forward_some(c, &s, r * 3 + 1, -1, r * 5);
	moe_close(c);
	return NULL;
}

static int run(bool split)
{
	memset(want, 0, sizeof(want));
	ref_ffn = split ? 512 : REF_FFN; /* Q4_K's 256-row units: one per node */
	harness_tempdir(&sp);
	char model[160], instance[64];
	snprintf(model, sizeof(model), "%s/model.gguf", sp.dir);
	snprintf(instance, sizeof(instance), "serve-leases-%d", (int)getpid());
	CHECK(ref_generate(model, "q4_k", 11) == 0, "generating the model");
	struct ref_engine *ref = ref_open(model);
	CHECK(ref, "reference engine");
	expect_load(ref);
	ref_close(ref);
	const char *extra[] = {model,
	                       "--leases",
	                       "--mem-budget",
	                       "30%",
	                       "--threads",
	                       "2",
	                       "--probes-instance",
	                       instance,
	                       "--lease-staging-mib",
	                       "8",
	                       split ? "--numa" : NULL,
	                       "synthetic:pack:1 numa:2 core:1 pu:1",
	                       NULL};
	int st = 0;
	if (sidecar_start(&sp, extra, &st) != 0) {
		char *log = slurp(sp.log);
		fprintf(stderr, "sidecar did not start (0x%x): %s\n", st, log ? log : "");
		return 1;
	}
	{
		struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = TOKENS};
		struct moe_client *c;
		CHECK(moe_connect(&o, &c) == MOE_OK, "connect: %s", moe_connect_error());
		first_moe = (int32_t)moe_info(c)->first_moe_layer;
		CHECK(moe_lease_pool_count(c) == (split ? 2u : 1u), "%u pools",
		      moe_lease_pool_count(c));
		moe_close(c);
	}
	/* Sets {r..r+2} and {r+1..r+3}: two experts in common each round. */
	struct lessee a = {.offset = 0}, b = {.offset = 1};
	pthread_t ta, tb, tf, tg;
	CHECK(pthread_create(&ta, NULL, lessee_main, &a) == 0, "thread");
	CHECK(pthread_create(&tb, NULL, lessee_main, &b) == 0, "thread");
	CHECK(pthread_create(&tf, NULL, forwarder_main, NULL) == 0, "thread");
	CHECK(pthread_create(&tg, NULL, forwarder_main, NULL) == 0, "thread");
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	pthread_join(tf, NULL);
	pthread_join(tg, NULL);
	{ /* the budget did evict meanwhile, and every lease went back */
		struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = 64};
		struct moe_client *c;
		CHECK(moe_connect(&o, &c) == MOE_OK, "connect: %s", moe_connect_error());
		char *js = malloc(1u << 20);
		CHECK(js && moe_stats_json(c, js, 1u << 20, 30000) == MOE_OK, "STATS: %s",
		      moe_last_error(c));
		CHECK(stat_of(js, "evictions") > 0, "no eviction under the budget: %s", js);
		CHECK(stat_of(js, "leases") == 4 * ROUNDS * SET / 2, "leases counted: %lld of %u",
		      stat_of(js, "leases"), 4 * ROUNDS * SET / 2);
		CHECK(stat_of(js, "leases_held") == 0, "leases still held: %s", js);
		free(js);
		moe_close(c);
	}
	st = sidecar_stop(&sp, SIGTERM);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		char *log = slurp(sp.log);
		fprintf(stderr, "sidecar exit status 0x%x; log:\n%s\n", st, log ? log : "");
		return 1;
	}
	sidecar_cleanup(&sp);
	for (uint32_t l = 0; l < REF_LAYERS; l++)
		for (uint32_t x = 0; x < REF_EXPERTS; x++)
			for (unsigned p = 0; p < 3; p++) {
				free(want[l][x][p].rows);
				free(want[l][x][p].bf16);
			}
	printf("serve_leases_check: ok (%s)\n", split ? "split over 2 nodes" : "one pool");
	return 0;
}

int main(void)
{
	return run(false) || run(true);
}
