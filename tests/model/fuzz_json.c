/* fuzz_json.c — libFuzzer target: the JSON parser must accept or reject any input without
 * crashing, and an accepted document must be walkable end to end. */
#include <stddef.h>
#include <stdint.h>

#include "json.h"

static void walk(const struct json_doc *doc, json_ref v, int depth)
{
	uint64_t u;
	double d;
	size_t len;
	(void)json_u64(doc, v, &u);
	(void)json_double(doc, v, &d);
	(void)json_string(doc, v, &len);
	if (depth > JSON_MAX_DEPTH + 1)
		__builtin_trap();
	for (json_ref c = json_first(doc, v); c != JSON_NONE; c = json_next(doc, c)) {
		(void)json_key(doc, c, &len);
		walk(doc, c, depth + 1);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct json_doc *doc;
	struct sidecar_error err;
	if (json_parse((const char *)data, size, &doc, &err) == 0) {
		walk(doc, json_root(doc), 0);
		(void)json_object_get(doc, json_root(doc), "weight_map");
		json_free(doc);
	}
	return 0;
}
