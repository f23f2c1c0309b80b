/* ops.c — the op table: PING and ECHO here; FORWARD, PREFETCH, STATS and MASK in
 * forward_queue.c (they answer MOE_ENOMODEL on a sidecar started without a model).
 *
 * ECHO is the channel's self-test: it reads n_tokens rows of `hidden` elements from the
 * slot's input area and writes them, converted from in_dtype to out_dtype, to its output
 * area. Both areas are sized for max_tokens f32 rows, so any accepted request fits; the
 * client may scribble on the input meanwhile — it only gets garbage back.
 */
#include "ops.h"

#include "forward_queue.h"
#include "moe_kernels.h"

static void op_ping(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                    struct moe_cqe *done)
{
	(void)ch;
	(void)sqe;
	done->status = MOE_OK;
}

static void op_echo(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                    struct moe_cqe *done)
{
	struct slot_areas a;
	channel_slot_areas(ch, sqe->slot, &a);
	const size_t n = (size_t)sqe->n_tokens * ch->limits.hidden;
	moek_convert(sqe->out_dtype, a.output, sqe->in_dtype, a.input, n);
	done->status = MOE_OK;
	done->value = sqe->n_tokens;
}

const struct op_desc serving_ops[MOE_OP_MAX] = {
    [MOE_OP_PING] = {.name = "ping", .execute = op_ping},
    [MOE_OP_ECHO] = {.name = "echo", .execute = op_echo},
    [MOE_OP_FORWARD] = {.name = "forward", .check = model_op_check, .execute = model_op_forward},
    [MOE_OP_PREFETCH] = {.name = "prefetch", .check = model_op_check, .execute = model_op_prefetch},
    [MOE_OP_STATS] = {.name = "stats", .check = model_op_check, .execute = model_op_stats},
    [MOE_OP_MASK] = {.name = "mask", .check = model_op_check, .execute = model_op_mask},
    [MOE_OP_LEASE] = {.name = "lease", .check = model_op_check, .execute = model_op_lease},
    [MOE_OP_RELEASE] = {.name = "release", .check = model_op_check, .execute = model_op_lease},
};

const struct channel_service serving_without_model = {.ops = serving_ops};
