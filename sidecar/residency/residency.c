/* residency.c — the expert state machine (see residency.h): demands, prefetches, eviction
 * through the policy, waiting on loads in flight, counters, for every node at once. The I/O
 * itself is loader.c's, one loader per node, which this file drives through loader.h and
 * answers through its loader_ops (take_work, load_done, drop_queued): the loader calls no
 * other function of this file.
 *
 * Invariants (asserted): an expert with readers is RESIDENT; a slot belongs to exactly one
 * LOADING or RESIDENT expert, on every node; the policy holds exactly the LOADING and
 * RESIDENT experts that are not pinned; slots in use ≤ pool slots, so each node's bytes ≤ its
 * share of the budget. A LOADING expert's `pending` bits are the nodes still reading it; it
 * leaves LOADING only when none is, so no node ever writes into a freed slot.
 */
#include "residency.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "residency_internal.h"

#define DEFAULT_BACKOFF_MS 1000u
#define DEFAULT_BACKOFF_MAX_MS 60000u
#define FAILURE_LOG_NS 10000000000ull /* one warning about failed loads per 10 s at most */

static_assert(LOADER_LAT_BUCKETS == RESIDENCY_LAT_BUCKETS, "the loader's latency buckets");

static void warn_failure(struct residency *r, uint32_t id, bool retry, uint32_t failed_loads);

uint64_t residency_backoff_ms(const struct residency_config *c, uint32_t failed_loads)
{
	if (c->retry_backoff_ms == RESIDENCY_NO_BACKOFF || failed_loads == 0)
		return 0;
	const uint64_t first = c->retry_backoff_ms ? c->retry_backoff_ms : DEFAULT_BACKOFF_MS;
	const uint64_t max =
	    c->retry_backoff_max_ms ? c->retry_backoff_max_ms : DEFAULT_BACKOFF_MAX_MS;
	const uint32_t doublings = failed_loads - 1 < 32 ? failed_loads - 1 : 32;
	const uint64_t b = first << doublings;
	return b < max && b >> doublings == first ? b : (max > first ? max : first);
}

/* Under lock: FAILED → COLD. */
static void leave_failed(struct residency *r, struct expert_entry *e)
{
	assert(e->state == EXPERT_FAILED && r->stats.failed_now > 0);
	e->state = EXPERT_COLD;
	e->error = 0;
	e->post_load_failed = 0;
	r->stats.failed_now--;
}

/* Queues (under lock). */
static void id_queue_push(struct id_queue *q, uint32_t id)
{
	assert(q->count < q->cap);
	q->ids[(q->head + q->count++) % q->cap] = id;
}

static bool id_queue_pop(struct id_queue *q, uint32_t *id)
{
	if (!q->count)
		return false;
	*id = q->ids[q->head];
	q->head = (q->head + 1) % q->cap;
	q->count--;
	return true;
}

static bool may_evict(void *arg, uint32_t id)
{
	const struct residency *r = arg;
	const struct expert_entry *e = &r->entries[id];
	return e->state == EXPERT_RESIDENT && e->refs == 0 && e->waiters == 0;
}

/* A prefetched expert not used yet was hinted for an upcoming layer: it is worth at least what
 * another prefetch brings, so no prefetch evicts it (prefetches of one hint evicting each other
 * waste both reads). Demands may: the policy ages a wrong hint out like any other expert. */
static bool may_evict_unhinted(void *arg, uint32_t id)
{
	const struct residency *r = arg;
	return may_evict(arg, id) && !r->entries[id].prefetched;
}

/* The bytes of an expert's extents on one node, as in the model files. */
static uint64_t expert_bytes(const struct residency *r, uint32_t node, uint32_t id)
{
	uint32_t n;
	const struct expert_extent *ext = expert_map_extents(r->node[node].map, id, &n);
	uint64_t bytes = 0;
	for (uint32_t i = 0; i < n; i++)
		bytes += ext[i].length;
	return bytes;
}

/* The free list of slot indices: node 0's pool's (slot s is slot s on every node). */
static struct slot_pool *free_list(struct residency *r)
{
	return &r->node[0].pool;
}

/* Under lock: RESIDENT, unreferenced → COLD, on every node at once. */
static void evict(struct residency *r, uint32_t id)
{
	struct expert_entry *e = &r->entries[id];
	assert(e->state == EXPERT_RESIDENT && e->refs == 0 && e->waiters == 0);
	for (uint32_t n = 0; n < r->n_nodes; n++)
		r->node[n].resident_bytes -= expert_bytes(r, n, id);
	policy_remove(residency_policy_of(r, id), id);
	slot_pool_put(free_list(r), e->slot);
	e->slot = SLOT_NONE;
	e->state = EXPERT_COLD;
	if (e->prefetched)
		stat_add(&r->stats.prefetch_wasted, 1);
	e->prefetched = 0;
	stat_add(&r->stats.evictions, 1);
}

/* Under lock: is some node's prefetch queue full? */
static bool prefetch_queue_full(const struct residency *r)
{
	for (uint32_t n = 0; n < r->n_nodes; n++)
		if (r->node[n].prefetch.count >= r->node[n].prefetch.cap)
			return true;
	return false;
}

/* Under lock: frees room by the policy's choice (its class's policy: the victim frees a slot
 * of the class), takes a slot, COLD → LOADING, queues the load on every node. -EAGAIN when
 * nothing may be evicted now. */
static int start_load(struct residency *r, uint32_t id, float score, bool prefetch, float priority)
{
	struct expert_entry *e = &r->entries[id];
	struct residency_policy *policy = residency_policy_of(r, id);
	assert(e->state == EXPERT_COLD);
	if (prefetch && prefetch_queue_full(r))
		return -EAGAIN;
	const uint32_t v =
	    prefetch ? policy_make_room_prefetch(policy, id, priority, may_evict_unhinted, r)
	             : policy_make_room(policy, id, may_evict, r);
	if (v == POLICY_FULL)
		return -EAGAIN;
	if (v != POLICY_NONE) {
		assert(r->class_of[v] == r->class_of[id]);
		evict(r, v);
	}
	uint32_t slot = slot_pool_get(free_list(r), r->class_of[id]);
	if (slot == SLOT_NONE)
		return -EAGAIN; /* pinned experts beyond their reservation: cannot happen */
	e->slot = slot;
	e->state = EXPERT_LOADING;
	if (e->failed_loads)
		stat_add(&r->stats.failed_retries, 1);
	const uint8_t all = (uint8_t)((1u << r->n_nodes) - 1u);
	e->queued = e->pending = all;
	e->prefetched = prefetch;
	e->error = 0;
	policy_insert(policy, id, prefetch ? -1.0f : score);
	if (prefetch)
		policy_hint(policy, id, priority);
	for (uint32_t n = 0; n < r->n_nodes; n++)
		id_queue_push(prefetch ? &r->node[n].prefetch : &r->node[n].demand, id);
	return 0;
}

/* Under lock, when node's part of an expert's load ends (error 0: its slice is in its slot).
 * post_load_msg (NULL for read errors): the post-load hook failed with this message. When
 * every node's part has ended the expert becomes RESIDENT, or FAILED with the first node's
 * error; returns that error when this call made it FAILED (the caller warns), else 0. */
static int load_done(struct residency *r, uint32_t node, uint32_t id, int error, uint32_t file,
                     uint64_t offset, uint32_t attempts, const char *post_load_msg)
{
	struct expert_entry *e = &r->entries[id];
	const uint8_t bit = (uint8_t)(1u << node);
	assert(e->state == EXPERT_LOADING && e->refs == 0 && (e->pending & bit));
	e->pending &= (uint8_t)~bit;
	if (error && !e->error) { /* the first node's error is the expert's */
		e->error = error;
		e->error_node = (uint8_t)node;
		e->error_file = file;
		e->error_offset = offset;
		e->error_attempts = attempts;
		e->post_load_failed = 0;
		if (post_load_msg && r->post_load_msg) {
			snprintf(r->post_load_msg[id], sizeof(r->post_load_msg[id]), "%s",
			         post_load_msg);
			e->post_load_failed = 1;
		}
	}
	if (e->pending)
		return 0; /* other nodes still read their slices */
	error = e->error;
	if (error) {
		policy_remove(residency_policy_of(r, id), id);
		slot_pool_put(free_list(r), e->slot);
		e->slot = SLOT_NONE;
		e->state = EXPERT_FAILED;
		e->prefetched = 0;
		if (e->failed_loads < UINT32_MAX)
			e->failed_loads++;
		e->retry_at_ns =
		    monotonic_ns() + residency_backoff_ms(&r->config, e->failed_loads) * 1000000u;
		r->stats.failed_now++;
		stat_add(&r->stats.failures, 1);
	} else {
		e->state = EXPERT_RESIDENT;
		e->failed_loads = 0;
		e->post_load_failed = 0;
		for (uint32_t n = 0; n < r->n_nodes; n++)
			r->node[n].resident_bytes += expert_bytes(r, n, id);
		stat_add(&r->stats.loads, 1);
	}
	e->queued = 0;
	pthread_cond_broadcast(&r->changed);
	return error;
}

/* loader_ops.take_work: node's queued loads, demands first; -1 once stopping. */
static int loader_take_work(void *owner, uint32_t node, struct loader_job *jobs, uint32_t max)
{
	struct residency *r = owner;
	struct id_queue *queues[2] = {&r->node[node].demand, &r->node[node].prefetch};
	const uint8_t bit = (uint8_t)(1u << node);
	uint32_t n = 0;
	pthread_mutex_lock(&r->lock);
	if (r->stopping) {
		pthread_mutex_unlock(&r->lock);
		return -1;
	}
	for (int q = 0; q < 2; q++) {
		uint32_t id;
		while (n < max && id_queue_pop(queues[q], &id)) {
			struct expert_entry *e = &r->entries[id];
			if (!(e->queued & bit) || e->state != EXPERT_LOADING)
				continue; /* picked up already (a promoted prefetch) */
			e->queued &= (uint8_t)~bit;
			jobs[n++] = (struct loader_job){.id = id,
			                                .slot = e->slot,
			                                .failed_loads = e->failed_loads,
			                                .demand = q == 0};
		}
	}
	pthread_mutex_unlock(&r->lock);
	return (int)n;
}

/* loader_ops.load_done: publishes node's part of a load; warns (after the lock) when the
 * expert became FAILED. */
static void loader_load_done(void *owner, uint32_t node, const struct loader_result *res)
{
	struct residency *r = owner;
	pthread_mutex_lock(&r->lock);
	const int error = load_done(r, node, res->id, res->error, res->file, res->offset,
	                            res->attempts, res->post_load_msg);
	const uint32_t failed = r->entries[res->id].failed_loads;
	pthread_mutex_unlock(&r->lock);
	if (error && error != -ESHUTDOWN)
		warn_failure(r, res->id, false, failed);
}

/* loader_ops.drop_queued: the loads queued for node that its loader will never pick up. */
static void loader_drop_queued(void *owner, uint32_t node)
{
	struct residency *r = owner;
	struct node_part *p = &r->node[node];
	const uint8_t bit = (uint8_t)(1u << node);
	uint32_t id;
	pthread_mutex_lock(&r->lock);
	while (id_queue_pop(&p->demand, &id) || id_queue_pop(&p->prefetch, &id)) {
		struct expert_entry *e = &r->entries[id];
		if ((e->queued & bit) && e->state == EXPERT_LOADING) {
			e->queued &= (uint8_t)~bit;
			load_done(r, node, id, -ESHUTDOWN, 0, 0, 0, NULL);
		}
	}
	pthread_mutex_unlock(&r->lock);
}

static const struct loader_ops loader_ops = {
    .take_work = loader_take_work,
    .load_done = loader_load_done,
    .drop_queued = loader_drop_queued,
};

/* New work queued for every node (without the lock). */
static void wake_loaders(struct residency *r)
{
	for (uint32_t n = 0; n < r->n_nodes; n++)
		if (r->node[n].loader)
			loader_wake(r->node[n].loader);
}

/* Under lock: may a slot free up, or an expert become evictable, without the caller? Only
 * while some expert is referenced, loading or awaited. When none is and the policy still
 * names no victim, a demand that waited would wait forever: it fails instead (-ENOSPC). */
static bool slot_may_free(const struct residency *r)
{
	for (uint32_t id = 0; id < r->n_ids; id++) {
		const struct expert_entry *e = &r->entries[id];
		if (e->refs || e->waiters || e->state == EXPERT_LOADING)
			return true;
	}
	return false;
}

/* Node `node`'s extents of expert id in slot `slot`. */
static void fill_ref(const struct residency *r, uint32_t node, uint32_t id, uint32_t slot_index,
                     struct expert_ref *ref)
{
	const struct node_part *p = &r->node[node];
	uint32_t n;
	const struct expert_extent *ext = expert_map_extents(p->map, id, &n);
	const uint8_t *slot = slot_pool_addr(&p->pool, slot_index);
	ref->layer = id / r->n_experts;
	ref->expert = id % r->n_experts;
	ref->slot = slot_index;
	ref->n_extents = n;
	for (uint32_t i = 0; i < n; i++) {
		const struct extent_layout *l = &p->layout[(size_t)id * EXPERT_MAX_EXTENTS + i];
		ref->data[i] = slot + l->slot_offset + l->data_skip;
		ref->length[i] = ext[i].length;
	}
}

int residency_ref_node(const struct residency *r, const struct expert_ref *ref, uint32_t node,
                       struct expert_ref *out)
{
	if (node >= r->n_nodes || ref->layer >= r->n_layers || ref->expert >= r->n_experts)
		return -EINVAL;
	/* The slot cannot change while ref is held, and the layouts never change: no lock. */
	fill_ref(r, node, residency_id(r, ref->layer, ref->expert), ref->slot, out);
	return 0;
}

int residency_acquire(struct residency *r, uint32_t layer, uint32_t expert, float score,
                      unsigned flags, struct expert_ref *ref)
{
	if (layer >= r->n_layers || expert >= r->n_experts)
		return -EINVAL;
	const uint32_t id = residency_id(r, layer, expert);
	struct expert_entry *e = &r->entries[id];
	bool counted = (flags & RESIDENCY_RETRY) != 0, wake = false;
	uint32_t retried = 0; /* the failures in a row of a FAILED expert this demand reads again */
	int rc;
	pthread_mutex_lock(&r->lock);
	for (;;) {
		if (r->stopping) {
			rc = -ESHUTDOWN;
			break;
		}
		if (wake) { /* poke the loader without the lock; the waiter count pins the expert */
			e->waiters++;
			pthread_mutex_unlock(&r->lock);
			wake_loaders(r);
			pthread_mutex_lock(&r->lock);
			e->waiters--;
			wake = false;
			continue;
		}
		if (e->masked) {
			rc = -EPERM;
			break;
		}
		if (e->state == EXPERT_RESIDENT) {
			e->refs++;
			if (!counted)
				stat_add(&r->stats.hits, 1);
			if (e->prefetched) {
				stat_add(&r->stats.prefetch_hits, 1);
				e->prefetched = 0;
			}
			if (!counted)
				policy_access(residency_policy_of(r, id), id, score);
			fill_ref(r, 0, id, e->slot, ref);
			rc = 0;
			break;
		}
		if (e->state == EXPERT_FAILED) {
			/* A demand reads a FAILED expert again once: when it is new (not the
			 * follow-up of one that already started or awaited a load: RETRY) and
			 * the backoff is over. Within the backoff, no I/O. */
			if (counted || monotonic_ns() < e->retry_at_ns) {
				rc = e->error;
				break;
			}
			leave_failed(r, e); /* the backoff is over: this demand reads again */
			retried = e->failed_loads;
			continue;
		}
		if (e->state == EXPERT_LOADING) {
			if (!counted) {
				stat_add(&r->stats.inflight_misses, 1);
				counted = true;
				policy_access(residency_policy_of(r, id), id, score);
			}
			if (e->prefetched) {
				stat_add(&r->stats.prefetch_hits, 1);
				e->prefetched = 0;
				if (e->queued) { /* not picked up yet (on some node): demand
					            it there, ahead of prefetches */
					for (uint32_t n = 0; n < r->n_nodes; n++)
						if (e->queued & (1u << n))
							id_queue_push(&r->node[n].demand, id);
					wake = true;
					continue;
				}
			}
			if (flags & RESIDENCY_NOWAIT) {
				rc = -EINPROGRESS;
				break;
			}
			e->waiters++; /* keeps it from eviction between load and our reference */
			pthread_cond_wait(&r->changed, &r->lock);
			e->waiters--;
			continue;
		}
		/* COLD */
		rc = start_load(r, id, score, false, 0);
		if (rc == 0) {
			if (!counted)
				stat_add(&r->stats.cold_misses, 1);
			counted = true;
			wake = true;
			continue;
		}
		if (flags & RESIDENCY_NOWAIT)
			break; /* -EAGAIN: every slot is in use */
		if (!slot_may_free(r)) {
			rc = -ENOSPC; /* waiting would be forever */
			break;
		}
		r->slot_waiters++;
		pthread_cond_wait(&r->changed, &r->lock);
		r->slot_waiters--;
	}
	pthread_mutex_unlock(&r->lock);
	if (retried)
		warn_failure(r, id, true, retried);
	return rc;
}

/* Under lock: lets ref's reference go. */
static void release_locked(struct residency *r, const struct expert_ref *ref)
{
	const uint32_t id = residency_id(r, ref->layer, ref->expert);
	struct expert_entry *e = &r->entries[id];
	assert(e->state == EXPERT_RESIDENT && e->refs > 0 && e->slot == ref->slot);
	e->refs--;
	if (e->refs == 0 && e->waiters == 0 && e->masked)
		evict(r, id);
	if (e->refs == 0 && r->slot_waiters)
		pthread_cond_broadcast(&r->changed);
}

void residency_release(struct residency *r, struct expert_ref *ref)
{
	pthread_mutex_lock(&r->lock);
	release_locked(r, ref);
	pthread_mutex_unlock(&r->lock);
	memset(ref, 0, sizeof(*ref));
}

int residency_prefetch(struct residency *r, uint32_t layer, const uint32_t *experts, uint32_t n,
                       float priority)
{
	if (layer >= r->n_layers)
		return -EINVAL;
	int started = 0;
	pthread_mutex_lock(&r->lock);
	for (uint32_t i = 0; i < n && !r->stopping; i++) {
		if (experts[i] >= r->n_experts)
			continue;
		uint32_t id = residency_id(r, layer, experts[i]);
		struct expert_entry *e = &r->entries[id];
		if (e->masked || e->state != EXPERT_COLD ||
		    policy_is_pinned(residency_policy_of(r, id), id))
			continue;
		if (start_load(r, id, -1.0f, true, priority) == 0) {
			stat_add(&r->stats.prefetches, 1);
			started++;
		} else {
			stat_add(&r->stats.prefetch_dropped, 1);
		}
	}
	pthread_mutex_unlock(&r->lock);
	if (started)
		wake_loaders(r);
	return started;
}

void residency_hint(struct residency *r, uint32_t layer, const uint32_t *experts, uint32_t n,
                    float score)
{
	if (layer >= r->n_layers)
		return;
	pthread_mutex_lock(&r->lock);
	for (uint32_t i = 0; i < n; i++)
		if (experts[i] < r->n_experts) {
			const uint32_t id = residency_id(r, layer, experts[i]);
			policy_hint(residency_policy_of(r, id), id, score);
		}
	pthread_mutex_unlock(&r->lock);
}

int residency_set_gpu_mask(struct residency *r, uint32_t layer, const uint8_t *mask)
{
	if (layer >= r->n_layers)
		return -EINVAL;
	pthread_mutex_lock(&r->lock);
	for (uint32_t x = 0; x < r->n_experts; x++) {
		uint32_t id = residency_id(r, layer, x);
		struct expert_entry *e = &r->entries[id];
		e->masked = mask[x] != 0;
		if (e->masked && may_evict(r, id))
			evict(r, id);
	}
	if (r->slot_waiters)
		pthread_cond_broadcast(&r->changed);
	pthread_mutex_unlock(&r->lock);
	return 0;
}

int residency_warm_pinned(struct residency *r, struct sidecar_error *err)
{
	const uint32_t pinned = r->policy[0].spec.pin_layers;
	struct expert_ref ref;
	/* Start every load first (they run at the loader's full depth), then wait for each. */
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t l = 0; l < pinned; l++)
			for (uint32_t x = 0; x < r->n_experts; x++) {
				int rc = residency_acquire(r, l, x, -1.0f,
				                           pass ? 0 : RESIDENCY_NOWAIT, &ref);
				if (rc == 0) {
					residency_release(r, &ref);
				} else if (rc == -EPERM || (pass == 0 && rc == -EINPROGRESS)) {
					continue;
				} else {
					if (err) {
						err->status = error_status_from_errno(-rc);
						residency_error_message(r, l, x, err->msg,
						                        sizeof(err->msg));
					}
					return -1;
				}
			}
	return 0;
}

enum expert_state residency_state(struct residency *r, uint32_t layer, uint32_t expert)
{
	if (layer >= r->n_layers || expert >= r->n_experts)
		return EXPERT_COLD;
	pthread_mutex_lock(&r->lock);
	enum expert_state s = r->entries[residency_id(r, layer, expert)].state;
	pthread_mutex_unlock(&r->lock);
	return s;
}

void residency_retry_failed(struct residency *r, uint32_t layer, uint32_t expert)
{
	if (layer >= r->n_layers || expert >= r->n_experts)
		return;
	pthread_mutex_lock(&r->lock);
	struct expert_entry *e = &r->entries[residency_id(r, layer, expert)];
	if (e->state == EXPERT_FAILED)
		leave_failed(r, e);
	pthread_mutex_unlock(&r->lock);
}

uint32_t residency_retry_all_failed(struct residency *r)
{
	uint32_t n = 0;
	pthread_mutex_lock(&r->lock);
	for (uint32_t id = 0; id < r->n_ids && r->stats.failed_now; id++)
		if (r->entries[id].state == EXPERT_FAILED) {
			leave_failed(r, &r->entries[id]);
			n++;
		}
	pthread_mutex_unlock(&r->lock);
	return n;
}

/* After the lock is dropped: a warning (rate-limited) that (layer, expert)'s load failed and
 * when it will be read again (retry = false), or that it is being read again (retry = true);
 * failed: the expert's failures in a row, as taken under the lock. */
static void warn_failure(struct residency *r, uint32_t id, bool retry, uint32_t failed)
{
	const uint64_t now = monotonic_ns();
	uint64_t last = atomic_load_explicit(&r->failure_log_ns[retry], memory_order_relaxed);
	if ((last && now - last < FAILURE_LOG_NS) ||
	    !atomic_compare_exchange_strong(&r->failure_log_ns[retry], &last, now)) {
		atomic_fetch_add_explicit(&r->failure_log_skipped[retry], 1, memory_order_relaxed);
		return;
	}
	const uint32_t skipped = atomic_exchange(&r->failure_log_skipped[retry], 0);
	char more[64] = "";
	if (skipped)
		snprintf(more, sizeof(more), " (%u more such line(s) left out)", skipped);
	const uint32_t layer = id / r->n_experts, expert = id % r->n_experts;
	if (retry) {
		log_warn("residency",
		         "layer %u expert %u: reading it again after %u failed load(s)%s", layer,
		         expert, failed, more);
		return;
	}
	char why[256];
	residency_error_message(r, layer, expert, why, sizeof(why));
	const uint64_t backoff = residency_backoff_ms(&r->config, failed);
	if (backoff)
		log_warn(
		    "residency",
		    "%s; FAILED: demands fail at once for the next %llu ms, then the first one "
		    "reads it again (failure %u in a row; SIGHUP ends the wait)%s",
		    why, (unsigned long long)backoff, failed, more);
	else
		log_warn("residency",
		         "%s; FAILED: the next demand reads it again (failure %u in a row)%s", why,
		         failed, more);
}

void residency_error_message(struct residency *r, uint32_t layer, uint32_t expert, char *buf,
                             size_t len)
{
	if (layer >= r->n_layers || expert >= r->n_experts) {
		snprintf(buf, len, "layer %u expert %u: out of range (%u layers × %u experts)",
		         layer, expert, r->n_layers, r->n_experts);
		return;
	}
	pthread_mutex_lock(&r->lock);
	const struct expert_entry *e = &r->entries[residency_id(r, layer, expert)];
	char node[32] = ""; /* which node's slice failed, with several */
	if (r->n_nodes > 1)
		snprintf(node, sizeof(node), " node %u's slice:", e->error_node);
	if (e->masked)
		snprintf(buf, len, "layer %u expert %u: on the GPU (masked), never loaded here",
		         layer, expert);
	else if (e->state != EXPERT_FAILED)
		snprintf(buf, len, "layer %u expert %u: no error", layer, expert);
	else if (e->post_load_failed)
		snprintf(buf, len, "layer %u expert %u:%s after loading: %s", layer, expert, node,
		         r->post_load_msg[residency_id(r, layer, expert)]);
	else if (e->error == -ESHUTDOWN)
		snprintf(buf, len, "layer %u expert %u: load cancelled by shutdown", layer, expert);
	else
		snprintf(buf, len,
		         "%s: layer %u expert %u:%s read at offset %llu failed after %u "
		         "attempt(s): %s",
		         r->map->paths[e->error_file], layer, expert, node,
		         (unsigned long long)e->error_offset, e->error_attempts,
		         e->error == -ENODATA ? "file ends before the expert's data"
		                              : strerror(-e->error));
	pthread_mutex_unlock(&r->lock);
}

/* The expert counters (r->stats), and the I/O counters of nodes [first, end) summed. */
static void load_counters(struct residency *r, uint32_t first, uint32_t end,
                          struct residency_counters *out)
{
	memset(out, 0, sizeof(*out));
#define LOAD(f, scope)                                                                             \
	RESIDENCY_ONLY(EXPERT, scope,                                                              \
	               out->f = atomic_load_explicit(&r->stats.f, memory_order_relaxed);)
	RESIDENCY_COUNTERS(LOAD)
#undef LOAD
#define ADD(f, scope)                                                                              \
	RESIDENCY_ONLY(NODE, scope, out->f += atomic_load_explicit(&p->io.f, memory_order_relaxed);)
	out->hugetlb = out->thp = true;
	for (uint32_t n = first; n < end; n++) {
		const struct node_part *p = &r->node[n];
		RESIDENCY_COUNTERS(ADD)
		for (int i = 0; i < RESIDENCY_LAT_BUCKETS; i++)
			out->latency_us_log2[i] +=
			    atomic_load_explicit(&p->io.latency_us_log2[i], memory_order_relaxed);
		/* the mean slot: exact with one class; slots × slot_bytes is the pool's bytes */
		out->slot_bytes += p->pool.n_slots ? p->pool.slots_bytes / p->pool.n_slots : 0;
		out->budget_bytes += p->budget;
		out->fixed_buffers += loader_fixed_buffers(p->loader);
		out->buffers_registered =
		    n == first ? loader_buffers_registered(p->loader)
		               : out->buffers_registered && loader_buffers_registered(p->loader);
		out->hugetlb = out->hugetlb && p->pool.hugetlb;
		out->thp = out->thp && p->pool.thp_advised;
	}
#undef ADD
	pthread_mutex_lock(&r->lock);
	out->slots = r->n_slots;
	out->slots_used = r->n_slots - free_list(r)->n_free;
#define COPY(f, scope) RESIDENCY_ONLY(LOCKED, scope, out->f = r->stats.f;)
	RESIDENCY_COUNTERS(COPY)
#undef COPY
	for (uint32_t n = first; n < end; n++)
		out->resident_bytes += r->node[n].resident_bytes;
	pthread_mutex_unlock(&r->lock);
}

void residency_counters(struct residency *r, struct residency_counters *out)
{
	load_counters(r, 0, r->n_nodes, out);
	out->budget_bytes = r->config.mem_budget;
}

int residency_node_counters(struct residency *r, uint32_t node, struct residency_counters *out)
{
	if (node >= r->n_nodes)
		return -1;
	load_counters(r, node, node + 1, out);
	return 0;
}

uint32_t residency_n_nodes(const struct residency *r)
{
	return r->n_nodes;
}

/* ---- creation ---- */

int residency_open_file(const char *path, bool no_direct, struct residency_file *out,
                        struct sidecar_error *err)
{
	*out = (struct residency_file){.fd = -1, .buffered = no_direct, .alignment = SLOT_ALIGN};
	int fd = no_direct ? -1 : open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0 && !no_direct && errno == EINVAL) {
		out->direct_refused = true;
		out->buffered = true;
	}
	if (out->buffered)
		fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		return error_set(err, MOE_ESYS, "%s: cannot open: %s", path, strerror(e));
	}
	out->fd = fd;
	struct statx stx;
	if (!out->buffered &&
	    statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN | STATX_SIZE, &stx) == 0 &&
	    (stx.stx_mask & STATX_DIOALIGN)) {
		out->dio_offset_align = stx.stx_dio_offset_align;
		out->dio_mem_align = stx.stx_dio_mem_align;
		uint32_t a = stx.stx_dio_offset_align > stx.stx_dio_mem_align
		                 ? stx.stx_dio_offset_align
		                 : stx.stx_dio_mem_align;
		if (a > out->alignment) {
			if (a & (a - 1) || a > (1u << 21)) {
				close(fd);
				out->fd = -1;
				return error_set(err, MOE_EINVAL,
				                 "%s: unusable direct-I/O alignment %u bytes", path,
				                 a);
			}
			out->alignment = a;
		}
	}
	return 0;
}

static int open_model_files(struct residency *r, struct sidecar_error *err)
{
	const struct expert_map *m = r->map;
	r->alignment = SLOT_ALIGN;
	for (uint32_t f = 0; f < m->n_files; f++) {
		const char *path = m->paths[f];
		struct residency_file rf;
		if (residency_open_file(path, r->config.no_direct, &rf, err) != 0)
			return -1;
		if (rf.direct_refused)
			log_warn("residency",
			         "%s: O_DIRECT not supported here (%s): reading it BUFFERED "
			         "through the page cache",
			         path, strerror(EINVAL));
		r->fds[f] = rf.fd;
		r->buffered[f] = rf.buffered;
		if (rf.buffered)
			stat_add(&r->stats.buffered_files, 1);
		if (rf.alignment > r->alignment)
			r->alignment = rf.alignment;
	}
	if (r->config.no_direct)
		log_info("residency",
		         "reading %u model file%s buffered, through the page cache, as asked "
		         "(--no-direct)",
		         m->n_files, m->n_files == 1 ? "" : "s");
	/* Every extent inside its file. */
	for (uint32_t f = 0; f < m->n_files; f++) {
		struct stat st;
		if (fstat(r->fds[f], &st) != 0) {
			int e = errno;
			return error_set(err, MOE_ESYS, "%s: fstat: %s", m->paths[f], strerror(e));
		}
		for (uint32_t k = 0; k < r->n_nodes * r->n_ids; k++) {
			const uint32_t id = k % r->n_ids;
			uint32_t n;
			const struct expert_extent *ext =
			    expert_map_extents(r->node[k / r->n_ids].map, id, &n);
			for (uint32_t i = 0; i < n; i++)
				if (ext[i].file == f &&
				    ext[i].offset + ext[i].length > (uint64_t)st.st_size)
					return error_set(
					    err, MOE_EINVAL,
					    "%s: layer %u expert %u: extent [%llu, +%llu) beyond "
					    "the end of the file (%llu bytes)",
					    m->paths[f], id / r->n_experts, id % r->n_experts,
					    (unsigned long long)ext[i].offset,
					    (unsigned long long)ext[i].length,
					    (unsigned long long)st.st_size);
		}
	}
	return 0;
}

/* Lays every expert's extents (node's slices) out in a slot, its slot bytes into bytes[id];
 * returns the largest one's. */
static uint64_t compute_layout(struct residency *r, struct node_part *p, uint64_t *bytes)
{
	const uint64_t a = r->alignment;
	uint64_t largest = 0;
	for (uint32_t id = 0; id < r->n_ids; id++) {
		uint32_t n;
		const struct expert_extent *ext = expert_map_extents(p->map, id, &n);
		uint64_t at = 0;
		for (uint32_t i = 0; i < n; i++) {
			uint64_t start = ext[i].offset / a * a;
			uint64_t end = (ext[i].offset + ext[i].length + a - 1) / a * a;
			p->layout[(size_t)id * EXPERT_MAX_EXTENTS + i] = (struct extent_layout){
			    .slot_offset = at,
			    .read_offset = start,
			    .read_length = end - start,
			    .data_skip = ext[i].offset - start,
			};
			/* a post-load conversion's room past the data pointer (expert_extent) */
			const uint64_t kept = ext[i].offset - start + ext[i].room;
			at += kept > end - start ? (kept + a - 1) / a * a : end - start;
		}
		bytes[id] = at;
		if (at > largest)
			largest = at;
	}
	return largest;
}

static int compare_u64(const void *a, const void *b)
{
	const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

/* The slot size classes. An expert's slot bytes (on every node together) differ with its
 * format, and, for experts of one format, by up to a block per extent with each extent's
 * offset (the aligned superset): so classes are runs of sizes, each spanning at most two
 * blocks per extent above its smallest, and a model of one format is one class. Each class's
 * slots are sized for its largest expert on each node. bytes[n * n_ids + id]: expert id's
 * slot bytes on node n. Fills r->class_of, each class's slot bytes per node (sizes) and
 * experts (count); returns the number of classes: 1 for a model of one format, or when there
 * would be more than SLOT_MAX_CLASSES (one class of the largest, as for one format). 0: out
 * of memory. */
static uint32_t plan_classes(struct residency *r, const uint64_t *bytes,
                             uint64_t sizes[SLOT_MAX_CLASSES][RESIDENCY_MAX_NODES],
                             uint32_t count[SLOT_MAX_CLASSES])
{
	uint64_t *total = malloc((size_t)r->n_ids * sizeof(uint64_t));
	if (!total)
		return 0;
	uint64_t span = 0; /* two blocks per extent, on every node */
	for (uint32_t n = 0; n < r->n_nodes; n++) {
		uint32_t most = 1;
		for (uint32_t id = 0; id < r->n_ids; id++)
			if (r->node[n].map->n_extents[id] > most)
				most = r->node[n].map->n_extents[id];
		span += 2ull * r->alignment * most;
	}
	for (uint32_t id = 0; id < r->n_ids; id++) {
		total[id] = 0;
		for (uint32_t n = 0; n < r->n_nodes; n++)
			total[id] += bytes[(size_t)n * r->n_ids + id];
	}
	uint64_t start[SLOT_MAX_CLASSES + 1]; /* class c: totals in [start[c], start[c + 1]) */
	uint32_t n_classes = 0;
	uint64_t *sorted = malloc((size_t)r->n_ids * sizeof(uint64_t));
	if (!sorted) {
		free(total);
		return 0;
	}
	memcpy(sorted, total, (size_t)r->n_ids * sizeof(uint64_t));
	qsort(sorted, r->n_ids, sizeof(uint64_t), compare_u64);
	for (uint32_t i = 0; i < r->n_ids && n_classes <= SLOT_MAX_CLASSES; i++)
		if (!n_classes || sorted[i] > start[n_classes - 1] + span)
			start[n_classes++] = sorted[i];
	free(sorted);
	if (n_classes > SLOT_MAX_CLASSES) {
		log_info("residency",
		         "experts of more than %u sizes: every slot sized for the largest",
		         SLOT_MAX_CLASSES);
		n_classes = 1;
	}
	for (uint32_t c = 0; c < n_classes; c++) {
		count[c] = 0;
		for (uint32_t n = 0; n < r->n_nodes; n++)
			sizes[c][n] = 0;
	}
	for (uint32_t id = 0; id < r->n_ids; id++) {
		uint32_t c = n_classes - 1;
		while (c > 0 && total[id] < start[c])
			c--;
		r->class_of[id] = (uint8_t)c;
		count[c]++;
		for (uint32_t n = 0; n < r->n_nodes; n++)
			if (bytes[(size_t)n * r->n_ids + id] > sizes[c][n])
				sizes[c][n] = bytes[(size_t)n * r->n_ids + id];
	}
	free(total);
	return n_classes;
}

/* One slot of class c on every node, in bytes (SLOT_ALIGN multiples). */
static uint64_t class_expert_bytes(const struct residency *r,
                                   const uint64_t sizes[SLOT_MAX_CLASSES][RESIDENCY_MAX_NODES],
                                   uint32_t c)
{
	uint64_t sum = 0;
	for (uint32_t n = 0; n < r->n_nodes; n++)
		sum += (sizes[c][n] + SLOT_ALIGN - 1) & ~(uint64_t)(SLOT_ALIGN - 1);
	return sum;
}

/* Several classes: splits the budget into each class's slots. Every class first gets the
 * slots its policy needs (its pinned experts, and one for the rest); the remaining bytes go
 * to the classes in proportion to their other experts' slot bytes, so a budget of every
 * expert's slot bytes holds every expert, and half of it about half of each class. No class
 * gets more slots than it has experts. 0, or -1 with err naming the smallest budget that
 * serves. */
static int split_budget(struct residency *r, const struct policy_spec *spec,
                        const uint64_t sizes[SLOT_MAX_CLASSES][RESIDENCY_MAX_NODES],
                        const uint32_t *count, const uint32_t *members, uint32_t *n_slots,
                        struct sidecar_error *err)
{
	const uint64_t budget = r->config.mem_budget;
	uint64_t need_bytes = 0, rest_bytes = 0, all_bytes = 0;
	uint64_t need[SLOT_MAX_CLASSES], bytes[SLOT_MAX_CLASSES];
	for (uint32_t c = 0; c < r->n_classes; c++) {
		bytes[c] = class_expert_bytes(r, sizes, c);
		need[c] = policy_members_slots_needed(spec, r->n_layers, members + c * r->n_layers);
		need_bytes += need[c] * bytes[c];
		rest_bytes += (count[c] - need[c]) * bytes[c];
		all_bytes += count[c] * bytes[c];
	}
	if (budget < need_bytes)
		return error_set(err, MOE_EINVAL,
		                 "residency: a budget of %llu bytes does not serve experts of %u "
		                 "slot sizes (every expert: %llu bytes): each size needs %s "
		                 "one slot; the smallest budget that serves is %llu bytes",
		                 (unsigned long long)budget, r->n_classes,
		                 (unsigned long long)all_bytes,
		                 spec->pin_layers ? "its pinned experts' slots and" : "at least",
		                 (unsigned long long)need_bytes);
	const uint64_t extra = budget - need_bytes;
	uint64_t left = budget;
	for (uint32_t c = 0; c < r->n_classes; c++) {
		uint64_t n = need[c];
		if (rest_bytes)
			n += (uint64_t)((unsigned __int128)extra *
			                ((count[c] - need[c]) * bytes[c]) / rest_bytes / bytes[c]);
		n_slots[c] = (uint32_t)(n < count[c] ? n : count[c]);
		left -= n_slots[c] * bytes[c];
	}
	/* What rounding left: whole slots, to the classes in order. */
	for (uint32_t c = 0; c < r->n_classes; c++) {
		const uint64_t more = left / bytes[c];
		const uint64_t room = count[c] - n_slots[c];
		const uint32_t add = (uint32_t)(more < room ? more : room);
		n_slots[c] += add;
		left -= add * bytes[c];
	}
	return 0;
}

/* Several classes: each node's share of the budget in proportion to its slots' bytes, and
 * its pool of n_slots[c] slots of each class (the same counts on every node). */
static int create_class_pools(struct residency *r,
                              const uint64_t sizes[SLOT_MAX_CLASSES][RESIDENCY_MAX_NODES],
                              const uint32_t *n_slots, struct sidecar_error *err)
{
	const uint64_t budget = r->config.mem_budget;
	uint64_t node_bytes[RESIDENCY_MAX_NODES] = {0}, sum = 0;
	for (uint32_t n = 0; n < r->n_nodes; n++) {
		for (uint32_t c = 0; c < r->n_classes; c++)
			node_bytes[n] += n_slots[c] * ((sizes[c][n] + SLOT_ALIGN - 1) &
			                               ~(uint64_t)(SLOT_ALIGN - 1));
		sum += node_bytes[n];
	}
	uint64_t left = budget;
	char line[512] = "";
	size_t at = 0;
	for (uint32_t n = 0; n < r->n_nodes; n++) {
		struct node_part *p = &r->node[n];
		p->budget = n + 1 == r->n_nodes
		                ? left
		                : (uint64_t)((unsigned __int128)budget * node_bytes[n] / sum);
		left -= p->budget;
		size_t slot_bytes[SLOT_MAX_CLASSES];
		for (uint32_t c = 0; c < r->n_classes; c++)
			slot_bytes[c] = sizes[c][n];
		if (slot_pool_create_ex(&p->pool, p->numa_node, p->budget, slot_bytes, n_slots,
		                        r->n_classes, r->config.shareable_pool, err) != 0)
			return -1;
		if (r->n_nodes > 1 && at < sizeof(line))
			at += (size_t)snprintf(line + at, sizeof(line) - at,
			                       "%snode %u (%llu bytes): ", n ? "; " : "", n,
			                       (unsigned long long)p->budget);
		for (uint32_t c = 0; c < r->n_classes && at < sizeof(line); c++)
			at += (size_t)snprintf(line + at, sizeof(line) - at, "%s%u of %zu bytes",
			                       c ? ", " : "", p->pool.classes[c].n_slots,
			                       p->pool.classes[c].slot_bytes);
	}
	r->n_slots = r->node[0].pool.n_slots;
	log_info("residency",
	         "budget %llu bytes over %u slot sizes (a mix of formats): %u slots: %s",
	         (unsigned long long)budget, r->n_classes, r->n_slots, line);
	return 0;
}

void residency_set_fault_hook(struct residency *r, loader_fault_fn hook, void *arg)
{
	for (uint32_t n = 0; n < r->n_nodes; n++)
		loader_set_fault_hook(r->node[n].loader, hook, arg);
}

/* The node maps must describe the same files and experts: the files are opened once. */
static int check_node_maps(const struct residency_node *nodes, uint32_t n_nodes,
                           struct sidecar_error *err)
{
	const struct expert_map *m0 = nodes[0].map;
	for (uint32_t n = 1; n < n_nodes; n++) {
		const struct expert_map *m = nodes[n].map;
		bool same = m->n_layers == m0->n_layers && m->n_experts == m0->n_experts &&
		            m->n_files == m0->n_files;
		for (uint32_t f = 0; same && f < m->n_files; f++)
			same = strcmp(m->paths[f], m0->paths[f]) == 0;
		if (!same)
			return error_set(err, MOE_EINVAL,
			                 "residency: node %u's map differs from node 0's (layers, "
			                 "experts or files)",
			                 n);
	}
	return 0;
}

/* Splits the budget over the nodes in proportion to their slot bytes, so that each holds
 * the same number of slots (an expert is resident on all or on none); creates the pools. */
static int create_pools(struct residency *r, const uint64_t *slot_bytes, struct sidecar_error *err)
{
	const uint64_t budget = r->config.mem_budget;
	uint64_t sum = 0;
	for (uint32_t n = 0; n < r->n_nodes; n++)
		sum += (slot_bytes[n] + SLOT_ALIGN - 1) & ~(uint64_t)(SLOT_ALIGN - 1);
	const uint64_t slots = budget / sum;
	if (r->n_nodes > 1 && slots == 0)
		return error_set(
		    err, MOE_EINVAL,
		    "residency: a budget of %llu bytes holds no expert: one expert's slices "
		    "take %llu bytes of slots over %u nodes; the smallest budget that serves "
		    "is %llu bytes",
		    (unsigned long long)budget, (unsigned long long)sum, r->n_nodes,
		    (unsigned long long)sum);
	uint64_t left = budget;
	for (uint32_t n = 0; n < r->n_nodes; n++) {
		struct node_part *p = &r->node[n];
		p->budget = n + 1 == r->n_nodes
		                ? left
		                : (uint64_t)((unsigned __int128)budget * slot_bytes[n] / sum);
		left -= p->budget;
		/* One node: its whole budget; several: exactly the common count of slots. */
		const uint64_t pool_bytes =
		    r->n_nodes == 1
		        ? p->budget
		        : slots * ((slot_bytes[n] + SLOT_ALIGN - 1) & ~(uint64_t)(SLOT_ALIGN - 1));
		if (slot_pool_create_one(&p->pool, p->numa_node, pool_bytes, slot_bytes[n],
		                         r->config.shareable_pool, err) != 0)
			return -1;
		p->pool.budget = p->budget;
	}
	r->n_slots = r->node[0].pool.n_slots;
	if (r->n_nodes > 1) {
		char line[512];
		size_t at = 0;
		for (uint32_t n = 0; n < r->n_nodes && at < sizeof(line); n++)
			at +=
			    (size_t)snprintf(line + at, sizeof(line) - at,
			                     "%s node %u: %llu bytes (%u slots of %zu bytes)",
			                     n ? ";" : "", n, (unsigned long long)r->node[n].budget,
			                     r->node[n].pool.n_slots, r->node[n].pool.slot_bytes);
		log_info("residency",
		         "budget %llu bytes over %u nodes in proportion to their slices:%s",
		         (unsigned long long)budget, r->n_nodes, line);
	}
	return 0;
}

/* Lays the experts out in slots, plans the size classes, creates every node's pool and each
 * class's policy. 0, or -1 with err (a budget too small names the smallest that serves). */
static int create_slots(struct residency *r, const struct policy_spec *spec,
                        struct sidecar_error *err)
{
	const uint32_t n_nodes = r->n_nodes;
	uint64_t *bytes = malloc((size_t)n_nodes * r->n_ids * sizeof(uint64_t));
	r->class_of = calloc(r->n_ids, 1);
	uint32_t *members = NULL;
	if (!bytes || !r->class_of) {
		free(bytes);
		return error_set(err, MOE_ENOMEM, "residency: out of memory for %u experts",
		                 r->n_ids);
	}
	uint64_t slot_bytes[RESIDENCY_MAX_NODES];
	for (uint32_t n = 0; n < n_nodes; n++)
		slot_bytes[n] = compute_layout(r, &r->node[n], bytes + (size_t)n * r->n_ids);
	uint64_t sizes[SLOT_MAX_CLASSES][RESIDENCY_MAX_NODES];
	uint32_t count[SLOT_MAX_CLASSES];
	r->n_classes = plan_classes(r, bytes, sizes, count);
	free(bytes);
	if (!r->n_classes)
		return error_set(err, MOE_ENOMEM, "residency: out of memory for %u experts",
		                 r->n_ids);
	if (spec->pin_layers > r->n_layers) { /* policy_create says why */
		r->n_classes = 1;
		memset(r->class_of, 0, r->n_ids);
	}
	if (r->n_classes > 1) {
		/* members[c * n_layers + l]: layer l's experts of class c */
		uint32_t n_slots[SLOT_MAX_CLASSES];
		members = calloc((size_t)r->n_classes * r->n_layers, sizeof(uint32_t));
		if (!members)
			return error_set(err, MOE_ENOMEM, "residency: out of memory for %u classes",
			                 r->n_classes);
		for (uint32_t id = 0; id < r->n_ids; id++)
			members[r->class_of[id] * r->n_layers + id / r->n_experts]++;
		int rc = split_budget(r, spec, sizes, count, members, n_slots, err);
		if (rc == 0)
			rc = create_class_pools(r, sizes, n_slots, err);
		for (uint32_t c = 0; rc == 0 && c < r->n_classes; c++)
			rc = policy_create_members(&r->policy[c], spec, r->n_layers, r->n_experts,
			                           n_slots[c], members + c * r->n_layers, err);
		free(members);
		return rc;
	}
	if (create_pools(r, slot_bytes, err) != 0)
		return -1;
	if (policy_create(&r->policy[0], spec, r->n_layers, r->n_experts, r->n_slots, 0, err) !=
	    0) {
		const uint64_t need = policy_slots_needed(spec, r->n_layers, r->n_experts, 0);
		if (spec->pin_layers > r->n_layers || need <= r->n_slots)
			return -1;         /* not the budget */
		uint64_t expert_slots = 0; /* one expert's slots on every node */
		for (uint32_t n = 0; n < n_nodes; n++)
			expert_slots += r->node[n].pool.slot_bytes;
		const size_t used = err ? strlen(err->msg) : sizeof(err->msg);
		if (err && used < sizeof(err->msg))
			snprintf(err->msg + used, sizeof(err->msg) - used,
			         " (a budget of %llu bytes: %u slots of %llu bytes); the smallest "
			         "budget that serves this policy is %llu bytes",
			         (unsigned long long)r->config.mem_budget, r->n_slots,
			         (unsigned long long)expert_slots,
			         (unsigned long long)(need * expert_slots));
		return -1;
	}
	return 0;
}

int residency_create(struct residency **out, const struct expert_map *map,
                     const struct residency_config *config, struct sidecar_error *err)
{
	const struct residency_node node = {
	    .map = map, .numa_node = config->numa_node, .post_load_arg = config->post_load_arg};
	return residency_create_nodes(out, &node, 1, config, err);
}

int residency_create_nodes(struct residency **out, const struct residency_node *nodes,
                           uint32_t n_nodes, const struct residency_config *config,
                           struct sidecar_error *err)
{
	return residency_create_nodes_held(out, nodes, n_nodes, config, NULL, NULL, err);
}

int residency_create_nodes_held(struct residency **out, const struct residency_node *nodes,
                                uint32_t n_nodes, const struct residency_config *config,
                                loader_populate_fn populate_hook, void *populate_arg,
                                struct sidecar_error *err)
{
	*out = NULL;
	if (n_nodes == 0 || n_nodes > RESIDENCY_MAX_NODES)
		return error_set(err, MOE_EINVAL, "residency: %u nodes (1 to %u)", n_nodes,
		                 RESIDENCY_MAX_NODES);
	if (check_node_maps(nodes, n_nodes, err) != 0)
		return -1;
	const struct expert_map *map = nodes[0].map;
	struct residency *r = calloc(1, sizeof(*r));
	if (!r)
		return error_set(err, MOE_ENOMEM, "residency: out of memory");
	r->map = map;
	r->n_nodes = n_nodes;
	r->config = *config;
	if (!r->config.policy)
		r->config.policy = POLICY_DEFAULT_SPEC;
	if (!r->config.chunk_bytes)
		r->config.chunk_bytes = 1u << 20;
	if (!r->config.queue_depth)
		r->config.queue_depth = 32;
	if (!r->config.read_timeout_ms)
		r->config.read_timeout_ms = 10000;
	if (r->config.queue_depth > 4096 || r->config.max_retries > 1000) {
		error_set(err, MOE_EINVAL,
		          "residency: queue depth %u (max 4096) or retries %u (max "
		          "1000) out of range",
		          r->config.queue_depth, r->config.max_retries);
		free(r);
		return -1;
	}
	r->n_layers = map->n_layers;
	r->n_experts = map->n_experts;
	r->n_ids = map->n_layers * map->n_experts;
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->changed, NULL);
	r->entries = calloc(r->n_ids, sizeof(*r->entries));
	r->fds = malloc(map->n_files * sizeof(int));
	r->buffered = calloc(map->n_files, sizeof(bool));
	if (config->post_load)
		r->post_load_msg = calloc(r->n_ids, sizeof(*r->post_load_msg));
	bool layouts = true;
	for (uint32_t n = 0; n < n_nodes; n++) {
		r->node[n] = (struct node_part){.map = nodes[n].map,
		                                .numa_node = nodes[n].numa_node,
		                                .post_load_arg = nodes[n].post_load_arg};
		r->node[n].layout =
		    calloc((size_t)r->n_ids * EXPERT_MAX_EXTENTS, sizeof(*r->node[n].layout));
		layouts = layouts && r->node[n].layout;
	}
	if (!r->entries || !layouts || !r->fds || !r->buffered ||
	    (config->post_load && !r->post_load_msg)) {
		error_set(err, MOE_ENOMEM, "residency: out of memory for %u experts", r->n_ids);
		goto fail;
	}
	for (uint32_t f = 0; f < map->n_files; f++)
		r->fds[f] = -1;
	for (uint32_t id = 0; id < r->n_ids; id++) {
		r->entries[id].slot = SLOT_NONE;
		for (uint32_t n = 0; n < n_nodes; n++)
			if (!nodes[n].map->n_extents[id]) {
				error_set(err, MOE_EINVAL,
				          "residency: layer %u expert %u has no bytes in node %u's "
				          "map",
				          id / r->n_experts, id % r->n_experts, n);
				goto fail;
			}
	}
	if (open_model_files(r, err) != 0)
		goto fail;
	if (r->config.chunk_bytes % r->alignment)
		r->config.chunk_bytes = (r->config.chunk_bytes / r->alignment + 1) * r->alignment;
	struct policy_spec spec;
	if (policy_spec_parse(r->config.policy, &spec, err) != 0)
		goto fail;
	if (create_slots(r, &spec, err) != 0)
		goto fail;
	for (uint32_t n = 0; n < n_nodes; n++) {
		struct node_part *p = &r->node[n];
		p->demand.cap = r->n_ids;
		p->prefetch.cap = r->n_slots;
		p->demand.ids = malloc(p->demand.cap * sizeof(uint32_t));
		p->prefetch.ids = malloc(p->prefetch.cap * sizeof(uint32_t));
		if (!p->demand.ids || !p->prefetch.ids) {
			error_set(err, MOE_ENOMEM, "residency: out of memory for the load queues");
			goto fail;
		}
	}
	for (uint32_t n = 0; n < n_nodes; n++) {
		struct node_part *p = &r->node[n];
		const struct loader_config lc = {
		    .node = n,
		    .numa_node = p->numa_node,
		    .pin_to_node = n_nodes > 1,
		    .n_experts = r->n_experts,
		    .map = p->map,
		    .layout = p->layout,
		    .pool = &p->pool,
		    .fds = r->fds,
		    .buffered = r->buffered,
		    .alignment = r->alignment,
		    .chunk_bytes = r->config.chunk_bytes,
		    .queue_depth = r->config.queue_depth,
		    .max_retries = r->config.max_retries,
		    .read_timeout_ms = r->config.read_timeout_ms,
		    .fixed_buffer_max = r->config.fixed_buffer_max,
		    .no_register_buffers = r->config.no_register_buffers,
		    .pool_pages_auto = r->config.pool_pages_auto,
		    .post_load = r->config.post_load,
		    .post_load_arg = p->post_load_arg,
		    .populate_hook = populate_hook,
		    .populate_arg = populate_arg,
		    .io = &p->io,
		    .ops = &loader_ops,
		    .owner = r,
		};
		p->loader = loader_start(&lc, err);
		if (!p->loader)
			goto fail;
	}
	*out = r;
	return 0;
fail:
	residency_destroy(r);
	return -1;
}

void residency_destroy(struct residency *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->lock);
	r->stopping = true;
	pthread_cond_broadcast(&r->changed);
	pthread_mutex_unlock(&r->lock);
	for (uint32_t n = 0; n < r->n_nodes; n++) {
		loader_stop(r->node[n].loader);
		r->node[n].loader = NULL;
	}
	if (r->fds)
		for (uint32_t f = 0; f < r->map->n_files; f++)
			if (r->fds[f] >= 0)
				close(r->fds[f]);
	free(r->fds);
	free(r->buffered);
	free(r->post_load_msg);
	for (uint32_t c = 0; c < SLOT_MAX_CLASSES; c++)
		policy_destroy(&r->policy[c]);
	free(r->class_of);
	for (uint32_t n = 0; n < r->n_nodes; n++) {
		struct node_part *p = &r->node[n];
		free(p->demand.ids);
		free(p->prefetch.ids);
		slot_pool_destroy(&p->pool);
		free(p->layout);
	}
	free(r->entries);
	pthread_cond_destroy(&r->changed);
	pthread_mutex_destroy(&r->lock);
	free(r);
}

/* ---- A layer's demand in one call ------------------------------------------------------- */

static struct residency_hold *hold_at(struct residency_hold *first, size_t stride, uint32_t i)
{
	return (struct residency_hold *)((char *)first + (size_t)i * stride);
}

int residency_demand_layer(struct residency *r, uint32_t layer, struct residency_hold *first,
                           size_t stride, uint32_t n, uint32_t *cursor)
{
	while (*cursor < 2 * n) {
		const bool first_pass = *cursor < n;
		struct residency_hold *h = hold_at(first, stride, *cursor % n);
		(*cursor)++;
		if (!h->pending || h->held)
			continue;
		const enum expert_state pre = residency_state(r, layer, h->expert);
		if (first_pass && pre == EXPERT_COLD)
			continue; /* the second pass reads it */
		const unsigned flags = RESIDENCY_NOWAIT | (h->counted ? RESIDENCY_RETRY : 0u);
		const int rc = residency_acquire(r, layer, h->expert,
		                                 h->score >= 0 ? h->score : -1.0f, flags, &h->ref);
		if (!h->counted && (rc == 0 || rc == -EINPROGRESS)) {
			h->counted = true;
			h->found = pre == EXPERT_RESIDENT  ? RESIDENCY_FOUND_HIT
			           : pre == EXPERT_LOADING ? RESIDENCY_FOUND_IN_FLIGHT
			                                   : RESIDENCY_FOUND_COLD;
		}
		if (rc == 0)
			h->held = true;
		else if (rc != -EINPROGRESS && rc != -EAGAIN)
			return rc;
	}
	return 0;
}

void residency_release_layer(struct residency *r, struct residency_hold *first, size_t stride,
                             const uint32_t *which, uint32_t n)
{
	bool locked = false;
	for (uint32_t i = 0; i < n; i++) {
		struct residency_hold *h = hold_at(first, stride, which ? which[i] : i);
		if (!h->held)
			continue;
		if (!locked)
			pthread_mutex_lock(&r->lock);
		locked = true;
		release_locked(r, &h->ref);
		memset(&h->ref, 0, sizeof(h->ref));
		h->held = false;
	}
	if (locked)
		pthread_mutex_unlock(&r->lock);
}

bool residency_layer_resident(struct residency *r, uint32_t layer, const int32_t *ids, size_t n)
{
	if (layer >= r->n_layers)
		return false;
	bool all = true;
	pthread_mutex_lock(&r->lock);
	for (size_t i = 0; i < n && all; i++) {
		const int32_t id = ((const volatile int32_t *)ids)[i];
		if (id >= 0 && (uint32_t)id < r->n_experts)
			all = r->entries[residency_id(r, layer, (uint32_t)id)].state ==
			      EXPERT_RESIDENT;
	}
	pthread_mutex_unlock(&r->lock);
	return all;
}

int residency_shared_pool_node(const struct residency *r, uint32_t node, int *fd,
                               const uint8_t **base, uint64_t *bytes)
{
	if (node >= r->n_nodes || !r->node[node].pool.shared)
		return -1;
	*fd = r->node[node].pool.fd;
	*base = r->node[node].pool.base;
	*bytes = r->node[node].pool.map_bytes;
	return 0;
}

uint64_t residency_pool_resident_bytes(const struct residency *r)
{
	uint64_t bytes = 0;
	for (uint32_t n = 0; n < r->n_nodes; n++)
		bytes += slot_pool_resident_bytes(&r->node[n].pool);
	return bytes;
}
