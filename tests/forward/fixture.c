/* fixture.c — see fixture.h. */
#include "fixture.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe_abi.h"
#include "moe_gen.h"
#include "moe_kernels.h"

int fwd_model_make(struct fwd_model *m, const struct fwd_model_spec *s, char *err, size_t err_len)
{
	memset(m, 0, sizeof(*m));
	snprintf(m->dir, sizeof(m->dir), "/tmp/moe-forward-test.XXXXXX");
	if (!mkdtemp(m->dir)) {
		snprintf(err, err_len, "mkdtemp failed");
		return -1;
	}
	snprintf(m->path, sizeof(m->path), "%s/%s", m->dir, s->gguf ? "model.gguf" : "hf");
	struct moe_gen_options opt = {
	    .preset = s->preset,
	    .out = m->path,
	    .format = s->format,
	    .seed = 11,
	    .layers = s->layers,
	    .hidden = s->hidden,
	    .ffn = s->ffn,
	    .experts = s->experts,
	    .fused_gate_up = s->fused_gate_up,
	    .mix = s->mix,
	    .int4 = s->int4,
	    .group = s->group,
	};
	struct sidecar_error merr = {0};
	if (moe_gen_write(&opt, &merr) != 0 || moe_catalog_open(m->path, &m->cat, &merr) != 0) {
		snprintf(err, err_len, "%s", merr.msg);
		fwd_model_free(m);
		return -1;
	}
	return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

void fwd_model_free(struct fwd_model *m)
{
	if (m->cat)
		moe_catalog_close(m->cat);
	if (m->dir[0])
		nftw(m->dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
	memset(m, 0, sizeof(*m));
}

static uint64_t next(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return *s >> 17;
}

void fwd_req_make(struct fwd_req *r, const struct moe_catalog *cat, int32_t layer,
                  uint32_t n_tokens, uint32_t k, uint32_t k_defer, unsigned x_dtype, uint64_t seed,
                  bool holes)
{
	memset(r, 0, sizeof(*r));
	const size_t h = cat->info.hidden, n = (size_t)n_tokens * h;
	uint64_t s = seed * 2654435761u + 1;
	float *xf = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		xf[i] = (float)(next(&s) % 20001) / 10000.0f - 1.0f;
	if (x_dtype == MOEK_ACT_F32) {
		r->x = xf;
	} else {
		r->x = malloc(n * 2);
		moek_convert(x_dtype, r->x, MOEK_ACT_F32, xf, n);
		free(xf);
	}
	r->ids = malloc((size_t)n_tokens * k * sizeof(int32_t));
	r->weights = malloc((size_t)n_tokens * k * sizeof(float));
	const uint32_t n_experts = cat->info.n_experts;
	for (uint32_t t = 0; t < n_tokens; t++)
		for (uint32_t j = 0; j < k; j++) {
			int32_t id;
			bool dup;
			do { /* distinct ids per token */
				id = (int32_t)(next(&s) % n_experts);
				dup = false;
				for (uint32_t i = 0; i < j; i++)
					dup |= r->ids[t * k + i] == id;
			} while (dup && k <= n_experts);
			if (holes && next(&s) % 5 == 0)
				id = -1;
			r->ids[t * k + j] = id;
			r->weights[t * k + j] = (float)(next(&s) % 1000 + 1) / 1000.0f;
		}
	r->out = calloc(n, sizeof(float));
	r->out_def = calloc(n, sizeof(float));
	r->ref = calloc(n, sizeof(float));
	r->ref_def = calloc(n, sizeof(float));
	r->q = (struct forward_request){
	    .layer = layer,
	    .n_tokens = n_tokens,
	    .k = k,
	    .k_defer = k_defer,
	    .x = r->x,
	    .x_dtype = x_dtype,
	    .ids = r->ids,
	    .weights = r->weights,
	};
}

void fwd_req_free(struct fwd_req *r)
{
	free(r->x);
	free(r->ids);
	free(r->weights);
	free(r->out);
	free(r->out_def);
	free(r->ref);
	free(r->ref_def);
	memset(r, 0, sizeof(*r));
}

int32_t fwd_moe_block(const struct moe_catalog *cat, uint32_t i)
{
	for (uint32_t l = 0; l < cat->info.n_layers; l++)
		if (cat->layers[l].moe && i-- == 0)
			return (int32_t)l;
	return -1;
}

long fwd_first_diff(const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
			return (long)i;
	return -1;
}

int fwd_replay_expert3_failure(struct forward_engine *e, struct forward_engine *ok,
                               const struct moe_catalog *cat, uint32_t tokens_mod, uint64_t seed,
                               uint32_t *failed, uint32_t *passed, char *why, size_t why_len)
{
	const size_t h = cat->info.hidden;
	*failed = *passed = 0;
	int bad = 0;
	for (uint32_t i = 0; i < 24 && !bad; i++) {
		struct fwd_req r;
		fwd_req_make(&r, cat, fwd_moe_block(cat, i % 2), 1 + i % tokens_mod, 2, 0,
		             MOEK_ACT_F32, seed + i, false);
		bool needs = false;
		for (uint32_t j = 0; j < r.q.n_tokens * 2; j++)
			needs |= i % 2 == 1 && r.ids[j] == 3;
		struct forward_result res;
		int rc = forward_run(e, &r.q, r.out, NULL, &res);
		if (needs) {
			if (rc != MOE_EIO || res.bad_expert != 3 ||
			    !strstr(res.message, "expert 3")) {
				snprintf(why, why_len,
				         "request %u needs expert 3: status %d, expert %d, \"%s\"",
				         i, rc, res.bad_expert, res.message);
				bad = 1;
			}
			++*failed;
		} else {
			long d = -2;
			if (rc == MOE_OK && forward_run(ok, &r.q, r.ref, NULL, &res) == MOE_OK)
				d = fwd_first_diff(r.out, r.ref, r.q.n_tokens * h);
			if (d != -1) {
				snprintf(why, why_len,
				         "request %u: status %d, first differing element %ld", i,
				         rc, d);
				bad = 1;
			}
			++*passed;
		}
		fwd_req_free(&r);
	}
	return bad ? -1 : 0;
}

uint64_t fwd_rss_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	unsigned long size = 0, rss = 0;
	if (!f)
		return 0;
	if (fscanf(f, "%lu %lu", &size, &rss) != 2)
		rss = 0;
	fclose(f);
	return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}
