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
	cr_expect_eq(mapped, 22); /* F32 … MXFP4, NVFP4, Q8_K and seven i-quants included */
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

/* Sets the u32 value of GGUF metadata key `key` (stored after its name and type) to v. */
static void patch_gguf_u32(const char *path, const char *key, uint32_t v)
{
	size_t len;
	char *buf = slurp(path, &len);
	const size_t kl = strlen(key);
	size_t at = 0;
	while (at + kl + 8 <= len && memcmp(buf + at, key, kl))
		at++;
	cr_assert_lt(at + kl + 8, len, "%s: %s not found", path, key);
	cr_assert_eq(buf[at + kl], GGUF_UINT32, "%s is not a u32", key);
	memcpy(buf + at + kl + 4, &v, 4);
	write_file(path, buf, len);
	free(buf);
}

/* Each new family, generated in both containers and inspected: the blocks that are MoE, the
 * shared expert, the gating facts. */
Test(catalog, new_families_inspect)
{
	static const struct {
		const char *preset, *gguf_arch, *hf_arch, *layers, *experts, *gating;
	} cases[] = {
	    {"glm-4.5", "glm4moe (GGUF)", "glm4_moe (family glm4moe, safetensors)",
	     "layers          5 (2 MoE: 3 4)", "experts         4 routed, top-4, 1 shared\n",
	     "gating          sigmoid, norm_topk_prob yes, routed scaling 2.5, score bias\n"},
	    {"minimax-m2", "minimax-m2 (GGUF)", "minimax_m2 (family minimax-m2, safetensors)",
	     "layers          5 (5 MoE: 0 1 2 3 4)", "experts         4 routed, top-4, 0 shared\n",
	     "gating          sigmoid, norm_topk_prob yes, routed scaling 1, score bias\n"},
	    {"llama4-maverick", "llama4 (GGUF)", "llama4 (safetensors)",
	     "layers          5 (2 MoE: 1 3)",
	     "experts         4 routed, top-1, 1 shared, MoE every 2 blocks\n",
	     "gating          sigmoid, norm_topk_prob no, routed scaling 1, weight on the "
	     "expert's input\n"},
	    {"qwen3-next-80b-a3b", "qwen3next (GGUF)", "qwen3_next (family qwen3next, safetensors)",
	     "layers          5 (5 MoE: 0 1 2 3 4)",
	     "experts         4 routed, top-4, 1 shared (gated)\n",
	     "gating          softmax, norm_topk_prob yes, routed scaling 1\n"},
	};
	char *d = scratch_dir();
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		for (int hf = 0; hf < 2; hf++) {
			char p[512], *out;
			snprintf(p, sizeof(p), hf ? "%s/%s-hf" : "%s/%s.gguf", d, cases[i].preset);
			generate(cases[i].preset, p, hf ? MOEK_BF16 : MOEK_Q4_K, 5, 0);
			cr_assert_eq(run_inspect(p, &out), 0, "%s", out);
			char arch[128];
			snprintf(arch, sizeof(arch), "architecture    %s\n",
			         hf ? cases[i].hf_arch : cases[i].gguf_arch);
			cr_assert_not_null(strstr(out, arch), "%s", out);
			cr_assert_not_null(strstr(out, cases[i].layers), "%s", out);
			cr_assert_not_null(strstr(out, cases[i].experts), "%s", out);
			cr_assert_not_null(strstr(out, cases[i].gating), "%s", out);
			cr_assert_not_null(
			    strstr(out, "dims            hidden 256, expert ffn 256"), "%s", out);
			free(out);
		}
	remove_tree(d);
}

static void refused(const char *path, const char *what)
{
	struct moe_catalog *cat;
	struct sidecar_error err;
	cr_assert_eq(moe_catalog_open(path, &cat, &err), -1, "%s: accepted (%s)", path, what);
	cr_assert_not_null(strstr(err.msg, what), "%s: '%s' not in: %s", path, what, err.msg);
}

/* Malformed configurations of the new families are refused, the error naming the field. */
Test(catalog, new_families_malformed)
{
	char *d = scratch_dir();
	char p[512], cfg[600];
	snprintf(p, sizeof(p), "%s/l4", d);
	snprintf(cfg, sizeof(cfg), "%s/config.json", p);
	generate("llama4-maverick", p, MOEK_BF16, 4, 0);
	moe_catalog_close(open_ok(p));
	rewrite(cfg, "\"interleave_moe_layer_step\": 2", "\"interleave_moe_layer_step\": 0");
	refused(p, "interleave_moe_layer_step is 0");
	rewrite(cfg, "\"interleave_moe_layer_step\": 0", "\"interleave_moe_layer_step\": 9");
	refused(p, "interleave_moe_layer_step 9 exceeds num_hidden_layers 4");
	rewrite(cfg, "\"interleave_moe_layer_step\": 9", "\"interleave_moe_layer_step\": 1");
	refused(p, "layer 0 is an MoE layer"); /* the file has experts in blocks 1 and 3 only */
	rewrite(cfg, "\"interleave_moe_layer_step\": 1", "\"interleave_moe_layer_step\": 2");
	rewrite(cfg, "\"intermediate_size\": 256", "\"intermediate_sizes\": 256");
	refused(p, "text_config.intermediate_size is missing");
	rewrite(cfg, "\"intermediate_sizes\": 256", "\"intermediate_size\": 128");
	refused(p, "feed_forward.experts.gate_up_proj: shape [4, 256, 512] disagrees");
	rewrite(cfg, "\"intermediate_size\": 128", "\"intermediate_size\": 256");
	rewrite(cfg, "\"text_config\": {", "\"text_config\": 7, \"x\": {");
	refused(p, "text_config is not an object");

	snprintf(p, sizeof(p), "%s/glm", d);
	snprintf(cfg, sizeof(cfg), "%s/config.json", p);
	generate("glm-4.5", p, MOEK_BF16, 4, 0);
	rewrite(cfg, "\"n_group\": 1", "\"n_group\": 3");
	refused(p, "n_group, topk_group = 3, 1");
	rewrite(cfg, "\"n_group\": 3", "\"n_group\": 2");
	rewrite(cfg, "\"topk_group\": 1", "\"topk_group\": 4");
	refused(p, "n_group, topk_group = 2, 4");
	rewrite(cfg, "\"topk_group\": 4", "\"topk_group\": 1");
	rewrite(cfg, "\"n_routed_experts\"", "\"num_experts\"");
	refused(p, "n_routed_experts is missing");
	rewrite(cfg, "\"num_experts\"", "\"n_routed_experts\"");
	rewrite(cfg, "\"first_k_dense_replace\": 3", "\"first_k_dense_replace\": 7");
	refused(p, "first_k_dense_replace 7 exceeds num_hidden_layers 4");

	snprintf(p, sizeof(p), "%s/mm", d);
	snprintf(cfg, sizeof(cfg), "%s/config.json", p);
	generate("minimax-m2", p, MOEK_BF16, 2, 0);
	rewrite(cfg, "\"use_routing_bias\": true", "\"use_routing_bias\": 1");
	refused(p, "use_routing_bias is not a bool");
	rewrite(cfg, "\"use_routing_bias\": 1", "\"use_routing_bias\": true");
	rewrite(cfg, "\"num_local_experts\"", "\"num_experts\"");
	refused(p, "num_local_experts is missing");

	snprintf(p, sizeof(p), "%s/qn", d);
	snprintf(cfg, sizeof(cfg), "%s/config.json", p);
	generate("qwen3-next-80b-a3b", p, MOEK_BF16, 2, 0);
	rewrite(cfg, "\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 0");
	refused(p, "decoder_sparse_step is 0");

	/* GGUF: llama4.interleave_moe_layer_step 0 and out of range */
	snprintf(p, sizeof(p), "%s/l4.gguf", d);
	generate("llama4-maverick", p, MOEK_Q8_0, 4, 0);
	patch_gguf_u32(p, "llama4.interleave_moe_layer_step", 0);
	refused(p, "llama4.interleave_moe_layer_step 0 is not in 1..block_count (4)");
	patch_gguf_u32(p, "llama4.interleave_moe_layer_step", 1);
	refused(p, "blk.0: no expert tensors");
	snprintf(p, sizeof(p), "%s/glm.gguf", d);
	generate("glm-4.5", p, MOEK_Q8_0, 4, 0);
	patch_gguf_u32(p, "glm4moe.nextn_predict_layers", 4);
	refused(p, "glm4moe.nextn_predict_layers 4 leaves no block");
	remove_tree(d);
}
