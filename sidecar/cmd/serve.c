/* serve.c — `moe-sidecar serve [MODEL]`: options, the model (served_model.h, forward_queue.h),
 * then the server (server.h) until SIGINT/SIGTERM.
 *
 * Options are one table (name, argument, help) plus one switch. Without MODEL the sidecar is
 * the PING/ECHO channel server; with it, a second thread opens the catalog, attaches the
 * page-cache probes and warms the engine while this one answers the socket ("starting", with
 * the warm-up's progress), then it serves FORWARD/PREFETCH/STATS/MASK. Only this file exits
 * with a status.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "dispatch.h"
#include "forward_queue.h"
#include "log.h"
#include "memlimit.h"
#include "metrics_http.h"
#include "moe_kernels.h"
#include "ops.h"
#include "option_values.h"
#include "policy.h"
#include "probes_instance.h"
#include "routing.h"
#include "sd_notify.h"
#include "served_model.h"
#include "server.h"
#include "trace_recorder.h"

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
	OPT_MEM_BUDGET,
	OPT_NUMA,
	OPT_THREADS,
	OPT_PIN_LAYERS,
	OPT_POLICY,
	OPT_REQUIRE_PROBES,
	OPT_PROBES_INSTANCE,
	OPT_MAX_TOKENS,
	OPT_NO_DIRECT,
	OPT_POOL_PAGES,
	OPT_FILE_LAYOUT,
	OPT_LEASES,
	OPT_LEASE_STAGING_MIB,
	OPT_FAIL_EXPERT,
	OPT_HOLD_POPULATE,
	OPT_HOLD_WARMUP,
	OPT_RETRY_BACKOFF,
	OPT_MEM_LIMIT,
	OPT_HEAT_HALF_LIFE,
	OPT_RECORD_TRACE,
	OPT_RECORD_TRACE_MAX_MIB,
	OPT_ISA,
	OPT_METRICS,
	OPT_METRICS_PUBLIC,
	OPT_BATCH_INVARIANT,
};

/* A help that lists what a parser accepts takes the list from that parser's own table:
 * help_arg fills the help's one %s. */
static const struct serve_option {
	struct option opt;
	const char *arg, *help;
	void (*help_arg)(char *buf, size_t len);
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
    {{"mem-budget", required_argument, NULL, OPT_MEM_BUDGET},
     "auto|BYTES|PCT%",
     "expert memory: bytes (K/M/G suffix) or a percentage of the model's expert bytes; auto "
     "(the default): every expert if it fits in 3/4 of the memory limit, else what does"},
    {{"mem-limit", required_argument, NULL, OPT_MEM_LIMIT},
     "BYTES",
     "memory the sidecar may use: experts, request buffers, channels (default: the lower "
     "of the cgroup limit and MemTotal less others' unreclaimable memory; never the page "
     "cache); one above the cgroup limit is lowered to it with a warning"},
    {{"numa", required_argument, NULL, OPT_NUMA},
     "auto|LIST",
     "NUMA nodes to serve from: auto, 0,1, or synthetic:<hwloc spec> (testing)"},
    {{"threads", required_argument, NULL, OPT_THREADS},
     "N",
     "worker threads per NUMA node (default: one per CPU of the node this process may use, "
     "counting hardware threads, not cores; more than those CPUs share them, with a "
     "warning)"},
    {{"pin-layers", required_argument, NULL, OPT_PIN_LAYERS},
     "N",
     "keep the first N MoE layers always resident"},
    {{"policy", required_argument, NULL, OPT_POLICY},
     "NAME",
     "residency policy: %s (default " POLICY_DEFAULT_SPEC ")",
     policy_spec_help},
    {{"max-tokens", required_argument, NULL, OPT_MAX_TOKENS},
     "N",
     "tokens per FORWARD a client may negotiate (default 256)"},
    {{"require-probes", no_argument, NULL, OPT_REQUIRE_PROBES},
     NULL,
     "refuse to start when the eBPF page-cache probes are unavailable"},
    {{"probes-instance", required_argument, NULL, OPT_PROBES_INSTANCE},
     "NAME",
     "pins under /sys/fs/bpf/moe-sidecar/NAME (default: sock-<hash of the socket path>, "
     "default for " PROBES_INSTANCE_SYSTEM_SOCKET ")"},
    {{"isa", required_argument, NULL, OPT_ISA},
     "NAME",
     "kernels' instruction set: scalar|avx2|avx512|amx (default: the best this CPU runs)"},
    {{"batch-invariant", no_argument, NULL, OPT_BATCH_INVARIANT},
     NULL,
     "every channel batch-invariant: a token's output bits never depend on the rest of its "
     "batch (a client may also ask per channel; docs/engines.md)"},
    {{"no-direct", no_argument, NULL, OPT_NO_DIRECT}, NULL, "buffered reads (no O_DIRECT)"},
    {{"pool-pages", required_argument, NULL, OPT_POOL_PAGES},
     "huge|auto",
     "the slot pool's pages: huge (THP, default) or auto (4 KiB pages while huge ones fault much "
     "slower: a faster cold start on VMs that take freed memory back, slower decode)"},
    {{"file-layout", no_argument, NULL, OPT_FILE_LAYOUT},
     NULL,
     "keep resident experts in the files' rows (no decode layout: comparisons)"},
    {{"leases", no_argument, NULL, OPT_LEASES},
     NULL,
     "share the slot pool read-only with clients: expert leases (docs/engines.md)"},
    {{"lease-staging-mib", required_argument, NULL, OPT_LEASE_STAGING_MIB},
     "MIB",
     "each channel's staging area for BF16 leases (default 0: none; with --leases)"},
    {{"retry-backoff", required_argument, NULL, OPT_RETRY_BACKOFF},
     "MS[,MAX]",
     "read a failed expert again after MS ms, doubling up to MAX (1000,60000; 0: at once)"},
    {{"heat-half-life", required_argument, NULL, OPT_HEAT_HALF_LIFE},
     "N",
     "per-expert heat halves every N tokens of its layer (default 1024; STATS, placement)"},
    {{"record-trace", required_argument, NULL, OPT_RECORD_TRACE},
     "FILE",
     "write the routing served to FILE as a routing trace (moe-sidecar simulate replays it); "
     "FILE: a regular file of this uid, or none (made 0600); links and FIFOs are refused"},
    {{"record-trace-max-mib", required_argument, NULL, OPT_RECORD_TRACE_MAX_MIB},
     "MIB",
     "stop recording before the trace reaches MIB MiB (default 1024)"},
#ifdef MOE_TEST_HOOKS
    {{"debug-fail-expert", required_argument, NULL, OPT_FAIL_EXPERT},
     "L:E[:N]",
     "testing: reads of layer L expert E fail with EIO (its first N loads; default all)"},
    {{"debug-hold-populate", required_argument, NULL, OPT_HOLD_POPULATE},
     "FD",
     "testing: the slot pools' populate threads wait for end-of-file on FD before starting"},
    {{"debug-hold-warmup", required_argument, NULL, OPT_HOLD_WARMUP},
     "FD",
     "testing: once warm, wait for end-of-file on FD before serving (a window of \"starting\")"},
#endif
    {{"metrics", required_argument, NULL, OPT_METRICS},
     "HOST:PORT",
     "serve /metrics (Prometheus), /healthz and /readyz over HTTP there; loopback only "
     "unless --metrics-public (docs/operations.md)"},
    {{"metrics-public", no_argument, NULL, OPT_METRICS_PUBLIC},
     NULL,
     "let --metrics listen on a non-loopback address (the endpoints have no authentication)"},
    {{"log-level", required_argument, NULL, OPT_LOG_LEVEL}, "L", "debug|info|warn|error"},
    {{"log-json", no_argument, NULL, OPT_LOG_JSON}, NULL, "log lines as JSON objects"},
    {{"help", no_argument, NULL, OPT_HELP}, NULL, "this text"},
};
#define N_SERVE_OPTIONS (sizeof(serve_options) / sizeof(serve_options[0]))

/* "  --name ARG   help…" with the help wrapped at word boundaries into an 80-column text,
 * continuation lines under its first word. */
static void print_wrapped(FILE *to, const char *left, const char *help)
{
	enum { INDENT = 35, WIDTH = 80 };
	fprintf(to, "  %-32s", left);
	int col = (int)strlen(left) > 32 ? 2 + (int)strlen(left) : INDENT - 1;
	if (col >= INDENT) {
		fprintf(to, "\n%*s", INDENT - 1, "");
		col = INDENT - 1;
	}
	for (const char *w = help; *w;) {
		size_t n = strcspn(w, " ");
		if (col > INDENT - 1 && col + 1 + (int)n > WIDTH) {
			fprintf(to, "\n%*s", INDENT - 1, "");
			col = INDENT - 1;
		}
		fprintf(to, " %.*s", (int)n, w);
		col += 1 + (int)n;
		w += n;
		w += strspn(w, " ");
	}
	fputc('\n', to);
}

static void serve_usage(FILE *to)
{
	fprintf(to, "usage: moe-sidecar serve [MODEL] [options]\n\n"
	            "MODEL: a .gguf file, a .safetensors file or a checkpoint directory. Without\n"
	            "it the sidecar serves PING and ECHO only (channel self-test).\n\n");
	for (size_t i = 0; i < N_SERVE_OPTIONS; i++) {
		char left[56];
		snprintf(left, sizeof(left), "--%s%s%s", serve_options[i].opt.name,
		         serve_options[i].arg ? " " : "",
		         serve_options[i].arg ? serve_options[i].arg : "");
		char help[256];
		if (serve_options[i].help_arg) {
			char arg[160];
			serve_options[i].help_arg(arg, sizeof(arg));
			snprintf(help, sizeof(help), serve_options[i].help, arg);
		} else {
			snprintf(help, sizeof(help), "%s", serve_options[i].help);
		}
		print_wrapped(to, left, help);
	}
}

/* auto (the default), BYTES (option_bytes), or PCT% in (0, 100]. */
static int parse_budget(const char *s, struct serve_model_config *mc)
{
	if (s && !strcmp(s, "auto")) {
		mc->mem_budget_bytes = 0;
		mc->mem_budget_percent = 0;
		return 0;
	}
	if (s && *s && s[strlen(s) - 1] == '%') {
		char *end;
		errno = 0;
		double pct = strtod(s, &end);
		if (errno || *s == '-' || end != s + strlen(s) - 1 || !(pct > 0 && pct <= 100))
			return -1;
		mc->mem_budget_percent = pct;
		return 0;
	}
	return option_bytes(s, &mc->mem_budget_bytes);
}

/* --isa NAME: the kernels run on that ISA from now on, or a line naming what this CPU lacks. */
static int set_isa(const char *name)
{
	char why[384];
	if (moek_isa_force(name, why, sizeof(why)) == 0)
		return 0;
	fprintf(stderr, "moe-sidecar serve: --isa %s\n", why);
	return -1;
}

static int parse_uid_list(const char *list, struct server_config *cfg)
{
	char buf[1024];
	if (snprintf(buf, sizeof(buf), "%s", list) >= (int)sizeof(buf))
		return -1;
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		uint64_t uid;
		if (option_u64(tok, 0, UINT32_MAX - 1, &uid) != 0 ||
		    cfg->n_allowed_uids >= SERVER_MAX_ALLOWED_UIDS)
			return -1;
		cfg->allowed_uids[cfg->n_allowed_uids++] = (uid_t)uid;
	}
	cfg->allow_list = true;
	return cfg->n_allowed_uids ? 0 : -1;
}

static void close_trace(int fd)
{
	if (fd >= 0 && close(fd) != 0)
		log_warn("serve", "--record-trace: close: %s", strerror(errno));
}

/* The model's warm-up, on its own thread: open it, start the request queue, hand both to the
 * server. On failure the server stops (server_run returns 1); the sentence is logged here. */
struct warm_up {
	struct server *server;
	const struct serve_model_config *mcfg;
	const struct forward_queue_config *ocfg;
	struct moe_limits defaults;
	int trace_fd;
	int hold_fd;               /* test hooks: wait for EOF on it before serving; -1: none */
	struct serve_model *model; /* set once open, for cmd_serve to close */
	struct forward_queue *queue;
	struct metrics_http *metrics; /* NULL: no --metrics */
};

static void say_status(void *arg, const char *sentence)
{
	server_set_status(arg, sentence);
}

static void *warm_up_main(void *arg)
{
	struct warm_up *w = arg;
	struct sidecar_error err = {0};
	int rc = serve_model_open(w->mcfg, &w->model, &err);
	if (rc == 0) {
		rc = forward_queue_create(w->model, w->ocfg, &w->queue, &err);
		if (rc != 0) {
			serve_model_close(w->model);
			w->model = NULL;
		}
	}
	close_trace(w->trace_fd); /* the recorder keeps its own descriptor */
	if (rc != 0) {
		log_error("serve", "%s", err.msg);
		server_start_failed(w->server);
		return NULL;
	}
	if (w->hold_fd >= 0) { /* only the test-hooks daemon parses the option */
		char b;
		ssize_t n;
		while ((n = read(w->hold_fd, &b, 1)) > 0 || (n < 0 && errno == EINTR))
			;
		close(w->hold_fd);
	}
	const struct serve_model_desc *d = serve_model_desc(w->model);
	w->defaults.hidden = d->hidden;
	w->defaults.top_k = d->max_top_k;
	if (w->defaults.max_tokens > d->max_tokens)
		w->defaults.max_tokens = d->max_tokens;
	metrics_http_set_board(w->metrics, forward_queue_board(w->queue));
	server_ready(w->server, forward_queue_service(w->queue), &w->defaults);
	return NULL;
}

/* Everything the command line sets: the server's, the model's and the queue's configurations. */
struct serve_setup {
	struct server_config cfg;
	struct serve_model_config mcfg;
	struct forward_queue_config ocfg;
	int hold_fd;         /* --debug-hold-warmup; -1: none */
	const char *metrics; /* --metrics HOST:PORT; NULL: none */
	bool metrics_public; /* --metrics-public */
	struct metrics_addr metrics_addr;
	char probes_instance[PROBES_INSTANCE_NAME_LEN]; /* without --probes-instance */
};

static void serve_setup_defaults(struct serve_setup *s)
{
	*s = (struct serve_setup){
	    .cfg =
	        {
	            .max_clients = 64,
	            .max_channel_bytes = 4096ull << 20,
	            .defaults = {.max_tokens = SERVE_MODEL_DEFAULT_MAX_TOKENS,
	                         .hidden = 4096,
	                         .top_k = 8,
	                         .n_slots = 4,
	                         .dtype_mask = MOE_DTYPE_MASK_ALL},
	            .ready_fd = -1,
	            .handshake_timeout_ms = 5000,
	            .service = &serving_without_model,
	        },
	    .mcfg =
	        {
	            .numa = "auto",
	            .max_tokens = SERVE_MODEL_DEFAULT_MAX_TOKENS,
	            .probes_instance = NULL,
#ifdef MOE_TEST_HOOKS
	            .fail_layer = -1,
	            .fail_expert = -1,
#endif
	        },
	    .hold_fd = -1,
	};
}

/* "moe-sidecar serve: --NAME 'ARG': " and the rest of the sentence; returns the usage status. */
__attribute__((format(printf, 3, 4))) static int option_error(const char *name, const char *arg,
                                                              const char *fmt, ...)
{
	fprintf(stderr, "moe-sidecar serve: --%s '%s': ", name, arg);
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 2;
}

#ifdef MOE_TEST_HOOKS
/* --debug-fail-expert L:E[:N]. */
static int parse_fail_expert(const char *arg, struct serve_model_config *mcfg)
{
	int layer, expert, loads = 0, n = 0, m = 0;
	bool ok = sscanf(arg, "%d:%d%n", &layer, &expert, &n) == 2 && layer >= 0 && expert >= 0;
	if (ok && arg[n] == ':')
		ok = sscanf(arg + n, ":%d%n", &loads, &m) == 1 && loads > 0;
	if (!ok || arg[n + m] != '\0')
		return -1;
	mcfg->fail_layer = layer;
	mcfg->fail_expert = expert;
	mcfg->fail_loads = (uint32_t)loads;
	return 0;
}
#endif

/* --retry-backoff MS[,MAX]. */
static int parse_retry_backoff(const char *arg, struct serve_model_config *mcfg)
{
	char first[24] = "", max[24] = "";
	const char *comma = strchr(arg, ',');
	snprintf(first, sizeof(first), "%.*s", (int)(comma ? (size_t)(comma - arg) : strlen(arg)),
	         arg);
	if (comma)
		snprintf(max, sizeof(max), "%s", comma + 1);
	uint64_t f, mx = 0;
	if (option_u64(first, 0, 86400000, &f) != 0 ||
	    (comma && (option_u64(max, 1, 86400000, &mx) != 0 || (f && mx < f))))
		return -1;
	mcfg->retry_backoff_ms = (uint32_t)f;
	mcfg->retry_without_backoff = f == 0;
	mcfg->retry_backoff_max_ms = (uint32_t)mx;
	return 0;
}

/* The socket's and the channels' options. 0, 2 (usage) or 1: not one of them. */
static int apply_server_option(int c, const char *arg, struct server_config *cfg)
{
	uint64_t v;
	switch (c) {
	case OPT_SOCKET: cfg->socket_path = arg; return 0;
	case OPT_ALLOW_UID:
		if (parse_uid_list(arg, cfg) != 0)
			return option_error("allow-uid", arg, "expected UID[,UID...] (at most %u)",
			                    SERVER_MAX_ALLOWED_UIDS);
		return 0;
	case OPT_READY_FD:
		if (option_u64(arg, 0, INT_MAX, &v) != 0)
			return option_error("ready-fd", arg, "not a file descriptor");
		cfg->ready_fd = (int)v;
		return 0;
	case OPT_MAX_CLIENTS:
		if (option_u64(arg, 1, DISPATCH_MAX_CHANNELS, &v) != 0)
			return option_error("max-clients", arg, "expected 1..%u",
			                    DISPATCH_MAX_CHANNELS);
		cfg->max_clients = (uint32_t)v;
		return 0;
	case OPT_MAX_CHANNEL_MIB:
		if (option_u64(arg, 1, 1u << 20, &v) != 0)
			return option_error("max-channel-mib", arg, "expected 1..1048576");
		cfg->max_channel_bytes = v << 20;
		return 0;
	case OPT_SPIN_US:
		if (option_u64(arg, 0, 1000000, &v) != 0)
			return option_error("spin-us", arg, "expected 0..1000000");
		cfg->spin_ns = v ? v * 1000 : 1; /* 0 would mean "default" */
		return 0;
	}
	return 1;
}

/* --threads, --pin-layers, --max-tokens: counts with their own ranges. */
static int apply_model_count(int c, const char *arg, struct serve_model_config *mcfg)
{
	uint64_t v;
	if (option_u64(arg, c == OPT_PIN_LAYERS ? 0 : 1,
	               c == OPT_MAX_TOKENS ? MOE_MAX_TOKENS_LIMIT : 4096, &v) != 0)
		return option_error(c == OPT_THREADS      ? "threads"
		                    : c == OPT_PIN_LAYERS ? "pin-layers"
		                                          : "max-tokens",
		                    arg, "expected %s",
		                    c == OPT_MAX_TOKENS ? "1..65536"
		                    : c == OPT_THREADS  ? "1..4096"
		                                        : "0..4096");
	if (c == OPT_THREADS)
		mcfg->threads = (uint32_t)v;
	else if (c == OPT_PIN_LAYERS)
		mcfg->pin_layers = (uint32_t)v;
	else
		mcfg->max_tokens = (uint32_t)v;
	return 0;
}

/* The model's options: memory, NUMA, threads, residency, reads. 0, 2 (usage) or 1: not one. */
static int apply_model_option(int c, const char *arg, struct serve_model_config *mcfg)
{
	switch (c) {
	case OPT_MEM_BUDGET:
		if (parse_budget(arg, mcfg) != 0)
			return option_error("mem-budget", arg,
			                    "expected BYTES (K/M/G/T suffix allowed) or a "
			                    "percentage like 50%%");
		return 0;
	case OPT_MEM_LIMIT:
		if (option_bytes(arg, &mcfg->mem_limit) != 0)
			return option_error("mem-limit", arg,
			                    "expected BYTES (K/M/G/T suffix allowed)");
		return 0;
	case OPT_NUMA: mcfg->numa = arg; return 0;
	case OPT_THREADS:
	case OPT_PIN_LAYERS:
	case OPT_MAX_TOKENS: return apply_model_count(c, arg, mcfg);
	case OPT_POLICY: mcfg->policy = arg; return 0;
	case OPT_REQUIRE_PROBES: mcfg->require_probes = true; return 0;
	case OPT_PROBES_INSTANCE: mcfg->probes_instance = arg; return 0;
	case OPT_NO_DIRECT: mcfg->no_direct = true; return 0;
	case OPT_POOL_PAGES:
		if (strcmp(arg, "huge") != 0 && strcmp(arg, "auto") != 0)
			return option_error("pool-pages", arg, "expected huge or auto");
		mcfg->pool_pages_auto = !strcmp(arg, "auto");
		return 0;
	case OPT_FILE_LAYOUT: mcfg->file_layout = true; return 0;
	case OPT_LEASES: mcfg->leases = true; return 0;
	case OPT_RETRY_BACKOFF:
		if (parse_retry_backoff(arg, mcfg) != 0)
			return option_error("retry-backoff", arg,
			                    "expected MS or MS,MAX in milliseconds (at most "
			                    "86400000, MAX >= MS)");
		return 0;
#ifdef MOE_TEST_HOOKS
	case OPT_FAIL_EXPERT:
		if (parse_fail_expert(arg, mcfg) != 0)
			return option_error("debug-fail-expert", arg,
			                    "expected LAYER:EXPERT or LAYER:EXPERT:LOADS");
		return 0;
	case OPT_HOLD_POPULATE: {
		uint64_t v;
		if (option_u64(arg, 0, INT_MAX, &v) != 0)
			return option_error("debug-hold-populate", arg, "not a file descriptor");
		mcfg->hold_populate = true;
		mcfg->hold_populate_fd = (int)v;
		return 0;
	}
#endif
	}
	return 1;
}

/* The request queue's options: routing heat and the trace recorder. 0, 2 or 1: not one. */
static int apply_queue_option(int c, const char *arg, struct forward_queue_config *ocfg)
{
	uint64_t v;
	switch (c) {
	case OPT_HEAT_HALF_LIFE:
		if (option_u64(arg, 1, ROUTING_HALF_LIFE_MAX, &v) != 0)
			return option_error("heat-half-life", arg, "expected 1..%u tokens",
			                    ROUTING_HALF_LIFE_MAX);
		ocfg->heat_half_life = (uint32_t)v;
		return 0;
	case OPT_RECORD_TRACE: ocfg->record_trace = arg; return 0;
	case OPT_LEASE_STAGING_MIB:
		if (option_u64(arg, 0, 1u << 20, &v) != 0)
			return option_error("lease-staging-mib", arg, "expected 0..1048576");
		ocfg->lease_staging_bytes = v << 20;
		return 0;
	case OPT_BATCH_INVARIANT: ocfg->batch_invariant = true; return 0;
	case OPT_RECORD_TRACE_MAX_MIB:
		if (option_u64(arg, 1, 1u << 20, &v) != 0)
			return option_error("record-trace-max-mib", arg, "expected 1..1048576");
		ocfg->record_trace_max_bytes = v << 20;
		return 0;
	}
	return 1;
}

/* The process-wide options (log, ISA) and the test hooks' hold. 0, 2 or 1: not one. */
static int apply_process_option(int c, const char *arg, struct serve_setup *s)
{
	switch (c) {
	case OPT_LOG_LEVEL: {
		int l = log_level_parse(arg);
		if (l < 0)
			return option_error("log-level", arg, "expected debug|info|warn|error");
		log_set_level((enum log_level)l);
		return 0;
	}
	case OPT_LOG_JSON: log_set_json(1); return 0;
	case OPT_METRICS: s->metrics = arg; return 0;
	case OPT_METRICS_PUBLIC: s->metrics_public = true; return 0;
	case OPT_ISA: return set_isa(arg) != 0 ? 2 : 0;
#ifdef MOE_TEST_HOOKS
	case OPT_HOLD_WARMUP: {
		uint64_t v;
		if (option_u64(arg, 0, INT_MAX, &v) != 0)
			return option_error("debug-hold-warmup", arg, "not a file descriptor");
		s->hold_fd = (int)v;
		return 0;
	}
#endif
	}
	(void)s;
	return 1;
}

/* One option into the setup, in the order of the table's groups: 0, 2 (usage) or 1 (unknown). */
static int apply_option(int c, const char *arg, struct serve_setup *s)
{
	int rc = apply_server_option(c, arg, &s->cfg);
	if (rc == 1)
		rc = apply_model_option(c, arg, &s->mcfg);
	if (rc == 1)
		rc = apply_queue_option(c, arg, &s->ocfg);
	if (rc == 1)
		rc = apply_process_option(c, arg, s);
	return rc;
}

/* The command line into *s: -1 to go on, else the status to exit with (0 after --help). */
static int parse_serve_args(int argc, char **argv, struct serve_setup *s)
{
	struct option longopts[N_SERVE_OPTIONS + 1];
	for (size_t i = 0; i < N_SERVE_OPTIONS; i++)
		longopts[i] = serve_options[i].opt;
	memset(&longopts[N_SERVE_OPTIONS], 0, sizeof(longopts[0]));
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "s:h", longopts, NULL)) != -1) {
		if (c == OPT_HELP) {
			serve_usage(stdout);
			return 0;
		}
		int rc = apply_option(c, optarg, s);
		if (rc == 1)
			serve_usage(stderr);
		if (rc != 0)
			return 2;
	}
	if (optind + 1 < argc) {
		fprintf(stderr, "moe-sidecar serve: unexpected argument '%s' (one MODEL only)\n",
		        argv[optind + 1]);
		return 2;
	}
	return -1;
}

/* Whatever needs no model is checked before the model is read (warming a large one takes
 * minutes): the options, the service manager's variables, the trace file. 0 or 2 (usage);
 * *trace_fd is the trace's descriptor or -1. */
static int check_before_the_model(struct serve_setup *s, bool with_model, int *trace_fd)
{
	struct sidecar_error err = {0};
	*trace_fd = -1;
	if (serve_model_check_config(&s->mcfg, &err) != 0) {
		fprintf(stderr, "moe-sidecar serve: %s\n", err.msg);
		return 2;
	}
	if (s->metrics_public && !s->metrics) {
		fprintf(stderr, "moe-sidecar serve: --metrics-public needs --metrics HOST:PORT\n");
		return 2;
	}
	if (s->metrics) {
		if (metrics_addr_parse(s->metrics, s->metrics_public, &s->metrics_addr, &err) !=
		    0) {
			fprintf(stderr, "moe-sidecar serve: %s\n", err.msg);
			return 2;
		}
		if (!metrics_http_built_in()) {
			struct metrics_http *none;
			metrics_http_start(&s->metrics_addr, NULL, &none, &err);
			fprintf(stderr, "moe-sidecar serve: %s\n", err.msg);
			return 2;
		}
	}
	if (!with_model && s->ocfg.record_trace) {
		fprintf(stderr, "moe-sidecar serve: --record-trace needs a MODEL\n");
		return 2;
	}
	/* The service manager's variables, read once before any thread exists. */
	if (sd_notify_init(&err) != 0) {
		fprintf(stderr, "moe-sidecar serve: %s\n", err.msg);
		return 2;
	}
	/* Opened (not truncated) before the socket is bound: a FIFO, a link or someone else's
	 * file is refused here, and nothing can block the start on it. */
	if (s->ocfg.record_trace) {
		*trace_fd = trace_recorder_open(s->ocfg.record_trace, &err);
		if (*trace_fd < 0) {
			fprintf(stderr, "moe-sidecar serve: %s\n", err.msg);
			return 2;
		}
		s->ocfg.record_trace_fd = *trace_fd;
	}
	return 0;
}

/* Blocked before any thread exists (every thread the model starts inherits it), or a signal
 * would kill the process instead of reaching the server's signalfd, which the control thread
 * reads from the start: SIGTERM during the warm-up closes the socket at once and stops once the
 * warm-up in progress ends. */
static int block_stop_signals(void)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	return pthread_sigmask(SIG_BLOCK, &set, NULL);
}

/* The memory limit, before anything large is allocated (memlimit.h), into the model's
 * configuration, and logged with where it comes from. */
static void set_memory_limit(struct serve_model_config *mcfg)
{
	struct mem_limit ml;
	mem_limit_read("", &ml);
	if (mcfg->mem_limit && mem_limit_cap(&ml, mcfg->mem_limit))
		log_warn("serve",
		         "--mem-limit %llu bytes is above the cgroup's memory limit of %llu bytes "
		         "(%s): lowered to the cgroup's, past which the kernel OOM-kills",
		         (unsigned long long)mcfg->mem_limit, (unsigned long long)ml.cgroup_bytes,
		         ml.cgroup_file);
	mcfg->mem_limit = ml.bytes;
	mcfg->mem_limit_from = ml.from;
	mcfg->mem_base = mem_rss_self();
	mcfg->mem_total = ml.total_bytes;
	log_info("serve",
	         "memory limit_bytes=%llu from=\"%s\" cgroup_limit_bytes=%llu%s%s%s "
	         "host_bytes=%llu (MemTotal %llu - others' anonymous/shared %llu - kernel %llu - "
	         "headroom %llu) mem_available_bytes=%llu (not used: it moves with the page "
	         "cache) process_bytes=%llu",
	         (unsigned long long)mcfg->mem_limit, mcfg->mem_limit_from,
	         (unsigned long long)ml.cgroup_bytes, ml.cgroup_file[0] ? " (" : "", ml.cgroup_file,
	         ml.cgroup_file[0] ? ")" : "", (unsigned long long)ml.host_bytes,
	         (unsigned long long)ml.total_bytes, (unsigned long long)ml.others_bytes,
	         (unsigned long long)ml.kernel_bytes, (unsigned long long)ml.headroom_bytes,
	         (unsigned long long)ml.available_bytes, (unsigned long long)mcfg->mem_base);
}

/* The model warms up on its own thread (it inherits the blocked signals) while this one
 * answers the socket; the server starts serving when the warm-up hands over. Closes the
 * server; returns the exit status. */
static int serve_model_until_stopped(struct server *server, struct serve_setup *s, const char *path,
                                     int trace_fd, struct metrics_http *metrics)
{
	s->mcfg.path = path;
	/* Without --probes-instance the instance follows the socket served (the one passed by
	 * the service manager included), so sidecars with different sockets never share one. */
	if (!s->mcfg.probes_instance) {
		struct sidecar_error err = {0};
		if (probes_instance_for_socket(server_path(server), s->probes_instance, &err) !=
		    0) {
			log_error("serve", "probes instance: %s", err.msg);
			close_trace(trace_fd);
			server_close(server);
			return 1;
		}
		s->mcfg.probes_instance = s->probes_instance;
	}
	log_info("serve", "probes instance=%s socket=%s", s->mcfg.probes_instance,
	         server_path(server));
	set_memory_limit(&s->mcfg);
	s->mcfg.status = say_status;
	s->mcfg.status_arg = server;
	struct warm_up w = {.server = server,
	                    .mcfg = &s->mcfg,
	                    .ocfg = &s->ocfg,
	                    .defaults = s->cfg.defaults,
	                    .trace_fd = trace_fd,
	                    .hold_fd = s->hold_fd,
	                    .metrics = metrics};
	pthread_t warm_thread;
	int rc = pthread_create(&warm_thread, NULL, warm_up_main, &w);
	if (rc != 0) {
		log_error("serve", "starting the warm-up thread: %s", strerror(rc));
		close_trace(trace_fd);
		metrics_http_stop(metrics);
		server_close(server);
		return 1;
	}
	struct sidecar_error run_err = {0};
	int status = server_run(server, &run_err);
	if (run_err.status != MOE_OK)
		log_error("serve", "%s", run_err.msg);
	pthread_join(warm_thread, NULL);
	metrics_http_stop(metrics); /* before the board (the queue's) and the server go */
	if (w.queue)
		forward_queue_destroy(w.queue);
	if (w.model)
		serve_model_close(w.model);
	server_close(server);
	return status;
}

int cmd_serve(int argc, char **argv)
{
	/* Before the first log line: a daemon whose stderr is a pipe that went away (`serve … |
	 * head`) would die of SIGPIPE at its next line, leaving its socket, lock and probe pins
	 * behind. Ignored, the write fails with EPIPE and log.c counts the line as dropped. */
	signal(SIGPIPE, SIG_IGN);
	struct serve_setup s;
	serve_setup_defaults(&s);
	int status = parse_serve_args(argc, argv, &s);
	if (status >= 0)
		return status;
	const bool with_model = optind < argc;
	int trace_fd;
	/* Then the socket, its directory and the one-sidecar lock (server_open), still before the
	 * model. */
	if (check_before_the_model(&s, with_model, &trace_fd) != 0)
		return 2;
	if (block_stop_signals() != 0) {
		log_error("serve", "pthread_sigmask failed");
		close_trace(trace_fd);
		return 1;
	}
	/* With a model the socket answers at once, "starting", until the model is served. */
	if (with_model)
		s.cfg.service = NULL;
	struct server *server;
	struct sidecar_error err = {0};
	if (server_open(&s.cfg, &server, &err) != 0) {
		log_error("server", "%s", err.msg);
		close_trace(trace_fd);
		return 1;
	}
	/* Before the model: /healthz and /readyz answer during the warm-up. */
	struct metrics_http *metrics = NULL;
	if (s.metrics) {
		if (metrics_http_start(&s.metrics_addr, server, &metrics, &err) != 0) {
			log_error("serve", "%s", err.msg);
			close_trace(trace_fd);
			server_close(server);
			return 1;
		}
		log_info("serve", "metrics http://%s/metrics, /healthz, /readyz (%s)", s.metrics,
		         s.metrics_public ? "--metrics-public" : "loopback");
	}
	if (!with_model) {
		struct sidecar_error run_err = {0};
		status = server_run(server, &run_err);
		if (run_err.status != MOE_OK)
			log_error("serve", "%s", run_err.msg);
		metrics_http_stop(metrics);
		server_close(server);
		return status;
	}
	return serve_model_until_stopped(server, &s, argv[optind], trace_fd, metrics);
}
