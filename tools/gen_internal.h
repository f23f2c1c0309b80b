/* gen_internal.h — what the generator's two halves share (private to libmoe_gen).
 *
 * gen.c owns planning the expert tensors and writing the files (threads, buffers, headers);
 * gen_full.c owns the rest of a whole model (--full-model: embeddings, attention, norms,
 * shared experts, lm_head, the architecture's config.json and llama.cpp metadata) and the
 * entry point, moe_gen_write, which runs gen.c's writer with gen_full.c's part as a table
 * (struct gen_whole_model): gen_full.c calls gen.c, never the reverse. gen.c resolves the
 * options into a `struct gen_model` once; gen_full.c reads it and adds tensors through
 * gen_plan_matrix / gen_plan_vector. Header buffers are `struct membuf` (in memory,
 * a sticky out-of-memory flag checked once when the buffer is written).
 * Threading: everything here runs on the thread that called moe_gen_write.
 */
#ifndef MOE_GEN_INTERNAL_H
#define MOE_GEN_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "moe_gen.h"

/* The model the options describe, resolved once (defaults applied, limits checked). */
struct gen_model {
	const struct moe_gen_options *opt;
	const struct moe_model_preset *preset;
	bool gguf;       /* GGUF file(s); otherwise a Hugging Face directory */
	bool full;       /* --full-model: every tensor of the architecture */
	uint32_t format; /* moek format of the routed experts */
	uint32_t n_layers, n_experts, top_k, leading_dense;
	uint32_t moe_step; /* MoE blocks: L >= leading_dense and (L + 1) % moe_step == 0 */
	uint64_t hidden, ffn;
	uint64_t dense_ffn; /* GGUF feed_forward_length, HF intermediate_size; full models: the
	                     * dense layers' FFN (DeepSeek) */
	uint32_t alignment; /* GGUF general.alignment */
	/* --full-model only (0 otherwise) */
	uint32_t vocab, heads, kv_heads, head_dim;
	uint32_t q_lora_rank, kv_lora_rank, rope_dim; /* DeepSeek MLA; rope_dim: all archs */
	uint32_t nonexpert_format; /* attention, embeddings, dense FFNs (FP8: weights only) */
	uint32_t vector_format;    /* norms, biases, sinks */
};

struct gen; /* the writer (gen.c) */

/* Plans a rows x cols matrix (rows outputs, each a row of cols inputs) named `name`, stored
 * in `format`, values moe_gen_floats(seed, layer, 0, which, …). Safetensors FP8 weights get
 * their `NAME_scale_inv` block scales too. Returns 0 or -1 (out of memory, err set). */
int gen_plan_matrix(struct gen *g, const char *name, uint32_t layer, enum moe_gen_tensor which,
                    uint64_t rows, uint64_t cols, uint32_t format);
/* Plans a vector of n values (F32, F16 or BF16). */
int gen_plan_vector(struct gen *g, const char *name, uint32_t layer, enum moe_gen_tensor which,
                    uint64_t n, uint32_t format);

/* INT4 checkpoint tensors of a rows x cols float matrix (gen_int4.c): compressed-tensors
 * weight_packed + weight_scale (BF16), or GPTQ qweight + qzeros (v1) + scales (F16) + g_idx;
 * buffers of the sizes moek_int4_*_bytes give (g_idx: 4 · cols). */
void gen_int4_ct(const float *x, size_t rows, size_t cols, size_t group, uint8_t *packed,
                 uint8_t *scales);
void gen_int4_gptq(const float *x, size_t rows, size_t cols, size_t group, uint8_t *qweight,
                   uint8_t *qzeros, uint8_t *scales, uint8_t *g_idx);
/* AutoAWQ GEMM: qweight [cols, rows / 8] and qzeros [cols / group, rows / 8] in AWQ's nibble
 * order, scales F16 [cols / group, rows] (moek_int4_from_awq reads them back). */
void gen_int4_awq(const float *x, size_t rows, size_t cols, size_t group, uint8_t *qweight,
                  uint8_t *qzeros, uint8_t *scales);

/* ---- header buffers ------------------------------------------------------------------- */

struct membuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static inline void mb_put(struct membuf *m, const void *src, size_t n)
{
	if (m->oom)
		return;
	if (m->len + n > m->cap) {
		size_t nc = m->cap ? m->cap * 2 : 4096;
		while (nc < m->len + n)
			nc *= 2;
		char *np = realloc(m->p, nc);
		if (!np) {
			m->oom = true;
			return;
		}
		m->p = np;
		m->cap = nc;
	}
	memcpy(m->p + m->len, src, n);
	m->len += n;
}

static inline void mb_u32(struct membuf *m, uint32_t v)
{
	unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
	                      (unsigned char)(v >> 24)};
	mb_put(m, b, 4);
}

static inline void mb_u64(struct membuf *m, uint64_t v)
{
	unsigned char b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	mb_put(m, b, 8);
}

static inline void mb_str(struct membuf *m, const char *s)
{
	mb_u64(m, strlen(s));
	mb_put(m, s, strlen(s));
}

static inline void mb_printf(struct membuf *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void mb_printf(struct membuf *m, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(tmp)) {
		m->oom = true;
		return;
	}
	mb_put(m, tmp, (size_t)n);
}

/* config.json's quantization_config of a DeepSeek FP8 checkpoint (E4M3, 128x128 blocks). */
static inline void mb_fp8_quantization_config(struct membuf *m)
{
	mb_printf(m, "  \"quantization_config\": {\"quant_method\": \"fp8\", "
	             "\"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", "
	             "\"weight_block_size\": [128, 128]},\n");
}

/* GGUF metadata pairs; *n counts them. */
static inline void kv_u32(struct membuf *m, uint32_t *n, const char *key, uint32_t v)
{
	mb_str(m, key);
	mb_u32(m, GGUF_UINT32);
	mb_u32(m, v);
	(*n)++;
}

static inline void kv_u16(struct membuf *m, uint32_t *n, const char *key, uint16_t v)
{
	mb_str(m, key);
	mb_u32(m, GGUF_UINT16);
	unsigned char b[2] = {(unsigned char)v, (unsigned char)(v >> 8)};
	mb_put(m, b, 2);
	(*n)++;
}

static inline void kv_i32(struct membuf *m, uint32_t *n, const char *key, int32_t v)
{
	mb_str(m, key);
	mb_u32(m, GGUF_INT32);
	mb_u32(m, (uint32_t)v);
	(*n)++;
}

static inline void kv_f32(struct membuf *m, uint32_t *n, const char *key, float v)
{
	uint32_t u;
	memcpy(&u, &v, 4);
	mb_str(m, key);
	mb_u32(m, GGUF_FLOAT32);
	mb_u32(m, u);
	(*n)++;
}

static inline void kv_bool(struct membuf *m, uint32_t *n, const char *key, bool v)
{
	mb_str(m, key);
	mb_u32(m, GGUF_BOOL);
	unsigned char b = v;
	mb_put(m, &b, 1);
	(*n)++;
}

static inline void kv_str(struct membuf *m, uint32_t *n, const char *key, const char *v)
{
	mb_str(m, key);
	mb_u32(m, GGUF_STRING);
	mb_str(m, v);
	(*n)++;
}

/* The start of an array pair: the caller then puts `count` elements of elem_type. */
static inline void kv_array(struct membuf *m, uint32_t *n, const char *key, uint32_t elem_type,
                            uint64_t count)
{
	mb_str(m, key);
	mb_u32(m, GGUF_ARRAY);
	mb_u32(m, elem_type);
	mb_u64(m, count);
	(*n)++;
}

/* ---- the rest of a whole model -------------------------------------------------------- */

/* What --full-model adds, as a table gen_full.c hands to gen_write: the writer calls it
 * without knowing gen_full.c, so the calls point one way, gen_full.c → gen.c.
 * resolve: the --full-model dimensions (defaults scaled from the preset to the hidden size
 * given) and their checks; 0 or -1 with err set.
 * plan_*: the tensors before the first layer (embeddings), of layer L before its routed
 * experts (norms, attention) and after them (router bias, shared experts, or the dense FFN
 * of a dense layer), and after the last layer (final norm, lm_head); 0 or -1 (err set).
 * gguf_kvs: the architecture's remaining llama.cpp keys and the tokenizer (first split);
 * config: config.json; generation_config: generation_config.json. */
struct gen_whole_model {
	int (*resolve)(struct gen_model *m, struct sidecar_error *err);
	int (*plan_head)(struct gen *g, const struct gen_model *m);
	int (*plan_layer_attention)(struct gen *g, const struct gen_model *m, uint32_t L);
	int (*plan_layer_ffn)(struct gen *g, const struct gen_model *m, uint32_t L);
	int (*plan_tail)(struct gen *g, const struct gen_model *m);
	void (*gguf_kvs)(const struct gen_model *m, struct membuf *mb, uint32_t *n);
	void (*config)(const struct gen_model *m, struct membuf *mb);
	void (*generation_config)(const struct gen_model *m, struct membuf *mb);
};

/* gen.c: writes what opt describes, the rest of a whole model through `whole` when
 * opt->full_model is set; 0 or -1 with err set. moe_gen_write (gen_full.c) is this with
 * gen_full.c's table. */
int gen_write(const struct moe_gen_options *opt, const struct gen_whole_model *whole,
              struct sidecar_error *err);

#endif
