/* test_trace.c — the trace format: valid input parsed to the right values, every kind of bad
 * input rejected with a message naming the line and the problem, writer/parser round trip,
 * and the generator's shape and determinism. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "presets.h"
#include "trace.h"

static int parse(const char *text, struct routing_trace *t, struct sidecar_error *err)
{
	return trace_parse(text, strlen(text), "t.trace", t, err);
}

Test(trace, parses_scored_trace)
{
	struct routing_trace t;
	struct sidecar_error err = {0};
	cr_assert_eq(parse("# a comment\nmoe-trace 1 n_layers=2 n_experts=8 top_k=2\n\n"
	                   "0 0 3:0.75,5:0.25\n0 1\t7:1\n1 0 3:0.5,4:.5\r\n",
	                   &t, &err),
	             0, "%s", err.msg);
	cr_assert_eq(t.n_layers, 2);
	cr_assert_eq(t.n_experts, 8);
	cr_assert_eq(t.top_k, 2);
	cr_assert(t.scored);
	cr_assert_eq(t.n_lines, 3);
	cr_assert_eq(t.n_refs, 5);
	cr_assert_eq(t.lines[1].layer, 1);
	cr_assert_eq(t.lines[1].count, 1);
	cr_assert_eq(t.ids[t.lines[2].first + 1], 4);
	cr_assert_float_eq(t.scores[0], 0.75f, 1e-6);
	cr_assert_float_eq(t.scores[4], 0.5f, 1e-6);
	trace_free(&t);
}

struct bad_case {
	const char *text, *message;
};

Test(trace, rejects_bad_input_with_line_and_reason)
{
	const char *h = "moe-trace 1 n_layers=2 n_experts=8 top_k=2\n";
	struct bad_case cases[] = {
	    {"", "no 'moe-trace' header"},
	    {"hello\n", "not a trace"},
	    {"moe-trace 2 n_layers=2 n_experts=8 top_k=2\n0 0 1\n", "version"},
	    {"moe-trace 1 n_layers=0 n_experts=8 top_k=2\n", "bad header"},
	    {"moe-trace 1 n_layers=2 n_experts=8 top_k=9\n", "top_k above"},
	    {"moe-trace 1 n_layers=2 n_experts=8\n", "bad header"},
	    {"moe-trace 1 n_layers=4096 n_experts=65536 top_k=2\n", "too many"},
	    {"moe-trace 1 n_layers=2 n_experts=8 top_k=2\n", "no lines"},
	    {"L0 0 9\n", "t.trace:2: expert id 9 out of range (n_experts 8)"},
	    {"L2 2 1\n", "t.trace:2: layer 2 out of range"},
	    {"L2 0 1,1\n", "expert 1 listed twice"},
	    {"L2 0 1,2,3\n", "more than top_k=2"},
	    {"L2 0 1:0.5,2\n", "missing score"},
	    {"L2 0 1,2:0.5\n", "unexpected score"},
	    {"L2 0 1:1.5\n", "not a number in [0, 1]"},
	    {"L2 0 1:x\n", "not a number"},
	    {"L2 0 1 junk\n", "unexpected 'j'"},
	    {"L2 0 \n", "expected an expert id"},
	    {"L2 0 1,\n", "expected an expert id"},
	    {"L2 x 1\n", "expected a layer"},
	    {"L-1 0 1\n", "expected a step"},
	    {"L2 0 1\n1 0 1\n", "step 1 after step 2"},
	    {"L0 0 1\n0 1 2\n0 0 3\n", "t.trace:4: step 0 layer 0 listed twice"},
	    {"L99999999999 0 1\n", "expected a step"},
	    {"Lp 2 1\n0 0 1\n", "prefetch line: layer 2 out of range"},
	    {"Lp 0 9\n0 0 1\n", "prefetch line: expert id 9 out of range"},
	    {"Lp 0 1,1\n0 0 1\n", "prefetch line: expert 1 listed twice"},
	    {"Lp 0 1:0.5\n0 0 1\n", "prefetch ids have no scores"},
	    {"Lp x\n0 0 1\n", "expected a layer number after 'p'"},
	    {"Lp 0 1\n", "no lines"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char text[512];
		struct sidecar_error err = {0};
		const char *body = cases[i].text;
		if (body[0] == 'L')
			snprintf(text, sizeof(text), "%s%s", h, body + 1);
		else
			snprintf(text, sizeof(text), "%s", body);
		struct routing_trace t;
		err.msg[0] = '\0';
		cr_assert_neq(parse(text, &t, &err), 0, "case %zu accepted: %s", i, text);
		cr_assert(strstr(err.msg, cases[i].message) != NULL, "case %zu: '%s' lacks '%s'", i,
		          err.msg, cases[i].message);
	}
	/* An embedded NUL is refused, not read past. */
	const char nul[] = "moe-trace 1 n_layers=1 n_experts=2 top_k=1\n0 0 1\0\n";
	struct routing_trace t;
	struct sidecar_error err = {0};
	cr_assert_neq(trace_parse(nul, sizeof(nul) - 1, "t", &t, &err), 0);
	cr_assert(strstr(err.msg, "NUL") != NULL, "%s", err.msg);
	cr_assert_eq(err.status, MOE_EINVAL);
	/* A file that is not there: the open's errno decides the status. */
	cr_assert_neq(trace_load("/nonexistent/t.trace", &t, &err), 0);
	cr_assert_str_eq(err.msg, "/nonexistent/t.trace: cannot open: No such file or directory");
	cr_assert_eq(err.status, MOE_ESYS);
}

/* A trace cut mid-line (the recorder's disk filled) is refused, naming where its last line
 * starts: "3:0" read as a whole line would be a score-0 reference to expert 3. */
Test(trace, a_last_line_without_its_newline_is_refused_with_its_offset)
{
	const char *h = "moe-trace 1 n_layers=2 n_experts=8 top_k=2\n0 0 1:0.5,2:0.5\n";
	const struct {
		const char *tail, *says;
	} cases[] = {
	    {"0 1 3:0", "t.trace:3: the last line (from byte 59) has no newline"},
	    {"0 1 3:0.5,4:0.5", "t.trace:3: the last line (from byte 59) has no newline"},
	    {"# 3 FORWARD(s) not rec", "t.trace:3: the last line (from byte 59) has no newline"},
	    {" ", "(from byte 59)"},
	};
	cr_assert_eq(strlen(h), 59);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char text[256];
		snprintf(text, sizeof(text), "%s%s", h, cases[i].tail);
		struct routing_trace t;
		struct sidecar_error err = {0};
		cr_assert_neq(parse(text, &t, &err), 0, "case %zu accepted", i);
		cr_expect(strstr(err.msg, cases[i].says), "case %zu: '%s' lacks '%s'", i, err.msg,
		          cases[i].says);
		cr_expect_eq(err.status, MOE_EINVAL);
	}
	/* The same bytes with the newline parse; trace_load (simulate's, placement's reader)
	 * refuses the cut file the same way. */
	char text[256];
	snprintf(text, sizeof(text), "%s0 1 3:0\n", h);
	struct routing_trace t;
	struct sidecar_error err = {0};
	cr_assert_eq(parse(text, &t, &err), 0, "%s", err.msg);
	cr_assert_eq(t.n_lines, 2);
	trace_free(&t);
	char path[] = "/tmp/moe-cut-trace-XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, strlen(text) - 1), (ssize_t)strlen(text) - 1);
	close(fd);
	cr_assert_neq(trace_load(path, &t, &err), 0);
	cr_expect(strstr(err.msg, "the last line (from byte 59) has no newline"), "%s", err.msg);
	unlink(path);
}

Test(trace, generator_round_trips_and_is_deterministic)
{
	struct sidecar_error err = {0};
	struct trace_gen_params g;
	cr_assert_eq(trace_gen_preset("qwen3-30b-a3b", &g, &err), 0, "%s", err.msg);
	g.steps = 20;
	struct routing_trace a, b, c;
	cr_assert_eq(trace_generate(&g, &a, &err), 0, "%s", err.msg);
	cr_assert_eq(trace_generate(&g, &b, &err), 0, "%s", err.msg);
	cr_assert_eq(a.n_lines, 20 * 48);
	cr_assert_eq(a.n_refs, 20 * 48 * 8);
	cr_assert_eq(memcmp(a.ids, b.ids, a.n_refs * sizeof(uint32_t)), 0, "same seed differs");
	for (uint32_t li = 0; li < a.n_lines; li++) {
		const struct trace_line *l = &a.lines[li];
		cr_assert_eq(l->layer, li % 48);
		float sum = 0;
		for (uint32_t j = 0; j < l->count; j++) {
			cr_assert_lt(a.ids[l->first + j], 128);
			sum += a.scores[l->first + j];
			for (uint32_t k = 0; k < j; k++)
				cr_assert_neq(a.ids[l->first + j], a.ids[l->first + k]);
		}
		cr_assert_float_eq(sum, 1.0f, 1e-4);
	}
	/* Writer → parser gives the same trace (scores to 4 decimals). */
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_eq(trace_write(f, &a), 0);
	fclose(f);
	cr_assert_eq(trace_parse(buf, len, "mem", &c, &err), 0, "%s", err.msg);
	cr_assert_eq(c.n_refs, a.n_refs);
	cr_assert_eq(memcmp(c.ids, a.ids, a.n_refs * sizeof(uint32_t)), 0);
	cr_assert_float_eq(c.scores[7], a.scores[7], 1e-4);
	free(buf);
	/* Another seed gives another trace. */
	g.seed = 2;
	trace_free(&b);
	cr_assert_eq(trace_generate(&g, &b, &err), 0, "%s", err.msg);
	cr_assert_neq(memcmp(a.ids, b.ids, a.n_refs * sizeof(uint32_t)), 0);
	trace_free(&a);
	trace_free(&b);
	trace_free(&c);
}

Test(trace, generator_reuse_raises_repeats)
{
	struct sidecar_error err = {0};
	struct trace_gen_params g;
	cr_assert_eq(trace_gen_preset("deepseek-v3", &g, &err), 0);
	g.steps = 40;
	uint64_t repeats[2];
	for (int k = 0; k < 2; k++) {
		g.reuse = k ? 0.8 : 0.0;
		g.layer_corr = 0;
		struct routing_trace t;
		cr_assert_eq(trace_generate(&g, &t, &err), 0, "%s", err.msg);
		repeats[k] = 0;
		/* Experts shared with the previous step's line of the same layer. */
		for (uint32_t li = g.n_layers; li < t.n_lines; li++) {
			const struct trace_line *l = &t.lines[li], *p = &t.lines[li - g.n_layers];
			for (uint32_t j = 0; j < l->count; j++)
				for (uint32_t k2 = 0; k2 < p->count; k2++)
					repeats[k] += t.ids[l->first + j] == t.ids[p->first + k2];
		}
		trace_free(&t);
	}
	cr_assert_gt(repeats[1], repeats[0] * 2, "reuse 0.8: %llu repeats, reuse 0: %llu",
	             (unsigned long long)repeats[1], (unsigned long long)repeats[0]);
	struct trace_gen_params bad;
	cr_assert_neq(trace_gen_preset("gpt-5", &bad, &err), 0);
	cr_assert(strstr(err.msg, "gpt-5") != NULL);
	g.reuse = 1.5;
	struct routing_trace t;
	cr_assert_neq(trace_generate(&g, &t, &err), 0);
}

/* `simulate --generate` takes moe-gen's preset names (one table), the old short one too. */
Test(trace, generator_presets_are_moe_gen_presets)
{
	struct sidecar_error err = {0};
	uint32_t n = 0;
	for (const struct moe_model_preset *p = moe_model_presets; p->name; p++, n++) {
		struct trace_gen_params g;
		cr_assert_eq(trace_gen_preset(p->name, &g, &err), 0, "%s: %s", p->name, err.msg);
		/* the MoE blocks: after the dense ones, every moe_step-th (Llama-4 Maverick) */
		const uint32_t step = p->moe_step ? p->moe_step : 1;
		cr_expect_eq(g.n_layers, (p->full_layers - p->leading_dense) / step, "%s", p->name);
		cr_expect_eq(g.n_experts, p->n_experts, "%s", p->name);
		cr_expect_eq(g.top_k, p->top_k, "%s", p->name);
	}
	cr_assert_eq(n, 11,
	             "qwen3-30b-a3b, mixtral-8x7b, deepseek-v3, gpt-oss-20b, olmoe, glm-4.5, "
	             "glm-4.5-air, minimax-m2, llama4-scout, llama4-maverick, qwen3-next-80b-a3b");
	struct trace_gen_params l4;
	cr_assert_eq(trace_gen_preset("llama4-maverick", &l4, &err), 0, "%s", err.msg);
	cr_expect_eq(l4.n_layers, 24); /* blocks 1, 3, …, 47 */
	cr_assert_eq(trace_gen_preset("glm-4.5", &l4, &err), 0, "%s", err.msg);
	cr_expect_eq(l4.n_layers, 89);
	struct trace_gen_params a, b;
	cr_assert_eq(trace_gen_preset("mixtral", &a, &err), 0, "%s", err.msg);
	cr_assert_eq(trace_gen_preset("mixtral-8x7b", &b, &err), 0, "%s", err.msg);
	cr_expect(a.n_layers == b.n_layers && a.n_experts == b.n_experts && a.top_k == b.top_k,
	          "the alias is the same preset");
	cr_assert_neq(trace_gen_preset("olmoe-1b-7b", &b, &err), 0);
	cr_expect(strstr(err.msg, "gpt-oss-20b") && strstr(err.msg, "olmoe"), "%s", err.msg);
}
