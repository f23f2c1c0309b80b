/* metrics_http.c — /metrics, /healthz, /readyz on libmicrohttpd (see metrics_http.h). */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef MOE_HAVE_MHD
#include <microhttpd.h>

#include "clock.h"
#endif

/* How long a request waits for the dispatcher (a heartbeat, a published document). */
#define METRICS_ANSWER_MS 1000
#define METRICS_CONNECTION_MEMORY (16u << 10)
#define METRICS_CONNECTION_TIMEOUT_S 10u
#define METRICS_CONNECTIONS 32u
/* At most one poke of the dispatcher per this many ns: a client polling the endpoints in a
 * loop must not turn into a dispatcher that wakes up for it thousands of times a second. */
#define METRICS_POKE_EVERY_NS 10000000u

bool metrics_http_built_in(void)
{
#ifdef MOE_HAVE_MHD
	return true;
#else
	return false;
#endif
}

static bool is_loopback(const struct sockaddr_storage *sa)
{
	if (sa->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
	return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
}

int metrics_addr_parse(const char *spec, bool allow_public, struct metrics_addr *out,
                       struct sidecar_error *err)
{
	memset(out, 0, sizeof(*out));
	snprintf(out->text, sizeof(out->text), "%s", spec);
	const char *colon = strrchr(spec, ':');
	char host[64];
	if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host))
		return error_set(err, MOE_EINVAL,
		                 "--metrics '%s': expected HOST:PORT (127.0.0.1:9464, [::1]:9464)",
		                 spec);
	snprintf(host, sizeof(host), "%.*s", (int)(colon - spec), spec);
	char *end;
	errno = 0;
	const unsigned long port = strtoul(colon + 1, &end, 10);
	if (errno || *end || colon[1] == '\0' || colon[1] == '-' || port == 0 || port > 65535)
		return error_set(err, MOE_EINVAL, "--metrics '%s': port: expected 1..65535", spec);
	struct sockaddr_in *in = (struct sockaddr_in *)(void *)&out->sa;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)(void *)&out->sa;
	const size_t hl = strlen(host);
	if (!strcmp(host, "localhost")) {
		in->sin_family = AF_INET;
		in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		in->sin_port = htons((uint16_t)port);
		out->len = sizeof(*in);
	} else if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
		host[hl - 1] = '\0';
		if (inet_pton(AF_INET6, host + 1, &in6->sin6_addr) != 1)
			return error_set(err, MOE_EINVAL, "--metrics '%s': not an IPv6 address",
			                 spec);
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		out->len = sizeof(*in6);
	} else if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
		in->sin_family = AF_INET;
		in->sin_port = htons((uint16_t)port);
		out->len = sizeof(*in);
	} else {
		return error_set(err, MOE_EINVAL,
		                 "--metrics '%s': host: expected an IPv4 address, [IPv6] or "
		                 "localhost (no names: the address must not depend on DNS)",
		                 spec);
	}
	if (!allow_public && !is_loopback(&out->sa))
		return error_set(err, MOE_EINVAL,
		                 "--metrics '%s': not a loopback address; the endpoints have no "
		                 "authentication: add --metrics-public to serve them there",
		                 spec);
	return 0;
}

#ifndef MOE_HAVE_MHD

int metrics_http_start(const struct metrics_addr *addr, struct server *server,
                       struct metrics_http **out, struct sidecar_error *err)
{
	(void)addr;
	(void)server;
	*out = NULL;
	return error_set(err, MOE_EINVAL,
	                 "--metrics: this moe-sidecar was built without libmicrohttpd "
	                 "(install libmicrohttpd-dev and rebuild); STATS and `moe-sidecar stats "
	                 "--prometheus` still give the figures");
}

void metrics_http_set_board(struct metrics_http *h, struct stats_board *board)
{
	(void)h;
	(void)board;
}

void metrics_http_stop(struct metrics_http *h)
{
	(void)h;
}

#else

struct metrics_http {
	struct MHD_Daemon *daemon;
	struct server *server;
	_Atomic(struct stats_board *) board;
	struct stats_doc doc;  /* the HTTP thread's copy (one thread: MHD's) */
	uint64_t last_poke_ns; /* HTTP thread */
};

/* Wakes the dispatcher for a heartbeat now, unless it was woken very recently (it writes one
 * every 100 ms anyway). */
static void poke(struct metrics_http *h)
{
	const uint64_t now = monotonic_ns();
	if (now - h->last_poke_ns < METRICS_POKE_EVERY_NS)
		return;
	h->last_poke_ns = now;
	server_poke_dispatcher(h->server);
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000};
	nanosleep(&ts, NULL);
}

/* Whether the dispatcher writes a heartbeat within METRICS_ANSWER_MS of being asked. */
static bool dispatcher_answers(struct metrics_http *h)
{
	struct server_health before, now;
	server_health(h->server, &before);
	poke(h);
	for (int waited = 0; waited < METRICS_ANSWER_MS; waited++) {
		server_health(h->server, &now);
		if (now.dispatcher_beats != before.dispatcher_beats)
			return true;
		sleep_ms(1);
	}
	return false;
}

/* A fresh document from the dispatcher, or the last one if it does not answer in time;
 * false when there is none (the model is not served yet). */
static bool read_figures(struct metrics_http *h, struct stats_board *b)
{
	if (h->doc.cap_layers < stats_board_capacity(b)) {
		struct sidecar_error err;
		stats_doc_free(&h->doc);
		if (stats_doc_init(&h->doc, stats_board_capacity(b), &err) != 0)
			return false;
	}
	const uint64_t ticket = stats_board_ask(b);
	poke(h);
	for (int waited = 0; waited < METRICS_ANSWER_MS && !stats_board_fresh(b, ticket); waited++)
		sleep_ms(1);
	return stats_board_read(b, &h->doc);
}

static char *metrics_text(struct metrics_http *h, size_t *len)
{
	char *text = NULL;
	FILE *f = open_memstream(&text, len);
	if (!f)
		return NULL;
	struct server_health health;
	server_health(h->server, &health);
	fprintf(f,
	        "# HELP moe_sidecar_ready 1 once the model is served (READY), 0 before and while "
	        "stopping\n# TYPE moe_sidecar_ready gauge\nmoe_sidecar_ready %d\n"
	        "# HELP moe_sidecar_dispatcher_heartbeats_total Heartbeats the dispatcher wrote\n"
	        "# TYPE moe_sidecar_dispatcher_heartbeats_total counter\n"
	        "moe_sidecar_dispatcher_heartbeats_total %llu\n",
	        health.ready ? 1 : 0, (unsigned long long)health.dispatcher_beats);
	struct stats_board *b = atomic_load_explicit(&h->board, memory_order_acquire);
	if (b && read_figures(h, b))
		stats_doc_write_prometheus(&h->doc, f);
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *type,
                              char *body, size_t len, bool owned)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
	    len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	if (!r) {
		if (owned)
			free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	const enum MHD_Result rc = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return rc;
}

static enum MHD_Result answer_static(struct MHD_Connection *c, unsigned status, const char *text)
{
	return answer(c, status, "text/plain; charset=utf-8", (char *)(uintptr_t)text, strlen(text),
	              false);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **state)
{
	struct metrics_http *h = cls;
	(void)version;
	(void)upload;
	(void)upload_len;
	(void)state;
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return answer_static(c, MHD_HTTP_METHOD_NOT_ALLOWED,
		                     "method not allowed: GET /metrics, /healthz or /readyz\n");
	if (!strcmp(url, "/metrics")) {
		size_t len;
		char *text = metrics_text(h, &len);
		if (!text)
			return answer_static(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
		return answer(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len,
		              true);
	}
	if (!strcmp(url, "/healthz"))
		return dispatcher_answers(h)
		           ? answer_static(c, MHD_HTTP_OK, "ok\n")
		           : answer_static(c, MHD_HTTP_SERVICE_UNAVAILABLE,
		                           "the dispatcher wrote no heartbeat within 1 s of being "
		                           "asked\n");
	if (!strcmp(url, "/readyz")) {
		struct server_health health;
		server_health(h->server, &health);
		return health.ready ? answer_static(c, MHD_HTTP_OK, "ready\n")
		                    : answer_static(c, MHD_HTTP_SERVICE_UNAVAILABLE,
		                                    "not ready: the model is warming up, or the "
		                                    "sidecar is stopping\n");
	}
	return answer_static(c, MHD_HTTP_NOT_FOUND,
	                     "not found: GET /metrics, /healthz or /readyz\n");
}

int metrics_http_start(const struct metrics_addr *addr, struct server *server,
                       struct metrics_http **out, struct sidecar_error *err)
{
	*out = NULL;
	struct metrics_http *h = calloc(1, sizeof(*h));
	if (!h)
		return error_set(err, MOE_ENOMEM, "out of memory");
	h->server = server;
	atomic_init(&h->board, NULL);
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
	if (addr->sa.ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	const uint16_t port =
	    addr->sa.ss_family == AF_INET6
	        ? ntohs(((const struct sockaddr_in6 *)(const void *)&addr->sa)->sin6_port)
	        : ntohs(((const struct sockaddr_in *)(const void *)&addr->sa)->sin_port);
	h->daemon = MHD_start_daemon(
	    flags, port, NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR,
	    (const struct sockaddr *)&addr->sa, MHD_OPTION_CONNECTION_TIMEOUT,
	    (unsigned)METRICS_CONNECTION_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
	    (size_t)METRICS_CONNECTION_MEMORY, MHD_OPTION_CONNECTION_LIMIT,
	    (unsigned)METRICS_CONNECTIONS, MHD_OPTION_END);
	if (!h->daemon) {
		const int e = errno;
		free(h);
		return error_set(err, MOE_ESYS, "--metrics %s: cannot serve HTTP there: %s%s",
		                 addr->text, e ? strerror(e) : "libmicrohttpd refused to start",
		                 e == EAFNOSUPPORT || e == EPERM
		                     ? " (under the shipped systemd unit, a drop-in must allow "
		                       "AF_INET and the host's network: docs/operations.md)"
		                     : "");
	}
	*out = h;
	return 0;
}

void metrics_http_set_board(struct metrics_http *h, struct stats_board *board)
{
	if (h)
		atomic_store_explicit(&h->board, board, memory_order_release);
}

void metrics_http_stop(struct metrics_http *h)
{
	if (!h)
		return;
	MHD_stop_daemon(h->daemon);
	stats_doc_free(&h->doc);
	free(h);
}

#endif
