/* safetensors.h — safetensors reader: one file, or a sharded checkpoint through
 * model.safetensors.index.json.
 *
 * A file is u64 LE header length N, N bytes of JSON (name → {dtype, shape, data_offsets}, an
 * optional __metadata__), then the data buffer. Only the header is read (pread into a buffer
 * of N bytes, N bounded by the file size and 100 MB). Validated on open: header length,
 * JSON, dtypes, shapes (product × dtype size = byte length, no overflow), unique names, and
 * that the tensors tile the data buffer exactly (no gap, no overlap, nothing past EOF).
 *
 * Opened files and models are immutable and may be read from any thread.
 */
#ifndef MOE_SAFETENSORS_H
#define MOE_SAFETENSORS_H

#include <stdint.h>

#include "error.h"

#define ST_MAX_HEADER 100000000u /* as the reference implementation */
#define ST_MAX_DIMS 8

enum st_dtype {
	ST_BOOL,
	ST_U8,
	ST_I8,
	ST_F8_E4M3,
	ST_F8_E5M2,
	ST_F8_E8M0,
	ST_I16,
	ST_U16,
	ST_F16,
	ST_BF16,
	ST_I32,
	ST_U32,
	ST_F32,
	ST_F64,
	ST_I64,
	ST_U64,
	ST_DTYPE_COUNT
};

const char *st_dtype_name(enum st_dtype d);
uint32_t st_dtype_size(enum st_dtype d);

struct st_tensor {
	char *name;
	enum st_dtype dtype;
	uint32_t n_dims;
	uint64_t shape[ST_MAX_DIMS]; /* row-major, outermost first */
	uint64_t offset;             /* absolute byte offset in the file */
	uint64_t nbytes;
};

struct st_file {
	char *path;
	uint64_t file_size;
	uint64_t data_offset; /* 8 + header length */
	uint64_t n_tensors;
	struct st_tensor *tensors;
};

int st_open(const char *path, struct st_file **out, struct sidecar_error *err);
void st_close(struct st_file *f);

/* A checkpoint: one file, or the shards named by an index. */
struct st_tensor_ref {
	const struct st_tensor *tensor;
	uint32_t file; /* index into st_model.files */
};

struct st_model {
	uint32_t n_files;
	struct st_file **files;
	uint64_t n_tensors;
	struct st_tensor_ref *by_name; /* all tensors of all shards, sorted by name */
};

/* path: a .safetensors file, a model.safetensors.index.json, or a directory holding either
 * model.safetensors.index.json, model.safetensors, or *.safetensors shards. With an index,
 * every shard it names must exist and every tensor must be in the shard the index says. */
int st_open_model(const char *path, struct st_model **out, struct sidecar_error *err);
void st_close_model(struct st_model *m);

const struct st_tensor_ref *st_find(const struct st_model *m, const char *name);

#endif
