/* fault_hook.h — read-fault injection into a residency's loader, for tests only.
 *
 * Not part of the residency API (residency.h): the shipped daemon never sets a hook; tests
 * and the test-hooks daemon (MOE_TEST_HOOKS) do, to make chosen reads fail or come up short.
 * Threading: the hook runs on the loader thread, for every read completion, before the
 * completion is handled.
 */
#ifndef MOE_RESIDENCY_FAULT_HOOK_H
#define MOE_RESIDENCY_FAULT_HOOK_H

#include <stdint.h>

#include "residency.h"

struct residency;

/* What the hook is told about one read completion. */
struct loader_read_info {
	uint32_t layer, expert, file;
	uint32_t node;           /* whose loader read it (its slice of the expert) */
	uint64_t offset, length; /* of this read */
	uint32_t attempt;        /* 0 for the first submission of this read */
	uint64_t seq;            /* completions seen by this loader so far */
	uint32_t failed_loads;   /* the expert's consecutive failed loads before this one */
};

/* Returns the result to use instead of `res` (a shorter count: short read; -EIO: error). */
typedef int (*loader_fault_fn)(void *arg, const struct loader_read_info *info, int res);

/* Installs hook (NULL: none) with its argument, for every node's loader. Call before the
 * residency's first demand, prefetch or warm-up: the loader threads read it without a lock, ordered
 * after the call by the submission that starts a read. */
void residency_set_fault_hook(struct residency *r, loader_fault_fn hook, void *arg);

/* Called on a node's populate thread before it pre-faults group `group` of the node's pool;
 * it may hold the thread there (it must return before residency_destroy). */
typedef void (*loader_populate_fn)(void *arg, uint32_t node, uint32_t group);

/* residency_create_nodes with a populate hook, in place before the populate threads start. */
int residency_create_nodes_held(struct residency **out, const struct residency_node *nodes,
                                uint32_t n_nodes, const struct residency_config *config,
                                loader_populate_fn hook, void *arg, struct sidecar_error *err);

#endif /* MOE_RESIDENCY_FAULT_HOOK_H */
