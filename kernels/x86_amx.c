/* x86_amx.c — the amx ISA: the avx512 table with AMX tiles (BF16, INT8) where they pay.
 *
 * Only made active on a CPU with AMX-TILE/BF16/INT8 whose kernel granted this process the
 * tile data (isa.c), so the whole file is built for them.
 */
#include "kernels_internal.h"

struct moek_isa_ops moek_amx_ops;

void moek_amx_build(void)
{
	moek_amx_ops = moek_avx512_ops;
	moek_amx_ops.name = "amx";
}
