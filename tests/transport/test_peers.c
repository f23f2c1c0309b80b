/* test_peers.c — who may connect: another uid (a child dropped to nobody, 65534) is refused
 * by file permissions in the default mode, by SO_PEERCRED with an allow-list that does not
 * name it, and accepted with one that does. Needs root to change uid. */
#include <criterion/criterion.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "moe_client.h"

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
