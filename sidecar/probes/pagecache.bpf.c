/* pagecache.bpf.c — kernel side of the page-cache probes: per-file counters that show whether
 * reads of the model files went around the page cache (O_DIRECT) or through it (read(2),
 * mmap).
 *
 * Every program first builds the (dev, ino) key of the file an event concerns and looks it up
 * in `counters`: a file is watched exactly when it has an entry there, so unwatched files cost
 * one hash lookup. Only task-context tracepoints are used: events that fire in IRQ context
 * (iomap_dio_complete, block_rq_complete) can be dropped when they nest in another BPF program,
 * which would make the counts silently low.
 *
 * Tracepoints: filemap (classic, CO-RE relocated trace_event_raw_* fields), iomap_dio_rw_begin
 * (tp_btf, for the kiocb behind a direct read), io_uring_complete (classic; the request's file
 * via CO-RE), and the read-family syscalls (bytes returned by buffered reads).
 * Counters are updated with atomic adds: programs run concurrently on every CPU.
 */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "pagecache.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by the loader before load. */
const volatile bool per_pid_enabled = false;
const volatile __u64 page_size = 4096;

/* Kernel-internal flag values (include/linux/fs.h, uapi fcntl.h); not in BTF. */
#define IOCB_NOWAIT 0x8
#define IOCB_WRITE (1 << 18)
#if defined(__TARGET_ARCH_arm64)
#define PC_O_DIRECT 0200000
#else
#define PC_O_DIRECT 040000
#endif
/* io_uring read opcodes (UAPI, stable): READV, READ_FIXED, READ, READV_FIXED. */
#define PC_OP_READV 1
#define PC_OP_READ_FIXED 4
#define PC_OP_READ 22
#define PC_OP_READV_FIXED 60

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PAGECACHE_MAX_FILES);
	__type(key, struct pagecache_file_key);
	__type(value, struct pagecache_counters);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PAGECACHE_MAX_PID_ENTRIES);
	__type(key, struct pagecache_pid_key);
	__type(value, struct pagecache_counters);
} pid_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pagecache_instance_info);
} info SEC(".maps");

/* A direct read issued with IOCB_NOWAIT (io_uring's first, non-blocking attempt): its byte
 * range [pos, end). If the attempt fails with EAGAIN, io_uring retries the rest from an io-wq
 * worker through the same kiocb; that retry must not be counted again. Keyed by kiocb address;
 * removed by the retry or by the io_uring completion, whichever comes first. */
struct dio_attempt {
	__u64 pos;
	__u64 end;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384); /* NOWAIT direct reads in flight on watched files */
	__type(key, __u64);
	__type(value, struct dio_attempt);
} dio_nowait_attempts SEC(".maps");

/* A buffered read syscall in flight on a watched file, by thread id: counted at its exit. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct pagecache_file_key);
} reads_in_flight SEC(".maps");

static __always_inline struct pagecache_counters *watched(const struct pagecache_file_key *key)
{
	return bpf_map_lookup_elem(&counters, key);
}

/* The (file, current tgid) counters, created on first use; NULL when per-pid is off. */
static __always_inline struct pagecache_counters *
pid_counters_of(const struct pagecache_file_key *key)
{
	if (!per_pid_enabled)
		return NULL;
	struct pagecache_pid_key pk = {};
	pk.file = *key;
	pk.tgid = bpf_get_current_pid_tgid() >> 32;
	struct pagecache_counters *c = bpf_map_lookup_elem(&pid_counters, &pk);
	if (c)
		return c;
	struct pagecache_counters zero = {};
	bpf_map_update_elem(&pid_counters, &pk, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&pid_counters, &pk);
}

#define ACCOUNT(c, p, field, value)                                                                \
	do {                                                                                       \
		__sync_fetch_and_add(&(c)->field, (value));                                        \
		if (p)                                                                             \
			__sync_fetch_and_add(&(p)->field, (value));                                \
	} while (0)

static __always_inline void key_of_inode(struct pagecache_file_key *key, struct inode *inode)
{
	key->ino = BPF_CORE_READ(inode, i_ino);
	key->dev = BPF_CORE_READ(inode, i_sb, s_dev);
	key->pad = 0;
}

SEC("tracepoint/filemap/mm_filemap_add_to_page_cache")
int page_cache_fill(struct trace_event_raw_mm_filemap_op_page_cache *ctx)
{
	struct pagecache_file_key key = {.ino = ctx->i_ino, .dev = ctx->s_dev};
	struct pagecache_counters *c = watched(&key);
	if (!c)
		return 0;
	struct pagecache_counters *p = pid_counters_of(&key);
	__u32 order = 0;
	if (bpf_core_field_exists(ctx->order)) /* kernels before 5.x folios: one page per event */
		order = ctx->order & 31;
	ACCOUNT(c, p, pagecache_fill_bytes, page_size << order);
	ACCOUNT(c, p, pagecache_fill_events, 1);
	return 0;
}

SEC("tracepoint/filemap/mm_filemap_get_pages")
int buffered_get_pages(struct trace_event_raw_mm_filemap_op_page_cache_range *ctx)
{
	struct pagecache_file_key key = {.ino = ctx->i_ino, .dev = ctx->s_dev};
	struct pagecache_counters *c = watched(&key);
	if (!c)
		return 0;
	struct pagecache_counters *p = pid_counters_of(&key);
	ACCOUNT(c, p, get_pages_events, 1);
	return 0;
}

SEC("tracepoint/filemap/mm_filemap_fault")
int mmap_fault(struct trace_event_raw_mm_filemap_fault *ctx)
{
	struct pagecache_file_key key = {.ino = ctx->i_ino, .dev = ctx->s_dev};
	struct pagecache_counters *c = watched(&key);
	if (!c)
		return 0;
	struct pagecache_counters *p = pid_counters_of(&key);
	ACCOUNT(c, p, fault_events, 1);
	return 0;
}

SEC("tracepoint/filemap/mm_filemap_map_pages")
int mmap_map_pages(struct trace_event_raw_mm_filemap_op_page_cache_range *ctx)
{
	struct pagecache_file_key key = {.ino = ctx->i_ino, .dev = ctx->s_dev};
	struct pagecache_counters *c = watched(&key);
	if (!c)
		return 0;
	struct pagecache_counters *p = pid_counters_of(&key);
	ACCOUNT(c, p, map_pages_events, 1);
	return 0;
}

/* Direct reads, in the issuing task: count is what the reader asked for (its aligned length,
 * padding included), whatever EOF later trims. */
SEC("tp_btf/iomap_dio_rw_begin")
int BPF_PROG(direct_read_begin, struct kiocb *iocb, struct iov_iter *iter, unsigned int dio_flags,
             size_t done_before)
{
	int flags = BPF_CORE_READ(iocb, ki_flags);
	if (flags & IOCB_WRITE)
		return 0;
	struct pagecache_file_key key;
	key_of_inode(&key, BPF_CORE_READ(iocb, ki_filp, f_inode));
	struct pagecache_counters *c = watched(&key);
	if (!c)
		return 0;
	struct pagecache_counters *p = pid_counters_of(&key);
	if (done_before) {
		/* The filesystem re-entered iomap for the rest of a read already counted whole
		 * (btrfs, gfs2 after a page fault). */
		ACCOUNT(c, p, direct_retries, 1);
		return 0;
	}
	__u64 pos = BPF_CORE_READ(iocb, ki_pos);
	__u64 count = BPF_CORE_READ(iter, count);
	__u64 id = (__u64)iocb;
	/* Another attempt at the tail of a range already counted: io_uring's io-wq retry after
	 * a NOWAIT attempt's EAGAIN, or a reissue after the block layer's EAGAIN. */
	struct dio_attempt *first = bpf_map_lookup_elem(&dio_nowait_attempts, &id);
	bool retry = first && first->pos <= pos && pos < first->end && pos + count == first->end;
	if (flags & IOCB_NOWAIT) {
		if (!retry) {
			struct dio_attempt attempt = {.pos = pos, .end = pos + count};
			bpf_map_update_elem(&dio_nowait_attempts, &id, &attempt, BPF_ANY);
		}
	} else if (first) {
		bpf_map_delete_elem(&dio_nowait_attempts, &id); /* blocking: the last attempt */
	}
	if (retry) {
		ACCOUNT(c, p, direct_retries, 1);
		return 0;
	}
	ACCOUNT(c, p, direct_bytes, count);
	ACCOUNT(c, p, direct_reads, 1);
	return 0;
}

/* io_uring read completions (posted from task work, in the submitter's context). */
SEC("tracepoint/io_uring/io_uring_complete")
int uring_read_complete(struct trace_event_raw_io_uring_complete *ctx)
{
	struct io_kiocb *req = (struct io_kiocb *)ctx->req;
	__u8 opcode = BPF_CORE_READ(req, opcode);
	if (opcode != PC_OP_READV && opcode != PC_OP_READ_FIXED && opcode != PC_OP_READ &&
	    opcode != PC_OP_READV_FIXED)
		return 0;
	struct file *file = BPF_CORE_READ(req, file);
	if (!file)
		return 0;
	struct pagecache_file_key key;
	key_of_inode(&key, BPF_CORE_READ(file, f_inode));
	struct pagecache_counters *c = watched(&key);
	if (!c)
		return 0;
	/* A request's kiocb is its command area (struct io_rw at req->cmd): once it completes,
	 * no retry can follow, so a NOWAIT attempt recorded for it is over. */
	__u64 kiocb_id = (__u64)req + bpf_core_field_offset(req->cmd);
	bpf_map_delete_elem(&dio_nowait_attempts, &kiocb_id);
	struct pagecache_counters *p = pid_counters_of(&key);
	int res = ctx->res;
	ACCOUNT(c, p, uring_reads, 1);
	if (res < 0) {
		ACCOUNT(c, p, uring_errors, 1);
		return 0;
	}
	if (BPF_CORE_READ(file, f_flags) & PC_O_DIRECT) {
		ACCOUNT(c, p, uring_direct_bytes, (__u64)res);
	} else {
		ACCOUNT(c, p, uring_buffered_bytes, (__u64)res);
		ACCOUNT(c, p, buffered_bytes, (__u64)res);
		ACCOUNT(c, p, buffered_reads, 1);
	}
	return 0;
}

/* The struct file behind fd in the current task, or NULL. */
static __always_inline struct file *file_of_fd(long fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt)
		return NULL;
	unsigned int max_fds = BPF_CORE_READ(fdt, max_fds);
	if (fd < 0 || fd >= max_fds)
		return NULL;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *file = NULL;
	bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]);
	return file;
}

/* Entry of a read-family syscall: remember the watched, buffered file it reads. */
static __always_inline int buffered_read_enter(struct trace_event_raw_sys_enter *ctx)
{
	struct file *file = file_of_fd((long)(int)ctx->args[0]);
	if (!file || (BPF_CORE_READ(file, f_flags) & PC_O_DIRECT))
		return 0;
	struct pagecache_file_key key;
	key_of_inode(&key, BPF_CORE_READ(file, f_inode));
	if (!watched(&key))
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	bpf_map_update_elem(&reads_in_flight, &tid, &key, BPF_ANY);
	return 0;
}

static __always_inline int buffered_read_exit(struct trace_event_raw_sys_exit *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct pagecache_file_key *in_flight = bpf_map_lookup_elem(&reads_in_flight, &tid);
	if (!in_flight)
		return 0;
	struct pagecache_file_key key = *in_flight;
	bpf_map_delete_elem(&reads_in_flight, &tid);
	long ret = ctx->ret;
	struct pagecache_counters *c = watched(&key);
	if (!c || ret < 0)
		return 0;
	struct pagecache_counters *p = pid_counters_of(&key);
	ACCOUNT(c, p, buffered_bytes, (__u64)ret);
	ACCOUNT(c, p, buffered_reads, 1);
	return 0;
}

#define BUFFERED_READ_SYSCALL(name)                                                                \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                                \
	int name##_enter(struct trace_event_raw_sys_enter *ctx)                                    \
	{                                                                                          \
		return buffered_read_enter(ctx);                                                   \
	}                                                                                          \
	SEC("tracepoint/syscalls/sys_exit_" #name)                                                 \
	int name##_exit(struct trace_event_raw_sys_exit *ctx)                                      \
	{                                                                                          \
		return buffered_read_exit(ctx);                                                    \
	}

BUFFERED_READ_SYSCALL(read)
BUFFERED_READ_SYSCALL(pread64)
BUFFERED_READ_SYSCALL(readv)
BUFFERED_READ_SYSCALL(preadv)
BUFFERED_READ_SYSCALL(preadv2)
