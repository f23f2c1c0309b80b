/* dispatch.c — the dispatcher thread (see dispatch.h for the contract).
 *
 * Loop: apply channel-set changes when the control word moved; drain every channel; write
 * heartbeats; after `spin_ns` without work, sleep on all channels at once. The sleep is the
 * ring's protocol (moe_ring.h) widened to N rings: announce on every channel's
 * consumer_sleeping word, full fence (inside moe_ring_announce_sleep), re-check every ring
 * and the control word, then futex_waitv on every channel's SQ tail (expected: still our
 * head, i.e. empty) plus the control word. A client that publishes wakes us, or makes the
 * wait return at once with EAGAIN if it published just before.
 *
 * Only the dispatcher writes the consumer_sleeping words; after every wake-up it checks that
 * each still holds 1, and drops a client that scribbled on its word.
 */
#include "dispatch.h"

#include <errno.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "sd_notify.h"
#include "spin_wait.h"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

/* Submissions taken from one channel before looking at the next (fairness). */
#define DRAIN_BUDGET 64u

static void control_bump(struct dispatcher *d)
{
	atomic_fetch_add_explicit(&d->control_word, 1, memory_order_release);
	syscall(SYS_futex, (uint32_t *)&d->control_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void dispatcher_poke(struct dispatcher *d)
{
	control_bump(d);
}

void dispatcher_set_service(struct dispatcher *d, const struct channel_service *service)
{
	atomic_store_explicit(&d->service, service, memory_order_release);
}

/* channel_complete_async's wake-up: any thread. */
static void dispatcher_wake(void *arg)
{
	control_bump(arg);
}

static void attached_remove_locked(struct dispatcher *d, struct sidecar_channel *ch)
{
	for (uint32_t i = 0; i < d->n_attached; i++) {
		if (d->attached[i] == ch) {
			d->attached[i] = d->attached[--d->n_attached];
			return;
		}
	}
}

static bool attached_has_locked(const struct dispatcher *d, const struct sidecar_channel *ch)
{
	for (uint32_t i = 0; i < d->n_attached; i++)
		if (d->attached[i] == ch)
			return true;
	return false;
}

/* Dispatcher thread: takes the control thread's adds/removes. Returns true on stop. */
static bool apply_changes(struct dispatcher *d)
{
	pthread_mutex_lock(&d->lock);
	for (uint32_t i = 0; i < d->n_pending_add; i++)
		d->active[d->n_active++] = d->pending_add[i];
	d->n_pending_add = 0;
	for (uint32_t r = 0; r < d->n_pending_remove; r++) {
		struct sidecar_channel *ch = d->pending_remove[r];
		for (uint32_t i = 0; i < d->n_active; i++) {
			if (d->active[i].ch == ch) {
				d->active[i] = d->active[--d->n_active];
				break;
			}
		}
		attached_remove_locked(d, ch);
	}
	d->n_pending_remove = 0;
	bool stop = d->stop;
	pthread_cond_broadcast(&d->detached);
	pthread_mutex_unlock(&d->lock);
	return stop;
}

/* Dispatcher thread: stops serving active[i] and reports it to the control thread. */
static void drop_channel(struct dispatcher *d, uint32_t i)
{
	struct dispatcher_entry e = d->active[i];
	d->active[i] = d->active[--d->n_active];
	pthread_mutex_lock(&d->lock);
	attached_remove_locked(d, e.ch);
	d->dropped[d->n_dropped++] = e;
	pthread_cond_broadcast(&d->detached);
	pthread_mutex_unlock(&d->lock);
	uint64_t one = 1;
	if (write(d->dropped_eventfd, &one, sizeof(one)) != (ssize_t)sizeof(one))
		log_error("dispatch", "eventfd write failed: %s", strerror(errno));
}

/* Returns submissions handled across all channels; drops broken ones. *async_pending: some
 * request runs elsewhere (its completion will wake us). */
static uint32_t drain_all(struct dispatcher *d, bool shutting_down, bool *async_pending)
{
	uint32_t work = 0;
	*async_pending = false;
	for (uint32_t i = 0; i < d->n_active;) {
		int r = channel_drain(d->active[i].ch, DRAIN_BUDGET, shutting_down);
		if (r < 0) {
			log_warn("dispatch", "protocol violation, dropping client: %s",
			         d->active[i].ch->violation);
			drop_channel(d, i);
			continue; /* active[i] is now another channel */
		}
		work += (uint32_t)r;
		*async_pending |= channel_async_in_flight(d->active[i].ch) != 0;
		i++;
	}
	return work;
}

/* The idle spin (see dispatcher_main): pure polling at first (a client in a request/response
 * loop answers within poll_only_ns of the last work), then a yield of the core after every
 * round of looks. Several looks per round: a system call per look would add its cost to every
 * short request. */
static const struct spin_policy dispatch_spin = {.looks_per_round = 32, .poll_only_ns = 5000};

struct work_look {
	struct dispatcher *d;
	uint32_t gen; /* the control word's value the loop has applied */
};

/* A lock-free look at every ring and the control word: is there something to drain? */
static bool work_visible(void *arg)
{
	const struct work_look *w = arg;
	const struct dispatcher *d = w->d;
	if (atomic_load_explicit(&d->control_word, memory_order_acquire) != w->gen)
		return true;
	for (uint32_t i = 0; i < d->n_active; i++) {
		struct sidecar_channel *ch = d->active[i].ch;
		if (moe_ring_ready(&ch->sq) != 0 ||
		    atomic_load_explicit(&ch->async_n_ready, memory_order_acquire) != 0)
			return true; /* submissions, a completion to post, or a broken ring */
	}
	return false;
}

static void write_heartbeats(struct dispatcher *d, uint64_t now)
{
	for (uint32_t i = 0; i < d->n_active; i++)
		channel_set_heartbeat(d->active[i].ch, now);
	const struct channel_service *svc = atomic_load_explicit(&d->service, memory_order_acquire);
	if (svc && svc->tick)
		svc->tick(svc->ctx);
	atomic_fetch_add_explicit(&d->beats, 1, memory_order_release);
}

/* Announce, re-check, futex_waitv. Returns after a wake-up, a timeout or a reason not to
 * sleep at all. */
static void sleep_on_all(struct dispatcher *d, uint32_t gen, uint64_t now)
{
	struct futex_waitv w[DISPATCH_MAX_CHANNELS + 1];
	memset(w, 0, sizeof(w));
	w[0].val = gen;
	w[0].uaddr = (uint64_t)(uintptr_t)&d->control_word;
	w[0].flags = FUTEX_32 | FUTEX_PRIVATE_FLAG;
	uint32_t n = d->n_active;
	for (uint32_t i = 0; i < n; i++) {
		struct sidecar_channel *ch = d->active[i].ch;
		moe_ring_announce_sleep(&ch->sq);
		/* Empty ring: wait for the tail to leave our head. A channel whose client does
		 * not drain its CQ has submissions waiting: wait for the tail to move on from
		 * where it is now, or for the client's wake-up after it drains. */
		w[i + 1].val = ch->cq_blocked ? atomic_load_explicit(moe_ring_wait_word(&ch->sq),
		                                                     memory_order_acquire)
		                              : moe_ring_wait_value(&ch->sq);
		w[i + 1].uaddr = (uint64_t)(uintptr_t)moe_ring_wait_word(&ch->sq);
		w[i + 1].flags = FUTEX_32; /* shared: the word lives in the client's mapping too */
	}
	bool work = atomic_load_explicit(&d->control_word, memory_order_acquire) != gen;
	for (uint32_t i = 0; i < n && !work; i++)
		work = channel_has_work(d->active[i].ch);
	if (!work) {
		uint64_t deadline = now + d->heartbeat_ns;
		struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u),
		                      .tv_nsec = (long)(deadline % 1000000000u)};
		long rc = syscall(SYS_futex_waitv, w, n + 1, 0, &ts, CLOCK_MONOTONIC);
		if (rc < 0 && errno != ETIMEDOUT && errno != EINTR && errno != EAGAIN)
			log_error("dispatch", "futex_waitv on %u words: %s", n + 1,
			          strerror(errno));
	}
	/* Our sleep words must still say what we wrote: a client that wrote one is broken. */
	for (uint32_t i = n; i-- > 0;) {
		struct sidecar_channel *ch = d->active[i].ch;
		uint32_t v = atomic_load_explicit(channel_sq_sleep_word(ch), memory_order_relaxed);
		moe_ring_unannounce(&ch->sq);
		if (v != 1) {
			snprintf(ch->violation, sizeof(ch->violation),
			         "client wrote the sidecar's SQ consumer_sleeping word (found %u)",
			         v);
			log_warn("dispatch", "protocol violation, dropping client: %s",
			         ch->violation);
			drop_channel(d, i);
		}
	}
}

static void shutdown_channels(struct dispatcher *d)
{
	for (uint32_t i = 0; i < d->n_active; i++)
		channel_set_state(d->active[i].ch, MOE_CHANNEL_CLOSING);
	/* Whatever is queued completes with MOE_ESHUTDOWN (bounded: at most a ring each). */
	for (uint32_t i = 0; i < d->n_active;) {
		int r = channel_drain(d->active[i].ch, 2 * MOE_MAX_SLOTS_LIMIT, true);
		if (r < 0) {
			drop_channel(d, i);
			continue;
		}
		i++;
	}
	/* Requests still running elsewhere (the service has refused the queued ones) finish and
	 * are posted before the channel closes: nothing in flight is left unanswered. */
	for (;;) {
		bool in_flight = false;
		uint32_t gen = atomic_load_explicit(&d->control_word, memory_order_acquire);
		for (uint32_t i = 0; i < d->n_active;) {
			if (channel_drain(d->active[i].ch, 2 * MOE_MAX_SLOTS_LIMIT, true) < 0) {
				drop_channel(d, i);
				continue;
			}
			in_flight |= channel_async_in_flight(d->active[i].ch) != 0;
			i++;
		}
		if (!in_flight)
			break;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = 10000000};
		syscall(SYS_futex, (uint32_t *)&d->control_word, FUTEX_WAIT_PRIVATE, gen, &ts, NULL,
		        0);
	}
	for (uint32_t i = 0; i < d->n_active; i++) {
		channel_set_state(d->active[i].ch, MOE_CHANNEL_CLOSED);
		channel_wake_client(d->active[i].ch);
	}
}

static void *dispatcher_main(void *arg)
{
	struct dispatcher *d = arg;
	uint32_t seen = atomic_load_explicit(&d->control_word, memory_order_acquire) - 1;
	uint64_t last_work = monotonic_ns(), last_beat = 0, last_watchdog = 0;
	for (;;) {
		uint32_t gen = atomic_load_explicit(&d->control_word, memory_order_acquire);
		if (gen != seen) {
			seen = gen;
			if (apply_changes(d))
				break;
			last_beat = 0; /* new channels get a heartbeat at once */
		}
		bool async_pending;
		uint32_t work = drain_all(d, false, &async_pending);
		uint64_t now = monotonic_ns();
		if (now - last_beat >= d->heartbeat_ns) {
			write_heartbeats(d, now);
			last_beat = now;
			/* Fed from here, so a dispatcher that stops draining starves it. */
			if (d->watchdog_ns && now - last_watchdog >= d->watchdog_ns) {
				sd_notify("WATCHDOG=1");
				last_watchdog = now;
			}
		}
		if (work) {
			last_work = now;
			continue;
		}
		/* The spin yields: on a machine with fewer cores than runnable threads the
		 * client this sidecar just answered may be queued on this very core, and its
		 * next request is what the spin waits for. */
		/* While a request computes elsewhere, spinning would take a core from the workers
		 * computing it. Its completion is posted without us (a completion the full CQ
		 * held back wakes us through the control word); the client's next submission
		 * wakes us through its SQ. */
		if (now - last_work < d->spin_ns && !async_pending) {
			/* Back to the loop when work shows, the spin is over or a heartbeat is
			 * due. */
			struct work_look look = {.d = d, .gen = gen};
			uint64_t left = d->spin_ns - (now - last_work);
			if (d->heartbeat_ns - (now - last_beat) < left)
				left = d->heartbeat_ns - (now - last_beat);
			spin_until(&dispatch_spin, last_work, now + left, work_visible, &look);
			continue;
		}
		sleep_on_all(d, gen, now);
		last_work =
		    monotonic_ns(); /* spin again after a wake-up: more requests usually follow */
	}
	shutdown_channels(d);
	return NULL;
}

int dispatcher_start(struct dispatcher *d, int dropped_eventfd, struct sidecar_error *err)
{
	if (!d->spin_ns)
		d->spin_ns = SPIN_WAIT_BOUND_NS;
	if (!d->heartbeat_ns)
		d->heartbeat_ns = 100000000;
	if (d->watchdog_ns && d->heartbeat_ns > d->watchdog_ns)
		d->heartbeat_ns = d->watchdog_ns; /* wake up often enough to feed it */
	d->dropped_eventfd = dropped_eventfd;
	atomic_init(&d->control_word, 0);
	atomic_init(&d->beats, 0);
	atomic_init(&d->service, NULL);
	int rc = pthread_mutex_init(&d->lock, NULL);
	if (rc == 0)
		rc = pthread_cond_init(&d->detached, NULL);
	if (rc == 0)
		rc = pthread_create(&d->thread, NULL, dispatcher_main, d);
	if (rc != 0) {
		return error_set(err, error_status_from_errno(rc), "dispatcher thread: %s",
		                 strerror(rc));
	}
	d->running = true;
	return 0;
}

void dispatcher_add(struct dispatcher *d, struct sidecar_channel *ch, void *owner)
{
	ch->wake_dispatcher = dispatcher_wake;
	ch->wake_arg = d;
	pthread_mutex_lock(&d->lock);
	d->pending_add[d->n_pending_add++] = (struct dispatcher_entry){.ch = ch, .owner = owner};
	d->attached[d->n_attached++] = ch;
	control_bump(d);
	pthread_mutex_unlock(&d->lock);
}

void dispatcher_remove(struct dispatcher *d, struct sidecar_channel *ch)
{
	pthread_mutex_lock(&d->lock);
	if (attached_has_locked(d, ch)) {
		d->pending_remove[d->n_pending_remove++] = ch;
		control_bump(d);
		while (attached_has_locked(d, ch) && d->running)
			pthread_cond_wait(&d->detached, &d->lock);
	}
	/* Detached now, by us or by a drop racing with us. Withdraw a removal request the
	 * dispatcher has not applied yet and any drop report: neither may outlive the channel
	 * (its address may be reused by the next channel, its connection by the next client). */
	for (uint32_t i = 0; i < d->n_pending_remove;) {
		if (d->pending_remove[i] == ch)
			d->pending_remove[i] = d->pending_remove[--d->n_pending_remove];
		else
			i++;
	}
	for (uint32_t i = 0; i < d->n_dropped;) {
		if (d->dropped[i].ch == ch)
			d->dropped[i] = d->dropped[--d->n_dropped];
		else
			i++;
	}
	pthread_mutex_unlock(&d->lock);
}

uint32_t dispatcher_take_dropped(struct dispatcher *d, struct dispatcher_entry *out, uint32_t max)
{
	pthread_mutex_lock(&d->lock);
	uint32_t n = d->n_dropped < max ? d->n_dropped : max;
	memcpy(out, d->dropped, n * sizeof(*out));
	memmove(d->dropped, d->dropped + n, (d->n_dropped - n) * sizeof(*out));
	d->n_dropped -= n;
	pthread_mutex_unlock(&d->lock);
	return n;
}

void dispatcher_stop(struct dispatcher *d)
{
	if (!d->running)
		return;
	pthread_mutex_lock(&d->lock);
	d->stop = true;
	control_bump(d);
	pthread_mutex_unlock(&d->lock);
	pthread_join(d->thread, NULL);
	d->running = false;
	pthread_mutex_destroy(&d->lock);
	pthread_cond_destroy(&d->detached);
}
