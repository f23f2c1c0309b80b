/* oracle.c — forward_reference (see oracle.h). */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "moe_abi.h"

static int out_of_memory(struct forward_result *res)
{
	res->status = MOE_ENOMEM;
	res->bad_token = res->bad_index = res->bad_expert = -1;
	snprintf(res->message, sizeof(res->message), "reference: out of memory");
	return MOE_ENOMEM;
}

int forward_reference(struct forward_engine *e, const struct forward_request *q,
                      float *out_immediate, float *out_deferred, struct forward_result *res)
{
	struct forward_oracle_shape shape;
	int rc = forward_oracle_begin(e, q, out_deferred, res, &shape);
	if (rc != MOE_OK)
		return rc;
	const size_t n = q->n_tokens, k = q->k, h = shape.hidden, row = shape.x_row_bytes;
	uint32_t *rank = calloc(n * k, sizeof(uint32_t));
	uint8_t *deferred = calloc(n * k, 1);
	uint32_t *members = calloc(n * k, sizeof(uint32_t));
	float *contrib = calloc(n * k * h, sizeof(float));
	uint8_t *xbuf = malloc(n * k * row);
	float *wbuf = calloc(n * k, sizeof(float));
	float *ybuf = calloc(n * k * h, sizeof(float));
	if (!rank || !deferred || !members || !contrib || !xbuf || !wbuf || !ybuf) {
		rc = out_of_memory(res);
		goto out;
	}
	/* Each valid entry's rank among its token's: by weight descending, ties by position; the
	 * last min(k_defer, valid) are deferred. */
	for (size_t t = 0; t < n; t++) {
		const int32_t *ids = &q->ids[t * k];
		const float *w = &q->weights[t * k];
		uint32_t valid = 0;
		for (size_t j = 0; j < k; j++)
			valid += ids[j] >= 0;
		const uint32_t n_def = q->k_defer < valid ? q->k_defer : valid;
		for (size_t j = 0; j < k; j++) {
			if (ids[j] < 0)
				continue;
			uint32_t r = 0;
			for (size_t i = 0; i < k; i++)
				r += ids[i] >= 0 && (w[i] > w[j] || (w[i] == w[j] && i < j));
			rank[t * k + j] = r;
			deferred[t * k + j] = r >= valid - n_def;
		}
	}
	if (q->defer_union) { /* kt-kernel's rule instead (MOE_FWD_DEFER_UNION) */
		for (size_t p = 0; p < n * k; p++)
			deferred[p] = 1;
		for (size_t t = 0; t < n; t++)
			for (size_t j = 0; j < k; j++) {
				const int32_t x = q->ids[t * k + j];
				const float *w = &q->weights[t * k];
				uint32_t above = 0; /* all k entries ranked, -1 included */
				for (size_t i = 0; i < k; i++)
					above += w[i] > w[j] || (w[i] == w[j] && i < j);
				if (x < 0 || above >= k - q->k_defer)
					continue;
				for (size_t p = 0; p < n * k;
				     p++) /* protected: immediate everywhere */
					if (q->ids[p] == x)
						deferred[p] = 0;
			}
	}
	for (uint32_t x = 0; x < shape.n_experts && rc == MOE_OK; x++) {
		size_t m = 0; /* one batch per expert, deferred entries included (forward.h) */
		for (size_t p = 0; p < n * k; p++)
			if (q->ids[p] == (int32_t)x) {
				members[m] = (uint32_t)p;
				memcpy(xbuf + m * row, (const uint8_t *)q->x + (p / k) * row, row);
				wbuf[m++] = q->weights[p];
			}
		if (m == 0)
			continue;
		memset(ybuf, 0, m * h * sizeof(float));
		struct moek_ffn_call c = {
		    .n_tokens = m,
		    .x = xbuf,
		    .x_dtype = q->x_dtype,
		    .weights = wbuf,
		    .out = ybuf,
		};
		rc = forward_oracle_expert(e, q, shape.moe_layer, x, &c, res);
		for (size_t i = 0; i < m && rc == MOE_OK; i++)
			memcpy(contrib + members[i] * h, ybuf + i * h, h * sizeof(float));
	}
	if (rc != MOE_OK)
		goto out;
	/* Per token: the contributions in rank order, immediate and deferred apart. */
	for (size_t t = 0; t < n; t++) {
		float *oi = out_immediate + t * h;
		float *od = out_deferred ? out_deferred + t * h : NULL;
		memset(oi, 0, h * sizeof(float));
		if (od)
			memset(od, 0, h * sizeof(float));
		for (uint32_t r = 0; r < k; r++)
			for (size_t j = 0; j < k; j++) {
				const size_t p = t * k + j;
				if (q->ids[p] < 0 || rank[p] != r)
					continue;
				float *o = deferred[p] ? od : oi;
				for (size_t i = 0; i < h; i++)
					o[i] += contrib[p * h + i];
				res->n_deferred += deferred[p];
			}
		if (q->deferred_in)
			for (size_t i = 0; i < h; i++)
				oi[i] += q->deferred_in[t * h + i];
	}
out:
	res->status = rc;
	forward_oracle_end(e);
	free(rank);
	free(deferred);
	free(members);
	free(contrib);
	free(xbuf);
	free(wbuf);
	free(ybuf);
	return rc;
}
