/* channel.c — memfd channels and the ring-draining core (see channel.h for the contract).
 *
 * The drain loop is the only code that reads what a client wrote into its submission ring.
 * Its rules: read the producer's tail once per call through moe_ring_ready (an impossible
 * value drops the client), copy each 64-byte submission into private memory behind a
 * compiler barrier so it is fetched exactly once, validate the copy, and never write outside
 * the private layout's areas.
 */
#include "channel.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

#define REQUIRED_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static void channel_init_shared(struct sidecar_channel *ch)
{
	struct moe_channel_header *h = (struct moe_channel_header *)ch->base;
	memset(h, 0, sizeof(*h));
	h->magic = MOE_CHANNEL_MAGIC;
	h->abi_major = MOE_ABI_MAJOR;
	h->abi_minor = MOE_ABI_MINOR;
	h->header_size = sizeof(*h);
	h->channel_bytes = ch->bytes;
	h->epoch = ch->epoch;
	h->limits = ch->limits;
	h->layout = ch->layout;
	atomic_store_explicit(&h->heartbeat_ns, 0, memory_order_relaxed);
	atomic_store_explicit(&h->state, MOE_CHANNEL_RUNNING, memory_order_relaxed);
	ch->header = h;

	const uint32_t start = moe_channel_ring_start(ch->epoch);
	struct moe_ring_ctrl *sq = (struct moe_ring_ctrl *)(ch->base + ch->layout.sq_ctrl);
	struct moe_ring_ctrl *cq = (struct moe_ring_ctrl *)(ch->base + ch->layout.cq_ctrl);
	moe_ring_ctrl_init(sq, start);
	moe_ring_ctrl_init(cq, start);
	moe_ring_cons_attach(&ch->sq, sq, ch->layout.ring_entries, start);
	moe_ring_prod_attach(&ch->cq, cq, ch->layout.ring_entries, start);
	/* Everything above is published to the client by the SCM_RIGHTS send that follows. */
	atomic_thread_fence(memory_order_release);
}

static struct sidecar_channel *channel_alloc(const struct moe_limits *granted,
                                             struct sidecar_error *err)
{
	char why[160];
	if (moe_limits_check(granted, why, sizeof(why)) != MOE_OK) {
		error_set(err, MOE_EINVAL, "channel limits: %s", why);
		return NULL;
	}
	struct sidecar_channel *ch = calloc(1, sizeof(*ch));
	if (!ch) {
		error_set(err, MOE_ENOMEM, "channel: out of memory");
		return NULL;
	}
	ch->memfd = -1;
	ch->limits = *granted;
	int rc = pthread_mutex_init(&ch->cq_lock, NULL);
	if (rc != 0) {
		error_set(err, error_status_from_errno(rc), "channel: CQ lock: %s", strerror(rc));
		free(ch);
		return NULL;
	}
	if (moe_layout_compute(granted, &ch->layout) != MOE_OK) {
		error_set(err, MOE_EINVAL, "channel: layout of valid limits failed");
		pthread_mutex_destroy(&ch->cq_lock);
		free(ch);
		return NULL;
	}
	ch->bytes = ch->layout.total;
	return ch;
}

int channel_create(const struct moe_limits *granted, struct sidecar_channel **out,
                   struct sidecar_error *err)
{
	*out = NULL;
	struct sidecar_channel *ch = channel_alloc(granted, err);
	if (!ch)
		return -1;
	if (getrandom(&ch->epoch, sizeof(ch->epoch), 0) != (ssize_t)sizeof(ch->epoch)) {
		error_set(err, MOE_ESYS, "channel epoch: getrandom: %s", strerror(errno));
		goto fail;
	}
	ch->memfd = memfd_create("moe-sidecar-channel", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (ch->memfd < 0) {
		error_set_errno(err, "channel: memfd_create");
		goto fail;
	}
	if (ftruncate(ch->memfd, (off_t)ch->bytes) != 0) {
		error_set_errno(err, "channel: ftruncate to %llu bytes",
		                (unsigned long long)ch->bytes);
		goto fail;
	}
	if (fcntl(ch->memfd, F_ADD_SEALS, REQUIRED_SEALS) != 0) {
		error_set_errno(err, "channel: F_ADD_SEALS");
		goto fail;
	}
	void *map = mmap(NULL, ch->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ch->memfd, 0);
	if (map == MAP_FAILED) {
		error_set_errno(err, "channel: mmap %llu bytes", (unsigned long long)ch->bytes);
		goto fail;
	}
	ch->base = map;
	ch->owns_map = true;
	channel_init_shared(ch);
	*out = ch;
	return 0;
fail:
	channel_destroy(ch);
	return -1;
}

int channel_attach_buffer(void *buf, uint64_t bytes, const struct moe_limits *granted,
                          uint64_t epoch, struct sidecar_channel **out, struct sidecar_error *err)
{
	*out = NULL;
	struct sidecar_channel *ch = channel_alloc(granted, err);
	if (!ch)
		return -1;
	if (bytes < ch->bytes) {
		error_set(err, MOE_EINVAL, "channel buffer: %llu bytes, layout needs %llu",
		          (unsigned long long)bytes, (unsigned long long)ch->bytes);
		pthread_mutex_destroy(&ch->cq_lock);
		free(ch);
		return -1;
	}
	ch->base = buf;
	ch->epoch = epoch;
	channel_init_shared(ch);
	*out = ch;
	return 0;
}

void channel_destroy(struct sidecar_channel *ch)
{
	if (!ch)
		return;
	if (ch->owns_map && ch->base)
		munmap(ch->base, ch->bytes);
	if (ch->memfd >= 0)
		close(ch->memfd);
	pthread_mutex_destroy(&ch->cq_lock);
	free(ch);
}

void channel_slot_areas(const struct sidecar_channel *ch, uint32_t slot, struct slot_areas *out)
{
	const struct moe_layout *l = &ch->layout;
	uint8_t *s = ch->base + l->slots + (uint64_t)slot * l->slot_stride;
	out->input = s + l->in_off;
	out->expert_ids = (int32_t *)(void *)(s + l->ids_off);
	out->expert_weights = (float *)(void *)(s + l->wts_off);
	out->output = s + l->out_off;
}

void channel_set_heartbeat(struct sidecar_channel *ch, uint64_t now_ns)
{
	atomic_store_explicit(&ch->header->heartbeat_ns, now_ns, memory_order_relaxed);
}

void channel_set_state(struct sidecar_channel *ch, enum moe_channel_state state)
{
	atomic_store_explicit(&ch->header->state, (uint32_t)state, memory_order_release);
}

void channel_wake_client(struct sidecar_channel *ch)
{
	atomic_thread_fence(memory_order_seq_cst);
	moe_futex_wake(&ch->cq.ctrl->tail, 1);
}

/* Copies one submission out of shared memory exactly once: the barrier stops the compiler
 * from re-reading the shared bytes in place of the private copy. */
static void sqe_fetch_once(struct moe_sqe *dst, const struct moe_sqe *shared)
{
	memcpy(dst, shared, sizeof(*dst));
	__asm__ __volatile__("" ::: "memory");
}

static void cqe_preset(struct moe_cqe *c, const struct moe_sqe *sqe)
{
	memset(c, 0, sizeof(*c));
	c->user_data = sqe->user_data;
	c->slot = sqe->slot;
}

/* The row of op in the channel's table, or NULL if the service has no such op. */
static const struct op_desc *channel_op(const struct sidecar_channel *ch, uint32_t op)
{
	if (!ch->ops || op == 0 || op >= MOE_OP_MAX || !ch->ops[op].name)
		return NULL;
	return &ch->ops[op];
}

/* Validates a private copy; MOE_OK (op set) or an error completion in *err. */
static int sqe_validate(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                        const struct op_desc **op, struct moe_cqe *err)
{
	if (moe_sqe_check(sqe, &ch->limits, err) != MOE_OK)
		return err->status;
	*op = channel_op(ch, sqe->op);
	cqe_preset(err, sqe);
	if (!*op) { /* moe_sqe_check knows every op below MOE_OP_MAX; defensive */
		err->status = MOE_EBADOP;
		err->value = sqe->op;
		return err->status;
	}
	if (!(*op)->execute) {
		err->status = (*op)->unsupported_status;
		err->value = sqe->op;
		return err->status;
	}
	if ((*op)->check && (*op)->check(ch, sqe, err) != MOE_OK)
		return err->status;
	if (ch->slot_busy[sqe->slot]) {
		cqe_preset(err, sqe);
		err->status = MOE_ESLOTBUSY;
		err->value = sqe->slot;
		return err->status;
	}
	return MOE_OK;
}

void channel_request_error(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                           struct moe_cqe *c, bool slot_is_this_requests, const char *fmt, ...)
{
	/* The executors see the channel const; the log budget is the one thing this changes in
	 * it, through atomics. */
	struct log_ratelimit *budget = (struct log_ratelimit *)&ch->error_log;
	char msg[MOE_MESSAGE_MAX];
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
	} else {
		moe_sqe_explain(sqe, &ch->limits, c, msg, sizeof(msg));
	}
	if (slot_is_this_requests && c->slot < ch->limits.n_slots && c->status != MOE_EBADSLOT &&
	    c->status != MOE_ESLOTBUSY) {
		struct slot_areas a;
		channel_slot_areas(ch, c->slot, &a);
		size_t n = strlen(msg) + 1;
		if (n > ch->layout.out_bytes)
			n = (size_t)ch->layout.out_bytes;
		memcpy(a.output, msg, n - 1);
		((char *)a.output)[n - 1] = '\0';
		c->flags |= MOE_CQE_MESSAGE;
	}
	if (c->status == MOE_ESHUTDOWN) {
		log_debug("channel", "client id=%u: %s", ch->id, msg);
		return;
	}
	uint32_t left_out;
	if (!log_ratelimit_allow(budget, monotonic_ns(), &left_out))
		return;
	char more[64] = "";
	if (left_out)
		snprintf(more, sizeof(more), " (%u more since the last line not logged)", left_out);
	/* An expert that could not be read is the sidecar's failure, not the client's mistake. */
	log_warn("channel", "client id=%u: %s: %s status=%s%s", ch->id,
	         c->status == MOE_EIO ? "request failed" : "bad request", msg,
	         moe_status_str(c->status), more);
}

static void cq_put(struct sidecar_channel *ch, struct moe_cqe *cqes, uint32_t n,
                   const struct moe_cqe *c)
{
	cqes[moe_ring_prod_pos(&ch->cq, n)] = *c;
}

/* Dispatcher thread: posts up to room finished asynchronous requests (slot order), frees
 * their slots. Returns how many were posted at the CQ's current producer position. */
static uint32_t post_async(struct sidecar_channel *ch, struct moe_cqe *cqes, uint32_t room)
{
	uint32_t posted = 0;
	for (uint32_t s = 0; s < ch->limits.n_slots && posted < room; s++) {
		if (!atomic_load_explicit(&ch->async_ready[s], memory_order_acquire))
			continue;
		struct moe_cqe c = ch->async_cqe[s];
		atomic_store_explicit(&ch->async_ready[s], 0, memory_order_relaxed);
		if (c.status != MOE_OK)
			ch->n_errors++;
		ch->slot_busy[s] = 0;
		cq_put(ch, cqes, posted++, &c);
	}
	atomic_fetch_sub_explicit(&ch->async_n_ready, posted, memory_order_relaxed);
	atomic_fetch_sub_explicit(&ch->async_in_flight, posted, memory_order_release);
	return posted;
}

void channel_complete_async(struct sidecar_channel *ch, const struct moe_cqe *c)
{
	uint32_t s = c->slot;
	pthread_mutex_lock(&ch->cq_lock);
	int64_t room = moe_ring_space(&ch->cq);
	if (room > 0) { /* broken: the dispatcher reports it; full: it posts later */
		struct moe_cqe *cqes = (struct moe_cqe *)(ch->base + ch->layout.cq_entries);
		if (c->status != MOE_OK)
			ch->n_errors++;
		atomic_store_explicit(&ch->slot_busy[s], 0, memory_order_relaxed);
		cq_put(ch, cqes, 0, c);
		moe_ring_publish(&ch->cq, 1);
		moe_ring_wake_consumer(&ch->cq);
		atomic_fetch_sub_explicit(&ch->async_in_flight, 1, memory_order_release);
		pthread_mutex_unlock(&ch->cq_lock);
		/* Posted: the dispatcher has nothing to do for it. It is not woken: a dispatcher
		 * spinning now would compete for a core with the client this completion just
		 * woke; the client's next submission wakes it through the SQ. (Shutdown waits
		 * for in-flight requests with a bounded sleep of its own.) */
		return;
	}
	pthread_mutex_unlock(&ch->cq_lock);
	ch->async_cqe[s] = *c;
	atomic_store_explicit(&ch->async_ready[s], 1, memory_order_release);
	atomic_fetch_add_explicit(&ch->async_n_ready, 1, memory_order_release);
	if (ch->wake_dispatcher)
		ch->wake_dispatcher(ch->wake_arg);
}

void channel_post_now(struct sidecar_channel *ch, const struct moe_cqe *c)
{
	struct moe_cqe *cqes = (struct moe_cqe *)(ch->base + ch->layout.cq_entries);
	if (c->status != MOE_OK)
		ch->n_errors++;
	/* The drain reserved room for every accepted request's completion, this one included. */
	atomic_store_explicit(&ch->slot_busy[c->slot], 0, memory_order_relaxed);
	cq_put(ch, cqes, ch->exec_unpublished, c);
	moe_ring_publish(&ch->cq, ch->exec_unpublished + 1);
	moe_ring_wake_consumer(&ch->cq);
	ch->exec_unpublished = 0;
}

static int drain_locked(struct sidecar_channel *ch, uint32_t budget, bool shutting_down)
{
	int64_t room = moe_ring_space(&ch->cq);
	if (room == MOE_RING_BROKEN) {
		snprintf(ch->violation, sizeof(ch->violation),
		         "CQ head %u is impossible (tail %u, %u entries)", ch->cq.cached_head,
		         ch->cq.tail, ch->cq.entries);
		return DRAIN_BROKEN;
	}
	int64_t ready = moe_ring_ready(&ch->sq);
	if (ready == MOE_RING_BROKEN) {
		snprintf(ch->violation, sizeof(ch->violation),
		         "SQ tail %u is impossible (head %u, %u entries)", ch->sq.cached_tail,
		         ch->sq.head, ch->sq.entries);
		return DRAIN_BROKEN;
	}
	uint32_t async_ready = atomic_load_explicit(&ch->async_n_ready, memory_order_acquire);
	if (ready == 0 && async_ready == 0)
		return 0;
	if (room == 0) {
		ch->cq_blocked = true;
		return 0;
	}
	ch->cq_blocked = false;
	struct moe_cqe *cqes = (struct moe_cqe *)(ch->base + ch->layout.cq_entries);
	uint32_t posted = async_ready ? post_async(ch, cqes, (uint32_t)room) : 0;
	room -= posted;
	uint32_t n = (uint32_t)(ready < room ? ready : room);
	if (n > budget)
		n = budget;
	if (n == 0) {
		moe_ring_publish(&ch->cq, posted);
		moe_ring_wake_consumer(&ch->cq);
		return (int)posted;
	}

	const struct moe_sqe *sqes = (const struct moe_sqe *)(ch->base + ch->layout.sq_entries);

	/* Accept phase: copy, validate, claim slots. Errors complete at once. */
	struct moe_sqe accepted[2 * MOE_MAX_SLOTS_LIMIT];
	uint32_t n_accepted = 0;
	const uint32_t posted_async = posted;
	for (uint32_t i = 0; i < n; i++) {
		struct moe_sqe sqe;
		struct moe_cqe c;
		const struct op_desc *op = NULL;
		sqe_fetch_once(&sqe, &sqes[moe_ring_cons_pos(&ch->sq, i)]);
		ch->n_requests++;
		if (sqe_validate(ch, &sqe, &op, &c) != MOE_OK) {
			ch->n_errors++;
			/* The output area is this request's only if no other holds the slot. */
			channel_request_error(ch, &sqe, &c,
			                      c.slot < ch->limits.n_slots && !ch->slot_busy[c.slot],
			                      NULL);
			cq_put(ch, cqes, posted++, &c);
			continue;
		}
		ch->slot_busy[sqe.slot] = 1;
		accepted[n_accepted++] = sqe;
	}
	moe_ring_consume(&ch->sq, n);

	/* Execute phase: requests only ever touch their own slot's areas. */
	for (uint32_t i = 0; i < n_accepted; i++) {
		const struct moe_sqe *sqe = &accepted[i];
		struct moe_cqe c;
		cqe_preset(&c, sqe);
		if (shutting_down) {
			c.status = MOE_ESHUTDOWN;
			channel_request_error(ch, sqe, &c, true, NULL);
			ch->n_errors++;
		} else {
			atomic_fetch_add_explicit(&ch->async_in_flight, 1, memory_order_relaxed);
			ch->exec_last_of_batch = i + 1 == n_accepted;
			ch->exec_unpublished = posted;
			channel_op(ch, sqe->op)->execute(ch, sqe, &c);
			posted =
			    ch->exec_unpublished; /* 0 if the op published (channel_post_now) */
			if (c.status == OP_PENDING)
				continue; /* the slot stays busy until channel_complete_async */
			atomic_fetch_sub_explicit(&ch->async_in_flight, 1, memory_order_relaxed);
			if (c.status == OP_POSTED)
				continue;
			if (c.status != MOE_OK)
				ch->n_errors++;
		}
		ch->slot_busy[sqe->slot] = 0;
		cq_put(ch, cqes, posted++, &c);
	}
	if (posted) { /* nothing new (all pending, or posted early): no wake-up for nothing */
		moe_ring_publish(&ch->cq, posted);
		moe_ring_wake_consumer(&ch->cq);
	}
	return (int)(n + posted_async);
}

int channel_drain(struct sidecar_channel *ch, uint32_t budget, bool shutting_down)
{
	pthread_mutex_lock(&ch->cq_lock);
	int r = drain_locked(ch, budget, shutting_down);
	pthread_mutex_unlock(&ch->cq_lock);
	return r;
}

bool channel_has_work(struct sidecar_channel *ch)
{
	int64_t ready = moe_ring_ready(&ch->sq);
	if (ready == MOE_RING_BROKEN)
		return true;
	if (ready == 0 && atomic_load_explicit(&ch->async_n_ready, memory_order_acquire) == 0)
		return false;
	pthread_mutex_lock(&ch->cq_lock);
	bool room = moe_ring_space(&ch->cq) != 0; /* room, or broken (to be reported) */
	pthread_mutex_unlock(&ch->cq_lock);
	return room;
}
