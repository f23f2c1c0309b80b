/* stats_field.h — a top-level number of the sidecar's STATS object, for the benchmarks and the
 * client examples that report it (one reader, so they agree on what a missing or null field
 * is).
 *
 * Header-only, no allocation. Reads the compact STATS document the sidecar writes (`"key":N`);
 * keys after "layers" are the per-layer objects' and are not looked at.
 */
#ifndef MOE_BENCH_STATS_FIELD_H
#define MOE_BENCH_STATS_FIELD_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number `"key":N` before "layers" in json, or NAN when it is absent or null. */
static inline double stats_field(const char *json, const char *key)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	const char *layers = strstr(json, "\"layers\":");
	const char *p = strstr(json, pat);
	if (!p || (layers && p > layers))
		return NAN;
	p += strlen(pat);
	if (!strncmp(p, "null", 4))
		return NAN;
	return strtod(p, NULL);
}

#endif
