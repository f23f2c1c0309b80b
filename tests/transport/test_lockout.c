/* test_lockout.c — a uid cannot keep another out of the handshake. Uids that may not connect
 * are refused at accept (SO_PEERCRED) before they take a handshake entry, with their log line
 * rate-limited; an allowed uid that floods the handshake fills only its own share. Each test
 * forks a child that becomes uid 65534 and holds many connections open without a hello, then
 * keeps connecting, while the test's own uid (the sidecar's) connects and is served. Needs
 * root to change uid. */
#include <criterion/criterion.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "log.h"
#include "moe_client.h"

#define NOBODY 65534
#define HELD 40 /* connections the child holds open: more than a share, more than the old pool */

static int raw_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

struct hammer {
	pid_t pid;
	int stop; /* write end: closing it stops the child */
};

/* The child: uid 65534; HELD connections opened (and kept) before it reports ready, then
 * connect-and-close in a loop until the test closes `stop`. */
static struct hammer start_hammer(const char *path)
{
	int ready[2], stop[2];
	cr_assert_eq(pipe(ready), 0);
	cr_assert_eq(pipe(stop), 0);
	pid_t kid = fork();
	cr_assert_geq(kid, 0);
	if (kid == 0) {
		close(ready[0]);
		close(stop[1]);
		if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
		    setresuid(NOBODY, NOBODY, NOBODY) != 0)
			_exit(200);
		int held = 0;
		for (int i = 0; i < HELD; i++)
			held += raw_connect(path) >= 0;
		char n = (char)held;
		if (write(ready[1], &n, 1) != 1)
			_exit(1);
		struct pollfd p = {.fd = stop[0], .events = POLLIN};
		while (poll(&p, 1, 0) == 0) {
			int fd = raw_connect(path);
			if (fd >= 0)
				close(fd);
		}
		_exit(0);
	}
	close(ready[1]);
	close(stop[0]);
	char held = 0;
	cr_assert_eq(read(ready[0], &held, 1), 1, "the child could not become uid %d", NOBODY);
	close(ready[0]);
	cr_assert_gt(held, 0, "the child could not connect at all");
	return (struct hammer){kid, stop[1]};
}

static void stop_hammer(struct hammer *h)
{
	close(h->stop);
	int st;
	cr_assert_eq(waitpid(h->pid, &st, 0), h->pid);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status 0x%x", st);
}

static void skip_unless_root(void)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to run a client as another uid (65534)");
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Our own uid connects and gets a PING through, several times over. */
static void own_uid_is_served(const char *path)
{
	for (int i = 0; i < 5; i++) {
		struct moe_client *c;
		struct moe_connect_opts o = {.socket_path = path, .max_tokens = 2, .hidden = 16};
		int rc = moe_connect(&o, &c);
		cr_assert_eq(rc, MOE_OK, "attempt %d: %s: %s", i, moe_strerror(rc),
		             moe_connect_error());
		cr_assert_eq(moe_ping(c, 5000), MOE_OK);
		moe_close(c);
	}
}

Test(lockout, refused_uids_hammering_do_not_keep_allowed_ones_out)
{
	skip_unless_root();
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	const char *extra[] = {"--allow-uid", "1234", NULL}; /* 65534 may reach it, not use it */
	cr_assert_eq(sidecar_start(&sp, extra, NULL), 0);
	const uint64_t t0 = mono_ns();
	struct hammer h = start_hammer(sp.socket);
	own_uid_is_served(sp.socket);
	stop_hammer(&h);
	const uint64_t seconds = (mono_ns() - t0) / 1000000000u + 1;
	/* Every refusal was at accept: the log says so, at most a burst per second. */
	const int lines = log_count(&sp, "refused client pid=");
	cr_expect_geq(lines, 1, "no refusal was logged");
	cr_expect_leq((uint64_t)lines, LOG_RATELIMIT_BURST * (seconds + 1),
	              "%d refusal lines in %llu s: not rate-limited", lines,
	              (unsigned long long)seconds);
	cr_expect_eq(log_count(&sp, "connections in the handshake"), 0,
	             "refused peers took handshake entries");
	sidecar_cleanup(&sp);
}

Test(lockout, an_allowed_uid_flooding_the_handshake_fills_only_its_share)
{
	skip_unless_root();
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	const char *extra[] = {"--allow-uid", "65534", NULL};
	cr_assert_eq(sidecar_start(&sp, extra, NULL), 0);
	struct hammer h = start_hammer(sp.socket);
	own_uid_is_served(sp.socket);
	stop_hammer(&h);
	cr_expect_geq(log_count(&sp, "uid 65534 already has 16 connections in the handshake"), 1,
	              "the flood was not bounded per uid");
	sidecar_cleanup(&sp);
}

/* The connection past a uid's share is told why, not reset: our own uid holds 16
 * connections without a hello, the 17th moe_connect gets MOE_EREFUSED with the sentence the
 * log has. The sidecar accepts in connect order, so the 16 are in the handshake first. */
Test(lockout, the_connection_past_a_uids_share_is_refused_with_the_reason)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	int held[16];
	for (int i = 0; i < 16; i++)
		cr_assert_geq(held[i] = raw_connect(sp.socket), 0);
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {.socket_path = sp.socket, .max_tokens = 2, .hidden = 16};
	int rc = moe_connect(&o, &c);
	cr_expect_eq(rc, MOE_EREFUSED, "%s: %s", moe_strerror(rc), moe_connect_error());
	char want[96];
	snprintf(want, sizeof(want), "uid %u already has 16 connections in the handshake",
	         (unsigned)geteuid());
	cr_expect(strstr(moe_connect_error(), want), "%s", moe_connect_error());
	cr_expect(log_wait(&sp, want, 1, 5000), "the log has the same sentence");
	for (int i = 0; i < 16; i++)
		close(held[i]);
	own_uid_is_served(sp.socket); /* the share frees as they hang up */
	sidecar_cleanup(&sp);
}

/* The budget itself, on a clock the test chooses. */
Test(lockout, log_ratelimit_allows_a_burst_per_window_and_counts_the_rest)
{
	struct log_ratelimit rl = {0};
	const uint64_t t = 5 * LOG_RATELIMIT_WINDOW_NS;
	uint32_t more = 99;
	for (uint32_t i = 0; i < LOG_RATELIMIT_BURST; i++) {
		cr_assert(log_ratelimit_allow(&rl, t + i, &more));
		cr_assert_eq(more, 0);
	}
	for (int i = 0; i < 7; i++)
		cr_assert_not(log_ratelimit_allow(&rl, t + LOG_RATELIMIT_WINDOW_NS - 1, &more));
	cr_assert(log_ratelimit_allow(&rl, t + LOG_RATELIMIT_WINDOW_NS, &more), "a new window");
	cr_assert_eq(more, 7, "the first line of a window says how many were not logged");
	cr_assert(log_ratelimit_allow(&rl, t + LOG_RATELIMIT_WINDOW_NS + 1, &more));
	cr_assert_eq(more, 0);
}
