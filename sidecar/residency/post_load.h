/* post_load.h — what a residency's post-load hook sees: an expert whose every read has
 * completed, in its slot. Shared by the residency's API (residency.h: the hook is part of its
 * configuration) and the loader that calls it (loader.h), so that neither includes the other.
 */
#ifndef MOE_RESIDENCY_POST_LOAD_H
#define MOE_RESIDENCY_POST_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "expert_map.h"

/* The hook owns the whole slot until it returns: it may rewrite any of slot[0, slot_bytes)
 * (e.g. convert the bytes to another layout in place); data[i] is where expert_ref will
 * point. */
#define RESIDENCY_POST_LOAD_MSG 160 /* bytes kept of a post-load failure's message */
struct residency_loaded {
	uint32_t layer, expert;
	uint32_t node; /* whose slice this is (0 with one node) */
	uint32_t n_extents;
	uint8_t *data[EXPERT_MAX_EXTENTS]; /* extent i's bytes, in map order */
	uint64_t length[EXPERT_MAX_EXTENTS];
	uint8_t *slot;
	size_t slot_bytes;
};
/* Post-load hook: called on the node's layout thread (one call at a time per node, never on
 * the loader thread, so the disk's queue stays full meanwhile) after the node's reads of an
 * expert, before the expert becomes RESIDENT; never on the request path.
 * Returns 0, or -1 with the record in err: the expert becomes FAILED with its message (kept
 * to RESIDENCY_POST_LOAD_MSG bytes; residency_error_message) and its slot is freed, as for a
 * read error. Demands then get the status as a negative errno: -ENOMEM for MOE_ENOMEM, -EIO
 * for MOE_EIO, else -EINVAL. */
typedef int (*residency_post_load_fn)(void *arg, const struct residency_loaded *x,
                                      struct sidecar_error *err);

#endif
