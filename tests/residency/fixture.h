/* fixture.h — a small model file for residency tests: random bytes, experts made of
 * unaligned extents (odd offsets, odd lengths, gaps), the last one ending exactly at the end
 * of the file (so aligned reads run past EOF). Files live under a fresh mkdtemp directory.
 * fixture_split cuts every expert into slices for several NUMA nodes (residency_create_nodes),
 * as the forward engine cuts experts into row ranges. */
#ifndef MOE_TEST_RESIDENCY_FIXTURE_H
#define MOE_TEST_RESIDENCY_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "expert_map.h"
#include "fault_hook.h"
#include "residency.h"

#define FIXTURE_MAX_NODES 4u

struct fixture {
	char dir[128], path[192];
	struct expert_map map;
	uint32_t n_nodes;                              /* 0: not split */
	struct expert_map node_map[FIXTURE_MAX_NODES]; /* fixture_split: node n's slices */
	uint64_t file_size;
	uint8_t *bytes; /* the file's content */
};

/* extent_len: base length of each extent (each gets a different odd length around it). */
void fixture_create(struct fixture *f, const char *parent, uint32_t layers, uint32_t experts,
                    uint32_t extents_per_expert, uint32_t extent_len);
/* The same with odd layers' extents odd_len bytes (and up to 996 more): experts of two sizes,
 * as a llama.cpp mix has (slot size classes). */
void fixture_create_mix(struct fixture *f, const char *parent, uint32_t layers, uint32_t experts,
                        uint32_t extents_per_expert, uint32_t extent_len, uint32_t odd_len);
void fixture_destroy(struct fixture *f);
/* Whether the reference's bytes equal pread of the file for every extent. */
bool fixture_ref_matches(const struct fixture *f, const struct expert_ref *ref);
/* Splits every extent into n_nodes contiguous pieces (2..FIXTURE_MAX_NODES): node n's map
 * holds piece n of each. fixture_residency then creates a residency over the nodes, and
 * fixture_held_matches checks every node's slices. */
void fixture_split(struct fixture *f, uint32_t n_nodes);
/* Whether every node's extents of a held expert equal pread of the file (one node: as
 * fixture_ref_matches). */
bool fixture_held_matches(const struct fixture *f, const struct residency *r,
                          const struct expert_ref *ref);
/* One node (cfg's numa_node), or after fixture_split one part per node, unbound. */
struct residency *fixture_residency(struct fixture *f, struct residency_config *cfg);
/* The same with a populate hook (fault_hook.h: residency_create_nodes_held). */
struct residency *fixture_residency_held(struct fixture *f, struct residency_config *cfg,
                                         loader_populate_fn hook, void *arg);

#endif
