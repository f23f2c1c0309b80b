/* fixture.c — see fixture.h. Set-up failures abort with a message: the fixture serves both
 * the Criterion tests and the standalone TSan stress program (stress_race.c). */
#include "fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...)
{
	if (ok)
		return;
	int e = errno;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "fixture: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, " (errno: %s)\n", strerror(e));
	va_end(ap);
	abort();
}

void fixture_create(struct fixture *f, const char *parent, uint32_t layers, uint32_t experts,
                    uint32_t extents_per_expert, uint32_t extent_len)
{
	fixture_create_mix(f, parent, layers, experts, extents_per_expert, extent_len, extent_len);
}

void fixture_create_mix(struct fixture *f, const char *parent, uint32_t layers, uint32_t experts,
                        uint32_t extents_per_expert, uint32_t extent_len, uint32_t odd_len)
{
	memset(f, 0, sizeof(*f));
	snprintf(f->dir, sizeof(f->dir), "%s/moe-residency-test.XXXXXX", parent);
	check(mkdtemp(f->dir) != NULL, "mkdtemp %s", f->dir);
	snprintf(f->path, sizeof(f->path), "%s/model.bin", f->dir);
	const char *paths[] = {f->path};
	struct sidecar_error err = {0};
	check(expert_map_init(&f->map, layers, experts, 1, paths, &err) == 0, "%s", err.msg);
	uint64_t at = 37; /* not aligned to anything */
	for (uint32_t l = 0; l < layers; l++)
		for (uint32_t x = 0; x < experts; x++)
			for (uint32_t i = 0; i < extents_per_expert; i++) {
				uint64_t len = (l % 2 ? odd_len : extent_len) +
				               ((l * 7919u + x * 131u + i * 17u) % 997u);
				check(expert_map_add(&f->map, l, x, 0, at, len, &err) == 0, "%s",
				      err.msg);
				at += len + (i % 2 ? 13 : 0);
			}
	f->file_size = at; /* the last extent ends at EOF */
	f->bytes = malloc(f->file_size);
	check(f->bytes != NULL, "out of memory");
	uint64_t s = 0x1234567;
	for (uint64_t i = 0; i < f->file_size; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		f->bytes[i] = (uint8_t)(s >> 56);
	}
	int fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	check(fd >= 0, "%s: create", f->path);
	check(write(fd, f->bytes, f->file_size) == (ssize_t)f->file_size, "%s: write", f->path);
	check(fsync(fd) == 0, "%s: fsync", f->path);
	close(fd);
}

void fixture_split(struct fixture *f, uint32_t n_nodes)
{
	check(n_nodes >= 2 && n_nodes <= FIXTURE_MAX_NODES && !f->n_nodes, "split into %u nodes",
	      n_nodes);
	const char *paths[] = {f->path};
	struct sidecar_error err = {0};
	for (uint32_t n = 0; n < n_nodes; n++)
		check(expert_map_init(&f->node_map[n], f->map.n_layers, f->map.n_experts, 1, paths,
		                      &err) == 0,
		      "%s", err.msg);
	for (uint32_t l = 0; l < f->map.n_layers; l++)
		for (uint32_t x = 0; x < f->map.n_experts; x++) {
			uint32_t k;
			const struct expert_extent *ext =
			    expert_map_extents(&f->map, l * f->map.n_experts + x, &k);
			for (uint32_t i = 0; i < k; i++)
				for (uint32_t n = 0; n < n_nodes; n++) {
					const uint64_t a = ext[i].length * n / n_nodes,
					               b = ext[i].length * (n + 1) / n_nodes;
					check(expert_map_add(&f->node_map[n], l, x, 0,
					                     ext[i].offset + a, b - a, &err) == 0,
					      "%s", err.msg);
				}
		}
	f->n_nodes = n_nodes;
}

static bool map_ref_matches(const struct fixture *f, const struct expert_map *map,
                            const struct expert_ref *ref);

bool fixture_held_matches(const struct fixture *f, const struct residency *r,
                          const struct expert_ref *ref)
{
	if (!f->n_nodes)
		return fixture_ref_matches(f, ref);
	for (uint32_t n = 0; n < f->n_nodes; n++) {
		struct expert_ref node;
		if (residency_ref_node(r, ref, n, &node) != 0 ||
		    !map_ref_matches(f, &f->node_map[n], &node))
			return false;
	}
	return true;
}

void fixture_destroy(struct fixture *f)
{
	unlink(f->path);
	rmdir(f->dir);
	for (uint32_t n = 0; n < f->n_nodes; n++)
		expert_map_free(&f->node_map[n]);
	expert_map_free(&f->map);
	free(f->bytes);
}

bool fixture_ref_matches(const struct fixture *f, const struct expert_ref *ref)
{
	return map_ref_matches(f, &f->map, ref);
}

static bool map_ref_matches(const struct fixture *f, const struct expert_map *map,
                            const struct expert_ref *ref)
{
	uint32_t n;
	uint32_t id = ref->layer * map->n_experts + ref->expert;
	const struct expert_extent *ext = expert_map_extents(map, id, &n);
	if (n != ref->n_extents)
		return false;
	/* Against pread of the file itself, not only what the fixture meant to write. */
	int fd = open(f->path, O_RDONLY);
	check(fd >= 0, "%s: open", f->path);
	bool same = true;
	for (uint32_t i = 0; i < n && same; i++) {
		uint8_t *buf = malloc(ext[i].length);
		check(buf != NULL, "out of memory");
		check(pread(fd, buf, ext[i].length, (off_t)ext[i].offset) == (ssize_t)ext[i].length,
		      "%s: pread", f->path);
		same = ref->length[i] == ext[i].length &&
		       memcmp(ref->data[i], buf, ext[i].length) == 0 &&
		       memcmp(buf, f->bytes + ext[i].offset, ext[i].length) == 0;
		free(buf);
	}
	close(fd);
	return same;
}

struct residency *fixture_residency(struct fixture *f, struct residency_config *cfg)
{
	return fixture_residency_held(f, cfg, NULL, NULL);
}

struct residency *fixture_residency_held(struct fixture *f, struct residency_config *cfg,
                                         loader_populate_fn hook, void *arg)
{
	struct residency *r;
	struct sidecar_error err = {0};
	struct residency_node nodes[FIXTURE_MAX_NODES];
	for (uint32_t n = 0; n < f->n_nodes; n++)
		nodes[n] = (struct residency_node){.map = &f->node_map[n], .numa_node = -1};
	const struct residency_node one = {
	    .map = &f->map, .numa_node = cfg->numa_node, .post_load_arg = cfg->post_load_arg};
	int rc = f->n_nodes
	             ? residency_create_nodes_held(&r, nodes, f->n_nodes, cfg, hook, arg, &err)
	             : residency_create_nodes_held(&r, &one, 1, cfg, hook, arg, &err);
	check(rc == 0, "residency_create: %s", err.msg);
	return r;
}
