/* x86_amx.c — the amx ISA: the avx512 table with AMX tiles (BF16, INT8) where they pay.
 *
 * Only made active on a CPU with AMX-TILE/BF16/INT8 whose kernel granted this process the
 * tile data (isa.c), so the whole file is built for them.
 *
 * moek_amx_tile_bf16 and moek_amx_tile_q8_0 are x86_amx_tile.h's micro-kernels on the tile
 * instructions. The tile
 * configuration is per-thread state that other code in the thread (another library's AMX
 * kernels) may change between two calls, so each call loads its own and ends with
 * tilerelease: a thread that ran a kernel holds no tile state (the OS then need not save it
 * on a context switch, and the core is not kept in the AMX-in-use state).
 */
#include <immintrin.h>

#include "kernels_internal.h"

struct moek_isa_ops moek_amx_ops;

/* Token counts from which the AMX tiles beat the decode dots (bench_kernels --isa amx
 * --bf16-from 2 against the default, one thread, qwen3 expert shape, Sapphire Rapids VM;
 * docs/performance.md, "AMX"): a tile call costs about as much at 2 tokens as at 16, so the
 * counts are where 16 tokens' worth of tile work overtakes the dots — F16, whose dots convert
 * every weight, from 4; Q8_0 and BF16 rows from 12; BF16 groups from 16; the other formats'
 * integer dots from 24. */
#define AMX_FROM 24
#define AMX_FROM_Q8_0 12
#define AMX_FROM_BF16_ROWS 12
#define AMX_FROM_BF16_GROUPS 16
#define AMX_FROM_F16 4
/* Interleaved integer formats (x8): their group dots hold out longer, as a tile call
 * dequantizes every weight of the matrix whatever the token count (bench_kernels --isa amx
 * --bf16-from 2 against --isa avx512, qwen3 and deepseek shapes, one and two threads): Q4_K and
 * Q3_K from 64, Q8_0 and MXFP4 from 128, the others from 96; 1.2-1.9x the group dots at 512. */
#define AMX_FROM_INT_GROUPS 96
#define AMX_FROM_K4_GROUPS 64
#define AMX_FROM_Q8_GROUPS 128
#define STR_(x) #x
#define STR(x) STR_(x)
#define FROM(n) "amx tdpbf16ps tiles from " STR(n) " tokens"

static const char *describe(uint32_t format, bool prefill)
{
	if (!prefill || !moek_tile_bf16_takes(format))
		return moek_avx512_ops.describe(format, prefill);
	switch (format) {
	case MOEK_BF16:
		return FROM(AMX_FROM_BF16_ROWS) " (" STR(AMX_FROM_BF16_GROUPS) " in groups)";
	case MOEK_F16: return FROM(AMX_FROM_F16);
	case MOEK_Q8_0: return FROM(AMX_FROM_Q8_0) " (" STR(AMX_FROM_Q8_GROUPS) " in groups)";
	case MOEK_MXFP4: return FROM(AMX_FROM) " (" STR(AMX_FROM_Q8_GROUPS) " in groups)";
	case MOEK_Q4_K:
	case MOEK_Q3_K: return FROM(AMX_FROM) " (" STR(AMX_FROM_K4_GROUPS) " in groups)";
	case MOEK_NVFP4: return FROM(AMX_FROM);
	default:
		return moek_interleave_supported(format)
		           ? FROM(AMX_FROM) " (" STR(AMX_FROM_INT_GROUPS) " in groups)"
		           : FROM(AMX_FROM);
	}
}

/* The bf16 prefill tiles on AMX, from their own token counts; every other entry is avx512's.
 * The Q8_0 INT8 tile kernel (moek_amx_tile_q8_0) has no activation packer in ffn.c yet, so it
 * is not in the table. */
void moek_amx_build(void)
{
	moek_amx_ops = moek_avx512_ops;
	moek_amx_ops.name = "amx";
	moek_amx_ops.describe = describe;
	moek_amx_ops.tile_bf16 = moek_amx_tile_bf16;
	unsigned(*from)[MOEK_FMT_SLOTS] = moek_amx_ops.tile_bf16_from;
	for (unsigned f = 0; f < MOEK_FMT_SLOTS; f++)
		from[0][f] = from[1][f] = AMX_FROM;
	from[0][MOEK_FMT_BF16] = AMX_FROM_BF16_ROWS;
	from[1][MOEK_FMT_BF16] = AMX_FROM_BF16_GROUPS;
	from[0][MOEK_FMT_F16] = from[1][MOEK_FMT_F16] = AMX_FROM_F16;
	from[0][MOEK_FMT_Q8_0] = from[1][MOEK_FMT_Q8_0] = AMX_FROM_Q8_0;
	/* interleaved integer formats leave their group dots for the tiles too */
	moek_amx_ops.tile_bf16_int_groups = true;
	for (unsigned f = 0; f < MOEK_FMT_COUNT; f++) {
		const uint32_t act = moek_formats[f].vec_dot_format;
		if ((act == MOEK_Q8_0 || act == MOEK_Q8_K) && f != MOEK_FMT_NVFP4)
			from[1][f] = AMX_FROM_INT_GROUPS;
	}
	from[1][MOEK_FMT_Q4_K] = from[1][MOEK_FMT_Q3_K] = AMX_FROM_K4_GROUPS;
	from[1][MOEK_FMT_Q8_0] = from[1][MOEK_FMT_MXFP4] = AMX_FROM_Q8_GROUPS;
}

/* GCC's intrinsics (12 and older) tell the compiler that ldtilecfg reads 8 bytes of its
 * operand and that tileloadd reads no memory at all (a pointer in a register): the barrier
 * makes the whole configuration, and whatever the caller wrote, memory the asm may read. */
#define AMX_READS(p) __asm__ volatile("" : : "r"(p) : "memory")

#define AMX_BACKEND void
#define AMX_LOADCONFIG(be, cfg)                                                                    \
	do {                                                                                       \
		AMX_READS(cfg);                                                                    \
		_tile_loadconfig(cfg);                                                             \
	} while (0)
#define AMX_LOAD(be, t, base, stride) _tile_loadd(t, base, stride)
#define AMX_STORE(be, t, base, stride) _tile_stored(t, base, stride)
#define AMX_ZERO(be, t) _tile_zero(t)
#define AMX_DPBF16PS(be, c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_DPBSSD(be, c, a, b) _tile_dpbssd(c, a, b)
#define AMX_RELEASE(be) _tile_release()
#include "x86_amx_tile.h"

void moek_amx_tile_bf16(const uint16_t *w, size_t ldw, size_t nr, const uint16_t *xp,
                        size_t xp_stride, size_t np, size_t k, float *c, size_t ldc)
{
	AMX_READS(w);
	AMX_READS(xp);
	AMX_READS(c);
	amx_tile_bf16_run(NULL, w, ldw, nr, xp, xp_stride, np, k, c, ldc);
}

void moek_amx_tile_q8_0(const void *w, size_t ldw, size_t nr, const void *xp, size_t xp_stride,
                        size_t np, size_t k, float *c, size_t ldc)
{
	AMX_READS(w);
	AMX_READS(xp);
	AMX_READS(c);
	amx_tile_q8_0_run(NULL, w, ldw, nr, xp, xp_stride, np, k, c, ldc);
}
