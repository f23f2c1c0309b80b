/* stats_doc.h — the STATS figures as one value set, and the forms it takes.
 *
 * Owns: struct stats_doc (every figure of stats_table.h, per node and per layer, with the
 * latency histograms), its writers — the STATS JSON members, the `moe-sidecar stats` figure
 * columns, the Prometheus text exposition (format 0.0.4) — its parser from a STATS reply,
 * and the board that hands a document from the dispatcher to the metrics thread.
 *
 * The writers and the parser are generated from the table, so every figure appears in every
 * form under the names the table gives it; test_stats_table checks that they agree.
 *
 * Threading: a document belongs to its caller. The board: one publisher (the dispatcher,
 * which owns the STATS figures), any number of readers; neither waits for the other and
 * neither takes a lock (a sequence counter; every word moves through an atomic).
 * Errors: stats_doc_parse_json returns -1 with err naming the key.
 */
#ifndef MOE_SIDECAR_STATS_DOC_H
#define MOE_SIDECAR_STATS_DOC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"
#include "forward.h"
#include "json.h"
#include "json_writer.h"
#include "stats_table.h"

enum stats_kind { STATS_COUNTER, STATS_GAUGE };
enum stats_type { STATS_U64, STATS_F64, STATS_BOOL };
enum stats_unit { STATS_NONE, STATS_BYTES, STATS_RATIO };
/* Presence groups (bits of stats_doc.groups). */
enum { STATS_ALWAYS = 1u, STATS_PROBES = 2u, STATS_TRACE = 4u };

#define STATS_ID(key, ...) STATS_G_##key,
enum stats_global_id { STATS_GLOBAL_FIGURES(STATS_ID) STATS_GLOBAL_COUNT };
#undef STATS_ID
#define STATS_ID(key, ...) STATS_N_##key,
enum stats_node_id { STATS_NODE_FIGURES(STATS_ID) STATS_NODE_COUNT };
#undef STATS_ID
#define STATS_ID(key, ...) STATS_L_##key,
enum stats_layer_id { STATS_LAYER_FIGURES(STATS_ID) STATS_LAYER_COUNT };
#undef STATS_ID
#define STATS_ID(key, ...) STATS_H_##key,
enum stats_latency_id { STATS_LATENCIES(STATS_ID) STATS_LATENCY_COUNT };
#undef STATS_ID

/* One row of the table, as the writers read it. */
struct stats_figure {
	const char *key;    /* STATS JSON key */
	const char *prom;   /* moe_sidecar_<prom>[_total] */
	const char *column; /* the `stats` column header (node and layer tables) */
	const char *help;
	enum stats_kind kind;
	enum stats_type type;
	enum stats_unit unit;
	unsigned group;
};
struct stats_latency_desc {
	const char *key, *prom, *column, *help;
	unsigned index; /* enum forward_lat */
};
extern const struct stats_figure stats_global_figures[STATS_GLOBAL_COUNT];
extern const struct stats_figure stats_node_figures[STATS_NODE_COUNT];
extern const struct stats_figure stats_layer_figures[STATS_LAYER_COUNT];
extern const struct stats_latency_desc stats_latencies[STATS_LATENCY_COUNT];
/* Upper bounds of the exported histogram buckets, in seconds: 2^k µs (forward.h). */
double stats_bucket_le_seconds(unsigned k);

struct stats_node {
	uint64_t node, os_index;
	uint64_t v[STATS_NODE_COUNT];
};
struct stats_layer {
	uint64_t layer; /* transformer block */
	uint64_t v[STATS_LAYER_COUNT];
	struct forward_latency lat[STATS_LATENCY_COUNT]; /* by stats_latency_id */
};

/* Everything above `layers` is plain 8-byte words (the board copies them so). F64 figures
 * hold their double's bits (stats_doc_f64), BOOL ones 0 or 1. */
struct stats_doc {
	char model[64];
	char fingerprint[40];
	uint64_t groups; /* STATS_ALWAYS | what else is present */
	uint64_t g[STATS_GLOBAL_COUNT];
	uint64_t n_nodes;
	struct stats_node nodes[FORWARD_MAX_NODES];
	uint64_t n_layers; /* layers with at least one request, in layers[] */
	/* Not copied by the board: the caller's array of cap_layers entries. */
	struct stats_layer *layers;
	uint32_t cap_layers;
};

double stats_doc_f64(uint64_t bits);
uint64_t stats_doc_f64_bits(double v);

/* Allocates a document for up to cap_layers layers; -1 (ENOMEM) with err filled. */
int stats_doc_init(struct stats_doc *d, uint32_t cap_layers, struct sidecar_error *err);
void stats_doc_free(struct stats_doc *d);

/* The STATS members: "model", "fingerprint", every present figure, "nodes" and "layers"
 * (each layer with its latency objects {"p50","p99","count","sum","buckets"}, buckets
 * cumulative at stats_bucket_le_seconds), into w's open object. */
void stats_doc_write_json(const struct stats_doc *d, struct json_writer *w);
/* Reads a STATS reply's members into d (initialized here; stats_doc_free it, also on
 * failure). A group is present when its first figure is; then all of its figures must be. */
int stats_doc_parse_json(const struct json_doc *jd, json_ref root, struct stats_doc *d,
                         struct sidecar_error *err);
/* The Prometheus text exposition (format 0.0.4): every present figure, node and layer
 * figures labelled, the latency histograms per layer, and moe_sidecar_model_info. */
void stats_doc_write_prometheus(const struct stats_doc *d, FILE *f);
/* The `stats` figure columns: every present global figure as "key value" pairs, then the
 * node table and the layer table (one column per figure, p50/p99 per latency in µs). With
 * before (a sample interval_s earlier), counters are shown as rates per second. */
void stats_doc_write_text(const struct stats_doc *d, const struct stats_doc *before,
                          double interval_s, FILE *f);

/* ---- The board: the dispatcher publishes on request, the metrics thread reads. ---- */
struct stats_board;
int stats_board_create(uint32_t cap_layers, struct stats_board **out, struct sidecar_error *err);
void stats_board_destroy(struct stats_board *b);
/* Reader: asks for a fresh document; returns the ticket stats_board_fresh waits for. */
uint64_t stats_board_ask(struct stats_board *b);
/* Reader: whether a document at least as new as the ticket was published. */
bool stats_board_fresh(const struct stats_board *b, uint64_t ticket);
/* Publisher: whether a reader asked since the last publication. */
bool stats_board_wanted(const struct stats_board *b);
/* Publisher: publishes d (its layers up to the board's capacity). */
void stats_board_publish(struct stats_board *b, const struct stats_doc *d);
/* Reader: the last document published (false: none yet). out: stats_doc_init'ed with at
 * least the board's capacity. */
bool stats_board_read(const struct stats_board *b, struct stats_doc *out);
uint32_t stats_board_capacity(const struct stats_board *b);

#endif
