/* forward_internal.h — what the forward engine's files share: topology, worker pool, weights
 * sources and the engine struct. Not an API: forward.h is.
 *
 * Threading: forward_run and the oracle (forward_oracle_begin) take the engine one at a time
 * (`running` under run_lock, never held across compute or I/O); mask_lock guards the client masks;
 * counters are atomics. The pool's wave description is written by the thread running the request
 * while wave_seq is odd and read by workers once it is even again (pool.c).
 */
#ifndef MOE_FORWARD_INTERNAL_H
#define MOE_FORWARD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "catalog_adapter.h"
#include "fault_hook.h"
#include "forward.h"
#include "moe_kernels.h"
#include "topology.h"
#include "weights.h"

/* ---- pool.c ---- */
/* One expert group of a wave: a prepared moek_ffn_call and the node split of its ranges. */
struct wave_group {
	struct moek_ffn_call call;
	/* Node n's weight rows for the hidden and down phases (call.expert's shape; a per-node
	 * partial view with the sliced residency, else call.expert itself). */
	const struct moek_expert *node_expert[FORWARD_MAX_NODES];
	size_t f_split[FORWARD_MAX_NODES + 1]; /* node n owns intermediate rows [f_split[n], …) */
	size_t o_split[FORWARD_MAX_NODES + 1]; /* and output rows [o_split[n], o_split[n+1]) */
	size_t f_align; /* node split of the intermediate rows (weights are bound along it) */
	size_t h_align; /* finer split of a node's hidden phase among its threads */
};
struct pool_item {
	uint32_t group;
	uint32_t begin, end;
};
struct pool_worker {
	struct forward_pool *pool;
	pthread_t thread;
	uint32_t node, index; /* index: global worker number (call scratch slot) */
	uint32_t local;       /* worker number within its node */
	bool started;
};
/* One item of a pool job: item i of the job, run by worker `worker` (0 .. n_workers - 1). */
typedef void (*pool_job_fn)(void *arg, uint32_t item, uint32_t worker);
struct forward_pool {
	struct forward_topology *topo;
	uint32_t n_workers;
	struct pool_worker *workers; /* n_workers; [0] is the thread calling pool_run_wave */
	/* Wave start: wave_seq moves on by two for each wave (odd while the caller writes the
	 * wave's description, even once it is published) and at stop; a worker spins on it
	 * briefly, then sleeps on it as a futex, counted in wave_sleepers so the caller makes the
	 * wake-up system call only when someone sleeps. */
	_Atomic uint32_t wave_seq, wave_sleepers;
	atomic_bool stopping;
	/* Phase ends: done[ph] counts finished items (all waves, wrapping); a wave's phase is over
	 * when it reaches target[ph]. Waiters spin, then sleep on it (done_sleepers). */
	_Atomic uint32_t done[3], done_sleepers;
	uint32_t target[3];
	/* Workers inside a wave; wave_seq is odd while the caller rewrites the wave, which waits
	 * for active to drop to 0 first. */
	_Atomic uint32_t active;
	/* Workers started: pool_create waits for all (counted in wave_sleepers meanwhile). */
	_Atomic uint32_t checked_in;
	bool in_flight; /* a wave started behind the caller, not yet joined */
	bool ready;     /* threads may have started (pool_destroy stops them) */
	/* The current wave (written before the start, read after it). */
	struct wave_group *groups;
	uint32_t n_groups;
	struct pool_item *items[3][FORWARD_MAX_NODES]; /* per phase, per node */
	uint32_t n_items[3][FORWARD_MAX_NODES];
	atomic_uint next[3][FORWARD_MAX_NODES];
	uint32_t item_capacity;
	/* A job instead of a wave (pool_run_job): its items claimed in the load phase's place by
	 * every worker, the hidden and down phases empty. NULL for a wave. */
	pool_job_fn job;
	void *job_arg;
};
/* Workers a pool over topo runs: every node's threads. */
unsigned pool_worker_count(const struct forward_topology *topo);
int pool_create(struct forward_pool *p, struct forward_topology *topo, uint32_t max_groups,
                struct sidecar_error *err);
void pool_destroy(struct forward_pool *p);
/* Runs load, hidden and down of every group (calls already prepared with n_workers =
 * p->n_workers) on the workers, the caller included, each phase over before the next. */
void pool_run_wave(struct forward_pool *p, struct wave_group *groups, uint32_t n_groups);
/* The same, but with POOL_WAVE_BEHIND and pool_runs_behind (node 0 has a worker besides the
 * caller) the caller takes no part: the wave runs on the other workers while the caller goes
 * on, until pool_wait_wave (which the next start also does). Without, as pool_run_wave. */
enum { POOL_WAVE_BEHIND = 1u };
void pool_start_wave(struct forward_pool *p, struct wave_group *groups, uint32_t n_groups,
                     unsigned flags);
void pool_wait_wave(struct forward_pool *p);
/* Runs fn(arg, i, worker) for i in [0, n_items) on every worker of every node, the caller
 * included, and returns once all are done (a wave left behind is joined first). Called like
 * pool_run_wave: by the thread holding the engine. */
void pool_run_job(struct forward_pool *p, pool_job_fn fn, void *arg, uint32_t n_items);
bool pool_runs_behind(const struct forward_pool *p);
/* How many of the wave's groups (the first ones) a node of `threads` workers runs whole, one
 * worker each for the group's hidden and down rows; the others are cut into one chunk per
 * worker (two in a wave started behind its caller). Groups of equal token counts cost the same, so
 * the first n_groups - n_groups % threads give every worker the same share whole and the rest is
 * split evenly; with unequal counts every group is split (no worker waits for another's large
 * group). Two workers streaming halves of the same small expert lose to each running its own
 * (docs/performance.md). */
uint32_t pool_whole_groups(const struct wave_group *groups, uint32_t n_groups, uint32_t threads);

/* ---- latency histograms (recorded by engine.c, read by stats.c) ---- */
/* Buckets in µs: one per value below 8, then 8 per power of two up to 2^26 µs (67 s; longer
 * lands in the last), so a bucket's upper bound is at most 12.5% above any value in it —
 * percentiles good to one significant figure and a bit, in 1.6 KiB per histogram. */
#define LAT_HIST_SUB 8u
#define LAT_HIST_BUCKETS (LAT_HIST_SUB + 24u * LAT_HIST_SUB)
static inline unsigned lat_hist_bucket(uint64_t us)
{
	if (us < LAT_HIST_SUB)
		return (unsigned)us;
	const unsigned e = 63u - (unsigned)__builtin_clzll(us); /* >= 3 */
	const unsigned b = LAT_HIST_SUB + (e - 3) * LAT_HIST_SUB +
	                   (unsigned)((us >> (e - 3)) & (LAT_HIST_SUB - 1));
	return b < LAT_HIST_BUCKETS ? b : LAT_HIST_BUCKETS - 1;
}
uint64_t lat_hist_upper(unsigned bucket); /* the largest value the bucket holds */

/* ---- the engine (engine.c, plan.c, waves.c, masks.c, stats.c) ---- */
#define HIST_BUCKETS LAT_HIST_BUCKETS
enum {
	LAT_QUEUE = FORWARD_LAT_QUEUE,
	LAT_IO = FORWARD_LAT_IO,
	LAT_COMPUTE = FORWARD_LAT_COMPUTE,
	LAT_TOTAL = FORWARD_LAT_TOTAL,
	LAT_KINDS = FORWARD_LAT_KINDS
};

#define LAYER_COUNTER_ATOMIC(name) atomic_uint_least64_t name;
struct layer_counters {
	FORWARD_LAYER_COUNTERS(LAYER_COUNTER_ATOMIC)
	atomic_uint_least64_t hist[LAT_KINDS][HIST_BUCKETS];
	atomic_uint_least64_t sum_us[LAT_KINDS]; /* the histograms' sums (Prometheus' _sum) */
};

enum group_state { GROUP_PENDING = 0, GROUP_READY, GROUP_RUNNING, GROUP_DONE, GROUP_FAILED };

struct req_group {
	uint32_t expert;
	bool deferred;
	uint32_t first, count; /* slots [first, first+count) of the gathered arrays */
	enum group_state state;
};

/* One request's plan and gathered rows (forward_engine.ctx). */
struct req_ctx {
	uint32_t max_tokens, max_pairs, max_groups;
	uint8_t *pos_kind;             /* [pair position t*k+j]: 0 skip, 1 immediate, 2 deferred */
	uint32_t *pos_slot;            /* [position]: gathered slot */
	uint16_t *tok_order;           /* [t*k + r]: position j of the r-th entry: immediate ones by
	                                  weight, then deferred ones by weight */
	uint16_t *order_tmp;           /* [max_k]: defer_cold's partition */
	uint32_t *tok_n_valid;         /* [t] */
	uint32_t *tok_n_imm;           /* [t] */
	uint32_t *key_count;           /* [n_experts + 1] */
	uint8_t *expert_has_immediate; /* [n_experts] */
	struct req_group *groups;
	struct held_expert *held; /* [group]: its expert as demanded and held */
	struct wave_group *wave;
	uint32_t *wave_group_of; /* wave index → request group */
	uint8_t *xg;             /* gathered input rows, max dtype size */
	float *yg;               /* per-slot outputs */
	float *wg;               /* per-slot weights */
	uint8_t *scratch;
	size_t scratch_bytes;
	uint64_t bytes; /* everything above, allocated (forward_stats.request_bytes) */
};

/* A request's deferred wave left running on the pool after forward_run returned
 * (forward_request.settle_later): settled — joined, its experts let go, its sum written to
 * out_deferred — before the pool's next wave, by forward_settle, or at destroy. */
struct deferred_tail {
	bool pending;
	struct req_ctx *ctx;
	uint32_t n_wave, n_tokens, k;
	float *out_deferred;
};

struct forward_engine {
	const struct moe_catalog *cat;
	struct forward_config cfg;
	struct forward_topology topo;
	struct forward_pool pool;
	struct forward_weights w;
	uint32_t max_tokens, max_k, hidden, last_moe_layer;
	/* One request at a time: `running` under run_lock, waited for on run_free. The lock is
	 * held only to take or give back the engine, never across compute, I/O or the
	 * immediate_ready callback. */
	pthread_mutex_t run_lock;
	pthread_cond_t run_free;
	bool running;
	/* Request plans: ctx[0] for max_tokens x max_k pairs, ctx[1] for decode-sized requests
	 * (ASYNC_MAX_TOKENS). rq is the running request's; a request whose deferred wave is left
	 * running behind it (tail) keeps its ctx until settled, and the next request plans in
	 * the other one meanwhile. */
	uint32_t max_pairs, max_groups; /* ctx[0]'s */
	struct req_ctx ctx[2];
	struct req_ctx *rq;
	struct deferred_tail tail;
	/* Masks (guarded by mask_lock). */
	pthread_mutex_t mask_lock;
	size_t mask_row; /* bytes per transformer block: ceil(n_experts / 8) */
	uint8_t *masks;  /* [FORWARD_MAX_CLIENTS][n_layers * mask_row] */
	bool attached[FORWARD_MAX_CLIENTS];
	uint8_t *res_mask;               /* [n_experts] scratch for weights_set_gpu_mask */
	uint32_t *masked_now;            /* [n_layers]: experts every attached client masks */
	uint64_t mask_switches;          /* forward_set_mask calls that changed a mask */
	struct layer_counters *counters; /* [n_moe_layers] */
	/* validate's duplicate check (engine taken): expert x was named in the token row being
	 * checked iff row_mark[x] == row_stamp. */
	uint32_t *row_mark; /* [n_experts] */
	uint32_t row_stamp;
};

/* Bytes per activation element (enum moek_act_dtype, the wire's moe_dtype numbering). */
static inline size_t dtype_size(unsigned dtype)
{
	return dtype == MOEK_ACT_F32 ? 4 : 2;
}

static inline size_t align_up_64(size_t v)
{
	return (v + 63) & ~(size_t)63;
}

/* plan.c: fills res (status, the offending token/index/expert, the sentence); returns status. */
int plan_fail(struct forward_result *res, int status, int32_t token, int32_t index, int32_t expert,
              const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* plan.c: checks q against the model, the limits and the client's mask; MOE_OK with
 * *moe_layer set, or a failure in res. */
int plan_validate(struct forward_engine *e, const struct forward_request *q,
                  const float *out_deferred, struct forward_result *res, uint32_t *moe_layer);
/* plan.c: plans q into e->rq; returns the number of groups. */
uint32_t plan_request(struct forward_engine *e, const struct forward_request *q,
                      uint32_t moe_layer);
/* plan.c: the per-token sums of the immediate (deferred = false) or deferred part into out. */
void plan_sum(const struct forward_engine *e, const struct req_ctx *c,
              const struct forward_request *q, float *out, bool deferred);
/* waves.c: demands and computes every group of the planned request. */
int waves_execute(struct forward_engine *e, const struct forward_request *q, uint32_t moe_layer,
                  uint32_t n_groups, float *out_imm, struct forward_result *res);
/* waves.c: the tail (a deferred wave left running) joined, its experts let go, and (sum) its
 * sum written; nothing when none is pending. */
void waves_settle(struct forward_engine *e, bool sum);
/* waves.c: a failed demand of group g's expert turned into res's status. */
int waves_demand_failed(struct forward_engine *e, const struct forward_request *q,
                        const struct req_group *g, int rc, struct forward_result *res);
/* Client's mask bit of (block layer, expert). mask_lock held or engine taken. */
static inline bool masks_bit(const struct forward_engine *e, uint32_t client, uint32_t layer,
                             uint32_t expert)
{
	const uint8_t *row =
	    e->masks + ((size_t)client * e->cat->info.n_layers + layer) * e->mask_row;
	return (row[expert / 8] >> (expert % 8)) & 1u;
}

/* ---- the test oracle's access (tests/forward/oracle.c) ---- */
struct forward_oracle_shape {
	uint32_t moe_layer; /* of the request */
	uint32_t hidden;    /* floats per output row */
	uint32_t n_experts; /* per layer */
	size_t x_row_bytes; /* one input row in the request's dtype */
};
/* Takes the engine (as forward_run does, settling a deferred part first) and validates q the
 * way forward_run does. MOE_OK: the caller holds the engine until forward_oracle_end. Else
 * the error, res filled, the engine given back. */
int forward_oracle_begin(struct forward_engine *e, const struct forward_request *q,
                         float *out_deferred, struct forward_result *res,
                         struct forward_oracle_shape *shape);
void forward_oracle_end(struct forward_engine *e);
/* Runs expert x's FFN over c (tokens, inputs, weights, output set by the caller; expert view
 * and scratch set here, cleared on return) on the calling thread, the weights read as
 * forward_run reads them (each residency acquired waiting; a sliced source node by node).
 * MOE_OK, or the error with res filled as forward_run would. */
int forward_oracle_expert(struct forward_engine *e, const struct forward_request *q,
                          uint32_t moe_layer, uint32_t x, struct moek_ffn_call *c,
                          struct forward_result *res);

/* forward_create with a read-fault hook installed in every residency before its first read
 * (fault_hook.h): for tests and the test-hooks daemon only. */
int forward_create_with_fault_hook(struct forward_engine **out, const struct moe_catalog *cat,
                                   const struct forward_config *config, loader_fault_fn hook,
                                   void *hook_arg, struct sidecar_error *err);
/* The same with a populate hook too (residency_create_nodes_held): tests only. */
int forward_create_with_hooks(struct forward_engine **out, const struct moe_catalog *cat,
                              const struct forward_config *config, loader_fault_fn hook,
                              void *hook_arg, loader_populate_fn populate, void *populate_arg,
                              struct sidecar_error *err);

/* Runs a pool job (pool_run_job) on the engine's workers, taking the engine like forward_run
 * (so no request's wave runs meanwhile). */
void forward_run_job(struct forward_engine *e, pool_job_fn fn, void *arg, uint32_t n_items);

#endif
