/* probe.c — `moe-sidecar probe`: the page-cache counters of any files, live.
 *
 * Counts every process's reads of the watched files (not only the sidecar's), so an operator
 * can measure an mmap-based engine on the same model and compare it with the sidecar's
 * O_DIRECT loading. Each sample also shows cachestat(2)'s count of the file's resident pages,
 * a cross-check that needs no BPF. Samples are cumulative since the watch began; one is
 * printed at start, one every interval, and a last one on SIGINT/SIGTERM, after which the
 * pins are removed.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "commands.h"
#include "json_writer.h"
#include "pagecache.h"

#define PROBE_MAX_INTERVAL_S 86400.0

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

static void usage(FILE *to)
{
	fprintf(
	    to,
	    "usage: moe-sidecar probe --watch FILE... [--interval S] [--count N] [--json]\n"
	    "                         [--instance NAME] [--per-pid]\n\n"
	    "Counts page-cache fills, direct and buffered reads and mmap faults of FILEs by any\n"
	    "process (eBPF; needs root), with cachestat's resident bytes as a cross-check.\n\n"
	    "  --watch FILE...  files to watch (repeatable)\n"
	    "  --interval S     seconds between samples (default 1; fractions allowed)\n"
	    "  --count N        stop after N samples (default: until SIGINT/SIGTERM)\n"
	    "  --json           one JSON object per sample and line\n"
	    "  --instance NAME  pin under /sys/fs/bpf/moe-sidecar/NAME (default: probe)\n"
	    "  --per-pid        also count per process: a row (JSON: \"pids\") per reader\n");
}

/* Writes s as a JSON string literal. */
static const char *human_bytes(unsigned long long bytes, char *buf, size_t len)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)bytes;
	int u = 0;
	while (v >= 1024.0 && u < 5) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%lluB", bytes);
	else
		snprintf(buf, len, "%.1f%s", v, units[u]);
	return buf;
}

struct sample_row {
	const char *path; /* NULL for the totals row */
	struct pagecache_stats stats;
	struct pagecache_residency resident;
	bool has_resident;
};

/* The counters of one row as members of w's open object. */
static void write_json_counters(struct json_writer *w, const struct sample_row *row)
{
	const struct pagecache_counters *c = &row->stats.raw;
	jw_kv_u64(w, "pagecache_fill_bytes", c->pagecache_fill_bytes);
	jw_kv_u64(w, "pagecache_fill_events", c->pagecache_fill_events);
	jw_kv_u64(w, "direct_bytes", c->direct_bytes);
	jw_kv_u64(w, "direct_reads", c->direct_reads);
	jw_kv_u64(w, "direct_retries", c->direct_retries);
	jw_kv_u64(w, "buffered_bytes", c->buffered_bytes);
	jw_kv_u64(w, "buffered_reads", c->buffered_reads);
	jw_kv_u64(w, "get_pages_events", c->get_pages_events);
	jw_kv_u64(w, "fault_events", c->fault_events);
	jw_kv_u64(w, "map_pages_events", c->map_pages_events);
	jw_kv_u64(w, "uring_direct_bytes", c->uring_direct_bytes);
	jw_kv_u64(w, "uring_buffered_bytes", c->uring_buffered_bytes);
	jw_kv_u64(w, "uring_reads", c->uring_reads);
	jw_kv_u64(w, "uring_errors", c->uring_errors);
	jw_kv_u64(w, "fault_bytes", row->stats.fault_bytes);
	jw_kv_double(w, "bypass_ratio", row->stats.bypass_ratio, 6);
	if (row->has_resident) {
		jw_kv_u64(w, "resident_bytes", row->resident.cached_bytes);
		jw_kv_u64(w, "dirty_bytes", row->resident.dirty_bytes);
	}
}

static void print_table_row(const struct sample_row *row)
{
	const struct pagecache_counters *c = &row->stats.raw;
	char fill[16], direct[16], buffered[16], resident[16], ratio[16];
	if (isnan(row->stats.bypass_ratio))
		snprintf(ratio, sizeof(ratio), "-");
	else
		snprintf(ratio, sizeof(ratio), "%.1f%%", 100.0 * row->stats.bypass_ratio);
	if (row->has_resident)
		human_bytes(row->resident.cached_bytes, resident, sizeof(resident));
	else
		snprintf(resident, sizeof(resident), "-");
	printf("%-40s %10s %10s %10s %8llu %8llu %8llu %7s %10s\n", row->path ? row->path : "total",
	       human_bytes(c->pagecache_fill_bytes, fill, 16),
	       human_bytes(c->direct_bytes, direct, 16),
	       human_bytes(c->buffered_bytes, buffered, 16), (unsigned long long)c->fault_events,
	       (unsigned long long)c->map_pages_events, (unsigned long long)c->uring_reads, ratio,
	       resident);
}

#define PROBE_MAX_PIDS_SHOWN 64

/* The command name of a process, or "?" once it has gone. */
static const char *comm_of(__u32 pid, char *buf, size_t len)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%u/comm", pid);
	FILE *f = fopen(path, "re");
	if (!f || !fgets(buf, (int)len, f))
		snprintf(buf, len, "?");
	if (f)
		fclose(f);
	buf[strcspn(buf, "\n")] = '\0';
	return buf;
}

/* With --per-pid: one row (table, w NULL) or a "pids" member of w's open object (JSON) per
 * process that touched path. */
static void print_pid_rows(struct pagecache_probes *p, const char *path, struct json_writer *w)
{
	__u32 tgids[PROBE_MAX_PIDS_SHOWN];
	size_t n = 0;
	if (pagecache_list_pids(p, path, tgids, PROBE_MAX_PIDS_SHOWN, &n) < 0)
		n = 0;
	if (w) {
		jw_key(w, "pids");
		jw_array_begin(w);
	}
	for (size_t i = 0; i < n; i++) {
		struct sample_row row = {0};
		if (pagecache_read_pid(p, path, tgids[i], &row.stats) < 0)
			continue; /* evicted from the LRU map since the listing */
		char comm[64], label[96];
		comm_of(tgids[i], comm, sizeof(comm));
		if (w) {
			jw_object_begin(w);
			jw_kv_u64(w, "pid", tgids[i]);
			jw_kv_string(w, "comm", comm);
			write_json_counters(w, &row);
			jw_object_end(w);
		} else {
			snprintf(label, sizeof(label), "  pid %u (%s)", tgids[i], comm);
			row.path = label;
			print_table_row(&row);
		}
	}
	if (w)
		jw_array_end(w);
}

/* Reads and prints one sample of every watched file and the totals. */
static int print_sample(struct pagecache_probes *p, char **files, int n_files, double t, bool json,
                        bool per_pid)
{
	struct sample_row total = {0};
	struct json_writer jw, *w = json ? &jw : NULL;
	if (w) {
		jw_init_file(w, stdout);
		jw_object_begin(w);
		jw_kv_double(w, "t", t, 3);
		jw_key(w, "files");
		jw_array_begin(w);
	} else
		printf("# t=%.1fs  %s\n%-40s %10s %10s %10s %8s %8s %8s %7s %10s\n", t,
		       pagecache_status(p), "file", "fill", "direct", "buffered", "faults",
		       "map_pg", "uring", "bypass", "resident");
	for (int i = 0; i < n_files; i++) {
		struct sample_row row = {.path = files[i]};
		if (pagecache_read_file(p, files[i], &row.stats) < 0) {
			fprintf(stderr, "moe-sidecar probe: %s\n", pagecache_last_error(p));
			return -1;
		}
		struct sidecar_error err = {0};
		row.has_resident = pagecache_residency_of(files[i], &row.resident, &err) == 0;
		if (row.has_resident) {
			total.resident.cached_bytes += row.resident.cached_bytes;
			total.resident.dirty_bytes += row.resident.dirty_bytes;
			total.has_resident = true;
		}
		if (w) {
			jw_object_begin(w);
			jw_kv_string(w, "path", files[i]);
			write_json_counters(w, &row);
			if (per_pid)
				print_pid_rows(p, files[i], w);
			jw_object_end(w);
		} else {
			print_table_row(&row);
			if (per_pid)
				print_pid_rows(p, files[i], NULL);
		}
	}
	pagecache_read_totals(p, &total.stats);
	if (w) {
		jw_array_end(w);
		jw_key(w, "totals");
		jw_object_begin(w);
		write_json_counters(w, &total);
		jw_object_end(w);
		jw_object_end(w);
		const int rc = jw_finish_line(w);
		if (rc != 0) {
			fprintf(stderr, "moe-sidecar probe: writing the JSON: %s\n", strerror(-rc));
			return -1;
		}
	} else {
		print_table_row(&total);
		printf("\n");
	}
	fflush(stdout);
	return 0;
}

/* Sleeps s seconds, waking early when a stop signal arrives. */
static void sleep_interruptibly(double s)
{
	struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - floor(s)) * 1e9)};
	while (!stop_requested && nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int cmd_probe(int argc, char **argv)
{
	char **files = calloc((size_t)argc, sizeof(*files));
	if (!files) {
		fprintf(stderr, "moe-sidecar probe: out of memory\n");
		return 1;
	}
	int n_files = 0, rc = 2;
	double interval = 1.0;
	long long count = -1;
	bool json = false, per_pid = false;
	const char *instance = "probe";
	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];
		if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
			usage(stdout);
			rc = 0;
			goto out;
		} else if (!strcmp(arg, "--watch")) {
			if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2)) {
				fprintf(stderr,
				        "moe-sidecar probe: --watch needs at least one FILE\n");
				goto out;
			}
			while (i + 1 < argc && strncmp(argv[i + 1], "--", 2))
				files[n_files++] = argv[++i];
		} else if (!strcmp(arg, "--interval") || !strcmp(arg, "--count") ||
		           !strcmp(arg, "--instance")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "moe-sidecar probe: %s needs a value\n", arg);
				goto out;
			}
			const char *value = argv[++i];
			char *end;
			errno = 0;
			if (!strcmp(arg, "--instance")) {
				instance = value;
			} else if (!strcmp(arg, "--interval")) {
				interval = strtod(value, &end);
				if (errno || end == value || *end || !(interval > 0) ||
				    interval > PROBE_MAX_INTERVAL_S) {
					fprintf(
					    stderr,
					    "moe-sidecar probe: --interval '%s': want seconds in "
					    "(0, %.0f]\n",
					    value, PROBE_MAX_INTERVAL_S);
					goto out;
				}
			} else {
				count = strtoll(value, &end, 10);
				if (errno || end == value || *end || count < 1) {
					fprintf(stderr,
					        "moe-sidecar probe: --count '%s': want a positive "
					        "integer\n",
					        value);
					goto out;
				}
			}
		} else if (!strcmp(arg, "--json")) {
			json = true;
		} else if (!strcmp(arg, "--per-pid")) {
			per_pid = true;
		} else {
			fprintf(stderr, "moe-sidecar probe: unknown option '%s'\n\n", arg);
			usage(stderr);
			goto out;
		}
	}
	if (n_files == 0) {
		fprintf(stderr, "moe-sidecar probe: nothing to watch (--watch FILE...)\n\n");
		usage(stderr);
		goto out;
	}

	struct sidecar_error err = {0};
	for (int i = 0; i < n_files; i++) { /* a typo should not cost a BPF load */
		struct pagecache_file_key key;
		if (pagecache_file_key_of(files[i], &key, &err) < 0) {
			fprintf(stderr, "moe-sidecar probe: %s\n", err.msg);
			goto out;
		}
	}
	struct pagecache_probes *p;
	struct pagecache_options opt = {.instance = instance, .per_pid = per_pid, .quiet = true};
	if (pagecache_open(&opt, &p, &err) < 0) {
		fprintf(stderr, "moe-sidecar probe: %s\n", err.msg);
		goto out;
	}
	if (!pagecache_available(p)) {
		fprintf(stderr, "moe-sidecar probe: page-cache probes %s\n", pagecache_status(p));
		pagecache_close(p);
		rc = 1;
		goto out;
	}
	for (int i = 0; i < n_files; i++) {
		if (pagecache_watch(p, files[i]) < 0) {
			fprintf(stderr, "moe-sidecar probe: %s\n", pagecache_last_error(p));
			pagecache_close(p);
			goto out;
		}
	}

	struct sigaction sa = {.sa_handler = on_stop_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	rc = 0;
	double start = monotonic_s();
	for (long long sample = 0; count < 0 || sample < count; sample++) {
		if (sample > 0)
			sleep_interruptibly(interval);
		if (print_sample(p, files, n_files, monotonic_s() - start, json, per_pid) < 0) {
			rc = 1;
			break;
		}
		if (stop_requested)
			break;
	}
	pagecache_close(p);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
out:
	free(files);
	return rc;
}
