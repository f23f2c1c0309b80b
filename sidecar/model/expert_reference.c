/* expert_reference.c — see expert_reference.h. */
#include "expert_reference.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe_kernels.h"

enum { GATE, UP, DOWN };

struct expert_reference {
	const struct moe_catalog *cat;
	int *fds; /* one per catalog file */
	size_t hidden, ffn;
	float *w[3];    /* gate, up: ffn x hidden; down: hidden x ffn (row-major) */
	float *bias[3]; /* gate, up: ffn; down: hidden; NULL when the expert has none */
	float *fused;   /* a fused gate_up's 2·ffn rows before the split */
	double *h;      /* ffn activations of one token */
	uint8_t *raw;   /* one tensor's file bytes (data, then scales, then zeros) */
	uint8_t *kern;  /* the same in the kernel format */
	float *scales;  /* FP8 block scales */
	size_t raw_cap, kern_cap, scales_cap;
	uint32_t layer, expert;
};

static int grow(void **buf, size_t *cap, size_t need, struct sidecar_error *err)
{
	if (need <= *cap)
		return 0;
	void *p = realloc(*buf, need);
	if (!p)
		return error_set(err, MOE_ENOMEM, "reference: %zu bytes: out of memory", need);
	*buf = p;
	*cap = need;
	return 0;
}

int expert_reference_open(const struct moe_catalog *cat, struct expert_reference **out,
                          struct sidecar_error *err)
{
	*out = NULL;
	struct expert_reference *r = calloc(1, sizeof(*r));
	if (!r)
		return error_set(err, MOE_ENOMEM, "reference: out of memory");
	r->cat = cat;
	r->hidden = cat->info.hidden;
	r->ffn = cat->info.expert_ffn;
	const size_t m = r->hidden * r->ffn;
	r->fds = malloc((cat->n_files ? cat->n_files : 1) * sizeof(int));
	for (int i = 0; i < 3; i++) {
		r->w[i] = malloc(m * sizeof(float));
		r->bias[i] = NULL;
	}
	r->fused = malloc(2 * m * sizeof(float));
	r->h = malloc(r->ffn * sizeof(double));
	if (!r->fds || !r->w[GATE] || !r->w[UP] || !r->w[DOWN] || !r->fused || !r->h) {
		free(r->fds); /* nothing opened yet */
		r->fds = NULL;
		expert_reference_close(r);
		return error_set(err, MOE_ENOMEM, "reference: %zu weights: out of memory", 3 * m);
	}
	for (uint32_t i = 0; i < r->cat->n_files; i++)
		r->fds[i] = -1;
	for (uint32_t i = 0; i < r->cat->n_files; i++) {
		r->fds[i] = open(r->cat->files[i].path, O_RDONLY | O_CLOEXEC);
		if (r->fds[i] < 0) {
			error_set_errno(err, "%s", r->cat->files[i].path);
			expert_reference_close(r);
			return -1;
		}
	}
	*out = r;
	return 0;
}

void expert_reference_close(struct expert_reference *r)
{
	if (!r)
		return;
	for (uint32_t i = 0; r->fds && i < r->cat->n_files; i++)
		if (r->fds[i] >= 0)
			close(r->fds[i]);
	free(r->fds);
	for (int i = 0; i < 3; i++) {
		free(r->w[i]);
		free(r->bias[i]);
	}
	free(r->fused);
	free(r->h);
	free(r->raw);
	free(r->kern);
	free(r->scales);
	free(r);
}

static int read_extent(const struct expert_reference *r, const struct moe_extent *x, void *dst,
                       struct sidecar_error *err)
{
	const char *path = r->cat->files[x->file].path;
	uint64_t done = 0;
	while (done < x->length) {
		ssize_t n = pread(r->fds[x->file], (uint8_t *)dst + done, x->length - done,
		                  (off_t)(x->offset + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return error_set_errno(err, "%s: offset %llu", path,
			                       (unsigned long long)(x->offset + done));
		if (n == 0)
			return error_set(err, MOE_EIO, "%s: offset %llu: end of file", path,
			                 (unsigned long long)(x->offset + done));
		done += (uint64_t)n;
	}
	return 0;
}

/* Projection p's file bytes, in its kernel format, into r->kern; FP8 scales into r->scales. */
static int kernel_bytes(struct expert_reference *r, const struct moe_proj_ref *p,
                        struct sidecar_error *err)
{
	const size_t row = moek_row_bytes(p->format, p->cols), want = row * p->rows;
	if (!row)
		return error_set(err, MOE_EINVAL, "%llu columns do not fit format %s",
		                 (unsigned long long)p->cols, moe_format_name(p->format));
	const size_t raw = p->data.length + p->scale.length + p->zeros.length;
	if (grow((void **)&r->raw, &r->raw_cap, raw, err) ||
	    grow((void **)&r->kern, &r->kern_cap, want, err) ||
	    read_extent(r, &p->data, r->raw, err))
		return -1;
	uint8_t *scale = r->raw + p->data.length, *zeros = scale + p->scale.length;
	if ((p->scale.length && read_extent(r, &p->scale, scale, err)) ||
	    (p->zeros.length && read_extent(r, &p->zeros, zeros, err)))
		return -1;
	char why[200] = "";
	switch (p->layout) {
	case MOE_LAYOUT_BLOCKS:
		if (p->data.length != want)
			return error_set(err, MOE_EINVAL, "%llu bytes, expected %zu",
			                 (unsigned long long)p->data.length, want);
		memcpy(r->kern, r->raw, want);
		break;
	case MOE_LAYOUT_MXFP4_HF:
		if (p->data.length != p->rows * p->cols / 2 ||
		    p->scale.length != p->rows * p->cols / 32)
			return error_set(err, MOE_EINVAL, "MXFP4 blocks/scales of %llu/%llu bytes",
			                 (unsigned long long)p->data.length,
			                 (unsigned long long)p->scale.length);
		moek_mxfp4_from_hf(r->raw, scale, p->rows * p->cols, r->kern);
		break;
	case MOE_LAYOUT_INT4_CT:
		if (moek_int4_from_ct(r->raw, scale, p->rows, p->cols, p->group, r->kern, why,
		                      sizeof(why)))
			return error_set(err, MOE_EINVAL, "%s", why);
		break;
	case MOE_LAYOUT_INT4_GPTQ:
		if (p->awq ? moek_int4_from_awq(r->raw, zeros, scale, p->rows, p->cols, p->group,
		                                r->kern, why, sizeof(why))
		           : moek_int4_from_gptq(r->raw, zeros, scale, p->rows, p->cols, p->group,
		                                 p->gptq_v1, r->kern, why, sizeof(why)))
			return error_set(err, MOE_EINVAL, "%s", why);
		break;
	case MOE_LAYOUT_NVFP4_MODELOPT:
		if (moek_nvfp4_from_modelopt(r->raw, scale, p->rows, p->cols, r->kern, why,
		                             sizeof(why)))
			return error_set(err, MOE_EINVAL, "%s", why);
		break;
	case MOE_LAYOUT_TRANSPOSED: { /* Llama-4: stored [cols][rows] */
		const size_t es = p->format == MOEK_F32 ? 4 : 2;
		if (p->data.length != want || want != p->rows * p->cols * es)
			return error_set(err, MOE_EINVAL, "%llu bytes, expected %zu",
			                 (unsigned long long)p->data.length, want);
		for (uint64_t c = 0; c < p->cols; c++)
			for (uint64_t o = 0; o < p->rows; o++)
				memcpy(r->kern + (o * p->cols + c) * es,
				       r->raw + (c * p->rows + o) * es, es);
		break;
	}
	default: return error_set(err, MOE_EINVAL, "layout %d unknown", (int)p->layout);
	}
	if (moek_format_scale_block(p->format)) {
		const size_t n = moek_fp8_scale_bytes(p->rows, p->cols);
		if (p->scale.length != n)
			return error_set(err, MOE_EINVAL,
			                 "block scales of %llu bytes, expected %zu",
			                 (unsigned long long)p->scale.length, n);
		if (grow((void **)&r->scales, &r->scales_cap, n, err))
			return -1;
		memcpy(r->scales, scale, n);
	}
	return 0;
}

/* Projection p dequantized (scalar reference) into dst, rows x cols f32. */
static int dequantize_proj(struct expert_reference *r, const struct moe_proj_ref *p, float *dst,
                           struct sidecar_error *err)
{
	if (kernel_bytes(r, p, err))
		return -1;
	const float *sc = moek_format_scale_block(p->format) ? r->scales : NULL;
	if (moek_dequantize(p->format, r->kern, sc, p->rows, p->cols, dst))
		return error_set(err, MOE_EINVAL, "format %s cannot be dequantized",
		                 moe_format_name(p->format));
	if (p->tensor_scale != 0.0f) /* ModelOpt NVFP4's weight_scale_2 (one f32 rounding) */
		for (size_t i = 0; i < (size_t)p->rows * p->cols; i++)
			dst[i] *= p->tensor_scale;
	return 0;
}

/* Projection p's bias as f32 into dst (p->rows values). */
static int read_bias(struct expert_reference *r, const struct moe_proj_ref *p, float *dst,
                     struct sidecar_error *err)
{
	const size_t eb = p->bias_format == MOEK_F32 ? 4 : 2;
	if (p->bias.length != p->rows * eb)
		return error_set(err, MOE_EINVAL, "bias of %llu bytes, expected %llu",
		                 (unsigned long long)p->bias.length,
		                 (unsigned long long)(p->rows * eb));
	if (grow((void **)&r->raw, &r->raw_cap, p->bias.length, err) ||
	    read_extent(r, &p->bias, r->raw, err))
		return -1;
	for (uint64_t i = 0; i < p->rows; i++) {
		uint16_t h;
		float f;
		if (eb == 4) {
			memcpy(&f, r->raw + 4 * i, 4);
		} else {
			memcpy(&h, r->raw + 2 * i, 2);
			f = p->bias_format == MOEK_BF16 ? moek_bf16_to_f32(h) : moek_f16_to_f32(h);
		}
		dst[i] = f;
	}
	return 0;
}

static int want_bias(struct expert_reference *r, int m, size_t n, struct sidecar_error *err)
{
	if (!r->bias[m])
		r->bias[m] = malloc(n * sizeof(float));
	return r->bias[m] ? 0 : error_set(err, MOE_ENOMEM, "reference: out of memory");
}

/* A fused gate_up (2·ffn rows, halves or interleaved) into gate and up, weights and bias. */
static int load_fused(struct expert_reference *r, const struct moe_proj_ref *p,
                      struct sidecar_error *err)
{
	const size_t ffn = r->ffn, cols = p->cols;
	if (p->rows != 2 * ffn || cols != r->hidden)
		return error_set(err, MOE_EINVAL, "shape %llux%llu", (unsigned long long)p->rows,
		                 (unsigned long long)cols);
	if (dequantize_proj(r, p, r->fused, err))
		return -1;
	const bool inter = p->order == MOE_GATE_UP_INTERLEAVED;
	for (size_t f = 0; f < ffn; f++) {
		const size_t g = inter ? 2 * f : f, u = inter ? 2 * f + 1 : ffn + f;
		memcpy(r->w[GATE] + f * cols, r->fused + g * cols, cols * sizeof(float));
		memcpy(r->w[UP] + f * cols, r->fused + u * cols, cols * sizeof(float));
	}
	if (!p->bias.length)
		return 0;
	if (want_bias(r, GATE, ffn, err) || want_bias(r, UP, ffn, err) ||
	    read_bias(r, p, r->fused, err))
		return -1;
	for (size_t f = 0; f < ffn; f++) {
		r->bias[GATE][f] = r->fused[inter ? 2 * f : f];
		r->bias[UP][f] = r->fused[inter ? 2 * f + 1 : ffn + f];
	}
	return 0;
}

static int load_proj(struct expert_reference *r, const struct moe_proj_ref *p, int m,
                     struct sidecar_error *err)
{
	const size_t rows = m == DOWN ? r->hidden : r->ffn, cols = m == DOWN ? r->ffn : r->hidden;
	if (p->rows != rows || p->cols != cols)
		return error_set(err, MOE_EINVAL, "shape %llux%llu, expected %zux%zu",
		                 (unsigned long long)p->rows, (unsigned long long)p->cols, rows,
		                 cols);
	if (dequantize_proj(r, p, r->w[m], err))
		return -1;
	if (!p->bias.length)
		return 0;
	return want_bias(r, m, rows, err) || read_bias(r, p, r->bias[m], err) ? -1 : 0;
}

int expert_reference_load(struct expert_reference *r, uint32_t layer, uint32_t expert,
                          struct sidecar_error *err)
{
	const struct moe_expert *x = moe_catalog_expert(r->cat, layer, expert);
	if (!x)
		return error_set(err, MOE_EINVAL, "layer %u expert %u: no such routed expert",
		                 layer, expert);
	for (int m = 0; m < 3; m++) {
		free(r->bias[m]);
		r->bias[m] = NULL;
	}
	static const enum moe_proj order[] = {MOE_PROJ_GATE_UP, MOE_PROJ_GATE, MOE_PROJ_UP,
	                                      MOE_PROJ_DOWN};
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		const struct moe_proj_ref *p = &x->proj[order[i]];
		if (!p->present)
			continue;
		const int rc = order[i] == MOE_PROJ_GATE_UP ? load_fused(r, p, err)
		               : order[i] == MOE_PROJ_GATE  ? load_proj(r, p, GATE, err)
		               : order[i] == MOE_PROJ_UP    ? load_proj(r, p, UP, err)
		                                            : load_proj(r, p, DOWN, err);
		if (rc) {
			char where[96];
			snprintf(where, sizeof(where), "layer %u expert %u %s", layer, expert,
			         moe_proj_name(order[i]));
			return error_prefix(err, where);
		}
	}
	r->layer = layer;
	r->expert = expert;
	return 0;
}

static double activate(const struct moe_model_hparams *in, double g, double u)
{
	if (in->swiglu_limit > 0) {
		const double limit = in->swiglu_limit, alpha = MOEK_SWIGLU_OAI_ALPHA;
		g = fmin(g, limit);
		u = fmax(fmin(u, limit), -limit);
		return g / (1.0 + exp(-alpha * g)) * (u + 1.0);
	}
	return g / (1.0 + exp(-g)) * u;
}

static double dot(const float *w, const float *x, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)w[i] * (double)x[i];
	return s;
}

static double dot_d(const float *w, const double *x, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)w[i] * x[i];
	return s;
}

void expert_reference_run(const struct expert_reference *r, const float *x, size_t n, double *out)
{
	const size_t hid = r->hidden, ffn = r->ffn;
	for (size_t t = 0; t < n; t++) {
		const float *xt = x + t * hid;
		for (size_t f = 0; f < ffn; f++) {
			double g = dot(r->w[GATE] + f * hid, xt, hid);
			double u = dot(r->w[UP] + f * hid, xt, hid);
			if (r->bias[GATE])
				g += r->bias[GATE][f];
			if (r->bias[UP])
				u += r->bias[UP][f];
			r->h[f] = activate(&r->cat->info, g, u);
		}
		for (size_t o = 0; o < hid; o++)
			out[t * hid + o] = dot_d(r->w[DOWN] + o * ffn, r->h, ffn) +
			                   (r->bias[DOWN] ? r->bias[DOWN][o] : 0.0);
	}
}

/* ---- The bounds --------------------------------------------------------------------------
 * Per format and path: the tests/kernels bound of every ISA's path against the scalar
 * reference (test_ffn's max_nmse_opt, test_prefill_bf16's bf16 tiles: ggml's 5e-4 for one
 * quantized-activation product, 1e-3 for the K-quants' two Q8_K quantizations in sequence,
 * bf16/f16 activation rounding for the float formats), plus the scalar reference's 1e-10
 * against double, plus tests/forward's bound for the engine's decode layout against the GGUF
 * rows (interleaved Q8_0 1e-5 — its activation scale unrounded; 1e-9 for every other format;
 * test_interleave: interleaved BF16 from 8 tokens 5e-5 against the rows' f32 tiles). The
 * figures hold for the NMSE of a batch of tokens (tests: 1 to 512 tokens × hundreds of
 * outputs); a single token's scatters above them (a token whose output nearly cancels), so a
 * checker judges 16 tokens or more at once (cmd/verify.c). */
static const struct format_bound {
	uint32_t format;
	double nmse[EXPERT_PATH_COUNT]; /* decode, batched, prefill */
} bounds[] = {
    {.format = MOEK_F32, .nmse = {2e-9, 2e-9, 2e-9}},
    {.format = MOEK_F16, .nmse = {3e-5, 3e-5, 3e-5}},
    {.format = MOEK_BF16, .nmse = {1e-5, 6e-5, 6e-5}},
    {.format = MOEK_FP8_E4M3_B128, .nmse = {2e-9, 2e-9, 2e-9}},
    {.format = MOEK_Q8_0, .nmse = {5.1e-4, 5.1e-4, 5.1e-4}},
    {.format = MOEK_Q4_0, .nmse = {5e-4, 5e-4, 5e-4}},
    {.format = MOEK_MXFP4, .nmse = {5e-4, 5e-4, 5e-4}},
    {.format = MOEK_NVFP4, .nmse = {5e-4, 5e-4, 5e-4}},
    {.format = MOEK_IQ4_NL, .nmse = {5e-4, 5e-4, 5e-4}},
    {.format = MOEK_INT4_G32, .nmse = {5e-4, 5e-4, 5e-4}},
    {.format = MOEK_Q2_K, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_Q3_K, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_Q4_K, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_Q5_K, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_Q6_K, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_IQ4_XS, .nmse = {1e-3, 1e-3, 1e-3}},
    /* the i-quants: measured 1.8e-4-2.1e-4 decode and batched, 1.5e-5 prefill (verify on
     * moe-gen's i-quant mixes, docs/formats.md), as the K-quants: the same Q8_K activations */
    {.format = MOEK_IQ2_XXS, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_IQ2_XS, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_IQ3_XXS, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_IQ3_S, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_IQ1_S, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_IQ1_M, .nmse = {1e-3, 1e-3, 1e-3}},
    {.format = MOEK_IQ2_S, .nmse = {1e-3, 1e-3, 1e-3}},
};

enum expert_path expert_path_of(size_t n_tokens)
{
	/* 16: the kernels' MOEK_PREFILL_MIN_TOKENS (tiles from there on every ISA's table) */
	return n_tokens <= 1   ? EXPERT_PATH_DECODE
	       : n_tokens < 16 ? EXPERT_PATH_BATCHED
	                       : EXPERT_PATH_PREFILL;
}

const char *expert_path_name(enum expert_path p)
{
	static const char *const names[] = {"decode", "batched", "prefill"};
	return p < EXPERT_PATH_COUNT ? names[p] : "?";
}

double expert_format_bound(uint32_t format, enum expert_path p)
{
	for (size_t i = 0; i < sizeof(bounds) / sizeof(bounds[0]); i++)
		if (bounds[i].format == format && p < EXPERT_PATH_COUNT)
			return bounds[i].nmse[p];
	return 0;
}

double expert_reference_bound(const struct moe_expert *x, enum expert_path p)
{
	double b = 0;
	for (int i = 0; i < MOE_PROJ_COUNT; i++)
		if (x->proj[i].present && expert_format_bound(x->proj[i].format, p) > b)
			b = expert_format_bound(x->proj[i].format, p);
	return b;
}
