/* test_catalog_e2e.c — end to end: models written by the generator (libmoe_gen) as GGUF and
 * as sharded safetensors, read through the catalog, adapted to an expert map, and loaded by
 * the residency loader under a budget smaller than the model: every extent of every expert
 * byte-exact against pread of the catalog's file and offset. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "catalog_adapter.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "residency.h"

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void load_everything(const char *preset, uint32_t format, const char *leaf, uint32_t shards,
                            uint64_t hidden, uint64_t ffn, bool expect_bias)
{
	char dir[] = "/tmp/moe-residency-e2e.XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char out[256];
	snprintf(out, sizeof(out), "%s/%s", dir, leaf);
	struct moe_gen_options opt = {
	    .preset = preset,
	    .out = out,
	    .format = format,
	    .seed = 7,
	    .layers = 2,
	    .hidden = hidden,
	    .ffn = ffn,
	    .experts = 8,
	    .shards = shards,
	};
	struct sidecar_error merr = {0};
	cr_assert_eq(moe_gen_write(&opt, &merr), 0, "moe_gen_write: %s", merr.msg);
	struct moe_catalog *cat;
	cr_assert_eq(moe_catalog_open(out, &cat, &merr), 0, "catalog: %s", merr.msg);

	struct expert_map map;
	struct expert_extent_roles roles;
	uint32_t model_layer[64];
	struct sidecar_error err = {0};
	cr_assert_eq(expert_map_from_catalog(cat, &map, &roles, model_layer, &err), 0, "%s",
	             err.msg);
	cr_assert_eq(map.n_layers, cat->info.n_moe_layers);
	cr_assert_eq(map.n_experts, 8);
	cr_assert_eq(roles.bias[MOE_PROJ_DOWN] >= 0, expect_bias);
	cr_assert(roles.data[MOE_PROJ_DOWN] >= 0);

	/* Room for about three experts: loads evict. */
	uint64_t largest = 0;
	for (uint32_t l = 0; l < map.n_layers; l++)
		for (uint32_t x = 0; x < 8; x++) {
			uint64_t b = moe_catalog_expert(cat, model_layer[l], x)->bytes;
			largest = b > largest ? b : largest;
		}
	struct residency_config cfg = {
	    .numa_node = 0,
	    .mem_budget = 3 * (largest + 8 * 8192),
	    .policy = "sieve+layer",
	    .chunk_bytes = 64 * 1024,
	};
	struct residency *r;
	cr_assert_eq(residency_create(&r, &map, &cfg, &err), 0, "%s", err.msg);
	for (int round = 0; round < 2; round++)
		for (uint32_t l = 0; l < map.n_layers; l++)
			for (uint32_t x = 0; x < 8; x++) {
				struct expert_ref ref;
				int rc = residency_acquire(r, l, x, 1.0f, 0, &ref);
				residency_error_message(r, l, x, err.msg, sizeof(err.msg));
				cr_assert_eq(rc, 0, "%s layer %u expert %u: %s", leaf, l, x,
				             err.msg);
				const struct moe_expert *e =
				    moe_catalog_expert(cat, model_layer[l], x);
				const struct moe_extent *d = &e->proj[MOE_PROJ_DOWN].data;
				int8_t i = roles.data[MOE_PROJ_DOWN];
				cr_assert_eq(ref.length[i], d->length);
				/* Every extent against pread of its file. */
				uint32_t n;
				const struct expert_extent *ext =
				    expert_map_extents(&map, l * 8 + x, &n);
				cr_assert_eq(ref.n_extents, n);
				for (uint32_t k = 0; k < n; k++) {
					int fd = open(cat->files[ext[k].file].path, O_RDONLY);
					cr_assert_geq(fd, 0);
					uint8_t *buf = malloc(ext[k].length);
					cr_assert_eq(
					    pread(fd, buf, ext[k].length, (off_t)ext[k].offset),
					    (ssize_t)ext[k].length);
					cr_assert_eq(memcmp(buf, ref.data[k], ext[k].length), 0,
					             "%s layer %u expert %u extent %u differs",
					             leaf, l, x, k);
					free(buf);
					close(fd);
				}
				residency_release(r, &ref);
			}
	struct residency_counters c;
	residency_counters(r, &c);
	cr_assert_eq(c.failures, 0);
	cr_assert_gt(c.evictions, 0, "the budget should force evictions");
	cr_assert_leq((uint64_t)c.slots * c.slot_bytes, c.budget_bytes);
	residency_destroy(r);
	expert_map_free(&map);
	moe_catalog_close(cat);
	nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

Test(residency_e2e, gguf_q4_k)
{
	load_everything("qwen3-30b-a3b", MOEK_Q4_K, "model.gguf", 1, 256, 256, false);
}

Test(residency_e2e, safetensors_bf16_sharded)
{
	load_everything("mixtral-8x7b", MOEK_BF16, "hf", 2, 64, 96, false);
}

Test(residency_e2e, safetensors_gpt_oss_mxfp4_with_scales_and_biases)
{
	load_everything("gpt-oss-20b", MOEK_MXFP4, "hf", 1, 64, 64, true);
}
