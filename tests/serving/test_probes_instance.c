/* test_probes_instance.c — the probe instance a sidecar takes without --probes-instance
 * follows its socket: "default" for the system socket, "sock-<hash>" of the canonical path
 * otherwise, one name for every spelling of one path and different names for different
 * sockets, always a name the probes accept.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pagecache.h"
#include "probes_instance.h"

static void name_of(const char *path, char name[PROBES_INSTANCE_NAME_LEN])
{
	struct sidecar_error err = {0};
	cr_assert_eq(probes_instance_for_socket(path, name, &err), 0, "%s: %s", path, err.msg);
	cr_assert_eq(pagecache_check_instance_name(name, &err), 0, "%s -> %s: %s", path, name,
	             err.msg);
}

static bool is_hashed(const char *name)
{
	if (strncmp(name, "sock-", 5) || strlen(name) != 5 + 16)
		return false;
	return strspn(name + 5, "0123456789abcdef") == 16;
}

/* A temp directory holding a/ and a link l -> a; returns its path (static). */
static const char *scratch(void)
{
	static char dir[64];
	snprintf(dir, sizeof(dir), "/tmp/moe-test-instance.XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/a", dir);
	cr_assert_eq(mkdir(p, 0700), 0);
	char l[PATH_MAX];
	snprintf(l, sizeof(l), "%s/l", dir);
	cr_assert_eq(symlink("a", l), 0);
	return dir;
}

static void scratch_remove(const char *dir)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/l", dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/a", dir);
	rmdir(p);
	rmdir(dir);
}

Test(probes_instance, the_system_socket_keeps_the_default_instance)
{
	char name[PROBES_INSTANCE_NAME_LEN];
	name_of(PROBES_INSTANCE_SYSTEM_SOCKET, name);
	cr_assert_str_eq(name, "default");
}

Test(probes_instance, different_sockets_get_different_instances)
{
	const char *dir = scratch();
	char a[PATH_MAX], b[PATH_MAX], na[PROBES_INSTANCE_NAME_LEN], nb[PROBES_INSTANCE_NAME_LEN];
	snprintf(a, sizeof(a), "%s/a/sidecar.sock", dir);
	snprintf(b, sizeof(b), "%s/a/sidecar2.sock", dir);
	name_of(a, na);
	name_of(b, nb);
	cr_expect(is_hashed(na), "%s -> %s", a, na);
	cr_expect(is_hashed(nb), "%s -> %s", b, nb);
	cr_expect_str_neq(na, nb, "%s and %s share instance %s", a, b, na);
	/* And one other directory, same socket name. */
	char c[PATH_MAX], nc[PROBES_INSTANCE_NAME_LEN];
	snprintf(c, sizeof(c), "%s/sidecar.sock", dir);
	name_of(c, nc);
	cr_expect_str_neq(na, nc, "%s and %s share instance %s", a, c, na);
	scratch_remove(dir);
}

Test(probes_instance, every_spelling_of_one_socket_names_one_instance)
{
	const char *dir = scratch();
	char want[PROBES_INSTANCE_NAME_LEN], got[PROBES_INSTANCE_NAME_LEN], p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/a/s.sock", dir);
	name_of(p, want);
	static const char *const spellings[] = {"%s/a/./s.sock", "%s/a/../a/s.sock", "%s//a/s.sock",
	                                        "%s/l/s.sock"};
	for (size_t i = 0; i < sizeof(spellings) / sizeof(spellings[0]); i++) {
		snprintf(p, sizeof(p), spellings[i], dir);
		name_of(p, got);
		cr_expect_str_eq(got, want, "%s", p);
	}
	/* Relative to the working directory, as `serve --socket s.sock` is. */
	char cwd[PATH_MAX];
	cr_assert_not_null(getcwd(cwd, sizeof(cwd)));
	snprintf(p, sizeof(p), "%s/a", dir);
	cr_assert_eq(chdir(p), 0);
	name_of("s.sock", got);
	cr_expect_str_eq(got, want, "s.sock in %s", p);
	name_of("./s.sock", got);
	cr_expect_str_eq(got, want, "./s.sock in %s", p);
	cr_assert_eq(chdir(cwd), 0);
	scratch_remove(dir);
}

Test(probes_instance, a_missing_directory_or_no_file_name_is_an_error)
{
	char name[PROBES_INSTANCE_NAME_LEN];
	struct sidecar_error err = {0};
	cr_expect_eq(probes_instance_for_socket("/nonexistent-moe-dir/x/s.sock", name, &err), -1);
	cr_expect_eq(err.status, MOE_ESYS);
	cr_expect(strstr(err.msg, "/nonexistent-moe-dir/x") != NULL, "%s", err.msg);
	err = (struct sidecar_error){0};
	cr_expect_eq(probes_instance_for_socket("/tmp/", name, &err), -1);
	cr_expect_eq(err.status, MOE_EINVAL, "%s", err.msg);
}
