/* log.c — see log.h. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "json_writer.h"

static _Atomic int min_level = LOG_INFO;
static _Atomic int as_json = 0;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(enum log_level level)
{
	atomic_store(&min_level, (int)level);
}

void log_set_json(int json)
{
	atomic_store(&as_json, json != 0);
}

int log_enabled(enum log_level level)
{
	return (int)level >= atomic_load_explicit(&min_level, memory_order_relaxed);
}

int log_is_json(void)
{
	return atomic_load_explicit(&as_json, memory_order_relaxed);
}

int log_level_parse(const char *name)
{
	for (int i = 0; i < 4; i++)
		if (!strcmp(name, level_names[i]))
			return i;
	return -1;
}

bool log_ratelimit_allow(struct log_ratelimit *rl, uint64_t now_ns, uint32_t *suppressed)
{
	uint64_t start = atomic_load_explicit(&rl->window_start_ns, memory_order_relaxed);
	if (now_ns - start >= LOG_RATELIMIT_WINDOW_NS &&
	    atomic_compare_exchange_strong(&rl->window_start_ns, &start, now_ns))
		atomic_store_explicit(&rl->in_window, 0, memory_order_relaxed);
	if (atomic_fetch_add_explicit(&rl->in_window, 1, memory_order_relaxed) >=
	    LOG_RATELIMIT_BURST) {
		atomic_fetch_add_explicit(&rl->suppressed, 1, memory_order_relaxed);
		return false;
	}
	*suppressed = atomic_exchange_explicit(&rl->suppressed, 0, memory_order_relaxed);
	return true;
}

/* line: room for a message escaped whole (at worst 6 bytes per byte) in JSON mode */
#define MSG_MAX 768
#define LINE_MAX_BYTES (6 * MSG_MAX + 256)

/* One line of `msg` into line[LINE_MAX_BYTES], newline included; its length, or -1. */
static int format_line(char *line, enum log_level level, const char *subsystem, const char *msg)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char when[40];
	size_t w = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(when + w, sizeof(when) - w, ".%03ldZ", ts.tv_nsec / 1000000);

	int n;
	if (atomic_load_explicit(&as_json, memory_order_relaxed)) {
		struct json_writer jw;
		jw_init_buffer(&jw, line, LINE_MAX_BYTES - 1); /* the last byte for the newline */
		jw_object_begin(&jw);
		jw_kv_string(&jw, "ts", when);
		jw_kv_string(&jw, "level", level_names[level]);
		jw_kv_string(&jw, "sub", subsystem);
		jw_kv_string(&jw, "msg", msg);
		jw_object_end(&jw);
		/* a cut line (a subsystem name of thousands of bytes) stays one line */
		size_t len = jw_length(&jw);
		if (len > LINE_MAX_BYTES - 2)
			len = LINE_MAX_BYTES - 2;
		line[len] = '\n';
		n = (int)len + 1;
	} else {
		n = snprintf(line, LINE_MAX_BYTES, "%s %-5s %-8s %s\n", when, level_names[level],
		             subsystem, msg);
	}
	if (n < 0)
		return -1;
	if (n >= LINE_MAX_BYTES) {
		n = LINE_MAX_BYTES - 1;
		line[n - 1] = '\n';
	}
	return n;
}

/* Lines whose write failed: since the last line that was written (said once, on the next
 * line that is), and since start (STATS). */
static _Atomic uint64_t dropped_unsaid, dropped_total;

/* One write(2) of the whole line, so that lines of different threads never interleave. */
static bool write_line(const char *line, int n)
{
	ssize_t rc;
	do
		rc = write(STDERR_FILENO, line, (size_t)n);
	while (rc < 0 && errno == EINTR);
	return rc == n;
}

void log_event(enum log_level level, const char *subsystem, const char *fmt, ...)
{
	if ((int)level < atomic_load_explicit(&min_level, memory_order_relaxed))
		return;
	const int saved_errno = errno; /* callers log, then look at errno */
	char msg[MSG_MAX], line[LINE_MAX_BYTES];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	const int n = format_line(line, level, subsystem, msg);
	/* A stream that is gone (a closed pipe: EPIPE, SIGPIPE being ignored) or full costs the
	 * line, never the process: it is counted, and the next line written says how many. */
	if (n > 0 && !write_line(line, n)) {
		atomic_fetch_add_explicit(&dropped_unsaid, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&dropped_total, 1, memory_order_relaxed);
	} else if (n > 0 && atomic_load_explicit(&dropped_unsaid, memory_order_relaxed)) {
		const uint64_t lost = atomic_exchange(&dropped_unsaid, 0);
		snprintf(msg, sizeof(msg),
		         "%llu log line(s) lost before this one: writing them to stderr failed",
		         (unsigned long long)lost);
		const int m = format_line(line, LOG_WARN, "log", msg);
		if (lost && m > 0 && !write_line(line, m))
			atomic_fetch_add(&dropped_unsaid, lost); /* still unsaid */
	}
	errno = saved_errno;
}

uint64_t log_lines_dropped(void)
{
	return atomic_load_explicit(&dropped_total, memory_order_relaxed);
}
