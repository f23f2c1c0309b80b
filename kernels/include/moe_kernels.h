/* moe_kernels.h — CPU expert kernels and weight formats (libmoe_kernels).
 *
 * A library of its own: no I/O, no IPC, no threads, no allocation inside any function.
 * Owns: the weight-format table (one row per format: block size, bytes, reference
 * quantizer/dequantizer, SIMD paths picked at run time), activation dtype conversion, and the
 * expert FFN (SwiGLU and gpt-oss clamped SwiGLU).
 *
 * Format ids equal ggml's type ids where ggml has the format, so a GGUF tensor type maps
 * directly; FP8 E4M3 with 128x128 block scales (DeepSeek-V3) has an id of its own.
 */
#ifndef MOE_KERNELS_H
#define MOE_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum moek_format {
	MOEK_F32 = 0,
	MOEK_F16 = 1,
	MOEK_Q4_0 = 2,
	MOEK_Q8_0 = 8,
	MOEK_Q4_K = 12,
	MOEK_Q5_K = 13,
	MOEK_Q6_K = 14,
	MOEK_Q8_K = 15, /* activation format for K-quant dot products only */
	MOEK_BF16 = 30,
	MOEK_MXFP4 = 39, /* GGUF layout: 17-byte blocks, nibble j pairs elements (j, j+16) */
	MOEK_FP8_E4M3_B128 = 1000, /* 1 byte per weight + one f32 scale per 128x128 block */
};

struct moek_format_info {
	enum moek_format format;
	const char *name;     /* "Q4_K", "BF16", … as ggml/GGUF spell it */
	uint32_t block_elems; /* elements per block (1 for plain floats and FP8) */
	uint32_t block_bytes; /* bytes per block */
	bool weight_format;   /* usable as expert weights (Q8_K is not) */
};

/* Table row for a format, or NULL if the id is not a known format. */
const struct moek_format_info *moek_format_lookup(uint32_t format);

/* Bytes of one row of n elements, or 0 if n is not a multiple of the block size or the
 * format is unknown. FP8: n bytes (scales are separate). */
size_t moek_row_bytes(uint32_t format, size_t n);

/* Bytes of the f32 block-scale array of a rows x cols FP8_E4M3_B128 matrix. */
size_t moek_fp8_scale_bytes(size_t rows, size_t cols);

/* Reference quantizer (ggml-compatible rounding, as quantize_row_*_ref): a rows x cols
 * row-major f32 matrix into format `format`. `scales` receives FP8 block scales (scale_inv,
 * as DeepSeek stores them) and must be NULL for every other format. Returns 0, or -1 if the
 * format is unknown or cols is not a multiple of its block. */
int moek_quantize(uint32_t format, const float *src, size_t rows, size_t cols, void *dst,
                  float *scales);

/* Reference dequantizer: the inverse, into f32. Same contract. */
int moek_dequantize(uint32_t format, const void *src, const float *scales, size_t rows, size_t cols,
                    float *dst);

/* MXFP4 layout converters (n elements, n % 32 == 0). Hugging Face / OCP checkpoints store
 * `_blocks` (16 bytes per 32 elements, low nibble = even element) and `_scales` (one E8M0
 * byte per 32 elements) separately; GGUF interleaves them into 17-byte blocks with nibble j
 * holding elements (j, j+16). */
void moek_mxfp4_from_hf(const uint8_t *blocks, const uint8_t *scales, size_t n, void *gguf);
void moek_mxfp4_to_hf(const void *gguf, size_t n, uint8_t *blocks, uint8_t *scales);

/* Element codecs of the small float formats (exact; no rounding on decode).
 * FP8 E4M3 is the "fn" variant (DeepSeek-V3, OCP): bias 7, no infinities, S.1111.111 is NaN,
 * largest finite 448, subnormals m * 2^-9. Encoding rounds to nearest even and saturates to
 * +-448 (Inf included); NaN encodes as 0x7f with the sign kept. */
#define MOEK_FP8_E4M3_MAX 448.0f
#define MOEK_FP8_BLOCK 128 /* FP8 scales: one f32 per MOEK_FP8_BLOCK x MOEK_FP8_BLOCK block */
float moek_fp8_e4m3_to_f32(uint8_t v);
uint8_t moek_f32_to_fp8_e4m3(float f);
/* OCP E8M0 shared exponent: 2^(e-127); e = 255 is NaN (e = 0 is 2^-127, a float subnormal). */
float moek_e8m0_to_f32(uint8_t e);

/* Quantizes one row of n elements (n a multiple of the block) with the same reference
 * quantizer as moek_quantize; also accepts MOEK_Q8_K (the K-quant activation format).
 * Not for FP8 (its scales span 128 rows). Returns 0 or -1 (unknown format, bad n). */
int moek_quantize_row(uint32_t format, const float *src, size_t n, void *dst);

/* ---- Activations ------------------------------------------------------------------------
 * Activation dtypes use the wire protocol's numbering (proto/moe_proto.h enum moe_dtype). */
enum moek_act_dtype { MOEK_ACT_F32 = 0, MOEK_ACT_F16 = 1, MOEK_ACT_BF16 = 2 };

/* Converts n elements between activation dtypes (same dtype = copy). f32 -> bf16/f16 rounds
 * to nearest even; NaN stays NaN; overflow to f16 gives Inf. src and dst must not overlap. */
void moek_convert(unsigned dst_dtype, void *dst, unsigned src_dtype, const void *src, size_t n);

float moek_bf16_to_f32(uint16_t h);
uint16_t moek_f32_to_bf16(float f);
float moek_f16_to_f32(uint16_t h);
uint16_t moek_f32_to_f16(float f);

#ifdef __cplusplus
}
#endif
#endif /* MOE_KERNELS_H */
