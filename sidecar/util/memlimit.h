/* memlimit.h — how much memory this process may use: the cgroup's limit and MemAvailable.
 *
 * The sidecar sizes its expert pools and admits channels against one figure, the lower of
 *  - the memory cgroup's limit: v2 `memory.max`, v1 `memory.limit_in_bytes`, of the process's
 *    own cgroup and every ancestor up to the hierarchy's mount (the tightest wins; "max" and
 *    v1's near-2^63 values mean none), found through /proc/self/cgroup and
 *    /proc/self/mountinfo;
 *  - /proc/meminfo's MemAvailable (what the host can give without swapping).
 * A limit the cgroup sets is a ceiling on everything charged to it, so under it the kernel
 * reclaims, then OOM-kills: exceeding it is never an option, unlike MemAvailable.
 *
 * Threading: none; reads files. Errors: a file that cannot be read is "no limit from it".
 */
#ifndef MOE_MEMLIMIT_H
#define MOE_MEMLIMIT_H

#include <stdint.h>

struct mem_limit {
	uint64_t bytes;           /* the lower of the two known ones; 0 when neither is */
	uint64_t cgroup_bytes;    /* 0: no cgroup memory limit */
	uint64_t available_bytes; /* MemAvailable; 0: unknown */
	char cgroup_file[256];    /* the file the cgroup limit came from */
	const char *from;         /* what `bytes` is: "cgroup v1 memory.limit_in_bytes", … */
};

/* Reads both under `root` ("" for the real system; tests pass a directory holding proc/self/
 * cgroup, proc/self/mountinfo, proc/meminfo and the cgroup files at their mount points). */
void mem_limit_read(const char *root, struct mem_limit *out);

/* This process's resident set (VmRSS), in bytes; 0 if unknown. */
uint64_t mem_rss_self(void);

#endif
