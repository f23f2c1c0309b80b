/* moe_abi.h — the numbers libmoe_client and moe-sidecar agree on: the protocol version,
 * status codes, activation dtypes, operations and their flags.
 *
 * Public: installed beside moe_client.h, which includes it; compiles as C11 and C++. Values
 * are ABI: never renumber, only append. The wire structs themselves (rings, channel layout,
 * handshake messages) are in moe_proto.h, which is private to the library and the sidecar.
 */
#ifndef MOE_ABI_H
#define MOE_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Protocol version. A different major is refused by both sides; a minor only adds (new ops,
 * new fields carved out of reserved space) and peers of any two minors of one major work
 * together, each using what both know (docs/protocol.md §3). */
#define MOE_ABI_MAJOR 1
#define MOE_ABI_MINOR 4

/* Status codes: one numbering for the client API's return values and a completion's status.
 * 0 is success; errors are negative. */
enum moe_status {
	MOE_OK = 0,

	/* Local and connection errors (returned by client calls). */
	MOE_EINVAL = -1,     /* invalid argument to a client call */
	MOE_ENOMEM = -2,     /* out of memory */
	MOE_ESYS = -3,       /* a system call failed; errno holds the cause */
	MOE_ECONNECT = -4,   /* cannot reach the sidecar socket */
	MOE_EVERSION = -5,   /* incompatible protocol version */
	MOE_EREFUSED = -6,   /* the sidecar refused this client (peer check, limits, model) */
	MOE_EPROTO = -7,     /* the peer broke the protocol */
	MOE_EPEERDEAD = -8,  /* the sidecar is gone (socket hang-up) */
	MOE_ETIMEDOUT = -9,  /* nothing completed within the timeout */
	MOE_EAGAIN = -10,    /* nothing ready now: no completion, no free slot */
	MOE_ESTARTING = -11, /* the sidecar is starting: not serving yet (warm-up) */

	/* Request errors (carried in a completion record, detail in value/index). */
	MOE_EBADOP = -32,     /* unknown operation */
	MOE_EBADSLOT = -33,   /* slot index out of range */
	MOE_ESLOTBUSY = -34,  /* slot already has a request in flight */
	MOE_EBADTOKENS = -35, /* n_tokens is 0 or above the negotiated maximum */
	MOE_EBADDTYPE = -36,  /* unknown or unsupported dtype */
	MOE_EBADLAYER = -37,  /* layer out of range or not an MoE layer */
	MOE_EBADEXPERT = -38, /* expert id out of range, or named twice for one token */
	MOE_EBADWEIGHT = -39, /* expert weight not finite */
	MOE_ENONFINITE = -40, /* NaN or Inf in the activations */
	MOE_EIO = -41,        /* reading an expert from the model files failed */
	MOE_ESHUTDOWN = -42,  /* the sidecar is shutting down */
	MOE_EBADFIELD = -43,  /* reserved field non-zero, or bad flags */
	MOE_ENOMODEL = -44,   /* operation needs a model; the sidecar serves none */
	MOE_EBADTOPK = -45,   /* ids per token is 0 or above the negotiated top-k */
	MOE_EMASKED = -46,    /* expert is on the GPU (masked) for this client */
	MOE_ETOOSMALL = -47,  /* result does not fit the slot's output area */
	MOE_EDEFERRED = -48,  /* a deferred contribution is owed to another layer/batch */
	MOE_EBADLEASE = -49,  /* lease id not held by this channel (ABI 1.3) */
	MOE_ENOLEASE = -50,   /* leases refused: none served, or the channel's bound reached */
};

/* A short, static description of a status code; never NULL. */
static inline const char *moe_status_str(int status)
{
	switch (status) {
	case MOE_OK: return "success";
	case MOE_EINVAL: return "invalid argument";
	case MOE_ENOMEM: return "out of memory";
	case MOE_ESYS: return "system call failed";
	case MOE_ECONNECT: return "cannot connect to the sidecar";
	case MOE_EVERSION: return "incompatible protocol version";
	case MOE_EREFUSED: return "connection refused by the sidecar";
	case MOE_EPROTO: return "protocol violation by the peer";
	case MOE_EPEERDEAD: return "sidecar is gone";
	case MOE_ETIMEDOUT: return "timed out";
	case MOE_EAGAIN: return "nothing ready, try again";
	case MOE_ESTARTING: return "the sidecar is starting";
	case MOE_EBADOP: return "unknown operation";
	case MOE_EBADSLOT: return "slot index out of range";
	case MOE_ESLOTBUSY: return "slot already in flight";
	case MOE_EBADTOKENS: return "token count out of range";
	case MOE_EBADDTYPE: return "unsupported dtype";
	case MOE_EBADLAYER: return "layer out of range";
	case MOE_EBADEXPERT: return "expert id out of range or repeated within a token";
	case MOE_EBADWEIGHT: return "expert weight not finite";
	case MOE_ENONFINITE: return "non-finite activation";
	case MOE_EIO: return "expert read failed";
	case MOE_ESHUTDOWN: return "sidecar shutting down";
	case MOE_EBADFIELD: return "reserved field or flags invalid";
	case MOE_ENOMODEL: return "no model loaded";
	case MOE_EBADTOPK: return "ids per token out of range";
	case MOE_EMASKED: return "expert is GPU-masked";
	case MOE_ETOOSMALL: return "output area too small";
	case MOE_EDEFERRED: return "deferred contribution pending for another layer";
	case MOE_EBADLEASE: return "no such lease on this channel";
	case MOE_ENOLEASE: return "lease refused";
	}
	return "unknown status";
}

/* Activation dtypes (rows of hidden elements in a slot's input and output areas). */
enum moe_dtype { MOE_DTYPE_F32 = 0, MOE_DTYPE_F16 = 1, MOE_DTYPE_BF16 = 2, MOE_DTYPE_COUNT };
#define MOE_DTYPE_MASK_ALL ((1u << MOE_DTYPE_COUNT) - 1u)

/* Bytes per element of a dtype; 0 for an unknown one. */
static inline unsigned moe_dtype_size(unsigned dtype)
{
	return dtype == MOE_DTYPE_F32 ? 4u : dtype < MOE_DTYPE_COUNT ? 2u : 0u;
}

static inline const char *moe_dtype_name(unsigned dtype)
{
	switch (dtype) {
	case MOE_DTYPE_F32: return "f32";
	case MOE_DTYPE_F16: return "f16";
	case MOE_DTYPE_BF16: return "bf16";
	}
	return "?";
}

/* Operations (the payload of each: moe_client.h and docs/protocol.md §10). */
enum moe_op {
	MOE_OP_PING = 1,
	MOE_OP_ECHO = 2,
	MOE_OP_FORWARD = 3,
	MOE_OP_PREFETCH = 4,
	MOE_OP_STATS = 5,
	MOE_OP_MASK = 6,
	MOE_OP_LEASE = 7,   /* ABI 1.3: pin experts of a layer in the shared pool */
	MOE_OP_RELEASE = 8, /* ABI 1.3: let leases go */
	MOE_OP_MAX
};

/* Name of an op ("FORWARD"), or "request" for an unknown one; never NULL. */
static inline const char *moe_op_name(unsigned op)
{
	switch (op) {
	case MOE_OP_PING: return "PING";
	case MOE_OP_ECHO: return "ECHO";
	case MOE_OP_FORWARD: return "FORWARD";
	case MOE_OP_PREFETCH: return "PREFETCH";
	case MOE_OP_STATS: return "STATS";
	case MOE_OP_MASK: return "MASK";
	case MOE_OP_LEASE: return "LEASE";
	case MOE_OP_RELEASE: return "RELEASE";
	}
	return "request";
}

/* FORWARD flags. */
#define MOE_FWD_DROP_DEFERRED 0x0001u /* discard a deferred contribution still owed (abort) */
/* Defer the experts that are not resident first (then the lowest-weighted), so the completion
 * does not wait for their reads: still k_defer entries per token, but which ones depends on
 * the sidecar's residency, so results are no longer bit-reproducible across runs (immediate +
 * deferred = the undeferred sum up to float re-association). */
#define MOE_FWD_DEFER_COLD 0x0002u
/* kt-kernel's deferral rule (its select_deferred_experts), in place of the per-token one: of
 * each token's k entries — ids of no expert (-1) included, ranked by weight like the others —
 * the k - k_defer highest-weighted are protected, and an expert protected for any token of
 * the request is immediate for every token; every other entry is deferred. Not with
 * MOE_FWD_DEFER_COLD. */
#define MOE_FWD_DEFER_UNION 0x0004u
#define MOE_FWD_FLAGS_ALL (MOE_FWD_DROP_DEFERRED | MOE_FWD_DEFER_COLD | MOE_FWD_DEFER_UNION)
/* PREFETCH flags. */
#define MOE_PREFETCH_SCORES 0x0001u /* expert_weights holds one router score per expert */
#define MOE_PREFETCH_FLAGS_ALL MOE_PREFETCH_SCORES
/* STATS flags (ABI 1.2; a 1.1 sidecar refuses them with MOE_EBADFIELD). */
#define MOE_STATS_EXPERTS 0x0001u /* the JSON gains "experts": per-(layer, expert) counts, heat */
/* Instead of JSON, the output is a binary expert table (moe_proto.h: struct
 * moe_expert_table_header, then the counts and heat; value = its bytes). */
#define MOE_STATS_EXPERT_TABLE 0x0002u
#define MOE_STATS_FLAGS_ALL (MOE_STATS_EXPERTS | MOE_STATS_EXPERT_TABLE)

/* Expert leases (ABI 1.3; docs/protocol.md §10, moe_client.h moe_lease). A lease pins one
 * expert of a layer in the sidecar's slot pool, which the client maps read-only; each matrix
 * of it is described here, its bytes at `offset` of that mapping (ABI 1.4: or as slices in
 * several pools, area MOE_LEASE_AREA_SLICES). */
struct moe_lease_matrix {
	uint64_t offset;     /* bytes from the pool mapping's base to row 0 (group 0) */
	uint64_t bytes;      /* the span from offset that holds every row (strides included) */
	uint64_t row_stride; /* bytes between rows (interleave 8: row stride within a group) */
	/* Side data in the pool, at these offsets; UINT64_MAX: none. FP8_E4M3_B128: f32 scale
	 * per 128x128 block, scale_stride floats between block rows; bias: rows f32. */
	uint64_t scales_offset, bias_offset;
	uint32_t format; /* the kernels' enum moek_format: the GGUF type id where there is one
	                    (BF16 30, Q4_K 12, …); FP8_E4M3_B128 1000, INT4_G32 1001 */
	uint32_t rows, cols;
	/* 0: GGUF rows, row r at offset + r * row_stride. 8: rows interleaved in groups of 8
	 * (the sidecar's decode layout): moe_lease_deinterleave gives GGUF rows back. */
	uint32_t interleave;
	uint32_t scale_stride;
	/* MOE_LEASE_AREA_POOL: offsets are into the slot pool's mapping; MOE_LEASE_AREA_STAGING:
	 * into the channel's staging area (a MOE_LEASE_BF16 lease's matrices, BF16 rows) */
	uint32_t area;
};
#define MOE_LEASE_AREA_POOL 0u
#define MOE_LEASE_AREA_STAGING 1u
/* ABI 1.4: the matrix's rows lie in several pools (a sidecar that splits each expert's rows
 * over NUMA nodes, one pool per node): moe_lease_slices gives them, moe_lease_rows copies the
 * whole matrix out of them. format, rows, cols, row_stride, interleave and scale_stride are
 * the whole matrix's; bytes is the slices' bytes together; offset, scales_offset and
 * bias_offset mean nothing (0, UINT64_MAX, UINT64_MAX). */
#define MOE_LEASE_AREA_SLICES 2u
/* ABI 1.4: one slice of a matrix split over pools — rows [row0, row0 + rows), each at the
 * whole matrix's row_stride and layout (row0 and rows multiples of 8 for interleave 8), in
 * pool `pool`'s mapping (moe_lease_pool_at). On the wire a LEASE reply's slice table follows
 * its n struct moe_lease_expert; an AREA_SLICES matrix's offset there is the index of its
 * first slice, the others of the matrix following it in row order (n_slices of them). */
struct moe_lease_slice {
	uint64_t offset;     /* bytes from that pool's base to row row0 (its group) */
	uint64_t bytes;      /* the span from offset holding the slice's rows */
	uint64_t row_stride; /* as the matrix's */
	/* This slice's side data in the same pool (its rows' FP8 block scales from block row
	 * row0 / 128, its rows' biases); UINT64_MAX: none */
	uint64_t scales_offset, bias_offset;
	uint32_t pool; /* 0 .. moe_lease_pool_count - 1 */
	uint32_t row0, rows;
	uint32_t interleave;
	uint32_t scale_stride;
	uint32_t n_slices; /* slices of this matrix */
};
/* Pools a sidecar shares at most (one per NUMA node it splits experts over). */
#define MOE_LEASE_MAX_POOLS 8u
struct moe_lease_expert {
	uint32_t lease; /* the id RELEASE takes (unique within the channel while held) */
	int32_t layer;  /* the block */
	uint32_t expert;
	uint32_t activation;                    /* the kernels' enum moek_activation */
	struct moe_lease_matrix gate, up, down; /* gate, up: rows are intermediate features */
};
/* LEASE flags. BF16: each matrix dequantized to BF16 rows (the kernels' dequantizers) into
 * the channel's staging area (serve --lease-staging-mib), described with area STAGING. */
#define MOE_LEASE_BF16 0x0001u
#define MOE_LEASE_FLAGS_ALL MOE_LEASE_BF16
/* RELEASE flags. */
#define MOE_RELEASE_ALL 0x0001u /* every lease of the channel (no ids) */
#define MOE_RELEASE_FLAGS_ALL MOE_RELEASE_ALL

/* Completion flags (struct moe_cqe.flags, ABI 1.1). */
#define MOE_CQE_MESSAGE 0x0001u /* error: a sentence is at the start of the output area */
/* Longest sentence a completion carries, NUL included. */
#define MOE_MESSAGE_MAX 256u

/* Model fingerprint: 16 bytes, shown as 32 lowercase hex digits (moe_client.h). */
#define MOE_FINGERPRINT_BYTES 16u
/* MoE layers the handshake describes one by one (a bitmap); larger models report their
 * first MoE layer and count only. */
#define MOE_LAYER_BITMAP_LAYERS 256u

#ifdef __cplusplus
}
#endif
#endif /* MOE_ABI_H */
