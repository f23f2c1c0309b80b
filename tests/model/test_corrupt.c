/* test_corrupt.c — hostile and broken model files: each must be rejected with one clear
 * error naming the file and the problem, never a crash (the fuzzers cover the rest of the
 * input space; these pin the messages). Files are built by hand or generated and patched. */
#include <inttypes.h>
#include <sys/stat.h>

#include "gguf.h"
#include "model_files.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "safetensors.h"

/* ---- a minimal GGUF builder --------------------------------------------------------------- */

struct gb {
	unsigned char buf[8192];
	size_t len;
};

static void gb_put(struct gb *g, const void *p, size_t n)
{
	cr_assert_leq(g->len + n, sizeof(g->buf));
	memcpy(g->buf + g->len, p, n);
	g->len += n;
}

static void gb_u32(struct gb *g, uint32_t v)
{
	gb_put(g, &v, 4); /* the test machine is little-endian, as GGUF */
}

static void gb_u64(struct gb *g, uint64_t v)
{
	gb_put(g, &v, 8);
}

static void gb_str(struct gb *g, const char *s)
{
	gb_u64(g, strlen(s));
	gb_put(g, s, strlen(s));
}

static void gb_header(struct gb *g, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	g->len = 0;
	gb_put(g, "GGUF", 4);
	gb_u32(g, version);
	gb_u64(g, n_tensors);
	gb_u64(g, n_kv);
}

static void gb_kv_u32(struct gb *g, const char *key, uint32_t v)
{
	gb_str(g, key);
	gb_u32(g, GGUF_UINT32);
	gb_u32(g, v);
}

static void gb_tensor(struct gb *g, const char *name, uint64_t ne0, uint64_t ne1, uint32_t type,
                      uint64_t offset)
{
	gb_str(g, name);
	gb_u32(g, 2);
	gb_u64(g, ne0);
	gb_u64(g, ne1);
	gb_u32(g, type);
	gb_u64(g, offset);
}

static void gb_pad_data(struct gb *g, size_t data_bytes)
{
	while (g->len % 32)
		g->buf[g->len++] = 0;
	cr_assert_leq(g->len + data_bytes, sizeof(g->buf));
	memset(g->buf + g->len, 0, data_bytes);
	g->len += data_bytes;
}

static char *tmpdir;

static void setup(void)
{
	tmpdir = scratch_dir();
}

static void teardown(void)
{
	remove_tree(tmpdir);
}

static char *path_in(const char *name)
{
	static char p[512];
	snprintf(p, sizeof(p), "%s/%s", tmpdir, name);
	return p;
}

/* gguf_open on the bytes must fail with a message containing `needle` and the path. */
static void gguf_rejects(const void *bytes, size_t n, const char *needle)
{
	char *p = path_in("bad.gguf");
	write_file(p, bytes, n);
	struct gguf_file *f;
	struct sidecar_error err;
	cr_assert_eq(gguf_open(p, &f, &err), -1, "accepted a file that should fail with '%s'",
	             needle);
	cr_assert_not_null(strstr(err.msg, needle), "error '%s' lacks '%s'", err.msg, needle);
	cr_assert_not_null(strstr(err.msg, "bad.gguf"), "error '%s' lacks the file name", err.msg);
	cr_assert_eq(err.status, MOE_EINVAL, "'%s': status %d", err.msg, err.status);
}

/* Returns the refusal's status. */
static int catalog_rejects(const char *path, const char *needle, const char *needle2)
{
	struct moe_catalog *cat;
	struct sidecar_error err;
	cr_assert_eq(moe_catalog_open(path, &cat, &err), -1, "accepted %s", path);
	cr_assert_not_null(strstr(err.msg, needle), "error '%s' lacks '%s'", err.msg, needle);
	if (needle2)
		cr_assert_not_null(strstr(err.msg, needle2), "error '%s' lacks '%s'", err.msg,
		                   needle2);
	return err.status;
}

/* Replaces the first occurrence of `from` in the file by `to` (same length). */
static void patch_file(const char *path, const char *from, const char *to)
{
	size_t len;
	char *buf = slurp(path, &len);
	size_t n = strlen(from);
	cr_assert_eq(strlen(to), n);
	char *at = memmem(buf, len, from, n);
	cr_assert_not_null(at, "%s: '%s' not found", path, from);
	memcpy(at, to, n);
	write_file(path, buf, len);
	free(buf);
}

static void generate(const char *preset, const char *out, uint32_t format, uint32_t shards,
                     bool per_expert)
{
	struct moe_gen_options o = {.preset = preset,
	                            .out = out,
	                            .format = format,
	                            .seed = 7,
	                            .layers = 2,
	                            .hidden = 64,
	                            .ffn = 64,
	                            .experts = 4,
	                            .shards = shards,
	                            .per_expert = per_expert};
	struct sidecar_error err;
	cr_assert_eq(moe_gen_write(&o, &err), 0, "%s", err.msg);
}

TestSuite(corrupt, .init = setup, .fini = teardown);

/* ---- GGUF ------------------------------------------------------------------------------ */

Test(corrupt, gguf_wrong_magic)
{
	struct gb g;
	gb_header(&g, 3, 0, 0);
	memcpy(g.buf, "GGUG", 4);
	gguf_rejects(g.buf, g.len, "not a GGUF file (wrong magic");
}

Test(corrupt, gguf_unsupported_version)
{
	struct gb g;
	gb_header(&g, 4, 0, 0);
	gguf_rejects(g.buf, g.len, "unsupported GGUF version 4");
	gb_header(&g, 1, 0, 0);
	gguf_rejects(g.buf, g.len, "unsupported GGUF version 1");
}

Test(corrupt, gguf_counts_that_overflow)
{
	struct gb g;
	gb_header(&g, 3, (uint64_t)1 << 62, 0);
	gguf_rejects(g.buf, g.len, "tensor count 4611686018427387904 overflows the file");
	gb_header(&g, 3, 0, UINT64_MAX);
	gguf_rejects(g.buf, g.len, "metadata count 18446744073709551615 overflows the file");
	gb_header(&g, 3, 0, 1);
	gb_str(&g, "tokenizer.ggml.tokens");
	gb_u32(&g, GGUF_ARRAY);
	gb_u32(&g, GGUF_STRING);
	gb_u64(&g, (uint64_t)1 << 61);
	gguf_rejects(g.buf, g.len, "array count 2305843009213693952 overflows");
	gb_header(&g, 3, 0, 1);
	gb_u64(&g, (uint64_t)1 << 63); /* key length */
	gb_u64(&g, 0);
	gb_u64(&g, 0);
	gguf_rejects(g.buf, g.len, "string length 9223372036854775808");
}

Test(corrupt, gguf_truncated_anywhere)
{
	char *p = path_in("ok.gguf");
	generate("qwen3-30b-a3b", p, MOEK_Q8_0, 1, false);
	size_t len;
	char *full = slurp(p, &len);
	/* every cut inside the header and a few inside the data */
	for (size_t cut = 0; cut < len; cut += cut < 4096 ? 7 : 4099) {
		char *q = path_in("cut.gguf");
		write_file(q, full, cut);
		struct gguf_file *f;
		struct sidecar_error err;
		cr_assert_eq(gguf_open(q, &f, &err), -1, "cut at %zu accepted", cut);
		cr_assert(strstr(err.msg, "truncated") || strstr(err.msg, "runs past the end"),
		          "cut at %zu: '%s'", cut, err.msg);
		cr_assert_not_null(strstr(err.msg, "cut.gguf"));
		cr_assert_eq(err.status, MOE_EINVAL, "cut at %zu: status %d", cut, err.status);
	}
	free(full);
}

Test(corrupt, gguf_offset_past_eof)
{
	struct gb g;
	gb_header(&g, 3, 1, 0);
	gb_tensor(&g, "blk.0.ffn_up_exps.weight", 32, 1, MOEK_F32, 64);
	gb_pad_data(&g, 128);
	gguf_rejects(g.buf, g.len,
	             "tensor blk.0.ffn_up_exps.weight: data [64, +128) runs past "
	             "the end of the file");
}

Test(corrupt, gguf_overlapping_tensors)
{
	struct gb g;
	gb_header(&g, 3, 2, 0);
	gb_tensor(&g, "a", 32, 1, MOEK_F32, 0);
	gb_tensor(&g, "b", 32, 1, MOEK_F32, 64);
	gb_pad_data(&g, 256);
	gguf_rejects(g.buf, g.len, "tensors a and b overlap");
}

Test(corrupt, gguf_block_size_mismatch)
{
	struct gb g;
	gb_header(&g, 3, 1, 0);
	gb_tensor(&g, "blk.0.ffn_gate_exps.weight", 100, 4, MOEK_Q4_K, 0);
	gb_pad_data(&g, 1024);
	gguf_rejects(g.buf, g.len, "row length 100 is not a multiple of the Q4_K block size 256");
}

Test(corrupt, gguf_alignment_and_types)
{
	struct gb g;
	gb_header(&g, 3, 1, 0);
	gb_tensor(&g, "t", 32, 1, MOEK_F32, 16);
	gb_pad_data(&g, 256);
	gguf_rejects(g.buf, g.len, "offset 16 is not a multiple of the alignment 32");
	gb_header(&g, 3, 0, 1);
	gb_kv_u32(&g, "general.alignment", 48);
	gguf_rejects(g.buf, g.len, "general.alignment must be a u32 power of two");
	gb_header(&g, 3, 1, 0);
	gb_tensor(&g, "t", 32, 1, 99, 0);
	gguf_rejects(g.buf, g.len, "unknown ggml type 99");
	gb_header(&g, 3, 2, 0);
	gb_tensor(&g, "t", 32, 1, MOEK_F32, 0);
	gb_tensor(&g, "t", 32, 1, MOEK_F32, 128);
	gb_pad_data(&g, 256);
	gguf_rejects(g.buf, g.len, "duplicate tensor name t");
	gb_header(&g, 3, 0, 1);
	gb_str(&g, "k");
	gb_u32(&g, 13);
	gguf_rejects(g.buf, g.len, "metadata k: invalid value type 13");
}

Test(corrupt, gguf_nested_arrays_read_and_bounded)
{
	/* [[1,2],[3]] of u32 is read; 9 levels of nesting are refused */
	struct gb g;
	gb_header(&g, 3, 0, 1);
	gb_str(&g, "nested");
	gb_u32(&g, GGUF_ARRAY);
	gb_u32(&g, GGUF_ARRAY);
	gb_u64(&g, 2);
	gb_u32(&g, GGUF_UINT32);
	gb_u64(&g, 2);
	gb_u32(&g, 1);
	gb_u32(&g, 2);
	gb_u32(&g, GGUF_UINT32);
	gb_u64(&g, 1);
	gb_u32(&g, 3);
	char *p = path_in("nested.gguf");
	write_file(p, g.buf, g.len);
	struct gguf_file *f;
	struct sidecar_error err;
	cr_assert_eq(gguf_open(p, &f, &err), 0, "%s", err.msg);
	const struct gguf_kv *kv = gguf_find_kv(f, "nested");
	cr_assert_not_null(kv);
	cr_assert_eq(kv->value.arr.count, 2);
	double v;
	cr_assert_eq(gguf_array_f64(&kv->value.arr.values[0], 1, &v), 0);
	cr_assert_float_eq(v, 2.0, 0);
	cr_assert_eq(gguf_array_f64(&kv->value.arr.values[1], 0, &v), 0);
	cr_assert_float_eq(v, 3.0, 0);
	cr_assert_eq(gguf_array_f64(&kv->value.arr.values[1], 1, &v), -1);
	gguf_close(f);

	gb_header(&g, 3, 0, 1);
	gb_str(&g, "deep");
	gb_u32(&g, GGUF_ARRAY);
	for (int i = 0; i < 9; i++) {
		gb_u32(&g, GGUF_ARRAY);
		gb_u64(&g, 1);
	}
	gguf_rejects(g.buf, g.len, "nested deeper than 8");
}

Test(corrupt, gguf_missing_split_and_wrong_split)
{
	generate("olmoe", path_in("m.gguf"), MOEK_Q8_0, 3, false);
	cr_assert_eq(catalog_rejects(path_in("m-00002-of-00003.gguf"), "is split 2 of 3",
	                             "open the first split"),
	             MOE_EINVAL);
	cr_assert_eq(unlink(path_in("m-00002-of-00003.gguf")), 0);
	/* the split's own failure (open: ENOENT) is the status passed up */
	cr_assert_eq(catalog_rejects(path_in("m-00001-of-00003.gguf"),
	                             "missing or bad split 2 of 3",
	                             "m-00002-of-00003.gguf: No such file"),
	             MOE_ESYS);
}

Test(corrupt, gguf_unsupported_expert_type)
{
	/* I16 has F16's size, so only the type check can catch it */
	char *p = path_in("m.gguf");
	generate("qwen3-30b-a3b", p, MOEK_F16, 1, false);
	size_t len;
	char *buf = slurp(p, &len);
	const char *name = "blk.1.ffn_up_exps.weight";
	char *at = memmem(buf, len, name, strlen(name));
	cr_assert_not_null(at);
	char *type_at = at + strlen(name) + 4 + 3 * 8; /* after n_dims and ne[3] */
	uint32_t type;
	memcpy(&type, type_at, 4);
	cr_assert_eq(type, MOEK_F16);
	type = 25; /* I16 */
	memcpy(type_at, &type, 4);
	write_file(p, buf, len);
	free(buf);
	/* the list is the kernels' table: every weight format, Q8_K (activations only) not */
	char names[256], list[300];
	snprintf(list, sizeof(list), "(supported: %s)",
	         moek_weight_format_names(names, sizeof(names)));
	cr_assert_not_null(strstr(list, " Q4_K "));
	cr_assert_null(strstr(list, "Q8_K"));
	catalog_rejects(p, "tensor blk.1.ffn_up_exps.weight: type I16 is not supported", list);
}

Test(corrupt, gguf_shape_disagrees_with_metadata)
{
	char *p = path_in("m.gguf");
	generate("qwen3-30b-a3b", p, MOEK_Q8_0, 1, true);
	size_t len;
	char *buf = slurp(p, &len);
	const char *key = "qwen3moe.expert_feed_forward_length";
	char *at = memmem(buf, len, key, strlen(key));
	cr_assert_not_null(at);
	char *value_at = at + strlen(key) + 4; /* after the u32 value type */
	uint32_t v;
	memcpy(&v, value_at, 4);
	cr_assert_eq(v, 64);
	v = 96;
	memcpy(value_at, &v, 4);
	write_file(p, buf, len);
	free(buf);
	catalog_rejects(p,
	                "blk.0.ffn_gate.0.weight: shape [64, 64, 1] (innermost first) "
	                "disagrees with",
	                "expert ffn 96");
}

/* ---- safetensors ------------------------------------------------------------------------ */

static void st_write(const char *path, const char *header, size_t data_bytes)
{
	size_t hl = strlen(header);
	unsigned char *buf = calloc(1, 8 + hl + data_bytes);
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
	memcpy(buf + 8, header, hl);
	write_file(path, buf, 8 + hl + data_bytes);
	free(buf);
}

static void st_rejects(const char *header, size_t data_bytes, const char *needle)
{
	char *p = path_in("bad.safetensors");
	st_write(p, header, data_bytes);
	struct st_file *f;
	struct sidecar_error err;
	cr_assert_eq(st_open(p, &f, &err), -1, "accepted header %s", header);
	cr_assert_not_null(strstr(err.msg, needle), "error '%s' lacks '%s'", err.msg, needle);
	cr_assert_not_null(strstr(err.msg, "bad.safetensors"), "'%s' lacks the file", err.msg);
	cr_assert_eq(err.status, MOE_EINVAL, "'%s': status %d", err.msg, err.status);
}

Test(corrupt, safetensors_truncated_header)
{
	char *p = path_in("bad.safetensors");
	write_file(p, "\x10\x00\x00", 3);
	struct st_file *f;
	struct sidecar_error err;
	cr_assert_eq(st_open(p, &f, &err), -1);
	cr_assert_not_null(strstr(err.msg, "truncated"), "%s", err.msg);
	unsigned char hdr[12] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
	write_file(p, hdr, sizeof(hdr));
	cr_assert_eq(st_open(p, &f, &err), -1);
	cr_assert_not_null(strstr(err.msg, "header length 65535 runs past the end"), "%s", err.msg);
}

Test(corrupt, safetensors_invalid_json_and_utf8)
{
	st_rejects("{\"a\":{\"dtype\":\"F32\",}}", 0, "invalid JSON at byte 20");
	st_rejects("{\"w\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
	           "invalid UTF-8");
	st_rejects("[1,2]", 0, "not a safetensors file");
}

Test(corrupt, safetensors_offsets_and_tiling)
{
	st_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
	           "tensor a: data_offsets [0, 16) run past the end of the file");
	st_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
	           "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
	           24, "overlap");
	st_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
	           "gap of 4 bytes in the data buffer before tensor a");
	st_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
	           "tensors cover 4 bytes but the data buffer is 8 bytes");
	st_rejects("{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
	           "8 bytes in data_offsets but shape x BF16 needs 6");
	st_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
	           "\"data_offsets\":[0,8]}}",
	           8, "shape overflows");
	st_rejects(
	    "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551616]}}",
	    8, "data_offsets must be");
	st_rejects("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
	           "unknown dtype Q4");
}

Test(corrupt, hf_config_mismatch)
{
	char *d = path_in("hf");
	generate("qwen3-30b-a3b", d, MOEK_BF16, 1, false);
	char cfg[600];
	snprintf(cfg, sizeof(cfg), "%s/config.json", d);
	patch_file(cfg, "\"moe_intermediate_size\": 64", "\"moe_intermediate_size\": 32");
	catalog_rejects(d, "model.layers.0.mlp.experts.0.gate_proj.weight: shape",
	                "disagrees with");
}

Test(corrupt, hf_invalid_config_json)
{
	char *d = path_in("hf");
	generate("olmoe", d, MOEK_BF16, 1, false);
	char cfg[600];
	snprintf(cfg, sizeof(cfg), "%s/config.json", d);
	patch_file(cfg, "\"hidden_size\": 64,", "\"hidden_size\": 64 ");
	catalog_rejects(d, "config.json: invalid JSON at byte", "',' or '}' expected");
	write_file(cfg, "{\"model_type\":\"llama\",\"num_hidden_layers\":2}", 44);
	catalog_rejects(d, "model_type llama is not a supported MoE", NULL);
}

Test(corrupt, hf_missing_shard_and_wrong_index)
{
	char *d = path_in("hf");
	generate("mixtral-8x7b", d, MOEK_BF16, 3, false);
	char idx[600], shard[600];
	snprintf(idx, sizeof(idx), "%s/model.safetensors.index.json", d);
	snprintf(shard, sizeof(shard), "%s/model-00002-of-00003.safetensors", d);
	size_t len;
	char *shard_bytes = slurp(shard, &len);
	cr_assert_eq(unlink(shard), 0);
	cr_assert_eq(catalog_rejects(d, "shard model-00002-of-00003.safetensors", "No such file"),
	             MOE_ESYS);
	write_file(shard, shard_bytes, len);
	free(shard_bytes);
	/* point one tensor at the wrong shard */
	patch_file(idx, "\"model.layers.0.block_sparse_moe.gate.weight\": \"model-00001",
	           "\"model.layers.0.block_sparse_moe.gate.weight\": \"model-00003");
	catalog_rejects(d,
	                "tensor model.layers.0.block_sparse_moe.gate.weight is not in shard "
	                "model-00003-of-00003.safetensors",
	                NULL);
	patch_file(idx, "\"model.layers.0.block_sparse_moe.gate.weight\": \"model-00003",
	           "\"model.layers.0.block_sparse_moe.gate.weight\": \"../../00001");
	catalog_rejects(d, "shard must be a plain file name", NULL);
}

Test(corrupt, hf_fp8_scale_missing_and_unsupported_dtype)
{
	char *d = path_in("hf");
	generate("deepseek-v3", d, MOEK_FP8_E4M3_B128, 1, false);
	char st[600];
	snprintf(st, sizeof(st), "%s/model.safetensors", d);
	patch_file(st, "experts.2.up_proj.weight_scale_inv", "experts.2.up_proj.weight_scale_inX");
	catalog_rejects(d, "experts.2.up_proj.weight is FP8 E4M3 but",
	                "experts.2.up_proj.weight_scale_inv is missing");
	patch_file(st, "experts.2.up_proj.weight_scale_inX", "experts.2.up_proj.weight_scale_inv");
	patch_file(st, "F8_E4M3", "F8_E5M2");
	catalog_rejects(d, "type F8_E5M2 is not supported for expert weights", NULL);
}

Test(corrupt, hf_missing_expert_tensor)
{
	char *d = path_in("hf");
	generate("qwen3-30b-a3b", d, MOEK_BF16, 1, false);
	char st[600];
	snprintf(st, sizeof(st), "%s/model.safetensors", d);
	patch_file(st, "layers.1.mlp.experts.3.up_proj", "layers.1.mlp.experts.3.up_prox");
	catalog_rejects(d, "layer 1 is an MoE layer", "experts.3.up_proj.weight is missing");
}

Test(corrupt, not_a_model)
{
	catalog_rejects(path_in("nothing-here"), "nothing-here", NULL);
	char *p = path_in("x.gguf");
	write_file(p, "GGU", 3);
	catalog_rejects(p, "x.gguf: truncated", NULL);
}

/* A file that is neither container says so, whatever its name, instead of asking for a
 * config.json next to it (issue 19). */
Test(corrupt, neither_gguf_nor_safetensors_is_not_a_model)
{
	static const unsigned char png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n',
	                                    0,    0,   0,   13,  'I',  'H',  'D',  'R'};
	const char *const text = "root:x:0:0:root:/root:/bin/bash\n";
	const struct {
		const char *name;
		const void *bytes;
		size_t len;
	} files[] = {{"passwd", text, strlen(text)},
	             {"image.png", png, sizeof(png)},
	             {"image.safetensors", png, sizeof(png)},
	             {"tiny", "GG", 2}};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char *p = path_in(files[i].name);
		write_file(p, files[i].bytes, files[i].len);
		struct moe_catalog *cat;
		struct sidecar_error err;
		cr_assert_eq(moe_catalog_open(p, &cat, &err), -1, "accepted %s", p);
		cr_expect(strstr(err.msg, files[i].name) && strstr(err.msg, "not a model") &&
		              strstr(err.msg, "neither a GGUF file") &&
		              strstr(err.msg, "nor a safetensors file"),
		          "%s: %s", files[i].name, err.msg);
		cr_expect_not(strstr(err.msg, "config.json"), "%s: %s", files[i].name, err.msg);
	}
}

Test(corrupt, one_shard_of_a_sharded_checkpoint_names_its_directory)
{
	char *d = path_in("hf");
	generate("mixtral-8x7b", d, MOEK_BF16, 3, false);
	char shard[600], want[700];
	snprintf(shard, sizeof(shard), "%s/model-00002-of-00003.safetensors", d);
	snprintf(want, sizeof(want), "open its directory (%s) instead", d);
	catalog_rejects(shard, "is shard 2 of 3 of a checkpoint", want);
	/* Shards named otherwise are found through the index next to them. */
	char renamed[600];
	snprintf(renamed, sizeof(renamed), "%s/part-b.safetensors", d);
	cr_assert_eq(rename(shard, renamed), 0);
	catalog_rejects(renamed, "model.safetensors.index.json says this checkpoint is sharded",
	                want);
}
