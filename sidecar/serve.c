/* serve.c — placeholder until the serving loop lands (issue: foundation). */
#include <stdio.h>

#include "commands.h"

int cmd_serve(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "moe-sidecar serve: not built yet\n");
	return 1;
}
