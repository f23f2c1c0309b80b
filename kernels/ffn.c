/* ffn.c — the expert FFN: validation, scratch layout, the three phases.
 *
 * out[t] += w[t] * (down · act(gate · x[t] + b_g, up · x[t] + b_u) + b_d)
 *
 * Phases (the caller may split each across workers, with a barrier between phases):
 *   load   — tokens' activations to f32 (zero-padded to 8; prefill: into 16-token panels) and,
 *            for the ISA's decode dot products, converted once per token into their activation
 *            format (Q8_0, Q8_K, or bf16 for 16-bit float weights);
 *   hidden — rows of gate/up: h[t][f] for every token (any split: moek_ffn_hidden_align);
 *   down   — rows of down: out[t][o] += w[t] * (down[o] · h[t] + b_d[o]); in decode each
 *            worker first quantizes all of h for its dot products into its own scratch (a
 *            few thousand elements per token, against ffn x hidden weights); one token goes
 *            through the ISA's many-row dot where it has one (same bits, less per-row cost).
 * Every output element is produced by exactly one worker from inputs that do not depend on
 * the split, with a fixed summation order, so results are bit-identical for any split.
 *
 * Two compute shapes: decode (few tokens) takes one weight row at a time through the ISA's
 * dot product — memory-bound, weights stream once; prefill (n >= MOEK_PREFILL_MIN_TOKENS, 8
 * for float weights in GGUF rows, on an ISA with a tile kernel) dequantizes a TILE_ROWS x KC weight
 * tile to f32 once and runs it against a chunk of TC tokens kept as panels of PANEL tokens
 * ([k][PANEL]: an outer-product micro-kernel, weights broadcast, tokens in vector lanes) —
 * compute-bound, no horizontal sums. Interleaved integer formats (Q8_0, Q4_K, MXFP4 in groups
 * of 8) take no f32 or avx512 tiles: their group dots over quantized activations, 8 tokens per
 * call, blocked so that the weights and activations in use stay in L2, beat dequantizing at
 * any token count (docs/performance.md) — the activations are then quantized as in decode,
 * as ggml's quantized mat-mul does (on avx512: 1.1–1.5x the bf16 tiles). AMX's tiles are
 * faster than those dots from a few dozen tokens, and take them from there
 * (ops->tile_bf16_int_groups).
 * Where the ISA has bf16 tiles (ops->tile_bf16: avx512's vdpbf16ps, AMX), every format but F32
 * and FP8 takes them from the ISA's per-format count (tile_bf16_from): x and h are rounded to
 * bf16 once into pair panels (pair_at: two k of a token per 32-bit word), and TILE_ROWS whole
 * rows of weights are dequantized to bf16 once per call, then run against every chunk of
 * TC_BF16 tokens.
 *
 * No allocation, no locks, no getenv. The ISA is isa.c's active one, taken at prepare.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kernels_internal.h"

enum {
	TILE_ROWS = 12, /* prefill weight-tile rows (2 groups of the 6-row micro-kernel) */
	KC = 256,       /* prefill tile columns: a multiple of every block size (and of 128) */
	TC = 128,       /* prefill token chunk of the f32 tiles: TC / PANEL panels */
	TC_BF16 = 256,  /* the bf16 tiles' (twice the work per dequantized weight) */
	TC_MAX = TC_BF16,
	PANEL = 16, /* prefill tokens per activation panel (two 8-lane vectors) */
};

/* ---- Validation ----------------------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t len, const char *fmt, ...)
{
	if (err && len) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, len, fmt, ap);
		va_end(ap);
	}
	return -1;
}

static size_t fp8_blocks(size_t n)
{
	return (n + MOEK_FP8_BLOCK - 1) / MOEK_FP8_BLOCK;
}

static size_t row_stride(const struct moek_matrix *m)
{
	return m->row_stride ? m->row_stride : moek_row_bytes(m->format, m->cols);
}

static size_t scale_stride(const struct moek_matrix *m)
{
	return m->scale_stride ? m->scale_stride : fp8_blocks(m->cols);
}

static int check_matrix(const struct moek_matrix *m, const char *name, char *err, size_t len)
{
	const struct moek_format_info *f = moek_format_lookup(m->format);
	if (!f || !f->weight_format)
		return fail(err, len, "expert %s: format %u is not a weight format", name,
		            m->format);
	if (m->rows == 0 || m->cols == 0)
		return fail(err, len, "expert %s: empty matrix %u x %u", name, m->rows, m->cols);
	if (m->cols % f->block_elems)
		return fail(err, len, "expert %s: %u columns not a multiple of the %s block (%u)",
		            name, m->cols, f->name, f->block_elems);
	if (!m->data)
		return fail(err, len, "expert %s: no weight data", name);
	if (m->row0 >= m->rows)
		return fail(err, len, "expert %s: first present row %u beyond the %u rows", name,
		            m->row0, m->rows);
	const size_t align = f->align;
	if ((uintptr_t)m->data % align || row_stride(m) % align)
		return fail(err, len, "expert %s: data or row stride not %zu-byte aligned", name,
		            align);
	if (row_stride(m) < moek_row_bytes(m->format, m->cols))
		return fail(err, len, "expert %s: row stride %zu < row bytes %zu", name,
		            row_stride(m), moek_row_bytes(m->format, m->cols));
	if (m->interleave &&
	    (m->interleave != MOEK_INTERLEAVE || !moek_interleave_supported(m->format) ||
	     m->rows % MOEK_INTERLEAVE || m->row0 % MOEK_INTERLEAVE))
		return fail(
		    err, len,
		    "expert %s: interleave %u needs MXFP4, NVFP4, Q8_0, Q4_K, Q2_K, Q3_K, IQ4_NL, "
		    "IQ4_XS, "
		    "BF16 or INT4_G32 with rows and first row multiples of %u (format %s, %u rows "
		    "from %u)",
		    name, m->interleave, MOEK_INTERLEAVE, f->name, m->rows, m->row0);
	if (m->interleave && m->cols % moek_x8_block(m->format, NULL))
		return fail(err, len,
		            "expert %s: interleaved %s columns come in units of %zu, not %u", name,
		            f->name, moek_x8_block(m->format, NULL), m->cols);
	if (f->scale_block) {
		if (!m->scales)
			return fail(err, len, "expert %s: FP8 weights without block scales", name);
		if (scale_stride(m) < fp8_blocks(m->cols))
			return fail(err, len, "expert %s: scale stride %zu < %zu blocks", name,
			            scale_stride(m), fp8_blocks(m->cols));
	} else if (m->scales) {
		return fail(err, len, "expert %s: block scales given for a non-FP8 format", name);
	}
	if (m->tensor_scale != 0.0f && !(m->tensor_scale > 0.0f && m->tensor_scale < INFINITY))
		return fail(err, len, "expert %s: tensor scale %g is not finite and positive", name,
		            (double)m->tensor_scale);
	return 0;
}

int moek_expert_check(const struct moek_expert *e, char *err, size_t len)
{
	if (!e)
		return fail(err, len, "expert: NULL");
	if (check_matrix(&e->gate, "gate", err, len) || check_matrix(&e->up, "up", err, len) ||
	    check_matrix(&e->down, "down", err, len))
		return -1;
	if (e->gate.format != e->up.format || e->gate.rows != e->up.rows ||
	    e->gate.cols != e->up.cols || e->gate.interleave != e->up.interleave)
		return fail(err, len,
		            "expert: gate and up differ in format, shape or layout (%ux%u vs "
		            "%ux%u, interleave %u vs %u)",
		            e->gate.rows, e->gate.cols, e->up.rows, e->up.cols, e->gate.interleave,
		            e->up.interleave);
	if (e->down.cols != e->gate.rows)
		return fail(err, len, "expert: down has %u columns, gate has %u rows", e->down.cols,
		            e->gate.rows);
	if (e->down.rows != e->gate.cols)
		return fail(err, len, "expert: down has %u rows, hidden size is %u", e->down.rows,
		            e->gate.cols);
	if (e->activation == MOEK_SWIGLU_OAI) {
		if (!(e->limit > 0.0f) || !isfinite(e->limit) || !isfinite(e->alpha))
			return fail(
			    err, len,
			    "expert: clamped SwiGLU needs finite limit > 0 and alpha (%g, %g)",
			    (double)e->limit, (double)e->alpha);
	} else if (e->activation != MOEK_SWIGLU) {
		return fail(err, len, "expert: activation %d unknown", (int)e->activation);
	}
	return 0;
}

size_t moek_expert_split_align(const struct moek_expert *e)
{
	size_t align = 1;
	const struct moek_format_traits *gate = moek_format_traits(e->gate.format);
	const struct moek_format_traits *down = moek_format_traits(e->down.format);
	const struct moek_format_info *act =
	    moek_format_lookup(moek_vec_dot_format(e->down.format));
	if (down && down->info.block_elems > align)
		align = down->info.block_elems;
	if (act && act->block_elems > align)
		align = act->block_elems;
	/* side scales: a slice starts on a scale block of gate's rows and of down's columns */
	if (gate && gate->info.scale_block > align)
		align = gate->info.scale_block;
	if (down && down->info.scale_block > align)
		align = down->info.scale_block;
	/* down formats whose SIMD activations come in pairs of 32-blocks (MOEK_ACT_Q8_0X2) */
	if (down && down->down_split_align > align)
		align = down->down_split_align;
	/* interleaved gate/up rows: a slice holds whole groups (every value above is a power
	 * of two, so one of at least 8 is a multiple of 8) */
	if (e->gate.interleave && align < MOEK_INTERLEAVE)
		align = MOEK_INTERLEAVE;
	/* interleaved down: a column slice starts on a unit of the layout (BF16: 16 columns) */
	if (e->down.interleave && align < moek_x8_block(e->down.format, NULL))
		align = moek_x8_block(e->down.format, NULL);
	return align;
}

int moek_expert_slice(const struct moek_expert *full, size_t f_begin, size_t f_end,
                      struct moek_expert *slice, char *err, size_t len)
{
	if (moek_expert_check(full, err, len))
		return -1;
	if (full->gate.row0 || full->up.row0 || full->down.row0)
		return fail(err, len,
		            "expert slice: a partial matrix (first row %u/%u/%u) cannot be sliced",
		            full->gate.row0, full->up.row0, full->down.row0);
	const size_t ffn = full->gate.rows, align = moek_expert_split_align(full);
	if (f_begin >= f_end || f_end > ffn)
		return fail(err, len, "expert slice: range [%zu, %zu) outside the %zu features",
		            f_begin, f_end, ffn);
	if (f_begin % align || (f_end % align && f_end != ffn))
		return fail(err, len, "expert slice: range [%zu, %zu) not aligned to %zu", f_begin,
		            f_end, align);
	*slice = *full;
	struct moek_matrix *mats[2] = {&slice->gate, &slice->up};
	for (int i = 0; i < 2; i++) {
		struct moek_matrix *m = mats[i];
		m->row_stride = row_stride(m);
		m->data = (const uint8_t *)m->data + f_begin * m->row_stride;
		m->rows = (uint32_t)(f_end - f_begin);
		if (m->scales) {
			m->scale_stride = scale_stride(m);
			m->scales += f_begin / MOEK_FP8_BLOCK * m->scale_stride;
		}
		if (m->bias)
			m->bias += f_begin;
	}
	struct moek_matrix *d = &slice->down; /* strides first: they depend on the full cols */
	d->row_stride = row_stride(d);
	if (d->scales) {
		d->scale_stride = scale_stride(d);
		d->scales += f_begin / MOEK_FP8_BLOCK;
	}
	/* an interleaved group stores its 8 rows' column blocks together */
	d->data = (const uint8_t *)d->data +
	          moek_row_bytes(d->format, f_begin) * (d->interleave ? d->interleave : 1);
	d->cols = (uint32_t)(f_end - f_begin);
	return 0;
}

/* ---- Scratch layout ------------------------------------------------------------------------- */

static size_t round_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

/* Activation format a matrix is fed with on this ISA in this shape: the format of the ISA's
 * dot product for it in decode (Q8_0, Q8_K, bf16, or a private one; interleaved rows: the
 * group dot's), f32 otherwise (prefill tiles, and the scalar reference). */
static uint32_t act_format(const struct moek_isa_ops *ops, const struct moek_matrix *m,
                           enum moek_fmt f, bool prefill)
{
	const bool has_dot = m->interleave ? ops->dot_x8[f] != NULL : ops->dot[f] != NULL;
	if (prefill || !has_dot)
		return MOEK_F32;
	return moek_isa_act_fmt(ops, f, m->interleave != 0);
}

/* Fills c->plan (except base) and returns the scratch bytes needed (invariant: for a
 * batch-invariant call, which never takes the tiles). */
static size_t layout(const struct moek_expert *e, size_t n, unsigned n_workers,
                     const struct moek_isa_ops *ops, bool invariant, struct moek_ffn_call *c)
{
	c->plan.isa = ops;
	/* the formats' table indices, once: the phases index the ops tables with them */
	const enum moek_fmt gate_fmt = moek_fmt_index(e->gate.format);
	const enum moek_fmt down_fmt = moek_fmt_index(e->down.format);
	c->plan.gate_fmt = (uint8_t)gate_fmt;
	c->plan.down_fmt = (uint8_t)down_fmt;
	c->plan.hidden = e->gate.cols;
	c->plan.ffn = e->gate.rows;
	const uint32_t gate_act = moek_formats[gate_fmt].vec_dot_format;
	const bool integer_dot = gate_act == MOEK_Q8_0 || gate_act == MOEK_Q8_K;
	/* interleaved float rows have a group dot that keeps 8 tokens' sums in registers: below
	 * 16 tokens it beats dequantizing tiles, as the integer dots do */
	const bool group_dot = e->gate.interleave && ops->dot_x8[gate_fmt];
	/* integer group dots in every phase: no tiles at any token count (the header) */
	const uint32_t down_act = moek_formats[down_fmt].vec_dot_format;
	/* not NVFP4's: its group dot takes the sign trick per sub-block (no offset form), and from
	 * 16 tokens the tiles beat it 2.5x (bench_kernels, docs/formats.md) */
	const bool integer_groups = group_dot && integer_dot && e->down.interleave &&
	                            ops->dot_x8[down_fmt] &&
	                            (down_act == MOEK_Q8_0 || down_act == MOEK_Q8_K) &&
	                            gate_fmt != MOEK_FMT_NVFP4 && down_fmt != MOEK_FMT_NVFP4;
	/* the ISA's bf16 tiles, where it has them, from their own token count */
	const bool bf16_gate = ops->tile_bf16 && moek_tile_bf16_takes(e->gate.format);
	const size_t min_tokens = bf16_gate ? ops->tile_bf16_from[e->gate.interleave != 0][gate_fmt]
	                          : integer_dot || group_dot ? MOEK_PREFILL_MIN_TOKENS
	                                                     : MOEK_PREFILL_MIN_TOKENS_FLOAT;
	c->plan.prefill = ops->prefill &&
	                  (!integer_groups || (bf16_gate && ops->tile_bf16_int_groups)) &&
	                  n >= min_tokens && !invariant;
	c->plan.x_bf16 = c->plan.prefill && bf16_gate;
	c->plan.h_bf16 = c->plan.prefill && ops->tile_bf16 && moek_tile_bf16_takes(e->down.format);
	/* bf16 panels hold k in pairs and the tiles take k in multiples of 32 */
	c->plan.x_pad = round_up(c->plan.hidden, c->plan.x_bf16 ? 32 : 8);
	c->plan.h_pad = round_up(c->plan.ffn, c->plan.h_bf16 ? 32 : 8);
	c->plan.xq_format = act_format(ops, &e->gate, gate_fmt, c->plan.prefill);
	c->plan.hq_format = act_format(ops, &e->down, down_fmt, c->plan.prefill);
	c->plan.xq_row =
	    c->plan.xq_format == MOEK_F32
	        ? 0
	        : round_up(moek_isa_act_row_bytes(ops, c->plan.xq_format, c->plan.hidden), 64);
	c->plan.hq_row =
	    c->plan.hq_format == MOEK_F32
	        ? 0
	        : round_up(moek_isa_act_row_bytes(ops, c->plan.hq_format, c->plan.ffn), 64);
	/* prefill keeps x and h as panels of PANEL tokens ([k][PANEL], padded with zero tokens) */
	const size_t n_rows = c->plan.prefill ? round_up(n, PANEL) : n;
	size_t off = round_up(n_rows * c->plan.x_pad * sizeof(float), 64);
	c->plan.xq_off = off;
	off += n * c->plan.xq_row;
	c->plan.hf_off = off;
	off += round_up(n_rows * c->plan.h_pad * sizeof(float), 64);
	c->plan.worker_off = off;
	/* worker area: a row buffer (f32, then its bf16 copy), then the prefill tiles or
	 * (decode) the worker's own copy of h quantized for down (hq_off: bytes into the area) */
	const size_t row_buf = (c->plan.x_pad > c->plan.h_pad ? c->plan.x_pad : c->plan.h_pad);
	c->plan.hq_off = round_up(row_buf * (sizeof(float) + sizeof(uint16_t)), 64);
	/* bf16 tiles: two of TILE_ROWS whole rows (row_bf16: the widest padded row) */
	c->plan.row_bf16 = c->plan.x_bf16 || c->plan.h_bf16 ? row_buf : 0;
	const size_t tiles = (TILE_ROWS * KC + 2 * TILE_ROWS * TC_MAX) * sizeof(float) +
	                     2 * TILE_ROWS * c->plan.row_bf16 * sizeof(uint16_t);
	/* a batch-invariant call of more than 8 tokens: its down workers quantize h 8 tokens at a
	 * time, as they go */
	const size_t hq = (invariant && n > MOEK_DOT_TOKENS ? MOEK_DOT_TOKENS : n) * c->plan.hq_row;
	c->plan.worker_bytes = round_up(c->plan.hq_off + (tiles > hq ? tiles : hq), 64);
	off += (n_workers ? n_workers : 1) * c->plan.worker_bytes;
	return off + 64; /* room to align the caller's pointer */
}

enum moek_ffn_path moek_ffn_call_path(const struct moek_ffn_call *c)
{
	if (c->plan.prefill)
		return c->plan.x_bf16 ? MOEK_PATH_TILES_BF16 : MOEK_PATH_TILES_F32;
	return c->expert->gate.interleave ? MOEK_PATH_GROUPS : MOEK_PATH_DOTS;
}

size_t moek_ffn_scratch_bytes(const struct moek_expert *e, size_t n_tokens, unsigned n_workers)
{
	if (moek_expert_check(e, NULL, 0) || n_tokens > MOEK_MAX_TOKENS ||
	    n_workers > MOEK_MAX_WORKERS)
		return 0;
	struct moek_ffn_call c;
	const size_t plain = layout(e, n_tokens, n_workers, moek_isa_current(), false, &c);
	const size_t invariant = layout(e, n_tokens, n_workers, moek_isa_current(), true, &c);
	return plain > invariant ? plain : invariant;
}

static void clear_panel_token(const struct moek_ffn_call *c, size_t t);

int moek_ffn_prepare(struct moek_ffn_call *c, char *err, size_t len)
{
	if (moek_expert_check(c->expert, err, len))
		return -1;
	const struct moek_expert *e = c->expert;
	const size_t hidden = e->gate.cols;
	if (c->n_tokens && (!c->x || !c->out))
		return fail(err, len, "ffn call: missing activations or output");
	if (c->x_dtype > MOEK_ACT_BF16)
		return fail(err, len, "ffn call: activation dtype %u unknown", c->x_dtype);
	if (c->x_stride && c->x_stride < hidden)
		return fail(err, len, "ffn call: x stride %zu < hidden size %zu", c->x_stride,
		            hidden);
	if (c->out_stride && c->out_stride < hidden)
		return fail(err, len, "ffn call: out stride %zu < hidden size %zu", c->out_stride,
		            hidden);
	if (c->n_workers == 0)
		return fail(err, len, "ffn call: n_workers must be >= 1");
	if (c->n_tokens > MOEK_MAX_TOKENS || c->n_workers > MOEK_MAX_WORKERS)
		return fail(err, len,
		            "ffn call: %zu tokens / %u workers beyond the limits (%u / %u)",
		            c->n_tokens, c->n_workers, MOEK_MAX_TOKENS, MOEK_MAX_WORKERS);
	const size_t need =
	    layout(e, c->n_tokens, c->n_workers, moek_isa_current(), c->batch_invariant, c);
	if (!c->scratch || c->scratch_bytes < need)
		return fail(err, len, "ffn call: scratch has %zu bytes, needs %zu",
		            c->scratch ? c->scratch_bytes : 0, need);
	c->plan.base = (char *)round_up((uintptr_t)c->scratch, 64);
	if (c->plan.prefill) /* the padding tokens of the last panel: zero, never written */
		for (size_t t = c->n_tokens; t < round_up(c->n_tokens, PANEL); t++)
			clear_panel_token(c, t);
	return 0;
}

/* ---- Phase helpers ------------------------------------------------------------------------ */

static inline const struct moek_isa_ops *plan_ops(const struct moek_ffn_call *c)
{
	return c->plan.isa;
}
static inline float *x32_row(const struct moek_ffn_call *c, size_t t)
{
	return (float *)c->plan.base + t * c->plan.x_pad;
}
static inline void *xq_row(const struct moek_ffn_call *c, size_t t)
{
	return c->plan.base + c->plan.xq_off + t * c->plan.xq_row;
}
static inline float *h32_row(const struct moek_ffn_call *c, size_t t)
{
	return (float *)(c->plan.base + c->plan.hf_off) + t * c->plan.h_pad;
}
/* Prefill panels: token t's element k at panel(t / PANEL)[k * PANEL + t % PANEL]. */
static inline float *x_panel(const struct moek_ffn_call *c, size_t p)
{
	return (float *)c->plan.base + p * c->plan.x_pad * PANEL;
}
static inline float *h_panel(const struct moek_ffn_call *c, size_t p)
{
	return (float *)(c->plan.base + c->plan.hf_off) + p * c->plan.h_pad * PANEL;
}
/* The bf16 pair panels of the bf16 tiles (moek_tile_bf16_fn): token t's element k at
 * panel(t / PANEL)[pair_at(k, t % PANEL)], in the same scratch as the f32 panels. */
static inline uint16_t *x_panel16(const struct moek_ffn_call *c, size_t p)
{
	return (uint16_t *)c->plan.base + p * c->plan.x_pad * PANEL;
}
static inline uint16_t *h_panel16(const struct moek_ffn_call *c, size_t p)
{
	return (uint16_t *)(c->plan.base + c->plan.hf_off) + p * c->plan.h_pad * PANEL;
}
static inline size_t pair_at(size_t k, size_t j)
{
	return k / 2 * 2 * PANEL + j * 2 + k % 2;
}
/* Zeroes elements [k0, k1) of token t in an f32 or a bf16 pair panel. */
static void clear_panel_rows(float *f32, uint16_t *b16, bool bf16, size_t t, size_t k0, size_t k1)
{
	for (size_t k = k0; k < k1; k++)
		if (bf16)
			b16[pair_at(k, t % PANEL)] = 0;
		else
			f32[k * PANEL + t % PANEL] = 0.0f;
}
static void clear_panel_token(const struct moek_ffn_call *c, size_t t)
{
	const size_t p = t / PANEL;
	clear_panel_rows(x_panel(c, p), x_panel16(c, p), c->plan.x_bf16, t, 0, c->plan.x_pad);
	clear_panel_rows(h_panel(c, p), h_panel16(c, p), c->plan.h_bf16, t, 0, c->plan.h_pad);
}
static inline float *worker_area(const struct moek_ffn_call *c, unsigned worker)
{
	assert(worker < c->n_workers);
	return (float *)(c->plan.base + c->plan.worker_off + worker * c->plan.worker_bytes);
}
/* Token t's h in down's activation format: each down worker's own copy (decode only). */
static inline void *hq_row(const struct moek_ffn_call *c, unsigned worker, size_t t)
{
	return (char *)worker_area(c, worker) + c->plan.hq_off + t * c->plan.hq_row;
}
static inline size_t token_row(const struct moek_ffn_call *c, size_t t)
{
	return c->token_ids ? c->token_ids[t] : t;
}
/* Global row r of m (present: r >= m->row0). */
static inline const uint8_t *matrix_row(const struct moek_matrix *m, size_t r)
{
	assert(r >= m->row0 && r < m->rows);
	return (const uint8_t *)m->data + (r - m->row0) * row_stride(m);
}
static inline const float *matrix_scale_row(const struct moek_matrix *m, size_t r)
{
	return m->scales ? m->scales + r / MOEK_FP8_BLOCK * scale_stride(m) : NULL;
}
/* The group of interleaved rows holding global row r (present). */
static inline const uint8_t *matrix_group(const struct moek_matrix *m, size_t r)
{
	assert(m->interleave && r >= m->row0 && r < m->rows);
	return (const uint8_t *)m->data +
	       (r - m->row0) / MOEK_INTERLEAVE * MOEK_INTERLEAVE * row_stride(m);
}
/* Columns [k0, k0 + n) of global row r of m as f32, whatever its layout. */
static void dequantize_matrix_row(const struct moek_isa_ops *ops, const struct moek_matrix *m,
                                  enum moek_fmt f, size_t r, size_t k0, size_t n, float *dst)
{
	if (m->interleave && f == MOEK_FMT_BF16) { /* its pairs hold the values themselves */
		moek_x8_bf16_row(matrix_group(m, r), r % MOEK_INTERLEAVE, k0, n, dst);
		return;
	}
	if (m->interleave) { /* through GGUF blocks on the stack, KC columns at a time */
		uint8_t blocks[KC / 32 * 34]; /* the largest gathered: Q8_0 */
		const size_t be = moek_x8_block(m->format, NULL);
		for (size_t at = 0; at < n; at += KC) {
			const size_t kn = n - at < KC ? n - at : KC;
			moek_x8_gather(m->format, matrix_group(m, r), r % MOEK_INTERLEAVE,
			               (k0 + at) / be, kn / be, blocks);
			moek_isa_dequantize(ops, f, blocks, NULL, dst + at, kn);
		}
		return;
	}
	const float *sr = matrix_scale_row(m, r);
	moek_isa_dequantize(ops, f, matrix_row(m, r) + moek_fmt_row_bytes(f, k0),
	                    sr ? sr + k0 / MOEK_FP8_BLOCK : NULL, dst, n);
}

/* A product of a matrix times its tensor scale (0: none; the bits of every other matrix stay
 * as they were). */
static inline float scaled(float y, float s)
{
	return s != 0.0f ? y * s : y;
}

static inline float activate(const struct moek_expert *e, float g, float u)
{
	if (e->activation == MOEK_SWIGLU_OAI) {
		g = fminf(g, e->limit);
		u = fmaxf(fminf(u, e->limit), -e->limit);
		return g / (1.0f + expf(-e->alpha * g)) * (u + 1.0f);
	}
	return g / (1.0f + expf(-g)) * u;
}

/* ---- Phases ------------------------------------------------------------------------------- */

/* Token t's routing weight where it scales the output: 1 when the expert takes it on its
 * input (Llama-4, scale_input). */
static inline float output_weight(const struct moek_ffn_call *c, size_t t)
{
	return c->weights && !c->expert->weight_on_input ? c->weights[t] : 1.0f;
}

/* Llama-4: token t's f32 input times its routing weight, before any quantization, as the
 * reference multiplies the hidden state by the router score before the experts. */
static inline void scale_input(const struct moek_ffn_call *c, size_t t, float *x, size_t n)
{
	if (!c->weights || !c->expert->weight_on_input)
		return;
	const float w = c->weights[t];
	for (size_t k = 0; k < n; k++)
		x[k] *= w;
}

void moek_ffn_load(const struct moek_ffn_call *c, unsigned worker, size_t t_begin, size_t t_end)
{
	const size_t hidden = c->plan.hidden;
	const size_t x_stride = c->x_stride ? c->x_stride : hidden;
	const size_t esize = c->x_dtype == MOEK_ACT_F32 ? 4 : 2;
	for (size_t t = t_begin; t < t_end; t++) {
		const char *src = (const char *)c->x + token_row(c, t) * x_stride * esize;
		if (c->plan.prefill) { /* into lane t % PANEL of its panel; padding columns zero */
			float *row = worker_area(c, worker);
			const size_t p = t / PANEL, x_pad = c->plan.x_pad;
			moek_convert(MOEK_ACT_F32, row, c->x_dtype, src, hidden);
			scale_input(c, t, row, hidden);
			memset(row + hidden, 0, (x_pad - hidden) * sizeof(float));
			if (c->plan.x_bf16) { /* rounded once, then a pair of k per 32-bit word */
				uint16_t *b = (uint16_t *)(row + x_pad);
				plan_ops(c)->round_bf16(row, b, x_pad);
				uint32_t *xw = (uint32_t *)x_panel16(c, p) + t % PANEL;
				for (size_t k = 0; k < x_pad; k += 2)
					xw[k / 2 * PANEL] = (uint32_t)b[k] | (uint32_t)b[k + 1]
					                                         << 16;
			} else {
				float *xp = x_panel(c, p) + t % PANEL;
				for (size_t k = 0; k < x_pad; k++)
					xp[k * PANEL] = row[k];
			}
			clear_panel_rows(h_panel(c, p), h_panel16(c, p), c->plan.h_bf16, t,
			                 c->plan.ffn, c->plan.h_pad);
			continue;
		}
		float *x32 = x32_row(c, t);
		moek_convert(MOEK_ACT_F32, x32, c->x_dtype, src, hidden);
		scale_input(c, t, x32, hidden);
		memset(x32 + hidden, 0, (c->plan.x_pad - hidden) * sizeof(float));
		if (c->plan.xq_format != MOEK_F32)
			moek_isa_quantize_act(plan_ops(c), c->plan.xq_format, x32, hidden,
			                      xq_row(c, t));
		float *h32 = h32_row(c, t); /* the padding columns of h stay zero */
		memset(h32 + c->plan.ffn, 0, (c->plan.h_pad - c->plan.ffn) * sizeof(float));
	}
}

/* Rows [r0, r0 + nr) x columns [k0, k0 + kn) of m, dequantized into tile (ld KC), columns
 * past kn zeroed up to the next multiple of 8. */
static void dequantize_tile(const struct moek_isa_ops *ops, const struct moek_matrix *m,
                            enum moek_fmt f, size_t r0, size_t nr, size_t k0, size_t kn,
                            float *tile)
{
	const size_t kn8 = round_up(kn, 8);
	for (size_t r = 0; r < nr; r++) {
		dequantize_matrix_row(ops, m, f, r0 + r, k0, kn, tile + r * KC);
		memset(tile + r * KC + kn, 0, (kn8 - kn) * sizeof(float));
	}
}

/* c_out[r * ldc + j] = m[r0 + r] · token (p0 * PANEL + j) for a row tile and np panels, K in
 * KC chunks from column 0; each (row, token) sum is one FMA chain in K order. */
static void tile_product(const struct moek_ffn_call *c, const struct moek_matrix *m,
                         enum moek_fmt f, float *(*panel)(const struct moek_ffn_call *, size_t),
                         size_t r0, size_t nr, size_t p0, size_t np, float *tile, float *c_out,
                         size_t ldc)
{
	const struct moek_isa_ops *ops = plan_ops(c);
	memset(c_out, 0, sizeof(float) * TILE_ROWS * ldc);
	for (size_t k0 = 0; k0 < m->cols; k0 += KC) {
		const size_t kn = m->cols - k0 < KC ? m->cols - k0 : KC;
		dequantize_tile(ops, m, f, r0, nr, k0, kn, tile);
		for (size_t p = 0; p < np; p++)
			ops->tile(tile, KC, nr, panel(c, p0 + p) + k0 * PANEL, round_up(kn, 8),
			          c_out + p * PANEL, ldc);
	}
}

static float *prefill_tile(const struct moek_ffn_call *c, unsigned worker)
{
	return (float *)((char *)worker_area(c, worker) + c->plan.hq_off);
}

/* Columns [k0, k0 + kn) of global row r of m as bf16 (rounded to nearest even; BF16 rows
 * copied), through row (f32, kn elements) where they need dequantizing. */
static void dequantize_row_bf16(const struct moek_isa_ops *ops, const struct moek_matrix *m,
                                enum moek_fmt f, size_t r, size_t k0, size_t kn, float *row,
                                uint16_t *dst)
{
	if (f == MOEK_FMT_BF16 && !m->interleave) {
		memcpy(dst, matrix_row(m, r) + k0 * sizeof(uint16_t), kn * sizeof(uint16_t));
		return;
	}
	dequantize_matrix_row(ops, m, f, r, k0, kn, row);
	ops->round_bf16(row, dst, kn);
}

/* The bf16 path's worker area: the f32 sums of gate (or down) and up for a token chunk, then
 * the bf16 weight tiles of gate (or down) and up, TILE_ROWS rows of every column (row_bf16
 * elements apart: the padded width), so that each weight is dequantized once per call. */
static float *bf16_sums(const struct moek_ffn_call *c, unsigned worker)
{
	return prefill_tile(c, worker) + TILE_ROWS * KC;
}
static uint16_t *bf16_tile(const struct moek_ffn_call *c, unsigned worker, int which)
{
	uint16_t *t = (uint16_t *)(bf16_sums(c, worker) + 2 * TILE_ROWS * TC_MAX);
	return t + (size_t)which * TILE_ROWS * c->plan.row_bf16;
}

/* Rows [r0, r0 + nr) of m, every column, as bf16 rows ld elements apart, zero past the
 * matrix's columns up to ld (a multiple of 32). */
static void dequantize_tile_bf16(const struct moek_ffn_call *c, unsigned worker,
                                 const struct moek_matrix *m, enum moek_fmt f, size_t r0, size_t nr,
                                 size_t ld, uint16_t *tile)
{
	const struct moek_isa_ops *ops = plan_ops(c);
	float *row = worker_area(c, worker);
	for (size_t r = 0; r < nr; r++) { /* a whole row per call: the row buffer holds one */
		uint16_t *dst = tile + r * ld;
		dequantize_row_bf16(ops, m, f, r0 + r, 0, m->cols, row, dst);
		memset(dst + m->cols, 0, (ld - m->cols) * sizeof(uint16_t));
	}
}

/* c_out[r * ldc + j] = tile row r · token (p * PANEL + j) of the np panels from xp (xs
 * elements apart), k (a multiple of 32) in KC steps: each (row, token) sum is the tile
 * kernel's chain in K order. */
static void tile_product_bf16(const struct moek_isa_ops *ops, const uint16_t *tile, size_t nr,
                              const uint16_t *xp, size_t xs, size_t np, size_t k, float *c_out,
                              size_t ldc)
{
	memset(c_out, 0, sizeof(float) * TILE_ROWS * ldc);
	for (size_t k0 = 0; k0 < k; k0 += KC)
		ops->tile_bf16(tile + k0, k, nr, xp + k0 * PANEL, xs, np, k - k0 < KC ? k - k0 : KC,
		               c_out, ldc);
}

/* h = act(gate · x + b_g, up · x + b_u) for rows [r0, r0 + nr), tokens [t0, t0 + np panels):
 * the activation of the chunk's sums, into h's f32 or bf16 panels. */
static void activate_tile(const struct moek_ffn_call *c, const struct moek_expert *e, size_t r0,
                          size_t nr, size_t p0, size_t np, const float *cg, const float *cu,
                          size_t ldc)
{
	const struct moek_isa_ops *ops = plan_ops(c);
	for (size_t r = 0; r < nr; r++) {
		const size_t f = r0 + r;
		const float bg = e->gate.bias ? e->gate.bias[f] : 0.0f;
		const float bu = e->up.bias ? e->up.bias[f] : 0.0f;
		const float sg = e->gate.tensor_scale, su = e->up.tensor_scale;
		for (size_t p = 0; p < np; p++) { /* padding lanes too: finite, unused */
			const float *g = cg + r * ldc + p * PANEL, *u = cu + r * ldc + p * PANEL;
			float hv[PANEL];
			for (size_t j = 0; j < PANEL; j++)
				hv[j] = activate(e, scaled(g[j], sg) + bg, scaled(u[j], su) + bu);
			if (!c->plan.h_bf16) {
				memcpy(h_panel(c, p0 + p) + f * PANEL, hv, sizeof(hv));
				continue;
			}
			uint16_t hb[PANEL], *hp = h_panel16(c, p0 + p);
			ops->round_bf16(hv, hb, PANEL);
			for (size_t j = 0; j < PANEL; j++)
				hp[pair_at(f, j)] = hb[j];
		}
	}
}

/* The hidden phase on the bf16 tiles: per tile of rows, gate's and up's weights dequantized
 * once, then every token chunk against them. */
static void hidden_prefill_bf16(const struct moek_ffn_call *c, const struct moek_expert *e,
                                unsigned worker, size_t f0, size_t f1)
{
	const struct moek_isa_ops *ops = plan_ops(c);
	float *cg = bf16_sums(c, worker), *cu = cg + TILE_ROWS * TC_BF16;
	uint16_t *tg = bf16_tile(c, worker, 0), *tu = bf16_tile(c, worker, 1);
	const size_t k = c->plan.x_pad, xs = c->plan.x_pad * PANEL;
	for (size_t r0 = f0; r0 < f1; r0 += TILE_ROWS) {
		const size_t nr = f1 - r0 < TILE_ROWS ? f1 - r0 : TILE_ROWS;
		dequantize_tile_bf16(c, worker, &e->gate, c->plan.gate_fmt, r0, nr, k, tg);
		dequantize_tile_bf16(c, worker, &e->up, c->plan.gate_fmt, r0, nr, k, tu);
		for (size_t t0 = 0; t0 < c->n_tokens; t0 += TC_BF16) {
			const size_t nt = c->n_tokens - t0 < TC_BF16 ? c->n_tokens - t0 : TC_BF16;
			const size_t np = (nt + PANEL - 1) / PANEL, p0 = t0 / PANEL;
			tile_product_bf16(ops, tg, nr, x_panel16(c, p0), xs, np, k, cg, TC_BF16);
			tile_product_bf16(ops, tu, nr, x_panel16(c, p0), xs, np, k, cu, TC_BF16);
			activate_tile(c, e, r0, nr, p0, np, cg, cu, TC_BF16);
		}
	}
}

static void hidden_prefill(const struct moek_ffn_call *c, const struct moek_expert *e,
                           unsigned worker, size_t f0, size_t f1)
{
	if (c->plan.x_bf16) {
		hidden_prefill_bf16(c, e, worker, f0, f1);
		return;
	}
	float *tile = prefill_tile(c, worker);
	float *cg = tile + TILE_ROWS * KC, *cu = cg + TILE_ROWS * TC;
	for (size_t t0 = 0; t0 < c->n_tokens; t0 += TC) {
		const size_t nt = c->n_tokens - t0 < TC ? c->n_tokens - t0 : TC;
		const size_t np = (nt + PANEL - 1) / PANEL, p0 = t0 / PANEL;
		for (size_t r0 = f0; r0 < f1; r0 += TILE_ROWS) {
			const size_t nr = f1 - r0 < TILE_ROWS ? f1 - r0 : TILE_ROWS;
			tile_product(c, &e->gate, c->plan.gate_fmt, x_panel, r0, nr, p0, np, tile,
			             cg, TC);
			tile_product(c, &e->up, c->plan.gate_fmt, x_panel, r0, nr, p0, np, tile, cu,
			             TC);
			activate_tile(c, e, r0, nr, p0, np, cg, cu, TC);
		}
	}
}

/* The decode paths keep a core's work between dots to the dots: a dot's results go straight
 * where they belong (one token; for groups, one wholly inside the range), and the per-row
 * work — bias, SwiGLU, the weighted sum into out — runs once per chunk of DECODE_CHUNK rows
 * (ROWS_CHUNK in the one-token row down path). Done per group between the dots (scalar loads,
 * expf and divides, stores between the weight streams), it takes a share of a core's DRAM
 * stream where that stream is the limit (docs/performance.md, "Kernel design measurements").
 * The arithmetic per row is unchanged, only later: same bits. */
#define DECODE_CHUNK 128

/* Many tokens through the group dots: rows in chunks whose weights (all the phase's matrices)
 * take about L2_BLOCK bytes, tokens in blocks whose activations do, so that each weight
 * group is read from L2 for every 8 tokens of a block and each activation row for every group
 * of a chunk, not both from memory (unblocked, a long prompt's activations evict the weights
 * between groups and the throughput halves; docs/performance.md). Up to 8
 * tokens: DECODE_CHUNK rows, the weights stream once. */
#define L2_BLOCK (256u << 10)

static size_t chunk_rows(size_t n_tokens, size_t weight_row_bytes)
{
	if (n_tokens <= MOEK_DOT_TOKENS) /* one pass over the weights whatever the chunk */
		return DECODE_CHUNK;
	const size_t r = L2_BLOCK / weight_row_bytes / MOEK_INTERLEAVE * MOEK_INTERLEAVE;
	return r < MOEK_INTERLEAVE ? MOEK_INTERLEAVE : r > DECODE_CHUNK ? DECODE_CHUNK : r;
}

static size_t token_block(size_t act_row_bytes)
{
	const size_t b = L2_BLOCK / act_row_bytes / MOEK_DOT_TOKENS * MOEK_DOT_TOKENS;
	return b < MOEK_DOT_TOKENS ? MOEK_DOT_TOKENS : b;
}

/* The steps of a group-dot phase over rows [r0, r1) of a matrix, in the order above: token
 * blocks, row chunks within a block (the first one starting on r0's group), 8 tokens at a
 * time within a chunk. The current step covers tokens [t0, t0 + nt) and rows [c0, c1). */
struct x8_steps {
	size_t n, first, end, ch, tb;
	size_t b0, b1, c0, c1, t0, nt;
	bool started;
};

static struct x8_steps x8_steps(size_t n_tokens, size_t r0, size_t r1, size_t weight_row_bytes,
                                size_t act_row_bytes)
{
	return (struct x8_steps){.n = n_tokens,
	                         .first = r0 / MOEK_INTERLEAVE * MOEK_INTERLEAVE,
	                         .end = r1,
	                         .ch = chunk_rows(n_tokens, weight_row_bytes),
	                         .tb = token_block(act_row_bytes)};
}

/* Moves to the next step; false after the last. */
static bool x8_next(struct x8_steps *s)
{
	if (!s->started) {
		s->started = true;
		s->b0 = s->t0 = 0;
		s->c0 = s->first;
	} else if ((s->t0 += MOEK_DOT_TOKENS) >= s->b1) { /* the block's next chunk */
		s->t0 = s->b0;
		if ((s->c0 += s->ch) >= s->end) { /* the next block */
			s->c0 = s->first;
			s->t0 = s->b0 += s->tb;
		}
	}
	if (s->b0 >= s->n || s->first >= s->end)
		return false;
	s->b1 = s->n - s->b0 < s->tb ? s->n : s->b0 + s->tb;
	s->c1 = s->c0 + s->ch < s->end ? s->c0 + s->ch : s->end;
	s->nt = s->b1 - s->t0 < MOEK_DOT_TOKENS ? s->b1 - s->t0 : MOEK_DOT_TOKENS;
	return true;
}

/* Rows [a, b) of the chunk at c0: h (gate) and ub (up, [t][f - c0]) hold the raw sums of
 * tokens t0 .. t0 + nt; h becomes the activation. */
static void activate_chunk(const struct moek_ffn_call *c, const struct moek_expert *e, size_t t0,
                           size_t nt, size_t c0, size_t a, size_t b, float *ub)
{
	const struct moek_isa_ops *ops = plan_ops(c);
	const float sg = e->gate.tensor_scale, su = e->up.tensor_scale;
	for (size_t t = 0; t < nt; t++) {
		float *h = h32_row(c, t0 + t);
		float *u = ub + t * DECODE_CHUNK - c0;
		if (sg != 0.0f || su != 0.0f)
			for (size_t f = a; f < b; f++)
				h[f] = scaled(h[f], sg), u[f] = scaled(u[f], su);
		if (ops->swiglu) {
			ops->swiglu(h + a, u + a, e->gate.bias ? e->gate.bias + a : NULL,
			            e->up.bias ? e->up.bias + a : NULL, b - a,
			            e->activation == MOEK_SWIGLU_OAI, e->limit, e->alpha);
			continue;
		}
		for (size_t f = a; f < b; f++) {
			const float bg = e->gate.bias ? e->gate.bias[f] : 0.0f;
			const float bu = e->up.bias ? e->up.bias[f] : 0.0f;
			h[f] = activate(e, h[f] + bg, u[f] + bu);
		}
	}
}

/* Group dots of nt tokens, out[t * 8 + r]. invariant (a batch-invariant call whose group dot
 * is not token-exact): each token its one-token bits, through the ISA's token-exact form of
 * the group dot where it has one, else one token per call. */
static inline void group_dots(const struct moek_isa_ops *ops, enum moek_fmt f, bool invariant,
                              const void *group, const uint8_t *act, size_t as, size_t nt, size_t k,
                              float *out)
{
	if (!invariant) {
		ops->dot_x8[f](group, act, as, nt, k, out);
		return;
	}
	if (nt > 1 && ops->dot_x8_exact[f]) {
		ops->dot_x8_exact[f](group, act, as, nt, k, out);
		return;
	}
	for (size_t t = 0; t < nt; t++)
		ops->dot_x8[f](group, act + t * as, as, 1, k, out + t * MOEK_INTERLEAVE);
}

/* Interleaved gate/up: whole groups of 8 rows through the ISA's group dot; a range that
 * starts or ends inside a group computes the group and keeps its own rows (each row's value
 * does not depend on the call, so the split does not change the bits). */
static void hidden_decode_x8(const struct moek_ffn_call *c, const struct moek_expert *e, size_t f0,
                             size_t f1)
{
	const moek_dot_x8_fn dot_x8 = plan_ops(c)->dot_x8[c->plan.gate_fmt];
	const bool one_by_one =
	    c->batch_invariant && !plan_ops(c)->token_exact_x8[c->plan.gate_fmt];
	const size_t hidden = c->plan.hidden, as = c->plan.xq_row;
	const uint8_t *xa = xq_row(c, 0);
	float ub[MOEK_DOT_TOKENS * DECODE_CHUNK];
	for (struct x8_steps s = x8_steps(c->n_tokens, f0, f1,
	                                  2 * moek_fmt_row_bytes(c->plan.gate_fmt, hidden), as);
	     x8_next(&s);) {
		const size_t t0 = s.t0, nt = s.nt, c0 = s.c0, c1 = s.c1;
		for (size_t g0 = c0; g0 < c1; g0 += MOEK_INTERLEAVE) {
			const uint8_t *gate = matrix_group(&e->gate, g0),
			              *up = matrix_group(&e->up, g0);
			if (nt == 1 && g0 >= f0 && g0 + MOEK_INTERLEAVE <= f1) {
				dot_x8(gate, xa + t0 * as, as, 1, hidden, h32_row(c, t0) + g0);
				dot_x8(up, xa + t0 * as, as, 1, hidden, ub + (g0 - c0));
				continue;
			}
			float g[MOEK_DOT_TOKENS * MOEK_INTERLEAVE],
			    u[MOEK_DOT_TOKENS * MOEK_INTERLEAVE];
			group_dots(plan_ops(c), c->plan.gate_fmt, one_by_one, gate, xa + t0 * as,
			           as, nt, hidden, g);
			group_dots(plan_ops(c), c->plan.gate_fmt, one_by_one, up, xa + t0 * as, as,
			           nt, hidden, u);
			for (size_t r = 0; r < MOEK_INTERLEAVE; r++) {
				const size_t f = g0 + r;
				if (f < f0 || f >= f1)
					continue;
				for (size_t t = 0; t < nt; t++) {
					h32_row(c, t0 + t)[f] = g[t * MOEK_INTERLEAVE + r];
					ub[t * DECODE_CHUNK + (f - c0)] =
					    u[t * MOEK_INTERLEAVE + r];
				}
			}
		}
		activate_chunk(c, e, t0, nt, c0, c0 > f0 ? c0 : f0, c1, ub);
	}
}

/* The dot a batch-invariant call runs several tokens through: the ISA's dot where it is
 * token-exact, else its token-exact form; NULL: none (one token per call). */
static inline moek_dot_fn token_exact_dot(const struct moek_isa_ops *ops, enum moek_fmt f)
{
	return ops->token_exact[f] ? ops->dot[f] : ops->dot_exact[f];
}

/* Row dots of nt tokens against one weight row, out[t], each token's bits those of dot with
 * nt = 1: through `many` (token_exact_dot), else one token per call. */
static inline void row_dots(moek_dot_fn dot, moek_dot_fn many, const uint8_t *w, const float *s,
                            const uint8_t *act, size_t as, size_t nt, size_t k, float *out)
{
	if (nt > 1 && many) {
		many(w, s, act, as, nt, k, out);
		return;
	}
	for (size_t t = 0; t < nt; t++) /* the row stays in L1 from one token to the next */
		dot(w, s, act + t * as, as, 1, k, out + t);
}

/* A batch-invariant call's hidden phase on row dots: the one-token path's operations for
 * every token — each row's dot, then the chunk's activation (activate_chunk) — with the
 * weights of a chunk read once from memory for every token (tokens 8 at a time through a
 * token-exact dot, else one at a time while the row is in L1). */
static void hidden_decode_invariant(const struct moek_ffn_call *c, const struct moek_expert *e,
                                    size_t f0, size_t f1)
{
	const struct moek_isa_ops *ops = plan_ops(c);
	const moek_dot_fn dot = ops->dot[c->plan.gate_fmt];
	const moek_dot_fn many = token_exact_dot(ops, c->plan.gate_fmt);
	const size_t hidden = c->plan.hidden;
	const bool quantized = c->plan.xq_format != MOEK_F32;
	const size_t as = quantized ? c->plan.xq_row : c->plan.x_pad * sizeof(float);
	const uint8_t *xa =
	    quantized ? (const uint8_t *)xq_row(c, 0) : (const uint8_t *)x32_row(c, 0);
	float ub[MOEK_DOT_TOKENS * DECODE_CHUNK];
	for (size_t c0 = f0; c0 < f1; c0 += DECODE_CHUNK) {
		const size_t c1 = c0 + DECODE_CHUNK < f1 ? c0 + DECODE_CHUNK : f1;
		for (size_t t0 = 0; t0 < c->n_tokens; t0 += MOEK_DOT_TOKENS) {
			const size_t nt =
			    c->n_tokens - t0 < MOEK_DOT_TOKENS ? c->n_tokens - t0 : MOEK_DOT_TOKENS;
			for (size_t f = c0; f < c1; f++) {
				float g[MOEK_DOT_TOKENS], u[MOEK_DOT_TOKENS];
				row_dots(dot, many, matrix_row(&e->gate, f),
				         matrix_scale_row(&e->gate, f), xa + t0 * as, as, nt,
				         hidden, g);
				row_dots(dot, many, matrix_row(&e->up, f),
				         matrix_scale_row(&e->up, f), xa + t0 * as, as, nt, hidden,
				         u);
				for (size_t t = 0; t < nt; t++) {
					h32_row(c, t0 + t)[f] = g[t];
					ub[t * DECODE_CHUNK + (f - c0)] = u[t];
				}
			}
			activate_chunk(c, e, t0, nt, c0, c0, c1, ub);
		}
	}
}

static void hidden_decode(const struct moek_ffn_call *c, const struct moek_expert *e,
                          unsigned worker, size_t f0, size_t f1)
{
	const struct moek_isa_ops *ops = plan_ops(c);
	const size_t hidden = c->plan.hidden;
	const moek_dot_fn dot = e->gate.interleave ? NULL : ops->dot[c->plan.gate_fmt];
	const bool quantized = c->plan.xq_format != MOEK_F32;
	float *row = worker_area(c, worker);
	if (e->gate.interleave && ops->dot_x8[c->plan.gate_fmt] && quantized) {
		hidden_decode_x8(c, e, f0, f1);
		return;
	}
	if (dot && c->batch_invariant) { /* (without dots each token is on its own already) */
		hidden_decode_invariant(c, e, f0, f1);
		return;
	}
	/* per-row invariants hoisted: with Qwen3-sized rows the loop's own cost is not small */
	const size_t gate_stride = row_stride(&e->gate), up_stride = row_stride(&e->up);
	const uint8_t *gate_data = e->gate.data, *up_data = e->up.data;
	const size_t gate_row0 = e->gate.row0, up_row0 = e->up.row0;
	assert(f0 >= gate_row0 && f0 >= up_row0);
	if (dot &&
	    c->n_tokens == 1) { /* one token: sums in place, the rest per chunk (DECODE_CHUNK) */
		const size_t as = quantized ? c->plan.xq_row : c->plan.x_pad * sizeof(float);
		const uint8_t *xa =
		    quantized ? (const uint8_t *)xq_row(c, 0) : (const uint8_t *)x32_row(c, 0);
		float ub[DECODE_CHUNK], *h = h32_row(c, 0);
		for (size_t c0 = f0; c0 < f1; c0 += DECODE_CHUNK) {
			const size_t c1 = c0 + DECODE_CHUNK < f1 ? c0 + DECODE_CHUNK : f1;
			for (size_t f = c0; f < c1; f++) {
				dot(gate_data + (f - gate_row0) * gate_stride,
				    e->gate.scales ? matrix_scale_row(&e->gate, f) : NULL, xa, as,
				    1, hidden, h + f);
				dot(up_data + (f - up_row0) * up_stride,
				    e->up.scales ? matrix_scale_row(&e->up, f) : NULL, xa, as, 1,
				    hidden, ub + (f - c0));
			}
			activate_chunk(c, e, 0, 1, c0, c0, c1, ub);
		}
		return;
	}
	for (size_t f = f0; f < f1; f++) {
		const float bg = e->gate.bias ? e->gate.bias[f] : 0.0f;
		const float bu = e->up.bias ? e->up.bias[f] : 0.0f;
		const uint8_t *wg = gate_data + (f - gate_row0) * gate_stride,
		              *wu = up_data + (f - up_row0) * up_stride;
		const float *sg = e->gate.scales ? matrix_scale_row(&e->gate, f) : NULL;
		const float *su = e->up.scales ? matrix_scale_row(&e->up, f) : NULL;
		if (dot) { /* direct: integer dot on quantized x, or float weights on f32 x */
			const size_t as =
			    quantized ? c->plan.xq_row : c->plan.x_pad * sizeof(float);
			const uint8_t *xa = quantized ? (const uint8_t *)xq_row(c, 0)
			                              : (const uint8_t *)x32_row(c, 0);
			for (size_t t0 = 0; t0 < c->n_tokens; t0 += MOEK_DOT_TOKENS) {
				const size_t nt = c->n_tokens - t0 < MOEK_DOT_TOKENS
				                      ? c->n_tokens - t0
				                      : MOEK_DOT_TOKENS;
				float g[MOEK_DOT_TOKENS], u[MOEK_DOT_TOKENS];
				dot(wg, sg, xa + t0 * as, as, nt, hidden, g);
				dot(wu, su, xa + t0 * as, as, nt, hidden, u);
				for (size_t t = 0; t < nt; t++)
					h32_row(c, t0 + t)[f] =
					    activate(e, scaled(g[t], e->gate.tensor_scale) + bg,
					             scaled(u[t], e->up.tensor_scale) + bu);
			}
			continue;
		}
		/* generic: dequantize the row once, f32 dot per token (the scalar reference) */
		(void)sg, (void)su;
		dequantize_matrix_row(ops, &e->gate, c->plan.gate_fmt, f, 0, hidden, row);
		for (size_t t = 0; t < c->n_tokens; t++)
			h32_row(c, t)[f] =
			    scaled(ops->dot_f32(row, x32_row(c, t), hidden), e->gate.tensor_scale);
		dequantize_matrix_row(ops, &e->up, c->plan.gate_fmt, f, 0, hidden, row);
		for (size_t t = 0; t < c->n_tokens; t++) {
			const float u =
			    scaled(ops->dot_f32(row, x32_row(c, t), hidden), e->up.tensor_scale);
			h32_row(c, t)[f] = activate(e, h32_row(c, t)[f] + bg, u + bu);
		}
	}
}

#ifndef NDEBUG
static bool same_matrix_shape(const struct moek_matrix *a, const struct moek_matrix *b)
{
	return a->format == b->format && a->rows == b->rows && a->cols == b->cols &&
	       a->interleave == b->interleave && (a->scales == NULL) == (b->scales == NULL) &&
	       (a->bias == NULL) == (b->bias == NULL);
}

/* w may stand in for c->expert: same formats, shapes, activation and side data. */
static bool same_expert_shape(const struct moek_expert *a, const struct moek_expert *b)
{
	return same_matrix_shape(&a->gate, &b->gate) && same_matrix_shape(&a->up, &b->up) &&
	       same_matrix_shape(&a->down, &b->down) && a->activation == b->activation &&
	       a->limit == b->limit && a->alpha == b->alpha &&
	       a->weight_on_input == b->weight_on_input;
}
#endif

void moek_ffn_hidden_rows(const struct moek_ffn_call *c, const struct moek_expert *w,
                          unsigned worker, size_t f_begin, size_t f_end)
{
	assert(f_begin <= f_end && f_end <= c->plan.ffn);
	assert(same_expert_shape(c->expert, w));
	if (f_begin >= f_end || c->n_tokens == 0)
		return;
	if (c->plan.prefill)
		hidden_prefill(c, w, worker, f_begin, f_end);
	else
		hidden_decode(c, w, worker, f_begin, f_end);
}

void moek_ffn_hidden(const struct moek_ffn_call *c, unsigned worker, size_t f_begin, size_t f_end)
{
	moek_ffn_hidden_rows(c, c->expert, worker, f_begin, f_end);
}

size_t moek_ffn_hidden_align(const struct moek_expert *e)
{
	(void)e;   /* down's activations are quantized by each down worker: no block constraint */
	return 16; /* 64 bytes of f32 h per token: workers never share a cache line of h */
}

static inline void accumulate(const struct moek_ffn_call *c, const struct moek_expert *e, size_t t,
                              size_t o, float y)
{
	const size_t out_stride = c->out_stride ? c->out_stride : c->plan.hidden;
	const float w = output_weight(c, t);
	const float b = e->down.bias ? e->down.bias[o] : 0.0f;
	c->out[token_row(c, t) * out_stride + o] += w * (scaled(y, e->down.tensor_scale) + b);
}

/* accumulate() for output rows [a, b) of token t, y[o - a] their sums: the same operations
 * per element, in a loop the compiler vectorizes (per-token invariants hoisted). */
static void accumulate_rows(const struct moek_ffn_call *c, const struct moek_expert *e, size_t t,
                            size_t a, size_t b, const float *restrict y)
{
	const size_t out_stride = c->out_stride ? c->out_stride : c->plan.hidden;
	const float w = output_weight(c, t);
	float *restrict out = c->out + token_row(c, t) * out_stride;
	const float *restrict bias = e->down.bias;
	const float s = e->down.tensor_scale;
	if (s != 0.0f) {
		for (size_t o = a; o < b; o++)
			out[o] += w * (y[o - a] * s + (bias ? bias[o] : 0.0f));
		return;
	}
	if (bias)
		for (size_t o = a; o < b; o++)
			out[o] += w * (y[o - a] + bias[o]);
	else
		for (size_t o = a; o < b; o++)
			out[o] += w * (y[o - a] + 0.0f);
}

static void down_prefill(const struct moek_ffn_call *c, const struct moek_expert *e,
                         unsigned worker, size_t o0, size_t o1)
{
	const bool bf16 = c->plan.h_bf16;
	const size_t tc = bf16 ? TC_BF16 : TC, k = c->plan.h_pad, hs = c->plan.h_pad * PANEL;
	float *tile = prefill_tile(c, worker),
	      *acc = bf16 ? bf16_sums(c, worker) : tile + TILE_ROWS * KC;
	uint16_t *td = bf16_tile(c, worker, 0);
	for (size_t r0 = o0; r0 < o1; r0 += TILE_ROWS) {
		const size_t nr = o1 - r0 < TILE_ROWS ? o1 - r0 : TILE_ROWS;
		if (bf16) /* the bf16 tiles: down's weights dequantized once per call */
			dequantize_tile_bf16(c, worker, &e->down, c->plan.down_fmt, r0, nr, k, td);
		for (size_t t0 = 0; t0 < c->n_tokens; t0 += tc) {
			const size_t nt = c->n_tokens - t0 < tc ? c->n_tokens - t0 : tc;
			const size_t np = (nt + PANEL - 1) / PANEL;
			if (bf16)
				tile_product_bf16(plan_ops(c), td, nr, h_panel16(c, t0 / PANEL), hs,
				                  np, k, acc, tc);
			else
				tile_product(c, &e->down, c->plan.down_fmt, h_panel, r0, nr,
				             t0 / PANEL, np, tile, acc, tc);
			for (size_t t = 0; t < nt; t++) { /* accumulate()'s operations, per token */
				float y[TILE_ROWS];
				for (size_t r = 0; r < nr; r++)
					y[r] = acc[r * tc + t];
				accumulate_rows(c, e, t0 + t, r0, r0 + nr, y);
			}
		}
	}
}

/* Rows per call of the ISA's many-row dot in the down phase (one token; results in a stack
 * array). The hidden phase keeps alternating gate and up rows one call each: longer runs of
 * one matrix were no faster (docs/performance.md). */
enum { ROWS_CHUNK = 64 };

/* h of tokens [t0, t0 + nt) (nt <= 8) in down's activation format into the worker's rows
 * 0 .. nt - 1: a batch-invariant call quantizes as it goes (the same function on the same
 * h: the same bytes as the default's one pass over every token). */
static void quantize_h(const struct moek_ffn_call *c, unsigned worker, size_t t0, size_t nt)
{
	for (size_t t = 0; t < nt; t++)
		moek_isa_quantize_act(plan_ops(c), c->plan.hq_format, h32_row(c, t0 + t),
		                      c->plan.ffn, hq_row(c, worker, t));
}

/* Interleaved down: as hidden_decode_x8, groups of 8 output rows, partial groups at the edges
 * of the range computed whole and kept in part. h is already in the worker's scratch. */
static void down_decode_x8(const struct moek_ffn_call *c, const struct moek_expert *e,
                           unsigned worker, size_t o0, size_t o1)
{
	const moek_dot_x8_fn dot_x8 = plan_ops(c)->dot_x8[c->plan.down_fmt];
	const bool one_by_one =
	    c->batch_invariant && !plan_ops(c)->token_exact_x8[c->plan.down_fmt];
	const size_t ffn = c->plan.ffn, as = c->plan.hq_row;
	const uint8_t *ha = hq_row(c, worker, 0);
	float yb[MOEK_DOT_TOKENS *
	         DECODE_CHUNK]; /* [t][o - c0]: the chunk's sums (see DECODE_CHUNK) */
	for (struct x8_steps s =
	         x8_steps(c->n_tokens, o0, o1, moek_fmt_row_bytes(c->plan.down_fmt, ffn), as);
	     x8_next(&s);) {
		const size_t t0 = s.t0, nt = s.nt, c0 = s.c0, c1 = s.c1;
		const uint8_t *act = ha + t0 * as;
		if (c->batch_invariant && c->n_tokens > MOEK_DOT_TOKENS) { /* into the 8 rows */
			quantize_h(c, worker, t0, nt);
			act = ha;
		}
		for (size_t g0 = c0; g0 < c1; g0 += MOEK_INTERLEAVE) {
			const uint8_t *down = matrix_group(&e->down, g0);
			if (nt == 1) { /* rows outside the range are computed, not used */
				dot_x8(down, act, as, 1, ffn, yb + (g0 - c0));
				continue;
			}
			float y[MOEK_DOT_TOKENS * MOEK_INTERLEAVE];
			group_dots(plan_ops(c), c->plan.down_fmt, one_by_one, down, act, as, nt,
			           ffn, y);
			for (size_t r = 0; r < MOEK_INTERLEAVE && g0 + r < c1; r++)
				for (size_t t = 0; t < nt; t++)
					yb[t * DECODE_CHUNK + (g0 + r - c0)] =
					    y[t * MOEK_INTERLEAVE + r];
		}
		const size_t a = c0 > o0 ? c0 : o0;
		for (size_t t = 0; t < nt; t++)
			accumulate_rows(c, e, t0 + t, a, c1, yb + t * DECODE_CHUNK + (a - c0));
	}
}

/* A batch-invariant call's down phase on row dots: the one-token path's operations for every
 * token — a chunk's sums by the many-row dot (or a dot per row: the same bits), then their
 * weighted sums — tokens 8 at a time (through a token-exact dot, else one by one while the
 * rows are in cache), over blocks of ROW_BLOCK rows that stay in L2 from one 8 tokens to the
 * next; each 8 tokens' h is quantized into the worker's rows once per block. */
enum { ROW_BLOCK = 256 };
static void down_decode_invariant(const struct moek_ffn_call *c, const struct moek_expert *e,
                                  unsigned worker, size_t o0, size_t o1)
{
	const struct moek_isa_ops *ops = plan_ops(c);
	const moek_dot_fn dot = ops->dot[c->plan.down_fmt];
	const moek_dot_rows_fn rows = ops->dot_rows[c->plan.down_fmt];
	const moek_dot_fn many = token_exact_dot(ops, c->plan.down_fmt);
	const size_t ffn = c->plan.ffn, stride = row_stride(&e->down);
	const bool quantized = c->plan.hq_format != MOEK_F32;
	const size_t as = quantized ? c->plan.hq_row : c->plan.h_pad * sizeof(float);
	for (size_t b0 = o0; b0 < o1; b0 += ROW_BLOCK) {
		const size_t b1 = o1 - b0 < ROW_BLOCK ? o1 : b0 + ROW_BLOCK;
		for (size_t t0 = 0; t0 < c->n_tokens; t0 += MOEK_DOT_TOKENS) {
			const size_t nt =
			    c->n_tokens - t0 < MOEK_DOT_TOKENS ? c->n_tokens - t0 : MOEK_DOT_TOKENS;
			if (quantized && c->n_tokens > MOEK_DOT_TOKENS) /* (else: all up front) */
				quantize_h(c, worker, t0, nt);
			const uint8_t *ha = quantized ? (const uint8_t *)hq_row(c, worker, 0)
			                              : (const uint8_t *)h32_row(c, t0);
			for (size_t r0 = b0; r0 < b1; r0 += ROWS_CHUNK) {
				const size_t nr = b1 - r0 < ROWS_CHUNK ? b1 - r0 : ROWS_CHUNK;
				float y[MOEK_DOT_TOKENS][ROWS_CHUNK];
				if (many && nt > 1) {
					for (size_t i = 0; i < nr; i++) {
						float v[MOEK_DOT_TOKENS];
						many(matrix_row(&e->down, r0 + i),
						     matrix_scale_row(&e->down, r0 + i), ha, as, nt,
						     ffn, v);
						for (size_t t = 0; t < nt; t++)
							y[t][i] = v[t];
					}
				} else {
					for (size_t t = 0; t < nt; t++) {
						const uint8_t *a = ha + t * as;
						if (rows && quantized)
							rows(matrix_row(&e->down, r0), stride, nr,
							     a, ffn, y[t]);
						else
							for (size_t i = 0; i < nr; i++)
								dot(matrix_row(&e->down, r0 + i),
								    matrix_scale_row(&e->down,
								                     r0 + i),
								    a, as, 1, ffn, y[t] + i);
					}
				}
				for (size_t t = 0; t < nt; t++)
					accumulate_rows(c, e, t0 + t, r0, r0 + nr, y[t]);
			}
		}
	}
}

static void down_decode(const struct moek_ffn_call *c, const struct moek_expert *e, unsigned worker,
                        size_t o0, size_t o1)
{
	const struct moek_isa_ops *ops = plan_ops(c);
	const size_t ffn = c->plan.ffn;
	const bool x8 = e->down.interleave && ops->dot_x8[c->plan.down_fmt];
	const moek_dot_fn dot = e->down.interleave ? NULL : ops->dot[c->plan.down_fmt];
	const bool quantized = c->plan.hq_format != MOEK_F32;
	float *row = worker_area(c, worker);
	/* h of every token in down's activation format, this worker's own copy: the hidden phase
	 * may have been split anywhere, so no worker's range held whole quantization blocks */
	if ((dot || x8) && quantized && (!c->batch_invariant || c->n_tokens <= MOEK_DOT_TOKENS))
		for (size_t t = 0; t < c->n_tokens; t++)
			moek_isa_quantize_act(ops, c->plan.hq_format, h32_row(c, t), ffn,
			                      hq_row(c, worker, t));
	if (x8 && quantized) {
		down_decode_x8(c, e, worker, o0, o1);
		return;
	}
	if (dot && c->batch_invariant) {
		down_decode_invariant(c, e, worker, o0, o1);
		return;
	}
	/* per-row invariants hoisted (2048 rows of 768 columns in Qwen3: the loop's own cost
	 * is not small); the sum is accumulate()'s, w * (y + b) */
	const size_t stride = row_stride(&e->down);
	const uint8_t *data = e->down.data;
	const size_t row0 = e->down.row0;
	assert(o0 >= row0);
	const size_t out_stride = c->out_stride ? c->out_stride : c->plan.hidden;
	const size_t as = quantized ? c->plan.hq_row : c->plan.h_pad * sizeof(float);
	const uint8_t *ha =
	    quantized ? (const uint8_t *)hq_row(c, worker, 0) : (const uint8_t *)h32_row(c, 0);
	const moek_dot_rows_fn rows = ops->dot_rows[c->plan.down_fmt];
	if (dot && c->n_tokens == 1) {
		/* one token: a chunk's sums in place — the ISA's many-row dot where it has one,
		 * else a dot per row (the same sum) — then their weighted sums (see DECODE_CHUNK)
		 */
		for (size_t r0 = o0; r0 < o1; r0 += ROWS_CHUNK) {
			const size_t nr = o1 - r0 < ROWS_CHUNK ? o1 - r0 : ROWS_CHUNK;
			float y[ROWS_CHUNK];
			if (rows && quantized)
				rows(data + (r0 - row0) * stride, stride, nr, ha, ffn, y);
			else
				for (size_t i = 0; i < nr; i++)
					dot(data + (r0 + i - row0) * stride,
					    e->down.scales ? matrix_scale_row(&e->down, r0 + i)
					                   : NULL,
					    ha, as, 1, ffn, y + i);
			accumulate_rows(c, e, 0, r0, r0 + nr, y);
		}
		return;
	}
	for (size_t o = o0; o < o1; o++) {
		const uint8_t *w = data + (o - row0) * stride;
		const float *s = e->down.scales ? matrix_scale_row(&e->down, o) : NULL;
		if (dot) {
			const float b = e->down.bias ? e->down.bias[o] : 0.0f;
			for (size_t t0 = 0; t0 < c->n_tokens; t0 += MOEK_DOT_TOKENS) {
				const size_t nt = c->n_tokens - t0 < MOEK_DOT_TOKENS
				                      ? c->n_tokens - t0
				                      : MOEK_DOT_TOKENS;
				float y[MOEK_DOT_TOKENS];
				dot(w, s, ha + t0 * as, as, nt, ffn, y);
				for (size_t t = 0; t < nt; t++) {
					const float wt = output_weight(c, t0 + t);
					c->out[token_row(c, t0 + t) * out_stride + o] +=
					    wt * (scaled(y[t], e->down.tensor_scale) + b);
				}
			}
			continue;
		}
		(void)w, (void)s;
		dequantize_matrix_row(ops, &e->down, c->plan.down_fmt, o, 0, ffn, row);
		for (size_t t = 0; t < c->n_tokens; t++)
			accumulate(c, e, t, o, ops->dot_f32(row, h32_row(c, t), ffn));
	}
}

void moek_ffn_down_rows(const struct moek_ffn_call *c, const struct moek_expert *w, unsigned worker,
                        size_t o_begin, size_t o_end)
{
	assert(o_begin <= o_end && o_end <= c->plan.hidden);
	assert(same_expert_shape(c->expert, w));
	if (o_begin >= o_end || c->n_tokens == 0)
		return;
	if (c->plan.prefill)
		down_prefill(c, w, worker, o_begin, o_end);
	else
		down_decode(c, w, worker, o_begin, o_end);
}

void moek_ffn_down(const struct moek_ffn_call *c, unsigned worker, size_t o_begin, size_t o_end)
{
	moek_ffn_down_rows(c, c->expert, worker, o_begin, o_end);
}

int moek_ffn_run(struct moek_ffn_call *c, char *err, size_t len)
{
	if (moek_ffn_prepare(c, err, len))
		return -1;
	moek_ffn_load(c, 0, 0, c->n_tokens);
	moek_ffn_hidden(c, 0, 0, c->plan.ffn);
	moek_ffn_down(c, 0, 0, c->plan.hidden);
	return 0;
}
