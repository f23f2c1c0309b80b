/* dispatch.h — the dispatcher: one thread that serves every channel's rings.
 *
 * Owns: the set of channels being served and the sleep/wake protocol on the sidecar side.
 * It drains channels round-robin while there is work, keeps spinning briefly after the last
 * request (so a tight request loop never pays a futex wake) unless a request is running
 * elsewhere (the forward thread: its completion wakes the dispatcher through the control word,
 * and a spinning dispatcher would take a core from the workers), then announces sleep on every
 * channel's SQ word, re-checks, and sleeps on all of them at once with futex_waitv, plus one
 * private word the control thread bumps when the channel set changes or at shutdown. It also
 * writes each channel's heartbeat.
 *
 * Threading: dispatcher_add/remove/stop are called by the control thread only. A removed
 * channel is detached before dispatcher_remove returns; only then may the caller unmap it.
 * Channels the dispatcher drops itself (protocol violation) are reported through an eventfd
 * and dispatcher_take_dropped; their memory stays mapped until the control thread reclaims.
 */
#ifndef MOE_SIDECAR_DISPATCH_H
#define MOE_SIDECAR_DISPATCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "channel.h"
#include "service.h"

/* futex_waitv takes at most 128 words: one is the control word. */
#define DISPATCH_MAX_CHANNELS 127u

struct dispatcher_entry {
	struct sidecar_channel *ch;
	void *owner; /* the control thread's connection, returned by dispatcher_take_dropped */
};

struct dispatcher {
	pthread_t thread;
	bool running;
	uint64_t spin_ns;      /* keep polling this long after the last work */
	uint64_t heartbeat_ns; /* period of header.heartbeat_ns updates and of idle wake-ups */
	uint64_t watchdog_ns;  /* send the service manager WATCHDOG=1 this often; 0: never */
	int dropped_eventfd;   /* written when the dispatcher drops a channel */

	/* Bumped (release) by the control thread after changing the requests below; the
	 * dispatcher sleeps on it too (private futex). */
	_Atomic uint32_t control_word;
	/* Heartbeats written so far: the dispatcher's progress, for a health check. */
	_Atomic uint64_t beats;
	/* The service whose tick runs at each heartbeat (set once it is served; NULL before). */
	_Atomic(const struct channel_service *) service;

	pthread_mutex_t lock; /* guards everything down to `detached` */
	pthread_cond_t detached;
	struct dispatcher_entry pending_add[DISPATCH_MAX_CHANNELS];
	uint32_t n_pending_add;
	struct sidecar_channel *pending_remove[DISPATCH_MAX_CHANNELS];
	uint32_t n_pending_remove;
	struct dispatcher_entry dropped[DISPATCH_MAX_CHANNELS];
	uint32_t n_dropped;
	bool stop;
	/* Channels the dispatcher currently drives (a mirror of `active`, for remove). */
	struct sidecar_channel *attached[DISPATCH_MAX_CHANNELS];
	uint32_t n_attached;

	/* Dispatcher thread only. */
	struct dispatcher_entry active[DISPATCH_MAX_CHANNELS];
	uint32_t n_active;
};

/* Starts the dispatcher thread. Returns 0 or -1 with err filled. */
int dispatcher_start(struct dispatcher *d, int dropped_eventfd, struct sidecar_error *err);

/* Hands a channel to the dispatcher (it starts serving it at once). */
void dispatcher_add(struct dispatcher *d, struct sidecar_channel *ch, void *owner);

/* Any thread, no lock: wakes the dispatcher, which writes its heartbeats (and runs the
 * service's tick) at once. */
void dispatcher_poke(struct dispatcher *d);
/* Any thread: serves `service`'s tick from the next heartbeat on. */
void dispatcher_set_service(struct dispatcher *d, const struct channel_service *service);

/* Takes a channel back; on return the dispatcher no longer touches it and will not report
 * it through dispatcher_take_dropped (if it dropped it already, the report is withdrawn). */
void dispatcher_remove(struct dispatcher *d, struct sidecar_channel *ch);

/* Moves up to max channels the dispatcher dropped into out; returns how many. */
uint32_t dispatcher_take_dropped(struct dispatcher *d, struct dispatcher_entry *out, uint32_t max);

/* Shutdown: every channel goes CLOSING, pending submissions complete with MOE_ESHUTDOWN,
 * then CLOSED and its client is woken; then the thread exits and is joined. The channels
 * stay mapped and owned by the caller. */
void dispatcher_stop(struct dispatcher *d);

#endif
