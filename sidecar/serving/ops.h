/* ops.h — the op table the sidecar serves: what each request operation checks and does.
 *
 * Owns: the rows of every MOE_OP_* (transport/service.h's struct op_desc). PING and ECHO are
 * here; FORWARD, PREFETCH, STATS and MASK are the forward queue's (forward_queue.h) and answer
 * MOE_ENOMODEL on a channel without a model. PING, ECHO, PREFETCH, MASK and STATS run
 * synchronously on the dispatcher thread; FORWARD is handed to the forward thread and
 * completes asynchronously (OP_PENDING), or runs inline when it can finish at once.
 */
#ifndef MOE_SIDECAR_OPS_H
#define MOE_SIDECAR_OPS_H

#include "moe_proto.h"
#include "service.h"

/* MOE_OP_MAX rows, indexed by op. */
extern const struct op_desc serving_ops[MOE_OP_MAX];

/* What a sidecar started without a model serves: the same table, no hooks. */
extern const struct channel_service serving_without_model;

#endif
