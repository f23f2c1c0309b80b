/* decode_layout.h — how resident experts are rearranged for the decode kernels.
 *
 * Owns: the plan (per format: which matrices get 8-row groups interleaved), one thread's
 * scratch, and the in-place rearrangement of an expert's (or a node slice's) bytes as read.
 * Threading: a plan is read-only once made; a scratch belongs to one thread (a loader).
 */
#ifndef MOE_FORWARD_DECODE_LAYOUT_H
#define MOE_FORWARD_DECODE_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "moe_kernels.h"

/* How resident experts are rearranged for the decode kernels (decode_layout.c): off for the
 * MMAP source and forward_config.file_layout. A matrix's groups of 8 rows are interleaved
 * where its format has that layout (moek_interleave_supported) and the model's rows come in
 * 8s: decided per format, as a mix changes formats from layer to layer. */
struct decode_layout {
	bool on;
	bool gate_up_rows8, down_rows8; /* the expert's gate/up rows, down rows: multiples of 8 */
	bool rows_interleaved;          /* the file's gate_up alternates rows (gpt-oss) */
};
/* One thread's scratch: one unit (a group of 8 of the widest rows) and a bitmap. */
struct decode_scratch {
	uint8_t *unit;
	size_t unit_len;
	uint64_t *visited;
	size_t visited_units;
};
/* An expert's (or a node slice's) bytes as read: gate rows at gate, up rows at up (separate
 * extents in ascending order, or gate + rows · row bytes in a fused tensor; rows_interleaved:
 * one fused range at gate, up unused), down rows at down. */
struct decode_piece {
	uint8_t *gate, *up, *down;
	size_t rows, cols;           /* gate/up rows held here, hidden size */
	size_t down_rows, down_cols; /* down rows held here, intermediate size */
	size_t down_bytes;
	uint32_t gate_up_format, down_format;
};
/* ce: any expert of the model (the catalog's layout); shape: its kernel view. */
void decode_layout_plan(struct decode_layout *dl, const struct moe_expert *ce,
                        const struct moek_expert *shape, bool on);
int decode_scratch_init(struct decode_scratch *s, const struct moek_expert *shape,
                        struct sidecar_error *err);
void decode_scratch_free(struct decode_scratch *s);
/* Rearranges one piece in place; 0, or -1 with err (extents out of order, rows off the
 * groups). */
int decode_layout_apply(const struct decode_layout *dl, struct decode_scratch *s,
                        const struct decode_piece *p, struct sidecar_error *err);
/* Puts the rearranged expert's strides and interleave into v (an expert template, at open)
 * and returns where up starts in bytes after gate (0: off, the files' rows). */
size_t decode_layout_template(const struct decode_layout *dl, struct moek_expert *v);

#endif
