#!/usr/bin/python3
"""check_layers.py — the arrows of docs/architecture.md, checked on the sources.

Every project header a file includes ("name.h") is looked up by name in the source tree; the
folder that holds it must be the file's own folder or one the table below lets it reach.
Inside the folders of ACYCLIC, the files must also call each other one way only: a function or
object that one .c file defines (not static) and another names is an arrow between the two
files, and no arrows may close a circle (a state machine and its loader, a dispatcher and
its algorithms: one side gets a table of callbacks or a header of shared types instead).
Prints each forbidden include and each circle and exits 1, else prints a summary and exits 0.
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

# Folders whose .c files may not call each other in a circle.
ACYCLIC = ["sidecar/residency"]
COMMENT_OR_STRING = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                               re.S)
# A definition at the start of a line that is not static: a function (its parameter list,
# then the opening brace) or an initialised object.
FUNCTION_DEF = re.compile(r'^(?!static\b|extern\b|typedef\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)'
                          r'\([^;{}]*\)\s*\{', re.M)
OBJECT_DEF = re.compile(r'^(?!static\b|extern\b|typedef\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)'
                        r'\s*(?:\[[^\]]*\])?\s*=', re.M)
WORD = re.compile(r'[A-Za-z_]\w*')


def call_arrows(root, folder):
    """{(a, b): names} for the .c files of folder: a names what b defines."""
    texts = {}
    for f in sorted(os.listdir(os.path.join(root, folder))):
        if f.endswith(".c") and not f.endswith(".bpf.c"):
            with open(os.path.join(root, folder, f), encoding="utf-8") as fh:
                texts[f] = COMMENT_OR_STRING.sub(" ", fh.read())
    defs = {f: set(FUNCTION_DEF.findall(t)) | set(OBJECT_DEF.findall(t))
            for f, t in texts.items()}
    arrows = {}
    for a, t in texts.items():
        words = set(WORD.findall(t)) - defs[a]
        for b in texts:
            names = words & defs[b] if b != a else set()
            if names:
                arrows[(a, b)] = sorted(names)
    return arrows


def circles(arrows):
    """The strongly connected sets of two or more files (Tarjan), each sorted."""
    succ = {}
    for a, b in arrows:
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return out


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
    n_calls = 0
    for folder in ACYCLIC:
        calls = call_arrows(root, folder)
        n_calls += len(calls)
        for comp in circles(calls):
            crossing = "; ".join(f"{a} -> {b}: {', '.join(calls[(a, b)])}"
                                 for a in comp for b in comp if (a, b) in calls)
            bad.append(f"{folder}: {', '.join(comp)} call each other in a circle ({crossing})")
    for b in bad:
        print(b)
    if bad:
        print(f"layers: {len(bad)} forbidden include(s) or circle(s)")
        return 1
    print(f"layers: {len(sources)} files, {len(arrows)} arrows, all downward; "
          f"{n_calls} call arrows in {', '.join(ACYCLIC)}, no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
