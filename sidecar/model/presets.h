/* presets.h — the shapes of the real MoE models that moe-gen generates and that
 * `simulate --generate` draws routing traces for: one table, so both take the same names.
 *
 * A row holds what each model's published config.json says about its experts and the rest of
 * its architecture; tools pick the parts they need (moe-gen every field, the trace generator
 * layers, experts and top-k).
 * Names are what users type; an alias is an older name still accepted.
 */
#ifndef MOE_MODEL_PRESETS_H
#define MOE_MODEL_PRESETS_H

#include <stddef.h>
#include <stdint.h>

#include "catalog.h"

struct moe_model_preset {
	const char *name;  /* "qwen3-30b-a3b", … */
	const char *alias; /* an older name that still finds this row, or NULL */
	enum moe_arch arch;
	uint32_t full_layers; /* transformer blocks of the real model */
	uint32_t n_experts, top_k, n_shared;
	uint64_t hidden, expert_ffn, dense_ffn;
	uint32_t leading_dense; /* dense blocks before the first MoE block (DeepSeek: 3) */
	uint32_t moe_step;      /* MoE every moe_step-th block (Llama-4 Maverick: 2); 0 = 1 */
	/* the rest of the architecture (moe-gen --full-model), from the same config.json */
	uint32_t heads, kv_heads, head_dim; /* DeepSeek: head_dim = qk_nope = v_head_dim */
	uint32_t q_lora_rank, kv_lora_rank, rope_dim; /* MLA ranks (DeepSeek only), RoPE dims */
	uint32_t max_positions;
	double rope_theta, rms_eps;
};

/* Every preset; the last row has name NULL. */
extern const struct moe_model_preset moe_model_presets[];

/* The preset called `name` (or whose alias it is), or NULL. */
const struct moe_model_preset *moe_model_preset_find(const char *name);

/* The names, separated by sep ("qwen3-30b-a3b, mixtral-8x7b, …"), into buf (truncated to
 * fit, always NUL-terminated). For help texts and "unknown preset" errors. */
void moe_model_preset_names(char *buf, size_t len, const char *sep);

#endif
