/* serve_fixture.c — see serve_fixture.h. */
#include "serve_fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe_kernels.h"

void served_start(struct served *s, const char *format, const char *const *extra)
{
	served_start_preset(s, "qwen3-30b-a3b", format, !strcmp(format, "fp8"), extra);
}

void served_start_preset(struct served *s, const char *preset, const char *format, bool safetensors,
                         const char *const *extra)
{
	memset(s, 0, sizeof(*s));
	harness_tempdir(&s->sp);
	snprintf(s->model, sizeof(s->model), "%s/model%s", s->sp.dir, safetensors ? "" : ".gguf");
	cr_assert_eq(ref_generate_preset(s->model, preset, format, 7), 0,
	             "generating a %s %s model", preset, format);
	char instance[64];
	snprintf(instance, sizeof(instance), "test-serve-%d", (int)getpid());
	const char *argv[24] = {s->model, "--probes-instance", instance};
	int n = 3;
	for (int i = 0; extra && extra[i] && n < 23; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	int st = 0;
	if (sidecar_start(&s->sp, argv, &st) != 0) {
		char *log = slurp(s->sp.log);
		cr_assert_fail("sidecar on a %s model did not start (status 0x%x): %s", format, st,
		               log ? log : "(no log)");
	}
	struct moe_connect_opts o = {.socket_path = s->sp.socket,
	                             .max_tokens = 64,
	                             .n_slots = 4,
	                             .client_name = "test_serve"};
	int rc = moe_connect(&o, &s->c);
	cr_assert_eq(rc, MOE_OK, "connect: %s", moe_connect_error());
	s->ref = ref_open(s->model);
	cr_assert_not_null(s->ref);
}

void served_stop(struct served *s)
{
	moe_close(s->c);
	s->c = NULL;
	ref_close(s->ref);
	s->ref = NULL;
	int st = sidecar_stop(&s->sp, SIGTERM);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sidecar exit status 0x%x", st);
	sidecar_cleanup(&s->sp);
}

void fwd_case_make(struct fwd_case *fc, uint64_t seed, int32_t layer, uint32_t n_tokens, uint32_t k,
                   uint32_t n_experts, uint32_t hidden, bool holes)
{
	memset(fc, 0, sizeof(*fc));
	fc->layer = layer;
	fc->n_tokens = n_tokens;
	fc->k = k;
	fc->in_dtype = MOE_DTYPE_F32;
	fc->out_dtype = MOE_DTYPE_F32;
	fc->x = malloc((size_t)n_tokens * hidden * sizeof(float));
	fc->x_wire = malloc((size_t)n_tokens * hidden * sizeof(float));
	fc->ids = malloc((size_t)n_tokens * k * sizeof(int32_t));
	fc->weights = malloc((size_t)n_tokens * k * sizeof(float));
	cr_assert(fc->x && fc->x_wire && fc->ids && fc->weights);
	uint64_t r = seed * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < (size_t)n_tokens * hidden; i++)
		fc->x[i] = (float)((double)(test_rand(&r) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
	for (uint32_t t = 0; t < n_tokens; t++) {
		for (uint32_t j = 0; j < k; j++) {
			int32_t id;
			bool dup;
			do {
				id = (int32_t)(test_rand(&r) % n_experts);
				dup = false;
				for (uint32_t q = 0; q < j; q++)
					dup |= fc->ids[t * k + q] == id;
			} while (dup);
			if (holes && test_rand(&r) % 7 == 0)
				id = -1;
			fc->ids[t * k + j] = id;
			fc->weights[t * k + j] =
			    0.05f + (float)(test_rand(&r) % 1000) / 1000.0f; /* distinct-ish */
		}
	}
}

void fwd_case_free(struct fwd_case *fc)
{
	free(fc->x);
	free(fc->x_wire);
	free(fc->ids);
	free(fc->weights);
}

int served_forward(struct served *s, const struct fwd_case *fc, float *out,
                   struct moe_completion *done)
{
	const struct moe_info *inf = moe_info(s->c);
	const size_t n = (size_t)fc->n_tokens * inf->hidden;
	moek_convert(fc->in_dtype, fc->x_wire, MOEK_ACT_F32, fc->x, n);
	struct moe_slot slot;
	cr_assert_eq(moe_slot_acquire(s->c, &slot), MOE_OK);
	memcpy(slot.input, fc->x_wire, n * moe_dtype_size(fc->in_dtype));
	memcpy(slot.expert_ids, fc->ids, (size_t)fc->n_tokens * fc->k * sizeof(int32_t));
	memcpy(slot.expert_weights, fc->weights, (size_t)fc->n_tokens * fc->k * sizeof(float));
	struct moe_completion d;
	memset(&d, 0, sizeof(d));
	int rc = moe_forward(s->c, &slot, fc->layer, fc->n_tokens, (uint16_t)fc->k, fc->k_defer,
	                     fc->in_dtype, fc->out_dtype, fc->flags, &d, 10000);
	cr_assert(rc == d.status || rc == MOE_OK, "transport: %s: %s", moe_strerror(rc),
	          moe_last_error(s->c));
	if (rc == MOE_OK && out)
		moek_convert(MOEK_ACT_F32, out, fc->out_dtype, slot.output, n);
	cr_assert_eq(moe_slot_release(s->c, slot.index), MOE_OK);
	if (done)
		*done = d;
	return d.status;
}

char *served_stats(struct served *s)
{
	size_t cap = 1u << 20;
	char *buf = malloc(cap);
	cr_assert_not_null(buf);
	int rc = moe_stats_json(s->c, buf, cap, 5000);
	cr_assert_eq(rc, MOE_OK, "STATS: %s: %s", moe_strerror(rc), moe_last_error(s->c));
	return buf;
}

int64_t json_top_u64(const char *json, const char *key)
{
	char pat[96];
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	const char *p = strstr(json, pat);
	if (!p)
		return -1;
	p += strlen(pat);
	if (*p < '0' || *p > '9')
		return -1;
	return (int64_t)strtoull(p, NULL, 10);
}

uint64_t proc_rss_bytes(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	char line[256];
	unsigned long long kib = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %llu kB", &kib) == 1)
			break;
	fclose(f);
	return (uint64_t)kib * 1024u;
}
