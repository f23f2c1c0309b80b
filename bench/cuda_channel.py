#!/usr/bin/env python3
"""bench/cuda_channel.py — the CUDA side of the channel, measured on a GPU machine:

1. copy bandwidth between the GPU and a slot of the channel mapping registered with
   cudaHostRegister (D2H into the input area, H2D out of the output area), against the same
   copies to and from pageable memory (the baseline, measured in the same run);
2. the submit→sync round trip of KTMoEWrapper's stream path for a decode step (1 token, one
   MoE layer), against the CPU path's round trip (Client.forward on CPU tensors) and a bare
   stream sync (torch.cuda.synchronize with nothing queued), all in the same run.

Prints ratios against the baselines. Needs a CUDA device, build/ (MOE_BUILD_DIR) with
moe-sidecar, moe-gen and build/python. Usage: bench/cuda_channel.py [--hidden 2048] [--iters N]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BUILD = os.environ.get("MOE_BUILD_DIR", os.path.join(REPO, "build"))
sys.path.insert(0, os.path.join(BUILD, "python"))
sys.path.insert(0, os.path.join(REPO, "client", "python", "tests"))

import torch  # noqa: E402

import moe_sidecar as ms  # noqa: E402
from conftest import Sidecar, generate  # noqa: E402


def timed_copies(dst, src, iters):
    """Median ms of dst.copy_(src, non_blocking=True) on the current stream (CUDA events)."""
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_channel: no CUDA device; nothing measured")
        return 0
    tmp = tempfile.mkdtemp(prefix="moe-cuda-bench-")
    model = generate(os.path.join(tmp, "m"), layers=2, experts=16, hidden=a.hidden, ffn=a.ffn)
    s = Sidecar(model)
    try:
        from moe_sidecar.kt import _stream_path, shared_client

        c = shared_client(s.socket)
        sp = _stream_path(c)
        H, T = c.hidden, c.max_tokens
        n_el = T * H
        nbytes = n_el * 2
        dev = torch.randn(T, H, device="cuda").bfloat16()
        reg_in = sp.views["input"][ms.DTYPE_BF16][:n_el].view(T, H)
        reg_out = sp.views["output"][ms.DTYPE_BF16][:n_el].view(T, H)
        pageable = torch.empty(T, H, dtype=torch.bfloat16)
        for dst, src in ((reg_in, dev), (pageable, dev), (dev, reg_out), (dev, pageable)):
            timed_copies(dst, src, 10)  # warm-up
        d2h_reg = timed_copies(reg_in, dev, a.iters)
        d2h_page = timed_copies(pageable, dev, a.iters)
        h2d_reg = timed_copies(dev, reg_out, a.iters)
        h2d_page = timed_copies(dev, pageable, a.iters)
        gbs = lambda ms_: nbytes / (ms_ * 1e-3) / 1e9  # noqa: E731
        print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
              f"copy of {T}x{H} bf16 = {nbytes / 2**20:.1f} MiB, median of {a.iters}")
        print(f"D2H into the registered channel: {gbs(d2h_reg):6.1f} GB/s   pageable "
              f"(baseline): {gbs(d2h_page):6.1f} GB/s   ratio {d2h_page / d2h_reg:.2f}x")
        print(f"H2D out of the registered channel: {gbs(h2d_reg):6.1f} GB/s   pageable "
              f"(baseline): {gbs(h2d_page):6.1f} GB/s   ratio {h2d_page / h2d_reg:.2f}x")

        info = c.info
        layer = info["moe_layers"][-1]
        wr = ms.KTMoEWrapper(layer, info["n_experts"], info["model_top_k"], info["model_hidden"],
                             info["expert_ffn"], socket=s.socket)
        x = torch.randn(1, H, device="cuda").bfloat16()
        ids = torch.randperm(info["n_experts"], device="cuda")[: info["model_top_k"]][None]
        w = torch.full((1, info["model_top_k"]), 1.0 / info["model_top_k"], device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        xc, idc, wc = x.cpu(), ids.cpu(), w.cpu()

        def stream_step():
            wr.forward(x, ids, w, stream)
            torch.cuda.synchronize()

        def cpu_step():
            wr.forward(xc, idc, wc)

        def bare():
            torch.cuda.synchronize()

        res = {}
        for name, f in (("stream", stream_step), ("cpu", cpu_step), ("bare", bare)):
            for _ in range(20):
                f()
            ts = []
            for _ in range(a.iters):
                t0 = time.perf_counter()
                f()
                ts.append((time.perf_counter() - t0) * 1e6)
            res[name] = statistics.median(ts)
        wr.check()
        print(f"decode round trip, 1 token, top-{info['model_top_k']} of {info['n_experts']}, "
              f"hidden {H}, ffn {a.ffn} (median µs of {a.iters}, host clock):")
        print(f"  stream path submit→sync+synchronize: {res['stream']:8.1f} µs")
        print(f"  CPU path (Client, CPU tensors):      {res['cpu']:8.1f} µs   "
              f"stream/cpu {res['stream'] / res['cpu']:.2f}x")
        print(f"  bare torch.cuda.synchronize:         {res['bare']:8.1f} µs")
    finally:
        s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
