/* memlimit.c — see memlimit.h. */
#include "memlimit.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define UNLIMITED_FROM (UINT64_C(1) << 60) /* v1 reports "no limit" as ~2^63 rounded to pages */

enum cgroup_version { CG_V1 = 1, CG_V2 = 2 };

/* A limit file's value: 0 and true, or false when absent, unparsable or "no limit". */
static bool read_limit(const char *path, uint64_t *out)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	char buf[64] = "";
	bool ok = fgets(buf, sizeof(buf), f) != NULL;
	fclose(f);
	uint64_t v;
	if (!ok || sscanf(buf, "%" SCNu64, &v) != 1 || v >= UNLIMITED_FROM)
		return false; /* "max\n" (v2) does not parse */
	*out = v;
	return true;
}

/* Undoes mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
	char *w = s;
	for (char *r = s; *r; r++) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
		    r[3] >= '0' && r[3] <= '7') {
			*w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
			r += 3;
		} else {
			*w++ = *r;
		}
	}
	*w = '\0';
}

/* ROOT/proc/self/NAME for reading (ROOT: "" for this machine, a fake tree in the tests). */
static FILE *open_proc_self(const char *root, const char *name)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/proc/self/%s", root, name);
	return fopen(path, "r");
}

/* The mount of the hierarchy: cgroup2, or the v1 hierarchy holding the memory controller.
 * Fills its mount point and root (the cgroup path the mount shows at its top). */
static bool find_mount(const char *root, enum cgroup_version v, char *mnt, size_t mnt_len,
                       char *mnt_root, size_t root_len)
{
	FILE *f = open_proc_self(root, "mountinfo");
	if (!f)
		return false;
	char line[1024];
	bool found = false;
	while (!found && fgets(line, sizeof(line), f)) {
		char r[256], m[256], fstype[64], opts[256];
		const char *dash = strstr(line, " - ");
		if (!dash || sscanf(line, "%*s %*s %*s %255s %255s", r, m) != 2 ||
		    sscanf(dash + 3, "%63s %*s %255s", fstype, opts) != 2)
			continue;
		if (v == CG_V2 ? strcmp(fstype, "cgroup2") != 0
		               : strcmp(fstype, "cgroup") != 0 || !strstr(opts, "memory"))
			continue;
		if (v == CG_V1) { /* "memory" as a whole option, not inside another word */
			bool whole = false;
			for (char *o = strtok(opts, ","); o && !whole; o = strtok(NULL, ","))
				whole = !strcmp(o, "memory");
			if (!whole)
				continue;
		}
		unescape(r);
		unescape(m);
		snprintf(mnt, mnt_len, "%s%s", root, m);
		snprintf(mnt_root, root_len, "%s", r);
		found = true;
	}
	fclose(f);
	return found;
}

/* This process's cgroup path in hierarchy v (v1: the one listing "memory"). */
static bool own_cgroup(const char *root, enum cgroup_version v, char *out, size_t len)
{
	FILE *f = open_proc_self(root, "cgroup");
	if (!f)
		return false;
	char line[1024];
	bool found = false;
	while (!found && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c1 = *c2 = '\0';
		const char *controllers = c1 + 1, *cg = c2 + 1;
		if (v == CG_V2) {
			found = !strcmp(line, "0") && !controllers[0];
		} else {
			char list[256];
			snprintf(list, sizeof(list), "%s", controllers);
			for (char *o = strtok(list, ","); o && !found; o = strtok(NULL, ","))
				found = !strcmp(o, "memory");
		}
		if (found)
			snprintf(out, len, "%s", cg);
	}
	fclose(f);
	return found;
}

/* The tightest limit from the process's cgroup up to the mount's top, in hierarchy v. */
static bool cgroup_limit(const char *root, enum cgroup_version v, struct mem_limit *out)
{
	char mnt[512], mnt_root[256], cg[512];
	if (!find_mount(root, v, mnt, sizeof(mnt), mnt_root, sizeof(mnt_root)) ||
	    !own_cgroup(root, v, cg, sizeof(cg)))
		return false;
	/* The cgroup as seen from the mount: strip the mount's own root ("/" usually). */
	const size_t rl = strcmp(mnt_root, "/") ? strlen(mnt_root) : 0;
	const char *rel = "";
	if (!strncmp(cg, mnt_root, rl) && (cg[rl] == '/' || cg[rl] == '\0'))
		rel = cg + rl;
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s%s", mnt, strcmp(rel, "/") ? rel : "");
	const char *file = v == CG_V2 ? "memory.max" : "memory.limit_in_bytes";
	bool any = false;
	for (;;) {
		char path[1100];
		snprintf(path, sizeof(path), "%s/%s", dir, file);
		uint64_t lim;
		if (read_limit(path, &lim) && (!any || lim < out->cgroup_bytes)) {
			out->cgroup_bytes = lim;
			snprintf(out->cgroup_file, sizeof(out->cgroup_file), "%s",
			         path + strlen(root));
			any = true;
		}
		char *slash = strrchr(dir, '/');
		if (strlen(dir) <= strlen(mnt) || !slash)
			break;
		*slash = '\0';
	}
	return any;
}

/* A "Key: N kB" line of a /proc file, in bytes; 0 if absent or unreadable. */
static uint64_t proc_kib_field(const char *path, const char *key)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	char line[256];
	const size_t n = strlen(key);
	uint64_t kib = 0;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, key, n) == 0 && sscanf(line + n, " %" SCNu64 " kB", &kib) == 1)
			break;
	fclose(f);
	return kib * 1024u;
}

static void host_limit(const char *root, struct mem_limit *out)
{
	char mi[512], st[512];
	snprintf(mi, sizeof(mi), "%s/proc/meminfo", root);
	snprintf(st, sizeof(st), "%s/proc/self/status", root);
	out->available_bytes = proc_kib_field(mi, "MemAvailable:");
	out->total_bytes = proc_kib_field(mi, "MemTotal:");
	if (!out->total_bytes)
		return;
	const uint64_t anon = proc_kib_field(mi, "AnonPages:") + proc_kib_field(mi, "Shmem:");
	const uint64_t own = proc_kib_field(st, "RssAnon:") + proc_kib_field(st, "RssShmem:");
	out->others_bytes = anon > own ? anon - own : 0;
	out->kernel_bytes = proc_kib_field(mi, "SUnreclaim:") + proc_kib_field(mi, "KernelStack:") +
	                    proc_kib_field(mi, "PageTables:");
	out->headroom_bytes = out->total_bytes / 50;
	if (out->headroom_bytes < (UINT64_C(256) << 20))
		out->headroom_bytes = UINT64_C(256) << 20;
	const uint64_t held = out->others_bytes + out->kernel_bytes + out->headroom_bytes;
	/* a host that holds more than it has still leaves this process something to report */
	out->host_bytes = out->total_bytes > held ? out->total_bytes - held : 1;
}

void mem_limit_read(const char *root, struct mem_limit *out)
{
	memset(out, 0, sizeof(*out));
	const bool v2 = cgroup_limit(root, CG_V2, out);
	const bool v1 = !v2 && cgroup_limit(root, CG_V1, out);
	host_limit(root, out);
	out->from = "none found";
	if (out->host_bytes) {
		out->bytes = out->host_bytes;
		out->from = "MemTotal less others' unreclaimable memory";
	}
	if (v1 || v2)
		out->cgroup_from = v2 ? "cgroup v2 memory.max" : "cgroup v1 memory.limit_in_bytes";
	if ((v1 || v2) && (!out->bytes || out->cgroup_bytes <= out->bytes)) {
		out->bytes = out->cgroup_bytes;
		out->from = out->cgroup_from;
	}
}

bool mem_limit_cap(struct mem_limit *ml, uint64_t asked)
{
	if (ml->cgroup_bytes && asked > ml->cgroup_bytes) {
		ml->bytes = ml->cgroup_bytes;
		ml->from = ml->cgroup_from;
		return true;
	}
	ml->bytes = asked;
	ml->from = "--mem-limit";
	return false;
}

uint64_t mem_rss_self(void)
{
	return proc_kib_field("/proc/self/status", "VmRSS:");
}
