/* error.c — see error.h. */
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int error_set(struct sidecar_error *err, int status, const char *fmt, ...)
{
	if (!err)
		return -1;
	err->status = status;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	return -1;
}

int error_status_from_errno(int e)
{
	switch (e) {
	case ENOMEM: return MOE_ENOMEM;
	case EIO: return MOE_EIO;
	default: return MOE_ESYS;
	}
}

int error_set_errno(struct sidecar_error *err, const char *fmt, ...)
{
	const int saved = errno;
	if (!err)
		return -1;
	err->status = error_status_from_errno(saved);
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	size_t used = n < 0 ? 0 : (size_t)n;
	if (used < sizeof(err->msg))
		snprintf(err->msg + used, sizeof(err->msg) - used, ": %s", strerror(saved));
	errno = saved;
	return -1;
}

int error_pass(struct sidecar_error *to, const struct sidecar_error *from)
{
	if (to && from && to != from)
		*to = *from;
	return -1;
}

int error_copy_msg(char *buf, size_t len, const struct sidecar_error *err)
{
	if (buf && len)
		snprintf(buf, len, "%s", err ? err->msg : "");
	return -1;
}

int error_prefix(struct sidecar_error *err, const char *prefix)
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
