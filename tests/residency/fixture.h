/* fixture.h — a small model file for residency tests: random bytes, experts made of
 * unaligned extents (odd offsets, odd lengths, gaps), the last one ending exactly at the end
 * of the file (so aligned reads run past EOF). Files live under a fresh mkdtemp directory. */
#ifndef MOE_TEST_RESIDENCY_FIXTURE_H
#define MOE_TEST_RESIDENCY_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "expert_map.h"
#include "fault_hook.h"
#include "residency.h"

struct fixture {
	char dir[128], path[192];
	struct expert_map map;
	uint64_t file_size;
	uint8_t *bytes; /* the file's content */
};

/* extent_len: base length of each extent (each gets a different odd length around it). */
void fixture_create(struct fixture *f, const char *parent, uint32_t layers, uint32_t experts,
                    uint32_t extents_per_expert, uint32_t extent_len);
void fixture_destroy(struct fixture *f);
/* Whether the reference's bytes equal pread of the file for every extent. */
bool fixture_ref_matches(const struct fixture *f, const struct expert_ref *ref);
struct residency *fixture_residency(struct fixture *f, struct residency_config *cfg);

#endif
