/* race_scenarios.c — see race_scenarios.h. Many threads demand overlapping experts while
 * eviction runs (bytes checked while held, on every node, so an eviction under a reader would
 * show); concurrent demands for one expert share one read per node; a failure (on one node's
 * slice) reaches every waiter. Threads synchronise on counters and joins, never on sleeps. */
#include "race_scenarios.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "fixture.h"

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: failed: %s: ", __FILE__, __LINE__, #cond);         \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			return -1;                                                                 \
		}                                                                                  \
	} while (0)

#define RACE_THREADS 6

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
		if (!fixture_held_matches(a->f, a->r, &ref))
			atomic_fetch_add(a->bad, 1);
		sched_yield(); /* let eviction run while this reader holds the expert */
		if (!fixture_held_matches(a->f, a->r, &ref))
			atomic_fetch_add(a->bad, 1);
		residency_release(a->r, &ref);
		if (i % 50 == 0) {
			uint32_t ids[] = {(x + 1) % 12, (x + 2) % 12};
			residency_prefetch(a->r, l, ids, 2, 0.5f);
		}
	}
	return NULL;
}

/* After the threads: every node holds the slices of exactly the RESIDENT experts, one slot
 * each (no node keeps a slice of an evicted expert). */
static int same_experts_everywhere(struct residency *r, struct fixture *f)
{
	const uint32_t n_nodes = f->n_nodes ? f->n_nodes : 1;
	uint32_t resident = 0;
	uint64_t want[FIXTURE_MAX_NODES] = {0};
	for (uint32_t l = 0; l < f->map.n_layers; l++)
		for (uint32_t x = 0; x < f->map.n_experts; x++) {
			if (residency_state(r, l, x) != EXPERT_RESIDENT)
				continue;
			resident++;
			for (uint32_t n = 0; n < n_nodes; n++) {
				uint32_t k;
				const struct expert_extent *ext =
				    expert_map_extents(f->n_nodes ? &f->node_map[n] : &f->map,
				                       l * f->map.n_experts + x, &k);
				for (uint32_t i = 0; i < k; i++)
					want[n] += ext[i].length;
			}
		}
	for (uint32_t n = 0; n < n_nodes; n++) {
		struct residency_counters c;
		CHECK(residency_node_counters(r, n, &c) == 0, "node %u", n);
		CHECK(c.resident_bytes == want[n] && c.slots_used == resident,
		      "node %u: %llu bytes in %u slots; %u experts resident, %llu bytes", n,
		      (unsigned long long)c.resident_bytes, c.slots_used, resident,
		      (unsigned long long)want[n]);
	}
	return 0;
}

/* mixed: layer 1's experts about 5 times layer 0's (two slot size classes). */
static int overlapping_demands(const char *policy, uint32_t n_nodes, bool mixed)
{
	struct fixture f;
	fixture_create_mix(&f, "/tmp", 2, 12, 2, 3000, mixed ? 20000 : 3000);
	if (n_nodes > 1)
		fixture_split(&f, n_nodes);
	struct residency_config cfg = {
	    .numa_node = 0,
	    /* 8 slots for 24 experts, 6 threads (mixed: about 4 of each size) */
	    .mem_budget = n_nodes * 8 * (mixed ? 32768 : 16384),
	    .policy = policy,
	    .queue_depth = 4,
	    .chunk_bytes = 4096,
	};
	struct residency *r = fixture_residency(&f, &cfg);
	atomic_int bad = 0;
	atomic_ullong acquires = 0;
	pthread_t t[RACE_THREADS];
	struct race args[RACE_THREADS];
	for (int i = 0; i < RACE_THREADS; i++) {
		args[i] = (struct race){r, &f, (uint32_t)(i * 7 + 1), &bad, &acquires};
		CHECK(pthread_create(&t[i], NULL, demand_loop, &args[i]) == 0, "pthread_create");
	}
	for (int i = 0; i < RACE_THREADS; i++)
		pthread_join(t[i], NULL);
	struct residency_counters c;
	residency_counters(r, &c);
	int rc = 0;
	if (atomic_load(&bad) != 0 ||
	    c.hits + c.cold_misses + c.inflight_misses != atomic_load(&acquires) ||
	    c.loads < c.cold_misses || c.loads > c.cold_misses + c.prefetches || c.failures ||
	    !c.evictions || c.slots_used > c.slots) {
		fprintf(stderr,
		        "%s: bad %d, acquires %llu, hits %llu cold %llu inflight %llu, loads %llu, "
		        "prefetches %llu, failures %llu, evictions %llu, slots %u/%u\n",
		        policy, atomic_load(&bad), (unsigned long long)atomic_load(&acquires),
		        (unsigned long long)c.hits, (unsigned long long)c.cold_misses,
		        (unsigned long long)c.inflight_misses, (unsigned long long)c.loads,
		        (unsigned long long)c.prefetches, (unsigned long long)c.failures,
		        (unsigned long long)c.evictions, c.slots_used, c.slots);
		rc = -1;
	}
	if (rc == 0)
		rc = same_experts_everywhere(r, &f);
	if (rc == 0 && mixed && c.slot_bytes * c.slots > cfg.mem_budget) {
		fprintf(stderr, "%s: %u slots of %llu bytes on average over a budget of %llu\n",
		        policy, c.slots, (unsigned long long)c.slot_bytes,
		        (unsigned long long)cfg.mem_budget);
		rc = -1;
	}
	residency_destroy(r);
	fixture_destroy(&f);
	return rc;
}

int race_overlapping_demands(const char *policy, uint32_t n_nodes)
{
	return overlapping_demands(policy, n_nodes, false);
}

int race_overlapping_demands_mixed(const char *policy, uint32_t n_nodes)
{
	return overlapping_demands(policy, n_nodes, true);
}

#define WAITERS 5

struct held_gate {
	struct residency *_Atomic r;
	atomic_int released;
	int fail_with;      /* 0: pass through */
	uint32_t fail_node; /* whose reads fail */
};

/* Holds the first completion until all WAITERS threads wait on the load (1 cold miss +
 * WAITERS-1 in-flight misses): a condition on counters, not a delay. */
static int hold_until_all_wait(void *arg, const struct loader_read_info *info, int res)
{
	struct held_gate *g = arg;
	while (!atomic_load(&g->released)) {
		struct residency_counters c;
		residency_counters(atomic_load(&g->r), &c);
		if (c.inflight_misses >= WAITERS - 1)
			atomic_store(&g->released, 1);
		else
			sched_yield();
	}
	return g->fail_with && info->node == g->fail_node ? g->fail_with : res;
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
		w->exact = fixture_held_matches(w->f, w->r, &ref);
		residency_release(w->r, &ref);
	}
	return NULL;
}

int race_shared_load(int fail_with, uint32_t n_nodes)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 2, 1, 3000); /* one expert = one read per node */
	if (n_nodes > 1)
		fixture_split(&f, n_nodes);
	struct held_gate g = {.fail_with = fail_with, .fail_node = n_nodes - 1};
	struct residency_config cfg = {
	    .numa_node = 0,
	    .mem_budget = n_nodes << 20,
	    .policy = "lru",
	    .max_retries = 2,
	};
	struct residency *r = fixture_residency(&f, &cfg);
	residency_set_fault_hook(r, hold_until_all_wait, &g);
	atomic_store(&g.r, r);
	pthread_t t[WAITERS];
	struct waiter w[WAITERS];
	for (int i = 0; i < WAITERS; i++) {
		w[i] = (struct waiter){r, &f, 1, false};
		CHECK(pthread_create(&t[i], NULL, wait_for_expert, &w[i]) == 0, "pthread_create");
	}
	for (int i = 0; i < WAITERS; i++)
		pthread_join(t[i], NULL);
	struct residency_counters c;
	residency_counters(r, &c);
	residency_destroy(r);
	fixture_destroy(&f);
	CHECK(c.cold_misses == 1, "%llu cold misses", (unsigned long long)c.cold_misses);
	CHECK(c.inflight_misses == WAITERS - 1, "%llu in-flight misses",
	      (unsigned long long)c.inflight_misses);
	for (int i = 0; i < WAITERS; i++) {
		if (fail_with) {
			CHECK(w[i].rc == fail_with, "waiter %d got %d", i, w[i].rc);
		} else {
			CHECK(w[i].rc == 0 && w[i].exact, "waiter %d: rc %d, exact %d", i, w[i].rc,
			      w[i].exact);
		}
	}
	if (fail_with) { /* the last node's read retried twice, one read on each other node */
		CHECK(c.reads == 3 + (n_nodes - 1),
		      "%llu reads: want one per node, the failing one retried twice, for all "
		      "waiters",
		      (unsigned long long)c.reads);
		CHECK(c.failures == 1 && c.slots_used == 0, "%llu failures, %u slots in use",
		      (unsigned long long)c.failures, c.slots_used);
	} else {
		CHECK(c.reads == n_nodes && c.loads == 1, "%llu reads, %llu loads for %d demands",
		      (unsigned long long)c.reads, (unsigned long long)c.loads, WAITERS);
	}
	return 0;
}

#define RETRY_THREADS 4

/* Every third read completion of the residency fails. */
static int fail_every_third(void *arg, const struct loader_read_info *info, int res)
{
	(void)arg;
	return info->seq % 3 == 0 ? -EIO : res;
}

struct retrier {
	struct residency *r;
	struct fixture *f;
	uint32_t seed;
	atomic_int *bad;
	atomic_int *done;
};

static void *demand_failing(void *arg)
{
	struct retrier *a = arg;
	uint64_t s = a->seed;
	for (int i = 0; i < 300; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		struct expert_ref ref;
		int rc = residency_acquire(a->r, 0, (uint32_t)(s >> 33) % 4, 1.0f, 0, &ref);
		if (rc == 0) {
			if (!fixture_held_matches(a->f, a->r, &ref))
				atomic_fetch_add(a->bad, 1);
			residency_release(a->r, &ref);
		} else if (rc != -EIO) {
			fprintf(stderr, "race_failed_retries: demand got %d\n", rc);
			atomic_fetch_add(a->bad, 1);
		}
	}
	atomic_fetch_add(a->done, 1);
	return NULL;
}

static void *retry_all_loop(void *arg)
{
	struct retrier *a = arg;
	while (atomic_load(a->done) < RETRY_THREADS) {
		residency_retry_all_failed(a->r);
		struct residency_counters c;
		residency_counters(a->r, &c);
		if (c.failed_now > 4)
			atomic_fetch_add(a->bad, 1);
		sched_yield();
	}
	return NULL;
}

int race_failed_retries(uint32_t n_nodes)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 4, 1, 3000);
	if (n_nodes > 1)
		fixture_split(&f, n_nodes);
	struct residency_config cfg = {
	    .numa_node = 0,
	    .mem_budget = n_nodes * 2 * 8192,
	    .policy = "lru",
	    .retry_backoff_ms = RESIDENCY_NO_BACKOFF,
	};
	struct residency *r = fixture_residency(&f, &cfg);
	residency_set_fault_hook(r, fail_every_third, NULL);
	atomic_int bad = 0, done = 0;
	pthread_t t[RETRY_THREADS + 1];
	struct retrier a[RETRY_THREADS + 1];
	for (int i = 0; i <= RETRY_THREADS; i++) {
		a[i] = (struct retrier){r, &f, (uint32_t)(7 + i), &bad, &done};
		CHECK(pthread_create(&t[i], NULL,
		                     i < RETRY_THREADS ? demand_failing : retry_all_loop,
		                     &a[i]) == 0,
		      "pthread_create");
	}
	for (int i = 0; i <= RETRY_THREADS; i++)
		pthread_join(t[i], NULL);
	struct residency_counters c;
	residency_counters(r, &c);
	uint32_t failed = 0;
	for (uint32_t x = 0; x < 4; x++)
		failed += residency_state(r, 0, x) == EXPERT_FAILED;
	const int same = same_experts_everywhere(r, &f);
	residency_destroy(r);
	fixture_destroy(&f);
	CHECK(atomic_load(&bad) == 0, "%d wrong answers", atomic_load(&bad));
	CHECK(same == 0, "nodes disagree");
	CHECK(c.failures > 0 && c.failed_retries > 0, "failures %llu, retries %llu",
	      (unsigned long long)c.failures, (unsigned long long)c.failed_retries);
	CHECK(c.failed_now == failed, "failed_now %llu, FAILED experts %u",
	      (unsigned long long)c.failed_now, failed);
	CHECK(c.failed_retries <= c.loads + c.failures, "%llu retries of %llu loads started",
	      (unsigned long long)c.failed_retries, (unsigned long long)(c.loads + c.failures));
	return 0;
}

#define REFUSED_LAYER 1u
#define REFUSED_EXPERT 11u

/* The populate thread yields before each group, so that loads park behind it. */
static void yield_before_group(void *arg, uint32_t node, uint32_t group)
{
	(void)node;
	(void)group;
	atomic_fetch_add((atomic_uint *)arg, 1);
	for (int i = 0; i < 20; i++)
		sched_yield();
}

/* The post-load stage: inverts the slice's bytes; refuses one expert on every node. */
static int invert_slice(void *arg, const struct residency_loaded *x, struct sidecar_error *err)
{
	(void)arg;
	if (x->layer == REFUSED_LAYER && x->expert == REFUSED_EXPERT)
		return error_set(err, MOE_EIO, "layout refused it");
	for (uint32_t i = 0; i < x->n_extents; i++)
		for (uint64_t j = 0; j < x->length[i]; j++)
			x->data[i][j] = (uint8_t)~x->data[i][j];
	return 0;
}

/* Every node's slices of a held expert are the file's bytes inverted. */
static bool held_inverted(const struct fixture *f, const struct residency *r,
                          const struct expert_ref *ref)
{
	const uint32_t n_nodes = f->n_nodes ? f->n_nodes : 1;
	for (uint32_t n = 0; n < n_nodes; n++) {
		struct expert_ref node;
		if (residency_ref_node(r, ref, n, &node) != 0)
			return false;
		const struct expert_map *map = f->n_nodes ? &f->node_map[n] : &f->map;
		uint32_t k;
		const struct expert_extent *ext =
		    expert_map_extents(map, ref->layer * map->n_experts + ref->expert, &k);
		for (uint32_t i = 0; i < k; i++)
			for (uint64_t j = 0; j < ext[i].length; j++)
				if ((node.data[i][j] ^ f->bytes[ext[i].offset + j]) != 0xff)
					return false;
	}
	return true;
}

struct converted_race {
	struct residency *r;
	struct fixture *f;
	uint32_t seed;
	atomic_int *bad;
	atomic_uint *refused;
};

static void *demand_converted(void *arg)
{
	struct converted_race *a = arg;
	uint64_t s = a->seed;
	for (int i = 0; i < 300; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		const uint32_t l = (uint32_t)(s >> 60) % 2, x = (uint32_t)(s >> 40) % 12;
		struct expert_ref ref;
		const int rc = residency_acquire(a->r, l, x, 1.0f, 0, &ref);
		const bool refused = l == REFUSED_LAYER && x == REFUSED_EXPERT;
		if (refused) {
			atomic_fetch_add(a->refused, 1);
			if (rc != -EIO)
				atomic_fetch_add(a->bad, 1);
			continue;
		}
		if (rc != 0) {
			atomic_fetch_add(a->bad, 1);
			continue;
		}
		if (!held_inverted(a->f, a->r, &ref))
			atomic_fetch_add(a->bad, 1);
		residency_release(a->r, &ref);
	}
	return NULL;
}

int race_populate_layout(uint32_t n_nodes)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 2, 12, 2, 3000);
	if (n_nodes > 1)
		fixture_split(&f, n_nodes);
	atomic_uint groups_seen = 0;
	struct residency_config cfg = {
	    .numa_node = 0,
	    .mem_budget = n_nodes * 8 * 16384, /* 8 slots for 24 experts */
	    .policy = "lru",
	    .queue_depth = 4,
	    .chunk_bytes = 4096,
	    .retry_backoff_ms = RESIDENCY_NO_BACKOFF, /* the refused expert is tried each time */
	    .fixed_buffer_max = 1,                    /* a group per slot */
	    .post_load = invert_slice,
	};
	struct residency *r = fixture_residency_held(&f, &cfg, yield_before_group, &groups_seen);
	atomic_int bad = 0;
	atomic_uint refused = 0;
	pthread_t t[RACE_THREADS];
	struct converted_race args[RACE_THREADS];
	for (int i = 0; i < RACE_THREADS; i++) {
		args[i] = (struct converted_race){r, &f, (uint32_t)(i * 13 + 3), &bad, &refused};
		CHECK(pthread_create(&t[i], NULL, demand_converted, &args[i]) == 0,
		      "pthread_create");
	}
	for (int i = 0; i < RACE_THREADS; i++)
		pthread_join(t[i], NULL);
	struct residency_counters c;
	residency_counters(r, &c);
	int rc = 0;
	if (atomic_load(&bad) != 0 || (atomic_load(&refused) && !c.failures) ||
	    c.failures > atomic_load(&refused) || c.populated_groups > c.pool_groups ||
	    c.pool_groups != n_nodes * 8 || !c.evictions) {
		fprintf(stderr,
		        "populate/layout (%u nodes): bad %d, refused demands %u, failures %llu, "
		        "groups %llu of %llu, evictions %llu\n",
		        n_nodes, atomic_load(&bad), atomic_load(&refused),
		        (unsigned long long)c.failures, (unsigned long long)c.populated_groups,
		        (unsigned long long)c.pool_groups, (unsigned long long)c.evictions);
		rc = -1;
	}
	if (rc == 0)
		rc = same_experts_everywhere(r, &f);
	residency_destroy(r);
	fixture_destroy(&f);
	return rc;
}
