/* test_echo.c — a real sidecar and 1–4 client processes doing ECHO through their channels,
 * every dtype pair, 1 token to the maximum, several slots in flight, every payload
 * verified against moek_convert done locally. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "moe_client.h"
#include "moe_kernels.h"
#include "moe_proto.h"

#define MAX_TOKENS 32u
#define HIDDEN 96u
#define SLOTS 3u

/* Exit codes of a client process: 0 ok, else the step that failed. */
static int echo_client(const char *socket_path, uint64_t seed)
{
	struct moe_connect_opts o = {.socket_path = socket_path,
	                             .max_tokens = MAX_TOKENS,
	                             .hidden = HIDDEN,
	                             .n_slots = SLOTS,
	                             .client_name = "test-echo"};
	struct moe_client *c;
	if (moe_connect(&o, &c) != MOE_OK) {
		fprintf(stderr, "connect: %s\n", moe_connect_error());
		return 10;
	}
	struct moe_slot s[SLOTS];
	for (uint32_t i = 0; i < SLOTS; i++)
		if (moe_slot_acquire(c, &s[i]) != MOE_OK)
			return 11;
	struct moe_slot extra;
	if (moe_slot_acquire(c, &extra) != MOE_EAGAIN)
		return 12; /* all slots taken */
	const size_t max_n = MAX_TOKENS * HIDDEN;
	float *src = malloc(max_n * 4);
	uint8_t *want[SLOTS];
	for (uint32_t i = 0; i < SLOTS; i++)
		want[i] = malloc(max_n * 4);
	uint64_t tag = seed << 32;
	for (unsigned in = 0; in < MOE_DTYPE_COUNT; in++) {
		for (unsigned out = 0; out < MOE_DTYPE_COUNT; out++) {
			for (int round = 0; round < 6; round++) {
				/* Fill every slot with a different size, submit them all, then
				 * collect in whatever order they complete. */
				uint32_t nt[SLOTS];
				for (uint32_t i = 0; i < SLOTS; i++) {
					uint32_t r = (uint32_t)test_rand(&seed);
					nt[i] = round == 0   ? 1
					        : round == 1 ? MAX_TOKENS
					                     : 1 + r % MAX_TOKENS;
					size_t n = (size_t)nt[i] * HIDDEN;
					for (size_t k = 0; k < n; k++)
						src[k] =
						    (float)((int64_t)(test_rand(&seed) % 200001) -
						            100000) *
						    1e-3f;
					moek_convert(in, s[i].input, MOE_DTYPE_F32, src, n);
					moek_convert(out, want[i], in, s[i].input, n);
					memset(s[i].output, 0x5a, s[i].output_bytes);
					struct moe_request r2 = {.op = MOE_OP_ECHO,
					                         .slot = s[i].index,
					                         .n_tokens = nt[i],
					                         .in_dtype = (uint8_t)in,
					                         .out_dtype = (uint8_t)out,
					                         .user_data = ++tag};
					if (moe_submit(c, &r2) != MOE_OK)
						return 13;
					if (moe_slot_release(c, s[i].index) != MOE_EINVAL)
						return 14; /* in flight: not releasable */
				}
				for (uint32_t k = 0; k < SLOTS; k++) {
					struct moe_completion d;
					if (moe_wait(c, &d, 10000) != MOE_OK) {
						fprintf(stderr, "wait: %s\n", moe_last_error(c));
						return 15;
					}
					uint32_t i = 0;
					while (i < SLOTS && s[i].index != d.slot)
						i++;
					if (i == SLOTS || d.status != MOE_OK || d.value != nt[i])
						return 16;
					size_t bytes = (size_t)nt[i] * HIDDEN * moe_dtype_size(out);
					if (memcmp(s[i].output, want[i], bytes) != 0) {
						fprintf(
						    stderr, "%s->%s %u tokens: payload differs\n",
						    moe_dtype_name(in), moe_dtype_name(out), nt[i]);
						return 17;
					}
					/* Nothing beyond the rows was written. */
					const uint8_t *o8 = s[i].output;
					if (bytes < s[i].output_bytes && o8[bytes] != 0x5a)
						return 18;
				}
			}
		}
	}
	struct moe_completion d;
	if (moe_poll(c, &d) != MOE_EAGAIN)
		return 19; /* exactly one completion per request */
	for (uint32_t i = 0; i < SLOTS; i++)
		if (moe_slot_release(c, s[i].index) != MOE_OK)
			return 20;
	moe_close(c);
	return 0;
}

static void run_clients(int n_clients)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	pid_t kids[4];
	for (int i = 0; i < n_clients; i++) {
		kids[i] = fork();
		if (kids[i] == 0)
			_exit(echo_client(sp.socket, 1000u + (uint64_t)i));
	}
	for (int i = 0; i < n_clients; i++) {
		int st;
		cr_assert_eq(waitpid(kids[i], &st, 0), kids[i]);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		          "client %d of %d failed (exit %d, step code)", i, n_clients,
		          WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	}
	cr_assert(log_wait(&sp, "client disconnected", n_clients, 10000));
	cr_assert_eq(log_count(&sp, "errors=0 "), n_clients, "no request failed");
	cr_assert_eq(sidecar_stop(&sp, SIGTERM), 0);
	sidecar_cleanup(&sp);
}

Test(echo, one_client, .timeout = 120)
{
	run_clients(1);
}

Test(echo, four_clients_at_once, .timeout = 240)
{
	run_clients(4);
}
