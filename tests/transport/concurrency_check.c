/* concurrency_check.c — the concurrency checks as a plain program (no Criterion), so that
 * they also run under ThreadSanitizer: Criterion 2.4 cannot start under TSan ("Could not
 * initialize inheritable arena", Snaipe/Criterion#274).
 *
 * 1. the ring between two threads, spinning and with futex sleeps, every element checked;
 * 2. a real sidecar (built with the same sanitizer) serving two client threads with
 *    verified ECHOs while a third thread connects and disconnects in a loop (the control
 *    thread adds and removes channels while the dispatcher serves), then SIGTERM: the
 *    sidecar must exit 0 — a data race found by TSan in it makes it exit non-zero.
 * Exit status 0 = pass. Registered with ctest under the label `concurrent`.
 */
#include <pthread.h>
#include <sched.h>
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
#include "moe_ring.h"

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "concurrency_check: %s:%d: ", __FILE__, __LINE__);         \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* ---- 1. ring -------------------------------------------------------------------------- */

#define RING_ENTRIES 16u

struct ring_run {
	struct moe_ring_ctrl ctrl;
	uint64_t slot[RING_ENTRIES];
	struct moe_ring_prod p;
	struct moe_ring_cons c;
	uint64_t n, sum_in, sum_out;
	int sleepy;
};

static void *ring_producer(void *arg)
{
	struct ring_run *r = arg;
	for (uint64_t i = 0; i < r->n;) {
		int64_t room = moe_ring_space(&r->p);
		CHECK(room != MOE_RING_BROKEN, "producer saw a broken head");
		if (room == 0) {
			sched_yield();
			continue;
		}
		uint32_t k = 0;
		for (; k < room && i < r->n; k++, i++) {
			uint64_t v = (i + 1) * 0x9e3779b97f4a7c15ull;
			r->slot[moe_ring_prod_pos(&r->p, k)] = v;
			r->sum_in += v * (i + 1);
		}
		moe_ring_publish(&r->p, k);
		moe_ring_wake_consumer(&r->p);
	}
	return NULL;
}

static void *ring_consumer(void *arg)
{
	struct ring_run *r = arg;
	for (uint64_t i = 0; i < r->n;) {
		int64_t ready = moe_ring_ready(&r->c);
		CHECK(ready != MOE_RING_BROKEN, "consumer saw a broken tail");
		if (ready == 0) {
			if (!r->sleepy) {
				sched_yield();
				continue;
			}
			moe_ring_announce_sleep(&r->c);
			if (moe_ring_ready(&r->c) == 0)
				moe_ring_consumer_wait(&r->c, -1); /* a lost wake-up hangs here */
			moe_ring_unannounce(&r->c);
			continue;
		}
		for (int64_t k = 0; k < ready; k++, i++)
			r->sum_out += r->slot[moe_ring_cons_pos(&r->c, (uint32_t)k)] * (i + 1);
		moe_ring_consume(&r->c, (uint32_t)ready);
	}
	return NULL;
}

static void check_ring(int sleepy)
{
	struct ring_run *r = calloc(1, sizeof(*r));
	const uint32_t start = UINT32_MAX - 100;
	moe_ring_ctrl_init(&r->ctrl, start);
	moe_ring_prod_attach(&r->p, &r->ctrl, RING_ENTRIES, start);
	moe_ring_cons_attach(&r->c, &r->ctrl, RING_ENTRIES, start);
	r->n = sleepy ? 20000 : 200000;
	r->sleepy = sleepy;
	pthread_t a, b;
	pthread_create(&b, NULL, ring_consumer, r);
	pthread_create(&a, NULL, ring_producer, r);
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	CHECK(r->sum_in == r->sum_out, "ring (%s): checksum differs", sleepy ? "sleepy" : "spin");
	free(r);
}

/* ---- 2. sidecar with concurrent clients ---------------------------------------------- */

struct client_run {
	const char *socket;
	int id;
	int failed;
};

static void *echo_thread(void *arg)
{
	struct client_run *cr = arg;
	struct moe_connect_opts o = {.socket_path = cr->socket,
	                             .max_tokens = 8,
	                             .hidden = 64,
	                             .n_slots = 2,
	                             .client_name = "tsan-echo"};
	struct moe_client *c;
	if (moe_connect(&o, &c) != MOE_OK) {
		cr->failed = 1;
		return NULL;
	}
	struct moe_slot s;
	moe_slot_acquire(c, &s);
	float in[8 * 64];
	uint16_t want[8 * 64];
	for (int it = 0; it < 300 && !cr->failed; it++) {
		for (int k = 0; k < 8 * 64; k++)
			in[k] = (float)(k * (it + 1) % 977) - 400.0f;
		memcpy(s.input, in, sizeof(in));
		moek_convert(MOE_DTYPE_BF16, want, MOE_DTYPE_F32, in, 8 * 64);
		struct moe_request r = {.op = MOE_OP_ECHO,
		                        .slot = s.index,
		                        .n_tokens = 8,
		                        .in_dtype = MOE_DTYPE_F32,
		                        .out_dtype = MOE_DTYPE_BF16,
		                        .user_data = (uint64_t)it};
		struct moe_completion d;
		if (moe_submit(c, &r) != MOE_OK || moe_wait(c, &d, 20000) != MOE_OK ||
		    d.status != MOE_OK || memcmp(s.output, want, sizeof(want)) != 0)
			cr->failed = 1;
	}
	moe_close(c);
	return NULL;
}

static void *churn_thread(void *arg)
{
	struct client_run *cr = arg;
	for (int i = 0; i < 40; i++) {
		struct moe_connect_opts o = {.socket_path = cr->socket,
		                             .max_tokens = 2,
		                             .hidden = 16,
		                             .client_name = "tsan-churn"};
		struct moe_client *c;
		if (moe_connect(&o, &c) != MOE_OK || (i % 2 == 0 && moe_ping(c, 20000) != MOE_OK))
			cr->failed = 1;
		moe_close(c);
	}
	return NULL;
}

static void check_sidecar(void)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	CHECK(sidecar_start(&sp, NULL, NULL) == 0, "the sidecar did not start");
	struct client_run runs[3] = {{sp.socket, 0, 0}, {sp.socket, 1, 0}, {sp.socket, 2, 0}};
	pthread_t t[3];
	pthread_create(&t[0], NULL, echo_thread, &runs[0]);
	pthread_create(&t[1], NULL, echo_thread, &runs[1]);
	pthread_create(&t[2], NULL, churn_thread, &runs[2]);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < 3; i++)
		CHECK(!runs[i].failed, "client thread %d failed (log: %s)", i, sp.log);
	int st = sidecar_stop(&sp, SIGTERM);
	if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
		char *log = slurp(sp.log);
		fprintf(stderr, "%s\n", log ? log : "(no log)");
		free(log);
		CHECK(0, "the sidecar did not exit cleanly (status 0x%x)", st);
	}
	sidecar_cleanup(&sp);
}

int main(void)
{
	check_ring(0);
	check_ring(1);
	check_sidecar();
	printf("concurrency_check: ok\n");
	return 0;
}
