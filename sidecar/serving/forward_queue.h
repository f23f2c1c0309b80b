/* forward_queue.h — FORWARD, PREFETCH, STATS and MASK: the wire semantics of serving a model.
 *
 * Owns: the forward thread (the engine's forward_run blocks for a whole layer, and for NVMe
 * reads of cold experts: those run here, never on the dispatcher; a FORWARD that can finish
 * at once — nothing ahead of it, every expert resident, a few tokens — the dispatcher runs
 * inline, saving a thread hand-off per layer), the per-channel queues of accepted FORWARDs served
 * round-robin across channels (one request per channel per turn: a client that floods its ring
 * cannot starve another), each channel's deferred state (the contribution owed to its next FORWARD,
 * double buffered), the forward thread's private copies of inputs (copied out of shared memory
 * once, then validated by the engine), each channel's client id for GPU masks, and what the
 * FORWARDs served routed (routing.h: counts, heat; trace_recorder.h: `--record-trace`).
 *
 * GPU mask switches: a MASK runs on the dispatcher when its channel has no FORWARD queued or
 * running, else behind them in the channel's queue on the forward thread, so every FORWARD
 * is validated and computed under the mask in force when it was submitted.
 *
 * Threading: create/destroy/shutdown and channel_open/close on the control thread; the op
 * executors on the dispatcher; the forward thread finishes FORWARDs through
 * channel_complete_async (inline ones complete like any synchronous op). Nothing on the
 * request path allocates.
 *
 * Life of a channel: the service's channel_open before dispatcher_add; after
 * dispatcher_remove, its channel_close drops its queued FORWARDs, waits for the one running
 * (bounded by one layer) and frees its deferred state — a dead client's work never reaches another.
 */
#ifndef MOE_SIDECAR_FORWARD_QUEUE_H
#define MOE_SIDECAR_FORWARD_QUEUE_H

#include <stddef.h>

#include "channel.h"
#include "moe_proto.h"
#include "served_model.h"
#include "service.h"

struct forward_queue;

/* What the engine routes (routing.h) and its recording (trace_recorder.h). Zero: defaults,
 * no recording. */
struct forward_queue_config {
	uint32_t heat_half_life;         /* tokens per MoE layer; 0: ROUTING_HALF_LIFE_DEFAULT */
	const char *record_trace;        /* trace file, or NULL */
	int record_trace_fd;             /* trace_recorder_open's; borrowed (the caller closes) */
	uint64_t record_trace_max_bytes; /* 0: TRACE_RECORD_MAX_MIB_DEFAULT MiB */
	/* Bytes of each channel's lease staging area (MOE_LEASE_BF16; serve --lease-staging-mib,
	 * with --leases); 0: none. Not accounted against the memory limit. */
	uint64_t lease_staging_bytes;
	bool batch_invariant; /* every channel batch-invariant (--batch-invariant) */
};

/* Starts the forward thread over an open model (which must outlive it), and the trace
 * recorder when asked. 0 or -1 with err filled. */
int forward_queue_create(struct serve_model *m, const struct forward_queue_config *cfg,
                         struct forward_queue **out, struct sidecar_error *err);
/* Joins the forward thread and frees. Every channel must be closed. NULL is a no-op. */
void forward_queue_destroy(struct forward_queue *o);

/* What the server serves through this queue (transport/service.h): the op table, and the
 * hooks that open and close a channel (a client id, deferred buffers sized for its granted
 * limits, accounted against the sidecar's memory limit: more than SERVE_MODEL_MAX_CLIENTS
 * model clients, out of memory, or a channel past the limit is refused with a sentence;
 * closing drops its queued FORWARDs and waits for the one running), the welcome's model
 * description, SIGHUP's retry of FAILED experts, and shutdown (queued FORWARDs complete
 * with MOE_ESHUTDOWN, new ones are refused the same way, the one running finishes). */
const struct channel_service *forward_queue_service(struct forward_queue *o);

/* Op table rows (ops.c). Each check answers MOE_ENOMODEL on a channel without a model. */
int model_op_check(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                   struct moe_cqe *err);
void model_op_forward(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                      struct moe_cqe *done);
void model_op_prefetch(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                       struct moe_cqe *done);
void model_op_stats(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                    struct moe_cqe *done);
void model_op_mask(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                   struct moe_cqe *done);
/* LEASE and RELEASE (ABI 1.3): expert leases of the channel (forward.h); MOE_ENOLEASE with
 * the reason on a sidecar whose pool is not shared (serve --leases). */
void model_op_lease(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                    struct moe_cqe *done);

/* The board the dispatcher publishes the STATS figures on when the metrics thread asks
 * (stats_doc.h); it lives as long as the queue. */
struct stats_board *forward_queue_board(struct forward_queue *o);

#endif
