/* driver.c — one recorded FORWARD for scripts/forward-path.sh.
 *
 * driver --sidecar BIN --model PATH --out DIR [--layer I] [--warmup N] [--spin-us US]
 *
 * Starts `BIN serve PATH --mem-budget 100% --spin-us US` (every expert resident; US default 0:
 * the dispatcher sleeps as soon as it is idle instead of polling for 50 µs, so that no
 * polling loop of variable length lands in the window) with FP_SIGNALS=1 and FP_OUT=DIR,
 * connects, runs N rounds (default 4) of 1-token FORWARDs over every MoE layer, then records
 * one more on the I-th MoE layer (default 1, clamped): SIGUSR1 to the sidecar (waits for its
 * DIR/fp-PID.on, then until no thread of the sidecar runs), recording on here, moe_forward,
 * recording off here, waits until no thread of the sidecar runs, SIGUSR2 (waits for its
 * DIR/fp-PID.bin), its own dump, then SIGTERM. DIR/run.txt names both pids and the times
 * moe_forward was called (t0) and returned (t1), CLOCK_MONOTONIC ns.
 * Not instrumented itself: the path starts where it calls moe_forward.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moe_client.h"

void fp_record(int on);
int fp_dump(const char *dir);

static pid_t sidecar = -1;

static void die(const char *what)
{
	fprintf(stderr, "forward-path driver: %s\n", what);
	if (sidecar > 0) {
		kill(sidecar, SIGKILL);
		waitpid(sidecar, NULL, 0);
	}
	exit(1);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Waits (up to 20 s) for DIR/fp-PID.EXT to exist. */
static void await_file(const char *dir, pid_t pid, const char *ext)
{
	char p[1024];
	snprintf(p, sizeof(p), "%s/fp-%d.%s", dir, (int)pid, ext);
	double end = now_s() + 20;
	struct stat st;
	while (stat(p, &st) != 0) {
		if (now_s() > end) {
			fprintf(stderr, "forward-path driver: no %s\n", p);
			die("the sidecar did not answer the signal");
		}
		usleep(200);
	}
}

/* Waits (up to 5 s) until no thread of pid is running: three looks in a row, 200 µs apart,
 * that find every /proc/PID/task/TID/stat in a sleeping state. Then the sidecar has finished
 * what the FORWARD started (the completion, the dispatcher's next drain, its going to sleep,
 * the workers' spin after the last phase). */
static void await_idle(pid_t pid)
{
	char p[128];
	snprintf(p, sizeof(p), "/proc/%d/task", (int)pid);
	double end = now_s() + 5;
	for (int quiet = 0; quiet < 3;) {
		if (now_s() > end) {
			fprintf(stderr, "forward-path driver: the sidecar never went idle\n");
			return;
		}
		usleep(200);
		DIR *d = opendir(p);
		if (!d)
			die("opendir /proc/PID/task");
		int running = 0;
		struct dirent *e;
		while ((e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			char sp[300], buf[512];
			snprintf(sp, sizeof(sp), "%s/%.32s/stat", p, e->d_name);
			FILE *f = fopen(sp, "r");
			if (!f)
				continue;
			size_t n = fread(buf, 1, sizeof(buf) - 1, f);
			fclose(f);
			buf[n] = 0;
			char *rp = strrchr(buf, ')');
			if (rp && rp[1] == ' ' && rp[2] == 'R')
				running++;
		}
		closedir(d);
		quiet = running ? 0 : quiet + 1;
	}
}

static uint16_t bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static void fill(const struct moe_slot *s, uint32_t hidden, uint32_t k, uint32_t n_experts,
                 unsigned step)
{
	uint16_t *in = s->input;
	for (uint32_t i = 0; i < hidden; i++)
		in[i] = bf16((float)((int)((i * 37u + step * 11u) % 97u) - 48) / 64.0f);
	for (uint32_t j = 0; j < k; j++) {
		s->expert_ids[j] = (int32_t)((step * 5u + j * 3u) % n_experts);
		s->expert_weights[j] = 1.0f / (float)k;
	}
	/* distinct ids: the stride 3 walk repeats only after n_experts / gcd(3, n) entries */
	for (uint32_t j = 0; j < k; j++)
		for (uint32_t i = 0; i < j; i++)
			if (s->expert_ids[i] == s->expert_ids[j]) {
				s->expert_ids[j] = (s->expert_ids[j] + 1) % (int32_t)n_experts;
				i = (uint32_t)-1; /* look again from the start */
			}
}

int main(int argc, char **argv)
{
	const char *bin = NULL, *model = NULL, *dir = NULL;
	int layer_i = 1, warmup = 4;
	const char *spin_us = "0";
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--sidecar"))
			bin = argv[i + 1];
		else if (!strcmp(argv[i], "--model"))
			model = argv[i + 1];
		else if (!strcmp(argv[i], "--out"))
			dir = argv[i + 1];
		else if (!strcmp(argv[i], "--layer"))
			layer_i = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--warmup"))
			warmup = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--spin-us"))
			spin_us = argv[i + 1];
		else
			die("usage: driver --sidecar BIN --model PATH --out DIR [--layer I] "
			    "[--warmup N] "
			    "[--spin-us US]");
	}
	if (!bin || !model || !dir)
		die("usage: driver --sidecar BIN --model PATH --out DIR [--layer I] [--warmup N]");

	char sock[1024];
	snprintf(sock, sizeof(sock), "%s/sidecar.sock", dir);
	int ready[2];
	if (pipe2(ready, O_CLOEXEC) != 0)
		die("pipe2");
	sidecar = fork();
	if (sidecar < 0)
		die("fork");
	if (sidecar == 0) {
		if (dup2(ready[1], 3) != 3)
			_exit(127);
		setenv("FP_SIGNALS", "1", 1);
		setenv("FP_OUT", dir, 1);
		execl(bin, bin, "serve", model, "--socket", sock, "--ready-fd", "3", "--mem-budget",
		      "100%", "--spin-us", spin_us, "--log-level", "warn", (char *)NULL);
		_exit(127);
	}
	close(ready[1]);
	struct pollfd pfd = {.fd = ready[0], .events = POLLIN};
	char line[256] = "";
	if (poll(&pfd, 1, 120000) != 1 || read(ready[0], line, sizeof(line) - 1) <= 0 ||
	    strncmp(line, "READY", 5) != 0)
		die("the sidecar did not become ready");
	close(ready[0]);

	struct moe_connect_opts o = {.socket_path = sock, .max_tokens = 4, .client_name = "fp"};
	struct moe_client *c;
	if (moe_connect(&o, &c) != MOE_OK)
		die(moe_connect_error());
	const struct moe_info *info = moe_info(c);
	uint32_t k = info->model_top_k ? info->model_top_k : info->top_k;
	if (k > info->top_k)
		k = info->top_k;
	int32_t layers[1024];
	int n_layers = moe_model_layers(c, layers, 1024);
	if (n_layers <= 0)
		die("no MoE layers");
	if (layer_i >= n_layers)
		layer_i = n_layers - 1;
	struct moe_slot s;
	if (moe_slot_acquire(c, &s) != MOE_OK)
		die("moe_slot_acquire");
	struct moe_completion done;
	unsigned step = 0;
	for (int r = 0; r < warmup; r++)
		for (int l = 0; l < n_layers; l++) {
			fill(&s, info->hidden, k, info->n_experts, step++);
			if (moe_forward(c, &s, layers[l], 1, (uint16_t)k, 0, MOE_DTYPE_BF16,
			                MOE_DTYPE_BF16, 0, &done, 10000) != MOE_OK)
				die(moe_last_error(c));
		}
	fill(&s, info->hidden, k, info->n_experts, step++);

	/* The recorded FORWARD. */
	if (kill(sidecar, SIGUSR1) != 0)
		die("kill SIGUSR1");
	await_file(dir, sidecar, "on");
	await_idle(sidecar); /* the signal may have woken the dispatcher: let it sleep again */
	fp_record(1);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = moe_forward(c, &s, layers[layer_i], 1, (uint16_t)k, 0, MOE_DTYPE_BF16,
	                     MOE_DTYPE_BF16, 0, &done, 10000);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	fp_record(0);
	await_idle(sidecar);
	if (kill(sidecar, SIGUSR2) != 0)
		die("kill SIGUSR2");
	await_file(dir, sidecar, "bin");
	if (rc != MOE_OK)
		die(moe_last_error(c));
	if (fp_dump(dir) != 0)
		die("fp_dump");

	uint32_t n_experts = info->n_experts, hidden = info->hidden; /* info dies with c */
	moe_slot_release(c, s.index);
	moe_close(c);
	kill(sidecar, SIGTERM);
	int st = 0;
	waitpid(sidecar, &st, 0);
	char p[1100];
	snprintf(p, sizeof(p), "%s/run.txt", dir);
	FILE *f = fopen(p, "w");
	if (!f)
		die("run.txt");
	fprintf(f,
	        "client %d\nsidecar %d\nlayer %d\nk %u\nexperts %u\nhidden %u\nsidecar_exit %d\nt0 "
	        "%llu\nt1 %llu\n",
	        (int)getpid(), (int)sidecar, (int)layers[layer_i], k, n_experts, hidden,
	        WIFEXITED(st) ? WEXITSTATUS(st) : -1,
	        (unsigned long long)t0.tv_sec * 1000000000ull + (unsigned long long)t0.tv_nsec,
	        (unsigned long long)t1.tv_sec * 1000000000ull + (unsigned long long)t1.tv_nsec);
	fclose(f);
	printf("forward-path: recorded one FORWARD (layer %d, 1 token, top-%u of %u experts)\n",
	       (int)layers[layer_i], k, n_experts);
	return 0;
}
