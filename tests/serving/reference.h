/* reference.h — the in-process side of the serve tests: generating small models and computing
 * what the sidecar must answer with the forward engine's oracle (forward_reference).
 *
 * Kept apart from the test files so they see plain types only, not the catalog's or the
 * engine's headers.
 */
#ifndef MOE_TEST_SERVE_REFERENCE_H
#define MOE_TEST_SERVE_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Shapes every serve test uses: small enough for 2 shared cores, rows a multiple of 256
 * so every K-quant works. */
#define REF_HIDDEN 256u
#define REF_FFN 256u
#define REF_EXPERTS 16u
#define REF_LAYERS 3u
/* The expert FFN size ref_generate writes: REF_FFN unless a test sets another first (512: the
 * K-quants' 256-row units split over two NUMA nodes). */
extern uint64_t ref_ffn;

/* Writes a qwen3-30b-a3b-shaped model in `format` ("q8_0", "q4_k", "bf16", "fp8", …) to
 * path (".gguf" → GGUF, else a safetensors directory). Returns 0 or -1 (printed). */
int ref_generate(const char *path, const char *format, uint64_t seed);
/* The same with another preset's architecture (e.g. "gpt-oss-20b": a directory path gives
 * the Hugging Face checkpoint, MXFP4 _blocks/_scales). */
int ref_generate_preset(const char *path, const char *preset, const char *format, uint64_t seed);

struct ref_engine;

/* An ALL_RESIDENT engine over the model at path (one thread). NULL on error (printed). */
struct ref_engine *ref_open(const char *path);
void ref_close(struct ref_engine *r);
uint32_t ref_n_experts(const struct ref_engine *r);
uint32_t ref_top_k(const struct ref_engine *r);
uint32_t ref_hidden(const struct ref_engine *r);
uint32_t ref_n_layers(const struct ref_engine *r);
uint64_t ref_expert_bytes(const struct ref_engine *r);

/* forward_reference: out_immediate and (k_defer > 0) out_deferred, n_tokens x hidden f32.
 * Returns the status (MOE_OK or an error). */
int ref_forward(struct ref_engine *r, int32_t layer, uint32_t n_tokens, uint32_t k,
                uint32_t k_defer, const void *x, unsigned x_dtype, const int32_t *ids,
                const float *weights, const float *deferred_in, float *out_immediate,
                float *out_deferred);

/* The file's bytes of projection proj (0 gate, 1 up, 2 down) of (block layer, expert) — GGUF
 * rows, a fused gate_up's half — malloc'd into *rows (the caller frees), with their length
 * and format. 0, or -1 (a dense layer, a layout that is not plain blocks). */
int ref_expert_rows(const struct ref_engine *r, int32_t layer, uint32_t expert, unsigned proj,
                    void **rows, size_t *bytes, uint32_t *format);
#endif
