/* stats_table.h — every figure of the STATS document, declared once.
 *
 * Owns: the list of figures the sidecar reports — their STATS JSON key, kind (counter: only
 * grows; gauge: a value now), value type, presence group, Prometheus name (without the
 * `moe_sidecar_` prefix and a counter's `_total`), unit, help text, and where the daemon
 * reads each one. Everything else is generated from these rows (stats_doc.c): the STATS JSON
 * members, the `moe-sidecar stats` figure columns, the Prometheus exposition (/metrics and
 * `stats --prometheus`), and the STATS parser of the `stats` command.
 *
 * A row's last column is an expression the collector (served_model.c, serve_model_collect)
 * evaluates with: `st` (const struct forward_stats *), `desc` (const struct serve_model_desc
 * *), `x` (const struct stats_sources *), `ps` (const struct pagecache_stats *: the PROBES
 * group), `ts` (const struct trace_recorder_stats *: the TRACE group); per node `s` is a
 * const struct forward_node_stats *, per layer a const struct forward_layer_stats *. The
 * residency's counters are st->residency and, per node, s->residency (residency.h). Other
 * includers never expand it.
 *
 * Groups: ALWAYS members are in every reply; PROBES only while the page-cache probes are
 * active; TRACE only with --record-trace. Labels: per node `node` (topology index) and `numa`
 * (the OS's node number); per layer `layer` (the transformer block). No per-expert label:
 * per-expert counts are STATS' "experts" (stats --experts), never a metric.
 *
 * Adding a figure: one row here, plus the code that counts it and, when no struct the
 * collector reads carries it yet, the list entry or field that carries it: three files of
 * code at most (docs/architecture.md, "Figures"; a residency counter is its line in
 * RESIDENCY_COUNTERS, its count and a row reading st->residency.<name> or
 * s->residency.<name>); then its line in docs/operations.md's metric table (test_stats_table
 * checks that every name is there).
 */
#ifndef MOE_SIDECAR_STATS_TABLE_H
#define MOE_SIDECAR_STATS_TABLE_H

/* X(json_key, kind, type, group, prom_name, unit, help, source) */
/* clang-format off */
#define STATS_GLOBAL_FIGURES(X)                                                                              \
	X(clients,               GAUGE,   U64,  ALWAYS, "clients",                  NONE,  "Clients connected now", x->clients) \
	X(expert_bytes,          GAUGE,   U64,  ALWAYS, "model_expert_bytes",       BYTES, "Bytes of every routed expert of the model", desc->expert_bytes) \
	X(numa_nodes,            GAUGE,   U64,  ALWAYS, "numa_nodes",               NONE,  "NUMA nodes the worker pools run on", desc->n_nodes) \
	X(forwards_inline,       COUNTER, U64,  ALWAYS, "forwards_inline",          NONE,  "FORWARDs the dispatcher ran itself", x->forwards_inline) \
	X(mem_limit_bytes,       GAUGE,   U64,  ALWAYS, "memory_limit_bytes",       BYTES, "The memory limit the sidecar works within", desc->mem_limit_bytes) \
	X(mem_fixed_bytes,       GAUGE,   U64,  ALWAYS, "memory_fixed_bytes",       BYTES, "Memory held without channels: process, slot pools, request buffers", desc->mem_fixed_bytes) \
	X(mem_channel_bytes,     GAUGE,   U64,  ALWAYS, "memory_channel_bytes",     BYTES, "Memory accounted to the clients' channels", x->channel_bytes) \
	X(log_lines_dropped,     COUNTER, U64,  ALWAYS, "log_lines_dropped",        NONE,  "Log lines that could not be written", x->log_lines_dropped) \
	X(requests,              COUNTER, U64,  ALWAYS, "requests",                 NONE,  "FORWARD requests run, every MoE layer", st->requests) \
	X(tokens,                COUNTER, U64,  ALWAYS, "tokens",                   NONE,  "Token rows of the FORWARDs that succeeded", st->tokens) \
	X(hits,                  COUNTER, U64,  ALWAYS, "expert_hits",              NONE,  "Expert demands found resident", st->hits) \
	X(cold_misses,           COUNTER, U64,  ALWAYS, "expert_cold_misses",       NONE,  "Expert demands that started a read", st->cold_misses) \
	X(inflight_misses,       COUNTER, U64,  ALWAYS, "expert_inflight_misses",   NONE,  "Expert demands that waited for a read already started", st->inflight_misses) \
	X(bytes_read,            COUNTER, U64,  ALWAYS, "demand_read_bytes",        BYTES, "Bytes read for the cold misses of requests", st->bytes_read) \
	X(failures,              COUNTER, U64,  ALWAYS, "request_failures",         NONE,  "FORWARDs that completed with an error", st->failures) \
	X(resident_bytes,        GAUGE,   U64,  ALWAYS, "resident_bytes",           BYTES, "File bytes of the experts resident now", st->resident_bytes) \
	X(slot_bytes_used,       GAUGE,   U64,  ALWAYS, "slot_used_bytes",          BYTES, "Memory of the slots holding experts now", st->slot_bytes_used) \
	X(pool_bytes,            GAUGE,   U64,  ALWAYS, "pool_bytes",               BYTES, "Memory of every slot of the pools", st->pool_bytes) \
	X(budget_bytes,          GAUGE,   U64,  ALWAYS, "budget_bytes",             BYTES, "What the slot pools may take", st->budget_bytes) \
	X(slots,                 GAUGE,   U64,  ALWAYS, "slots",                    NONE,  "Expert slots of the pools", st->residency.slots) \
	X(evictions,             COUNTER, U64,  ALWAYS, "evictions",                NONE,  "Experts evicted", st->residency.evictions) \
	X(loader_bytes_read,     COUNTER, U64,  ALWAYS, "loader_read_bytes",        BYTES, "Bytes the loaders read, demand and prefetch", st->residency.bytes_read) \
	X(prefetches,            COUNTER, U64,  ALWAYS, "prefetches",               NONE,  "Expert loads started by a hint", st->residency.prefetches) \
	X(prefetch_hits,         COUNTER, U64,  ALWAYS, "prefetch_hits",            NONE,  "Prefetched experts a request used", st->residency.prefetch_hits) \
	X(prefetch_wasted,       COUNTER, U64,  ALWAYS, "prefetch_wasted",          NONE,  "Prefetched experts evicted unused", st->residency.prefetch_wasted) \
	X(failed_experts,        GAUGE,   U64,  ALWAYS, "failed_experts",           NONE,  "Experts whose last load failed, now", st->residency.failed_now) \
	X(failed_retries,        COUNTER, U64,  ALWAYS, "failed_retries",           NONE,  "Loads started again for a failed expert", st->residency.failed_retries) \
	X(fixed_reads,           COUNTER, U64,  ALWAYS, "loader_fixed_reads",       NONE,  "Loader reads into registered buffers", st->residency.fixed_reads) \
	X(plain_reads,           COUNTER, U64,  ALWAYS, "loader_plain_reads",       NONE,  "Loader reads into unregistered memory", st->residency.plain_reads) \
	X(fixed_buffers,         GAUGE,   U64,  ALWAYS, "loader_fixed_buffers",     NONE,  "Registered buffers the pools are spread over", st->residency.fixed_buffers) \
	X(pool_groups,           GAUGE,   U64,  ALWAYS, "pool_groups",              NONE,  "Groups the slot pools are populated and registered in", st->residency.pool_groups) \
	X(populated_groups,      GAUGE,   U64,  ALWAYS, "pool_populated_groups",    NONE,  "Groups of the slot pools populated so far", st->residency.populated_groups) \
	X(populate_s,            COUNTER, F64,  ALWAYS, "pool_populate_seconds",    NONE,  "Time spent populating and registering the pools' groups", (double)st->residency.populate_ns / 1e9) \
	X(populated_small_bytes, GAUGE,   U64,  ALWAYS, "pool_populated_small_bytes", NONE, "Bytes of the THP-advised pools populated with 4 KiB pages (huge ones faulted slower)", st->residency.populated_small_bytes) \
	X(layout_s,              COUNTER, F64,  ALWAYS, "loader_layout_seconds",    NONE,  "Time the post-load stage converted loaded experts (the decode layout)", (double)st->residency.layout_ns / 1e9) \
	X(loader_busy_s,         COUNTER, F64,  ALWAYS, "loader_busy_seconds",      NONE,  "Time the loaders had reads in flight", (double)st->residency.busy_ns / 1e9) \
	X(pool_hugetlb,          GAUGE,   U64,  ALWAYS, "pool_hugetlb",             NONE,  "1 when every pool is on hugetlb pages", st->residency.hugetlb ? 1 : 0) \
	X(pool_thp,              GAUGE,   U64,  ALWAYS, "pool_thp",                 NONE,  "1 when every pool is advised for transparent huge pages", st->residency.thp ? 1 : 0) \
	X(gpu_mask_switches,     COUNTER, U64,  ALWAYS, "gpu_mask_switches",        NONE,  "MASKs that changed a client's GPU mask", x->mask_switches) \
	X(gpu_masked_experts,    GAUGE,   U64,  ALWAYS, "gpu_masked_experts",       NONE,  "Experts every client keeps on its GPU", x->masked_experts) \
	X(heat_half_life_tokens, GAUGE,   U64,  ALWAYS, "heat_half_life_tokens",    NONE,  "Tokens of a layer over which an expert's heat halves", x->heat_half_life) \
	X(leases,                COUNTER, U64,  ALWAYS, "leases",                   NONE,  "Experts leased to clients", x->leases_taken) \
	X(leases_cold,           COUNTER, U64,  ALWAYS, "leases_cold",              NONE,  "Leased experts that were not resident when asked", x->leases_cold) \
	X(lease_bytes,           COUNTER, U64,  ALWAYS, "lease_bytes",              BYTES, "Bytes of the experts leased to clients", x->lease_bytes_taken) \
	X(leases_released,       COUNTER, U64,  ALWAYS, "leases_released",          NONE,  "Leases released, by the client or at its close", x->leases_released) \
	X(leases_refused,        COUNTER, U64,  ALWAYS, "leases_refused",           NONE,  "LEASE requests refused or failed", x->leases_refused) \
	X(leases_held,           GAUGE,   U64,  ALWAYS, "leases_held",              NONE,  "Experts leased now", x->leases_held) \
	X(lease_held_bytes,      GAUGE,   U64,  ALWAYS, "lease_held_bytes",         BYTES, "Bytes of the experts leased now", x->lease_bytes_held) \
	X(pagecache_fill_bytes,  COUNTER, U64,  PROBES, "pagecache_fill_bytes",     BYTES, "Bytes inserted into the model files' page cache, any process", ps->raw.pagecache_fill_bytes) \
	X(direct_bytes,          COUNTER, U64,  PROBES, "pagecache_direct_bytes",   BYTES, "Bytes requested by direct reads of the model files", ps->raw.direct_bytes) \
	X(buffered_bytes,        COUNTER, U64,  PROBES, "pagecache_buffered_bytes", BYTES, "Bytes returned by buffered reads of the model files", ps->raw.buffered_bytes) \
	X(fault_bytes,           COUNTER, U64,  PROBES, "pagecache_fault_bytes",    BYTES, "Bytes of mmap faults on the model files", ps->fault_bytes) \
	X(bypass_ratio,          GAUGE,   F64,  PROBES, "pagecache_bypass_ratio",   RATIO, "Direct bytes over all bytes read from the model files", ps->bypass_ratio) \
	X(trace_lines,           COUNTER, U64,  TRACE,  "trace_lines",              NONE,  "Routing lines written to the recorded trace", ts->lines) \
	X(trace_bytes,           COUNTER, U64,  TRACE,  "trace_written_bytes",      BYTES, "Bytes written to the recorded trace", ts->bytes) \
	X(trace_dropped,         COUNTER, U64,  TRACE,  "trace_dropped_lines",      NONE,  "Routing lines the recorder could not keep", ts->dropped) \
	X(trace_stopped,         GAUGE,   BOOL, TRACE,  "trace_stopped",            NONE,  "1 once the recorded trace stopped", ts->stopped ? 1 : 0)

/* X(json_key, kind, prom_name, unit, column, help, source); labels node and numa */
#define STATS_NODE_FIGURES(X) \
	X(resident_bytes,    GAUGE,   "node_resident_bytes",          BYTES, "resident_B", "File bytes of this node's expert slices resident now", s->residency.resident_bytes) \
	X(slot_bytes_used,   GAUGE,   "node_slot_used_bytes",         BYTES, "slots_B",    "Memory of this node's slots holding experts now", s->slot_bytes_used) \
	X(budget_bytes,      GAUGE,   "node_budget_bytes",            BYTES, "budget_B",   "What this node's pool may take", s->residency.budget_bytes) \
	X(slots,             GAUGE,   "node_slots",                   NONE,  "slots",      "Slots of this node's pool", s->residency.slots) \
	X(slots_used,        GAUGE,   "node_slots_used",              NONE,  "used",       "Slots of this node's pool in use", s->residency.slots_used) \
	X(hits,              COUNTER, "node_expert_hits",             NONE,  "hits",       "Demands of this node's slices found resident", s->residency.hits) \
	X(cold_misses,       COUNTER, "node_expert_cold_misses",      NONE,  "cold",       "Demands of this node's slices that started a read", s->residency.cold_misses) \
	X(inflight_misses,   COUNTER, "node_expert_inflight_misses",  NONE,  "inflight",   "Demands of this node's slices that waited for a read", s->residency.inflight_misses) \
	X(loader_bytes_read, COUNTER, "node_loader_read_bytes",       BYTES, "read_B",     "Bytes this node's loader read", s->residency.bytes_read) \
	X(evictions,         COUNTER, "node_evictions",               NONE,  "evicted",    "Experts evicted from this node's pool", s->residency.evictions) \
	X(failed_experts,    GAUGE,   "node_failed_experts",          NONE,  "failed",     "Experts whose last load failed on this node, now", s->residency.failed_now)

/* X(json_key, kind, prom_name, unit, column, help, source); label layer */
#define STATS_LAYER_FIGURES(X) \
	X(requests,        COUNTER, "layer_requests",               NONE,  "requests", "FORWARD requests of this layer", s->requests) \
	X(tokens,          COUNTER, "layer_tokens",                 NONE,  "tokens",   "Token rows of this layer's FORWARDs that succeeded", s->tokens) \
	X(hits,            COUNTER, "layer_expert_hits",            NONE,  "hits",     "This layer's expert demands found resident", s->hits) \
	X(cold_misses,     COUNTER, "layer_expert_cold_misses",     NONE,  "cold",     "This layer's expert demands that started a read", s->cold_misses) \
	X(inflight_misses, COUNTER, "layer_expert_inflight_misses", NONE,  "inflight", "This layer's expert demands that waited for a read", s->inflight_misses) \
	X(bytes_read,      COUNTER, "layer_demand_read_bytes",      BYTES, "read_B",   "Bytes read for this layer's cold misses", s->bytes_read) \
	X(failures,        COUNTER, "layer_request_failures",       NONE,  "failures", "This layer's FORWARDs that completed with an error", s->failures)

/* H(json_key, index, prom_name, column, help): latency histograms per layer, of the requests
 * that succeeded, in seconds (recorded in whole µs); index: enum forward_lat */
#define STATS_LATENCIES(H) \
	H(queue_us,   FORWARD_LAT_QUEUE,   "queue_wait_seconds",       "queue", "Time a FORWARD waited for the engine (another one running)") \
	H(io_us,      FORWARD_LAT_IO,      "io_wait_seconds",          "io",    "Time a FORWARD waited for expert reads with nothing to compute") \
	H(compute_us, FORWARD_LAT_COMPUTE, "compute_seconds",          "comp",  "Time a FORWARD computed its experts") \
	H(total_us,   FORWARD_LAT_TOTAL,   "request_duration_seconds", "total", "Time a FORWARD spent in the engine, deferred experts included")
/* clang-format on */

#endif
