/* moe_client.h — libmoe_client, the engine's side of the moe-sidecar channel.
 *
 * This header is the whole API. A client connects to a running moe-sidecar over its Unix
 * socket, receives a private shared-memory channel, and then moves requests through it
 * without system calls on the fast path:
 *
 *     struct moe_client *c;
 *     if (moe_connect(NULL, &c) != MOE_OK) …               // default socket, default limits
 *     struct moe_slot s;
 *     moe_slot_acquire(c, &s);                              // zero-copy areas of one slot
 *     fill s.input …; struct moe_request r = {.op = MOE_OP_ECHO, .slot = s.index, …};
 *     moe_submit(c, &r);
 *     struct moe_completion done;
 *     moe_wait(c, &done, 1000);                             // spin briefly, then sleep
 *     read s.output …; moe_slot_release(c, s.index);
 *     moe_close(c);
 *
 * Thread-safety: a struct moe_client is NOT thread-safe. All calls on one client must be
 * serialised by the caller (one engine thread, or a lock around them). Different clients are
 * independent and may be used from different threads. The library starts no threads, installs
 * no signal handlers and keeps no global state; it sends with MSG_NOSIGNAL, so a dead sidecar
 * never raises SIGPIPE.
 *
 * Errors: every call returns MOE_OK (0) or a negative enum moe_status; moe_strerror() names
 * it, moe_last_error() gives the sentence behind the last failure on a client.
 */
#ifndef MOE_CLIENT_H
#define MOE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "moe_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_client;

/* Connection options. Zero means "default" for every field. */
struct moe_connect_opts {
	const char *socket_path; /* NULL: $MOE_SIDECAR_SOCKET, else
	                            $XDG_RUNTIME_DIR/moe-sidecar/sidecar.sock, else
	                            /run/moe-sidecar/sidecar.sock */
	uint32_t max_tokens;     /* tokens per request */
	uint32_t hidden;         /* elements per row (default: the model's hidden size) */
	uint32_t top_k;          /* expert ids per token */
	uint32_t n_slots;        /* request slots (= requests in flight at once) */
	int timeout_ms;          /* connect + handshake; 0: 5000 */
	const char *client_name; /* shown in the sidecar's logs */
};

/* Connects and maps the channel. opts may be NULL. On failure *out is NULL and the return
 * value says why (MOE_ECONNECT, MOE_EVERSION, MOE_EREFUSED, …); the sentence is in
 * moe_connect_error() (thread-local, valid until the next moe_connect on this thread). */
int moe_connect(const struct moe_connect_opts *opts, struct moe_client **out);
const char *moe_connect_error(void);

/* Unmaps the channel and closes the socket. Requests still in flight are abandoned (the
 * sidecar reclaims their slots). NULL is a no-op. */
void moe_close(struct moe_client *c);

/* What was negotiated and what the sidecar serves. Valid until moe_close. */
struct moe_info {
	uint32_t max_tokens, hidden, top_k, n_slots;
	uint32_t dtype_mask; /* bit (1 << MOE_DTYPE_*) per accepted dtype */
	uint32_t sidecar_pid;
	uint16_t abi_major, abi_minor; /* the sidecar's protocol version */
	uint64_t channel_bytes;
	/* Model (all zero when the sidecar runs without one). */
	uint32_t n_layers, n_moe_layers, first_moe_layer, n_experts, model_top_k, model_hidden,
	    expert_ffn;
	char model_name[64];
};
const struct moe_info *moe_info(const struct moe_client *c);

/* Direct pointers into one request slot of the shared channel (zero-copy). The areas stay
 * valid until moe_close; the caller owns them between acquire and submit, and again between
 * the completion and release. Sizes are capacities in bytes. */
struct moe_slot {
	uint32_t index;
	void *input;           /* max_tokens rows of hidden elements, any accepted dtype */
	int32_t *expert_ids;   /* max_tokens * top_k ids (−1 = skip) */
	float *expert_weights; /* max_tokens * top_k weights */
	void *output;          /* max_tokens rows of hidden elements */
	size_t input_bytes, ids_bytes, weights_bytes, output_bytes;
};

/* Takes a free slot. MOE_EAGAIN when all n_slots are in use. */
int moe_slot_acquire(struct moe_client *c, struct moe_slot *slot);

/* Returns a slot taken with moe_slot_acquire. Releasing a slot whose request has not
 * completed is MOE_EINVAL (the sidecar may still be writing it). */
int moe_slot_release(struct moe_client *c, uint32_t slot);

/* One request. Fields a given op does not use must be zero. */
struct moe_request {
	uint16_t op; /* MOE_OP_* (moe_proto.h) */
	uint16_t flags;
	uint32_t slot;               /* from moe_slot_acquire */
	uint32_t n_tokens;           /* rows in slot.input */
	uint8_t in_dtype, out_dtype; /* MOE_DTYPE_* */
	uint16_t ids_per_token;      /* FORWARD */
	int32_t layer;               /* FORWARD / PREFETCH */
	uint32_t arg;                /* per-op argument */
	uint64_t user_data;          /* returned in the completion */
};

/* Publishes a request and wakes the sidecar if it sleeps. MOE_EINVAL if the slot is not
 * acquired or already submitted; MOE_EPEERDEAD if the sidecar is gone. Never blocks. */
int moe_submit(struct moe_client *c, const struct moe_request *req);

/* A finished request. status is MOE_OK or a request error (MOE_EBAD*, MOE_EIO, …);
 * value/index locate the offending field (see moe_proto.h, struct moe_cqe). */
struct moe_completion {
	uint64_t user_data;
	uint32_t slot;
	int32_t status;
	uint32_t value;
	uint32_t index;
};

/* Takes one completion if there is one: MOE_OK, or MOE_EAGAIN. Never blocks. */
int moe_poll(struct moe_client *c, struct moe_completion *out);

/* Takes one completion, waiting at most timeout_ms (< 0: no limit). Spins briefly, then
 * sleeps on a futex (see moe_set_wait_policy). MOE_ETIMEDOUT on timeout; MOE_EPEERDEAD as
 * soon as the sidecar's death is seen (socket hang-up), so a dead sidecar never causes a
 * hang. */
int moe_wait(struct moe_client *c, struct moe_completion *out, int timeout_ms);

/* How moe_wait waits. ADAPTIVE (the default): spin up to 30 µs, skipped while recent waits
 * were much longer, then sleep on the completion futex — right when the calling thread shares
 * cores with the sidecar's workers, where a spinning caller takes a core from them. SPIN: poll
 * until the completion, the timeout or the sidecar's death (looked at every 50 ms, as the
 * sleeping wait does) — for a caller with a core of its own, such as an engine's thread
 * pinned beside the sidecar's cores: no wake-up to pay per completion (on a 2-vCPU VM with one
 * worker and the client on the other vCPU, bench_decode at 100% went from 0.83x to 0.98x of
 * the floor; with the client sharing the workers' cores, 0.90x to 0.51x —
 * docs/performance.md). SLEEP: never spin. MOE_EINVAL for anything else. */
enum moe_wait_policy { MOE_WAIT_ADAPTIVE = 0, MOE_WAIT_SPIN = 1, MOE_WAIT_SLEEP = 2 };
int moe_set_wait_policy(struct moe_client *c, enum moe_wait_policy policy);

/* Convenience: PING round trip on a fresh slot; MOE_OK or why not. For an otherwise idle
 * client: a completion of another request that arrives meanwhile is consumed and lost. */
int moe_ping(struct moe_client *c, int timeout_ms);

/* ---- Model operations (a sidecar started with `serve MODEL`) -----------------------------
 * Synchronous helpers: each submits one request on a slot the caller acquired (FORWARD) or
 * on a fresh slot it takes and returns itself (the others), then waits for THAT completion.
 * For an otherwise idle client only: a completion of another request that arrives meanwhile
 * is consumed and lost. The request's own status (MOE_EBAD*, MOE_EIO, …) is returned; its
 * detail stays in *done when done != NULL. */

/* Submits req (its slot acquired and filled) and waits for its completion (any status). */
int moe_call(struct moe_client *c, const struct moe_request *req, struct moe_completion *done,
             int timeout_ms);

/* One MoE layer: slot.input holds n_tokens rows, expert_ids/expert_weights n_tokens × k.
 * k_defer: ids per token the sidecar may defer into the NEXT FORWARD (0 on the last layer).
 * flags: MOE_FWD_* (moe_proto.h): MOE_FWD_DROP_DEFERRED, MOE_FWD_DEFER_COLD. */
int moe_forward(struct moe_client *c, const struct moe_slot *slot, int32_t layer, uint32_t n_tokens,
                uint16_t k, uint32_t k_defer, uint8_t in_dtype, uint8_t out_dtype, uint16_t flags,
                struct moe_completion *done, int timeout_ms);

/* Lookahead hint for `layer`: n expert ids with scores (higher = sooner), or, with ids NULL,
 * n = n_experts router scores (MOE_PREFETCH_SCORES). On success *queued = loads started. */
int moe_prefetch(struct moe_client *c, int32_t layer, const int32_t *ids, const float *scores,
                 uint32_t n, uint32_t *queued, int timeout_ms);

/* The same hint without waiting, from a slot the caller acquired and filled (expert_ids and
 * expert_weights, n entries): post it, then the layer's FORWARD. Its completion arrives like
 * any other (moe_call consumes it on the way), after which the slot can be posted again. */
int moe_prefetch_post(struct moe_client *c, const struct moe_slot *slot, int32_t layer, uint32_t n,
                      uint16_t flags);

/* GPU expert mask: layer −1 = the whole model (n_layers × ceil(n_experts/8) bytes, layer-
 * major), else one layer's ceil(n_experts/8) bytes; bit e set = expert e is on the GPU. */
int moe_set_gpu_mask(struct moe_client *c, int32_t layer, const uint8_t *bits, size_t n_bytes,
                     int timeout_ms);

/* The sidecar's STATS as a NUL-terminated JSON object copied into buf (len bytes).
 * MOE_ETOOSMALL if it does not fit buf or the channel's output area. */
int moe_stats_json(struct moe_client *c, char *buf, size_t len, int timeout_ms);

/* Name of a status code; never NULL. */
const char *moe_strerror(int status);

/* The sentence behind the last error returned on this client ("" if none). */
const char *moe_last_error(const struct moe_client *c);

/* Socket and channel file descriptors, for an event loop that wants to watch for hang-up
 * (readable = sidecar gone). */
int moe_socket_fd(const struct moe_client *c);

#ifdef __cplusplus
}
#endif
#endif /* MOE_CLIENT_H */
