/* fixture.h — forward-engine test fixture: a generated model (libmoe_gen) in a temporary
 * directory, its catalog, deterministic requests, and bit comparison helpers. Used by the
 * Criterion suite and by the plain (TSan-capable) thread program. */
#ifndef MOE_TESTS_FORWARD_FIXTURE_H
#define MOE_TESTS_FORWARD_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "forward.h"
#include "moe_gen.h"
#include "oracle.h"

struct fwd_model {
	char dir[64];
	char path[128];
	struct moe_catalog *cat;
};

struct fwd_model_spec {
	const char *preset;
	uint32_t format;
	bool gguf;
	uint32_t layers, experts;
	uint64_t hidden, ffn;
	bool fused_gate_up;
	enum moe_gen_mix mix;   /* a K-quant mix instead of `format` (GGUF) */
	enum moe_gen_int4 int4; /* format MOEK_INT4_G32: the checkpoint encoding */
	uint32_t group;         /* its group size (0: the generator's default) */
};

/* Writes and opens the model; returns 0 or -1 with err. */
int fwd_model_make(struct fwd_model *m, const struct fwd_model_spec *spec, char *err,
                   size_t err_len);
void fwd_model_free(struct fwd_model *m);

/* A request with its own buffers: f32 activations in [-1, 1), k distinct ids per token (some
 * -1 when holes is set), positive weights; deterministic from seed. */
struct fwd_req {
	struct forward_request q;
	void *x;
	int32_t *ids;
	float *weights;
	float *out, *out_def, *ref, *ref_def;
};
void fwd_req_make(struct fwd_req *r, const struct moe_catalog *cat, int32_t layer,
                  uint32_t n_tokens, uint32_t k, uint32_t k_defer, unsigned x_dtype, uint64_t seed,
                  bool holes);
void fwd_req_free(struct fwd_req *r);

/* Transformer block index of MoE layer i. */
int32_t fwd_moe_block(const struct moe_catalog *cat, uint32_t i);

/* Index of the first differing float (bit compare) or -1. */
long fwd_first_diff(const float *a, const float *b, size_t n);

uint64_t fwd_rss_bytes(void);

/* The I/O-failure replay: 24 requests of 2 ids per token alternating MoE layers 0 and 1
 * (1 + i % tokens_mod tokens, seeds seed + i) through `e`, whose loads of layer 1 expert 3
 * fail. Those naming it must fail with MOE_EIO naming expert 3; every other one must equal
 * `ok`'s output bit for bit. Counts both kinds; returns 0, or -1 with the first violation in
 * why. */
int fwd_replay_expert3_failure(struct forward_engine *e, struct forward_engine *ok,
                               const struct moe_catalog *cat, uint32_t tokens_mod, uint64_t seed,
                               uint32_t *failed, uint32_t *passed, char *why, size_t why_len);

#endif
