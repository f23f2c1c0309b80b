/* spin_wait.h — the daemon's one way to wait briefly for another thread: spin (looking at a
 * condition, yielding the core) up to a bound, then sleep.
 *
 * Why spin at all: in a decode loop the next event (a client's next request, the next wave,
 * the end of a phase) follows within a client round trip, and a sleeping thread would pay a
 * wake-up for each (dear on a VM whose idle vCPUs halt); a bounded spin costs only an
 * otherwise idle core, and after the bound the thread sleeps, so an idle daemon uses no CPU.
 * Why yield: when threads outnumber cores, the thread being waited for (a worker, or the
 * client woken by a completion) may be queued on this very core; a spinner must not hold it.
 *
 * Threading: every function may be called from any thread; nothing here allocates or locks.
 */
#ifndef MOE_SPIN_WAIT_H
#define MOE_SPIN_WAIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* How long the daemon's threads spin before sleeping: about one client round trip. */
#define SPIN_WAIT_BOUND_NS 50000u

/* How a spin looks and yields. Each round: `looks_per_round` looks at the condition with a
 * CPU pause between them, one clock read after the last, then one sched_yield once
 * `poll_only_ns` has passed since the spin's start, else one more pause. */
struct spin_policy {
	unsigned looks_per_round; /* >= 1 */
	uint64_t poll_only_ns;    /* UINT64_MAX: never yield */
};

/* Looks at the condition, yields the core after every look: for threads whose wait is for
 * other threads of the daemon on the same cores. */
extern const struct spin_policy spin_policy_yielding;
/* Looks with a CPU pause between looks, never yields. */
extern const struct spin_policy spin_policy_polling;

/* Spins until ready(arg) returns true (returns true) or the clock (monotonic_ns) reaches
 * deadline_ns (returns false), following *policy; start_ns is when the spin is taken to have
 * started (for poll_only_ns). ready must be cheap and must not block. */
bool spin_until(const struct spin_policy *policy, uint64_t start_ns, uint64_t deadline_ns,
                bool (*ready)(void *arg), void *arg);

/* Waits until *word != seen: spins up to bound_ns (spin_policy_yielding), then sleeps on the
 * word as a private futex, counted in *sleepers while it sleeps. The waker's side is
 * spin_wake_all: change the word (seq_cst), then call it; the seq_cst accesses on both sides
 * make one of the two see the other, so no wake-up is lost. *word is then read with acquire:
 * what the waker wrote before changing it is visible. */
void spin_wait_change(_Atomic uint32_t *word, uint32_t seen, _Atomic uint32_t *sleepers,
                      uint64_t bound_ns);

/* Wakes every thread sleeping in spin_wait_change on word, if *sleepers says there is one.
 * Call after changing *word with a seq_cst access. Inline: nobody sleeps is the common case. */
void spin_wake_sleepers(_Atomic uint32_t *word); /* the futex wake itself */
static inline void spin_wake_all(_Atomic uint32_t *word, _Atomic uint32_t *sleepers)
{
	if (atomic_load(sleepers))
		spin_wake_sleepers(word);
}

#endif /* MOE_SPIN_WAIT_H */
