/* colaunch.c — bench_colaunch: what co-launch and restart cost an engine, in one run.
 *
 *   co-launch  the client's moe_connect starts first (timeout 120 s), then the sidecar is
 *              spawned: spawn → READY (the warm-up, the baseline), READY → connected,
 *              READY → first FORWARD done;
 *   restart    kill -9 under the connected client, spawn again: the FORWARD in flight fails
 *              (EPEERDEAD), moe_reconnect waits for the new sidecar: spawn → READY,
 *              READY → first FORWARD done after reconnecting, kill → that FORWARD;
 *   warm       a FORWARD on the warm channel (median of 50), the unit the gaps are given in.
 *
 * Not a test: figures only. Usage: bench_colaunch [--model PATH] [--runs N]
 * (default: a generated Qwen3-shaped Q8_0 model, 8 MoE layers of 64 experts, hidden 1024).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "moe_client.h"

static double now_ms(void)
{
	return (double)monotonic_ns() / 1e6;
}

struct sidecar {
	pid_t pid;
	int ready; /* read end of --ready-fd */
};

static struct sidecar spawn_sidecar(const char *model, const char *sock, const char *log)
{
	int p[2];
	if (pipe(p) != 0) {
		perror("pipe");
		exit(1);
	}
	struct sidecar s = {.ready = p[0]};
	s.pid = fork();
	if (s.pid == 0) {
		close(p[0]);
		char fd[16];
		snprintf(fd, sizeof(fd), "%d", p[1]);
		FILE *f = freopen(log, "a", stderr);
		(void)f;
		execl(MOE_SIDECAR_BIN, MOE_SIDECAR_BIN, "serve", model, "--socket", sock,
		      "--ready-fd", fd, "--probes-instance", "bench-colaunch", (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	return s;
}

static double wait_ready(struct sidecar *s)
{
	char line[256];
	ssize_t n = read(s->ready, line, sizeof(line));
	close(s->ready);
	if (n <= 0) {
		fprintf(stderr, "bench_colaunch: the sidecar did not start (see its log)\n");
		exit(1);
	}
	return now_ms();
}

/* One FORWARD of one token, top-8, on a fresh slot. */
static int forward(struct moe_client *c)
{
	const moe_info_t *inf = moe_info(c);
	struct moe_slot s;
	int rc = moe_slot_acquire(c, &s);
	if (rc != MOE_OK)
		return rc;
	float *x = s.input;
	for (uint32_t i = 0; i < inf->hidden; i++)
		x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	int32_t *ids = s.expert_ids;
	float *w = s.expert_weights;
	for (uint32_t j = 0; j < 8; j++) {
		ids[j] = (int32_t)(j * 7 % inf->n_experts);
		w[j] = 1.0f / 8;
	}
	int32_t layer = (int32_t)inf->first_moe_layer;
	struct moe_completion d;
	rc = moe_forward(c, &s, layer, 1, 8, 0, MOE_DTYPE_F32, MOE_DTYPE_F32, 0, &d, 60000);
	moe_slot_release(c, s.index);
	return rc;
}

struct early {
	const char *sock;
	struct moe_client *c;
	int rc;
	double connected, forwarded;
};

static void *connect_early(void *arg)
{
	struct early *e = arg;
	struct moe_connect_opts o = {
	    .socket_path = e->sock, .max_tokens = 8, .top_k = 8, .timeout_ms = 120000};
	e->rc = moe_connect(&o, &e->c);
	e->connected = now_ms();
	if (e->rc == MOE_OK)
		e->rc = forward(e->c);
	e->forwarded = now_ms();
	return NULL;
}

/* The reconnect side of a restart, on its own thread so that READY is timed as it comes. */
static void *reconnect_forward(void *arg)
{
	struct early *e = arg;
	e->rc = moe_reconnect(e->c, 120000);
	e->connected = now_ms();
	if (e->rc == MOE_OK)
		e->rc = forward(e->c);
	e->forwarded = now_ms();
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	const char *model = NULL;
	int runs = 3;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--model") && i + 1 < argc)
			model = argv[++i];
		else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
			runs = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: bench_colaunch [--model PATH] [--runs N]\n");
			return 2;
		}
	}
	char dir[] = "/tmp/moe-bench-colaunch.XXXXXX";
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	char gen_model[128], sock[128], log[128], cmd[512];
	snprintf(sock, sizeof(sock), "%s/run/s.sock", dir);
	snprintf(log, sizeof(log), "%s/sidecar.log", dir);
	if (!model) {
		snprintf(gen_model, sizeof(gen_model), "%s/model.gguf", dir);
		snprintf(
		    cmd, sizeof(cmd),
		    "%s --preset qwen3-30b-a3b --layers 8 --experts 64 --hidden 1024 --ffn 512 "
		    "--format q8_0 --out %s --quiet",
		    MOE_GEN_BIN, gen_model);
		if (system(cmd) != 0) {
			fprintf(stderr, "bench_colaunch: generating the model failed\n");
			return 1;
		}
		model = gen_model;
	}
	printf("model %s; %d runs; times in ms (median of the runs)\n", model, runs);
	double *warmup = calloc((size_t)runs, sizeof(double)), *to_conn = calloc((size_t)runs, 8),
	       *to_fwd = calloc((size_t)runs, 8), *re_ready = calloc((size_t)runs, 8),
	       *re_fwd = calloc((size_t)runs, 8), *kill_fwd = calloc((size_t)runs, 8), warm[50];
	for (int r = 0; r < runs; r++) {
		/* Co-launch: the engine first. */
		struct early e = {.sock = sock};
		pthread_t t;
		pthread_create(&t, NULL, connect_early, &e);
		const double spawned = now_ms();
		struct sidecar s = spawn_sidecar(model, sock, log);
		const double ready = wait_ready(&s);
		pthread_join(t, NULL);
		if (e.rc != MOE_OK) {
			fprintf(stderr, "bench_colaunch: %s: %s\n", moe_strerror(e.rc),
			        moe_connect_error());
			return 1;
		}
		warmup[r] = ready - spawned;
		to_conn[r] = e.connected - ready;
		to_fwd[r] = e.forwarded - ready;
		for (int i = 0; i < 50; i++) {
			const double t0 = now_ms();
			if (forward(e.c) != MOE_OK)
				return 1;
			warm[i] = now_ms() - t0;
		}
		/* Restart under the client. */
		const double killed = now_ms();
		kill(s.pid, SIGKILL);
		waitpid(s.pid, NULL, 0);
		int rc = forward(e.c);
		if (rc != MOE_EPEERDEAD) {
			fprintf(stderr, "bench_colaunch: after kill -9: %s\n", moe_strerror(rc));
			return 1;
		}
		pthread_create(&t, NULL, reconnect_forward, &e);
		const double respawned = now_ms();
		s = spawn_sidecar(model, sock, log);
		const double reready = wait_ready(&s);
		pthread_join(t, NULL);
		const double refwd = e.forwarded;
		if (e.rc != MOE_OK) {
			fprintf(stderr, "bench_colaunch: reconnect: %s: %s\n", moe_strerror(e.rc),
			        moe_last_error(e.c));
			return 1;
		}
		re_ready[r] = reready - respawned;
		re_fwd[r] = refwd - reready;
		kill_fwd[r] = refwd - killed;
		moe_close(e.c);
		kill(s.pid, SIGTERM);
		waitpid(s.pid, NULL, 0);
	}
	qsort(warm, 50, sizeof(double), cmp_double);
	double *all[] = {warmup, to_conn, to_fwd, re_ready, re_fwd, kill_fwd};
	for (size_t i = 0; i < 6; i++)
		qsort(all[i], (size_t)runs, sizeof(double), cmp_double);
	const double w = warm[25];
	const int m = runs / 2;
	printf("warm FORWARD (1 token, top-8)            %8.3f ms  (the unit below)\n", w);
	printf("co-launch: spawn -> READY (warm-up)      %8.1f ms\n", warmup[m]);
	printf("co-launch: READY -> connected            %8.1f ms  %6.1fx a warm FORWARD\n",
	       to_conn[m], to_conn[m] / w);
	printf("co-launch: READY -> first FORWARD done   %8.1f ms  %6.1fx\n", to_fwd[m],
	       to_fwd[m] / w);
	printf("restart:   spawn -> READY                %8.1f ms  %6.2fx the first warm-up\n",
	       re_ready[m], re_ready[m] / warmup[m]);
	printf("restart:   READY -> first FORWARD done   %8.1f ms  %6.1fx a warm FORWARD\n",
	       re_fwd[m], re_fwd[m] / w);
	printf("restart:   kill -9 -> first FORWARD done %8.1f ms\n", kill_fwd[m]);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : 1;
}
