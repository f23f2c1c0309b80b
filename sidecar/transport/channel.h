/* channel.h — one client's shared-memory channel, as the sidecar sees it.
 *
 * Owns: the memfd (created, sized, sealed, mapped here), the sidecar's PRIVATE copy of
 * everything that describes the channel (limits, layout, epoch, ring cursors, which slots
 * are in flight), and the ring-draining code that turns submissions into completions.
 *
 * Trust: the client can write any byte of the mapping at any time. Nothing the sidecar owns
 * is ever read back from it: the layout and limits live here, the SQ head and CQ tail live in
 * the private cursors, and each submission is copied out once before it is looked at.
 *
 * Threading: a channel is driven by exactly one thread at a time (the dispatcher); the
 * control thread creates it before handing it over and destroys it after taking it back.
 * channel_drain works on any mapping, including a plain buffer (the fuzzer uses that).
 */
#ifndef MOE_SIDECAR_CHANNEL_H
#define MOE_SIDECAR_CHANNEL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "error.h"
#include "log.h"
#include "moe_proto.h"
#include "moe_ring.h"
#include "service.h"

struct sidecar_channel {
	uint8_t *base; /* mapping of the memfd (or a caller's buffer) */
	uint64_t bytes;
	int memfd;     /* -1 when attached to a caller's buffer */
	bool owns_map; /* munmap on destroy */
	uint64_t epoch;
	struct moe_limits limits;          /* granted; private */
	struct moe_layout layout;          /* computed from limits; private */
	struct moe_channel_header *header; /* written (heartbeat, state), never read */
	struct moe_ring_cons sq;           /* the sidecar consumes submissions */
	struct moe_ring_prod cq;           /* and produces completions */
	/* 1 while a request owns the slot. Set by the dispatcher; cleared by whoever posts the
	 * completion, before posting it (so a resubmission after it sees the slot free). */
	_Atomic uint8_t slot_busy[MOE_MAX_SLOTS_LIMIT];
	/* The CQ has two producers — the dispatcher, and the forward thread posting a FORWARD's
	 * completion itself (one hop less than going back through the dispatcher) — so every
	 * use of `cq` is under this lock. */
	pthread_mutex_t cq_lock;
	bool cq_blocked; /* last drain stopped because the client does not drain its CQ */
	/* Set by channel_drain around each execute: the request is the last one accepted in
	 * this drain, so no completion of this channel waits behind it (an executor may then run
	 * a long request on the dispatcher thread). */
	bool exec_last_of_batch;
	/* Completions channel_drain has written but not yet published, at the CQ's producer
	 * position (dispatcher thread; meaningful during an execute, see channel_post_now). */
	uint32_t exec_unpublished;

	/* The hello's flags (MOE_HELLO_*, known bits only), set before channel_open; and what
	 * the service grants of them (MOE_WELCOME_*), set by channel_open, sent in the welcome. */
	uint32_t hello_flags, welcome_flags;
	uint16_t hello_minor; /* the client's ABI minor (its hello's abi_minor) */

	/* What the channel serves (service.h): the op table, and the service's own per-channel
	 * state, opaque here (NULL until channel_open sets it). ops NULL: every op is unknown.
	 * Set by the control thread before the channel is handed to the dispatcher. */
	const struct op_desc *ops;
	void *state;

	/* Asynchronous completions. An executor that returns OP_PENDING keeps its slot busy;
	 * another thread later finishes it with channel_complete_async, and the dispatcher
	 * posts it on its next drain (it is the CQ's only producer). */
	struct moe_cqe async_cqe[MOE_MAX_SLOTS_LIMIT];
	_Atomic uint8_t async_ready[MOE_MAX_SLOTS_LIMIT];
	_Atomic uint32_t async_n_ready;     /* finished, not yet posted */
	_Atomic uint32_t async_in_flight;   /* accepted as OP_PENDING, not yet posted */
	void (*wake_dispatcher)(void *arg); /* set by dispatcher_add */
	void *wake_arg;

	/* Counters, for logs and tests, under cq_lock: submissions taken, and completions posted
	 * with an error (checks, ops, FORWARDs that failed, shutdown). */
	uint64_t n_requests, n_errors;
	/* The server's id of the client (its log lines' id=N), for other lines about it; set
	 * before the channel is driven. */
	uint32_t id;
	/* The budget of warn lines about this client's bad requests (any thread). */
	struct log_ratelimit error_log;

	/* Why channel_drain gave up on this client (set when it returns < 0). */
	char violation[192];
};

/* Creates a memfd channel for granted limits (moe_limits_check must pass): memfd_create
 * (MFD_CLOEXEC|MFD_ALLOW_SEALING), sized, sealed F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL,
 * mapped, header and rings initialised with a random epoch. Returns 0, or -1 with err
 * filled. The caller owns *out (channel_destroy). */
int channel_create(const struct moe_limits *granted, struct sidecar_channel **out,
                   struct sidecar_error *err);

/* Attaches a channel to an existing writable buffer of `bytes` (no memfd): initialises the
 * header and rings exactly as channel_create does. For the fuzzer and unit tests. */
int channel_attach_buffer(void *buf, uint64_t bytes, const struct moe_limits *granted,
                          uint64_t epoch, struct sidecar_channel **out, struct sidecar_error *err);

/* Unmaps (if owned) and closes the memfd. The channel must no longer be driven. */
void channel_destroy(struct sidecar_channel *ch);

/* Addresses of one slot's areas, from the private layout. */
struct slot_areas {
	void *input;
	int32_t *expert_ids;
	float *expert_weights;
	void *output;
};
void channel_slot_areas(const struct sidecar_channel *ch, uint32_t slot, struct slot_areas *out);

/* Result of channel_drain. */
enum drain_result {
	DRAIN_BROKEN = -1, /* impossible ring index: drop the client (ch->violation says why) */
};

/* Takes at most `budget` submissions: copies each out of shared memory once, validates it
 * (moe_sqe_check, op checks, slot not in flight), runs it through the op table and posts one
 * completion per submission, then wakes the client if it sleeps. Never takes more
 * submissions than the CQ has room for; if the CQ is full it takes none and sets cq_blocked.
 * If `shutting_down`, every submission completes with MOE_ESHUTDOWN instead of running.
 * Asynchronous completions that are ready are posted first.
 * Returns the number of submissions and completions handled (0 = nothing to do), or
 * DRAIN_BROKEN. */
int channel_drain(struct sidecar_channel *ch, uint32_t budget, bool shutting_down);

/* True if channel_drain would do something now (submissions or asynchronous completions
 * waiting and CQ room, or a broken ring index it must report). Used for the re-check after
 * announcing sleep. */
bool channel_has_work(struct sidecar_channel *ch);

/* Finishes a request its executor left OP_PENDING (any thread, once per such request): posted
 * at once if the CQ has room, else handed to the dispatcher (woken) to post when the client
 * drains. c->slot names the slot. */
void channel_complete_async(struct sidecar_channel *ch, const struct moe_cqe *c);

/* Posts c now, from inside an executor running on the dispatcher thread (under the drain's CQ
 * lock): publishes the completions the drain has written so far and this one, and wakes the
 * client. The executor then returns OP_POSTED. For work that goes on after its result is
 * delivered (deferred experts). */
void channel_post_now(struct sidecar_channel *ch, const struct moe_cqe *c);

/* Requests accepted as OP_PENDING whose completion is not posted yet. */
static inline uint32_t channel_async_in_flight(struct sidecar_channel *ch)
{
	return atomic_load_explicit(&ch->async_in_flight, memory_order_acquire);
}

/* An error completion c of sqe gets its sentence: written at the start of the slot's output
 * area (bounded by it and MOE_MESSAGE_MAX, NUL-terminated) with MOE_CQE_MESSAGE set in
 * c->flags — only when slot_is_this_requests (the slot is claimed by this request: an
 * executor's own, never a slot another request holds) — and logged at warn within the
 * channel's log_ratelimit budget (ESHUTDOWN at debug). fmt NULL: the sentence is moe_sqe_explain's.
 * Any thread; error paths only. */
void channel_request_error(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                           struct moe_cqe *c, bool slot_is_this_requests, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Sidecar-owned header words. */
void channel_set_heartbeat(struct sidecar_channel *ch, uint64_t now_ns);
void channel_set_state(struct sidecar_channel *ch, enum moe_channel_state state);
/* Wakes a client sleeping on its CQ regardless of whether it announced sleep (shutdown). */
void channel_wake_client(struct sidecar_channel *ch);

/* The sidecar's own sleep announcement for this channel's submissions (only it writes it). */
static inline _Atomic uint32_t *channel_sq_sleep_word(struct sidecar_channel *ch)
{
	return &ch->sq.ctrl->consumer_sleeping;
}

#endif
