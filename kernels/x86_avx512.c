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
                                 const int NT, size_t k, float *out, int unused)
{
	(void)sr, (void)unused;
	const uint16_t *a = w;
	const bool far = wide_activation(k * sizeof(uint16_t));
	__m512 acc[8], acc1 = _mm512_setzero_ps();
	for (int t = 0; t < NT; t++)
		acc[t] = _mm512_setzero_ps();
	size_t i = 0;
	if (NT == 1) {
		const uint16_t *x = act;
		for (; i + 64 <= k; i += 64) {
			prefetch_ahead(a + i, far);
			prefetch_ahead(a + i + 32, far);
			acc[0] = dp_bf16x32(acc[0], _mm512_loadu_si512(a + i),
			                    _mm512_loadu_si512(x + i));
			acc1 = dp_bf16x32(acc1, _mm512_loadu_si512(a + i + 32),
			                  _mm512_loadu_si512(x + i + 32));
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
	if (NT == 1)
		acc[0] = _mm512_add_ps(acc[0], acc1);
	for (int t = 0; t < NT; t++)
		out[t] = _mm512_reduce_add_ps(acc[t]);
}

DOT_ENTRY(dot_bf16_zmm, bf16_row_body, 0)
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
		moek_avx2_ops.dot[MOEK_BF16](w, sr, act, as, 1, k, out);
	else
		dot_bf16_zmm(w, sr, act, as, nt, k, out);
}

static void rows_bf16(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                      float *out)
{
	if (bf16_wide_row(k))
		moek_avx2_ops.dot_rows[MOEK_BF16](w, stride, nr, act, k, out);
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
ALWAYS_INLINE void x8_bf16_body(const void *group, const void *act, size_t as, const int NT,
                                size_t k, float *out, int unused)
{
	(void)unused;
	const uint8_t *col = group;
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

/* ---- The table -------------------------------------------------------------------------- */

/* Decode: BF16 on vdpbf16ps, the others as AVX2's; prefill: AVX2's tiles. */
static const char *describe(uint32_t format, bool prefill)
{
	if (!prefill && format == MOEK_BF16)
		return "avx512 vdpbf16ps row and group dots (one token on wide rows: avx2 fma)";
	return moek_avx2_ops.describe(format, prefill);
}

void moek_avx512_build(void)
{
	moek_avx512_ops = moek_avx2_ops;
	moek_avx512_ops.name = "avx512";
	moek_avx512_ops.describe = describe;
	moek_avx512_ops.dot[MOEK_BF16] = dot_bf16;
	moek_avx512_ops.dot_rows[MOEK_BF16] = rows_bf16;
	moek_avx512_ops.dot_x8[MOEK_BF16] = x8_bf16;
}
