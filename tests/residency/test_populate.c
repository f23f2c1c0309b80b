/* test_populate.c — the pool populated in groups behind create, and the post-load stage off
 * the loader thread: a residency answers before its pool is pre-faulted, a load into a group
 * not yet populated waits for that group (no read is issued into it before), and a failure of
 * the post-load hook (the decode layout's stage) is a load failure. The populate thread is held
 * with a populate hook (fault_hook.h, residency_create_nodes_held), never timed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "fixture.h"

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
