/* test_liveness.c — peers dying: kill -9 of clients mid-request (the sidecar reclaims each
 * channel and keeps serving the others), kill of the sidecar (a waiting client gets
 * MOE_EPEERDEAD, never a hang), a clean shutdown seen by a waiting client, and the timeout
 * when simply nothing completes. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "moe_client.h"
#include "moe_proto.h"

static struct moe_client *connect_or_die(const char *path, uint32_t tokens, uint32_t hidden)
{
	struct moe_connect_opts o = {
	    .socket_path = path, .max_tokens = tokens, .hidden = hidden, .n_slots = 2};
	struct moe_client *c = NULL;
	int rc = moe_connect(&o, &c);
	cr_assert_eq(rc, MOE_OK, "%s", moe_connect_error());
	return c;
}

/* Child: streams ECHO requests on both slots forever; one byte on `ready` after the first
 * completion, so the parent knows it is mid-stream when it kills it. */
static void streaming_child(const char *path, int ready)
{
	struct moe_connect_opts o = {
	    .socket_path = path, .max_tokens = 64, .hidden = 1024, .n_slots = 2};
	struct moe_client *c;
	if (moe_connect(&o, &c) != MOE_OK)
		_exit(3);
	struct moe_slot s[2];
	moe_slot_acquire(c, &s[0]);
	moe_slot_acquire(c, &s[1]);
	for (int i = 0; i < 2; i++) {
		struct moe_request r = {.op = MOE_OP_ECHO, .slot = s[i].index, .n_tokens = 64};
		moe_submit(c, &r);
	}
	bool told = false;
	for (;;) {
		struct moe_completion d;
		if (moe_wait(c, &d, -1) != MOE_OK)
			_exit(4);
		if (!told) {
			told = write(ready, "x", 1) == 1;
		}
		struct moe_request r = {.op = MOE_OP_ECHO, .slot = d.slot, .n_tokens = 64};
		moe_submit(c, &r);
	}
}

Test(liveness, kill9_clients_mid_request_repeatedly, .timeout = 240)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	/* A well-behaved client connected throughout. */
	struct moe_client *steady = connect_or_die(sp.socket, 4, 64);
	cr_assert_eq(moe_ping(steady, 5000), MOE_OK);
	const int baseline = proc_fd_count(sp.pid);
	cr_assert_gt(baseline, 0);
	const int rounds = 20;
	for (int i = 0; i < rounds; i++) {
		int p[2];
		cr_assert_eq(pipe(p), 0);
		pid_t kid = fork();
		if (kid == 0) {
			close(p[0]);
			moe_close(steady); /* not ours to use: just drop our copy of the mapping */
			streaming_child(sp.socket, p[1]);
		}
		close(p[1]);
		char b;
		cr_assert_eq(read(p[0], &b, 1), 1, "round %d: the child got served", i);
		close(p[0]);
		cr_assert_eq(kill(kid, SIGKILL), 0);
		int st;
		cr_assert_eq(waitpid(kid, &st, 0), kid);
		cr_assert(WIFSIGNALED(st), "round %d: it died of the signal, not of an error", i);
		cr_assert(log_wait(&sp, "client disconnected", i + 1, 10000),
		          "round %d: channel reclaimed", i);
		cr_assert_eq(proc_fd_count(sp.pid), baseline, "round %d: fds back to baseline", i);
		cr_assert_eq(moe_ping(steady, 5000), MOE_OK, "round %d: others unaffected", i);
	}
	struct moe_client *fresh = connect_or_die(sp.socket, 4, 64);
	cr_assert_eq(moe_ping(fresh, 5000), MOE_OK, "a new client is served after the kills");
	moe_close(fresh);
	moe_close(steady);
	cr_assert_eq(sidecar_stop(&sp, SIGTERM), 0, "alive and exits cleanly");
	sidecar_cleanup(&sp);
}

/* Child: connects, says ready, then waits (with `policy`) with no limit; exits with
 * -status. */
static int waiting_child(const char *path, int ready, enum moe_wait_policy policy)
{
	struct moe_client *c;
	struct moe_connect_opts o = {.socket_path = path, .max_tokens = 4, .hidden = 64};
	if (moe_connect(&o, &c) != MOE_OK)
		return 100;
	if (moe_set_wait_policy(c, policy) != MOE_OK)
		return 103;
	struct moe_completion d;
	if (write(ready, "x", 1) != 1)
		return 101;
	int rc = moe_wait(c, &d, -1);
	/* After the death is seen, everything else fails fast too. */
	struct moe_slot s;
	moe_slot_acquire(c, &s);
	struct moe_request r = {.op = MOE_OP_PING, .slot = s.index};
	if (moe_submit(c, &r) != MOE_EPEERDEAD)
		return 102;
	moe_close(c);
	return -rc;
}

static void sidecar_dies_under_a_waiting_client(int sig, enum moe_wait_policy policy)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t kid = fork();
	if (kid == 0) {
		close(p[0]);
		_exit(waiting_child(sp.socket, p[1], policy));
	}
	close(p[1]);
	char b;
	cr_assert_eq(read(p[0], &b, 1), 1);
	close(p[0]);
	int st = sidecar_stop(&sp, sig);
	if (sig == SIGTERM)
		cr_assert_eq(st, 0, "clean shutdown with a client connected");
	cr_assert_eq(waitpid(kid, &st, 0), kid);
	cr_assert(WIFEXITED(st), "the client returned (no hang, no crash)");
	cr_assert_eq(WEXITSTATUS(st), -MOE_EPEERDEAD, "moe_wait said %s",
	             moe_strerror(-WEXITSTATUS(st)));
	sidecar_cleanup(&sp);
}

Test(liveness, sidecar_kill9_wakes_a_waiting_client_with_peerdead, .timeout = 60)
{
	sidecar_dies_under_a_waiting_client(SIGKILL, MOE_WAIT_ADAPTIVE);
}

Test(liveness, sidecar_sigterm_wakes_a_waiting_client_with_peerdead, .timeout = 60)
{
	sidecar_dies_under_a_waiting_client(SIGTERM, MOE_WAIT_ADAPTIVE);
}

/* A client that polls instead of sleeping (MOE_WAIT_SPIN) still sees the sidecar's death. */
Test(liveness, sidecar_kill9_ends_a_spinning_wait_with_peerdead, .timeout = 60)
{
	sidecar_dies_under_a_waiting_client(SIGKILL, MOE_WAIT_SPIN);
}

/* The other policies: SPIN and SLEEP still time out, take completions and answer PING; an
 * unknown policy is refused. */
Test(liveness, wait_policies_time_out_and_complete)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	struct moe_client *c = connect_or_die(sp.socket, 4, 64);
	cr_assert_eq(moe_set_wait_policy(c, (enum moe_wait_policy)7), MOE_EINVAL);
	cr_assert_eq(moe_set_wait_policy(NULL, MOE_WAIT_SPIN), MOE_EINVAL);
	const enum moe_wait_policy policies[] = {MOE_WAIT_SPIN, MOE_WAIT_SLEEP};
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(moe_set_wait_policy(c, policies[i]), MOE_OK);
		struct moe_completion d;
		cr_assert_eq(moe_wait(c, &d, 60), MOE_ETIMEDOUT, "policy %d", (int)policies[i]);
		for (int j = 0; j < 20; j++)
			cr_assert_eq(moe_ping(c, 5000), MOE_OK, "policy %d, ping %d",
			             (int)policies[i], j);
	}
	moe_close(c);
	sidecar_cleanup(&sp);
}

Test(liveness, nothing_completes_means_timeout)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	struct moe_client *c = connect_or_die(sp.socket, 4, 64);
	struct moe_completion d;
	cr_assert_eq(moe_wait(c, &d, 120), MOE_ETIMEDOUT);
	cr_assert_eq(moe_poll(c, &d), MOE_EAGAIN);
	cr_assert_eq(moe_ping(c, 5000), MOE_OK, "still usable after a timeout");
	moe_close(c);
	sidecar_cleanup(&sp);
}
