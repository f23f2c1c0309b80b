/* metrics_http.h — `serve --metrics HOST:PORT`: /metrics, /healthz and /readyz over HTTP.
 *
 * Owns: the address check (loopback unless the operator opts in with --metrics-public) and
 * a libmicrohttpd daemon with one thread of its own. /metrics is the Prometheus exposition
 * of the STATS figures (stats_doc.h) plus moe_sidecar_ready and the dispatcher's heartbeats;
 * /healthz is 200 when the dispatcher writes a heartbeat within a second of being asked,
 * else 503; /readyz is 200 once the model is served (READY said), 503 before and from the
 * shutdown on. Any other path: 404; any method but GET and HEAD: 405.
 *
 * Threading: the HTTP thread never takes a lock of the request path. It reads the server's
 * health through atomics and the figures from the board the dispatcher publishes on request
 * (stats_board_ask, then dispatcher's tick), waiting at most a second for it.
 * Trust: the peer is anyone who can reach the address: requests are bounded in memory
 * (16 KiB per connection: a larger header is refused), time (10 s of idleness closes a
 * connection) and number (32 connections).
 * Without libmicrohttpd at build time metrics_http_start fails saying so.
 */
#ifndef MOE_SIDECAR_METRICS_HTTP_H
#define MOE_SIDECAR_METRICS_HTTP_H

#include <netinet/in.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "error.h"
#include "server.h"
#include "stats_doc.h"

struct metrics_addr {
	struct sockaddr_storage sa;
	socklen_t len;
	char text[80]; /* as given */
};

/* Whether this build serves --metrics (libmicrohttpd was found at configure time). */
bool metrics_http_built_in(void);

/* Parses HOST:PORT (an IPv4 address, [IPv6] or localhost; port 1..65535). A host that is
 * not loopback is refused unless allow_public. -1 with err filled. */
int metrics_addr_parse(const char *spec, bool allow_public, struct metrics_addr *out,
                       struct sidecar_error *err);

struct metrics_http;
/* Binds and starts serving; server must outlive it. -1 with err filled. */
int metrics_http_start(const struct metrics_addr *addr, struct server *server,
                       struct metrics_http **out, struct sidecar_error *err);
/* From the model's warm-up: the figures' board (the queue's). */
void metrics_http_set_board(struct metrics_http *h, struct stats_board *board);
/* Stops the thread and frees h (before the board and the server go). NULL: no-op. */
void metrics_http_stop(struct metrics_http *h);

#endif
