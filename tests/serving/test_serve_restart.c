/* test_serve_restart.c — co-launch and restart from the engine's side: a client started
 * before the sidecar connects once it serves (within its timeout), and a client whose sidecar
 * was killed (-9) and restarted on the same socket gets its channel back with moe_reconnect —
 * the same outputs bit for bit, its GPU mask in force again, the request in flight at the
 * death failed once — while a restart on another model is refused. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
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

/* ---- Starting, supervised, activated ---------------------------------------------------- */

struct spawned {
	pid_t pid;
	int hold;  /* write end: closing it lets the warm-up hand over (-1: not held) */
	int ready; /* read end of --ready-fd */
};

/* argv[0] is run with stdout and stderr into log and the descriptors in pass[] inherited
 * (everything else is close-on-exec). */
static pid_t spawn(const char *const argv[], const char *log, const int *pass, int n_pass)
{
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
			_exit(126);
		for (int i = 0; i < n_pass; i++)
			if (fcntl(pass[i], F_SETFD, 0) != 0)
				_exit(126);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* The test-hooks daemon on model with its warm-up held until sp.hold is closed. */
static struct spawned start_held(struct served *s)
{
#ifndef MOE_SIDECAR_TESTHOOKS_BIN
	cr_skip_test("needs moe-sidecar-testhooks (MOE_TEST_HOOKS=ON)");
	return (struct spawned){0};
#else
	int hold[2], ready[2];
	cr_assert_eq(pipe2(hold, O_CLOEXEC), 0);
	cr_assert_eq(pipe2(ready, O_CLOEXEC), 0);
	char hold_s[16], ready_s[16], instance[48];
	snprintf(hold_s, sizeof(hold_s), "%d", hold[0]);
	snprintf(ready_s, sizeof(ready_s), "%d", ready[1]);
	snprintf(instance, sizeof(instance), "test-restart-%d", (int)getpid());
	const char *argv[] = {MOE_SIDECAR_TESTHOOKS_BIN,
	                      "serve",
	                      s->model,
	                      "--socket",
	                      s->sp.socket,
	                      "--ready-fd",
	                      ready_s,
	                      "--debug-hold-warmup",
	                      hold_s,
	                      "--probes-instance",
	                      instance,
	                      "--log-level",
	                      "debug",
	                      NULL};
	const int pass[] = {hold[0], ready[1]};
	struct spawned p = {
	    .pid = spawn(argv, s->sp.log, pass, 2), .hold = hold[1], .ready = ready[0]};
	close(hold[0]);
	close(ready[1]);
	return p;
#endif
}

static void wait_ready(struct spawned *p)
{
	char line[256];
	ssize_t n = read(p->ready, line, sizeof(line) - 1);
	cr_assert_gt(n, 0, "no READY on --ready-fd");
	line[n] = '\0';
	cr_assert(!strncmp(line, "READY ", 6), "%s", line);
	close(p->ready);
}

static int stop_spawned(struct spawned *p, int sig)
{
	kill(p->pid, sig);
	int st;
	cr_assert_eq(waitpid(p->pid, &st, 0), p->pid);
	return st;
}

static void new_model(struct served *s)
{
	memset(s, 0, sizeof(*s));
	harness_tempdir(&s->sp);
	snprintf(s->model, sizeof(s->model), "%s/model.gguf", s->sp.dir);
	cr_assert_eq(ref_generate(s->model, "q8_0", 7), 0);
}

/* A datagram socket standing in for the service manager. */
static int notify_socket(const char *dir, char *path, size_t len)
{
	snprintf(path, len, "%s/notify.sock", dir);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	cr_assert_lt(strlen(path), sizeof(a.sun_path));
	memcpy(a.sun_path, path, strlen(path) + 1);
	cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	return fd;
}

/* The next datagram within timeout_ms into buf (NUL-terminated); false if none came. */
static bool next_notice(int fd, char *buf, size_t len, int timeout_ms)
{
	struct pollfd pf = {.fd = fd, .events = POLLIN};
	if (poll(&pf, 1, timeout_ms) != 1)
		return false;
	ssize_t n = recv(fd, buf, len - 1, 0);
	cr_assert_geq(n, 0);
	buf[n] = '\0';
	return true;
}

/* Reads notices until one contains want, within timeout_ms in all (a steady stream of other
 * notices, WATCHDOG=1 every 100 ms, must not keep it waiting); the ones read go to seen. */
static bool notice_until(int fd, const char *want, char *seen, size_t seen_len, int timeout_ms)
{
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	char buf[600];
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		const long spent =
		    (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
		if (spent >= timeout_ms ||
		    !next_notice(fd, buf, sizeof(buf), (int)(timeout_ms - spent)))
			return false;
		if (seen)
			snprintf(seen + strlen(seen), seen_len - strlen(seen), "%s|", buf);
		if (strstr(buf, want))
			return true;
	}
}

/* While the model warms up the socket answers: a client that gives up waiting, or does not
 * wait, gets MOE_ESTARTING and the warm-up's progress, not "is it running?"; once READY is
 * said, the same connect is served. The progress is known to be there once the service
 * manager (a datagram socket here) heard it: the socket listens before the warm-up starts. */
Test(restart, a_starting_sidecar_says_so_with_its_progress)
{
	struct served s;
	new_model(&s);
	char npath[128];
	int nfd = notify_socket(s.sp.dir, npath, sizeof(npath));
	setenv("NOTIFY_SOCKET", npath, 1);
	struct spawned p = start_held(&s);
	unsetenv("NOTIFY_SOCKET");
	cr_assert(notice_until(nfd, "STATUS=warming up: ", NULL, 0, 20000), "no progress");
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {.socket_path = s.sp.socket, .timeout_ms = MOE_CONNECT_NOWAIT};
	int rc = moe_connect(&o, &c);
	cr_assert_eq(rc, MOE_ESTARTING, "%s: %s", moe_strerror(rc), moe_connect_error());
	cr_expect(strstr(moe_connect_error(), "is starting: warming up: "), "the progress: %s",
	          moe_connect_error());
	cr_expect_not(strstr(moe_connect_error(), "after waiting"), "%s", moe_connect_error());
	/* Waits, then gives up saying so. Long enough for a loaded machine (ASan, -j2) to answer
	 * a hello: the warm-up is held, so only the wait's length is at stake. */
	o.timeout_ms = 2000;
	rc = moe_connect(&o, &c);
	cr_assert_eq(rc, MOE_ESTARTING, "%s: %s", moe_strerror(rc), moe_connect_error());
	cr_expect(strstr(moe_connect_error(), "after waiting 2000 ms"), "%s", moe_connect_error());
	close(p.hold);
	wait_ready(&p);
	o.timeout_ms = MOE_CONNECT_NOWAIT;
	rc = moe_connect(&o, &c);
	cr_assert_eq(rc, MOE_OK, "%s: %s", moe_strerror(rc), moe_connect_error());
	cr_expect_eq(moe_ping(c, 5000), MOE_OK);
	moe_close(c);
	int st = stop_spawned(&p, SIGTERM);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	close(nfd);
	sidecar_cleanup(&s.sp);
}

/* READY=1 only once the model is served (not at bind), STATUS= with the warm-up's progress
 * before, WATCHDOG=1 at the period asked while the process runs and none while it is
 * stopped, STOPPING=1 at the end. */
Test(restart, the_service_manager_hears_ready_status_watchdog_and_stopping)
{
	struct served s;
	new_model(&s);
	char npath[128];
	int nfd = notify_socket(s.sp.dir, npath, sizeof(npath));
	setenv("NOTIFY_SOCKET", npath, 1);
	setenv("WATCHDOG_USEC", "200000", 1);
	struct spawned p = start_held(&s);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	static char seen[1 << 16];
	seen[0] = '\0';
	cr_assert(notice_until(nfd, "STATUS=warming up: ", seen, sizeof(seen), 20000), "%s", seen);
	/* Held: warm, not serving. A FORWARD cannot be served, so no READY. */
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {.socket_path = s.sp.socket, .timeout_ms = MOE_CONNECT_NOWAIT};
	cr_assert_eq(moe_connect(&o, &c), MOE_ESTARTING, "%s", moe_connect_error());
	close(p.hold);
	cr_assert(notice_until(nfd, "READY=1", seen, sizeof(seen), 20000), "%s", seen);
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "READY means served: %s", moe_connect_error());
	moe_close(c);
	for (int i = 0; i < 3; i++)
		cr_assert(notice_until(nfd, "WATCHDOG=1", NULL, 0, 5000),
		          "watchdog %d did not come", i);
	/* Stopped, the process feeds nothing (nothing is left in the socket either). */
	cr_assert_eq(kill(p.pid, SIGSTOP), 0);
	siginfo_t si;
	cr_assert_eq(waitid(P_PID, (id_t)p.pid, &si, WSTOPPED | WNOWAIT), 0);
	char buf[600];
	while (next_notice(nfd, buf, sizeof(buf), 0))
		; /* sent before it stopped */
	cr_expect_not(next_notice(nfd, buf, sizeof(buf), 1000), "a stopped sidecar said %s", buf);
	cr_assert_eq(kill(p.pid, SIGCONT), 0);
	cr_assert(notice_until(nfd, "WATCHDOG=1", NULL, 0, 5000), "no watchdog after SIGCONT");
	kill(p.pid, SIGTERM);
	cr_assert(notice_until(nfd, "STOPPING=1", NULL, 0, 20000), "no STOPPING=1");
	int st;
	cr_assert_eq(waitpid(p.pid, &st, 0), p.pid);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	close(nfd);
	sidecar_cleanup(&s.sp);
}

/* systemd-socket-activate binds the socket and starts the sidecar at the first connection,
 * passing it the socket: the client connected before the sidecar ran, waits through its
 * warm-up, and is served. The passed socket is left for the manager to remove. */
Test(restart, a_socket_activated_sidecar_serves_a_client_that_came_first)
{
	if (access("/usr/bin/systemd-socket-activate", X_OK) != 0)
		cr_skip_test("systemd-socket-activate is not installed (Debian package systemd)");
	struct served s;
	new_model(&s);
	char run[96];
	snprintf(run, sizeof(run), "%s/run", s.sp.dir);
	cr_assert_eq(mkdir(run, 0700), 0);
	char instance[48];
	snprintf(instance, sizeof(instance), "test-activate-%d", (int)getpid());
	const char *argv[] = {"/usr/bin/systemd-socket-activate",
	                      "-l",
	                      s.sp.socket,
	                      MOE_SIDECAR_BIN,
	                      "serve",
	                      s.model,
	                      "--probes-instance",
	                      instance,
	                      NULL};
	pid_t pid = spawn(argv, s.sp.log, NULL, 0);
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {
	    .socket_path = s.sp.socket, .timeout_ms = 60000, .max_tokens = 64, .n_slots = 4};
	int rc = moe_connect(&o, &c);
	cr_assert_eq(rc, MOE_OK, "%s: %s", moe_strerror(rc), moe_connect_error());
	s.c = c;
	s.ref = ref_open(s.model);
	cr_assert_not_null(s.ref);
	const struct moe_info *inf = moe_info(c);
	struct fwd_case fc;
	fwd_case_make(&fc, 5, (int32_t)inf->first_moe_layer, 2, 4, inf->n_experts, inf->hidden,
	              false);
	cr_assert_eq(served_forward(&s, &fc, NULL, NULL), MOE_OK, "%s", moe_last_error(c));
	fwd_case_free(&fc);
	moe_close(c);
	ref_close(s.ref);
	kill(pid, SIGTERM);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	char *log = slurp(s.sp.log);
	cr_expect(log && strstr(log, "serving path="), "%s", log ? log : "");
	free(log);
	sidecar_cleanup(&s.sp);
}

/* SIGTERM while the model warms up: the socket goes at once (no client is left waiting on a
 * sidecar that is stopping), the warm-up in progress ends, and the exit is clean. */
Test(restart, sigterm_during_the_warm_up_stops_cleanly)
{
	struct served s;
	new_model(&s);
	char npath[128];
	int nfd = notify_socket(s.sp.dir, npath, sizeof(npath));
	setenv("NOTIFY_SOCKET", npath, 1);
	struct spawned p = start_held(&s);
	unsetenv("NOTIFY_SOCKET");
	/* Any STATUS comes after listen(): from here a no-wait connect meets the sidecar. */
	cr_assert(notice_until(nfd, "STATUS=", NULL, 0, 60000), "no STATUS");
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {.socket_path = s.sp.socket, .timeout_ms = MOE_CONNECT_NOWAIT};
	cr_assert_eq(moe_connect(&o, &c), MOE_ESTARTING, "%s", moe_connect_error());
	cr_assert_eq(kill(p.pid, SIGTERM), 0);
	cr_assert(log_wait(&s.sp, "the warm-up in progress ends first", 1, 20000));
	struct stat st;
	cr_expect_neq(stat(s.sp.socket, &st), 0, "the socket outlived SIGTERM");
	close(p.hold);
	int status;
	cr_assert_eq(waitpid(p.pid, &status, 0), p.pid);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
	char lock[160];
	snprintf(lock, sizeof(lock), "%s.lock", s.sp.socket);
	cr_expect_neq(stat(lock, &st), 0, "the lock file was left");
	close(p.ready);
	close(nfd);
	sidecar_cleanup(&s.sp);
}

/* The service manager's variables, when they cannot be used: refused at start with the
 * variable named, before anything is bound. LISTEN_PID must be the sidecar's own pid, so the
 * child sets it after fork, before exec. */
static int serve_with_env(const struct served *s, const char *name, const char *value,
                          bool listen_pid)
{
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		char me[16];
		snprintf(me, sizeof(me), "%d", (int)getpid());
		if (setenv(name, value, 1) != 0 || (listen_pid && setenv("LISTEN_PID", me, 1) != 0))
			_exit(126);
		int fd = open(s->sp.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd < 0 || dup2(fd, 2) < 0)
			_exit(126);
		execl(MOE_SIDECAR_BIN, MOE_SIDECAR_BIN, "serve", "--socket", s->sp.socket,
		      (char *)NULL);
		_exit(127);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st), "status 0x%x", st);
	return WEXITSTATUS(st);
}

Test(restart, service_manager_variables_that_cannot_be_used_are_refused)
{
	static const struct {
		const char *name, *value, *said;
		bool listen_pid;
		int status;
	} cases[] = {
	    {"NOTIFY_SOCKET", "relative/notify.sock", "NOTIFY_SOCKET=relative/notify.sock", false,
	     2},
	    {"WATCHDOG_USEC", "soon", "WATCHDOG_USEC=soon", false, 2},
	    {"WATCHDOG_USEC", "0", "WATCHDOG_USEC=0", false, 2},
	    {"LISTEN_FDS", "2", "LISTEN_FDS=2", true, 1},
	    {"LISTEN_FDS", "1", "descriptor 3 is not a listening Unix stream socket", true, 1},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct served s;
		memset(&s, 0, sizeof(s));
		harness_tempdir(&s.sp);
		const int status =
		    serve_with_env(&s, cases[i].name, cases[i].value, cases[i].listen_pid);
		cr_expect_eq(status, cases[i].status, "%s=%s: exit %d", cases[i].name,
		             cases[i].value, status);
		char *log = slurp(s.sp.log);
		cr_expect_eq(log_count(&s.sp, cases[i].said), 1, "%s=%s: %s", cases[i].name,
		             cases[i].value, log ? log : "(no log)");
		free(log);
		struct stat st;
		cr_expect_neq(stat(s.sp.socket, &st), 0, "%s: a socket was bound", cases[i].name);
		sidecar_cleanup(&s.sp);
	}
}
