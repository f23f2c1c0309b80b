/* commands.h — the moe-sidecar subcommands. Each lives in its own file and owns its options;
 * main.c only dispatches. A command returns the process exit status. */
#ifndef MOE_SIDECAR_COMMANDS_H
#define MOE_SIDECAR_COMMANDS_H

int cmd_serve(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_simulate(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_placement(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_verify(int argc, char **argv);

#endif
