/* odirect.h — the disk's floor for reading a model's experts: every expert's 4 KiB-aligned
 * extents, merged where they touch, read in file order with O_DIRECT through one io_uring at a
 * given block size and depth into registered THP-advised buffers. bench_loader and
 * bench_decode compare the residency loader's cold loads with it in the same run. Header-only
 * (static inline): each benchmark is one program. */
#ifndef MOE_BENCH_ODIRECT_H
#define MOE_BENCH_ODIRECT_H

#include <errno.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "clock.h"
#include "expert_map.h"
#include "progress.h"

struct bench_range {
	int fd;
	uint64_t offset, length;
};

/* Every expert's aligned extents, merged where they touch, in file order: the bytes the
 * loader reads, as the baseline reads them. */
static inline int bench_range_cmp(const void *a, const void *b)
{
	const struct bench_range *x = a, *y = b;
	if (x->fd != y->fd)
		return x->fd < y->fd ? -1 : 1;
	return (x->offset > y->offset) - (x->offset < y->offset);
}

static inline struct bench_range *bench_expert_ranges(const struct expert_map *map, const int *fds,
                                                      uint32_t *n_out, uint64_t *bytes_out)
{
	uint32_t n = 0;
	for (uint32_t id = 0; id < map->n_layers * map->n_experts; id++)
		n += map->n_extents[id];
	struct bench_range *c = malloc((n ? n : 1) * sizeof(*c));
	if (!c)
		return NULL;
	uint32_t k = 0;
	for (uint32_t id = 0; id < map->n_layers * map->n_experts; id++) {
		uint32_t m;
		const struct expert_extent *e = expert_map_extents(map, id, &m);
		for (uint32_t i = 0; i < m; i++) {
			uint64_t start = e[i].offset / 4096 * 4096;
			uint64_t end = (e[i].offset + e[i].length + 4095) / 4096 * 4096;
			c[k++] = (struct bench_range){fds[e[i].file], start, end - start};
		}
	}
	qsort(c, k, sizeof(*c), bench_range_cmp);
	uint32_t w = 0;
	uint64_t bytes = 0;
	for (uint32_t i = 0; i < k; i++) {
		if (w && c[w - 1].fd == c[i].fd &&
		    c[i].offset <= c[w - 1].offset + c[w - 1].length) {
			uint64_t end = c[i].offset + c[i].length;
			if (end > c[w - 1].offset + c[w - 1].length)
				c[w - 1].length = end - c[w - 1].offset;
		} else {
			c[w++] = c[i];
		}
	}
	for (uint32_t i = 0; i < w; i++)
		bytes += c[i].length;
	*n_out = w;
	*bytes_out = bytes;
	return c;
}

/* The baseline: sequential O_DIRECT reads of `ranges` in blocks of `block` bytes, `depth`
 * in flight, into registered buffers. Returns seconds, or < 0 on error. */
static inline double bench_odirect_read(const struct bench_range *ranges, uint32_t n,
                                        uint32_t block, uint32_t depth, uint64_t *bytes_read)
{
	struct io_uring ring;
	int rc = io_uring_queue_init(depth, &ring, 0);
	if (rc < 0) {
		fprintf(stderr, "bench: io_uring_queue_init: %s\n", strerror(-rc));
		return -1;
	}
	/* Buffers like the loader's slots (anonymous, THP-advised), so that only the access
	 * pattern differs: 4 KiB pages would split each read into more device segments. */
	size_t buf_bytes = (size_t)block * depth;
	uint8_t *bufs =
	    mmap(NULL, buf_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (bufs == MAP_FAILED) {
		fprintf(stderr, "bench: mmap %zu bytes: %s\n", buf_bytes, strerror(errno));
		io_uring_queue_exit(&ring);
		return -1;
	}
	madvise(bufs, buf_bytes, MADV_HUGEPAGE);
	memset(bufs, 0, (size_t)block * depth);
	struct iovec *iov = malloc(depth * sizeof(*iov));
	uint32_t *free_bufs = malloc(depth * sizeof(uint32_t));
	for (uint32_t i = 0; i < depth; i++) {
		iov[i] = (struct iovec){bufs + (size_t)i * block, block};
		free_bufs[i] = i;
	}
	bool fixed = io_uring_register_buffers(&ring, iov, depth) == 0;
	uint32_t n_free = depth, range = 0, in_flight = 0;
	uint64_t pos = 0, done = 0;
	double t0 = monotonic_s(), secs = -1;
	for (;;) {
		while (n_free && range < n) {
			uint64_t len = ranges[range].length - pos;
			if (len > block)
				len = block;
			uint32_t b = free_bufs[--n_free];
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			if (fixed)
				io_uring_prep_read_fixed(sqe, ranges[range].fd, iov[b].iov_base,
				                         (unsigned)len, ranges[range].offset + pos,
				                         (int)b);
			else
				io_uring_prep_read(sqe, ranges[range].fd, iov[b].iov_base,
				                   (unsigned)len, ranges[range].offset + pos);
			io_uring_sqe_set_data64(sqe, b);
			in_flight++;
			pos += len;
			if (pos >= ranges[range].length) {
				range++;
				pos = 0;
			}
		}
		if (!in_flight)
			break;
		rc = io_uring_submit_and_wait(&ring, 1);
		if (rc < 0 && rc != -EINTR) {
			fprintf(stderr, "bench: baseline submit: %s\n", strerror(-rc));
			goto out;
		}
		struct io_uring_cqe *cqe;
		while (io_uring_peek_cqe(&ring, &cqe) == 0) {
			if (cqe->res < 0) {
				fprintf(stderr, "bench: baseline read: %s\n", strerror(-cqe->res));
				goto out;
			}
			done +=
			    (uint64_t)cqe->res; /* a short count at EOF is the end of the file */
			free_bufs[n_free++] = (uint32_t)io_uring_cqe_get_data64(cqe);
			in_flight--;
			io_uring_cqe_seen(&ring, cqe);
		}
	}
	secs = monotonic_s() - t0;
	*bytes_read = done;
out:
	io_uring_queue_exit(&ring);
	munmap(bufs, buf_bytes);
	free(iov);
	free(free_bufs);
	return secs;
}

#endif /* MOE_BENCH_ODIRECT_H */
