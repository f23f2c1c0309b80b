/* dot_test_util.h — what the dot-product form tests share: a deterministic generator (seeded
 * by DOT_TEST_SEED, defined before including) and the AVX2 check. Header-only, x86-64 only. */
#ifndef MOE_TEST_DOT_TEST_UTIL_H
#define MOE_TEST_DOT_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels_internal.h"

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

/* Every form the CPU has on (false, nothing changed, where it has no VNNI form), or none. */
static inline bool set_vnni_forms(bool on)
{
	if (!on)
		return moek_set_isa_forms(0);
	const unsigned all = moek_isa_forms_available();
	return (all & MOEK_FORM_VNNI) && moek_set_isa_forms(all);
}

#endif
