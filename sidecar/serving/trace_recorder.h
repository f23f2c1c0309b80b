/* trace_recorder.h — `serve --record-trace FILE`: the routing the sidecar serves, written as a
 * routing trace (sidecar/residency/trace.h, docs/residency.md) that `moe-sidecar simulate`
 * replays.
 *
 * Owns: a bounded byte ring of FORWARD records, the writer thread that drains it into the
 * file, and a descriptor of the file (its own duplicate of trace_recorder_open's, which the
 * caller closes: `serve` opens the file before the model, the recorder starts after it). The
 * request path only appends a record (a memcpy); formatting and the disk are the writer's. A
 * record that does not fit the ring (the writer is behind) is dropped and counted, and the
 * trace says so in a comment line where it happened — the request path never waits for the
 * disk.
 *
 * Steps: a single-token FORWARD continues the current step while the layers rise (a decode
 * pass over the model is one step); a FORWARD of n > 1 tokens, or one at a layer not above
 * the previous, starts new steps — one per token row. So the replay sees references in the
 * order the sidecar served them, and decode traces look like the generator's.
 * Scores: each id's weight over its row's sum of weights, clamped to [0, 1] (a router's
 * probability among the chosen), so traces are always scored.
 *
 * Whole lines: the writer formats lines into a buffer of its own and writes them with
 * pwrite(2) after the last whole line in the file. A failed write (a full disk, EFBIG, EIO)
 * cuts the file back to that line's end, logs one line and stops the recording: the file
 * always ends with a whole line, and the byte count is what the file holds.
 * Size: the file stops growing before max_bytes (the header and whole lines only): the writer
 * logs one line and drops every later record.
 *
 * Threading: trace_recorder_add and trace_recorder_add_prefetch from any threads (they take
 * turns on a spin flag held for a copy); stats
 * from any thread; destroy after the last add (drains, flushes, joins).
 */
#ifndef MOE_SIDECAR_TRACE_RECORDER_H
#define MOE_SIDECAR_TRACE_RECORDER_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define TRACE_RECORD_MAX_MIB_DEFAULT 1024u

struct trace_recorder_config {
	const char *path; /* for messages */
	int fd;           /* from trace_recorder_open; borrowed: the recorder keeps a duplicate */
	uint64_t max_bytes;
	uint32_t n_layers, n_experts, top_k; /* the header: MoE layers, experts, ids per token */
	uint32_t max_tokens;                 /* rows per FORWARD at most */
};

struct trace_recorder;

/* Opens `path` for recording, before anything slow (the model) is read: created 0600 if
 * absent; refused with a sentence saying what it is when it is a symbolic link (never
 * followed, a dangling one included), not a regular file (a FIFO is never waited on:
 * O_NONBLOCK, then refused), has other hard links, or is owned by another uid (someone else's
 * file: a root sidecar does not overwrite it); locked (flock) so that a second sidecar cannot
 * record into the same file. Not truncated: trace_recorder_create does that when recording
 * starts. The descriptor (close-on-exec; the caller closes it), or -1 with err filled. */
int trace_recorder_open(const char *path, struct sidecar_error *err);

/* Truncates cfg->fd's file, writes the header, starts the writer. 0 or -1 with err filled. */
int trace_recorder_create(const struct trace_recorder_config *cfg, struct trace_recorder **out,
                          struct sidecar_error *err);
/* Drains what is queued, flushes, closes. NULL is a no-op. */
void trace_recorder_destroy(struct trace_recorder *t);

/* One FORWARD at MoE layer `layer`: n_tokens rows of k ids (-1 = skip) and their weights. */
void trace_recorder_add(struct trace_recorder *t, uint32_t layer, uint32_t n_tokens, uint32_t k,
                        const int32_t *ids, const float *weights);

/* A PREFETCH that started loads: the n experts of MoE layer `layer` whose loads it started
 * (written as `p` lines before the next FORWARD's, TRACE_MAX_TOPK ids a line). */
void trace_recorder_add_prefetch(struct trace_recorder *t, uint32_t layer, const uint32_t *ids,
                                 uint32_t n);

struct trace_recorder_stats {
	uint64_t lines, bytes; /* in the file so far (whole lines; bytes = its size) */
	uint64_t dropped;      /* FORWARDs dropped: ring full, or after the cap */
	uint64_t ring_bytes;   /* memory the ring holds */
	int stopped;           /* the cap was reached, or a write failed */
};
void trace_recorder_stats(const struct trace_recorder *t, struct trace_recorder_stats *out);

#endif
