/* fuzz_safetensors.c — libFuzzer target: st_open on arbitrary bytes must return a clear
 * error or a file whose tensors tile its data buffer; a file that opens is then given to the
 * catalog next to a fixed config.json (OLMoE, DeepSeek-V3 FP8, gpt-oss MXFP4, Llama-4's
 * fused input-major experts, MiniMax-M2 or Qwen3-MoE ModelOpt NVFP4, chosen by the tensor
 * names present), which must accept it with every extent inside the file (and a ModelOpt
 * per-tensor scale finite and positive), or reject it. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "catalog.h"
#include "fuzz_file.h"
#include "safetensors.h"

/* The seeds' configs (as in tests/fuzz/corpus/fuzz_json: 32 wide, 2 experts). */
#define N_CONFIGS 6
static const char *const configs[N_CONFIGS] = {
    "{\"model_type\":\"olmoe\",\"hidden_size\":32,\"num_hidden_layers\":1,"
    "\"num_experts_per_tok\":2,\"num_experts\":2,\"intermediate_size\":32}",
    "{\"model_type\":\"deepseek_v3\",\"hidden_size\":32,\"num_hidden_layers\":2,"
    "\"num_experts_per_tok\":2,\"n_routed_experts\":2,\"moe_intermediate_size\":32,"
    "\"first_k_dense_replace\":1,\"scoring_func\":\"sigmoid\"}",
    "{\"model_type\":\"gpt_oss\",\"hidden_size\":32,\"num_hidden_layers\":1,"
    "\"num_local_experts\":2,\"experts_per_token\":2,\"intermediate_size\":32}",
    "{\"model_type\":\"llama4\",\"text_config\":{\"hidden_size\":32,"
    "\"num_hidden_layers\":2,\"num_local_experts\":2,\"num_experts_per_tok\":1,"
    "\"intermediate_size\":32,\"interleave_moe_layer_step\":2}}",
    "{\"model_type\":\"minimax_m2\",\"hidden_size\":32,\"num_hidden_layers\":1,"
    "\"num_local_experts\":2,\"num_experts_per_tok\":2,\"intermediate_size\":32,"
    "\"scoring_func\":\"sigmoid\",\"use_routing_bias\":true}",
    /* ModelOpt NVFP4: rows of 64 (ggml's block) */
    "{\"model_type\":\"qwen3_moe\",\"hidden_size\":64,\"num_hidden_layers\":1,"
    "\"num_experts_per_tok\":2,\"num_experts\":2,\"moe_intermediate_size\":64,"
    "\"quantization_config\":{\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\","
    "\"group_size\":16}}",
};
static char dirs[N_CONFIGS][96];

static void remove_dirs(void)
{
	char p[160];
	for (int i = 0; i < N_CONFIGS; i++) {
		snprintf(p, sizeof(p), "%s/model.safetensors", dirs[i]);
		unlink(p);
		snprintf(p, sizeof(p), "%s/config.json", dirs[i]);
		unlink(p);
		rmdir(dirs[i]);
	}
}

static void make_dirs(const char *target)
{
	char p[160];
	for (int i = 0; i < N_CONFIGS; i++) {
		snprintf(dirs[i], sizeof(dirs[i]), "/tmp/moe-fuzz-st-%d-%d", (int)getpid(), i);
		if (mkdir(dirs[i], 0700))
			abort();
		snprintf(p, sizeof(p), "%s/config.json", dirs[i]);
		FILE *f = fopen(p, "w");
		if (!f || fputs(configs[i], f) < 0 || fclose(f))
			abort();
		snprintf(p, sizeof(p), "%s/model.safetensors", dirs[i]);
		if (symlink(target, p))
			abort();
	}
	atexit(remove_dirs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_file *f;
	struct sidecar_error err;
	const char *path = fuzz_input_path(data, size);
	if (st_open(path, &f, &err) == 0) {
		uint64_t covered = 0;
		int which = 0;
		for (uint64_t i = 0; i < f->n_tensors; i++) {
			const struct st_tensor *t = &f->tensors[i];
			if (t->offset < f->data_offset || t->offset + t->nbytes > size)
				__builtin_trap();
			covered += t->nbytes;
			if (strstr(t->name, "weight_scale_inv"))
				which = 1;
			if (strstr(t->name, "_blocks"))
				which = 2;
			if (strstr(t->name, "feed_forward.experts"))
				which = 3;
			if (strstr(t->name, "block_sparse_moe"))
				which = 4;
			if (strstr(t->name, "weight_scale_2"))
				which = 5;
		}
		if (covered != size - f->data_offset)
			__builtin_trap();
		st_close(f);

		if (!dirs[0][0])
			make_dirs(path);
		struct moe_catalog *cat;
		if (moe_catalog_open(dirs[which], &cat, &err) == 0) {
			for (uint32_t L = 0; L < cat->info.n_layers; L++)
				for (uint32_t e = 0; e < cat->info.n_experts; e++) {
					const struct moe_expert *x = moe_catalog_expert(cat, L, e);
					for (int p = 0; x && p < MOE_PROJ_COUNT; p++) {
						const struct moe_proj_ref *r = &x->proj[p];
						if (r->present &&
						    (r->data.offset + r->data.length > size ||
						     r->scale.offset + r->scale.length > size ||
						     r->zeros.offset + r->zeros.length > size ||
						     r->bias.offset + r->bias.length > size ||
						     (r->layout == MOE_LAYOUT_NVFP4_MODELOPT &&
						      !(r->tensor_scale > 0.0f &&
						        r->tensor_scale < INFINITY))))
							__builtin_trap();
					}
				}
			moe_catalog_close(cat);
		}
	}
	return 0;
}
