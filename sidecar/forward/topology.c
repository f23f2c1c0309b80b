/* topology.c — which NUMA nodes the engine runs on, how many workers each gets, pinning and
 * memory binding (hwloc).
 *
 * A synthetic topology (hwloc_topology_set_synthetic) models a multi-node machine on a
 * single-node one: its nodes drive the work split exactly as real ones would, but threads are
 * not pinned (its PUs do not exist) and memory binding is a logged no-op.
 */
#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <string.h>

#include "forward_internal.h"
#include "util/log.h"

static uint32_t node_pus(hwloc_topology_t topo, hwloc_obj_t node)
{
	int n = hwloc_bitmap_weight(node->cpuset);
	(void)topo;
	return n > 0 ? (uint32_t)n : 1u;
}

int topology_open(struct forward_topology *t, const struct forward_config *cfg, char *err,
                  size_t err_len)
{
	memset(t, 0, sizeof(*t));
	hwloc_topology_t topo;
	if (hwloc_topology_init(&topo) != 0) {
		snprintf(err, err_len, "hwloc: cannot initialise a topology: %s", strerror(errno));
		return -1;
	}
	if (cfg->numa == FORWARD_NUMA_SYNTHETIC) {
		const char *spec = cfg->numa_synthetic ? cfg->numa_synthetic : "";
		if (hwloc_topology_set_synthetic(topo, spec) != 0) {
			snprintf(err, err_len, "hwloc: bad synthetic topology \"%s\"", spec);
			hwloc_topology_destroy(topo);
			return -1;
		}
		t->synthetic = true;
	}
	if (hwloc_topology_load(topo) != 0) {
		snprintf(err, err_len, "hwloc: cannot load the topology: %s", strerror(errno));
		hwloc_topology_destroy(topo);
		return -1;
	}
	t->topo = topo;
	int total = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
	if (total <= 0) {
		snprintf(err, err_len, "hwloc: the topology has no NUMA node");
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
		if (t->n_nodes == FORWARD_MAX_NODES) {
			snprintf(err, err_len, "topology: more than %u NUMA nodes",
			         FORWARD_MAX_NODES);
			topology_close(t);
			return -1;
		}
		struct forward_node *n = &t->nodes[t->n_nodes++];
		n->os_index = node->os_index;
		n->threads = cfg->threads_per_node ? cfg->threads_per_node : node_pus(topo, node);
		if (!t->synthetic) {
			hwloc_bitmap_t set = hwloc_bitmap_dup(node->cpuset);
			if (!set) {
				snprintf(err, err_len, "topology: out of memory");
				topology_close(t);
				return -1;
			}
			n->cpuset = set;
		}
	}
	if (t->n_nodes == 0) {
		snprintf(err, err_len, "--numa: none of the listed nodes exists on this machine");
		topology_close(t);
		return -1;
	}
	if (cfg->numa == FORWARD_NUMA_LIST && t->n_nodes != cfg->numa_list_len) {
		snprintf(err, err_len, "--numa: %u listed nodes, %u exist on this machine",
		         cfg->numa_list_len, t->n_nodes);
		topology_close(t);
		return -1;
	}
	t->memory_bound = !t->synthetic && t->n_nodes > 1;
	if (t->synthetic)
		log_info(
		    "forward",
		    "synthetic topology \"%s\": %u nodes; threads not pinned, memory not bound",
		    cfg->numa_synthetic, t->n_nodes);
	return 0;
}

void topology_close(struct forward_topology *t)
{
	for (uint32_t i = 0; i < t->n_nodes; i++)
		if (t->nodes[i].cpuset)
			hwloc_bitmap_free(t->nodes[i].cpuset);
	if (t->topo)
		hwloc_topology_destroy(t->topo);
	memset(t, 0, sizeof(*t));
}

void topology_pin_thread(struct forward_topology *t, uint32_t node)
{
	if (t->synthetic || !t->nodes[node].cpuset || t->n_nodes < 2)
		return;
	if (hwloc_set_cpubind(t->topo, t->nodes[node].cpuset, HWLOC_CPUBIND_THREAD) != 0)
		log_warn("forward", "cannot pin a worker to node %u: %s", t->nodes[node].os_index,
		         strerror(errno));
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
