/* x86_avx512.c — the avx512 ISA: AVX2's kernels, with AVX-512 ones where they pay.
 *
 * The table starts as a copy of moek_avx2_ops (every format keeps a complete path) and then
 * takes this file's entries. It is only ever made active on a CPU with AVX512 F/BW/VL/DQ,
 * VNNI and BF16 (isa.c), so the whole file is built for them.
 */
#include "kernels_internal.h"

struct moek_isa_ops moek_avx512_ops;

static const char *describe(uint32_t format, bool prefill)
{
	return moek_avx2_ops.describe(format, prefill);
}

void moek_avx512_build(void)
{
	moek_avx512_ops = moek_avx2_ops;
	moek_avx512_ops.name = "avx512";
	moek_avx512_ops.describe = describe;
}
