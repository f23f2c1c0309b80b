/* test_pagecache.c — the page-cache probes against readers that know their byte counts.
 *
 * Each test writes its own small file (8 MiB) on a filesystem with O_DIRECT (TMPDIR, default
 * /tmp), evicts it from the page cache with fsync + posix_fadvise(POSIX_FADV_DONTNEED) and
 * checks with cachestat(2) that nothing of it is resident: that is exact for this one clean,
 * unmapped file, where a global drop_caches would be neither needed nor kind to other work on
 * the machine. Then a reader does O_DIRECT (pread, io_uring), buffered or mmap reads and the
 * counters must equal what the reader itself counted.
 *
 * Needs root: tests that need BPF skip, stating the reason, when the probes are unavailable.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <liburing.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pagecache.h"

#define FILE_SIZE (8u << 20)
#define ALIGN 4096u

static char test_dir[256];
static char test_file[300];

/* Byte at file offset off: position-dependent, so a misplaced read is caught. */
static unsigned char pattern_at(size_t off)
{
	return (unsigned char)((off * 2654435761u) >> 13);
}

static void write_test_file(size_t size)
{
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	snprintf(test_dir, sizeof(test_dir), "%s/moe-probes-XXXXXX", tmp);
	cr_assert_not_null(mkdtemp(test_dir), "mkdtemp %s: %s", test_dir, strerror(errno));
	cr_assert_eq(chmod(test_dir, 0755), 0); /* the `nobody` test stats the file */
	snprintf(test_file, sizeof(test_file), "%s/experts.bin", test_dir);
	int fd = open(test_file, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "%s: %s", test_file, strerror(errno));
	unsigned char *buf = malloc(1 << 20);
	cr_assert_not_null(buf);
	for (size_t done = 0; done < size;) {
		size_t n = size - done < (1u << 20) ? size - done : (1u << 20);
		for (size_t i = 0; i < n; i++)
			buf[i] = pattern_at(done + i);
		cr_assert_eq(write(fd, buf, n), (ssize_t)n);
		done += n;
	}
	free(buf);
	cr_assert_eq(fsync(fd), 0);
	cr_assert_eq(close(fd), 0);
}

static void remove_test_file(void)
{
	if (test_file[0])
		unlink(test_file);
	if (test_dir[0])
		rmdir(test_dir);
}

/* Evicts the test file's pages and proves it with cachestat. */
static void evict_test_file(void)
{
	int fd = open(test_file, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	cr_assert_eq(fdatasync(fd), 0);
	cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	close(fd);
	struct pagecache_residency r;
	struct sidecar_error err = {0};
	int rc = pagecache_residency_of(test_file, &r, &err);
	if (rc != 0 && strstr(err.msg, PAGECACHE_NO_CACHESTAT))
		return; /* kernel < 6.5: trust DONTNEED */
	cr_assert_eq(rc, 0, "%s", err.msg);
	cr_assert_eq(r.cached_bytes, 0, "%llu bytes still cached after DONTNEED",
	             (unsigned long long)r.cached_bytes);
}

static void instance_name(char *buf, size_t len, const char *test)
{
	snprintf(buf, len, "test-%d-%s", (int)getpid(), test);
}

/* Opens probes for this test or skips it with the reason. */
static struct pagecache_probes *probes_or_skip(const char *test, bool per_pid)
{
	char name[64];
	struct sidecar_error err = {0};
	instance_name(name, sizeof(name), test);
	struct pagecache_probes *p;
	struct pagecache_options opt = {.instance = name, .per_pid = per_pid, .quiet = true};
	cr_assert_eq(pagecache_open(&opt, &p, &err), 0, "%s", err.msg);
	if (!pagecache_available(p)) {
		char why[800];
		snprintf(why, sizeof(why), "%s", pagecache_status(p));
		pagecache_close(p);
		cr_skip_test("BPF probes %s", why);
	}
	return p;
}

static struct pagecache_stats read_file_stats(struct pagecache_probes *p)
{
	struct pagecache_stats s;
	cr_assert_eq(pagecache_read_file(p, test_file, &s), 0, "%s", pagecache_last_error(p));
	return s;
}

/* The i-th unaligned range of the direct tests and its aligned superset. The last one runs
 * past EOF, so its superset holds padding the file does not have. */
struct read_range {
	size_t off, len;                 /* what the caller wants */
	size_t aligned_off, aligned_len; /* what it asks the kernel for */
};

#define N_RANGES 24

static struct read_range range_at(int i, size_t size)
{
	struct read_range r;
	if (i == N_RANGES - 1) {
		r.off = size - 3000;
		r.len = 3000;
	} else {
		r.off = ((size_t)i * 1234567u + 333u) % (size - 300000);
		r.len = 1000 + ((size_t)i * 77777u) % 150000;
	}
	r.aligned_off = r.off & ~(size_t)(ALIGN - 1);
	size_t end = (r.off + r.len + ALIGN - 1) & ~(size_t)(ALIGN - 1);
	r.aligned_len = end - r.aligned_off;
	return r;
}

static void check_range_data(const unsigned char *buf, const struct read_range *r)
{
	const unsigned char *want = buf + (r->off - r->aligned_off);
	for (size_t i = 0; i < r->len; i += 997)
		cr_assert_eq(want[i], pattern_at(r->off + i), "byte %zu of the range at %zu", i,
		             r->off);
}

/* A file size that is not a multiple of the block size: the last superset pads past EOF. */
#define DIRECT_FILE_SIZE (FILE_SIZE - 1000)

Test(probes, direct_pread_counts_requested_bytes_and_fills_nothing, .fini = remove_test_file)
{
	struct pagecache_probes *p = probes_or_skip("dpread", false);
	write_test_file(DIRECT_FILE_SIZE);
	evict_test_file();
	cr_assert_eq(pagecache_watch(p, test_file), 0, "%s", pagecache_last_error(p));

	int fd = open(test_file, O_RDONLY | O_DIRECT | O_CLOEXEC);
	cr_assert_geq(fd, 0, "O_DIRECT open: %s", strerror(errno));
	unsigned char *buf = aligned_alloc(ALIGN, 256 << 10);
	cr_assert_not_null(buf);
	__u64 requested = 0;
	for (int i = 0; i < N_RANGES; i++) {
		struct read_range r = range_at(i, DIRECT_FILE_SIZE);
		ssize_t n = pread(fd, buf, r.aligned_len, (off_t)r.aligned_off);
		size_t in_file = DIRECT_FILE_SIZE - r.aligned_off;
		size_t expect = r.aligned_len < in_file ? r.aligned_len : in_file;
		cr_assert_eq(n, (ssize_t)expect, "pread at %zu: %zd (%s)", r.aligned_off, n,
		             strerror(errno));
		check_range_data(buf, &r);
		requested += r.aligned_len;
	}
	close(fd);
	free(buf);

	struct pagecache_stats s = read_file_stats(p);
	cr_expect_eq(s.raw.pagecache_fill_bytes, 0);
	cr_expect_eq(s.raw.direct_bytes, requested, "direct_bytes %llu, reader asked for %llu",
	             (unsigned long long)s.raw.direct_bytes, (unsigned long long)requested);
	cr_expect_eq(s.raw.direct_reads, N_RANGES);
	cr_expect_eq(s.raw.buffered_bytes, 0);
	cr_expect_eq(s.raw.fault_events, 0);
	cr_expect_float_eq(s.bypass_ratio, 1.0, 1e-12);
	pagecache_close(p);
}

/* Submits every range at once so that several reads are in flight. With dirty_ranges, one
 * page of each range is first rewritten (same bytes) through the page cache and left dirty:
 * io_uring's non-blocking first attempt then fails with EAGAIN (the range needs writeback) and
 * is retried from io-wq, and that retry must not be counted twice. */
static void direct_uring_reads(bool dirty_ranges)
{
	struct pagecache_probes *p =
	    probes_or_skip(dirty_ranges ? "during-dirty" : "during", false);
	write_test_file(DIRECT_FILE_SIZE);
	evict_test_file();
	if (dirty_ranges) {
		int fd = open(test_file, O_WRONLY | O_CLOEXEC);
		cr_assert_geq(fd, 0);
		for (int i = 0; i < N_RANGES; i++) {
			struct read_range r = range_at(i, DIRECT_FILE_SIZE);
			unsigned char same = pattern_at(r.off);
			cr_assert_eq(pwrite(fd, &same, 1, (off_t)r.off), 1);
		}
		close(fd);
	}
	cr_assert_eq(pagecache_watch(p, test_file), 0, "%s", pagecache_last_error(p));

	int fd = open(test_file, O_RDONLY | O_DIRECT | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	struct io_uring ring;
	cr_assert_eq(io_uring_queue_init(N_RANGES, &ring, 0), 0);
	unsigned char *bufs[N_RANGES];
	struct read_range ranges[N_RANGES];
	__u64 requested = 0, returned = 0;
	for (int i = 0; i < N_RANGES; i++) {
		ranges[i] = range_at(i, DIRECT_FILE_SIZE);
		bufs[i] = aligned_alloc(ALIGN, ranges[i].aligned_len);
		cr_assert_not_null(bufs[i]);
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
		io_uring_prep_read(sqe, fd, bufs[i], (unsigned)ranges[i].aligned_len,
		                   ranges[i].aligned_off);
		io_uring_sqe_set_data64(sqe, (__u64)i);
		requested += ranges[i].aligned_len;
	}
	cr_assert_eq(io_uring_submit(&ring), N_RANGES);
	for (int done = 0; done < N_RANGES; done++) {
		struct io_uring_cqe *cqe;
		cr_assert_eq(io_uring_wait_cqe(&ring, &cqe), 0);
		int i = (int)io_uring_cqe_get_data64(cqe);
		const struct read_range *r = &ranges[i];
		size_t in_file = DIRECT_FILE_SIZE - r->aligned_off;
		size_t expect = r->aligned_len < in_file ? r->aligned_len : in_file;
		cr_assert_eq(cqe->res, (int)expect, "read %d: res %d", i, cqe->res);
		check_range_data(bufs[i], r);
		returned += (__u64)cqe->res;
		io_uring_cqe_seen(&ring, cqe);
	}
	/* The first range twice more, one at a time: non-blocking first, then forced async
	 * (blocking in io-wq, through the recycled request of the one before). A NOWAIT attempt
	 * that succeeded must not make the later blocking read look like its retry. */
	for (int k = 0; k < 2; k++) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
		io_uring_prep_read(sqe, fd, bufs[0], (unsigned)ranges[0].aligned_len,
		                   ranges[0].aligned_off);
		if (k == 1)
			sqe->flags |= IOSQE_ASYNC;
		cr_assert_eq(io_uring_submit(&ring), 1);
		struct io_uring_cqe *cqe;
		cr_assert_eq(io_uring_wait_cqe(&ring, &cqe), 0);
		cr_assert_eq(cqe->res, (int)ranges[0].aligned_len);
		requested += ranges[0].aligned_len;
		returned += (__u64)cqe->res;
		io_uring_cqe_seen(&ring, cqe);
	}
	io_uring_queue_exit(&ring);
	for (int i = 0; i < N_RANGES; i++)
		free(bufs[i]);
	close(fd);

	struct pagecache_stats s = read_file_stats(p);
	if (dirty_ranges)
		cr_expect_gt(s.raw.direct_retries, 0,
		             "no NOWAIT attempt was retried: the dedup path "
		             "was not exercised");
	cr_expect_eq(s.raw.pagecache_fill_bytes, 0);
	cr_expect_eq(s.raw.direct_bytes, requested, "direct_bytes %llu, reader asked for %llu",
	             (unsigned long long)s.raw.direct_bytes, (unsigned long long)requested);
	cr_expect_eq(s.raw.direct_reads, N_RANGES + 2);
	cr_expect_eq(s.raw.uring_direct_bytes, returned);
	cr_expect_eq(s.raw.uring_reads, N_RANGES + 2);
	cr_expect_eq(s.raw.uring_errors, 0);
	cr_expect_eq(s.raw.buffered_bytes, 0);
	pagecache_close(p);
}

Test(probes, direct_io_uring_counts_requested_bytes_and_fills_nothing, .fini = remove_test_file)
{
	direct_uring_reads(false);
}

Test(probes, direct_io_uring_retries_after_eagain_count_once, .fini = remove_test_file)
{
	direct_uring_reads(true);
}

Test(probes, buffered_read_fills_the_file_size, .fini = remove_test_file)
{
	struct pagecache_probes *p = probes_or_skip("buffered", false);
	write_test_file(FILE_SIZE);
	evict_test_file();
	cr_assert_eq(pagecache_watch(p, test_file), 0, "%s", pagecache_last_error(p));

	int fd = open(test_file, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	unsigned char *buf = malloc(1 << 20);
	cr_assert_not_null(buf);
	/* read(), pread() and readv() over thirds of the file: every syscall the probes watch. */
	__u64 got = 0;
	ssize_t n;
	while (got < FILE_SIZE / 3 && (n = read(fd, buf, 1 << 20)) > 0)
		got += (__u64)n;
	while (got < 2 * (FILE_SIZE / 3) && (n = pread(fd, buf, 1 << 20, (off_t)got)) > 0)
		got += (__u64)n;
	for (;;) {
		struct iovec iov[2] = {{buf, 300000}, {buf + 300000, 700000}};
		n = preadv(fd, iov, 2, (off_t)got);
		cr_assert_geq(n, 0);
		if (n == 0)
			break;
		got += (__u64)n;
	}
	cr_assert_eq(got, FILE_SIZE);
	close(fd);
	free(buf);

	struct pagecache_stats s = read_file_stats(p);
	cr_expect_eq(s.raw.pagecache_fill_bytes, FILE_SIZE, "fill %llu, file %u",
	             (unsigned long long)s.raw.pagecache_fill_bytes, FILE_SIZE);
	cr_expect_gt(s.raw.pagecache_fill_events, 0);
	cr_expect_eq(s.raw.buffered_bytes, FILE_SIZE);
	cr_expect_gt(s.raw.get_pages_events, 0);
	cr_expect_eq(s.raw.direct_bytes, 0);
	cr_expect_float_eq(s.bypass_ratio, 0.0, 1e-12);

	struct pagecache_residency r;
	struct sidecar_error err = {0};
	if (pagecache_residency_of(test_file, &r, &err) == 0)
		cr_expect_eq(r.cached_bytes, FILE_SIZE, "cachestat: %llu bytes resident",
		             (unsigned long long)r.cached_bytes);
	pagecache_close(p);
}

Test(probes, mmap_touch_fills_the_file_size_and_faults, .fini = remove_test_file)
{
	struct pagecache_probes *p = probes_or_skip("mmap", false);
	write_test_file(FILE_SIZE);
	evict_test_file();
	cr_assert_eq(pagecache_watch(p, test_file), 0, "%s", pagecache_last_error(p));

	int fd = open(test_file, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	unsigned char *map = mmap(NULL, FILE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
	cr_assert_neq(map, MAP_FAILED, "mmap: %s", strerror(errno));
	long page = sysconf(_SC_PAGESIZE);
	for (size_t off = 0; off < FILE_SIZE; off += (size_t)page)
		cr_assert_eq(((volatile unsigned char *)map)[off], pattern_at(off));
	munmap(map, FILE_SIZE);
	close(fd);

	struct pagecache_stats s = read_file_stats(p);
	cr_expect_eq(s.raw.pagecache_fill_bytes, FILE_SIZE, "fill %llu, file %u",
	             (unsigned long long)s.raw.pagecache_fill_bytes, FILE_SIZE);
	cr_expect_gt(s.raw.fault_events, 0);
	cr_expect_eq(s.fault_bytes, s.raw.fault_events * (__u64)page);
	cr_expect_eq(s.raw.direct_bytes, 0);
	cr_expect_eq(s.raw.buffered_bytes, 0);
	pagecache_close(p);
}

static const char *bpftool_path(void)
{
	static const char *const candidates[] = {"/usr/sbin/bpftool", "/sbin/bpftool",
	                                         "/usr/local/sbin/bpftool", "/usr/bin/bpftool"};
	for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++)
		if (access(candidates[i], X_OK) == 0)
			return candidates[i];
	return NULL;
}

/* The unsigned number after "name": at or after from in json; fails the test if absent. */
static unsigned long long json_u64_after(const char *json, const char *from, const char *name)
{
	char needle[80];
	snprintf(needle, sizeof(needle), "\"%s\":", name);
	const char *at = strstr(from, needle);
	cr_assert_not_null(at, "bpftool JSON has no field %s: %.400s", name, json);
	return strtoull(at + strlen(needle), NULL, 10);
}

Test(probes, bpftool_dump_of_pinned_counters_matches_the_library, .fini = remove_test_file)
{
	const char *bpftool = bpftool_path();
	if (!bpftool)
		cr_skip_test("bpftool is not installed");
	struct pagecache_probes *p = probes_or_skip("bpftool", false);
	write_test_file(FILE_SIZE);
	evict_test_file();
	cr_assert_eq(pagecache_watch(p, test_file), 0, "%s", pagecache_last_error(p));
	int fd = open(test_file, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	char buf[65536];
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	close(fd);

	char cmd[512];
	snprintf(cmd, sizeof(cmd), "%s -j map dump pinned %s/counters", bpftool,
	         pagecache_pin_dir(p));
	FILE *out = popen(cmd, "r");
	cr_assert_not_null(out);
	static char json[1 << 16];
	size_t n = fread(json, 1, sizeof(json) - 1, out);
	json[n] = '\0';
	cr_assert_eq(pclose(out), 0, "%s failed: %s", cmd, json);

	struct pagecache_stats s = read_file_stats(p);
	struct pagecache_file_key key;
	cr_assert_eq(pagecache_file_key_of(test_file, &key, NULL), 0);
	char ino[64];
	snprintf(ino, sizeof(ino), "\"ino\":%llu", (unsigned long long)key.ino);
	const char *entry = strstr(json, ino);
	cr_assert_not_null(entry, "no entry for ino %llu in: %.400s", (unsigned long long)key.ino,
	                   json);
	cr_expect_eq(json_u64_after(json, entry, "dev"), key.dev);
	const struct {
		const char *name;
		__u64 value;
	} fields[] = {
	    {"pagecache_fill_bytes", s.raw.pagecache_fill_bytes},
	    {"pagecache_fill_events", s.raw.pagecache_fill_events},
	    {"direct_bytes", s.raw.direct_bytes},
	    {"direct_reads", s.raw.direct_reads},
	    {"direct_retries", s.raw.direct_retries},
	    {"buffered_bytes", s.raw.buffered_bytes},
	    {"buffered_reads", s.raw.buffered_reads},
	    {"get_pages_events", s.raw.get_pages_events},
	    {"fault_events", s.raw.fault_events},
	    {"map_pages_events", s.raw.map_pages_events},
	    {"uring_direct_bytes", s.raw.uring_direct_bytes},
	    {"uring_buffered_bytes", s.raw.uring_buffered_bytes},
	    {"uring_reads", s.raw.uring_reads},
	    {"uring_errors", s.raw.uring_errors},
	};
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
		cr_expect_eq(json_u64_after(json, entry, fields[i].name), fields[i].value,
		             "%s: bpftool %llu, library %llu", fields[i].name,
		             json_u64_after(json, entry, fields[i].name),
		             (unsigned long long)fields[i].value);
	cr_expect_eq(s.raw.pagecache_fill_bytes, FILE_SIZE); /* the dump saw real traffic */
	pagecache_close(p);
}

Test(probes, per_pid_counters_attribute_reads_to_each_process, .fini = remove_test_file)
{
	struct pagecache_probes *p = probes_or_skip("perpid", true);
	write_test_file(FILE_SIZE);
	evict_test_file();
	cr_assert_eq(pagecache_watch(p, test_file), 0, "%s", pagecache_last_error(p));
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) { /* reads half the file: counted against its own tgid */
		int fd = open(test_file, O_RDONLY | O_CLOEXEC);
		char buf[65536];
		for (size_t got = 0; fd >= 0 && got < FILE_SIZE / 2; got += sizeof(buf))
			if (read(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
				_exit(1);
		_exit(0);
	}
	int status;
	cr_assert_eq(waitpid(child, &status, 0), child);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	int fd = open(test_file, O_RDONLY | O_CLOEXEC);
	char buf[65536];
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	close(fd);

	struct pagecache_stats mine, theirs, total;
	cr_assert_eq(pagecache_read_pid(p, test_file, (__u32)getpid(), &mine), 0, "%s",
	             pagecache_last_error(p));
	cr_assert_eq(pagecache_read_pid(p, test_file, (__u32)child, &theirs), 0, "%s",
	             pagecache_last_error(p));
	total = read_file_stats(p);
	cr_expect_eq(theirs.raw.buffered_bytes, FILE_SIZE / 2);
	cr_expect_eq(mine.raw.buffered_bytes, FILE_SIZE);
	/* Each page is filled once, by whichever process got there first (readahead included). */
	cr_expect_geq(theirs.raw.pagecache_fill_bytes, FILE_SIZE / 2);
	cr_expect_eq(mine.raw.pagecache_fill_bytes + theirs.raw.pagecache_fill_bytes, FILE_SIZE);
	cr_expect_eq(total.raw.buffered_bytes, FILE_SIZE + FILE_SIZE / 2);
	cr_expect_eq(total.raw.pagecache_fill_bytes, FILE_SIZE);
	pagecache_close(p);
}

Test(probes, unprivileged_child_gets_one_warning_and_unavailable, .fini = remove_test_file)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to drop to nobody");
	struct passwd *nobody = getpwnam("nobody");
	if (!nobody)
		cr_skip_test("no user 'nobody'");
	write_test_file(FILE_SIZE / 8);
	int err_pipe[2];
	cr_assert_eq(pipe(err_pipe), 0);
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		dup2(err_pipe[1], STDERR_FILENO);
		close(err_pipe[0]);
		if (setgroups(0, NULL) || setgid(nobody->pw_gid) || setuid(nobody->pw_uid))
			_exit(10);
		char name[64];
		struct sidecar_error err = {0};
		instance_name(name, sizeof(name), "nobody");
		struct pagecache_probes *p;
		struct pagecache_options opt = {.instance = name};
		if (pagecache_open(&opt, &p, &err) != 0)
			_exit(11);
		if (pagecache_available(p))
			_exit(12);
		if (strncmp(pagecache_status(p), "unavailable: ", 13) != 0)
			_exit(13);
		if (pagecache_watch(p, test_file) != 0)
			_exit(14);
		struct pagecache_stats s;
		if (pagecache_read_file(p, test_file, &s) != 0 || s.raw.pagecache_fill_bytes)
			_exit(15);
		if (pagecache_read_totals(p, &s) != 0 || pagecache_unwatch(p, test_file) != 0)
			_exit(16);
		pagecache_close(p);
		_exit(0);
	}
	close(err_pipe[1]);
	char log[4096];
	size_t n = 0;
	ssize_t got;
	while (n < sizeof(log) - 1 && (got = read(err_pipe[0], log + n, sizeof(log) - 1 - n)) > 0)
		n += (size_t)got;
	log[n] = '\0';
	close(err_pipe[0]);
	int status;
	cr_assert_eq(waitpid(child, &status, 0), child);
	cr_assert(WIFEXITED(status), "the unprivileged child crashed (status %d)", status);
	cr_assert_eq(WEXITSTATUS(status), 0, "child check %d failed; its log: %s",
	             WEXITSTATUS(status), log);
	int lines = 0;
	for (const char *c = log; *c; c++)
		lines += *c == '\n';
	cr_expect_eq(lines, 1, "expected one warning line, got: %s", log);
	cr_expect(strstr(log, "warn") && strstr(log, "unavailable: "), "log: %s", log);
	/* What loading needs is CAP_BPF + CAP_PERFMON; CAP_SYS_ADMIN only mounts. */
	cr_expect(strstr(log, "(needs root, or CAP_BPF + CAP_PERFMON; CAP_SYS_ADMIN only to mount "
	                      "bpffs or tracefs where they are not mounted)"),
	          "log: %s", log);
	cr_expect_not(strstr(log, "CAP_PERFMON + CAP_SYS_ADMIN"), "log: %s", log);
}

static bool exists(const char *dir, const char *name)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return access(path, F_OK) == 0;
}

Test(probes, pins_are_private_and_removed_on_close)
{
	struct pagecache_probes *p = probes_or_skip("pins", false);
	char dir[256];
	snprintf(dir, sizeof(dir), "%s", pagecache_pin_dir(p));
	cr_assert(strstr(dir, "/sys/fs/bpf/moe-sidecar/test-"), "pin dir %s", dir);
	const char *const pins[] = {"counters", "pid_counters", "info", "links/page_cache_fill",
	                            "links/direct_read_begin"};
	for (size_t i = 0; i < sizeof(pins) / sizeof(pins[0]); i++) {
		char path[512];
		snprintf(path, sizeof(path), "%s/%s", dir, pins[i]);
		struct stat st;
		cr_assert_eq(stat(path, &st), 0, "%s: %s", path, strerror(errno));
		cr_expect_eq(st.st_mode & 0777, 0600, "%s has mode %o", path, st.st_mode & 0777);
	}
	pagecache_close(p);
	struct stat st;
	cr_expect_neq(stat(dir, &st), 0, "%s still exists after close", dir);
}

Test(probes, live_instance_is_not_taken_over)
{
	struct pagecache_probes *owner = probes_or_skip("live", false);
	char name[64], want[64];
	struct sidecar_error err = {0};
	instance_name(name, sizeof(name), "live");
	struct pagecache_probes *second;
	struct pagecache_options opt = {.instance = name, .quiet = true};
	cr_assert_eq(pagecache_open(&opt, &second, &err), 0, "%s", err.msg);
	cr_expect_not(pagecache_available(second));
	snprintf(want, sizeof(want), "in use by pid %d", (int)getpid());
	cr_expect(strstr(pagecache_status(second), want), "status: %s", pagecache_status(second));
	pagecache_close(second);
	cr_expect(exists(pagecache_pin_dir(owner), "counters"), "the loser removed the pins");
	pagecache_close(owner);
}

/* A child opens an instance, reports, and is killed without closing (its pins stay). */
static pid_t leave_stale_instance(const char *name)
{
	int ready[2];
	cr_assert_eq(pipe(ready), 0);
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		struct pagecache_probes *p;
		struct pagecache_options opt = {
		    .instance = name, .quiet = true, .stale_grace_s = -1};
		char ok = pagecache_open(&opt, &p, NULL) == 0 && pagecache_available(p) ? 'y' : 'n';
		if (write(ready[1], &ok, 1) != 1)
			_exit(1);
		pause(); /* killed without closing: its pins stay behind */
		_exit(0);
	}
	close(ready[1]);
	char ok = 0;
	cr_assert_eq(read(ready[0], &ok, 1), 1);
	close(ready[0]);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	cr_assert_eq(ok, 'y', "the child could not open the probes");
	return child;
}

Test(probes, stale_pins_of_a_killed_instance_are_replaced, .fini = remove_test_file)
{
	struct pagecache_probes *probe = probes_or_skip("stale-check", false);
	pagecache_close(probe); /* BPF works here; now the real test */
	char name[64];
	struct sidecar_error err = {0};
	instance_name(name, sizeof(name), "stale");
	const pid_t child = leave_stale_instance(name);
	char dir[256];
	snprintf(dir, sizeof(dir), "/sys/fs/bpf/moe-sidecar/%s", name);
	cr_assert(exists(dir, "info") && exists(dir, "links/page_cache_fill"),
	          "the killed instance left no pins in %s", dir);

	struct pagecache_probes *p;
	struct pagecache_options opt = {.instance = name, .quiet = true};
	cr_assert_eq(pagecache_open(&opt, &p, &err), 0, "%s", err.msg);
	cr_assert(pagecache_available(p), "%s", pagecache_status(p));
	cr_expect_eq(pagecache_replaced_stale_pid(p), child);
	/* The replacement counts. */
	write_test_file(FILE_SIZE / 8);
	evict_test_file();
	cr_assert_eq(pagecache_watch(p, test_file), 0, "%s", pagecache_last_error(p));
	int fd = open(test_file, O_RDONLY | O_CLOEXEC);
	char buf[65536];
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	close(fd);
	struct pagecache_stats s = read_file_stats(p);
	cr_expect_eq(s.raw.pagecache_fill_bytes, FILE_SIZE / 8);
	pagecache_close(p);
	cr_expect_not(exists(dir, "info"));
}

/* A child opens an instance and is killed without closing; it is left a zombie (not reaped:
 * waitid WNOWAIT returns once it has exited), as a sidecar killed with -9 is until its
 * supervisor reaps it. Its flock is gone, its /proc/<pid>/stat (start time included) is not. */
static pid_t leave_zombie_instance(const char *name)
{
	int ready[2];
	cr_assert_eq(pipe(ready), 0);
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		struct pagecache_probes *p;
		struct pagecache_options opt = {
		    .instance = name, .quiet = true, .stale_grace_s = -1};
		char ok = pagecache_open(&opt, &p, NULL) == 0 && pagecache_available(p) ? 'y' : 'n';
		if (write(ready[1], &ok, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	close(ready[1]);
	char ok = 0;
	cr_assert_eq(read(ready[0], &ok, 1), 1);
	close(ready[0]);
	kill(child, SIGKILL);
	siginfo_t si;
	cr_assert_eq(waitid(P_PID, (id_t)child, &si, WEXITED | WNOWAIT), 0);
	cr_assert_eq(ok, 'y', "the child could not open the probes");
	return child;
}

Test(probes, a_zombie_owner_is_dead_and_its_instance_is_taken_back)
{
	struct pagecache_probes *probe = probes_or_skip("zombie-check", false);
	pagecache_close(probe);
	char name[64];
	struct sidecar_error err = {0};
	instance_name(name, sizeof(name), "zombie");
	const pid_t child = leave_zombie_instance(name);
	struct pagecache_probes *p;
	struct pagecache_options opt = {.instance = name, .quiet = true, .stale_grace_s = -1};
	int rc = pagecache_open(&opt, &p, &err);
	waitpid(child, NULL, 0);
	cr_assert_eq(rc, 0, "%s", err.msg);
	cr_expect(pagecache_available(p), "a restart could not take back its probes: %s",
	          pagecache_status(p));
	cr_expect_eq(pagecache_replaced_stale_pid(p), child);
	pagecache_close(p);
}

Test(probes, the_sweep_removes_pins_of_a_zombie_owner)
{
	struct pagecache_probes *probe = probes_or_skip("zombie-sweep-check", false);
	pagecache_close(probe);
	char old_name[64], dir_old[256], name[64];
	struct sidecar_error err = {0};
	instance_name(old_name, sizeof(old_name), "zombie-old");
	snprintf(dir_old, sizeof(dir_old), "/sys/fs/bpf/moe-sidecar/%s", old_name);
	const pid_t child = leave_zombie_instance(old_name);
	const struct timespec aged[2] = {{.tv_sec = time(NULL) - 3600, .tv_nsec = 0},
	                                 {.tv_sec = time(NULL) - 3600, .tv_nsec = 0}};
	cr_assert_eq(utimensat(AT_FDCWD, dir_old, aged, 0), 0, "%s: %s", dir_old, strerror(errno));
	struct pagecache_probes *p;
	instance_name(name, sizeof(name), "zombie-sweeper");
	struct pagecache_options opt = {.instance = name, .quiet = true, .stale_grace_s = 600};
	int rc = pagecache_open(&opt, &p, &err);
	waitpid(child, NULL, 0);
	cr_assert_eq(rc, 0, "%s", err.msg);
	cr_assert(pagecache_available(p), "%s", pagecache_status(p));
	struct stat st;
	cr_expect_neq(stat(dir_old, &st), 0, "pins of a zombie owner survived the sweep");
	pagecache_close(p);
}

/* An owner still exiting holds its flock. Made deterministic: the child's main thread exits
 * (the thread-group leader becomes a zombie, PF_EXITING) while a second thread keeps the
 * files — and so the lock — until the test has seen the opener say it is waiting. */
struct exiting_owner {
	int ready[2], release[2];
	pthread_t leader;
};

static void *keep_files_until_released(void *arg)
{
	struct exiting_owner *o = arg;
	char c;
	/* Joined: the leader is in do_exit (PF_EXITING) and past releasing its tid. */
	if (pthread_join(o->leader, NULL) != 0 || write(o->ready[1], "R", 1) != 1)
		_exit(1);
	while (read(o->release[0], &c, 1) > 0)
		;
	_exit(0); /* the last thread: the process ends, its lock with it */
}

struct log_watch {
	int fd; /* read end of the pipe stderr goes to */
	int release_fd;
	bool seen;
};

static void *release_when_waiting(void *arg)
{
	struct log_watch *w = arg;
	static char text[16384];
	size_t have = 0;
	for (ssize_t n; (n = read(w->fd, text + have, sizeof(text) - 1 - have)) > 0;) {
		have += (size_t)n;
		text[have] = '\0';
		if (!w->seen && strstr(text, "which is exiting: waiting")) {
			w->seen = true;
			close(w->release_fd); /* the owner's last thread may go now */
		}
	}
	if (!w->seen)
		close(w->release_fd);
	return NULL;
}

Test(probes, an_exiting_owner_holding_the_lock_is_waited_for)
{
	struct pagecache_probes *probe = probes_or_skip("exiting-check", false);
	pagecache_close(probe);
	char name[64];
	struct sidecar_error err = {0};
	instance_name(name, sizeof(name), "exiting");
	struct exiting_owner o;
	cr_assert_eq(pipe(o.ready), 0);
	cr_assert_eq(pipe(o.release), 0);
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		close(o.release[1]);
		struct pagecache_probes *p;
		struct pagecache_options opt = {
		    .instance = name, .quiet = true, .stale_grace_s = -1};
		if (pagecache_open(&opt, &p, NULL) != 0 || !pagecache_available(p))
			_exit(1);
		/* The keeper's copy outlives the leader's frame (under ASan, a fake stack that
		 * goes with the leader's exit). */
		static struct exiting_owner kept;
		kept = o;
		kept.leader = pthread_self();
		pthread_t keeper;
		if (pthread_create(&keeper, NULL, keep_files_until_released, &kept) != 0)
			_exit(1);
		pthread_exit(NULL); /* the leader exits; the keeper holds the files */
	}
	close(o.release[0]);
	close(o.ready[1]);
	char r = 0;
	cr_assert_eq(read(o.ready[0], &r, 1), 1, "the owner did not start");
	close(o.ready[0]);

	int logpipe[2];
	cr_assert_eq(pipe(logpipe), 0);
	struct log_watch w = {.fd = logpipe[0], .release_fd = o.release[1]};
	pthread_t watcher;
	cr_assert_eq(pthread_create(&watcher, NULL, release_when_waiting, &w), 0);
	int saved = dup(2);
	dup2(logpipe[1], 2);
	close(logpipe[1]);
	struct pagecache_probes *p;
	struct pagecache_options opt = {.instance = name, .stale_grace_s = -1};
	int rc = pagecache_open(&opt, &p, &err);
	dup2(saved, 2); /* the watcher sees EOF */
	close(saved);
	pthread_join(watcher, NULL);
	close(logpipe[0]);
	int st;
	waitpid(child, &st, 0);
	cr_assert_eq(rc, 0, "%s", err.msg);
	cr_expect(w.seen, "the opener did not say it waits for the exiting owner");
	cr_expect(pagecache_available(p), "%s", pagecache_status(p));
	pagecache_close(p);
}

/* Another instance's open removes a crashed instance's pins once they are older than the
 * grace period (here aged by setting the directory's mtime back), and leaves a fresh one. */
Test(probes, other_instances_stale_pins_are_swept_after_the_grace_period)
{
	struct pagecache_probes *probe = probes_or_skip("sweep-check", false);
	pagecache_close(probe);
	char old_name[64], fresh_name[64], dir_old[256], dir_fresh[256];
	struct sidecar_error err = {0};
	instance_name(old_name, sizeof(old_name), "sweep-old");
	instance_name(fresh_name, sizeof(fresh_name), "sweep-fresh");
	snprintf(dir_old, sizeof(dir_old), "/sys/fs/bpf/moe-sidecar/%s", old_name);
	snprintf(dir_fresh, sizeof(dir_fresh), "/sys/fs/bpf/moe-sidecar/%s", fresh_name);
	leave_stale_instance(old_name);
	leave_stale_instance(fresh_name);
	cr_assert(exists(dir_old, "links/page_cache_fill") && exists(dir_fresh, "info"));
	const struct timespec aged[2] = {{.tv_sec = time(NULL) - 3600, .tv_nsec = 0},
	                                 {.tv_sec = time(NULL) - 3600, .tv_nsec = 0}};
	cr_assert_eq(utimensat(AT_FDCWD, dir_old, aged, 0), 0, "%s: %s", dir_old, strerror(errno));

	struct pagecache_probes *p;
	char name[64];
	instance_name(name, sizeof(name), "sweeper");
	struct pagecache_options opt = {.instance = name, .quiet = true, .stale_grace_s = 600};
	cr_assert_eq(pagecache_open(&opt, &p, &err), 0, "%s", err.msg);
	cr_assert(pagecache_available(p), "%s", pagecache_status(p));
	struct stat st;
	cr_expect_neq(stat(dir_old, &st), 0, "%s survived the sweep", dir_old);
	cr_expect(exists(dir_fresh, "info"), "a stale instance inside the grace period was swept");
	pagecache_close(p);

	/* The fresh one is still replaced by its own name's next open, as before. */
	struct pagecache_options again = {
	    .instance = fresh_name, .quiet = true, .stale_grace_s = -1};
	cr_assert_eq(pagecache_open(&again, &p, &err), 0, "%s", err.msg);
	cr_expect(pagecache_available(p), "%s", pagecache_status(p));
	pagecache_close(p);
	cr_expect_neq(stat(dir_fresh, &st), 0, "%s left after its owner closed", dir_fresh);
}

Test(probes, watch_unwatch_and_totals, .fini = remove_test_file)
{
	struct pagecache_probes *p = probes_or_skip("watch", false);
	write_test_file(FILE_SIZE / 8);
	evict_test_file();
	cr_assert_eq(pagecache_watch(p, test_file), 0);
	cr_assert_eq(pagecache_watch(p, test_file), 0, "watching twice is a no-op");
	cr_expect_eq(pagecache_watch(p, test_dir), -EINVAL);
	cr_expect(strstr(pagecache_last_error(p), "not a regular file"), "%s",
	          pagecache_last_error(p));
	int fd = open(test_file, O_RDONLY | O_CLOEXEC);
	char buf[65536];
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	close(fd);
	struct pagecache_stats total;
	cr_assert_eq(pagecache_read_totals(p, &total), 0);
	cr_expect_eq(total.raw.buffered_bytes, FILE_SIZE / 8);
	cr_assert_eq(pagecache_unwatch(p, test_file), 0);
	cr_expect_eq(pagecache_unwatch(p, test_file), -ENOENT);
	struct pagecache_stats s;
	cr_expect_eq(pagecache_read_file(p, test_file, &s), -ENOENT);
	cr_assert_eq(pagecache_read_totals(p, &total), 0);
	cr_expect_eq(total.raw.buffered_bytes, 0, "unwatched files leave the totals");
	/* Watching again starts from zero. */
	cr_assert_eq(pagecache_watch(p, test_file), 0);
	s = read_file_stats(p);
	cr_expect_eq(s.raw.buffered_bytes, 0);
	pagecache_close(p);
}

/* Tests that need no BPF. */

Test(probes_api, file_key_uses_the_kernel_dev_encoding, .fini = remove_test_file)
{
	write_test_file(ALIGN);
	struct stat st;
	cr_assert_eq(stat(test_file, &st), 0);
	struct pagecache_file_key key;
	struct sidecar_error err = {0};
	cr_assert_eq(pagecache_file_key_of(test_file, &key, &err), 0, "%s", err.msg);
	cr_expect_eq(key.ino, st.st_ino);
	cr_expect_eq(key.dev >> 20, major(st.st_dev));
	cr_expect_eq(key.dev & 0xfffff, minor(st.st_dev));
	cr_expect_eq(key.pad, 0);
	cr_expect_eq(pagecache_file_key_of("/nonexistent/model.gguf", &key, &err), -1);
	cr_expect_eq(err.status, MOE_ESYS);
	cr_expect(strstr(err.msg, "/nonexistent/model.gguf: No such file"), "%s", err.msg);
	cr_expect_eq(pagecache_file_key_of(test_dir, &key, &err), -1);
	cr_expect_eq(err.status, MOE_EINVAL);
	cr_expect(strstr(err.msg, "not a regular file"), "%s", err.msg);
}

Test(probes_api, hostile_instance_names_are_rejected)
{
	const char *const bad[] = {
	    "",          ".",
	    "..",        "../escape",
	    "a/b",       "sp ace",
	    "new\nline", "0123456789012345678901234567890123456789012345678901234567890123456789"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct pagecache_probes *p = (void *)1;
		struct sidecar_error err = {0};
		struct pagecache_options opt = {.instance = bad[i], .quiet = true};
		cr_expect_eq(pagecache_open(&opt, &p, &err), -1, "'%s'", bad[i]);
		cr_expect_eq(err.status, MOE_EINVAL, "'%s'", bad[i]);
		cr_expect_null(p);
		cr_expect(strstr(err.msg, "instance name"), "'%s': %s", bad[i], err.msg);
	}
}

Test(probes_api, residency_of_a_missing_file_names_it)
{
	struct pagecache_residency r;
	struct sidecar_error err = {0};
	cr_expect_eq(pagecache_residency_of("/nonexistent/x.safetensors", &r, &err), -1);
	cr_expect_eq(err.status, MOE_ESYS);
	cr_expect(strstr(err.msg, "/nonexistent/x.safetensors: No such file"), "%s", err.msg);
}

Test(probes_api, bypass_ratio_is_direct_over_all_bytes_read)
{
	struct pagecache_stats s = {0};
	pagecache_stats_derive(&s, 4096);
	cr_expect(s.bypass_ratio != s.bypass_ratio, "NaN before any read");
	s.raw.direct_bytes = 3 << 20;
	s.raw.buffered_bytes = 1 << 20;
	s.raw.fault_events = 256; /* 1 MiB */
	pagecache_stats_derive(&s, 4096);
	cr_expect_eq(s.fault_bytes, 1 << 20);
	cr_expect_float_eq(s.bypass_ratio, 0.6, 1e-12);
}

Test(probes, pins_never_follow_a_planted_symlink)
{
	struct pagecache_probes *check = probes_or_skip("symlink-check", false);
	pagecache_close(check); /* BPF works; the pin root may be gone again */
	mkdir("/sys/fs/bpf/moe-sidecar", 0700);
	char name[64], link[256];
	struct sidecar_error err = {0};
	instance_name(name, sizeof(name), "symlink");
	snprintf(link, sizeof(link), "/sys/fs/bpf/moe-sidecar/%s", name);
	cr_assert_eq(symlink("/sys/fs/bpf", link), 0, "symlink %s: %s", link, strerror(errno));
	struct pagecache_probes *p;
	struct pagecache_options opt = {.instance = name, .quiet = true};
	int rc = pagecache_open(&opt, &p, &err);
	bool available = rc == 0 && pagecache_available(p);
	char status[800] = "";
	if (rc == 0)
		snprintf(status, sizeof(status), "%s", pagecache_status(p));
	pagecache_close(p);
	unlink(link);
	rmdir("/sys/fs/bpf/moe-sidecar");
	cr_assert_eq(rc, 0, "%s", err.msg);
	cr_expect_not(available, "pinned through a symlink");
	cr_expect(strstr(status, "refusing"), "status: %s", status);
}
