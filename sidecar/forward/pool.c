/* pool.c — the worker pools: one set of pinned threads per NUMA node, running the three
 * kernel phases of a wave of expert groups, each phase over before the next starts.
 *
 * Work split: the load phase (activation conversion) is split over every worker; the hidden
 * phase of each group over its node's intermediate rows, the down phase over its node's output
 * rows, so each node touches only its part of every weight matrix (the NUMA split of
 * docs/architecture.md), through the node's own view of the expert (wave_group.node_expert:
 * with the sliced residency, the node's rows live in a slot of the node's own pool). Inside a
 * node, workers claim items from an atomic counter: no worker idles while its node has work.
 * An item is a whole group's node rows where the groups share out evenly (decode: every
 * routed expert one token), else one worker's chunk of them (pool_whole_groups).
 * The kernels give the same bits for any split, so claiming order never shows in results.
 *
 * Phase ends are counted per item, not per worker: a phase is over when done[phase] has moved
 * on by its items, whoever ran them. So no worker has to take part in a wave — one that is
 * preempted holds up only the item it holds — and a worker may join a wave at any point: the
 * caller after a wave started behind it (pool_start_wave), or a worker woken late. Between
 * waves the caller marks wave_seq odd and waits for the workers still inside the last wave
 * (`active`) to leave before it rewrites the description.
 *
 * Threading: pool_run_wave / pool_start_wave are called by one thread at a time (the one
 * running the engine's request), which is worker 0. No allocation per wave.
 *
 * Waiting (between waves, and for the end of a phase): spin_wait_change — a yielding spin up
 * to SPIN_WAIT_BOUND_NS, then a sleep on a private futex (spin_wait.h says why). In decode the
 * next wave follows within a client round trip and a phase ends soon after the other
 * workers', so a worker that slept at once would pay a wake-up per wave and per phase.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "forward_internal.h"
#include "spin_wait.h"

enum { PHASE_LOAD = 0, PHASE_HIDDEN = 1, PHASE_DOWN = 2 };

static bool phase_over(struct forward_pool *p, unsigned phase)
{
	return (int32_t)(atomic_load_explicit(&p->done[phase], memory_order_acquire) -
	                 p->target[phase]) >= 0;
}

/* Waits until every item of the phase is done, whoever ran them: each completion is a release
 * increment of done[phase], so every item's output is visible after this. */
static void phase_wait(struct forward_pool *p, unsigned phase)
{
	for (uint32_t v; !phase_over(p, phase);) {
		v = atomic_load_explicit(&p->done[phase], memory_order_relaxed);
		if ((int32_t)(v - p->target[phase]) < 0)
			spin_wait_change(&p->done[phase], v, &p->done_sleepers, SPIN_WAIT_BOUND_NS);
	}
}

static void run_phase(struct forward_pool *p, unsigned phase, const struct pool_worker *w)
{
	const uint32_t node = phase == PHASE_LOAD ? 0 : w->node;
	const uint32_t n = p->n_items[phase][node];
	for (;;) {
		uint32_t i =
		    atomic_fetch_add_explicit(&p->next[phase][node], 1, memory_order_relaxed);
		if (i >= n)
			break;
		if (p->job) { /* a job: its items in the load phase's place */
			p->job(p->job_arg, i, w->index);
			if (atomic_fetch_add(&p->done[phase], 1) + 1 == p->target[phase])
				spin_wake_all(&p->done[phase], &p->done_sleepers);
			continue;
		}
		const struct pool_item *it = &p->items[phase][node][i];
		const struct wave_group *g = &p->groups[it->group];
		const struct moek_ffn_call *c = &g->call;
		if (phase == PHASE_LOAD)
			moek_ffn_load(c, w->index, it->begin, it->end);
		else if (phase == PHASE_HIDDEN)
			moek_ffn_hidden_rows(c, g->node_expert[node], w->index, it->begin, it->end);
		else
			moek_ffn_down_rows(c, g->node_expert[node], w->index, it->begin, it->end);
		/* seq_cst: the last completion and a sleeper's count see each other (spin_wake_all)
		 */
		if (atomic_fetch_add(&p->done[phase], 1) + 1 == p->target[phase])
			spin_wake_all(&p->done[phase], &p->done_sleepers);
	}
}

/* Whatever is left of the wave: from its first phase not over, claim items, then wait for the
 * phase's end (items others hold), and on. A worker may join at any point — the caller after
 * a wave started behind it — and finds the finished phases over at once. */
static void run_wave_as(struct forward_pool *p, const struct pool_worker *w)
{
	for (unsigned phase = 0; phase < 3; phase++) {
		run_phase(p, phase, w);
		phase_wait(p, phase);
	}
}

static void *worker_main(void *arg)
{
	struct pool_worker *w = arg;
	struct forward_pool *p = w->pool;
	topology_pin_worker(p->topo, w->node, w->local);
	char name[16]; /* top -H, perf: which worker is which */
	snprintf(name, sizeof(name), "moe-w%u.%u", w->node, w->local);
	pthread_setname_np(pthread_self(), name);
	atomic_fetch_add(&p->checked_in, 1);
	spin_wake_all(&p->checked_in, &p->wave_sleepers);
	uint32_t seen = 0; /* wave_seq starts at 0 */
	for (;;) {
		spin_wait_change(&p->wave_seq, seen, &p->wave_sleepers, SPIN_WAIT_BOUND_NS);
		const uint32_t seq = atomic_load(&p->wave_seq);
		seen = seq;
		if (seq & 1u)
			continue; /* being rewritten: wait for it to be published */
		/* Enter, then look again (seq_cst both; the starter marks, then looks at
		 * `active`): either the starter waits for this worker to leave before it rewrites
		 * the wave, or this worker sees that it moved on and goes round again. */
		atomic_fetch_add(&p->active, 1);
		if (atomic_load(&p->wave_seq) == seq) {
			if (atomic_load_explicit(&p->stopping, memory_order_acquire)) {
				atomic_fetch_sub(&p->active, 1);
				return NULL;
			}
			run_wave_as(p, w); /* a wave already over leaves at once */
		}
		atomic_fetch_sub(&p->active, 1);
	}
}

unsigned pool_worker_count(const struct forward_topology *topo)
{
	unsigned n_workers = 0;
	for (uint32_t n = 0; n < topo->n_nodes; n++)
		n_workers += topo->nodes[n].threads;
	return n_workers;
}

int pool_create(struct forward_pool *p, struct forward_topology *topo, uint32_t max_groups,
                struct sidecar_error *err)
{
	memset(p, 0, sizeof(*p));
	p->topo = topo;
	p->n_workers = pool_worker_count(topo);
	p->workers = calloc(p->n_workers, sizeof(*p->workers));
	/* Items per phase and node: each group is cut into at most two chunks per worker (two
	 * behind the caller). */
	p->item_capacity = max_groups * p->n_workers * 2;
	bool ok = p->workers != NULL;
	for (unsigned ph = 0; ph < 3 && ok; ph++)
		for (uint32_t n = 0; n < topo->n_nodes && ok; n++)
			ok = (p->items[ph][n] =
			          calloc(p->item_capacity, sizeof(struct pool_item))) != NULL;
	if (!ok) {
		error_set(err, MOE_ENOMEM, "worker pool: out of memory");
		pool_destroy(p);
		return -1;
	}
	p->ready = true;
	int rc;
	uint32_t index = 0;
	for (uint32_t n = 0; n < topo->n_nodes; n++)
		for (uint32_t i = 0; i < topo->nodes[n].threads; i++, index++) {
			struct pool_worker *w = &p->workers[index];
			w->pool = p;
			w->node = n;
			w->index = index;
			w->local = i;
			if (index == 0)
				continue; /* the caller of pool_run_wave */
			rc = pthread_create(&w->thread, NULL, worker_main, w);
			if (rc != 0) {
				error_set(err, MOE_ESYS, "worker pool: starting worker %u: %s",
				          index, strerror(rc));
				pool_destroy(p);
				return -1;
			}
			w->started = true;
		}
	/* Every worker pinned and named before the first wave: a wave may end before a worker
	 * that has not yet run takes any part in it. */
	for (uint32_t v; (v = atomic_load(&p->checked_in)) != p->n_workers - 1;)
		spin_wait_change(&p->checked_in, v, &p->wave_sleepers, SPIN_WAIT_BOUND_NS);
	return 0;
}

void pool_destroy(struct forward_pool *p)
{
	if (p->ready) {
		pool_wait_wave(p);
		atomic_store(&p->stopping, true);
		atomic_fetch_add(&p->wave_seq, 2);
		spin_wake_all(&p->wave_seq, &p->wave_sleepers);
	}
	for (uint32_t i = 0; p->workers && i < p->n_workers; i++)
		if (p->workers[i].started)
			pthread_join(p->workers[i].thread, NULL);
	for (unsigned ph = 0; ph < 3; ph++)
		for (uint32_t n = 0; n < FORWARD_MAX_NODES; n++)
			free(p->items[ph][n]);
	free(p->workers);
	memset(p, 0, sizeof(*p));
}

/* Cuts [begin, end) into at most `chunks` pieces on multiples of `align` (the last piece
 * takes the remainder) and appends them as items of group g. */
static void add_items(struct forward_pool *p, unsigned phase, uint32_t node, uint32_t g,
                      size_t begin, size_t end, size_t align, uint32_t chunks)
{
	if (end <= begin)
		return;
	size_t units = (end - begin + align - 1) / align;
	if (chunks > units)
		chunks = (uint32_t)units;
	size_t per = units / chunks, extra = units % chunks, at = begin;
	for (uint32_t c = 0; c < chunks; c++) {
		size_t len = (per + (c < extra)) * align;
		size_t stop = at + len < end ? at + len : end;
		struct pool_item *it = &p->items[phase][node][p->n_items[phase][node]++];
		it->group = g;
		it->begin = (uint32_t)at;
		it->end = (uint32_t)stop;
		at = stop;
	}
}

uint32_t pool_whole_groups(const struct wave_group *groups, uint32_t n_groups, uint32_t threads)
{
	if (threads <= 1)
		return n_groups;
	for (uint32_t g = 1; g < n_groups; g++)
		if (groups[g].call.n_tokens != groups[0].call.n_tokens)
			return 0;
	return n_groups - n_groups % threads;
}

bool pool_runs_behind(const struct forward_pool *p)
{
	return p->topo->nodes[0].threads > 1;
}

void pool_start_wave(struct forward_pool *p, struct wave_group *groups, uint32_t n_groups,
                     unsigned flags)
{
	pool_wait_wave(p);
	const bool behind = (flags & POOL_WAVE_BEHIND) != 0 && pool_runs_behind(p);
	/* Mark the wave being rewritten (odd), then wait for workers still inside the last one
	 * (past its end, on their way out) to leave: seq_cst, against the workers' enter, then
	 * look (worker_main). */
	atomic_fetch_add(&p->wave_seq, 1);
	while (atomic_load(&p->active) != 0)
		sched_yield();
	p->groups = groups;
	p->n_groups = n_groups;
	p->job = NULL;
	for (unsigned ph = 0; ph < 3; ph++)
		for (uint32_t n = 0; n < p->topo->n_nodes; n++) {
			p->n_items[ph][n] = 0;
			atomic_store_explicit(&p->next[ph][n], 0, memory_order_relaxed);
		}
	for (uint32_t g = 0; g < n_groups; g++)
		add_items(p, PHASE_LOAD, 0, g, 0, groups[g].call.n_tokens, 1, p->n_workers);
	/* Behind its caller a wave is cut finer: the caller joins when it is back, and finds
	 * items left only if they are smaller than what one worker runs meanwhile. */
	const uint32_t finer = behind ? 2 : 1;
	for (uint32_t n = 0; n < p->topo->n_nodes; n++) {
		/* the whole groups' items first, so the split ones are the wave's tail */
		const uint32_t threads = p->topo->nodes[n].threads;
		const uint32_t whole = pool_whole_groups(groups, n_groups, threads);
		for (uint32_t pass = 0; pass < 2; pass++)
			for (uint32_t g = pass ? whole : 0; g < (pass ? n_groups : whole); g++) {
				const struct wave_group *wg = &groups[g];
				const uint32_t chunks = pass ? threads * finer : 1;
				add_items(p, PHASE_HIDDEN, n, g, wg->f_split[n], wg->f_split[n + 1],
				          wg->h_align, chunks);
				add_items(p, PHASE_DOWN, n, g, wg->o_split[n], wg->o_split[n + 1],
				          FORWARD_DOWN_ALIGN, chunks);
			}
	}
	/* No item is in flight between waves: done[] stands still, and each phase is over
	 * when it has moved on by the phase's items (all nodes: the load phase is shared, and
	 * every node's down phase reads every node's hidden rows). */
	for (unsigned ph = 0; ph < 3; ph++) {
		uint32_t total = 0;
		for (uint32_t n = 0; n < p->topo->n_nodes; n++)
			total += p->n_items[ph][n];
		p->target[ph] = atomic_load_explicit(&p->done[ph], memory_order_relaxed) + total;
	}
	p->in_flight = behind;
	atomic_fetch_add(&p->wave_seq, 1); /* even again: releases the wave's description */
	spin_wake_all(&p->wave_seq, &p->wave_sleepers);
	if (!behind)
		run_wave_as(p, &p->workers[0]);
}

void pool_wait_wave(struct forward_pool *p)
{
	if (!p->in_flight)
		return;
	run_wave_as(p, &p->workers[0]); /* joins: helps with what is left, waits for the rest */
	p->in_flight = false;
}

void pool_run_job(struct forward_pool *p, pool_job_fn fn, void *arg, uint32_t n_items)
{
	pool_wait_wave(p);
	atomic_fetch_add(&p->wave_seq, 1); /* odd: as pool_start_wave */
	while (atomic_load(&p->active) != 0)
		sched_yield();
	p->groups = NULL;
	p->n_groups = 0;
	p->job = fn;
	p->job_arg = arg;
	for (unsigned ph = 0; ph < 3; ph++)
		for (uint32_t n = 0; n < p->topo->n_nodes; n++) {
			p->n_items[ph][n] = 0;
			atomic_store_explicit(&p->next[ph][n], 0, memory_order_relaxed);
		}
	p->n_items[PHASE_LOAD][0] = n_items; /* the load phase's items are node 0's list */
	for (unsigned ph = 0; ph < 3; ph++)
		p->target[ph] = atomic_load_explicit(&p->done[ph], memory_order_relaxed) +
		                (ph == PHASE_LOAD ? n_items : 0);
	p->in_flight = false;
	atomic_fetch_add(&p->wave_seq, 1);
	spin_wake_all(&p->wave_seq, &p->wave_sleepers);
	run_wave_as(p, &p->workers[0]);
}

void pool_run_wave(struct forward_pool *p, struct wave_group *groups, uint32_t n_groups)
{
	pool_start_wave(p, groups, n_groups, 0);
}
