/* gguf.c — see gguf.h. The header is read through `struct header_reader`, a forward-only
 * pread window over the file that refuses to read past EOF, so every length in the file is
 * checked before it is used to size anything. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- ggml type table (layout facts of the file format) ----------------------------------
 * Names and sizes of every ggml type, so that any tensor's extent is checked, whatever it
 * holds. Which types experts may be in is not this table's: the kernels' format table says
 * (moek_format_from_ggml); test_catalog checks the two agree on the types both have. */

struct ggml_type_row {
	const char *name;
	uint16_t block_elems, block_bytes;
};

static const struct ggml_type_row ggml_types[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 36},      [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},  [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},  [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},   [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},    [40] = {"NVFP4", 64, 36},
};

static const struct ggml_type_row *ggml_type_row(uint32_t t)
{
	if (t >= sizeof(ggml_types) / sizeof(ggml_types[0]) || !ggml_types[t].name)
		return NULL;
	return &ggml_types[t];
}

const char *gguf_type_name(uint32_t t)
{
	const struct ggml_type_row *r = ggml_type_row(t);
	return r ? r->name : NULL;
}

uint32_t gguf_type_block_elems(uint32_t t)
{
	const struct ggml_type_row *r = ggml_type_row(t);
	return r ? r->block_elems : 0;
}

uint32_t gguf_type_block_bytes(uint32_t t)
{
	const struct ggml_type_row *r = ggml_type_row(t);
	return r ? r->block_bytes : 0;
}

const char *gguf_value_type_name(uint32_t type)
{
	static const char *names[] = {"u8",   "i8",  "u16",   "i16", "u32", "i32", "f32",
	                              "bool", "str", "array", "u64", "i64", "f64"};
	return type < sizeof(names) / sizeof(names[0]) ? names[type] : "invalid";
}

/* Bytes of one scalar element of a metadata type, 0 for STRING/ARRAY/invalid. */
static uint32_t scalar_size(uint32_t type)
{
	switch (type) {
	case GGUF_UINT8:
	case GGUF_INT8:
	case GGUF_BOOL: return 1;
	case GGUF_UINT16:
	case GGUF_INT16: return 2;
	case GGUF_UINT32:
	case GGUF_INT32:
	case GGUF_FLOAT32: return 4;
	case GGUF_UINT64:
	case GGUF_INT64:
	case GGUF_FLOAT64: return 8;
	default: return 0;
	}
}

/* ---- bounded header reader --------------------------------------------------------------- */

#define HEADER_WINDOW (1u << 20)

struct header_reader {
	int fd;
	const char *path;
	uint64_t file_size;
	uint64_t pos; /* next byte to consume */
	uint64_t win_start;
	size_t win_len;
	unsigned char *win;
	struct sidecar_error *err;
};

static uint64_t remaining(const struct header_reader *r)
{
	return r->file_size - r->pos;
}

static int read_exact(struct header_reader *r, void *dst, uint64_t n, const char *what)
{
	if (n > remaining(r))
		return error_set(r->err, MOE_EINVAL,
		                 "%s: truncated: %s needs %" PRIu64 " bytes at offset %" PRIu64
		                 ", file is %" PRIu64 " bytes",
		                 r->path, what, n, r->pos, r->file_size);
	unsigned char *d = dst;
	while (n > 0) {
		if (r->pos < r->win_start || r->pos >= r->win_start + r->win_len) {
			uint64_t want = remaining(r) < HEADER_WINDOW ? remaining(r) : HEADER_WINDOW;
			ssize_t got;
			do {
				got = pread(r->fd, r->win, (size_t)want, (off_t)r->pos);
			} while (got < 0 && errno == EINTR);
			if (got < 0)
				return error_set(r->err, MOE_EIO,
				                 "%s: read at offset %" PRIu64 ": %s", r->path,
				                 r->pos, strerror(errno));
			if (got == 0)
				return error_set(r->err, MOE_EIO, "%s: file shrank while reading",
				                 r->path);
			r->win_start = r->pos;
			r->win_len = (size_t)got;
		}
		size_t at = (size_t)(r->pos - r->win_start);
		size_t k = r->win_len - at < n ? r->win_len - at : (size_t)n;
		memcpy(d, r->win + at, k);
		d += k;
		n -= k;
		r->pos += k;
	}
	return 0;
}

static int read_u32(struct header_reader *r, uint32_t *v, const char *what)
{
	unsigned char b[4];
	if (read_exact(r, b, 4, what))
		return -1;
	*v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
	return 0;
}

static uint64_t le64(const unsigned char *b)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | b[i];
	return v;
}

static int read_u64(struct header_reader *r, uint64_t *v, const char *what)
{
	unsigned char b[8];
	if (read_exact(r, b, 8, what))
		return -1;
	*v = le64(b);
	return 0;
}

/* A GGUF string: u64 length then bytes. The copy is NUL-terminated. */
static int read_string(struct header_reader *r, char **out, uint64_t *len_out, const char *what)
{
	uint64_t len;
	if (read_u64(r, &len, what))
		return -1;
	if (len > remaining(r))
		return error_set(r->err, MOE_EINVAL,
		                 "%s: %s: string length %" PRIu64 " at offset %" PRIu64
		                 " runs past the end of the file",
		                 r->path, what, len, r->pos - 8);
	char *s = malloc(len + 1);
	if (!s)
		return error_set(r->err, MOE_ENOMEM, "%s: out of memory", r->path);
	if (read_exact(r, s, len, what)) {
		free(s);
		return -1;
	}
	s[len] = '\0';
	*out = s;
	if (len_out)
		*len_out = len;
	return 0;
}

/* ---- metadata values ------------------------------------------------------------------- */

static void value_free(struct gguf_value *v)
{
	if (v->type == GGUF_STRING) {
		free(v->str.ptr);
	} else if (v->type == GGUF_ARRAY) {
		if (v->arr.values)
			for (uint64_t i = 0; i < v->arr.count; i++)
				value_free(&v->arr.values[i]);
		free(v->arr.values);
		free(v->arr.raw);
	}
}

static void widen_scalar(struct gguf_value *v, const unsigned char *b)
{
	switch (v->type) {
	case GGUF_UINT8:
	case GGUF_BOOL: v->u = b[0]; break;
	case GGUF_INT8: v->i = (int8_t)b[0]; break;
	case GGUF_UINT16: v->u = (uint16_t)(b[0] | b[1] << 8); break;
	case GGUF_INT16: v->i = (int16_t)(uint16_t)(b[0] | b[1] << 8); break;
	case GGUF_UINT32:
		v->u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
		       (uint32_t)b[3] << 24;
		break;
	case GGUF_INT32:
		v->i = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
		                 (uint32_t)b[3] << 24);
		break;
	case GGUF_FLOAT32: {
		uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
		             (uint32_t)b[3] << 24;
		float f;
		memcpy(&f, &u, 4);
		v->f = f;
		break;
	}
	case GGUF_UINT64: v->u = le64(b); break;
	case GGUF_INT64: v->i = (int64_t)le64(b); break;
	case GGUF_FLOAT64: {
		uint64_t u = le64(b);
		memcpy(&v->f, &u, 8);
		break;
	}
	}
}

static int read_value(struct header_reader *r, uint32_t type, struct gguf_value *v, const char *key,
                      int depth)
{
	memset(v, 0, sizeof(*v));
	v->type = type;
	uint32_t sz = scalar_size(type);
	if (sz) {
		unsigned char b[8];
		if (read_exact(r, b, sz, key))
			return -1;
		if (type == GGUF_BOOL && b[0] > 1)
			return error_set(r->err, MOE_EINVAL,
			                 "%s: metadata %s: bool value %u is not 0 or 1", r->path,
			                 key, b[0]);
		widen_scalar(v, b);
		return 0;
	}
	if (type == GGUF_STRING)
		return read_string(r, &v->str.ptr, &v->str.len, key);
	if (type != GGUF_ARRAY)
		return error_set(r->err, MOE_EINVAL, "%s: metadata %s: invalid value type %u",
		                 r->path, key, type);
	if (depth >= GGUF_MAX_NESTING)
		return error_set(r->err, MOE_EINVAL,
		                 "%s: metadata %s: arrays nested deeper than %d", r->path, key,
		                 GGUF_MAX_NESTING);
	uint32_t et;
	uint64_t count;
	if (read_u32(r, &et, key) || read_u64(r, &count, key))
		return -1;
	v->arr.elem_type = et;
	uint32_t esz = scalar_size(et);
	/* smallest encoding of one element: scalar size, string 8, array 12 */
	uint64_t min_elem = esz ? esz : et == GGUF_STRING ? 8 : et == GGUF_ARRAY ? 12 : 0;
	if (!min_elem)
		return error_set(r->err, MOE_EINVAL,
		                 "%s: metadata %s: invalid array element type %u", r->path, key,
		                 et);
	if (count > remaining(r) / min_elem)
		return error_set(r->err, MOE_EINVAL,
		                 "%s: metadata %s: array count %" PRIu64
		                 " overflows the file (%" PRIu64
		                 " bytes remain: truncated or corrupt)",
		                 r->path, key, count, remaining(r));
	v->arr.count = count;
	if (esz) {
		v->arr.raw = malloc(count ? count * esz : 1);
		if (!v->arr.raw)
			return error_set(r->err, MOE_ENOMEM, "%s: out of memory", r->path);
		if (read_exact(r, v->arr.raw, count * esz, key))
			return -1;
		if (et == GGUF_BOOL)
			for (uint64_t i = 0; i < count; i++)
				if (((unsigned char *)v->arr.raw)[i] > 1)
					return error_set(r->err, MOE_EINVAL,
					                 "%s: metadata %s: bool element %" PRIu64
					                 " is not 0 or 1",
					                 r->path, key, i);
		return 0;
	}
	v->arr.values = calloc(count ? count : 1, sizeof(struct gguf_value));
	if (!v->arr.values)
		return error_set(r->err, MOE_ENOMEM, "%s: out of memory", r->path);
	for (uint64_t i = 0; i < count; i++) {
		if (read_value(r, et, &v->arr.values[i], key, depth + 1)) {
			v->arr.count = i + 1; /* free what was read, including the partial one */
			return -1;
		}
	}
	return 0;
}

/* ---- open ------------------------------------------------------------------------------ */

void gguf_close(struct gguf_file *f)
{
	if (!f)
		return;
	for (uint64_t i = 0; i < f->n_kv; i++) {
		free(f->kv[i].key);
		value_free(&f->kv[i].value);
	}
	free(f->kv);
	free(f->tensors);
	free(f->by_name);
	free(f->path);
	free(f);
}

static int cmp_tensor_name(const void *a, const void *b)
{
	const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
	const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
	return strcmp(x->name, y->name);
}

static int cmp_tensor_offset(const void *a, const void *b)
{
	const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
	const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int read_tensor_info(struct header_reader *r, struct gguf_tensor *t, uint64_t index)
{
	char what[64];
	snprintf(what, sizeof(what), "tensor info %" PRIu64, index);
	char *name;
	uint64_t name_len;
	if (read_string(r, &name, &name_len, what))
		return -1;
	if (name_len >= GGUF_MAX_NAME || strlen(name) != name_len) {
		error_set(r->err, MOE_EINVAL, "%s: %s: name of %" PRIu64 " bytes is %s", r->path,
		          what, name_len,
		          name_len >= GGUF_MAX_NAME ? "longer than 63 bytes" : "has a NUL byte");
		free(name);
		return -1;
	}
	memcpy(t->name, name, name_len + 1);
	free(name);
	if (read_u32(r, &t->n_dims, t->name))
		return -1;
	if (t->n_dims > GGUF_MAX_DIMS)
		return error_set(r->err, MOE_EINVAL, "%s: tensor %s: %u dimensions (at most 4)",
		                 r->path, t->name, t->n_dims);
	for (int d = 0; d < GGUF_MAX_DIMS; d++)
		t->ne[d] = 1;
	for (uint32_t d = 0; d < t->n_dims; d++) {
		if (read_u64(r, &t->ne[d], t->name))
			return -1;
		if (t->ne[d] > INT64_MAX)
			return error_set(r->err, MOE_EINVAL,
			                 "%s: tensor %s: dimension %u is negative", r->path,
			                 t->name, d);
	}
	if (read_u32(r, &t->type, t->name) || read_u64(r, &t->rel_offset, t->name))
		return -1;
	const struct ggml_type_row *row = ggml_type_row(t->type);
	if (!row)
		return error_set(r->err, MOE_EINVAL, "%s: tensor %s: unknown ggml type %u", r->path,
		                 t->name, t->type);
	if (t->ne[0] % row->block_elems)
		return error_set(r->err, MOE_EINVAL,
		                 "%s: tensor %s: row length %" PRIu64
		                 " is not a multiple of the %s block size %u",
		                 r->path, t->name, t->ne[0], row->name, row->block_elems);
	/* strides and size, refusing any product that overflows int64 */
	uint64_t nb = t->ne[0] / row->block_elems * row->block_bytes;
	if (t->ne[0] && nb / row->block_bytes != t->ne[0] / row->block_elems)
		goto overflow;
	t->nb[0] = row->block_bytes;
	t->nb[1] = nb;
	for (int d = 1; d < GGUF_MAX_DIMS; d++) {
		if (t->ne[d] && nb > (uint64_t)INT64_MAX / t->ne[d])
			goto overflow;
		nb *= t->ne[d];
		if (d + 1 < GGUF_MAX_DIMS)
			t->nb[d + 1] = nb;
	}
	t->nbytes = nb;
	return 0;
overflow:
	return error_set(r->err, MOE_EINVAL,
	                 "%s: tensor %s: size overflows (shape %" PRIu64 "x%" PRIu64 "x%" PRIu64
	                 "x%" PRIu64 ")",
	                 r->path, t->name, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
}

static int cmp_kv_key(const void *a, const void *b)
{
	return strcmp((*(const struct gguf_kv *const *)a)->key,
	              (*(const struct gguf_kv *const *)b)->key);
}

static int check_unique_keys(struct header_reader *r, const struct gguf_file *f)
{
	const struct gguf_kv **sorted = malloc((f->n_kv ? f->n_kv : 1) * sizeof(*sorted));
	if (!sorted)
		return error_set(r->err, MOE_ENOMEM, "%s: out of memory", r->path);
	for (uint64_t i = 0; i < f->n_kv; i++)
		sorted[i] = &f->kv[i];
	qsort(sorted, f->n_kv, sizeof(*sorted), cmp_kv_key);
	int rc = 0;
	for (uint64_t i = 1; i < f->n_kv && !rc; i++)
		if (!strcmp(sorted[i - 1]->key, sorted[i]->key))
			rc = error_set(r->err, MOE_EINVAL, "%s: duplicate metadata key %s", r->path,
			               sorted[i]->key);
	free(sorted);
	return rc;
}

static int gguf_parse(struct header_reader *r, struct gguf_file *f)
{
	unsigned char magic[4];
	if (read_exact(r, magic, 4, "magic"))
		return -1;
	if (memcmp(magic, "GGUF", 4))
		return error_set(r->err, MOE_EINVAL,
		                 "%s: not a GGUF file (wrong magic %02x %02x %02x %02x)", r->path,
		                 magic[0], magic[1], magic[2], magic[3]);
	if (read_u32(r, &f->version, "version"))
		return -1;
	if (f->version != 2 && f->version != 3)
		return error_set(r->err, MOE_EINVAL,
		                 "%s: unsupported GGUF version %u (2 and 3 are supported)", r->path,
		                 f->version);
	uint64_t n_tensors, n_kv;
	if (read_u64(r, &n_tensors, "tensor count") || read_u64(r, &n_kv, "metadata count"))
		return -1;
	/* smallest encodings: a KV is 8+4+1 bytes, a tensor info 8+4+4+8 */
	if (n_kv > remaining(r) / 13)
		return error_set(r->err, MOE_EINVAL,
		                 "%s: metadata count %" PRIu64 " overflows the file (%" PRIu64
		                 " bytes remain: truncated or corrupt)",
		                 r->path, n_kv, remaining(r));
	if (n_tensors > remaining(r) / 24)
		return error_set(r->err, MOE_EINVAL,
		                 "%s: tensor count %" PRIu64 " overflows the file (%" PRIu64
		                 " bytes remain: truncated or corrupt)",
		                 r->path, n_tensors, remaining(r));
	f->kv = calloc(n_kv ? n_kv : 1, sizeof(*f->kv));
	if (!f->kv)
		return error_set(r->err, MOE_ENOMEM, "%s: out of memory", r->path);
	for (uint64_t i = 0; i < n_kv; i++) {
		struct gguf_kv *kv = &f->kv[i];
		if (read_string(r, &kv->key, NULL, "metadata key"))
			return -1;
		f->n_kv = i + 1;
		uint32_t type;
		if (read_u32(r, &type, kv->key))
			return -1;
		kv->value.type = GGUF_UINT8; /* nothing to free if the read fails early */
		if (read_value(r, type, &kv->value, kv->key, 0))
			return -1;
	}
	if (check_unique_keys(r, f))
		return -1;
	f->alignment = GGUF_DEFAULT_ALIGNMENT;
	const struct gguf_kv *al = gguf_find_kv(f, "general.alignment");
	if (al) {
		if (al->value.type != GGUF_UINT32 || al->value.u == 0 ||
		    (al->value.u & (al->value.u - 1)))
			return error_set(r->err, MOE_EINVAL,
			                 "%s: general.alignment must be a u32 power of two (got %s "
			                 "%" PRIu64 ")",
			                 r->path, gguf_value_type_name(al->value.type),
			                 al->value.u);
		f->alignment = (uint32_t)al->value.u;
	}
	f->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(*f->tensors));
	f->by_name = calloc(n_tensors ? n_tensors : 1, sizeof(*f->by_name));
	if (!f->tensors || !f->by_name)
		return error_set(r->err, MOE_ENOMEM, "%s: out of memory", r->path);
	for (uint64_t i = 0; i < n_tensors; i++) {
		if (read_tensor_info(r, &f->tensors[i], i))
			return -1;
		f->by_name[i] = &f->tensors[i];
	}
	f->n_tensors = n_tensors;
	uint64_t pad = (f->alignment - r->pos % f->alignment) % f->alignment;
	f->data_offset = r->pos + pad;
	/* a file without tensors may end before the padding; with tensors, the data section
	 * (even for zero-sized ones) must start inside the file */
	if (f->data_offset > f->file_size && n_tensors > 0)
		return error_set(r->err, MOE_EINVAL,
		                 "%s: truncated: data section would start at %" PRIu64
		                 ", file is %" PRIu64 " bytes",
		                 r->path, f->data_offset, f->file_size);
	const uint64_t data_size =
	    f->data_offset < f->file_size ? f->file_size - f->data_offset : 0;
	for (uint64_t i = 0; i < n_tensors; i++) {
		struct gguf_tensor *t = &f->tensors[i];
		if (t->rel_offset % f->alignment)
			return error_set(r->err, MOE_EINVAL,
			                 "%s: tensor %s: offset %" PRIu64
			                 " is not a multiple of the alignment %u",
			                 r->path, t->name, t->rel_offset, f->alignment);
		if (t->rel_offset > data_size || t->nbytes > data_size - t->rel_offset)
			return error_set(
			    r->err, MOE_EINVAL,
			    "%s: tensor %s: data [%" PRIu64 ", +%" PRIu64
			    ") runs past the end of the file (data section holds %" PRIu64
			    " bytes)",
			    r->path, t->name, t->rel_offset, t->nbytes, data_size);
		t->offset = f->data_offset + t->rel_offset;
	}
	qsort(f->by_name, n_tensors, sizeof(*f->by_name), cmp_tensor_name);
	for (uint64_t i = 1; i < n_tensors; i++)
		if (!strcmp(f->by_name[i - 1]->name, f->by_name[i]->name))
			return error_set(r->err, MOE_EINVAL, "%s: duplicate tensor name %s",
			                 r->path, f->by_name[i]->name);
	/* overlap check on a copy sorted by offset */
	struct gguf_tensor **by_off = malloc((n_tensors ? n_tensors : 1) * sizeof(*by_off));
	if (!by_off)
		return error_set(r->err, MOE_ENOMEM, "%s: out of memory", r->path);
	memcpy(by_off, f->by_name, n_tensors * sizeof(*by_off));
	qsort(by_off, n_tensors, sizeof(*by_off), cmp_tensor_offset);
	for (uint64_t i = 1; i < n_tensors; i++) {
		const struct gguf_tensor *a = by_off[i - 1], *b = by_off[i];
		if (a->nbytes && b->nbytes && a->offset + a->nbytes > b->offset) {
			error_set(r->err, MOE_EINVAL,
			          "%s: tensors %s and %s overlap (offsets %" PRIu64 " +%" PRIu64
			          " and %" PRIu64 ")",
			          r->path, a->name, b->name, a->rel_offset, a->nbytes,
			          b->rel_offset);
			free(by_off);
			return -1;
		}
	}
	free(by_off);
	return 0;
}

int gguf_open(const char *path, struct gguf_file **out, struct sidecar_error *err)
{
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return error_set_errno(err, "%s", path);
	struct stat st;
	if (fstat(fd, &st)) {
		error_set_errno(err, "%s: stat", path);
		close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return error_set(err, MOE_EINVAL, "%s: not a regular file", path);
	}
	struct gguf_file *f = calloc(1, sizeof(*f));
	struct header_reader r = {
	    .fd = fd, .path = path, .file_size = (uint64_t)st.st_size, .err = err};
	r.win = malloc(HEADER_WINDOW);
	if (!f || !r.win || !(f->path = strdup(path))) {
		free(r.win);
		free(f);
		close(fd);
		return error_set(err, MOE_ENOMEM, "%s: out of memory", path);
	}
	f->file_size = (uint64_t)st.st_size;
	int rc = gguf_parse(&r, f);
	free(r.win);
	close(fd);
	if (rc) {
		gguf_close(f);
		return -1;
	}
	*out = f;
	return 0;
}

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key)
{
	for (uint64_t i = 0; i < f->n_kv; i++)
		if (f->kv[i].key && !strcmp(f->kv[i].key, key))
			return &f->kv[i];
	return NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
	size_t lo = 0, hi = f->n_tensors;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(f->by_name[mid]->name, name);
		if (!c)
			return f->by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int value_is_signed(uint32_t t)
{
	return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64;
}

static int value_is_unsigned(uint32_t t)
{
	return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64;
}

int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	if (!kv)
		return 0;
	if (value_is_unsigned(kv->value.type)) {
		*out = kv->value.u;
		return 1;
	}
	if (value_is_signed(kv->value.type) && kv->value.i >= 0) {
		*out = (uint64_t)kv->value.i;
		return 1;
	}
	return -1;
}

int gguf_get_f64(const struct gguf_file *f, const char *key, double *out)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	if (!kv)
		return 0;
	uint32_t t = kv->value.type;
	if (t == GGUF_FLOAT32 || t == GGUF_FLOAT64)
		*out = kv->value.f;
	else if (value_is_unsigned(t))
		*out = (double)kv->value.u;
	else if (value_is_signed(t))
		*out = (double)kv->value.i;
	else
		return -1;
	return 1;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	if (!kv)
		return 0;
	if (kv->value.type == GGUF_BOOL || value_is_unsigned(kv->value.type))
		*out = kv->value.u != 0;
	else if (value_is_signed(kv->value.type))
		*out = kv->value.i != 0;
	else
		return -1;
	return 1;
}

const char *gguf_get_str(const struct gguf_file *f, const char *key)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	return kv && kv->value.type == GGUF_STRING ? kv->value.str.ptr : NULL;
}

int gguf_array_f64(const struct gguf_value *arr, uint64_t i, double *out)
{
	if (arr->type != GGUF_ARRAY || i >= arr->arr.count || !arr->arr.raw)
		return -1;
	uint32_t et = arr->arr.elem_type;
	uint32_t sz = scalar_size(et);
	struct gguf_value v = {.type = et};
	widen_scalar(&v, (const unsigned char *)arr->arr.raw + i * sz);
	if (et == GGUF_FLOAT32 || et == GGUF_FLOAT64)
		*out = v.f;
	else if (value_is_signed(et))
		*out = (double)v.i;
	else
		*out = (double)v.u;
	return 0;
}

/* ---- split files ------------------------------------------------------------------------ */

void gguf_close_splits(struct gguf_file **files, uint32_t n)
{
	if (!files)
		return;
	for (uint32_t i = 0; i < n; i++)
		gguf_close(files[i]);
	free(files);
}

int gguf_open_splits(const char *path, struct gguf_file ***out, uint32_t *n_out,
                     struct sidecar_error *err)
{
	*out = NULL;
	*n_out = 0;
	struct gguf_file *first;
	if (gguf_open(path, &first, err))
		return -1;
	uint64_t count = 1, no = 0;
	int has_count = gguf_get_u64(first, "split.count", &count);
	int has_no = gguf_get_u64(first, "split.no", &no);
	if (has_count < 0 || has_no < 0 || (has_count && (count == 0 || count > 99999))) {
		gguf_close(first);
		return error_set(err, MOE_EINVAL,
		                 "%s: split.count/split.no must be small unsigned integers", path);
	}
	if (no != 0) {
		gguf_close(first);
		return error_set(err, MOE_EINVAL,
		                 "%s: is split %" PRIu64 " of %" PRIu64
		                 "; open the first split (-00001-of-…)",
		                 path, no + 1, count);
	}
	struct gguf_file **files = calloc(count, sizeof(*files));
	if (!files) {
		gguf_close(first);
		return error_set(err, MOE_ENOMEM, "%s: out of memory", path);
	}
	files[0] = first;
	if (count > 1) {
		/* PREFIX-00001-of-0000N.gguf, as llama.cpp's gguf-split names them */
		char suffix[64];
		snprintf(suffix, sizeof(suffix), "-%05d-of-%05d.gguf", 1, (int)count);
		size_t plen = strlen(path), slen = strlen(suffix);
		if (plen < slen || strcmp(path + plen - slen, suffix)) {
			gguf_close_splits(files, 1);
			return error_set(err, MOE_EINVAL,
			                 "%s: split.count is %" PRIu64
			                 " but the name does not end in %s",
			                 path, count, suffix);
		}
		for (uint64_t i = 1; i < count; i++) {
			char *p = malloc(plen + 1);
			if (!p) {
				gguf_close_splits(files, (uint32_t)i);
				return error_set(err, MOE_ENOMEM, "%s: out of memory", path);
			}
			memcpy(p, path, plen - slen);
			snprintf(p + plen - slen, slen + 1, "-%05d-of-%05d.gguf", (int)i + 1,
			         (int)count);
			struct sidecar_error sub;
			if (gguf_open(p, &files[i], &sub)) {
				error_set(err, sub.status,
				          "missing or bad split %" PRIu64 " of %" PRIu64 ": %s",
				          i + 1, count, sub.msg);
				free(p);
				gguf_close_splits(files, (uint32_t)i);
				return -1;
			}
			uint64_t sno = UINT64_MAX, scount = 0;
			if (gguf_get_u64(files[i], "split.no", &sno) != 1 ||
			    gguf_get_u64(files[i], "split.count", &scount) != 1 || sno != i ||
			    scount != count) {
				error_set(err, MOE_EINVAL,
				          "%s: split.no/split.count do not say split %" PRIu64
				          " of %" PRIu64,
				          p, i + 1, count);
				free(p);
				gguf_close_splits(files, (uint32_t)i + 1);
				return -1;
			}
			free(p);
		}
	}
	*out = files;
	*n_out = (uint32_t)count;
	return 0;
}
