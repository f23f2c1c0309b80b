/* test_spin_wait.c — the bounded spin and the spin-then-futex wait: a spin ends when its
 * condition holds or at its deadline, never later than a round past it; a waiter that went to
 * sleep is woken by spin_wake_all; a change before the wait returns at once. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "clock.h"
#include "spin_wait.h"

static bool counts_to_three(void *arg)
{
	unsigned *looks = arg;
	return ++*looks >= 3;
}

static bool never(void *arg)
{
	(void)arg;
	return false;
}

Test(spin_wait, spin_until_returns_when_ready)
{
	unsigned looks = 0;
	const uint64_t t0 = monotonic_ns();
	cr_assert(spin_until(&spin_policy_polling, t0, t0 + 1000000000u, counts_to_three, &looks));
	cr_assert_eq(looks, 3);
}

Test(spin_wait, spin_until_gives_up_at_its_deadline)
{
	const struct spin_policy policies[] = {spin_policy_polling,
	                                       spin_policy_yielding,
	                                       {.looks_per_round = 32, .poll_only_ns = 5000}};
	for (size_t i = 0; i < sizeof(policies) / sizeof(policies[0]); i++) {
		const uint64_t t0 = monotonic_ns();
		cr_assert_not(spin_until(&policies[i], t0, t0 + 2000000u, never, NULL));
		const uint64_t took = monotonic_ns() - t0;
		cr_assert_geq(took, 2000000u, "policy %zu stopped early: %llu ns", i,
		              (unsigned long long)took);
		cr_assert_lt(took, 1000000000u, "policy %zu ran on: %llu ns", i,
		             (unsigned long long)took);
	}
}

struct waiter {
	_Atomic uint32_t word, sleepers, done;
};

static void *wait_for_one(void *arg)
{
	struct waiter *w = arg;
	spin_wait_change(&w->word, 0, &w->sleepers, SPIN_WAIT_BOUND_NS);
	atomic_store(&w->done, 1);
	return NULL;
}

Test(spin_wait, a_sleeping_waiter_is_woken)
{
	struct waiter w = {0};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, wait_for_one, &w), 0);
	/* past the spin: the waiter counts itself in sleepers before it sleeps */
	const uint64_t t0 = monotonic_ns();
	while (atomic_load(&w.sleepers) == 0)
		cr_assert_lt(monotonic_ns() - t0, 10000000000u, "the waiter never went to sleep");
	cr_assert_eq(atomic_load(&w.done), 0);
	atomic_store(&w.word, 1);
	spin_wake_all(&w.word, &w.sleepers);
	cr_assert_eq(pthread_join(t, NULL), 0);
	cr_assert_eq(atomic_load(&w.done), 1);
	cr_assert_eq(atomic_load(&w.sleepers), 0);
}

Test(spin_wait, a_change_before_the_wait_returns_at_once)
{
	_Atomic uint32_t word = 5, sleepers = 0;
	spin_wait_change(&word, 4, &sleepers, SPIN_WAIT_BOUND_NS);
	cr_assert_eq(atomic_load(&sleepers), 0);
}
