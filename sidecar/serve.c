/* serve.c — `moe-sidecar serve`: options, then the server (server.h) until SIGINT/SIGTERM.
 *
 * Options are one table (name, argument, help) plus one switch, so later issues add
 * `serve MODEL` and more flags by adding rows. Only this file exits with a status.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "dispatch.h"
#include "log.h"
#include "server.h"

enum {
	OPT_SOCKET = 's',
	OPT_HELP = 'h',
	OPT_ALLOW_UID = 1000,
	OPT_READY_FD,
	OPT_MAX_CLIENTS,
	OPT_LOG_LEVEL,
	OPT_LOG_JSON,
	OPT_MAX_CHANNEL_MIB,
	OPT_SPIN_US,
};

static const struct serve_option {
	struct option opt;
	const char *arg, *help;
} serve_options[] = {
    {{"socket", required_argument, NULL, OPT_SOCKET},
     "PATH",
     "Unix socket (default $XDG_RUNTIME_DIR/moe-sidecar/sidecar.sock, else "
     "/run/moe-sidecar/sidecar.sock)"},
    {{"allow-uid", required_argument, NULL, OPT_ALLOW_UID},
     "UID[,UID...]",
     "also accept these uids (SO_PEERCRED); socket dir 0711, socket 0666"},
    {{"ready-fd", required_argument, NULL, OPT_READY_FD},
     "FD",
     "write \"READY <socket path>\\n\" to FD once listening, then close it"},
    {{"max-clients", required_argument, NULL, OPT_MAX_CLIENTS},
     "N",
     "clients served at once (default 64, at most 127)"},
    {{"max-channel-mib", required_argument, NULL, OPT_MAX_CHANNEL_MIB},
     "MIB",
     "largest channel a client may negotiate (default 4096)"},
    {{"spin-us", required_argument, NULL, OPT_SPIN_US},
     "US",
     "dispatcher keeps polling this long after the last request (default 50)"},
    {{"log-level", required_argument, NULL, OPT_LOG_LEVEL}, "L", "debug|info|warn|error"},
    {{"log-json", no_argument, NULL, OPT_LOG_JSON}, NULL, "log lines as JSON objects"},
    {{"help", no_argument, NULL, OPT_HELP}, NULL, "this text"},
};
#define N_SERVE_OPTIONS (sizeof(serve_options) / sizeof(serve_options[0]))

static void serve_usage(FILE *to)
{
	fprintf(to, "usage: moe-sidecar serve [options]\n\n");
	for (size_t i = 0; i < N_SERVE_OPTIONS; i++) {
		char left[48];
		snprintf(left, sizeof(left), "--%s%s%s", serve_options[i].opt.name,
		         serve_options[i].arg ? " " : "",
		         serve_options[i].arg ? serve_options[i].arg : "");
		fprintf(to, "  %-26s %s\n", left, serve_options[i].help);
	}
}

/* Parses an unsigned decimal in [min, max]; -1 if it is not one. */
static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-')
		return -1;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

static int parse_uid_list(const char *list, struct server_config *cfg)
{
	char buf[1024];
	if (snprintf(buf, sizeof(buf), "%s", list) >= (int)sizeof(buf))
		return -1;
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		uint64_t uid;
		if (parse_u64(tok, 0, UINT32_MAX - 1, &uid) != 0 ||
		    cfg->n_allowed_uids >= SERVER_MAX_ALLOWED_UIDS)
			return -1;
		cfg->allowed_uids[cfg->n_allowed_uids++] = (uid_t)uid;
	}
	cfg->allow_list = true;
	return cfg->n_allowed_uids ? 0 : -1;
}

int cmd_serve(int argc, char **argv)
{
	struct server_config cfg = {
	    .max_clients = 64,
	    .max_channel_bytes = 4096ull << 20,
	    .defaults = {.max_tokens = 256,
	                 .hidden = 4096,
	                 .top_k = 8,
	                 .n_slots = 4,
	                 .dtype_mask = MOE_DTYPE_MASK_ALL},
	    .ready_fd = -1,
	    .handshake_timeout_ms = 5000,
	};
	struct option longopts[N_SERVE_OPTIONS + 1];
	for (size_t i = 0; i < N_SERVE_OPTIONS; i++)
		longopts[i] = serve_options[i].opt;
	memset(&longopts[N_SERVE_OPTIONS], 0, sizeof(longopts[0]));

	uint64_t v;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "s:h", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_SOCKET: cfg.socket_path = optarg; break;
		case OPT_ALLOW_UID:
			if (parse_uid_list(optarg, &cfg) != 0) {
				fprintf(stderr,
				        "moe-sidecar serve: --allow-uid '%s': expected "
				        "UID[,UID...] (at most %u)\n",
				        optarg, SERVER_MAX_ALLOWED_UIDS);
				return 2;
			}
			break;
		case OPT_READY_FD:
			if (parse_u64(optarg, 0, INT_MAX, &v) != 0) {
				fprintf(stderr,
				        "moe-sidecar serve: --ready-fd '%s': not a file "
				        "descriptor\n",
				        optarg);
				return 2;
			}
			cfg.ready_fd = (int)v;
			break;
		case OPT_MAX_CLIENTS:
			if (parse_u64(optarg, 1, DISPATCH_MAX_CHANNELS, &v) != 0) {
				fprintf(stderr,
				        "moe-sidecar serve: --max-clients '%s': expected "
				        "1..%u\n",
				        optarg, DISPATCH_MAX_CHANNELS);
				return 2;
			}
			cfg.max_clients = (uint32_t)v;
			break;
		case OPT_MAX_CHANNEL_MIB:
			if (parse_u64(optarg, 1, 1u << 20, &v) != 0) {
				fprintf(stderr,
				        "moe-sidecar serve: --max-channel-mib '%s': expected "
				        "1..1048576\n",
				        optarg);
				return 2;
			}
			cfg.max_channel_bytes = v << 20;
			break;
		case OPT_SPIN_US:
			if (parse_u64(optarg, 0, 1000000, &v) != 0) {
				fprintf(stderr,
				        "moe-sidecar serve: --spin-us '%s': expected "
				        "0..1000000\n",
				        optarg);
				return 2;
			}
			cfg.spin_ns = v ? v * 1000 : 1; /* 0 would mean "default" */
			break;
		case OPT_LOG_LEVEL: {
			int l = log_level_parse(optarg);
			if (l < 0) {
				fprintf(stderr,
				        "moe-sidecar serve: --log-level '%s': expected "
				        "debug|info|warn|error\n",
				        optarg);
				return 2;
			}
			log_set_level((enum log_level)l);
			break;
		}
		case OPT_LOG_JSON: log_set_json(1); break;
		case OPT_HELP: serve_usage(stdout); return 0;
		default: serve_usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "moe-sidecar serve: unexpected argument '%s' (no model yet)\n",
		        argv[optind]);
		return 2;
	}
	return server_run(&cfg);
}
