/* test_stats_table.c — the three forms of the STATS figures agree, for every figure
 * stats_table.h declares: the STATS JSON members (and their parse back), the `stats` figure
 * columns and the Prometheus exposition. Each figure gets a value of its own, so a figure
 * shown under another's name, or not at all, fails here. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "json_writer.h"
#include "stats_doc.h"

#define N_LAYERS 3

/* A document where every value differs: global i = 1000 + i, node n figure i = 100000 * (n
 * + 1) + i, layer l figure i = 200000 * (l + 1) + i, histograms from the layer index. */
static void make_doc(struct stats_doc *d)
{
	struct sidecar_error err;
	cr_assert_eq(stats_doc_init(d, N_LAYERS, &err), 0);
	snprintf(d->model, sizeof(d->model), "qwen3moe");
	snprintf(d->fingerprint, sizeof(d->fingerprint), "00112233445566778899aabbccddeeff");
	d->groups = STATS_ALWAYS | STATS_PROBES | STATS_TRACE;
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT; i++) {
		const struct stats_figure *f = &stats_global_figures[i];
		d->g[i] = f->type == STATS_F64    ? stats_doc_f64_bits(0.25 + i / 1024.0)
		          : f->type == STATS_BOOL ? 1
		                                  : 1000 + i;
	}
	d->n_nodes = 2;
	for (unsigned n = 0; n < 2; n++) {
		d->nodes[n].node = n;
		d->nodes[n].os_index = 2 * n + 1;
		for (unsigned i = 0; i < STATS_NODE_COUNT; i++)
			d->nodes[n].v[i] = 100000ull * (n + 1) + i;
	}
	d->n_layers = N_LAYERS;
	for (unsigned l = 0; l < N_LAYERS; l++) {
		struct stats_layer *s = &d->layers[l];
		s->layer = 2 * l + 1;
		for (unsigned i = 0; i < STATS_LAYER_COUNT; i++)
			s->v[i] = 200000ull * (l + 1) + i;
		for (unsigned h = 0; h < STATS_LATENCY_COUNT; h++) {
			struct forward_latency *lat = &s->lat[h];
			lat->count = 50 + 10 * l + h;
			lat->sum_us = 123456 + 1000 * l + h;
			lat->p50_us = 15 + h;
			lat->p99_us = 255 + h;
			for (unsigned k = 0; k < FORWARD_LAT_BUCKETS; k++)
				lat->le[k] = k < 4 ? 0 : k > 12 ? lat->count : (k - 3) * 4 + h;
		}
	}
}

static char *json_of(const struct stats_doc *d)
{
	static char buf[1 << 16];
	struct json_writer w;
	jw_init_buffer(&w, buf, sizeof(buf));
	jw_object_begin(&w);
	stats_doc_write_json(d, &w);
	jw_object_end(&w);
	cr_assert_eq(jw_finish(&w), 0);
	return buf;
}

static char *text_of(void (*write)(const struct stats_doc *, FILE *), const struct stats_doc *d)
{
	/* open_memstream's pointers live on the heap: the text outlives this frame. */
	struct {
		char *text;
		size_t len;
	} *m = calloc(1, sizeof(*m));
	cr_assert_not_null(m);
	FILE *f = open_memstream(&m->text, &m->len);
	cr_assert_not_null(f);
	write(d, f);
	cr_assert_eq(fclose(f), 0);
	char *text = m->text;
	free(m);
	return text;
}

static void write_text(const struct stats_doc *d, FILE *f)
{
	stats_doc_write_text(d, NULL, 0, f);
}

/* The sample value of an exposition line "name{labels} value" (labels exactly as given, or
 * none); asserts that the line exists. */
static double sample(const char *expo, const char *name, const char *labels)
{
	char head[256];
	snprintf(head, sizeof(head), "\n%s%s%s%s ", name, labels ? "{" : "", labels ? labels : "",
	         labels ? "}" : "");
	const char *p = strstr(expo, head);
	cr_assert_not_null(p, "no sample %s in the exposition", head + 1);
	return strtod(p + strlen(head), NULL);
}

static void expect_type(const char *expo, const char *name, const char *type)
{
	char line[256];
	snprintf(line, sizeof(line), "\n# TYPE %s %s\n", name, type);
	cr_expect(strstr(expo, line), "no '# TYPE %s %s'", name, type);
	snprintf(line, sizeof(line), "\n# HELP %s ", name);
	cr_expect(strstr(expo, line), "no HELP for %s", name);
}

static double value_of(const struct stats_figure *f, uint64_t v)
{
	return f->type == STATS_F64 ? stats_doc_f64(v) : (double)v;
}

Test(stats_table, json_round_trip_keeps_every_figure)
{
	struct stats_doc d, back;
	make_doc(&d);
	const char *json = json_of(&d);
	struct json_doc *jd;
	struct sidecar_error err;
	cr_assert_eq(json_parse(json, strlen(json), &jd, &err), 0, "%s", err.msg);
	json_ref root = json_root(jd);
	/* Every figure under its own key, with its own value. */
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT; i++) {
		const struct stats_figure *f = &stats_global_figures[i];
		if (f->type == STATS_U64) {
			uint64_t v;
			cr_assert_eq(json_get_u64(jd, root, f->key, &v), 1, "%s", f->key);
			cr_expect_eq(v, d.g[i], "%s", f->key);
		} else if (f->type == STATS_F64) {
			double v;
			cr_assert_eq(json_get_double(jd, root, f->key, &v), 1, "%s", f->key);
			cr_expect(fabs(v - stats_doc_f64(d.g[i])) < 1e-6, "%s", f->key);
		} else {
			bool v;
			cr_assert_eq(json_get_bool(jd, root, f->key, &v), 1, "%s", f->key);
			cr_expect_eq(v, d.g[i] != 0, "%s", f->key);
		}
	}
	cr_assert_eq(stats_doc_parse_json(jd, root, &back, &err), 0, "%s", err.msg);
	cr_expect_str_eq(back.model, d.model);
	cr_expect_str_eq(back.fingerprint, d.fingerprint);
	cr_expect_eq(back.groups, d.groups);
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT; i++)
		cr_expect(fabs(value_of(&stats_global_figures[i], back.g[i]) -
		               value_of(&stats_global_figures[i], d.g[i])) < 1e-6,
		          "%s", stats_global_figures[i].key);
	cr_assert_eq(back.n_nodes, d.n_nodes);
	cr_expect_eq(memcmp(back.nodes, d.nodes, sizeof(d.nodes[0]) * d.n_nodes), 0);
	cr_assert_eq(back.n_layers, d.n_layers);
	cr_expect_eq(memcmp(back.layers, d.layers, sizeof(d.layers[0]) * d.n_layers), 0);
	stats_doc_free(&back);
	json_free(jd);
	stats_doc_free(&d);
}

/* A reply without the optional groups parses without them; one with a group cut short is
 * refused naming the missing key. */
Test(stats_table, optional_groups_and_missing_keys)
{
	struct stats_doc d, back;
	make_doc(&d);
	d.groups = STATS_ALWAYS;
	const char *json = json_of(&d);
	struct json_doc *jd;
	struct sidecar_error err;
	cr_assert_eq(json_parse(json, strlen(json), &jd, &err), 0);
	cr_assert_eq(stats_doc_parse_json(jd, json_root(jd), &back, &err), 0, "%s", err.msg);
	cr_expect_eq(back.groups, STATS_ALWAYS);
	stats_doc_free(&back);
	json_free(jd);
	char *cut = strdup(json_of(&d));
	char *p = strstr(cut, "\"evictions\":");
	cr_assert_not_null(p);
	p[1] = 'X'; /* "Xvictions" */
	cr_assert_eq(json_parse(cut, strlen(cut), &jd, &err), 0);
	cr_expect_eq(stats_doc_parse_json(jd, json_root(jd), &back, &err), -1);
	cr_expect(strstr(err.msg, "\"evictions\""), "%s", err.msg);
	stats_doc_free(&back);
	json_free(jd);
	free(cut);
	stats_doc_free(&d);
}

Test(stats_table, prometheus_has_every_figure_under_its_name)
{
	struct stats_doc d;
	make_doc(&d);
	char *expo = text_of(stats_doc_write_prometheus, &d);
	char *with_nl = NULL;
	cr_assert(asprintf(&with_nl, "\n%s", expo) > 0);
	char name[128], labels[128];
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT; i++) {
		const struct stats_figure *f = &stats_global_figures[i];
		const bool counter = f->kind == STATS_COUNTER;
		snprintf(name, sizeof(name), "moe_sidecar_%s%s", f->prom, counter ? "_total" : "");
		expect_type(with_nl, name, counter ? "counter" : "gauge");
		cr_expect(fabs(sample(with_nl, name, NULL) - value_of(f, d.g[i])) < 1e-9, "%s",
		          name);
		if (f->unit == STATS_BYTES)
			cr_expect(strstr(name, "_bytes"), "%s: bytes in the name", name);
	}
	for (unsigned i = 0; i < STATS_NODE_COUNT; i++) {
		const struct stats_figure *f = &stats_node_figures[i];
		const bool counter = f->kind == STATS_COUNTER;
		snprintf(name, sizeof(name), "moe_sidecar_%s%s", f->prom, counter ? "_total" : "");
		expect_type(with_nl, name, counter ? "counter" : "gauge");
		for (unsigned n = 0; n < 2; n++) {
			snprintf(labels, sizeof(labels), "node=\"%u\",numa=\"%u\"", n, 2 * n + 1);
			cr_expect_eq(sample(with_nl, name, labels), (double)d.nodes[n].v[i], "%s",
			             name);
		}
	}
	for (unsigned i = 0; i < STATS_LAYER_COUNT; i++) {
		const struct stats_figure *f = &stats_layer_figures[i];
		snprintf(name, sizeof(name), "moe_sidecar_%s%s", f->prom,
		         f->kind == STATS_COUNTER ? "_total" : "");
		for (unsigned l = 0; l < N_LAYERS; l++) {
			snprintf(labels, sizeof(labels), "layer=\"%u\"", 2 * l + 1);
			cr_expect_eq(sample(with_nl, name, labels), (double)d.layers[l].v[i], "%s",
			             name);
		}
	}
	for (unsigned h = 0; h < STATS_LATENCY_COUNT; h++) {
		snprintf(name, sizeof(name), "moe_sidecar_%s", stats_latencies[h].prom);
		expect_type(with_nl, name, "histogram");
		cr_expect(strstr(name, "_seconds"), "%s: seconds", name);
		for (unsigned l = 0; l < N_LAYERS; l++) {
			const struct forward_latency *lat = &d.layers[l].lat[h];
			char series[160];
			snprintf(labels, sizeof(labels), "layer=\"%u\"", 2 * l + 1);
			snprintf(series, sizeof(series), "%s_count", name);
			cr_expect_eq(sample(with_nl, series, labels), (double)lat->count);
			snprintf(series, sizeof(series), "%s_sum", name);
			cr_expect(fabs(sample(with_nl, series, labels) - lat->sum_us / 1e6) < 1e-9);
			snprintf(series, sizeof(series), "%s_bucket", name);
			for (unsigned k = 0; k < FORWARD_LAT_BUCKETS; k++) {
				snprintf(labels, sizeof(labels), "layer=\"%u\",le=\"%.7g\"",
				         2 * l + 1, stats_bucket_le_seconds(k));
				cr_expect_eq(sample(with_nl, series, labels), (double)lat->le[k]);
			}
			snprintf(labels, sizeof(labels), "layer=\"%u\",le=\"+Inf\"", 2 * l + 1);
			cr_expect_eq(sample(with_nl, series, labels), (double)lat->count);
		}
	}
	/* Names as the format allows them, no per-expert label. */
	regex_t re;
	cr_assert_eq(regcomp(&re, "^[a-zA-Z_:][a-zA-Z0-9_:]*(\\{[^}]*\\})? [^ ]+$", REG_EXTENDED),
	             0);
	for (char *line = strtok(expo, "\n"); line; line = strtok(NULL, "\n")) {
		if (line[0] == '#')
			continue;
		cr_expect_eq(regexec(&re, line, 0, NULL, 0), 0, "sample line '%s'", line);
		cr_expect_null(strstr(line, "expert=\""), "per-expert label: %s", line);
	}
	regfree(&re);
	free(with_nl);
	free(expo);
	stats_doc_free(&d);
}

/* The value after `key` in "key value" pairs of the figures block. */
static const char *figure_cell(const char *text, const char *key)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "  %s ", key);
	const char *p = strstr(text, pat);
	cr_assert_not_null(p, "no figure %s in the text", key);
	p += strlen(pat);
	while (*p == ' ')
		p++;
	return p;
}

/* Column `col` (0: the first after the row's label) of the table row starting "label". */
static double table_cell(const char *header_line, const char *row_start, const char *column)
{
	char *hdr = strndup(header_line, strcspn(header_line, "\n"));
	char *row = strndup(row_start, strcspn(row_start, "\n"));
	int want = -1, i = 0;
	for (char *t = strtok(hdr, " "); t; t = strtok(NULL, " "), i++)
		if (!strcmp(t, column))
			want = i;
	cr_assert_geq(want, 0, "no column %s", column);
	double v = NAN;
	i = 0;
	for (char *t = strtok(row, " "); t; t = strtok(NULL, " "), i++)
		if (i == want)
			v = strtod(t, NULL);
	free(hdr);
	free(row);
	return v;
}

Test(stats_table, text_columns_show_every_figure)
{
	struct stats_doc d;
	make_doc(&d);
	char *text = text_of(write_text, &d);
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT; i++) {
		const struct stats_figure *f = &stats_global_figures[i];
		const char *cell = figure_cell(text, f->key);
		cr_expect(fabs(strtod(cell, NULL) - value_of(f, d.g[i])) < 1e-6, "%s: %.20s",
		          f->key, cell);
	}
	const char *nodes = strstr(text, "\n node  numa");
	cr_assert_not_null(nodes, "%s", text);
	nodes++;
	const char *row = strchr(nodes, '\n') + 1;
	for (unsigned n = 0; n < 2; n++, row = strchr(row, '\n') + 1)
		for (unsigned i = 0; i < STATS_NODE_COUNT; i++)
			cr_expect_eq(table_cell(nodes, row, stats_node_figures[i].column),
			             (double)d.nodes[n].v[i], "node %u %s", n,
			             stats_node_figures[i].column);
	const char *layers = strstr(text, "\nlayer ");
	cr_assert_not_null(layers, "%s", text);
	layers++;
	row = strchr(layers, '\n') + 1;
	for (unsigned l = 0; l < N_LAYERS; l++, row = strchr(row, '\n') + 1) {
		cr_expect_eq(table_cell(layers, row, "layer"), (double)d.layers[l].layer);
		for (unsigned i = 0; i < STATS_LAYER_COUNT; i++)
			cr_expect_eq(table_cell(layers, row, stats_layer_figures[i].column),
			             (double)d.layers[l].v[i], "layer %u %s", l,
			             stats_layer_figures[i].column);
		for (unsigned h = 0; h < STATS_LATENCY_COUNT; h++) {
			char col[32];
			snprintf(col, sizeof(col), "%s99", stats_latencies[h].column);
			cr_expect_eq(table_cell(layers, row, col),
			             (double)d.layers[l].lat[h].p99_us, "%s", col);
		}
	}
	free(text);
	stats_doc_free(&d);
}

/* The board hands over what was published, and says when a reader's request was served. */
Test(stats_table, board_hands_over_the_published_document)
{
	struct stats_doc d, out;
	struct stats_board *b;
	struct sidecar_error err;
	make_doc(&d);
	cr_assert_eq(stats_board_create(N_LAYERS, &b, &err), 0);
	cr_assert_eq(stats_doc_init(&out, N_LAYERS, &err), 0);
	cr_expect_not(stats_board_read(b, &out));
	cr_expect_not(stats_board_wanted(b));
	const uint64_t ticket = stats_board_ask(b);
	cr_expect(stats_board_wanted(b));
	cr_expect_not(stats_board_fresh(b, ticket));
	stats_board_publish(b, &d);
	cr_expect(stats_board_fresh(b, ticket));
	cr_expect_not(stats_board_wanted(b));
	cr_assert(stats_board_read(b, &out));
	cr_expect_str_eq(out.model, d.model);
	cr_expect_eq(memcmp(out.g, d.g, sizeof(d.g)), 0);
	cr_assert_eq(out.n_layers, N_LAYERS);
	cr_expect_eq(memcmp(out.layers, d.layers, sizeof(d.layers[0]) * N_LAYERS), 0);
	stats_board_destroy(b);
	stats_doc_free(&out);
	stats_doc_free(&d);
}

/* docs/operations.md's metric table names every metric the exposition has. */
Test(stats_table, operations_guide_lists_every_metric)
{
	FILE *f = fopen(MOE_SOURCE_DIR "/docs/operations.md", "r");
	cr_assert_not_null(f);
	static char doc[1 << 20];
	const size_t n = fread(doc, 1, sizeof(doc) - 1, f);
	doc[n] = '\0';
	fclose(f);
	char name[160];
	for (unsigned i = 0; i < STATS_GLOBAL_COUNT + STATS_NODE_COUNT + STATS_LAYER_COUNT; i++) {
		const struct stats_figure *fig =
		    i < STATS_GLOBAL_COUNT ? &stats_global_figures[i]
		    : i < STATS_GLOBAL_COUNT + STATS_NODE_COUNT
		        ? &stats_node_figures[i - STATS_GLOBAL_COUNT]
		        : &stats_layer_figures[i - STATS_GLOBAL_COUNT - STATS_NODE_COUNT];
		snprintf(name, sizeof(name), "`moe_sidecar_%s%s`", fig->prom,
		         fig->kind == STATS_COUNTER ? "_total" : "");
		cr_expect(strstr(doc, name), "docs/operations.md does not list %s", name);
	}
	for (unsigned h = 0; h < STATS_LATENCY_COUNT; h++) {
		snprintf(name, sizeof(name), "`moe_sidecar_%s`", stats_latencies[h].prom);
		cr_expect(strstr(doc, name), "docs/operations.md does not list %s", name);
	}
}
