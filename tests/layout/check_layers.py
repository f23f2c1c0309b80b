#!/usr/bin/python3
"""check_layers.py — the arrows of docs/architecture.md, checked on the sources.

Every project header a file includes ("name.h") is looked up by name in the source tree; the
folder that holds it must be the file's own folder or one the table below lets it reach.
Prints each forbidden include with its line and exits 1, else prints a summary and exits 0.
Usage: check_layers.py [REPO_ROOT]
"""
import os
import re
import sys

# folder -> folders it may include from (besides itself). Arrows point downward only.
ALLOWED = {
    "proto": [],
    "kernels": [],
    "sidecar/util": ["proto"],  # error.h (enum moe_status), spin_wait.c (moe_cpu_relax)
    "sidecar/model": ["kernels", "sidecar/util", "proto"],
    "sidecar/probes": ["sidecar/util"],
    "sidecar/residency": ["sidecar/model", "kernels", "sidecar/util", "proto"],
    "sidecar/forward": ["sidecar/residency", "sidecar/model", "kernels", "sidecar/util", "proto"],
    "sidecar/transport": ["sidecar/util", "proto"],
    "sidecar/serving": ["sidecar/transport", "sidecar/forward", "sidecar/residency",
                        "sidecar/model", "sidecar/probes", "kernels", "sidecar/util", "proto"],
    "sidecar/cmd": ["sidecar/serving", "sidecar/transport", "sidecar/forward",
                    "sidecar/residency", "sidecar/model", "sidecar/probes", "kernels",
                    "sidecar/util", "proto", "client"],
    "client": ["proto"],
    # The demos replay the generator's synthetic routing (an engine routes for itself) and
    # report latencies with the benchmarks' percentiles (bench/latency.h).
    "client/examples": ["client", "proto", "kernels", "sidecar/residency", "sidecar/model",
                        "sidecar/util", "bench"],
    # The test-model generator writes real files with the readers' and the kernels' own code.
    "tools": ["sidecar/model", "kernels", "sidecar/util"],
    # Benchmarks sit at the bottom with the tests: they may reach everything.
    "bench": ["sidecar/cmd", "sidecar/serving", "sidecar/transport", "sidecar/forward",
              "sidecar/residency", "sidecar/model", "sidecar/probes", "kernels",
              "sidecar/util", "proto", "client", "tools"],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(rel):
    """The ALLOWED key a repository-relative path belongs to, or None."""
    best = None
    for key in ALLOWED:
        if rel == key or rel.startswith(key + "/"):
            if best is None or len(key) > len(best):
                best = key
    return best


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    headers = {}  # name -> set of folders holding a header of that name
    sources = set()  # a folder nested in another key's (client/examples) is walked twice
    for key in ALLOWED:
        for dirpath, _, files in os.walk(os.path.join(root, key)):
            for f in files:
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                if f.endswith(".h"):
                    headers.setdefault(f, set()).add(folder_of(rel))
                if f.endswith((".c", ".h")):
                    sources.add(rel)
    bad = []
    arrows = set()
    for rel in sorted(sources):
        mine = folder_of(rel)
        with open(os.path.join(root, rel), encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                name = os.path.basename(m.group(1))
                owners = headers.get(name)
                if not owners:
                    continue  # generated (skeletons) or system-like
                if mine in owners:
                    continue
                ok = [o for o in owners if o in ALLOWED[mine]]
                if ok:
                    arrows.add((mine, ok[0]))
                else:
                    bad.append(f"{rel}:{n}: includes {m.group(1)} from "
                               f"{'/'.join(sorted(owners))}, which {mine} may not reach")
    for b in bad:
        print(b)
    if bad:
        print(f"layers: {len(bad)} forbidden include(s)")
        return 1
    print(f"layers: {len(sources)} files, {len(arrows)} arrows, all downward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
