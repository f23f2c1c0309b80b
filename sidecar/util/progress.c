/* progress.c — see progress.h. */
#include "progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static void format_amount(char *buf, size_t cap, const char *unit, double v)
{
	if (unit[0] == 'B' && unit[1] == '\0') {
		const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
		int i = 0;
		while (v >= 1024 && i < 4) {
			v /= 1024;
			i++;
		}
		snprintf(buf, cap, "%.1f %s", v, u[i]);
	} else {
		snprintf(buf, cap, "%.0f %s", v, unit);
	}
}

void progress_begin(struct progress *p, const char *label, uint64_t total, const char *unit)
{
	p->label = label;
	p->total = total ? total : 1;
	p->unit = unit;
	p->start_ns = monotonic_ns();
	p->last_draw_ns = 0;
	p->last_decile = -1;
	p->tty = isatty(STDERR_FILENO);
	p->log_sub = NULL;
}

void progress_begin_log(struct progress *p, const char *subsystem, const char *label,
                        uint64_t total, const char *unit)
{
	progress_begin(p, label, total, unit);
	p->log_sub = subsystem;
	p->tty = p->tty && !log_is_json() && log_enabled(LOG_INFO);
}

static void draw(struct progress *p, uint64_t done, uint64_t now, int final)
{
	double frac = (double)done / (double)p->total;
	if (frac > 1)
		frac = 1;
	double secs = (double)(now - p->start_ns) / 1e9;
	char amount[32], total[32], rate[32];
	format_amount(amount, sizeof(amount), p->unit, (double)done);
	format_amount(total, sizeof(total), p->unit, (double)p->total);
	format_amount(rate, sizeof(rate), p->unit, secs > 0 ? (double)done / secs : 0);
	/* The time left at the rate so far, while there is some left and a rate to go by. */
	char eta[32] = "";
	if (!final && done > 0 && done < p->total && secs > 0) {
		const double left = secs * (double)(p->total - done) / (double)done;
		if (left < 90)
			snprintf(eta, sizeof(eta), ", ETA %.0f s", left);
		else if (left < 5400)
			snprintf(eta, sizeof(eta), ", ETA %.0f min", left / 60);
		else
			snprintf(eta, sizeof(eta), ", ETA %.1f h", left / 3600);
	} else if (final) {
		snprintf(eta, sizeof(eta), " in %.1f s", secs);
	}
	if (p->log_sub && !p->tty) {
		log_event(LOG_INFO, p->log_sub, "%s: %.0f%% %s / %s, %s/s%s", p->label, frac * 100,
		          amount, total, rate, eta);
		return;
	}
	if (p->tty) {
		char bar[31];
		int filled = (int)(frac * 30);
		for (int i = 0; i < 30; i++)
			bar[i] = i < filled ? '#' : '.';
		bar[30] = '\0';
		fprintf(stderr, "\r%s [%s] %5.1f%% %s / %s, %s/s%s%s\033[K", p->label, bar,
		        frac * 100, amount, total, rate, eta, final ? "\n" : "");
	} else {
		fprintf(stderr, "%s: %3.0f%% %s / %s, %s/s%s\n", p->label, frac * 100, amount,
		        total, rate, eta);
	}
	fflush(stderr);
}

void progress_update(struct progress *p, uint64_t done)
{
	uint64_t now = monotonic_ns();
	if (p->tty) {
		if (now - p->last_draw_ns < 100000000u)
			return;
		p->last_draw_ns = now;
		draw(p, done, now, 0);
		return;
	}
	int decile = (int)(done * 10 / p->total);
	if (decile > p->last_decile && decile < 10) {
		p->last_decile = decile;
		draw(p, done, now, 0);
	}
}

void progress_end(struct progress *p)
{
	draw(p, p->total, monotonic_ns(), 1);
}
