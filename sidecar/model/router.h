/* router.h — a MoE model's routers (the `ffn_gate_inp` weights of each MoE layer, GGUF), for
 * what an engine can compute itself before a layer runs: the next layer's router applied to
 * this layer's input ("pre-gating"), whose top-k are the experts to hint (PREFETCH) while this
 * layer computes. bench_decode --hints router uses it; client/python/examples/engine_decode.py
 * --router-hints does the same with torch.
 *
 * Ownership: moe_router_load allocates the weights as f32 (n_moe_layers × n_experts × hidden);
 * moe_router_free releases them. Errors: 0, or -1 with err naming the file and tensor.
 */
#ifndef MOE_MODEL_ROUTER_H
#define MOE_MODEL_ROUTER_H

#include <stdint.h>

#include "catalog.h"
#include "error.h"

struct moe_router {
	uint32_t n_layers; /* MoE layers, in model order */
	uint32_t n_experts;
	uint64_t hidden;
	float *w; /* [n_layers][n_experts][hidden] */
};

/* Reads every MoE layer's `blk.N.ffn_gate_inp.weight` (F32, F16 or BF16) from a GGUF model
 * (the first split's path, as the catalog opens it). */
int moe_router_load(const struct moe_catalog *cat, struct moe_router *out,
                    struct sidecar_error *err);
void moe_router_free(struct moe_router *r);

/* The k experts of MoE layer `moe_layer` with the highest logits w·x (ties: the lower id),
 * best first, into ids; probs (may be NULL) their softmax over the k. Returns k (at most
 * n_experts). */
uint32_t moe_router_topk(const struct moe_router *r, uint32_t moe_layer, const float *x, uint32_t k,
                         int32_t *ids, float *probs);

#endif
