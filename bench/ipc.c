/* ipc.c — bench_ipc: what one request through the channel costs, against floors measured in
 * the same run on the same CPUs.
 *
 *   floor   raw shared-memory spin ping-pong between two processes pinned to CPUs 0 and 1
 *   ping    PING round trip: real libmoe_client (CPU 1) and a real moe-sidecar (CPU 0)
 *   echo    ECHO round trips of 4 KiB, 64 KiB, 1 MiB, 16 MiB (f32 -> f32), and 1 MiB
 *           f32 -> bf16 (the conversion a FORWARD's output goes through for a bf16 engine)
 *   unix    a Unix-socket round trip between two pinned processes
 *   memcpy  16 MiB in process (the bandwidth an ECHO cannot beat), timed interleaved
 *           with the 16 MiB ECHO so that both see the same machine load
 *
 * Prints p50/p99 and the ratios the design aims at (ping <= 2x floor, unix >= 30x ping,
 * echo 16 MiB >= 0.7x memcpy); --json prints one object. Not a test: figures only.
 * Usage: bench_ipc [--json] [--quick] [--sidecar PATH]
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "latency.h"
#include "moe_client.h"
#include "moe_proto.h"
#include "moe_ring.h"

#define CPU_SIDECAR 0
#define CPU_CLIENT 1

static void pin(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0)
		fprintf(stderr, "bench_ipc: pinning to CPU %d: %s (figures will be noisier)\n", cpu,
		        strerror(errno));
}

struct stats {
	uint64_t p50, p99;
};

static struct stats summarize(uint64_t *v, size_t n)
{
	const uint64_t p50 = percentile_u64(v, n, 0.5); /* sorts v */
	return (struct stats){p50, v[(size_t)((double)(n - 1) * 0.99 + 0.5)]};
}

static void die(const char *what)
{
	fprintf(stderr, "bench_ipc: %s\n", what);
	exit(1);
}

/* ---- (1) the floor: two processes bouncing a counter through shared memory ------------- */

struct pingpong {
	alignas(128) _Atomic uint64_t ping;
	alignas(128) _Atomic uint64_t pong;
};

static struct stats bench_floor(size_t iters, uint64_t *lat)
{
	struct pingpong *pp =
	    mmap(NULL, sizeof(*pp), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (pp == MAP_FAILED)
		die("mmap");
	memset(pp, 0, sizeof(*pp));
	const size_t warm = iters / 10 + 1;
	pid_t kid = fork();
	if (kid == 0) {
		pin(CPU_SIDECAR);
		for (uint64_t i = 1; i <= iters + warm; i++) {
			while (atomic_load_explicit(&pp->ping, memory_order_acquire) != i)
				moe_cpu_relax();
			atomic_store_explicit(&pp->pong, i, memory_order_release);
		}
		_exit(0);
	}
	pin(CPU_CLIENT);
	for (uint64_t i = 1; i <= iters + warm; i++) {
		uint64_t t0 = monotonic_ns();
		atomic_store_explicit(&pp->ping, i, memory_order_release);
		while (atomic_load_explicit(&pp->pong, memory_order_acquire) != i)
			moe_cpu_relax();
		if (i > warm)
			lat[i - warm - 1] = monotonic_ns() - t0;
	}
	waitpid(kid, NULL, 0);
	munmap(pp, sizeof(*pp));
	return summarize(lat, iters);
}

/* ---- (4) a Unix-socket round trip ------------------------------------------------------- */

static struct stats bench_unix(size_t iters, uint64_t *lat)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		die("socketpair");
	const size_t warm = iters / 10 + 1;
	char msg[64] = {0};
	pid_t kid = fork();
	if (kid == 0) {
		pin(CPU_SIDECAR);
		close(sv[0]);
		for (size_t i = 0; i < iters + warm; i++) {
			if (recv(sv[1], msg, sizeof(msg), MSG_WAITALL) != (ssize_t)sizeof(msg) ||
			    send(sv[1], msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t)sizeof(msg))
				_exit(1);
		}
		_exit(0);
	}
	close(sv[1]);
	pin(CPU_CLIENT);
	for (size_t i = 0; i < iters + warm; i++) {
		uint64_t t0 = monotonic_ns();
		if (send(sv[0], msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t)sizeof(msg) ||
		    recv(sv[0], msg, sizeof(msg), MSG_WAITALL) != (ssize_t)sizeof(msg))
			die("unix socket round trip failed");
		if (i >= warm)
			lat[i - warm] = monotonic_ns() - t0;
	}
	close(sv[0]);
	waitpid(kid, NULL, 0);
	return summarize(lat, iters);
}

/* ---- (5) memcpy ------------------------------------------------------------------------- */

/* Two 16 MiB buffers copied back and forth in this process. Timed interleaved with the
 * 16 MiB ECHO (one copy, one ECHO, …) so both see the same machine at the same moments. */
struct copy_baseline {
	uint8_t *a, *b;
	size_t bytes;
	unsigned turn;
};

static void copy_baseline_init(struct copy_baseline *cb, size_t bytes)
{
	cb->bytes = bytes;
	cb->a = aligned_alloc(4096, bytes);
	cb->b = aligned_alloc(4096, bytes);
	if (!cb->a || !cb->b)
		die("out of memory");
	memset(cb->a, 1, bytes);
	memset(cb->b, 2, bytes);
	cb->turn = 0;
}

static uint64_t copy_baseline_once(struct copy_baseline *cb)
{
	const bool fwd = (cb->turn++ & 1) == 0;
	uint64_t t0 = monotonic_ns();
	memcpy(fwd ? cb->b : cb->a, fwd ? cb->a : cb->b, cb->bytes);
	return monotonic_ns() - t0;
}

/* ---- (2, 3) the real channel ------------------------------------------------------------- */

struct sidecar {
	pid_t pid;
	char dir[64], socket[96];
};

static void sidecar_start(struct sidecar *sc, const char *bin)
{
	snprintf(sc->dir, sizeof(sc->dir), "/tmp/bench-ipc.XXXXXX");
	if (!mkdtemp(sc->dir))
		die("mkdtemp");
	snprintf(sc->socket, sizeof(sc->socket), "%s/s.sock", sc->dir);
	int p[2];
	if (pipe(p) != 0)
		die("pipe");
	sc->pid = fork();
	if (sc->pid == 0) {
		pin(CPU_SIDECAR); /* inherited by the dispatcher thread */
		close(p[0]);
		char fd[16];
		snprintf(fd, sizeof(fd), "%d", p[1]);
		execl(bin, bin, "serve", "--socket", sc->socket, "--ready-fd", fd, "--log-level",
		      "warn", "--max-channel-mib", "256", (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	char line[256];
	ssize_t n = read(p[0], line, sizeof(line) - 1);
	close(p[0]);
	if (n < 6 || strncmp(line, "READY ", 6) != 0)
		die("the sidecar did not start (--sidecar PATH?)");
}

static void sidecar_stop(struct sidecar *sc)
{
	kill(sc->pid, SIGTERM);
	waitpid(sc->pid, NULL, 0);
	rmdir(sc->dir);
}

/* Round trips of one request; if cb is given, one baseline memcpy before each, timed into
 * copy_lat. */
static struct stats round_trips(struct moe_client *c, const struct moe_request *r, size_t iters,
                                uint64_t *lat, struct copy_baseline *cb, uint64_t *copy_lat)
{
	const size_t warm = iters / 10 + 1;
	struct moe_completion d;
	for (size_t i = 0; i < iters + warm; i++) {
		if (cb) {
			uint64_t t = copy_baseline_once(cb);
			if (i >= warm)
				copy_lat[i - warm] = t;
		}
		uint64_t t0 = monotonic_ns();
		int rc = moe_submit(c, r);
		if (rc == MOE_OK)
			rc = moe_wait(c, &d, 10000);
		if (rc != MOE_OK || d.status != MOE_OK) {
			fprintf(stderr, "bench_ipc: request failed: %s %s\n",
			        moe_strerror(rc != MOE_OK ? rc : d.status), moe_last_error(c));
			exit(1);
		}
		if (i >= warm)
			lat[i - warm] = monotonic_ns() - t0;
	}
	return summarize(lat, iters);
}

int main(int argc, char **argv)
{
	bool json = false, quick = false;
	const char *bin = MOE_SIDECAR_BIN;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = true;
		else if (!strcmp(argv[i], "--quick"))
			quick = true;
		else if (!strcmp(argv[i], "--sidecar") && i + 1 < argc)
			bin = argv[++i];
		else {
			fprintf(stderr, "usage: bench_ipc [--json] [--quick] [--sidecar PATH]\n");
			return 2;
		}
	}
	const size_t scale = quick ? 10 : 1;
	const size_t n_floor = 200000 / scale, n_ping = 100000 / scale, n_unix = 20000 / scale;
	uint64_t *lat = malloc(sizeof(uint64_t) * n_floor);
	if (!lat)
		die("out of memory");

	struct stats floor = bench_floor(n_floor, lat);
	struct stats unix_rt = bench_unix(n_unix, lat);

	struct sidecar sc;
	sidecar_start(&sc, bin);
	pin(CPU_CLIENT);
	const uint32_t hidden = 1024; /* one f32 row = 4 KiB */
	struct moe_connect_opts o = {.socket_path = sc.socket,
	                             .max_tokens = 4096,
	                             .hidden = hidden,
	                             .n_slots = 1,
	                             .client_name = "bench_ipc"};
	struct moe_client *c;
	int rc = moe_connect(&o, &c);
	if (rc != MOE_OK) {
		fprintf(stderr, "bench_ipc: %s\n", moe_connect_error());
		sidecar_stop(&sc);
		return 1;
	}
	struct moe_slot s;
	moe_slot_acquire(c, &s);
	struct moe_request ping = {.op = MOE_OP_PING, .slot = s.index};
	struct stats ping_rt = round_trips(c, &ping, n_ping, lat, NULL, NULL);

	static const struct {
		const char *name;
		uint32_t tokens;
		size_t iters;
	} sizes[] = {{"4k", 1, 20000}, {"64k", 16, 5000}, {"1m", 256, 1000}, {"16m", 4096, 100}};
	struct stats echo[4];
	double echo_gbps[4], memcpy_gbps = 0;
	struct copy_baseline cb;
	copy_baseline_init(&cb, (size_t)16 << 20);
	uint64_t *copy_lat = malloc(sizeof(uint64_t) * n_floor);
	if (!copy_lat)
		die("out of memory");
	memset(s.input, 0x3c, (size_t)4096 * hidden * 4);
	for (int i = 0; i < 4; i++) {
		struct moe_request r = {.op = MOE_OP_ECHO,
		                        .slot = s.index,
		                        .n_tokens = sizes[i].tokens,
		                        .in_dtype = MOE_DTYPE_F32,
		                        .out_dtype = MOE_DTYPE_F32};
		size_t iters = sizes[i].iters / scale + 5;
		const bool last = i == 3; /* 16 MiB: interleaved with the memcpy baseline */
		echo[i] = round_trips(c, &r, iters, lat, last ? &cb : NULL, copy_lat);
		echo_gbps[i] = (double)sizes[i].tokens * hidden * 4 / (double)echo[i].p50;
		if (last)
			memcpy_gbps = (double)cb.bytes / (double)summarize(copy_lat, iters).p50;
	}
	struct moe_request to_bf16 = {.op = MOE_OP_ECHO,
	                              .slot = s.index,
	                              .n_tokens = sizes[2].tokens,
	                              .in_dtype = MOE_DTYPE_F32,
	                              .out_dtype = MOE_DTYPE_BF16};
	struct stats echo_bf16 =
	    round_trips(c, &to_bf16, sizes[2].iters / scale + 5, lat, NULL, NULL);
	const double echo_bf16_gbps = (double)sizes[2].tokens * hidden * 4 / (double)echo_bf16.p50;
	moe_slot_release(c, s.index);
	moe_close(c);
	sidecar_stop(&sc);

	const double ping_vs_floor = (double)ping_rt.p50 / (double)floor.p50;
	const double unix_vs_ping = (double)unix_rt.p50 / (double)ping_rt.p50;
	const double echo_vs_memcpy = echo_gbps[3] / memcpy_gbps;
	if (json) {
		printf("{\"floor_p50_ns\":%llu,\"floor_p99_ns\":%llu,\"ping_p50_ns\":%llu,"
		       "\"ping_p99_ns\":%llu,\"unix_p50_ns\":%llu,\"unix_p99_ns\":%llu,",
		       (unsigned long long)floor.p50, (unsigned long long)floor.p99,
		       (unsigned long long)ping_rt.p50, (unsigned long long)ping_rt.p99,
		       (unsigned long long)unix_rt.p50, (unsigned long long)unix_rt.p99);
		for (int i = 0; i < 4; i++)
			printf("\"echo_%s_p50_ns\":%llu,\"echo_%s_p99_ns\":%llu,\"echo_%s_gbps\":%."
			       "3f,",
			       sizes[i].name, (unsigned long long)echo[i].p50, sizes[i].name,
			       (unsigned long long)echo[i].p99, sizes[i].name, echo_gbps[i]);
		printf("\"echo_1m_bf16_p50_ns\":%llu,\"echo_1m_bf16_gbps\":%.3f,",
		       (unsigned long long)echo_bf16.p50, echo_bf16_gbps);
		printf("\"memcpy_gbps\":%.3f,\"ping_over_floor\":%.3f,\"unix_over_ping\":%.3f,"
		       "\"echo_16m_over_memcpy\":%.3f,\"quick\":%s}\n",
		       memcpy_gbps, ping_vs_floor, unix_vs_ping, echo_vs_memcpy,
		       quick ? "true" : "false");
		return 0;
	}
	printf("%-28s %10s %10s %9s\n", "measure", "p50 ns", "p99 ns", "GB/s");
	printf("%-28s %10llu %10llu\n", "floor: shm spin ping-pong", (unsigned long long)floor.p50,
	       (unsigned long long)floor.p99);
	printf("%-28s %10llu %10llu\n", "PING via client+sidecar", (unsigned long long)ping_rt.p50,
	       (unsigned long long)ping_rt.p99);
	for (int i = 0; i < 4; i++) {
		char name[32];
		snprintf(name, sizeof(name), "ECHO %s f32", sizes[i].name);
		printf("%-28s %10llu %10llu %9.2f\n", name, (unsigned long long)echo[i].p50,
		       (unsigned long long)echo[i].p99, echo_gbps[i]);
	}
	printf("%-28s %10llu %10llu %9.2f\n", "ECHO 1m f32->bf16",
	       (unsigned long long)echo_bf16.p50, (unsigned long long)echo_bf16.p99,
	       echo_bf16_gbps);
	printf("%-28s %10llu %10llu\n", "Unix socket round trip", (unsigned long long)unix_rt.p50,
	       (unsigned long long)unix_rt.p99);
	printf("%-28s %10s %10s %9.2f\n", "memcpy 16 MiB", "", "", memcpy_gbps);
	printf("\nratios (same run):\n");
	printf("  ping / floor          %6.2f   (design target <= 2)\n", ping_vs_floor);
	printf("  unix / ping           %6.1f   (design target >= 30)\n", unix_vs_ping);
	printf("  echo 16 MiB / memcpy  %6.2f   (design target >= 0.7)\n", echo_vs_memcpy);
	printf("  echo 1 MiB f32->bf16 / f32->f32  %6.2f   (GB/s of f32 input)\n",
	       echo_bf16_gbps / echo_gbps[2]);
	return 0;
}
