/* expert_map.h — where each expert's bytes are: for every (layer, expert), a short list of
 * byte extents (file index, offset, length) in a set of model files. This is all the loader,
 * the slot pool and the policies know of a model; catalog_adapter.c fills it from the model
 * catalog, tests and the loader bench fill it directly.
 *
 * Extents keep their order: the loader lays them out in the slot in this order and hands
 * back one data pointer per extent (e.g. gate, up, down). Ownership: the map owns copies of
 * the paths and its arrays; expert_map_free releases them.
 * Errors: init, add and set_room return 0, or -1 with the record (util/error.h).
 */
#ifndef MOE_RESIDENCY_EXPERT_MAP_H
#define MOE_RESIDENCY_EXPERT_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define EXPERT_MAX_EXTENTS 12u
#define EXPERT_MAX_FILES 4096u

struct expert_extent {
	uint32_t file;   /* index into paths */
	uint64_t offset; /* bytes from the start of the file */
	uint64_t length; /* bytes, > 0 */
	/* bytes the slot keeps from the extent's data pointer on (0: length): room for a
	 * post-load conversion whose output outgrows what was read (INT4 checkpoints repacked
	 * into 20-byte blocks) */
	uint64_t room;
};

struct expert_map {
	uint32_t n_layers, n_experts, n_files;
	char **paths;
	struct expert_extent *extents; /* [n_layers * n_experts][EXPERT_MAX_EXTENTS] */
	uint8_t *n_extents;            /* [n_layers * n_experts] */
};

int expert_map_init(struct expert_map *map, uint32_t n_layers, uint32_t n_experts, uint32_t n_files,
                    const char *const *paths, struct sidecar_error *err);
/* Appends an extent to (layer, expert). */
int expert_map_add(struct expert_map *map, uint32_t layer, uint32_t expert, uint32_t file,
                   uint64_t offset, uint64_t length, struct sidecar_error *err);
/* Sets the room (struct expert_extent) of (layer, expert)'s last extent; room >= its length. */
int expert_map_set_room(struct expert_map *map, uint32_t layer, uint32_t expert, uint64_t room,
                        struct sidecar_error *err);
void expert_map_free(struct expert_map *map);

static inline const struct expert_extent *expert_map_extents(const struct expert_map *map,
                                                             uint32_t id, uint32_t *n)
{
	*n = map->n_extents[id];
	return &map->extents[(size_t)id * EXPERT_MAX_EXTENTS];
}

#endif
