/* fuzz_safetensors.c — libFuzzer target: st_open on arbitrary bytes must return a clear
 * error or a file whose tensors tile its data buffer. */
#include <stdint.h>

#include "fuzz_file.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_file *f;
	struct model_error err;
	if (st_open(fuzz_input_path(data, size), &f, &err) == 0) {
		uint64_t covered = 0;
		for (uint64_t i = 0; i < f->n_tensors; i++) {
			const struct st_tensor *t = &f->tensors[i];
			if (t->offset < f->data_offset || t->offset + t->nbytes > size)
				__builtin_trap();
			covered += t->nbytes;
		}
		if (covered != size - f->data_offset)
			__builtin_trap();
		st_close(f);
	}
	return 0;
}
