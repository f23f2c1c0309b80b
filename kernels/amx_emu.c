/* amx_emu.c — x86_amx_tile.h's micro-kernel on a plain-C model of the AMX tiles, so that the
 * tests check on any CPU everything the hardware kernel does but the instructions.
 *
 * The model follows the Intel SDM (vol. 2: LDTILECFG, TILELOADD, TILESTORED, TDPBF16PS,
 * TILERELEASE; vol. 1 ch. 3, "Intel AMX"): 8 tiles of up to 16 rows x 64 bytes, each with the
 * rows and bytes per row the configuration gave it. Whatever the hardware would refuse — a
 * configuration outside palette 1, a tile used beyond or without its configuration, operand
 * shapes a tdpbf16ps cannot multiply — aborts with a message, in every build (not assert:
 * release builds run these tests too).
 *
 * TDPBF16PS is modelled as the SDM's pseudocode: per (m, n), two f32 sums from zero, of the
 * even and of the odd products of the 16 pairs in k order, each step an FMA rounded to
 * nearest even; their sum added to the tile's element. Inputs that are denormal (the bf16
 * operands and the tile's element) count as zero, and each rounded result that is denormal
 * becomes a zero of its sign (DAZ, FTZ); MXCSR plays no part. The product of two bf16 values
 * is exact in f32 but where it leaves f32's range, so an FMA step is the product added once.
 * The hardware's adder tree need not round in that order (the SDM gives the order, the
 * Intrinsics Guide another): tests hold the hardware to a tolerance, the model to bits.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels_internal.h"
#include "x86_amx_tile.h"

struct amx_emu {
	struct moek_amx_tilecfg cfg;
	bool configured;
	uint8_t tmm[8][16][64]; /* tile t, row, byte; beyond the configured shape: zero */
};

__attribute__((noreturn, format(printf, 1, 2))) static void emu_fault(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("amx emulator: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	abort();
}
#define EMU_CHECK(cond, ...)                                                                       \
	do {                                                                                       \
		if (!(cond))                                                                       \
			emu_fault(__VA_ARGS__);                                                    \
	} while (0)

static void emu_loadconfig(struct amx_emu *e, const struct moek_amx_tilecfg *cfg)
{
	memset(e->tmm, 0, sizeof(e->tmm)); /* ldtilecfg zeroes every tile */
	if (cfg->palette == 0) {           /* palette 0: the init state, as tilerelease */
		e->configured = false;
		return;
	}
	EMU_CHECK(cfg->palette == 1, "palette %u (#GP): only palette 1 exists", cfg->palette);
	EMU_CHECK(cfg->start_row == 0, "start_row %u: only a faulted tile access sets it",
	          cfg->start_row);
	for (size_t i = 0; i < sizeof(cfg->reserved); i++)
		EMU_CHECK(cfg->reserved[i] == 0, "reserved byte %zu not zero (#GP)", i + 2);
	for (unsigned t = 0; t < 16; t++) {
		const unsigned rows = cfg->rows[t], colsb = cfg->colsb[t];
		if (t >= AMX_TILES) {
			EMU_CHECK(rows == 0 && colsb == 0,
			          "tile %u configured (#GP): palette 1 has 8", t);
			continue;
		}
		EMU_CHECK(rows <= AMX_MAX_ROWS && colsb <= AMX_ROW_BYTES,
		          "tile %u: %u rows x %u bytes (#GP): at most 16 x 64", t, rows, colsb);
		EMU_CHECK((rows == 0) == (colsb == 0), "tile %u: %u rows x %u bytes (#GP)", t, rows,
		          colsb);
	}
	e->cfg = *cfg;
	e->configured = true;
}

/* A tile the configuration gave rows and bytes, for an instruction named op */
static void emu_check_tile(const struct amx_emu *e, unsigned t, const char *op)
{
	EMU_CHECK(e->configured, "%s tmm%u with the tiles not configured (#UD)", op, t);
	EMU_CHECK(t < AMX_TILES, "%s tmm%u: no such tile", op, t);
	EMU_CHECK(e->cfg.rows[t] > 0, "%s tmm%u: the tile is not configured (#UD)", op, t);
}

static void emu_load(struct amx_emu *e, unsigned t, const void *base, size_t stride)
{
	emu_check_tile(e, t, "tileloadd");
	memset(e->tmm[t], 0, sizeof(e->tmm[t])); /* rows and bytes past the shape: zero */
	for (unsigned r = 0; r < e->cfg.rows[t]; r++)
		memcpy(e->tmm[t][r], (const uint8_t *)base + r * stride, e->cfg.colsb[t]);
}

static void emu_store(const struct amx_emu *e, unsigned t, void *base, size_t stride)
{
	emu_check_tile(e, t, "tilestored");
	for (unsigned r = 0; r < e->cfg.rows[t]; r++)
		memcpy((uint8_t *)base + r * stride, e->tmm[t][r], e->cfg.colsb[t]);
}

static float emu_daz(float x)
{
	return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x;
}
#define emu_ftz emu_daz

static float emu_bf16(const uint8_t *p) /* a bf16 operand, DAZ */
{
	const uint32_t bits = (uint32_t)(p[0] | p[1] << 8) << 16;
	float f;
	memcpy(&f, &bits, sizeof(f));
	return emu_daz(f);
}

/* The shape checks every tile multiply makes (SDM: exception class AMX-E4) */
static void emu_check_multiply(const struct amx_emu *e, const char *op, unsigned c, unsigned a,
                               unsigned b)
{
	emu_check_tile(e, c, op), emu_check_tile(e, a, op), emu_check_tile(e, b, op);
	const struct moek_amx_tilecfg *cfg = &e->cfg;
	EMU_CHECK(c != a && c != b && a != b, "%s tmm%u, tmm%u, tmm%u: repeated tile (#UD)", op, c,
	          a, b);
	EMU_CHECK(cfg->colsb[c] % 4 == 0 && cfg->colsb[a] % 4 == 0 && cfg->colsb[b] % 4 == 0,
	          "%s: bytes per row not a multiple of 4 (#UD)", op);
	EMU_CHECK(cfg->rows[c] == cfg->rows[a], "%s: C has %u rows, A %u (#UD)", op, cfg->rows[c],
	          cfg->rows[a]);
	EMU_CHECK(cfg->colsb[a] / 4 == cfg->rows[b], "%s: A has %u dwords a row, B %u rows (#UD)",
	          op, cfg->colsb[a] / 4, cfg->rows[b]);
	EMU_CHECK(cfg->colsb[c] == cfg->colsb[b], "%s: C rows of %u bytes, B of %u (#UD)", op,
	          cfg->colsb[c], cfg->colsb[b]);
}

static void emu_dpbf16ps(struct amx_emu *e, unsigned c, unsigned a, unsigned b)
{
	emu_check_multiply(e, "tdpbf16ps", c, a, b);
	const struct moek_amx_tilecfg *cfg = &e->cfg;
	const unsigned pairs = cfg->colsb[a] / 4, cols = cfg->colsb[c] / 4;
	for (unsigned m = 0; m < cfg->rows[c]; m++) {
		for (unsigned n = 0; n < cols; n++) {
			float even = 0.0f, odd = 0.0f;
			for (unsigned kk = 0; kk < pairs; kk++) {
				const uint8_t *pa = e->tmm[a][m] + 4 * kk,
				              *pb = e->tmm[b][kk] + 4 * n;
				even = emu_ftz(fmaf(emu_bf16(pa), emu_bf16(pb), even));
				odd = emu_ftz(fmaf(emu_bf16(pa + 2), emu_bf16(pb + 2), odd));
			}
			float acc;
			memcpy(&acc, e->tmm[c][m] + 4 * n, sizeof(acc));
			acc = emu_ftz(emu_daz(acc) + emu_ftz(even + odd));
			memcpy(e->tmm[c][m] + 4 * n, &acc, sizeof(acc));
		}
	}
}

static void emu_zero(struct amx_emu *e, unsigned t)
{
	emu_check_tile(e, t, "tilezero");
	memset(e->tmm[t], 0, sizeof(e->tmm[t]));
}

/* TDPBSSD: C[m][n] += Σ_kk Σ_i A[m][4 kk + i] · B[kk][4 n + i], signed bytes, int32 wrapping */
static void emu_dpbssd(struct amx_emu *e, unsigned c, unsigned a, unsigned b)
{
	emu_check_multiply(e, "tdpbssd", c, a, b);
	const unsigned quads = e->cfg.colsb[a] / 4, cols = e->cfg.colsb[c] / 4;
	for (unsigned m = 0; m < e->cfg.rows[c]; m++)
		for (unsigned n = 0; n < cols; n++) {
			uint32_t acc;
			memcpy(&acc, e->tmm[c][m] + 4 * n, sizeof(acc));
			for (unsigned kk = 0; kk < quads; kk++)
				for (unsigned i = 0; i < 4; i++)
					acc +=
					    (uint32_t)((int32_t)(int8_t)e->tmm[a][m][4 * kk + i] *
					               (int8_t)e->tmm[b][kk][4 * n + i]);
			memcpy(e->tmm[c][m] + 4 * n, &acc, sizeof(acc));
		}
}

static void emu_release(struct amx_emu *e)
{
	memset(e->tmm, 0, sizeof(e->tmm));
	e->configured = false;
}

#define AMX_BACKEND struct amx_emu
#define AMX_LOADCONFIG(be, cfg) emu_loadconfig(be, cfg)
#define AMX_LOAD(be, t, base, stride) emu_load(be, t, base, stride)
#define AMX_STORE(be, t, base, stride) emu_store(be, t, base, stride)
#define AMX_ZERO(be, t) emu_zero(be, t)
#define AMX_DPBF16PS(be, c, a, b) emu_dpbf16ps(be, c, a, b)
#define AMX_DPBSSD(be, c, a, b) emu_dpbssd(be, c, a, b)
#define AMX_RELEASE(be) emu_release(be)
#include "x86_amx_tile.h"

void moek_amx_tile_bf16_emulated(const uint16_t *w, size_t ldw, size_t nr, const uint16_t *xp,
                                 size_t xp_stride, size_t np, size_t k, float *c, size_t ldc)
{
	/* a thread's tiles start unconfigured (the init state): use before ldtilecfg faults */
	struct amx_emu emu = {.configured = false};
	amx_tile_bf16_run(&emu, w, ldw, nr, xp, xp_stride, np, k, c, ldc);
	EMU_CHECK(!emu.configured, "the kernel returned holding tile state (no tilerelease)");
}

void moek_amx_tile_q8_0_emulated(const void *w, size_t ldw, size_t nr, const void *xp,
                                 size_t xp_stride, size_t np, size_t k, float *c, size_t ldc)
{
	struct amx_emu emu = {.configured = false};
	amx_tile_q8_0_run(&emu, w, ldw, nr, xp, xp_stride, np, k, c, ldc);
	EMU_CHECK(!emu.configured, "the kernel returned holding tile state (no tilerelease)");
}
