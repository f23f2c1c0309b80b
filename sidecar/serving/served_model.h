/* served_model.h — the model `serve MODEL` serves: catalog, eBPF probes and forward engine.
 *
 * Owns: opening the catalog, sizing the memory budget, attaching the page-cache probes to the
 * model files, creating the forward engine (sidecar/forward/forward.h) with its worker pools,
 * and the STATS JSON document. The forward queue (forward_queue.c) runs requests on the
 * engine itself (serve_model_engine); this file holds what is about the model as a whole.
 *
 * Threading: open/close on the control thread; the engine's calls follow forward.h;
 * serve_model_collect and serve_model_stats_json from one thread at a time (they own the
 * probes handle: the dispatcher, which executes STATS and publishes the metrics).
 */
#ifndef MOE_SIDECAR_SERVED_MODEL_H
#define MOE_SIDECAR_SERVED_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "forward.h"
#include "json_writer.h"
#include "moe_abi.h"
#include "stats_doc.h"
#include "trace_recorder.h"

struct moe_catalog;

/* --max-tokens when not given: the request buffers every engine is sized for. */
#define SERVE_MODEL_DEFAULT_MAX_TOKENS 256u

struct serve_model_config {
	const char *path; /* .gguf, .safetensors or a checkpoint directory */
	/* Expert budget: mem_budget_bytes if non-zero, else mem_budget_percent of the expert
	 * bytes if non-zero, else (auto) every expert when that fits in 3/4 of the memory limit,
	 * else what fits. A budget above mem_total (MemTotal; 0: unknown) is refused. */
	uint64_t mem_budget_bytes;
	double mem_budget_percent;
	uint64_t mem_total;
	/* The memory the whole sidecar may use (0: no limit): the engine's request buffers and
	 * slot pools must fit in it less mem_base (what the process used before the model), and
	 * a default budget takes at most 3/4 of that, leaving the rest to channels. mem_limit_from
	 * says where the figure came from (logs, refusals). */
	uint64_t mem_limit, mem_base;
	const char *mem_limit_from;
	const char *numa;     /* "auto", "0,1", or "synthetic:<hwloc synthetic spec>" */
	uint32_t threads;     /* per node; 0 = the node's cores */
	uint32_t pin_layers;  /* first N MoE layers always resident */
	const char *policy;   /* residency policy spec; NULL = the engine's default */
	uint32_t max_tokens;  /* per request */
	uint32_t max_top_k;   /* ids per token; 0 = the model's top_k */
	bool no_direct;       /* buffered reads */
	bool pool_pages_auto; /* --pool-pages auto (forward_config) */
	bool file_layout;     /* the files' rows, not the decode layout (forward_config) */
	bool leases;          /* a shareable slot pool: LEASE is served (forward_config) */
	bool require_probes;  /* probes unavailable = fatal */
	const char *probes_instance;
	/* FAILED experts: first backoff and its cap in ms (0 = defaults, 1 s and 60 s), or none
	 * at all (every demand retries). */
	uint32_t retry_backoff_ms, retry_backoff_max_ms;
	bool retry_without_backoff;
	/* Told what the warm-up is doing, as a sentence ("reading experts: 120 of 512, 23%"),
	 * at each step and each whole percent: what a client connecting meanwhile is told, and
	 * the service manager's STATUS. Called on the thread running serve_model_open. NULL:
	 * nobody asks. */
	void (*status)(void *arg, const char *sentence);
	void *status_arg;
#ifdef MOE_TEST_HOOKS
	/* The test-hooks daemon only (--debug-fail-expert): the reads of this (layer, expert) fail
	 * with EIO (layer -1: none) — in its first fail_loads loads, or every one when fail_loads
	 * is 0. Only serve.c and serve_model.c, built alike, see this struct. */
	int32_t fail_layer, fail_expert;
	uint32_t fail_loads;
	/* --debug-hold-populate: every pool's populate thread waits for end-of-file on
	 * hold_populate_fd before its first group (READY comes with no group populated) */
	bool hold_populate;
	int hold_populate_fd;
#endif
};

/* What is served, in wire-neutral types. */
struct serve_model_desc {
	uint32_t n_layers, n_moe_layers, first_moe_layer, last_moe_layer;
	uint32_t n_experts, top_k, hidden, expert_ffn;
	/* The experts' activation: gpt-oss's clamped SwiGLU (limit, alpha), or 0, 0 for plain
	 * SwiGLU. STATS reports it so an engine can check its own against it. */
	float swiglu_limit, swiglu_alpha;
	/* Llama-4: the routing weight scales the expert's input, not its output (the engine
	 * passes the router score as the weight either way; STATS says which is applied). */
	bool weight_on_input;
	uint32_t max_tokens, max_top_k; /* request limits the engine was sized for */
	uint64_t expert_bytes, budget_bytes;
	/* Memory: the limit (0: none) and where it came from; what the process holds once the
	 * model is open (its resident set, the slot pools included, plus the request buffers,
	 * counted whole). Channels must fit in what is left (model_ops). */
	uint64_t mem_limit_bytes, mem_fixed_bytes;
	char mem_limit_from[64];
	uint32_t n_nodes;
	char name[64];
	uint8_t fingerprint[MOE_FINGERPRINT_BYTES]; /* moe_fingerprint_path of the model path */
	char fingerprint_hex[33];
	uint8_t moe_layers[MOE_LAYER_BITMAP_LAYERS / 8]; /* bit l: block l is an MoE layer */
};

struct serve_model;

/* Checks everything in cfg that needs no model (--numa against this machine's topology,
 * --policy, --probes-instance), so that a start-up refuses them before reading the model.
 * 0, or -1 with err ("--numa 7: none of the listed nodes exists on this machine"). */
int serve_model_check_config(const struct serve_model_config *cfg, struct sidecar_error *err);

/* The expert budget serve_model_open would give cat under cfg (the budget rule of
 * served_model.c and forward_create's), planned without creating the engine: no slot is
 * allocated and no expert read. For `doctor`. */
struct serve_model_budget {
	uint64_t expert_bytes; /* the catalog's bytes of every routed expert */
	uint64_t asked_bytes;  /* what cfg asks for (expert_bytes: auto) */
	const char *from;      /* the rule that asked it ("--mem-budget", auto's sentence) */
	uint64_t engine_bytes; /* what the memory limit leaves the engine (0: none, or no limit) */
	struct forward_budget engine; /* what the engine would take of it */
};
/* 0, or -1 with err: what serve_model_open would refuse for the budget (a --mem-budget above
 * MemTotal, one the limit cannot hold, request buffers above the limit). */
int serve_model_plan_budget(const struct serve_model_config *cfg, const struct moe_catalog *cat,
                            struct serve_model_budget *out, struct sidecar_error *err);

/* Opens everything; logs progress while warming. Returns 0, or -1 with err naming what went
 * wrong ("model.gguf: tensor blk.3.ffn_up_exps: offset beyond end of file"). */
int serve_model_open(const struct serve_model_config *cfg, struct serve_model **out,
                     struct sidecar_error *err);
/* Destroys the engine, detaches the probes, closes the catalog. No call may be running. */
void serve_model_close(struct serve_model *m);

const struct serve_model_desc *serve_model_desc(const struct serve_model *m);
/* True if layer is a transformer block with routed experts. */
bool serve_model_is_moe_layer(const struct serve_model *m, int32_t layer);
/* The next MoE block after layer, or -1 if layer is the last. */
int32_t serve_model_next_moe_layer(const struct serve_model *m, int32_t layer);

/* The forward engine serving the model (forward.h): FORWARDs, hints, masks, clients. The
 * model owns it; it lives until serve_model_close. */
struct forward_engine *serve_model_engine(struct serve_model *m);

#define SERVE_MODEL_MAX_CLIENTS 64u

/* What the STATS figures take from outside the model (stats_table.h's `x`): clients
 * attached now, FORWARDs the dispatcher ran itself, the channels' accounted memory, log
 * lines lost, GPU mask switches and masked experts, the heat's half-life, and the trace
 * recorder's counters (NULL: not recording). */
struct stats_sources {
	uint64_t clients, forwards_inline, channel_bytes, log_lines_dropped;
	uint64_t mask_switches, masked_experts, heat_half_life;
	uint64_t leases_taken, leases_cold, leases_released, leases_refused, lease_bytes_taken;
	uint64_t leases_held, lease_bytes_held;
	const struct trace_recorder_stats *trace;
};

/* Every STATS figure now, into d (stats_doc_init'ed for the model's MoE layers): the rows of
 * stats_table.h, evaluated. Layers with no request are left out. */
void serve_model_collect(struct serve_model *m, const struct stats_sources *x, struct stats_doc *d);

/* Writes the STATS members of d, with the model's own (activation, the probes' state), into
 * w's open object (the caller adds its own and closes it). */
void serve_model_stats_json(struct serve_model *m, const struct stats_doc *d,
                            struct json_writer *w);

#endif
