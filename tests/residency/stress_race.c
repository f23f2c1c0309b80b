/* stress_race.c — the residency concurrency scenarios as a plain program, for the TSan
 * variant: Criterion 2.4 cannot start under ThreadSanitizer ("Could not initialize
 * inheritable arena", Snaipe/Criterion#274), so this runs without it. Exit 0 = all passed. */
#include <errno.h>
#include <stdio.h>

#include "race_scenarios.h"

int main(void)
{
	int failed = 0;
	failed += race_overlapping_demands("lru") != 0;
	failed += race_overlapping_demands("sieve+layer") != 0;
	failed += race_overlapping_demands("sieve-heat+layer") != 0;
	failed += race_shared_load(0) != 0;
	failed += race_shared_load(-EIO) != 0;
	failed += race_failed_retries() != 0;
	printf("stress_race: %d of 6 scenarios failed\n", failed);
	return failed ? 1 : 0;
}
