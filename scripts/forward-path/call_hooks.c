/* call_hooks.c — the -finstrument-functions hooks behind scripts/forward-path.sh.
 *
 * Linked into every program of the measurement build (never compiled with instrumentation
 * itself). Each thread keeps a shadow stack of the instrumented functions it is in, always;
 * while recording is on, every function entry appends (thread, function, calling function,
 * call site, time) to one process-wide buffer. The calling function is the shadow stack's top: an
 * inlined call is still a call from the function it was written in.
 *
 * Recording is switched by fp_record(1/0) (the driver, in its own process) or, where the
 * environment holds FP_SIGNALS=1 at start-up, by SIGUSR1 (on) and SIGUSR2 (off, then dump).
 * SIGUSR1 answers by creating DIR/fp-PID.on (DIR: $FP_OUT, else /tmp) once recording.
 * fp_dump(dir) writes DIR/fp-PID.bin (a header, the records), DIR/fp-PID.maps (a copy of
 * /proc/self/maps, for the load addresses) and DIR/fp-PID.threads ("tid name" lines) — the
 * .bin last, through a rename, so its appearance means the dump is complete.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NOI __attribute__((no_instrument_function))
#define FP_STACK 1024
#define FP_CAP (4u << 20) /* records */

struct fp_rec {
	uint64_t fn, caller, site;
	uint32_t tid, depth;
	uint64_t ns; /* CLOCK_MONOTONIC: comparable across the two processes */
};

struct fp_header {
	char magic[8]; /* "FPCALLS1" */
	uint64_t n, dropped, rec_size;
};

static struct fp_rec *fp_buf;
static atomic_size_t fp_n;
static atomic_size_t fp_dropped;
static atomic_int fp_on;
static char fp_dir[512] = "/tmp";

static __thread uintptr_t fp_stack[FP_STACK];
static __thread unsigned fp_depth;
static __thread uint32_t fp_tid;

void __cyg_profile_func_enter(void *fn, void *site) NOI;
void __cyg_profile_func_exit(void *fn, void *site) NOI;
void fp_record(int on) NOI;
int fp_dump(const char *dir) NOI;

void __cyg_profile_func_enter(void *fn, void *site)
{
	unsigned d = fp_depth;
	uintptr_t caller = d > 0 && d <= FP_STACK ? fp_stack[d - 1] : 0;
	if (d < FP_STACK)
		fp_stack[d] = (uintptr_t)fn;
	fp_depth = d + 1;
	if (!atomic_load_explicit(&fp_on, memory_order_relaxed) || !fp_buf)
		return;
	if (!fp_tid)
		fp_tid = (uint32_t)syscall(SYS_gettid);
	size_t i = atomic_fetch_add_explicit(&fp_n, 1, memory_order_relaxed);
	if (i >= FP_CAP) {
		atomic_fetch_add_explicit(&fp_dropped, 1, memory_order_relaxed);
		return;
	}
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	fp_buf[i] = (struct fp_rec){
	    (uintptr_t)fn, caller, (uintptr_t)site,
	    fp_tid,        d,      (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec};
}

void __cyg_profile_func_exit(void *fn, void *site)
{
	(void)fn;
	(void)site;
	if (fp_depth > 0)
		fp_depth--;
}

void fp_record(int on)
{
	if (on && !fp_buf) {
		void *p = mmap(NULL, (size_t)FP_CAP * sizeof(struct fp_rec), PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED)
			return;
		fp_buf = p;
	}
	if (on) {
		atomic_store(&fp_n, 0);
		atomic_store(&fp_dropped, 0);
	}
	atomic_store(&fp_on, on);
}

/* write(2) until done; async-signal-safe. */
static int NOI put(int fd, const void *p, size_t len)
{
	const char *c = p;
	while (len > 0) {
		ssize_t w = write(fd, c, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		len -= (size_t)w;
	}
	return 0;
}

static void NOI path(char *out, size_t cap, const char *dir, const char *name, const char *ext)
{
	/* snprintf is not async-signal-safe; build "DIR/NAME-PID.EXT" by hand. */
	char pid[24];
	int n = 0;
	long v = (long)getpid();
	char rev[24];
	do {
		rev[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v > 0);
	for (int i = 0; i < n; i++)
		pid[i] = rev[n - 1 - i];
	pid[n] = 0;
	out[0] = 0;
	size_t len = 0;
	const char *parts[] = {dir, "/", name, "-", pid, ".", ext};
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
		for (const char *c = parts[i]; *c && len + 1 < cap; c++)
			out[len++] = *c;
	out[len] = 0;
}

static int NOI copy_file(const char *from, const char *to)
{
	int in = open(from, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return -1;
	int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out < 0) {
		close(in);
		return -1;
	}
	char b[4096];
	ssize_t r;
	int rc = 0;
	while ((r = read(in, b, sizeof(b))) > 0)
		if (put(out, b, (size_t)r) != 0) {
			rc = -1;
			break;
		}
	close(in);
	close(out);
	return rc;
}

int fp_dump(const char *dir)
{
	atomic_store(&fp_on, 0);
	char p[600], tmp[600];
	size_t n = atomic_load(&fp_n);
	if (n > FP_CAP)
		n = FP_CAP;
	path(p, sizeof(p), dir, "fp", "maps");
	copy_file("/proc/self/maps", p);
	/* The threads' names: every thread now alive ("tid name" lines). */
	path(p, sizeof(p), dir, "fp", "threads");
	int tf = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (tf >= 0) {
		int d = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		char dents[8192];
		long got;
		while (d >= 0 && (got = syscall(SYS_getdents64, d, dents, sizeof(dents))) > 0) {
			for (long off = 0; off < got;) {
				unsigned short reclen = *(unsigned short *)(dents + off + 16);
				const char *name = dents + off + 19;
				off += reclen;
				if (name[0] < '0' || name[0] > '9')
					continue;
				char cp[128] = "/proc/self/task/";
				size_t l = strlen(cp);
				for (const char *c = name; *c && l + 6 < sizeof(cp); c++)
					cp[l++] = *c;
				memcpy(cp + l, "/comm", 6);
				char comm[64];
				int cf = open(cp, O_RDONLY | O_CLOEXEC);
				ssize_t r = cf >= 0 ? read(cf, comm, sizeof(comm) - 1) : -1;
				if (cf >= 0)
					close(cf);
				if (r <= 0)
					continue;
				put(tf, name, strlen(name));
				put(tf, " ", 1);
				put(tf, comm, (size_t)r); /* ends with '\n' */
			}
		}
		if (d >= 0)
			close(d);
		close(tf);
	}
	path(tmp, sizeof(tmp), dir, "fp", "bin.tmp");
	path(p, sizeof(p), dir, "fp", "bin");
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	struct fp_header h = {{'F', 'P', 'C', 'A', 'L', 'L', 'S', '1'},
	                      n,
	                      atomic_load(&fp_dropped),
	                      sizeof(struct fp_rec)};
	int rc = put(fd, &h, sizeof(h));
	if (rc == 0 && n > 0)
		rc = put(fd, fp_buf, n * sizeof(struct fp_rec));
	close(fd);
	if (rc == 0)
		rc = rename(tmp, p);
	return rc;
}

static void NOI on_signal(int sig)
{
	int saved = errno;
	if (sig == SIGUSR1) {
		fp_record(1);
		char p[600]; /* DIR/fp-PID.on says "recording" to whoever sent the signal */
		path(p, sizeof(p), fp_dir, "fp", "on");
		int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd >= 0)
			close(fd);
	} else
		fp_dump(fp_dir);
	errno = saved;
}

static void NOI fp_init(void) __attribute__((constructor));
static void fp_init(void)
{
	const char *s = getenv("FP_SIGNALS");
	if (!s || strcmp(s, "1") != 0)
		return;
	const char *d = getenv("FP_OUT");
	if (d && strlen(d) < sizeof(fp_dir))
		strcpy(fp_dir, d);
	fp_record(1); /* map the buffer now, not in a signal handler */
	fp_record(0);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
}
