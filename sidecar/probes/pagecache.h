/* pagecache.h — the page-cache probes: proof, per model file, that expert reads bypass the
 * page cache.
 *
 * Two halves, as in libbpf-tools' x.h: first the structs both sides share (the BPF programs in
 * pagecache.bpf.c write them into maps, the loader and bpftool read them), then — for user
 * space only — the loader API (pagecache.c) that `serve` and `moe-sidecar probe` call.
 *
 * Map values are BTF-typed, so `bpftool map dump pinned /sys/fs/bpf/moe-sidecar/<instance>/
 * counters` prints these field names. Field order and meaning are an operator interface
 * (docs/operations.md): append only.
 *
 * Errors: the calls that take a `struct sidecar_error` (open, check_instance_name,
 * file_key_of, residency_of) return 0, or -1 with the record (util/error.h). The calls on an
 * open handle (watch, unwatch, read_*, list_pids) answer a negative errno as a status and keep
 * the sentence on the handle (pagecache_last_error). Nothing here logs a failure it returns.
 */
#ifndef MOE_PAGECACHE_H
#define MOE_PAGECACHE_H

#ifndef __bpf__
#include <linux/types.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#endif

#define PAGECACHE_MAX_FILES 1024         /* watched files per instance */
#define PAGECACHE_MAX_PID_ENTRIES 16384  /* (file, tgid) pairs, least recently used evicted */
#define PAGECACHE_INFO_MAGIC 0x4d4f4550u /* "MOEP" */
#define PAGECACHE_INFO_VERSION 1u

/* A file as the kernel's tracepoints name it. dev is the kernel encoding of the superblock's
 * device, major << 20 | minor — not stat()'s st_dev (see pagecache_file_key_of()). pad is 0. */
struct pagecache_file_key {
	__u64 ino;
	__u32 dev;
	__u32 pad;
};

/* Per-process attribution (only when opened with per_pid): a file and a thread group id. */
struct pagecache_pid_key {
	struct pagecache_file_key file;
	__u32 tgid;
	__u32 pad;
};

/* Counters of one watched file (or one (file, tgid)). All monotonic from the watch; bytes are
 * bytes, events are tracepoint hits. What fires each one: docs/operations.md. */
struct pagecache_counters {
	__u64
	    pagecache_fill_bytes; /* folios inserted into the file's page cache: PAGE_SIZE<<order */
	__u64 pagecache_fill_events; /* folios inserted */
	__u64 direct_bytes;          /* bytes requested by direct-I/O reads (iomap_dio_rw_begin) */
	__u64 direct_reads;     /* direct-I/O read calls (a NOWAIT attempt's retry counts once) */
	__u64 direct_retries;   /* blocking retries of a NOWAIT direct read, not counted again */
	__u64 buffered_bytes;   /* bytes returned by buffered read-family syscalls + io_uring */
	__u64 buffered_reads;   /* those syscalls and io_uring completions */
	__u64 get_pages_events; /* mm_filemap_get_pages: batches served by the buffered read path */
	__u64 fault_events;     /* mm_filemap_fault: mmap page faults that went to filemap_fault */
	__u64 map_pages_events; /* mm_filemap_map_pages: fault-around batches */
	__u64 uring_direct_bytes; /* io_uring read completions on O_DIRECT opens: bytes returned */
	__u64
	    uring_buffered_bytes; /* io_uring read completions on buffered opens: bytes returned */
	__u64 uring_reads;        /* io_uring read completions (any result) */
	__u64 uring_errors;       /* io_uring read completions with a negative result */
};

/* One instance's identity, in the pinned `info` map (a one-entry array): who owns the pins. */
struct pagecache_instance_info {
	__u32 magic;   /* PAGECACHE_INFO_MAGIC */
	__u32 version; /* PAGECACHE_INFO_VERSION */
	__u32 owner_pid;
	__u32 per_pid;           /* 1 if pid_counters is being filled */
	__u64 owner_start_ticks; /* /proc/<pid>/stat starttime: tells a live owner from pid reuse */
	__u64 page_size;         /* bytes per page, as the programs count them */
};

#ifndef __bpf__
/* ------------------------------------------------------------------------------------------
 * Loader API (user space). Not thread-safe: one thread owns a struct pagecache_probes.
 * Functions return 0 or a negative errno; pagecache_last_error() gives the sentence.
 * ------------------------------------------------------------------------------------------ */

struct pagecache_probes;

struct pagecache_options {
	const char *instance; /* pins go to /sys/fs/bpf/moe-sidecar/<instance>/; NULL: "default".
	                       * [A-Za-z0-9_.-]{1,64}, not "." or "..". */
	bool per_pid;         /* also fill pid_counters, keyed by (file, tgid) */
	bool quiet;           /* no warning line when unavailable (the caller reports it) */
	/* Other instances' stale pins (owner dead, directory unchanged for this many seconds)
	 * are removed at open: a crashed sidecar's pinned links keep its programs attached, and
	 * counting, until then. 0 = PAGECACHE_STALE_GRACE_S; < 0 = never sweep. The grace
	 * period leaves alone an instance whose owner was just killed and is being restarted
	 * under the same name (that open replaces the pins itself). */
	int stale_grace_s;
};
#define PAGECACHE_STALE_GRACE_S 60
/* How long open waits for an instance's exiting owner (a sidecar killed a moment ago that is
 * still freeing its memory) to release the instance, before calling it in use. */
#define PAGECACHE_EXITING_OWNER_WAIT_MS 30000

/* Totals or one file's counters, with what is derived from them. */
struct pagecache_stats {
	struct pagecache_counters raw;
	__u64 fault_bytes;   /* fault_events × page size: mmap pages faulted in one by one */
	double bypass_ratio; /* direct / (direct + buffered + fault bytes); NaN before any read */
};

/* Opens an instance: mounts bpffs/tracefs if absent, replaces the stale pins of a dead
 * instance of the same name, loads and attaches the programs, pins maps and links.
 * On 0, *out is a handle even when the probes are unavailable (no privilege, no BTF, a live
 * instance of that name, any load failure): then one warning line is logged (unless quiet),
 * pagecache_available() is false and pagecache_status() says "unavailable: <reason>"; every
 * other call still works (watches are recorded, counters read as zero).
 * Errors: -1 with err (MOE_EINVAL: bad options; MOE_ENOMEM). err may be NULL. */
int pagecache_open(const struct pagecache_options *opt, struct pagecache_probes **out,
                   struct sidecar_error *err);

/* 0 if pagecache_open would accept name as an instance name, else -1 with the sentence it
 * would give in err (MOE_EINVAL; err may be NULL). Needs no privilege: callers check it before
 * any work. */
int pagecache_check_instance_name(const char *name, struct sidecar_error *err);

/* What pagecache_open needs, checked without loading a probe, mounting or pinning anything:
 * probes built in, the privilege to load BPF programs (the same check open makes first), the
 * kernel's BTF, bpffs and tracefs mounted (open mounts a missing one where it may: with
 * CAP_SYS_ADMIN, on an existing directory). bpffs: where bpffs is looked for (NULL: where
 * open pins, /sys/fs/bpf; tests pass another directory). Reads files, loads and closes one
 * two-instruction program. */
struct pagecache_readiness {
	bool ready;               /* open would attach, as far as these checks see */
	bool built;               /* built with libbpf, clang, bpftool and BTF */
	bool can_load;            /* a tracepoint program loads: root, or CAP_BPF + CAP_PERFMON */
	bool btf, bpffs, tracefs; /* present / mounted */
	bool cap_sys_admin, cap_bpf, cap_perfmon; /* in the effective set */
	char btf_path[256], bpffs_path[256], tracefs_path[256];
	char why[512]; /* "" when ready; else the first thing missing, with its fix */
};
void pagecache_readiness(const char *bpffs, struct pagecache_readiness *out);

/* Detaches, unpins (removes the instance directory) and frees. NULL is a no-op. */
void pagecache_close(struct pagecache_probes *p);

bool pagecache_available(const struct pagecache_probes *p);
/* "active: /sys/fs/bpf/moe-sidecar/<instance>" or "unavailable: <reason>". Owned by p. */
const char *pagecache_status(const struct pagecache_probes *p);
/* The pin directory ("" when unavailable). Owned by p. */
const char *pagecache_pin_dir(const struct pagecache_probes *p);
/* The pid whose stale pins open replaced, or 0 if none were found. */
int pagecache_replaced_stale_pid(const struct pagecache_probes *p);
/* When the probes are unavailable because another live process owns the instance: its pid,
 * or -1 if unknown; else 0. (The caller can then suggest another instance name.) */
int pagecache_busy_owner(const struct pagecache_probes *p);
/* The sentence behind the last error returned on p ("" if none). */
const char *pagecache_last_error(const struct pagecache_probes *p);

/* Starts counting reads of the regular file at path, from zero. Watching a file already
 * watched (same path, or another path to the same inode) keeps its counters and returns 0.
 * -ENOSPC beyond PAGECACHE_MAX_FILES. The (dev, ino) is fixed now: a file later renamed over
 * path is not followed. */
int pagecache_watch(struct pagecache_probes *p, const char *path);
/* Stops counting path (as given to pagecache_watch) and forgets its counters. -ENOENT if it
 * is not watched. */
int pagecache_unwatch(struct pagecache_probes *p, const char *path);

/* Counters of one watched path (-ENOENT if not watched), or summed over all watched files. */
int pagecache_read_file(struct pagecache_probes *p, const char *path, struct pagecache_stats *out);
int pagecache_read_totals(struct pagecache_probes *p, struct pagecache_stats *out);
/* Counters of (path, tgid) when opened with per_pid; -ENOENT if none recorded. */
int pagecache_read_pid(struct pagecache_probes *p, const char *path, __u32 tgid,
                       struct pagecache_stats *out);

/* The thread group ids with per-pid counters for path: up to max of them in tgids, the number
 * stored in *n (0 when per-pid is off or the probes are unavailable). */
int pagecache_list_pids(struct pagecache_probes *p, const char *path, __u32 *tgids, size_t max,
                        size_t *n);

/* The key the programs use for the file at path: (ino, major << 20 | minor of st_dev).
 * Errors: -1 with err: stat's failure (its status from the errno), or MOE_EINVAL if not a
 * regular file. */
int pagecache_file_key_of(const char *path, struct pagecache_file_key *key,
                          struct sidecar_error *err);

/* Page-cache residency of one file from cachestat(2) (syscall 451, Linux 6.5+; needs no
 * privilege). 0, or -1 with err; on older kernels the status is MOE_ESYS and the message ends
 * in PAGECACHE_NO_CACHESTAT. */
#define PAGECACHE_NO_CACHESTAT " (needs Linux 6.5+)"
struct pagecache_residency {
	__u64 cached_bytes;
	__u64 dirty_bytes;
	__u64 writeback_bytes;
	__u64 evicted_bytes;
	__u64 recently_evicted_bytes;
};
int pagecache_residency_of(const char *path, struct pagecache_residency *out,
                           struct sidecar_error *err);

/* Fills the derived fields of s from s->raw. */
void pagecache_stats_derive(struct pagecache_stats *s, __u64 page_size);

#endif /* !__bpf__ */
#endif /* MOE_PAGECACHE_H */
