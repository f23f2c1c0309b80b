/* quant_config.h — the INT4 scheme a Hugging Face checkpoint's config.json declares, and the
 * tensor shapes it implies.
 *
 * Reads `quantization_config` and says which INT4 encoding the expert tensors use, if any:
 *   compressed-tensors `pack-quantized` (Kimi-K2): symmetric integer weights of 4 bits in
 *     groups (`strategy` "group", `group_size`) or one group per output row (`strategy`
 *     "channel"), tensors `.weight_packed`, `.weight_scale` (BF16) and `.weight_shape`;
 *   GPTQ (`quant_method` "gptq", `bits` 4, `desc_act` false, `group_size` G or -1 for one
 *     group per row): `.qweight`, `.qzeros`, `.scales` (F16), `.g_idx`; `checkpoint_format`
 *     "gptq" (v1, zeros stored minus one, the default) or "gptq_v2";
 *   AWQ (`quant_method` "awq", `bits` 4, `group_size` G, `zero_point` true, `version` "gemm" —
 *     any case; missing reads as gemm, AutoAWQ's default): AutoAWQ's GEMM packing, `.qweight`
 *     I32 [in, out/8] and `.qzeros` I32 [in/G, out/8] in AWQ's nibble order, `.scales` F16
 *     [in/G, out]. GEMV and the other versions pack differently and are refused, as are
 *     zero_point false and a group of -1;
 *   NVIDIA ModelOpt NVFP4 (`quant_method` "modelopt" with `quant_algo` "NVFP4", in config.json,
 *     or hf_quant_config.json's `quantization` object with `quant_algo` "NVFP4"; `group_size`
 *     16 where given): per projection `.weight` U8 [out, in/2] (E2M1 pairs), `.weight_scale`
 *     F8_E4M3 [out, in/16], `.weight_scale_2` F32 (one per tensor) and `.input_scale` F32
 *     (the activations' calibration scale: unused, the sidecar quantizes its activations
 *     itself). Other quant_algo values (FP8, MXFP8, W4A8 …) are refused by name.
 * FP8 and MXFP4 checkpoints (`quant_method` "fp8", "mxfp4") are told apart by their tensors'
 * dtypes, so they read as MOE_QUANT_NONE here, as does a config without the key.
 *
 * Anything else is refused with one line naming what was found (an asymmetric or 8-bit
 * compressed-tensors scheme, a group size that is not a positive multiple of 32 — checked as
 * a double before any conversion —, activation order, another quant_method). Whether the
 * group divides each row is checked per tensor (moe_quant_layout_of). Pure: no I/O; the
 * document is the caller's.
 */
#ifndef MOE_QUANT_CONFIG_H
#define MOE_QUANT_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "json.h"

enum moe_quant_kind {
	MOE_QUANT_NONE,    /* no INT4 scheme: plain, FP8 or MXFP4 tensors */
	MOE_QUANT_INT4_CT, /* compressed-tensors pack-quantized, symmetric */
	MOE_QUANT_GPTQ,    /* GPTQ INT4, desc_act false */
	MOE_QUANT_AWQ,     /* AutoAWQ GEMM INT4 with zero points */
	MOE_QUANT_NVFP4,   /* NVIDIA ModelOpt NVFP4 (group 16, per-tensor weight_scale_2) */
};

struct moe_quant_config {
	enum moe_quant_kind kind;
	uint32_t group; /* elements per scale group (a multiple of 32); 0 when per_row */
	bool per_row;   /* one group spanning each row: GPTQ -1, compressed-tensors "channel" */
	bool gptq_v1;   /* GPTQ: zeros stored minus one (checkpoint_format "gptq") */
	bool sym;       /* GPTQ: symmetric (informational: the zeros say it either way) */
};

/* The checkpoint tensors of one INT4 projection of `rows` outputs by `cols` inputs, each
 * shape outermost first (as safetensors lists it). */
struct moe_quant_layout {
	uint32_t group;      /* this projection's group: q->group, or cols when per row */
	uint64_t weights[2]; /* weight_packed [rows, cols/8] | qweight [cols/8, rows] | AWQ
	                        qweight [cols, rows/8] */
	uint64_t scales[2];  /* weight_scale [rows, cols/group] | scales [cols/group, rows] */
	uint64_t zeros[2];   /* GPTQ, AWQ qzeros [cols/group, rows/8]; compressed-tensors {0, 0} */
};

/* Fills *q from config.json's root object (config_path names it in errors). Returns 0, or -1
 * with the reason in err. */
int moe_quant_config_read(const struct json_doc *config, const char *config_path,
                          struct moe_quant_config *q, struct sidecar_error *err);

/* hf_quant_config.json (ModelOpt's own file, read where config.json has no
 * quantization_config): its `quantization` object into *q as above. Returns 0, or -1 with the
 * reason in err. */
int moe_quant_config_read_modelopt(const struct json_doc *doc, const char *path,
                                   struct moe_quant_config *q, struct sidecar_error *err);

/* The tensor shapes of a rows x cols projection under q (an INT4 kind: not NONE or NVFP4).
 * Returns 0, or -1 with a sentence in why when the scheme cannot describe it: the group does
 * not divide the row, a row (per-row groups) is not a multiple of 32 wide, or (GPTQ) the
 * outputs are not a multiple of 8. */
int moe_quant_layout_of(const struct moe_quant_config *q, uint64_t rows, uint64_t cols,
                        struct moe_quant_layout *l, char *why, size_t why_len);

/* "compressed-tensors pack-quantized INT4, group 32", "GPTQ INT4 v1, group 128, sym",
 * "GPTQ INT4 v1, one group per row, sym", "AWQ INT4 GEMM, group 128, zero point" or "none"
 * into buf; returns buf. */
const char *moe_quant_config_describe(const struct moe_quant_config *q, char *buf, size_t len);

#endif
