/* test_idle.c — an idle sidecar with two connected clients sleeps: over one second of
 * idleness it consumes ~0 CPU ticks (a spinning dispatcher would consume ~100). This is a
 * behaviour (sleeping vs spinning), not a speed threshold. */
#include <criterion/criterion.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "harness.h"
#include "moe_client.h"

/* Child: connects, pings, reports ready, then blocks until the parent closes `stop`. */
static int idle_client(const char *path, int ready, int stop)
{
	struct moe_connect_opts o = {.socket_path = path, .max_tokens = 2, .hidden = 16};
	struct moe_client *c;
	if (moe_connect(&o, &c) != MOE_OK || moe_ping(c, 5000) != MOE_OK)
		return 1;
	if (write(ready, "r", 1) != 1)
		return 2;
	char b;
	while (read(stop, &b, 1) > 0)
		;
	moe_close(c);
	return 0;
}

Test(idle, sidecar_sleeps_with_two_idle_clients, .timeout = 60)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	int ready[2], stop[2];
	cr_assert_eq(pipe(ready), 0);
	cr_assert_eq(pipe(stop), 0);
	pid_t kids[2];
	for (int i = 0; i < 2; i++) {
		kids[i] = fork();
		if (kids[i] == 0) {
			close(ready[0]);
			close(stop[1]);
			_exit(idle_client(sp.socket, ready[1], stop[0]));
		}
	}
	close(ready[1]);
	close(stop[0]);
	char b[2];
	cr_assert_eq(read(ready[0], b, 1), 1);
	cr_assert_eq(read(ready[0], b + 1, 1), 1);
	/* The measurement window: one second of nobody asking anything. */
	const long before = proc_cpu_ticks(sp.pid);
	struct timespec one_second = {.tv_sec = 1};
	nanosleep(&one_second, NULL);
	const long after = proc_cpu_ticks(sp.pid);
	cr_assert_geq(before, 0);
	cr_assert_leq(after - before, 2, "an idle sidecar must sleep: %ld ticks in 1 s",
	              after - before);
	close(stop[1]);
	for (int i = 0; i < 2; i++) {
		int st;
		cr_assert_eq(waitpid(kids[i], &st, 0), kids[i]);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	cr_assert_eq(sidecar_stop(&sp, SIGTERM), 0);
	sidecar_cleanup(&sp);
}

/* A client that never drains its CQ: the sidecar stops taking its submissions and sleeps
 * instead of spinning on them (same behaviour check: ~0 ticks over one second). */
Test(idle, undrained_cq_does_not_make_the_sidecar_spin, .timeout = 60)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	struct moe_connect_opts o = {
	    .socket_path = sp.socket, .max_tokens = 2, .hidden = 16, .n_slots = 4};
	struct moe_client *c;
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "%s", moe_connect_error());
	struct moe_client_raw raw;
	moe_client_raw(c, &raw);
	struct moe_sqe *sqes = (struct moe_sqe *)(raw.base + raw.layout.sq_entries);
	struct moe_ring_ctrl *cqc = (struct moe_ring_ctrl *)(raw.base + raw.layout.cq_ctrl);
	const uint32_t entries = raw.layout.ring_entries;
	const uint32_t cq_start = raw.cq->head;
	/* Fill the CQ, then fill the SQ behind it; never reap. */
	for (uint32_t i = 0; i < 2 * entries; i++) {
		while (moe_ring_space(raw.sq) == 0)
			sched_yield(); /* the sidecar takes the first `entries` */
		sqes[moe_ring_prod_pos(raw.sq, 0)] =
		    (struct moe_sqe){.op = MOE_OP_PING, .slot = i % entries, .user_data = i};
		moe_ring_publish(raw.sq, 1);
		moe_ring_wake_consumer(raw.sq);
	}
	while (atomic_load(&cqc->tail) - cq_start != entries) /* the event: CQ full */
		sched_yield();
	const long before = proc_cpu_ticks(sp.pid);
	struct timespec one_second = {.tv_sec = 1};
	nanosleep(&one_second, NULL);
	const long after = proc_cpu_ticks(sp.pid);
	cr_assert_leq(after - before, 2, "blocked on a full CQ, the sidecar must sleep: %ld ticks",
	              after - before);
	cr_assert_eq(atomic_load(&cqc->tail) - cq_start, entries, "and not overfill the CQ");
	/* Draining lets it continue: all 2 x entries complete, in order. */
	for (uint32_t i = 0; i < 2 * entries; i++) {
		struct moe_completion d;
		cr_assert_eq(moe_wait(c, &d, 10000), MOE_OK, "%s", moe_last_error(c));
		cr_assert_eq(d.user_data, i);
		cr_assert_eq(d.status, MOE_OK);
	}
	moe_close(c);
	cr_assert_eq(sidecar_stop(&sp, SIGTERM), 0);
	sidecar_cleanup(&sp);
}
