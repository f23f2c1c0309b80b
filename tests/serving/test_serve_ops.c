/* test_serve_ops.c — MASK, PREFETCH and STATS through a real sidecar, the model ops on a
 * sidecar without a model, the handshake's model checks, `moe-sidecar stats`, and a sidecar
 * whose log stream goes away.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve_fixture.h"

/* Runs one model op on a fresh slot; returns the completion. */
static struct moe_completion run_op(struct moe_client *c, uint16_t op, uint16_t flags,
                                    int32_t layer, uint32_t n, const int32_t *ids, const float *wts,
                                    const void *input, size_t input_bytes)
{
	struct moe_slot s;
	cr_assert_eq(moe_slot_acquire(c, &s), MOE_OK);
	if (ids)
		memcpy(s.expert_ids, ids, n * sizeof(int32_t));
	if (wts)
		memcpy(s.expert_weights, wts, n * sizeof(float));
	if (input)
		memcpy(s.input, input, input_bytes);
	struct moe_request r = {.op = op,
	                        .flags = flags,
	                        .slot = s.index,
	                        .n_tokens = n,
	                        .layer = layer,
	                        .user_data = 77};
	struct moe_completion d;
	int rc = moe_call(c, &r, &d, 10000);
	cr_assert(rc == d.status, "transport: %s", moe_strerror(rc));
	cr_assert_eq(moe_slot_release(c, s.index), MOE_OK);
	return d;
}

Test(serve_ops, gpu_mask_refuses_masked_experts_for_that_client_only)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const uint32_t h = ref_hidden(s.ref), ne = ref_n_experts(s.ref);
	const size_t per_layer = (ne + 7) / 8;
	uint8_t bits[64] = {0};
	bits[1 * per_layer + 0] = 1u << 5; /* layer 1, expert 5 */
	cr_assert_eq(moe_set_gpu_mask(s.c, -1, bits, ref_n_layers(s.ref) * per_layer, 5000), MOE_OK,
	             "%s", moe_last_error(s.c));
	struct fwd_case fc;
	fwd_case_make(&fc, 7, 1, 2, 4, ne, h, false);
	for (int j = 0; j < 8; j++)
		fc.ids[j] = j < 4 ? j : 8 + j; /* 0..3, 12..15 */
	fc.ids[6] = 5;
	struct moe_completion done;
	cr_assert_eq(served_forward(&s, &fc, NULL, &done), MOE_EMASKED);
	cr_assert_eq(done.value, 5);
	fc.layer = 2; /* not masked there */
	float *out = calloc((size_t)2 * h, sizeof(float));
	cr_assert_eq(served_forward(&s, &fc, out, &done), MOE_OK, "%s", moe_strerror(done.status));
	/* Another client does not share the mask. */
	struct moe_connect_opts o = {.socket_path = s.sp.socket, .max_tokens = 8};
	struct moe_client *other, *first = s.c;
	cr_assert_eq(moe_connect(&o, &other), MOE_OK);
	fc.layer = 1;
	s.c = other;
	cr_assert_eq(served_forward(&s, &fc, out, &done), MOE_OK, "%s", moe_strerror(done.status));
	moe_close(other);
	s.c = first;
	/* Clearing one layer's bits lifts it. */
	memset(bits, 0, sizeof(bits));
	cr_assert_eq(moe_set_gpu_mask(s.c, 1, bits, per_layer, 5000), MOE_OK);
	cr_assert_eq(served_forward(&s, &fc, out, &done), MOE_OK, "%s", moe_strerror(done.status));
	/* A mask for a layer that does not exist. */
	done = run_op(s.c, MOE_OP_MASK, 0, (int32_t)ref_n_layers(s.ref), 0, NULL, NULL, bits,
	              per_layer);
	cr_assert_eq(done.status, MOE_EBADLAYER);
	free(out);
	fwd_case_free(&fc);
	served_stop(&s);
}

Test(serve_ops, prefetch_checks_its_entries_and_starts_loads)
{
	const char *extra[] = {"--mem-budget", "50%", NULL};
	struct served s;
	served_start(&s, "q8_0", extra);
	const uint32_t ne = ref_n_experts(s.ref);
	int32_t ids[4] = {1, 2, 3, -1};
	float sc[4] = {1.0f, 0.5f, 0.25f, 1.0f};
	uint32_t queued = 99;
	cr_assert_eq(moe_prefetch(s.c, 2, ids, sc, 4, &queued, 5000), MOE_OK, "%s",
	             moe_last_error(s.c));
	cr_assert(queued <= 3, "queued %u of 3 valid ids", queued);
	ids[1] = (int32_t)ne;
	struct moe_completion d = run_op(s.c, MOE_OP_PREFETCH, 0, 2, 4, ids, sc, NULL, 0);
	cr_assert_eq(d.status, MOE_EBADEXPERT);
	cr_assert_eq(d.value, ne);
	cr_assert_eq(d.index, 1);
	ids[1] = 2;
	sc[2] = 1.0f / 0.0f;
	d = run_op(s.c, MOE_OP_PREFETCH, 0, 2, 4, ids, sc, NULL, 0);
	cr_assert_eq(d.status, MOE_EBADWEIGHT);
	cr_assert_eq(d.index, 2);
	/* Router scores: exactly n_experts of them. */
	float scores[64];
	for (uint32_t e = 0; e < ne; e++)
		scores[e] = (float)e / (float)ne;
	cr_assert_eq(moe_prefetch(s.c, 1, NULL, scores, ne, &queued, 5000), MOE_OK, "%s",
	             moe_last_error(s.c));
	d = run_op(s.c, MOE_OP_PREFETCH, MOE_PREFETCH_SCORES, 1, ne - 1, NULL, scores, NULL, 0);
	cr_assert_eq(d.status, MOE_EBADTOKENS);
	d = run_op(s.c, MOE_OP_PREFETCH, 0, (int32_t)ref_n_layers(s.ref), 1, ids, sc, NULL, 0);
	cr_assert_eq(d.status, MOE_EBADLAYER);
	served_stop(&s);
}

Test(serve_ops, stats_too_small_and_the_stats_command)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	/* Requests on every layer make the JSON list them all (well over 1 KiB)... */
	for (int32_t l = 0; l < (int32_t)ref_n_layers(s.ref); l++) {
		struct fwd_case fc;
		fwd_case_make(&fc, 50 + (uint64_t)l, l, 2, 4, ref_n_experts(s.ref),
		              ref_hidden(s.ref), false);
		struct moe_completion d;
		cr_assert_eq(served_forward(&s, &fc, NULL, &d), MOE_OK);
		fwd_case_free(&fc);
	}
	/* ...and one token of 256 f32 is a 1 KiB output area: the JSON does not fit. */
	struct moe_connect_opts o = {.socket_path = s.sp.socket, .max_tokens = 1};
	struct moe_client *tiny;
	cr_assert_eq(moe_connect(&o, &tiny), MOE_OK);
	static char buf[1 << 16];
	cr_assert_eq(moe_stats_json(tiny, buf, sizeof(buf), 5000), MOE_ETOOSMALL);
	moe_close(tiny);
	/* The welcome describes the model. */
	const struct moe_info *inf = moe_info(s.c);
	cr_assert_eq(inf->n_layers, ref_n_layers(s.ref));
	cr_assert_eq(inf->n_experts, ref_n_experts(s.ref));
	cr_assert_eq(inf->model_hidden, ref_hidden(s.ref));
	cr_assert_eq(inf->hidden, ref_hidden(s.ref));
	cr_assert_str_eq(inf->model_name, "qwen3moe");
	/* A client asking for another hidden size is refused with a reason. */
	o.hidden = 128;
	cr_assert_eq(moe_connect(&o, &tiny), MOE_EREFUSED);
	cr_assert(strstr(moe_connect_error(), "hidden"), "%s", moe_connect_error());
	/* `moe-sidecar stats --json` prints the document (once the tiny client is reclaimed). */
	cr_assert(log_wait(&s.sp, "client disconnected", 1, 10000));
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "%s stats --socket %s --json", MOE_SIDECAR_BIN, s.sp.socket);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	size_t n = fread(buf, 1, sizeof(buf) - 1, p);
	buf[n] = '\0';
	cr_assert_eq(pclose(p), 0, "stats --json failed: %s", buf);
	cr_assert(json_top_u64(buf, "budget_bytes") > 0, "%s", buf);
	cr_assert_eq(json_top_u64(buf, "clients"), 2, "the stats client and ours: %s", buf);
	snprintf(cmd, sizeof(cmd), "%s stats --socket %s", MOE_SIDECAR_BIN, s.sp.socket);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	n = fread(buf, 1, sizeof(buf) - 1, p);
	buf[n] = '\0';
	cr_assert_eq(pclose(p), 0, "stats failed: %s", buf);
	cr_assert(strstr(buf, "model qwen3moe") && strstr(buf, "\nlayer   requests"), "%s", buf);
	served_stop(&s);
}

Test(serve_ops, model_ops_without_a_model_say_so)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = 4, .hidden = 64};
	struct moe_client *c;
	cr_assert_eq(moe_connect(&o, &c), MOE_OK);
	cr_assert_eq(moe_info(c)->n_experts, 0);
	static const uint16_t ops[] = {MOE_OP_PREFETCH, MOE_OP_STATS, MOE_OP_MASK};
	int32_t id = 0;
	float w = 1;
	for (size_t i = 0; i < 3; i++) {
		struct moe_completion d =
		    run_op(c, ops[i], 0, 0, ops[i] == MOE_OP_PREFETCH ? 1 : 0, &id, &w, NULL, 0);
		cr_assert_eq(d.status, MOE_ENOMODEL, "op %u: %s", ops[i], moe_strerror(d.status));
	}
	cr_assert_eq(moe_ping(c, 5000), MOE_OK);
	moe_close(c);
	int st = sidecar_stop(&sp, SIGTERM);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	sidecar_cleanup(&sp);
}

Test(serve_ops, a_model_that_does_not_open_is_a_clear_start_up_error)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char bad[128];
	snprintf(bad, sizeof(bad), "%s/missing.gguf", sp.dir);
	const char *extra[] = {bad, NULL};
	int st = 0;
	cr_assert_neq(sidecar_start(&sp, extra, &st), 0);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x", st);
	cr_assert(log_count(&sp, "missing.gguf") >= 1, "the error names the file");
	sidecar_cleanup(&sp);
}

/* Which thread runs a FORWARD is visible in STATS (forwards_inline): at full budget every
 * expert is resident from the start, so a client running one FORWARD at a time gets every one
 * run by the dispatcher inline; at a small budget the first FORWARD names experts that are not
 * resident and must go to the forward thread (the dispatcher never waits for NVMe). Both ways
 * the bits equal the reference. */
Test(serve_ops, resident_forwards_run_inline_and_cold_ones_on_the_forward_thread)
{
	const char *budgets[2] = {"100%", "10%"};
	for (int b = 0; b < 2; b++) {
		const char *extra[] = {"--mem-budget", budgets[b], NULL};
		struct served s;
		served_start(&s, "q8_0", extra);
		const uint32_t ne = ref_n_experts(s.ref), h = ref_hidden(s.ref);
		const uint32_t n_fwd = 6;
		for (uint32_t i = 0; i < n_fwd; i++) {
			struct fwd_case fc;
			fwd_case_make(&fc, 40 + i, 0, 1 + i % 3, 4, ne, h, false);
			float *got = malloc((size_t)fc.n_tokens * h * sizeof(float));
			float *want = malloc((size_t)fc.n_tokens * h * sizeof(float));
			struct moe_completion d;
			cr_assert_eq(served_forward(&s, &fc, got, &d), MOE_OK, "%s",
			             moe_last_error(s.c));
			cr_assert_eq(ref_forward(s.ref, fc.layer, fc.n_tokens, fc.k, fc.k_defer,
			                         fc.x_wire, fc.in_dtype, fc.ids, fc.weights, NULL,
			                         want, NULL),
			             MOE_OK);
			cr_assert(memcmp(got, want, (size_t)fc.n_tokens * h * sizeof(float)) == 0,
			          "budget %s forward %u: bits differ from the reference",
			          budgets[b], i);
			free(got);
			free(want);
			fwd_case_free(&fc);
		}
		char *js = served_stats(&s);
		const int64_t inl = json_top_u64(js, "forwards_inline");
		cr_assert_eq(json_top_u64(js, "requests"), n_fwd, "%s", js);
		if (b == 0)
			cr_assert_eq(inl, n_fwd, "full budget: %lld of %u inline", (long long)inl,
			             n_fwd);
		else
			cr_assert(inl >= 0 && inl < (int64_t)n_fwd,
			          "10%% budget: %lld of %u inline (a cold one must be queued)",
			          (long long)inl, n_fwd);
		free(js);
		served_stop(&s);
	}
}

/* Warming every expert at start reports progress through the log, with the time left on the
 * way: under --log-json every line of the sidecar's stderr is a JSON object, progress
 * included; under --log-level error there is no progress (nor any info line) at all. */
Test(serve_ops, warming_progress_follows_the_log_level_and_json)
{
	for (int json = 1; json >= 0; json--) {
		const char *with_json[] = {"--log-json", NULL};
		const char *quiet[] = {"--log-level", "error", NULL};
		struct served s;
		served_start(&s, "q8_0", json ? with_json : quiet);
		char *log = slurp(s.sp.log);
		cr_assert_not_null(log);
		if (json) {
			cr_assert(strstr(log,
			                 "\"msg\":\"warming every expert: 100% 48 experts / 48 "
			                 "experts"),
			          "no progress line in JSON: %s", log);
			/* the lines on the way say how long is left; the last, how long it took */
			cr_assert(strstr(log, "experts/s, ETA "), "no ETA on the way: %s", log);
			cr_assert(strstr(log, "experts/s in "), "no duration at the end: %s", log);
			for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
				cr_assert(line[0] == '{' && line[strlen(line) - 1] == '}',
				          "not a JSON object: %s", line);
		} else {
			cr_assert_null(strstr(log, "warming"), "progress under error: %s", log);
			cr_assert_null(strstr(log, " info "), "info under error: %s", log);
		}
		free(log);
		served_stop(&s);
	}
}

/* The log line $key=N's value, of the first line holding `needle`; -1 if absent. */
static int64_t log_value(const struct sidecar_proc *sp, const char *needle, const char *key)
{
	char *log = slurp(sp->log);
	int64_t v = -1;
	const char *line = log ? strstr(log, needle) : NULL;
	const char *at = line ? strstr(line, key) : NULL;
	if (at && (!strchr(line, '\n') || at < strchr(line, '\n')))
		v = (int64_t)strtoull(at + strlen(key), NULL, 10);
	free(log);
	return v;
}

/* The budget the start log names is STATS' budget_bytes, and resident bytes count the experts'
 * own bytes: never above expert_bytes, equal to it once every expert is resident. */
Test(serve_ops, budget_and_resident_bytes_agree_with_the_start_log)
{
	const char *budgets[2] = {NULL, "30%"};
	for (int b = 0; b < 2; b++) {
		const char *extra[] = {"--mem-budget", budgets[b], NULL};
		struct served s;
		served_start(&s, "q8_0", budgets[b] ? extra : NULL);
		const int64_t logged = log_value(&s.sp, "residency budget_bytes=", "budget_bytes=");
		const uint32_t ne = ref_n_experts(s.ref), h = ref_hidden(s.ref);
		for (int32_t l = 0; l < (int32_t)ref_n_layers(s.ref); l++) {
			struct fwd_case fc;
			fwd_case_make(&fc, 60 + (uint64_t)l, l, 4, 8, ne, h, false);
			struct moe_completion d;
			cr_assert_eq(served_forward(&s, &fc, NULL, &d), MOE_OK);
			fwd_case_free(&fc);
		}
		char *js = served_stats(&s);
		const int64_t budget = json_top_u64(js, "budget_bytes"),
		              resident = json_top_u64(js, "resident_bytes"),
		              used = json_top_u64(js, "slot_bytes_used"),
		              experts = json_top_u64(js, "expert_bytes");
		cr_assert(logged > 0 && logged == budget, "start log budget_bytes=%lld, STATS %s",
		          (long long)logged, js);
		cr_assert(resident > 0 && resident <= experts && resident <= used && used <= budget,
		          "resident %lld, slots %lld, budget %lld, experts %lld",
		          (long long)resident, (long long)used, (long long)budget,
		          (long long)experts);
		if (!budgets[b])
			cr_assert_eq(resident, experts, "every expert resident: %s", js);
		free(js);
		served_stop(&s);
	}
}

/* A FORWARD that failed on a read counts in the disconnect line's errors=, and the warning
 * about it names the client as the server's lines do (id=N). */
Test(serve_ops, failed_forwards_count_as_errors_under_the_server_id)
{
	const char *extra[] = {"--debug-fail-expert", "1:3", "--no-direct", NULL};
	struct served s;
	served_start(&s, "q8_0", extra);
	struct fwd_case fc;
	fwd_case_make(&fc, 70, 1, 1, 4, ref_n_experts(s.ref), ref_hidden(s.ref), false);
	fc.ids[0] = 3;
	for (int j = 1; j < 4; j++)
		if (fc.ids[j] == 3)
			fc.ids[j] = -1;
	struct moe_completion d;
	cr_assert_eq(served_forward(&s, &fc, NULL, &d), MOE_EIO);
	fc.ids[0] = -1;
	cr_assert_eq(served_forward(&s, &fc, NULL, &d), MOE_OK);
	fwd_case_free(&fc);
	moe_close(s.c);
	s.c = NULL;
	cr_assert(log_wait(&s.sp, "client disconnected id=1 ", 1, 10000));
	cr_assert_eq(log_value(&s.sp, "client disconnected id=1 ", "requests="), 2);
	cr_assert_eq(log_value(&s.sp, "client disconnected id=1 ", "errors="), 1);
	cr_assert_eq(log_count(&s.sp, "client id=1: request failed: FORWARD layer 1: "), 1);
	cr_assert_eq(log_count(&s.sp, "client 0"), 0);
	served_stop(&s);
}

/* `stats --watch`: the first sample is totals since start, each later one rates over its
 * interval with the totals in brackets, and the layer table says which it holds. Between the
 * two samples nothing runs, so every rate is 0. */
Test(serve_ops, stats_watch_labels_totals_and_rates)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	for (int32_t l = 0; l < 2; l++) {
		struct fwd_case fc;
		fwd_case_make(&fc, 80 + (uint64_t)l, l, 3, 4, ref_n_experts(s.ref),
		              ref_hidden(s.ref), false);
		struct moe_completion d;
		cr_assert_eq(served_forward(&s, &fc, NULL, &d), MOE_OK);
		fwd_case_free(&fc);
	}
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "%s stats --socket %s --watch 0.1 --count 2", MOE_SIDECAR_BIN,
	         s.sp.socket);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	char buf[65536];
	size_t n = fread(buf, 1, sizeof(buf) - 1, p);
	buf[n] = '\0';
	cr_assert_eq(pclose(p), 0, "stats --watch failed: %s", buf);
	char *second = strstr(buf, "rates per second [totals since start]");
	cr_assert(strstr(buf, "totals since the sidecar started") && second, "%s", buf);
	cr_assert(strstr(buf, "per layer, totals since start") < second, "%s", buf);
	cr_assert(strstr(second, "requests 0.0/s [2]  tokens 0.0/s [6]"), "%s", second);
	cr_assert(strstr(second, "per layer, last ") && strstr(second, "requests/s"), "%s", second);
	cr_assert(strstr(second, "latency percentiles since start"), "%s", second);
	served_stop(&s);
}

/* Starts `serve MODEL` with stderr the write end of a pipe whose reader reads `lines` lines,
 * then closes it (`serve … 2>&1 | head -2`; 0: the reader is gone before the first line).
 * Returns whether READY came; *status gets the wait status when it did not. */
static bool start_with_log_reader_leaving(struct sidecar_proc *sp, const char *model,
                                          const char *instance, int lines, int *status)
{
	int logp[2], ready[2];
	cr_assert_eq(pipe2(logp, O_CLOEXEC), 0);
	cr_assert_eq(pipe2(ready, O_CLOEXEC), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(logp[1], 2);
		char fd[16];
		snprintf(fd, sizeof(fd), "%d", dup(ready[1]));
		const char *argv[] = {
		    MOE_SIDECAR_BIN, "serve", "--socket", sp->socket,          "--ready-fd", fd,
		    "--log-level",   "debug", model,      "--probes-instance", instance,     NULL};
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(logp[1]);
	close(ready[1]);
	for (int seen = 0; seen < lines;) { /* byte by byte: what is not read stays for none */
		char c;
		if (read(logp[0], &c, 1) != 1)
			break;
		seen += c == '\n';
	}
	close(logp[0]);
	char line[256];
	size_t have = 0;
	for (ssize_t n; have < sizeof(line) - 1 &&
	                (n = read(ready[0], line + have, sizeof(line) - 1 - have)) > 0;)
		have += (size_t)n;
	close(ready[0]);
	line[have] = '\0';
	if (strncmp(line, "READY ", 6) != 0) {
		waitpid(pid, status, 0);
		return false;
	}
	sp->pid = pid;
	return true;
}

/* `serve … 2>&1 | head -2`, and the same with the reader gone before the first line: the
 * sidecar ignores SIGPIPE, drops the lines it cannot write (STATS log_lines_dropped counts
 * them), serves, and stops cleanly on SIGTERM with its socket, lock and probe pins removed.
 * (It died of SIGPIPE at its next line, leaving all three behind.) */
Test(serve_ops, a_log_reader_that_leaves_costs_lines_not_the_sidecar)
{
	for (int lines = 0; lines <= 2; lines += 2) {
		struct sidecar_proc sp;
		harness_tempdir(&sp);
		char model[160], instance[64], path[200];
		snprintf(model, sizeof(model), "%s/model.gguf", sp.dir);
		cr_assert_eq(ref_generate(model, "q8_0", 7), 0);
		snprintf(instance, sizeof(instance), "test-ops-%d", (int)getpid());
		int st = 0;
		if (!start_with_log_reader_leaving(&sp, model, instance, lines, &st)) {
			sidecar_cleanup(&sp);
			cr_assert_fail(
			    "reader gone after %d lines: no READY (status 0x%x%s)", lines, st,
			    WIFSIGNALED(st) && WTERMSIG(st) == SIGPIPE ? ": SIGPIPE" : "");
		}
		struct moe_connect_opts o = {
		    .socket_path = sp.socket, .max_tokens = 4, .n_slots = 1};
		struct moe_client *c;
		cr_assert_eq(moe_connect(&o, &c), MOE_OK, "%s", moe_connect_error());
		cr_assert_eq(moe_ping(c, 5000), MOE_OK);
		char js[1 << 16];
		cr_assert_eq(moe_stats_json(c, js, sizeof(js), 5000), MOE_OK);
		const int64_t dropped = json_top_u64(js, "log_lines_dropped");
		/* with no reader from the start, every line so far; after two, the lines the pipe
		 * could no longer take, if any yet */
		cr_assert(lines ? dropped >= 0 : dropped > 10, "%d lines read: %s", lines, js);
		const bool probes = strstr(js, "\"probes\":\"active\"") != NULL;
		moe_close(c);
		st = sidecar_stop(&sp, SIGTERM);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status 0x%x", st);
		cr_assert(access(sp.socket, F_OK) != 0 && errno == ENOENT, "%s left", sp.socket);
		snprintf(path, sizeof(path), "%s.lock", sp.socket);
		cr_assert(access(path, F_OK) != 0 && errno == ENOENT, "%s left", path);
		snprintf(path, sizeof(path), "/sys/fs/bpf/moe-sidecar/%s", instance);
		cr_assert(!probes || (access(path, F_OK) != 0 && errno == ENOENT), "%s left", path);
		sidecar_cleanup(&sp);
	}
}

/* READY does not wait for the slot pool: with the populate threads held (test hooks), the
 * sidecar answers READY and STATS says no group of the pool is populated yet; released, a
 * FORWARD reads its experts into the groups as they are populated and equals the reference. */
Test(serve_ops, ready_before_the_pool_is_populated, .timeout = 300)
{
#ifndef MOE_SIDECAR_TESTHOOKS_BIN
	cr_skip_test("needs moe-sidecar-testhooks (MOE_TEST_HOOKS=ON)");
#else
	int hold[2];
	cr_assert_eq(pipe2(hold, O_CLOEXEC), 0);
	cr_assert_eq(fcntl(hold[0], F_SETFD, 0), 0, "the sidecar inherits the read end");
	char fd[16];
	snprintf(fd, sizeof(fd), "%d", hold[0]);
	const char *extra[] = {"--mem-budget", "90%", "--debug-hold-populate", fd, NULL};
	struct served s;
	served_start(&s, "q8_0", extra);
	close(hold[0]);
	char *js = served_stats(&s);
	const int64_t groups = json_top_u64(js, "pool_groups");
	cr_assert_gt(groups, 0, "%s", js);
	cr_assert_eq(json_top_u64(js, "populated_groups"), 0, "READY waited for the pool: %s", js);
	free(js);
	close(hold[1]); /* end-of-file: the populate threads start */
	const uint32_t h = ref_hidden(s.ref);
	struct fwd_case fc;
	fwd_case_make(&fc, 90, 1, 2, 4, ref_n_experts(s.ref), h, false);
	float *got = malloc((size_t)2 * h * sizeof(float)),
	      *want = malloc((size_t)2 * h * sizeof(float));
	cr_assert(got && want);
	struct moe_completion done;
	cr_assert_eq(served_forward(&s, &fc, got, &done), MOE_OK, "%s", moe_strerror(done.status));
	cr_assert_eq(ref_forward(s.ref, 1, fc.n_tokens, fc.k, 0, fc.x_wire, fc.in_dtype, fc.ids,
	                         fc.weights, NULL, want, NULL),
	             MOE_OK);
	cr_assert_eq(memcmp(got, want, (size_t)2 * h * sizeof(float)), 0,
	             "the FORWARD differs from the reference");
	js = served_stats(&s);
	cr_assert_geq(json_top_u64(js, "populated_groups"), 1, "%s", js);
	free(js);
	free(got);
	free(want);
	fwd_case_free(&fc);
	served_stop(&s);
#endif
}
