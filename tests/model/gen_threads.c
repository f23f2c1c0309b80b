/* gen_threads.c — moe-gen's output does not depend on its thread count, and a failing write
 * on the writer thread is reported (not hung on, not crashed on).
 *
 * Each model is generated with 1, 2, 3 and 7 threads (more threads than jobs in a batch, more
 * than cores) and every output file must be byte-identical to the 1-thread one. The cases
 * cover each job kind: merged GGUF K-quants (with fused gate/up halves), gpt-oss MXFP4
 * _blocks/_scales (scales produced by jobs), per-expert FP8 with partial 128x128 scale blocks,
 * and a BF16 model larger than both 8 MiB write buffers (buffer hand-over to the writer).
 *
 * A plain program (exit 0 = pass, 1 = fail), not Criterion: Criterion's runner cannot start
 * under TSan on the development kernel, and this test needs TSan most. Labelled "concurrent".
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe_gen.h"
#include "moe_kernels.h"

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                       \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

/* The whole file (malloc'd), or NULL. */
static unsigned char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	unsigned char *p = NULL;
	if (fseek(f, 0, SEEK_END) == 0) {
		long n = ftell(f);
		if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (p = malloc((size_t)n + 1)) &&
		    fread(p, 1, (size_t)n, f) != (size_t)n) {
			free(p);
			p = NULL;
		}
		*len = (size_t)n;
	}
	fclose(f);
	return p;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	return remove(path);
}

struct gen_case {
	const char *name;
	struct moe_gen_options opt; /* out: a file name (GGUF) or a folder name */
	const char *files[3];       /* the files to compare, relative to out's folder */
};

static void check_case(const char *dir, const struct gen_case *c)
{
	static const uint32_t thread_counts[] = {1, 2, 3, 7};
	char out[512], path[600], ref_path[600];
	for (size_t t = 0; t < sizeof(thread_counts) / sizeof(thread_counts[0]); t++) {
		struct moe_gen_options o = c->opt;
		struct sidecar_error err = {0};
		snprintf(out, sizeof(out), "%s/t%u", dir, thread_counts[t]);
		if (mkdir(out, 0755) != 0 && errno != EEXIST) {
			CHECK(0, "mkdir %s: %s", out, strerror(errno));
			return;
		}
		snprintf(out, sizeof(out), "%s/t%u/%s", dir, thread_counts[t], c->opt.out);
		o.out = out;
		o.threads = thread_counts[t];
		if (moe_gen_write(&o, &err)) {
			CHECK(0, "%s, %u threads: %s", c->name, thread_counts[t], err.msg);
			return;
		}
		if (t == 0)
			continue;
		for (int f = 0; f < 3 && c->files[f]; f++) {
			snprintf(path, sizeof(path), "%s/t%u/%s", dir, thread_counts[t],
			         c->files[f]);
			snprintf(ref_path, sizeof(ref_path), "%s/t1/%s", dir, c->files[f]);
			size_t n = 0, ref_n = 0;
			unsigned char *got = slurp(path, &n), *want = slurp(ref_path, &ref_n);
			CHECK(got && want, "%s: cannot read %s or %s", c->name, path, ref_path);
			if (got && want) {
				CHECK(n == ref_n && !memcmp(got, want, n),
				      "%s: %s with %u threads differs from 1 thread (%zu vs %zu "
				      "bytes)",
				      c->name, c->files[f], thread_counts[t], n, ref_n);
			}
			free(got);
			free(want);
		}
	}
}

int main(void)
{
	char tmpl[] = "/tmp/moe-gen-threads-XXXXXX";
	const char *dir = mkdtemp(tmpl);
	if (!dir) {
		perror("mkdtemp");
		return 1;
	}
	const struct gen_case cases[] = {
	    {"q4_k merged, fused gate/up",
	     {.preset = "qwen3-30b-a3b",
	      .out = "m.gguf",
	      .format = MOEK_Q4_K,
	      .seed = 7,
	      .hidden = 512,
	      .ffn = 256,
	      .experts = 8,
	      .fused_gate_up = true},
	     {"m.gguf"}},
	    {"q6_k per-expert",
	     {.preset = "olmoe",
	      .out = "p.gguf",
	      .format = MOEK_Q6_K,
	      .seed = 8,
	      .hidden = 256,
	      .ffn = 512,
	      .experts = 4,
	      .per_expert = true},
	     {"p.gguf"}},
	    {"gpt-oss mxfp4 safetensors",
	     {.preset = "gpt-oss-20b",
	      .out = "oss",
	      .format = MOEK_MXFP4,
	      .seed = 9,
	      .hidden = 256,
	      .ffn = 320,
	      .experts = 4},
	     {"oss/model.safetensors", "oss/config.json"}},
	    {"deepseek fp8, partial scale blocks",
	     {.preset = "deepseek-v3",
	      .out = "ds",
	      .format = MOEK_FP8_E4M3_B128,
	      .seed = 10,
	      .layers = 4,
	      .hidden = 320,
	      .ffn = 192,
	      .experts = 4,
	      .shards = 2},
	     {"ds/model-00001-of-00002.safetensors", "ds/model-00002-of-00002.safetensors",
	      "ds/model.safetensors.index.json"}},
	    {"bf16 larger than both write buffers",
	     {.preset = "qwen3-30b-a3b",
	      .out = "big.gguf",
	      .format = MOEK_BF16,
	      .seed = 11,
	      .hidden = 1024,
	      .ffn = 512,
	      .experts = 4},
	     {"big.gguf"}},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		check_case(dir, &cases[i]);
		/* keep /tmp small: each case's files go before the next */
		char t[600];
		for (int k = 1; k <= 7; k++) {
			snprintf(t, sizeof(t), "%s/t%d", dir, k);
			nftw(t, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
		}
	}

	/* A write that fails on the writer thread (ENOSPC from /dev/full) is reported with
	 * the file's name, whatever the thread count. */
	char full[600];
	snprintf(full, sizeof(full), "%s/full.gguf", dir);
	CHECK(symlink("/dev/full", full) == 0, "symlink: %s", strerror(errno));
	for (uint32_t threads = 1; threads <= 3; threads += 2) {
		struct moe_gen_options o = {.preset = "qwen3-30b-a3b",
		                            .out = full,
		                            .format = MOEK_Q8_0,
		                            .hidden = 512,
		                            .ffn = 256,
		                            .experts = 8,
		                            .threads = threads};
		struct sidecar_error err = {0};
		CHECK(moe_gen_write(&o, &err) == -1, "writing to /dev/full succeeded");
		CHECK(strstr(err.msg, "full.gguf: write: ") != NULL,
		      "error names the file and the write: '%s'", err.msg);
	}
	struct moe_gen_options too_many = {.preset = "olmoe",
	                                   .out = full,
	                                   .format = MOEK_Q8_0,
	                                   .threads = MOE_GEN_MAX_THREADS + 1};
	struct sidecar_error err = {0};
	CHECK(moe_gen_write(&too_many, &err) == -1 && strstr(err.msg, "threads"),
	      "more than MOE_GEN_MAX_THREADS threads is refused: '%s'", err.msg);
	nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
	if (failures)
		fprintf(stderr, "gen_threads: %d failure(s)\n", failures);
	else
		printf("gen_threads: outputs identical for 1, 2, 3, 7 threads; write errors "
		       "reported\n");
	return failures ? 1 : 0;
}
