/* log.h — structured logs: one line per event, `ts level subsystem message key=value…`.
 *
 * For events, not for per-token or per-request paths (those feed counters). Thread-safe: a
 * line is formatted into a stack buffer and written with one write(2), so lines from
 * different threads never interleave. The level threshold is set once at start-up.
 * A line that cannot be written (stderr a closed pipe: the daemon ignores SIGPIPE, so the
 * write fails with EPIPE) is dropped and counted; the next line written is followed by a
 * warning saying how many were lost, and log_lines_dropped() gives the count since start.
 * log_event leaves errno as it found it.
 */
#ifndef MOE_LOG_H
#define MOE_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

/* Minimum level printed (default LOG_INFO); and whether lines are JSON objects. */
void log_set_level(enum log_level level);
void log_set_json(int json);
/* Parses "debug|info|warn|error"; returns -1 if unknown. */
int log_level_parse(const char *name);
/* Whether a line at `level` is printed; whether lines are JSON (for whoever writes progress
 * to the same stream). */
int log_enabled(enum log_level level);
int log_is_json(void);

void log_event(enum log_level level, const char *subsystem, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Lines dropped since start because writing them failed (STATS log_lines_dropped). */
uint64_t log_lines_dropped(void);

/* A budget of lines for one kind of event a peer can repeat at will (a refused connection, a
 * bad request): at most LOG_RATELIMIT_BURST lines per LOG_RATELIMIT_WINDOW_NS, the rest
 * counted, so that a flood neither fills the disk nor hides everything else. One per event
 * kind, zero-initialised; any thread (atomics: a line counted in a window that another thread
 * is just restarting may be lost from the count — it is a log budget, not an account). */
#define LOG_RATELIMIT_BURST 5u
#define LOG_RATELIMIT_WINDOW_NS 1000000000ull
struct log_ratelimit {
	_Atomic uint64_t window_start_ns;
	_Atomic uint32_t in_window;  /* lines logged in the current window */
	_Atomic uint32_t suppressed; /* events not logged since the last line */
};
/* May a line be logged at now_ns (CLOCK_MONOTONIC)? If so, *suppressed gets the events that
 * were not logged since the previous line (to say so in this one) and the count restarts. */
bool log_ratelimit_allow(struct log_ratelimit *rl, uint64_t now_ns, uint32_t *suppressed);

#define log_debug(sub, ...) log_event(LOG_DEBUG, sub, __VA_ARGS__)
#define log_info(sub, ...) log_event(LOG_INFO, sub, __VA_ARGS__)
#define log_warn(sub, ...) log_event(LOG_WARN, sub, __VA_ARGS__)
#define log_error(sub, ...) log_event(LOG_ERROR, sub, __VA_ARGS__)

#endif
