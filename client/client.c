/* client.c — libmoe_client (the whole API and its contracts are in moe_client.h).
 *
 * Owns the client side of one channel: connecting and the handshake, checking the memfd
 * (seals, size) and the header against its own moe_layout_compute before trusting a byte,
 * the private slot free list, submission, and waiting for completions. No threads, no
 * signals, no global state except the thread-local connect error.
 *
 * Waiting: spin up to 30 µs, then sleep on the CQ futex in slices of at most 50 ms; between
 * slices look at the socket (hang-up = sidecar gone) and at header.state (CLOSED = shut down),
 * so a dead sidecar is noticed within a slice and never causes a hang.
 *
 * The spin is adaptive: it is skipped while the waits that had to wait have recently been
 * well beyond the spin (a moving average above WAIT_SPIN_SKIP_NS, twice the spin). A decode
 * FORWARD usually outlasts the spin; a client that spins through the first WAIT_SPIN_NS of
 * each one takes that core time from the sidecar's workers whenever they share cores — on a small
 * model, from the deferred experts the sidecar computes right after posting the completion —
 * and gains nothing, since the completion comes after the spin ended. Short requests (PING,
 * STATS, MASK, a 1 MiB ECHO) keep the spin; the margin keeps a workload whose waits scatter
 * around the spin length spinning. The average is updated on every wait, spun or slept, so
 * it follows the workload both ways. moe_set_wait_policy picks pure spinning (a caller with a
 * core of its own) or pure sleeping instead.
 *
 * Completions arrive in the order the sidecar finishes requests, not the order they were
 * submitted. A wait for one slot's request (moe_forward_wait) keeps every other completion it
 * meets in a private FIFO, the stash, which moe_poll/moe_wait and later slot waits take from
 * first; a slot's completion is at most once in it, so it never holds more than n_slots
 * entries plus the rare error about a slot that is not its completion (MOE_ESLOTBUSY). An
 * abandoned slot's completion is dropped as it is taken, and frees the slot.
 */
#include "moe_client.h"

#include <assert.h>
#include <stddef.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "moe_proto.h"
#include "moe_ring.h"

#if UINTPTR_MAX == UINT64_MAX /* the LP64 layout engines compile against */
static_assert(sizeof(struct moe_connect_opts) == 80, "moe_connect_opts is ABI");
static_assert(offsetof(struct moe_connect_opts, server_uid) == 48, "moe_connect_opts is ABI");
static_assert(offsetof(struct moe_connect_opts, reserved) == 56, "moe_connect_opts is ABI");
static_assert(MOE_CONNECT_BATCH_INVARIANT == MOE_HELLO_BATCH_INVARIANT, "one bit on both sides");
#endif

#define WAIT_SPIN_NS 30000u
#define WAIT_SPIN_SKIP_NS (2u * WAIT_SPIN_NS)
#define WAIT_SLICE_NS 50000000u
#define REQUIRED_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

enum slot_state { SLOT_FREE = 0, SLOT_OWNED, SLOT_SUBMITTED, SLOT_ABANDONED };

#define STASH_CAP (MOE_MAX_SLOTS_LIMIT + 16u)

struct moe_client {
	int sock;
	uint8_t *base;
	uint64_t bytes;
	uint64_t epoch;
	struct moe_limits limits;
	struct moe_layout layout;
	const struct moe_channel_header *header;
	struct moe_ring_prod sq;
	struct moe_ring_cons cq;
	struct moe_sqe *sqes;
	const struct moe_cqe *cqes;
	struct moe_info info;
	uint64_t call_seq;    /* user_data of the synchronous helpers' requests */
	uint64_t wait_avg_ns; /* moving average (1/8) of waits that found no completion ready */
	enum moe_wait_policy wait_policy; /* moe_set_wait_policy; ADAPTIVE (0) from calloc */
	bool dead;                        /* sidecar gone: every later call fails fast */
	uint32_t n_free;
	uint32_t free_list[MOE_MAX_SLOTS_LIMIT];
	uint8_t slot_state[MOE_MAX_SLOTS_LIMIT];
	uint8_t slot_stashed[MOE_MAX_SLOTS_LIMIT]; /* its own completion waits in the stash */
	uint16_t slot_op[MOE_MAX_SLOTS_LIMIT];     /* op of its last submission, for sentences */
	uint8_t moe_layers[MOE_LAYER_BITMAP_LAYERS / 8];
	uint32_t model_flags;
	uint32_t n_stash;
	struct moe_completion stash[STASH_CAP];
	char slot_message[MOE_MAX_SLOTS_LIMIT][MOE_MESSAGE_MAX]; /* private copies of sentences */
	char last_error[320];
	/* What moe_reconnect needs: the options connect was given (socket, name, server uid,
	 * timeout), the model it pinned (expect_model, else the first sidecar's fingerprint) and
	 * the GPU mask set so far (n_layers rows, NULL until moe_set_gpu_mask first succeeds). */
	struct {
		char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
		char name[32];
		uint32_t server_uid;
		uint32_t flags; /* opts.flags */
		int timeout_ms;
		char model[33];
	} again;
	uint8_t *gpu_mask;
	/* The sidecar's slot pool, mapped PROT_READ (ABI 1.3, serve --leases), and its memfd
	 * (kept open: moe_lease_pool hands it out); NULL / -1 when it shares none. */
	const uint8_t *pool;
	uint64_t pool_bytes;
	int pool_fd;
	/* ABI 1.4: every lease pool (one per NUMA node of a sidecar that splits experts), [0]
	 * the one above; n_pools 0 when none. The slices of the split leases held, by lease id
	 * (slice_of[id & 0xffff], cap of them; NULL until a split lease). */
	uint32_t n_pools;
	const uint8_t *pools[MOE_LEASE_MAX_POOLS];
	uint64_t pools_bytes[MOE_LEASE_MAX_POOLS];
	int pools_fd[MOE_LEASE_MAX_POOLS];
	struct lease_slices *slice_of;
	uint32_t slice_cap;
	/* The channel's staging area (BF16 leases), mapped PROT_READ; NULL / -1: none. */
	const uint8_t *staging;
	uint64_t staging_bytes;
	int staging_fd;
};

static _Thread_local char connect_error[256];

const char *moe_strerror(int status)
{
	return moe_status_str(status);
}

const char *moe_connect_error(void)
{
	return connect_error;
}

const char *moe_last_error(const struct moe_client *c)
{
	return c ? c->last_error : "";
}

int moe_socket_fd(const struct moe_client *c)
{
	return c ? c->sock : -1;
}

const char *moe_socket_path(const struct moe_client *c)
{
	return c ? c->again.path : "";
}

const moe_info_t *moe_info(const struct moe_client *c)
{
	return &c->info;
}

static int fail_to(char *buf, size_t len, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail_to(char *buf, size_t len, int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	return status;
}

#define conn_fail(status, ...) fail_to(connect_error, sizeof(connect_error), status, __VA_ARGS__)
#define client_fail(c, status, ...)                                                                \
	fail_to((c)->last_error, sizeof((c)->last_error), status, __VA_ARGS__)

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- Connect --------------------------------------------------------------------------- */

static int resolve_path(const struct moe_connect_opts *o, char *buf, size_t len)
{
	const char *p = o && o->socket_path ? o->socket_path : getenv("MOE_SIDECAR_SOCKET");
	int n;
	if (p && *p) {
		n = snprintf(buf, len, "%s", p);
	} else {
		const char *xdg = getenv("XDG_RUNTIME_DIR");
		if (xdg && xdg[0] == '/')
			n = snprintf(buf, len, "%s/moe-sidecar/sidecar.sock", xdg);
		else
			n = snprintf(buf, len, "/run/moe-sidecar/sidecar.sock");
	}
	if (n < 0 || (size_t)n >= len)
		return conn_fail(MOE_EINVAL, "socket path is longer than %zu bytes", len - 1);
	return MOE_OK;
}

/* Receives the welcome (its size is in its frozen prefix) and the fds that ride with it:
 * fds[0] the channel's, then (ABI 1.3) the lease pools' and the staging area's, *n_fds. */
#define WELCOME_MAX_FDS (2 + MOE_LEASE_MAX_POOLS)
static int recv_welcome(int sock, const char *path, uint8_t *buf, size_t cap, size_t *len, int *fds,
                        uint32_t *n_fds)
{
	size_t have = 0, need = MOE_WELCOME_FROZEN;
	*n_fds = 0;
	while (have < need) {
		struct iovec iov = {.iov_base = buf + have, .iov_len = need - have};
		union {
			char b[CMSG_SPACE(sizeof(int) * (WELCOME_MAX_FDS + 1))];
			struct cmsghdr align;
		} u;
		struct msghdr msg = {.msg_iov = &iov,
		                     .msg_iovlen = 1,
		                     .msg_control = u.b,
		                     .msg_controllen = sizeof(u.b)};
		ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			return conn_fail(e == EAGAIN ? MOE_ETIMEDOUT : MOE_ECONNECT,
			                 "%s: waiting for the welcome: %s", path,
			                 e == EAGAIN ? "timed out" : strerror(e));
		}
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < nfd; i++) {
				int f;
				memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
				if (*n_fds < WELCOME_MAX_FDS)
					fds[(*n_fds)++] = f;
				else
					close(f); /* extras are dropped */
			}
		}
		if (n == 0)
			return conn_fail(MOE_ECONNECT,
			                 "%s: the sidecar hung up during the handshake "
			                 "(%zu of %zu welcome bytes)",
			                 path, have, need);
		have += (size_t)n;
		if (need == MOE_WELCOME_FROZEN && have >= MOE_WELCOME_FROZEN) {
			uint32_t size;
			memcpy(&size, buf + offsetof(struct moe_welcome, size), sizeof(size));
			if (size < MOE_WELCOME_FROZEN || size > cap)
				return conn_fail(MOE_EPROTO, "%s: welcome size %u not in %u..%zu",
				                 path, size, MOE_WELCOME_FROZEN, cap);
			need = size;
		}
	}
	*len = have;
	return MOE_OK;
}

/* Checks the memfd before mapping it: sealed so it can never shrink under us (SIGBUS). */
static int check_memfd(int fd, uint64_t expect_bytes)
{
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return conn_fail(MOE_EPROTO, "channel fd: F_GET_SEALS: %s (not a sealable memfd)",
		                 strerror(errno));
	if ((seals & REQUIRED_SEALS) != REQUIRED_SEALS)
		return conn_fail(MOE_EPROTO, "channel fd: seals 0x%x lack shrink/grow/seal (0x%x)",
		                 (unsigned)seals, (unsigned)REQUIRED_SEALS);
	struct stat st;
	if (fstat(fd, &st) != 0)
		return conn_fail(MOE_ESYS, "channel fd: fstat: %s", strerror(errno));
	if ((uint64_t)st.st_size != expect_bytes)
		return conn_fail(MOE_EPROTO, "channel fd: %lld bytes, the welcome says %llu",
		                 (long long)st.st_size, (unsigned long long)expect_bytes);
	return MOE_OK;
}

/* Verifies the header the sidecar wrote against what this client computes itself. */
static int check_header(const struct moe_client *c, const struct moe_welcome *w)
{
	struct moe_channel_header h;
	memcpy(&h, c->base, offsetof(struct moe_channel_header, heartbeat_ns));
	if (h.magic != MOE_CHANNEL_MAGIC)
		return conn_fail(MOE_EPROTO, "channel header: bad magic 0x%016llx",
		                 (unsigned long long)h.magic);
	if (h.abi_major != MOE_ABI_MAJOR || h.abi_minor != w->abi_minor)
		return conn_fail(MOE_EPROTO, "channel header: ABI %u.%u, welcome said %u.%u",
		                 h.abi_major, h.abi_minor, w->abi_major, w->abi_minor);
	if (h.header_size < sizeof(struct moe_channel_header))
		return conn_fail(MOE_EPROTO, "channel header: header_size %u < %zu", h.header_size,
		                 sizeof(struct moe_channel_header));
	if (h.channel_bytes != c->bytes || h.epoch != c->epoch)
		return conn_fail(MOE_EPROTO, "channel header: size/epoch differ from the welcome");
	if (memcmp(&h.limits, &c->limits, sizeof(h.limits)) != 0)
		return conn_fail(MOE_EPROTO, "channel header: limits differ from the welcome");
	if (memcmp(&h.layout, &c->layout, sizeof(h.layout)) != 0)
		return conn_fail(MOE_EPROTO, "channel header: layout differs from the one this "
		                             "client computes for the granted limits");
	return MOE_OK;
}

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* The lease pool: sealed against shrinking (a mapping past its end would SIGBUS) and against
 * writes through new mappings (the sidecar's pool, not ours to write), of the bytes the
 * welcome says; mapped PROT_READ. */
static int map_readonly(int fd, uint64_t bytes, const char *what, const char *path,
                        const void **out)
{
	const int need = F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE;
	const int seals = fcntl(fd, F_GET_SEALS);
	struct stat st;
	if (seals < 0 || (seals & need) != need)
		return conn_fail(MOE_EPROTO, "%s: %s fd: seals 0x%x lack shrink/future-write", path,
		                 what, seals < 0 ? 0u : (unsigned)seals);
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < bytes)
		return conn_fail(MOE_EPROTO, "%s: %s fd: %lld bytes, the welcome says %llu", path,
		                 what, (long long)st.st_size, (unsigned long long)bytes);
	void *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return conn_fail(MOE_ESYS, "%s: %s: mmap %llu bytes: %s", path, what,
		                 (unsigned long long)bytes, strerror(errno));
	*out = map;
	return MOE_OK;
}

static int map_pool(struct moe_client *c, int fd, uint64_t bytes, const char *path)
{
	const void *m;
	const int rc = map_readonly(fd, bytes, "lease pool", path, &m);
	if (rc == MOE_OK) {
		c->pool = m;
		c->pool_bytes = bytes;
	}
	return rc;
}

/* The slices of one split lease (ABI 1.4), kept while it is held: n[i] of matrix i. */
struct lease_slices {
	uint32_t id; /* the lease's id; 0 with n all 0: none */
	uint32_t n[3];
	struct moe_lease_slice s[3][MOE_LEASE_MAX_POOLS];
};

/* Unmaps and closes the lease pools after the first (moe_close/moe_reconnect do the first)
 * and forgets the slices of the leases held. */
static void lease_pools_free(struct moe_client *c)
{
	for (uint32_t i = 1; i < c->n_pools; i++) {
		munmap((void *)c->pools[i], c->pools_bytes[i]);
		close(c->pools_fd[i]);
	}
	c->n_pools = 0;
	free(c->slice_of);
	c->slice_of = NULL;
	c->slice_cap = 0;
}

static int handshake(struct moe_client *c, const struct moe_connect_opts *o, const char *path)
{
	struct moe_hello h;
	moe_hello_init(&h, o && o->client_name ? o->client_name : "moe-client");
#ifdef MOE_CLIENT_TEST_HELLO_MINOR /* tests only: a client that speaks an older minor */
	h.abi_minor = MOE_CLIENT_TEST_HELLO_MINOR;
#endif
	if (o) {
		h.want.max_tokens = o->max_tokens;
		h.want.hidden = o->hidden;
		h.want.top_k = o->top_k;
		h.want.n_slots = o->n_slots;
		h.flags = o->flags & MOE_CONNECT_BATCH_INVARIANT ? MOE_HELLO_BATCH_INVARIANT : 0;
	}
	if (send(c->sock, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h) && errno != EPIPE &&
	    errno != ECONNRESET)
		return conn_fail(MOE_ECONNECT, "%s: sending the hello: %s", path, strerror(errno));
	/* On EPIPE the sidecar may still have left a refusal to read: fall through. */

	uint8_t buf[4096];
	size_t len = 0;
	int fds[WELCOME_MAX_FDS];
	uint32_t n_fds = 0;
	int rc = recv_welcome(c->sock, path, buf, sizeof(buf), &len, fds, &n_fds);
	int fd = n_fds ? fds[0] : -1;
	if (n_fds)
		fds[0] = -1; /* fd from here on */
	if (rc != MOE_OK)
		goto out;
	struct moe_welcome w;
	char why[224];
	rc = moe_welcome_parse(buf, len, &w, why, sizeof(why));
	if (rc != MOE_OK) {
		rc = conn_fail(rc, "%s: %s", path, why);
		goto out;
	}
	if (w.status != MOE_OK) {
		if (w.status == MOE_ESTARTING) {
			rc = conn_fail(MOE_ESTARTING, "%s: the sidecar (pid %u) is starting: %s",
			               path, w.sidecar_pid,
			               w.reason[0] ? w.reason : "no progress given");
			goto out;
		}
		rc =
		    conn_fail(w.status == MOE_EVERSION ? MOE_EVERSION
		              : w.status == MOE_EPROTO ? MOE_EPROTO
		                                       : MOE_EREFUSED,
		              "%s: the sidecar refused this client (%s): %s", path,
		              moe_status_str(w.status), w.reason[0] ? w.reason : "no reason given");
		goto out;
	}
	if (fd < 0) {
		rc = conn_fail(MOE_EPROTO, "%s: accepting welcome without a channel fd", path);
		goto out;
	}
	if (moe_limits_check(&w.limits, why, sizeof(why)) != MOE_OK) {
		rc = conn_fail(MOE_EPROTO, "%s: granted limits: %s", path, why);
		goto out;
	}
	if (o && ((o->max_tokens && o->max_tokens != w.limits.max_tokens) ||
	          (o->hidden && o->hidden != w.limits.hidden) ||
	          (o->top_k && o->top_k != w.limits.top_k) ||
	          (o->n_slots && o->n_slots != w.limits.n_slots))) {
		rc = conn_fail(MOE_EPROTO, "%s: granted limits differ from the requested ones",
		               path);
		goto out;
	}
	c->limits = w.limits;
	moe_layout_compute(&c->limits, &c->layout);
	c->epoch = w.epoch;
	c->bytes = w.channel_bytes;
	if (c->bytes != c->layout.total) {
		rc = conn_fail(MOE_EPROTO,
		               "%s: channel is %llu bytes, the granted limits need %llu", path,
		               (unsigned long long)c->bytes, (unsigned long long)c->layout.total);
		goto out;
	}
	if ((rc = check_memfd(fd, c->bytes)) != MOE_OK)
		goto out;
	void *map = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		rc = conn_fail(MOE_ESYS, "channel: mmap %llu bytes: %s",
		               (unsigned long long)c->bytes, strerror(errno));
		goto out;
	}
	c->base = map;
	atomic_thread_fence(memory_order_acquire);
	if ((rc = check_header(c, &w)) != MOE_OK)
		goto out;

	c->header = (const struct moe_channel_header *)c->base;
	const uint32_t start = moe_channel_ring_start(c->epoch);
	moe_ring_prod_attach(&c->sq, (struct moe_ring_ctrl *)(c->base + c->layout.sq_ctrl),
	                     c->layout.ring_entries, start);
	moe_ring_cons_attach(&c->cq, (struct moe_ring_ctrl *)(c->base + c->layout.cq_ctrl),
	                     c->layout.ring_entries, start);
	c->sqes = (struct moe_sqe *)(c->base + c->layout.sq_entries);
	c->cqes = (const struct moe_cqe *)(c->base + c->layout.cq_entries);

	struct moe_info *i = &c->info;
	i->max_tokens = c->limits.max_tokens;
	i->hidden = c->limits.hidden;
	i->top_k = c->limits.top_k;
	i->n_slots = c->limits.n_slots;
	i->dtype_mask = c->limits.dtype_mask;
	i->sidecar_pid = w.sidecar_pid;
	i->abi_major = w.abi_major;
	i->abi_minor = w.abi_minor;
	i->channel_bytes = c->bytes;
	i->n_layers = w.model.n_layers;
	i->n_moe_layers = w.model.n_moe_layers;
	i->first_moe_layer = w.model.first_moe_layer;
	i->n_experts = w.model.n_experts;
	i->model_top_k = w.model.top_k;
	i->model_hidden = w.model.hidden;
	i->expert_ffn = w.model.expert_ffn;
	memcpy(i->model_name, w.model.name, sizeof(i->model_name));
	i->batch_invariant = w.abi_minor >= 3 && (w.flags & MOE_WELCOME_BATCH_INVARIANT);
	if (o && (o->flags & MOE_CONNECT_BATCH_INVARIANT) && !i->batch_invariant) {
		rc = conn_fail(MOE_EPROTO,
		               "%s: batch invariance was asked for, the sidecar's welcome does not "
		               "grant it",
		               path);
		goto out;
	}
	/* ABI 1.1 fields; a 1.0 sidecar left them zero (reserved). */
	c->model_flags = w.abi_minor >= 1 ? w.model.flags : 0;
	if (c->model_flags & MOE_MODEL_FINGERPRINT)
		moe_fingerprint_hex(w.fingerprint, i->fingerprint);
	if (c->model_flags & MOE_MODEL_LAYER_BITMAP)
		memcpy(c->moe_layers, w.model.moe_layers, sizeof(c->moe_layers));
	if (o && o->expect_model) {
		if (!i->fingerprint[0]) {
			rc =
			    conn_fail(MOE_EREFUSED,
			              "%s: this client expects model %s, but the sidecar (protocol "
			              "%u.%u) reports no model fingerprint%s",
			              path, o->expect_model, w.abi_major, w.abi_minor,
			              i->n_layers ? "" : " (it serves no model)");
			goto out;
		}
		if (strcasecmp(o->expect_model, i->fingerprint) != 0) {
			rc = conn_fail(MOE_EREFUSED,
			               "%s: the sidecar serves %s model %s, this client expects %s "
			               "(another checkpoint, or another copy of its files)",
			               path, i->model_name[0] ? i->model_name : "a", i->fingerprint,
			               o->expect_model);
			goto out;
		}
	}

	/* The lease pools after the channel's fd (ABI 1.4: lease_pools of them, pool 0 of
	 * lease_pool_bytes, the others their memfd's size; 1.3: one), then the staging area. */
	uint32_t pools = w.abi_minor >= 3 && w.lease_pool_bytes ? 1 : 0;
	if (pools && w.abi_minor >= 4)
		pools = w.lease_pools;
	if (pools > MOE_LEASE_MAX_POOLS || (pools && 1 + pools > n_fds)) {
		rc = conn_fail(MOE_EPROTO, "%s: the welcome names %u lease pools, %u fds came",
		               path, pools, n_fds ? n_fds - 1 : 0);
		goto out;
	}
	for (uint32_t q = 0; q < pools; q++) {
		struct stat st;
		uint64_t bytes = w.lease_pool_bytes;
		if (q && fstat(fds[1 + q], &st) == 0)
			bytes = (uint64_t)st.st_size;
		if (q ? (rc = map_readonly(fds[1 + q], bytes, "lease pool", path,
		                           (const void **)&c->pools[q])) != MOE_OK
		      : (rc = map_pool(c, fds[1], bytes, path)) != MOE_OK)
			goto out;
		if (!q) {
			c->pools[0] = c->pool;
			c->pool_fd = fds[1];
		}
		c->pools_bytes[q] = bytes;
		c->pools_fd[q] = fds[1 + q];
		fds[1 + q] = -1;
		c->n_pools = q + 1;
	}
	if (c->pool) {
		const int staging_fd = 1 + pools < n_fds ? fds[1 + pools] : -1;
		if (w.lease_staging_bytes && staging_fd >= 0) {
			const void *m;
			if ((rc = map_readonly(staging_fd, w.lease_staging_bytes, "lease staging",
			                       path, &m)) != MOE_OK)
				goto out;
			c->staging = m;
			c->staging_bytes = w.lease_staging_bytes;
			c->staging_fd = staging_fd;
			fds[1 + pools] = -1;
		}
	}

	for (uint32_t s = c->limits.n_slots; s-- > 0;)
		c->free_list[c->n_free++] = s;
	rc = MOE_OK;
out:
	if (fd >= 0)
		close(fd); /* the mapping keeps the memfd alive */
	for (uint32_t q = 1; q < n_fds; q++)
		if (fds[q] >= 0)
			close(fds[q]);
	return rc;
}

/* The server must run as root, as us, or as the uid the caller named: anyone else may have
 * bound a socket at a path they could redirect, and our hello (pid, uid, name) and every
 * activation we send would go to them. Checked before anything is sent. */
static int check_server(int sock, const struct moe_connect_opts *o, const char *path)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
		return conn_fail(MOE_ESYS, "%s: SO_PEERCRED: %s", path, strerror(errno));
	const uid_t me = geteuid();
	if (cred.uid == 0 || cred.uid == me || (o && o->server_uid && cred.uid == o->server_uid))
		return MOE_OK;
	char also[48] = "";
	if (o && o->server_uid)
		snprintf(also, sizeof(also), " or uid %u (server_uid)", (unsigned)o->server_uid);
	return conn_fail(MOE_EREFUSED,
	                 "%s: the server runs as uid %u (pid %d), not as root, this client's uid "
	                 "%u%s; refusing to talk to it (name it in server_uid if it is yours)",
	                 path, (unsigned)cred.uid, (int)cred.pid, (unsigned)me, also);
}

static int check_opts(const struct moe_connect_opts *opts)
{
	if (!opts)
		return MOE_OK;
	for (size_t i = 0; i < sizeof(opts->reserved) / sizeof(opts->reserved[0]); i++)
		if (opts->reserved[i])
			return conn_fail(MOE_EINVAL, "moe_connect: opts.reserved[%zu] is not NULL",
			                 i);
	if (opts->flags & ~MOE_CONNECT_BATCH_INVARIANT)
		return conn_fail(MOE_EINVAL, "moe_connect: opts.flags 0x%x: unknown bits 0x%x",
		                 opts->flags, opts->flags & ~MOE_CONNECT_BATCH_INVARIANT);
	if (opts->expect_model) {
		size_t n = strlen(opts->expect_model);
		bool hex = n == 32;
		for (size_t i = 0; hex && i < n; i++)
			hex = isxdigit((unsigned char)opts->expect_model[i]) != 0;
		if (!hex)
			return conn_fail(MOE_EINVAL,
			                 "moe_connect: expect_model \"%.40s\" is not a fingerprint "
			                 "(32 hex digits, from moe_model_fingerprint)",
			                 opts->expect_model);
	}
	return MOE_OK;
}

/* One try: socket, connect, the server's uid, the handshake. *again: the failure is one a
 * starting sidecar gives (nothing at the path yet, a socket not accepting, MOE_ESTARTING),
 * worth retrying until the deadline. */
static int connect_once(const struct moe_connect_opts *opts, const struct sockaddr_un *addr,
                        int attempt_ms, struct moe_client **out, bool *again)
{
	*again = false;
	struct moe_client *c = calloc(1, sizeof(*c));
	if (!c)
		return conn_fail(MOE_ENOMEM, "moe_connect: out of memory");
	c->pool_fd = -1;
	c->staging_fd = -1;
	int rc;
	c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->sock < 0) {
		rc = conn_fail(MOE_ESYS, "socket(AF_UNIX): %s", strerror(errno));
		goto fail;
	}
	struct timeval tv = {.tv_sec = attempt_ms / 1000, .tv_usec = (attempt_ms % 1000) * 1000};
	if (setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    setsockopt(c->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
		rc = conn_fail(MOE_ESYS, "setsockopt timeouts: %s", strerror(errno));
		goto fail;
	}
	if (connect(c->sock, (const struct sockaddr *)addr, sizeof(*addr)) != 0) {
		int e = errno;
		struct stat st;
		const bool not_socket =
		    e == ECONNREFUSED && stat(addr->sun_path, &st) == 0 && !S_ISSOCK(st.st_mode);
		*again = !not_socket && (e == ENOENT || e == ECONNREFUSED || e == EAGAIN);
		rc = conn_fail(MOE_ECONNECT, "%s: connect: %s%s", addr->sun_path, strerror(e),
		               not_socket ? " (the path is not a socket: is --socket right?)"
		               : e == ENOENT || e == ECONNREFUSED
		                   ? " (is moe-sidecar serve running?)"
		               : e == EACCES ? " (the socket or its directory is not accessible "
		                               "to this user)"
		                             : "");
		goto fail;
	}
	if ((rc = check_server(c->sock, opts, addr->sun_path)) != MOE_OK)
		goto fail;
	rc = handshake(c, opts, addr->sun_path);
	*again = rc == MOE_ESTARTING;
	if (rc != MOE_OK)
		goto fail;
	/* After the handshake the socket only carries hang-up: no timeouts needed. */
	*out = c;
	return MOE_OK;
fail:
	moe_close(c);
	return rc;
}

/* Tries until the sidecar serves, the failure is not one of a starting sidecar, or
 * timeout_ms (< 0: one try) runs out; between tries sleeps 10 ms doubling to 100 ms: a try
 * costs the sidecar an accept and a refusal, and the cap is how late a client can be after
 * READY. */
static int connect_waiting(const struct moe_connect_opts *opts, const struct sockaddr_un *addr,
                           int timeout_ms, struct moe_client **out)
{
	const uint64_t start = now_ns();
	const uint64_t budget_ns = timeout_ms > 0 ? (uint64_t)timeout_ms * 1000000u : 0;
	uint64_t delay_ns = 10000000u;
	for (unsigned tries = 1;; tries++) {
		const uint64_t spent = now_ns() - start;
		const uint64_t left = budget_ns > spent ? budget_ns - spent : 0;
		/* The handshake itself gets what is left (all of it on a NOWAIT connect). */
		int attempt_ms = timeout_ms < 0 ? 5000 : (int)((left + 999999u) / 1000000u);
		bool again;
		int rc = connect_once(opts, addr, attempt_ms > 0 ? attempt_ms : 1, out, &again);
		if (rc == MOE_OK || !again)
			return rc;
		const uint64_t now_spent = now_ns() - start;
		if (timeout_ms < 0 || now_spent >= budget_ns) {
			if (timeout_ms >= 0) { /* it waited: say for how long */
				char why[sizeof(connect_error)];
				snprintf(why, sizeof(why), "%s", connect_error);
				conn_fail(rc, "%s (after waiting %d ms, %u tr%s)", why, timeout_ms,
				          tries, tries == 1 ? "y" : "ies");
			}
			return rc;
		}
		uint64_t nap = delay_ns < budget_ns - now_spent ? delay_ns : budget_ns - now_spent;
		struct timespec ts = {.tv_sec = (time_t)(nap / 1000000000u),
		                      .tv_nsec = (long)(nap % 1000000000u)};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
		delay_ns = delay_ns * 2 < 100000000u ? delay_ns * 2 : 100000000u;
	}
}

int moe_connect(const struct moe_connect_opts *opts, struct moe_client **out)
{
	connect_error[0] = '\0';
	if (!out)
		return conn_fail(MOE_EINVAL, "moe_connect: out is NULL");
	*out = NULL;
	int rc = check_opts(opts);
	if (rc != MOE_OK)
		return rc;
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	if ((rc = resolve_path(opts, addr.sun_path, sizeof(addr.sun_path))) != MOE_OK)
		return rc;
	const int timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms : 5000;
	struct moe_client *c;
	if ((rc = connect_waiting(opts, &addr, timeout_ms, &c)) != MOE_OK)
		return rc;
	snprintf(c->again.path, sizeof(c->again.path), "%s", addr.sun_path);
	snprintf(c->again.name, sizeof(c->again.name), "%s",
	         opts && opts->client_name ? opts->client_name : "");
	c->again.server_uid = opts ? opts->server_uid : 0;
	c->again.flags = opts ? opts->flags : 0;
	c->again.timeout_ms = timeout_ms;
	snprintf(c->again.model, sizeof(c->again.model), "%s",
	         opts && opts->expect_model ? opts->expect_model : c->info.fingerprint);
	*out = c;
	return MOE_OK;
}

int moe_reconnect(struct moe_client *c, int timeout_ms)
{
	if (!c)
		return MOE_EINVAL;
	struct moe_connect_opts o = {
	    .socket_path = c->again.path,
	    .max_tokens = c->limits.max_tokens,
	    .hidden = c->limits.hidden,
	    .top_k = c->limits.top_k,
	    .n_slots = c->limits.n_slots,
	    .client_name = c->again.name[0] ? c->again.name : NULL,
	    .expect_model = c->again.model[0] ? c->again.model : NULL,
	    .server_uid = c->again.server_uid,
	    .flags = c->again.flags,
	};
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", c->again.path);
	struct moe_client *n;
	connect_error[0] = '\0';
	int rc = connect_waiting(&o, &addr, timeout_ms ? timeout_ms : c->again.timeout_ms, &n);
	if (rc == MOE_OK && c->gpu_mask) {
		const size_t bytes = (size_t)((c->info.n_experts + 7u) / 8u) * c->info.n_layers;
		rc = moe_set_gpu_mask(n, -1, c->gpu_mask, bytes,
		                      c->again.timeout_ms > 0 ? c->again.timeout_ms : 5000);
		if (rc != MOE_OK) {
			conn_fail(rc, "%s: re-applying the GPU mask: %s", c->again.path,
			          moe_last_error(n));
			moe_close(n);
		}
	}
	if (rc != MOE_OK) {
		c->dead = true;
		snprintf(c->last_error, sizeof(c->last_error), "reconnecting: %s", connect_error);
		return rc;
	}
	/* c takes over n's channel; what c keeps across channels stays. The old lease pool goes
	 * with the old sidecar: every lease of it is gone. */
	if (c->base)
		munmap(c->base, c->bytes);
	if (c->pool)
		munmap((void *)c->pool, c->pool_bytes);
	if (c->pool_fd >= 0)
		close(c->pool_fd);
	lease_pools_free(c);
	if (c->staging)
		munmap((void *)c->staging, c->staging_bytes);
	if (c->staging_fd >= 0)
		close(c->staging_fd);
	if (c->sock >= 0)
		close(c->sock);
	n->again = c->again;
	free(n->gpu_mask); /* the copy re-applying the mask made: c's holds the same bits */
	n->gpu_mask = c->gpu_mask;
	n->wait_policy = c->wait_policy;
	n->call_seq = c->call_seq;
	*c = *n;
	n->base = NULL;
	n->sock = -1;
	n->gpu_mask = NULL;
	n->pool = NULL;
	n->pool_fd = -1;
	n->n_pools = 0;
	n->slice_of = NULL;
	n->slice_cap = 0;
	n->staging = NULL;
	n->staging_fd = -1;
	moe_close(n);
	return MOE_OK;
}

void moe_close(struct moe_client *c)
{
	if (!c)
		return;
	if (c->base)
		munmap(c->base, c->bytes);
	if (c->pool)
		munmap((void *)c->pool, c->pool_bytes);
	if (c->pool_fd >= 0)
		close(c->pool_fd);
	lease_pools_free(c);
	if (c->staging)
		munmap((void *)c->staging, c->staging_bytes);
	if (c->staging_fd >= 0)
		close(c->staging_fd);
	if (c->sock >= 0)
		close(c->sock);
	free(c->gpu_mask);
	free(c);
}

void moe_client_raw(struct moe_client *c, struct moe_client_raw *out)
{
	out->base = c->base;
	out->bytes = c->bytes;
	out->layout = c->layout;
	out->limits = c->limits;
	out->epoch = c->epoch;
	out->sq = &c->sq;
	out->cq = &c->cq;
}

int moe_model_fingerprint(const char *path, char hex[33])
{
	connect_error[0] = '\0';
	if (!path || !hex)
		return conn_fail(MOE_EINVAL, "moe_model_fingerprint: path or hex is NULL");
	uint8_t fp[MOE_FINGERPRINT_BYTES];
	int rc = moe_fingerprint_path(path, fp, connect_error, sizeof(connect_error));
	if (rc == MOE_OK)
		moe_fingerprint_hex(fp, hex);
	return rc;
}

int moe_model_layers(const struct moe_client *c, int32_t *layers, uint32_t cap)
{
	if (!c || (cap && !layers))
		return MOE_EINVAL;
	const struct moe_info *i = &c->info;
	if (i->n_moe_layers == 0)
		return MOE_ENOMODEL;
	uint32_t n = 0;
	if (c->model_flags & MOE_MODEL_LAYER_BITMAP) {
		for (uint32_t l = 0; l < i->n_layers && l < MOE_LAYER_BITMAP_LAYERS; l++)
			if ((c->moe_layers[l / 8] >> (l % 8)) & 1u) {
				if (n < cap)
					layers[n] = (int32_t)l;
				n++;
			}
		if (n != i->n_moe_layers)
			return MOE_EPROTO; /* the sidecar's bitmap and count disagree */
		return (int)n;
	}
	if (i->abi_minor >= 1)
		return MOE_EPROTO; /* more blocks than the bitmap describes */
	/* A 1.0 sidecar describes them as a contiguous run. */
	for (; n < i->n_moe_layers; n++)
		if (n < cap)
			layers[n] = (int32_t)(i->first_moe_layer + n);
	return (int)n;
}

int moe_channel_region(const struct moe_client *c, void **base, size_t *bytes)
{
	if (!c || !base || !bytes)
		return MOE_EINVAL;
	*base = c->base;
	*bytes = (size_t)c->bytes;
	return MOE_OK;
}

/* ---- Slots ----------------------------------------------------------------------------- */

static void slot_fill(const struct moe_client *c, uint32_t s, struct moe_slot *slot)
{
	const uint64_t off = c->layout.slots + (uint64_t)s * c->layout.slot_stride;
	uint8_t *base = c->base + off;
	slot->index = s;
	slot->input = base + c->layout.in_off;
	slot->expert_ids = (int32_t *)(void *)(base + c->layout.ids_off);
	slot->expert_weights = (float *)(void *)(base + c->layout.wts_off);
	slot->output = base + c->layout.out_off;
	slot->input_bytes = c->layout.in_bytes;
	slot->ids_bytes = c->layout.ids_bytes;
	slot->weights_bytes = c->layout.wts_bytes;
	slot->output_bytes = c->layout.out_bytes;
	slot->input_off = off + c->layout.in_off;
	slot->ids_off = off + c->layout.ids_off;
	slot->weights_off = off + c->layout.wts_off;
	slot->output_off = off + c->layout.out_off;
}

static bool sidecar_closed(const struct moe_client *c)
{
	return atomic_load_explicit(&((struct moe_channel_header *)c->header)->state,
	                            memory_order_acquire) == MOE_CHANNEL_CLOSED;
}

static bool socket_hung_up(const struct moe_client *c)
{
	struct pollfd p = {.fd = c->sock, .events = POLLIN | POLLRDHUP};
	if (poll(&p, 1, 0) <= 0)
		return false;
	/* The sidecar never sends after the welcome: readable means EOF or garbage. */
	return (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLIN)) != 0;
}

int moe_slot_acquire(struct moe_client *c, struct moe_slot *slot)
{
	if (!c || !slot)
		return MOE_EINVAL;
	if (c->dead)
		return client_fail(c, MOE_EPEERDEAD, "the sidecar is gone");
	if (c->n_free == 0) {
		/* Every slot in flight may mean the sidecar died with them: look before saying
		 * "try again" (a poll, on this path only). */
		if (sidecar_closed(c) || socket_hung_up(c)) {
			c->dead = true;
			return client_fail(c, MOE_EPEERDEAD,
			                   "the sidecar is gone (all %u slots were in flight)",
			                   c->limits.n_slots);
		}
		return client_fail(c, MOE_EAGAIN, "all %u slots are in use", c->limits.n_slots);
	}
	uint32_t s = c->free_list[--c->n_free];
	c->slot_state[s] = SLOT_OWNED;
	slot_fill(c, s, slot);
	return MOE_OK;
}

int moe_slot_view(const struct moe_client *c, uint32_t index, struct moe_slot *slot)
{
	if (!c || !slot || index >= c->limits.n_slots)
		return MOE_EINVAL;
	slot_fill(c, index, slot);
	return MOE_OK;
}

static void slot_free(struct moe_client *c, uint32_t slot)
{
	c->slot_state[slot] = SLOT_FREE;
	c->free_list[c->n_free++] = slot;
}

/* Removes stash entry i, keeping the order of the others. */
static struct moe_completion stash_take(struct moe_client *c, uint32_t i)
{
	struct moe_completion e = c->stash[i];
	memmove(&c->stash[i], &c->stash[i + 1], (c->n_stash - i - 1) * sizeof(c->stash[0]));
	c->n_stash--;
	return e;
}

/* True if e is the completion of its slot's request (not an error about the slot). */
static bool is_own_completion(const struct moe_client *c, const struct moe_completion *e)
{
	return e->slot < c->limits.n_slots && e->status != MOE_ESLOTBUSY &&
	       e->status != MOE_EBADSLOT;
}

/* Drops slot's completion from the stash, if it waits there. */
static void stash_drop_slot(struct moe_client *c, uint32_t slot)
{
	if (!c->slot_stashed[slot])
		return;
	for (uint32_t i = 0; i < c->n_stash; i++)
		if (c->stash[i].slot == slot && is_own_completion(c, &c->stash[i])) {
			stash_take(c, i);
			break;
		}
	c->slot_stashed[slot] = 0;
}

int moe_slot_release(struct moe_client *c, uint32_t slot)
{
	if (!c || slot >= c->limits.n_slots)
		return MOE_EINVAL;
	if (c->slot_state[slot] != SLOT_OWNED)
		return client_fail(c, MOE_EINVAL, "slot %u is %s", slot,
		                   c->slot_state[slot] == SLOT_FREE ? "not acquired"
		                                                    : "still in flight");
	stash_drop_slot(c, slot);
	slot_free(c, slot);
	return MOE_OK;
}

int moe_slot_abandon(struct moe_client *c, uint32_t slot)
{
	if (!c || slot >= c->limits.n_slots)
		return MOE_EINVAL;
	switch (c->slot_state[slot]) {
	case SLOT_OWNED:
		stash_drop_slot(c, slot);
		slot_free(c, slot);
		return MOE_OK;
	case SLOT_SUBMITTED:
		c->slot_state[slot] = SLOT_ABANDONED; /* freed when its completion is taken */
		return MOE_OK;
	case SLOT_ABANDONED: return MOE_OK;
	}
	return client_fail(c, MOE_EINVAL, "slot %u is not acquired", slot);
}

/* ---- Requests -------------------------------------------------------------------------- */

int moe_submit(struct moe_client *c, const struct moe_request *req)
{
	if (!c || !req)
		return MOE_EINVAL;
	if (c->dead)
		return client_fail(c, MOE_EPEERDEAD, "the sidecar is gone");
	if (req->slot >= c->limits.n_slots || c->slot_state[req->slot] != SLOT_OWNED)
		return client_fail(c, MOE_EINVAL, "slot %u is %s", req->slot,
		                   req->slot >= c->limits.n_slots          ? "out of range"
		                   : c->slot_state[req->slot] == SLOT_FREE ? "not acquired"
		                                                           : "already submitted");
	uint32_t state = atomic_load_explicit(&((struct moe_channel_header *)c->header)->state,
	                                      memory_order_acquire);
	if (state != MOE_CHANNEL_RUNNING) {
		c->dead = true;
		return client_fail(c, MOE_EPEERDEAD, "the sidecar is shutting down (channel %s)",
		                   state == MOE_CHANNEL_CLOSING ? "closing" : "closed");
	}
	int64_t room = moe_ring_space(&c->sq);
	if (room == MOE_RING_BROKEN)
		return client_fail(c, MOE_EPROTO,
		                   "SQ head is impossible: the sidecar broke the "
		                   "ring");
	if (room == 0)
		return client_fail(c, MOE_EAGAIN, "submission ring full");
	/* Submitting the slot again gives up its uncollected completion, if any. */
	if (c->slot_stashed[req->slot])
		stash_drop_slot(c, req->slot);
	struct moe_sqe *e = &c->sqes[moe_ring_prod_pos(&c->sq, 0)];
	struct moe_sqe sqe;
	memset(&sqe, 0, sizeof(sqe));
	sqe.user_data = req->user_data;
	sqe.slot = req->slot;
	sqe.op = req->op;
	sqe.flags = req->flags;
	sqe.n_tokens = req->n_tokens;
	sqe.in_dtype = req->in_dtype;
	sqe.out_dtype = req->out_dtype;
	sqe.ids_per_token = req->ids_per_token;
	sqe.layer = req->layer;
	sqe.arg = req->arg;
	*e = sqe;
	c->slot_state[req->slot] = SLOT_SUBMITTED;
	c->slot_op[req->slot] = req->op;
	moe_ring_publish(&c->sq, 1);
	moe_ring_wake_consumer(&c->sq);
	return MOE_OK;
}

/* Copies the sentence an error completion left in its slot's output area (read once into
 * private memory, then made a printable, terminated string). */
static const char *copy_message(struct moe_client *c, uint32_t slot)
{
	char *dst = c->slot_message[slot];
	const size_t n =
	    c->layout.out_bytes < MOE_MESSAGE_MAX ? (size_t)c->layout.out_bytes : MOE_MESSAGE_MAX;
	const uint8_t *src =
	    c->base + c->layout.slots + (uint64_t)slot * c->layout.slot_stride + c->layout.out_off;
	memcpy(dst, src, n);
	__asm__ __volatile__("" ::: "memory");
	dst[n - 1] = '\0';
	for (char *p = dst; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
			*p = '?';
	return dst[0] ? dst : NULL;
}

/* Takes one completion off the CQ that someone should see: MOE_OK, MOE_EAGAIN (none), or
 * MOE_EPROTO. Completions of abandoned slots are dropped here, freeing their slots. */
static int ring_take(struct moe_client *c, struct moe_completion *out)
{
	for (;;) {
		int64_t ready = moe_ring_ready(&c->cq);
		if (ready == MOE_RING_BROKEN)
			return client_fail(c, MOE_EPROTO,
			                   "CQ tail is impossible: the sidecar broke the "
			                   "ring");
		if (ready == 0)
			return MOE_EAGAIN;
		struct moe_cqe e = c->cqes[moe_ring_cons_pos(&c->cq, 0)];
		moe_ring_consume(&c->cq, 1);
		/* A completely full CQ may have stopped the sidecar from taking submissions:
		 * now that there is room, make sure it looks again. */
		if ((uint32_t)ready == c->cq.entries)
			moe_ring_wake_consumer(&c->sq);
		out->user_data = e.user_data;
		out->slot = e.slot;
		out->status = e.status;
		out->value = e.value;
		out->index = e.index;
		out->message = NULL;
		if (!is_own_completion(c, out))
			return MOE_OK;
		const uint8_t state = c->slot_state[e.slot];
		if (state == SLOT_ABANDONED) {
			slot_free(c, e.slot);
			continue;
		}
		if (state != SLOT_SUBMITTED)
			return MOE_OK; /* not a request of ours: shown as it is */
		c->slot_state[e.slot] = SLOT_OWNED;
		if (e.status < 0 && (e.flags & MOE_CQE_MESSAGE))
			out->message = copy_message(c, e.slot);
		return MOE_OK;
	}
}

static void stash_push(struct moe_client *c, const struct moe_completion *e)
{
	if (c->n_stash == STASH_CAP) { /* only errors about slots can get here: drop the oldest */
		stash_take(c, 0);
	}
	c->stash[c->n_stash++] = *e;
	if (is_own_completion(c, e) && c->slot_state[e->slot] == SLOT_OWNED)
		c->slot_stashed[e->slot] = 1;
}

/* The next completion for `want` (a slot, or -1 for any) without waiting: from the stash
 * first, then the CQ, stashing what belongs to others. MOE_OK, MOE_EAGAIN or MOE_EPROTO. */
static int collect(struct moe_client *c, int64_t want, struct moe_completion *out)
{
	if (want < 0 && c->n_stash) {
		*out = stash_take(c, 0);
		if (is_own_completion(c, out))
			c->slot_stashed[out->slot] = 0;
		return MOE_OK;
	}
	if (want >= 0 && c->slot_stashed[want]) {
		c->slot_stashed[want] = 0;
		for (uint32_t i = 0; i < c->n_stash; i++)
			if (c->stash[i].slot == (uint32_t)want &&
			    is_own_completion(c, &c->stash[i])) {
				*out = stash_take(c, i);
				return MOE_OK;
			}
	}
	for (;;) {
		struct moe_completion e;
		int rc = ring_take(c, &e);
		if (rc != MOE_OK)
			return rc;
		if (want < 0 || (e.slot == (uint32_t)want && is_own_completion(c, &e))) {
			*out = e;
			return MOE_OK;
		}
		stash_push(c, &e);
	}
}

int moe_poll(struct moe_client *c, struct moe_completion *out)
{
	if (!c || !out)
		return MOE_EINVAL;
	return collect(c, -1, out);
}

static void wait_account(struct moe_client *c, uint64_t waited_ns)
{
	c->wait_avg_ns = c->wait_avg_ns - c->wait_avg_ns / 8 + waited_ns / 8;
}

int moe_set_wait_policy(struct moe_client *c, enum moe_wait_policy policy)
{
	if (!c ||
	    (policy != MOE_WAIT_ADAPTIVE && policy != MOE_WAIT_SPIN && policy != MOE_WAIT_SLEEP))
		return MOE_EINVAL;
	c->wait_policy = policy;
	return MOE_OK;
}

/* MOE_WAIT_SPIN's slice: polls the CQ until something is ready or `until` (ns) passes. */
static void spin_until(struct moe_client *c, uint64_t until)
{
	for (uint64_t now = now_ns(); now < until; now = now_ns())
		for (int i = 0; i < 64; i++) {
			if (moe_ring_ready(&c->cq) != 0)
				return;
			moe_cpu_relax();
		}
}

/* Waits for the next completion for `want` (collect's meaning), at most timeout_ms. */
static int wait_for(struct moe_client *c, int64_t want, struct moe_completion *out, int timeout_ms)
{
	int rc = collect(c, want, out);
	if (rc != MOE_EAGAIN)
		return rc;
	if (c->dead)
		return client_fail(c, MOE_EPEERDEAD, "the sidecar is gone");
	const uint64_t start = now_ns();
	const uint64_t deadline =
	    timeout_ms < 0 ? UINT64_MAX : start + (uint64_t)timeout_ms * 1000000u;
	uint64_t now = start;
	const bool spin = c->wait_policy == MOE_WAIT_ADAPTIVE && c->wait_avg_ns < WAIT_SPIN_SKIP_NS;
	while (spin && now - start < WAIT_SPIN_NS && now < deadline) {
		for (int i = 0; i < 64; i++) {
			if (moe_ring_ready(&c->cq) != 0) {
				rc = collect(c, want, out);
				if (rc != MOE_EAGAIN) {
					wait_account(c, now_ns() - start);
					return rc;
				}
			}
			moe_cpu_relax();
		}
		now = now_ns();
	}
	for (;;) {
		const bool spinning = c->wait_policy == MOE_WAIT_SPIN;
		if (!spinning)
			moe_ring_announce_sleep(&c->cq);
		int64_t ready = moe_ring_ready(&c->cq);
		bool closed = sidecar_closed(c);
		if (ready == 0 && !closed && now < deadline) {
			uint64_t slice =
			    deadline - now < WAIT_SLICE_NS ? deadline - now : WAIT_SLICE_NS;
			if (spinning)
				spin_until(c, now + slice);
			else
				moe_ring_consumer_wait(&c->cq, (int64_t)slice);
		}
		if (!spinning)
			moe_ring_unannounce(&c->cq);
		rc = collect(c, want, out);
		if (rc != MOE_EAGAIN) {
			wait_account(c, now_ns() - start);
			return rc;
		}
		if (closed || sidecar_closed(c)) {
			c->dead = true;
			return client_fail(c, MOE_EPEERDEAD,
			                   "the sidecar shut down (channel closed)");
		}
		if (socket_hung_up(c)) {
			c->dead = true;
			return client_fail(c, MOE_EPEERDEAD,
			                   "the sidecar is gone (socket hang-up)");
		}
		now = now_ns();
		if (now >= deadline)
			return client_fail(c, MOE_ETIMEDOUT, "no completion within %d ms",
			                   timeout_ms);
	}
}

int moe_wait(struct moe_client *c, struct moe_completion *out, int timeout_ms)
{
	if (!c || !out)
		return MOE_EINVAL;
	return wait_for(c, -1, out, timeout_ms);
}

/* A request's status as the call's result, its sentence in last_error. */
static int request_status(struct moe_client *c, const struct moe_completion *d)
{
	if (d->status == MOE_OK)
		return MOE_OK;
	const char *op = moe_op_name(c->slot_op[d->slot]);
	if (d->message) /* the sidecar's sentence names the op and what was wrong */
		return client_fail(c, d->status, "%s", d->message);
	return client_fail(c, d->status, "%s: %s (value %u, index %u)", op,
	                   moe_status_str(d->status), d->value, d->index);
}

/* Waits for the request in flight on slot. */
static int slot_wait(struct moe_client *c, uint32_t slot, struct moe_completion *done,
                     int timeout_ms, bool poll_only)
{
	if (!c || slot >= c->limits.n_slots)
		return MOE_EINVAL;
	if (c->slot_state[slot] != SLOT_SUBMITTED && !c->slot_stashed[slot])
		return client_fail(c, MOE_EINVAL, "slot %u has no request in flight", slot);
	struct moe_completion d;
	int rc = poll_only ? collect(c, slot, &d) : wait_for(c, slot, &d, timeout_ms);
	if (rc != MOE_OK)
		return rc;
	if (done)
		*done = d;
	return request_status(c, &d);
}

int moe_forward_wait(struct moe_client *c, uint32_t slot, struct moe_completion *done,
                     int timeout_ms)
{
	return slot_wait(c, slot, done, timeout_ms, false);
}

int moe_forward_poll(struct moe_client *c, uint32_t slot, struct moe_completion *done)
{
	return slot_wait(c, slot, done, 0, true);
}

int moe_forward_submit(struct moe_client *c, uint32_t slot, int32_t layer, uint32_t n_tokens,
                       uint16_t k, uint32_t k_defer, uint8_t in_dtype, uint8_t out_dtype,
                       uint16_t flags)
{
	if (!c)
		return MOE_EINVAL;
	struct moe_request r = {.op = MOE_OP_FORWARD,
	                        .flags = flags,
	                        .slot = slot,
	                        .n_tokens = n_tokens,
	                        .in_dtype = in_dtype,
	                        .out_dtype = out_dtype,
	                        .ids_per_token = k,
	                        .layer = layer,
	                        .arg = k_defer,
	                        .user_data = ((uint64_t)MOE_OP_FORWARD << 56) | ++c->call_seq};
	return moe_submit(c, &r);
}

/* ---- Synchronous helpers --------------------------------------------------------------- */

int moe_call(struct moe_client *c, const struct moe_request *req, struct moe_completion *done,
             int timeout_ms)
{
	if (!c || !req)
		return MOE_EINVAL;
	int rc = moe_submit(c, req);
	if (rc != MOE_OK)
		return rc;
	return slot_wait(c, req->slot, done, timeout_ms, false);
}

int moe_forward(struct moe_client *c, const struct moe_slot *slot, int32_t layer, uint32_t n_tokens,
                uint16_t k, uint32_t k_defer, uint8_t in_dtype, uint8_t out_dtype, uint16_t flags,
                struct moe_completion *done, int timeout_ms)
{
	if (!c || !slot)
		return MOE_EINVAL;
	int rc = moe_forward_submit(c, slot->index, layer, n_tokens, k, k_defer, in_dtype,
	                            out_dtype, flags);
	if (rc != MOE_OK)
		return rc;
	return slot_wait(c, slot->index, done, timeout_ms, false);
}

/* Runs r on the fresh slot s, then gives s back: released when its request completed,
 * abandoned when it is still in flight (a timeout: the sidecar may still write it). */
static int call_on_fresh_slot(struct moe_client *c, struct moe_request *r, struct moe_slot *s,
                              struct moe_completion *done, int timeout_ms)
{
	r->slot = s->index;
	r->user_data = ((uint64_t)r->op << 56) | ++c->call_seq;
	int rc = moe_call(c, r, done, timeout_ms);
	moe_slot_abandon(c, s->index);
	return rc;
}

/* moe_call on a slot the caller took, which it abandons itself (after reading the output). */
static int call_on_fresh_slot_keep(struct moe_client *c, struct moe_request *r, struct moe_slot *s,
                                   struct moe_completion *done, int timeout_ms)
{
	r->slot = s->index;
	r->user_data = ((uint64_t)r->op << 56) | ++c->call_seq;
	return moe_call(c, r, done, timeout_ms);
}

int moe_ping(struct moe_client *c, int timeout_ms)
{
	if (!c)
		return MOE_EINVAL;
	struct moe_slot s = {0};
	int rc = moe_slot_acquire(c, &s);
	if (rc != MOE_OK)
		return rc;
	struct moe_request r = {.op = MOE_OP_PING};
	return call_on_fresh_slot(c, &r, &s, NULL, timeout_ms);
}

int moe_prefetch(struct moe_client *c, int32_t layer, const int32_t *ids, const float *scores,
                 uint32_t n, uint32_t *queued, int timeout_ms)
{
	if (!c || !scores || n == 0)
		return MOE_EINVAL;
	struct moe_slot s = {0};
	int rc = moe_slot_acquire(c, &s);
	if (rc != MOE_OK)
		return rc;
	if ((size_t)n * sizeof(float) > s.weights_bytes) {
		moe_slot_release(c, s.index);
		return client_fail(c, MOE_EINVAL, "%u prefetch entries exceed the slot's %zu", n,
		                   s.weights_bytes / sizeof(float));
	}
	if (ids)
		memcpy(s.expert_ids, ids, (size_t)n * sizeof(*ids));
	memcpy(s.expert_weights, scores, (size_t)n * sizeof(*scores));
	struct moe_request r = {.op = MOE_OP_PREFETCH,
	                        .flags = ids ? 0 : MOE_PREFETCH_SCORES,
	                        .n_tokens = n,
	                        .layer = layer};
	struct moe_completion d;
	rc = call_on_fresh_slot(c, &r, &s, &d, timeout_ms);
	if (rc == MOE_OK && queued)
		*queued = d.value;
	return rc;
}

int moe_prefetch_post(struct moe_client *c, const struct moe_slot *slot, int32_t layer, uint32_t n,
                      uint16_t flags)
{
	if (!c || !slot)
		return MOE_EINVAL;
	struct moe_request r = {.op = MOE_OP_PREFETCH,
	                        .flags = flags,
	                        .slot = slot->index,
	                        .n_tokens = n,
	                        .layer = layer,
	                        .user_data = ((uint64_t)MOE_OP_PREFETCH << 56) | ++c->call_seq};
	return moe_submit(c, &r);
}

int moe_set_gpu_mask(struct moe_client *c, int32_t layer, const uint8_t *bits, size_t n_bytes,
                     int timeout_ms)
{
	if (!c || !bits)
		return MOE_EINVAL;
	const struct moe_info *i = &c->info;
	if (i->n_experts == 0)
		return client_fail(c, MOE_ENOMODEL, "the sidecar serves no model: no GPU mask");
	const size_t row = (i->n_experts + 7u) / 8u;
	if (layer < -1 || (layer >= 0 && (uint32_t)layer >= i->n_layers))
		return client_fail(c, MOE_EINVAL, "mask layer %d: -1 (all) or 0..%u", layer,
		                   i->n_layers - 1);
	const size_t want = layer < 0 ? row * i->n_layers : row;
	if (n_bytes != want)
		return client_fail(c, MOE_EINVAL,
		                   "mask of %zu bytes; layer %d needs exactly %zu "
		                   "(%s%zu bytes of %u experts)",
		                   n_bytes, layer, want, layer < 0 ? "every block's " : "", row,
		                   i->n_experts);
	struct moe_slot s = {0};
	int rc = moe_slot_acquire(c, &s);
	if (rc != MOE_OK)
		return rc;
	if (n_bytes > s.input_bytes) {
		moe_slot_release(c, s.index);
		return client_fail(c, MOE_EINVAL, "mask of %zu bytes exceeds the input area (%zu)",
		                   n_bytes, s.input_bytes);
	}
	memcpy(s.input, bits, n_bytes);
	struct moe_request r = {.op = MOE_OP_MASK, .layer = layer};
	rc = call_on_fresh_slot(c, &r, &s, NULL, timeout_ms);
	if (rc != MOE_OK)
		return rc;
	/* Kept for moe_reconnect (a copy off the request path: masks change rarely). */
	if (!c->gpu_mask && !(c->gpu_mask = calloc(i->n_layers, row)))
		return client_fail(c, MOE_ENOMEM,
		                   "the mask was set, but keeping a copy for "
		                   "moe_reconnect ran out of memory");
	memcpy(c->gpu_mask + (layer < 0 ? 0 : (size_t)layer * row), bits, n_bytes);
	return MOE_OK;
}

/* STATS flags need a 1.2 sidecar: an older one refuses them (MOE_EBADFIELD), so say why
 * without asking. */
static int stats_flags_supported(struct moe_client *c, uint16_t flags)
{
	if (flags && c->info.abi_minor < 2)
		return client_fail(c, MOE_EVERSION,
		                   "the sidecar speaks protocol %u.%u: per-expert statistics need "
		                   "1.2",
		                   c->info.abi_major, c->info.abi_minor);
	return MOE_OK;
}

/* One STATS with flags on a fresh slot; on MOE_OK, take() reads the output area (its value
 * bytes) before the slot goes back. */
static int stats_call(struct moe_client *c, uint16_t flags,
                      int (*take)(struct moe_client *c, const struct moe_slot *s, uint32_t value,
                                  void *arg),
                      void *arg, int timeout_ms)
{
	int rc = stats_flags_supported(c, flags);
	if (rc != MOE_OK)
		return rc;
	struct moe_slot s = {0};
	rc = moe_slot_acquire(c, &s);
	if (rc != MOE_OK)
		return rc;
	struct moe_request r = {.op = MOE_OP_STATS, .flags = flags};
	struct moe_completion d;
	r.slot = s.index;
	r.user_data = ((uint64_t)MOE_OP_STATS << 56) | ++c->call_seq;
	rc = moe_call(c, &r, &d, timeout_ms);
	if (rc == MOE_OK)
		rc = take(c, &s, d.value, arg);
	moe_slot_abandon(c, s.index);
	return rc;
}

struct json_dest {
	char *buf;
	size_t len;
};

static int take_json(struct moe_client *c, const struct moe_slot *s, uint32_t value, void *arg)
{
	const struct json_dest *j = arg;
	size_t n = value;
	if (n >= s->output_bytes || ((const char *)s->output)[n] != '\0')
		return client_fail(c, MOE_EPROTO, "STATS reply of %zu bytes is not terminated", n);
	if (n + 1 > j->len)
		return client_fail(c, MOE_ETOOSMALL, "STATS reply is %zu bytes, buffer %zu", n + 1,
		                   j->len);
	memcpy(j->buf, s->output, n + 1);
	return MOE_OK;
}

int moe_stats_json_flags(struct moe_client *c, uint16_t flags, char *buf, size_t len,
                         int timeout_ms)
{
	if (!c || !buf || len == 0 || (flags & ~MOE_STATS_EXPERTS))
		return MOE_EINVAL;
	struct json_dest j = {buf, len};
	return stats_call(c, flags, take_json, &j, timeout_ms);
}

int moe_stats_json(struct moe_client *c, char *buf, size_t len, int timeout_ms)
{
	return moe_stats_json_flags(c, 0, buf, len, timeout_ms);
}

struct table_dest {
	uint64_t *counts;
	float *heat;
	uint32_t *half_life;
};

/* The expert table is the sidecar's output: checked against the model this client was told
 * about and against its own size before anything is copied out. */
static int take_table(struct moe_client *c, const struct moe_slot *s, uint32_t value, void *arg)
{
	const struct table_dest *t = arg;
	struct moe_expert_table_header h;
	if (value < sizeof(h) || value > s->output_bytes)
		return client_fail(c, MOE_EPROTO, "expert table of %u bytes (area %zu)", value,
		                   s->output_bytes);
	memcpy(&h, s->output, sizeof(h));
	const uint64_t cells = (uint64_t)c->info.n_moe_layers * c->info.n_experts;
	if (h.magic != MOE_EXPERT_TABLE_MAGIC || h.total_bytes != value ||
	    h.n_moe_layers != c->info.n_moe_layers || h.n_experts != c->info.n_experts ||
	    h.counts_off < h.header_size || h.counts_off % 8 ||
	    h.counts_off + cells * sizeof(uint64_t) > value || h.heat_off % 4 ||
	    h.heat_off < h.counts_off + cells * sizeof(uint64_t) ||
	    h.heat_off + cells * sizeof(float) > value)
		return client_fail(c, MOE_EPROTO,
		                   "expert table does not describe this model (%u x %u experts, "
		                   "%u bytes)",
		                   h.n_moe_layers, h.n_experts, value);
	const uint8_t *base = s->output;
	if (t->counts)
		memcpy(t->counts, base + h.counts_off, cells * sizeof(uint64_t));
	if (t->heat)
		memcpy(t->heat, base + h.heat_off, cells * sizeof(float));
	if (t->half_life)
		*t->half_life = h.half_life_tokens;
	return MOE_OK;
}

int moe_expert_stats(struct moe_client *c, uint64_t *counts, float *heat, size_t n,
                     uint32_t *half_life, int timeout_ms)
{
	if (!c)
		return MOE_EINVAL;
	if (c->info.n_experts == 0)
		return client_fail(c, MOE_ENOMODEL, "the sidecar serves no model: no expert stats");
	const size_t cells = (size_t)c->info.n_moe_layers * c->info.n_experts;
	if ((counts || heat) && n < cells)
		return client_fail(c, MOE_EINVAL, "%zu entries; the model has %u x %u experts", n,
		                   c->info.n_moe_layers, c->info.n_experts);
	struct table_dest t = {counts, heat, half_life};
	return stats_call(c, MOE_STATS_EXPERT_TABLE, take_table, &t, timeout_ms);
}

/* ---- Expert leases (ABI 1.3) ---------------------------------------------------------------- */

/* One of the sidecar's lease mappings (map NULL: none) into the caller's optional outputs. */
static int mapping_out(const struct moe_client *c, const void *map, size_t map_bytes, int map_fd,
                       const void **base, size_t *bytes, int *fd)
{
	if (!c)
		return MOE_EINVAL;
	if (c->dead)
		return MOE_EPEERDEAD;
	if (!map)
		return MOE_ENOLEASE;
	if (base)
		*base = map;
	if (bytes)
		*bytes = map_bytes;
	if (fd)
		*fd = map_fd;
	return MOE_OK;
}

int moe_lease_pool(const struct moe_client *c, const void **base, size_t *bytes, int *fd)
{
	return c ? mapping_out(c, c->pool, c->pool_bytes, c->pool_fd, base, bytes, fd) : MOE_EINVAL;
}

int moe_lease_staging(const struct moe_client *c, const void **base, size_t *bytes, int *fd)
{
	return c ? mapping_out(c, c->staging, c->staging_bytes, c->staging_fd, base, bytes, fd)
	         : MOE_EINVAL;
}

/* Every matrix of a lease description lies inside its area (the sidecar's word, checked). */
static bool lease_in_pool(const struct moe_client *c, const struct moe_lease_matrix *m)
{
	const uint64_t size = m->area == MOE_LEASE_AREA_STAGING ? c->staging_bytes
	                      : m->area == MOE_LEASE_AREA_POOL  ? c->pool_bytes
	                                                        : 0;
	return m->offset <= size && m->bytes <= size - m->offset;
}

/* The entry of lease id in c's slice store (grown to hold it); NULL: out of memory. */
static struct lease_slices *slices_entry(struct moe_client *c, uint32_t id)
{
	const uint32_t i = id & 0xffffu;
	if (i >= c->slice_cap) {
		uint32_t cap = c->slice_cap ? c->slice_cap : 64;
		while (cap <= i)
			cap *= 2;
		struct lease_slices *p = realloc(c->slice_of, (size_t)cap * sizeof(*p));
		if (!p)
			return NULL;
		memset(p + c->slice_cap, 0, (size_t)(cap - c->slice_cap) * sizeof(*p));
		c->slice_of = p;
		c->slice_cap = cap;
	}
	return &c->slice_of[i];
}

/* Matrix j of e (area SLICES, offset its first slice in table[0, n_table)): its slices
 * checked (each inside its pool, the rows covered in order) and kept under e's lease id;
 * offset becomes 0. MOE_OK, MOE_EPROTO, MOE_ENOMEM. */
static int lease_keep_slices(struct moe_client *c, struct moe_lease_expert *e, int j,
                             const struct moe_lease_slice *table, uint32_t n_table)
{
	struct moe_lease_matrix *m = j == 0 ? &e->gate : j == 1 ? &e->up : &e->down;
	const uint64_t first = m->offset;
	const uint32_t k = first < n_table ? table[first].n_slices : 0;
	if (c->n_pools < 2 || !k || k > MOE_LEASE_MAX_POOLS || k > n_table - first)
		return client_fail(c, MOE_EPROTO,
		                   "LEASE: expert %u: slices %llu.. of a %u-entry table (%u pools)",
		                   e->expert, (unsigned long long)first, n_table, c->n_pools);
	struct lease_slices *ls = slices_entry(c, e->lease);
	if (!ls)
		return client_fail(c, MOE_ENOMEM, "LEASE: out of memory for the slices");
	if (ls->id != e->lease)
		memset(ls, 0, sizeof(*ls));
	ls->id = e->lease;
	uint32_t row = 0;
	for (uint32_t i = 0; i < k; i++) {
		const struct moe_lease_slice *s = &table[first + i];
		if (s->pool >= c->n_pools || s->offset > c->pools_bytes[s->pool] ||
		    s->bytes > c->pools_bytes[s->pool] - s->offset || s->row0 != row ||
		    s->rows > m->rows - row || s->n_slices != k)
			return client_fail(c, MOE_EPROTO,
			                   "LEASE: expert %u: slice %u (pool %u, rows %u+%u) lies "
			                   "outside its pool or the matrix",
			                   e->expert, i, s->pool, s->row0, s->rows);
		row += s->rows;
		ls->s[j][i] = *s;
	}
	if (row != m->rows)
		return client_fail(c, MOE_EPROTO, "LEASE: expert %u: slices hold %u of %u rows",
		                   e->expert, row, m->rows);
	ls->n[j] = k;
	m->offset = 0;
	return MOE_OK;
}

int moe_lease(struct moe_client *c, int32_t layer, const int32_t *experts, uint32_t n,
              uint16_t flags, struct moe_lease_expert *out, int timeout_ms)
{
	if (!c || !out || n == 0 || n > 256 || timeout_ms == 0)
		return c ? client_fail(c, MOE_EINVAL,
		                       "moe_lease: %u experts (1..256), out %s, timeout %d ms", n,
		                       out ? "set" : "NULL", timeout_ms)
		         : MOE_EINVAL;
	if (c->dead)
		return MOE_EPEERDEAD;
	if (c->info.abi_minor < 3 || !c->pool)
		return client_fail(c, MOE_ENOLEASE,
		                   "moe_lease: the sidecar (protocol %u.%u) shares no slot pool%s",
		                   c->info.abi_major, c->info.abi_minor,
		                   c->info.abi_minor >= 3 ? " (start it with serve --leases)" : "");
	if (flags & ~MOE_LEASE_FLAGS_ALL)
		return client_fail(c, MOE_EINVAL, "moe_lease: flags 0x%x (known 0x%x)", flags,
		                   MOE_LEASE_FLAGS_ALL);
	if ((flags & MOE_LEASE_BF16) && !c->staging)
		return client_fail(
		    c, MOE_ENOLEASE,
		    "moe_lease: BF16: the sidecar gives this channel no staging area "
		    "(serve --lease-staging-mib)");
	struct moe_slot s = {0};
	int rc = moe_slot_acquire(c, &s);
	if (rc != MOE_OK)
		return rc;
	if ((size_t)n * sizeof(int32_t) > s.ids_bytes ||
	    (size_t)n * sizeof(struct moe_lease_expert) > s.output_bytes) {
		moe_slot_release(c, s.index);
		return client_fail(
		    c, MOE_EINVAL,
		    "moe_lease: %u experts do not fit the channel's slot (connect with "
		    "more max_tokens or top_k)",
		    n);
	}
	for (uint32_t i = 0; i < n; i++)
		s.expert_ids[i] = experts ? experts[i] : (int32_t)i;
	/* The sidecar's wait for cold experts: the caller's timeout, less a margin for the reply
	 * (no limit: the sidecar's default). */
	struct moe_request r = {.op = MOE_OP_LEASE,
	                        .flags = flags,
	                        .n_tokens = n,
	                        .layer = layer,
	                        .arg = timeout_ms > 0 ? (uint32_t)timeout_ms : 0};
	struct moe_completion d;
	rc = call_on_fresh_slot_keep(c, &r, &s, &d, timeout_ms > 0 ? timeout_ms + 1000 : -1);
	if (rc == MOE_OK) {
		memcpy(out, s.output, (size_t)n * sizeof(*out));
		/* ABI 1.4: the slice table after the n descriptions (d.index of them) */
		const size_t table_cap =
		    (s.output_bytes - (size_t)n * sizeof(*out)) / sizeof(struct moe_lease_slice);
		const struct moe_lease_slice *table =
		    (const struct moe_lease_slice *)(const void *)((const uint8_t *)s.output +
		                                                   (size_t)n * sizeof(*out));
		for (uint32_t i = 0; i < n && rc == MOE_OK; i++) {
			struct moe_lease_matrix *m[3] = {&out[i].gate, &out[i].up, &out[i].down};
			for (int j = 0; j < 3 && rc == MOE_OK; j++)
				if (m[j]->area == MOE_LEASE_AREA_SLICES)
					rc = lease_keep_slices(c, &out[i], j, table,
					                       d.index < table_cap ? d.index
					                                           : table_cap);
				else if (!lease_in_pool(c, m[j]))
					rc = client_fail(
					    c, MOE_EPROTO,
					    "LEASE: expert %u's matrices lie outside the "
					    "%llu-byte pool",
					    out[i].expert, (unsigned long long)c->pool_bytes);
		}
	}
	moe_slot_abandon(c, s.index);
	return rc;
}

int moe_lease_release(struct moe_client *c, const uint32_t *leases, uint32_t n, int timeout_ms)
{
	if (!c || (leases && (n == 0 || n > 256)) || (!leases && n))
		return c ? client_fail(c, MOE_EINVAL,
		                       "moe_lease_release: %u ids (1..256, or NULL "
		                       "and 0: every lease)",
		                       n)
		         : MOE_EINVAL;
	if (c->dead)
		return MOE_EPEERDEAD;
	if (c->info.abi_minor < 3)
		return client_fail(c, MOE_ENOLEASE,
		                   "moe_lease_release: the sidecar (protocol "
		                   "%u.%u) has no leases",
		                   c->info.abi_major, c->info.abi_minor);
	struct moe_slot s = {0};
	int rc = moe_slot_acquire(c, &s);
	if (rc != MOE_OK)
		return rc;
	if (leases)
		memcpy(s.expert_ids, leases, (size_t)n * sizeof(*leases));
	struct moe_request r = {
	    .op = MOE_OP_RELEASE, .flags = leases ? 0 : MOE_RELEASE_ALL, .n_tokens = n};
	rc = call_on_fresh_slot(c, &r, &s, NULL, timeout_ms);
	if (rc == MOE_OK && !leases && c->slice_of)
		memset(c->slice_of, 0, (size_t)c->slice_cap * sizeof(*c->slice_of));
	for (uint32_t i = 0; rc == MOE_OK && leases && i < n; i++)
		if ((leases[i] & 0xffffu) < c->slice_cap &&
		    c->slice_of[leases[i] & 0xffffu].id == leases[i])
			memset(&c->slice_of[leases[i] & 0xffffu], 0, sizeof(*c->slice_of));
	return rc;
}

uint32_t moe_lease_pool_count(const struct moe_client *c)
{
	return c && !c->dead ? c->n_pools : 0;
}

int moe_lease_pool_at(const struct moe_client *c, uint32_t pool, const void **base, size_t *bytes,
                      int *fd)
{
	if (!c)
		return MOE_EINVAL;
	if (pool >= c->n_pools)
		return c->dead ? MOE_EPEERDEAD : MOE_ENOLEASE;
	return mapping_out(c, c->pools[pool], c->pools_bytes[pool], c->pools_fd[pool], base, bytes,
	                   fd);
}

/* Which matrix of e m is (0 gate, 1 up, 2 down), or -1. */
static int matrix_of(const struct moe_lease_expert *e, const struct moe_lease_matrix *m)
{
	return m == &e->gate ? 0 : m == &e->up ? 1 : m == &e->down ? 2 : -1;
}

int moe_lease_slices(const struct moe_client *c, const struct moe_lease_expert *e,
                     const struct moe_lease_matrix *m, struct moe_lease_slice *out, uint32_t cap,
                     uint32_t *n)
{
	const int j = e && m ? matrix_of(e, m) : -1;
	if (!c || j < 0 || !n || (cap && !out))
		return MOE_EINVAL;
	if (c->dead)
		return MOE_EPEERDEAD;
	if (m->area == MOE_LEASE_AREA_POOL) { /* one slice: the whole matrix in pool 0 */
		*n = 1;
		if (!cap)
			return MOE_ETOOSMALL;
		*out = (struct moe_lease_slice){.offset = m->offset,
		                                .bytes = m->bytes,
		                                .row_stride = m->row_stride,
		                                .scales_offset = m->scales_offset,
		                                .bias_offset = m->bias_offset,
		                                .pool = 0,
		                                .row0 = 0,
		                                .rows = m->rows,
		                                .interleave = m->interleave,
		                                .scale_stride = m->scale_stride,
		                                .n_slices = 1};
		return MOE_OK;
	}
	const uint32_t i = e->lease & 0xffffu;
	if (m->area != MOE_LEASE_AREA_SLICES || i >= c->slice_cap ||
	    c->slice_of[i].id != e->lease || !c->slice_of[i].n[j])
		return MOE_EINVAL; /* the staging area, or a lease not held */
	*n = c->slice_of[i].n[j];
	if (cap < *n)
		return MOE_ETOOSMALL;
	memcpy(out, c->slice_of[i].s[j], *n * sizeof(*out));
	return MOE_OK;
}

int moe_lease_rows(const struct moe_client *c, const struct moe_lease_expert *e,
                   const struct moe_lease_matrix *m, void *dst, size_t dst_bytes)
{
	if (!c || !e || !m || !dst || matrix_of(e, m) < 0)
		return MOE_EINVAL;
	if (c->dead)
		return MOE_EPEERDEAD;
	if (m->area == MOE_LEASE_AREA_POOL || m->area == MOE_LEASE_AREA_STAGING) {
		const void *area = m->area == MOE_LEASE_AREA_POOL ? c->pool : c->staging;
		return area ? moe_lease_deinterleave(m, area, dst, dst_bytes) : MOE_EINVAL;
	}
	struct moe_lease_slice s[MOE_LEASE_MAX_POOLS];
	uint32_t n;
	int rc = moe_lease_slices(c, e, m, s, MOE_LEASE_MAX_POOLS, &n);
	for (uint32_t i = 0; rc == MOE_OK && i < n; i++)
		rc = moe_lease_deinterleave_slice(m, &s[i], c->pools[s[i].pool], dst, dst_bytes);
	return rc;
}

/* The interleaved layouts (struct moe_lease_matrix.interleave 8): a block's segments in the
 * order a column stores them — a vector segment of L bytes as L/4 32-byte vectors holding 4
 * bytes of each of the 8 rows, a scalar one as 8 copies side by side. Facts of the sidecar's
 * decode layout (kernels/interleave.c), repeated here so the library needs no kernels. */
struct lease_x8 {
	uint32_t format, block_elems, block_bytes, n;
	struct {
		uint8_t offset, bytes;
		bool vector;
	} seg[4];
};
static const struct lease_x8 lease_x8[] = {
    {39, 32, 17, 2, {{1, 16, true}, {0, 1, false}}},                                   /* MXFP4 */
    {8, 32, 34, 2, {{2, 32, true}, {0, 2, false}}},                                    /* Q8_0 */
    {12, 256, 144, 4, {{0, 2, false}, {2, 2, false}, {4, 12, true}, {16, 128, true}}}, /* Q4_K */
    {30, 16, 32, 1, {{0, 32, true}}},                                                  /* BF16 */
    {1001, 32, 20, 2, {{4, 16, true}, {0, 4, true}}}, /* INT4_G32 */
    {40, 64, 36, 2, {{4, 32, true}, {0, 4, true}}},   /* NVFP4 */
    {10, 256, 84, 4, {{80, 2, false}, {82, 2, false}, {0, 16, true}, {16, 64, true}}},   /* Q2_K */
    {11, 256, 110, 4, {{108, 2, false}, {96, 12, true}, {0, 32, true}, {32, 64, true}}}, /* Q3_K */
    {20, 32, 18, 2, {{2, 16, true}, {0, 2, false}}},                                 /* IQ4_NL */
    {23, 256, 136, 4, {{0, 2, false}, {2, 2, false}, {4, 4, true}, {8, 128, true}}}, /* IQ4_XS */
};

int moe_lease_deinterleave(const struct moe_lease_matrix *m, const void *pool, void *dst,
                           size_t dst_bytes)
{
	if (!m || !pool || !dst || m->area == MOE_LEASE_AREA_SLICES) /* no one pool holds it */
		return MOE_EINVAL;
	const struct lease_x8 *l = NULL;
	for (size_t i = 0; i < sizeof(lease_x8) / sizeof(lease_x8[0]); i++)
		if (lease_x8[i].format == m->format)
			l = &lease_x8[i];
	const uint8_t *src = (const uint8_t *)pool + m->offset;
	if (m->interleave == 0) { /* GGUF rows already: copy them packed */
		if (m->rows && m->bytes < (uint64_t)(m->rows - 1) * m->row_stride)
			return MOE_EINVAL;
		const size_t rb =
		    m->rows ? (size_t)(m->bytes - (uint64_t)(m->rows - 1) * m->row_stride) : 0;
		if ((uint64_t)m->rows * rb > dst_bytes)
			return MOE_ETOOSMALL;
		for (uint32_t r = 0; r < m->rows; r++)
			memcpy((uint8_t *)dst + (size_t)r * rb, src + (size_t)r * m->row_stride,
			       rb);
		return MOE_OK;
	}
	if (m->interleave != 8 || !l || m->rows % 8 || m->cols % l->block_elems)
		return MOE_EINVAL;
	const size_t nb = m->cols / l->block_elems, bb = l->block_bytes, rb = nb * bb;
	if ((uint64_t)m->rows * rb > dst_bytes)
		return MOE_ETOOSMALL;
	if (m->row_stride < rb ||
	    (uint64_t)(m->rows / 8 - 1) * 8 * m->row_stride + 8 * rb > m->bytes)
		return MOE_EINVAL;
	for (size_t g = 0; g < m->rows / 8u; g++) {
		const uint8_t *column = src + g * 8 * m->row_stride;
		uint8_t *out = (uint8_t *)dst + g * 8 * rb;
		for (size_t b = 0; b < nb; b++, column += 8 * bb)
			for (size_t r = 0; r < 8; r++) {
				uint8_t *block = out + r * rb + b * bb;
				size_t at = 0;
				for (uint32_t i = 0; i < l->n; i++) {
					const size_t sb = l->seg[i].bytes;
					uint8_t *to = block + l->seg[i].offset;
					if (l->seg[i].vector)
						for (size_t v = 0; v < sb / 4; v++)
							memcpy(to + 4 * v,
							       column + at + 32 * v + 4 * r, 4);
					else
						memcpy(to, column + at + sb * r, sb);
					at += 8 * sb;
				}
			}
	}
	return MOE_OK;
}

int moe_lease_deinterleave_slice(const struct moe_lease_matrix *m, const struct moe_lease_slice *s,
                                 const void *pool, void *dst, size_t dst_bytes)
{
	if (!m || !s || !pool || !dst || s->rows > m->rows || s->row0 > m->rows - s->rows ||
	    s->interleave != m->interleave)
		return MOE_EINVAL;
	struct moe_lease_matrix sub = *m;
	sub.area = MOE_LEASE_AREA_POOL; /* the slice's own pool */
	sub.offset = s->offset;
	sub.bytes = s->bytes;
	sub.row_stride = s->row_stride;
	sub.rows = s->rows;
	size_t rb = 0; /* GGUF row bytes */
	if (m->interleave == 0) {
		if (s->rows && s->bytes < (uint64_t)(s->rows - 1) * s->row_stride)
			return MOE_EINVAL;
		rb = s->rows ? (size_t)(s->bytes - (uint64_t)(s->rows - 1) * s->row_stride) : 0;
	} else
		for (size_t i = 0; i < sizeof(lease_x8) / sizeof(lease_x8[0]); i++)
			if (lease_x8[i].format == m->format &&
			    m->cols % lease_x8[i].block_elems == 0)
				rb = m->cols / lease_x8[i].block_elems * lease_x8[i].block_bytes;
	if (m->interleave && (!rb || s->row0 % 8))
		return MOE_EINVAL;
	const size_t at = (size_t)s->row0 * rb;
	if (at > dst_bytes)
		return MOE_ETOOSMALL;
	return moe_lease_deinterleave(&sub, pool, (uint8_t *)dst + at, dst_bytes - at);
}
