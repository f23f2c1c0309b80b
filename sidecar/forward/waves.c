/* waves.c — a planned request executed.
 *
 * Every group's expert is demanded without waiting first (weights_demand_layer: all cold reads of
 * the request are submitted before any compute); the groups that are ready are computed as
 * one wave while the rest load; then each further wave takes what has arrived, and only when
 * nothing has arrived does the engine wait for one expert (holding no reference, so a tiny
 * budget cannot deadlock). References are released after each wave. With one residency per
 * NUMA node an expert is ready when every node holds its slice (one residency decides).
 *
 * Early delivery (forward_request.immediate_ready): waves then take the immediate groups
 * before the deferred ones, and the immediate output is summed and handed to the caller as
 * soon as the last immediate group is done — the server posts it while the deferred experts
 * compute (or still load), which is what deferral is for. Without it, one wave takes every
 * ready group, and both sums are taken at the end. A deferred wave may be left running
 * behind the caller (the tail), settled before the pool's next wave.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "forward_internal.h"
#include "moe_abi.h"

/* Prepares group g's call into wave slot `slot` using scratch from *scratch_at. Returns 0,
 * 1 if the scratch arena is full (run the wave first), or a negative status (res filled). */
static int add_to_wave(struct forward_engine *e, const struct forward_request *q, uint32_t g,
                       uint32_t slot, size_t *scratch_at, struct forward_result *res)
{
	struct req_group *rg = &e->rq->groups[g];
	const struct held_expert *h = &e->rq->held[g];
	struct wave_group *wg = &e->rq->wave[slot];
	const unsigned W = e->pool.n_workers;
	const size_t need = moek_ffn_scratch_bytes(&h->view, rg->count, W);
	if (*scratch_at + need > e->rq->scratch_bytes)
		return 1;
	memset(wg, 0, sizeof(*wg));
	struct moek_ffn_call *c = &wg->call;
	const size_t row = (size_t)e->hidden * dtype_size(q->x_dtype);
	c->expert = &h->view;
	c->n_tokens = rg->count;
	c->x = e->rq->xg + (size_t)rg->first * row;
	c->x_dtype = q->x_dtype;
	c->weights = e->rq->wg + rg->first;
	c->out = e->rq->yg + (size_t)rg->first * e->hidden;
	c->scratch = e->rq->scratch + *scratch_at;
	c->scratch_bytes = need;
	c->n_workers = W;
	c->batch_invariant = q->batch_invariant;
	memset(c->out, 0, (size_t)rg->count * e->hidden * sizeof(float));
	char err[128];
	if (moek_ffn_prepare(c, err, sizeof(err)) != 0)
		return plan_fail(res, MOE_EIO, -1, -1, (int32_t)rg->expert,
		                 "layer %d expert %u: %s", q->layer, rg->expert, err);
	*scratch_at = align_up_64(*scratch_at + need);
	wg->f_align = h->tp->f_align;
	wg->h_align = h->tp->h_align;
	memcpy(wg->f_split, h->tp->f_split, sizeof(wg->f_split));
	memcpy(wg->o_split, h->tp->o_split, sizeof(wg->o_split));
	for (uint32_t n = 0; n < e->topo.n_nodes; n++)
		wg->node_expert[n] = weights_node_view(&e->w, h, n);
	e->rq->wave_group_of[slot] = g;
	return 0;
}

static void release_all(struct forward_engine *e, uint32_t n_groups)
{
	weights_release_layer(&e->w, e->rq->held, NULL, n_groups);
}

/* The wave of c->wave[0, n_wave) has ended (pool_run_wave, or pool_wait_wave after a wave
 * started behind the caller): its groups are done and their experts let go. */
static void wave_done(struct forward_engine *e, struct req_ctx *c, uint32_t n_wave)
{
	for (uint32_t i = 0; i < n_wave; i++)
		c->groups[c->wave_group_of[i]].state = GROUP_DONE;
	weights_release_layer(&e->w, c->held, c->wave_group_of, n_wave);
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
			return rc < 0 ? rc
			              : plan_fail(res, MOE_ENOMEM, -1, -1, -1,
			                          "scratch arena too small");
		(*n_wave)++;
	}
	return MOE_OK;
}

/* The tail (struct deferred_tail) of the request before: its wave joined, its experts let go,
 * its deferred sum written (sum = false: not, at destroy). */
void waves_settle(struct forward_engine *e, bool sum)
{
	struct deferred_tail *t = &e->tail;
	if (!t->pending)
		return;
	pool_wait_wave(&e->pool);
	wave_done(e, t->ctx, t->n_wave);
	if (sum && t->out_deferred) {
		const struct forward_request q = {.n_tokens = t->n_tokens, .k = t->k};
		plan_sum(e, t->ctx, &q, t->out_deferred, true);
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
		waves_settle(e, true); /* planned and prepared while the last tail ran */
		pool_run_wave(&e->pool, e->rq->wave, n_wave);
		wave_done(e, e->rq, n_wave);
	}
	res->compute_us += monotonic_us() - t0;
	return rc;
}

int waves_demand_failed(struct forward_engine *e, const struct forward_request *q,
                        const struct req_group *g, int rc, struct forward_result *res)
{
	if (rc == -EPERM)
		return plan_fail(res, MOE_EMASKED, -1, -1, (int32_t)g->expert,
		                 "layer %d expert %u is GPU-masked", q->layer, g->expert);
	if (rc == -ESHUTDOWN)
		return plan_fail(res, MOE_ESHUTDOWN, -1, -1, (int32_t)g->expert, "shutting down");
	if (rc == -ENOSPC)
		return plan_fail(res, MOE_EIO, -1, -1, (int32_t)g->expert,
		                 "layer %d expert %u: no slot can be freed for it (nothing in use, "
		                 "nothing the policy may evict)",
		                 q->layer, g->expert);
	char why[120];
	weights_error_message(&e->w, (uint32_t)e->w.moe_index[q->layer], g->expert, why,
	                      sizeof(why));
	if (!why[0])
		snprintf(why, sizeof(why), "%s", strerror(-rc));
	return plan_fail(res, MOE_EIO, -1, -1, (int32_t)g->expert, "layer %d expert %u: %s",
	                 q->layer, g->expert, why);
}

/* Counts how a demand found its experts into res. */
static void count_demand(struct forward_result *res, const struct weights_demand_counts *c)
{
	res->hits += c->hits;
	res->inflight_misses += c->inflight_misses;
	res->cold_misses += c->cold_misses;
	res->bytes_read += c->bytes_read;
}

/* A failed demand (rc, err) of group g turned into res's status. */
static int demand_failed(struct forward_engine *e, const struct forward_request *q, uint32_t g,
                         int rc, const struct sidecar_error *err, struct forward_result *res)
{
	if (rc == -EINVAL)
		return plan_fail(res, MOE_EIO, -1, -1, (int32_t)e->rq->groups[g].expert, "%s",
		                 err->msg);
	return waves_demand_failed(e, q, &e->rq->groups[g], rc, res);
}

/* The waiting demand of group g: 1 once its expert is held everywhere (READY), or a negative
 * status (res filled). */
static int demand_wait(struct forward_engine *e, const struct forward_request *q,
                       uint32_t moe_layer, uint32_t g, struct forward_result *res)
{
	enum weights_found found;
	uint64_t cold_bytes;
	struct sidecar_error err;
	const int rc =
	    weights_demand(&e->w, moe_layer, &e->rq->held[g], true, &found, &cold_bytes, &err);
	const struct weights_demand_counts c = {.hits = found == WEIGHTS_HIT,
	                                        .inflight_misses = found == WEIGHTS_IN_FLIGHT,
	                                        .cold_misses = found == WEIGHTS_COLD,
	                                        .bytes_read = cold_bytes};
	count_demand(res, &c);
	if (rc < 0)
		return demand_failed(e, q, g, rc, &err, res);
	if (rc == 1) {
		e->rq->held[g].hold.pending = false;
		e->rq->groups[g].state = GROUP_READY;
	}
	return rc;
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
			waves_settle(e, true);
			pool_start_wave(&e->pool, e->rq->wave, behind, POOL_WAVE_BEHIND);
			for (uint32_t i = 0; i < behind; i++)
				e->rq->groups[e->rq->wave_group_of[i]].state = GROUP_RUNNING;
		} else {
			behind = 0;
		}
	}
	plan_sum(e, e->rq, q, out_imm, false);
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
static int settle_failure(struct forward_engine *e, const struct forward_request *q, uint32_t g,
                          int rc, int *deferred_rc)
{
	if (!q->immediate_ready || !e->rq->groups[g].deferred)
		return rc;
	weights_release_layer(&e->w, e->rq->held, &g, 1);
	e->rq->held[g].hold.pending = false;
	e->rq->groups[g].state = GROUP_FAILED;
	*deferred_rc = rc;
	return 1;
}

int waves_execute(struct forward_engine *e, const struct forward_request *q, uint32_t moe_layer,
                  uint32_t n_groups, float *out_imm, struct forward_result *res)
{
	int rc, deferred_rc = MOE_OK;
	uint32_t done = 0;
	for (;;) {
		/* Demand every pending expert without waiting: all cold reads go out first. The
		 * ones already resident or loading are taken first, so a cold read of this request
		 * never evicts an expert the same request is about to use. */
		uint32_t ready = 0, cursor = 0;
		for (;;) {
			struct weights_demand_counts counts = {0};
			struct sidecar_error err;
			rc = weights_demand_layer(&e->w, moe_layer, e->rq->held, n_groups, &cursor,
			                          &ready, &counts, &err);
			count_demand(res, &counts);
			if (rc == 0)
				break;
			const uint32_t g = (cursor - 1) % n_groups;
			rc = settle_failure(e, q, g, demand_failed(e, q, g, rc, &err, res),
			                    &deferred_rc);
			if (rc < 0)
				goto failed;
			ready += (uint32_t)rc; /* settled as FAILED */
		}
		for (uint32_t g = 0; g < n_groups; g++)
			if (e->rq->groups[g].state == GROUP_PENDING && !e->rq->held[g].hold.pending)
				e->rq->groups[g].state = GROUP_READY;
		if (ready == 0 && done < n_groups) {
			/* Nothing arrived: wait for the first pending one, holding nothing (a
			 * pending group holds no reference: an expert is held on every node or on
			 * none), so a small budget cannot deadlock. Nor may the last request's
			 * deferred wave hold its experts meanwhile: only this thread lets them go,
			 * so it is settled first. */
			waves_settle(e, true);
			for (uint32_t g = 0; g < n_groups; g++) {
				if (e->rq->groups[g].state != GROUP_PENDING)
					continue;
				const uint64_t t0 = monotonic_us();
				rc = demand_wait(e, q, moe_layer, g, res);
				res->io_us += monotonic_us() - t0;
				if (rc < 0)
					rc = settle_failure(e, q, g, rc, &deferred_rc);
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
