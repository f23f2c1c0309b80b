/* leases.c — expert leases: experts pinned in a shared slot pool for another process to read
 * (forward.h, "Expert leases").
 *
 * Split over NUMA nodes (weights.sliced), each node part has its own pool and holds its rows of
 * every expert: a leased matrix is then described as its slices, one per node (pool index =
 * node part), in a table after the experts' descriptions (ABI 1.4).
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

/* The BF16 form's job: the lease's matrices (3 per expert; split over nodes, each node's
 * rows of them: a part), each part cut into items of STAGE_ROWS rows (stage_item). */
#define STAGE_ROWS 64u /* 8 groups of the decode layout */
#define STAGE_MAX_MATRICES (256u * 3u * FORWARD_MAX_NODES)
struct stage_job {
	const struct moek_matrix *m[STAGE_MAX_MATRICES]; /* row r at data + (r - row0) rows */
	uint16_t *dst[STAGE_MAX_MATRICES];               /* the whole matrix's BF16 rows */
	uint32_t lo[STAGE_MAX_MATRICES], hi[STAGE_MAX_MATRICES]; /* part i's rows [lo, hi) */
	uint32_t first[STAGE_MAX_MATRICES + 1]; /* part i's items: [first[i], first[i + 1]) */
	uint32_t n;
	size_t rows_bytes, cols, per_worker;
	uint8_t *scratch;
	atomic_bool failed;
};

struct forward_leases {
	struct forward_engine *e;
	uint32_t n_pools;                       /* 1, or the node parts (weights.sliced) */
	const uint8_t *base[FORWARD_MAX_NODES]; /* each pool's mapping here */
	uint64_t pool_bytes[FORWARD_MAX_NODES];
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
	struct stage_job *job;
};

int forward_lease_pools(struct forward_engine *e, int *fds, uint64_t *bytes, uint32_t *n, char *why,
                        size_t len)
{
	const uint8_t *base;
	*n = 0;
	if (e->w.source != FORWARD_SOURCE_RESIDENCY) {
		snprintf(why, len, "experts are not served from a slot pool (source %s)",
		         e->w.source == FORWARD_SOURCE_MMAP ? "mmap" : "all-resident");
		return -1;
	}
	for (uint32_t i = 0; i < e->w.n_res; i++)
		if (!e->w.res ||
		    residency_shared_pool_node(e->w.res, i, &fds[i], &base, &bytes[i]) != 0) {
			snprintf(why, len, "the slot pool is private (serve --leases shares it)");
			return -1;
		}
	*n = e->w.n_res;
	return 0;
}

int forward_leases_create(struct forward_engine *e, uint32_t cap, uint64_t max_bytes, void *staging,
                          uint64_t staging_bytes, struct forward_leases **out)
{
	struct forward_leases *t = calloc(1, sizeof(*t));
	if (!t)
		return -1;
	int fd;
	bool ok = e->w.source == FORWARD_SOURCE_RESIDENCY && e->w.res && cap && cap <= 65536u &&
	          e->w.n_res <= FORWARD_MAX_NODES;
	for (uint32_t i = 0; ok && i < e->w.n_res; i++)
		ok = residency_shared_pool_node(e->w.res, i, &fd, &t->base[i], &t->pool_bytes[i]) ==
		     0;
	t->n_pools = e->w.n_res;
	t->entry = ok ? calloc(cap, sizeof(*t->entry)) : NULL;
	t->job = t->entry ? calloc(1, sizeof(*t->job)) : NULL;
	if (!t->job) {
		free(t->entry);
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
	free(t->job);
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

/* Rows [row0, row0 + rows) of m (m->data at row m->row0; scales and biases indexed by the
 * matrix's row) in pool p: their span, side data and layout into out. False when they lie
 * outside the pool. */
static bool describe_rows(const struct forward_leases *t, uint32_t p, const struct moek_matrix *m,
                          uint32_t row0, uint32_t rows, struct moe_lease_slice *out)
{
	const size_t row = moek_row_bytes(m->format, m->cols);
	const size_t stride = m->row_stride ? m->row_stride : row;
	const uint8_t *base = t->base[p];
	const uint64_t size = t->pool_bytes[p];
	if (row0 < m->row0)
		return false;
	const uint8_t *d = m->data + (size_t)(row0 - m->row0) * stride;
	memset(out, 0, sizeof(*out));
	out->pool = p;
	out->row0 = row0;
	out->rows = rows;
	out->interleave = m->interleave;
	out->row_stride = stride;
	/* interleave 8: groups of 8 rows, each group 8 * stride bytes, the last group whole */
	out->bytes =
	    m->interleave ? (size_t)rows * stride : (rows ? (size_t)(rows - 1) * stride + row : 0);
	if (d < base || (uint64_t)(d - base) > size || out->bytes > size - (uint64_t)(d - base))
		return false;
	out->offset = (uint64_t)(d - base);
	out->scales_offset = UINT64_MAX;
	out->bias_offset = UINT64_MAX;
	if (m->scales) {
		const size_t stride_f = m->scale_stride ? m->scale_stride : (m->cols + 127) / 128;
		const uint8_t *s = (const uint8_t *)(m->scales + (row0 / 128) * stride_f);
		const size_t sb =
		    ((row0 + rows + 127) / 128 - row0 / 128) * stride_f * sizeof(float);
		if (s < base || (uint64_t)(s - base) + sb > size)
			return false;
		out->scales_offset = (uint64_t)(s - base);
		out->scale_stride = (uint32_t)stride_f;
	}
	if (m->bias) {
		const uint8_t *b = (const uint8_t *)(m->bias + row0);
		if (b < base || (uint64_t)(b - base) + rows * sizeof(float) > size)
			return false;
		out->bias_offset = (uint64_t)(b - base);
	}
	return true;
}

/* The whole matrix's fields (format, shape, layout) of m into out. */
static void describe_matrix(const struct moek_matrix *m, struct moe_lease_matrix *out)
{
	memset(out, 0, sizeof(*out));
	out->format = m->format;
	out->rows = m->rows;
	out->cols = m->cols;
	out->interleave = m->interleave;
	out->row_stride = m->row_stride ? m->row_stride : moek_row_bytes(m->format, m->cols);
	out->scales_offset = UINT64_MAX;
	out->bias_offset = UINT64_MAX;
}

/* m's description relative to the one pool; false when its bytes (or side data) lie outside. */
static bool describe(const struct forward_leases *t, const struct moek_matrix *m,
                     struct moe_lease_matrix *out)
{
	struct moe_lease_slice sl;
	describe_matrix(m, out);
	if (m->row0 || !describe_rows(t, 0, m, 0, m->rows, &sl))
		return false;
	out->offset = sl.offset;
	out->bytes = sl.bytes;
	out->scales_offset = sl.scales_offset;
	out->bias_offset = sl.bias_offset;
	out->scale_stride = sl.scale_stride;
	out->area = MOE_LEASE_AREA_POOL;
	return true;
}

/* Split over nodes: matrix i (0 gate, 1 up, 2 down) of h as one slice per node part, written
 * at table[*at…] (*at advanced); out describes the whole matrix (area SLICES, offset the first
 * slice's index). False when a slice lies outside its pool. */
static bool describe_slices(const struct forward_leases *t, const struct held_expert *h, int i,
                            struct moe_lease_matrix *out, struct moe_lease_slice *table,
                            uint32_t *at)
{
	const size_t *split = i < 2 ? h->tp->f_split : h->tp->o_split;
	const struct moek_matrix *whole = i == 0   ? &h->view.gate
	                                  : i == 1 ? &h->view.up
	                                           : &h->view.down;
	describe_matrix(whole, out);
	out->area = MOE_LEASE_AREA_SLICES;
	out->offset = *at;
	uint32_t k = 0;
	for (uint32_t p = 0; p < t->n_pools; p++) {
		const struct moek_expert *v = &h->node_view[p];
		const struct moek_matrix *m = i == 0 ? &v->gate : i == 1 ? &v->up : &v->down;
		const uint32_t r0 = (uint32_t)split[p], r1 = (uint32_t)split[p + 1];
		if (r1 == r0)
			continue;
		struct moe_lease_slice *sl = &table[*at + k];
		if (!describe_rows(t, p, m, r0, r1 - r0, sl))
			return false;
		out->bytes += sl->bytes;
		out->scale_stride = sl->scale_stride;
		k++;
	}
	for (uint32_t j = 0; j < k; j++)
		table[*at + j].n_slices = k;
	*at += k;
	return true;
}

size_t forward_lease_reply_bytes(const struct forward_leases *t, uint32_t n, bool bf16)
{
	const size_t slices = t->n_pools > 1 && !bf16 ? 3u * t->n_pools : 0;
	return (size_t)n *
	       (sizeof(struct moe_lease_expert) + slices * sizeof(struct moe_lease_slice));
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

/* Rows [r_begin, r_end) of m (r_begin - m->row0 a multiple of 8; m->data at row m->row0) as
 * BF16 rows at dst (the whole matrix: rows x cols): GGUF rows back from the decode layout
 * (moek_deinterleave, a group of 8 at a time), then the kernels' dequantizer and round to
 * BF16, a row at a time; `rows` holds a group of GGUF rows, f one row in f32. 0, or -1 (a
 * format they refuse). */
static int stage_rows(const struct moek_matrix *m, uint16_t *dst, size_t r_begin, size_t r_end,
                      uint8_t *rows, float *f)
{
	const size_t rb = moek_row_bytes(m->format, m->cols);
	const size_t stride = m->row_stride ? m->row_stride : rb;
	const size_t group = m->interleave ? 8u : 1u;
	const size_t sstride = m->scale_stride ? m->scale_stride : (m->cols + 127) / 128;
	const uint8_t *src = m->data;
	for (size_t r0 = r_begin; r0 < r_end; r0 += group) {
		/* interleave: group (r0 - row0) / 8 at 8 · stride */
		const uint8_t *g = src + (r0 - m->row0) * stride;
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
	const size_t r0 = j->lo[lo] + (size_t)(item - j->first[lo]) * STAGE_ROWS;
	const size_t r1 = r0 + STAGE_ROWS < j->hi[lo] ? r0 + STAGE_ROWS : j->hi[lo];
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
	struct stage_job *j = t->job;
	const struct moek_matrix *m[3] = {&le->h.view.gate, &le->h.view.up, &le->h.view.down};
	const bool split = t->n_pools > 1;
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
		const uint32_t parts = split ? t->n_pools : 1;
		if (!rb || j->n + parts > STAGE_MAX_MATRICES) {
			snprintf(why, len,
			         "LEASE (BF16) expert %u: format %u cannot be dequantized here",
			         o->expert, m[i]->format);
			return MOE_ENOLEASE;
		}
		const size_t rows_bytes = ((m[i]->interleave ? 8u : 1u) * rb + 63) & ~(size_t)63;
		j->rows_bytes = rows_bytes > j->rows_bytes ? rows_bytes : j->rows_bytes;
		j->cols = m[i]->cols > j->cols ? m[i]->cols : j->cols;
		const size_t *cut = i < 2 ? le->h.tp->f_split : le->h.tp->o_split;
		for (uint32_t p = 0; p < parts;
		     p++) { /* each node's rows (split), or all of them */
			const struct moek_expert *v = split ? &le->h.node_view[p] : &le->h.view;
			j->m[j->n] = i == 0 ? &v->gate : i == 1 ? &v->up : &v->down;
			j->lo[j->n] = split ? (uint32_t)cut[p] : 0;
			j->hi[j->n] = split ? (uint32_t)cut[p + 1] : m[i]->rows;
			j->dst[j->n] = (uint16_t *)(void *)(t->staging + t->staging_top);
			j->first[j->n + 1] =
			    j->first[j->n] +
			    (uint32_t)((j->hi[j->n] - j->lo[j->n] + STAGE_ROWS - 1) / STAGE_ROWS);
			j->n++;
		}
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
	struct stage_job *j = t->job;
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

/* The bytes of (moe_layer, x) over every node part: what a lease of it pins. */
static uint64_t expert_bytes(const struct forward_weights *w, uint32_t moe_layer, uint32_t x)
{
	uint64_t b = 0;
	for (uint32_t p = 0; p < w->n_res; p++)
		b += weights_res_bytes(w, p, moe_layer, x);
	return b;
}

int forward_lease_take(struct forward_leases *t, int32_t layer, const int32_t *experts, uint32_t n,
                       bool bf16, uint32_t abi_minor, uint64_t deadline_ns, void *out_area,
                       size_t out_bytes, struct forward_lease_result *res, char *why, size_t len)
{
	struct moe_lease_expert *out = out_area;
	if (bf16 && !t->staging_bytes) {
		snprintf(why, len,
		         "LEASE (BF16): this sidecar gives channels no staging area "
		         "(serve --lease-staging-mib)");
		return MOE_ENOLEASE;
	}
	struct forward_engine *e = t->e;
	struct forward_weights *w = &e->w;
	memset(res, 0, sizeof(*res));
	const bool sliced = t->n_pools > 1 && !bf16;
	if (sliced && abi_minor < 4) {
		snprintf(
		    why, len,
		    "LEASE: this sidecar splits each expert's rows over %u NUMA nodes' pools; "
		    "leasing them raw needs a client of protocol 1.4 or later (this one speaks "
		    "1.%u), or the BF16 form (MOE_LEASE_BF16)",
		    t->n_pools, abi_minor);
		return MOE_ENOLEASE;
	}
	if (forward_lease_reply_bytes(t, n, bf16) > out_bytes) {
		snprintf(why, len,
		         "LEASE: %u experts' descriptions (%zu bytes) do not fit the output area "
		         "(%zu bytes)",
		         n, forward_lease_reply_bytes(t, n, bf16), out_bytes);
		return MOE_ETOOSMALL;
	}
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
		want += expert_bytes(w, ml, (uint32_t)x);
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
				le->bytes = expert_bytes(w, ml, le->h.hold.expert);
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
	t->job->n = 0;
	t->job->rows_bytes = t->job->cols = 0;
	struct moe_lease_slice *table = (struct moe_lease_slice *)(void *)(out + n);
	uint32_t at = 0;
	for (uint32_t i = 0; i < n && status == MOE_OK; i++) {
		struct lease_entry *le = &t->entry[idx[i]];
		const struct moek_expert *v = &le->h.view;
		struct moe_lease_expert *o = &out[i];
		memset(o, 0, sizeof(*o));
		o->lease = le->generation << 16 | idx[i];
		o->layer = layer;
		o->expert = le->h.hold.expert;
		o->activation = v->activation;
		bool ok;
		if (t->n_pools == 1)
			ok = describe(t, &v->gate, &o->gate) && describe(t, &v->up, &o->up) &&
			     describe(t, &v->down, &o->down);
		else if (sliced)
			ok = describe_slices(t, &le->h, 0, &o->gate, table, &at) &&
			     describe_slices(t, &le->h, 1, &o->up, table, &at) &&
			     describe_slices(t, &le->h, 2, &o->down, table, &at);
		else { /* BF16 from a split expert: the staging area describes it */
			describe_matrix(&v->gate, &o->gate);
			describe_matrix(&v->up, &o->up);
			describe_matrix(&v->down, &o->down);
			ok = true;
		}
		if (!ok) {
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
	res->slices = at;
	return MOE_OK;
}
