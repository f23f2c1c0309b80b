/* catalog.h — the expert catalog: where every routed expert's weights live on disk.
 *
 * moe_catalog_open() takes a model path — a .gguf file (or the first of its splits), a
 * .safetensors file, or a directory with config.json and *.safetensors (single, shards, or
 * model.safetensors.index.json) — and returns an immutable table:
 *
 *   files:  path and size of every file that holds weights (the loader opens these);
 *   model:  architecture and hyperparameters (layers, experts, top-k, dims, gating hints);
 *   layers: for every layer, whether it is an MoE layer (dense layers are skipped through
 *           leading_dense_block_count / first_k_dense_replace / mlp_only_layers /
 *           decoder_sparse_step) and, for MoE layers, one `moe_expert` per routed expert;
 *   expert: per projection (gate, up, down, or fused gate_up) the file, byte offset and
 *           length of its weights, their format (a moek_format id, see moe_kernels.h) and
 *           shape rows x cols, plus the scale and bias extents where the format or the
 *           architecture has them.
 *
 * Units: offsets and lengths are bytes within the named file. Shapes are those of the
 * matrix the kernel multiplies: `rows` outputs, each a contiguous row of `cols` inputs
 * (gate/up: rows = expert_ffn, cols = hidden; down: rows = hidden, cols = expert_ffn; fused
 * gate_up: rows = 2·expert_ffn). Shared experts and dense FFNs are not in the catalog (they
 * stay with the engine).
 *
 * Everything is validated on open (formats, shapes against the hyperparameters, extents
 * inside their files); a model the catalog accepts can be loaded by offset alone. Any
 * tensor in an unsupported format is an error naming it. The catalog is immutable after
 * open; read it from any thread. Close with moe_catalog_close.
 */
#ifndef MOE_CATALOG_H
#define MOE_CATALOG_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "quant_config.h"

enum moe_arch {
	MOE_ARCH_QWEN2MOE,
	MOE_ARCH_QWEN3MOE,
	MOE_ARCH_MIXTRAL,
	MOE_ARCH_DEEPSEEK, /* DeepSeek-V2 and V3 (GGUF "deepseek2") */
	MOE_ARCH_GPT_OSS,
	MOE_ARCH_OLMOE,
	MOE_ARCH_GLM4MOE,    /* GLM-4.5 / 4.6 (GGUF "glm4moe", model_type glm4_moe) */
	MOE_ARCH_MINIMAX_M2, /* MiniMax-M2 (GGUF "minimax-m2", model_type minimax_m2) */
	MOE_ARCH_LLAMA4,     /* Llama-4 Scout / Maverick (model_type llama4, llama4_text) */
	MOE_ARCH_QWEN3NEXT,  /* Qwen3-Next (GGUF "qwen3next", model_type qwen3_next) */
	MOE_ARCH_COUNT
};

/* An architecture's names: its family ("deepseek"), GGUF general.architecture ("deepseek2";
 * "llama" for Mixtral) and config.json model_type as written ("deepseek_v3"); "?" for none. */
const char *moe_arch_name(enum moe_arch a);
const char *moe_arch_gguf_name(enum moe_arch a);
const char *moe_arch_model_type(enum moe_arch a);
/* The architecture a GGUF general.architecture / a config.json model_type names ("deepseek_v2"
 * too); 0, or -1 when none. */
int moe_arch_from_gguf(const char *name, enum moe_arch *out);
int moe_arch_from_model_type(const char *model_type, enum moe_arch *out);

enum moe_proj { MOE_PROJ_GATE, MOE_PROJ_UP, MOE_PROJ_DOWN, MOE_PROJ_GATE_UP, MOE_PROJ_COUNT };

const char *moe_proj_name(enum moe_proj p);

/* How the rows of a fused gate_up projection are ordered. */
enum moe_gate_up_order {
	MOE_GATE_UP_HALVES,      /* rows [0, ffn) gate, [ffn, 2ffn) up (GGUF ffn_gate_up_exps) */
	MOE_GATE_UP_INTERLEAVED, /* even rows gate, odd rows up (gpt-oss Hugging Face) */
};

/* Where a weight's bytes are stored. */
enum moe_weight_layout {
	MOE_LAYOUT_BLOCKS,   /* the format's own block layout, as moek_row_bytes describes */
	MOE_LAYOUT_MXFP4_HF, /* MXFP4 split: `data` = _blocks (16 B per 32 weights, low nibble
	                        = even element), `scale` = _scales (1 E8M0 byte per 32) */
	/* INT4 checkpoints (format MOEK_INT4_G32 once repacked by moek_int4_from_ct/_gptq):
	 * compressed-tensors pack-quantized: `data` = weight_packed, `scale` = weight_scale
	 * (BF16); GPTQ and AWQ (`awq`: moek_int4_from_awq's packing): `data` = qweight,
	 * `scale` = scales (F16), `zeros` = qzeros */
	MOE_LAYOUT_INT4_CT,
	MOE_LAYOUT_INT4_GPTQ,
	/* F32/F16/BF16 stored input-major, [cols][rows] (Llama-4 Hugging Face experts:
	 * gate_up_proj [E, hidden, 2·ffn], down_proj [E, ffn, hidden]); transposed into rows
	 * at load (moek_transpose). A fused gate_up becomes MOE_GATE_UP_HALVES rows. */
	MOE_LAYOUT_TRANSPOSED,
	/* ModelOpt NVFP4 (format MOEK_NVFP4 once repacked by moek_nvfp4_from_modelopt): `data` =
	 * weight (E2M1 pairs), `scale` = weight_scale (E4M3 per 16); weight_scale_2 is read at
	 * open into tensor_scale */
	MOE_LAYOUT_NVFP4_MODELOPT,
};

/* Whether a layout is repacked at load into rows of another size than its data (the INT4
 * checkpoints, ModelOpt NVFP4): its data extent gets the room of moe_proj_kernel_bytes. */
static inline bool moe_layout_repacked(enum moe_weight_layout l)
{
	return l == MOE_LAYOUT_INT4_CT || l == MOE_LAYOUT_INT4_GPTQ ||
	       l == MOE_LAYOUT_NVFP4_MODELOPT || l == MOE_LAYOUT_TRANSPOSED;
}

/* A byte range in one of the catalog's files. length 0 = absent. */
struct moe_extent {
	uint32_t file;
	uint64_t offset;
	uint64_t length;
};

/* One projection of one expert. */
struct moe_proj_ref {
	bool present;
	uint32_t format; /* enum moek_format */
	enum moe_weight_layout layout;
	enum moe_gate_up_order order; /* MOE_PROJ_GATE_UP only */
	uint64_t rows, cols;
	struct moe_extent data;  /* the weights */
	struct moe_extent scale; /* FP8_E4M3_B128: f32 scale_inv per 128x128 block, row-major
	                            ceil(rows/128) x ceil(cols/128); MXFP4_HF: E8M0 bytes */
	struct moe_extent bias;  /* gpt-oss: `rows` values of format bias_format */
	uint32_t bias_format;    /* MOEK_F32 / MOEK_BF16 / MOEK_F16 */
	struct moe_extent zeros; /* MOE_LAYOUT_INT4_GPTQ: qzeros */
	uint32_t group;          /* INT4 layouts: the checkpoint's group size */
	bool gptq_v1;            /* MOE_LAYOUT_INT4_GPTQ: zeros stored minus one */
	bool awq;                /* MOE_LAYOUT_INT4_GPTQ: AutoAWQ GEMM qweight / qzeros */
	float tensor_scale; /* NVFP4_MODELOPT: weight_scale_2 (moek_matrix.tensor_scale); else 0 */
};

struct moe_expert {
	struct moe_proj_ref proj[MOE_PROJ_COUNT]; /* gate+up+down, or gate_up+down */
	uint64_t bytes;                           /* all extents of this expert together */
	bool aligned_4k; /* every extent starts on a 4096-byte boundary of its file */
};

struct moe_layer {
	bool moe;                   /* false: dense FFN layer, no experts */
	struct moe_expert *experts; /* n_experts entries when moe */
};

struct moe_file {
	char *path;
	uint64_t size;
};

enum moe_container { MOE_CONTAINER_GGUF, MOE_CONTAINER_SAFETENSORS };

enum moe_gating {
	MOE_GATING_SOFTMAX,      /* softmax over all experts, then top-k */
	MOE_GATING_SIGMOID,      /* sigmoid scores (DeepSeek-V3) */
	MOE_GATING_SOFTMAX_TOPK, /* top-k logits, softmax over the selected (gpt-oss) */
};

const char *moe_gating_name(enum moe_gating g);

struct moe_model_hparams {
	enum moe_arch arch; /* the family the catalog reads it as */
	char arch_name[32]; /* the file's own name for it: GGUF general.architecture ("deepseek2"),
	                       config.json model_type ("deepseek_v3") */
	enum moe_container container;
	uint32_t n_layers;     /* all transformer blocks */
	uint32_t n_moe_layers; /* blocks with routed experts */
	uint32_t n_experts;    /* routed experts per MoE layer */
	uint32_t top_k;        /* experts per token */
	uint32_t n_shared_experts;
	uint64_t hidden;     /* model (embedding) width */
	uint64_t expert_ffn; /* intermediate size of one routed expert */
	enum moe_gating gating;
	bool norm_topk_prob;  /* renormalise the selected weights to sum to 1 */
	float routed_scaling; /* applied by the engine; 1 if the model has none */
	float swiglu_limit;   /* gpt-oss clamp; 0 = plain SwiGLU */
	bool has_bias;        /* experts carry biases (gpt-oss) */
	/* Routing facts the engine applies (reported by inspect and STATS, never used here):
	 * score_bias: selection adds a per-expert bias to the scores (e_score_correction_bias,
	 * GGUF exp_probs_b; DeepSeek-V3, GLM-4.5, MiniMax-M2), the weights stay unbiased;
	 * n_group / topk_group: experts in n_group groups, the best topk_group kept (1, 1: no
	 * groups); shared_expert_gate: the shared expert's output is scaled by
	 * sigmoid(shared_expert_gate · x) (Qwen3-Next); nextn_layers: trailing multi-token
	 * prediction blocks counted in n_layers (GLM-4.5 GGUF). */
	bool score_bias;
	uint32_t n_group, topk_group;
	bool shared_expert_gate;
	uint32_t nextn_layers;
	/* Llama-4: the routing weight scales the expert's input (out = expert(w·x)), not its
	 * output; the kernels do so (moek_expert.weight_on_input). */
	bool weight_on_input;
	uint32_t moe_layer_step; /* MoE every step-th block (Llama-4 interleave); 1 otherwise */
};

struct moe_catalog {
	struct moe_model_hparams info;
	uint32_t n_files;
	struct moe_file *files;
	struct moe_layer *layers;    /* info.n_layers entries */
	uint64_t expert_bytes_total; /* sum of moe_expert.bytes over all experts */
	uint32_t n_formats;          /* distinct weight formats of the experts … */
	uint32_t formats[8];         /* … (moek_format ids), in first-seen order */
	uint64_t n_experts_aligned_4k;
	struct moe_quant_config quant; /* config.json's INT4 scheme (MOE_QUANT_NONE: none) */
};

/* Bytes a projection takes once in the kernels' layout: its data, except Hugging Face MXFP4
 * (blocks + scales become GGUF blocks) and INT4 checkpoints (repacked into INT4_G32 rows). */
uint64_t moe_proj_kernel_bytes(const struct moe_proj_ref *r);

int moe_catalog_open(const char *path, struct moe_catalog **out, struct sidecar_error *err);
void moe_catalog_close(struct moe_catalog *cat);

/* Expert `expert` of layer `layer`, or NULL if the layer is dense or either is out of
 * range. */
const struct moe_expert *moe_catalog_expert(const struct moe_catalog *cat, uint32_t layer,
                                            uint32_t expert);

/* Display name of a catalog format id ("Q4_K", "MXFP4", "FP8_E4M3_B128" …). */
const char *moe_format_name(uint32_t format);

#endif
