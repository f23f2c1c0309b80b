/* moe_kernels.h — CPU expert kernels and weight formats (libmoe_kernels).
 *
 * A library of its own: no I/O, no IPC, no threads, no allocation inside any function.
 * Owns: the weight-format table (one row per format: block size, bytes, alignment, scale
 * layout, reference quantizer/dequantizer; SIMD paths per ISA, picked at run time by isa.c),
 * activation dtype conversion, and the expert FFN (SwiGLU and gpt-oss clamped SwiGLU).
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
	MOEK_Q2_K = 10,
	MOEK_Q3_K = 11,
	MOEK_Q4_K = 12,
	MOEK_Q5_K = 13,
	MOEK_Q6_K = 14,
	MOEK_Q8_K = 15, /* activation format for K-quant dot products only */
	/* ggml's i-quants: 256 weights per block, codes into fixed lattice codebooks (iq_grids.c)
	 */
	MOEK_IQ2_XXS = 16,
	MOEK_IQ2_XS = 17,
	MOEK_IQ3_XXS = 18,
	MOEK_IQ1_S = 19,
	MOEK_IQ4_NL = 20,
	MOEK_IQ3_S = 21,
	MOEK_IQ2_S = 22,
	MOEK_IQ4_XS = 23,
	MOEK_IQ1_M = 29,
	MOEK_BF16 = 30,
	MOEK_MXFP4 = 39, /* GGUF layout: 17-byte blocks, nibble j pairs elements (j, j+16) */
	/* ggml's NVFP4: 36-byte blocks of 64, four UE4M3 scales (one per 16) then 32 bytes of
	 * E2M1 codes; byte 8s + j holds elements 16s + j (low nibble) and 16s + j + 8 (high) */
	MOEK_NVFP4 = 40,
	MOEK_FP8_E4M3_B128 = 1000, /* 1 byte per weight + one f32 scale per 128x128 block */
	/* symmetric or zero-point INT4 in 32-element groups: the sidecar's own layout, repacked
	 * at load from compressed-tensors pack-quantized and GPTQ checkpoints (no GGUF id) */
	MOEK_INT4_G32 = 1001,
};

struct moek_format_info {
	enum moek_format format;
	const char *name;     /* "Q4_K", "BF16", … as ggml/GGUF spell it */
	uint32_t block_elems; /* elements per block (1 for plain floats and FP8) */
	uint32_t block_bytes; /* bytes per block */
	bool weight_format;   /* usable as expert weights (Q8_K is not) */
	/* bytes the weight data and row strides must be aligned to: the widest field read in
	 * place (f32 4, f16 scales 2; byte-only blocks, MXFP4 / INT4_G32 / FP8, 1) */
	uint32_t align;
	/* 0: the scales are inside the blocks; else one f32 scale per scale_block x scale_block
	 * weights in an array of their own (FP8_E4M3_B128: 128; moek_fp8_scale_bytes) */
	uint32_t scale_block;
	/* the safetensors dtype a checkpoint stores these weights as ("F32", "BF16", "F8_E4M3"),
	 * or NULL: none (the quantized formats come from GGUF, or are repacked at load) */
	const char *safetensors_dtype;
};

/* Table row for a format, or NULL if the id is not a known format. */
const struct moek_format_info *moek_format_lookup(uint32_t format);

/* Row i of the format table (0, 1, … in table order), or NULL past its end: for listing what
 * is supported (option parsers, error messages) without a second list to keep in step. */
const struct moek_format_info *moek_format_at(size_t i);

/* The expert weight formats' names, space-separated in table order ("F32 F16 … FP8_E4M3_B128"),
 * into buf (always terminated; truncated if too small). Returns buf. */
const char *moek_weight_format_names(char *buf, size_t len);

/* The row whose weights a safetensors checkpoint stores as `dtype` (its name in the header,
 * "BF16"), or NULL if no weight format is stored that way. */
const struct moek_format_info *moek_format_from_safetensors(const char *dtype);

/* The row whose weights GGUF stores as ggml type `ggml_type` (a tensor's type id), or NULL if
 * the kernels do not compute that type (the sidecar's own formats have no ggml type). */
const struct moek_format_info *moek_format_from_ggml(uint32_t ggml_type);

/* The table's scale_block of a format: 0 for formats whose scales are in their blocks (and for
 * unknown ids), else the side of the square of weights one side-array scale covers. */
uint32_t moek_format_scale_block(uint32_t format);

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

/* INT4 group-quantized checkpoints into MOEK_INT4_G32 rows (20 bytes per 32 weights: an f32
 * scale whose low 4 mantissa bits hold the zero point, then 16 bytes of codes; value
 * scale · (code − zero)). A matrix has `rows` outputs of `cols` inputs; `group` (a multiple of
 * 32 dividing cols) is the checkpoint's group size: a group of 64 or 128 gives its scale and
 * zero to each of its 32-element groups. All inputs are little-endian bytes at any alignment.
 *
 * compressed-tensors pack-quantized, symmetric: `packed` is weight_packed, int32 [rows,
 * cols / 8], element 8w + i in bits 4i..4i+3 of word w, value nibble − 8; `scales` is
 * weight_scale, BF16 [rows, cols / group].
 *
 * GPTQ: `qweight` int32 [cols / 8, rows] (packed along the input: element i of output o in
 * bits 4 (i % 8).. of word (i / 8, o)); `qzeros` int32 [cols / group, rows / 8] (output o's
 * zero in bits 4 (o % 8).. of word (g, o / 8)); `scales` F16 [cols / group, rows]; g_idx must
 * be i / group (the caller checks). v1 (the classic checkpoint_format "gptq") stores each zero
 * minus one, v2 stores it as it is. rows must be a multiple of 8.
 *
 * AWQ (AutoAWQ GEMM): `qweight` int32 [cols, rows / 8] (packed along the output: output o of
 * input i in nibble AWQ(o % 8) of word (i, o / 8), AWQ(k) = [0, 4, 1, 5, 2, 6, 3, 7][k], the
 * inverse of AutoAWQ's pack order [0, 2, 4, 6, 1, 3, 5, 7]); `qzeros` int32 [cols / group,
 * rows / 8] in the same order, zeros stored as they are; `scales` F16 [cols / group, rows].
 * rows must be a multiple of 8.
 *
 * All return 0, or -1 with a message in err: a bad shape, or (GPTQ v1) a stored zero of 15,
 * whose zero point 16 an INT4_G32 block cannot hold. dst must not overlap the inputs. */
int moek_int4_from_ct(const void *packed, const void *scales, size_t rows, size_t cols,
                      size_t group, void *dst, char *err, size_t err_len);
int moek_int4_from_gptq(const void *qweight, const void *qzeros, const void *scales, size_t rows,
                        size_t cols, size_t group, bool v1, void *dst, char *err, size_t err_len);
int moek_int4_from_awq(const void *qweight, const void *qzeros, const void *scales, size_t rows,
                       size_t cols, size_t group, void *dst, char *err, size_t err_len);
/* Bytes of the checkpoint tensors of a rows x cols INT4 matrix in group `group`: the packed
 * weights (both encodings: rows · cols / 2), the scales (rows · cols / group · 2) and GPTQ's
 * zeros (rows · cols / group / 2). */
static inline size_t moek_int4_packed_bytes(size_t rows, size_t cols)
{
	return rows * cols / 2;
}
static inline size_t moek_int4_scale_bytes(size_t rows, size_t cols, size_t group)
{
	return rows * (cols / group) * 2;
}
static inline size_t moek_int4_zero_bytes(size_t rows, size_t cols, size_t group)
{
	return rows / 2 * (cols / group);
}

/* NVFP4 checkpoints as NVIDIA ModelOpt writes them into NVFP4 rows (ggml's 36-byte blocks of
 * 64): `weight` uint8 [rows, cols / 2] (byte k of a row: element 2k in the low nibble, 2k + 1
 * in the high one; E2M1 codes, sign in bit 3) and `weight_scale` float8_e4m3fn [rows, cols /
 * 16] (one scale per 16 elements). The codes and the scale bytes move as they are: an E4M3
 * scale of sign 0 that is not NaN has the bits and value of the UE4M3 byte. The per-tensor
 * weight_scale_2 stays outside (struct moek_matrix.tensor_scale). Returns 0, or -1 with a
 * message in err: cols not a multiple of 64, or a scale byte that is negative or NaN (row and
 * column named). moek_nvfp4_to_modelopt is the inverse (for writers of such checkpoints). */
int moek_nvfp4_from_modelopt(const void *weight, const void *scales, size_t rows, size_t cols,
                             void *dst, char *err, size_t err_len);
void moek_nvfp4_to_modelopt(const void *src, size_t rows, size_t cols, void *weight, void *scales);

/* Rows interleaved in groups of 8 (struct moek_matrix.interleave): the decode layout of MXFP4,
 * NVFP4, Q8_0, Q4_K, BF16 and INT4_G32 — the same bytes as GGUF rows, permuted so that one SIMD
 * multiply covers 4 bytes of weights of 8 rows against activations loaded once for the 8, and the 8
 * rows' block scales are one load. Per group of 8 rows and block column b (8 blocks, 8 ·
 * block_bytes bytes; BF16's block here is 16 elements), the blocks' fields in this order, where
 * "vectors" means 32-byte vectors whose bytes 4r..4r+3 come from row r: MXFP4: 4 vectors of the 16
 * nibble bytes (bytes 4v..4v+3 of row r in vector v), 8 E8M0; Q8_0:  8 vectors of the 32 int8
 * weights, 8 f16 d; Q4_K:  8 f16 d, 8 f16 dmin, 3 vectors of the 12 packed scale bytes, 32 vectors
 * of the 128 nibble bytes; BF16:  8 vectors of the 16 values (vector v: elements 2v and 2v+1);
 *   INT4_G32: 4 vectors of the 16 nibble bytes, 1 vector of the 8 scale-and-zero words;
 *   NVFP4: 8 vectors of the 32 code bytes, 1 vector of the 8 rows' 4 UE4M3 scales.
 * moek_interleave: `rows` GGUF rows of `cols` elements (row_stride bytes apart; 0 = packed)
 * into dst (rows · row bytes); rows % 8 == 0, no overlap. moek_deinterleave is the inverse.
 * Both return 0, or -1 for a format without the layout or a bad shape. */
bool moek_interleave_supported(uint32_t format);
int moek_interleave(uint32_t format, const void *src, size_t row_stride, size_t rows, size_t cols,
                    void *dst);
int moek_deinterleave(uint32_t format, const void *src, size_t rows, size_t cols, void *dst);

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

/* ---- Expert FFN ---------------------------------------------------------------------------
 * out[t] += w[t] * down( act(gate x[t] + b_g) * (up x[t] + b_u) ) + w[t] * b_d, in f32.
 *
 * A matrix is rows x cols, row-major, cols contiguous (GGUF ne[0] = cols). gate and up are
 * ffn x hidden, down is hidden x ffn. row_stride lets a descriptor view a column slice of a
 * larger matrix (moek_expert_slice), so splitting the intermediate dimension across NUMA
 * nodes needs no copy of the weights. */
enum moek_activation {
	MOEK_SWIGLU = 0,     /* silu(g) * u */
	MOEK_SWIGLU_OAI = 1, /* gpt-oss: g = min(g, limit), u = clamp(u, -limit, limit),
	                        g * sigmoid(alpha * g) * (u + 1) */
};
/* gpt-oss's alpha: fixed in the model's code, not in its config (which carries the limit) */
#define MOEK_SWIGLU_OAI_ALPHA 1.702f

struct moek_matrix {
	uint32_t format;     /* enum moek_format, a weight format */
	uint32_t rows, cols; /* output features x input features */
	const void *data;    /* rows of row_stride bytes; 4-byte aligned for F32, 2 for formats
	                        with f16 fields, any for MXFP4/FP8 */
	size_t row_stride;   /* bytes between rows; 0 = moek_row_bytes(format, cols) */
	const float *scales; /* FP8 only: scale_inv of each 128x128 block, block-row-major */
	size_t scale_stride; /* floats between block rows of scales; 0 = ceil(cols / 128) */
	const float *bias;   /* optional, rows floats (gpt-oss) */
	/* A per-tensor scale multiplying every product of this matrix before the bias and the
	 * activation (ModelOpt NVFP4's weight_scale_2, kept outside the blocks as ggml keeps it):
	 * 0 = none (1). Finite and positive when set. */
	float tensor_scale;
	/* Partial matrices (one NUMA node's rows of an expert, in memory of their own): rows
	 * [row0, rows) are present, row r is at data + (r - row0) * row_stride; callers ask the
	 * phases only for rows they have. Scales and bias stay indexed by the global row.
	 * 0 = every row present (moek_expert_slice accepts only that). */
	uint32_t row0;
	/* 0 = GGUF rows as above; MOEK_INTERLEAVE (8) = rows interleaved in groups of 8 by
	 * moek_interleave (MXFP4, Q8_0, Q4_K, BF16), the layout the decode dots read fastest.
	 * Then rows and row0 are multiples of 8, group g (rows 8g..8g+7) is at data + (g - row0
	 * / 8) * 8 * row_stride, and column block b of a group at + b * 8 * block bytes (BF16:
	 * blocks of 16 columns; a column slice moves data). */
	uint32_t interleave;
};

#define MOEK_INTERLEAVE 8u

struct moek_expert {
	struct moek_matrix gate, up, down; /* gate and up: same format and shape */
	enum moek_activation activation;
	float limit; /* MOEK_SWIGLU_OAI: swiglu_limit (gpt-oss 7.0) */
	float alpha; /* MOEK_SWIGLU_OAI: MOEK_SWIGLU_OAI_ALPHA (gpt-oss) */
	/* Llama-4: a token's routing weight scales its input, out += down(act(w·x)), instead
	 * of its output, out += w·down(act(x)) (moek_ffn_call.weights) */
	bool weight_on_input;
};

/* The part of `full` that owns intermediate features [f_begin, f_end): rows of gate/up (and
 * their biases), columns of down; views into the same weights. f_begin must be a multiple of
 * moek_expert_split_align(full) (f_end too, unless it is the end). The slice keeps down.bias:
 * set it to NULL in all slices but one so the bias is added once. Returns 0 or -1 with a
 * message in err. */
int moek_expert_slice(const struct moek_expert *full, size_t f_begin, size_t f_end,
                      struct moek_expert *slice, char *err, size_t err_len);

/* The decode layout of a whole expert, in one buffer of moek_expert_packed_bytes(src) bytes:
 * gate and up alternating — a row of each, or a group of 8 rows of each where `interleave`
 * asks for the interleaved layout and the format has it — so that the hidden phase reads one
 * ascending range instead of two (a core streams one range from DRAM faster than two
 * interleaved ones), then down (interleaved likewise). *packed describes the copy: the same
 * expert with data and row strides into dst (gate and up rows 2 · row bytes apart); FP8
 * scales, biases and the activation are src's pointers and values. The FFN of *packed gives
 * the bits the FFN of src gives when the interleaving is the same. src: whole matrices in
 * GGUF rows (any row stride); dst must not overlap them. Returns 0, or -1 with a message in
 * err. */
size_t moek_expert_packed_bytes(const struct moek_expert *src);
int moek_expert_pack(const struct moek_expert *src, bool interleave, void *dst, size_t dst_bytes,
                     struct moek_expert *packed, char *err, size_t err_len);

/* Granularity of intermediate-dimension splits (hidden-phase row ranges, slices): the block
 * of down's format and of its activation quantization (1..256). */
size_t moek_expert_split_align(const struct moek_expert *e);

/* Granularity of hidden-phase row ranges alone (moek_ffn_hidden; slices still need
 * moek_expert_split_align): finer than down's block, so
 * that small experts (Qwen3's 768 features in 256-element Q4_K blocks) split evenly. */
size_t moek_ffn_hidden_align(const struct moek_expert *e);

/* One FFN invocation for n tokens. Filled by the caller; `plan` by moek_ffn_prepare.
 * Token t of this call reads x row token_ids[t] (or t when token_ids is NULL) and adds into
 * out row token_ids[t] (or t), scaled by weights[t]. token_ids are trusted: the caller has
 * bounded them by its own buffers. x, weights, the expert and the scratch must not change
 * between prepare and the last phase; out rows are written only by the down phase. */
struct moek_ffn_call {
	const struct moek_expert *expert;
	size_t n_tokens;
	const void *x; /* activations, dtype x_dtype (enum moek_act_dtype) */
	unsigned x_dtype;
	size_t x_stride;           /* elements between token rows of x; 0 = hidden */
	const uint32_t *token_ids; /* optional: row of x / out of each token */
	const float *weights;      /* n_tokens routing weights (NULL: all 1) */
	float *out;                /* f32, accumulated into */
	size_t out_stride;         /* elements between token rows of out; 0 = hidden */
	void *scratch;             /* moek_ffn_scratch_bytes(expert, n_tokens, n_workers) */
	size_t scratch_bytes;
	unsigned n_workers; /* workers that will run the phases concurrently (>= 1) */
	/* Batch-invariant: each token's output bits depend only on its own x row, its weight,
	 * the expert and the ISA — not on n_tokens, its position, the other tokens or the split.
	 * Every token then takes the one-token decode path (activations quantized per token,
	 * each output row one dot in a fixed order, no tiles), several tokens per call only
	 * through dots that keep each token's one-token sums. false: the default paths. */
	bool batch_invariant;
	struct { /* private: filled by moek_ffn_prepare */
		const void *isa;
		char *base; /* scratch, 64-byte aligned */
		size_t hidden, ffn, x_pad, h_pad;
		size_t xq_off, xq_row, hf_off, hq_off, hq_row, worker_off, worker_bytes, row_bf16;
		uint32_t xq_format, hq_format;
		uint8_t gate_fmt, down_fmt; /* the formats' indices in the kernels' tables */
		bool prefill;
		bool x_bf16, h_bf16; /* prefill: x / h as bf16 pair panels for the bf16 tiles */
	} plan;
};

/* Limits of one call (far above any batch; they keep every size computation in range). */
#define MOEK_MAX_TOKENS (1u << 20)
#define MOEK_MAX_WORKERS 1024u

/* Scratch bytes for an expert at n tokens run by n_workers workers (64-byte aligned use), or 0
 * if the expert is invalid or the counts exceed the limits. Enough for a call in either mode
 * (batch_invariant or not). */
size_t moek_ffn_scratch_bytes(const struct moek_expert *e, size_t n_tokens, unsigned n_workers);

/* Validates the call (formats, shapes, alignment, scratch size), lays out its scratch and
 * clears the padding in it. Returns 0, or -1 with a message naming what was wrong. Once per
 * (expert, batch), single-threaded, before the phases. */
int moek_ffn_prepare(struct moek_ffn_call *c, char *err, size_t err_len);

/* The three phases of a prepared call. Each phase's ranges may be split over workers that run
 * concurrently; the caller orders the phases (a barrier between them). Worker w uses only its
 * own part of the scratch. For a given ISA and n_tokens, results are bit-identical for any
 * split of any phase (each output element has one writer and a fixed summation order); the
 * path (row dot products for few tokens, dequantized tiles from 16 tokens — 8 for float
 * weights in GGUF rows; interleaved Q8_0, Q4_K and MXFP4 keep their group dots at any count,
 * bit for bit the same as in calls of 8 tokens) and the ISA may change the last bits, unless
 * the call is batch_invariant: then only the ISA does.
 *   load:   tokens [t_begin, t_end) converted (and quantized once) into scratch;
 *   hidden: intermediate features [f_begin, f_end) of every token (multiples of
 *           moek_expert_split_align or of moek_ffn_hidden_align, or the end);
 *   down:   output features [o_begin, o_end) of every token, added into out. */
void moek_ffn_load(const struct moek_ffn_call *c, unsigned worker, size_t t_begin, size_t t_end);
void moek_ffn_hidden(const struct moek_ffn_call *c, unsigned worker, size_t f_begin, size_t f_end);
void moek_ffn_down(const struct moek_ffn_call *c, unsigned worker, size_t o_begin, size_t o_end);

/* The hidden and down phases with the weight rows taken from `w` instead of c->expert: same
 * formats, shapes and activation as c->expert (checked in debug builds); data, row_stride and
 * row0 may differ (per-node partial copies of an expert's rows). c keeps the plan and the
 * shared scratch (x converted once, h shared by every caller). Rows asked for must be
 * present in w: [f_begin, f_end) of gate and up, [o_begin, o_end) of down. */
void moek_ffn_hidden_rows(const struct moek_ffn_call *c, const struct moek_expert *w,
                          unsigned worker, size_t f_begin, size_t f_end);
void moek_ffn_down_rows(const struct moek_ffn_call *c, const struct moek_expert *w, unsigned worker,
                        size_t o_begin, size_t o_end);

/* prepare + all three phases on the calling thread. Returns 0 or -1 (message in err). */
int moek_ffn_run(struct moek_ffn_call *c, char *err, size_t err_len);

/* ---- Instruction-set dispatch (isa.c) -------------------------------------------------------
 * The CPU is detected once (CPUID, XGETBV for the register state the OS saves and, for AMX,
 * the kernel's permission to use the tile data: arch_prctl(ARCH_REQ_XCOMP_PERM)). The active
 * ISA is the most capable one the CPU can run, unless MOEK_ISA=<name> in the environment (read
 * on first use) or moek_set_isa forces one. The ISAs, each a superset of the one before:
 *   scalar — the reference (dequantize, f32 dot);
 *   avx2   — AVX2 + FMA + F16C for every format; where the CPU has AVX512-VNNI (+ VL, BW) it
 *            uses VNNI forms of some integer dots on 256-bit registers: same bits;
 *   avx512 — avx2 plus AVX-512 kernels where they pay: BF16 dots and prefill tiles on
 *            vdpbf16ps (AVX512-BF16), integer dots on 512-bit VNNI;
 *   amx    — avx512 with AMX tiles (tdpbf16ps) for the bf16 prefill tiles, from the token
 *            counts where they beat the decode dots on an AMX CPU.
 * Not thread-safe against running kernels: force an ISA before any call is prepared. */
enum moek_isa {
	MOEK_ISA_AUTO = 0,
	MOEK_ISA_SCALAR = 1,
	MOEK_ISA_AVX2 = 2,
	MOEK_ISA_AVX512 = 3,
	MOEK_ISA_AMX = 4,
};

/* CPU features (bits of moek_cpu_features), each only where the OS saves the registers. */
enum moek_cpu_feature {
	MOEK_CPU_AVX2 = 1u << 0,
	MOEK_CPU_FMA = 1u << 1,
	MOEK_CPU_F16C = 1u << 2,
	MOEK_CPU_AVX512_VNNI = 1u << 3, /* with AVX512 F, BW and VL: the VNNI forms' subset */
	MOEK_CPU_AVX512_VBMI = 1u << 4, /* with AVX512 F, BW and VL */
	MOEK_CPU_INTEL = 1u << 5,       /* vendor GenuineIntel */
	MOEK_CPU_AVX512 = 1u << 6,      /* AVX512 F, BW, VL and DQ */
	MOEK_CPU_AVX512_BF16 = 1u << 7, /* with AVX512 F, BW and VL */
	/* AMX-TILE, AMX-BF16 and AMX-INT8, the OS saving the tile state and granting this
	 * process the tile data */
	MOEK_CPU_AMX = 1u << 8,
};
unsigned moek_cpu_features(void);
/* The names of `features` (MOEK_CPU_* bits) in bit order, space-separated, into buf ("" for
 * none; truncated to len). Returns buf. */
const char *moek_cpu_feature_names(unsigned features, char *buf, size_t len);

int moek_set_isa(enum moek_isa isa);    /* -1 (nothing changes) if this CPU cannot run it */
bool moek_isa_supported(enum moek_isa); /* whether moek_set_isa(isa) would succeed */
enum moek_isa moek_isa_active(void);    /* the ISA the kernels run on (never AUTO) */
const char *moek_isa_name(void);        /* its name: "scalar", "avx2", "avx512", "amx" */
/* An ISA by name ("scalar", "avx2", "avx512", "amx"): 0, or -1 for an unknown name. */
int moek_isa_parse(const char *name, enum moek_isa *out);
/* The name of `isa` (NULL for AUTO or an unknown value). */
const char *moek_isa_label(enum moek_isa isa);
/* The MOEK_CPU_* bits `isa` needs that this CPU lacks (0: it can run it). */
unsigned moek_isa_missing(enum moek_isa isa);
/* Makes the ISA called `name` active: 0, or -1 with one line in why (the name unknown:
 * "'NAME': expected …"; the CPU unable: "NAME: this CPU lacks … (it has: …)"). For the
 * command lines' --isa. */
int moek_isa_force(const char *name, char *why, size_t len);
/* How the active ISA computes experts in `format`: one line naming the kernels of one-token
 * decode, batched decode and prefill (from how many tokens), for logs. */
const char *moek_isa_format_path(uint32_t format, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* MOE_KERNELS_H */
