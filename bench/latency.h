/* latency.h — the percentiles every benchmark and client example reports with, and the clock
 * they take them with (the project's one, util/clock.h).
 *
 * Header-only, no allocation: percentile_u64 sorts the caller's samples in place. Nearest
 * rank: index round(p * (n - 1)).
 */
#ifndef MOE_BENCH_LATENCY_H
#define MOE_BENCH_LATENCY_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "clock.h"

static inline int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Sorts v[0..n) and returns its p-quantile (0 ≤ p ≤ 1); 0 for no samples. */
static inline uint64_t percentile_u64(uint64_t *v, size_t n, double p)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), cmp_u64);
	return v[(size_t)(p * (double)(n - 1) + 0.5)];
}

#endif
