/* spin_wait.c — bounded spins and the spin-then-futex wait (see spin_wait.h). */
#include "spin_wait.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"
#include "moe_ring.h"

const struct spin_policy spin_policy_yielding = {.looks_per_round = 1, .poll_only_ns = 0};
const struct spin_policy spin_policy_polling = {.looks_per_round = 1, .poll_only_ns = UINT64_MAX};

bool spin_until(const struct spin_policy *policy, uint64_t start_ns, uint64_t deadline_ns,
                bool (*ready)(void *arg), void *arg)
{
	for (;;) {
		for (unsigned i = 1; i < policy->looks_per_round; i++) {
			if (ready(arg))
				return true;
			moe_cpu_relax();
		}
		if (ready(arg))
			return true;
		const uint64_t now = monotonic_ns();
		if (now >= deadline_ns)
			return false;
		if (now - start_ns >= policy->poll_only_ns)
			sched_yield();
		else
			moe_cpu_relax();
	}
}

struct word_change {
	_Atomic uint32_t *word;
	uint32_t seen;
};

static bool word_changed(void *arg)
{
	const struct word_change *w = arg;
	return atomic_load_explicit(w->word, memory_order_acquire) != w->seen;
}

void spin_wait_change(_Atomic uint32_t *word, uint32_t seen, _Atomic uint32_t *sleepers,
                      uint64_t bound_ns)
{
	struct word_change w = {.word = word, .seen = seen};
	if (word_changed(&w))
		return;
	const uint64_t t0 = monotonic_ns();
	if (spin_until(&spin_policy_yielding, t0, t0 + bound_ns, word_changed, &w))
		return;
	atomic_fetch_add(sleepers, 1);
	while (atomic_load(word) == seen)
		syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
	atomic_fetch_sub(sleepers, 1);
}

void spin_wake_sleepers(_Atomic uint32_t *word)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
