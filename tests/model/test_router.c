/* test_router.c — the routers an engine can apply itself (router.h, bench_decode --hints
 * router): every MoE layer's ffn_gate_inp read back as the file holds it, and the top-k of the
 * next layer's router on a given input equal to a brute-force ranking of w·x in double. */
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "gguf.h"
#include "model_files.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "router.h"

Test(router, top_k_is_the_next_routers_best_on_the_input)
{
	char *dir = scratch_dir(), path[512];
	snprintf(path, sizeof(path), "%s/m.gguf", dir);
	struct moe_gen_options o = {.preset = "qwen3-30b-a3b",
	                            .out = path,
	                            .format = MOEK_Q8_0,
	                            .seed = 9,
	                            .layers = 3,
	                            .hidden = 256,
	                            .ffn = 256,
	                            .experts = 16};
	struct sidecar_error err;
	cr_assert_eq(moe_gen_write(&o, &err), 0, "%s", err.msg);
	struct moe_catalog *cat;
	cr_assert_eq(moe_catalog_open(path, &cat, &err), 0, "%s", err.msg);
	struct moe_router r;
	cr_assert_eq(moe_router_load(cat, &r, &err), 0, "%s", err.msg);
	cr_assert_eq(r.n_layers, cat->info.n_moe_layers);
	cr_assert_eq(r.n_experts, 16);
	cr_assert_eq(r.hidden, 256);

	struct gguf_file *g;
	cr_assert_eq(gguf_open(path, &g, &err), 0, "%s", err.msg);
	const int fd = open(path, O_RDONLY);
	cr_assert_geq(fd, 0);
	float *w = malloc(16 * 256 * sizeof(float)), x[256];
	uint64_t s = 77;
	for (uint32_t l = 0, m = 0; l < cat->info.n_layers; l++) {
		if (!cat->layers[l].moe)
			continue;
		char name[64];
		snprintf(name, sizeof(name), "blk.%u.ffn_gate_inp.weight", l);
		const struct gguf_tensor *t = gguf_find_tensor(g, name);
		cr_assert_not_null(t, "%s", name);
		cr_assert_eq(t->type, 0, "generated routers are F32");
		cr_assert_eq(pread(fd, w, t->nbytes, (off_t)t->offset), (ssize_t)t->nbytes);
		cr_assert_eq(memcmp(w, r.w + (size_t)m * 16 * 256, t->nbytes), 0, "layer %u", l);
		for (int trial = 0; trial < 20; trial++) {
			for (int i = 0; i < 256; i++) {
				s = s * 6364136223846793005ull + 1442695040888963407ull;
				x[i] = (float)((double)(s >> 40) / 16777216.0 - 0.5);
			}
			double logit[16];
			int order[16];
			for (int e = 0; e < 16; e++) {
				logit[e] = 0;
				for (int i = 0; i < 256; i++)
					logit[e] += (double)w[e * 256 + i] * x[i];
				order[e] = e;
			}
			for (int a = 0; a < 16; a++) /* selection sort, best first */
				for (int b = a + 1; b < 16; b++)
					if (logit[order[b]] > logit[order[a]]) {
						const int tmp = order[a];
						order[a] = order[b];
						order[b] = tmp;
					}
			int32_t ids[8];
			float probs[8];
			cr_assert_eq(moe_router_topk(&r, m, x, 8, ids, probs), 8);
			float sum = 0;
			for (int j = 0; j < 8; j++) {
				cr_assert_eq(ids[j], order[j], "layer %u trial %d rank %d", l,
				             trial, j);
				sum += probs[j];
				if (j)
					cr_assert_leq(probs[j], probs[j - 1]);
			}
			cr_assert_float_eq(sum, 1.0f, 1e-5f);
		}
		m++;
	}
	close(fd);
	free(w);
	gguf_close(g);
	moe_router_free(&r);
	moe_catalog_close(cat);
	remove_tree(dir);
}

Test(router, a_safetensors_model_is_refused_naming_it)
{
	char *dir = scratch_dir(), path[512];
	snprintf(path, sizeof(path), "%s/hf", dir);
	struct moe_gen_options o = {.preset = "qwen3-30b-a3b",
	                            .out = path,
	                            .format = MOEK_BF16,
	                            .seed = 9,
	                            .layers = 2,
	                            .hidden = 256,
	                            .ffn = 256,
	                            .experts = 4};
	struct sidecar_error err;
	cr_assert_eq(moe_gen_write(&o, &err), 0, "%s", err.msg);
	struct moe_catalog *cat;
	cr_assert_eq(moe_catalog_open(path, &cat, &err), 0, "%s", err.msg);
	struct moe_router r;
	cr_assert_neq(moe_router_load(cat, &r, &err), 0);
	cr_assert(strstr(err.msg, "is not a GGUF model"), "%s", err.msg);
	moe_catalog_close(cat);
	remove_tree(dir);
}
