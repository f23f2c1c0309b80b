/* kernels_internal.h — private to libmoe_kernels: block layouts and the per-ISA function table.
 *
 * Block structs mirror ggml's ggml-common.h byte for byte (static_asserts below). Weight data
 * handed to the kernels must be 2-byte aligned (4 for Q8_K); moek_ffn_prepare checks it, so
 * reading a block's fp16 scale through the struct is never a misaligned access.
 *
 * formats.c holds the format table and the scalar reference of every format; x86_avx2.c the
 * AVX2+FMA paths (with x86_avx2_*.c for formats in files of their own, sharing x86_avx2.h);
 * isa.c the CPU detection and the choice of ops table; ffn.c the expert FFN that drives the
 * chosen one through struct moek_isa_ops.
 */
#ifndef MOE_KERNELS_INTERNAL_H
#define MOE_KERNELS_INTERNAL_H

#include <assert.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "moe_kernels.h"

#define QK4_0 32
#define QK8_0 32
#define QK_MXFP4 32
#define QK_NVFP4 64
#define QK_NVFP4_SUB 16
#define QK_K 256
#define K_SCALE_SIZE 12
#define QK4_NL 32

struct block_q4_0 {
	uint16_t d;            /* f16 scale */
	uint8_t qs[QK4_0 / 2]; /* elem j low nibble, elem j+16 high nibble; value q-8 */
};
struct block_q8_0 {
	uint16_t d; /* f16 scale */
	int8_t qs[QK8_0];
};
struct block_mxfp4 {
	uint8_t e;                /* E8M0 shared exponent */
	uint8_t qs[QK_MXFP4 / 2]; /* elem j low nibble, elem j+16 high nibble; E2M1 codes */
};
struct block_q4_K {
	uint16_t d;                   /* f16 super-block scale of the 6-bit scales */
	uint16_t dmin;                /* f16 super-block scale of the 6-bit mins */
	uint8_t scales[K_SCALE_SIZE]; /* 8 x (6-bit scale, 6-bit min), packed */
	uint8_t qs[QK_K / 2];         /* 4 chunks of 32 bytes: sub-block 2c low, 2c+1 high */
};
struct block_q5_K {
	uint16_t d;
	uint16_t dmin;
	uint8_t scales[K_SCALE_SIZE];
	uint8_t qh[QK_K / 8]; /* bit 2c of qh[l]: 5th bit of sub-block 2c elem l; 2c+1: bit 2c+1 */
	uint8_t qs[QK_K / 2];
};
struct block_q6_K {
	uint8_t ql[QK_K / 2];     /* low 4 bits */
	uint8_t qh[QK_K / 4];     /* high 2 bits */
	int8_t scales[QK_K / 16]; /* one per 16 elements */
	uint16_t d;               /* f16 super-block scale */
};
struct block_q2_K {
	uint8_t scales[QK_K / 16]; /* per 16 elements: low nibble scale, high nibble min */
	uint8_t qs[QK_K / 4];      /* byte 32h + l, bits 2s: element 128h + 32s + l */
	uint16_t d;                /* f16 super-block scale of the scales */
	uint16_t dmin;             /* f16 super-block scale of the mins */
};
struct block_q3_K {
	uint8_t hmask[QK_K / 8];      /* bit e / 32 of byte e % 32: element e's code is >= 4 */
	uint8_t qs[QK_K / 4];         /* low 2 bits of the code, as Q2_K's qs */
	uint8_t scales[K_SCALE_SIZE]; /* 16 x 6-bit scales + 32 (moek_q3_scales) */
	uint16_t d;                   /* f16 super-block scale */
};
struct block_q8_K {
	float d; /* may be negative (scale from the signed extreme) */
	int8_t qs[QK_K];
	int16_t bsums[QK_K / 16]; /* sums of 16 consecutive qs */
};

/* IQ4_NL / IQ4_XS: 4-bit codes into the non-linear grid moek_iq4_kvalues, nibbles paired as
 * Q4_0's (element j low, j+16 high, per 32 elements). */
struct block_iq4_nl {
	uint16_t d; /* f16 scale: value = d * kvalues[code] */
	uint8_t qs[QK4_NL / 2];
};
struct block_iq4_xs {
	uint16_t d;                  /* f16 super-block scale */
	uint16_t scales_h;           /* bits 2j, 2j+1: high 2 bits of sub-block j's 6-bit scale */
	uint8_t scales_l[QK_K / 64]; /* nibble j%2 of byte j/2: low 4 bits of sub-block j's */
	uint8_t qs[QK_K / 2];        /* 16 bytes per 32-element sub-block, as IQ4_NL */
};

static_assert(sizeof(struct block_q4_0) == 18, "Q4_0 block");
static_assert(sizeof(struct block_iq4_nl) == 18, "IQ4_NL block");
static_assert(sizeof(struct block_iq4_xs) == 136, "IQ4_XS block");
static_assert(offsetof(struct block_iq4_xs, scales_l) == 4, "IQ4_XS scales_l");
static_assert(offsetof(struct block_iq4_xs, qs) == 8, "IQ4_XS qs");
static_assert(sizeof(struct block_q8_0) == 34, "Q8_0 block");
static_assert(sizeof(struct block_mxfp4) == 17, "MXFP4 block");

/* NVFP4 (ggml type 40): per 16-element sub-block s an unsigned E4M3 scale d[s] (bit 7
 * ignored except that 0x7F alone reads as 0, as ggml_ue4m3_to_fp32) and 8 code bytes qs[8s ..
 * 8s+7]: byte j's low nibble is element 16s + j, its high nibble element 16s + j + 8; codes are
 * E2M1 (sign in bit 3), value = moek_mxfp4_kvalues[code] · moek_ue4m3_half(d[s]). A per-tensor
 * scale, where a checkpoint has one, stays outside the blocks. Bytes only: any alignment. */
struct block_nvfp4 {
	uint8_t d[QK_NVFP4 / QK_NVFP4_SUB];
	uint8_t qs[QK_NVFP4 / 2];
};
static_assert(sizeof(struct block_nvfp4) == 36, "NVFP4 block");

/* UE4M3 scale byte → half its value (ggml_ue4m3_to_fp32: the E2M1 codes are doubled in
 * moek_mxfp4_kvalues). Exact: normal (1 + m/8) · 2^(e−7) / 2, subnormal m · 2^−10. */
static inline float moek_ue4m3_half(uint8_t x)
{
	if (x == 0x7F) /* ggml tests the byte before dropping bit 7: 0xFF reads as 0x7F would */
		return 0.0f;
	x &= 0x7F;
	const uint32_t e = x >> 3, m = x & 7u;
	if (e == 0)
		return (float)m * 0x1p-10f;
	const uint32_t bits = (e + 119u) << 23 | m << 20;
	float f;
	memcpy(&f, &bits, sizeof(f));
	return f;
}
static_assert(sizeof(struct block_q2_K) == 84, "Q2_K block");
static_assert(offsetof(struct block_q2_K, d) == 80, "Q2_K d");
static_assert(sizeof(struct block_q3_K) == 110, "Q3_K block");
static_assert(offsetof(struct block_q3_K, scales) == 96, "Q3_K scales");
static_assert(sizeof(struct block_q4_K) == 144, "Q4_K block");
static_assert(sizeof(struct block_q5_K) == 176, "Q5_K block");
static_assert(sizeof(struct block_q6_K) == 210, "Q6_K block");
static_assert(sizeof(struct block_q8_K) == 292, "Q8_K block");

/* The i-quants (fmt_iq.c): 256 weights per block in groups of 8 whose magnitudes are one point
 * of a fixed lattice codebook (iq_grids.c, ggml's tables byte for byte) and whose signs come
 * from ksigns_iq2xs (7 stored sign bits; the 8th makes the count of minus signs even).
 * IQ2_XXS: qs as 8 pairs of u32 (a, b) per 32 weights: byte l of a indexes iq2xxs_grid for
 * weights 8l..8l+7; bits 7l..7l+6 of b (l < 4) index ksigns_iq2xs; b >> 28 is the 4-bit
 * scale s: value = d · (0.5 + s) · 0.25 · grid · sign.
 * IQ2_XS: one u16 per 8 weights: bits 0-8 index iq2xs_grid, bits 9-15 ksigns_iq2xs; a 4-bit
 * scale per 16 weights (low nibble of scales[j]: weights 32j..32j+15, high: the next 16):
 * value = d · (0.5 + s) · 0.25 · grid · sign.
 * IQ3_XXS: qs[0..63] two iq3xxs_grid indices per 8 weights (4 magnitudes each), then per 32
 * weights a u32 b as IQ2_XXS's (signs, s = b >> 28): value = d · (0.5 + s) · 0.5 · grid · sign.
 * IQ3_S: per 32 weights 8 iq3s_grid indices (4 magnitudes each) of 9 bits, the low 8 in qs,
 * the 9th of index k in bit k of qh[j]; 4 full sign bytes (no parity rule); a 4-bit scale s
 * (nibble j % 2 of scales[j / 2]): value = d · (1 + 2s) · grid · sign. */
struct block_iq2_xxs {
	uint16_t d;            /* f16 super-block scale */
	uint16_t qs[QK_K / 8]; /* 8 bytes per 32 weights: 4 grid indices, then signs + scale */
};
struct block_iq2_xs {
	uint16_t d;
	uint16_t qs[QK_K / 8];     /* per 8 weights: grid index | sign index << 9 */
	uint8_t scales[QK_K / 32]; /* per 32 weights: two 4-bit scales */
};
static_assert(sizeof(struct block_iq2_xxs) == 66, "IQ2_XXS block");
struct block_iq3_xxs {
	uint16_t d;
	uint8_t qs[3 * QK_K / 8]; /* 64 grid indices, then 8 u32 of signs and scale */
};
static_assert(sizeof(struct block_iq2_xs) == 74, "IQ2_XS block");
static_assert(sizeof(struct block_iq3_xxs) == 98, "IQ3_XXS block");
struct block_iq3_s {
	uint16_t d;
	uint8_t qs[QK_K / 4];    /* low 8 bits of the grid indices, 8 per 32 weights */
	uint8_t qh[QK_K / 32];   /* their 9th bits, one byte per 32 weights */
	uint8_t signs[QK_K / 8]; /* one sign byte per 8 weights */
	uint8_t scales[QK_K / 64];
};
static_assert(sizeof(struct block_iq3_s) == 110, "IQ3_S block");
/* IQ1_S: per 32 weights (j), 4 grid indices of 11 bits into iq1s_grid (ternary entries): the
 * low 8 in qs[4j + l], the high 3 in bits 3l..3l+2 of qh[j]; qh[j] bits 12-14 a 3-bit scale
 * s, bit 15 the sign of delta: value = d · (2s + 1) · (grid + delta), delta = ∓1/8. */
struct block_iq1_s {
	uint16_t d;
	uint8_t qs[QK_K / 8];
	uint16_t qh[QK_K / 32];
};
static_assert(sizeof(struct block_iq1_s) == 50, "IQ1_S block");
/* IQ1_M: no d field. Per 32 weights (j), 4 indices of 11 bits into iq1s_grid: low 8 in
 * qs[4j + l], high 3 in bits 0-2 (l even) or 4-6 (l odd) of qh[2j + l/2], whose bit 3 / 7 is
 * the group's delta sign. scales[] as 4 little-endian u16: bits 0-11 of u16 k hold 3-bit
 * scales for weights 64k + 16i … (i = 0..3, 3 bits each); their top nibbles, u16 0 lowest,
 * make the f16 d: value = d · (2s + 1) · (grid + delta). */
struct block_iq1_m {
	uint8_t qs[QK_K / 8];
	uint8_t qh[QK_K / 16];
	uint8_t scales[QK_K / 32];
};
static_assert(sizeof(struct block_iq1_m) == 56, "IQ1_M block");
/* IQ2_S: per 32 weights (j), 4 indices of 10 bits into iq2s_grid: low 8 in qs[4j + l], high 2
 * in bits 2l, 2l+1 of qh[j]; full sign bytes in qs[32 + 4j + l]; scales as IQ2_XS's (a 4-bit
 * scale per 16): value = d · (0.5 + s) · 0.25 · grid · sign. */
struct block_iq2_s {
	uint16_t d;
	uint8_t qs[QK_K / 4]; /* 32 index bytes, then 32 sign bytes */
	uint8_t qh[QK_K / 32];
	uint8_t scales[QK_K / 32];
};
static_assert(sizeof(struct block_iq2_s) == 82, "IQ2_S block");
#define MOEK_IQ1S_DELTA 0.125f

/* The codebooks and sign tables (iq_grids.c): each grid entry packs 8 unsigned magnitudes
 * (8, 25 or 43), byte j for weight j; ksigns_iq2xs[i] is i with bit 7 set when i has an odd
 * number of bits (bit j set: weight j negative). */
extern const uint64_t moek_iq2xxs_grid[256];
extern const uint64_t moek_iq2xs_grid[512];
extern const uint32_t moek_iq3xxs_grid[256];
extern const uint32_t moek_iq3s_grid[512];
extern const uint64_t moek_iq1s_grid[2048];
extern const uint64_t moek_iq2s_grid[1024];
extern const uint8_t moek_ksigns_iq2xs[128];

/* Reference codecs of the i-quants (fmt_iq.c): n elements, a multiple of 256. */
void moek_quantize_iq2_xxs(const float *x, void *dst, size_t n);
void moek_dequantize_iq2_xxs(const void *src, float *y, size_t n);
void moek_quantize_iq2_xs(const float *x, void *dst, size_t n);
void moek_dequantize_iq2_xs(const void *src, float *y, size_t n);
void moek_quantize_iq3_xxs(const float *x, void *dst, size_t n);
void moek_dequantize_iq3_xxs(const void *src, float *y, size_t n);
void moek_quantize_iq3_s(const float *x, void *dst, size_t n);
void moek_dequantize_iq3_s(const void *src, float *y, size_t n);
void moek_quantize_iq1_s(const float *x, void *dst, size_t n);
void moek_dequantize_iq1_s(const void *src, float *y, size_t n);
void moek_quantize_iq1_m(const float *x, void *dst, size_t n);
void moek_dequantize_iq1_m(const void *src, float *y, size_t n);
void moek_quantize_iq2_s(const float *x, void *dst, size_t n);
void moek_dequantize_iq2_s(const void *src, float *y, size_t n);
/* Their scalar reference dots against Q8_K activations (one row, one token): each block's
 * exact integer sum Σ (2s + 1) · grid · sign · q, then acc = fma(d · y.d · f, sum, acc) per
 * block (f = 0.125 for IQ2, 0.25 for IQ3_XXS, 1 for IQ3_S) — the AVX2 dots' arithmetic, so they
 * give the same bits. */
float moek_iq_dot_q8k_ref(uint32_t format, const void *w, const void *act, size_t k);

/* MOEK_INT4_G32: one 32-element group of a compressed-tensors or GPTQ INT4 checkpoint,
 * repacked at load (fmt_int4.c). `dz` is the group's f32 scale d, little-endian, whose low 4
 * mantissa bits hold the zero point z: BF16 and F16 scales convert to f32 with at least 13
 * low bits clear, so both fit one word exactly. Codes are unsigned, in Q4_0's nibble order
 * (element j low nibble of qs[j], element j+16 high nibble), so the Q4_0 unpack serves; value
 * d·(q − z) (symmetric groups: z = 8). Bytes only: a repacked matrix may start anywhere. */
#define QK_INT4 32
struct block_int4_g32 {
	uint8_t dz[4];
	uint8_t qs[QK_INT4 / 2];
};
static_assert(sizeof(struct block_int4_g32) == 20, "INT4_G32 block");
static_assert(_Alignof(struct block_int4_g32) == 1, "INT4_G32 blocks are byte-aligned");

/* The scale d and zero point z of an INT4_G32 block. */
static inline float moek_int4_scale(const struct block_int4_g32 *b, int *z)
{
	const uint32_t w = (uint32_t)b->dz[0] | (uint32_t)b->dz[1] << 8 | (uint32_t)b->dz[2] << 16 |
	                   (uint32_t)b->dz[3] << 24;
	const uint32_t bits = w & ~15u;
	float d;
	memcpy(&d, &bits, sizeof(d));
	*z = (int)(w & 15u);
	return d;
}

/* INT4_G32 reference row codecs (fmt_int4.c), the format table's row functions. */
void moek_int4_quantize_row(const float *x, void *dst, size_t n);
void moek_int4_dequantize_row(const void *src, float *dst, size_t n);

/* E2M1 values doubled (ggml's kvalues_mxfp4): code c means kvalues[c] / 2. */
extern const int8_t moek_mxfp4_kvalues[16];
/* The IQ4 grid (ggml's kvalues_iq4nl), ascending: code c means kvalues[c] times the scale. */
extern const int8_t moek_iq4_kvalues[16];

/* IQ4_XS: the 6-bit scale of sub-block j (0..7), ls - 32 in -32..31. */
static inline int moek_iq4_xs_scale(const struct block_iq4_xs *b, int j)
{
	const int lo = (b->scales_l[j / 2] >> (4 * (j % 2))) & 15;
	const int hi = (b->scales_h >> (2 * j)) & 3;
	return (lo | hi << 4) - 32;
}

/* Reference codecs of IQ4_NL and IQ4_XS (fmt_iq4.c): n elements, a multiple of the block. */
void moek_quantize_iq4_nl(const float *x, void *dst, size_t n);
void moek_dequantize_iq4_nl(const void *src, float *y, size_t n);
void moek_quantize_iq4_xs(const float *x, void *dst, size_t n);
void moek_dequantize_iq4_xs(const void *src, float *y, size_t n);

/* Reference codecs of NVFP4 (fmt_nvfp4.c): n elements, a multiple of 64. */
void moek_quantize_nvfp4(const float *x, void *dst, size_t n);
void moek_dequantize_nvfp4(const void *src, float *y, size_t n);
/* ---- The format table (formats.c) ---------------------------------------------------------
 * One row per format, as ggml's type_traits: everything the kernels and their callers need to
 * know about a format is a field of its row or a query on it, so adding a format is one row
 * plus its functions: its id (moe_kernels.h), its name in MOEK_GGML_FORMATS or
 * MOEK_OWN_FORMATS below, its block struct here, its reference codecs and row in formats.c,
 * and — for SIMD speed — its entries in an ISA's ops tables at the row's index
 * (and a struct moek_x8_layout in interleave.c if it has an interleaved layout). The SIMD
 * entry points live in the per-ISA ops tables (moek_isa_ops), indexed by the row's index; the
 * reference dot product is the reference dequantizer followed by an f32 dot product
 * (moek_scalar_ops). test_format_table checks a new row against all of these. */

/* The formats, once: each row of the table at a dense index MOEK_FMT_<name> (enum moek_fmt),
 * the index every per-format table (format rows, ISA ops) is an array over, as ggml indexes
 * its type_traits by ggml_type. The public ids (moe_kernels.h, enum moek_format) are ggml's
 * type ids, which have gaps up to 40, and the sidecar's own from 1000; moek_fmt_index maps
 * one to its index in O(1), once, where an id enters the kernels (the public functions,
 * moek_ffn_prepare): the request path then carries the index. The ggml formats come first,
 * in id order; the sidecar's own follow in id order, so their ids are their index + a
 * constant (asserted in formats.c). */
/* Laid out by hand: clang-format 14 alternates between two layouts of this list. */
/* clang-format off */
#define MOEK_GGML_FORMATS(X)                                                                  \
	X(F32) X(F16) X(Q4_0) X(Q8_0) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(Q8_K)       \
	X(IQ2_XXS) X(IQ2_XS) X(IQ3_XXS) X(IQ1_S) X(IQ4_NL) X(IQ3_S) X(IQ2_S) X(IQ4_XS) X(IQ1_M) X(BF16) X(MXFP4) X(NVFP4)
/* clang-format on */
#define MOEK_OWN_FORMATS(X) X(FP8_E4M3_B128) X(INT4_G32)

enum moek_fmt {
#define MOEK_FMT_ENUM(name) MOEK_FMT_##name,
	MOEK_GGML_FORMATS(MOEK_FMT_ENUM) MOEK_OWN_FORMATS(MOEK_FMT_ENUM)
#undef MOEK_FMT_ENUM
	    MOEK_FMT_COUNT,
	/* unknown ids: an index no table fills (the ops tables have a NULL entry for it) */
	MOEK_FMT_NONE = MOEK_FMT_COUNT,
	MOEK_FMT_SLOTS, /* entries of a per-format ops array: every format and NONE */
};
/* The first of the sidecar's own formats, and where ggml's ids end (below the first own id). */
#define MOEK_FMT_OWN_FIRST MOEK_FMT_FP8_E4M3_B128
#define MOEK_OWN_ID_FIRST MOEK_FP8_E4M3_B128
#define MOEK_GGML_ID_END 41u

/* Index of each ggml id below MOEK_GGML_ID_END, plus one (0: no row) (formats.c). */
extern const uint8_t moek_fmt_of_ggml_id[MOEK_GGML_ID_END];

/* The dense index of a public format id (MOEK_FMT_NONE if no row has it). */
static inline enum moek_fmt moek_fmt_index(uint32_t format)
{
	if (format < MOEK_GGML_ID_END)
		return moek_fmt_of_ggml_id[format]
		           ? (enum moek_fmt)(moek_fmt_of_ggml_id[format] - 1)
		           : MOEK_FMT_NONE;
	const uint32_t own = format - MOEK_OWN_ID_FIRST; /* wraps for ids below: never small */
	return own < MOEK_FMT_COUNT - MOEK_FMT_OWN_FIRST ? (enum moek_fmt)(MOEK_FMT_OWN_FIRST + own)
	                                                 : MOEK_FMT_NONE;
}

/* The interleaved layout of a format (moe_kernels.h, moek_interleave): per column of a group
 * of 8 rows, the block's fields in order, each either scalar (1 or 2 bytes per row, the 8 rows
 * side by side) or vector (32-byte vectors holding 4 bytes of each row). */
struct moek_x8_segment {
	uint8_t offset, bytes; /* within the GGUF block */
	bool vector;
};
struct moek_x8_layout {
	uint8_t n;
	struct moek_x8_segment seg[4];
	/* the unit interleaved as one block, where it is not the format's own block (BF16's
	 * is one element: 16 of them make the one vector segment a group dot reads per step) */
	uint16_t block_elems, block_bytes;
};
/* interleave.c: the layouts the format table's rows point to */
extern const struct moek_x8_layout moek_x8_mxfp4, moek_x8_q8_0, moek_x8_q4_K, moek_x8_bf16,
    moek_x8_int4_g32, moek_x8_nvfp4, moek_x8_q2_K, moek_x8_q3_K, moek_x8_iq4_nl, moek_x8_iq4_xs;

struct moek_format_traits {
	struct moek_format_info info; /* the public part: id, name, block, bytes, alignment,
	                                 scale layout */
	bool ggml; /* info.format is a ggml type id (GGUF stores these weights under it) */
	/* activation format of its SIMD dot product: Q8_0/Q8_K for integer products; BF16 for
	 * 16-bit float weights (halves the activation's L1 footprint, so rows of 7168+ columns
	 * stream from DRAM without evicting the token); F32 otherwise */
	uint32_t vec_dot_format;
	/* granularity of a column slice of a down matrix in this format beyond its block and its
	 * activation's block (1: none): 64 where an ISA feeds it activations in pairs of 32-blocks
	 * (MOEK_ACT_Q8_0X2), so that a slice is the same whatever the ISA */
	uint32_t down_split_align;
	const struct moek_x8_layout *x8; /* interleaved layout (NULL: none) */
	/* reference codecs of n elements (a multiple of the block): formats with their scales in
	 * the blocks (info.scale_block == 0) */
	void (*quantize_row)(const float *x, void *dst, size_t n);
	void (*dequantize_row)(const void *src, float *dst, size_t n);
	/* formats with scales of their own (info.scale_block > 0): a whole matrix (the scales
	 * span rows), and a row with its scales (scale_row[c / scale_block] multiplies column c) */
	void (*quantize_scaled)(const float *src, size_t rows, size_t cols, void *dst,
	                        float *scales);
	void (*dequantize_row_scaled)(const void *src, const float *scale_row, float *dst,
	                              size_t n);
};

/* The table: row f is format f's (every index below MOEK_FMT_COUNT has one). */
extern const struct moek_format_traits moek_formats[MOEK_FMT_COUNT];

/* The row of public id `format`, or NULL if the id is not a known format; row i in table
 * order (NULL past the end). */
const struct moek_format_traits *moek_format_traits(uint32_t format);
const struct moek_format_traits *moek_format_traits_at(size_t i);

/* Bytes of n elements of format f (a multiple of its block): the table's arithmetic on an
 * index the caller already has. */
static inline size_t moek_fmt_row_bytes(enum moek_fmt f, size_t n)
{
	return n / moek_formats[f].info.block_elems * moek_formats[f].info.block_bytes;
}

/* The unit an interleaved `format` stores the 8 rows of side by side (moek_interleave): its
 * elements (0: no interleaved layout) and, in *block_bytes when not NULL, its bytes. The
 * format's own block, except BF16's: 16 elements. Interleaved columns, offsets and slices
 * come in these units. */
size_t moek_x8_block(uint32_t format, size_t *block_bytes);
/* Blocks [b0, b0 + nb) of row `lane` (0..7) of an interleaved group of `format` (moe_kernels.h,
 * moek_interleave) back as GGUF blocks (units of moek_x8_block). */
void moek_x8_gather(uint32_t format, const void *group, size_t lane, size_t b0, size_t nb,
                    void *blocks);
/* Columns [k0, k0 + n) (both even) of row `lane` of an interleaved BF16 group as f32, read
 * straight from the pairs: the prefill tiles' path (through a gather into GGUF rows, BF16x8 at
 * 512 tokens ran at 0.81-1.0 of BF16 rows; this way 0.95-0.98). */
void moek_x8_bf16_row(const void *group, size_t lane, size_t k0, size_t n, float *dst);

/* Whether e is a valid expert (formats, shapes, alignment, layout): 0, or -1 with a message
 * in err (ffn.c). */
int moek_expert_check(const struct moek_expert *e, char *err, size_t len);

/* Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes. */
static inline void moek_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
	}
}

/* Q3_K: the 16 scales (6 bits, 0..63, value + 32) from the 12 packed bytes: low 4 bits in
 * the low (j < 8) or high (j >= 8) nibble of byte j % 8, high 2 bits at bit 2 (j / 4) of byte
 * 8 + j % 4. Read as 3 little-endian words, 4 scales per word. */
static inline void moek_q3_scales(const uint8_t q[K_SCALE_SIZE], uint8_t sc[16])
{
	uint32_t a[3], s[4];
	memcpy(a, q, sizeof(a));
	s[0] = (a[0] & 0x0f0f0f0fu) | ((a[2] & 0x03030303u) << 4);
	s[1] = (a[1] & 0x0f0f0f0fu) | (((a[2] >> 2) & 0x03030303u) << 4);
	s[2] = ((a[0] >> 4) & 0x0f0f0f0fu) | (((a[2] >> 4) & 0x03030303u) << 4);
	s[3] = ((a[1] >> 4) & 0x0f0f0f0fu) | (((a[2] >> 6) & 0x03030303u) << 4);
	memcpy(sc, s, sizeof(s));
}

/* A row quantizer `name##_rows` (static inline, always_inline helpers) built twice, for
 * baseline x86-64 and for AVX2, behind one entry point picked per call by the CPU: `entry` is
 * its declarator ("static void quantize_q4_K", "void moek_quantize_iq4_nl"). No FMA in either
 * copy (ISO C mode: no contraction), so both give the same bits. Not target_clones: its ifunc
 * resolver runs before the sanitizer runtimes start and crashes TSan builds. */
#if defined(__x86_64__) && defined(__GNUC__)
#define MOEK_AVX2_DISPATCH(name, entry)                                                            \
	__attribute__((target("avx2"))) static void name##_avx2(const float *x, void *dst,         \
	                                                        size_t n)                          \
	{                                                                                          \
		name##_rows(x, dst, n);                                                            \
	}                                                                                          \
	static void name##_base(const float *x, void *dst, size_t n)                               \
	{                                                                                          \
		name##_rows(x, dst, n);                                                            \
	}                                                                                          \
	entry(const float *x, void *dst, size_t n)                                                 \
	{                                                                                          \
		if (moek_cpu_features() & MOEK_CPU_AVX2)                                           \
			name##_avx2(x, dst, n);                                                    \
		else                                                                               \
			name##_base(x, dst, n);                                                    \
	}
#else
#define MOEK_AVX2_DISPATCH(name, entry)                                                            \
	entry(const float *x, void *dst, size_t n)                                                 \
	{                                                                                          \
		name##_rows(x, dst, n);                                                            \
	}
#endif

/* Reference row codecs (formats.c). n is a multiple of the format's block. FP8 rows take
 * their per-128-column scales: scale_row[c / 128] multiplies column c. */
void moek_ref_dequantize_row(uint32_t format, const void *src, const float *scale_row, float *dst,
                             size_t n);
/* The same for the format at index f. */
void moek_fmt_dequantize_ref(enum moek_fmt f, const void *src, const float *scale_row, float *dst,
                             size_t n);

/* The activation format a weight format's SIMD dot product consumes: MOEK_Q8_0, MOEK_Q8_K,
 * MOEK_BF16 (F16/BF16 weights) or MOEK_F32 (F32 and FP8 weights). */
uint32_t moek_vec_dot_format(uint32_t weight_format);

/* ---- Per-ISA kernels -------------------------------------------------------------------
 * dot: one weight row (k columns) against nt (1..MOEK_DOT_TOKENS) activation rows, row t at
 * act + t * act_stride bytes, in the format moek_vec_dot_format(weight format) (f32 for float
 * formats); out[t] receives row · token t. Weights are decoded once for all nt tokens.
 * scale_row is the FP8 scales of this row's 128-row band (NULL otherwise). The result for a
 * (row, token) pair depends only on the row, the token and nt — never on which range the row
 * is in: the FFN's split determinism rests on it (token groups are fixed by token index).
 */
#define MOEK_DOT_TOKENS 8
typedef void (*moek_dot_fn)(const void *w, const float *scale_row, const void *act,
                            size_t act_stride, size_t nt, size_t k, float *out);
/* dot_rows: nr weight rows (row r at w + r * row_stride) against one token's activation row,
 * out[r] = row r · token — exactly the bits dot gives for that row with nt = 1 (the same
 * operations per row), so a row range may be split between the two anywhere. It saves the
 * per-row call and set-up that weigh on short rows (Qwen3's 768 columns). Not for FP8. */
typedef void (*moek_dot_rows_fn)(const void *w, size_t row_stride, size_t nr, const void *act,
                                 size_t k, float *out);
/* dot_x8: the 8 rows of an interleaved group (moek_interleave; k columns) against nt
 * (1..MOEK_DOT_TOKENS) tokens' activation rows (act_stride bytes apart), in the activation
 * format moek_isa_act_format(ops, format, true) gives: out[t * 8 + r]. */
typedef void (*moek_dot_x8_fn)(const void *group, const void *act, size_t act_stride, size_t nt,
                               size_t k, float *out);
/* dequantize: a row of k elements of one format into f32, bit-identical to the reference
 * (scale_row: FP8's, as for dot). */
typedef void (*moek_dequant_fn)(const void *w, const float *scale_row, float *dst, size_t k);
/* Prefill micro-kernel, one panel of 16 tokens: c[r * ldc + j] += Σ_k w[r * ldw + k] *
 * xp[k * 16 + j] for r < nr, j < 16; k a multiple of 8 (operands zero-padded). Each (r, j) is
 * one FMA chain in k order whatever nr is (determinism, as above). */
typedef void (*moek_tile_fn)(const float *w, size_t ldw, size_t nr, const float *xp, size_t k,
                             float *c, size_t ldc);
/* BF16 prefill micro-kernel: c[r * ldc + p * 16 + j] += Σ_k w[r * ldw + k] · x(p, j, k) for
 * r < nr, j < 16, p < np; w: bf16 rows (ldw elements apart), k a multiple of 32 (operands
 * zero-padded); xp: np panels of 16 tokens, panel p at xp + p * xp_stride elements, element
 * (k, j) of a panel at [(k / 2) * 32 + j * 2 + k % 2] (pairs of k per token: vdpbf16ps's and
 * AMX's B layout). Each (r, j) sum depends only on its row, token and k — never on nr, np or
 * where the row is (determinism). */
typedef void (*moek_tile_bf16_fn)(const uint16_t *w, size_t ldw, size_t nr, const uint16_t *xp,
                                  size_t xp_stride, size_t np, size_t k, float *c, size_t ldc);
/* The weight formats the bf16 tiles take where an ISA has them: every one whose values bf16
 * holds well enough next to its own error, i.e. all but F32 (kept exact) and FP8 (its f32
 * block scales make values bf16 would round; both keep the f32 tiles). */
static inline bool moek_tile_bf16_takes(uint32_t format)
{
	return format != MOEK_F32 && format != MOEK_FP8_E4M3_B128;
}

/* ISA-private activation formats: layouts an ISA's dot products prefer over the ggml ones.
 * MOEK_ACT_Q8_0X2 (AVX2, for Q4_0, MXFP4 and IQ4_NL weights): Q8_0 quantization (d = amax/127 per
 * 32 elements, f32 d) stored per pair of blocks in the lane order of a 256-bit nibble unpack, so
 * the dot product loads activations and scales without shuffles. A row of k elements (k a
 * multiple of 32) takes ceil(k / 64) pairs; a missing last block is zeros. neg_sum16 lets the
 * dot product feed weights as unsigned bytes with a constant offset (Q4_0 codes 0..15 = value
 * + 8, MXFP4 doubled E2M1 values + 16, IQ4_NL levels + 128 with 8 times it) and take
 * offset · Σy per lane back out — negated, so that it is the starting value of a vpdpbusd
 * accumulation. */
#define MOEK_ACT_Q8_0X2 2001u
struct block_q8_0x2 {
	float d[8];    /* d of block 2p in lanes 0-3, of block 2p+1 in lanes 4-7 */
	int8_t lo[32]; /* elements 0-15 of block 2p, then 0-15 of block 2p+1 */
	int8_t hi[32]; /* elements 16-31 of block 2p, then 16-31 of block 2p+1 */
	/* -16 · (lo[4j..4j+3] + hi[4j..4j+3]): lane j of maddubs(lo) + maddubs(hi) summed by
	 * madd(1) (or of two vpdpbusd) covers exactly those 8 activations */
	int32_t neg_sum16[8];
};
static_assert(sizeof(struct block_q8_0x2) == 128, "Q8_0x2 pair");

/* MOEK_ACT_Q8_0S (AVX2, for interleaved Q8_0 and MXFP4 weights): the same Q8_0 quantization
 * (f32 d = amax/127, unrounded) per 32-element block, elements in order, with -16 times the
 * sum of the block's 32 values: the interleaved dots broadcast 4 activations at a time and
 * take a weight offset back out of the int32 sum — MXFP4 codes enter as doubled value + 16
 * (the field is their accumulator's start), Q8_0 weights xor 0x80 as value + 128 (8 times
 * the field). */
#define MOEK_ACT_Q8_0S 2002u
struct block_q8_0s {
	float d;
	int32_t neg16_sum;
	int8_t qs[32];
};
static_assert(sizeof(struct block_q8_0s) == 40, "Q8_0s block");

struct moek_isa_ops {
	const char *name;
	/* per weight format, indexed by enum moek_fmt (MOEK_FMT_NONE: always NULL) */
	moek_dot_fn dot[MOEK_FMT_SLOTS];           /* row dots */
	moek_dot_rows_fn dot_rows[MOEK_FMT_SLOTS]; /* the same, one token, many rows (NULL: none) */
	moek_dot_x8_fn dot_x8[MOEK_FMT_SLOTS];     /* interleaved groups (NULL: none) */
	/* dot (token_exact) and dot_x8 (token_exact_x8) give each token the bits nt = 1 gives
	 * it, whatever nt: the batch-invariant FFN runs them 8 tokens at a time, and the others
	 * one token at a time (test_batch_invariant checks every true entry) */
	bool token_exact[MOEK_FMT_SLOTS], token_exact_x8[MOEK_FMT_SLOTS];
	/* for a dot that is not token-exact, a form that is (NULL: none): the same bits for a
	 * token as dot with nt = 1, at any nt */
	moek_dot_fn dot_exact[MOEK_FMT_SLOTS];
	moek_dot_x8_fn dot_x8_exact[MOEK_FMT_SLOTS]; /* the same for group dots */
	/* the activation format a weight format's dot (act) and group dot (act_x8) consume: a
	 * private one (MOEK_ACT_*), or 0: the row's vec_dot_format */
	uint32_t act[MOEK_FMT_SLOTS], act_x8[MOEK_FMT_SLOTS];
	/* the private activation formats (all NULL when the ISA has none): bytes of a k-element
	 * row, the quantizer and its inverse (k a multiple of 32; dst/src at a pair boundary).
	 * The quantizer also takes MOEK_Q8_K (k a multiple of 256), bit-identical to the
	 * reference. */
	size_t (*act_row_bytes)(uint32_t act_format, size_t k);
	void (*quantize_act)(uint32_t act_format, const float *x, size_t k, void *dst);
	void (*dequantize_act)(uint32_t act_format, const void *src, size_t k, float *dst);
	moek_dequant_fn dequantize[MOEK_FMT_SLOTS]; /* the prefill tiles' (NULL: the reference) */
	float (*dot_f32)(const float *a, const float *b, size_t k);
	moek_tile_fn tile;
	bool prefill; /* has the dequantized-tile path (MOEK_PREFILL_MIN_TOKENS) */
	/* bf16 tiles (NULL: none) for the formats moek_tile_bf16_takes, from the token count
	 * tile_bf16_from gives for a gate format ([1]: in interleaved groups), with f32 → bf16
	 * rounding to nearest even (dequantized weight rows, activation rows: n elements) */
	moek_tile_bf16_fn tile_bf16;
	unsigned tile_bf16_from[2][MOEK_FMT_SLOTS];
	/* whether the bf16 tiles also take over from interleaved integer formats, whose group
	 * dots run in every phase (ffn.c: "integer groups"), from tile_bf16_from[1] — where the
	 * tiles are AMX's; an FMA ISA's bf16 tiles never catch those dots up */
	bool tile_bf16_int_groups;
	void (*round_bf16)(const float *src, uint16_t *dst, size_t n);
	/* moek_interleave's inner step (NULL: the portable loop): out[32 w + 4 r ..] = the 4
	 * bytes at rows + r · stride + 4 w, for w < words, r < 8. */
	void (*x8_transpose)(const uint8_t *rows, size_t stride, size_t words, uint8_t *out);
	/* The decode chunks' activation (NULL: ffn.c's scalar one, libm expf): for i < n,
	 * h[i] = act(h[i] + bg[i], u[i] + bu[i]) (bg, bu NULL: no bias) — SwiGLU, or with oai
	 * gpt-oss's clamped form (limit, alpha). An element gets the same bits wherever it falls
	 * in a call, so splits of the rows do not show. */
	void (*swiglu)(float *h, const float *u, const float *bg, const float *bu, size_t n,
	               bool oai, float limit, float alpha);
	/* The kernels this ISA runs for `format` in decode or in prefill, in a few words for
	 * logs (moek_isa_format_path; NULL: the ISA's name). */
	const char *(*describe)(uint32_t format, bool prefill);
};

/* The activation format `ops` feeds a weight format's dot product with, its row size, and its
 * quantizer: the ISA's private one where it has one, else the ggml format. */
static inline uint32_t moek_isa_act_fmt(const struct moek_isa_ops *ops, enum moek_fmt f,
                                        bool interleaved)
{
	const uint32_t p = interleaved ? ops->act_x8[f] : ops->act[f];
	return p ? p : moek_formats[f].vec_dot_format;
}
/* The same by public id (tests, benchmarks). */
static inline uint32_t moek_isa_act_format(const struct moek_isa_ops *ops, uint32_t weight_format,
                                           bool interleaved)
{
	return moek_isa_act_fmt(ops, moek_fmt_index(weight_format), interleaved);
}
/* A row of format f into f32 the ISA's way (its dequantizer, else the reference). */
static inline void moek_isa_dequantize(const struct moek_isa_ops *ops, enum moek_fmt f,
                                       const void *w, const float *scale_row, float *dst, size_t k)
{
	if (ops->dequantize[f])
		ops->dequantize[f](w, scale_row, dst, k);
	else
		moek_fmt_dequantize_ref(f, w, scale_row, dst, k);
}
static inline bool moek_isa_private_act(uint32_t act)
{
	return act == MOEK_ACT_Q8_0X2 || act == MOEK_ACT_Q8_0S;
}
static inline size_t moek_isa_act_row_bytes(const struct moek_isa_ops *ops, uint32_t act, size_t k)
{
	return moek_isa_private_act(act) ? ops->act_row_bytes(act, k) : moek_row_bytes(act, k);
}
static inline void moek_isa_quantize_act(const struct moek_isa_ops *ops, uint32_t act,
                                         const float *x, size_t k, void *dst)
{
	if (moek_isa_private_act(act) || (act == MOEK_Q8_K && ops->quantize_act))
		ops->quantize_act(act, x, k, dst);
	else
		moek_quantize_row(act, x, k, dst);
}

static inline void moek_isa_dequantize_act(const struct moek_isa_ops *ops, uint32_t act,
                                           const void *src, size_t k, float *dst)
{
	if (moek_isa_private_act(act))
		ops->dequantize_act(act, src, k, dst);
	else
		moek_dequantize(act, src, NULL, 1, k, dst);
}

/* ---- Forms (isa.c) -------------------------------------------------------------------------
 * Variants of an ISA's kernels that give the same bits with other instructions, picked per
 * call by the kernels that have them: AVX2's VNNI forms (AVX512-VNNI on 256-bit registers:
 * vpdpbusd instead of maddubs + madd for Q8_0 / Q4_0 / MXFP4 / IQ4 / INT4_G32, vpdpwssd instead of
 * madd + add for Q4_K / Q5_K / Q6_K / Q2_K / Q3_K) and, within them, MXFP4's group dot with vpermb
 * (VBMI). Choosing an ISA turns on every form the CPU has for it; tests set them to reach each
 * form. Not thread-safe against running kernels, like moek_set_isa. */
enum moek_isa_form { MOEK_FORM_VNNI = 1u << 0, MOEK_FORM_VBMI = 1u << 1 };
/* The forms this CPU can run: VNNI with AVX512 F/BW/VL/VNNI, VBMI with AVX512-VBMI too. */
unsigned moek_isa_forms_available(void);
/* Turns on exactly `forms`: false (nothing changes) if the CPU lacks one of them or VBMI is
 * asked for without VNNI. */
bool moek_set_isa_forms(unsigned forms);
/* The forms on now: set before kernels run, read once per call, so relaxed is enough (hidden:
 * the dots reach it without an indirection). */
extern atomic_uint moek_isa_forms_on __attribute__((visibility("hidden")));
static inline unsigned moek_isa_forms(void)
{
	return atomic_load_explicit(&moek_isa_forms_on, memory_order_relaxed);
}

extern const struct moek_isa_ops moek_scalar_ops;
/* The ops table of the active ISA (isa.c: chosen once, or by moek_set_isa). */
const struct moek_isa_ops *moek_isa_current(void);
/* Whether the active ISA is built on all of `features` (MOEK_CPU_* bits): code outside the ops
 * table that has SIMD forms of its own (convert.c) follows the ISA choice through this. */
bool moek_isa_active_has(unsigned features);
#if defined(__x86_64__)
extern const struct moek_isa_ops moek_avx2_ops;
/* The AVX-512 and AMX tables (x86_avx512.c, x86_amx.c): AVX2's with their own kernels in
 * place of some, filled by moek_avx512_build and then moek_amx_build (isa.c, once, when one
 * of them is first chosen). */
extern struct moek_isa_ops moek_avx512_ops, moek_amx_ops;
void moek_avx512_build(void);
void moek_amx_build(void);
/* INT4_G32's AVX2 paths (x86_avx2_int4.c), entries of moek_avx2_ops: the row dot against
 * MOEK_ACT_Q8_0X2 activations, its one-token many-row form, and the prefill dequantizer. */
void moek_avx2_dot_int4(const void *w, const float *scale_row, const void *act, size_t act_stride,
                        size_t nt, size_t k, float *out);
void moek_avx2_rows_int4(const void *w, size_t row_stride, size_t nr, const void *act, size_t k,
                         float *out);
/* Its token-exact form (moek_isa_ops.dot_exact). */
void moek_avx2_dot_int4_exact(const void *w, const float *scale_row, const void *act, size_t as,
                              size_t nt, size_t k, float *out);
void moek_avx2_dequantize_int4(const void *w, float *dst, size_t k);
/* The group dot of interleaved INT4_G32 rows against MOEK_ACT_Q8_0S activations (vpdpbusd
 * with MOEK_FORM_VNNI on; same bits). */
void moek_avx2_x8_int4(const void *group, const void *act, size_t act_stride, size_t nt, size_t k,
                       float *out);
/* The group dots of interleaved Q2_K and Q3_K rows against Q8_K activations
 * (x86_avx2_k23.c; vpdpbusd with MOEK_FORM_VNNI on, same bits). */
void moek_avx2_x8_q2_K(const void *group, const void *act, size_t act_stride, size_t nt, size_t k,
                       float *out);
void moek_avx2_x8_q3_K(const void *group, const void *act, size_t act_stride, size_t nt, size_t k,
                       float *out);
/* The group dot of interleaved IQ4_NL rows against MOEK_ACT_Q8_0S activations
 * (x86_avx2_iq4.c; vpdpbusd with MOEK_FORM_VNNI on, same bits). */
void moek_avx2_x8_iq4_nl(const void *group, const void *act, size_t act_stride, size_t nt, size_t k,
                         float *out);
/* The same for IQ4_XS against Q8_K activations. */
void moek_avx2_x8_iq4_xs(const void *group, const void *act, size_t act_stride, size_t nt, size_t k,
                         float *out);
/* The group dots' software prefetch (x86_avx2.c, x8_prefetch): each weight line `near` bytes
 * ahead into L1 and `near + gap` bytes ahead into L2; near 0: none. Set: for every token
 * count. The default, taken at the ISA choice unless set before: 1536 / 3072 for several
 * tokens; for one token it depends on the CPU (Intel: 1536 / 3072, others: none). Get: the
 * one-token setting. For benchmarks; same bits either way. */
void moek_avx2_set_group_prefetch(unsigned near, unsigned gap);
void moek_avx2_group_prefetch(unsigned *near, unsigned *gap);
/* x86_avx2_iq4.c: moek_avx2_ops' IQ4_NL dots (MOEK_ACT_Q8_0X2 activations) and IQ4_XS dots
 * (Q8_K), each picking its VNNI form per call; and their prefill dequantization, bit-identical
 * to the reference: returns the elements of [0, k) it wrote (0 for other formats). */
void moek_avx2_dot_iq4_nl(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                          size_t k, float *out);
void moek_avx2_rows_iq4_nl(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                           float *out);
void moek_avx2_dot_iq4_nl_exact(const void *w, const float *sr, const void *act, size_t as,
                                size_t nt, size_t k, float *out); /* dot_exact */
void moek_avx2_dot_iq4_xs(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                          size_t k, float *out);
void moek_avx2_rows_iq4_xs(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                           float *out);
size_t moek_avx2_dequantize_iq4(uint32_t format, const void *w, float *dst, size_t k);
/* x86_avx2_nvfp4.c: moek_avx2_ops' NVFP4 row dot (MOEK_ACT_Q8_0X2 activations: one 64-element
 * block is one activation pair), its many-row form and the prefill dequantizer (bit-identical
 * to the reference). */
void moek_avx2_dot_nvfp4(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                         size_t k, float *out);
void moek_avx2_rows_nvfp4(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                          float *out);
void moek_avx2_dequantize_nvfp4(const void *w, const float *sr, float *dst, size_t k);
/* The group dot of interleaved NVFP4 rows against MOEK_ACT_Q8_0S activations. */
void moek_avx2_x8_nvfp4(const void *group, const void *act, size_t as, size_t nt, size_t k,
                        float *out);
/* x86_avx2_iq.c: the i-quants' row dots and many-row dots against Q8_K (same bits as
 * moek_iq_dot_q8k_ref). */
void moek_avx2_dot_iq2_xxs(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                           size_t k, float *out);
void moek_avx2_rows_iq2_xxs(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                            float *out);
void moek_avx2_dot_iq2_xs(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                          size_t k, float *out);
void moek_avx2_rows_iq2_xs(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                           float *out);
void moek_avx2_dot_iq3_xxs(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                           size_t k, float *out);
void moek_avx2_rows_iq3_xxs(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                            float *out);
void moek_avx2_dot_iq3_s(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                         size_t k, float *out);
void moek_avx2_rows_iq3_s(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                          float *out);
void moek_avx2_dot_iq1_s(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                         size_t k, float *out);
void moek_avx2_rows_iq1_s(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                          float *out);
void moek_avx2_dot_iq1_m(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                         size_t k, float *out);
void moek_avx2_rows_iq1_m(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                          float *out);
void moek_avx2_dot_iq2_s(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                         size_t k, float *out);
void moek_avx2_rows_iq2_s(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                          float *out);
#endif

/* The compute shape a prepared call runs: row or group dots over quantized (or bf16)
 * activations, f32 tiles, or the ISA's bf16 tiles (bench_kernels: the peak a row is held to). */
enum moek_ffn_path { MOEK_PATH_DOTS, MOEK_PATH_GROUPS, MOEK_PATH_TILES_F32, MOEK_PATH_TILES_BF16 };
enum moek_ffn_path moek_ffn_call_path(const struct moek_ffn_call *c);

/* Token counts from which the AVX2 path switches from row dot products (memory-bound decode)
 * to dequantized weight tiles reused across tokens (compute-bound prefill): integer dot
 * products stay ahead longer than float ones, whose per-token FMAs are no cheaper than a
 * tile's — except interleaved float rows (BF16), whose group dot reuses each weight vector
 * for up to 8 tokens and takes the integer dots' count. */
#define MOEK_PREFILL_MIN_TOKENS 16
#define MOEK_PREFILL_MIN_TOKENS_FLOAT 8
/* Token counts from which the avx512 ISA's bf16 tiles take over (x86_avx512.c,
 * tile_bf16_from), where they beat the same ISA's decode dots: BF16 rows from 12 (a 12-token
 * call costs a 16-token panel), F16 and Q8_0 from 16, BF16 groups (BF16x8) from 24, every
 * other integer-dot format from 32 (docs/performance.md, "Kernel design measurements"; F16
 * not measured: one conversion more per weight than BF16). */
#define MOEK_PREFILL_MIN_TOKENS_BF16 32
#define MOEK_PREFILL_MIN_TOKENS_BF16_Q8_0 16
#define MOEK_PREFILL_MIN_TOKENS_BF16_ROWS 12
#define MOEK_PREFILL_MIN_TOKENS_BF16_F16 16
#define MOEK_PREFILL_MIN_TOKENS_BF16_GROUPS 24

/* ---- AMX BF16 prefill micro-kernel (x86_amx.c, amx_emu.c; shared body in x86_amx_tile.h) ----
 * c[r * ldc + p * 16 + j] += Σ_k w[r * ldw + k] · x(p, j, k) for r < nr, j < 16, p < np;
 * w: bf16 rows (ldw elements apart), k a multiple of 32 (operands zero-padded); xp: np panels
 * of 16 tokens, panel p at xp + p * xp_stride elements, element (k, j) of a panel at
 * [(k / 2) * 32 + j * 2 + k % 2] (pairs of k per token: vdpbf16ps's and AMX's B layout). Each
 * (r, j) sum depends only on its row, token and k — never on nr, np or where the row is
 * (determinism): c's value, then one tdpbf16ps per 32 columns in k order.
 * moek_amx_tile_bf16 runs the tile instructions: only where moek_cpu_features() has
 * MOEK_CPU_AMX (the process holds the tile-data permission), any thread; it loads its tile
 * configuration and releases the tiles in each call. moek_amx_tile_bf16_emulated runs the same
 * kernel on a plain-C model of the tiles (TDPBF16PS as the Intel SDM's pseudocode), on any CPU:
 * for tests; it aborts on any use of the tiles the hardware would fault on. */
#ifndef MOEK_TILE_BF16_FN
#define MOEK_TILE_BF16_FN
typedef void (*moek_tile_bf16_fn)(const uint16_t *w, size_t ldw, size_t nr, const uint16_t *xp,
                                  size_t xp_stride, size_t np, size_t k, float *c, size_t ldc);
#endif
#if defined(__x86_64__)
void moek_amx_tile_bf16(const uint16_t *w, size_t ldw, size_t nr, const uint16_t *xp,
                        size_t xp_stride, size_t np, size_t k, float *c, size_t ldc);
#endif
void moek_amx_tile_bf16_emulated(const uint16_t *w, size_t ldw, size_t nr, const uint16_t *xp,
                                 size_t xp_stride, size_t np, size_t k, float *c, size_t ldc);

/* Q8_0 prefill micro-kernel (AMX INT8, tdpbssd), the same way in two backends: for r < nr,
 * j < 16, p < np, per 32-column block b in order, c[r * ldc + p * 16 + j] += (d_w · d_x) · Σ_i
 * q_w[i] · q_x[i] — the block's exact int32 dot of the codes scaled by the weight row's f16
 * scale and the token's f32 one (each step rounded as written: a product, a product, a sum).
 * w: nr rows of k / 32 struct block_q8_0 (GGUF Q8_0 rows), row r at w + r * ldw bytes; xp: np
 * panels of k / 32 struct moek_q8_panel_block, panel p at xp + p * xp_stride bytes (4-byte
 * aligned); k a multiple of 32. Integer sums are exact, so the two backends give the same bits,
 * and an (r, j) sum does not depend on nr, np or where the row is. */
struct moek_q8_panel_block {
	int8_t qs[32 * 16]; /* code i of token j at [(i / 4) * 64 + j * 4 + i % 4] */
	float d[16];        /* token j's scale */
};
static_assert(sizeof(struct moek_q8_panel_block) == 576, "Q8_0 panel block");
#if defined(__x86_64__)
void moek_amx_tile_q8_0(const void *w, size_t ldw, size_t nr, const void *xp, size_t xp_stride,
                        size_t np, size_t k, float *c, size_t ldc);
#endif
void moek_amx_tile_q8_0_emulated(const void *w, size_t ldw, size_t nr, const void *xp,
                                 size_t xp_stride, size_t np, size_t k, float *c, size_t ldc);

#endif /* MOE_KERNELS_INTERNAL_H */
