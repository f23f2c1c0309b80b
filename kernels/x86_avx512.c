/* x86_avx512.c — the avx512 ISA: AVX2's kernels, with AVX-512 ones where they pay.
 *
 * The table starts as a copy of moek_avx2_ops (every format keeps a complete path) and then
 * takes this file's entries. It is only ever made active on a CPU with AVX512 F/BW/VL/DQ,
 * VNNI and BF16 (isa.c), so the whole file is built for them.
 *
 * Prefill: bf16 tiles (moek_tile_bf16_fn) on vdpbf16ps — 12 rows x 2 panels of 16 tokens in 24
 * zmm accumulators, one weight pair broadcast per row against a panel's 16 token pairs — for
 * every format moek_tile_bf16_takes, weights dequantized by AVX2's dequantize_row and rounded
 * to bf16 (vcvtne2ps2bf16) once per tile, activations rounded once per token.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels_internal.h"

struct moek_isa_ops moek_avx512_ops;

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

/* Where the bf16 tiles beat the decode dots (kernels_internal.h has the measurements). */
static unsigned tile_bf16_from(uint32_t format, bool interleaved)
{
	switch (format) {
	case MOEK_BF16:
		return interleaved ? MOEK_PREFILL_MIN_TOKENS_BF16_GROUPS
		                   : MOEK_PREFILL_MIN_TOKENS_BF16_ROWS;
	case MOEK_F16: return MOEK_PREFILL_MIN_TOKENS_BF16_F16;
	case MOEK_Q8_0: return MOEK_PREFILL_MIN_TOKENS_BF16_Q8_0;
	default: return MOEK_PREFILL_MIN_TOKENS_BF16;
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
	moek_avx512_ops.tile_bf16_from = tile_bf16_from;
	moek_avx512_ops.round_bf16 = round_bf16;
}

/* ---- The table ------------------------------------------------------------------------- */

static const char *describe(uint32_t format, bool prefill)
{
	if (prefill)
		return describe_prefill(format);
	return moek_avx2_ops.describe(format, prefill);
}

void moek_avx512_build(void)
{
	moek_avx512_ops = moek_avx2_ops;
	moek_avx512_ops.name = "avx512";
	moek_avx512_ops.describe = describe;
	prefill_build();
}
