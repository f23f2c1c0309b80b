/* fuzz_file.h — gives a fuzz input a path: the readers take paths (they pread bounded
 * windows), so each input is written to one memfd reused across runs. fuzz_input_link also
 * gives it a name with a chosen suffix (the catalog picks the reader by ".gguf"), through a
 * symlink in /tmp to /proc/PID/fd/N that is removed at exit. */
#ifndef MOE_FUZZ_FILE_H
#define MOE_FUZZ_FILE_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static int fuzz_fd = -1;
static char fuzz_fd_path[64], fuzz_link[96];

static void fuzz_unlink(void)
{
	if (fuzz_link[0])
		unlink(fuzz_link);
}

static inline const char *fuzz_input_path(const uint8_t *data, size_t size)
{
	if (fuzz_fd < 0) {
		fuzz_fd = memfd_create("fuzz-input", MFD_CLOEXEC);
		if (fuzz_fd < 0)
			abort();
		snprintf(fuzz_fd_path, sizeof(fuzz_fd_path), "/proc/%d/fd/%d", (int)getpid(),
		         fuzz_fd);
	}
	if (ftruncate(fuzz_fd, 0) || pwrite(fuzz_fd, data, size, 0) != (ssize_t)size)
		abort();
	return fuzz_fd_path;
}

static inline const char *fuzz_input_link(const uint8_t *data, size_t size, const char *suffix)
{
	const char *target = fuzz_input_path(data, size);
	if (!fuzz_link[0]) {
		snprintf(fuzz_link, sizeof(fuzz_link), "/tmp/moe-fuzz-%d%s", (int)getpid(), suffix);
		unlink(fuzz_link);
		if (symlink(target, fuzz_link))
			abort();
		atexit(fuzz_unlink);
	}
	return fuzz_link;
}

#endif
