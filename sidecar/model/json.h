/* json.h — a small strict JSON reader for model headers (safetensors, config.json, index).
 *
 * Why our own (docs/formats.md): safetensors offsets are u64 and must be read exactly (the
 * Debian libraries store integers as int64 or double), the input is hostile (a model file
 * from the internet), and only reading is needed. The parser is RFC 8259 strict: UTF-8 is
 * validated, escapes are decoded (surrogate pairs joined, lone surrogates rejected), nesting
 * is limited to JSON_MAX_DEPTH, and the document's memory is proportional to the input
 * (at most ~24 bytes of nodes plus 1 byte of text per input byte, never sized from a value
 * inside the input). Duplicate object keys are kept; json_object_get returns the first.
 *
 * A parsed document is immutable and owns all of its memory; values are referred to by
 * index (json_ref). Not thread-safe to parse into; safe to read from many threads.
 */
#ifndef MOE_JSON_H
#define MOE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define JSON_MAX_DEPTH 64
#define JSON_MAX_INPUT ((size_t)256 << 20) /* refs are 32-bit; headers are far smaller */
#define JSON_NONE UINT32_MAX

enum json_type {
	JSON_NULL,
	JSON_FALSE,
	JSON_TRUE,
	JSON_NUMBER,
	JSON_STRING,
	JSON_ARRAY,
	JSON_OBJECT
};

typedef uint32_t json_ref;
struct json_doc;

/* Parses text[0..len) (need not be NUL-terminated). On success *out owns a document to be
 * freed with json_free; the root is json_root(*out). On failure returns -1 with
 * "invalid JSON at byte N: …" in err. */
int json_parse(const char *text, size_t len, struct json_doc **out, struct sidecar_error *err);
void json_free(struct json_doc *doc);

json_ref json_root(const struct json_doc *doc);
enum json_type json_type_of(const struct json_doc *doc, json_ref v);

/* Containers: number of elements/members; first child and next sibling (JSON_NONE at the
 * end). For an object's members, json_key gives the member's key. */
uint32_t json_count(const struct json_doc *doc, json_ref v);
json_ref json_first(const struct json_doc *doc, json_ref container);
json_ref json_next(const struct json_doc *doc, json_ref v);
const char *json_key(const struct json_doc *doc, json_ref member, size_t *len);

/* Member `key` of object obj, or JSON_NONE (also when obj is not an object). Linear. */
json_ref json_object_get(const struct json_doc *doc, json_ref obj, const char *key);

/* Decoded string (NUL-terminated; may contain NUL if the JSON had \u0000 — check len), or
 * NULL if v is not a string. */
const char *json_string(const struct json_doc *doc, json_ref v, size_t *len);

/* Number conversions. json_u64 accepts only a plain non-negative integer that fits exactly
 * (no sign, fraction or exponent); json_double any number. Return 0, or -1 if v is not such
 * a number. json_bool: -1 if v is not true/false. */
int json_u64(const struct json_doc *doc, json_ref v, uint64_t *out);
int json_double(const struct json_doc *doc, json_ref v, double *out);
int json_bool(const struct json_doc *doc, json_ref v, bool *out);

/* Convenience for config.json: member key of obj as u64 / double / bool. Return 1 if found
 * and converted, 0 if absent or null, -1 if present with the wrong type. */
int json_get_u64(const struct json_doc *doc, json_ref obj, const char *key, uint64_t *out);
int json_get_double(const struct json_doc *doc, json_ref obj, const char *key, double *out);
int json_get_bool(const struct json_doc *doc, json_ref obj, const char *key, bool *out);

#endif
