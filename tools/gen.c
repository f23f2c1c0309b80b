/* gen.c — see moe_gen.h. A model is first planned as a list of tensors (name, shape, type,
 * which file, offset), then each file is written in one sequential pass: header, then tensor
 * data produced chunk by chunk (floats → moek_quantize → an 8 MiB write buffer), so memory
 * stays small whatever the model size and every write(2) is large. */
#include "moe_gen.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gen_internal.h"
#include "gguf.h"
#include "moe_kernels.h"
#include "progress.h"
#include "safetensors.h"

/* ---- deterministic floats ------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

void moe_gen_floats(uint64_t seed, uint32_t layer, uint32_t expert, enum moe_gen_tensor which,
                    uint64_t cols, uint64_t first, size_t n, float *out)
{
	const uint64_t key =
	    mix64(mix64(seed) ^ ((uint64_t)layer << 40 | (uint64_t)expert << 8 | (uint64_t)which));
	float scale, offset = 0.0f;
	switch (which) {
	case MOE_GEN_GATE_BIAS:
	case MOE_GEN_UP_BIAS:
	case MOE_GEN_DOWN_BIAS:
	case MOE_GEN_ATTN_Q_BIAS:
	case MOE_GEN_ATTN_K_BIAS:
	case MOE_GEN_ATTN_V_BIAS:
	case MOE_GEN_ATTN_O_BIAS:
	case MOE_GEN_ROUTER_BIAS: scale = 0.1f; break;
	case MOE_GEN_EMBED:
	case MOE_GEN_ATTN_SINKS: scale = 1.0f; break;
	case MOE_GEN_NORM_ATTN:
	case MOE_GEN_NORM_FFN:
	case MOE_GEN_NORM_FINAL:
	case MOE_GEN_NORM_Q:
	case MOE_GEN_NORM_K:
	case MOE_GEN_NORM_Q_A:
	case MOE_GEN_NORM_KV_A:
		scale = 1.0f / 16;
		offset = 1.0f; /* a norm's gain: about 1, so activations keep their scale */
		break;
	default: scale = 1.0f / sqrtf((float)(cols ? cols : 1)); break;
	}
	/* element idx takes 24 bits of hash(idx / 2): the low-middle bits for even idx, the
	 * top bits for odd idx, so one hash feeds two elements; values in [-1, 1) exactly */
	const float unit = 0x1p-23f * scale;
	size_t i = 0;
	uint64_t idx = first;
	if (n && (idx & 1)) {
		uint64_t h = mix64(key + (idx >> 1) * 0x9e3779b97f4a7c15ull);
		out[i++] = (float)((int32_t)(h >> 40) - (1 << 23)) * unit;
		idx++;
	}
	for (; i + 1 < n; i += 2, idx += 2) {
		uint64_t h = mix64(key + (idx >> 1) * 0x9e3779b97f4a7c15ull);
		out[i] = (float)((int32_t)((h >> 8) & 0xffffffu) - (1 << 23)) * unit;
		out[i + 1] = (float)((int32_t)(h >> 40) - (1 << 23)) * unit;
	}
	if (i < n) {
		uint64_t h = mix64(key + (idx >> 1) * 0x9e3779b97f4a7c15ull);
		out[i] = (float)((int32_t)((h >> 8) & 0xffffffu) - (1 << 23)) * unit;
	}
	if (offset != 0.0f)
		for (size_t j = 0; j < n; j++)
			out[j] += offset;
}

/* ---- plan ------------------------------------------------------------------------------ */

enum gen_kind {
	GK_WEIGHT,
	GK_FP8_SCALE,
	GK_BIAS,
	GK_ROUTER,
	GK_MXFP4_BLOCKS,
	GK_MXFP4_SCALES,
	GK_VECTOR,     /* a norm, bias or sink vector outside the experts (--full-model) */
	GK_INT4,       /* one tensor of an INT4 checkpoint's projection (gen_tensor.part) */
	GK_TRANSPOSED, /* Llama-4 HF experts: [E, cols, rows], input-major (gate_up: halves) */
};

/* The tensors of one INT4 projection, in file order: compressed-tensors, then GPTQ. */
enum int4_part {
	I4_PACKED,
	I4_SCALE,
	I4_SHAPE,
	I4_QWEIGHT,
	I4_QZEROS,
	I4_SCALES,
	I4_GIDX,
	/* ModelOpt NVFP4 (format NVFP4 in safetensors): the same machinery, its own tensors */
	NV_WEIGHT,
	NV_SCALE,
	NV_SCALE2,
	NV_INPUT,
};

struct gen_tensor {
	char name[112];
	enum gen_kind kind;
	uint32_t layer;
	int32_t expert; /* -1: all experts, merged along the slowest axis */
	enum moe_gen_tensor which;
	bool interleaved;    /* HF gpt-oss gate_up: even rows gate, odd rows up */
	bool halves;         /* GGUF ffn_gate_up_exps: rows [0, ffn) gate, [ffn, 2 ffn) up */
	uint8_t part;        /* GK_INT4: enum int4_part */
	uint64_t rows, cols; /* per-expert matrix (vectors: rows x 1) */
	uint32_t format;     /* moek format of the stored values */
	int st_dtype;        /* safetensors dtype */
	uint32_t n_dims;
	uint64_t shape[4]; /* GGUF: ne innermost first; safetensors: outermost first */
	uint64_t nbytes;
	uint32_t file;
	uint64_t offset; /* relative to the file's data section */
};

/* Rows [r0, r0+nr) of expert e of tensor t quantized into dst (inside a write buffer). FP8
 * weights also fill their 128x128 scale blocks (fp8_scales, the rows' block row), MXFP4
 * _blocks their E8M0 scales (mx_scales). Jobs of one batch touch disjoint bytes. */
struct gen_job {
	const struct gen_tensor *t;
	uint32_t e;
	uint64_t r0, nr;
	void *dst;
	float *fp8_scales;
	uint8_t *mx_scales;
};

/* One thread's reusable buffers: a job's floats and (MXFP4 _blocks) its GGUF-layout blocks. */
struct gen_scratch {
	void *floats, *blocks;
	size_t floats_cap, blocks_cap; /* bytes */
};

struct gen_worker {
	struct gen_pool *pool;
	pthread_t thread;
	struct gen_scratch scratch;
};

struct gen_pool {
	pthread_mutex_t lock;
	pthread_cond_t start, finished;
	uint64_t seed;
	const struct gen_job *jobs; /* the running batch; valid while next_job < n_jobs */
	size_t n_jobs, next_job, jobs_done;
	uint64_t batch; /* incremented when a batch starts */
	bool quit;
	const struct gen_job *failed; /* a job that could not run (out of memory, bad shape) */
	unsigned n_workers;
	struct gen_worker workers[MOE_GEN_MAX_THREADS - 1];
};

/* The write in flight (busy) on the writer thread; error: errno of a failed write, EIO for
 * a write that made no progress. */
struct gen_writer {
	pthread_mutex_t lock;
	pthread_cond_t wake, idle;
	pthread_t thread;
	int fd;
	const unsigned char *buf;
	size_t len;
	bool busy, quit;
	int error;
};

struct gen {
	const struct moe_gen_options *opt;
	struct gen_model m;                  /* what the options describe */
	const struct gen_whole_model *whole; /* the rest of a whole model (m.full) */
	struct sidecar_error *err;
	struct gen_tensor *t;
	size_t n_t, cap_t;
	uint32_t n_files;
	char **paths;
	/* writing (calling thread only) */
	int fd;
	const char *path;
	unsigned char *bufs[2], *buf; /* buf: bufs[buf_index], being filled */
	unsigned buf_index;
	size_t buf_len;
	struct gen_job *pending; /* jobs producing bytes of buf, run by run_batch */
	size_t n_pending;
	struct gen_scratch scratch; /* the calling thread's */
	float *fp8_scales; /* scales of the last FP8 weight written, for its _scale_inv tensor */
	size_t fp8_scales_cap;
	uint8_t *mx_scales; /* E8M0 scales of the last MXFP4 _blocks tensor, for _scales */
	size_t mx_scales_cap;
	uint8_t *int4; /* every tensor of the INT4 projection being written (GK_INT4) */
	size_t int4_cap;
	uint32_t int4_group; /* MOE_GEN_GROUP_ROW: each projection's row (int4_group_of) */
	struct gen_pool pool;
	struct gen_writer writer;
	bool sync_ready, writer_started;
	struct progress prog;
	uint64_t done, total; /* bytes written by the writer thread / to write */
};

#define WRITE_BUF (8u << 20)
#define MAX_PENDING_JOBS 256

static struct gen_tensor *plan_add(struct gen *g, enum gen_kind kind, uint32_t layer,
                                   int32_t expert, enum moe_gen_tensor which, uint64_t rows,
                                   uint64_t cols, uint32_t format)
{
	if (g->n_t == g->cap_t) {
		size_t nc = g->cap_t ? g->cap_t * 2 : 256;
		struct gen_tensor *nt = realloc(g->t, nc * sizeof(*nt));
		if (!nt)
			return NULL;
		g->t = nt;
		g->cap_t = nc;
	}
	struct gen_tensor *t = &g->t[g->n_t++];
	memset(t, 0, sizeof(*t));
	t->kind = kind;
	t->layer = layer;
	t->expert = expert;
	t->which = which;
	t->rows = rows;
	t->cols = cols;
	t->format = format;
	return t;
}

static int st_dtype_of(uint32_t format)
{
	switch (format) {
	case MOEK_F32: return ST_F32;
	case MOEK_F16: return ST_F16;
	case MOEK_BF16: return ST_BF16;
	case MOEK_FP8_E4M3_B128: return ST_F8_E4M3;
	default: return -1;
	}
}

/* Shape helpers: a matrix of rows x cols, optionally with n experts as the slowest axis. */
static void set_shape(struct gen *g, struct gen_tensor *t, uint32_t n, const uint64_t *outer_first)
{
	t->n_dims = n;
	for (uint32_t i = 0; i < n; i++)
		t->shape[i] = g->m.gguf ? outer_first[n - 1 - i] : outer_first[i];
}

static uint64_t fmt_bytes(uint32_t format, uint64_t rows, uint64_t cols)
{
	return rows * moek_row_bytes(format, (size_t)cols);
}

static int plan_fail(struct gen *g)
{
	return error_set(g->err, MOE_ENOMEM, "out of memory");
}

/* ---- K-quant and i-quant mixes ------------------------------------------------------ */

static const struct {
	const char *name;
	uint32_t file_type; /* llama.cpp LLAMA_FTYPE_MOSTLY_* */
} mixes[] = {
    [MOE_GEN_MIX_Q4_K_M] = {"Q4_K_M", 15}, [MOE_GEN_MIX_Q3_K_M] = {"Q3_K_M", 12},
    [MOE_GEN_MIX_Q2_K] = {"Q2_K", 10},     [MOE_GEN_MIX_IQ2_XXS] = {"IQ2_XXS", 19},
    [MOE_GEN_MIX_IQ2_XS] = {"IQ2_XS", 20}, [MOE_GEN_MIX_IQ3_XXS] = {"IQ3_XXS", 23},
    [MOE_GEN_MIX_IQ1_S] = {"IQ1_S", 24},   [MOE_GEN_MIX_IQ1_M] = {"IQ1_M", 31},
    [MOE_GEN_MIX_IQ2_S] = {"IQ2_S", 28},   [MOE_GEN_MIX_IQ2_M] = {"IQ2_M", 29},
};

const char *moe_gen_mix_name(enum moe_gen_mix mix)
{
	return mix > MOE_GEN_MIX_NONE && mix <= MOE_GEN_MIX_LAST ? mixes[mix].name : NULL;
}

uint32_t moe_gen_mix_file_type(enum moe_gen_mix mix)
{
	return moe_gen_mix_name(mix) ? mixes[mix].file_type : 0;
}

int moe_gen_mix_parse(const char *name, enum moe_gen_mix *out)
{
	for (enum moe_gen_mix m = MOE_GEN_MIX_Q4_K_M; m <= MOE_GEN_MIX_LAST; m++)
		if (!strcasecmp(name, mixes[m].name)) {
			*out = m;
			return 0;
		}
	return -1;
}

/* llama.cpp's use_more_bits: the first and last eighths of the blocks and every third block
 * in between get the larger type. */
static bool more_bits(uint32_t i, uint32_t n)
{
	return i < n / 8 || i >= 7 * n / 8 || (i >= n / 8 && (i - n / 8) % 3 == 2);
}

uint32_t moe_gen_mix_format(enum moe_gen_mix mix, enum moe_gen_tensor which, uint32_t layer,
                            uint32_t n_layers)
{
	const bool down = which == MOE_GEN_DOWN;
	switch (mix) {
	case MOE_GEN_MIX_Q4_K_M: return down && more_bits(layer, n_layers) ? MOEK_Q6_K : MOEK_Q4_K;
	case MOE_GEN_MIX_Q3_K_M:
		if (!down)
			return MOEK_Q3_K;
		return layer < n_layers / 16 ? MOEK_Q5_K : MOEK_Q4_K;
	case MOE_GEN_MIX_Q2_K: return down ? MOEK_Q3_K : MOEK_Q2_K;
	/* llama_tensor_get_type's i-quant branch: the downs of the first eighth of the blocks
	 * (its ffn_down counter; one down tensor of experts per block) in Q2_K */
	case MOE_GEN_MIX_IQ2_XXS: return down && layer < n_layers / 8 ? MOEK_Q2_K : MOEK_IQ2_XXS;
	case MOE_GEN_MIX_IQ2_XS: return down && layer < n_layers / 8 ? MOEK_Q2_K : MOEK_IQ2_XS;
	case MOE_GEN_MIX_IQ1_S: return down && layer < n_layers / 8 ? MOEK_Q2_K : MOEK_IQ1_S;
	case MOE_GEN_MIX_IQ1_M: return down && layer < n_layers / 8 ? MOEK_Q2_K : MOEK_IQ1_M;
	/* the ftypes IQ2_S and IQ2_M default to IQ2_XS and IQ2_S; their early downs get IQ3_S */
	case MOE_GEN_MIX_IQ2_S: return down && layer < n_layers / 8 ? MOEK_IQ3_S : MOEK_IQ2_XS;
	case MOE_GEN_MIX_IQ2_M: return down && layer < n_layers / 8 ? MOEK_IQ3_S : MOEK_IQ2_S;
	/* its ffn_down rule without an importance matrix (the generator has none) */
	case MOE_GEN_MIX_IQ3_XXS:
		if (!down)
			return MOEK_IQ3_XXS;
		return layer < n_layers / 8 ? MOEK_Q4_K : MOEK_Q3_K;
	case MOE_GEN_MIX_NONE: break;
	}
	return MOEK_F32;
}

/* The format of expert projection p (0 gate, 1 up, 2 down) of block L. */
static uint32_t expert_format(const struct gen *g, uint32_t L, int p)
{
	static const enum moe_gen_tensor mats[3] = {MOE_GEN_GATE, MOE_GEN_UP, MOE_GEN_DOWN};
	const enum moe_gen_mix mix = g->opt->mix;
	return mix ? moe_gen_mix_format(mix, mats[p], L, g->m.n_layers) : g->m.format;
}

/* The group size of an INT4 projection of `cols` inputs. */
static uint64_t int4_group_of(const struct gen *g, uint64_t cols)
{
	return g->int4_group == MOE_GEN_GROUP_ROW ? cols : g->int4_group;
}

/* The tensors of INT4 projection `stem` (…experts.E.gate_proj) of expert e: weight_packed,
 * weight_scale and weight_shape (compressed-tensors) or qweight, qzeros, scales and g_idx
 * (GPTQ), with the shapes and dtypes the checkpoints carry. */
static int plan_int4(struct gen *g, uint32_t L, uint32_t e, enum moe_gen_tensor which,
                     const char *stem, uint64_t rows, uint64_t cols)
{
	static const char *const suffix[] = {"weight_packed", "weight_scale", "weight_shape",
	                                     "qweight",       "qzeros",       "scales",
	                                     "g_idx"};
	const uint64_t G = int4_group_of(g, cols);
	const bool ct = g->opt->int4 == MOE_GEN_INT4_CT, awq = g->opt->int4 == MOE_GEN_INT4_AWQ;
	const int last = ct ? I4_SHAPE : awq ? I4_SCALES : I4_GIDX; /* AWQ has no g_idx */
	for (int k = ct ? I4_PACKED : I4_QWEIGHT; k <= last; k++) {
		struct gen_tensor *t =
		    plan_add(g, GK_INT4, L, (int32_t)e, which, rows, cols, MOEK_INT4_G32);
		if (!t)
			return plan_fail(g);
		t->part = (uint8_t)k;
		snprintf(t->name, sizeof(t->name), "%s.%s", stem, suffix[k]);
		switch (k) {
		case I4_PACKED:
			set_shape(g, t, 2, (uint64_t[]){rows, cols / 8});
			t->st_dtype = ST_I32;
			t->nbytes = moek_int4_packed_bytes(rows, cols);
			break;
		case I4_SCALE:
			set_shape(g, t, 2, (uint64_t[]){rows, cols / G});
			t->st_dtype = ST_BF16;
			t->nbytes = moek_int4_scale_bytes(rows, cols, G);
			break;
		case I4_SHAPE:
			set_shape(g, t, 1, (uint64_t[]){2});
			t->st_dtype = ST_I32;
			t->nbytes = 8;
			break;
		case I4_QWEIGHT: /* AWQ packs along the output */
			if (awq)
				set_shape(g, t, 2, (uint64_t[]){cols, rows / 8});
			else
				set_shape(g, t, 2, (uint64_t[]){cols / 8, rows});
			t->st_dtype = ST_I32;
			t->nbytes = moek_int4_packed_bytes(rows, cols);
			break;
		case I4_QZEROS:
			set_shape(g, t, 2, (uint64_t[]){cols / G, rows / 8});
			t->st_dtype = ST_I32;
			t->nbytes = moek_int4_zero_bytes(rows, cols, G);
			break;
		case I4_SCALES:
			set_shape(g, t, 2, (uint64_t[]){cols / G, rows});
			t->st_dtype = ST_F16;
			t->nbytes = moek_int4_scale_bytes(rows, cols, G);
			break;
		default:
			set_shape(g, t, 1, (uint64_t[]){cols});
			t->st_dtype = ST_I32;
			t->nbytes = 4 * cols;
			break;
		}
	}
	return 0;
}

/* The tensors of ModelOpt NVFP4 projection `stem`: weight U8 [rows, cols / 2], weight_scale
 * F8_E4M3 [rows, cols / 16], weight_scale_2 and input_scale F32 scalars. */
static int plan_nvfp4(struct gen *g, uint32_t L, uint32_t e, enum moe_gen_tensor which,
                      const char *stem, uint64_t rows, uint64_t cols)
{
	static const char *const suffix[] = {"weight", "weight_scale", "weight_scale_2",
	                                     "input_scale"};
	for (int k = NV_WEIGHT; k <= NV_INPUT; k++) {
		struct gen_tensor *t =
		    plan_add(g, GK_INT4, L, (int32_t)e, which, rows, cols, MOEK_NVFP4);
		if (!t)
			return plan_fail(g);
		t->part = (uint8_t)k;
		snprintf(t->name, sizeof(t->name), "%s.%s", stem, suffix[k - NV_WEIGHT]);
		if (k == NV_WEIGHT) {
			set_shape(g, t, 2, (uint64_t[]){rows, cols / 2});
			t->st_dtype = ST_U8;
			t->nbytes = rows * cols / 2;
		} else if (k == NV_SCALE) {
			set_shape(g, t, 2, (uint64_t[]){rows, cols / 16});
			t->st_dtype = ST_F8_E4M3;
			t->nbytes = rows * cols / 16;
		} else {
			set_shape(g, t, 0, NULL);
			t->st_dtype = ST_F32;
			t->nbytes = 4;
		}
	}
	return 0;
}

static int plan_layer(struct gen *g, uint32_t L)
{
	const enum moe_arch arch = g->m.preset->arch;
	const uint32_t E = g->m.n_experts;
	const uint64_t H = g->m.hidden, F = g->m.ffn;
	const uint32_t vec_format = g->m.gguf || g->m.format == MOEK_F32 ? MOEK_F32 : MOEK_BF16;
	struct gen_tensor *t;
	/* router: [E, hidden] */
	if (!(t = plan_add(g, GK_ROUTER, L, 0, MOE_GEN_ROUTER, E, H, vec_format)))
		return plan_fail(g);
	const bool sparse_moe = arch == MOE_ARCH_MIXTRAL || arch == MOE_ARCH_MINIMAX_M2;
	if (g->m.gguf)
		snprintf(t->name, sizeof(t->name), "blk.%u.ffn_gate_inp.weight", L);
	else
		snprintf(t->name, sizeof(t->name),
		         sparse_moe                 ? "model.layers.%u.block_sparse_moe.gate.weight"
		         : arch == MOE_ARCH_GPT_OSS ? "model.layers.%u.mlp.router.weight"
		         : arch == MOE_ARCH_LLAMA4
		             ? "language_model.model.layers.%u.feed_forward.router.weight"
		             : "model.layers.%u.mlp.gate.weight",
		         L);
	set_shape(g, t, 2, (uint64_t[]){E, H});
	t->st_dtype = st_dtype_of(vec_format);
	t->nbytes = fmt_bytes(vec_format, E, H);

	static const enum moe_gen_tensor mats[3] = {MOE_GEN_GATE, MOE_GEN_UP, MOE_GEN_DOWN};
	static const enum moe_gen_tensor biases[3] = {MOE_GEN_GATE_BIAS, MOE_GEN_UP_BIAS,
	                                              MOE_GEN_DOWN_BIAS};
	static const char *const gguf_proj[3] = {"gate", "up", "down"};
	const bool bias = arch == MOE_ARCH_GPT_OSS;

	if (!g->m.gguf && arch == MOE_ARCH_GPT_OSS) {
		/* gate_up_proj_{blocks,scales,bias}, down_proj_{blocks,scales,bias} */
		for (int k = 0; k < 2; k++) {
			const char *stem = k ? "down_proj" : "gate_up_proj";
			uint64_t rows = k ? H : 2 * F, cols = k ? F : H, nb = cols / 32;
			if (!(t = plan_add(g, GK_MXFP4_BLOCKS, L, -1,
			                   k ? MOE_GEN_DOWN : MOE_GEN_GATE, rows, cols,
			                   MOEK_MXFP4)))
				return plan_fail(g);
			t->interleaved = !k;
			snprintf(t->name, sizeof(t->name), "model.layers.%u.mlp.experts.%s_blocks",
			         L, stem);
			set_shape(g, t, 4, (uint64_t[]){E, rows, nb, 16});
			t->st_dtype = ST_U8;
			t->nbytes = E * rows * nb * 16;
			if (!(t = plan_add(g, GK_MXFP4_SCALES, L, -1, MOE_GEN_GATE, rows, cols,
			                   MOEK_MXFP4)))
				return plan_fail(g);
			snprintf(t->name, sizeof(t->name), "model.layers.%u.mlp.experts.%s_scales",
			         L, stem);
			set_shape(g, t, 3, (uint64_t[]){E, rows, nb});
			t->st_dtype = ST_U8;
			t->nbytes = E * rows * nb;
			if (!(t = plan_add(g, GK_BIAS, L, -1,
			                   k ? MOE_GEN_DOWN_BIAS : MOE_GEN_GATE_BIAS, rows, 1,
			                   MOEK_BF16)))
				return plan_fail(g);
			t->interleaved = !k;
			snprintf(t->name, sizeof(t->name), "model.layers.%u.mlp.experts.%s_bias", L,
			         stem);
			set_shape(g, t, 2, (uint64_t[]){E, rows});
			t->st_dtype = ST_BF16;
			t->nbytes = E * rows * 2;
		}
		return 0;
	}
	if (!g->m.gguf && arch == MOE_ARCH_LLAMA4) {
		/* experts.gate_up_proj [E, hidden, 2 ffn], experts.down_proj [E, ffn, hidden] */
		for (int k = 0; k < 2; k++) {
			const uint64_t rows = k ? H : 2 * F, cols = k ? F : H;
			if (!(t = plan_add(g, GK_TRANSPOSED, L, -1, k ? MOE_GEN_DOWN : MOE_GEN_GATE,
			                   rows, cols, g->m.format)))
				return plan_fail(g);
			t->halves = !k;
			snprintf(t->name, sizeof(t->name),
			         "language_model.model.layers.%u.feed_forward.experts.%s", L,
			         k ? "down_proj" : "gate_up_proj");
			set_shape(g, t, 3, (uint64_t[]){E, cols, rows});
			t->st_dtype = st_dtype_of(g->m.format);
			t->nbytes = E * fmt_bytes(g->m.format, rows, cols);
		}
		return 0;
	}
	if (g->m.gguf && !g->opt->per_expert) {
		const bool fused = g->opt->fused_gate_up;
		for (int p = fused ? 1 : 0; p < 3; p++) {
			const bool gate_up = fused && p == 1;
			const char *pname = gate_up ? "gate_up" : gguf_proj[p];
			uint64_t rows = p == 2 ? H : gate_up ? 2 * F : F, cols = p == 2 ? F : H;
			const uint32_t format = expert_format(g, L, p);
			if (!(t = plan_add(g, GK_WEIGHT, L, -1, gate_up ? MOE_GEN_GATE : mats[p],
			                   rows, cols, format)))
				return plan_fail(g);
			t->halves = gate_up;
			snprintf(t->name, sizeof(t->name), "blk.%u.ffn_%s_exps.weight", L, pname);
			set_shape(g, t, 3, (uint64_t[]){E, rows, cols});
			t->nbytes = E * fmt_bytes(format, rows, cols);
			if (!bias)
				continue;
			if (!(t = plan_add(g, GK_BIAS, L, -1,
			                   gate_up ? MOE_GEN_GATE_BIAS : biases[p], rows, 1,
			                   MOEK_F32)))
				return plan_fail(g);
			t->halves = gate_up;
			snprintf(t->name, sizeof(t->name), "blk.%u.ffn_%s_exps.bias", L, pname);
			set_shape(g, t, 2, (uint64_t[]){E, rows});
			t->nbytes = E * rows * 4;
		}
		return 0;
	}
	static const char *const mixtral_proj[3] = {"w1", "w3", "w2"};
	static const char *const hf_proj[3] = {"gate_proj", "up_proj", "down_proj"};
	for (uint32_t e = 0; e < E; e++) {
		for (int p = 0; p < 3; p++) {
			uint64_t rows = p == 2 ? H : F, cols = p == 2 ? F : H;
			const uint32_t format = expert_format(g, L, p);
			if (format == MOEK_INT4_G32 || (format == MOEK_NVFP4 && !g->m.gguf)) {
				char stem[96];
				if (sparse_moe)
					snprintf(stem, sizeof(stem),
					         "model.layers.%u.block_sparse_moe.experts.%u.%s",
					         L, e, mixtral_proj[p]);
				else
					snprintf(stem, sizeof(stem),
					         "model.layers.%u.mlp.experts.%u.%s", L, e,
					         hf_proj[p]);
				if (format == MOEK_NVFP4
				        ? plan_nvfp4(g, L, e, mats[p], stem, rows, cols)
				        : plan_int4(g, L, e, mats[p], stem, rows, cols))
					return -1;
				continue;
			}
			if (!(t = plan_add(g, GK_WEIGHT, L, (int32_t)e, mats[p], rows, cols,
			                   format)))
				return plan_fail(g);
			if (g->m.gguf)
				snprintf(t->name, sizeof(t->name), "blk.%u.ffn_%s.%u.weight", L,
				         gguf_proj[p], e);
			else if (sparse_moe)
				snprintf(t->name, sizeof(t->name),
				         "model.layers.%u.block_sparse_moe.experts.%u.%s.weight", L,
				         e, mixtral_proj[p]);
			else
				snprintf(t->name, sizeof(t->name),
				         "model.layers.%u.mlp.experts.%u.%s.weight", L, e,
				         hf_proj[p]);
			set_shape(g, t, 2, (uint64_t[]){rows, cols});
			t->st_dtype = st_dtype_of(format);
			t->nbytes = fmt_bytes(format, rows, cols);
			char stem[88]; /* t->name without ".weight"; names here are < 80 bytes */
			snprintf(stem, sizeof(stem), "%.*s", (int)(strlen(t->name) - 7), t->name);
			if (g->m.format == MOEK_FP8_E4M3_B128) {
				struct gen_tensor *s = plan_add(g, GK_FP8_SCALE, L, (int32_t)e,
				                                mats[p], rows, cols, MOEK_F32);
				if (!s)
					return plan_fail(g);
				snprintf(s->name, sizeof(s->name), "%.87s.weight_scale_inv", stem);
				set_shape(g, s, 2,
				          (uint64_t[]){(rows + 127) / 128, (cols + 127) / 128});
				s->st_dtype = ST_F32;
				s->nbytes = moek_fp8_scale_bytes(rows, cols);
			}
			if (bias) {
				struct gen_tensor *b = plan_add(g, GK_BIAS, L, (int32_t)e,
				                                biases[p], rows, 1, MOEK_F32);
				if (!b)
					return plan_fail(g);
				snprintf(b->name, sizeof(b->name), "%.87s.bias", stem);
				set_shape(g, b, 1, (uint64_t[]){rows});
				b->st_dtype = ST_F32;
				b->nbytes = rows * 4;
			}
		}
	}
	return 0;
}

int gen_plan_matrix(struct gen *g, const char *name, uint32_t layer, enum moe_gen_tensor which,
                    uint64_t rows, uint64_t cols, uint32_t format)
{
	struct gen_tensor *t = plan_add(g, GK_WEIGHT, layer, 0, which, rows, cols, format);
	if (!t)
		return plan_fail(g);
	snprintf(t->name, sizeof(t->name), "%s", name);
	set_shape(g, t, 2, (uint64_t[]){rows, cols});
	t->st_dtype = st_dtype_of(format);
	t->nbytes = fmt_bytes(format, rows, cols);
	if (format != MOEK_FP8_E4M3_B128)
		return 0;
	/* t may move: plan_add reallocates */
	struct gen_tensor *s = plan_add(g, GK_FP8_SCALE, layer, 0, which, rows, cols, MOEK_F32);
	if (!s)
		return plan_fail(g);
	const char *dot = strrchr(name, '.');
	int stem = dot ? (int)(dot - name) : (int)strlen(name);
	snprintf(s->name, sizeof(s->name), "%.*s.weight_scale_inv", stem, name);
	set_shape(g, s, 2, (uint64_t[]){(rows + 127) / 128, (cols + 127) / 128});
	s->st_dtype = ST_F32;
	s->nbytes = moek_fp8_scale_bytes(rows, cols);
	return 0;
}

int gen_plan_vector(struct gen *g, const char *name, uint32_t layer, enum moe_gen_tensor which,
                    uint64_t n, uint32_t format)
{
	struct gen_tensor *t = plan_add(g, GK_VECTOR, layer, 0, which, n, 1, format);
	if (!t)
		return plan_fail(g);
	snprintf(t->name, sizeof(t->name), "%s", name);
	set_shape(g, t, 1, (uint64_t[]){n});
	t->st_dtype = st_dtype_of(format);
	t->nbytes = n * (format == MOEK_F32 ? 4 : 2);
	return 0;
}

/* Every tensor, in file order: per layer, a whole model's attention before the router and
 * routed experts, and its shared experts or dense FFN after them. */
static int plan_model(struct gen *g)
{
	const struct gen_model *m = &g->m;
	const struct gen_whole_model *w = g->whole;
	if (m->full && w->plan_head(g, m))
		return -1;
	for (uint32_t L = m->full ? 0 : m->leading_dense; L < m->n_layers; L++) {
		if (m->full && w->plan_layer_attention(g, m, L))
			return -1;
		if (L >= m->leading_dense && (L + 1) % m->moe_step == 0 && plan_layer(g, L))
			return -1;
		if (m->full && w->plan_layer_ffn(g, m, L))
			return -1;
	}
	return m->full ? w->plan_tail(g, m) : 0;
}

/* ---- writing: quantizing threads and a write-behind thread ----------------------------
 *
 * Tensor data is produced into one of two WRITE_BUF buffers as a batch of jobs (row ranges
 * of one expert's matrix, each quantized straight into its final place in the buffer). When
 * the buffer is full its batch runs on the pool (the calling thread takes jobs too), then the
 * buffer goes to the writer thread and filling continues in the other one, so computing
 * overlaps the large sequential write(2)s. A job's bytes depend only on (seed, tensor,
 * expert, rows), never on which thread ran it: the output is the same for any --threads.
 * Threading: everything but gen_job execution runs on the calling thread; pool and writer
 * state is shared only under their locks. */

static int ensure(void **p, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	void *n = realloc(*p, need);
	if (!n)
		return -1;
	*p = n;
	*cap = need;
	return 0;
}

/* Rows [r0, r0+nr) of expert e's matrix as floats in out. Pure: any thread. */
static void fill_rows(uint64_t seed, const struct gen_tensor *t, uint32_t e, uint64_t r0,
                      uint64_t nr, float *out)
{
	if (!t->interleaved && !t->halves) {
		moe_gen_floats(seed, t->layer, e, t->which, t->cols, r0 * t->cols, nr * t->cols,
		               out);
		return;
	}
	/* fused gate/up, row by row: interleaved (row 2i = gate row i, 2i+1 = up row i) or
	 * halves (gate rows, then up rows); biases alike */
	const bool is_bias = t->which == MOE_GEN_GATE_BIAS;
	const uint64_t half = t->rows / 2;
	for (uint64_t r = r0; r < r0 + nr; r++) {
		bool up = t->halves ? r >= half : r % 2 == 1;
		uint64_t src = t->halves ? r % half : r / 2;
		enum moe_gen_tensor w = up ? (is_bias ? MOE_GEN_UP_BIAS : MOE_GEN_UP)
		                           : (is_bias ? MOE_GEN_GATE_BIAS : MOE_GEN_GATE);
		moe_gen_floats(seed, t->layer, e, w, t->cols, src * t->cols, t->cols,
		               out + (r - r0) * t->cols);
	}
}

/* Runs one job on the calling thread with its scratch. Returns 0, or -1 (out of memory, or
 * the quantizer rejected the shape; planning makes both unexpected). */
static int run_job(uint64_t seed, const struct gen_job *j, struct gen_scratch *s)
{
	const struct gen_tensor *t = j->t;
	const size_t n = (size_t)(j->nr * t->cols);
	if (ensure(&s->floats, &s->floats_cap, n * sizeof(float)))
		return -1;
	fill_rows(seed, t, j->e, j->r0, j->nr, s->floats);
	if (t->kind != GK_MXFP4_BLOCKS)
		return moek_quantize(t->format, s->floats, j->nr, t->cols, j->dst, j->fp8_scales);
	if (ensure(&s->blocks, &s->blocks_cap, moek_row_bytes(MOEK_MXFP4, n)) ||
	    moek_quantize(MOEK_MXFP4, s->floats, j->nr, t->cols, s->blocks, NULL))
		return -1;
	moek_mxfp4_to_hf(s->blocks, n, j->dst, j->mx_scales);
	return 0;
}

/* Takes and runs jobs of the current batch until none is left. */
static void pool_take_jobs(struct gen_pool *p, struct gen_scratch *s)
{
	pthread_mutex_lock(&p->lock);
	while (p->next_job < p->n_jobs) {
		const struct gen_job *j = &p->jobs[p->next_job++];
		pthread_mutex_unlock(&p->lock);
		const int rc = run_job(p->seed, j, s);
		pthread_mutex_lock(&p->lock);
		if (rc && !p->failed)
			p->failed = j;
		if (++p->jobs_done == p->n_jobs)
			pthread_cond_signal(&p->finished);
	}
	pthread_mutex_unlock(&p->lock);
}

static void *pool_worker(void *arg)
{
	struct gen_worker *w = arg;
	struct gen_pool *p = w->pool;
	uint64_t seen = 0;
	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->quit && p->batch == seen)
			pthread_cond_wait(&p->start, &p->lock);
		if (p->quit)
			break;
		seen = p->batch;
		pthread_mutex_unlock(&p->lock);
		pool_take_jobs(p, &w->scratch);
		pthread_mutex_lock(&p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void *writer_thread(void *arg)
{
	struct gen_writer *w = arg;
	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (!w->busy && !w->quit)
			pthread_cond_wait(&w->wake, &w->lock);
		if (!w->busy)
			break;
		const int fd = w->fd;
		const unsigned char *buf = w->buf;
		const size_t len = w->len;
		pthread_mutex_unlock(&w->lock);
		int error = 0;
		for (size_t off = 0; off < len && !error;) {
			ssize_t n = write(fd, buf + off, len - off);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				error = n < 0 ? errno : EIO;
			else
				off += (size_t)n;
		}
		pthread_mutex_lock(&w->lock);
		w->error = error;
		w->busy = false;
		pthread_cond_signal(&w->idle);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* Starts n_threads - 1 pool workers and the writer thread. */
static int threads_start(struct gen *g, unsigned n_threads)
{
	struct gen_pool *p = &g->pool;
	struct gen_writer *w = &g->writer;
	p->seed = g->opt->seed;
	if (pthread_mutex_init(&p->lock, NULL) || pthread_cond_init(&p->start, NULL) ||
	    pthread_cond_init(&p->finished, NULL) || pthread_mutex_init(&w->lock, NULL) ||
	    pthread_cond_init(&w->wake, NULL) || pthread_cond_init(&w->idle, NULL))
		return error_set(g->err, MOE_ESYS, "pthread mutex/condition init failed");
	g->sync_ready = true;
	int rc = pthread_create(&w->thread, NULL, writer_thread, w);
	if (rc)
		return error_set(g->err, MOE_ESYS, "starting the writer thread: %s", strerror(rc));
	g->writer_started = true;
	for (unsigned i = 0; i + 1 < n_threads; i++) {
		p->workers[i].pool = p;
		rc = pthread_create(&p->workers[i].thread, NULL, pool_worker, &p->workers[i]);
		if (rc)
			return error_set(g->err, MOE_ESYS,
			                 "starting quantizing thread %u of %u: %s", i + 2,
			                 n_threads, strerror(rc));
		p->n_workers++;
	}
	return 0;
}

/* Stops and joins every thread started (the writer finishes its write first). */
static void threads_stop(struct gen *g)
{
	struct gen_pool *p = &g->pool;
	struct gen_writer *w = &g->writer;
	if (!g->sync_ready)
		return;
	pthread_mutex_lock(&p->lock);
	p->quit = true;
	pthread_cond_broadcast(&p->start);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->n_workers; i++) {
		pthread_join(p->workers[i].thread, NULL);
		free(p->workers[i].scratch.floats);
		free(p->workers[i].scratch.blocks);
	}
	if (g->writer_started) {
		pthread_mutex_lock(&w->lock);
		w->quit = true;
		pthread_cond_signal(&w->wake);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
	}
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->start);
	pthread_cond_destroy(&p->finished);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->wake);
	pthread_cond_destroy(&w->idle);
}

/* Runs the pending jobs (the current buffer's tensor rows) on the pool and waits for them. */
static int run_batch(struct gen *g)
{
	struct gen_pool *p = &g->pool;
	if (!g->n_pending)
		return 0;
	pthread_mutex_lock(&p->lock);
	p->jobs = g->pending;
	p->n_jobs = g->n_pending;
	p->next_job = p->jobs_done = 0;
	p->failed = NULL;
	p->batch++;
	pthread_cond_broadcast(&p->start);
	pthread_mutex_unlock(&p->lock);
	pool_take_jobs(p, &g->scratch);
	pthread_mutex_lock(&p->lock);
	while (p->jobs_done < p->n_jobs)
		pthread_cond_wait(&p->finished, &p->lock);
	const struct gen_job *failed = p->failed;
	pthread_mutex_unlock(&p->lock);
	g->n_pending = 0;
	if (failed)
		return error_set(g->err, MOE_ENOMEM,
		                 "%s: expert %u rows %" PRIu64 "..%" PRIu64
		                 ": out of memory or moek_quantize(%s, %" PRIu64 " cols) failed",
		                 failed->t->name, failed->e, failed->r0,
		                 failed->r0 + failed->nr - 1, moe_format_name(failed->t->format),
		                 failed->t->cols);
	return 0;
}

/* Waits until the writer is idle. Returns its last write's errno (0: none) and byte count. */
static int writer_drain(struct gen *g, size_t *len)
{
	struct gen_writer *w = &g->writer;
	pthread_mutex_lock(&w->lock);
	while (w->busy)
		pthread_cond_wait(&w->idle, &w->lock);
	const int error = w->error;
	*len = w->len;
	w->error = 0;
	w->len = 0;
	pthread_mutex_unlock(&w->lock);
	return error;
}

/* Waits until the writer is idle; reports its last write's error, or counts its bytes. */
static int writer_wait(struct gen *g)
{
	size_t len;
	const int error = writer_drain(g, &len);
	if (error)
		return error_set(g->err, MOE_ESYS, "%s: write: %s", g->path, strerror(error));
	g->done += len;
	if (len && g->opt->progress && g->done <= g->total)
		progress_update(&g->prog, g->done);
	return 0;
}

/* Completes the current buffer (runs its jobs) and hands it to the writer once the previous
 * write is done; filling continues in the other buffer. */
static int flush_buf(struct gen *g)
{
	if (run_batch(g) || writer_wait(g))
		return -1;
	if (!g->buf_len)
		return 0;
	struct gen_writer *w = &g->writer;
	pthread_mutex_lock(&w->lock);
	w->fd = g->fd;
	w->buf = g->buf;
	w->len = g->buf_len;
	w->busy = true;
	pthread_cond_signal(&w->wake);
	pthread_mutex_unlock(&w->lock);
	g->buf_index ^= 1;
	g->buf = g->bufs[g->buf_index];
	g->buf_len = 0;
	return 0;
}

/* n bytes of the write buffer to fill (n <= WRITE_BUF). */
static void *reserve(struct gen *g, size_t n)
{
	if (g->buf_len + n > WRITE_BUF && flush_buf(g))
		return NULL;
	void *p = g->buf + g->buf_len;
	g->buf_len += n;
	return p;
}

static int put_bytes(struct gen *g, const void *src, size_t n)
{
	const unsigned char *s = src;
	while (n) {
		size_t k = n < WRITE_BUF ? n : WRITE_BUF;
		void *d = reserve(g, k);
		if (!d)
			return -1;
		if (s)
			memcpy(d, s, k);
		else
			memset(d, 0, k);
		if (s)
			s += k;
		n -= k;
	}
	return 0;
}

static int add_job(struct gen *g, const struct gen_job *j)
{
	if (g->n_pending == MAX_PENDING_JOBS && run_batch(g))
		return -1;
	g->pending[g->n_pending++] = *j;
	return 0;
}

static uint64_t chunk_rows(const struct gen_tensor *t)
{
	if (t->format == MOEK_FP8_E4M3_B128)
		return 128; /* one row of scale blocks */
	uint64_t r = (1u << 18) / (t->cols ? t->cols : 1);
	return r ? r : 1;
}

/* Grows a buffer that pending jobs may point into: runs them first. */
static int ensure_shared(struct gen *g, void **p, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	if (run_batch(g))
		return -1;
	if (ensure(p, cap, need))
		return error_set(g->err, MOE_ENOMEM, "out of memory (%zu bytes)", need);
	return 0;
}

static int emit_matrix(struct gen *g, const struct gen_tensor *t, uint32_t e)
{
	const uint64_t rb = moek_row_bytes(t->format, (size_t)t->cols);
	const uint64_t step = chunk_rows(t);
	if (t->format == MOEK_FP8_E4M3_B128 &&
	    ensure_shared(g, (void **)&g->fp8_scales, &g->fp8_scales_cap,
	                  moek_fp8_scale_bytes(t->rows, t->cols)))
		return -1;
	for (uint64_t r0 = 0; r0 < t->rows; r0 += step) {
		struct gen_job j = {.t = t, .e = e, .r0 = r0};
		j.nr = t->rows - r0 < step ? t->rows - r0 : step;
		if (!(j.dst = reserve(g, j.nr * rb)))
			return -1;
		if (t->format == MOEK_FP8_E4M3_B128)
			j.fp8_scales = g->fp8_scales + (r0 / 128) * ((t->cols + 127) / 128);
		if (add_job(g, &j))
			return -1;
	}
	return 0;
}

static int emit_mxfp4_blocks(struct gen *g, const struct gen_tensor *t, uint32_t e)
{
	const uint64_t nb = t->cols / 32, step = chunk_rows(t);
	if (ensure_shared(g, (void **)&g->mx_scales, &g->mx_scales_cap,
	                  (size_t)g->m.n_experts * t->rows * nb))
		return -1;
	for (uint64_t r0 = 0; r0 < t->rows; r0 += step) {
		struct gen_job j = {.t = t, .e = e, .r0 = r0};
		j.nr = t->rows - r0 < step ? t->rows - r0 : step;
		if (!(j.dst = reserve(g, j.nr * nb * 16)))
			return -1;
		j.mx_scales = g->mx_scales + ((uint64_t)e * t->rows + r0) * nb;
		if (add_job(g, &j))
			return -1;
	}
	return 0;
}

/* One tensor of an INT4 projection, on the calling thread: its first tensor quantizes the
 * whole matrix into every tensor of the projection (g->int4), the others copy their part. */
/* ModelOpt NVFP4 (emit_int4's parts NV_*): the first tensor quantizes the matrix, as ModelOpt
 * does, against a per-tensor scale s2 = amax / (6 · 448) (the block scales then span E4M3's
 * range), into ggml NVFP4 blocks of x / s2 turned into ModelOpt's tensors (g->int4: weight,
 * weight_scale, s2, input_scale 1). */
static int emit_nvfp4(struct gen *g, const struct gen_tensor *t)
{
	const size_t rows = t->rows, cols = t->cols, wb = rows * cols / 2, sb = rows * cols / 16;
	if (t->part == NV_WEIGHT) {
		const size_t blocks = rows * moek_row_bytes(MOEK_NVFP4, cols);
		if (ensure_shared(g, (void **)&g->int4, &g->int4_cap, wb + sb + 8 + blocks))
			return -1;
		if (ensure(&g->scratch.floats, &g->scratch.floats_cap, rows * cols * sizeof(float)))
			return error_set(g->err, MOE_ENOMEM, "out of memory");
		float *x = g->scratch.floats;
		moe_gen_floats(g->opt->seed, t->layer, (uint32_t)t->expert, t->which, cols, 0,
		               rows * cols, x);
		float amax = 0.0f;
		for (size_t i = 0; i < rows * cols; i++)
			amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
		const float s2 = amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f, one = 1.0f;
		for (size_t i = 0; i < rows * cols; i++)
			x[i] /= s2;
		uint8_t *b = g->int4 + wb + sb + 8;
		if (moek_quantize(MOEK_NVFP4, x, rows, cols, b, NULL))
			return error_set(g->err, MOE_EINVAL, "%s: NVFP4 needs columns in 64s",
			                 t->name);
		moek_nvfp4_to_modelopt(b, rows, cols, g->int4, g->int4 + wb);
		memcpy(g->int4 + wb + sb, &s2, 4); /* little-endian hosts only (x86-64) */
		memcpy(g->int4 + wb + sb + 4, &one, 4);
	}
	switch (t->part) {
	case NV_WEIGHT: return put_bytes(g, g->int4, wb);
	case NV_SCALE: return put_bytes(g, g->int4 + wb, sb);
	case NV_SCALE2: return put_bytes(g, g->int4 + wb + sb, 4);
	default: return put_bytes(g, g->int4 + wb + sb + 4, 4);
	}
}

static int emit_int4(struct gen *g, const struct gen_tensor *t)
{
	if (t->part >= NV_WEIGHT)
		return emit_nvfp4(g, t);
	const size_t rows = t->rows, cols = t->cols, G = int4_group_of(g, cols);
	const size_t pb = moek_int4_packed_bytes(rows, cols);
	const size_t sb = moek_int4_scale_bytes(rows, cols, G);
	const size_t zb = moek_int4_zero_bytes(rows, cols, G);
	const uint32_t e = (uint32_t)t->expert;
	if (t->part == I4_PACKED || t->part == I4_QWEIGHT) {
		if (ensure_shared(g, (void **)&g->int4, &g->int4_cap, pb + sb + zb + 4 * cols))
			return -1;
		if (ensure(&g->scratch.floats, &g->scratch.floats_cap, rows * cols * sizeof(float)))
			return error_set(g->err, MOE_ENOMEM, "out of memory");
		float *x = g->scratch.floats;
		moe_gen_floats(g->opt->seed, t->layer, e, t->which, cols, 0, rows * cols, x);
		if (t->part == I4_PACKED)
			gen_int4_ct(x, rows, cols, G, g->int4, g->int4 + pb);
		else if (g->opt->int4 == MOE_GEN_INT4_AWQ)
			gen_int4_awq(x, rows, cols, G, g->int4, g->int4 + pb + sb, g->int4 + pb);
		else
			gen_int4_gptq(x, rows, cols, G, g->int4, g->int4 + pb + sb, g->int4 + pb,
			              g->int4 + pb + sb + zb);
	}
	switch (t->part) {
	case I4_PACKED:
	case I4_QWEIGHT: return put_bytes(g, g->int4, pb);
	case I4_SCALE:
	case I4_SCALES: return put_bytes(g, g->int4 + pb, sb);
	case I4_QZEROS: return put_bytes(g, g->int4 + pb + sb, zb);
	case I4_GIDX: return put_bytes(g, g->int4 + pb + sb + zb, 4 * cols);
	default: {
		const uint8_t shape[8] = {(uint8_t)rows,         (uint8_t)(rows >> 8),
		                          (uint8_t)(rows >> 16), (uint8_t)(rows >> 24),
		                          (uint8_t)cols,         (uint8_t)(cols >> 8),
		                          (uint8_t)(cols >> 16), (uint8_t)(cols >> 24)};
		return put_bytes(g, shape, sizeof(shape));
	}
	}
}

/* Small tensors (routers, biases, norms), on the calling thread. */
static int emit_vector(struct gen *g, const struct gen_tensor *t, uint32_t e)
{
	/* rows x cols floats (biases: cols = 1), converted to the stored float format */
	const uint64_t n = t->rows * t->cols;
	const uint64_t step = 1u << 16;
	for (uint64_t i0 = 0; i0 < n; i0 += step) {
		uint64_t k = n - i0 < step ? n - i0 : step;
		if (ensure(&g->scratch.floats, &g->scratch.floats_cap, k * sizeof(float)))
			return error_set(g->err, MOE_ENOMEM, "out of memory");
		float *floats = g->scratch.floats;
		if (t->interleaved || t->halves) {
			struct gen_tensor row = *t; /* a bias vector: one element per "row" */
			row.cols = 1;
			fill_rows(g->opt->seed, &row, e, i0, k, floats);
		} else {
			moe_gen_floats(g->opt->seed, t->layer, e, t->which, t->cols, i0, k, floats);
		}
		void *dst = reserve(g, k * (t->format == MOEK_F32 ? 4 : 2));
		if (!dst)
			return -1;
		if (moek_quantize(t->format, floats, 1, k, dst, NULL))
			return error_set(g->err, MOE_EINVAL, "%s: conversion failed", t->name);
	}
	return 0;
}

/* Expert e of a Llama-4 input-major tensor, on the calling thread: its rows x cols matrix
 * (gate_up: gate rows, then up rows) written column by column. */
static int emit_transposed(struct gen *g, const struct gen_tensor *t, uint32_t e)
{
	const size_t n = (size_t)(t->rows * t->cols);
	if (ensure(&g->scratch.floats, &g->scratch.floats_cap, n * sizeof(float)) ||
	    ensure(&g->scratch.blocks, &g->scratch.blocks_cap, n * sizeof(float)))
		return error_set(g->err, MOE_ENOMEM, "out of memory");
	float *rows = g->scratch.floats, *cols = g->scratch.blocks;
	fill_rows(g->opt->seed, t, e, 0, t->rows, rows);
	for (uint64_t c = 0; c < t->cols; c++)
		for (uint64_t r = 0; r < t->rows; r++)
			cols[c * t->rows + r] = rows[r * t->cols + c];
	void *dst = reserve(g, (size_t)fmt_bytes(t->format, 1, n));
	if (!dst)
		return -1;
	if (moek_quantize(t->format, cols, 1, n, dst, NULL))
		return error_set(g->err, MOE_EINVAL, "%s: conversion failed", t->name);
	return 0;
}

/* emit(g, t, e) for each expert e the tensor holds: its own, or all of a stacked tensor's. */
static int emit_experts(struct gen *g, const struct gen_tensor *t,
                        int (*emit)(struct gen *, const struct gen_tensor *, uint32_t))
{
	uint32_t e0 = t->expert < 0 ? 0 : (uint32_t)t->expert;
	uint32_t e1 = t->expert < 0 ? g->m.n_experts : e0 + 1;
	for (uint32_t e = e0; e < e1; e++)
		if (emit(g, t, e))
			return -1;
	return 0;
}

static int emit_tensor_data(struct gen *g, const struct gen_tensor *t)
{
	switch (t->kind) {
	case GK_ROUTER: return emit_vector(g, t, 0);
	case GK_WEIGHT: return emit_experts(g, t, emit_matrix);
	case GK_FP8_SCALE: return put_bytes(g, g->fp8_scales, t->nbytes);
	case GK_BIAS:
	case GK_VECTOR: return emit_experts(g, t, emit_vector);
	case GK_MXFP4_BLOCKS: return emit_experts(g, t, emit_mxfp4_blocks);
	case GK_MXFP4_SCALES: return put_bytes(g, g->mx_scales, t->nbytes);
	case GK_INT4: return emit_int4(g, t);
	case GK_TRANSPOSED: return emit_experts(g, t, emit_transposed);
	}
	return 0;
}

/* A tensor's bytes are all in the write buffer when this returns (its jobs have run), so
 * the next tensor may read what it produced (FP8 and MXFP4 scales). */
static int emit_tensor(struct gen *g, const struct gen_tensor *t)
{
	return emit_tensor_data(g, t) || run_batch(g) ? -1 : 0;
}

/* ---- headers -------------------------------------------------------------------------- */

/* The architecture's llama.cpp hyperparameter keys (first split only). */
static void gguf_arch_kvs(struct gen *g, struct membuf *m, uint32_t *n)
{
	const struct moe_model_preset *p = g->m.preset;
	const char *a = moe_arch_gguf_name(p->arch);
	char k[128];
	kv_str(m, n, "general.architecture", a);
	kv_str(m, n, "general.name", p->name);
	kv_u32(m, n, "general.alignment", g->m.alignment);
	if (g->opt->mix)
		kv_u32(m, n, "general.file_type", moe_gen_mix_file_type(g->opt->mix));
#define KEY(suffix) (snprintf(k, sizeof(k), "%s." suffix, a), k)
	kv_u32(m, n, KEY("block_count"), g->m.n_layers);
	kv_u32(m, n, KEY("embedding_length"), (uint32_t)g->m.hidden);
	kv_u32(m, n, KEY("feed_forward_length"),
	       (uint32_t)(p->arch == MOE_ARCH_MIXTRAL ? g->m.ffn : g->m.dense_ffn));
	kv_u32(m, n, KEY("expert_count"), g->m.n_experts);
	kv_u32(m, n, KEY("expert_used_count"), g->m.top_k);
	if (p->arch != MOE_ARCH_MIXTRAL)
		kv_u32(m, n, KEY("expert_feed_forward_length"), (uint32_t)g->m.ffn);
	if (p->arch == MOE_ARCH_DEEPSEEK) {
		kv_u32(m, n, KEY("leading_dense_block_count"), g->m.leading_dense);
		kv_u32(m, n, KEY("expert_shared_count"), p->n_shared);
		kv_f32(m, n, KEY("expert_weights_scale"), 2.5f);
		kv_bool(m, n, KEY("expert_weights_norm"), true);
		kv_u32(m, n, KEY("expert_gating_func"), 2); /* sigmoid */
	}
	if (p->arch == MOE_ARCH_QWEN3MOE)
		kv_bool(m, n, KEY("expert_weights_norm"), true);
	switch (p->arch) { /* what llama.cpp's converter writes for each */
	case MOE_ARCH_GLM4MOE:
		kv_u32(m, n, KEY("leading_dense_block_count"), g->m.leading_dense);
		kv_u32(m, n, KEY("expert_shared_count"), p->n_shared);
		kv_f32(m, n, KEY("expert_weights_scale"), 2.5f);
		kv_bool(m, n, KEY("expert_weights_norm"), true);
		kv_u32(m, n, KEY("expert_gating_func"), 2); /* sigmoid */
		kv_u32(m, n, KEY("nextn_predict_layers"), 0);
		break;
	case MOE_ARCH_MINIMAX_M2: kv_u32(m, n, KEY("expert_gating_func"), 2); break;
	case MOE_ARCH_LLAMA4: kv_u32(m, n, KEY("interleave_moe_layer_step"), g->m.moe_step); break;
	case MOE_ARCH_QWEN3NEXT:
		kv_u32(m, n, KEY("expert_shared_feed_forward_length"), (uint32_t)g->m.ffn);
		kv_bool(m, n, KEY("expert_weights_norm"), true);
		break;
	default: break;
	}
#undef KEY
	if (g->m.full)
		g->whole->gguf_kvs(&g->m, m, n);
}

static int write_all(struct gen *g, const void *p, size_t n)
{
	return put_bytes(g, p, n);
}

static int open_out(struct gen *g, const char *path)
{
	g->path = path;
	g->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (g->fd < 0)
		return error_set(g->err, MOE_ESYS, "%s: %s", path, strerror(errno));
	return 0;
}

static int close_out(struct gen *g)
{
	int rc = flush_buf(g);
	if (!rc)
		rc = writer_wait(g); /* the file's last write */
	else
		writer_drain(g,
		             &(size_t){0}); /* keep the first error; still never close under it */
	if (close(g->fd) && !rc)
		rc = error_set(g->err, MOE_ESYS, "%s: close: %s", g->path, strerror(errno));
	g->fd = -1;
	return rc;
}

static int write_gguf_file(struct gen *g, uint32_t f)
{
	struct membuf m = {0};
	struct membuf kvs = {0};
	uint32_t n_kv = 0, n_t = 0;
	if (f == 0)
		gguf_arch_kvs(g, &kvs, &n_kv);
	if (g->n_files > 1) {
		kv_u16(&kvs, &n_kv, "split.no", (uint16_t)f);
		kv_u16(&kvs, &n_kv, "split.count", (uint16_t)g->n_files);
		kv_i32(&kvs, &n_kv, "split.tensors.count", (int32_t)g->n_t);
	}
	for (size_t i = 0; i < g->n_t; i++)
		n_t += g->t[i].file == f;
	mb_put(&m, "GGUF", 4);
	mb_u32(&m, 3);
	mb_u64(&m, n_t);
	mb_u64(&m, n_kv);
	if (kvs.p)
		mb_put(&m, kvs.p, kvs.len);
	free(kvs.p);
	for (size_t i = 0; i < g->n_t; i++) {
		const struct gen_tensor *t = &g->t[i];
		if (t->file != f)
			continue;
		mb_str(&m, t->name);
		mb_u32(&m, t->n_dims);
		for (uint32_t d = 0; d < t->n_dims; d++)
			mb_u64(&m, t->shape[d]);
		mb_u32(&m, t->format);
		mb_u64(&m, t->offset);
	}
	while (m.len % g->m.alignment && !m.oom)
		mb_put(&m, "", 1); /* zero padding up to the data section */
	if (m.oom) {
		free(m.p);
		return error_set(g->err, MOE_ENOMEM, "out of memory");
	}
	int rc = open_out(g, g->paths[f]);
	if (!rc)
		rc = write_all(g, m.p, m.len);
	free(m.p);
	uint64_t at = 0;
	for (size_t i = 0; i < g->n_t && !rc; i++) {
		const struct gen_tensor *t = &g->t[i];
		if (t->file != f)
			continue;
		if (t->offset > at)
			rc = put_bytes(g, NULL, t->offset - at);
		if (!rc)
			rc = emit_tensor(g, t);
		at = t->offset + t->nbytes;
	}
	if (g->fd >= 0 && close_out(g) && !rc)
		rc = -1;
	return rc;
}

static int write_st_file(struct gen *g, uint32_t f)
{
	struct membuf m = {0};
	mb_printf(&m, "{\"__metadata__\":{\"format\":\"pt\"}");
	for (size_t i = 0; i < g->n_t; i++) {
		const struct gen_tensor *t = &g->t[i];
		if (t->file != f)
			continue;
		mb_printf(&m, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name,
		          st_dtype_name((enum st_dtype)t->st_dtype));
		for (uint32_t d = 0; d < t->n_dims; d++)
			mb_printf(&m, "%s%" PRIu64, d ? "," : "", t->shape[d]);
		mb_printf(&m, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", t->offset,
		          t->offset + t->nbytes);
	}
	mb_printf(&m, "}");
	while (m.len % 8)
		mb_put(&m, " ", 1); /* pad as the reference writer does */
	if (m.oom) {
		free(m.p);
		return error_set(g->err, MOE_ENOMEM, "out of memory");
	}
	unsigned char lenb[8];
	for (int i = 0; i < 8; i++)
		lenb[i] = (unsigned char)((uint64_t)m.len >> (8 * i));
	int rc = open_out(g, g->paths[f]);
	if (!rc)
		rc = write_all(g, lenb, 8);
	if (!rc)
		rc = write_all(g, m.p, m.len);
	free(m.p);
	for (size_t i = 0; i < g->n_t && !rc; i++)
		if (g->t[i].file == f)
			rc = emit_tensor(g, &g->t[i]);
	if (g->fd >= 0 && close_out(g) && !rc)
		rc = -1;
	return rc;
}

static int write_text(struct gen *g, const char *path, const struct membuf *m)
{
	if (m->oom)
		return error_set(g->err, MOE_ENOMEM, "out of memory");
	if (open_out(g, path))
		return -1;
	int rc = write_all(g, m->p, m->len);
	if (close_out(g) && !rc)
		rc = -1;
	return rc;
}

/* config.json of an experts-only checkpoint: the keys the catalog reads. */
static void config_experts_only(const struct gen *g, struct membuf *mb)
{
	const struct moe_model_preset *p = g->m.preset;
	const uint32_t top_k = g->m.top_k;
	if (p->arch == MOE_ARCH_LLAMA4) { /* Llama4ForConditionalGeneration: text_config */
		mb_printf(mb,
		          "{\n  \"architectures\": [\"Llama4ForConditionalGeneration\"],\n"
		          "  \"model_type\": \"llama4\",\n  \"text_config\": {\n"
		          "    \"model_type\": \"llama4_text\",\n    \"hidden_size\": %" PRIu64
		          ",\n    \"num_hidden_layers\": %u,\n    \"num_local_experts\": %u,\n"
		          "    \"num_experts_per_tok\": %u,\n    \"intermediate_size\": %" PRIu64
		          ",\n    \"intermediate_size_mlp\": %" PRIu64
		          ",\n    \"interleave_moe_layer_step\": %u\n  },\n",
		          g->m.hidden, g->m.n_layers, g->m.n_experts, top_k, g->m.ffn, p->dense_ffn,
		          g->m.moe_step);
		mb_printf(mb,
		          "  \"torch_dtype\": \"bfloat16\",\n  \"moe_sidecar_generator\": "
		          "{\"seed\": %" PRIu64 ", \"preset\": \"%s\"}\n}\n",
		          g->opt->seed, p->name);
		return;
	}
	mb_printf(mb,
	          "{\n  \"model_type\": \"%s\",\n  \"hidden_size\": %" PRIu64
	          ",\n  \"num_hidden_layers\": %u,\n  \"num_experts_per_tok\": %u,\n",
	          moe_arch_model_type(p->arch), g->m.hidden, g->m.n_layers, top_k);
	switch (p->arch) {
	case MOE_ARCH_MIXTRAL:
		mb_printf(mb,
		          "  \"architectures\": [\"MixtralForCausalLM\"],\n"
		          "  \"num_local_experts\": %u,\n  \"intermediate_size\": %" PRIu64 ",\n",
		          g->m.n_experts, g->m.ffn);
		break;
	case MOE_ARCH_DEEPSEEK:
		mb_printf(mb,
		          "  \"architectures\": [\"DeepseekV3ForCausalLM\"],\n"
		          "  \"n_routed_experts\": %u,\n  \"moe_intermediate_size\": %" PRIu64
		          ",\n  \"intermediate_size\": %" PRIu64 ",\n"
		          "  \"n_shared_experts\": %u,\n  \"first_k_dense_replace\": %u,\n"
		          "  \"moe_layer_freq\": 1,\n  \"norm_topk_prob\": true,\n"
		          "  \"routed_scaling_factor\": 2.5,\n  \"scoring_func\": \"sigmoid\",\n"
		          "  \"topk_method\": \"noaux_tc\",\n",
		          g->m.n_experts, g->m.ffn, p->dense_ffn, p->n_shared, g->m.leading_dense);
		if (g->m.format == MOEK_FP8_E4M3_B128)
			mb_fp8_quantization_config(mb);
		break;
	case MOE_ARCH_GPT_OSS:
		mb_printf(mb,
		          "  \"architectures\": [\"GptOssForCausalLM\"],\n"
		          "  \"num_local_experts\": %u,\n  \"experts_per_token\": %u,\n"
		          "  \"intermediate_size\": %" PRIu64 ",\n  \"swiglu_limit\": 7.0,\n"
		          "  \"quantization_config\": {\"quant_method\": \"mxfp4\"},\n",
		          g->m.n_experts, top_k, g->m.ffn);
		break;
	case MOE_ARCH_OLMOE:
		mb_printf(mb,
		          "  \"architectures\": [\"OlmoeForCausalLM\"],\n"
		          "  \"num_experts\": %u,\n  \"intermediate_size\": %" PRIu64
		          ",\n  \"norm_topk_prob\": false,\n",
		          g->m.n_experts, g->m.ffn);
		break;
	case MOE_ARCH_GLM4MOE:
		mb_printf(mb,
		          "  \"architectures\": [\"Glm4MoeForCausalLM\"],\n"
		          "  \"n_routed_experts\": %u,\n  \"moe_intermediate_size\": %" PRIu64
		          ",\n  \"intermediate_size\": %" PRIu64 ",\n"
		          "  \"n_shared_experts\": %u,\n  \"first_k_dense_replace\": %u,\n"
		          "  \"n_group\": 1,\n  \"topk_group\": 1,\n  \"norm_topk_prob\": true,\n"
		          "  \"routed_scaling_factor\": 2.5,\n  \"num_nextn_predict_layers\": 0,\n",
		          g->m.n_experts, g->m.ffn, p->dense_ffn, p->n_shared, g->m.leading_dense);
		break;
	case MOE_ARCH_MINIMAX_M2:
		mb_printf(mb,
		          "  \"architectures\": [\"MiniMaxM2ForCausalLM\"],\n"
		          "  \"num_local_experts\": %u,\n  \"intermediate_size\": %" PRIu64 ",\n"
		          "  \"shared_intermediate_size\": 0,\n  \"scoring_func\": \"sigmoid\",\n"
		          "  \"use_routing_bias\": true,\n",
		          g->m.n_experts, g->m.ffn);
		break;
	case MOE_ARCH_QWEN3NEXT:
		mb_printf(mb,
		          "  \"architectures\": [\"Qwen3NextForCausalLM\"],\n"
		          "  \"num_experts\": %u,\n  \"moe_intermediate_size\": %" PRIu64
		          ",\n  \"shared_expert_intermediate_size\": %" PRIu64
		          ",\n  \"intermediate_size\": %" PRIu64 ",\n  \"norm_topk_prob\": true,\n"
		          "  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [],\n",
		          g->m.n_experts, g->m.ffn, g->m.ffn, p->dense_ffn);
		break;
	default: /* Qwen3-MoE (and Qwen2-MoE) */
		mb_printf(mb,
		          "  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n"
		          "  \"num_experts\": %u,\n  \"moe_intermediate_size\": %" PRIu64
		          ",\n  \"intermediate_size\": %" PRIu64 ",\n  \"norm_topk_prob\": true,\n"
		          "  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [],\n",
		          g->m.n_experts, g->m.ffn, p->dense_ffn);
		break;
	}
	/* one group per row: compressed-tensors says strategy "channel" (group_size null),
	 * GPTQ says group_size -1 */
	const bool per_row = g->int4_group == MOE_GEN_GROUP_ROW;
	char gs[16];
	snprintf(gs, sizeof(gs), "%d", per_row ? -1 : (int)g->int4_group);
	if (g->opt->int4 == MOE_GEN_INT4_CT)
		mb_printf(
		    mb,
		    "  \"quantization_config\": {\"quant_method\": \"compressed-tensors\", "
		    "\"format\": \"pack-quantized\", \"quantization_status\": \"compressed\", "
		    "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], "
		    "\"weights\": {\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, "
		    "\"strategy\": \"%s\", \"group_size\": %s, \"dynamic\": false, "
		    "\"actorder\": null, \"observer\": \"minmax\"}, "
		    "\"input_activations\": null, \"output_activations\": null}}, "
		    "\"ignore\": [\"lm_head\", \"re:.*mlp.gate$\"]},\n",
		    per_row ? "channel" : "group", per_row ? "null" : gs);
	else if (g->opt->int4 == MOE_GEN_INT4_GPTQ)
		mb_printf(mb,
		          "  \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, "
		          "\"group_size\": %s, \"desc_act\": false, \"sym\": true, "
		          "\"checkpoint_format\": \"gptq\", \"damp_percent\": 0.01, "
		          "\"true_sequential\": true},\n",
		          gs);
	else if (!g->m.gguf && g->m.format == MOEK_NVFP4 && !g->opt->mix)
		mb_printf(mb,
		          "  \"quantization_config\": {\"quant_method\": \"modelopt\", "
		          "\"quant_algo\": \"NVFP4\", \"group_size\": 16, "
		          "\"kv_cache_quant_algo\": null, \"exclude_modules\": [\"lm_head\"]},\n");
	else if (g->opt->int4 == MOE_GEN_INT4_AWQ)
		mb_printf(mb,
		          "  \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, "
		          "\"group_size\": %s, \"zero_point\": true, \"version\": \"gemm\", "
		          "\"modules_to_not_convert\": null},\n",
		          gs);
	mb_printf(mb,
	          "  \"torch_dtype\": \"bfloat16\",\n  \"moe_sidecar_generator\": {\"seed\": "
	          "%" PRIu64 ", \"preset\": \"%s\"}\n}\n",
	          g->opt->seed, p->name);
}

/* config.json (and, for a whole model, generation_config.json). */
static int write_config(struct gen *g)
{
	struct membuf m = {0};
	if (g->m.full)
		g->whole->config(&g->m, &m);
	else
		config_experts_only(g, &m);
	char path[4096];
	snprintf(path, sizeof(path), "%s/config.json", g->opt->out);
	int rc = write_text(g, path, &m);
	free(m.p);
	if (rc || !g->m.full)
		return rc;
	m = (struct membuf){0};
	g->whole->generation_config(&g->m, &m);
	snprintf(path, sizeof(path), "%s/generation_config.json", g->opt->out);
	rc = write_text(g, path, &m);
	free(m.p);
	return rc;
}

static int write_index(struct gen *g)
{
	struct membuf m = {0};
	uint64_t total = 0;
	for (size_t i = 0; i < g->n_t; i++)
		total += g->t[i].nbytes;
	mb_printf(&m, "{\n  \"metadata\": {\"total_size\": %" PRIu64 "},\n  \"weight_map\": {",
	          total);
	for (size_t i = 0; i < g->n_t; i++) {
		const char *base = strrchr(g->paths[g->t[i].file], '/');
		mb_printf(&m, "%s\n    \"%s\": \"%s\"", i ? "," : "", g->t[i].name,
		          base ? base + 1 : g->paths[g->t[i].file]);
	}
	mb_printf(&m, "\n  }\n}\n");
	char path[4096];
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", g->opt->out);
	int rc = write_text(g, path, &m);
	free(m.p);
	return rc;
}

/* ---- options, layout, driver ------------------------------------------------------------ */

static int check_options(struct gen *g)
{
	const struct moe_gen_options *o = g->opt;
	const struct moe_model_preset *p = g->m.preset;
	g->m.gguf = strlen(o->out) > 5 && !strcmp(o->out + strlen(o->out) - 5, ".gguf");
	g->m.format = o->format;
	g->m.hidden = o->hidden ? o->hidden : p->hidden;
	g->m.ffn = o->ffn ? o->ffn : p->expert_ffn;
	g->m.n_experts = o->experts ? o->experts : p->n_experts;
	g->m.n_layers = o->layers ? o->layers : o->full ? p->full_layers : MOE_GEN_DEFAULT_LAYERS;
	if (g->m.n_layers == 0 || g->m.n_layers > 4096 || g->m.n_experts == 0 ||
	    g->m.n_experts > 65536 || g->m.hidden == 0 || g->m.ffn == 0 ||
	    g->m.hidden > (1u << 20) || g->m.ffn > (1u << 20))
		return error_set(g->err, MOE_EINVAL,
		                 "layers, experts, hidden and ffn must be positive and "
		                 "reasonable");
	g->m.leading_dense =
	    p->leading_dense < g->m.n_layers ? p->leading_dense : g->m.n_layers - 1;
	g->m.top_k = p->top_k < g->m.n_experts ? p->top_k : g->m.n_experts;
	g->m.moe_step = p->moe_step ? p->moe_step : 1;
	if (g->m.n_layers < g->m.leading_dense + g->m.moe_step)
		return error_set(g->err, MOE_EINVAL,
		                 "%s: MoE every %u blocks after %u dense ones: --layers %u has no "
		                 "MoE block",
		                 p->name, g->m.moe_step, g->m.leading_dense, g->m.n_layers);
	if (o->full_model && p->arch >= MOE_ARCH_GLM4MOE)
		return error_set(g->err, MOE_EINVAL,
		                 "%s: --full-model is not available for %s yet (experts-only "
		                 "models are)",
		                 p->name, moe_arch_name(p->arch));
	g->m.dense_ffn = p->dense_ffn;
	if (o->mix) {
		if (!moe_gen_mix_name(o->mix))
			return error_set(g->err, MOE_EINVAL, "mix %d is not a known mix",
			                 (int)o->mix);
		if (!g->m.gguf)
			return error_set(g->err, MOE_EINVAL,
			                 "the %s mix is a GGUF mix: write a .gguf file",
			                 moe_gen_mix_name(o->mix));
		if (p->arch == MOE_ARCH_GPT_OSS)
			return error_set(g->err, MOE_EINVAL,
			                 "gpt-oss experts are MXFP4 only, not a %s mix",
			                 moe_gen_mix_name(o->mix));
		/* every format the mix uses; the base (gate of block 0) stands for the rest in
		 * the block-size check below: all of them are 256-element K-quants */
		for (uint32_t L = 0; L < g->m.n_layers; L++)
			for (int which = MOE_GEN_GATE; which <= MOE_GEN_DOWN; which++) {
				uint32_t f = moe_gen_mix_format(o->mix, which, L, g->m.n_layers);
				const struct moek_format_info *mf = moek_format_lookup(f);
				if (!mf || !mf->weight_format)
					return error_set(g->err, MOE_EINVAL,
					                 "the %s mix needs format %u, which these "
					                 "kernels do not have",
					                 moe_gen_mix_name(o->mix), f);
			}
		g->m.format = moe_gen_mix_format(o->mix, MOE_GEN_GATE, 0, g->m.n_layers);
	}
	const struct moek_format_info *fi = moek_format_lookup(g->m.format);
	if (!fi || !fi->weight_format)
		return error_set(g->err, MOE_EINVAL, "format %u is not an expert weight format",
		                 g->m.format);
	if (g->m.gguf && g->m.format == MOEK_FP8_E4M3_B128)
		return error_set(g->err, MOE_EINVAL,
		                 "FP8 E4M3 has no GGUF type; write safetensors (an output "
		                 "directory) instead");
	if ((g->m.format == MOEK_INT4_G32) != (o->int4 != MOE_GEN_INT4_NONE))
		return error_set(g->err, MOE_EINVAL,
		                 "INT4_G32 is the sidecar's load-time layout: write an "
		                 "INT4 checkpoint with --format int4-ct, gptq or awq");
	if (o->int4) {
		const char *name = o->int4 == MOE_GEN_INT4_CT     ? "int4-ct"
		                   : o->int4 == MOE_GEN_INT4_GPTQ ? "gptq"
		                                                  : "awq";
		g->int4_group = o->group ? o->group : o->int4 == MOE_GEN_INT4_CT ? 32 : 128;
		if (o->int4 == MOE_GEN_INT4_AWQ && g->int4_group == MOE_GEN_GROUP_ROW)
			return error_set(g->err, MOE_EINVAL,
			                 "AWQ checkpoints have no one-group-per-row form: give "
			                 "--group N");
		if (g->m.gguf || o->full_model || o->per_expert || o->fused_gate_up ||
		    p->arch == MOE_ARCH_GPT_OSS)
			return error_set(g->err, MOE_EINVAL,
			                 "INT4 checkpoints (%s) are written as experts-only "
			                 "safetensors with per-expert tensors, not for gpt-oss",
			                 name);
		if (g->int4_group == MOE_GEN_GROUP_ROW && (g->m.hidden % 32 || g->m.ffn % 32))
			return error_set(g->err, MOE_EINVAL,
			                 "INT4 groups of one row need hidden %" PRIu64
			                 " and ffn %" PRIu64 " to be multiples of 32",
			                 g->m.hidden, g->m.ffn);
		if (g->int4_group != MOE_GEN_GROUP_ROW &&
		    (g->int4_group % 32 || g->m.hidden % g->int4_group || g->m.ffn % g->int4_group))
			return error_set(
			    g->err, MOE_EINVAL,
			    "INT4 group size %u must be a multiple of 32 dividing hidden "
			    "%" PRIu64 " and ffn %" PRIu64,
			    g->int4_group, g->m.hidden, g->m.ffn);
	}
	if (!g->m.gguf) {
		bool ok = g->m.format == MOEK_F32 || g->m.format == MOEK_F16 ||
		          g->m.format == MOEK_BF16 || g->m.format == MOEK_FP8_E4M3_B128 ||
		          g->m.format == MOEK_INT4_G32 || g->m.format == MOEK_NVFP4;
		if (p->arch == MOE_ARCH_GPT_OSS)
			ok = g->m.format == MOEK_MXFP4;
		if (p->arch == MOE_ARCH_LLAMA4 &&
		    (o->per_expert || (g->m.format != MOEK_F32 && g->m.format != MOEK_F16 &&
		                       g->m.format != MOEK_BF16)))
			return error_set(g->err, MOE_EINVAL,
			                 "%s: Llama-4 checkpoints hold fused F32/F16/BF16 experts "
			                 "(feed_forward.experts.gate_up_proj), not per-expert %s",
			                 p->name, fi->name);
		if (!ok)
			return error_set(
			    g->err, MOE_EINVAL,
			    "%s safetensors checkpoints cannot hold %s experts "
			    "(safetensors: F32 F16 BF16 FP8_E4M3_B128 NVFP4 (ModelOpt); gpt-oss: "
			    "MXFP4 only)",
			    p->name, fi->name);
		if (g->m.format == MOEK_NVFP4 && (g->m.hidden % 64 || g->m.ffn % 64))
			return error_set(g->err, MOE_EINVAL,
			                 "NVFP4 needs hidden %" PRIu64 " and ffn %" PRIu64
			                 " to be multiples of 64 (ggml's block)",
			                 g->m.hidden, g->m.ffn);
		if (o->per_expert && p->arch == MOE_ARCH_GPT_OSS)
			return error_set(g->err, MOE_EINVAL,
			                 "gpt-oss checkpoints have no per-expert tensors");
	}
	if (o->fused_gate_up && (!g->m.gguf || o->per_expert))
		return error_set(g->err, MOE_EINVAL,
		                 "a fused gate_up tensor exists only as GGUF "
		                 "blk.N.ffn_gate_up_exps.weight (merged experts)");
	if (!moek_row_bytes(g->m.format, g->m.hidden) || !moek_row_bytes(g->m.format, g->m.ffn))
		return error_set(g->err, MOE_EINVAL,
		                 "hidden %" PRIu64 " and ffn %" PRIu64
		                 " must be multiples of the %s block (%u)",
		                 g->m.hidden, g->m.ffn, fi->name, fi->block_elems);
	g->m.alignment = o->alignment ? o->alignment : GGUF_DEFAULT_ALIGNMENT;
	if (g->m.alignment & (g->m.alignment - 1) || g->m.alignment > (1u << 20))
		return error_set(g->err, MOE_EINVAL,
		                 "alignment %u is not a power of two up to 1 MiB", g->m.alignment);
	if (o->threads > MOE_GEN_MAX_THREADS)
		return error_set(g->err, MOE_EINVAL, "threads %u: at most %d", o->threads,
		                 MOE_GEN_MAX_THREADS);
	if (o->shards > 999)
		return error_set(g->err, MOE_EINVAL, "at most 999 shards");
	g->m.opt = o;
	g->m.full = o->full_model;
	if (g->m.full)
		return g->whole->resolve(&g->m, g->err);
	if (o->vocab || o->heads || o->kv_heads || o->head_dim)
		return error_set(g->err, MOE_EINVAL,
		                 "--vocab, --heads, --kv-heads and --head-dim describe the "
		                 "non-expert tensors: they need --full-model");
	return 0;
}

/* Assigns tensors to files in order (about equal bytes each) and computes offsets. */
static void layout(struct gen *g)
{
	uint64_t total = 0;
	for (size_t i = 0; i < g->n_t; i++)
		total += g->t[i].nbytes;
	g->total = total;
	uint64_t acc = 0, at = 0;
	uint32_t f = 0;
	for (size_t i = 0; i < g->n_t; i++) {
		struct gen_tensor *t = &g->t[i];
		/* move to the next file once this one holds its share */
		while (f + 1 < g->n_files && acc >= total / g->n_files * (f + 1)) {
			f++;
			at = 0;
		}
		t->file = f;
		if (g->m.gguf)
			at = (at + g->m.alignment - 1) / g->m.alignment * g->m.alignment;
		t->offset = at;
		at += t->nbytes;
		acc += t->nbytes;
	}
}

static int make_paths(struct gen *g)
{
	const char *out = g->opt->out;
	g->paths = calloc(g->n_files, sizeof(*g->paths));
	if (!g->paths)
		return error_set(g->err, MOE_ENOMEM, "out of memory");
	for (uint32_t f = 0; f < g->n_files; f++) {
		size_t n = strlen(out) + 64;
		if (!(g->paths[f] = malloc(n)))
			return error_set(g->err, MOE_ENOMEM, "out of memory");
		if (g->m.gguf && g->n_files == 1)
			snprintf(g->paths[f], n, "%s", out);
		else if (g->m.gguf)
			snprintf(g->paths[f], n, "%.*s-%05u-of-%05u.gguf", (int)(strlen(out) - 5),
			         out, f + 1, g->n_files);
		else if (g->n_files == 1)
			snprintf(g->paths[f], n, "%s/model.safetensors", out);
		else
			snprintf(g->paths[f], n, "%s/model-%05u-of-%05u.safetensors", out, f + 1,
			         g->n_files);
	}
	/* The folder that receives the output must exist: a typo in --out must not become a
	 * tree of directories. Only a safetensors checkpoint's own directory is created. */
	char parent[4096];
	size_t len = strlen(out);
	while (len > 1 && out[len - 1] == '/')
		len--; /* "ckpt/" names the directory ckpt */
	const char *slash = memrchr(out, '/', len);
	size_t plen = slash ? (slash == out ? 1 : (size_t)(slash - out)) : 1;
	if (plen >= sizeof(parent))
		return error_set(g->err, MOE_EINVAL, "%s: path too long", out);
	if (slash)
		memcpy(parent, out, plen);
	else
		parent[0] = '.';
	parent[plen] = '\0';
	struct stat st;
	if (stat(parent, &st) != 0)
		return error_set(g->err, MOE_ESYS,
		                 "%s: directory %s: %s; create it first (moe-gen makes no parent "
		                 "directories)",
		                 out, parent, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return error_set(g->err, MOE_EINVAL, "%s: %s is not a directory", out, parent);
	if (!g->m.gguf && mkdir(out, 0755) != 0 && errno != EEXIST)
		return error_set(g->err, MOE_ESYS, "%s: mkdir: %s", out, strerror(errno));
	return 0;
}

int gen_write(const struct moe_gen_options *opt, const struct gen_whole_model *whole,
              struct sidecar_error *err)
{
	struct gen g = {.opt = opt, .whole = whole, .err = err, .fd = -1};
	if (!opt->out || !opt->preset)
		return error_set(err, MOE_EINVAL, "an output path and a preset are required");
	if (!(g.m.preset = moe_model_preset_find(opt->preset))) {
		char names[256];
		moe_model_preset_names(names, sizeof(names), ", ");
		return error_set(err, MOE_EINVAL, "unknown preset '%s' (%s)", opt->preset, names);
	}
	int rc = check_options(&g);
	g.n_files = opt->shards ? opt->shards : 1;
	if (!rc)
		rc = plan_model(&g);
	if (!rc) {
		layout(&g);
		rc = make_paths(&g);
	}
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n_threads = opt->threads ? opt->threads : online > 0 ? (unsigned)online : 1;
	if (n_threads > MOE_GEN_MAX_THREADS)
		n_threads = MOE_GEN_MAX_THREADS;
	if (!rc && (!(g.bufs[0] = malloc(WRITE_BUF)) || !(g.bufs[1] = malloc(WRITE_BUF)) ||
	            !(g.pending = malloc(MAX_PENDING_JOBS * sizeof(*g.pending)))))
		rc = error_set(err, MOE_ENOMEM, "out of memory");
	g.buf = g.bufs[0];
	if (!rc)
		rc = threads_start(&g, n_threads);
	if (!rc && opt->progress)
		progress_begin(&g.prog, "moe-gen", g.total, "B");
	for (uint32_t f = 0; f < g.n_files && !rc; f++)
		rc = g.m.gguf ? write_gguf_file(&g, f) : write_st_file(&g, f);
	if (!rc && opt->progress)
		progress_end(&g.prog);
	if (!rc && !g.m.gguf)
		rc = write_config(&g);
	if (!rc && !g.m.gguf && g.n_files > 1)
		rc = write_index(&g);
	threads_stop(&g); /* after an error the writer may still be writing to g.fd */
	if (g.fd >= 0)
		close(g.fd);
	if (g.paths)
		for (uint32_t f = 0; f < g.n_files; f++)
			free(g.paths[f]);
	free(g.paths);
	free(g.t);
	free(g.bufs[0]);
	free(g.bufs[1]);
	free(g.pending);
	free(g.scratch.floats);
	free(g.scratch.blocks);
	free(g.fp8_scales);
	free(g.mx_scales);
	free(g.int4);
	return rc;
}
