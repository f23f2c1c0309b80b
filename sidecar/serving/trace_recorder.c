/* trace_recorder.c — the routing served, into a trace file (contract in trace_recorder.h).
 *
 * The ring has one consumer (the writer) and two producers taking turns under a spin flag (the
 * thread executing FORWARDs, the dispatcher answering PREFETCHes): free-running 64-bit byte
 * counters, the producers' tail published with release, the consumer's head with release,
 * each side reading the other's with acquire. A record is a header and its ids and weights,
 * copied in and out with wrap-around; a record with k = 0 is a drop marker (n_tokens =
 * FORWARDs dropped before it); a prefetch record is k ids and no weights.
 */
#include "trace_recorder.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "trace.h"

#define RING_MIN_BYTES (4u << 20)
#define RING_MAX_BYTES (256u << 20)
#define WRITER_POLL_MS 50
#define OUT_BYTES (64u << 10) /* whole lines between writes */

struct record_header {
	uint32_t layer, n_tokens, k;
	uint32_t prefetch; /* 1: k expert ids the sidecar started loading, no weights */
};

struct trace_recorder {
	struct trace_recorder_config cfg;
	int fd; /* the recorder's own duplicate of cfg.fd */
	char path[256];
	/* The ring. */
	uint8_t *ring;
	uint64_t cap;
	_Atomic uint64_t head, tail;
	uint64_t pending_drops; /* producer only: dropped since its last marker */
	/* Two producers (the forward thread's FORWARDs, the dispatcher's PREFETCHes) take turns
	 * appending: a spin over a memcpy, never across a system call but the writer's wake. */
	atomic_flag producer;
	/* Writer. */
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool stop;
	uint8_t *scratch; /* one record */
	uint32_t *line_ids;
	float *line_scores;
	uint32_t step, last_layer;
	bool started;
	/* Whole lines formatted, not yet in the file; the file holds `written` bytes, always
	 * the end of a whole line. */
	char *out;
	size_t out_len;
	uint64_t out_lines; /* trace lines among them (drop markers are comments) */
	uint64_t written;
	/* Stats (writer writes, anyone reads): lines and bytes that reached the file. */
	_Atomic uint64_t lines, bytes, dropped;
	_Atomic int stopped;
};

static uint64_t record_bytes(uint32_t n_tokens, uint32_t k)
{
	return sizeof(struct record_header) + (uint64_t)n_tokens * k * (sizeof(int32_t) + 4);
}

static uint64_t header_record_bytes(const struct record_header *h)
{
	if (!h->k)
		return sizeof(*h);
	return h->prefetch ? sizeof(*h) + (uint64_t)h->k * sizeof(uint32_t)
	                   : record_bytes(h->n_tokens, h->k);
}

static void ring_put(struct trace_recorder *t, uint64_t at, const void *src, size_t n)
{
	const size_t off = (size_t)(at % t->cap);
	const size_t first = n < t->cap - off ? n : (size_t)(t->cap - off);
	memcpy(t->ring + off, src, first);
	memcpy(t->ring, (const uint8_t *)src + first, n - first);
}

static void ring_get(const struct trace_recorder *t, uint64_t at, void *dst, size_t n)
{
	const size_t off = (size_t)(at % t->cap);
	const size_t first = n < t->cap - off ? n : (size_t)(t->cap - off);
	memcpy(dst, t->ring + off, first);
	memcpy((uint8_t *)dst + first, t->ring, n - first);
}

/* Appends one record (weights NULL: a prefetch record of k ids), or counts it dropped. */
static void ring_add_locked(struct trace_recorder *t, uint32_t layer, uint32_t n_tokens, uint32_t k,
                            const void *ids, const float *weights)
{
	if (atomic_load_explicit(&t->stopped, memory_order_relaxed)) {
		atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed);
		return;
	}
	const struct record_header h = {
	    .layer = layer, .n_tokens = n_tokens, .k = k, .prefetch = weights == NULL};
	const uint64_t size = header_record_bytes(&h);
	const uint64_t marker = t->pending_drops ? sizeof(struct record_header) : 0;
	const uint64_t tail = atomic_load_explicit(&t->tail, memory_order_relaxed);
	const uint64_t used = tail - atomic_load_explicit(&t->head, memory_order_acquire);
	if (size + marker > t->cap - used) {
		t->pending_drops++;
		atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed);
		return;
	}
	uint64_t at = tail;
	if (marker) {
		const struct record_header m = {.layer = 0, .n_tokens = (uint32_t)t->pending_drops};
		ring_put(t, at, &m, sizeof(m));
		at += sizeof(m);
		t->pending_drops = 0;
	}
	const size_t n = (size_t)n_tokens * k;
	ring_put(t, at, &h, sizeof(h));
	ring_put(t, at + sizeof(h), ids, n * sizeof(int32_t));
	if (weights)
		ring_put(t, at + sizeof(h) + n * sizeof(int32_t), weights, n * sizeof(float));
	atomic_store_explicit(&t->tail, at + size, memory_order_release);
	if (at + size - atomic_load_explicit(&t->head, memory_order_relaxed) > t->cap / 4)
		pthread_cond_signal(&t->wake); /* the writer also polls: a lost signal only waits */
}

static void ring_add(struct trace_recorder *t, uint32_t layer, uint32_t n_tokens, uint32_t k,
                     const void *ids, const float *weights)
{
	while (atomic_flag_test_and_set_explicit(&t->producer, memory_order_acquire))
		;
	ring_add_locked(t, layer, n_tokens, k, ids, weights);
	atomic_flag_clear_explicit(&t->producer, memory_order_release);
}

void trace_recorder_add(struct trace_recorder *t, uint32_t layer, uint32_t n_tokens, uint32_t k,
                        const int32_t *ids, const float *weights)
{
	if (t && n_tokens && k)
		ring_add(t, layer, n_tokens, k, ids, weights);
}

void trace_recorder_add_prefetch(struct trace_recorder *t, uint32_t layer, const uint32_t *ids,
                                 uint32_t n)
{
	for (uint32_t at = 0; t && at < n; at += TRACE_MAX_TOPK)
		ring_add(t, layer, 1, n - at < TRACE_MAX_TOPK ? n - at : TRACE_MAX_TOPK, ids + at,
		         NULL);
}

/* Stops recording with one log line. Writer thread. */
static void stop_recording(struct trace_recorder *t, const char *why)
{
	if (atomic_exchange_explicit(&t->stopped, 1, memory_order_relaxed))
		return;
	log_warn("trace", "%s: %s: recording stopped after %llu lines (%llu bytes)", t->path, why,
	         (unsigned long long)atomic_load_explicit(&t->lines, memory_order_relaxed),
	         (unsigned long long)atomic_load_explicit(&t->bytes, memory_order_relaxed));
}

/* All n bytes at offset `at`: 0, or the errno of the failed write (a full disk: ENOSPC,
 * EFBIG, EIO) with *done the bytes that went in before it. */
static int write_all(int fd, const char *buf, size_t n, uint64_t at, size_t *done)
{
	for (*done = 0; *done < n;) {
		const ssize_t w = pwrite(fd, buf + *done, n - *done, (off_t)(at + *done));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? errno : EIO;
		*done += (size_t)w;
	}
	return 0;
}

/* The whole lines at the start of buf[0, n): their length, and in *lines how many are trace
 * lines (not '#' comments). */
static size_t whole_lines(const char *buf, size_t n, uint64_t *lines)
{
	size_t len = 0;
	*lines = 0;
	for (const char *nl; len < n && (nl = memchr(buf + len, '\n', n - len));) {
		*lines += buf[len] != '#';
		len = (size_t)(nl - buf) + 1;
	}
	return len;
}

/* Writes the buffered lines after the last whole one. On an error the file is cut back to
 * the end of the last whole line that went in (a full disk leaves whole lines, never "17:0"
 * for "17:0.3125") and the recording stops. Writer thread. */
static void flush_out(struct trace_recorder *t)
{
	if (!t->out_len)
		return;
	size_t done;
	const int e = write_all(t->fd, t->out, t->out_len, t->written, &done);
	uint64_t lines = t->out_lines;
	const size_t keep = e ? whole_lines(t->out, done, &lines) : t->out_len;
	char why[256] = "";
	if (e && ftruncate(t->fd, (off_t)(t->written + keep)) != 0) {
		snprintf(why, sizeof(why),
		         "write failed (%s), and cutting it back to its last whole line at byte "
		         "%llu failed too (%s): its last line is cut",
		         strerror(e), (unsigned long long)(t->written + keep), strerror(errno));
		t->written += done; /* what the file holds */
	} else {
		if (e)
			snprintf(why, sizeof(why),
			         "write failed (%s); cut back to its last whole line at byte %llu",
			         strerror(e), (unsigned long long)(t->written + keep));
		t->written += keep;
	}
	atomic_store_explicit(&t->bytes, t->written, memory_order_relaxed);
	atomic_fetch_add_explicit(&t->lines, lines, memory_order_relaxed);
	t->out_len = 0;
	t->out_lines = 0;
	if (e)
		stop_recording(t, why);
}

/* Room for one more line at t->out + t->out_len (TRACE_LINE_MAX bytes), or NULL when
 * recording has stopped. */
static char *line_room(struct trace_recorder *t)
{
	if (OUT_BYTES - t->out_len < TRACE_LINE_MAX)
		flush_out(t);
	return atomic_load_explicit(&t->stopped, memory_order_relaxed) ? NULL : t->out + t->out_len;
}

/* Keeps the n bytes just formatted into line_room, unless they would take the file past the
 * cap (then recording stops: the file ends with the last line that fits). */
static void keep_line(struct trace_recorder *t, int n, bool line)
{
	if (n < 0) {
		stop_recording(t, "a line did not fit its buffer");
		return;
	}
	if (t->written + t->out_len + (uint64_t)n > t->cfg.max_bytes) {
		char why[96];
		snprintf(why, sizeof(why), "reached --record-trace-max-mib %llu MiB",
		         (unsigned long long)(t->cfg.max_bytes >> 20));
		stop_recording(t, why);
		return;
	}
	t->out_len += (size_t)n;
	t->out_lines += line;
}

static void write_record(struct trace_recorder *t, const struct record_header *h)
{
	char *at;
	if (h->k == 0) {
		if ((at = line_room(t)))
			keep_line(
			    t,
			    snprintf(at, TRACE_LINE_MAX,
			             "# %u FORWARD(s) not recorded here: the writer fell behind\n",
			             h->n_tokens),
			    false);
		return;
	}
	if (h->prefetch) { /* "p LAYER IDS", TRACE_MAX_TOPK ids a line */
		const uint32_t *pf = (const uint32_t *)(t->scratch + sizeof(*h));
		if ((at = line_room(t)))
			keep_line(t, trace_format_prefetch(at, TRACE_LINE_MAX, h->layer, pf, h->k),
			          true);
		return;
	}
	const size_t n = (size_t)h->n_tokens * h->k;
	const int32_t *ids = (const int32_t *)(t->scratch + sizeof(*h));
	const float *w = (const float *)(t->scratch + sizeof(*h) + n * sizeof(int32_t));
	uint32_t base;
	if (h->n_tokens == 1 && t->started && h->layer > t->last_layer)
		base = t->step;
	else
		base = t->started ? t->step + 1 : 0;
	t->started = true;
	t->step = base + h->n_tokens - 1;
	t->last_layer = h->layer;
	for (uint32_t r = 0; r < h->n_tokens; r++) {
		uint32_t count = 0;
		double sum = 0;
		for (uint32_t j = 0; j < h->k; j++) {
			const int32_t id = ids[(size_t)r * h->k + j];
			if (id < 0 || (uint32_t)id >= t->cfg.n_experts || count >= t->cfg.top_k)
				continue;
			t->line_ids[count] = (uint32_t)id;
			t->line_scores[count] = w[(size_t)r * h->k + j];
			sum += isfinite(t->line_scores[count]) ? fabs(t->line_scores[count]) : 0;
			count++;
		}
		if (!count)
			continue;
		for (uint32_t j = 0; j < count; j++) {
			float s = sum > 0 && isfinite(t->line_scores[j])
			              ? (float)(t->line_scores[j] / sum)
			              : 1.0f / (float)count;
			t->line_scores[j] = s < 0 ? 0 : s > 1 ? 1 : s;
		}
		if (!(at = line_room(t)))
			return;
		keep_line(t,
		          trace_format_line(at, TRACE_LINE_MAX, base + r, h->layer, t->line_ids,
		                            t->line_scores, count),
		          true);
	}
}

/* Writes every record queued now. Writer thread. */
static void drain(struct trace_recorder *t)
{
	uint64_t head = atomic_load_explicit(&t->head, memory_order_relaxed);
	const uint64_t tail = atomic_load_explicit(&t->tail, memory_order_acquire);
	while (head != tail) {
		struct record_header h;
		ring_get(t, head, &h, sizeof(h));
		const uint64_t size = header_record_bytes(&h);
		ring_get(t, head, t->scratch, (size_t)size);
		head += size;
		atomic_store_explicit(&t->head, head, memory_order_release);
		if (!atomic_load_explicit(&t->stopped, memory_order_relaxed))
			write_record(t, &h);
	}
	flush_out(t); /* what is below the cap, after a stop at the cap too */
}

static void *writer_main(void *arg)
{
	struct trace_recorder *t = arg;
	pthread_mutex_lock(&t->lock);
	while (!t->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += WRITER_POLL_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (atomic_load_explicit(&t->head, memory_order_relaxed) ==
		    atomic_load_explicit(&t->tail, memory_order_acquire))
			pthread_cond_timedwait(&t->wake, &t->lock, &ts);
		pthread_mutex_unlock(&t->lock);
		drain(t);
		pthread_mutex_lock(&t->lock);
	}
	pthread_mutex_unlock(&t->lock);
	drain(t);
	return NULL;
}

/* "a FIFO", "a directory", …: what a path that is not a regular file is. */
static const char *file_kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG: return "a regular file";
	case S_IFDIR: return "a directory";
	case S_IFIFO: return "a FIFO";
	case S_IFSOCK: return "a socket";
	case S_IFCHR: return "a character device";
	case S_IFBLK: return "a block device";
	case S_IFLNK: return "a symbolic link";
	default: return "not a regular file";
	}
}

int trace_recorder_open(const char *path, struct sidecar_error *err)
{
	/* O_NOFOLLOW: a link planted at the path (to a root-owned file, or dangling so that
	 * O_CREAT would make its target) is refused, never written through. O_NONBLOCK: a FIFO
	 * without a reader fails with ENXIO instead of blocking the start. */
	const int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
	if (fd < 0) {
		const int e = errno;
		struct stat st;
		if (e == ELOOP)
			return error_set(
			    err, MOE_EINVAL,
			    "--record-trace %s: is a symbolic link; refusing to follow it", path);
		if ((e == EISDIR || e == ENXIO || e == EOPNOTSUPP) && lstat(path, &st) == 0)
			return error_set(err, MOE_EINVAL,
			                 "--record-trace %s: is %s; a trace must be a regular file",
			                 path, file_kind(st.st_mode));
		return error_set(err, error_status_from_errno(e), "--record-trace %s: %s%s", path,
		                 strerror(e), e == ENOENT ? " (is its directory there?)" : "");
	}
	struct stat st;
	char why[160] = "";
	if (fstat(fd, &st) != 0) {
		error_set_errno(err, "--record-trace %s: fstat", path);
		goto fail;
	}
	if (!S_ISREG(st.st_mode))
		snprintf(why, sizeof(why), "is %s; a trace must be a regular file",
		         file_kind(st.st_mode));
	else if (st.st_nlink > 1)
		snprintf(why, sizeof(why),
		         "has %llu hard links; refusing to overwrite a file reachable by another "
		         "name",
		         (unsigned long long)st.st_nlink);
	else if (st.st_uid != geteuid())
		snprintf(why, sizeof(why),
		         "is owned by uid %u, not by this sidecar's uid %u; refusing to overwrite "
		         "it (remove it, or record elsewhere)",
		         (unsigned)st.st_uid, (unsigned)geteuid());
	if (why[0]) {
		error_set(err, MOE_EINVAL, "--record-trace %s: %s", path, why);
		goto fail;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		if (errno == EWOULDBLOCK)
			error_set(err, MOE_EINVAL,
			          "--record-trace %s: another process is recording into it", path);
		else
			error_set_errno(err, "--record-trace %s: flock", path);
		goto fail;
	}
	const int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
		error_set_errno(err, "--record-trace %s: fcntl", path);
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return -1;
}

/* The recorder's buffers and the recorder itself (its thread and descriptor are the caller's). */
static void free_recorder(struct trace_recorder *t)
{
	free(t->out);
	free(t->ring);
	free(t->scratch);
	free(t->line_ids);
	free(t->line_scores);
	free(t);
}

int trace_recorder_create(const struct trace_recorder_config *cfg, struct trace_recorder **out,
                          struct sidecar_error *err)
{
	*out = NULL;
	if (!cfg->n_layers || !cfg->n_experts || !cfg->top_k || !cfg->max_tokens)
		return error_set(err, MOE_EINVAL, "--record-trace: the model has no MoE layers");
	struct trace_recorder *t = calloc(1, sizeof(*t));
	if (!t)
		return error_set(err, MOE_ENOMEM, "--record-trace: out of memory");
	t->cfg = *cfg;
	snprintf(t->path, sizeof(t->path), "%s", cfg->path);
	uint64_t largest = record_bytes(cfg->max_tokens, cfg->top_k) + sizeof(struct record_header);
	if (largest < sizeof(struct record_header) + TRACE_MAX_TOPK * sizeof(uint32_t))
		largest = sizeof(struct record_header) + TRACE_MAX_TOPK * sizeof(uint32_t);
	t->cap = 2 * largest > RING_MIN_BYTES ? 2 * largest : RING_MIN_BYTES;
	if (t->cap > RING_MAX_BYTES)
		t->cap = RING_MAX_BYTES; /* larger FORWARDs than half of it are dropped, counted */
	t->ring = malloc(t->cap);
	t->scratch = malloc(largest < t->cap ? largest : t->cap);
	t->line_ids = malloc(cfg->top_k * sizeof(uint32_t));
	t->line_scores = malloc(cfg->top_k * sizeof(float));
	t->out = malloc(OUT_BYTES);
	t->fd = -1;
	if (!t->ring || !t->scratch || !t->line_ids || !t->line_scores || !t->out) {
		error_set(err, MOE_ENOMEM, "--record-trace: out of memory for a %llu-byte buffer",
		          (unsigned long long)t->cap);
		goto fail;
	}
	t->fd = fcntl(cfg->fd, F_DUPFD_CLOEXEC, 0);
	if (t->fd < 0) {
		error_set_errno(err, "--record-trace %s: dup", cfg->path);
		goto fail;
	}
	if (ftruncate(t->fd, 0) != 0) {
		error_set_errno(err, "--record-trace %s: truncating", cfg->path);
		goto fail;
	}
	const int head =
	    trace_format_header(t->out, OUT_BYTES, cfg->n_layers, cfg->n_experts, cfg->top_k);
	assert(head > 0);
	const int note = snprintf(t->out + head, OUT_BYTES - (size_t)head,
	                          "# recorded by moe-sidecar serve: steps in the order served, "
	                          "scores = weight / the token's sum of weights\n");
	assert(note > 0 && (size_t)(head + note) < OUT_BYTES);
	t->out_len = (size_t)(head + note);
	size_t done;
	const int e = write_all(t->fd, t->out, t->out_len, 0, &done);
	if (e) {
		const int cut = ftruncate(t->fd, 0) == 0 ? 0 : errno; /* told in the same line */
		error_set(err, error_status_from_errno(e),
		          "--record-trace %s: writing the header: %s%s%s", cfg->path, strerror(e),
		          cut ? "; cutting back the partial header failed too: " : "",
		          cut ? strerror(cut) : "");
		goto fail;
	}
	t->written = t->out_len;
	t->out_len = 0;
	atomic_store(&t->bytes, t->written);
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->wake, NULL);
	int rc = pthread_create(&t->thread, NULL, writer_main, t);
	if (rc != 0) {
		error_set(err, error_status_from_errno(rc), "--record-trace: writer thread: %s",
		          strerror(rc));
		pthread_mutex_destroy(&t->lock);
		pthread_cond_destroy(&t->wake);
		goto fail;
	}
	log_info("trace", "recording the routing served to %s (at most %llu MiB; buffer %llu KiB)",
	         cfg->path, (unsigned long long)(cfg->max_bytes >> 20),
	         (unsigned long long)(t->cap >> 10));
	*out = t;
	return 0;
fail:
	if (t->fd >= 0)
		close(t->fd);
	free_recorder(t);
	return -1;
}

void trace_recorder_destroy(struct trace_recorder *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	t->stop = true;
	pthread_cond_signal(&t->wake);
	pthread_mutex_unlock(&t->lock);
	pthread_join(t->thread, NULL);
	if (close(t->fd) != 0)
		log_warn("trace", "%s: closing: %s", t->path, strerror(errno));
	log_info("trace", "%s: %llu lines, %llu bytes, %llu FORWARDs not recorded", t->path,
	         (unsigned long long)atomic_load(&t->lines),
	         (unsigned long long)atomic_load(&t->bytes),
	         (unsigned long long)atomic_load(&t->dropped));
	pthread_mutex_destroy(&t->lock);
	pthread_cond_destroy(&t->wake);
	free_recorder(t);
}

void trace_recorder_stats(const struct trace_recorder *t, struct trace_recorder_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!t)
		return;
	out->lines = atomic_load_explicit(&t->lines, memory_order_relaxed);
	out->bytes = atomic_load_explicit(&t->bytes, memory_order_relaxed);
	out->dropped = atomic_load_explicit(&t->dropped, memory_order_relaxed);
	out->ring_bytes = t->cap;
	out->stopped = atomic_load_explicit(&t->stopped, memory_order_relaxed);
}
