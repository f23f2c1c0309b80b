/* x86_amx_tile.h — the AMX prefill micro-kernels (BF16, Q8_0), each written once for two
 * backends: the tile instructions (x86_amx.c, moek_amx_tile_bf16 / _q8_0) and a plain-C model of
 * them (amx_emu.c, moek_amx_tile_bf16_emulated / _q8_0_emulated) that the tests run on any CPU.
 * Everything but the instructions themselves — the tile configuration, the loop over 32-row groups,
 * panel pairs and 32-column k steps, every tile's address and stride, the row and panel edges — is
 * this file, so what the emulated runs check is what the hardware runs.
 *
 * Included once for struct moek_amx_tilecfg; the kernels come with the inclusion that follows
 * the backend's definition: AMX_BACKEND (the type its state pointer `be` points to: void for the
 * hardware) and the tile operations, tile numbers being literals (GCC's intrinsics paste them
 * into the instruction's text):
 *   AMX_LOADCONFIG(be, cfg)        ldtilecfg from a const struct moek_amx_tilecfg *
 *   AMX_LOAD(be, t, base, stride)  tileloadd: the tile's rows of colsb bytes, stride bytes apart
 *   AMX_STORE(be, t, base, stride) tilestored
 *   AMX_ZERO(be, t)                tilezero
 *   AMX_DPBF16PS(be, c, a, b)      tdpbf16ps tmm_c, tmm_a, tmm_b
 *   AMX_DPBSSD(be, c, a, b)        tdpbssd tmm_c, tmm_a, tmm_b
 *   AMX_RELEASE(be)                tilerelease
 *
 * Tiles (palette 1: 8 tiles of up to 16 rows x 64 bytes): tmm4, tmm5 hold 16 weight rows x 32
 * bf16 each (rows r0..r0+15 and r0+16..r0+31 of a 32-row group); tmm6, tmm7 one k step of two
 * panels (16 pairs of k x 16 tokens, the panel layout unchanged); tmm0..3 the f32 sums of
 * (rows block i, panel q) in tmm(2i + q), each 16 rows x 16 tokens. A group of fewer than 32
 * rows is a configuration with fewer rows in its tiles, not a padded copy, so the kernel never
 * reads or writes a row past nr; an odd last panel leaves tmm1, tmm3 and tmm7 unused.
 *
 * The Q8_0 kernel keeps the same tiles and edges, one 32-column block per step: tmm4, tmm5
 * take the 32 codes of 16 rows' block straight from the Q8_0 rows (32 bytes a row, the row
 * length apart), tmm6, tmm7 a panel block's 8 quads of k x 16 tokens, tmm0..3 the block's
 * int32 dot products, which go through memory to be scaled into f32 sums there: scales
 * differ per block, so a tile sums one block (tmul_maxk's 16 dwords would take two).
 */
#ifndef MOE_X86_AMX_TILE_H
#define MOE_X86_AMX_TILE_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels_internal.h"

/* LDTILECFG's 64-byte operand (Intel SDM vol. 2, LDTILECFG, "Memory Area Layout"): palette 1
 * names 8 tiles, so colsb[8..15] and rows[8..15] must be zero, as the reserved bytes. */
struct moek_amx_tilecfg {
	uint8_t palette;   /* 1: 8 tiles of up to 16 rows x 64 bytes; 0: tiles off */
	uint8_t start_row; /* 0: where a faulting tile load or store resumes, set by the CPU */
	uint8_t reserved[14];
	uint16_t colsb[16]; /* bytes per row of tile i */
	uint8_t rows[16];   /* rows of tile i */
};
static_assert(sizeof(struct moek_amx_tilecfg) == 64, "LDTILECFG operand");
static_assert(offsetof(struct moek_amx_tilecfg, colsb) == 16, "LDTILECFG colsb");
static_assert(offsetof(struct moek_amx_tilecfg, rows) == 48, "LDTILECFG rows");

/* Palette 1's limits (CPUID leaf 1DH: max_rows 16, bytes_per_row 64; leaf 1EH: tmul_maxk 16) */
enum { AMX_MAX_ROWS = 16, AMX_ROW_BYTES = 64, AMX_TILES = 8 };

/* The BF16 kernel's configuration for a group of rows0 + rows1 weight rows (rows0 1..16, rows1
 * 0..16; rows1 = 0 leaves tmm2, tmm3 and tmm5 unconfigured: rows and colsb both zero). */
static inline void amx_bf16_config(struct moek_amx_tilecfg *cfg, unsigned rows0, unsigned rows1)
{
	assert(rows0 >= 1 && rows0 <= AMX_MAX_ROWS && rows1 <= AMX_MAX_ROWS);
	memset(cfg, 0, sizeof(*cfg));
	cfg->palette = 1;
	const unsigned rows[AMX_TILES] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
	for (unsigned t = 0; t < AMX_TILES; t++) {
		cfg->rows[t] = (uint8_t)rows[t];
		cfg->colsb[t] = rows[t] ? AMX_ROW_BYTES : 0;
	}
}

/* The Q8_0 kernel's configuration: A tiles of 16 rows x 32 bytes (one block), B tiles of 8
 * quads x 64 bytes, C tiles of int32 sums as the BF16 kernel's */
static inline void amx_q8_0_config(struct moek_amx_tilecfg *cfg, unsigned rows0, unsigned rows1)
{
	amx_bf16_config(cfg, rows0, rows1);
	cfg->colsb[4] = 32;
	cfg->colsb[5] = rows1 ? 32 : 0;
	cfg->rows[6] = cfg->rows[7] = 8;
}

#endif /* MOE_X86_AMX_TILE_H */

#if defined(AMX_BACKEND) && !defined(MOE_X86_AMX_TILE_KERNEL)
#define MOE_X86_AMX_TILE_KERNEL
#if !defined(AMX_LOADCONFIG) || !defined(AMX_LOAD) || !defined(AMX_STORE) || !defined(AMX_ZERO) || \
    !defined(AMX_DPBF16PS) || !defined(AMX_DPBSSD) || !defined(AMX_RELEASE)
#error "x86_amx_tile.h: define the backend (AMX_BACKEND and the tile operations) first"
#endif

/* The BF16 micro-kernel (kernels_internal.h, moek_amx_tile_bf16, has the contract). The k loop is
 * innermost and the same 32-column steps for every row and token, each a tdpbf16ps into sums
 * loaded from c, so an (r, j) sum does not depend on nr, np or the row's place in a tile. */
static inline __attribute__((always_inline)) void
amx_tile_bf16_run(AMX_BACKEND *be, const uint16_t *w, size_t ldw, size_t nr, const uint16_t *xp,
                  size_t xp_stride, size_t np, size_t k, float *c, size_t ldc)
{
	(void)be; /* the hardware's state is the CPU's */
	assert(k % 32 == 0 && ldw >= k && (nr <= 1 || ldc >= np * 16));
	if (nr == 0 || np == 0 || k == 0)
		return;
	/* byte strides: weight rows, sum rows; a k step of a panel is 16 rows of 64 bytes */
	const size_t a_stride = ldw * sizeof(uint16_t), c_stride = ldc * sizeof(float);
	const size_t b_stride = AMX_ROW_BYTES;
	struct moek_amx_tilecfg cfg;
	unsigned loaded0 = 0, loaded1 = 0; /* the configuration loaded (rows0 0: none yet) */
	for (size_t r0 = 0; r0 < nr; r0 += 32) {
		const unsigned rows = nr - r0 < 32 ? (unsigned)(nr - r0) : 32;
		const unsigned rows0 = rows < 16 ? rows : 16, rows1 = rows - rows0;
		if (rows0 != loaded0 || rows1 != loaded1) {
			amx_bf16_config(&cfg, rows0, rows1);
			AMX_LOADCONFIG(be, &cfg);
			loaded0 = rows0, loaded1 = rows1;
		}
		const uint16_t *a0 = w + r0 * ldw;
		const uint16_t *a1 = rows1 ? a0 + 16 * ldw : NULL;
		for (size_t p = 0; p < np; p += 2) {
			const bool two = p + 1 < np;
			float *c00 = c + r0 * ldc + p * 16;
			float *c01 = two ? c00 + 16 : NULL;
			float *c10 = rows1 ? c00 + 16 * ldc : NULL;
			float *c11 = rows1 && two ? c10 + 16 : NULL;
			const uint16_t *b0 = xp + p * xp_stride;
			const uint16_t *b1 = two ? b0 + xp_stride : NULL;
			AMX_LOAD(be, 0, c00, c_stride);
			if (two)
				AMX_LOAD(be, 1, c01, c_stride);
			if (rows1) {
				AMX_LOAD(be, 2, c10, c_stride);
				if (two)
					AMX_LOAD(be, 3, c11, c_stride);
			}
			/* step s: weight columns s..s+31, panel pairs s/2..s/2+15 (element s * 16)
			 */
			for (size_t s = 0; s < k; s += 32) {
				AMX_LOAD(be, 4, a0 + s, a_stride);
				AMX_LOAD(be, 6, b0 + s * 16, b_stride);
				AMX_DPBF16PS(be, 0, 4, 6);
				if (two) {
					AMX_LOAD(be, 7, b1 + s * 16, b_stride);
					AMX_DPBF16PS(be, 1, 4, 7);
				}
				if (rows1) {
					AMX_LOAD(be, 5, a1 + s, a_stride);
					AMX_DPBF16PS(be, 2, 5, 6);
					if (two)
						AMX_DPBF16PS(be, 3, 5, 7);
				}
			}
			AMX_STORE(be, 0, c00, c_stride);
			if (two)
				AMX_STORE(be, 1, c01, c_stride);
			if (rows1) {
				AMX_STORE(be, 2, c10, c_stride);
				if (two)
					AMX_STORE(be, 3, c11, c_stride);
			}
		}
	}
	AMX_RELEASE(be);
}

/* The Q8_0 micro-kernel (kernels_internal.h, moek_amx_tile_q8_0, has the contract). Per
 * block, in k order: the exact int32 dot of the codes (tdpbssd from zero), then, in plain C
 * shared by both backends (ISO C: no contraction), sum += (d_w · d_x) · dot. */
static inline __attribute__((always_inline)) void
amx_tile_q8_0_run(AMX_BACKEND *be, const void *w, size_t ldw, size_t nr, const void *xp,
                  size_t xp_stride, size_t np, size_t k, float *c, size_t ldc)
{
	(void)be;
	const size_t nb = k / QK8_0, bb = sizeof(struct block_q8_0);
	assert(k % QK8_0 == 0 && (nr <= 1 || ldw >= nb * bb) && (nr <= 1 || ldc >= np * 16));
	assert(np <= 1 || xp_stride >= nb * sizeof(struct moek_q8_panel_block));
	if (nr == 0 || np == 0 || k == 0)
		return;
	struct moek_amx_tilecfg cfg;
	unsigned loaded0 = 0, loaded1 = 0;
	int32_t dots[4][16][16]; /* tmm(2i + q)'s int32 sums, 64 bytes a row */
	float dw[32];
	for (size_t r0 = 0; r0 < nr; r0 += 32) {
		const unsigned rows = nr - r0 < 32 ? (unsigned)(nr - r0) : 32;
		const unsigned rows0 = rows < 16 ? rows : 16, rows1 = rows - rows0;
		if (rows0 != loaded0 || rows1 != loaded1) {
			amx_q8_0_config(&cfg, rows0, rows1);
			AMX_LOADCONFIG(be, &cfg);
			loaded0 = rows0, loaded1 = rows1;
		}
		const uint8_t *wg = (const uint8_t *)w + r0 * ldw;
		for (size_t p = 0; p < np; p += 2) {
			const bool two = p + 1 < np;
			const struct moek_q8_panel_block *x0 =
			    (const struct moek_q8_panel_block *)((const uint8_t *)xp +
			                                         p * xp_stride);
			const struct moek_q8_panel_block *x1 =
			    two ? (const struct moek_q8_panel_block *)((const uint8_t *)x0 +
			                                               xp_stride)
			        : NULL;
			float *cg = c + r0 * ldc + p * 16;
			for (size_t b = 0; b < nb; b++) {
				const uint8_t *a0 = wg + b * bb;
				for (unsigned m = 0; m < rows; m++) {
					uint16_t d;
					memcpy(&d, a0 + m * ldw + offsetof(struct block_q8_0, d),
					       2);
					dw[m] = moek_f16_to_f32(d);
				}
				const uint8_t *q0 = a0 + offsetof(struct block_q8_0, qs);
				AMX_ZERO(be, 0);
				AMX_LOAD(be, 4, q0, ldw);
				AMX_LOAD(be, 6, x0[b].qs, 64);
				AMX_DPBSSD(be, 0, 4, 6);
				if (two) {
					AMX_ZERO(be, 1);
					AMX_LOAD(be, 7, x1[b].qs, 64);
					AMX_DPBSSD(be, 1, 4, 7);
				}
				if (rows1) {
					AMX_ZERO(be, 2);
					AMX_LOAD(be, 5, q0 + 16 * ldw, ldw);
					AMX_DPBSSD(be, 2, 5, 6);
					if (two) {
						AMX_ZERO(be, 3);
						AMX_DPBSSD(be, 3, 5, 7);
					}
				}
				AMX_STORE(be, 0, dots[0], 64);
				if (two)
					AMX_STORE(be, 1, dots[1], 64);
				if (rows1) {
					AMX_STORE(be, 2, dots[2], 64);
					if (two)
						AMX_STORE(be, 3, dots[3], 64);
				}
				/* per sum tile: 16 sums a row, the same steps on every element */
				for (unsigned t = 0; t < 4; t++) {
					const unsigned i = t / 2, q = t % 2, mn = i ? rows1 : rows0;
					if (q && !two)
						continue;
					const float *dx = (q ? x1 : x0)[b].d;
					for (unsigned m = 0; m < mn; m++) {
						float *cr = cg + (16 * i + m) * ldc + 16 * q;
						const float dr = dw[16 * i + m];
						for (unsigned n = 0; n < 16; n++)
							cr[n] = cr[n] +
							        dr * dx[n] * (float)dots[t][m][n];
					}
				}
			}
		}
	}
	AMX_RELEASE(be);
}

#endif /* AMX_BACKEND */
