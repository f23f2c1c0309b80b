/* moe_proto.h — the wire contract between libmoe_client and moe-sidecar.
 *
 * Owns: protocol/ABI constants, the handshake messages sent over the Unix socket, the layout
 * of the shared-memory channel (header, two SPSC rings, request slots), submission and
 * completion records, and the validation helpers both sides use. It knows nothing of either
 * side's internals. docs/protocol.md is the prose version of this file.
 *
 * Rules that every field below obeys:
 *  - Everything in the channel is an offset from the channel base, never a pointer.
 *  - The sidecar computes every offset from the negotiated limits (moe_layout_compute) and
 *    never reads the layout back from shared memory: all the client can write is hostile.
 *  - Descriptors name a slot index; payload addresses are derived, never transmitted.
 *  - Reserved fields must be zero; a non-zero one is rejected (room for later minors).
 *  - Same host, so native byte order; both sides are 64-bit little-endian x86/arm.
 */
#ifndef MOE_PROTO_H
#define MOE_PROTO_H

#include <assert.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>

#include "moe_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_HELLO_MAGIC 0x484f454du                    /* "MOEH" little-endian */
#define MOE_WELCOME_MAGIC 0x574f454du                  /* "MOEW" */
#define MOE_CHANNEL_MAGIC UINT64_C(0x314e414843454f4d) /* "MOECHAN1" */

/* Hard bounds on negotiable limits: the sidecar's own configuration may be lower. They keep
 * every size computation far from overflow (max channel well under 2^63). */
#define MOE_MAX_TOKENS_LIMIT 65536u
#define MOE_MAX_HIDDEN_LIMIT 65536u
#define MOE_MAX_TOPK_LIMIT 64u
#define MOE_MAX_SLOTS_LIMIT 256u
#define MOE_CHANNEL_ALIGN 4096u /* slots and areas are page aligned (cudaHostRegister) */
#define MOE_AREA_ALIGN 64u

/* Operations (moe_abi.h). Payload conventions per op (all areas of the request's slot):
 *
 * PING     nothing.
 * ECHO     input: n_tokens rows of `hidden` in_dtype → output: the same rows in out_dtype.
 * FORWARD  one MoE layer for n_tokens tokens.
 *            sqe.layer          transformer block index (must be an MoE layer)
 *            sqe.ids_per_token  k: ids and weights per token row (≤ limits.top_k)
 *            sqe.arg            k_defer: at most this many of each token's ids may be deferred
 *                               (0 = none; must be 0 on the model's last MoE layer)
 *            input              n_tokens rows of `hidden` in_dtype activations
 *            expert_ids         n_tokens × k int32 (−1 = skip this entry)
 *            expert_weights     n_tokens × k f32 (finite)
 *            output             n_tokens rows of `hidden` out_dtype:
 *                               Σ_immediate w·expert(x)  [+ deferred part owed by the previous
 *                               FORWARD on this channel, see MOE_FWD_* below]
 *          Deferred experts (kt-kernel): of each token's ids, the sidecar may defer up to
 *          k_defer (by default the lowest-weighted; it may prefer non-resident ones to hide
 *          their I/O). Their contribution is not in this output: it is added to the output of
 *          the NEXT FORWARD on the same channel, which must be the next MoE layer with the same
 *          n_tokens (else that request fails with MOE_EDEFERRED, unless it carries
 *          MOE_FWD_DROP_DEFERRED). The sidecar never completes that next request before the
 *          owed contribution is merged. Completion value = number of experts deferred. The
 *          completion is posted when the immediate part is ready, before the deferred experts
 *          are computed; if one of them then fails, the next FORWARD fails with MOE_EIO
 *          (value = the expert, index = the deferring layer) until MOE_FWD_DROP_DEFERRED.
 * PREFETCH hints for an upcoming layer; completes at once (value = experts queued).
 *            sqe.layer          the layer the hint is for
 *            sqe.n_tokens       number of entries in expert_ids / expert_weights
 *            expert_ids         expert ids; expert_weights their scores (higher = sooner)
 *            flags              MOE_PREFETCH_SCORES: instead, expert_weights holds one router
 *                               score per expert of the layer (n_tokens = n_experts), ids unused
 * STATS    output: a NUL-terminated JSON object (see docs/protocol.md); value = its length
 *          without the NUL; MOE_ETOOSMALL if it does not fit.
 *            flags (ABI 1.2)    MOE_STATS_EXPERTS: the object gains "experts" (per MoE layer,
 *                               every expert's routed-token count and heat);
 *                               MOE_STATS_EXPERT_TABLE: the output is instead the binary
 *                               expert table below (value = its bytes).
 * MASK     sets this client's GPU expert mask: input holds one bit per (layer, expert),
 *          layer-major, bit e of byte (layer * ceil(n_experts/8) + e/8) set = on the GPU.
 *            sqe.layer          −1: the whole model; else just that layer's bytes
 *          Masked experts are never loaded for this client; a FORWARD naming one fails with
 *          MOE_EMASKED. An expert is left out of residency only while every attached client
 *          masks it.
 *
 * Errors (ABI 1.1): a completion with status < 0 and MOE_CQE_MESSAGE in cqe.flags carries a
 * NUL-terminated sentence of at most MOE_MESSAGE_MAX bytes (NUL included, never more than the
 * output area) at the start of its slot's output area — "token 3 id 1: expert 70 out of range
 * (0..63, -1 = skip)". Never set on MOE_EBADSLOT or MOE_ESLOTBUSY (the slot is not this
 * request's). */

/* Limits negotiated at the handshake. Areas are sized for the largest dtype (f32), so a
 * request may use any dtype in dtype_mask without renegotiating. */
struct moe_limits {
	uint32_t max_tokens;   /* tokens per request */
	uint32_t hidden;       /* elements per token row */
	uint32_t top_k;        /* expert ids per token (immediate + deferred) */
	uint32_t n_slots;      /* request slots in the channel */
	uint32_t ring_entries; /* SQ and CQ entries: power of two >= n_slots (set by sidecar) */
	uint32_t dtype_mask;   /* bit (1 << moe_dtype) per dtype accepted */
};
static_assert(sizeof(struct moe_limits) == 24, "moe_limits is ABI");

/* What the sidecar serves; all zero when it runs without a model. */
struct moe_model_info {
	uint32_t n_layers;     /* transformer blocks */
	uint32_t n_moe_layers; /* blocks with routed experts */
	uint32_t first_moe_layer;
	uint32_t n_experts;  /* routed experts per MoE layer */
	uint32_t top_k;      /* experts per token the model routes to */
	uint32_t hidden;     /* model hidden size */
	uint32_t expert_ffn; /* expert intermediate size */
	uint32_t flags;      /* MOE_MODEL_* (ABI 1.1; 0 from a 1.0 sidecar) */
	char name[64];       /* architecture / model name, NUL-terminated */
	/* Bit l set (byte l / 8, bit l % 8) = block l has routed experts, for l < min(n_layers,
	 * MOE_LAYER_BITMAP_LAYERS). Valid with MOE_MODEL_LAYER_BITMAP. */
	uint8_t moe_layers[MOE_LAYER_BITMAP_LAYERS / 8];
};
#define MOE_MODEL_FINGERPRINT 0x1u  /* moe_welcome.fingerprint is set */
#define MOE_MODEL_LAYER_BITMAP 0x2u /* moe_layers describes every block (n_layers <= 256) */
static_assert(sizeof(struct moe_model_info) == 128, "moe_model_info is ABI");
static_assert(offsetof(struct moe_model_info, moe_layers) == 96, "moe_model_info is ABI");

/* ---- Handshake over the Unix stream socket --------------------------------------------
 * client → sidecar: struct moe_hello (exactly `size` bytes; size >= MOE_HELLO_MIN_SIZE).
 * sidecar → client: struct moe_welcome, with the channel memfd in SCM_RIGHTS iff status==0.
 * The first MOE_WELCOME_FROZEN bytes of a welcome, and the first 16 bytes of a hello, are
 * frozen across ABI majors so that a refusal is always readable by the other side. */
struct moe_hello {
	uint32_t magic;     /* MOE_HELLO_MAGIC */
	uint16_t abi_major; /* MOE_ABI_MAJOR of the client */
	uint16_t abi_minor;
	uint32_t size;          /* sizeof(struct moe_hello) as the client knows it */
	uint32_t flags;         /* MOE_HELLO_* (ABI 1.3); a sidecar refuses bits it does not know */
	struct moe_limits want; /* 0 in a field = the sidecar's default; ring_entries must be 0 */
	char client_name[32];   /* for logs, NUL-terminated */
	uint32_t reserved[14];
};
static_assert(sizeof(struct moe_hello) == 128, "moe_hello is ABI");
/* ABI 1.3: this channel's FORWARDs must be batch-invariant (docs/engines.md): a token's output
 * bits depend on its own row, ids and weights only, never on the rest of the batch. Granted
 * with MOE_WELCOME_BATCH_INVARIANT, else the hello is refused. */
#define MOE_HELLO_BATCH_INVARIANT 0x1u
#define MOE_HELLO_FLAGS_ALL MOE_HELLO_BATCH_INVARIANT
#define MOE_HELLO_MIN_SIZE 16u

#define MOE_REASON_LEN 160
struct moe_welcome {
	uint32_t magic;     /* MOE_WELCOME_MAGIC */
	uint16_t abi_major; /* MOE_ABI_MAJOR of the sidecar */
	uint16_t abi_minor;
	uint32_t size;               /* sizeof(struct moe_welcome) as the sidecar knows it */
	int32_t status;              /* MOE_OK, or why the client is refused */
	char reason[MOE_REASON_LEN]; /* human-readable, NUL-terminated; set on refusal */
	/* --- end of the frozen prefix (176 bytes) --- */
	uint64_t channel_bytes;   /* size of the memfd that comes with this message */
	uint64_t epoch;           /* random; equals the channel header's epoch */
	struct moe_limits limits; /* granted */
	uint32_t sidecar_pid;
	uint32_t flags; /* MOE_WELCOME_* (ABI 1.3; 0 before) */
	struct moe_model_info model;
	/* ABI 1.1: the served model's fingerprint (moe_fingerprint_path), with
	 * MOE_MODEL_FINGERPRINT in model.flags; zero otherwise. */
	uint8_t fingerprint[MOE_FINGERPRINT_BYTES];
	/* ABI 1.3: bytes of the slot pool whose memfd rides as the second SCM_RIGHTS fd (leases,
	 * mapped PROT_READ); 0: the sidecar serves no leases and sends no second fd. */
	uint64_t lease_pool_bytes;
	/* ABI 1.3: bytes of the channel's staging area (BF16 leases), its memfd the third fd;
	 * 0: none (and no third fd). */
	uint64_t lease_staging_bytes;
	/* ABI 1.4: the lease pools whose memfds ride after the channel's, before the staging
	 * area's: one per NUMA node a sidecar splits experts over (pool 0 of lease_pool_bytes,
	 * each other the size of its memfd, sealed), else 1; 0: no leases. To a client of ABI
	 * 1.3 a split sidecar sends pool 0 only (its raw LEASEs are refused, naming why). */
	uint32_t lease_pools;
	uint32_t reserved[7];
};
#define MOE_WELCOME_FROZEN 176u
/* The channel's FORWARDs are batch-invariant (asked in the hello, or every channel of a
 * sidecar started with --batch-invariant). */
#define MOE_WELCOME_BATCH_INVARIANT 0x1u
static_assert(offsetof(struct moe_welcome, channel_bytes) == MOE_WELCOME_FROZEN, "frozen prefix");
static_assert(sizeof(struct moe_welcome) == 416, "moe_welcome is ABI");
static_assert(offsetof(struct moe_welcome, fingerprint) == 352, "moe_welcome is ABI");
static_assert(offsetof(struct moe_welcome, lease_pools) == 384, "moe_welcome is ABI");
static_assert(sizeof(struct moe_lease_slice) == 64, "moe_lease_slice is ABI");

/* ---- Channel layout ------------------------------------------------------------------- */

/* Offsets (bytes from the channel base) of everything in a channel. Derived from limits
 * only, by moe_layout_compute, identically on both sides. */
struct moe_layout {
	uint64_t sq_ctrl, sq_entries; /* submission ring: control block, moe_sqe array */
	uint64_t cq_ctrl, cq_entries; /* completion ring: control block, moe_cqe array */
	uint64_t slots;               /* first slot */
	uint64_t slot_stride;         /* bytes between slots (multiple of MOE_CHANNEL_ALIGN) */
	uint64_t in_off, in_bytes;    /* within a slot: activations, max_tokens*hidden*4 */
	uint64_t ids_off, ids_bytes;  /* int32 expert ids, max_tokens*top_k */
	uint64_t wts_off, wts_bytes;  /* f32 expert weights, max_tokens*top_k */
	uint64_t out_off, out_bytes;  /* output rows, max_tokens*hidden*4 */
	uint64_t total;               /* channel size */
	uint32_t ring_entries;
	uint32_t reserved;
};
static_assert(sizeof(struct moe_layout) == 128, "moe_layout is ABI");

/* Channel states in the header (written by the sidecar only). */
enum moe_channel_state {
	MOE_CHANNEL_RUNNING = 1,
	MOE_CHANNEL_CLOSING = 2, /* sidecar shutting down: no new submissions accepted */
	MOE_CHANNEL_CLOSED = 3,
};

/* First page of a channel. Written by the sidecar before the memfd is sent; afterwards the
 * sidecar only writes heartbeat_ns and state, and never reads any of it back. */
struct moe_channel_header {
	uint64_t magic; /* MOE_CHANNEL_MAGIC */
	uint16_t abi_major;
	uint16_t abi_minor;
	uint32_t header_size;
	uint64_t channel_bytes;
	uint64_t epoch;
	struct moe_limits limits;
	struct moe_layout layout;
	alignas(64) _Atomic uint64_t heartbeat_ns; /* sidecar CLOCK_MONOTONIC, ~every 100 ms */
	_Atomic uint32_t state;                    /* enum moe_channel_state */
	uint32_t reserved[13];
};
static_assert(offsetof(struct moe_channel_header, heartbeat_ns) == 192, "header is ABI");
static_assert(sizeof(struct moe_channel_header) <= MOE_CHANNEL_ALIGN, "header fits a page");

/* Both rings of a channel start at this index (head = tail = start), derived from the
 * random epoch so that real channels exercise the 32-bit wrap-around too. Each side computes
 * it from the epoch it knows privately (the sidecar from its own copy, the client from the
 * welcome); nobody reads the initial indices back from shared memory. */
static inline uint32_t moe_channel_ring_start(uint64_t epoch)
{
	return (uint32_t)(epoch >> 32);
}

/* Submission record: 64 bytes, copied by the sidecar into private memory before any check. */
struct moe_sqe {
	uint64_t user_data;     /* opaque, echoed in the completion */
	uint32_t slot;          /* request slot holding the payload */
	uint16_t op;            /* enum moe_op */
	uint16_t flags;         /* per-op flags (MOE_FWD_*); 0 for PING/ECHO */
	uint32_t n_tokens;      /* rows in the input area */
	uint8_t in_dtype;       /* enum moe_dtype of the input rows */
	uint8_t out_dtype;      /* enum moe_dtype of the output rows */
	uint16_t ids_per_token; /* expert ids per token row (FORWARD); 0 otherwise */
	int32_t layer;          /* FORWARD/PREFETCH: transformer block index */
	uint32_t arg;           /* per-op argument (FORWARD: n deferred ids per token) */
	uint32_t reserved[8];
};
static_assert(sizeof(struct moe_sqe) == 64, "moe_sqe is ABI");

/* Completion record: 32 bytes. status < 0 names the problem; value/index give detail
 * (e.g. MOE_EBADEXPERT: value = the id, index = token*ids_per_token + j). */
struct moe_cqe {
	uint64_t user_data;
	uint32_t slot;
	int32_t status; /* MOE_OK or a request error */
	uint32_t value; /* offending value on error; op-specific result on success */
	uint32_t index; /* where the offending value was */
	uint32_t flags; /* MOE_CQE_* (ABI 1.1; 0 from a 1.0 sidecar) */
	uint32_t reserved;
};
static_assert(sizeof(struct moe_cqe) == 32, "moe_cqe is ABI");
static_assert(offsetof(struct moe_cqe, flags) == 24, "moe_cqe is ABI");

/* The binary expert table (STATS with MOE_STATS_EXPERT_TABLE, ABI 1.2), in the output area:
 * this header, then int32 layer[n_moe_layers] (the MoE layers' block indices, ascending),
 * then at counts_off uint64 counts[n_moe_layers][n_experts] (tokens the CPU side was asked
 * to route to each expert since the sidecar started), then at heat_off float
 * heat[n_moe_layers][n_experts] (the same, exponentially decayed: each token adds 1, halving
 * every half_life_tokens tokens of its layer). Offsets from the start of the header. */
#define MOE_EXPERT_TABLE_MAGIC 0x584f454du /* "MOEX" */
struct moe_expert_table_header {
	uint32_t magic;
	uint32_t header_size; /* sizeof this struct as the sidecar knows it */
	uint32_t n_moe_layers;
	uint32_t n_experts;
	uint32_t half_life_tokens;
	uint32_t reserved0;
	uint64_t counts_off, heat_off;
	uint64_t total_bytes;       /* = the completion's value */
	uint64_t gpu_mask_switches; /* MASK requests that changed a client's mask */
	uint32_t reserved[4];
};
static_assert(sizeof(struct moe_expert_table_header) == 72, "moe_expert_table_header is ABI");

/* ---- Helpers (proto/proto.c) ------------------------------------------------------------ */

/* Checks limits against the hard bounds (all fields set, ring_entries a power of two
 * >= n_slots). Returns MOE_OK, or MOE_EINVAL with a sentence in why. */
int moe_limits_check(const struct moe_limits *lim, char *why, size_t why_len);

/* Computes the channel layout for valid limits. Returns MOE_OK or MOE_EINVAL. */
int moe_layout_compute(const struct moe_limits *lim, struct moe_layout *out);

/* Smallest power of two >= n (n >= 1, n <= 2^31). */
uint32_t moe_pow2_ceil(uint32_t n);

/* A hello of this protocol version from `client_name` (cut to fit), asking for no limit (the
 * sidecar's): what a client sends first, before it sets what it wants. */
void moe_hello_init(struct moe_hello *h, const char *client_name);

/* Parses a hello received from an untrusted peer (len bytes at buf). On MOE_OK, *out holds
 * the hello (shorter, older hellos are zero-extended). On error returns MOE_EPROTO (not a
 * hello) or MOE_EVERSION, with a sentence in why. Never reads past len. */
int moe_hello_parse(const void *buf, size_t len, struct moe_hello *out, char *why, size_t why_len);

/* Parses a welcome from an untrusted sidecar. MOE_OK: *out filled, status may still be a
 * refusal (copied into *out). MOE_EPROTO / MOE_EVERSION with why on a malformed or
 * incompatible message. */
int moe_welcome_parse(const void *buf, size_t len, struct moe_welcome *out, char *why,
                      size_t why_len);

/* Generic checks of a private copy of a submission against the channel limits: slot range,
 * known op, dtypes (for ops that carry rows), n_tokens, reserved fields. Op-specific checks
 * (layer, ids, weights) are the executor's. Returns MOE_OK, or an error with *err filled
 * (status/value/index; user_data and slot copied). */
int moe_sqe_check(const struct moe_sqe *sqe, const struct moe_limits *lim, struct moe_cqe *err);

/* The sentence for an error completion err of sqe (from moe_sqe_check, or an op check with
 * the same conventions) into buf: "FORWARD: ids_per_token 9 not in 1..8 (the channel's
 * top_k)". Returns snprintf's count. */
int moe_sqe_explain(const struct moe_sqe *sqe, const struct moe_limits *lim,
                    const struct moe_cqe *err, char *buf, size_t len);

/* Writes the sentence (printf format) into why (may be NULL) and returns status: the one way
 * the helpers here report an error. */
int moe_fail_with(int status, char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- Model fingerprint (proto/fingerprint.c) ------------------------------------------- */

/* Fingerprint of the model at path (a .gguf file or split, a .safetensors file, a checkpoint
 * directory): names, sizes and sampled contents of its files (the file's comment says which).
 * MOE_OK, or MOE_ESYS / MOE_EINVAL / MOE_ENOMEM with a sentence in why. */
int moe_fingerprint_path(const char *path, uint8_t out[MOE_FINGERPRINT_BYTES], char *why,
                         size_t why_len);
/* 32 lowercase hex digits and a NUL. */
void moe_fingerprint_hex(const uint8_t fp[MOE_FINGERPRINT_BYTES], char hex[33]);

#ifdef __cplusplus
}
#endif
#endif /* MOE_PROTO_H */
