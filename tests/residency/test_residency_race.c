/* test_residency_race.c — the concurrency scenarios (race_scenarios.c) as Criterion tests for
 * the default and ASan builds, on one node and on several (each expert cut into a slice per
 * node); stress_race.c runs the same scenarios under TSan. */
#include <criterion/criterion.h>
#include <errno.h>

#include "race_scenarios.h"

Test(residency_race, overlapping_demands_lru, .timeout = 120)
{
	cr_assert_eq(race_overlapping_demands("lru", 1), 0);
}

Test(residency_race, overlapping_demands_sieve_layer, .timeout = 120)
{
	cr_assert_eq(race_overlapping_demands("sieve+layer", 1), 0);
}

Test(residency_race, overlapping_demands_lru_three_nodes, .timeout = 120)
{
	cr_assert_eq(race_overlapping_demands("lru", 3), 0);
}

Test(residency_race, overlapping_demands_sieve_layer_two_nodes, .timeout = 120)
{
	cr_assert_eq(race_overlapping_demands("sieve+layer", 2), 0);
}

Test(residency_race, overlapping_demands_two_sizes, .timeout = 120)
{
	cr_assert_eq(race_overlapping_demands_mixed("sieve+layer", 1), 0);
	cr_assert_eq(race_overlapping_demands_mixed("lru", 1), 0);
}

Test(residency_race, overlapping_demands_two_sizes_three_nodes, .timeout = 120)
{
	cr_assert_eq(race_overlapping_demands_mixed("sieve+layer", 3), 0);
}

Test(residency_race, concurrent_demands_share_one_read, .timeout = 120)
{
	cr_assert_eq(race_shared_load(0, 1), 0);
}

Test(residency_race, concurrent_demands_share_one_read_per_node, .timeout = 120)
{
	cr_assert_eq(race_shared_load(0, 4), 0);
}

Test(residency_race, failure_reaches_every_waiter, .timeout = 120)
{
	cr_assert_eq(race_shared_load(-EIO, 1), 0);
}

Test(residency_race, one_nodes_failure_reaches_every_waiter, .timeout = 120)
{
	cr_assert_eq(race_shared_load(-EIO, 3), 0);
}

Test(residency_race, failed_experts_read_again_while_retried_by_the_operator, .timeout = 120)
{
	cr_assert_eq(race_failed_retries(1), 0);
}

Test(residency_race, failed_slices_read_again_while_retried_by_the_operator, .timeout = 120)
{
	cr_assert_eq(race_failed_retries(2), 0);
}

Test(residency_race, populate_load_and_layout_stage, .timeout = 120)
{
	cr_assert_eq(race_populate_layout(1), 0);
	cr_assert_eq(race_populate_layout(3), 0);
}
