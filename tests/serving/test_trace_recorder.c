/* test_trace_recorder.c — the recorder on a file that stops taking bytes. RLIMIT_FSIZE makes
 * writes fail with EFBIG past a size, as a full disk fails them with ENOSPC, with no root and
 * no mount: the file ends with its last whole line, its size is the byte count the recorder
 * reports, and the recording stops. */
#include <criterion/criterion.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace.h"
#include "trace_recorder.h"

#define FILE_LIMIT 3000

Test(trace_recorder, a_failed_write_cuts_the_file_back_to_its_last_whole_line)
{
	char dir[] = "/tmp/moe-recorder-XXXXXX", path[64];
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/limited.trace", dir);
	/* Criterion runs each test in a process of its own: the limit ends with it. */
	cr_assert_neq(signal(SIGXFSZ, SIG_IGN), SIG_ERR);
	struct rlimit rl;
	cr_assert_eq(getrlimit(RLIMIT_FSIZE, &rl), 0);
	rl.rlim_cur = FILE_LIMIT;
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);

	struct sidecar_error err = {0};
	const int fd = trace_recorder_open(path, &err);
	cr_assert_geq(fd, 0, "%s", err.msg);
	const struct trace_recorder_config cfg = {
	    .path = path,
	    .fd = fd,
	    .max_bytes = 1 << 20,
	    .n_layers = 4,
	    .n_experts = 64,
	    .top_k = 8,
	    .max_tokens = 16,
	};
	struct trace_recorder *t;
	cr_assert_eq(trace_recorder_create(&cfg, &t, &err), 0, "%s", err.msg);
	cr_assert_eq(close(fd), 0, "the recorder keeps a descriptor of its own");
	/* 100 FORWARDs of 16 tokens × 8 ids: ~1600 lines of ~60 bytes, far past the limit. */
	int32_t ids[16 * 8];
	float w[16 * 8];
	for (uint32_t i = 0; i < 100; i++) {
		for (uint32_t r = 0; r < 16; r++)
			for (uint32_t j = 0; j < 8; j++) {
				ids[r * 8 + j] =
				    (int32_t)((i + r + j * 8) % 64); /* distinct per row */
				w[r * 8 + j] = 1.0f + (float)j;
			}
		trace_recorder_add(t, i % 4, 16, 8, ids, w);
	}
	struct trace_recorder_stats st;
	do { /* the writer must hit the limit: the records are far past it */
		sched_yield();
		trace_recorder_stats(t, &st);
	} while (!st.stopped);
	trace_recorder_destroy(t);

	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0);
	cr_expect_leq(sb.st_size, FILE_LIMIT);
	cr_expect_gt(sb.st_size, FILE_LIMIT - 100, "cut further back than the last whole line");
	cr_expect_eq(st.bytes, (uint64_t)sb.st_size, "the count says %llu bytes, the file has %lld",
	             (unsigned long long)st.bytes, (long long)sb.st_size);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	char last = 0;
	cr_assert_eq(fseek(f, -1, SEEK_END), 0);
	cr_assert_eq(fread(&last, 1, 1, f), 1);
	fclose(f);
	cr_expect_eq(last, '\n', "the file ends mid-line");
	struct routing_trace tr;
	cr_assert_eq(trace_load(path, &tr, &err), 0, "%s", err.msg);
	cr_expect_eq(tr.n_lines, st.lines, "the line count is the file's");
	trace_free(&tr);
	unlink(path);
	rmdir(dir);
}
