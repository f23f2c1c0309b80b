/* clock.h — the one monotonic clock of the daemon, its tools and benchmarks. Header-only, so
 * every library below sidecar/ can use it without a link dependency. */
#ifndef MOE_CLOCK_H
#define MOE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds (never goes back; unrelated to the wall clock). */
static inline uint64_t monotonic_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t monotonic_us(void)
{
	return monotonic_ns() / 1000u;
}

static inline double monotonic_s(void)
{
	return (double)monotonic_ns() / 1e9;
}

#endif /* MOE_CLOCK_H */
