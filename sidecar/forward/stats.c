/* stats.c — what the engine counts and how it reads back: per-MoE-layer counters and latency
 * histograms (recorded by the engine once per forward_run, relaxed atomics), their percentiles, the
 * weights' counters, and the STATS object written through the JSON writer. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "forward_internal.h"
#include "json_writer.h"
#include "log.h"
#include "moe_abi.h"

uint64_t lat_hist_upper(unsigned b)
{
	if (b < LAT_HIST_SUB)
		return b;
	const unsigned e = 3 + (b - LAT_HIST_SUB) / LAT_HIST_SUB;
	const uint64_t sub = (b - LAT_HIST_SUB) % LAT_HIST_SUB;
	return ((LAT_HIST_SUB + sub + 1) << (e - 3)) - 1;
}

int forward_node_residency(struct forward_engine *e, uint32_t node, struct residency_counters *out)
{
	return weights_node_counters(&e->w, node, out);
}

uint32_t forward_stats_layers(const struct forward_engine *e)
{
	return e->w.n_moe_layers;
}

static uint64_t percentile(const atomic_uint_least64_t *hist, double q)
{
	uint64_t total = 0, counts[HIST_BUCKETS];
	for (unsigned b = 0; b < HIST_BUCKETS; b++)
		total += counts[b] = atomic_load_explicit(&hist[b], memory_order_relaxed);
	if (total == 0)
		return 0;
	const uint64_t want = (uint64_t)ceil(q * (double)total);
	uint64_t seen = 0;
	for (unsigned b = 0; b < HIST_BUCKETS; b++) {
		seen += counts[b];
		if (seen >= want)
			return lat_hist_upper(b);
	}
	return lat_hist_upper(HIST_BUCKETS - 1);
}

/* The exported form of one histogram: percentiles, count, sum and the power-of-two buckets.
 * 2^k - 1 µs is always a bucket's upper bound, so each le[k] is exact. */
static void latency_of(const atomic_uint_least64_t *hist, const atomic_uint_least64_t *sum,
                       struct forward_latency *out)
{
	memset(out, 0, sizeof(*out));
	uint64_t seen = 0;
	unsigned k = 0;
	for (unsigned b = 0; b < HIST_BUCKETS; b++) {
		for (; k < FORWARD_LAT_BUCKETS && lat_hist_upper(b) >= (1ull << k); k++)
			out->le[k] = seen;
		seen += atomic_load_explicit(&hist[b], memory_order_relaxed);
	}
	for (; k < FORWARD_LAT_BUCKETS; k++)
		out->le[k] = seen;
	out->count = seen;
	out->sum_us = atomic_load_explicit(sum, memory_order_relaxed);
	out->p50_us = percentile(hist, 0.5);
	out->p99_us = percentile(hist, 0.99);
}

void forward_stats(struct forward_engine *e, struct forward_stats *out)
{
	struct forward_layer_stats *layers = out->layers;
	memset(out, 0, sizeof(*out));
	out->layers = layers;
	out->n_layers = e->w.n_moe_layers;
	for (uint32_t l = 0; l < e->w.n_moe_layers; l++) {
		const struct layer_counters *c = &e->counters[l];
		struct forward_layer_stats s = {.layer = e->w.model_layer[l]};
#define LOAD(f) s.f = atomic_load_explicit(&c->f, memory_order_relaxed);
		FORWARD_LAYER_COUNTERS(LOAD)
#undef LOAD
		s.queue_p50_us = percentile(c->hist[LAT_QUEUE], 0.5);
		s.queue_p99_us = percentile(c->hist[LAT_QUEUE], 0.99);
		s.io_p50_us = percentile(c->hist[LAT_IO], 0.5);
		s.io_p99_us = percentile(c->hist[LAT_IO], 0.99);
		s.compute_p50_us = percentile(c->hist[LAT_COMPUTE], 0.5);
		s.compute_p99_us = percentile(c->hist[LAT_COMPUTE], 0.99);
		s.total_p50_us = percentile(c->hist[LAT_TOTAL], 0.5);
		s.total_p99_us = percentile(c->hist[LAT_TOTAL], 0.99);
		for (int k = 0; k < LAT_KINDS; k++)
			latency_of(c->hist[k], &c->sum_us[k], &s.lat[k]);
#define SUM(f) out->f += s.f;
		FORWARD_LAYER_COUNTERS(SUM)
#undef SUM
		if (layers)
			layers[l] = s;
	}
	weights_counters(&e->w, out);
	for (uint32_t n = 0; n < out->n_nodes && n < e->topo.n_nodes; n++)
		out->nodes[n].os_index = e->topo.nodes[n].os_index;
	out->request_bytes = e->ctx[0].bytes + e->ctx[1].bytes;
}

uint64_t forward_pool_resident_bytes(struct forward_engine *e)
{
	return e->w.source == FORWARD_SOURCE_RESIDENCY && e->w.res
	           ? residency_pool_resident_bytes(e->w.res)
	           : 0;
}

void forward_stats_write(const struct forward_stats *st, struct json_writer *w)
{
#define WRITE(f) jw_kv_u64(w, #f, st->f);
	FORWARD_LAYER_COUNTERS(WRITE)
#undef WRITE
	jw_kv_u64(w, "resident_bytes", st->resident_bytes);
	jw_kv_u64(w, "slot_bytes_used", st->slot_bytes_used);
	jw_kv_u64(w, "pool_bytes", st->pool_bytes);
	jw_kv_u64(w, "budget_bytes", st->budget_bytes);
	jw_kv_u64(w, "slots", st->residency.slots);
	jw_kv_u64(w, "evictions", st->residency.evictions);
	jw_kv_u64(w, "loader_bytes_read", st->residency.bytes_read);
	jw_kv_u64(w, "prefetches", st->residency.prefetches);
	jw_kv_u64(w, "prefetch_hits", st->residency.prefetch_hits);
	jw_kv_u64(w, "prefetch_wasted", st->residency.prefetch_wasted);
	jw_kv_u64(w, "failed_experts", st->residency.failed_now);
	jw_kv_u64(w, "failed_retries", st->residency.failed_retries);
	jw_kv_u64(w, "fixed_reads", st->residency.fixed_reads);
	jw_kv_u64(w, "plain_reads", st->residency.plain_reads);
	jw_kv_u64(w, "fixed_buffers", st->residency.fixed_buffers);
	jw_kv_u64(w, "pool_hugetlb", st->residency.hugetlb ? 1 : 0);
	jw_kv_u64(w, "pool_thp", st->residency.thp ? 1 : 0);
	jw_key(w, "nodes");
	jw_array_begin(w);
	for (uint32_t n = 0; n < st->n_nodes && n < FORWARD_MAX_NODES; n++) {
		const struct forward_node_stats *s = &st->nodes[n];
		jw_object_begin(w);
		jw_kv_u64(w, "node", s->node);
		jw_kv_u64(w, "os_index", s->os_index);
		jw_kv_u64(w, "resident_bytes", s->residency.resident_bytes);
		jw_kv_u64(w, "slot_bytes_used", s->slot_bytes_used);
		jw_kv_u64(w, "budget_bytes", s->residency.budget_bytes);
		jw_kv_u64(w, "slots", s->residency.slots);
		jw_kv_u64(w, "slots_used", s->residency.slots_used);
		jw_kv_u64(w, "hits", s->residency.hits);
		jw_kv_u64(w, "cold_misses", s->residency.cold_misses);
		jw_kv_u64(w, "inflight_misses", s->residency.inflight_misses);
		jw_kv_u64(w, "loader_bytes_read", s->residency.bytes_read);
		jw_kv_u64(w, "evictions", s->residency.evictions);
		jw_kv_u64(w, "failed_experts", s->residency.failed_now);
		jw_object_end(w);
	}
	jw_array_end(w);
	jw_key(w, "layers");
	jw_array_begin(w);
	for (uint32_t l = 0; st->layers && l < st->n_layers; l++) {
		const struct forward_layer_stats *s = &st->layers[l];
		if (s->requests == 0)
			continue;
		jw_object_begin(w);
		jw_kv_u64(w, "layer", s->layer);
#define WRITE(f) jw_kv_u64(w, #f, s->f);
		FORWARD_LAYER_COUNTERS(WRITE)
#undef WRITE
		const struct {
			const char *key;
			uint64_t p50, p99;
		} lat[] = {{"queue_us", s->queue_p50_us, s->queue_p99_us},
		           {"io_us", s->io_p50_us, s->io_p99_us},
		           {"compute_us", s->compute_p50_us, s->compute_p99_us},
		           {"total_us", s->total_p50_us, s->total_p99_us}};
		for (size_t i = 0; i < sizeof(lat) / sizeof(lat[0]); i++) {
			jw_key(w, lat[i].key);
			jw_object_begin(w);
			jw_kv_u64(w, "p50", lat[i].p50);
			jw_kv_u64(w, "p99", lat[i].p99);
			jw_object_end(w);
		}
		jw_object_end(w);
	}
	jw_array_end(w);
}

size_t forward_stats_json(const struct forward_stats *st, char *buf, size_t len)
{
	struct json_writer w;
	jw_init_buffer(&w, buf, len);
	jw_object_begin(&w);
	forward_stats_write(st, &w);
	jw_object_end(&w);
	return jw_length(&w);
}
