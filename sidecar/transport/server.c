/* server.c — listening socket, peer checks, handshakes and client lifetimes (see server.h).
 *
 * Everything here runs on the control thread, driven by one epoll set: the listening socket,
 * a signalfd (SIGINT/SIGTERM), an eventfd the dispatcher writes when it drops a client, and
 * every client socket. Client sockets are non-blocking; a handshake that stalls cannot stall
 * anyone else. A client socket stays open for its channel's lifetime: hang-up means gone.
 *
 * Reclaim order for a departed client: take the channel away from the dispatcher (it never
 * touches it again), then unmap it and close the memfd, then close the socket.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "channel.h"
#include "clock.h"
#include "dispatch.h"
#include "listener.h"
#include "log.h"
#include "sd_notify.h"

#define HELLO_MAX_BYTES 4096u
/* Connections of one uid still in the handshake (accepted, no complete hello yet). The table
 * holds max_clients plus this many per uid that may connect, so a uid that floods the
 * handshake (connecting and sending nothing, each held up to handshake_timeout_ms) fills only
 * its own share: every other allowed uid always finds an entry. Uids that may not connect are
 * refused at accept and take none. */
#define HANDSHAKES_PER_UID 16u

enum { TAG_LISTEN = 1, TAG_SIGNAL, TAG_DROPPED, TAG_HANDOVER, TAG_CONN_BASE = 16 };

enum conn_state { CONN_FREE = 0, CONN_HELLO, CONN_SERVING };

struct conn {
	enum conn_state state;
	int fd;
	uint32_t id;
	pid_t pid;
	uid_t uid;
	uint64_t since_ns;
	size_t have;
	uint8_t *hello; /* HELLO_MAX_BYTES while in the handshake, else NULL */
	char name[32];
	struct sidecar_channel *ch;
};

struct server {
	const struct server_config *cfg;
	struct listener listener;
	int signal_fd, dropped_fd, epoll_fd;
	struct dispatcher dispatcher;
	bool dispatcher_stopped;
	struct conn *conns;
	uint32_t n_conns_cap, n_serving, next_id;
	/* Lines about connections refused or dropped at accept: peers can repeat them at will. */
	struct log_ratelimit refused_log, dropped_log;
	/* What is served, control thread only: NULL while the model warms up (every hello is
	 * answered MOE_ESTARTING with the warm-up's status), then what server_ready handed over. */
	const struct channel_service *service;
	struct moe_limits defaults;
	/* The hand-over from the thread that warms the model: written under handover_lock, then
	 * handover_fd (an eventfd) wakes the control thread, which takes it. */
	pthread_mutex_t handover_lock;
	int handover_fd;
	bool announced;       /* READY was said */
	_Atomic bool serving; /* READY said and no shutdown begun: server_health's ready */
	struct {
		bool ready, failed;
		const struct channel_service *service;
		struct moe_limits defaults;
		char status[MOE_REASON_LEN - 48];
	} handover;
};

static uint64_t conn_tag(uint32_t id, uint32_t index)
{
	return ((uint64_t)id << 32) | (TAG_CONN_BASE + index);
}

int server_default_socket_path(char *buf, size_t len)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n;
	if (xdg && xdg[0] == '/')
		n = snprintf(buf, len, "%s/moe-sidecar/sidecar.sock", xdg);
	else
		n = snprintf(buf, len, "/run/moe-sidecar/sidecar.sock");
	return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* ---- Connections ----------------------------------------------------------------------- */

static bool uid_allowed(const struct server_config *cfg, uid_t uid)
{
	if (uid == geteuid())
		return true;
	if (cfg->allow_list)
		for (uint32_t i = 0; i < cfg->n_allowed_uids; i++)
			if (cfg->allowed_uids[i] == uid)
				return true;
	return false;
}

/* Our own uid, plus the distinct other uids of the allow-list. */
static uint32_t uids_that_may_connect(const struct server_config *cfg)
{
	uint32_t n = 1;
	for (uint32_t i = 0; cfg->allow_list && i < cfg->n_allowed_uids; i++) {
		bool seen = cfg->allowed_uids[i] == geteuid();
		for (uint32_t j = 0; j < i && !seen; j++)
			seen = cfg->allowed_uids[j] == cfg->allowed_uids[i];
		n += !seen;
	}
	return n;
}

static void service_channel_close(struct server *s, struct sidecar_channel *ch)
{
	if (s->service->channel_close)
		s->service->channel_close(s->service->ctx, ch);
}

static void conn_close(struct server *s, struct conn *c, const char *why)
{
	const bool serving = c->state == CONN_SERVING;
	uint64_t requests = 0, errors = 0;
	if (serving) {
		if (!s->dispatcher_stopped)
			dispatcher_remove(&s->dispatcher, c->ch);
		service_channel_close(s, c->ch); /* waits for what it runs for the channel */
		requests = c->ch->n_requests;
		errors = c->ch->n_errors;
		channel_destroy(c->ch);
		c->ch = NULL;
		s->n_serving--;
	}
	if (epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL) != 0)
		log_warn("server", "epoll_ctl DEL client fd: %s", strerror(errno));
	close(c->fd);
	/* Logged once everything is released: the line means "reclaimed". */
	if (serving)
		log_info("server",
		         "client disconnected id=%u pid=%d uid=%u name=%s requests=%llu "
		         "errors=%llu reason=\"%s\"",
		         c->id, (int)c->pid, (unsigned)c->uid, c->name,
		         (unsigned long long)requests, (unsigned long long)errors, why);
	else
		log_debug("server", "connection closed during handshake id=%u pid=%d reason=\"%s\"",
		          c->id, (int)c->pid, why);
	free(c->hello);
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

static void welcome_base(struct moe_welcome *w, int status)
{
	memset(w, 0, sizeof(*w));
	w->magic = MOE_WELCOME_MAGIC;
	w->abi_major = MOE_ABI_MAJOR;
	w->abi_minor = MOE_ABI_MINOR;
	w->size = sizeof(*w);
	w->status = status;
	w->sidecar_pid = (uint32_t)getpid();
}

static void refuse(struct server *s, struct conn *c, int status, const char *reason)
{
	struct moe_welcome w;
	welcome_base(&w, status);
	snprintf(w.reason, sizeof(w.reason), "%s", reason);
	/* A client waiting for the warm-up asks again every 100 ms: not a warning. */
	log_event(status == MOE_ESTARTING ? LOG_DEBUG : LOG_WARN, "server",
	          "refused client pid=%d uid=%u name=%s status=%s reason=\"%s\"", (int)c->pid,
	          (unsigned)c->uid, c->name[0] ? c->name : "?", moe_status_str(status), reason);
	if (send(c->fd, &w, sizeof(w), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(w))
		log_debug("server", "refusal to pid=%d not delivered: %s", (int)c->pid,
		          strerror(errno));
	conn_close(s, c, "refused");
}

/* The welcome with the channel's memfd and after it the lease pools' (l->n_pools), then the
 * staging area's when there is one (a client before ABI 1.3 closes those unread). */
static int send_welcome(int fd, const struct moe_welcome *w, int memfd,
                        const struct service_lease_fds *l)
{
	struct iovec iov = {.iov_base = (void *)w, .iov_len = sizeof(*w)};
	int fds[2 + MOE_LEASE_MAX_POOLS];
	size_t n_fds = 0;
	fds[n_fds++] = memfd;
	for (uint32_t i = 0; i < l->n_pools; i++)
		fds[n_fds++] = l->pool[i];
	if (l->n_pools && l->staging >= 0)
		fds[n_fds++] = l->staging;
	union {
		char buf[CMSG_SPACE((2 + MOE_LEASE_MAX_POOLS) * sizeof(int))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof(u));
	struct msghdr msg = {.msg_iov = &iov,
	                     .msg_iovlen = 1,
	                     .msg_control = u.buf,
	                     .msg_controllen = CMSG_SPACE(n_fds * sizeof(int))};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, n_fds * sizeof(int));
	ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	return n == (ssize_t)sizeof(*w) ? 0 : -1;
}

/* Fills granted limits from a hello; 0 or -1 with the refusal's reason in why. */
static int negotiate(const struct server *s, const struct moe_hello *h, struct moe_limits *g,
                     struct sidecar_error *why)
{
	const struct moe_limits *d = &s->defaults;
	*g = h->want;
	if (!g->max_tokens)
		g->max_tokens = d->max_tokens;
	if (!g->hidden)
		g->hidden = d->hidden;
	if (!g->top_k)
		g->top_k = d->top_k;
	if (!g->n_slots)
		g->n_slots = d->n_slots;
	if (!g->dtype_mask)
		g->dtype_mask = d->dtype_mask;
	g->ring_entries = g->n_slots <= MOE_MAX_SLOTS_LIMIT ? moe_pow2_ceil(g->n_slots) : 0;
	char lim_why[120];
	if (moe_limits_check(g, lim_why, sizeof(lim_why)) != MOE_OK)
		return error_set(why, MOE_EREFUSED, "requested limits: %s", lim_why);
	const struct channel_service *sv = s->service;
	if (sv->grant && sv->grant(sv->ctx, g, why) != 0)
		return -1;
	struct moe_layout l;
	moe_layout_compute(g, &l);
	if (l.total > s->cfg->max_channel_bytes)
		return error_set(why, MOE_EREFUSED,
		                 "channel would be %llu MiB, above this sidecar's limit of "
		                 "%llu MiB (--max-channel-mib)",
		                 (unsigned long long)(l.total >> 20),
		                 (unsigned long long)(s->cfg->max_channel_bytes >> 20));
	return 0;
}

static void handle_hello(struct server *s, struct conn *c, size_t len)
{
	char why[MOE_REASON_LEN];
	struct moe_hello h;
	int rc = moe_hello_parse(c->hello, len, &h, why, sizeof(why));
	if (rc == MOE_OK)
		snprintf(c->name, sizeof(c->name), "%s", h.client_name);
	if (rc != MOE_OK) {
		refuse(s, c, rc, why);
		return;
	}
	if (h.flags & ~MOE_HELLO_FLAGS_ALL) {
		snprintf(why, sizeof(why),
		         "hello flags 0x%x: bits 0x%x unknown to this sidecar (known: 0x%x, "
		         "MOE_HELLO_BATCH_INVARIANT)",
		         h.flags, h.flags & ~MOE_HELLO_FLAGS_ALL, MOE_HELLO_FLAGS_ALL);
		refuse(s, c, MOE_EPROTO, why);
		return;
	}
	if (!s->service) {
		pthread_mutex_lock(&s->handover_lock);
		snprintf(why, sizeof(why), "%s", s->handover.status);
		pthread_mutex_unlock(&s->handover_lock);
		refuse(s, c, MOE_ESTARTING, why);
		return;
	}
	if (s->n_serving >= s->cfg->max_clients) {
		snprintf(why, sizeof(why), "this sidecar already serves its maximum of %u clients",
		         s->cfg->max_clients);
		refuse(s, c, MOE_EREFUSED, why);
		return;
	}
	struct moe_limits g;
	struct sidecar_error err = {0};
	if (negotiate(s, &h, &g, &err) != 0) {
		refuse(s, c, MOE_EREFUSED, err.msg);
		return;
	}
	struct sidecar_channel *ch;
	if (channel_create(&g, &ch, &err) != 0) {
		log_error("server", "client pid=%d: %s", (int)c->pid, err.msg);
		refuse(s, c, MOE_ENOMEM, "the sidecar could not create the channel");
		return;
	}
	ch->id = c->id;
	ch->ops = s->service->ops;
	ch->hello_flags = h.flags;
	ch->hello_minor = h.abi_minor;
	if (s->service->channel_open && s->service->channel_open(s->service->ctx, ch, &err) != 0) {
		channel_destroy(ch); /* refuse() logs the reason */
		refuse(s, c, MOE_EREFUSED, err.msg);
		return;
	}
	if ((h.flags & MOE_HELLO_BATCH_INVARIANT) &&
	    !(ch->welcome_flags & MOE_WELCOME_BATCH_INVARIANT)) {
		service_channel_close(s, ch);
		channel_destroy(ch);
		refuse(s, c, MOE_EREFUSED,
		       "batch-invariant results asked for (MOE_HELLO_BATCH_INVARIANT), but this "
		       "sidecar serves no model");
		return;
	}
	struct moe_welcome w;
	welcome_base(&w, MOE_OK);
	w.flags = ch->welcome_flags;
	w.channel_bytes = ch->bytes;
	w.epoch = ch->epoch;
	w.limits = g;
	if (s->service->welcome)
		s->service->welcome(s->service->ctx, &w.model, w.fingerprint);
	struct service_lease_fds lf = {.staging = -1};
	if (s->service->lease_fds)
		s->service->lease_fds(s->service->ctx, ch, &lf);
	if (lf.n_pools > MOE_LEASE_MAX_POOLS)
		lf.n_pools = 0;
	for (uint32_t i = 0; i < lf.n_pools; i++)
		if (lf.pool[i] < 0)
			lf.n_pools = 0;
	w.lease_pools = lf.n_pools;
	w.lease_pool_bytes = lf.n_pools ? lf.pool_bytes[0] : 0;
	w.lease_staging_bytes = lf.n_pools && lf.staging >= 0 ? lf.staging_bytes : 0;
	if (send_welcome(c->fd, &w, ch->memfd, &lf) != 0) {
		log_warn("server", "client pid=%d: sending the welcome failed: %s", (int)c->pid,
		         strerror(errno));
		service_channel_close(s, ch);
		channel_destroy(ch);
		conn_close(s, c, "welcome not delivered");
		return;
	}
	c->ch = ch;
	c->state = CONN_SERVING;
	free(c->hello); /* the handshake is over */
	c->hello = NULL;
	s->n_serving++;
	dispatcher_add(&s->dispatcher, ch, c);
	log_info("server",
	         "client connected id=%u pid=%d uid=%u name=%s abi=%u.%u tokens=%u "
	         "hidden=%u top_k=%u slots=%u channel_bytes=%llu",
	         c->id, (int)c->pid, (unsigned)c->uid, c->name, h.abi_major, h.abi_minor,
	         g.max_tokens, g.hidden, g.top_k, g.n_slots, (unsigned long long)ch->bytes);
}

/* Reads the hello in pieces: first the frozen 16-byte prefix (which says the size), then
 * exactly `size` bytes. */
static void conn_readable_hello(struct server *s, struct conn *c)
{
	for (;;) {
		size_t need = MOE_HELLO_MIN_SIZE;
		if (c->have >= MOE_HELLO_MIN_SIZE) {
			uint32_t size;
			memcpy(&size, c->hello + offsetof(struct moe_hello, size), sizeof(size));
			if (size < MOE_HELLO_MIN_SIZE || size > HELLO_MAX_BYTES) {
				char why[MOE_REASON_LEN];
				uint32_t magic;
				memcpy(&magic, c->hello, sizeof(magic));
				if (magic != MOE_HELLO_MAGIC)
					snprintf(why, sizeof(why),
					         "not a moe-sidecar hello (magic "
					         "0x%08x)",
					         magic);
				else
					snprintf(why, sizeof(why), "hello size %u not in %u..%u",
					         size, MOE_HELLO_MIN_SIZE, HELLO_MAX_BYTES);
				refuse(s, c, MOE_EPROTO, why);
				return;
			}
			need = size;
		}
		if (c->have >= need) {
			handle_hello(s, c, need);
			return;
		}
		ssize_t n = recv(c->fd, c->hello + c->have, need - c->have, MSG_DONTWAIT);
		if (n > 0) {
			c->have += (size_t)n;
			continue;
		}
		if (n == 0) {
			conn_close(s, c, "hung up before a complete hello");
			return;
		}
		if (errno == EAGAIN || errno == EINTR)
			return;
		conn_close(s, c, strerror(errno));
		return;
	}
}

static void conn_event(struct server *s, struct conn *c, uint32_t events)
{
	if (c->state == CONN_HELLO) {
		if (events & EPOLLIN)
			conn_readable_hello(s, c);
		else if (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))
			conn_close(s, c, "hung up before a complete hello");
		return;
	}
	if (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) {
		conn_close(s, c, "client hung up");
		return;
	}
	if (events & EPOLLIN) {
		char b;
		ssize_t n = recv(c->fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
		if (n == 0) {
			conn_close(s, c, "client hung up");
		} else if (n > 0) {
			log_warn("server",
			         "protocol violation by client id=%u pid=%d: bytes on the "
			         "socket after the handshake",
			         c->id, (int)c->pid);
			conn_close(s, c, "protocol violation: bytes after the handshake");
		} else if (errno != EAGAIN && errno != EINTR) {
			conn_close(s, c, strerror(errno));
		}
	}
}

/* A connection turned away at accept, before it takes a handshake entry: a uid that may not
 * use this sidecar (from SO_PEERCRED), or one that already holds its share of the handshake.
 * Either way the peer gets the refusal welcome (MOE_EREFUSED with the reason; the client
 * reads it even if its hello then hits a closed socket) and the connection is closed.
 * Peers can repeat these at will, so each kind is logged at most LOG_RATELIMIT_BURST times
 * a second. */
static void refuse_at_accept(int fd, const struct ucred *cred, struct log_ratelimit *rl,
                             const char *reason)
{
	struct moe_welcome w;
	welcome_base(&w, MOE_EREFUSED);
	snprintf(w.reason, sizeof(w.reason), "%s", reason);
	uint32_t more;
	if (log_ratelimit_allow(rl, monotonic_ns(), &more))
		log_warn("server", "refused client pid=%d uid=%u status=%s reason=\"%s\"%s",
		         (int)cred->pid, (unsigned)cred->uid, moe_status_str(MOE_EREFUSED),
		         w.reason,
		         more ? " (more refusals since the last line were not logged)" : "");
	if (send(fd, &w, sizeof(w), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(w))
		log_debug("server", "refusal to pid=%d not delivered: %s", (int)cred->pid,
		          strerror(errno));
	close(fd);
}

static void accept_all(struct server *s)
{
	for (;;) {
		int fd = accept4(s->listener.sock_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("server", "accept: %s", strerror(errno));
			return;
		}
		struct ucred cred;
		socklen_t cl = sizeof(cred);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
			log_warn("server", "SO_PEERCRED: %s; dropping the connection",
			         strerror(errno));
			close(fd);
			continue;
		}
		if (!uid_allowed(s->cfg, cred.uid)) {
			char why[160];
			snprintf(why, sizeof(why),
			         "uid %u is not allowed to use this sidecar (it serves uid %u%s)",
			         (unsigned)cred.uid, (unsigned)geteuid(),
			         s->cfg->allow_list ? " and its --allow-uid list" : "");
			refuse_at_accept(fd, &cred, &s->refused_log, why);
			continue;
		}
		struct conn *c = NULL;
		uint32_t handshaking_of_uid = 0;
		for (uint32_t i = 0; i < s->n_conns_cap; i++) {
			if (s->conns[i].state == CONN_HELLO && s->conns[i].uid == cred.uid)
				handshaking_of_uid++;
			if (!c && s->conns[i].state == CONN_FREE)
				c = &s->conns[i];
		}
		/* !c cannot happen below the uid's share (see HANDSHAKES_PER_UID). */
		char why[192] = "";
		if (handshaking_of_uid >= HANDSHAKES_PER_UID || !c)
			snprintf(why, sizeof(why),
			         "uid %u already has %u connections in the handshake, its share; "
			         "retry once one of them has sent its hello or timed out (%d ms)",
			         (unsigned)cred.uid, handshaking_of_uid,
			         s->cfg->handshake_timeout_ms);
		uint8_t *hello = why[0] ? NULL : malloc(HELLO_MAX_BYTES);
		if (!why[0] && !hello)
			snprintf(why, sizeof(why), "the sidecar is out of memory for a hello");
		if (why[0]) {
			refuse_at_accept(fd, &cred, &s->dropped_log, why);
			continue;
		}
		memset(c, 0, sizeof(*c));
		c->hello = hello;
		c->fd = fd;
		c->state = CONN_HELLO;
		c->id = ++s->next_id;
		c->pid = cred.pid;
		c->uid = cred.uid;
		c->since_ns = monotonic_ns();
		struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP,
		                         .data.u64 = conn_tag(c->id, (uint32_t)(c - s->conns))};
		if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
			log_error("server", "epoll_ctl ADD client: %s", strerror(errno));
			close(fd);
			free(c->hello);
			memset(c, 0, sizeof(*c));
			c->fd = -1;
		}
	}
}

static void handle_dropped(struct server *s)
{
	uint64_t count;
	if (read(s->dropped_fd, &count, sizeof(count)) < 0 && errno != EAGAIN)
		log_warn("server", "eventfd read: %s", strerror(errno));
	struct dispatcher_entry e[DISPATCH_MAX_CHANNELS];
	uint32_t n = dispatcher_take_dropped(&s->dispatcher, e, DISPATCH_MAX_CHANNELS);
	for (uint32_t i = 0; i < n; i++) {
		struct conn *c = e[i].owner;
		if (c->state != CONN_SERVING || c->ch != e[i].ch)
			continue; /* already reclaimed (withdrawn reports make this rare) */
		char why[sizeof(c->ch->violation) + 32];
		snprintf(why, sizeof(why), "protocol violation: %s", c->ch->violation);
		conn_close(s, c, why);
	}
}

static void sweep_handshakes(struct server *s)
{
	const uint64_t limit = (uint64_t)s->cfg->handshake_timeout_ms * 1000000u;
	const uint64_t now = monotonic_ns();
	for (uint32_t i = 0; i < s->n_conns_cap; i++) {
		struct conn *c = &s->conns[i];
		if (c->state == CONN_HELLO && now - c->since_ns > limit)
			conn_close(s, c, "no complete hello in time");
	}
}

/* SIGHUP: the operator asks for what failed to be tried again (docs/operations.md). */
static void retry_failed(struct server *s)
{
	const struct channel_service *sv = s->service;
	char said[200] = "nothing to retry";
	if (sv && sv->reload)
		sv->reload(sv->ctx, said, sizeof(said));
	log_warn("server", "SIGHUP: %s", said);
}

/* ---- Life cycle ------------------------------------------------------------------------- */

static int server_setup(struct server *s, struct sidecar_error *err)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP); /* the operator's "read failed experts again" */
	/* Blocked before the dispatcher thread exists, so it inherits the mask. */
	if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
		return error_set(err, MOE_ESYS, "pthread_sigmask failed");
	signal(SIGPIPE, SIG_IGN);
	s->signal_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	s->dropped_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	if (s->signal_fd < 0 || s->dropped_fd < 0 || s->epoll_fd < 0)
		return error_set_errno(err, "signalfd/eventfd/epoll_create1");
	const struct {
		int fd;
		uint64_t tag;
	} fixed[] = {{s->listener.sock_fd, TAG_LISTEN},
	             {s->signal_fd, TAG_SIGNAL},
	             {s->dropped_fd, TAG_DROPPED},
	             {s->handover_fd, TAG_HANDOVER}};
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
		struct epoll_event ev = {.events = EPOLLIN, .data.u64 = fixed[i].tag};
		if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, fixed[i].fd, &ev) != 0)
			return error_set_errno(err, "epoll_ctl ADD");
	}
	s->n_conns_cap = s->cfg->max_clients + HANDSHAKES_PER_UID * uids_that_may_connect(s->cfg);
	s->conns = calloc(s->n_conns_cap, sizeof(*s->conns));
	if (!s->conns)
		return error_set(err, MOE_ENOMEM, "out of memory for %u connections",
		                 s->n_conns_cap);
	for (uint32_t i = 0; i < s->n_conns_cap; i++)
		s->conns[i].fd = -1;
	s->dispatcher.spin_ns = s->cfg->spin_ns;
	/* The service manager's watchdog is fed by the dispatcher, at half its period: a hung
	 * dispatcher (no ring is drained) is what a restart cures. */
	s->dispatcher.watchdog_ns = sd_watchdog_ns() / 2;
	return dispatcher_start(&s->dispatcher, s->dropped_fd, err);
}

/* READY: a FORWARD will be served now — to the log, --ready-fd and the service manager. */
static void announce_ready(struct server *s)
{
	int fd = s->cfg->ready_fd;
	log_info("server", "serving path=%s pid=%d max_clients=%u peers=%s", s->listener.path,
	         (int)getpid(), s->cfg->max_clients, s->cfg->allow_list ? "uid+allow-list" : "uid");
	sd_notify_wait("READY=1\nSTATUS=serving %s", s->listener.path);
	if (fd < 0)
		return;
	char line[sizeof(s->listener.path) + 16];
	int n = snprintf(line, sizeof(line), "READY %s\n", s->listener.path);
	if (write(fd, line, (size_t)n) != n)
		log_warn("server", "--ready-fd %d: write: %s", fd, strerror(errno));
	close(fd);
}

static void server_teardown(struct server *s)
{
	atomic_store_explicit(&s->serving, false, memory_order_release); /* /readyz: 503 */
	sd_notify_wait("STOPPING=1");
	listener_close(&s->listener); /* the socket (if still ours) goes first: no new peers */
	if (s->service && s->service->shutdown) /* work not started fails with MOE_ESHUTDOWN */
		s->service->shutdown(s->service->ctx);
	if (s->dispatcher.running)
		dispatcher_stop(&s->dispatcher); /* CLOSING, MOE_ESHUTDOWN, CLOSED, wake */
	s->dispatcher_stopped = true;
	for (uint32_t i = 0; s->conns && i < s->n_conns_cap; i++)
		if (s->conns[i].state != CONN_FREE)
			conn_close(s, &s->conns[i], "sidecar shutting down");
	free(s->conns);
	if (s->epoll_fd >= 0)
		close(s->epoll_fd);
	if (s->signal_fd >= 0)
		close(s->signal_fd);
	if (s->dropped_fd >= 0)
		close(s->dropped_fd);
}

int server_open(const struct server_config *cfg, struct server **out, struct sidecar_error *err)
{
	*out = NULL;
	struct server *s = calloc(1, sizeof(*s));
	if (!s)
		return error_set(err, MOE_ENOMEM, "out of memory");
	s->cfg = cfg;
	s->signal_fd = s->dropped_fd = s->epoll_fd = -1;
	s->listener.dir_fd = s->listener.lock_fd = s->listener.sock_fd = -1;
	s->service = cfg->service;
	s->defaults = cfg->defaults;
	pthread_mutex_init(&s->handover_lock, NULL);
	snprintf(s->handover.status, sizeof(s->handover.status), "loading the model");
	s->handover_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->handover_fd < 0) {
		error_set(err, MOE_ESYS, "eventfd: %s", strerror(errno));
		server_close(s);
		return -1;
	}
	/* A socket the service manager made and passed (socket activation) is served as it is:
	 * the path checks are for what the sidecar creates, and systemd keeps one instance. */
	int passed;
	char passed_path[sizeof(s->listener.path)];
	int rc = sd_listen_fd(&passed, passed_path, sizeof(passed_path), err);
	if (rc < 0) {
		server_close(s);
		return -1;
	}
	if (rc == 1) {
		if (cfg->socket_path && strcmp(cfg->socket_path, passed_path))
			log_warn(
			    "server",
			    "--socket %s ignored: serving the socket the service manager passed, "
			    "%s",
			    cfg->socket_path, passed_path);
		listener_adopt(&s->listener, passed, passed_path);
		goto listen;
	}
	char path[sizeof(s->listener.path)];
	if (cfg->socket_path) {
		if (strlen(cfg->socket_path) >= sizeof(path)) {
			server_close(s);
			return error_set(err, MOE_EINVAL,
			                 "socket path is %zu bytes; at most %zu fit in sun_path",
			                 strlen(cfg->socket_path), sizeof(path) - 1);
		}
		snprintf(path, sizeof(path), "%s", cfg->socket_path);
	} else if (server_default_socket_path(path, sizeof(path)) != 0) {
		server_close(s);
		return error_set(err, MOE_EINVAL, "default socket path does not fit in sun_path");
	}
	/* The socket and its lock exist only once the lock is ours: closing never unlinks a
	 * path another sidecar owns. */
	const struct listener_peers peers = {
	    .shared = cfg->allow_list, .uids = cfg->allowed_uids, .n_uids = cfg->n_allowed_uids};
	if (listener_open(&s->listener, path, &peers, err) != 0) {
		server_close(s);
		return -1;
	}
listen:
	/* Listening from here on: connections wait in the backlog until server_run answers
	 * them, so nothing said after this (STATUS=, the warm-up's progress) can meet a refused
	 * connect. */
	if (listener_listen(&s->listener, 64, err) != 0) {
		server_close(s);
		return -1;
	}
	*out = s;
	return 0;
}

void server_close(struct server *s)
{
	if (!s)
		return;
	listener_close(&s->listener);
	if (s->handover_fd >= 0)
		close(s->handover_fd);
	pthread_mutex_destroy(&s->handover_lock);
	free(s);
}

const char *server_path(const struct server *s)
{
	return s->listener.path;
}

static void handover_post(struct server *s)
{
	const uint64_t one = 1;
	if (write(s->handover_fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
		log_error("server", "waking the control thread: %s", strerror(errno));
}

void server_ready(struct server *s, const struct channel_service *service,
                  const struct moe_limits *defaults)
{
	pthread_mutex_lock(&s->handover_lock);
	s->handover.service = service;
	s->handover.defaults = *defaults;
	s->handover.ready = true;
	pthread_mutex_unlock(&s->handover_lock);
	handover_post(s);
}

void server_start_failed(struct server *s)
{
	pthread_mutex_lock(&s->handover_lock);
	s->handover.failed = true;
	pthread_mutex_unlock(&s->handover_lock);
	handover_post(s);
}

void server_set_status(struct server *s, const char *status)
{
	pthread_mutex_lock(&s->handover_lock);
	snprintf(s->handover.status, sizeof(s->handover.status), "%s", status);
	pthread_mutex_unlock(&s->handover_lock);
	sd_notify("STATUS=%s", status);
}

/* The warm-up's outcome: start serving, or stop. Returns false to stop the loop. */
static bool take_handover(struct server *s, int *status)
{
	uint64_t n;
	if (read(s->handover_fd, &n, sizeof(n)) != (ssize_t)sizeof(n))
		return true;
	pthread_mutex_lock(&s->handover_lock);
	const bool failed = s->handover.failed;
	if (s->handover.ready && !s->service) {
		s->service = s->handover.service;
		s->defaults = s->handover.defaults;
	}
	pthread_mutex_unlock(&s->handover_lock);
	if (failed) {
		*status = 1;
		return false;
	}
	if (s->service && !s->announced) {
		s->announced = true;
		dispatcher_set_service(&s->dispatcher, s->service);
		/* before READY is said: whoever hears it finds /readyz 200 */
		atomic_store_explicit(&s->serving, true, memory_order_release);
		announce_ready(s);
	}
	return true;
}

int server_run(struct server *s, struct sidecar_error *err)
{
	if (server_setup(s, err) != 0) {
		server_teardown(s);
		return 1;
	}
	int status = 0;
	if (s->service) {
		s->announced = true;
		dispatcher_set_service(&s->dispatcher, s->service);
		/* before READY is said: whoever hears it finds /readyz 200 */
		atomic_store_explicit(&s->serving, true, memory_order_release);
		announce_ready(s);
	} else {
		log_info("server",
		         "listening path=%s%s pid=%d; until the model is ready, clients are told "
		         "the sidecar is starting",
		         s->listener.path,
		         s->listener.adopted ? " (passed by the service manager)" : "",
		         (int)getpid());
	}
	for (bool stop = false; !stop;) {
		bool handshaking = false;
		for (uint32_t i = 0; i < s->n_conns_cap; i++)
			handshaking |= s->conns[i].state == CONN_HELLO;
		struct epoll_event ev[32];
		int n = epoll_wait(s->epoll_fd, ev, 32, handshaking ? 250 : -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			error_set_errno(err, "epoll_wait");
			status = 1;
			break;
		}
		for (int i = 0; i < n && !stop; i++) {
			uint64_t tag = ev[i].data.u64;
			if (tag == TAG_LISTEN) {
				accept_all(s);
			} else if (tag == TAG_SIGNAL) {
				struct signalfd_siginfo si;
				if (read(s->signal_fd, &si, sizeof(si)) != (ssize_t)sizeof(si))
					continue;
				if (si.ssi_signo == SIGHUP) {
					retry_failed(s);
					continue;
				}
				/* the socket goes before the line that says the sidecar stops:
				 * no peer connects to a sidecar that is stopping, and whoever
				 * reads the line finds the socket gone (teardown's close is
				 * then a no-op) */
				listener_close(&s->listener);
				log_info("server", "shutting down on %s%s",
				         strsignal((int)si.ssi_signo),
				         s->service ? "" : " (the warm-up in progress ends first)");
				stop = true;
			} else if (tag == TAG_DROPPED) {
				handle_dropped(s);
			} else if (tag == TAG_HANDOVER) {
				stop = !take_handover(s, &status);
			} else {
				/* The id guards against a stale event for a slot reused in this
				 * same batch. */
				struct conn *c = &s->conns[(uint32_t)tag - TAG_CONN_BASE];
				if (c->state != CONN_FREE && c->id == (uint32_t)(tag >> 32))
					conn_event(s, c, ev[i].events);
			}
		}
		if (handshaking)
			sweep_handshakes(s);
	}
	server_teardown(s);
	log_info("server", "stopped");
	return status;
}

void server_health(struct server *s, struct server_health *out)
{
	out->ready = atomic_load_explicit(&s->serving, memory_order_acquire);
	out->dispatcher_beats = atomic_load_explicit(&s->dispatcher.beats, memory_order_acquire);
}

void server_poke_dispatcher(struct server *s)
{
	dispatcher_poke(&s->dispatcher);
}
