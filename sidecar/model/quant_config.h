/* quant_config.h — the INT4 scheme a Hugging Face checkpoint's config.json declares.
 *
 * Reads `quantization_config` and says which INT4 encoding the expert tensors use, if any:
 *   compressed-tensors `pack-quantized` (Kimi-K2): symmetric integer weights of 4 bits in
 *     groups (`strategy` "group", `group_size`), tensors `.weight_packed`, `.weight_scale`
 *     (BF16) and `.weight_shape`;
 *   GPTQ (`quant_method` "gptq", `bits` 4, `desc_act` false): `.qweight`, `.qzeros`,
 *     `.scales` (F16), `.g_idx`; `checkpoint_format` "gptq" (v1, zeros stored minus one, the
 *     default) or "gptq_v2".
 * FP8 and MXFP4 checkpoints (`quant_method` "fp8", "mxfp4") are told apart by their tensors'
 * dtypes, so they read as MOE_QUANT_NONE here, as does a config without the key.
 *
 * Anything else is refused with one line naming what was found (an asymmetric or 8-bit
 * compressed-tensors scheme, a group size that is not a multiple of 32, activation order,
 * another quant_method). Whether the group divides each row is checked per tensor by the
 * catalog. Pure: no I/O; the document is the caller's.
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
};

struct moe_quant_config {
	enum moe_quant_kind kind;
	uint32_t group; /* elements per scale group (a multiple of 32) */
	bool gptq_v1;   /* GPTQ: zeros stored minus one (checkpoint_format "gptq") */
	bool sym;       /* GPTQ: symmetric (informational: the zeros say it either way) */
};

/* Fills *q from config.json's root object (config_path names it in errors). Returns 0, or -1
 * with the reason in err. */
int moe_quant_config_read(const struct json_doc *config, const char *config_path,
                          struct moe_quant_config *q, struct sidecar_error *err);

/* "compressed-tensors pack-quantized INT4, group 32", "GPTQ INT4 v1, group 128, sym", or
 * "none" into buf; returns buf. */
const char *moe_quant_config_describe(const struct moe_quant_config *q, char *buf, size_t len);

#endif
