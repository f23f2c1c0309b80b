/* model_files.h — helpers shared by the format tests: scratch directories, reading an
 * extent back from a model file, removing a generated model. Header-only (static). */
#ifndef MOE_TEST_MODEL_FILES_H
#define MOE_TEST_MODEL_FILES_H

#define _XOPEN_SOURCE 700
#include <criterion/criterion.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "catalog.h"

/* A fresh directory under /tmp; the caller removes it with remove_tree. */
static inline char *scratch_dir(void)
{
	char tmpl[] = "/tmp/moe-formats-XXXXXX";
	char *d = mkdtemp(tmpl);
	cr_assert_not_null(d, "mkdtemp failed");
	return strdup(d);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static inline void remove_tree(char *dir)
{
	nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
	free(dir);
}

/* The bytes of an extent, read with pread from the catalog's file (malloc'd). */
static inline void *read_extent(const struct moe_catalog *cat, const struct moe_extent *x)
{
	cr_assert_lt(x->file, cat->n_files);
	cr_assert_leq(x->offset + x->length, cat->files[x->file].size, "extent past EOF");
	void *buf = malloc(x->length ? x->length : 1);
	int fd = open(cat->files[x->file].path, O_RDONLY);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, buf, x->length, (off_t)x->offset), (ssize_t)x->length);
	close(fd);
	return buf;
}

static inline void write_file(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	cr_assert_eq(fwrite(data, 1, n, f), n);
	cr_assert_eq(fclose(f), 0);
}

static inline char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	buf[n] = '\0';
	*len = (size_t)n;
	return buf;
}

#endif
