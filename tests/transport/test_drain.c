/* test_drain.c — the sidecar's ring-draining core, in process on a plain buffer: one
 * completion per submission, validation of the private copy, slot-in-flight detection,
 * back-pressure when the client does not drain its CQ, and hostile ring indices. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "moe_kernels.h"
#include "ops.h"

struct fixture {
	void *buf;
	struct sidecar_channel *ch;
	struct moe_ring_prod sq; /* the client's cursors */
	struct moe_ring_cons cq;
	struct moe_sqe *sqes;
	struct moe_cqe *cqes;
};

static void setup(struct fixture *f, uint32_t n_slots)
{
	struct moe_limits lim = {.max_tokens = 4,
	                         .hidden = 16,
	                         .top_k = 2,
	                         .n_slots = n_slots,
	                         .ring_entries = moe_pow2_ceil(n_slots),
	                         .dtype_mask = MOE_DTYPE_MASK_ALL};
	struct moe_layout l;
	cr_assert_eq(moe_layout_compute(&lim, &l), MOE_OK);
	f->buf = aligned_alloc(4096, l.total);
	struct sidecar_error err = {0};
	const uint64_t epoch = 0xfffffffe12345678ull; /* rings start near UINT32_MAX */
	cr_assert_eq(channel_attach_buffer(f->buf, l.total, &lim, epoch, &f->ch, &err), 0, "%s",
	             err.msg);
	f->ch->ops = serving_ops; /* the sidecar's own table, without a model */
	const uint32_t start = moe_channel_ring_start(epoch);
	uint8_t *b = f->buf;
	moe_ring_prod_attach(&f->sq, (struct moe_ring_ctrl *)(b + l.sq_ctrl), l.ring_entries,
	                     start);
	moe_ring_cons_attach(&f->cq, (struct moe_ring_ctrl *)(b + l.cq_ctrl), l.ring_entries,
	                     start);
	f->sqes = (struct moe_sqe *)(b + l.sq_entries);
	f->cqes = (struct moe_cqe *)(b + l.cq_entries);
}

static void teardown(struct fixture *f)
{
	channel_destroy(f->ch);
	free(f->buf);
}

static void submit(struct fixture *f, struct moe_sqe sqe)
{
	cr_assert_gt(moe_ring_space(&f->sq), 0);
	f->sqes[moe_ring_prod_pos(&f->sq, 0)] = sqe;
	moe_ring_publish(&f->sq, 1);
}

static struct moe_cqe reap(struct fixture *f)
{
	cr_assert_gt(moe_ring_ready(&f->cq), 0, "a completion is waiting");
	struct moe_cqe c = f->cqes[moe_ring_cons_pos(&f->cq, 0)];
	moe_ring_consume(&f->cq, 1);
	return c;
}

Test(drain, ping_and_echo_complete)
{
	struct fixture f;
	setup(&f, 2);
	submit(&f, (struct moe_sqe){.op = MOE_OP_PING, .slot = 1, .user_data = 11});
	struct slot_areas a;
	channel_slot_areas(f.ch, 0, &a);
	float in[3 * 16];
	for (int i = 0; i < 3 * 16; i++)
		in[i] = (float)i * 0.37f - 5.0f;
	memcpy(a.input, in, sizeof(in));
	submit(&f, (struct moe_sqe){.op = MOE_OP_ECHO,
	                            .slot = 0,
	                            .user_data = 12,
	                            .n_tokens = 3,
	                            .in_dtype = MOE_DTYPE_F32,
	                            .out_dtype = MOE_DTYPE_BF16});
	cr_assert_eq(channel_drain(f.ch, 64, false), 2);
	struct moe_cqe c = reap(&f);
	cr_assert_eq(c.status, MOE_OK);
	cr_assert_eq(c.user_data, 11);
	cr_assert_eq(c.slot, 1);
	c = reap(&f);
	cr_assert_eq(c.status, MOE_OK);
	cr_assert_eq(c.user_data, 12);
	uint16_t want[3 * 16];
	moek_convert(MOE_DTYPE_BF16, want, MOE_DTYPE_F32, in, 3 * 16);
	cr_assert_arr_eq(a.output, want, sizeof(want));
	cr_assert_eq(channel_drain(f.ch, 64, false), 0, "nothing left");
	teardown(&f);
}

Test(drain, validation_errors_name_the_field)
{
	struct fixture f;
	setup(&f, 3); /* 4 ring entries */
	submit(&f, (struct moe_sqe){.op = MOE_OP_PING, .slot = 3, .user_data = 1});
	submit(&f, (struct moe_sqe){.op = 99, .slot = 0, .user_data = 2});
	struct moe_sqe r = {.op = MOE_OP_PING, .slot = 0, .user_data = 3};
	r.reserved[5] = 7;
	submit(&f, r);
	submit(&f, (struct moe_sqe){.op = MOE_OP_ECHO, .slot = 0, .user_data = 4, .n_tokens = 5});
	cr_assert_eq(channel_drain(f.ch, 64, false), 4);
	struct moe_cqe c = reap(&f);
	cr_assert_eq(c.status, MOE_EBADSLOT);
	cr_assert_eq(c.value, 3);
	c = reap(&f);
	cr_assert_eq(c.status, MOE_EBADOP);
	cr_assert_eq(c.value, 99);
	c = reap(&f);
	cr_assert_eq(c.status, MOE_EBADFIELD);
	cr_assert_eq(c.value, 7);
	cr_assert_eq(c.index, 5);
	c = reap(&f);
	cr_assert_eq(c.status, MOE_EBADTOKENS);
	cr_assert_eq(c.value, 5);
	submit(&f, (struct moe_sqe){
	               .op = MOE_OP_ECHO, .slot = 1, .user_data = 5, .n_tokens = 1, .in_dtype = 3});
	submit(&f, (struct moe_sqe){.op = MOE_OP_FORWARD,
	                            .slot = 1,
	                            .user_data = 6,
	                            .n_tokens = 1,
	                            .ids_per_token = 1});
	cr_assert_eq(channel_drain(f.ch, 64, false), 2);
	c = reap(&f);
	cr_assert_eq(c.status, MOE_EBADDTYPE);
	c = reap(&f);
	cr_assert_eq(c.status, MOE_ENOMODEL, "FORWARD without a model: %d", c.status);
	cr_assert_eq(f.ch->n_errors, 6);
	teardown(&f);
}

Test(drain, second_request_on_a_slot_in_flight_is_refused)
{
	struct fixture f;
	setup(&f, 2);
	submit(&f, (struct moe_sqe){.op = MOE_OP_PING, .slot = 1, .user_data = 1});
	submit(&f, (struct moe_sqe){.op = MOE_OP_PING, .slot = 1, .user_data = 2});
	cr_assert_eq(channel_drain(f.ch, 64, false), 2);
	struct moe_cqe c = reap(&f);
	cr_assert_eq(c.status, MOE_ESLOTBUSY);
	cr_assert_eq(c.user_data, 2);
	c = reap(&f);
	cr_assert_eq(c.status, MOE_OK);
	cr_assert_eq(c.user_data, 1);
	/* Once completed the slot is free again. */
	submit(&f, (struct moe_sqe){.op = MOE_OP_PING, .slot = 1, .user_data = 3});
	cr_assert_eq(channel_drain(f.ch, 64, false), 1);
	cr_assert_eq(reap(&f).status, MOE_OK);
	teardown(&f);
}

Test(drain, full_cq_stops_consumption_until_drained)
{
	struct fixture f;
	setup(&f, 4); /* 4 ring entries */
	for (int i = 0; i < 4; i++)
		submit(&f, (struct moe_sqe){
		               .op = MOE_OP_PING, .slot = (uint32_t)i, .user_data = 100u + i});
	cr_assert_eq(channel_drain(f.ch, 64, false), 4);
	/* The client never reaps: the CQ is full. New submissions must wait in the SQ. */
	for (int i = 0; i < 3; i++)
		submit(&f, (struct moe_sqe){
		               .op = MOE_OP_PING, .slot = (uint32_t)i, .user_data = 200u + i});
	cr_assert_eq(channel_drain(f.ch, 64, false), 0);
	cr_assert(f.ch->cq_blocked);
	cr_assert_not(channel_has_work(f.ch), "a full CQ is not work: the dispatcher may sleep");
	cr_assert_eq(reap(&f).user_data, 100);
	cr_assert(channel_has_work(f.ch));
	cr_assert_eq(channel_drain(f.ch, 64, false), 1, "exactly the room there is");
	for (int i = 1; i < 4; i++)
		cr_assert_eq(reap(&f).user_data, 100u + i);
	cr_assert_eq(reap(&f).user_data, 200);
	cr_assert_eq(channel_drain(f.ch, 64, false), 2);
	teardown(&f);
}

Test(drain, impossible_indices_break_the_channel)
{
	struct fixture f;
	setup(&f, 2);
	atomic_store(&f.sq.ctrl->tail, f.sq.tail + 3); /* 3 ahead of an empty 2-entry ring */
	cr_assert(channel_has_work(f.ch), "broken is reported as work");
	cr_assert_eq(channel_drain(f.ch, 64, false), DRAIN_BROKEN);
	cr_assert(strstr(f.ch->violation, "SQ tail"), "%s", f.ch->violation);
	teardown(&f);

	setup(&f, 2);
	/* Fill the CQ (2 entries) so that the sidecar must look at the client's head again. */
	submit(&f, (struct moe_sqe){.op = MOE_OP_PING, .slot = 0});
	submit(&f, (struct moe_sqe){.op = MOE_OP_PING, .slot = 1});
	cr_assert_eq(channel_drain(f.ch, 64, false), 2);
	/* The client claims to have consumed completions that were never made. */
	atomic_store(&f.cq.ctrl->head, f.cq.head + 3);
	submit(&f, (struct moe_sqe){.op = MOE_OP_PING, .slot = 0});
	cr_assert_eq(channel_drain(f.ch, 64, false), DRAIN_BROKEN);
	cr_assert(strstr(f.ch->violation, "CQ head"), "%s", f.ch->violation);
	teardown(&f);
}

Test(drain, shutdown_fails_queued_requests)
{
	struct fixture f;
	setup(&f, 2);
	submit(&f, (struct moe_sqe){.op = MOE_OP_PING, .slot = 0, .user_data = 1});
	submit(&f, (struct moe_sqe){.op = MOE_OP_PING, .slot = 7, .user_data = 2});
	cr_assert_eq(channel_drain(f.ch, 64, true), 2);
	struct moe_cqe a = reap(&f), b = reap(&f);
	/* Validation errors still say what was wrong; valid requests say shutdown. */
	cr_assert_eq(a.status, MOE_EBADSLOT);
	cr_assert_eq(b.status, MOE_ESHUTDOWN);
	teardown(&f);
}
