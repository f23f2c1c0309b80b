/* probe_cmd.c — `moe-sidecar probe`: placeholder until the command lands. */
#include <stdio.h>

#include "commands.h"

int cmd_probe(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "moe-sidecar probe: not built yet\n");
	return 1;
}
