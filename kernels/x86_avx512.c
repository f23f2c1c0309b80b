/* x86_avx512.c — the avx512 ISA: AVX2's kernels, with AVX-512 ones where they pay.
 *
 * The table starts as a copy of moek_avx2_ops (every format keeps a complete path) and then
 * takes this file's entries. It is only ever made active on a CPU with AVX512 F/BW/VL/DQ,
 * VNNI and BF16 (isa.c), so the whole file is built for them.
 *
 * Decode, BF16 weights against bf16 activations: vdpbf16ps multiplies a register of bf16
 * pairs by another and adds both products of each pair into one f32 lane — the pair split,
 * the two FMAs and the activation split of the AVX2 dots in one instruction.
 *   Group dots (the decode layout, moek_interleave): each 32-byte vector holds one column
 *   pair of the 8 rows, so one 256-bit vdpbf16ps with the token's pair broadcast from memory
 *   ({1to8}) adds it to the 8 rows' lanes. 256 bits and not 512: a 512-bit register would
 *   hold two pairs of the same rows and need its activation operand shuffled per token, and
 *   the AMD cores this targets run a 512-bit operation as two 256-bit halves anyway.
 *   Row dots: 32 columns per 512-bit vdpbf16ps, the weights loaded once for all tokens, the
 *   last partial step through a zero-masked load (both operands zero past k); one token
 *   against a wide activation row keeps the AVX2 dot (bf16_wide_row).
 * Every result's summation order depends only on k and the token count, never on the rows
 * or tokens processed with it, and dot_rows runs dot's one-token body per row (same bits).
 *
 * Prefill: bf16 tiles (moek_tile_bf16_fn) on vdpbf16ps — 12 rows x 2 panels of 16 tokens in 24
 * zmm accumulators, one weight pair broadcast per row against a panel's 16 token pairs — for
 * every format moek_tile_bf16_takes, weights dequantized by AVX2's dequantizers and rounded
 * to bf16 (vcvtne2ps2bf16) once per tile, activations rounded once per token.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels_internal.h"
#include "x86_avx2.h"

struct moek_isa_ops moek_avx512_ops;

/* ---- BF16 ------------------------------------------------------------------------------- */

ALWAYS_INLINE __m512 dp_bf16x32(__m512 acc, __m512i w, __m512i x)
{
	return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
}

ALWAYS_INLINE const uint16_t *bf16_row(const void *act, size_t as, int t)
{
	return (const uint16_t *)((const uint8_t *)act + (size_t)t * as);
}

/* One BF16 weight row against NT bf16 token rows. One token: two chains over 64 columns (a
 * core streams the row from DRAM; the chains only cover the instruction's latency). More
 * tokens: one chain per token, the 32 weights loaded once. */
ALWAYS_INLINE void bf16_row_body(const void *w, const float *sr, const void *act, size_t as,
                                 const int NT, size_t k, float *out, int exact)
{
	(void)sr;
	const uint16_t *a = w;
	const bool far = wide_activation(k * sizeof(uint16_t));
	__m512 acc[8], acc1[8];
	for (int t = 0; t < NT; t++)
		acc[t] = acc1[t] = _mm512_setzero_ps();
	const bool two = NT == 1 || exact; /* exact: every token in the two chains of one */
	size_t i = 0;
	if (two) {
		for (; i + 64 <= k; i += 64) {
			prefetch_ahead(a + i, far);
			prefetch_ahead(a + i + 32, far);
			const __m512i w0 = _mm512_loadu_si512(a + i),
			              w1 = _mm512_loadu_si512(a + i + 32);
			for (int t = 0; t < NT; t++) {
				acc[t] = dp_bf16x32(acc[t], w0,
				                    _mm512_loadu_si512(bf16_row(act, as, t) + i));
				acc1[t] = dp_bf16x32(
				    acc1[t], w1, _mm512_loadu_si512(bf16_row(act, as, t) + i + 32));
			}
		}
	}
	for (; i + 32 <= k; i += 32) {
		prefetch_ahead(a + i, far);
		const __m512i wv = _mm512_loadu_si512(a + i);
		for (int t = 0; t < NT; t++)
			acc[t] =
			    dp_bf16x32(acc[t], wv, _mm512_loadu_si512(bf16_row(act, as, t) + i));
	}
	if (i < k) {
		const __mmask32 m = (__mmask32)((1ull << (k - i)) - 1);
		const __m512i wv = _mm512_maskz_loadu_epi16(m, a + i);
		for (int t = 0; t < NT; t++)
			acc[t] = dp_bf16x32(acc[t], wv,
			                    _mm512_maskz_loadu_epi16(m, bf16_row(act, as, t) + i));
	}
	for (int t = 0; t < NT; t++)
		out[t] = _mm512_reduce_add_ps(two ? _mm512_add_ps(acc[t], acc1[t]) : acc[t]);
}

DOT_ENTRY(dot_bf16_zmm, bf16_row_body, 0)
DOT_ENTRY(dot_bf16_zmm_exact, bf16_row_body, 1)
ROWS_ENTRY(rows_bf16_zmm, bf16_row_body, 0)

/* One token against rows whose activation row is wide (wide_activation: reloaded from L2 for
 * every row) stays on the AVX2 dot: from DRAM on two threads (14336 columns) the 512-bit loop
 * streamed them at 0.88-0.89 of it, a 256-bit vdpbf16ps loop with its prefetch cadence at
 * 0.92-0.98, with four chains over 64 columns 0.74-0.84. The choice depends on k alone, so a
 * row gets the same bits from either entry. */
static bool bf16_wide_row(size_t k)
{
	return wide_activation(k * sizeof(uint16_t));
}

static void dot_bf16(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                     size_t k, float *out)
{
	if (nt == 1 && bf16_wide_row(k))
		moek_avx2_ops.dot[MOEK_FMT_BF16](w, sr, act, as, 1, k, out);
	else
		dot_bf16_zmm(w, sr, act, as, nt, k, out);
}

/* dot_bf16's token-exact form (moek_isa_ops.dot_exact): each token the chains nt = 1 gives it */
static void dot_bf16_exact(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                           size_t k, float *out)
{
	if (bf16_wide_row(k))
		moek_avx2_ops.dot_exact[MOEK_FMT_BF16](w, sr, act, as, nt, k, out);
	else
		dot_bf16_zmm_exact(w, sr, act, as, nt, k, out);
}

static void rows_bf16(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                      float *out)
{
	if (bf16_wide_row(k))
		moek_avx2_ops.dot_rows[MOEK_FMT_BF16](w, stride, nr, act, k, out);
	else
		rows_bf16_zmm(w, stride, nr, act, k, out);
}

/* acc + w · the token's column pair p, broadcast to the 8 row lanes. (As vdpbf16ps's own
 * {1to8} memory operand, through inline assembly, GCC 12 kept a copy of every accumulator in
 * memory, one store per product: 0.6 of this form's speed at 8 tokens.) */
ALWAYS_INLINE __m256 dp_bf16_pair(__m256 acc, __m256i w, const void *act, size_t as, int t,
                                  size_t p)
{
	int32_t v;
	memcpy(&v, (const uint8_t *)act + (size_t)t * as + 4 * p, 4);
	return _mm256_dpbf16_ps(acc, (__m256bh)w, (__m256bh)_mm256_set1_epi32(v));
}

/* An interleaved BF16 group (k a multiple of 16): vector p holds column pair p of the 8 rows,
 * row r in lane r. One token: four chains (memory-bound; they cover the latency). More
 * tokens: two chains per token (even and odd pairs), so that 2·NT products are in flight
 * against the instruction's latency of several cycles. */
/* Tokens per pass of the token-exact group dot: 16 chains (all 8 tokens' 32 spill). */
enum { EXACT_TB = 4 };
ALWAYS_INLINE void x8_bf16_body(const void *group, const void *act, size_t as, const int NT,
                                size_t k, float *out, int exact)
{
	const uint8_t *col = group;
	if (exact) { /* every token in the four chains of one, EXACT_TB tokens per pass */
		for (int t0 = 0; t0 < NT; t0 += EXACT_TB) {
			const int nb = NT - t0 < EXACT_TB ? NT - t0 : EXACT_TB;
			const uint8_t *c2 = group;
			const uint8_t *a0 = (const uint8_t *)act + (size_t)t0 * as;
			struct x8_stream pf2 = x8_stream_at(c2, 1);
			__m256 acc[EXACT_TB][4];
			for (int b = 0; b < EXACT_TB; b++)
				for (int j = 0; j < 4; j++)
					acc[b][j] = _mm256_setzero_ps();
			for (size_t p = 0; p < k / 2; p += 4, c2 += 4 * 32) {
				x8_prefetch(&pf2, c2 + 4 * 32);
				for (int j = 0; j < 4; j++) {
					const __m256i wv =
					    _mm256_loadu_si256((const void *)(c2 + 32 * j));
					for (int b = 0; b < nb; b++)
						acc[b][j] = dp_bf16_pair(acc[b][j], wv, a0, as, b,
						                         p + (size_t)j);
				}
			}
			for (int b = 0; b < nb; b++)
				_mm256_storeu_ps(
				    out + 8 * (t0 + b),
				    _mm256_add_ps(_mm256_add_ps(acc[b][0], acc[b][1]),
				                  _mm256_add_ps(acc[b][2], acc[b][3])));
		}
		return;
	}
	struct x8_stream pf = x8_stream_at(col, NT);
	if (NT == 1) {
		__m256 acc[4];
		for (int j = 0; j < 4; j++)
			acc[j] = _mm256_setzero_ps();
		for (size_t p = 0; p < k / 2; p += 4, col += 4 * 32) {
			x8_prefetch(&pf, col + 4 * 32);
			for (int j = 0; j < 4; j++)
				acc[j] = dp_bf16_pair(
				    acc[j], _mm256_loadu_si256((const void *)(col + 32 * j)), act,
				    0, 0, p + (size_t)j);
		}
		_mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]),
		                                    _mm256_add_ps(acc[2], acc[3])));
		return;
	}
	__m256 ev[8], od[8];
	for (int t = 0; t < NT; t++)
		ev[t] = od[t] = _mm256_setzero_ps();
	for (size_t p = 0; p < k / 2; p += 2, col += 2 * 32) {
		x8_prefetch(&pf, col + 2 * 32);
		const __m256i w0 = _mm256_loadu_si256((const void *)col);
		const __m256i w1 = _mm256_loadu_si256((const void *)(col + 32));
		for (int t = 0; t < NT; t++) {
			ev[t] = dp_bf16_pair(ev[t], w0, act, as, t, p);
			od[t] = dp_bf16_pair(od[t], w1, act, as, t, p + 1);
		}
	}
	for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(out + 8 * t, _mm256_add_ps(ev[t], od[t]));
}

X8_ENTRY(x8_bf16, x8_bf16_body, 0, )
X8_ENTRY(x8_bf16_exact, x8_bf16_body, 1, )

/* ---- The table -------------------------------------------------------------------------- */

/* Decode: BF16 on vdpbf16ps, the others as AVX2's; prefill: AVX2's tiles. */
/* ---- Prefill: bf16 tiles ----------------------------------------------------------------- */

enum { TILE_BF16_ROWS = 12 }; /* rows per register block: 24 accumulators with 2 panels */

/* R rows x P panels (P 1 or 2) over k (a multiple of 2 here; 32 by the contract): for each
 * pair of k, the panels' 16 token pairs (one load each) against each row's broadcast weight
 * pair. Each accumulator lane is one vdpbf16ps chain over k: the blocking never changes a sum. */
static inline __attribute__((always_inline)) void bf16_block(const uint16_t *w, size_t ldw,
                                                             const uint16_t *xp, size_t xs,
                                                             size_t k, float *c, size_t ldc,
                                                             const int R, const int P)
{
	__m512 acc[TILE_BF16_ROWS][2];
#pragma GCC unroll 12
	for (int r = 0; r < R; r++)
#pragma GCC unroll 2
		for (int p = 0; p < P; p++)
			acc[r][p] = _mm512_loadu_ps(c + r * ldc + p * 16);
	for (size_t i = 0; i < k; i += 2) {
		const __m512i x0 = _mm512_loadu_si512(xp + i * 16);
		const __m512i x1 = P > 1 ? _mm512_loadu_si512(xp + xs + i * 16) : x0;
#pragma GCC unroll 12
		for (int r = 0; r < R; r++) {
			int32_t pair;
			memcpy(&pair, w + r * ldw + i, sizeof(pair));
			const __m512bh b = (__m512bh)_mm512_set1_epi32(pair);
			acc[r][0] = _mm512_dpbf16_ps(acc[r][0], b, (__m512bh)x0);
			if (P > 1)
				acc[r][1] = _mm512_dpbf16_ps(acc[r][1], b, (__m512bh)x1);
		}
	}
#pragma GCC unroll 12
	for (int r = 0; r < R; r++)
#pragma GCC unroll 2
		for (int p = 0; p < P; p++)
			_mm512_storeu_ps(c + r * ldc + p * 16, acc[r][p]);
}

typedef void (*bf16_block_fn)(const uint16_t *w, size_t ldw, const uint16_t *xp, size_t xs,
                              size_t k, float *c, size_t ldc);
#define BF16_BLOCK(R)                                                                              \
	static void bf16_block_##R##x1(const uint16_t *w, size_t ldw, const uint16_t *xp,          \
	                               size_t xs, size_t k, float *c, size_t ldc)                  \
	{                                                                                          \
		bf16_block(w, ldw, xp, xs, k, c, ldc, R, 1);                                       \
	}                                                                                          \
	static void bf16_block_##R##x2(const uint16_t *w, size_t ldw, const uint16_t *xp,          \
	                               size_t xs, size_t k, float *c, size_t ldc)                  \
	{                                                                                          \
		bf16_block(w, ldw, xp, xs, k, c, ldc, R, 2);                                       \
	}
BF16_BLOCK(1)
BF16_BLOCK(2)
BF16_BLOCK(3)
BF16_BLOCK(4)
BF16_BLOCK(5)
BF16_BLOCK(6)
BF16_BLOCK(7)
BF16_BLOCK(8)
BF16_BLOCK(9)
BF16_BLOCK(10)
BF16_BLOCK(11)
BF16_BLOCK(12)
#undef BF16_BLOCK

/* [panels - 1][rows - 1] */
static const bf16_block_fn bf16_blocks[2][TILE_BF16_ROWS] = {
    {bf16_block_1x1, bf16_block_2x1, bf16_block_3x1, bf16_block_4x1, bf16_block_5x1, bf16_block_6x1,
     bf16_block_7x1, bf16_block_8x1, bf16_block_9x1, bf16_block_10x1, bf16_block_11x1,
     bf16_block_12x1},
    {bf16_block_1x2, bf16_block_2x2, bf16_block_3x2, bf16_block_4x2, bf16_block_5x2, bf16_block_6x2,
     bf16_block_7x2, bf16_block_8x2, bf16_block_9x2, bf16_block_10x2, bf16_block_11x2,
     bf16_block_12x2},
};

static void tile_bf16(const uint16_t *w, size_t ldw, size_t nr, const uint16_t *xp,
                      size_t xp_stride, size_t np, size_t k, float *c, size_t ldc)
{
	for (size_t p = 0; p < np; p += 2) {
		const size_t panels = np - p < 2 ? np - p : 2;
		for (size_t r = 0; r < nr; r += TILE_BF16_ROWS) {
			const size_t rows = nr - r < TILE_BF16_ROWS ? nr - r : TILE_BF16_ROWS;
			bf16_blocks[panels - 1][rows - 1](w + r * ldw, ldw, xp + p * xp_stride,
			                                  xp_stride, k, c + r * ldc + p * 16, ldc);
		}
	}
}

/* f32 → bf16, round to nearest even (NaN stays NaN), 32 at a time, the tail masked. */
static void round_bf16(const float *src, uint16_t *dst, size_t n)
{
	size_t i = 0;
	for (; i + 32 <= n; i += 32) {
		const __m512bh b =
		    _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
		_mm512_storeu_si512(dst + i, (__m512i)b);
	}
	for (; i < n; i += 16) {
		const __mmask16 m =
		    n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
		const __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
		_mm256_mask_storeu_epi16(dst + i, m, (__m256i)b);
	}
}

#define STR_(x) #x
#define STR(x) STR_(x)
#define FROM(n) "avx512 vdpbf16ps tiles from " STR(n) " tokens"

/* Prefill: the bf16 tiles for the formats they take (the GGUF rows' count; interleaved BF16
 * from MOEK_PREFILL_MIN_TOKENS_BF16_GROUPS), AVX2's f32 tiles for the rest. */
static const char *describe_prefill(uint32_t format)
{
	if (!moek_tile_bf16_takes(format))
		return moek_avx2_ops.describe(format, true);
	switch (format) {
	case MOEK_BF16: return FROM(MOEK_PREFILL_MIN_TOKENS_BF16_ROWS);
	case MOEK_F16: return FROM(MOEK_PREFILL_MIN_TOKENS_BF16_F16);
	case MOEK_Q8_0: return FROM(MOEK_PREFILL_MIN_TOKENS_BF16_Q8_0);
	default: return FROM(MOEK_PREFILL_MIN_TOKENS_BF16);
	}
}

static void prefill_build(void)
{
	moek_avx512_ops.tile_bf16 = tile_bf16;
	/* where the bf16 tiles beat the decode dots (kernels_internal.h has the measurements):
	 * [0] GGUF rows, [1] interleaved groups */
	unsigned(*from)[MOEK_FMT_SLOTS] = moek_avx512_ops.tile_bf16_from;
	for (unsigned f = 0; f < MOEK_FMT_SLOTS; f++)
		from[0][f] = from[1][f] = MOEK_PREFILL_MIN_TOKENS_BF16;
	from[0][MOEK_FMT_BF16] = MOEK_PREFILL_MIN_TOKENS_BF16_ROWS;
	from[1][MOEK_FMT_BF16] = MOEK_PREFILL_MIN_TOKENS_BF16_GROUPS;
	from[0][MOEK_FMT_F16] = from[1][MOEK_FMT_F16] = MOEK_PREFILL_MIN_TOKENS_BF16_F16;
	from[0][MOEK_FMT_Q8_0] = from[1][MOEK_FMT_Q8_0] = MOEK_PREFILL_MIN_TOKENS_BF16_Q8_0;
	moek_avx512_ops.round_bf16 = round_bf16;
}

/* ---- The table ------------------------------------------------------------------------- */

static const char *describe(uint32_t format, bool prefill)
{
	if (prefill)
		return describe_prefill(format);
	if (format == MOEK_BF16)
		return "avx512 vdpbf16ps row and group dots (one token on wide rows: avx2 fma)";
	return moek_avx2_ops.describe(format, prefill);
}

void moek_avx512_build(void)
{
	moek_avx512_ops = moek_avx2_ops;
	moek_avx512_ops.name = "avx512";
	moek_avx512_ops.describe = describe;
	moek_avx512_ops.dot[MOEK_FMT_BF16] = dot_bf16;
	moek_avx512_ops.dot_rows[MOEK_FMT_BF16] = rows_bf16;
	moek_avx512_ops.dot_x8[MOEK_FMT_BF16] = x8_bf16;
	moek_avx512_ops.dot_exact[MOEK_FMT_BF16] = dot_bf16_exact;
	moek_avx512_ops.dot_x8_exact[MOEK_FMT_BF16] = x8_bf16_exact;
	prefill_build();
}
