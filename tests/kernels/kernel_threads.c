/* kernel_threads.c — the FFN phases run concurrently by 1, 2 and 3 threads (a barrier between
 * phases, each worker with its own scratch area) give bit-identical outputs, and ThreadSanitizer
 * sees no race.
 *
 * A plain program (exit 0 = pass, 1 = fail), not Criterion: Criterion's runner cannot start
 * under TSan on the development kernel (its arena mmap probe fails), and this is the test that
 * most needs TSan. Labelled "concurrent" so the TSan variant runs it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_kernels.h"

enum { HIDDEN = 256, FFN = 512, MAX_WORKERS = 3 };

struct worker {
	const struct moek_ffn_call *call;
	pthread_barrier_t *barrier;
	unsigned id, n;
};

static void *worker_main(void *p)
{
	const struct worker *w = p;
	const struct moek_ffn_call *c = w->call;
	const size_t n = c->n_tokens, align = moek_expert_split_align(c->expert);
	const size_t units = (FFN + align - 1) / align;
	moek_ffn_load(c, w->id, n * w->id / w->n, n * (w->id + 1) / w->n);
	pthread_barrier_wait(w->barrier);
	const size_t fb = units * w->id / w->n * align, fe = units * (w->id + 1) / w->n * align;
	moek_ffn_hidden(c, w->id, fb, fe < FFN ? fe : FFN);
	pthread_barrier_wait(w->barrier);
	moek_ffn_down(c, w->id, HIDDEN * w->id / w->n, HIDDEN * (w->id + 1) / w->n);
	return NULL;
}

static int run(const struct moek_expert *e, const float *x, size_t n, unsigned n_workers,
               float *out)
{
	const size_t bytes = moek_ffn_scratch_bytes(e, n, n_workers);
	void *scratch = malloc(bytes);
	if (!scratch)
		return -1;
	struct moek_ffn_call c = {.expert = e,
	                          .n_tokens = n,
	                          .x = x,
	                          .out = out,
	                          .scratch = scratch,
	                          .scratch_bytes = bytes,
	                          .n_workers = n_workers};
	char err[256];
	if (moek_ffn_prepare(&c, err, sizeof(err))) {
		fprintf(stderr, "kernel_threads: %s\n", err);
		free(scratch);
		return -1;
	}
	pthread_barrier_t barrier;
	pthread_barrier_init(&barrier, NULL, n_workers);
	pthread_t threads[MAX_WORKERS];
	struct worker workers[MAX_WORKERS];
	unsigned started = 0;
	for (; started < n_workers; started++) {
		workers[started] = (struct worker){&c, &barrier, started, n_workers};
		if (pthread_create(&threads[started], NULL, worker_main, &workers[started])) {
			fprintf(stderr, "kernel_threads: pthread_create failed\n");
			exit(1); /* the started workers would wait on the barrier forever */
		}
	}
	for (unsigned i = 0; i < started; i++)
		pthread_join(threads[i], NULL);
	pthread_barrier_destroy(&barrier);
	free(scratch);
	return 0;
}

static int check_format(uint32_t format)
{
	const size_t sizes[3][2] = {{FFN, HIDDEN}, {FFN, HIDDEN}, {HIDDEN, FFN}};
	struct moek_matrix *mats[3];
	struct moek_expert e = {.activation = MOEK_SWIGLU};
	mats[0] = &e.gate, mats[1] = &e.up, mats[2] = &e.down;
	float *src = malloc(sizeof(float) * FFN * HIDDEN);
	void *data[3] = {NULL, NULL, NULL};
	float *scales[3] = {NULL, NULL, NULL};
	int failed = src == NULL;
	for (int m = 0; m < 3 && !failed; m++) {
		const size_t rows = sizes[m][0], cols = sizes[m][1];
		for (size_t i = 0; i < rows * cols; i++)
			src[i] = (float)((i * 7919 + (size_t)m * 31) % 1000) * 1e-4f - 0.05f;
		data[m] = malloc(moek_row_bytes(format, cols) * rows);
		if (format == MOEK_FP8_E4M3_B128)
			scales[m] = malloc(moek_fp8_scale_bytes(rows, cols));
		failed = !data[m] || moek_quantize(format, src, rows, cols, data[m], scales[m]);
		*mats[m] = (struct moek_matrix){.format = format,
		                                .rows = (uint32_t)rows,
		                                .cols = (uint32_t)cols,
		                                .data = data[m],
		                                .scales = scales[m]};
	}
	for (size_t n = 1; n <= 33 && !failed; n += 32) { /* decode and prefill shapes */
		float *x = malloc(sizeof(float) * n * HIDDEN);
		float *outs[MAX_WORKERS];
		if (!x)
			return 1;
		for (size_t i = 0; i < n * HIDDEN; i++)
			x[i] = (float)(i % 17) * 0.1f - 0.8f;
		for (unsigned w = 0; w < MAX_WORKERS; w++) {
			outs[w] = calloc(n * HIDDEN, sizeof(float));
			if (!outs[w] || run(&e, x, n, w + 1, outs[w]))
				return 1;
		}
		for (unsigned w = 1; w < MAX_WORKERS; w++) {
			if (memcmp(outs[0], outs[w], sizeof(float) * n * HIDDEN)) {
				fprintf(
				    stderr,
				    "kernel_threads: %s, %zu tokens: %u threads differ from 1\n",
				    moek_format_lookup(format)->name, n, w + 1);
				failed = 1;
			}
		}
		for (unsigned w = 0; w < MAX_WORKERS; w++)
			free(outs[w]);
		free(x);
	}
	for (int m = 0; m < 3; m++)
		free(data[m]), free(scales[m]);
	free(src);
	return failed;
}

int main(void)
{
	static const uint32_t formats[] = {MOEK_Q4_K,          MOEK_BF16, MOEK_MXFP4,  MOEK_Q6_K,
	                                   MOEK_FP8_E4M3_B128, MOEK_Q3_K, MOEK_IQ4_NL, MOEK_IQ4_XS,
	                                   MOEK_INT4_G32,      MOEK_NVFP4};
	int failed = 0;
	for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
		failed |= check_format(formats[i]);
	printf("kernel_threads (%s): %s\n", moek_isa_name(), failed ? "FAIL" : "pass");
	return failed;
}
