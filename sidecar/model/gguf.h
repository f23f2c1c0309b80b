/* gguf.h — GGUF v3 reader: header, metadata, tensor infos, split files.
 *
 * Parses only the header (metadata and tensor infos) with pread into a bounded buffer; a
 * 100 GB model is never read or mapped whole. Every count and length read from the file is
 * checked against the bytes that remain before anything is allocated from it, so memory is
 * bounded by the file's header size. Validated on open: magic, version (2 or 3), counts,
 * names (unique, <64 bytes), dims (<=4, ne[0] a multiple of the type's block), known ggml
 * types, general.alignment (power of two), offsets aligned, in bounds, non-overlapping.
 *
 * A `struct gguf_file` is immutable after gguf_open and may be read from any thread.
 */
#ifndef MOE_GGUF_H
#define MOE_GGUF_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"

enum gguf_value_type {
	GGUF_UINT8 = 0,
	GGUF_INT8 = 1,
	GGUF_UINT16 = 2,
	GGUF_INT16 = 3,
	GGUF_UINT32 = 4,
	GGUF_INT32 = 5,
	GGUF_FLOAT32 = 6,
	GGUF_BOOL = 7,
	GGUF_STRING = 8,
	GGUF_ARRAY = 9,
	GGUF_UINT64 = 10,
	GGUF_INT64 = 11,
	GGUF_FLOAT64 = 12,
};

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64   /* bytes including the terminating NUL, as ggml's GGML_MAX_NAME */
#define GGUF_MAX_NESTING 8 /* arrays of arrays deeper than this are rejected */

/* One metadata value. Integers and bools are widened: unsigned types and BOOL in .u,
 * signed in .i, FLOAT32/FLOAT64 in .f. Arrays of scalars keep the elements packed as in the
 * file (little-endian, elem size of elem_type) in .arr.raw; arrays of strings or arrays hold
 * `struct gguf_value` elements in .arr.values. */
struct gguf_value {
	uint32_t type;
	union {
		uint64_t u;
		int64_t i;
		double f;
		struct {
			char *ptr; /* NUL-terminated; may hold NUL bytes, see len */
			uint64_t len;
		} str;
		struct {
			uint32_t elem_type;
			uint64_t count;
			void *raw;
			struct gguf_value *values;
		} arr;
	};
};

struct gguf_kv {
	char *key;
	struct gguf_value value;
};

struct gguf_tensor {
	char name[GGUF_MAX_NAME];
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] = contiguous row length; unused dims are 1 */
	uint64_t nb[GGUF_MAX_DIMS]; /* byte strides: nb[1] = row bytes, nb[2] = nb[1]*ne[1] … */
	uint32_t type;              /* ggml type id */
	uint64_t rel_offset;        /* as stored: relative to the data section */
	uint64_t offset;            /* absolute byte offset in the file */
	uint64_t nbytes;
};

struct gguf_file {
	char *path;
	uint64_t file_size;
	uint32_t version;
	uint32_t alignment;
	uint64_t data_offset; /* start of the data section */
	uint64_t n_kv;
	struct gguf_kv *kv;
	uint64_t n_tensors;
	struct gguf_tensor *tensors;  /* file order */
	struct gguf_tensor **by_name; /* sorted by name, for gguf_find_tensor */
};

/* Opens and validates one GGUF file. Errors name the path and the problem. */
int gguf_open(const char *path, struct gguf_file **out, struct sidecar_error *err);
void gguf_close(struct gguf_file *f);

/* Opens a model that may be split (`split.count` > 1): `path` must be the first split,
 * named PREFIX-00001-of-0000N.gguf; the others are found by name and each must carry the
 * matching `split.no`/`split.count`. On success *out holds *n_out files (1 if not split). */
int gguf_open_splits(const char *path, struct gguf_file ***out, uint32_t *n_out,
                     struct sidecar_error *err);
void gguf_close_splits(struct gguf_file **files, uint32_t n);

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* Typed getters: 1 if found and converted, 0 if absent, -1 if present with an incompatible
 * type (or a negative value for get_u64). get_u64 accepts any integer type, get_f64 any
 * numeric type, get_bool BOOL or an integer. */
int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out);
int gguf_get_f64(const struct gguf_file *f, const char *key, double *out);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
const char *gguf_get_str(const struct gguf_file *f, const char *key);

/* Element i of an array of numbers, widened as the scalar getters do; -1 if out of range
 * or not numeric. */
int gguf_array_f64(const struct gguf_value *arr, uint64_t i, double *out);

/* ggml type table (all ggml types, not only those the kernels compute with): name, elements
 * per block and bytes per block; 0/NULL for ids ggml does not define. */
const char *gguf_type_name(uint32_t ggml_type);
uint32_t gguf_type_block_elems(uint32_t ggml_type);
uint32_t gguf_type_block_bytes(uint32_t ggml_type);
const char *gguf_value_type_name(uint32_t type);

#endif
