/* bench_convert: the load-time layout conversion of gpt-oss Hugging Face MXFP4 weights
 * (moek_mxfp4_from_hf, run by the residency's loader on every expert it reads) against a
 * memcpy of the same bytes, measured in the same run on one gpt-oss-20b expert's worth of
 * data (13.3 MB: cache-cold, like a freshly read slot).
 *
 *   bench_convert [--json]
 *
 * Prints GB/s of GGUF output for both and their ratio; the conversion should stay a fraction
 * of a memcpy, far above what one NVMe device delivers per loader.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "moe_kernels.h"

int main(int argc, char **argv)
{
	const int json = argc > 1 && strcmp(argv[1], "--json") == 0;
	if (argc > 1 && !json) {
		fprintf(stderr, "usage: bench_convert [--json]\n");
		return 2;
	}
	/* gpt-oss-20b: gate_up 5760 x 2880 + down 2880 x 2880 elements per expert. */
	const size_t n = (size_t)5760 * 2880 + (size_t)2880 * 2880;
	const size_t out_bytes = n / 32 * 17;
	enum { COPIES = 8 }; /* rotate buffers so each pass reads memory not in cache */
	uint8_t *blocks[COPIES], *scales[COPIES], *out = malloc(out_bytes),
	                                          *flat = malloc(out_bytes);
	if (!out || !flat)
		return 1;
	for (int c = 0; c < COPIES; c++) {
		blocks[c] = malloc(n / 2);
		scales[c] = malloc(n / 32);
		if (!blocks[c] || !scales[c])
			return 1;
		for (size_t i = 0; i < n / 2; i++)
			blocks[c][i] = (uint8_t)((i + (size_t)c) * 2654435761u >> 13);
		memset(scales[c], 120 + c, n / 32);
	}
	double best_copy = 1e9, best_conv = 1e9;
	for (int r = 0; r < 6 * COPIES; r++) {
		const int c = r % COPIES;
		const double t0 = monotonic_s();
		memcpy(out, blocks[c], n / 2); /* the same bytes in, the same bytes out */
		memcpy(out + n / 2, scales[c], n / 32);
		const double t1 = monotonic_s();
		moek_mxfp4_from_hf(blocks[c], scales[c], n, flat);
		const double t2 = monotonic_s();
		best_copy = t1 - t0 < best_copy ? t1 - t0 : best_copy;
		best_conv = t2 - t1 < best_conv ? t2 - t1 : best_conv;
	}
	const double copy_gbps = (double)out_bytes / best_copy / 1e9;
	const double conv_gbps = (double)out_bytes / best_conv / 1e9;
	if (json)
		printf("{\"bytes\":%zu,\"memcpy_gbps\":%.3f,\"convert_gbps\":%.3f,"
		       "\"convert_vs_memcpy\":%.4f}\n",
		       out_bytes, copy_gbps, conv_gbps, conv_gbps / copy_gbps);
	else
		printf("MXFP4 Hugging Face -> GGUF, one gpt-oss-20b expert (%.1f MB), best of %d:\n"
		       "  memcpy   %6.2f GB/s\n  convert  %6.2f GB/s  (%.2fx memcpy)\n",
		       (double)out_bytes / 1e6, 6 * COPIES, copy_gbps, conv_gbps,
		       conv_gbps / copy_gbps);
	for (int c = 0; c < COPIES; c++) {
		free(blocks[c]);
		free(scales[c]);
	}
	free(out);
	free(flat);
	return 0;
}
