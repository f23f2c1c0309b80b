/* client_internal.h — test-only access to a client's raw channel.
 *
 * Not part of the API (moe_client.h is). Tests use it to play a hostile client: to write
 * arbitrary bytes into their own channel's rings, submissions and header.
 */
#ifndef MOE_CLIENT_INTERNAL_H
#define MOE_CLIENT_INTERNAL_H

#include "moe_client.h"
#include "moe_proto.h"
#include "moe_ring.h"

struct moe_client_raw {
	uint8_t *base; /* the mapping */
	uint64_t bytes;
	struct moe_layout layout; /* as the client computed it */
	struct moe_limits limits;
	uint64_t epoch;
	struct moe_ring_prod *sq; /* the client's own cursors */
	struct moe_ring_cons *cq;
};

void moe_client_raw(struct moe_client *c, struct moe_client_raw *out);

#endif
