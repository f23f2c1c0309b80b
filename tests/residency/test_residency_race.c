/* test_residency_race.c — concurrency (run under TSan): many threads demanding overlapping
 * experts while eviction runs (bytes checked while held, so an eviction under a reader would
 * show), one read per expert for concurrent demands, and a failure delivered to every
 * waiter. Threads synchronise on counters and condition variables, never on sleeps. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "fixture.h"

struct race {
	struct residency *r;
	struct fixture *f;
	uint32_t seed;
	atomic_int *bad;
	atomic_ullong *acquires;
};

static void *demand_loop(void *arg)
{
	struct race *a = arg;
	uint64_t s = a->seed;
	for (int i = 0; i < 600; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		uint32_t l = (uint32_t)(s >> 60) % 2, x = (uint32_t)(s >> 40) % 12;
		struct expert_ref ref;
		int rc = residency_acquire(a->r, l, x, 1.0f, 0, &ref);
		if (rc != 0) {
			atomic_fetch_add(a->bad, 1);
			continue;
		}
		atomic_fetch_add(a->acquires, 1);
		if (!fixture_ref_matches(a->f, &ref))
			atomic_fetch_add(a->bad, 1);
		sched_yield(); /* let eviction run while this reader holds the expert */
		if (!fixture_ref_matches(a->f, &ref))
			atomic_fetch_add(a->bad, 1);
		residency_release(a->r, &ref);
		if (i % 50 == 0) {
			uint32_t ids[] = {(x + 1) % 12, (x + 2) % 12};
			residency_prefetch(a->r, l, ids, 2, 0.5f);
		}
	}
	return NULL;
}

static void run_race(const char *policy)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 2, 12, 2, 3000);
	struct residency_config cfg = {
	    .numa_node = 0,
	    .mem_budget = 8 * 16384, /* 8 slots for 24 experts, 6 threads */
	    .policy = policy,
	    .queue_depth = 4,
	    .chunk_bytes = 4096,
	};
	struct residency *r = fixture_residency(&f, &cfg);
	atomic_int bad = 0;
	atomic_ullong acquires = 0;
	pthread_t t[6];
	struct race args[6];
	for (int i = 0; i < 6; i++) {
		args[i] = (struct race){r, &f, (uint32_t)(i * 7 + 1), &bad, &acquires};
		cr_assert_eq(pthread_create(&t[i], NULL, demand_loop, &args[i]), 0);
	}
	for (int i = 0; i < 6; i++)
		pthread_join(t[i], NULL);
	struct residency_counters c;
	residency_counters(r, &c);
	cr_assert_eq(atomic_load(&bad), 0, "%s: a reader saw wrong bytes or an error", policy);
	cr_assert_eq(c.hits + c.cold_misses + c.inflight_misses, atomic_load(&acquires));
	cr_assert_geq(c.loads, c.cold_misses, "every cold miss loads once");
	cr_assert_leq(c.loads, c.cold_misses + c.prefetches);
	cr_assert_eq(c.failures, 0);
	cr_assert_gt(c.evictions, 0, "the test must make eviction run");
	cr_assert_leq(c.slots_used, c.slots);
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency_race, overlapping_demands_lru, .timeout = 120)
{
	run_race("lru");
}

Test(residency_race, overlapping_demands_sieve_layer, .timeout = 120)
{
	run_race("sieve+layer");
}

/* ---- one read for many waiters ---- */

#define WAITERS 5

struct held_gate {
	struct residency *r;
	atomic_int released;
	int fail_with; /* 0: pass through */
	atomic_int completions;
};

/* Holds the first completion until all WAITERS threads are counted as waiting on the load
 * (1 cold miss + WAITERS-1 in-flight misses); a condition on counters, not a delay. */
static int hold_until_all_wait(void *arg, const struct loader_read_info *info, int res)
{
	struct held_gate *g = arg;
	(void)info;
	atomic_fetch_add(&g->completions, 1);
	while (!atomic_load(&g->released)) {
		struct residency_counters c;
		residency_counters(g->r, &c);
		if (c.inflight_misses >= WAITERS - 1)
			atomic_store(&g->released, 1);
		else
			sched_yield();
	}
	return g->fail_with ? g->fail_with : res;
}

struct waiter {
	struct residency *r;
	struct fixture *f;
	int rc;
	bool exact;
};

static void *wait_for_expert(void *arg)
{
	struct waiter *w = arg;
	struct expert_ref ref;
	w->rc = residency_acquire(w->r, 0, 1, 1.0f, 0, &ref);
	if (w->rc == 0) {
		w->exact = fixture_ref_matches(w->f, &ref);
		residency_release(w->r, &ref);
	}
	return NULL;
}

static void run_waiters(int fail_with)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 2, 1, 3000); /* one expert = one 4 KiB-aligned read */
	struct held_gate g = {.fail_with = fail_with};
	struct residency_config cfg = {
	    .numa_node = 0,
	    .mem_budget = 1 << 20,
	    .policy = "lru",
	    .max_retries = 2,
	    .fault_hook = hold_until_all_wait,
	    .fault_arg = &g,
	};
	struct residency *r = fixture_residency(&f, &cfg);
	g.r = r;
	pthread_t t[WAITERS];
	struct waiter w[WAITERS];
	for (int i = 0; i < WAITERS; i++) {
		w[i] = (struct waiter){r, &f, 1, false};
		cr_assert_eq(pthread_create(&t[i], NULL, wait_for_expert, &w[i]), 0);
	}
	for (int i = 0; i < WAITERS; i++)
		pthread_join(t[i], NULL);
	struct residency_counters c;
	residency_counters(r, &c);
	cr_assert_eq(c.cold_misses, 1);
	cr_assert_eq(c.inflight_misses, WAITERS - 1);
	for (int i = 0; i < WAITERS; i++) {
		if (fail_with) {
			cr_assert_eq(w[i].rc, fail_with, "waiter %d got %d", i, w[i].rc);
		} else {
			cr_assert_eq(w[i].rc, 0);
			cr_assert(w[i].exact);
		}
	}
	if (fail_with) {
		cr_assert_eq(c.reads, 3, "one read, retried twice, for all waiters");
		cr_assert_eq(c.failures, 1);
	} else {
		cr_assert_eq(c.reads, 1, "exactly one read for %d concurrent demands", WAITERS);
		cr_assert_eq(c.loads, 1);
	}
	residency_destroy(r);
	fixture_destroy(&f);
}

Test(residency_race, concurrent_demands_share_one_read, .timeout = 120)
{
	run_waiters(0);
}

Test(residency_race, failure_reaches_every_waiter, .timeout = 120)
{
	run_waiters(-EIO);
}
