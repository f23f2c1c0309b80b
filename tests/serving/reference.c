/* reference.c — see reference.h. */
#include "reference.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "forward.h"
#include "moe_gen.h"
#include "moe_kernels.h"
#include "oracle.h"

/* The record of the last engine call that failed (forward.h). */
static struct sidecar_error ferr;

struct ref_engine {
	struct moe_catalog *cat;
	struct forward_engine *engine;
};

static int format_id(const char *name, uint32_t *out)
{
	if (!strcasecmp(name, "fp8")) {
		*out = MOEK_FP8_E4M3_B128;
		return 0;
	}
	for (uint32_t f = 0; f <= MOEK_FP8_E4M3_B128; f++) {
		const struct moek_format_info *fi = moek_format_lookup(f);
		if (fi && fi->weight_format && !strcasecmp(name, fi->name)) {
			*out = f;
			return 0;
		}
	}
	return -1;
}

uint64_t ref_ffn = REF_FFN;

int ref_generate(const char *path, const char *format, uint64_t seed)
{
	return ref_generate_preset(path, "qwen3-30b-a3b", format, seed);
}

/* Generating the model is most of a serve test's set-up under the sanitizers, and a test that
 * starts the sidecar several times over one model (both layouts, split and not) asks for the
 * same bytes each time: the GGUF files this process generated are kept in a directory of its
 * own, by what decides their bytes, and copied for a repeat — copied, not linked, since a
 * test may write into its model. The directory goes at exit. */
enum { GEN_CACHE = 8 };
static struct {
	char preset[32], format[32];
	uint64_t seed, ffn;
} gen_key[GEN_CACHE];
static unsigned gen_cached;
static char gen_dir[64];

static void gen_cache_remove(void)
{
	char p[128];
	for (unsigned i = 0; i < gen_cached; i++) {
		snprintf(p, sizeof(p), "%s/%u.gguf", gen_dir, i);
		unlink(p);
	}
	rmdir(gen_dir);
}

static int copy_file(const char *from, const char *to)
{
	const int in = open(from, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return -1;
	const int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int rc = out < 0 ? -1 : 0;
	static char buf[1 << 16];
	while (!rc) {
		const ssize_t n = read(in, buf, sizeof(buf));
		if (n <= 0) {
			rc = n < 0 ? -1 : 0;
			break;
		}
		if (write(out, buf, (size_t)n) != n)
			rc = -1;
	}
	if (out >= 0 && close(out) != 0)
		rc = -1;
	close(in);
	return rc;
}

/* The index of the cached copy of this model, or -1. */
static int gen_find(const char *preset, const char *format, uint64_t seed)
{
	for (unsigned i = 0; i < gen_cached; i++)
		if (!strcmp(gen_key[i].preset, preset) && !strcmp(gen_key[i].format, format) &&
		    gen_key[i].seed == seed && gen_key[i].ffn == ref_ffn)
			return (int)i;
	return -1;
}

/* Keeps a copy of the model just generated at path (best effort: a miss only costs time). */
static void gen_keep(const char *path, const char *preset, const char *format, uint64_t seed)
{
	if (gen_cached == GEN_CACHE || strlen(preset) >= sizeof(gen_key[0].preset) ||
	    strlen(format) >= sizeof(gen_key[0].format))
		return;
	if (!gen_dir[0]) {
		snprintf(gen_dir, sizeof(gen_dir), "/tmp/moe-refgen.XXXXXX");
		if (!mkdtemp(gen_dir)) {
			gen_dir[0] = '\0';
			return;
		}
		atexit(gen_cache_remove);
	}
	char p[128];
	snprintf(p, sizeof(p), "%s/%u.gguf", gen_dir, gen_cached);
	if (copy_file(path, p) != 0) {
		unlink(p);
		return;
	}
	snprintf(gen_key[gen_cached].preset, sizeof(gen_key[0].preset), "%s", preset);
	snprintf(gen_key[gen_cached].format, sizeof(gen_key[0].format), "%s", format);
	gen_key[gen_cached].seed = seed;
	gen_key[gen_cached].ffn = ref_ffn;
	gen_cached++;
}

static bool is_gguf(const char *path)
{
	const size_t n = strlen(path);
	return n > 5 && !strcmp(path + n - 5, ".gguf");
}

int ref_generate_preset(const char *path, const char *preset, const char *format, uint64_t seed)
{
	const int hit = is_gguf(path) ? gen_find(preset, format, seed) : -1;
	if (hit >= 0) {
		char p[128];
		snprintf(p, sizeof(p), "%s/%d.gguf", gen_dir, hit);
		if (copy_file(p, path) == 0)
			return 0;
	}
	struct moe_gen_options o = {.preset = preset,
	                            .out = path,
	                            .seed = seed,
	                            .layers = REF_LAYERS,
	                            .hidden = REF_HIDDEN,
	                            .ffn = ref_ffn,
	                            .experts = REF_EXPERTS};
	if (format_id(format, &o.format) != 0) {
		fprintf(stderr, "ref_generate: unknown format %s\n", format);
		return -1;
	}
	struct sidecar_error err;
	if (moe_gen_write(&o, &err) != 0) {
		fprintf(stderr, "ref_generate %s %s: %s\n", path, format, err.msg);
		return -1;
	}
	if (is_gguf(path) && hit < 0)
		gen_keep(path, preset, format, seed);
	return 0;
}

struct ref_engine *ref_open(const char *path)
{
	struct ref_engine *r = calloc(1, sizeof(*r));
	struct sidecar_error merr;
	if (!r || moe_catalog_open(path, &r->cat, &merr) != 0) {
		fprintf(stderr, "ref_open %s: %s\n", path, r ? merr.msg : "out of memory");
		free(r);
		return NULL;
	}
	struct forward_config fc = {
	    .source = FORWARD_SOURCE_ALL_RESIDENT, .threads_per_node = 1, .max_tokens = 64};
	char err[256];
	if (forward_create(&r->engine, r->cat, &fc, &ferr) != 0) {
		fprintf(stderr, "ref_open %s: %s\n", path, err);
		moe_catalog_close(r->cat);
		free(r);
		return NULL;
	}
	return r;
}

void ref_close(struct ref_engine *r)
{
	if (!r)
		return;
	forward_destroy(r->engine);
	moe_catalog_close(r->cat);
	free(r);
}

uint32_t ref_n_experts(const struct ref_engine *r)
{
	return r->cat->info.n_experts;
}

uint32_t ref_top_k(const struct ref_engine *r)
{
	return r->cat->info.top_k;
}

uint32_t ref_hidden(const struct ref_engine *r)
{
	return (uint32_t)r->cat->info.hidden;
}

uint32_t ref_n_layers(const struct ref_engine *r)
{
	return r->cat->info.n_layers;
}

uint64_t ref_expert_bytes(const struct ref_engine *r)
{
	return r->cat->expert_bytes_total;
}

int ref_forward(struct ref_engine *r, int32_t layer, uint32_t n_tokens, uint32_t k,
                uint32_t k_defer, const void *x, unsigned x_dtype, const int32_t *ids,
                const float *weights, const float *deferred_in, float *out_immediate,
                float *out_deferred)
{
	struct forward_request req = {.layer = layer,
	                              .n_tokens = n_tokens,
	                              .k = k,
	                              .k_defer = k_defer,
	                              .x = x,
	                              .x_dtype = x_dtype,
	                              .ids = ids,
	                              .weights = weights,
	                              .deferred_in = deferred_in};
	struct forward_result res;
	return forward_reference(r->engine, &req, out_immediate, out_deferred, &res);
}

int ref_expert_rows(const struct ref_engine *r, int32_t layer, uint32_t expert, unsigned proj,
                    void **rows, size_t *bytes, uint32_t *format)
{
	const struct moe_expert *e = moe_catalog_expert(r->cat, (uint32_t)layer, expert);
	if (!e || proj > 2)
		return -1;
	const struct moe_proj_ref *p = &e->proj[proj];
	uint64_t off = 0;
	if (!p->present && proj < 2 && e->proj[MOE_PROJ_GATE_UP].present) {
		p = &e->proj[MOE_PROJ_GATE_UP]; /* halves: gate the first rows, up the rest */
		if (p->order != MOE_GATE_UP_HALVES)
			return -1;
		off = proj == 1 ? p->data.length / 2 : 0;
	}
	if (!p->present || p->layout != MOE_LAYOUT_BLOCKS)
		return -1;
	const uint64_t len = p == &e->proj[proj] ? p->data.length : p->data.length / 2;
	FILE *f = fopen(r->cat->files[p->data.file].path, "rb");
	void *buf = malloc(len ? len : 1);
	const bool ok = f && buf && fseeko(f, (off_t)(p->data.offset + off), SEEK_SET) == 0 &&
	                fread(buf, 1, len, f) == len;
	if (f)
		fclose(f);
	if (!ok) {
		free(buf);
		return -1;
	}
	*rows = buf;
	*bytes = len;
	*format = p->format;
	return 0;
}
