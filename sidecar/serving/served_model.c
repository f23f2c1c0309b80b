/* served_model.c — catalog + probes + forward engine for `serve MODEL` (see served_model.h).
 *
 * The budget rule, under the memory limit (the lower of the cgroup's limit and --mem-limit,
 * else the host's MemTotal less others' unreclaimable memory: memlimit.h) less what the process
 * held before the model: an explicit
 * --mem-budget (bytes, or a percentage of the expert bytes) must fit there with the engine's
 * request buffers, or the start is refused saying what fits; otherwise the engine gets 3/4 of
 * it, its request buffers first, and its slot pools every expert when they fit, else the rest.
 * The quarter left over is for the channels (accounted at each handshake: forward_queue.c).
 */
#include "served_model.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "catalog.h"
#include "forward.h"
#ifdef MOE_TEST_HOOKS
#include "forward_internal.h" /* forward_create_with_fault_hook */
#endif
#include "log.h"
#include "memlimit.h"
#include "moe_kernels.h" /* MOEK_SWIGLU_OAI_ALPHA */
#include "moe_proto.h"
#include "pagecache.h"
#include "policy.h"
#include "progress.h"

struct serve_model {
	struct serve_model_desc desc;
	struct moe_catalog *cat;
	struct forward_engine *engine;
	struct pagecache_probes *probes;
	struct forward_layer_stats *layer_stats; /* forward_stats_layers() entries */
	uint32_t n_layer_stats;
#ifdef MOE_TEST_HOOKS
	int32_t fail_layer, fail_expert;
	uint32_t fail_loads;
#endif
	struct progress warm;
	bool warm_started;
	void (*status)(void *arg, const char *sentence);
	void *status_arg;
	uint32_t status_percent; /* the last percent said, +1 (0: none yet) */
};

static int parse_numa(const char *spec, struct forward_config *fc, struct sidecar_error *err)
{
	if (!spec || !strcmp(spec, "auto")) {
		fc->numa = FORWARD_NUMA_AUTO;
		return 0;
	}
	if (!strncmp(spec, "synthetic:", 10)) {
		fc->numa = FORWARD_NUMA_SYNTHETIC;
		fc->numa_synthetic = spec + 10;
		return 0;
	}
	fc->numa = FORWARD_NUMA_LIST;
	const char *p = spec;
	while (*p) {
		char *end;
		errno = 0;
		unsigned long v = strtoul(p, &end, 10);
		if (end == p || errno || v > 4095 || (*end && *end != ',') ||
		    fc->numa_list_len >= FORWARD_MAX_NODES)
			return error_set(
			    err, MOE_EINVAL,
			    "--numa '%s': expected auto, a list of at most %u node numbers "
			    "(0,1) or synthetic:<hwloc spec>",
			    spec, FORWARD_MAX_NODES);
		fc->numa_list[fc->numa_list_len++] = (uint32_t)v;
		p = *end ? end + 1 : end;
	}
	if (!fc->numa_list_len)
		return error_set(err, MOE_EINVAL, "--numa '%s': empty node list", spec);
	return 0;
}

int serve_model_check_config(const struct serve_model_config *cfg, struct sidecar_error *err)
{
	struct forward_config fc = {.threads_per_node = cfg->threads};
	if (parse_numa(cfg->numa, &fc, err) != 0)
		return -1;
	struct sidecar_error why;
	if (fc.numa != FORWARD_NUMA_AUTO && forward_check_topology(&fc, &why) != 0)
		return strncmp(why.msg, "--numa", 6)
		           ? error_set(err, MOE_EINVAL, "--numa %s: %s", cfg->numa, why.msg)
		           : error_set(err, MOE_EINVAL, "%s", why.msg);
	struct policy_spec spec;
	struct sidecar_error cause = {0};
	if (cfg->policy && policy_spec_parse(cfg->policy, &spec, &cause) != 0)
		return error_set(err, cause.status, "--%s",
		                 cause.msg); /* "--policy 'x': unknown …" */
	if (cfg->probes_instance &&
	    pagecache_check_instance_name(cfg->probes_instance, &cause) != 0)
		return error_set(err, cause.status, "--probes-instance: %s", cause.msg);
	return 0;
}

static void warm_progress(void *arg, const char *what, uint64_t done, uint64_t total)
{
	struct serve_model *m = arg;
	if (!m->warm_started) {
		progress_begin_log(&m->warm, "serve", what, total,
		                   strstr(what, "layers") ? "layers" : "experts");
		m->warm_started = true;
	}
	progress_update(&m->warm, done);
	const uint32_t percent = total ? (uint32_t)(done * 100 / total) : 100;
	if (m->status && percent + 1 != m->status_percent) {
		m->status_percent = percent + 1;
		char said[96];
		snprintf(said, sizeof(said), "warming up: %s %llu of %llu, %u%%", what,
		         (unsigned long long)done, (unsigned long long)total, percent);
		m->status(m->status_arg, said);
	}
	if (done >= total) {
		progress_end(&m->warm);
		m->warm_started = false;
	}
}

#ifdef MOE_TEST_HOOKS
/* Test hook: the reads of the chosen expert fail with EIO, in its first fail_loads loads (all
 * when 0). info->layer is the MoE layer, as is fail_layer. */
static int fail_reads_of_expert(void *arg, const struct loader_read_info *info, int res)
{
	const struct serve_model *m = arg;
	if ((int32_t)info->layer == m->fail_layer && (int32_t)info->expert == m->fail_expert &&
	    (m->fail_loads == 0 || info->failed_loads < m->fail_loads))
		return -EIO;
	return res;
}

/* Test hook (--debug-hold-populate): each populate thread waits for end-of-file on the fd
 * before it starts (later calls find it at once). */
static void hold_populate_until_eof(void *arg, uint32_t node, uint32_t group)
{
	(void)node;
	(void)group;
	const int fd = (int)(intptr_t)arg;
	char b;
	ssize_t n;
	while ((n = read(fd, &b, 1)) > 0 || (n < 0 && errno == EINTR))
		;
}
#endif

/* The budget rule (this file's header): the expert bytes asked for and the memory the limit
 * leaves the engine. engine_limit is forward_config's mem_limit, where 0 means "no limit",
 * so none left is one byte, which nothing fits in: the engine then refuses it as it refuses
 * any limit too small for its request buffers. */
struct budget_rule {
	uint64_t expert_bytes, budget;
	const char *why;
	bool asked;
	uint64_t engine_bytes; /* what the limit leaves the engine; 0 when it holds none */
	uint64_t engine_limit;
};

static int budget_rule(const struct serve_model_config *cfg, uint64_t expert_bytes,
                       struct budget_rule *r, struct sidecar_error *err)
{
	/* Budget: asked for, or every expert if the engine fits them in 3/4 of the memory limit
	 * (less what the process held before the model), else what fits (forward_config's
	 * mem_limit). The quarter left is for channels and the rest of the process. */
	*r = (struct budget_rule){
	    .expert_bytes = expert_bytes,
	    .budget = expert_bytes,
	    .why = "every expert if they fit in 3/4 of the memory limit, else what does",
	    .asked = cfg->mem_budget_bytes || cfg->mem_budget_percent > 0,
	};
	if (cfg->mem_budget_bytes) {
		r->budget = cfg->mem_budget_bytes;
		r->why = "--mem-budget";
	} else if (cfg->mem_budget_percent > 0) {
		r->budget = (uint64_t)((double)expert_bytes * cfg->mem_budget_percent / 100.0);
		r->why = "--mem-budget percent of the expert bytes";
	}
	if (r->asked && cfg->mem_total && r->budget > cfg->mem_total)
		return error_set(
		    err, MOE_EINVAL,
		    "--mem-budget %" PRIu64 " bytes (%.1f GiB) is above this machine's physical "
		    "memory, MemTotal %" PRIu64 " bytes (%.1f GiB): give at most what the "
		    "sidecar can hold, or leave the budget to auto",
		    r->budget, (double)r->budget / (1u << 30), cfg->mem_total,
		    (double)cfg->mem_total / (1u << 30));
	if (cfg->mem_limit) {
		r->engine_bytes =
		    cfg->mem_limit > cfg->mem_base ? cfg->mem_limit - cfg->mem_base : 0;
		if (!r->asked)
			r->engine_bytes = r->engine_bytes / 4 * 3;
		r->engine_limit = r->engine_bytes ? r->engine_bytes : 1;
	}
	return 0;
}

/* The engine's configuration for cfg under the rule's budget (no progress callback). */
static int forward_config_of(const struct serve_model_config *cfg, const struct budget_rule *r,
                             uint32_t max_top_k, struct forward_config *fc,
                             struct sidecar_error *err)
{
	*fc = (struct forward_config){
	    .source = FORWARD_SOURCE_RESIDENCY,
	    .mem_budget = r->budget >= r->expert_bytes ? 0 : r->budget,
	    .mem_limit = r->engine_limit,
	    .keep_budget = r->asked,
	    .policy = cfg->policy,
	    .pin_layers = cfg->pin_layers,
	    .no_direct = cfg->no_direct,
	    .pool_pages_auto = cfg->pool_pages_auto,
	    .retry_backoff_ms =
	        cfg->retry_without_backoff ? RESIDENCY_NO_BACKOFF : cfg->retry_backoff_ms,
	    .retry_backoff_max_ms = cfg->retry_backoff_max_ms,
	    .file_layout = cfg->file_layout,
	    .shareable_pool = cfg->leases,
	    .threads_per_node = cfg->threads,
	    .max_tokens = cfg->max_tokens,
	    .max_ids_per_token = max_top_k,
	};
	return parse_numa(cfg->numa, fc, err);
}

int serve_model_plan_budget(const struct serve_model_config *cfg, const struct moe_catalog *cat,
                            struct serve_model_budget *out, struct sidecar_error *err)
{
	memset(out, 0, sizeof(*out));
	struct budget_rule br;
	struct forward_config fc;
	if (budget_rule(cfg, cat->expert_bytes_total, &br, err) != 0 ||
	    forward_config_of(cfg, &br, cfg->max_top_k ? cfg->max_top_k : cat->info.top_k, &fc,
	                      err) != 0)
		return -1;
	out->expert_bytes = br.expert_bytes;
	out->asked_bytes = br.budget;
	out->from = br.why;
	out->engine_bytes = br.engine_bytes;
	struct sidecar_error why;
	if (forward_plan_budget(cat, &fc, &out->engine, &why) != 0)
		return error_set(err, why.status, "%s: %s", cfg->path, why.msg);
	return 0;
}

static void describe(struct serve_model *m, const struct serve_model_config *cfg)
{
	const struct moe_catalog *cat = m->cat;
	struct serve_model_desc *d = &m->desc;
	d->n_layers = cat->info.n_layers;
	d->n_moe_layers = cat->info.n_moe_layers;
	d->n_experts = cat->info.n_experts;
	d->top_k = cat->info.top_k;
	d->hidden = (uint32_t)cat->info.hidden;
	d->expert_ffn = (uint32_t)cat->info.expert_ffn;
	d->swiglu_limit = cat->info.swiglu_limit;
	d->swiglu_alpha = cat->info.swiglu_limit > 0 ? MOEK_SWIGLU_OAI_ALPHA : 0.0f;
	d->weight_on_input = cat->info.weight_on_input;
	d->expert_bytes = cat->expert_bytes_total;
	d->max_tokens = cfg->max_tokens;
	d->max_top_k = cfg->max_top_k ? cfg->max_top_k : cat->info.top_k;
	bool first = true;
	for (uint32_t l = 0; l < cat->info.n_layers; l++) {
		if (!cat->layers[l].moe)
			continue;
		if (first)
			d->first_moe_layer = l;
		first = false;
		d->last_moe_layer = l;
		if (l < MOE_LAYER_BITMAP_LAYERS)
			d->moe_layers[l / 8] |= (uint8_t)(1u << (l % 8));
	}
	snprintf(d->name, sizeof(d->name), "%s", moe_arch_name(cat->info.arch));
}

/* The catalog, the description and the fingerprint; before the probes attach, so that the
 * fingerprint's few O_DIRECT reads are no loader's. */
static int open_catalog(struct serve_model *m, const struct serve_model_config *cfg,
                        struct sidecar_error *err)
{
	if (moe_catalog_open(cfg->path, &m->cat, err) != 0)
		return -1;
	describe(m, cfg);
	if (m->desc.n_moe_layers == 0)
		return error_set(err, MOE_EINVAL, "%s: no layer has routed experts", cfg->path);
	if (m->desc.hidden > 65536)
		return error_set(err, MOE_EINVAL,
		                 "%s: hidden size %u is above the protocol's 65536", cfg->path,
		                 m->desc.hidden);
	char fwhy[256];
	const int fprc = moe_fingerprint_path(cfg->path, m->desc.fingerprint, fwhy, sizeof(fwhy));
	if (fprc != MOE_OK)
		return error_set(err, fprc, "model fingerprint: %s", fwhy);
	moe_fingerprint_hex(m->desc.fingerprint, m->desc.fingerprint_hex);
	log_info("serve", "model fingerprint=%s files=%u", m->desc.fingerprint_hex,
	         m->cat->n_files);
	return 0;
}

/* Probes first: every model file is watched before the first expert read. Quiet: the one
 * warning when they are unavailable is ours, with a hint when another sidecar owns the
 * instance name (two sidecars on one host need one name each). */
static int attach_probes(struct serve_model *m, const struct serve_model_config *cfg,
                         struct sidecar_error *err)
{
	struct pagecache_options popt = {.instance = cfg->probes_instance, .quiet = true};
	struct sidecar_error perr = {0};
	if (pagecache_open(&popt, &m->probes, &perr) != 0)
		return error_set(err, perr.status, "probes: %s", perr.msg);
	if (!pagecache_available(m->probes)) {
		char hint[200] = "";
		if (pagecache_busy_owner(m->probes))
			snprintf(
			    hint, sizeof(hint),
			    "; another sidecar owns probe instance '%s': give this one its own "
			    "with --probes-instance NAME",
			    cfg->probes_instance ? cfg->probes_instance : "default");
		if (cfg->require_probes)
			return error_set(err, MOE_ESYS, "--require-probes: page-cache probes %s%s",
			                 pagecache_status(m->probes), hint);
		log_warn("probes", "page-cache probes %s%s", pagecache_status(m->probes), hint);
	}
	for (uint32_t i = 0; i < m->cat->n_files; i++) {
		int rc = pagecache_watch(m->probes, m->cat->files[i].path);
		if (rc < 0 && pagecache_available(m->probes))
			log_warn("serve", "probes: watching %s: %s", m->cat->files[i].path,
			         pagecache_last_error(m->probes));
	}
	return 0;
}

#ifdef MOE_TEST_HOOKS
/* --debug-fail-expert: the loader's read-fault hook, said once in the log; NULL without. */
static loader_fault_fn fault_hook_of(const struct serve_model_config *cfg)
{
	if (cfg->fail_layer < 0)
		return NULL;
	if (cfg->fail_loads)
		log_warn("serve",
		         "testing: the first %u load(s) of layer %d expert %d will fail with EIO",
		         cfg->fail_loads, cfg->fail_layer, cfg->fail_expert);
	else
		log_warn("serve", "testing: every read of layer %d expert %d will fail with EIO",
		         cfg->fail_layer, cfg->fail_expert);
	return fail_reads_of_expert;
}
#endif

/* The engine over the catalog, within the budget and the memory limit. The budget in force
 * is logged by the engine once its pools exist (budget_bytes, as STATS reports it); here,
 * what it was asked for. */
static int create_engine(struct serve_model *m, const struct serve_model_config *cfg,
                         struct sidecar_error *err)
{
	struct budget_rule br;
	if (budget_rule(cfg, m->cat->expert_bytes_total, &br, err) != 0)
		return -1;
	struct forward_config fc;
	if (forward_config_of(cfg, &br, m->desc.max_top_k, &fc, err) != 0)
		return -1;
	fc.progress = warm_progress;
	fc.progress_arg = m;
#ifdef MOE_TEST_HOOKS
	loader_fault_fn hook = fault_hook_of(cfg);
	loader_populate_fn hold = NULL;
	if (cfg->hold_populate) {
		log_warn("serve",
		         "testing: the slot pools are populated once fd %d reaches "
		         "end-of-file",
		         cfg->hold_populate_fd);
		hold = hold_populate_until_eof;
	}
#endif
	log_info("serve",
	         "model path=%s arch=%s layers=%u moe_layers=%u experts=%u top_k=%u hidden=%u "
	         "ffn=%u expert_bytes=%" PRIu64 " budget_asked=%" PRIu64 " budget_from=\"%s\"",
	         cfg->path, m->desc.name, m->desc.n_layers, m->desc.n_moe_layers, m->desc.n_experts,
	         m->desc.top_k, m->desc.hidden, m->desc.expert_ffn, br.expert_bytes, br.budget,
	         br.why);
	if (br.engine_limit)
		log_info("serve",
		         "memory the engine may use: %" PRIu64 " bytes (the limit %" PRIu64
		         " less %" PRIu64 " held before the model%s)",
		         br.engine_bytes, cfg->mem_limit, cfg->mem_base,
		         br.asked ? "" : ", 3/4 of it: a quarter stays for channels");
	struct sidecar_error ferr;
#ifdef MOE_TEST_HOOKS
	const int frc = forward_create_with_hooks(&m->engine, m->cat, &fc, hook, m, hold,
	                                          (void *)(intptr_t)cfg->hold_populate_fd, &ferr);
#else
	const int frc = forward_create(&m->engine, m->cat, &fc, &ferr);
#endif
	if (frc == 0)
		return 0;
	/* forward_create still reports through a buffer: its sentence, under our status */
	if (frc == -ENOSPC)
		return error_set(err, MOE_ENOMEM,
		                 "%s: %s; the engine may use the memory limit of %" PRIu64
		                 " bytes (%s) less %" PRIu64
		                 " held before the model%s: raise the limit "
		                 "(--mem-limit, the cgroup's), lower --max-tokens or the budget",
		                 cfg->path, ferr.msg, cfg->mem_limit, cfg->mem_limit_from,
		                 cfg->mem_base, br.asked ? "" : ", 3/4 of it");
	return error_set(err, ferr.status, "%s: %s", cfg->path, ferr.msg);
}

/* One decode step routes every MoE layer's top-k: a pool of fewer slots evicts experts the
 * same step used, so no expert survives to the next step unless fewer distinct ones were
 * routed — at most slots / (layers x top-k) of a step's experts can hit. */
static void log_slots_against_a_step(const struct serve_model *m, const struct forward_stats *st)
{
	const uint64_t step_experts = (uint64_t)m->desc.n_moe_layers * m->desc.top_k;
	const uint64_t all_experts = (uint64_t)m->desc.n_moe_layers * m->desc.n_experts;
	const uint32_t slots = st->residency.slots;
	if (slots && slots < all_experts && slots < step_experts)
		log_warn("serve",
		         "the budget holds %u expert slots, fewer than one decode step routes "
		         "(%u MoE layers x top-%u = %" PRIu64 "): every step reloads experts it "
		         "used, expect a hit rate of at most %.0f%%; a budget of %" PRIu64
		         " bytes or more holds a step",
		         slots, m->desc.n_moe_layers, m->desc.top_k, step_experts,
		         100.0 * (double)slots / (double)step_experts,
		         st->budget_bytes / slots * step_experts);
	else if (slots && slots < all_experts)
		log_info("serve",
		         "the budget holds %u expert slots: %.1f%% of the model's %" PRIu64
		         " experts, %.1f decode steps' worth (%" PRIu64 " experts a step)",
		         slots, 100.0 * (double)slots / (double)all_experts, all_experts,
		         (double)slots / (double)step_experts, step_experts);
}

/* What the warm engine holds: budget, memory, NUMA nodes, the per-layer stats buffer; logged. */
static int record_what_is_held(struct serve_model *m, const struct serve_model_config *cfg,
                               struct sidecar_error *err)
{
	struct forward_stats st = {0};
	forward_stats(m->engine, &st);
	m->desc.budget_bytes = st.budget_bytes;
	log_slots_against_a_step(m, &st);
	m->desc.mem_limit_bytes = cfg->mem_limit;
	snprintf(m->desc.mem_limit_from, sizeof(m->desc.mem_limit_from), "%s",
	         cfg->mem_limit_from ? cfg->mem_limit_from : "");
	/* The slot pools are pre-faulted behind READY: what RSS does not hold of them yet is held
	 * all the same. Their resident pages are counted before RSS is read (a page once resident
	 * stays), so a page faulted in between counts twice, never none. */
	const uint64_t pool_resident = forward_pool_resident_bytes(m->engine);
	const uint64_t rss = mem_rss_self();
	const uint64_t unpopulated = st.residency.pool_groups && st.pool_bytes > pool_resident
	                                 ? st.pool_bytes - pool_resident
	                                 : 0;
	m->desc.mem_fixed_bytes = rss + unpopulated + st.request_bytes;
	struct forward_topology_info topo;
	forward_topology(m->engine, &topo);
	m->desc.n_nodes = topo.n_nodes;
	for (uint32_t i = 0; i < topo.n_nodes; i++)
		log_info("serve",
		         "numa node=%u os_index=%u threads=%u synthetic=%d memory_bound=%d", i,
		         topo.node_os_index[i], topo.threads[i], topo.synthetic, topo.memory_bound);
	m->n_layer_stats = forward_stats_layers(m->engine);
	m->layer_stats = calloc(m->n_layer_stats ? m->n_layer_stats : 1, sizeof(*m->layer_stats));
	if (!m->layer_stats)
		return error_set(err, MOE_ENOMEM, "out of memory");
	log_info("serve", "probes %s", pagecache_status(m->probes));
	log_info("serve",
	         "memory held_bytes=%" PRIu64 " (resident %" PRIu64 " + slot pools not yet "
	         "populated %" PRIu64 " + request buffers %" PRIu64 ") limit_bytes=%" PRIu64
	         " left_for_channels=%" PRIu64,
	         m->desc.mem_fixed_bytes, rss, unpopulated, st.request_bytes, cfg->mem_limit,
	         cfg->mem_limit > m->desc.mem_fixed_bytes ? cfg->mem_limit - m->desc.mem_fixed_bytes
	                                                  : 0);
	return 0;
}

int serve_model_open(const struct serve_model_config *cfg, struct serve_model **out,
                     struct sidecar_error *err)
{
	*out = NULL;
	struct serve_model *m = calloc(1, sizeof(*m));
	if (!m)
		return error_set(err, MOE_ENOMEM, "out of memory");
#ifdef MOE_TEST_HOOKS
	m->fail_layer = cfg->fail_layer;
	m->fail_expert = cfg->fail_expert;
	m->fail_loads = cfg->fail_loads;
#endif
	m->status = cfg->status;
	m->status_arg = cfg->status_arg;
	if (m->status)
		m->status(m->status_arg, "reading the model's catalog and fingerprint");
	if (open_catalog(m, cfg, err) != 0 || attach_probes(m, cfg, err) != 0 ||
	    create_engine(m, cfg, err) != 0 || record_what_is_held(m, cfg, err) != 0) {
		serve_model_close(m);
		return -1;
	}
	*out = m;
	return 0;
}

void serve_model_close(struct serve_model *m)
{
	if (!m)
		return;
	if (m->engine)
		forward_destroy(m->engine);
	if (m->probes)
		pagecache_close(m->probes);
	if (m->cat)
		moe_catalog_close(m->cat);
	free(m->layer_stats);
	free(m);
}

const struct serve_model_desc *serve_model_desc(const struct serve_model *m)
{
	return &m->desc;
}

bool serve_model_is_moe_layer(const struct serve_model *m, int32_t layer)
{
	return layer >= 0 && (uint32_t)layer < m->cat->info.n_layers && m->cat->layers[layer].moe;
}

int32_t serve_model_next_moe_layer(const struct serve_model *m, int32_t layer)
{
	for (int32_t l = layer + 1; l >= 0 && (uint32_t)l < m->cat->info.n_layers; l++)
		if (m->cat->layers[l].moe)
			return l;
	return -1;
}

struct forward_engine *serve_model_engine(struct serve_model *m)
{
	return m->engine;
}

/* ---- STATS ----------------------------------------------------------------------------- */

void serve_model_collect(struct serve_model *m, const struct stats_sources *x, struct stats_doc *d)
{
	struct forward_stats stats;
	memset(&stats, 0, sizeof(stats));
	stats.layers = m->layer_stats;
	forward_stats(m->engine, &stats);
	const struct forward_stats *st = &stats;
	const struct serve_model_desc *desc = &m->desc;
	struct pagecache_stats probes = {0};
	const struct pagecache_stats *ps = &probes;
	const struct trace_recorder_stats none = {0};
	const struct trace_recorder_stats *ts = x->trace ? x->trace : &none;
	d->groups = STATS_ALWAYS;
	if (pagecache_available(m->probes) && pagecache_read_totals(m->probes, &probes) == 0)
		d->groups |= STATS_PROBES;
	if (x->trace)
		d->groups |= STATS_TRACE;
	snprintf(d->model, sizeof(d->model), "%s", desc->name);
	snprintf(d->fingerprint, sizeof(d->fingerprint), "%s", desc->fingerprint_hex);
#define COLLECT(key, kind, type, group, prom, unit, help, src)                                     \
	d->g[STATS_G_##key] =                                                                      \
	    STATS_##type == STATS_F64 ? stats_doc_f64_bits((double)(src)) : (uint64_t)(src);
	STATS_GLOBAL_FIGURES(COLLECT)
#undef COLLECT
	d->n_nodes = st->n_nodes < FORWARD_MAX_NODES ? st->n_nodes : FORWARD_MAX_NODES;
	for (uint32_t n = 0; n < d->n_nodes; n++) {
		const struct forward_node_stats *s = &st->nodes[n];
		struct stats_node *to = &d->nodes[n];
		to->node = s->node;
		to->os_index = s->os_index;
#define COLLECT(key, kind, prom, unit, column, help, src) to->v[STATS_N_##key] = (src);
		STATS_NODE_FIGURES(COLLECT)
#undef COLLECT
	}
	d->n_layers = 0;
	for (uint32_t l = 0; l < st->n_layers && d->n_layers < d->cap_layers; l++) {
		const struct forward_layer_stats *s = &st->layers[l];
		if (s->requests == 0)
			continue;
		struct stats_layer *to = &d->layers[d->n_layers++];
		to->layer = s->layer;
#define COLLECT(key, kind, prom, unit, column, help, src) to->v[STATS_L_##key] = (src);
		STATS_LAYER_FIGURES(COLLECT)
#undef COLLECT
#define COLLECT(key, index, prom, column, help) to->lat[STATS_H_##key] = s->lat[index];
		STATS_LATENCIES(COLLECT)
#undef COLLECT
	}
}

void serve_model_stats_json(struct serve_model *m, const struct stats_doc *d, struct json_writer *w)
{
	/* What is not a figure: the activation an engine checks its own against, and the
	 * probes' state in words. Then every figure (stats_table.h). */
	jw_kv_double(w, "swiglu_limit", (double)m->desc.swiglu_limit, JW_SHORT);
	jw_kv_double(w, "swiglu_alpha", (double)m->desc.swiglu_alpha, JW_SHORT);
	jw_kv_bool(w, "weight_on_input", m->desc.weight_on_input);
	if (d->groups & STATS_PROBES) {
		jw_kv_string(w, "probes", "active");
	} else {
		char why[300];
		const char *status = pagecache_status(m->probes);
		if (!strncmp(status, "unavailable: ", 13))
			status += 13;
		snprintf(why, sizeof(why), "probes unavailable: %s", status);
		jw_kv_string(w, "probes", why);
	}
	stats_doc_write_json(d, w);
}
