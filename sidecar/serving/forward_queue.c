/* forward_queue.c — FORWARD on the forward thread; PREFETCH, STATS, MASK on the dispatcher
 * (see forward_queue.h for the contract).
 *
 * Who runs a FORWARD: the dispatcher itself, inline, when it can finish without waiting —
 * nothing queued or running, every expert it names resident now, at most INLINE_MAX_TOKENS
 * tokens, and it is the last submission of its drained batch (nothing behind it waits for
 * its compute). That is a decode step at full budget, and it saves the hand-off to another
 * thread, a futex wake-up on the critical path of every layer (dear on a VM whose idle vCPUs
 * halt; the dispatcher is awake anyway, having just taken the request). Everything else — a request
 * that must wait for NVMe, a prefill, one arriving while another runs — goes to the forward
 * thread, so the dispatcher stays responsive to other clients while loads are in flight.
 * `executing` (under lock) makes the two mutually exclusive, so requests still run one at a
 * time, and per channel in submission order.
 *
 * Deferred state, per channel, touched by whichever thread executes the channel's FORWARD
 * (never two at once: `executing`; o->lock orders their accesses): `owed` says whether the
 * previous FORWARD deferred experts; their sum lives in deferred[owed_buf]. The next FORWARD
 * must be the next MoE layer with the same n_tokens: it reads deferred[owed_buf] as the
 * engine's deferred_in and writes its own deferred sum into the other buffer, so the two
 * never alias. A failed request leaves the state as it was (the client may retry or abort
 * with MOE_FWD_DROP_DEFERRED).
 *
 * Ordering: FORWARDs of one channel run in submission order (a FIFO per channel), which is
 * what makes "deferred(L) arrives in L+1" well defined even when the client pipelines them.
 *
 * Early completion: a FORWARD that defers posts its completion from inside the engine as soon
 * as the immediate part is final (forward_request.immediate_ready) — through the drain when
 * inline (channel_post_now), channel_complete_async on the forward thread — and its executor
 * then computes the deferred experts while the client runs on. When they are all resident
 * the executor returns while they still compute on the pool's other workers
 * (forward_request.settle_later): the engine plans the next FORWARD meanwhile and finishes
 * them, writing deferred[target], before that FORWARD's first wave — so the next FORWARD
 * still merges a complete sum; a channel going away settles first (forward_settle). A
 * deferred expert failing after the completion leaves a lost contribution (owed_fail_*).
 * Lock order stays cq_lock → o->lock: the engine holds no lock while it runs the callback,
 * and an inline FORWARD (under the dispatcher's cq_lock) only starts when the forward thread
 * is idle, so the forward thread never posts while the dispatcher waits for the engine.
 */
#include "forward_queue.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "forward.h"
#include "log.h"
#include "moe_kernels.h"
#include "ops.h"
#include "routing.h"
#include "spin_wait.h"
#include "trace_recorder.h"

struct model_channel {
	struct forward_queue *fq; /* the queue serving it */
	struct sidecar_channel *ch;
	uint32_t client;
	bool batch_invariant; /* its FORWARDs (asked in the hello, or --batch-invariant) */
	/* Accepted FORWARDs not started yet, and MASKs behind them (each holds its own slot:
	 * at most n_slots). Under forward_queue.lock. */
	struct moe_sqe queue[MOE_MAX_SLOTS_LIMIT];
	uint32_t q_head, q_len;
	bool listed;  /* in the round-robin list */
	bool running; /* the forward thread is executing one of its requests */
	bool closing;
	struct model_channel *rr_next;
	/* Forward thread only. */
	float *deferred[2]; /* max_tokens x hidden f32 each */
	uint64_t mem_bytes; /* accounted: the channel's bytes and the deferred buffers */
	bool owed;
	uint32_t owed_buf, owed_tokens;
	int32_t owed_layer;
	/* The owed contribution was lost after its FORWARD had completed (a deferred expert's
	 * read failed): every FORWARD that would merge it fails with owed_fail_status, value =
	 * the expert, index = the layer that deferred it, until MOE_FWD_DROP_DEFERRED. */
	int owed_fail_status;
	uint32_t owed_fail_expert;
	int32_t owed_fail_layer;
	/* Its expert leases (forward.h), created by its first LEASE; used by one thread at a time
	 * (LEASE and RELEASE run like a MASK: inline when nothing of the channel's is queued or
	 * running, else behind it on the forward thread), freed — every lease released — at
	 * close. The ids staged from the shared ids area. */
	struct forward_leases *leases;
	int32_t lease_ids[256];
	/* The channel's staging area (the BF16 form): a sealed memfd mapped here writable, the
	 * client read-only; -1 / NULL without one. */
	int staging_fd;
	uint8_t *staging;
};

struct forward_queue {
	struct channel_service service; /* what the server sees of it (ctx: this queue) */
	struct serve_model *model;
	struct forward_engine *engine; /* the model's (serve_model_engine) */
	const struct serve_model_desc *desc;
	pthread_t thread;
	bool thread_started;
	pthread_mutex_t lock;
	pthread_cond_t work, idle;
	bool stop, shutting_down;
	bool executing;           /* a FORWARD runs (forward thread or inline); under lock */
	uint64_t forwards_inline; /* run on the dispatcher (STATS); dispatcher thread only */
	struct model_channel *rr_head, *rr_tail;
	_Atomic uint32_t queued; /* FORWARDs in all queues, for the forward thread's spin */
	uint64_t client_ids;     /* bit c set: client id c in use */
	uint32_t n_clients;
	uint32_t n_invariant; /* of them batch-invariant (STATS); under lock */
	bool batch_invariant; /* --batch-invariant: every channel */
	/* Memory (forward_queue.h): the limit (0: none), what the process holds without channels
	 * (the model's, plus these buffers), and the channels' accounted bytes (control thread
	 * writes under lock; STATS reads). */
	uint64_t mem_limit, mem_fixed;
	_Atomic uint64_t mem_channels;

	/* The executing thread's private copies of one request, sized for the engine's limits. */
	uint8_t *x;
	int32_t *ids;
	float *weights;
	float *out_immediate;
	/* Dispatcher's private buffers. */
	int32_t *hint_ids;
	float *hint_scores;
	uint32_t *hint_started; /* [hint_cap] the experts a PREFETCH started (--record-trace) */
	uint32_t hint_cap;
	uint8_t *mask;
	size_t mask_bytes; /* the whole model's mask */
	char *stats;
	size_t stats_cap;
	/* The STATS figures (dispatcher only: STATS and the tick), and the board the metrics
	 * thread reads them from (published when it asks). */
	struct stats_doc doc;
	struct stats_board *board;
	/* The forward thread's copy of a queued MASK's bits. */
	uint8_t *queued_mask;
	/* What the engine routes to the CPU side (routing.h), written by the executing thread;
	 * the recorder (NULL: not recording). MoE layer index <-> block. */
	struct routing *routing;
	struct trace_recorder *recorder;
	uint32_t *moe_of_block; /* [n_layers]: MoE index, UINT32_MAX for a dense block */
	uint32_t *block_of_moe; /* [n_moe_layers] */
	/* Leases: the shared pool (lease_fd -1: none, lease_why says why), and the figures
	 * (stats_table.h) — counted by whichever thread runs a LEASE/RELEASE. */
	int lease_fd; /* pool 0's; lease_fds[0, lease_pools): one per node part */
	int lease_fds[FORWARD_MAX_NODES];
	uint64_t lease_bytes[FORWARD_MAX_NODES];
	uint32_t lease_pools;
	uint64_t lease_pool_bytes;    /* every pool's together */
	uint64_t lease_staging_bytes; /* per channel (forward_queue_config); 0: no BF16 form */
	char lease_why[160];
	_Atomic uint64_t leases_taken, leases_cold, leases_released, leases_refused,
	    lease_bytes_taken, leases_held, lease_bytes_held;
};

#define LEASE_MAX_PER_CHANNEL 4096u
_Static_assert(FORWARD_MAX_NODES <= MOE_LEASE_MAX_POOLS, "a welcome carries every node's pool");
#define LEASE_WAIT_MS_DEFAULT 10000u

/* Is block `layer` a MoE layer this queue serves (the table built at create)? */
static bool is_moe_block(const struct forward_queue *o, int32_t layer)
{
	return layer >= 0 && (uint32_t)layer < o->desc->n_layers &&
	       o->moe_of_block[layer] != UINT32_MAX;
}

static size_t mask_layer_bytes(const struct serve_model_desc *d)
{
	return (d->n_experts + 7u) / 8u;
}

/* ---- Channels ---------------------------------------------------------------------------- */

/* Whether a channel of `bytes` fits in what the memory limit leaves; else a refusal
 * sentence (it goes into the welcome: at most MOE_REASON_LEN). Under o->lock. */
static bool channel_fits(const struct forward_queue *o, uint64_t bytes, uint64_t deferred,
                         struct sidecar_error *err)
{
	const uint64_t used =
	    o->mem_fixed + atomic_load_explicit(&o->mem_channels, memory_order_relaxed);
	if (!o->mem_limit || used + bytes <= o->mem_limit)
		return true;
	const uint64_t mib = 1u << 20;
	error_set(err, MOE_EREFUSED,
	          "channel needs %llu MiB (%llu MiB deferred state); %llu of %llu MiB left under "
	          "the memory limit (%s): ask for fewer slots or tokens",
	          (unsigned long long)((bytes + mib - 1) / mib),
	          (unsigned long long)((deferred + mib - 1) / mib),
	          (unsigned long long)(used < o->mem_limit ? (o->mem_limit - used) / mib : 0),
	          (unsigned long long)(o->mem_limit / mib), o->desc->mem_limit_from);
	return false;
}

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* A channel's staging area: a memfd of `bytes` mapped here writable and sealed so that no
 * later mapping (the client's) can write. 0, or -1 with err. */
static int staging_create(uint64_t bytes, int *fd, uint8_t **map, struct sidecar_error *err)
{
	*fd = memfd_create("moe-lease-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *p = MAP_FAILED;
	if (*fd >= 0 && ftruncate(*fd, (off_t)bytes) == 0)
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (p != MAP_FAILED &&
	    fcntl(*fd, F_ADD_SEALS,
	          F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
		munmap(p, bytes);
		p = MAP_FAILED;
	}
	if (p == MAP_FAILED) {
		const int e = errno;
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		return error_set(err, MOE_ENOMEM, "the lease staging area (%llu bytes): %s",
		                 (unsigned long long)bytes, strerror(e));
	}
	*map = p;
	return 0;
}

static void staging_destroy(const struct forward_queue *o, struct model_channel *mc)
{
	if (mc->staging)
		munmap(mc->staging, o->lease_staging_bytes);
	if (mc->staging_fd >= 0)
		close(mc->staging_fd);
	mc->staging = NULL;
	mc->staging_fd = -1;
}

static int queue_channel_open(void *ctx, struct sidecar_channel *ch, struct sidecar_error *err)
{
	struct forward_queue *o = ctx;
	struct model_channel *mc = NULL;
	size_t n = (size_t)ch->limits.max_tokens * o->desc->hidden;
	const uint64_t cost = ch->bytes + 2 * n * sizeof(float);
	pthread_mutex_lock(&o->lock);
	const bool fits = channel_fits(o, cost, 2 * n * sizeof(float), err);
	pthread_mutex_unlock(&o->lock);
	if (!fits)
		return -1;
	mc = calloc(1, sizeof(*mc));
	if (mc) {
		mc->deferred[0] = calloc(n, sizeof(float));
		mc->deferred[1] = calloc(n, sizeof(float));
	}
	if (!mc || !mc->deferred[0] || !mc->deferred[1]) {
		error_set(err, MOE_ENOMEM, "out of memory for %zu bytes of deferred state",
		          2 * n * sizeof(float));
		goto fail;
	}
	mc->fq = o;
	mc->ch = ch;
	mc->staging_fd = -1;
	if (o->lease_fd >= 0 && o->lease_staging_bytes &&
	    staging_create(o->lease_staging_bytes, &mc->staging_fd, &mc->staging, err) != 0)
		goto fail;
	mc->batch_invariant =
	    o->batch_invariant || (ch->hello_flags & MOE_HELLO_BATCH_INVARIANT) != 0;
	ch->welcome_flags = mc->batch_invariant ? MOE_WELCOME_BATCH_INVARIANT : 0;
	pthread_mutex_lock(&o->lock);
	if (o->client_ids == UINT64_MAX) {
		pthread_mutex_unlock(&o->lock);
		error_set(err, MOE_EREFUSED, "this sidecar already serves %u model clients",
		          SERVE_MODEL_MAX_CLIENTS);
		goto fail;
	}
	mc->client = (uint32_t)__builtin_ctzll(~o->client_ids);
	o->client_ids |= UINT64_C(1) << mc->client;
	o->n_clients++;
	o->n_invariant += mc->batch_invariant;
	mc->mem_bytes = cost;
	atomic_fetch_add_explicit(&o->mem_channels, cost, memory_order_relaxed);
	pthread_mutex_unlock(&o->lock);
	forward_client_attach(o->engine, mc->client);
	ch->state = mc;
	return 0;
fail:
	if (mc) {
		free(mc->deferred[0]);
		free(mc->deferred[1]);
		staging_destroy(o, mc);
	}
	free(mc);
	return -1;
}

static void rr_unlink_locked(struct forward_queue *o, struct model_channel *mc)
{
	struct model_channel **p = &o->rr_head, *prev = NULL;
	while (*p && *p != mc) {
		prev = *p;
		p = &(*p)->rr_next;
	}
	if (!*p)
		return;
	*p = mc->rr_next;
	if (o->rr_tail == mc)
		o->rr_tail = prev;
	mc->rr_next = NULL;
	mc->listed = false;
}

static void rr_append_locked(struct forward_queue *o, struct model_channel *mc)
{
	mc->rr_next = NULL;
	if (o->rr_tail)
		o->rr_tail->rr_next = mc;
	else
		o->rr_head = mc;
	o->rr_tail = mc;
	mc->listed = true;
}

/* Called with o->lock held, which it releases: sqe joins the channel's queue, behind what it
 * holds, for the forward thread (woken), and the dispatcher is told the answer comes later. */
static void enqueue_and_unlock(struct forward_queue *o, struct model_channel *mc,
                               const struct moe_sqe *sqe, struct moe_cqe *done)
{
	mc->queue[(mc->q_head + mc->q_len) % MOE_MAX_SLOTS_LIMIT] = *sqe;
	mc->q_len++;
	atomic_fetch_add_explicit(&o->queued, 1, memory_order_release);
	if (!mc->listed)
		rr_append_locked(o, mc);
	pthread_cond_signal(&o->work);
	pthread_mutex_unlock(&o->lock);
	done->status = OP_PENDING;
}

static void queue_channel_close(void *ctx, struct sidecar_channel *ch)
{
	struct forward_queue *o = ctx;
	struct model_channel *mc = ch->state;
	if (!mc)
		return;
	pthread_mutex_lock(&o->lock);
	mc->closing = true;
	if (mc->listed)
		rr_unlink_locked(o, mc);
	if (mc->q_len)
		log_info("model", "client id=%u gone: dropping %u queued FORWARDs", ch->id,
		         mc->q_len);
	atomic_fetch_sub_explicit(&o->queued, mc->q_len, memory_order_relaxed);
	mc->q_len = 0;
	while (mc->running)
		pthread_cond_wait(&o->idle, &o->lock);
	if (mc->leases) {
		uint32_t n;
		uint64_t bytes;
		forward_leases_held(mc->leases, &n, &bytes);
		if (n)
			log_info("model", "client id=%u gone: releasing %u leases (%llu bytes)",
			         ch->id, n, (unsigned long long)bytes);
		forward_leases_destroy(mc->leases);
		mc->leases = NULL;
		atomic_fetch_add_explicit(&o->leases_released, n, memory_order_relaxed);
		atomic_fetch_sub_explicit(&o->leases_held, n, memory_order_relaxed);
		atomic_fetch_sub_explicit(&o->lease_bytes_held, bytes, memory_order_relaxed);
	}
	o->client_ids &= ~(UINT64_C(1) << mc->client);
	o->n_clients--;
	o->n_invariant -= mc->batch_invariant;
	atomic_fetch_sub_explicit(&o->mem_channels, mc->mem_bytes, memory_order_relaxed);
	pthread_mutex_unlock(&o->lock);
	forward_client_detach(o->engine, mc->client);
	forward_settle(o->engine); /* a deferred sum may still be on its way into mc->deferred */
	ch->state = NULL;
	free(mc->deferred[0]);
	free(mc->deferred[1]);
	staging_destroy(o, mc);
	free(mc);
}

/* ---- FORWARD on the forward thread ------------------------------------------------------- */

static void forward_fail(struct moe_cqe *c, int status, uint32_t value, uint32_t index)
{
	c->status = status;
	c->value = value;
	c->index = index;
}

/* The early delivery of one FORWARD: its output written, its completion posted before the
 * deferred experts are computed (forward_request.immediate_ready). */
struct early_delivery {
	struct model_channel *mc;
	const struct moe_sqe *sqe;
	const struct slot_areas *areas;
	const float *out_immediate;
	size_t elements;    /* n_tokens x hidden */
	bool on_dispatcher; /* inline: post through the drain (channel_post_now) */
	bool posted;
};

static void deliver_immediate(void *arg, const struct forward_result *res)
{
	struct early_delivery *d = arg;
	const uint32_t n_deferred = res->n_deferred;
	const struct moe_sqe *sqe = d->sqe;
	moek_convert(sqe->out_dtype, d->areas->output, MOEK_ACT_F32, d->out_immediate, d->elements);
	const struct moe_cqe c = {
	    .user_data = sqe->user_data, .slot = sqe->slot, .status = MOE_OK, .value = n_deferred};
	if (d->on_dispatcher)
		channel_post_now(d->mc->ch, &c);
	else
		channel_complete_async(d->mc->ch, &c);
	d->posted = true;
}

/* Runs one FORWARD of mc and fills its completion *cq, or posts it itself as soon as the
 * immediate part is ready and sets cq->status = OP_POSTED (the deferred experts are computed
 * after; the channel's next FORWARD cannot start before, since this thread is its executor).
 * on_dispatcher: running inline inside the dispatcher's drain. No lock held; mc stays alive
 * (running is set) and this thread is the executor (executing is set). */
static void run_forward(struct forward_queue *o, struct model_channel *mc,
                        const struct moe_sqe *sqe, struct moe_cqe *cq, bool on_dispatcher)
{
	struct sidecar_channel *ch = mc->ch;
	const struct serve_model_desc *d = o->desc;
	struct moe_cqe c;
	memset(&c, 0, sizeof(c));
	c.user_data = sqe->user_data;
	c.slot = sqe->slot;

	const float *deferred_in = NULL;
	if (sqe->flags & MOE_FWD_DROP_DEFERRED) {
		mc->owed = false; /* the client aborted the batch the contribution belonged to */
		mc->owed_fail_status = MOE_OK;
	}
	if (mc->owed) {
		if (sqe->layer != mc->owed_layer || sqe->n_tokens != mc->owed_tokens) {
			forward_fail(&c, MOE_EDEFERRED, (uint32_t)mc->owed_layer, mc->owed_tokens);
			channel_request_error(
			    ch, sqe, &c, true,
			    "layer %d, %u tokens: the previous FORWARD deferred "
			    "experts owed to layer %d with %u tokens (send that, or "
			    "MOE_FWD_DROP_DEFERRED)",
			    sqe->layer, sqe->n_tokens, mc->owed_layer, mc->owed_tokens);
			goto done;
		}
		if (mc->owed_fail_status != MOE_OK) {
			forward_fail(&c, mc->owed_fail_status, mc->owed_fail_expert,
			             (uint32_t)mc->owed_fail_layer);
			channel_request_error(
			    ch, sqe, &c, true,
			    "layer %d: the deferred experts of layer %d failed after "
			    "it completed (%s); resend with MOE_FWD_DROP_DEFERRED",
			    sqe->layer, mc->owed_fail_layer, moe_status_str(mc->owed_fail_status));
			goto done;
		}
		deferred_in = mc->deferred[mc->owed_buf];
	}
	const uint32_t target = 1u - mc->owed_buf;

	/* Private copies: the engine validates values (ids, weights, NaN/Inf) on these, never
	 * on shared memory the client can still change. */
	struct slot_areas a;
	channel_slot_areas(ch, sqe->slot, &a);
	const size_t rows = (size_t)sqe->n_tokens * d->hidden;
	const size_t n_ids = (size_t)sqe->n_tokens * sqe->ids_per_token;
	memcpy(o->x, a.input, rows * moe_dtype_size(sqe->in_dtype));
	memcpy(o->ids, a.expert_ids, n_ids * sizeof(int32_t));
	memcpy(o->weights, a.expert_weights, n_ids * sizeof(float));
	__asm__ __volatile__("" ::: "memory");

	struct forward_request req = {
	    .client = mc->client,
	    .layer = sqe->layer,
	    .n_tokens = sqe->n_tokens,
	    .k = sqe->ids_per_token,
	    .k_defer = sqe->arg,
	    .x = o->x,
	    .x_dtype = sqe->in_dtype,
	    .ids = o->ids,
	    .weights = o->weights,
	    .deferred_in = deferred_in,
	    .defer_cold = (sqe->flags & MOE_FWD_DEFER_COLD) != 0,
	    .defer_union = (sqe->flags & MOE_FWD_DEFER_UNION) != 0,
	    .batch_invariant = mc->batch_invariant,
	};
	struct early_delivery early = {.mc = mc,
	                               .sqe = sqe,
	                               .areas = &a,
	                               .out_immediate = o->out_immediate,
	                               .elements = rows,
	                               .on_dispatcher = on_dispatcher};
	if (sqe->arg) { /* something may be deferred: deliver the rest before computing it, and
		         * let the engine return while the deferred experts compute */
		req.immediate_ready = deliver_immediate;
		req.immediate_arg = &early;
		req.settle_later = true;
	}
	struct forward_result res;
	forward_run(o->engine, &req, o->out_immediate, sqe->arg ? mc->deferred[target] : NULL,
	            &res);
	const int rc = res.status;
	if (rc == MOE_OK || early.posted) { /* validated: this is the routing served */
		const uint32_t l = o->moe_of_block[sqe->layer];
		routing_add(o->routing, l, sqe->n_tokens, sqe->ids_per_token, o->ids);
		if (o->recorder) /* --record-trace */
			trace_recorder_add(o->recorder, l, sqe->n_tokens, sqe->ids_per_token,
			                   o->ids, o->weights);
	}
	if (rc != MOE_OK && early.posted) {
		/* Completed already: the deferred part is what failed. The next FORWARD owes it. */
		log_warn("model",
		         "client id=%u FORWARD layer %d: its deferred experts failed after it "
		         "completed: %s; the next FORWARD fails until the client drops the "
		         "deferred part",
		         ch->id, sqe->layer, res.message);
		mc->owed = true;
		mc->owed_buf = target;
		mc->owed_layer = serve_model_next_moe_layer(o->model, sqe->layer);
		mc->owed_tokens = sqe->n_tokens;
		mc->owed_fail_status = rc;
		mc->owed_fail_expert = res.bad_expert >= 0 ? (uint32_t)res.bad_expert : 0;
		mc->owed_fail_layer = sqe->layer;
		c.status = OP_POSTED;
		goto done;
	}
	if (rc != MOE_OK) {
		uint32_t where = res.bad_token >= 0
		                     ? (uint32_t)res.bad_token * sqe->ids_per_token +
		                           (uint32_t)(res.bad_index >= 0 ? res.bad_index : 0)
		                     : 0;
		/* The offending value as it was: a negative expert id stays negative. */
		uint32_t value =
		    res.bad_token >= 0 || res.bad_expert >= 0 ? (uint32_t)res.bad_expert : 0;
		if (rc == MOE_EBADLAYER)
			value = (uint32_t)sqe->layer;
		else if (rc == MOE_ENONFINITE && res.bad_token >= 0)
			where = (uint32_t)res.bad_token;
		forward_fail(&c, rc, value, where);
		channel_request_error(ch, sqe, &c, true, "FORWARD layer %d: %s", sqe->layer,
		                      res.message);
		goto done;
	}
	if (!early.posted)
		moek_convert(sqe->out_dtype, a.output, MOEK_ACT_F32, o->out_immediate, rows);
	if (res.n_deferred) {
		mc->owed = true;
		mc->owed_buf = target;
		mc->owed_layer = serve_model_next_moe_layer(o->model, sqe->layer);
		mc->owed_tokens = sqe->n_tokens;
	} else {
		mc->owed = false;
	}
	c.status = early.posted ? OP_POSTED : MOE_OK;
	c.value = res.n_deferred;
done:
	*cq = c;
}

/* A FORWARD the dispatcher may run inline (see the top of the file): more tokens than this
 * go to the forward thread even when resident. */
#define INLINE_MAX_TOKENS 16u

/* The forward thread polls for the next FORWARD (spin_until, polling) up to SPIN_WAIT_BOUND_NS
 * before sleeping: in a decode loop the next layer's request follows the completion within a
 * client round trip. */
static bool forward_queued(void *arg)
{
	const struct forward_queue *o = arg;
	return atomic_load_explicit(&o->queued, memory_order_acquire) != 0;
}

/* Sets mc's client mask from the slot's input (n bytes checked by model_op_mask) through the
 * private buffer `bits`, and fills *done. Runs on the dispatcher when nothing of mc's is
 * queued or running, else on the forward thread in mc's submission order (model_op_mask). */
static void run_mask(struct forward_queue *o, struct model_channel *mc, const struct moe_sqe *sqe,
                     uint8_t *bits, struct moe_cqe *done)
{
	const struct sidecar_channel *ch = mc->ch;
	const size_t n = sqe->layer < 0 ? o->mask_bytes : mask_layer_bytes(o->desc);
	struct slot_areas a;
	channel_slot_areas(ch, sqe->slot, &a);
	memcpy(bits, a.input, n);
	__asm__ __volatile__("" ::: "memory");
	int rc = forward_set_mask(o->engine, mc->client, sqe->layer, bits, n);
	done->status = rc < 0 ? rc : MOE_OK;
	done->value = rc < 0 ? (uint32_t)sqe->layer : (uint32_t)n;
	if (rc < 0)
		channel_request_error(ch, sqe, done, true, "MASK layer %d: %s", sqe->layer,
		                      moe_status_str(rc));
}

/* ---- Expert leases (forward.h), LEASE and RELEASE ----------------------------------------- */

/* Counts what a table's change did to the held figures. */
static void lease_held_delta(struct forward_queue *o, uint32_t n0, uint64_t b0, uint32_t n1,
                             uint64_t b1)
{
	atomic_fetch_add_explicit(&o->leases_held, (uint64_t)n1 - n0, memory_order_relaxed);
	atomic_fetch_add_explicit(&o->lease_bytes_held, b1 - b0, memory_order_relaxed);
}

/* LEASE or RELEASE of mc, by the one thread that runs mc's requests now. */
/* done->status of a LEASE tried on the dispatcher (now_only) that would have to wait for a
 * load (an expert evicted since it looked resident): nothing was taken nor counted, and the
 * request goes to the forward thread. Positive: never a wire status. */
#define LEASE_LATER 3

/* LEASE or RELEASE of mc. now_only: a LEASE does not wait for loads (LEASE_LATER instead). */
static void run_lease_op(struct forward_queue *o, struct model_channel *mc,
                         const struct moe_sqe *sqe, struct moe_cqe *done, bool now_only)
{
	const struct sidecar_channel *ch = mc->ch;
	struct slot_areas a;
	channel_slot_areas(ch, sqe->slot, &a);
	const uint32_t n = sqe->n_tokens;
	char why[384];
	if (!mc->leases &&
	    forward_leases_create(o->engine, LEASE_MAX_PER_CHANNEL, o->lease_pool_bytes / 2,
	                          mc->staging, mc->staging ? o->lease_staging_bytes : 0,
	                          &mc->leases) != 0) {
		done->status = MOE_ENOMEM;
		channel_request_error(ch, sqe, done, true, "%s: out of memory for the lease table",
		                      moe_op_name(sqe->op));
		return;
	}
	uint32_t n0, n1;
	uint64_t b0, b1;
	forward_leases_held(mc->leases, &n0, &b0);
	if (sqe->op == MOE_OP_RELEASE) {
		if (sqe->flags & MOE_RELEASE_ALL) {
			done->value = forward_leases_release_all(mc->leases);
			done->status = MOE_OK;
		} else {
			memcpy(mc->lease_ids, a.expert_ids, n * sizeof(int32_t));
			__asm__ __volatile__("" ::: "memory");
			done->status = MOE_OK;
			uint32_t i = 0;
			for (; i < n; i++)
				if (forward_lease_release(mc->leases, (uint32_t)mc->lease_ids[i]) !=
				    MOE_OK)
					break;
			done->value = i;
			if (i < n) {
				done->status = MOE_EBADLEASE;
				done->index = i;
				channel_request_error(
				    ch, sqe, done, true,
				    "RELEASE: lease %u (entry %u) is not held by this "
				    "channel (never leased, or released already); "
				    "the %u before it were released",
				    (uint32_t)mc->lease_ids[i], i, i);
			}
		}
		forward_leases_held(mc->leases, &n1, &b1);
		lease_held_delta(o, n0, b0, n1, b1);
		atomic_fetch_add_explicit(&o->leases_released, n0 - n1, memory_order_relaxed);
		return;
	}
	memcpy(mc->lease_ids, a.expert_ids, n * sizeof(int32_t));
	__asm__ __volatile__("" ::: "memory");
	const uint64_t wait_ms = sqe->arg ? sqe->arg : LEASE_WAIT_MS_DEFAULT;
	struct forward_lease_result res;
	const int rc = forward_lease_take(mc->leases, sqe->layer, mc->lease_ids, n,
	                                  (sqe->flags & MOE_LEASE_BF16) != 0, ch->hello_minor,
	                                  now_only ? 0 : monotonic_ns() + wait_ms * 1000000u,
	                                  a.output, ch->layout.out_bytes, &res, why, sizeof(why));
	forward_leases_held(mc->leases, &n1, &b1);
	lease_held_delta(o, n0, b0, n1, b1);
	if (rc == MOE_ETIMEDOUT && now_only) {
		done->status = LEASE_LATER;
		return;
	}
	if (rc != MOE_OK) {
		atomic_fetch_add_explicit(&o->leases_refused, 1, memory_order_relaxed);
		done->status = rc;
		done->value = (uint32_t)mc->lease_ids[res.bad < n ? res.bad : 0];
		done->index = res.bad;
		channel_request_error(ch, sqe, done, true, "%s", why);
		return;
	}
	atomic_fetch_add_explicit(&o->leases_taken, n, memory_order_relaxed);
	atomic_fetch_add_explicit(&o->leases_cold, res.cold, memory_order_relaxed);
	atomic_fetch_add_explicit(&o->lease_bytes_taken, res.bytes, memory_order_relaxed);
	done->status = MOE_OK;
	done->value = n;
	done->index = res.slices; /* ABI 1.4: slice descriptions after the n experts */
}

/* LEASE and RELEASE on the dispatcher: refused at once when they cannot be served; run here
 * when nothing of the channel's is queued or running and (LEASE) every expert is resident;
 * else behind the channel's requests on the forward thread, which may wait for loads. */
void model_op_lease(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                    struct moe_cqe *done)
{
	struct model_channel *mc = ch->state;
	struct forward_queue *o = mc->fq;
	const char *op = moe_op_name(sqe->op);
	if (o->lease_fd < 0) {
		done->status = MOE_ENOLEASE;
		channel_request_error(ch, sqe, done, true, "%s: this sidecar serves no leases: %s",
		                      op, o->lease_why);
		atomic_fetch_add_explicit(&o->leases_refused, 1, memory_order_relaxed);
		return;
	}
	const uint32_t n = sqe->n_tokens;
	if (n > sizeof(mc->lease_ids) / sizeof(mc->lease_ids[0])) {
		done->status = MOE_EBADTOKENS;
		done->value = n;
		channel_request_error(ch, sqe, done, true, "%s: %u ids, at most %zu per request",
		                      op, n, sizeof(mc->lease_ids) / sizeof(mc->lease_ids[0]));
		return;
	}
	if (sqe->op == MOE_OP_LEASE &&
	    (uint64_t)n * sizeof(struct moe_lease_expert) > ch->layout.out_bytes) {
		done->status = MOE_ETOOSMALL;
		done->value = n;
		channel_request_error(ch, sqe, done, true,
		                      "LEASE: %u descriptions of %zu bytes do not fit the output "
		                      "area (%llu bytes)",
		                      n, sizeof(struct moe_lease_expert),
		                      (unsigned long long)ch->layout.out_bytes);
		return;
	}
	bool now = true;
	if (sqe->op == MOE_OP_LEASE) {
		struct slot_areas a;
		channel_slot_areas(ch, sqe->slot, &a);
		/* The BF16 form runs on the engine's workers (taking the engine): never here */
		now = !(sqe->flags & MOE_LEASE_BF16) &&
		      forward_would_run_now(o->engine, sqe->layer, a.expert_ids, n);
	}
	pthread_mutex_lock(&o->lock);
	if (o->shutting_down || mc->closing) {
		pthread_mutex_unlock(&o->lock);
		done->status = MOE_ESHUTDOWN;
		channel_request_error(ch, sqe, done, true, NULL);
		return;
	}
	if (!now || mc->q_len || mc->running) {
		enqueue_and_unlock(o, mc, sqe, done);
		return;
	}
	mc->running = true;
	pthread_mutex_unlock(&o->lock);
	run_lease_op(o, mc, sqe, done, true);
	pthread_mutex_lock(&o->lock);
	mc->running = false;
	pthread_cond_broadcast(&o->idle);
	if (done->status == LEASE_LATER) {
		if (!o->shutting_down && !mc->closing) {
			enqueue_and_unlock(o, mc, sqe, done);
			return;
		}
		done->status = MOE_ESHUTDOWN;
		pthread_mutex_unlock(&o->lock);
		channel_request_error(ch, sqe, done, true, NULL);
		return;
	}
	pthread_mutex_unlock(&o->lock);
}

/* Every node part's pool to a client of ABI 1.4 or later; pool 0 only to an older one (its raw
 * LEASEs of a split sidecar are refused, naming why; its BF16 ones are served). */
static void queue_lease_fds(void *ctx, struct sidecar_channel *ch, struct service_lease_fds *l)
{
	const struct forward_queue *o = ctx;
	const struct model_channel *mc = ch->state;
	if (o->lease_fd < 0)
		return;
	l->n_pools = ch->hello_minor >= 4 ? o->lease_pools : 1;
	for (uint32_t i = 0; i < l->n_pools; i++) {
		l->pool[i] = o->lease_fds[i];
		l->pool_bytes[i] = o->lease_bytes[i];
	}
	l->staging = mc ? mc->staging_fd : -1;
	l->staging_bytes = l->staging >= 0 ? o->lease_staging_bytes : 0;
}

static void *forward_thread_main(void *arg)
{
	struct forward_queue *o = arg;
	pthread_mutex_lock(&o->lock);
	for (;;) {
		if (!o->stop && !o->rr_head) {
			pthread_mutex_unlock(&o->lock);
			const uint64_t t0 = monotonic_ns();
			spin_until(&spin_policy_polling, t0, t0 + SPIN_WAIT_BOUND_NS,
			           forward_queued, o);
			pthread_mutex_lock(&o->lock);
		}
		while (!o->stop && (!o->rr_head || o->executing))
			pthread_cond_wait(&o->work, &o->lock);
		if (o->stop)
			break;
		struct model_channel *mc = o->rr_head;
		rr_unlink_locked(o, mc);
		struct moe_sqe sqe = mc->queue[mc->q_head];
		mc->q_head = (mc->q_head + 1) % MOE_MAX_SLOTS_LIMIT;
		mc->q_len--;
		atomic_fetch_sub_explicit(&o->queued, 1, memory_order_relaxed);
		if (mc->q_len)
			rr_append_locked(o, mc); /* one request per channel per turn */
		mc->running = true;
		o->executing = true;
		pthread_mutex_unlock(&o->lock);

		struct moe_cqe c;
		if (sqe.op == MOE_OP_MASK) {
			c = (struct moe_cqe){.user_data = sqe.user_data, .slot = sqe.slot};
			run_mask(o, mc, &sqe, o->queued_mask, &c);
		} else if (sqe.op == MOE_OP_LEASE || sqe.op == MOE_OP_RELEASE) {
			c = (struct moe_cqe){.user_data = sqe.user_data, .slot = sqe.slot};
			run_lease_op(o, mc, &sqe, &c, false);
		} else {
			run_forward(o, mc, &sqe, &c, false);
		}
		if (c.status != OP_POSTED)
			channel_complete_async(mc->ch, &c);

		pthread_mutex_lock(&o->lock);
		mc->running = false;
		o->executing = false;
		pthread_cond_broadcast(&o->idle);
	}
	pthread_mutex_unlock(&o->lock);
	return NULL;
}

void model_op_forward(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                      struct moe_cqe *done)
{
	struct model_channel *mc = ch->state;
	struct forward_queue *o = mc->fq;
	/* Resident? Asked before taking o->lock (the residency has locks of its own, never
	 * nested inside it), on the shared ids: a hint only (run_forward validates its private
	 * copy); a client changing them now only changes which thread runs. */
	bool resident = false;
	if (ch->exec_last_of_batch && sqe->n_tokens <= INLINE_MAX_TOKENS &&
	    atomic_load_explicit(&o->queued, memory_order_relaxed) == 0) {
		struct slot_areas a;
		channel_slot_areas(ch, sqe->slot, &a);
		resident = forward_would_run_now(o->engine, sqe->layer, a.expert_ids,
		                                 (size_t)sqe->n_tokens * sqe->ids_per_token);
	}
	pthread_mutex_lock(&o->lock);
	if (o->shutting_down || mc->closing) {
		pthread_mutex_unlock(&o->lock);
		done->status = MOE_ESHUTDOWN;
		channel_request_error(ch, sqe, done, true, NULL);
		return;
	}
	if (resident && !o->executing && !o->rr_head) {
		o->executing = true;
		mc->running = true;
		pthread_mutex_unlock(&o->lock);
		o->forwards_inline++;
		run_forward(o, mc, sqe, done, true);
		pthread_mutex_lock(&o->lock);
		o->executing = false;
		mc->running = false;
		pthread_cond_broadcast(&o->idle);
		if (o->rr_head)
			pthread_cond_signal(&o->work);
		pthread_mutex_unlock(&o->lock);
		return;
	}
	enqueue_and_unlock(o, mc, sqe, done);
}

/* ---- The dispatcher's synchronous ops ---------------------------------------------------- */

int model_op_check(const struct sidecar_channel *ch, const struct moe_sqe *sqe, struct moe_cqe *err)
{
	const struct model_channel *mc = ch->state;
	if (!mc) {
		err->status = MOE_ENOMODEL;
		err->value = sqe->op;
		return err->status;
	}
	const struct forward_queue *o = mc->fq;
	if ((sqe->op == MOE_OP_FORWARD || sqe->op == MOE_OP_PREFETCH) &&
	    !is_moe_block(o, sqe->layer)) {
		err->status = MOE_EBADLAYER;
		err->value = (uint32_t)sqe->layer;
		return err->status;
	}
	if (sqe->op == MOE_OP_MASK && sqe->layer >= 0 &&
	    (uint32_t)sqe->layer >= o->desc->n_layers) {
		err->status = MOE_EBADLAYER;
		err->value = (uint32_t)sqe->layer;
		return err->status;
	}
	return MOE_OK;
}

void model_op_prefetch(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                       struct moe_cqe *done)
{
	struct forward_queue *o = ((struct model_channel *)ch->state)->fq;
	const bool per_expert = sqe->flags & MOE_PREFETCH_SCORES;
	const uint32_t n = sqe->n_tokens;
	if ((per_expert && n != o->desc->n_experts) || n > o->hint_cap) {
		done->status = MOE_EBADTOKENS;
		done->value = n;
		if (per_expert && n != o->desc->n_experts)
			channel_request_error(
			    ch, sqe, done, true,
			    "PREFETCH layer %d: %u router scores, the model has %u "
			    "experts",
			    sqe->layer, n, o->desc->n_experts);
		else
			channel_request_error(ch, sqe, done, true,
			                      "PREFETCH layer %d: %u hints, at most %u", sqe->layer,
			                      n, o->hint_cap);
		return;
	}
	struct slot_areas a;
	channel_slot_areas(ch, sqe->slot, &a);
	if (!per_expert)
		memcpy(o->hint_ids, a.expert_ids, n * sizeof(int32_t));
	memcpy(o->hint_scores, a.expert_weights, n * sizeof(float));
	__asm__ __volatile__("" ::: "memory");
	for (uint32_t i = 0; i < n; i++) {
		if (!isfinite(o->hint_scores[i])) {
			done->status = MOE_EBADWEIGHT;
			done->index = i;
			channel_request_error(ch, sqe, done, true,
			                      "PREFETCH layer %d: score %u is not finite",
			                      sqe->layer, i);
			return;
		}
		if (!per_expert &&
		    (o->hint_ids[i] < -1 ||
		     (o->hint_ids[i] >= 0 && (uint32_t)o->hint_ids[i] >= o->desc->n_experts))) {
			done->status = MOE_EBADEXPERT;
			done->value = (uint32_t)o->hint_ids[i];
			done->index = i;
			channel_request_error(ch, sqe, done, true,
			                      "PREFETCH layer %d: hint %u: expert %d out of range "
			                      "(0..%u, -1 = skip)",
			                      sqe->layer, i, o->hint_ids[i],
			                      o->desc->n_experts - 1);
			return;
		}
	}
	int rc = forward_prefetch_started(o->engine, sqe->layer, per_expert ? NULL : o->hint_ids,
	                                  o->hint_scores, n, per_expert,
	                                  o->recorder ? o->hint_started : NULL);
	if (rc > 0 && o->recorder) /* --record-trace: the loads it started */
		trace_recorder_add_prefetch(o->recorder, o->moe_of_block[sqe->layer],
		                            o->hint_started, (uint32_t)rc);
	if (rc < 0) {
		done->status = rc;
		channel_request_error(ch, sqe, done, true, "PREFETCH layer %d: %s", sqe->layer,
		                      moe_status_str(rc));
		return;
	}
	done->status = MOE_OK;
	done->value = (uint32_t)rc;
}

void model_op_mask(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                   struct moe_cqe *done)
{
	struct forward_queue *o = ((struct model_channel *)ch->state)->fq;
	const size_t per_layer = mask_layer_bytes(o->desc);
	const size_t n = sqe->layer < 0 ? o->mask_bytes : per_layer;
	if (n > ch->layout.in_bytes) {
		done->status = MOE_ETOOSMALL;
		done->value = (uint32_t)n;
		channel_request_error(ch, sqe, done, true,
		                      "MASK layer %d: %zu bytes do not fit the input area (%llu); "
		                      "connect with more max_tokens or hidden",
		                      sqe->layer, n, (unsigned long long)ch->layout.in_bytes);
		return;
	}
	/* A switch keeps every FORWARD on the mask it was sent under: with FORWARDs of this
	 * channel queued or running, the MASK waits behind them in the channel's queue (the
	 * forward thread runs it in submission order), so none of them is computed here for an
	 * expert the engine now computes itself, nor refused for one it has handed back. Only
	 * the channel's own order matters: another client's FORWARDs never name an expert its
	 * own mask holds, and residency drops an expert only when every client masks it. */
	struct model_channel *mc = ch->state;
	pthread_mutex_lock(&o->lock);
	if (!o->shutting_down && !mc->closing && (mc->q_len || mc->running)) {
		enqueue_and_unlock(o, mc, sqe, done);
		return;
	}
	pthread_mutex_unlock(&o->lock);
	run_mask(o, mc, sqe, o->mask, done);
}

/* The binary expert table (moe_proto.h) into the output area; its bytes, or the bytes it
 * needs when that is more than cap. */
static size_t expert_table(struct forward_queue *o, uint8_t *out, size_t cap)
{
	const uint32_t L = o->desc->n_moe_layers, E = o->desc->n_experts;
	const size_t layers_off = sizeof(struct moe_expert_table_header);
	const size_t counts_off = (layers_off + (size_t)L * sizeof(int32_t) + 7) & ~(size_t)7;
	const size_t heat_off = counts_off + (size_t)L * E * sizeof(uint64_t);
	const size_t total = heat_off + (size_t)L * E * sizeof(float);
	if (total > cap)
		return total;
	uint64_t masked;
	struct moe_expert_table_header h = {
	    .magic = MOE_EXPERT_TABLE_MAGIC,
	    .header_size = sizeof(h),
	    .n_moe_layers = L,
	    .n_experts = E,
	    .half_life_tokens = routing_half_life(o->routing),
	    .counts_off = counts_off,
	    .heat_off = heat_off,
	    .total_bytes = total,
	};
	forward_mask_info(o->engine, &h.gpu_mask_switches, &masked);
	memset(out, 0, counts_off);
	memcpy(out, &h, sizeof(h));
	for (uint32_t l = 0; l < L; l++) {
		const int32_t b = (int32_t)o->block_of_moe[l];
		memcpy(out + layers_off + l * sizeof(int32_t), &b, sizeof(b));
	}
	/* counts_off and heat_off are 8- and 4-aligned in a page-aligned area */
	routing_read(o->routing, (uint64_t *)(void *)(out + counts_off),
	             (float *)(void *)(out + heat_off));
	return total;
}

/* What the figures take from the queue (stats_table.h's `x`). Dispatcher thread. */
static void collect_figures(struct forward_queue *o)
{
	pthread_mutex_lock(&o->lock);
	const uint32_t clients = o->n_clients;
	pthread_mutex_unlock(&o->lock);
	struct stats_sources x = {
	    .clients = clients,
	    .forwards_inline = o->forwards_inline,
	    .channel_bytes = atomic_load_explicit(&o->mem_channels, memory_order_relaxed),
	    .log_lines_dropped = log_lines_dropped(),
	    .heat_half_life = routing_half_life(o->routing),
	    .leases_taken = atomic_load_explicit(&o->leases_taken, memory_order_relaxed),
	    .leases_cold = atomic_load_explicit(&o->leases_cold, memory_order_relaxed),
	    .leases_released = atomic_load_explicit(&o->leases_released, memory_order_relaxed),
	    .leases_refused = atomic_load_explicit(&o->leases_refused, memory_order_relaxed),
	    .lease_bytes_taken = atomic_load_explicit(&o->lease_bytes_taken, memory_order_relaxed),
	    .leases_held = atomic_load_explicit(&o->leases_held, memory_order_relaxed),
	    .lease_bytes_held = atomic_load_explicit(&o->lease_bytes_held, memory_order_relaxed),
	};
	forward_mask_info(o->engine, &x.mask_switches, &x.masked_experts);
	struct trace_recorder_stats ts;
	if (o->recorder) {
		trace_recorder_stats(o->recorder, &ts);
		x.trace = &ts;
	}
	serve_model_collect(o->model, &x, &o->doc);
}

/* The dispatcher's heartbeat: a document for the metrics thread when it asked for one. */
static void queue_tick(void *ctx)
{
	struct forward_queue *o = ctx;
	if (!stats_board_wanted(o->board))
		return;
	collect_figures(o);
	stats_board_publish(o->board, &o->doc);
}

void model_op_stats(const struct sidecar_channel *ch, const struct moe_sqe *sqe,
                    struct moe_cqe *done)
{
	struct forward_queue *o = ((struct model_channel *)ch->state)->fq;
	struct slot_areas a;
	channel_slot_areas(ch, sqe->slot, &a);
	if (sqe->flags & MOE_STATS_EXPERT_TABLE) {
		const size_t need = expert_table(o, (uint8_t *)o->stats, o->stats_cap);
		if (need > o->stats_cap || need > ch->layout.out_bytes) {
			done->status = MOE_ETOOSMALL;
			done->value = (uint32_t)need;
			channel_request_error(ch, sqe, done, true,
			                      "STATS: the expert table is %zu bytes, the output "
			                      "area %llu",
			                      need, (unsigned long long)ch->layout.out_bytes);
			return;
		}
		memcpy(a.output, o->stats, need);
		done->status = MOE_OK;
		done->value = (uint32_t)need;
		return;
	}
	collect_figures(o);
	struct json_writer w;
	jw_init_buffer(&w, o->stats, o->stats_cap);
	jw_object_begin(&w);
	serve_model_stats_json(o->model, &o->doc, &w);
	const struct model_channel *asker = ch->state;
	jw_key(&w, "batch_invariant"); /* the sidecar's setting, this channel's */
	jw_object_begin(&w);
	jw_kv_bool(&w, "serve", o->batch_invariant);
	jw_kv_bool(&w, "channel", asker->batch_invariant);
	pthread_mutex_lock(&o->lock);
	const uint32_t n_invariant = o->n_invariant;
	pthread_mutex_unlock(&o->lock);
	jw_kv_u64(&w, "channels", n_invariant);
	jw_object_end(&w);
	if (sqe->flags & MOE_STATS_EXPERTS)
		routing_write_json(o->routing, o->block_of_moe, &w);
	jw_object_end(&w);
	const int rc = jw_finish(&w);
	assert(rc == 0 || rc == -ENOBUFS); /* the only error a well-nested writer reports */
	const size_t len = jw_length(&w);
	if (rc != 0 || len + 1 > ch->layout.out_bytes) {
		done->status = MOE_ETOOSMALL;
		done->value = (uint32_t)(len + 1);
		channel_request_error(ch, sqe, done, true,
		                      "STATS: the JSON is %zu bytes, the output area %llu", len + 1,
		                      (unsigned long long)ch->layout.out_bytes);
		return;
	}
	memcpy(a.output, o->stats, len + 1);
	done->status = MOE_OK;
	done->value = (uint32_t)len;
}

/* ---- Life cycle ------------------------------------------------------------------------ */

static int queue_grant(void *ctx, const struct moe_limits *g, struct sidecar_error *why);
static void queue_welcome(void *ctx, struct moe_model_info *out,
                          uint8_t fingerprint[MOE_FINGERPRINT_BYTES]);
static void queue_reload(void *ctx, char *said, size_t said_len);
static void queue_shutdown(void *ctx);

int forward_queue_create(struct serve_model *m, const struct forward_queue_config *cfg,
                         struct forward_queue **out, struct sidecar_error *err)
{
	*out = NULL;
	struct forward_queue *o = calloc(1, sizeof(*o));
	if (!o)
		return error_set(err, MOE_ENOMEM, "out of memory");
	o->service = (struct channel_service){
	    .ops = serving_ops,
	    .ctx = o,
	    .grant = queue_grant,
	    .channel_open = queue_channel_open,
	    .channel_close = queue_channel_close,
	    .welcome = queue_welcome,
	    .reload = queue_reload,
	    .shutdown = queue_shutdown,
	    .tick = queue_tick,
	    .lease_fds = queue_lease_fds,
	};
	o->model = m;
	o->batch_invariant = cfg->batch_invariant;
	o->engine = serve_model_engine(m);
	o->lease_fd = -1;
	o->lease_staging_bytes = cfg->lease_staging_bytes;
	if (forward_lease_pools(o->engine, o->lease_fds, o->lease_bytes, &o->lease_pools,
	                        o->lease_why, sizeof(o->lease_why)) != 0)
		o->lease_fd = -1;
	else {
		o->lease_fd = o->lease_fds[0];
		for (uint32_t i = 0; i < o->lease_pools; i++)
			o->lease_pool_bytes += o->lease_bytes[i];
		log_info("model", "leases: the slot pool%s (%llu bytes%s) shared read-only",
		         o->lease_pools > 1 ? "s" : "", (unsigned long long)o->lease_pool_bytes,
		         o->lease_pools > 1 ? ", one per NUMA node" : "");
	}
	o->desc = serve_model_desc(m);
	const struct serve_model_desc *d = o->desc;
	const size_t rows = (size_t)d->max_tokens * d->hidden;
	const size_t ids = (size_t)d->max_tokens * d->max_top_k;
	o->hint_cap = (uint32_t)(ids > d->n_experts ? ids : d->n_experts);
	o->mask_bytes = (size_t)d->n_layers * mask_layer_bytes(d);
	o->routing = routing_create(d->n_moe_layers, d->n_experts, cfg->heat_half_life);
	const size_t table = sizeof(struct moe_expert_table_header) + 8 +
	                     (size_t)d->n_moe_layers * (4 + (size_t)d->n_experts * 12);
	o->stats_cap = 4096 + FORWARD_MAX_NODES * 512 + (size_t)d->n_moe_layers * 3072 +
	               (o->routing ? routing_json_max(o->routing) : 0);
	if (o->stats_cap < table)
		o->stats_cap = table;
	o->moe_of_block = malloc((size_t)d->n_layers * sizeof(uint32_t));
	o->block_of_moe =
	    malloc((size_t)(d->n_moe_layers ? d->n_moe_layers : 1) * sizeof(uint32_t));
	o->queued_mask = malloc((size_t)d->n_layers * mask_layer_bytes(d));
	o->x = malloc(rows * sizeof(float));
	o->ids = malloc(ids * sizeof(int32_t));
	o->weights = malloc(ids * sizeof(float));
	o->out_immediate = malloc(rows * sizeof(float));
	o->hint_ids = malloc((size_t)o->hint_cap * sizeof(int32_t));
	o->hint_scores = malloc((size_t)o->hint_cap * sizeof(float));
	o->hint_started = malloc((size_t)o->hint_cap * sizeof(uint32_t));
	o->mask = malloc(o->mask_bytes);
	o->stats = malloc(o->stats_cap);
	if (!o->x || !o->ids || !o->weights || !o->out_immediate || !o->hint_ids ||
	    !o->hint_scores || !o->hint_started || !o->mask || !o->stats || !o->routing ||
	    !o->moe_of_block || !o->block_of_moe || !o->queued_mask) {
		forward_queue_destroy(o);
		return error_set(err, MOE_ENOMEM, "out of memory for the request buffers");
	}
	if (stats_doc_init(&o->doc, d->n_moe_layers, err) != 0 ||
	    stats_board_create(d->n_moe_layers, &o->board, err) != 0) {
		forward_queue_destroy(o);
		return -1;
	}
	for (uint32_t b = 0, l = 0; b < d->n_layers; b++) {
		o->moe_of_block[b] = UINT32_MAX;
		if (serve_model_is_moe_layer(m, (int32_t)b) && l < d->n_moe_layers) {
			o->moe_of_block[b] = l;
			o->block_of_moe[l++] = b;
		}
	}
	if (cfg->record_trace) {
		const struct trace_recorder_config tc = {
		    .path = cfg->record_trace,
		    .fd = cfg->record_trace_fd,
		    .max_bytes = cfg->record_trace_max_bytes
		                     ? cfg->record_trace_max_bytes
		                     : (uint64_t)TRACE_RECORD_MAX_MIB_DEFAULT << 20,
		    .n_layers = d->n_moe_layers,
		    .n_experts = d->n_experts,
		    .top_k = d->max_top_k,
		    .max_tokens = d->max_tokens,
		};
		if (trace_recorder_create(&tc, &o->recorder, err) != 0) {
			forward_queue_destroy(o);
			return -1;
		}
	}
	o->mem_limit = d->mem_limit_bytes;
	o->mem_fixed = d->mem_fixed_bytes + 2 * rows * sizeof(float) +
	               ids * (sizeof(int32_t) + sizeof(float)) +
	               o->hint_cap * (sizeof(int32_t) + sizeof(float)) + 2 * o->mask_bytes +
	               o->stats_cap + (uint64_t)d->n_moe_layers * d->n_experts * 16;
	if (o->recorder) {
		struct trace_recorder_stats ts;
		trace_recorder_stats(o->recorder, &ts);
		o->mem_fixed += ts.ring_bytes;
	}
	int rc = pthread_mutex_init(&o->lock, NULL);
	if (rc == 0)
		rc = pthread_cond_init(&o->work, NULL);
	if (rc == 0)
		rc = pthread_cond_init(&o->idle, NULL);
	if (rc == 0)
		rc = pthread_create(&o->thread, NULL, forward_thread_main, o);
	if (rc != 0) {
		forward_queue_destroy(o);
		return error_set(err, error_status_from_errno(rc), "forward thread: %s",
		                 strerror(rc));
	}
	o->thread_started = true;
	*out = o;
	return 0;
}

static void queue_shutdown(void *ctx)
{
	struct forward_queue *o = ctx;
	/* Lock order is cq_lock → o->lock (the dispatcher executes ops under its CQ lock), so
	 * each failed request is taken out under o->lock and completed after releasing it. */
	pthread_mutex_lock(&o->lock);
	o->shutting_down = true;
	for (;;) {
		struct model_channel *mc = o->rr_head;
		if (!mc)
			break;
		struct moe_sqe sqe = mc->queue[mc->q_head];
		mc->q_head = (mc->q_head + 1) % MOE_MAX_SLOTS_LIMIT;
		mc->q_len--;
		atomic_fetch_sub_explicit(&o->queued, 1, memory_order_relaxed);
		if (!mc->q_len)
			rr_unlink_locked(o, mc);
		pthread_mutex_unlock(&o->lock);
		struct moe_cqe c = {
		    .user_data = sqe.user_data, .slot = sqe.slot, .status = MOE_ESHUTDOWN};
		channel_request_error(mc->ch, &sqe, &c, true, NULL);
		channel_complete_async(mc->ch, &c); /* mc lives: only this thread closes channels */
		pthread_mutex_lock(&o->lock);
	}
	pthread_mutex_unlock(&o->lock);
}

void forward_queue_destroy(struct forward_queue *o)
{
	if (!o)
		return;
	if (o->thread_started) {
		pthread_mutex_lock(&o->lock);
		o->stop = true;
		pthread_cond_signal(&o->work);
		pthread_mutex_unlock(&o->lock);
		pthread_join(o->thread, NULL);
		pthread_mutex_destroy(&o->lock);
		pthread_cond_destroy(&o->work);
		pthread_cond_destroy(&o->idle);
	}
	free(o->x);
	free(o->ids);
	free(o->weights);
	free(o->out_immediate);
	free(o->hint_ids);
	free(o->hint_scores);
	free(o->hint_started);
	trace_recorder_destroy(o->recorder); /* after the last FORWARD: drains the rest */
	routing_destroy(o->routing);
	free(o->mask);
	free(o->queued_mask);
	free(o->moe_of_block);
	free(o->block_of_moe);
	free(o->stats);
	stats_doc_free(&o->doc);
	stats_board_destroy(o->board);
	free(o);
}

/* The engine's buffers are sized for the model's limits: nothing larger may be granted. */
static int queue_grant(void *ctx, const struct moe_limits *g, struct sidecar_error *why)
{
	const struct forward_queue *o = ctx;
	const struct serve_model_desc *m = o->desc;
	if (g->hidden != m->hidden)
		return error_set(why, MOE_EREFUSED,
		                 "hidden %u: this sidecar serves %s with hidden %u", g->hidden,
		                 m->name, m->hidden);
	if (g->max_tokens > m->max_tokens || g->top_k > m->max_top_k)
		return error_set(why, MOE_EREFUSED,
		                 "max_tokens %u / top_k %u above this sidecar's %u / %u "
		                 "(serve --max-tokens)",
		                 g->max_tokens, g->top_k, m->max_tokens, m->max_top_k);
	return 0;
}

/* SIGHUP: every FAILED expert is read again by its next demand. */
static void queue_reload(void *ctx, char *said, size_t said_len)
{
	struct forward_queue *o = ctx;
	const uint32_t n = forward_retry_failed(o->engine);
	snprintf(said, said_len,
	         "%u failed expert(s) will be read again by their next demand (their backoff "
	         "ended)",
	         n);
}

static void queue_welcome(void *ctx, struct moe_model_info *out,
                          uint8_t fingerprint[MOE_FINGERPRINT_BYTES])
{
	const struct forward_queue *o = ctx;
	const struct serve_model_desc *d = o->desc;
	memset(out, 0, sizeof(*out));
	out->flags = MOE_MODEL_FINGERPRINT;
	memcpy(fingerprint, d->fingerprint, MOE_FINGERPRINT_BYTES);
	if (d->n_layers <= MOE_LAYER_BITMAP_LAYERS) {
		out->flags |= MOE_MODEL_LAYER_BITMAP;
		memcpy(out->moe_layers, d->moe_layers, sizeof(out->moe_layers));
	}
	out->n_layers = d->n_layers;
	out->n_moe_layers = d->n_moe_layers;
	out->first_moe_layer = d->first_moe_layer;
	out->n_experts = d->n_experts;
	out->top_k = d->top_k;
	out->hidden = d->hidden;
	out->expert_ffn = d->expert_ffn;
	snprintf(out->name, sizeof(out->name), "%s", d->name);
}

const struct channel_service *forward_queue_service(struct forward_queue *o)
{
	return &o->service;
}

struct stats_board *forward_queue_board(struct forward_queue *o)
{
	return o->board;
}
