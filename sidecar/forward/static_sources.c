/* static_sources.c — the ALL_RESIDENT and MMAP sources: every expert's bytes in place at
 * open, and the f32 side data (biases, FP8 block scales) they read once into aux.
 *
 *   ALL_RESIDENT  every expert's matrices read into one buffer at create (the compute floor),
 *                 each projection in the kernels' layout (transform_read_proj), then the
 *                 decode layout; with several NUMA nodes each node's rows are bound to it
 *                 before the first touch.
 *   MMAP          pointers into a read-only mapping of each model file (the page cache decides
 *                 what is in memory, as llama.cpp does: the baseline).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "weights.h"

int weights_read_exact(int fd, const char *path, void *buf, uint64_t len, uint64_t off,
                       struct sidecar_error *err)
{
	uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = pread(fd, p, len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			error_set(err, MOE_ESYS, "%s: read at offset %llu: %s", path,
			          (unsigned long long)off,
			          n < 0 ? strerror(errno) : "unexpected end of file");
			return -1;
		}
		p += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

/* Floats of side data an expert needs. */
static uint64_t aux_floats(const struct moe_expert *x)
{
	uint64_t n = 0;
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		const struct moe_proj_ref *r = &x->proj[p];
		if (!r->present)
			continue;
		if (r->bias.length)
			n += r->rows;
		if (moek_format_scale_block(r->format))
			n += r->scale.length / 4;
	}
	return n;
}

/* Reads biases and FP8 scales of every expert into w->aux as f32. */
int static_load_aux(struct forward_weights *w, const int *fds, struct sidecar_error *err)
{
	const struct moe_catalog *cat = w->cat;
	const size_t n_ids = (size_t)w->n_moe_layers * w->n_experts;
	w->aux_index = calloc(n_ids ? n_ids : 1, sizeof(*w->aux_index));
	uint64_t total = 0;
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++)
			total += aux_floats(moe_catalog_expert(cat, w->model_layer[l], e));
	w->aux = malloc((total ? total : 1) * sizeof(float));
	uint16_t *tmp =
	    malloc(cat->info.expert_ffn * 2 * sizeof(float) + cat->info.hidden * 4 + 64);
	if (!w->aux_index || !w->aux || !tmp) {
		free(tmp);
		error_set(err, MOE_ENOMEM, "expert side data (%llu floats): out of memory",
		          (unsigned long long)total);
		return -1;
	}
	uint64_t at = 0;
	int rc = 0;
	for (uint32_t l = 0; l < w->n_moe_layers && rc == 0; l++)
		for (uint32_t e = 0; e < w->n_experts && rc == 0; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[l], e);
			struct expert_aux *a = &w->aux_index[(size_t)l * w->n_experts + e];
			for (int i = 0; i < 3; i++)
				a->bias[i] = a->scale[i] = AUX_NONE;
			for (int p = 0; p < MOE_PROJ_COUNT && rc == 0; p++) {
				const struct moe_proj_ref *r = &x->proj[p];
				if (!r->present)
					continue;
				const char *path = cat->files[r->data.file].path;
				if (moek_format_scale_block(r->format) && r->scale.length) {
					rc = weights_read_exact(
					    fds[r->scale.file], cat->files[r->scale.file].path,
					    &w->aux[at], r->scale.length, r->scale.offset, err);
					a->scale[p] = at; /* FP8 is never fused: p < 3 */
					at += r->scale.length / 4;
				}
				if (rc || !r->bias.length)
					continue;
				size_t eb = bias_elem_bytes(r->bias_format);
				if (r->bias.length != r->rows * eb) {
					error_set(err, MOE_EINVAL,
					          "%s: layer %u expert %u %s bias: %llu bytes, "
					          "expected %llu",
					          path, w->model_layer[l], e,
					          moe_proj_name((enum moe_proj)p),
					          (unsigned long long)r->bias.length,
					          (unsigned long long)(r->rows * eb));
					rc = -1;
					break;
				}
				rc = weights_read_exact(fds[r->bias.file],
				                        cat->files[r->bias.file].path, tmp,
				                        r->bias.length, r->bias.offset, err);
				if (rc)
					break;
				float *dst = &w->aux[at];
				for (uint64_t i = 0; i < r->rows; i++)
					dst[i] = eb == 4 ? ((float *)(void *)tmp)[i]
					         : r->bias_format == MOEK_BF16
					             ? moek_bf16_to_f32(tmp[i])
					             : moek_f16_to_f32(tmp[i]);
				if (p == MOE_PROJ_GATE_UP) {
					uint64_t ffn = r->rows / 2;
					if (r->order ==
					    MOE_GATE_UP_INTERLEAVED) { /* even gate, odd up */
						float *t = (float *)(void *)tmp;
						for (uint64_t i = 0; i < r->rows; i++)
							t[i] = dst[i];
						for (uint64_t i = 0; i < ffn; i++) {
							dst[i] = t[2 * i];
							dst[ffn + i] = t[2 * i + 1];
						}
					}
					a->bias[MOE_PROJ_GATE] = at;
					a->bias[MOE_PROJ_UP] = at + ffn;
				} else {
					a->bias[p] = at;
				}
				at += r->rows;
			}
		}
	free(tmp);
	return rc;
}

int weights_open_files(const struct moe_catalog *cat, int **fds_out, struct sidecar_error *err)
{
	int *fds = malloc(cat->n_files * sizeof(int));
	if (!fds) {
		error_set(err, MOE_ENOMEM, "out of memory");
		return -1;
	}
	for (uint32_t i = 0; i < cat->n_files; i++) {
		fds[i] = open(cat->files[i].path, O_RDONLY | O_CLOEXEC);
		if (fds[i] < 0) {
			error_set(err, MOE_ESYS, "%s: %s", cat->files[i].path, strerror(errno));
			while (i-- > 0)
				close(fds[i]);
			free(fds);
			return -1;
		}
	}
	*fds_out = fds;
	return 0;
}

void weights_close_files(const struct moe_catalog *cat, int *fds)
{
	for (uint32_t i = 0; fds && i < cat->n_files; i++)
		close(fds[i]);
	free(fds);
}

static size_t align64(size_t v)
{
	return (v + 63) & ~(size_t)63;
}

/* Binds the pages of each node's rows of (moe_layer, expert) to that node: gate/up rows of its
 * intermediate range, down rows of its output range, the same split the pool runs (pages
 * straddling two nodes' rows stay with the first toucher). */
static void bind_rows(struct forward_topology *topo, uint32_t node, const struct moek_matrix *m,
                      size_t r0, size_t r1)
{
	const size_t page = 4096;
	const size_t stride = m->row_stride ? m->row_stride : moek_row_bytes(m->format, m->cols);
	uintptr_t a = (uintptr_t)m->data + r0 * stride, b = (uintptr_t)m->data + r1 * stride;
	a = (a + page - 1) & ~(uintptr_t)(page - 1);
	b &= ~(uintptr_t)(page - 1);
	if (b > a)
		topology_bind_area(topo, node, (void *)a, b - a);
}

static void bind_expert(struct forward_weights *w, struct forward_topology *topo, uint32_t l,
                        uint32_t e)
{
	struct moek_expert v;
	if (weights_static_view(w, l, e, &v, NULL) != 0)
		return;
	const size_t align = moek_expert_split_align(&v);
	size_t f[FORWARD_MAX_NODES + 1], o[FORWARD_MAX_NODES + 1];
	forward_split_range(v.gate.rows, align, topo->n_nodes, f);
	forward_split_range(v.down.rows, FORWARD_DOWN_ALIGN, topo->n_nodes, o);
	for (uint32_t n = 0; n < topo->n_nodes; n++) {
		bind_rows(topo, n, &v.gate, f[n], f[n + 1]);
		if (v.up.data != v.gate.data)
			bind_rows(topo, n, &v.up, f[n], f[n + 1]);
		bind_rows(topo, n, &v.down, o[n], o[n + 1]);
	}
}

int static_load_all_resident(struct forward_weights *w, const int *fds,
                             const struct forward_config *cfg, struct forward_topology *topo,
                             struct sidecar_error *err)
{
	const struct moe_catalog *cat = w->cat;
	size_t total = 0;
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[l], e);
			for (int p = 0; p < MOE_PROJ_COUNT; p++)
				if (x->proj[p].present)
					total += align64(moe_proj_kernel_bytes(&x->proj[p]));
		}
	w->resident_len = total ? total : 64;
	void *buf =
	    mmap(NULL, w->resident_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		error_set(err, MOE_ESYS, "all-resident weights: %zu bytes: %s", w->resident_len,
		          strerror(errno));
		return -1;
	}
	w->resident = buf;
	/* Transparent huge pages where the system grants them on request (THP "madvise"
	 * mode): decode streams a few MiB of scattered experts per layer, and 4 KiB pages make
	 * that a TLB miss per page, as the residency pool's advised pages avoid. A refusal only
	 * costs speed. */
	(void)madvise(buf, w->resident_len, MADV_HUGEPAGE);
	/* Lay every projection out first, so the node split can bind pages before they are
	 * touched; then read. */
	size_t at = 0;
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[l], e);
			for (int p = 0; p < MOE_PROJ_COUNT; p++)
				if (x->proj[p].present) {
					w->data[((size_t)l * w->n_experts + e) * MOE_PROJ_COUNT +
					        p] = w->resident + at;
					at += align64(moe_proj_kernel_bytes(&x->proj[p]));
				}
		}
	if (topo->memory_bound)
		for (uint32_t l = 0; l < w->n_moe_layers; l++)
			for (uint32_t e = 0; e < w->n_experts; e++)
				bind_expert(w, topo, l, e);
	const uint64_t n_ids = (uint64_t)w->n_moe_layers * w->n_experts;
	struct proj_reader rd;
	if (transforms_read_begin(w, &rd, err) != 0)
		return -1;
	struct decode_scratch scratch = {0};
	struct moek_expert shape;
	if (w->decode.on && (weights_shape_view(w, 0, 0, &shape, err) != 0 ||
	                     decode_scratch_init(&scratch, &shape, err) != 0)) {
		transforms_read_end(&rd);
		return -1;
	}
	int rc = 0;
	for (uint32_t l = 0; l < w->n_moe_layers && rc == 0; l++)
		for (uint32_t e = 0; e < w->n_experts && rc == 0; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[l], e);
			uint8_t **d =
			    (uint8_t **)&w->data[((size_t)l * w->n_experts + e) * MOE_PROJ_COUNT];
			for (int p = 0; p < MOE_PROJ_COUNT && rc == 0; p++)
				if (x->proj[p].present)
					rc = transform_read_proj(w, &rd, fds, l, e, p, d[p], err);
			if (rc == 0 && w->decode.on)
				rc = transform_decode_whole(w, &scratch, l, e, d, err);
			if (rc == 0 && cfg->progress)
				cfg->progress(cfg->progress_arg, "loading experts",
				              (uint64_t)l * w->n_experts + e + 1, n_ids);
		}
	transforms_read_end(&rd);
	decode_scratch_free(&scratch);
	w->budget_bytes = total;
	return rc;
}

int static_map_files(struct forward_weights *w, struct sidecar_error *err)
{
	const struct moe_catalog *cat = w->cat;
	w->file_map = calloc(cat->n_files, sizeof(void *));
	w->file_map_len = calloc(cat->n_files, sizeof(size_t));
	if (!w->file_map || !w->file_map_len) {
		error_set(err, MOE_ENOMEM, "out of memory");
		return -1;
	}
	for (uint32_t i = 0; i < cat->n_files; i++) {
		int fd = open(cat->files[i].path, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			error_set(err, MOE_ESYS, "%s: %s", cat->files[i].path, strerror(errno));
			return -1;
		}
		size_t len = cat->files[i].size ? cat->files[i].size : 1;
		void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
		int saved = errno;
		close(fd);
		if (m == MAP_FAILED) {
			error_set(err, MOE_ESYS, "%s: mmap: %s", cat->files[i].path,
			          strerror(saved));
			return -1;
		}
		w->file_map[i] = m;
		w->file_map_len[i] = len;
	}
	for (uint32_t l = 0; l < w->n_moe_layers; l++)
		for (uint32_t e = 0; e < w->n_experts; e++) {
			const struct moe_expert *x = moe_catalog_expert(cat, w->model_layer[l], e);
			for (int p = 0; p < MOE_PROJ_COUNT; p++)
				if (x->proj[p].present)
					w->data[((size_t)l * w->n_experts + e) * MOE_PROJ_COUNT +
					        p] =
					    (const uint8_t *)w->file_map[x->proj[p].data.file] +
					    x->proj[p].data.offset;
		}
	w->budget_bytes = cat->expert_bytes_total;
	return 0;
}
