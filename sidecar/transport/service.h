/* service.h — what the transport serves, as the layer above hands it in.
 *
 * Owns: the contract between the transport (server, channel, dispatcher: socket, rings,
 * completions) and whatever gives requests a meaning (sidecar/serving/). The transport knows
 * a request only through its op table row, and a channel's served state only as an opaque
 * pointer it never dereferences; it completes a request through the channel it came from
 * (channel_complete_async, channel_post_now). It includes nothing above it.
 *
 * Threading: the hooks run on the control thread (grant, open, close, welcome, reload,
 * shutdown); the op rows and tick on the dispatcher (see channel_drain).
 */
#ifndef MOE_SIDECAR_SERVICE_H
#define MOE_SIDECAR_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "moe_proto.h"

struct sidecar_channel;

/* Status an executor sets when the request finishes later, on another thread, through
 * channel_complete_async: the slot stays busy until then. Positive, so never a wire status. */
#define OP_PENDING 1
/* Status an executor sets when it has already posted its completion itself, on the dispatcher
 * thread, with channel_post_now (work that goes on after its result is delivered). Positive,
 * so never a wire status. */
#define OP_POSTED 2

/* One row of the op table. Executors run on a private copy of the submission and write only
 * inside the slot's areas (channel_slot_areas). */
struct op_desc {
	const char *name; /* NULL: not an operation of this service */
	/* Status to complete with when this service cannot run the op (execute == NULL). */
	int unsupported_status;
	/* Op-specific checks of the private copy; MOE_OK or an error with *err filled. NULL:
	 * moe_sqe_check said everything. */
	int (*check)(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
	             struct moe_cqe *err);
	/* Runs the request; fills done->status/value (user_data and slot are preset), or returns
	 * OP_PENDING / OP_POSTED in done->status. */
	void (*execute)(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
	                struct moe_cqe *done);
};

/* What a server serves. ops has MOE_OP_MAX rows indexed by op; every hook may be NULL (nothing
 * to do). ctx is passed back to every hook. */
/* The memfds a welcome carries for expert leases (channel_service.lease_fds). */
struct service_lease_fds {
	uint32_t n_pools; /* 0: no leases */
	int pool[MOE_LEASE_MAX_POOLS];
	uint64_t pool_bytes[MOE_LEASE_MAX_POOLS];
	int staging; /* -1: none */
	uint64_t staging_bytes;
};
struct channel_service {
	const struct op_desc *ops;
	void *ctx;
	/* Refuses limits the service cannot serve (its buffers are sized for less): 0, or -1 with
	 * why filled (MOE_EREFUSED; the message goes to the client). */
	int (*grant)(void *ctx, const struct moe_limits *granted, struct sidecar_error *why);
	/* A channel about to be served: sets ch->state. 0, or -1 with err filled (its message is
	 * the refusal's sentence). */
	int (*channel_open)(void *ctx, struct sidecar_channel *ch, struct sidecar_error *err);
	/* The dispatcher no longer drives ch: the service lets go of it (waits for what it runs
	 * for the channel) and clears ch->state. Called only after a successful channel_open. */
	void (*channel_close)(void *ctx, struct sidecar_channel *ch);
	/* Fills what the welcome says of the model (info and fingerprint). */
	void (*welcome)(void *ctx, struct moe_model_info *info,
	                uint8_t fingerprint[MOE_FINGERPRINT_BYTES]);
	/* SIGHUP: the operator asks to retry what failed; returns a sentence for the log. */
	void (*reload)(void *ctx, char *said, size_t said_len);
	/* Shutdown, step 1 (before the dispatcher stops): work not started is refused with
	 * MOE_ESHUTDOWN; what runs finishes. */
	void (*shutdown)(void *ctx);
	/* Dispatcher thread, at every heartbeat (dispatcher.heartbeat_ns, and at once after a
	 * dispatcher_poke): work the service does between requests (publishing its figures). */
	void (*tick)(void *ctx);
	/* Control thread, at each welcome (after channel_open): the memfds clients may map
	 * read-only for expert leases, which ride with the channel's and stay the service's —
	 * the slot pools (one per NUMA node part; ch->hello_minor says what the client reads),
	 * then the channel's staging area — with their bytes; l arrives empty (no pools, staging
	 * -1), and is left so where there is none (no staging without a pool). */
	void (*lease_fds)(void *ctx, struct sidecar_channel *ch, struct service_lease_fds *l);
};

#endif
