/* bench_kernels — expert FFN throughput against the machine's own limits, measured in the same
 * run: DRAM streaming-read bandwidth (AVX2 read-sum over a buffer >> LLC, 1 and 2 threads)
 * for decode, and for prefill the register-only peak of each path the CPU has (independent
 * chains of one instruction): FMA f32, vdpbf16ps (AVX512-BF16), vpdpbusd (AVX512-VNNI), AMX
 * tdpbf16ps / tdpbusd (only where the CPU has AMX and the kernel granted the tile data).
 *
 * For each format and real expert shape (Qwen3-30B-A3B 2048x768, Mixtral 4096x14336,
 * DeepSeek-V3 7168x2048, gpt-oss 2880x2880): decode with 1, 4, 8 tokens cycling through a set
 * of distinct experts larger than the LLC (weights stream from DRAM), prefill with 128 and 512
 * tokens; 1 and 2 threads splitting rows (a pthread pool with a spin barrier between phases).
 * Rows report GB/s of weights streamed, the fraction of the measured DRAM bandwidth (decode:
 * the median over slices each with its own probe, two-thread slices only where the two
 * threads really had two cores), GFLOP/s and its fraction of the peak of the path the row ran
 * (column "of": fma for f32 tiles and float dots, bf16 for the vdpbf16ps tiles — amx_bf16 on
 * the amx ISA —, vnni for integer dots and group dots), tokens/s, cores' worth of compute,
 * slices redone, and the path (dots, groups, f32-tiles, bf16-tiles). The header names the ISA,
 * the peaks (1 / 2 threads) and each format's kernels (moek_isa_format_path). --json: one
 * object, {"isa", "group_prefetch", "dram_read_gbps", "dram_read_gbps_1t",
 * "fma_peak_gflops_1t", "fma_peak_gflops_2t", "peaks_1t": {kind: GFLOP/s or null},
 * "peaks_2t", "paths": {format: text}, "rows": [{"format", "shape", "tokens", "threads",
 * "weight_gbps", "bw_fraction", "gflops", "peak_fraction", "tokens_per_s", "dram_read_gbps",
 * "fma_peak_gflops", "path", "peak_kind", "peak_gflops", "cores", "shared_slices",
 * "unsteady_slices"}]}.
 *
 *   bench_kernels [--json] [--quick] [--formats Q4_K,BF16,...] [--shapes qwen3,mixtral,...]
 *                 [--threads 1,2] [--tokens 1,512] [--min-time S] [--set-mb MB]
 *                 [--group-prefetch NEAR,GAP]   (the group dots' software prefetch, bytes;
 *                                                0,0 none; default: the CPU's own)
 *                 [--isa scalar|avx2|avx512|amx] (the kernels' ISA; refused, naming what the
 *                                                CPU lacks, where it cannot run it)
 *                 [--cpu-time]      (one-thread rows and peaks timed by the thread's CPU
 *                                    time: a machine shared with other work)
 *                 [--bf16-from N]   (the bf16 tiles from N tokens for every format instead
 *                                    of kernels_internal.h's counts: how they were measured)
 * --tokens takes any counts: below 64 they run as decode rows (experts cycled from DRAM,
 * bw_fraction), from 64 as prefill rows.
 *   bench_kernels --dots [--json] [--formats ...] [--shapes ...]   (the dots' in-core ceiling)
 * Never a test: it prints figures, it asserts nothing about speed.
 */
#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>

#include "clock.h"
#include "cores.h"
#include "kernels_internal.h" /* --dots: the ISA's dot entry points */
#include "moe_kernels.h"

#define MAX_THREADS 2

/* --cpu-time: one-thread rows and peaks timed by the thread's CPU time, not the wall clock —
 * on a machine shared with other work, the time the thread really ran. */
static bool cpu_time;

static double run_s(void)
{
	if (!cpu_time)
		return monotonic_s();
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Weights and the probe buffer live where the sidecar keeps resident experts: 2 MiB-aligned
 * memory advised MADV_HUGEPAGE (sidecar/residency/slot_pool.c), so that the kernels stream
 * through the TLB reach the product gets and the probe reads the same kind of memory. */
static void *big_alloc(size_t bytes)
{
	const size_t huge = 2u << 20, len = (bytes + huge - 1) / huge * huge;
	void *p = aligned_alloc(huge, len);
	if (p)
		(void)madvise(p, len, MADV_HUGEPAGE); /* best effort: THP may be off */
	return p;
}

/* ---- Thread pool with a spin barrier ---------------------------------------------------- */

struct barrier {
	atomic_uint count, phase;
	unsigned n;
};

static void barrier_wait(struct barrier *b)
{
	const unsigned phase = atomic_load_explicit(&b->phase, memory_order_acquire);
	if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) + 1 == b->n) {
		atomic_store_explicit(&b->count, 0, memory_order_relaxed);
		atomic_store_explicit(&b->phase, phase + 1, memory_order_release);
		return;
	}
	for (unsigned spins = 0; atomic_load_explicit(&b->phase, memory_order_acquire) == phase;
	     spins++) {
		if (spins < 4000)
			_mm_pause();
		else
			sched_yield(); /* shared machine: never burn a core another thread needs */
	}
}

struct pool;
typedef void (*job_fn)(struct pool *p, unsigned worker);

struct pool {
	unsigned n;
	pthread_t threads[MAX_THREADS];
	struct barrier start, done, phase;
	job_fn job;
	void *arg;
	atomic_bool quit;
};

struct worker_arg {
	struct pool *pool;
	unsigned id;
};

static void pin(unsigned cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set); /* best effort */
}

static void *worker_main(void *p)
{
	struct worker_arg *a = p;
	pin(a->id);
	for (;;) {
		barrier_wait(&a->pool->start);
		if (atomic_load(&a->pool->quit))
			break;
		a->pool->job(a->pool, a->id);
		barrier_wait(&a->pool->done);
	}
	free(a);
	return NULL;
}

static void pool_init(struct pool *p, unsigned n)
{
	memset(p, 0, sizeof(*p));
	p->n = n;
	p->start.n = p->done.n = p->phase.n = n;
	pin(0);
	for (unsigned i = 1; i < n; i++) {
		struct worker_arg *a = malloc(sizeof(*a));
		if (!a)
			abort();
		*a = (struct worker_arg){p, i};
		if (pthread_create(&p->threads[i], NULL, worker_main, a) != 0) {
			perror("pthread_create");
			exit(1);
		}
	}
}

/* Runs job on all workers (the caller is worker 0). */
static void pool_run(struct pool *p, job_fn job, void *arg)
{
	p->job = job;
	p->arg = arg;
	barrier_wait(&p->start);
	job(p, 0);
	barrier_wait(&p->done);
}

static void pool_destroy(struct pool *p)
{
	atomic_store(&p->quit, true);
	barrier_wait(&p->start);
	for (unsigned i = 1; i < p->n; i++)
		pthread_join(p->threads[i], NULL);
}

/* ---- Machine limits ---------------------------------------------------------------------- */

struct stream_job {
	const float *buf;
	size_t n;
	size_t prefetch; /* floats ahead to software-prefetch; 0 = none (hardware prefetch only) */
	double sums[MAX_THREADS];
};

__attribute__((target("avx2"))) static void stream_part(struct pool *p, unsigned w)
{
	struct stream_job *j = p->arg;
	const size_t b = j->n * w / p->n, e = j->n * (w + 1) / p->n;
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	const size_t ahead = j->prefetch;
	for (size_t i = b; i + 32 <= e; i += 32) {
		if (ahead)
			_mm_prefetch((const char *)(j->buf + i + ahead), _MM_HINT_T0);
		a0 = _mm256_add_ps(a0, _mm256_load_ps(j->buf + i));
		a1 = _mm256_add_ps(a1, _mm256_load_ps(j->buf + i + 8));
		a2 = _mm256_add_ps(a2, _mm256_load_ps(j->buf + i + 16));
		a3 = _mm256_add_ps(a3, _mm256_load_ps(j->buf + i + 24));
	}
	float t[8];
	_mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
	j->sums[w] = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

/* The probe buffer is allocated and written once (first touch) by the caller. The best of a
 * plain read-sum and read-sums with a software prefetch 1.5 KiB (what the decode dots use) and
 * 8 KiB ahead, 3 passes each: the bandwidth a read loop can get, not just what the hardware
 * prefetcher alone gives (which the kernels' own prefetching beat by 5-20%). The prefetches
 * past the end of a thread's part stay inside the buffer (the tail is not read). */
static double dram_read_gbps(struct pool *p, const float *buf, size_t bytes, int reps)
{
	static const size_t ahead_bytes[] = {0, 1536, 8192};
	double best = 0;
	for (size_t v = 0; v < sizeof(ahead_bytes) / sizeof(ahead_bytes[0]); v++) {
		const size_t ahead = ahead_bytes[v] / sizeof(float);
		struct stream_job j = {.buf = buf, .n = bytes / 4 - ahead, .prefetch = ahead};
		for (int rep = 0; rep < reps; rep++) {
			const double t0 = monotonic_s();
			pool_run(p, stream_part, &j);
			const double gbps = (double)(j.n * 4) / (monotonic_s() - t0) * 1e-9;
			best = gbps > best ? gbps : best;
		}
	}
	return best;
}

struct fma_job {
	double gflops_part[MAX_THREADS];
	float sink[MAX_THREADS];
	long iters;
};

/* The FMA chains of cores.h, timed per thread. */
static void fma_part(struct pool *p, unsigned w)
{
	struct fma_job *j = p->arg;
	const double t0 = monotonic_s();
	j->sink[w] = bench_fma_chains(j->iters);
	j->gflops_part[w] = (double)j->iters * 10 * 16 / (monotonic_s() - t0) * 1e-9;
}

/* Register-only peaks of the other paths, in GFLOP/s (integer: G ops/s, a multiply and an
 * add per element pair): vdpbf16ps zmm = 32 bf16 pair products = 64 flops; vpdpbusd zmm = 64
 * byte products summed = 128 ops; AMX tdpbf16ps on 16x32 · 32x16 tiles = 16384 flops,
 * tdpbusd 16x64 · 64x16 = 32768 ops. 12 independent accumulators (latency x throughput);
 * AMX: four C tiles from two A and two B tiles. */
enum peak_kind { PEAK_FMA, PEAK_BF16, PEAK_VNNI, PEAK_AMX_BF16, PEAK_AMX_INT8, PEAK_KINDS };
static const char *const peak_names[PEAK_KINDS] = {"fma", "bf16", "vnni", "amx_bf16", "amx_int8"};

/* 12 accumulators in named registers (an array stays in memory), the step applied to each. */
#define CHAINS_12(T, init, step)                                                                   \
	T a0 = init(0), a1 = init(1), a2 = init(2), a3 = init(3), a4 = init(4), a5 = init(5);      \
	T a6 = init(6), a7 = init(7), a8 = init(8), a9 = init(9), a10 = init(10), a11 = init(11);  \
	for (long it = 0; it < iters; it++) {                                                      \
		a0 = step(a0), a1 = step(a1), a2 = step(a2), a3 = step(a3);                        \
		a4 = step(a4), a5 = step(a5), a6 = step(a6), a7 = step(a7);                        \
		a8 = step(a8), a9 = step(a9), a10 = step(a10), a11 = step(a11);                    \
	}

#define BF16_INIT(i) _mm512_set1_ps((float)(i))
#define BF16_STEP(a) _mm512_dpbf16_ps(a, x, x)
__attribute__((target("avx512f,avx512bf16"))) static float bf16_chains(long iters)
{
	const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80); /* pairs of 1.0 */
	CHAINS_12(__m512, BF16_INIT, BF16_STEP)
	const __m512 s = _mm512_add_ps(
	    _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
	                  _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
	    _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
	return _mm512_reduce_add_ps(s);
}

#define VNNI_INIT(i) _mm512_set1_epi32(i)
#define VNNI_STEP(a) _mm512_dpbusd_epi32(a, x, x)
__attribute__((target("avx512f,avx512vnni"))) static float vnni_chains(long iters)
{
	const __m512i x = _mm512_set1_epi8(1);
	CHAINS_12(__m512i, VNNI_INIT, VNNI_STEP)
	const __m512i s = _mm512_add_epi32(
	    _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
	                     _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7))),
	    _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
	return (float)_mm512_reduce_add_epi32(s);
}

/* AMX: the tile configuration (palette 1): tiles 0-3 C (16 x 64 bytes), 4-5 A, 6-7 B, all
 * zero (the values do not change the speed). Only called where moek_cpu_features() has
 * MOEK_CPU_AMX: the CPU has AMX and the kernel granted this process the tile data. */
struct amx_config {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
};
_Static_assert(sizeof(struct amx_config) == 64, "AMX tile configuration");

__attribute__((target("amx-tile,amx-bf16,amx-int8"))) static float amx_chains(long iters, bool int8)
{
	struct amx_config cfg = {.palette = 1};
	for (int t = 0; t < 8; t++)
		cfg.colsb[t] = 64, cfg.rows[t] = 16;
	_tile_loadconfig(&cfg);
	_tile_zero(0);
	_tile_zero(1);
	_tile_zero(2);
	_tile_zero(3);
	_tile_zero(4);
	_tile_zero(5);
	_tile_zero(6);
	_tile_zero(7);
	if (int8)
		for (long it = 0; it < iters; it++) {
			_tile_dpbusd(0, 4, 6);
			_tile_dpbusd(1, 4, 7);
			_tile_dpbusd(2, 5, 6);
			_tile_dpbusd(3, 5, 7);
		}
	else
		for (long it = 0; it < iters; it++) {
			_tile_dpbf16ps(0, 4, 6);
			_tile_dpbf16ps(1, 4, 7);
			_tile_dpbf16ps(2, 5, 6);
			_tile_dpbf16ps(3, 5, 7);
		}
	float c[16 * 16];
	_tile_stored(0, c, 64);
	_tile_release();
	return c[0];
}

/* Whether this CPU has the peak's instructions (the library's detection: the OS state too). */
static bool peak_available(enum peak_kind k)
{
	const unsigned f = moek_cpu_features();
	switch (k) {
	case PEAK_FMA: return true; /* main() requires AVX2+FMA */
	case PEAK_BF16: return (f & MOEK_CPU_AVX512_BF16) != 0;
	case PEAK_VNNI: return (f & MOEK_CPU_AVX512_VNNI) && (f & MOEK_CPU_AVX512);
	default: return (f & MOEK_CPU_AMX) != 0;
	}
}

struct peak_job {
	enum peak_kind kind;
	long iters;
	double gops_part[MAX_THREADS];
	float sink[MAX_THREADS];
};

static void peak_part(struct pool *p, unsigned w)
{
	struct peak_job *j = p->arg;
	static const double ops_per_iter[PEAK_KINDS] = {10 * 16, 12 * 64, 12 * 128, 4 * 16384,
	                                                4 * 32768};
	const double t0 = run_s();
	switch (j->kind) {
	case PEAK_FMA: j->sink[w] = bench_fma_chains(j->iters); break;
	case PEAK_BF16: j->sink[w] = bf16_chains(j->iters); break;
	case PEAK_VNNI: j->sink[w] = vnni_chains(j->iters); break;
	default: j->sink[w] = amx_chains(j->iters, j->kind == PEAK_AMX_INT8); break;
	}
	j->gops_part[w] = (double)j->iters * ops_per_iter[j->kind] / (run_s() - t0) * 1e-9;
}

/* The peak of `kind` for the pool's threads (best of 2), NAN where the CPU lacks it. */
static double peak_gops(struct pool *p, enum peak_kind kind)
{
	static const long iters[PEAK_KINDS] = {20000000, 8000000, 8000000, 200000, 200000};
	if (!peak_available(kind))
		return NAN;
	struct peak_job j = {.kind = kind, .iters = iters[kind]};
	double best = 0;
	for (int rep = 0; rep < 2; rep++) {
		pool_run(p, peak_part, &j);
		double sum = 0;
		for (unsigned w = 0; w < p->n; w++)
			sum += j.gops_part[w];
		best = sum > best ? sum : best;
	}
	return best;
}

static void all_peaks(struct pool *p, double peaks[PEAK_KINDS])
{
	for (int k = 0; k < PEAK_KINDS; k++)
		peaks[k] = peak_gops(p, (enum peak_kind)k);
}

static size_t llc_bytes(void)
{
	size_t bytes = 32u << 20;
	FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
	if (f) {
		unsigned long kib;
		if (fscanf(f, "%luK", &kib) == 1 && kib > 0)
			bytes = kib << 10;
		fclose(f);
	}
	return bytes;
}

/* ---- Experts ------------------------------------------------------------------------------ */

struct shape {
	const char *name;
	size_t hidden, ffn;
};

static const struct shape shapes[] = {
    {"qwen3-30b-a3b", 2048, 768},
    {"mixtral", 4096, 14336},
    {"deepseek-v3", 7168, 2048},
    {"gpt-oss", 2880, 2880},
};

/* A format with its rows interleaved in groups of 8 (moek_interleave, the decode layout of
 * Q4_K, Q8_0, MXFP4, BF16, INT4_G32, Q2_K and Q3_K) is benchmarked as a format of its own:
 * "Q4_Kx8", … */
#define BENCH_X8 0x10000u

/* clang-format off */
static const uint32_t all_formats[] = {
    MOEK_Q4_K,  BENCH_X8 | MOEK_Q4_K,  MOEK_Q8_0,   BENCH_X8 | MOEK_Q8_0,
    MOEK_MXFP4, BENCH_X8 | MOEK_MXFP4, MOEK_BF16,   BENCH_X8 | MOEK_BF16,
    MOEK_Q4_0,  MOEK_Q5_K,             MOEK_Q6_K,
    MOEK_Q2_K,  BENCH_X8 | MOEK_Q2_K,
    MOEK_Q3_K,  BENCH_X8 | MOEK_Q3_K,
    MOEK_IQ4_NL, BENCH_X8 | MOEK_IQ4_NL, MOEK_IQ4_XS, BENCH_X8 | MOEK_IQ4_XS,
    MOEK_F16,   MOEK_F32,
    MOEK_FP8_E4M3_B128, MOEK_INT4_G32, BENCH_X8 | MOEK_INT4_G32,
    MOEK_NVFP4, BENCH_X8 | MOEK_NVFP4,
    MOEK_IQ2_XXS, MOEK_IQ2_XS, MOEK_IQ3_XXS, MOEK_IQ3_S, MOEK_IQ1_S, MOEK_IQ1_M, MOEK_IQ2_S};
/* clang-format on */

static uint32_t weight_format(uint32_t f)
{
	return f & 0xFFFFu;
}

static bool interleaved(uint32_t f)
{
	return (f & BENCH_X8) != 0;
}

static const char *format_name(uint32_t f)
{
	switch (f) {
	case BENCH_X8 | MOEK_Q4_K: return "Q4_Kx8";
	case BENCH_X8 | MOEK_Q8_0: return "Q8_0x8";
	case BENCH_X8 | MOEK_MXFP4: return "MXFP4x8";
	case BENCH_X8 | MOEK_BF16: return "BF16x8";
	case BENCH_X8 | MOEK_INT4_G32: return "INT4_G32x8";
	case BENCH_X8 | MOEK_NVFP4: return "NVFP4x8";
	case BENCH_X8 | MOEK_Q2_K: return "Q2_Kx8";
	case BENCH_X8 | MOEK_Q3_K: return "Q3_Kx8";
	case BENCH_X8 | MOEK_IQ4_NL: return "IQ4_NLx8";
	case BENCH_X8 | MOEK_IQ4_XS: return "IQ4_XSx8";
	default: return moek_format_lookup(f)->name;
	}
}

struct bench_matrix {
	uint8_t *data;
	float *scales;
	size_t bytes;
};

/* A rows x cols matrix: 16 distinct rows quantized from random floats, then repeated (the
 * content does not change the speed; quantizing 100M weights with the reference would). */
static int make_matrix(uint32_t format, size_t rows, size_t cols, struct bench_matrix *m,
                       unsigned seed)
{
	const size_t rb = moek_row_bytes(format, cols);
	if (rb == 0)
		return -1;
	enum { DISTINCT = 16 };
	float *src = malloc(DISTINCT * cols * sizeof(float));
	m->bytes = rb * rows;
	m->data = big_alloc(m->bytes);
	m->scales = NULL;
	if (!src || !m->data)
		return -1;
	for (size_t i = 0; i < DISTINCT * cols; i++) {
		seed = seed * 1103515245u + 12345u;
		src[i] = ((float)(seed >> 8) * 0x1p-24f - 0.5f) * 0.1f;
	}
	if (format == MOEK_FP8_E4M3_B128) {
		const size_t nsc = moek_fp8_scale_bytes(rows, cols) / sizeof(float);
		m->scales = malloc(nsc * sizeof(float));
		float *sc = malloc(moek_fp8_scale_bytes(DISTINCT, cols));
		const int rc = !sc || moek_quantize(format, src, DISTINCT, cols, m->data, sc);
		free(sc);
		if (!m->scales || rc)
			return -1;
		for (size_t i = 0; i < nsc; i++)
			m->scales[i] = 0.05f / 448.0f;
	} else if (moek_quantize(format, src, DISTINCT, cols, m->data, NULL)) {
		return -1;
	}
	for (size_t r = DISTINCT; r < rows; r++)
		memcpy(m->data + r * rb, m->data + (r % DISTINCT) * rb, rb);
	free(src);
	return 0;
}

/* An expert in the layout the kernels read fastest (moek_expert_pack: gate and up rows
 * alternating in one buffer, interleaved in groups of 8 for the "x8" formats), as the
 * sidecar's slots hold them. */
struct bench_expert {
	uint8_t *data;    /* the packed weights */
	float *scales[3]; /* FP8 block scales of gate, up, down: the first expert's, shared */
	struct moek_expert e;
	size_t bytes;
};

static int make_expert(uint32_t tag, const struct shape *s, struct bench_expert *x, unsigned seed)
{
	const uint32_t format = weight_format(tag);
	struct bench_matrix g, u, d;
	if (make_matrix(format, s->ffn, s->hidden, &g, seed) ||
	    make_matrix(format, s->ffn, s->hidden, &u, seed + 1) ||
	    make_matrix(format, s->hidden, s->ffn, &d, seed + 2))
		return -1;
	struct moek_expert src = {.gate = {format, (uint32_t)s->ffn, (uint32_t)s->hidden, g.data, 0,
	                                   g.scales, 0, NULL, 0, 0},
	                          .up = {format, (uint32_t)s->ffn, (uint32_t)s->hidden, u.data, 0,
	                                 u.scales, 0, NULL, 0, 0},
	                          .down = {format, (uint32_t)s->hidden, (uint32_t)s->ffn, d.data, 0,
	                                   d.scales, 0, NULL, 0, 0},
	                          .activation = MOEK_SWIGLU};
	x->bytes = moek_expert_packed_bytes(&src);
	x->data = big_alloc(x->bytes);
	char err[256];
	if (!x->data ||
	    moek_expert_pack(&src, interleaved(tag), x->data, x->bytes, &x->e, err, sizeof(err))) {
		fprintf(stderr, "bench_kernels: %s\n", x->data ? err : "out of memory");
		return -1;
	}
	free(g.data), free(u.data), free(d.data);
	x->scales[0] = g.scales, x->scales[1] = u.scales, x->scales[2] = d.scales;
	return 0;
}

/* Another copy of x's weights in memory of its own (the FP8 scales stay shared). */
static int clone_expert(const struct bench_expert *x, struct bench_expert *y)
{
	*y = *x;
	y->data = big_alloc(x->bytes);
	if (!y->data)
		return -1;
	memcpy(y->data, x->data, x->bytes);
	struct moek_matrix *ms[3] = {&y->e.gate, &y->e.up, &y->e.down};
	for (int m = 0; m < 3; m++)
		ms[m]->data = y->data + ((const uint8_t *)ms[m]->data - x->data);
	return 0;
}

/* Rewrites a matrix's rows interleaved in groups of 8. */
static int interleave_matrix(struct bench_matrix *m, struct moek_matrix *d)
{
	uint8_t *x8 = big_alloc(m->bytes);
	if (!x8 || moek_interleave(d->format, m->data, 0, d->rows, d->cols, x8))
		return -1;
	free(m->data);
	m->data = x8;
	d->data = x8;
	d->interleave = MOEK_INTERLEAVE;
	return 0;
}

/* --verbose: each decode slice's probe and weight rate on stderr. */
static bool verbose;

/* ---- One measurement ------------------------------------------------------------------------ */

/* The calls run in waves of `wave` experts, as the sidecar's pool runs the routed experts of
 * a layer: every call of the wave loads, then every call's hidden rows, then every call's down
 * rows, a barrier between the phases; within a phase the workers claim items from a counter,
 * so a worker that is ahead takes the next item instead of waiting at the barrier. An item is
 * a whole expert's rows where the wave shares out evenly, else one worker's contiguous range
 * of them — the sidecar's rule (pool_whole_groups): decode waves of 8 run whole experts on 1
 * or 2 threads, prefill (one expert per wave) splits it. */
struct ffn_job {
	struct moek_ffn_call *calls; /* one per expert in the cycle (scratch per wave slot) */
	size_t n_calls, first, count; /* run calls first, first+1, … (mod n_calls), count of them */
	size_t wave;                  /* calls per wave; count is a multiple of it */
	size_t align;
	atomic_size_t tickets[2];        /* hidden, down items claimed so far (never reset) */
	size_t base[MAX_THREADS + 1][2]; /* each worker's view of where this phase starts */
};

/* Claims the next of the `items` of phase ph; false when none is left. Every worker makes
 * exactly one failing claim per phase, so all of them know where the next phase's tickets
 * start. */
static bool claim(struct ffn_job *j, unsigned w, size_t n_workers, int ph, size_t items,
                  size_t *item)
{
	const size_t t = atomic_fetch_add_explicit(&j->tickets[ph], 1, memory_order_relaxed);
	if (t - j->base[w][ph] < items) {
		*item = t - j->base[w][ph];
		return true;
	}
	j->base[w][ph] += items + n_workers;
	return false;
}

/* Item `it` of a phase: its call and the part of `parts` it covers. */
static void item_of(const struct ffn_job *j, size_t it, size_t n, size_t *call, size_t *part,
                    size_t *parts)
{
	const size_t whole = j->wave - j->wave % n;
	if (it < whole) {
		*call = it, *part = 0, *parts = 1;
		return;
	}
	*call = whole + (it - whole) / n, *part = (it - whole) % n, *parts = n;
}

static void ffn_part(struct pool *p, unsigned w)
{
	struct ffn_job *j = p->arg;
	const size_t n = p->n, whole = j->wave - j->wave % n;
	const size_t items = whole + (j->wave - whole) * n;
	for (size_t i = 0; i < j->count; i += j->wave) {
		const struct moek_ffn_call *c = &j->calls[(j->first + i) % j->n_calls];
		for (size_t q = w; q < j->wave; q += n)
			moek_ffn_load(&c[q], w, 0, c[q].n_tokens);
		barrier_wait(&p->phase);
		size_t it, q, part, parts;
		while (claim(j, w, n, 0, items, &it)) {
			item_of(j, it, n, &q, &part, &parts);
			const size_t ffn = c[q].expert->gate.rows;
			const size_t units = (ffn + j->align - 1) / j->align;
			const size_t fb = units * part / parts * j->align,
			             fe = units * (part + 1) / parts * j->align;
			moek_ffn_hidden(&c[q], w, fb, fe < ffn ? fe : ffn);
		}
		barrier_wait(&p->phase);
		/* the next wave's load writes other scratch: no barrier after down */
		while (claim(j, w, n, 1, items, &it)) {
			item_of(j, it, n, &q, &part, &parts);
			const size_t hidden = c[q].expert->gate.cols;
			const size_t ob = hidden * part / parts / 8 * 8,
			             oe = part + 1 == parts ? hidden
			                                    : hidden * (part + 1) / parts / 8 * 8;
			moek_ffn_down(&c[q], w, ob, oe);
		}
	}
}

/* Rows of at least this many tokens run as prefill (two experts cycled, compute-bound); fewer,
 * as decode (experts from DRAM, probes around each slice). */
enum { PREFILL_ROW_TOKENS = 64 };

struct row {
	uint32_t format;
	const char *shape;
	size_t tokens;
	unsigned threads;
	double weight_gbps, bw_fraction, gflops, peak_fraction, tokens_per_s;
	double dram_gbps; /* the probe the row is divided by */
	enum moek_ffn_path path;
	enum peak_kind peak_kind; /* the peak of the path's instructions (peak_fraction's) */
	double peak;
	double cores;        /* cores' worth of FMA throughput around the slices used */
	int shared_slices;   /* slices redone: the machine gave two threads one core */
	int unsteady_slices; /* slices redone: the memory bandwidth moved during the slice */
};

/* Median of n values (n <= SLICES; v is reordered). */
static double median(double *v, size_t n)
{
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && v[j] < v[j - 1]; j--) {
			const double t = v[j];
			v[j] = v[j - 1], v[j - 1] = t;
		}
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A two-thread decode slice measured while the VM ran its vCPUs as one core (cores.h) says
 * nothing about two threads against DRAM (one core nearly saturates the memory): slices whose
 * bracketing checks see fewer than BENCH_TWO_CORES cores' worth of FMA throughput are redone
 * (up to MAX_ATTEMPTS) and counted. So are slices whose DRAM probes before and after differ by
 * more than UNSTEADY: this VM's memory moves between two levels (about 33 and 60 GB/s for two
 * threads) within seconds, and a slice that straddles a change has no probe to compare with
 * (ratios of 0.6 or 1.14 for the same kernel). */
enum { SLICES = 5, MAX_ATTEMPTS = 3 * SLICES };
#define UNSTEADY 0.15

struct probe_ctx {
	const float *buf;
	size_t bytes;
	double fma_1t; /* one thread's FMA GFLOP/s, measured at start */
};

/* Cores' worth of FMA throughput the pool gets now (a few ms): all threads' FMAs over the
 * wall time of the whole run, so two threads taking turns on one core count as one. */
static double cores_now(struct pool *p, const struct probe_ctx *pc)
{
	if (p->n == 1)
		return 1.0;
	const long iters = BENCH_CORES_ITERS;
	struct fma_job j = {{0}, {0}, iters};
	const double t0 = monotonic_s();
	pool_run(p, fma_part, &j);
	const double gflops = (double)iters * 10 * 16 * p->n / (monotonic_s() - t0) * 1e-9;
	return gflops / pc->fma_1t;
}

/* Runs the calls for min_time. With a probe (decode rows) the time is cut into SLICES slices,
 * each bracketed by DRAM probes (one pass of each prefetch variant, the best): this VM's
 * memory bandwidth moves within seconds, and a probe taken away from the row it divides
 * measured the drift more than the kernel. A slice's ratio is its weight rate over the mean
 * of its two probes; bw_fraction is the median of the slices' ratios (NAN when no slice was
 * usable), r->dram_gbps the median probe; weight_gbps and the rest cover the slices used. */
static int measure(struct pool *p, struct bench_expert *experts, size_t n_experts,
                   const struct shape *s, size_t tokens, double min_time,
                   const struct probe_ctx *pc, struct row *r)
{
	const size_t hidden = s->hidden;
	/* decode runs waves of up to WAVE experts (a layer's routed experts); prefill one at a
	 * time. Each of the 2 · wave slots has its own scratch and output. */
	enum { WAVE = 8 };
	const size_t wave = pc ? (n_experts / 2 < WAVE ? n_experts / 2 : WAVE) : 1;
	n_experts = n_experts / (2 * wave) * (2 * wave);
	float *x = malloc(tokens * hidden * sizeof(float));
	float *weights = malloc(tokens * sizeof(float));
	struct moek_ffn_call *calls = calloc(n_experts, sizeof(*calls));
	const size_t scratch_bytes = moek_ffn_scratch_bytes(&experts[0].e, tokens, p->n);
	void *scratch[2 * WAVE] = {0};
	float *out[2 * WAVE] = {0};
	if (!x || !weights || !calls || !scratch_bytes)
		return -1;
	for (size_t i = 0; i < 2 * wave; i++) {
		scratch[i] = malloc(scratch_bytes);
		out[i] = calloc(tokens * hidden, sizeof(float));
		if (!scratch[i] || !out[i])
			return -1;
	}
	for (size_t i = 0; i < tokens * hidden; i++)
		x[i] = sinf((float)i);
	for (size_t t = 0; t < tokens; t++)
		weights[t] = 0.125f;
	for (size_t i = 0; i < n_experts; i++) {
		calls[i] = (struct moek_ffn_call){.expert = &experts[i].e,
		                                  .n_tokens = tokens,
		                                  .x = x,
		                                  .x_dtype = MOEK_ACT_F32,
		                                  .weights = weights,
		                                  .out = out[i % (2 * wave)],
		                                  .scratch = scratch[i % (2 * wave)],
		                                  .scratch_bytes = scratch_bytes,
		                                  .n_workers = p->n};
		char err[256];
		if (moek_ffn_prepare(&calls[i], err, sizeof(err))) {
			fprintf(stderr, "bench_kernels: %s\n", err);
			return -1;
		}
	}
	r->path = moek_ffn_call_path(&calls[0]);
	struct ffn_job j = {.calls = calls,
	                    .n_calls = n_experts,
	                    .count = wave,
	                    .wave = wave,
	                    .align = moek_ffn_hidden_align(&experts[0].e)};
	pool_run(p, ffn_part, &j); /* warm-up: page faults, code */
	j.first = wave;
	const int slices = pc ? SLICES : 1;
	double ratio[SLICES], dram[SLICES], cores[SLICES], total_dt = 0;
	size_t total_done = 0;
	int used = 0;
	r->shared_slices = r->unsteady_slices = 0;
	for (int attempt = 0; used < slices && attempt < (pc ? MAX_ATTEMPTS : 1); attempt++) {
		double c = 1.0, d = 0;
		if (pc) {
			c = cores_now(p, pc);
			d = dram_read_gbps(p, pc->buf, pc->bytes, 1);
		}
		size_t done = 0;
		const bool cpu = cpu_time && p->n == 1; /* one thread: the caller's */
		const double t0 = cpu ? run_s() : monotonic_s();
		double dt = 0;
		do {
			/* batches small enough to stop near the slice's end, large enough to
			 * hide the pool hand-off; whole waves */
			j.count = done == 0 ? wave : (done < n_experts ? done : n_experts);
			pool_run(p, ffn_part, &j);
			j.first = (j.first + j.count) % n_experts;
			done += j.count;
			dt = (cpu ? run_s() : monotonic_s()) - t0;
		} while (dt < min_time / slices);
		if (pc) {
			const double d1 = dram_read_gbps(p, pc->buf, pc->bytes, 1);
			const double c1 = cores_now(p, pc);
			c = c1 < c ? c1 : c;
			if (p->n > 1 && c < BENCH_TWO_CORES) {
				r->shared_slices++;
				continue;
			}
			if (fabs(d1 - d) > UNSTEADY * (d1 > d ? d1 : d)) {
				r->unsteady_slices++;
				continue;
			}
			d = 0.5 * (d + d1);
			ratio[used] = (double)experts[0].bytes * (double)done / dt * 1e-9 / d;
			dram[used] = d, cores[used] = c;
			if (verbose)
				fprintf(stderr,
				        "  slice: probe %.1f GB/s, weights %.1f GB/s, cores %.2f\n",
				        d, ratio[used] * d, c);
		}
		used++;
		total_done += done, total_dt += dt;
	}
	const double flops = 2.0 * 3.0 * (double)hidden * (double)s->ffn * (double)tokens;
	const double rate = total_dt > 0 ? (double)total_done / total_dt : NAN;
	r->weight_gbps = (double)experts[0].bytes * rate * 1e-9;
	r->gflops = flops * rate * 1e-9;
	r->tokens_per_s = (double)tokens * rate;
	r->cores = (double)p->n;
	if (pc) {
		r->bw_fraction = used ? median(ratio, (size_t)used) : NAN;
		r->dram_gbps = used ? median(dram, (size_t)used) : NAN;
		r->cores = used ? median(cores, (size_t)used) : NAN;
	}
	for (size_t i = 0; i < 2 * wave; i++)
		free(scratch[i]), free(out[i]);
	free(x), free(weights), free(calls);
	return 0;
}

/* A JSON number, or null for NAN (a decode row with no two-core slice). */
static void json_num(const char *key, double v, int prec)
{
	if (isnan(v))
		printf(", \"%s\": null", key);
	else
		printf(", \"%s\": %.*f", key, prec, v);
}

static const char *path_name(enum moek_ffn_path path)
{
	switch (path) {
	case MOEK_PATH_DOTS: return "dots";
	case MOEK_PATH_GROUPS: return "groups";
	case MOEK_PATH_TILES_F32: return "f32-tiles";
	default: return "bf16-tiles";
	}
}

/* The peak a row's path is held to: the bf16 tiles' instruction (AMX's on the amx ISA), the
 * integer dots' vpdpbusd where the CPU has it, FMA for the float paths. */
static enum peak_kind row_peak_kind(const struct row *r, const double peaks[PEAK_KINDS])
{
	if (r->path == MOEK_PATH_TILES_BF16)
		return moek_isa_active() == MOEK_ISA_AMX && !isnan(peaks[PEAK_AMX_BF16])
		           ? PEAK_AMX_BF16
		           : PEAK_BF16;
	const uint32_t act = moek_vec_dot_format(weight_format(r->format));
	if (r->path != MOEK_PATH_TILES_F32 && (act == MOEK_Q8_0 || act == MOEK_Q8_K) &&
	    !isnan(peaks[PEAK_VNNI]))
		return PEAK_VNNI;
	return PEAK_FMA;
}

static void print_row(const struct row *r, bool json, bool first, double peak_now)
{
	const char *fname = format_name(r->format);
	if (json) {
		printf("%s\n  {\"format\": \"%s\", \"shape\": \"%s\", \"tokens\": %zu, "
		       "\"threads\": %u",
		       first ? "" : ",", fname, r->shape, r->tokens, r->threads);
		json_num("weight_gbps", r->weight_gbps, 2);
		json_num("bw_fraction", r->bw_fraction, 3);
		json_num("gflops", r->gflops, 1);
		json_num("peak_fraction", r->peak_fraction, 3);
		json_num("tokens_per_s", r->tokens_per_s, 1);
		json_num("dram_read_gbps", r->dram_gbps, 2);
		json_num("fma_peak_gflops", peak_now, 1);
		printf(", \"path\": \"%s\", \"peak_kind\": \"%s\"", path_name(r->path),
		       peak_names[r->peak_kind]);
		json_num("peak_gflops", r->peak, 1);
		json_num("cores", r->cores, 2);
		printf(", \"shared_slices\": %d, \"unsteady_slices\": %d}", r->shared_slices,
		       r->unsteady_slices);
		return;
	}
	printf("%-14s %-14s %6zu %3u %9.2f %6.2f %9.1f %6.2f %-8s %10.1f %6.2f %5d %s\n", fname,
	       r->shape, r->tokens, r->threads, r->weight_gbps, r->bw_fraction, r->gflops,
	       r->peak_fraction, peak_names[r->peak_kind], r->tokens_per_s, r->cores,
	       r->shared_slices + r->unsteady_slices, path_name(r->path));
}

/* ---- CLI ----------------------------------------------------------------------------------- */

static bool in_list(const char *list, const char *name)
{
	if (!list)
		return true;
	const size_t n = strlen(name);
	for (const char *p = list; *p;) {
		const char *comma = strchr(p, ',');
		const size_t len = comma ? (size_t)(comma - p) : strlen(p);
		if (len > 0 && strncasecmp(p, name, len) == 0 && (len == n || name[len] == '-'))
			return true;
		p += len + (comma ? 1 : 0);
	}
	return false;
}

/* ---- --dots: the decode dots' in-core ceiling --------------------------------------------- */

/* One thread, the AVX2 ISA's one-token dot (its many-row form where it has one, VNNI forms
 * where the CPU has them) over about 24 KiB of rows that stay in L1/L2, best of 30 passes:
 * the rate at which the dot can consume weights when memory is not the limit. Against the
 * one-thread DRAM probe of the same run: below ~1.2 the decode rows of that format are
 * compute-bound on this machine, however the memory behaves. */
static int dots_table(const char *formats, const char *shape_list, double dram_1t, bool json)
{
	const struct moek_isa_ops *ops = &moek_avx2_ops;
	(void)moek_isa_active(); /* the ISA choice enables the VNNI forms where present */
	bool first = true;
	if (!json)
		printf("%-8s %6s %10s %10s %12s\n", "format", "k", "ns/row", "GB/s", "vs DRAM 1t");
	else
		printf("{\"dram_read_gbps_1t\": %.2f, \"dots\": [", dram_1t);
	for (size_t fi = 0; fi < sizeof(all_formats) / sizeof(all_formats[0]); fi++) {
		const uint32_t tag = all_formats[fi], fmt = weight_format(tag);
		const bool x8 = interleaved(tag);
		const char *fname = format_name(tag);
		if (!in_list(formats, fname) || fmt == MOEK_FP8_E4M3_B128)
			continue; /* FP8 has no one-token many-row form and carries scale rows */
		size_t ks[2 * sizeof(shapes) / sizeof(shapes[0])], nk = 0;
		for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
			if (!in_list(shape_list, shapes[si].name))
				continue;
			const size_t cand[2] = {shapes[si].hidden, shapes[si].ffn};
			for (int c = 0; c < 2; c++) {
				bool seen = false;
				for (size_t i = 0; i < nk; i++)
					seen |= ks[i] == cand[c];
				if (!seen && moek_row_bytes(fmt, cand[c]))
					ks[nk++] = cand[c];
			}
		}
		for (size_t ki = 0; ki < nk; ki++) {
			const size_t k = ks[ki], rb = moek_row_bytes(fmt, k);
			size_t rows = (24u << 10) / rb;
			rows = rows < 1 ? 1 : rows > 64 ? 64 : rows;
			if (x8) /* whole groups of 8 */
				rows = (rows + 7) / 8 * 8;
			struct bench_matrix m;
			struct moek_matrix d = {fmt, (uint32_t)rows, (uint32_t)k, NULL, 0, NULL,
			                        0,   NULL,           0,           0};
			if (make_matrix(fmt, rows, k, &m, 7) || (x8 && interleave_matrix(&m, &d)))
				return -1;
			const uint32_t af = moek_isa_act_format(ops, fmt, x8);
			const size_t ab =
			    af == MOEK_F32 ? k * sizeof(float) : moek_isa_act_row_bytes(ops, af, k);
			float *x = malloc(k * sizeof(float)), out[64];
			void *xa = aligned_alloc(64, (ab + 63) / 64 * 64);
			if (!x || !xa)
				return -1;
			for (size_t i = 0; i < k; i++)
				x[i] = cosf((float)i * 0.11f);
			if (af == MOEK_F32)
				memcpy(xa, x, k * sizeof(float));
			else
				moek_isa_quantize_act(ops, af, x, k, xa);
			const moek_dot_rows_fn many = ops->dot_rows[moek_fmt_index(fmt)];
			const moek_dot_fn dot = ops->dot[moek_fmt_index(fmt)];
			const int passes = 200;
			double best = 1e30;
			for (int rep = 0; rep < 30; rep++) {
				const double t0 = monotonic_s();
				for (int it = 0; it < passes; it++) {
					if (x8)
						for (size_t g = 0; g < rows; g += 8)
							ops->dot_x8[moek_fmt_index(fmt)](
							    m.data + g * rb, xa, ab, 1, k, out + g);
					else if (many)
						many(m.data, rb, rows, xa, k, out);
					else
						for (size_t r = 0; r < rows; r++)
							dot(m.data + r * rb, NULL, xa, ab, 1, k,
							    out + r);
				}
				const double dt = monotonic_s() - t0;
				best = dt < best ? dt : best;
			}
			const double ns_row = best / (passes * (double)rows) * 1e9;
			const double gbps = (double)rb / ns_row;
			if (json)
				printf(
				    "%s\n  {\"format\": \"%s\", \"k\": %zu, \"ns_per_row\": %.2f, "
				    "\"gbps\": %.2f, \"vs_dram_1t\": %.3f}",
				    first ? "" : ",", fname, k, ns_row, gbps, gbps / dram_1t);
			else
				printf("%-8s %6zu %10.1f %10.2f %12.2f\n", fname, k, ns_row, gbps,
				       gbps / dram_1t);
			first = false;
			free(x), free(xa), free(m.data), free(m.scales);
		}
	}
	if (json)
		printf("\n]}\n");
	return 0;
}

/* --isa NAME: the kernels run on that ISA, or a line naming what this CPU lacks (as serve). */
static int set_isa(const char *name)
{
	char why[384];
	if (moek_isa_force(name, why, sizeof(why)) == 0)
		return 0;
	fprintf(stderr, "bench_kernels: --isa %s\n", why);
	return -1;
}

/* --bf16-from N: the bf16 tiles from N tokens for every format. */
static void force_tile_bf16_from(struct moek_isa_ops *ops, unsigned tokens)
{
	for (unsigned f = 0; f < MOEK_FMT_SLOTS; f++)
		ops->tile_bf16_from[0][f] = ops->tile_bf16_from[1][f] = tokens;
}

static void usage(void)
{
	fprintf(stderr, "usage: bench_kernels [--json] [--quick] [--formats Q4_K,BF16,...] "
	                "[--shapes qwen3,mixtral,deepseek,gpt-oss] [--threads 1,2] "
	                "[--tokens 1,4,8,128,512] [--min-time S] [--set-mb MB] "
	                "[--group-prefetch NEAR,GAP] [--isa scalar|avx2|avx512|amx] "
	                "[--bf16-from N] [--cpu-time] [--dots] [--verbose]\n");
}

int main(int argc, char **argv)
{
	if (!moek_isa_supported(MOEK_ISA_AVX2)) {
		fprintf(stderr,
		        "bench_kernels: needs AVX2+FMA for its bandwidth and peak probes\n");
		return 1;
	}
	bool json = false, quick = false, dots = false;
	const char *formats = NULL, *shape_list = NULL, *thread_list = "1,2";
	const char *token_list = NULL; /* NULL: every token count */
	const char *isa_name = NULL;   /* NULL: the library's choice */
	long bf16_from = 0;            /* --bf16-from: the bf16 tiles' first token count */
	double min_time = 0.5;
	size_t set_mb = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const bool has_val = i + 1 < argc;
		if (!strcmp(a, "--json"))
			json = true;
		else if (!strcmp(a, "--quick"))
			quick = true;
		else if (!strcmp(a, "--verbose"))
			verbose = true;
		else if (!strcmp(a, "--cpu-time"))
			cpu_time = true;
		else if (!strcmp(a, "--dots"))
			dots = true;
		else if (!strcmp(a, "--formats") && has_val)
			formats = argv[++i];
		else if (!strcmp(a, "--shapes") && has_val)
			shape_list = argv[++i];
		else if (!strcmp(a, "--threads") && has_val)
			thread_list = argv[++i];
		else if (!strcmp(a, "--tokens") && has_val)
			token_list = argv[++i];
		else if (!strcmp(a, "--isa") && has_val)
			isa_name = argv[++i];
		else if (!strcmp(a, "--bf16-from") && has_val)
			bf16_from = atol(argv[++i]);
		else if (!strcmp(a, "--min-time") && has_val)
			min_time = atof(argv[++i]);
		else if (!strcmp(a, "--set-mb") && has_val)
			set_mb = (size_t)atol(argv[++i]);
		else if (!strcmp(a, "--group-prefetch") && has_val) {
			unsigned near, gap;
			if (sscanf(argv[++i], "%u,%u", &near, &gap) != 2) {
				usage();
				return 2;
			}
			moek_avx2_set_group_prefetch(near, gap);
		} else {
			usage();
			return 2;
		}
	}
	if (quick) {
		if (!formats)
			formats = "Q4_Kx8,Q8_0x8,MXFP4x8,BF16x8,BF16";
		if (!shape_list)
			shape_list = "qwen3,deepseek";
		min_time = 0.2;
	}
	if (isa_name && set_isa(isa_name))
		return 2;
	(void)moek_isa_active(); /* the ISA choice, which takes the prefetch default if unset */
	if (bf16_from > 0) {     /* the tables are built by now (the choice above) */
		force_tile_bf16_from(&moek_avx512_ops, (unsigned)bf16_from);
		force_tile_bf16_from(&moek_amx_ops, (unsigned)bf16_from);
	}
	unsigned pf_near, pf_gap;
	moek_avx2_group_prefetch(&pf_near, &pf_gap);
	const size_t llc = llc_bytes();
	const size_t set_bytes =
	    set_mb ? set_mb << 20 : (8 * llc > (256u << 20) ? 8 * llc : 256u << 20);

	float *probe = big_alloc(set_bytes);
	if (!probe) {
		fprintf(stderr, "bench_kernels: cannot allocate %zu MiB for the bandwidth probe\n",
		        set_bytes >> 20);
		return 1;
	}
	for (size_t i = 0; i < set_bytes / 4; i++)
		probe[i] = (float)(i & 1023);
	double dram[MAX_THREADS + 1] = {0}, peak[MAX_THREADS + 1] = {0};
	double peaks[MAX_THREADS + 1][PEAK_KINDS] = {{0}};
	bool want_threads[MAX_THREADS + 1] = {false};
	if (dots) {
		struct pool p;
		pool_init(&p, 1);
		const double dram_1t = dram_read_gbps(&p, probe, set_bytes, 3);
		pool_destroy(&p);
		if (!json)
			printf("isa %s; DRAM read %.1f GB/s (1 thread)\n", moek_isa_name(),
			       dram_1t);
		const int rc = dots_table(
		    formats ? formats : "Q4_K,Q4_Kx8,Q8_0,Q8_0x8,MXFP4,MXFP4x8,BF16,BF16x8",
		    shape_list ? shape_list : "qwen3,mixtral,deepseek,gpt-oss", dram_1t, json);
		free(probe);
		return rc ? 1 : 0;
	}
	for (unsigned t = 1; t <= MAX_THREADS; t++) {
		char name[8];
		snprintf(name, sizeof(name), "%u", t);
		want_threads[t] = in_list(thread_list, name);
		struct pool p;
		pool_init(&p, t);
		dram[t] = dram_read_gbps(&p, probe, set_bytes, 3);
		all_peaks(&p, peaks[t]);
		peak[t] = peaks[t][PEAK_FMA];
		pool_destroy(&p);
	}
	if (!json) {
		printf("isa %s, LLC %zu MiB, expert set >= %zu MiB, group-dot prefetch %u,%u\n",
		       moek_isa_name(), llc >> 20, set_bytes >> 20, pf_near, pf_gap);
		printf("DRAM read: %.1f GB/s (1 thread), %.1f GB/s (2 threads); FMA peak: %.1f / "
		       "%.1f GFLOP/s\n",
		       dram[1], dram[2], peak[1], peak[2]);
		printf("peaks, 1 / 2 threads (GFLOP/s; integer: G ops/s):");
		for (int k = 0; k < PEAK_KINDS; k++)
			if (!isnan(peaks[1][k]))
				printf(" %s %.1f / %.1f", peak_names[k], peaks[1][k], peaks[2][k]);
		printf("\n");
		for (size_t fi = 0; fi < sizeof(all_formats) / sizeof(all_formats[0]); fi++) {
			char path[200];
			if (!interleaved(all_formats[fi]) &&
			    in_list(formats, format_name(all_formats[fi])))
				printf("path %s\n",
				       moek_isa_format_path(all_formats[fi], path, sizeof(path)));
		}
		printf("%-14s %-14s %6s %3s %9s %6s %9s %6s %-8s %10s %6s %5s %s\n", "format",
		       "shape", "tokens", "thr", "weight GB/s", "bw", "GFLOP/s", "peak", "of",
		       "tokens/s", "cores", "redo", "path");
	} else {
		printf("{\"isa\": \"%s\", \"group_prefetch\": [%u, %u], \"dram_read_gbps\": %.2f, "
		       "\"dram_read_gbps_1t\": %.2f, \"fma_peak_gflops_1t\": %.1f, "
		       "\"fma_peak_gflops_2t\": %.1f",
		       moek_isa_name(), pf_near, pf_gap, dram[2], dram[1], peak[1], peak[2]);
		for (unsigned t = 1; t <= MAX_THREADS; t++) {
			printf(", \"peaks_%ut\": {", t);
			for (int k = 0; k < PEAK_KINDS; k++) {
				printf("%s\"%s\": ", k ? ", " : "", peak_names[k]);
				if (isnan(peaks[t][k]))
					printf("null");
				else
					printf("%.1f", peaks[t][k]);
			}
			printf("}");
		}
		printf(", \"paths\": {");
		bool first_path = true;
		for (size_t fi = 0; fi < sizeof(all_formats) / sizeof(all_formats[0]); fi++) {
			char path[200];
			if (interleaved(all_formats[fi]) ||
			    !in_list(formats, format_name(all_formats[fi])))
				continue;
			printf("%s\"%s\": \"%s\"", first_path ? "" : ", ",
			       format_name(all_formats[fi]),
			       moek_isa_format_path(all_formats[fi], path, sizeof(path)));
			first_path = false;
		}
		printf("}, \"rows\": [");
	}
	/* token counts: --tokens' (any), else 1, 4, 8 (decode rows) and 128, 512 (prefill) */
	size_t counts[32] = {1, 4, 8, 128, 512}, n_counts = 5;
	if (token_list) {
		n_counts = 0;
		for (const char *at = token_list; *at && n_counts < 32;) {
			char *end;
			const unsigned long v = strtoul(at, &end, 10);
			if (end == at || v == 0 || v > MOEK_MAX_TOKENS) {
				usage();
				return 2;
			}
			counts[n_counts++] = v;
			at = *end == ',' ? end + 1 : end;
			if (*end && *end != ',') {
				usage();
				return 2;
			}
		}
	}
	bool first_row = true;
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const struct shape *s = &shapes[si];
		if (!in_list(shape_list, s->name))
			continue;
		for (size_t fi = 0; fi < sizeof(all_formats) / sizeof(all_formats[0]); fi++) {
			const uint32_t tag = all_formats[fi], fmt = weight_format(tag);
			const char *fname = format_name(tag);
			if (!in_list(formats, fname))
				continue;
			if (moek_row_bytes(fmt, s->hidden) == 0 || moek_row_bytes(fmt, s->ffn) == 0)
				continue; /* e.g. K-quants on gpt-oss's 2880 */
			struct bench_expert one;
			if (make_expert(tag, s, &one, 1)) {
				fprintf(stderr, "bench_kernels: cannot build %s %s\n", fname,
				        s->name);
				return 1;
			}
			size_t n_experts = (set_bytes + one.bytes - 1) / one.bytes;
			n_experts = n_experts < 2 ? 2 : n_experts;
			struct bench_expert *ex = calloc(n_experts, sizeof(*ex));
			if (!ex)
				return 1;
			ex[0] = one;
			for (size_t i = 1; i < n_experts; i++)
				if (clone_expert(&one, &ex[i])) {
					fprintf(stderr, "bench_kernels: out of memory\n");
					return 1;
				}
			for (unsigned t = 1; t <= MAX_THREADS; t++) {
				if (!want_threads[t])
					continue;
				struct pool p;
				pool_init(&p, t);
				/* re-calibrate next to the rows that use it: a shared machine's
				 * load drifts over a run of minutes (decode rows probe DRAM
				 * inside their own measurement) */
				double peaks_now[PEAK_KINDS];
				all_peaks(&p, peaks_now);
				const double peak_now = peaks_now[PEAK_FMA];
				{
					const size_t *toks = counts;
					for (size_t k = 0; k < n_counts; k++) {
						const int phase = toks[k] >= PREFILL_ROW_TOKENS;
						if (quick && phase && toks[k] != 512)
							continue;
						if (quick && !phase && toks[k] == 4)
							continue;
						struct row r = {tag, s->name, toks[k], t, 0,
						                0,   0,       0,       0};
						/* prefill is compute-bound: cycling a couple of
						 * experts is enough and keeps the memory small */
						const size_t ne = phase ? 2 : n_experts;
						const struct probe_ctx pc = {probe, set_bytes,
						                             peak[1]};
						if (measure(&p, ex, ne, s, toks[k], min_time,
						            phase ? NULL : &pc, &r)) {
							fprintf(stderr,
							        "bench_kernels: %s %s failed\n",
							        fname, s->name);
							return 1;
						}
						if (phase) {
							r.dram_gbps = dram[t];
							r.bw_fraction = r.weight_gbps / dram[t];
						}
						r.peak_kind = row_peak_kind(&r, peaks_now);
						r.peak = peaks_now[r.peak_kind];
						r.peak_fraction = r.gflops / r.peak;
						print_row(&r, json, first_row, peak_now);
						first_row = false;
					}
				}
				pool_destroy(&p);
			}
			for (size_t i = 0; i < n_experts; i++)
				free(ex[i].data);
			free(one.scales[0]), free(one.scales[1]), free(one.scales[2]);
			free(ex);
		}
	}
	if (json)
		printf("\n]}\n");
	free(probe);
	return 0;
}
