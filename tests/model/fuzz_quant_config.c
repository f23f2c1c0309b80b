/* fuzz_quant_config.c — libFuzzer target: config.json's quantization_config and the tensor
 * shapes it is checked against.
 *
 * The input is a JSON document: its quantization_config is read as the catalog reads it, and
 * each [rows, cols] pair of its "fuzz_shapes" array (plus a few fixed shapes) is laid out by
 * moe_quant_layout_of. A scheme must be refused or accepted without undefined behaviour (the
 * fuzz build has UBSan, float-cast-overflow included); an accepted layout must keep the
 * invariants the repack relies on, and for small matrices the repack runs over buffers of
 * exactly the sizes the layout gives, so ASan sees any read past them.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "moe_kernels.h"
#include "quant_config.h"

#define MAX_SHAPES 8
#define MAX_ELEMENTS (1u << 16) /* the largest matrix repacked */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok)
{
	if (!ok)
		__builtin_trap();
}

/* The repack of a rows x cols matrix laid out as l, over exact-size buffers of bytes from seed. */
static void repack(const struct moe_quant_config *q, const struct moe_quant_layout *l,
                   uint64_t rows, uint64_t cols, uint8_t seed)
{
	const size_t wb = (size_t)(l->weights[0] * l->weights[1] * 4);
	const size_t sb = (size_t)(l->scales[0] * l->scales[1] * 2);
	const size_t zb = (size_t)(l->zeros[0] * l->zeros[1] * 4);
	check(wb == moek_int4_packed_bytes(rows, cols));
	check(sb == moek_int4_scale_bytes(rows, cols, l->group));
	check(q->kind == MOE_QUANT_INT4_CT ? zb == 0
	                                   : zb == moek_int4_zero_bytes(rows, cols, l->group));
	uint8_t *w = malloc(wb), *s = malloc(sb), *z = malloc(zb ? zb : 1);
	void *dst = malloc(rows * moek_row_bytes(MOEK_INT4_G32, cols));
	check(w && s && z && dst);
	for (size_t i = 0; i < wb; i++)
		w[i] = (uint8_t)(seed + 37 * i);
	for (size_t i = 0; i < sb; i++)
		s[i] = (uint8_t)(i % 2 ? 0x3c : seed); /* scales near 1 */
	for (size_t i = 0; i < zb; i++)
		z[i] = (uint8_t)(seed ^ i);
	char why[200];
	if (q->kind == MOE_QUANT_INT4_CT)
		check(moek_int4_from_ct(w, s, rows, cols, l->group, dst, why, sizeof(why)) == 0);
	else if (q->kind == MOE_QUANT_AWQ) /* every stored zero fits: never refused */
		check(moek_int4_from_awq(w, z, s, rows, cols, l->group, dst, why, sizeof(why)) ==
		      0);
	else /* may refuse a v1 zero of 15 */
		(void)moek_int4_from_gptq(w, z, s, rows, cols, l->group, q->gptq_v1, dst, why,
		                          sizeof(why));
	free(w), free(s), free(z), free(dst);
}

/* ModelOpt NVFP4 (no INT4 layout): the repack over exact-size weight and weight_scale buffers
 * of bytes from seed (a negative or NaN scale byte refused with a reason, never a crash). */
static void try_nvfp4(uint64_t rows, uint64_t cols, uint8_t seed)
{
	if (rows == 0 || cols == 0 || rows > MAX_ELEMENTS || cols > MAX_ELEMENTS ||
	    rows * cols > MAX_ELEMENTS)
		return;
	const size_t wb = (size_t)(rows * cols / 2), sb = (size_t)(rows * cols / 16);
	uint8_t *w = malloc(wb ? wb : 1), *s = malloc(sb ? sb : 1);
	void *dst = malloc(rows * (cols / 64 + 1) * 36);
	check(w && s && dst);
	for (size_t i = 0; i < wb; i++)
		w[i] = (uint8_t)(seed + 37 * i);
	for (size_t i = 0; i < sb; i++)
		s[i] = (uint8_t)((seed ^ i) % 0x90); /* mostly valid, some negative or NaN */
	char why[200] = "";
	if (moek_nvfp4_from_modelopt(w, s, rows, cols, dst, why, sizeof(why)))
		check(why[0] != '\0');
	free(w), free(s), free(dst);
}

static void try_shape(const struct moe_quant_config *q, uint64_t rows, uint64_t cols, uint8_t seed)
{
	struct moe_quant_layout l;
	char why[200];
	if (q->kind == MOE_QUANT_NVFP4) {
		check(q->group == 16);
		try_nvfp4(rows, cols, seed);
		return;
	}
	if (moe_quant_layout_of(q, rows, cols, &l, why, sizeof(why))) {
		check(why[0] != '\0');
		return;
	}
	check(l.group > 0 && l.group % 32 == 0 && cols % l.group == 0 && rows > 0);
	check(!q->per_row || l.group == cols);
	check(q->kind == MOE_QUANT_INT4_CT || rows % 8 == 0);
	if (rows <= MAX_ELEMENTS && cols <= MAX_ELEMENTS && rows * cols <= MAX_ELEMENTS)
		repack(q, &l, rows, cols, seed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint64_t fixed[][2] = {{8, 32}, {8, 256}, {16, 96}, {12, 64},
	                                    {8, 48}, {0, 32},  {8, 0},   {8, (uint64_t)1 << 33}};
	struct json_doc *doc;
	struct sidecar_error err;
	if (json_parse((const char *)data, size, &doc, &err))
		return 0;
	struct moe_quant_config q;
	char text[128];
	if (moe_quant_config_read(doc, "config.json", &q, &err) == 0) {
		moe_quant_config_describe(&q, text, sizeof(text));
		if (q.kind != MOE_QUANT_NONE) {
			const uint8_t seed = size ? data[size / 2] : 0;
			for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
				try_shape(&q, fixed[i][0], fixed[i][1], seed);
			const json_ref shapes = json_object_get(doc, json_root(doc), "fuzz_shapes");
			int n = 0;
			for (json_ref s = json_first(doc, shapes); s != JSON_NONE && n < MAX_SHAPES;
			     s = json_next(doc, s), n++) {
				uint64_t rows, cols;
				const json_ref r = json_first(doc, s);
				if (json_u64(doc, r, &rows) == 0 &&
				    json_u64(doc, json_next(doc, r), &cols) == 0)
					try_shape(&q, rows, cols, seed);
			}
		}
	} else {
		check(err.msg[0] != '\0');
	}
	json_free(doc);
	return 0;
}
