/* progress.h — a progress bar for long work (generating a model, warming the cache).
 *
 * Draws on stderr only when it is a terminal, at most ~10 times a second; otherwise prints
 * one line per 10% so logs and CI output stay readable. Begun with progress_begin_log, it is
 * part of a daemon's log instead: the lines are log events at info of that subsystem (so they
 * follow --log-level and --log-json), and the bar is drawn only on a terminal that gets plain
 * info lines. Single-threaded: update it from the thread that owns the work (or feed it an
 * atomic counter's value).
 */
#ifndef MOE_PROGRESS_H
#define MOE_PROGRESS_H

#include "clock.h"
#include <stdint.h>

struct progress {
	const char *label;
	uint64_t total;   /* units of work (bytes, experts, …) */
	const char *unit; /* "B" formats as bytes with MiB/s; anything else as counts */
	uint64_t start_ns, last_draw_ns;
	int last_decile;
	int tty;
	const char *log_sub; /* progress_begin_log: lines are log events of this subsystem */
};

void progress_begin(struct progress *p, const char *label, uint64_t total, const char *unit);
void progress_begin_log(struct progress *p, const char *subsystem, const char *label,
                        uint64_t total, const char *unit);
void progress_update(struct progress *p, uint64_t done);
void progress_end(struct progress *p); /* final line with totals and rate */

#endif
