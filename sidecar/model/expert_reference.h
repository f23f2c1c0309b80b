/* expert_reference.h — one routed expert computed in fp64 from the model file's bytes, and the
 * accuracy the served path promises against it (docs/formats.md, "Accuracy").
 *
 * The reference is independent of the serving path on purpose: it reads an expert's extents
 * with pread (no residency, no decode layout, no mapping), brings each projection to its
 * kernel format with the converters the format owns (Hugging Face MXFP4 blocks/scales to GGUF
 * blocks, INT4 checkpoints repacked to INT4_G32), dequantizes every row with the kernels'
 * scalar reference dequantizer (moek_dequantize: formats.c, never a SIMD path), splits a fused
 * gate_up by the catalog's row order, and computes in double
 *   out[t] += w[t] · (down · act(gate · x[t] + b_g, up · x[t] + b_u) + b_d)
 * with the model's activation: SwiGLU, or gpt-oss's clamped variant when the catalog has a
 * swiglu_limit (alpha MOEK_SWIGLU_OAI_ALPHA), biases where the experts carry them.
 *
 * Owns: one descriptor per catalog file and the dequantized weights of the expert loaded
 * last (f32: every dequantizer's output is exact in f32; products and sums are double).
 * Errors: -1 with err (MOE_EIO naming file and offset, MOE_EINVAL naming layer, expert and
 * projection). Threading: one thread per handle; the catalog must outlive it.
 */
#ifndef MOE_MODEL_EXPERT_REFERENCE_H
#define MOE_MODEL_EXPERT_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "error.h"

struct expert_reference;

int expert_reference_open(const struct moe_catalog *cat, struct expert_reference **out,
                          struct sidecar_error *err);
void expert_reference_close(struct expert_reference *r);

/* Reads and dequantizes expert `expert` of transformer block `layer` (replacing the one loaded
 * before). 0, or -1 with err (a dense block, an id out of range, a short read, a layout the
 * reference cannot convert). */
int expert_reference_load(struct expert_reference *r, uint32_t layer, uint32_t expert,
                          struct sidecar_error *err);

/* The loaded expert on n tokens: x is n x hidden f32, out n x hidden double, overwritten
 * with the unweighted expert output (down · act(…) + b_d) of each token. */
void expert_reference_run(const struct expert_reference *r, const float *x, size_t n, double *out);

/* ---- Accuracy the served path promises ---------------------------------------------------
 * Bounds on NMSE = Σ (served − reference)² / Σ reference² of an expert FFN output, per weight
 * format and kernel path, derived from what the tests enforce: tests/kernels (each ISA's path
 * against the scalar reference, which matches a double FFN over the same weights to 1e-10)
 * plus tests/forward (the engine's decode layout against the file's rows), for the NMSE of
 * 16 tokens or more taken together. One table, expert_reference.c; docs/formats.md
 * "Accuracy" prints it. */
enum expert_path {
	EXPERT_PATH_DECODE,  /* 1 token: row dot products */
	EXPERT_PATH_BATCHED, /* 2..15 tokens: dots and interleaved group dots */
	EXPERT_PATH_PREFILL, /* 16 tokens and more: dequantized tiles (f32 or bf16) */
	EXPERT_PATH_COUNT
};
enum expert_path expert_path_of(size_t n_tokens);
const char *expert_path_name(enum expert_path p);
/* The bound for weights in `format` (enum moek_format) on path p; 0 for a format without one
 * (not a weight format). An expert whose gate/up and down differ is held to the looser of the
 * two (expert_reference_bound). */
double expert_format_bound(uint32_t format, enum expert_path p);
double expert_reference_bound(const struct moe_expert *x, enum expert_path p);

#endif
