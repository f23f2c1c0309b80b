"""The engine-shaped example (client/python/examples/engine_decode.py) against a real sidecar.

A module fixture generates a small Qwen3-MoE whole model with build/tools/moe-gen, starts
`moe-sidecar serve` on it (--ready-fd), and stops it at the end. The CPU tests run the example
with --check; the CUDA tests (the stream path, a CUDA graph, transformers) skip, saying why,
where torch sees no GPU. The build directory is $MOE_BUILD_DIR, else the repository's build/.

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q client/python/tests/test_engine_decode.py
"""
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BUILD = Path(os.environ.get("MOE_BUILD_DIR", ROOT / "build")).resolve()
EXAMPLE = ROOT / "client" / "python" / "examples" / "engine_decode.py"
sys.path.insert(0, str(BUILD / "python"))

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device: the stream path "
                                "needs a GPU (run these on the GPU machine)")


def _has_transformers():
    try:
        import transformers  # noqa: F401
        from transformers import Qwen3MoeForCausalLM  # noqa: F401
    except ImportError:
        return False
    return True


needs_transformers = pytest.mark.skipif(not _has_transformers(),
                                        reason="transformers (Qwen3MoeForCausalLM) is not "
                                        "importable here")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    """(model directory, socket) of a running `moe-sidecar serve`, stopped at the end."""
    gen, serve = BUILD / "tools" / "moe-gen", BUILD / "sidecar" / "moe-sidecar"
    for b in (gen, serve, BUILD / "python" / "moe_sidecar"):
        if not b.exists():
            pytest.fail(f"{b} is missing: build first (scripts/build.sh build) or set "
                        "MOE_BUILD_DIR")
    d = tmp_path_factory.mktemp("engine")
    model, sock = d / "q3", d / "sidecar.sock"
    subprocess.run([str(gen), "--preset", "qwen3-30b-a3b", "--layers", "4", "--experts", "16",
                    "--hidden", "256", "--ffn", "128", "--format", "bf16", "--full-model",
                    "--quiet", "--out", str(model)], check=True, timeout=60)
    r, w = os.pipe()
    log = open(d / "sidecar.log", "wb")
    p = subprocess.Popen([str(serve), "serve", str(model), "--socket", str(sock),
                          "--ready-fd", str(w),
                          "--probes-instance", f"pytest-engine-{os.getpid()}"],
                         pass_fds=(w,), stdout=log, stderr=subprocess.STDOUT)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 30)
        line = os.read(r, 4096).decode() if ready else ""
        if not line.startswith("READY"):
            p.kill()
            p.wait()
            pytest.fail(f"the sidecar did not become ready ({line!r}); log: "
                        f"{(d / 'sidecar.log').read_text(errors='replace')[-2000:]}")
        yield str(model), str(sock)
    finally:
        os.close(r)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()


def run_example(sidecar, *args, timeout=120):
    model, sock = sidecar
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(BUILD / "python")] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
    r = subprocess.run([sys.executable, str(EXAMPLE), model, "--socket", sock, *args],
                       env=env, capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    print(out)  # shown by pytest on failure, or with -s
    return r.returncode, out


def assert_checks_pass(rc, out, transformers=False):
    assert "check 1, per layer" in out and "check 2, end to end" in out, out
    for line in out.splitlines():
        if line.startswith(("check ", "transformers")):
            assert "FAIL" not in line, line
    if transformers:
        assert "Qwen3MoeForCausalLM logits" in out and "-> PASS" in out, out
    assert rc == 0 and "result: PASS" in out, out


# ---- CPU --------------------------------------------------------------------------------------


def test_cpu_bf16_gpu_experts_and_deferral(sidecar):
    rc, out = run_example(sidecar, "--tokens", "4", "--gpu-experts", "2", "--defer", "1",
                          "--check")
    assert_checks_pass(rc, out)
    assert "tokens/s" in out


def test_cpu_fp32_deeper_deferral(sidecar):
    rc, out = run_example(sidecar, "--tokens", "3", "--dtype", "fp32", "--gpu-experts", "5",
                          "--defer", "3", "--prompt", "1,2,3,4,5,6,7,8,9", "--check")
    assert_checks_pass(rc, out)


@needs_transformers
def test_cpu_transformers(sidecar):
    rc, out = run_example(sidecar, "--tokens", "2", "--transformers", timeout=300)
    assert rc == 0 and "transformers" in out and "-> PASS" in out, out


# ---- CUDA ----------------------------------------------------------------------------------------


@needs_cuda
def test_cuda_stream_path_bf16(sidecar):
    rc, out = run_example(sidecar, "--device", "cuda", "--tokens", "8", "--gpu-experts", "2",
                          "--defer", "1", "--check")
    assert_checks_pass(rc, out)


@needs_cuda
def test_cuda_stream_path_fp32_no_gpu_experts(sidecar):
    rc, out = run_example(sidecar, "--device", "cuda", "--dtype", "fp32", "--tokens", "4",
                          "--gpu-experts", "0", "--defer", "2", "--check")
    assert_checks_pass(rc, out)


@needs_cuda
@needs_transformers
def test_cuda_transformers(sidecar):
    rc, out = run_example(sidecar, "--device", "cuda", "--tokens", "4", "--check",
                          "--transformers", timeout=300)
    assert_checks_pass(rc, out, transformers=True)


def _wrapper(sidecar, layer, **kw):
    from moe_sidecar import KTMoEWrapper

    model, sock = sidecar
    with open(os.path.join(model, "config.json")) as fh:
        c = json.load(fh)
    return c, KTMoEWrapper(layer_idx=layer, num_experts=c["num_experts"],
                           num_experts_per_tok=c["num_experts_per_tok"],
                           hidden_size=c["hidden_size"],
                           moe_intermediate_size=c["moe_intermediate_size"],
                           weight_path=model, socket=sock, **kw)


def _inputs(c, n, device, seed):
    g = torch.Generator().manual_seed(seed)
    E, k, H = c["num_experts"], c["num_experts_per_tok"], c["hidden_size"]
    x = torch.randn(n, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(n)])
    w = torch.rand(n, k, generator=g)
    return x.to(device), ids.to(device), w.to(device)


@needs_cuda
def test_cuda_graph_capture_and_replay(sidecar):
    """The stream path captured in a CUDA graph (D2H copies, the two host functions, the H2D
    copy) and replayed on new inputs gives the CPU path's result bit for bit."""
    c, w = _wrapper(sidecar, 3, num_gpu_experts=2)  # the last MoE layer: nothing deferred
    w.load_weights()
    dev = torch.device("cuda")
    x, ids, wt = _inputs(c, 4, dev, 0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up, eager (first use registers the channel)
        for _ in range(2):
            w.forward(x, ids, wt, s.cuda_stream)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = w.forward(x, ids, wt, torch.cuda.current_stream().cuda_stream)
    for seed in (1, 2, 3):
        nx, nids, nwt = _inputs(c, 4, dev, seed)
        x.copy_(nx)
        ids.copy_(nids)
        wt.copy_(nwt)
        g.replay()
        torch.cuda.synchronize()
        w.check()
        ref = w.forward(nx.cpu(), nids.cpu(), nwt.cpu())
        assert torch.equal(y.cpu(), ref), f"replay {seed}: max |diff| " \
            f"{(y.cpu().float() - ref.float()).abs().max().item()}"


@needs_cuda
def test_cuda_submit_and_sync_on_different_streams(sidecar):
    """sync_forward's stream gets the result in its own order (it waits for the submit
    stream), as an engine that submits on a side stream expects."""
    # The same GPU mask as above: a mask is per (channel, layer), and this process's wrappers
    # share one channel.
    c, w = _wrapper(sidecar, 3, num_gpu_experts=2)
    dev = torch.device("cuda")
    x, ids, wt = _inputs(c, 3, dev, 7)
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        w.submit_forward(x, ids, wt, side.cuda_stream)
    y = w.sync_forward(x, main.cuda_stream)
    z = y * 1  # consumed on the main stream
    torch.cuda.synchronize()
    w.check()
    ref = w.forward(x.cpu(), ids.cpu(), wt.cpu())
    assert torch.equal(z.cpu(), ref)


# ---- router hints (pre-gating) ---------------------------------------------------------------


def test_router_hints_run_and_keep_the_results(sidecar):
    rc, out = run_example(sidecar, "--tokens", "4", "--router-hints", "--check")
    assert_checks_pass(rc, out)
    line = next(x for x in out.splitlines() if x.startswith("router hints:") and "precision" in x)
    # 4 MoE layers: 3 hints per forward pass, one pass for the prompt and 3 decode steps
    assert "12 PREFETCH(es)" in line, line
    prec = float(line.split("precision ")[1].split(",")[0])
    rec = float(line.split("recall ")[1].split(" ")[0])
    assert 0.0 <= prec <= 1.0 and 0.0 <= rec <= 1.0, line
    assert "load(s) started by them" in out, out


def test_router_hints_are_the_next_routers_top_k_on_this_input():
    """The hinted set is exactly the top-k of the next MoE layer's router on the layer's input
    (every row's, best probability each), sent for that layer; and each layer's hint is scored
    against the ids the layer then routes to."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("engine_decode", EXAMPLE)
    ed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ed)

    class Cfg:
        moe_layers, top_k, n_experts = [1, 2, 3], 3, 10

    class Model:
        cfg = Cfg()

    g = torch.Generator().manual_seed(5)
    Model.layers = {L: {"router": torch.randn(10, 16, generator=g)} for L in range(4)}
    sent = []

    class Client:
        def prefetch(self, layer, ids, scores):
            sent.append((layer, list(ids), list(scores)))
            return len(ids)

    hints = ed.RouterHints(Model(), Client())
    h = torch.randn(2, 16, generator=g)
    hints.before(1, h, torch.tensor([[0, 1, 2], [3, 4, 5]]))
    assert len(sent) == 1 and sent[0][0] == 2
    logits = h @ Model.layers[2]["router"].T
    want = set(torch.topk(logits, 3, dim=-1).indices.reshape(-1).tolist())
    assert set(sent[0][1]) == want
    assert all(0 < s <= 3.0 for s in sent[0][2])
    # layer 2 routes to exactly the hinted ids of its first row plus one other: scored
    first_row = torch.topk(logits[0], 3).indices.tolist()
    hints.before(2, h, torch.tensor([first_row]))
    assert hints.hits == 3 and hints.sent == len(want) and hints.true == 3
    assert sent[1][0] == 3
    hints.before(3, h, torch.tensor([[9, 8, 7]]))  # the last MoE layer hints nothing
    assert len(sent) == 2
