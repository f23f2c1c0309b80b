/* moe_gen.h — the test-model generator (libmoe_gen; CLI tools/moe_gen_main.c, `moe-gen`).
 *
 * Writes Mixture-of-Experts models as real GGUF files (the architecture's llama.cpp metadata
 * keys and tensor names) or real Hugging Face checkpoints (config.json + safetensors,
 * optionally sharded with model.safetensors.index.json), with expert shapes from a preset of
 * a real model (sidecar/model/presets.h, the table `simulate --generate` shares). Weights are
 * deterministic from (seed, layer, expert, tensor): quantized formats are produced by the
 * kernels' reference quantizer (moek_quantize) from the floats moe_gen_floats() regenerates,
 * so readers and kernels can be checked against the originals.
 *
 * Which container: `out` ending in ".gguf" → GGUF (with shards: PREFIX-0000i-of-0000N.gguf);
 * anything else is a directory that receives config.json and the safetensors files.
 * Tensors are filled and quantized by a pool of threads while a writer thread writes the
 * previous 8 MiB; the bytes written are the same for any thread count.
 * Formats by container: GGUF takes every weight format of the kernels' table but FP8 (and
 * the K-quant mixes, moe_gen_mix); safetensors
 * takes F32 F16 BF16 FP8_E4M3_B128 (weight_scale_inv), INT4 checkpoints (moe_gen_int4:
 * compressed-tensors pack-quantized or GPTQ, format INT4_G32, experts-only models) and, for
 * gpt-oss only, MXFP4 in the _blocks/_scales layout (gpt-oss checkpoints ship only that).
 * Other pairs are an error.
 */
#ifndef MOE_GEN_H
#define MOE_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "error.h"
#include "presets.h"

/* Blocks generated when neither --layers nor --full says otherwise. */
#define MOE_GEN_DEFAULT_LAYERS 2u

/* llama.cpp's K-quant and i-quant mixes, as its quantizer assigns types to expert tensors (the
 * rule is moe_gen_mix_format's; docs/formats.md states it). GGUF only. */
enum moe_gen_mix {
	MOE_GEN_MIX_NONE = 0, /* every expert tensor in moe_gen_options.format */
	MOE_GEN_MIX_Q4_K_M,
	MOE_GEN_MIX_Q3_K_M,
	MOE_GEN_MIX_Q2_K,
	MOE_GEN_MIX_IQ2_XXS,
	MOE_GEN_MIX_IQ2_XS,
	MOE_GEN_MIX_IQ3_XXS,
	MOE_GEN_MIX_IQ1_S,
	MOE_GEN_MIX_IQ1_M,
	MOE_GEN_MIX_IQ2_S,
	MOE_GEN_MIX_IQ2_M,
	MOE_GEN_MIX_LAST = MOE_GEN_MIX_IQ2_M,
};

/* The INT4 checkpoint encoding of format MOEK_INT4_G32 (safetensors only). */
enum moe_gen_int4 {
	MOE_GEN_INT4_NONE = 0,
	MOE_GEN_INT4_CT,   /* compressed-tensors pack-quantized, symmetric, BF16 scales */
	MOE_GEN_INT4_GPTQ, /* GPTQ v1 (checkpoint_format "gptq"), sym, desc_act false */
	MOE_GEN_INT4_AWQ,  /* AutoAWQ GEMM, zero points (asymmetric min-max), F16 scales */
};

struct moe_gen_options {
	const char *preset; /* a name or alias from presets.h */
	const char *out;
	uint32_t format;      /* moek_format id (ignored with a mix) */
	enum moe_gen_mix mix; /* per-tensor formats instead of `format` */
	uint64_t seed;
	uint32_t layers; /* 0: MOE_GEN_DEFAULT_LAYERS (full_layers with `full`) */
	bool full;
	uint64_t hidden;    /* 0: preset value */
	uint64_t ffn;       /* 0: preset value */
	uint32_t experts;   /* 0: preset value */
	uint32_t shards;    /* 0 or 1: one file */
	bool per_expert;    /* GGUF: legacy 2-D tensors blk.N.ffn_gate.E.weight */
	bool fused_gate_up; /* GGUF: blk.N.ffn_gate_up_exps.weight (gate rows, then up rows) */
	bool progress;      /* draw a progress bar on stderr */
	uint32_t alignment; /* GGUF general.alignment (power of two); 0: 32, ggml's default */
	uint32_t threads;   /* threads filling and quantizing tensors (the output does not depend
	                     * on it); 0: the online CPUs, at most MOE_GEN_MAX_THREADS */
	/* --full-model: also every non-expert tensor under the architecture's real names
	 * (embeddings, attention, norms, router biases, shared experts, dense layers, lm_head),
	 * with a whole config.json or the llama.cpp keys and a byte-level tokenizer. The
	 * experts are the same bytes as without it. 0 below: scaled from the preset. */
	bool full_model;
	uint32_t vocab;         /* 0: 4096 (at least 257: 256 byte tokens + <|endoftext|>) */
	uint32_t heads;         /* attention heads */
	uint32_t kv_heads;      /* key/value heads (a divisor of heads) */
	uint32_t head_dim;      /* per head (DeepSeek: qk_nope = v_head_dim) */
	enum moe_gen_int4 int4; /* format MOEK_INT4_G32: which checkpoint encoding */
	uint32_t group;         /* INT4 group size; 0: 32 (compressed-tensors), 128 (GPTQ);
	                         * MOE_GEN_GROUP_ROW: one group per row */
};

/* moe_gen_options.group: one group spanning each row (GPTQ group_size -1, compressed-tensors
 * strategy "channel"): one scale (and zero) per output. */
#define MOE_GEN_GROUP_ROW UINT32_MAX

#define MOE_GEN_MAX_THREADS 64

/* Generates the model. Returns 0, or -1 with err naming what was wrong (bad option, format
 * not representable in the container, shapes not fitting the format's block, I/O error). */
int moe_gen_write(const struct moe_gen_options *opt, struct sidecar_error *err);

/* The mix's name as llama.cpp spells its file type ("Q4_K_M"), or NULL for none/unknown. */
const char *moe_gen_mix_name(enum moe_gen_mix mix);
/* The mix named `name` (any case: "q4_k_m", "Q3_K_M", "q2_k", "iq2_xxs"); 0, or -1 if none is. */
int moe_gen_mix_parse(const char *name, enum moe_gen_mix *out);
/* llama.cpp's general.file_type of the mix (LLAMA_FTYPE_MOSTLY_*), 0 for none. */
uint32_t moe_gen_mix_file_type(enum moe_gen_mix mix);

/* What a generated value belongs to. */
enum moe_gen_tensor {
	MOE_GEN_GATE,
	MOE_GEN_UP,
	MOE_GEN_DOWN,
	MOE_GEN_GATE_BIAS,
	MOE_GEN_UP_BIAS,
	MOE_GEN_DOWN_BIAS,
	MOE_GEN_ROUTER,
	/* --full-model (expert = 0; the global tensors use layer = 0) */
	MOE_GEN_EMBED,      /* vocab x hidden */
	MOE_GEN_LM_HEAD,    /* vocab x hidden */
	MOE_GEN_NORM_ATTN,  /* the layer's input norm */
	MOE_GEN_NORM_FFN,   /* the norm before the MoE block (post_attention_layernorm) */
	MOE_GEN_NORM_FINAL, /* model.norm / output_norm */
	MOE_GEN_NORM_Q,     /* q_norm (Qwen3: per head, OLMoE: whole q) */
	MOE_GEN_NORM_K,
	MOE_GEN_NORM_Q_A, /* DeepSeek q_a_layernorm */
	MOE_GEN_NORM_KV_A,
	MOE_GEN_ATTN_Q, /* out x in, as the Linear layer's weight */
	MOE_GEN_ATTN_K,
	MOE_GEN_ATTN_V,
	MOE_GEN_ATTN_O,
	MOE_GEN_ATTN_Q_A, /* DeepSeek MLA */
	MOE_GEN_ATTN_Q_B,
	MOE_GEN_ATTN_KV_A,
	MOE_GEN_ATTN_KV_B,
	MOE_GEN_ATTN_Q_BIAS, /* gpt-oss */
	MOE_GEN_ATTN_K_BIAS,
	MOE_GEN_ATTN_V_BIAS,
	MOE_GEN_ATTN_O_BIAS,
	MOE_GEN_ATTN_SINKS,
	MOE_GEN_ROUTER_BIAS, /* gpt-oss router.bias, DeepSeek e_score_correction_bias */
	MOE_GEN_FFN_GATE,    /* a dense layer's FFN, or the layer's shared experts */
	MOE_GEN_FFN_UP,
	MOE_GEN_FFN_DOWN,
};

/* The float originals: elements [first, first+n) of the row-major matrix (gate/up: ffn x
 * hidden, down: hidden x ffn; biases: a vector; router: n_experts x hidden, expert = 0) of
 * `which` for (seed, layer, expert). Values lie in [-1, 1) scaled by 1/sqrt(cols) for
 * matrices (so each output of x·W keeps x's scale), by 0.1 for biases, by 1 for embeddings
 * and attention sinks; norm weights lie in [1 - 1/16, 1 + 1/16). Pure and thread-safe.
 * `cols` is the matrix's row length (for the scale); pass 1 for vectors. */
/* The format `mix` gives expert projection `which` (MOE_GEN_GATE, MOE_GEN_UP or MOE_GEN_DOWN)
 * of transformer block `layer` of n_layers blocks. gate and up always share a format. */
uint32_t moe_gen_mix_format(enum moe_gen_mix mix, enum moe_gen_tensor which, uint32_t layer,
                            uint32_t n_layers);

void moe_gen_floats(uint64_t seed, uint32_t layer, uint32_t expert, enum moe_gen_tensor which,
                    uint64_t cols, uint64_t first, size_t n, float *out);

#endif
