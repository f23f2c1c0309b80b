/* error.h — the daemon's one error record: a status and one line saying what was wrong.
 *
 * Contract: a failing library call returns -1 (or NULL) and fills `struct sidecar_error` with
 * an `enum moe_status` (moe_abi.h) and a message naming the object and the fault
 * ("x.gguf: tensor blk.3.ffn_up_exps: offset beyond end of file"). Library code never prints
 * or exits; the caller logs the message, sends the status to a client or wraps the message with
 * error_prefix() and passes it up. Only `main` exits.
 *
 * Statuses: MOE_EINVAL for malformed input (files, arguments, configuration), MOE_ENOMEM for
 * failed allocations, MOE_EIO for failed reads of model data, MOE_ESYS for other system calls.
 *
 * Hot paths that answer with a bare negative errno (residency_acquire's -EINPROGRESS, …) carry
 * a status, not an error: their headers say so, and they take no `struct sidecar_error`.
 *
 * Every function accepts err == NULL (the caller wants the return value only) and returns -1.
 * Threading: none; a record belongs to the caller that passed it.
 */
#ifndef MOE_UTIL_ERROR_H
#define MOE_UTIL_ERROR_H

#include <stddef.h>

#include "moe_abi.h"

struct sidecar_error {
	int status;    /* enum moe_status; MOE_OK until a function fails */
	char msg[768]; /* one line, NUL-terminated, truncated to fit */
};

/* Sets the status and the message (printf-style); returns -1, so that
 * `return error_set(err, MOE_EIO, "…");` reads as what it does. */
int error_set(struct sidecar_error *err, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Like error_set for a failed system call: the status follows errno (ENOMEM → MOE_ENOMEM,
 * EIO → MOE_EIO, anything else → MOE_ESYS) and ": strerror(errno)" ends the message. errno
 * is read on entry and left as it was. */
int error_set_errno(struct sidecar_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The status for an errno value: ENOMEM → MOE_ENOMEM, EIO → MOE_EIO, anything else →
 * MOE_ESYS. For callers holding a -errno from a call that set no record. */
int error_status_from_errno(int e);

/* Passes a callee's record on: *to = *from (status and message; nothing if to is NULL).
 * Returns -1. */
int error_pass(struct sidecar_error *to, const struct sidecar_error *from);

/* Copies the message into buf (len bytes, truncated, NUL-terminated; nothing if buf is NULL or
 * len 0) and returns -1. For a message kept in a store of its own size (a FAILED expert's
 * reason). */
int error_copy_msg(char *buf, size_t len, const struct sidecar_error *err);

/* Puts "prefix: " in front of the message (e.g. a file name), truncating the end of the
 * message if the whole does not fit; the status is kept. Returns -1. */
int error_prefix(struct sidecar_error *err, const char *prefix);

#endif
