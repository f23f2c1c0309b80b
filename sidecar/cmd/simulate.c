/* simulate.c — `moe-sidecar simulate`: replays a routing trace through the live policy code
 * (sim_run_policy, sidecar/residency/simulate.c) at several capacities, next to Belady's OPT,
 * as a table, JSON or a gnuplot PNG; and `simulate --generate MODEL` writes a synthetic trace
 * (trace.c). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "catalog_adapter.h"
#include "commands.h"
#include "json_writer.h"
#include "option_values.h"
#include "presets.h"
#include "sim.h"

#define MAX_CAPACITIES 64
#define MAX_POLICIES 16

static const char default_policies[] =
    "lru,lru+layer,sieve,sieve+layer,sieve-heat,sieve-heat+layer,heat+layer";

static void usage(FILE *to)
{
	char presets[256], policies[160];
	moe_model_preset_names(presets, sizeof(presets), ", ");
	policy_spec_help(policies, sizeof(policies));
	fprintf(
	    to,
	    "usage: moe-sidecar simulate TRACE --capacities A,B,C [--policies P,Q] [--json]\n"
	    "                            [--plot FILE.png] [--no-lookahead] [--model MODEL]\n"
	    "                            [--no-prefetches] [--from-step N]\n"
	    "       moe-sidecar simulate --generate MODEL [-o FILE] [--steps N] [--zipf S]\n"
	    "                            [--reuse P] [--layer-corr P] [--drift F]\n"
	    "                            [--drift-period N] [--seed N]\n\n"
	    "Replays TRACE through the residency policies at each capacity (expert slots, or\n"
	    "N%% of all experts) and prints hit rates, and reads per token, next to Belady's\n"
	    "OPT.\n"
	    "  --model         the model the trace was served from: experts in size classes\n"
	    "                  as the sidecar's pool has them, capacities in bytes (N%% of\n"
	    "                  every expert's slot bytes, as --mem-budget N%%, or a byte count)\n"
	    "                  and bytes read per token\n"
	    "  --no-prefetches ignore the trace's prefetch lines (p LAYER IDS)\n"
	    "  --from-step     count references and reads from step N on (after a warm-up)\n"
	    "  --policies      comma-separated; default\n"
	    "                  %s\n"
	    "                  algorithms %s\n"
	    "  --no-lookahead  do not give sieve-heat the next layer's experts as hints\n"
	    "  --generate      MODEL: one of moe-gen's presets (docs/residency.md)\n"
	    "                  %s\n",
	    default_policies, policies, presets);
}

static int parse_double_arg(const char *opt, const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || *end || end == s || !isfinite(v)) {
		fprintf(stderr, "simulate: %s: '%s' is not a number\n", opt, s);
		return -1;
	}
	*out = v;
	return 0;
}

static int parse_u64_arg(const char *opt, const char *s, uint64_t max, uint64_t *out)
{
	if (option_u64(s, 0, max, out) != 0) {
		fprintf(stderr, "simulate: %s: '%s' is not an integer in [0, %llu]\n", opt, s,
		        (unsigned long long)max);
		return -1;
	}
	return 0;
}

static int run_generate(const char *model, const char *out_path, int argc, char **argv)
{
	struct sidecar_error err = {0};
	struct trace_gen_params g;
	if (trace_gen_preset(model, &g, &err)) {
		fprintf(stderr, "simulate --generate: %s\n", err.msg);
		return 2;
	}
	/* Overrides, parsed after the preset so they apply on top of it. */
	for (int i = 0; i < argc; i += 2) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t u;
		if (!v) {
			fprintf(stderr, "simulate --generate: %s needs a value\n", o);
			return 2;
		}
		int bad = 0;
		if (!strcmp(o, "--steps"))
			bad = parse_u64_arg(o, v, 1000000, &u) || !(g.steps = (uint32_t)u);
		else if (!strcmp(o, "--zipf"))
			bad = parse_double_arg(o, v, &g.zipf_s);
		else if (!strcmp(o, "--reuse"))
			bad = parse_double_arg(o, v, &g.reuse);
		else if (!strcmp(o, "--layer-corr"))
			bad = parse_double_arg(o, v, &g.layer_corr);
		else if (!strcmp(o, "--drift"))
			bad = parse_double_arg(o, v, &g.drift);
		else if (!strcmp(o, "--drift-period"))
			bad = parse_u64_arg(o, v, UINT32_MAX, &u) ||
			      ((g.drift_period = (uint32_t)u), 0);
		else if (!strcmp(o, "--seed"))
			bad = parse_u64_arg(o, v, UINT64_MAX, &g.seed);
		else {
			fprintf(stderr, "simulate --generate: unknown option '%s'\n", o);
			return 2;
		}
		if (bad) {
			if (!strcmp(o, "--steps"))
				fprintf(stderr, "simulate --generate: --steps must be ≥ 1\n");
			return 2;
		}
	}
	struct routing_trace t;
	if (trace_generate(&g, &t, &err)) {
		fprintf(stderr, "simulate --generate: %s\n", err.msg);
		return 1;
	}
	FILE *f = out_path ? fopen(out_path, "w") : stdout;
	if (!f) {
		fprintf(stderr, "simulate --generate: %s: %s\n", out_path, strerror(errno));
		trace_free(&t);
		return 1;
	}
	fprintf(f,
	        "# generated: model=%s steps=%u zipf=%g reuse=%g layer_corr=%g drift=%g "
	        "drift_period=%u seed=%llu\n",
	        model, g.steps, g.zipf_s, g.reuse, g.layer_corr, g.drift, g.drift_period,
	        (unsigned long long)g.seed);
	int rc = trace_write(f, &t);
	if (out_path && fclose(f) != 0)
		rc = -EIO;
	else if (!out_path && fflush(f) != 0)
		rc = -EIO;
	trace_free(&t);
	if (rc) {
		fprintf(stderr, "simulate --generate: %s: write failed\n",
		        out_path ? out_path : "stdout");
		return 1;
	}
	return 0;
}

static int parse_capacities(const char *arg, uint32_t n_total, uint32_t *caps, int *n)
{
	char buf[1024];
	if (strlen(arg) >= sizeof(buf)) {
		fprintf(stderr, "simulate: --capacities: list too long\n");
		return -1;
	}
	strcpy(buf, arg);
	*n = 0;
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (*n >= MAX_CAPACITIES) {
			fprintf(stderr, "simulate: --capacities: at most %d values\n",
			        MAX_CAPACITIES);
			return -1;
		}
		size_t len = strlen(tok);
		char *end;
		errno = 0;
		if (len && tok[len - 1] == '%') {
			tok[len - 1] = '\0';
			double pct = strtod(tok, &end);
			if (errno || *end || end == tok || !(pct > 0 && pct <= 100)) {
				fprintf(stderr,
				        "simulate: --capacities: '%s%%' is not a percentage "
				        "in (0, 100]\n",
				        tok);
				return -1;
			}
			double c = floor(pct / 100.0 * n_total + 0.5);
			caps[(*n)++] = c < 1 ? 1 : (uint32_t)c;
		} else {
			unsigned long long c = strtoull(tok, &end, 10);
			if (errno || *end || end == tok || tok[0] == '-' || c == 0 || c > n_total) {
				fprintf(stderr,
				        "simulate: --capacities: '%s' is not a slot count in "
				        "[1, %u] (all experts of the trace)\n",
				        tok, n_total);
				return -1;
			}
			caps[(*n)++] = (uint32_t)c;
		}
	}
	if (!*n) {
		fprintf(stderr, "simulate: --capacities: empty list\n");
		return -1;
	}
	return 0;
}

static int write_plot(const char *png, const char *trace_name, const uint32_t *caps, int n_caps,
                      char names[][64], int n_pol, double *rates /* [n_pol+1][n_caps] */)
{
	/* gnuplot reads both names inside single quotes: refuse what would end the string. */
	if (strpbrk(png, "'\n\\")) {
		fprintf(stderr,
		        "simulate: --plot: '%s': quotes, backslashes and newlines are not "
		        "allowed in the file name\n",
		        png);
		return -1;
	}
	char title[128];
	const char *base = strrchr(trace_name, '/');
	snprintf(title, sizeof(title), "%s", base ? base + 1 : trace_name);
	for (char *q = title; *q; q++)
		if (*q == '\'' || *q == '\\' || *q == '\n')
			*q = '_';
	FILE *gp = popen("gnuplot", "w");
	if (!gp) {
		fprintf(stderr, "simulate: --plot: cannot run gnuplot: %s\n", strerror(errno));
		return -1;
	}
	fprintf(gp, "set terminal pngcairo size 900,600\nset output '%s'\n", png);
	fprintf(gp,
	        "set title 'expert cache hit rate: %s'\nset xlabel 'capacity (expert slots)'\n"
	        "set ylabel 'hit rate'\nset key bottom right\nset grid\nset yrange [0:1]\n",
	        title);
	fprintf(gp, "$data << EOD\n");
	for (int c = 0; c < n_caps; c++) {
		fprintf(gp, "%u", caps[c]);
		for (int p = 0; p <= n_pol; p++) {
			double v = rates[p * n_caps + c];
			if (v < 0)
				fprintf(gp, " NaN");
			else
				fprintf(gp, " %.6f", v);
		}
		fprintf(gp, "\n");
	}
	fprintf(gp, "EOD\nplot ");
	for (int p = 0; p <= n_pol; p++)
		fprintf(gp, "%s$data using 1:%d with linespoints title '%s'%s", p ? ", " : "",
		        p + 2, p < n_pol ? names[p] : "belady",
		        p == n_pol ? " dashtype 2 lw 2" : "");
	fprintf(gp, "\n");
	int status = pclose(gp);
	if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr,
		        "simulate: --plot: gnuplot failed writing %s (is gnuplot-nox "
		        "installed? exit status %d)\n",
		        png, status == -1 ? -1 : WEXITSTATUS(status));
		return -1;
	}
	return 0;
}

static int compare_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

/* --generate MODEL at argv[at]: the generator takes every other argument itself but -o/--output
 * FILE, the trace to write. Returns the exit status. */
static int generate_from_args(int argc, char **argv, int at)
{
	const char *output = NULL;
	int n_rest = 0;
	char **rest = calloc((size_t)argc, sizeof(char *));
	if (!rest) {
		fprintf(stderr, "simulate: out of memory\n");
		return 1;
	}
	for (int k = 1; k < argc; k++) {
		if (k == at) {
			k++;
		} else if ((!strcmp(argv[k], "-o") || !strcmp(argv[k], "--output")) &&
		           k + 1 < argc) {
			output = argv[++k];
		} else {
			rest[n_rest++] = argv[k];
		}
	}
	int rc = run_generate(argv[at + 1], output, n_rest, rest);
	free(rest);
	return rc;
}

/* The policies compared, the capacities, and the hit rates: rates[p * n_caps + c] for policy
 * p at capacity c, Belady's OPT as p = n_pol; -1 where pinned layers do not fit. */
struct sim_table {
	struct policy_spec specs[MAX_POLICIES];
	char names[MAX_POLICIES][64];
	int n_pol;
	uint32_t caps[MAX_CAPACITIES];    /* slots; with a model, the budget's share in 1e-4 */
	uint64_t budgets[MAX_CAPACITIES]; /* with a model: bytes */
	int n_caps;
	double *rates;
	/* reads per token (bytes with a model, loads without): [n_pol + 2][n_caps], Belady's
	 * OPT with the trace's prefetches at n_pol, without any at n_pol + 1 */
	double *reads;
	struct sim_sizes *sizes; /* --model, else NULL */
	struct sim_options opt;  /* prefetches, from_step */
	double tokens;           /* steps counted */
};

/* --policies P,Q into the table's specs and names; 0 or 2 (usage). */
static int parse_policy_list(const char *list, struct sim_table *tab)
{
	struct sidecar_error err = {0};
	char buf[1024];
	if (strlen(list) >= sizeof(buf)) {
		fprintf(stderr, "simulate: --policies: list too long\n");
		return 2;
	}
	strcpy(buf, list);
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (tab->n_pol >= MAX_POLICIES) {
			fprintf(stderr, "simulate: --policies: at most %d\n", MAX_POLICIES);
			return 2;
		}
		if (policy_spec_parse(tok, &tab->specs[tab->n_pol], &err)) {
			fprintf(stderr, "simulate: %s\n", err.msg);
			return 2;
		}
		policy_spec_name(&tab->specs[tab->n_pol], tab->names[tab->n_pol],
		                 sizeof(tab->names[tab->n_pol]));
		tab->n_pol++;
	}
	if (!tab->n_pol) {
		fprintf(stderr, "simulate: --policies: empty list\n");
		return 2;
	}
	return 0;
}

/* Every policy, then Belady's OPT, at every capacity of the table; 0, or 1 with the sentence
 * printed. */
static int simulate_every_capacity(const struct routing_trace *t, bool lookahead,
                                   struct sim_table *tab)
{
	struct sidecar_error err = {0};
	const int n_caps = tab->n_caps;
	for (int ci = 0; ci < n_caps; ci++) {
		struct sim_result r;
		struct sim_options o = tab->opt;
		o.lookahead = lookahead;
		o.capacity = tab->caps[ci];
		if (tab->sizes) {
			if (sim_sizes_budget(tab->sizes, tab->budgets[ci], &err)) {
				fprintf(stderr, "simulate: %s\n", err.msg);
				return 1;
			}
			o.sizes = tab->sizes;
			tab->caps[ci] = 0; /* the slots, for the plot */
			for (uint32_t c = 0; c < tab->sizes->n_classes; c++)
				tab->caps[ci] += tab->sizes->slots[c];
		}
		for (int p = 0; p < tab->n_pol; p++) {
			double *slot = &tab->rates[p * n_caps + ci];
			double *reads = &tab->reads[p * n_caps + ci];
			const struct policy_spec *spec = &tab->specs[p];
			if (!tab->sizes && spec->pin_layers <= t->n_layers &&
			    policy_slots_needed(spec, t->n_layers, t->n_experts, 0) >
			        tab->caps[ci]) {
				*slot = *reads = -1; /* pinned layers do not fit */
			} else if (sim_replay_policy(t, spec, &o, &r, &err)) {
				if (!spec->pin_layers) {
					fprintf(stderr, "simulate: %s\n", err.msg);
					return 1;
				}
				*slot = *reads = -1; /* pinned layers do not fit this budget */
			} else {
				*slot = r.refs ? (double)r.hits / (double)r.refs : 0;
				*reads = (double)(r.demand_bytes + r.prefetch_bytes) / tab->tokens;
			}
		}
		if (sim_replay_belady(t, &o, &r, &err)) {
			fprintf(stderr, "simulate: %s\n", err.msg);
			return 1;
		}
		tab->rates[tab->n_pol * n_caps + ci] = r.refs ? (double)r.hits / (double)r.refs : 0;
		tab->reads[tab->n_pol * n_caps + ci] =
		    (double)(r.demand_bytes + r.prefetch_bytes) / tab->tokens;
		o.prefetches = false;
		if (sim_replay_belady(t, &o, &r, &err)) {
			fprintf(stderr, "simulate: %s\n", err.msg);
			return 1;
		}
		tab->reads[(tab->n_pol + 1) * n_caps + ci] = (double)r.demand_bytes / tab->tokens;
	}
	return 0;
}

/* One row of figures per policy and OPT as a JSON object (null: no figure). */
static void json_rows(struct json_writer *w, const struct sim_table *tab, const double *v, int rows)
{
	jw_object_begin(w);
	for (int p = 0; p < rows; p++) {
		jw_key(w, p < tab->n_pol    ? tab->names[p]
		          : p == tab->n_pol ? "belady"
		                            : "belady_no_prefetch");
		jw_array_begin(w);
		for (int ci = 0; ci < tab->n_caps; ci++) {
			const double x = v[p * tab->n_caps + ci];
			if (x < 0)
				jw_null(w);
			else
				jw_double(w, x, 6);
		}
		jw_array_end(w);
	}
	jw_object_end(w);
}

/* The table as JSON (the shape docs/residency.md shows); 0, or 1 with the sentence printed. */
static int print_rates_json(const struct sim_table *tab)
{
	struct json_writer w;
	jw_init_file(&w, stdout);
	jw_set_spaced(&w, true);
	jw_object_begin(&w);
	jw_key(&w, "capacities");
	jw_array_begin(&w);
	for (int ci = 0; ci < tab->n_caps; ci++)
		jw_u64(&w, tab->sizes ? tab->budgets[ci] : tab->caps[ci]);
	jw_array_end(&w);
	jw_key(&w, "policies");
	json_rows(&w, tab, tab->rates, tab->n_pol + 1);
	jw_key(&w, "capacity_unit");
	jw_string(&w, tab->sizes ? "bytes" : "slots");
	jw_key(&w, "tokens");
	jw_double(&w, tab->tokens, 0);
	jw_key(&w, "reads_unit");
	jw_string(&w, tab->sizes ? "bytes" : "loads");
	jw_key(&w, "reads_per_token");
	json_rows(&w, tab, tab->reads, tab->n_pol + 2);
	jw_object_end(&w);
	const int rc = jw_finish_line(&w);
	if (rc != 0) {
		fprintf(stderr, "simulate: writing the JSON: %s\n", strerror(-rc));
		return 1;
	}
	return 0;
}

/* The trace's shape, then one row of hit rates per policy, one column per capacity. */
static void print_rates_table(const char *trace_path, const struct routing_trace *t,
                              const struct sim_table *tab)
{
	printf("trace %s: %u layers × %u experts, top-%u, %u lines, %u references\n", trace_path,
	       t->n_layers, t->n_experts, t->top_k, t->n_lines, t->n_refs);
	if (tab->sizes) {
		printf("hit rate by budget (%% of every expert's slot bytes, %.1f MiB; %u size "
		       "class(es))\n",
		       (double)tab->sizes->all_bytes / 1048576.0, tab->sizes->n_classes);
		printf("%-18s", "policy");
		for (int ci = 0; ci < tab->n_caps; ci++)
			printf(" %7.1f%%",
			       100.0 * (double)tab->budgets[ci] / (double)tab->sizes->all_bytes);
		printf("\n");
	} else {
		printf("hit rate by capacity (expert slots; %% of all %u experts)\n",
		       t->n_layers * t->n_experts);
		printf("%-18s", "policy");
		for (int ci = 0; ci < tab->n_caps; ci++)
			printf(" %8u", tab->caps[ci]);
		printf("\n%-18s", "");
		for (int ci = 0; ci < tab->n_caps; ci++)
			printf(" %7.1f%%", 100.0 * tab->caps[ci] / (t->n_layers * t->n_experts));
		printf("\n");
	}
	for (int p = 0; p <= tab->n_pol; p++) {
		printf("%-18s", p < tab->n_pol ? tab->names[p] : "belady (OPT)");
		for (int ci = 0; ci < tab->n_caps; ci++) {
			double v = tab->rates[p * tab->n_caps + ci];
			if (v < 0)
				printf(" %8s", "-");
			else
				printf(" %8.4f", v);
		}
		printf("\n");
	}
	const double unit = tab->sizes ? 1048576.0 : 1.0;
	printf("\n%s read per token over %.0f token(s) (demand misses and prefetches%s); "
	       "against Belady's OPT given the same prefetches\n",
	       tab->sizes ? "MiB" : "loads", tab->tokens,
	       tab->opt.prefetches && t->n_prefetches ? ", as recorded" : "");
	for (int p = 0; p <= tab->n_pol + 1; p++) {
		printf("%-18s", p < tab->n_pol    ? tab->names[p]
		                : p == tab->n_pol ? "belady (OPT)"
		                                  : "OPT, no prefetch");
		for (int ci = 0; ci < tab->n_caps; ci++) {
			const double v = tab->reads[p * tab->n_caps + ci];
			const double opt = tab->reads[tab->n_pol * tab->n_caps + ci];
			if (v < 0)
				printf(" %15s", "-");
			else if (p < tab->n_pol && opt > 0)
				printf(" %8.2f %5.2fx", v / unit, v / opt);
			else
				printf(" %8.2f %6s", v / unit, "");
		}
		printf("\n");
	}
}

/* What a replay needs from the command line. */
struct replay_args {
	const char *caps_arg, *pol_arg, *plot, *trace_path, *model;
	bool json, lookahead, no_prefetches;
	uint32_t from_step;
};

/* The replay's command line into *a: -1 to go on, else the status to exit with. */
static int parse_replay_args(int argc, char **argv, struct replay_args *a)
{
	static const struct option opts[] = {
	    {"capacities", required_argument, NULL, 'c'},
	    {"policies", required_argument, NULL, 'p'},
	    {"json", no_argument, NULL, 'j'},
	    {"plot", required_argument, NULL, 'P'},
	    {"no-lookahead", no_argument, NULL, 'n'},
	    {"model", required_argument, NULL, 'm'},
	    {"no-prefetches", no_argument, NULL, 'N'},
	    {"from-step", required_argument, NULL, 'f'},
	    {"generate", required_argument, NULL, 'g'},
	    {"output", required_argument, NULL, 'o'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	*a = (struct replay_args){.pol_arg = default_policies, .lookahead = true};
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'c': a->caps_arg = optarg; break;
		case 'p': a->pol_arg = optarg; break;
		case 'j': a->json = true; break;
		case 'P': a->plot = optarg; break;
		case 'n': a->lookahead = false; break;
		case 'm': a->model = optarg; break;
		case 'N': a->no_prefetches = true; break;
		case 'f': {
			uint64_t u;
			if (parse_u64_arg("--from-step", optarg, UINT32_MAX, &u))
				return 2;
			a->from_step = (uint32_t)u;
			break;
		}
		case 'o': break; /* only --generate writes a file */
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind + 1 != argc || !a->caps_arg) {
		fprintf(stderr, "simulate: need one TRACE and --capacities\n");
		usage(stderr);
		return 2;
	}
	a->trace_path = argv[optind];
	return -1;
}

/* --capacities with a model: N% of every expert's slot bytes, or a byte count, sorted. */
static int parse_budgets(const char *arg, uint64_t all_bytes, struct sim_table *tab)
{
	char buf[1024];
	if (strlen(arg) >= sizeof(buf)) {
		fprintf(stderr, "simulate: --capacities: list too long\n");
		return -1;
	}
	strcpy(buf, arg);
	tab->n_caps = 0;
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (tab->n_caps >= MAX_CAPACITIES) {
			fprintf(stderr, "simulate: --capacities: at most %d values\n",
			        MAX_CAPACITIES);
			return -1;
		}
		const size_t len = strlen(tok);
		uint64_t b;
		if (len && tok[len - 1] == '%') {
			tok[len - 1] = '\0';
			char *end;
			errno = 0;
			const double pct = strtod(tok, &end);
			if (errno || *end || end == tok || !(pct > 0 && pct <= 100)) {
				fprintf(stderr,
				        "simulate: --capacities: '%s%%' is not a percentage in "
				        "(0, 100]\n",
				        tok);
				return -1;
			}
			b = (uint64_t)((double)all_bytes * pct / 100.0);
		} else if (option_u64(tok, 1, UINT64_MAX, &b) != 0) {
			fprintf(stderr,
			        "simulate: --capacities: '%s' is neither N%% nor a byte count\n",
			        tok);
			return -1;
		}
		tab->budgets[tab->n_caps++] = b;
	}
	if (!tab->n_caps) {
		fprintf(stderr, "simulate: --capacities: empty list\n");
		return -1;
	}
	for (int i = 1; i < tab->n_caps; i++) /* sorted ascending: insertion */
		for (int j = i; j > 0 && tab->budgets[j - 1] > tab->budgets[j]; j--) {
			const uint64_t x = tab->budgets[j];
			tab->budgets[j] = tab->budgets[j - 1];
			tab->budgets[j - 1] = x;
		}
	return 0;
}

/* The sizes of the model's experts (--model) into *s: 0, or 1 with the sentence printed. */
static int sizes_from_model(const char *path, const struct routing_trace *t, struct sim_sizes *s)
{
	struct sidecar_error err = {0};
	struct moe_catalog *cat;
	if (moe_catalog_open(path, &cat, &err) != 0) {
		fprintf(stderr, "simulate: --model: %s\n", err.msg);
		return 1;
	}
	struct expert_map map;
	struct expert_extent_roles roles;
	int rc = expert_map_from_catalog(cat, &map, &roles, NULL, &err);
	if (rc == 0) {
		if (map.n_layers != t->n_layers || map.n_experts != t->n_experts) {
			fprintf(stderr,
			        "simulate: --model %s: %u MoE layers × %u experts, the trace has "
			        "%u × %u\n",
			        path, map.n_layers, map.n_experts, t->n_layers, t->n_experts);
			rc = 1;
		} else if (sim_sizes_from_map(&map, 4096, s, &err) != 0) {
			rc = -1;
		}
		expert_map_free(&map);
	}
	moe_catalog_close(cat);
	if (rc < 0)
		fprintf(stderr, "simulate: --model: %s\n", err.msg);
	return rc ? 1 : 0;
}

/* Replays the trace into the table and prints it; the exit status. */
static int replay(const struct replay_args *a, const struct routing_trace *t, struct sim_table *tab)
{
	if (tab->sizes) {
		if (parse_budgets(a->caps_arg, tab->sizes->all_bytes, tab))
			return 2;
	} else {
		if (parse_capacities(a->caps_arg, t->n_layers * t->n_experts, tab->caps,
		                     &tab->n_caps))
			return 2;
		qsort(tab->caps, (size_t)tab->n_caps, sizeof(tab->caps[0]), compare_u32);
	}
	tab->opt = (struct sim_options){.prefetches = !a->no_prefetches, .from_step = a->from_step};
	tab->tokens = 0;
	for (uint32_t li = 0, last = UINT32_MAX; li < t->n_lines; li++)
		if (t->lines[li].step >= a->from_step && t->lines[li].step != last) {
			last = t->lines[li].step;
			tab->tokens++;
		}
	if (tab->tokens == 0) {
		fprintf(stderr, "simulate: --from-step %u: the trace has no step from there on\n",
		        a->from_step);
		return 2;
	}
	tab->rates = malloc(sizeof(double) * (size_t)(tab->n_pol + 1) * (size_t)tab->n_caps);
	tab->reads = malloc(sizeof(double) * (size_t)(tab->n_pol + 2) * (size_t)tab->n_caps);
	if (!tab->rates || !tab->reads) {
		fprintf(stderr, "simulate: out of memory\n");
		return 1;
	}
	if (simulate_every_capacity(t, a->lookahead, tab) != 0)
		return 1;
	if (a->json) {
		if (print_rates_json(tab) != 0)
			return 1;
	} else {
		print_rates_table(a->trace_path, t, tab);
	}
	if (a->plot && write_plot(a->plot, a->trace_path, tab->caps, tab->n_caps, tab->names,
	                          tab->n_pol, tab->rates))
		return 1;
	return 0;
}

int cmd_simulate(int argc, char **argv)
{
	/* --generate takes the remaining generator options itself; stop getopt at the first
	 * one it does not know only in that mode. */
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--generate") && i + 1 < argc)
			return generate_from_args(argc, argv, i);
	struct replay_args a;
	int status = parse_replay_args(argc, argv, &a);
	if (status >= 0)
		return status;
	struct sim_table tab = {0};
	status = parse_policy_list(a.pol_arg, &tab);
	if (status != 0)
		return status;
	struct routing_trace t;
	struct sidecar_error err = {0};
	if (trace_load(a.trace_path, &t, &err)) {
		fprintf(stderr, "simulate: %s\n", err.msg);
		return 1;
	}
	struct sim_sizes sizes;
	if (a.model) {
		if (sizes_from_model(a.model, &t, &sizes) != 0) {
			trace_free(&t);
			return 1;
		}
		tab.sizes = &sizes;
	}
	status = replay(&a, &t, &tab);
	if (tab.sizes)
		sim_sizes_free(tab.sizes);
	free(tab.rates);
	free(tab.reads);
	trace_free(&t);
	return status;
}
