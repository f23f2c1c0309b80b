/* moe_client.h — libmoe_client, the engine's side of the moe-sidecar channel.
 *
 * This header (with moe_abi.h, which it includes: status codes, dtypes, ops, flags) is the
 * whole API. It compiles as C11 and as C++. A client connects to a running moe-sidecar over
 * its Unix socket, receives a private shared-memory channel, and then moves requests through
 * it without system calls on the fast path:
 *
 *     struct moe_client *c;
 *     if (moe_connect(NULL, &c) != MOE_OK) …               // default socket, default limits
 *     struct moe_slot s;
 *     moe_slot_acquire(c, &s);                              // zero-copy areas of one slot
 *     fill s.input, s.expert_ids, s.expert_weights …
 *     moe_forward_submit(c, s.index, layer, n, k, 0, MOE_DTYPE_BF16, MOE_DTYPE_BF16, 0);
 *     struct moe_completion done;
 *     moe_forward_wait(c, s.index, &done, 1000);            // spin briefly, then sleep
 *     read s.output …; moe_slot_release(c, s.index);
 *     moe_close(c);
 *
 * Linking: `pkg-config --cflags --libs moe-client`, or in CMake
 * `find_package(MoeClient)` and `target_link_libraries(app MoeClient::moe_client)`
 * (MoeClient::moe_client_static for the static library). Nothing else to link.
 *
 * Thread-safety: a struct moe_client is NOT thread-safe. All calls on one client must be
 * serialised by the caller (one engine thread, a lock, or one CUDA stream's host functions).
 * Different clients are independent. The library starts no threads, installs no signal
 * handlers and keeps no global state; it sends with MSG_NOSIGNAL, so a dead sidecar never
 * raises SIGPIPE.
 *
 * Errors: every call returns MOE_OK (0) or a negative enum moe_status; moe_strerror() names
 * it, moe_last_error() gives the sentence behind the last failure on a client. Request errors
 * (MOE_EBAD*, MOE_EIO, …, all <= -32) come from the sidecar with its own sentence; the others
 * are the library's.
 *
 * Compatibility: the library's ABI is its soname (libmoe_client.so.1): structs only grow
 * into their reserved fields, functions are only added. The wire protocol is versioned apart
 * (MOE_ABI_MAJOR.MOE_ABI_MINOR): this library talks to any sidecar of the same major, using
 * what both minors know (a 1.0 sidecar sends no error sentences and no model fingerprint).
 */
#ifndef MOE_CLIENT_H
#define MOE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "moe_abi.h"

#ifndef MOE_API /* a build that compiles libmoe_client into itself may define it empty */
#if defined(__GNUC__) || defined(__clang__)
#define MOE_API __attribute__((visibility("default")))
#else
#define MOE_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

struct moe_client;

/* ---- Connecting --------------------------------------------------------------------------- */

/* moe_connect_opts.timeout_ms: fail at once rather than wait for a starting sidecar. */
#define MOE_CONNECT_NOWAIT (-1)

/* Connection options. Zero (NULL) means "default" for every field. */
struct moe_connect_opts {
	const char *socket_path; /* NULL: $MOE_SIDECAR_SOCKET, else
	                            $XDG_RUNTIME_DIR/moe-sidecar/sidecar.sock, else
	                            /run/moe-sidecar/sidecar.sock */
	uint32_t max_tokens;     /* tokens per request */
	uint32_t hidden;         /* elements per row (default: the model's hidden size) */
	uint32_t top_k;          /* expert ids per token */
	uint32_t n_slots;        /* request slots (= requests in flight at once) */
	/* How long moe_connect may take, waiting included: a sidecar that is starting (the
	 * socket not there yet, or there and answering MOE_ESTARTING while it warms up) is
	 * retried with a bounded backoff (10 ms doubling to 100 ms) until it serves or this
	 * runs out. 0: 5000. Negative (MOE_CONNECT_NOWAIT): no waiting — a starting sidecar
	 * is MOE_ESTARTING at once, with its warm-up progress in the sentence. */
	int timeout_ms;
	const char *client_name; /* shown in the sidecar's logs */
	/* The fingerprint (32 hex digits, moe_model_fingerprint) the served model must have:
	 * another model, or a sidecar that reports none, is MOE_EREFUSED with both named. */
	const char *expect_model;
	/* Who may be the server. Before sending anything the client reads the listening
	 * process's credentials (SO_PEERCRED): its uid must be root's, this process's own, or
	 * server_uid (0: only those two). Any other is MOE_EREFUSED with both uids named: a
	 * socket path another user could redirect leads to that user's server, not ours. */
	uint32_t server_uid;
	/* MOE_CONNECT_* bits (unknown bits: MOE_EINVAL). MOE_CONNECT_BATCH_INVARIANT: every
	 * FORWARD on this channel is batch-invariant — a token's output bits depend only on its
	 * own row, ids and weights, never on the other tokens of the request, their number or
	 * its position (nor on the sidecar's threads or NUMA nodes). A sidecar that cannot
	 * promise it (one that serves no model, or a protocol 1.2 one) refuses the connection
	 * (MOE_EREFUSED, MOE_EPROTO). docs/engines.md says what it costs. */
	uint32_t flags;
	void *reserved[3]; /* must be NULL */
};
#define MOE_CONNECT_BATCH_INVARIANT 0x1u

/* Connects and maps the channel. opts may be NULL. On failure *out is NULL and the return
 * value says why (MOE_ECONNECT: nothing serves the path; MOE_ESTARTING: a sidecar is there
 * but did not finish starting within timeout_ms; MOE_EVERSION, MOE_EREFUSED, …); the
 * sentence is in moe_connect_error() (thread-local, valid until the next failing call on
 * this thread). */
MOE_API int moe_connect(const struct moe_connect_opts *opts, struct moe_client **out);
MOE_API const char *moe_connect_error(void);

/* After MOE_EPEERDEAD (the sidecar died or was restarted): connects c again, to whatever
 * sidecar now serves the same socket, with the options and the limits c had, waiting up to
 * timeout_ms for one that is starting (as moe_connect; 0: c's connect timeout). The new
 * sidecar must serve the model c first connected to (same fingerprint; another model is
 * MOE_EREFUSED, as at connect) and gets c's GPU mask again before this returns. Requests in
 * flight on the old channel are gone (they already failed with MOE_EPEERDEAD); every slot is
 * free again. The channel's memory is NEW: the old region is unmapped, so unregister it
 * (cudaHostUnregister) before calling, drop every slot pointer, and take the new region from
 * moe_channel_region (register it again). On failure c stays dead (later calls fail with
 * MOE_EPEERDEAD) and may be reconnected again; the sentence is in moe_last_error(c). */
MOE_API int moe_reconnect(struct moe_client *c, int timeout_ms);

/* Unmaps the channel and closes the socket. Requests still in flight are abandoned (the
 * sidecar reclaims their slots). NULL is a no-op. */
MOE_API void moe_close(struct moe_client *c);

/* Fingerprint of the model at path (a .gguf file or its first split, a .safetensors file, a
 * checkpoint directory) into hex (32 hex digits and a NUL): the value the sidecar serving
 * that model reports in moe_info()->fingerprint. Reads the files' names, sizes, headers and
 * a few sampled blocks (well under 1 MiB per file). On failure the sentence is in
 * moe_connect_error(). */
MOE_API int moe_model_fingerprint(const char *path, char hex[33]);

/* What was negotiated and what the sidecar serves. Valid until moe_close. */
struct moe_info {
	uint32_t max_tokens, hidden, top_k, n_slots;
	uint32_t dtype_mask; /* bit (1 << MOE_DTYPE_*) per accepted dtype */
	uint32_t sidecar_pid;
	uint16_t abi_major, abi_minor; /* the sidecar's protocol version */
	uint64_t channel_bytes;
	/* Model (all zero when the sidecar runs without one). Layers are transformer blocks,
	 * numbered from 0; MoE layers are the blocks with routed experts (moe_model_layers). */
	uint32_t n_layers, n_moe_layers, first_moe_layer, n_experts, model_top_k, model_hidden,
	    expert_ffn;
	char model_name[64];
	char fingerprint[33]; /* 32 hex digits; "" when the sidecar reports none */
	/* 1: this channel's FORWARDs are batch-invariant (asked with MOE_CONNECT_BATCH_INVARIANT,
	 * or the sidecar runs with --batch-invariant) */
	uint32_t batch_invariant;
};
/* C++ cannot spell `const moe_info *` (the function hides the struct's name there):
 * moe_info_t names the struct in both languages. */
typedef struct moe_info moe_info_t;
MOE_API const moe_info_t *moe_info(const struct moe_client *c);

/* The MoE layers' block indices, ascending: writes min(n, cap) of them to layers (may be
 * NULL with cap 0) and returns n = moe_info()->n_moe_layers, or a negative status
 * (MOE_ENOMODEL without a model). The layers need not be contiguous. */
MOE_API int moe_model_layers(const struct moe_client *c, int32_t *layers, uint32_t cap);

/* ---- The channel's memory ----------------------------------------------------------------
 * One shared mapping, page aligned, alive until moe_close. An engine may register it once
 * with its GPU runtime (cudaHostRegister(base, bytes, cudaHostRegisterDefault)) and copy
 * activations straight into slots and results straight out. A client writes only the input,
 * expert_ids and expert_weights areas of slots it owns, and reads only their output areas;
 * everything else in the mapping (header page, rings, other slots) is the protocol's, and
 * writing it is a protocol violation the sidecar drops the client for. */
MOE_API int moe_channel_region(const struct moe_client *c, void **base, size_t *bytes);

/* Direct pointers into one request slot of the shared channel (zero-copy). The areas stay at
 * the same addresses until moe_close, so they can be captured (a CUDA graph). The caller
 * owns them between acquire and submit, and again between the completion and the next
 * submit or release. Sizes are capacities in bytes; *_off are the same areas as offsets from
 * the channel base (moe_channel_region). */
struct moe_slot {
	uint32_t index;
	void *input;         /* max_tokens rows of `hidden` elements, any accepted dtype */
	int32_t *expert_ids; /* n_tokens rows of k ids (the request's ids_per_token, −1 = skip) */
	float *expert_weights; /* n_tokens rows of k weights, same positions as the ids */
	void *output;          /* max_tokens rows of `hidden` elements */
	size_t input_bytes, ids_bytes, weights_bytes, output_bytes;
	size_t input_off, ids_off, weights_off, output_off;
};

/* Takes a free slot. MOE_EAGAIN when all n_slots are in use; MOE_EPEERDEAD when they are
 * because the sidecar died with them. */
MOE_API int moe_slot_acquire(struct moe_client *c, struct moe_slot *slot);

/* The areas of slot `index` (< n_slots) whatever its state, without taking it: for fixing
 * addresses ahead of time. Writing a slot one does not own is still forbidden. */
MOE_API int moe_slot_view(const struct moe_client *c, uint32_t index, struct moe_slot *slot);

/* Returns a slot taken with moe_slot_acquire. MOE_EINVAL for a slot whose request has not
 * completed (the sidecar may still be writing it): moe_slot_abandon is for that. */
MOE_API int moe_slot_release(struct moe_client *c, uint32_t slot);

/* Gives up a slot whatever its state: owned, it is released; in flight, its completion will
 * be discarded when it arrives and the slot becomes free then (not before: the sidecar may
 * still write it). A FORWARD abandoned after deferring experts still owes them to the next
 * FORWARD, which fails with MOE_EDEFERRED unless it carries MOE_FWD_DROP_DEFERRED. */
MOE_API int moe_slot_abandon(struct moe_client *c, uint32_t slot);

/* ---- Requests ----------------------------------------------------------------------------- */

/* One request. Fields a given op does not use must be zero. */
struct moe_request {
	uint16_t op; /* MOE_OP_* */
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
 * acquired or already submitted; MOE_EPEERDEAD if the sidecar is gone; MOE_EAGAIN if the
 * submission ring is full. Never blocks, allocates or takes a lock. */
MOE_API int moe_submit(struct moe_client *c, const struct moe_request *req);

/* A finished request. status is MOE_OK or a request error (MOE_EBAD*, MOE_EIO, …); on error
 * value/index locate the offending field (MOE_EBADEXPERT: value = the id, read back as
 * (int32_t)value, so −5 stays −5; index = token * k + position) and message is the sidecar's
 * sentence ("token 3 id 1: expert 70 out of range (0..63, -1 = skip)"), or NULL from a 1.0
 * sidecar. message stays valid until the slot is submitted again, abandoned or closed. */
struct moe_completion {
	uint64_t user_data;
	uint32_t slot;
	int32_t status;
	uint32_t value;
	uint32_t index;
	const char *message;
};

/* Takes the oldest completion not yet taken, if there is one: MOE_OK, or MOE_EAGAIN. Never
 * blocks. */
MOE_API int moe_poll(struct moe_client *c, struct moe_completion *out);

/* Takes the oldest completion, waiting at most timeout_ms (< 0: no limit). Spins briefly,
 * then sleeps on a futex (see moe_set_wait_policy). MOE_ETIMEDOUT on timeout; MOE_EPEERDEAD
 * as soon as the sidecar's death is seen (socket hang-up), so a dead sidecar never causes a
 * hang. */
MOE_API int moe_wait(struct moe_client *c, struct moe_completion *out, int timeout_ms);

/* How moe_wait waits. ADAPTIVE (the default): spin up to 30 µs, skipped while recent waits
 * were much longer, then sleep on the completion futex — right when the calling thread shares
 * cores with the sidecar's workers. SPIN: poll until the completion, the timeout or the
 * sidecar's death (looked at every 50 ms) — for a caller with a core of its own
 * (docs/performance.md). SLEEP: never spin. MOE_EINVAL for anything else. */
enum moe_wait_policy { MOE_WAIT_ADAPTIVE = 0, MOE_WAIT_SPIN = 1, MOE_WAIT_SLEEP = 2 };
MOE_API int moe_set_wait_policy(struct moe_client *c, enum moe_wait_policy policy);

/* ---- One slot's request: submit now, collect later ----------------------------------------
 * The pair an engine's submit/sync step maps onto. Completions of other slots met while
 * waiting are kept for their own wait (or moe_poll/moe_wait), never lost. */

/* One MoE layer, asynchronously: slot (acquired, filled) holds n_tokens rows of activations
 * and n_tokens rows of k ids/weights (row stride k, even when k < the negotiated top_k).
 * k_defer: ids per token the sidecar may defer into the NEXT FORWARD on this channel (0 on
 * the last MoE layer). flags: MOE_FWD_*. Returns at once (moe_submit's errors); never
 * blocks, allocates or takes a lock, so a stream host function may call it. */
MOE_API int moe_forward_submit(struct moe_client *c, uint32_t slot, int32_t layer,
                               uint32_t n_tokens, uint16_t k, uint32_t k_defer, uint8_t in_dtype,
                               uint8_t out_dtype, uint16_t flags);

/* The completion of the request in flight on `slot` (any op), waiting at most timeout_ms
 * (< 0: no limit). Returns the request's status (its sentence in moe_last_error() on error),
 * MOE_ETIMEDOUT (the request stays in flight: wait again, or abandon the slot),
 * MOE_EPEERDEAD, or MOE_EINVAL when nothing is in flight on the slot. */
MOE_API int moe_forward_wait(struct moe_client *c, uint32_t slot, struct moe_completion *done,
                             int timeout_ms);

/* moe_forward_wait without waiting: MOE_EAGAIN while the request is still in flight. */
MOE_API int moe_forward_poll(struct moe_client *c, uint32_t slot, struct moe_completion *done);

/* ---- Synchronous helpers ------------------------------------------------------------------
 * Each submits one request and waits for THAT completion (others are kept, as above). The
 * request's own status is returned; on a timeout the helper's request stays in flight (on a
 * slot the helper took itself, that slot is abandoned). */

/* Submits req (its slot acquired and filled) and waits for its completion (any status). */
MOE_API int moe_call(struct moe_client *c, const struct moe_request *req,
                     struct moe_completion *done, int timeout_ms);

/* moe_forward_submit + moe_forward_wait. */
MOE_API int moe_forward(struct moe_client *c, const struct moe_slot *slot, int32_t layer,
                        uint32_t n_tokens, uint16_t k, uint32_t k_defer, uint8_t in_dtype,
                        uint8_t out_dtype, uint16_t flags, struct moe_completion *done,
                        int timeout_ms);

/* PING round trip on a fresh slot; MOE_OK or why not. */
MOE_API int moe_ping(struct moe_client *c, int timeout_ms);

/* Lookahead hint for `layer`: n expert ids with scores (higher = sooner), or, with ids NULL,
 * n = n_experts router scores (MOE_PREFETCH_SCORES). On success *queued = loads started. */
MOE_API int moe_prefetch(struct moe_client *c, int32_t layer, const int32_t *ids,
                         const float *scores, uint32_t n, uint32_t *queued, int timeout_ms);

/* The same hint without waiting, from a slot the caller acquired and filled (expert_ids and
 * expert_weights, n entries): post it, then the layer's FORWARD. Its completion arrives like
 * any other, after which the slot can be posted again. */
MOE_API int moe_prefetch_post(struct moe_client *c, const struct moe_slot *slot, int32_t layer,
                              uint32_t n, uint16_t flags);

/* GPU expert mask: the experts this client computes itself. One bit per (layer, expert):
 * bit e % 8 (least significant first) of byte e / 8 of a layer's row of ceil(n_experts / 8)
 * bytes; set = on the GPU: the sidecar never loads it for this client and a FORWARD naming it
 * fails with MOE_EMASKED. layer −1: every transformer block, n_layers rows in block order
 * (rows of dense blocks are ignored); else one block's row. n_bytes must be exactly that size
 * (MOE_EINVAL otherwise; MOE_ENOMODEL without a model). */
MOE_API int moe_set_gpu_mask(struct moe_client *c, int32_t layer, const uint8_t *bits,
                             size_t n_bytes, int timeout_ms);

/* The sidecar's STATS as a NUL-terminated JSON object copied into buf (len bytes).
 * MOE_ETOOSMALL if it does not fit buf or the channel's output area. */
MOE_API int moe_stats_json(struct moe_client *c, char *buf, size_t len, int timeout_ms);

/* The same with STATS flags: MOE_STATS_EXPERTS adds "experts" (per MoE layer, every expert's
 * routed-token count and heat; docs/protocol.md §10). Flags need a 1.2 sidecar
 * (MOE_EVERSION from an older one, without asking it). */
MOE_API int moe_stats_json_flags(struct moe_client *c, uint16_t flags, char *buf, size_t len,
                                 int timeout_ms);

/* Per-(MoE layer, expert) routing the sidecar served to this and every other client since it
 * started, layer-major (layer i = the i-th of moe_model_layers): counts[i * n_experts + e] =
 * tokens routed to expert e by CPU-side FORWARDs; heat[…] = the same decayed, halving every
 * *half_life tokens of the layer (serve --heat-half-life). n = the arrays' entries, at least
 * n_moe_layers * n_experts (MOE_EINVAL otherwise); counts, heat and half_life may be NULL.
 * MOE_EVERSION from a sidecar older than 1.2; MOE_ETOOSMALL if the table does not fit the
 * channel's output area (12 bytes per expert). */
MOE_API int moe_expert_stats(struct moe_client *c, uint64_t *counts, float *heat, size_t n,
                             uint32_t *half_life, int timeout_ms);

/* ---- GPU expert placement ----------------------------------------------------------------
 * Which experts an engine should keep on its GPU, from per-expert load (counts or heat from
 * moe_expert_stats, or a routing trace's counts). Pure computation: no client needed. */
enum moe_placement_strategy {
	/* the N experts with the most load over all layers: the most routed pairs served */
	MOE_PLACE_FREQUENCY = 0,
	/* N / n_layers per layer (the remainder to the first layers), each layer's hottest */
	MOE_PLACE_UNIFORM = 1,
	/* whole layers from the first, each in order of load (kt-kernel's front-loading) */
	MOE_PLACE_FRONT_LOADING = 2,
	/* one at a time, the hottest expert left of the layer with the most CPU-side load:
	 * evens out the CPU work per layer (a step waits for its slowest layer) */
	MOE_PLACE_BALANCED = 3,
	MOE_PLACE_COUNT
};
/* "frequency", "uniform", "front-loading", "balanced"; NULL for anything else. */
MOE_API const char *moe_placement_name(int strategy);
/* The strategy called name, or MOE_EINVAL. */
MOE_API int moe_placement_parse(const char *name);

/* Chooses gpu_experts (layer, expert) pairs for the GPU. load: [n_moe_layers][n_experts],
 * non-negative. blocks: the transformer block of each MoE layer (moe_model_layers; NULL:
 * layer i is block i). Writes the mask in moe_set_gpu_mask's layer −1 form: n_blocks rows
 * of ceil(n_experts / 8) bytes (mask_bytes must be that), chosen bits set, every other bit
 * clear. *covered (may be NULL) = the chosen experts' share of the total load (0 when there
 * is none). Ties go to the lower layer, then the lower expert. MOE_OK or MOE_EINVAL. */
MOE_API int moe_placement(const double *load, uint32_t n_moe_layers, uint32_t n_experts,
                          const int32_t *blocks, uint32_t n_blocks, uint32_t gpu_experts,
                          int strategy, uint8_t *mask, size_t mask_bytes, double *covered);

/* ---- Expert leases (ABI 1.3; docs/engines.md "Leases") ---------------------------------------
 * A sidecar started with `serve --leases` shares its slot pool: the memfd rides with the
 * channel's at connect and the library maps it PROT_READ, page aligned (cudaHostRegister it
 * with cudaHostRegisterReadOnly). A lease pins one expert of a layer in that pool — made
 * resident first if it is not — until it is released, the channel closes or the client dies;
 * its matrices are described by offsets into the mapping (moe_abi.h, struct
 * moe_lease_matrix: format, shape, row stride, layout). Leased experts count against the
 * sidecar's budget like any resident one; a channel may pin at most half the pool at once
 * (MOE_ENOLEASE with the figures). After MOE_EPEERDEAD every lease is gone; moe_reconnect
 * maps the new sidecar's pool (the old mapping and its descriptions are invalid). */

/* The pool's mapping (base, bytes) and its memfd (the client's: dup it to keep it, to map
 * it in another runtime). MOE_ENOLEASE when the sidecar shares none; MOE_EPEERDEAD. */
MOE_API int moe_lease_pool(const struct moe_client *c, const void **base, size_t *bytes, int *fd);

/* Leases n (1..256) experts of block `layer` — experts NULL: experts 0..n-1, the whole layer
 * with n = moe_info()->n_experts — all or none, into out[0, n). flags: 0 (the served format,
 * in the pool) or MOE_LEASE_BF16 (BF16 rows in the staging area, moe_lease_staging). Cold experts
 * are loaded; the sidecar waits for them up to timeout_ms (< 0: its default, 10 s), the call a
 * second more. MOE_OK, or the sidecar's refusal with its sentence in moe_last_error: MOE_EBADLAYER,
 * MOE_EBADEXPERT (out of range, repeated), MOE_ENOLEASE (no shared pool, the channel's bound,
 * side data outside the pool), MOE_ETIMEDOUT, MOE_EMASKED, MOE_EIO; MOE_EPEERDEAD. */
MOE_API int moe_lease(struct moe_client *c, int32_t layer, const int32_t *experts, uint32_t n,
                      uint16_t flags, struct moe_lease_expert *out, int timeout_ms);

/* The channel's staging area (serve --lease-staging-mib), mapped PROT_READ like the pool:
 * where a lease with flags MOE_LEASE_BF16 finds its matrices, each dequantized by the sidecar
 * (the kernels' dequantizers) to BF16 rows (format BF16, interleave 0, area STAGING). It holds
 * a channel's BF16 leases together (MOE_ENOLEASE when full, with the figures); its room comes
 * back once the channel holds none. MOE_ENOLEASE when the channel has none. */
MOE_API int moe_lease_staging(const struct moe_client *c, const void **base, size_t *bytes,
                              int *fd);

/* Releases n (1..256) leases by id (moe_lease_expert.lease), or every lease of the channel
 * (leases NULL, n 0). MOE_EBADLEASE at the first id the channel does not hold (never leased,
 * released already): the ids before it are released. */
MOE_API int moe_lease_release(struct moe_client *c, const uint32_t *leases, uint32_t n,
                              int timeout_ms);

/* A leased matrix as GGUF rows, packed (rows × row bytes) into dst: interleave 8 is undone
 * (MXFP4, Q8_0, Q4_K, BF16, INT4_G32), interleave 0 is copied row by row. pool:
 * moe_lease_pool's base. MOE_ETOOSMALL when dst_bytes is short, MOE_EINVAL for a layout or
 * format it does not know, and for a matrix in slices (area MOE_LEASE_AREA_SLICES: see
 * moe_lease_rows). Pure computation. */
MOE_API int moe_lease_deinterleave(const struct moe_lease_matrix *m, const void *pool, void *dst,
                                   size_t dst_bytes);

/* ---- Leases of a sidecar that splits experts over NUMA nodes (ABI 1.4) ------------------------
 * Such a sidecar holds each node's rows of every expert in that node's own pool: it shares one
 * pool per node (each a sealed memfd mapped PROT_READ like the first, which moe_lease_pool
 * gives), and a leased matrix is described with area MOE_LEASE_AREA_SLICES — its rows in
 * slices, one per node (struct moe_lease_slice: pool, rows [row0, row0 + rows), offset, span,
 * layout). Register every pool (cudaHostRegister each mapping) and copy each slice, or let
 * moe_lease_rows gather the whole matrix. An unsplit sidecar shares one pool and describes
 * matrices as before. A client of ABI 1.3 is sent the first pool only, and its raw leases of a
 * split sidecar are refused (MOE_ENOLEASE, naming why); BF16 leases are never sliced. */

/* The pools shared (0: none; 1: unsplit; one per NUMA node otherwise). 0 after
 * MOE_EPEERDEAD. */
MOE_API uint32_t moe_lease_pool_count(const struct moe_client *c);
/* Pool `pool`'s mapping, bytes and memfd (the client's: dup it to keep it). MOE_ENOLEASE when
 * there is no such pool; MOE_EPEERDEAD. */
MOE_API int moe_lease_pool_at(const struct moe_client *c, uint32_t pool, const void **base,
                              size_t *bytes, int *fd);
/* The slices of matrix m of the held lease e (m: &e->gate, &e->up or &e->down, as moe_lease
 * wrote them), in row order, into out[0, cap), their count in *n: area SLICES as the sidecar
 * described them, area POOL as one slice of pool 0 holding every row. MOE_ETOOSMALL when cap
 * is short (*n says how many), MOE_EINVAL for the staging area (BF16) or a lease released,
 * MOE_EPEERDEAD. */
MOE_API int moe_lease_slices(const struct moe_client *c, const struct moe_lease_expert *e,
                             const struct moe_lease_matrix *m, struct moe_lease_slice *out,
                             uint32_t cap, uint32_t *n);
/* One slice s of m, in pool `pool` (moe_lease_pool_at's base for s->pool), as GGUF rows at
 * rows [s->row0, s->row0 + s->rows) of dst — the whole matrix packed (rows × row bytes), as
 * moe_lease_deinterleave writes it. Pure computation; its statuses. */
MOE_API int moe_lease_deinterleave_slice(const struct moe_lease_matrix *m,
                                         const struct moe_lease_slice *s, const void *pool,
                                         void *dst, size_t dst_bytes);
/* Matrix m of lease e as packed GGUF rows into dst, wherever it lies: the pool
 * (moe_lease_deinterleave), the staging area (BF16 rows) or slices in several pools (every
 * slice, moe_lease_deinterleave_slice). MOE_ETOOSMALL, MOE_EINVAL, MOE_EPEERDEAD. */
MOE_API int moe_lease_rows(const struct moe_client *c, const struct moe_lease_expert *e,
                           const struct moe_lease_matrix *m, void *dst, size_t dst_bytes);

/* ---- Diagnostics -------------------------------------------------------------------------- */

/* Name of a status code; never NULL. */
MOE_API const char *moe_strerror(int status);

/* The sentence behind the last error returned on this client ("" if none). */
MOE_API const char *moe_last_error(const struct moe_client *c);

/* The socket's file descriptor, for an event loop that wants to watch for hang-up
 * (readable = sidecar gone). */
MOE_API int moe_socket_fd(const struct moe_client *c);

/* The socket path this client connected to (opts.socket_path, else the default rule above),
 * for messages; valid until moe_close. */
MOE_API const char *moe_socket_path(const struct moe_client *c);

#ifdef __cplusplus
}
#endif
#endif /* MOE_CLIENT_H */
