/* option_values.h — the numbers the subcommands' options take, parsed one way everywhere.
 *
 * Errors: 0 or -1 (not such a number: empty, signed, trailing characters, out of range); the
 * caller names the option in its own message. Threading: none (errno is used and left set).
 */
#ifndef MOE_SIDECAR_OPTION_VALUES_H
#define MOE_SIDECAR_OPTION_VALUES_H

#include <stdint.h>

/* An unsigned decimal in [min, max] into *out. */
int option_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* BYTES: a positive decimal with an optional K/M/G/T suffix (powers of 1024, either case). */
int option_bytes(const char *s, uint64_t *out);

#endif
