/* topology.c — which NUMA nodes the engine runs on, how many workers each gets, pinning and
 * memory binding (hwloc).
 *
 * A synthetic topology (hwloc_topology_set_synthetic) models a multi-node machine on a
 * single-node one: its nodes drive the work split exactly as real ones would, but threads are
 * not pinned (its PUs do not exist), memory binding is a logged no-op, and the affinity of the
 * real machine's process does not apply to it (every synthetic node gets its pool).
 *
 * CPUs: a node's workers use the node's PUs that this process may run on — those hwloc's
 * topology holds (it follows the cgroup cpuset: AllowedCPUs=, docker --cpuset-cpus) and, of
 * those, the ones in the creating thread's affinity at open (taskset, numactl
 * --cpunodebind, systemd CPUAffinity=, which set it for the whole process before exec). The
 * creating thread's and not HWLOC_CPUBIND_PROCESS: on Linux that is the union of every
 * thread's binding, workers of another engine included. A node with CPUs but none allowed
 * gets no pool under --numa auto (logged) and is refused when --numa lists it; a node without
 * CPUs at all (memory only) keeps one unpinned worker.
 *
 * Pinning: when a node has at least as many allowed PUs as workers, each worker gets a PU of
 * its own, distinct cores first (the second PUs of SMT cores only after every core has one),
 * so two workers never share a core while another is idle and each keeps its caches. With more
 * workers than PUs the node's allowed PUs are shared (several nodes) or nothing is pinned (one
 * node: the workers keep the process's affinity).
 */
#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "topology.h"

/* The default worker count of a node whose usable PUs are `set`: one per PU, at least one. */
static uint32_t node_pus(hwloc_const_bitmap_t set)
{
	int n = hwloc_bitmap_weight(set);
	return n > 0 ? (uint32_t)n : 1u;
}

/* n->pus: the PUs of `set`, each core's first PU in core order, then each core's second, …;
 * PUs outside any core object (some VMs report none) follow in index order. */
static int order_pus(hwloc_topology_t topo, hwloc_const_bitmap_t set, struct forward_node *n)
{
	const int total = hwloc_bitmap_weight(set);
	if (total <= 0)
		return 0;
	n->pus = calloc((size_t)total, sizeof(*n->pus));
	hwloc_bitmap_t left = hwloc_bitmap_dup(set);
	if (!n->pus || !left) {
		hwloc_bitmap_free(left);
		return -1;
	}
	const int cores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE);
	for (unsigned round = 0;; round++) {
		bool took = false;
		for (int c = 0; c < cores; c++) {
			hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(
			    topo, set, HWLOC_OBJ_CORE, (unsigned)c);
			hwloc_obj_t pu = core ? hwloc_get_obj_inside_cpuset_by_type(
			                            topo, core->cpuset, HWLOC_OBJ_PU, round)
			                      : NULL;
			if (pu && hwloc_bitmap_isset(left, pu->os_index)) {
				n->pus[n->n_pus++] = pu->os_index;
				hwloc_bitmap_clr(left, pu->os_index);
				took = true;
			}
		}
		if (!took)
			break;
	}
	for (int i = hwloc_bitmap_first(left); i >= 0; i = hwloc_bitmap_next(left, i))
		if (n->n_pus < (uint32_t)total)
			n->pus[n->n_pus++] = (uint32_t)i;
	hwloc_bitmap_free(left);
	return 0;
}

/* The OS indexes of the topology's NUMA nodes, "0,1", for a refusal of --numa to name. */
static void existing_nodes(hwloc_topology_t topo, char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = '\0';
	const int total = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
	for (int i = 0; i < total && used < len; i++) {
		hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
		int n = snprintf(buf + used, len - used, "%s%u", used ? "," : "", node->os_index);
		if (n < 0)
			break;
		used += (size_t)n;
	}
}

/* t->allowed: the PUs of the topology (the cgroup's cpuset) that the calling thread may run
 * on — at start-up the process's affinity (taskset, CPUAffinity=, numactl). */
static int process_cpus(struct forward_topology *t, struct sidecar_error *err)
{
	hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
	if (!allowed)
		return error_set(err, MOE_ENOMEM, "topology: out of memory");
	if (hwloc_get_cpubind(t->topo, allowed, HWLOC_CPUBIND_THREAD) != 0) {
		const int e = errno;
		hwloc_bitmap_free(allowed);
		return error_set(err, MOE_ESYS, "hwloc: cannot read this thread's CPU affinity: %s",
		                 strerror(e));
	}
	hwloc_bitmap_and(allowed, allowed, hwloc_topology_get_allowed_cpuset(t->topo));
	t->allowed = allowed;
	return 0;
}

/* --numa lists a node none of whose CPUs this process may use. */
static void refuse_node_outside_affinity(const struct forward_topology *t, hwloc_obj_t node,
                                         struct sidecar_error *err)
{
	char mine[128], its[128];
	hwloc_bitmap_list_snprintf(mine, sizeof(mine), t->allowed);
	hwloc_bitmap_list_snprintf(its, sizeof(its), node->cpuset);
	error_set(err, MOE_EINVAL,
	          "--numa %u: none of NUMA node %u's CPUs (%s) is in this process's affinity "
	          "(CPUs %s): widen it (taskset -c, numactl --cpunodebind, CPUAffinity=) or "
	          "leave the node out",
	          node->os_index, node->os_index, its, mine);
}

/* topology_open without its log line (forward_check_topology runs it once more). */
static int topology_build(struct forward_topology *t, const struct forward_config *cfg,
                          struct sidecar_error *err)
{
	memset(t, 0, sizeof(*t));
	hwloc_topology_t topo;
	if (hwloc_topology_init(&topo) != 0) {
		error_set(err, MOE_ESYS, "hwloc: cannot initialise a topology: %s",
		          strerror(errno));
		return -1;
	}
	if (cfg->numa == FORWARD_NUMA_SYNTHETIC) {
		const char *spec = cfg->numa_synthetic ? cfg->numa_synthetic : "";
		if (hwloc_topology_set_synthetic(topo, spec) != 0) {
			error_set(err, MOE_EINVAL, "hwloc: bad synthetic topology \"%s\"", spec);
			hwloc_topology_destroy(topo);
			return -1;
		}
		t->synthetic = true;
	}
	if (hwloc_topology_load(topo) != 0) {
		error_set(err, MOE_ESYS, "hwloc: cannot load the topology: %s", strerror(errno));
		hwloc_topology_destroy(topo);
		return -1;
	}
	t->topo = topo;
	int total = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
	if (total <= 0) {
		error_set(err, MOE_EINVAL, "hwloc: the topology has no NUMA node");
		topology_close(t);
		return -1;
	}
	if (!t->synthetic && process_cpus(t, err) != 0) {
		topology_close(t);
		return -1;
	}
	for (int i = 0; i < total; i++) {
		hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
		if (cfg->numa == FORWARD_NUMA_LIST) {
			bool listed = false;
			for (uint32_t j = 0; j < cfg->numa_list_len; j++)
				listed |= cfg->numa_list[j] == node->os_index;
			if (!listed)
				continue;
		}
		hwloc_bitmap_t set = NULL;
		if (!t->synthetic) {
			set = hwloc_bitmap_alloc();
			if (!set) {
				error_set(err, MOE_ENOMEM, "topology: out of memory");
				topology_close(t);
				return -1;
			}
			hwloc_bitmap_and(set, node->cpuset, t->allowed);
			if (hwloc_bitmap_iszero(set) && !hwloc_bitmap_iszero(node->cpuset)) {
				hwloc_bitmap_free(set);
				if (cfg->numa == FORWARD_NUMA_LIST) {
					refuse_node_outside_affinity(t, node, err);
					topology_close(t);
					return -1;
				}
				if (t->n_left_out < FORWARD_MAX_NODES)
					t->left_out[t->n_left_out++] = node->os_index;
				continue;
			}
		}
		if (t->n_nodes == FORWARD_MAX_NODES) {
			hwloc_bitmap_free(set);
			error_set(err, MOE_EINVAL, "topology: more than %u NUMA nodes",
			          FORWARD_MAX_NODES);
			topology_close(t);
			return -1;
		}
		struct forward_node *n = &t->nodes[t->n_nodes++];
		n->os_index = node->os_index;
		n->threads = cfg->threads_per_node ? cfg->threads_per_node
		                                   : node_pus(set ? set : node->cpuset);
		if (set) {
			n->cpuset = set;
			if (order_pus(topo, set, n) != 0) {
				error_set(err, MOE_ENOMEM, "topology: out of memory");
				topology_close(t);
				return -1;
			}
			n->pin_per_pu = n->n_pus > 0 && n->threads <= n->n_pus;
		}
	}
	if (t->n_nodes == 0 && t->n_left_out > 0) {
		char cpus[128];
		hwloc_bitmap_list_snprintf(cpus, sizeof(cpus), t->allowed);
		error_set(err, MOE_EINVAL,
		          "topology: no NUMA node has a CPU in this process's affinity (CPUs %s)",
		          cpus);
		topology_close(t);
		return -1;
	}
	if (t->n_nodes == 0 ||
	    (cfg->numa == FORWARD_NUMA_LIST && t->n_nodes != cfg->numa_list_len)) {
		char nodes[128];
		existing_nodes(topo, nodes, sizeof(nodes));
		if (t->n_nodes == 0)
			error_set(
			    err, MOE_EINVAL,
			    "--numa: none of the listed nodes exists on this machine (its NUMA "
			    "nodes: %s)",
			    nodes);
		else
			error_set(
			    err, MOE_EINVAL,
			    "--numa: %u listed nodes, %u exist on this machine (its NUMA nodes: "
			    "%s)",
			    cfg->numa_list_len, t->n_nodes, nodes);
		topology_close(t);
		return -1;
	}
	t->memory_bound = !t->synthetic && t->n_nodes > 1;
	return 0;
}

int topology_open(struct forward_topology *t, const struct forward_config *cfg,
                  struct sidecar_error *err)
{
	if (topology_build(t, cfg, err) != 0)
		return -1;
	/* Accepted (a test or a benchmark may want it), but said: past the node's CPUs the
	 * workers take turns on them and are not pinned. */
	for (uint32_t i = 0; i < t->n_nodes && !t->synthetic; i++)
		if (cfg->threads_per_node && cfg->threads_per_node > t->nodes[i].n_pus)
			log_warn(
			    "forward",
			    "--threads %u is above the %u CPUs of NUMA node %u this process may "
			    "use: its %u workers share them",
			    cfg->threads_per_node, t->nodes[i].n_pus, t->nodes[i].os_index,
			    cfg->threads_per_node);
	if (t->synthetic) {
		log_info("forward",
		         "synthetic topology \"%s\": %u nodes; threads not pinned, memory not "
		         "bound, this process's affinity not applied",
		         cfg->numa_synthetic, t->n_nodes);
		return 0;
	}
	char mine[128], cpus[128];
	hwloc_bitmap_list_snprintf(mine, sizeof(mine), t->allowed);
	for (uint32_t i = 0; i < t->n_nodes; i++) {
		const struct forward_node *n = &t->nodes[i];
		hwloc_bitmap_list_snprintf(cpus, sizeof(cpus), n->cpuset);
		log_info("forward",
		         "NUMA node %u: %u workers on CPUs %s (this process may use CPUs %s)%s",
		         n->os_index, n->threads, cpus[0] ? cpus : "none", mine,
		         n->pin_per_pu ? ", one per CPU" : "");
	}
	for (uint32_t i = 0; i < t->n_left_out; i++) {
		hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(t->topo, t->left_out[i]);
		hwloc_bitmap_list_snprintf(cpus, sizeof(cpus), node ? node->cpuset : t->allowed);
		log_info("forward",
		         "NUMA node %u: no pool, none of its CPUs (%s) is in this process's "
		         "affinity (CPUs %s)",
		         t->left_out[i], cpus, mine);
	}
	return 0;
}

int forward_check_topology(const struct forward_config *cfg, struct sidecar_error *err)
{
	struct forward_topology t;
	if (topology_build(&t, cfg, err) != 0)
		return -1;
	topology_close(&t);
	return 0;
}

void topology_info(const struct forward_topology *t, struct forward_topology_info *out)
{
	memset(out, 0, sizeof(*out));
	out->n_nodes = t->n_nodes;
	out->synthetic = t->synthetic;
	out->memory_bound = t->memory_bound;
	for (uint32_t n = 0; n < t->n_nodes; n++) {
		out->node_os_index[n] = t->nodes[n].os_index;
		out->threads[n] = t->nodes[n].threads;
		out->pinned_per_pu[n] = t->nodes[n].pin_per_pu;
		out->pus[n] = t->nodes[n].n_pus;
	}
}

int forward_topology_describe(const struct forward_config *cfg, struct forward_topology_info *out,
                              struct sidecar_error *err)
{
	memset(out, 0, sizeof(*out));
	struct forward_topology t;
	if (topology_build(&t, cfg, err) != 0)
		return -1;
	topology_info(&t, out);
	topology_close(&t);
	return 0;
}

void topology_close(struct forward_topology *t)
{
	for (uint32_t i = 0; i < t->n_nodes; i++) {
		if (t->nodes[i].cpuset)
			hwloc_bitmap_free(t->nodes[i].cpuset);
		free(t->nodes[i].pus);
	}
	if (t->allowed)
		hwloc_bitmap_free(t->allowed);
	if (t->topo)
		hwloc_topology_destroy(t->topo);
	memset(t, 0, sizeof(*t));
}

void topology_pin_worker(struct forward_topology *t, uint32_t node, uint32_t local)
{
	const struct forward_node *n = &t->nodes[node];
	if (t->synthetic || !n->cpuset)
		return;
	hwloc_bitmap_t one = NULL;
	hwloc_const_bitmap_t set = n->cpuset;
	if (n->pin_per_pu) {
		one = hwloc_bitmap_alloc();
		if (!one)
			return; /* unpinned: slower at worst */
		hwloc_bitmap_only(one, n->pus[local % n->n_pus]);
		set = one;
	} else if (t->n_nodes < 2) {
		return;
	}
	if (hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_THREAD) != 0)
		log_warn("forward", "cannot pin worker %u of node %u: %s", local, n->os_index,
		         strerror(errno));
	hwloc_bitmap_free(one);
}

void topology_bind_area(struct forward_topology *t, uint32_t node, void *addr, size_t len)
{
	if (!t->memory_bound || len == 0)
		return;
	hwloc_obj_t obj = hwloc_get_numanode_obj_by_os_index(t->topo, t->nodes[node].os_index);
	if (!obj || hwloc_set_area_membind(t->topo, addr, len, obj->nodeset, HWLOC_MEMBIND_BIND,
	                                   HWLOC_MEMBIND_BYNODESET) != 0) {
		log_warn("forward", "memory binding to node %u refused (%s): weights not bound",
		         t->nodes[node].os_index, strerror(errno));
		t->memory_bound = false;
	}
}
