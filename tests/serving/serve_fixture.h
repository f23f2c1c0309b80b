/* serve_fixture.h — a real `moe-sidecar serve MODEL` and a connected client, for the serve
 * tests: the model is generated into the sidecar's temp directory, the in-process reference
 * engine opens the same files, and helpers run one FORWARD through the channel and the same
 * request through the oracle.
 */
#ifndef MOE_TEST_SERVE_FIXTURE_H
#define MOE_TEST_SERVE_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "harness.h"
#include "moe_client.h"
#include "moe_proto.h"
#include "reference.h"

struct served {
	struct sidecar_proc sp;
	char model[160];
	struct moe_client *c;
	struct ref_engine *ref;
};

/* Generates a model in `format`, starts the sidecar on it with extra options (NULL-terminated,
 * may be NULL), connects a client and opens the reference. Asserts on failure. */
void served_start(struct served *s, const char *format, const char *const *extra);
/* The same for another preset; safetensors: a checkpoint directory instead of a GGUF file. */
void served_start_preset(struct served *s, const char *preset, const char *format, bool safetensors,
                         const char *const *extra);
/* Closes the client, stops the sidecar (SIGTERM; asserts a clean exit), cleans up. */
void served_stop(struct served *s);

/* A deterministic request. x is f32 n_tokens x hidden; ids n_tokens x k distinct per token
 * (with a -1 now and then when holes), weights positive and descending-free. */
struct fwd_case {
	int32_t layer;
	uint32_t n_tokens, k, k_defer;
	uint8_t in_dtype, out_dtype;
	uint16_t flags;
	float *x;     /* f32 originals */
	void *x_wire; /* x converted to in_dtype (what both sides see) */
	int32_t *ids;
	float *weights;
};
void fwd_case_make(struct fwd_case *fc, uint64_t seed, int32_t layer, uint32_t n_tokens, uint32_t k,
                   uint32_t n_experts, uint32_t hidden, bool holes);
void fwd_case_free(struct fwd_case *fc);

/* Runs fc through the sidecar on a fresh slot; the output, converted to f32, goes to out
 * (n_tokens x hidden). Returns the completion status; *done gets the completion. */
int served_forward(struct served *s, const struct fwd_case *fc, float *out,
                   struct moe_completion *done);

/* Reads the sidecar's STATS JSON into a malloc'd string (asserts). */
char *served_stats(struct served *s);
/* A top-level unsigned member of a flat JSON text ("key":N), or -1 if absent. */
int64_t json_top_u64(const char *json, const char *key);

/* VmRSS of a process in bytes, or 0. */
uint64_t proc_rss_bytes(pid_t pid);

#endif
