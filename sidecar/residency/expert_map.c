/* expert_map.c — see expert_map.h. */
#include "expert_map.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int expert_map_init(struct expert_map *map, uint32_t n_layers, uint32_t n_experts, uint32_t n_files,
                    const char *const *paths, struct sidecar_error *err)
{
	memset(map, 0, sizeof(*map));
	if (!n_layers || !n_experts || (uint64_t)n_layers * n_experts > (1u << 24) || !n_files ||
	    n_files > EXPERT_MAX_FILES)
		return error_set(err, MOE_EINVAL,
		                 "expert map: bad shape %u layers × %u experts, %u files", n_layers,
		                 n_experts, n_files);
	size_t n_ids = (size_t)n_layers * n_experts;
	map->n_layers = n_layers;
	map->n_experts = n_experts;
	map->n_files = n_files;
	map->paths = calloc(n_files, sizeof(char *));
	map->extents = calloc(n_ids * EXPERT_MAX_EXTENTS, sizeof(*map->extents));
	map->n_extents = calloc(n_ids, 1);
	if (!map->paths || !map->extents || !map->n_extents)
		goto nomem;
	for (uint32_t i = 0; i < n_files; i++)
		if (!(map->paths[i] = strdup(paths[i])))
			goto nomem;
	return 0;
nomem:
	expert_map_free(map);
	return error_set(err, MOE_ENOMEM, "expert map: out of memory");
}

int expert_map_add(struct expert_map *map, uint32_t layer, uint32_t expert, uint32_t file,
                   uint64_t offset, uint64_t length, struct sidecar_error *err)
{
	if (layer >= map->n_layers || expert >= map->n_experts)
		return error_set(err, MOE_EINVAL,
		                 "expert map: layer %u expert %u out of range (%u × %u)", layer,
		                 expert, map->n_layers, map->n_experts);
	if (file >= map->n_files || !length || offset > UINT64_MAX / 2 ||
	    length > (UINT64_C(1) << 40))
		return error_set(
		    err, MOE_EINVAL,
		    "expert map: layer %u expert %u: bad extent (file %u, offset %llu, "
		    "length %llu)",
		    layer, expert, file, (unsigned long long)offset, (unsigned long long)length);
	uint32_t id = layer * map->n_experts + expert;
	if (map->n_extents[id] >= EXPERT_MAX_EXTENTS)
		return error_set(err, MOE_EINVAL,
		                 "expert map: layer %u expert %u: more than %u extents", layer,
		                 expert, EXPERT_MAX_EXTENTS);
	map->extents[(size_t)id * EXPERT_MAX_EXTENTS + map->n_extents[id]++] =
	    (struct expert_extent){file, offset, length, 0};
	return 0;
}

int expert_map_set_room(struct expert_map *map, uint32_t layer, uint32_t expert, uint64_t room,
                        struct sidecar_error *err)
{
	const uint32_t id = layer * map->n_experts + expert;
	if (layer >= map->n_layers || expert >= map->n_experts || !map->n_extents[id])
		return error_set(err, MOE_EINVAL,
		                 "expert map: layer %u expert %u has no extent to give room", layer,
		                 expert);
	struct expert_extent *x =
	    &map->extents[(size_t)id * EXPERT_MAX_EXTENTS + map->n_extents[id] - 1];
	if (room < x->length || room > (UINT64_C(1) << 40))
		return error_set(
		    err, MOE_EINVAL,
		    "expert map: layer %u expert %u: room %llu for an extent of %llu bytes", layer,
		    expert, (unsigned long long)room, (unsigned long long)x->length);
	x->room = room;
	return 0;
}

void expert_map_free(struct expert_map *map)
{
	if (map->paths)
		for (uint32_t i = 0; i < map->n_files; i++)
			free(map->paths[i]);
	free(map->paths);
	free(map->extents);
	free(map->n_extents);
	memset(map, 0, sizeof(*map));
}
