/* fuzz_channel.c — libFuzzer over the sidecar's ring-draining and validation code
 * (channel_drain), run in process on a channel image in a plain heap buffer of exactly the
 * channel's size (so any access outside it hits ASan's redzone).
 *
 * The input is a little program a hostile client runs against its channel, one command per
 * step: write a submission (raw bytes or a plausible one) and publish it, overwrite the SQ
 * tail / CQ head / sleep word / header / payload bytes with anything, reap completions, or
 * let the sidecar drain. Checked: the drain never crashes or touches memory outside the
 * channel, posts exactly one completion per submission it takes, never overfills the CQ,
 * and reports an impossible index instead of using it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "ops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct input {
	const uint8_t *p;
	size_t left;
};

static int take(struct input *in, void *dst, size_t n)
{
	if (in->left < n)
		return 0;
	memcpy(dst, in->p, n);
	in->p += n;
	in->left -= n;
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct moe_limits lim = {.max_tokens = 4,
	                                      .hidden = 8,
	                                      .top_k = 2,
	                                      .n_slots = 3,
	                                      .ring_entries = 4,
	                                      .dtype_mask = MOE_DTYPE_MASK_ALL};
	struct moe_layout l;
	if (moe_layout_compute(&lim, &l) != MOE_OK)
		abort();
	uint8_t *buf = calloc(1, l.total);
	struct sidecar_channel *ch;
	struct sidecar_error err = {0};
	const uint64_t epoch = 0xfffffffd00000000ull; /* rings start 3 below the wrap */
	if (channel_attach_buffer(buf, l.total, &lim, epoch, &ch, &err) != 0)
		abort();
	ch->ops = serving_ops; /* the sidecar's own table, without a model */
	const uint32_t start = moe_channel_ring_start(epoch);
	struct moe_ring_prod sq; /* the hostile client's own cursors */
	struct moe_ring_cons cq;
	moe_ring_prod_attach(&sq, (struct moe_ring_ctrl *)(buf + l.sq_ctrl), l.ring_entries, start);
	moe_ring_cons_attach(&cq, (struct moe_ring_ctrl *)(buf + l.cq_ctrl), l.ring_entries, start);
	struct moe_sqe *sqes = (struct moe_sqe *)(buf + l.sq_entries);

	struct input in = {data, size};
	uint8_t cmd;
	bool broken = false;
	while (!broken && take(&in, &cmd, 1)) {
		uint32_t v;
		switch (cmd % 8) {
		case 0: { /* raw submission bytes */
			struct moe_sqe e;
			memset(&e, 0, sizeof(e));
			take(&in, &e, sizeof(e));
			sqes[moe_ring_prod_pos(&sq, 0)] = e;
			moe_ring_publish(&sq, 1);
			break;
		}
		case 1: { /* plausible submission: op, slot, tokens, dtypes from 4 bytes */
			uint8_t b[4] = {0};
			take(&in, b, 4);
			struct moe_sqe e = {.op = (uint16_t)(b[0] % 7),
			                    .slot = b[1] % 5u,
			                    .n_tokens = b[2] % 6u,
			                    .in_dtype = b[3] & 3,
			                    .out_dtype = (b[3] >> 2) & 3};
			if (e.op == MOE_OP_PING)
				e.n_tokens = e.in_dtype = e.out_dtype = 0;
			sqes[moe_ring_prod_pos(&sq, 0)] = e;
			moe_ring_publish(&sq, 1);
			break;
		}
		case 2: /* SQ tail: anything */
			if (take(&in, &v, 4))
				atomic_store(&sq.ctrl->tail, v);
			break;
		case 3: /* CQ head: anything */
			if (take(&in, &v, 4))
				atomic_store(&cq.ctrl->head, v);
			break;
		case 4: { /* scribble: offset (u32) and 8 bytes anywhere in the channel */
			uint8_t b[8] = {0};
			if (take(&in, &v, 4) && take(&in, b, 8)) {
				uint64_t off = v % l.total;
				size_t n = l.total - off < 8 ? (size_t)(l.total - off) : 8;
				memcpy(buf + off, b, n);
			}
			break;
		}
		case 5: { /* reap everything (the client's own, valid head) */
			int64_t r = moe_ring_ready(&cq);
			if (r > 0)
				moe_ring_consume(&cq, (uint32_t)r);
			break;
		}
		default: { /* the sidecar drains */
			const uint32_t cq_tail_before = ch->cq.tail;
			const uint32_t sq_head_before = ch->sq.head;
			int n = channel_drain(ch, 1 + cmd / 8, false);
			if (n == DRAIN_BROKEN) {
				if (ch->violation[0] == '\0')
					abort(); /* a drop must say why */
				broken = true;
				break;
			}
			/* One completion per submission taken; never past the client's head. */
			if (ch->cq.tail - cq_tail_before != (uint32_t)n ||
			    ch->sq.head - sq_head_before != (uint32_t)n)
				abort();
			if (ch->cq.tail - ch->cq.cached_head > ch->cq.entries)
				abort();
			break;
		}
		}
	}
	if (!broken)
		(void)channel_drain(ch, 64, true);
	channel_destroy(ch);
	free(buf);
	return 0;
}
