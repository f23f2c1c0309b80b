/* option_values.c — see option_values.h. */
#include "option_values.h"

#include <errno.h>
#include <stdlib.h>

int option_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-')
		return -1;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/* The power of two a size suffix stands for (K 10, M 20, G 30, T 40); 0 for none. */
static unsigned suffix_shift(char c)
{
	switch (c) {
	case 'K':
	case 'k': return 10;
	case 'M':
	case 'm': return 20;
	case 'G':
	case 'g': return 30;
	case 'T':
	case 't': return 40;
	default: return 0;
	}
}

int option_bytes(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-')
		return -1;
	unsigned long long v = strtoull(s, &end, 10);
	const unsigned shift = suffix_shift(*end);
	if (shift)
		end++;
	if (errno || *end || v == 0 || v > (UINT64_MAX >> shift))
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
}
