/* test_catalog.c — catalog behaviour beyond the round trips: Qwen2-MoE naming, dense-layer
 * rules from config.json (mlp_only_layers, decoder_sparse_step), 4 KiB slab alignment, and
 * the `moe-sidecar inspect` command's text and JSON output. */
#include <inttypes.h>
#include <sys/wait.h>

#include "gguf.h"
#include "json.h"
#include "model_files.h"
#include "moe_gen.h"
#include "moe_kernels.h"

static void generate(const char *preset, const char *out, uint32_t format, uint32_t layers,
                     uint32_t alignment)
{
	struct moe_gen_options o = {.preset = preset,
	                            .out = out,
	                            .format = format,
	                            .seed = 3,
	                            .layers = layers,
	                            .hidden = 256,
	                            .ffn = 256,
	                            .experts = 4,
	                            .alignment = alignment};
	struct sidecar_error err;
	cr_assert_eq(moe_gen_write(&o, &err), 0, "%s", err.msg);
}

static struct moe_catalog *open_ok(const char *path)
{
	struct moe_catalog *cat;
	struct sidecar_error err;
	cr_assert_eq(moe_catalog_open(path, &cat, &err), 0, "%s", err.msg);
	return cat;
}

/* Replaces every occurrence of `from` in the file by `to` (any lengths). */
static void rewrite(const char *path, const char *from, const char *to)
{
	size_t len;
	char *buf = slurp(path, &len);
	size_t fl = strlen(from), tl = strlen(to), n = 0;
	char *out = malloc(len * (tl > fl ? tl : fl) / (fl ? fl : 1) + len + 1), *o = out;
	for (size_t i = 0; i < len;) {
		if (i + fl <= len && !memcmp(buf + i, from, fl)) {
			memcpy(o, to, tl);
			o += tl;
			i += fl;
			n++;
		} else {
			*o++ = buf[i++];
		}
	}
	cr_assert_gt(n, 0, "%s: '%s' not found", path, from);
	write_file(path, out, (size_t)(o - out));
	free(out);
	free(buf);
}

Test(catalog, qwen2moe_gguf_and_hf)
{
	char *d = scratch_dir();
	char p[512];
	snprintf(p, sizeof(p), "%s/m.gguf", d);
	generate("qwen3-30b-a3b", p, MOEK_Q8_0, 2, 0);
	rewrite(p, "qwen3moe", "qwen2moe"); /* same length: the architecture and its keys */
	rewrite(p, "qwen2moe.expert_weights_norm", "qwen2moe.expert_weights_xxxx");
	struct moe_catalog *cat = open_ok(p);
	cr_assert_eq(cat->info.arch, MOE_ARCH_QWEN2MOE);
	cr_assert_not(cat->info.norm_topk_prob, "Qwen2-MoE does not renormalise by default");
	cr_assert_eq(cat->info.n_moe_layers, 2);
	moe_catalog_close(cat);

	snprintf(p, sizeof(p), "%s/hf", d);
	generate("qwen3-30b-a3b", p, MOEK_BF16, 2, 0);
	char cfg[600];
	snprintf(cfg, sizeof(cfg), "%s/config.json", p);
	rewrite(cfg, "qwen3_moe", "qwen2_moe");
	rewrite(cfg, "\"norm_topk_prob\": true",
	        "\"norm_topk_prob\": false, "
	        "\"shared_expert_intermediate_size\": 5632");
	cat = open_ok(p);
	cr_assert_eq(cat->info.arch, MOE_ARCH_QWEN2MOE);
	cr_assert_eq(cat->info.n_shared_experts, 1);
	cr_assert_not(cat->info.norm_topk_prob);
	moe_catalog_close(cat);
	remove_tree(d);
}

Test(catalog, dense_layers_from_config)
{
	char *d = scratch_dir();
	char p[512], cfg[600];
	snprintf(p, sizeof(p), "%s/hf", d);
	snprintf(cfg, sizeof(cfg), "%s/config.json", p);
	generate("qwen3-30b-a3b", p, MOEK_BF16, 4, 0);

	rewrite(cfg, "\"mlp_only_layers\": []", "\"mlp_only_layers\": [0, 2]");
	struct moe_catalog *cat = open_ok(p);
	cr_assert_eq(cat->info.n_moe_layers, 2);
	cr_assert_not(cat->layers[0].moe);
	cr_assert(cat->layers[1].moe);
	cr_assert_not(cat->layers[2].moe);
	cr_assert(cat->layers[3].moe);
	cr_assert_null(moe_catalog_expert(cat, 2, 0));
	cr_assert_not_null(moe_catalog_expert(cat, 3, 3));
	cr_assert_null(moe_catalog_expert(cat, 3, 4));
	cr_assert_null(moe_catalog_expert(cat, 4, 0));
	moe_catalog_close(cat);

	rewrite(cfg, "\"mlp_only_layers\": [0, 2]", "\"mlp_only_layers\": []");
	rewrite(cfg, "\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2");
	cat = open_ok(p);
	cr_assert_eq(cat->info.n_moe_layers, 2); /* (L + 1) % 2 == 0: layers 1 and 3 */
	cr_assert(cat->layers[1].moe && cat->layers[3].moe);
	cr_assert_not(cat->layers[0].moe || cat->layers[2].moe);
	moe_catalog_close(cat);

	rewrite(cfg, "\"mlp_only_layers\": []", "\"mlp_only_layers\": [1, 9]");
	struct sidecar_error err;
	cr_assert_eq(moe_catalog_open(p, &cat, &err), -1);
	cr_assert_not_null(strstr(err.msg, "mlp_only_layers holds a bad layer index"), "%s",
	                   err.msg);
	remove_tree(d);
}

Test(catalog, slab_alignment_follows_the_file)
{
	char *d = scratch_dir();
	char p[512];
	/* general.alignment 4096 and F32 256x256 slabs (256 KiB): every slab page-aligned */
	snprintf(p, sizeof(p), "%s/aligned.gguf", d);
	generate("olmoe", p, MOEK_F32, 2, 4096);
	struct moe_catalog *cat = open_ok(p);
	cr_assert_eq(cat->n_experts_aligned_4k, 2 * 4);
	for (uint32_t e = 0; e < 4; e++) {
		const struct moe_expert *ex = moe_catalog_expert(cat, 1, e);
		cr_assert(ex->aligned_4k);
		cr_assert_eq(ex->proj[MOE_PROJ_GATE].data.offset % 4096, 0);
	}
	moe_catalog_close(cat);
	/* the default 32-byte alignment after a router tensor: slabs are not page-aligned */
	snprintf(p, sizeof(p), "%s/packed.gguf", d);
	generate("olmoe", p, MOEK_Q4_0, 2, 0);
	cat = open_ok(p);
	cr_assert_eq(cat->n_experts_aligned_4k, 0);
	cr_assert_not(moe_catalog_expert(cat, 0, 1)->aligned_4k);
	moe_catalog_close(cat);
	remove_tree(d);
}

/* Runs `moe-sidecar inspect ARGS`, returns its exit status and stdout (malloc'd). */
static int run_inspect(const char *args, char **out)
{
	char cmd[1200];
	snprintf(cmd, sizeof(cmd), "%s inspect %s 2>&1", MOE_SIDECAR_BIN, args);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	size_t k;
	while ((k = fread(buf + len, 1, cap - 1 - len, p)) > 0)
		len += k;
	buf[len] = '\0';
	int st = pclose(p);
	*out = buf;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(catalog, inspect_text_and_json)
{
	char *d = scratch_dir();
	char p[512];
	snprintf(p, sizeof(p), "%s/ds", d);
	generate("deepseek-v3", p, MOEK_FP8_E4M3_B128, 3, 0);
	struct moe_catalog *cat = open_ok(p);

	char *out;
	cr_assert_eq(run_inspect(p, &out), 0, "%s", out);
	cr_assert_not_null(
	    strstr(out, "architecture    deepseek_v3 (family deepseek, safetensors)"), "%s", out);
	cr_assert_not_null(strstr(out, "layers          3 (1 MoE: 2)"), "%s", out);
	cr_assert_not_null(strstr(out, "FP8_E4M3_B128"), "%s", out);
	free(out);

	char args[600];
	snprintf(args, sizeof(args), "%s --json", p);
	cr_assert_eq(run_inspect(args, &out), 0, "%s", out);
	struct json_doc *doc;
	struct sidecar_error err;
	cr_assert_eq(json_parse(out, strlen(out), &doc, &err), 0, "%s: %s", err.msg, out);
	json_ref r = json_root(doc);
	uint64_t v;
	cr_assert_str_eq(json_string(doc, json_object_get(doc, r, "architecture"), NULL),
	                 "deepseek_v3");
	cr_assert_str_eq(json_string(doc, json_object_get(doc, r, "family"), NULL), "deepseek");
	struct {
		const char *key;
		uint64_t want;
	} fields[] = {{"n_layers", 3},
	              {"n_moe_layers", 1},
	              {"n_experts", 4},
	              {"top_k", 4},
	              {"hidden", 256},
	              {"expert_ffn", 256},
	              {"expert_bytes_total", cat->expert_bytes_total}};
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		cr_assert_eq(json_get_u64(doc, r, fields[i].key, &v), 1, "%s missing",
		             fields[i].key);
		cr_assert_eq(v, fields[i].want, "%s = %" PRIu64, fields[i].key, v);
	}
	cr_assert_eq(cat->expert_bytes_total, 4 * 3 * (256 * 256 + moek_fp8_scale_bytes(256, 256)));
	json_ref formats = json_object_get(doc, r, "formats");
	cr_assert_eq(json_count(doc, formats), 1);
	cr_assert_str_eq(json_string(doc, json_first(doc, formats), NULL), "FP8_E4M3_B128");
	json_free(doc);
	free(out);
	moe_catalog_close(cat);

	/* The file's own architecture, GGUF's "deepseek2", beside the family. */
	snprintf(p, sizeof(p), "%s/ds.gguf", d);
	generate("deepseek-v3", p, MOEK_Q8_0, 3, 0);
	cr_assert_eq(run_inspect(p, &out), 0, "%s", out);
	cr_assert_not_null(strstr(out, "architecture    deepseek2 (family deepseek, GGUF)"), "%s",
	                   out);
	free(out);
	snprintf(args, sizeof(args), "%s --json", p);
	cr_assert_eq(run_inspect(args, &out), 0, "%s", out);
	cr_assert_eq(json_parse(out, strlen(out), &doc, &err), 0, "%s: %s", err.msg, out);
	r = json_root(doc);
	cr_assert_str_eq(json_string(doc, json_object_get(doc, r, "architecture"), NULL),
	                 "deepseek2");
	cr_assert_str_eq(json_string(doc, json_object_get(doc, r, "family"), NULL), "deepseek");
	json_free(doc);
	free(out);
	/* A name the family shares is said once. */
	snprintf(p, sizeof(p), "%s/q.gguf", d);
	generate("qwen3-30b-a3b", p, MOEK_Q8_0, 1, 0);
	cr_assert_eq(run_inspect(p, &out), 0, "%s", out);
	cr_assert_not_null(strstr(out, "architecture    qwen3moe (GGUF)\n"), "%s", out);
	free(out);

	snprintf(args, sizeof(args), "%s/missing.gguf", d);
	cr_assert_eq(run_inspect(args, &out), 1);
	cr_assert_not_null(strstr(out, "missing.gguf: No such file"), "%s", out);
	free(out);
	cr_assert_eq(run_inspect("", &out), 2);
	free(out);
	remove_tree(d);
}

/* What experts may be in comes from the kernels' table, by ggml type; gguf's own table (the
 * size of every ggml type) agrees with it on the types both know. */
Test(catalog, ggml_types_map_through_the_kernels_table)
{
	size_t mapped = 0;
	for (uint32_t t = 0; t < 64; t++) {
		const struct moek_format_info *f = moek_format_from_ggml(t);
		if (!f)
			continue;
		mapped++;
		cr_expect_eq(f->format, t);
		cr_assert_not_null(gguf_type_name(t), "ggml type %u", t);
		cr_expect_str_eq(gguf_type_name(t), f->name);
		cr_expect_eq(gguf_type_block_elems(t), f->block_elems, "%s", f->name);
		cr_expect_eq(gguf_type_block_bytes(t), f->block_bytes, "%s", f->name);
	}
	cr_expect_eq(mapped, 21); /* F32 … MXFP4, Q8_K and seven i-quants included */
	cr_expect_null(moek_format_from_ggml(3)); /* Q4_1: gguf knows it, no kernels */
	cr_expect_not_null(gguf_type_name(3));
	cr_expect_null(moek_format_from_ggml(MOEK_FP8_E4M3_B128)); /* the sidecar's own */
	cr_expect_null(moek_format_from_ggml(MOEK_INT4_G32));
}

Test(catalog, architecture_names_map_both_ways)
{
	for (unsigned a = 0; a < MOE_ARCH_COUNT; a++) {
		enum moe_arch back;
		cr_assert_eq(moe_arch_from_gguf(moe_arch_gguf_name((enum moe_arch)a), &back), 0);
		cr_assert_eq(back, a, "%s", moe_arch_name((enum moe_arch)a));
		cr_assert_eq(moe_arch_from_model_type(moe_arch_model_type((enum moe_arch)a), &back),
		             0);
		cr_assert_eq(back, a, "%s", moe_arch_name((enum moe_arch)a));
	}
	enum moe_arch a;
	cr_assert_str_eq(moe_arch_gguf_name(MOE_ARCH_MIXTRAL), "llama");
	cr_assert_eq(moe_arch_from_model_type("deepseek_v2", &a), 0);
	cr_assert_eq(a, MOE_ARCH_DEEPSEEK);
	cr_assert_str_eq(moe_arch_model_type(MOE_ARCH_DEEPSEEK), "deepseek_v3");
	cr_assert_eq(moe_arch_from_gguf("qwen3_moe", &a), -1, "a model_type is not a GGUF name");
	cr_assert_eq(moe_arch_from_model_type("llama", &a), -1);
	cr_assert_str_eq(moe_arch_gguf_name(MOE_ARCH_COUNT), "?");
}
