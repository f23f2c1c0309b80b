/* weights.h — expert weights as the scheduler sees them, whatever their source.
 *
 * Owns: the three sources (RESIDENCY: one residency, with a slot pool and an io_uring loader
 * per NUMA node when the layout slices; ALL_RESIDENT: every expert loaded at create; MMAP: the
 * files mapped), the expert maps the residency loads from (whole experts, or each node's
 * slices), the post-load transforms (Hugging Face MXFP4, INT4 repacking, the decode layout,
 * side data) and the f32 side data (biases, FP8 scales).
 * The engine (engine.c, waves.c, masks.c, stats.c) reaches weights only through the calls under
 * "The scheduler's interface": demand/release, readiness, hints and prefetches, GPU masks, retries
 * and counters, each the same for every source and any node split.
 *
 * Threading: weights_open/close/start_residency on the creating thread; the interface from
 * the thread running a request (and the hint/mask/retry calls from any thread: they go to
 * the residency, which has a lock of its own); counters from any thread.
 */
#ifndef MOE_FORWARD_WEIGHTS_H
#define MOE_FORWARD_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "expert_view.h"
#include "topology.h"

/* Opens a source: ALL_RESIDENT loads everything, MMAP maps the files, RESIDENCY builds the
 * expert maps only — its pools are created and warmed by weights_start_residency. */
int weights_open(struct forward_weights *w, const struct moe_catalog *cat,
                 const struct forward_config *cfg, struct forward_topology *topo,
                 struct sidecar_error *err);
void weights_close(struct forward_weights *w);
/* RESIDENCY: creates the residency (a pool and a loader per node part) under cfg->mem_budget
 * (0: every expert), then warms the pinned layers and (budget 0, not lazy) every expert. */
int weights_start_residency(struct forward_weights *w, const struct forward_config *cfg,
                            struct forward_topology *topo, struct sidecar_error *err);
/* RESIDENCY: the pools' bytes when every expert fits (their slots, aligned). */
uint64_t weights_every_expert_bytes(const struct forward_weights *w);
/* Bytes of (moe_layer, expert) in node part `node`'s map. */
uint64_t weights_res_bytes(const struct forward_weights *w, uint32_t node, uint32_t moe_layer,
                           uint32_t expert);

/* ---- Between the weights files (not for the engine) ------------------------------------ */

/* static_sources.c: reads len bytes at off of fd (path names it in the error). */
int weights_read_exact(int fd, const char *path, void *buf, uint64_t len, uint64_t off,
                       struct sidecar_error *err);
/* static_sources.c: every model file opened read-only (fds[file]), and closed. */
int weights_open_files(const struct moe_catalog *cat, int **fds_out, struct sidecar_error *err);
void weights_close_files(const struct moe_catalog *cat, int *fds);
/* static_sources.c: the side data of every expert as f32 into w->aux (not side_in_slot). */
int static_load_aux(struct forward_weights *w, const int *fds, struct sidecar_error *err);
/* static_sources.c: ALL_RESIDENT's buffer, read and laid out; MMAP's mappings. */
int static_load_all_resident(struct forward_weights *w, const int *fds,
                             const struct forward_config *cfg, struct forward_topology *topo,
                             struct sidecar_error *err);
int static_map_files(struct forward_weights *w, struct sidecar_error *err);
/* node_maps.c: node_map[0..n_nodes), each node's rows of every expert. 0, 1 when the model
 * cannot be sliced (why says why), or -1 (err). */
int node_maps_build(struct forward_weights *w, uint32_t n_nodes, char *why, size_t why_len,
                    struct sidecar_error *err);
void node_maps_free(struct forward_weights *w);

/* ---- The scheduler's interface ---------------------------------------------------------- */

/* How a demand found an expert, counted once per expert: held already (every node's slices),
 * being read (another demand started it), or read by this demand. */
enum weights_found { WEIGHTS_NOT_YET = 0, WEIGHTS_HIT, WEIGHTS_IN_FLIGHT, WEIGHTS_COLD };

/* Demands (moe_layer, h->expert) into h (h zeroed, expert set, before the first demand).
 * wait: block until every node holds its slices; else start what must be read and return.
 * Returns 1 when h holds it (h->view, and sliced h->node_view[], built; h->tp set), 0 when
 * still pending (demand again), or a negative errno: -EPERM GPU-masked, -ESHUTDOWN, -ENOSPC
 * no slot can be freed, -EIO or another read error on some node (weights_error_message says
 * which and why), -EINVAL a view that cannot be built. *found is set (HIT, IN_FLIGHT or COLD)
 * by the one call that counts the demand, and *cold_bytes to the bytes read for it; else
 * WEIGHTS_NOT_YET. Static sources hold every expert: 1 and HIT at once. */
int weights_demand(const struct forward_weights *w, uint32_t moe_layer, struct held_expert *h,
                   bool wait, enum weights_found *found, uint64_t *cold_bytes,
                   struct sidecar_error *err);
/* How the demands of a layer found their experts (counted once per expert). */
struct weights_demand_counts {
	uint32_t hits, inflight_misses, cold_misses;
	uint64_t bytes_read;
};
/* One layer's demand, without waiting: every held[i] still pending, those resident or loading
 * first, then the cold ones (a cold read never evicts an expert the same request is about to
 * use), each as weights_demand does; those now held get pending = false and count in *ready.
 * *cursor (0 at first) is where the walk stands: it returns 0 at the end, or at the first
 * failure that failure's negative errno (as weights_demand), with held[(*cursor - 1) % n] the
 * expert that failed; calling again resumes after it. counts gathers how experts were found. */
int weights_demand_layer(const struct forward_weights *w, uint32_t moe_layer,
                         struct held_expert *held, uint32_t n, uint32_t *cursor, uint32_t *ready,
                         struct weights_demand_counts *counts, struct sidecar_error *err);
/* Lets go of held[which[i]] (which NULL: held[0, n)) where a reference is held. */
void weights_release_layer(const struct forward_weights *w, struct held_expert *held,
                           const uint32_t *which, uint32_t n);
/* True if computing every valid id of ids[0, n) (the peer's memory: read once each) in
 * moe_layer now needs no read (weights_ready for each): the inline decision. */
bool weights_layer_ready(const struct forward_weights *w, uint32_t moe_layer, const int32_t *ids,
                         size_t n);
/* The last read error of (moe_layer, expert), naming the node whose slice failed, as a
 * sentence ("" when none). */
void weights_error_message(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                           char *buf, size_t len);
/* True if computing (moe_layer, expert) now needs no read: RESIDENT (RESIDENCY),
 * always (ALL_RESIDENT), never (MMAP: a page fault may read). */
bool weights_ready(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert);
/* A hint (the expert will be needed: keep it) and a prefetch (start reading it) at priority
 * pri. weights_prefetch returns true if a read started. No-ops for the static sources. */
void weights_hint(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert, float pri);
bool weights_prefetch(const struct forward_weights *w, uint32_t moe_layer, uint32_t expert,
                      float pri);
/* The GPU mask of one MoE layer (mask[x] != 0: the engine computes x itself). */
void weights_set_gpu_mask(const struct forward_weights *w, uint32_t moe_layer, const uint8_t *mask);
/* Every FAILED expert is read again by its next demand; returns how many there were. */
uint32_t weights_retry_failed(const struct forward_weights *w);
/* Adds the sources' figures to out (resident, pool and budget bytes, slots, evictions,
 * loader reads, prefetches, failures, pool pages). */
void weights_counters(const struct forward_weights *w, struct forward_stats *out);
/* One node part's residency counters; -1 when the source has no residency part there. */
int weights_node_counters(const struct forward_weights *w, uint32_t node,
                          struct residency_counters *out);

#endif
