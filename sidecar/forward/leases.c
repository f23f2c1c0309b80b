/* leases.c — expert leases: experts pinned in a shared slot pool for another process to read
 * (forward.h, "Expert leases").
 *
 * A lease is a held expert (weights_demand: a reader reference on its slot, so the residency
 * never evicts it) that outlives any request: the table keeps it until it is released, or the
 * table is destroyed (the channel closed, its client dead). What the lessee learns is where
 * the expert's matrices lie in the pool's memfd, which it maps read-only: offsets from the
 * mapping's base, never a pointer.
 *
 * Waiting: a cold lease is demanded without waiting and then polled (LEASE_POLL_NS) until it
 * is held or the deadline passes: the residency's own waits have no deadline, and a lease
 * waits on the forward thread, which must come back to serve FORWARDs.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "forward_internal.h"
#include "moe_abi.h"
#include "moe_kernels.h"

#define LEASE_POLL_NS 50000u /* 50 µs between looks at a cold lease's load */

struct lease_entry {
	struct held_expert h;
	uint64_t bytes;  /* the slot's bytes: what the lease pins */
	uint64_t staged; /* bytes of the staging area it took (BF16 form), 0: none */
	int32_t layer;
	uint32_t generation; /* of the id handed out: id = generation << 16 | index */
	bool used;
};

/* The BF16 form's job: the lease's matrices (3 per expert), each cut into items of
 * STAGE_ROWS rows (stage_item). */
#define STAGE_ROWS 64u /* 8 groups of the decode layout */
#define STAGE_MAX_MATRICES (256u * 3u)
struct stage_job {
	const struct moek_matrix *m[STAGE_MAX_MATRICES];
	uint16_t *dst[STAGE_MAX_MATRICES];
	uint32_t first[STAGE_MAX_MATRICES + 1]; /* matrix i's items: [first[i], first[i + 1]) */
	uint32_t n;
	size_t rows_bytes, cols, per_worker;
	uint8_t *scratch;
	atomic_bool failed;
};

struct forward_leases {
	struct forward_engine *e;
	const uint8_t *base; /* the pool's mapping here */
	uint64_t pool_bytes;
	uint32_t cap, held;
	uint64_t bytes, max_bytes;
	struct lease_entry *entry;
	/* The BF16 form: the staging area (the caller's shared mapping), filled from its start;
	 * the top falls back to 0 once no lease holds a part of it. Scratch: per worker, one
	 * matrix's group of rows and one row in f32; the lease's job. */
	uint8_t *staging;
	uint64_t staging_bytes, staging_top, staging_held;
	uint8_t *scratch;
	size_t scratch_bytes;
	struct stage_job job;
};

int forward_lease_pool(struct forward_engine *e, int *fd, uint64_t *bytes, char *why, size_t len)
{
	const uint8_t *base;
	if (e->w.source != FORWARD_SOURCE_RESIDENCY) {
		snprintf(why, len, "experts are not served from a slot pool (source %s)",
		         e->w.source == FORWARD_SOURCE_MMAP ? "mmap" : "all-resident");
		return -1;
	}
	if (!e->w.res || residency_shared_pool(e->w.res, fd, &base, bytes) != 0) {
		snprintf(why, len,
		         e->w.n_res > 1 ? "the experts are split over %u NUMA nodes' pools"
		                        : "the slot pool is private (serve --leases shares it)",
		         e->w.n_res);
		return -1;
	}
	return 0;
}

int forward_leases_create(struct forward_engine *e, uint32_t cap, uint64_t max_bytes, void *staging,
                          uint64_t staging_bytes, struct forward_leases **out)
{
	struct forward_leases *t = calloc(1, sizeof(*t));
	if (!t)
		return -1;
	int fd;
	char why[160];
	if (forward_lease_pool(e, &fd, &t->pool_bytes, why, sizeof(why)) != 0 ||
	    residency_shared_pool(e->w.res, &fd, &t->base, &t->pool_bytes) != 0 || cap == 0 ||
	    cap > 65536u) {
		free(t);
		return -1;
	}
	t->entry = calloc(cap, sizeof(*t->entry));
	if (!t->entry) {
		free(t);
		return -1;
	}
	t->e = e;
	t->cap = cap;
	t->max_bytes = max_bytes;
	t->staging = staging;
	t->staging_bytes = staging ? staging_bytes : 0;
	*out = t;
	return 0;
}

static void entry_release(struct forward_leases *t, struct lease_entry *le)
{
	weights_release_layer(&t->e->w, &le->h, NULL, 1);
	t->bytes -= le->bytes;
	if (le->staged) {
		t->staging_held -= le->staged;
		if (!t->staging_held)
			t->staging_top = 0;
		le->staged = 0;
	}
	t->held--;
	le->used = false;
	le->generation = (le->generation + 1) & 0x7fffu;
}

uint32_t forward_leases_release_all(struct forward_leases *t)
{
	uint32_t n = 0;
	for (uint32_t i = 0; t && i < t->cap; i++)
		if (t->entry[i].used) {
			entry_release(t, &t->entry[i]);
			n++;
		}
	return n;
}

void forward_leases_destroy(struct forward_leases *t)
{
	if (!t)
		return;
	forward_leases_release_all(t);
	free(t->entry);
	free(t->scratch);
	free(t);
}

void forward_leases_held(const struct forward_leases *t, uint32_t *n, uint64_t *bytes)
{
	*n = t ? t->held : 0;
	*bytes = t ? t->bytes : 0;
}

int forward_lease_release(struct forward_leases *t, uint32_t id)
{
	const uint32_t i = id & 0xffffu;
	if (!t || i >= t->cap || !t->entry[i].used || t->entry[i].generation != id >> 16)
		return MOE_EBADLEASE;
	entry_release(t, &t->entry[i]);
	return MOE_OK;
}

/* m's description relative to the pool; false when its bytes (or side data) lie outside. */
static bool describe(const struct forward_leases *t, const struct moek_matrix *m,
                     struct moe_lease_matrix *out)
{
	const size_t row = moek_row_bytes(m->format, m->cols);
	const size_t stride = m->row_stride ? m->row_stride : row;
	const uint8_t *p = m->data;
	memset(out, 0, sizeof(*out));
	out->format = m->format;
	out->rows = m->rows;
	out->cols = m->cols;
	out->interleave = m->interleave;
	out->row_stride = stride;
	/* interleave 8: groups of 8 rows, each group 8 * stride bytes, the last group whole */
	out->bytes = m->interleave ? (size_t)m->rows * stride
	                           : (m->rows ? (size_t)(m->rows - 1) * stride + row : 0);
	if (m->row0 || p < t->base || (uint64_t)(p - t->base) + out->bytes > t->pool_bytes)
		return false;
	out->offset = (uint64_t)(p - t->base);
	out->scales_offset = UINT64_MAX;
	out->bias_offset = UINT64_MAX;
	const uint8_t *s = (const uint8_t *)m->scales, *b = (const uint8_t *)m->bias;
	if (s) {
		const size_t stride_f = m->scale_stride ? m->scale_stride : (m->cols + 127) / 128;
		const size_t sb = ((m->rows + 127) / 128) * stride_f * sizeof(float);
		if (s < t->base || (uint64_t)(s - t->base) + sb > t->pool_bytes)
			return false;
		out->scales_offset = (uint64_t)(s - t->base);
		out->scale_stride = (uint32_t)stride_f;
	}
	if (b) {
		if (b < t->base ||
		    (uint64_t)(b - t->base) + m->rows * sizeof(float) > t->pool_bytes)
			return false;
		out->bias_offset = (uint64_t)(b - t->base);
	}
	return true;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
	                      .tv_nsec = (long)(ns % 1000000000u)};
	nanosleep(&ts, NULL);
}

/* The moe status of a weights_demand errno. */
static int lease_status(int rc)
{
	switch (rc) {
	case -EPERM: return MOE_EMASKED;
	case -ESHUTDOWN: return MOE_ESHUTDOWN;
	case -ETIMEDOUT: return MOE_ETIMEDOUT;
	case -ENOSPC: return MOE_ENOLEASE;
	case -EINVAL: return MOE_EBADEXPERT;
	default: return MOE_EIO;
	}
}

static bool scratch_fit(struct forward_leases *t, size_t bytes)
{
	if (bytes <= t->scratch_bytes)
		return true;
	uint8_t *p = realloc(t->scratch, bytes);
	if (!p)
		return false;
	t->scratch = p;
	t->scratch_bytes = bytes;
	return true;
}

/* Rows [r_begin, r_end) of m (r_begin a multiple of 8) as BF16 rows at dst (rows x cols): GGUF
 * rows back from the decode layout (moek_deinterleave, a group of 8 at a time), then the
 * kernels' dequantizer and round to BF16, a row at a time; `rows` holds a group of GGUF rows,
 * f one row in f32. 0, or -1 (a format they refuse). */
static int stage_rows(const struct moek_matrix *m, uint16_t *dst, size_t r_begin, size_t r_end,
                      uint8_t *rows, float *f)
{
	const size_t rb = moek_row_bytes(m->format, m->cols);
	const size_t stride = m->row_stride ? m->row_stride : rb;
	const size_t group = m->interleave ? 8u : 1u;
	const size_t sstride = m->scale_stride ? m->scale_stride : (m->cols + 127) / 128;
	const uint8_t *src = m->data;
	for (size_t r0 = r_begin; r0 < r_end; r0 += group) {
		const uint8_t *g = src + r0 * stride; /* interleave: group r0 / 8 at 8 · stride */
		if (m->interleave && moek_deinterleave(m->format, g, 8, m->cols, rows) != 0)
			return -1;
		for (size_t r = 0; r < group && r0 + r < r_end; r++) {
			const uint8_t *row = m->interleave ? rows + r * rb : g;
			const float *sc = m->scales ? m->scales + ((r0 + r) / 128) * sstride : NULL;
			if (moek_dequantize(m->format, row, sc, 1, m->cols, f) != 0)
				return -1;
			moek_convert(2 /* MOE_DTYPE_BF16 */, dst + (r0 + r) * m->cols, 0, f,
			             m->cols);
		}
	}
	return 0;
}

/* The BF16 form of a lease's matrices as one pool job (forward_run_job): each item is
 * STAGE_ROWS rows of one matrix, run by any worker with its own share of the scratch. One job
 * for the whole lease, so a worker held up (a busy CPU) delays one item's end, not every
 * expert's. Every row goes through the same calls whichever worker runs it: the bits do not
 * depend on the split. */
static void stage_item(void *arg, uint32_t item, uint32_t worker)
{
	struct stage_job *j = arg;
	uint32_t lo = 0, hi = j->n; /* the matrix i with first[i] <= item < first[i + 1] */
	while (hi - lo > 1) {
		const uint32_t mid = (lo + hi) / 2;
		if (j->first[mid] <= item)
			lo = mid;
		else
			hi = mid;
	}
	const struct moek_matrix *m = j->m[lo];
	const size_t r0 = (size_t)(item - j->first[lo]) * STAGE_ROWS;
	const size_t r1 = r0 + STAGE_ROWS < m->rows ? r0 + STAGE_ROWS : m->rows;
	uint8_t *rows = j->scratch + worker * j->per_worker;
	if (stage_rows(m, j->dst[lo], r0, r1, rows, (float *)(void *)(rows + j->rows_bytes)) != 0)
		atomic_store_explicit(&j->failed, true, memory_order_relaxed);
}

/* Room in the staging area for le's three matrices, o's descriptions rewritten to it, and the
 * matrices added to the lease's job (stage_run fills them). MOE_OK, or MOE_ENOLEASE with why
 * (the area is full, a format not dequantized). */
static int stage_expert(struct forward_leases *t, struct lease_entry *le,
                        struct moe_lease_expert *o, char *why, size_t len)
{
	struct stage_job *j = &t->job;
	const struct moek_matrix *m[3] = {&le->h.view.gate, &le->h.view.up, &le->h.view.down};
	struct moe_lease_matrix *d[3] = {&o->gate, &o->up, &o->down};
	uint64_t need = 0;
	for (int i = 0; i < 3; i++)
		need += ((uint64_t)m[i]->rows * m[i]->cols * 2 + 4095) & ~(uint64_t)4095;
	if (t->staging_top + need > t->staging_bytes) {
		snprintf(why, len,
		         "LEASE (BF16) expert %u: %llu bytes of staging needed, %llu of %llu free "
		         "(release BF16 leases, or serve --lease-staging-mib)",
		         o->expert, (unsigned long long)need,
		         (unsigned long long)(t->staging_bytes - t->staging_top),
		         (unsigned long long)t->staging_bytes);
		return MOE_ENOLEASE;
	}
	for (int i = 0; i < 3; i++) {
		const size_t rb = moek_row_bytes(m[i]->format, m[i]->cols);
		if (!rb || j->n >= STAGE_MAX_MATRICES) {
			snprintf(why, len,
			         "LEASE (BF16) expert %u: format %u cannot be dequantized here",
			         o->expert, m[i]->format);
			return MOE_ENOLEASE;
		}
		const size_t rows_bytes = ((m[i]->interleave ? 8u : 1u) * rb + 63) & ~(size_t)63;
		j->rows_bytes = rows_bytes > j->rows_bytes ? rows_bytes : j->rows_bytes;
		j->cols = m[i]->cols > j->cols ? m[i]->cols : j->cols;
		j->m[j->n] = m[i];
		j->dst[j->n] = (uint16_t *)(void *)(t->staging + t->staging_top);
		j->first[j->n + 1] =
		    j->first[j->n] + (uint32_t)((m[i]->rows + STAGE_ROWS - 1) / STAGE_ROWS);
		j->n++;
		const uint64_t b = (uint64_t)m[i]->rows * m[i]->cols * 2;
		d[i]->format = MOEK_BF16;
		d[i]->offset = t->staging_top;
		d[i]->bytes = b;
		d[i]->row_stride = (uint64_t)m[i]->cols * 2;
		d[i]->interleave = 0;
		d[i]->scales_offset = UINT64_MAX;
		d[i]->scale_stride = 0;
		d[i]->area = MOE_LEASE_AREA_STAGING;
		t->staging_top += (b + 4095) & ~(uint64_t)4095;
	}
	le->staged = need;
	t->staging_held += need;
	return MOE_OK;
}

/* Runs the lease's job on the engine's workers. MOE_OK, or MOE_ENOLEASE with why. */
static int stage_run(struct forward_leases *t, char *why, size_t len)
{
	struct stage_job *j = &t->job;
	j->per_worker = (j->rows_bytes + j->cols * sizeof(float) + 63) & ~(size_t)63;
	const uint32_t workers = t->e->pool.n_workers ? t->e->pool.n_workers : 1;
	if (!scratch_fit(t, j->per_worker * workers)) {
		snprintf(why, len, "LEASE (BF16): out of memory for %u workers' scratch", workers);
		return MOE_ENOLEASE;
	}
	j->scratch = t->scratch;
	atomic_store_explicit(&j->failed, false, memory_order_relaxed);
	forward_run_job(t->e, stage_item, j, j->first[j->n]);
	if (atomic_load_explicit(&j->failed, memory_order_relaxed)) {
		snprintf(why, len, "LEASE (BF16): a matrix's format cannot be dequantized here");
		return MOE_ENOLEASE;
	}
	return MOE_OK;
}

int forward_lease_take(struct forward_leases *t, int32_t layer, const int32_t *experts, uint32_t n,
                       bool bf16, uint64_t deadline_ns, struct moe_lease_expert *out,
                       struct forward_lease_result *res, char *why, size_t len)
{
	if (bf16 && !t->staging_bytes) {
		snprintf(why, len,
		         "LEASE (BF16): this sidecar gives channels no staging area "
		         "(serve --lease-staging-mib)");
		return MOE_ENOLEASE;
	}
	struct forward_engine *e = t->e;
	struct forward_weights *w = &e->w;
	memset(res, 0, sizeof(*res));
	if (layer < 0 || (uint32_t)layer >= e->cat->info.n_layers || w->moe_index[layer] < 0) {
		snprintf(why, len, "LEASE: layer %d is not an MoE layer of the served model",
		         layer);
		return MOE_EBADLAYER;
	}
	const uint32_t ml = (uint32_t)w->moe_index[layer];
	/* Every id checked, and slots reserved, before anything is demanded: all or nothing. */
	uint32_t idx[256];
	if (n > sizeof(idx) / sizeof(idx[0]) || n > t->cap - t->held) {
		snprintf(
		    why, len,
		    "LEASE layer %d: %u experts at once; this channel holds %u leases of at most "
		    "%u, and one LEASE takes at most 256",
		    layer, n, t->held, t->cap);
		return MOE_ENOLEASE;
	}
	uint64_t want = 0;
	for (uint32_t i = 0; i < n; i++) {
		const int32_t x = experts[i];
		res->bad = i;
		if (x < 0 || (uint32_t)x >= w->n_experts) {
			snprintf(why, len, "LEASE layer %d: expert %d out of range (0..%u)", layer,
			         x, w->n_experts - 1);
			return MOE_EBADEXPERT;
		}
		for (uint32_t j = 0; j < i; j++)
			if (experts[j] == x) {
				snprintf(why, len, "LEASE layer %d: expert %d named twice", layer,
				         x);
				return MOE_EBADEXPERT;
			}
		want += weights_res_bytes(w, 0, ml, (uint32_t)x);
	}
	if (t->bytes + want > t->max_bytes) {
		snprintf(
		    why, len,
		    "LEASE layer %d: %llu bytes more would pin %llu bytes, above this channel's "
		    "bound of %llu bytes (half the slot pool); release leases first",
		    layer, (unsigned long long)want, (unsigned long long)(t->bytes + want),
		    (unsigned long long)t->max_bytes);
		return MOE_ENOLEASE;
	}
	for (uint32_t i = 0, k = 0; i < n; k++)
		if (!t->entry[k].used) {
			idx[i++] = k;
			memset(&t->entry[k].h, 0, sizeof(t->entry[k].h));
			t->entry[k].h.hold.expert = (uint32_t)experts[i - 1];
		}
	/* Demand without waiting until each is held: those resident first, cold ones polled. */
	int status = MOE_OK;
	uint32_t done = 0;
	bool waited = false;
	struct sidecar_error err = {0};
	for (;;) {
		for (uint32_t i = 0; i < n && status == MOE_OK; i++) {
			struct lease_entry *le = &t->entry[idx[i]];
			if (le->used)
				continue;
			enum weights_found found;
			uint64_t cold;
			const int rc = weights_demand(w, ml, &le->h, false, &found, &cold, &err);
			if (found == WEIGHTS_COLD || found == WEIGHTS_IN_FLIGHT)
				res->cold++, res->cold_bytes += cold;
			if (rc < 0) {
				status = lease_status(rc);
				res->bad = i;
				char m[200] = "";
				weights_error_message(w, ml, le->h.hold.expert, m, sizeof(m));
				snprintf(why, len, "LEASE layer %d expert %u: %s%s%s", layer,
				         le->h.hold.expert, moe_status_str(status),
				         m[0] ? ": " : "", m[0] ? m : err.msg);
			} else if (rc == 1) {
				le->used = true; /* held; described below */
				le->layer = layer;
				le->bytes = weights_res_bytes(w, 0, ml, le->h.hold.expert);
				t->bytes += le->bytes;
				t->held++;
				done++;
			}
		}
		if (status != MOE_OK || done == n)
			break;
		if (monotonic_ns() >= deadline_ns) {
			status = MOE_ETIMEDOUT;
			snprintf(why, len,
			         "LEASE layer %d: %u of %u experts still loading at the deadline",
			         layer, n - done, n);
			break;
		}
		waited = true;
		sleep_ns(LEASE_POLL_NS);
	}
	res->waited = waited;
	t->job.n = 0;
	t->job.rows_bytes = t->job.cols = 0;
	for (uint32_t i = 0; i < n && status == MOE_OK; i++) {
		struct lease_entry *le = &t->entry[idx[i]];
		const struct moek_expert *v = &le->h.view;
		struct moe_lease_expert *o = &out[i];
		memset(o, 0, sizeof(*o));
		o->lease = le->generation << 16 | idx[i];
		o->layer = layer;
		o->expert = le->h.hold.expert;
		o->activation = v->activation;
		if (!describe(t, &v->gate, &o->gate) || !describe(t, &v->up, &o->up) ||
		    !describe(t, &v->down, &o->down)) {
			status = MOE_ENOLEASE;
			res->bad = i;
			snprintf(
			    why, len,
			    "LEASE layer %d expert %u: its matrices or side data are not all in "
			    "the slot pool (side data kept apart: not leasable)",
			    layer, o->expert);
		} else if (bf16) {
			status = stage_expert(t, le, o, why, len);
			if (status != MOE_OK)
				res->bad = i;
		}
	}
	if (status == MOE_OK && bf16 && (status = stage_run(t, why, len)) != MOE_OK)
		res->bad = 0;
	if (status != MOE_OK) { /* all or nothing: what this call took goes back */
		for (uint32_t i = 0; i < n; i++) {
			struct lease_entry *le = &t->entry[idx[i]];
			if (le->used)
				entry_release(t, le);
			else if (le->h.hold.held)
				weights_release_layer(w, &le->h, NULL, 1);
		}
		return status;
	}
	res->bytes = want;
	return MOE_OK;
}
