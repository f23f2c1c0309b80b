/* presets.c — the model preset table (see presets.h). */
#include "presets.h"

#include <stdio.h>
#include <string.h>

/* From each model's published config.json (GLM-4.5 counts 92 blocks without its
 * multi-token-prediction block; Llama-4's are text_config's; Qwen3-Next's attention is
 * hybrid, the rows keep its full-attention heads) (DeepSeek-V3's head_dim is its qk_nope_head_dim
 * = v_head_dim, its rope_dim qk_rope_head_dim). One row per model, a line per concern: the
 * name; blocks and experts; FFN widths; attention (heads, head and RoPE dims, DeepSeek's MLA
 * ranks); positions and norms. */
/* clang-format off */
const struct moe_model_preset moe_model_presets[] = {
    {.name = "qwen3-30b-a3b", .arch = MOE_ARCH_QWEN3MOE,
     .full_layers = 48, .n_experts = 128, .top_k = 8,
     .hidden = 2048, .expert_ffn = 768, .dense_ffn = 6144,
     .heads = 32, .kv_heads = 4, .head_dim = 128, .rope_dim = 128,
     .max_positions = 40960, .rope_theta = 1e6, .rms_eps = 1e-6},
    {.name = "mixtral-8x7b", .alias = "mixtral", .arch = MOE_ARCH_MIXTRAL,
     .full_layers = 32, .n_experts = 8, .top_k = 2,
     .hidden = 4096, .expert_ffn = 14336, .dense_ffn = 14336,
     .heads = 32, .kv_heads = 8, .head_dim = 128, .rope_dim = 128,
     .max_positions = 32768, .rope_theta = 1e6, .rms_eps = 1e-5},
    {.name = "deepseek-v3", .arch = MOE_ARCH_DEEPSEEK,
     .full_layers = 61, .n_experts = 256, .top_k = 8, .n_shared = 1, .leading_dense = 3,
     .hidden = 7168, .expert_ffn = 2048, .dense_ffn = 18432,
     .heads = 128, .kv_heads = 128, .head_dim = 128, .rope_dim = 64,
     .q_lora_rank = 1536, .kv_lora_rank = 512,
     .max_positions = 163840, .rope_theta = 10000, .rms_eps = 1e-6},
    {.name = "gpt-oss-20b", .arch = MOE_ARCH_GPT_OSS,
     .full_layers = 24, .n_experts = 32, .top_k = 4,
     .hidden = 2880, .expert_ffn = 2880, .dense_ffn = 2880,
     .heads = 64, .kv_heads = 8, .head_dim = 64, .rope_dim = 64,
     .max_positions = 131072, .rope_theta = 150000, .rms_eps = 1e-5},
    {.name = "olmoe", .arch = MOE_ARCH_OLMOE,
     .full_layers = 16, .n_experts = 64, .top_k = 8,
     .hidden = 2048, .expert_ffn = 1024, .dense_ffn = 1024,
     .heads = 16, .kv_heads = 16, .head_dim = 128, .rope_dim = 128,
     .max_positions = 4096, .rope_theta = 10000, .rms_eps = 1e-5},
    {.name = "glm-4.5", .arch = MOE_ARCH_GLM4MOE,
     .full_layers = 92, .n_experts = 160, .top_k = 8, .n_shared = 1, .leading_dense = 3,
     .hidden = 5120, .expert_ffn = 1536, .dense_ffn = 12288,
     .heads = 96, .kv_heads = 8, .head_dim = 128, .rope_dim = 64,
     .max_positions = 131072, .rope_theta = 1e6, .rms_eps = 1e-5},
    {.name = "glm-4.5-air", .arch = MOE_ARCH_GLM4MOE,
     .full_layers = 46, .n_experts = 128, .top_k = 8, .n_shared = 1, .leading_dense = 1,
     .hidden = 4096, .expert_ffn = 1408, .dense_ffn = 10944,
     .heads = 96, .kv_heads = 8, .head_dim = 128, .rope_dim = 64,
     .max_positions = 131072, .rope_theta = 1e6, .rms_eps = 1e-5},
    {.name = "minimax-m2", .arch = MOE_ARCH_MINIMAX_M2,
     .full_layers = 62, .n_experts = 256, .top_k = 8,
     .hidden = 3072, .expert_ffn = 1536, .dense_ffn = 1536,
     .heads = 48, .kv_heads = 8, .head_dim = 128, .rope_dim = 64,
     .max_positions = 196608, .rope_theta = 5e6, .rms_eps = 1e-6},
    {.name = "llama4-scout", .arch = MOE_ARCH_LLAMA4,
     .full_layers = 48, .n_experts = 16, .top_k = 1, .n_shared = 1, .moe_step = 1,
     .hidden = 5120, .expert_ffn = 8192, .dense_ffn = 16384,
     .heads = 40, .kv_heads = 8, .head_dim = 128, .rope_dim = 128,
     .max_positions = 10485760, .rope_theta = 5e5, .rms_eps = 1e-5},
    {.name = "llama4-maverick", .arch = MOE_ARCH_LLAMA4,
     .full_layers = 48, .n_experts = 128, .top_k = 1, .n_shared = 1, .moe_step = 2,
     .hidden = 5120, .expert_ffn = 8192, .dense_ffn = 16384,
     .heads = 40, .kv_heads = 8, .head_dim = 128, .rope_dim = 128,
     .max_positions = 1048576, .rope_theta = 5e5, .rms_eps = 1e-5},
    {.name = "qwen3-next-80b-a3b", .alias = "qwen3-next", .arch = MOE_ARCH_QWEN3NEXT,
     .full_layers = 48, .n_experts = 512, .top_k = 10, .n_shared = 1,
     .hidden = 2048, .expert_ffn = 512, .dense_ffn = 5120,
     .heads = 16, .kv_heads = 2, .head_dim = 256, .rope_dim = 64,
     .max_positions = 262144, .rope_theta = 1e7, .rms_eps = 1e-6},
    {.name = NULL},
};
/* clang-format on */

const struct moe_model_preset *moe_model_preset_find(const char *name)
{
	for (const struct moe_model_preset *p = moe_model_presets; p->name; p++)
		if (!strcmp(p->name, name) || (p->alias && !strcmp(p->alias, name)))
			return p;
	return NULL;
}

void moe_model_preset_names(char *buf, size_t len, const char *sep)
{
	size_t used = 0;
	if (len)
		buf[0] = '\0';
	for (const struct moe_model_preset *p = moe_model_presets; p->name && used < len; p++) {
		int n = snprintf(buf + used, len - used, "%s%s", p == moe_model_presets ? "" : sep,
		                 p->name);
		if (n < 0)
			break;
		used += (size_t)n;
	}
}
