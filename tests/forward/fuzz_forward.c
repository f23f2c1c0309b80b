/* fuzz_forward.c — libFuzzer over forward_run: every field of a request (layer, token count,
 * ids per token, k_defer, dtype, client, ids, weights, activations) from fuzz bytes, against a
 * small generated model with the residency source. The engine must answer every request with
 * a known status and a message on error, and a valid request must equal the reference bit for
 * bit. With early delivery (a flag bit), the callback runs exactly once on success, and the
 * immediate output it sees then is already the final one. The model is generated once, in
 * LLVMFuzzerInitialize. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "moe_abi.h"
#include "moe_kernels.h"

/* The record of the last engine call that failed (forward.h). */
static struct sidecar_error ferr;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_TOKENS 4u
#define MAX_K 4u
#define HEADER 8u
#define BUF_ENTRIES (255u * 255u)

static struct fwd_model model;
static struct forward_engine *engine;
static int32_t *ids;
static float *weights, *out, *out_def, *ref, *ref_def, *seen;
static uint8_t *x;

/* Early delivery: what the callback saw. */
static struct {
	unsigned calls;
	size_t n;
} delivered;

static void on_immediate(void *arg, const struct forward_result *res)
{
	(void)res;
	delivered.calls++;
	memcpy(seen, arg, delivered.n * sizeof(float));
}

static void cleanup(void)
{
	forward_destroy(engine);
	fwd_model_free(&model);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	char err[256];
	struct fwd_model_spec spec = {"qwen3-30b-a3b", MOEK_Q8_0, true, 2, 8, 64, 64, false};
	if (fwd_model_make(&model, &spec, err, sizeof(err)) != 0) {
		fprintf(stderr, "fuzz_forward: model: %s\n", err);
		abort();
	}
	struct forward_config cfg = {
	    .source = FORWARD_SOURCE_RESIDENCY,
	    .mem_budget = model.cat->expert_bytes_total / 3,
	    .threads_per_node = 1,
	    .max_tokens = MAX_TOKENS,
	    .max_ids_per_token = MAX_K,
	};
	if (forward_create(&engine, model.cat, &cfg, &ferr) != 0) {
		fprintf(stderr, "fuzz_forward: engine: %s\n", ferr.msg);
		abort();
	}
	atexit(cleanup);
	ids = calloc(BUF_ENTRIES, sizeof(int32_t));
	weights = calloc(BUF_ENTRIES, sizeof(float));
	x = calloc(255u * 64u, sizeof(float));
	out = calloc(255u * 64u, sizeof(float));
	out_def = calloc(255u * 64u, sizeof(float));
	ref = calloc(255u * 64u, sizeof(float));
	ref_def = calloc(255u * 64u, sizeof(float));
	seen = calloc(255u * 64u, sizeof(float));
	if (!ids || !weights || !x || !out || !out_def || !ref || !ref_def || !seen)
		abort();
	return 0;
}

/* Fills dst with `n` bytes taken cyclically from src (or zeros when src is empty). */
static void fill(void *dst, size_t n, const uint8_t *src, size_t len, size_t *at)
{
	uint8_t *d = dst;
	for (size_t i = 0; i < n; i++)
		d[i] = len ? src[(*at)++ % len] : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < HEADER)
		return 0;
	struct forward_request q = {
	    .layer = (int8_t)data[0],
	    .n_tokens = data[1] % 8u,
	    .k = data[2] % 8u,
	    .k_defer = data[3] % 4u,
	    .x_dtype = data[4] % 4u,
	    .client = data[5] % 70u,
	    .ids = ids,
	    .weights = weights,
	    .x = x,
	};
	const bool small_ids = data[6] & 1, tame = data[6] & 2, early = data[6] & 4;
	if (early) {
		q.immediate_ready = on_immediate;
		q.immediate_arg = out;
	}
	delivered.calls = 0;
	delivered.n = (size_t)q.n_tokens * 64;
	const uint8_t *rest = data + HEADER;
	const size_t len = size - HEADER;
	size_t at = 0;
	const size_t entries = (size_t)q.n_tokens * q.k;
	fill(ids, entries * sizeof(int32_t), rest, len, &at);
	fill(weights, entries * sizeof(float), rest, len, &at);
	fill(x, (size_t)q.n_tokens * 64 * 4, rest, len, &at);
	if (small_ids) /* mostly valid ids, so the compute path is reached too */
		for (size_t i = 0; i < entries; i++)
			ids[i] = (int32_t)((uint32_t)ids[i] % 10u) - 1;
	if (tame) { /* finite weights and activations */
		for (size_t i = 0; i < entries; i++)
			weights[i] = (float)(((uint32_t *)weights)[i] % 1000u) / 1000.0f;
		for (size_t i = 0; i < (size_t)q.n_tokens * 64 * 2; i++)
			((uint16_t *)x)[i] &= 0xbfffu; /* clear the top exponent bit: finite */
	}
	struct forward_result res;
	int rc = forward_run(engine, &q, out, out_def, &res);
	if (rc != res.status || rc > 0 || strcmp(moe_status_str(rc), "unknown status") == 0)
		abort();
	if (delivered.calls != (res.immediate_delivered ? 1u : 0u) || (!early && delivered.calls))
		abort();
	if (rc != MOE_OK) {
		if (res.message[0] == 0 || memchr(res.message, 0, sizeof(res.message)) == NULL)
			abort();
		return 0;
	}
	if (early && (delivered.calls != 1 || fwd_first_diff(seen, out, delivered.n) >= 0))
		abort();
	struct forward_result rr;
	if (forward_reference(engine, &q, ref, ref_def, &rr) != MOE_OK)
		abort();
	const size_t n = (size_t)q.n_tokens * 64;
	if (fwd_first_diff(out, ref, n) >= 0 ||
	    (q.k_defer && fwd_first_diff(out_def, ref_def, n) >= 0))
		abort();
	return 0;
}
