/* expert_fixture.h — test experts: random float weights, quantized copies, and a double-
 * precision oracle, shared by the kernel tests. */
#ifndef MOE_TEST_EXPERT_FIXTURE_H
#define MOE_TEST_EXPERT_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "moe_kernels.h"

struct fixture_matrix {
	float *orig;   /* rows x cols, the float original */
	float *deq;    /* rows x cols, dequantized from data (what the kernels really see) */
	void *data;    /* quantized */
	float *scales; /* FP8 only */
	float *bias;   /* optional */
};

struct fixture {
	struct moek_expert expert;
	struct fixture_matrix gate, up, down;
	size_t hidden, ffn;
};

/* Builds an expert of `format` (gate/up/down all in it unless down_format != 0). Weights are
 * deterministic in seed. with_bias adds gpt-oss style biases. */
void fixture_init(struct fixture *f, uint32_t format, uint32_t down_format, size_t hidden,
                  size_t ffn, enum moek_activation act, int with_bias, uint32_t seed);
void fixture_free(struct fixture *f);

/* n x hidden f32 activations, roughly N(0, 1). */
float *fixture_tokens(size_t n, size_t hidden, uint32_t seed);

/* Double-precision FFN over orig (use_orig) or dequantized weights: out[t] += w[t] * ffn(x[t]). */
void fixture_oracle(const struct fixture *f, int use_orig, const float *x, size_t n,
                    const float *weights, double *out);

/* Runs the FFN on the current ISA in one call; returns a malloc'd n x hidden output. */
float *fixture_run(const struct fixture *f, const float *x, size_t n, const float *weights);

double nmse(const float *got, const double *want, size_t n);
double nmse_f(const float *got, const float *want, size_t n);
double mean_rel_abs(const float *got, const double *want, size_t n);

#endif
