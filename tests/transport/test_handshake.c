/* test_handshake.c — the handshake against a real sidecar process: version refusal both
 * ways, limit refusals, one sidecar per socket path, stale sockets, file modes, and a clean
 * SIGTERM shutdown that removes the socket and lock file. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "moe_client.h"
#include "moe_proto.h"
#include "moe_ring.h"

static int raw_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "connect %s: %s", path,
	             strerror(errno));
	return fd;
}

static size_t read_all(int fd, void *buf, size_t cap)
{
	size_t have = 0;
	for (;;) {
		ssize_t n = recv(fd, (char *)buf + have, cap - have, 0);
		if (n <= 0)
			return have;
		have += (size_t)n;
	}
}

/* Sends a 128-byte hello of protocol major.minor, as a client of that version would. */
static void send_hello(int fd, uint16_t major, uint16_t minor, const char *name)
{
	struct moe_hello h;
	moe_hello_init(&h, name);
	h.abi_major = major;
	h.abi_minor = minor;
	cr_assert_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
}

Test(handshake_proc, sidecar_refuses_a_newer_major_with_a_reason)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	int fd = raw_connect(sp.socket);
	send_hello(fd, 2, 3, "from-the-future");
	struct moe_welcome w;
	size_t n = read_all(fd, &w, sizeof(w));
	close(fd);
	cr_assert_geq(n, MOE_WELCOME_FROZEN, "a readable refusal arrived (%zu bytes)", n);
	cr_assert_eq(w.magic, MOE_WELCOME_MAGIC);
	cr_assert_eq(w.status, MOE_EVERSION);
	char ours[16];
	snprintf(ours, sizeof(ours), "%u.%u", MOE_ABI_MAJOR, MOE_ABI_MINOR);
	cr_assert(strstr(w.reason, "2.3") && strstr(w.reason, ours), "reason: %s", w.reason);
	cr_assert(log_wait(&sp, "incompatible protocol version", 1, 5000),
	          "the sidecar logs the refusal");
	/* And it keeps serving. */
	struct moe_client *c;
	struct moe_connect_opts o = {.socket_path = sp.socket};
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "%s", moe_connect_error());
	cr_assert_eq(moe_ping(c, 5000), MOE_OK);
	moe_close(c);
	cr_assert_eq(sidecar_stop(&sp, SIGTERM), 0);
	sidecar_cleanup(&sp);
}

/* A client of ABI 1.0 — its 128-byte hello with minor 0 — is served by this sidecar: the
 * welcome accepts it with a channel, and a PING goes through the rings as 1.0 defined them. */
Test(handshake_proc, a_client_of_abi_1_0_is_served)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	int fd = raw_connect(sp.socket);
	send_hello(fd, 1, 0, "abi-1.0"); /* 1.0's hello was these 128 bytes too */
	struct moe_welcome w;
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = &w, .iov_len = sizeof(w)};
	struct msghdr msg = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b)};
	cr_assert_eq(recvmsg(fd, &msg, MSG_WAITALL), (ssize_t)sizeof(w));
	cr_assert_eq(w.status, MOE_OK, "refused: %s", w.reason);
	cr_assert_eq(w.abi_major, 1);
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
	cr_assert(cm && cm->cmsg_type == SCM_RIGHTS, "the channel fd came with the welcome");
	int memfd;
	memcpy(&memfd, CMSG_DATA(cm), sizeof(int));
	struct moe_layout l;
	cr_assert_eq(moe_layout_compute(&w.limits, &l), MOE_OK);
	cr_assert_eq(l.total, w.channel_bytes, "1.0's layout rule still gives the channel size");
	uint8_t *base = mmap(NULL, l.total, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	cr_assert_neq(base, MAP_FAILED);
	close(memfd);
	struct moe_ring_prod sq;
	struct moe_ring_cons cq;
	const uint32_t start = moe_channel_ring_start(w.epoch);
	moe_ring_prod_attach(&sq, (struct moe_ring_ctrl *)(base + l.sq_ctrl), l.ring_entries,
	                     start);
	moe_ring_cons_attach(&cq, (struct moe_ring_ctrl *)(base + l.cq_ctrl), l.ring_entries,
	                     start);
	struct moe_sqe *sqes = (struct moe_sqe *)(base + l.sq_entries);
	struct moe_sqe ping = {.user_data = 0x10, .slot = 0, .op = MOE_OP_PING};
	sqes[moe_ring_prod_pos(&sq, 0)] = ping;
	moe_ring_publish(&sq, 1);
	moe_ring_wake_consumer(&sq);
	int64_t ready = 0;
	for (int i = 0; i < 50 && (ready = moe_ring_ready(&cq)) == 0; i++) {
		moe_ring_announce_sleep(&cq);
		if (moe_ring_ready(&cq) == 0)
			moe_ring_consumer_wait(&cq, 100000000);
		moe_ring_unannounce(&cq);
	}
	cr_assert_eq(ready, 1, "the PING completed");
	const struct moe_cqe *e = (const struct moe_cqe *)(base + l.cq_entries);
	cr_assert_eq(e[moe_ring_cons_pos(&cq, 0)].user_data, 0x10);
	cr_assert_eq(e[moe_ring_cons_pos(&cq, 0)].status, MOE_OK);
	munmap(base, l.total);
	close(fd);
	cr_assert_eq(sidecar_stop(&sp, SIGTERM), 0);
	sidecar_cleanup(&sp);
}

struct fake_sidecar {
	int listen_fd;
	uint16_t major;
};

static void *fake_sidecar_main(void *arg)
{
	struct fake_sidecar *f = arg;
	int fd = accept(f->listen_fd, NULL, NULL);
	struct moe_hello h;
	recv(fd, &h, sizeof(h), MSG_WAITALL);
	/* A major-2 sidecar: a bigger welcome whose frozen prefix is still readable. */
	uint8_t buf[600];
	memset(buf, 0, sizeof(buf));
	struct moe_welcome *w = (struct moe_welcome *)buf;
	w->magic = MOE_WELCOME_MAGIC;
	w->abi_major = f->major;
	w->abi_minor = 0;
	w->size = sizeof(buf);
	w->status = MOE_EVERSION;
	strcpy(w->reason, "this sidecar needs clients of protocol 2");
	send(fd, buf, sizeof(buf), MSG_NOSIGNAL);
	close(fd);
	return NULL;
}

Test(handshake_proc, client_refuses_a_newer_sidecar_with_a_sentence)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char path[100];
	snprintf(path, sizeof(path), "%s/fake.sock", sp.dir);
	struct fake_sidecar f = {.major = 2};
	f.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	cr_assert_eq(bind(f.listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(f.listen_fd, 1), 0);
	pthread_t t;
	pthread_create(&t, NULL, fake_sidecar_main, &f);
	struct moe_client *c = (struct moe_client *)&f; /* must be reset to NULL */
	struct moe_connect_opts o = {.socket_path = path};
	int rc = moe_connect(&o, &c);
	pthread_join(t, NULL);
	close(f.listen_fd);
	cr_assert_eq(rc, MOE_EVERSION, "got %s: %s", moe_strerror(rc), moe_connect_error());
	cr_assert_null(c);
	const char *why = moe_connect_error();
	char ours[16];
	snprintf(ours, sizeof(ours), "%u.%u", MOE_ABI_MAJOR, MOE_ABI_MINOR);
	cr_assert(strstr(why, "2.0") && strstr(why, ours), "a sentence with both versions: %s",
	          why);
	sidecar_cleanup(&sp);
}

Test(handshake_proc, limits_above_the_bounds_are_refused)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	const char *extra[] = {"--max-channel-mib", "8", NULL};
	cr_assert_eq(sidecar_start(&sp, extra, NULL), 0);
	struct moe_client *c;
	struct moe_connect_opts o = {.socket_path = sp.socket, .n_slots = 300};
	cr_assert_eq(moe_connect(&o, &c), MOE_EREFUSED);
	cr_assert(strstr(moe_connect_error(), "n_slots"), "%s", moe_connect_error());
	o = (struct moe_connect_opts){.socket_path = sp.socket, .max_tokens = 4096, .hidden = 4096};
	cr_assert_eq(moe_connect(&o, &c), MOE_EREFUSED);
	cr_assert(strstr(moe_connect_error(), "--max-channel-mib"), "%s", moe_connect_error());
	o = (struct moe_connect_opts){
	    .socket_path = sp.socket, .max_tokens = 16, .hidden = 64, .top_k = 4, .n_slots = 3};
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "%s", moe_connect_error());
	const struct moe_info *i = moe_info(c);
	cr_assert_eq(i->max_tokens, 16);
	cr_assert_eq(i->hidden, 64);
	cr_assert_eq(i->top_k, 4);
	cr_assert_eq(i->n_slots, 3);
	cr_assert_eq(i->sidecar_pid, (uint32_t)sp.pid);
	moe_close(c);
	sidecar_cleanup(&sp);
}

Test(handshake_proc, one_sidecar_per_path_and_modes)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	struct stat st;
	cr_assert_eq(stat(sp.socket, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0600, "socket mode %o", st.st_mode & 0777);
	char dir[320];
	snprintf(dir, sizeof(dir), "%s/run", sp.dir);
	cr_assert_eq(stat(dir, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0700, "dir mode %o", st.st_mode & 0777);

	struct sidecar_proc second = sp;
	second.pid = 0;
	int status = 0;
	cr_assert_eq(sidecar_start(&second, NULL, &status), -1, "a second sidecar must refuse");
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x", status);
	cr_assert(log_count(&sp, "another moe-sidecar") >= 1, "it says why");
	/* The first one is untouched. */
	struct moe_client *c;
	struct moe_connect_opts o = {.socket_path = sp.socket};
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "%s", moe_connect_error());
	cr_assert_eq(moe_ping(c, 5000), MOE_OK);
	moe_close(c);

	cr_assert_eq(sidecar_stop(&sp, SIGTERM), 0, "clean exit on SIGTERM");
	char lock[320];
	snprintf(lock, sizeof(lock), "%s.lock", sp.socket);
	cr_assert_neq(access(sp.socket, F_OK), 0, "socket removed at shutdown");
	cr_assert_neq(access(lock, F_OK), 0, "lock file removed at shutdown");
	sidecar_cleanup(&sp);
}

Test(handshake_proc, a_stale_socket_is_replaced)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	cr_assert_eq(sidecar_stop(&sp, SIGKILL), SIGKILL, "crashed");
	cr_assert_eq(access(sp.socket, F_OK), 0, "a crash leaves the socket behind");
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	cr_assert(log_count(&sp, "replaced a stale socket") >= 1);
	struct moe_client *c;
	setenv("MOE_SIDECAR_SOCKET", sp.socket, 1); /* the client's environment override */
	cr_assert_eq(moe_connect(NULL, &c), MOE_OK, "%s", moe_connect_error());
	unsetenv("MOE_SIDECAR_SOCKET");
	cr_assert_eq(moe_ping(c, 5000), MOE_OK);
	moe_close(c);
	sidecar_cleanup(&sp);
}

Test(handshake_proc, garbage_instead_of_a_hello)
{
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	cr_assert_eq(sidecar_start(&sp, NULL, NULL), 0);
	int fd = raw_connect(sp.socket);
	char junk[64];
	memset(junk, 'G', sizeof(junk));
	send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
	struct moe_welcome w;
	size_t n = read_all(fd, &w, sizeof(w));
	close(fd);
	cr_assert_geq(n, MOE_WELCOME_FROZEN);
	cr_assert_eq(w.status, MOE_EPROTO);
	cr_assert(strstr(w.reason, "magic"), "%s", w.reason);
	/* A peer that connects and hangs up at once is simply forgotten. */
	close(raw_connect(sp.socket));
	struct moe_client *c;
	struct moe_connect_opts o = {.socket_path = sp.socket};
	cr_assert_eq(moe_connect(&o, &c), MOE_OK, "%s", moe_connect_error());
	moe_close(c);
	cr_assert_eq(sidecar_stop(&sp, SIGTERM), 0);
	sidecar_cleanup(&sp);
}
