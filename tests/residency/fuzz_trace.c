/* fuzz_trace.c — libFuzzer target: trace_parse on arbitrary bytes must return a parsed trace
 * that satisfies its documented bounds, or an error with a message; never crash. */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct routing_trace t;
	struct sidecar_error err = {0};
	if (trace_parse((const char *)data, size, "fuzz", &t, &err) == 0) {
		for (uint32_t li = 0; li < t.n_lines; li++) {
			assert(t.lines[li].layer < t.n_layers);
			assert(t.lines[li].count >= 1 && t.lines[li].count <= t.top_k);
			for (uint32_t j = 0; j < t.lines[li].count; j++)
				assert(t.ids[t.lines[li].first + j] < t.n_experts);
		}
		trace_free(&t);
	} else {
		assert(err.msg[0] != '\0');
	}
	return 0;
}
