/* test_probe_cmd.c — `moe-sidecar probe` as an operator runs it: the first sample is printed
 * once the files are watched, reads made after it show up in the sample printed on SIGINT,
 * the pins are gone after exit, and bad arguments get a clear error and exit status 2.
 * Needs root for the counting test (skipped with the reason otherwise).
 */
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

#include "pagecache.h"

#define FILE_SIZE (4u << 20)

static char test_dir[256];
static char test_file[300];

static void make_test_file(void)
{
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	snprintf(test_dir, sizeof(test_dir), "%s/moe-probe-cmd-XXXXXX", tmp);
	cr_assert_not_null(mkdtemp(test_dir));
	snprintf(test_file, sizeof(test_file), "%s/model.gguf", test_dir);
	int fd = open(test_file, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0);
	static char block[1 << 16];
	memset(block, 0x5a, sizeof(block));
	for (size_t done = 0; done < FILE_SIZE; done += sizeof(block))
		cr_assert_eq(write(fd, block, sizeof(block)), (ssize_t)sizeof(block));
	cr_assert_eq(fdatasync(fd), 0);
	cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	close(fd);
}

static void remove_test_file(void)
{
	unlink(test_file);
	rmdir(test_dir);
}

/* Runs moe-sidecar with args; its stdout comes through *out_fd, stderr is merged into it. */
static pid_t spawn_sidecar(char *const args[], int *out_fd)
{
	int pipefd[2];
	cr_assert_eq(pipe(pipefd), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(pipefd[1], STDOUT_FILENO);
		dup2(pipefd[1], STDERR_FILENO);
		close(pipefd[0]);
		execv(MOE_SIDECAR_BIN, args);
		_exit(127);
	}
	close(pipefd[1]);
	*out_fd = pipefd[0];
	return pid;
}

/* One line from fd (unbuffered, so nothing past it is consumed); false at EOF. */
static bool read_line(int fd, char *buf, size_t len)
{
	size_t n = 0;
	char c;
	while (n + 1 < len && read(fd, &c, 1) == 1) {
		if (c == '\n') {
			buf[n] = '\0';
			return true;
		}
		buf[n++] = c;
	}
	buf[n] = '\0';
	return n > 0;
}

/* The first JSON sample line, skipping log lines. */
static bool read_sample(int fd, char *buf, size_t len)
{
	while (read_line(fd, buf, len))
		if (buf[0] == '{')
			return true;
	return false;
}

static unsigned long long field_of(const char *json, const char *name)
{
	char needle[64];
	snprintf(needle, sizeof(needle), "\"%s\":", name);
	const char *at = strstr(json, needle);
	cr_assert_not_null(at, "no %s in %s", name, json);
	return strtoull(at + strlen(needle), NULL, 10);
}

Test(probe_cmd, counts_reads_made_while_it_runs_and_unpins_on_sigint, .fini = remove_test_file)
{
	struct pagecache_probes *p;
	char instance[64];
	struct sidecar_error err = {0};
	snprintf(instance, sizeof(instance), "test-cmd-%d", (int)getpid());
	struct pagecache_options opt = {.instance = instance, .quiet = true};
	cr_assert_eq(pagecache_open(&opt, &p, &err), 0, "%s", err.msg);
	bool available = pagecache_available(p);
	char why[800];
	snprintf(why, sizeof(why), "%s", pagecache_status(p));
	pagecache_close(p);
	if (!available)
		cr_skip_test("BPF probes %s", why);

	make_test_file();
	char *args[] = {"moe-sidecar", "probe",      "--watch", test_file,   "--json", "--interval",
	                "3600",        "--instance", instance,  "--per-pid", NULL};
	int out;
	pid_t pid = spawn_sidecar(args, &out);
	char line[8192];
	cr_assert(read_sample(out, line, sizeof(line)), "no first sample");
	cr_expect_eq(field_of(line, "pagecache_fill_bytes"), 0, "%s", line);

	int fd = open(test_file, O_RDONLY | O_CLOEXEC);
	char buf[65536];
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	close(fd);
	kill(pid, SIGINT);
	cr_assert(read_sample(out, line, sizeof(line)), "no sample after SIGINT");
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	close(out);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
	cr_expect(strstr(line, "\"path\":\"") && strstr(line, "model.gguf"), "%s", line);
	cr_expect_eq(field_of(line, "pagecache_fill_bytes"), FILE_SIZE, "%s", line);
	cr_expect_eq(field_of(line, "buffered_bytes"), FILE_SIZE, "%s", line);
	cr_expect_eq(field_of(line, "resident_bytes"), FILE_SIZE, "cachestat: %s", line);
	cr_expect(strstr(line, "\"bypass_ratio\":0.000000"), "%s", line);
	char me[64]; /* --per-pid: this test process is one of the readers */
	snprintf(me, sizeof(me), "{\"pid\":%d,", (int)getpid());
	const char *mine = strstr(line, me);
	cr_expect_not_null(mine, "no per-pid entry for %d in %s", (int)getpid(), line);
	if (mine)
		cr_expect_eq(field_of(mine, "buffered_bytes"), FILE_SIZE, "%s", mine);
	char dir[256];
	snprintf(dir, sizeof(dir), "/sys/fs/bpf/moe-sidecar/%s", instance);
	struct stat st;
	cr_expect_neq(stat(dir, &st), 0, "%s left behind", dir);
}

static void expect_usage_error(char *const args[], const char *message)
{
	int out;
	pid_t pid = spawn_sidecar(args, &out);
	char log[4096];
	size_t n = 0;
	ssize_t got;
	while (n < sizeof(log) - 1 && (got = read(out, log + n, sizeof(log) - 1 - n)) > 0)
		n += (size_t)got;
	log[n] = '\0';
	close(out);
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 2, "status %d: %s", status, log);
	cr_expect(strstr(log, message), "want '%s' in: %s", message, log);
}

Test(probe_cmd, bad_arguments_are_named)
{
	expect_usage_error((char *[]){"moe-sidecar", "probe", NULL}, "nothing to watch");
	expect_usage_error((char *[]){"moe-sidecar", "probe", "--watch", NULL},
	                   "--watch needs at least one FILE");
	expect_usage_error(
	    (char *[]){"moe-sidecar", "probe", "--watch", "/nonexistent/model.gguf", NULL},
	    "/nonexistent/model.gguf: No such file or directory");
	expect_usage_error(
	    (char *[]){"moe-sidecar", "probe", "--watch", "/etc/passwd", "--interval", "-1", NULL},
	    "--interval '-1'");
	expect_usage_error(
	    (char *[]){"moe-sidecar", "probe", "--watch", "/etc/passwd", "--count", "0", NULL},
	    "--count '0'");
	expect_usage_error((char *[]){"moe-sidecar", "probe", "--watch", "/etc/passwd",
	                              "--instance", "../../etc", NULL},
	                   "instance name '../../etc' is invalid");
	expect_usage_error((char *[]){"moe-sidecar", "probe", "--bogus", NULL},
	                   "unknown option '--bogus'");
}
