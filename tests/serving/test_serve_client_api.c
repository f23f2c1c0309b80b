/* test_serve_client_api.c — what an engine sees through libmoe_client's API against a real
 * `serve MODEL`: the sidecar's error sentences and offending values, requests collected per
 * slot in any order, recovery after a timeout, abandoned slots, the channel region and fixed
 * slot addresses, exact GPU-mask sizes, the MoE layer list, the model fingerprint demanded at
 * connect, and a dead sidecar seen by moe_slot_acquire.
 *
 * A sidecar stopped with SIGSTOP cannot complete anything: that is how a request is kept in
 * flight for as long as a test needs, without timing assumptions.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe_kernels.h"
#include "serve_fixture.h"

/* SIGSTOP, returning once the sidecar (our child) has stopped: it completes nothing more. */
static void stop_sidecar(struct served *s)
{
	cr_assert_eq(kill(s->sp.pid, SIGSTOP), 0);
	int st;
	cr_assert_eq(waitpid(s->sp.pid, &st, WUNTRACED), s->sp.pid);
	cr_assert(WIFSTOPPED(st), "the sidecar stopped (status 0x%x)", st);
}

static void fill_slot(struct served *s, const struct moe_slot *slot, const struct fwd_case *fc)
{
	const size_t n = (size_t)fc->n_tokens * moe_info(s->c)->hidden;
	memcpy(slot->input, fc->x, n * sizeof(float));
	memcpy(slot->expert_ids, fc->ids, (size_t)fc->n_tokens * fc->k * sizeof(int32_t));
	memcpy(slot->expert_weights, fc->weights, (size_t)fc->n_tokens * fc->k * sizeof(float));
}

Test(client_api, a_bad_forward_returns_the_sidecars_sentence_and_value)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const struct moe_info *inf = moe_info(s.c);
	struct fwd_case fc;
	fwd_case_make(&fc, 1, 0, 2, 4, inf->n_experts, inf->hidden, false);
	fc.ids[1 * 4 + 2] = -5; /* token 1, position 2 */
	struct moe_completion d;
	cr_assert_eq(served_forward(&s, &fc, NULL, &d), MOE_EBADEXPERT);
	cr_assert_eq((int32_t)d.value, -5, "the id as it was sent, not 0 (value %u)", d.value);
	cr_assert_eq(d.index, 1 * 4 + 2);
	cr_assert_not_null(d.message, "an ABI 1.1 sidecar says why");
	cr_assert(strstr(d.message, "expert -5 out of range"), "message: %s", d.message);
	cr_assert(strstr(moe_last_error(s.c), "expert -5 out of range"), "last error: %s",
	          moe_last_error(s.c));

	/* The last MoE layer cannot defer. */
	fwd_case_free(&fc);
	const int32_t last = (int32_t)(inf->first_moe_layer + inf->n_moe_layers - 1);
	fwd_case_make(&fc, 2, last, 1, 4, inf->n_experts, inf->hidden, false);
	fc.k_defer = 1;
	cr_assert_eq(served_forward(&s, &fc, NULL, &d), MOE_EBADFIELD);
	cr_assert(d.message && strstr(d.message, "is the last MoE layer: nothing may be deferred"),
	          "message: %s", d.message ? d.message : "(none)");

	/* Errors found before the request reaches the engine have sentences too. */
	struct moe_slot slot;
	cr_assert_eq(moe_slot_acquire(s.c, &slot), MOE_OK);
	cr_assert_eq(moe_forward(s.c, &slot, 0, 1, (uint16_t)(inf->top_k + 1), 0, MOE_DTYPE_F32,
	                         MOE_DTYPE_F32, 0, &d, 5000),
	             MOE_EBADTOPK);
	cr_assert(d.message && strstr(d.message, "ids_per_token"), "message: %s",
	          d.message ? d.message : "(none)");
	cr_assert_eq(moe_slot_release(s.c, slot.index), MOE_OK);
	cr_assert(log_wait(&s.sp, "bad request", 1, 5000), "the sidecar logs bad requests at warn");
	fwd_case_free(&fc);
	served_stop(&s);
}

Test(client_api, requests_are_collected_per_slot_in_any_order)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const struct moe_info *inf = moe_info(s.c);
	enum { N = 3 };
	struct fwd_case fc[N];
	float *want[N];
	for (int i = 0; i < N; i++) {
		fwd_case_make(&fc[i], 10 + i, (int32_t)inf->first_moe_layer + i, 2, 4,
		              inf->n_experts, inf->hidden, false);
		want[i] = malloc(2 * inf->hidden * sizeof(float));
		cr_assert_eq(served_forward(&s, &fc[i], want[i], NULL), MOE_OK);
	}
	struct moe_slot slot[N];
	for (int i = 0; i < N; i++) {
		cr_assert_eq(moe_slot_acquire(s.c, &slot[i]), MOE_OK);
		fill_slot(&s, &slot[i], &fc[i]);
		cr_assert_eq(moe_forward_submit(s.c, slot[i].index, fc[i].layer, 2, 4, 0,
		                                MOE_DTYPE_F32, MOE_DTYPE_F32, 0),
		             MOE_OK);
	}
	for (int i = N - 1; i >= 0; i--) { /* the last submitted first */
		struct moe_completion d;
		cr_assert_eq(moe_forward_wait(s.c, slot[i].index, &d, 10000), MOE_OK, "%s",
		             moe_last_error(s.c));
		cr_assert_eq(d.slot, slot[i].index);
		cr_assert_eq(memcmp(slot[i].output, want[i], 2 * inf->hidden * sizeof(float)), 0,
		             "slot %d: the same bits as the synchronous FORWARD", i);
		cr_assert_eq(moe_forward_wait(s.c, slot[i].index, &d, 0), MOE_EINVAL,
		             "collected once");
		cr_assert_eq(moe_slot_release(s.c, slot[i].index), MOE_OK);
	}
	struct moe_completion d;
	cr_assert_eq(moe_poll(s.c, &d), MOE_EAGAIN, "nothing left over, nothing lost");
	for (int i = 0; i < N; i++) {
		fwd_case_free(&fc[i]);
		free(want[i]);
	}
	served_stop(&s);
}

Test(client_api, a_timed_out_request_is_collected_later_or_abandoned)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const struct moe_info *inf = moe_info(s.c);
	struct fwd_case fc;
	fwd_case_make(&fc, 20, (int32_t)inf->first_moe_layer, 1, 4, inf->n_experts, inf->hidden,
	              false);
	struct moe_slot slot;
	cr_assert_eq(moe_slot_acquire(s.c, &slot), MOE_OK);
	fill_slot(&s, &slot, &fc);

	stop_sidecar(&s);
	cr_assert_eq(
	    moe_forward_submit(s.c, slot.index, fc.layer, 1, 4, 0, MOE_DTYPE_F32, MOE_DTYPE_F32, 0),
	    MOE_OK);
	struct moe_completion d;
	cr_assert_eq(moe_forward_poll(s.c, slot.index, &d), MOE_EAGAIN);
	cr_assert_eq(moe_forward_wait(s.c, slot.index, &d, 50), MOE_ETIMEDOUT);
	cr_assert_eq(moe_slot_release(s.c, slot.index), MOE_EINVAL, "still in flight");
	cr_assert_eq(kill(s.sp.pid, SIGCONT), 0);
	cr_assert_eq(moe_forward_wait(s.c, slot.index, &d, 10000), MOE_OK,
	             "collected after the timeout: %s", moe_last_error(s.c));
	cr_assert_eq(d.slot, slot.index);

	/* Abandoned in flight: the slot comes back when its completion arrives, not before. */
	stop_sidecar(&s);
	cr_assert_eq(
	    moe_forward_submit(s.c, slot.index, fc.layer, 1, 4, 0, MOE_DTYPE_F32, MOE_DTYPE_F32, 0),
	    MOE_OK);
	cr_assert_eq(moe_slot_abandon(s.c, slot.index), MOE_OK);
	struct moe_slot others[8];
	uint32_t n = 0;
	while (moe_slot_acquire(s.c, &others[n]) == MOE_OK)
		n++;
	cr_assert_eq(n, inf->n_slots - 1, "the abandoned slot is not free yet");
	cr_assert_eq(kill(s.sp.pid, SIGCONT), 0);
	/* FORWARDs of one channel complete in submission order: once this one is collected,
	 * the abandoned one's completion has been taken (and dropped) on the way. */
	fill_slot(&s, &others[0], &fc);
	cr_assert_eq(moe_forward(s.c, &others[0], fc.layer, 1, 4, 0, MOE_DTYPE_F32, MOE_DTYPE_F32,
	                         0, &d, 10000),
	             MOE_OK);
	cr_assert_eq(moe_poll(s.c, &d), MOE_EAGAIN, "the abandoned completion was dropped");
	cr_assert_eq(moe_slot_acquire(s.c, &slot), MOE_OK, "the abandoned slot is free again");
	cr_assert_eq(moe_slot_acquire(s.c, &others[n]), MOE_EAGAIN, "and nothing else is");
	fwd_case_free(&fc);
	served_stop(&s);
}

Test(client_api, the_channel_region_holds_every_slot_at_fixed_offsets)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const struct moe_info *inf = moe_info(s.c);
	void *base;
	size_t bytes;
	cr_assert_eq(moe_channel_region(s.c, &base, &bytes), MOE_OK);
	cr_assert_eq((uintptr_t)base % 4096, 0, "page aligned (cudaHostRegister)");
	cr_assert_eq(bytes, inf->channel_bytes);
	for (uint32_t i = 0; i < inf->n_slots; i++) {
		struct moe_slot v;
		cr_assert_eq(moe_slot_view(s.c, i, &v), MOE_OK);
		cr_assert_eq((char *)base + v.input_off, (char *)v.input);
		cr_assert_eq((char *)base + v.ids_off, (char *)v.expert_ids);
		cr_assert_eq((char *)base + v.weights_off, (char *)v.expert_weights);
		cr_assert_eq((char *)base + v.output_off, (char *)v.output);
		cr_assert_leq(v.output_off + v.output_bytes, bytes);
		cr_assert_eq(v.input_bytes, (size_t)inf->max_tokens * inf->hidden * 4);
		cr_assert_eq(v.ids_bytes, (size_t)inf->max_tokens * inf->top_k * 4);
	}
	struct moe_slot v;
	cr_assert_eq(moe_slot_view(s.c, inf->n_slots, &v), MOE_EINVAL);
	struct moe_slot a;
	memset(&a, 0, sizeof(a)); /* padding, for the memcmp */
	memset(&v, 0, sizeof(v));
	cr_assert_eq(moe_slot_acquire(s.c, &a), MOE_OK);
	cr_assert_eq(moe_slot_view(s.c, a.index, &v), MOE_OK);
	cr_assert_eq(memcmp(&a, &v, sizeof(a)), 0, "acquire and view agree");
	cr_assert_eq(moe_slot_release(s.c, a.index), MOE_OK);
	served_stop(&s);
}

Test(client_api, a_gpu_mask_must_have_the_exact_size)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const struct moe_info *inf = moe_info(s.c);
	const size_t row = (inf->n_experts + 7) / 8;
	uint8_t bits[4096] = {0};
	cr_assert_eq(moe_set_gpu_mask(s.c, 0, bits, row - 1, 5000), MOE_EINVAL);
	cr_assert(strstr(moe_last_error(s.c), "exactly"), "%s", moe_last_error(s.c));
	cr_assert_eq(moe_set_gpu_mask(s.c, 0, bits, row + 1, 5000), MOE_EINVAL);
	cr_assert_eq(moe_set_gpu_mask(s.c, -1, bits, row, 5000), MOE_EINVAL);
	cr_assert_eq(moe_set_gpu_mask(s.c, (int32_t)inf->n_layers, bits, row, 5000), MOE_EINVAL);
	bits[0] = 0x01; /* expert 0 of block 0 on the GPU */
	cr_assert_eq(moe_set_gpu_mask(s.c, 0, bits, row, 5000), MOE_OK, "%s", moe_last_error(s.c));
	struct fwd_case fc;
	fwd_case_make(&fc, 30, 0, 1, 4, inf->n_experts, inf->hidden, false);
	fc.ids[2] = 0;
	fc.ids[0] = fc.ids[0] == 0 ? 1 : fc.ids[0];
	fc.ids[1] = fc.ids[1] == 0 ? 2 : fc.ids[1];
	fc.ids[3] = fc.ids[3] == 0 ? 3 : fc.ids[3];
	struct moe_completion d;
	cr_assert_eq(served_forward(&s, &fc, NULL, &d), MOE_EMASKED);
	cr_assert_eq(d.value, 0);
	memset(bits, 0, sizeof(bits));
	cr_assert_eq(moe_set_gpu_mask(s.c, -1, bits, row * inf->n_layers, 5000), MOE_OK);
	cr_assert_eq(served_forward(&s, &fc, NULL, &d), MOE_OK, "unmasked again");
	fwd_case_free(&fc);
	served_stop(&s);
}

Test(client_api, the_moe_layers_are_listed)
{
	struct served s; /* deepseek-v3's preset has a leading dense block */
	served_start_preset(&s, "deepseek-v3", "q8_0", false, NULL);
	const struct moe_info *inf = moe_info(s.c);
	int32_t layers[256];
	int n = moe_model_layers(s.c, layers, 256);
	cr_assert_eq(n, (int)inf->n_moe_layers);
	cr_assert_gt(inf->n_layers, inf->n_moe_layers, "the preset has dense blocks");
	cr_assert_eq(layers[0], (int32_t)inf->first_moe_layer);
	for (int i = 1; i < n; i++)
		cr_assert_gt(layers[i], layers[i - 1]);
	cr_assert_eq(moe_model_layers(s.c, NULL, 0), n, "the count alone");
	int32_t one;
	cr_assert_eq(moe_model_layers(s.c, &one, 1), n, "the count, one written");
	cr_assert_eq(one, layers[0]);
	served_stop(&s);
}

Test(client_api, the_model_fingerprint_is_checked_at_connect)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const struct moe_info *inf = moe_info(s.c);
	char fp[33];
	cr_assert_eq(moe_model_fingerprint(s.model, fp), MOE_OK, "%s", moe_connect_error());
	cr_assert_eq(strlen(inf->fingerprint), 32);
	cr_assert_str_eq(inf->fingerprint, fp, "the sidecar and the client agree");

	struct moe_client *c2;
	struct moe_connect_opts o = {.socket_path = s.sp.socket, .expect_model = fp};
	cr_assert_eq(moe_connect(&o, &c2), MOE_OK, "%s", moe_connect_error());
	moe_close(c2);

	/* Another checkpoint of the same shape: same generator, another seed. */
	char other[200];
	snprintf(other, sizeof(other), "%s/other.gguf", s.sp.dir);
	cr_assert_eq(ref_generate_preset(other, "qwen3-30b-a3b", "q8_0", 8), 0);
	char fp2[33];
	cr_assert_eq(moe_model_fingerprint(other, fp2), MOE_OK);
	cr_assert_str_neq(fp, fp2, "same shape, other weights: another fingerprint");
	o.expect_model = fp2;
	cr_assert_eq(moe_connect(&o, &c2), MOE_EREFUSED);
	cr_assert_null(c2);
	cr_assert(strstr(moe_connect_error(), fp) && strstr(moe_connect_error(), fp2),
	          "both fingerprints named: %s", moe_connect_error());

	o.expect_model = "not-a-fingerprint";
	cr_assert_eq(moe_connect(&o, &c2), MOE_EINVAL);
	cr_assert_eq(moe_model_fingerprint("/nonexistent/model.gguf", fp2), MOE_ESYS);
	cr_assert(strstr(moe_connect_error(), "/nonexistent/model.gguf"), "%s",
	          moe_connect_error());
	served_stop(&s);
}

Test(client_api, acquire_after_the_sidecar_died_says_so)
{
	struct served s;
	served_start(&s, "q8_0", NULL);
	const struct moe_info *inf = moe_info(s.c);
	stop_sidecar(&s);
	for (uint32_t i = 0; i < inf->n_slots; i++) {
		struct moe_slot slot;
		cr_assert_eq(moe_slot_acquire(s.c, &slot), MOE_OK);
		struct moe_request r = {.op = MOE_OP_PING, .slot = slot.index};
		cr_assert_eq(moe_submit(s.c, &r), MOE_OK);
	}
	cr_assert_eq(kill(s.sp.pid, SIGKILL), 0);
	int st;
	cr_assert_eq(waitpid(s.sp.pid, &st, 0), s.sp.pid);
	struct moe_slot slot;
	cr_assert_eq(moe_slot_acquire(s.c, &slot), MOE_EPEERDEAD, "not 'all slots in use': %s",
	             moe_last_error(s.c));
	moe_close(s.c);
	ref_close(s.ref);
	sidecar_cleanup(&s.sp);
}
