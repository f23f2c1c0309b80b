/* moe_status.h — status codes shared by the wire protocol and the client API.
 *
 * One numbering for both: a completion record carries one of these in its `status`
 * field, and every libmoe_client function returns one. 0 is success; errors are negative.
 * Values are part of the ABI: never renumber, only append.
 */
#ifndef MOE_STATUS_H
#define MOE_STATUS_H

enum moe_status {
	MOE_OK = 0,

	/* Local and connection errors (returned by client calls). */
	MOE_EINVAL = -1,    /* invalid argument to a client call */
	MOE_ENOMEM = -2,    /* out of memory */
	MOE_ESYS = -3,      /* a system call failed; errno holds the cause */
	MOE_ECONNECT = -4,  /* cannot reach the sidecar socket */
	MOE_EVERSION = -5,  /* incompatible protocol version */
	MOE_EREFUSED = -6,  /* the sidecar refused this client (peer check, limits) */
	MOE_EPROTO = -7,    /* the peer broke the protocol */
	MOE_EPEERDEAD = -8, /* the sidecar is gone (socket hang-up) */
	MOE_ETIMEDOUT = -9, /* nothing completed within the timeout */
	MOE_EAGAIN = -10,   /* nothing ready now: no completion, no free slot */

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
	}
	return "unknown status";
}

#endif /* MOE_STATUS_H */
