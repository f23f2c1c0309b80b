/* model_error.c — see model_error.h. */
#include "model_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int model_fail(struct model_error *err, const char *fmt, ...)
{
	if (!err)
		return -1;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	return -1;
}

int model_fail_prefix(struct model_error *err, const char *prefix)
{
	if (!err)
		return -1;
	/* shift the message right and put "prefix: " in front, truncating at the end */
	const size_t cap = sizeof(err->msg) - 1;
	size_t plen = strlen(prefix), mlen = strnlen(err->msg, cap);
	if (plen + 2 > cap)
		plen = cap - 2;
	size_t keep = mlen + plen + 2 > cap ? cap - plen - 2 : mlen;
	memmove(err->msg + plen + 2, err->msg, keep);
	memcpy(err->msg, prefix, plen);
	err->msg[plen] = ':';
	err->msg[plen + 1] = ' ';
	err->msg[plen + 2 + keep] = '\0';
	return -1;
}
