/* test_socket_dir.c — the socket's directory and the files in it are the ones the sidecar
 * checked and made: a symlink planted at the directory's path is refused (and its target
 * left alone), files swapped in under the socket's or the lock's name while it runs are not
 * deleted when it stops, and a lock "file" that is a hard link to someone's file is not
 * written into. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "moe_client.h"

static void write_text(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

/* The file's content, or "" if it cannot be read. */
static const char *content_of(const char *path)
{
	static char buf[256];
	buf[0] = '\0';
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return buf;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	buf[n > 0 ? n : 0] = '\0';
	close(fd);
	return buf;
}

/* A world-writable sticky directory (like /tmp) holds a symlink to a directory of ours that
 * passes every check a stat() would make; the sidecar is pointed through the link. */
Test(socket_dir, a_planted_symlink_directory_is_refused_and_its_target_left_alone)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char pub[64], victim[64], lock[100], sock[100], link[72];
	snprintf(pub, sizeof(pub), "%s/pub", sp.dir);
	snprintf(victim, sizeof(victim), "%s/victim", sp.dir);
	cr_assert_eq(mkdir(pub, 0777), 0);
	cr_assert_eq(chmod(pub, 01777), 0);
	cr_assert_eq(mkdir(victim, 0755), 0);
	snprintf(lock, sizeof(lock), "%s/sidecar.sock.lock", victim);
	snprintf(sock, sizeof(sock), "%s/sidecar.sock", victim);
	write_text(lock, "precious\n");
	snprintf(link, sizeof(link), "%s/moe", pub);
	cr_assert_eq(symlink(victim, link), 0);
	snprintf(sp.socket, sizeof(sp.socket), "%s/sidecar.sock", link);

	int st = 0;
	cr_assert_neq(sidecar_start(&sp, NULL, &st), 0, "the sidecar served through a symlink");
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x", st);
	cr_expect_eq(log_count(&sp, "is a symbolic link; refusing it"), 1, "%s",
	             content_of(sp.log));
	cr_expect_str_eq(content_of(lock), "precious\n", "the link's target was written into");
	struct stat s;
	cr_expect_neq(lstat(sock, &s), 0, "a socket was made in the link's target");
	sidecar_cleanup(&sp);
}

/* While the sidecar runs, regular files are renamed over its socket and its lock file (by
 * whoever can write the directory); stopping it must leave them, not unlink by name. */
Test(socket_dir, files_swapped_in_while_serving_are_not_deleted_at_stop)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	struct moe_client *c;
	struct moe_connect_opts o = {.socket_path = sp.socket};
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "%s", moe_connect_error());
	moe_close(c);

	char lock[160], swap[160];
	snprintf(lock, sizeof(lock), "%s.lock", sp.socket);
	snprintf(swap, sizeof(swap), "%s/swap", sp.dir);
	write_text(swap, "not the socket\n");
	cr_assert_eq(rename(swap, sp.socket), 0, "%s", strerror(errno));
	write_text(swap, "not the lock\n");
	cr_assert_eq(rename(swap, lock), 0, "%s", strerror(errno));

	int st = sidecar_stop(&sp, SIGTERM);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	cr_expect_str_eq(content_of(sp.socket), "not the socket\n",
	                 "the swapped-in file was deleted");
	cr_expect_str_eq(content_of(lock), "not the lock\n", "the swapped-in file was deleted");
	cr_expect_eq(log_count(&sp, "not removing"), 2, "%s", content_of(sp.log));
	sidecar_cleanup(&sp);
}

/* A lock file with a second name elsewhere is not ours to truncate and write a pid into. */
Test(socket_dir, a_hard_linked_lock_file_is_not_written_into)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char run[128], lock[160], precious[128];
	snprintf(run, sizeof(run), "%s/run", sp.dir);
	cr_assert_eq(mkdir(run, 0700), 0);
	snprintf(precious, sizeof(precious), "%s/precious", sp.dir);
	write_text(precious, "precious\n");
	snprintf(lock, sizeof(lock), "%s.lock", sp.socket);
	cr_assert_eq(link(precious, lock), 0, "%s", strerror(errno));
	int st = 0;
	cr_assert_neq(sidecar_start(&sp, NULL, &st), 0);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x", st);
	cr_expect_eq(log_count(&sp, "is not a lock file of ours"), 1, "%s", content_of(sp.log));
	cr_expect_str_eq(content_of(precious), "precious\n");
	sidecar_cleanup(&sp);
}

/* The attack, whole: in a sticky world-writable directory uid 65534 plants a link to
 * a directory of its own; root is pointed through it. Refused at the link, naming it, and
 * nothing is made where the link leads. */
#define NOBODY 65534

static void skip_unless_root(void)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to give a directory to another uid (65534)");
}

/* <dir>/sticky, mode 1777 like /tmp. */
static void make_sticky(const struct sidecar_proc *sp, char *sticky, size_t len)
{
	snprintf(sticky, len, "%s/sticky", sp->dir);
	cr_assert_eq(mkdir(sticky, 0777), 0);
	cr_assert_eq(chmod(sticky, 01777), 0);
}

Test(socket_dir, an_ancestor_link_of_another_uid_is_refused_naming_it)
{
	skip_unless_root();
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char sticky[64], theirs[64], link[80];
	make_sticky(&sp, sticky, sizeof(sticky));
	snprintf(theirs, sizeof(theirs), "%s/theirs", sp.dir);
	cr_assert_eq(mkdir(theirs, 0755), 0);
	cr_assert_eq(chown(theirs, NOBODY, NOBODY), 0);
	snprintf(link, sizeof(link), "%s/link", sticky);
	cr_assert_eq(symlink(theirs, link), 0);
	cr_assert_eq(lchown(link, NOBODY, NOBODY), 0);
	snprintf(sp.socket, sizeof(sp.socket), "%s/run/s.sock", link);
	int st = 0;
	cr_assert_neq(sidecar_start(&sp, NULL, &st), 0, "served through another uid's link");
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x", st);
	char want[160];
	snprintf(want, sizeof(want), "%s is a symbolic link; refusing it", link);
	cr_expect_eq(log_count(&sp, want), 1, "%s", content_of(sp.log));
	char run[96];
	snprintf(run, sizeof(run), "%s/run", theirs);
	struct stat s;
	cr_expect_neq(lstat(run, &s), 0, "the socket directory was made in the link's target");
	sidecar_cleanup(&sp);
}

/* No link at all: a real directory of uid 65534's inside the sticky one. Root making run/
 * in it would let 65534 rename run/ away and bind its own socket at the path. */
Test(socket_dir, an_ancestor_another_uid_can_rename_is_refused_naming_it)
{
	skip_unless_root();
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char sticky[64], theirs[80];
	make_sticky(&sp, sticky, sizeof(sticky));
	snprintf(theirs, sizeof(theirs), "%s/theirs", sticky);
	cr_assert_eq(mkdir(theirs, 0755), 0);
	cr_assert_eq(chown(theirs, NOBODY, NOBODY), 0);
	snprintf(sp.socket, sizeof(sp.socket), "%s/run/s.sock", theirs);
	int st = 0;
	cr_assert_neq(sidecar_start(&sp, NULL, &st), 0, "served inside another uid's directory");
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x", st);
	char want[160];
	snprintf(want, sizeof(want), "%s can be renamed away by another user", theirs);
	cr_expect_eq(log_count(&sp, want), 1, "%s", content_of(sp.log));
	cr_expect_eq(log_count(&sp, "is owned by uid 65534"), 1, "%s", content_of(sp.log));
	char run[96];
	snprintf(run, sizeof(run), "%s/run", theirs);
	struct stat s;
	cr_expect_neq(lstat(run, &s), 0, "the socket directory was made in 65534's directory");
	sidecar_cleanup(&sp);
}

/* A directory of ours in the same sticky directory is safe (only we or root can rename it),
 * as is a group-writable one further down only when sticky: the walk refuses what another
 * uid can change, not every shared directory. */
Test(socket_dir, a_directory_of_ours_in_a_sticky_one_is_served)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char sticky[64], mine[80];
	make_sticky(&sp, sticky, sizeof(sticky));
	snprintf(mine, sizeof(mine), "%s/mine", sticky);
	cr_assert_eq(mkdir(mine, 0755), 0);
	snprintf(sp.socket, sizeof(sp.socket), "%s/run/s.sock", mine);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0, "%s", content_of(sp.log));
	struct moe_client *c;
	struct moe_connect_opts o = {.socket_path = sp.socket};
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "%s", moe_connect_error());
	moe_close(c);
	sidecar_stop(&sp, SIGTERM);
	sidecar_cleanup(&sp);
}

/* A group-writable, non-sticky directory on the way lets the group rename entries. */
Test(socket_dir, a_group_writable_ancestor_is_refused)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char shared[64];
	snprintf(shared, sizeof(shared), "%s/shared", sp.dir);
	cr_assert_eq(mkdir(shared, 0755), 0);
	cr_assert_eq(chmod(shared, 0775), 0);
	snprintf(sp.socket, sizeof(sp.socket), "%s/sub/run/s.sock", shared);
	char sub[80];
	snprintf(sub, sizeof(sub), "%s/sub", shared);
	cr_assert_eq(mkdir(sub, 0755), 0);
	int st = 0;
	cr_assert_neq(sidecar_start(&sp, NULL, &st), 0);
	cr_expect_eq(log_count(&sp, "mode 775 (writable by its group)"), 1, "%s",
	             content_of(sp.log));
	sidecar_cleanup(&sp);
}

/* ".." is refused: a client resolving "x/.." goes wherever x leads once x is replaced. */
Test(socket_dir, a_path_with_dotdot_is_refused)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char sub[64];
	snprintf(sub, sizeof(sub), "%s/sub", sp.dir);
	cr_assert_eq(mkdir(sub, 0755), 0);
	snprintf(sp.socket, sizeof(sp.socket), "%s/sub/../run/s.sock", sp.dir);
	int st = 0;
	cr_assert_neq(sidecar_start(&sp, NULL, &st), 0);
	cr_expect_eq(log_count(&sp, "'..' in the path"), 1, "%s", content_of(sp.log));
	sidecar_cleanup(&sp);
}

/* --allow-uid with a socket directory that uid cannot search: served, with a warning naming
 * the uid, the directory and its mode (the uid's clients would only see EACCES). */
Test(socket_dir, allow_uid_that_cannot_traverse_the_directory_is_warned)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char run[64];
	snprintf(run, sizeof(run), "%s/run", sp.dir);
	cr_assert_eq(mkdir(run, 0700), 0);
	cr_assert_eq(chmod(run, 0700), 0);
	const char *extra[] = {"--allow-uid", "4321", NULL};
	cr_assert_eq(sidecar_start(&sp, extra, NULL), 0, "%s", content_of(sp.log));
	char want[320];
	snprintf(want, sizeof(want),
	         "--allow-uid 4321 cannot reach the socket %s: directory %s "
	         "has mode 700",
	         sp.socket, run);
	cr_expect_eq(log_count(&sp, want), 1, "%s", content_of(sp.log));
	sidecar_stop(&sp, SIGTERM);
	sidecar_cleanup(&sp);
}
