/* catalog.c — see catalog.h. Builds the expert table from a GGUF model (metadata keys and
 * llama.cpp tensor names) or a Hugging Face checkpoint (config.json and transformers tensor
 * names), through one view of "a tensor in a file" so the slab arithmetic and every check
 * exist once for both containers. */
#include "catalog.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "json.h"
#include "moe_kernels.h"
#include "safetensors.h"

#define SLAB_ALIGN 4096u
#define FP8_BLOCK 128u
#define MXFP4_BLOCK 32u

/* Each architecture's names, once: readers map files' names to it, writers (moe-gen) the
 * reverse. model_type[0] is the one written; DeepSeek-V2 checkpoints say deepseek_v2. */
static const struct arch_names {
	const char *family, *gguf, *model_type[2];
} arch_names[MOE_ARCH_COUNT] = {
    [MOE_ARCH_QWEN2MOE] = {"qwen2moe", "qwen2moe", {"qwen2_moe"}},
    [MOE_ARCH_QWEN3MOE] = {"qwen3moe", "qwen3moe", {"qwen3_moe"}},
    [MOE_ARCH_MIXTRAL] = {"mixtral", "llama", {"mixtral"}},
    [MOE_ARCH_DEEPSEEK] = {"deepseek", "deepseek2", {"deepseek_v3", "deepseek_v2"}},
    [MOE_ARCH_GPT_OSS] = {"gpt-oss", "gpt-oss", {"gpt_oss"}},
    [MOE_ARCH_OLMOE] = {"olmoe", "olmoe", {"olmoe"}},
    [MOE_ARCH_GLM4MOE] = {"glm4moe", "glm4moe", {"glm4_moe"}},
    [MOE_ARCH_MINIMAX_M2] = {"minimax-m2", "minimax-m2", {"minimax_m2"}},
    [MOE_ARCH_LLAMA4] = {"llama4", "llama4", {"llama4", "llama4_text"}},
    [MOE_ARCH_QWEN3NEXT] = {"qwen3next", "qwen3next", {"qwen3_next"}},
};

/* What each family's reference does where a file says nothing: sigmoid scores (GLM-4.5's
 * and Llama-4's modeling code hard-code them), a score-correction bias in the selection,
 * renormalised top-k weights, a shared expert, the routing weight on the expert's input
 * (Llama-4). Files override what they state (expert_gating_func, scoring_func,
 * norm_topk_prob, n_shared_experts …). */
static void family_defaults(struct moe_model_hparams *in)
{
	const enum moe_arch a = in->arch;
	in->gating = a == MOE_ARCH_GPT_OSS ? MOE_GATING_SOFTMAX_TOPK
	             : (a == MOE_ARCH_GLM4MOE || a == MOE_ARCH_MINIMAX_M2 || a == MOE_ARCH_LLAMA4)
	                 ? MOE_GATING_SIGMOID
	                 : MOE_GATING_SOFTMAX;
	in->norm_topk_prob = a == MOE_ARCH_MIXTRAL || a == MOE_ARCH_GPT_OSS ||
	                     a == MOE_ARCH_GLM4MOE || a == MOE_ARCH_MINIMAX_M2 ||
	                     a == MOE_ARCH_QWEN3NEXT;
	in->score_bias = a == MOE_ARCH_GLM4MOE || a == MOE_ARCH_MINIMAX_M2;
	in->n_shared_experts =
	    a == MOE_ARCH_LLAMA4 || a == MOE_ARCH_GLM4MOE || a == MOE_ARCH_QWEN3NEXT;
	in->shared_expert_gate = a == MOE_ARCH_QWEN3NEXT;
	in->weight_on_input = a == MOE_ARCH_LLAMA4;
	in->routed_scaling = 1.0f;
	in->n_group = in->topk_group = 1;
	in->moe_layer_step = 1;
}

/* n_group / topk_group as a file states them: both at least 1, topk_group <= n_group, and
 * the groups divide the experts. what: the two keys' names for the error. */
static int check_groups(struct moe_model_hparams *in, uint64_t n_group, uint64_t topk_group,
                        const char *file, const char *what, struct sidecar_error *err)
{
	if (n_group == 0 || topk_group == 0 || topk_group > n_group || n_group > in->n_experts ||
	    in->n_experts % n_group)
		return error_set(err, MOE_EINVAL,
		                 "%s: %s = %" PRIu64 ", %" PRIu64
		                 ": need 1 <= topk_group <= n_group, n_group dividing the %u "
		                 "experts",
		                 file, what, n_group, topk_group, in->n_experts);
	in->n_group = (uint32_t)n_group;
	in->topk_group = (uint32_t)topk_group;
	return 0;
}

const char *moe_arch_name(enum moe_arch a)
{
	return (unsigned)a < MOE_ARCH_COUNT ? arch_names[a].family : "?";
}

const char *moe_arch_gguf_name(enum moe_arch a)
{
	return (unsigned)a < MOE_ARCH_COUNT ? arch_names[a].gguf : "?";
}

const char *moe_arch_model_type(enum moe_arch a)
{
	return (unsigned)a < MOE_ARCH_COUNT ? arch_names[a].model_type[0] : "?";
}

int moe_arch_from_gguf(const char *name, enum moe_arch *out)
{
	for (unsigned a = 0; a < MOE_ARCH_COUNT; a++)
		if (!strcmp(name, arch_names[a].gguf)) {
			*out = (enum moe_arch)a;
			return 0;
		}
	return -1;
}

int moe_arch_from_model_type(const char *model_type, enum moe_arch *out)
{
	for (unsigned a = 0; a < MOE_ARCH_COUNT; a++)
		for (unsigned i = 0; i < 2; i++)
			if (arch_names[a].model_type[i] &&
			    !strcmp(model_type, arch_names[a].model_type[i])) {
				*out = (enum moe_arch)a;
				return 0;
			}
	return -1;
}

const char *moe_proj_name(enum moe_proj p)
{
	static const char *const n[MOE_PROJ_COUNT] = {"gate", "up", "down", "gate_up"};
	return (unsigned)p < MOE_PROJ_COUNT ? n[p] : "?";
}

const char *moe_gating_name(enum moe_gating g)
{
	switch (g) {
	case MOE_GATING_SOFTMAX: return "softmax";
	case MOE_GATING_SIGMOID: return "sigmoid";
	case MOE_GATING_SOFTMAX_TOPK: return "softmax_topk";
	}
	return "?";
}

const char *moe_format_name(uint32_t format)
{
	const struct moek_format_info *fi = moek_format_lookup(format);
	const char *n = fi ? fi->name : gguf_type_name(format);
	return n ? n : "?";
}

/* Formats the kernels compute expert FFNs in (one place: the kernels' format table). */
static bool weight_format_supported(uint32_t f)
{
	const struct moek_format_info *fi = moek_format_lookup(f);
	return fi && fi->weight_format;
}

/* Bytes of one row of n weights; 0 if n does not fit the format's block. */
static uint64_t row_bytes(uint32_t format, uint64_t n)
{
	return moek_row_bytes(format, (size_t)n);
}

/* ---- one view of a tensor in either container ---------------------------------------- */

#define FMT_NONE UINT32_MAX /* a dtype or ggml type with no kernels format (U8, Q4_1) */

struct tview {
	const char *name;
	uint32_t file;
	uint64_t offset, nbytes;
	uint32_t n_dims;
	uint64_t ne[8];   /* innermost first, as ggml: ne[0] = contiguous row length */
	uint32_t format;  /* weight format id, or FMT_NONE */
	const char *type; /* the container's name for the type */
	int st_dtype;     /* safetensors dtype, -1 for GGUF */
};

struct builder {
	const char *path;
	struct moe_catalog *cat;
	struct sidecar_error *err;
	/* GGUF */
	struct gguf_file **gguf;
	uint32_t n_gguf;
	const char *arch_key; /* GGUF general.architecture */
	/* safetensors */
	struct st_model *st;
	struct json_doc *config;
	const char *config_path;
	json_ref
	    hp; /* the object holding the hyperparameters: the root, or Llama-4's text_config */
	uint32_t first_dense_layers; /* GGUF leading_dense_block_count */
};

static int find_tensor(struct builder *b, const char *name, struct tview *tv)
{
	memset(tv, 0, sizeof(*tv));
	if (b->gguf) {
		for (uint32_t i = 0; i < b->n_gguf; i++) {
			const struct gguf_tensor *t = gguf_find_tensor(b->gguf[i], name);
			if (!t)
				continue;
			tv->name = t->name;
			tv->file = i;
			tv->offset = t->offset;
			tv->nbytes = t->nbytes;
			tv->n_dims = t->n_dims;
			for (int d = 0; d < 8; d++)
				tv->ne[d] = d < GGUF_MAX_DIMS ? t->ne[d] : 1;
			/* the ggml type's kernels format: the one list of what experts may be in */
			const struct moek_format_info *fi = moek_format_from_ggml(t->type);
			tv->format = fi ? fi->format : FMT_NONE;
			tv->type = gguf_type_name(t->type);
			tv->st_dtype = -1;
			return 1;
		}
		return 0;
	}
	const struct st_tensor_ref *r = st_find(b->st, name);
	if (!r)
		return 0;
	const struct st_tensor *t = r->tensor;
	tv->name = t->name;
	tv->file = r->file;
	tv->offset = t->offset;
	tv->nbytes = t->nbytes;
	tv->n_dims = t->n_dims;
	for (int d = 0; d < 8; d++)
		tv->ne[d] = d < (int)t->n_dims ? t->shape[t->n_dims - 1 - d] : 1;
	tv->st_dtype = (int)t->dtype;
	tv->type = st_dtype_name(t->dtype);
	const struct moek_format_info *fi = moek_format_from_safetensors(tv->type);
	tv->format = fi ? fi->format : FMT_NONE;
	return 1;
}

static const char *model_file_name(const struct builder *b)
{
	return b->config_path ? b->config_path : b->path;
}

/* The slab of expert e (or the whole tensor if it is a per-expert 2-D tensor) of a weight
 * tensor whose matrix is rows x cols. */
static int take_weight(struct builder *b, const struct tview *tv, bool merged, uint32_t e,
                       uint64_t rows, uint64_t cols, struct moe_proj_ref *p)
{
	const struct moe_model_hparams *in = &b->cat->info;
	if (tv->format == FMT_NONE || !weight_format_supported(tv->format)) {
		char names[256];
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: type %s is not supported for expert weights "
		                 "(supported: %s)",
		                 b->path, tv->name, tv->type ? tv->type : "?",
		                 moek_weight_format_names(names, sizeof(names)));
	}
	uint32_t want_dims = merged ? 3 : 2;
	bool shape_ok = tv->n_dims == want_dims && tv->ne[0] == cols && tv->ne[1] == rows &&
	                (!merged || tv->ne[2] == in->n_experts);
	if (!shape_ok)
		return error_set(
		    b->err, MOE_EINVAL,
		    "%s: tensor %s: shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64
		    "] (innermost first) disagrees with %s: expected [%" PRIu64 ", %" PRIu64
		    "%s] (hidden %" PRIu64 ", expert ffn %" PRIu64 ", %u experts)",
		    b->path, tv->name, tv->ne[0], tv->ne[1], tv->ne[2], model_file_name(b), cols,
		    rows, merged ? ", n_experts" : "", in->hidden, in->expert_ffn, in->n_experts);
	uint64_t rb = row_bytes(tv->format, cols);
	if (!rb)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: row length %" PRIu64
		                 " is not a multiple of the %s block size",
		                 b->path, tv->name, cols, moe_format_name(tv->format));
	uint64_t slab = rb * rows;
	if (slab * (merged ? in->n_experts : 1) != tv->nbytes)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: holds %" PRIu64 " bytes, %s needs %" PRIu64,
		                 b->path, tv->name, tv->nbytes, moe_format_name(tv->format),
		                 slab * (merged ? in->n_experts : 1));
	p->present = true;
	p->format = tv->format;
	p->layout = MOE_LAYOUT_BLOCKS;
	p->rows = rows;
	p->cols = cols;
	p->data = (struct moe_extent){tv->file, tv->offset + (merged ? e * slab : 0), slab};
	return 0;
}

/* FP8 scale_inv tensor for a rows x cols weight: F32 [ceil(rows/128), ceil(cols/128)]
 * (with a leading n_experts axis when merged). */
static int take_fp8_scale(struct builder *b, const char *weight_name, bool merged, uint32_t e,
                          struct moe_proj_ref *p)
{
	char name[512];
	struct tview tv;
	const char *dot = strrchr(weight_name, '.');
	size_t stem = dot ? (size_t)(dot - weight_name) : strlen(weight_name);
	snprintf(name, sizeof(name), "%.*s.weight_scale_inv", (int)stem, weight_name);
	if (!find_tensor(b, name, &tv))
		return error_set(b->err, MOE_EINVAL, "%s: tensor %s is FP8 E4M3 but %s is missing",
		                 b->path, weight_name, name);
	uint64_t br = (p->rows + FP8_BLOCK - 1) / FP8_BLOCK;
	uint64_t bc = (p->cols + FP8_BLOCK - 1) / FP8_BLOCK;
	if (tv.format != MOEK_F32 || tv.n_dims != (merged ? 3u : 2u) || tv.ne[0] != bc ||
	    tv.ne[1] != br || (merged && tv.ne[2] != b->cat->info.n_experts))
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: expected F32 block scales [%" PRIu64 ", %" PRIu64
		                 "] for 128x128 blocks, found %s [%" PRIu64 ", %" PRIu64 "]",
		                 b->path, name, br, bc, tv.type, tv.ne[1], tv.ne[0]);
	uint64_t len = moek_fp8_scale_bytes(p->rows, p->cols);
	p->scale = (struct moe_extent){tv.file, tv.offset + (merged ? e * len : 0), len};
	return 0;
}

/* A bias vector of `rows` values: [n_experts, rows] merged or [rows] per expert. */
static int take_bias(struct builder *b, const char *name, bool merged, uint32_t e,
                     struct moe_proj_ref *p)
{
	struct tview tv;
	if (!find_tensor(b, name, &tv))
		return 0; /* biases are optional */
	if (tv.format != MOEK_F32 && tv.format != MOEK_F16 && tv.format != MOEK_BF16)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: bias type %s (F32, F16 or BF16 expected)", b->path,
		                 name, tv.type);
	if (tv.n_dims != (merged ? 2u : 1u) || tv.ne[0] != p->rows ||
	    (merged && tv.ne[1] != b->cat->info.n_experts))
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: bias shape [%" PRIu64 ", %" PRIu64
		                 "] does not match %" PRIu64 " rows x %u experts",
		                 b->path, name, tv.ne[1], tv.ne[0], p->rows,
		                 b->cat->info.n_experts);
	uint64_t len = p->rows * (tv.format == MOEK_F32 ? 4 : 2);
	p->bias = (struct moe_extent){tv.file, tv.offset + (merged ? e * len : 0), len};
	p->bias_format = tv.format;
	b->cat->info.has_bias = true;
	return 0;
}

/* ---- GGUF ------------------------------------------------------------------------------ */

static int gguf_key_u64(struct builder *b, const char *suffix, uint64_t *out, bool required)
{
	char key[128];
	snprintf(key, sizeof(key), "%s.%s", b->arch_key, suffix);
	int rc = gguf_get_u64(b->gguf[0], key, out);
	if (rc < 0)
		return error_set(b->err, MOE_EINVAL, "%s: metadata %s is not an unsigned integer",
		                 b->path, key);
	if (rc == 0 && required)
		return error_set(b->err, MOE_EINVAL, "%s: metadata %s is missing", b->path, key);
	return rc;
}

static int gguf_read_info(struct builder *b)
{
	struct moe_model_hparams *in = &b->cat->info;
	const char *arch = gguf_get_str(b->gguf[0], "general.architecture");
	if (!arch)
		return error_set(b->err, MOE_EINVAL, "%s: metadata general.architecture is missing",
		                 b->path);
	b->arch_key = arch;
	snprintf(in->arch_name, sizeof(in->arch_name), "%s", arch);
	if (moe_arch_from_gguf(arch, &in->arch) != 0)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: architecture %.64s is not a supported MoE "
		                 "(qwen2moe qwen3moe llama/Mixtral deepseek2 gpt-oss olmoe glm4moe "
		                 "minimax-m2 llama4 qwen3next)",
		                 b->path, arch);
	uint64_t v;
	if (gguf_key_u64(b, "block_count", &v, true) < 1)
		return -1;
	if (v == 0 || v > 4096)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: %s.block_count %" PRIu64 " is out of range", b->path, arch,
		                 v);
	in->n_layers = (uint32_t)v;
	if (gguf_key_u64(b, "embedding_length", &in->hidden, true) < 1)
		return -1;
	if (gguf_key_u64(b, "expert_count", &v, true) < 1)
		return -1;
	if (v == 0 || v > 65536)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: %s.expert_count %" PRIu64
		                 " (not an MoE model, or out of range)",
		                 b->path, arch, v);
	in->n_experts = (uint32_t)v;
	if (gguf_key_u64(b, "expert_used_count", &v, true) < 1)
		return -1;
	if (v == 0 || v > in->n_experts)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: %s.expert_used_count %" PRIu64 " is not in 1..expert_count",
		                 b->path, arch, v);
	in->top_k = (uint32_t)v;
	family_defaults(in);
	int rc = gguf_key_u64(b, "expert_feed_forward_length", &in->expert_ffn, false);
	if (rc < 0)
		return -1;
	if (rc == 0 && gguf_key_u64(b, "feed_forward_length", &in->expert_ffn, true) < 1)
		return -1; /* Mixtral: the FFN size is the expert size */
	uint64_t shared_ffn = 0;
	if (gguf_key_u64(b, "expert_shared_feed_forward_length", &shared_ffn, false) < 0)
		return -1;
	if (shared_ffn)
		in->n_shared_experts =
		    1; /* Qwen2-MoE, Qwen3-Next: one shared expert of this size */
	if ((rc = gguf_key_u64(b, "expert_shared_count", &v, false)) < 0)
		return -1;
	if (rc == 1)
		in->n_shared_experts = (uint32_t)(v > 1024 ? 1024 : v);
	v = 1;
	if (gguf_key_u64(b, "interleave_moe_layer_step", &v, false) < 0)
		return -1;
	if (v == 0 || v > in->n_layers)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: %s.interleave_moe_layer_step %" PRIu64
		                 " is not in 1..block_count (%u)",
		                 b->path, arch, v, in->n_layers);
	in->moe_layer_step = (uint32_t)v;
	v = 0;
	if (gguf_key_u64(b, "nextn_predict_layers", &v, false) < 0)
		return -1;
	if (v >= in->n_layers)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: %s.nextn_predict_layers %" PRIu64
		                 " leaves no block of block_count %u",
		                 b->path, arch, v, in->n_layers);
	in->nextn_layers = (uint32_t)v;
	uint64_t groups = 1, groups_used = 1;
	if (gguf_key_u64(b, "expert_group_count", &groups, false) < 0 ||
	    gguf_key_u64(b, "expert_group_used_count", &groups_used, false) < 0)
		return -1;
	if (check_groups(in, groups, groups_used, b->path,
	                 "expert_group_count, expert_group_used_count", b->err))
		return -1;
	v = 0;
	if (gguf_key_u64(b, "leading_dense_block_count", &v, false) < 0)
		return -1;
	if (v > in->n_layers)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: %s.leading_dense_block_count %" PRIu64
		                 " exceeds block_count %u",
		                 b->path, arch, v, in->n_layers);
	b->first_dense_layers = (uint32_t)v;

	char key[128];
	double f;
	bool flag;
	snprintf(key, sizeof(key), "%s.expert_weights_scale", arch);
	if (gguf_get_f64(b->gguf[0], key, &f) == 1 && f > 0)
		in->routed_scaling = (float)f;
	if (in->arch == MOE_ARCH_QWEN3MOE)
		in->norm_topk_prob = true;
	snprintf(key, sizeof(key), "%s.expert_weights_norm", arch);
	if (gguf_get_bool(b->gguf[0], key, &flag) == 1)
		in->norm_topk_prob = flag;
	snprintf(key, sizeof(key), "%s.expert_gating_func", arch);
	if (gguf_get_u64(b->gguf[0], key, &v) == 1) {
		if (v == 2)
			in->gating = MOE_GATING_SIGMOID;
		else if (v == 3)
			in->gating = MOE_GATING_SOFTMAX_TOPK;
		else if (v == 1)
			in->gating = MOE_GATING_SOFTMAX;
		else if (v != 0)
			return error_set(b->err, MOE_EINVAL,
			                 "%s: %s = %" PRIu64 " is not a known gating "
			                 "function",
			                 b->path, key, v);
	}
	/* gpt-oss clamps at 7 (llama.cpp builds it in); newer files may carry the per-layer
	 * swiglu_clamp_exp array */
	in->swiglu_limit = in->arch == MOE_ARCH_GPT_OSS ? 7.0f : 0.0f;
	snprintf(key, sizeof(key), "%s.swiglu_clamp_exp", arch);
	const struct gguf_kv *clamp = gguf_find_kv(b->gguf[0], key);
	if (clamp && clamp->value.type == GGUF_ARRAY) {
		for (uint64_t i = 0; i < clamp->value.arr.count; i++)
			if (gguf_array_f64(&clamp->value, i, &f) == 0 && f > 0) {
				in->swiglu_limit = (float)f;
				break;
			}
	} else if (clamp && gguf_get_f64(b->gguf[0], key, &f) == 1 && f > 0) {
		in->swiglu_limit = (float)f;
	}
	return 0;
}

/* The expert array of a layer, allocated only once the file has shown tensors for all
 * n_experts experts, so that an absurd expert_count in hostile metadata never sizes an
 * allocation by itself. */
static struct moe_expert *alloc_experts(struct builder *b, struct moe_layer *layer)
{
	layer->experts = calloc(b->cat->info.n_experts, sizeof(*layer->experts));
	if (!layer->experts)
		error_set(b->err, MOE_ENOMEM, "out of memory");
	return layer->experts;
}

/* Fills layer L's experts from GGUF tensors; returns 1 if the layer has experts, 0 if it
 * has none (dense), -1 on error. */
static int gguf_layer(struct builder *b, uint32_t L, struct moe_layer *layer)
{
	struct moe_expert *ex;
	const struct moe_model_hparams *in = &b->cat->info;
	static const char *const merged_names[MOE_PROJ_COUNT] = {
	    "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps"};
	static const char *const single_names[3] = {"ffn_gate", "ffn_up", "ffn_down"};
	char name[128];
	struct tview tv[MOE_PROJ_COUNT];
	bool have[MOE_PROJ_COUNT];
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		snprintf(name, sizeof(name), "blk.%u.%s.weight", L, merged_names[p]);
		have[p] = find_tensor(b, name, &tv[p]);
	}
	bool any_merged = have[0] || have[1] || have[2] || have[3];
	if (any_merged) {
		bool fused = have[MOE_PROJ_GATE_UP];
		if (!have[MOE_PROJ_DOWN] || (fused ? have[0] || have[1] : !have[0] || !have[1]))
			return error_set(b->err, MOE_EINVAL,
			                 "%s: blk.%u: incomplete expert tensors (need "
			                 "ffn_gate_exps+ffn_up_exps or ffn_gate_up_exps, and "
			                 "ffn_down_exps)",
			                 b->path, L);
		const struct tview *down = &tv[MOE_PROJ_DOWN];
		if (down->n_dims != 3 || down->ne[2] != in->n_experts)
			return error_set(b->err, MOE_EINVAL,
			                 "%s: tensor %s: %" PRIu64 " experts, metadata says %u",
			                 b->path, down->name, down->ne[2], in->n_experts);
		if (!(ex = alloc_experts(b, layer)))
			return -1;
		for (uint32_t e = 0; e < in->n_experts; e++) {
			for (int p = 0; p < MOE_PROJ_COUNT; p++) {
				if (!have[p])
					continue;
				uint64_t rows = p == MOE_PROJ_DOWN      ? in->hidden
				                : p == MOE_PROJ_GATE_UP ? 2 * in->expert_ffn
				                                        : in->expert_ffn;
				uint64_t cols = p == MOE_PROJ_DOWN ? in->expert_ffn : in->hidden;
				struct moe_proj_ref *pr = &ex[e].proj[p];
				if (take_weight(b, &tv[p], true, e, rows, cols, pr))
					return -1;
				pr->order = MOE_GATE_UP_HALVES;
				snprintf(name, sizeof(name), "blk.%u.%s.bias", L, merged_names[p]);
				if (take_bias(b, name, true, e, pr))
					return -1;
			}
		}
		return 1;
	}
	/* legacy per-expert 2-D tensors: blk.L.ffn_gate.E.weight */
	snprintf(name, sizeof(name), "blk.%u.ffn_gate.0.weight", L);
	struct tview one;
	if (!find_tensor(b, name, &one))
		return 0;
	snprintf(name, sizeof(name), "blk.%u.ffn_down.%u.weight", L, in->n_experts - 1);
	if (!find_tensor(b, name, &one))
		return error_set(b->err, MOE_EINVAL, "%s: blk.%u: expert tensor %s is missing",
		                 b->path, L, name);
	if (!(ex = alloc_experts(b, layer)))
		return -1;
	for (uint32_t e = 0; e < in->n_experts; e++) {
		for (int p = 0; p < 3; p++) {
			snprintf(name, sizeof(name), "blk.%u.%s.%u.weight", L, single_names[p], e);
			if (!find_tensor(b, name, &one))
				return error_set(b->err, MOE_EINVAL,
				                 "%s: blk.%u: expert tensor %s is missing", b->path,
				                 L, name);
			uint64_t rows = p == MOE_PROJ_DOWN ? in->hidden : in->expert_ffn;
			uint64_t cols = p == MOE_PROJ_DOWN ? in->expert_ffn : in->hidden;
			if (take_weight(b, &one, false, e, rows, cols, &ex[e].proj[p]))
				return -1;
			snprintf(name, sizeof(name), "blk.%u.%s.%u.bias", L, single_names[p], e);
			if (take_bias(b, name, false, e, &ex[e].proj[p]))
				return -1;
		}
	}
	return 1;
}

static bool gguf_layer_has_dense_ffn(struct builder *b, uint32_t L)
{
	char name[128];
	struct tview tv;
	snprintf(name, sizeof(name), "blk.%u.ffn_up.weight", L);
	return find_tensor(b, name, &tv);
}

/* ---- Hugging Face ---------------------------------------------------------------------- */

static int cfg_u64(struct builder *b, const char *key, uint64_t *out, bool required)
{
	int rc = json_get_u64(b->config, b->hp, key, out);
	const char *in = b->hp == json_root(b->config) ? "" : "text_config.";
	if (rc < 0)
		return error_set(b->err, MOE_EINVAL, "%s: %s%s is not an unsigned integer",
		                 b->config_path, in, key);
	if (rc == 0 && required)
		return error_set(b->err, MOE_EINVAL, "%s: %s%s is missing", b->config_path, in,
		                 key);
	return rc;
}

static int hf_read_info(struct builder *b, bool **moe_layers)
{
	struct moe_model_hparams *in = &b->cat->info;
	const struct json_doc *c = b->config;
	json_ref root = json_root(c);
	if (json_type_of(c, root) != JSON_OBJECT)
		return error_set(b->err, MOE_EINVAL, "%s: not a JSON object", b->config_path);
	const char *mt = json_string(c, json_object_get(c, root, "model_type"), NULL);
	if (!mt)
		return error_set(b->err, MOE_EINVAL, "%s: model_type is missing", b->config_path);
	snprintf(in->arch_name, sizeof(in->arch_name), "%s", mt);
	if (moe_arch_from_model_type(mt, &in->arch) != 0)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: model_type %.64s is not a supported MoE "
		                 "(qwen2_moe qwen3_moe mixtral deepseek_v2 deepseek_v3 gpt_oss "
		                 "olmoe glm4_moe minimax_m2 llama4 llama4_text qwen3_next)",
		                 b->config_path, mt);
	/* Llama-4's multimodal checkpoints keep the language model's keys in text_config */
	b->hp = root;
	json_ref text = json_object_get(c, root, "text_config");
	if (in->arch == MOE_ARCH_LLAMA4 && text != JSON_NONE) {
		if (json_type_of(c, text) != JSON_OBJECT)
			return error_set(b->err, MOE_EINVAL, "%s: text_config is not an object",
			                 b->config_path);
		b->hp = text;
	}
	const json_ref hp = b->hp;
	uint64_t v;
	if (cfg_u64(b, "num_hidden_layers", &v, true) < 1)
		return -1;
	if (v == 0 || v > 4096)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: num_hidden_layers %" PRIu64 " is out of range",
		                 b->config_path, v);
	in->n_layers = (uint32_t)v;
	if (cfg_u64(b, "hidden_size", &in->hidden, true) < 1)
		return -1;
	const enum moe_arch a = in->arch;
	const char *experts_key = (a == MOE_ARCH_DEEPSEEK || a == MOE_ARCH_GLM4MOE)
	                              ? "n_routed_experts"
	                          : (a == MOE_ARCH_MIXTRAL || a == MOE_ARCH_GPT_OSS ||
	                             a == MOE_ARCH_MINIMAX_M2 || a == MOE_ARCH_LLAMA4)
	                              ? "num_local_experts"
	                              : "num_experts";
	if (cfg_u64(b, experts_key, &v, true) < 1)
		return -1;
	if (v == 0 || v > 65536)
		return error_set(b->err, MOE_EINVAL, "%s: %s %" PRIu64 " is out of range",
		                 b->config_path, experts_key, v);
	in->n_experts = (uint32_t)v;
	int rc = cfg_u64(b, "num_experts_per_tok", &v, false);
	if (rc == 0)
		rc = cfg_u64(b, "experts_per_token", &v, true); /* gpt-oss spelling */
	if (rc < 1)
		return -1;
	if (v == 0 || v > in->n_experts)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: num_experts_per_tok %" PRIu64 " is not in 1..%u",
		                 b->config_path, v, in->n_experts);
	in->top_k = (uint32_t)v;
	family_defaults(in);
	rc = cfg_u64(b, "moe_intermediate_size", &in->expert_ffn, false);
	if (rc == 0)
		rc = cfg_u64(b, "intermediate_size", &in->expert_ffn, true);
	if (rc < 1)
		return -1;
	if (in->hidden == 0 || in->expert_ffn == 0 || in->hidden > (1u << 20) ||
	    in->expert_ffn > (1u << 20))
		return error_set(b->err, MOE_EINVAL,
		                 "%s: hidden_size/intermediate size out of range", b->config_path);
	v = 0;
	if ((rc = cfg_u64(b, "n_shared_experts", &v, false)) < 0)
		return -1;
	uint64_t shared_ffn = 0;
	if (cfg_u64(b, "shared_expert_intermediate_size", &shared_ffn, false) < 0)
		return -1;
	if (rc == 1)
		in->n_shared_experts = (uint32_t)(v > 1024 ? 1024 : v);
	else if (shared_ffn)
		in->n_shared_experts = 1;
	uint64_t minimax_shared = 0; /* MiniMax-M2: shared_intermediate_size 0 = none */
	if (a == MOE_ARCH_MINIMAX_M2 &&
	    cfg_u64(b, "shared_intermediate_size", &minimax_shared, false) < 0)
		return -1;
	if (minimax_shared)
		in->n_shared_experts = 1;
	uint64_t groups = 1, topk_group = 1;
	if (cfg_u64(b, "n_group", &groups, false) < 0 ||
	    cfg_u64(b, "topk_group", &topk_group, false) < 0)
		return -1;
	if (check_groups(in, groups, topk_group, b->config_path, "n_group, topk_group", b->err))
		return -1;
	v = 0;
	if (cfg_u64(b, "num_nextn_predict_layers", &v, false) < 0)
		return -1;
	in->nextn_layers = (uint32_t)(v > 64 ? 64 : v); /* blocks after num_hidden_layers */

	/* which layers are MoE */
	bool *moe = calloc(in->n_layers, sizeof(*moe));
	if (!moe)
		return error_set(b->err, MOE_ENOMEM, "out of memory");
	*moe_layers = moe;
	uint64_t first_dense = 0, freq = 1, sparse_step = 1, interleave = 1;
	if (cfg_u64(b, "first_k_dense_replace", &first_dense, false) < 0 ||
	    cfg_u64(b, "moe_layer_freq", &freq, false) < 0 ||
	    cfg_u64(b, "decoder_sparse_step", &sparse_step, false) < 0 ||
	    cfg_u64(b, "interleave_moe_layer_step", &interleave, false) < 0)
		return -1;
	const char *zero = freq == 0          ? "moe_layer_freq"
	                   : sparse_step == 0 ? "decoder_sparse_step"
	                   : interleave == 0  ? "interleave_moe_layer_step"
	                                      : NULL;
	if (zero)
		return error_set(b->err, MOE_EINVAL, "%s: %s is 0: it must be >= 1", b->config_path,
		                 zero);
	if (first_dense > in->n_layers)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: first_k_dense_replace %" PRIu64
		                 " exceeds num_hidden_layers %u",
		                 b->config_path, first_dense, in->n_layers);
	if (interleave > in->n_layers)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: interleave_moe_layer_step %" PRIu64
		                 " exceeds num_hidden_layers %u",
		                 b->config_path, interleave, in->n_layers);
	in->moe_layer_step = (uint32_t)(interleave > 1 ? interleave : sparse_step);
	for (uint32_t L = 0; L < in->n_layers; L++)
		moe[L] = L >= first_dense && L % freq == 0 && (L + 1) % sparse_step == 0 &&
		         (L + 1) % interleave == 0;
	/* Llama-4's moe_layers, where written, lists the MoE blocks outright */
	json_ref listed = json_object_get(c, hp, "moe_layers");
	if (listed != JSON_NONE && json_type_of(c, listed) == JSON_ARRAY) {
		memset(moe, 0, in->n_layers * sizeof(*moe));
		for (json_ref it = json_first(c, listed); it != JSON_NONE; it = json_next(c, it)) {
			if (json_u64(c, it, &v) || v >= in->n_layers)
				return error_set(b->err, MOE_EINVAL,
				                 "%s: moe_layers holds a bad layer index",
				                 b->config_path);
			moe[v] = true;
		}
	}
	json_ref only = json_object_get(c, hp, "mlp_only_layers");
	if (only != JSON_NONE && json_type_of(c, only) == JSON_ARRAY) {
		for (json_ref it = json_first(c, only); it != JSON_NONE; it = json_next(c, it)) {
			if (json_u64(c, it, &v) || v >= in->n_layers)
				return error_set(b->err, MOE_EINVAL,
				                 "%s: mlp_only_layers holds a bad layer index",
				                 b->config_path);
			moe[v] = false;
		}
	}

	double f;
	bool flag;
	if ((rc = json_get_bool(c, hp, "norm_topk_prob", &flag)) < 0)
		return error_set(b->err, MOE_EINVAL, "%s: norm_topk_prob is not a bool",
		                 b->config_path);
	if (rc == 1)
		in->norm_topk_prob = flag;
	if (json_get_double(c, hp, "routed_scaling_factor", &f) == 1 && f > 0)
		in->routed_scaling = (float)f;
	if ((rc = json_get_bool(c, hp, "use_routing_bias", &flag)) < 0)
		return error_set(b->err, MOE_EINVAL, "%s: use_routing_bias is not a bool",
		                 b->config_path);
	if (rc == 1)
		in->score_bias = flag; /* MiniMax-M2 */
	const char *topk_method = json_string(c, json_object_get(c, hp, "topk_method"), NULL);
	if (topk_method && !strcmp(topk_method, "noaux_tc"))
		in->score_bias = true; /* DeepSeek-V3: e_score_correction_bias */
	const char *scoring = json_string(c, json_object_get(c, hp, "scoring_func"), NULL);
	if (scoring && !strcmp(scoring, "sigmoid"))
		in->gating = MOE_GATING_SIGMOID;
	else if (scoring && strcmp(scoring, "softmax"))
		return error_set(b->err, MOE_EINVAL,
		                 "%s: scoring_func %.32s is not softmax or sigmoid", b->config_path,
		                 scoring);
	in->swiglu_limit = in->arch == MOE_ARCH_GPT_OSS ? 7.0f : 0.0f;
	if (json_get_double(c, hp, "swiglu_limit", &f) == 1 && f > 0)
		in->swiglu_limit = (float)f;
	return 0;
}

/* gpt-oss checkpoint: merged tensors mlp.experts.{gate_up_proj,down_proj}_{blocks,scales,bias}
 * with MXFP4 weights in the Hugging Face split layout and interleaved gate/up rows. */
static int hf_gpt_oss_layer(struct builder *b, uint32_t L, struct moe_layer *layer)
{
	struct moe_expert *ex = layer->experts;
	const struct moe_model_hparams *in = &b->cat->info;
	static const char *const stems[2] = {"gate_up_proj", "down_proj"};
	char name[256];
	struct tview blocks, scales;
	for (int k = 0; k < 2; k++) {
		enum moe_proj p = k == 0 ? MOE_PROJ_GATE_UP : MOE_PROJ_DOWN;
		uint64_t rows = k == 0 ? 2 * in->expert_ffn : in->hidden;
		uint64_t cols = k == 0 ? in->hidden : in->expert_ffn;
		snprintf(name, sizeof(name), "model.layers.%u.mlp.experts.%s_blocks", L, stems[k]);
		if (!find_tensor(b, name, &blocks)) {
			snprintf(name, sizeof(name), "model.layers.%u.mlp.experts.%s", L, stems[k]);
			if (find_tensor(b, name, &blocks))
				return error_set(
				    b->err, MOE_EINVAL,
				    "%s: tensor %s: the dequantized gpt-oss "
				    "layout ([experts, in, out]) is not supported; use the "
				    "MXFP4 checkpoint or GGUF",
				    b->path, name);
			return error_set(b->err, MOE_EINVAL, "%s: %s is missing", b->path, name);
		}
		if (cols % MXFP4_BLOCK)
			return error_set(b->err, MOE_EINVAL,
			                 "%s: %s: %" PRIu64 " columns is not a multiple of 32",
			                 b->path, name, cols);
		uint64_t nb = cols / MXFP4_BLOCK;
		if (blocks.st_dtype != ST_U8 || blocks.n_dims != 4 || blocks.ne[0] != 16 ||
		    blocks.ne[1] != nb || blocks.ne[2] != rows || blocks.ne[3] != in->n_experts)
			return error_set(b->err, MOE_EINVAL,
			                 "%s: tensor %s: expected U8 [%u, %" PRIu64 ", %" PRIu64
			                 ", 16] MXFP4 blocks (config.json), found %s "
			                 "[%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64 "]",
			                 b->path, name, in->n_experts, rows, nb, blocks.type,
			                 blocks.ne[3], blocks.ne[2], blocks.ne[1], blocks.ne[0]);
		snprintf(name, sizeof(name), "model.layers.%u.mlp.experts.%s_scales", L, stems[k]);
		if (!find_tensor(b, name, &scales))
			return error_set(b->err, MOE_EINVAL, "%s: %s is missing", b->path, name);
		if (scales.st_dtype != ST_U8 || scales.n_dims != 3 || scales.ne[0] != nb ||
		    scales.ne[1] != rows || scales.ne[2] != in->n_experts)
			return error_set(b->err, MOE_EINVAL,
			                 "%s: tensor %s: expected U8 [%u, %" PRIu64 ", %" PRIu64
			                 "] MXFP4 scales",
			                 b->path, name, in->n_experts, rows, nb);
		if (!ex && !(ex = alloc_experts(b, layer)))
			return -1;
		uint64_t blen = rows * nb * 16, slen = rows * nb;
		for (uint32_t e = 0; e < in->n_experts; e++) {
			struct moe_proj_ref *pr = &ex[e].proj[p];
			pr->present = true;
			pr->format = MOEK_MXFP4;
			pr->layout = MOE_LAYOUT_MXFP4_HF;
			pr->order = MOE_GATE_UP_INTERLEAVED;
			pr->rows = rows;
			pr->cols = cols;
			pr->data = (struct moe_extent){blocks.file, blocks.offset + e * blen, blen};
			pr->scale =
			    (struct moe_extent){scales.file, scales.offset + e * slen, slen};
			snprintf(name, sizeof(name), "model.layers.%u.mlp.experts.%s_bias", L,
			         stems[k]);
			if (take_bias(b, name, true, e, pr))
				return -1;
		}
	}
	return 1;
}

/* Llama-4 checkpoint: fused tensors feed_forward.experts.gate_up_proj [E, hidden, 2·ffn]
 * (gate columns, then up) and down_proj [E, ffn, hidden], input-major (transformers
 * multiplies x · W), under language_model.model.layers (Llama4ForConditionalGeneration) or
 * model.layers (Llama4ForCausalLM). */
static int hf_llama4_layer(struct builder *b, uint32_t L, struct moe_layer *layer)
{
	static const char *const prefixes[2] = {"language_model.model.layers", "model.layers"};
	static const char *const stems[2] = {"gate_up_proj", "down_proj"};
	const struct moe_model_hparams *in = &b->cat->info;
	struct moe_expert *ex = NULL;
	char name[256];
	struct tview tv;
	for (int k = 0; k < 2; k++) {
		const enum moe_proj p = k == 0 ? MOE_PROJ_GATE_UP : MOE_PROJ_DOWN;
		const uint64_t rows = k == 0 ? 2 * in->expert_ffn : in->hidden;
		const uint64_t cols = k == 0 ? in->hidden : in->expert_ffn;
		bool found = false;
		for (int i = 0; i < 2 && !found; i++) {
			snprintf(name, sizeof(name), "%s.%u.feed_forward.experts.%s", prefixes[i],
			         L, stems[k]);
			found = find_tensor(b, name, &tv);
		}
		if (!found) {
			snprintf(name, sizeof(name), "%s.%u.feed_forward.experts.%s",
			         b->hp == json_root(b->config) ? prefixes[1] : prefixes[0], L,
			         stems[k]);
			return error_set(
			    b->err, MOE_EINVAL,
			    "%s: layer %u is an MoE layer (%s) but tensor %s is missing", b->path,
			    L, b->config_path, name);
		}
		if (tv.format != MOEK_F32 && tv.format != MOEK_F16 && tv.format != MOEK_BF16)
			return error_set(
			    b->err, MOE_EINVAL,
			    "%s: tensor %s: type %s; Llama-4's fused experts are served "
			    "in F32, F16 or BF16",
			    b->path, tv.name, tv.type ? tv.type : "?");
		const uint64_t esize = tv.format == MOEK_F32 ? 4 : 2, slab = rows * cols * esize;
		if (tv.n_dims != 3 || tv.ne[2] != in->n_experts || tv.ne[1] != cols ||
		    tv.ne[0] != rows || tv.nbytes != slab * in->n_experts)
			return error_set(
			    b->err, MOE_EINVAL,
			    "%s: tensor %s: shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64
			    "] disagrees with %s: expected [%u, %" PRIu64 ", %" PRIu64
			    "] ([experts, in, out]: hidden %" PRIu64 ", expert ffn %" PRIu64 ")",
			    b->path, tv.name, tv.ne[2], tv.ne[1], tv.ne[0], b->config_path,
			    in->n_experts, cols, rows, in->hidden, in->expert_ffn);
		if (!ex && !(ex = alloc_experts(b, layer)))
			return -1;
		for (uint32_t e = 0; e < in->n_experts; e++) {
			struct moe_proj_ref *pr = &ex[e].proj[p];
			pr->present = true;
			pr->format = tv.format;
			pr->layout = MOE_LAYOUT_TRANSPOSED;
			pr->order = MOE_GATE_UP_HALVES;
			pr->rows = rows;
			pr->cols = cols;
			pr->data = (struct moe_extent){tv.file, tv.offset + e * slab, slab};
		}
	}
	return 1;
}

/* ---- INT4 checkpoints (quant_config.h) ------------------------------------------------- */

uint64_t moe_proj_kernel_bytes(const struct moe_proj_ref *r)
{
	switch (r->layout) {
	case MOE_LAYOUT_MXFP4_HF: return r->data.length + r->scale.length;
	case MOE_LAYOUT_INT4_CT:
	case MOE_LAYOUT_INT4_GPTQ: return r->rows * moek_row_bytes(MOEK_INT4_G32, (size_t)r->cols);
	case MOE_LAYOUT_NVFP4_MODELOPT:
		return r->rows * moek_row_bytes(MOEK_NVFP4, (size_t)r->cols);
	case MOE_LAYOUT_BLOCKS:
	case MOE_LAYOUT_TRANSPOSED: break;
	}
	return r->data.length;
}

/* Reads a small tensor's bytes (a weight_shape, a g_idx) from its file. */
static int read_tensor(struct builder *b, const struct tview *tv, void *buf)
{
	const char *path = b->st->files[tv->file]->path;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return error_set_errno(b->err, "%s", path);
	uint8_t *p = buf;
	uint64_t done = 0;
	while (done < tv->nbytes) {
		ssize_t n = pread(fd, p + done, tv->nbytes - done, (off_t)(tv->offset + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = errno;
			close(fd);
			return error_set(b->err, MOE_EIO, "%s: tensor %s: read: %s", path, tv->name,
			                 n < 0 ? strerror(e) : "unexpected end of file");
		}
		done += (uint64_t)n;
	}
	close(fd);
	return 0;
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* One tensor `stem.suffix` that must be there, of dtype `dtype` and 2-D shape [d0, d1]
 * (outermost first; d1 = 0: 1-D [d0]). what: how the error describes it. */
static int int4_tensor(struct builder *b, const char *stem, const char *suffix, int dtype,
                       uint64_t d0, uint64_t d1, const char *what, struct tview *tv)
{
	char name[512];
	snprintf(name, sizeof(name), "%s.%s", stem, suffix);
	if (!find_tensor(b, name, tv))
		return error_set(b->err, MOE_EINVAL, "%s: tensor %s is missing (%s)", b->path, name,
		                 b->cat->quant.kind == MOE_QUANT_GPTQ  ? "GPTQ INT4"
		                 : b->cat->quant.kind == MOE_QUANT_AWQ ? "AWQ INT4"
		                 : b->cat->quant.kind == MOE_QUANT_NVFP4
		                     ? "ModelOpt NVFP4"
		                     : "compressed-tensors INT4");
	const bool ok =
	    tv->st_dtype == dtype && (d1 ? tv->n_dims == 2 && tv->ne[1] == d0 && tv->ne[0] == d1
	                                 : tv->n_dims == 1 && tv->ne[0] == d0);
	if (!ok)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: expected %s [%" PRIu64 "%s%.0" PRIu64
		                 "] (%s), found %s [%" PRIu64 ", %" PRIu64 "] (%u dims)",
		                 b->path, tv->name, st_dtype_name((enum st_dtype)dtype), d0,
		                 d1 ? ", " : "", d1, what, tv->type, tv->ne[1], tv->ne[0],
		                 tv->n_dims);
	return 0;
}

/* The checkpoint tensors' shapes of rows x cols matrix `stem` under the config's scheme. */
static int int4_layout(struct builder *b, const char *stem, uint64_t rows, uint64_t cols,
                       struct moe_quant_layout *l)
{
	char why[160];
	if (moe_quant_layout_of(&b->cat->quant, rows, cols, l, why, sizeof(why)))
		return error_set(b->err, MOE_EINVAL, "%s: %s: %s (%s)", b->path, stem, why,
		                 b->config_path);
	return 0;
}

/* compressed-tensors pack-quantized: weight_packed I32 [rows, cols / 8], weight_scale BF16
 * [rows, cols / group] ([rows, 1] for strategy channel), weight_shape I32 [2] (read and
 * checked for the first expert of a layer); no weight_zero_point (symmetric). */
static int take_int4_ct(struct builder *b, const char *stem, uint64_t rows, uint64_t cols,
                        bool check_values, struct moe_proj_ref *p)
{
	struct moe_quant_layout l;
	struct tview packed, scale, shape, zp;
	char what[96], name[512];
	if (int4_layout(b, stem, rows, cols, &l))
		return -1;
	snprintf(what, sizeof(what), "pack-quantized: 8 weights per int32");
	if (int4_tensor(b, stem, "weight_packed", ST_I32, l.weights[0], l.weights[1], what,
	                &packed))
		return -1;
	snprintf(what, sizeof(what), "one scale per group of %u", l.group);
	if (int4_tensor(b, stem, "weight_scale", ST_BF16, l.scales[0], l.scales[1], what, &scale))
		return -1;
	if (int4_tensor(b, stem, "weight_shape", ST_I32, 2, 0, "the unpacked [out, in]", &shape))
		return -1;
	snprintf(name, sizeof(name), "%s.weight_zero_point", stem);
	if (find_tensor(b, name, &zp))
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: zero points (an asymmetric scheme) are not "
		                 "supported (symmetric INT4 only)",
		                 b->path, name);
	if (check_values) {
		uint8_t v[8];
		if (read_tensor(b, &shape, v))
			return -1;
		if (le32(v) != rows || le32(v + 4) != cols)
			return error_set(
			    b->err, MOE_EINVAL,
			    "%s: tensor %s: [%u, %u], expected [%" PRIu64 ", %" PRIu64 "] (%s)",
			    b->path, shape.name, le32(v), le32(v + 4), rows, cols, b->config_path);
	}
	p->present = true;
	p->format = MOEK_INT4_G32;
	p->layout = MOE_LAYOUT_INT4_CT;
	p->rows = rows;
	p->cols = cols;
	p->group = l.group;
	p->data = (struct moe_extent){packed.file, packed.offset, packed.nbytes};
	p->scale = (struct moe_extent){scale.file, scale.offset, scale.nbytes};
	return 0;
}

/* GPTQ: qweight I32 [cols / 8, rows], qzeros I32 [cols / group, rows / 8], scales F16
 * [cols / group, rows] ([1, rows / 8] and [1, rows] for group_size -1), g_idx I32 [cols]
 * (optional; for the first expert of a layer every entry must be i / group — anything else
 * is activation order). */
static int take_gptq(struct builder *b, const char *stem, uint64_t rows, uint64_t cols,
                     bool check_values, struct moe_proj_ref *p)
{
	struct moe_quant_layout l;
	struct tview qw, qz, sc, gi;
	char what[96], name[512];
	if (int4_layout(b, stem, rows, cols, &l))
		return -1;
	const uint32_t g = l.group;
	const bool awq = b->cat->quant.kind == MOE_QUANT_AWQ;
	const char *scheme = awq ? "AWQ" : "GPTQ";
	if (int4_tensor(b, stem, "qweight", ST_I32, l.weights[0], l.weights[1],
	                awq ? "AWQ GEMM: 8 outputs per int32, packed along the output"
	                    : "GPTQ: 8 inputs per int32, packed along the input",
	                &qw))
		return -1;
	snprintf(what, sizeof(what), "%s: 8 zero points per int32, group %u", scheme, g);
	if (int4_tensor(b, stem, "qzeros", ST_I32, l.zeros[0], l.zeros[1], what, &qz))
		return -1;
	snprintf(what, sizeof(what), "%s: one scale per group of %u", scheme, g);
	if (int4_tensor(b, stem, "scales", ST_F16, l.scales[0], l.scales[1], what, &sc))
		return -1;
	snprintf(name, sizeof(name), "%s.g_idx", stem);
	if (!awq && check_values && find_tensor(b, name, &gi)) {
		if (gi.st_dtype != ST_I32 || gi.n_dims != 1 || gi.ne[0] != cols)
			return error_set(b->err, MOE_EINVAL,
			                 "%s: tensor %s: expected I32 [%" PRIu64 "], found %s",
			                 b->path, name, cols, gi.type);
		uint8_t *v = malloc(gi.nbytes ? gi.nbytes : 1);
		if (!v)
			return error_set(b->err, MOE_ENOMEM, "out of memory");
		int rc = read_tensor(b, &gi, v);
		for (uint64_t i = 0; rc == 0 && i < cols; i++)
			if (le32(v + 4 * i) != i / g)
				rc = error_set(b->err, MOE_EINVAL,
				               "%s: tensor %s: input %" PRIu64
				               " is in group %u, not "
				               "%" PRIu64 " (desc_act / activation order is not "
				               "supported)",
				               b->path, name, i, le32(v + 4 * i), i / g);
		free(v);
		if (rc)
			return -1;
	}
	p->present = true;
	p->format = MOEK_INT4_G32;
	p->layout = MOE_LAYOUT_INT4_GPTQ;
	p->rows = rows;
	p->cols = cols;
	p->group = g;
	p->gptq_v1 = b->cat->quant.gptq_v1;
	p->awq = awq;
	p->data = (struct moe_extent){qw.file, qw.offset, qw.nbytes};
	p->scale = (struct moe_extent){sc.file, sc.offset, sc.nbytes};
	p->zeros = (struct moe_extent){qz.file, qz.offset, qz.nbytes};
	return 0;
}

/* ModelOpt NVFP4: weight U8 [rows, cols / 2], weight_scale F8_E4M3 [rows, cols / 16],
 * weight_scale_2 F32 [] or [1] (read now: finite and positive), input_scale optional (unused).
 * 1 if taken, 0 if `stem.weight` is not U8 (a module the quantizer excluded), -1 on error. */
static int take_nvfp4(struct builder *b, const char *stem, uint64_t rows, uint64_t cols,
                      struct moe_proj_ref *p)
{
	char name[512];
	struct tview w, sc, s2;
	snprintf(name, sizeof(name), "%s.weight", stem);
	if (!find_tensor(b, name, &w) || w.st_dtype != ST_U8)
		return 0;
	if (cols % 64)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: NVFP4 rows of %" PRIu64
		                 " inputs are not a multiple of 64 (ggml's NVFP4 block)",
		                 b->path, name, cols);
	if (w.n_dims != 2 || w.ne[1] != rows || w.ne[0] != cols / 2)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: expected U8 [%" PRIu64 ", %" PRIu64
		                 "] (ModelOpt NVFP4: 2 weights per byte), found %s [%" PRIu64
		                 ", %" PRIu64 "] (%u dims)",
		                 b->path, name, rows, cols / 2, w.type, w.n_dims > 1 ? w.ne[1] : 0,
		                 w.ne[0], w.n_dims);
	if (int4_tensor(b, stem, "weight_scale", ST_F8_E4M3, rows, cols / 16,
	                "ModelOpt NVFP4: one E4M3 scale per 16 weights", &sc))
		return -1;
	snprintf(name, sizeof(name), "%s.weight_scale_2", stem);
	if (!find_tensor(b, name, &s2))
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s is missing (ModelOpt NVFP4: the per-tensor FP32 "
		                 "scale)",
		                 b->path, name);
	if (s2.st_dtype != ST_F32 || s2.nbytes != 4 || s2.n_dims > 1)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: expected one F32 value, found %s of %" PRIu64
		                 " bytes",
		                 b->path, name, s2.type, s2.nbytes);
	uint8_t v[4];
	if (read_tensor(b, &s2, v))
		return -1;
	const uint32_t bits = le32(v);
	float f;
	memcpy(&f, &bits, sizeof(f));
	if (!(f > 0.0f && f < INFINITY))
		return error_set(b->err, MOE_EINVAL,
		                 "%s: tensor %s: %g is not a finite positive scale", b->path, name,
		                 (double)f);
	p->present = true;
	p->format = MOEK_NVFP4;
	p->layout = MOE_LAYOUT_NVFP4_MODELOPT;
	p->rows = rows;
	p->cols = cols;
	p->group = 16;
	p->tensor_scale = f;
	p->data = (struct moe_extent){w.file, w.offset, w.nbytes};
	p->scale = (struct moe_extent){sc.file, sc.offset, sc.nbytes};
	return 1;
}

/* The expert tensor `stem` (…experts.E.down_proj) in the config's INT4 encoding where the
 * checkpoint has it (a module the quantizer ignored stays `.weight`): 1 if taken, 0 if the
 * plain `.weight` path applies, -1 on error. */
static int take_int4(struct builder *b, const char *stem, uint64_t rows, uint64_t cols,
                     bool check_values, struct moe_proj_ref *p)
{
	char name[512];
	struct tview tv;
	const enum moe_quant_kind k = b->cat->quant.kind;
	if (k == MOE_QUANT_NVFP4)
		return take_nvfp4(b, stem, rows, cols, p);
	const bool gptq = k == MOE_QUANT_GPTQ || k == MOE_QUANT_AWQ; /* qweight, qzeros, scales */
	snprintf(name, sizeof(name), "%s.%s", stem, gptq ? "qweight" : "weight_packed");
	if (k == MOE_QUANT_NONE || !find_tensor(b, name, &tv))
		return 0;
	const int rc = gptq ? take_gptq(b, stem, rows, cols, check_values, p)
	                    : take_int4_ct(b, stem, rows, cols, check_values, p);
	return rc ? -1 : 1;
}

/* Whether expert tensor `stem` exists in any encoding. */
static bool expert_tensor_exists(struct builder *b, const char *stem)
{
	static const char *const suffixes[] = {"weight", "weight_packed", "qweight"};
	char name[512];
	struct tview tv;
	for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
		snprintf(name, sizeof(name), "%s.%s", stem, suffixes[i]);
		if (find_tensor(b, name, &tv))
			return true;
	}
	return false;
}

/* Per-expert 2-D tensors (Mixtral w1/w3/w2, others {gate,up,down}_proj). */
static int hf_layer(struct builder *b, uint32_t L, struct moe_layer *layer)
{
	const struct moe_model_hparams *in = &b->cat->info;
	if (in->arch == MOE_ARCH_GPT_OSS)
		return hf_gpt_oss_layer(b, L, layer);
	if (in->arch == MOE_ARCH_LLAMA4)
		return hf_llama4_layer(b, L, layer);
	/* MiniMax-M2 names its experts as Mixtral does */
	bool mixtral = in->arch == MOE_ARCH_MIXTRAL || in->arch == MOE_ARCH_MINIMAX_M2;
	static const char *const mixtral_names[3] = {"w1", "w3", "w2"};
	static const char *const proj_names[3] = {"gate_proj", "up_proj", "down_proj"};
	char name[256];
	struct tview tv;
	/* the last expert's down projection first: it must exist before anything is sized */
	for (int pass = 0; pass < 2; pass++) {
		uint32_t e = pass ? 0 : in->n_experts - 1;
		if (mixtral)
			snprintf(name, sizeof(name),
			         "model.layers.%u.block_sparse_moe.experts.%u.w2", L, e);
		else
			snprintf(name, sizeof(name), "model.layers.%u.mlp.experts.%u.down_proj", L,
			         e);
		const bool found = expert_tensor_exists(b, name);
		strcat(name, ".weight");
		if (!found)
			return error_set(
			    b->err, MOE_EINVAL,
			    "%s: layer %u is an MoE layer (%s) but tensor %s is missing", b->path,
			    L, b->config_path, name);
	}
	struct moe_expert *ex = alloc_experts(b, layer);
	if (!ex)
		return -1;
	for (uint32_t e = 0; e < in->n_experts; e++) {
		for (int p = 0; p < 3; p++) {
			if (mixtral)
				snprintf(name, sizeof(name),
				         "model.layers.%u.block_sparse_moe.experts.%u.%s.weight", L,
				         e, mixtral_names[p]);
			else
				snprintf(name, sizeof(name),
				         "model.layers.%u.mlp.experts.%u.%s.weight", L, e,
				         proj_names[p]);
			uint64_t rows = p == MOE_PROJ_DOWN ? in->hidden : in->expert_ffn;
			uint64_t cols = p == MOE_PROJ_DOWN ? in->expert_ffn : in->hidden;
			struct moe_proj_ref *pr = &ex[e].proj[p];
			char stem[256];
			snprintf(stem, sizeof(stem), "%.*s", (int)(strlen(name) - 7), name);
			const int int4 = take_int4(b, stem, rows, cols, e == 0, pr);
			if (int4 < 0)
				return -1;
			if (int4)
				continue;
			if (!find_tensor(b, name, &tv))
				return error_set(b->err, MOE_EINVAL,
				                 "%s: layer %u is an MoE layer (%s) but tensor "
				                 "%s is missing",
				                 b->path, L, b->config_path, name);
			if (take_weight(b, &tv, false, e, rows, cols, pr))
				return -1;
			if (moek_format_scale_block(pr->format) &&
			    take_fp8_scale(b, name, false, e, pr))
				return -1;
			char bias[264];
			snprintf(bias, sizeof(bias), "%.*s.bias", (int)(strlen(name) - 7), name);
			if (take_bias(b, bias, false, e, pr))
				return -1;
		}
	}
	return 1;
}

/* ---- assembling the catalog --------------------------------------------------------------- */

void moe_catalog_close(struct moe_catalog *cat)
{
	if (!cat)
		return;
	if (cat->layers)
		for (uint32_t L = 0; L < cat->info.n_layers; L++)
			free(cat->layers[L].experts);
	free(cat->layers);
	for (uint32_t i = 0; i < cat->n_files; i++)
		free(cat->files[i].path);
	free(cat->files);
	free(cat);
}

const struct moe_expert *moe_catalog_expert(const struct moe_catalog *cat, uint32_t layer,
                                            uint32_t expert)
{
	if (layer >= cat->info.n_layers || expert >= cat->info.n_experts || !cat->layers[layer].moe)
		return NULL;
	return &cat->layers[layer].experts[expert];
}

static int add_files(struct builder *b)
{
	struct moe_catalog *cat = b->cat;
	uint32_t n = b->gguf ? b->n_gguf : b->st->n_files;
	cat->files = calloc(n, sizeof(*cat->files));
	if (!cat->files)
		return error_set(b->err, MOE_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < n; i++) {
		const char *p = b->gguf ? b->gguf[i]->path : b->st->files[i]->path;
		cat->files[i].size = b->gguf ? b->gguf[i]->file_size : b->st->files[i]->file_size;
		if (!(cat->files[i].path = strdup(p)))
			return error_set(b->err, MOE_ENOMEM, "out of memory");
		cat->n_files = i + 1;
	}
	return 0;
}

static void account_expert(struct moe_catalog *cat, struct moe_expert *ex)
{
	ex->bytes = 0;
	ex->aligned_4k = true;
	for (int p = 0; p < MOE_PROJ_COUNT; p++) {
		const struct moe_proj_ref *pr = &ex->proj[p];
		if (!pr->present)
			continue;
		const struct moe_extent *xs[4] = {&pr->data, &pr->scale, &pr->bias, &pr->zeros};
		for (int k = 0; k < 4; k++) {
			if (!xs[k]->length)
				continue;
			ex->bytes += xs[k]->length;
			if (xs[k]->offset % SLAB_ALIGN)
				ex->aligned_4k = false;
		}
		uint32_t i = 0;
		while (i < cat->n_formats && cat->formats[i] != pr->format)
			i++;
		if (i == cat->n_formats && i < sizeof(cat->formats) / sizeof(cat->formats[0]))
			cat->formats[cat->n_formats++] = pr->format;
	}
	cat->expert_bytes_total += ex->bytes;
	cat->n_experts_aligned_4k += ex->aligned_4k;
}

static int build_layers(struct builder *b, const bool *hf_moe)
{
	struct moe_catalog *cat = b->cat;
	struct moe_model_hparams *in = &cat->info;
	if (in->hidden == 0 || in->expert_ffn == 0)
		return error_set(b->err, MOE_EINVAL,
		                 "%s: hidden size and expert FFN size must be non-zero", b->path);
	cat->layers = calloc(in->n_layers, sizeof(*cat->layers));
	if (!cat->layers)
		return error_set(b->err, MOE_ENOMEM, "out of memory");
	for (uint32_t L = 0; L < in->n_layers; L++) {
		bool want = hf_moe
		                ? hf_moe[L]
		                : L >= b->first_dense_layers && (L + 1) % in->moe_layer_step == 0;
		if (!want)
			continue;
		struct moe_layer *layer = &cat->layers[L];
		int rc = b->gguf ? gguf_layer(b, L, layer) : hf_layer(b, L, layer);
		if (rc < 0)
			return -1;
		if (rc == 0) {
			if (b->gguf && !gguf_layer_has_dense_ffn(b, L))
				return error_set(b->err, MOE_EINVAL,
				                 "%s: blk.%u: no expert tensors (expected "
				                 "blk.%u.ffn_gate_exps.weight or "
				                 "blk.%u.ffn_gate.0.weight)",
				                 b->path, L, L, L);
			continue;
		}
		struct moe_expert *ex = layer->experts;
		if (b->gguf && in->n_moe_layers == 0) { /* the score-correction bias, if any */
			char name[64];
			struct tview tv;
			snprintf(name, sizeof(name), "blk.%u.exp_probs_b.bias", L);
			in->score_bias = in->score_bias || find_tensor(b, name, &tv);
		}
		cat->layers[L].moe = true;
		in->n_moe_layers++;
		for (uint32_t e = 0; e < in->n_experts; e++)
			account_expert(cat, &ex[e]);
	}
	if (in->n_moe_layers == 0)
		return error_set(b->err, MOE_EINVAL, "%s: no MoE layer found", b->path);
	return 0;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), c = strlen(suffix);
	return a >= c && !strcmp(s + a - c, suffix);
}

/* ModelOpt's hf_quant_config.json next to config.json, read where config.json has no
 * quantization_config: 0 (absent, or read into the catalog's quant), -1 on error. */
static int read_hf_quant_config(struct builder *b)
{
	if (json_object_get(b->config, json_root(b->config), "quantization_config") != JSON_NONE)
		return 0;
	const char *slash = strrchr(b->config_path, '/');
	const size_t dir = slash ? (size_t)(slash - b->config_path) + 1 : 0;
	char path[4096];
	if (dir + sizeof("hf_quant_config.json") > sizeof(path))
		return 0;
	memcpy(path, b->config_path, dir);
	strcpy(path + dir, "hf_quant_config.json");
	FILE *f = fopen(path, "rb");
	if (!f)
		return 0;
	char *text = malloc(1u << 20);
	size_t len = text ? fread(text, 1, 1u << 20, f) : 0;
	const int too_big = text && len == 1u << 20;
	fclose(f);
	if (!text || too_big) {
		free(text);
		return error_set(b->err, text ? MOE_EINVAL : MOE_ENOMEM, "%s: %s", path,
		                 text ? "larger than 1 MiB" : "out of memory");
	}
	struct json_doc *doc;
	int rc = json_parse(text, len, &doc, b->err);
	free(text);
	if (rc)
		return error_prefix(b->err, path);
	rc = moe_quant_config_read_modelopt(doc, path, &b->cat->quant, b->err);
	json_free(doc);
	return rc;
}

static int open_hf(struct builder *b, char **config_path_out)
{
	struct stat st;
	if (stat(b->path, &st))
		return error_set(b->err, MOE_ESYS, "%s: cannot open: no such file or directory",
		                 b->path);
	/* config.json lives in the model directory */
	size_t n = strlen(b->path);
	char *cfg = malloc(n + 16);
	if (!cfg)
		return error_set(b->err, MOE_ENOMEM, "out of memory");
	*config_path_out = cfg;
	if (S_ISDIR(st.st_mode)) {
		snprintf(cfg, n + 16, "%s/config.json", b->path);
	} else {
		memcpy(cfg, b->path, n + 1);
		char *slash = strrchr(cfg, '/');
		if (slash)
			strcpy(slash + 1, "config.json");
		else
			strcpy(cfg, "config.json");
	}
	b->config_path = cfg;
	FILE *f = fopen(cfg, "rb");
	if (!f && S_ISDIR(st.st_mode))
		return error_set(b->err, MOE_ESYS,
		                 "%s: not a model: a checkpoint directory holds config.json and "
		                 "safetensors files (cannot open %s: %s)",
		                 b->path, cfg, strerror(errno));
	if (!f)
		return error_set(b->err, MOE_ESYS,
		                 "%s: config.json is required next to safetensors files "
		                 "(cannot open %s: %s)",
		                 b->path, cfg, strerror(errno));
	char *text = malloc(1u << 20);
	size_t len = text ? fread(text, 1, 1u << 20, f) : 0;
	int too_big = text && len == 1u << 20;
	fclose(f);
	if (!text || too_big) {
		free(text);
		return error_set(b->err, text ? MOE_EINVAL : MOE_ENOMEM, "%s: %s", cfg,
		                 text ? "larger than 1 MiB" : "out of memory");
	}
	int rc = json_parse(text, len, &b->config, b->err);
	free(text);
	if (rc)
		return error_prefix(b->err, cfg);
	return st_open_model(b->path, &b->st, b->err);
}

/* What a path holds. A .gguf name goes to the GGUF reader (whose errors are precise:
 * truncated, wrong magic); any other file is judged by its first bytes, so that /etc/passwd
 * or a PNG is "not a model" rather than a safetensors file without config.json. */
enum model_path_kind { PATH_GGUF, PATH_HF };

static int classify_path(const char *path, enum model_path_kind *kind, struct sidecar_error *err)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return error_set_errno(err, "%s", path);
	if (ends_with(path, ".gguf")) {
		*kind = PATH_GGUF;
		return 0;
	}
	if (S_ISDIR(st.st_mode) || ends_with(path, ".json")) {
		*kind = PATH_HF; /* a checkpoint directory, or its index */
		return 0;
	}
	if (!S_ISREG(st.st_mode))
		return error_set(err, MOE_EINVAL, "%s: not a regular file or a directory", path);
	unsigned char head[9] = {0};
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return error_set_errno(err, "%s: cannot open", path);
	ssize_t n = pread(fd, head, sizeof(head), 0);
	int e = errno;
	close(fd);
	if (n < 0)
		return error_set(err, MOE_EIO, "%s: read: %s", path, strerror(e));
	if (n >= 4 && !memcmp(head, "GGUF", 4)) {
		*kind = PATH_GGUF;
		return 0;
	}
	/* safetensors: a little-endian u64 header length, then the JSON header's '{'. */
	if (n == (ssize_t)sizeof(head) && head[8] == '{') {
		*kind = PATH_HF;
		return 0;
	}
	return error_set(err, MOE_EINVAL,
	                 "%s: not a model: neither a GGUF file (no \"GGUF\" magic) nor a "
	                 "safetensors file (no JSON header after the first 8 bytes); give a "
	                 ".gguf file, a .safetensors file or a checkpoint directory",
	                 path);
}

/* A single shard of a sharded checkpoint is never the whole model: say which directory to
 * open instead of failing later on a missing tensor. Hugging Face names shards
 * PREFIX-0000K-of-0000N.safetensors and lists them in model.safetensors.index.json. */
static int refuse_one_shard(const char *path, struct sidecar_error *err)
{
	struct stat st;
	if (stat(path, &st) != 0 || S_ISDIR(st.st_mode) || ends_with(path, ".json"))
		return 0;
	const char *slash = strrchr(path, '/');
	const char *base = slash ? slash + 1 : path;
	const int dir_len = slash ? (int)(slash - path) : 1;
	const char *dir = slash ? path : ".";
	const char *of = strstr(base, "-of-");
	unsigned k = 0, n = 0;
	int used = 0;
	if (of && of - base >= 6 &&
	    sscanf(of - 5, "%5u-of-%5u.safetensors%n", &k, &n, &used) == 2 && of[-6] == '-' &&
	    (size_t)used == strlen(of - 5) && n > 1)
		return error_set(err, MOE_EINVAL,
		                 "%s is shard %u of %u of a checkpoint: open its directory "
		                 "(%.*s) instead",
		                 path, k, n, dir_len, dir);
	char index[4096];
	snprintf(index, sizeof(index), "%.*s/model.safetensors.index.json", dir_len, dir);
	if (stat(index, &st) == 0)
		return error_set(err, MOE_EINVAL,
		                 "%s: %s says this checkpoint is sharded: open its directory "
		                 "(%.*s) instead of one file",
		                 path, index, dir_len, dir);
	return 0;
}

int moe_catalog_open(const char *path, struct moe_catalog **out, struct sidecar_error *err)
{
	*out = NULL;
	struct builder b = {.path = path, .err = err};
	struct moe_catalog *cat = calloc(1, sizeof(*cat));
	if (!cat)
		return error_set(err, MOE_ENOMEM, "out of memory");
	b.cat = cat;
	bool *hf_moe = NULL;
	char *config_path = NULL;
	enum model_path_kind kind;
	int rc = classify_path(path, &kind, err);
	if (rc) {
		moe_catalog_close(cat);
		return -1;
	}
	if (kind == PATH_GGUF) {
		cat->info.container = MOE_CONTAINER_GGUF;
		rc = gguf_open_splits(path, &b.gguf, &b.n_gguf, err);
		if (!rc)
			rc = gguf_read_info(&b);
	} else {
		cat->info.container = MOE_CONTAINER_SAFETENSORS;
		rc = refuse_one_shard(path, err);
		if (!rc)
			rc = open_hf(&b, &config_path);
		if (!rc)
			rc = hf_read_info(&b, &hf_moe);
		if (!rc)
			rc = moe_quant_config_read(b.config, b.config_path, &cat->quant, err);
		if (!rc)
			rc = read_hf_quant_config(&b);
	}
	if (!rc)
		rc = add_files(&b);
	if (!rc)
		rc = build_layers(&b, hf_moe);
	free(hf_moe);
	gguf_close_splits(b.gguf, b.n_gguf);
	st_close_model(b.st);
	json_free(b.config);
	free(config_path);
	if (rc) {
		moe_catalog_close(cat);
		return -1;
	}
	*out = cat;
	return 0;
}
