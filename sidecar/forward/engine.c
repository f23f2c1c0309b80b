/* engine.c — the forward engine's life and entry: create/destroy (topology, pools, weights,
 * request plans), forward_run (take the engine, validate and plan: plan.c; execute: waves.c;
 * the final sums) and the test oracle's access to the engine. Contracts are in forward.h.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "forward_internal.h"
#include "log.h"
#include "moe_abi.h"

/* ---- create / destroy ----------------------------------------------------------------- */

/* Largest scratch any expert needs for n tokens on `workers` workers. */
static size_t max_scratch(struct forward_engine *e, size_t n, unsigned workers)
{
	size_t best = 0;
	for (uint32_t l = 0; l < e->w.n_moe_layers; l++) {
		struct moek_expert v;
		if (weights_shape_view(&e->w, l, 0, &v, NULL) != 0)
			continue;
		size_t s = moek_ffn_scratch_bytes(&v, n, workers);
		if (s > best)
			best = s;
	}
	return best;
}

/* One log line per weight format of the model: the kernels the active ISA runs for it. */
static void log_format_paths(const struct forward_engine *e)
{
	uint32_t seen[8];
	unsigned n_seen = 0;
	for (uint32_t l = 0; l < e->w.n_moe_layers; l++) {
		struct moek_expert v;
		if (weights_shape_view(&e->w, l, 0, &v, NULL) != 0)
			continue;
		const uint32_t formats[3] = {v.gate.format, v.up.format, v.down.format};
		for (unsigned i = 0; i < 3; i++) {
			bool known = false;
			for (unsigned j = 0; j < n_seen; j++)
				known |= seen[j] == formats[i];
			if (known || n_seen == sizeof(seen) / sizeof(seen[0]))
				continue;
			seen[n_seen++] = formats[i];
			char path[192];
			log_info("forward", "kernels: isa=%s %s", moek_isa_name(),
			         moek_isa_format_path(formats[i], path, sizeof(path)));
		}
	}
}

/* Decode-sized requests (at most this many tokens) may leave their deferred wave running
 * behind them: the second plan, for the request after, is sized for them. */
#define ASYNC_MAX_TOKENS 16u

/* What a request plan for `tokens` tokens holds: alloc_ctx allocates it, forward_plan_budget
 * counts it without allocating. full: the largest expert's scratch (0: no usable expert). */
struct ctx_size {
	size_t pairs, groups, full, scratch_bytes, bytes;
};

static void ctx_size(struct forward_engine *e, uint32_t tokens, unsigned workers,
                     struct ctx_size *s)
{
	const uint32_t n_experts = e->cat->info.n_experts;
	const size_t P = (size_t)tokens * e->max_k;
	s->pairs = P;
	s->groups = P < n_experts ? P : n_experts;
	s->full = max_scratch(e, P, workers);
	s->scratch_bytes = 2 * s->full + ((size_t)8 << 20);
	s->bytes = P * (1 + sizeof(uint32_t) + sizeof(uint16_t) + sizeof(float)) +
	           e->max_k * sizeof(uint16_t) + (size_t)tokens * 2 * sizeof(uint32_t) +
	           ((size_t)n_experts + 1) * sizeof(uint32_t) + n_experts +
	           s->groups * (sizeof(*e->ctx[0].groups) + sizeof(*e->ctx[0].held) +
	                        sizeof(*e->ctx[0].wave) + sizeof(uint32_t)) +
	           2 * align_up_64(P * e->hidden * sizeof(float)) + align_up_64(s->scratch_bytes);
}

static int alloc_ctx(struct forward_engine *e, struct req_ctx *c, uint32_t tokens,
                     struct sidecar_error *err)
{
	const uint32_t n_experts = e->cat->info.n_experts;
	struct ctx_size s;
	ctx_size(e, tokens, e->pool.n_workers, &s);
	const size_t P = s.pairs, full = s.full;
	c->max_tokens = tokens;
	c->max_pairs = (uint32_t)P;
	c->max_groups = (uint32_t)s.groups;
	c->pos_kind = calloc(P, 1);
	c->pos_slot = calloc(P, sizeof(uint32_t));
	c->tok_order = calloc(P, sizeof(uint16_t));
	c->order_tmp = calloc(e->max_k, sizeof(uint16_t));
	c->tok_n_valid = calloc(tokens, sizeof(uint32_t));
	c->tok_n_imm = calloc(tokens, sizeof(uint32_t));
	c->key_count = calloc((size_t)n_experts + 1, sizeof(uint32_t));
	c->expert_has_immediate = calloc(n_experts, 1);
	c->groups = calloc(c->max_groups, sizeof(*c->groups));
	c->held = calloc(c->max_groups, sizeof(*c->held));
	c->wave = calloc(c->max_groups, sizeof(*c->wave));
	c->wave_group_of = calloc(c->max_groups, sizeof(uint32_t));
	c->xg = aligned_alloc(64, align_up_64(P * e->hidden * sizeof(float)));
	c->yg = aligned_alloc(64, align_up_64(P * e->hidden * sizeof(float)));
	c->wg = calloc(P, sizeof(float));
	c->scratch_bytes = s.scratch_bytes;
	c->scratch = aligned_alloc(64, align_up_64(c->scratch_bytes));
	c->bytes = s.bytes;
	if (!c->pos_kind || !c->pos_slot || !c->tok_order || !c->order_tmp || !c->tok_n_valid ||
	    !c->tok_n_imm || !c->key_count || !c->expert_has_immediate || !c->groups || !c->held ||
	    !c->wave || !c->wave_group_of || !c->xg || !c->yg || !c->wg || !c->scratch ||
	    full == 0) {
		error_set(err, MOE_ENOMEM,
		          "forward engine: request buffers for %u tokens x %u ids: %s", tokens,
		          e->max_k, full ? "out of memory" : "no usable expert");
		return -1;
	}
	return 0;
}

static void free_ctx(struct req_ctx *c)
{
	free(c->pos_kind);
	free(c->pos_slot);
	free(c->tok_order);
	free(c->order_tmp);
	free(c->tok_n_valid);
	free(c->tok_n_imm);
	free(c->key_count);
	free(c->expert_has_immediate);
	free(c->groups);
	free(c->held);
	free(c->wave);
	free(c->wave_group_of);
	free(c->xg);
	free(c->yg);
	free(c->wg);
	free(c->scratch);
}

/* The second plan, for the request behind a deferred wave: none with one worker (nothing
 * runs behind the caller), else decode-sized. 0: none. */
static uint32_t second_plan_tokens(const struct forward_engine *e, unsigned workers)
{
	if (workers <= 1)
		return 0;
	return e->max_tokens < ASYNC_MAX_TOKENS ? e->max_tokens : ASYNC_MAX_TOKENS;
}

static int alloc_plan(struct forward_engine *e, struct sidecar_error *err)
{
	if (alloc_ctx(e, &e->ctx[0], e->max_tokens, err) != 0)
		return -1;
	e->max_pairs = e->ctx[0].max_pairs;
	e->max_groups = e->ctx[0].max_groups;
	e->rq = &e->ctx[0];
	const uint32_t second = second_plan_tokens(e, e->pool.n_workers);
	if (second && alloc_ctx(e, &e->ctx[1], second, err) != 0)
		return -1;
	return 0;
}

/* RESIDENCY under a memory limit `limit` (non-zero): the request buffers (`plan` bytes) come
 * first, the slot pools get what is left. An unset *budget (0) stays 0 when every expert
 * (`every` bytes of slots) fits, else becomes the rest (*cut set), unless keep; a budget
 * given that does not fit is refused, saying what would. 0, or -1 with err. */
static int budget_under_limit(const struct forward_engine *e, uint64_t limit, uint64_t plan,
                              uint64_t every, bool keep, uint64_t *budget, bool *cut,
                              struct sidecar_error *err)
{
	const uint64_t left = limit > plan ? limit - plan : 0;
	*cut = false;
	if (*budget == 0) {
		if (every <= left)
			return 0;
		if (left == 0 || keep) {
			if (left == 0)
				error_set(err, MOE_EINVAL,
				          "the request buffers (%llu bytes for %u tokens x %u ids) "
				          "alone exceed the %llu bytes the engine may use",
				          (unsigned long long)plan, e->max_tokens, e->max_k,
				          (unsigned long long)limit);
			else
				error_set(
				    err, MOE_EINVAL,
				    "every expert needs %llu bytes of slots and the request "
				    "buffers %llu (%u tokens x %u ids): above the %llu bytes the "
				    "engine may use; at most %llu bytes of budget fit",
				    (unsigned long long)every, (unsigned long long)plan,
				    e->max_tokens, e->max_k, (unsigned long long)limit,
				    (unsigned long long)left);
			return -1;
		}
		*budget = left;
		*cut = true;
		return 0;
	}
	if (*budget > left) {
		error_set(err, MOE_EINVAL,
		          "an expert budget of %llu bytes and %llu bytes of request buffers (%u "
		          "tokens x %u ids) exceed the %llu bytes the engine may use; at most %llu "
		          "bytes of budget fit",
		          (unsigned long long)*budget, (unsigned long long)plan, e->max_tokens,
		          e->max_k, (unsigned long long)limit, (unsigned long long)left);
		return -1;
	}
	return 0;
}

/* budget_under_limit for the engine being created, its plans allocated. */
static int fit_budget(struct forward_engine *e, struct forward_config *c, struct sidecar_error *err)
{
	if (!c->mem_limit)
		return 0;
	const uint64_t plan = e->ctx[0].bytes + e->ctx[1].bytes;
	const uint64_t every = weights_every_expert_bytes(&e->w);
	bool cut;
	if (budget_under_limit(e, c->mem_limit, plan, every, c->keep_budget, &c->mem_budget, &cut,
	                       err) != 0)
		return -1;
	if (cut)
		log_info("forward",
		         "expert budget cut to %llu bytes: the engine may use %llu bytes and its "
		         "request buffers take %llu; every expert would need %llu",
		         (unsigned long long)c->mem_budget, (unsigned long long)c->mem_limit,
		         (unsigned long long)plan, (unsigned long long)every);
	return 0;
}

/* The request limits of config against the model: max_tokens >= 1, 1 <= k <= 65535. */
static int engine_limits(struct forward_engine *e, const struct moe_catalog *cat,
                         const struct forward_config *config, struct sidecar_error *err)
{
	if (cat->info.n_moe_layers == 0 || cat->info.n_experts == 0)
		return error_set(err, MOE_EINVAL, "model has no routed experts");
	if (config->max_tokens == 0)
		return error_set(err, MOE_EINVAL, "forward engine: max_tokens must be >= 1");
	e->cat = cat;
	e->cfg = *config;
	e->max_tokens = config->max_tokens;
	e->max_k = config->max_ids_per_token ? config->max_ids_per_token : cat->info.top_k;
	if (e->max_k == 0 || e->max_k > 65535)
		return error_set(err, MOE_EINVAL, "forward engine: ids per token %u out of range",
		                 e->max_k);
	e->hidden = (uint32_t)cat->info.hidden;
	return 0;
}

int forward_plan_budget(const struct moe_catalog *cat, const struct forward_config *config,
                        struct forward_budget *out, struct sidecar_error *err)
{
	memset(out, 0, sizeof(*out));
	struct forward_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return error_set(err, MOE_ENOMEM, "out of memory");
	int rc = engine_limits(e, cat, config, err);
	bool topo_open = false;
	if (rc == 0)
		rc = topology_open(&e->topo, config, err);
	topo_open = rc == 0;
	if (rc == 0)
		rc = weights_open(&e->w, cat, config, &e->topo, err);
	if (rc == 0) {
		const unsigned workers = pool_worker_count(&e->topo);
		struct ctx_size first, second = {0};
		ctx_size(e, e->max_tokens, workers, &first);
		const uint32_t t2 = second_plan_tokens(e, workers);
		if (t2)
			ctx_size(e, t2, workers, &second);
		out->n_workers = workers;
		out->request_bytes = first.bytes + second.bytes;
		out->every_bytes = weights_every_expert_bytes(&e->w);
		out->budget_bytes = config->mem_budget;
		if (config->mem_limit)
			rc = budget_under_limit(e, config->mem_limit, out->request_bytes,
			                        out->every_bytes, config->keep_budget,
			                        &out->budget_bytes, &out->cut, err);
		if (out->budget_bytes == 0)
			out->budget_bytes = out->every_bytes;
	}
	weights_close(&e->w);
	if (topo_open)
		topology_close(&e->topo);
	free(e);
	return rc == 0 ? 0 : -1;
}

int forward_create(struct forward_engine **out, const struct moe_catalog *cat,
                   const struct forward_config *config, struct sidecar_error *err)
{
	return forward_create_with_fault_hook(out, cat, config, NULL, NULL, err);
}

int forward_create_with_fault_hook(struct forward_engine **out, const struct moe_catalog *cat,
                                   const struct forward_config *config, loader_fault_fn hook,
                                   void *hook_arg, struct sidecar_error *err)
{
	return forward_create_with_hooks(out, cat, config, hook, hook_arg, NULL, NULL, err);
}

int forward_create_with_hooks(struct forward_engine **out, const struct moe_catalog *cat,
                              const struct forward_config *config, loader_fault_fn hook,
                              void *hook_arg, loader_populate_fn populate, void *populate_arg,
                              struct sidecar_error *err)
{
	*out = NULL;
	struct forward_engine *e = calloc(1, sizeof(*e));
	if (!e) {
		error_set(err, MOE_ENOMEM, "out of memory");
		return -1;
	}
	if (engine_limits(e, cat, config, err) != 0) {
		free(e);
		return -1;
	}
	pthread_mutex_init(&e->run_lock, NULL);
	pthread_cond_init(&e->run_free, NULL);
	pthread_mutex_init(&e->mask_lock, NULL);
	bool topo_open = false, pool_open = false;
	int status = -1;
	if (topology_open(&e->topo, config, err) != 0)
		goto fail;
	topo_open = true;
	if (weights_open(&e->w, cat, config, &e->topo, err) != 0)
		goto fail;
	e->w.fault_hook = hook;
	e->w.fault_arg = hook_arg;
	e->w.populate_hook = populate;
	e->w.populate_arg = populate_arg;
	e->last_moe_layer = e->w.n_moe_layers - 1;
	{
		const size_t P = (size_t)e->max_tokens * e->max_k;
		const uint32_t g =
		    2 * (uint32_t)(P < cat->info.n_experts ? P : cat->info.n_experts);
		if (pool_create(&e->pool, &e->topo, g, err) != 0)
			goto fail;
		pool_open = true;
	}
	if (alloc_plan(e, err) != 0)
		goto fail;
	if (config->source == FORWARD_SOURCE_RESIDENCY) {
		struct forward_config rc = *config;
		struct sidecar_error why;
		if (fit_budget(e, &rc, err) != 0) {
			status = -ENOSPC;
			goto fail;
		}
		if (weights_start_residency(&e->w, &rc, &e->topo, &why) != 0) {
			if (rc.mem_budget != config->mem_budget) {
				status = -ENOSPC; /* the pools the limit left hold no slot */
				error_set(
				    err, why.status,
				    "%s (of the %llu bytes the engine may use, its request "
				    "buffers leave the expert slots %llu bytes after taking %llu)",
				    why.msg, (unsigned long long)rc.mem_limit,
				    (unsigned long long)rc.mem_budget,
				    (unsigned long long)(e->ctx[0].bytes + e->ctx[1].bytes));
			} else {
				error_pass(err, &why);
			}
			goto fail;
		}
	}
	e->mask_row = (cat->info.n_experts + 7) / 8;
	e->masks = calloc(FORWARD_MAX_CLIENTS, cat->info.n_layers * e->mask_row);
	e->res_mask = calloc(cat->info.n_experts, 1);
	e->masked_now = calloc(cat->info.n_layers, sizeof(uint32_t));
	e->counters = calloc(e->w.n_moe_layers, sizeof(*e->counters));
	e->row_mark = calloc(cat->info.n_experts, sizeof(uint32_t));
	if (!e->masks || !e->res_mask || !e->masked_now || !e->counters || !e->row_mark) {
		error_set(err, MOE_ENOMEM, "out of memory");
		goto fail;
	}
	/* The kernels pick their ISA (and read MOEK_ISA) on first use: do it here, not on the
	 * request path. */
	bool per_pu = true;
	for (uint32_t n = 0; n < e->topo.n_nodes; n++)
		per_pu &= e->topo.nodes[n].pin_per_pu;
	log_info("forward",
	         "engine ready: source=%s%s nodes=%u workers=%u pinned=%s max_tokens=%u k=%u "
	         "isa=%s",
	         config->source == FORWARD_SOURCE_RESIDENCY      ? "residency"
	         : config->source == FORWARD_SOURCE_ALL_RESIDENT ? "all-resident"
	                                                         : "mmap",
	         e->w.sliced ? " (one pool of slices per node)" : "", e->topo.n_nodes,
	         e->pool.n_workers,
	         e->topo.synthetic     ? "no"
	         : per_pu              ? "one-pu-each"
	         : e->topo.n_nodes > 1 ? "node"
	                               : "no",
	         e->max_tokens, e->max_k, moek_isa_name());
	log_format_paths(e);
	*out = e;
	return 0;
fail:
	if (pool_open)
		pool_destroy(&e->pool);
	weights_close(&e->w);
	if (topo_open)
		topology_close(&e->topo);
	e->pool.n_workers = 0;
	forward_destroy(e);
	return status;
}

void forward_destroy(struct forward_engine *e)
{
	if (!e)
		return;
	if (e->pool.n_workers) {
		waves_settle(e,
		             false); /* its out_deferred may be gone: the caller settles before */
		pool_destroy(&e->pool);
		weights_close(&e->w);
		topology_close(&e->topo);
	}
	free_ctx(&e->ctx[0]);
	free_ctx(&e->ctx[1]);
	free(e->masks);
	free(e->res_mask);
	free(e->masked_now);
	free(e->counters);
	free(e->row_mark);
	pthread_mutex_destroy(&e->run_lock);
	pthread_cond_destroy(&e->run_free);
	pthread_mutex_destroy(&e->mask_lock);
	free(e);
}

void forward_topology(const struct forward_engine *e, struct forward_topology_info *out)
{
	topology_info(&e->topo, out);
}

bool forward_would_run_now(struct forward_engine *e, int32_t layer, const int32_t *ids, size_t n)
{
	if (layer < 0 || (uint32_t)layer >= e->cat->info.n_layers || e->w.moe_index[layer] < 0)
		return true; /* fails validation at once */
	return weights_layer_ready(&e->w, (uint32_t)e->w.moe_index[layer], ids, n);
}

static void engine_take(struct forward_engine *e)
{
	pthread_mutex_lock(&e->run_lock);
	while (e->running)
		pthread_cond_wait(&e->run_free, &e->run_lock);
	e->running = true;
	pthread_mutex_unlock(&e->run_lock);
}

static void engine_give_back(struct forward_engine *e)
{
	pthread_mutex_lock(&e->run_lock);
	e->running = false;
	pthread_cond_signal(&e->run_free);
	pthread_mutex_unlock(&e->run_lock);
}

/* Counts one forward_run into its layer's counters and histograms (stats.c reads them). */
static void record_layer(struct forward_engine *e, uint32_t moe_layer,
                         const struct forward_request *q, const struct forward_result *res,
                         uint64_t total_us)
{
	struct layer_counters *c = &e->counters[moe_layer];
	atomic_fetch_add_explicit(&c->requests, 1, memory_order_relaxed);
	if (res->status != MOE_OK) {
		atomic_fetch_add_explicit(&c->failures, 1, memory_order_relaxed);
		return;
	}
	atomic_fetch_add_explicit(&c->tokens, q->n_tokens, memory_order_relaxed);
	atomic_fetch_add_explicit(&c->hits, res->hits, memory_order_relaxed);
	atomic_fetch_add_explicit(&c->cold_misses, res->cold_misses, memory_order_relaxed);
	atomic_fetch_add_explicit(&c->inflight_misses, res->inflight_misses, memory_order_relaxed);
	atomic_fetch_add_explicit(&c->bytes_read, res->bytes_read, memory_order_relaxed);
	const uint64_t lat[LAT_KINDS] = {res->queue_us, res->io_us, res->compute_us, total_us};
	for (int k = 0; k < LAT_KINDS; k++) {
		atomic_fetch_add_explicit(&c->hist[k][lat_hist_bucket(lat[k])], 1,
		                          memory_order_relaxed);
		atomic_fetch_add_explicit(&c->sum_us[k], lat[k], memory_order_relaxed);
	}
}

int forward_run(struct forward_engine *e, const struct forward_request *q, float *out_immediate,
                float *out_deferred, struct forward_result *res)
{
	const uint64_t t0 = monotonic_us();
	engine_take(e);
	const uint64_t t1 = monotonic_us();
	uint32_t moe_layer = 0;
	int rc = plan_validate(e, q, out_deferred, res, &moe_layer);
	res->queue_us = t1 - t0;
	if (rc == MOE_OK) {
		/* Plan in the ctx the last request's tail does not hold, if the request fits it;
		 * else the tail is settled first. */
		struct req_ctx *c = &e->ctx[0];
		if (e->tail.pending) {
			struct req_ctx *other = e->tail.ctx == &e->ctx[0] ? &e->ctx[1] : &e->ctx[0];
			if (q->n_tokens <= other->max_tokens)
				c = other;
			else
				waves_settle(e, true);
		}
		e->rq = c;
		const uint32_t n_groups = plan_request(e, q, moe_layer);
		res->experts = n_groups;
		for (uint32_t t = 0; t < q->n_tokens; t++)
			res->n_deferred += e->rq->tok_n_valid[t] - e->rq->tok_n_imm[t];
		rc = waves_execute(e, q, moe_layer, n_groups, out_immediate, res);
		if (rc == MOE_OK) {
			const uint64_t t2 = monotonic_us();
			if (!res->immediate_delivered)
				plan_sum(e, e->rq, q, out_immediate, false);
			if (res->deferred_pending)
				e->tail.out_deferred = out_deferred;
			else if (out_deferred)
				plan_sum(e, e->rq, q, out_deferred, true);
			res->compute_us += monotonic_us() - t2;
		}
		res->status = rc;
	}
	engine_give_back(e);
	if (rc != MOE_EBADLAYER && rc != MOE_EINVAL)
		record_layer(e, moe_layer, q, res, monotonic_us() - t0);
	return rc;
}

void forward_run_job(struct forward_engine *e, pool_job_fn fn, void *arg, uint32_t n_items)
{
	engine_take(e);
	/* A deferred wave left behind is joined (its tail stays pending, as when a request's
	 * first wave starts behind it) */
	pool_run_job(&e->pool, fn, arg, n_items);
	engine_give_back(e);
}

void forward_settle(struct forward_engine *e)
{
	engine_take(e);
	waves_settle(e, true);
	engine_give_back(e);
}

/* ---- reference ------------------------------------------------------------------------- */

/* moek_ffn_run from per-node slices (the sliced residency): each node's rows through its own
 * view, on the calling thread. Returns 0 or -1 (err). */
static int run_slices(struct moek_ffn_call *c, const struct held_expert *h, uint32_t n_nodes,
                      char *err, size_t err_len)
{
	if (moek_ffn_prepare(c, err, err_len) != 0)
		return -1;
	const size_t *f = h->tp->f_split, *o = h->tp->o_split;
	moek_ffn_load(c, 0, 0, c->n_tokens);
	for (uint32_t n = 0; n < n_nodes; n++)
		moek_ffn_hidden_rows(c, &h->node_view[n], 0, f[n], f[n + 1]);
	for (uint32_t n = 0; n < n_nodes; n++)
		moek_ffn_down_rows(c, &h->node_view[n], 0, o[n], o[n + 1]);
	return 0;
}

/* ---- the test oracle's access (forward_internal.h; the oracle is tests/forward/oracle.c) -- */

int forward_oracle_begin(struct forward_engine *e, const struct forward_request *q,
                         float *out_deferred, struct forward_result *res,
                         struct forward_oracle_shape *shape)
{
	engine_take(e);
	waves_settle(e, true); /* its experts held would leave this one fewer slots to wait for */
	uint32_t moe_layer = 0;
	const int rc = plan_validate(e, q, out_deferred, res, &moe_layer);
	if (rc != MOE_OK) {
		engine_give_back(e);
		return rc;
	}
	shape->moe_layer = moe_layer;
	shape->hidden = e->hidden;
	shape->n_experts = e->cat->info.n_experts;
	shape->x_row_bytes = (size_t)e->hidden * dtype_size(q->x_dtype);
	return MOE_OK;
}

void forward_oracle_end(struct forward_engine *e)
{
	engine_give_back(e);
}

int forward_oracle_expert(struct forward_engine *e, const struct forward_request *q,
                          uint32_t moe_layer, uint32_t x, struct moek_ffn_call *c,
                          struct forward_result *res)
{
	struct held_expert held = {.hold = {.expert = x}};
	char err[128];
	int rc = MOE_OK;
	enum weights_found found;
	uint64_t cold_bytes;
	struct sidecar_error why;
	const int a = weights_demand(&e->w, moe_layer, &held, true, &found, &cold_bytes, &why);
	if (a == -EINVAL) {
		rc = plan_fail(res, MOE_EIO, -1, -1, (int32_t)x, "%s", why.msg);
	} else if (a < 0) {
		struct req_group g = {.expert = x};
		rc = waves_demand_failed(e, q, &g, a, res);
		weights_release_layer(&e->w, &held, NULL, 1);
		return rc;
	}
	void *scratch = NULL;
	if (rc == MOE_OK) {
		const size_t sb = moek_ffn_scratch_bytes(&held.view, c->n_tokens, 1);
		scratch = malloc(sb);
		c->expert = &held.view;
		c->scratch = scratch;
		c->scratch_bytes = sb;
		c->n_workers = 1;
		if (!scratch)
			rc = plan_fail(res, MOE_ENOMEM, -1, -1, -1, "reference: out of memory");
		else if ((e->w.sliced ? run_slices(c, &held, e->w.n_nodes, err, sizeof(err))
		                      : moek_ffn_run(c, err, sizeof(err))) != 0)
			rc = plan_fail(res, MOE_EIO, -1, -1, (int32_t)x, "layer %d expert %u: %s",
			               q->layer, x, err);
	}
	c->expert = NULL;
	c->scratch = NULL;
	free(scratch);
	weights_release_layer(&e->w, &held, NULL, 1);
	return rc;
}
