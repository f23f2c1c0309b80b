/* stats_doc.c — the forms of the STATS figures, generated from stats_table.h (see
 * stats_doc.h for the contract). */
#include "stats_doc.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- The table, as data ------------------------------------------------------------------ */

#define GLOBAL_ROW(key, kind, type, group, prom, unit, help, src)                                  \
	{#key, prom, #key, help, STATS_##kind, STATS_##type, STATS_##unit, STATS_##group},
const struct stats_figure stats_global_figures[STATS_GLOBAL_COUNT] = {
    STATS_GLOBAL_FIGURES(GLOBAL_ROW)};
#undef GLOBAL_ROW

#define PART_ROW(key, kind, prom, unit, column, help, src)                                         \
	{#key, prom, column, help, STATS_##kind, STATS_U64, STATS_##unit, STATS_ALWAYS},
const struct stats_figure stats_node_figures[STATS_NODE_COUNT] = {STATS_NODE_FIGURES(PART_ROW)};
const struct stats_figure stats_layer_figures[STATS_LAYER_COUNT] = {STATS_LAYER_FIGURES(PART_ROW)};
#undef PART_ROW

#define LATENCY_ROW(key, index, prom, column, help) {#key, prom, column, help, index},
const struct stats_latency_desc stats_latencies[STATS_LATENCY_COUNT] = {
    STATS_LATENCIES(LATENCY_ROW)};
#undef LATENCY_ROW

static_assert(offsetof(struct stats_doc, layers) % 8 == 0, "the board copies 8-byte words");
static_assert(sizeof(struct stats_layer) % 8 == 0, "the board copies 8-byte words");

double stats_bucket_le_seconds(unsigned k)
{
	return (double)(1ull << k) / 1e6;
}

double stats_doc_f64(uint64_t bits)
{
	double v;
	memcpy(&v, &bits, sizeof(v));
	return v;
}

uint64_t stats_doc_f64_bits(double v)
{
	uint64_t bits;
	memcpy(&bits, &v, sizeof(bits));
	return bits;
}

int stats_doc_init(struct stats_doc *d, uint32_t cap_layers, struct sidecar_error *err)
{
	memset(d, 0, sizeof(*d));
	d->groups = STATS_ALWAYS;
	d->layers = calloc(cap_layers ? cap_layers : 1, sizeof(*d->layers));
	if (!d->layers)
		return error_set(err, MOE_ENOMEM, "out of memory for %u layers of STATS",
		                 cap_layers);
	d->cap_layers = cap_layers;
	return 0;
}

void stats_doc_free(struct stats_doc *d)
{
	free(d->layers);
	d->layers = NULL;
	d->cap_layers = 0;
}

static bool present(const struct stats_doc *d, const struct stats_figure *f)
{
	return (d->groups & f->group) != 0;
}

/* ---- JSON -------------------------------------------------------------------------------- */

static void write_value(struct json_writer *w, const struct stats_figure *f, uint64_t v)
{
	switch (f->type) {
	case STATS_U64: jw_kv_u64(w, f->key, v); break;
	case STATS_F64: jw_kv_double(w, f->key, stats_doc_f64(v), 6); break;
	case STATS_BOOL: jw_kv_bool(w, f->key, v != 0); break;
	}
}

void stats_doc_write_json(const struct stats_doc *d, struct json_writer *w)
{
	jw_kv_string(w, "model", d->model);
	jw_kv_string(w, "fingerprint", d->fingerprint);
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT; i++)
		if (present(d, &stats_global_figures[i]))
			write_value(w, &stats_global_figures[i], d->g[i]);
	jw_key(w, "nodes");
	jw_array_begin(w);
	for (uint64_t n = 0; n < d->n_nodes && n < FORWARD_MAX_NODES; n++) {
		jw_object_begin(w);
		jw_kv_u64(w, "node", d->nodes[n].node);
		jw_kv_u64(w, "os_index", d->nodes[n].os_index);
		for (unsigned i = 0; i < STATS_NODE_COUNT; i++)
			jw_kv_u64(w, stats_node_figures[i].key, d->nodes[n].v[i]);
		jw_object_end(w);
	}
	jw_array_end(w);
	jw_key(w, "layers");
	jw_array_begin(w);
	for (uint64_t l = 0; l < d->n_layers; l++) {
		const struct stats_layer *s = &d->layers[l];
		jw_object_begin(w);
		jw_kv_u64(w, "layer", s->layer);
		for (unsigned i = 0; i < STATS_LAYER_COUNT; i++)
			jw_kv_u64(w, stats_layer_figures[i].key, s->v[i]);
		for (unsigned h = 0; h < STATS_LATENCY_COUNT; h++) {
			const struct forward_latency *lat = &s->lat[h];
			jw_key(w, stats_latencies[h].key);
			jw_object_begin(w);
			jw_kv_u64(w, "p50", lat->p50_us);
			jw_kv_u64(w, "p99", lat->p99_us);
			jw_kv_u64(w, "count", lat->count);
			jw_kv_u64(w, "sum", lat->sum_us);
			jw_key(w, "buckets");
			jw_array_begin(w);
			for (unsigned k = 0; k < FORWARD_LAT_BUCKETS; k++)
				jw_u64(w, lat->le[k]);
			jw_array_end(w);
			jw_object_end(w);
		}
		jw_object_end(w);
	}
	jw_array_end(w);
}

static int missing(struct sidecar_error *err, const char *where, const char *key)
{
	return error_set(err, MOE_EINVAL, "STATS reply%s: key \"%s\" missing or not a %s", where,
	                 key, "number of the right kind");
}

static int parse_value(const struct json_doc *jd, json_ref obj, const struct stats_figure *f,
                       uint64_t *out)
{
	json_ref v = json_object_get(jd, obj, f->key);
	if (v == JSON_NONE)
		return -1;
	switch (f->type) {
	case STATS_U64: return json_u64(jd, v, out);
	case STATS_F64: {
		double x = NAN; /* null: not a number yet (no read) */
		if (json_type_of(jd, v) != JSON_NULL && json_double(jd, v, &x) != 0)
			return -1;
		*out = stats_doc_f64_bits(x);
		return 0;
	}
	case STATS_BOOL: {
		bool b;
		if (json_bool(jd, v, &b) != 0)
			return -1;
		*out = b;
		return 0;
	}
	}
	return -1;
}

static int parse_latency(const struct json_doc *jd, json_ref layer, unsigned h,
                         struct forward_latency *lat, struct sidecar_error *err)
{
	const char *key = stats_latencies[h].key;
	json_ref o = json_object_get(jd, layer, key);
	if (json_get_u64(jd, o, "p50", &lat->p50_us) != 1 ||
	    json_get_u64(jd, o, "p99", &lat->p99_us) != 1)
		return missing(err, " layers[]", key);
	/* A sidecar before the histograms (count, sum, buckets) has percentiles only. */
	json_ref b = json_object_get(jd, o, "buckets");
	if (b == JSON_NONE)
		return 0;
	if (json_get_u64(jd, o, "count", &lat->count) != 1 ||
	    json_get_u64(jd, o, "sum", &lat->sum_us) != 1 || json_type_of(jd, b) != JSON_ARRAY ||
	    json_count(jd, b) != FORWARD_LAT_BUCKETS)
		return missing(err, " layers[]", key);
	unsigned k = 0;
	for (json_ref v = json_first(jd, b); v != JSON_NONE; v = json_next(jd, v), k++)
		if (json_u64(jd, v, &lat->le[k]) != 0)
			return missing(err, " layers[]", key);
	return 0;
}

int stats_doc_parse_json(const struct json_doc *jd, json_ref root, struct stats_doc *d,
                         struct sidecar_error *err)
{
	memset(d, 0, sizeof(*d));
	json_ref layers = json_object_get(jd, root, "layers");
	if (json_type_of(jd, layers) != JSON_ARRAY)
		return missing(err, "", "layers");
	if (stats_doc_init(d, json_count(jd, layers), err) != 0)
		return -1;
	const char *s = json_string(jd, json_object_get(jd, root, "model"), NULL);
	snprintf(d->model, sizeof(d->model), "%s", s ? s : "");
	s = json_string(jd, json_object_get(jd, root, "fingerprint"), NULL);
	snprintf(d->fingerprint, sizeof(d->fingerprint), "%s", s ? s : "");
	/* A group is present when its first figure is. */
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT; i++) {
		const struct stats_figure *f = &stats_global_figures[i];
		if (f->group != STATS_ALWAYS && !(d->groups & f->group) &&
		    json_object_get(jd, root, f->key) != JSON_NONE)
			d->groups |= f->group;
	}
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT; i++)
		if (present(d, &stats_global_figures[i]) &&
		    parse_value(jd, root, &stats_global_figures[i], &d->g[i]) != 0)
			return missing(err, "", stats_global_figures[i].key);
	json_ref nodes = json_object_get(jd, root, "nodes");
	if (json_type_of(jd, nodes) != JSON_ARRAY)
		return missing(err, "", "nodes");
	for (json_ref n = json_first(jd, nodes); n != JSON_NONE; n = json_next(jd, n)) {
		if (d->n_nodes >= FORWARD_MAX_NODES)
			return error_set(err, MOE_EINVAL, "STATS reply: more than %u nodes",
			                 FORWARD_MAX_NODES);
		struct stats_node *sn = &d->nodes[d->n_nodes++];
		if (json_get_u64(jd, n, "node", &sn->node) != 1 ||
		    json_get_u64(jd, n, "os_index", &sn->os_index) != 1)
			return missing(err, " nodes[]", "node");
		for (unsigned i = 0; i < STATS_NODE_COUNT; i++)
			if (parse_value(jd, n, &stats_node_figures[i], &sn->v[i]) != 0)
				return missing(err, " nodes[]", stats_node_figures[i].key);
	}
	for (json_ref l = json_first(jd, layers); l != JSON_NONE; l = json_next(jd, l)) {
		struct stats_layer *sl = &d->layers[d->n_layers++];
		if (json_get_u64(jd, l, "layer", &sl->layer) != 1)
			return missing(err, " layers[]", "layer");
		for (unsigned i = 0; i < STATS_LAYER_COUNT; i++)
			if (parse_value(jd, l, &stats_layer_figures[i], &sl->v[i]) != 0)
				return missing(err, " layers[]", stats_layer_figures[i].key);
		for (unsigned h = 0; h < STATS_LATENCY_COUNT; h++)
			if (parse_latency(jd, l, h, &sl->lat[h], err) != 0)
				return -1;
	}
	return 0;
}

/* ---- Prometheus -------------------------------------------------------------------------- */

/* A label value as the exposition format escapes it: backslash, quote, newline. */
static void put_label_value(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fputc('\\', f);
		if (*s == '\n') {
			fputs("\\n", f);
			continue;
		}
		fputc(*s, f);
	}
}

static void put_header(FILE *f, const struct stats_figure *fig, const char *suffix)
{
	const char *type = fig->kind == STATS_COUNTER ? "counter" : "gauge";
	fprintf(f, "# HELP moe_sidecar_%s%s %s\n", fig->prom, suffix, fig->help);
	fprintf(f, "# TYPE moe_sidecar_%s%s %s\n", fig->prom, suffix, type);
}

static void put_number(FILE *f, const struct stats_figure *fig, uint64_t v)
{
	if (fig->type != STATS_F64) {
		fprintf(f, " %" PRIu64 "\n", v);
		return;
	}
	const double x = stats_doc_f64(v);
	if (isnan(x))
		fputs(" NaN\n", f);
	else
		fprintf(f, " %.17g\n", x);
}

static const char *suffix_of(const struct stats_figure *fig)
{
	return fig->kind == STATS_COUNTER ? "_total" : "";
}

static void put_histogram(FILE *f, const struct stats_doc *d, unsigned h)
{
	const struct stats_latency_desc *ld = &stats_latencies[h];
	fprintf(f, "# HELP moe_sidecar_%s %s\n", ld->prom, ld->help);
	fprintf(f, "# TYPE moe_sidecar_%s histogram\n", ld->prom);
	for (uint64_t l = 0; l < d->n_layers; l++) {
		const struct forward_latency *lat = &d->layers[l].lat[h];
		const uint64_t layer = d->layers[l].layer;
		for (unsigned k = 0; k < FORWARD_LAT_BUCKETS; k++)
			fprintf(f,
			        "moe_sidecar_%s_bucket{layer=\"%" PRIu64 "\",le=\"%.7g\"} %" PRIu64
			        "\n",
			        ld->prom, layer, stats_bucket_le_seconds(k), lat->le[k]);
		fprintf(f, "moe_sidecar_%s_bucket{layer=\"%" PRIu64 "\",le=\"+Inf\"} %" PRIu64 "\n",
		        ld->prom, layer, lat->count);
		fprintf(f, "moe_sidecar_%s_sum{layer=\"%" PRIu64 "\"} %.17g\n", ld->prom, layer,
		        (double)lat->sum_us / 1e6);
		fprintf(f, "moe_sidecar_%s_count{layer=\"%" PRIu64 "\"} %" PRIu64 "\n", ld->prom,
		        layer, lat->count);
	}
}

void stats_doc_write_prometheus(const struct stats_doc *d, FILE *f)
{
	fputs("# HELP moe_sidecar_model_info The model served: its architecture and fingerprint\n"
	      "# TYPE moe_sidecar_model_info gauge\nmoe_sidecar_model_info{model=\"",
	      f);
	put_label_value(f, d->model);
	fputs("\",fingerprint=\"", f);
	put_label_value(f, d->fingerprint);
	fputs("\"} 1\n", f);
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT; i++) {
		const struct stats_figure *fig = &stats_global_figures[i];
		if (!present(d, fig))
			continue;
		put_header(f, fig, suffix_of(fig));
		fprintf(f, "moe_sidecar_%s%s", fig->prom, suffix_of(fig));
		put_number(f, fig, d->g[i]);
	}
	for (unsigned i = 0; i < STATS_NODE_COUNT && d->n_nodes; i++) {
		const struct stats_figure *fig = &stats_node_figures[i];
		put_header(f, fig, suffix_of(fig));
		for (uint64_t n = 0; n < d->n_nodes; n++)
			fprintf(f,
			        "moe_sidecar_%s%s{node=\"%" PRIu64 "\",numa=\"%" PRIu64
			        "\"} %" PRIu64 "\n",
			        fig->prom, suffix_of(fig), d->nodes[n].node, d->nodes[n].os_index,
			        d->nodes[n].v[i]);
	}
	for (unsigned i = 0; i < STATS_LAYER_COUNT && d->n_layers; i++) {
		const struct stats_figure *fig = &stats_layer_figures[i];
		put_header(f, fig, suffix_of(fig));
		for (uint64_t l = 0; l < d->n_layers; l++)
			fprintf(f, "moe_sidecar_%s%s{layer=\"%" PRIu64 "\"} %" PRIu64 "\n",
			        fig->prom, suffix_of(fig), d->layers[l].layer, d->layers[l].v[i]);
	}
	for (unsigned h = 0; h < STATS_LATENCY_COUNT && d->n_layers; h++)
		put_histogram(f, d, h);
}

/* ---- The `stats` columns ----------------------------------------------------------------- */

/* A counter's growth since the last sample (0 if it went back: a restarted sidecar). */
static uint64_t grown(uint64_t now, uint64_t before)
{
	return now >= before ? now - before : 0;
}

/* Counters as totals, or as rates over the interval when there is a sample before. */
static void put_cell(FILE *f, int width, const struct stats_figure *fig, uint64_t v,
                     const uint64_t *before, double interval_s)
{
	if (fig->type == STATS_F64) {
		const double x = stats_doc_f64(v);
		if (isnan(x))
			fprintf(f, " %*s", width, "-");
		else
			fprintf(f, " %*.6f", width, x);
	} else if (before && fig->kind == STATS_COUNTER) {
		fprintf(f, " %*.1f", width, (double)grown(v, *before) / interval_s);
	} else {
		fprintf(f, " %*" PRIu64, width, v);
	}
}

static const struct stats_node *node_before(const struct stats_doc *b, uint64_t node)
{
	for (uint64_t i = 0; b && i < b->n_nodes; i++)
		if (b->nodes[i].node == node)
			return &b->nodes[i];
	return NULL;
}

static const struct stats_layer *layer_before(const struct stats_doc *b, uint64_t layer)
{
	for (uint64_t i = 0; b && i < b->n_layers; i++)
		if (b->layers[i].layer == layer)
			return &b->layers[i];
	return NULL;
}

/* A column's header: the table's, with "/s" for a counter shown as a rate. */
static void put_header_cell(FILE *f, int width, const struct stats_figure *fig, bool rates)
{
	char h[32];
	snprintf(h, sizeof(h), "%s%s", fig->column,
	         rates && fig->kind == STATS_COUNTER ? "/s" : "");
	fprintf(f, " %*s", width, h);
}

void stats_doc_write_text(const struct stats_doc *d, const struct stats_doc *before,
                          double interval_s, FILE *f)
{
	const bool rates = before && interval_s > 0;
	char when[64] = "totals since start";
	if (rates)
		snprintf(when, sizeof(when), "last %.1f s (per second)", interval_s);
	fprintf(f, "\nfigures, %s; gauges now:\n", when);
	unsigned col = 0;
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT; i++) {
		const struct stats_figure *fig = &stats_global_figures[i];
		if (!present(d, fig))
			continue;
		fprintf(f, "  %-22s", fig->key);
		put_cell(f, 14, fig, d->g[i], rates ? &before->g[i] : NULL, interval_s);
		if (++col % 3 == 0)
			fputc('\n', f);
	}
	if (col % 3)
		fputc('\n', f);
	const uint64_t zero = 0;
	if (d->n_nodes) {
		fprintf(f, "\nper node, %s:\n%5s %5s", when, "node", "numa");
		for (unsigned i = 0; i < STATS_NODE_COUNT; i++)
			put_header_cell(f, 12, &stats_node_figures[i], rates);
		fputc('\n', f);
		for (uint64_t n = 0; n < d->n_nodes; n++) {
			const struct stats_node *s = &d->nodes[n];
			const struct stats_node *b = rates ? node_before(before, s->node) : NULL;
			fprintf(f, "%5" PRIu64 " %5" PRIu64, s->node, s->os_index);
			for (unsigned i = 0; i < STATS_NODE_COUNT; i++)
				put_cell(f, 12, &stats_node_figures[i], s->v[i],
				         rates ? (b ? &b->v[i] : &zero) : NULL, interval_s);
			fputc('\n', f);
		}
	}
	fprintf(f, "\nper layer, %s; latency percentiles since start (us):\n%5s", when, "layer");
	for (unsigned i = 0; i < STATS_LAYER_COUNT; i++)
		put_header_cell(f, 10, &stats_layer_figures[i], rates);
	for (unsigned h = 0; h < STATS_LATENCY_COUNT; h++)
		fprintf(f, " %7s50 %7s99", stats_latencies[h].column, stats_latencies[h].column);
	fputc('\n', f);
	for (uint64_t l = 0; l < d->n_layers; l++) {
		const struct stats_layer *s = &d->layers[l];
		const struct stats_layer *b = rates ? layer_before(before, s->layer) : NULL;
		fprintf(f, "%5" PRIu64, s->layer);
		for (unsigned i = 0; i < STATS_LAYER_COUNT; i++)
			put_cell(f, 10, &stats_layer_figures[i], s->v[i],
			         rates ? (b ? &b->v[i] : &zero) : NULL, interval_s);
		for (unsigned h = 0; h < STATS_LATENCY_COUNT; h++)
			fprintf(f, " %9" PRIu64 " %9" PRIu64, s->lat[h].p50_us, s->lat[h].p99_us);
		fputc('\n', f);
	}
}

/* ---- The board --------------------------------------------------------------------------- */

struct stats_board {
	_Atomic uint64_t asked, published; /* tickets: readers ask, the publisher serves */
	_Atomic uint64_t seq;              /* odd while a publication is being written */
	_Atomic uint64_t has;              /* a document was published */
	uint32_t cap_layers;
	size_t n_words;
	_Atomic uint64_t words[]; /* the head of a stats_doc, then cap_layers stats_layer */
};

#define HEAD_WORDS (offsetof(struct stats_doc, layers) / 8)
#define LAYER_WORDS (sizeof(struct stats_layer) / 8)

int stats_board_create(uint32_t cap_layers, struct stats_board **out, struct sidecar_error *err)
{
	const size_t n = HEAD_WORDS + (size_t)cap_layers * LAYER_WORDS;
	struct stats_board *b = calloc(1, sizeof(*b) + n * sizeof(b->words[0]));
	if (!b)
		return error_set(err, MOE_ENOMEM, "out of memory for the metrics board");
	b->cap_layers = cap_layers;
	b->n_words = n;
	*out = b;
	return 0;
}

void stats_board_destroy(struct stats_board *b)
{
	free(b);
}

uint32_t stats_board_capacity(const struct stats_board *b)
{
	return b->cap_layers;
}

uint64_t stats_board_ask(struct stats_board *b)
{
	return atomic_fetch_add_explicit(&b->asked, 1, memory_order_acq_rel) + 1;
}

bool stats_board_fresh(const struct stats_board *b, uint64_t ticket)
{
	return atomic_load_explicit(&b->published, memory_order_acquire) >= ticket;
}

bool stats_board_wanted(const struct stats_board *b)
{
	return atomic_load_explicit(&b->asked, memory_order_acquire) !=
	       atomic_load_explicit(&b->published, memory_order_relaxed);
}

static void store_words(_Atomic uint64_t *to, const void *from, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t w;
		memcpy(&w, (const char *)from + i * 8, 8);
		atomic_store_explicit(&to[i], w, memory_order_relaxed);
	}
}

static void load_words(void *to, const _Atomic uint64_t *from, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const uint64_t w = atomic_load_explicit(&from[i], memory_order_relaxed);
		memcpy((char *)to + i * 8, &w, 8);
	}
}

void stats_board_publish(struct stats_board *b, const struct stats_doc *d)
{
	const uint64_t ticket = atomic_load_explicit(&b->asked, memory_order_acquire);
	struct stats_doc head = *d;
	if (head.n_layers > b->cap_layers)
		head.n_layers = b->cap_layers;
	const uint64_t s = atomic_load_explicit(&b->seq, memory_order_relaxed);
	atomic_store_explicit(&b->seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	store_words(b->words, &head, HEAD_WORDS);
	store_words(b->words + HEAD_WORDS, d->layers, (size_t)head.n_layers * LAYER_WORDS);
	atomic_store_explicit(&b->seq, s + 2, memory_order_release);
	atomic_store_explicit(&b->has, 1, memory_order_release);
	atomic_store_explicit(&b->published, ticket, memory_order_release);
}

bool stats_board_read(const struct stats_board *b, struct stats_doc *out)
{
	if (!atomic_load_explicit(&b->has, memory_order_acquire))
		return false;
	struct stats_layer *layers = out->layers;
	const uint32_t cap = out->cap_layers;
	for (;;) {
		const uint64_t s1 = atomic_load_explicit(&b->seq, memory_order_acquire);
		if (s1 & 1) {
			struct timespec ts = {.tv_sec = 0, .tv_nsec = 10000};
			nanosleep(&ts,
			          NULL); /* the metrics thread only; the publisher never waits */
			continue;
		}
		load_words(out, b->words, HEAD_WORDS);
		uint64_t n = out->n_layers;
		if (n > cap)
			n = cap;
		load_words(layers, b->words + HEAD_WORDS, (size_t)n * LAYER_WORDS);
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&b->seq, memory_order_relaxed) == s1) {
			out->n_layers = n;
			break;
		}
	}
	out->layers = layers;
	out->cap_layers = cap;
	return true;
}
