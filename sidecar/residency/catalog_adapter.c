/* catalog_adapter.c — see catalog_adapter.h. */
#include "catalog_adapter.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_kernels.h"

static int add(struct expert_map *map, uint32_t layer, uint32_t expert, const struct moe_extent *e,
               int8_t *role, uint32_t *count, struct sidecar_error *err)
{
	if (!e->length)
		return 0;
	int rc = expert_map_add(map, layer, expert, e->file, e->offset, e->length, err);
	if (rc)
		return rc;
	if (role)
		*role = (int8_t)*count;
	(*count)++;
	return 0;
}

int expert_map_from_catalog(const struct moe_catalog *cat, struct expert_map *map,
                            struct expert_extent_roles *roles, uint32_t *model_layer,
                            struct sidecar_error *err)
{
	const struct moe_model_hparams *info = &cat->info;
	if (!info->n_moe_layers || !info->n_experts)
		return error_set(err, MOE_EINVAL, "catalog: the model has no routed experts");
	const char **paths = malloc(cat->n_files * sizeof(char *));
	if (!paths)
		return error_set(err, MOE_ENOMEM, "catalog adapter: out of memory");
	for (uint32_t f = 0; f < cat->n_files; f++)
		paths[f] = cat->files[f].path;
	int rc =
	    expert_map_init(map, info->n_moe_layers, info->n_experts, cat->n_files, paths, err);
	free(paths);
	if (rc)
		return rc;
	struct expert_extent_roles first;
	uint32_t moe = 0;
	for (uint32_t l = 0; l < info->n_layers && rc == 0; l++) {
		if (!cat->layers[l].moe)
			continue;
		if (moe >= info->n_moe_layers) {
			error_set(err, MOE_EINVAL, "catalog: more MoE layers than n_moe_layers=%u",
			          info->n_moe_layers);
			rc = -1;
			break;
		}
		if (model_layer)
			model_layer[moe] = l;
		for (uint32_t x = 0; x < info->n_experts && rc == 0; x++) {
			const struct moe_expert *e = moe_catalog_expert(cat, l, x);
			struct expert_extent_roles here;
			memset(&here, -1, sizeof(here));
			uint32_t count = 0;
			for (int p = 0; p < MOE_PROJ_COUNT && rc == 0; p++) {
				const struct moe_proj_ref *pr = &e->proj[p];
				if (!pr->present)
					continue;
				rc = add(map, moe, x, &pr->data, &here.data[p], &count, err);
				const uint64_t room = moe_proj_kernel_bytes(pr);
				if (!rc && moe_layout_repacked(pr->layout))
					rc = expert_map_set_room(map, moe, x, room, err);
				if (!rc && !moek_format_scale_block(pr->format))
					rc = add(map, moe, x, &pr->scale, &here.scale[p], &count,
					         err);
				if (!rc)
					rc = add(map, moe, x, &pr->zeros, &here.zeros[p], &count,
					         err);
			}
			/* What the kernels read besides the rows — FP8 block scales (f32) and
			 * biases — comes after every projection's rows, which the decode layout
			 * rearranges in place, with room for f32 rows on a float boundary (a
			 * post-load hook converts them there). */
			for (int p = 0; p < MOE_PROJ_COUNT && rc == 0; p++) {
				const struct moe_proj_ref *pr = &e->proj[p];
				if (!pr->present)
					continue;
				if (moek_format_scale_block(pr->format)) {
					rc = add(map, moe, x, &pr->scale, &here.scale[p], &count,
					         err);
					if (!rc && here.scale[p] >= 0)
						rc = expert_map_set_room(map, moe, x,
						                         pr->scale.length + 3, err);
				}
				if (!rc)
					rc =
					    add(map, moe, x, &pr->bias, &here.bias[p], &count, err);
				if (!rc && here.bias[p] >= 0)
					rc =
					    expert_map_set_room(map, moe, x, pr->rows * 4 + 3, err);
			}
			if (rc)
				break;
			if (!count) {
				error_set(err, MOE_EINVAL,
				          "catalog: layer %u expert %u has no weights", l, x);
				rc = -1;
			} else if (moe == 0 && x == 0) {
				first = here;
			} else if (memcmp(&first, &here, sizeof(here)) != 0) {
				error_set(
				    err, MOE_EINVAL,
				    "catalog: layer %u expert %u is stored differently from layer "
				    "%u expert 0 (projections, scales or biases differ)",
				    l, x, model_layer ? model_layer[0] : 0);
				rc = -1;
			}
		}
		moe++;
	}
	if (rc == 0 && moe != info->n_moe_layers) {
		error_set(err, MOE_EINVAL, "catalog: %u MoE layers found, n_moe_layers says %u",
		          moe, info->n_moe_layers);
		rc = -1;
	}
	if (rc) {
		expert_map_free(map);
		return rc;
	}
	if (roles)
		*roles = first;
	return 0;
}
