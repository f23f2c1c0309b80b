/* fuzz_gguf.c — libFuzzer target: gguf_open on arbitrary bytes must return a clear error
 * or a file whose every tensor lies inside it; a file that opens is then given to the
 * catalog, which must accept it with every extent inside the file, or reject it. */
#include <stdint.h>

#include "catalog.h"
#include "fuzz_file.h"
#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf_file *f;
	struct sidecar_error err;
	if (gguf_open(fuzz_input_path(data, size), &f, &err))
		return 0;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		if (t->offset + t->nbytes > size || gguf_find_tensor(f, t->name) == NULL)
			__builtin_trap();
	}
	gguf_close(f);

	struct moe_catalog *cat;
	if (moe_catalog_open(fuzz_input_link(data, size, ".gguf"), &cat, &err))
		return 0;
	for (uint32_t L = 0; L < cat->info.n_layers; L++)
		for (uint32_t e = 0; e < cat->info.n_experts; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, L, e);
			for (int p = 0; x && p < MOE_PROJ_COUNT; p++) {
				const struct moe_extent *d = &x->proj[p].data;
				if (x->proj[p].present &&
				    (d->file != 0 || d->offset + d->length > size))
					__builtin_trap();
			}
		}
	moe_catalog_close(cat);
	return 0;
}
