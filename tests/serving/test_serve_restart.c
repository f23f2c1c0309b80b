/* test_serve_restart.c — co-launch and restart from the engine's side: a client started
 * before the sidecar connects once it serves (within its timeout), and a client whose sidecar
 * was killed (-9) and restarted on the same socket gets its channel back with moe_reconnect —
 * the same outputs bit for bit, its GPU mask in force again, the request in flight at the
 * death failed once — while a restart on another model is refused. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe_kernels.h"
#include "serve_fixture.h"

struct early_client {
	const char *socket;
	int started[2]; /* the thread writes one byte just before moe_connect */
	int rc;
	char why[256];
	struct moe_client *c;
};

static void *connect_early(void *arg)
{
	struct early_client *e = arg;
	struct moe_connect_opts o = {
	    .socket_path = e->socket, .max_tokens = 64, .n_slots = 4, .timeout_ms = 60000};
	if (write(e->started[1], "s", 1) != 1)
		return NULL;
	e->rc = moe_connect(&o, &e->c);
	snprintf(e->why, sizeof(e->why), "%s", moe_connect_error());
	return NULL;
}

/* The engine is launched first: its moe_connect is running before the sidecar process
 * exists (the socket's directory does not either), and returns once the sidecar serves. */
Test(restart, a_client_started_first_connects_once_the_sidecar_serves)
{
	struct served s;
	memset(&s, 0, sizeof(s));
	harness_tempdir(&s.sp);
	snprintf(s.model, sizeof(s.model), "%s/model.gguf", s.sp.dir);
	cr_assert_eq(ref_generate(s.model, "q8_0", 7), 0);
	struct early_client e = {.socket = s.sp.socket, .rc = 1};
	cr_assert_eq(pipe(e.started), 0);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, connect_early, &e), 0);
	char b;
	cr_assert_eq(read(e.started[0], &b, 1), 1);
	const char *const extra[] = {s.model, NULL};
	cr_assert_eq(sidecar_start(&s.sp, extra, NULL), 0);
	pthread_join(t, NULL);
	cr_assert_eq(e.rc, MOE_OK, "%s: %s", moe_strerror(e.rc), e.why);
	s.c = e.c;
	s.ref = ref_open(s.model);
	cr_assert_not_null(s.ref);
	const struct moe_info *inf = moe_info(s.c);
	struct fwd_case fc;
	fwd_case_make(&fc, 3, (int32_t)inf->first_moe_layer, 2, 4, inf->n_experts, inf->hidden,
	              false);
	cr_assert_eq(served_forward(&s, &fc, NULL, NULL), MOE_OK, "%s", moe_last_error(s.c));
	fwd_case_free(&fc);
	close(e.started[0]);
	close(e.started[1]);
	served_stop(&s);
}

Test(restart, nowait_with_nothing_at_the_path_fails_at_once)
{
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {.socket_path = "/nonexistent-moe/s.sock",
	                             .timeout_ms = MOE_CONNECT_NOWAIT};
	cr_assert_eq(moe_connect(&o, &c), MOE_ECONNECT);
	cr_expect(strstr(moe_connect_error(), "is moe-sidecar serve running?"), "%s",
	          moe_connect_error());
	cr_expect_not(strstr(moe_connect_error(), "after waiting"), "%s", moe_connect_error());
}

Test(restart, waiting_for_nothing_says_how_long_it_waited)
{
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {.socket_path = "/nonexistent-moe/s.sock", .timeout_ms = 50};
	cr_assert_eq(moe_connect(&o, &c), MOE_ECONNECT);
	cr_expect(strstr(moe_connect_error(), "after waiting 50 ms"), "%s", moe_connect_error());
}

static void restart_sidecar(struct served *s, const char *model)
{
	cr_assert_eq(sidecar_stop(&s->sp, SIGKILL) & 0x7f, SIGKILL);
	const char *const extra[] = {model, NULL};
	int st = 0;
	cr_assert_eq(sidecar_start(&s->sp, extra, &st), 0, "restart: status 0x%x", st);
}

/* The bits a synchronous FORWARD of fc gives now. */
static float *forward_bits(struct served *s, const struct fwd_case *fc)
{
	const size_t n = (size_t)fc->n_tokens * moe_info(s->c)->hidden;
	float *out = malloc(n * sizeof(float));
	cr_assert_not_null(out);
	int rc = served_forward(s, fc, out, NULL);
	cr_assert_eq(rc, MOE_OK, "%s: %s", moe_strerror(rc), moe_last_error(s->c));
	return out;
}

Test(restart, reconnect_after_kill9_gives_the_same_bits_and_the_mask_again)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const struct moe_info *inf = moe_info(s.c);
	const int32_t layer = (int32_t)inf->first_moe_layer;
	const size_t row = (inf->n_experts + 7) / 8;
	uint8_t bits[4096] = {0};
	bits[0] = 0x01; /* expert 0 of the first MoE block on the GPU */
	cr_assert_eq(moe_set_gpu_mask(s.c, layer, bits, row, 5000), MOE_OK, "%s",
	             moe_last_error(s.c));
	struct fwd_case fc, masked;
	fwd_case_make(&fc, 11, layer, 3, 4, inf->n_experts, inf->hidden, false);
	for (uint32_t i = 0; i < 3 * 4; i++)
		if (fc.ids[i] == 0)
			fc.ids[i] = -1; /* never the GPU's expert */
	fwd_case_make(&masked, 12, layer, 1, 4, inf->n_experts, inf->hidden, false);
	masked.ids[0] = 0;
	for (int j = 1; j < 4; j++)
		masked.ids[j] = masked.ids[j] == 0 ? j : masked.ids[j];
	float *before = forward_bits(&s, &fc);
	cr_assert_eq(served_forward(&s, &masked, NULL, NULL), MOE_EMASKED);

	/* A request in flight when the sidecar dies fails, once. */
	struct moe_slot slot;
	cr_assert_eq(moe_slot_acquire(s.c, &slot), MOE_OK);
	memcpy(slot.input, fc.x_wire, (size_t)3 * inf->hidden * sizeof(float));
	memcpy(slot.expert_ids, fc.ids, 12 * sizeof(int32_t));
	memcpy(slot.expert_weights, fc.weights, 12 * sizeof(float));
	cr_assert_eq(sidecar_stop(&s.sp, SIGKILL) & 0x7f, SIGKILL);
	int rc =
	    moe_forward_submit(s.c, slot.index, layer, 3, 4, 0, MOE_DTYPE_F32, MOE_DTYPE_F32, 0);
	struct moe_completion d;
	if (rc == MOE_OK)
		rc = moe_forward_wait(s.c, slot.index, &d, 10000);
	cr_assert_eq(rc, MOE_EPEERDEAD, "%s", moe_strerror(rc));
	cr_assert_eq(moe_ping(s.c, 1000), MOE_EPEERDEAD, "dead until reconnected");

	const char *const extra[] = {s.model, NULL};
	cr_assert_eq(sidecar_start(&s.sp, extra, NULL), 0);
	rc = moe_reconnect(s.c, 20000);
	cr_assert_eq(rc, MOE_OK, "%s: %s", moe_strerror(rc), moe_last_error(s.c));
	inf = moe_info(s.c);
	float *after = forward_bits(&s, &fc);
	cr_expect_eq(memcmp(before, after, (size_t)3 * inf->hidden * sizeof(float)), 0,
	             "the restarted sidecar computes the same bits");
	cr_expect_eq(served_forward(&s, &masked, NULL, NULL), MOE_EMASKED,
	             "the GPU mask was applied again");
	free(before);
	free(after);
	fwd_case_free(&fc);
	fwd_case_free(&masked);
	served_stop(&s);
}

Test(restart, reconnect_to_another_model_is_refused_and_stays_dead)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	char other[200];
	snprintf(other, sizeof(other), "%s/other.gguf", s.sp.dir);
	cr_assert_eq(ref_generate(other, "q8_0", 8), 0);
	restart_sidecar(&s, other);
	cr_assert_eq(moe_ping(s.c, 1000), MOE_EPEERDEAD);
	int rc = moe_reconnect(s.c, 20000);
	cr_assert_eq(rc, MOE_EREFUSED, "%s: %s", moe_strerror(rc), moe_last_error(s.c));
	cr_expect(strstr(moe_last_error(s.c), "expects"), "%s", moe_last_error(s.c));
	cr_expect_eq(moe_ping(s.c, 1000), MOE_EPEERDEAD, "a refused reconnect leaves it dead");
	restart_sidecar(&s, s.model);
	cr_assert_eq(moe_reconnect(s.c, 20000), MOE_OK, "%s", moe_last_error(s.c));
	cr_expect_eq(moe_ping(s.c, 5000), MOE_OK);
	served_stop(&s);
}
