/* test_simulate_cli.c — `moe-sidecar simulate` as a user runs it: --generate writes a trace
 * the parser accepts, --json has the documented shape with one hit rate per capacity and
 * Belady never below a policy, --plot writes a PNG, and bad arguments exit non-zero with a
 * message. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "trace.h"

static int run(const char *args, char *out, size_t cap)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "%s simulate %s 2>&1", MOE_SIDECAR_BIN, args);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	size_t n = fread(out, 1, cap - 1, p);
	out[n] = '\0';
	int status = pclose(p);
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Parses the numbers of "key": [a, b, …] into v; returns how many. */
static int numbers_after(const char *json, const char *key, double *v, int max)
{
	const char *p = strstr(json, key);
	if (!p || !(p = strchr(p, '[')))
		return -1;
	int n = 0;
	for (p++; n < max;) {
		char *end;
		double x = strtod(p, &end);
		if (end == p)
			break;
		v[n++] = x;
		p = end;
		while (*p == ',' || *p == ' ')
			p++;
	}
	return n;
}

Test(simulate_cli, generate_json_and_plot)
{
	char dir[] = "/tmp/moe-simulate-cli.XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char trace[256], png[256], args[768], out[16384];
	snprintf(trace, sizeof(trace), "%s/q.trace", dir);
	snprintf(png, sizeof(png), "%s/q.png", dir);
	snprintf(args, sizeof(args), "--generate qwen3-30b-a3b --steps 12 --seed 3 -o %s", trace);
	cr_assert_eq(run(args, out, sizeof(out)), 0, "%s", out);
	struct routing_trace t;
	struct sidecar_error err = {0};
	cr_assert_eq(trace_load(trace, &t, &err), 0, "%s", err.msg);
	cr_assert_eq(t.n_lines, 12 * 48);
	trace_free(&t);

	snprintf(args, sizeof(args), "%s --capacities 768,10%% --policies lru,sieve+layer --json",
	         trace);
	cr_assert_eq(run(args, out, sizeof(out)), 0, "%s", out);
	cr_assert_eq(strncmp(out, "{\"capacities\": [614, 768], \"policies\": {\"lru\": [", 47), 0,
	             "%s", out);
	double caps[4], lru[4], sieve[4], opt[4];
	cr_assert_eq(numbers_after(out, "\"capacities\"", caps, 4), 2);
	cr_assert_eq(numbers_after(out, "\"lru\"", lru, 4), 2);
	cr_assert_eq(numbers_after(out, "\"sieve+layer\"", sieve, 4), 2);
	cr_assert_eq(numbers_after(out, "\"belady\"", opt, 4), 2);
	for (int i = 0; i < 2; i++) {
		cr_assert(lru[i] >= 0 && lru[i] <= 1);
		cr_assert_geq(opt[i], lru[i]);
		cr_assert_geq(opt[i], sieve[i]);
	}
	cr_assert_geq(opt[1], opt[0], "OPT cannot lose hits with more capacity");
	/* Reads per token (loads, without a model): OPT's are the fewest. */
	const char *reads = strstr(out, "\"reads_per_token\"");
	cr_assert_not_null(reads, "%s", out);
	cr_assert(strstr(out, "\"reads_unit\": \"loads\""), "%s", out);
	cr_assert_eq(numbers_after(reads, "\"lru\"", lru, 4), 2);
	cr_assert_eq(numbers_after(reads, "\"sieve+layer\"", sieve, 4), 2);
	cr_assert_eq(numbers_after(reads, "\"belady\"", opt, 4), 2);
	for (int i = 0; i < 2; i++) {
		cr_assert_gt(opt[i], 0);
		cr_assert_leq(opt[i], lru[i]);
		cr_assert_leq(opt[i], sieve[i]);
	}

	if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
		snprintf(args, sizeof(args), "%s --capacities 600,1200 --plot %s", trace, png);
		cr_assert_eq(run(args, out, sizeof(out)), 0, "%s", out);
		FILE *f = fopen(png, "rb");
		cr_assert_not_null(f, "no plot written");
		unsigned char magic[8];
		cr_assert_eq(fread(magic, 1, 8, f), 8);
		fclose(f);
		cr_assert_eq(memcmp(magic, "\x89PNG\r\n\x1a\n", 8), 0);
		unlink(png);
	}
	unlink(trace);
	rmdir(dir);
}

Test(simulate_cli, bad_arguments_fail_with_a_message)
{
	char out[4096];
	cr_assert_eq(run("/nonexistent.trace --capacities 4", out, sizeof(out)), 1);
	cr_assert(strstr(out, "/nonexistent.trace: cannot open"), "%s", out);
	cr_assert_eq(run("--generate nosuchmodel", out, sizeof(out)), 2);
	cr_assert(strstr(out, "unknown model preset 'nosuchmodel'"), "%s", out);
	cr_assert_eq(run("x.trace", out, sizeof(out)), 2);
	cr_assert(strstr(out, "--capacities"), "%s", out);
}

/* simulate and placement read traces through one parser: a trace cut mid-line is refused by
 * both, naming the byte where the cut line starts. */
Test(simulate_cli, a_cut_trace_is_refused_by_simulate_and_placement)
{
	char path[] = "/tmp/moe-cut-trace-XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	const char text[] = "moe-trace 1 n_layers=1 n_experts=8 top_k=2\n0 0 1:0.5,2:0.5\n1 0 3:0";
	cr_assert_eq(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
	close(fd);
	char args[256], out[4096];
	snprintf(args, sizeof(args), "%s --capacities 4", path);
	cr_expect_eq(run(args, out, sizeof(out)), 1, "%s", out);
	cr_expect(strstr(out, "the last line (from byte 59) has no newline"), "%s", out);
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "%s placement --trace %s --gpu-experts 2 2>&1", MOE_SIDECAR_BIN,
	         path);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	size_t n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	int status = pclose(p);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) != 0, "placement took it: %s", out);
	cr_expect(strstr(out, "the last line (from byte 59) has no newline"), "%s", out);
	unlink(path);
}
