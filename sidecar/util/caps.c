/* caps.c — see caps.h. */
#include "caps.h"

#include <stdio.h>

bool process_has_capability(unsigned cap)
{
	FILE *f = fopen("/proc/self/status", "re");
	if (!f)
		return false;
	char line[256];
	unsigned long long eff = 0;
	bool found = false;
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "CapEff: %llx", &eff) == 1;
	fclose(f);
	return found && cap < 64 && (eff >> cap & 1);
}
