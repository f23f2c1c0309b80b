/* stats.c — `moe-sidecar stats [--socket P] [--json | --prometheus] [--experts[=N]] [--watch
 * S [--count N]]`: a running sidecar's counters, asked for over the channel like any client (a
 * STATS request).
 *
 * --experts[=N] adds each MoE layer's N hottest experts (default 8): tokens routed to them
 * and their heat (STATS with MOE_STATS_EXPERTS); --json asks for the same keys, so the
 * document it prints has "experts" too (from a 1.2 sidecar; an older one has none).
 *
 * --prometheus prints the reply as a Prometheus text exposition (stats_doc.h: the same as
 * serve --metrics' /metrics less its ready and heartbeat lines), for node_exporter's
 * textfile collector.
 *
 * --json prints the sidecar's document as it came (keys: docs/protocol.md, STATS); otherwise a
 * summary, then every figure of stats_table.h (stats_doc_write_text: global figures, the node
 * and the layer tables, one column per figure), every figure labelled as a total since start, a
 * rate over the last interval, or a value now. --watch S repeats every S seconds until interrupted
 * (or N times); from the second sample on, counters are rates over the interval with their totals
 * in brackets, and the layer table holds the interval's rates. The reply is checked as hostile
 * input: it is parsed strictly and a missing key is an error naming it.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "commands.h"
#include "json.h"
#include "moe_client.h"
#include "stats_doc.h"

#define STATS_TIMEOUT_MS 5000

static void stats_usage(FILE *to)
{
	fprintf(to, "usage: moe-sidecar stats [--socket PATH] [--json | --prometheus] "
	            "[--experts[=N]] [--watch SECONDS [--count N]]\n\n"
	            "  --socket PATH   the sidecar's socket (default as for serve)\n"
	            "  --json          print the STATS JSON object as the sidecar sent it (with\n"
	            "                  per-expert counts and heat: \"experts\")\n"
	            "  --prometheus    print the figures as a Prometheus text exposition (for\n"
	            "                  node_exporter's textfile collector)\n"
	            "  --experts[=N]   each MoE layer's N hottest experts (default 8)\n"
	            "  --watch S       repeat every S seconds; from the second sample on, rates\n"
	            "                  per second over the interval [totals since start]\n"
	            "  --count N       with --watch: stop after N samples\n");
}

/* Connects with an output area of at least need bytes. */
static int connect_for_stats(const char *path, size_t need, struct moe_client **c)
{
	struct moe_connect_opts o = {
	    .socket_path = path, .n_slots = 1, .client_name = "moe-sidecar stats"};
	int rc = moe_connect(&o, c);
	if (rc != MOE_OK)
		return rc;
	const struct moe_info *inf = moe_info(*c);
	size_t row = (size_t)inf->hidden * 4u;
	size_t have = (size_t)inf->max_tokens * row;
	if (have >= need || row == 0)
		return MOE_OK;
	moe_close(*c);
	o.max_tokens = (uint32_t)((need + row - 1) / row);
	return moe_connect(&o, c);
}

/* Fetches the JSON into *buf (grown as needed), with flags when the sidecar knows them
 * (1.2). */
static int fetch(const char *path, uint16_t flags, char **buf, size_t *cap)
{
	size_t need = 64u << 10;
	for (int attempt = 0; attempt < 4; attempt++) {
		struct moe_client *c;
		int rc = connect_for_stats(path, need, &c);
		if (rc != MOE_OK) {
			fprintf(stderr, "moe-sidecar stats: %s: %s\n", moe_strerror(rc),
			        moe_connect_error());
			return -1;
		}
		if (*cap < need) {
			char *nb = realloc(*buf, need);
			if (!nb) {
				moe_close(c);
				fprintf(stderr, "moe-sidecar stats: out of memory\n");
				return -1;
			}
			*buf = nb;
			*cap = need;
		}
		rc = moe_stats_json_flags(c, moe_info(c)->abi_minor >= 2 ? flags : 0, *buf, *cap,
		                          STATS_TIMEOUT_MS);
		if (rc == MOE_OK) {
			moe_close(c);
			return 0;
		}
		if (rc != MOE_ETOOSMALL) {
			fprintf(stderr, "moe-sidecar stats: %s: %s\n", moe_strerror(rc),
			        moe_last_error(c));
			moe_close(c);
			return -1;
		}
		moe_close(c);
		need *= 4;
	}
	fprintf(stderr, "moe-sidecar stats: the STATS reply does not fit %zu bytes\n", need);
	return -1;
}

/* Counters every reply has; the summary's first lines. */
static const char *const summary_keys[] = {"requests",       "tokens",          "hits",
                                           "cold_misses",    "inflight_misses", "bytes_read",
                                           "resident_bytes", "budget_bytes"};
#define N_SUMMARY (sizeof(summary_keys) / sizeof(summary_keys[0]))
enum { S_REQUESTS, S_TOKENS, S_HITS, S_COLD, S_INFLIGHT, S_READ, S_RESIDENT, S_BUDGET };

/* What --watch keeps of the last sample: its counters, to print the interval's rates. */
struct watch_state {
	bool have;
	uint64_t sum[N_SUMMARY];
	struct stats_doc doc;
};

/* key, or "object.member" one level down. */
static int get_u64(const struct json_doc *d, json_ref obj, const char *key, uint64_t *out,
                   const char *where)
{
	const char *dot = strchr(key, '.');
	int found;
	if (dot) {
		char outer[32];
		snprintf(outer, sizeof(outer), "%.*s", (int)(dot - key), key);
		found = json_get_u64(d, json_object_get(d, obj, outer), dot + 1, out);
	} else {
		found = json_get_u64(d, obj, key, out);
	}
	if (found != 1) {
		fprintf(stderr, "moe-sidecar stats: reply%s: key \"%s\" missing or not a count\n",
		        where, key);
		return -1;
	}
	return 0;
}

/* a/b in percent, or "-" when b is 0. */
static const char *percent(uint64_t a, uint64_t b, char *buf, size_t len)
{
	if (!b)
		return "-";
	snprintf(buf, len, "%.1f%%", 100.0 * (double)a / (double)b);
	return buf;
}

/* A counter's growth since the last sample (0 if it went back: a restarted sidecar). */
static uint64_t grown(uint64_t now, uint64_t before)
{
	return now >= before ? now - before : 0;
}

/* Each MoE layer's n hottest experts by tokens routed (ties: the lower id), with their heat.
 * Absent "experts" (a 1.1 sidecar): says so. */
static int print_experts(const struct json_doc *d, json_ref root, uint32_t n)
{
	json_ref ex = json_object_get(d, root, "experts");
	if (json_type_of(d, ex) != JSON_ARRAY) {
		printf("\nper expert: not reported by this sidecar (protocol 1.2 has it)\n");
		return 0;
	}
	uint64_t half_life = 0;
	json_get_u64(d, root, "heat_half_life_tokens", &half_life);
	printf("\nhottest experts per layer, tokens routed since start (share of the layer's), "
	       "heat (half-life %" PRIu64 " tokens):\n",
	       half_life);
	for (json_ref l = json_first(d, ex); l != JSON_NONE; l = json_next(d, l)) {
		uint64_t layer, tokens;
		json_ref counts = json_object_get(d, l, "counts"),
		         heat = json_object_get(d, l, "heat");
		if (get_u64(d, l, "layer", &layer, " experts[]") != 0 ||
		    get_u64(d, l, "tokens", &tokens, " experts[]") != 0 ||
		    json_type_of(d, counts) != JSON_ARRAY || json_type_of(d, heat) != JSON_ARRAY ||
		    json_count(d, counts) != json_count(d, heat)) {
			fprintf(stderr, "moe-sidecar stats: reply: experts[] malformed\n");
			return -1;
		}
		const uint32_t ne = json_count(d, counts);
		uint64_t *c = calloc(ne ? ne : 1, sizeof(*c));
		double *h = calloc(ne ? ne : 1, sizeof(*h));
		bool *shown = calloc(ne ? ne : 1, sizeof(*shown));
		if (!c || !h || !shown) {
			free(c);
			free(h);
			free(shown);
			return -1;
		}
		uint32_t i = 0;
		uint64_t sum = 0;
		for (json_ref v = json_first(d, counts); v != JSON_NONE; v = json_next(d, v), i++)
			if (json_u64(d, v, &c[i]) == 0)
				sum += c[i];
		i = 0;
		for (json_ref v = json_first(d, heat); v != JSON_NONE; v = json_next(d, v), i++)
			json_double(d, v, &h[i]);
		printf("%5" PRIu64 " %8" PRIu64 " tok:", layer, tokens);
		for (uint32_t r = 0; r < n && r < ne; r++) {
			uint32_t best = UINT32_MAX;
			for (uint32_t x = 0; x < ne; x++)
				if (!shown[x] && (best == UINT32_MAX || c[x] > c[best]))
					best = x;
			if (c[best] == 0)
				break;
			shown[best] = true;
			printf("  e%u %" PRIu64 " (%.1f%%) h%.1f", best, c[best],
			       100.0 * (double)c[best] / (double)sum, h[best]);
		}
		printf("\n");
		free(c);
		free(h);
		free(shown);
	}
	return 0;
}

/* The reply's summary counters into sum and every figure into *doc (stats_doc_free it); -1
 * with the key named when one is missing. */
static int read_sample(const struct json_doc *d, json_ref root, uint64_t sum[N_SUMMARY],
                       struct stats_doc *doc)
{
	for (size_t i = 0; i < N_SUMMARY; i++)
		if (get_u64(d, root, summary_keys[i], &sum[i], "") != 0)
			return -1;
	struct sidecar_error err;
	if (stats_doc_parse_json(d, root, doc, &err) != 0) {
		fprintf(stderr, "moe-sidecar stats: %s\n", err.msg);
		return -1;
	}
	return 0;
}

/* The summary's first lines as rates over the interval, "X/s [total]" for each counter. */
static void print_summary_rates(const char *name, const uint64_t sum[N_SUMMARY],
                                const struct watch_state *w, double interval_s)
{
	char p1[16], p2[16];
	double per[N_SUMMARY];
	for (size_t k = 0; k < N_SUMMARY; k++)
		per[k] = (double)grown(sum[k], w->sum[k]) / interval_s;
	const uint64_t dh = grown(sum[S_HITS], w->sum[S_HITS]),
	               dl = dh + grown(sum[S_COLD], w->sum[S_COLD]) +
	                    grown(sum[S_INFLIGHT], w->sum[S_INFLIGHT]);
	printf("model %s, last %.1f s: rates per second [totals since start]\n", name ? name : "?",
	       interval_s);
	printf("requests %.1f/s [%" PRIu64 "]  tokens %.1f/s [%" PRIu64 "]\n", per[S_REQUESTS],
	       sum[S_REQUESTS], per[S_TOKENS], sum[S_TOKENS]);
	printf("hits %.1f/s [%" PRIu64 "]  cold misses %.1f/s [%" PRIu64
	       "]  in-flight misses %.1f/s [%" PRIu64 "]  hit rate %s [%s]  read %.1f "
	       "MiB/s [%.1f MiB]\n",
	       per[S_HITS], sum[S_HITS], per[S_COLD], sum[S_COLD], per[S_INFLIGHT], sum[S_INFLIGHT],
	       percent(dh, dl, p1, sizeof(p1)),
	       percent(sum[S_HITS], sum[S_HITS] + sum[S_COLD] + sum[S_INFLIGHT], p2, sizeof(p2)),
	       per[S_READ] / 1048576.0, (double)sum[S_READ] / 1048576.0);
}

/* The summary's first lines as totals since start, with the loader's and retries' lines. */
static void print_summary_totals(const struct json_doc *d, json_ref root, const char *name,
                                 const uint64_t sum[N_SUMMARY])
{
	char p1[16];
	printf("model %s, totals since the sidecar started\n", name ? name : "?");
	printf("requests %" PRIu64 "  tokens %" PRIu64, sum[S_REQUESTS], sum[S_TOKENS]);
	uint64_t inline_fwd;
	if (json_get_u64(d, root, "forwards_inline", &inline_fwd) == 1)
		printf("  run inline %" PRIu64, inline_fwd);
	printf("\nhits %" PRIu64 "  cold misses %" PRIu64 "  in-flight misses %" PRIu64
	       "  hit rate %s  read %.1f MiB\n",
	       sum[S_HITS], sum[S_COLD], sum[S_INFLIGHT],
	       percent(sum[S_HITS], sum[S_HITS] + sum[S_COLD] + sum[S_INFLIGHT], p1, sizeof(p1)),
	       (double)sum[S_READ] / 1048576.0);
	uint64_t loader_read, prefetches, prefetch_hits, prefetch_wasted;
	if (json_get_u64(d, root, "loader_bytes_read", &loader_read) == 1 &&
	    json_get_u64(d, root, "prefetches", &prefetches) == 1 &&
	    json_get_u64(d, root, "prefetch_hits", &prefetch_hits) == 1 &&
	    json_get_u64(d, root, "prefetch_wasted", &prefetch_wasted) == 1)
		printf("loader read %.1f MiB in all (demand + prefetch); prefetches %" PRIu64
		       ", used %" PRIu64 ", evicted unused %" PRIu64 "\n",
		       (double)loader_read / 1048576.0, prefetches, prefetch_hits, prefetch_wasted);
	/* (1.3) the channels that asked for batch-invariant results, or --batch-invariant */
	const json_ref inv = json_object_get(d, root, "batch_invariant");
	uint64_t n_invariant;
	bool every;
	if (json_get_u64(d, inv, "channels", &n_invariant) == 1 &&
	    json_bool(d, json_object_get(d, inv, "serve"), &every) == 0)
		printf("batch-invariant channels %" PRIu64 "%s\n", n_invariant,
		       every ? " (every channel: --batch-invariant)" : "");
	uint64_t failed, retried;
	if (json_get_u64(d, root, "failed_experts", &failed) == 1 &&
	    json_get_u64(d, root, "failed_retries", &retried) == 1)
		printf("experts read again after a failed load %" PRIu64 "\n", retried);
}

/* How the loader reads and where the slots live, then what is resident now. */
static void print_slots_now(const struct json_doc *d, json_ref root, const uint64_t sum[N_SUMMARY])
{
	char p2[16];
	uint64_t fixed_reads, plain_reads, fixed_buffers, hugetlb, thp;
	if (json_get_u64(d, root, "fixed_reads", &fixed_reads) == 1 &&
	    json_get_u64(d, root, "plain_reads", &plain_reads) == 1 &&
	    json_get_u64(d, root, "fixed_buffers", &fixed_buffers) == 1 &&
	    json_get_u64(d, root, "pool_hugetlb", &hugetlb) == 1 &&
	    json_get_u64(d, root, "pool_thp", &thp) == 1 &&
	    fixed_reads + plain_reads + fixed_buffers)
		printf("loader reads %" PRIu64 " into registered slots (%" PRIu64
		       " fixed buffers), %" PRIu64 " plain; slot pages: %s\n",
		       fixed_reads, fixed_buffers, plain_reads,
		       hugetlb ? "hugetlb"
		       : thp   ? "transparent huge pages"
		               : "4 KiB");
	uint64_t slot_used, failed_now;
	printf("now: resident %.1f MiB of experts", (double)sum[S_RESIDENT] / 1048576.0);
	if (json_get_u64(d, root, "slot_bytes_used", &slot_used) == 1)
		printf(" in %.1f MiB of slots", (double)slot_used / 1048576.0);
	else
		slot_used = sum[S_RESIDENT];
	printf(" of a %.1f MiB budget (%s)", (double)sum[S_BUDGET] / 1048576.0,
	       percent(slot_used, sum[S_BUDGET], p2, sizeof(p2)));
	if (json_get_u64(d, root, "failed_experts", &failed_now) == 1)
		printf("; failed experts %" PRIu64, failed_now);
	printf("\n");
}

/* The page-cache probes' totals, or why there are none. */
static void print_page_cache(const struct json_doc *d, json_ref root)
{
	json_ref probes = json_object_get(d, root, "probes");
	const char *pstatus = json_string(d, probes, NULL);
	uint64_t fill, direct, buffered;
	double bypass;
	if (pstatus && !strcmp(pstatus, "active") &&
	    json_get_u64(d, root, "pagecache_fill_bytes", &fill) == 1 &&
	    json_get_u64(d, root, "direct_bytes", &direct) == 1 &&
	    json_get_u64(d, root, "buffered_bytes", &buffered) == 1) {
		printf("page cache, totals since start: filled %.1f MiB, direct %.1f MiB, "
		       "buffered %.1f MiB, bypass ",
		       (double)fill / 1048576.0, (double)direct / 1048576.0,
		       (double)buffered / 1048576.0);
		if (json_get_double(d, root, "bypass_ratio", &bypass) == 1)
			printf("%.4f\n", bypass);
		else
			printf("-\n");
	} else {
		printf("page cache: %s\n", pstatus ? pstatus : "probes unavailable: no report");
	}
}

/* Prints one sample. With w->have (--watch, from the second sample on), every counter is
 * shown as its rate over the interval, with its total since start in brackets, and the layer
 * table holds the interval's rates; otherwise totals since start. Resident and budget bytes
 * and the probes' figures are what they are now; latency percentiles are always over every
 * request since start (the reply carries no histogram to take an interval's from). */
static int print_sample(const char *json, struct watch_state *w, double interval_s,
                        uint32_t experts)
{
	struct sidecar_error err;
	struct json_doc *d;
	if (json_parse(json, strlen(json), &d, &err) != 0) {
		fprintf(stderr, "moe-sidecar stats: reply is not JSON: %s\n", err.msg);
		return -1;
	}
	json_ref root = json_root(d);
	uint64_t sum[N_SUMMARY];
	struct stats_doc doc;
	if (read_sample(d, root, sum, &doc) != 0) {
		stats_doc_free(&doc);
		json_free(d);
		return -1;
	}
	const bool rates = w && w->have && interval_s > 0;
	const char *name = json_string(d, json_object_get(d, root, "model"), NULL);
	if (rates)
		print_summary_rates(name, sum, w, interval_s);
	else
		print_summary_totals(d, root, name, sum);
	print_slots_now(d, root, sum);
	print_page_cache(d, root);
	stats_doc_write_text(&doc, rates ? &w->doc : NULL, interval_s, stdout);
	const int rc = experts ? print_experts(d, root, experts) : 0;
	if (w) {
		memcpy(w->sum, sum, sizeof(sum));
		stats_doc_free(&w->doc);
		w->doc = doc;
		w->have = true;
	} else {
		stats_doc_free(&doc);
	}
	json_free(d);
	return rc;
}

/* The reply as a Prometheus exposition. */
static int print_prometheus(const char *json)
{
	struct sidecar_error err;
	struct json_doc *d;
	if (json_parse(json, strlen(json), &d, &err) != 0) {
		fprintf(stderr, "moe-sidecar stats: reply is not JSON: %s\n", err.msg);
		return -1;
	}
	struct stats_doc doc;
	const int rc = stats_doc_parse_json(d, json_root(d), &doc, &err);
	if (rc != 0)
		fprintf(stderr, "moe-sidecar stats: %s\n", err.msg);
	else
		stats_doc_write_prometheus(&doc, stdout);
	stats_doc_free(&doc);
	json_free(d);
	return rc;
}

int cmd_stats(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"socket", required_argument, NULL, 's'},  {"json", no_argument, NULL, 'j'},
	    {"watch", required_argument, NULL, 'w'},   {"count", required_argument, NULL, 'n'},
	    {"experts", optional_argument, NULL, 'e'}, {"prometheus", no_argument, NULL, 'p'},
	    {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
	};
	uint32_t experts = 0;
	const char *path = NULL;
	bool json = false, prometheus = false;
	double watch = 0;
	uint64_t count = 0;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "s:jw:n:h", longopts, NULL)) != -1) {
		switch (c) {
		case 's': path = optarg; break;
		case 'j': json = true; break;
		case 'p': prometheus = true; break;
		case 'w': {
			char *end;
			errno = 0;
			watch = strtod(optarg, &end);
			if (errno || *end || !(watch >= 0.1 && watch <= 86400)) {
				fprintf(stderr,
				        "moe-sidecar stats: --watch '%s': expected seconds in "
				        "0.1..86400\n",
				        optarg);
				return 2;
			}
			break;
		}
		case 'n': {
			char *end;
			errno = 0;
			unsigned long long v = strtoull(optarg, &end, 10);
			if (errno || *end || optarg[0] == '-' || v == 0) {
				fprintf(stderr,
				        "moe-sidecar stats: --count '%s': expected a number of "
				        "samples (1 or more)\n",
				        optarg);
				return 2;
			}
			count = v;
			break;
		}
		case 'e': {
			char *end;
			errno = 0;
			unsigned long long v = optarg ? strtoull(optarg, &end, 10) : 8;
			if (optarg && (errno || *end || optarg[0] == '-' || v == 0 || v > 65536)) {
				fprintf(stderr,
				        "moe-sidecar stats: --experts '%s': expected experts per "
				        "layer (1..65536)\n",
				        optarg);
				return 2;
			}
			experts = (uint32_t)v;
			break;
		}
		case 'h': stats_usage(stdout); return 0;
		default: stats_usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "moe-sidecar stats: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (prometheus && (json || watch > 0 || experts)) {
		fprintf(stderr, "moe-sidecar stats: --prometheus prints one exposition: no --json, "
		                "--watch or --experts with it\n");
		return 2;
	}
	if (count && watch <= 0) {
		fprintf(stderr, "moe-sidecar stats: --count needs --watch\n");
		return 2;
	}
	char *buf = NULL;
	size_t cap = 0;
	struct watch_state w = {0};
	double last = 0;
	int status = 0;
	for (uint64_t sample = 1;; sample++) {
		if (fetch(path, json || experts ? MOE_STATS_EXPERTS : 0, &buf, &cap) != 0) {
			status = 1;
			break;
		}
		double t = monotonic_s();
		if (json) {
			printf("%s\n", buf);
		} else if (prometheus) {
			if (print_prometheus(buf) != 0) {
				status = 1;
				break;
			}
		} else {
			if (watch > 0 && last > 0)
				printf("\n");
			if (print_sample(buf, watch > 0 ? &w : NULL, last > 0 ? t - last : 0,
			                 experts) != 0) {
				status = 1;
				break;
			}
		}
		fflush(stdout);
		last = t;
		if (watch <= 0 || (count && sample >= count))
			break;
		struct timespec ts = {.tv_sec = (time_t)watch,
		                      .tv_nsec = (long)((watch - (double)(time_t)watch) * 1e9)};
		nanosleep(&ts, NULL);
	}
	stats_doc_free(&w.doc);
	free(buf);
	return status;
}
