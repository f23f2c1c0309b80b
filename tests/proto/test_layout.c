/* test_layout.c — moe_layout_compute invariants and the handshake message parsers,
 * including the version refusal in both directions. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "moe_proto.h"
#include "moe_ring.h"

static void check_layout(const struct moe_limits *lim)
{
	struct moe_layout l;
	cr_assert_eq(moe_layout_compute(lim, &l), MOE_OK);
	cr_assert_eq(l.ring_entries, lim->ring_entries);
	/* Page alignment where the contract promises it (cudaHostRegister, O_DIRECT). */
	cr_assert_eq(l.sq_ctrl % MOE_CHANNEL_ALIGN, 0);
	cr_assert_eq(l.slots % MOE_CHANNEL_ALIGN, 0);
	cr_assert_eq(l.slot_stride % MOE_CHANNEL_ALIGN, 0);
	cr_assert_eq(l.out_off % MOE_CHANNEL_ALIGN, 0);
	cr_assert_eq(l.cq_ctrl % 128, 0);
	cr_assert_eq(l.ids_off % MOE_AREA_ALIGN, 0);
	cr_assert_eq(l.wts_off % MOE_AREA_ALIGN, 0);
	/* The header page comes first; rings and slots follow without overlap. */
	cr_assert_geq(l.sq_ctrl, sizeof(struct moe_channel_header));
	cr_assert_eq(l.sq_entries, l.sq_ctrl + sizeof(struct moe_ring_ctrl));
	cr_assert_geq(l.cq_ctrl, l.sq_entries + (uint64_t)l.ring_entries * sizeof(struct moe_sqe));
	cr_assert_eq(l.cq_entries, l.cq_ctrl + sizeof(struct moe_ring_ctrl));
	cr_assert_geq(l.slots, l.cq_entries + (uint64_t)l.ring_entries * sizeof(struct moe_cqe));
	/* Areas sized from the limits (f32 rows), in order, inside one stride. */
	const uint64_t rows = (uint64_t)lim->max_tokens * lim->hidden * 4;
	const uint64_t ids = (uint64_t)lim->max_tokens * lim->top_k * 4;
	cr_assert_eq(l.in_bytes, rows);
	cr_assert_eq(l.out_bytes, rows);
	cr_assert_eq(l.ids_bytes, ids);
	cr_assert_eq(l.wts_bytes, ids);
	cr_assert_geq(l.ids_off, l.in_off + l.in_bytes);
	cr_assert_geq(l.wts_off, l.ids_off + l.ids_bytes);
	cr_assert_geq(l.out_off, l.wts_off + l.wts_bytes);
	cr_assert_geq(l.slot_stride, l.out_off + l.out_bytes);
	cr_assert_eq(l.total, l.slots + l.slot_stride * lim->n_slots);
}

Test(layout, invariants_over_many_limits)
{
	const uint32_t tokens[] = {1, 3, 256, MOE_MAX_TOKENS_LIMIT};
	const uint32_t hidden[] = {1, 7, 4096, MOE_MAX_HIDDEN_LIMIT};
	const uint32_t topk[] = {1, 8, MOE_MAX_TOPK_LIMIT};
	const uint32_t slots[] = {1, 3, 4, MOE_MAX_SLOTS_LIMIT};
	for (size_t a = 0; a < 4; a++)
		for (size_t b = 0; b < 4; b++)
			for (size_t k = 0; k < 3; k++)
				for (size_t s = 0; s < 4; s++) {
					struct moe_limits lim = {.max_tokens = tokens[a],
					                         .hidden = hidden[b],
					                         .top_k = topk[k],
					                         .n_slots = slots[s],
					                         .ring_entries =
					                             moe_pow2_ceil(slots[s]),
					                         .dtype_mask = MOE_DTYPE_MASK_ALL};
					check_layout(&lim);
				}
}

Test(layout, rejects_bad_limits)
{
	struct moe_limits ok = {.max_tokens = 4,
	                        .hidden = 8,
	                        .top_k = 2,
	                        .n_slots = 3,
	                        .ring_entries = 4,
	                        .dtype_mask = 1};
	struct moe_layout l;
	char why[160];
	cr_assert_eq(moe_limits_check(&ok, why, sizeof(why)), MOE_OK);
	struct moe_limits bad = ok;
	bad.ring_entries = 2; /* < n_slots */
	cr_assert_eq(moe_limits_check(&bad, why, sizeof(why)), MOE_EINVAL);
	cr_assert(strstr(why, "ring_entries"), "names the field: %s", why);
	cr_assert_eq(moe_layout_compute(&bad, &l), MOE_EINVAL);
	bad = ok;
	bad.ring_entries = 6; /* not a power of two */
	cr_assert_eq(moe_limits_check(&bad, NULL, 0), MOE_EINVAL);
	bad = ok;
	bad.hidden = MOE_MAX_HIDDEN_LIMIT + 1;
	cr_assert_eq(moe_limits_check(&bad, why, sizeof(why)), MOE_EINVAL);
	cr_assert(strstr(why, "hidden"), "%s", why);
	bad = ok;
	bad.dtype_mask = 1u << 7;
	cr_assert_eq(moe_limits_check(&bad, NULL, 0), MOE_EINVAL);
	bad = ok;
	bad.max_tokens = 0;
	cr_assert_eq(moe_limits_check(&bad, NULL, 0), MOE_EINVAL);
}

static struct moe_hello good_hello(void)
{
	struct moe_hello h;
	moe_hello_init(&h, "t");
	return h;
}

Test(handshake, hello_parse)
{
	struct moe_hello h = good_hello(), out;
	char why[160];
	cr_assert_eq(moe_hello_parse(&h, sizeof(h), &out, why, sizeof(why)), MOE_OK);
	cr_assert_str_eq(out.client_name, "t");

	cr_assert_eq(moe_hello_parse(&h, 15, &out, why, sizeof(why)), MOE_EPROTO, "too short");
	struct moe_hello bad = h;
	bad.magic ^= 1;
	cr_assert_eq(moe_hello_parse(&bad, sizeof(bad), &out, why, sizeof(why)), MOE_EPROTO);
	cr_assert(strstr(why, "magic"), "%s", why);
	bad = h;
	bad.size = 100;
	cr_assert_eq(moe_hello_parse(&bad, sizeof(bad), &out, why, sizeof(why)), MOE_EPROTO);
	bad = h;
	bad.want.ring_entries = 4;
	cr_assert_eq(moe_hello_parse(&bad, sizeof(bad), &out, why, sizeof(why)), MOE_EPROTO);
	cr_assert(strstr(why, "ring_entries"), "%s", why);
	bad = h;
	memset(bad.client_name, 'x', sizeof(bad.client_name)); /* unterminated */
	cr_assert_eq(moe_hello_parse(&bad, sizeof(bad), &out, why, sizeof(why)), MOE_OK);
	cr_assert_eq(strlen(out.client_name), sizeof(out.client_name) - 1);

	/* An older, shorter hello (a minor that had fewer fields) is zero-extended. */
	struct moe_hello older = h;
	older.size = offsetof(struct moe_hello, client_name);
	cr_assert_eq(moe_hello_parse(&older, older.size, &out, why, sizeof(why)), MOE_OK);
	cr_assert_eq(out.client_name[0], '\0');
}

Test(handshake, hello_from_a_newer_major_is_refused)
{
	struct moe_hello h = good_hello(), out;
	h.abi_major = 2;
	char why[160] = "";
	cr_assert_eq(moe_hello_parse(&h, sizeof(h), &out, why, sizeof(why)), MOE_EVERSION);
	char theirs[16], ours[16];
	snprintf(theirs, sizeof(theirs), "2.%u", MOE_ABI_MINOR);
	snprintf(ours, sizeof(ours), "%u.%u", MOE_ABI_MAJOR, MOE_ABI_MINOR);
	cr_assert(strstr(why, theirs) && strstr(why, ours), "says both versions: %s", why);
}

static struct moe_welcome good_welcome(void)
{
	struct moe_welcome w;
	memset(&w, 0, sizeof(w));
	w.magic = MOE_WELCOME_MAGIC;
	w.abi_major = MOE_ABI_MAJOR;
	w.abi_minor = MOE_ABI_MINOR;
	w.size = sizeof(w);
	w.limits = (struct moe_limits){1, 1, 1, 1, 1, 1};
	return w;
}

Test(handshake, welcome_parse)
{
	struct moe_welcome w = good_welcome(), out;
	char why[256];
	cr_assert_eq(moe_welcome_parse(&w, sizeof(w), &out, why, sizeof(why)), MOE_OK);
	cr_assert_eq(moe_welcome_parse(&w, MOE_WELCOME_FROZEN - 1, &out, why, sizeof(why)),
	             MOE_EPROTO);
	/* A refusal may be just the frozen prefix. */
	struct moe_welcome r = good_welcome();
	r.status = MOE_EREFUSED;
	r.size = MOE_WELCOME_FROZEN;
	strcpy(r.reason, "go away");
	cr_assert_eq(moe_welcome_parse(&r, MOE_WELCOME_FROZEN, &out, why, sizeof(why)), MOE_OK);
	cr_assert_eq(out.status, MOE_EREFUSED);
	cr_assert_str_eq(out.reason, "go away");
	/* But an acceptance must be whole. */
	r.status = MOE_OK;
	cr_assert_eq(moe_welcome_parse(&r, MOE_WELCOME_FROZEN, &out, why, sizeof(why)), MOE_EPROTO);
	struct moe_welcome bad = w;
	bad.status = 5;
	cr_assert_eq(moe_welcome_parse(&bad, sizeof(bad), &out, why, sizeof(why)), MOE_EPROTO);
	bad = w;
	memset(bad.reason, 'r', sizeof(bad.reason)); /* unterminated reason */
	cr_assert_eq(moe_welcome_parse(&bad, sizeof(bad), &out, why, sizeof(why)), MOE_OK);
	cr_assert_eq(strlen(out.reason), MOE_REASON_LEN - 1);
}

Test(handshake, welcome_from_a_newer_major_is_refused)
{
	struct moe_welcome w = good_welcome(), out;
	w.abi_major = 2;
	w.size = 999; /* a newer major may have any size: the frozen prefix is enough */
	strcpy(w.reason, "upgrade me");
	char why[256] = "";
	cr_assert_eq(moe_welcome_parse(&w, sizeof(w), &out, why, sizeof(why)), MOE_EVERSION);
	char theirs[16], ours[16];
	snprintf(theirs, sizeof(theirs), "2.%u", MOE_ABI_MINOR);
	snprintf(ours, sizeof(ours), "%u.%u", MOE_ABI_MAJOR, MOE_ABI_MINOR);
	cr_assert(strstr(why, theirs) && strstr(why, ours), "says both versions: %s", why);
}
