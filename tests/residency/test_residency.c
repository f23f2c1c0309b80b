/* test_residency.c — the state machine and loader against a real file on /tmp (O_DIRECT) and
 * on /dev/shm (tmpfs: buffered fallback): unaligned extents byte-exact against pread,
 * chunking, the byte budget after every operation, pinned and referenced experts never
 * evicted, GPU mask, prefetch accounting and ordering, and faults injected through the
 * loader hook (EIO retried then failed, short reads continued). */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include <numa.h>
#include <numaif.h>

#include "fixture.h"

static struct residency_config base_config(uint64_t budget)
{
	return (struct residency_config){
	    .numa_node = 0,
	    .mem_budget = budget,
	    .policy = "lru",
	    .max_retries = 3,
	};
}

static void counters(struct residency *r, struct residency_counters *c)
{
	residency_counters(r, c);
	cr_assert_leq(c->slots_used, c->slots);
	cr_assert_leq((uint64_t)c->slots * c->slot_bytes, c->budget_bytes, "budget exceeded");
}

static void acquire_ok(struct residency *r, struct fixture *f, uint32_t l, uint32_t x,
                       struct expert_ref *ref)
{
	int rc = residency_acquire(r, l, x, 1.0f, 0, ref);
	char msg[256];
	residency_error_message(r, l, x, msg, sizeof(msg));
	cr_assert_eq(rc, 0, "acquire %u/%u: %d (%s)", l, x, rc, msg);
	cr_assert(fixture_ref_matches(f, ref), "layer %u expert %u: bytes differ from pread", l, x);
}

Test(residency, unaligned_extents_byte_exact_and_hits_after)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 2, 4, 3, 5000);
	struct residency_config cfg = base_config(64u << 20);
	struct residency *r = fixture_residency(&f, &cfg);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.buffered_files, 0, "/tmp should take O_DIRECT");
	for (int round = 0; round < 2; round++)
		for (uint32_t l = 0; l < 2; l++)
			for (uint32_t x = 0; x < 4; x++) {
				struct expert_ref ref;
				acquire_ok(r, &f, l, x, &ref);
				residency_release(r, &ref);
			}
	counters(r, &c);
	cr_assert_eq(c.cold_misses, 8);
	cr_assert_eq(c.hits, 8);
	cr_assert_eq(c.loads, 8);
	cr_assert_eq(c.failures, 0);
	cr_assert_eq(c.fixed_reads + c.plain_reads, c.reads);
	if (c.buffers_registered)
		cr_assert_eq(c.fixed_reads, c.reads, "registered slots must use read_fixed");
	uint64_t hist = 0;
	for (int b = 0; b < RESIDENCY_LAT_BUCKETS; b++)
		hist += c.latency_us_log2[b];
	cr_assert_eq(hist, c.reads, "every read lands in the latency histogram");
	residency_destroy(r);
	fixture_destroy(&f);
}

/* The slot size of the fixture's experts (the largest, aligned). */
static uint64_t fixture_slot_bytes(void)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 2, 4, 3, 5000);
	struct residency_config cfg = base_config(64u << 20);
	struct residency *r = fixture_residency(&f, &cfg);
	struct residency_counters c;
	counters(r, &c);
	residency_destroy(r);
	fixture_destroy(&f);
	return c.slot_bytes;
}

/* A pool of 8 slots registered as several fixed buffers (as a pool of many GiB is, 1 GiB
 * each): every read goes to its slot's buffer, whichever that is, byte-exact. */
static void spread_over_buffers(uint64_t buffer_max, uint32_t slots_per_buffer)
{
	const uint64_t slot = fixture_slot_bytes();
	struct fixture f;
	fixture_create(&f, "/tmp", 2, 4, 3, 5000);
	struct residency_config cfg = base_config(8 * slot);
	cfg.fixed_buffer_max = buffer_max;
	struct residency *r = fixture_residency(&f, &cfg);
	struct residency_counters c;
	counters(r, &c);
	if (!c.buffers_registered) {
		residency_destroy(r);
		fixture_destroy(&f);
		cr_skip_test("io_uring_register_buffers refused here (RLIMIT_MEMLOCK)");
	}
	cr_assert_eq(c.slots, 8, "the budget holds every expert");
	cr_assert_eq(c.fixed_buffers, (c.slots + slots_per_buffer - 1) / slots_per_buffer);
	for (int round = 0; round < 2; round++)
		for (uint32_t l = 0; l < 2; l++)
			for (uint32_t x = 0; x < 4; x++) {
				struct expert_ref ref;
				acquire_ok(r, &f, l, x, &ref);
				residency_release(r, &ref);
			}
	counters(r, &c);
	cr_assert_eq(c.loads, 8);
	cr_assert_eq(c.slots_used, 8, "every slot, so every buffer, was read into");
	cr_assert_eq(c.fixed_reads, c.reads, "registered slots must use read_fixed");
	cr_assert_eq(c.failures, 0);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency, reads_into_every_fixed_buffer)
{
	spread_over_buffers(1, 1); /* below one slot: one slot per buffer */
}

Test(residency, fixed_buffers_of_whole_slots)
{
	/* 3 slots' bytes and a little more: rounded down to 3 slots per buffer, 3 buffers */
	const uint64_t slot = fixture_slot_bytes();
	spread_over_buffers(3 * slot + slot / 2, 3);
	spread_over_buffers(0, 8); /* the default: 8 small slots fit one 1 GiB buffer */
}

Test(residency, chunked_reads_at_small_depth)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 3, 2, 20000);
	struct residency_config cfg = base_config(64u << 20);
	cfg.chunk_bytes = 4096;
	cfg.queue_depth = 2;
	struct residency *r = fixture_residency(&f, &cfg);
	uint64_t expect_reads = 0;
	for (uint32_t id = 0; id < 3; id++) {
		uint32_t n;
		const struct expert_extent *e = expert_map_extents(&f.map, id, &n);
		for (uint32_t i = 0; i < n; i++) {
			uint64_t start = e[i].offset / 4096 * 4096;
			uint64_t end = (e[i].offset + e[i].length + 4095) / 4096 * 4096;
			expect_reads += (end - start) / 4096;
		}
	}
	for (uint32_t x = 0; x < 3; x++) {
		struct expert_ref ref;
		acquire_ok(r, &f, 0, x, &ref);
		residency_release(r, &ref);
	}
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.reads, expect_reads, "one read per 4 KiB chunk");
	cr_assert_eq(c.retries, 0);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency, budget_and_referenced_experts)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 2, 8, 1, 3000);
	/* Three slots: every expert is one 4 KiB or 8 KiB aligned read. */
	struct residency_config cfg = base_config(3 * 8192 + 100);
	struct residency *r = fixture_residency(&f, &cfg);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.slots, 3);
	struct expert_ref held;
	acquire_ok(r, &f, 0, 0, &held);
	for (int i = 0; i < 40; i++) {
		struct expert_ref ref;
		acquire_ok(r, &f, (uint32_t)(i % 2), (uint32_t)(1 + i % 7), &ref);
		counters(r, &c);
		residency_release(r, &ref);
		counters(r, &c);
		cr_assert_eq(residency_state(r, 0, 0), EXPERT_RESIDENT, "held expert evicted");
		cr_assert(fixture_ref_matches(&f, &held), "held expert's bytes changed");
	}
	cr_assert_gt(c.evictions, 30);
	/* Every slot referenced: a NOWAIT demand cannot get one. */
	struct expert_ref b, d, x;
	acquire_ok(r, &f, 1, 1, &b);
	acquire_ok(r, &f, 1, 2, &d);
	cr_assert_eq(residency_acquire(r, 1, 3, 1.0f, RESIDENCY_NOWAIT, &x), -EAGAIN);
	residency_release(r, &d);
	acquire_ok(r, &f, 1, 3, &x);
	residency_release(r, &x);
	residency_release(r, &b);
	residency_release(r, &held);
	counters(r, &c);
	residency_destroy(r);
	fixture_destroy(&f);
}

/* Three slots for eight layers under the default sieve+layer: layers 3..7 have a share of 0
 * slots, and each is still served (a demand that found no room used to wait forever). */
Test(residency, fewer_slots_than_layers_serves_every_layer)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 8, 2, 1, 3000);
	struct residency_config cfg = base_config(3 * 8192 + 100);
	cfg.policy = "sieve+layer";
	struct residency *r = fixture_residency(&f, &cfg);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.slots, 3);
	struct expert_ref held;
	acquire_ok(r, &f, 0, 0, &held); /* one slot in use throughout */
	for (int round = 0; round < 3; round++)
		for (uint32_t l = 0; l < 8; l++) {
			struct expert_ref ref;
			const uint32_t x = (uint32_t)(round + l) % 2;
			if (l == 0 && x == 0)
				continue;
			/* Not waiting first: a refusal here is the old hang. */
			int rc = residency_acquire(r, l, x, 1.0f, RESIDENCY_NOWAIT, &ref);
			cr_assert(rc == 0 || rc == -EINPROGRESS,
			          "layer %u expert %u: %d with one slot in use of three", l, x, rc);
			if (rc == -EINPROGRESS) {
				rc = residency_acquire(r, l, x, 1.0f, RESIDENCY_RETRY, &ref);
				cr_assert_eq(rc, 0, "layer %u expert %u: %d", l, x, rc);
			}
			cr_assert(fixture_ref_matches(&f, &ref));
			residency_release(r, &ref);
			counters(r, &c);
		}
	cr_assert_eq(residency_state(r, 0, 0), EXPERT_RESIDENT, "held expert evicted");
	residency_release(r, &held);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency, pinned_layers_stay)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 3, 4, 1, 3000);
	struct residency_config cfg = base_config(7 * 8192);
	cfg.policy = "lru+pin1";
	struct residency *r = fixture_residency(&f, &cfg);
	struct sidecar_error err = {0};
	cr_assert_eq(residency_warm_pinned(r, &err), 0, "%s", err.msg);
	struct residency_counters c0, c;
	counters(r, &c0);
	cr_assert_eq(c0.loads, 4);
	for (int i = 0; i < 50; i++) {
		struct expert_ref ref;
		acquire_ok(r, &f, 1 + (uint32_t)(i % 2), (uint32_t)(i * 3 % 4), &ref);
		residency_release(r, &ref);
		for (uint32_t x = 0; x < 4; x++)
			cr_assert_eq(residency_state(r, 0, x), EXPERT_RESIDENT, "pinned evicted");
	}
	counters(r, &c);
	cr_assert_gt(c.evictions, 0);
	uint64_t bytes = c.bytes_read;
	for (uint32_t x = 0; x < 4; x++) {
		struct expert_ref ref;
		acquire_ok(r, &f, 0, x, &ref);
		residency_release(r, &ref);
	}
	counters(r, &c);
	cr_assert_eq(c.bytes_read, bytes, "pinned experts were read again");
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency, gpu_masked_never_loaded)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 4, 1, 3000);
	struct residency_config cfg = base_config(1 << 20);
	struct residency *r = fixture_residency(&f, &cfg);
	struct expert_ref ref;
	acquire_ok(r, &f, 0, 2, &ref);
	residency_release(r, &ref);
	uint8_t mask[4] = {0, 1, 1, 0};
	cr_assert_eq(residency_set_gpu_mask(r, 0, mask), 0);
	cr_assert_eq(residency_state(r, 0, 2), EXPERT_COLD, "masked resident expert kept");
	cr_assert_eq(residency_acquire(r, 0, 1, 1.0f, 0, &ref), -EPERM);
	uint32_t ids[] = {1, 2};
	cr_assert_eq(residency_prefetch(r, 0, ids, 2, 1.0f), 0);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.loads, 1);
	cr_assert_eq(c.cold_misses, 1);
	residency_destroy(r);
	fixture_destroy(&f);
}

/* Waits (bounded) until the loader has finished `n` loads: prefetches complete in the
 * background and nothing else signals them without consuming them. */
static void wait_loads(struct residency *r, uint64_t n)
{
	struct residency_counters c;
	for (int i = 0; i < 5000; i++) {
		counters(r, &c);
		if (c.loads + c.failures >= n)
			return;
		nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
	}
	cr_assert_fail("%" PRIu64 " loads not done after 5 s", n);
}

/* A prefetched expert that was not used yet is never a prefetch's victim (the two would waste
 * each other's reads); a demand may still evict it. */
Test(residency, prefetch_never_evicts_an_unused_prefetch)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 6, 1, 3000);
	struct residency_config cfg = base_config(2 * 8192);
	struct residency *r = fixture_residency(&f, &cfg);
	uint32_t ids[] = {0, 1}, three = 3;
	cr_assert_eq(residency_prefetch(r, 0, ids, 2, 1.0f), 2);
	wait_loads(r, 2);
	cr_assert_eq(residency_prefetch(r, 0, &three, 1, 1.0f), 0, "evicted an unused prefetch");
	cr_assert_eq(residency_state(r, 0, 0), EXPERT_RESIDENT);
	cr_assert_eq(residency_state(r, 0, 1), EXPERT_RESIDENT);
	struct expert_ref a;
	acquire_ok(r, &f, 0, 3, &a); /* a demand: LRU takes 0 */
	residency_release(r, &a);
	cr_assert_eq(residency_state(r, 0, 0), EXPERT_COLD);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.prefetch_dropped, 1);
	cr_assert_eq(c.prefetch_wasted, 1);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency, prefetch_hits_and_waste)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 6, 1, 3000);
	struct residency_config cfg = base_config(2 * 8192);
	struct residency *r = fixture_residency(&f, &cfg);
	uint32_t ids[] = {0, 1};
	cr_assert_eq(residency_prefetch(r, 0, ids, 2, 1.0f), 2);
	struct expert_ref a, b;
	acquire_ok(r, &f, 0, 0, &a); /* prefetched, then used */
	residency_release(r, &a);
	/* LRU: expert 1 (prefetched, unused) is the least recent: demands evict it. */
	acquire_ok(r, &f, 0, 2, &a);
	residency_release(r, &a);
	acquire_ok(r, &f, 0, 3, &b);
	residency_release(r, &b);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.prefetches, 2);
	cr_assert_eq(c.prefetch_hits, 1);
	cr_assert_eq(c.prefetch_wasted, 1);
	cr_assert_eq(c.cold_misses, 2);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency, prefetch_never_evicts_more_valuable)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 6, 1, 3000);
	struct residency_config cfg = base_config(2 * 8192);
	cfg.policy = "sieve";
	struct residency *r = fixture_residency(&f, &cfg);
	for (int i = 0; i < 2; i++)
		for (uint32_t x = 0; x < 2; x++) {
			struct expert_ref ref;
			acquire_ok(r, &f, 0, x, &ref); /* second round: hits set visited bits */
			residency_release(r, &ref);
		}
	uint32_t ids[] = {4};
	cr_assert_eq(residency_prefetch(r, 0, ids, 1, 1.0f), 0);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.prefetch_dropped, 1);
	cr_assert_eq(c.evictions, 0);
	cr_assert_eq(residency_state(r, 0, 0), EXPERT_RESIDENT);
	cr_assert_eq(residency_state(r, 0, 1), EXPERT_RESIDENT);
	residency_destroy(r);
	fixture_destroy(&f);
}

/* ---- fault injection ---- */

struct faults {
	atomic_int fail_first; /* fail this many completions with fail_with */
	int fail_with;
	atomic_int truncate_first; /* cut this many completions to half (rounded to 4 KiB) */
	atomic_int seen;
};

static int inject(void *arg, const struct loader_read_info *info, int res)
{
	struct faults *fl = arg;
	(void)info;
	atomic_fetch_add(&fl->seen, 1);
	if (atomic_fetch_sub(&fl->fail_first, 1) > 0)
		return fl->fail_with;
	if (res > 8192 && atomic_fetch_sub(&fl->truncate_first, 1) > 0)
		return res / 2 / 4096 * 4096;
	return res;
}

Test(residency_faults, eio_retried_then_failed_with_context)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 2, 1, 3000);
	struct faults fl = {.fail_first = 1000, .fail_with = -EIO};
	struct residency_config cfg = base_config(1 << 20);
	cfg.max_retries = 2;
	cfg.retry_backoff_ms = 3600000; /* no demand of this test outlives it */
	struct residency *r = fixture_residency(&f, &cfg);
	residency_set_fault_hook(r, inject, &fl);
	struct expert_ref ref;
	cr_assert_eq(residency_acquire(r, 0, 1, 1.0f, 0, &ref), -EIO);
	cr_assert_eq(residency_state(r, 0, 1), EXPERT_FAILED);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.retries, 2);
	cr_assert_eq(c.reads, 3, "first attempt + 2 retries");
	cr_assert_eq(c.failures, 1);
	cr_assert_eq(c.slots_used, 0, "a failed load gives its slot back");
	char msg[512];
	residency_error_message(r, 0, 1, msg, sizeof(msg));
	cr_assert(strstr(msg, f.path) && strstr(msg, "layer 0 expert 1") &&
	              strstr(msg, "3 attempt") && strstr(msg, "Input/output error"),
	          "%s", msg);
	/* Within its backoff: the next demand fails at once, without I/O. */
	cr_assert_eq(residency_acquire(r, 0, 1, 1.0f, 0, &ref), -EIO);
	counters(r, &c);
	cr_assert_eq(c.reads, 3);
	cr_assert_eq(c.failed_now, 1);
	cr_assert_eq(c.failed_retries, 0);
	/* Once retried with a healthy disk, it loads. */
	atomic_store(&fl.fail_first, 0);
	residency_retry_failed(r, 0, 1);
	acquire_ok(r, &f, 0, 1, &ref);
	residency_release(r, &ref);
	counters(r, &c);
	cr_assert_eq(c.failed_now, 0);
	cr_assert_eq(c.failed_retries, 1);
	residency_destroy(r);
	fixture_destroy(&f);
}

/* Fails every read of an expert's first `loads` loads. */
static int fail_first_loads(void *arg, const struct loader_read_info *info, int res)
{
	const uint32_t *loads = arg;
	return info->failed_loads < *loads ? -EIO : res;
}

/* A FAILED expert whose backoff is over is read again by the next demand: here the backoff is
 * none, so each demand after a failure reads; the third load succeeds. */
Test(residency_faults, failed_expert_read_again_after_its_backoff)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 2, 1, 3000);
	uint32_t loads = 2;
	struct residency_config cfg = base_config(1 << 20);
	cfg.max_retries = 0;
	cfg.retry_backoff_ms = RESIDENCY_NO_BACKOFF;
	struct residency *r = fixture_residency(&f, &cfg);
	residency_set_fault_hook(r, fail_first_loads, &loads);
	struct expert_ref ref;
	cr_assert_eq(residency_acquire(r, 0, 0, 1.0f, 0, &ref), -EIO);
	cr_assert_eq(residency_state(r, 0, 0), EXPERT_FAILED);
	cr_assert_eq(residency_acquire(r, 0, 0, 1.0f, RESIDENCY_NOWAIT, &ref), -EINPROGRESS,
	             "a NOWAIT demand starts the retry too");
	cr_assert_eq(residency_acquire(r, 0, 0, 1.0f, RESIDENCY_RETRY, &ref), -EIO);
	acquire_ok(r, &f, 0, 0, &ref);
	residency_release(r, &ref);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.failures, 2);
	cr_assert_eq(c.failed_retries, 2);
	cr_assert_eq(c.failed_now, 0);
	cr_assert_eq(c.loads, 1);
	residency_destroy(r);
	fixture_destroy(&f);
}

/* Within a long backoff nothing is read; residency_retry_all_failed (the operator's SIGHUP)
 * ends it for every FAILED expert at once. */
Test(residency_faults, retry_all_failed_ends_the_backoff)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 2, 2, 1, 3000);
	uint32_t loads = 1;
	struct residency_config cfg = base_config(1 << 20);
	cfg.max_retries = 0;
	cfg.retry_backoff_ms = 3600000;
	struct residency *r = fixture_residency(&f, &cfg);
	residency_set_fault_hook(r, fail_first_loads, &loads);
	struct expert_ref ref;
	for (uint32_t l = 0; l < 2; l++)
		cr_assert_eq(residency_acquire(r, l, 1, 1.0f, 0, &ref), -EIO);
	struct residency_counters c0, c;
	counters(r, &c0);
	cr_assert_eq(c0.failed_now, 2);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(residency_acquire(r, 1, 1, 1.0f, 0, &ref), -EIO);
	counters(r, &c);
	cr_assert_eq(c.reads, c0.reads, "read within the backoff");
	cr_assert_eq(residency_retry_all_failed(r), 2);
	cr_assert_eq(residency_retry_all_failed(r), 0);
	for (uint32_t l = 0; l < 2; l++) {
		acquire_ok(r, &f, l, 1, &ref);
		residency_release(r, &ref);
	}
	counters(r, &c);
	cr_assert_eq(c.failed_now, 0);
	cr_assert_eq(c.failed_retries, 2);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency_faults, backoff_doubles_up_to_its_cap)
{
	struct residency_config cfg = {0};
	const uint64_t want[] = {0, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000};
	for (uint32_t n = 0; n < sizeof(want) / sizeof(want[0]); n++)
		cr_assert_eq(residency_backoff_ms(&cfg, n), want[n], "defaults, %u failures", n);
	cr_assert_eq(residency_backoff_ms(&cfg, UINT32_MAX), 60000);
	cfg.retry_backoff_ms = 300;
	cfg.retry_backoff_max_ms = 1000;
	cr_assert_eq(residency_backoff_ms(&cfg, 1), 300);
	cr_assert_eq(residency_backoff_ms(&cfg, 2), 600);
	cr_assert_eq(residency_backoff_ms(&cfg, 3), 1000);
	cr_assert_eq(residency_backoff_ms(&cfg, 40), 1000);
	cfg.retry_backoff_ms = RESIDENCY_NO_BACKOFF;
	cr_assert_eq(residency_backoff_ms(&cfg, 5), 0);
}

Test(residency_faults, transient_eio_and_eagain_recover)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 2, 2, 3000);
	struct faults fl = {.fail_first = 2, .fail_with = -EAGAIN};
	struct residency_config cfg = base_config(1 << 20);
	struct residency *r = fixture_residency(&f, &cfg);
	residency_set_fault_hook(r, inject, &fl);
	struct expert_ref ref;
	acquire_ok(r, &f, 0, 0, &ref);
	residency_release(r, &ref);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.retries, 2);
	cr_assert_eq(c.failures, 0);
	residency_destroy(r);
	fixture_destroy(&f);
}

/* A read cancelled by its linked timeout completes with -ECANCELED: retried, then the expert
 * fails as -ETIMEDOUT. */
Test(residency_faults, timed_out_reads_retried_then_etimedout)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 2, 1, 3000);
	struct faults fl = {.fail_first = 1000, .fail_with = -ECANCELED};
	struct residency_config cfg = base_config(1 << 20);
	cfg.max_retries = 1;
	struct residency *r = fixture_residency(&f, &cfg);
	residency_set_fault_hook(r, inject, &fl);
	struct expert_ref ref;
	cr_assert_eq(residency_acquire(r, 0, 0, 1.0f, 0, &ref), -ETIMEDOUT);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.retries, 1);
	cr_assert_eq(c.reads, 2);
	char msg[512];
	residency_error_message(r, 0, 0, msg, sizeof(msg));
	cr_assert(strstr(msg, "timed out"), "%s", msg);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency_faults, short_reads_continue_byte_exact)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 3, 2, 30000);
	struct faults fl = {.truncate_first = 3};
	struct residency_config cfg = base_config(1 << 20);
	struct residency *r = fixture_residency(&f, &cfg);
	residency_set_fault_hook(r, inject, &fl);
	for (uint32_t x = 0; x < 3; x++) {
		struct expert_ref ref;
		acquire_ok(r, &f, 0, x, &ref);
		residency_release(r, &ref);
	}
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.short_reads, 3);
	cr_assert_eq(c.reads, 6 + 3, "six extents, three continuations");
	cr_assert_eq(c.retries, 0);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency_faults, end_of_file_inside_data_fails)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 2, 1, 3000);
	struct faults fl = {.fail_first = 1, .fail_with = 0}; /* a read that returns 0 bytes */
	struct residency_config cfg = base_config(1 << 20);
	struct residency *r = fixture_residency(&f, &cfg);
	residency_set_fault_hook(r, inject, &fl);
	struct expert_ref ref;
	cr_assert_eq(residency_acquire(r, 0, 0, 1.0f, 0, &ref), -ENODATA);
	char msg[512];
	residency_error_message(r, 0, 0, msg, sizeof(msg));
	cr_assert(strstr(msg, "file ends before the expert's data"), "%s", msg);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency_files, extent_beyond_eof_rejected_at_create)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 2, 1, 3000);
	cr_assert_eq(expert_map_add(&f.map, 0, 1, 0, f.file_size - 10, 11, NULL), 0);
	struct residency_config cfg = base_config(1 << 20);
	struct residency *r;
	struct sidecar_error err = {0};
	cr_assert_eq(residency_create(&r, &f.map, &cfg, &err), -1);
	cr_assert_eq(err.status, MOE_EINVAL);
	cr_assert(strstr(err.msg, "layer 0 expert 1") &&
	              strstr(err.msg, "beyond the end of the file") && strstr(err.msg, f.path),
	          "%s", err.msg);
	cfg.mem_budget = 100; /* not even one slot */
	expert_map_free(&f.map);
	const char *paths[] = {f.path};
	cr_assert_eq(expert_map_init(&f.map, 1, 1, 1, paths, &err), 0);
	cr_assert_eq(expert_map_add(&f.map, 0, 0, 0, 10, 100, &err), 0);
	cr_assert_eq(residency_create(&r, &f.map, &cfg, &err), -1);
	cr_assert_eq(err.status, MOE_EINVAL);
	cr_assert(strstr(err.msg, "holds no slot"), "%s", err.msg);
	fixture_destroy(&f);
}

/* Linux ≥ 6.6 gives tmpfs O_DIRECT, so the refusal is simulated (no_direct reads buffered and
 * counts it as a refused O_DIRECT is); /dev/shm is still used for its page cache. */
Test(residency_files, refused_direct_io_falls_back_to_buffered_loudly)
{
	struct fixture f;
	fixture_create(&f, "/dev/shm", 1, 3, 2, 5000);
	struct residency_config cfg = base_config(1 << 20);
	cfg.no_direct = true;
	struct residency *r = fixture_residency(&f, &cfg);
	struct residency_counters c;
	counters(r, &c);
	cr_assert_eq(c.buffered_files, 1, "buffered fallback must be counted");
	for (uint32_t x = 0; x < 3; x++) {
		struct expert_ref ref;
		acquire_ok(r, &f, 0, x, &ref);
		residency_release(r, &ref);
	}
	residency_destroy(r);
	fixture_destroy(&f);
}

/* ---- demand before prefetch ---- */

struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool entered, open;
	uint32_t order[16];
	int n;
};

static int gate_hook(void *arg, const struct loader_read_info *info, int res)
{
	struct gate *g = arg;
	pthread_mutex_lock(&g->lock);
	if (g->n < 16)
		g->order[g->n++] = info->expert;
	g->entered = true;
	pthread_cond_broadcast(&g->cond);
	while (!g->open)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
	return res;
}

Test(residency_order, demand_reads_go_before_prefetches)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 6, 1, 3000);
	struct gate g = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
	struct residency_config cfg = base_config(1 << 20);
	cfg.queue_depth = 1; /* one read at a time: the order is the loader's choice */
	struct residency *r = fixture_residency(&f, &cfg);
	residency_set_fault_hook(r, gate_hook, &g);
	struct expert_ref ref;
	cr_assert_eq(residency_acquire(r, 0, 0, 1.0f, RESIDENCY_NOWAIT, &ref), -EINPROGRESS);
	pthread_mutex_lock(&g.lock);
	while (!g.entered) /* the loader holds expert 0's completion at the gate */
		pthread_cond_wait(&g.cond, &g.lock);
	pthread_mutex_unlock(&g.lock);
	uint32_t pre[] = {1, 2};
	cr_assert_eq(residency_prefetch(r, 0, pre, 2, 1.0f), 2);
	cr_assert_eq(residency_acquire(r, 0, 3, 1.0f, RESIDENCY_NOWAIT, &ref), -EINPROGRESS);
	pthread_mutex_lock(&g.lock);
	g.open = true;
	pthread_cond_broadcast(&g.cond);
	pthread_mutex_unlock(&g.lock);
	for (uint32_t x = 0; x < 4; x++) {
		acquire_ok(r, &f, 0, x, &ref);
		residency_release(r, &ref);
	}
	cr_assert_eq(g.n, 4);
	cr_assert_eq(g.order[0], 0);
	cr_assert_eq(g.order[1], 3, "the demand for expert 3 waited behind prefetches");
	cr_assert_eq(g.order[2], 1);
	cr_assert_eq(g.order[3], 2);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency_order, shutdown_with_loads_queued_and_in_flight)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 2, 8, 2, 20000);
	struct residency_config cfg = base_config(16u << 20);
	cfg.queue_depth = 2;
	cfg.chunk_bytes = 4096;
	struct residency *r = fixture_residency(&f, &cfg);
	struct expert_ref ref;
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t x = 0; x < 8; x++) {
			int rc = residency_acquire(r, l, x, 1.0f, RESIDENCY_NOWAIT, &ref);
			cr_assert(rc == -EINPROGRESS || rc == 0, "%d", rc);
			if (rc == 0)
				residency_release(r, &ref);
		}
	residency_destroy(r); /* must return; ASan checks nothing leaks */
	fixture_destroy(&f);
}

/* Several nodes: the budget is split in proportion to each node's slot bytes, so that every
 * node has the same slots; an eviction frees the expert's slot on every node; a budget that
 * holds no expert's slices on every node is refused with the smallest one that serves. */
Test(residency_nodes, budget_split_by_slices_and_one_eviction_for_every_node)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 2, 6, 3, 9000);
	fixture_split(&f, 3);
	struct residency_config cfg = base_config(3 * 3 * 16384 + 5000); /* ~3 experts */
	struct residency *r = fixture_residency(&f, &cfg);
	cr_assert_eq(residency_n_nodes(r), 3);
	struct residency_counters all, node[3];
	counters(r, &all);
	uint64_t budgets = 0, slot_bytes = 0;
	for (uint32_t n = 0; n < 3; n++) {
		cr_assert_eq(residency_node_counters(r, n, &node[n]), 0);
		cr_assert_eq(node[n].slots, all.slots, "node %u: %u slots of %u", n, node[n].slots,
		             all.slots);
		cr_assert_leq((uint64_t)node[n].slots * node[n].slot_bytes, node[n].budget_bytes);
		budgets += node[n].budget_bytes;
		slot_bytes += node[n].slot_bytes;
	}
	cr_assert_eq(residency_node_counters(r, 3, &node[0]), -1);
	cr_assert_eq(budgets, cfg.mem_budget);
	cr_assert_eq(all.budget_bytes, cfg.mem_budget);
	cr_assert_eq(all.slot_bytes, slot_bytes);
	cr_assert_eq(all.slots, cfg.mem_budget / slot_bytes);
	cr_assert_geq(all.slots, 2);
	/* Demand every expert in turn: more than fit, so experts are evicted, each from every
	 * node at once. */
	for (uint32_t round = 0; round < 2; round++)
		for (uint32_t l = 0; l < 2; l++)
			for (uint32_t x = 0; x < 6; x++) {
				struct expert_ref ref;
				cr_assert_eq(residency_acquire(r, l, x, 1.0f, 0, &ref), 0);
				cr_assert(fixture_held_matches(&f, r, &ref), "layer %u expert %u",
				          l, x);
				residency_release(r, &ref);
				uint32_t resident = 0;
				uint64_t want[3] = {0};
				for (uint32_t ll = 0; ll < 2; ll++)
					for (uint32_t xx = 0; xx < 6; xx++) {
						if (residency_state(r, ll, xx) != EXPERT_RESIDENT)
							continue;
						resident++;
						for (uint32_t n = 0; n < 3; n++) {
							uint32_t k;
							const struct expert_extent *e =
							    expert_map_extents(&f.node_map[n],
							                       ll * 6 + xx, &k);
							for (uint32_t i = 0; i < k; i++)
								want[n] += e[i].length;
						}
					}
				for (uint32_t n = 0; n < 3; n++) {
					cr_assert_eq(residency_node_counters(r, n, &node[n]), 0);
					cr_assert_eq(node[n].slots_used, resident);
					cr_assert_eq(node[n].resident_bytes, want[n], "node %u", n);
				}
			}
	counters(r, &all);
	cr_assert_gt(all.evictions, 0);
	cr_assert_eq(all.loads, all.cold_misses);
	cr_assert_eq(all.hits + all.cold_misses + all.inflight_misses, 24);
	for (uint32_t n = 0; n < 3; n++) {
		cr_assert_eq(residency_node_counters(r, n, &node[n]), 0);
		cr_assert_eq(node[n].evictions, all.evictions); /* one decision for every node */
		cr_assert_gt(node[n].bytes_read, 0);
	}
	cr_assert_eq(node[0].bytes_read + node[1].bytes_read + node[2].bytes_read, all.bytes_read);
	residency_destroy(r);
	cfg.mem_budget = slot_bytes - 1; /* one expert's slices need slot_bytes */
	struct sidecar_error err = {0};
	const struct residency_node parts[3] = {
	    {&f.node_map[0], -1, NULL}, {&f.node_map[1], -1, NULL}, {&f.node_map[2], -1, NULL}};
	cr_assert_eq(residency_create_nodes(&r, parts, 3, &cfg, &err), -1);
	cr_assert_eq(err.status, MOE_EINVAL);
	cr_assert(strstr(err.msg, "holds no expert") && strstr(err.msg, "over 3 nodes"), "%s",
	          err.msg);
	fixture_destroy(&f);
}

/* The node of the page holding p (move_pages in query mode), or a negative errno. */
static int page_node(const void *p)
{
	void *page = (void *)((uintptr_t)p & ~(uintptr_t)4095);
	int status = -1;
	if (move_pages(0, 1, &page, NULL, &status, 0) != 0)
		return -errno;
	return status;
}

/* Each node's slots lie in memory bound to that node: its policy (get_mempolicy) binds to the
 * node alone and the pages a load wrote are on it (move_pages). With one node in the machine
 * both parts bind to node 0, which still checks the binding is set and the reads land in it;
 * with two, part n binds to node n. */
Test(residency_state, each_nodes_slots_are_bound_to_its_node)
{
	if (numa_available() < 0)
		cr_skip_test("skipped: the kernel has no NUMA policy support");
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 4, 2, 9000);
	fixture_split(&f, 2);
	const int second = numa_max_node() >= 1 ? 1 : 0;
	const struct residency_node parts[2] = {{&f.node_map[0], 0, NULL},
	                                        {&f.node_map[1], second, NULL}};
	struct residency_config cfg = base_config(8u << 20);
	struct residency *r;
	struct sidecar_error err = {0};
	cr_assert_eq(residency_create_nodes(&r, parts, 2, &cfg, &err), 0, "%s", err.msg);
	for (uint32_t x = 0; x < 4; x++) {
		struct expert_ref ref;
		cr_assert_eq(residency_acquire(r, 0, x, 1.0f, 0, &ref), 0);
		cr_assert(fixture_held_matches(&f, r, &ref));
		for (uint32_t n = 0; n < 2; n++) {
			struct expert_ref mine;
			cr_assert_eq(residency_ref_node(r, &ref, n, &mine), 0);
			for (uint32_t i = 0; i < mine.n_extents; i++) {
				int mode = -1;
				unsigned long mask[16] = {0};
				cr_assert_eq(get_mempolicy(&mode, mask, sizeof(mask) * 8,
				                           (void *)mine.data[i], MPOL_F_ADDR),
				             0, "get_mempolicy: %s", strerror(errno));
				cr_expect_eq(mode, MPOL_BIND, "expert %u node %u extent %u", x, n,
				             i);
				for (int b = 0; b < (int)(sizeof(mask) * 8); b++)
					cr_expect_eq((mask[b / 64] >> (b % 64)) & 1ul,
					             (unsigned long)(b == parts[n].numa_node),
					             "expert %u node %u: policy mask bit %d", x, n,
					             b);
				cr_expect_eq(page_node(mine.data[i]), parts[n].numa_node,
				             "expert %u node %u extent %u", x, n, i);
			}
		}
		residency_release(r, &ref);
	}
	residency_destroy(r);
	fixture_destroy(&f);
}
