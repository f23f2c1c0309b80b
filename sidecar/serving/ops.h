/* ops.h — the op table: what each request operation checks and does.
 *
 * Owns: per-op validation beyond moe_sqe_check, and execution. Ring handling (channel.c)
 * never knows what an op does; it looks the op up here, so MOE_OP_FORWARD, PREFETCH and STATS
 * plug in as rows. Executors run on a private copy of the submission and write only inside
 * the slot's areas. PING, ECHO, PREFETCH, MASK and STATS run synchronously on the dispatcher
 * thread; FORWARD is handed to the forward thread (forward_queue.h) and completes asynchronously
 * (OP_PENDING), so the dispatcher keeps draining every ring meanwhile.
 */
#ifndef MOE_SIDECAR_OPS_H
#define MOE_SIDECAR_OPS_H

#include "channel.h"
#include "moe_proto.h"

/* Status an executor sets when the request finishes later, on another thread, through
 * channel_complete_async: the slot stays busy until then. Positive, so never a wire status. */
#define OP_PENDING 1
/* Status an executor sets when it has already posted its completion itself, on the dispatcher
 * thread, with channel_post_now (a FORWARD run inline that delivered its immediate part before
 * computing its deferred experts). Positive, so never a wire status. */
#define OP_POSTED 2

struct op_desc {
	const char *name;
	/* Status to complete with when this sidecar cannot run the op (execute == NULL). */
	int unsupported_status;
	/* Op-specific checks of the private copy; MOE_OK or an error with *err filled. NULL:
	 * moe_sqe_check said everything. */
	int (*check)(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
	             struct moe_cqe *err);
	/* Runs the request; fills done->status/value (user_data and slot are preset). */
	void (*execute)(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
	                struct moe_cqe *done);
};

/* The row for op, or NULL if op is not a known operation. */
const struct op_desc *op_lookup(uint32_t op);

#endif
