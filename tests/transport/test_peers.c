/* test_peers.c — who may connect: another uid (a child dropped to nobody, 65534) is refused
 * by file permissions in the default mode, by SO_PEERCRED with an allow-list that does not
 * name it, and accepted with one that does. Needs root to change uid. */
#include <criterion/criterion.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "moe_client.h"
#include "moe_proto.h"

#define NOBODY 65534

/* Forks a child that becomes uid/gid 65534 and connects; returns -status of moe_connect
 * (0 on success, which is then followed by a PING). */
static int connect_as_nobody(const char *path)
{
	pid_t kid = fork();
	if (kid == 0) {
		if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
		    setresuid(NOBODY, NOBODY, NOBODY) != 0)
			_exit(200);
		struct moe_client *c;
		struct moe_connect_opts o = {.socket_path = path, .max_tokens = 2, .hidden = 16};
		int rc = moe_connect(&o, &c);
		if (rc == MOE_OK)
			rc = moe_ping(c, 5000);
		if (rc != MOE_OK)
			fprintf(stderr, "nobody: %s\n", moe_connect_error());
		_exit(-rc);
	}
	int st;
	cr_assert_eq(waitpid(kid, &st, 0), kid);
	cr_assert(WIFEXITED(st));
	cr_assert_neq(WEXITSTATUS(st), 200, "could not drop privileges");
	return -WEXITSTATUS(st);
}

static void skip_unless_root(void)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to run a client as another uid (65534)");
}

Test(peers, default_mode_refuses_other_uids_by_file_permissions)
{
	skip_unless_root();
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	cr_assert_eq(connect_as_nobody(sp.socket), MOE_ECONNECT);
	struct moe_client *c;
	struct moe_connect_opts o = {.socket_path = sp.socket};
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "our own uid is served");
	moe_close(c);
	sidecar_cleanup(&sp);
}

Test(peers, allow_list_without_the_uid_refuses_by_peercred)
{
	skip_unless_root();
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	const char *extra[] = {"--allow-uid", "1234,4321", NULL};
	cr_assert_eq(sidecar_start(&sp, extra, NULL), 0);
	struct stat st;
	cr_assert_eq(stat(sp.socket, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0666, "with an allow-list the socket is 0666");
	cr_assert_eq(connect_as_nobody(sp.socket), MOE_EREFUSED);
	cr_assert(log_wait(&sp, "uid 65534 is not allowed", 1, 5000), "the refusal is logged");
	sidecar_cleanup(&sp);
}

Test(peers, allow_list_with_the_uid_accepts)
{
	skip_unless_root();
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	const char *extra[] = {"--allow-uid", "1234,65534", NULL};
	cr_assert_eq(sidecar_start(&sp, extra, NULL), 0);
	cr_assert_eq(connect_as_nobody(sp.socket), MOE_OK);
	cr_assert(log_wait(&sp, "uid=65534", 1, 5000));
	sidecar_cleanup(&sp);
}

/* A server bound by uid 65534 (a child that became it): reports through `report` how many
 * bytes its one client sent before hanging up. */
struct fake_server {
	pid_t pid;
	int report;
	char path[100];
};

static struct fake_server start_fake_server(const char *dir)
{
	struct fake_server f = {0};
	snprintf(f.path, sizeof(f.path), "%s/fake.sock", dir);
	int ready[2], report[2];
	cr_assert_eq(pipe(ready), 0);
	cr_assert_eq(pipe(report), 0);
	f.pid = fork();
	cr_assert_geq(f.pid, 0);
	if (f.pid == 0) {
		close(ready[0]);
		close(report[0]);
		if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
		    setresuid(NOBODY, NOBODY, NOBODY) != 0)
			_exit(200);
		int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_un a = {.sun_family = AF_UNIX};
		snprintf(a.sun_path, sizeof(a.sun_path), "%s", f.path);
		if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) != 0 ||
		    chmod(f.path, 0666) || listen(s, 4) != 0)
			_exit(201);
		if (write(ready[1], "r", 1) != 1)
			_exit(202);
		int c = accept(s, NULL, NULL);
		uint32_t got = 0;
		char buf[512];
		ssize_t n;
		while (c >= 0 && (n = read(c, buf, sizeof(buf))) > 0) {
			got += (uint32_t)n;
			if (got >= sizeof(struct moe_hello))
				break; /* a whole hello: hang up, the client sees EOF */
		}
		if (write(report[1], &got, sizeof(got)) != sizeof(got))
			_exit(203);
		_exit(0);
	}
	close(ready[1]);
	close(report[1]);
	char r;
	cr_assert_eq(read(ready[0], &r, 1), 1, "the fake server did not start");
	close(ready[0]);
	f.report = report[0];
	return f;
}

static uint32_t fake_server_bytes(struct fake_server *f)
{
	uint32_t got = UINT32_MAX;
	cr_assert_eq(read(f->report, &got, sizeof(got)), (ssize_t)sizeof(got));
	close(f->report);
	int st;
	cr_assert_eq(waitpid(f->pid, &st, 0), f->pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fake server status 0x%x", st);
	return got;
}

/* Root's client meets a server another user bound at the path: refused before a byte of the
 * hello leaves, with both uids named. */
Test(peers, client_refuses_a_server_of_another_uid_before_sending)
{
	skip_unless_root();
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(chmod(sp.dir, 0777), 0);
	struct fake_server f = start_fake_server(sp.dir);
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {.socket_path = f.path, .timeout_ms = 5000};
	int rc = moe_connect(&o, &c);
	cr_expect_eq(rc, MOE_EREFUSED, "%s: %s", moe_strerror(rc), moe_connect_error());
	cr_expect(strstr(moe_connect_error(), "runs as uid 65534"), "%s", moe_connect_error());
	cr_expect(strstr(moe_connect_error(), "this client's uid 0"), "%s", moe_connect_error());
	cr_expect_null(c);
	cr_expect_eq(fake_server_bytes(&f), 0, "the client sent its hello to another uid");
	sidecar_cleanup(&sp);
}

/* Naming the uid in server_uid lets the hello go (the fake server then hangs up). */
Test(peers, client_talks_to_the_uid_it_names_in_server_uid)
{
	skip_unless_root();
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(chmod(sp.dir, 0777), 0);
	struct fake_server f = start_fake_server(sp.dir);
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {
	    .socket_path = f.path, .timeout_ms = 5000, .server_uid = NOBODY};
	int rc = moe_connect(&o, &c);
	cr_expect_neq(rc, MOE_OK, "the fake server sends no welcome");
	cr_expect_not(strstr(moe_connect_error(), "runs as uid"), "%s", moe_connect_error());
	cr_expect_eq(fake_server_bytes(&f), sizeof(struct moe_hello), "the hello was not sent");
	sidecar_cleanup(&sp);
}

Test(peers, unknown_connect_flags_are_refused)
{
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {.socket_path = "/nonexistent/s.sock", .flags = 0x80};
	cr_expect_eq(moe_connect(&o, &c), MOE_EINVAL);
	cr_expect(strstr(moe_connect_error(), "opts.flags 0x80"), "%s", moe_connect_error());
}

/* A path that exists but is a plain file: say so, not "is moe-sidecar serve running?". */
Test(peers, a_path_that_is_not_a_socket_is_named_as_such)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char path[96];
	snprintf(path, sizeof(path), "%s/plain", sp.dir);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fclose(f);
	struct moe_client *c = NULL;
	struct moe_connect_opts o = {.socket_path = path, .timeout_ms = 1000};
	cr_expect_eq(moe_connect(&o, &c), MOE_ECONNECT);
	cr_expect(strstr(moe_connect_error(), "not a socket"), "%s", moe_connect_error());
	cr_expect_not(strstr(moe_connect_error(), "is moe-sidecar serve running"), "%s",
	              moe_connect_error());
	sidecar_cleanup(&sp);
}
