/* server.h — the control side of `moe-sidecar serve`: socket, peers, handshakes, lifetimes.
 *
 * Owns: the listening Unix socket and its lock file (listener.h), the table of connected
 * clients, the handshake (hello → limits → memfd channel → welcome with SCM_RIGHTS),
 * reclaiming a channel when its client hangs up or breaks the protocol, and the clean
 * shutdown on SIGINT/SIGTERM. It runs on the calling thread (the control thread) and starts
 * the dispatcher thread (dispatch.h), which alone touches the rings.
 *
 * Two steps, so that everything that can be checked without the model is checked before the
 * model is read: server_open (socket directory, the one-sidecar lock, bind and listen — or the
 * socket a service manager passed) runs first and fails in milliseconds; server_run answers.
 * With a model, server_run starts with no service: each hello is answered MOE_ESTARTING with
 * the warm-up's status (server_set_status) until another thread hands the service over
 * (server_ready); only then is READY said (log, --ready-fd, sd_notify READY=1). STATUS= and
 * STOPPING=1 go to the service manager too; the dispatcher feeds its watchdog.
 */
#ifndef MOE_SIDECAR_SERVER_H
#define MOE_SIDECAR_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "moe_proto.h"
#include "service.h"

#define SERVER_MAX_ALLOWED_UIDS 64u

struct server_config {
	const char *socket_path; /* NULL: server_default_socket_path() */
	/* Peers must run as our own uid, or as one of these when allow_list is set. With an
	 * allow-list the socket directory is 0711 and the socket 0666: SO_PEERCRED is the gate. */
	bool allow_list;
	uid_t allowed_uids[SERVER_MAX_ALLOWED_UIDS];
	uint32_t n_allowed_uids;
	uint32_t max_clients;       /* connected channels at once (<= 127) */
	uint64_t max_channel_bytes; /* refuse a hello whose channel would be larger */
	struct moe_limits defaults; /* used for the zero fields of a hello */
	int ready_fd;               /* >= 0: write "READY <path>\n" once serving, then close */
	uint64_t spin_ns;           /* dispatcher spin after work; 0 = default */
	int handshake_timeout_ms;   /* a peer that sends no complete hello is dropped */
	const struct channel_service *service; /* what the channels serve (service.h); NULL
	                                        * while a model warms up (server_ready) */
};

/* $XDG_RUNTIME_DIR/moe-sidecar/sidecar.sock, else /run/moe-sidecar/sidecar.sock. Returns 0,
 * or -1 if it does not fit in len. */
int server_default_socket_path(char *buf, size_t len);

struct server;

/* Step 1: resolves the socket path, checks or creates its directory, takes the lock (a second
 * sidecar on the same path fails here, naming the first), binds and listens (connections
 * wait in the backlog until server_run answers them). A
 * socket passed by socket activation ($LISTEN_FDS) is used instead, unchecked and never
 * unlinked (the service manager owns it). Reads only the socket fields of cfg; cfg must
 * outlive the server. cfg->service NULL: a model is warming up (server_ready). Returns 0, or
 * -1 with err filled (the caller logs it). */
int server_open(const struct server_config *cfg, struct server **out, struct sidecar_error *err);
/* Step 2: listens and serves until SIGINT or SIGTERM, or until server_start_failed; SIGHUP
 * asks the service to retry what failed (channel_service.reload). Then tears everything down
 * (the socket, every channel); s stays allocated for server_close. Returns 0 after a clean
 * shutdown, 1 on a start-up or fatal error with err filled (the caller logs it) — or, when
 * server_start_failed stopped it, err left as it was (whoever called that said why). Blocks
 * SIGINT/SIGTERM/SIGHUP and ignores SIGPIPE on the calling thread. */
int server_run(struct server *s, struct sidecar_error *err);
/* Frees s, after server_run or instead of it (removing the socket and lock it made). Only
 * once no other thread can call the functions below. NULL is a no-op. */
void server_close(struct server *s);

/* From any thread while server_run runs: the model is served now. The control thread
 * installs service and defaults (for the zero fields of a hello) and says READY. */
void server_ready(struct server *s, const struct channel_service *service,
                  const struct moe_limits *defaults);
/* From any thread: the model could not be served; server_run stops and returns 1. */
void server_start_failed(struct server *s);
/* From any thread: what the sidecar is doing while it starts ("reading experts: 40%"): the
 * sentence of the MOE_ESTARTING refusals, and STATUS= for the service manager. */
void server_set_status(struct server *s, const char *status);
/* Any thread, no lock (the metrics thread's health checks): whether READY was said and no
 * shutdown has begun, and the dispatcher's heartbeats so far (it writes one at least every
 * 100 ms, and at once after server_poke_dispatcher). Valid until server_close. */
struct server_health {
	bool ready;
	uint64_t dispatcher_beats;
};
void server_health(struct server *s, struct server_health *out);
void server_poke_dispatcher(struct server *s);
/* The socket's path as clients name it. */
const char *server_path(const struct server *s);

#endif
