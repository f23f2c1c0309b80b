/* test_determinism.c — the FFN gives identical bits for any split of its phases' ranges
 * across workers and threads (decode and prefill shapes, every ISA), and splitting the
 * intermediate dimension into NUMA-style slices (moek_expert_slice, no weight copies) gives the
 * same result up to the partial-sum reduction.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "expert_fixture.h"

struct split {
	size_t n_load, n_hidden, n_down; /* pieces per phase (hidden: in units of the align) */
	unsigned workers;
};

/* Runs the call's phases on the calling thread, each range cut into pieces handed to
 * workers round-robin, pieces visited in reverse order (the order must not matter). */
static float *run_split(const struct fixture *f, const float *x, size_t n, const float *w,
                        const struct split *sp)
{
	float *out = calloc(n * f->hidden, sizeof(float));
	const size_t bytes = moek_ffn_scratch_bytes(&f->expert, n, sp->workers);
	void *scratch = malloc(bytes);
	cr_assert(out && scratch);
	struct moek_ffn_call c = {.expert = &f->expert,
	                          .n_tokens = n,
	                          .x = x,
	                          .x_dtype = MOEK_ACT_F32,
	                          .weights = w,
	                          .out = out,
	                          .scratch = scratch,
	                          .scratch_bytes = bytes,
	                          .n_workers = sp->workers};
	char err[256];
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), 0, "%s", err);
	for (size_t p = sp->n_load; p-- > 0;)
		moek_ffn_load(&c, (unsigned)(p % sp->workers), n * p / sp->n_load,
		              n * (p + 1) / sp->n_load);
	const size_t align = moek_expert_split_align(&f->expert);
	const size_t units = (f->ffn + align - 1) / align;
	for (size_t p = sp->n_hidden; p-- > 0;) {
		size_t b = units * p / sp->n_hidden * align,
		       e = units * (p + 1) / sp->n_hidden * align;
		if (e > f->ffn)
			e = f->ffn;
		moek_ffn_hidden(&c, (unsigned)(p % sp->workers), b, e);
	}
	for (size_t p = sp->n_down; p-- > 0;)
		moek_ffn_down(&c, (unsigned)(p % sp->workers), f->hidden * p / sp->n_down,
		              f->hidden * (p + 1) / sp->n_down);
	free(scratch);
	return out;
}

static void check_splits(uint32_t format, size_t hidden, size_t ffn, size_t n)
{
	struct fixture f;
	fixture_init(&f, format, 0, hidden, ffn, MOEK_SWIGLU, 1, 11);
	float *x = fixture_tokens(n, hidden, 3);
	float *w = malloc(n * sizeof(float));
	for (size_t t = 0; t < n; t++)
		w[t] = 1.0f / (float)(t + 1);
	const struct split whole = {1, 1, 1, 1};
	const struct split splits[] = {{2, 2, 3, 2}, {3, 5, 7, 3}, {1, 3, 97, 4}, {5, 1, 2, 1}};
	static const enum moek_isa isas[] = {MOEK_ISA_SCALAR, MOEK_ISA_AVX2, MOEK_ISA_AVX512,
	                                     MOEK_ISA_AMX};
	for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
		if (moek_set_isa(isas[i]) != 0)
			continue;
		float *ref = run_split(&f, x, n, w, &whole);
		for (size_t s = 0; s < sizeof(splits) / sizeof(splits[0]); s++) {
			float *got = run_split(&f, x, n, w, &splits[s]);
			cr_assert_arr_eq(got, ref, n * hidden * sizeof(float),
			                 "%s %s n=%zu split %zu: bits differ",
			                 moek_format_lookup(format)->name, moek_isa_name(), n, s);
			free(got);
		}
		free(ref);
	}
	moek_set_isa(MOEK_ISA_AUTO);
	free(x);
	free(w);
	fixture_free(&f);
}

Test(determinism, q4_K_decode_and_prefill)
{
	check_splits(MOEK_Q4_K, 512, 1024, 3);
	check_splits(MOEK_Q4_K, 512, 1024, 37);
}
Test(determinism, q8_0_and_mxfp4)
{
	check_splits(MOEK_Q8_0, 320, 416, 4);
	check_splits(MOEK_MXFP4, 320, 416, 20);
}
Test(determinism, bf16_and_fp8)
{
	check_splits(MOEK_BF16, 264, 200, 2);
	check_splits(MOEK_BF16, 264, 200, 19);
	check_splits(MOEK_FP8_E4M3_B128, 320, 384, 1);
	check_splits(MOEK_FP8_E4M3_B128, 320, 384, 17);
}
Test(determinism, q2_K_and_q3_K)
{
	check_splits(MOEK_Q2_K, 256, 512, 2);
	check_splits(MOEK_Q2_K, 512, 768, 19);
	check_splits(MOEK_Q3_K, 256, 512, 3);
	check_splits(MOEK_Q3_K, 512, 768, 18);
}
Test(determinism, q6_K_q5_K_q4_0)
{
	check_splits(MOEK_Q6_K, 256, 512, 2);
	check_splits(MOEK_Q5_K, 256, 512, 18);
	check_splits(MOEK_Q4_0, 256, 512, 18);
}

/* IQ4_NL: 416 intermediate features = 6.5 pairs of activation blocks (split align 64, the
 * last range ends mid-pair) */
Test(determinism, iq4_nl_and_iq4_xs)
{
	check_splits(MOEK_IQ4_NL, 320, 416, 4);
	check_splits(MOEK_IQ4_NL, 320, 416, 20);
	check_splits(MOEK_IQ4_XS, 256, 512, 3);
	check_splits(MOEK_IQ4_XS, 256, 512, 18);
}

Test(determinism, int4_g32)
{
	check_splits(MOEK_INT4_G32, 256, 512, 1);
	check_splits(MOEK_INT4_G32, 256, 512, 3);
	check_splits(MOEK_INT4_G32, 320, 448, 18);
}

/* NVFP4: 448 = 7 blocks of 64, the activation pairs of the AVX2 row dot */
Test(determinism, nvfp4)
{
	check_splits(MOEK_NVFP4, 320, 448, 1);
	check_splits(MOEK_NVFP4, 320, 448, 20);
}

/* Two real threads splitting every phase, a barrier between phases, against one thread. */
struct thread_arg {
	struct moek_ffn_call *c;
	pthread_barrier_t *barrier;
	unsigned worker, n_workers;
	size_t align;
};

static void *worker_main(void *p)
{
	const struct thread_arg *a = p;
	const struct moek_ffn_call *c = a->c;
	const size_t n = c->n_tokens, ffn = c->expert->gate.rows, hidden = c->expert->gate.cols;
	const size_t units = (ffn + a->align - 1) / a->align;
	const unsigned w = a->worker, nw = a->n_workers;
	moek_ffn_load(c, w, n * w / nw, n * (w + 1) / nw);
	pthread_barrier_wait(a->barrier);
	size_t fb = units * w / nw * a->align, fe = units * (w + 1) / nw * a->align;
	moek_ffn_hidden(c, w, fb, fe > ffn ? ffn : fe);
	pthread_barrier_wait(a->barrier);
	moek_ffn_down(c, w, hidden * w / nw, hidden * (w + 1) / nw);
	return NULL;
}

static float *run_threads(const struct fixture *f, const float *x, size_t n, unsigned nw)
{
	float *out = calloc(n * f->hidden, sizeof(float));
	const size_t bytes = moek_ffn_scratch_bytes(&f->expert, n, nw);
	void *scratch = malloc(bytes);
	struct moek_ffn_call c = {.expert = &f->expert,
	                          .n_tokens = n,
	                          .x = x,
	                          .x_dtype = MOEK_ACT_F32,
	                          .out = out,
	                          .scratch = scratch,
	                          .scratch_bytes = bytes,
	                          .n_workers = nw};
	char err[256];
	cr_assert_eq(moek_ffn_prepare(&c, err, sizeof(err)), 0, "%s", err);
	pthread_barrier_t barrier;
	pthread_barrier_init(&barrier, NULL, nw);
	pthread_t th[4];
	struct thread_arg args[4];
	for (unsigned i = 0; i < nw; i++) {
		args[i] =
		    (struct thread_arg){&c, &barrier, i, nw, moek_expert_split_align(&f->expert)};
		cr_assert_eq(pthread_create(&th[i], NULL, worker_main, &args[i]), 0);
	}
	for (unsigned i = 0; i < nw; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&barrier);
	free(scratch);
	return out;
}

Test(determinism, threads_match_single_thread)
{
	static const uint32_t fmts[] = {MOEK_Q4_K, MOEK_BF16, MOEK_MXFP4};
	for (size_t i = 0; i < 3; i++) {
		struct fixture f;
		fixture_init(&f, fmts[i], 0, 256, 512, MOEK_SWIGLU, 0, 21);
		for (size_t n = 1; n <= 33; n += 32) {
			float *x = fixture_tokens(n, 256, 5);
			float *one = run_threads(&f, x, n, 1);
			float *two = run_threads(&f, x, n, 2);
			float *three = run_threads(&f, x, n, 3);
			cr_expect_arr_eq(two, one, n * 256 * sizeof(float), "2 threads, n=%zu", n);
			cr_expect_arr_eq(three, one, n * 256 * sizeof(float), "3 threads, n=%zu",
			                 n);
			free(one);
			free(two);
			free(three);
			free(x);
		}
		fixture_free(&f);
	}
}

/* NUMA-style split of the intermediate dimension: two slices viewing the same weights, the
 * down bias in one slice only, partials reduced by the caller. */
Test(determinism, numa_slices_sum_to_the_whole)
{
	static const uint32_t fmts[] = {MOEK_Q4_K, MOEK_FP8_E4M3_B128, MOEK_MXFP4, MOEK_IQ4_NL,
	                                MOEK_IQ4_XS};
	for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++) {
		struct fixture f;
		fixture_init(&f, fmts[i], 0, 256, 768, MOEK_SWIGLU_OAI, 1, 31);
		const size_t n = 5, align = moek_expert_split_align(&f.expert);
		const size_t mid = f.ffn / align / 2 * align;
		float *x = fixture_tokens(n, 256, 8);
		float *whole = fixture_run(&f, x, n, NULL);
		struct fixture part = f;
		float *sum = calloc(n * 256, sizeof(float));
		char err[256];
		for (int s = 0; s < 2; s++) {
			cr_assert_eq(moek_expert_slice(&f.expert, s ? mid : 0, s ? f.ffn : mid,
			                               &part.expert, err, sizeof(err)),
			             0, "%s", err);
			cr_expect(part.expert.gate.data >= f.expert.gate.data,
			          "a view, not a copy");
			if (s)
				part.expert.down.bias = NULL;
			part.ffn = part.expert.gate.rows;
			float *p = fixture_run(&part, x, n, NULL);
			for (size_t k = 0; k < n * 256; k++)
				sum[k] += p[k];
			free(p);
		}
		cr_expect(nmse_f(sum, whole, n * 256) < 1e-10, "%s: slices nmse %g",
		          moek_format_lookup(fmts[i])->name, nmse_f(sum, whole, n * 256));
		cr_expect_eq(moek_expert_slice(&f.expert, 1, f.ffn, &part.expert, err, sizeof(err)),
		             align > 1 ? -1 : 0, "unaligned slice start");
		cr_expect_eq(
		    moek_expert_slice(&f.expert, 0, f.ffn + 1, &part.expert, err, sizeof(err)), -1);
		cr_expect(strstr(err, "outside") != NULL, "%s", err);
		free(sum);
		free(whole);
		free(x);
		fixture_free(&f);
	}
}
