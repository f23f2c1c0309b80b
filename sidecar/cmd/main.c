/* main.c — `moe-sidecar COMMAND [options]`: dispatch to a subcommand. Nothing else lives
 * here; each command parses its own options (see commands.h). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "moe_proto.h"

struct command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
};

static const struct command commands[] = {
    {"serve", cmd_serve, "serve engine clients over the shared-memory channel"},
    {"inspect", cmd_inspect, "show what a model holds: architecture, experts, formats, bytes"},
    {"simulate", cmd_simulate, "replay a routing trace through the residency policies"},
    {"probe", cmd_probe, "live page-cache counters (eBPF) for any process's reads of files"},
    {"stats", cmd_stats, "a running sidecar's hits, misses, latency and page-cache bypass"},
    {"placement", cmd_placement, "which experts to keep on the GPU, from a trace or a sidecar"},
    {"doctor", cmd_doctor, "check what serving needs on this machine, and what to change"},
    {"verify", cmd_verify, "served experts against an fp64 reference from the model's bytes"},
};

static void usage(FILE *to)
{
	fprintf(to, "usage: moe-sidecar COMMAND [options]   (COMMAND --help for its options)\n"
	            "       moe-sidecar --version\n\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(to, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("moe-sidecar %s (protocol ABI %u.%u)\n", MOE_VERSION, MOE_ABI_MAJOR,
		       MOE_ABI_MINOR);
		return 0;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "moe-sidecar: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return 2;
}
