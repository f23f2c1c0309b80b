/* topology.h — the NUMA nodes the engine runs on (topology.c) and the node split of an
 * expert's rows, which the pool runs and the weights bind and slice along.
 *
 * Threading: a topology is built and closed on the creating thread; pinning from the worker
 * being pinned; the split is pure.
 */
#ifndef MOE_FORWARD_TOPOLOGY_H
#define MOE_FORWARD_TOPOLOGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "forward.h"
#include "moe_kernels.h"

struct forward_node {
	uint32_t os_index;
	/* hwloc_bitmap_t of the node's PUs this process may use (NULL when synthetic: not
	 * pinned) */
	void *cpuset;
	uint32_t threads;
	/* The node's PUs (OS indices), one per core first, then each core's second PU, …: worker
	 * i of the node runs on pus[i] when the node has a PU per worker (pin_per_pu). */
	uint32_t *pus, n_pus;
	bool pin_per_pu;
};
struct forward_topology {
	void *topo;    /* hwloc_topology_t */
	void *allowed; /* hwloc_bitmap_t: the CPUs this process may use (NULL when synthetic) */
	bool synthetic;
	bool memory_bound;
	uint32_t n_nodes;
	struct forward_node nodes[FORWARD_MAX_NODES];
	/* Nodes with CPUs, none of them in the process's affinity: no pool (--numa auto). */
	uint32_t left_out[FORWARD_MAX_NODES], n_left_out;
};
int topology_open(struct forward_topology *t, const struct forward_config *cfg,
                  struct sidecar_error *err);
void topology_close(struct forward_topology *t);
/* What t holds, as forward_topology reports it. */
void topology_info(const struct forward_topology *t, struct forward_topology_info *out);
/* Pins the calling thread, worker `local` of node n: to its own PU (pus[local]) when the node
 * has one per worker, else to the node's PUs when there are several nodes; nothing when
 * synthetic. Worker 0 of node 0 is the caller of pool_run_wave, whose affinity is the
 * caller's own: it is never pinned, and pus[0] is left to it. */
void topology_pin_worker(struct forward_topology *t, uint32_t node, uint32_t local);
/* Binds [addr, addr+len) to node n; a refused binding is logged once and ignored. */
void topology_bind_area(struct forward_topology *t, uint32_t node, void *addr, size_t len);

/* The node split both the pool and memory binding use: [0, total) cut into `parts` ranges on
 * multiples of `align` (the last ends at total); split[n]..split[n+1] is node n's. */
static inline void forward_split_range(size_t total, size_t align, uint32_t parts, size_t *split)
{
	const size_t units = (total + align - 1) / align;
	for (uint32_t n = 0; n < parts; n++) {
		size_t at = units * n / parts * align;
		split[n] = at < total ? at : total;
	}
	split[parts] = total;
}
#define FORWARD_DOWN_ALIGN 8 /* output rows per down-phase unit */
/* The node split of an expert (its view): intermediate rows f[n]..f[n+1] and output rows
 * o[n]..o[n+1] of node n — what the pool runs and what each node's residency part holds.
 * Computed once per expert at open (expert_template.f_split, o_split). */
static inline void forward_expert_split(const struct moek_expert *v, uint32_t n_nodes, size_t *f,
                                        size_t *o)
{
	forward_split_range(v->gate.rows, moek_expert_split_align(v), n_nodes, f);
	forward_split_range(v->down.rows, FORWARD_DOWN_ALIGN, n_nodes, o);
}

#endif
