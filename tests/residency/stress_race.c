/* stress_race.c — the residency concurrency scenarios as a plain program, for the TSan
 * variant, on one node and on three: Criterion 2.4 cannot start under ThreadSanitizer ("Could not
 * initialize inheritable arena", Snaipe/Criterion#274), so this runs without it. Exit 0 = all
 * passed. */
#include <errno.h>
#include <stdio.h>

#include "race_scenarios.h"

int main(void)
{
	int failed = 0, run = 0;
	for (uint32_t nodes = 1; nodes <= 3; nodes += 2) { /* one node; three */
		failed += race_overlapping_demands("lru", nodes) != 0;
		failed += race_overlapping_demands("sieve+layer", nodes) != 0;
		failed += race_overlapping_demands("sieve-heat+layer", nodes) != 0;
		failed += race_overlapping_demands_mixed("sieve+layer", nodes) != 0;
		failed += race_overlapping_demands_mixed("lru", nodes) != 0;
		failed += race_shared_load(0, nodes) != 0;
		failed += race_shared_load(-EIO, nodes) != 0;
		failed += race_failed_retries(nodes) != 0;
		failed += race_populate_layout(nodes) != 0;
		run += 9;
	}
	printf("stress_race: %d of %d scenarios failed\n", failed, run);
	return failed ? 1 : 0;
}
