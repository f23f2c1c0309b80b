/* fuzz_gguf.c — libFuzzer target: gguf_open on arbitrary bytes must return a clear error
 * or a file whose every tensor lies inside it. */
#include <stdint.h>

#include "fuzz_file.h"
#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf_file *f;
	struct model_error err;
	if (gguf_open(fuzz_input_path(data, size), &f, &err) == 0) {
		for (uint64_t i = 0; i < f->n_tensors; i++) {
			const struct gguf_tensor *t = &f->tensors[i];
			if (t->offset + t->nbytes > size || gguf_find_tensor(f, t->name) == NULL)
				__builtin_trap();
		}
		uint64_t u;
		(void)gguf_get_u64(f, "general.alignment", &u);
		gguf_close(f);
	}
	return 0;
}
