/* test_ring.c — the SPSC ring of proto/moe_ring.h: capacity, 32-bit wrap-around, hostile
 * peer indices, a two-thread stress with a checksum of every element, and the sleep/wake
 * path (the consumer really sleeps on the futex and is woken by the producer). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_ring.h"

#define ENTRIES 8u

struct ring {
	struct moe_ring_ctrl ctrl;
	uint64_t slot[ENTRIES];
};

static void ring_init(struct ring *r, struct moe_ring_prod *p, struct moe_ring_cons *c,
                      uint32_t start)
{
	memset(r, 0, sizeof(*r));
	moe_ring_ctrl_init(&r->ctrl, start);
	moe_ring_prod_attach(p, &r->ctrl, ENTRIES, start);
	moe_ring_cons_attach(c, &r->ctrl, ENTRIES, start);
}

static void produce(struct ring *r, struct moe_ring_prod *p, uint64_t v)
{
	cr_assert_gt(moe_ring_space(p), 0);
	r->slot[moe_ring_prod_pos(p, 0)] = v;
	moe_ring_publish(p, 1);
}

static uint64_t consume(struct ring *r, struct moe_ring_cons *c)
{
	cr_assert_gt(moe_ring_ready(c), 0);
	uint64_t v = r->slot[moe_ring_cons_pos(c, 0)];
	moe_ring_consume(c, 1);
	return v;
}

Test(ring, empty_and_full)
{
	struct ring r;
	struct moe_ring_prod p;
	struct moe_ring_cons c;
	ring_init(&r, &p, &c, 0);
	cr_assert_eq(moe_ring_ready(&c), 0, "a new ring is empty");
	cr_assert_eq(moe_ring_space(&p), ENTRIES, "a new ring has every entry free");
	for (uint32_t i = 0; i < ENTRIES; i++)
		produce(&r, &p, 100 + i);
	cr_assert_eq(moe_ring_space(&p), 0, "full after %u entries", ENTRIES);
	cr_assert_eq(moe_ring_ready(&c), ENTRIES);
	cr_assert_eq(consume(&r, &c), 100, "FIFO order");
	cr_assert_eq(moe_ring_space(&p), 1, "one entry back after one consume");
	for (uint32_t i = 1; i < ENTRIES; i++)
		cr_assert_eq(consume(&r, &c), 100 + i);
	cr_assert_eq(moe_ring_ready(&c), 0);
	/* The producer's view is a lower bound from its cached head: it refreshes only when
	 * the cache says full, and then sees every entry free. */
	cr_assert_eq(moe_ring_space(&p), 1, "cached view until it is used up");
	r.slot[moe_ring_prod_pos(&p, 0)] = 200;
	moe_ring_publish(&p, 1);
	cr_assert_eq(moe_ring_space(&p), ENTRIES - 1, "refreshed: all but the new one free");
}

Test(ring, wraps_around_uint32_max)
{
	struct ring r;
	struct moe_ring_prod p;
	struct moe_ring_cons c;
	const uint32_t start = UINT32_MAX - 3;
	ring_init(&r, &p, &c, start);
	uint64_t next_in = 0, next_out = 0;
	/* Push the indices well past 2^32 with the ring at varying fill levels. */
	for (int round = 0; round < 50; round++) {
		int k = 1 + round % (int)ENTRIES;
		for (int i = 0; i < k; i++)
			produce(&r, &p, next_in++);
		cr_assert_eq(moe_ring_ready(&c), k, "round %d: %d ready across the wrap", round, k);
		for (int i = 0; i < k; i++)
			cr_assert_eq(consume(&r, &c), next_out++);
	}
	cr_assert_lt(p.tail, start, "the tail really wrapped (tail %u)", p.tail);
	cr_assert_eq(p.tail, c.head);
}

Test(ring, impossible_peer_index_is_reported)
{
	struct ring r;
	struct moe_ring_prod p;
	struct moe_ring_cons c;
	ring_init(&r, &p, &c, UINT32_MAX - 1);
	/* A producer tail more than `entries` ahead of the consumer's head. */
	atomic_store(&r.ctrl.tail, (UINT32_MAX - 1) + ENTRIES + 1);
	cr_assert_eq(moe_ring_ready(&c), MOE_RING_BROKEN);
	/* A tail behind the head (negative distance) is just as impossible. */
	atomic_store(&r.ctrl.tail, UINT32_MAX - 2);
	cr_assert_eq(moe_ring_ready(&c), MOE_RING_BROKEN);
	/* Exactly full is fine. */
	atomic_store(&r.ctrl.tail, (UINT32_MAX - 1) + ENTRIES);
	cr_assert_eq(moe_ring_ready(&c), ENTRIES);

	/* The consumer's head ahead of the producer's tail. */
	ring_init(&r, &p, &c, 5);
	for (uint32_t i = 0; i < ENTRIES; i++)
		produce(&r, &p, i);
	atomic_store(&r.ctrl.head, 5 + ENTRIES + 1);
	cr_assert_eq(moe_ring_space(&p), MOE_RING_BROKEN);
	atomic_store(&r.ctrl.head, 4);
	cr_assert_eq(moe_ring_space(&p), MOE_RING_BROKEN, "head behind its start");
}

/* ---- Two threads ------------------------------------------------------------------------ */

/* Elements per run: spinning moves millions a second; the sleepy variant pays a futex
 * round trip for most of its elements, so it runs fewer. */
#define STRESS_N_SPIN 500000u
#define STRESS_N_SLEEPY 100000u

struct stress {
	struct ring r;
	struct moe_ring_prod p;
	struct moe_ring_cons c;
	uint64_t sum_in, sum_out, count_out;
	_Atomic uint64_t consumer_sleeps;
	bool sleepy; /* consumer sleeps on the futex instead of spinning */
	uint64_t n;
};

static uint64_t mix(uint64_t i)
{
	return (i + 1) * 0x9e3779b97f4a7c15ull ^ (i << 17);
}

/* Spin politely; on an oversubscribed machine (2 cores shared with other work) give the
 * core away now and then so the peer thread can run. */
static void backoff(unsigned *spins)
{
	if (++*spins % 1024 == 0)
		sched_yield();
	else
		moe_cpu_relax();
}

static void *stress_producer(void *arg)
{
	struct stress *s = arg;
	unsigned spins = 0;
	for (uint64_t i = 0; i < s->n;) {
		int64_t room = moe_ring_space(&s->p);
		if (room == MOE_RING_BROKEN)
			abort();
		if (room == 0) {
			backoff(&spins);
			continue;
		}
		spins = 0;
		uint32_t k = 0;
		for (; k < room && i < s->n; k++, i++) {
			uint64_t v = mix(i);
			s->r.slot[moe_ring_prod_pos(&s->p, k)] = v;
			s->sum_in += v * (i + 1);
		}
		moe_ring_publish(&s->p, k);
		moe_ring_wake_consumer(&s->p);
	}
	return NULL;
}

static void *stress_consumer(void *arg)
{
	struct stress *s = arg;
	uint64_t i = 0;
	unsigned spins = 0;
	while (i < s->n) {
		int64_t ready = moe_ring_ready(&s->c);
		if (ready == MOE_RING_BROKEN)
			abort();
		if (ready == 0) {
			if (!s->sleepy) {
				backoff(&spins);
				continue;
			}
			moe_ring_announce_sleep(&s->c);
			if (moe_ring_ready(&s->c) == 0) {
				atomic_fetch_add(&s->consumer_sleeps, 1);
				/* No timeout: a lost wake-up would hang the test (and fail it). */
				moe_ring_consumer_wait(&s->c, -1);
			}
			moe_ring_unannounce(&s->c);
			continue;
		}
		for (int64_t k = 0; k < ready; k++, i++) {
			uint64_t v = s->r.slot[moe_ring_cons_pos(&s->c, (uint32_t)k)];
			s->sum_out += v * (i + 1); /* position-weighted: catches reordering */
			s->count_out++;
		}
		moe_ring_consume(&s->c, (uint32_t)ready);
	}
	return NULL;
}

static void run_stress(bool sleepy)
{
	struct stress *s = calloc(1, sizeof(*s));
	ring_init(&s->r, &s->p, &s->c, UINT32_MAX - 1000);
	s->sleepy = sleepy;
	s->n = sleepy ? STRESS_N_SLEEPY : STRESS_N_SPIN;
	pthread_t a, b;
	pthread_create(&b, NULL, stress_consumer, s);
	pthread_create(&a, NULL, stress_producer, s);
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	cr_assert_eq(s->count_out, s->n);
	if (sleepy)
		cr_assert_gt(atomic_load(&s->consumer_sleeps), 0, "the consumer really slept");
	cr_assert_eq(s->sum_out, s->sum_in, "every element arrived once, in order");
	free(s);
}

Test(ring, two_thread_stress_checksum, .timeout = 120)
{
	run_stress(false);
}

Test(ring, two_thread_stress_with_futex_sleeps, .timeout = 120)
{
	run_stress(true);
}

/* The consumer announces sleep and really blocks in FUTEX_WAIT; a later publish wakes it. */
struct sleeper {
	struct ring r;
	struct moe_ring_prod p;
	struct moe_ring_cons c;
	_Atomic int asleep;
	uint64_t got;
	int wait_rc;
};

static void *sleeper_main(void *arg)
{
	struct sleeper *s = arg;
	moe_ring_announce_sleep(&s->c);
	if (moe_ring_ready(&s->c) == 0) {
		atomic_store(&s->asleep, 1);
		s->wait_rc = moe_ring_consumer_wait(&s->c, 10000000000ll);
	}
	moe_ring_unannounce(&s->c);
	s->got = consume(&s->r, &s->c);
	return NULL;
}

static char thread_state(pid_t tid)
{
	char path[64], buf[256];
	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return '?';
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	return p ? p[2] : '?';
}

struct sleeper_tid {
	struct sleeper *s;
	_Atomic pid_t tid;
};

static void *sleeper_with_tid(void *arg)
{
	struct sleeper_tid *t = arg;
	atomic_store(&t->tid, gettid());
	return sleeper_main(t->s);
}

Test(ring, consumer_sleeps_and_is_woken)
{
	struct sleeper *s = calloc(1, sizeof(*s));
	ring_init(&s->r, &s->p, &s->c, 7);
	struct sleeper_tid t = {.s = s};
	pthread_t th;
	pthread_create(&th, NULL, sleeper_with_tid, &t);
	/* Wait until the thread is blocked in the kernel ('S'), not just announced. */
	while (!atomic_load(&s->asleep) || thread_state(atomic_load(&t.tid)) != 'S')
		sched_yield();
	cr_assert_eq(atomic_load(&s->r.ctrl.consumer_sleeping), 1, "sleep was announced");
	s->r.slot[moe_ring_prod_pos(&s->p, 0)] = 4242;
	moe_ring_publish(&s->p, 1);
	cr_assert(moe_ring_wake_consumer(&s->p), "the producer saw the announcement and woke");
	pthread_join(th, NULL);
	cr_assert_eq(s->wait_rc, 0, "woken, not timed out (rc %d)", s->wait_rc);
	cr_assert_eq(s->got, 4242);
	cr_assert_eq(atomic_load(&s->r.ctrl.consumer_sleeping), 0, "unannounced after waking");
	cr_assert_not(moe_ring_wake_consumer(&s->p), "no wake-up while nobody sleeps");
	free(s);
}
