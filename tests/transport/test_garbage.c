/* test_garbage.c — hostile clients writing seeded random bytes into their own channel
 * (submissions, ring indices, the sidecar's sleep word, the header, payload areas) while a
 * well-behaved client keeps being served. Every garbage submission gets exactly one
 * completion (an error unless it happened to be valid) or the client is disconnected; the
 * sidecar never dies. */
#include <criterion/criterion.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_internal.h"
#include "harness.h"
#include "moe_client.h"
#include "moe_kernels.h"
#include "moe_proto.h"

#define SESSIONS 240
#define GOOD_TOKENS 8u
#define GOOD_HIDDEN 64u

/* The well-behaved client: verified ECHOs until the parent closes `stop`. */
static int good_client(const char *path, int stop)
{
	struct moe_connect_opts o = {.socket_path = path,
	                             .max_tokens = GOOD_TOKENS,
	                             .hidden = GOOD_HIDDEN,
	                             .n_slots = 1,
	                             .client_name = "good"};
	struct moe_client *c;
	if (moe_connect(&o, &c) != MOE_OK)
		return 10;
	struct moe_slot s;
	moe_slot_acquire(c, &s);
	float in[GOOD_TOKENS * GOOD_HIDDEN];
	uint16_t want[GOOD_TOKENS * GOOD_HIDDEN];
	uint64_t seed = 77, served = 0;
	for (;;) {
		char b;
		if (read(stop, &b, 1) == 0)
			break; /* parent closed: done */
		for (size_t k = 0; k < GOOD_TOKENS * GOOD_HIDDEN; k++)
			in[k] = (float)(test_rand(&seed) % 1000) - 500.0f;
		memcpy(s.input, in, sizeof(in));
		moek_convert(MOE_DTYPE_F16, want, MOE_DTYPE_F32, in, GOOD_TOKENS * GOOD_HIDDEN);
		struct moe_request r = {.op = MOE_OP_ECHO,
		                        .slot = s.index,
		                        .n_tokens = GOOD_TOKENS,
		                        .in_dtype = MOE_DTYPE_F32,
		                        .out_dtype = MOE_DTYPE_F16,
		                        .user_data = ++served};
		struct moe_completion d;
		if (moe_submit(c, &r) != MOE_OK || moe_wait(c, &d, 10000) != MOE_OK)
			return 11;
		if (d.status != MOE_OK || d.user_data != served)
			return 12;
		if (memcmp(s.output, want, sizeof(want)) != 0)
			return 13;
	}
	moe_close(c);
	return served > 0 ? 0 : 14;
}

static void random_bytes(uint64_t *seed, void *dst, size_t n)
{
	uint8_t *d = dst;
	for (size_t i = 0; i < n; i++)
		d[i] = (uint8_t)test_rand(seed);
}

/* A plausible submission with one field broken at random. */
static struct moe_sqe mutated_sqe(uint64_t *seed, const struct moe_limits *lim)
{
	struct moe_sqe e;
	memset(&e, 0, sizeof(e));
	e.op = (uint16_t)(1 + test_rand(seed) % 6);
	e.slot = (uint32_t)(test_rand(seed) % (lim->n_slots + 2));
	e.n_tokens = (uint32_t)(test_rand(seed) % (lim->max_tokens + 2));
	e.in_dtype = (uint8_t)(test_rand(seed) % 4);
	e.out_dtype = (uint8_t)(test_rand(seed) % 4);
	switch (test_rand(seed) % 6) {
	case 0: e.reserved[test_rand(seed) % 8] = (uint32_t)test_rand(seed); break;
	case 1: e.flags = (uint16_t)test_rand(seed); break;
	case 2: e.layer = (int32_t)test_rand(seed); break;
	case 3: e.ids_per_token = (uint16_t)test_rand(seed); break;
	case 4: e.n_tokens = (uint32_t)test_rand(seed); break;
	default: break;
	}
	return e;
}

/* One hostile session. Returns how many garbage submissions it made. */
static int hostile_session(const char *path, uint64_t seed)
{
	struct moe_connect_opts o = {.socket_path = path,
	                             .max_tokens = 4,
	                             .hidden = 32,
	                             .n_slots = 4,
	                             .client_name = "hostile"};
	struct moe_client *c;
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "seed %llu: %s", (unsigned long long)seed,
	             moe_connect_error());
	struct moe_client_raw raw;
	moe_client_raw(c, &raw);
	struct moe_sqe *sqes = (struct moe_sqe *)(raw.base + raw.layout.sq_entries);
	const uint32_t entries = raw.layout.ring_entries;
	int made = 0;

	/* Phase 1: valid indices, garbage submissions. Exactly one completion each. */
	for (int batch = 0; batch < 3; batch++) {
		uint32_t k = 1 + (uint32_t)(test_rand(&seed) % entries);
		uint64_t tags[16];
		for (uint32_t i = 0; i < k; i++) {
			struct moe_sqe e;
			if (test_rand(&seed) & 1)
				random_bytes(&seed, &e, sizeof(e));
			else
				e = mutated_sqe(&seed, &raw.limits);
			e.user_data = tags[i] = ((seed & 0xffffffffu) << 8) | i;
			sqes[moe_ring_prod_pos(raw.sq, i)] = e;
		}
		/* Payload scribbles too: only garbage results, never a crash. */
		uint64_t off = raw.layout.slots + test_rand(&seed) % (raw.bytes - raw.layout.slots);
		random_bytes(&seed, raw.base + off, raw.bytes - off < 256 ? raw.bytes - off : 256);
		moe_ring_publish(raw.sq, k);
		moe_ring_wake_consumer(raw.sq);
		made += (int)k;
		for (uint32_t i = 0; i < k; i++) {
			struct moe_completion d;
			int rc = moe_wait(c, &d, 10000);
			cr_assert_eq(rc, MOE_OK, "seed %llu: completion %u of %u: %s",
			             (unsigned long long)seed, i, k, moe_last_error(c));
			/* One completion per submission, in any order (errors are posted
			 * before executed requests). */
			uint32_t j = 0;
			while (j < k && tags[j] != d.user_data)
				j++;
			cr_assert_lt(j, k, "seed %llu: completion for a tag never submitted",
			             (unsigned long long)seed);
			tags[j] = UINT64_MAX; /* each tag completes once */
			cr_assert(d.status == MOE_OK ||
			              (d.status <= MOE_EBADOP && d.status >= MOE_EBADTOPK),
			          "a request status, got %d", d.status);
		}
	}

	/* Phase 2: something worse, chosen at random. The sidecar may drop us. */
	struct moe_ring_ctrl *sqc = (struct moe_ring_ctrl *)(raw.base + raw.layout.sq_ctrl);
	struct moe_ring_ctrl *cqc = (struct moe_ring_ctrl *)(raw.base + raw.layout.cq_ctrl);
	bool expect_drop = false;
	switch (test_rand(&seed) % 5) {
	case 0: { /* an impossible SQ tail: seen at the next look, which a wake forces */
		atomic_store(&sqc->tail,
		             raw.sq->tail + entries + 1 + (uint32_t)(test_rand(&seed) % 1000000));
		moe_futex_wake(&sqc->consumer_sleeping, 1);
		struct pollfd pf = {.fd = moe_socket_fd(c), .events = POLLRDHUP};
		cr_assert_eq(poll(&pf, 1, 10000), 1, "seed %llu: dropped for the SQ tail",
		             (unsigned long long)seed);
		break;
	}
	case 1: /* an impossible CQ head (ahead of every completion ever made) */
		atomic_store(&cqc->head,
		             raw.cq->head + entries + 1 + (uint32_t)(test_rand(&seed) % 1000));
		expect_drop = true;
		break;
	case 2: /* scribble over the sidecar's sleep word and the header */
		atomic_store(&sqc->consumer_sleeping, (uint32_t)test_rand(&seed));
		random_bytes(&seed, raw.base, 192);
		break;
	case 3: /* flood: never drain the CQ, keep submitting */
		for (int i = 0; i < 4 * (int)entries; i++) {
			if (moe_ring_space(raw.sq) <= 0)
				break;
			sqes[moe_ring_prod_pos(raw.sq, 0)] =
			    (struct moe_sqe){.op = MOE_OP_PING, .slot = 99};
			moe_ring_publish(raw.sq, 1);
			moe_ring_wake_consumer(raw.sq);
		}
		break;
	default: /* random CQ bytes (the sidecar never reads them) */
		random_bytes(&seed, raw.base + raw.layout.cq_entries, 32u * entries);
		break;
	}
	if (expect_drop) {
		/* Keep the sidecar busy without reaping (reaping would rewrite the CQ head):
		 * once its cached view of the CQ says full it re-reads the head and drops us. */
		struct pollfd pf = {.fd = moe_socket_fd(c), .events = POLLRDHUP};
		int rounds = 0;
		while (poll(&pf, 1, 0) == 0) {
			cr_assert_lt(++rounds, 200, "seed %llu: never dropped",
			             (unsigned long long)seed);
			while (moe_ring_space(raw.sq) > 0) {
				sqes[moe_ring_prod_pos(raw.sq, 0)] =
				    (struct moe_sqe){.op = MOE_OP_PING, .slot = 99};
				moe_ring_publish(raw.sq, 1);
			}
			moe_ring_wake_consumer(raw.sq);
			poll(&pf, 1, 50); /* woken at once by the hang-up */
		}
		cr_assert(pf.revents & (POLLRDHUP | POLLHUP), "seed %llu: dropped",
		          (unsigned long long)seed);
	}
	moe_close(c);
	return made;
}

Test(garbage, hostile_clients_never_hurt_the_sidecar, .timeout = 300)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t good = fork();
	if (good == 0) {
		close(p[1]);
		_exit(good_client(sp.socket, p[0]));
	}
	close(p[0]);
	int made = 0;
	for (int i = 0; i < SESSIONS; i++) {
		made += hostile_session(sp.socket, 0x5eed0000u + (uint64_t)i);
		cr_assert_eq(write(p[1], "g", 1), 1, "the good client is alive");
		int st;
		cr_assert_eq(waitpid(sp.pid, &st, WNOHANG), 0, "session %d: sidecar alive", i);
	}
	cr_assert_geq(made, 1000, "thousands of garbage submissions (%d)", made);
	close(p[1]);
	int st;
	cr_assert_eq(waitpid(good, &st, 0), good);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	          "the good client was served throughout "
	          "(exit %d)",
	          WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	cr_assert(log_count(&sp, "protocol violation") >= 1, "violations are logged");
	cr_assert_eq(sidecar_stop(&sp, SIGTERM), 0, "the sidecar exits cleanly afterwards");
	sidecar_cleanup(&sp);
}

/* Only the sidecar writes its SQ consumer_sleeping word: a client that overwrites it while
 * the sidecar sleeps is disconnected at the next wake-up, and the log names the word. */
Test(garbage, writing_the_sidecars_sleep_word_disconnects, .timeout = 60)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = 2, .hidden = 16};
	struct moe_client *c;
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "%s", moe_connect_error());
	cr_assert_eq(moe_ping(c, 5000), MOE_OK);
	struct moe_client_raw raw;
	moe_client_raw(c, &raw);
	struct moe_ring_ctrl *sqc = (struct moe_ring_ctrl *)(raw.base + raw.layout.sq_ctrl);
	/* Wait for the event "the sidecar announced sleep on our ring" (it spins ~50 µs
	 * after the last request first). */
	while (atomic_load(&sqc->consumer_sleeping) != 1)
		sched_yield();
	atomic_store(&sqc->consumer_sleeping, 0);
	moe_futex_wake(&sqc->tail, 1); /* wake it up so it looks */
	struct pollfd pf = {.fd = moe_socket_fd(c), .events = POLLRDHUP};
	cr_assert_eq(poll(&pf, 1, 10000), 1, "disconnected");
	cr_assert(log_wait(&sp, "consumer_sleeping", 1, 5000), "the log names the word");
	moe_close(c);
	struct moe_client *other;
	cr_assert_eq(moe_connect(&o, &other), MOE_OK);
	cr_assert_eq(moe_ping(other, 5000), MOE_OK, "the sidecar serves on");
	moe_close(other);
	cr_assert_eq(sidecar_stop(&sp, SIGTERM), 0);
	sidecar_cleanup(&sp);
}
