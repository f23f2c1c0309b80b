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
