#!/usr/bin/python3
"""analyze.py --src TREE --run DIR [--json FILE]: the report of scripts/forward-path.sh.

Reads DIR/run.txt and the dumps of call_hooks.c (fp-PID.bin/.maps/.threads) of the client
and the sidecar, maps each recorded (function, calling function) to a function name and its
source file with addr2line (the outermost frame of the address's inline chain: the function
the code was written in), and prints: the files visited (paths relative to TREE), the
cross-file calls as distinct edges (caller function in file A -> callee in file B, A != B)
and as dynamic counts, per file the calls entering it from another file, and the threads.
kernels/ is reported apart: its per-expert loops would swamp the rest. Entries whose caller
is outside the instrumented code (the driver's call of moe_forward, a thread's start
routine) count as roots, not as hops. The window: from the call of moe_forward (run.txt's t0)
to its return (t1) in the client, and to the moment the sidecar is idle again (the driver's
SIGUSR2) in the sidecar, so that what the FORWARD set off there (its completion, the next
drain, going back to sleep) is counted whether or not the client woke first.
"""
import argparse
import collections
import functools
import json
import os
import statistics
import struct
import subprocess
import sys

REC = struct.Struct("<QQQIIQ")
HDR = struct.Struct("<8sQQQ")


def read_run(path):
    run = {}
    with open(path) as f:
        for line in f:
            k, v = line.split()
            run[k] = int(v)
    return run


def read_maps(path):
    """[(start, end, offset, path)] of file-backed mappings."""
    maps = []
    with open(path) as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            maps.append((lo, hi, int(parts[2], 16), parts[5].strip()))
    return maps


@functools.lru_cache(maxsize=None)
def elf_is_dyn(path):
    with open(path, "rb") as f:
        head = f.read(18)
    return struct.unpack_from("<H", head, 16)[0] == 3  # ET_DYN: PIE or shared object


class Symbolizer:
    def __init__(self, maps):
        self.maps = maps
        self.base = {}
        for lo, _hi, off, p in maps:
            if off == 0 and p not in self.base:
                self.base[p] = lo
        self.cache = {}

    def module(self, addr):
        for lo, hi, _off, p in self.maps:
            if lo <= addr < hi:
                return p, (addr - self.base[p]) if elf_is_dyn(p) else addr
        return None, addr

    def resolve(self, addrs):
        by_mod = collections.defaultdict(set)
        for a in addrs:
            if a in self.cache:
                continue
            mod, rel = self.module(a)
            if mod is None:
                self.cache[a] = ("??", "??")
            else:
                by_mod[mod].add((a, rel))
        for mod, pairs in by_mod.items():
            pairs = sorted(pairs)
            out = subprocess.run(
                ["addr2line", "-f", "-i", "-a", "-e", mod] + ["0x%x" % r for _a, r in pairs],
                check=True, capture_output=True, text=True).stdout.splitlines()
            # Blocks: "0xADDR", then (function, file:line) pairs, innermost first.
            blocks, cur = [], None
            for line in out:
                if line.startswith("0x") and (cur is None or len(cur) % 2 == 0):
                    cur = []
                    blocks.append(cur)
                else:
                    cur.append(line)
            for (a, _r), b in zip(pairs, blocks):
                fn, loc = (b[-2], b[-1]) if len(b) >= 2 else ("??", "??")
                self.cache[a] = (fn, loc.split(":")[0] if loc != "??:0" else "??")
        return self.cache


def rel(src, path):
    if path == "??":
        return "??"
    p = os.path.normpath(path)
    if p.startswith(src + os.sep):
        return p[len(src) + 1:]
    return "<outside>" + p


def analyze_process(src, run_dir, pid, role, t0, t1):
    with open(os.path.join(run_dir, "fp-%d.bin" % pid), "rb") as f:
        data = f.read()
    magic, n, dropped, rec_size = HDR.unpack_from(data, 0)
    if magic != b"FPCALLS1" or rec_size != REC.size:
        sys.exit("analyze: %s: not a call_hooks dump" % role)
    recs = [REC.unpack_from(data, HDR.size + i * REC.size) for i in range(n)]
    # The sidecar records from SIGUSR1 to SIGUSR2, sent once it is idle again: keep what it
    # did from the call of moe_forward on (t1 bounds only the client).
    outside = sum(1 for r in recs if not t0 <= r[5] <= t1)
    recs = [r for r in recs if t0 <= r[5] <= t1]
    names = {}
    tpath = os.path.join(run_dir, "fp-%d.threads" % pid)
    if os.path.exists(tpath):
        with open(tpath) as f:
            for line in f:
                tid, _, name = line.rstrip("\n").partition(" ")
                names[int(tid)] = name
    sym = Symbolizer(read_maps(os.path.join(run_dir, "fp-%d.maps" % pid)))
    table = sym.resolve({r[0] for r in recs} | {r[1] for r in recs if r[1]})
    # calls: (tid, caller (fn, file) or None, callee (fn, file)); units: the same with each
    # header's function counted in the .c file it was called from (its translation unit, as
    # far as the recorded stack shows), so that only calls between .c files are hops.
    calls, units = [], []
    stacks = collections.defaultdict(dict)  # tid -> depth -> (fn address, unit)
    for fn, caller, _site, tid, depth, _ns in recs:
        f_name, f_file = table[fn]
        callee = (f_name, rel(src, f_file))
        st = stacks[tid]
        for d in [d for d in st if d >= depth]:
            del st[d]
        if caller:
            c_name, c_file = table[caller]
            c = (c_name, rel(src, c_file))
            if depth - 1 in st and st[depth - 1][0] == caller:
                c_unit = st[depth - 1][1]
            else:
                c_unit = c[1]
                st[depth - 1] = (caller, c_unit)
            calls.append((tid, c, callee))
        else:
            c, c_unit = None, None
            calls.append((tid, None, callee))
        unit = c_unit if callee[1].endswith(".h") and c_unit else callee[1]
        st[depth] = (fn, unit)
        units.append((tid, (c[0], c_unit) if c else None, (callee[0], unit)))
    return {"role": role, "pid": pid, "records": len(recs), "outside_window": outside,
            "dropped": dropped, "calls": calls,
            "units": units, "thread_names": names}


def in_repo(f):
    return f not in ("??",) and not f.startswith("<outside>")


def is_kernel(f):
    return f.startswith("kernels/")


def summarize(procs, key="calls"):
    files = collections.OrderedDict()  # file -> set(roles)
    edges = collections.Counter()      # (role, caller, callee) -> count, cross-file only
    roots = collections.Counter()
    entered = collections.Counter()    # file -> dynamic entries from another file
    entered_edges = collections.Counter()
    threads = []
    for p in procs:
        per_thread = collections.defaultdict(lambda: [0, set()])
        for tid, caller, callee in p[key]:
            t = per_thread[tid]
            t[0] += 1
            if in_repo(callee[1]):
                files.setdefault(callee[1], set()).add(p["role"])
                t[1].add(callee[1])
            if caller is None:
                roots[(p["role"], callee)] += 1
                continue
            if caller[1] != callee[1] and in_repo(caller[1]) and in_repo(callee[1]):
                edges[(p["role"], caller, callee)] += 1
        for tid, (count, tfiles) in sorted(per_thread.items()):
            threads.append({"process": p["role"], "tid": tid,
                            "name": p["thread_names"].get(tid, "?"), "calls": count,
                            "files": sorted(tfiles)})
    for (_role, _caller, callee), c in edges.items():
        entered[callee[1]] += c
        entered_edges[callee[1]] += 1

    def part(kernel):
        fs = sorted(f for f in files if is_kernel(f) == kernel)
        es = {e: c for e, c in edges.items()
              if (is_kernel(e[1][1]) or is_kernel(e[2][1])) == kernel}
        return {
            "files": [{"file": f, "processes": sorted(files[f]),
                       "entered_from_other_files": entered.get(f, 0),
                       "distinct_edges_in": entered_edges.get(f, 0)} for f in fs],
            "n_files": len(fs),
            "distinct_cross_file_edges": len(es),
            "distinct_file_pairs": len({(e[1][1], e[2][1]) for e in es}),
            "dynamic_cross_file_calls": sum(es.values()),
            "edges": [{"process": r, "caller": "%s (%s)" % a, "callee": "%s (%s)" % b,
                       "count": c} for (r, a, b), c in sorted(es.items(),
                                                              key=lambda x: (x[0][0], x[0][1][1], x[0][2][1], x[0][1][0], x[0][2][0]))],
        }

    main = part(False)
    kern = part(True)
    return {
        "processes": [{"role": p["role"], "pid": p["pid"], "records": p["records"],
                       "outside_window": p["outside_window"], "dropped": p["dropped"]}
                      for p in procs],
        "roots": [{"process": r, "function": "%s (%s)" % f, "count": c}
                  for (r, f), c in sorted(roots.items())],
        "outside_repo_functions": sorted({"%s (%s)" % c for p in procs
                                          for _t, _a, c in p["calls"] if not in_repo(c[1])}),
        "threads": threads,
        "without_kernels": main,
        "kernels": kern,
        "total": {
            "n_files": main["n_files"] + kern["n_files"],
            "distinct_cross_file_edges": len(edges),
            "dynamic_cross_file_calls": sum(edges.values()),
        },
    }


def merge_part(parts):
    """One part (without_kernels or kernels) over several runs: the union of the files and
    edges, each count the median over the runs (0 where a run did not see it)."""
    n = len(parts)

    def med(xs):
        xs = list(xs)
        return statistics.median_low(xs + [0] * (n - len(xs)))
    files, edges = collections.OrderedDict(), collections.OrderedDict()
    for p in parts:
        for f in p["files"]:
            files.setdefault(f["file"], []).append(f)
        for e in p["edges"]:
            edges.setdefault((e["process"], e["caller"], e["callee"]), []).append(e["count"])
    into = collections.Counter(k[2].rsplit(" (", 1)[1][:-1] for k in edges)
    return {
        "files": [{"file": f, "processes": sorted({x for v in vs for x in v["processes"]}),
                   "entered_from_other_files": med(v["entered_from_other_files"] for v in vs),
                   "distinct_edges_in": into.get(f, 0), "runs": len(vs)}
                  for f, vs in sorted(files.items())],
        "n_files": len(files),
        "distinct_cross_file_edges": len(edges),
        "distinct_file_pairs": len({(k[1].rsplit(" (", 1)[1], k[2].rsplit(" (", 1)[1])
                                    for k in edges}),
        "dynamic_cross_file_calls": med(p["dynamic_cross_file_calls"] for p in parts),
        "edges": [{"process": k[0], "caller": k[1], "callee": k[2], "count": med(c),
                   "runs": len(c)} for k, c in edges.items()],
    }


def merge_runs(results):
    """The report over several runs of the driver (see merge_part)."""
    n = len(results)
    out = {"runs": n, "per_run": [], "threads": [], "roots": results[0]["roots"],
           "processes": [], "outside_repo_functions": sorted(
               {x for r in results for x in r["outside_repo_functions"]})}
    for i, r in enumerate(results):
        out["processes"] += [dict(p, run=i + 1) for p in r["processes"]]
        out["threads"] += [dict(t, run=i + 1) for t in r["threads"]]
    for view in (None, "translation_units"):
        dst = out if view is None else out.setdefault(view, {})
        src = [r if view is None else r[view] for r in results]
        for part in ("without_kernels", "kernels"):
            dst[part] = merge_part([x[part] for x in src])
        dst["total"] = {
            "n_files": dst["without_kernels"]["n_files"] + dst["kernels"]["n_files"],
            "distinct_cross_file_edges": dst["without_kernels"]["distinct_cross_file_edges"]
            + dst["kernels"]["distinct_cross_file_edges"],
            "dynamic_cross_file_calls": statistics.median_low(
                x["total"]["dynamic_cross_file_calls"] for x in src),
        }
        for i, x in enumerate(src):
            if view is None:
                out["per_run"].append({"run": i + 1, "all_files": x["total"],
                                       "without_kernels": {k: x["without_kernels"][k] for k in (
                                           "n_files", "distinct_cross_file_edges",
                                           "dynamic_cross_file_calls")}})
            else:
                out["per_run"][i]["c_files_only"] = x["total"]
                out["per_run"][i]["c_files_only_without_kernels"] = {
                    k: x["without_kernels"][k] for k in (
                        "n_files", "distinct_cross_file_edges", "dynamic_cross_file_calls")}
    return out


def mark(x, n):
    return "" if x.get("runs", n) == n else "  (%d/%d runs)" % (x["runs"], n)


def print_report(r, run):
    n = r["runs"]
    print("forward-path: one FORWARD, layer %d, 1 token, top-%d of %d experts, hidden %d; "
          "%d runs: files and edges are the union, counts the median" % (
              run["layer"], run["k"], run["experts"], run["hidden"], n))
    for p in r["processes"]:
        print("  run %d %s pid %d: %d calls in the window (%d more before or after)%s"
              % (p["run"], p["role"], p["pid"], p["records"], p["outside_window"],
                 ", %d DROPPED" % p["dropped"] if p["dropped"] else ""))
    print("\nthreads:")
    for t in r["threads"]:
        print("  run %d %-7s %-7d %-16s %7d calls, %2d files" % (
            t["run"], t["process"], t["tid"], t["name"], t["calls"], len(t["files"])))
    print("\nroots (called from outside the instrumented code):")
    for x in r["roots"]:
        print("  %-7s %s x%d" % (x["process"], x["function"], x["count"]))
    for title, key in (("outside kernels/", "without_kernels"), ("kernels/ (and calls into or out of it)", "kernels")):
        s = r[key]
        print("\n== %s: %d files, %d distinct cross-file edges (%d file pairs), %d dynamic "
              "cross-file calls" % (title, s["n_files"], s["distinct_cross_file_edges"],
                                    s["distinct_file_pairs"], s["dynamic_cross_file_calls"]))
        print("  %-44s %-15s %9s %9s" % ("file", "process", "entered", "edges in"))
        for f in s["files"]:
            print("  %-44s %-15s %9d %9d%s" % (f["file"], ",".join(f["processes"]),
                                               f["entered_from_other_files"],
                                               f["distinct_edges_in"], mark(f, n)))
        print("  edges (caller (file) -> callee (file) x dynamic count):")
        for e in s["edges"]:
            print("    %-7s %s -> %s x%d%s" % (e["process"], e["caller"], e["callee"],
                                              e["count"], mark(e, n)))
    t = r["total"]
    print("\nTOTAL: %d files, %d distinct cross-file edges, %d dynamic cross-file calls"
          % (t["n_files"], t["distinct_cross_file_edges"], t["dynamic_cross_file_calls"]))
    w = r["without_kernels"]
    print("WITHOUT kernels/: %d files, %d distinct cross-file edges (%d file pairs), %d dynamic "
          "cross-file calls" % (w["n_files"], w["distinct_cross_file_edges"],
                                w["distinct_file_pairs"], w["dynamic_cross_file_calls"]))
    for title, key in (("outside kernels/", "without_kernels"), ("kernels/", "kernels")):
        s = r["translation_units"][key]
        print("\n== .c files only (a header's function counts in its caller's .c file), %s: "
              "%d files, %d distinct cross-file edges (%d file pairs), %d dynamic cross-file "
              "calls" % (title, s["n_files"], s["distinct_cross_file_edges"],
                         s["distinct_file_pairs"], s["dynamic_cross_file_calls"]))
        print("  %-44s %9s %9s" % ("file", "entered", "edges in"))
        for f in s["files"]:
            print("  %-44s %9d %9d%s" % (f["file"], f["entered_from_other_files"],
                                         f["distinct_edges_in"], mark(f, n)))
        if key == "without_kernels":
            print("  edges:")
            for e in s["edges"]:
                print("    %-7s %s -> %s x%d%s" % (e["process"], e["caller"], e["callee"],
                                                  e["count"], mark(e, n)))
    t = r["translation_units"]["total"]
    w = r["translation_units"]["without_kernels"]
    print("\n.c FILES ONLY, TOTAL: %d files, %d distinct cross-file edges, %d dynamic cross-file calls"
          % (t["n_files"], t["distinct_cross_file_edges"], t["dynamic_cross_file_calls"]))
    print(".c FILES ONLY, WITHOUT kernels/: %d files, %d distinct cross-file edges (%d file "
          "pairs), %d dynamic cross-file calls" % (w["n_files"], w["distinct_cross_file_edges"],
                                                  w["distinct_file_pairs"],
                                                  w["dynamic_cross_file_calls"]))
    print("\nper run (files / distinct cross-file edges / dynamic cross-file calls):")
    for x in r["per_run"]:
        print("  run %d: all %s, without kernels/ %s; .c only %s, without kernels/ %s" % (
            x["run"], *("%d/%d/%d" % (v["n_files"], v["distinct_cross_file_edges"],
                                      v["dynamic_cross_file_calls"])
                        for v in (x["all_files"], x["without_kernels"], x["c_files_only"],
                                  x["c_files_only_without_kernels"]))))
    if r["outside_repo_functions"]:
        print("functions outside the tree (not counted): " + ", ".join(r["outside_repo_functions"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--run", required=True, action="append",
                    help="a driver's output folder; several: one report over the runs")
    ap.add_argument("--json")
    a = ap.parse_args()
    src = os.path.realpath(a.src)
    results = []
    for d in a.run:
        run = read_run(os.path.join(d, "run.txt"))
        procs = [analyze_process(src, d, run["client"], "client", run["t0"], run["t1"]),
                 analyze_process(src, d, run["sidecar"], "sidecar", run["t0"], 2**64)]
        r = summarize(procs)
        u = summarize(procs, "units")
        r["translation_units"] = {"without_kernels": u["without_kernels"],
                                  "kernels": u["kernels"], "total": u["total"]}
        results.append(r)
    r = merge_runs(results)
    r["run"] = run
    r["tree"] = src
    print_report(r, run)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
