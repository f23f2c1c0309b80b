/* bench_invariant — what the batch-invariant mode (moek_ffn_call.batch_invariant) costs: per
 * weight format, tokens/s of the invariant mode over the default at 1, 8, 64 and 512 tokens,
 * both measured in the same run, rounds alternating between the two modes.
 *
 * One thread (the calling one runs every phase), the active ISA (MOEK_ISA=… to pick one),
 * Qwen3-30B-A3B's expert shape (hidden 2048, ffn 768) in the layout the sidecar serves (gate
 * and up alternating, rows interleaved by 8 where the format has that layout: "x8"). Decode
 * sizes cycle through enough copies of the expert that the weights stream from DRAM, as in
 * serving; tokens/s counts token-expert products. Time is the thread's CPU time (the time it
 * really ran, on a machine shared with other work; --wall: the wall clock).
 *
 *   bench_invariant [--quick] [--wall] [--formats Q4_K,BF16x8,...] [--tokens 1,8,64,512]
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "moe_kernels.h"

enum { HIDDEN = 2048, FFN = 768, MAX_COPIES = 48 };

static bool wall_clock;

static double run_s(void)
{
	if (wall_clock)
		return monotonic_s();
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct format_row {
	const char *name;
	uint32_t format;
	bool x8;
};

static const struct format_row formats[] = {
    {"F32", MOEK_F32, false},           {"F16", MOEK_F16, false},
    {"BF16", MOEK_BF16, false},         {"BF16x8", MOEK_BF16, true},
    {"Q8_0", MOEK_Q8_0, false},         {"Q8_0x8", MOEK_Q8_0, true},
    {"Q4_0", MOEK_Q4_0, false},         {"Q2_K", MOEK_Q2_K, false},
    {"Q3_K", MOEK_Q3_K, false},         {"Q4_K", MOEK_Q4_K, false},
    {"Q4_Kx8", MOEK_Q4_K, true},        {"Q5_K", MOEK_Q5_K, false},
    {"Q6_K", MOEK_Q6_K, false},         {"IQ4_NL", MOEK_IQ4_NL, false},
    {"IQ4_XS", MOEK_IQ4_XS, false},     {"MXFP4", MOEK_MXFP4, false},
    {"MXFP4x8", MOEK_MXFP4, true},      {"FP8", MOEK_FP8_E4M3_B128, false},
    {"INT4_G32", MOEK_INT4_G32, false}, {"INT4_G32x8", MOEK_INT4_G32, true},
};

struct bench_experts {
	struct moek_expert e[MAX_COPIES];
	void *buf[MAX_COPIES];
	float *scales[3];
	size_t n;
};

static float *random_matrix(size_t rows, size_t cols, unsigned seed)
{
	float *m = malloc(rows * cols * sizeof(float));
	if (!m)
		return NULL;
	uint32_t s = seed * 2654435761u + 1;
	for (size_t i = 0; i < rows * cols; i++) {
		s = s * 1664525u + 1013904223u;
		m[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.1f;
	}
	return m;
}

static int make_matrix(uint32_t format, size_t rows, size_t cols, unsigned seed,
                       struct moek_matrix *m, float **scales)
{
	float *src = random_matrix(rows, cols, seed);
	void *dst = aligned_alloc(64, (moek_row_bytes(format, cols) * rows + 63) / 64 * 64);
	*scales = NULL;
	if (format == MOEK_FP8_E4M3_B128)
		*scales = malloc(moek_fp8_scale_bytes(rows, cols));
	if (!src || !dst || (format == MOEK_FP8_E4M3_B128 && !*scales) ||
	    moek_quantize(format, src, rows, cols, dst, *scales) != 0) {
		free(src);
		free(dst);
		return -1;
	}
	free(src);
	*m = (struct moek_matrix){.format = format,
	                          .rows = (uint32_t)rows,
	                          .cols = (uint32_t)cols,
	                          .data = dst,
	                          .scales = *scales};
	return 0;
}

/* The expert packed as the sidecar serves it, and n copies of the packed bytes. */
static int make_experts(const struct format_row *f, size_t n, struct bench_experts *b)
{
	memset(b, 0, sizeof(*b));
	struct moek_expert src = {.activation = MOEK_SWIGLU};
	if (make_matrix(f->format, FFN, HIDDEN, 1, &src.gate, &b->scales[0]) ||
	    make_matrix(f->format, FFN, HIDDEN, 2, &src.up, &b->scales[1]) ||
	    make_matrix(f->format, HIDDEN, FFN, 3, &src.down, &b->scales[2]))
		return -1;
	const size_t bytes = moek_expert_packed_bytes(&src);
	char err[256];
	for (size_t i = 0; i < n; i++) {
		b->buf[i] = aligned_alloc(64, (bytes + 63) / 64 * 64);
		if (!b->buf[i] ||
		    moek_expert_pack(&src, f->x8, b->buf[i], bytes, &b->e[i], err, sizeof(err))) {
			fprintf(stderr, "bench_invariant: %s: %s\n", f->name, b->buf[i] ? err : "");
			return -1;
		}
		b->n = i + 1;
	}
	free((void *)src.gate.data);
	free((void *)src.up.data);
	free((void *)src.down.data);
	return 0;
}

static void free_experts(struct bench_experts *b)
{
	for (size_t i = 0; i < b->n; i++)
		free(b->buf[i]);
	for (int i = 0; i < 3; i++)
		free(b->scales[i]);
}

/* Tokens per second of `tokens`-token calls over the copies, for at least min_s seconds. */
static double rate(struct bench_experts *b, size_t copies, size_t tokens, bool invariant,
                   const float *x, const float *w, float *out, void *scratch, size_t scratch_bytes,
                   double min_s)
{
	size_t calls = 0;
	const double t0 = run_s();
	double dt;
	do {
		struct moek_ffn_call c = {.expert = &b->e[calls % copies],
		                          .n_tokens = tokens,
		                          .x = x,
		                          .x_dtype = MOEK_ACT_F32,
		                          .weights = w,
		                          .out = out,
		                          .scratch = scratch,
		                          .scratch_bytes = scratch_bytes,
		                          .n_workers = 1,
		                          .batch_invariant = invariant};
		char err[256];
		if (moek_ffn_run(&c, err, sizeof(err))) {
			fprintf(stderr, "bench_invariant: %s\n", err);
			exit(1);
		}
		calls++;
		dt = run_s() - t0;
	} while (dt < min_s);
	return (double)calls * (double)tokens / dt;
}

static bool listed(const char *list, const char *name)
{
	if (!list)
		return true;
	const size_t n = strlen(name);
	for (const char *p = list; *p;) {
		const size_t len = strcspn(p, ",");
		if (len == n && !strncmp(p, name, n))
			return true;
		p += len + (p[len] == ',');
	}
	return false;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	const char *only = NULL;
	size_t token_counts[8] = {1, 8, 64, 512}, n_counts = 4;
	bool quick = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick")) {
			quick = true;
		} else if (!strcmp(argv[i], "--wall")) {
			wall_clock = true;
		} else if (!strcmp(argv[i], "--formats") && i + 1 < argc) {
			only = argv[++i];
		} else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
			n_counts = 0;
			for (char *p = argv[++i]; *p && n_counts < 8;) {
				char *end;
				const unsigned long v = strtoul(p, &end, 10);
				if (end == p || v == 0 || v > 4096) {
					fprintf(stderr,
					        "bench_invariant: --tokens: bad count in '%s'\n",
					        p);
					return 2;
				}
				token_counts[n_counts++] = v;
				p = *end == ',' ? end + 1 : end;
			}
		} else {
			fprintf(stderr,
			        "usage: bench_invariant [--quick] [--wall] [--formats F,...] "
			        "[--tokens N,...]\n");
			return 2;
		}
	}
	const int rounds = quick ? 3 : 7;
	const double slice = quick ? 0.05 : 0.1;
	size_t max_tokens = 0;
	for (size_t i = 0; i < n_counts; i++)
		max_tokens = token_counts[i] > max_tokens ? token_counts[i] : max_tokens;
	float *x = malloc(max_tokens * HIDDEN * sizeof(float));
	float *w = malloc(max_tokens * sizeof(float));
	float *out = calloc(max_tokens * HIDDEN, sizeof(float));
	if (!x || !w || !out)
		return 1;
	for (size_t i = 0; i < max_tokens * HIDDEN; i++)
		x[i] = sinf((float)i);
	for (size_t t = 0; t < max_tokens; t++)
		w[t] = 0.125f;
	printf("bench_invariant: isa %s, 1 thread, expert %dx%d (Qwen3-30B-A3B), %d rounds "
	       "alternating default and invariant, %s time; ratio = invariant tokens/s over "
	       "default (median of rounds)\n",
	       moek_isa_name(), HIDDEN, FFN, rounds, wall_clock ? "wall" : "CPU");
	printf("%-11s %6s %14s %16s %6s\n", "format", "tokens", "default tok/s", "invariant tok/s",
	       "ratio");
	for (size_t fi = 0; fi < sizeof(formats) / sizeof(formats[0]); fi++) {
		const struct format_row *f = &formats[fi];
		if (!listed(only, f->name))
			continue;
		/* enough copies that decode streams from DRAM (about 256 MiB), at most 48 */
		const size_t expert_bytes = 3 * moek_row_bytes(f->format, HIDDEN) * (size_t)FFN;
		size_t copies = ((size_t)256 << 20) / expert_bytes + 1;
		copies = copies > MAX_COPIES ? MAX_COPIES : copies;
		struct bench_experts b;
		if (make_experts(f, copies, &b) != 0) {
			fprintf(stderr, "bench_invariant: %s: cannot build the expert\n", f->name);
			free_experts(&b);
			continue;
		}
		for (size_t ti = 0; ti < n_counts; ti++) {
			const size_t tokens = token_counts[ti];
			const size_t bytes = moek_ffn_scratch_bytes(&b.e[0], tokens, 1);
			void *scratch = aligned_alloc(64, (bytes + 63) / 64 * 64);
			if (!scratch)
				return 1;
			double def[8], inv[8], ratio[8];
			(void)rate(&b, copies, tokens, false, x, w, out, scratch, bytes,
			           slice / 2); /* warm-up */
			for (int r = 0; r < rounds; r++) {
				def[r] = rate(&b, copies, tokens, false, x, w, out, scratch, bytes,
				              slice);
				inv[r] = rate(&b, copies, tokens, true, x, w, out, scratch, bytes,
				              slice);
				ratio[r] = inv[r] / def[r];
			}
			qsort(def, (size_t)rounds, sizeof(double), cmp_double);
			qsort(inv, (size_t)rounds, sizeof(double), cmp_double);
			qsort(ratio, (size_t)rounds, sizeof(double), cmp_double);
			printf("%-11s %6zu %14.0f %16.0f %6.2f\n", f->name, tokens, def[rounds / 2],
			       inv[rounds / 2], ratio[rounds / 2]);
			fflush(stdout);
			free(scratch);
		}
		free_experts(&b);
	}
	free(x);
	free(w);
	free(out);
	return 0;
}
