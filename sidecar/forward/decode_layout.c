/* decode_layout.c — resident experts in the layout the decode kernels read fastest.
 *
 * The RESIDENCY and ALL_RESIDENT sources rearrange each expert once, in the memory its bytes
 * were read into (a slot, or the all-resident buffer), before it is used; the MMAP source
 * serves the files' rows as they are. The arrangement is moek_expert_pack's, done in place:
 *   - gate and up units alternate in one range that starts at the gate's bytes — a unit is a
 *     group of 8 rows where the format has the interleaved layout (moek_interleave_supported:
 *     MXFP4, Q8_0, Q4_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, BF16, INT4_G32), else one row — so the
 *     hidden phase reads one ascending range instead of
 *     two (a core streams one range from DRAM faster than two interleaved ones);
 *   - each group of 8 rows of gate, up and down is interleaved where the format has the
 *     layout (its group dot beats the row dot: docs/performance.md, the kernel table).
 * Nothing grows: the expert takes exactly its files' bytes. The result equals the kernels'
 * output over moek_expert_pack of the same expert bit for bit, so every source that
 * rearranges gives the same bits, and serve's results equal the all-resident reference's.
 *
 * The units are moved by following the permutation's cycles with one unit of scratch, each
 * group interleaved as it moves (one pass over gate and up; down's groups go through the
 * scratch in place): a few hundred KiB per node whatever the expert's size, no second copy
 * of an expert.
 *
 * Threading: a decode_scratch belongs to one thread (a residency node's layout thread, which
 * runs the post-load hook off the loader so that the disk's queue stays full, or the creating
 * thread for ALL_RESIDENT).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode_layout.h"

void decode_layout_plan(struct decode_layout *dl, const struct moe_expert *ce,
                        const struct moek_expert *shape, bool on)
{
	memset(dl, 0, sizeof(*dl));
	dl->on = on;
	if (!on)
		return;
	dl->gate_up_rows8 = shape->gate.rows % MOEK_INTERLEAVE == 0;
	dl->down_rows8 = shape->down.rows % MOEK_INTERLEAVE == 0;
	const struct moe_proj_ref *gu = &ce->proj[MOE_PROJ_GATE_UP];
	dl->rows_interleaved = gu->present && gu->order == MOE_GATE_UP_INTERLEAVED;
}

/* Whether a matrix of `format` gets its groups of 8 rows interleaved: per format, since a
 * mix gives each layer (and gate/up and down) formats of their own. */
static bool x8_gate_up(const struct decode_layout *dl, uint32_t format)
{
	return dl->gate_up_rows8 && moek_interleave_supported(format);
}
static bool x8_down(const struct decode_layout *dl, uint32_t format)
{
	return dl->down_rows8 && moek_interleave_supported(format);
}

size_t decode_layout_template(const struct decode_layout *dl, struct moek_expert *v)
{
	if (!dl->on)
		return 0;
	const bool x8 = x8_gate_up(dl, v->gate.format);
	const size_t rb = moek_row_bytes(v->gate.format, v->gate.cols);
	const size_t unit = x8 ? MOEK_INTERLEAVE : 1;
	v->gate.row_stride = v->up.row_stride = 2 * rb;
	v->gate.interleave = v->up.interleave = x8 ? MOEK_INTERLEAVE : 0;
	v->down.row_stride = 0;
	v->down.interleave = x8_down(dl, v->down.format) ? MOEK_INTERLEAVE : 0;
	return unit * rb;
}

int decode_scratch_init(struct decode_scratch *s, const struct moek_expert *shape,
                        struct sidecar_error *err)
{
	/* Rows as wide as F32's, the widest of every format: a mix's layers differ (Q4_K_M's
	 * down is Q6_K in some layers, Q4_K in others), and this is a few hundred KiB at most. */
	const size_t rb_gu = moek_row_bytes(MOEK_F32, shape->gate.cols);
	const size_t rb_down = moek_row_bytes(MOEK_F32, shape->down.cols);
	const size_t most = MOEK_INTERLEAVE * (rb_gu > rb_down ? rb_gu : rb_down);
	const size_t units = 2 * (size_t)shape->gate.rows; /* the most units a range holds */
	s->unit_len = most;
	s->visited_units = units;
	s->unit = malloc(most);
	s->visited = calloc((units + 63) / 64, sizeof(uint64_t));
	if (!s->unit || !s->visited) {
		decode_scratch_free(s);
		error_set(err, MOE_ENOMEM, "decode layout scratch (%zu bytes): out of memory",
		          most);
		return -1;
	}
	return 0;
}

void decode_scratch_free(struct decode_scratch *s)
{
	free(s->unit);
	free(s->visited);
	memset(s, 0, sizeof(*s));
}

/* Where the unit that belongs at position j of the alternating range is now, for n units of
 * each matrix: gate then up ([G | U]: gate unit i at i, up unit i at n + i), or, rows
 * interleaved (one-row units: gate row r at 2r, up row r at 2r + 1) regrouped by 8. */
static size_t unit_source(bool rows_interleaved, size_t j, size_t n)
{
	if (!rows_interleaved)
		return j % 2 ? n + j / 2 : j / 2;
	const size_t g = j / (2 * MOEK_INTERLEAVE), q = j % (2 * MOEK_INTERLEAVE);
	return q < MOEK_INTERLEAVE ? 2 * (MOEK_INTERLEAVE * g + q)
	                           : 2 * (MOEK_INTERLEAVE * g + q - MOEK_INTERLEAVE) + 1;
}

/* A unit's move: a copy, or (group units of an interleaved format) the group interleaved on
 * the way, so that the permutation and the interleaving are one pass over the bytes. */
struct unit_move {
	size_t bytes;
	uint32_t x8_format; /* 0: plain copy */
	size_t cols;
};

static void move_unit(const struct unit_move *m, uint8_t *dst, const uint8_t *src)
{
	if (m->x8_format)
		(void)moek_interleave(m->x8_format, src, 0, MOEK_INTERLEAVE, m->cols, dst);
	else
		memcpy(dst, src, m->bytes);
}

/* Moves the n_units units of base so that position j holds what unit_source says: each cycle
 * of the permutation followed once, through one unit of scratch. */
static void permute_units(struct decode_scratch *s, uint8_t *base, size_t n_units,
                          const struct unit_move *m, bool rows_interleaved)
{
	const size_t half = n_units / 2, b = m->bytes;
	memset(s->visited, 0, (n_units + 63) / 64 * sizeof(uint64_t));
	for (size_t start = 0; start < n_units; start++) {
		if (s->visited[start / 64] >> (start % 64) & 1)
			continue;
		if (unit_source(rows_interleaved, start, half) == start) { /* stays */
			s->visited[start / 64] |= 1ull << (start % 64);
			if (m->x8_format) { /* interleaved in place */
				memcpy(s->unit, base + start * b, b);
				move_unit(m, base + start * b, s->unit);
			}
			continue;
		}
		memcpy(s->unit, base + start * b, b);
		for (size_t j = start;;) {
			s->visited[j / 64] |= 1ull << (j % 64);
			const size_t from = unit_source(rows_interleaved, j, half);
			if (from == start) {
				move_unit(m, base + j * b, s->unit);
				break;
			}
			move_unit(m, base + j * b, base + from * b);
			j = from;
		}
	}
}

/* Interleaves `groups` consecutive groups of 8 rows in place, through the scratch. */
static void interleave_groups(struct decode_scratch *s, uint32_t format, uint8_t *base,
                              size_t groups, size_t cols)
{
	const size_t gb = MOEK_INTERLEAVE * moek_row_bytes(format, cols);
	for (size_t g = 0; g < groups; g++) {
		memcpy(s->unit, base + g * gb, gb);
		(void)moek_interleave(format, s->unit, 0, MOEK_INTERLEAVE, cols, base + g * gb);
	}
}

int decode_layout_apply(const struct decode_layout *dl, struct decode_scratch *s,
                        const struct decode_piece *p, struct sidecar_error *err)
{
	if (!dl->on)
		return 0;
	const size_t rb = moek_row_bytes(p->gate_up_format, p->cols);
	const size_t m = p->rows * rb; /* one matrix's rows here */
	const bool x8 = x8_gate_up(dl, p->gate_up_format), x8d = x8_down(dl, p->down_format);
	const size_t unit = x8 ? MOEK_INTERLEAVE : 1;
	if ((x8 && p->rows % MOEK_INTERLEAVE) || (x8d && p->down_rows % MOEK_INTERLEAVE) ||
	    2 * p->rows > s->visited_units || unit * rb > s->unit_len) {
		error_set(err, MOE_EINVAL,
		          "decode layout: %zu gate/up rows, %zu down rows do not fit the layout's "
		          "groups or its scratch",
		          p->rows, p->down_rows);
		return -1;
	}
	uint8_t *base = p->gate;
	if (!dl->rows_interleaved && p->up != base + m) {
		/* separate extents: up moves down to follow gate (the range then is
		 * [gate, gate + 2m), which ends at or before up's end) */
		if (p->up < base + m || (p->down < p->up + m && p->down + p->down_bytes > base)) {
			error_set(err, MOE_EINVAL,
			          "decode layout: gate, up and down are not in ascending, disjoint "
			          "extents");
			return -1;
		}
		memmove(base + m, p->up, m);
	}
	if (dl->rows_interleaved) { /* one-row units into groups, then the groups interleaved */
		if (unit > 1) {
			const struct unit_move row = {rb, 0, 0};
			permute_units(s, base, 2 * p->rows, &row, true);
			interleave_groups(s, p->gate_up_format, base, 2 * p->rows / unit, p->cols);
		}
	} else { /* [gate | up] to alternating units, each group interleaved as it moves */
		const struct unit_move group = {unit * rb, x8 ? p->gate_up_format : 0u, p->cols};
		permute_units(s, base, 2 * p->rows / unit, &group, false);
	}
	if (x8d)
		interleave_groups(s, p->down_format, p->down, p->down_rows / MOEK_INTERLEAVE,
		                  p->down_cols);
	return 0;
}
