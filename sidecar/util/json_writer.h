/* json_writer.h — the daemon's one JSON writer: STATS, `--json` outputs, JSON log lines.
 *
 * Writes into a caller-provided buffer or a FILE*, tracking nesting so that commas and colons
 * are placed for the caller. Strings are escaped (quote, backslash, every control character
 * as \u00XX; other bytes, UTF-8 included, pass through). Non-finite doubles are written as
 * null.
 *
 * Owns: nothing; no allocation, so it can run on the STATS path. Threading: one writer per
 * thread. Errors: the first error sticks (jw_finish reports it) while later calls go on
 * counting the length. In buffer mode the buffer always holds a NUL-terminated
 * prefix of the output (when cap > 0), and jw_length gives the bytes the whole output needs,
 * like snprintf, so a caller can report or retry with the size.
 */
#ifndef MOE_JSON_WRITER_H
#define MOE_JSON_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Containers nest at most this deep. */
#define JW_MAX_DEPTH 32u

struct json_writer {
	char *buf; /* buffer mode: the output, cap bytes */
	size_t cap;
	FILE *file;     /* file mode */
	size_t length;  /* bytes of output so far (may exceed cap) */
	int error;      /* 0, or the first error (negative errno) */
	uint32_t depth; /* open containers */
	/* per open container: bit set when it already holds an element */
	uint32_t has_element;
	uint32_t is_object; /* per open container: an object (else an array) */
	bool after_key;     /* a key was written, its value is next */
	bool spaced;        /* ", " and ": " (jw_set_spaced) */
};

/* Output into buf (cap bytes, NUL-terminated when cap > 0). buf may be NULL when cap is 0, to
 * compute the length only. */
void jw_init_buffer(struct json_writer *w, char *buf, size_t cap);
/* Output to f (not flushed). */
void jw_init_file(struct json_writer *w, FILE *f);

/* A space after every comma and colon from now on: for outputs documented in that shape. */
void jw_set_spaced(struct json_writer *w, bool spaced);

void jw_object_begin(struct json_writer *w);
void jw_object_end(struct json_writer *w);
void jw_array_begin(struct json_writer *w);
void jw_array_end(struct json_writer *w);

/* An object member's key; its value is the next value written (or container begun). */
void jw_key(struct json_writer *w, const char *key);

void jw_string(struct json_writer *w, const char *s);
void jw_string_n(struct json_writer *w, const char *s, size_t n);
void jw_u64(struct json_writer *w, uint64_t v);
void jw_i64(struct json_writer *w, int64_t v);
/* jw_double's `decimals`, besides a count of digits after the point ("%.*f"): */
#define JW_ROUNDTRIP (-1) /* 17 significant digits ("%.17g"): reads back to the same double */
#define JW_SHORT (-2)     /* 6 significant digits ("%g"), for figures read by people */

/* v with `decimals` digits after the point, or as JW_ROUNDTRIP / JW_SHORT say. NaN and
 * infinities: null. */
void jw_double(struct json_writer *w, double v, int decimals);
void jw_bool(struct json_writer *w, bool v);
void jw_null(struct json_writer *w);

/* key + value in one call. */
void jw_kv_string(struct json_writer *w, const char *key, const char *s);
void jw_kv_u64(struct json_writer *w, const char *key, uint64_t v);
void jw_kv_i64(struct json_writer *w, const char *key, int64_t v);
void jw_kv_double(struct json_writer *w, const char *key, double v, int decimals);
void jw_kv_bool(struct json_writer *w, const char *key, bool v);

/* Bytes the whole output needs, without the NUL (what snprintf returns). */
size_t jw_length(const struct json_writer *w);

/* 0 when the output is complete and well nested; -ENOBUFS when the buffer was too small (the
 * buffer then holds a NUL-terminated prefix; jw_length gives the size needed); -EINVAL for a
 * misuse (a value where a key is due, unbalanced or too deep nesting); the write's -errno in
 * file mode. */
int jw_finish(const struct json_writer *w);

/* File mode: jw_finish, then the newline that ends a document printed as one line; 0, its
 * error, or the newline's -errno (-EIO when the stream set none). */
int jw_finish_line(struct json_writer *w);

#endif /* MOE_JSON_WRITER_H */
