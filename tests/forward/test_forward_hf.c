/* test_forward_hf.c — gpt-oss as Hugging Face ships it (MXFP4 _blocks + _scales tensors,
 * interleaved gate_up, biases) served by the forward engine, which converts the weights to
 * GGUF blocks once per load.
 *
 * The oracle is the GGUF twin: the generator's weights depend only on (seed, layer, expert,
 * tensor), so a GGUF and a Hugging Face checkpoint of the same seed and shapes hold the same
 * MXFP4 weights (checked byte for byte first). Their biases differ only in precision (GGUF
 * f32, Hugging Face bf16), so the twin's biases are overwritten with the Hugging Face values
 * (exact in f32); then every output must equal the twin's bit for bit. Also: the RESIDENCY
 * source under a budget below the model (evictions, slots reused: one expert's converted
 * bytes never leak into the next), the MMAP source's refusal, a malformed scales tensor
 * refused by the catalog, and the residency's post-load hook itself (loader thread, once per
 * load, a failure fails the expert with the hook's message).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "catalog.h"
#include "fixture.h"
#include "moe_abi.h"
#include "moe_kernels.h"
#include "residency.h"

/* The record of the last engine call that failed (forward.h). */
static struct sidecar_error ferr;

#define HIDDEN 256u
#define FFN 256u

static struct forward_engine *engine(const struct fwd_model *m, enum forward_source src,
                                     uint64_t budget)
{
	struct forward_config cfg = {
	    .source = src,
	    .mem_budget = budget,
	    .threads_per_node = 1,
	    .max_tokens = 8,
	    .chunk_bytes = 64 * 1024,
	    .lazy_load = true, /* these tests exercise demand loads (and so the conversion) */
	};
	struct forward_engine *e;
	cr_assert_eq(forward_create(&e, m->cat, &cfg, &ferr), 0, "forward_create: %s", ferr.msg);
	return e;
}

static void read_at(const char *path, void *buf, uint64_t len, uint64_t off)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0, "%s", path);
	cr_assert_eq(pread(fd, buf, len, (off_t)off), (ssize_t)len, "%s: read at %llu", path,
	             (unsigned long long)off);
	close(fd);
}

static void write_at(const char *path, const void *buf, uint64_t len, uint64_t off)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0, "%s", path);
	cr_assert_eq(pwrite(fd, buf, len, (off_t)off), (ssize_t)len, "%s: write at %llu", path,
	             (unsigned long long)off);
	close(fd);
}

static const char *path_of(const struct moe_catalog *cat, const struct moe_extent *x)
{
	return cat->files[x->file].path;
}

/* The Hugging Face checkpoint and its GGUF twin (same seed, shapes), the twin's biases set
 * to the checkpoint's. */
struct twin {
	struct fwd_model hf, gguf;
};

static void twin_make(struct twin *t, uint32_t layers, uint32_t experts)
{
	char err[256];
	struct fwd_model_spec hf = {"gpt-oss-20b", MOEK_MXFP4, false, layers,
	                            experts,       HIDDEN,     FFN,   false};
	struct fwd_model_spec gg = hf;
	gg.gguf = true;
	cr_assert_eq(fwd_model_make(&t->hf, &hf, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(fwd_model_make(&t->gguf, &gg, err, sizeof(err)), 0, "%s", err);
	const struct moe_catalog *hc = t->hf.cat, *gc = t->gguf.cat;
	cr_assert_eq(hc->info.n_moe_layers, gc->info.n_moe_layers);
	float *b = malloc(2 * FFN * sizeof(float)), *g = malloc(FFN * sizeof(float));
	uint16_t *raw = malloc(2 * FFN * sizeof(uint16_t));
	cr_assert(b && g && raw);
	for (uint32_t l = 0; l < hc->info.n_moe_layers; l++)
		for (uint32_t e = 0; e < experts; e++) {
			const struct moe_expert *hx =
			    moe_catalog_expert(hc, (uint32_t)fwd_moe_block(hc, l), e);
			const struct moe_expert *gx =
			    moe_catalog_expert(gc, (uint32_t)fwd_moe_block(gc, l), e);
			const struct moe_proj_ref *gu = &hx->proj[MOE_PROJ_GATE_UP];
			cr_assert(gu->present && gu->layout == MOE_LAYOUT_MXFP4_HF &&
			              gu->order == MOE_GATE_UP_INTERLEAVED,
			          "the generator's gpt-oss checkpoint is not in the HF layout");
			cr_assert(gx->proj[MOE_PROJ_GATE].present &&
			          !gx->proj[MOE_PROJ_GATE_UP].present);
			/* gate_up bias: even entries gate, odd up */
			cr_assert_eq(gu->bias_format, MOEK_BF16);
			cr_assert_eq(gu->bias.length, 2 * FFN * 2);
			read_at(path_of(hc, &gu->bias), raw, gu->bias.length, gu->bias.offset);
			for (uint32_t i = 0; i < 2 * FFN; i++)
				b[i] = moek_bf16_to_f32(raw[i]);
			for (int half = 0; half < 2; half++) {
				const struct moe_proj_ref *p =
				    &gx->proj[half ? MOE_PROJ_UP : MOE_PROJ_GATE];
				cr_assert_eq(p->bias_format, MOEK_F32);
				cr_assert_eq(p->bias.length, FFN * 4);
				for (uint32_t i = 0; i < FFN; i++)
					g[i] = b[2 * i + (uint32_t)half];
				write_at(path_of(gc, &p->bias), g, p->bias.length, p->bias.offset);
			}
			const struct moe_proj_ref *hd = &hx->proj[MOE_PROJ_DOWN];
			const struct moe_proj_ref *gd = &gx->proj[MOE_PROJ_DOWN];
			cr_assert_eq(hd->bias.length, HIDDEN * 2);
			cr_assert_eq(gd->bias.length, HIDDEN * 4);
			read_at(path_of(hc, &hd->bias), raw, hd->bias.length, hd->bias.offset);
			for (uint32_t i = 0; i < HIDDEN; i++)
				b[i] = moek_bf16_to_f32(raw[i]);
			write_at(path_of(gc, &gd->bias), b, gd->bias.length, gd->bias.offset);
		}
	free(b);
	free(g);
	free(raw);
}

static void twin_free(struct twin *t)
{
	fwd_model_free(&t->hf);
	fwd_model_free(&t->gguf);
}

/* The premise: the checkpoint's blocks and scales, converted, are the twin's GGUF bytes. */
Test(forward_hf, twin_holds_the_same_mxfp4_weights)
{
	struct twin t;
	twin_make(&t, 2, 4);
	const struct moe_catalog *hc = t.hf.cat, *gc = t.gguf.cat;
	const size_t gguf_row = moek_row_bytes(MOEK_MXFP4, HIDDEN);
	uint8_t *blocks = malloc(2 * FFN * HIDDEN / 2), *scales = malloc(2 * FFN * HIDDEN / 32);
	uint8_t *conv = malloc(2 * FFN * gguf_row), *want = malloc(FFN * gguf_row);
	cr_assert(blocks && scales && conv && want);
	uint64_t differing_experts = 0;
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t e = 0; e < 4; e++) {
			const struct moe_expert *hx =
			    moe_catalog_expert(hc, (uint32_t)fwd_moe_block(hc, l), e);
			const struct moe_expert *gx =
			    moe_catalog_expert(gc, (uint32_t)fwd_moe_block(gc, l), e);
			const struct moe_proj_ref *gu = &hx->proj[MOE_PROJ_GATE_UP];
			read_at(path_of(hc, &gu->data), blocks, gu->data.length, gu->data.offset);
			read_at(path_of(hc, &gu->scale), scales, gu->scale.length,
			        gu->scale.offset);
			moek_mxfp4_from_hf(blocks, scales, 2 * FFN * HIDDEN, conv);
			for (int half = 0; half < 2; half++) {
				const struct moe_proj_ref *p =
				    &gx->proj[half ? MOE_PROJ_UP : MOE_PROJ_GATE];
				cr_assert_eq(p->format, MOEK_MXFP4);
				cr_assert_eq(p->data.length, FFN * gguf_row);
				read_at(path_of(gc, &p->data), want, p->data.length,
				        p->data.offset);
				for (uint32_t r = 0; r < FFN; r++)
					cr_assert_eq(
					    memcmp(conv + (2 * r + (uint32_t)half) * gguf_row,
					           want + r * gguf_row, gguf_row),
					    0, "layer %u expert %u %s row %u differs", l, e,
					    half ? "up" : "gate", r);
			}
			if (e > 0 && memcmp(conv, want, gguf_row) != 0)
				differing_experts++;
			const struct moe_proj_ref *hd = &hx->proj[MOE_PROJ_DOWN];
			const struct moe_proj_ref *gd = &gx->proj[MOE_PROJ_DOWN];
			read_at(path_of(hc, &hd->data), blocks, hd->data.length, hd->data.offset);
			read_at(path_of(hc, &hd->scale), scales, hd->scale.length,
			        hd->scale.offset);
			moek_mxfp4_from_hf(blocks, scales, (size_t)HIDDEN * FFN, conv);
			cr_assert_eq(gd->data.length, hd->data.length + hd->scale.length);
			read_at(path_of(gc, &gd->data), want, gd->data.length, gd->data.offset);
			cr_assert_eq(memcmp(conv, want, gd->data.length), 0,
			             "layer %u expert %u down differs", l, e);
		}
	cr_assert_gt(differing_experts, 0, "experts are not all alike");
	free(blocks);
	free(scales);
	free(conv);
	free(want);
	twin_free(&t);
}

/* Runs r (k_defer as made) through e into out/out_def. */
static void run(struct forward_engine *e, struct fwd_req *r, float *out, float *out_def,
                const char *what)
{
	struct forward_result res;
	int rc = forward_run(e, &r->q, out, r->q.k_defer ? out_def : NULL, &res);
	cr_assert_eq(rc, MOE_OK, "%s: %d %s", what, rc, res.message);
}

static void assert_bits(const float *a, const float *b, size_t n, const char *what)
{
	long d = fwd_first_diff(a, b, n);
	cr_assert_eq(d, -1, "%s: element %ld differs: %a vs %a", what, d, d >= 0 ? a[d] : 0.0,
	             d >= 0 ? b[d] : 0.0);
}

/* RESIDENCY (demand loads) and ALL_RESIDENT over the checkpoint equal the GGUF twin and the
 * engine's reference, 1 and several tokens, with and without deferral. */
Test(forward_hf, residency_and_all_resident_equal_the_gguf_twin)
{
	struct twin t;
	twin_make(&t, 3, 16);
	const size_t h = HIDDEN;
	struct forward_engine *res = engine(&t.hf, FORWARD_SOURCE_RESIDENCY, 0);
	struct forward_engine *all = engine(&t.hf, FORWARD_SOURCE_ALL_RESIDENT, 0);
	struct forward_engine *gg = engine(&t.gguf, FORWARD_SOURCE_ALL_RESIDENT, 0);
	const uint32_t tokens[] = {1, 3, 8};
	float *want = malloc(8 * h * sizeof(float)), *want_def = malloc(8 * h * sizeof(float));
	cr_assert(want && want_def);
	for (uint32_t kd = 0; kd <= 1; kd++)
		for (uint32_t i = 0; i < 3; i++) {
			const uint32_t n = tokens[i];
			struct fwd_req r;
			fwd_req_make(&r, t.hf.cat, fwd_moe_block(t.hf.cat, i % 2), n, 4, kd,
			             i == 1 ? MOEK_ACT_BF16 : MOEK_ACT_F32, 300 + i + 10 * kd,
			             i == 2);
			char what[96];
			snprintf(what, sizeof(what), "%u tokens, k_defer %u", n, kd);
			run(gg, &r, want, want_def, what);
			double sum = 0;
			for (size_t j = 0; j < n * h; j++)
				sum += (double)(want[j] < 0 ? -want[j] : want[j]);
			cr_assert_gt(sum, 0.0, "%s: the twin's output is all zero", what);
			struct forward_engine *hf[2] = {res, all};
			for (int s = 0; s < 2; s++) {
				memset(r.out, 0xff, n * h * sizeof(float));
				run(hf[s], &r, r.out, r.out_def, what);
				assert_bits(r.out, want, n * h, s ? "all-resident" : "residency");
				if (kd)
					assert_bits(r.out_def, want_def, n * h,
					            s ? "all-resident deferred"
					              : "residency deferred");
			}
			struct forward_result ref;
			cr_assert_eq(
			    forward_reference(res, &r.q, r.ref, kd ? r.ref_def : NULL, &ref),
			    MOE_OK, "%s", ref.message);
			assert_bits(r.ref, want, n * h, "reference");
			if (kd)
				assert_bits(r.ref_def, want_def, n * h, "reference deferred");
			fwd_req_free(&r);
		}
	struct forward_stats st = {0};
	forward_stats(res, &st);
	cr_assert_gt(st.cold_misses, 0, "the residency read (and converted) experts");
	free(want);
	free(want_def);
	forward_destroy(res);
	forward_destroy(all);
	forward_destroy(gg);
	twin_free(&t);
}

/* A budget of a quarter of the model: experts are evicted and their slots reloaded with other
 * experts, converted again each time; every output still equals the twin's. */
Test(forward_hf, budget_below_the_model_reuses_slots)
{
	struct twin t;
	twin_make(&t, 3, 16);
	const size_t h = HIDDEN;
	const uint64_t budget = t.hf.cat->expert_bytes_total / 4;
	struct forward_engine *res = engine(&t.hf, FORWARD_SOURCE_RESIDENCY, budget);
	struct forward_engine *gg = engine(&t.gguf, FORWARD_SOURCE_ALL_RESIDENT, 0);
	struct residency_counters rc;
	cr_assert_eq(forward_node_residency(res, 0, &rc), 0);
	const uint32_t slots = rc.slots;
	cr_assert_lt(slots, 3 * 16 / 2, "a quarter of the model holds few experts");
	float *want = malloc(8 * h * sizeof(float));
	cr_assert(want);
	struct forward_stats st = {0};
	for (uint32_t i = 0; i < 48; i++) {
		struct fwd_req r;
		fwd_req_make(&r, t.hf.cat, fwd_moe_block(t.hf.cat, i % 3), 1 + i % 4, 4, 0,
		             MOEK_ACT_F32, 600 + i, i % 7 == 0);
		run(gg, &r, want, NULL, "twin");
		run(res, &r, r.out, NULL, "residency");
		char what[64];
		snprintf(what, sizeof(what), "request %u", i);
		assert_bits(r.out, want, r.q.n_tokens * h, what);
		forward_stats(res, &st);
		cr_assert_leq(st.resident_bytes, st.budget_bytes, "%s: over budget", what);
		fwd_req_free(&r);
	}
	cr_assert_eq(forward_node_residency(res, 0, &rc), 0);
	cr_assert_gt(st.residency.evictions, 0, "a quarter of the model must evict");
	cr_assert_gt(rc.loads, slots, "slots were reloaded with other experts (%llu loads, %u)",
	             (unsigned long long)rc.loads, slots);
	cr_assert_eq(rc.failures, 0);
	free(want);
	forward_destroy(res);
	forward_destroy(gg);
	twin_free(&t);
}

/* The MMAP source cannot convert a read-only page-cache mapping: refused, saying why. */
Test(forward_hf, mmap_source_refused_with_the_reason)
{
	struct fwd_model m;
	char err[256];
	struct fwd_model_spec spec = {"gpt-oss-20b", MOEK_MXFP4, false, 2, 4, HIDDEN, FFN, false};
	cr_assert_eq(fwd_model_make(&m, &spec, err, sizeof(err)), 0, "%s", err);
	struct forward_config cfg = {
	    .source = FORWARD_SOURCE_MMAP, .threads_per_node = 1, .max_tokens = 4};
	struct forward_engine *e = NULL;
	err[0] = '\0';
	cr_assert_neq(forward_create(&e, m.cat, &cfg, &ferr), 0);
	cr_assert_null(e);
	cr_assert(strstr(ferr.msg, "Hugging Face") && strstr(ferr.msg, "mmap") &&
	              strstr(ferr.msg, "GGUF"),
	          "unclear refusal: %s", ferr.msg);
	fwd_model_free(&m);
}

/* Llama-4's input-major experts cannot be transposed inside a read-only mapping either. */
Test(forward_hf, llama4_mmap_source_refused_with_the_reason)
{
	struct fwd_model m;
	char err[256];
	struct fwd_model_spec spec = {"llama4-scout", MOEK_BF16, false, 2, 4, HIDDEN, FFN, false};
	cr_assert_eq(fwd_model_make(&m, &spec, err, sizeof(err)), 0, "%s", err);
	struct forward_config cfg = {
	    .source = FORWARD_SOURCE_MMAP, .threads_per_node = 1, .max_tokens = 4};
	struct forward_engine *e = NULL;
	cr_assert_neq(forward_create(&e, m.cat, &cfg, &ferr), 0);
	cr_assert_null(e);
	cr_assert(strstr(ferr.msg, "Llama-4") && strstr(ferr.msg, "mmap") &&
	              strstr(ferr.msg, "transposed"),
	          "unclear refusal: %s", ferr.msg);
	fwd_model_free(&m);
}

/* A scales tensor of the wrong shape (same byte count, dimensions swapped) is refused by the
 * catalog, naming the tensor. */
Test(forward_hf, malformed_scales_refused_by_the_catalog)
{
	struct fwd_model m;
	char err[256];
	struct fwd_model_spec spec = {"gpt-oss-20b", MOEK_MXFP4, false, 2, 4, HIDDEN, FFN, false};
	cr_assert_eq(fwd_model_make(&m, &spec, err, sizeof(err)), 0, "%s", err);
	const struct moe_proj_ref *gu =
	    &moe_catalog_expert(m.cat, (uint32_t)fwd_moe_block(m.cat, 0), 0)
	         ->proj[MOE_PROJ_GATE_UP];
	char path[256];
	snprintf(path, sizeof(path), "%s", path_of(m.cat, &gu->scale));
	moe_catalog_close(m.cat);
	m.cat = NULL;
	/* [4, 512, 8] → [4, 8, 512] in the safetensors header */
	uint64_t hlen = 0;
	read_at(path, &hlen, 8, 0);
	cr_assert(hlen > 0 && hlen < (1u << 20));
	char *hdr = calloc(1, hlen + 1);
	cr_assert_not_null(hdr);
	read_at(path, hdr, hlen, 8);
	char *at = strstr(hdr, "\"model.layers.0.mlp.experts.gate_up_proj_scales\"");
	cr_assert_not_null(at, "no scales tensor in %s", path);
	char *shape = strstr(at, "[4,512,8]");
	char *end = strchr(at, '}');
	cr_assert(shape && end && shape < end, "scales shape not found: %.120s", at);
	memcpy(shape, "[4,8,512]", 9);
	write_at(path, hdr, hlen, 8);
	free(hdr);
	struct sidecar_error merr = {0};
	struct moe_catalog *cat = NULL;
	cr_assert_neq(moe_catalog_open(m.path, &cat, &merr), 0, "a wrong scales shape opened");
	cr_assert(strstr(merr.msg, "gate_up_proj_scales") && strstr(merr.msg, "scales"),
	          "unclear refusal: %s", merr.msg);
	fwd_model_free(&m);
}

/* ---- the residency's post-load hook itself ---- */

#define HOOK_EXPERTS 6u
#define HOOK_EXTENT 5000u /* bytes per extent, at odd file offsets (data_skip ≠ 0) */

struct hook_seen {
	atomic_uint calls;
	atomic_uint on_caller; /* calls made on the thread that created the residency */
	pthread_t creator;
};

static uint8_t pattern(uint32_t expert, uint32_t extent, uint32_t i)
{
	return (uint8_t)(expert * 37u + extent * 101u + i * 7u + (i >> 8));
}

/* Inverts every byte of every extent; expert 4 fails. */
static int invert_or_fail(void *arg, const struct residency_loaded *x, struct sidecar_error *err)
{
	struct hook_seen *s = arg;
	atomic_fetch_add(&s->calls, 1);
	if (pthread_equal(pthread_self(), s->creator))
		atomic_fetch_add(&s->on_caller, 1);
	if (x->expert == 4)
		return error_set(err, MOE_EINVAL, "expert %u: bytes rejected by the test",
		                 x->expert);
	for (uint32_t i = 0; i < x->n_extents; i++) {
		if (x->data[i] < x->slot || x->data[i] + x->length[i] > x->slot + x->slot_bytes)
			return error_set(err, MOE_EINVAL, "extent %u outside the slot", i);
		for (uint64_t j = 0; j < x->length[i]; j++)
			x->data[i][j] = (uint8_t)~x->data[i][j];
	}
	return 0;
}

Test(forward_hf, residency_post_load_hook)
{
	char path[] = "/tmp/moe-post-load.XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	const uint64_t stride = 2 * HOOK_EXTENT + 3;
	uint8_t *file = malloc(HOOK_EXPERTS * stride + 8192);
	cr_assert_not_null(file);
	memset(file, 0x5a, HOOK_EXPERTS * stride + 8192);
	for (uint32_t e = 0; e < HOOK_EXPERTS; e++)
		for (uint32_t k = 0; k < 2; k++)
			for (uint32_t i = 0; i < HOOK_EXTENT; i++)
				file[1 + e * stride + k * HOOK_EXTENT + i] = pattern(e, k, i);
	cr_assert_eq(write(fd, file, HOOK_EXPERTS * stride + 8192),
	             (ssize_t)(HOOK_EXPERTS * stride + 8192));
	close(fd);
	struct expert_map map;
	struct sidecar_error err = {0};
	const char *paths[1] = {path};
	cr_assert_eq(expert_map_init(&map, 1, HOOK_EXPERTS, 1, paths, &err), 0, "%s", err.msg);
	for (uint32_t e = 0; e < HOOK_EXPERTS; e++)
		for (uint32_t k = 0; k < 2; k++)
			cr_assert_eq(expert_map_add(&map, 0, e, 0, 1 + e * stride + k * HOOK_EXTENT,
			                            HOOK_EXTENT, &err),
			             0, "%s", err.msg);
	struct hook_seen seen = {.creator = pthread_self()};
	/* Room for two experts: every expert after the first two evicts one. */
	struct residency_config rc = {.numa_node = -1,
	                              .mem_budget = 1u << 20,
	                              .chunk_bytes = 4096,
	                              .retry_backoff_ms = 3600000,
	                              .post_load = invert_or_fail,
	                              .post_load_arg = &seen};
	struct residency *r;
	cr_assert_eq(residency_create(&r, &map, &rc, &err), 0, "%s", err.msg);
	struct residency_counters c;
	residency_counters(r, &c);
	residency_destroy(r);
	rc.mem_budget = 2 * c.slot_bytes;
	cr_assert_eq(residency_create(&r, &map, &rc, &err), 0, "%s", err.msg);
	residency_counters(r, &c);
	cr_assert_eq(c.slots, 2);
	uint32_t loads = 0;
	for (uint32_t round = 0; round < 2; round++)
		for (uint32_t e = 0; e < HOOK_EXPERTS; e++) {
			struct expert_ref ref;
			int st = residency_acquire(r, 0, e, -1.0f, 0, &ref);
			loads++;
			if (e == 4) {
				cr_assert_eq(st, -EINVAL, "expert 4: %d", st); /* MOE_EINVAL */
				cr_assert_eq(residency_state(r, 0, 4), EXPERT_FAILED);
				char why[256];
				residency_error_message(r, 0, 4, why, sizeof(why));
				cr_assert(strstr(why, "after loading") &&
				              strstr(why, "bytes rejected by the test"),
				          "%s", why);
				/* FAILED for its backoff: no new load, no new call */
				cr_assert_eq(residency_acquire(r, 0, 4, -1.0f, 0, &ref), -EINVAL);
				cr_assert_eq(atomic_load(&seen.calls), loads);
				residency_retry_failed(r, 0, 4);
				continue;
			}
			cr_assert_eq(st, 0, "expert %u: %d", e, st);
			cr_assert_eq(ref.n_extents, 2);
			for (uint32_t k = 0; k < 2; k++)
				for (uint32_t i = 0; i < HOOK_EXTENT; i++)
					cr_assert_eq(ref.data[k][i], (uint8_t)~pattern(e, k, i),
					             "round %u expert %u extent %u byte %u", round,
					             e, k, i);
			residency_release(r, &ref);
			/* once per load, never again for a hit */
			cr_assert_eq(atomic_load(&seen.calls), loads);
			cr_assert_eq(residency_acquire(r, 0, e, -1.0f, 0, &ref), 0);
			residency_release(r, &ref);
			cr_assert_eq(atomic_load(&seen.calls), loads);
		}
	cr_assert_eq(atomic_load(&seen.on_caller), 0, "the hook runs on the loader thread");
	residency_counters(r, &c);
	cr_assert_gt(c.evictions, 0);
	residency_destroy(r);
	expert_map_free(&map);
	unlink(path);
	free(file);
}

/* Llama-4 as Hugging Face ships it (fused input-major BF16 experts, MoE every other block)
 * served from the residency and all-resident sources: transposed at load, the same bits as
 * its GGUF twin's BF16 rows, with the routing weight on the experts' input; the mmap source
 * is refused with the reason. */
Test(forward_hf, llama4_transposed_experts_equal_the_gguf_twin)
{
	char err[256];
	struct fwd_model hf, gg;
	struct fwd_model_spec spec = {
	    "llama4-maverick", MOEK_BF16, false, 4, 8, HIDDEN, FFN, false};
	cr_assert_eq(fwd_model_make(&hf, &spec, err, sizeof(err)), 0, "%s", err);
	spec.gguf = true;
	cr_assert_eq(fwd_model_make(&gg, &spec, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(hf.cat->info.n_moe_layers, 2);
	cr_assert(hf.cat->info.weight_on_input);
	const struct moe_proj_ref *gu =
	    &moe_catalog_expert(hf.cat, (uint32_t)fwd_moe_block(hf.cat, 0), 0)
	         ->proj[MOE_PROJ_GATE_UP];
	cr_assert(gu->present && gu->layout == MOE_LAYOUT_TRANSPOSED);
	struct forward_engine *res = engine(&hf, FORWARD_SOURCE_RESIDENCY, 0);
	struct forward_engine *all = engine(&hf, FORWARD_SOURCE_ALL_RESIDENT, 0);
	struct forward_engine *twin = engine(&gg, FORWARD_SOURCE_ALL_RESIDENT, 0);
	const size_t h = HIDDEN;
	float *want = malloc(8 * h * sizeof(float)), *want_def = malloc(8 * h * sizeof(float));
	cr_assert(want && want_def);
	const uint32_t tokens[] = {1, 3, 8};
	for (uint32_t i = 0; i < 3; i++) {
		struct fwd_req r;
		fwd_req_make(&r, hf.cat, fwd_moe_block(hf.cat, i % 2), tokens[i], 1, 0,
		             MOEK_ACT_F32, 700 + i, false);
		char what[64];
		snprintf(what, sizeof(what), "llama4 %u tokens", tokens[i]);
		run(twin, &r, want, want_def, what);
		struct forward_engine *e[2] = {res, all};
		for (int s = 0; s < 2; s++) {
			memset(r.out, 0xff, tokens[i] * h * sizeof(float));
			run(e[s], &r, r.out, r.out_def, what);
			assert_bits(r.out, want, tokens[i] * h, s ? "all-resident" : "residency");
		}
		fwd_req_free(&r);
	}
	free(want);
	free(want_def);
	forward_destroy(res);
	forward_destroy(all);
	forward_destroy(twin);
	fwd_model_free(&hf);
	fwd_model_free(&gg);
}
