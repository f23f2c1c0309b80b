"""The CUDA stream path of KTMoEWrapper, and the served block against transformers' own.

Skipped (with the reason) where torch sees no CUDA device — CI never has one; these run on a
GPU machine (docs/engines.md says how). What they pin:
- the stream path gives the same bits as the CPU path for the same inputs (both are the same
  sidecar computation; only the copies differ), over every layer with deferral and GPU experts;
- the whole submit/sync sequence can be captured in a CUDA graph and replayed on new inputs;
- a failure inside a host function zeroes that layer's output and is raised by check() after
  the stream ran; a sidecar killed mid-stream never hangs the stream;
- after a kill -9 and a restart the stream path moves to the new channel: the failed layer is
  raised once, the next call registers the new mapping and gives the bits it gave before;
- the MoE block served by the sidecar equals transformers' Qwen3MoeSparseMoeBlock loaded from
  the same files (when transformers is installed).
"""

import os
import signal

import numpy as np
import pytest

import moe_sidecar as ms

from conftest import Sidecar

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here (CI has none): the stream path runs on a GPU machine")


def _info(socket):
    c = ms.Client(socket)
    i = c.info
    c.close()
    return i


def _wrappers(socket, info, **kw):
    return [ms.KTMoEWrapper(l, info["n_experts"], info["model_top_k"], info["model_hidden"],
                            info["expert_ffn"], socket=socket, **kw)
            for l in info["moe_layers"]]


def _routes(g, n, info, device):
    E, k = info["n_experts"], info["model_top_k"]
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(n)]).to(device)
    w = torch.rand(n, k, generator=g).to(device) + 0.05
    return ids, w / w.sum(1, keepdim=True)


def _run_layers(wrappers, xs, routes, device):
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else None
    return [wr.forward(x.to(device), i.to(device), w.to(device), stream)
            for wr, x, (i, w) in zip(wrappers, xs, routes)]


@pytest.mark.parametrize("n", [1, 17])
def test_stream_path_gives_the_cpu_paths_bits(served_bf16, n):
    info = _info(served_bf16.socket)
    wrs = _wrappers(served_bf16.socket, info, num_gpu_experts=3,
                    max_deferred_experts_per_token=1)
    g = torch.Generator().manual_seed(n)
    xs = [torch.randn(n, info["hidden"], generator=g).bfloat16() for _ in wrs]
    routes = [_routes(g, n, info, "cpu") for _ in wrs]
    on_gpu = _run_layers(wrs, xs, routes, "cuda")
    torch.cuda.synchronize()
    for wr in wrs:
        wr.check()
    on_cpu = _run_layers(wrs, xs, routes, "cpu")
    for l, (a, b) in enumerate(zip(on_gpu, on_cpu)):
        assert a.is_cuda and a.dtype == torch.bfloat16
        assert torch.equal(a.cpu(), b), f"layer {l}"
        assert b.abs().sum() > 0


def test_stream_path_is_captured_in_a_cuda_graph(served_bf16):
    info = _info(served_bf16.socket)
    wrs = _wrappers(served_bf16.socket, info, max_deferred_experts_per_token=1)
    n = 4
    g = torch.Generator().manual_seed(3)
    static_x = [torch.randn(n, info["hidden"], generator=g).bfloat16().cuda() for _ in wrs]
    static_r = [tuple(t.cuda() for t in _routes(g, n, info, "cpu")) for _ in wrs]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture (masks, buffers, ops)
        _run_layers(wrs, static_x, static_r, "cuda")
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _run_layers(wrs, static_x, static_r, "cuda")
    for step in range(3):
        new_x = [torch.randn(n, info["hidden"], generator=g).bfloat16() for _ in wrs]
        new_r = [_routes(g, n, info, "cpu") for _ in wrs]
        for sx, nx in zip(static_x, new_x):
            sx.copy_(nx)
        for (si, sw), (ni, nw) in zip(static_r, new_r):
            si.copy_(ni)
            sw.copy_(nw)
        graph.replay()
        torch.cuda.synchronize()
        for wr in wrs:
            wr.check()
        want = _run_layers(wrs, new_x, new_r, "cpu")
        for l, (a, b) in enumerate(zip(static_out, want)):
            assert torch.equal(a.cpu(), b), f"replay {step} layer {l}"


def test_a_failure_in_a_host_function_surfaces_at_check(served_bf16):
    info = _info(served_bf16.socket)
    layer = info["moe_layers"][-1]  # the last layer: nothing deferred, nothing owed
    wr = ms.KTMoEWrapper(layer, info["n_experts"], info["model_top_k"], info["model_hidden"],
                         info["expert_ffn"], socket=served_bf16.socket)
    x = torch.randn(2, info["hidden"], device="cuda").bfloat16()
    ids = torch.tensor([[0, 1], [2, 999]], device="cuda")
    w = torch.full((2, 2), 0.5, device="cuda")
    out = wr.forward(x, ids, w, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert not out.any(), "a failed layer adds nothing"
    with pytest.raises(ms.BadExpertError, match="999"):
        wr.check()
    ids[1, 1] = 3
    out = wr.forward(x, ids, w, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    wr.check()
    assert out.any()


def _one_token_on_the_last_layer(socket, timeout_ms):
    """A wrapper of the last MoE layer (nothing deferred, nothing owed) and one token's
    inputs on the GPU."""
    info = _info(socket)
    wr = ms.KTMoEWrapper(info["moe_layers"][-1], info["n_experts"], info["model_top_k"],
                         info["model_hidden"], info["expert_ffn"], socket=socket,
                         timeout_ms=timeout_ms)
    x = torch.randn(1, info["hidden"], device="cuda").bfloat16()
    ids = torch.tensor([[0, 1]], device="cuda")
    w = torch.full((1, 2), 0.5, device="cuda")
    return wr, x, ids, w


def test_a_killed_sidecar_never_hangs_the_stream(models):
    s = Sidecar(models["q8_0"])
    try:
        wr, x, ids, w = _one_token_on_the_last_layer(s.socket, timeout_ms=20000)
        wr.forward(x, ids, w, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait(30)
        out = wr.forward(x, ids, w, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()  # returns: the host function saw the hang-up
        assert not out.any()
        with pytest.raises(ms.PeerDeadError):
            wr.check()
    finally:
        s.stop(signal.SIGKILL)


def test_block_equals_transformers_qwen3_moe_block(served_bf16, models):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(models["bf16"],
                                                              torch_dtype=torch.float32)
    info = _info(served_bf16.socket)
    layer = info["moe_layers"][1]
    block = model.model.layers[layer].mlp
    E, H = info["n_experts"], info["hidden"]
    gate = [v for k, v in block.state_dict().items()
            if k.endswith("gate.weight") and tuple(v.shape) == (E, H)]
    assert len(gate) == 1, list(block.state_dict())
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        want = block(x[None])
        want = (want[0] if isinstance(want, tuple) else want)[0]
        probs = torch.softmax(x @ gate[0].T, dim=-1)
        w, ids = torch.topk(probs, info["model_top_k"], dim=-1)
        w = w / w.sum(-1, keepdim=True)  # norm_topk_prob
    c = ms.Client(served_bf16.socket)
    got = c.forward(layer, x, ids, w)
    c.close()
    err = float((got - want).abs().mean() / want.abs().mean())
    print(f"sidecar vs transformers {transformers.__version__} {type(block).__name__}: "
          f"mean|diff|/mean|ref| = {err:.2e}")
    assert err < 0.02  # kt-kernel's BF16 bound: the sidecar rounds activations to bf16


def test_a_stream_timeout_gives_up_the_slot_and_the_next_call_works(models):
    s = Sidecar(models["q8_0"])
    try:
        wr, x, ids, w = _one_token_on_the_last_layer(s.socket, timeout_ms=300)
        stream = torch.cuda.current_stream().cuda_stream
        want = wr.forward(x, ids, w, stream)
        torch.cuda.synchronize()
        os.kill(s.proc.pid, signal.SIGSTOP)
        os.waitpid(s.proc.pid, os.WUNTRACED)
        out = wr.forward(x, ids, w, stream)
        torch.cuda.synchronize()  # host_wait gave up after 300 ms
        assert not out.any()
        os.kill(s.proc.pid, signal.SIGCONT)
        with pytest.raises(ms.TimeoutError):
            wr.check()
        again = wr.forward(x, ids, w, stream)  # on a fresh slot
        torch.cuda.synchronize()
        wr.check()
        assert torch.equal(again, want)
    finally:
        s.stop(signal.SIGKILL)


def test_the_stream_path_moves_to_a_restarted_sidecar(tmp_path, models):
    """The next call after the failure reconnects: the streams are drained, the old mapping
    unregistered, the new one registered, the stream slot taken anew and every op pointed at
    it; the result equals the one before the kill, and a wrapper made now works too."""
    sock = str(tmp_path / "run" / "s.sock")
    first = Sidecar(models["q8_0"], socket=sock)
    second = None
    try:
        wr, x, ids, w = _one_token_on_the_last_layer(sock, timeout_ms=20000)
        stream = torch.cuda.current_stream().cuda_stream
        want = wr.forward(x, ids, w, stream)
        torch.cuda.synchronize()
        wr.check()
        assert want.any()
        c = wr.client
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30)
        second = Sidecar(models["q8_0"], socket=sock)
        out = wr.forward(x, ids, w, stream)  # on the dead channel: host_wait sees the hang-up
        torch.cuda.synchronize()
        assert not out.any()
        with pytest.raises(ms.PeerDeadError):
            wr.check()
        again = wr.forward(x, ids, w, stream)  # reconnects first
        torch.cuda.synchronize()
        wr.check()
        assert c.generation == 2
        assert c._cuda_registered[1] == c.region()[0], "the new mapping is the registered one"
        assert torch.equal(again, want)
        info = c.info
        fresh = ms.KTMoEWrapper(info["moe_layers"][-1], info["n_experts"], info["model_top_k"],
                                info["model_hidden"], info["expert_ffn"], socket=sock)
        got = fresh.forward(x, ids, w, stream)
        torch.cuda.synchronize()
        fresh.check()
        assert torch.equal(got, want)
    finally:
        first.stop(signal.SIGKILL)
        if second:
            second.stop(signal.SIGKILL)
