/* cores.h — how many cores' worth of compute two threads get right now.
 *
 * This VM sometimes runs its two vCPUs as one core for minutes at a time: two threads of
 * independent FMAs then get one thread's throughput, while memory-bound work barely changes.
 * A two-thread measurement taken then is not a two-thread measurement; benchmarks bracket
 * what they time with bench_cores_now() and redo what ran on fewer than BENCH_TWO_CORES.
 *
 * Header-only; pthreads and AVX2+FMA (the benchmarks' machines have both).
 */
#ifndef MOE_BENCH_CORES_H
#define MOE_BENCH_CORES_H

#include <immintrin.h>
#include <pthread.h>

#include "clock.h"

#define BENCH_TWO_CORES 1.6

/* iters x 10 independent 8-lane FMA chains (covers latency x throughput on current x86), kept
 * in named registers; the result is returned so nothing is optimised away. */
__attribute__((target("avx2,fma"))) static inline float bench_fma_chains(long iters)
{
	__m256 a0 = _mm256_set1_ps(1), a1 = _mm256_set1_ps(2), a2 = _mm256_set1_ps(3),
	       a3 = _mm256_set1_ps(4), a4 = _mm256_set1_ps(5), a5 = _mm256_set1_ps(6),
	       a6 = _mm256_set1_ps(7), a7 = _mm256_set1_ps(8), a8 = _mm256_set1_ps(9),
	       a9 = _mm256_set1_ps(10);
	const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
	for (long it = 0; it < iters; it++) {
		a0 = _mm256_fmadd_ps(a0, m, c), a1 = _mm256_fmadd_ps(a1, m, c);
		a2 = _mm256_fmadd_ps(a2, m, c), a3 = _mm256_fmadd_ps(a3, m, c);
		a4 = _mm256_fmadd_ps(a4, m, c), a5 = _mm256_fmadd_ps(a5, m, c);
		a6 = _mm256_fmadd_ps(a6, m, c), a7 = _mm256_fmadd_ps(a7, m, c);
		a8 = _mm256_fmadd_ps(a8, m, c), a9 = _mm256_fmadd_ps(a9, m, c);
	}
	__m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
	                         _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
	s = _mm256_add_ps(s, _mm256_add_ps(a8, a9));
	float t[8];
	_mm256_storeu_ps(t, s);
	return t[0];
}

enum { BENCH_CORES_ITERS = 2000000 }; /* ≈ 3 ms per thread at 3.7 GHz */

static inline void *bench_cores_thread(void *sink)
{
	*(volatile float *)sink = bench_fma_chains(BENCH_CORES_ITERS);
	return NULL;
}

/* One thread's FMA run against two threads' over the wall time of both (two threads taking
 * turns on one core count as one): 2 on two free cores, 1 on one. About 10 ms. */
static inline double bench_cores_now(void)
{
	float sink[3];
	double t0 = monotonic_s();
	bench_cores_thread(&sink[0]);
	const double one = monotonic_s() - t0;
	pthread_t th[2];
	t0 = monotonic_s();
	int started = 0;
	for (int i = 0; i < 2; i++)
		started += pthread_create(&th[i], NULL, bench_cores_thread, &sink[1 + i]) == 0;
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	const double two = monotonic_s() - t0;
	return started == 2 && two > 0 ? 2.0 * one / two : 1.0;
}

#endif
