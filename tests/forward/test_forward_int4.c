/* test_forward_int4.c — INT4 checkpoints (compressed-tensors pack-quantized, GPTQ, AWQ) served by
 * the forward engine, which repacks each expert into INT4_G32 once per load.
 *
 * Per encoding: the RESIDENCY source under a budget below the model (evictions: slots reused,
 * so one expert's repacked rows never leak into the next) and ALL_RESIDENT give the same
 * bits, equal to forward_reference's; the outputs are within a 4-bit model's error of float
 * math over the generator's originals (which catches a wrong packing order, a swapped
 * projection or a wrong zero point — errors of order 1); the MMAP source is refused.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "fixture.h"
#include "moe_abi.h"
#include "moe_kernels.h"

/* The record of the last engine call that failed (forward.h). */
static struct sidecar_error ferr;

#define HIDDEN 256u
#define FFN 128u

static struct forward_engine *engine(const struct fwd_model *m, enum forward_source src,
                                     uint64_t budget)
{
	struct forward_config cfg = {
	    .source = src,
	    .mem_budget = budget,
	    .threads_per_node = 2,
	    .max_tokens = 24,
	    .chunk_bytes = 64 * 1024,
	    .lazy_load = true, /* demand loads: the repack runs on the loader thread */
	};
	struct forward_engine *e;
	cr_assert_eq(forward_create(&e, m->cat, &cfg, &ferr), 0, "forward_create: %s", ferr.msg);
	return e;
}

static void make_format(struct fwd_model *m, uint32_t format, enum moe_gen_int4 int4,
                        uint32_t group)
{
	char err[256];
	struct fwd_model_spec spec = {.preset = "qwen3-30b-a3b",
	                              .format = format,
	                              .layers = 2,
	                              .experts = 8,
	                              .hidden = HIDDEN,
	                              .ffn = FFN,
	                              .int4 = int4,
	                              .group = group};
	cr_assert_eq(fwd_model_make(m, &spec, err, sizeof(err)), 0, "%s", err);
}

static void make(struct fwd_model *m, enum moe_gen_int4 int4, uint32_t group)
{
	make_format(m, MOEK_INT4_G32, int4, group);
}

/* Normalised squared error of out (n_tokens x HIDDEN) against float math over the originals. */
static double float_math_nmse(const struct fwd_req *r, int32_t block, uint32_t n_tokens, uint32_t k)
{
	float *g = malloc(FFN * HIDDEN * 4), *u = malloc(FFN * HIDDEN * 4);
	float *d = malloc(HIDDEN * FFN * 4);
	const float *x = r->x;
	double num = 0, den = 0;
	for (uint32_t t = 0; t < n_tokens; t++) {
		double want[HIDDEN] = {0};
		for (uint32_t j = 0; j < k; j++) {
			const int32_t id = r->ids[t * k + j];
			if (id < 0)
				continue;
			moe_gen_floats(11, (uint32_t)block, (uint32_t)id, MOE_GEN_GATE, HIDDEN, 0,
			               FFN * HIDDEN, g);
			moe_gen_floats(11, (uint32_t)block, (uint32_t)id, MOE_GEN_UP, HIDDEN, 0,
			               FFN * HIDDEN, u);
			moe_gen_floats(11, (uint32_t)block, (uint32_t)id, MOE_GEN_DOWN, FFN, 0,
			               HIDDEN * FFN, d);
			double hid[FFN];
			for (size_t i = 0; i < FFN; i++) {
				double a = 0, b = 0;
				for (size_t c = 0; c < HIDDEN; c++) {
					a += (double)g[i * HIDDEN + c] * x[t * HIDDEN + c];
					b += (double)u[i * HIDDEN + c] * x[t * HIDDEN + c];
				}
				hid[i] = a / (1.0 + exp(-a)) * b;
			}
			for (size_t o = 0; o < HIDDEN; o++) {
				double s = 0;
				for (size_t i = 0; i < FFN; i++)
					s += (double)d[o * FFN + i] * hid[i];
				want[o] += r->weights[t * k + j] * s;
			}
		}
		for (size_t o = 0; o < HIDDEN; o++) {
			const double e = r->out[t * HIDDEN + o] - want[o];
			num += e * e;
			den += want[o] * want[o];
		}
	}
	free(g), free(u), free(d);
	return num / den;
}

static void check_served_format(uint32_t format, enum moe_gen_int4 int4, uint32_t group)
{
	struct fwd_model m;
	make_format(&m, format, int4, group);
	const uint64_t every = m.cat->expert_bytes_total;
	struct forward_engine *all = engine(&m, FORWARD_SOURCE_ALL_RESIDENT, 0);
	/* a budget of about a quarter of the (repacked) experts: evictions, slots reused */
	struct forward_engine *res = engine(&m, FORWARD_SOURCE_RESIDENCY, every / 3);
	const size_t h = HIDDEN;
	static const uint32_t tokens[] = {1, 3, 20, 2, 17, 1};
	for (uint32_t i = 0; i < sizeof(tokens) / sizeof(tokens[0]); i++) {
		const uint32_t n = tokens[i], k = 4;
		const int32_t block = fwd_moe_block(m.cat, i % 2);
		struct fwd_req r;
		fwd_req_make(&r, m.cat, block, n, k, 0, MOEK_ACT_F32, 100 + i, i == 4);
		struct forward_result a, b, c;
		cr_assert_eq(forward_run(all, &r.q, r.ref, NULL, &a), MOE_OK, "%s", a.message);
		cr_assert_eq(forward_run(res, &r.q, r.out, NULL, &b), MOE_OK, "%s", b.message);
		long diff = fwd_first_diff(r.out, r.ref, n * h);
		cr_assert_eq(diff, -1,
		             "%u tokens: residency vs all-resident differ at %ld: %g vs %g", n,
		             diff, diff >= 0 ? (double)r.out[diff] : 0.0,
		             diff >= 0 ? (double)r.ref[diff] : 0.0);
		float *oracle = malloc(n * h * sizeof(float));
		cr_assert_eq(forward_reference(all, &r.q, oracle, NULL, &c), MOE_OK, "%s",
		             c.message);
		cr_assert_eq(fwd_first_diff(oracle, r.ref, n * h), -1, "%u tokens vs the reference",
		             n);
		free(oracle);
		const double e = float_math_nmse(&r, block, n, k);
		cr_log_info("%s group %d, %u tokens: nmse vs float math %.3g",
		            format == MOEK_NVFP4       ? "ModelOpt NVFP4"
		            : int4 == MOE_GEN_INT4_CT  ? "compressed-tensors"
		            : int4 == MOE_GEN_INT4_AWQ ? "AWQ"
		                                       : "GPTQ",
		            group == MOE_GEN_GROUP_ROW ? -1 : (int)group, n, e);
		/* E2M1 has 3 bits of magnitude: NVFP4 (GGUF or ModelOpt alike) 0.02-0.04 */
		const double bound = format == MOEK_NVFP4 ? 0.06 : 0.03;
		cr_assert(e < bound, "%u tokens: nmse %.3g against float math", n, e);
		fwd_req_free(&r);
	}
	struct forward_stats st = {0};
	forward_stats(res, &st);
	cr_assert_gt(st.cold_misses, 0);
	cr_assert_gt(st.residency.evictions, 0, "the budget must force evictions");
	forward_destroy(res);
	forward_destroy(all);
	fwd_model_free(&m);
}

static void check_served(enum moe_gen_int4 int4, uint32_t group)
{
	check_served_format(MOEK_INT4_G32, int4, group);
}

/* ModelOpt NVFP4 (weight, weight_scale, weight_scale_2): repacked into NVFP4 blocks at load,
 * the per-tensor scale applied by the kernels; against float math this catches a wrong nibble
 * order or a scale applied twice or not at all */
Test(forward_int4, modelopt_nvfp4_served)
{
	check_served_format(MOEK_NVFP4, MOE_GEN_INT4_NONE, 0);
}

Test(forward_int4, compressed_tensors_served)
{
	check_served(MOE_GEN_INT4_CT, 32);
	check_served(MOE_GEN_INT4_CT, 64);
}

Test(forward_int4, gptq_served)
{
	check_served(MOE_GEN_INT4_GPTQ, 128);
	check_served(MOE_GEN_INT4_GPTQ, 32);
}

/* GPTQ group_size -1 and compressed-tensors strategy "channel": one group spanning each row,
 * its scale repeated into every block of the row at the repack. */
/* AutoAWQ GEMM: packed along the output in AWQ's nibble order, with zero points */
Test(forward_int4, awq_served)
{
	check_served(MOE_GEN_INT4_AWQ, 128);
	check_served(MOE_GEN_INT4_AWQ, 32);
}

Test(forward_int4, one_group_per_row_served)
{
	check_served(MOE_GEN_INT4_GPTQ, MOE_GEN_GROUP_ROW);
	check_served(MOE_GEN_INT4_CT, MOE_GEN_GROUP_ROW);
}

Test(forward_int4, mmap_refused)
{
	struct fwd_model m;
	make(&m, MOE_GEN_INT4_GPTQ, 128);
	struct forward_config cfg = {
	    .source = FORWARD_SOURCE_MMAP, .threads_per_node = 1, .max_tokens = 8};
	struct forward_engine *e = NULL;
	cr_assert_neq(forward_create(&e, m.cat, &cfg, &ferr), 0);
	cr_assert(strstr(ferr.msg,
	                 "layer 0 gate: INT4 checkpoint weights (GPTQ) cannot be served from "
	                 "the mmap source"),
	          "%s", ferr.msg);
	fwd_model_free(&m);
}
