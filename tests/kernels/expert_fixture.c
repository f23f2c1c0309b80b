/* expert_fixture.c — see expert_fixture.h. */
#include "expert_fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t next(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

/* Roughly N(0, 1): sum of four uniforms, rescaled. */
static float gauss(uint32_t *s)
{
	float v = 0;
	for (int i = 0; i < 4; i++)
		v += (float)(next(s) >> 8) * 0x1p-24f - 0.5f;
	return v * 1.7320508f;
}

static void matrix_init(struct fixture_matrix *m, uint32_t format, size_t rows, size_t cols,
                        float sd, int with_bias, uint32_t *seed)
{
	m->orig = malloc(rows * cols * sizeof(float));
	m->deq = malloc(rows * cols * sizeof(float));
	cr_assert(m->orig && m->deq);
	for (size_t i = 0; i < rows * cols; i++)
		m->orig[i] = gauss(seed) * sd;
	const size_t bytes = moek_row_bytes(format, cols) * rows;
	cr_assert(bytes > 0, "format %u cols %zu", format, cols);
	m->data = malloc(bytes);
	m->scales = NULL;
	if (format == MOEK_FP8_E4M3_B128) {
		m->scales = malloc(moek_fp8_scale_bytes(rows, cols));
		cr_assert(m->scales);
	}
	cr_assert(m->data);
	cr_assert_eq(moek_quantize(format, m->orig, rows, cols, m->data, m->scales), 0);
	cr_assert_eq(moek_dequantize(format, m->data, m->scales, rows, cols, m->deq), 0);
	m->bias = NULL;
	if (with_bias) {
		m->bias = malloc(rows * sizeof(float));
		cr_assert(m->bias);
		for (size_t i = 0; i < rows; i++)
			m->bias[i] = gauss(seed) * 0.5f;
	}
}

static struct moek_matrix view(const struct fixture_matrix *m, uint32_t format, size_t rows,
                               size_t cols)
{
	return (struct moek_matrix){.format = format,
	                            .rows = (uint32_t)rows,
	                            .cols = (uint32_t)cols,
	                            .data = m->data,
	                            .scales = m->scales,
	                            .bias = m->bias};
}

void fixture_init(struct fixture *f, uint32_t format, uint32_t down_format, size_t hidden,
                  size_t ffn, enum moek_activation act, int with_bias, uint32_t seed)
{
	uint32_t s = seed * 2654435761u + 12345u;
	if (!down_format)
		down_format = format;
	f->hidden = hidden;
	f->ffn = ffn;
	/* weight scale ~ 1/sqrt(fan-in) keeps h and out of order 1 */
	matrix_init(&f->gate, format, ffn, hidden, 1.0f / sqrtf((float)hidden), with_bias, &s);
	matrix_init(&f->up, format, ffn, hidden, 1.0f / sqrtf((float)hidden), with_bias, &s);
	matrix_init(&f->down, down_format, hidden, ffn, 1.0f / sqrtf((float)ffn), with_bias, &s);
	memset(&f->expert, 0, sizeof(f->expert));
	f->expert.gate = view(&f->gate, format, ffn, hidden);
	f->expert.up = view(&f->up, format, ffn, hidden);
	f->expert.down = view(&f->down, down_format, hidden, ffn);
	f->expert.activation = act;
	f->expert.limit = 7.0f;
	f->expert.alpha = 1.702f;
}

static void matrix_free(struct fixture_matrix *m)
{
	free(m->orig);
	free(m->deq);
	free(m->data);
	free(m->scales);
	free(m->bias);
}

void fixture_free(struct fixture *f)
{
	matrix_free(&f->gate);
	matrix_free(&f->up);
	matrix_free(&f->down);
}

float *fixture_tokens(size_t n, size_t hidden, uint32_t seed)
{
	uint32_t s = seed * 747796405u + 1u;
	float *x = malloc(n * hidden * sizeof(float));
	cr_assert(x);
	for (size_t i = 0; i < n * hidden; i++)
		x[i] = gauss(&s);
	return x;
}

void fixture_oracle(const struct fixture *f, int use_orig, const float *x, size_t n,
                    const float *weights, double *out)
{
	const struct moek_expert *e = &f->expert;
	const float *g = use_orig ? f->gate.orig : f->gate.deq;
	const float *u = use_orig ? f->up.orig : f->up.deq;
	const float *d = use_orig ? f->down.orig : f->down.deq;
	double *h = malloc(f->ffn * sizeof(double));
	cr_assert(h);
	for (size_t t = 0; t < n; t++) {
		const float *xt = x + t * f->hidden;
		for (size_t r = 0; r < f->ffn; r++) {
			double sg = f->gate.bias ? f->gate.bias[r] : 0,
			       su = f->up.bias ? f->up.bias[r] : 0;
			for (size_t k = 0; k < f->hidden; k++) {
				sg += (double)g[r * f->hidden + k] * xt[k];
				su += (double)u[r * f->hidden + k] * xt[k];
			}
			if (e->activation == MOEK_SWIGLU_OAI) {
				sg = fmin(sg, e->limit);
				su = fmax(fmin(su, e->limit), -e->limit);
				h[r] = sg / (1.0 + exp(-(double)e->alpha * sg)) * (su + 1.0);
			} else {
				h[r] = sg / (1.0 + exp(-sg)) * su;
			}
		}
		const double w = weights ? weights[t] : 1.0;
		for (size_t o = 0; o < f->hidden; o++) {
			double s = f->down.bias ? f->down.bias[o] : 0;
			for (size_t r = 0; r < f->ffn; r++)
				s += (double)d[o * f->ffn + r] * h[r];
			out[t * f->hidden + o] += w * s;
		}
	}
	free(h);
}

float *fixture_run(const struct fixture *f, const float *x, size_t n, const float *weights)
{
	float *out = calloc(n * f->hidden, sizeof(float));
	const size_t bytes = moek_ffn_scratch_bytes(&f->expert, n, 1);
	void *scratch = malloc(bytes);
	cr_assert(out && scratch && bytes);
	struct moek_ffn_call c = {.expert = &f->expert,
	                          .n_tokens = n,
	                          .x = x,
	                          .x_dtype = MOEK_ACT_F32,
	                          .weights = weights,
	                          .out = out,
	                          .scratch = scratch,
	                          .scratch_bytes = bytes,
	                          .n_workers = 1};
	char err[256];
	cr_assert_eq(moek_ffn_run(&c, err, sizeof(err)), 0, "%s", err);
	free(scratch);
	return out;
}

double nmse(const float *got, const double *want, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		num += (got[i] - want[i]) * (got[i] - want[i]);
		den += want[i] * want[i];
	}
	return den > 0 ? num / den : num;
}

double nmse_f(const float *got, const float *want, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
		den += (double)want[i] * want[i];
	}
	return den > 0 ? num / den : num;
}

double mean_rel_abs(const float *got, const double *want, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		num += fabs(got[i] - want[i]);
		den += fabs(want[i]);
	}
	return den > 0 ? num / den : num;
}
