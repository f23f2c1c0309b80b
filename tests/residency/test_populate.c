/* test_populate.c — the pool populated in groups behind create, and the post-load stage off
 * the loader thread: a residency answers before its pool is pre-faulted, a load into a group
 * not yet populated waits for that group (no read is issued into it before), and a failure of
 * the post-load hook (the decode layout's stage) is a load failure. The populate thread is held
 * with a populate hook (fault_hook.h, residency_create_nodes_held), never timed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "fixture.h"
#include "slot_pool.h"

struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool open;
	atomic_uint calls;
};

/* Holds the populate thread before each group until the gate opens. */
static void hold_populate(void *arg, uint32_t node, uint32_t group)
{
	(void)node;
	(void)group;
	struct gate *g = arg;
	atomic_fetch_add(&g->calls, 1);
	pthread_mutex_lock(&g->mu);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

static void open_gate(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->open = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* 8 slots, one per group: create returns with no group populated; a demand into the first
 * group stays LOADING with no read issued until the gate opens, then reads its bytes. */
Test(populate, ready_before_the_pool_and_loads_wait_for_their_group)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 8, 2, 3000);
	struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, 0};
	struct residency_config cfg = {
	    .numa_node = 0,
	    .mem_budget = 8 * 16384,
	    .policy = "lru",
	    .fixed_buffer_max = 1, /* one slot per group */
	};
	struct residency *r = fixture_residency_held(&f, &cfg, hold_populate, &g);
	struct residency_counters c;
	residency_counters(r, &c);
	cr_assert_eq(c.slots, 8);
	cr_assert_eq(c.pool_groups, 8, "one group per slot");
	cr_assert_eq(c.populated_groups, 0, "create waited for the pool");

	struct expert_ref ref;
	cr_assert_eq(residency_acquire(r, 0, 3, 1.0f, RESIDENCY_NOWAIT, &ref), -EINPROGRESS);
	cr_assert_eq(residency_state(r, 0, 3), EXPERT_LOADING);
	residency_counters(r, &c);
	cr_assert_eq(c.reads, 0, "a read was issued into a group not populated");
	cr_assert_eq(c.populated_groups, 0);

	open_gate(&g);
	cr_assert_eq(residency_acquire(r, 0, 3, 1.0f, RESIDENCY_RETRY, &ref), 0);
	cr_assert(fixture_ref_matches(&f, &ref), "bytes differ from pread");
	residency_release(r, &ref);
	for (uint32_t x = 0; x < 8; x++) { /* every group, each expert in its own */
		cr_assert_eq(residency_acquire(r, 0, x, 1.0f, 0, &ref), 0, "expert %u", x);
		cr_assert(fixture_ref_matches(&f, &ref), "expert %u: bytes differ", x);
		residency_release(r, &ref);
	}
	residency_counters(r, &c);
	cr_assert_eq(c.populated_groups, 8, "every slot used: every group populated");
	cr_assert_geq(atomic_load(&g.calls), 8);
	if (c.buffers_registered)
		cr_assert_eq(c.fixed_reads, c.reads, "populated groups are registered");
	residency_destroy(r);
	fixture_destroy(&f);
}

struct layout_seen {
	pthread_t caller;
	atomic_uint runs, on_caller;
};

/* The post-load stage: inverts every byte of the expert, and refuses layer 0 expert 1. */
static int invert_or_refuse(void *arg, const struct residency_loaded *x, struct sidecar_error *err)
{
	struct layout_seen *s = arg;
	atomic_fetch_add(&s->runs, 1);
	if (pthread_equal(pthread_self(), s->caller))
		atomic_fetch_add(&s->on_caller, 1);
	if (x->layer == 0 && x->expert == 1)
		return error_set(err, MOE_EIO, "layout refused the rows of this expert");
	for (uint32_t i = 0; i < x->n_extents; i++)
		for (uint64_t j = 0; j < x->length[i]; j++)
			x->data[i][j] = (uint8_t)~x->data[i][j];
	return 0;
}

static bool inverted(const struct fixture *f, const struct expert_ref *ref)
{
	uint32_t n;
	const struct expert_extent *ext =
	    expert_map_extents(&f->map, ref->layer * f->map.n_experts + ref->expert, &n);
	for (uint32_t i = 0; i < n; i++)
		for (uint64_t j = 0; j < ext[i].length; j++)
			if ((ref->data[i][j] ^ f->bytes[ext[i].offset + j]) != 0xff)
				return false;
	return true;
}

/* A failure in the post-load stage is a load failure: FAILED with the stage's message, the
 * slot given back, counted as a failure; the experts it converts are seen converted. */
Test(populate, a_layout_failure_is_a_load_failure)
{
	struct fixture f;
	fixture_create(&f, "/tmp", 1, 4, 2, 3000);
	struct layout_seen seen = {.caller = pthread_self()};
	struct residency_config cfg = {
	    .numa_node = 0,
	    .mem_budget = 4 * 16384,
	    .policy = "lru",
	    .post_load = invert_or_refuse,
	    .post_load_arg = &seen,
	};
	struct residency *r = fixture_residency(&f, &cfg);
	struct expert_ref ref;
	cr_assert_eq(residency_acquire(r, 0, 0, 1.0f, 0, &ref), 0);
	cr_assert(inverted(&f, &ref), "a reader saw bytes before the post-load stage");
	residency_release(r, &ref);
	cr_assert_eq(residency_acquire(r, 0, 1, 1.0f, 0, &ref), -EIO);
	cr_assert_eq(residency_state(r, 0, 1), EXPERT_FAILED);
	char msg[256];
	residency_error_message(r, 0, 1, msg, sizeof(msg));
	cr_assert(strstr(msg, "layout refused the rows of this expert"), "message: %s", msg);
	struct residency_counters c;
	residency_counters(r, &c);
	cr_assert_eq(c.failures, 1);
	cr_assert_eq(c.slots_used, 1, "the failed expert's slot was given back");
	cr_assert_eq(atomic_load(&seen.on_caller), 0, "the stage ran on the caller");
	cr_assert_eq(residency_acquire(r, 0, 2, 1.0f, 0, &ref), 0);
	cr_assert(inverted(&f, &ref));
	residency_release(r, &ref);
	cr_assert_eq(atomic_load(&seen.runs), 3, "once per load");
	cr_assert_gt(c.layout_ns, 0, "the stage's time is counted");
	residency_destroy(r);
	fixture_destroy(&f);
}

/* The page-size choice from the figures it is given (never timed here): huge, then 4 KiB,
 * each measured once; huge pages unless 4 KiB ones were at least POPULATE_SMALL_MARGIN times
 * faster; the kind not chosen every POPULATE_PROBE_EVERY-th step, so a rate that changed is
 * seen. */
Test(populate_pages, huge_unless_small_pages_are_clearly_faster)
{
	struct populate_pages p = {0};
	cr_assert(populate_pages_huge(&p), "the first step measures huge pages");
	populate_pages_note(&p, true, 64u << 20, 640u << 20); /* 10 ns per byte */
	cr_assert_not(populate_pages_huge(&p), "the second measures 4 KiB pages");
	populate_pages_note(&p, false, 64u << 20, 384u << 20); /* 6: 1.7x, below the margin */
	for (uint32_t s = 2; s < 3 * POPULATE_PROBE_EVERY; s++) {
		const bool huge = populate_pages_huge(&p);
		const bool probe = s % POPULATE_PROBE_EVERY == POPULATE_PROBE_EVERY - 1;
		cr_assert_eq(huge, !probe, "step %u: huge pages unless a probe", s);
		populate_pages_note(&p, huge, 64u << 20, huge ? 640u << 20 : 384u << 20);
	}
	/* 4 KiB pages now 4x faster (what free page reporting did to huge pages here) */
	populate_pages_note(&p, false, 64u << 20, 160u << 20);
	const uint32_t at = p.steps;
	for (uint32_t s = at; s < at + 2 * POPULATE_PROBE_EVERY; s++) {
		const bool huge = populate_pages_huge(&p);
		const bool probe = s % POPULATE_PROBE_EVERY == POPULATE_PROBE_EVERY - 1;
		cr_assert_eq(huge, probe, "step %u: 4 KiB pages unless a probe", s);
		populate_pages_note(&p, huge, 64u << 20, huge ? 640u << 20 : 160u << 20);
	}
	/* a probe finds huge pages fast again (memory the host still backs): back to them */
	while (!populate_pages_huge(&p))
		populate_pages_note(&p, false, 64u << 20, 160u << 20);
	populate_pages_note(&p, true, 64u << 20, 64u << 20);
	cr_assert(populate_pages_huge(&p));
}

/* The advice of the smaps entry holding `addr`: its VmFlags line. */
static void vm_flags_at(const void *addr, char *out, size_t len)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	cr_assert_not_null(f);
	char line[512];
	bool in = false;
	out[0] = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
		    strchr(line, '-') < strchr(line, ' '))
			in = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
		else if (in && !strncmp(line, "VmFlags:", 8)) {
			snprintf(out, len, "%s", line + 8);
			break;
		}
	}
	fclose(f);
}

/* slot_pool_populate: a THP-advised pool's range populated with 4 KiB pages is advised
 * MADV_NOHUGEPAGE, one with huge pages MADV_HUGEPAGE; both are resident afterwards. */
Test(populate_pages, a_range_gets_the_pages_asked)
{
	struct slot_pool pool;
	struct sidecar_error err = {0};
	cr_assert_eq(slot_pool_create(&pool, -1, 8u << 20, 1u << 20, &err), 0, "%s", err.msg);
	if (!pool.thp_advised || pool.hugetlb) {
		slot_pool_destroy(&pool);
		cr_skip_test("the pool is not THP-advised here (hugetlb, or no THP)");
	}
	slot_pool_populate(&pool, 0, 4u << 20, false);
	slot_pool_populate(&pool, 4u << 20, 4u << 20, true);
	char flags[512];
	vm_flags_at(pool.base, flags, sizeof(flags));
	cr_assert(strstr(flags, " nh"), "4 KiB range not advised NOHUGEPAGE: %s", flags);
	vm_flags_at(pool.base + (4u << 20), flags, sizeof(flags));
	cr_assert(strstr(flags, " hg"), "huge range not advised HUGEPAGE: %s", flags);
	cr_assert_eq(slot_pool_resident_bytes(&pool), 8u << 20);
	slot_pool_destroy(&pool);
}
