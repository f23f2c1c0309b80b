/* loader.c — one node's expert loader: a thread pinned to the node, owning an io_uring,
 * reading the node's slices of experts from the model files into the node's slots.
 *
 * Threading: only the loader thread touches its ring. The owner (residency.c) queues work
 * under its own lock and pokes the loader's eventfd (loader_wake), which the ring always has a
 * read pending on; the loader picks the work up through ops->take_work and publishes its part
 * of a finished load through ops->load_done (each takes the owner's lock for itself), never
 * across I/O.
 *
 * Reads: each extent's aligned superset (alignment from statx DIOALIGN, at least 4096) is
 * split into chunks of chunk_bytes; at most queue_depth chunks are in flight, each linked to
 * a timeout (IORING_OP_LINK_TIMEOUT). Demand loads are issued before prefetch loads. Slots
 * are registered buffers (read_fixed) when the kernel allows, plain reads otherwise; files
 * are registered too. A short read continues from where it stopped (rounded down to the
 * alignment for O_DIRECT); bytes past the expert's data at the end of the file may be
 * missing. EIO, EAGAIN, EINTR and timeouts are retried up to max_retries times per read;
 * then the expert fails with that error and every waiter gets it. When every read of an
 * expert has landed, the config's post-load hook (if any) runs on the node's layout thread,
 * before the expert is published RESIDENT (e.g. the decode layout, in the slot), so the loader
 * keeps the disk's queue full meanwhile; its failure fails the expert like a read error, with
 * the hook's message. Without a hook the loader publishes the load itself.
 *
 * Populate: the pool is not pre-faulted at create. Its memory is cut into groups of whole
 * slots of one class (at most fixed_buffer_max, 1 GiB: one registered buffer each), which the
 * node's populate thread pre-faults (slot_pool_populate) and registers
 * (io_uring_register_buffers_update_tag into a sparse table) one at a time, groups the loader
 * is waiting for first, then the others in the order slots are handed out. A group is
 * populated in steps of POPULATE_STEP bytes of whole slots, and a load into a slot whose step
 * is not done yet is parked (not issued) until the populate thread has done it and woken the
 * loader: no read lands in memory being populated. The last step's slots wait for the group's
 * registration too (so a group of one step, a small pool's, is only ever read with read_fixed);
 * reads into the earlier steps of a group not yet registered, or whose registration failed,
 * are plain reads.
 *
 * Shutdown: the thread cancels everything in flight (IORING_ASYNC_CANCEL_ANY), waits a
 * bounded time for the cancellations, and fails what was pending with -ESHUTDOWN; loads
 * waiting for the layout thread fail with -ESHUTDOWN too; the populate thread stops after
 * its current group.
 */
#include "loader.h"

#include <assert.h>
#include <errno.h>
#include <liburing.h>
#include <numa.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

#define TAG_WAKE 1u
#define TAG_TIMEOUT 2u
#define TAG_CANCEL 3u
#define MAX_REGISTERED_BUFFERS 16384u
#define POPULATE_STEP (64u << 20) /* bytes of a group made usable at a time */

/* A group's state (loader.group_state): written by the populate thread, read by the loader. */
enum { GROUP_COLD, GROUP_POPULATING, GROUP_READY, GROUP_FIXED /* ready and registered */ };

/* One read in flight (a chunk of an extent's aligned range). */
struct read_op {
	uint32_t slot; /* the load (loads[] is indexed by slot) */
	uint32_t file;
	uint64_t offset;    /* next file byte to read */
	uint8_t *buf;       /* where it goes */
	uint64_t remaining; /* bytes of the chunk still to read */
	uint64_t needed;    /* of which must arrive (the rest is alignment past EOF) */
	uint32_t attempts;  /* retries so far */
	uint64_t submit_ns;
};

/* One expert being loaded into its slot. */
struct expert_load {
	uint32_t id;
	uint32_t extent;   /* issuing cursor: extent index … */
	uint64_t position; /* … and byte within its aligned range */
	uint32_t in_flight;
	bool issued_all;
	int error; /* first error; stops further issuing */
	uint32_t error_file, error_attempts;
	uint64_t error_offset;
	uint32_t failed_loads; /* the expert's, when the load was picked up (fault hook) */
	bool demand;
};

/* A load whose reads have landed, waiting for the post-load hook on the layout thread. */
struct layout_item {
	uint32_t id, slot;
};

/* FIFO of slots with chunks left to issue. */
struct slot_fifo {
	uint32_t *slots;
	uint32_t cap, head, count;
};

struct loader {
	struct loader_config cfg;
	loader_fault_fn fault_hook; /* tests only */
	void *fault_arg;
	struct io_uring ring;
	bool ring_ready;
	pthread_t thread;
	bool thread_started;
	int wake_fd;
	uint64_t wake_value;
	bool wake_armed;
	struct read_op *ops;
	uint32_t *free_ops, n_free_ops, depth;
	uint32_t n_slots;
	struct expert_load *loads; /* [n_slots] */
	struct loader_job *jobs;   /* [n_slots]: what take_work hands over */
	struct slot_fifo issue_demand, issue_prefetch;
	struct slot_fifo parked; /* loads whose group is not ready yet (loader thread only) */
	bool buffers_registered, files_registered;
	/* Class c's fixed buffers are buffer_first[c] on, each of slots_per_buffer[c] of its
	 * slots: slot s of class c is in buffer_first[c] + (s - first) / slots_per_buffer[c]. */
	uint32_t slots_per_buffer[SLOT_MAX_CLASSES], buffer_first[SLOT_MAX_CLASSES];
	uint32_t n_groups;             /* groups = the fixed buffers, registered or not */
	_Atomic uint8_t *group_state;  /* [n_groups]: GROUP_* */
	_Atomic uint8_t *group_wanted; /* [n_groups]: a parked load waits for it */
	_Atomic uint32_t *group_ready; /* [n_groups]: its first slots populated so far */
	uint32_t *group_order;         /* [n_groups]: the order slots are handed out */
	pthread_t populate_thread;
	bool populate_started;
	atomic_bool populate_stop;
	uint64_t busy_since; /* when reads went in flight (0: none in flight) */
	/* The layout stage: finished loads waiting for the post-load hook (a FIFO of at most
	 * n_slots: one load per slot), its thread, and its last failure's message. */
	pthread_mutex_t layout_mu;
	pthread_cond_t layout_cv;
	bool layout_sync_ready, layout_started, layout_stop;
	struct layout_item *layout_q;
	uint32_t layout_head, layout_count;
	pthread_t layout_thread;
	struct __kernel_timespec timeout;
	uint64_t seq;
	uint32_t in_flight;
	char post_load_msg[RESIDENCY_POST_LOAD_MSG]; /* the last post-load failure's message */
};

static void pin_to_node(const struct loader *l);

/* The group holding `slot` (its fixed buffer's index); *at: the slot's index in it. */
static uint32_t group_of(const struct loader *l, uint32_t slot, uint32_t *at)
{
	const struct slot_class *k = slot_pool_class_of(l->cfg.pool, slot);
	const size_t c = (size_t)(k - l->cfg.pool->classes);
	if (at)
		*at = (slot - k->first) % l->slots_per_buffer[c];
	return l->buffer_first[c] + (slot - k->first) / l->slots_per_buffer[c];
}

static void fifo_push(struct slot_fifo *q, uint32_t s)
{
	assert(q->count < q->cap);
	q->slots[(q->head + q->count++) % q->cap] = s;
}

static uint32_t fifo_front(const struct slot_fifo *q)
{
	return q->count ? q->slots[q->head] : SLOT_NONE;
}

static void fifo_pop(struct slot_fifo *q)
{
	q->head = (q->head + 1) % q->cap;
	q->count--;
}

static inline void stat_add(_Atomic uint64_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

bool loader_buffers_registered(const struct loader *l)
{
	return l && l->buffers_registered;
}

uint32_t loader_fixed_buffers(const struct loader *l)
{
	return l && l->buffers_registered ? l->n_groups : 0;
}

void loader_set_fault_hook(struct loader *l, loader_fault_fn hook, void *arg)
{
	l->fault_hook = hook;
	l->fault_arg = arg;
}

void loader_wake(struct loader *l)
{
	uint64_t one = 1;
	/* A full counter (EAGAIN) still wakes the reader; nothing else can fail here. */
	ssize_t n = write(l->wake_fd, &one, sizeof(one));
	(void)n;
}

static struct io_uring_sqe *get_sqe(struct loader *l)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
	if (!sqe) {
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
	}
	assert(sqe); /* the SQ is sized for every read, its timeout and the control entries */
	return sqe;
}

static void arm_wake(struct loader *l)
{
	struct io_uring_sqe *sqe = get_sqe(l);
	io_uring_prep_read(sqe, l->wake_fd, &l->wake_value, sizeof(l->wake_value), 0);
	io_uring_sqe_set_data64(sqe, TAG_WAKE);
	l->wake_armed = true;
}

static void submit_read(struct loader *l, struct read_op *op)
{
	struct io_uring_sqe *sqe = get_sqe(l);
	int fd = l->files_registered ? (int)op->file : l->cfg.fds[op->file];
	unsigned len = (unsigned)op->remaining;
	const uint32_t g = group_of(l, op->slot, NULL);
	if (atomic_load_explicit(&l->group_state[g], memory_order_acquire) == GROUP_FIXED) {
		io_uring_prep_read_fixed(sqe, fd, op->buf, len, op->offset, (int)g);
		stat_add(&l->cfg.io->fixed_reads, 1);
	} else {
		io_uring_prep_read(sqe, fd, op->buf, len, op->offset);
		stat_add(&l->cfg.io->plain_reads, 1);
	}
	if (l->files_registered)
		sqe->flags |= IOSQE_FIXED_FILE;
	sqe->flags |= IOSQE_IO_LINK;
	io_uring_sqe_set_data(sqe, op);
	struct io_uring_sqe *t = get_sqe(l);
	io_uring_prep_link_timeout(t, &l->timeout, 0);
	io_uring_sqe_set_data64(t, TAG_TIMEOUT);
	op->submit_ns = monotonic_ns();
	stat_add(&l->cfg.io->reads, 1);
	l->in_flight++;
}

/* Issues the next chunk of the load in `slot`; false when it has nothing left to issue. */
static bool issue_chunk(struct loader *l, uint32_t slot)
{
	const struct loader_config *c = &l->cfg;
	struct expert_load *ld = &l->loads[slot];
	uint32_t n;
	const struct expert_extent *ext = expert_map_extents(c->map, ld->id, &n);
	if (ld->error || ld->extent >= n) {
		ld->issued_all = true;
		return false;
	}
	const struct extent_layout *lay =
	    &c->layout[(size_t)ld->id * EXPERT_MAX_EXTENTS + ld->extent];
	uint64_t len = lay->read_length - ld->position;
	if (len > c->chunk_bytes)
		len = c->chunk_bytes;
	uint64_t data_end = lay->data_skip + ext[ld->extent].length; /* within the range */
	uint64_t needed = data_end > ld->position ? data_end - ld->position : 0;
	struct read_op *op = &l->ops[l->free_ops[--l->n_free_ops]];
	*op = (struct read_op){
	    .slot = slot,
	    .file = ext[ld->extent].file,
	    .offset = lay->read_offset + ld->position,
	    .buf = slot_pool_addr(c->pool, slot) + lay->slot_offset + ld->position,
	    .remaining = len,
	    .needed = needed < len ? needed : len,
	};
	ld->in_flight++;
	ld->position += len;
	if (ld->position >= lay->read_length) {
		ld->extent++;
		ld->position = 0;
	}
	if (ld->extent >= n)
		ld->issued_all = true;
	submit_read(l, op);
	return !ld->issued_all;
}

/* Publishes a load once nothing of it is in flight and nothing more will be issued (a
 * failed load stops issuing when it reaches the front of its FIFO). */
static void finish_if_done(struct loader *l, uint32_t slot)
{
	struct expert_load *ld = &l->loads[slot];
	if (ld->id == UINT32_MAX || ld->in_flight || !ld->issued_all)
		return;
	const struct loader_config *c = &l->cfg;
	struct loader_result res = {.id = ld->id,
	                            .error = ld->error,
	                            .file = ld->error_file,
	                            .attempts = ld->error_attempts,
	                            .offset = ld->error_offset};
	if (!ld->error && c->post_load) { /* the layout thread publishes it */
		pthread_mutex_lock(&l->layout_mu);
		assert(l->layout_count < l->n_slots);
		l->layout_q[(l->layout_head + l->layout_count++) % l->n_slots] =
		    (struct layout_item){.id = ld->id, .slot = slot};
		pthread_cond_signal(&l->layout_cv);
		pthread_mutex_unlock(&l->layout_mu);
	} else {
		c->ops->load_done(c->owner, c->node, &res);
	}
	ld->id = UINT32_MAX; /* free: the slot's next load comes after load_done */
}

/* Runs the post-load hook over a finished load (layout thread; no reader yet: the slot is
 * this thread's) and publishes it. Stopping: fails it with -ESHUTDOWN instead. */
static void post_load_and_publish(struct loader *l, const struct layout_item *it, bool stopping)
{
	const struct loader_config *c = &l->cfg;
	struct loader_result res = {.id = it->id};
	uint32_t n;
	const struct expert_extent *ext = expert_map_extents(c->map, it->id, &n);
	if (stopping) {
		res.error = -ESHUTDOWN;
		c->ops->load_done(c->owner, c->node, &res);
		return;
	}
	struct residency_loaded x = {
	    .layer = it->id / c->n_experts,
	    .expert = it->id % c->n_experts,
	    .node = c->node,
	    .n_extents = n,
	    .slot = slot_pool_addr(c->pool, it->slot),
	    .slot_bytes = slot_pool_slot_bytes(c->pool, it->slot),
	};
	for (uint32_t i = 0; i < n; i++) {
		const struct extent_layout *lay =
		    &c->layout[(size_t)it->id * EXPERT_MAX_EXTENTS + i];
		x.data[i] = x.slot + lay->slot_offset + lay->data_skip;
		x.length[i] = ext[i].length;
	}
	struct sidecar_error why = {0};
	const uint64_t t0 = monotonic_ns();
	const int rc = c->post_load(c->post_load_arg, &x, &why);
	stat_add(&c->io->layout_ns, monotonic_ns() - t0);
	if (rc != 0) {
		res.error = why.status == MOE_ENOMEM ? -ENOMEM
		            : why.status == MOE_EIO  ? -EIO
		                                     : -EINVAL;
		res.file = ext[0].file;
		res.offset = ext[0].offset;
		res.attempts = 1;
		error_copy_msg(l->post_load_msg, sizeof(l->post_load_msg), &why); /* short */
		if (!l->post_load_msg[0])
			snprintf(l->post_load_msg, sizeof(l->post_load_msg), "%s",
			         strerror(-res.error));
		res.post_load_msg = l->post_load_msg;
	}
	c->ops->load_done(c->owner, c->node, &res);
}

/* The layout thread: the post-load hook of every finished load, in the order they finished;
 * once told to stop (after the loader thread has ended), fails what is left. */
static void *layout_main(void *arg)
{
	struct loader *l = arg;
	pin_to_node(l);
	pthread_mutex_lock(&l->layout_mu);
	for (;;) {
		while (!l->layout_count && !l->layout_stop)
			pthread_cond_wait(&l->layout_cv, &l->layout_mu);
		if (!l->layout_count)
			break;
		const struct layout_item it = l->layout_q[l->layout_head];
		l->layout_head = (l->layout_head + 1) % l->n_slots;
		l->layout_count--;
		const bool stopping = l->layout_stop;
		pthread_mutex_unlock(&l->layout_mu);
		post_load_and_publish(l, &it, stopping);
		pthread_mutex_lock(&l->layout_mu);
	}
	pthread_mutex_unlock(&l->layout_mu);
	return NULL;
}

static void record_latency(struct loader_stats *io, uint64_t ns)
{
	uint64_t us = ns / 1000;
	int b = us < 2 ? 0 : 63 - __builtin_clzll(us);
	if (b >= LOADER_LAT_BUCKETS)
		b = LOADER_LAT_BUCKETS - 1;
	stat_add(&io->latency_us_log2[b], 1);
}

static bool retryable(int res)
{
	return res == -EIO || res == -EAGAIN || res == -EINTR || res == -ECANCELED || res == -ETIME;
}

static void fail_op(struct loader *l, struct read_op *op, int error)
{
	struct expert_load *ld = &l->loads[op->slot];
	if (!ld->error) {
		ld->error = error;
		ld->error_file = op->file;
		ld->error_offset = op->offset;
		ld->error_attempts = op->attempts + 1;
	}
}

static void release_op(struct loader *l, struct read_op *op)
{
	l->free_ops[l->n_free_ops++] = (uint32_t)(op - l->ops);
	l->in_flight--;
	struct expert_load *ld = &l->loads[op->slot];
	ld->in_flight--;
	finish_if_done(l, op->slot);
}

static void handle_read(struct loader *l, struct read_op *op, int res, bool stopping)
{
	const struct loader_config *c = &l->cfg;
	struct loader_stats *io = c->io;
	record_latency(io, monotonic_ns() - op->submit_ns);
	if (l->fault_hook) {
		struct expert_load *ld = &l->loads[op->slot];
		struct loader_read_info info = {
		    .layer = ld->id / c->n_experts,
		    .expert = ld->id % c->n_experts,
		    .file = op->file,
		    .node = c->node,
		    .offset = op->offset,
		    .length = op->remaining,
		    .attempt = op->attempts,
		    .seq = l->seq,
		    .failed_loads = ld->failed_loads,
		};
		res = l->fault_hook(l->fault_arg, &info, res);
	}
	l->seq++;
	if (l->loads[op->slot].error) { /* the expert already failed: drop the rest */
		release_op(l, op);
		return;
	}
	if (res >= 0 && (uint64_t)res > op->remaining)
		res = (int)op->remaining; /* a hook cannot make a read longer than asked */
	if (res > 0)
		stat_add(&io->bytes_read, (uint64_t)res);
	if (res >= 0 && (uint64_t)res >= op->needed) {
		release_op(l, op);
		return;
	}
	if (stopping) {
		fail_op(l, op, -ESHUTDOWN);
		release_op(l, op);
		return;
	}
	if (res == 0) {
		fail_op(l, op, -ENODATA); /* end of file inside the expert's data */
		release_op(l, op);
		return;
	}
	if (res > 0) {
		stat_add(&io->short_reads, 1);
		uint64_t advance = (uint64_t)res;
		if (!c->buffered[op->file])
			advance = advance / c->alignment * c->alignment;
		if (advance == 0 && ++op->attempts > c->max_retries) {
			fail_op(l, op, -EIO);
			release_op(l, op);
			return;
		}
		op->offset += advance;
		op->buf += advance;
		op->remaining -= advance;
		op->needed -= advance;
		l->in_flight--;
		submit_read(l, op);
		return;
	}
	if (retryable(res) && op->attempts < c->max_retries) {
		op->attempts++;
		stat_add(&io->retries, 1);
		l->in_flight--;
		submit_read(l, op);
		return;
	}
	fail_op(l, op, res == -ECANCELED || res == -ETIME ? -ETIMEDOUT : res);
	release_op(l, op);
}

/* Takes the owner's queued work into the issue FIFOs, demand first; false once it stops. */
static bool pick_up_work(struct loader *l)
{
	const struct loader_config *c = &l->cfg;
	const int n = c->ops->take_work(c->owner, c->node, l->jobs, l->n_slots);
	for (int i = 0; i < n; i++) {
		const struct loader_job *j = &l->jobs[i];
		struct expert_load *ld = &l->loads[j->slot];
		assert(ld->id == UINT32_MAX);
		*ld = (struct expert_load){
		    .id = j->id, .failed_loads = j->failed_loads, .demand = j->demand};
		fifo_push(&l->parked, j->slot); /* unpark() issues it once its group is ready */
	}
	return n >= 0;
}

/* Moves the parked loads whose group is ready to the issue FIFOs (in order); asks the populate
 * thread for the groups of the others. */
static void unpark(struct loader *l)
{
	for (uint32_t i = l->parked.count; i > 0; i--) {
		const uint32_t slot = fifo_front(&l->parked);
		fifo_pop(&l->parked);
		uint32_t at;
		const uint32_t g = group_of(l, slot, &at);
		if (atomic_load_explicit(&l->group_ready[g], memory_order_acquire) > at) {
			fifo_push(l->loads[slot].demand ? &l->issue_demand : &l->issue_prefetch,
			          slot);
		} else {
			atomic_store_explicit(&l->group_wanted[g], 1, memory_order_relaxed);
			fifo_push(&l->parked, slot);
		}
	}
}

/* Adds the time reads were in flight since the last call to the busy counter. */
static void account_busy(struct loader *l)
{
	const uint64_t now = l->busy_since || l->in_flight ? monotonic_ns() : 0;
	if (l->busy_since)
		stat_add(&l->cfg.io->busy_ns, now - l->busy_since);
	l->busy_since = l->in_flight ? now : 0;
}

static void issue_reads(struct loader *l)
{
	struct slot_fifo *fifos[2] = {&l->issue_demand, &l->issue_prefetch};
	for (int q = 0; q < 2; q++) {
		while (l->n_free_ops) {
			uint32_t slot = fifo_front(fifos[q]);
			if (slot == SLOT_NONE)
				break;
			if (!issue_chunk(l, slot)) {
				fifo_pop(fifos[q]);
				finish_if_done(l, slot); /* a load that failed before issuing all */
			}
		}
	}
}

static void reap(struct loader *l, bool stopping)
{
	struct io_uring_cqe *cqe;
	while (io_uring_peek_cqe(&l->ring, &cqe) == 0) {
		uint64_t tag = io_uring_cqe_get_data64(cqe);
		int res = cqe->res;
		io_uring_cqe_seen(&l->ring, cqe);
		if (tag == TAG_WAKE) {
			l->wake_armed = false;
			continue;
		}
		if (tag == TAG_TIMEOUT) {
			if (res == -ETIME)
				stat_add(&l->cfg.io->timeouts, 1);
			continue;
		}
		if (tag == TAG_CANCEL)
			continue;
		handle_read(l, (struct read_op *)(uintptr_t)tag, res, stopping);
	}
}

/* Fails every load that is queued, waiting to issue, or issued but abandoned. */
static void fail_pending(struct loader *l)
{
	for (uint32_t s = 0; s < l->n_slots; s++) {
		struct expert_load *ld = &l->loads[s];
		if (ld->id == UINT32_MAX)
			continue;
		if (!ld->error)
			ld->error = -ESHUTDOWN;
		ld->in_flight = 0;
		ld->issued_all = true;
		finish_if_done(l, s);
	}
	l->cfg.ops->drop_queued(l->cfg.owner, l->cfg.node);
}

/* With several nodes, runs the calling thread on the CPUs of the node its pool is bound to, so
 * that its completions and post-load conversions touch the node's memory from the node. */
static void pin_to_node(const struct loader *l)
{
	const int node = l->cfg.numa_node;
	if (!l->cfg.pin_to_node || node < 0 || numa_available() < 0)
		return; /* one node: the loader keeps the process's affinity */
	if (numa_run_on_node(node) != 0)
		log_warn("loader", "cannot pin node %d's loader to the node: %s", node,
		         strerror(errno));
}

/* libnuma fills its per-node CPU mask cache lazily and without a lock: when two threads pin
 * themselves for the first time at once, each allocates the cache and one allocation is lost
 * (LeakSanitizer names numa_node_to_cpus). Fill it for the node here, on the thread that starts
 * the loader, before any of the loader's threads runs. */
static void warm_numa_cache(const struct loader *l)
{
	const int node = l->cfg.numa_node;
	if (!l->cfg.pin_to_node || node < 0 || numa_available() < 0)
		return;
	struct bitmask *cpus = numa_allocate_cpumask();
	if (!cpus)
		return;
	(void)numa_node_to_cpus(node, cpus); /* a node the machine lacks fails later, in the pin */
	numa_free_cpumask(cpus);
}

static void *loader_main(void *arg)
{
	struct loader *l = arg;
	pin_to_node(l);
	for (;;) {
		if (!pick_up_work(l))
			break;
		unpark(l);
		issue_reads(l);
		if (!l->wake_armed)
			arm_wake(l);
		account_busy(l);
		int rc = io_uring_submit_and_wait(&l->ring, 1);
		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
			log_error("loader", "io_uring_submit_and_wait: %s; loader stops",
			          strerror(-rc));
			break;
		}
		reap(l, false);
		account_busy(l);
	}
	/* Shutdown: cancel everything in flight, wait (bounded) for the cancellations. */
	struct io_uring_sqe *sqe = get_sqe(l);
	io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
	io_uring_sqe_set_data64(sqe, TAG_CANCEL);
	io_uring_submit(&l->ring);
	for (int i = 0; i < 50 && l->in_flight; i++) {
		struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
		struct io_uring_cqe *cqe;
		int rc = io_uring_wait_cqe_timeout(&l->ring, &cqe, &ts);
		if (rc < 0 && rc != -ETIME && rc != -EINTR)
			break;
		reap(l, true);
	}
	if (l->in_flight)
		log_warn("loader", "%u reads still in flight at shutdown; abandoning them",
		         l->in_flight);
	fail_pending(l);
	return NULL;
}

/* io_uring's rings and registered buffers are pinned memory, charged to RLIMIT_MEMLOCK for a
 * process without CAP_IPC_LOCK (non-root): ENOMEM there usually means that limit (8 MiB by
 * default), not a machine out of memory. `what` is what was being pinned ("the rings", "the
 * 12.0 MiB of slots"); bytes, when known, must exceed the limit for the hint to apply. hint
 * gets "; …" or "". */
static void memlock_hint(int rc, const char *what, uint64_t bytes, char *hint, size_t len)
{
	struct rlimit lim;
	hint[0] = '\0';
	if (rc != -ENOMEM || getrlimit(RLIMIT_MEMLOCK, &lim) != 0 ||
	    lim.rlim_cur == RLIM_INFINITY || (bytes && lim.rlim_cur >= bytes))
		return;
	snprintf(hint, len,
	         "; %s count against RLIMIT_MEMLOCK (%llu KiB here): raise it (ulimit -l; "
	         "systemd: LimitMEMLOCK=)",
	         what, (unsigned long long)(lim.rlim_cur >> 10));
}

/* Sets up everything but the thread; 0, or -1 with err (loader_start frees what was made). */
static int loader_setup(struct loader *l, struct sidecar_error *err)
{
	const struct loader_config *c = &l->cfg;
	const struct slot_pool *pool = c->pool;
	const uint32_t n_slots = l->n_slots;
	l->ops = calloc(l->depth, sizeof(*l->ops));
	l->free_ops = malloc(l->depth * sizeof(uint32_t));
	l->loads = calloc(n_slots, sizeof(*l->loads));
	l->jobs = calloc(n_slots, sizeof(*l->jobs));
	l->issue_demand =
	    (struct slot_fifo){.slots = malloc(n_slots * sizeof(uint32_t)), .cap = n_slots};
	l->issue_prefetch =
	    (struct slot_fifo){.slots = malloc(n_slots * sizeof(uint32_t)), .cap = n_slots};
	l->parked = (struct slot_fifo){.slots = malloc(n_slots * sizeof(uint32_t)), .cap = n_slots};
	l->layout_q = malloc(n_slots * sizeof(*l->layout_q));
	if (!l->ops || !l->free_ops || !l->loads || !l->jobs || !l->issue_demand.slots ||
	    !l->issue_prefetch.slots || !l->parked.slots || !l->layout_q)
		return error_set(err, MOE_ENOMEM, "loader: out of memory for %u reads, %u slots",
		                 l->depth, n_slots);
	for (uint32_t i = 0; i < l->depth; i++)
		l->free_ops[i] = l->depth - 1 - i;
	l->n_free_ops = l->depth;
	for (uint32_t s = 0; s < n_slots; s++)
		l->loads[s].id = UINT32_MAX;
	l->timeout.tv_sec = c->read_timeout_ms / 1000;
	l->timeout.tv_nsec = (long long)(c->read_timeout_ms % 1000) * 1000000;

	l->wake_fd = eventfd(0, EFD_CLOEXEC);
	if (l->wake_fd < 0)
		return error_set_errno(err, "loader: eventfd");
	/* Two entries per read (read + linked timeout), plus wake, cancel and slack. */
	unsigned entries = 2 * l->depth + 8;
	int rc = io_uring_queue_init(entries, &l->ring, 0);
	if (rc < 0) {
		char hint[320];
		memlock_hint(rc, "its rings", 0, hint, sizeof(hint));
		return error_set(err, MOE_ESYS, "loader: io_uring_queue_init(%u entries): %s%s",
		                 entries, strerror(-rc), hint);
	}
	l->ring_ready = true;
	rc = io_uring_register_files(&l->ring, c->fds, c->map->n_files);
	l->files_registered = rc == 0;
	if (rc < 0)
		log_info("loader", "registering %u files failed (%s): using plain descriptors",
		         c->map->n_files, strerror(-rc));
	/* Groups: runs of whole slots of one class, each at most 1 GiB (the kernel's limit per
	 * fixed buffer); the unit the populate thread pre-faults and registers (group_of). */
	uint64_t cap = c->fixed_buffer_max;
	if (cap == 0 || cap > (UINT64_C(1) << 30))
		cap = UINT64_C(1) << 30;
	uint64_t n_groups = 0;
	bool fits = true; /* every slot fits in one fixed buffer */
	for (uint32_t k = 0; k < pool->n_classes; k++) {
		const struct slot_class *sc = &pool->classes[k];
		uint64_t per = cap / sc->slot_bytes;
		fits = fits && sc->slot_bytes <= (UINT64_C(1) << 30);
		if (per == 0)
			per = 1; /* a cap below one slot: one slot per group */
		if (per > sc->n_slots)
			per = sc->n_slots ? sc->n_slots : 1;
		l->slots_per_buffer[k] = (uint32_t)per;
		l->buffer_first[k] = (uint32_t)n_groups;
		n_groups += (sc->n_slots + per - 1) / per;
	}
	l->n_groups = (uint32_t)n_groups; /* ≤ n_slots */
	l->group_state = calloc(n_groups, sizeof(*l->group_state));
	l->group_wanted = calloc(n_groups, sizeof(*l->group_wanted));
	l->group_ready = calloc(n_groups, sizeof(*l->group_ready));
	l->group_order = malloc(n_groups * sizeof(uint32_t));
	if (!l->group_state || !l->group_wanted || !l->group_ready || !l->group_order)
		return error_set(err, MOE_ENOMEM, "loader: out of memory for %llu slot groups",
		                 (unsigned long long)n_groups);
	/* The order slots are handed out: each class's from its first slot on, so the classes'
	 * groups taken in turn. */
	for (uint32_t i = 0, at = 0; at < n_groups; i++)
		for (uint32_t k = 0; k < pool->n_classes; k++) {
			const struct slot_class *sc = &pool->classes[k];
			if ((uint64_t)i * l->slots_per_buffer[k] < sc->n_slots)
				l->group_order[at++] = l->buffer_first[k] + i;
		}
	stat_add(&c->io->pool_groups, n_groups);
	/* Registered buffers: a sparse table now, each group's entry once it is populated. */
	if (!c->no_register_buffers && fits && n_groups <= MAX_REGISTERED_BUFFERS) {
		rc = io_uring_register_buffers_sparse(&l->ring, (unsigned)n_groups);
		l->buffers_registered = rc == 0;
		if (rc < 0) {
			char hint[320];
			memlock_hint(rc, "registered buffers", 0, hint, sizeof(hint));
			log_warn(
			    "loader",
			    "registering %u slots as %llu fixed buffers failed (%s): plain reads "
			    "(counted as plain_reads)%s",
			    n_slots, (unsigned long long)n_groups, strerror(-rc), hint);
		}
	}
	return 0;
}

/* Slot range of group g: its first slot and how many. */
static void group_slots(const struct loader *l, uint32_t g, uint32_t *first, uint32_t *count)
{
	const struct slot_pool *pool = l->cfg.pool;
	uint32_t k = 0;
	for (uint32_t j = 0; j < pool->n_classes; j++)
		if (pool->classes[j].n_slots && l->buffer_first[j] <= g)
			k = j;
	const struct slot_class *sc = &pool->classes[k];
	const uint32_t per = l->slots_per_buffer[k];
	const uint32_t at = (g - l->buffer_first[k]) * per;
	*first = sc->first + at;
	*count = sc->n_slots - at < per ? sc->n_slots - at : per;
}

/* Registers group g (its slots populated) as its fixed buffer; the group's state after. */
static uint8_t register_group(struct loader *l, uint32_t g, bool *warned)
{
	const struct loader_config *c = &l->cfg;
	if (!l->buffers_registered)
		return GROUP_READY;
	uint32_t first, count;
	group_slots(l, g, &first, &count);
	struct iovec iov = {slot_pool_addr(c->pool, first),
	                    (size_t)count * slot_pool_slot_bytes(c->pool, first)};
	const int rc = io_uring_register_buffers_update_tag(&l->ring, g, &iov, NULL, 1);
	if (rc >= 0)
		return GROUP_FIXED;
	if (!*warned) {
		char what[64], hint[320];
		snprintf(what, sizeof(what), "the %.1f MiB of slots",
		         (double)c->pool->slots_bytes / (1 << 20));
		memlock_hint(rc, what, c->pool->slots_bytes, hint, sizeof(hint));
		log_warn(
		    "loader",
		    "registering %u slots as %u fixed buffers failed (%s) at buffer %u (slots "
		    "%u to %u): plain reads into the buffers refused (counted as plain_reads)%s",
		    l->n_slots, l->n_groups, strerror(-rc), g, first, first + count - 1, hint);
		*warned = true;
	}
	return GROUP_READY;
}

/* The group to populate a step of next: one a parked load waits for, else the one in hand,
 * else the first unfinished one in the order slots are handed out from *next on — untouched,
 * or one a wanted group took the thread from mid-way (behind the cursor: the scan wraps).
 * UINT32_MAX when every group is finished. */
static uint32_t next_group(const struct loader *l, uint32_t in_hand, uint32_t *next)
{
	for (uint32_t i = 0; i < l->n_groups; i++)
		if (atomic_load_explicit(&l->group_wanted[i], memory_order_relaxed) &&
		    atomic_load_explicit(&l->group_state[i], memory_order_relaxed) <=
		        GROUP_POPULATING)
			return i;
	if (in_hand != UINT32_MAX)
		return in_hand;
	for (uint32_t i = 0; i < l->n_groups; i++) {
		const uint32_t at = (uint32_t)(((uint64_t)*next + i) % l->n_groups);
		const uint32_t o = l->group_order[at];
		if (atomic_load_explicit(&l->group_state[o], memory_order_relaxed) <=
		    GROUP_POPULATING) {
			*next = at;
			return o;
		}
	}
	return UINT32_MAX;
}

/* The populate thread: pre-faults the groups on the pool's node in steps of POPULATE_STEP
 * bytes of whole slots, each usable as soon as it is done (the last once the group is
 * registered as its fixed buffer), switching after any step to a group a parked load waits
 * for; wakes the loader after each. Ends when every group is ready, or at loader_stop (after
 * the step in hand). Only this thread writes group_state and group_ready. */
static void *populate_main(void *arg)
{
	struct loader *l = arg;
	const struct loader_config *c = &l->cfg;
	pin_to_node(l);
	uint32_t *done_slots = calloc(l->n_groups, sizeof(uint32_t)); /* this thread's */
	if (!done_slots)
		abort(); /* a few KiB at start-up */
	bool warned = false;
	struct populate_pages pages = {0}; /* huge or 4 KiB pages, step by step */
	uint32_t in_hand = UINT32_MAX, next = 0;
	for (uint32_t finished = 0; finished < l->n_groups;) {
		if (atomic_load_explicit(&l->populate_stop, memory_order_relaxed))
			break;
		const uint32_t g = next_group(l, in_hand, &next);
		if (g == UINT32_MAX)
			break; /* none left (finished < n_groups says otherwise) */
		if (atomic_load_explicit(&l->group_state[g], memory_order_relaxed) == GROUP_COLD) {
			atomic_store_explicit(&l->group_state[g], GROUP_POPULATING,
			                      memory_order_relaxed);
			if (c->populate_hook) /* tests: may hold this thread here */
				c->populate_hook(c->populate_arg, c->node, g);
		}
		uint32_t first, count;
		group_slots(l, g, &first, &count);
		const size_t slot_bytes = slot_pool_slot_bytes(c->pool, first);
		const uint32_t step = slot_bytes >= POPULATE_STEP ? 1 : POPULATE_STEP / slot_bytes;
		const uint32_t n = count - done_slots[g] < step ? count - done_slots[g] : step;
		const uint64_t t0 = monotonic_ns();
		const bool huge = !c->pool_pages_auto || populate_pages_huge(&pages);
		slot_pool_populate(c->pool,
		                   (size_t)(slot_pool_addr(c->pool, first) - c->pool->base) +
		                       done_slots[g] * slot_bytes,
		                   (size_t)n * slot_bytes, huge);
		const uint64_t t1 = monotonic_ns();
		populate_pages_note(&pages, huge, (uint64_t)n * slot_bytes, t1 - t0);
		if (!huge && c->pool->thp_advised && !c->pool->hugetlb)
			stat_add(&c->io->populated_small_bytes, (uint64_t)n * slot_bytes);
		done_slots[g] += n;
		uint8_t state = GROUP_POPULATING;
		if (done_slots[g] == count)
			state = register_group(l, g, &warned);
		stat_add(&c->io->populate_ns, monotonic_ns() - t0);
		if (done_slots[g] < count) { /* the last step's slots: once registered */
			atomic_store_explicit(&l->group_ready[g], done_slots[g],
			                      memory_order_release);
			in_hand = g;
		} else {
			stat_add(&c->io->populated_groups, 1);
			atomic_store_explicit(&l->group_state[g], state, memory_order_release);
			atomic_store_explicit(&l->group_ready[g], count, memory_order_release);
			in_hand = UINT32_MAX;
			finished++;
		}
		loader_wake(l);
	}
	free(done_slots);
	return NULL;
}

struct loader *loader_start(const struct loader_config *config, struct sidecar_error *err)
{
	struct loader *l = calloc(1, sizeof(*l));
	if (!l) {
		error_set(err, MOE_ENOMEM, "loader: out of memory");
		return NULL;
	}
	l->cfg = *config;
	l->wake_fd = -1;
	l->depth = config->queue_depth;
	l->n_slots = config->pool->n_slots;
	if (pthread_mutex_init(&l->layout_mu, NULL) != 0) {
		free(l);
		error_set(err, MOE_ESYS, "loader: pthread_mutex_init failed");
		return NULL;
	}
	if (pthread_cond_init(&l->layout_cv, NULL) != 0) {
		pthread_mutex_destroy(&l->layout_mu);
		free(l);
		error_set(err, MOE_ESYS, "loader: pthread_cond_init failed");
		return NULL;
	}
	l->layout_sync_ready = true;
	if (loader_setup(l, err) != 0) {
		loader_stop(l);
		return NULL;
	}
	warm_numa_cache(l);
	int rc = 0;
	if (config->post_load) {
		rc = pthread_create(&l->layout_thread, NULL, layout_main, l);
		l->layout_started = rc == 0;
	}
	if (!rc) {
		rc = pthread_create(&l->populate_thread, NULL, populate_main, l);
		l->populate_started = rc == 0;
	}
	if (!rc) {
		rc = pthread_create(&l->thread, NULL, loader_main, l);
		l->thread_started = rc == 0;
	}
	if (rc) {
		error_set(err, MOE_ESYS, "loader: pthread_create: %s", strerror(rc));
		loader_stop(l);
		return NULL;
	}
	return l;
}

void loader_stop(struct loader *l)
{
	if (!l)
		return;
	atomic_store_explicit(&l->populate_stop, true, memory_order_relaxed);
	if (l->thread_started) {
		loader_wake(l);
		pthread_join(l->thread, NULL);
	}
	if (l->populate_started)
		pthread_join(l->populate_thread, NULL);
	if (l->layout_started) { /* after the loader: nothing more comes to it */
		pthread_mutex_lock(&l->layout_mu);
		l->layout_stop = true;
		pthread_cond_signal(&l->layout_cv);
		pthread_mutex_unlock(&l->layout_mu);
		pthread_join(l->layout_thread, NULL);
	}
	if (l->layout_sync_ready) {
		pthread_cond_destroy(&l->layout_cv);
		pthread_mutex_destroy(&l->layout_mu);
	}
	if (l->ring_ready)
		io_uring_queue_exit(&l->ring);
	if (l->wake_fd >= 0)
		close(l->wake_fd);
	free(l->ops);
	free(l->free_ops);
	free(l->loads);
	free(l->jobs);
	free(l->issue_demand.slots);
	free(l->issue_prefetch.slots);
	free(l->parked.slots);
	free(l->layout_q);
	free((void *)l->group_state);
	free((void *)l->group_wanted);
	free((void *)l->group_ready);
	free(l->group_order);
	free(l);
}
