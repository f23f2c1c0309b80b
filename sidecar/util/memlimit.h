/* memlimit.h — how much memory this process may use: the cgroup's limit and the host's memory.
 *
 * The sidecar sizes its expert pools and admits channels against one figure, the lower of
 *  - the memory cgroup's limit: v2 `memory.max`, v1 `memory.limit_in_bytes`, of the process's
 *    own cgroup and every ancestor up to the hierarchy's mount (the tightest wins; "max" and
 *    v1's near-2^63 values mean none), found through /proc/self/cgroup and
 *    /proc/self/mountinfo;
 *  - the host's: /proc/meminfo's MemTotal less what others hold that cannot be reclaimed —
 *    other processes' anonymous and shared memory (AnonPages + Shmem less this process's
 *    RssAnon + RssShmem), the kernel's unreclaimable slab, stacks and page tables — and a
 *    headroom of 2% of MemTotal (at least 256 MiB) for the kernel to work in.
 * Neither counts the page cache as used: MemAvailable and a cgroup's memory.current move with
 * whatever files were read last, so a budget taken from them shrinks after a big copy and
 * grows after a drop_caches. A limit the cgroup sets is a ceiling on everything charged to it
 * (under it the kernel reclaims, then OOM-kills), so exceeding it is never an option: an
 * operator's --mem-limit replaces the host's figure but is lowered to the cgroup's.
 *
 * Threading: none; reads files. Errors: a file that cannot be read is "no limit from it".
 */
#ifndef MOE_MEMLIMIT_H
#define MOE_MEMLIMIT_H

#include <stdbool.h>
#include <stdint.h>

struct mem_limit {
	uint64_t bytes;           /* the lower of the two known ones; 0 when neither is */
	uint64_t cgroup_bytes;    /* 0: no cgroup memory limit */
	uint64_t host_bytes;      /* the host's figure above; 0: unknown (no MemTotal) */
	uint64_t total_bytes;     /* MemTotal; 0: unknown */
	uint64_t others_bytes;    /* other processes' anonymous + shared memory */
	uint64_t kernel_bytes;    /* unreclaimable slab + kernel stacks + page tables */
	uint64_t headroom_bytes;  /* 2% of MemTotal, at least 256 MiB */
	uint64_t available_bytes; /* MemAvailable, for the log only; 0: unknown */
	char cgroup_file[256];    /* the file the cgroup limit came from */
	const char *cgroup_from;  /* "cgroup v1 memory.limit_in_bytes" or v2's; NULL: none */
	const char *from;         /* what `bytes` is: "cgroup v1 memory.limit_in_bytes", … */
};

/* Reads both under `root` ("" for the real system; tests pass a directory holding proc/self/
 * cgroup, proc/self/mountinfo, proc/self/status, proc/meminfo and the cgroup files at their
 * mount points). */
void mem_limit_read(const char *root, struct mem_limit *out);

/* The limit the operator names (--mem-limit) is a cap under the cgroup's, never above it:
 * past the cgroup's limit the kernel OOM-kills whatever was asked. Sets ml->bytes and
 * ml->from to the lower of `asked` and the cgroup's limit; returns true when `asked` was
 * above the cgroup's and lowered to it (the caller says so, naming both). The host's figure
 * is an estimate the operator may overrule: it caps nothing here. */
bool mem_limit_cap(struct mem_limit *ml, uint64_t asked);

/* This process's resident set (VmRSS), in bytes; 0 if unknown. */
uint64_t mem_rss_self(void);

#endif
