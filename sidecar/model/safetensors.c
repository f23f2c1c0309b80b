/* safetensors.c — see safetensors.h. */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

static const struct {
	const char *name;
	uint32_t size;
} st_dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1},       [ST_U8] = {"U8", 1},           [ST_I8] = {"I8", 1},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_F8_E8M0] = {"F8_E8M0", 1},
    [ST_I16] = {"I16", 2},         [ST_U16] = {"U16", 2},         [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},       [ST_I32] = {"I32", 4},         [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},         [ST_F64] = {"F64", 8},         [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},
};

const char *st_dtype_name(enum st_dtype d)
{
	return (unsigned)d < ST_DTYPE_COUNT ? st_dtypes[d].name : "?";
}

uint32_t st_dtype_size(enum st_dtype d)
{
	return (unsigned)d < ST_DTYPE_COUNT ? st_dtypes[d].size : 0;
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
	char *p = buf;
	while (n) {
		ssize_t got = pread(fd, p, n, (off_t)off);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return got < 0 ? -1 : (errno = EIO, -1);
		p += got;
		n -= (size_t)got;
		off += (uint64_t)got;
	}
	return 0;
}

void st_close(struct st_file *f)
{
	if (!f)
		return;
	for (uint64_t i = 0; i < f->n_tensors; i++)
		free(f->tensors[i].name);
	free(f->tensors);
	free(f->path);
	free(f);
}

static int cmp_by_offset(const void *a, const void *b)
{
	const struct st_tensor *x = *(const struct st_tensor *const *)a;
	const struct st_tensor *y = *(const struct st_tensor *const *)b;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int parse_tensor(const struct json_doc *doc, json_ref m, struct st_tensor *t,
                        uint64_t buf_size, const char *path, struct sidecar_error *err)
{
	size_t name_len;
	const char *name = json_key(doc, m, &name_len);
	if (strlen(name) != name_len)
		return error_set(err, MOE_EINVAL, "%s: a tensor name contains a NUL byte", path);
	if (!(t->name = strdup(name)))
		return error_set(err, MOE_ENOMEM, "%s: out of memory", path);
	if (json_type_of(doc, m) != JSON_OBJECT)
		return error_set(err, MOE_EINVAL, "%s: tensor %s: entry is not an object", path,
		                 name);
	const char *dt = json_string(doc, json_object_get(doc, m, "dtype"), NULL);
	if (!dt)
		return error_set(err, MOE_EINVAL, "%s: tensor %s: missing dtype", path, name);
	t->dtype = ST_DTYPE_COUNT;
	for (int d = 0; d < ST_DTYPE_COUNT; d++)
		if (!strcmp(dt, st_dtypes[d].name))
			t->dtype = (enum st_dtype)d;
	if (t->dtype == ST_DTYPE_COUNT)
		return error_set(err, MOE_EINVAL, "%s: tensor %s: unknown dtype %.32s", path, name,
		                 dt);
	json_ref shape = json_object_get(doc, m, "shape");
	if (json_type_of(doc, shape) != JSON_ARRAY || shape == JSON_NONE)
		return error_set(err, MOE_EINVAL, "%s: tensor %s: missing shape", path, name);
	if (json_count(doc, shape) > ST_MAX_DIMS)
		return error_set(err, MOE_EINVAL, "%s: tensor %s: %u dimensions (at most %d)", path,
		                 name, json_count(doc, shape), ST_MAX_DIMS);
	uint64_t elems = 1;
	int overflow = 0;
	for (json_ref d = json_first(doc, shape); d != JSON_NONE; d = json_next(doc, d)) {
		uint64_t v;
		if (json_u64(doc, d, &v))
			return error_set(err, MOE_EINVAL,
			                 "%s: tensor %s: shape entries must be unsigned "
			                 "integers",
			                 path, name);
		if (v && elems > UINT64_MAX / v)
			overflow = 1;
		elems *= v;
		t->shape[t->n_dims++] = v;
	}
	uint32_t esz = st_dtypes[t->dtype].size;
	if (overflow || elems > UINT64_MAX / esz)
		return error_set(err, MOE_EINVAL, "%s: tensor %s: shape overflows", path, name);
	json_ref offs = json_object_get(doc, m, "data_offsets");
	uint64_t begin, end;
	if (json_type_of(doc, offs) != JSON_ARRAY || offs == JSON_NONE ||
	    json_count(doc, offs) != 2 || json_u64(doc, json_first(doc, offs), &begin) ||
	    json_u64(doc, json_next(doc, json_first(doc, offs)), &end))
		return error_set(err, MOE_EINVAL,
		                 "%s: tensor %s: data_offsets must be [begin, end] "
		                 "unsigned integers",
		                 path, name);
	if (end < begin)
		return error_set(err, MOE_EINVAL,
		                 "%s: tensor %s: data_offsets end %" PRIu64
		                 " is before begin %" PRIu64,
		                 path, name, end, begin);
	if (end > buf_size)
		return error_set(err, MOE_EINVAL,
		                 "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
		                 ") run past the end of the file (data buffer is %" PRIu64
		                 " bytes)",
		                 path, name, begin, end, buf_size);
	if (end - begin != elems * esz)
		return error_set(err, MOE_EINVAL,
		                 "%s: tensor %s: %" PRIu64 " bytes in data_offsets but shape "
		                 "x %s needs %" PRIu64,
		                 path, name, end - begin, st_dtypes[t->dtype].name, elems * esz);
	t->offset = begin;
	t->nbytes = end - begin;
	return 0;
}

static int st_parse(struct st_file *f, int fd, struct sidecar_error *err)
{
	const char *path = f->path;
	unsigned char lenb[8];
	if (f->file_size < 8)
		return error_set(err, MOE_EINVAL,
		                 "%s: truncated: %" PRIu64
		                 " bytes, too short for a safetensors header",
		                 path, f->file_size);
	if (pread_all(fd, lenb, 8, 0))
		return error_set(err, MOE_EIO, "%s: read: %s", path, strerror(errno));
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | lenb[i];
	if (n > f->file_size - 8)
		return error_set(err, MOE_EINVAL,
		                 "%s: truncated: header length %" PRIu64
		                 " runs past the end of the file (%" PRIu64 " bytes)",
		                 path, n, f->file_size);
	if (n > ST_MAX_HEADER)
		return error_set(err, MOE_EINVAL, "%s: header length %" PRIu64 " exceeds %u bytes",
		                 path, n, ST_MAX_HEADER);
	char *hdr = malloc(n ? n : 1);
	if (!hdr)
		return error_set(err, MOE_ENOMEM, "%s: out of memory", path);
	if (pread_all(fd, hdr, n, 8)) {
		free(hdr);
		return error_set(err, MOE_EIO, "%s: read header: %s", path, strerror(errno));
	}
	f->data_offset = 8 + n;
	const uint64_t buf_size = f->file_size - f->data_offset;
	struct json_doc *doc;
	if (n == 0 || hdr[0] != '{') {
		free(hdr);
		return error_set(err, MOE_EINVAL,
		                 "%s: not a safetensors file (header does not start with "
		                 "'{')",
		                 path);
	}
	if (json_parse(hdr, n, &doc, err)) {
		free(hdr);
		return error_prefix(err, path);
	}
	free(hdr);
	json_ref root = json_root(doc);
	int rc = -1;
	struct st_tensor **sorted = NULL;
	if (json_type_of(doc, root) != JSON_OBJECT) {
		error_set(err, MOE_EINVAL, "%s: header is not a JSON object", path);
		goto out;
	}
	f->tensors = calloc(json_count(doc, root) + 1, sizeof(*f->tensors));
	if (!f->tensors) {
		error_set(err, MOE_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	for (json_ref m = json_first(doc, root); m != JSON_NONE; m = json_next(doc, m)) {
		if (!strcmp(json_key(doc, m, NULL), "__metadata__"))
			continue;
		struct st_tensor *t = &f->tensors[f->n_tensors++];
		if (parse_tensor(doc, m, t, buf_size, path, err))
			goto out;
	}
	sorted = malloc((f->n_tensors + 1) * sizeof(*sorted));
	if (!sorted) {
		error_set(err, MOE_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	for (uint64_t i = 0; i < f->n_tensors; i++)
		sorted[i] = &f->tensors[i];
	qsort(sorted, f->n_tensors, sizeof(*sorted), cmp_by_offset);
	uint64_t at = 0;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct st_tensor *t = sorted[i];
		if (t->offset < at) {
			error_set(err, MOE_EINVAL,
			          "%s: tensors %s and %s overlap (data_offsets %" PRIu64
			          " < %" PRIu64 ")",
			          path, sorted[i - 1]->name, t->name, t->offset, at);
			goto out;
		}
		if (t->offset > at) {
			error_set(err, MOE_EINVAL,
			          "%s: gap of %" PRIu64 " bytes in the data buffer before tensor "
			          "%s (tensors must tile the buffer)",
			          path, t->offset - at, t->name);
			goto out;
		}
		at = t->offset + t->nbytes;
	}
	if (at != buf_size) {
		error_set(err, MOE_EINVAL,
		          "%s: tensors cover %" PRIu64 " bytes but the data buffer is %" PRIu64
		          " bytes",
		          path, at, buf_size);
		goto out;
	}
	for (uint64_t i = 0; i < f->n_tensors; i++)
		f->tensors[i].offset += f->data_offset;
	rc = 0;
out:
	free(sorted);
	json_free(doc);
	return rc;
}

int st_open(const char *path, struct st_file **out, struct sidecar_error *err)
{
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return error_set_errno(err, "%s", path);
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		return error_set(err, MOE_EINVAL, "%s: not a regular file", path);
	}
	struct st_file *f = calloc(1, sizeof(*f));
	if (!f || !(f->path = strdup(path))) {
		free(f);
		close(fd);
		return error_set(err, MOE_ENOMEM, "%s: out of memory", path);
	}
	f->file_size = (uint64_t)st.st_size;
	int rc = st_parse(f, fd, err);
	close(fd);
	if (rc) {
		st_close(f);
		return -1;
	}
	*out = f;
	return 0;
}

/* ---- checkpoints ------------------------------------------------------------------------- */

void st_close_model(struct st_model *m)
{
	if (!m)
		return;
	for (uint32_t i = 0; i < m->n_files; i++)
		st_close(m->files[i]);
	free(m->files);
	free(m->by_name);
	free(m);
}

static int cmp_ref_name(const void *a, const void *b)
{
	return strcmp(((const struct st_tensor_ref *)a)->tensor->name,
	              ((const struct st_tensor_ref *)b)->tensor->name);
}

const struct st_tensor_ref *st_find(const struct st_model *m, const char *name)
{
	size_t lo = 0, hi = m->n_tensors;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(m->by_name[mid].tensor->name, name);
		if (!c)
			return &m->by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int add_file(struct st_model *m, const char *path, struct sidecar_error *err)
{
	struct st_file **nf = realloc(m->files, (m->n_files + 1) * sizeof(*nf));
	if (!nf)
		return error_set(err, MOE_ENOMEM, "%s: out of memory", path);
	m->files = nf;
	if (st_open(path, &m->files[m->n_files], err))
		return -1;
	m->n_files++;
	return 0;
}

static int build_name_index(struct st_model *m, struct sidecar_error *err)
{
	uint64_t n = 0;
	for (uint32_t i = 0; i < m->n_files; i++)
		n += m->files[i]->n_tensors;
	m->by_name = malloc((n + 1) * sizeof(*m->by_name));
	if (!m->by_name)
		return error_set(err, MOE_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < m->n_files; i++)
		for (uint64_t j = 0; j < m->files[i]->n_tensors; j++)
			m->by_name[m->n_tensors++] =
			    (struct st_tensor_ref){&m->files[i]->tensors[j], i};
	qsort(m->by_name, m->n_tensors, sizeof(*m->by_name), cmp_ref_name);
	for (uint64_t i = 1; i < m->n_tensors; i++)
		if (!strcmp(m->by_name[i - 1].tensor->name, m->by_name[i].tensor->name))
			return error_set(err, MOE_EINVAL, "tensor %s appears twice (%s and %s)",
			                 m->by_name[i].tensor->name,
			                 m->files[m->by_name[i - 1].file]->path,
			                 m->files[m->by_name[i].file]->path);
	return 0;
}

static char *read_small_file(const char *path, size_t limit, size_t *len, struct sidecar_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		error_set_errno(err, "%s", path);
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > limit) {
		error_set(err, MOE_EINVAL, "%s: not a regular file of at most %zu bytes", path,
		          limit);
		close(fd);
		return NULL;
	}
	char *buf = malloc((size_t)st.st_size + 1);
	if (!buf || pread_all(fd, buf, (size_t)st.st_size, 0)) {
		error_set(err, buf ? MOE_EIO : MOE_ENOMEM, "%s: read: %s", path,
		          buf ? strerror(errno) : "out of memory");
		free(buf);
		close(fd);
		return NULL;
	}
	close(fd);
	buf[st.st_size] = '\0';
	*len = (size_t)st.st_size;
	return buf;
}

/* A shard name from an index must be a plain file name in the model's directory. */
static int shard_name_ok(const char *s, size_t len)
{
	return len > 0 && strlen(s) == len && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static int open_index(struct st_model *m, const char *index_path, struct sidecar_error *err)
{
	size_t len;
	char *text = read_small_file(index_path, JSON_MAX_INPUT, &len, err);
	if (!text)
		return -1;
	struct json_doc *doc;
	int rc = json_parse(text, len, &doc, err);
	free(text);
	if (rc)
		return error_prefix(err, index_path);
	rc = -1;
	char *dir = strdup(index_path);
	const char **shard_names = NULL;
	uint32_t n_shards = 0;
	uint32_t *entry_shard = NULL;
	json_ref map = json_object_get(doc, json_root(doc), "weight_map");
	if (!dir) {
		error_set(err, MOE_ENOMEM, "out of memory");
		goto out;
	}
	char *slash = strrchr(dir, '/');
	if (slash)
		slash[1] = '\0';
	else
		dir[0] = '\0';
	if (json_type_of(doc, map) != JSON_OBJECT || map == JSON_NONE) {
		error_set(err, MOE_EINVAL, "%s: no weight_map object", index_path);
		goto out;
	}
	uint32_t n_entries = json_count(doc, map);
	shard_names = calloc(n_entries + 1, sizeof(*shard_names));
	entry_shard = calloc(n_entries + 1, sizeof(*entry_shard));
	if (!shard_names || !entry_shard) {
		error_set(err, MOE_ENOMEM, "out of memory");
		goto out;
	}
	/* distinct shard names, in first-seen order (linear in shards, which are few) */
	uint32_t e = 0;
	for (json_ref it = json_first(doc, map); it != JSON_NONE; it = json_next(doc, it), e++) {
		size_t sl;
		const char *s = json_string(doc, it, &sl);
		if (!s || !shard_name_ok(s, sl)) {
			error_set(err, MOE_EINVAL,
			          "%s: weight_map entry %s: shard must be a plain file name",
			          index_path, json_key(doc, it, NULL));
			goto out;
		}
		uint32_t k = 0;
		while (k < n_shards && strcmp(shard_names[k], s))
			k++;
		if (k == n_shards)
			shard_names[n_shards++] = s;
		entry_shard[e] = k;
	}
	for (uint32_t k = 0; k < n_shards; k++) {
		size_t pl = strlen(dir) + strlen(shard_names[k]) + 1;
		char *p = malloc(pl);
		if (!p) {
			error_set(err, MOE_ENOMEM, "out of memory");
			goto out;
		}
		snprintf(p, pl, "%s%s", dir, shard_names[k]);
		struct sidecar_error sub;
		if (add_file(m, p, &sub)) {
			error_set(err, sub.status, "%s: shard %s: %s", index_path, shard_names[k],
			          sub.msg);
			free(p);
			goto out;
		}
		free(p);
	}
	if (build_name_index(m, err))
		goto out;
	e = 0;
	for (json_ref it = json_first(doc, map); it != JSON_NONE; it = json_next(doc, it), e++) {
		const char *name = json_key(doc, it, NULL);
		const struct st_tensor_ref *r = st_find(m, name);
		if (!r || r->file != entry_shard[e]) {
			error_set(err, MOE_EINVAL,
			          "%s: tensor %s is not in shard %s as weight_map says", index_path,
			          name, shard_names[entry_shard[e]]);
			goto out;
		}
	}
	if (m->n_tensors != n_entries) {
		error_set(err, MOE_EINVAL,
		          "%s: shards hold %" PRIu64 " tensors but weight_map lists %u", index_path,
		          m->n_tensors, n_entries);
		goto out;
	}
	rc = 0;
out:
	free(entry_shard);
	free(shard_names);
	free(dir);
	json_free(doc);
	return rc;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && !strcmp(s + a - b, suffix);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int open_dir(struct st_model *m, const char *dir, struct sidecar_error *err)
{
	char p[4096];
	struct stat st;
	snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
	if (!stat(p, &st))
		return open_index(m, p, err);
	snprintf(p, sizeof(p), "%s/model.safetensors", dir);
	if (!stat(p, &st)) {
		if (add_file(m, p, err))
			return -1;
		return build_name_index(m, err);
	}
	DIR *d = opendir(dir);
	if (!d)
		return error_set_errno(err, "%s", dir);
	char **names = NULL;
	size_t n = 0;
	int rc = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!ends_with(de->d_name, ".safetensors"))
			continue;
		char **nn = realloc(names, (n + 1) * sizeof(*nn));
		if (!nn || !(nn[n] = strdup(de->d_name))) {
			names = nn ? nn : names;
			rc = error_set(err, MOE_ENOMEM, "out of memory");
			break;
		}
		names = nn;
		n++;
	}
	closedir(d);
	if (!rc && n == 0)
		rc = error_set(err, MOE_EINVAL,
		               "%s: no model.safetensors.index.json or *.safetensors", dir);
	if (!rc)
		qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n && !rc; i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		rc = add_file(m, p, err);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return rc ? rc : build_name_index(m, err);
}

int st_open_model(const char *path, struct st_model **out, struct sidecar_error *err)
{
	*out = NULL;
	struct st_model *m = calloc(1, sizeof(*m));
	if (!m)
		return error_set(err, MOE_ENOMEM, "out of memory");
	struct stat st;
	int rc;
	if (stat(path, &st))
		rc = error_set_errno(err, "%s", path);
	else if (S_ISDIR(st.st_mode))
		rc = open_dir(m, path, err);
	else if (ends_with(path, ".json"))
		rc = open_index(m, path, err);
	else
		rc = add_file(m, path, err) ? -1 : build_name_index(m, err);
	if (rc) {
		st_close_model(m);
		return -1;
	}
	*out = m;
	return 0;
}
