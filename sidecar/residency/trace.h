/* trace.h — routing traces: the text format, its parser, its writer, and the synthetic
 * generator. A trace says which experts each (step, layer) routed to; the simulator replays
 * it through the live policy code (simulate.c).
 *
 * Format (plain text, UTF-8/ASCII, documented in docs/residency.md):
 *
 *   moe-trace 1 n_layers=48 n_experts=128 top_k=8
 *   # comments and blank lines are ignored
 *   0 0 17:0.31,3:0.22,90:0.12,…
 *   0 1 5,44,101
 *
 * First non-comment line: the header. Then one line per (step, layer): the decimal step, the
 * layer, and a comma-separated list of expert ids, each optionally followed by ':' and its
 * router score (a probability in [0, 1]). Fields are separated by spaces or tabs. Steps never
 * decrease; a (step, layer) has at most one line; a line holds 1..top_k distinct ids, each
 * below n_experts; layer < n_layers.
 * Either every id has a score or none does (a whole trace is scored or not).
 * A line `p LAYER IDS` (ids only, 1..TRACE_MAX_TOPK distinct ones, no scores) is a prefetch:
 * the sidecar started loading those experts of LAYER there, before the next reference line
 * (`serve --record-trace` writes one for every PREFETCH that started a load). Prefetch lines
 * are kept apart (routing_trace.prefetches), so readers of the references never see them.
 * Every line ends with '\n', the last one too: a trace cut mid-line (a writer that ran out
 * of disk) is refused with the byte offset where its last line starts, never read as a
 * shorter line.
 *
 * Ownership: a routing_trace owns its arrays; trace_free releases them.
 */
#ifndef MOE_RESIDENCY_TRACE_H
#define MOE_RESIDENCY_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"

#define TRACE_MAX_LAYERS 4096u
#define TRACE_MAX_EXPERTS 65536u
#define TRACE_MAX_TOPK 64u
#define TRACE_MAX_IDS (1u << 24) /* n_layers × n_experts */
#define TRACE_LINE_MAX 2048u     /* a line of TRACE_MAX_TOPK scored ids, with room */

struct trace_line {
	uint32_t step, layer;
	uint32_t first; /* index into ids/scores */
	uint32_t count;
};

/* A prefetch line: loads started before reference line `before_line` (n_lines: at the end). */
struct trace_prefetch {
	uint32_t before_line, layer;
	uint32_t first; /* index into pf_ids */
	uint32_t count;
};

struct routing_trace {
	uint32_t n_layers, n_experts, top_k;
	bool scored;
	uint32_t n_lines, n_refs; /* lines; expert references over all lines */
	struct trace_line *lines;
	uint32_t *ids; /* [n_refs] expert index within the layer */
	float *scores; /* [n_refs] router scores, or NULL when !scored */
	uint32_t cap_lines, cap_refs;
	/* Prefetch lines, in file order (before_line never decreases); none in a generated
	 * trace. */
	uint32_t n_prefetches, n_pf_ids;
	struct trace_prefetch *prefetches;
	uint32_t *pf_ids; /* [n_pf_ids] */
	uint32_t cap_prefetches, cap_pf_ids;
};

/* Parses a trace held in memory (need not be NUL-terminated). `name` prefixes messages
 * ("trace.txt:17: expert id 300 out of range (n_experts 256)"). trace_parse, trace_load,
 * trace_gen_preset and trace_generate return 0, or -1 with err. The writers below take no
 * record: their -EIO and -ENOSPC are statuses (the caller names the file). */
int trace_parse(const char *text, size_t len, const char *name, struct routing_trace *out,
                struct sidecar_error *err);
int trace_load(const char *path, struct routing_trace *out, struct sidecar_error *err);
int trace_write(FILE *f, const struct routing_trace *t);
/* The same format a line at a time: the header; one (step, layer) line of count ids with
 * their scores (NULL: unscored), '\n' included. trace_write_line returns the bytes written,
 * or -EIO. */
int trace_write_header(FILE *f, uint32_t n_layers, uint32_t n_experts, uint32_t top_k);
int trace_write_line(FILE *f, uint32_t step, uint32_t layer, const uint32_t *ids,
                     const float *scores, uint32_t count);
/* The same into buf (cap bytes; TRACE_LINE_MAX holds any line of at most TRACE_MAX_TOPK ids
 * with scores in [0, 1]), NUL-terminated: the length without the NUL, or -ENOSPC (buf holds
 * no whole line then). For a writer that keeps whole lines in a buffer of its own. */
int trace_format_header(char *buf, size_t cap, uint32_t n_layers, uint32_t n_experts,
                        uint32_t top_k);
int trace_format_line(char *buf, size_t cap, uint32_t step, uint32_t layer, const uint32_t *ids,
                      const float *scores, uint32_t count);
/* A prefetch line ("p LAYER IDS\n", count ≤ TRACE_MAX_TOPK): as trace_format_line. */
int trace_format_prefetch(char *buf, size_t cap, uint32_t layer, const uint32_t *ids,
                          uint32_t count);
void trace_free(struct routing_trace *t);

/* Synthetic routing. Per layer, expert popularity follows Zipf(zipf_s) over a random
 * permutation of the experts. Each of the top_k picks of a (step, layer) is, in order of
 * precedence: with probability `reuse` one of the previous token's experts at this layer;
 * with probability `layer_corr` the image of one of this token's experts at the previous
 * layer under a fixed random per-layer map (experts that co-fire across layers); otherwise a
 * fresh Zipf draw. Every `drift_period` steps (0 = never) a fraction `drift` of each layer's
 * popularity ranks is reshuffled (phase drift: the topic changes). Scores: softmax of
 * random logits, highest for the first pick. Deterministic for a given seed. */
struct trace_gen_params {
	uint32_t n_layers, n_experts, top_k, steps;
	double zipf_s, reuse, layer_corr, drift;
	uint32_t drift_period;
	uint64_t seed;
};

/* A model preset's routing shape (sidecar/model/presets.h, the names moe-gen takes: its MoE
 * layers, experts and top-k; e.g. deepseek-v3: 58 MoE layers, 256 experts, top-8) with the
 * default skew/reuse/drift below. */
int trace_gen_preset(const char *model, struct trace_gen_params *out, struct sidecar_error *err);
int trace_generate(const struct trace_gen_params *params, struct routing_trace *out,
                   struct sidecar_error *err);

#endif
