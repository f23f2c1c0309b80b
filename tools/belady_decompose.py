#!/usr/bin/python3
"""belady_decompose.py TRACE FRACTION FROM_STEP — where an online policy's loads per token
stand between Belady's OPT and what no online policy can know (docs/residency.md, "Bytes
against the optimum").

Replays a routing trace (its reference lines; prefetch lines are ignored) at FRACTION of all
experts, one slot each, counting loads from FROM_STEP on, under the replay rules of
sidecar/residency/sim.h (a line's experts are in use together; a miss with nothing evictable
is served, not admitted), and prints loads per token for:

  opt            Belady's OPT over one pool (what `simulate` prints as OPT, no prefetches)
  opt_shares     OPT held to equal per-layer shares (the +layer partition)
  freq_oracle    equal shares; evicts the expert with the fewest references in the whole
                 trace (future included): perfect popularity, no knowledge of the order
  window_oracle  equal shares; evicts the expert with the fewest references in the next 64
                 steps (popularity known ahead, drift included)
  count_128      equal shares; evicts the expert with the lowest count of past uses decayed
                 with a half-life of 128 steps: the online estimate heat+layer makes

opt_shares - opt is the cost of fixed shares, freq_oracle - opt_shares the cost of not
knowing the order of future references (an online policy can at best know popularity),
count_128 - freq_oracle the cost of learning popularity online (count_128 replays what
`simulate --policies heat+layer` does without prefetches, and prints the same figure). Pure
Python: seconds for a 1024-step Qwen3-shaped trace.
"""
import collections
import heapq
import sys


def load(path):
    header, lines = None, []
    with open(path) as f:
        for s in f:
            if s.startswith("#") or not s.strip() or s.startswith("p "):
                continue
            if s.startswith("moe-trace"):
                header = {k: int(v) for k, v in (x.split("=") for x in s.split()[2:])}
                continue
            step, layer, ids = s.split()
            lines.append((int(step), int(layer), [int(x.split(":")[0]) for x in ids.split(",")]))
    if header is None:
        sys.exit(f"{path}: no 'moe-trace' header")
    return header, lines


def opt(lines, E, L, cap, from_step, shares):
    never = 1 << 62
    refs = [(li, l * E + e) for li, (_, l, ids) in enumerate(lines) for e in ids]
    next_use, seen = [0] * len(refs), {}
    for i in range(len(refs) - 1, -1, -1):
        li, x = refs[i]
        next_use[i] = seen.get(x, never)
        seen[x] = li
    parts = L if shares else 1
    quota = [cap // L + (l < cap % L) for l in range(L)] if shares else [cap]
    resident = [dict() for _ in range(parts)]
    heaps = [[] for _ in range(parts)]
    loads, i = 0, 0
    for step, l, ids in lines:
        p = l if shares else 0
        res, h = resident[p], heaps[p]
        cur = {l * E + e for e in ids}
        for e in ids:
            x, nu = l * E + e, next_use[i]
            i += 1
            if x not in res:
                loads += step >= from_step
                if len(res) >= quota[p]:
                    kept, victim = [], None
                    while h:
                        k, y = heapq.heappop(h)
                        if res.get(y) != -k:
                            continue  # stale entry
                        if y in cur:
                            kept.append((k, y))
                            continue
                        victim = y
                        break
                    for t in kept:
                        heapq.heappush(h, t)
                    if victim is None:
                        continue  # served, not admitted
                    del res[victim]
            res[x] = nu
            heapq.heappush(h, (-nu, x))
    return loads


def frequency(lines, E, L, cap, from_step, mode, window=64, half_life=128.0):
    quota = [cap // L + (l < cap % L) for l in range(L)]
    resident = [set() for _ in range(L)]
    by_step = collections.defaultdict(list)
    for step, l, ids in lines:
        by_step[step].append((l, ids))
    steps = sorted(by_step)
    total = collections.Counter(l * E + e for _, l, ids in lines for e in ids)
    ahead = collections.Counter()
    for s in range(0, window):
        for l, ids in by_step.get(s, []):
            ahead.update(l * E + e for e in ids)
    count, at = collections.defaultdict(float), collections.defaultdict(int)
    loads = 0
    for step in steps:
        for l, ids in by_step[step]:
            cur, res = {l * E + e for e in ids}, resident[l]
            for e in ids:
                x = l * E + e
                if x in res:
                    continue
                loads += step >= from_step
                if len(res) >= quota[l]:
                    cand = [y for y in res if y not in cur]
                    if not cand:
                        continue
                    if mode == "freq_oracle":
                        victim = min(cand, key=lambda y: total[y])
                    elif mode == "window_oracle":
                        victim = min(cand, key=lambda y: ahead[y])
                    else:
                        victim = min(cand, key=lambda y: count[y] * 2 ** ((at[y] - step) / half_life))
                    res.discard(victim)
                res.add(x)
            for x in cur:
                count[x] = count[x] * 2 ** ((at[x] - step) / half_life) + 1
                at[x] = step
        for l, ids in by_step[step]:
            ahead.subtract(l * E + e for e in ids)
        for l, ids in by_step.get(step + window, []):
            ahead.update(l * E + e for e in ids)
    return loads


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: belady_decompose.py TRACE FRACTION FROM_STEP")
    header, lines = load(sys.argv[1])
    frac, from_step = float(sys.argv[2]), int(sys.argv[3])
    if not 0 < frac <= 1:
        sys.exit(f"fraction {sys.argv[2]}: expected (0, 1]")
    L, E = header["n_layers"], header["n_experts"]
    cap = int(L * E * frac)
    tokens = len({s for s, _, _ in lines if s >= from_step})
    if not tokens:
        sys.exit(f"no steps at or after {from_step}")
    out = [("opt", opt(lines, E, L, cap, from_step, False)),
           ("opt_shares", opt(lines, E, L, cap, from_step, True))]
    for mode in ("freq_oracle", "window_oracle", "count_128"):
        out.append((mode, frequency(lines, E, L, cap, from_step, mode)))
    print(" ".join(f"{k}={v / tokens:.2f}" for k, v in out))


if __name__ == "__main__":
    main()
