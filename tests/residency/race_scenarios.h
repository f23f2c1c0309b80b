/* race_scenarios.h — the residency concurrency scenarios, shared by the Criterion test
 * (test_residency_race.c) and the standalone TSan program (stress_race.c). Each runs on
 * n_nodes nodes (1: one map of whole experts; more: every expert cut into a slice per node,
 * fixture_split) and returns 0, or prints what went wrong and returns -1. */
#ifndef MOE_TEST_RESIDENCY_RACE_SCENARIOS_H
#define MOE_TEST_RESIDENCY_RACE_SCENARIOS_H

/* Threads demand overlapping experts under `policy` while eviction runs. */
#include <stdint.h>

int race_overlapping_demands(const char *policy, uint32_t n_nodes);
/* The same over experts of two sizes (two slot size classes, each evicting its own). */
int race_overlapping_demands_mixed(const char *policy, uint32_t n_nodes);
/* Concurrent demands for one cold expert: exactly one read per node; with fail_with (< 0)
 * injected on every attempt of the last node's read, every waiter gets that error. */
int race_shared_load(int fail_with, uint32_t n_nodes);
/* Threads demand experts whose reads fail now and then (every demand after a failure reads
 * again: no backoff) while another ends every backoff in a loop (the operator's SIGHUP) and
 * reads the counters: each demand gets the bytes or -EIO, and the FAILED count adds up. */
int race_failed_retries(uint32_t n_nodes);
/* Threads demand experts of a pool populated one slot-group at a time (the populate thread
 * yielding before each), every load converted by a post-load stage (bytes inverted) that
 * refuses one expert: each demand gets the converted bytes or, for that expert, -EIO. */
int race_populate_layout(uint32_t n_nodes);

#endif
