/* test_full_model.c — `moe-gen --full-model`: every preset in both containers gives the
 * catalog the same experts, byte for byte, as the experts-only model of the same seed (the
 * catalog ignores the other tensors); the other tensors exist under the architecture's real
 * names with the shapes and types transformers and llama.cpp expect, read back with the
 * project's own safetensors and GGUF readers; config.json and the GGUF keys and tokenizer say
 * what the loaders need; bad dimension options are refused with a reason. */
#include <inttypes.h>
#include <math.h>

#include "gguf.h"
#include "json.h"
#include "model_files.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "safetensors.h"

#define SEED 7u
#define VOCAB 320u
#define HIDDEN 256u
#define LAYERS 4u
#define EXPERTS 4u

static int generate(const char *preset, const char *out, uint32_t format, bool full,
                    uint32_t shards, uint32_t threads, struct sidecar_error *err)
{
	struct moe_gen_options o = {.preset = preset,
	                            .out = out,
	                            .format = format,
	                            .seed = SEED,
	                            .layers = LAYERS,
	                            .hidden = HIDDEN,
	                            .ffn = 256,
	                            .experts = EXPERTS,
	                            .shards = shards,
	                            .threads = threads,
	                            .full_model = full,
	                            .vocab = full ? VOCAB : 0};
	return moe_gen_write(&o, err);
}

static void generate_ok(const char *preset, const char *out, uint32_t format, bool full,
                        uint32_t shards)
{
	struct sidecar_error err;
	cr_assert_eq(generate(preset, out, format, full, shards, 0, &err), 0, "%s: %s", preset,
	             err.msg);
}

static struct moe_catalog *open_catalog(const char *path)
{
	struct moe_catalog *cat;
	struct sidecar_error err;
	cr_assert_eq(moe_catalog_open(path, &cat, &err), 0, "%s: %s", path, err.msg);
	return cat;
}

static void same_extent_bytes(const struct moe_catalog *a, const struct moe_extent *xa,
                              const struct moe_catalog *b, const struct moe_extent *xb,
                              const char *what)
{
	cr_assert_eq(xa->length, xb->length, "%s: length", what);
	if (!xa->length)
		return;
	void *pa = read_extent(a, xa), *pb = read_extent(b, xb);
	cr_assert(!memcmp(pa, pb, xa->length), "%s: bytes differ", what);
	free(pa);
	free(pb);
}

/* Both catalogs describe the same experts: hyperparameters, shapes, formats and bytes. */
static void assert_same_experts(const struct moe_catalog *a, const struct moe_catalog *b,
                                const char *what)
{
	const struct moe_model_hparams *x = &a->info, *y = &b->info;
	cr_assert_eq(x->arch, y->arch, "%s", what);
	cr_assert_eq(x->n_layers, y->n_layers, "%s", what);
	cr_assert_eq(x->n_moe_layers, y->n_moe_layers, "%s", what);
	cr_assert_eq(x->n_experts, y->n_experts, "%s", what);
	cr_assert_eq(x->top_k, y->top_k, "%s", what);
	cr_assert_eq(x->n_shared_experts, y->n_shared_experts, "%s", what);
	cr_assert_eq(x->hidden, y->hidden, "%s", what);
	cr_assert_eq(x->expert_ffn, y->expert_ffn, "%s", what);
	cr_assert_eq(x->gating, y->gating, "%s", what);
	cr_assert_eq(x->norm_topk_prob, y->norm_topk_prob, "%s", what);
	cr_assert_eq(x->has_bias, y->has_bias, "%s", what);
	cr_assert_eq(a->expert_bytes_total, b->expert_bytes_total, "%s", what);
	for (uint32_t L = 0; L < x->n_layers; L++) {
		cr_assert_eq(a->layers[L].moe, b->layers[L].moe, "%s: layer %u", what, L);
		for (uint32_t e = 0; a->layers[L].moe && e < x->n_experts; e++) {
			const struct moe_expert *ea = moe_catalog_expert(a, L, e);
			const struct moe_expert *eb = moe_catalog_expert(b, L, e);
			for (int p = 0; p < MOE_PROJ_COUNT; p++) {
				const struct moe_proj_ref *pa = &ea->proj[p], *pb = &eb->proj[p];
				char w[160];
				snprintf(w, sizeof(w), "%s: layer %u expert %u %s", what, L, e,
				         moe_proj_name((enum moe_proj)p));
				cr_assert_eq(pa->present, pb->present, "%s", w);
				if (!pa->present)
					continue;
				cr_assert_eq(pa->format, pb->format, "%s", w);
				cr_assert_eq(pa->layout, pb->layout, "%s", w);
				cr_assert_eq(pa->rows, pb->rows, "%s", w);
				cr_assert_eq(pa->cols, pb->cols, "%s", w);
				cr_assert_eq(pa->bias_format, pb->bias_format, "%s", w);
				same_extent_bytes(a, &pa->data, b, &pb->data, w);
				same_extent_bytes(a, &pa->scale, b, &pb->scale, w);
				same_extent_bytes(a, &pa->bias, b, &pb->bias, w);
			}
		}
	}
}

static const struct {
	const char *preset;
	uint32_t gguf_format, st_format;
} cases[] = {
    {"qwen3-30b-a3b", MOEK_Q8_0, MOEK_BF16},
    {"mixtral-8x7b", MOEK_Q4_K, MOEK_BF16},
    {"deepseek-v3", MOEK_Q6_K, MOEK_FP8_E4M3_B128},
    {"gpt-oss-20b", MOEK_MXFP4, MOEK_MXFP4},
    {"olmoe", MOEK_BF16, MOEK_F16},
};

Test(full_model, catalog_sees_the_same_experts)
{
	char *d = scratch_dir();
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		for (int gguf = 0; gguf < 2; gguf++) {
			char a[512], b[512], what[96];
			const char *ext = gguf ? ".gguf" : "";
			uint32_t f = gguf ? cases[i].gguf_format : cases[i].st_format;
			snprintf(a, sizeof(a), "%s/%s-experts%s", d, cases[i].preset, ext);
			snprintf(b, sizeof(b), "%s/%s-full%s", d, cases[i].preset, ext);
			snprintf(what, sizeof(what), "%s %s", cases[i].preset,
			         gguf ? "GGUF" : "safetensors");
			generate_ok(cases[i].preset, a, f, false, 0);
			generate_ok(cases[i].preset, b, f, true, 0);
			struct moe_catalog *ca = open_catalog(a), *cb = open_catalog(b);
			assert_same_experts(ca, cb, what);
			cr_assert_gt(cb->files[0].size, ca->files[0].size, "%s: nothing added",
			             what);
			moe_catalog_close(ca);
			moe_catalog_close(cb);
		}
	}
	remove_tree(d);
}

Test(full_model, sharded_and_split)
{
	char *d = scratch_dir();
	char a[512], b[512];
	snprintf(a, sizeof(a), "%s/experts", d);
	snprintf(b, sizeof(b), "%s/full", d);
	generate_ok("deepseek-v3", a, MOEK_FP8_E4M3_B128, false, 0);
	generate_ok("deepseek-v3", b, MOEK_FP8_E4M3_B128, true, 3);
	struct moe_catalog *ca = open_catalog(a), *cb = open_catalog(b);
	cr_assert_eq(cb->n_files, 3);
	assert_same_experts(ca, cb, "deepseek-v3 3 shards");
	moe_catalog_close(ca);
	moe_catalog_close(cb);

	snprintf(a, sizeof(a), "%s/e.gguf", d);
	snprintf(b, sizeof(b), "%s/f.gguf", d);
	generate_ok("qwen3-30b-a3b", a, MOEK_Q8_0, false, 0);
	generate_ok("qwen3-30b-a3b", b, MOEK_Q8_0, true, 2);
	snprintf(b, sizeof(b), "%s/f-00001-of-00002.gguf", d);
	ca = open_catalog(a);
	cb = open_catalog(b);
	cr_assert_eq(cb->n_files, 2);
	assert_same_experts(ca, cb, "qwen3 2 GGUF splits");
	moe_catalog_close(ca);
	moe_catalog_close(cb);
	remove_tree(d);
}

/* ---- names, shapes and types -------------------------------------------------------------- */

/* A tensor: name, dims (safetensors: outermost first; GGUF: ne, innermost first) and type
 * (an st_dtype or a ggml type). */
struct want {
	const char *name;
	uint32_t n_dims;
	uint64_t dims[3];
	int type;
};

static void check_st(const struct st_model *m, const struct want *w, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		const struct st_tensor_ref *r = st_find(m, w[i].name);
		cr_assert_not_null(r, "%s: %s is missing", what, w[i].name);
		const struct st_tensor *t = r->tensor;
		cr_assert_eq(t->dtype, (enum st_dtype)w[i].type, "%s: %s is %s", what, w[i].name,
		             st_dtype_name(t->dtype));
		cr_assert_eq(t->n_dims, w[i].n_dims, "%s: %s dims", what, w[i].name);
		for (uint32_t k = 0; k < t->n_dims; k++)
			cr_assert_eq(t->shape[k], w[i].dims[k], "%s: %s dim %u is %" PRIu64, what,
			             w[i].name, k, t->shape[k]);
	}
}

static void check_gguf(const struct gguf_file *f, const struct want *w, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		const struct gguf_tensor *t = gguf_find_tensor(f, w[i].name);
		cr_assert_not_null(t, "%s: %s is missing", what, w[i].name);
		cr_assert_eq(t->type, (uint32_t)w[i].type, "%s: %s is %s", what, w[i].name,
		             gguf_type_name(t->type));
		cr_assert_eq(t->n_dims, w[i].n_dims, "%s: %s dims", what, w[i].name);
		for (uint32_t k = 0; k < t->n_dims; k++)
			cr_assert_eq(t->ne[k], w[i].dims[k], "%s: %s ne[%u] is %" PRIu64, what,
			             w[i].name, k, t->ne[k]);
	}
}

static uint64_t gguf_u64(const struct gguf_file *f, const char *key)
{
	uint64_t v = 0;
	cr_assert_eq(gguf_get_u64(f, key, &v), 1, "metadata %s", key);
	return v;
}

/* Qwen3-MoE at hidden 256: 4 heads, 1 kv head, head_dim 128 (scaled from 32/4/128). */
#define Q (4 * 128)
#define KV (1 * 128)

Test(full_model, qwen3_safetensors_names_and_config)
{
	char *d = scratch_dir();
	char p[512];
	snprintf(p, sizeof(p), "%s/q", d);
	generate_ok("qwen3-30b-a3b", p, MOEK_BF16, true, 0);
	struct st_model *m;
	struct sidecar_error err;
	cr_assert_eq(st_open_model(p, &m, &err), 0, "%s", err.msg);
	const struct want global[] = {
	    {"model.embed_tokens.weight", 2, {VOCAB, HIDDEN}, ST_BF16},
	    {"model.norm.weight", 1, {HIDDEN}, ST_BF16},
	    {"lm_head.weight", 2, {VOCAB, HIDDEN}, ST_BF16},
	};
	check_st(m, global, 3, "qwen3");
	for (uint32_t L = 0; L < LAYERS; L++) {
		char n[9][96];
		static const char *const s[9] = {
		    "input_layernorm.weight",  "self_attn.q_proj.weight",
		    "self_attn.k_proj.weight", "self_attn.v_proj.weight",
		    "self_attn.o_proj.weight", "self_attn.q_norm.weight",
		    "self_attn.k_norm.weight", "post_attention_layernorm.weight",
		    "mlp.gate.weight"};
		for (int k = 0; k < 9; k++)
			snprintf(n[k], sizeof(n[k]), "model.layers.%u.%s", L, s[k]);
		const struct want layer[] = {
		    {n[0], 1, {HIDDEN}, ST_BF16},
		    {n[1], 2, {Q, HIDDEN}, ST_BF16},
		    {n[2], 2, {KV, HIDDEN}, ST_BF16},
		    {n[3], 2, {KV, HIDDEN}, ST_BF16},
		    {n[4], 2, {HIDDEN, Q}, ST_BF16},
		    {n[5], 1, {128}, ST_BF16},
		    {n[6], 1, {128}, ST_BF16},
		    {n[7], 1, {HIDDEN}, ST_BF16},
		    {n[8], 2, {EXPERTS, HIDDEN}, ST_BF16},
		};
		check_st(m, layer, 9, "qwen3");
	}
	/* nothing else: 3 global, 9 per layer, 3 per expert */
	cr_assert_eq(m->n_tensors, 3 + LAYERS * (9 + 3 * EXPERTS));

	/* norm gains about 1, embeddings O(1): read back one of each */
	const struct st_tensor *t = st_find(m, "model.layers.2.input_layernorm.weight")->tensor;
	const struct st_tensor *e = st_find(m, "model.embed_tokens.weight")->tensor;
	int fd = open(m->files[0]->path, O_RDONLY);
	uint16_t g[HIDDEN], row[HIDDEN];
	cr_assert_eq(pread(fd, g, sizeof(g), (off_t)t->offset), (ssize_t)sizeof(g));
	cr_assert_eq(pread(fd, row, sizeof(row), (off_t)e->offset + 7 * sizeof(row)),
	             (ssize_t)sizeof(row));
	close(fd);
	double amax = 0;
	for (uint32_t i = 0; i < HIDDEN; i++) {
		uint32_t u = (uint32_t)g[i] << 16, v = (uint32_t)row[i] << 16;
		float x, y;
		memcpy(&x, &u, 4);
		memcpy(&y, &v, 4);
		cr_assert(x > 0.93f && x < 1.07f, "norm gain %g", (double)x);
		amax = fabs(y) > amax ? fabs(y) : amax;
	}
	cr_assert(amax > 0.5 && amax <= 1.0, "embedding row max %g", amax);
	st_close_model(m);

	/* config.json: what Qwen3MoeConfig reads */
	char cfg[600];
	snprintf(cfg, sizeof(cfg), "%s/config.json", p);
	size_t len;
	char *text = slurp(cfg, &len);
	struct json_doc *doc;
	cr_assert_eq(json_parse(text, len, &doc, &err), 0, "%s", err.msg);
	json_ref r = json_root(doc);
	static const struct {
		const char *key;
		uint64_t v;
	} ints[] = {{"vocab_size", VOCAB},
	            {"hidden_size", HIDDEN},
	            {"num_hidden_layers", LAYERS},
	            {"num_attention_heads", 4},
	            {"num_key_value_heads", 1},
	            {"head_dim", 128},
	            {"num_experts", EXPERTS},
	            {"num_experts_per_tok", EXPERTS},
	            {"moe_intermediate_size", 256},
	            {"decoder_sparse_step", 1},
	            {"max_position_embeddings", 40960},
	            {"eos_token_id", 256}};
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
		uint64_t v;
		cr_assert_eq(json_get_u64(doc, r, ints[i].key, &v), 1, "%s", ints[i].key);
		cr_assert_eq(v, ints[i].v, "%s = %" PRIu64, ints[i].key, v);
	}
	bool b;
	cr_assert_eq(json_get_bool(doc, r, "tie_word_embeddings", &b), 1);
	cr_assert_not(b);
	cr_assert_eq(json_get_bool(doc, r, "norm_topk_prob", &b), 1);
	cr_assert(b);
	cr_assert_eq(json_get_bool(doc, r, "attention_bias", &b), 1);
	cr_assert_not(b);
	double eps, theta;
	cr_assert_eq(json_get_double(doc, r, "rms_norm_eps", &eps), 1);
	cr_assert_eq(json_get_double(doc, r, "rope_theta", &theta), 1);
	cr_assert(eps == 1e-6 && theta == 1e6);
	cr_assert_str_eq(json_string(doc, json_object_get(doc, r, "model_type"), NULL),
	                 "qwen3_moe");
	cr_assert_str_eq(json_string(doc, json_object_get(doc, r, "torch_dtype"), NULL),
	                 "bfloat16");
	json_ref arch = json_object_get(doc, r, "architectures");
	cr_assert_str_eq(json_string(doc, json_first(doc, arch), NULL), "Qwen3MoeForCausalLM");
	cr_assert_eq(json_count(doc, json_object_get(doc, r, "mlp_only_layers")), 0);
	json_free(doc);
	free(text);
	snprintf(cfg, sizeof(cfg), "%s/generation_config.json", p);
	text = slurp(cfg, &len);
	cr_assert_eq(json_parse(text, len, &doc, &err), 0, "%s", err.msg);
	uint64_t eos;
	cr_assert_eq(json_get_u64(doc, json_root(doc), "eos_token_id", &eos), 1);
	cr_assert_eq(eos, 256);
	json_free(doc);
	free(text);
	remove_tree(d);
}

Test(full_model, qwen3_gguf_names_keys_tokenizer)
{
	char *d = scratch_dir();
	char p[512];
	snprintf(p, sizeof(p), "%s/q.gguf", d);
	generate_ok("qwen3-30b-a3b", p, MOEK_Q4_K, true, 0);
	struct gguf_file *f;
	struct sidecar_error err;
	cr_assert_eq(gguf_open(p, &f, &err), 0, "%s", err.msg);
	const struct want global[] = {
	    {"token_embd.weight", 2, {HIDDEN, VOCAB}, MOEK_F16},
	    {"output_norm.weight", 1, {HIDDEN}, MOEK_F32},
	    {"output.weight", 2, {HIDDEN, VOCAB}, MOEK_F16},
	};
	check_gguf(f, global, 3, "qwen3 GGUF");
	for (uint32_t L = 0; L < LAYERS; L++) {
		char n[12][64];
		static const char *const s[12] = {
		    "attn_norm.weight",     "attn_q.weight",      "attn_k.weight",
		    "attn_v.weight",        "attn_output.weight", "attn_q_norm.weight",
		    "attn_k_norm.weight",   "ffn_norm.weight",    "ffn_gate_inp.weight",
		    "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
		for (int k = 0; k < 12; k++)
			snprintf(n[k], sizeof(n[k]), "blk.%u.%s", L, s[k]);
		const struct want layer[] = {
		    {n[0], 1, {HIDDEN}, MOEK_F32},
		    {n[1], 2, {HIDDEN, Q}, MOEK_F16},
		    {n[2], 2, {HIDDEN, KV}, MOEK_F16},
		    {n[3], 2, {HIDDEN, KV}, MOEK_F16},
		    {n[4], 2, {Q, HIDDEN}, MOEK_F16},
		    {n[5], 1, {128}, MOEK_F32},
		    {n[6], 1, {128}, MOEK_F32},
		    {n[7], 1, {HIDDEN}, MOEK_F32},
		    {n[8], 2, {HIDDEN, EXPERTS}, MOEK_F32},
		    {n[9], 3, {HIDDEN, 256, EXPERTS}, MOEK_Q4_K},
		    {n[10], 3, {HIDDEN, 256, EXPERTS}, MOEK_Q4_K},
		    {n[11], 3, {256, HIDDEN, EXPERTS}, MOEK_Q4_K},
		};
		check_gguf(f, layer, 12, "qwen3 GGUF");
	}
	cr_assert_eq(f->n_tensors, 3 + LAYERS * 12, "llama.cpp refuses unused tensors");

	/* the keys llama.cpp's loader reads for qwen3moe */
	cr_assert_str_eq(gguf_get_str(f, "general.architecture"), "qwen3moe");
	cr_assert_eq(gguf_u64(f, "qwen3moe.context_length"), 40960);
	cr_assert_eq(gguf_u64(f, "qwen3moe.embedding_length"), HIDDEN);
	cr_assert_eq(gguf_u64(f, "qwen3moe.block_count"), LAYERS);
	cr_assert_eq(gguf_u64(f, "qwen3moe.feed_forward_length"), 768);
	cr_assert_eq(gguf_u64(f, "qwen3moe.expert_feed_forward_length"), 256);
	cr_assert_eq(gguf_u64(f, "qwen3moe.attention.head_count"), 4);
	cr_assert_eq(gguf_u64(f, "qwen3moe.attention.head_count_kv"), 1);
	cr_assert_eq(gguf_u64(f, "qwen3moe.attention.key_length"), 128);
	cr_assert_eq(gguf_u64(f, "qwen3moe.attention.value_length"), 128);
	cr_assert_eq(gguf_u64(f, "qwen3moe.rope.dimension_count"), 128);
	double eps, base;
	cr_assert_eq(gguf_get_f64(f, "qwen3moe.attention.layer_norm_rms_epsilon", &eps), 1);
	cr_assert_eq(gguf_get_f64(f, "qwen3moe.rope.freq_base", &base), 1);
	cr_assert(fabs(eps - 1e-6) < 1e-12 && base == 1e6);

	/* a byte-level BPE tokenizer: unique tokens, 256 bytes, <|endoftext|>, no merges */
	cr_assert_str_eq(gguf_get_str(f, "tokenizer.ggml.model"), "gpt2");
	cr_assert_str_eq(gguf_get_str(f, "tokenizer.ggml.pre"), "qwen2");
	const struct gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
	cr_assert_not_null(tok);
	cr_assert_eq(tok->value.type, GGUF_ARRAY);
	cr_assert_eq(tok->value.arr.elem_type, GGUF_STRING);
	cr_assert_eq(tok->value.arr.count, VOCAB);
	const struct gguf_value *v = tok->value.arr.values;
	cr_assert_str_eq(v['a'].str.ptr, "a");
	cr_assert_str_eq(v['\n'].str.ptr, "\xc4\x8a"); /* GPT-2's U+010A for a newline */
	cr_assert_str_eq(v[' '].str.ptr, "\xc4\xa0");  /* and U+0120 for a space */
	cr_assert_str_eq(v[256].str.ptr, "<|endoftext|>");
	for (uint32_t i = 0; i < VOCAB; i++)
		for (uint32_t j = i + 1; j < VOCAB; j++)
			cr_assert_str_neq(v[i].str.ptr, v[j].str.ptr, "tokens %u and %u", i, j);
	const struct gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
	cr_assert_not_null(types);
	cr_assert_eq(types->value.arr.count, VOCAB);
	const struct gguf_kv *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
	cr_assert_not_null(merges, "llama.cpp's gpt2 tokenizer needs the key");
	cr_assert_eq(merges->value.arr.count, 0);
	cr_assert_eq(gguf_u64(f, "tokenizer.ggml.eos_token_id"), 256);
	gguf_close(f);

	/* the catalog's own view of the same file */
	struct moe_catalog *cat = open_catalog(p);
	cr_assert_eq(cat->info.n_moe_layers, LAYERS);
	cr_assert_eq(cat->n_formats, 1);
	cr_assert_eq(cat->formats[0], MOEK_Q4_K);
	moe_catalog_close(cat);
	remove_tree(d);
}

/* The other architectures' own tensors, one layer of each kind, in both containers. */
Test(full_model, other_architectures_names)
{
	char *d = scratch_dir();
	char p[512];
	struct sidecar_error err;

	/* DeepSeek-V3 at hidden 256: 4 heads; q/kv LoRA ranks 64; nope = v = 128, rope 64;
	 * dense FFN 768 (18432 scaled, rounded up to 256); layers 0-2 dense, 3 MoE */
	snprintf(p, sizeof(p), "%s/ds", d);
	generate_ok("deepseek-v3", p, MOEK_FP8_E4M3_B128, true, 0);
	struct st_model *m;
	cr_assert_eq(st_open_model(p, &m, &err), 0, "%s", err.msg);
	const struct want ds[] = {
	    {"model.layers.0.self_attn.q_a_proj.weight", 2, {64, HIDDEN}, ST_F8_E4M3},
	    {"model.layers.0.self_attn.q_a_proj.weight_scale_inv", 2, {1, 2}, ST_F32},
	    {"model.layers.0.self_attn.q_a_layernorm.weight", 1, {64}, ST_BF16},
	    {"model.layers.0.self_attn.q_b_proj.weight", 2, {4 * 192, 64}, ST_F8_E4M3},
	    {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
	     2,
	     {64 + 64, HIDDEN},
	     ST_F8_E4M3},
	    {"model.layers.0.self_attn.kv_a_layernorm.weight", 1, {64}, ST_BF16},
	    {"model.layers.0.self_attn.kv_b_proj.weight", 2, {4 * 256, 64}, ST_F8_E4M3},
	    {"model.layers.0.self_attn.o_proj.weight", 2, {HIDDEN, 4 * 128}, ST_F8_E4M3},
	    {"model.layers.2.mlp.down_proj.weight", 2, {HIDDEN, 768}, ST_F8_E4M3},
	    {"model.layers.2.mlp.down_proj.weight_scale_inv", 2, {2, 6}, ST_F32},
	    {"model.layers.3.mlp.gate.weight", 2, {EXPERTS, HIDDEN}, ST_BF16},
	    {"model.layers.3.mlp.gate.e_score_correction_bias", 1, {EXPERTS}, ST_F32},
	    {"model.layers.3.mlp.shared_experts.up_proj.weight", 2, {256, HIDDEN}, ST_F8_E4M3},
	    {"model.embed_tokens.weight", 2, {VOCAB, HIDDEN}, ST_BF16},
	    {"lm_head.weight", 2, {VOCAB, HIDDEN}, ST_BF16},
	};
	check_st(m, ds, sizeof(ds) / sizeof(ds[0]), "deepseek-v3");
	cr_assert_null(st_find(m, "model.layers.3.mlp.gate_proj.weight"), "an MoE layer");
	cr_assert_null(st_find(m, "model.layers.2.mlp.gate.weight"), "a dense layer");
	st_close_model(m);

	snprintf(p, sizeof(p), "%s/ds.gguf", d);
	generate_ok("deepseek-v3", p, MOEK_Q8_0, true, 0);
	struct gguf_file *f;
	cr_assert_eq(gguf_open(p, &f, &err), 0, "%s", err.msg);
	const struct want dsg[] = {
	    {"blk.0.attn_q_a.weight", 2, {HIDDEN, 64}, MOEK_F16},
	    {"blk.0.attn_q_a_norm.weight", 1, {64}, MOEK_F32},
	    {"blk.0.attn_q_b.weight", 2, {64, 4 * 192}, MOEK_F16},
	    {"blk.0.attn_kv_a_mqa.weight", 2, {HIDDEN, 128}, MOEK_F16},
	    {"blk.0.attn_kv_a_norm.weight", 1, {64}, MOEK_F32},
	    {"blk.0.attn_kv_b.weight", 2, {64, 4 * 256}, MOEK_F16},
	    {"blk.0.attn_output.weight", 2, {4 * 128, HIDDEN}, MOEK_F16},
	    {"blk.0.ffn_gate.weight", 2, {HIDDEN, 768}, MOEK_F16},
	    {"blk.0.ffn_down.weight", 2, {768, HIDDEN}, MOEK_F16},
	    {"blk.3.exp_probs_b.bias", 1, {EXPERTS}, MOEK_F32},
	    {"blk.3.ffn_gate_shexp.weight", 2, {HIDDEN, 256}, MOEK_F16},
	    {"blk.3.ffn_down_shexp.weight", 2, {256, HIDDEN}, MOEK_F16},
	};
	check_gguf(f, dsg, sizeof(dsg) / sizeof(dsg[0]), "deepseek-v3 GGUF");
	cr_assert_eq(gguf_u64(f, "deepseek2.attention.key_length"), 192);
	cr_assert_eq(gguf_u64(f, "deepseek2.attention.value_length"), 128);
	cr_assert_eq(gguf_u64(f, "deepseek2.rope.dimension_count"), 64);
	cr_assert_eq(gguf_u64(f, "deepseek2.attention.q_lora_rank"), 64);
	cr_assert_eq(gguf_u64(f, "deepseek2.attention.kv_lora_rank"), 64);
	cr_assert_eq(gguf_u64(f, "deepseek2.feed_forward_length"), 768);
	gguf_close(f);

	/* gpt-oss at hidden 256: 5 heads, 1 kv head, head_dim 64; biases and sinks */
	snprintf(p, sizeof(p), "%s/oss", d);
	generate_ok("gpt-oss-20b", p, MOEK_MXFP4, true, 0);
	cr_assert_eq(st_open_model(p, &m, &err), 0, "%s", err.msg);
	const struct want oss[] = {
	    {"model.layers.1.self_attn.q_proj.weight", 2, {320, HIDDEN}, ST_BF16},
	    {"model.layers.1.self_attn.q_proj.bias", 1, {320}, ST_BF16},
	    {"model.layers.1.self_attn.k_proj.bias", 1, {64}, ST_BF16},
	    {"model.layers.1.self_attn.o_proj.bias", 1, {HIDDEN}, ST_BF16},
	    {"model.layers.1.self_attn.sinks", 1, {5}, ST_BF16},
	    {"model.layers.1.mlp.router.weight", 2, {EXPERTS, HIDDEN}, ST_BF16},
	    {"model.layers.1.mlp.router.bias", 1, {EXPERTS}, ST_BF16},
	};
	check_st(m, oss, sizeof(oss) / sizeof(oss[0]), "gpt-oss");
	st_close_model(m);
	snprintf(p, sizeof(p), "%s/oss.gguf", d);
	generate_ok("gpt-oss-20b", p, MOEK_MXFP4, true, 0);
	cr_assert_eq(gguf_open(p, &f, &err), 0, "%s", err.msg);
	const struct want ossg[] = {
	    {"blk.1.attn_q.bias", 1, {320}, MOEK_F32},
	    {"blk.1.attn_output.bias", 1, {HIDDEN}, MOEK_F32},
	    {"blk.1.attn_sinks.weight", 1, {5}, MOEK_F32},
	    {"blk.1.post_attention_norm.weight", 1, {HIDDEN}, MOEK_F32},
	    {"blk.1.ffn_gate_inp.bias", 1, {EXPERTS}, MOEK_F32},
	    {"blk.1.ffn_up_exps.bias", 2, {256, EXPERTS}, MOEK_F32},
	};
	check_gguf(f, ossg, sizeof(ossg) / sizeof(ossg[0]), "gpt-oss GGUF");
	cr_assert_null(gguf_find_tensor(f, "blk.1.ffn_norm.weight"));
	cr_assert_eq(gguf_u64(f, "gpt-oss.attention.sliding_window"), 128);
	gguf_close(f);

	/* OLMoE: q and k normalised whole (hidden), llama.cpp's square q/o; its GGUF reads the
	 * expert FFN from feed_forward_length */
	snprintf(p, sizeof(p), "%s/olmoe.gguf", d);
	generate_ok("olmoe", p, MOEK_Q8_0, true, 0);
	cr_assert_eq(gguf_open(p, &f, &err), 0, "%s", err.msg);
	const struct want og[] = {
	    {"blk.0.attn_q.weight", 2, {HIDDEN, HIDDEN}, MOEK_F16},
	    {"blk.0.attn_q_norm.weight", 1, {HIDDEN}, MOEK_F32},
	    {"blk.0.attn_k_norm.weight", 1, {HIDDEN}, MOEK_F32},
	};
	check_gguf(f, og, 3, "olmoe GGUF");
	cr_assert_eq(gguf_u64(f, "olmoe.feed_forward_length"), 256);
	gguf_close(f);

	/* Mixtral: block_sparse_moe router, no q/k norms */
	snprintf(p, sizeof(p), "%s/mix", d);
	generate_ok("mixtral-8x7b", p, MOEK_BF16, true, 0);
	cr_assert_eq(st_open_model(p, &m, &err), 0, "%s", err.msg);
	const struct want mix[] = {
	    {"model.layers.0.block_sparse_moe.gate.weight", 2, {EXPERTS, HIDDEN}, ST_BF16},
	    {"model.layers.0.self_attn.q_proj.weight", 2, {2 * 128, HIDDEN}, ST_BF16},
	    {"model.layers.0.self_attn.k_proj.weight", 2, {128, HIDDEN}, ST_BF16},
	};
	check_st(m, mix, 3, "mixtral");
	cr_assert_null(st_find(m, "model.layers.0.self_attn.q_norm.weight"));
	st_close_model(m);
	remove_tree(d);
}

Test(full_model, output_independent_of_threads)
{
	char *d = scratch_dir();
	char a[512], b[512];
	struct sidecar_error err;
	snprintf(a, sizeof(a), "%s/a.gguf", d);
	snprintf(b, sizeof(b), "%s/b.gguf", d);
	cr_assert_eq(generate("deepseek-v3", a, MOEK_Q4_K, true, 0, 1, &err), 0, "%s", err.msg);
	cr_assert_eq(generate("deepseek-v3", b, MOEK_Q4_K, true, 0, 3, &err), 0, "%s", err.msg);
	size_t na, nb;
	char *pa = slurp(a, &na), *pb = slurp(b, &nb);
	cr_assert_eq(na, nb);
	cr_assert(!memcmp(pa, pb, na));
	free(pa);
	free(pb);
	remove_tree(d);
}

static void refused(struct moe_gen_options o, const char *needle)
{
	struct sidecar_error err;
	cr_assert_eq(moe_gen_write(&o, &err), -1, "accepted (wanted: %s)", needle);
	cr_assert(strstr(err.msg, needle), "'%s' does not say '%s'", err.msg, needle);
}

Test(full_model, bad_dimensions_refused)
{
	char *d = scratch_dir();
	char p[512];
	snprintf(p, sizeof(p), "%s/x.gguf", d);
	const struct moe_gen_options base = {.preset = "qwen3-30b-a3b",
	                                     .out = p,
	                                     .format = MOEK_Q8_0,
	                                     .hidden = HIDDEN,
	                                     .ffn = 256,
	                                     .experts = EXPERTS};
	struct moe_gen_options o = base;
	o.heads = 8;
	refused(o, "need --full-model");
	o = base;
	o.full_model = true;
	o.vocab = 100;
	refused(o, "vocab 100");
	o = base;
	o.full_model = true;
	o.heads = 6;
	o.kv_heads = 4;
	refused(o, "must divide heads");
	o = base;
	o.full_model = true;
	o.head_dim = 63;
	refused(o, "head dim 63");
	o = base;
	o.preset = "olmoe";
	o.full_model = true;
	o.heads = 4;
	o.head_dim = 32;
	refused(o, "must equal hidden");
	o = base;
	o.preset = "deepseek-v3";
	o.full_model = true;
	o.kv_heads = 1;
	refused(o, "MLA");
	remove_tree(d);
}
