/* splitmix.h — the daemon's one small pseudo-random generator (splitmix64): seeded sampling
 * and synthetic inputs where reproducibility matters and quality needs are modest (synthetic
 * routing traces, `verify`'s samples). Not for anything secret.
 *
 * Threading: the state is the caller's; nothing shared.
 */
#ifndef MOE_UTIL_SPLITMIX_H
#define MOE_UTIL_SPLITMIX_H

#include <stdint.h>

/* The next 64 random bits; advances *state. */
static inline uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [0, 1), 53 bits. */
static inline double splitmix64_unit(uint64_t *state)
{
	return (double)(splitmix64(state) >> 11) * 0x1p-53;
}

#endif
