/* catalog_adapter.h — the expert catalog (sidecar/model/catalog.h) as an expert_map.
 *
 * Residency layers are MoE layers numbered 0..n_moe_layers-1 in model order (dense blocks
 * have no experts and are skipped); model_layer[] maps them back. Each expert's extents are,
 * per present projection in the order gate, up, down, gate_up: data, then the scales a
 * post-load conversion consumes (MXFP4 _scales, INT4 scales), then zeros (GPTQ qzeros); then,
 * per projection again, what the kernels read besides the rows: FP8 block scales and biases,
 * with the room of f32 rows on a float boundary (a post-load hook converts them in place),
 * after every row the decode layout moves. An INT4 checkpoint's data extent gets the room of
 * its repacked rows (expert_extent.room), so the post-load repack writes them where the
 * packed weights were read. Every
 * expert of a catalog has
 * the same structure, so one `expert_extent_roles` says which extent index holds what (-1: absent).
 */
#ifndef MOE_RESIDENCY_CATALOG_ADAPTER_H
#define MOE_RESIDENCY_CATALOG_ADAPTER_H

#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "expert_map.h"

struct expert_extent_roles {
	int8_t data[MOE_PROJ_COUNT], scale[MOE_PROJ_COUNT], zeros[MOE_PROJ_COUNT],
	    bias[MOE_PROJ_COUNT];
};

/* Fills `map` (expert_map_free releases it): 0, or -1 with err. model_layer, if not NULL,
 * receives cat->info.n_moe_layers entries. */
int expert_map_from_catalog(const struct moe_catalog *cat, struct expert_map *map,
                            struct expert_extent_roles *roles, uint32_t *model_layer,
                            struct sidecar_error *err);

#endif
