/* test_residency_race.c — the concurrency scenarios (race_scenarios.c) as Criterion tests for
 * the default and ASan builds; stress_race.c runs the same scenarios under TSan. */
#include <criterion/criterion.h>
#include <errno.h>

#include "race_scenarios.h"

Test(residency_race, overlapping_demands_lru, .timeout = 120)
{
	cr_assert_eq(race_overlapping_demands("lru"), 0);
}

Test(residency_race, overlapping_demands_sieve_layer, .timeout = 120)
{
	cr_assert_eq(race_overlapping_demands("sieve+layer"), 0);
}

Test(residency_race, concurrent_demands_share_one_read, .timeout = 120)
{
	cr_assert_eq(race_shared_load(0), 0);
}

Test(residency_race, failure_reaches_every_waiter, .timeout = 120)
{
	cr_assert_eq(race_shared_load(-EIO), 0);
}

Test(residency_race, failed_experts_read_again_while_retried_by_the_operator, .timeout = 120)
{
	cr_assert_eq(race_failed_retries(), 0);
}
