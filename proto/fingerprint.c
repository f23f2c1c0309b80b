/* fingerprint.c — the model fingerprint both sides compute from a model path.
 *
 * The sidecar puts the fingerprint of the model it serves in the welcome; a client computes
 * one from the path it expects (moe_model_fingerprint) and compares. Both call this one
 * function, so they agree by construction. It has to tell apart two checkpoints of the same
 * shape (a fine-tune and its base share every header byte), so besides names and sizes it
 * reads a little of each file's contents, and it must not cost a start-up noticeably, so it
 * reads only that little: the first 64 KiB of every file (GGUF metadata and tensor infos,
 * the safetensors header, config.json whole) and sixteen 4 KiB blocks spread evenly over it.
 *
 * Files, in this order (the ones the catalog reads, named as it finds them):
 *   a directory      config.json, model.safetensors.index.json (each when present), then
 *                    every *.safetensors in it, sorted bytewise by name;
 *   PREFIX-0000i-of-0000N.gguf   all N splits;
 *   anything else    that file.
 * Only base names enter the hash: a model copied elsewhere keeps its fingerprint.
 *
 * Reads use O_DIRECT where the file system allows it, so that fingerprinting leaves nothing
 * in the page cache (the page-cache probes would count it against the loader).
 *
 * The hash is not cryptographic: it guards against attaching to the wrong checkpoint by
 * mistake, not against someone forging one.
 */
#include "moe_proto.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FP_HEAD_BYTES (64u * 1024u)
#define FP_BLOCK_BYTES 4096u
#define FP_SAMPLES 16u
#define FP_MAX_FILES 4096u

/* fp_fail(why, len, status, …): moe_fail_with with the buffer first, as the callers read. */
#define fp_fail(why, why_len, status, ...) moe_fail_with(status, why, why_len, __VA_ARGS__)

/* ---- 128-bit hash: two 64-bit lanes over 8-byte words, each segment length-terminated -- */

struct fp_hash {
	uint64_t a, b, words;
};

static uint64_t fp_rotl(uint64_t x, unsigned r)
{
	return (x << r) | (x >> (64 - r));
}

/* A full-avalanche 64-bit finaliser (splitmix64's). */
static uint64_t fp_avalanche(uint64_t x)
{
	x ^= x >> 30;
	x *= UINT64_C(0xbf58476d1ce4e5b9);
	x ^= x >> 27;
	x *= UINT64_C(0x94d049bb133111eb);
	x ^= x >> 31;
	return x;
}

static void fp_word(struct fp_hash *h, uint64_t k)
{
	h->a = fp_rotl(h->a ^ fp_avalanche(k + UINT64_C(0x9e3779b97f4a7c15)), 27) * 5u + h->b;
	h->b = fp_rotl(h->b ^ fp_avalanche(k ^ UINT64_C(0xc2b2ae3d27d4eb4f)), 31) * 9u + h->a;
	h->words++;
}

/* Hashes n bytes as one segment: its words, then a word with the tail and the length. */
static void fp_segment(struct fp_hash *h, const void *data, size_t n)
{
	const uint8_t *p = data;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t k = 0;
		for (unsigned b = 0; b < 8; b++) /* little endian whatever the host */
			k |= (uint64_t)p[i + b] << (8 * b);
		fp_word(h, k);
	}
	uint64_t tail = 0;
	for (unsigned b = 0; i + b < n; b++)
		tail |= (uint64_t)p[i + b] << (8 * b);
	fp_word(h, tail);
	fp_word(h, (uint64_t)n);
}

static void fp_u64(struct fp_hash *h, uint64_t v)
{
	fp_word(h, v);
}

static void fp_final(const struct fp_hash *h, uint8_t out[MOE_FINGERPRINT_BYTES])
{
	uint64_t a = fp_avalanche(h->a ^ h->words);
	uint64_t b = fp_avalanche(h->b + a);
	a = fp_avalanche(a + b);
	for (unsigned i = 0; i < 8; i++) {
		out[i] = (uint8_t)(a >> (8 * i));
		out[8 + i] = (uint8_t)(b >> (8 * i));
	}
}

/* ---- the files of a model path ----------------------------------------------------------- */

struct fp_files {
	char **names; /* full paths */
	uint32_t n, cap;
};

static int fp_add(struct fp_files *f, const char *dir, const char *name, char *why, size_t wl)
{
	if (f->n == FP_MAX_FILES)
		return fp_fail(why, wl, MOE_EINVAL, "%s: more than %u model files", dir,
		               FP_MAX_FILES);
	if (f->n == f->cap) {
		uint32_t cap = f->cap ? 2 * f->cap : 16;
		char **n = realloc(f->names, cap * sizeof(*n));
		if (!n)
			return fp_fail(why, wl, MOE_ENOMEM, "out of memory");
		f->names = n;
		f->cap = cap;
	}
	size_t len = strlen(dir) + 1 + strlen(name) + 1;
	char *p = malloc(len);
	if (!p)
		return fp_fail(why, wl, MOE_ENOMEM, "out of memory");
	if (dir[0])
		snprintf(p, len, "%s/%s", dir, name);
	else
		snprintf(p, len, "%s", name);
	f->names[f->n++] = p;
	return MOE_OK;
}

static void fp_files_free(struct fp_files *f)
{
	for (uint32_t i = 0; i < f->n; i++)
		free(f->names[i]);
	free(f->names);
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int fp_list_dir(const char *dir, struct fp_files *f, char *why, size_t wl)
{
	static const char *const fixed[] = {"config.json", "model.safetensors.index.json"};
	for (unsigned i = 0; i < 2; i++) {
		char p[PATH_MAX];
		struct stat st;
		if (snprintf(p, sizeof(p), "%s/%s", dir, fixed[i]) >= (int)sizeof(p))
			return fp_fail(why, wl, MOE_EINVAL, "%s: path too long", dir);
		if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
			int rc = fp_add(f, dir, fixed[i], why, wl);
			if (rc != MOE_OK)
				return rc;
		}
	}
	DIR *d = opendir(dir);
	if (!d)
		return fp_fail(why, wl, MOE_ESYS, "%s: %s", dir, strerror(errno));
	const uint32_t first = f->n;
	int rc = MOE_OK;
	struct dirent *de;
	while (rc == MOE_OK && (de = readdir(d)))
		if (de->d_name[0] != '.' && ends_with(de->d_name, ".safetensors"))
			rc = fp_add(f, dir, de->d_name, why, wl);
	closedir(d);
	if (rc != MOE_OK)
		return rc;
	if (f->n == first)
		return fp_fail(why, wl, MOE_EINVAL, "%s: no *.safetensors in this directory", dir);
	qsort(f->names + first, f->n - first, sizeof(*f->names), cmp_names);
	return MOE_OK;
}

/* PREFIX-00001-of-00003.gguf → the three splits; anything else → the file itself. */
static int fp_list_file(const char *path, struct fp_files *f, char *why, size_t wl)
{
	const char *tail = "-00001-of-00001.gguf"; /* the shape of a split name's end */
	size_t n = strlen(path), m = strlen(tail);
	unsigned no, count;
	char dash, end[8];
	if (n > m && sscanf(path + n - m, "-%5u-of-%5u%c%7s", &no, &count, &dash, end) == 4 &&
	    dash == '.' && strcmp(end, "gguf") == 0 && no >= 1 && no <= count && count >= 1) {
		char prefix[PATH_MAX];
		if (n - m >= sizeof(prefix))
			return fp_fail(why, wl, MOE_EINVAL, "%s: path too long", path);
		memcpy(prefix, path, n - m);
		prefix[n - m] = '\0';
		for (unsigned i = 1; i <= count; i++) {
			char name[PATH_MAX];
			if (snprintf(name, sizeof(name), "%s-%05u-of-%05u.gguf", prefix, i,
			             count) >= (int)sizeof(name))
				return fp_fail(why, wl, MOE_EINVAL, "%s: path too long", path);
			int rc = fp_add(f, "", name, why, wl);
			if (rc != MOE_OK)
				return rc;
		}
		return MOE_OK;
	}
	return fp_add(f, "", path, why, wl);
}

/* ---- reading ---------------------------------------------------------------------------- */

/* Reads up to len bytes at off (aligned for O_DIRECT); returns the count or -1. */
static ssize_t fp_pread(int fd, uint8_t *buf, size_t len, uint64_t off)
{
	size_t got = 0;
	while (got < len) {
		ssize_t r = pread(fd, buf + got, len - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
		if (got % FP_BLOCK_BYTES) /* a short O_DIRECT read only happens at the end */
			break;
	}
	return (ssize_t)got;
}

static int fp_file(struct fp_hash *h, const char *path, uint8_t *buf, char *why, size_t wl)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
	if (fd < 0 && errno == EINVAL) /* tmpfs and others: buffered */
		fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fp_fail(why, wl, MOE_ESYS, "%s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int e = errno;
		close(fd);
		return fp_fail(why, wl, MOE_ESYS, "%s: fstat: %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return fp_fail(why, wl, MOE_EINVAL, "%s: not a regular file", path);
	}
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	fp_segment(h, base, strlen(base));
	const uint64_t size = (uint64_t)st.st_size;
	fp_u64(h, size);
	int rc = MOE_OK;
	for (unsigned i = 0; i <= FP_SAMPLES && rc == MOE_OK; i++) {
		/* i = 0: the head; then sixteen blocks at i/17 of the size, block aligned. */
		uint64_t off =
		    i == 0 ? 0 : (size / (FP_SAMPLES + 1) * i) & ~(uint64_t)(FP_BLOCK_BYTES - 1);
		size_t len = i == 0 ? FP_HEAD_BYTES : FP_BLOCK_BYTES;
		ssize_t r = fp_pread(fd, buf, len, off);
		if (r < 0 && errno == EINVAL && i == 0) { /* O_DIRECT refused late: buffered */
			close(fd);
			fd = open(path, O_RDONLY | O_CLOEXEC);
			if (fd < 0)
				return fp_fail(why, wl, MOE_ESYS, "%s: %s", path, strerror(errno));
			r = fp_pread(fd, buf, len, off);
		}
		if (r < 0)
			rc = fp_fail(why, wl, MOE_ESYS, "%s: reading %zu bytes at %llu: %s", path,
			             len, (unsigned long long)off, strerror(errno));
		else
			fp_segment(h, buf, (size_t)r);
	}
	close(fd);
	return rc;
}

int moe_fingerprint_path(const char *path, uint8_t out[MOE_FINGERPRINT_BYTES], char *why,
                         size_t why_len)
{
	if (!path || !*path)
		return fp_fail(why, why_len, MOE_EINVAL, "no model path");
	struct stat st;
	if (stat(path, &st) != 0)
		return fp_fail(why, why_len, MOE_ESYS, "%s: %s", path, strerror(errno));
	struct fp_files files = {0};
	int rc = S_ISDIR(st.st_mode) ? fp_list_dir(path, &files, why, why_len)
	                             : fp_list_file(path, &files, why, why_len);
	void *buf = NULL;
	if (rc == MOE_OK && posix_memalign(&buf, FP_BLOCK_BYTES, FP_HEAD_BYTES) != 0)
		rc = fp_fail(why, why_len, MOE_ENOMEM, "out of memory");
	struct fp_hash h = {.a = UINT64_C(0x6d6f652d73696465), .b = UINT64_C(0x6361722d66703031)};
	if (rc == MOE_OK)
		fp_u64(&h, files.n);
	for (uint32_t i = 0; rc == MOE_OK && i < files.n; i++)
		rc = fp_file(&h, files.names[i], buf, why, why_len);
	free(buf);
	fp_files_free(&files);
	if (rc == MOE_OK)
		fp_final(&h, out);
	return rc;
}

void moe_fingerprint_hex(const uint8_t fp[MOE_FINGERPRINT_BYTES], char hex[33])
{
	static const char digits[] = "0123456789abcdef";
	for (unsigned i = 0; i < MOE_FINGERPRINT_BYTES; i++) {
		hex[2 * i] = digits[fp[i] >> 4];
		hex[2 * i + 1] = digits[fp[i] & 15];
	}
	hex[32] = '\0';
}
