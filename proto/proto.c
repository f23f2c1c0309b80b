/* proto.c — layout computation and validation of everything a peer sends.
 *
 * Both sides link this file, so the layout exists once. Every function here treats its
 * input as hostile: it reads only the bytes it was given, and answers with a status and a
 * sentence rather than an assertion.
 */
#include "moe_proto.h"
#include "moe_ring.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

int moe_fail_with(int status, char *why, size_t why_len, const char *fmt, ...)
{
	if (why && why_len) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(why, why_len, fmt, ap);
		va_end(ap);
	}
	return status;
}

#define fail moe_fail_with

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

uint32_t moe_pow2_ceil(uint32_t n)
{
	uint32_t p = 1;
	while (p < n)
		p <<= 1;
	return p;
}

/* MOE_OK if 1 <= v <= max, else MOE_EINVAL and "NAME V not in 1..MAX". */
static int check_count(const char *name, uint32_t v, uint32_t max, char *why, size_t why_len)
{
	if (v == 0 || v > max)
		return fail(MOE_EINVAL, why, why_len, "%s %u not in 1..%u", name, v, max);
	return MOE_OK;
}

int moe_limits_check(const struct moe_limits *lim, char *why, size_t why_len)
{
	if (check_count("max_tokens", lim->max_tokens, MOE_MAX_TOKENS_LIMIT, why, why_len) ||
	    check_count("hidden", lim->hidden, MOE_MAX_HIDDEN_LIMIT, why, why_len) ||
	    check_count("top_k", lim->top_k, MOE_MAX_TOPK_LIMIT, why, why_len) ||
	    check_count("n_slots", lim->n_slots, MOE_MAX_SLOTS_LIMIT, why, why_len))
		return MOE_EINVAL;
	if (lim->ring_entries < lim->n_slots || (lim->ring_entries & (lim->ring_entries - 1)) ||
	    lim->ring_entries > 2 * MOE_MAX_SLOTS_LIMIT)
		return fail(MOE_EINVAL, why, why_len,
		            "ring_entries %u is not a power of two >= n_slots %u",
		            lim->ring_entries, lim->n_slots);
	if ((lim->dtype_mask & MOE_DTYPE_MASK_ALL) == 0 || (lim->dtype_mask & ~MOE_DTYPE_MASK_ALL))
		return fail(MOE_EINVAL, why, why_len,
		            "dtype_mask 0x%x names no known dtype or an "
		            "unknown one",
		            lim->dtype_mask);
	return MOE_OK;
}

int moe_layout_compute(const struct moe_limits *lim, struct moe_layout *out)
{
	if (moe_limits_check(lim, NULL, 0) != MOE_OK)
		return MOE_EINVAL;
	/* All products below are < 2^43 thanks to the hard limits. */
	const uint64_t rows = (uint64_t)lim->max_tokens * lim->hidden * 4u;
	const uint64_t ids = (uint64_t)lim->max_tokens * lim->top_k * 4u;
	const uint64_t entries = lim->ring_entries;
	struct moe_layout l = {0};

	l.ring_entries = lim->ring_entries;
	l.sq_ctrl = MOE_CHANNEL_ALIGN;
	l.sq_entries = l.sq_ctrl + sizeof(struct moe_ring_ctrl);
	l.cq_ctrl = align_up(l.sq_entries + entries * sizeof(struct moe_sqe), 128);
	l.cq_entries = l.cq_ctrl + sizeof(struct moe_ring_ctrl);
	l.slots = align_up(l.cq_entries + entries * sizeof(struct moe_cqe), MOE_CHANNEL_ALIGN);

	l.in_off = 0;
	l.in_bytes = rows;
	l.ids_off = align_up(l.in_off + l.in_bytes, MOE_AREA_ALIGN);
	l.ids_bytes = ids;
	l.wts_off = align_up(l.ids_off + l.ids_bytes, MOE_AREA_ALIGN);
	l.wts_bytes = ids;
	l.out_off = align_up(l.wts_off + l.wts_bytes, MOE_CHANNEL_ALIGN);
	l.out_bytes = rows;
	l.slot_stride = align_up(l.out_off + l.out_bytes, MOE_CHANNEL_ALIGN);
	l.total = l.slots + l.slot_stride * lim->n_slots;
	*out = l;
	return MOE_OK;
}

void moe_hello_init(struct moe_hello *h, const char *client_name)
{
	memset(h, 0, sizeof(*h));
	h->magic = MOE_HELLO_MAGIC;
	h->abi_major = MOE_ABI_MAJOR;
	h->abi_minor = MOE_ABI_MINOR;
	h->size = sizeof(*h);
	snprintf(h->client_name, sizeof(h->client_name), "%s", client_name);
}

/* The private copy of a peer's message: its first `size` bytes, zero-extended to `size` when
 * the peer (an older version) sent fewer. */
static void copy_zero_extended(void *dst, size_t size, const void *buf, size_t len)
{
	memset(dst, 0, size);
	memcpy(dst, buf, len < size ? len : size);
}

int moe_hello_parse(const void *buf, size_t len, struct moe_hello *out, char *why, size_t why_len)
{
	struct moe_hello h;
	if (len < MOE_HELLO_MIN_SIZE)
		return fail(MOE_EPROTO, why, why_len, "hello is %zu bytes, shorter than %u", len,
		            MOE_HELLO_MIN_SIZE);
	copy_zero_extended(&h, sizeof(h), buf, len);
	if (h.magic != MOE_HELLO_MAGIC)
		return fail(MOE_EPROTO, why, why_len, "not a moe-sidecar hello (magic 0x%08x)",
		            h.magic);
	if (h.abi_major != MOE_ABI_MAJOR)
		return fail(MOE_EVERSION, why, why_len,
		            "client speaks protocol %u.%u, this sidecar speaks %u.%u", h.abi_major,
		            h.abi_minor, MOE_ABI_MAJOR, MOE_ABI_MINOR);
	if (h.size != len)
		return fail(MOE_EPROTO, why, why_len, "hello says it is %u bytes but %zu arrived",
		            h.size, len);
	if (h.want.ring_entries != 0)
		return fail(MOE_EPROTO, why, why_len,
		            "hello asks for ring_entries %u; the "
		            "sidecar sets it",
		            h.want.ring_entries);
	/* Fields a newer minor added beyond our struct were not copied: ignored by rule. */
	h.client_name[sizeof(h.client_name) - 1] = '\0';
	*out = h;
	return MOE_OK;
}

int moe_welcome_parse(const void *buf, size_t len, struct moe_welcome *out, char *why,
                      size_t why_len)
{
	struct moe_welcome w;
	if (len < MOE_WELCOME_FROZEN)
		return fail(MOE_EPROTO, why, why_len, "welcome is %zu bytes, shorter than %u", len,
		            MOE_WELCOME_FROZEN);
	copy_zero_extended(&w, sizeof(w), buf, len);
	w.reason[MOE_REASON_LEN - 1] = '\0';
	if (w.magic != MOE_WELCOME_MAGIC)
		return fail(MOE_EPROTO, why, why_len, "not a moe-sidecar welcome (magic 0x%08x)",
		            w.magic);
	if (w.abi_major != MOE_ABI_MAJOR)
		return fail(MOE_EVERSION, why, why_len,
		            "sidecar speaks protocol %u.%u, this client speaks %u.%u%s%s",
		            w.abi_major, w.abi_minor, MOE_ABI_MAJOR, MOE_ABI_MINOR,
		            w.reason[0] ? ": " : "", w.reason);
	if (w.size != len)
		return fail(MOE_EPROTO, why, why_len, "welcome says it is %u bytes but %zu arrived",
		            w.size, len);
	if (w.status == MOE_OK && len < sizeof(w))
		return fail(MOE_EPROTO, why, why_len, "accepting welcome is %zu bytes, need %zu",
		            len, sizeof(w));
	if (w.status > 0)
		return fail(MOE_EPROTO, why, why_len, "welcome status %d is not a status",
		            w.status);
	w.model.name[sizeof(w.model.name) - 1] = '\0';
	*out = w;
	return MOE_OK;
}

static int sqe_fail(const struct moe_sqe *sqe, struct moe_cqe *err, int status, uint32_t value,
                    uint32_t index)
{
	memset(err, 0, sizeof(*err));
	err->user_data = sqe->user_data;
	err->slot = sqe->slot;
	err->status = status;
	err->value = value;
	err->index = index;
	return status;
}

static int check_dtypes(const struct moe_sqe *sqe, const struct moe_limits *lim,
                        struct moe_cqe *err)
{
	if (sqe->in_dtype >= MOE_DTYPE_COUNT || !(lim->dtype_mask & (1u << sqe->in_dtype)))
		return sqe_fail(sqe, err, MOE_EBADDTYPE, sqe->in_dtype, 0);
	if (sqe->out_dtype >= MOE_DTYPE_COUNT || !(lim->dtype_mask & (1u << sqe->out_dtype)))
		return sqe_fail(sqe, err, MOE_EBADDTYPE, sqe->out_dtype, 1);
	return MOE_OK;
}

int moe_sqe_check(const struct moe_sqe *sqe, const struct moe_limits *lim, struct moe_cqe *err)
{
	if (sqe->slot >= lim->n_slots)
		return sqe_fail(sqe, err, MOE_EBADSLOT, sqe->slot, 0);
	if (sqe->op == 0 || sqe->op >= MOE_OP_MAX)
		return sqe_fail(sqe, err, MOE_EBADOP, sqe->op, 0);
	for (uint32_t i = 0; i < sizeof(sqe->reserved) / sizeof(sqe->reserved[0]); i++)
		if (sqe->reserved[i] != 0)
			return sqe_fail(sqe, err, MOE_EBADFIELD, sqe->reserved[i], i);

	switch (sqe->op) {
	case MOE_OP_PING:
		if (sqe->flags || sqe->n_tokens || sqe->in_dtype || sqe->out_dtype ||
		    sqe->ids_per_token || sqe->layer || sqe->arg)
			return sqe_fail(sqe, err, MOE_EBADFIELD, 0, 0);
		return MOE_OK;
	case MOE_OP_ECHO:
		if (sqe->flags || sqe->ids_per_token || sqe->layer || sqe->arg)
			return sqe_fail(sqe, err, MOE_EBADFIELD, 0, 0);
		if (sqe->n_tokens == 0 || sqe->n_tokens > lim->max_tokens)
			return sqe_fail(sqe, err, MOE_EBADTOKENS, sqe->n_tokens, 0);
		return check_dtypes(sqe, lim, err);
	case MOE_OP_FORWARD:
		if (sqe->flags & ~MOE_FWD_FLAGS_ALL)
			return sqe_fail(sqe, err, MOE_EBADFIELD, sqe->flags, 0);
		if (sqe->n_tokens == 0 || sqe->n_tokens > lim->max_tokens)
			return sqe_fail(sqe, err, MOE_EBADTOKENS, sqe->n_tokens, 0);
		if (sqe->ids_per_token == 0 || sqe->ids_per_token > lim->top_k)
			return sqe_fail(sqe, err, MOE_EBADTOPK, sqe->ids_per_token, 0);
		if (sqe->arg > sqe->ids_per_token)
			return sqe_fail(sqe, err, MOE_EBADFIELD, sqe->arg, 0);
		if (sqe->layer < 0)
			return sqe_fail(sqe, err, MOE_EBADLAYER, (uint32_t)sqe->layer, 0);
		return check_dtypes(sqe, lim, err);
	case MOE_OP_PREFETCH:
		/* Entries must fit the ids/weights areas: max_tokens * top_k of each. */
		if (sqe->flags & ~MOE_PREFETCH_FLAGS_ALL)
			return sqe_fail(sqe, err, MOE_EBADFIELD, sqe->flags, 0);
		if (sqe->in_dtype || sqe->out_dtype || sqe->ids_per_token || sqe->arg)
			return sqe_fail(sqe, err, MOE_EBADFIELD, 0, 0);
		if (sqe->n_tokens == 0 ||
		    (uint64_t)sqe->n_tokens > (uint64_t)lim->max_tokens * lim->top_k)
			return sqe_fail(sqe, err, MOE_EBADTOKENS, sqe->n_tokens, 0);
		if (sqe->layer < 0)
			return sqe_fail(sqe, err, MOE_EBADLAYER, (uint32_t)sqe->layer, 0);
		return MOE_OK;
	case MOE_OP_STATS:
		if (sqe->flags & ~MOE_STATS_FLAGS_ALL)
			return sqe_fail(sqe, err, MOE_EBADFIELD, sqe->flags, 0);
		if (sqe->n_tokens || sqe->in_dtype || sqe->out_dtype || sqe->ids_per_token ||
		    sqe->layer || sqe->arg)
			return sqe_fail(sqe, err, MOE_EBADFIELD, 0, 0);
		return MOE_OK;
	case MOE_OP_MASK:
		if (sqe->flags || sqe->n_tokens || sqe->in_dtype || sqe->out_dtype ||
		    sqe->ids_per_token || sqe->arg)
			return sqe_fail(sqe, err, MOE_EBADFIELD, 0, 0);
		if (sqe->layer < -1)
			return sqe_fail(sqe, err, MOE_EBADLAYER, (uint32_t)sqe->layer, 0);
		return MOE_OK;
	case MOE_OP_LEASE:
		/* n_tokens expert ids in the ids area; arg: the wait for cold ones, in ms. */
		if (sqe->flags & ~MOE_LEASE_FLAGS_ALL)
			return sqe_fail(sqe, err, MOE_EBADFIELD, sqe->flags, 0);
		if (sqe->in_dtype || sqe->out_dtype || sqe->ids_per_token)
			return sqe_fail(sqe, err, MOE_EBADFIELD, 0, 0);
		if (sqe->n_tokens == 0 ||
		    (uint64_t)sqe->n_tokens > (uint64_t)lim->max_tokens * lim->top_k)
			return sqe_fail(sqe, err, MOE_EBADTOKENS, sqe->n_tokens, 0);
		if (sqe->layer < 0)
			return sqe_fail(sqe, err, MOE_EBADLAYER, (uint32_t)sqe->layer, 0);
		return MOE_OK;
	case MOE_OP_RELEASE:
		/* n_tokens lease ids in the ids area, or MOE_RELEASE_ALL and none. */
		if (sqe->flags & ~MOE_RELEASE_FLAGS_ALL)
			return sqe_fail(sqe, err, MOE_EBADFIELD, sqe->flags, 0);
		if (sqe->in_dtype || sqe->out_dtype || sqe->ids_per_token || sqe->layer || sqe->arg)
			return sqe_fail(sqe, err, MOE_EBADFIELD, 0, 0);
		if ((sqe->flags & MOE_RELEASE_ALL)
		        ? sqe->n_tokens != 0
		        : (sqe->n_tokens == 0 ||
		           (uint64_t)sqe->n_tokens > (uint64_t)lim->max_tokens * lim->top_k))
			return sqe_fail(sqe, err, MOE_EBADTOKENS, sqe->n_tokens, 0);
		return MOE_OK;
	}
	return sqe_fail(sqe, err, MOE_EBADOP, sqe->op, 0);
}

int moe_sqe_explain(const struct moe_sqe *sqe, const struct moe_limits *lim,
                    const struct moe_cqe *err, char *buf, size_t len)
{
	const char *op = moe_op_name(sqe->op);
	int n;
	switch (err->status) {
	case MOE_EBADSLOT:
		n = snprintf(buf, len, "slot %u out of range (0..%u)", sqe->slot, lim->n_slots - 1);
		break;
	case MOE_EBADOP:
		n = snprintf(buf, len, "op %u is not an operation this sidecar knows (1..%u)",
		             sqe->op, MOE_OP_MAX - 1);
		break;
	case MOE_ESLOTBUSY:
		n = snprintf(buf, len, "%s on slot %u while its previous request is in flight", op,
		             sqe->slot);
		break;
	case MOE_EBADTOKENS:
		n = snprintf(buf, len, "%s: n_tokens %u not in 1..%u", op, sqe->n_tokens,
		             sqe->op == MOE_OP_PREFETCH || sqe->op == MOE_OP_LEASE ||
		                     sqe->op == MOE_OP_RELEASE
		                 ? lim->max_tokens * lim->top_k
		                 : lim->max_tokens);
		break;
	case MOE_EBADTOPK:
		n = snprintf(buf, len, "%s: ids_per_token %u not in 1..%u (the channel's top_k)",
		             op, sqe->ids_per_token, lim->top_k);
		break;
	case MOE_EBADDTYPE:
		n = snprintf(buf, len,
		             "%s: %s dtype %u is not one this channel accepts (mask 0x%x)", op,
		             err->index ? "output" : "input", err->value, lim->dtype_mask);
		break;
	case MOE_EBADLAYER:
		n = snprintf(buf, len, "%s: layer %d is not %s of the served model", op, sqe->layer,
		             sqe->op == MOE_OP_MASK ? "-1 or a block" : "an MoE layer");
		break;
	case MOE_ENOMODEL:
		n = snprintf(buf, len, "%s needs a model; this sidecar was started without one",
		             op);
		break;
	case MOE_EBADFIELD: {
		const uint32_t n_res = sizeof(sqe->reserved) / sizeof(sqe->reserved[0]);
		bool reserved = false;
		for (uint32_t i = 0; i < n_res; i++)
			reserved |= sqe->reserved[i] != 0;
		if (reserved)
			n = snprintf(buf, len,
			             "%s: reserved word %u is 0x%x; reserved words must be 0", op,
			             err->index, err->value);
		else if (sqe->op == MOE_OP_FORWARD && sqe->arg > sqe->ids_per_token)
			n = snprintf(buf, len, "FORWARD: k_defer %u > ids_per_token %u", sqe->arg,
			             sqe->ids_per_token);
		else if ((sqe->op == MOE_OP_FORWARD && (sqe->flags & ~MOE_FWD_FLAGS_ALL)) ||
		         (sqe->op == MOE_OP_PREFETCH && (sqe->flags & ~MOE_PREFETCH_FLAGS_ALL)) ||
		         (sqe->op == MOE_OP_STATS && (sqe->flags & ~MOE_STATS_FLAGS_ALL)) ||
		         (sqe->op == MOE_OP_LEASE && (sqe->flags & ~MOE_LEASE_FLAGS_ALL)) ||
		         (sqe->op == MOE_OP_RELEASE && (sqe->flags & ~MOE_RELEASE_FLAGS_ALL)))
			n = snprintf(buf, len, "%s: flags 0x%x include unknown bits (known 0x%x)",
			             op, sqe->flags,
			             sqe->op == MOE_OP_FORWARD    ? MOE_FWD_FLAGS_ALL
			             : sqe->op == MOE_OP_PREFETCH ? MOE_PREFETCH_FLAGS_ALL
			             : sqe->op == MOE_OP_LEASE    ? MOE_LEASE_FLAGS_ALL
			             : sqe->op == MOE_OP_RELEASE  ? MOE_RELEASE_FLAGS_ALL
			                                          : MOE_STATS_FLAGS_ALL);
		else
			n = snprintf(buf, len, "%s: a field this op does not use is not zero", op);
		break;
	}
	case MOE_ESHUTDOWN: n = snprintf(buf, len, "%s: the sidecar is shutting down", op); break;
	default:
		n = snprintf(buf, len, "%s: %s (value %u, index %u)", op,
		             moe_status_str(err->status), err->value, err->index);
		break;
	}
	return n < 0 ? 0 : n;
}
