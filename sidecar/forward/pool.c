/* pool.c — the worker pools: one set of pinned threads per NUMA node, running the three
 * kernel phases of a wave of expert groups with a barrier between phases.
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
 * Threading: pool_run_wave is called by one thread at a time (the one running the engine's
 * request), which is worker 0. No allocation per wave.
 *
 * Waiting (between waves, and at the barrier between phases): spin up to POOL_SPIN_NS, then
 * sleep on a private futex. In decode the next wave follows within a client round trip and a
 * phase ends within microseconds of the other workers', so a sleeping worker would pay a
 * wake-up per wave and per phase — on a VM whose idle vCPUs halt, tens of µs each, comparable
 * to a whole phase — while a short spin costs only an otherwise idle core. After the spin
 * bound a worker sleeps, so an idle pool uses no CPU. The spin yields (sched_yield) rather
 * than pausing: when threads outnumber cores — the sidecar's client, woken by a completion,
 * waiting for this very core — a spinning worker must not hold the core it needs.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "forward_internal.h"

#define POOL_SPIN_NS 50000u

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Waits until *word != seen: spins up to POOL_SPIN_NS, then sleeps on it, counted in
 * *sleepers (the waker's side: change the word, then wake if *sleepers; seq_cst on both sides
 * so one of the two sees the other). */
static void wait_for_change(_Atomic uint32_t *word, uint32_t seen, _Atomic uint32_t *sleepers)
{
	if (atomic_load_explicit(word, memory_order_acquire) != seen)
		return;
	const uint64_t t0 = mono_ns();
	for (unsigned i = 1;; i++) {
		if (atomic_load_explicit(word, memory_order_acquire) != seen)
			return;
		sched_yield();
		if ((i & 7) == 0 && mono_ns() - t0 >= POOL_SPIN_NS)
			break;
	}
	atomic_fetch_add(sleepers, 1);
	while (atomic_load(word) == seen)
		syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
	atomic_fetch_sub(sleepers, 1);
}

static void wake_all(_Atomic uint32_t *word, _Atomic uint32_t *sleepers)
{
	if (atomic_load(sleepers))
		syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Every worker's writes before the barrier are visible to every worker after it: arrivals are
 * acq_rel read-modify-writes on bar_count; the last one publishes bar_seq with release. */
static void barrier_wait(struct forward_pool *p)
{
	const uint32_t seq = atomic_load_explicit(&p->bar_seq, memory_order_acquire);
	if (atomic_fetch_add_explicit(&p->bar_count, 1, memory_order_acq_rel) + 1 == p->n_workers) {
		atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
		atomic_store(&p->bar_seq, seq + 1);
		wake_all(&p->bar_seq, &p->bar_sleepers);
		return;
	}
	wait_for_change(&p->bar_seq, seq, &p->bar_sleepers);
}

enum { PHASE_LOAD = 0, PHASE_HIDDEN = 1, PHASE_DOWN = 2 };

static void run_phase(struct forward_pool *p, unsigned phase, const struct pool_worker *w)
{
	const uint32_t node = phase == PHASE_LOAD ? 0 : w->node;
	const uint32_t n = p->n_items[phase][node];
	for (;;) {
		uint32_t i =
		    atomic_fetch_add_explicit(&p->next[phase][node], 1, memory_order_relaxed);
		if (i >= n)
			break;
		const struct pool_item *it = &p->items[phase][node][i];
		const struct wave_group *g = &p->groups[it->group];
		const struct moek_ffn_call *c = &g->call;
		if (phase == PHASE_LOAD)
			moek_ffn_load(c, w->index, it->begin, it->end);
		else if (phase == PHASE_HIDDEN)
			moek_ffn_hidden_rows(c, g->node_expert[node], w->index, it->begin, it->end);
		else
			moek_ffn_down_rows(c, g->node_expert[node], w->index, it->begin, it->end);
	}
}

static void run_wave_as(struct forward_pool *p, const struct pool_worker *w)
{
	for (unsigned phase = 0; phase < 3; phase++) {
		run_phase(p, phase, w);
		if (p->n_workers > 1)
			barrier_wait(p);
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
	uint32_t seen = 0; /* wave_seq starts at 0 */
	for (;;) {
		wait_for_change(&p->wave_seq, seen, &p->wave_sleepers);
		seen = atomic_load_explicit(&p->wave_seq, memory_order_acquire);
		if (atomic_load_explicit(&p->stopping, memory_order_acquire))
			return NULL;
		run_wave_as(p, w);
	}
}

int pool_create(struct forward_pool *p, struct forward_topology *topo, uint32_t max_groups,
                char *err, size_t err_len)
{
	memset(p, 0, sizeof(*p));
	p->topo = topo;
	for (uint32_t n = 0; n < topo->n_nodes; n++)
		p->n_workers += topo->nodes[n].threads;
	p->workers = calloc(p->n_workers, sizeof(*p->workers));
	/* Items per phase and node: each group is cut into at most one chunk per worker. */
	p->item_capacity = max_groups * p->n_workers;
	bool ok = p->workers != NULL;
	for (unsigned ph = 0; ph < 3 && ok; ph++)
		for (uint32_t n = 0; n < topo->n_nodes && ok; n++)
			ok = (p->items[ph][n] =
			          calloc(p->item_capacity, sizeof(struct pool_item))) != NULL;
	if (!ok) {
		snprintf(err, err_len, "worker pool: out of memory");
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
				snprintf(err, err_len, "worker pool: starting worker %u: %s", index,
				         strerror(rc));
				pool_destroy(p);
				return -1;
			}
			w->started = true;
		}
	return 0;
}

void pool_destroy(struct forward_pool *p)
{
	if (p->ready) {
		atomic_store(&p->stopping, true);
		atomic_fetch_add(&p->wave_seq, 1);
		wake_all(&p->wave_seq, &p->wave_sleepers);
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

void pool_run_wave(struct forward_pool *p, struct wave_group *groups, uint32_t n_groups)
{
	p->groups = groups;
	p->n_groups = n_groups;
	for (unsigned ph = 0; ph < 3; ph++)
		for (uint32_t n = 0; n < p->topo->n_nodes; n++) {
			p->n_items[ph][n] = 0;
			atomic_store_explicit(&p->next[ph][n], 0, memory_order_relaxed);
		}
	for (uint32_t g = 0; g < n_groups; g++)
		add_items(p, PHASE_LOAD, 0, g, 0, groups[g].call.n_tokens, 1, p->n_workers);
	for (uint32_t n = 0; n < p->topo->n_nodes; n++) {
		/* the whole groups' items first, so the split ones are the wave's tail */
		const uint32_t threads = p->topo->nodes[n].threads;
		const uint32_t whole = pool_whole_groups(groups, n_groups, threads);
		for (uint32_t pass = 0; pass < 2; pass++)
			for (uint32_t g = pass ? whole : 0; g < (pass ? n_groups : whole); g++) {
				const struct wave_group *wg = &groups[g];
				const uint32_t chunks = pass ? threads : 1;
				add_items(p, PHASE_HIDDEN, n, g, wg->f_split[n], wg->f_split[n + 1],
				          wg->h_align, chunks);
				add_items(p, PHASE_DOWN, n, g, wg->o_split[n], wg->o_split[n + 1],
				          FORWARD_DOWN_ALIGN, chunks);
			}
	}
	/* The load phase is shared by every node: each node's workers claim from list 0. */
	if (p->n_workers > 1) {
		atomic_fetch_add(&p->wave_seq, 1); /* releases the wave's description above */
		wake_all(&p->wave_seq, &p->wave_sleepers);
	}
	run_wave_as(p, &p->workers[0]);
}
