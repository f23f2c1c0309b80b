/* test_verify.c — `moe-sidecar verify` on models of every container: generated GGUF of a few
 * formats and safetensors checkpoints pass in process and against a running sidecar; a GGUF
 * written here from raw blocks, by a writer that is not moe-gen's and with its tensors
 * shuffled, passes; an expert whose bytes change under a running sidecar (the scale signs of
 * its down blocks flipped: still a valid file) breaks the bound, named by layer, expert and
 * format; options are refused before any model is read.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "catalog.h"
#include "harness.h"
#include "moe_client.h"
#include "moe_kernels.h"

static char out[65536];

/* A small model (3 blocks of 8 experts, hidden and ffn 256) from moe-gen: path ending in
 * .gguf for GGUF, else a safetensors checkpoint directory. */
static void generate(const char *path, const char *preset, const char *format)
{
	const char *gen[] = {MOE_GEN_BIN, "--preset", preset,  "--layers",  "3", "--hidden",
	                     "256",       "--ffn",    "256",   "--experts", "8", "--format",
	                     format,      "--quiet",  "--out", path,        NULL};
	cr_assert_eq(run_capture(gen, NULL, NULL, out, sizeof(out)), 0, "moe-gen %s %s: %s", preset,
	             format, out);
}

/* verify MODEL [--socket S] --log-level warn: its exit status, its output in `out`. */
static int verify(const char *model, const char *socket, const char *layers)
{
	const char *argv[16] = {MOE_SIDECAR_BIN, "verify", model, "--log-level", "warn"};
	int n = 5;
	if (socket) {
		argv[n++] = "--socket";
		argv[n++] = socket;
	}
	if (layers) {
		argv[n++] = "--layers";
		argv[n++] = layers;
		argv[n++] = "--experts";
		argv[n++] = "8";
	}
	argv[n] = NULL;
	return run_capture(argv, NULL, NULL, out, sizeof(out));
}

/* The report's row for `format` at `tokens` holds ("ok") — every row does on a pass. */
static void expect_rows(const char *format)
{
	static const char *const tokens[] = {"1", "8", "64"};
	for (size_t i = 0; i < 3; i++) {
		bool found = false;
		for (const char *l = out; l && *l;
		     l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
			char f[40], t[16], path[16], result[16];
			double nmse, bound;
			if (sscanf(l, "%39s %15s %15s %lg %lg %15s", f, t, path, &nmse, &bound,
			           result) == 6 &&
			    !strcmp(f, format) && !strcmp(t, tokens[i])) {
				found = true;
				cr_expect_str_eq(result, "ok", "%s", out);
				cr_expect(nmse > 0 && nmse <= bound, "%s %s tokens: %g vs %g",
				          format, t, nmse, bound);
			}
		}
		cr_expect(found, "no %s row at %s tokens: %s", format, tokens[i], out);
	}
}

static void start_sidecar(struct sidecar_proc *sp, const char *model)
{
	char instance[64];
	snprintf(instance, sizeof(instance), "test-verify-%d", (int)getpid());
	const char *argv[] = {model, "--probes-instance", instance, NULL};
	int st = 0;
	if (sidecar_start(sp, argv, &st) != 0) {
		char *log = slurp(sp->log);
		cr_assert_fail("sidecar on %s did not start (0x%x): %s", model, st, log ? log : "");
	}
	/* once a client is served, the warm-up is over: every expert is in the sidecar's slots */
	struct moe_connect_opts o = {.socket_path = sp->socket, .timeout_ms = 60000};
	struct moe_client *c;
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "%s", moe_connect_error());
	moe_close(c);
}

static void stop_sidecar(struct sidecar_proc *sp)
{
	const int st = sidecar_stop(sp, SIGTERM);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sidecar exit status 0x%x", st);
}

Test(verify, generated_gguf_passes_in_process_and_over_the_channel, .timeout = 300)
{
	struct sidecar_proc sp = {0};
	harness_tempdir(&sp);
	static const char *const formats[][2] = {
	    {"q8_0", "Q8_0"}, {"q4_K", "Q4_K"}, {"bf16", "BF16"}};
	char model[160];
	for (size_t i = 0; i < 3; i++) {
		snprintf(model, sizeof(model), "%s/%s.gguf", sp.dir, formats[i][0]);
		generate(model, "qwen3-30b-a3b", formats[i][0]);
		cr_expect_eq(verify(model, NULL, NULL), 0, "%s", out);
		expect_rows(formats[i][1]);
		cr_expect(strstr(out, "OK: every bound holds"), "%s", out);
	}
	/* the last one served by a sidecar */
	start_sidecar(&sp, model);
	cr_expect_eq(verify(model, sp.socket, NULL), 0, "%s", out);
	expect_rows("BF16");
	cr_expect(strstr(out, "served by the sidecar at"), "%s", out);
	stop_sidecar(&sp);
	sidecar_cleanup(&sp);
}

Test(verify, safetensors_checkpoints_pass_in_process_and_over_the_channel, .timeout = 300)
{
	struct sidecar_proc sp = {0};
	harness_tempdir(&sp);
	char bf16[160], oss[160];
	snprintf(bf16, sizeof(bf16), "%s/qwen3-bf16", sp.dir);
	snprintf(oss, sizeof(oss), "%s/gpt-oss-mxfp4", sp.dir);
	generate(bf16, "qwen3-30b-a3b", "bf16");
	generate(oss, "gpt-oss-20b", "mxfp4"); /* _blocks/_scales, interleaved gate_up, biases */
	cr_expect_eq(verify(bf16, NULL, NULL), 0, "%s", out);
	expect_rows("BF16");
	cr_expect_eq(verify(oss, NULL, NULL), 0, "%s", out);
	expect_rows("MXFP4");
	/* activations of ±20: gate and up past gpt-oss's swiglu_limit of 7 in many features */
	const char *clamped[] = {MOE_SIDECAR_BIN, "verify", oss, "--scale", "20",
	                         "--log-level",   "warn",   NULL};
	cr_expect_eq(run_capture(clamped, NULL, NULL, out, sizeof(out)), 0, "%s", out);
	expect_rows("MXFP4");
	start_sidecar(&sp, oss);
	cr_expect_eq(verify(oss, sp.socket, NULL), 0, "%s", out);
	expect_rows("MXFP4");
	stop_sidecar(&sp);
	sidecar_cleanup(&sp);
}

/* ---- A GGUF from another writer --------------------------------------------------------- */

enum { HIDDEN = 256, FFN = 256, EXPERTS = 8, ALIGN = 64 };

struct tensor {
	char name[64];
	uint32_t type;
	uint64_t ne[3];
	uint8_t *data;
	size_t bytes;
	uint64_t offset;
};

static void put(FILE *f, const void *p, size_t n)
{
	cr_assert_eq(fwrite(p, 1, n, f), n);
}
static void put_u32(FILE *f, uint32_t v)
{
	put(f, &v, 4);
}
static void put_u64(FILE *f, uint64_t v)
{
	put(f, &v, 8);
}
static void put_str(FILE *f, const char *s)
{
	put_u64(f, strlen(s));
	put(f, s, strlen(s));
}
static void kv_u32(FILE *f, const char *key, uint32_t v)
{
	put_str(f, key);
	put_u32(f, 4); /* GGUF_TYPE_UINT32 */
	put_u32(f, v);
}
static void kv_str(FILE *f, const char *key, const char *v)
{
	put_str(f, key);
	put_u32(f, 8); /* STRING */
	put_str(f, v);
}

static void put_f16(uint8_t *p, float v)
{
	const uint16_t h = moek_f32_to_f16(v);
	memcpy(p, &h, 2);
}

/* Raw blocks of ggml type `type` with random quants and scales of a sensible size: what a
 * quantizer could have written, without one. */
static void fill_blocks(uint32_t type, uint8_t *p, size_t n_blocks, uint64_t *s)
{
	const struct moek_format_info *fi = moek_format_lookup(type);
	for (size_t b = 0; b < n_blocks; b++, p += fi->block_bytes) {
		for (uint32_t i = 0; i < fi->block_bytes; i++)
			p[i] = (uint8_t)test_rand(s);
		const float u = 0.5f + (float)(test_rand(s) % 1000) / 1000.0f;
		switch (type) {
		case MOEK_Q8_0: put_f16(p, u / (127.0f * 16)); break; /* d, then 32 int8 */
		case MOEK_Q4_K:                                       /* d, dmin, scales, qs */
			put_f16(p, u / (63.0f * 15 * 8));
			put_f16(p + 2, u / (63.0f * 15 * 16));
			break;
		case MOEK_Q6_K: put_f16(p + 208, u / (64.0f * 32 * 16)); break; /* ql qh sc d */
		default: cr_assert_fail("no raw blocks for type %u", type);
		}
	}
}

static void add_experts(struct tensor *t, uint32_t layer, const char *proj, uint32_t type,
                        uint64_t *s)
{
	snprintf(t->name, sizeof(t->name), "blk.%u.ffn_%s_exps.weight", layer, proj);
	const bool down = !strcmp(proj, "down");
	t->type = type;
	t->ne[0] = down ? FFN : HIDDEN; /* the contiguous row */
	t->ne[1] = down ? HIDDEN : FFN;
	t->ne[2] = EXPERTS;
	const struct moek_format_info *fi = moek_format_lookup(type);
	const size_t blocks = t->ne[0] / fi->block_elems * t->ne[1] * t->ne[2];
	t->bytes = blocks * fi->block_bytes;
	t->data = malloc(t->bytes);
	cr_assert_not_null(t->data);
	fill_blocks(type, t->data, blocks, s);
}

static void shuffle(size_t *order, size_t n, uint64_t *s)
{
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	for (size_t i = n - 1; i > 0; i--) {
		const size_t j = test_rand(s) % (i + 1), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
}

/* A qwen3moe GGUF of two MoE blocks (Q8_0 gate/up with Q4_K down; Q4_K with Q6_K down: a
 * Q4_K_M-like mix), alignment 64, a router tensor, its tensor infos and its data each in a
 * shuffled order of their own. */
static void write_foreign_gguf(const char *path)
{
	uint64_t s = 0x5eed;
	struct tensor t[8] = {0};
	size_t n = 0;
	add_experts(&t[n++], 0, "gate", MOEK_Q8_0, &s);
	add_experts(&t[n++], 0, "up", MOEK_Q8_0, &s);
	add_experts(&t[n++], 0, "down", MOEK_Q4_K, &s);
	add_experts(&t[n++], 1, "gate", MOEK_Q4_K, &s);
	add_experts(&t[n++], 1, "up", MOEK_Q4_K, &s);
	add_experts(&t[n++], 1, "down", MOEK_Q6_K, &s);
	for (uint32_t L = 0; L < 2; L++) { /* routers, F32 {hidden, experts} */
		struct tensor *r = &t[n++];
		snprintf(r->name, sizeof(r->name), "blk.%u.ffn_gate_inp.weight", L);
		r->type = MOEK_F32;
		r->ne[0] = HIDDEN;
		r->ne[1] = EXPERTS;
		r->bytes = HIDDEN * EXPERTS * 4;
		r->data = calloc(1, r->bytes);
	}
	size_t info_order[8], data_order[8];
	shuffle(info_order, n, &s);
	shuffle(data_order, n, &s);
	uint64_t at = 0;
	for (size_t i = 0; i < n; i++) {
		struct tensor *x = &t[data_order[i]];
		x->offset = at;
		at = (at + x->bytes + ALIGN - 1) / ALIGN * ALIGN;
	}
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	put(f, "GGUF", 4);
	put_u32(f, 3);
	put_u64(f, n);
	put_u64(f, 8);
	kv_str(f, "general.architecture", "qwen3moe");
	kv_str(f, "general.name", "written by test_verify, not moe-gen");
	kv_u32(f, "general.alignment", ALIGN);
	kv_u32(f, "qwen3moe.block_count", 2);
	kv_u32(f, "qwen3moe.embedding_length", HIDDEN);
	kv_u32(f, "qwen3moe.expert_count", EXPERTS);
	kv_u32(f, "qwen3moe.expert_used_count", 2);
	kv_u32(f, "qwen3moe.expert_feed_forward_length", FFN);
	for (size_t i = 0; i < n; i++) {
		const struct tensor *x = &t[info_order[i]];
		const uint32_t dims = x->ne[2] ? 3 : 2;
		put_str(f, x->name);
		put_u32(f, dims);
		for (uint32_t d = 0; d < dims; d++)
			put_u64(f, x->ne[d]);
		put_u32(f, x->type);
		put_u64(f, x->offset);
	}
	static const uint8_t zeros[ALIGN];
	long pos = ftell(f);
	put(f, zeros, (size_t)((ALIGN - pos % ALIGN) % ALIGN));
	const long base = ftell(f);
	for (size_t i = 0; i < n; i++) {
		const struct tensor *x = &t[data_order[i]];
		pos = ftell(f) - base;
		put(f, zeros, (size_t)(x->offset - (uint64_t)pos));
		put(f, x->data, x->bytes);
		free(x->data);
	}
	cr_assert_eq(fclose(f), 0);
}

Test(verify, a_gguf_from_another_writer_with_shuffled_tensors_passes, .timeout = 300)
{
	struct sidecar_proc sp = {0};
	harness_tempdir(&sp);
	char model[160];
	snprintf(model, sizeof(model), "%s/foreign.gguf", sp.dir);
	write_foreign_gguf(model);
	cr_expect_eq(verify(model, NULL, NULL), 0, "%s", out);
	expect_rows("Q8_0/Q4_K");
	expect_rows("Q4_K/Q6_K");
	sidecar_cleanup(&sp);
}

/* ---- A corrupted expert ------------------------------------------------------------------ */

/* Flips the sign of the f16 scale of every Q8_0 block of `x`'s down projection in the file, a
 * run of blocks at a time, keeping a run only if the model's fingerprint (which samples a few
 * blocks of the file) stays what the sidecar reports — verify insists on the same model.
 * Returns the blocks flipped. */
static size_t flip_down_scales(const char *path, const struct moe_expert *x)
{
	char before[33], after[33];
	cr_assert_eq(moe_model_fingerprint(path, before), MOE_OK);
	const struct moe_proj_ref *d = &x->proj[MOE_PROJ_DOWN];
	cr_assert_eq(d->format, MOEK_Q8_0);
	const int fd = open(path, O_RDWR);
	cr_assert_geq(fd, 0);
	uint8_t *buf = malloc(d->data.length);
	cr_assert_eq(pread(fd, buf, d->data.length, (off_t)d->data.offset),
	             (ssize_t)d->data.length);
	const size_t blocks = d->data.length / 34, run = 64;
	size_t flipped = 0;
	for (size_t b0 = 0; b0 < blocks; b0 += run) {
		const size_t b1 = b0 + run < blocks ? b0 + run : blocks;
		for (size_t b = b0; b < b1; b++)
			buf[b * 34 + 1] ^= 0x80; /* the sign bit of d */
		const size_t off = b0 * 34, len = (b1 - b0) * 34;
		cr_assert_eq(pwrite(fd, buf + off, len, (off_t)(d->data.offset + off)),
		             (ssize_t)len);
		cr_assert_eq(moe_model_fingerprint(path, after), MOE_OK);
		if (strcmp(before, after)) { /* a sampled block: put it back */
			for (size_t b = b0; b < b1; b++)
				buf[b * 34 + 1] ^= 0x80;
			cr_assert_eq(pwrite(fd, buf + off, len, (off_t)(d->data.offset + off)),
			             (ssize_t)len);
		} else {
			flipped += b1 - b0;
		}
	}
	free(buf);
	close(fd);
	return flipped;
}

Test(verify, an_expert_changed_under_a_sidecar_breaks_the_bound_and_is_named, .timeout = 300)
{
	struct sidecar_proc sp = {0};
	harness_tempdir(&sp);
	char model[160];
	snprintf(model, sizeof(model), "%s/m.gguf", sp.dir);
	generate(model, "qwen3-30b-a3b", "q8_0");
	start_sidecar(&sp, model); /* every expert read into the sidecar's memory */
	cr_assert_eq(verify(model, sp.socket, "1"), 0, "%s", out);

	struct moe_catalog *cat;
	struct sidecar_error err;
	cr_assert_eq(moe_catalog_open(model, &cat, &err), 0, "%s", err.msg);
	const size_t flipped = flip_down_scales(model, moe_catalog_expert(cat, 1, 5));
	moe_catalog_close(cat);
	cr_assert_gt(flipped, 1000, "only %zu blocks could be flipped", flipped);

	cr_expect_eq(verify(model, sp.socket, "1"), 1, "%s", out);
	cr_expect(strstr(out, "BROKEN layer 1 expert 5 Q8_0, 1 tokens"), "%s", out);
	cr_expect(strstr(out, "FAILED"), "%s", out);
	for (int e = 0; e < 8; e++) { /* the others still hold */
		char other[64];
		snprintf(other, sizeof(other), "layer 1 expert %d ", e);
		if (e != 5)
			cr_expect_null(strstr(out, other), "%s", out);
	}
	/* in process, the reference and the engine read the same (changed) bytes */
	cr_expect_eq(verify(model, NULL, "1"), 0, "%s", out);
	stop_sidecar(&sp);
	sidecar_cleanup(&sp);
}

/* ---- Usage ---------------------------------------------------------------------------- */

Test(verify, options_are_refused_before_the_model_is_read)
{
	static const char *const bad[][3] = {
	    {"--tokens", "0", "--tokens"},   {"--tokens", "1,x", "--tokens"},
	    {"--experts", "0", "--experts"}, {"--layers", "-1", "--layers"},
	    {"--seed", "x", "--seed"},       {"--log-level", "loud", "--log-level"}};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *argv[] = {MOE_SIDECAR_BIN, "verify",  "/nonexistent/model.gguf",
		                      bad[i][0],       bad[i][1], NULL};
		cr_expect_eq(run_capture(argv, NULL, NULL, out, sizeof(out)), 2, "%s %s: %s",
		             bad[i][0], bad[i][1], out);
		cr_expect(strstr(out, bad[i][2]) && !strstr(out, "nonexistent"), "%s", out);
	}
	const char *none[] = {MOE_SIDECAR_BIN, "verify", NULL};
	cr_expect_eq(run_capture(none, NULL, NULL, out, sizeof(out)), 2);
	const char *missing[] = {MOE_SIDECAR_BIN, "verify", "/nonexistent/model.gguf", NULL};
	cr_expect_eq(run_capture(missing, NULL, NULL, out, sizeof(out)), 2);
	cr_expect(strstr(out, "nonexistent"), "%s", out);
	const char *help[] = {MOE_SIDECAR_BIN, "verify", "--help", NULL};
	cr_expect_eq(run_capture(help, NULL, NULL, out, sizeof(out)), 0);
	cr_expect(strstr(out, "--socket"), "%s", out);
}

/* The four newer families pass verify in process from both containers (GLM-4.5's dense first
 * blocks, MiniMax-M2's Mixtral names, Llama-4's transposed experts with the routing weight on
 * their input, Qwen3-Next's gated shared expert), and Llama-4 over a running sidecar's channel. */
Test(verify, new_families_pass_in_process_and_llama4_over_the_channel, .timeout = 300)
{
	static const char *const presets[] = {"glm-4.5", "minimax-m2", "llama4-maverick",
	                                      "qwen3-next-80b-a3b"};
	struct sidecar_proc sp = {0};
	harness_tempdir(&sp);
	char model[200];
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
		for (int hf = 0; hf < 2; hf++) {
			snprintf(model, sizeof(model), hf ? "%s/%s" : "%s/%s.gguf", sp.dir,
			         presets[i]);
			generate(model, presets[i], hf ? "bf16" : "q4_K");
			cr_expect_eq(verify(model, NULL, NULL), 0, "%s: %s", model, out);
			expect_rows(hf ? "BF16" : "Q4_K");
		}
	snprintf(model, sizeof(model), "%s/llama4-maverick", sp.dir);
	start_sidecar(&sp, model);
	cr_expect_eq(verify(model, sp.socket, NULL), 0, "%s", out);
	expect_rows("BF16");
	cr_expect(strstr(out, "served by the sidecar at"), "%s", out);
	stop_sidecar(&sp);
	sidecar_cleanup(&sp);
}
