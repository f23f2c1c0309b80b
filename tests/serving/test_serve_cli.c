/* test_serve_cli.c — what the command line prints to someone who has not read the code: every
 * help lists exactly what its parser accepts, every binary says its version, and the error
 * paths a new user meets name the problem and the way out. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "moe_kernels.h"
#include "policy.h"

/* Runs of white space become one space: help texts wrap where they like. */
static void squeeze_spaces(char *s)
{
	char *w = s;
	for (const char *r = s; *r; r++)
		if (!isspace((unsigned char)*r) || (w > s && w[-1] != ' '))
			*w++ = isspace((unsigned char)*r) ? ' ' : *r;
	*w = '\0';
}

Test(serve_cli, serve_help_lists_exactly_the_policies_the_parser_takes)
{
	static char out[16384];
	const char *argv[] = {MOE_SIDECAR_BIN, "serve", "--help", NULL};
	cr_assert_eq(run_capture(argv, NULL, NULL, out, sizeof(out)), 0, "%s", out);
	squeeze_spaces(out);
	char accepted[256];
	policy_spec_help(accepted, sizeof(accepted));
	cr_expect(strstr(out, accepted), "serve --help does not list '%s': %s", accepted, out);
	cr_expect_not(strstr(out, "sieve+heat"), "serve --help advertises sieve+heat: %s", out);
	char want[64];
	snprintf(want, sizeof(want), "(default %s)", POLICY_DEFAULT_SPEC);
	cr_expect(strstr(out, want), "%s", out);
	/* Everything the list names parses, with every modifier. */
	const char *const specs[] = {"lru", "sieve", "sieve-heat", "sieve-heat+layer+pin2"};
	for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
		struct policy_spec s;
		struct sidecar_error err = {0};
		cr_expect(strstr(accepted, specs[i]) || strchr(specs[i], '+'), "%s", specs[i]);
		cr_expect_eq(policy_spec_parse(specs[i], &s, &err), 0, "%s", err.msg);
	}
}

/* --threads' default is one worker per CPU the process may use, hardware threads counted
 * (topology.c counts PUs; test_forward's threads_default_counts_hardware_threads pins it):
 * the help says so, not "the node's cores". */
Test(serve_cli, serve_help_says_threads_default_counts_hardware_threads)
{
	static char out[16384];
	const char *argv[] = {MOE_SIDECAR_BIN, "serve", "--help", NULL};
	cr_assert_eq(run_capture(argv, NULL, NULL, out, sizeof(out)), 0, "%s", out);
	squeeze_spaces(out);
	cr_expect_not(strstr(out, "the node's cores"), "%s", out);
	cr_expect(strstr(out, "(default: one per CPU of the node this process may use, counting "
	                      "hardware threads, not cores;"),
	          "%s", out);
}

/* The fault-injection options live in the test-hooks daemon only: the shipped one neither
 * lists nor takes them. */
Test(serve_cli, shipped_serve_has_no_debug_options)
{
	static char out[16384];
	const char *help[] = {MOE_SIDECAR_BIN, "serve", "--help", NULL};
	cr_assert_eq(run_capture(help, NULL, NULL, out, sizeof(out)), 0, "%s", out);
	cr_expect_not(strstr(out, "--debug-"), "serve --help lists a debug option: %s", out);
	const char *fail[] = {MOE_SIDECAR_BIN, "serve", "--debug-fail-expert", "1:3", NULL};
	cr_expect_eq(run_capture(fail, NULL, NULL, out, sizeof(out)), 2, "%s", out);
#ifdef MOE_SIDECAR_TESTHOOKS_BIN
	const char *hooks[] = {MOE_SIDECAR_TESTHOOKS_BIN, "serve", "--help", NULL};
	cr_assert_eq(run_capture(hooks, NULL, NULL, out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "--debug-fail-expert"), "the test-hooks daemon lacks it: %s", out);
#endif
}

/* --isa takes the names the kernels know, and refuses one this CPU cannot run with what it
 * lacks, before anything is loaded. */
Test(serve_cli, isa_is_forced_or_refused_by_name)
{
	static char out[4096];
	const char *unknown[] = {MOE_SIDECAR_BIN, "serve", "--isa", "avx1024", NULL};
	cr_expect_eq(run_capture(unknown, NULL, NULL, out, sizeof(out)), 2, "%s", out);
	cr_expect(strstr(out, "--isa 'avx1024': expected scalar, avx2, avx512 or amx"), "%s", out);
	for (enum moek_isa isa = MOEK_ISA_SCALAR; isa <= MOEK_ISA_AMX; isa++) {
		const char *name = moek_isa_label(isa);
		/* a name it takes, followed by an option it refuses: the refusal is the option's */
		const char *argv[] = {MOE_SIDECAR_BIN, "serve", "--isa", name,
		                      "--threads",     "0",     NULL};
		cr_expect_eq(run_capture(argv, NULL, NULL, out, sizeof(out)), 2, "%s", out);
		if (moek_isa_supported(isa)) {
			cr_expect(strstr(out, "--threads '0'"), "%s: %s", name, out);
			continue;
		}
		char lacks[128], want[192];
		moek_cpu_feature_names(moek_isa_missing(isa), lacks, sizeof(lacks));
		snprintf(want, sizeof(want), "--isa %s: this CPU lacks %s (it has: ", name, lacks);
		cr_expect(strstr(out, want), "want '%s' in: %s", want, out);
	}
}

Test(serve_cli, every_binary_says_its_version)
{
	static char out[4096];
	const struct {
		const char *bin, *name;
	} bins[] = {{MOE_SIDECAR_BIN, "moe-sidecar"},
	            {MOE_GEN_BIN, "moe-gen"},
	            {MOE_ECHO_DEMO_BIN, "moe-echo-demo"},
	            {MOE_DECODE_DEMO_BIN, "moe-decode-demo"}};
	for (size_t i = 0; i < sizeof(bins) / sizeof(bins[0]); i++) {
		const char *argv[] = {bins[i].bin, "--version", NULL};
		cr_expect_eq(run_capture(argv, NULL, NULL, out, sizeof(out)), 0, "%s --version: %s",
		             bins[i].name, out);
		char want[64];
		snprintf(want, sizeof(want), "%s %s", bins[i].name, MOE_VERSION);
		cr_expect_eq(strncmp(out, want, strlen(want)), 0, "%s --version printed '%s'",
		             bins[i].name, out);
	}
}

Test(serve_cli, moe_gen_makes_no_parent_directories)
{
	static char out[4096];
	char dir[] = "/tmp/moe-cli-XXXXXX", target[192], missing[64];
	cr_assert_not_null(mkdtemp(dir));
	snprintf(missing, sizeof(missing), "%s/typo", dir);
	snprintf(target, sizeof(target), "%s/deeper/model.gguf", missing);
	const char *gguf[] = {MOE_GEN_BIN, "--preset", "olmoe", "--layers", "1",
	                      "--hidden",  "64",       "--ffn", "32",       "--experts",
	                      "4",         "--quiet",  "--out", target,     NULL};
	cr_expect_eq(run_capture(gguf, NULL, NULL, out, sizeof(out)), 1, "%s", out);
	cr_expect(strstr(out, "No such file or directory") &&
	              strstr(out, "makes no parent directories"),
	          "%s", out);
	struct stat st;
	cr_expect_neq(stat(missing, &st), 0, "moe-gen created %s", missing);
	/* A checkpoint directory itself is created, its parent is not. */
	snprintf(target, sizeof(target), "%s/checkpoint", missing);
	gguf[13] = target;
	cr_expect_eq(run_capture(gguf, NULL, NULL, out, sizeof(out)), 1, "%s", out);
	cr_expect_neq(stat(missing, &st), 0, "moe-gen created %s", missing);
	snprintf(target, sizeof(target), "%s/checkpoint", dir);
	cr_expect_eq(run_capture(gguf, NULL, NULL, out, sizeof(out)), 0, "%s", out);
	snprintf(target, sizeof(target), "%s/checkpoint/config.json", dir);
	cr_expect_eq(stat(target, &st), 0, "%s", target);
	char rm[160];
	snprintf(rm, sizeof(rm), "rm -rf %s", dir);
	cr_expect_eq(system(rm), 0);
}

/* The model-path errors a newcomer meets, as the command line prints them. */
Test(serve_cli, a_path_that_is_not_a_model_says_so)
{
	static char out[4096];
	const char *passwd[] = {MOE_SIDECAR_BIN, "inspect", "/etc/passwd", NULL};
	cr_expect_eq(run_capture(passwd, NULL, NULL, out, sizeof(out)), 1, "%s", out);
	cr_expect(strstr(out, "/etc/passwd: not a model: neither a GGUF file"), "%s", out);
	cr_expect_not(strstr(out, "config.json"), "%s", out);

	char dir[] = "/tmp/moe-cli-XXXXXX", ck[64], shard[128];
	cr_assert_not_null(mkdtemp(dir));
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	const char *gen[] = {MOE_GEN_BIN, "--preset", "olmoe", "--layers",  "1", "--hidden",
	                     "64",        "--ffn",    "32",    "--experts", "4", "--shards",
	                     "2",         "--quiet",  "--out", ck,          NULL};
	cr_assert_eq(run_capture(gen, NULL, NULL, out, sizeof(out)), 0, "%s", out);
	snprintf(shard, sizeof(shard), "%s/model-00001-of-00002.safetensors", ck);
	const char *one_shard[] = {MOE_SIDECAR_BIN, "inspect", shard, NULL};
	cr_expect_eq(run_capture(one_shard, NULL, NULL, out, sizeof(out)), 1, "%s", out);
	char want[160];
	snprintf(want, sizeof(want), "is shard 1 of 2 of a checkpoint: open its directory (%s)",
	         ck);
	cr_expect(strstr(out, want), "%s", out);
	char rm[160];
	snprintf(rm, sizeof(rm), "rm -rf %s", dir);
	cr_expect_eq(system(rm), 0);
}

/* moe-gen --help lists exactly the --format names it writes: each one listed writes a model
 * in GGUF or in safetensors, and every weight format of the kernels' table it does not list
 * (INT4_G32, the sidecar's load-time layout) is refused as unknown. */
Test(serve_cli, moe_gen_help_lists_exactly_the_formats_it_writes)
{
	static char out[8192];
	const char *help[] = {MOE_GEN_BIN, "--help", NULL};
	cr_assert_eq(run_capture(help, NULL, NULL, out, sizeof(out)), 0, "%s", out);
	const char *line = strstr(out, "--format F");
	cr_assert_not_null(line, "%s", out);
	char listed[256];
	cr_assert_eq(sscanf(line, "--format F %255[^\n]", listed), 1);
	cr_expect_not(strstr(listed, "int4_g32"), "moe-gen --help lists int4_g32: %s", listed);
	char dir[] = "/tmp/moe-cli-XXXXXX", target[96];
	cr_assert_not_null(mkdtemp(dir));
	for (size_t i = 0; moek_format_at(i); i++) {
		const struct moek_format_info *fi = moek_format_at(i);
		if (!fi->weight_format)
			continue;
		char name[32], padded[40];
		snprintf(name, sizeof(name), "%s", fi->name);
		for (char *c = name; *c; c++)
			*c = (char)tolower((unsigned char)*c);
		snprintf(padded, sizeof(padded), " %s ", name);
		char spaced[272];
		snprintf(spaced, sizeof(spaced), " %s ", listed);
		const bool is_listed = strstr(spaced, padded) != NULL;
		int written = 0;
		for (int gguf = 0; gguf < 2; gguf++) {
			snprintf(target, sizeof(target), "%s/m-%s%s", dir, name,
			         gguf ? ".gguf" : "");
			const char *gen[] = {
			    MOE_GEN_BIN, "--preset", "qwen3-30b-a3b", "--layers",  "1", "--hidden",
			    "256",       "--ffn",    "256",           "--experts", "4", "--quiet",
			    "--format",  name,       "--out",         target,      NULL};
			const int rc = run_capture(gen, NULL, NULL, out, sizeof(out));
			written += rc == 0;
			if (!is_listed)
				cr_expect(rc == 2 && strstr(out, "unknown format"), "%s: %s", name,
				          out);
		}
		if (is_listed)
			cr_expect_gt(written, 0, "listed %s writes in neither container", name);
	}
	char rm[160];
	snprintf(rm, sizeof(rm), "rm -rf %s", dir);
	cr_expect_eq(system(rm), 0);
}

/* placement --help: the synopsis names both ways to size the GPU's share, as the parser takes
 * them (one of --gpu-experts and --gpu-bytes, the latter with --expert-bytes for a trace). */
Test(serve_cli, placement_synopsis_names_gpu_bytes)
{
	static char out[8192];
	const char *help[] = {MOE_SIDECAR_BIN, "placement", "--help", NULL};
	cr_assert_eq(run_capture(help, NULL, NULL, out, sizeof(out)), 0, "%s", out);
	const char *options = strstr(out, "\n\n");
	cr_assert_not_null(options, "%s", out);
	char synopsis[1024];
	snprintf(synopsis, sizeof(synopsis), "%.*s", (int)(options - out), out);
	squeeze_spaces(synopsis);
	cr_expect(strstr(synopsis, "(--gpu-experts N | --gpu-bytes B [--expert-bytes B])"), "%s",
	          synopsis);
}

/* --pool-pages takes huge or auto, and names what it expected otherwise. */
Test(serve_cli, pool_pages_is_huge_or_auto)
{
	static char out[4096];
	const char *bad[] = {MOE_SIDECAR_BIN, "serve", "--pool-pages", "4k", NULL};
	cr_expect_eq(run_capture(bad, NULL, NULL, out, sizeof(out)), 2, "%s", out);
	cr_expect(strstr(out, "--pool-pages '4k': expected huge or auto"), "%s", out);
}
