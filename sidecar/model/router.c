/* router.c — the MoE routers of a GGUF model as f32 matrices, and their top-k (router.h). */
#include "router.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "moe_kernels.h"

#define GGML_F32 0
#define GGML_F16 1
#define GGML_BF16 30

void moe_router_free(struct moe_router *r)
{
	free(r->w);
	memset(r, 0, sizeof(*r));
}

/* The tensor `name` of one of the splits into dst as n f32 values. */
static int read_tensor(struct gguf_file **files, uint32_t n_files, const char *name, float *dst,
                       uint64_t n, struct sidecar_error *err)
{
	const struct gguf_tensor *t = NULL;
	const struct gguf_file *f = NULL;
	for (uint32_t i = 0; i < n_files && !t; i++)
		if ((t = gguf_find_tensor(files[i], name)))
			f = files[i];
	if (!t)
		return error_set(err, MOE_EINVAL, "%s: no tensor %s (the router)", files[0]->path,
		                 name);
	const uint32_t es = t->type == GGML_F32                           ? 4
	                    : t->type == GGML_F16 || t->type == GGML_BF16 ? 2
	                                                                  : 0;
	if (!es)
		return error_set(err, MOE_EINVAL,
		                 "%s: %s is %s; routers are read as F32, F16 or BF16", f->path,
		                 name, gguf_type_name(t->type));
	if (t->ne[0] * t->ne[1] != n || t->nbytes != n * es)
		return error_set(err, MOE_EINVAL,
		                 "%s: %s is %llu × %llu, expected %llu values (experts × hidden)",
		                 f->path, name, (unsigned long long)t->ne[1],
		                 (unsigned long long)t->ne[0], (unsigned long long)n);
	int fd = open(f->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return error_set(err, MOE_ESYS, "%s: %s", f->path, strerror(errno));
	uint8_t *raw = es == 4 ? (uint8_t *)dst : malloc(t->nbytes);
	int rc = raw ? 0 : error_set(err, MOE_ENOMEM, "router: out of memory");
	for (uint64_t done = 0; rc == 0 && done < t->nbytes;) {
		const ssize_t got =
		    pread(fd, raw + done, t->nbytes - done, (off_t)(t->offset + done));
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			rc = error_set(err, MOE_EIO, "%s: reading %s: %s", f->path, name,
			               got < 0 ? strerror(errno) : "the file ends first");
		else
			done += (uint64_t)got;
	}
	close(fd);
	if (rc == 0 && es == 2)
		for (uint64_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, raw + 2 * i, 2);
			if (t->type == GGML_F16) {
				dst[i] = moek_f16_to_f32(h);
			} else {
				const uint32_t u = (uint32_t)h << 16;
				memcpy(&dst[i], &u, 4);
			}
		}
	if (es == 2)
		free(raw);
	return rc;
}

int moe_router_load(const struct moe_catalog *cat, struct moe_router *out,
                    struct sidecar_error *err)
{
	memset(out, 0, sizeof(*out));
	if (cat->info.container != MOE_CONTAINER_GGUF)
		return error_set(err, MOE_EINVAL,
		                 "router: %s is not a GGUF model (routers are read from GGUF "
		                 "ffn_gate_inp tensors)",
		                 cat->files[0].path);
	struct gguf_file **files;
	uint32_t n_files;
	if (gguf_open_splits(cat->files[0].path, &files, &n_files, err) != 0)
		return -1;
	const uint32_t E = cat->info.n_experts;
	const uint64_t H = cat->info.hidden, per = (uint64_t)E * H;
	out->n_layers = cat->info.n_moe_layers;
	out->n_experts = E;
	out->hidden = H;
	out->w = malloc((size_t)(per * out->n_layers) * sizeof(float) + 1);
	int rc = out->w ? 0 : error_set(err, MOE_ENOMEM, "router: out of memory");
	for (uint32_t l = 0, m = 0; rc == 0 && l < cat->info.n_layers; l++) {
		if (!cat->layers[l].moe)
			continue;
		char name[96];
		snprintf(name, sizeof(name), "blk.%u.ffn_gate_inp.weight", l);
		rc = read_tensor(files, n_files, name, out->w + per * m++, per, err);
	}
	gguf_close_splits(files, n_files);
	if (rc)
		moe_router_free(out);
	return rc;
}

uint32_t moe_router_topk(const struct moe_router *r, uint32_t moe_layer, const float *x, uint32_t k,
                         int32_t *ids, float *probs)
{
	const uint32_t E = r->n_experts;
	const float *w = r->w + (size_t)moe_layer * E * r->hidden;
	if (k > E)
		k = E;
	float best[64];
	if (k > 64)
		k = 64;
	uint32_t n = 0;
	for (uint32_t e = 0; e < E; e++) {
		double s = 0;
		const float *row = w + (size_t)e * r->hidden;
		for (uint64_t i = 0; i < r->hidden; i++)
			s += (double)row[i] * x[i];
		const float v = (float)s;
		/* insertion into the sorted top-k (a strictly better logit moves ahead; equal
		 * ones keep the lower id first) */
		uint32_t at = n < k ? n : k;
		while (at > 0 && v > best[at - 1])
			at--;
		if (at >= k)
			continue;
		const uint32_t last = n < k ? n : k - 1;
		for (uint32_t j = last; j > at; j--) {
			best[j] = best[j - 1];
			ids[j] = ids[j - 1];
		}
		best[at] = v;
		ids[at] = (int32_t)e;
		if (n < k)
			n++;
	}
	if (probs && n) {
		double sum = 0;
		for (uint32_t j = 0; j < n; j++)
			sum += exp((double)best[j] - best[0]);
		for (uint32_t j = 0; j < n; j++)
			probs[j] = (float)(exp((double)best[j] - best[0]) / sum);
	}
	return n;
}
