/* forward_threads.c — bits identical for any thread count and NUMA node count (synthetic
 * 2- and 3-node hwloc topologies), for every source, and the engine under concurrent callers
 * (runs, prefetch, masks, stats from several threads); a gpt-oss Hugging Face MXFP4 checkpoint
 * too (converted by the loader threads). A plain program, not Criterion, so the
 * TSan variant can run it (Criterion cannot start under TSan here). Exit 0 = pass. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "moe_abi.h"
#include "moe_kernels.h"

/* The record of the last engine call that failed (forward.h). */
static struct sidecar_error ferr;

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                       \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

struct setup {
	const char *name;
	enum forward_source source;
	enum forward_numa_mode numa;
	const char *synthetic;
	uint32_t threads;
	uint32_t budget_percent; /* RESIDENCY: 0 = all fit */
	bool files;              /* the files' rows (forward_config.file_layout; MMAP always) */
};

static const struct setup setups[] = {
    {"1 node, 1 thread", FORWARD_SOURCE_ALL_RESIDENT, FORWARD_NUMA_AUTO, NULL, 1, 0},
    {"1 node, 2 threads", FORWARD_SOURCE_ALL_RESIDENT, FORWARD_NUMA_AUTO, NULL, 2, 0},
    {"1 node, 3 threads", FORWARD_SOURCE_ALL_RESIDENT, FORWARD_NUMA_AUTO, NULL, 3, 0},
    {"2 nodes, 1 thread", FORWARD_SOURCE_ALL_RESIDENT, FORWARD_NUMA_SYNTHETIC,
     "pack:1 numa:2 core:1 pu:1", 1, 0},
    {"2 nodes, 2 threads", FORWARD_SOURCE_ALL_RESIDENT, FORWARD_NUMA_SYNTHETIC,
     "pack:1 numa:2 core:1 pu:1", 2, 0},
    {"3 nodes, 1 thread", FORWARD_SOURCE_MMAP, FORWARD_NUMA_SYNTHETIC, "pack:1 numa:3 core:1 pu:1",
     1, 0, true},
    {"2 nodes, 2 threads, files' rows", FORWARD_SOURCE_ALL_RESIDENT, FORWARD_NUMA_SYNTHETIC,
     "pack:1 numa:2 core:1 pu:1", 2, 0, true},
    {"2 nodes, 1 thread, residency 30%, files' rows", FORWARD_SOURCE_RESIDENCY,
     FORWARD_NUMA_SYNTHETIC, "pack:1 numa:2 core:1 pu:1", 1, 30, true},
    {"2 nodes, 2 threads, residency 30%", FORWARD_SOURCE_RESIDENCY, FORWARD_NUMA_SYNTHETIC,
     "pack:1 numa:2 core:1 pu:1", 2, 30},
    {"1 node, 2 threads, residency 100%", FORWARD_SOURCE_RESIDENCY, FORWARD_NUMA_AUTO, NULL, 2, 0},
};

static struct forward_engine *make_engine(const struct fwd_model *m, const struct setup *s,
                                          uint32_t max_tokens)
{
	struct forward_config cfg = {
	    .source = s->source,
	    .numa = s->numa,
	    .numa_synthetic = s->synthetic,
	    .threads_per_node = s->threads,
	    .max_tokens = max_tokens,
	    .mem_budget = m->cat->expert_bytes_total * s->budget_percent / 100,
	    .chunk_bytes = 64 * 1024,
	    .file_layout = s->files,
	};
	struct forward_engine *e = NULL;
	char err[256];
	if (forward_create(&e, m->cat, &cfg, &ferr) != 0) {
		CHECK(0, "%s: forward_create: %s", s->name, err);
		return NULL;
	}
	struct forward_topology_info ti;
	forward_topology(e, &ti);
	const uint32_t want_nodes =
	    s->synthetic ? (uint32_t)(strstr(s->synthetic, "numa:")[5] - '0') : ti.n_nodes;
	CHECK(ti.n_nodes == want_nodes, "%s: %u nodes, expected %u", s->name, ti.n_nodes,
	      want_nodes);
	CHECK(!s->synthetic || !ti.memory_bound, "%s: synthetic nodes cannot be bound", s->name);
	return e;
}

/* Early delivery: the immediate output must be final when the callback runs, while the
 * deferred experts compute behind it on the other workers (pool_start_wave). */
struct delivery {
	const float *out, *ref;
	size_t n;
	int calls;
	long diff;
};

static void on_immediate(void *arg, const struct forward_result *res)
{
	(void)res;
	struct delivery *d = arg;
	d->calls++;
	d->diff = fwd_first_diff(d->out, d->ref, d->n);
}

static void check_deferred(const struct fwd_req *r, const char *setup, uint32_t format,
                           uint64_t hidden)
{
	long d = fwd_first_diff(r->out_def, r->ref_def, (size_t)r->q.n_tokens * hidden);
	CHECK(d < 0, "%s, %s, %u tokens: deferred element %ld differs", setup,
	      moe_format_name(format), r->q.n_tokens, d);
}

/* gguf false: a Hugging Face checkpoint (gpt-oss: MXFP4 converted at load by the loader
 * threads while workers compute; the MMAP source refuses it, so it is skipped). */
static void check_model(const char *preset, uint32_t format, bool gguf, uint64_t hidden,
                        uint64_t ffn)
{
	struct fwd_model m;
	char err[256];
	struct fwd_model_spec spec = {preset, format, gguf, 3, 16, hidden, ffn, false};
	if (fwd_model_make(&m, &spec, err, sizeof(err)) != 0) {
		CHECK(0, "model: %s", err);
		return;
	}
	/* the last: one token, nothing deferred — one wave of k groups, which 2 and 3 workers
	 * run partly whole and partly split (pool_whole_groups) */
	enum { N_REQ = 4 };
	const uint32_t tokens[N_REQ] = {1, 5, 24, 1};
	const uint32_t k = m.cat->info.top_k < 8 ? m.cat->info.top_k : 8;
	struct fwd_req reqs[2][N_REQ]; /* [files' rows][request] */
	for (int f = 0; f < 2; f++)
		for (int i = 0; i < N_REQ; i++)
			fwd_req_make(&reqs[f][i], m.cat, fwd_moe_block(m.cat, (uint32_t)i % 2),
			             tokens[i], k, i >= 2 ? 0 : 2, MOEK_ACT_BF16, 17 + (uint64_t)i,
			             i == 1);
	/* The oracles: single-threaded reference over all-resident weights, one per layout. */
	for (int f = 0; f < 2; f++) {
		struct setup os = setups[0];
		os.files = f;
		struct forward_engine *oracle = make_engine(&m, &os, 24);
		if (!oracle)
			goto out;
		for (int i = 0; i < N_REQ; i++) {
			struct forward_result res;
			int rc = forward_reference(oracle, &reqs[f][i].q, reqs[f][i].ref,
			                           reqs[f][i].ref_def, &res);
			CHECK(rc == MOE_OK, "reference: %s", res.message);
		}
		forward_destroy(oracle);
	}
	for (size_t s = 0; s < sizeof(setups) / sizeof(setups[0]); s++) {
		if (!gguf && setups[s].source == FORWARD_SOURCE_MMAP)
			continue;
		struct forward_engine *e = make_engine(&m, &setups[s], 24);
		if (!e)
			continue;
		/* Round 0: no early delivery. 1: early delivery, as the server does. 2: and the
		 * deferred part left running (settle_later), settled by forward_settle. 3: the
		 * same, settled by the next request's forward_run — in an order where a 24-token
		 * request follows a tail (its plan does not fit the second, decode-sized one). */
		static const int order[4][N_REQ] = {
		    {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 2, 1, 3}};
		int pending = 0;
		for (int round = 0; round < 4; round++) {
			struct fwd_req *unsettled = NULL;
			for (int o = 0; o < N_REQ; o++) {
				struct fwd_req *r = &reqs[setups[s].files][order[round][o]];
				const size_t n = (size_t)r->q.n_tokens * hidden;
				memset(r->out, 0xff, n * sizeof(float));
				memset(r->out_def, 0xff, n * sizeof(float));
				struct delivery dl = {
				    .out = r->out, .ref = r->ref, .n = n, .diff = -1};
				r->q.immediate_ready = round ? on_immediate : NULL;
				r->q.immediate_arg = &dl;
				r->q.settle_later = round >= 2;
				struct forward_result res;
				int rc = forward_run(e, &r->q, r->out, r->out_def, &res);
				r->q.immediate_ready = NULL;
				r->q.settle_later = false;
				CHECK(rc == MOE_OK, "%s: %s", setups[s].name, res.message);
				CHECK(dl.calls == (round > 0), "%s: delivered %d times in round %d",
				      setups[s].name, dl.calls, round);
				CHECK(dl.diff < 0,
				      "%s, %u tokens: immediate element %ld not final when "
				      "delivered",
				      setups[s].name, r->q.n_tokens, dl.diff);
				CHECK(!res.deferred_pending || (round >= 2 && r->q.k_defer),
				      "%s: deferred part pending in round %d", setups[s].name,
				      round);
				if (unsettled) { /* this forward_run settled the one before */
					check_deferred(unsettled, setups[s].name, format, hidden);
					unsettled = NULL;
				}
				long d = fwd_first_diff(r->out, r->ref, n);
				CHECK(d < 0, "%s, %s, %u tokens: immediate element %ld differs",
				      setups[s].name, moe_format_name(format), r->q.n_tokens, d);
				if (!r->q.k_defer)
					continue;
				pending += res.deferred_pending;
				if (res.deferred_pending && round == 3) {
					unsettled = r;
					continue;
				}
				if (res.deferred_pending)
					forward_settle(e);
				check_deferred(r, setups[s].name, format, hidden);
			}
			if (unsettled) {
				forward_settle(e);
				check_deferred(unsettled, setups[s].name, format, hidden);
			}
		}
		/* With a second worker on node 0 and every expert resident, the deferred wave of
		 * every deferring request runs behind its delivery and is left running. */
		if (setups[s].threads > 1 && !setups[s].budget_percent)
			CHECK(pending == 4, "%s: %d deferred parts left running, expected 4",
			      setups[s].name, pending);
		if (setups[s].budget_percent) {
			struct forward_stats st = {0};
			forward_stats(e, &st);
			CHECK(st.resident_bytes <= st.budget_bytes, "%s: over budget",
			      setups[s].name);
			CHECK(st.residency.evictions > 0, "%s: a 30%% budget must evict",
			      setups[s].name);
		}
		forward_destroy(e);
	}
out:
	for (int f = 0; f < 2; f++)
		for (int i = 0; i < N_REQ; i++)
			fwd_req_free(&reqs[f][i]);
	fwd_model_free(&m);
}

/* ---- concurrent callers ---- */
struct caller {
	struct forward_engine *e;
	const struct fwd_model *m;
	uint32_t id;
	int bad;
	int pending;   /* deferred parts left running (run_deferring) */
	char why[400]; /* the first bad result: what went wrong */
};

/* Counts a bad result, keeping the first one's reason. */
static void caller_bad(struct caller *c, uint32_t i, int rc, const struct forward_result *res,
                       int rc_ref, const struct forward_result *ref)
{
	if (c->bad++ == 0)
		snprintf(c->why, sizeof(c->why), "request %u: run %d (%s), reference %d (%s)%s", i,
		         rc, rc ? res->message : "", rc_ref, rc_ref ? ref->message : "",
		         rc || rc_ref ? "" : ": outputs differ");
}

static void *run_requests(void *arg)
{
	struct caller *c = arg;
	for (uint32_t i = 0; i < 30; i++) {
		struct fwd_req r;
		fwd_req_make(&r, c->m->cat, fwd_moe_block(c->m->cat, i % 2), 1 + i % 3, 4, 0,
		             MOEK_ACT_F32, c->id * 1000 + i, false);
		r.q.client = c->id;
		struct forward_result res, ref;
		const int rc = forward_run(c->e, &r.q, r.out, NULL, &res);
		const int rc_ref =
		    rc == MOE_OK ? forward_reference(c->e, &r.q, r.ref, NULL, &ref) : 0;
		if (rc != MOE_OK || rc_ref != MOE_OK ||
		    fwd_first_diff(r.out, r.ref, r.q.n_tokens * c->m->cat->info.hidden) >= 0)
			caller_bad(c, i, rc, &res, rc_ref, &ref);
		fwd_req_free(&r);
	}
	return NULL;
}

static void no_delivery(void *arg, const struct forward_result *res)
{
	(void)arg;
	(void)res;
}

/* Deferring requests left running (settle_later) from two threads at once: a caller's tail is
 * settled by the other caller's next request or by this caller's forward_settle, and its
 * out_deferred is final after that either way. */
static void *run_deferring(void *arg)
{
	struct caller *c = arg;
	const size_t h = c->m->cat->info.hidden;
	for (uint32_t i = 0; i < 30; i++) {
		struct fwd_req r;
		fwd_req_make(&r, c->m->cat, fwd_moe_block(c->m->cat, 0), 1 + i % 3, 4, 2,
		             MOEK_ACT_F32, c->id * 1000 + i, false);
		r.q.client = c->id;
		r.q.immediate_ready = no_delivery;
		r.q.settle_later = true;
		struct forward_result res, ref;
		const int rc = forward_run(c->e, &r.q, r.out, r.out_def, &res);
		c->pending += res.deferred_pending;
		forward_settle(c->e);
		r.q.immediate_ready = NULL;
		r.q.settle_later = false;
		const int rc_ref =
		    rc == MOE_OK ? forward_reference(c->e, &r.q, r.ref, r.ref_def, &ref) : 0;
		if (rc != MOE_OK || rc_ref != MOE_OK ||
		    fwd_first_diff(r.out, r.ref, r.q.n_tokens * h) >= 0 ||
		    fwd_first_diff(r.out_def, r.ref_def, r.q.n_tokens * h) >= 0)
			caller_bad(c, i, rc, &res, rc_ref, &ref);
		fwd_req_free(&r);
	}
	return NULL;
}

static void *poke(void *arg)
{
	struct caller *c = arg;
	struct forward_layer_stats layers[2];
	for (uint32_t i = 0; i < 200; i++) {
		int32_t ids[2] = {(int32_t)(i % 16), (int32_t)((i * 7) % 16)};
		forward_prefetch(c->e, fwd_moe_block(c->m->cat, i % 2), ids, NULL, 2, false);
		uint8_t bits[2] = {0, (uint8_t)(i & 0x80)}; /* expert 15 sometimes, client 9 only */
		forward_set_mask(c->e, 9, fwd_moe_block(c->m->cat, 0), bits, 2);
		struct forward_stats st = {.layers = layers};
		forward_stats(c->e, &st);
	}
	forward_client_detach(c->e, 9);
	return NULL;
}

static void check_concurrent(void)
{
	struct fwd_model m;
	char err[256];
	struct fwd_model_spec spec = {"qwen3-30b-a3b", MOEK_Q8_0, true, 2, 16, 64, 64, false};
	if (fwd_model_make(&m, &spec, err, sizeof(err)) != 0) {
		CHECK(0, "model: %s", err);
		return;
	}
	const struct setup s = {"concurrent, residency 40%",
	                        FORWARD_SOURCE_RESIDENCY,
	                        FORWARD_NUMA_SYNTHETIC,
	                        "pack:1 numa:2 core:1 pu:1",
	                        1,
	                        40};
	struct forward_engine *e = make_engine(&m, &s, 4);
	if (e) {
		struct caller c[3] = {{e, &m, 0, 0, 0}, {e, &m, 1, 0, 0}, {e, &m, 2, 0, 0}};
		/* The callers are attached clients, as channels are: client 9's mask alone then
		 * never masks an expert for them (the residency gets the attached clients'
		 * intersection; unattached, theirs would be client 9's). */
		forward_client_attach(e, 0);
		forward_client_attach(e, 1);
		pthread_t t[3];
		pthread_create(&t[0], NULL, run_requests, &c[0]);
		pthread_create(&t[1], NULL, run_requests, &c[1]);
		pthread_create(&t[2], NULL, poke, &c[2]);
		for (int i = 0; i < 3; i++)
			pthread_join(t[i], NULL);
		CHECK(c[0].bad == 0 && c[1].bad == 0,
		      "concurrent callers: %d + %d bad results: %s%s", c[0].bad, c[1].bad, c[0].why,
		      c[1].why);
		struct forward_stats st = {0};
		forward_stats(e, &st);
		CHECK(st.requests == 60, "concurrent: %llu requests counted, expected 60",
		      (unsigned long long)st.requests);
		CHECK(st.resident_bytes <= st.budget_bytes, "concurrent: over budget");
		forward_destroy(e);
	}
	/* Two workers on one node, every expert fitting: deferred parts are left running (not
	 * every one: a request whose deferred experts are all also immediate for another token,
	 * or not yet resident, has nothing to leave running). */
	const struct setup d = {"concurrent deferring, 1 node, 2 threads",
	                        FORWARD_SOURCE_RESIDENCY,
	                        FORWARD_NUMA_AUTO,
	                        NULL,
	                        2,
	                        0};
	e = make_engine(&m, &d, 4);
	if (e) {
		/* no poke: its GPU masks would fail some of these requests' experts at random */
		struct caller c[2] = {{e, &m, 0, 0, 0}, {e, &m, 1, 0, 0}};
		pthread_t t[2];
		pthread_create(&t[0], NULL, run_deferring, &c[0]);
		pthread_create(&t[1], NULL, run_deferring, &c[1]);
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
		CHECK(c[0].bad == 0 && c[1].bad == 0, "%s: %d + %d bad results: %s%s", d.name,
		      c[0].bad, c[1].bad, c[0].why, c[1].why);
		CHECK(c[0].pending + c[1].pending > 0, "%s: no deferred part left running", d.name);
		forward_destroy(e);
	}
	fwd_model_free(&m);
}

int main(void)
{
	check_model("qwen3-30b-a3b", MOEK_Q4_K, true, 256, 512);
	check_model("qwen3-30b-a3b", MOEK_F32, true, 64, 128);
	check_model("gpt-oss-20b", MOEK_MXFP4, false, 256, 512);
	check_concurrent();
	if (failures) {
		fprintf(stderr, "forward_threads: %d failures\n", failures);
		return 1;
	}
	printf("forward_threads: pass\n");
	return 0;
}
