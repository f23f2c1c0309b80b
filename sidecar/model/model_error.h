/* model_error.h — the error record every model-format function fills on failure.
 *
 * Library code never prints or exits: a failing call returns -1 and leaves one line in
 * `struct model_error` naming the file and what was wrong ("x.gguf: tensor blk.3.ffn_up_exps:
 * offset beyond end of file"). Callers decide whether to log it, show it or wrap it.
 */
#ifndef MOE_MODEL_ERROR_H
#define MOE_MODEL_ERROR_H

#include <stddef.h>

struct model_error {
	char msg[768];
};

/* Sets err->msg (printf-style) and returns -1, so that `return model_fail(err, …);` reads as
 * what it does. err may be NULL. */
int model_fail(struct model_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the existing message with "prefix: " (e.g. a file name); returns -1. */
int model_fail_prefix(struct model_error *err, const char *prefix);

#endif
