/* gen_full.c — `moe-gen --full-model`: the tensors of a whole model besides its routed
 * experts, under each architecture's real names, and the configuration that lets the tools
 * people use load it (transformers' config.json, llama.cpp's GGUF keys and a tokenizer).
 *
 * Names and shapes follow transformers' modeling code (safetensors, weights [out, in]) and
 * llama.cpp's tensor loader (GGUF, ne innermost first); docs/formats.md lists them and says
 * what was checked against which source. Values are moe_gen_floats() like the experts', so
 * a full model's experts are byte for byte those of the experts-only model of the same seed.
 * Dimensions not given are scaled from the preset to the hidden size (gen_full_resolve).
 * It also holds the generator's entry point, moe_gen_write: gen.c's writer run with this
 * file's part as a table, so calls point from here to gen.c only (gen_internal.h).
 */
#include <inttypes.h>

#include "gen_internal.h"
#include "moe_kernels.h"

#define DEFAULT_VOCAB 4096
#define BYTE_TOKENS 256
#define EOT_TOKEN 256 /* <|endoftext|>: bos and eos */
#define MIN_VOCAB (BYTE_TOKENS + 1)
#define MAX_VOCAB (1u << 22)

/* v · hidden / preset hidden, rounded up to a multiple of `step` (at least one step). */
static uint64_t scaled(const struct gen_model *m, uint64_t v, uint64_t step)
{
	uint64_t s = (v * m->hidden + m->preset->hidden - 1) / m->preset->hidden;
	s = (s + step - 1) / step * step;
	return s ? s : step;
}

static uint32_t scaled_count(const struct gen_model *m, uint32_t v)
{
	uint64_t s = (uint64_t)v * m->hidden / m->preset->hidden;
	return s ? (uint32_t)s : 1;
}

static int gen_full_resolve(struct gen_model *m, struct sidecar_error *err)
{
	const struct moe_gen_options *o = m->opt;
	const struct moe_model_preset *p = m->preset;
	const enum moe_arch arch = p->arch;
	m->vocab = o->vocab ? o->vocab : DEFAULT_VOCAB;
	if (m->vocab < MIN_VOCAB || m->vocab > MAX_VOCAB)
		return error_set(err, MOE_EINVAL,
		                 "vocab %u: between %d (256 byte tokens and <|endoftext|>) and "
		                 "%u",
		                 m->vocab, MIN_VOCAB, MAX_VOCAB);
	m->heads = o->heads ? o->heads : scaled_count(m, p->heads);
	if (arch == MOE_ARCH_OLMOE && !o->heads)
		while (m->hidden % m->heads) /* OLMoE: heads · head_dim = hidden */
			m->heads--;
	if (m->heads > 4096)
		return error_set(err, MOE_EINVAL, "heads %u: at most 4096", m->heads);
	if (arch == MOE_ARCH_DEEPSEEK || arch == MOE_ARCH_OLMOE) {
		m->kv_heads = o->kv_heads ? o->kv_heads : m->heads;
		if (m->kv_heads != m->heads)
			return error_set(
			    err, MOE_EINVAL,
			    "%s: --kv-heads must equal --heads (%s has as many key/value "
			    "heads as query heads)",
			    p->name, arch == MOE_ARCH_DEEPSEEK ? "MLA" : "OLMoE");
	} else {
		m->kv_heads = o->kv_heads ? o->kv_heads : scaled_count(m, p->kv_heads);
		if (!o->kv_heads)
			while (m->heads % m->kv_heads)
				m->kv_heads--;
		if (m->heads % m->kv_heads)
			return error_set(err, MOE_EINVAL, "kv heads %u must divide heads %u",
			                 m->kv_heads, m->heads);
	}
	if (arch == MOE_ARCH_OLMOE)
		m->head_dim = o->head_dim ? o->head_dim : (uint32_t)(m->hidden / m->heads);
	else
		m->head_dim = o->head_dim ? o->head_dim : p->head_dim;
	if (m->head_dim < 2 || m->head_dim > 1024 || m->head_dim % 2)
		return error_set(err, MOE_EINVAL,
		                 "head dim %u: even, 2 to 1024 (RoPE rotates pairs)", m->head_dim);
	if (arch == MOE_ARCH_OLMOE && (uint64_t)m->heads * m->head_dim != m->hidden)
		return error_set(err, MOE_EINVAL,
		                 "olmoe: heads %u x head dim %u must equal hidden %" PRIu64
		                 " (llama.cpp's OLMoE has square q and o projections)",
		                 m->heads, m->head_dim, m->hidden);
	m->rope_dim =
	    arch == MOE_ARCH_DEEPSEEK && p->rope_dim < m->head_dim ? p->rope_dim : m->head_dim;
	if (arch == MOE_ARCH_DEEPSEEK) {
		m->q_lora_rank = (uint32_t)scaled(m, p->q_lora_rank, 64);
		m->kv_lora_rank = (uint32_t)scaled(m, p->kv_lora_rank, 64);
	}
	/* the dense FFN: DeepSeek's leading layers (and Qwen3's intermediate_size, unused);
	 * Mixtral, OLMoE and gpt-oss name the expert FFN so (OLMoE's GGUF reads it) */
	if (arch == MOE_ARCH_DEEPSEEK || arch == MOE_ARCH_QWEN3MOE || arch == MOE_ARCH_QWEN2MOE)
		m->dense_ffn = scaled(m, p->dense_ffn, 256);
	else
		m->dense_ffn = m->ffn;
	/* what is not an expert is stored as the real checkpoints store it: GGUF norms in F32,
	 * matrices in F16 beside quantized experts; safetensors in BF16 (FP8 checkpoints keep
	 * their linear layers in FP8) */
	switch (m->format) {
	case MOEK_F32: m->nonexpert_format = MOEK_F32; break;
	case MOEK_F16: m->nonexpert_format = MOEK_F16; break;
	case MOEK_BF16: m->nonexpert_format = MOEK_BF16; break;
	default: m->nonexpert_format = m->gguf ? MOEK_F16 : MOEK_BF16; break;
	}
	m->vector_format = m->gguf ? MOEK_F32 : m->nonexpert_format;
	return 0;
}

/* Linear layers outside the experts (attention, dense FFN, shared experts). */
static uint32_t linear_format(const struct gen_model *m)
{
	return !m->gguf && m->format == MOEK_FP8_E4M3_B128 ? MOEK_FP8_E4M3_B128
	                                                   : m->nonexpert_format;
}

/* ---- tensors -------------------------------------------------------------------------- */

static int layer_matrix(struct gen *g, const struct gen_model *m, uint32_t L, const char *hf,
                        const char *gguf, enum moe_gen_tensor which, uint64_t rows, uint64_t cols,
                        uint32_t format)
{
	char name[112];
	if (m->gguf)
		snprintf(name, sizeof(name), "blk.%u.%s", L, gguf);
	else
		snprintf(name, sizeof(name), "model.layers.%u.%s", L, hf);
	return gen_plan_matrix(g, name, L, which, rows, cols, format);
}

static int layer_vector(struct gen *g, const struct gen_model *m, uint32_t L, const char *hf,
                        const char *gguf, enum moe_gen_tensor which, uint64_t n, uint32_t format)
{
	char name[112];
	if (m->gguf)
		snprintf(name, sizeof(name), "blk.%u.%s", L, gguf);
	else
		snprintf(name, sizeof(name), "model.layers.%u.%s", L, hf);
	return gen_plan_vector(g, name, L, which, n, format);
}

static int gen_full_plan_head(struct gen *g, const struct gen_model *m)
{
	return gen_plan_matrix(g, m->gguf ? "token_embd.weight" : "model.embed_tokens.weight", 0,
	                       MOE_GEN_EMBED, m->vocab, m->hidden, m->nonexpert_format);
}

static int gen_full_plan_tail(struct gen *g, const struct gen_model *m)
{
	if (gen_plan_vector(g, m->gguf ? "output_norm.weight" : "model.norm.weight", 0,
	                    MOE_GEN_NORM_FINAL, m->hidden, m->vector_format))
		return -1;
	return gen_plan_matrix(g, m->gguf ? "output.weight" : "lm_head.weight", 0, MOE_GEN_LM_HEAD,
	                       m->vocab, m->hidden, m->nonexpert_format);
}

/* DeepSeek's multi-head latent attention (the unsplit kv_b of llama.cpp's non-MLA path). */
static int plan_mla(struct gen *g, const struct gen_model *m, uint32_t L)
{
	const uint64_t H = m->hidden, nh = m->heads, qk = m->head_dim + m->rope_dim;
	const uint64_t ql = m->q_lora_rank, kvl = m->kv_lora_rank;
	const uint32_t f = linear_format(m), v = m->vector_format;
	if (layer_matrix(g, m, L, "self_attn.q_a_proj.weight", "attn_q_a.weight", MOE_GEN_ATTN_Q_A,
	                 ql, H, f) ||
	    layer_vector(g, m, L, "self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight",
	                 MOE_GEN_NORM_Q_A, ql, v) ||
	    layer_matrix(g, m, L, "self_attn.q_b_proj.weight", "attn_q_b.weight", MOE_GEN_ATTN_Q_B,
	                 nh * qk, ql, f) ||
	    layer_matrix(g, m, L, "self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight",
	                 MOE_GEN_ATTN_KV_A, kvl + m->rope_dim, H, f) ||
	    layer_vector(g, m, L, "self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight",
	                 MOE_GEN_NORM_KV_A, kvl, v) ||
	    layer_matrix(g, m, L, "self_attn.kv_b_proj.weight", "attn_kv_b.weight",
	                 MOE_GEN_ATTN_KV_B, nh * (m->head_dim + m->head_dim), kvl, f))
		return -1;
	return layer_matrix(g, m, L, "self_attn.o_proj.weight", "attn_output.weight",
	                    MOE_GEN_ATTN_O, H, nh * m->head_dim, f);
}

static int gen_full_plan_layer_attention(struct gen *g, const struct gen_model *m, uint32_t L)
{
	const enum moe_arch arch = m->preset->arch;
	const uint64_t H = m->hidden, q = (uint64_t)m->heads * m->head_dim,
	               kv = (uint64_t)m->kv_heads * m->head_dim;
	const uint32_t f = linear_format(m), v = m->vector_format;
	if (layer_vector(g, m, L, "input_layernorm.weight", "attn_norm.weight", MOE_GEN_NORM_ATTN,
	                 H, v))
		return -1;
	if (arch == MOE_ARCH_DEEPSEEK) {
		if (plan_mla(g, m, L))
			return -1;
	} else if (layer_matrix(g, m, L, "self_attn.q_proj.weight", "attn_q.weight", MOE_GEN_ATTN_Q,
	                        q, H, f) ||
	           layer_matrix(g, m, L, "self_attn.k_proj.weight", "attn_k.weight", MOE_GEN_ATTN_K,
	                        kv, H, f) ||
	           layer_matrix(g, m, L, "self_attn.v_proj.weight", "attn_v.weight", MOE_GEN_ATTN_V,
	                        kv, H, f) ||
	           layer_matrix(g, m, L, "self_attn.o_proj.weight", "attn_output.weight",
	                        MOE_GEN_ATTN_O, H, q, f)) {
		return -1;
	}
	if (arch == MOE_ARCH_QWEN3MOE || arch == MOE_ARCH_QWEN2MOE || arch == MOE_ARCH_OLMOE) {
		/* Qwen3 normalises each head (head_dim); OLMoE the whole q and k */
		const bool per_head = arch != MOE_ARCH_OLMOE;
		if (layer_vector(g, m, L, "self_attn.q_norm.weight", "attn_q_norm.weight",
		                 MOE_GEN_NORM_Q, per_head ? m->head_dim : q, v) ||
		    layer_vector(g, m, L, "self_attn.k_norm.weight", "attn_k_norm.weight",
		                 MOE_GEN_NORM_K, per_head ? m->head_dim : kv, v))
			return -1;
	}
	if (arch == MOE_ARCH_GPT_OSS &&
	    (layer_vector(g, m, L, "self_attn.q_proj.bias", "attn_q.bias", MOE_GEN_ATTN_Q_BIAS, q,
	                  v) ||
	     layer_vector(g, m, L, "self_attn.k_proj.bias", "attn_k.bias", MOE_GEN_ATTN_K_BIAS, kv,
	                  v) ||
	     layer_vector(g, m, L, "self_attn.v_proj.bias", "attn_v.bias", MOE_GEN_ATTN_V_BIAS, kv,
	                  v) ||
	     layer_vector(g, m, L, "self_attn.o_proj.bias", "attn_output.bias", MOE_GEN_ATTN_O_BIAS,
	                  H, v) ||
	     layer_vector(g, m, L, "self_attn.sinks", "attn_sinks.weight", MOE_GEN_ATTN_SINKS,
	                  m->heads, v)))
		return -1;
	/* gpt-oss's GGUF calls the norm before the MoE block post_attention_norm */
	return layer_vector(g, m, L, "post_attention_layernorm.weight",
	                    arch == MOE_ARCH_GPT_OSS ? "post_attention_norm.weight"
	                                             : "ffn_norm.weight",
	                    MOE_GEN_NORM_FFN, H, v);
}

/* A SwiGLU FFN of `ffn` (a dense layer's MLP, or the shared experts side by side). */
static int plan_swiglu(struct gen *g, const struct gen_model *m, uint32_t L, const char *hf,
                       const char *gguf, uint64_t ffn)
{
	static const char *const hf_proj[3] = {"gate_proj", "up_proj", "down_proj"};
	static const char *const gguf_proj[3] = {"ffn_gate", "ffn_up", "ffn_down"};
	static const enum moe_gen_tensor which[3] = {MOE_GEN_FFN_GATE, MOE_GEN_FFN_UP,
	                                             MOE_GEN_FFN_DOWN};
	for (int k = 0; k < 3; k++) {
		char hn[80], gn[80];
		snprintf(hn, sizeof(hn), "%s%s.weight", hf, hf_proj[k]);
		snprintf(gn, sizeof(gn), "%s%s.weight", gguf_proj[k], gguf);
		if (layer_matrix(g, m, L, hn, gn, which[k], k == 2 ? m->hidden : ffn,
		                 k == 2 ? ffn : m->hidden, linear_format(m)))
			return -1;
	}
	return 0;
}

static int gen_full_plan_layer_ffn(struct gen *g, const struct gen_model *m, uint32_t L)
{
	switch (m->preset->arch) {
	case MOE_ARCH_DEEPSEEK:
		if (L < m->leading_dense)
			return plan_swiglu(g, m, L, "mlp.", "", m->dense_ffn);
		/* the router's score-correction bias, F32 in the checkpoint too */
		if (layer_vector(g, m, L, "mlp.gate.e_score_correction_bias", "exp_probs_b.bias",
		                 MOE_GEN_ROUTER_BIAS, m->n_experts, MOEK_F32))
			return -1;
		return plan_swiglu(g, m, L, "mlp.shared_experts.", "_shexp",
		                   m->ffn * m->preset->n_shared);
	case MOE_ARCH_GPT_OSS:
		return layer_vector(g, m, L, "mlp.router.bias", "ffn_gate_inp.bias",
		                    MOE_GEN_ROUTER_BIAS, m->n_experts, m->vector_format);
	default: return 0;
	}
}

/* ---- GGUF metadata and tokenizer ---------------------------------------------------------- */

/* GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the others
 * for U+0100 onwards in byte order, so every byte is one visible character. */
static bool byte_is_printable(unsigned b)
{
	return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

static void byte_token(unsigned b, char out[4])
{
	unsigned cp = b;
	if (!byte_is_printable(b)) {
		cp = 256;
		for (unsigned c = 0; c < b; c++)
			cp += !byte_is_printable(c);
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = '\0';
	} else {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = '\0';
	}
}

static void gen_full_gguf_kvs(const struct gen_model *m, struct membuf *mb, uint32_t *n)
{
	const enum moe_arch arch = m->preset->arch;
	const char *a = moe_arch_gguf_name(arch);
	char k[128];
#define KEY(suffix) (snprintf(k, sizeof(k), "%s." suffix, a), k)
	kv_u32(mb, n, KEY("context_length"), m->preset->max_positions);
	kv_u32(mb, n, KEY("vocab_size"), m->vocab);
	kv_u32(mb, n, KEY("attention.head_count"), m->heads);
	kv_u32(mb, n, KEY("attention.head_count_kv"), m->kv_heads);
	kv_u32(mb, n, KEY("attention.key_length"),
	       arch == MOE_ARCH_DEEPSEEK ? m->head_dim + m->rope_dim : m->head_dim);
	kv_u32(mb, n, KEY("attention.value_length"), m->head_dim);
	kv_f32(mb, n, KEY("attention.layer_norm_rms_epsilon"), (float)m->preset->rms_eps);
	kv_u32(mb, n, KEY("rope.dimension_count"), m->rope_dim);
	kv_f32(mb, n, KEY("rope.freq_base"), (float)m->preset->rope_theta);
	if (arch == MOE_ARCH_DEEPSEEK) {
		kv_u32(mb, n, KEY("attention.q_lora_rank"), m->q_lora_rank);
		kv_u32(mb, n, KEY("attention.kv_lora_rank"), m->kv_lora_rank);
	}
	if (arch == MOE_ARCH_GPT_OSS) {
		kv_u32(mb, n, KEY("attention.sliding_window"), 128);
		kv_str(mb, n, KEY("rope.scaling.type"), "yarn");
		kv_f32(mb, n, KEY("rope.scaling.factor"), 32.0f);
		kv_u32(mb, n, KEY("rope.scaling.original_context_length"), 4096);
	}
#undef KEY
	/* a byte-level BPE vocabulary without merges: any text tokenizes, one token per byte */
	kv_str(mb, n, "tokenizer.ggml.model", "gpt2");
	kv_str(mb, n, "tokenizer.ggml.pre", arch == MOE_ARCH_QWEN3MOE ? "qwen2" : "default");
	kv_array(mb, n, "tokenizer.ggml.tokens", GGUF_STRING, m->vocab);
	for (uint32_t t = 0; t < m->vocab; t++) {
		char s[32];
		if (t < BYTE_TOKENS)
			byte_token(t, s);
		else if (t == EOT_TOKEN)
			snprintf(s, sizeof(s), "<|endoftext|>");
		else
			snprintf(s, sizeof(s), "[PAD%u]", t);
		mb_str(mb, s);
	}
	kv_array(mb, n, "tokenizer.ggml.token_type", GGUF_INT32, m->vocab);
	for (uint32_t t = 0; t < m->vocab; t++) /* NORMAL 1, CONTROL 3, UNUSED 5 */
		mb_u32(mb, t < BYTE_TOKENS ? 1 : t == EOT_TOKEN ? 3 : 5);
	kv_array(mb, n, "tokenizer.ggml.merges", GGUF_STRING, 0);
	kv_u32(mb, n, "tokenizer.ggml.bos_token_id", EOT_TOKEN);
	kv_u32(mb, n, "tokenizer.ggml.eos_token_id", EOT_TOKEN);
	kv_bool(mb, n, "tokenizer.ggml.add_bos_token", false);
}

/* ---- config.json ---------------------------------------------------------------------- */

static const char *torch_dtype(uint32_t format)
{
	return format == MOEK_F32 ? "float32" : format == MOEK_F16 ? "float16" : "bfloat16";
}

static void gen_full_config(const struct gen_model *m, struct membuf *mb)
{
	const struct moe_model_preset *p = m->preset;
	const enum moe_arch arch = p->arch;
	static const char *const class_name[MOE_ARCH_COUNT] = {
	    [MOE_ARCH_QWEN2MOE] = "Qwen2MoeForCausalLM",
	    [MOE_ARCH_QWEN3MOE] = "Qwen3MoeForCausalLM",
	    [MOE_ARCH_MIXTRAL] = "MixtralForCausalLM",
	    [MOE_ARCH_DEEPSEEK] = "DeepseekV3ForCausalLM",
	    [MOE_ARCH_GPT_OSS] = "GptOssForCausalLM",
	    [MOE_ARCH_OLMOE] = "OlmoeForCausalLM"};
	/* the keys of the published config.json, in the same spelling */
	mb_printf(mb, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n",
	          class_name[arch], moe_arch_model_type(arch));
	mb_printf(mb,
	          "  \"vocab_size\": %u,\n  \"hidden_size\": %" PRIu64
	          ",\n  \"num_hidden_layers\": %u,\n  \"num_attention_heads\": %u,\n"
	          "  \"num_key_value_heads\": %u,\n",
	          m->vocab, m->hidden, m->n_layers, m->heads, m->kv_heads);
	mb_printf(mb,
	          "  \"max_position_embeddings\": %u,\n  \"rms_norm_eps\": %g,\n"
	          "  \"rope_theta\": %.1f,\n  \"hidden_act\": \"silu\",\n"
	          "  \"tie_word_embeddings\": false,\n  \"attention_bias\": %s,\n"
	          "  \"attention_dropout\": 0.0,\n  \"initializer_range\": 0.02,\n"
	          "  \"use_cache\": true,\n",
	          p->max_positions, p->rms_eps, p->rope_theta,
	          arch == MOE_ARCH_GPT_OSS ? "true" : "false");
	mb_printf(mb,
	          "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n"
	          "  \"num_experts_per_tok\": %u,\n  \"output_router_logits\": false,\n",
	          EOT_TOKEN, EOT_TOKEN, m->top_k);
	switch (arch) {
	case MOE_ARCH_MIXTRAL:
		mb_printf(mb,
		          "  \"head_dim\": %u,\n  \"intermediate_size\": %" PRIu64 ",\n"
		          "  \"num_local_experts\": %u,\n  \"router_aux_loss_coef\": 0.02,\n"
		          "  \"router_jitter_noise\": 0.0,\n  \"sliding_window\": null,\n",
		          m->head_dim, m->ffn, m->n_experts);
		break;
	case MOE_ARCH_DEEPSEEK: {
		/* expert groups as V3's 8 groups of which 4 are kept, where the experts allow */
		uint32_t groups = m->n_experts % 8 == 0 && m->n_experts / 8 * 4 >= m->top_k ? 8 : 1;
		mb_printf(mb,
		          "  \"intermediate_size\": %" PRIu64
		          ",\n  \"moe_intermediate_size\": %" PRIu64
		          ",\n  \"n_routed_experts\": %u,\n  \"n_shared_experts\": %u,\n"
		          "  \"first_k_dense_replace\": %u,\n  \"moe_layer_freq\": 1,\n",
		          m->dense_ffn, m->ffn, m->n_experts, p->n_shared, m->leading_dense);
		mb_printf(mb,
		          "  \"n_group\": %u,\n  \"topk_group\": %u,\n  \"norm_topk_prob\": true,\n"
		          "  \"routed_scaling_factor\": 2.5,\n  \"scoring_func\": \"sigmoid\",\n"
		          "  \"topk_method\": \"noaux_tc\",\n  \"ep_size\": 1,\n"
		          "  \"num_nextn_predict_layers\": 0,\n  \"aux_loss_alpha\": 0.001,\n",
		          groups, groups == 8 ? 4 : 1);
		mb_printf(mb,
		          "  \"q_lora_rank\": %u,\n  \"kv_lora_rank\": %u,\n"
		          "  \"qk_nope_head_dim\": %u,\n  \"qk_rope_head_dim\": %u,\n"
		          "  \"v_head_dim\": %u,\n  \"rope_scaling\": null,\n",
		          m->q_lora_rank, m->kv_lora_rank, m->head_dim, m->rope_dim, m->head_dim);
		if (m->format == MOEK_FP8_E4M3_B128)
			mb_fp8_quantization_config(mb);
		break;
	}
	case MOE_ARCH_GPT_OSS:
		mb_printf(mb,
		          "  \"head_dim\": %u,\n  \"intermediate_size\": %" PRIu64 ",\n"
		          "  \"num_local_experts\": %u,\n  \"experts_per_token\": %u,\n"
		          "  \"swiglu_limit\": 7.0,\n  \"router_aux_loss_coef\": 0.9,\n"
		          "  \"sliding_window\": 128,\n  \"initial_context_length\": 4096,\n",
		          m->head_dim, m->ffn, m->n_experts, m->top_k);
		mb_printf(mb, "  \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 32.0, "
		              "\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"truncate\": false, "
		              "\"original_max_position_embeddings\": 4096},\n");
		mb_printf(mb, "  \"layer_types\": [");
		for (uint32_t L = 0; L < m->n_layers; L++)
			mb_printf(mb, "%s\"%s_attention\"", L ? ", " : "",
			          L % 2 ? "full" : "sliding");
		mb_printf(mb, "],\n  \"quantization_config\": {\"quant_method\": \"mxfp4\", "
		              "\"modules_to_not_convert\": [\"model.layers.*.self_attn\", "
		              "\"model.layers.*.mlp.router\", \"model.embed_tokens\", "
		              "\"lm_head\"]},\n");
		break;
	case MOE_ARCH_OLMOE:
		mb_printf(mb,
		          "  \"intermediate_size\": %" PRIu64 ",\n  \"num_experts\": %u,\n"
		          "  \"norm_topk_prob\": false,\n  \"clip_qkv\": null,\n"
		          "  \"router_aux_loss_coef\": 0.01,\n",
		          m->ffn, m->n_experts);
		break;
	default: /* Qwen3-MoE (and Qwen2-MoE) */
		mb_printf(mb,
		          "  \"head_dim\": %u,\n  \"intermediate_size\": %" PRIu64
		          ",\n  \"moe_intermediate_size\": %" PRIu64 ",\n  \"num_experts\": %u,\n"
		          "  \"norm_topk_prob\": true,\n  \"decoder_sparse_step\": 1,\n"
		          "  \"mlp_only_layers\": [],\n  \"router_aux_loss_coef\": 0.001,\n",
		          m->head_dim, m->dense_ffn, m->ffn, m->n_experts);
		mb_printf(mb,
		          "  \"use_sliding_window\": false,\n  \"sliding_window\": null,\n"
		          "  \"max_window_layers\": %u,\n  \"rope_scaling\": null,\n",
		          m->n_layers);
		break;
	}
	mb_printf(mb,
	          "  \"torch_dtype\": \"%s\",\n  \"moe_sidecar_generator\": {\"seed\": %" PRIu64
	          ", \"preset\": \"%s\", \"full_model\": true}\n}\n",
	          torch_dtype(m->nonexpert_format), m->opt->seed, p->name);
}

static void gen_full_generation_config(const struct gen_model *m, struct membuf *mb)
{
	(void)m;
	mb_printf(
	    mb, "{\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"do_sample\": false\n}\n",
	    EOT_TOKEN, EOT_TOKEN);
}

/* ---- the entry point ------------------------------------------------------------------- */

static const struct gen_whole_model whole_model = {
    .resolve = gen_full_resolve,
    .plan_head = gen_full_plan_head,
    .plan_layer_attention = gen_full_plan_layer_attention,
    .plan_layer_ffn = gen_full_plan_layer_ffn,
    .plan_tail = gen_full_plan_tail,
    .gguf_kvs = gen_full_gguf_kvs,
    .config = gen_full_config,
    .generation_config = gen_full_generation_config,
};

int moe_gen_write(const struct moe_gen_options *opt, struct sidecar_error *err)
{
	return gen_write(opt, &whole_model, err);
}
