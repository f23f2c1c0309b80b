/* forward.c — the forward engine: validation, the per-request scheduler, the test oracle's
 * access to the weights, client masks, prefetch and statistics. Contracts are in forward.h.
 *
 * A request is planned once: each token's valid ids are ordered by weight (descending, ties
 * by position), the last k_defer of them deferred; (token, position) pairs are grouped per
 * (immediate|deferred, expert) by a stable counting sort, so a group lists its tokens in
 * order. Each group is one kernel call over its gathered input rows into its own zeroed output
 * rows; the per-token sums are taken at the end in the planned order. That fixes every
 * output's summation order whatever the thread count, node split or load completion order.
 *
 * With the RESIDENCY source, every group's expert is demanded with RESIDENCY_NOWAIT first
 * (all cold reads of the request are submitted before any compute); the groups that are
 * resident are computed as one wave while the rest load; then each further wave takes what
 * has arrived, and only when nothing has arrived does the engine wait for one expert (holding
 * no reference, so a tiny budget cannot deadlock). References are released after each wave.
 * With one residency per NUMA node (weights.c), an expert is demanded from every node's and
 * is ready when every node holds its slice; counted once (cold if any node read).
 *
 * Early delivery (forward_request.immediate_ready): waves then take the immediate groups
 * before the deferred ones, and the immediate output is summed and handed to the caller as
 * soon as the last immediate group is done — the server posts it while the deferred experts
 * compute (or still load), which is what deferral is for. Without it, one wave takes every
 * ready group (no extra wave), and both sums are taken at the end.
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
#include "moe_abi.h"
#include "util/log.h"

#define HIST_BUCKETS LAT_HIST_BUCKETS
enum { LAT_QUEUE, LAT_IO, LAT_COMPUTE, LAT_TOTAL, LAT_KINDS };

struct layer_counters {
	atomic_uint_least64_t requests, tokens, hits, cold_misses, inflight_misses, bytes_read,
	    failures;
	atomic_uint_least64_t hist[LAT_KINDS][HIST_BUCKETS];
};

enum group_state { GROUP_PENDING = 0, GROUP_READY, GROUP_RUNNING, GROUP_DONE, GROUP_FAILED };

struct req_group {
	uint32_t expert;
	bool deferred;
	uint32_t first, count; /* slots [first, first+count) of the gathered arrays */
	enum group_state state;
	uint32_t counted_nodes; /* bit n: a NOWAIT demand was counted by res[n]: retry with
	                           RESIDENCY_RETRY */
	uint8_t worst;          /* of the counted demands: 0 hit, 1 in flight, 2 cold */
	uint64_t cold_bytes;    /* bytes the cold nodes read */
	struct held_expert held;
};

/* One request's plan and gathered rows (forward_engine.ctx). */
struct req_ctx {
	uint32_t max_tokens, max_pairs, max_groups;
	uint8_t *pos_kind;             /* [pair position t*k+j]: 0 skip, 1 immediate, 2 deferred */
	uint32_t *pos_slot;            /* [position]: gathered slot */
	uint16_t *tok_order;           /* [t*k + r]: position j of the r-th entry: immediate ones by
	                                  weight, then deferred ones by weight */
	uint16_t *order_tmp;           /* [max_k]: defer_cold's partition */
	uint32_t *tok_n_valid;         /* [t] */
	uint32_t *tok_n_imm;           /* [t] */
	uint32_t *key_count;           /* [n_experts + 1] */
	uint8_t *expert_has_immediate; /* [n_experts] */
	struct req_group *groups;
	struct wave_group *wave;
	uint32_t *wave_group_of; /* wave index → request group */
	uint8_t *xg;             /* gathered input rows, max dtype size */
	float *yg;               /* per-slot outputs */
	float *wg;               /* per-slot weights */
	uint8_t *scratch;
	size_t scratch_bytes;
	uint64_t bytes; /* everything above, allocated (forward_stats.request_bytes) */
};

/* A request's deferred wave left running on the pool after forward_run returned
 * (forward_request.settle_later): settled — joined, its experts let go, its sum written to
 * out_deferred — before the pool's next wave, by forward_settle, or at destroy. */
struct deferred_tail {
	bool pending;
	struct req_ctx *ctx;
	uint32_t n_wave, n_tokens, k;
	float *out_deferred;
};

struct forward_engine {
	const struct moe_catalog *cat;
	struct forward_config cfg;
	struct forward_topology topo;
	struct forward_pool pool;
	struct forward_weights w;
	uint32_t max_tokens, max_k, hidden, last_moe_layer;
	/* One request at a time: `running` under run_lock, waited for on run_free. The lock is
	 * held only to take or give back the engine, never across compute, I/O or the
	 * immediate_ready callback. */
	pthread_mutex_t run_lock;
	pthread_cond_t run_free;
	bool running;
	/* Request plans: ctx[0] for max_tokens x max_k pairs, ctx[1] for decode-sized requests
	 * (ASYNC_MAX_TOKENS). rq is the running request's; a request whose deferred wave is left
	 * running behind it (tail) keeps its ctx until settled, and the next request plans in
	 * the other one meanwhile. */
	uint32_t max_pairs, max_groups; /* ctx[0]'s */
	struct req_ctx ctx[2];
	struct req_ctx *rq;
	struct deferred_tail tail;
	/* Masks (guarded by mask_lock). */
	pthread_mutex_t mask_lock;
	size_t mask_row; /* bytes per transformer block: ceil(n_experts / 8) */
	uint8_t *masks;  /* [FORWARD_MAX_CLIENTS][n_layers * mask_row] */
	bool attached[FORWARD_MAX_CLIENTS];
	uint8_t *res_mask;               /* [n_experts] scratch for residency_set_gpu_mask */
	uint32_t *masked_now;            /* [n_layers]: experts every attached client masks */
	uint64_t mask_switches;          /* forward_set_mask calls that changed a mask */
	struct layer_counters *counters; /* [n_moe_layers] */
	/* validate's duplicate check (engine taken): expert x was named in the token row being
	 * checked iff row_mark[x] == row_stamp. */
	uint32_t *row_mark; /* [n_experts] */
	uint32_t row_stamp;
};

/* Bytes per activation element (enum moek_act_dtype, the wire's moe_dtype numbering). */
static size_t dtype_size(unsigned dtype)
{
	return dtype == MOEK_ACT_F32 ? 4 : 2;
}

static size_t align_up_64(size_t v)
{
	return (v + 63) & ~(size_t)63;
}

unsigned lat_hist_bucket(uint64_t us)
{
	if (us < LAT_HIST_SUB)
		return (unsigned)us;
	const unsigned e = 63u - (unsigned)__builtin_clzll(us); /* >= 3 */
	const unsigned b = LAT_HIST_SUB + (e - 3) * LAT_HIST_SUB +
	                   (unsigned)((us >> (e - 3)) & (LAT_HIST_SUB - 1));
	return b < LAT_HIST_BUCKETS ? b : LAT_HIST_BUCKETS - 1;
}

uint64_t lat_hist_upper(unsigned b)
{
	if (b < LAT_HIST_SUB)
		return b;
	const unsigned e = 3 + (b - LAT_HIST_SUB) / LAT_HIST_SUB;
	const uint64_t sub = (b - LAT_HIST_SUB) % LAT_HIST_SUB;
	return ((LAT_HIST_SUB + sub + 1) << (e - 3)) - 1;
}

/* ---- create / destroy ----------------------------------------------------------------- */

static void settle(struct forward_engine *e, bool sum);

/* Largest scratch any expert needs for n tokens on `workers` workers. */
static size_t max_scratch(struct forward_engine *e, size_t n, unsigned workers)
{
	static const uint8_t dummy[64];
	const uint8_t *data[MOE_PROJ_COUNT] = {dummy, dummy, dummy, dummy};
	size_t best = 0;
	char err[160];
	for (uint32_t l = 0; l < e->w.n_moe_layers; l++) {
		struct moek_expert v;
		if (weights_view(&e->w, l, 0, data, &v, err, sizeof(err)) != 0)
			continue;
		size_t s = moek_ffn_scratch_bytes(&v, n, workers);
		if (s > best)
			best = s;
	}
	return best;
}

/* Decode-sized requests (at most this many tokens) may leave their deferred wave running
 * behind them: the second plan, for the request after, is sized for them. */
#define ASYNC_MAX_TOKENS 16u

static int alloc_ctx(struct forward_engine *e, struct req_ctx *c, uint32_t tokens, char *err,
                     size_t err_len)
{
	const uint32_t n_experts = e->cat->info.n_experts;
	const size_t P = (size_t)tokens * e->max_k;
	c->max_tokens = tokens;
	c->max_pairs = (uint32_t)P;
	c->max_groups = (uint32_t)(P < n_experts ? P : n_experts);
	c->pos_kind = calloc(P, 1);
	c->pos_slot = calloc(P, sizeof(uint32_t));
	c->tok_order = calloc(P, sizeof(uint16_t));
	c->order_tmp = calloc(e->max_k, sizeof(uint16_t));
	c->tok_n_valid = calloc(tokens, sizeof(uint32_t));
	c->tok_n_imm = calloc(tokens, sizeof(uint32_t));
	c->key_count = calloc((size_t)n_experts + 1, sizeof(uint32_t));
	c->expert_has_immediate = calloc(n_experts, 1);
	c->groups = calloc(c->max_groups, sizeof(*c->groups));
	c->wave = calloc(c->max_groups, sizeof(*c->wave));
	c->wave_group_of = calloc(c->max_groups, sizeof(uint32_t));
	c->xg = aligned_alloc(64, align_up_64(P * e->hidden * sizeof(float)));
	c->yg = aligned_alloc(64, align_up_64(P * e->hidden * sizeof(float)));
	c->wg = calloc(P, sizeof(float));
	const size_t full = max_scratch(e, P, e->pool.n_workers);
	c->scratch_bytes = 2 * full + ((size_t)8 << 20);
	c->scratch = aligned_alloc(64, align_up_64(c->scratch_bytes));
	c->bytes = P * (1 + sizeof(uint32_t) + sizeof(uint16_t) + sizeof(float)) +
	           e->max_k * sizeof(uint16_t) + (size_t)tokens * 2 * sizeof(uint32_t) +
	           ((size_t)n_experts + 1) * sizeof(uint32_t) + n_experts +
	           c->max_groups * (sizeof(*c->groups) + sizeof(*c->wave) + sizeof(uint32_t)) +
	           2 * align_up_64(P * e->hidden * sizeof(float)) + align_up_64(c->scratch_bytes);
	if (!c->pos_kind || !c->pos_slot || !c->tok_order || !c->order_tmp || !c->tok_n_valid ||
	    !c->tok_n_imm || !c->key_count || !c->expert_has_immediate || !c->groups || !c->wave ||
	    !c->wave_group_of || !c->xg || !c->yg || !c->wg || !c->scratch || full == 0) {
		snprintf(err, err_len, "forward engine: request buffers for %u tokens x %u ids: %s",
		         tokens, e->max_k, full ? "out of memory" : "no usable expert");
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
	free(c->wave);
	free(c->wave_group_of);
	free(c->xg);
	free(c->yg);
	free(c->wg);
	free(c->scratch);
}

static int alloc_plan(struct forward_engine *e, char *err, size_t err_len)
{
	if (alloc_ctx(e, &e->ctx[0], e->max_tokens, err, err_len) != 0)
		return -1;
	e->max_pairs = e->ctx[0].max_pairs;
	e->max_groups = e->ctx[0].max_groups;
	e->rq = &e->ctx[0];
	/* no second plan for one worker: nothing runs behind the caller */
	if (e->pool.n_workers > 1 &&
	    alloc_ctx(e, &e->ctx[1],
	              e->max_tokens < ASYNC_MAX_TOKENS ? e->max_tokens : ASYNC_MAX_TOKENS, err,
	              err_len) != 0)
		return -1;
	return 0;
}

/* RESIDENCY under a memory limit: the request buffers (allocated) come first, the slot pools
 * get what is left. An unset budget becomes every expert if they fit, else the rest; a budget
 * given that does not fit is refused, saying what would. */
static int fit_budget(struct forward_engine *e, struct forward_config *c, char *err, size_t err_len)
{
	if (!c->mem_limit)
		return 0;
	const uint64_t plan = e->ctx[0].bytes + e->ctx[1].bytes;
	const uint64_t left = c->mem_limit > plan ? c->mem_limit - plan : 0;
	const uint64_t every = weights_every_expert_bytes(&e->w);
	if (c->mem_budget == 0) {
		if (every <= left)
			return 0;
		if (left == 0 || c->keep_budget) {
			if (left == 0)
				snprintf(err, err_len,
				         "the request buffers (%llu bytes for %u tokens x %u ids) "
				         "alone exceed the %llu bytes the engine may use",
				         (unsigned long long)plan, e->max_tokens, e->max_k,
				         (unsigned long long)c->mem_limit);
			else
				snprintf(
				    err, err_len,
				    "every expert needs %llu bytes of slots and the request "
				    "buffers %llu (%u tokens x %u ids): above the %llu bytes the "
				    "engine may use; at most %llu bytes of budget fit",
				    (unsigned long long)every, (unsigned long long)plan,
				    e->max_tokens, e->max_k, (unsigned long long)c->mem_limit,
				    (unsigned long long)left);
			return -1;
		}
		c->mem_budget = left;
		log_info("forward",
		         "expert budget cut to %llu bytes: the engine may use %llu bytes and its "
		         "request buffers take %llu; every expert would need %llu",
		         (unsigned long long)left, (unsigned long long)c->mem_limit,
		         (unsigned long long)plan, (unsigned long long)every);
		return 0;
	}
	if (c->mem_budget > left) {
		snprintf(err, err_len,
		         "an expert budget of %llu bytes and %llu bytes of request buffers (%u "
		         "tokens x %u ids) exceed the %llu bytes the engine may use; at most %llu "
		         "bytes of budget fit",
		         (unsigned long long)c->mem_budget, (unsigned long long)plan, e->max_tokens,
		         e->max_k, (unsigned long long)c->mem_limit, (unsigned long long)left);
		return -1;
	}
	return 0;
}

int forward_create(struct forward_engine **out, const struct moe_catalog *cat,
                   const struct forward_config *config, char *err, size_t err_len)
{
	return forward_create_with_fault_hook(out, cat, config, NULL, NULL, err, err_len);
}

int forward_create_with_fault_hook(struct forward_engine **out, const struct moe_catalog *cat,
                                   const struct forward_config *config, loader_fault_fn hook,
                                   void *hook_arg, char *err, size_t err_len)
{
	*out = NULL;
	if (cat->info.n_moe_layers == 0 || cat->info.n_experts == 0) {
		snprintf(err, err_len, "model has no routed experts");
		return -1;
	}
	if (config->max_tokens == 0) {
		snprintf(err, err_len, "forward engine: max_tokens must be >= 1");
		return -1;
	}
	struct forward_engine *e = calloc(1, sizeof(*e));
	if (!e) {
		snprintf(err, err_len, "out of memory");
		return -1;
	}
	e->cat = cat;
	e->cfg = *config;
	e->max_tokens = config->max_tokens;
	e->max_k = config->max_ids_per_token ? config->max_ids_per_token : cat->info.top_k;
	if (e->max_k == 0 || e->max_k > 65535) {
		snprintf(err, err_len, "forward engine: ids per token %u out of range", e->max_k);
		free(e);
		return -1;
	}
	e->hidden = (uint32_t)cat->info.hidden;
	pthread_mutex_init(&e->run_lock, NULL);
	pthread_cond_init(&e->run_free, NULL);
	pthread_mutex_init(&e->mask_lock, NULL);
	bool topo_open = false, pool_open = false;
	int status = -1;
	if (topology_open(&e->topo, config, err, err_len) != 0)
		goto fail;
	topo_open = true;
	if (weights_open(&e->w, cat, config, &e->topo, err, err_len) != 0)
		goto fail;
	e->w.fault_hook = hook;
	e->w.fault_arg = hook_arg;
	e->last_moe_layer = e->w.n_moe_layers - 1;
	{
		const size_t P = (size_t)e->max_tokens * e->max_k;
		const uint32_t g =
		    2 * (uint32_t)(P < cat->info.n_experts ? P : cat->info.n_experts);
		if (pool_create(&e->pool, &e->topo, g, err, err_len) != 0)
			goto fail;
		pool_open = true;
	}
	if (alloc_plan(e, err, err_len) != 0)
		goto fail;
	if (config->source == FORWARD_SOURCE_RESIDENCY) {
		struct forward_config rc = *config;
		char why[400];
		if (fit_budget(e, &rc, err, err_len) != 0) {
			status = -ENOSPC;
			goto fail;
		}
		if (weights_start_residency(&e->w, &rc, &e->topo, why, sizeof(why)) != 0) {
			if (rc.mem_budget != config->mem_budget) {
				status = -ENOSPC; /* the pools the limit left hold no slot */
				snprintf(
				    err, err_len,
				    "%s (of the %llu bytes the engine may use, its request buffers "
				    "leave the expert slots %llu bytes after taking %llu)",
				    why, (unsigned long long)rc.mem_limit,
				    (unsigned long long)rc.mem_budget,
				    (unsigned long long)(e->ctx[0].bytes + e->ctx[1].bytes));
			} else {
				snprintf(err, err_len, "%s", why);
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
		snprintf(err, err_len, "out of memory");
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
		settle(e, false); /* its out_deferred may be gone: the caller settles before */
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
	memset(out, 0, sizeof(*out));
	out->n_nodes = e->topo.n_nodes;
	out->synthetic = e->topo.synthetic;
	out->memory_bound = e->topo.memory_bound;
	for (uint32_t n = 0; n < e->topo.n_nodes; n++) {
		out->node_os_index[n] = e->topo.nodes[n].os_index;
		out->threads[n] = e->topo.nodes[n].threads;
		out->pinned_per_pu[n] = e->topo.nodes[n].pin_per_pu;
	}
}

/* ---- validation ------------------------------------------------------------------------ */

__attribute__((format(printf, 6, 7))) static int fail(struct forward_result *res, int status,
                                                      int32_t token, int32_t index, int32_t expert,
                                                      const char *fmt, ...)
{
	res->status = status;
	res->bad_token = token;
	res->bad_index = index;
	res->bad_expert = expert;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(res->message, sizeof(res->message), fmt, ap);
	va_end(ap);
	return status;
}

static bool row_finite(const void *x, unsigned dtype, size_t n)
{
	if (dtype == MOEK_ACT_F32) {
		const uint32_t *v = x;
		for (size_t i = 0; i < n; i++)
			if ((v[i] & 0x7f800000u) == 0x7f800000u)
				return false;
		return true;
	}
	const uint16_t *v = x;
	const uint16_t exp = dtype == MOEK_ACT_BF16 ? 0x7f80u : 0x7c00u;
	for (size_t i = 0; i < n; i++)
		if ((v[i] & exp) == exp)
			return false;
	return true;
}

static bool mask_bit(const struct forward_engine *e, uint32_t client, uint32_t layer,
                     uint32_t expert)
{
	const uint8_t *row =
	    e->masks + ((size_t)client * e->cat->info.n_layers + layer) * e->mask_row;
	return (row[expert / 8] >> (expert % 8)) & 1u;
}

/* Checks everything the request's values could get wrong; *moe_layer receives the MoE layer. */
static int validate(struct forward_engine *e, const struct forward_request *q,
                    const float *out_deferred, struct forward_result *res, uint32_t *moe_layer)
{
	memset(res, 0, sizeof(*res));
	res->bad_token = res->bad_index = res->bad_expert = -1;
	const struct moe_model_hparams *info = &e->cat->info;
	if (q->client >= FORWARD_MAX_CLIENTS)
		return fail(res, MOE_EINVAL, -1, -1, -1, "client %u out of range", q->client);
	if (q->layer < 0 || (uint32_t)q->layer >= info->n_layers || e->w.moe_index[q->layer] < 0)
		return fail(res, MOE_EBADLAYER, -1, -1, -1,
		            "layer %d is not an MoE layer (%u blocks)", q->layer, info->n_layers);
	*moe_layer = (uint32_t)e->w.moe_index[q->layer];
	if (q->n_tokens == 0 || q->n_tokens > e->max_tokens)
		return fail(res, MOE_EBADTOKENS, -1, -1, -1, "%u tokens (1..%u)", q->n_tokens,
		            e->max_tokens);
	if (q->k == 0 || q->k > e->max_k)
		return fail(res, MOE_EBADTOPK, -1, -1, -1, "%u ids per token (1..%u)", q->k,
		            e->max_k);
	if (q->x_dtype >= 3u /* f32, f16, bf16 */)
		return fail(res, MOE_EBADDTYPE, -1, -1, -1, "activation dtype %u unknown",
		            q->x_dtype);
	if (q->k_defer > q->k)
		return fail(res, MOE_EBADFIELD, -1, -1, -1, "k_defer %u > k %u", q->k_defer, q->k);
	if (q->k_defer && *moe_layer == e->last_moe_layer)
		return fail(res, MOE_EBADFIELD, -1, -1, -1,
		            "layer %d is the last MoE layer: nothing may be deferred", q->layer);
	if (q->k_defer && !out_deferred)
		return fail(res, MOE_EINVAL, -1, -1, -1, "k_defer without a deferred output");
	for (uint32_t t = 0; t < q->n_tokens; t++) {
		if (++e->row_stamp == 0) { /* wrapped: no stale mark may equal a new stamp */
			memset(e->row_mark, 0, info->n_experts * sizeof(uint32_t));
			e->row_stamp = 1;
		}
		for (uint32_t j = 0; j < q->k; j++) {
			const int32_t id = q->ids[(size_t)t * q->k + j];
			const float w = q->weights[(size_t)t * q->k + j];
			if (id == -1)
				continue;
			if (id < -1 || (uint32_t)id >= info->n_experts)
				return fail(
				    res, MOE_EBADEXPERT, (int32_t)t, (int32_t)j, id,
				    "token %u id %u: expert %d out of range (0..%u, -1 = skip)", t,
				    j, id, info->n_experts - 1);
			if (e->row_mark[id] == e->row_stamp) {
				/* A router picks each expert once per token: a repeat is a bug
				 * upstream, and summing it twice would hide it. */
				uint32_t first = 0;
				while (q->ids[(size_t)t * q->k + first] != id)
					first++;
				return fail(
				    res, MOE_EBADEXPERT, (int32_t)t, (int32_t)j, id,
				    "token %u id %u: expert %d is named twice in the token's "
				    "row (first as id %u)",
				    t, j, id, first);
			}
			e->row_mark[id] = e->row_stamp;
			if (!isfinite(w))
				return fail(res, MOE_EBADWEIGHT, (int32_t)t, (int32_t)j, id,
				            "token %u id %u: weight of expert %d not finite", t, j,
				            id);
		}
	}
	const size_t row = (size_t)e->hidden * dtype_size(q->x_dtype);
	for (uint32_t t = 0; t < q->n_tokens; t++)
		if (!row_finite((const uint8_t *)q->x + t * row, q->x_dtype, e->hidden))
			return fail(res, MOE_ENONFINITE, (int32_t)t, -1, -1,
			            "token %u: NaN or Inf in the activations", t);
	pthread_mutex_lock(&e->mask_lock);
	for (uint32_t t = 0; t < q->n_tokens; t++)
		for (uint32_t j = 0; j < q->k; j++) {
			const int32_t id = q->ids[(size_t)t * q->k + j];
			if (id >= 0 && mask_bit(e, q->client, (uint32_t)q->layer, (uint32_t)id)) {
				pthread_mutex_unlock(&e->mask_lock);
				return fail(
				    res, MOE_EMASKED, (int32_t)t, (int32_t)j, id,
				    "token %u id %u: layer %d expert %d is on the GPU (masked)", t,
				    j, q->layer, id);
			}
		}
	pthread_mutex_unlock(&e->mask_lock);
	return MOE_OK;
}

/* ---- planning -------------------------------------------------------------------------- */

/* True if some node's residency does not hold (layer, expert) now. */
static bool expert_cold_now(struct forward_engine *e, uint32_t moe_layer, uint32_t expert)
{
	if (e->w.source != FORWARD_SOURCE_RESIDENCY)
		return false;
	for (uint32_t n = 0; n < e->w.n_res; n++)
		if (residency_state(e->w.res[n], moe_layer, expert) != EXPERT_RESIDENT)
			return true;
	return false;
}

/* defer_cold: of a token's n valid entries (order[] by weight), defers n_def — the lowest-
 * weighted of those not resident first, then the lowest-weighted others — and rewrites
 * order[] as the immediate entries by weight, then the deferred ones by weight. */
static void defer_cold_first(struct forward_engine *e, uint32_t moe_layer, const int32_t *ids,
                             uint16_t *order, uint8_t *kind, uint32_t n, uint32_t n_def)
{
	uint32_t picked = 0;
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t r = n; r-- > 0 && picked < n_def;) {
			if (kind[order[r]] == 2 ||
			    (pass == 0 && !expert_cold_now(e, moe_layer, (uint32_t)ids[order[r]])))
				continue;
			kind[order[r]] = 2;
			picked++;
		}
	uint32_t at = 0;
	for (int want = 1; want <= 2; want++)
		for (uint32_t r = 0; r < n; r++)
			if (kind[order[r]] == want)
				e->rq->order_tmp[at++] = order[r];
	memcpy(order, e->rq->order_tmp, n * sizeof(uint16_t));
}

/* Orders each token's valid entries by weight descending (ties: earlier position first),
 * marks the last min(k_defer, valid) deferred (with q->defer_cold: non-resident experts
 * first), and groups the pairs per expert. Returns the number of groups. */
static uint32_t plan_request(struct forward_engine *e, const struct forward_request *q,
                             uint32_t moe_layer)
{
	const uint32_t n_experts = e->cat->info.n_experts, k = q->k;
	for (uint32_t t = 0; t < q->n_tokens; t++) {
		const int32_t *ids = &q->ids[(size_t)t * k];
		const float *w = &q->weights[(size_t)t * k];
		uint16_t *order = &e->rq->tok_order[(size_t)t * k];
		uint32_t n = 0;
		for (uint32_t j = 0; j < k; j++) {
			if (ids[j] < 0)
				continue;
			uint32_t i = n++;
			while (i > 0 &&
			       w[order[i - 1]] < w[j]) { /* stable: equal weights keep j order */
				order[i] = order[i - 1];
				i--;
			}
			order[i] = (uint16_t)j;
		}
		const uint32_t n_def = q->k_defer < n ? q->k_defer : n;
		e->rq->tok_n_valid[t] = n;
		e->rq->tok_n_imm[t] = n - n_def;
		uint8_t *kind = &e->rq->pos_kind[(size_t)t * k];
		for (uint32_t j = 0; j < k; j++)
			kind[j] = 0;
		if (q->defer_cold && n_def) {
			for (uint32_t r = 0; r < n; r++)
				kind[order[r]] = 1;
			defer_cold_first(e, moe_layer, ids, order, kind, n, n_def);
		} else {
			for (uint32_t r = 0; r < n; r++)
				kind[order[r]] = r < n - n_def ? 1 : 2;
		}
	}
	/* Counting sort on the expert, stable in (t, j) order. An expert's immediate and deferred
	 * pairs share one group: the kernels' per-token results depend on the batch they are
	 * computed in (multi-token dot products), so deferral must not change the batches —
	 * that is what makes immediate + deferred equal the undeferred output. Groups with an
	 * immediate pair come first; deferred-only groups after them. */
	memset(e->rq->key_count, 0, (n_experts + 1) * sizeof(uint32_t));
	memset(e->rq->expert_has_immediate, 0, n_experts);
	const size_t n_pos = (size_t)q->n_tokens * k;
	for (size_t p = 0; p < n_pos; p++)
		if (e->rq->pos_kind[p]) {
			e->rq->key_count[(uint32_t)q->ids[p] + 1]++;
			e->rq->expert_has_immediate[q->ids[p]] |= e->rq->pos_kind[p] == 1;
		}
	for (uint32_t x = 0; x < n_experts; x++)
		e->rq->key_count[x + 1] += e->rq->key_count[x];
	uint32_t n_groups = 0;
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t x = 0; x < n_experts; x++) {
			const uint32_t c = e->rq->key_count[x + 1] - e->rq->key_count[x];
			if (c == 0 || e->rq->expert_has_immediate[x] != (pass == 0))
				continue;
			struct req_group *g = &e->rq->groups[n_groups++];
			memset(g, 0, sizeof(*g));
			g->expert = x;
			g->deferred = pass == 1;
			g->first = e->rq->key_count[x];
			g->count = c;
		}
	const size_t row = (size_t)e->hidden * dtype_size(q->x_dtype);
	for (size_t p = 0; p < n_pos; p++) {
		if (!e->rq->pos_kind[p])
			continue;
		const uint32_t s = e->rq->key_count[q->ids[p]]++;
		e->rq->pos_slot[p] = s;
		memcpy(e->rq->xg + s * row, (const uint8_t *)q->x + (p / k) * row, row);
		e->rq->wg[s] = q->weights[p];
	}
	return n_groups;
}

/* One part of the output in the planned order: out[t] = Σ immediate entries + deferred_in[t]
 * (needs only the groups with an immediate entry: they come first in the plan), or
 * Σ deferred entries. */
static void sum_part(const struct forward_engine *e, const struct req_ctx *c,
                     const struct forward_request *q, float *out, bool deferred_part)
{
	const size_t h = e->hidden;
	for (uint32_t t = 0; t < q->n_tokens; t++) {
		float *o = out + t * h;
		memset(o, 0, h * sizeof(float));
		const uint16_t *order = &c->tok_order[(size_t)t * q->k];
		const uint32_t r0 = deferred_part ? c->tok_n_imm[t] : 0;
		const uint32_t r1 = deferred_part ? c->tok_n_valid[t] : c->tok_n_imm[t];
		for (uint32_t r = r0; r < r1; r++) {
			const float *y =
			    c->yg + (size_t)c->pos_slot[(size_t)t * q->k + order[r]] * h;
			for (size_t i = 0; i < h; i++)
				o[i] += y[i];
		}
		if (!deferred_part && q->deferred_in)
			for (size_t i = 0; i < h; i++)
				o[i] += q->deferred_in[t * h + i];
	}
}

/* ---- execution ------------------------------------------------------------------------- */

void forward_split_range(size_t total, size_t align, uint32_t parts, size_t *split)
{
	const size_t units = (total + align - 1) / align;
	for (uint32_t n = 0; n < parts; n++) {
		size_t at = units * n / parts * align;
		split[n] = at < total ? at : total;
	}
	split[parts] = total;
}

/* Prepares group g's call into wave slot `slot` using scratch from *scratch_at. Returns 0,
 * 1 if the scratch arena is full (run the wave first), or a negative status (res filled). */
static int add_to_wave(struct forward_engine *e, const struct forward_request *q, uint32_t g,
                       uint32_t slot, size_t *scratch_at, struct forward_result *res)
{
	struct req_group *rg = &e->rq->groups[g];
	struct wave_group *wg = &e->rq->wave[slot];
	const unsigned W = e->pool.n_workers;
	const size_t need = moek_ffn_scratch_bytes(&rg->held.view, rg->count, W);
	if (*scratch_at + need > e->rq->scratch_bytes)
		return 1;
	memset(wg, 0, sizeof(*wg));
	struct moek_ffn_call *c = &wg->call;
	const size_t row = (size_t)e->hidden * dtype_size(q->x_dtype);
	c->expert = &rg->held.view;
	c->n_tokens = rg->count;
	c->x = e->rq->xg + (size_t)rg->first * row;
	c->x_dtype = q->x_dtype;
	c->weights = e->rq->wg + rg->first;
	c->out = e->rq->yg + (size_t)rg->first * e->hidden;
	c->scratch = e->rq->scratch + *scratch_at;
	c->scratch_bytes = need;
	c->n_workers = W;
	memset(c->out, 0, (size_t)rg->count * e->hidden * sizeof(float));
	char err[128];
	if (moek_ffn_prepare(c, err, sizeof(err)) != 0)
		return fail(res, MOE_EIO, -1, -1, (int32_t)rg->expert, "layer %d expert %u: %s",
		            q->layer, rg->expert, err);
	*scratch_at = align_up_64(*scratch_at + need);
	wg->f_align = moek_expert_split_align(&rg->held.view);
	wg->h_align = moek_ffn_hidden_align(&rg->held.view);
	forward_expert_split(&rg->held.view, e->topo.n_nodes, wg->f_split, wg->o_split);
	for (uint32_t n = 0; n < e->topo.n_nodes; n++)
		wg->node_expert[n] = e->w.sliced ? &rg->held.node_view[n] : &rg->held.view;
	e->rq->wave_group_of[slot] = g;
	return 0;
}

static void release_group(struct forward_engine *e, struct req_group *g)
{
	if (g->held.held_nodes)
		weights_release(&e->w, &g->held);
}

static void release_all(struct forward_engine *e, uint32_t n_groups)
{
	for (uint32_t g = 0; g < n_groups; g++)
		release_group(e, &e->rq->groups[g]);
}

/* The wave of c->wave[0, n_wave) has ended (pool_run_wave, or pool_wait_wave after a wave
 * started behind the caller): its groups are done and their experts let go. */
static void wave_done(struct forward_engine *e, struct req_ctx *c, uint32_t n_wave)
{
	for (uint32_t i = 0; i < n_wave; i++) {
		struct req_group *g = &c->groups[c->wave_group_of[i]];
		g->state = GROUP_DONE;
		release_group(e, g);
	}
}

/* Which READY groups a wave takes: all of them (immediate ones first: they come first in the
 * group order), or one kind, so the immediate part can be delivered before deferred work. */
enum wave_filter { WAVE_ALL, WAVE_IMMEDIATE, WAVE_DEFERRED };

/* Fills e->rq->wave with the READY groups the filter takes, in group order, until the scratch
 * arena is full (the rest wait for the next wave). *n_wave = 0: none left. */
static int build_wave(struct forward_engine *e, const struct forward_request *q, uint32_t n_groups,
                      enum wave_filter filter, struct forward_result *res, uint32_t *n_wave)
{
	*n_wave = 0;
	size_t at = 0;
	for (uint32_t g = 0; g < n_groups; g++) {
		if (e->rq->groups[g].state != GROUP_READY ||
		    (filter == WAVE_IMMEDIATE && e->rq->groups[g].deferred) ||
		    (filter == WAVE_DEFERRED && !e->rq->groups[g].deferred))
			continue;
		int rc = add_to_wave(e, q, g, *n_wave, &at, res);
		if (rc == 1 && *n_wave > 0)
			return MOE_OK;
		if (rc != 0)
			return rc < 0
			           ? rc
			           : fail(res, MOE_ENOMEM, -1, -1, -1, "scratch arena too small");
		(*n_wave)++;
	}
	return MOE_OK;
}

/* The tail (struct deferred_tail) of the request before: its wave joined, its experts let go,
 * its deferred sum written (sum = false: not, at destroy). */
static void settle(struct forward_engine *e, bool sum)
{
	struct deferred_tail *t = &e->tail;
	if (!t->pending)
		return;
	pool_wait_wave(&e->pool);
	wave_done(e, t->ctx, t->n_wave);
	if (sum && t->out_deferred) {
		const struct forward_request q = {.n_tokens = t->n_tokens, .k = t->k};
		sum_part(e, t->ctx, &q, t->out_deferred, true);
	}
	t->pending = false;
}

static int compute_ready(struct forward_engine *e, const struct forward_request *q,
                         uint32_t n_groups, enum wave_filter filter, struct forward_result *res)
{
	const uint64_t t0 = monotonic_us();
	uint32_t n_wave;
	int rc;
	while ((rc = build_wave(e, q, n_groups, filter, res, &n_wave)) == MOE_OK && n_wave) {
		settle(e, true); /* planned and prepared while the last tail ran */
		pool_run_wave(&e->pool, e->rq->wave, n_wave);
		wave_done(e, e->rq, n_wave);
	}
	res->compute_us += monotonic_us() - t0;
	return rc;
}

static int demand_failed(struct forward_engine *e, const struct forward_request *q,
                         const struct req_group *g, uint32_t node, int rc,
                         struct forward_result *res)
{
	if (rc == -EPERM)
		return fail(res, MOE_EMASKED, -1, -1, (int32_t)g->expert,
		            "layer %d expert %u is GPU-masked", q->layer, g->expert);
	if (rc == -ESHUTDOWN)
		return fail(res, MOE_ESHUTDOWN, -1, -1, (int32_t)g->expert, "shutting down");
	if (rc == -ENOSPC)
		return fail(res, MOE_EIO, -1, -1, (int32_t)g->expert,
		            "layer %d expert %u: no slot can be freed for it (nothing in use, "
		            "nothing the policy may evict)",
		            q->layer, g->expert);
	char why[120];
	residency_error_message(e->w.res[node], (uint32_t)e->w.moe_index[q->layer], g->expert, why,
	                        sizeof(why));
	if (!why[0])
		snprintf(why, sizeof(why), "%s", strerror(-rc));
	return fail(res, MOE_EIO, -1, -1, (int32_t)g->expert, "layer %d expert %u: %s", q->layer,
	            g->expert, why);
}

/* One demand for group g on every residency that does not hold it yet; counts hit/cold/
 * in-flight once per expert, when every residency has counted its demand (cold if any node
 * had to read, else in flight if any was loading). Returns 1 if the expert is now held
 * everywhere (READY), 0 if still pending, or a negative status. */
static int demand(struct forward_engine *e, const struct forward_request *q, uint32_t moe_layer,
                  struct req_group *g, bool wait, struct forward_result *res)
{
	const uint32_t all = (1u << e->w.n_res) - 1u;
	for (uint32_t n = 0; n < e->w.n_res; n++) {
		const uint32_t bit = 1u << n;
		if (g->held.held_nodes & bit)
			continue;
		struct residency *r = e->w.res[n];
		const enum expert_state pre = residency_state(r, moe_layer, g->expert);
		const unsigned flags = (wait ? 0u : RESIDENCY_NOWAIT) |
		                       (g->counted_nodes & bit ? RESIDENCY_RETRY : 0u);
		int rc = residency_acquire(r, moe_layer, g->expert, -1.0f, flags, &g->held.ref[n]);
		if (!(g->counted_nodes & bit) && (rc == 0 || rc == -EINPROGRESS)) {
			g->counted_nodes |= bit;
			const uint8_t rank = pre == EXPERT_RESIDENT  ? 0
			                     : pre == EXPERT_LOADING ? 1
			                                             : 2;
			if (rank > g->worst)
				g->worst = rank;
			if (rank == 2)
				g->cold_bytes +=
				    e->w.sliced
				        ? weights_res_bytes(&e->w, n, moe_layer, g->expert)
				        : moe_catalog_expert(e->cat, (uint32_t)q->layer, g->expert)
				              ->bytes;
			if (g->counted_nodes == all) {
				if (g->worst == 0) {
					res->hits++;
				} else if (g->worst == 1) {
					res->inflight_misses++;
				} else {
					res->cold_misses++;
					res->bytes_read += g->cold_bytes;
				}
			}
		}
		if (rc == -EINPROGRESS || rc == -EAGAIN)
			continue;
		if (rc != 0)
			return demand_failed(e, q, g, n, rc, res);
		g->held.held_nodes |= bit;
	}
	if (g->held.held_nodes != all)
		return 0;
	char err[128];
	if (weights_held_view(&e->w, &g->held, err, sizeof(err)) != 0)
		return fail(res, MOE_EIO, -1, -1, (int32_t)g->expert, "%s", err);
	g->state = GROUP_READY;
	return 1;
}

/* True if some residency has (layer, expert) cold: its demand would start a read. */
static bool any_cold(struct forward_engine *e, uint32_t moe_layer, uint32_t expert)
{
	for (uint32_t n = 0; n < e->w.n_res; n++)
		if (residency_state(e->w.res[n], moe_layer, expert) == EXPERT_COLD)
			return true;
	return false;
}

/* Every deferred-only group is in the wave running behind (none pending, ready or failed). */
static bool deferred_all_running(const struct forward_engine *e, uint32_t n_groups)
{
	for (uint32_t g = 0; g < n_groups; g++)
		if (e->rq->groups[g].deferred && e->rq->groups[g].state != GROUP_RUNNING)
			return false;
	return true;
}

/* Every group with an immediate entry is done (groups with one come first). */
static bool immediate_done(const struct forward_engine *e, uint32_t n_groups)
{
	for (uint32_t g = 0; g < n_groups && !e->rq->groups[g].deferred; g++)
		if (e->rq->groups[g].state != GROUP_DONE)
			return false;
	return true;
}

/* With q->immediate_ready, once immediate_done (at once when no group has an immediate
 * entry): sums the immediate output and hands it over. Deferred groups already resident start
 * first, as a wave behind this thread (pool_runs_behind): the other workers compute them while
 * this thread sums, hands over — the server posts and wakes its client — and, where workers
 * fill every core, yields its core to that client, whose next request is the critical path.
 * The wave is over before this returns, unless it holds every deferred group and the caller
 * asked for settle_later: then it is left running as the engine's tail. Nothing deferred is
 * read or computed before the immediate part is done. */
static int deliver_when_done(struct forward_engine *e, const struct forward_request *q,
                             uint32_t n_groups, float *out_imm, struct forward_result *res)
{
	if (!q->immediate_ready || res->immediate_delivered || !immediate_done(e, n_groups))
		return MOE_OK;
	uint64_t t0 = monotonic_us();
	uint32_t behind = 0;
	int rc = MOE_OK;
	if (pool_runs_behind(&e->pool)) {
		rc = build_wave(e, q, n_groups, WAVE_DEFERRED, res, &behind);
		if (rc == MOE_OK && behind) {
			settle(e, true);
			pool_start_wave(&e->pool, e->rq->wave, behind, POOL_WAVE_BEHIND);
			for (uint32_t i = 0; i < behind; i++)
				e->rq->groups[e->rq->wave_group_of[i]].state = GROUP_RUNNING;
		} else {
			behind = 0;
		}
	}
	sum_part(e, e->rq, q, out_imm, false);
	res->compute_us += monotonic_us() - t0;
	res->immediate_delivered = true;
	q->immediate_ready(q->immediate_arg, res);
	if (behind && q->settle_later && rc == MOE_OK && deferred_all_running(e, n_groups)) {
		/* Nothing else deferred is left: forward_run returns now, the next planning runs
		 * while this wave does, and the wave is settled before the pool's next one. */
		e->tail = (struct deferred_tail){.pending = true,
		                                 .ctx = e->rq,
		                                 .n_wave = behind,
		                                 .n_tokens = q->n_tokens,
		                                 .k = q->k};
		res->deferred_pending = true;
		return MOE_OK;
	}
	if (behind) {
		t0 = monotonic_us();
		pool_wait_wave(&e->pool);
		wave_done(e, e->rq, behind);
		res->compute_us += monotonic_us() - t0;
	}
	return rc; /* a deferred group that could not be prepared fails after the delivery */
}

/* The waves of one request: everything READY (WAVE_ALL), or with early delivery the
 * immediate groups, the delivery when they are all done, then the deferred ones. */
static int compute_waves(struct forward_engine *e, const struct forward_request *q,
                         uint32_t n_groups, float *out_imm, struct forward_result *res)
{
	if (!q->immediate_ready)
		return compute_ready(e, q, n_groups, WAVE_ALL, res);
	int rc = compute_ready(e, q, n_groups, WAVE_IMMEDIATE, res);
	if (rc == MOE_OK)
		rc = deliver_when_done(e, q, n_groups, out_imm, res);
	if (rc < 0)
		return rc;
	return compute_ready(e, q, n_groups, WAVE_DEFERRED, res);
}

/* A demand of group g failed with rc (res filled). With early delivery a deferred-only group's
 * failure does not cost the immediate part: the group is settled as FAILED, *deferred_rc
 * keeps the status for forward_run to return after the delivery, and this returns 1 (one more
 * group settled). Otherwise returns rc: the request fails. */
static int settle_failure(struct forward_engine *e, const struct forward_request *q,
                          struct req_group *g, int rc, int *deferred_rc)
{
	if (!q->immediate_ready || !g->deferred)
		return rc;
	release_group(e, g);
	g->state = GROUP_FAILED;
	*deferred_rc = rc;
	return 1;
}

static int execute(struct forward_engine *e, const struct forward_request *q, uint32_t moe_layer,
                   uint32_t n_groups, float *out_imm, struct forward_result *res)
{
	int rc, deferred_rc = MOE_OK;
	if (e->w.source != FORWARD_SOURCE_RESIDENCY) {
		char err[128];
		for (uint32_t g = 0; g < n_groups; g++) {
			struct req_group *rg = &e->rq->groups[g];
			if (weights_static_view(&e->w, moe_layer, rg->expert, &rg->held.view, err,
			                        sizeof(err)) != 0)
				return fail(res, MOE_EIO, -1, -1, (int32_t)rg->expert, "%s", err);
			rg->state = GROUP_READY;
			res->hits++;
		}
		return compute_waves(e, q, n_groups, out_imm, res);
	}
	uint32_t done = 0;
	for (;;) {
		/* Demand every pending expert without waiting: all cold reads go out first. The
		 * ones already resident or loading are taken first, so a cold read of this request
		 * never evicts an expert the same request is about to use. */
		uint32_t ready = 0;
		for (int pass = 0; pass < 2; pass++)
			for (uint32_t g = 0; g < n_groups; g++) {
				struct req_group *rg = &e->rq->groups[g];
				if (rg->state != GROUP_PENDING ||
				    (pass == 0 && any_cold(e, moe_layer, rg->expert)))
					continue;
				rc = demand(e, q, moe_layer, rg, false, res);
				if (rc < 0)
					rc = settle_failure(e, q, rg, rc, &deferred_rc);
				if (rc < 0)
					goto failed;
				ready += (uint32_t)rc;
			}
		if (ready == 0 && done < n_groups) {
			/* Nothing arrived: wait for the first pending one, holding nothing (the
			 * slices that pending groups hold on some nodes are let go, so a small
			 * budget cannot deadlock; they are demanded again, not counted again).
			 * Nor may the last request's deferred wave hold its experts meanwhile:
			 * only this thread lets them go, so it is settled first. */
			settle(e, true);
			for (uint32_t g = 0; g < n_groups; g++)
				if (e->rq->groups[g].state == GROUP_PENDING)
					release_group(e, &e->rq->groups[g]);
			for (uint32_t g = 0; g < n_groups; g++) {
				if (e->rq->groups[g].state != GROUP_PENDING)
					continue;
				const uint64_t t0 = monotonic_us();
				rc = demand(e, q, moe_layer, &e->rq->groups[g], true, res);
				res->io_us += monotonic_us() - t0;
				if (rc < 0)
					rc = settle_failure(e, q, &e->rq->groups[g], rc,
					                    &deferred_rc);
				if (rc < 0)
					goto failed;
				ready = 1;
				break;
			}
		}
		rc = compute_waves(e, q, n_groups, out_imm, res);
		if (rc < 0)
			goto failed;
		done += ready;
		if (done >= n_groups)
			return deferred_rc; /* MOE_OK, or a deferred expert's failure after delivery
			                     */
	}
failed:
	release_all(e, n_groups);
	return rc;
}

static void record(struct forward_engine *e, uint32_t moe_layer, const struct forward_request *q,
                   const struct forward_result *res, uint64_t total_us)
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
	for (int k = 0; k < LAT_KINDS; k++)
		atomic_fetch_add_explicit(&c->hist[k][lat_hist_bucket(lat[k])], 1,
		                          memory_order_relaxed);
}

bool forward_would_run_now(struct forward_engine *e, int32_t layer, const int32_t *ids, size_t n)
{
	if (e->w.source == FORWARD_SOURCE_ALL_RESIDENT)
		return true;
	if (e->w.source != FORWARD_SOURCE_RESIDENCY)
		return false;
	if (layer < 0 || (uint32_t)layer >= e->cat->info.n_layers || e->w.moe_index[layer] < 0)
		return true; /* fails validation at once */
	const uint32_t moe_layer = (uint32_t)e->w.moe_index[layer];
	for (size_t i = 0; i < n; i++) {
		const int32_t id = ((const volatile int32_t *)ids)[i];
		if (id < 0 || (uint32_t)id >= e->cat->info.n_experts)
			continue;
		for (uint32_t r = 0; r < e->w.n_res; r++)
			if (residency_state(e->w.res[r], moe_layer, (uint32_t)id) !=
			    EXPERT_RESIDENT)
				return false;
	}
	return true;
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

int forward_run(struct forward_engine *e, const struct forward_request *q, float *out_immediate,
                float *out_deferred, struct forward_result *res)
{
	const uint64_t t0 = monotonic_us();
	engine_take(e);
	const uint64_t t1 = monotonic_us();
	uint32_t moe_layer = 0;
	int rc = validate(e, q, out_deferred, res, &moe_layer);
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
				settle(e, true);
		}
		e->rq = c;
		const uint32_t n_groups = plan_request(e, q, moe_layer);
		res->experts = n_groups;
		for (uint32_t t = 0; t < q->n_tokens; t++)
			res->n_deferred += e->rq->tok_n_valid[t] - e->rq->tok_n_imm[t];
		rc = execute(e, q, moe_layer, n_groups, out_immediate, res);
		if (rc == MOE_OK) {
			const uint64_t t2 = monotonic_us();
			if (!res->immediate_delivered)
				sum_part(e, e->rq, q, out_immediate, false);
			if (res->deferred_pending)
				e->tail.out_deferred = out_deferred;
			else if (out_deferred)
				sum_part(e, e->rq, q, out_deferred, true);
			res->compute_us += monotonic_us() - t2;
		}
		res->status = rc;
	}
	engine_give_back(e);
	if (rc != MOE_EBADLAYER && rc != MOE_EINVAL)
		record(e, moe_layer, q, res, monotonic_us() - t0);
	return rc;
}

void forward_settle(struct forward_engine *e)
{
	engine_take(e);
	settle(e, true);
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
	size_t f[FORWARD_MAX_NODES + 1], o[FORWARD_MAX_NODES + 1];
	forward_expert_split(&h->view, n_nodes, f, o);
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
	settle(e, true); /* its experts held would leave this one fewer slots to wait for */
	uint32_t moe_layer = 0;
	const int rc = validate(e, q, out_deferred, res, &moe_layer);
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
	struct held_expert held = {0};
	char err[128];
	int rc = MOE_OK;
	if (e->w.source == FORWARD_SOURCE_RESIDENCY) {
		int a = 0;
		for (uint32_t r = 0; r < e->w.n_res && a == 0; r++) {
			a = residency_acquire(e->w.res[r], moe_layer, x, -1.0f, 0, &held.ref[r]);
			if (a != 0) {
				struct req_group g = {.expert = x};
				rc = demand_failed(e, q, &g, r, a, res);
			} else {
				held.held_nodes |= 1u << r;
			}
		}
		if (a != 0) {
			weights_release(&e->w, &held);
			return rc;
		}
		if (weights_held_view(&e->w, &held, err, sizeof(err)) != 0)
			rc = fail(res, MOE_EIO, -1, -1, (int32_t)x, "%s", err);
	} else if (weights_static_view(&e->w, moe_layer, x, &held.view, err, sizeof(err)) != 0) {
		rc = fail(res, MOE_EIO, -1, -1, (int32_t)x, "%s", err);
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
			rc = fail(res, MOE_ENOMEM, -1, -1, -1, "reference: out of memory");
		else if ((e->w.sliced ? run_slices(c, &held, e->w.n_nodes, err, sizeof(err))
		                      : moek_ffn_run(c, err, sizeof(err))) != 0)
			rc = fail(res, MOE_EIO, -1, -1, (int32_t)x, "layer %d expert %u: %s",
			          q->layer, x, err);
	}
	c->expert = NULL;
	c->scratch = NULL;
	free(scratch);
	weights_release(&e->w, &held);
	return rc;
}

/* ---- prefetch, masks -------------------------------------------------------------------
 */

int forward_prefetch(struct forward_engine *e, int32_t layer, const int32_t *ids,
                     const float *scores, uint32_t n, bool scores_per_expert)
{
	const struct moe_model_hparams *info = &e->cat->info;
	if (layer < 0 || (uint32_t)layer >= info->n_layers || e->w.moe_index[layer] < 0)
		return MOE_EBADLAYER;
	if (e->w.source != FORWARD_SOURCE_RESIDENCY)
		return 0;
	const uint32_t l = (uint32_t)e->w.moe_index[layer];
	int started = 0;
	if (scores_per_expert) {
		if (!scores || n != info->n_experts)
			return MOE_EINVAL;
		/* The top_k highest positive finite scores, best first (k is small:
		 * selection by scans). */
		uint32_t top = info->top_k ? info->top_k : 1;
		float last = INFINITY;
		int32_t last_id = -1;
		for (uint32_t r = 0; r < top; r++) {
			int32_t best = -1;
			for (uint32_t x = 0; x < n; x++) {
				const float s = scores[x];
				if (!isfinite(s) || s <= 0.0f || s > last ||
				    (s == last && (int32_t)x <= last_id))
					continue;
				if (best < 0 || s > scores[best])
					best = (int32_t)x;
			}
			if (best < 0)
				break;
			uint32_t id = (uint32_t)best;
			const float pri = scores[best] * (float)top;
			int any = 0;
			for (uint32_t node = 0; node < e->w.n_res; node++) {
				residency_hint(e->w.res[node], l, &id, 1, pri);
				any |= residency_prefetch(e->w.res[node], l, &id, 1, pri) > 0;
			}
			started += any;
			last = scores[best];
			last_id = best;
		}
		return started;
	}
	/* Every hint first, then the loads: a hinted resident expert is marked needed before
	 * any of the hint's prefetches looks for a victim. */
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t i = 0; i < n; i++) {
			if (ids[i] < 0 || (uint32_t)ids[i] >= info->n_experts)
				continue;
			uint32_t id = (uint32_t)ids[i];
			const float pri = scores && isfinite(scores[i]) ? scores[i] : 1.0f;
			int any = 0;
			for (uint32_t r = 0; r < e->w.n_res; r++)
				if (pass == 0)
					residency_hint(e->w.res[r], l, &id, 1, pri);
				else
					any |= residency_prefetch(e->w.res[r], l, &id, 1, pri) > 0;
			started += any;
		}
	return started;
}

/* Pushes the all-clients intersection of masks of transformer block `layer` into residency
 * (mask_lock held). */
static void sync_residency_mask(struct forward_engine *e, uint32_t layer)
{
	if (e->w.moe_index[layer] < 0)
		return;
	bool any = false;
	for (uint32_t c = 0; c < FORWARD_MAX_CLIENTS; c++)
		any |= e->attached[c];
	uint32_t masked = 0;
	for (uint32_t x = 0; x < e->cat->info.n_experts; x++) {
		bool all = any;
		for (uint32_t c = 0; c < FORWARD_MAX_CLIENTS && all; c++)
			if (e->attached[c])
				all = mask_bit(e, c, layer, x);
		e->res_mask[x] = all;
		masked += all;
	}
	e->masked_now[layer] = masked;
	if (e->w.source != FORWARD_SOURCE_RESIDENCY)
		return;
	for (uint32_t r = 0; r < e->w.n_res; r++)
		residency_set_gpu_mask(e->w.res[r], (uint32_t)e->w.moe_index[layer], e->res_mask);
}

int forward_set_mask(struct forward_engine *e, uint32_t client, int32_t layer, const uint8_t *bits,
                     size_t n_bytes)
{
	const uint32_t n_layers = e->cat->info.n_layers;
	if (client >= FORWARD_MAX_CLIENTS)
		return MOE_EINVAL;
	if (layer < -1 || layer >= (int32_t)n_layers)
		return MOE_EBADLAYER;
	const size_t need = layer < 0 ? n_layers * e->mask_row : e->mask_row;
	if (n_bytes < need)
		return MOE_ETOOSMALL;
	pthread_mutex_lock(&e->mask_lock);
	e->attached[client] = true;
	uint8_t *mine = e->masks + (size_t)client * n_layers * e->mask_row;
	const uint32_t first = layer < 0 ? 0 : (uint32_t)layer;
	bool changed = false;
	for (uint32_t l = first; l < (layer < 0 ? n_layers : first + 1); l++) {
		uint8_t *row = mine + l * e->mask_row;
		const uint8_t *in = bits + (l - first) * e->mask_row;
		for (size_t b = 0; b < e->mask_row; b++) {
			uint8_t v = in[b];
			/* Bits past n_experts in the last byte are ignored: clear them. */
			if (b == e->mask_row - 1 && e->cat->info.n_experts % 8)
				v &= (uint8_t)((1u << (e->cat->info.n_experts % 8)) - 1u);
			changed |= row[b] != v;
			row[b] = v;
		}
		sync_residency_mask(e, l);
	}
	e->mask_switches += changed;
	pthread_mutex_unlock(&e->mask_lock);
	return MOE_OK;
}

static void set_attached(struct forward_engine *e, uint32_t client, bool attached)
{
	if (client >= FORWARD_MAX_CLIENTS)
		return;
	pthread_mutex_lock(&e->mask_lock);
	e->attached[client] = attached;
	if (!attached)
		memset(e->masks + (size_t)client * e->cat->info.n_layers * e->mask_row, 0,
		       e->cat->info.n_layers * e->mask_row);
	for (uint32_t l = 0; l < e->cat->info.n_layers; l++)
		sync_residency_mask(e, l);
	pthread_mutex_unlock(&e->mask_lock);
}

void forward_mask_info(struct forward_engine *e, uint64_t *switches, uint64_t *masked)
{
	pthread_mutex_lock(&e->mask_lock);
	*switches = e->mask_switches;
	uint64_t n = 0;
	for (uint32_t l = 0; l < e->cat->info.n_layers; l++)
		n += e->masked_now[l];
	*masked = n;
	pthread_mutex_unlock(&e->mask_lock);
}

void forward_client_attach(struct forward_engine *e, uint32_t client)
{
	set_attached(e, client, true);
}

void forward_client_detach(struct forward_engine *e, uint32_t client)
{
	set_attached(e, client, false);
}

uint32_t forward_retry_failed(struct forward_engine *e)
{
	uint32_t n = 0;
	for (uint32_t r = 0; e->w.source == FORWARD_SOURCE_RESIDENCY && r < e->w.n_res; r++)
		n += residency_retry_all_failed(e->w.res[r]);
	return n;
}

/* ---- statistics ------------------------------------------------------------------------
 */

int forward_node_residency(struct forward_engine *e, uint32_t node, struct residency_counters *out)
{
	if (e->w.source != FORWARD_SOURCE_RESIDENCY || node >= e->w.n_res)
		return -1;
	residency_counters(e->w.res[node], out);
	return 0;
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

void forward_stats(struct forward_engine *e, struct forward_stats *out)
{
	struct forward_layer_stats *layers = out->layers;
	memset(out, 0, sizeof(*out));
	out->layers = layers;
	out->n_layers = e->w.n_moe_layers;
	for (uint32_t l = 0; l < e->w.n_moe_layers; l++) {
		const struct layer_counters *c = &e->counters[l];
		struct forward_layer_stats s = {.layer = e->w.model_layer[l]};
#define LOAD(f) s.f = atomic_load_explicit(&c->f, memory_order_relaxed)
		LOAD(requests);
		LOAD(tokens);
		LOAD(hits);
		LOAD(cold_misses);
		LOAD(inflight_misses);
		LOAD(bytes_read);
		LOAD(failures);
#undef LOAD
		s.queue_p50_us = percentile(c->hist[LAT_QUEUE], 0.5);
		s.queue_p99_us = percentile(c->hist[LAT_QUEUE], 0.99);
		s.io_p50_us = percentile(c->hist[LAT_IO], 0.5);
		s.io_p99_us = percentile(c->hist[LAT_IO], 0.99);
		s.compute_p50_us = percentile(c->hist[LAT_COMPUTE], 0.5);
		s.compute_p99_us = percentile(c->hist[LAT_COMPUTE], 0.99);
		s.total_p50_us = percentile(c->hist[LAT_TOTAL], 0.5);
		s.total_p99_us = percentile(c->hist[LAT_TOTAL], 0.99);
		out->requests += s.requests;
		out->tokens += s.tokens;
		out->hits += s.hits;
		out->cold_misses += s.cold_misses;
		out->inflight_misses += s.inflight_misses;
		out->bytes_read += s.bytes_read;
		out->failures += s.failures;
		if (layers)
			layers[l] = s;
	}
	if (e->w.source == FORWARD_SOURCE_RESIDENCY) {
		out->pool_hugetlb = out->pool_thp = e->w.n_res > 0;
		for (uint32_t r = 0; r < e->w.n_res; r++) {
			struct residency_counters rc;
			residency_counters(e->w.res[r], &rc);
			out->resident_bytes += rc.resident_bytes;
			out->slot_bytes_used += (uint64_t)rc.slots_used * rc.slot_bytes;
			out->pool_bytes += (uint64_t)rc.slots * rc.slot_bytes;
			out->budget_bytes += rc.budget_bytes;
			out->slots += rc.slots;
			out->evictions += rc.evictions;
			out->loader_bytes_read += rc.bytes_read;
			out->prefetches += rc.prefetches;
			out->prefetch_hits += rc.prefetch_hits;
			out->prefetch_wasted += rc.prefetch_wasted;
			out->failed_experts += rc.failed_now;
			out->failed_retries += rc.failed_retries;
			out->fixed_reads += rc.fixed_reads;
			out->plain_reads += rc.plain_reads;
			out->fixed_buffers += rc.fixed_buffers;
			out->pool_hugetlb = out->pool_hugetlb && rc.hugetlb;
			out->pool_thp = out->pool_thp && rc.thp;
		}
	} else {
		out->resident_bytes =
		    e->w.source == FORWARD_SOURCE_ALL_RESIDENT ? e->w.budget_bytes : 0;
		out->slot_bytes_used = out->pool_bytes = out->resident_bytes;
		out->budget_bytes = e->w.budget_bytes;
	}
	out->request_bytes = e->ctx[0].bytes + e->ctx[1].bytes;
}

void forward_stats_write(const struct forward_stats *st, struct json_writer *w)
{
	jw_kv_u64(w, "requests", st->requests);
	jw_kv_u64(w, "tokens", st->tokens);
	jw_kv_u64(w, "hits", st->hits);
	jw_kv_u64(w, "cold_misses", st->cold_misses);
	jw_kv_u64(w, "inflight_misses", st->inflight_misses);
	jw_kv_u64(w, "bytes_read", st->bytes_read);
	jw_kv_u64(w, "failures", st->failures);
	jw_kv_u64(w, "resident_bytes", st->resident_bytes);
	jw_kv_u64(w, "slot_bytes_used", st->slot_bytes_used);
	jw_kv_u64(w, "pool_bytes", st->pool_bytes);
	jw_kv_u64(w, "budget_bytes", st->budget_bytes);
	jw_kv_u64(w, "slots", st->slots);
	jw_kv_u64(w, "evictions", st->evictions);
	jw_kv_u64(w, "loader_bytes_read", st->loader_bytes_read);
	jw_kv_u64(w, "prefetches", st->prefetches);
	jw_kv_u64(w, "prefetch_hits", st->prefetch_hits);
	jw_kv_u64(w, "prefetch_wasted", st->prefetch_wasted);
	jw_kv_u64(w, "failed_experts", st->failed_experts);
	jw_kv_u64(w, "failed_retries", st->failed_retries);
	jw_kv_u64(w, "fixed_reads", st->fixed_reads);
	jw_kv_u64(w, "plain_reads", st->plain_reads);
	jw_kv_u64(w, "fixed_buffers", st->fixed_buffers);
	jw_kv_u64(w, "pool_hugetlb", st->pool_hugetlb ? 1 : 0);
	jw_kv_u64(w, "pool_thp", st->pool_thp ? 1 : 0);
	jw_key(w, "layers");
	jw_array_begin(w);
	for (uint32_t l = 0; st->layers && l < st->n_layers; l++) {
		const struct forward_layer_stats *s = &st->layers[l];
		if (s->requests == 0)
			continue;
		jw_object_begin(w);
		jw_kv_u64(w, "layer", s->layer);
		jw_kv_u64(w, "requests", s->requests);
		jw_kv_u64(w, "tokens", s->tokens);
		jw_kv_u64(w, "hits", s->hits);
		jw_kv_u64(w, "cold_misses", s->cold_misses);
		jw_kv_u64(w, "inflight_misses", s->inflight_misses);
		jw_kv_u64(w, "bytes_read", s->bytes_read);
		jw_kv_u64(w, "failures", s->failures);
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
