/* plan.c — a request checked and planned.
 *
 * Validation runs on the engine's private copies (ids, weights, activations, the client's
 * mask). A request is planned once: each token's valid ids are ordered by weight (descending,
 * ties by position), the last k_defer of them deferred (defer_cold: those not ready first);
 * (token, position) pairs are grouped per (immediate|deferred, expert) by a stable counting
 * sort, so a group lists its tokens in order. Each group is one kernel call over its gathered
 * input rows into its own zeroed output rows; the per-token sums (plan_sum) are taken at the
 * end in the planned order. That fixes every output's summation order whatever the thread
 * count, node split or load completion order.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "forward_internal.h"
#include "moe_abi.h"

/* ---- validation ------------------------------------------------------------------------ */

__attribute__((format(printf, 6, 7))) int plan_fail(struct forward_result *res, int status,
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

/* Checks everything the request's values could get wrong; *moe_layer receives the MoE layer. */
int plan_validate(struct forward_engine *e, const struct forward_request *q,
                  const float *out_deferred, struct forward_result *res, uint32_t *moe_layer)
{
	memset(res, 0, sizeof(*res));
	res->bad_token = res->bad_index = res->bad_expert = -1;
	const struct moe_model_hparams *info = &e->cat->info;
	if (q->client >= FORWARD_MAX_CLIENTS)
		return plan_fail(res, MOE_EINVAL, -1, -1, -1, "client %u out of range", q->client);
	if (q->layer < 0 || (uint32_t)q->layer >= info->n_layers || e->w.moe_index[q->layer] < 0)
		return plan_fail(res, MOE_EBADLAYER, -1, -1, -1,
		                 "layer %d is not an MoE layer (%u blocks)", q->layer,
		                 info->n_layers);
	*moe_layer = (uint32_t)e->w.moe_index[q->layer];
	if (q->n_tokens == 0 || q->n_tokens > e->max_tokens)
		return plan_fail(res, MOE_EBADTOKENS, -1, -1, -1, "%u tokens (1..%u)", q->n_tokens,
		                 e->max_tokens);
	if (q->k == 0 || q->k > e->max_k)
		return plan_fail(res, MOE_EBADTOPK, -1, -1, -1, "%u ids per token (1..%u)", q->k,
		                 e->max_k);
	if (q->x_dtype >= 3u /* f32, f16, bf16 */)
		return plan_fail(res, MOE_EBADDTYPE, -1, -1, -1, "activation dtype %u unknown",
		                 q->x_dtype);
	if (q->k_defer > q->k)
		return plan_fail(res, MOE_EBADFIELD, -1, -1, -1, "k_defer %u > k %u", q->k_defer,
		                 q->k);
	if (q->k_defer && *moe_layer == e->last_moe_layer)
		return plan_fail(res, MOE_EBADFIELD, -1, -1, -1,
		                 "layer %d is the last MoE layer: nothing may be deferred",
		                 q->layer);
	if (q->defer_union && q->defer_cold)
		return plan_fail(res, MOE_EBADFIELD, -1, -1, -1,
		                 "MOE_FWD_DEFER_UNION and MOE_FWD_DEFER_COLD together");
	if (q->k_defer && !out_deferred)
		return plan_fail(res, MOE_EINVAL, -1, -1, -1, "k_defer without a deferred output");
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
				return plan_fail(
				    res, MOE_EBADEXPERT, (int32_t)t, (int32_t)j, id,
				    "token %u id %u: expert %d out of range (0..%u, -1 = skip)", t,
				    j, id, info->n_experts - 1);
			if (e->row_mark[id] == e->row_stamp) {
				/* A router picks each expert once per token: a repeat is a bug
				 * upstream, and summing it twice would hide it. */
				uint32_t first = 0;
				while (q->ids[(size_t)t * q->k + first] != id)
					first++;
				return plan_fail(
				    res, MOE_EBADEXPERT, (int32_t)t, (int32_t)j, id,
				    "token %u id %u: expert %d is named twice in the token's "
				    "row (first as id %u)",
				    t, j, id, first);
			}
			e->row_mark[id] = e->row_stamp;
			if (!isfinite(w))
				return plan_fail(res, MOE_EBADWEIGHT, (int32_t)t, (int32_t)j, id,
				                 "token %u id %u: weight of expert %d not finite",
				                 t, j, id);
		}
	}
	const size_t row = (size_t)e->hidden * dtype_size(q->x_dtype);
	for (uint32_t t = 0; t < q->n_tokens; t++)
		if (!row_finite((const uint8_t *)q->x + t * row, q->x_dtype, e->hidden))
			return plan_fail(res, MOE_ENONFINITE, (int32_t)t, -1, -1,
			                 "token %u: NaN or Inf in the activations", t);
	pthread_mutex_lock(&e->mask_lock);
	for (uint32_t t = 0; t < q->n_tokens; t++)
		for (uint32_t j = 0; j < q->k; j++) {
			const int32_t id = q->ids[(size_t)t * q->k + j];
			if (id >= 0 && masks_bit(e, q->client, (uint32_t)q->layer, (uint32_t)id)) {
				pthread_mutex_unlock(&e->mask_lock);
				return plan_fail(
				    res, MOE_EMASKED, (int32_t)t, (int32_t)j, id,
				    "token %u id %u: layer %d expert %d is on the GPU (masked)", t,
				    j, q->layer, id);
			}
		}
	pthread_mutex_unlock(&e->mask_lock);
	return MOE_OK;
}

/* ---- planning -------------------------------------------------------------------------- */

/* True if (layer, expert) is not ready on every node now (defer_cold's test). */
static bool expert_cold_now(struct forward_engine *e, uint32_t moe_layer, uint32_t expert)
{
	return !weights_ready(&e->w, moe_layer, expert);
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

/* defer_union: marks in protect[] every expert among some token's k - k_defer highest-weighted
 * entries (all k ranked, -1 included; ties: earlier position first). */
static void protect_union(const struct forward_request *q, uint32_t n_experts, uint8_t *protect)
{
	const uint32_t k = q->k, keep = q->k - q->k_defer;
	memset(protect, 0, n_experts);
	for (uint32_t t = 0; t < q->n_tokens && keep; t++) {
		const int32_t *ids = &q->ids[(size_t)t * k];
		const float *w = &q->weights[(size_t)t * k];
		for (uint32_t j = 0; j < k; j++) {
			if (ids[j] < 0)
				continue;
			uint32_t above = 0; /* entries ranked before j */
			for (uint32_t i = 0; i < k && above < keep; i++)
				above += w[i] > w[j] || (w[i] == w[j] && i < j);
			if (above < keep)
				protect[ids[j]] = 1;
		}
	}
}

/* defer_union: a token's valid entries (order[] by weight) immediate where protected, the
 * rest deferred; order[] rewritten as the immediate ones by weight, then the deferred ones.
 * Returns how many are immediate. */
static uint32_t defer_unprotected(struct forward_engine *e, const int32_t *ids, uint16_t *order,
                                  uint8_t *kind, uint32_t n, const uint8_t *protect)
{
	uint32_t at = 0;
	for (int want = 1; want <= 2; want++)
		for (uint32_t r = 0; r < n; r++) {
			const uint8_t kd = protect[ids[order[r]]] ? 1 : 2;
			if (kd != want)
				continue;
			kind[order[r]] = kd;
			e->rq->order_tmp[at++] = order[r];
		}
	memcpy(order, e->rq->order_tmp, n * sizeof(uint16_t));
	uint32_t n_imm = 0;
	for (uint32_t r = 0; r < n; r++)
		n_imm += kind[order[r]] == 1;
	return n_imm;
}

/* Orders each token's valid entries by weight descending (ties: earlier position first),
 * marks the last min(k_defer, valid) deferred (with q->defer_cold: non-resident experts
 * first), and groups the pairs per expert. Returns the number of groups. */
uint32_t plan_request(struct forward_engine *e, const struct forward_request *q, uint32_t moe_layer)
{
	const uint32_t n_experts = e->cat->info.n_experts, k = q->k;
	uint8_t *protect = e->rq->expert_has_immediate; /* free until the groups are made */
	if (q->defer_union)
		protect_union(q, n_experts, protect);
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
		if (q->defer_union) {
			e->rq->tok_n_imm[t] = defer_unprotected(e, ids, order, kind, n, protect);
		} else if (q->defer_cold && n_def) {
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
			struct held_expert *h = &e->rq->held[n_groups - 1];
			h->hold = (struct residency_hold){.expert = x, .pending = true};
			h->tp = NULL; /* its views are written when it is held */
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
	/* Each expert's score for the residency's heat: its router weights in these tokens,
	 * scaled by the model's top-k (1.0 = an average selected expert), as a recorded trace
	 * (whose header's top_k is the model's) replays them. */
	for (uint32_t gi = 0; gi < n_groups; gi++) {
		const struct req_group *g = &e->rq->groups[gi];
		float sum = 0;
		for (uint32_t s = g->first; s < g->first + g->count; s++)
			sum += e->rq->wg[s] > 0 ? e->rq->wg[s] : 0;
		e->rq->held[gi].hold.score =
		    sum * (float)(e->cat->info.top_k ? e->cat->info.top_k : k);
	}
	return n_groups;
}

/* One part of the output in the planned order: out[t] = Σ immediate entries + deferred_in[t]
 * (needs only the groups with an immediate entry: they come first in the plan), or
 * Σ deferred entries. */
void plan_sum(const struct forward_engine *e, const struct req_ctx *c,
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
