/* test_serve_leases.c — expert leases (serve --leases) from the engine's side: the leased
 * matrices are the model file's rows in every format (through moe_lease_deinterleave where the
 * sidecar keeps the decode layout), a leased expert survives a budget that evicts everything
 * else, a cold lease loads, a killed client's leases are freed, the pool mapping cannot be
 * written, hostile requests are refused with their reason, and STATS counts it all — on one
 * pool, and (split_*) on a sidecar that splits each expert's rows over two synthetic NUMA
 * nodes, one pool each (ABI 1.4 slices). */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moe_kernels.h"
#include "serve_fixture.h"

static const char *const with_leases[] = {"--leases", NULL};
/* Two NUMA nodes of one core each: every expert's rows split over two pools. */
#define SPLIT_ARGS "--threads", "2", "--numa", "synthetic:pack:1 numa:2 core:1 pu:1"

/* extra, with the split's arguments after it when split; buf holds up to 16 words. */
static const char *const *with_split(const char *const *extra, bool split, const char **buf)
{
	size_t n = 0;
	for (; extra && extra[n]; n++)
		buf[n] = extra[n];
	if (split) {
		static const char *const more[] = {SPLIT_ARGS};
		for (size_t i = 0; i < 4; i++)
			buf[n++] = more[i];
	}
	buf[n] = NULL;
	return buf;
}

static int32_t moe_layer(const struct served *s)
{
	return (int32_t)moe_info(s->c)->first_moe_layer;
}

/* served_start with the split's arguments added when split. */
static void served_start_split(struct served *s, bool split, const char *format,
                               const char *const *extra)
{
	const char *buf[16];
	ref_ffn = split ? 512 : REF_FFN; /* K-quants split in 256-row units: 2 of them */
	served_start(s, format, with_split(extra, split, buf));
	ref_ffn = REF_FFN;
}

/* A matrix split over pools: its slices, one per pool in row order, each de-interleaved into
 * its rows of got, and moe_lease_rows gathering them all, both give want. */
static void check_slices(struct served *s, const struct moe_lease_expert *e,
                         const struct moe_lease_matrix *m, const void *want, size_t want_bytes)
{
	struct moe_lease_slice sl[MOE_LEASE_MAX_POOLS];
	uint32_t k = 0;
	cr_assert_eq(moe_lease_slices(s->c, e, m, sl, 1, &k), MOE_ETOOSMALL);
	cr_assert_eq(k, 2);
	cr_assert_eq(moe_lease_slices(s->c, e, m, sl, MOE_LEASE_MAX_POOLS, &k), MOE_OK);
	uint8_t *got = calloc(1, want_bytes);
	uint32_t row = 0;
	for (uint32_t i = 0; i < k; i++) {
		cr_assert_eq(sl[i].pool, i, "one slice per node's pool, in order");
		cr_assert_eq(sl[i].row0, row);
		cr_assert_gt(sl[i].rows, 0);
		row += sl[i].rows;
		const void *base;
		size_t bytes;
		cr_assert_eq(moe_lease_pool_at(s->c, sl[i].pool, &base, &bytes, NULL), MOE_OK);
		cr_assert_leq(sl[i].offset + sl[i].bytes, bytes);
		cr_assert_eq(moe_lease_deinterleave_slice(m, &sl[i], base, got, want_bytes), MOE_OK,
		             "format %u interleave %u slice %u", m->format, m->interleave, i);
	}
	cr_assert_eq(row, m->rows);
	const void *pool0;
	cr_assert_eq(moe_lease_pool(s->c, &pool0, NULL, NULL), MOE_OK);
	cr_assert_eq(moe_lease_deinterleave(m, pool0, got, want_bytes), MOE_EINVAL,
	             "no one pool holds a sliced matrix");
	cr_assert_eq(memcmp(got, want, want_bytes), 0,
	             "expert %u (format %u, interleave %u): sliced bytes differ from the file's",
	             e->expert, m->format, m->interleave);
	memset(got, 0, want_bytes);
	cr_assert_eq(moe_lease_rows(s->c, e, m, got, want_bytes), MOE_OK);
	cr_assert_eq(memcmp(got, want, want_bytes), 0);
	free(got);
}

/* Every projection of every leased expert, as GGUF rows, equals the file's bytes. */
static void check_rows(struct served *s, const struct moe_lease_expert *le, uint32_t n)
{
	const void *pool;
	size_t pool_bytes;
	cr_assert_eq(moe_lease_pool(s->c, &pool, &pool_bytes, NULL), MOE_OK);
	for (uint32_t i = 0; i < n; i++) {
		const struct moe_lease_matrix *m[3] = {&le[i].gate, &le[i].up, &le[i].down};
		for (unsigned p = 0; p < 3; p++) {
			void *want;
			size_t want_bytes;
			uint32_t format;
			cr_assert_eq(ref_expert_rows(s->ref, le[i].layer, le[i].expert, p, &want,
			                             &want_bytes, &format),
			             0);
			cr_assert_eq(m[p]->format, format, "expert %u proj %u: format %u, file %u",
			             le[i].expert, p, m[p]->format, format);
			cr_assert_eq(m[p]->scales_offset, UINT64_MAX);
			if (m[p]->area == MOE_LEASE_AREA_SLICES) {
				check_slices(s, &le[i], m[p], want, want_bytes);
				free(want);
				continue;
			}
			cr_assert_eq(moe_lease_pool_count(s->c), 1);
			void *got = malloc(want_bytes);
			cr_assert_eq(moe_lease_deinterleave(m[p], pool, got, want_bytes), MOE_OK,
			             "format %u interleave %u", m[p]->format, m[p]->interleave);
			cr_assert_eq(
			    memcmp(got, want, want_bytes), 0,
			    "expert %u proj %u (format %u, interleave %u): leased bytes differ "
			    "from the file's",
			    le[i].expert, p, format, m[p]->interleave);
			free(got);
			free(want);
		}
	}
}

static void leases_equal_file(const char *format, const char *const *extra, bool split)
{
	struct served s;
	served_start_split(&s, split, format, extra);
	const struct moe_info *inf = moe_info(s.c);
	struct moe_lease_expert le[REF_EXPERTS];
	const int rc = moe_lease(s.c, moe_layer(&s), NULL, inf->n_experts, 0, le, 10000);
	cr_assert_eq(rc, MOE_OK, "%s: %s", format, moe_last_error(s.c));
	cr_assert_eq(moe_lease_pool_count(s.c), split ? 2 : 1);
	for (uint32_t i = 0; i < inf->n_experts; i++) {
		cr_assert_eq(le[i].expert, i);
		cr_assert_eq(le[i].gate.area, split ? MOE_LEASE_AREA_SLICES : MOE_LEASE_AREA_POOL);
		cr_assert_eq(le[i].down.area, le[i].gate.area);
	}
	check_rows(&s, le, inf->n_experts);
	cr_assert_eq(moe_lease_release(s.c, NULL, 0, 5000), MOE_OK, "%s", moe_last_error(s.c));
	if (split) { /* the slices of a released lease are gone */
		struct moe_lease_slice sl[MOE_LEASE_MAX_POOLS];
		uint32_t n;
		cr_assert_eq(
		    moe_lease_slices(s.c, &le[0], &le[0].gate, sl, MOE_LEASE_MAX_POOLS, &n),
		    MOE_EINVAL);
	}
	served_stop(&s);
}

static void leases_equal_file_both_layouts(const char *format)
{
	leases_equal_file(format, with_leases, false);
	const char *const rows[] = {"--leases", "--file-layout", NULL};
	leases_equal_file(format, rows, false);
	/* split over two nodes' pools: the decode layout (x8 where the format has it), then the
	 * files' rows */
	leases_equal_file(format, with_leases, true);
	leases_equal_file(format, rows, true);
}

Test(leases, f32_rows_are_the_files)
{
	leases_equal_file_both_layouts("f32");
}
Test(leases, f16_rows_are_the_files)
{
	leases_equal_file_both_layouts("f16");
}
Test(leases, bf16_rows_are_the_files)
{
	leases_equal_file_both_layouts("bf16");
}
Test(leases, q8_0_rows_are_the_files)
{
	leases_equal_file_both_layouts("q8_0");
}
Test(leases, q4_0_rows_are_the_files)
{
	leases_equal_file_both_layouts("q4_0");
}
Test(leases, q4_k_rows_are_the_files)
{
	leases_equal_file_both_layouts("q4_k");
}
Test(leases, q5_k_rows_are_the_files)
{
	leases_equal_file_both_layouts("q5_k");
}
Test(leases, q6_k_rows_are_the_files)
{
	leases_equal_file_both_layouts("q6_k");
}
Test(leases, iq4_nl_rows_are_the_files)
{
	leases_equal_file_both_layouts("iq4_nl");
}
Test(leases, iq4_xs_rows_are_the_files)
{
	leases_equal_file_both_layouts("iq4_xs");
}
Test(leases, mxfp4_rows_are_the_files)
{
	leases_equal_file_both_layouts("mxfp4");
}
Test(leases, q2_k_rows_are_the_files)
{
	leases_equal_file_both_layouts("q2_k");
}
Test(leases, q3_k_rows_are_the_files)
{
	leases_equal_file_both_layouts("q3_k");
}
Test(leases, nvfp4_rows_are_the_files)
{
	leases_equal_file_both_layouts("nvfp4");
}

/* The shared mapping is read-only: a write faults (SIGSEGV in a child), and the memfd cannot
 * be mapped writable again (its seals). */
static void the_pool_mapping_cannot_be_written_on(bool split)
{
	struct served s;
	served_start_split(&s, split, "q8_0", with_leases);
	struct moe_lease_expert le;
	const int32_t x = 3;
	cr_assert_eq(moe_lease(s.c, moe_layer(&s), &x, 1, 0, &le, 10000), MOE_OK, "%s",
	             moe_last_error(s.c));
	const void *pool;
	size_t bytes;
	int fd;
	cr_assert_eq(moe_lease_pool(s.c, &pool, &bytes, &fd), MOE_OK);
	cr_assert_eq((uintptr_t)pool % 4096, 0);
	cr_assert_eq(mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
	cr_assert_eq(errno, EPERM);
	for (uint32_t p = 1; p < moe_lease_pool_count(s.c); p++) { /* each node's pool alike */
		const void *other;
		cr_assert_eq(moe_lease_pool_at(s.c, p, &other, &bytes, &fd), MOE_OK);
		cr_assert_eq((uintptr_t)other % 4096, 0);
		cr_assert_eq(mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0),
		             MAP_FAILED);
		cr_assert_eq(errno, EPERM);
	}
	cr_assert_eq(moe_lease_pool_count(s.c), split ? 2 : 1);
	const pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		/* the default action, not a sanitizer's report: the signal is what is asserted */
		struct sigaction dfl = {.sa_handler = SIG_DFL};
		sigaction(SIGSEGV, &dfl, NULL);
		((volatile uint8_t *)pool)[le.gate.offset] ^= 1;
		_exit(0);
	}
	int st;
	cr_assert_eq(waitpid(child, &st, 0), child);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "child status 0x%x", st);
	served_stop(&s);
}
Test(leases, the_pool_mapping_cannot_be_written)
{
	the_pool_mapping_cannot_be_written_on(false);
}
Test(leases, split_the_pool_mapping_cannot_be_written)
{
	the_pool_mapping_cannot_be_written_on(true);
}

/* One lease pins one expert: a budget of 25% evicts everything else over and over, and the
 * leased expert's bytes stay where the lease said, unchanged. */
static void a_leased_expert_is_never_evicted_on(bool split)
{
	struct served s;
	const char *const extra[] = {"--leases", "--mem-budget", "25%", NULL};
	served_start_split(&s, split, "q4_k", extra);
	const struct moe_info *inf = moe_info(s.c);
	struct moe_lease_expert le;
	const int32_t x = 5;
	cr_assert_eq(moe_lease(s.c, moe_layer(&s), &x, 1, 0, &le, 10000), MOE_OK, "%s",
	             moe_last_error(s.c));
	for (uint32_t round = 0; round < 4; round++)
		for (uint32_t l = 0; l < inf->n_moe_layers; l++) {
			struct fwd_case fc;
			fwd_case_make(&fc, 100 + round * 8 + l, (int32_t)(inf->first_moe_layer + l),
			              8, 8, inf->n_experts, inf->hidden, false);
			cr_assert_eq(served_forward(&s, &fc, NULL, NULL), MOE_OK, "%s",
			             moe_last_error(s.c));
			fwd_case_free(&fc);
		}
	char *js = served_stats(&s);
	cr_assert_gt(json_top_u64(js, "evictions"), 0, "%s", js);
	cr_assert_eq(json_top_u64(js, "leases_held"), 1);
	free(js);
	check_rows(&s, &le, 1);
	served_stop(&s);
}
Test(leases, a_leased_expert_is_never_evicted)
{
	a_leased_expert_is_never_evicted_on(false);
}
Test(leases, split_a_leased_expert_is_never_evicted)
{
	a_leased_expert_is_never_evicted_on(true);
}

/* A cold lease loads: under a lazy budget the expert is not resident until leased. */
static void a_cold_lease_loads_on(bool split)
{
	struct served s;
	const char *const extra[] = {"--leases", "--mem-budget", "50%", NULL};
	served_start_split(&s, split, "q8_0", extra);
	const struct moe_info *inf = moe_info(s.c);
	const int32_t last = (int32_t)(inf->first_moe_layer + inf->n_moe_layers - 1);
	struct moe_lease_expert le[4];
	const int32_t xs[4] = {12, 13, 14, 15};
	cr_assert_eq(moe_lease(s.c, last, xs, 4, 0, le, 10000), MOE_OK, "%s", moe_last_error(s.c));
	char *js = served_stats(&s);
	cr_assert_gt(json_top_u64(js, "leases_cold"), 0, "%s", js);
	cr_assert_eq(json_top_u64(js, "leases"), 4);
	cr_assert_eq(json_top_u64(js, "leases_held"), 4);
	free(js);
	check_rows(&s, le, 4);
	const uint32_t ids[2] = {le[0].lease, le[1].lease};
	cr_assert_eq(moe_lease_release(s.c, ids, 2, 5000), MOE_OK, "%s", moe_last_error(s.c));
	js = served_stats(&s);
	cr_assert_eq(json_top_u64(js, "leases_held"), 2);
	cr_assert_eq(json_top_u64(js, "leases_released"), 2);
	cr_assert_gt(json_top_u64(js, "lease_held_bytes"), 0);
	free(js);
	served_stop(&s);
}
Test(leases, a_cold_lease_loads)
{
	a_cold_lease_loads_on(false);
}
Test(leases, split_a_cold_lease_loads)
{
	a_cold_lease_loads_on(true);
}

/* A client killed while holding leases: its leases are released when its channel closes. */
static void a_killed_clients_leases_are_freed_on(bool split)
{
	struct served s;
	served_start_split(&s, split, "q8_0", with_leases);
	int ready[2];
	cr_assert_eq(pipe(ready), 0);
	const int32_t layer = moe_layer(&s);
	const pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		struct moe_connect_opts o = {.socket_path = s.sp.socket, .max_tokens = 64};
		struct moe_client *c;
		struct moe_lease_expert le[REF_EXPERTS];
		char b = 'x';
		if (moe_connect(&o, &c) != MOE_OK ||
		    moe_lease(c, layer, NULL, REF_EXPERTS, 0, le, 10000) != MOE_OK)
			b = 'f';
		if (write(ready[1], &b, 1) != 1)
			_exit(2);
		pause();
		_exit(0);
	}
	char b;
	cr_assert_eq(read(ready[0], &b, 1), 1);
	cr_assert_eq(b, 'x');
	char *js = served_stats(&s);
	cr_assert_eq(json_top_u64(js, "leases_held"), REF_EXPERTS, "%s", js);
	free(js);
	kill(child, SIGKILL);
	int st;
	cr_assert_eq(waitpid(child, &st, 0), child);
	/* The sidecar sees the hang-up on its control thread: wait (bounded) for it. */
	int64_t held = -1;
	for (int i = 0; i < 1000 && held != 0; i++) {
		js = served_stats(&s);
		held = json_top_u64(js, "leases_held");
		free(js);
		if (held)
			nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
	}
	cr_assert_eq(held, 0, "the dead client's leases are still held");
	js = served_stats(&s);
	cr_assert_eq(json_top_u64(js, "leases_released"), REF_EXPERTS);
	free(js);
	close(ready[0]);
	close(ready[1]);
	served_stop(&s);
}
Test(leases, a_killed_clients_leases_are_freed)
{
	a_killed_clients_leases_are_freed_on(false);
}
Test(leases, split_a_killed_clients_leases_are_freed)
{
	a_killed_clients_leases_are_freed_on(true);
}

static void expect_refusal(struct served *s, int rc, int want, const char *words)
{
	cr_assert_eq(rc, want, "%s, not %s: %s", moe_strerror(want), moe_strerror(rc),
	             moe_last_error(s->c));
	cr_assert(strstr(moe_last_error(s->c), words), "'%s' not in '%s'", words,
	          moe_last_error(s->c));
}

/* Hostile requests are refused, each with its reason, and leave nothing held. */
static void hostile_requests_are_refused_clearly_on(bool split)
{
	struct served s;
	const char *const extra[] = {"--leases", "--mem-budget", "40%", NULL};
	served_start_split(&s, split, "q8_0", extra);
	const struct moe_info *inf = moe_info(s.c);
	const int32_t l = moe_layer(&s);
	struct moe_lease_expert le[REF_EXPERTS];
	const int32_t bad[2] = {1, 16}, twice[2] = {4, 4}, neg = -1;
	expect_refusal(&s, moe_lease(s.c, l, bad, 2, 0, le, 5000), MOE_EBADEXPERT, "out of range");
	expect_refusal(&s, moe_lease(s.c, l, &neg, 1, 0, le, 5000), MOE_EBADEXPERT, "out of range");
	expect_refusal(&s, moe_lease(s.c, l, twice, 2, 0, le, 5000), MOE_EBADEXPERT, "twice");
	expect_refusal(&s, moe_lease(s.c, (int32_t)inf->n_layers, twice, 1, 0, le, 5000),
	               MOE_EBADLAYER, "layer");
	/* 16 experts of a layer are 1/3 of the model, above half of a 40% pool */
	expect_refusal(&s, moe_lease(s.c, l, NULL, REF_EXPERTS, 0, le, 5000), MOE_ENOLEASE,
	               "bound");
	cr_assert_eq(moe_lease(s.c, l, twice, 1, 0, le, 5000), MOE_OK, "%s", moe_last_error(s.c));
	const uint32_t id = le[0].lease;
	cr_assert_eq(moe_lease_release(s.c, &id, 1, 5000), MOE_OK, "%s", moe_last_error(s.c));
	expect_refusal(&s, moe_lease_release(s.c, &id, 1, 5000), MOE_EBADLEASE, "not held");
	const uint32_t never = 12345;
	expect_refusal(&s, moe_lease_release(s.c, &never, 1, 5000), MOE_EBADLEASE, "not held");
	char *js = served_stats(&s);
	cr_assert_eq(json_top_u64(js, "leases_held"), 0, "%s", js);
	cr_assert_eq(json_top_u64(js, "lease_held_bytes"), 0);
	cr_assert_eq(json_top_u64(js, "leases_refused"), 5);
	free(js);
	served_stop(&s);
}
Test(leases, hostile_requests_are_refused_clearly)
{
	hostile_requests_are_refused_clearly_on(false);
}
Test(leases, split_hostile_requests_are_refused_clearly)
{
	hostile_requests_are_refused_clearly_on(true);
}

/* Without --leases the pool is private: no fd at connect, LEASE refused with the way out. */
Test(leases, a_sidecar_without_leases_says_how_to_get_them)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	cr_assert_eq(moe_lease_pool(s.c, NULL, NULL, NULL), MOE_ENOLEASE);
	struct moe_lease_expert le;
	const int32_t x = 0;
	expect_refusal(&s, moe_lease(s.c, moe_layer(&s), &x, 1, 0, &le, 5000), MOE_ENOLEASE,
	               "--leases");
	served_stop(&s);
}

/* The BF16 form: each matrix of a leased expert, dequantized by the sidecar into the channel's
 * staging area, equals moek_dequantize of the file's rows rounded to BF16, for a quantized
 * format with the decode layout (Q4_K) and one without (Q6_K). The staging area is read-only
 * too, and a full one refuses with its figures. */
static void bf16_equals_dequantize(const char *format, bool split)
{
	struct served s;
	const char *const extra[] = {"--leases", "--lease-staging-mib", "4", NULL};
	served_start_split(&s, split, format, extra);
	const void *staging;
	size_t bytes;
	cr_assert_eq(moe_lease_staging(s.c, &staging, &bytes, NULL), MOE_OK);
	cr_assert_eq(bytes, 4u << 20);
	struct moe_lease_expert le[REF_EXPERTS];
	const int32_t xs[2] = {2, 9};
	cr_assert_eq(moe_lease(s.c, moe_layer(&s), xs, 2, MOE_LEASE_BF16, le, 10000), MOE_OK, "%s",
	             moe_last_error(s.c));
	for (uint32_t i = 0; i < 2; i++) {
		const struct moe_lease_matrix *m[3] = {&le[i].gate, &le[i].up, &le[i].down};
		for (unsigned p = 0; p < 3; p++) {
			cr_assert_eq(m[p]->area, MOE_LEASE_AREA_STAGING);
			cr_assert_eq(m[p]->format, MOEK_BF16);
			cr_assert_eq(m[p]->interleave, 0);
			void *rows;
			size_t rows_bytes;
			uint32_t f;
			cr_assert_eq(ref_expert_rows(s.ref, le[i].layer, le[i].expert, p, &rows,
			                             &rows_bytes, &f),
			             0);
			const size_t n = (size_t)m[p]->rows * m[p]->cols;
			float *want = malloc(n * sizeof(float));
			uint16_t *want16 = malloc(n * sizeof(uint16_t));
			cr_assert_eq(moek_dequantize(f, rows, NULL, m[p]->rows, m[p]->cols, want),
			             0);
			moek_convert(MOE_DTYPE_BF16, want16, MOE_DTYPE_F32, want, n);
			cr_assert_eq(m[p]->bytes, n * 2);
			cr_assert_eq(
			    memcmp((const uint8_t *)staging + m[p]->offset, want16, n * 2), 0,
			    "%s expert %u proj %u: the BF16 form differs from moek_dequantize",
			    format, le[i].expert, p);
			free(want);
			free(want16);
			free(rows);
		}
	}
	/* 16 experts of BF16 rows (3 x 256 x 256 x 2 bytes each, 6 MiB) overflow 4 MiB */
	expect_refusal(&s,
	               moe_lease(s.c, moe_layer(&s), NULL, REF_EXPERTS, MOE_LEASE_BF16, le, 5000),
	               MOE_ENOLEASE, "staging");
	int fd;
	cr_assert_eq(moe_lease_staging(s.c, NULL, &bytes, &fd), MOE_OK);
	cr_assert_eq(mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
	cr_assert_eq(moe_lease_release(s.c, NULL, 0, 5000), MOE_OK, "%s", moe_last_error(s.c));
	served_stop(&s);
}

Test(leases, q4_k_bf16_form_is_moek_dequantize)
{
	bf16_equals_dequantize("q4_k", false);
}
Test(leases, q6_k_bf16_form_is_moek_dequantize)
{
	bf16_equals_dequantize("q6_k", false);
}
/* Split: the sidecar dequantizes each node's rows from that node's pool into one matrix. */
Test(leases, split_q4_k_bf16_form_is_moek_dequantize)
{
	bf16_equals_dequantize("q4_k", true);
}
Test(leases, split_q6_k_bf16_form_is_moek_dequantize)
{
	bf16_equals_dequantize("q6_k", true);
}

/* A sidecar killed with leases out: the client sees MOE_EPEERDEAD, as for FORWARDs; after the
 * restart (and moe_reconnect) the old lease ids mean nothing, the new pool is mapped, and new
 * leases are the file's rows again. */
static void a_restart_invalidates_leases_on(bool split)
{
	struct served s;
	served_start_split(&s, split, "q8_0", with_leases);
	struct moe_lease_expert le[2];
	const int32_t xs[2] = {6, 7};
	cr_assert_eq(moe_lease(s.c, moe_layer(&s), xs, 2, 0, le, 10000), MOE_OK, "%s",
	             moe_last_error(s.c));
	cr_assert_eq(sidecar_stop(&s.sp, SIGKILL) & 0x7f, SIGKILL);
	const uint32_t old = le[0].lease;
	cr_assert_eq(moe_lease_release(s.c, &old, 1, 5000), MOE_EPEERDEAD);
	cr_assert_eq(moe_lease(s.c, moe_layer(&s), xs, 2, 0, le, 5000), MOE_EPEERDEAD);
	cr_assert_eq(moe_lease_pool(s.c, NULL, NULL, NULL), MOE_EPEERDEAD);
	const char *const extra[] = {s.model, "--leases", NULL};
	const char *buf[16];
	cr_assert_eq(sidecar_start(&s.sp, with_split(extra, split, buf), NULL), 0);
	cr_assert_eq(moe_reconnect(s.c, 20000), MOE_OK, "%s", moe_last_error(s.c));
	expect_refusal(&s, moe_lease_release(s.c, &old, 1, 5000), MOE_EBADLEASE, "not held");
	cr_assert_eq(moe_lease(s.c, moe_layer(&s), xs, 2, 0, le, 10000), MOE_OK, "%s",
	             moe_last_error(s.c));
	check_rows(&s, le, 2);
	served_stop(&s);
}
Test(leases, a_restart_invalidates_leases)
{
	a_restart_invalidates_leases_on(false);
}
Test(leases, split_a_restart_invalidates_leases)
{
	a_restart_invalidates_leases_on(true);
}
