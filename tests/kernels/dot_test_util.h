/* dot_test_util.h — what the dot-product form tests share: a deterministic generator (seeded
 * by DOT_TEST_SEED, defined before including) and the AVX2 check. Header-only, x86-64 only. */
#ifndef MOE_TEST_DOT_TEST_UTIL_H
#define MOE_TEST_DOT_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "moe_kernels.h"

static uint32_t rng_state = DOT_TEST_SEED;

static inline uint32_t rng(void)
{
	rng_state = rng_state * 1664525u + 1013904223u;
	return rng_state >> 8;
}

static inline float uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)(rng() & 0xffffff) * 0x1p-24f;
}

static inline bool have_avx2(void)
{
	return moek_isa_supported(MOEK_ISA_AVX2);
}

#endif
