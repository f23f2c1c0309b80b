/* test_int4_checkpoint.c — INT4 group-quantized safetensors checkpoints (compressed-tensors
 * pack-quantized, GPTQ) as moe-gen writes them and the catalog reads them: the catalog's
 * extents read back and repacked give the generator's float originals within a 4-bit
 * quantizer's error (and not the neighbouring expert's), for several group sizes; inspect
 * names the scheme; and every unsupported scheme is refused with a message naming what was
 * found (config.json edited by hand, a g_idx patched in the file).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "catalog.h"
#include "model_files.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "safetensors.h"

#define HIDDEN 256u
#define FFN 128u
#define SEED 7u

static void generate(const char *out, enum moe_gen_int4 int4, uint32_t group)
{
	struct moe_gen_options o = {.preset = "qwen3-30b-a3b",
	                            .out = out,
	                            .format = MOEK_INT4_G32,
	                            .seed = SEED,
	                            .layers = 2,
	                            .hidden = HIDDEN,
	                            .ffn = FFN,
	                            .experts = 4,
	                            .int4 = int4,
	                            .group = group};
	struct sidecar_error err = {0};
	cr_assert_eq(moe_gen_write(&o, &err), 0, "%s", err.msg);
}

/* Normalised squared error of a projection (repacked from its extents) against floats. */
static double proj_nmse(const struct moe_catalog *cat, const struct moe_proj_ref *r,
                        const float *want)
{
	void *data = read_extent(cat, &r->data), *scale = read_extent(cat, &r->scale);
	void *zeros = r->zeros.length ? read_extent(cat, &r->zeros) : NULL;
	const size_t n = r->rows * r->cols;
	void *blocks = malloc(moek_row_bytes(MOEK_INT4_G32, r->cols) * r->rows);
	float *got = malloc(n * sizeof(float));
	char err[200];
	if (r->layout == MOE_LAYOUT_INT4_CT)
		cr_assert_eq(moek_int4_from_ct(data, scale, r->rows, r->cols, r->group, blocks, err,
		                               sizeof(err)),
		             0, "%s", err);
	else if (r->awq)
		cr_assert_eq(moek_int4_from_awq(data, zeros, scale, r->rows, r->cols, r->group,
		                                blocks, err, sizeof(err)),
		             0, "%s", err);
	else
		cr_assert_eq(moek_int4_from_gptq(data, zeros, scale, r->rows, r->cols, r->group,
		                                 r->gptq_v1, blocks, err, sizeof(err)),
		             0, "%s", err);
	cr_assert_eq(moek_dequantize(MOEK_INT4_G32, blocks, NULL, r->rows, r->cols, got), 0);
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
		den += (double)want[i] * want[i];
	}
	free(data), free(scale), free(zeros), free(blocks), free(got);
	return num / den;
}

static void check_round_trip(enum moe_gen_int4 int4, uint32_t group, enum moe_weight_layout lay)
{
	char *dir = scratch_dir();
	char out[512];
	snprintf(out, sizeof(out), "%s/hf", dir);
	generate(out, int4, group);
	struct moe_catalog *cat;
	struct sidecar_error err = {0};
	cr_assert_eq(moe_catalog_open(out, &cat, &err), 0, "%s", err.msg);
	cr_assert_eq(cat->quant.kind, int4 == MOE_GEN_INT4_CT    ? MOE_QUANT_INT4_CT
	                              : int4 == MOE_GEN_INT4_AWQ ? MOE_QUANT_AWQ
	                                                         : MOE_QUANT_GPTQ);
	const bool per_row = group == MOE_GEN_GROUP_ROW;
	cr_assert_eq(cat->quant.group, per_row ? 0 : group);
	char scheme[96];
	moe_quant_config_describe(&cat->quant, scheme, sizeof(scheme));
	cr_assert_eq(strstr(scheme, "one group per row") != NULL, per_row, "%s", scheme);
	cr_assert_eq(cat->n_formats, 1);
	cr_assert_eq(cat->formats[0], MOEK_INT4_G32);
	static const enum moe_gen_tensor which[3] = {MOE_GEN_GATE, MOE_GEN_UP, MOE_GEN_DOWN};
	float *want = malloc(HIDDEN * FFN * sizeof(float));
	for (uint32_t L = 0; L < 2; L++)
		for (uint32_t e = 0; e < 4; e++)
			for (int p = 0; p < 3; p++) {
				const struct moe_proj_ref *r =
				    &moe_catalog_expert(cat, L, e)->proj[p];
				cr_assert(r->present);
				cr_assert_eq(r->format, MOEK_INT4_G32);
				cr_assert_eq(r->layout, lay);
				cr_assert_eq(r->awq, int4 == MOE_GEN_INT4_AWQ);
				/* one group per row: the row is the group (one scale per output) */
				const uint64_t g = per_row ? r->cols : group;
				cr_assert_eq(r->group, g);
				cr_assert_eq(r->data.length, r->rows * r->cols / 2);
				cr_assert_eq(r->scale.length, r->rows * r->cols / g * 2);
				cr_assert_eq(r->zeros.length, lay == MOE_LAYOUT_INT4_GPTQ
				                                  ? r->rows * r->cols / g / 2
				                                  : 0);
				cr_assert_eq(moe_proj_kernel_bytes(r), r->rows * r->cols / 32 * 20);
				moe_gen_floats(SEED, L, e, which[p], r->cols, 0, r->rows * r->cols,
				               want);
				const double own = proj_nmse(cat, r, want);
				cr_assert(own < 1.2e-2, "layer %u expert %u %s group %u: nmse %.3g",
				          L, e, moe_proj_name((enum moe_proj)p), group, own);
				cr_assert(own > 1e-4,
				          "a 4-bit quantizer cannot be this exact: %.3g", own);
				moe_gen_floats(SEED, L, (e + 1) % 4, which[p], r->cols, 0,
				               r->rows * r->cols, want);
				cr_assert(proj_nmse(cat, r, want) > 0.5, "the neighbour's weights");
			}
	free(want);
	moe_catalog_close(cat);
	remove_tree(dir);
}

Test(int4_checkpoint, compressed_tensors_round_trip)
{
	check_round_trip(MOE_GEN_INT4_CT, 32, MOE_LAYOUT_INT4_CT);
	check_round_trip(MOE_GEN_INT4_CT, 128, MOE_LAYOUT_INT4_CT);
}

Test(int4_checkpoint, gptq_round_trip)
{
	check_round_trip(MOE_GEN_INT4_GPTQ, 128, MOE_LAYOUT_INT4_GPTQ);
	check_round_trip(MOE_GEN_INT4_GPTQ, 32, MOE_LAYOUT_INT4_GPTQ);
}

/* AutoAWQ GEMM (qweight packed along the output in AWQ's nibble order, zero points from an
 * asymmetric quantizer): read through the GPTQ family's layout, repacked by its own order */
Test(int4_checkpoint, awq_round_trip)
{
	check_round_trip(MOE_GEN_INT4_AWQ, 128, MOE_LAYOUT_INT4_GPTQ);
	check_round_trip(MOE_GEN_INT4_AWQ, 32, MOE_LAYOUT_INT4_GPTQ);
}

/* GPTQ group_size -1 and compressed-tensors strategy "channel": one scale (and zero) per
 * output row, repeated into every 32-element block of the row. */
Test(int4_checkpoint, one_group_per_row_round_trip)
{
	check_round_trip(MOE_GEN_INT4_GPTQ, MOE_GEN_GROUP_ROW, MOE_LAYOUT_INT4_GPTQ);
	check_round_trip(MOE_GEN_INT4_CT, MOE_GEN_GROUP_ROW, MOE_LAYOUT_INT4_CT);
}

/* The tensor shapes a scheme gives a projection, and the shapes it cannot describe. */
Test(int4_checkpoint, layout_of_shapes)
{
	struct moe_quant_config row = {.kind = MOE_QUANT_GPTQ, .per_row = true};
	struct moe_quant_layout l;
	char why[160];
	cr_assert_eq(moe_quant_layout_of(&row, 64, 96, &l, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(l.group, 96);
	cr_assert_eq(l.weights[0], 12);
	cr_assert_eq(l.weights[1], 64);
	cr_assert_eq(l.scales[0], 1);
	cr_assert_eq(l.scales[1], 64);
	cr_assert_eq(l.zeros[0], 1);
	cr_assert_eq(l.zeros[1], 8);
	cr_assert_eq(moe_quant_layout_of(&row, 64, 48, &l, why, sizeof(why)), -1);
	cr_assert_str_eq(why, "one group per row needs rows of a positive multiple of 32 inputs, "
	                      "not 48");
	cr_assert_eq(moe_quant_layout_of(&row, 12, 64, &l, why, sizeof(why)), -1);
	cr_assert_str_eq(why, "12 outputs, not a multiple of 8 (GPTQ packs 8 zero points per "
	                      "int32)");
	struct moe_quant_config channel = {.kind = MOE_QUANT_INT4_CT, .per_row = true};
	cr_assert_eq(moe_quant_layout_of(&channel, 12, 64, &l, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(l.scales[0], 12);
	cr_assert_eq(l.scales[1], 1);
	cr_assert_eq(l.zeros[0], 0);
	cr_assert_eq(l.zeros[1], 0);
	struct moe_quant_config g64 = {.kind = MOE_QUANT_INT4_CT, .group = 64};
	cr_assert_eq(moe_quant_layout_of(&g64, 8, 96, &l, why, sizeof(why)), -1);
	cr_assert_str_eq(why, "group size 64 does not divide the row of 96 inputs");
}

/* `moe-sidecar inspect ARGS`: its exit status, stdout in out (malloc'd). */
static int run_inspect(const char *args, char **out)
{
	char cmd[1200];
	snprintf(cmd, sizeof(cmd), "%s inspect %s 2>&1", MOE_SIDECAR_BIN, args);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	size_t cap = 1 << 16, len = 0, k;
	char *buf = malloc(cap);
	while ((k = fread(buf + len, 1, cap - 1 - len, p)) > 0)
		len += k;
	buf[len] = '\0';
	const int st = pclose(p);
	*out = buf;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(int4_checkpoint, inspect_names_the_scheme)
{
	char *dir = scratch_dir();
	char out[512], args[600];
	snprintf(out, sizeof(out), "%s/hf", dir);
	generate(out, MOE_GEN_INT4_GPTQ, 64);
	char *text;
	cr_assert_eq(run_inspect(out, &text), 0, "%s", text);
	cr_assert(strstr(text, "formats         INT4_G32\n"), "%s", text);
	cr_assert(strstr(text, "checkpoint      GPTQ INT4 v1, group 64, sym (repacked to INT4_G32 "
	                       "at load)\n"),
	          "%s", text);
	cr_assert(strstr(text, "gate INT4_G32 128x256 up INT4_G32 128x256 down INT4_G32 256x128"),
	          "%s", text);
	free(text);
	snprintf(args, sizeof(args), "%s --json", out);
	cr_assert_eq(run_inspect(args, &text), 0, "%s", text);
	cr_assert(strstr(text, "\"formats\":[\"INT4_G32\"],\"quantization\":\"GPTQ INT4 v1, "
	                       "group 64, sym\""),
	          "%s", text);
	free(text);
	remove_tree(dir);
}

/* config.json with `from` replaced by `to` must be refused with `want`, a format whose %s are
 * the scratch directory. */
static void expect_refusal(enum moe_gen_int4 int4, uint32_t group, const char *from, const char *to,
                           const char *want)
{
	char *dir = scratch_dir();
	char out[512], cfg[600];
	snprintf(out, sizeof(out), "%s/hf", dir);
	generate(out, int4, group);
	snprintf(cfg, sizeof(cfg), "%s/config.json", out);
	size_t len;
	char *text = slurp(cfg, &len);
	char *at = strstr(text, from);
	cr_assert_not_null(at, "config.json has no %s", from);
	char *edited = malloc(len + strlen(to) + 1);
	const size_t head = (size_t)(at - text);
	memcpy(edited, text, head);
	strcpy(edited + head, to);
	strcat(edited, at + strlen(from));
	write_file(cfg, edited, strlen(edited));
	struct moe_catalog *cat = NULL;
	struct sidecar_error err = {0};
	cr_assert_eq(moe_catalog_open(out, &cat, &err), -1, "%s -> %s accepted", from, to);
	char full[1024];
	snprintf(full, sizeof(full), want, dir, dir);
	cr_assert_str_eq(err.msg, full);
	free(text), free(edited);
	remove_tree(dir);
}

Test(int4_checkpoint, unsupported_compressed_tensors_schemes_refused)
{
	expect_refusal(MOE_GEN_INT4_CT, 32, "\"symmetric\": true", "\"symmetric\": false",
	               "%s/hf/config.json: quantization_config: config_groups.group_0: asymmetric "
	               "weights (symmetric false) are not supported (symmetric INT4 only)");
	expect_refusal(MOE_GEN_INT4_CT, 32, "\"num_bits\": 4", "\"num_bits\": 8",
	               "%s/hf/config.json: quantization_config: config_groups.group_0: num_bits 8 "
	               "is not supported (INT4 only)");
	expect_refusal(MOE_GEN_INT4_CT, 32, "\"group_size\": 32", "\"group_size\": 48",
	               "%s/hf/config.json: quantization_config: config_groups.group_0: group_size "
	               "48 is not supported (strategy group: a positive multiple of 32)");
	expect_refusal(MOE_GEN_INT4_CT, 32, "\"strategy\": \"group\"", "\"strategy\": \"tensor\"",
	               "%s/hf/config.json: quantization_config: config_groups.group_0: strategy "
	               "tensor is not supported (group or channel)");
	/* channel is one group per row: a group size besides it is a contradiction */
	expect_refusal(MOE_GEN_INT4_CT, 32, "\"strategy\": \"group\"", "\"strategy\": \"channel\"",
	               "%s/hf/config.json: quantization_config: config_groups.group_0: group_size "
	               "32 with strategy channel (one group per row) is not supported (null or "
	               "-1)");
	expect_refusal(MOE_GEN_INT4_CT, 32, "\"actorder\": null", "\"actorder\": \"group\"",
	               "%s/hf/config.json: quantization_config: config_groups.group_0: actorder "
	               "(activation order) is not supported");
	expect_refusal(MOE_GEN_INT4_CT, 32, "pack-quantized", "float-quantized",
	               "%s/hf/config.json: quantization_config: compressed-tensors format "
	               "float-quantized is not supported (pack-quantized INT4 only)");
	expect_refusal(MOE_GEN_INT4_CT, 32, "\"compressed-tensors\"", "\"bitnet\"",
	               "%s/hf/config.json: quantization_config: quant_method bitnet is not "
	               "supported (compressed-tensors pack-quantized INT4, gptq INT4, awq INT4 "
	               "GEMM, modelopt NVFP4, fp8 and mxfp4 are)");
	/* a group of 96 is a multiple of 32 but does not divide the 256-wide rows */
	expect_refusal(MOE_GEN_INT4_CT, 32, "\"group_size\": 32", "\"group_size\": 96",
	               "%s/hf: model.layers.0.mlp.experts.0.gate_proj: group size 96 does not "
	               "divide the row of 256 inputs (%s/hf/config.json)");
}

Test(int4_checkpoint, unsupported_gptq_schemes_refused)
{
	expect_refusal(MOE_GEN_INT4_GPTQ, 128, "\"desc_act\": false", "\"desc_act\": true",
	               "%s/hf/config.json: quantization_config: GPTQ desc_act true (activation "
	               "order) is not supported: INT4 checkpoints need desc_act false");
	expect_refusal(MOE_GEN_INT4_GPTQ, 128, "\"bits\": 4", "\"bits\": 8",
	               "%s/hf/config.json: quantization_config: GPTQ bits 8 is not supported (INT4 "
	               "only)");
	expect_refusal(MOE_GEN_INT4_GPTQ, 128, "\"checkpoint_format\": \"gptq\"",
	               "\"checkpoint_format\": \"marlin\"",
	               "%s/hf/config.json: quantization_config: GPTQ checkpoint_format marlin is "
	               "not supported (gptq or gptq_v2)");
}

Test(int4_checkpoint, unsupported_awq_schemes_refused)
{
	expect_refusal(MOE_GEN_INT4_AWQ, 128, "\"version\": \"gemm\"", "\"version\": \"gemv\"",
	               "%s/hf/config.json: quantization_config: AWQ version gemv is not supported "
	               "(gemm: AutoAWQ's GEMM packing; gemv and the others pack differently)");
	expect_refusal(MOE_GEN_INT4_AWQ, 128, "\"version\": \"gemm\"", "\"version\": 2",
	               "%s/hf/config.json: quantization_config: AWQ version (not a string) is not "
	               "supported (gemm: AutoAWQ's GEMM packing; gemv and the others pack "
	               "differently)");
	expect_refusal(MOE_GEN_INT4_AWQ, 128, "\"zero_point\": true", "\"zero_point\": false",
	               "%s/hf/config.json: quantization_config: AWQ zero_point false is not "
	               "supported (zero_point true: GEMM checkpoints with zero points)");
	expect_refusal(MOE_GEN_INT4_AWQ, 128, "\"zero_point\": true, ", "",
	               "%s/hf/config.json: quantization_config: AWQ zero_point (missing) is not "
	               "supported (zero_point true: GEMM checkpoints with zero points)");
	expect_refusal(MOE_GEN_INT4_AWQ, 128, "\"bits\": 4", "\"bits\": 8",
	               "%s/hf/config.json: quantization_config: AWQ bits 8 is not supported (INT4 "
	               "only)");
	expect_refusal(MOE_GEN_INT4_AWQ, 128, "\"bits\": 4", "\"bits\": \"4\"",
	               "%s/hf/config.json: quantization_config: AWQ bits (not a number) is not "
	               "supported (INT4 only)");
	expect_refusal(MOE_GEN_INT4_AWQ, 128, "\"group_size\": 128", "\"group_size\": -1",
	               "%s/hf/config.json: quantization_config: AWQ group_size -1 is not "
	               "supported (a positive multiple of 32)");
	expect_refusal(MOE_GEN_INT4_AWQ, 128, "\"group_size\": 128", "\"group_size\": 1e300",
	               "%s/hf/config.json: quantization_config: AWQ group_size 1e+300 is not "
	               "supported (a positive multiple of 32)");
	/* a multiple of 32 that does not divide the 256-wide rows: named per tensor */
	expect_refusal(MOE_GEN_INT4_AWQ, 128, "\"group_size\": 128", "\"group_size\": 96",
	               "%s/hf: model.layers.0.mlp.experts.0.gate_proj: group size 96 does not "
	               "divide the row of 256 inputs (%s/hf/config.json)");
	/* the tensors of another group size than the config's: qzeros has the wrong shape */
	expect_refusal(MOE_GEN_INT4_AWQ, 128, "\"group_size\": 128", "\"group_size\": 64",
	               "%s/hf: tensor model.layers.0.mlp.experts.0.gate_proj.qzeros: expected I32 "
	               "[4, 16] (AWQ: 8 zero points per int32, group 64), found I32 [2, 16] (2 "
	               "dims)");
}

/* group_size values no row can have are refused before any conversion to an integer (a
 * double out of an integer's range converted is undefined behaviour: the sanitizer variant
 * traps on it), with a sentence naming the field and the value. */
Test(int4_checkpoint, out_of_range_group_sizes_refused)
{
	static const struct {
		const char *json, *shown;
	} gptq[] = {
	    {"1e300", "1e+300"}, {"-1e300", "-1e+300"}, {"1.8e19", "1.8e+19"},
	    {"1e999", "inf"},    {"-1e999", "-inf"},    {"0", "0"},
	    {"-2", "-2"},        {"40.5", "40.5"},      {"4294967296", "4.29497e+09"},
	    {"-0.0", "-0"},
	};
	for (size_t i = 0; i < sizeof(gptq) / sizeof(gptq[0]); i++) {
		char to[64], want[512];
		snprintf(to, sizeof(to), "\"group_size\": %s", gptq[i].json);
		snprintf(want, sizeof(want),
		         "%%s/hf/config.json: quantization_config: GPTQ group_size %s is not "
		         "supported (a positive multiple of 32, or -1: one group per row)",
		         gptq[i].shown);
		expect_refusal(MOE_GEN_INT4_GPTQ, 128, "\"group_size\": 128", to, want);
	}
	static const struct {
		const char *json, *shown;
	} ct[] = {{"1e300", "1e+300"}, {"1.8e19", "1.8e+19"}, {"-1e300", "-1e+300"}, {"-5", "-5"}};
	for (size_t i = 0; i < sizeof(ct) / sizeof(ct[0]); i++) {
		char to[64], want[512];
		snprintf(to, sizeof(to), "\"group_size\": %s", ct[i].json);
		snprintf(want, sizeof(want),
		         "%%s/hf/config.json: quantization_config: config_groups.group_0: "
		         "group_size %s is not supported (strategy group: a positive multiple "
		         "of 32)",
		         ct[i].shown);
		expect_refusal(MOE_GEN_INT4_CT, 32, "\"group_size\": 32", to, want);
	}
}

/* desc_act false but a g_idx that is not i / group: activation order all the same. */
Test(int4_checkpoint, gptq_permuted_g_idx_refused)
{
	char *dir = scratch_dir();
	char out[512], file[600];
	snprintf(out, sizeof(out), "%s/hf", dir);
	generate(out, MOE_GEN_INT4_GPTQ, 128);
	snprintf(file, sizeof(file), "%s/model.safetensors", out);
	struct st_file *st;
	struct sidecar_error err = {0};
	cr_assert_eq(st_open(file, &st, &err), 0, "%s", err.msg);
	uint64_t off = 0;
	for (uint64_t i = 0; i < st->n_tensors; i++)
		if (!strcmp(st->tensors[i].name, "model.layers.1.mlp.experts.0.up_proj.g_idx"))
			off = st->tensors[i].offset;
	st_close(st);
	cr_assert_gt(off, 0);
	const uint8_t one[4] = {1, 0, 0, 0}; /* input 5 in group 1 */
	FILE *f = fopen(file, "r+b");
	cr_assert_not_null(f);
	cr_assert_eq(fseek(f, (long)(off + 4 * 5), SEEK_SET), 0);
	cr_assert_eq(fwrite(one, 1, 4, f), 4);
	fclose(f);
	struct moe_catalog *cat = NULL;
	cr_assert_eq(moe_catalog_open(out, &cat, &err), -1);
	char want[1024];
	snprintf(want, sizeof(want),
	         "%s: tensor model.layers.1.mlp.experts.0.up_proj.g_idx: input 5 is in group 1, "
	         "not 0 (desc_act / activation order is not supported)",
	         out);
	cr_assert_str_eq(err.msg, want);
	remove_tree(dir);
}

/* INT4_G32 alone names no checkpoint encoding; INT4 checkpoints are experts-only safetensors. */
Test(int4_checkpoint, generator_refuses_int4_without_an_encoding)
{
	char *dir = scratch_dir();
	char out[512];
	snprintf(out, sizeof(out), "%s/m.gguf", dir);
	struct moe_gen_options o = {.preset = "qwen3-30b-a3b",
	                            .out = out,
	                            .format = MOEK_INT4_G32,
	                            .seed = 1,
	                            .hidden = HIDDEN,
	                            .ffn = FFN,
	                            .experts = 4};
	struct sidecar_error err = {0};
	cr_assert_eq(moe_gen_write(&o, &err), -1);
	cr_assert_str_eq(err.msg, "INT4_G32 is the sidecar's load-time layout: write an INT4 "
	                          "checkpoint with --format int4-ct, gptq or awq");
	o.int4 = MOE_GEN_INT4_CT;
	cr_assert_eq(moe_gen_write(&o, &err), -1);
	cr_assert_str_eq(err.msg, "INT4 checkpoints (int4-ct) are written as experts-only "
	                          "safetensors with per-expert tensors, not for gpt-oss");
	remove_tree(dir);
}

/* ---- ModelOpt NVFP4 ------------------------------------------------------------------------ */

static void generate_nvfp4(const char *out)
{
	struct moe_gen_options o = {.preset = "qwen3-30b-a3b",
	                            .out = out,
	                            .format = MOEK_NVFP4,
	                            .seed = SEED,
	                            .layers = 2,
	                            .hidden = HIDDEN,
	                            .ffn = FFN,
	                            .experts = 4};
	struct sidecar_error err = {0};
	cr_assert_eq(moe_gen_write(&o, &err), 0, "%s", err.msg);
}

/* Replaces `from` by `to` (the same length) in the file's first 64 KiB (a safetensors header,
 * a config): exactly one occurrence must be there. */
static void patch_file(const char *path, const char *from, const char *to)
{
	cr_assert_eq(strlen(from), strlen(to));
	size_t len;
	char *text = slurp(path, &len);
	const size_t n = len < 65536 ? len : 65536;
	char *at = NULL;
	for (size_t i = 0; !at && i + strlen(from) <= n; i++)
		if (!memcmp(text + i, from, strlen(from)))
			at = text + i;
	cr_assert_not_null(at, "%s has no %s", path, from);
	memcpy(at, to, strlen(to));
	write_file(path, text, len);
	free(text);
}

/* A generated checkpoint with `from` replaced by `to` in `file` (config.json,
 * model.safetensors) must be refused with a message that starts with `want` (%s: the scratch
 * directory, twice at most). */
static void expect_nvfp4_refusal(const char *file, const char *from, const char *to,
                                 const char *want)
{
	char *dir = scratch_dir();
	char out[512], path[600];
	snprintf(out, sizeof(out), "%s/hf", dir);
	generate_nvfp4(out);
	snprintf(path, sizeof(path), "%s/%s", out, file);
	patch_file(path, from, to);
	struct moe_catalog *cat = NULL;
	struct sidecar_error err = {0};
	cr_assert_eq(moe_catalog_open(out, &cat, &err), -1, "%s -> %s accepted", from, to);
	char full[1024];
	snprintf(full, sizeof(full), want, dir, dir);
	cr_assert(!strncmp(err.msg, full, strlen(full)), "%s\nwanted: %s", err.msg, full);
	remove_tree(dir);
}

/* The generated checkpoint reads back: every projection NVFP4 in ModelOpt's layout with its
 * weight_scale_2, repacked blocks times that scale within E2M1's error of the originals (and
 * not the neighbour's); inspect names the scheme. */
Test(nvfp4_checkpoint, modelopt_round_trip)
{
	char *dir = scratch_dir();
	char out[512];
	snprintf(out, sizeof(out), "%s/hf", dir);
	generate_nvfp4(out);
	struct moe_catalog *cat;
	struct sidecar_error err = {0};
	cr_assert_eq(moe_catalog_open(out, &cat, &err), 0, "%s", err.msg);
	cr_assert_eq(cat->quant.kind, MOE_QUANT_NVFP4);
	cr_assert_eq(cat->n_formats, 1);
	cr_assert_eq(cat->formats[0], MOEK_NVFP4);
	static const enum moe_gen_tensor which[3] = {MOE_GEN_GATE, MOE_GEN_UP, MOE_GEN_DOWN};
	float *want = malloc(HIDDEN * FFN * sizeof(float)), *got = malloc(HIDDEN * FFN * 4);
	void *blocks = malloc(HIDDEN * FFN);
	for (uint32_t e = 0; e < 4; e++)
		for (int p = 0; p < 3; p++) {
			const struct moe_proj_ref *r = &moe_catalog_expert(cat, 1, e)->proj[p];
			cr_assert_eq(r->layout, MOE_LAYOUT_NVFP4_MODELOPT);
			cr_assert_eq(r->data.length, r->rows * r->cols / 2);
			cr_assert_eq(r->scale.length, r->rows * r->cols / 16);
			cr_assert_eq(moe_proj_kernel_bytes(r), r->rows * r->cols / 64 * 36);
			cr_assert_gt(r->tensor_scale, 0.0f);
			void *w = read_extent(cat, &r->data), *s = read_extent(cat, &r->scale);
			char why[200];
			cr_assert_eq(moek_nvfp4_from_modelopt(w, s, r->rows, r->cols, blocks, why,
			                                      sizeof(why)),
			             0, "%s", why);
			cr_assert_eq(
			    moek_dequantize(MOEK_NVFP4, blocks, NULL, r->rows, r->cols, got), 0);
			const size_t n = r->rows * r->cols;
			for (int k = 0; k < 2; k++) {
				moe_gen_floats(SEED, 1, (e + (uint32_t)k) % 4, which[p], r->cols, 0,
				               n, want);
				double num = 0, den = 0;
				for (size_t i = 0; i < n; i++) {
					const double d = (double)got[i] * r->tensor_scale - want[i];
					num += d * d, den += (double)want[i] * want[i];
				}
				if (k == 0)
					cr_assert(num / den < 1.5e-2 && num / den > 1e-4,
					          "expert %u %s: nmse %.3g", e,
					          moe_proj_name((enum moe_proj)p), num / den);
				else
					cr_assert(num / den > 0.5, "the neighbour's weights");
			}
			free(w), free(s);
		}
	free(want), free(got), free(blocks);
	moe_catalog_close(cat);
	char *text;
	cr_assert_eq(run_inspect(out, &text), 0, "%s", text);
	cr_assert(strstr(text, "checkpoint      ModelOpt NVFP4, E4M3 scale per 16, per-tensor FP32 "
	                       "scale (repacked to NVFP4 blocks at load)\n"),
	          "%s", text);
	free(text);
	remove_tree(dir);
}

/* hf_quant_config.json (ModelOpt's own file) stands in for a config.json without
 * quantization_config; its quant_algo is checked the same way. */
Test(nvfp4_checkpoint, hf_quant_config_json)
{
	char *dir = scratch_dir();
	char out[512], path[600];
	snprintf(out, sizeof(out), "%s/hf", dir);
	generate_nvfp4(out);
	snprintf(path, sizeof(path), "%s/config.json", out);
	patch_file(path, "\"quantization_config\"", "\"quantization_c0nfig\"");
	snprintf(path, sizeof(path), "%s/hf_quant_config.json", out);
	const char *hq = "{\"producer\": {\"name\": \"modelopt\", \"version\": \"0.29.0\"}, "
	                 "\"quantization\": {\"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": "
	                 "null, \"group_size\": 16, \"exclude_modules\": [\"lm_head\"]}}";
	write_file(path, hq, strlen(hq));
	struct moe_catalog *cat = NULL;
	struct sidecar_error err = {0};
	cr_assert_eq(moe_catalog_open(out, &cat, &err), 0, "%s", err.msg);
	cr_assert_eq(cat->quant.kind, MOE_QUANT_NVFP4);
	moe_catalog_close(cat);
	patch_file(path, "\"NVFP4\"", "\"W4A8_\"");
	cr_assert_eq(moe_catalog_open(out, &cat, &err), -1);
	char want[1024];
	snprintf(want, sizeof(want),
	         "%s: quantization: ModelOpt quant_algo W4A8_ is not supported (NVFP4 only)", path);
	cr_assert_str_eq(err.msg, want);
	remove_tree(dir);
}

Test(nvfp4_checkpoint, malformed_configs_and_tensors_refused)
{
	expect_nvfp4_refusal("config.json", "\"quant_algo\": \"NVFP4\"",
	                     "\"quant_algo\": \"FP8__\"",
	                     "%s/hf/config.json: quantization_config: ModelOpt quant_algo FP8__ is "
	                     "not supported (NVFP4 only)");
	expect_nvfp4_refusal("config.json", "\"group_size\": 16", "\"group_size\": 32",
	                     "%s/hf/config.json: quantization_config: ModelOpt NVFP4 group_size 32 "
	                     "is not supported (16: one E4M3 scale per 16 weights)");
	/* the per-tensor scale renamed away: missing */
	expect_nvfp4_refusal("model.safetensors",
	                     "layers.0.mlp.experts.0.gate_proj.weight_scale_2\"",
	                     "layers.0.mlp.experts.0.gate_proj.weight_scale_X\"",
	                     "%s/hf: tensor model.layers.0.mlp.experts.0.gate_proj.weight_scale_2 "
	                     "is missing (ModelOpt NVFP4: the per-tensor FP32 scale)");
	/* wrong dtypes, same sizes */
	expect_nvfp4_refusal("model.safetensors", "gate_proj.weight_scale_2\":{\"dtype\":\"F32\"",
	                     "gate_proj.weight_scale_2\":{\"dtype\":\"I32\"",
	                     "%s/hf: tensor model.layers.0.mlp.experts.0.gate_proj.weight_scale_2: "
	                     "expected one F32 value, found I32 of 4 bytes");
	expect_nvfp4_refusal(
	    "model.safetensors", "gate_proj.weight_scale\":{\"dtype\":\"F8_E4M3\"",
	    "gate_proj.weight_scale\":{\"dtype\":\"F8_E5M2\"",
	    "%s/hf: tensor model.layers.0.mlp.experts.0.gate_proj.weight_scale: expected F8_E4M3 "
	    "[128, 16] (ModelOpt NVFP4: one E4M3 scale per 16 weights), found F8_E5M2 [128, 16] (2 "
	    "dims)");
	/* a transposed weight_scale (same bytes, wrong shape) */
	expect_nvfp4_refusal(
	    "model.safetensors",
	    "gate_proj.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[128,16]",
	    "gate_proj.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[16,128]",
	    "%s/hf: tensor model.layers.0.mlp.experts.0.gate_proj.weight_scale: expected F8_E4M3 "
	    "[128, 16] (ModelOpt NVFP4: one E4M3 scale per 16 weights), found F8_E4M3 [16, 128] (2 "
	    "dims)");
	/* a weight of another 1-byte dtype: not ModelOpt's U8 pairs */
	expect_nvfp4_refusal("model.safetensors", "gate_proj.weight\":{\"dtype\":\"U8\"",
	                     "gate_proj.weight\":{\"dtype\":\"I8\"",
	                     "%s/hf: tensor model.layers.0.mlp.experts.0.gate_proj.weight: type I8 "
	                     "is not supported for expert weights (supported: ");
}
